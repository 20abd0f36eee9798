#!/bin/bash
# start w3_burst in cpu cgroup /sys/fs/cgroup/cpu/adv1w3 with quota 40ms/100ms (QUOTA env to change; -1 = none)
CG=/sys/fs/cgroup/cpu/adv1w3
mkdir -p $CG; echo 100000 > $CG/cpu.cfs_period_us; echo ${QUOTA:-40000} > $CG/cpu.cfs_quota_us
sh -c "echo \$\$ > $CG/cgroup.procs; exec /tmp/adv1/w3_burst $*" > /dev/null &
echo $!
