#!/usr/bin/env python3
"""Saturates a GPU with large bf16 matmuls: the neighbour that makes an inference server wait.

    python3 examples/gpu_hog.py --duration 30
"""
import argparse
import os
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--size", type=int, default=8192)
    args = p.parse_args()
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + args.duration
    print(f"hog pid={os.getpid()}", flush=True)
    while time.monotonic() < end:
        for _ in range(20):
            a = a @ b
            a = a / a.abs().amax()  # keep values finite
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
