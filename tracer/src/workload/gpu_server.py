#!/usr/bin/env python3
"""The GPU workload of `tracer demo` (embedded in the tracer binary and written to a temporary
file when a GPU scenario runs).

  serve: a small inference server on PyTorch (SIGINT ends it early, its log written). Requests arrive at a steady rate (open loop);
         each runs a forward pass of an MLP and waits for the GPU with torch.cuda.synchronize()
         (a device-wide synchronize, as many servers do before reading results back). Every
         request is logged as one JSON line on CLOCK_MONOTONIC with the serving thread's id: the
         format `tracer attach --latencies` reads.
         --stall-after S: S seconds after it is ready, a background thread of the same process
         starts queueing a burst of large matmuls on its own stream every 200 ms, which the
         serving thread's device-wide synchronize then waits for (gpu-sync-stall).
         --tiny-ops N: each request is N tiny elementwise steps (2N kernel launches of
         microseconds each) instead of the MLP: the serving thread's CPU paces the GPU, which
         idles between kernels (host-bound).
         --engine-process: a service of two processes, shaped like vLLM's: this process (the
         front end, demo-api) admits the requests and passes each down a pipe to a child
         process (the engine, demo-engine) that owns the GPU, serves them and logs them, from
         when it takes each, with its serving thread's id.
  hog:   large matmuls back to back: another process saturating the GPU (gpu-saturation).
"""
import argparse
import ctypes
import json
import os
import struct
import subprocess
import sys
import threading
import time

import torch


def stalls(start_ns, end_ns, size, burst):
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    while time.monotonic_ns() < start_ns:
        time.sleep(0.01)
    with torch.inference_mode(), torch.cuda.stream(stream):
        while time.monotonic_ns() < end_ns:
            for _ in range(burst):
                a = (a @ b) / size
            time.sleep(0.2)


def name_process(name):
    # PR_SET_NAME: the comm the tracer shows for the process (its main thread).
    ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)


def front_end(args):
    """Admits requests at the rate and passes each one's arrival time to the engine."""
    name_process("demo-api")
    argv = [a for a in sys.argv[1:] if a != "--engine-process"] + ["--from-stdin"]
    engine = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__)] + argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=False,
    )
    if engine.stdout.readline().strip() != b"ready":
        sys.exit("the engine process exited before it was ready")
    print("ready", flush=True)
    interval = 1e9 / args.rate
    nxt = float(time.monotonic_ns())
    end = nxt + args.duration * 1e9
    try:
        while nxt < end:
            now = time.monotonic_ns()
            if now < nxt:
                time.sleep((nxt - now) / 1e9)
            engine.stdin.write(struct.pack("<Q", time.monotonic_ns()))
            engine.stdin.flush()
            nxt += interval
    except KeyboardInterrupt:
        pass  # SIGINT: stop admitting; the engine finishes and writes its log
    engine.stdin.close()
    sys.exit(engine.wait())


def arrivals(args, end):
    """Each request's start: at the rate here, or as the front end passes them down."""
    if args.from_stdin:
        # A request starts when the engine takes it, as the single-process server's does: the
        # hop from the front end is the front end's (its waker's) time, not the GPU's.
        while True:
            if len(sys.stdin.buffer.read(8)) < 8:
                return
            yield time.monotonic_ns()
    interval = 1e9 / args.rate
    nxt = float(time.monotonic_ns())
    while nxt < end:
        now = time.monotonic_ns()
        if now < nxt:
            time.sleep((nxt - now) / 1e9)
        yield time.monotonic_ns()
        nxt += interval


def serve(args):
    if args.engine_process:
        return front_end(args)
    if args.from_stdin:
        name_process("demo-engine")
    torch.manual_seed(0)
    blocks = []
    for _ in range(args.layers):
        blocks += [torch.nn.Linear(args.hidden, args.hidden, bias=False), torch.nn.GELU()]
    model = torch.nn.Sequential(*blocks).to("cuda", torch.bfloat16).eval()
    x = torch.randn(args.batch, args.hidden, device="cuda", dtype=torch.bfloat16)
    if args.tiny_ops:
        # Host-bound: many tiny elementwise kernels per request, each one a Python call and a
        # launch on the CPU and microseconds of GPU work: the GPU waits for the host.
        small = torch.randn(64, device="cuda")

        def model(_):
            y = small
            for _ in range(args.tiny_ops):
                y = y * 1.0001 + 0.0001
            return y

    with torch.inference_mode():
        for _ in range(20):  # warm-up: kernels chosen, memory pools grown
            model(x)
        torch.cuda.synchronize()
    ready = time.monotonic_ns()
    end = ready + int(args.duration * 1e9)
    if args.stall_after is not None:
        threading.Thread(
            target=stalls,
            args=(ready + int(args.stall_after * 1e9), end, 8192, args.burst),
            daemon=True,
        ).start()
    print("ready", flush=True)
    tid = threading.get_native_id()
    spans = []
    try:
        with torch.inference_mode():
            for start in arrivals(args, end):
                model(x)
                torch.cuda.synchronize()
                spans.append((start, time.monotonic_ns()))
    except KeyboardInterrupt:
        pass  # SIGINT: stop serving, and write the log
    with open(args.log, "w") as log:
        log.write('{"clock": "monotonic"}\n')
        for s, e in spans:
            log.write(json.dumps({"start_ns": s, "end_ns": e, "tid": tid}) + "\n")


def hog(args):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    print("ready", flush=True)
    end = time.monotonic() + args.duration
    while time.monotonic() < end:
        for _ in range(20):
            a = (a @ b) / 8192
        torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["serve", "hog"])
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=100.0, help="requests per second")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--stall-after", type=float, default=None)
    p.add_argument("--burst", type=int, default=20, help="matmuls per stall burst")
    p.add_argument("--tiny-ops", type=int, default=0, help="host-bound: tiny ops per request")
    p.add_argument("--log", default="/dev/null")
    p.add_argument("--engine-process", action="store_true")
    p.add_argument("--from-stdin", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    serve(args) if args.mode == "serve" else hog(args)


if __name__ == "__main__":
    main()
