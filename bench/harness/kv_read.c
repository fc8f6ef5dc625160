/* Read rate of a 32-sequence decode step's K/V pattern, with and without arithmetic mixed in
 * (an exploration, not the engine's code; bench/RESULTS.md, session 41).
 *
 *     gcc -O2 -march=native -fopenmp bench/harness/kv_read.c -o /tmp/kv_read
 *     /tmp/kv_read MODE AHEAD SPIN [HINT]
 *
 * 30 layers x 32 sequences x 19 blocks of 3456 K bytes and 3456 V bytes (SmolLM2's 3 kv heads
 * of 64 values, Q4_0, 32-key blocks; a sequence's blocks adjacent in each layer's pools), two
 * threads of 16 sequences, 8 MB of other traffic between layers. MODE 0: no software
 * prefetch; 1: the block AHEAD blocks on asked for line by line while this one is read (HINT
 * 1 prefetcht1, 0 prefetcht0, 2 prefetcht2); 2: the same instructions over one sequence's
 * blocks (in cache: the arithmetic alone). SPIN: a volatile loop of that many turns a line
 * (the arithmetic). Prints the best of 7 steps and the K/V bytes a second. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define NL 30
#define NS 32
#define NB 19
#define BB 3456
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static uint8_t *kp[NL], *vp[NL];
static inline __m512i rd(const uint8_t *p, int n, __m512i acc){
  for (int c=0;c+64<=n;c+=64) acc=_mm512_add_epi32(acc,_mm512_loadu_si512(p+c));
  return acc;
}
static inline void pf(const uint8_t *p,int n,int hint){
  for(int c=0;c<n;c+=64){ if(hint==1)_mm_prefetch((const char*)p+c,_MM_HINT_T1); else if(hint==0)_mm_prefetch((const char*)p+c,_MM_HINT_T0); else if(hint==2) _mm_prefetch((const char*)p+c,_MM_HINT_T2); else _mm_prefetch((const char*)p+c,_MM_HINT_NTA);}
}
int main(int argc,char**argv){
  int mode=atoi(argv[1]); int ahead=argc>2?atoi(argv[2]):1; int spin=argc>3?atoi(argv[3]):0; int hint=argc>4?atoi(argv[4]):1;
  for(int l=0;l<NL;l++){kp[l]=aligned_alloc(64,(size_t)NS*NB*BB+4096);vp[l]=aligned_alloc(64,(size_t)NS*NB*BB+4096);memset(kp[l],1,(size_t)NS*NB*BB);memset(vp[l],2,(size_t)NS*NB*BB);}
  uint8_t *evict=malloc(64<<20); memset(evict,3,64<<20);
  double best=1e9; long sink=0;
  for(int rep=0;rep<7;rep++){
    double t=0;
    for(int l=0;l<NL;l++){
      memset(evict,rep+l,8<<20); // a matmul's worth of other traffic between layers
      double t0=now();
      #pragma omp parallel num_threads(2) reduction(+:sink)
      {
        int tid=omp_get_thread_num(); __m512i acc=_mm512_setzero_si512();
        for(int s=tid*NS/2;s<(tid+1)*NS/2;s++){
          const uint8_t *K=kp[mode==2?0:l]+(size_t)(mode==2?tid:s)*NB*BB, *V=vp[mode==2?0:l]+(size_t)(mode==2?tid:s)*NB*BB;
          if(mode>=1) for(int b=0;b<ahead&&b<NB;b++){pf(K+b*BB,BB,hint);pf(V+b*BB,BB,hint);}
          for(int b=0;b<NB;b++){
            if(mode>=1 && b+ahead<NB){ // spread over this block's reads: line by line
              const uint8_t *nk=K+(b+ahead)*BB,*nv=V+(b+ahead)*BB;
              for(int c=0;c<BB;c+=64){ acc=_mm512_add_epi32(acc,_mm512_loadu_si512(K+b*BB+c)); if(hint==1){_mm_prefetch((const char*)nk+c,_MM_HINT_T1);_mm_prefetch((const char*)nv+c,_MM_HINT_T1);} else if(hint==0){_mm_prefetch((const char*)nk+c,_MM_HINT_T0);_mm_prefetch((const char*)nv+c,_MM_HINT_T0);} else {_mm_prefetch((const char*)nk+c,_MM_HINT_T2);_mm_prefetch((const char*)nv+c,_MM_HINT_T2);} for(volatile int z=0;z<spin;z++);}
              for(int c=0;c<BB;c+=64){ acc=_mm512_add_epi32(acc,_mm512_loadu_si512(V+b*BB+c)); for(volatile int z=0;z<spin;z++);}
            } else {
              for(int c=0;c<BB;c+=64){ acc=_mm512_add_epi32(acc,_mm512_loadu_si512(K+b*BB+c)); for(volatile int z=0;z<spin;z++);}
              for(int c=0;c<BB;c+=64){ acc=_mm512_add_epi32(acc,_mm512_loadu_si512(V+b*BB+c)); for(volatile int z=0;z<spin;z++);}
            }
          }
        }
        sink+=_mm512_reduce_add_epi32(acc);
      }
      t+=now()-t0;
    }
    if(t<best)best=t;
  }
  double bytes=(double)NL*NS*NB*BB*2;
  printf("mode %d ahead %d spin %d hint %d: %.2f ms  %.1f GB/s (%ld)\n",mode,ahead,spin,hint,best*1e3,bytes/best/1e9,sink&1);
}
