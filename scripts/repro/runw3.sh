#!/bin/bash
# usage: runw3.sh TAG MODE(cgroup|pid) BURST PERIOD_NS
TAG=$1
P=$(/tmp/adv1/w3_start.sh $3 $4); sleep 2
if [ $2 = cgroup ]; then TGT="--cgroup /sys/fs/cgroup/cpu/adv1w3"; else TGT="-p $P"; fi
echo "== $TAG $(uptime)"
/tmp/adv1/tracer attach $TGT -d 5s --json -o /tmp/adv1/$TAG.trace --request-start /tmp/adv1/w3_burst:tracer_request_start --request-end /tmp/adv1/w3_burst:tracer_request_end --request-id-arg 0 > /tmp/adv1/$TAG.json 2>/tmp/adv1/$TAG.err; echo rc=$?
/tmp/adv1/tracer report /tmp/adv1/$TAG.trace > /tmp/adv1/$TAG.txt 2>/dev/null
jq -r '.verdict | "primary=\(.primary) basis=\(.basis)", (.causes[] | "  \(.share*100|floor)% \(.cause)/\(.mechanism_id): \(.mechanism) acts_in=\(.acts_in.comm)(\(.acts_in.pid))")' /tmp/adv1/$TAG.json
grep -m1 '^Requests' /tmp/adv1/$TAG.txt | cut -c1-160
kill $P; wait $P 2>/dev/null
