#!/bin/bash
# W1n: the C server of W1 with the rwlock writer off ("quiet"), dispatcher+worker pinned to CPU 0, and noisy-nb (SCHED_RR, 6 ms on / 24 ms off) on CPU 0.
# Ground truth: scheduling (run-queue contention by noisy-nb). Checks whether the worker's condvar wait for the delayed dispatcher is called a lock wait.
TAG=$1
/tmp/adv1/w1_rwlock quiet > /dev/null & SP=$!
/tmp/adv1/noisy 0 ${2:-rr} 6 24 & NP=$!
sleep 2
/tmp/adv1/run.sh $TAG $SP --request-start /tmp/adv1/w1_rwlock:tracer_request_start --request-end /tmp/adv1/w1_rwlock:tracer_request_end --request-id-arg 0
kill $SP $NP; wait $SP $NP 2>/dev/null
