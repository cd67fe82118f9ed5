/*
 * gemm_bench.c: kiln_sgemm GFLOP/s against this machine's measured fp32
 * peak.
 *
 * The peak is measured, not looked up: a loop of 12 independent vfmadd on
 * zmm (or ymm without AVX-512) registers, enough chains to cover the FMA
 * latency on every current x86 core, so it runs at the FMA units' issue
 * rate.  kiln_sgemm is JIT-compiled exactly as `kiln compile` builds it
 * (bench/gemm_jit.h) and timed on square row-major products and on shapes
 * from the benchmark models, best of several runs after a warm-up, on one
 * thread and on the runtime's pool (the shapes too: wall time on the
 * pool, against the one-thread CPU time).  Then the convs' shapes once
 * more, one thread, through the two families that take a conv's weights
 * packed at compile time as `kiln compile` packs them (cg_prepack):
 * kiln_sgemm_pa (MR-row panels) and kiln_sgemm_pm (output channels in
 * the lanes, where the target has it), with the one cg_prepack picks.
 *
 *   gemm_bench [threads]   (default 2; 1 skips the threaded column)
 */
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "bench/gemm_jit.h"
#include "runtime/rt.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* this thread's CPU seconds: what one-thread numbers are timed with, so
 * that other processes on a shared machine cannot inflate them */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* seconds for n iterations of 12 independent FMAs on zmm (wide) or ymm */
static double fma_loop(long n, int wide)
{
#if defined(__x86_64__)
	double t = cpu_now();
	if (wide)
		__asm__ volatile(
			"vxorps %%xmm0, %%xmm0, %%xmm0\n"
			"1:\n"
			"vfmadd231ps %%zmm0, %%zmm0, %%zmm1\n vfmadd231ps %%zmm0, %%zmm0, %%zmm2\n"
			"vfmadd231ps %%zmm0, %%zmm0, %%zmm3\n vfmadd231ps %%zmm0, %%zmm0, %%zmm4\n"
			"vfmadd231ps %%zmm0, %%zmm0, %%zmm5\n vfmadd231ps %%zmm0, %%zmm0, %%zmm6\n"
			"vfmadd231ps %%zmm0, %%zmm0, %%zmm7\n vfmadd231ps %%zmm0, %%zmm0, %%zmm8\n"
			"vfmadd231ps %%zmm0, %%zmm0, %%zmm9\n vfmadd231ps %%zmm0, %%zmm0, %%zmm10\n"
			"vfmadd231ps %%zmm0, %%zmm0, %%zmm11\n vfmadd231ps %%zmm0, %%zmm0, %%zmm12\n"
			"dec %0\n jnz 1b\n"
			: "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
			  "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "cc");
	else
		__asm__ volatile(
			"vxorps %%xmm0, %%xmm0, %%xmm0\n"
			"1:\n"
			"vfmadd231ps %%ymm0, %%ymm0, %%ymm1\n vfmadd231ps %%ymm0, %%ymm0, %%ymm2\n"
			"vfmadd231ps %%ymm0, %%ymm0, %%ymm3\n vfmadd231ps %%ymm0, %%ymm0, %%ymm4\n"
			"vfmadd231ps %%ymm0, %%ymm0, %%ymm5\n vfmadd231ps %%ymm0, %%ymm0, %%ymm6\n"
			"vfmadd231ps %%ymm0, %%ymm0, %%ymm7\n vfmadd231ps %%ymm0, %%ymm0, %%ymm8\n"
			"vfmadd231ps %%ymm0, %%ymm0, %%ymm9\n vfmadd231ps %%ymm0, %%ymm0, %%ymm10\n"
			"vfmadd231ps %%ymm0, %%ymm0, %%ymm11\n vfmadd231ps %%ymm0, %%ymm0, %%ymm12\n"
			"dec %0\n jnz 1b\n"
			: "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
			  "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "cc");
	return cpu_now() - t;
#else
	(void)n;
	(void)wide;
	return 0;
#endif
}

/* fp32 GFLOP/s of one core, best of 40 runs of a few ms (robust to a
 * shared machine) */
static double peak_gflops(int wide)
{
	long n = 2 * 1000 * 1000;
	double best = 1e30;
	for (int r = 0; r < 40; r++) {
		double t = fma_loop(n, wide);
		if (t > 0 && t < best)
			best = t;
	}
	return best < 1e30 ? n * 12.0 * (wide ? 16 : 8) * 2 / best / 1e9 : 0;
}

static float *randf(int64_t n)
{
	float *p = NULL;
	if (posix_memalign((void **)&p, 64, (size_t)n * sizeof *p) != 0)
		return NULL;
	for (int64_t i = 0; i < n; i++)
		p[i] = (float)((i * 2654435761u % 1000) / 500.0 - 1.0);
	return p;
}

/* A (M x K, rows contiguous) in J's panels: panel q of P rows at q*P*K,
 * element (i, k) at k*P + i % P, zero rows past M (cg_prepack's layout). */
static float *pack_a(const gemm_jit *J, const float *A, int64_t M, int64_t K)
{
	int64_t P = J->a_panel, np = (M + P - 1) / P;
	float *Ap = NULL;
	if (posix_memalign((void **)&Ap, 64, (size_t)(np * P * K) * sizeof *Ap) != 0)
		return NULL;
	memset(Ap, 0, (size_t)(np * P * K) * sizeof *Ap);
	for (int64_t i = 0; i < M; i++)
		for (int64_t k = 0; k < K; k++)
			Ap[(i / P) * P * K + k * P + i % P] = A[i * K + k];
	return Ap;
}

/* Best seconds of M x N x K (B stored [K,N], or [N,K] when bt) over runs
 * after a warm-up, at least 0.3 s in all: CPU time on one thread, wall
 * time with a pool. */
static double time_gemm(const gemm_jit *J, int64_t M, int64_t N, int64_t K, int bt,
                        rt_pool *pool)
{
	float *A = randf(M * K), *B = randf(K * N), *C = randf(M * N), *S = randf(J->scratch_floats);
	if (A && J->a_panel) { /* a family that takes A packed */
		float *Ap = pack_a(J, A, M, K);
		free(A);
		A = Ap;
	}
	double best = 1e30, total = 0;
	rt_exec x = {.pool = pool, .scratch = S};
	for (int r = 0; A && B && C && S && r < 10000 && (r < 5 || total < 0.3); r++) {
		double t = pool ? now() : cpu_now();
		J->fn(&x, M, N, K, 1, A, K, 1, B, bt ? 1 : N, bt ? K : 1, 0, C, N, NULL, 0, -INFINITY, INFINITY, NULL, 0);
		t = (pool ? now() : cpu_now()) - t;
		total += t;
		if (r > 0 && t < best) /* run 0 is the warm-up */
			best = t;
	}
	free(A);
	free(B);
	free(C);
	free(S);
	return best;
}

static void square_table(const gemm_jit *J, double peak, rt_pool *pool, int threads)
{
	printf("%6s  %12s  %8s", "n", "1 thread", "of peak");
	if (pool)
		printf("  %14s  %8s", "threads", "of peak");
	printf("\n");
	static const int64_t sizes[] = {256, 1024, 2048};
	for (int i = 0; i < 3; i++) {
		int64_t n = sizes[i];
		double flop = 2.0 * n * n * n;
		double g1 = flop / time_gemm(J, n, n, n, 0, NULL) / 1e9;
		printf("%6ld  %7.1f GF/s  %7.1f%%", (long)n, g1, 100 * g1 / peak);
		if (pool) {
			double gt = flop / time_gemm(J, n, n, n, 0, pool) / 1e9;
			printf("  %6.1f GF/s/%d  %7.1f%%", gt, threads, 100 * gt / (peak * threads));
		}
		printf("\n");
		fflush(stdout);
	}
}

/* Shapes the models have: MLP layers at batch 1 and 16 (weights [K,N] or
 * [N,K]), a conv as im2col GEMM, a transformer projection. */
static const struct shape { const char *what; int64_t M, N, K; int bt; } s[] = {
		{"MLP 784->128, batch 1, B [K,N]", 1, 128, 784, 0},
		{"MLP 784->128, batch 1, B [N,K]", 1, 128, 784, 1},
		{"MLP 128->10, batch 1", 1, 10, 128, 1},
		{"MLP 784->512, batch 1, B [K,N]", 1, 512, 784, 0},
		{"MLP 784->512, batch 1, B [N,K]", 1, 512, 784, 1},
		{"MLP 512->10, batch 1, B [K,N]", 1, 10, 512, 0},
		{"MLP 512->10, batch 1, B [N,K]", 1, 10, 512, 1},
		{"MLP 512->512, batch 1, B [K,N]", 1, 512, 512, 0},
		{"MLP 784->128, batch 16, B [N,K]", 16, 128, 784, 1},
		{"MLP 784->512, batch 16, B [K,N]", 16, 512, 784, 0},
		{"MLP 512->512, batch 16, B [K,N]", 16, 512, 512, 0},
		{"MLP 512->10, batch 16, B [K,N]", 16, 10, 512, 0},
		{"MLP 784->512, batch 32, B [K,N]", 32, 512, 784, 0},
		{"MLP 784->512, batch 48, B [K,N]", 48, 512, 784, 0},
		{"MLP 784->512, batch 64, B [K,N]", 64, 512, 784, 0},
		{"conv 3x3 8->16ch 14x14 (im2col)", 16, 196, 72, 0},
		{"conv 1x1 16->96ch 112x112", 96, 12544, 16, 0},
		{"conv 1x1 144->24ch 56x56", 24, 3136, 144, 0},
		{"conv 1x1 24->144ch 56x56", 144, 3136, 24, 0},
		{"conv 1x1 160->960ch 7x7", 960, 49, 160, 0},
		{"conv 1x1 960->320ch 7x7", 320, 49, 960, 0},
		{"conv 1x1 192->1152ch 7x7", 1152, 49, 192, 0},
		{"conv 1x1 1152->192ch 7x7", 192, 49, 1152, 0},
		{"conv 1x1 320->1280ch 7x7", 1280, 49, 320, 0},
		{"conv 1x1 672->672ch 7x7", 672, 49, 672, 0},
		{"conv 1x1 256->64ch 56x56", 64, 3136, 256, 0},
		{"conv 1x1 64->256ch 56x56", 256, 3136, 64, 0},
		{"conv 1x1 512->128ch 28x28", 128, 784, 512, 0},
		{"conv 1x1 128->512ch 28x28", 512, 784, 128, 0},
		{"conv 1x1 1024->256ch 14x14", 256, 196, 1024, 0},
		{"conv 1x1 256->1024ch 14x14", 1024, 196, 256, 0},
		{"conv 7x7/2 3->64ch 112x112 (im2col)", 64, 12544, 147, 0},
		{"conv 3x3 128ch 28x28 (im2col)", 128, 784, 1152, 0},
		{"conv 3x3 256ch 14x14 (im2col)", 256, 196, 2304, 0},
		{"conv 1x1 64->384ch 14x14", 384, 196, 64, 0},
		{"conv 3x3 512ch 7x7 (im2col)", 512, 49, 4608, 0},
		{"conv 3x3 64ch 56x56 (im2col)", 64, 3136, 576, 0},
		{"transformer 128x512x512", 128, 512, 512, 1},
		{"squeeze-excite FC 240->960 (N = 1)", 960, 1, 240, 0},
		{"squeeze-excite FC 960->240 (N = 1)", 240, 1, 960, 0},
};

static void shape_table(const gemm_jit *J, double peak, rt_pool *pool, int threads)
{
	printf("\n%-34s  %10s  %9s  %8s", "one thread", "us", "GFLOP/s", "of peak");
	if (pool)
		printf("  %8s  %8s", "us/pool", "speedup");
	printf("\n");
	for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
		double t = time_gemm(J, s[i].M, s[i].N, s[i].K, s[i].bt, NULL);
		double g = 2.0 * s[i].M * s[i].N * s[i].K / t / 1e9;
		printf("%-34s  %10.2f  %9.1f  %7.1f%%", s[i].what, t * 1e6, g, 100 * g / peak);
		if (pool) {
			double tp = time_gemm(J, s[i].M, s[i].N, s[i].K, s[i].bt, pool);
			printf("  %8.2f  %7.2fx", tp * 1e6, t / tp);
		}
		printf("\n");
		fflush(stdout);
	}
	(void)threads;
}

/* The convs' shapes (A: their weights, more than cg_prepack's 32 rows)
 * through kiln_sgemm_pa and kiln_sgemm_pm, one thread; "*" marks the one
 * cg_prepack gives the GEMM (cg_prepack_lanes_fit). */
static void packed_table(double peak)
{
	gemm_jit pa, pm;
	cg_panels pn = {0}; /* as the LLVM backend's gemm_panel fills them */
	cg_target t;
	kiln_error err;
	if (cg_target_init(&t, NULL, NULL, &err) == KILN_OK) {
		pn.a = cg_sgemm_a_panel(&t);
		pn.a_lanes = cg_sgemm_m_panel(&t, &pn.a_lanes_max_n, &pn.a_lanes_min_k);
		pn.c_block = pn.a_lanes ? cg_sgemm_c_block(&t, &pn.c_block_max_n) : 0;
		cg_target_free(&t);
	}
	if (gemm_jit_build_family(&pa, 0, (void *)rt_parallel_for, GEMM_JIT_PA) != 0) {
		printf("\nkiln_sgemm_pa: %s\n", pa.err);
		return;
	}
	bool have_pm = gemm_jit_build_family(&pm, 0, (void *)rt_parallel_for, GEMM_JIT_PM) == 0;
	printf("\nweights packed, one thread           pa GF/s   of peak   pm GF/s   of peak%s\n",
	       have_pm ? "" : "  (no kiln_sgemm_pm here)");
	for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
		if (strncmp(s[i].what, "conv", 4) || s[i].M <= 32)
			continue;
		bool picks = have_pm && cg_prepack_lanes_fit(&pn, s[i].M, s[i].N, s[i].K, false);
		double flop = 2.0 * s[i].M * s[i].N * s[i].K;
		double ga = flop / time_gemm(&pa, s[i].M, s[i].N, s[i].K, 0, NULL) / 1e9;
		printf("%-34s  %7.1f%s  %7.1f%%", s[i].what, ga, picks ? " " : "*", 100 * ga / peak);
		if (have_pm) {
			double gm = flop / time_gemm(&pm, s[i].M, s[i].N, s[i].K, 0, NULL) / 1e9;
			printf("  %7.1f%s  %7.1f%%", gm, picks ? "*" : " ", 100 * gm / peak);
		}
		printf("\n");
		fflush(stdout);
	}
	if (have_pm)
		gemm_jit_free(&pm);
	gemm_jit_free(&pa);
}

int main(int argc, char **argv)
{
	int threads = argc > 1 ? atoi(argv[1]) : 2;
	gemm_jit J;
	if (gemm_jit_build(&J, 0, (void *)rt_parallel_for) != 0) {
		fprintf(stderr, "gemm_bench: %s\n", J.err);
		return 1;
	}
	int wide = J.vec_bits >= 512;
	double peak = peak_gflops(wide);
	rt_pool *pool = NULL;
	if (threads > 1 && rt_pool_new(threads, J.scratch_floats, &pool) != KILN_OK)
		threads = 1;
	printf("fp32 peak, one core (%d-bit FMA loop): %.1f GFLOP/s\n\n", wide ? 512 : 256, peak);
	square_table(&J, peak, pool, threads);
	shape_table(&J, peak, pool, threads);
	packed_table(peak);
	rt_pool_free(pool);
	gemm_jit_free(&J);
	return 0;
}
