#!/usr/bin/env bash
# Verifies the tracer on a service of several processes on a machine with an NVIDIA GPU and
# PyTorch (docs/GPU.md, issue 15): a PyTorch front end whose engine child owns the GPU,
# attached by the front end's PID, while another process saturates the GPU; nvidia-smi's
# per-process view (pmon) over the same window. Then `tracer run` on the service from its
# start: the engine initializes CUDA inside the window, and the CUDA probes must see it.
# Usage: scripts/gpu-multiprocess.sh TRACER_BINARY OUTPUT_DIR
set -u
B=$1
OUT=$2
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*" | tee -a "$OUT/log.txt"; }
log "host"
{ uname -r; nproc; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; } >>"$OUT/log.txt" 2>&1

for i in 1 2; do
  log "multiprocess-gpu-saturation, run $i"
  nvidia-smi pmon -s u -d 1 >"$OUT/pmon_$i.txt" 2>&1 &
  P=$!
  nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 100 \
    >"$OUT/smi_$i.csv" 2>&1 &
  S=$!
  "$B" demo --scenario multiprocess-gpu-saturation --json >"$OUT/mp_$i.json" 2>>"$OUT/log.txt"
  echo "exit $?" >>"$OUT/log.txt"
  kill $P $S 2>/dev/null
done
log "multiprocess-gpu-saturation, text"
"$B" demo --scenario multiprocess-gpu-saturation --quiet >"$OUT/mp.txt" 2>>"$OUT/log.txt"
log "gpu-saturation (single process, for comparison)"
"$B" demo --scenario gpu-saturation --json --quiet >"$OUT/single.json" 2>>"$OUT/log.txt"

log "tracer run on the service from its start (CUDA initialized inside the window)"
# The service's own "ready" line kept off the tracer's stdout (the JSON document).
"$B" run -d 20s --json -- sh -c "exec python3 tracer/src/workload/gpu_server.py serve \
  --engine-process --duration 12 --log $OUT/run_requests.jsonl >/dev/null" \
  >"$OUT/run.json" 2>>"$OUT/log.txt"
echo "exit $?" >>"$OUT/log.txt"

python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out = sys.argv[1]
def show(name, d):
    v, demo = d["verdict"], d.get("demo", {})
    c = v["causes"][0] if v["causes"] else {}
    print(f"{name}: primary {v['primary']}, correct {demo.get('correct')}, engine {demo.get('engine_pid')}")
    print(f"  headline: {v['headline']}")
    print(f"  acts_in: {c.get('acts_in')}  mechanism_id: {c.get('mechanism_id')}")
    print(f"  processes: {[(p['pid'], p['role'], p['threads']) for p in d['processes']]}")
    for g in (d.get("gpu") or {}).get("devices", []):
        print(f"  GPU {g['index']}: util {g['util_gpu_pct']}, target_sm {g['target_sm_pct']}, member_sm {g['member_sm']}")
    print(f"  cuda: {d['cuda']}; capability: {d['capabilities']['gpu']['cuda']['reason']}")
for i in (1, 2):
    show(f"multiprocess run {i}", json.load(open(f"{out}/mp_{i}.json")))
show("single process", json.load(open(f"{out}/single.json")))
r = json.load(open(f"{out}/run.json"))
show("tracer run", r)
for p in r["processes"]:
    th = [t for t in r["threads"] if t["pid"] == p["pid"] and t.get("cuda")]
    print(f"  PID {p['pid']} {p['role']}: joined {p['joined_ns']}, CUDA threads {len(th)}, "
          f"sync calls {sum(t['cuda']['sync_calls'] for t in th)}")
reqs = sum(1 for l in open(f"{out}/run_requests.jsonl")) - 1
print(f"  the engine's own log: {reqs} requests, each one synchronize")
PY
