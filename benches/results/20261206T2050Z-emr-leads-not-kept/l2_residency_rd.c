// Each of 2 threads reads its own region: `keep` bytes with plain loads (hoping they
// stay in L2) and `stream` bytes with plain loads or prefetchnta-ahead loads.
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sched.h>
static size_t KEEP, STREAM; static int NTA, ITERS;
static volatile int cnt[2]; static void spin(long id,int it){ __atomic_store_n(&cnt[id],it+1,__ATOMIC_SEQ_CST); while(__atomic_load_n(&cnt[1-id],__ATOMIC_SEQ_CST)<it+1) _mm_pause(); }
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float sink[64]; float* volatile esc;
static __m512 rd(const float*p,size_t n,__m512 acc,int nta){
  __m512 a1=_mm512_setzero_ps(),a2=a1,a3=a1;
  for(size_t i=0;i<n;i+=64){
    if(nta){_mm_prefetch((const char*)(p+i+1024),_MM_HINT_NTA);_mm_prefetch((const char*)(p+i+1024+16),_MM_HINT_NTA);_mm_prefetch((const char*)(p+i+1024+32),_MM_HINT_NTA);_mm_prefetch((const char*)(p+i+1024+48),_MM_HINT_NTA);}
    acc=_mm512_add_ps(acc,_mm512_load_ps(p+i));a1=_mm512_add_ps(a1,_mm512_load_ps(p+i+16));
    a2=_mm512_add_ps(a2,_mm512_load_ps(p+i+32));a3=_mm512_add_ps(a3,_mm512_load_ps(p+i+48));}
  return _mm512_add_ps(_mm512_add_ps(acc,a1),_mm512_add_ps(a2,a3));
}
static void* work(void*arg){
  long id=(long)arg; cpu_set_t s; CPU_ZERO(&s); CPU_SET(id,&s); pthread_setaffinity_np(pthread_self(),sizeof s,&s);
  size_t nk=KEEP/4, ns=STREAM/4;
  float*k=aligned_alloc(4096,KEEP+8192), *st=aligned_alloc(4096,STREAM+8192);
  esc=k; esc=st; for(size_t i=0;i<nk;i++)k[i]=1; for(size_t i=0;i<ns;i++)st[i]=1;
  __m512 acc=_mm512_setzero_ps(); double t0=0;
  for(int it=0;it<ITERS+3;it++){
    spin(id,it); if(it==3&&id==0)t0=now();
    __asm__ volatile("" : : "r"(k), "r"(st) : "memory"); if(nk)acc=rd(k,nk,acc,0); if(ns)acc=rd(st,ns,acc,NTA);
  }
  spin(id,ITERS+3);
  if(id==0){double t=now()-t0; printf("keep %.2f MB stream %.2f MB /thread nta=%d: %.1f us/iter, %.1f GB/s\n",KEEP/1e6,STREAM/1e6,NTA,t/ITERS*1e6,2.0*(KEEP+STREAM)*ITERS/t/1e9);}
  _mm512_store_ps(sink,acc); if(id==0)printf("sum %f nk %zu ns %zu\n",sink[0],nk,ns); return 0;
}
int main(int c,char**v){KEEP=atof(v[1])*1e6; KEEP&=~4095UL; STREAM=atof(v[2])*1e6; STREAM&=~4095UL; NTA=atoi(v[3]); ITERS=atoi(v[4]);
  pthread_t t[2]; for(long i=0;i<2;i++)pthread_create(&t[i],0,work,(void*)i); for(int i=0;i<2;i++)pthread_join(t[i],0);}
