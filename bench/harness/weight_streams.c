/* Read rate of one-token matvec weight streams: 2 threads read 178 MB (gemma-3-270m's Q8_0
 * head) as S streams a thread side by side, WORK vpdpbusd a 64-byte line, software prefetch
 * PF bytes ahead into L2 (0: none). An exploration, not the engine's code (bench/RESULTS.md,
 * session 41: 2 streams 29.4 GB/s, 4 streams 31.4 with a 2 KB prefetch; in the engine four
 * streams were no faster).
 *
 *     gcc -O2 -march=native -fopenmp bench/harness/weight_streams.c -o /tmp/weight_streams
 *     /tmp/weight_streams S WORK [PF]      (S = 1, 2 or 4)
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc,char**argv){
  int S=atoi(argv[1]); if(S<1||S>4){fprintf(stderr,"S: 1, 2 or 4\n");return 2;} int work=atoi(argv[2]); int pf=argc>3?atoi(argv[3]):0;
  size_t n=178u<<20; uint8_t *a=aligned_alloc(4096,n); memset(a,1,n);
  double best=1e9; long sink=0;
  for(int rep=0;rep<7;rep++){
    double t0=now();
    #pragma omp parallel num_threads(2) reduction(+:sink)
    {
      int tid=omp_get_thread_num(); size_t half=n/2; const uint8_t *base=a+tid*half;
      size_t per=half/S; __m512i acc[4]={_mm512_setzero_si512(),_mm512_setzero_si512(),_mm512_setzero_si512(),_mm512_setzero_si512()};
      __m512i w=_mm512_set1_epi8(3);
      for(size_t o=0;o<per;o+=64){
        for(int s=0;s<S;s++){
          const uint8_t *p=base+s*per+o;
          if(pf) _mm_prefetch((const char*)p+pf,_MM_HINT_T1);
          __m512i v=_mm512_load_si512(p);
          for(int k=0;k<work;k++) acc[s]=_mm512_dpbusd_epi32(acc[s],v,w);
        }
      }
      __m512i t=_mm512_add_epi32(_mm512_add_epi32(acc[0],acc[1]),_mm512_add_epi32(acc[2],acc[3]));
      sink+=_mm512_reduce_add_epi32(t);
    }
    double t=now()-t0; if(t<best)best=t;
  }
  printf("streams %d work %d pf %d: %.1f GB/s (%ld)\n",S,work,pf,n/best/1e9,sink&1);
}
