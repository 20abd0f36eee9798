#!/bin/bash
# W3b: W3 (burst 32 x 2.7 ms every 300 ms, cgroup quota 0.4 CPU) + a nice-19 spinner on each CPU (fills idle time only).
# Ground truth: cgroup throttling (the nice-19 spinners have weight 15 vs 1024: they can barely delay the server).
TAG=$1
/tmp/adv1/noisy 0 n19 1000000 0 & N0=$!
/tmp/adv1/noisy 1 n19 1000000 0 & N1=$!
sleep 1
/tmp/adv1/runw3.sh $TAG ${2:-cgroup} 32 300000000
echo "spinners: $N0 $N1"; kill $N0 $N1; wait $N0 $N1 2>/dev/null
