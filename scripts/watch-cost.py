#!/usr/bin/env python3
"""What `tracer watch` costs once attached, where bpftool is not installed (the GPU machine).

The same measure as `cargo xtask bench --watch-only`: the tracer process's CPU time
(/proc/PID/stat, user + system) plus the run time of its BPF programs, between the first window
line and the last, over the wall time between them. The programs' run time comes from the
tracer's own program descriptors (/proc/PID/fdinfo: run_time_ns, kept while
kernel.bpf_stats_enabled is 1) instead of bpftool, so it needs nothing but python3.

    sudo scripts/watch-cost.py TRACER TESTLOAD [ROUNDS] [-- extra watch options]

Targets, interleaved each round: a sleeping process, and `TESTLOAD paced 50000 2` (about 101k
context switches a second, counted from /proc). Prints one JSON line a run (with each BPF
program's runs a second and ns a run, busiest first) and the medians.

Environment: INTERVAL_S (window length, 5) and WINDOWS (windows measured, 6); TARGETS (a comma
list of `idle` and `100k switches/s`, both by default); PIN (a CPU list for `taskset -c`: the
busy target's two threads on those CPUs only, e.g. one CPU, where no handover crosses cores);
FLOOR=1 measures `TRACER floor` instead of a watch: empty programs on the same tracepoints,
what any program there costs on this kernel before doing anything (the time points are then
INTERVAL_S apart from the floor's attach, as no window lines come).
"""

import json
import os
import statistics
import subprocess
import sys
import threading
import time

INTERVAL_S = int(os.environ.get("INTERVAL_S", "5"))
WINDOWS = int(os.environ.get("WINDOWS", "6"))
FLOOR = os.environ.get("FLOOR") == "1"
STATS = "/proc/sys/kernel/bpf_stats_enabled"


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_program(pid):
    """prog_id -> (run_cnt, run_time_ns) of every BPF program the process holds."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            info = dict(
                line.split(":", 1) for line in open(f"/proc/{pid}/fdinfo/{fd}") if ":" in line
            )
        except OSError:
            continue
        if "run_time_ns" in info and "prog_id" in info:
            out[int(info["prog_id"])] = (int(info["run_cnt"]), int(info["run_time_ns"]))
    return out


def bpf_ns(pid):
    """Run time of every BPF program the process holds a descriptor of, and how many."""
    progs = per_program(pid)
    return sum(ns for _, ns in progs.values()), len(progs)


def switches(pid):
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in open(f"/proc/{pid}/task/{t}/status"):
                if "ctxt_switches" in line:
                    n += int(line.split()[1])
        except OSError:
            pass
    return n


def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def once(tracer, target, extra):
    if FLOOR:
        cmd = [tracer, "floor"]
    else:
        cmd = [tracer, "watch", "-p", str(target), "-i", f"{INTERVAL_S}s", *extra]
    w = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if FLOOR else subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    lines = []

    def read():
        if not FLOOR:
            for _ in w.stdout:
                lines.append(time.monotonic())
            return
        # The floor prints no windows: a time point every INTERVAL_S from its attach.
        for line in w.stderr:
            if "attached" in line:
                break
        while w.poll() is None:
            lines.append(time.monotonic())
            time.sleep(INTERVAL_S)

    threading.Thread(target=read, daemon=True).start()

    def wait_for(n, within):
        end = time.monotonic() + within
        while len(lines) < n:
            if time.monotonic() > end or w.poll() is not None:
                w.kill()
                raise SystemExit(f"{' '.join(cmd[:2])} gave {len(lines)} time points, not {n}")
            time.sleep(0.01)
        return lines[n - 1]

    t0 = wait_for(1, INTERVAL_S * 3 + 30)
    c0, (b0, progs), s0, p0 = cpu_s(w.pid), bpf_ns(w.pid), switches(target), per_program(w.pid)
    t1 = wait_for(1 + WINDOWS, INTERVAL_S * (WINDOWS + 3))
    c1, (b1, _), s1, p1 = cpu_s(w.pid), bpf_ns(w.pid), switches(target), per_program(w.pid)
    mem = rss(w.pid)
    w.send_signal(2)
    w.wait(timeout=30)
    wall = t1 - t0
    # Each program's runs a second and ns a run, the busiest first (fdinfo has no names).
    runs = sorted(
        (
            (round((p1[i][0] - p0[i][0]) / wall), round((p1[i][1] - p0[i][1]) / max(1, p1[i][0] - p0[i][0])))
            for i in p1
            if i in p0 and p1[i][0] > p0[i][0]
        ),
        reverse=True,
    )
    return {
        "programs_runs_per_s_ns_per_run": runs,
        "process_share": (c1 - c0) / wall,
        "bpf_share": (b1 - b0) / 1e9 / wall,
        "total_share": (c1 - c0) / wall + (b1 - b0) / 1e9 / wall,
        "programs": progs,
        "target_switches_per_s": (s1 - s0) / wall,
        "rss_bytes": mem,
    }


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        i = args.index("--")
        args, extra = args[:i], args[i + 1 :]
    tracer, testload = args[0], args[1]
    if FLOOR and extra:
        sys.exit("watch-cost.py: FLOOR=1 runs `tracer floor`, which takes no watch options")
    rounds = int(args[2]) if len(args) > 2 else 3
    old = open(STATS).read().strip()
    open(STATS, "w").write("1")
    names = os.environ.get("TARGETS", "idle,100k switches/s").split(",")
    unknown = [n for n in names if n not in ("idle", "100k switches/s")]
    if unknown:
        sys.exit(f"watch-cost.py: unknown TARGETS {unknown}: use idle and/or '100k switches/s'")
    pin = os.environ.get("PIN")
    runs = []
    try:
        for r in range(rounds):
            for k in range(len(names)):
                name = names[(k + r) % len(names)]
                if name == "idle":
                    t = subprocess.Popen(["sleep", "100000"])
                else:
                    # It runs until its stdin closes.
                    t = subprocess.Popen(
                        (["taskset", "-c", pin] if pin else []) + [testload, "paced", "50000", "2"],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                    )
                    time.sleep(1)
                try:
                    run = once(tracer, t.pid, extra)
                finally:
                    t.kill()
                    t.wait()
                run.update(target=name, round=r + 1)
                print(json.dumps(run), flush=True)
                runs.append(run)
    finally:
        open(STATS, "w").write(old)
    for name in names:
        mine = [x for x in runs if x["target"] == name]
        med = {
            k: statistics.median(x[k] for x in mine)
            for k in ["process_share", "bpf_share", "total_share", "target_switches_per_s"]
        }
        print(
            f"{name:>16}: process {100 * med['process_share']:.3f} %  BPF "
            f"{100 * med['bpf_share']:.3f} %  total {100 * med['total_share']:.3f} %  "
            f"{med['target_switches_per_s']:.0f} switches/s  ({len(mine)} runs)"
        )


if __name__ == "__main__":
    main()
