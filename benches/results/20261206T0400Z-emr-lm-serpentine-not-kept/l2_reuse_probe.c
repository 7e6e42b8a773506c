// L2 reuse probe: per thread, per "token": read BLK bytes (block weights) forward, then
// LM bytes (output layer) forward, or alternately forward/backward (serpentine).
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sched.h>

static size_t BLK, LM; static int SERP, TOKENS;
static pthread_barrier_t bar;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static volatile float sink;
__attribute__((target("avx512f")))
static float readf(const float *p, size_t n){ __m512 a=_mm512_setzero_ps(),b=a,c=a,d=a;
  for(size_t i=0;i<n;i+=64){a=_mm512_add_ps(a,_mm512_load_ps(p+i));b=_mm512_add_ps(b,_mm512_load_ps(p+i+16));c=_mm512_add_ps(c,_mm512_load_ps(p+i+32));d=_mm512_add_ps(d,_mm512_load_ps(p+i+48));}
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a,b),_mm512_add_ps(c,d)));}
// backward by 8 KB bands (each band read forward), bands in reverse order
__attribute__((target("avx512f")))
static float readb(const float *p, size_t n){ float s=0; size_t band=2048; for(size_t e=n; e>0; e-= (e>=band?band:e)){ size_t st = e>=band? e-band:0; s+=readf(p+st, e-st);} return s;}
static double times[2][100000];
static void *run(void *arg){ long id=(long)arg; cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(id,&cs); pthread_setaffinity_np(pthread_self(),sizeof cs,&cs);
  float *blk=aligned_alloc(64,BLK), *lm=aligned_alloc(64,LM); memset(blk,0,BLK); memset(lm,0,LM);
  float s=0; for(int t=0;t<TOKENS;t++){ pthread_barrier_wait(&bar); double t0=now();
    s+=readf(blk,BLK/4); if(SERP && (t&1)) s+=readb(lm,LM/4); else s+=readf(lm,LM/4);
    times[id][t]=now()-t0; }
  sink=s; return 0;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){ BLK=(size_t)(atof(argv[1])*1024*1024)/256*256; LM=(size_t)(atof(argv[2])*1024*1024)/256*256; SERP=atoi(argv[3]); TOKENS=atoi(argv[4]); int th=atoi(argv[5]);
  pthread_barrier_init(&bar,0,th); pthread_t p[2]; for(long i=0;i<th;i++) pthread_create(&p[i],0,run,(void*)i); for(int i=0;i<th;i++) pthread_join(p[i],0);
  qsort(times[0]+10,TOKENS-10,sizeof(double),cmp); double med=times[0][10+(TOKENS-10)/2];
  printf("blk %.2f MB lm %.2f MB serp %d threads %d: median %.1f us per token, %.1f GB/s per thread\n", BLK/1048576.0, LM/1048576.0, SERP, th, med*1e6, (BLK+LM)/med/1e9);}
