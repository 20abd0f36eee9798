#!/usr/bin/env python3
"""The single-GPU stand-in for two tensor-parallel ranks (examples/tp_ranks.py needs a GPU a
rank: NCCL refuses two ranks on one GPU). Two processes on GPU 0 end every step in a barrier
that waits on the GPU, as NCCL's collectives do: each rank's kernel sets its flag in a shared
(CUDA IPC) tensor, then spins until the other rank's flag reaches the step, and the host waits
in torch.cuda.synchronize meanwhile. So a rank that arrives late keeps its peer in synchronize
while the peer's GPU spins. Injections act on rank 1 only: `stall` sleeps 30 ms before the
barrier every 20 steps, `hog` is for CPU hogs the caller pins to rank 1's CPU (6; rank 0 runs
on 2). Each rank logs its steps as JSON lines to LOG.RANK.

    python3 examples/tp_one_gpu.py stall 25 /tmp/tp.log
"""
import json, sys, threading, time, os
import torch, torch.multiprocessing as mp
import triton, triton.language as tl


@triton.jit
def arrive_and_wait(flags, me, other, step):
    tl.store(flags + me, step)
    while tl.load(flags + other, volatile=True) < step:
        pass


def rank_main(rank, inject, seconds, log, cpus, queue, done):
    os.sched_setaffinity(0, {cpus[rank]})
    torch.cuda.set_device(0)
    if rank == 0:
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        queue.put(flags)
    else:
        flags = queue.get()
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    step = 0

    def barrier():
        nonlocal step
        step += 1
        arrive_and_wait[(1,)](flags, rank, 1 - rank, step)

    for _ in range(20):
        y = x @ w
        barrier()
    torch.cuda.synchronize()
    out = open(f"{log}.{rank}", "w")
    if rank == 0:
        print("ready", flush=True)
    tid = threading.get_native_id()
    # A fixed number of steps, the same in both ranks: a rank that stopped early would leave
    # the other spinning in the barrier.
    n, steps = 0, int(seconds * 150)
    while n < steps:
        t0 = time.monotonic_ns()
        y = x @ w
        if inject == "stall" and rank == 1 and n % 20 == 0:
            time.sleep(0.03)
        barrier()
        torch.cuda.synchronize()
        out.write(json.dumps({"start_ns": t0, "end_ns": time.monotonic_ns(), "tid": tid, "id": n}) + "\n")
        n += 1
        time.sleep(0.004)
    out.close()
    # The sender of the shared tensor keeps it alive until both are done.
    done.wait()


if __name__ == "__main__":
    inject, seconds, log = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    ctx = mp.get_context("spawn")
    queue, done = ctx.SimpleQueue(), ctx.Barrier(2)
    mp.spawn(rank_main, args=(inject, seconds, log, [2, 6], queue, done), nprocs=2)
