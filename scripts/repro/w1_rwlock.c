// W1: inference-like C server. dispatcher (200 req/s, open loop) -> queue -> worker.
// Worker takes a pthread rwlock for READ per request (~0.4 ms of arithmetic).
// Ground truth: thread "rw-writer" takes the rwlock for WRITE, spinning 30 ms, every 200 ms.
// Markers: tracer_request_start(id) at arrival (dispatcher), tracer_request_end(id) on the worker.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>

__attribute__((noinline, used)) void tracer_request_start(uint64_t id) { __asm__ volatile("" ::"r"(id) : "memory"); }
__attribute__((noinline, used)) void tracer_request_end(uint64_t id) { __asm__ volatile("" ::"r"(id) : "memory"); }

static pthread_rwlock_t rw = PTHREAD_RWLOCK_INITIALIZER;
static pthread_mutex_t qm = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qc = PTHREAD_COND_INITIALIZER;
#define QN 4096
static uint64_t q[QN]; static unsigned qh, qt;
static int writer_on = 1;

static uint64_t now_ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
static void pin(int cpu){cpu_set_t s;CPU_ZERO(&s);CPU_SET(cpu,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static volatile double sink;
static void spin_ns(uint64_t ns){uint64_t e=now_ns()+ns;double x=1;while(now_ns()<e){for(int i=0;i<200;i++)x=x*1.0000001+0.5;}sink=x;}
static void work(void){double x=1;for(int i=0;i<400000;i++)x=x*1.0000001+0.5;sink=x;}

static void *dispatcher(void*a){prctl(PR_SET_NAME,"dispatch");pin(0);uint64_t id=0,next=now_ns();
 for(;;){next+=5000000;uint64_t n;while((n=now_ns())<next){struct timespec ts={0,(long)(next-n)};nanosleep(&ts,0);}
  tracer_request_start(id);pthread_mutex_lock(&qm);q[qt++%QN]=id++;pthread_cond_signal(&qc);pthread_mutex_unlock(&qm);}}
static void *worker(void*a){prctl(PR_SET_NAME,"worker");pin(0);
 for(;;){pthread_mutex_lock(&qm);while(qh==qt)pthread_cond_wait(&qc,&qm);uint64_t id=q[qh++%QN];pthread_mutex_unlock(&qm);
  pthread_rwlock_rdlock(&rw);work();pthread_rwlock_unlock(&rw);tracer_request_end(id);}}
static void *writer(void*a){prctl(PR_SET_NAME,"rw-writer");pin(1);
 for(;;){usleep(200000);if(!writer_on)continue;pthread_rwlock_wrlock(&rw);spin_ns(30000000);pthread_rwlock_unlock(&rw);}}
int main(int c,char**v){ if(c>1&&!strcmp(v[1],"quiet"))writer_on=0;
 pthread_t a,b,w;pthread_create(&b,0,worker,0);pthread_create(&a,0,dispatcher,0);pthread_create(&w,0,writer,0);
 printf("%d\n",getpid());fflush(stdout);pthread_join(a,0);}
