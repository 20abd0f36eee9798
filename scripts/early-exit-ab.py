#!/usr/bin/env python3
"""A/B of two tracer builds' early exit: each attached in turn (interleaved rounds) to a tree of
20 sleeping processes while `perf bench sched pipe` runs on the last CPU, with the kernel's BPF
run statistics (bpftool) around the benchmark; prints the context-switch program's ns per run,
per round and the medians, and the same for the wakeup programs (sched_wakeup, and sched_waking
where the build has it: their sum is what one wakeup costs). Every switch and wakeup of the
benchmark is a non-target task's: the early exit.
"""
import json, os, signal, subprocess, sys, time, statistics
# Usage: scripts/early-exit-ab.py ROUNDS TRACER_A TRACER_B (as root, bpftool and perf installed)
bins = {f"A {sys.argv[2]}": sys.argv[2], f"B {sys.argv[3]}": sys.argv[3]}
n = os.cpu_count()
subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"], check=True)
def progs():
    return {p["id"]: p for p in json.loads(subprocess.check_output(["bpftool", "prog", "show", "-j"]))}
KINDS = ("sched_switch", "sched_wakeup", "sched_waking")
res = {(k, kind): [] for k in bins for kind in KINDS}
for r in range(int(sys.argv[1])):
    for name, b in bins.items():
        sh = subprocess.Popen(["sh", "-c", "for i in $(seq 19); do sleep 3600 & done; wait"], start_new_session=True)
        time.sleep(0.3)
        before = set(progs())
        err = open("/tmp/ee.err", "w+")
        t = subprocess.Popen(["taskset", "-c", "0", b, "attach", "-p", str(sh.pid), "-d", "1h", "--json"], stdout=subprocess.DEVNULL, stderr=err)
        while "recording" not in open("/tmp/ee.err").read():
            time.sleep(0.05)
        def snap():
            return {i: p for i, p in progs().items() if i not in before and p.get("name", "").startswith(KINDS)}
        a = snap()
        subprocess.run(["taskset", "-c", str(n - 1), "perf", "bench", "sched", "pipe", "-T", "-l", "300000"], stdout=subprocess.DEVNULL, check=True)
        z = snap()
        t.send_signal(signal.SIGINT); t.wait()
        os.killpg(sh.pid, signal.SIGKILL); sh.wait()
        for kind in KINDS:
            ids = [i for i in z if z[i]["name"].startswith(kind)]
            if not ids:
                continue
            cnt = sum(z[i]["run_cnt"] - a[i]["run_cnt"] for i in ids)
            ns = sum(z[i]["run_time_ns"] - a[i]["run_time_ns"] for i in ids)
            res[(name, kind)].append(ns / max(cnt, 1))
            print(r, name, kind, f"{ns/max(cnt,1):.1f} ns/run over {cnt} runs", flush=True)
for (k, kind), v in res.items():
    if v:
        print(f"{k} {kind}: median {statistics.median(v):.1f} ns/run, runs {[round(x,1) for x in v]}")
