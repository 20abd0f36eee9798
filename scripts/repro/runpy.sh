#!/bin/bash
# usage: runpy.sh TAG MODE [extra pyserv args...]  -- starts pyserv under /usr/bin/python3.11, attaches with --latencies
TAG=$1; MODE=$2; shift 2
PY=${PY:-/usr/bin/python3.11}
$PY /tmp/adv1/pyserv.py --mode $MODE --log /tmp/adv1/$TAG.lat.jsonl --gc-log /tmp/adv1/$TAG.gc.jsonl "$@" > /tmp/adv1/$TAG.pid &
SP=$!
sleep 3
/tmp/adv1/run.sh $TAG $SP --latencies /tmp/adv1/$TAG.lat.jsonl $TRACER_ARGS
kill $SP; wait $SP 2>/dev/null
