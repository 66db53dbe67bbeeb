/*
 * Throw-away measurement, not part of the build: what a vCPU that spins
 * on `rdtsc` (or `pause`, or nothing) costs another vCPU's system calls
 * and TSC reads. Under QEMU TCG every guest `rdtsc` is a helper call that
 * takes one global lock, so spinning pollers that read the TSC on each
 * empty poll slow the other vCPUs' reads, the kernel's on every system
 * call included. docs/bench-results.md (session 30) has the figures.
 *
 *   gcc -O2 -pthread -o /tmp/tcg-rdtsc-peer docs/experiments/tcg-rdtsc-peer.c
 *   ../shared/rxe-vm/run-in-rxe-vm.sh -- /tmp/tcg-rdtsc-peer
 *
 * (On the host: the same figures with and without the peer.)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <x86intrin.h>
static volatile int mode, stop;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
volatile uint64_t sink;
static void* spinner(void*a){pin(1);uint64_t x=0;while(!stop){ if(mode==1) x+=__rdtsc(); else if(mode==2) _mm_pause(); else x++; __asm__ volatile("":"+r"(x)); } sink=x; return 0;}
static char buf[1<<16];
int main(){
  pin(0); pthread_t t; 
  const char* names[]={"peer spins plain","peer spins rdtsc","peer spins pause","peer absent"};
  { long N=200000; double t0=now(); uint64_t x=0; for(long i=0;i<N;i++) x+=__rdtsc(); sink=x; printf("rdtsc alone: %.1f ns\n",(now()-t0)/N); }
  for(int rep=0;rep<2;rep++) for(int m=0;m<4;m++){
    mode=m; stop=0; if(m<3) pthread_create(&t,0,spinner,0); usleep(20000);
    long N=20000; double t0=now();
    for(long i=0;i<N;i++){ syscall(SYS_getppid); for(int j=0;j<64;j++) buf[j*64+(i&15)]++; }
    double d1=(now()-t0)/N;
    t0=now(); uint64_t x=0; for(long i=0;i<100000;i++) x+=__rdtsc(); sink=x; double d2=(now()-t0)/100000;
    stop=1; if(m<3) pthread_join(t,0);
    printf("%-18s syscall+64 stores %.1f ns, rdtsc %.1f ns\n",names[m],d1,d2);
  }
}
