#!/usr/bin/env bash
# Verifies issue 16's GPU parts on a machine with an NVIDIA GPU and PyTorch (docs/GPU.md):
# the host-bound scenario (tiny kernels: the serving thread's CPU paces the GPU), the
# tracer's NVML violation counters against `nvidia-smi -q -d PERFORMANCE` read before and
# after, the gpu-saturation scenario still right with the waker probes on, and the GC probes
# of the machine's own Python.
# Usage: scripts/gpu-held.sh TRACER_BINARY OUTPUT_DIR
set -u
B=$1
OUT=$2
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*" | tee -a "$OUT/log.txt"; }
log "host"
{ uname -r; nproc; nvidia-smi -L; python3 --version; } >>"$OUT/log.txt" 2>&1
for i in 1 2 3; do
  log "host-bound, run $i"
  nvidia-smi -q -d PERFORMANCE >"$OUT/perf_before_$i.txt" 2>&1
  "$B" demo --scenario host-bound --json >"$OUT/hb_$i.json" 2>>"$OUT/log.txt"
  echo "exit $?" >>"$OUT/log.txt"
  nvidia-smi -q -d PERFORMANCE >"$OUT/perf_after_$i.txt" 2>&1
done
log "host-bound, text"
"$B" demo --scenario host-bound --quiet >"$OUT/hb.txt" 2>>"$OUT/log.txt"
log "gpu-saturation"
"$B" demo --scenario gpu-saturation --quiet >"$OUT/sat.txt" 2>>"$OUT/log.txt"
log "gc probes of this python"
{ readelf -n "$(python3 -c 'import sys; print(sys.executable)')" 2>/dev/null | grep -A3 gc__; python3 -c 'import sys,sysconfig; print(sys.executable, sysconfig.get_config_var("WITH_DTRACE"))'; } >>"$OUT/log.txt" 2>&1
log "done"
