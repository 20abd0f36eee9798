#!/bin/bash
# W3b without requests: the window path. usage: runw3w.sh TAG BIN
TAG=$1; BIN=$2
/tmp/adv1/noisy 0 n19 1000000 0 & N0=$!
/tmp/adv1/noisy 1 n19 1000000 0 & N1=$!
sleep 1
P=$(/tmp/adv1/w3_start.sh 32 300000000); sleep 2
$BIN attach --cgroup /sys/fs/cgroup/cpu/adv1w3 -d 5s --json --quiet > /tmp/adv1/$TAG.json 2>/tmp/adv1/$TAG.err; echo "$TAG rc=$?"
jq -r '.verdict | "primary=\(.primary) basis=\(.basis)", (.causes[] | "  \(.share*100|floor)% \(.mechanism_id): \(.evidence[0:260])")' /tmp/adv1/$TAG.json
kill $P $N0 $N1; wait $P $N0 $N1 2>/dev/null
