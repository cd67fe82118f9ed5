/*
 * vnni_peak.c: how many vpdpbusd (AVX512-VNNI, 64 u8 x s8 multiply-adds
 * each) one core retires per second: 12 independent accumulators, so the
 * loop is bound by the instruction's throughput, not its latency.  The
 * ceiling docs/QUANTIZATION.md measures kiln's 8-bit GEMM against.
 *     gcc -O2 -mavx512f -mavx512vnni bench/vnni_peak.c -o /tmp/vnni_peak && /tmp/vnni_peak
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
int main(void){
  __m512i a[12]; __m512i b=_mm512_set1_epi32(0x01020304), c=_mm512_set1_epi32(0x01010101);
  for(int i=0;i<12;i++) a[i]=_mm512_set1_epi32(i);
  long n=200000000; struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
  for(long i=0;i<n;i++){
#define S(k) a[k]=_mm512_dpbusd_epi32(a[k],b,c);
    S(0)S(1)S(2)S(3)S(4)S(5)S(6)S(7)S(8)S(9)S(10)S(11)
    __asm__ volatile("" : "+v"(b));
  }
  clock_gettime(CLOCK_MONOTONIC,&t1);
  double s=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9;
  __m512i r=a[0]; for(int i=1;i<12;i++) r=_mm512_add_epi32(r,a[i]);
  printf("%.1f G vpdpbusd/s = %.0f GMAC/s (%d)\n", n*12/s/1e9, n*12*64/s/1e9, _mm512_reduce_add_epi32(r)&1);
}
