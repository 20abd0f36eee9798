// W3: batch-bursting C server, 2 worker threads (unpinned) + dispatcher. Every 150 ms a burst of
// 16 requests (argv[1]; period argv[2] ns), each ~2.7 ms of CPU: ~43 ms CPU per burst, ~0.29 CPU on average.
// Ground truth: run inside a cpu cgroup with quota 40ms/100ms (0.4 CPU): each burst exceeds a
// period's quota -> CFS throttling (the server keeps up on average: ~72% of quota).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
__attribute__((noinline, used)) void tracer_request_start(uint64_t id) { __asm__ volatile("" ::"r"(id) : "memory"); }
__attribute__((noinline, used)) void tracer_request_end(uint64_t id) { __asm__ volatile("" ::"r"(id) : "memory"); }
static pthread_mutex_t qm = PTHREAD_MUTEX_INITIALIZER; static pthread_cond_t qc = PTHREAD_COND_INITIALIZER;
#define QN 4096
static uint64_t q[QN]; static unsigned qh, qt;
static uint64_t now_ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
static volatile double sink;
static void work(void){double x=1;for(int i=0;i<1600000;i++)x=x*1.0000001+0.5;sink=x;}
static void *worker(void*a){char n[16];snprintf(n,16,"infer-%ld",(long)a);prctl(PR_SET_NAME,n);
 for(;;){pthread_mutex_lock(&qm);while(qh==qt)pthread_cond_wait(&qc,&qm);uint64_t id=q[qh++%QN];pthread_mutex_unlock(&qm);
  work();tracer_request_end(id);}}
int main(int c,char**v){int B=c>1?atoi(v[1]):16;long P=c>2?atol(v[2]):150000000;prctl(PR_SET_NAME,"batcher");pthread_t t[2];for(long i=0;i<2;i++)pthread_create(&t[i],0,worker,(void*)i);
 printf("%d\n",getpid());fflush(stdout);uint64_t id=0,next=now_ns();
 for(;;){next+=P;uint64_t n;while((n=now_ns())<next){struct timespec ts={0,(long)(next-n)};nanosleep(&ts,0);}
  pthread_mutex_lock(&qm);for(int k=0;k<B;k++){tracer_request_start(id);q[qt++%QN]=id++;}pthread_cond_broadcast(&qc);pthread_mutex_unlock(&qm);}}
