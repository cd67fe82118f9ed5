/*
 * test_compiled_ops.c: every op case of op_cases.h (the one-node graphs
 * test_interp.c checks against PyTorch and test_lower.c through the kernel
 * IR evaluator) compiled by kiln_compile into a real .so, opened with
 * kiln_load, run with kiln_model_run, and compared with kiln_graph_run on
 * the same inputs.  This is the op-level half of issue #4's acceptance:
 * a compiled library computes what the interpreter computes.
 *
 * Each case gets its own temporary folder (mkdtemp), its own library and
 * nothing cached, and the folder is removed afterwards.  A case whose op the
 * backend refuses fails, unless it is in known_gaps below with a reason;
 * a known gap that starts compiling and matching fails too, so the list
 * only shrinks.
 *
 * Tolerance policy: integers and bools compare exactly; f64 keeps the
 * case's own tolerance (1e-12); f32, f16 and bf16 allow max(case, 1e-4)
 * absolute, because the compiled kernels reassociate sums (vectorized and
 * blocked reductions, the packed GEMM), evaluate exp, tanh and erf with
 * their own polynomials where the interpreter calls libm, and keep f16 and
 * bf16 values in f32 registers.  The fixture inputs are O(1), so 1e-4
 * absolute is about 1e-4 relative (the worst today is 2e-6, a conv).  The
 * half casts are checked bit for bit by a hand-built graph below.
 *
 * Compile time: the full set (124 cases) compiles, links and runs in about
 * 15 s in the ASan build (LLVM itself is not instrumented), so every case
 * runs in every build; the summary TCase prints the total.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "kiln/kiln.h"
#include "codegen/backend.h"
#include "codegen/lower.h"
#include "lower_util.h"
#include "op_cases.h"
#include "testutil.h"

/* Cases the backend does not compile yet, each with why (none today; the
 * f16/bf16 casts were until codegen/llvm.c learnt the half types). */
static const tu_reason known_gaps[] = {
	{NULL, NULL},
};

/* Compiles g into dir/<name>.so and runs it on in; the status of the first
 * step that fails, its message in err. */
/* kiln_compile's convolution algorithm for the next compile (NULL: the
 * cost model's choice); a test that forces one puts it back. */
static const char *conv_algo;

static kiln_status compile_and_run(const kiln_graph *g, const char *dir, const char *name,
                                   kiln_tensor **in, int nin, kiln_tensor **got, int nout,
                                   kiln_error *err)
{
	char so[1200];
	snprintf(so, sizeof so, "%s/%s.so", dir, name);
	kiln_compile_opts o = {.name = name, .conv = conv_algo};
	kiln_status st = kiln_compile(g, so, &o, err);
	if (st != KILN_OK)
		return st;
	kiln_model *m = NULL;
	if ((st = kiln_load(so, &m, err)) != KILN_OK)
		return st;
	st = kiln_model_run(m, in, nin, got, nout, err);
	kiln_model_free(m);
	return st;
}

static double compile_seconds; /* summed over the cases, printed at the end */

/* Whether case c's library matches the interpreter (opcase_matches),
 * its compile, load and run time added to compile_seconds. */
static bool case_matches(const opcase_graph *c, bool exact, char *why, size_t size)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	bool ok = opcase_matches(c, &(kiln_compile_opts){.name = c->name, .conv = conv_algo},
	                         "kiln_compiled_ops", exact, why, size);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	compile_seconds += (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
	return ok;
}

START_TEST(compiled_op_matches_interpreter)
{
	opcase_graph c = opcase_build(opcase_get(_i));
	char why[1400] = "";
	bool ok = case_matches(&c, false, why, sizeof why);
	const char *gap = tu_reason_of(known_gaps, c.name);
	if (gap && !ok)
		printf("%s: known gap (%s): %s\n", c.name, gap, why);
	if (gap)
		ck_assert_msg(!ok, "%s compiles and matches now: remove it from known_gaps", c.name);
	else
		ck_assert_msg(ok, "%s: %s", c.name, why);
	opcase_free(&c);
}
END_TEST

/* f16 and bf16 live as f32 in the compiled kernels: casts into them must
 * round exactly as the interpreter's stores do, from f64 too (one rounding,
 * not two: 1 + 2^-11 + 2^-40 is above the f16 tie), with ties to even,
 * overflow to infinity, subnormals, signed zero and NaN. */
START_TEST(half_casts_round_exactly_like_the_interpreter)
{
	static const double v[] = {1 + 0x1p-11, 1 + 0x1p-11 + 0x1p-40, 1 + 3 * 0x1p-11, 1 + 0x1p-8,
	                           1 + 0x1p-8 + 0x1p-40, 65520, 65519, 1e-7, -0.0, -INFINITY,
	                           NAN, 3.4e38, -1e39, 0.1};
	const int64_t n = sizeof v / sizeof v[0];
	kiln_graph *g = kiln_graph_new("half_casts");
	uint32_t x[2] = {input(g, "x64", KILN_F64, 1, &n), input(g, "x32", KILN_F32, 1, &n)};
	static const char *const to[] = {"to=f16", "to=bf16"};
	for (int k = 0; k < 4; k++) { /* from f64 back to f32 in registers; from f32 stored */
		uint32_t h = op1(g, KILN_OP_CAST, 1, &x[k / 2], to[k % 2]);
		ir_output_add(g, k < 2 ? op1(g, KILN_OP_CAST, 1, &h, "to=f32") : h, NULL);
	}
	kiln_tensor *in[2] = {tensor(KILN_F64, 1, &n, v), tensor(KILN_F32, 1, &n, v)};
	opcase_graph c = {"half_casts", g, {in[0], in[1]}, {0}, 2, 4, 0};
	char why[1400] = "";
	ck_assert_msg(case_matches(&c, true, why, sizeof why), "%s", why);
	opcase_free(&c);
}
END_TEST

/* ---- fused epilogues ------------------------------------------------------------- */

/* Seeded values in [-1, 1) for input k of n elements. */
static kiln_tensor *seeded(int rank, const int64_t *shape, int k)
{
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= shape[d];
	double *v = malloc(n * sizeof *v);
	uint64_t st = 0x9e3779b97f4a7c15ULL * (k + 1);
	for (int64_t i = 0; i < n; i++) {
		st ^= st << 13, st ^= st >> 7, st ^= st << 17;
		v[i] = (st >> 40) * 0x1p-23 - 1;
	}
	kiln_tensor *t = tensor(KILN_F32, rank, shape, v);
	free(v);
	return t;
}

/* The consumers that fold into a producer's store path (a GEMM's
 * epilogue, the depthwise conv's loop nest): pointwise conv -> Clip (a
 * GEMM on the input), depthwise conv -> Clip, pointwise conv + a residual
 * -> Relu, depthwise -> Relu, 3x3 conv (im2col GEMM) -> Clip, Gemm -> Clip
 * with no lower bound; bounds chosen so both sides bite.  The library must
 * give what the interpreter gives. */
START_TEST(fused_activations_match_the_interpreter)
{
	kiln_graph *g = kiln_graph_new("fused_acts");
	static const int64_t sx[] = {2, 4, 6, 6}, sw1[] = {8, 4, 1, 1}, sb[] = {8},
	                     swd[] = {8, 1, 3, 3}, sw2[] = {8, 8, 1, 1}, sw3[] = {5, 8, 3, 3}, sa[] = {3, 12},
	                     swg[] = {5, 12};
	uint32_t x = input(g, "x", KILN_F32, 4, sx), w1 = input(g, "w1", KILN_F32, 4, sw1);
	uint32_t b1 = input(g, "b1", KILN_F32, 1, sb), wd = input(g, "wd", KILN_F32, 4, swd);
	uint32_t w2 = input(g, "w2", KILN_F32, 4, sw2), w3 = input(g, "w3", KILN_F32, 4, sw3);
	uint32_t a = input(g, "a", KILN_F32, 2, sa), wg = input(g, "wg", KILN_F32, 2, swg);
	uint32_t h = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x, w1, b1}, "");
	h = op1(g, KILN_OP_CLIP, 1, &h, "min=0 max=0.8");
	uint32_t d = op1(g, KILN_OP_CONV, 3, (uint32_t[]){h, wd, b1}, "group=8 pads=1,1,1,1");
	d = op1(g, KILN_OP_CLIP, 1, &d, "min=-0.3 max=0.9");
	d = op1(g, KILN_OP_CONV, 2, (uint32_t[]){d, w2}, "");
	h = op1(g, KILN_OP_ADD, 2, (uint32_t[]){d, h}, "");
	h = op1(g, KILN_OP_RELU, 1, &h, "");
	h = op1(g, KILN_OP_CONV, 3, (uint32_t[]){h, wd, b1}, "group=8 pads=1,1,1,1 strides=2,2");
	h = op1(g, KILN_OP_RELU, 1, &h, "");
	h = op1(g, KILN_OP_CONV, 2, (uint32_t[]){h, w3}, "pads=1,1,1,1");
	h = op1(g, KILN_OP_CLIP, 1, &h, "min=-0.5 max=0.7");
	ir_output_add(g, op1(g, KILN_OP_NEG, 1, &h, ""), NULL); /* a graph output's Clip stays */
	uint32_t m = op1(g, KILN_OP_GEMM, 2, (uint32_t[]){a, wg}, "transB=1");
	m = op1(g, KILN_OP_CLIP, 1, &m, "max=0.25");
	ir_output_add(g, op1(g, KILN_OP_NEG, 1, &m, ""), NULL);
	const int64_t *shapes[] = {sx, sw1, sb, swd, sw2, sw3, sa, swg};
	static const int ranks[] = {4, 4, 1, 4, 4, 4, 2, 2};
	opcase_graph c = {"fused_acts", g, {0}, {0}, 8, 2, 0};
	for (int k = 0; k < 8; k++)
		c.in[k] = seeded(ranks[k], shapes[k], k);
	char why[1400] = "";
	ck_assert_msg(case_matches(&c, false, why, sizeof why), "%s", why);
	opcase_free(&c);
}
END_TEST

/* ---- Winograd convolution ------------------------------------------------------- */

/* n x numel values from seeded(), times scale. */
static kiln_tensor *seeded_scaled(int rank, const int64_t *shape, int k, double scale)
{
	kiln_tensor *t = seeded(rank, shape, k);
	float *v = t->data;
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		v[i] = (float)(v[i] * scale);
	return t;
}

/* Every 3x3 stride-1 conv forced through Winograd F(4x4, 3x3) against the
 * interpreter: sizes that are not whole tiles (7x9, 13x6, 10x11), channel
 * counts that fill no vector (3, 17, 5), asymmetric and zero padding, with
 * and without bias, a batch of 1 to 3, the filter a graph input (transformed
 * by a kernel at run time) or a constant (transformed at compile time), the
 * products in one part or cut into 2 and 4, and the folds into the last kernel's stores: Relu, Clip, and a residual Add
 * then Relu as in a ResNet block.  Values are scaled so outputs are O(1),
 * where the 1e-4 policy is a relative bound. */
START_TEST(winograd_convs_match_the_interpreter)
{
	static const struct {
		int64_t n, c, m, h, w;
		const char *attrs;
		bool bias, constant;
		int tail; /* 0: none, 1: Relu, 2: Clip, 3: + x then Relu (m == c) */
	} cases[] = {
		{1, 3, 5, 7, 9, "pads=1,1,1,1", true, true, 0},
		{2, 17, 16, 13, 6, "", false, false, 1},
		{3, 8, 5, 10, 11, "pads=2,1,0,2", true, false, 2},
		{2, 16, 16, 8, 8, "pads=1,1,1,1", true, true, 3},
		{1, 5, 5, 4, 4, "pads=1,1,1,1", false, true, 3},
		{1, 33, 20, 18, 21, "pads=1,1,1,1", true, true, 1}, /* whole and partial 16-blocks */
		/* products cut into parts of the tile rows (lower_wino.c,
		 * tile_parts): 4 parts of 13 tile rows, the last one partial,
		 * and 2 parts over 3 images' 21 rows, one image across a cut */
		{1, 16, 16, 50, 45, "pads=1,1,1,1", true, true, 3},
		{3, 8, 8, 26, 27, "pads=1,1,1,1", false, false, 1},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32];
		snprintf(name, sizeof name, "wino%zu", i);
		kiln_graph *g = kiln_graph_new(name);
		int64_t sx[] = {cases[i].n, cases[i].c, cases[i].h, cases[i].w};
		int64_t sw[] = {cases[i].m, cases[i].c, 3, 3}, sb[] = {cases[i].m};
		double ws = 1 / sqrt(9.0 * (double)cases[i].c);
		kiln_tensor *wt = seeded_scaled(4, sw, 1, ws), *bt = seeded_scaled(1, sb, 2, 0.5);
		opcase_graph c = {name, g, {seeded(4, sx, 0)}, {0}, 1, 1, 0};
		uint32_t x = input(g, "x", KILN_F32, 4, sx), w, b = 0;
		if (cases[i].constant) {
			w = kiln_constant(g, wt);
			if (cases[i].bias)
				b = kiln_constant(g, bt);
			kiln_tensor_free(wt), kiln_tensor_free(bt);
		} else {
			w = input(g, "w", KILN_F32, 4, sw);
			c.in[c.nin++] = wt;
			if (cases[i].bias) {
				b = input(g, "b", KILN_F32, 1, sb);
				c.in[c.nin++] = bt;
			} else
				kiln_tensor_free(bt);
		}
		uint32_t y = op1(g, KILN_OP_CONV, cases[i].bias ? 3 : 2, (uint32_t[]){x, w, b},
		                 cases[i].attrs);
		if (cases[i].tail == 1 || cases[i].tail == 3) {
			if (cases[i].tail == 3)
				y = op1(g, KILN_OP_ADD, 2, (uint32_t[]){y, x}, "");
			y = op1(g, KILN_OP_RELU, 1, &y, "");
		} else if (cases[i].tail == 2)
			y = op1(g, KILN_OP_CLIP, 1, &y, "min=-0.2 max=0.3");
		ir_output_add(g, y, NULL);
		ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
		char why[1400] = "";
		conv_algo = "winograd";
		bool ok = case_matches(&c, false, why, sizeof why);
		conv_algo = NULL;
		ck_assert_msg(ok, "%s (%s): %s", name, cases[i].attrs, why);
		opcase_free(&c);
	}
}
END_TEST

/* Grouped convs (ResNeXt, RegNet): im2col and a GEMM per group, or the
 * direct register-blocked kernel (lower_nn.c, conv_grouped), each forced
 * on every case and the cost model's pick, against the interpreter:
 * groups of 2 to 32, 2 to 24 channels per group (one CU chunk of channels
 * or several), blocks of 4 output channels and of 2 or 3 (groups of 2 or
 * 3 output channels), 1x1, 3x3 and 5x5 kernels, strides 1 and 2, symmetric, asymmetric
 * and no padding, dilation (with stride 2 too), odd sizes, planes cut into
 * row chunks (a prime 37 rows: one row per chunk), batch 1, 2 and 3, a
 * symbolic batch, and Relu, Clip or a residual Add then Relu folded into
 * the last stores; each with the filter and bias graph inputs and
 * constants (groups of 16 output channels then take the lanes form,
 * gl_sums: those cases are listed last).  The weights are scaled by
 * 1/sqrt(fan-in) so outputs are O(1).  Then which convs the lanes form
 * takes, in the kernel IR, and that the copy into padded planes masks
 * its rows' last vector (CG_TAIL_MASK). */
START_TEST(grouped_convs_match_the_interpreter)
{
	static const struct {
		int64_t n, c, m, h, w, k, grp;
		const char *attrs;
		bool bias;
		int tail; /* 0: none, 1: Relu, 2: Clip, 3: + x then Relu (m == c, same size) */
		bool sym; /* the batch a symbol */
	} cases[] = {
		{1, 8, 8, 9, 9, 3, 4, "pads=1,1,1,1", true, 3, false},
		{3, 6, 9, 7, 7, 3, 3, "strides=2,2 pads=1,0,1,0", false, 0, false},
		{2, 16, 16, 5, 5, 1, 2, "", true, 3, false},
		{1, 32, 32, 6, 6, 3, 4, "pads=1,1,1,1", false, 3, false},
		{1, 64, 64, 13, 11, 3, 32, "pads=1,1,1,1", true, 1, false},
		{2, 24, 24, 15, 15, 3, 8, "strides=2,2 pads=1,1,1,1", true, 2, false},
		{1, 32, 48, 12, 10, 5, 2, "pads=2,2,2,2", true, 1, false},
		{1, 48, 48, 9, 9, 3, 2, "pads=2,2,2,2 dilations=2,2", true, 3, false},
		{2, 16, 16, 11, 11, 3, 4, "strides=2,2 pads=0,1,1,0", false, 1, false},
		{1, 128, 128, 7, 7, 3, 32, "pads=1,1,1,1", true, 3, false},
		{3, 32, 32, 14, 14, 3, 2, "pads=1,1,1,1", true, 3, true},
		{1, 16, 16, 56, 45, 3, 2, "pads=1,1,1,1", true, 1, false},
		{2, 8, 12, 37, 33, 3, 4, "pads=1,1,1,1", false, 0, false},
		{1, 12, 12, 17, 17, 5, 4, "strides=2,2 pads=2,2,2,2", true, 2, false},
		{1, 512, 512, 7, 7, 3, 32, "pads=1,1,1,1", true, 3, false},
		{2, 64, 64, 28, 28, 3, 4, "strides=2,2 pads=1,1,1,1", true, 1, true},
		{1, 16, 16, 15, 14, 3, 4, "strides=2,2 pads=2,1,2,1 dilations=2,2", true, 1, false},
		/* groups of 16 or 32 output channels: the lanes form with a
		 * constant filter (gl_sums): stride 2 and dilation 2; 20 input
		 * channels a group (passes of 4: first, middle loop, last) and two
		 * blocks a group; 5 (passes of 1), no bias; 3 (one pass), 5x5;
		 * rows of 17 (tiles of 9 and 8) and 31 (11, 11, 9); 40 rows in
		 * chunks of 10 */
		{2, 32, 32, 15, 13, 3, 2, "strides=2,2 pads=2,1,2,1 dilations=2,2", true, 1, false},
		{1, 40, 64, 9, 11, 3, 2, "pads=1,1,1,1", true, 2, false},
		{1, 10, 32, 8, 8, 3, 2, "pads=1,1,1,1", false, 1, false},
		{2, 6, 32, 7, 7, 5, 2, "pads=2,2,2,2", true, 0, true},
		{1, 32, 32, 17, 17, 3, 2, "pads=1,1,1,1", true, 3, false},
		{1, 32, 32, 30, 31, 3, 2, "pads=1,1,1,1", true, 1, false},
		{1, 32, 32, 40, 40, 3, 2, "pads=1,1,1,1", false, 2, false},
	};
	static const char *const algos[] = {NULL, "im2col", "direct"};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
		for (int a = 0; a < 6; a++) {
			bool konst = a >= 3; /* the filter and bias constants */
			char name[32];
			snprintf(name, sizeof name, "grouped%zu", i);
			kiln_graph *g = kiln_graph_new(name);
			int64_t sx[] = {cases[i].n, cases[i].c, cases[i].h, cases[i].w};
			int64_t dx[] = {cases[i].sym ? kiln_sym(g, "N") : cases[i].n, cases[i].c,
			                cases[i].h, cases[i].w};
			int64_t cg = cases[i].c / cases[i].grp;
			int64_t sw[] = {cases[i].m, cg, cases[i].k, cases[i].k};
			int64_t sb[] = {cases[i].m};
			char attrs[96];
			snprintf(attrs, sizeof attrs, "group=%lld %s", (long long)cases[i].grp,
			         cases[i].attrs);
			double ws = 1 / sqrt((double)(cg * cases[i].k * cases[i].k));
			opcase_graph c = {name, g, {seeded(4, sx, 0), seeded_scaled(4, sw, 1, ws),
			                            seeded(1, sb, 2)}, {0}, cases[i].bias ? 3 : 2, 1, 0};
			uint32_t x = kiln_input(g, "x", KILN_F32, 4, dx), w, b = 0;
			if (!cases[i].bias)
				kiln_tensor_free(c.in[2]), c.in[2] = NULL;
			if (konst) {
				w = kiln_constant(g, c.in[1]);
				b = cases[i].bias ? kiln_constant(g, c.in[2]) : 0;
				kiln_tensor_free(c.in[1]), kiln_tensor_free(c.in[2]);
				c.in[1] = c.in[2] = NULL;
				c.nin = 1;
			} else {
				w = input(g, "w", KILN_F32, 4, sw);
				b = cases[i].bias ? input(g, "b", KILN_F32, 1, sb) : 0;
			}
			uint32_t y = op1(g, KILN_OP_CONV, cases[i].bias ? 3 : 2, (uint32_t[]){x, w, b}, attrs);
			if (cases[i].tail == 1 || cases[i].tail == 3) {
				if (cases[i].tail == 3)
					y = op1(g, KILN_OP_ADD, 2, (uint32_t[]){y, x}, "");
				y = op1(g, KILN_OP_RELU, 1, &y, "");
			} else if (cases[i].tail == 2)
				y = op1(g, KILN_OP_CLIP, 1, &y, "min=-0.2 max=0.3");
			/* y + y after the activation: it folds only into a kernel
			 * whose result is not a graph output */
			if (cases[i].tail)
				y = op1(g, KILN_OP_ADD, 2, (uint32_t[]){y, y}, "");
			ir_output_add(g, y, NULL);
			ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
			char why[1400] = "";
			conv_algo = algos[a % 3];
			bool ok = case_matches(&c, false, why, sizeof why);
			conv_algo = NULL;
			ck_assert_msg(ok, "%s (%s, --conv=%s%s): %s", name, attrs,
			              algos[a % 3] ? algos[a % 3] : "auto", konst ? ", constant filter" : "",
			              why);
			opcase_free(&c);
		}
	/* the lanes form takes groups of 16 output channels with a constant
	 * filter: not groups of 8, nor a filter that is an input */
	static const struct {
		int64_t c, grp;
		bool konst, lanes;
	} forms[] = {{32, 2, true, true}, {32, 4, true, false}, {32, 2, false, false}};
	for (size_t i = 0; i < sizeof forms / sizeof *forms; i++) {
		kiln_graph *g = kiln_graph_new("lanes");
		int64_t sx[] = {1, forms[i].c, 14, 14}, sw[] = {forms[i].c, forms[i].c / forms[i].grp, 3, 3};
		kiln_tensor *wt = seeded(4, sw, 1);
		uint32_t in[2] = {input(g, "x", KILN_F32, 4, sx),
		                  forms[i].konst ? kiln_constant(g, wt) : input(g, "w", KILN_F32, 4, sw)};
		kiln_tensor_free(wt);
		char attrs[64];
		snprintf(attrs, sizeof attrs, "group=%lld pads=1,1,1,1", (long long)forms[i].grp);
		ir_output_add(g, op1(g, KILN_OP_CONV, 2, in, attrs), NULL);
		cg_module *m = NULL;
		kiln_error e = {0};
		ck_assert_msg(cg_lower_ex(g, &(cg_lower_opts){.fuse = true}, &m, &e) == KILN_OK, "%s",
		              e.msg);
		char *kir = dump(m);
		/* the padded copy's rows: their last partial vector masked */
		ck_assert_msg(strstr(kir, "[vectorize, tail_mask]"), "form %zu: no masked row copy:\n%s",
		              i, kir);
		ck_assert_msg(!strstr(kir, "lanes]") == !forms[i].lanes, "form %zu: lanes should be %d:\n%s",
		              i, forms[i].lanes, kir);
		free(kir);
		cg_module_free(m);
		kiln_graph_free(g);
	}
}
END_TEST

/* Large 2-D output maps run im2col and GEMM per chunk of output rows
 * (lower_nn.c, chunk_rows), the chunks in CHUNK_PARTS parts that each reuse
 * one column buffer: stem-like 7x7 stride-2 convs, one whose 67 output
 * rows have no divisor near the 8 rows a chunk holds (9 chunks, the last
 * of 3 rows: a GEMM of a run-time width; parts of 2 and 3), one whose 65
 * rows go in 13 chunks of 5 (every GEMM 320 columns); a grouped 3x3 conv
 * at batch 2 (20 chunks, a part spanning both images); a 3x3 stride-2
 * conv of 64 channels, whose K = 576 limits a chunk to 7 of its 28 rows
 * (4 GEMMs of 196 columns, which cg_prepack gives kiln_sgemm_pm where the
 * target has it); then Relu folded into the chunks' GEMMs, against the
 * interpreter. */
START_TEST(chunked_im2col_convs_match_the_interpreter)
{
	static const struct {
		int64_t n, c, m, h, w, k, grp;
		const char *attrs;
	} cases[] = {
		{1, 3, 8, 133, 128, 7, 1, "strides=2,2 pads=3,3,3,3"},
		{1, 3, 8, 130, 128, 7, 1, "strides=2,2 pads=3,3,3,3"},
		{2, 4, 6, 70, 66, 3, 2, "pads=1,1,1,1"},
		{1, 64, 64, 56, 56, 3, 1, "strides=2,2 pads=1,1,1,1"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32], attrs[96];
		snprintf(name, sizeof name, "chunked%zu", i);
		snprintf(attrs, sizeof attrs, "group=%lld %s", (long long)cases[i].grp, cases[i].attrs);
		kiln_graph *g = kiln_graph_new(name);
		int64_t sx[] = {cases[i].n, cases[i].c, cases[i].h, cases[i].w};
		int64_t sw[] = {cases[i].m, cases[i].c / cases[i].grp, cases[i].k, cases[i].k};
		int64_t sb[] = {cases[i].m};
		opcase_graph c = {name, g, {seeded(4, sx, 0), seeded(4, sw, 1), seeded(1, sb, 2)},
		                  {0}, 3, 1, 0};
		uint32_t x = input(g, "x", KILN_F32, 4, sx), w = input(g, "w", KILN_F32, 4, sw);
		uint32_t b = input(g, "b", KILN_F32, 1, sb);
		uint32_t y = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x, w, b}, attrs);
		ir_output_add(g, op1(g, KILN_OP_RELU, 1, &y, ""), NULL);
		char why[1400] = "";
		conv_algo = "im2col"; /* the cost model sends the grouped one to conv_grouped */
		bool ok = case_matches(&c, false, why, sizeof why);
		conv_algo = NULL;
		ck_assert_msg(ok, "%s (%s): %s", name, attrs, why);
		opcase_free(&c);
	}
}
END_TEST

/* 1x1 convs with a stride and no padding (a ResNet or RegNet block's
 * downsampling shortcut) gather the pixels they sample and run one GEMM
 * over them (lower_nn.c, conv_1x1): stride 2 on odd and even sizes,
 * strides (2, 3), batch 2 and a symbolic batch, a one-row map (1, 3), each with
 * Relu folded into the GEMM; and one whose end padding samples a pixel
 * past the input (not a gather: im2col), against the interpreter.  Then
 * the kernel IR: the strided one is a single GEMM over all OH x OW
 * columns. */
START_TEST(strided_pointwise_convs_match_the_interpreter)
{
	static const struct {
		int64_t n, c, m, h, w;
		const char *attrs;
		bool sym;
	} cases[] = {
		{1, 16, 24, 15, 13, "strides=2,2", false},
		{2, 8, 40, 28, 28, "strides=2,2", false},
		{3, 12, 8, 17, 20, "strides=2,3", true},
		{1, 9, 7, 1, 41, "strides=1,3", false},
		{1, 8, 8, 14, 14, "strides=2,2 pads=0,0,1,1", false},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32];
		snprintf(name, sizeof name, "pointwise%zu", i);
		kiln_graph *g = kiln_graph_new(name);
		int64_t sx[] = {cases[i].n, cases[i].c, cases[i].h, cases[i].w};
		int64_t dx[] = {cases[i].sym ? kiln_sym(g, "N") : cases[i].n, cases[i].c, cases[i].h,
		                cases[i].w};
		int64_t sw[] = {cases[i].m, cases[i].c, 1, 1};
		int64_t sb[] = {cases[i].m};
		opcase_graph c = {name, g, {seeded(4, sx, 0), seeded(4, sw, 1), seeded(1, sb, 2)},
		                  {0}, 3, 1, 0};
		uint32_t x = kiln_input(g, "x", KILN_F32, 4, dx), w = input(g, "w", KILN_F32, 4, sw);
		uint32_t b = input(g, "b", KILN_F32, 1, sb);
		uint32_t y = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x, w, b}, cases[i].attrs);
		y = op1(g, KILN_OP_RELU, 1, &y, "");
		ir_output_add(g, op1(g, KILN_OP_ADD, 2, (uint32_t[]){y, y}, ""), NULL);
		ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
		char why[1400] = "";
		bool ok = case_matches(&c, false, why, sizeof why);
		ck_assert_msg(ok, "%s (%s): %s", name, cases[i].attrs, why);
		opcase_free(&c);
	}
	kiln_graph *g = kiln_graph_new("gather");
	int64_t sx[] = {1, 16, 15, 13}, sw[] = {24, 16, 1, 1};
	kiln_tensor *wt = seeded(4, sw, 1);
	uint32_t in[2] = {input(g, "x", KILN_F32, 4, sx), kiln_constant(g, wt)};
	kiln_tensor_free(wt);
	ir_output_add(g, op1(g, KILN_OP_CONV, 2, in, "strides=2,2"), NULL);
	cg_module *m = NULL;
	kiln_error e = {0};
	ck_assert_msg(cg_lower_ex(g, &(cg_lower_opts){.fuse = true}, &m, &e) == KILN_OK, "%s", e.msg);
	char *kir = dump(m);
	ck_assert_msg(strstr(kir, "gemm M=24 N=56 K=16 "), "one GEMM over 8 x 7 columns:\n%s", kir);
	free(kir);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* Stride-2 window ops wide enough to split their input rows into even and
 * odd columns (lower_nn.c, want_split): max and average pools (padding
 * counted or not, ceil mode, even and odd widths), depthwise convs
 * (padding 1 and 2, dilation 2, a channel multiplier of 2), the same on
 * planes big enough to be split row by row, and im2col convs (batch 1 and
 * 2, asymmetric padding, 7x7, and chunked by output rows) against the
 * interpreter. */
START_TEST(stride2_windows_match_the_interpreter)
{
	static const struct {
		kiln_op op;
		int64_t n, c, m, h, w, k, cpg; /* cpg: input channels per group */
		const char *attrs;
	} cases[] = {
		{KILN_OP_MAX_POOL, 2, 3, 3, 21, 40, 3, 0, "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"},
		{KILN_OP_MAX_POOL, 2, 2, 2, 19, 41, 3, 0, "kernel_shape=3,3 strides=2,2 ceil_mode=1"},
		{KILN_OP_AVERAGE_POOL, 2, 2, 2, 12, 37, 3, 0,
		 "kernel_shape=3,3 strides=2,2 pads=1,1,1,1 count_include_pad=1"},
		{KILN_OP_AVERAGE_POOL, 2, 2, 2, 10, 34, 2, 0, "kernel_shape=2,2 strides=2,2"},
		{KILN_OP_CONV, 2, 4, 4, 15, 41, 3, 1, "group=4 strides=2,2 pads=1,1,1,1"},
		{KILN_OP_CONV, 2, 3, 3, 16, 44, 5, 1, "group=3 strides=2,2 pads=2,2,2,2"},
		{KILN_OP_CONV, 2, 2, 4, 14, 45, 3, 1, "group=2 strides=2,2 pads=2,2,2,2 dilations=2,2"},
		/* planes under 16 x 16 with 3 taps, or 5 taps under 64 x 64: the
		 * whole plane split first */
		{KILN_OP_MAX_POOL, 2, 3, 3, 9, 25, 3, 0, "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"},
		{KILN_OP_CONV, 2, 4, 4, 11, 20, 3, 1, "group=4 strides=2,2 pads=1,1,1,1"},
		/* planes of 64 x 64 or more, or of 16 x 16 or more with at most 3
		 * taps a column (the conv and pools above 16 x 16): split row by
		 * row (by_rows) */
		{KILN_OP_MAX_POOL, 2, 3, 3, 71, 65, 3, 0, "kernel_shape=3,3 strides=2,2 ceil_mode=1"},
		{KILN_OP_AVERAGE_POOL, 1, 2, 2, 64, 67, 3, 0,
		 "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"},
		{KILN_OP_CONV, 2, 3, 3, 66, 70, 3, 1, "group=3 strides=2,2 pads=1,1,1,1"},
		{KILN_OP_CONV, 1, 2, 4, 65, 64, 5, 1, "group=2 strides=2,2 pads=2,2,2,2 dilations=2,2"},
		/* im2col convs: batch 1 (im2col per channel), 2 (per image), 7x7 */
		{KILN_OP_CONV, 1, 3, 5, 15, 41, 3, 3, "strides=2,2 pads=1,1,1,1"},
		{KILN_OP_CONV, 2, 4, 6, 13, 40, 3, 4, "strides=2,2 pads=1,0,1,2"},
		{KILN_OP_CONV, 1, 3, 4, 17, 45, 7, 3, "strides=2,2 pads=3,3,3,3"},
		/* im2col in chunks of output rows (at least 4 chunks of at most
		 * CHUNK_COLS columns): a 7x7 stride-2 stem, batch 2, and stride 1 with
		 * asymmetric padding (spans of whole vectors and a last one that
		 * overlaps, rows of padding) */
		{KILN_OP_CONV, 2, 3, 5, 64, 203, 7, 3, "strides=2,2 pads=3,3,3,3"},
		{KILN_OP_CONV, 1, 2, 3, 30, 150, 3, 2, "strides=1,1 pads=2,1,0,2"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32];
		snprintf(name, sizeof name, "stride2_%zu", i);
		kiln_graph *g = kiln_graph_new(name);
		int64_t sx[] = {cases[i].n, cases[i].c, cases[i].h, cases[i].w};
		int64_t sw[] = {cases[i].m, cases[i].cpg, cases[i].k, cases[i].k}, sb[] = {cases[i].m};
		bool conv = cases[i].op == KILN_OP_CONV;
		opcase_graph c = {name, g, {seeded(4, sx, 0)}, {0}, 1, 1, 0};
		uint32_t in[3] = {input(g, "x", KILN_F32, 4, sx)};
		if (conv) {
			in[1] = input(g, "w", KILN_F32, 4, sw);
			in[2] = input(g, "b", KILN_F32, 1, sb);
			c.in[1] = seeded(4, sw, 1), c.in[2] = seeded(1, sb, 2), c.nin = 3;
		}
		ir_output_add(g, op1(g, cases[i].op, conv ? 3 : 1, in, cases[i].attrs), NULL);
		char why[1400] = "";
		ck_assert_msg(case_matches(&c, false, why, sizeof why), "%s (%s): %s", name,
		              cases[i].attrs, why);
		opcase_free(&c);
	}
}
END_TEST

/* A pool op of x [n, c, h, w] with attrs, x seeded, compiled against the
 * interpreter. */
static void pool_matches(const char *name, kiln_op op, int64_t n, int64_t c, int64_t h,
                         int64_t w, const char *attrs)
{
	kiln_graph *g = kiln_graph_new(name);
	int64_t sx[] = {n, c, h, w};
	opcase_graph oc = {name, g, {seeded(4, sx, 0)}, {0}, 1, 1, 0};
	uint32_t in[1] = {input(g, "x", KILN_F32, 4, sx)};
	ir_output_add(g, op1(g, op, 1, in, attrs), NULL);
	char why[1400] = "";
	ck_assert_msg(case_matches(&oc, false, why, sizeof why), "%s (%s): %s", name, attrs, why);
	opcase_free(&oc);
}

/* Pools whose windows tile the plane (kernel == stride, no padding) on
 * rows of at most 16 outputs run as two flat loops per plane (lower_nn.c,
 * pool_flat): max and average, 2x2/2 (7 and 14 outputs a row), 3x3/3, a
 * 2x3 window, 4x4/4 (16 taps), batch 2; and beside them the shapes that do
 * not qualify (an odd plane, padding, 17 outputs a row), against the
 * interpreter. */
START_TEST(disjoint_window_pools_match_the_interpreter)
{
	static const struct {
		kiln_op op;
		int64_t n, c, h, w;
		const char *attrs;
	} cases[] = {
		{KILN_OP_MAX_POOL, 2, 3, 14, 14, "kernel_shape=2,2 strides=2,2"},
		{KILN_OP_AVERAGE_POOL, 2, 3, 28, 28, "kernel_shape=2,2 strides=2,2"},
		{KILN_OP_MAX_POOL, 1, 5, 9, 12, "kernel_shape=3,3 strides=3,3"},
		{KILN_OP_AVERAGE_POOL, 2, 2, 8, 15, "kernel_shape=2,3 strides=2,3"},
		{KILN_OP_MAX_POOL, 1, 4, 16, 16, "kernel_shape=4,4 strides=4,4"},
		{KILN_OP_AVERAGE_POOL, 1, 3, 12, 64, "kernel_shape=4,4 strides=4,4"},
		{KILN_OP_MAX_POOL, 2, 3, 15, 15, "kernel_shape=2,2 strides=2,2"},
		{KILN_OP_AVERAGE_POOL, 1, 3, 14, 14, "kernel_shape=2,2 strides=2,2 pads=1,1,1,1"},
		{KILN_OP_MAX_POOL, 1, 2, 6, 34, "kernel_shape=2,2 strides=2,2"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32];
		snprintf(name, sizeof name, "dpool_%zu", i);
		pool_matches(name, cases[i].op, cases[i].n, cases[i].c, cases[i].h, cases[i].w,
		             cases[i].attrs);
	}
}
END_TEST

/* f32 2-D max pools on planes under 64 x 64 run separably (lower_nn.c,
 * pool_sep: the max over the window's rows into a row padded with -inf,
 * stored as stride-many phase rows where each keeps a whole vector, then
 * over its columns, both in whole vectors with an overlapping last one, or
 * one vector overshooting into the next row for rows narrower than a
 * vector): SqueezeNet's 3x3/2 ceil-mode pools (55 and 27 wide), ResNet's
 * 3x3/2 pad 1, stride 1 with padding (GoogleNet), asymmetric padding (a
 * first row and column of padding, the last window over the end),
 * dilation 2, stride 3 narrow (one row) and wide (three phase rows), a 2x3
 * window of strides (1, 2), 5x5/2 pad 2, rows under a vector (15, 5, 2 and
 * 1 outputs: overshooting all but the last rows, or none), a single row,
 * 3x3 on a plane of 64 x 64 (separable at any size) and 2x2/2 on 66 x 66
 * (keeps the split rows), batch 1 and 2, against the interpreter. */
START_TEST(separable_max_pools_match_the_interpreter)
{
	static const struct {
		int64_t n, c, h, w;
		const char *attrs;
	} cases[] = {
		{1, 3, 55, 55, "kernel_shape=3,3 strides=2,2 ceil_mode=1"},
		{2, 2, 27, 27, "kernel_shape=3,3 strides=2,2 ceil_mode=1"},
		{1, 2, 40, 36, "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"},
		{2, 3, 14, 14, "kernel_shape=3,3 strides=1,1 pads=1,1,1,1"},
		{1, 2, 17, 23, "kernel_shape=3,3 strides=2,2 pads=1,1,0,2"},
		{1, 2, 20, 33, "kernel_shape=3,3 strides=2,2 dilations=2,2 pads=2,2,2,2"},
		{1, 3, 31, 29, "kernel_shape=3,3 strides=3,3 ceil_mode=1"},
		{1, 2, 12, 41, "kernel_shape=2,3 strides=1,2 pads=0,1,1,1"},
		{1, 2, 24, 24, "kernel_shape=5,5 strides=2,2 pads=2,2,2,2"},
		{2, 2, 7, 9, "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"},
		{1, 3, 1, 50, "kernel_shape=1,3 strides=1,2"},
		{1, 2, 64, 64, "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"},
		{1, 2, 20, 60, "kernel_shape=3,3 strides=3,3 pads=1,1,1,1"},
		{2, 2, 33, 31, "kernel_shape=3,3 strides=2,2"},
		{1, 2, 40, 3, "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"},
		{2, 2, 9, 3, "kernel_shape=3,3 strides=1,1"},
		{1, 2, 66, 66, "kernel_shape=2,2 strides=2,2"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32];
		snprintf(name, sizeof name, "spool_%zu", i);
		pool_matches(name, KILN_OP_MAX_POOL, cases[i].n, cases[i].c, cases[i].h, cases[i].w,
		             cases[i].attrs);
	}
}
END_TEST

/* A depthwise conv (x [n, c, h, w], weights [mo, 1, k, k], the bias when
 * bias) with attrs, its inputs seeded, compiled against the interpreter. */
/* konst: the filter and bias are constants (packed at compile time by the
 * channel-blocked form), not inputs */
static void depthwise_matches_k(const char *name, int64_t n, int64_t c, int64_t mo, int64_t h,
                                int64_t w, int64_t k, bool bias, const char *attrs, bool konst)
{
	kiln_graph *g = kiln_graph_new(name);
	int64_t sx[] = {n, c, h, w}, sw[] = {mo, 1, k, k}, sb[] = {mo};
	int nin = bias ? 3 : 2;
	opcase_graph oc = {name, g, {seeded(4, sx, 0), seeded(4, sw, 1), seeded(1, sb, 2)}, {0},
	                   konst ? 1 : nin, 1, 0};
	uint32_t in[3] = {input(g, "x", KILN_F32, 4, sx), 0, 0};
	if (konst) {
		in[1] = kiln_constant(g, oc.in[1]);
		in[2] = bias ? kiln_constant(g, oc.in[2]) : 0;
		kiln_tensor_free(oc.in[1]), kiln_tensor_free(oc.in[2]);
		oc.in[1] = oc.in[2] = NULL;
	} else {
		in[1] = input(g, "w", KILN_F32, 4, sw);
		in[2] = bias ? input(g, "b", KILN_F32, 1, sb) : 0;
	}
	ir_output_add(g, op1(g, KILN_OP_CONV, (unsigned)nin, in, attrs), NULL);
	char why[1400] = "";
	ck_assert_msg(case_matches(&oc, false, why, sizeof why), "%s (%s%s): %s", name, attrs,
	              konst ? ", constant filter" : "", why);
	opcase_free(&oc);
}

static void depthwise_matches(const char *name, int64_t n, int64_t c, int64_t mo, int64_t h,
                              int64_t w, int64_t k, bool bias, const char *attrs)
{
	depthwise_matches_k(name, n, c, mo, h, w, k, bias, attrs, false);
}

/* Stride-1 depthwise convs on planes narrower than 16 outputs (f32 3x3;
 * 32 for wider kernels) take the padded, flat form (lower_nn.c, dw_flat):
 * 3x3 and 5x5 kernels,
 * symmetric, asymmetric and no padding, dilation 2, a channel multiplier
 * of 2, one output row, batch 2, a plane wider than tall; their rows
 * copied in as one vector overshooting into the next row (not with 7
 * input columns: under half a vector), as two overlapping ones (17), and
 * out in whole vectors (9, 11, 13, 14, 15 outputs; 31 with 5x5), 19
 * channels.  Wider 3x3 rows (16, 17, 18, 28 outputs) take the row form.
 * Rows that fill whole vectors (padded to 16 or 32) go in groups of four
 * (dw_flat_rows): 14 rows, 13 and 11 (a last group of 1 and 3), 2 (one
 * group of two), dilated, 5x5 on 28x28.  The row form's rows with every
 * tap inside go in groups of four too (dw_cols_rows): 28 rows (26 inside),
 * dilated, 5x5 with a last group of three.  70 and 80 planes: more than
 * dw_plane_parts' parts, some of which take two.  Against the
 * interpreter. */
START_TEST(small_plane_depthwise_matches_the_interpreter)
{
	static const struct {
		int64_t n, c, m, h, w, k;
		const char *attrs;
	} cases[] = {
		{1, 8, 8, 7, 7, 3, "group=8 pads=1,1,1,1"},
		{2, 5, 5, 14, 14, 5, "group=5 pads=2,2,2,2"},
		{1, 4, 4, 9, 11, 3, "group=4 pads=0,1,2,1"},
		{1, 3, 3, 10, 9, 3, "group=3 pads=2,2,2,2 dilations=2,2"},
		{2, 3, 6, 6, 13, 3, "group=3 pads=1,1,1,1"},
		{1, 4, 4, 3, 20, 3, "group=4"},
		{1, 2, 2, 5, 31, 5, "group=2 pads=2,1,2,3"},
		{1, 19, 19, 14, 14, 3, "group=19 pads=1,1,1,1"},
		{2, 3, 3, 7, 7, 3, "group=3 pads=2,2,2,2"},
		{1, 4, 4, 5, 17, 3, "group=4"},
		{1, 3, 3, 15, 15, 3, "group=3 pads=1,1,1,1"},
		{1, 19, 19, 28, 28, 3, "group=19 pads=1,1,1,1"},
		{1, 5, 5, 1, 17, 3, "group=5 pads=1,1,1,1"},
		{1, 3, 3, 12, 16, 3, "group=3 pads=1,1,1,1"},
		{1, 4, 4, 13, 12, 3, "group=4 pads=1,1,1,1"},
		{2, 3, 3, 15, 14, 3, "group=3 pads=1,1,1,1 dilations=2,2"},
		{1, 3, 3, 28, 28, 5, "group=3 pads=2,2,2,2"},
		{1, 2, 2, 11, 28, 5, "group=2 pads=2,2,2,2"},
		{1, 2, 2, 4, 14, 3, "group=2 pads=0,1,0,1"},
		{1, 3, 3, 20, 24, 3, "group=3 pads=2,2,2,2 dilations=2,2"},
		{2, 2, 2, 23, 40, 5, "group=2 pads=2,2,2,2"},
		/* more planes than parts (dw_plane_parts: at most 64), so parts
		 * run two planes through one scratch copy */
		{1, 70, 70, 7, 7, 3, "group=70 pads=1,1,1,1"},
		{2, 40, 40, 14, 14, 3, "group=40 pads=1,1,1,1"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32];
		snprintf(name, sizeof name, "dwflat_%zu", i);
		depthwise_matches(name, cases[i].n, cases[i].c, cases[i].m, cases[i].h, cases[i].w,
		                  cases[i].k, true, cases[i].attrs);
	}
}
END_TEST

/* Depthwise convs whose output rows have at most 8 columns (16 at stride
 * 2 or with 25 taps or more) run channel-blocked (lower_nn.c,
 * dw_blocked), 3x3 taps at stride 1 too: blocks of
 * 16 channels transposed in and out (input rows wider than 16 one by one
 * into the padded block: 28, 31, 30 of which 29 are read, 32 with
 * asymmetric padding).  Channel counts that leave a
 * partial block (20, 37, 17) or are below one (5), stride 1 (5x5, on rows of
 * 7 and 14; 3x3 on rows of 7) and 2 (3x3, 5x5), asymmetric padding, dilation 2, batch 2,
 * without a bias, against the interpreter; then a Relu6 that folds into
 * it and a residual Add that must not (it is applied after), and the
 * kernel IR shows the transposes, which a 3x3 stride-1 conv on rows of
 * 14 does without. */
START_TEST(tiny_plane_depthwise_is_channel_blocked)
{
	static const struct {
		int64_t n, c, h, w, k;
		bool bias;
		const char *attrs;
	} cases[] = {
		{1, 20, 7, 7, 5, true, "group=20 pads=2,2,2,2"},
		{2, 37, 14, 14, 5, true, "group=37 strides=2,2 pads=2,2,2,2"},
		{1, 16, 13, 15, 3, false, "group=16 strides=2,2 pads=0,1,2,1"},
		{1, 5, 6, 6, 5, true, "group=5 pads=4,4,4,4 dilations=2,2"},
		{1, 20, 28, 28, 5, true, "group=20 strides=2,2 pads=2,2,2,2"},
		{2, 18, 23, 31, 3, true, "group=18 strides=2,2 pads=1,1,1,1"},
		{2, 33, 6, 5, 5, true, "group=33 pads=2,1,2,3"},
		{1, 20, 14, 14, 5, true, "group=20 pads=2,2,2,2"},
		{2, 20, 7, 7, 3, true, "group=20 pads=1,1,1,1"},
		{1, 20, 30, 30, 3, true, "group=20 strides=2,2"},
		{1, 17, 29, 32, 5, false, "group=17 strides=2,2 pads=1,2,3,0"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32];
		snprintf(name, sizeof name, "dwblock_%zu", i);
		for (int konst = 0; konst < 2; konst++)
			depthwise_matches_k(name, cases[i].n, cases[i].c, cases[i].c, cases[i].h, cases[i].w,
			                    cases[i].k, cases[i].bias, cases[i].attrs, konst);
	}
	/* a Clip folds into the conv's stores into T and the Add and Relu after
	 * it are a kernel of their own; an Add straight after the conv is one
	 * too (it would have folded into stores y does not get) */
	static const struct {
		const char *tail, *want[2];
	} eps[] = {
		{"  %c = clip %d {min=0, max=6} : f32[2,20,7,7]\n"
		 "  %r = add %c, %x : f32[2,20,7,7]\n",
		 {"> 6.0, 6.0, ", "kernel k1_add_relu"}},
		{"  %r = add %d, %x : f32[2,20,7,7]\n", {"kernel k1_add_relu", "kernel k0_conv"}},
	};
	for (size_t i = 0; i < sizeof eps / sizeof *eps; i++) {
		char text[1200] =
			"graph @ep(%x: f32[2,20,7,7], %w: f32[20,1,5,5], %b: f32[20]) -> (%z: f32[2,20,7,7]) {\n"
			"  %d = conv %x, %w, %b {group=20, pads=[2,2,2,2]} : f32[2,20,7,7]\n";
		strcat(text, eps[i].tail);
		strcat(text, "  %z = relu %r : f32[2,20,7,7]\n  ret %z\n}\n");
		kiln_graph *g = NULL;
		kiln_error e = {0};
		ck_assert_msg(ir_parse(text, "ep.kir", &g, &e) == KILN_OK, "%s", e.msg);
		int64_t sx[] = {2, 20, 7, 7}, sw[] = {20, 1, 5, 5}, sb[] = {20};
		opcase_graph c = {"ep", g, {seeded(4, sx, 0), seeded(4, sw, 1), seeded(1, sb, 2)}, {0},
		                  3, 1, 0};
		char why[1400] = "";
		ck_assert_msg(case_matches(&c, false, why, sizeof why), "epilogue %zu: %s", i, why);
		cg_module *m = NULL;
		ck_assert_msg(cg_lower_ex(g, &(cg_lower_opts){.fuse = true}, &m, &e) == KILN_OK, "%s",
		              e.msg);
		char *kir = dump(m);
		ck_assert_msg(strstr(kir, "transpose rows=min(16, 20 - ") && strstr(kir, eps[i].want[0]) &&
		              strstr(kir, eps[i].want[1]), "epilogue %zu:\n%s", i, kir);
		free(kir);
		cg_module_free(m);
		opcase_free(&c);
	}
	/* 3x3 at stride 1 on the same plane: blocked too (it was the flat
	 * form, no transposes, until the blocked one got faster);
	 * stride 2 to rows of 14: blocked; to rows of 28: not; 5x5 at stride 1
	 * on rows of 14: blocked, 3x3 there: not, 5x5 on rows of 28: not */
	static const struct {
		const char *text;
		bool blocked;
	} forms[] = {
		{"graph @f3(%x: f32[2,20,7,7], %w: f32[20,1,3,3]) -> (%d: f32[2,20,7,7]) {\n"
		 "  %d = conv %x, %w {group=20, pads=[1,1,1,1]} : f32[2,20,7,7]\n  ret %d\n}\n", true},
		{"graph @s14(%x: f32[1,20,28,28], %w: f32[20,1,5,5]) -> (%d: f32[1,20,14,14]) {\n"
		 "  %d = conv %x, %w {group=20, pads=[2,2,2,2], strides=[2,2]} : f32[1,20,14,14]\n"
		 "  ret %d\n}\n", true},
		{"graph @s28(%x: f32[1,20,56,56], %w: f32[20,1,3,3]) -> (%d: f32[1,20,28,28]) {\n"
		 "  %d = conv %x, %w {group=20, pads=[1,1,1,1], strides=[2,2]} : f32[1,20,28,28]\n"
		 "  ret %d\n}\n", false},
		{"graph @k5(%x: f32[1,20,14,14], %w: f32[20,1,5,5]) -> (%d: f32[1,20,14,14]) {\n"
		 "  %d = conv %x, %w {group=20, pads=[2,2,2,2]} : f32[1,20,14,14]\n  ret %d\n}\n", true},
		{"graph @k3(%x: f32[1,20,14,14], %w: f32[20,1,3,3]) -> (%d: f32[1,20,14,14]) {\n"
		 "  %d = conv %x, %w {group=20, pads=[1,1,1,1]} : f32[1,20,14,14]\n  ret %d\n}\n", false},
		{"graph @k5w(%x: f32[1,20,28,28], %w: f32[20,1,5,5]) -> (%d: f32[1,20,28,28]) {\n"
		 "  %d = conv %x, %w {group=20, pads=[2,2,2,2]} : f32[1,20,28,28]\n  ret %d\n}\n", false},
	};
	for (size_t i = 0; i < sizeof forms / sizeof *forms; i++) {
		kiln_graph *g = NULL;
		kiln_error e = {0};
		ck_assert_msg(ir_parse(forms[i].text, "f.kir", &g, &e) == KILN_OK, "%s", e.msg);
		cg_module *m = NULL;
		ck_assert_msg(cg_lower_ex(g, &(cg_lower_opts){.fuse = true}, &m, &e) == KILN_OK, "%s",
		              e.msg);
		char *kir = dump(m);
		ck_assert_msg(!strstr(kir, "transpose rows=") == !forms[i].blocked,
		              "form %zu: blocked should be %d:\n%s", i, forms[i].blocked, kir);
		free(kir);
		cg_module_free(m);
		kiln_graph_free(g);
	}
}
END_TEST

/* On a small plane a depthwise conv's activation folds into its flat
 * vector loop (cg_kernel.act_buf), its residual Add into the row copy
 * after it: Clip alone, and a residual Add then Relu, where the Relu must
 * come after the Add; a 1x1 conv reads the result.  Against the
 * interpreter. */
START_TEST(small_plane_depthwise_epilogues_keep_their_order)
{
	static const char *const tails[] = {
		"  %y = clip %d {min=0, max=6} : f32[2,6,9,9]\n",
		"  %r = add %d, %x : f32[2,6,9,9]\n  %y = relu %r : f32[2,6,9,9]\n",
		"  %c = clip %d {min=-0.5, max=0.5} : f32[2,6,9,9]\n  %y = add %c, %x : f32[2,6,9,9]\n",
	};
	for (size_t i = 0; i < sizeof tails / sizeof *tails; i++) {
		char text[1200] =
			"graph @ep(%x: f32[2,6,9,9], %w: f32[6,1,3,3], %b: f32[6], %p: f32[6,6,1,1]) "
			"-> (%z: f32[2,6,9,9]) {\n"
			"  %d = conv %x, %w, %b {group=6, pads=[1,1,1,1]} : f32[2,6,9,9]\n";
		strcat(text, tails[i]);
		strcat(text, "  %z = conv %y, %p : f32[2,6,9,9]\n  ret %z\n}\n");
		kiln_graph *g = NULL;
		kiln_error e = {0};
		ck_assert_msg(ir_parse(text, "ep.kir", &g, &e) == KILN_OK, "%s\n%s", e.msg, text);
		int64_t sx[] = {2, 6, 9, 9}, sw[] = {6, 1, 3, 3}, sb[] = {6}, sp[] = {6, 6, 1, 1};
		opcase_graph c = {"ep", g, {seeded(4, sx, 0), seeded(4, sw, 1), seeded(1, sb, 2),
		                            seeded(4, sp, 3)}, {0}, 4, 1, 0};
		char why[1400] = "";
		ck_assert_msg(case_matches(&c, false, why, sizeof why), "case %zu: %s", i, why);
		opcase_free(&c);
	}
}
END_TEST

/* Concat and Split copy their parts in chunks of about 16K elements over
 * the pool (lower.c, blocks): parts of 36300 and 60500 elements per image
 * (two and three chunks, the last ones short), batch 2, then the result
 * split back unevenly and summed so every output element depends on both,
 * against the interpreter. */
/* A Transpose whose innermost output dimension is not the input's
 * contiguous one moves planes with CG_TRANSPOSE (W x W blocks in
 * registers), chunks of 256 source columns over the pool: a 2-D one of
 * 600 columns (chunks 256, 256, 88), 3-D with two dimensions merged (60 x
 * 37), 4-D with an outer dimension (5 planes of 297 x 12), and one of 5
 * rows (under 8: the loop nest).  Exact against the interpreter. */
START_TEST(transposes_move_blocks_in_registers)
{
	static const char *text =
		"graph @tr(%a: f32[64,600], %b: f32[3,20,37], %c: f32[5,9,33,12], %d: f32[5,40]) -> "
		"(%p: f32[600,64], %q: f32[37,3,20], %r: f32[5,12,9,33], %s: f32[40,5]) {\n"
		"  %p = transpose %a {perm=[1,0]} : f32[600,64]\n"
		"  %q = transpose %b {perm=[2,0,1]} : f32[37,3,20]\n"
		"  %r = transpose %c {perm=[0,3,1,2]} : f32[5,12,9,33]\n"
		"  %s = transpose %d {perm=[1,0]} : f32[40,5]\n"
		"  ret %p, %q, %r, %s\n}\n";
	kiln_graph *g = NULL;
	kiln_error e = {0};
	ck_assert_msg(ir_parse(text, "tr.kir", &g, &e) == KILN_OK, "%s", e.msg);
	int64_t sa[] = {64, 600}, sb[] = {3, 20, 37}, sc[] = {5, 9, 33, 12}, sd[] = {5, 40};
	opcase_graph c = {"tr", g, {seeded(2, sa, 0), seeded(3, sb, 1), seeded(4, sc, 2),
	                            seeded(2, sd, 3)}, {0}, 4, 4, 0};
	char why[1400] = "";
	ck_assert_msg(case_matches(&c, true, why, sizeof why), "%s", why);
	cg_module *m = NULL;
	ck_assert_msg(cg_lower_ex(g, &(cg_lower_opts){.fuse = true}, &m, &e) == KILN_OK, "%s", e.msg);
	char *kir = dump(m);
	ck_assert_msg(strstr(kir, "transpose rows=64 cols=min(256, 600 - %i0*256)"), "%s", kir);
	ck_assert_msg(strstr(kir, "transpose rows=60 cols=min(256, 37 - "), "%s", kir);
	ck_assert_msg(strstr(kir, "transpose rows=297 cols=min(256, 12 - "), "%s", kir);
	const char *t = kir;
	int n = 0;
	while ((t = strstr(t, "transpose rows=")))
		n++, t++;
	ck_assert_int_eq(n, 3);
	free(kir);
	cg_module_free(m);
	opcase_free(&c);
}
END_TEST

START_TEST(concat_and_split_copy_in_chunks)
{
	static const char *text =
		"graph @cs(%a: f32[2,3,100,121], %b: f32[2,5,100,121]) -> (%y: f32[2,4,100,121]) {\n"
		"  %c = concat %a, %b {axis=1} : f32[2,8,100,121]\n"
		"  %p, %q = split %c {axis=1, split=[4,4]} : f32[2,4,100,121], f32[2,4,100,121]\n"
		"  %y = sub %p, %q : f32[2,4,100,121]\n"
		"  ret %y\n}\n";
	kiln_graph *g = NULL;
	kiln_error e = {0};
	ck_assert_msg(ir_parse(text, "cs.kir", &g, &e) == KILN_OK, "%s", e.msg);
	int64_t sa[] = {2, 3, 100, 121}, sb[] = {2, 5, 100, 121};
	opcase_graph c = {"cs", g, {seeded(4, sa, 0), seeded(4, sb, 1)}, {0}, 2, 1, 0};
	char why[1400] = "";
	ck_assert_msg(case_matches(&c, false, why, sizeof why), "%s", why);
	cg_module *m = NULL;
	ck_assert_msg(cg_lower_ex(g, &(cg_lower_opts){.fuse = true}, &m, &e) == KILN_OK, "%s", e.msg);
	char *kir = dump(m);
	ck_assert_msg(strstr(kir, "in 0..N*3 [parallel]") || strstr(kir, "in 0..6 [parallel]"),
	              "%s", kir);
	free(kir);
	cg_module_free(m);
	opcase_free(&c);
}
END_TEST

/* A Concat on the channels read only by an inference BatchNormalization
 * (DenseNet's dense layers) or a 1x1 conv with few output channels
 * (SqueezeNet's fire modules) gets no kernel: the BN reads the parts where
 * they lie (lower.c, concat_into_reader), one part twice here, with the
 * Relu folded into its stores; the conv runs one GEMM per part, the later
 * ones accumulating (beta 1), the Relu on the last.  A Concat with a
 * second reader, on another axis, or before a conv with many output
 * channels, is still copied.  Batch 1 and 3 against the interpreter; a
 * constant weight split per part, at batch 2. */
START_TEST(concat_read_in_place_by_its_reader)
{
	static const char *text =
		"graph @cb(%a: f32[N,5,6,7], %b: f32[N,3,6,7], %s: f32[13], %mu: f32[13],"
		" %s8: f32[8], %w: f32[N,8,3,7], %k2: f32[2,8,1,1], %k8: f32[8,8,1,1])"
		" -> (%y: f32[N,13,6,7], %zq: f32[N,8,6,7], %t: f32[N,8,9,7], %u: f32[N,2,6,7]) {\n"
		"  %c = concat %a, %b, %a {axis=1} : f32[N,13,6,7]\n"
		"  %va = abs %mu : f32[13]\n"
		"  %n = batch_norm %c, %s, %va, %mu, %va {epsilon=0.001} : f32[N,13,6,7]\n"
		"  %y = relu %n : f32[N,13,6,7]\n"
		"  %d = concat %b, %a {axis=-3} : f32[N,8,6,7]\n"
		"  %v8 = abs %s8 : f32[8]\n"
		"  %e = batch_norm %d, %s8, %s8, %s8, %v8 : f32[N,8,6,7]\n"
		"  %z = add %e, %d : f32[N,8,6,7]\n"
		"  %h = concat %d, %w {axis=2} : f32[N,8,9,7]\n"
		"  %t = batch_norm %h, %s8, %v8, %s8, %v8 : f32[N,8,9,7]\n"
		"  %f = concat %a, %b {axis=1} : f32[N,8,6,7]\n"
		"  %fc = conv %f, %k2 : f32[N,2,6,7]\n"
		"  %u = relu %fc : f32[N,2,6,7]\n"
		"  %g8 = concat %b, %a {axis=1} : f32[N,8,6,7]\n"
		"  %q = conv %g8, %k8 : f32[N,8,6,7]\n"
		"  %zq = add %z, %q : f32[N,8,6,7]\n"
		"  ret %y, %zq, %t, %u\n}\n";
	for (int64_t n = 1; n <= 3; n += 2) {
		kiln_graph *g = NULL;
		kiln_error e = {0};
		ck_assert_msg(ir_parse(text, "cb.kir", &g, &e) == KILN_OK, "%s", e.msg);
		int64_t sa[] = {n, 5, 6, 7}, sb[] = {n, 3, 6, 7}, s13[] = {13}, s8[] = {8};
		int64_t sw[] = {n, 8, 3, 7}, sk2[] = {2, 8, 1, 1}, sk8[] = {8, 8, 1, 1};
		opcase_graph c = {"cb", g, {seeded(4, sa, 0), seeded(4, sb, 1), seeded(1, s13, 2),
		                            seeded(1, s13, 3), seeded(1, s8, 4), seeded(4, sw, 5),
		                            seeded(4, sk2, 6), seeded(4, sk8, 7)},
		                  {0}, 8, 4, 0};
		char why[1400] = "";
		ck_assert_msg(case_matches(&c, false, why, sizeof why), "batch %lld: %s", (long long)n, why);
		cg_module *m = NULL;
		ck_assert_msg(cg_lower_ex(g, &(cg_lower_opts){.fuse = true}, &m, &e) == KILN_OK, "%s", e.msg);
		int ncat = 0, nbn = 0;
		for (int k = 0; k < m->nkern; k++) {
			ncat += strstr(m->kern[k].name, "concat") != NULL;
			nbn += strstr(m->kern[k].name, "batch_norm") != NULL;
		}
		char *kir = dump(m);
		/* %d (two readers), %h (axis 2) and %g8 (8 output channels of 8)
		 * are copied, %c and %f are not */
		ck_assert_msg(ncat == 3 && nbn == 3, "%d concat, %d batch_norm kernels:\n%s", ncat, nbn, kir);
		/* the second reads W's columns 5.. in place (W is an input) */
		ck_assert_msg(strstr(kir, "gemm M=2 N=42 K=5 ") && strstr(kir, "gemm M=2 N=42 K=3 ") &&
		              strstr(kir, "[5; 0, 8, 1]") && strstr(kir, "beta=1"),
		              "the conv's GEMMs per part:\n%s", kir);
		ck_assert_msg(strstr(kir, "if %i0 % 13 < 5 {") && strstr(kir, "(%i0 % 13 - 8))*42"),
		              "the BN picks its part by channel:\n%s", kir);
		free(kir);
		cg_module_free(m);
		opcase_free(&c);
	}
	/* a constant weight: a copy of its columns per part */
	kiln_graph *g = kiln_graph_new("cparts");
	int64_t sx1[] = {2, 16, 5, 9}, sx2[] = {2, 8, 5, 9}, sw[] = {3, 24, 1, 1}, sb[] = {3};
	kiln_tensor *wt = seeded(4, sw, 2), *bt = seeded(1, sb, 3);
	uint32_t x1 = input(g, "x1", KILN_F32, 4, sx1), x2 = input(g, "x2", KILN_F32, 4, sx2);
	uint32_t cat = op1(g, KILN_OP_CONCAT, 2, (uint32_t[]){x2, x1}, "axis=1");
	uint32_t y = op1(g, KILN_OP_CONV, 3, (uint32_t[]){cat, kiln_constant(g, wt), kiln_constant(g, bt)},
	                 "");
	y = op1(g, KILN_OP_RELU, 1, &y, ""); /* into the last GEMM's epilogue */
	ir_output_add(g, op1(g, KILN_OP_NEG, 1, &y, ""), NULL);
	kiln_tensor_free(wt);
	kiln_tensor_free(bt);
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	opcase_graph c = {"cparts", g, {seeded(4, sx1, 0), seeded(4, sx2, 1)}, {0}, 2, 1, 0};
	char why[1400] = "";
	ck_assert_msg(case_matches(&c, false, why, sizeof why), "%s", why);
	cg_module *m = NULL;
	kiln_error e = {0};
	ck_assert_msg(cg_lower_ex(g, &(cg_lower_opts){.fuse = true}, &m, &e) == KILN_OK, "%s", e.msg);
	char *kir = dump(m);
	ck_assert_msg(!strstr(kir, "concat") && strstr(kir, "gemm M=3 N=45 K=8 ") &&
	              strstr(kir, "gemm M=3 N=45 K=16 ") && strstr(kir, "beta=1 bias=") &&
	              strstr(kir, "per row relu"), "%s", kir);
	/* the whole W is read by no kernel: it keeps no bytes, its parts do */
	ck_assert_int_eq(cg_drop_unread(m, &e), KILN_OK);
	int whole = 0, parts = 0;
	for (int b = 0; b < m->nbuf; b++) {
		const cg_buf *cb = &m->buf[b];
		whole += cb->kind == CG_BUF_CONST && cb->data && kiln_tensor_numel(cb->data) == 72;
		parts += cb->kind == CG_BUF_CONST && cb->data && cb->name && strstr(cb->name, ".part");
	}
	ck_assert_msg(whole == 0 && parts == 2, "%d whole weights, %d parts kept:\n%s", whole, parts,
	              kir);
	free(kir);
	cg_module_free(m);
	opcase_free(&c);
}
END_TEST

/* The LLVM backend's GEMM panels for this host, as kiln_compile asks for
 * them; says so where it has no GEMM with channel blocks (test: the
 * caller's name), whose numbers are then checked without them. */
static cg_panels host_panels(const char *test)
{
	const cg_backend *be = cg_backend_find("llvm");
	cg_panels pn = {0};
	kiln_error e = {0};
	ck_assert_msg(be && be->gemm_panel && be->gemm_panel(NULL, &pn, &e) == KILN_OK, "%s", e.msg);
	if (!pn.c_block)
		printf("%s: no GEMM with channel blocks on this host (kiln_sgemm_pm), numbers checked "
		       "only\n", test);
	return pn;
}

/* The kernel IR's own evaluator (cg_eval, after cg_memplan) on module m,
 * lowered from c's graph g, matches the interpreter within 1e-4 on every
 * output: it reads channel blocks as the compiled code does. */
static void eval_matches(const kiln_graph *g, cg_module *m, const opcase_graph *c)
{
	kiln_error e = {0};
	kiln_tensor *want[4] = {0}, *got[4] = {0};
	ck_assert_msg(kiln_graph_run(g, (kiln_tensor **)c->in, c->nin, want, c->nout, &e) == KILN_OK,
	              "%s", e.msg);
	ck_assert_int_eq(cg_memplan(m, &e), KILN_OK);
	ck_assert_msg(cg_eval(m, (kiln_tensor **)c->in, c->nin, got, c->nout, &e) == KILN_OK, "%s",
	              e.msg);
	for (int i = 0; i < c->nout; i++) {
		double d = 0;
		for (int64_t j = 0; j < kiln_tensor_numel(want[i]); j++)
			d = fmax(d, fabs(ir_load(got[i], j) - ir_load(want[i], j)));
		ck_assert_msg(d < 1e-4, "cg_eval output %d: max error %g", i, d);
		kiln_tensor_free(want[i]), kiln_tensor_free(got[i]);
	}
}

/* k[i] = a constant node of t[i], for i < n, each t[i] freed */
static void constants(kiln_graph *g, kiln_tensor **t, int n, uint32_t *k)
{
	for (int i = 0; i < n; i++)
		k[i] = kiln_constant(g, t[i]), kiln_tensor_free(t[i]);
}

/* eval_matches on c's graph and module m, then c, m and its kernel IR
 * kir freed */
static void eval_then_free(opcase_graph *c, cg_module *m, char *kir)
{
	eval_matches(c->g, m, c);
	free(kir);
	cg_module_free(m);
	opcase_free(c);
}

/* c's graph compiled matches the interpreter (batch n, for the message);
 * then lowered with the panels pn (fused): the module in *m, its kernel
 * IR returned (free it) */
static char *matches_then_lowers(const opcase_graph *c, cg_panels *pn, int64_t n, cg_module **m)
{
	kiln_error e = {0};
	char why[1400] = "";
	ck_assert_msg(case_matches(c, false, why, sizeof why), "batch %lld: %s", (long long)n, why);
	ck_assert_msg(cg_lower_ex(c->g, &(cg_lower_opts){.fuse = true, .panels = pn}, m, &e) ==
	                  KILN_OK, "%s", e.msg);
	return dump(*m);
}

/* A 1x1 conv whose result reaches a depthwise conv through element-wise
 * ops only writes it with the channels in blocks of the vector (the GEMM
 * with the output channels in its lanes stores its sums as they are) and
 * the depthwise conv copies its rows with no transpose
 * (cg_conv_blocked_ok, blocked_chain); the depthwise conv writes its own
 * result so for a 1x1 conv that reads it (cg_conv_reads_blocked_ok).
 * Chains on batch 1 and 3 against the interpreter: 1x1 -> Relu -> 5x5
 * depthwise -> Relu -> 1x1 + residual (the Relus in the GEMM's epilogue
 * and the depthwise conv's stores, the residual in the second GEMM's),
 * 1x1 -> SiLU (Sigmoid, Mul) -> 3x3 stride-2 depthwise (an element-wise
 * kernel keeping the blocks), a 1x1 conv whose result is also added to
 * the output (stored as it is), and 1x1 -> Relu -> 3x3 depthwise at 14x14
 * twice: read by a 1x1 conv (blocks on both sides) and not (none: that
 * shape pays only with both).  The depthwise convs read their blocks in
 * place where most outputs' taps lie inside them, the borders guarded
 * (the 14x14 ones), else through a padded copy (the 5x5 at 7x7); then a
 * 5x5 at 20x20, in place, past dw_blocked's own widths
 * (cg_dw_direct_ok).  The kernel IR shows which GEMMs write or read
 * blocks where the host has that GEMM; the module evaluated by cg_eval
 * matches too. */
START_TEST(pointwise_conv_writes_channel_blocks_for_depthwise)
{
	cg_panels pn = host_panels("pointwise_conv_writes_channel_blocks_for_depthwise");
	for (int64_t n = 1; n <= 3; n += 2) {
		kiln_graph *g = kiln_graph_new("cblk");
		int64_t sx1[] = {n, 24, 7, 7}, sx2[] = {n, 40, 14, 14}, sx3[] = {n, 64, 7, 7};
		int64_t sw3[] = {64, 64, 1, 1}, sw4[] = {64, 96, 1, 1};
		int64_t sw1[] = {64, 24, 1, 1}, sd1[] = {64, 1, 5, 5}, sb64[] = {64};
		int64_t sw2[] = {96, 40, 1, 1}, sd2[] = {96, 1, 3, 3}, sb96[] = {96};
		kiln_tensor *t[] = {seeded(4, sw1, 2), seeded(1, sb64, 3), seeded(4, sd1, 4),
		                    seeded(1, sb64, 5), seeded(4, sw2, 6), seeded(1, sb96, 7),
		                    seeded(4, sd2, 8), seeded(4, sw1, 9), seeded(4, sw3, 10),
		                    seeded(4, sw2, 12), seeded(4, sw4, 13), seeded(4, sw2, 14)};
		uint32_t k[12];
		constants(g, t, 12, k);
		uint32_t x1 = input(g, "x1", KILN_F32, 4, sx1), x2 = input(g, "x2", KILN_F32, 4, sx2);
		uint32_t x3 = input(g, "x3", KILN_F32, 4, sx3);
		uint32_t a = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x1, k[0], k[1]}, "");
		a = op1(g, KILN_OP_RELU, 1, &a, "");
		a = op1(g, KILN_OP_CONV, 3, (uint32_t[]){a, k[2], k[3]}, "group=64 pads=2,2,2,2");
		a = op1(g, KILN_OP_RELU, 1, &a, "");
		a = op1(g, KILN_OP_CONV, 2, (uint32_t[]){a, k[8]}, "");
		a = op1(g, KILN_OP_ADD, 2, (uint32_t[]){a, x3}, ""); /* into the GEMM's epilogue */
		a = op1(g, KILN_OP_NEG, 1, &a, "");
		uint32_t b = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x2, k[4], k[5]}, "");
		uint32_t sg = op1(g, KILN_OP_SIGMOID, 1, &b, "");
		b = op1(g, KILN_OP_MUL, 2, (uint32_t[]){b, sg}, "");
		ir_output_add(g, op1(g, KILN_OP_CONV, 2, (uint32_t[]){b, k[6]},
		                     "group=96 strides=2,2 pads=1,1,1,1"), NULL);
		uint32_t c = op1(g, KILN_OP_CONV, 2, (uint32_t[]){x1, k[7]}, "");
		uint32_t r = op1(g, KILN_OP_RELU, 1, &c, "");
		r = op1(g, KILN_OP_CONV, 3, (uint32_t[]){r, k[2], k[3]}, "group=64 pads=2,2,2,2");
		r = op1(g, KILN_OP_ADD, 2, (uint32_t[]){r, c}, "");
		ir_output_add(g, op1(g, KILN_OP_ADD, 2, (uint32_t[]){a, r}, ""), NULL);
		/* a 3x3 at 14x14 takes blocks only to write them too: read by a
		 * 1x1 conv, and (the last) not */
		for (int last = 0; last < 2; last++) {
			/* weights of their own: the compile pipeline's CSE would merge
			 * a conv the same as b's, and its result then has two readers */
			uint32_t d = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x2, k[last ? 9 : 11], k[5]}, "");
			d = op1(g, KILN_OP_RELU, 1, &d, "");
			d = op1(g, KILN_OP_CONV, 2, (uint32_t[]){d, k[6]}, "group=96 pads=1,1,1,1");
			if (!last) {
				d = op1(g, KILN_OP_CONV, 2, (uint32_t[]){d, k[10]}, "");
				d = op1(g, KILN_OP_NEG, 1, &d, "");
			}
			ir_output_add(g, d, NULL);
		}
		ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
		opcase_graph oc = {"cblk", g, {seeded(4, sx1, 0), seeded(4, sx2, 1), seeded(4, sx3, 11)},
		                   {0}, 3, 4, 0};
		cg_module *m = NULL;
		char *kir = matches_then_lowers(&oc, &pn, n, &m);
		int blocked = 0, reads = 0;
		for (const char *p = kir; (p = strstr(p, "c_block=16")); p++)
			blocked++;
		for (const char *p = kir; (p = strstr(p, "b_block=16")); p++)
			reads++;
		ck_assert_msg(blocked == (pn.c_block == 16 ? 3 : 0) && reads == (pn.c_block == 16 ? 2 : 0),
		              "%d GEMMs write blocks, %d read them:\n%s", blocked, reads, kir);
		ck_assert_msg(!pn.c_block || (strstr(kir, "gemm M=64 N=49 K=24 ") &&
		                              strstr(kir, "gemm M=96 N=196 K=40 ") &&
		                              strstr(kir, "b_block=16 alpha=1 beta=0 residual=")),
		              "%s", kir);
		/* the kernel IR's own evaluator reads the blocks alike */
		eval_then_free(&oc, m, kir);
	}
	/* a 5x5 depthwise conv at 20x20 reads its blocks in place
	 * (cg_dw_direct_ok: 256 of 400 outputs have every tap inside, the
	 * rest guarded) and writes planes */
	for (int64_t n = 1; n <= 2; n++) {
		kiln_graph *g = kiln_graph_new("cblk5");
		int64_t sx[] = {n, 24, 20, 20}, sw[] = {64, 24, 1, 1}, sd[] = {64, 1, 5, 5}, sb[] = {64};
		kiln_tensor *t[] = {seeded(4, sw, 2), seeded(1, sb, 3), seeded(4, sd, 4), seeded(1, sb, 5)};
		uint32_t k[4];
		constants(g, t, 4, k);
		uint32_t x = input(g, "x", KILN_F32, 4, sx);
		uint32_t a = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x, k[0], k[1]}, "");
		a = op1(g, KILN_OP_RELU, 1, &a, "");
		a = op1(g, KILN_OP_CONV, 3, (uint32_t[]){a, k[2], k[3]}, "group=64 pads=2,2,2,2");
		ir_output_add(g, op1(g, KILN_OP_RELU, 1, &a, ""), NULL);
		ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
		opcase_graph oc = {"cblk5", g, {seeded(4, sx, 0)}, {0}, 1, 1, 0};
		cg_module *m = NULL;
		char *kir = matches_then_lowers(&oc, &pn, n, &m);
		ck_assert_msg(!pn.c_block || strstr(kir, "gemm M=64 N=400 K=24 batch=1"), "%s", kir);
		ck_assert_msg((strstr(kir, "c_block=16") != NULL) == (pn.c_block == 16), "%s", kir);
		eval_then_free(&oc, m, kir);
	}
	/* a 1x1 conv at 36x36 (C wider than the GEMM takes whole: in blocks
	 * of columns) writes blocks for a 3x3 stride-2 depthwise conv, which
	 * reads them in place (its borders guarded) and writes blocks for a
	 * 1x1 conv of 32 channels (one panel of A) */
	for (int64_t n = 1; n <= 2; n++) {
		kiln_graph *g = kiln_graph_new("cblks2");
		int64_t sx[] = {n, 24, 36, 36}, sw[] = {64, 24, 1, 1}, sd[] = {64, 1, 3, 3}, sb[] = {64};
		int64_t sp[] = {32, 64, 1, 1};
		kiln_tensor *t[] = {seeded(4, sw, 2), seeded(1, sb, 3), seeded(4, sd, 4), seeded(1, sb, 5),
		                    seeded(4, sp, 6)};
		uint32_t k[5];
		constants(g, t, 5, k);
		uint32_t x = input(g, "x", KILN_F32, 4, sx);
		uint32_t a = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x, k[0], k[1]}, "");
		a = op1(g, KILN_OP_RELU, 1, &a, "");
		a = op1(g, KILN_OP_CONV, 3, (uint32_t[]){a, k[2], k[3]},
		        "group=64 strides=2,2 pads=1,1,1,1");
		a = op1(g, KILN_OP_RELU, 1, &a, "");
		ir_output_add(g, op1(g, KILN_OP_CONV, 2, (uint32_t[]){a, k[4]}, ""), NULL);
		ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
		opcase_graph oc = {"cblks2", g, {seeded(4, sx, 0)}, {0}, 1, 1, 0};
		cg_module *m = NULL;
		char *kir = matches_then_lowers(&oc, &pn, n, &m);
		ck_assert_msg(!pn.c_block || (strstr(kir, "gemm M=64 N=1296 K=24 batch=1") &&
		                              strstr(kir, "c_block=16") &&
		                              strstr(kir, "gemm M=32 N=324 K=64 batch=1") &&
		                              strstr(kir, "b_block=16")),
		              "%s", kir);
		eval_then_free(&oc, m, kir);
	}
}
END_TEST

/* A squeeze-and-excitation block keeps the depthwise conv's channel
 * blocks (EfficientNet's, MobileNetV3's): its GlobalAveragePool reads them
 * and the Mul by the per-channel scale [N, C, 1, 1] runs over them, so
 * the project 1x1 conv reads its B in blocks (lower.c's blocked_chain,
 * per_channel).  On batch 1 and 2 against the interpreter: 1x1 -> Relu ->
 * 3x3 depthwise at 7x7 -> SiLU -> GAP -> 1x1 -> Relu -> 1x1 -> Sigmoid ->
 * Mul -> Mul by a constant [C, 1, 1] -> 1x1; the kernel IR counts the GEMMs
 * writing and reading blocks where the host has that GEMM; cg_eval
 * matches. */
START_TEST(squeeze_excitation_keeps_channel_blocks)
{
	cg_panels pn = host_panels("squeeze_excitation_keeps_channel_blocks");
	for (int64_t n = 1; n <= 2; n++) {
		kiln_graph *g = kiln_graph_new("seblk");
		int64_t sx[] = {n, 24, 7, 7}, sw1[] = {64, 24, 1, 1}, sb64[] = {64}, sd[] = {64, 1, 3, 3};
		int64_t ss[] = {16, 64, 1, 1}, sb16[] = {16}, se[] = {64, 16, 1, 1}, sk[] = {64, 1, 1};
		int64_t sp[] = {64, 64, 1, 1};
		kiln_tensor *t[] = {seeded(4, sw1, 2), seeded(1, sb64, 3), seeded(4, sd, 4),
		                    seeded(1, sb64, 5), seeded(4, ss, 6), seeded(1, sb16, 7),
		                    seeded(4, se, 8), seeded(1, sb64, 9), seeded(3, sk, 10),
		                    seeded(4, sp, 12)};
		uint32_t k[10];
		constants(g, t, 10, k);
		uint32_t x = input(g, "x", KILN_F32, 4, sx);
		uint32_t a = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x, k[0], k[1]}, "");
		a = op1(g, KILN_OP_RELU, 1, &a, "");
		a = op1(g, KILN_OP_CONV, 3, (uint32_t[]){a, k[2], k[3]}, "group=64 pads=1,1,1,1");
		uint32_t sg = op1(g, KILN_OP_SIGMOID, 1, &a, "");
		a = op1(g, KILN_OP_MUL, 2, (uint32_t[]){a, sg}, "");
		uint32_t q = op1(g, KILN_OP_GLOBAL_AVERAGE_POOL, 1, &a, "");
		q = op1(g, KILN_OP_CONV, 3, (uint32_t[]){q, k[4], k[5]}, "");
		q = op1(g, KILN_OP_RELU, 1, &q, "");
		q = op1(g, KILN_OP_CONV, 3, (uint32_t[]){q, k[6], k[7]}, "");
		q = op1(g, KILN_OP_SIGMOID, 1, &q, "");
		a = op1(g, KILN_OP_MUL, 2, (uint32_t[]){a, q}, "");
		a = op1(g, KILN_OP_MUL, 2, (uint32_t[]){k[8], a}, "");
		ir_output_add(g, op1(g, KILN_OP_CONV, 2, (uint32_t[]){a, k[9]}, ""), NULL);
		ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
		opcase_graph oc = {"seblk", g, {seeded(4, sx, 0)}, {0}, 1, 1, 0};
		cg_module *m = NULL;
		char *kir = matches_then_lowers(&oc, &pn, n, &m);
		bool on = pn.c_block == 16;
		ck_assert_msg((strstr(kir, "gemm M=64 N=49 K=24 ") && strstr(kir, "c_block=16")) == on &&
		              (strstr(kir, "gemm M=64 N=49 K=64 ") && strstr(kir, "b_block=16")) == on,
		              "%s", kir);
		eval_then_free(&oc, m, kir);
	}
}
END_TEST

/* A grouped conv whose groups' output channels fill vectors (conv_grouped's
 * lanes form) writes its result in channel blocks for the 1x1 conv that
 * reads it (cg_grouped_blocked_ok): its tiles store the blocks, no
 * transpose, and the GEMM reads B in blocks.  On batch 1 and 2 against
 * the interpreter: 3x3, groups of 16, Relu folded into the stores, then a
 * 1x1 conv with a residual in its epilogue (RegNetX's block), 32x32 (rows
 * in two chunks, each its part of y's blocks); stride 2 and
 * three groups, its 1x1 conv's result an output; and one whose result is
 * also an output (stored in planes, read so).  The kernel IR counts the
 * GEMMs reading blocks where the host has that GEMM; cg_eval matches. */
START_TEST(grouped_conv_writes_channel_blocks_for_pointwise)
{
	cg_panels pn = host_panels("grouped_conv_writes_channel_blocks_for_pointwise");
	for (int64_t n = 1; n <= 2; n++) {
		kiln_graph *g = kiln_graph_new("gblk");
		int64_t sx1[] = {n, 32, 32, 32}, sx2[] = {n, 48, 15, 15}, sx3[] = {n, 64, 32, 32};
		int64_t sg1[] = {32, 16, 3, 3}, sb32[] = {32}, sp1[] = {64, 32, 1, 1}, sb64[] = {64};
		int64_t sg2[] = {48, 16, 3, 3}, sb48[] = {48}, sp2[] = {64, 48, 1, 1};
		kiln_tensor *t[] = {seeded(4, sg1, 2), seeded(1, sb32, 3), seeded(4, sp1, 4),
		                    seeded(1, sb64, 5), seeded(4, sg2, 6), seeded(1, sb48, 7),
		                    seeded(4, sp2, 8), seeded(4, sg1, 9)};
		uint32_t k[8];
		constants(g, t, 8, k);
		uint32_t x1 = input(g, "x1", KILN_F32, 4, sx1), x2 = input(g, "x2", KILN_F32, 4, sx2);
		uint32_t x3 = input(g, "x3", KILN_F32, 4, sx3);
		uint32_t a = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x1, k[0], k[1]}, "group=2 pads=1,1,1,1");
		a = op1(g, KILN_OP_RELU, 1, &a, "");
		a = op1(g, KILN_OP_CONV, 3, (uint32_t[]){a, k[2], k[3]}, "");
		a = op1(g, KILN_OP_ADD, 2, (uint32_t[]){a, x3}, ""); /* into the GEMM's epilogue */
		a = op1(g, KILN_OP_RELU, 1, &a, "");
		ir_output_add(g, a, NULL);
		uint32_t b = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x2, k[4], k[5]},
		                 "group=3 strides=2,2 pads=1,1,1,1");
		b = op1(g, KILN_OP_RELU, 1, &b, "");
		ir_output_add(g, op1(g, KILN_OP_CONV, 2, (uint32_t[]){b, k[6]}, ""), NULL);
		/* read by a 1x1 conv and the graph's output: planes */
		uint32_t c = op1(g, KILN_OP_CONV, 3, (uint32_t[]){x1, k[7], k[1]}, "group=2 pads=1,1,1,1");
		ir_output_add(g, c, NULL);
		ir_output_add(g, op1(g, KILN_OP_CONV, 2, (uint32_t[]){c, k[2]}, ""), NULL);
		ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
		opcase_graph oc = {"gblk", g, {seeded(4, sx1, 0), seeded(4, sx2, 1), seeded(4, sx3, 11)},
		                   {0}, 3, 4, 0};
		cg_module *m = NULL;
		char *kir = matches_then_lowers(&oc, &pn, n, &m);
		int reads = 0;
		for (const char *p = kir; (p = strstr(p, "b_block=16")); p++)
			reads++;
		ck_assert_msg(reads == (pn.c_block == 16 ? 2 : 0), "%d GEMMs read blocks:\n%s", reads, kir);
		ck_assert_msg(pn.c_block != 16 || (strstr(kir, "gemm M=64 N=1024 K=32 b") &&
		                                   strstr(kir, "b_block=16 alpha=1 beta=0 bias=") &&
		                                   strstr(kir, "residual=")),
		              "%s", kir);
		eval_then_free(&oc, m, kir);
	}
}
END_TEST

/* A 7x7 map pays for Winograd only from a batch of 4 (lower_wino.c): with
 * a symbolic batch both algorithms are compiled, each kernel guarded by
 * the batch, and the Relu and the residual Add after the conv fold into
 * both.  The same library at batch 1 (im2col) and 5 (Winograd) matches
 * the interpreter, and the kernel IR shows the guards. */
START_TEST(batch_chosen_conv_matches_the_interpreter)
{
	static const char *text =
		"graph @pick(%x: f32[N,16,7,7], %w: f32[16,16,3,3], %b: f32[16]) -> (%z: f32[N,16,7,7]) {\n"
		"  %c = conv %x, %w, %b {pads=[1,1,1,1]} : f32[N,16,7,7]\n"
		"  %s = add %c, %x : f32[N,16,7,7]\n"
		"  %y = relu %s : f32[N,16,7,7]\n"
		"  %z = neg %y : f32[N,16,7,7]\n"
		"  ret %z\n"
		"}\n";
	char dir[] = "/tmp/kiln_pick.XXXXXX", kir[1200];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(kir, sizeof kir, "%s/pick.kir", dir);
	for (int64_t n = 1; n <= 5; n += 4) {
		kiln_graph *g = NULL;
		kiln_error e = {0};
		ck_assert_msg(ir_parse(text, "pick.kir", &g, &e) == KILN_OK, "%s", e.msg);
		int64_t sx[] = {n, 16, 7, 7}, sw[] = {16, 16, 3, 3}, sb[] = {16};
		opcase_graph c = {"pick", g, {seeded(4, sx, 0), seeded(4, sw, 1), seeded(1, sb, 2)},
		                  {0}, 3, 1, 0};
		float *w = c.in[1]->data; /* outputs O(1): 1e-4 is relative */
		for (int64_t i = 0; i < kiln_tensor_numel(c.in[1]); i++)
			w[i] /= 12;
		char why[1400] = "";
		ck_assert_msg(case_matches(&c, false, why, sizeof why), "batch %lld: %s", (long long)n, why);
		if (n == 1) {
			kiln_compile_opts o = {.emit = "kir"};
			ck_assert_msg(kiln_compile(g, kir, &o, &e) == KILN_OK, "%s", e.msg);
			FILE *f = fopen(kir, "r");
			char buf[1 << 16];
			size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
			buf[len] = 0;
			if (f)
				fclose(f);
			ck_assert_msg(strstr(buf, "if N < 4 {") && strstr(buf, "if N >= 4 {"),
			              "no guarded kernels in:\n%s", buf);
			ck_assert_msg(!strstr(buf, "_relu") && !strstr(buf, "_add"),
			              "Relu or Add not folded into both algorithms:\n%s", buf);
			unlink(kir);
		}
		opcase_free(&c);
	}
	rmdir(dir);
	/* the same with a constant filter, which the Winograd half of the
	 * choice still transforms at run time (the library does not carry both
	 * the filter and its 4x larger transform) */
	for (int64_t n = 1; n <= 5; n += 4) {
		kiln_graph *g = kiln_graph_new("pickc");
		int64_t N = kiln_sym(g, "N"), dx[] = {N, 16, 7, 7};
		int64_t sx[] = {n, 16, 7, 7}, sw[] = {16, 16, 3, 3}, sb[] = {16};
		kiln_tensor *wt = seeded_scaled(4, sw, 1, 1.0 / 12), *bt = seeded(1, sb, 2);
		uint32_t x = kiln_input(g, "x", KILN_F32, 4, dx);
		uint32_t y = op1(g, KILN_OP_CONV, 3,
		                 (uint32_t[]){x, kiln_constant(g, wt), kiln_constant(g, bt)},
		                 "pads=1,1,1,1");
		y = op1(g, KILN_OP_ADD, 2, (uint32_t[]){y, x}, "");
		y = op1(g, KILN_OP_RELU, 1, &y, "");
		ir_output_add(g, op1(g, KILN_OP_NEG, 1, &y, ""), NULL);
		kiln_tensor_free(wt), kiln_tensor_free(bt);
		opcase_graph c = {"pickc", g, {seeded(4, sx, 0)}, {0}, 1, 1, 0};
		char why[1400] = "";
		ck_assert_msg(case_matches(&c, false, why, sizeof why), "constant filter, batch %lld: %s",
		              (long long)n, why);
		opcase_free(&c);
	}
}
END_TEST

/* ---- fused recurrent ops over a symbolic sequence length --------------------------- */

/* One library for every (T, N): a bidirectional LSTM with sequence_lens,
 * peepholes, input_forget, clip and non-default activations, and on its
 * input a batch-first GRU (reset before the product) with initial_h; run
 * at three sizes, each against the interpreter, then with a length past T,
 * which the library refuses as the interpreter does.  konst: R of both a
 * constant instead of an input (the lowering stores it transposed). */
static void rnns_case(const char *text, int konst)
{
	kiln_graph *g = NULL;
	kiln_error e = {0};
	ck_assert_msg(ir_parse(text, "rnns.kir", &g, &e) == KILN_OK, "%s", e.msg);
	if (konst) { /* R of both nodes a constant (the same values): stored transposed */
		for (uint32_t i = 0, nn = g->nnode; i < nn; i++) {
			ir_node *n = g->node[i];
			if (n->op != KILN_OP_LSTM && n->op != KILN_OP_GRU)
				continue;
			const ir_type *t = &g->val[n->in[2]]->type;
			kiln_tensor *r = seeded(3, t->dim, n->op == KILN_OP_LSTM ? 2 : 7);
			ir_set_input(g, n, 2, kiln_constant(g, r));
			kiln_tensor_free(r);
		}
		ck_assert_int_eq(ir_toposort(g), KILN_OK);
	}
	char dir[] = "/tmp/kiln_rnns.XXXXXX", so[1200];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(so, sizeof so, "%s/rnns.so", dir);
	kiln_compile_opts o = {.name = "rnns"};
	ck_assert_msg(kiln_compile(g, so, &o, &e) == KILN_OK, "%s", e.msg);
	kiln_model *m = NULL;
	ck_assert_msg(kiln_load(so, &m, &e) == KILN_OK, "%s", e.msg);
	static const int64_t sizes[][2] = {{3, 2}, {7, 1}, {1, 4}, {5, 3}}; /* T, N */
	for (int c = 0; c < 4; c++) {
		int64_t T = sizes[c][0], N = sizes[c][1];
		kiln_tensor *in[10] = {
			seeded(3, (int64_t[]){T, N, 3}, 0), seeded(3, (int64_t[]){2, 8, 3}, 1),
			seeded(3, (int64_t[]){2, 8, 2}, 2), seeded(2, (int64_t[]){2, 16}, 3),
			kiln_tensor_new(KILN_I64, 1, &N), seeded(2, (int64_t[]){2, 6}, 4),
			seeded(3, (int64_t[]){N, T, 3}, 5), seeded(3, (int64_t[]){1, 9, 3}, 6),
			seeded(3, (int64_t[]){1, 9, 3}, 7), seeded(3, (int64_t[]){N, 1, 3}, 8)};
		int64_t *len = in[4]->data;
		for (int64_t b = 0; b < N; b++) /* T, then shorter rows (0 too) */
			len[b] = b ? (T + b) % (T + 1) : T;
		if (c == 3)
			len[N - 1] = T + 1;
		kiln_tensor *want[5] = {0}, *got[5] = {0};
		kiln_status si = kiln_graph_run(g, in, 10, want, 5, &e);
		kiln_status sc = kiln_model_run(m, in, 10, got, 5, &e);
		if (c == 3) { /* a length past T: both refuse */
			ck_assert_int_eq(si, KILN_EINVAL);
			ck_assert_int_eq(sc, KILN_EINVAL);
			ck_assert_msg(strstr(e.msg, "LSTM") && strstr(e.msg, "sequence_lens value 6 out "
			              "of range [0, 6)"), "%s", e.msg);
		} else {
			ck_assert_msg(si == KILN_OK && sc == KILN_OK, "T %lld N %lld konst %d: %s",
			              (long long)T, (long long)N, konst, e.msg);
			for (int k = 0; k < 5; k++) {
				double err = max_err("rnns", k, got[k], want[k]);
				ck_assert_msg(err <= 1e-5, "T %lld N %lld konst %d out%d: max error %g",
				              (long long)T, (long long)N, konst, k, err);
			}
		}
		for (int k = 0; k < 10; k++)
			kiln_tensor_free(in[k]);
		for (int k = 0; k < 5; k++)
			kiln_tensor_free(want[k]), kiln_tensor_free(got[k]);
	}
	kiln_model_free(m);
	kiln_graph_free(g);
	tu_remove_dir(dir);
}

START_TEST(fused_rnns_run_at_any_sequence_length_with_one_library)
{
	static const char *text =
		"graph @rnns(%x: f32[T,N,3], %w: f32[2,8,3], %r: f32[2,8,2], %b: f32[2,16], "
		"%l: i64[N], %p: f32[2,6], %xg: f32[N,T,3], %wg: f32[1,9,3], %rg: f32[1,9,3], "
		"%h: f32[N,1,3]) -> (%y: f32[T,2,N,2], %yh: f32[2,N,2], %yc: f32[2,N,2], "
		"%g: f32[N,T,1,3], %gh: f32[N,1,3]) {\n"
		"  %y, %yh, %yc = lstm %x, %w, %r, %b, %l, %p {activation_alpha=[0.5], "
		"activations=\"LeakyRelu,Tanh,Softsign\", clip=1.5, direction=\"bidirectional\", "
		"hidden_size=2, input_forget=1, inputs=[3,4,7]} : f32[T,2,N,2], f32[2,N,2], f32[2,N,2]\n"
		"  %g, %gh = gru %xg, %wg, %rg, %h {hidden_size=3, inputs=[5], layout=1} : "
		"f32[N,T,1,3], f32[N,1,3]\n"
		"  ret %y, %yh, %yc, %g, %gh\n"
		"}\n";
	for (int konst = 0; konst < 2; konst++)
		rnns_case(text, konst);
}
END_TEST

/* ---- data-dependent indices out of range ------------------------------------------ */

/* g: one named node over two inputs (data f32, indices/targets) and one
 * output, so its typed entry point is name_run(ctx, data, idx, out). */
static kiln_graph *indexed2(const char *name, kiln_op op, const char *attrs, kiln_dtype xt,
                            int rank_x, const int64_t *dx, kiln_dtype it, int rank_i,
                            const int64_t *di)
{
	kiln_graph *g = kiln_graph_new(name);
	uint32_t in[2] = {input(g, "x", xt, rank_x, dx), input(g, "i", it, rank_i, di)};
	ir_output_add(g, op1(g, op, 2, in, attrs), NULL);
	g->node[g->nnode - 1]->name = ir_intern(g, "pick");
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

/* f32 results: Gather's copies are exact, a loss's mean within 1e-6;
 * integers exact. */
static void assert_near(const void *gotp, const kiln_tensor *ref, const char *what)
{
	const float *got = gotp;
	if (ref->dtype != KILN_F32) {
		ck_assert_msg(!memcmp(gotp, ref->data, kiln_tensor_nbytes(ref)), "%s differs", what);
		return;
	}
	for (int64_t i = 0; i < kiln_tensor_numel(ref); i++) {
		float w = ((const float *)ref->data)[i];
		ck_assert_msg(fabsf(got[i] - w) <= 1e-6f * (1 + fabsf(w)), "%s: [%lld] %g, "
		              "interpreter %g", what, (long long)i, got[i], w);
	}
}

static kiln_graph *indexed(const char *name, kiln_op op, const char *attrs, int rank_x,
                           const int64_t *dx, kiln_dtype it, int rank_i, const int64_t *di)
{
	return indexed2(name, op, attrs, KILN_F32, rank_x, dx, it, rank_i, di);
}

typedef void *(*ix_create_fn)(void);
typedef int (*ix_run_fn)(void *, const void *, const void *, void *);
typedef const char *(*ix_errmsg_fn)(const void *);
typedef void (*ix_destroy_fn)(void *);

static void *ix_sym(void *h, const char *name, const char *what)
{
	char s[128];
	snprintf(s, sizeof s, "%s_%s", name, what);
	void *p = dlsym(h, s);
	ck_assert_msg(p != NULL, "%s: %s", s, dlerror());
	return p;
}

/* Runs g on in (x, idx) in the interpreter, through kiln_load and through
 * the typed entry point.  want NULL: all three succeed and agree exactly;
 * else all three fail with EINVAL and every message holds want and
 * "<Op> 'pick'" (node), and the library's holds bound too.  A failed run
 * leaves the context usable: the same context then runs good (in range). */
static void run_indexed(kiln_graph *g, kiln_tensor *x, kiln_tensor *idx, const char *want,
                        const char *bound, kiln_tensor *good)
{
	const char *name = kiln_graph_name(g), *op = ir_op(g->node[g->nnode - 1]->op)->onnx;
	char node[64];
	snprintf(node, sizeof node, "%s 'pick'", op);
	kiln_tensor *in[2] = {x, idx}, *ref = NULL, *got = NULL;
	kiln_error e = {0};
	kiln_status st = kiln_graph_run(g, in, 2, &ref, 1, &e);
	if (want) {
		ck_assert_int_eq(st, KILN_EINVAL);
		ck_assert_msg(strstr(e.msg, want) && strstr(e.msg, node), "interpreter: %s", e.msg);
	} else {
		ck_assert_msg(st == KILN_OK, "interpreter: %s", e.msg);
	}
	char dir[] = "/tmp/kiln_compiled_ix.XXXXXX", so[1200];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(so, sizeof so, "%s/%s.so", dir, name);
	ck_assert_msg(kiln_compile(g, so, &(kiln_compile_opts){.name = name}, &e) == KILN_OK,
	              "%s", e.msg);
	kiln_model *m = NULL;
	ck_assert_msg(kiln_load(so, &m, &e) == KILN_OK, "%s", e.msg);
	st = kiln_model_run(m, in, 2, &got, 1, &e);
	if (want) {
		ck_assert_int_eq(st, KILN_EINVAL);
		ck_assert_msg(strstr(e.msg, want) && strstr(e.msg, node) && strstr(e.msg, bound),
		              "kiln_model_run: %s", e.msg);
		ck_assert_ptr_null(got);
	} else {
		ck_assert_msg(st == KILN_OK, "kiln_model_run: %s", e.msg);
		ck_assert_int_eq(kiln_tensor_numel(got), kiln_tensor_numel(ref));
		assert_near(got->data, ref, "kiln_model_run");
	}
	kiln_model_free(m);
	/* the library's own driver, through its typed entry point */
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h != NULL, "%s", dlerror());
	void *ctx = ((ix_create_fn)ix_sym(h, name, "create"))();
	ix_run_fn run = (ix_run_fn)ix_sym(h, name, "run");
	ix_errmsg_fn errmsg = (ix_errmsg_fn)ix_sym(h, name, "errmsg");
	ck_assert_ptr_nonnull(ctx);
	int64_t out[64] = {0};
	int rc = run(ctx, x->data, idx->data, out);
	if (want) {
		ck_assert_int_eq(rc, KILN_EINVAL);
		const char *msg = errmsg(ctx);
		ck_assert_msg(strstr(msg, want) && strstr(msg, node) && strstr(msg, bound),
		              "%s_run: %s", name, msg);
		ck_assert_int_eq(run(ctx, x->data, good->data, out), KILN_OK);
	} else {
		ck_assert_msg(rc == KILN_OK, "%s_run: %s", name, errmsg(ctx));
		assert_near(out, ref, "typed run");
	}
	((ix_destroy_fn)ix_sym(h, name, "destroy"))(ctx);
	dlclose(h);
	kiln_tensor_free(ref), kiln_tensor_free(got);
	char cmd[1300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

static const double X20[20] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                               11, 12, 13, 14, 15, 16, 17, 18, 19, 20};

/* Gather on axis 0 (i64 indices) and axis 1 (i32): an index just past
 * either end is refused as the interpreter refuses it, never clamped to a
 * row; -dim and dim-1 are fine. */
START_TEST(gather_index_out_of_range_is_an_error)
{
	const int64_t dx[2] = {5, 4}, di[1] = {4}, di2[2] = {2, 2};
	kiln_tensor *x = tensor(KILN_F32, 2, dx, X20);
	kiln_tensor *good = tensor(KILN_I64, 1, di, (double[]){0, -5, 4, -1});
	kiln_tensor *past = tensor(KILN_I64, 1, di, (double[]){0, -5, 5, 1});
	kiln_tensor *below = tensor(KILN_I64, 1, di, (double[]){0, -6, 4, 1});
	kiln_graph *g = indexed("gather0", KILN_OP_GATHER, "axis=0", 2, dx, KILN_I64, 1, di);
	run_indexed(g, x, good, NULL, NULL, NULL);
	run_indexed(g, x, past, "index 5 out of range", "[-5, 5)", good);
	run_indexed(g, x, below, "index -6 out of range", "[-5, 5)", good);
	kiln_graph_free(g);
	kiln_tensor *good1 = tensor(KILN_I32, 2, di2, (double[]){3, -4, 0, -1});
	kiln_tensor *bad1 = tensor(KILN_I32, 2, di2, (double[]){3, -4, 4, -1});
	g = indexed("gather1", KILN_OP_GATHER, "axis=1", 2, dx, KILN_I32, 2, di2);
	run_indexed(g, x, good1, NULL, NULL, NULL);
	run_indexed(g, x, bad1, "index 4 out of range", "[-4, 4)", good1);
	kiln_graph_free(g);
	kiln_tensor_free(x), kiln_tensor_free(good), kiln_tensor_free(past);
	kiln_tensor_free(below), kiln_tensor_free(good1), kiln_tensor_free(bad1);
}
END_TEST

/* Attributes holding S (dynseq_kir in op_cases.h): one library runs at
 * S = 3 and S = 5, each exactly what S gives, and refuses S = 9, past the
 * slice's 8-long axis, before any read outside it, naming the slice. */
START_TEST(symbolic_attributes_compile_for_every_length)
{
	kiln_graph *g = dynseq_graph();
	kiln_error e = {0};
	char dir[] = "/tmp/kiln_compiled_dyn.XXXXXX", so[1200];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(so, sizeof so, "%s/dynseq.so", dir);
	ck_assert_msg(kiln_compile(g, so, &(kiln_compile_opts){.name = "dynseq"}, &e) == KILN_OK,
	              "%s", e.msg);
	kiln_model *m = NULL;
	ck_assert_msg(kiln_load(so, &m, &e) == KILN_OK, "%s", e.msg);
	static const int64_t lens[] = {3, 5, 9};
	for (int i = 0; i < 3; i++) {
		int64_t s = lens[i];
		kiln_tensor *in[2], *out[3] = {0};
		dynseq_inputs(s, in);
		kiln_status st = kiln_model_run(m, in, 2, out, 3, &e);
		if (s > 8) {
			ck_assert_int_eq(st, KILN_EINVAL);
			ck_assert_msg(strstr(e.msg, "dynseq.kir:3: Slice: axis 1 end S = 9 out of "
			                     "range [0, 9)"), "%s", e.msg);
			ck_assert_ptr_null(out[0]);
		} else {
			ck_assert_msg(st == KILN_OK, "%s", e.msg);
			dynseq_expect("library", s, out);
		}
		for (int k = 0; k < 3; k++)
			kiln_tensor_free(out[k]);
		kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	}
	kiln_model_free(m);
	tu_remove_dir(dir);
	kiln_graph_free(g);
}
END_TEST

/* NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss targets: outside
 * [0, C) is the interpreter's error unless it is the ignore_index, which
 * may lie outside (PyTorch's -100). */
START_TEST(loss_target_out_of_range_is_an_error)
{
	const int64_t dx[2] = {5, 4}, dt[1] = {5};
	kiln_tensor *x = tensor(KILN_F32, 2, dx, X20);
	kiln_tensor *good = tensor(KILN_I64, 1, dt, (double[]){0, 3, -100, 1, 2});
	kiln_tensor *past = tensor(KILN_I64, 1, dt, (double[]){0, 3, 4, 1, 2});
	kiln_tensor *neg = tensor(KILN_I64, 1, dt, (double[]){0, 3, -1, 1, 2});
	kiln_graph *g = indexed("nll", KILN_OP_NLL_LOSS, "ignore_index=-100", 2, dx, KILN_I64, 1,
	                        dt);
	run_indexed(g, x, good, NULL, NULL, NULL);
	run_indexed(g, x, past, "target 4 out of range", "[0, 4)", good);
	run_indexed(g, x, neg, "target -1 out of range", "[0, 4)", good);
	kiln_graph_free(g);
	g = indexed("sce", KILN_OP_SOFTMAX_CE, "reduction=none", 2, dx, KILN_I64, 1, dt);
	kiln_tensor *good2 = tensor(KILN_I64, 1, dt, (double[]){0, 3, 2, 1, 2});
	run_indexed(g, x, good2, NULL, NULL, NULL);
	run_indexed(g, x, past, "target 4 out of range", "[0, 4)", good2);
	kiln_graph_free(g);
	kiln_tensor_free(x), kiln_tensor_free(good), kiln_tensor_free(past);
	kiln_tensor_free(neg), kiln_tensor_free(good2);
}
END_TEST

/* An integer Div by zero is the interpreter's error, whichever operand
 * broadcasts; the kernel must not trap or give 0 either. */
START_TEST(integer_division_by_zero_is_an_error)
{
	const int64_t d6[1] = {6}, d1[1] = {1};
	static const kiln_dtype dts[2] = {KILN_I32, KILN_I64};
	for (int k = 0; k < 2; k++) {
		kiln_tensor *x = tensor(dts[k], 1, d6, (double[]){7, -7, 100, 3, -9, 0});
		kiln_tensor *good = tensor(dts[k], 1, d6, (double[]){2, 2, -3, 1, -1, 5});
		kiln_tensor *zero = tensor(dts[k], 1, d6, (double[]){2, 2, -3, 0, -1, 5});
		kiln_graph *g = indexed2(k ? "div64" : "div32", KILN_OP_DIV, "", dts[k], 1, d6,
		                         dts[k], 1, d6);
		run_indexed(g, x, good, NULL, NULL, NULL);
		run_indexed(g, x, zero, "integer division by zero", "kernel k0_div", good);
		kiln_graph_free(g);
		kiln_tensor *zero1 = tensor(dts[k], 1, d1, (double[]){0});
		kiln_tensor *four = tensor(dts[k], 1, d1, (double[]){4});
		g = indexed2(k ? "divb64" : "divb32", KILN_OP_DIV, "", dts[k], 1, d6, dts[k], 1, d1);
		run_indexed(g, x, four, NULL, NULL, NULL);
		run_indexed(g, x, zero1, "integer division by zero", "kernel k0_div", four);
		kiln_graph_free(g);
		kiln_tensor_free(x), kiln_tensor_free(good), kiln_tensor_free(zero);
		kiln_tensor_free(zero1), kiln_tensor_free(four);
	}
}
END_TEST

/* A QuantizeLinear scale that arrives at run time is checked before the
 * op runs, as the interpreter checks it: zero, negative, NaN and infinite
 * scales fail the run naming the node; a good one quantizes exactly. */
START_TEST(runtime_scales_are_checked_by_the_library)
{
	const int64_t d6[1] = {6}, d1[1] = {1};
	kiln_tensor *x = tensor(KILN_F32, 1, d6, (double[]){0.1, 0.2, -3, 4, 1e9, -1e9});
	kiln_tensor *good = tensor(KILN_F32, 1, d1, (double[]){0.2});
	kiln_graph *g = indexed2("qscale", KILN_OP_QUANTIZE_LINEAR, "", KILN_F32, 1, d6, KILN_F32,
	                         1, d1);
	run_indexed(g, x, good, NULL, NULL, NULL);
	static const double bad[] = {0, -1, NAN, INFINITY};
	for (int k = 0; k < 4; k++) {
		kiln_tensor *s = tensor(KILN_F32, 1, d1, &bad[k]);
		run_indexed(g, x, s, "a scale must be positive and finite", "y_scale", good);
		kiln_tensor_free(s);
	}
	kiln_graph_free(g);
	kiln_tensor_free(x), kiln_tensor_free(good);
}
END_TEST

/* ---- 8-bit GEMMs ------------------------------------------------------------------ */

static uint64_t qstate = 0x2545f4914f6cdd1dULL;

/* A uniform integer in [lo, hi]. */
static double qrand(int lo, int hi)
{
	qstate ^= qstate << 13, qstate ^= qstate >> 7, qstate ^= qstate << 17;
	return lo + (double)(qstate % (uint64_t)(hi - lo + 1));
}

static kiln_tensor *qtensor(kiln_dtype dt, int rank, const int64_t *shape, int lo, int hi)
{
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= shape[d];
	double *v = malloc((n ? n : 1) * sizeof *v);
	for (int64_t i = 0; i < n; i++)
		v[i] = qrand(lo, hi);
	kiln_tensor *t = tensor(dt, rank, shape, v);
	free(v);
	return t;
}

/* Values of an 8-bit dtype: [0, 255] or [-128, 127]. */
static int qlo(kiln_dtype dt) { return dt == KILN_U8 ? 0 : -128; }
static int qhi(kiln_dtype dt) { return dt == KILN_U8 ? 255 : 127; }

/* Scales in [lo, hi) (n of them; rank 0 for one) */
static kiln_tensor *scales(int64_t n, double lo, double hi)
{
	double *v = malloc(n * sizeof *v);
	for (int64_t i = 0; i < n; i++)
		v[i] = lo + (hi - lo) * qrand(0, 1000) / 1000;
	kiln_tensor *t = tensor(KILN_F32, n > 1, &n, v);
	free(v);
	return t;
}

/* An operand of g: an input named name of t's type, or with fixed a
 * Constant holding t (weights, scales and zero points known at compile
 * time, which the lowering folds: codegen/lower_nn.c, folded_bias). */
static uint32_t operand(kiln_graph *g, const char *name, const kiln_tensor *t, bool fixed)
{
	if (!fixed)
		return input(g, name, t->dtype, t->rank, t->shape);
	ir_node *c = ir_node_new(g, KILN_OP_CONSTANT, 0, NULL, 1, KILN_HERE);
	ck_assert_ptr_nonnull(c);
	ck_assert_int_eq(ir_attr_set_tensor(g, c, "value", t), KILN_OK);
	ck_assert_int_eq(ir_infer_node(g, c), KILN_OK);
	return c->out[0];
}

/* The library against the interpreter on an integer op's graph.  i32
 * results must agree exactly; an 8-bit result may differ by one step
 * where the product of the sum and the multiplier lies within f32
 * rounding of a tie (the interpreter multiplies in f64 as ONNX's
 * reference, the kernels in f32 as ONNX Runtime's), at most 1 element in
 * 500.  The result must also spread over the range (a test of a constant
 * output would prove nothing). */
static void int_op_matches(const char *name, kiln_graph *g, kiln_tensor **in, int nin)
{
	kiln_tensor *want = NULL, *got = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s: %s", name, kiln_graph_errmsg(g));
	ck_assert_msg(kiln_graph_run(g, in, nin, &want, 1, &err) == KILN_OK, "%s: %s", name, err.msg);
	char dir[] = "/tmp/kiln_int8_gemm.XXXXXX";
	ck_assert_ptr_nonnull(mkdtemp(dir));
	kiln_status st = compile_and_run(g, dir, name, in, nin, &got, 1, &err);
	tu_remove_dir(dir);
	ck_assert_msg(st == KILN_OK, "%s: %s", name, err.msg);
	ck_assert_int_eq(got->dtype, want->dtype);
	int64_t n = kiln_tensor_numel(want), off = 0;
	double worst = 0, lo = INFINITY, hi = -INFINITY;
	ck_assert_int_eq(kiln_tensor_numel(got), n);
	for (int64_t i = 0; i < n; i++) {
		double a = ir_load(got, i), b = ir_load(want, i);
		off += a != b;
		worst = fabs(a - b) > worst ? fabs(a - b) : worst;
		lo = b < lo ? b : lo, hi = b > hi ? b : hi;
	}
	bool exact = want->dtype == KILN_I32;
	ck_assert_msg(exact ? off == 0 : worst <= 1 && off * 500 <= n,
	              "%s: %lld of %lld elements differ, by up to %g", name, (long long)off,
	              (long long)n, worst);
	ck_assert_msg(hi - lo >= (exact ? 1000 : 60), "%s: results span only [%g, %g]", name, lo, hi);
	kiln_tensor_free(want), kiln_tensor_free(got);
}

/* QLinearConv and ConvInteger through the 8-bit GEMM against the
 * interpreter: every signedness of x and w (u8 x s8 as ORT's quantizer
 * writes, and the three others, which flip B), per-channel and per-tensor
 * weight scales and zero points, u8 and s8 results, with and without
 * bias; a 7x7 stride-2 stem (K = 147, not a multiple of 4), 13 output
 * channels (not a multiple of the tile's 6 rows) over 81 pixels (two
 * column panels), a 1x1 conv (the GEMM on x itself), convs on padded
 * phase planes (conv_wide: asymmetric pads, dilation, strides 2 and 3, a
 * strided 1x1), 2 groups, a map
 * big enough for the chunked im2col, and depthwise convs (one with two
 * outputs per channel, stride 2; a 5x5 ConvInteger; planes in chunks);
 * padding must read as x's zero point. */
START_TEST(int8_convs_match_the_interpreter)
{
	static const struct {
		int64_t n, c, m, h, w, k, grp;
		const char *attrs;
		kiln_dtype xt, wt, yt;
		bool per_channel, bias, integer;
	} cases[] = {
		{1, 3, 8, 13, 13, 7, 1, "strides=2,2 pads=3,3,3,3", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{2, 16, 13, 9, 9, 3, 1, "pads=1,1,1,1", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{1, 70, 64, 5, 5, 1, 1, "", KILN_I8, KILN_I8, KILN_I8, false, false, false},
		{1, 16, 16, 6, 7, 3, 2, "pads=1,0,1,2", KILN_U8, KILN_U8, KILN_U8, true, true, false},
		{1, 8, 12, 9, 9, 3, 1, "pads=1,1,1,1 strides=2,2", KILN_I8, KILN_U8, KILN_U8, false, true, false},
		{1, 4, 8, 70, 66, 3, 1, "pads=1,1,1,1", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{2, 10, 9, 7, 7, 3, 1, "pads=1,1,1,1", KILN_U8, KILN_U8, KILN_I32, true, false, true},
		/* on phase planes (conv_wide): padding on some sides only and
		 * dilated, none at all with an even kernel, strides 2 and 3 with
		 * dilation, a strided 1x1 (one phase of four read) */
		{1, 5, 7, 11, 10, 3, 1, "pads=0,1,2,1 dilations=2,1", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{2, 6, 9, 8, 9, 2, 1, "", KILN_I8, KILN_I8, KILN_I8, false, false, false},
		{1, 4, 6, 13, 14, 3, 1, "strides=2,3 pads=1,0,2,2 dilations=1,2", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{2, 8, 5, 9, 8, 1, 1, "strides=2,2", KILN_U8, KILN_I8, KILN_I32, true, false, true},
		{1, 24, 20, 6, 6, 1, 1, "", KILN_I8, KILN_I8, KILN_I32, false, false, true},
		/* depthwise: exact sums on the f32 depthwise kernels */
		{1, 16, 16, 10, 9, 3, 16, "pads=1,1,1,1", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{2, 8, 16, 13, 12, 3, 8, "pads=1,1,1,1 strides=2,2", KILN_U8, KILN_U8, KILN_U8, true, true, false},
		{1, 12, 12, 9, 9, 5, 12, "pads=2,2,2,2", KILN_I8, KILN_I8, KILN_I32, true, false, true},
		/* QLinearConv depthwise requantizing in the kernel's own stores:
		 * flat rows (9 columns), per-row columns (40), split stride 2 */
		{1, 16, 16, 12, 9, 3, 16, "pads=1,1,1,1", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{2, 8, 8, 10, 40, 3, 8, "pads=1,1,1,1", KILN_U8, KILN_I8, KILN_U8, false, true, false},
		{1, 8, 8, 34, 36, 3, 8, "pads=1,1,1,1 strides=2,2", KILN_U8, KILN_I8, KILN_I8, true, false, false},
		/* ... its rows with every tap inside apart (no row tests): 5x5
		 * (two edge rows each side), padding on some sides only, none at
		 * all, a plane too short to have such rows, 56 columns, stride 2
		 * with odd rows */
		{1, 8, 8, 20, 40, 5, 8, "pads=2,2,2,2", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{2, 4, 4, 14, 36, 3, 4, "pads=0,1,2,1", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{1, 4, 4, 9, 40, 3, 4, "", KILN_U8, KILN_I8, KILN_I8, false, true, false},
		{1, 4, 4, 3, 40, 5, 4, "pads=2,2,2,2", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{1, 6, 6, 14, 56, 3, 6, "pads=1,1,1,1", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{1, 4, 4, 15, 41, 3, 4, "pads=1,1,1,1 strides=2,2", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		/* ... planes in chunks (16 or more channels: dw_chunk) sharing
		 * their scratch copies: converted per plane (40 columns), flat
		 * padded, split whole and split by rows (66 x 66), two images */
		{2, 48, 48, 10, 40, 3, 48, "pads=1,1,1,1", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{2, 32, 32, 12, 9, 3, 32, "pads=1,1,1,1", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{2, 40, 40, 20, 22, 3, 40, "pads=1,1,1,1 strides=2,2", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{1, 24, 24, 66, 66, 3, 24, "pads=1,1,1,1 strides=2,2", KILN_U8, KILN_I8, KILN_U8, true, false, false},
		/* ... flat planes whose rows go out in whole vectors, the last
		 * exact: 14 and 28 columns (MobileNetV2's), 5x5 */
		{2, 16, 16, 14, 14, 3, 16, "pads=1,1,1,1", KILN_U8, KILN_I8, KILN_U8, true, true, false},
		{1, 16, 16, 28, 28, 5, 16, "pads=2,2,2,2", KILN_U8, KILN_I8, KILN_I8, false, true, false},
	};
	const size_t ncase = sizeof cases / sizeof *cases;
	for (size_t r = 0; r < 2 * ncase; r++) {
		/* each case twice: operands as inputs, then as constants */
		size_t i = r % ncase;
		bool fixed = r >= ncase;
		char name[32], attrs[96];
		snprintf(name, sizeof name, "int8conv%zu%s", i, fixed ? "_fixed" : "");
		snprintf(attrs, sizeof attrs, "group=%lld %s", (long long)cases[i].grp, cases[i].attrs);
		kiln_dtype xt = cases[i].xt, wt = cases[i].wt, yt = cases[i].yt;
		int64_t M = cases[i].m, K = cases[i].c / cases[i].grp * cases[i].k * cases[i].k;
		int64_t sx[] = {cases[i].n, cases[i].c, cases[i].h, cases[i].w};
		int64_t sw[] = {M, cases[i].c / cases[i].grp, cases[i].k, cases[i].k}, sv = M;
		int64_t nv = cases[i].per_channel ? M : 1;
		kiln_graph *g = kiln_graph_new(name);
		kiln_tensor *in[9] = {0};
		uint32_t v[9];
		int nin;
		in[0] = qtensor(xt, 4, sx, qlo(xt), qhi(xt));
		v[0] = input(g, "x", xt, 4, sx);
		if (cases[i].integer) { /* ConvInteger: x, w, x_zp, w_zp (per channel or not) */
			in[1] = qtensor(wt, 4, sw, qlo(wt), qhi(wt));
			in[2] = qtensor(xt, 0, NULL, qlo(xt) + 20, qhi(xt) - 20);
			in[3] = qtensor(wt, nv > 1, &nv, qlo(wt) + 50, qhi(wt) - 50);
			v[1] = operand(g, "w", in[1], fixed);
			v[2] = operand(g, "xz", in[2], fixed);
			v[3] = operand(g, "wz", in[3], fixed);
			nin = 4;
			ir_output_add(g, op1(g, KILN_OP_CONV_INTEGER, 4, v, attrs), NULL);
		} else { /* QLinearConv: x, xs, xz, w, ws, wz, ys, yz[, bias] */
			double step = 0.02 * 0.01 * sqrt((double)K) * 128 * 40 / 255;
			in[1] = scales(1, 0.02, 0.021);
			/* a constant depthwise u8 x's zero point 0, as after MobileNetV2's
			 * ReLU6s: the depthwise kernel then reads x itself */
			bool relu_x = fixed && xt == KILN_U8 && cases[i].grp > 1;
			in[2] = qtensor(xt, 0, NULL, relu_x ? 0 : qlo(xt) + 10, relu_x ? 0 : qhi(xt) - 10);
			in[3] = qtensor(wt, 4, sw, qlo(wt), qhi(wt));
			in[4] = scales(nv, 0.005, 0.015);
			/* constant u8 x s8 per channel as ORT's quantizer writes them:
			 * symmetric weights, so with x's zero point folded the GEMM has
			 * no zero point and only per-row bias and scale */
			bool sym = fixed && xt == KILN_U8 && wt == KILN_I8 && cases[i].per_channel;
			in[5] = qtensor(wt, nv > 1, &nv, sym ? 0 : wt == KILN_U8 ? 100 : -20,
			                sym ? 0 : wt == KILN_U8 ? 150 : 20);
			in[6] = scales(1, step, step * 1.01);
			in[7] = qtensor(yt, 0, NULL, qlo(yt) + 100, qlo(yt) + 150);
			in[8] = qtensor(KILN_I32, 1, &sv, -3000, 3000);
			const char *names[] = {"x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"};
			nin = cases[i].bias ? 9 : 8;
			for (int k = 1; k < nin; k++)
				v[k] = operand(g, names[k], in[k], fixed);
			ir_output_add(g, op1(g, KILN_OP_QLINEAR_CONV, (uint32_t)nin, v, attrs), NULL);
		}
		int_op_matches(name, g, in, fixed ? 1 : nin);
		for (int k = 0; k < 9; k++)
			kiln_tensor_free(in[k]);
		kiln_graph_free(g);
	}
}
END_TEST

/* QLinearMatMul and MatMulInteger through the 8-bit GEMM: a stack of A
 * matrices times one B (u8 x s8, B per column), everything per tensor
 * with an s8 result, a 2-D product of 200 x 300 x 256 on two threads (the work split
 * over the pool), and MatMulInteger with both zero points (A's per row,
 * B's per column), u8 x u8 (the flip) and i8 x i8. */
START_TEST(int8_matmuls_match_the_interpreter)
{
	static const struct {
		int64_t batch, m, k, n;
		kiln_dtype at, bt, yt;
		bool rows, cols, integer, threads;
	} cases[] = {
		{3, 37, 45, 70, KILN_U8, KILN_I8, KILN_U8, false, true, false, false},
		{1, 13, 130, 20, KILN_U8, KILN_I8, KILN_I8, false, false, false, false},
		{0, 200, 256, 300, KILN_U8, KILN_I8, KILN_U8, false, true, false, true},
		{0, 5, 301, 130, KILN_U8, KILN_U8, KILN_I32, true, true, true, false},
		{0, 9, 66, 17, KILN_I8, KILN_I8, KILN_I32, false, false, true, false},
	};
	const size_t ncase = sizeof cases / sizeof *cases;
	for (size_t r = 0; r < 2 * ncase; r++) {
		/* each case twice: B and the scales as inputs, then as constants */
		size_t i = r % ncase;
		bool fixed = r >= ncase;
		char name[32];
		snprintf(name, sizeof name, "int8mm%zu%s", i, fixed ? "_fixed" : "");
		kiln_dtype at = cases[i].at, bt = cases[i].bt, yt = cases[i].yt;
		int64_t M = cases[i].m, K = cases[i].k, N = cases[i].n;
		int64_t sa[3] = {cases[i].batch, M, K}, sb[2] = {K, N};
		int ra = cases[i].batch ? 3 : 2;
		const int64_t *pa = cases[i].batch ? sa : sa + 1;
		int64_t nr = cases[i].rows ? M : 1, nc = cases[i].cols ? N : 1;
		kiln_graph *g = kiln_graph_new(name);
		kiln_tensor *in[8] = {0};
		uint32_t v[8];
		int nin;
		if (cases[i].integer) {
			in[0] = qtensor(at, ra, pa, qlo(at), qhi(at));
			in[1] = qtensor(bt, 2, sb, qlo(bt), qhi(bt));
			in[2] = qtensor(at, nr > 1, &nr, qlo(at) + 30, qhi(at) - 30);
			in[3] = qtensor(bt, nc > 1, &nc, qlo(bt) + 30, qhi(bt) - 30);
			nin = 4;
		} else { /* a, as, az, b, bs, bz, ys, yz */
			double step = 0.02 * 0.01 * sqrt((double)K) * 128 * 40 / 255;
			in[0] = qtensor(at, ra, pa, qlo(at), qhi(at));
			in[1] = scales(nr, 0.02, 0.021);
			in[2] = qtensor(at, nr > 1, &nr, qlo(at) + 10, qhi(at) - 10);
			in[3] = qtensor(bt, 2, sb, qlo(bt), qhi(bt));
			in[4] = scales(nc, 0.005, 0.015);
			/* constant s8 B per column: symmetric, as ORT's quantizer
			 * writes weights (A's zero point then folds into a column bias,
			 * and the GEMM has no zero point) */
			bool sym = fixed && bt == KILN_I8 && nc > 1;
			in[5] = qtensor(bt, nc > 1, &nc, sym ? 0 : -20, sym ? 0 : 20);
			in[6] = scales(1, step, step * 1.01);
			in[7] = qtensor(yt, 0, NULL, qlo(yt) + 100, qlo(yt) + 150);
			nin = 8;
		}
		static const char *const names[] = {"a", "as", "az", "b", "bs", "bz", "ys", "yz"};
		static const char *const inames[] = {"a", "b", "az", "bz"};
		for (int k = 0; k < nin; k++)
			v[k] = operand(g, nin == 4 ? inames[k] : names[k], in[k], fixed && k > 0);
		ir_output_add(g, op1(g, cases[i].integer ? KILN_OP_MATMUL_INTEGER : KILN_OP_QLINEAR_MATMUL,
		                     (uint32_t)nin, v, ""), NULL);
		if (cases[i].threads)
			setenv("KILN_NUM_THREADS", "2", 1);
		int_op_matches(name, g, in, fixed ? 1 : nin);
		unsetenv("KILN_NUM_THREADS");
		for (int k = 0; k < 8; k++)
			kiln_tensor_free(in[k]);
		kiln_graph_free(g);
	}
}
END_TEST

/* The 8-bit GEMM's two paths on one machine: each product with AMX tiles
 * allowed (taken where the CPU and OS have them) and with KILN_AMX=0 (the
 * AVX512-VNNI or generic tile), exactly the interpreter's i32 sums.  The
 * shapes are the AMX tile's edges: K a multiple of its 64-k step and not
 * (the last step's A copied with zeros), M = 16 and row tiles moved up to
 * end at M (M = 33, 40, 70, 97), panels of at most 32 columns (one half)
 * and of 33 to 63, more rows than one AMX item (512), on two threads,
 * every signedness, zero points per row and per column, and K < 64 (the
 * VNNI tile whatever the CPU). */
START_TEST(int8_gemm_paths_match_the_interpreter)
{
	static const struct {
		int64_t m, k, n;
		kiln_dtype at, bt;
		bool threads;
	} cases[] = {
		{40, 192, 100, KILN_U8, KILN_I8, false},
		{33, 200, 30, KILN_I8, KILN_U8, false},
		{70, 64, 64, KILN_U8, KILN_U8, false},
		{16, 70, 5, KILN_I8, KILN_I8, false},
		{20, 7, 9, KILN_U8, KILN_I8, false},
		{600, 130, 45, KILN_U8, KILN_I8, false},
		{97, 320, 150, KILN_U8, KILN_I8, true},
	};
	for (size_t r = 0; r < 2 * (sizeof cases / sizeof *cases); r++) {
		size_t i = r / 2;
		bool vnni = r % 2;
		char name[32];
		snprintf(name, sizeof name, "int8gemm%zu%s", i, vnni ? "_noamx" : "");
		kiln_dtype at = cases[i].at, bt = cases[i].bt;
		int64_t M = cases[i].m, K = cases[i].k, N = cases[i].n;
		int64_t sa[2] = {M, K}, sb[2] = {K, N};
		kiln_graph *g = kiln_graph_new(name);
		kiln_tensor *in[4] = {qtensor(at, 2, sa, qlo(at), qhi(at)), qtensor(bt, 2, sb, qlo(bt), qhi(bt)),
		                      qtensor(at, 1, &M, qlo(at) + 30, qhi(at) - 30),
		                      qtensor(bt, 1, &N, qlo(bt) + 30, qhi(bt) - 30)};
		static const char *const names[] = {"a", "b", "az", "bz"};
		uint32_t v[4];
		for (int k = 0; k < 4; k++)
			v[k] = operand(g, names[k], in[k], false);
		ir_output_add(g, op1(g, KILN_OP_MATMUL_INTEGER, 4, v, ""), NULL);
		if (cases[i].threads)
			setenv("KILN_NUM_THREADS", "2", 1);
		if (vnni)
			setenv("KILN_AMX", "0", 1);
		int_op_matches(name, g, in, 4);
		unsetenv("KILN_NUM_THREADS");
		unsetenv("KILN_AMX");
		for (int k = 0; k < 4; k++)
			kiln_tensor_free(in[k]);
		kiln_graph_free(g);
	}
}
END_TEST

/* MaxPool of 8-bit tensors (a quantized model's, after qfuse), stride 2
 * on planes wide enough to split into even and odd columns, whole planes
 * and row by row (by_rows), u8 and i8: exactly the interpreter's. */
START_TEST(int8_max_pools_match_the_interpreter)
{
	static const struct {
		int64_t c, h;
		kiln_dtype dt;
	} cases[] = {{3, 28, KILN_U8}, {2, 70, KILN_I8}, {2, 17, KILN_U8}};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32];
		snprintf(name, sizeof name, "int8pool%zu", i);
		kiln_graph *g = kiln_graph_new(name);
		int64_t sx[] = {2, cases[i].c, cases[i].h, cases[i].h + 1};
		kiln_dtype dt = cases[i].dt;
		uint32_t x = input(g, "x", dt, 4, sx);
		ir_output_add(g, op1(g, KILN_OP_MAX_POOL, 1, &x,
		                     "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"), NULL);
		opcase_graph c = {name, g, {qtensor(dt, 4, sx, qlo(dt), qhi(dt))}, {0}, 1, 1, 0};
		char why[1400] = "";
		ck_assert_msg(case_matches(&c, true, why, sizeof why), "%s: %s", name, why);
		opcase_free(&c);
	}
}
END_TEST

/* The 8-bit conversions of rounded and whole f32 values (llvm.c's
 * round_to_8bit: clamp, then the addition of 1.5 * 2^23 that rounds):
 * QuantizeLinear, y = sat(round(x / s) + zp) (a whole number converted),
 * and with zero point 0 the shape u8(round(v)) of the convs' requantizing
 * stores (the rounding done by the addition), exact
 * against the interpreter: halves on both sides of every whole number
 * (ties to even), just below and above them, both saturations, NaN (to 0),
 * the infinities, for u8 and i8 with zero points 0 and not. */
START_TEST(int8_rounding_conversions_are_exact)
{
	enum { N = 1300 };
	static double xv[N];
	for (int i = 0; i < N - 12; i++) /* x / s in [-320, 320) by quarters */
		xv[i] = (i - (N - 12) / 2) * 0.125;
	const double sp[12] = {NAN, INFINITY, -INFINITY, 1e20, -1e30, 0.24999999, 0.25000001,
	                       -0.24999999, -0.75000001, 63.750004, -64.25, 1.2499999};
	memcpy(xv + N - 12, sp, sizeof sp);
	static const struct {
		kiln_dtype dt;
		int zp;
	} cases[] = {{KILN_U8, 0}, {KILN_U8, 37}, {KILN_I8, 0}, {KILN_I8, -5}};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32];
		snprintf(name, sizeof name, "qround%zu", i);
		kiln_graph *g = kiln_graph_new(name);
		int64_t n = N;
		kiln_tensor *in[3] = {tensor(KILN_F32, 1, &n, xv), tensor(KILN_F32, 0, NULL, (double[]){0.5}),
		                      tensor(cases[i].dt, 0, NULL, (double[]){cases[i].zp})};
		uint32_t v[3] = {input(g, "x", KILN_F32, 1, &n), operand(g, "s", in[1], true),
		                 operand(g, "z", in[2], true)};
		ir_output_add(g, op1(g, KILN_OP_QUANTIZE_LINEAR, 3, v, ""), NULL);
		kiln_tensor *want = NULL, *got = NULL;
		kiln_error err = {0};
		ck_assert_msg(kiln_graph_run(g, in, 1, &want, 1, &err) == KILN_OK, "%s: %s", name, err.msg);
		char dir[] = "/tmp/kiln_qround.XXXXXX";
		ck_assert_ptr_nonnull(mkdtemp(dir));
		kiln_status st = compile_and_run(g, dir, name, in, 1, &got, 1, &err);
		tu_remove_dir(dir);
		ck_assert_msg(st == KILN_OK, "%s: %s", name, err.msg);
		ck_assert_int_eq(got->dtype, want->dtype);
		for (int64_t k = 0; k < N; k++)
			ck_assert_msg(ir_load(got, k) == ir_load(want, k), "%s: x = %.9g: %g, interpreter %g",
			              name, xv[k], ir_load(got, k), ir_load(want, k));
		kiln_tensor_free(want), kiln_tensor_free(got);
		for (int k = 0; k < 3; k++)
			kiln_tensor_free(in[k]);
		kiln_graph_free(g);
	}
}
END_TEST

/* The last test: how long compiling took, so a slow backend shows. */
START_TEST(report_compile_time)
{
	printf("compiled_ops: %d cases, %.1f s compiling and running\n", opcase_count(),
	       compile_seconds);
	ck_assert(compile_seconds >= 0);
}
END_TEST

START_TEST(known_gaps_name_real_cases)
{
	for (int i = 0; known_gaps[i].name; i++) {
		bool found = false;
		for (int k = 0; k < opcase_count() && !found; k++)
			found = !strcmp(opcase_get(k)->name, known_gaps[i].name);
		ck_assert_msg(found, "known gap '%s' is not an op case", known_gaps[i].name);
	}
}
END_TEST

static Suite *compiled_ops_suite(void)
{
	Suite *s = suite_create("compiled_ops");
	opcase_add_tcases(s, compiled_op_matches_interpreter);
	TCase *tc = tcase_create("summary");
	tcase_add_test(tc, known_gaps_name_real_cases);
	tcase_add_test(tc, half_casts_round_exactly_like_the_interpreter);
	tcase_add_test(tc, fused_activations_match_the_interpreter);
	tcase_add_test(tc, winograd_convs_match_the_interpreter);
	tcase_add_test(tc, grouped_convs_match_the_interpreter);
	tcase_add_test(tc, chunked_im2col_convs_match_the_interpreter);
	tcase_add_test(tc, strided_pointwise_convs_match_the_interpreter);
	tcase_add_test(tc, stride2_windows_match_the_interpreter);
	tcase_add_test(tc, disjoint_window_pools_match_the_interpreter);
	tcase_add_test(tc, separable_max_pools_match_the_interpreter);
	tcase_add_test(tc, small_plane_depthwise_matches_the_interpreter);
	tcase_add_test(tc, small_plane_depthwise_epilogues_keep_their_order);
	tcase_add_test(tc, tiny_plane_depthwise_is_channel_blocked);
	tcase_add_test(tc, concat_and_split_copy_in_chunks);
	tcase_add_test(tc, concat_read_in_place_by_its_reader);
	tcase_add_test(tc, pointwise_conv_writes_channel_blocks_for_depthwise);
	tcase_add_test(tc, grouped_conv_writes_channel_blocks_for_pointwise);
	tcase_add_test(tc, squeeze_excitation_keeps_channel_blocks);
	tcase_add_test(tc, transposes_move_blocks_in_registers);
	tcase_add_test(tc, batch_chosen_conv_matches_the_interpreter);
	tcase_add_test(tc, gather_index_out_of_range_is_an_error);
	tcase_add_test(tc, symbolic_attributes_compile_for_every_length);
	tcase_add_test(tc, loss_target_out_of_range_is_an_error);
	tcase_add_test(tc, integer_division_by_zero_is_an_error);
	tcase_add_test(tc, runtime_scales_are_checked_by_the_library);
	tcase_add_test(tc, int8_convs_match_the_interpreter);
	tcase_add_test(tc, int8_matmuls_match_the_interpreter);
	tcase_add_test(tc, int8_gemm_paths_match_the_interpreter);
	tcase_add_test(tc, int8_max_pools_match_the_interpreter);
	tcase_add_test(tc, int8_rounding_conversions_are_exact);
	tcase_add_test(tc, fused_rnns_run_at_any_sequence_length_with_one_library);
	tcase_add_test(tc, report_compile_time);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(compiled_ops_suite)
