#!/usr/bin/env bash
# Issue 20's runs (docs/GPU.md): two tensor-parallel ranks quiet, with a stall in rank 1's loop,
# with CPU hogs on rank 1's CPU, with a neighbour process on GPU 1 (INJ picks; the neighbour
# needs a second GPU); the tracer attached to the launcher (children included) for
# 8 s each, its JSON in OUTPUT_DIR, the per-rank figures and the verdict printed.
# SCRIPT picks the workload: tp_ranks.py (default: NCCL, a GPU a rank; --one-gpu: gloo on one
# GPU) or tp_one_gpu.py (the single-GPU stand-in whose barrier waits on the GPU).
# Usage: [SCRIPT=tp_one_gpu.py] scripts/gpu-tp.sh TRACER_BINARY OUTPUT_DIR [--one-gpu]
set -u
B=$1
OUT=$2
shift 2
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
for inj in ${INJ:-none stall hog neighbour}; do
  rm -f /tmp/tp.log.*
  timeout 100 python3 examples/${SCRIPT:-tp_ranks.py} ${inj/neighbour/none} 25 /tmp/tp.log "$@" > /tmp/tp.out 2>&1 &
  L=$!
  for i in $(seq 90); do grep -q ready /tmp/tp.out && break; sleep 0.5; done
  HOGS=""
  if [ $inj = hog ]; then for k in 1 2; do taskset -c 6 python3 -c 'while True: pass' & HOGS="$HOGS $!"; done; fi
  # A process of matmuls on GPU 1 only (the ranks' workload runs as `none` meanwhile).
  if [ $inj = neighbour ]; then
    python3 -c 'import torch; a = torch.randn(8192, 8192, device="cuda:1")
while True: a @ a' &
    HOGS="$HOGS $!"; sleep 5
  fi
  sleep 1
  $B attach -p $L -d 8s --json > $OUT/tp-$inj.json 2> $OUT/tp-$inj.err
  echo "$inj attach rc=$?"
  kill $HOGS 2>/dev/null
  wait $L
  tail -3 /tmp/tp.out
  cat /tmp/tp.log.0 /tmp/tp.log.1 | python3 -c "
import json,sys
d=[json.loads(l) for l in sys.stdin]; w=sorted(x['end_ns']-x['start_ns'] for x in d)
print('$inj', 'steps',len(d),'p50 %.2f ms p99 %.2f ms'%(w[len(w)//2]/1e6, w[int(len(w)*.99)]/1e6))"
  python3 - $OUT/tp-$inj.json <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); v=d['verdict']
print(' verdict:', v['primary'], '|', v['headline'][:400])
for c in v['causes'][:4]: print('  ', round(c['share'],2), c['mechanism_id'], (c.get('acts_in') or {}).get('pid'), c['evidence'][:300])
r=d.get('ranks') or {}
for k in r.get('ranks',[]): print('  rank', {x: (round(y/1e6) if isinstance(y,int) and x.endswith('_ns') else y) for x,y in k.items()})
print('  straggler', r.get('straggler'))
print('  cuda lost_returns', d['cuda'].get('lost_returns'), 'sync_calls', d['cuda'].get('sync_calls'))
# The ranks' own measure: steps wholly inside the window, time in torch.cuda.synchronize.
steps = [json.loads(l) for k in (0, 1) for l in open(f'/tmp/tp.log.{k}')]
for k in r.get('ranks', []):
    own = [s for s in steps if s.get('pid') == k['pid'] and d['start_ns'] <= s['start_ns'] and s['end_ns'] <= d['end_ns']]
    print('  rank pid', k['pid'], 'tracer sync %.1f ms / %d calls; own %.1f ms / %d steps' % (k['sync_ns'] / 1e6, k['sync_calls'], sum(s['sync_ns'] for s in own) / 1e6, len(own)))
g=d.get('gpu') or {}
for dev in g.get('devices',[]): print('  gpu', dev.get('index'), 'util', dev.get('util_gpu_pct'), 'member_sm', dev.get('member_sm'))
PY
done
