#!/bin/bash
# usage: runw4.sh TAG POLICY ON_MS OFF_MS : Python server (1 serving thread) pinned to CPU 0 + noisy-nb on CPU 0
TAG=$1
taskset -c 0 /usr/bin/python3.11 /tmp/adv1/pyserv.py --mode quiet --log /tmp/adv1/$TAG.lat.jsonl --gc-log /tmp/adv1/$TAG.gc.jsonl > /dev/null &
SP=$!
/tmp/adv1/noisy 0 $2 $3 $4 &
NP=$!
sleep 3
/tmp/adv1/run.sh $TAG $SP --latencies /tmp/adv1/$TAG.lat.jsonl
echo "noisy-nb pid=$NP"
kill $SP $NP; wait $SP $NP 2>/dev/null
