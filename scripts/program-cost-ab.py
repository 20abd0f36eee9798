#!/usr/bin/env python3
"""The target path's cost per program run of two (or more) tracer builds, A/B.

Usage (root): scripts/program-cost-ab.py ROUNDS TRACER_A TRACER_B ...

Each round runs every build in turn: `perf bench sched pipe -T` on CPU 1 (two threads of one
process passing a token), the tracer attached to it from CPU 0 for 6 s, and the BPF run
statistics (kernel.bpf_stats_enabled, on for the script's run only) of the scheduler
programs over 2.5 s in the middle of the window. Prints each build's median ns per run by
program, and the switch program's per-round figures. The statistics' own clock reads are in
every figure alike, so compare builds with it, not with the timed bench.
"""
import json, subprocess, time, sys, statistics, collections
builds = sys.argv[2:]
rounds = int(sys.argv[1])
old_stats = open('/proc/sys/kernel/bpf_stats_enabled').read().strip()
open('/proc/sys/kernel/bpf_stats_enabled','w').write('1')
def snap():
    out = json.loads(subprocess.check_output(['bpftool','-j','prog','show']))
    return {p['name']:(p.get('run_cnt',0),p.get('run_time_ns',0)) for p in out if p.get('name','').startswith('sched_')}
res = collections.defaultdict(lambda: collections.defaultdict(list))
for r in range(rounds):
    for b in builds:
        bench = subprocess.Popen(['taskset','-c','1','perf','bench','sched','pipe','-T','-l','3000000'],stdout=subprocess.DEVNULL)
        time.sleep(0.3)
        tr = subprocess.Popen(['taskset','-c','0',b,'attach','-p',str(bench.pid),'--duration','6s','--no-gpu','--json'],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
        time.sleep(2.5)
        a = snap(); time.sleep(2.5); z = snap()
        tr.wait(); bench.kill(); bench.wait()
        for k in z:
            if k in a:
                dc = z[k][0]-a[k][0]; dt = z[k][1]-a[k][1]
                if dc > 1000: res[b][k].append(dt/dc)
open('/proc/sys/kernel/bpf_stats_enabled','w').write(old_stats)
for b in builds:
    print(b, {k: round(statistics.median(v),1) for k,v in sorted(res[b].items())}, {k: [round(x) for x in v] for k,v in sorted(res[b].items()) if 'switch' in k})
