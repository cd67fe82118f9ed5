/*
 * test_prepack.c: constant B operands packed at compile time
 * (codegen/prepack.c, kiln_sgemm_pb in codegen/llvm_gemm.c).
 *
 * A graph of Linear layers over a symbolic batch N (GEMMs 32, 48, 100, 200
 * and 513 columns wide, so whole and partial panels, a transposed weight,
 * a residual Add, K of 32, 37 and 513: more than one K block) is compiled
 * with packing (the default) and without (KILN_PREPACK=0).  The packed
 * library's kernel IR must read packed B (b_panel=) in all seven GEMMs, in
 * panels of an odd number of rows (an even K gets a zero row), and the
 * other in none; at batches 1 to 100 (kiln_sgemm_pb's axpy form, its
 * direct tiles and its blocked path), on one thread and two, both must
 * give the same bits (each element is summed over k in the same order
 * either way), and x W_c must match a double-precision product within
 * 1e-4.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "codegen/codegen.h"
#include "codegen/llvm.h"
#include "kiln/kiln.h"
#include "tmpdir.h"

enum { K0 = 37, NOUT = 7 };

static kiln_tensor *weights(const char *name, int64_t r, int64_t c, double s)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 2, (int64_t[]){r, c});
	ck_assert_ptr_nonnull(t);
	float *p = t->data;
	uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)strlen(name) * 977;
	for (const char *ch = name; *ch; ch++)
		x = x * 31 + (uint64_t)*ch;
	for (int64_t i = 0; i < r * c; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = (float)(((double)(x >> 11) / 9007199254740992.0 * 2 - 1) * s);
	}
	return t;
}

static kiln_value param(kiln_graph *g, const char *name, int64_t r, int64_t c, double s)
{
	kiln_tensor *t = weights(name, r, c, s);
	kiln_value v = kiln_param(g, name, t);
	kiln_tensor_free(t);
	return v;
}

static kiln_value bias(kiln_graph *g, const char *name, int64_t n)
{
	kiln_tensor *t = weights(name, 1, n, 0.1);
	kiln_tensor *b = kiln_tensor_new(KILN_F32, 1, (int64_t[]){n});
	memcpy(b->data, t->data, (size_t)n * sizeof(float));
	kiln_value v = kiln_param(g, name, b);
	kiln_tensor_free(t);
	kiln_tensor_free(b);
	return v;
}

/* x: f32[N, 37] -> a [N, 32], b [N, 100], c [N, 513], d [N, 48], e [N, 32],
 * f [N, 200], h [N, 400] */
static kiln_graph *net(void)
{
	kiln_graph *g = kiln_graph_new("prepack");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){N, K0});
	kiln_value a = kiln_gemm(g, x, param(g, "wa", K0, 32, 0.3), bias(g, "ba", 32), 1, 1, false,
	                         false);
	kiln_value b = kiln_relu(g, kiln_gemm(g, x, param(g, "wb", 100, K0, 0.3), bias(g, "bb", 100),
	                                      1, 1, false, true));
	kiln_value c = kiln_matmul(g, x, param(g, "wc", K0, 513, 0.3));
	kiln_value d = kiln_gemm(g, c, param(g, "wd", 513, 48, 0.05), KILN_NONE, 1, 0, false, false);
	kiln_value e = kiln_add(g, kiln_matmul(g, a, param(g, "we", 32, 32, 0.2)), a);
	/* K = 513 > KC: the blocked path's second K block starts mid-panel */
	kiln_value f = kiln_matmul(g, c, param(g, "wf", 513, 200, 0.05));
	kiln_output(g, "a", a);
	kiln_output(g, "b", b);
	kiln_output(g, "c", c);
	kiln_output(g, "d", d);
	kiln_output(g, "e", e);
	kiln_output(g, "f", f);
	/* an even K over 25 panels: 80000 multiply-adds a row, so batch 1 splits
	 * its columns over two threads, and many rows take the blocked path */
	kiln_output(g, "h", kiln_matmul(g, f, param(g, "wh", 200, 400, 0.05)));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

/* Compiles g (emit: NULL for the library, "kir") with $KILN_PREPACK =
 * pack ("" : unset) to tpath(file), returned in path. */
static void compile(const kiln_graph *g, const char *pack, const char *emit, const char *file,
                    char *path)
{
	if (*pack)
		setenv("KILN_PREPACK", pack, 1);
	else
		unsetenv("KILN_PREPACK");
	kiln_error err = {0};
	snprintf(path, 256, "%s", tpath(file));
	kiln_status st = kiln_compile(g, path, &(kiln_compile_opts){.name = "prepack", .emit = emit},
	                              &err);
	unsetenv("KILN_PREPACK");
	ck_assert_msg(st == KILN_OK, "compile: %s", err.msg);
}

static int count(const char *path, const char *what)
{
	FILE *f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	char line[4096];
	int n = 0;
	while (fgets(line, sizeof line, f))
		for (const char *p = line; (p = strstr(p, what)); p++)
			n++;
	fclose(f);
	return n;
}

/* so on x of dims (dims[0] the batch), x[i] = sin(i * f + batch), at
 * threads; nout outputs into y, x into *xo (or freed when xo is NULL). */
static void run(const char *so, int rank, const int64_t *dims, double f, int threads,
                kiln_tensor **y, int nout, kiln_tensor **xo)
{
	kiln_model *m = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_load(so, &m, &err) == KILN_OK, "load: %s", err.msg);
	ck_assert_int_eq(kiln_model_set_threads(m, threads, &err), KILN_OK);
	kiln_tensor *x = kiln_tensor_new(KILN_F32, rank, dims);
	float *p = x->data;
	for (int64_t i = 0; i < kiln_tensor_numel(x); i++)
		p[i] = (float)sin((double)i * f + (double)dims[0]);
	ck_assert_msg(kiln_model_run(m, &x, 1, y, nout, &err) == KILN_OK, "run: %s", err.msg);
	if (xo)
		*xo = x;
	else
		kiln_tensor_free(x);
	kiln_model_free(m);
}

/* g run by the interpreter on x: each of y's nout outputs within 1e-4
 * (relative to its scale, which must be above 0.1) of it. */
static void matches_interpreter(const kiln_graph *g, kiln_tensor *x, kiln_tensor **y, int nout)
{
	kiln_tensor *ref[8] = {0};
	kiln_error err = {0};
	ck_assert_int_le(nout, 8);
	ck_assert_msg(kiln_graph_run(g, &x, 1, ref, nout, &err) == KILN_OK, "%s", err.msg);
	for (int o = 0; o < nout; o++) {
		const float *r = ref[o]->data, *v = y[o]->data;
		double worst = 0, scale = 0;
		for (int64_t i = 0; i < kiln_tensor_numel(ref[o]); i++) {
			worst = fmax(worst, fabs((double)r[i] - v[i]));
			scale = fmax(scale, fabs((double)r[i]));
		}
		ck_assert_msg(scale > 0.1 && worst <= 1e-4 * (1 + scale),
		              "output %d: max |diff| %g (scale %g)", o, worst, scale);
		kiln_tensor_free(ref[o]);
	}
}

START_TEST(packed_equals_unpacked)
{
	tmp_make("kiln_prepack");
	kiln_graph *g = net();
	char kir0[256], kir1[256], so0[256], so1[256];
	compile(g, "0", "kir", "off.kir", kir0);
	compile(g, "", "kir", "on.kir", kir1);
	ck_assert_int_eq(count(kir0, "b_panel="), 0);
	/* a, b (its transposed weight stored [K, N] by bnfold), c, d, e, f, h */
	ck_assert_int_eq(count(kir1, "b_panel="), NOUT);
	/* panels of an odd number of rows (CG_PANEL_ROWS): we's K = 32 -> 33,
	 * wh's 200 -> 201, wc's 37 stays */
	ck_assert_int_eq(count(kir1, "f32[2,33,16]"), 1);
	ck_assert_int_eq(count(kir1, "f32[25,201,16]"), 1);
	ck_assert_int_eq(count(kir1, "f32[33,37,16]"), 1);
	compile(g, "0", NULL, "off.so", so0);
	compile(g, "", NULL, "on.so", so1);
	kiln_tensor *wc = weights("wc", K0, 513, 0.3);
	const int64_t batches[] = {1, 2, 3, 5, 16, 31, 32, 33, 100};
	for (int t = 1; t <= 2; t++)
		for (size_t i = 0; i < sizeof batches / sizeof *batches; i++) {
			kiln_tensor *y0[NOUT] = {0}, *y1[NOUT] = {0};
			const int64_t dims[] = {batches[i], K0};
			run(so0, 2, dims, 0.37, t, y0, NOUT, NULL);
			run(so1, 2, dims, 0.37, t, y1, NOUT, NULL);
			for (int o = 0; o < NOUT; o++) {
				ck_assert_int_eq(kiln_tensor_nbytes(y0[o]), kiln_tensor_nbytes(y1[o]));
				ck_assert_msg(!memcmp(y0[o]->data, y1[o]->data, kiln_tensor_nbytes(y0[o])),
				              "output %d, batch %lld, %d threads: packed and unpacked differ",
				              o, (long long)batches[i], t);
			}
			/* c = x wc in double */
			const float *c = y1[2]->data;
			double worst = 0, scale = 0;
			for (int64_t r = 0; r < batches[i]; r++)
				for (int64_t n = 0; n < 513; n++) {
					double s = 0;
					for (int64_t k = 0; k < K0; k++)
						s += sin((double)(r * K0 + k) * 0.37 + (double)batches[i]) *
						     ((const float *)wc->data)[k * 513 + n];
					worst = fmax(worst, fabs(s - c[r * 513 + n]));
					scale = fmax(scale, fabs(s));
				}
			ck_assert_msg(scale > 0.1, "x wc all near 0: the test would prove nothing");
			ck_assert_msg(worst <= 1e-4, "batch %lld: x wc off by %g", (long long)batches[i],
			              worst);
			for (int o = 0; o < NOUT; o++) {
				kiln_tensor_free(y0[o]);
				kiln_tensor_free(y1[o]);
			}
		}
	kiln_tensor_free(wc);
	kiln_graph_free(g);
	tmp_remove();
}
END_TEST

/* A conv's weights are its GEMM's constant A: x f32[N, 8, 15, 15] ->
 * c1 (3 channels: not packed), c2 (1x1, 40: the direct tiles), c4 (a
 * 5x5 conv of 70 channels on c3's 80, which Winograd does not take: the
 * blocked path, K = 2000 in four blocks, a last panel of 4 rows), c5 (a
 * 2x2 stride-2 conv of c3 to 64 channels at 7x7: M = 64, N = 49, K = 320,
 * which kiln_sgemm_pm takes where the target has it). */
static kiln_graph *convnet(void)
{
	kiln_graph *g = kiln_graph_new("prepack");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, (int64_t[]){N, 8, 15, 15});
	struct { const char *w, *b; int64_t ci, co, k; } l[] = {
		{"w1", "b1", 8, 3, 3}, {"w2", "b2", 8, 40, 1}, {"w3", "b3", 8, 80, 3}, {"w4", "b4", 80, 70, 5},
		{"w5", "b5", 80, 64, 2}};
	kiln_value y[5];
	for (int i = 0; i < 5; i++) {
		kiln_tensor *w = weights(l[i].w, l[i].co, l[i].ci * l[i].k * l[i].k,
		                         1.0 / sqrt((double)(l[i].ci * l[i].k * l[i].k)));
		kiln_tensor *w4 = kiln_tensor_new(KILN_F32, 4, (int64_t[]){l[i].co, l[i].ci, l[i].k, l[i].k});
		memcpy(w4->data, w->data, kiln_tensor_nbytes(w));
		kiln_value wv = kiln_param(g, l[i].w, w4);
		kiln_tensor_free(w);
		kiln_tensor_free(w4);
		int64_t p = i == 4 ? 0 : l[i].k / 2, s = i == 4 ? 2 : 1;
		kiln_conv_opts o = {.kernel = {l[i].k, l[i].k}, .stride = {s, s}, .pad = {p, p, p, p},
		                    .group = 1};
		y[i] = kiln_relu(g, kiln_conv(g, i >= 3 ? y[2] : x, wv, bias(g, l[i].b, l[i].co), &o));
	}
	kiln_output(g, "c1", y[0]);
	kiln_output(g, "c2", y[1]);
	kiln_output(g, "c4", y[3]);
	kiln_output(g, "c5", y[4]);
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

START_TEST(packed_conv_weights)
{
	tmp_make("kiln_prepack_conv");
	kiln_graph *g = convnet();
	char kir0[256], kir1[256], so0[256], so1[256];
	compile(g, "0", "kir", "off.kir", kir0);
	compile(g, "", "kir", "on.kir", kir1);
	ck_assert_int_eq(count(kir0, "a_panel="), 0);
	ck_assert_int_ge(count(kir1, "a_panel="), 4);
	/* c5 in the taller panels of kiln_sgemm_pm where the host has them
	 * (AVX-512), the others not */
	if (__builtin_cpu_supports("avx512f"))
		ck_assert_int_eq(count(kir1, "a_panel=32"), 1);
	else
		printf("packed_conv_weights: no AVX-512 here, kiln_sgemm_pm not checked\n");
	compile(g, "0", NULL, "off.so", so0);
	compile(g, "", NULL, "on.so", so1);
	for (int t = 1; t <= 2; t++)
		for (int64_t b = 1; b <= 3; b++) {
			kiln_tensor *y0[4] = {0}, *y1[4] = {0}, *x = NULL;
			const int64_t dims[] = {b, 8, 15, 15};
			run(so0, 4, dims, 0.23, t, y0, 4, NULL);
			run(so1, 4, dims, 0.23, t, y1, 4, &x);
			for (int o = 0; o < 4; o++)
				ck_assert_msg(!memcmp(y0[o]->data, y1[o]->data, kiln_tensor_nbytes(y0[o])),
				              "output %d, batch %lld, %d threads: packed and unpacked differ",
				              o, (long long)b, t);
			if (t == 1 && b == 2) /* and both are right: the interpreter */
				matches_interpreter(g, x, y1, 4);
			kiln_tensor_free(x);
			for (int o = 0; o < 4; o++) {
				kiln_tensor_free(y0[o]);
				kiln_tensor_free(y1[o]);
			}
		}
	kiln_graph_free(g);
	tmp_remove();
}
END_TEST

/* A fixed batch of 130 rows (more than CG_WIDE_MIN_M): x f32[130, 600] ->
 * u = relu(x Wu + bu) [130, 1100] in the micro-kernel's wide panels where
 * the target has them (kiln_sgemm_pbw: K = 600 in two blocks, 1100 columns
 * in two column blocks and a last panel of 12), then v = u Wv [130, 100]
 * (100 columns: two wide panels or fewer, so 16-wide ones). */
static kiln_graph *widenet(void)
{
	kiln_graph *g = kiln_graph_new("prepack");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){130, 600});
	kiln_value u = kiln_relu(g, kiln_gemm(g, x, param(g, "wu", 600, 1100, 0.05),
	                                      bias(g, "bu", 1100), 1, 1, false, false));
	kiln_output(g, "u", u);
	kiln_output(g, "v", kiln_matmul(g, u, param(g, "wv", 1100, 100, 0.05)));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

START_TEST(wide_panels_read_in_place)
{
	tmp_make("kiln_prepack_wide");
	kiln_graph *g = widenet();
	cg_target t;
	kiln_error err = {0};
	ck_assert_msg(cg_target_init(&t, NULL, NULL, &err) == KILN_OK, "%s", err.msg);
	int wide = cg_sgemm_wide_panel(&t);
	cg_target_free(&t);
	char kir[256], so0[256], so1[256], what[64];
	compile(g, "", "kir", "on.kir", kir);
	if (wide) { /* u's B in [panels, CG_PANEL_ROWS(600), wide] */
		snprintf(what, sizeof what, "b_panel=%d ", wide);
		ck_assert_int_eq(count(kir, what), 1);
		snprintf(what, sizeof what, "f32[%d,601,%d]", (1100 + wide - 1) / wide, wide);
		ck_assert_int_eq(count(kir, what), 1);
	}
	ck_assert_int_eq(count(kir, "b_panel=16 "), wide ? 1 : 2);
	compile(g, "0", NULL, "off.so", so0);
	compile(g, "", NULL, "on.so", so1);
	for (int th = 1; th <= 2; th++) {
		kiln_tensor *y0[2] = {0}, *y1[2] = {0}, *x = NULL;
		const int64_t dims[] = {130, 600};
		run(so0, 2, dims, 0.11, th, y0, 2, NULL);
		run(so1, 2, dims, 0.11, th, y1, 2, &x);
		for (int o = 0; o < 2; o++)
			ck_assert_msg(!memcmp(y0[o]->data, y1[o]->data, kiln_tensor_nbytes(y0[o])),
			              "output %d, %d threads: packed and unpacked differ", o, th);
		if (th == 1) /* and both are right: the interpreter */
			matches_interpreter(g, x, y1, 2);
		kiln_tensor_free(x);
		for (int o = 0; o < 2; o++) {
			kiln_tensor_free(y0[o]);
			kiln_tensor_free(y1[o]);
		}
	}
	kiln_graph_free(g);
	tmp_remove();
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("prepack");
	TCase *tc = tcase_create("prepack");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, packed_equals_unpacked);
	tcase_add_test(tc, packed_conv_weights);
	tcase_add_test(tc, wide_panels_read_in_place);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(suite)
