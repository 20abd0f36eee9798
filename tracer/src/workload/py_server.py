#!/usr/bin/env python3
"""The CPython workload of `tracer demo` (embedded in the tracer binary, written to a temporary
file when a Python scenario runs): a small server whose requests arrive at a steady rate (open
loop) and each run ~1 ms of pure-Python work on the serving thread. Every request is logged as
one JSON line on CLOCK_MONOTONIC with the serving thread's id (the format `tracer attach
--latencies` reads), from its arrival: a request that arrives while the server is held up waits.

  --inject-after S: S seconds after "ready", the cause starts:
    gil: a second thread of the process sorts a 600,000-element list every 250 ms. list.sort is
         one C call that holds the GIL throughout (no eval-breaker checks inside it), so a
         request arriving meanwhile waits for the GIL until the sort ends.
    gc:  the process holds a large long-lived heap (1.5 million tracked objects), and every
         ~700 ms a request triggers a full collection (gen 2) the way allocation does in a
         real server: the serving thread stops for as long as the collector scans the heap.
         Each collection is logged from gc.callbacks to --gc-log (the ground truth).
    long: two consecutive requests in every --long-every (100) carry --long-ms (60) ms of
         Python each on the serving thread (on-CPU time, whatever the machine's speed): a
         burst of long prompts, the way a long prompt's tokenization does on an
         asyncio front end: the requests that arrive meanwhile wait behind it. Their ids are
         written to --long-log, one a line (the ground truth).
Every request is logged with its sequence number as "id".
SIGINT ends it early, its log written.
"""
import argparse
import ctypes
import gc
import json
import random
import signal
import sys
import threading
import time


def work(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


def sorter(start_ns, stop):
    # PR_SET_NAME: the thread's name, which the demo checks the verdict's holder against.
    ctypes.CDLL(None).prctl(15, b"gil-holder", 0, 0, 0)
    data = [random.random() for _ in range(600_000)]
    while time.monotonic_ns() < start_ns and not stop.is_set():
        time.sleep(0.01)
    while not stop.is_set():
        sorted(data)
        time.sleep(0.25)


def gc_logger(path):
    out = open(path, "w", buffering=1)
    began = {}

    def cb(phase, info):
        now = time.monotonic_ns()
        if phase == "start":
            began["t"] = now
        elif "t" in began:
            out.write(
                json.dumps(
                    {
                        "tid": threading.get_native_id(),
                        "start_ns": began.pop("t"),
                        "end_ns": now,
                        "generation": info["generation"],
                    }
                )
                + "\n"
            )

    gc.callbacks.append(cb)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inject", choices=["none", "gil", "gc", "long"], default="none")
    ap.add_argument("--inject-after", type=float, default=0.0)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--work", type=int, default=6000)
    ap.add_argument("--long-every", type=int, default=100)
    ap.add_argument("--long-ms", type=float, default=60.0)
    ap.add_argument("--log", required=True)
    ap.add_argument("--gc-log")
    ap.add_argument("--long-log")
    args = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    heap = None
    inject_ns = time.monotonic_ns() + int(args.inject_after * 1e9)
    if args.inject == "gil":
        threading.Thread(target=sorter, args=(inject_ns, stop), daemon=True).start()
    if args.inject == "gc":
        # Long-lived, tracked, and kept out of automatic collections until the cause starts:
        # the collections are the ones the server triggers.
        heap = [[i] for i in range(1_500_000)]
        gc.disable()
        if args.gc_log:
            gc_logger(args.gc_log)
    tid = threading.get_native_id()
    log = open(args.log, "w")
    long_log = open(args.long_log, "w", buffering=1) if args.long_log else None
    print("ready", flush=True)
    period = 1.0 / args.rate
    end = time.monotonic() + args.duration
    arrival = time.monotonic_ns()
    next_gc = inject_ns
    seq = 0
    while not stop.is_set() and time.monotonic() < end:
        seq += 1
        arrival += int(period * 1e9)
        delay = (arrival - time.monotonic_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        long = (
            args.inject == "long"
            and arrival >= inject_ns
            and seq % args.long_every in (0, 1)
        )
        if long:
            until = time.thread_time() + args.long_ms / 1e3
            while time.thread_time() < until:
                work(args.work // 10)
        else:
            work(args.work)
        if long and long_log:
            long_log.write(f"{seq}\n")
        if heap is not None and time.monotonic_ns() >= next_gc:
            gc.collect()
            next_gc = time.monotonic_ns() + int(0.7e9)
        log.write(
            json.dumps(
                {
                    "start_ns": arrival,
                    "end_ns": time.monotonic_ns(),
                    "tid": tid,
                    "id": seq,
                }
            )
            + "\n"
        )
    log.close()
    stop.set()


if __name__ == "__main__":
    sys.exit(main())
