// noisy neighbour: pinned to CPU argv[1], policy argv[2] (rr|fifo|n19 = nice 19|other = nice -10), spins argv[3] ms, sleeps argv[4] ms, forever.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c,char**v){prctl(PR_SET_NAME,"noisy-nb");cpu_set_t s;CPU_ZERO(&s);CPU_SET(atoi(v[1]),&s);sched_setaffinity(0,sizeof s,&s);
 struct sched_param p={.sched_priority=5};
 if(!strcmp(v[2],"rr"))sched_setscheduler(0,SCHED_RR,&p);else if(!strcmp(v[2],"fifo"))sched_setscheduler(0,SCHED_FIFO,&p);else if(!strcmp(v[2],"n19"))setpriority(PRIO_PROCESS,0,19);else setpriority(PRIO_PROCESS,0,-10);
 double on=atof(v[3])/1e3, off=atof(v[4])/1e3; volatile double x=1;
 for(;;){double e=now()+on;while(now()<e)x=x*1.0000001+0.5;usleep((useconds_t)(off*1e6));}}
