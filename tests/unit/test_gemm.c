/*
 * test_gemm.c: kiln_sgemm (codegen/llvm_gemm.c), JIT-compiled on its own
 * (bench/gemm_jit.h) and compared with a double-precision reference over
 * shapes that reach every path: the direct forms (M = 1, tiny, K = 0), the
 * packed micro-kernel with edge tiles, several K/M/N blocks, transposed
 * and strided operands, every epilogue, narrower vector widths, and the
 * threaded split (the real pool, and a fake one with three uneven chunks).
 * C is surrounded by sentinels (row padding and a guard after it) that must
 * survive, and holds NaN when beta == 0, which must not be read.  Then
 * kiln_sgemm_pm (A in panels, output rows in the lanes) the same way,
 * where the host has it.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "bench/gemm_jit.h"
#include "runtime/rt.h"

static gemm_jit J;

/* rt_parallel_for as the JIT sees it: the runtime's, or a fake that runs
 * three uneven chunks in turn, each with its own rt_exec copy and scratch. */
static int fake_split, par_calls;
static int64_t par_last_n; /* the units of the last split */
static float *fake_scratch[3];

static void par_for(rt_exec *x, int64_t n, rt_range_fn fn)
{
	par_calls++;
	par_last_n = n;
	if (!fake_split) {
		rt_parallel_for(x, n, fn);
		return;
	}
	for (int c = 0; c < 3; c++) {
		int64_t b = n * c / 3, e = n * (c + 1) / 3;
		rt_exec w = *x;
		w.pool = NULL;
		w.scratch = fake_scratch[c];
		w.thread = c;
		if (b < e)
			fn(&w, b, e);
	}
}

static float *scratch_new(void)
{
	void *p = NULL;
	ck_assert_int_eq(posix_memalign(&p, 64, J.scratch_floats * sizeof(float)), 0);
	return p;
}

static void build(int vec_bits)
{
	if (gemm_jit_build(&J, vec_bits, (void *)par_for) != 0)
		fprintf(stderr, "gemm_jit_build: %s\n", J.err);
	for (int c = 0; c < 3; c++)
		fake_scratch[c] = J.fn ? scratch_new() : NULL;
}

static void setup_host(void) { build(0); }
static void setup_pm(void)
{
	if (gemm_jit_build_family(&J, 0, (void *)par_for, GEMM_JIT_PM) != 0)
		fprintf(stderr, "gemm_jit_build_family: %s\n", J.err);
	for (int c = 0; c < 3; c++)
		fake_scratch[c] = J.fn ? scratch_new() : NULL;
}
/* kiln_sgemm for a core with 256 KiB of L2: the blocked path's groups
 * of column panels hold 32768 floats of B (one 64-column panel at K 512,
 * eight at K 64 with AVX-512) */
static void setup_small_l2(void)
{
	if (gemm_jit_build_target(&J, 0, 256 << 10, (void *)par_for, GEMM_JIT_SGEMM) != 0)
		fprintf(stderr, "gemm_jit_build_target: %s\n", J.err);
	for (int c = 0; c < 3; c++)
		fake_scratch[c] = J.fn ? scratch_new() : NULL;
}
static void setup_256(void) { build(256); }
static void setup_128(void) { build(128); }

static void teardown(void)
{
	for (int c = 0; c < 3; c++) {
		free(fake_scratch[c]);
		fake_scratch[c] = NULL;
	}
	gemm_jit_free(&J);
}

/* One product: sizes, layout (at/bt: stored transposed; as/bs: element
 * stride along the contiguous dimension) and epilogue. */
typedef struct prob {
	int64_t M, N, K;
	int at, bt, as, bs;
	float alpha, beta;
	int axis, act; /* act 0: none, 1: relu, 2: clip to [CLIP_LO, CLIP_HI] */
	int res;       /* add a residual matrix R (row stride N + 3) */
	int pm;        /* kiln_sgemm_pm: A passed in J.a_panel-row panels (at 0) */
} prob;

#define CLIP_LO -0.75f
#define CLIP_HI 1.5f

enum { CPAD = 7, GUARD = 64 };

static uint32_t seed = 12345;

static float rnd(void)
{
	seed = seed * 1664525u + 1013904223u;
	return (float)((seed >> 8) / 8388608.0 - 1.0);
}

static float *fill(int64_t n)
{
	float *p = malloc((size_t)(n + 1) * sizeof *p);
	for (int64_t i = 0; i <= n; i++)
		p[i] = rnd();
	return p;
}

typedef struct mats {
	float *A, *B, *C, *C0, *bias, *R;
	int64_t a_rs, a_cs, b_rs, b_cs, c_rs, csize, r_rs;
} mats;

static void mats_new(const prob *p, mats *o)
{
	int64_t as = p->as ? p->as : 1, bs = p->bs ? p->bs : 1;
	o->a_cs = p->at ? p->M * as + 3 : as;
	o->a_rs = p->at ? as : p->K * as + 3;
	o->b_cs = p->bt ? p->K * bs + 5 : bs;
	o->b_rs = p->bt ? bs : p->N * bs + 5;
	o->c_rs = p->N + CPAD;
	o->A = fill((p->M + 1) * (p->K + 1) * (as + 3) + 8);
	o->B = fill((p->K + 1) * (p->N + 1) * (bs + 5) + 8);
	o->bias = fill(p->M + p->N);
	o->r_rs = p->N + 3;
	o->R = p->res ? fill(p->M * o->r_rs) : NULL;
	o->csize = p->M * o->c_rs + GUARD;
	o->C = fill(o->csize);
	for (int64_t i = 0; p->beta == 0 && i < o->csize; i++)
		o->C[i] = NAN; /* must not be read */
	o->C0 = malloc((size_t)o->csize * sizeof *o->C0);
	memcpy(o->C0, o->C, (size_t)o->csize * sizeof *o->C0);
}

static void mats_free(mats *o)
{
	free(o->A);
	free(o->B);
	free(o->C);
	free(o->C0);
	free(o->bias);
	free(o->R);
}

static double reference(const prob *p, const mats *o, int64_t m, int64_t n)
{
	double s = 0;
	for (int64_t k = 0; k < p->K; k++)
		s += (double)o->A[m * o->a_rs + k * o->a_cs] * o->B[k * o->b_rs + n * o->b_cs];
	s *= p->alpha;
	if (p->beta != 0)
		s += (double)p->beta * o->C0[m * o->c_rs + n];
	s += p->axis == 1 ? o->bias[n] : p->axis == 2 ? o->bias[m] : 0;
	s += o->R ? o->R[m * o->r_rs + n] : 0;
	if (p->act == 2)
		return s < CLIP_LO ? CLIP_LO : s > CLIP_HI ? CLIP_HI : s;
	return p->act && s < 0 ? 0 : s;
}

/* Runs p (with pool, or none) and checks every element and sentinel. */
static void check_prob(const prob *p, rt_pool *pool)
{
	ck_assert_msg(J.fn != NULL, "JIT failed: %s", J.err);
	mats o;
	mats_new(p, &o);
	rt_exec x = {.scratch = scratch_new(), .pool = pool};
	const float *A = o.A;
	float *Ap = NULL;
	if (p->pm) { /* panel q of P rows at q*P*K, element (i, k) at k*P + i % P, zero rows */
		int64_t P = J.a_panel, np = (p->M + P - 1) / P;
		Ap = calloc((size_t)(np * P * p->K + 1), sizeof *Ap);
		for (int64_t i = 0; i < p->M; i++)
			for (int64_t k = 0; k < p->K; k++)
				Ap[(i / P) * P * p->K + k * P + i % P] = o.A[i * o.a_rs + k * o.a_cs];
		A = Ap;
	}
	J.fn(&x, p->M, p->N, p->K, p->alpha, A, o.a_rs, o.a_cs, o.B, o.b_rs, o.b_cs, p->beta,
	     o.C, o.c_rs, p->axis ? o.bias : NULL, p->axis,
	     p->act == 2 ? CLIP_LO : p->act ? 0 : -INFINITY, p->act == 2 ? CLIP_HI : INFINITY,
	     o.R, o.R ? o.r_rs : 0);
	double tol = 1e-5 * (p->K > 1 ? p->K : 1);
	for (int64_t m = 0; m < p->M; m++) {
		for (int64_t n = 0; n < o.c_rs; n++) {
			float got = o.C[m * o.c_rs + n];
			if (n >= p->N) {
				ck_assert_msg(memcmp(&got, &o.C0[m * o.c_rs + n], 4) == 0,
				              "%ldx%ldx%ld: padding C[%ld,%ld] written", (long)p->M,
				              (long)p->N, (long)p->K, (long)m, (long)n);
				continue;
			}
			double want = reference(p, &o, m, n);
			ck_assert_msg(fabs(got - want) <= tol * fmax(1, fabs(want)),
			              "%ldx%ldx%ld at=%d bt=%d: C[%ld,%ld] = %g, want %g", (long)p->M,
			              (long)p->N, (long)p->K, p->at, p->bt, (long)m, (long)n, got, want);
		}
	}
	int64_t end = p->M * o.c_rs;
	ck_assert_msg(memcmp(o.C + end, o.C0 + end, GUARD * sizeof(float)) == 0,
	              "%ldx%ldx%ld: wrote past C", (long)p->M, (long)p->N, (long)p->K);
	free(Ap);
	free(x.scratch);
	mats_free(&o);
}

/* p in all four transpose layouts */
static void check_layouts_on(prob p, rt_pool *pool)
{
	for (int l = 0; l < 4; l++) {
		p.at = l & 1;
		p.bt = l >> 1;
		check_prob(&p, pool);
	}
}

static void check_layouts(prob p)
{
	check_layouts_on(p, NULL);
}

#define PROB(m, n, k) ((prob){.M = (m), .N = (n), .K = (k), .alpha = 1})

static void check_epilogues(int64_t M, int64_t N, int64_t K);

/* ---- direct paths ---- */

START_TEST(gemm_1x1x1)
{
	check_layouts(PROB(1, 1, 1));
}
END_TEST

START_TEST(gemm_m1_is_a_matrix_vector_product)
{
	check_layouts(PROB(1, 128, 784));
	check_layouts(PROB(1, 10, 128));
	check_layouts(PROB(1, 1000, 3));
}
END_TEST

/* The axpy form's strips: 16 vectors, then 4, then single vectors with a
 * masked last one (N = 341 at 16 lanes: one 256-wide strip, one 64-wide,
 * one vector and 5 columns), K odd, with every epilogue. */
START_TEST(gemm_axpy_strips_and_masked_tail)
{
	check_layouts(PROB(1, 341, 515));
	check_layouts(PROB(2, 600, 7));
	check_layouts(PROB(1, 512, 784));
	check_epilogues(1, 341, 31);
	prob p = PROB(1, 300, 40);
	p.res = 1;
	p.axis = 1;
	p.act = 1;
	check_layouts(p);
}
END_TEST

START_TEST(gemm_thin_m_up_to_4)
{
	check_layouts(PROB(3, 70, 33));
	check_layouts(PROB(4, 33, 257));
}
END_TEST

START_TEST(gemm_n1_and_k1)
{
	check_layouts(PROB(7, 1, 5));
	check_layouts(PROB(5, 9, 1));
	check_layouts(PROB(20, 1, 300));
}
END_TEST

START_TEST(gemm_k0_is_beta_c_plus_bias)
{
	prob p = PROB(3, 5, 0);
	p.beta = 0.5f;
	p.axis = 1;
	check_layouts(p);
	p.beta = 0;
	p.axis = 2;
	p.act = 1;
	check_layouts(p);
}
END_TEST

START_TEST(gemm_m0_or_n0_touches_nothing)
{
	check_layouts(PROB(0, 5, 4));
	check_layouts(PROB(5, 0, 4));
}
END_TEST

/* ---- packed path ---- */

START_TEST(gemm_primes_13x37x61)
{
	check_layouts(PROB(13, 37, 61));
}
END_TEST

START_TEST(gemm_100_cubed)
{
	check_layouts(PROB(100, 100, 100));
}
END_TEST

START_TEST(gemm_several_k_blocks)
{
	check_layouts(PROB(30, 50, 600));
}
END_TEST

START_TEST(gemm_several_m_and_n_blocks)
{
	prob p = PROB(400, 1100, 20);
	check_prob(&p, NULL);
	p.bt = 1;
	check_prob(&p, NULL);
}
END_TEST

/* The blocked path walks its tiles in groups of column panels (as many
 * as fit in half the L2), each group row tile by row tile: several
 * groups per block of columns and a narrower last one (900 columns: 14
 * panels and 4 columns at 16 lanes), K blocks of different group widths,
 * rows not a multiple of the tile's, the epilogue with a residual only at
 * the last K block.  Run on the host's L2 and on a small one. */
START_TEST(gemm_packed_column_groups)
{
	check_layouts(PROB(100, 900, 600));
	prob p = PROB(45, 1100, 70);
	p.res = 1;
	p.axis = 2;
	p.act = 1;
	p.beta = 0.5f;
	check_layouts(p);
	p = PROB(70, 300, 1100);
	p.res = 1;
	check_layouts(p);
}
END_TEST

START_TEST(gemm_strided_operands)
{
	prob p = PROB(29, 45, 70);
	p.as = 2;
	p.bs = 3;
	check_layouts(p);
	p = PROB(2, 45, 70); /* thin M, strided B: the scalar or packed path */
	p.as = 3;
	p.bs = 2;
	check_layouts(p);
}
END_TEST

/* B rows contiguous (bt = 0) take the unpacked tiles for up to 32 rows
 * (64 when N <= 1024): edge tiles in both directions, strided and
 * transposed A. */
START_TEST(gemm_tiles_edges_and_strides)
{
	check_layouts(PROB(5, 63, 9));
	check_layouts(PROB(7, 130, 1));
	check_layouts(PROB(61, 300, 50));
	prob p = PROB(32, 65, 77);
	p.as = 2;
	p.bs = 1;
	check_layouts(p);
}
END_TEST

/* C at most one vector wide (a classifier's 10 outputs at batch 16) takes
 * 8-row one-vector tiles; rows not a multiple of 8, N not of the lanes. */
START_TEST(gemm_tiles_one_vector_wide)
{
	check_layouts(PROB(16, 10, 512));
	check_layouts(PROB(13, 16, 40));
	check_layouts(PROB(70, 7, 20));
	check_epilogues(11, 5, 33);
	prob p = PROB(16, 10, 100);
	p.res = 1;
	p.beta = 0.5f;
	check_layouts(p);
}
END_TEST

/* Up to 32 rows whose small-M tiles (8 x 3 vectors with AVX-512) cover
 * less of C than MR x NR ones take those: 16 x 512 (ten 48-column panels
 * and a 32-column one), 8 x 130, 20 x 77, 24 x 70; 24 x 64 and 16 x 49
 * keep MR x NR. */
START_TEST(gemm_tiles_small_m)
{
	check_layouts(PROB(16, 512, 100));
	check_layouts(PROB(8, 130, 50));
	check_layouts(PROB(20, 77, 64));
	check_layouts(PROB(24, 70, 9));
	check_layouts(PROB(24, 64, 20));
	check_layouts(PROB(16, 49, 30));
	check_epilogues(16, 70, 30);
	prob p = PROB(16, 200, 60);
	p.res = 1;
	p.axis = 2;
	p.act = 2;
	check_layouts(p);
}
END_TEST

/* Many rows but at most two column panels (a 7x7 conv): tiles too, the
 * set that prefetches A; up to 64 rows with C wider than that (an MLP at
 * batch 48), or wider than 1024 columns with K of 256 or more (a 1x1 conv
 * to 64 channels at 56x56), the MR x NR tiles that do not, and 128
 * columns is the last width with the prefetch (two 64-column tiles with
 * AVX-512). */
START_TEST(gemm_tiles_for_few_columns)
{
	check_layouts(PROB(200, 49, 700));
	check_layouts(PROB(48, 512, 97));
	check_layouts(PROB(61, 1100, 260));
	check_layouts(PROB(57, 128, 40));
	check_layouts(PROB(57, 129, 40));
}
END_TEST

/* The direct tiles on C n[i] columns wide: all layouts, every epilogue
 * (depth K, then kres with a residual, alpha and beta not 1 and 0), rows
 * not a multiple of the tile's. */
static void check_tile_widths(const int64_t *n, size_t nn, int64_t K, int64_t kres)
{
	for (size_t i = 0; i < nn; i++) {
		check_layouts(PROB(37, n[i], K));
		check_epilogues(41, n[i], K / 4 + 1);
		prob p = PROB(43, n[i], kres);
		p.res = 1;
		p.axis = 2;
		p.act = 2;
		p.alpha = 0.5f;
		p.beta = 0.25f;
		check_layouts(p);
	}
}

/* A direct tile whose last vector would hold one or two columns runs
 * them along the rows (llvm_gemm.c, emit_ukr's tail): with 16 lanes 49 and
 * 50 columns (a 7x7 map) and 113 (a full panel, then 49), with 8 lanes 25
 * (16 + 9); rows not a multiple of the tile's, every epilogue, a residual,
 * and alpha and beta not 1 and 0. */
START_TEST(gemm_tiles_tail_columns)
{
	static const int64_t n[] = {49, 50, 113, 25, 9, 10};
	check_tile_widths(n, sizeof n / sizeof *n, 300, 90);
}
END_TEST

/* Many rows and many columns: B contiguous is still packed. */
START_TEST(gemm_packed_for_many_rows_and_columns)
{
	prob p = PROB(150, 300, 1000);
	check_prob(&p, NULL);
	p.at = 1;
	p.beta = 0.5f;
	p.axis = 1;
	p.act = 1;
	check_prob(&p, NULL);
	p.act = 2; /* clip at the last of two K blocks only */
	check_prob(&p, NULL);
}
END_TEST

/* A direct tiles' last panel of at most NV - 1 vectors runs apart, one
 * vector at a time (llvm_gemm.c, emit_tiles' rest): with 16 lanes 196
 * columns (three panels and 4), 169 (41: three vectors, the last part
 * masked), 100 (a panel or two wide: the tiles that prefetch A) and 70
 * (6); rows not a multiple of the tile's, every epilogue, a residual. */
START_TEST(gemm_tiles_rest_one_vector_at_a_time)
{
	static const int64_t n[] = {196, 169, 100, 70};
	check_tile_widths(n, sizeof n / sizeof *n, 60, 45);
}
END_TEST

/* The packed path's last column panel runs the micro-kernel of the fewest
 * vectors that hold it: every width of it, with the plain epilogue (beta
 * 0, bias per row, clip) and the full one (beta, bias per column). */
START_TEST(gemm_packed_last_panel_each_width)
{
	static const int64_t n[] = {69, 84, 104, 124, 180};
	for (size_t i = 0; i < sizeof n / sizeof *n; i++) {
		prob p = PROB(100, n[i], 200);
		check_layouts(p);
		p.axis = 2;
		p.act = 2;
		check_layouts(p);
		p.beta = 0.5f;
		p.axis = 1;
		p.act = 1;
		check_layouts(p);
	}
}
END_TEST

/* ---- epilogue ---- */

static void check_epilogues(int64_t M, int64_t N, int64_t K)
{
	static const struct { float alpha, beta; int axis, act; } e[] = {
		{0.5f, 0, 1, 1}, {1, 0.75f, 2, 0}, {1, 1, 0, 0}, {-2, 0, 2, 1}, {1, -1, 1, 0},
		{1, 0.5f, 1, 2}, {-1, 0, 2, 2}, {1, 0, 0, 2},
	};
	for (size_t i = 0; i < sizeof e / sizeof *e; i++) {
		prob p = PROB(M, N, K);
		p.alpha = e[i].alpha;
		p.beta = e[i].beta;
		p.axis = e[i].axis;
		p.act = e[i].act;
		check_layouts(p);
	}
}

START_TEST(gemm_epilogue_direct)
{
	check_epilogues(1, 75, 40);
	check_epilogues(3, 4, 5);
}
END_TEST

START_TEST(gemm_epilogue_packed)
{
	check_epilogues(33, 70, 300);
	check_epilogues(70, 140, 300); /* packed for bt = 0 too; last panel narrow */
}
END_TEST

START_TEST(gemm_epilogue_tiles)
{
	check_epilogues(9, 70, 30);
}
END_TEST

/* ---- narrower vectors (AVX2, SSE geometries) ---- */

START_TEST(gemm_narrow_vectors)
{
	ck_assert_msg(J.fn != NULL, "JIT failed: %s", J.err);
	check_layouts(PROB(1, 50, 33));
	check_layouts(PROB(37, 41, 290));
	check_layouts(PROB(16, 40, 20)); /* small-M tiles (4 x NV below AVX-512) */
	check_layouts(PROB(16, 5, 30));  /* one-vector tiles */
	check_layouts(PROB(37, 196, 60)); /* a last panel's rest, one vector at a time */
	check_epilogues(19, 23, 17);
}
END_TEST

/* ---- threads ---- */

START_TEST(gemm_threads_split_columns)
{
	rt_pool *pool = NULL;
	ck_assert_int_eq(rt_pool_new(2, J.scratch_floats, &pool), KILN_OK);
	prob p = PROB(256, 256, 256);
	p.beta = 0.5f;
	p.axis = 1;
	p.act = 1;
	par_calls = 0;
	fake_split = 0;
	check_prob(&p, pool);
	ck_assert_int_eq(par_calls, 1);
	p = PROB(150, 300, 200); /* panels not a multiple of threads, edge tile */
	p.bt = 1;
	p.axis = 2;
	check_prob(&p, pool);
	ck_assert_int_eq(par_calls, 2);
	rt_pool_free(pool);
}
END_TEST

START_TEST(gemm_threads_uneven_chunks_own_scratch)
{
	fake_split = 1;
	par_calls = 0;
	prob p = PROB(130, 200, 150);
	p.beta = 0.25f;
	p.axis = 2;
	check_layouts_on(p, (rt_pool *)&p); /* never dereferenced by the fake */
	ck_assert_int_eq(par_calls, 4);
	fake_split = 0;
}
END_TEST

START_TEST(gemm_threads_not_for_small_or_without_pool)
{
	fake_split = 1;
	par_calls = 0;
	prob p = PROB(20, 20, 20);
	check_prob(&p, (rt_pool *)&p); /* never dereferenced: too small */
	p = PROB(256, 256, 256);
	check_prob(&p, NULL);
	ck_assert_int_eq(par_calls, 0);
	fake_split = 0;
}
END_TEST

/* Batch-1 products with a pool split their columns in whole vectors: the
 * real pool on the MLP's 784->512 layer (axpy, B [K,N]) and its transposed
 * weights (dot, B [N,K]), with a bias, relu and a residual that must follow
 * each thread's columns. */
START_TEST(gemm_threads_split_batch1_columns)
{
	rt_pool *pool = NULL;
	ck_assert_int_eq(rt_pool_new(2, J.scratch_floats, &pool), KILN_OK);
	fake_split = 0;
	par_calls = 0;
	prob p = PROB(1, 512, 784);
	p.axis = 1;
	p.act = 1;
	p.res = 1;
	check_prob(&p, pool);
	ck_assert_int_eq(par_calls, 1);
	p.bt = 1;
	check_prob(&p, pool);
	ck_assert_int_eq(par_calls, 2);
	p = PROB(3, 1000, 100); /* thin M, N not a multiple of the lanes */
	p.beta = 0.5f;
	p.axis = 2;
	check_prob(&p, pool);
	ck_assert_int_eq(par_calls, 3);
	rt_pool_free(pool);
}
END_TEST

/* Three uneven chunks (fake pool): every chunk's columns land where they
 * belong, per-column bias and residual shifted with them. */
START_TEST(gemm_threads_batch1_uneven_chunks)
{
	fake_split = 1;
	par_calls = 0;
	prob p = PROB(1, 333, 300);
	p.axis = 1;
	p.res = 1;
	p.beta = 0.25f;
	p.act = 2;
	check_prob(&p, (rt_pool *)&p); /* axpy */
	p.bt = 1;
	check_prob(&p, (rt_pool *)&p); /* dot */
	ck_assert_int_eq(par_calls, 2);
	/* below 2^16 multiply-adds, or under two vectors of columns: inline */
	p = PROB(1, 128, 500);
	check_prob(&p, (rt_pool *)&p);
	p = PROB(1, 10, 8000);
	check_prob(&p, (rt_pool *)&p);
	ck_assert_int_eq(par_calls, 2);
	fake_split = 0;
}
END_TEST

/* C one column wide with A's rows and B's column contiguous (a squeeze-
 * excite FC): the dot form, its rows split over three uneven chunks (fake
 * pool) with the per-row bias, residual and clamp following them; other
 * layouts take the tiles (unsplit at this size); too little work stays
 * inline. */
START_TEST(gemm_threads_split_gemv_rows)
{
	fake_split = 1;
	par_calls = 0;
	prob p = PROB(960, 1, 240);
	p.axis = 2;
	p.res = 1;
	p.act = 2;
	check_layouts_on(p, (rt_pool *)&p);
	ck_assert_int_eq(par_calls, 1); /* the layout with A's rows and B's column contiguous */
	p = PROB(70, 1, 1000); /* row blocks not a multiple of three */
	p.bt = 1;
	p.beta = 0.5f;
	p.axis = 2;
	check_prob(&p, (rt_pool *)&p);
	ck_assert_int_eq(par_calls, 2);
	p = PROB(20, 1, 100); /* 2000 multiply-adds: inline */
	p.bt = 1;
	check_prob(&p, (rt_pool *)&p);
	ck_assert_int_eq(par_calls, 2);
	fake_split = 0;
}
END_TEST

/* The MLP's batch-16 layers (small-M tiles) and its 10-wide classifier at
 * 64 rows (one-vector tiles, split by rows) go over the pool too. */
START_TEST(gemm_threads_split_small_m_tiles)
{
	fake_split = 1;
	par_calls = 0;
	prob p = PROB(16, 512, 784);
	p.axis = 1;
	p.act = 1;
	check_prob(&p, (rt_pool *)&p);
	ck_assert_int_eq(par_calls, 1);
	p = PROB(16, 200, 700); /* panels not a multiple of three */
	p.res = 1;
	check_prob(&p, (rt_pool *)&p);
	ck_assert_int_eq(par_calls, 2);
	p = PROB(300, 10, 800);
	p.axis = 2;
	check_prob(&p, (rt_pool *)&p);
	ck_assert_int_eq(par_calls, 3);
	fake_split = 0;
}
END_TEST

/* ---- module ---- */

START_TEST(gemm_scratch_holds_both_packed_blocks)
{
	cg_target t = {.vec_bits = 512};
	uint64_t s512 = cg_sgemm_scratch_floats(&t);
	t.vec_bits = 256;
	uint64_t s256 = cg_sgemm_scratch_floats(&t);
	/* KC x NC of B plus MC x KC of A: megabytes, allocated once per
	 * thread; more than 4 Mi floats would be a tuning slip */
	ck_assert_uint_ge(s512, 512 * 1024 + 6 * 512);
	ck_assert_uint_lt(s512, 4 * 1024 * 1024);
	ck_assert_uint_ge(s256, 512 * 1024);
	ck_assert_uint_eq(s512 % 16, 0);
}
END_TEST

/* ---- kiln_sgemm_pm ---- */

/* false (and says so) where the host has no kiln_sgemm_pm: the test is
 * skipped, not passed silently */
static bool have_pm(void)
{
	if (!J.fn && J.a_panel == 0)
		printf("skipped: %s\n", J.err);
	return J.fn != NULL;
}

#define PMPROB(m, n, k) ((prob){.M = (m), .N = (n), .K = (k), .alpha = 1, .pm = 1})

/* Every width of the last strip (N mod 12: the 8, 4, 2 and 1 column
 * kernels), rows that fill a panel or not, K of one, two and three blocks. */
START_TEST(gemm_pm_widths_rows_and_k_blocks)
{
	if (!have_pm())
		return;
	static const int64_t M[] = {32, 45, 64, 97}, K[] = {1, 7, 112, 513, 1100};
	for (int64_t n = 1; n <= 25; n++)
		check_prob(&PMPROB(45, n, 113), NULL);
	for (size_t i = 0; i < sizeof M / sizeof *M; i++)
		for (size_t k = 0; k < sizeof K / sizeof *K; k++) {
			check_prob(&PMPROB(M[i], 49, K[k]), NULL);
			check_prob(&PMPROB(M[i], 196, K[k]), NULL);
		}
}
END_TEST

/* beta, bias per row and per column, residual, relu and clip, alpha: the
 * epilogue runs on the transposed sums, its C accumulated across K's
 * blocks and the activation only at the last */
START_TEST(gemm_pm_epilogues)
{
	if (!have_pm())
		return;
	for (int axis = 0; axis <= 2; axis++)
		for (int act = 0; act <= 2; act++)
			for (int res = 0; res <= 1; res++)
				for (int b = 0; b <= 1; b++) {
					prob p = PMPROB(70, 37, 600);
					p.axis = axis, p.act = act, p.res = res;
					p.beta = b ? 0.5f : 0;
					p.alpha = b ? 0.75f : 1;
					check_prob(&p, NULL);
				}
}
END_TEST

/* over the pool: by panels of rows (C a few strips wide, or A too big
 * for the cache), by ranges of
 * strips (wider: each range packs its columns of B, in blocks of 192
 * columns when it has more), and three uneven chunks with their own
 * scratch */
START_TEST(gemm_pm_threads)
{
	if (!have_pm())
		return;
	rt_pool *pool = NULL;
	ck_assert_int_eq(rt_pool_new(2, J.scratch_floats, &pool), KILN_OK);
	prob rows = PMPROB(200, 49, 700), cols = PMPROB(64, 150, 900), wide = PMPROB(40, 700, 300);
	rows.axis = 2, rows.act = 1, rows.res = 1;
	cols.axis = 1, cols.beta = 0.25f;
	wide.axis = 2, wide.res = 1, wide.act = 2;
	check_prob(&rows, pool);
	check_prob(&cols, pool);
	check_prob(&wide, pool);
	fake_split = 1;
	par_calls = 0;
	check_prob(&rows, pool);
	check_prob(&cols, pool);
	check_prob(&wide, pool);
	ck_assert_int_eq(par_calls, 3);
	/* C wide, but A (640 x 512: past half of any L2 the JIT assumes) tall:
	 * by its 20 panels of rows, where cols (A small) took 13 strips */
	check_prob(&cols, pool);
	ck_assert_int_eq(par_last_n, (150 + 11) / 12);
	prob tall = PMPROB(640, 120, 512);
	tall.axis = 2, tall.act = 1;
	check_prob(&tall, pool);
	ck_assert_int_eq(par_last_n, 640 / J.a_panel);
	fake_split = 0;
	rt_pool_free(pool);
}
END_TEST

/* B, C or both in blocks of a vector's rows (cg_gemm.b_block, c_block:
 * element (k, n) of B at (k / W) * W * N + n * W + k % W, C alike), the
 * layout a depthwise conv and the 1x1 convs beside it share: every
 * element against the reference, C's blocks accumulated across K's blocks
 * (K = 608: 512 + 96) and with beta, a last panel of one vector (M = 80),
 * bias per row and per column, over the pool by rows (N = 49) and by
 * column ranges (N = 196; B in blocks read in place, plain B packed),
 * also in three uneven ranges (the fake pool). */
static void check_blocked(int64_t M, int64_t N, int64_t K, bool bb, bool cb, float beta, int axis,
                          rt_pool *pool)
{
	int64_t W = J.a_panel / 2, P = J.a_panel, np = (M + P - 1) / P;
	float *A = fill(M * K), *B = fill(K * N), *C = fill(M * N), *bias = fill(M + N);
	float *Ap = calloc((size_t)(np * P * K + 1), sizeof *Ap);
	float *Bs = malloc((size_t)(K * N + 1) * sizeof *Bs), *Cs = malloc((size_t)(M * N + 1) * sizeof *Cs);
	for (int64_t i = 0; i < M; i++)
		for (int64_t k = 0; k < K; k++)
			Ap[(i / P) * P * K + k * P + i % P] = A[i * K + k];
	for (int64_t k = 0; k < K; k++)
		for (int64_t n = 0; n < N; n++)
			Bs[bb ? (k / W) * W * N + n * W + k % W : k * N + n] = B[k * N + n];
	for (int64_t m = 0; m < M; m++)
		for (int64_t n = 0; n < N; n++)
			Cs[cb ? (m / W) * W * N + n * W + m % W : m * N + n] = beta != 0 ? C[m * N + n] : NAN;
	rt_exec x = {.scratch = scratch_new(), .pool = pool};
	int mode = axis | (bb ? CG_SGEMM_B_BLOCKED : 0) | (cb ? CG_SGEMM_C_BLOCKED : 0);
	J.fn(&x, M, N, K, 1, Ap, K, 1, Bs, N, 1, beta, Cs, N, axis ? bias : NULL, mode, 0, INFINITY,
	     NULL, 0);
	for (int64_t m = 0; m < M; m++)
		for (int64_t n = 0; n < N; n++) {
			double s = 0;
			for (int64_t k = 0; k < K; k++)
				s += (double)A[m * K + k] * B[k * N + n];
			s += beta * (double)C[m * N + n] + (axis == 1 ? bias[n] : axis == 2 ? bias[m] : 0);
			s = s < 0 ? 0 : s;
			float got = Cs[cb ? (m / W) * W * N + n * W + m % W : m * N + n];
			ck_assert_msg(fabs(got - s) <= 1e-5 * K * (1 + fabs(s)),
			              "%ldx%ldx%ld B%s C%s: C[%ld,%ld] = %g, want %g", (long)M, (long)N,
			              (long)K, bb ? " blocked" : "", cb ? " blocked" : "", (long)m, (long)n,
			              got, s);
		}
	free(A), free(B), free(C), free(bias), free(Ap), free(Bs), free(Cs), free(x.scratch);
}

START_TEST(gemm_pm_channel_blocks)
{
	if (!have_pm())
		return;
	rt_pool *pool = NULL;
	ck_assert_int_eq(rt_pool_new(2, J.scratch_floats, &pool), KILN_OK);
	for (int t = 0; t < 2; t++)
		for (int mode = 1; mode <= 3; mode++) {
			bool bb = mode & 1, cb = mode & 2;
			check_blocked(80, 49, 608, bb, cb, 0, 2, t ? pool : NULL);
			check_blocked(64, 196, 48, bb, cb, 0.5f, 2, t ? pool : NULL);
			check_blocked(96, 37, 32, bb, cb, 0, 1, t ? pool : NULL);
			check_blocked(48, 100, 640, bb, cb, 0, 0, t ? pool : NULL);
			/* past 1024 columns: in blocks of them, plain B packed */
			check_blocked(48, 1100, 32, bb, cb, 0, 2, t ? pool : NULL);
			check_blocked(32, 1300, 48, bb, cb, 0.5f, 1, t ? pool : NULL);
		}
	fake_split = 1;
	par_calls = 0;
	for (int mode = 1; mode <= 3; mode++)
		check_blocked(64, 196, 48, mode & 1, mode & 2, 0.5f, 2, (rt_pool *)&pool);
	ck_assert_int_eq(par_calls, 3);
	fake_split = 0;
	rt_pool_free(pool);
}
END_TEST

/* A TCase whose tests share one JIT of kiln_sgemm at vec_bits (0: host). */
static TCase *jit_case(Suite *s, const char *name, void (*setup)(void))
{
	TCase *tc = tcase_create(name);
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	return tc;
}

static Suite *gemm_suite(void)
{
	Suite *s = suite_create("gemm");
	TCase *tc = jit_case(s, "direct", setup_host);
	tcase_add_test(tc, gemm_1x1x1);
	tcase_add_test(tc, gemm_m1_is_a_matrix_vector_product);
	tcase_add_test(tc, gemm_thin_m_up_to_4);
	tcase_add_test(tc, gemm_axpy_strips_and_masked_tail);
	tcase_add_test(tc, gemm_n1_and_k1);
	tcase_add_test(tc, gemm_k0_is_beta_c_plus_bias);
	tcase_add_test(tc, gemm_m0_or_n0_touches_nothing);
	tc = jit_case(s, "packed", setup_host);
	tcase_add_test(tc, gemm_primes_13x37x61);
	tcase_add_test(tc, gemm_100_cubed);
	tcase_add_test(tc, gemm_several_k_blocks);
	tcase_add_test(tc, gemm_several_m_and_n_blocks);
	tcase_add_test(tc, gemm_strided_operands);
	tcase_add_test(tc, gemm_packed_for_many_rows_and_columns);
	tcase_add_test(tc, gemm_tiles_rest_one_vector_at_a_time);
	tcase_add_test(tc, gemm_packed_last_panel_each_width);
	tcase_add_test(tc, gemm_packed_column_groups);
	tcase_add_test(jit_case(s, "small-l2", setup_small_l2), gemm_packed_column_groups);
	tc = jit_case(s, "tiles", setup_host);
	tcase_add_test(tc, gemm_tiles_edges_and_strides);
	tcase_add_test(tc, gemm_tiles_for_few_columns);
	tcase_add_test(tc, gemm_tiles_tail_columns);
	tcase_add_test(tc, gemm_tiles_one_vector_wide);
	tcase_add_test(tc, gemm_tiles_small_m);
	tc = jit_case(s, "epilogue", setup_host);
	tcase_add_test(tc, gemm_epilogue_direct);
	tcase_add_test(tc, gemm_epilogue_packed);
	tcase_add_test(tc, gemm_epilogue_tiles);
	tc = jit_case(s, "threads", setup_host);
	tcase_add_test(tc, gemm_threads_split_columns);
	tcase_add_test(tc, gemm_threads_uneven_chunks_own_scratch);
	tcase_add_test(tc, gemm_threads_not_for_small_or_without_pool);
	tcase_add_test(tc, gemm_threads_split_batch1_columns);
	tcase_add_test(tc, gemm_threads_batch1_uneven_chunks);
	tcase_add_test(tc, gemm_threads_split_small_m_tiles);
	tcase_add_test(tc, gemm_threads_split_gemv_rows);
	tcase_add_test(jit_case(s, "avx2", setup_256), gemm_narrow_vectors);
	tcase_add_test(jit_case(s, "sse", setup_128), gemm_narrow_vectors);
	tc = tcase_create("scratch");
	tcase_add_test(tc, gemm_scratch_holds_both_packed_blocks);
	suite_add_tcase(s, tc);
	tc = jit_case(s, "pm", setup_pm);
	tcase_add_test(tc, gemm_pm_widths_rows_and_k_blocks);
	tcase_add_test(tc, gemm_pm_epilogues);
	tcase_add_test(tc, gemm_pm_threads);
	tcase_add_test(tc, gemm_pm_channel_blocks);
	return s;
}

#include "check_main.h"
KILN_CHECK_MAIN(gemm_suite)
