#!/bin/bash
# usage: run.sh TAG PIDFILE_OR_PID "tracer extra args"   (workload started separately)
# Records with --json into TAG.json, text from the same trace via report.
TAG=$1; P=$2; shift 2
echo "== $TAG pid=$P  $(uptime)"
top -bn1 | sed -n 7,10p
/tmp/adv1/tracer attach -p $P -d 5s --json -o /tmp/adv1/$TAG.trace "$@" > /tmp/adv1/$TAG.json 2>/tmp/adv1/$TAG.err
echo rc=$?
/tmp/adv1/tracer report /tmp/adv1/$TAG.trace > /tmp/adv1/$TAG.txt 2>/dev/null
jq -r '.verdict | "primary=\(.primary) basis=\(.basis)", (.causes[] | "  \(.share*100|floor)% \(.cause)/\(.mechanism_id): \(.mechanism) acts_in=\(.acts_in.comm)(\(.acts_in.pid))")' /tmp/adv1/$TAG.json
grep -m1 '^Requests' /tmp/adv1/$TAG.txt | cut -c1-200
