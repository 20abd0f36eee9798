#!/usr/bin/env python3
"""Two tensor-parallel ranks, one process a GPU (torch.distributed, NCCL), the layout of vLLM
or SGLang at TP=2: each step a bf16 matmul, an all-reduce and a synchronize, ~200 steps/s.
Injections act on rank 1 only: `stall` sleeps 30 ms before the all-reduce every 20 steps (a
GC-like pause), `hog` is for CPU hogs the caller pins to rank 1's CPU (6; rank 0 runs on 2).
Each rank logs its steps as JSON lines to LOG.RANK, with the time it spent in
`torch.cuda.synchronize` (its own measure of waiting). NVLink multicast stays off (docs/GPU.md).
`--one-gpu`: both ranks on GPU 0, the collective through gloo (NCCL refuses two ranks on one
GPU): the single-GPU stand-in, whose ranks wait for each other on the host (TCP) instead.

    python3 examples/tp_ranks.py stall 25 /tmp/tp.log [--one-gpu]
"""
import json, os, sys, threading, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def rank_main(rank, world, inject, seconds, log, cpus, one_gpu):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    os.sched_setaffinity(0, {cpus[rank]})
    torch.cuda.set_device(0 if one_gpu else rank)
    dist.init_process_group("gloo" if one_gpu else "nccl", rank=rank, world_size=world)
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        y = x @ w; dist.all_reduce(y)
    torch.cuda.synchronize()
    out = open(f"{log}.{rank}", "w")
    if rank == 0:
        print("ready", flush=True)
    tid = threading.get_native_id()
    step, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic_ns()
        y = x @ w
        if inject == "stall" and rank == 1 and step % 20 == 0:
            time.sleep(0.03)
        # Through gloo (TCP) a slice: the whole 32 MB would make each step ~40 ms.
        dist.all_reduce(y[:128] if one_gpu else y)
        t1 = time.monotonic_ns()
        torch.cuda.synchronize()
        t2 = time.monotonic_ns()
        # sync_ns: the rank's own measure of its wait, against the tracer's (docs/GPU.md).
        out.write(json.dumps({"start_ns": t0, "end_ns": t2, "sync_ns": t2 - t1, "pid": os.getpid(), "tid": tid, "id": step}) + "\n")
        step += 1
        time.sleep(0.004)
    out.close()
    dist.destroy_process_group()

if __name__ == "__main__":
    inject, seconds, log = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    one_gpu = "--one-gpu" in sys.argv[4:]
    cpus = [2, 6]
    for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        os.environ[k] = "0" if k == "NCCL_NVLS_ENABLE" else "1"
    mp.spawn(rank_main, args=(2, inject, seconds, log, cpus, one_gpu), nprocs=2)
