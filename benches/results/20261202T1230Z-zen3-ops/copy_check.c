#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  double mbs[]={3.1,4.7,6.3,9.4,14.7};
  for(int m=0;m<5;m++){
    size_t n=(size_t)(mbs[m]*1e6/4);
    float*s=malloc(n*4),*d=calloc(n,4);
    for(size_t i=0;i<n;i++)s[i]=i;
    size_t ch=1<<16; size_t nch=(n+ch-1)/ch;
    double ts[30];
    for(int r=0;r<33;r++){
      double t=now();
      #pragma omp parallel for schedule(dynamic,1) num_threads(2)
      for(size_t c=0;c<nch;c++){size_t a=c*ch,b=a+ch<n?a+ch:n;memcpy(d+a,s+a,(b-a)*4);}
      t=now()-t; if(r>=3)ts[r-3]=t;
    }
    qsort(ts,30,sizeof(double),cmp);
    printf("%.1f MB/side: %.1f GB/s (s%%4096=%lu d%%4096=%lu)\n",mbs[m],2.0*n*4/ts[15]/1e9,(unsigned long)s%4096,(unsigned long)d%4096);
    free(s);free(d);
  }
}
