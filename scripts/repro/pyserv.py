#!/usr/bin/env python3
"""Python inference-like server for adversarial checks of `tracer`.
Open-loop arrivals (--rate/s) from a 'frontdoor' thread into a queue, served by --workers
'serve-N' threads; each request ~--work-us of pure Python. Latency log (JSON lines
start_ns/end_ns/tid on CLOCK_MONOTONIC, start = arrival) at --log.
--mode:
  quiet    nothing injected
  gilpy    thread 'py-cruncher' runs a pure-Python loop (no C call) 60 ms every 250 ms
  gcthread thread 'gc-thread' holds a 400k-object cyclic heap and calls gc.collect() every 400 ms
  cyclic   each request allocates ~3000 small cyclic objects (garbage) on top of a 300k long-lived
           heap; automatic collections only (gen0/gen1/gen2 thresholds lowered: (700,5,3))
  sleep    one request in 20 sleeps 15 ms (time.sleep: a downstream call), on the serving thread
  fsync    one request in 20 writes 256 KiB (os.urandom: also CPU work) and fsyncs it
  heavyio  one request in 20 does 3x the Python work, then a 1 ms time.sleep (a downstream call)
gc.callbacks log at --gc-log (ground truth of collections).
"""
import argparse, ctypes, gc, json, os, queue, random, sys, threading, time

libc = ctypes.CDLL(None)
def setname(n): libc.prctl(15, n.encode(), 0, 0, 0)

def work(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s

class Node:
    __slots__ = ("a", "b", "c")
    def __init__(self): self.a = None; self.b = None; self.c = 0

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="quiet")
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--work-iters", type=int, default=12000)
    ap.add_argument("--log", default="/tmp/adv1/lat.jsonl")
    ap.add_argument("--gc-log", default="/tmp/adv1/gc.jsonl")
    a = ap.parse_args()
    setname("pyserv-main")
    log = open(a.log, "w", buffering=1)
    gclog = open(a.gc_log, "w", buffering=1)
    gst = {}
    def cb(phase, info):
        t = time.monotonic_ns()
        if phase == "start": gst["t"] = t
        else: gclog.write(json.dumps({"gen": info["generation"], "start_ns": gst.get("t", t), "end_ns": t, "dur_ms": (t - gst.get("t", t)) / 1e6, "tid": threading.get_native_id()}) + "\n")
    gc.callbacks.append(cb)
    q = queue.Queue()
    lock = threading.Lock()
    keep = []
    if a.mode == "cyclic":
        keep = [[Node() for _ in range(1000)] for _ in range(300)]
        gc.set_threshold(700, 5, 3)
    fd = os.open("/tmp/adv1/fsync.dat", os.O_WRONLY | os.O_CREAT) if a.mode == "fsync" else None

    def serve(k):
        setname(f"serve-{k}")
        n = 0
        while True:
            rid, t0 = q.get()
            work(a.work_iters)
            if a.mode == "cyclic":
                for _ in range(300):
                    x = Node(); y = Node(); x.a = y; y.a = x
                    z = [x, y, {}]; z[2]["self"] = z
            if a.mode == "sleep" and rid % 20 == 0:
                time.sleep(0.015)
            if a.mode == "heavyio" and rid % 20 == 0:
                work(a.work_iters * 3); time.sleep(0.001)
            if a.mode == "fsync" and rid % 20 == 0:
                os.write(fd, os.urandom(256 * 1024)); os.fsync(fd)
            t1 = time.monotonic_ns()
            log.write('{"start_ns": %d, "end_ns": %d, "tid": %d, "id": %d}\n' % (t0, t1, threading.get_native_id(), rid))

    def cruncher():
        setname("py-cruncher")
        while True:
            time.sleep(0.25)
            end = time.monotonic() + 0.06
            x = 0
            while time.monotonic() < end:
                for i in range(200): x += i * i
    def gcthread():
        setname("gc-thread")
        heap = []
        for _ in range(400):
            l = [Node() for _ in range(1000)]
            for i in range(999): l[i].a = l[i + 1]
            heap.append(l)
        while True:
            time.sleep(0.4)
            gc.collect()

    for k in range(a.workers):
        threading.Thread(target=serve, args=(k,), daemon=True).start()
    if a.mode == "gilpy": threading.Thread(target=cruncher, daemon=True).start()
    if a.mode == "gcthread": threading.Thread(target=gcthread, daemon=True).start()
    setname("frontdoor")
    print(os.getpid(), flush=True)
    rid = 0
    nxt = time.monotonic_ns()
    per = int(1e9 / a.rate)
    while True:
        nxt += per
        d = nxt - time.monotonic_ns()
        if d > 0: time.sleep(d / 1e9)
        q.put((rid, nxt)); rid += 1

main()
