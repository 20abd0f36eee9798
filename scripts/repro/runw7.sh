#!/bin/bash
# usage: runw7.sh TAG [quiet]
TAG=$1
/usr/bin/python3.11 /tmp/adv1/w7_mp.py /tmp/adv1/$TAG.lat.jsonl $2 > /tmp/adv1/$TAG.pid &
SP=$!
sleep 3
/tmp/adv1/run.sh $TAG $SP --latencies /tmp/adv1/$TAG.lat.jsonl $TRACER_ARGS
cat /tmp/adv1/$TAG.pid
kill $(cat /tmp/adv1/$TAG.pid); wait $SP 2>/dev/null
