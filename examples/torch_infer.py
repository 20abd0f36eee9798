#!/usr/bin/env python3
"""A small PyTorch inference server loop for exercising the tracer on a GPU.

A decoder-only transformer is built from a config with random weights (no download), and
requests are served back to back: each one runs a forward pass over a batch of token ids, then
waits for the GPU with torch.cuda.synchronize(). Every request is logged as one JSON line on
CLOCK_MONOTONIC (the tracer's clock), with the time spent inside the synchronize call measured
around it, so the tracer's CUDA wait accounting can be checked against the script's own.

    python3 examples/torch_infer.py --duration 30 --log requests.jsonl
"""
import argparse
import json
import os
import time

import torch


def build_model(layers: int, hidden: int, heads: int, vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
    )
    model = LlamaForCausalLM(cfg).to(dtype=torch.bfloat16, device="cuda").eval()
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=30.0, help="seconds to serve")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--log", required=True, help="JSON lines, one per request")
    args = p.parse_args()

    torch.manual_seed(0)
    model = build_model(args.layers, args.hidden, args.heads, args.vocab)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    with torch.inference_mode():
        for _ in range(3):  # warm-up: kernels selected, memory pools grown
            model(ids)
        torch.cuda.synchronize()
    print(f"ready pid={os.getpid()}", flush=True)

    end = time.monotonic() + args.duration
    n = 0
    sync_total = 0
    with open(args.log, "w") as log, torch.inference_mode():
        while time.monotonic() < end:
            start = time.monotonic_ns()
            model(ids)
            sync_start = time.monotonic_ns()
            torch.cuda.synchronize()
            sync_end = time.monotonic_ns()
            sync_total += sync_end - sync_start
            n += 1
            log.write(json.dumps({
                "start_ns": start,
                "end_ns": sync_end,
                "sync_start_ns": sync_start,
                "sync_end_ns": sync_end,
                "tid": os.getpid(),
            }) + "\n")
    print(f"done requests={n} sync_ns={sync_total}", flush=True)


if __name__ == "__main__":
    main()
