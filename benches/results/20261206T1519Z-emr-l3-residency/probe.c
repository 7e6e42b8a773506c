// L3 residency probe: per "token" each of 2 threads reads its half of a W-MB buffer
// (sum of floats, AVX-512). The first KEEP MB (of each half, proportionally) are read
// with plain loads; the rest with PREFETCHNTA d ahead + loads (mode nta) or plain.
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static size_t W, KEEP; static int MODE, TOKENS; static int BLK=10; static float *buf;
static pthread_barrier_t bar; static double tt[200];
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static volatile float sink;
static void *work(void *arg){
  long id=(long)arg; size_t n=W/4/2; float *p=buf+id*n; size_t keepk=KEEP/4/2;
  __m512 acc=_mm512_setzero_ps();
  for(int t=0;t<TOKENS;t++){
    int nta=((t/BLK)%2==1); size_t keep=nta?keepk:n; pthread_barrier_wait(&bar); double t0=now();
    for(size_t i=0;i<keep;i+=16) acc=_mm512_add_ps(acc,_mm512_load_ps(p+i));
    if(nta && MODE==1){ for(size_t i=keep;i<n;i+=16){ if((i&15)==0) _mm_prefetch((const char*)(p+i+512),_MM_HINT_NTA); acc=_mm512_add_ps(acc,_mm512_load_ps(p+i));} }
    else if(nta && MODE==3){ for(size_t i=keep;i<n;i+=16){ acc=_mm512_add_ps(acc,_mm512_load_ps(p+i)); if(i>=keep+1024) _mm_clflushopt(p+i-1024);} }
    else if(MODE==2){ for(size_t i=keep;i<n;i+=16){ acc=_mm512_add_ps(acc,_mm512_stream_load_si512 ? _mm512_load_ps(p+i) : _mm512_load_ps(p+i));} }
    else { for(size_t i=keep;i<n;i+=16) acc=_mm512_add_ps(acc,_mm512_load_ps(p+i)); }
    pthread_barrier_wait(&bar); if(id==0) tt[t]=now()-t0;
  }
  sink=_mm512_reduce_add_ps(acc); return 0;
}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int c,char**v){
  W=(size_t)atol(v[1])<<20; KEEP=(size_t)atol(v[2])<<20; MODE=atoi(v[3]); TOKENS=atoi(v[4]);
  buf=aligned_alloc(2<<20,W); memset(buf,1,W);
  pthread_barrier_init(&bar,0,2); pthread_t th[2];
  for(long i=0;i<2;i++) pthread_create(&th[i],0,work,(void*)i);
  for(int i=0;i<2;i++) pthread_join(th[i],0);
  double a[200],b[200]; int na=0,nb=0;
  for(int t=0;t<TOKENS;t++){ if(t%BLK<3) continue; if((t/BLK)%2) b[nb++]=tt[t]; else a[na++]=tt[t]; }
  qsort(a,na,sizeof(double),cmp); qsort(b,nb,sizeof(double),cmp);
  double ma=a[na/2], mb=b[nb/2];
  printf("W=%zuMB keep=%zuMB: plain %.2f ms (%.1f GB/s), nta-rest %.2f ms (%.1f GB/s), ratio %.3f\n",W>>20,KEEP>>20,ma*1e3,W/ma/1e9,mb*1e3,W/mb/1e9,ma/mb);
}
