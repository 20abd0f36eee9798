#!/usr/bin/env bash
# Runs every `tracer demo` scenario on a machine with an NVIDIA GPU and PyTorch (the GPU
# scenarios need both), with nvidia-smi polled over each as the independent view of the GPU,
# and writes a summary: expected vs verdict, and the tracer's GPU utilization against
# nvidia-smi's over the same window.
# Usage: scripts/gpu-scenarios.sh TRACER_BINARY OUTPUT_DIR
set -u
B=$1
OUT=$2
mkdir -p "$OUT/raw"
log() { echo "== $(date +%T) $*" | tee -a "$OUT/log.txt"; }
log "host"
{ uname -r; nproc; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; } >>"$OUT/log.txt" 2>&1
for s in gpu-saturation gpu-sync-stall quiet cpu-contention cfs-throttle migration-storm cache-thrash; do
  log "scenario $s"
  nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw --format=csv,noheader,nounits \
    -lms 100 >"$OUT/raw/smi_$s.csv" 2>&1 &
  S=$!
  "$B" demo --scenario "$s" --json --quiet >"$OUT/raw/$s.json" 2>>"$OUT/log.txt"
  echo "exit $?" >>"$OUT/log.txt"
  kill $S 2>/dev/null
done
for s in gpu-saturation gpu-sync-stall; do
  log "text $s"
  "$B" demo --scenario "$s" --quiet >"$OUT/$s.txt" 2>>"$OUT/log.txt"
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import csv, datetime, json, sys
out = sys.argv[1]
for s in ["gpu-saturation", "gpu-sync-stall", "quiet", "cpu-contention", "cfs-throttle",
          "migration-storm", "cache-thrash"]:
    d = json.load(open(f"{out}/raw/{s}.json"))
    v, demo = d["verdict"], d["demo"]
    top = v["causes"][0]["mechanism"] if v["causes"] else "-"
    print(f"{s:16} expected {demo['expected_primary']:15} got {v['primary']:15} "
          f"{'ok' if demo['correct'] else 'WRONG'}  | {top}")
    if d.get("gpu"):
        off = d["realtime_minus_monotonic_ns"]
        w0, w1 = d["start_ns"] + off, d["end_ns"] + off
        dev = d["gpu"]["devices"][0]
        # nvidia-smi's samples inside the recording window (its timestamps are local time).
        rows = []
        for r in csv.reader(open(f"{out}/raw/smi_{s}.csv")):
            try:
                t = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                if w0 <= t * 1e9 <= w1:
                    rows.append((t * 1e9, float(r[1]), float(r[2]), float(r[3])))
            except (ValueError, IndexError):
                pass
        print(f"{'':16} tracer: util {dev['util_gpu_pct']:.1f}%  SM clock {dev['sm_clock_mhz']:.0f} MHz  "
              f"power {dev['power_w']:.0f} W  own SM {dev['target_sm_pct']}  reasons "
              f"{[(r['reason'], round(r['share_of_polls'], 2)) for r in dev['clock_event_reasons']]}")
        print(f"{'':16} cuda: {d['cuda']}")
        r = d["requests"]
        print(f"{'':16} requests {r['requests']} p50 {r['p50_ns']/1e6:.2f} ms p99 {r['p99_ns']/1e6:.2f} ms "
              f"closure {r['closure_within_5pct']}")
        n = max(1, len(rows))
        print(f"{'':16} nvidia-smi over the window ({len(rows)} samples): util "
              f"{sum(x[1] for x in rows)/n:.1f}%  SM clock {sum(x[2] for x in rows)/n:.0f} MHz  "
              f"power {sum(x[3] for x in rows)/n:.0f} W")
        print(f"{'':16} headline: {v['headline']}")
PY
log "done"
