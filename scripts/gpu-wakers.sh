#!/usr/bin/env bash
# Who ends a CUDA-syncing thread's waits, on a machine with an NVIDIA GPU and PyTorch: the
# thread waits for the GPU in blocking-sync events and, between steps, polls no descriptor with
# a 1-ms timeout (an engine polling its sockets). Seen on an H100 (docs/GPU.md): the thread
# sleeps in a futex that libcuda's cuda-EvtHandlr thread wakes (`same_process`, one hop on
# `gpu_driver`), that thread in a poll of the device that the GPU's interrupt ends
# (`gpu_driver` on tp_btf; `interrupt` with classic probes, which cannot see the system call),
# and the poll's timeouts are `timer` (before timers were told from devices, the driver's).
# Prints every pair of the process's threads. Both probe families.
# Usage: scripts/gpu-wakers.sh TRACER_BINARY OUTPUT_DIR
set -u
B=$1
OUT=$2
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ uname -r; nproc; nvidia-smi -L; python3 --version; } >"$OUT/log.txt" 2>&1
python3 - >"$OUT/server.txt" 2>&1 <<'EOF' &
import select, time, torch
x = torch.randn(4096, 4096, device="cuda")
done = torch.cuda.Event(blocking=True)
p = select.poll()
steps = 0
t_end = time.monotonic() + 30
while time.monotonic() < t_end:
    for _ in range(4):
        y = x @ x
    done.record()
    done.synchronize()
    p.poll(1)
    steps += 1
    if steps == 50:
        print("ready", flush=True)
print("steps", steps, flush=True)
EOF
SERVER=$!
for _ in $(seq 100); do grep -q ready "$OUT/server.txt" 2>/dev/null && break; sleep 0.2; done
for probes in btf classic; do
  "$B" attach -p "$SERVER" -d 4s --probes "$probes" --json >"$OUT/$probes.json" 2>>"$OUT/log.txt"
  echo "$probes exit $?" >>"$OUT/log.txt"
  python3 - "$OUT/$probes.json" "$SERVER" >>"$OUT/log.txt" 2>&1 <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
main = int(sys.argv[2])
for h in doc["held_up_by"]:
    hop = (h.get("waker_held_up_by") or {}).get("kind")
    print(sys.argv[1].rsplit("/", 1)[-1], h["comm"], h["tid"], h["blocked_in"], h["by"]["kind"],
          h["by"]["comm"], h["wakeups"], "waits", round(h["blocked_ns"] / 1e6, 1), "ms",
          "then", hop)
t = next(t for t in doc["threads"] if t["tid"] == main)
print("cuda", t.get("cuda"))
EOF
done
kill "$SERVER" 2>/dev/null
wait
