#!/usr/bin/env python3
"""The GPU workload of `tracer demo` (embedded in the tracer binary and written to a temporary
file when a GPU scenario runs).

  serve: a small inference server on PyTorch. Requests arrive at a steady rate (open loop);
         each runs a forward pass of an MLP and waits for the GPU with torch.cuda.synchronize()
         (a device-wide synchronize, as many servers do before reading results back). Every
         request is logged as one JSON line on CLOCK_MONOTONIC with the serving thread's id: the
         format `tracer attach --latencies` reads.
         --stall-after S: S seconds after it is ready, a background thread of the same process
         starts queueing a burst of large matmuls on its own stream every 200 ms, which the
         serving thread's device-wide synchronize then waits for (gpu-sync-stall).
  hog:   large matmuls back to back: another process saturating the GPU (gpu-saturation).
"""
import argparse
import json
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


def serve(args):
    torch.manual_seed(0)
    blocks = []
    for _ in range(args.layers):
        blocks += [torch.nn.Linear(args.hidden, args.hidden, bias=False), torch.nn.GELU()]
    model = torch.nn.Sequential(*blocks).to("cuda", torch.bfloat16).eval()
    x = torch.randn(args.batch, args.hidden, device="cuda", dtype=torch.bfloat16)
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
    interval = 1e9 / args.rate
    nxt = float(time.monotonic_ns())
    spans = []
    with torch.inference_mode():
        while nxt < end:
            now = time.monotonic_ns()
            if now < nxt:
                time.sleep((nxt - now) / 1e9)
            start = time.monotonic_ns()
            model(x)
            torch.cuda.synchronize()
            spans.append((start, time.monotonic_ns()))
            nxt += interval
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
    p.add_argument("--log", default="/dev/null")
    args = p.parse_args()
    serve(args) if args.mode == "serve" else hog(args)


if __name__ == "__main__":
    main()
