#!/usr/bin/env bash
# Verifies the GPU side on a machine with an NVIDIA GPU and PyTorch (see docs/GPU.md):
#  A. examples/torch_infer.py alone: tracer attach, with nvidia-smi polled over the same window;
#  B. the same server while examples/gpu_hog.py saturates the GPU.
# Usage: scripts/gpu-verify.sh TRACER_BINARY OUTPUT_DIR
set -u
B=$1
OUT=$2
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*" | tee -a "$OUT/log.txt"; }

log "host"
{ uname -r; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } >>"$OUT/log.txt" 2>&1
"$B" doctor --json >"$OUT/doctor.json" 2>>"$OUT/log.txt"
"$B" doctor >>"$OUT/log.txt" 2>&1

# nvidia-smi's view of the same window, every 100 ms.
smi() { nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,clocks.sm,power.draw \
          --format=csv,noheader,nounits -lms 100 >"$1" 2>&1 & echo $!; }

log "start the inference server"
python3 examples/torch_infer.py --duration 75 --log "$OUT/requests.jsonl" >"$OUT/infer.txt" 2>&1 &
INFER=$!
for _ in $(seq 1 120); do grep -q '^ready' "$OUT/infer.txt" 2>/dev/null && break; sleep 0.5; done
cat "$OUT/infer.txt" >>"$OUT/log.txt"
grep -E "libcuda|libcudart" /proc/$INFER/maps | awk "{print \$6}" | sort -u >>"$OUT/log.txt"
sleep 2

log "A: the server alone"
S=$(smi "$OUT/smi_a.csv")
"$B" attach --pid "$INFER" -d 12s --json >"$OUT/attach_a.json" 2>>"$OUT/log.txt"
kill "$S"
"$B" attach --pid "$INFER" -d 3s >>"$OUT/log.txt" 2>&1

log "B: with a GPU hog"
python3 examples/gpu_hog.py --duration 40 >>"$OUT/log.txt" 2>&1 &
HOG=$!
sleep 6
S=$(smi "$OUT/smi_b.csv")
"$B" attach --pid "$INFER" -d 12s --json >"$OUT/attach_b.json" 2>>"$OUT/log.txt"
kill "$S"
"$B" attach --pid "$INFER" -d 3s >>"$OUT/log.txt" 2>&1
kill "$HOG" 2>/dev/null
wait "$INFER"
cat "$OUT/infer.txt" >>"$OUT/log.txt"
log "done"
