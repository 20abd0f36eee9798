#!/usr/bin/env python3
"""W7: a process tree. Parent 'api-front' admits requests at 100/s (open loop; arrivals queued
in-process) and forwards each over a multiprocessing Pipe to its child 'engine', then waits for the
reply (synchronous RPC, one request in flight). The engine's serving thread 'engine-step' takes a
threading.Lock per request (~0.8 ms of Python). Ground truth: the engine's thread 'kv-compactor'
holds that lock 40 ms every 250 ms while running pure Python (contention in the CHILD only).
Latency log (arrival -> reply received, parent's thread tid) at argv[1]; argv[2]=quiet disables."""
import ctypes, multiprocessing as mp, os, sys, threading, time, json
libc = ctypes.CDLL(None)
def setname(n): libc.prctl(15, n.encode(), 0, 0, 0)
def work(n):
    s = 0
    for i in range(n): s += i * i % 7
    return s
def engine(conn, inject):
    setname("engine")
    lock = threading.Lock()
    def compactor():
        setname("kv-compactor")
        while True:
            time.sleep(0.25)
            with lock:
                end = time.monotonic() + 0.04
                x = 0
                while time.monotonic() < end:
                    for i in range(200): x += i
    if inject: threading.Thread(target=compactor, daemon=True).start()
    setname("engine-step")
    while True:
        rid = conn.recv()
        with lock:
            work(12000)
        conn.send(rid)
def main():
    log = open(sys.argv[1], "w", buffering=1)
    inject = not (len(sys.argv) > 2 and sys.argv[2] == "quiet")
    a, b = mp.Pipe()
    p = mp.Process(target=engine, args=(b, inject), daemon=True); p.start()
    setname("api-front")
    print(os.getpid(), p.pid, flush=True)
    import queue
    q = queue.Queue()
    def arrivals():
        setname("admit")
        nxt = time.monotonic_ns(); rid = 0
        while True:
            nxt += 10_000_000
            d = nxt - time.monotonic_ns()
            if d > 0: time.sleep(d / 1e9)
            q.put((rid, nxt)); rid += 1
    threading.Thread(target=arrivals, daemon=True).start()
    tid = threading.get_native_id()
    while True:
        rid, t0 = q.get()
        a.send(rid); a.recv()
        log.write('{"start_ns": %d, "end_ns": %d, "tid": %d, "id": %d}\n' % (t0, time.monotonic_ns(), tid, rid))
if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
