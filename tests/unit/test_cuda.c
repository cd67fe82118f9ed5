/*
 * test_cuda.c: the CUDA backend without a GPU (docs/CUDA.md, "What is
 * checked here").
 *
 * - Every op case of op_cases.h compiled with --target=cuda-emu: the CUDA C
 *   the printer writes, compiled as C++ for this CPU (launches as loops
 *   over blocks and threads), loaded with kiln_load and compared with the
 *   interpreter under test_compiled_ops.c's tolerance policy (1e-4 for
 *   f32, exact for integers and bools).  f16/bf16 casts bit for bit.
 * - The same CUDA C compiled by NVRTC for sm_80 and sm_90 (cubin) and
 *   compute_90 (PTX), warnings counted as failures; many cases share one
 *   NVRTC program (each printed with its own name prefix), so the whole
 *   set is a few NVRTC calls.  Without NVRTC in this build that test is
 *   not added (the printout says so); tests/onnx/cuda_nvrtc_check.c covers
 *   the conformance cases and real models and reports itself skipped.
 * - A data-dependent index out of range (CG_CHECK) fails the run with the
 *   interpreter's message.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "codegen/cuda.h"
#include "kiln/kiln.h"
#include "op_cases.h"
#include "testutil.h"

/* kiln_compile's convolution algorithm for the next compile (NULL: the
 * cost model's); a test that forces one puts it back. */
static const char *emu_conv;

static bool case_matches(const opcase_graph *c, bool exact, char *why, size_t size)
{
	return opcase_matches(c, &(kiln_compile_opts){.name = c->name, .target = "cuda-emu",
	                                              .conv = emu_conv},
	                      "kiln_cuda_emu", exact, why, size);
}

/* Cases the CUDA backend refuses, each with why: its supports() says so
 * at compile time, and a refused case that starts compiling fails here. */
static const tu_reason refused[] = {
	{NULL, NULL},
};

START_TEST(op_case_matches_interpreter_emulated)
{
	opcase_graph c = opcase_build(opcase_get(_i));
	char why[1400] = "";
	bool ok = case_matches(&c, false, why, sizeof why);
	const char *r = tu_reason_of(refused, c.name);
	if (r)
		ck_assert_msg(!ok, "%s compiles and matches now: remove it from refused", c.name);
	else
		ck_assert_msg(ok, "%s: %s", c.name, why);
	opcase_free(&c);
}
END_TEST

/* f16 and bf16 are bit patterns in the printed kernels, converted by
 * kf2h/kh2f and kf2bf/kbf2f: ties to even, overflow, subnormals, signed
 * zero and NaN as the interpreter stores them. */
START_TEST(half_casts_round_exactly_like_the_interpreter)
{
	static const double v[] = {1 + 0x1p-11, 1 + 3 * 0x1p-11, 1 + 0x1p-8, 65520, 65519,
	                           1e-7, 3e-5, 6.1e-5, -0.0, -INFINITY, NAN, 3.4e38, -1e39, 0.1,
	                           -2.5e-8, 1 + 0x1p-8 + 0x1p-9};
	const int64_t n = sizeof v / sizeof v[0];
	kiln_graph *g = kiln_graph_new("half_casts");
	uint32_t x = input(g, "x32", KILN_F32, 1, &n);
	static const char *const to[] = {"to=f16", "to=bf16"};
	for (int k = 0; k < 4; k++) { /* stored, then back to f32 */
		uint32_t h = op1(g, KILN_OP_CAST, 1, &x, to[k % 2]);
		ir_output_add(g, k < 2 ? h : op1(g, KILN_OP_CAST, 1, &h, "to=f32"), NULL);
	}
	kiln_tensor *in = tensor(KILN_F32, 1, &n, v);
	opcase_graph c = {"half_casts", g, {in}, {0}, 1, 4, 0};
	char why[1400] = "";
	ck_assert_msg(case_matches(&c, true, why, sizeof why), "%s", why);
	opcase_free(&c);
}
END_TEST

/* Float max and min propagate NaN from either side (codegen.h: Relu of NaN is
 * NaN), and float -> integer casts saturate with NaN -> 0, exactly as the
 * interpreter does. */
START_TEST(nan_max_min_and_saturating_casts_match_the_interpreter)
{
	static const double xv[] = {NAN, 1, -2, NAN, 3e9, -3e9, 0.5, -0.0};
	static const double yv[] = {0, NAN, NAN, NAN, 1, 1, -1, 0};
	const int64_t n = 8;
	kiln_graph *g = kiln_graph_new("nan_ops");
	uint32_t xy[2] = {input(g, "x", KILN_F32, 1, &n), input(g, "y", KILN_F32, 1, &n)};
	ir_output_add(g, op1(g, KILN_OP_RELU, 1, &xy[0], ""), NULL);
	ir_output_add(g, op1(g, KILN_OP_MAX, 2, xy, ""), NULL);
	ir_output_add(g, op1(g, KILN_OP_MIN, 2, xy, ""), NULL);
	ir_output_add(g, op1(g, KILN_OP_CAST, 1, &xy[0], "to=i32"), NULL);
	kiln_tensor *in0 = tensor(KILN_F32, 1, &n, xv), *in1 = tensor(KILN_F32, 1, &n, yv);
	opcase_graph c = {"nan_ops", g, {in0, in1}, {0}, 2, 4, 0};
	char why[1400] = "";
	ck_assert_msg(case_matches(&c, true, why, sizeof why), "%s", why);
	opcase_free(&c);
}
END_TEST

/* Seeded values in [-1, 1) for input k (test_compiled_ops.c's). */
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

/* A GPU target keeps grouped convs on the GEMMs; forced onto the direct
 * kernel (lower_nn.c, conv_grouped: phase planes, flat loops, every slot on
 * the grid) its kernel IR prints as CUDA C too and computes what the
 * interpreter does: channel chunks through T, stride 2, a symbolic batch
 * of 2, Relu folded into the final stores. */
START_TEST(grouped_convs_direct_match_the_interpreter_emulated)
{
	static const struct {
		int64_t n, c, m, h, w, grp;
		const char *attrs;
		bool sym;
	} cases[] = {
		{2, 8, 12, 9, 11, 4, "pads=1,1,1,1", false},
		{1, 12, 12, 13, 13, 3, "strides=2,2 pads=1,1,1,1", false},
		{2, 32, 32, 7, 7, 2, "pads=1,1,1,1", true},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char name[32];
		snprintf(name, sizeof name, "grouped_direct%zu", i);
		kiln_graph *g = kiln_graph_new(name);
		int64_t cg = cases[i].c / cases[i].grp;
		int64_t sx[] = {cases[i].n, cases[i].c, cases[i].h, cases[i].w};
		int64_t dx[] = {cases[i].sym ? kiln_sym(g, "N") : cases[i].n, cases[i].c, cases[i].h,
		                cases[i].w};
		int64_t sw[] = {cases[i].m, cg, 3, 3}, sb[] = {cases[i].m};
		kiln_tensor *in[3] = {seeded(4, sx, 0), seeded(4, sw, 1), seeded(1, sb, 2)};
		float *w = in[1]->data; /* outputs O(1): 1e-4 is relative */
		for (int64_t j = 0; j < kiln_tensor_numel(in[1]); j++)
			w[j] /= (float)sqrt(9.0 * (double)cg);
		uint32_t v[3] = {kiln_input(g, "x", KILN_F32, 4, dx), input(g, "w", KILN_F32, 4, sw),
		                 input(g, "b", KILN_F32, 1, sb)};
		char attrs[96];
		snprintf(attrs, sizeof attrs, "group=%lld %s", (long long)cases[i].grp, cases[i].attrs);
		uint32_t y = op1(g, KILN_OP_CONV, 3, v, attrs);
		y = op1(g, KILN_OP_RELU, 1, &y, "");
		ir_output_add(g, op1(g, KILN_OP_NEG, 1, &y, ""), NULL);
		ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
		opcase_graph c = {name, g, {in[0], in[1], in[2]}, {0}, 3, 1, 0};
		char why[1400] = "";
		emu_conv = "direct";
		bool ok = case_matches(&c, false, why, sizeof why);
		emu_conv = NULL;
		ck_assert_msg(ok, "%s (%s): %s", name, attrs, why);
		opcase_free(&c);
	}
}
END_TEST

/* A Gather index out of range: the kernel's CG_CHECK reports it (kiln_check)
 * and the run fails with the interpreter's reason, naming the value. */
START_TEST(gather_index_out_of_range_is_an_error)
{
	const int64_t ds[2] = {4, 3}, is = 2;
	kiln_graph *g = kiln_graph_new("gather_oob");
	uint32_t ids[2] = {input(g, "data", KILN_F32, 2, ds), input(g, "idx", KILN_I64, 1, &is)};
	ir_output_add(g, op1(g, KILN_OP_GATHER, 2, ids, "axis=0"), NULL);
	double dv[12] = {0}, iv[2] = {1, 7};
	kiln_tensor *in[2] = {tensor(KILN_F32, 2, ds, dv), tensor(KILN_I64, 1, &is, iv)};
	kiln_tensor *got[1] = {0};
	kiln_error err = {0};
	kiln_status st = tu_compile_run(g, &(kiln_compile_opts){.name = "gather_oob",
	                                .target = "cuda-emu"}, "kiln_cuda_emu", in, 2, got, 1, &err);
	ck_assert_int_eq(st, KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "7 out of range [-4, 4)") || strstr(err.msg, "7 out of range"),
	              "%s", err.msg);
	kiln_tensor_free(got[0]);
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

/* ---- NVRTC ------------------------------------------------------------------------ */

/* The CUDA C of every op case, each with its own prefix, compiled in
 * programs of up to 48 cases for each architecture; a failing program is
 * compiled case by case to name the culprit. */
static char *cuda_text(const kiln_graph *g, const char *name, kiln_error *err)
{
	char dir[] = "/tmp/kiln_cuda_cu.XXXXXX", path[1200];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/%s.cu", dir, name);
	kiln_compile_opts o = {.name = name, .target = "cuda", .emit = "cu"};
	char *text = NULL;
	if (kiln_compile(g, path, &o, err) == KILN_OK) {
		FILE *f = fopen(path, "rb");
		ck_assert_ptr_nonnull(f);
		fseek(f, 0, SEEK_END);
		long n = ftell(f);
		fseek(f, 0, SEEK_SET);
		text = malloc((size_t)n + 1);
		ck_assert_int_eq(fread(text, 1, (size_t)n, f), (size_t)n);
		text[n] = 0;
		fclose(f);
	}
	tu_remove_dir(dir);
	return text;
}

static const char *const archs[][2] = {{"sm_80", "cubin"}, {"sm_90", "cubin"}, {"sm_90", "ptx"}};

/* NVRTC failures of text for every architecture, printed with name. */
static int nvrtc_all(const char *text, const char *name)
{
	int bad = 0;
	for (size_t a = 0; a < sizeof archs / sizeof *archs; a++) {
		void *img = NULL;
		size_t n = 0;
		kiln_error err = {0};
		if (cg_nvrtc_compile(text, name, archs[a][0], !strcmp(archs[a][1], "ptx"), true, false,
		                     &img, &n, &err) != KILN_OK) {
			printf("%s (%s %s): %s\n", name, archs[a][0], archs[a][1], err.msg);
			bad++;
		} else
			ck_assert_uint_gt(n, 100);
		free(img);
	}
	return bad;
}

START_TEST(op_cases_compile_with_nvrtc)
{
	int n = opcase_count(), failed = 0, programs = 0, printed = 0;
	const int per = 48;
	for (int first = 0; first < n; first += per) {
		char *texts[48] = {0};
		size_t total = 1;
		for (int i = first; i < n && i < first + per; i++) {
			opcase_graph c = opcase_build(opcase_get(i));
			char name[32];
			kiln_error err = {0};
			snprintf(name, sizeof name, "op%d", i);
			texts[i - first] = cuda_text(c.g, name, &err);
			ck_assert_msg(texts[i - first], "%s: %s", c.name, err.msg);
			total += strlen(texts[i - first]);
			printed++;
			opcase_free(&c);
		}
		char *all = malloc(total);
		all[0] = 0;
		for (int k = 0; k < per && texts[k]; k++)
			strcat(all, texts[k]);
		programs++;
		if (nvrtc_all(all, "op_cases.cu"))
			for (int k = 0; k < per && texts[k]; k++) {
				char name[64];
				snprintf(name, sizeof name, "%s.cu", opcase_get(first + k)->name);
				failed += nvrtc_all(texts[k], name) != 0;
			}
		for (int k = 0; k < per; k++)
			free(texts[k]);
		free(all);
	}
	printf("op cases: %d printed as CUDA C, %d NVRTC programs for sm_80, sm_90 and "
	       "compute_90 PTX, %d cases failed\n", printed, programs, failed);
	ck_assert_int_eq(failed, 0);
}
END_TEST

/* Without the toolkit the target still prints CUDA C, and says clearly why it
 * cannot compile it. */
START_TEST(ptx_needs_nvrtc_or_says_why)
{
	kiln_graph *g = kiln_graph_new("relu1");
	const int64_t s = 8;
	uint32_t x = input(g, "x", KILN_F32, 1, &s);
	ir_output_add(g, op1(g, KILN_OP_RELU, 1, &x, ""), NULL);
	char dir[] = "/tmp/kiln_cuda_ptx.XXXXXX", path[1200];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/relu.ptx", dir);
	kiln_compile_opts o = {.target = "cuda", .emit = "ptx", .cuda_arch = "sm_90,sm_80"};
	kiln_error err = {0};
	kiln_status st = kiln_compile(g, path, &o, &err);
	if (cg_nvrtc_available()) {
		ck_assert_msg(st == KILN_OK, "%s", err.msg);
		FILE *f = fopen(path, "r");
		char text[4096] = "";
		ck_assert_ptr_nonnull(f);
		size_t got = fread(text, 1, sizeof text - 1, f);
		text[got] = 0;
		fclose(f);
		ck_assert_msg(strstr(text, ".target sm_90"), "not PTX for sm_90: %.200s", text);
		ck_assert_msg(strstr(text, ".entry relu1_0_0"), "no kernel entry: %.400s", text);
	} else {
		ck_assert_int_eq(st, KILN_EUNSUPPORTED);
		ck_assert_msg(strstr(err.msg, "without the CUDA toolkit"), "%s", err.msg);
	}
	o.cuda_arch = "gfx90a";
	st = kiln_compile(g, path, &o, &err);
	ck_assert_int_ne(st, KILN_OK);
	o.cuda_math = "tf64";
	ck_assert_int_eq(kiln_compile(g, path, &o, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "--cuda-math"), "%s", err.msg);
	tu_remove_dir(dir);
	kiln_graph_free(g);
}
END_TEST

/* A CUDA library (--target=cuda) loads on a machine without a driver, and
 * _create says why it cannot run there; nothing leaks (ASan's leak check in
 * the sanitizer build).  Where a GPU is present the same library must run
 * and match the interpreter (bench/gpu.sh runs this there). */
START_TEST(library_loads_and_create_says_why_without_a_driver)
{
	const char *src = "graph @mlp(%x: f32[N,12], %w: f32[8,12], %b: f32[8]) -> (%y: f32[N,8]) {\n"
	                  "  %h = gemm %x, %w, %b {transB=1} : f32[N,8]\n"
	                  "  %y = relu %h : f32[N,8]\n  ret %y\n}\n";
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_from_kir(src, "mlp.kir", &g, &err) == KILN_OK, "%s", err.msg);
	char dir[] = "/tmp/kiln_cuda_so.XXXXXX", so[1200];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(so, sizeof so, "%s/mlp.so", dir);
	kiln_compile_opts o = {.name = "mlp", .target = "cuda"};
	ck_assert_msg(kiln_compile(g, so, &o, &err) == KILN_OK, "%s", err.msg);
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h, "%s", dlerror());
	int (*create_ex)(void **, char *, size_t) = (int (*)(void **, char *, size_t))dlsym(h, "mlp_create_ex");
	void *(*create)(void) = (void *(*)(void))dlsym(h, "mlp_create");
	void (*destroy)(void *) = (void (*)(void *))dlsym(h, "mlp_destroy");
	const char *(*errmsg)(const void *) = (const char *(*)(const void *))dlsym(h, "mlp_errmsg");
	int (*run)(void *, int64_t, const float *, const float *, const float *, float *) =
		(int (*)(void *, int64_t, const float *, const float *, const float *, float *))dlsym(h, "mlp_run");
	ck_assert_msg(create_ex && create && destroy && errmsg && run && dlsym(h, "mlp_run_device"),
	              "missing entry points");
	void *ctx = (void *)1;
	char msg[600] = "";
	int rc = create_ex(&ctx, msg, sizeof msg);
	if (rc != 0) {
		ck_assert_ptr_null(ctx);
		ck_assert_msg(rc == KILN_EUNSUPPORTED || rc == KILN_EIO, "status %d", rc);
		ck_assert_msg(strstr(msg, "libcuda.so.1 not found") || strstr(msg, "CUDA: "), "%s", msg);
		ck_assert_ptr_null(create());
		ck_assert_str_eq(errmsg(NULL), "null context");
		destroy(NULL);
		printf("CUDA library without a GPU: _create_ex -> %d: %s\n", rc, msg);
	} else { /* a GPU: run it */
		enum { N = 3 };
		float x[N * 12], w[96], b[8], y[N * 8];
		for (int i = 0; i < N * 12; i++) x[i] = (float)((i * 7) % 11) / 11 - 0.5f;
		for (int i = 0; i < 96; i++) w[i] = (float)((i * 5) % 13) / 13 - 0.5f;
		for (int i = 0; i < 8; i++) b[i] = 0.1f * (float)i - 0.3f;
		ck_assert_msg(run(ctx, N, x, w, b, y) == 0, "%s", errmsg(ctx));
		for (int r = 0; r < N; r++)
			for (int c = 0; c < 8; c++) {
				double acc = b[c];
				for (int k = 0; k < 12; k++) acc += (double)x[r * 12 + k] * w[c * 12 + k];
				acc = acc > 0 ? acc : 0;
				ck_assert_msg(fabs(acc - y[r * 8 + c]) < 1e-5, "y[%d,%d] %g, want %g", r, c,
				              y[r * 8 + c], acc);
			}
		destroy(ctx);
	}
	dlclose(h);
	tu_remove_dir(dir);
	kiln_graph_free(g);
}
END_TEST

static Suite *cuda_suite(void)
{
	Suite *s = suite_create("cuda");
	opcase_add_tcases(s, op_case_matches_interpreter_emulated);
	TCase *tc = tcase_create("cuda");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, half_casts_round_exactly_like_the_interpreter);
	tcase_add_test(tc, nan_max_min_and_saturating_casts_match_the_interpreter);
	tcase_add_test(tc, gather_index_out_of_range_is_an_error);
	tcase_add_test(tc, grouped_convs_direct_match_the_interpreter_emulated);
	tcase_add_test(tc, ptx_needs_nvrtc_or_says_why);
	if (cg_nvrtc_available()) {
		tcase_add_test(tc, op_cases_compile_with_nvrtc);
		tcase_add_test(tc, library_loads_and_create_says_why_without_a_driver);
	}
	else
		printf("NVRTC checks skipped: this kiln was built without the CUDA toolkit\n");
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(cuda_suite)
