/*
 * test_codegen.c: the LLVM backend end to end (codegen/target.c, llvm.c,
 * emit.c): graphs compiled to .so files in a temporary folder, dlopened,
 * run through their exported `kiln_model_desc` with the runtime driver
 * (and through the typed entry points), and compared with the reference
 * interpreter; the polynomial exp/tanh/erf against libm on hand-built
 * kernel modules; each --emit stage; and errors that must be messages,
 * never crashes.
 */
#include <dirent.h>
#include <elf.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "codegen/backend.h"
#include "codegen/llvm.h"
#include "codegen/lower.h"
#include "kiln/kiln.h"
#include "runtime/model.h"

#include "../../examples/models.h"

/* ---- helpers ------------------------------------------------------------ */

static char dir[256];

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/kiln_codegen_XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
	rmdir(dir); /* each test removes its own files first */
}

static const char *path_of(char *buf, const char *name, const char *ext)
{
	snprintf(buf, 512, "%s/%s%s", dir, name, ext);
	return buf;
}

static void remove_outputs(const char *name)
{
	static const char *const ext[] = {".so", ".h", ".ll", ".s", ".o", ".kir"};
	char p[512];
	for (size_t i = 0; i < sizeof ext / sizeof *ext; i++)
		unlink(path_of(p, name, ext[i]));
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *s = malloc((size_t)n + 1);
	ck_assert_int_eq(fread(s, 1, (size_t)n, f), (size_t)n);
	s[n] = 0;
	fclose(f);
	return s;
}

static uint64_t rng = 12345;

static float frand(float lo, float hi)
{
	rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
	return lo + (hi - lo) * (float)((rng >> 40) / (double)(1 << 24));
}

static kiln_tensor *rand_f32(int rank, const int64_t *shape, float lo, float hi)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, rank, shape);
	ck_assert_ptr_nonnull(t);
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		((float *)t->data)[i] = frand(lo, hi);
	return t;
}

/* A loaded library and a context of the runtime driver on its desc. */
typedef struct lib {
	void *so;
	const rt_model_desc *d;
	rt_model *m;
} lib;

static lib open_lib(const char *so_path)
{
	lib l = {dlopen(so_path, RTLD_NOW | RTLD_LOCAL)};
	ck_assert_msg(l.so != NULL, "dlopen: %s", dlerror());
	l.d = dlsym(l.so, "kiln_model_desc");
	ck_assert_ptr_nonnull(l.d);
	ck_assert_int_eq(rt_model_create(l.d, &l.m), KILN_OK);
	return l;
}

static void close_lib(lib *l)
{
	rt_model_destroy(l->m);
	dlclose(l->so);
}

static float max_diff(const kiln_tensor *a, const kiln_tensor *b, double *rel)
{
	ck_assert_int_eq(kiln_tensor_numel(a), kiln_tensor_numel(b));
	double m = 0, r = 0;
	for (int64_t i = 0; i < kiln_tensor_numel(a); i++) {
		double x = ((float *)a->data)[i], y = ((float *)b->data)[i];
		double d = fabs(x - y);
		ck_assert_msg(d == d, "NaN at %lld: %g vs %g", (long long)i, x, y);
		m = d > m ? d : m;
		r = d / (fabs(y) + 1e-3) > r ? d / (fabs(y) + 1e-3) : r;
	}
	if (rel)
		*rel = r;
	return (float)m;
}

/* Compiles g to dir/name.so, runs it on in[] through the driver with
 * nthreads threads, and checks every output against kiln_graph_run within
 * tol.  Returns the largest difference. */
static float compile_and_compare(kiln_graph *g, const char *name, kiln_tensor **in, int nin,
                                 int nthreads, float tol)
{
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	char so[512];
	kiln_error e = {0};
	kiln_compile_opts o = {.name = name};
	kiln_status st = kiln_compile(g, path_of(so, name, ".so"), &o, &e);
	ck_assert_msg(st == KILN_OK, "compile %s: %s", name, e.msg);
	int nout = kiln_graph_num_outputs(g);
	kiln_tensor *ref[8] = {0}, *out[8] = {0};
	st = kiln_graph_run(g, in, nin, ref, nout, &e);
	ck_assert_msg(st == KILN_OK, "interp: %s", e.msg);
	for (int i = 0; i < nout; i++)
		out[i] = kiln_tensor_new(ref[i]->dtype, ref[i]->rank, ref[i]->shape);
	lib l = open_lib(so);
	ck_assert_int_eq(rt_model_set_threads(l.m, nthreads), KILN_OK);
	st = rt_model_run_tensors(l.m, (const kiln_tensor *const *)in, nin, out, nout);
	ck_assert_msg(st == KILN_OK, "run %s: %s", name, rt_model_errmsg(l.m));
	float worst = 0;
	for (int i = 0; i < nout; i++) {
		float d = ref[i]->dtype == KILN_F32 ? max_diff(out[i], ref[i], NULL) : 0;
		if (ref[i]->dtype != KILN_F32)
			ck_assert_mem_eq(out[i]->data, ref[i]->data, kiln_tensor_nbytes(ref[i]));
		ck_assert_msg(d <= tol, "%s output %d: max diff %g > %g", name, i, d, tol);
		worst = d > worst ? d : worst;
		kiln_tensor_free(out[i]);
		kiln_tensor_free(ref[i]);
	}
	close_lib(&l);
	remove_outputs(name);
	return worst;
}

/* ---- the f32 math functions, on a hand-built module ---------------------- */

/* y[i] = op(x[i]) for i < n: one input, one output, one vectorized loop. */
static cg_module *unary_module(cg_unop op, int64_t n)
{
	cg_module *m = cg_module_new(NULL);
	ck_assert_ptr_nonnull(m);
	int x = cg_buf_new(m, CG_BUF_INPUT, KILN_F32, cg_int(m, n));
	int y = cg_buf_new(m, CG_BUF_OUTPUT, KILN_F32, cg_int(m, n));
	m->buf[x].type = (ir_type){KILN_F32, 1, {n}};
	m->buf[y].type = (ir_type){KILN_F32, 1, {n}};
	m->buf[x].name = "x";
	m->buf[y].name = "y";
	m->inputs = malloc(sizeof(int));
	m->outputs = malloc(sizeof(int));
	m->inputs[0] = x;
	m->outputs[0] = y;
	m->ninputs = m->noutputs = 1;
	cg_kernel *k = cg_kernel_new(m, "k0_unary", 0);
	int i = cg_var_new(k);
	cg_expr *iv = cg_var(m, i, KILN_I64);
	cg_stmt *st = cg_store(m, y, iv, cg_un(m, op, cg_load(m, x, iv)));
	cg_append(m, k->body, cg_for(m, i, cg_int(m, n), CG_VECTORIZE, st));
	return m;
}

static int64_t ulps(float a, float b)
{
	int32_t ia, ib;
	memcpy(&ia, &a, 4);
	memcpy(&ib, &b, 4);
	if (ia < 0)
		ia = INT32_MIN - ia;
	if (ib < 0)
		ib = INT32_MIN - ib;
	return llabs((long long)ia - ib);
}

/* Runs op over xs through a compiled module; returns the library's y. */
static float *run_unary(cg_unop op, const float *xs, int64_t n, const char *name)
{
	cg_module *m = unary_module(op, n);
	char so[512];
	kiln_error e = {0};
	kiln_compile_opts o = {0};
	kiln_status st = cg_emit(NULL, m, path_of(so, name, ".so"), &o, name, &e);
	ck_assert_msg(st == KILN_OK, "%s", e.msg);
	cg_module_free(m);
	lib l = open_lib(so);
	float *ys = calloc((size_t)n, sizeof *ys);
	st = rt_model_run(l.m, NULL, (const void *const[]){xs}, (void *const[]){ys});
	ck_assert_msg(st == KILN_OK, "%s", rt_model_errmsg(l.m));
	close_lib(&l);
	remove_outputs(name);
	return ys;
}

enum { NMATH = 40000 };

static float *math_inputs(float lo, float hi)
{
	float *xs = malloc(NMATH * sizeof *xs);
	for (int i = 0; i < NMATH - 8; i++)
		xs[i] = lo + (hi - lo) * (float)i / (NMATH - 9);
	const float special[8] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f, -1e-30f, 88.72f};
	memcpy(xs + NMATH - 8, special, sizeof special);
	return xs;
}

START_TEST(exp_within_2_ulp_of_libm)
{
	float *xs = math_inputs(-110.0f, 89.0f);
	float *ys = run_unary(CG_EXP, xs, NMATH, "expf_t");
	int64_t worst = 0;
	for (int i = 0; i < NMATH; i++) {
		float want = expf(xs[i]);
		if (isnan(want)) {
			ck_assert_msg(isnan(ys[i]), "exp(%g) = %g, want NaN", xs[i], ys[i]);
			continue;
		}
		int64_t u = ulps(ys[i], want);
		ck_assert_msg(u <= 2, "exp(%.9g) = %.9g, libm %.9g (%lld ulp)", xs[i], ys[i], want,
		              (long long)u);
		worst = u > worst ? u : worst;
	}
	ck_assert_int_le(worst, 2);
	free(xs);
	free(ys);
}
END_TEST

/* tanh and erf: relative error 1e-6 (absolute near zero crossings). */
static void check_close(cg_unop op, double (*ref)(double), const char *name)
{
	float *xs = math_inputs(-12.0f, 12.0f);
	float *ys = run_unary(op, xs, NMATH, name);
	for (int i = 0; i < NMATH; i++) {
		double want = ref(xs[i]);
		if (isnan(want)) {
			ck_assert(isnan(ys[i]));
			continue;
		}
		double err = fabs(ys[i] - want) / (fabs(want) > 1e-30 ? fabs(want) : 1.0);
		ck_assert_msg(err <= 1e-6, "%s(%.9g) = %.9g, libm %.9g (rel %g)", name, xs[i],
		              ys[i], want, err);
	}
	free(xs);
	free(ys);
}

START_TEST(tanh_within_1e6_of_libm) { check_close(CG_TANH, tanh, "tanh_t"); }
END_TEST

START_TEST(erf_within_1e6_of_libm) { check_close(CG_ERF, erf, "erf_t"); }
END_TEST

static double sigmoid_ref(double x) { return 1 / (1 + exp(-x)); }

/* sigmoid: 1e-6 relative on [-12, 12] and the specials (+-inf, NaN,
 * 88.72), and past its clamp: 1 from 87 up, within 1e-37 of the true
 * value below -87 */
START_TEST(sigmoid_within_1e6_of_libm)
{
	check_close(CG_SIGMOID, sigmoid_ref, "sigm_t");
	float xs[6] = {87.0f, 100.0f, 3e38f, -87.5f, -100.0f, -3e38f};
	float *ys = run_unary(CG_SIGMOID, xs, 6, "sigm_far");
	for (int i = 0; i < 6; i++)
		ck_assert_msg(fabs(ys[i] - sigmoid_ref(xs[i])) <= (xs[i] > 0 ? 0 : 1e-37),
		              "sigmoid(%g) = %g, want %g", xs[i], ys[i], sigmoid_ref(xs[i]));
	free(ys);
}
END_TEST

START_TEST(exp_kernel_vectorizes_to_zmm_on_avx512_host)
{
	cg_target t;
	ck_assert_int_eq(cg_target_init(&t, NULL, NULL, NULL), KILN_OK);
	bool avx512 = t.vec_bits == 512;
	cg_target_free(&t);
	cg_module *m = unary_module(CG_EXP, 4096);
	char s[512];
	kiln_compile_opts o = {.emit = "asm"};
	kiln_error e = {0};
	ck_assert_int_eq(cg_emit(NULL, m, path_of(s, "vec", ".s"), &o, "vec", &e), KILN_OK);
	cg_module_free(m);
	char *text = slurp(s);
	ck_assert_msg(strstr(text, avx512 ? "zmm" : "xmm"), "no vector registers in exp kernel");
	ck_assert_ptr_null(strstr(text, "expf")); /* inline polynomial, no libm call */
	free(text);
	remove_outputs("vec");
}
END_TEST

/* ---- target selection ------------------------------------------------------ */

/* The feature string LLVMGetHostCPUFeatures reports (ISA only, never
 * tuning) on a Sapphire Rapids-class Xeon, which LLVM 14 names
 * icelake-client.  Which vector width each CPU and feature string gets
 * for the exp kernel: tests/kir/codegen/exp_vector_width.kir. */
#define SPR_FEATURES                                                                      \
	"+avx512f,+avx512dq,+avx512cd,+avx512bw,+avx512vl,+avx512vnni,+avx512bf16,"        \
	"+avx512fp16,+avx512ifma,+avx512vbmi,+avx512vbmi2,+avx512bitalg,+avx512vpopcntdq," \
	"+amx-tile,+amx-int8,+amx-bf16,+avx2,+fma,+bmi2,+serialize,+tsxldtrk"
/* $KILN_CPU / $KILN_FEATURES stand in for the host; an explicit CPU wins
 * over them; without them the host's name and features are used as LLVM
 * reports them (a Zen 5 is "generic" but keeps AVX-512 through its
 * features). */
static void restore_env(const char *name, const char *saved)
{
	if (saved)
		setenv(name, saved, 1);
	else
		unsetenv(name);
}

START_TEST(target_is_the_host_unless_overridden)
{
	char *saved_cpu = getenv("KILN_CPU") ? strdup(getenv("KILN_CPU")) : NULL;
	char *saved_features = getenv("KILN_FEATURES") ? strdup(getenv("KILN_FEATURES")) : NULL;
	setenv("KILN_CPU", "icelake-client", 1);
	setenv("KILN_FEATURES", SPR_FEATURES, 1);
	cg_target env_t, expl_t, bad_t;
	kiln_error e = {0}, be = {0};
	kiln_status st_env = cg_target_init(&env_t, NULL, NULL, &e);
	kiln_status st_expl = cg_target_init(&expl_t, "x86-64-v3", NULL, NULL);
	setenv("KILN_CPU", "pentium9", 1);
	kiln_status st_bad = cg_target_init(&bad_t, NULL, NULL, &be);
	unsetenv("KILN_CPU");
	unsetenv("KILN_FEATURES");
	ck_assert_msg(st_env == KILN_OK, "%s", e.msg);
	ck_assert_str_eq(env_t.cpu, "icelake-client");
	ck_assert_str_eq(env_t.features, SPR_FEATURES);
	ck_assert_int_eq(env_t.vec_bits, 512);
	ck_assert_int_eq(env_t.prefer_bits, 512);
	cg_target_free(&env_t);
	ck_assert_int_eq(st_expl, KILN_OK);
	ck_assert_str_eq(expl_t.cpu, "x86-64-v3");
	ck_assert_int_eq(expl_t.vec_bits, 256);
	ck_assert_int_eq(expl_t.prefer_bits, 0);
	cg_target_free(&expl_t);
	ck_assert_int_eq(st_bad, KILN_EINVAL);
	ck_assert_msg(strstr(be.msg, "unknown CPU 'pentium9' (from $KILN_CPU)"), "%s", be.msg);

	cg_target t;
	ck_assert_int_eq(cg_target_init(&t, NULL, NULL, NULL), KILN_OK);
	char *name = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
	ck_assert_str_eq(t.cpu, name);
	ck_assert_str_eq(t.features, features);
	bool avx512 = strstr(features, "+avx512f") != NULL;
	ck_assert_int_eq(t.vec_bits == 512, avx512);
	ck_assert_int_eq(t.prefer_bits, avx512 ? 512 : 0);
	LLVMDisposeMessage(name);
	LLVMDisposeMessage(features);
	cg_target_free(&t);
	restore_env("KILN_CPU", saved_cpu);
	restore_env("KILN_FEATURES", saved_features);
	free(saved_cpu), free(saved_features);
}
END_TEST

/* ---- parallel loops ------------------------------------------------------- */

/* y[i*C + j] = x[i*C + j] * s + i for i < R (parallel), j < C; with
 * capture, s is a local assigned before the loop, which keeps it serial. */
static cg_module *par_module(int64_t R, int64_t C, bool capture)
{
	cg_module *m = unary_module(CG_NEG, R * C);
	m->kern[0].body = cg_block(m);
	cg_kernel *k = &m->kern[0];
	int i = cg_var_new(k), j = cg_var_new(k), s = cg_var_new(k);
	cg_expr *iv = cg_var(m, i, KILN_I64), *jv = cg_var(m, j, KILN_I64);
	cg_expr *idx = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv, cg_int(m, C)), jv);
	cg_expr *scale = capture ? cg_var(m, s, KILN_F32) : cg_const(m, KILN_F32, 2.0);
	cg_expr *v = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, cg_load(m, 0, idx), scale),
	                    cg_cast(m, iv, KILN_F32));
	cg_stmt *inner = cg_for(m, j, cg_int(m, C), CG_VECTORIZE, cg_store(m, 1, idx, v));
	if (capture)
		cg_append(m, k->body, cg_assign(m, s, KILN_F32, cg_const(m, KILN_F32, 2.0)));
	cg_append(m, k->body, cg_for(m, i, cg_int(m, R), CG_PARALLEL, inner));
	return m;
}

static void check_par(bool capture)
{
	enum { R = 300, C = 77 };
	cg_module *m = par_module(R, C, capture);
	char so[512], ll[512];
	kiln_error e = {0};
	kiln_compile_opts o = {.emit = "ll"};
	ck_assert_msg(cg_emit(NULL, m, path_of(ll, "par", ".ll"), &o, "par", &e) == KILN_OK, "%s", e.msg);
	char *text = slurp(ll);
	ck_assert_int_eq(strstr(text, "@k0_unary.par0") != NULL, !capture);
	ck_assert_int_eq(strstr(text, "@rt_parallel_for") != NULL, !capture);
	free(text);
	o.emit = NULL;
	ck_assert_msg(cg_emit(NULL, m, path_of(so, "par", ".so"), &o, "par", &e) == KILN_OK, "%s", e.msg);
	cg_module_free(m);
	float *x = malloc(R * C * sizeof *x), *y = calloc(R * C, sizeof *y);
	for (int i = 0; i < R * C; i++)
		x[i] = frand(-1, 1);
	lib l = open_lib(so);
	for (int threads = 1; threads <= 2; threads++) {
		ck_assert_int_eq(rt_model_set_threads(l.m, threads), KILN_OK);
		memset(y, 0, R * C * sizeof *y);
		ck_assert_int_eq(rt_model_run(l.m, NULL, (const void *const[]){x}, (void *const[]){y}),
		                 KILN_OK);
		for (int i = 0; i < R * C; i++)
			ck_assert_float_eq(y[i], x[i] * 2.0f + (float)(i / C));
	}
	close_lib(&l);
	free(x);
	free(y);
	remove_outputs("par");
}

START_TEST(parallel_loop_is_outlined_and_runs_on_threads) { check_par(false); }
END_TEST

START_TEST(parallel_loop_reading_an_outer_local_runs_serially) { check_par(true); }
END_TEST

/* ---- graphs -------------------------------------------------------------- */

START_TEST(elementwise_broadcast_matches_interpreter)
{
	kiln_graph *g = kiln_graph_new("ew");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 3, (int64_t[]){N, 3, 37});
	kiln_value b = kiln_input(g, "b", KILN_F32, 2, (int64_t[]){1, 37});
	kiln_value y = kiln_relu(g, kiln_add(g, kiln_mul(g, x, b), kiln_sigmoid(g, x)));
	kiln_output(g, "y", kiln_sub(g, kiln_tanh(g, y), kiln_exp(g, kiln_neg(g, y))));
	for (int64_t n = 1; n <= 5; n += 4) {
		kiln_tensor *in[2] = {rand_f32(3, (int64_t[]){n, 3, 37}, -4, 4),
		                      rand_f32(2, (int64_t[]){1, 37}, -2, 2)};
		compile_and_compare(g, "ew", in, 2, 1, 1e-5f);
		kiln_tensor_free(in[0]);
		kiln_tensor_free(in[1]);
	}
	kiln_graph_free(g);
}
END_TEST

START_TEST(reductions_and_softmax_match_interpreter)
{
	kiln_graph *g = kiln_graph_new("red");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 3, (int64_t[]){N, 5, 300});
	kiln_output(g, "sum", kiln_reduce_sum(g, x, 1, (int64_t[]){-1}, false));
	kiln_output(g, "mean", kiln_reduce_mean(g, x, 1, (int64_t[]){1}, true));
	kiln_output(g, "max", kiln_reduce_max(g, x, 1, (int64_t[]){2}, false));
	kiln_output(g, "sm", kiln_softmax(g, x, -1));
	kiln_output(g, "lsm", kiln_log_softmax(g, x, 1));
	kiln_tensor *in = rand_f32(3, (int64_t[]){3, 5, 300}, -6, 6);
	compile_and_compare(g, "red", &in, 1, 1, 1e-4f);
	kiln_tensor_free(in);
	kiln_graph_free(g);
}
END_TEST

START_TEST(matmul_and_gemm_match_interpreter)
{
	kiln_graph *g = kiln_graph_new("mm");
	int64_t N = kiln_sym(g, "N");
	kiln_value a = kiln_input(g, "a", KILN_F32, 3, (int64_t[]){N, 33, 70});
	kiln_value b = kiln_input(g, "b", KILN_F32, 2, (int64_t[]){70, 45});
	kiln_value c = kiln_input(g, "c", KILN_F32, 2, (int64_t[]){45, 70});
	kiln_value d = kiln_input(g, "d", KILN_F32, 2, (int64_t[]){33, 1});
	kiln_output(g, "mm", kiln_matmul(g, a, b));
	kiln_value a2 = kiln_input(g, "a2", KILN_F32, 2, (int64_t[]){70, 33});
	kiln_output(g, "gemm", kiln_gemm(g, a2, c, d, 0.5, 2.0, true, true));
	int64_t n = 2;
	kiln_tensor *in[5] = {rand_f32(3, (int64_t[]){n, 33, 70}, -1, 1),
	                      rand_f32(2, (int64_t[]){70, 45}, -1, 1),
	                      rand_f32(2, (int64_t[]){45, 70}, -1, 1),
	                      rand_f32(2, (int64_t[]){33, 1}, -1, 1),
	                      rand_f32(2, (int64_t[]){70, 33}, -1, 1)};
	compile_and_compare(g, "mm", in, 5, 1, 1e-4f);
	compile_and_compare(g, "mm", in, 5, 2, 1e-4f);
	for (int i = 0; i < 5; i++)
		kiln_tensor_free(in[i]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(conv_pool_batchnorm_match_interpreter)
{
	kiln_graph *g = kiln_graph_new("cnv");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, (int64_t[]){N, 3, 17, 15});
	const kiln_conv_opts k3 = {.kernel = {3, 3}, .pad = {1, 1}, .stride = {2, 1}};
	kiln_value y = kiln_conv2d(g, "conv", x, 8, &k3, true);
	y = kiln_batchnorm(g, "bn", y, 1e-5, 0.1);
	y = kiln_relu(g, y);
	const kiln_conv_opts p2 = {.kernel = {2, 2}, .stride = {2, 2}};
	kiln_output(g, "maxp", kiln_max_pool(g, y, &p2));
	const kiln_conv_opts p3 = {.kernel = {3, 3}, .pad = {1, 1, 1, 1}, .stride = {1, 1}};
	kiln_output(g, "avgp", kiln_avg_pool(g, y, &p3));
	kiln_output(g, "gap", kiln_global_avg_pool(g, y));
	kiln_tensor *in = rand_f32(4, (int64_t[]){2, 3, 17, 15}, -1, 1);
	compile_and_compare(g, "cnv", &in, 1, 1, 1e-4f);
	kiln_tensor_free(in);
	kiln_graph_free(g);
}
END_TEST

START_TEST(bool_int_and_select_outputs_match_interpreter)
{
	kiln_graph *g = kiln_graph_new("cmp");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){N, 19});
	kiln_value y = kiln_input(g, "y", KILN_F32, 2, (int64_t[]){N, 19});
	kiln_value lt = kiln_less(g, x, y);
	kiln_output(g, "lt", lt);
	kiln_output(g, "w", kiln_where(g, lt, kiln_max(g, x, y), kiln_min(g, x, y)));
	kiln_output(g, "i", kiln_cast(g, kiln_mul(g, x, kiln_scalar(g, KILN_F32, 10.0)), KILN_I32));
	kiln_output(g, "am", kiln_argmax(g, x, 1, false));
	kiln_output(g, "ab", kiln_abs(g, kiln_floor(g, kiln_mul(g, x, y))));
	kiln_tensor *in[2] = {rand_f32(2, (int64_t[]){4, 19}, -3, 3),
	                      rand_f32(2, (int64_t[]){4, 19}, -3, 3)};
	compile_and_compare(g, "cmp", in, 2, 1, 0);
	kiln_tensor_free(in[0]);
	kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

static kiln_graph *example(const char *which, kiln_value (*model)(kiln_graph *, kiln_value),
                           int rank, const int64_t *dims)
{
	kiln_graph *g = kiln_graph_new(which);
	int64_t d[4];
	memcpy(d, dims, (size_t)rank * sizeof *d);
	d[0] = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, rank, d);
	kiln_output(g, "logits", model(g, x));
	char p[512];
	snprintf(p, sizeof p, "%s/models/%s.safetensors", KILN_FIXTURES, which);
	kiln_tensor_set *s = NULL;
	kiln_error e = {0};
	ck_assert_int_eq(kiln_safetensors_read(p, &s, &e), KILN_OK);
	ck_assert_msg(kiln_graph_load_params(g, s, &e) == KILN_OK, "%s", e.msg);
	kiln_tensor_set_free(s);
	return g;
}

/* The example model against the interpreter and PyTorch's output. */
static void check_example(const char *which, kiln_value (*model)(kiln_graph *, kiln_value),
                          int rank, const int64_t *dims)
{
	kiln_graph *g = example(which, model, rank, dims);
	char p[512];
	kiln_tensor *x = NULL, *want = NULL;
	snprintf(p, sizeof p, "%s/models/%s_input.npy", KILN_FIXTURES, which);
	ck_assert_int_eq(kiln_npy_read(p, &x, NULL), KILN_OK);
	snprintf(p, sizeof p, "%s/models/%s_output.npy", KILN_FIXTURES, which);
	ck_assert_int_eq(kiln_npy_read(p, &want, NULL), KILN_OK);
	compile_and_compare(g, which, &x, 1, 2, 1e-4f);
	char so[512];
	ck_assert_int_eq(kiln_compile(g, path_of(so, which, ".so"), NULL, NULL), KILN_OK);
	lib l = open_lib(so);
	kiln_tensor *y = kiln_tensor_new(KILN_F32, want->rank, want->shape);
	ck_assert_int_eq(rt_model_run_tensors(l.m, (const kiln_tensor *const[]){x}, 1, &y, 1),
	                 KILN_OK);
	ck_assert_float_le(max_diff(y, want, NULL), 1e-4f);
	close_lib(&l);
	remove_outputs(which);
	kiln_tensor_free(x);
	kiln_tensor_free(want);
	kiln_tensor_free(y);
	kiln_graph_free(g);
}

START_TEST(mlp_matches_interpreter_and_pytorch)
{
	check_example("mlp", example_mlp, 2, (int64_t[]){0, 784});
}
END_TEST

START_TEST(cnn_matches_interpreter_and_pytorch)
{
	check_example("cnn", example_cnn, 4, (int64_t[]){0, 1, 28, 28});
}
END_TEST

typedef void *(*create_fn)(void);
typedef int (*run_fn)(void *, int64_t, const float *, float *);
typedef void (*destroy_fn)(void *);
typedef const char *(*errmsg_fn)(const void *);

START_TEST(typed_entry_points_run_and_reject_bad_calls)
{
	kiln_graph *g = example("mlp", example_mlp, 2, (int64_t[]){0, 784});
	char so[512], h[512];
	kiln_compile_opts o = {.name = "mnist"};
	kiln_error e = {0};
	ck_assert_msg(kiln_compile(g, path_of(so, "mlp", ".so"), &o, &e) == KILN_OK, "%s", e.msg);
	char *hdr = slurp(path_of(h, "mlp", ".h"));
	ck_assert_ptr_nonnull(strstr(hdr, "typedef struct mnist_ctx mnist_ctx;"));
	ck_assert_ptr_nonnull(strstr(hdr, "int mnist_run(mnist_ctx *ctx, int64_t N,\n"
	                                  "        const float *x,\n        float *logits);"));
	ck_assert_ptr_nonnull(strstr(hdr, "x: f32[N,784]"));
	free(hdr);
	void *so_h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_ptr_nonnull(so_h);
	create_fn create = (create_fn)dlsym(so_h, "mnist_create");
	run_fn run = (run_fn)dlsym(so_h, "mnist_run");
	destroy_fn destroy = (destroy_fn)dlsym(so_h, "mnist_destroy");
	errmsg_fn errmsg = (errmsg_fn)dlsym(so_h, "mnist_errmsg");
	ck_assert(create && run && destroy && errmsg);
	ck_assert_ptr_null(dlsym(so_h, "k0_gemm")); /* kernels stay internal */
	void *ctx = create();
	ck_assert_ptr_nonnull(ctx);
	kiln_tensor *x = rand_f32(2, (int64_t[]){3, 784}, 0, 1), *ref[1];
	ck_assert_int_eq(kiln_graph_run(g, &x, 1, ref, 1, NULL), KILN_OK);
	float y[30];
	ck_assert_int_eq(run(ctx, 3, x->data, y), KILN_OK);
	for (int i = 0; i < 30; i++)
		ck_assert_float_eq_tol(y[i], ((float *)ref[0]->data)[i], 1e-4);
	ck_assert_int_eq(run(ctx, 3, NULL, y), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(errmsg(ctx), "NULL"));
	ck_assert_int_eq(run(ctx, -1, x->data, y), KILN_EINVAL);
	destroy(ctx);
	dlclose(so_h);
	kiln_tensor_free(x);
	kiln_tensor_free(ref[0]);
	remove_outputs("mlp");
	kiln_graph_free(g);
}
END_TEST

/* A backend reads the cg_module alone (codegen/backend.h): with the graph
 * taken from a lowered module, the library still knows its symbol, its
 * names and symbolic dims, and computes what the interpreter does. */
START_TEST(backend_reads_the_module_not_the_graph)
{
	kiln_graph *g = example("mlp", example_mlp, 2, (int64_t[]){0, 784});
	cg_module *m = NULL;
	kiln_error e = {0};
	ck_assert_msg(cg_lower_ex(g, &(cg_lower_opts){.fuse = true}, &m, &e) == KILN_OK, "%s",
	              e.msg);
	ck_assert_msg(cg_memplan(m, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(m->nsym, 1);
	ck_assert_str_eq(m->symname[0], "N");
	const cg_buf *x = &m->buf[m->inputs[0]];
	ck_assert_int_eq(x->dim[0]->kind, CG_SIZE);
	ck_assert_int_eq(cg_expr_int(x->dim[1], NULL), 784);
	ck_assert_str_eq(x->type_text, "f32[N,784]");
	m->g = NULL;
	char so[512], h[512];
	kiln_compile_opts o = {0};
	ck_assert_msg(cg_emit(NULL, m, path_of(so, "nograph", ".so"), &o, "nograph", &e) == KILN_OK,
	              "%s", e.msg);
	cg_module_free(m);
	char *hdr = slurp(path_of(h, "nograph", ".h"));
	ck_assert_msg(strstr(hdr, "x: f32[N,784]") && strstr(hdr, "int64_t N"), "%s", hdr);
	free(hdr);
	lib l = open_lib(so);
	ck_assert_int_eq(l.d->nsym, 1);
	ck_assert_str_eq(l.d->sym_names[0], "N");
	ck_assert_str_eq(l.d->inputs[0].name, "x");
	ck_assert_int_eq(l.d->inputs[0].dim_kind[0], RT_DIM_SYM);
	kiln_tensor *in = rand_f32(2, (int64_t[]){3, 784}, 0, 1), *ref[1];
	ck_assert_int_eq(kiln_graph_run(g, &in, 1, ref, 1, NULL), KILN_OK);
	float y[30];
	ck_assert_int_eq(rt_model_run(l.m, (const int64_t[]){3}, (const void *const[]){in->data},
	                              (void *const[]){y}), KILN_OK);
	for (int i = 0; i < 30; i++)
		ck_assert_float_eq_tol(y[i], ((float *)ref[0]->data)[i], 1e-4);
	close_lib(&l);
	kiln_tensor_free(in);
	kiln_tensor_free(ref[0]);
	remove_outputs("nograph");
	kiln_graph_free(g);
}
END_TEST

/* ---- --emit stages ------------------------------------------------------- */

static kiln_graph *small_graph(void)
{
	kiln_graph *g = kiln_graph_new("small");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){N, 64});
	kiln_output(g, "y", kiln_exp(g, kiln_relu(g, x)));
	return g;
}

static char *emit(kiln_graph *g, const char *stage, const char *ext)
{
	char p[512];
	kiln_compile_opts o = {.emit = stage};
	kiln_error e = {0};
	kiln_status st = kiln_compile(g, path_of(p, "small", ext), &o, &e);
	ck_assert_msg(st == KILN_OK, "--emit=%s: %s", stage, e.msg);
	char *s = slurp(p);
	unlink(p);
	return s;
}

START_TEST(emit_stages_write_their_formats)
{
	kiln_graph *g = small_graph();
	char *kir = emit(g, "kir", ".kir"), *ll = emit(g, "ll", ".ll");
	char *as = emit(g, "asm", ".s"), *obj = emit(g, "obj", ".o");
	/* what each stage holds is checked by FileCheck (tests/kir/codegen) */
	ck_assert_mem_eq(kir, "module ", 7);
	ck_assert_mem_eq(ll, "; ModuleID", 10);
	ck_assert_ptr_nonnull(strstr(as, "small_create:"));
	ck_assert_mem_eq(obj, "\177ELF", 4);
	free(kir);
	free(ll);
	free(as);
	free(obj);
	kiln_graph_free(g);
}
END_TEST

/* LLVM compiles a library in parts on kiln_compile_opts.jobs threads and
 * the weights go into an object of their own (codegen/llvm_emit.c,
 * blob.c): the library is the same bytes whatever the number of threads,
 * it computes what the interpreter does, equal weights are stored once,
 * and the time report adds up. */
static char *slurp_n(const char *path, size_t *n)
{
	char *s = slurp(path);
	struct stat sb;
	ck_assert_int_eq(stat(path, &sb), 0);
	*n = (size_t)sb.st_size;
	return s;
}

#ifndef SHF_X86_64_LARGE
#define SHF_X86_64_LARGE 0x10000000
#endif

/* The weights' section of a library image: a large-data one (.lrodata,
 * SHF_X86_64_LARGE) laid out after every other allocated section, so that
 * past 2 GiB of weights the code's 32-bit PC-relative references to the
 * GOT, .data and .rodata still reach (a 2.36 GB Gather table did not link
 * while the weights sat in .rodata).  Returns its size. */
static uint64_t check_weights_last(const char *img, size_t n)
{
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
	ck_assert(n >= sizeof *eh && eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) <= n);
	const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
	const char *names = img + sh[eh->e_shstrndx].sh_offset;
	int w = -1;
	for (int i = 0; i < eh->e_shnum; i++)
		if (!strcmp(names + sh[i].sh_name, ".lrodata"))
			w = i;
	ck_assert_msg(w >= 0, "no .lrodata section");
	ck_assert(sh[w].sh_flags & SHF_ALLOC);
	ck_assert(sh[w].sh_flags & SHF_X86_64_LARGE);
	for (int i = 0; i < eh->e_shnum; i++)
		if (i != w && (sh[i].sh_flags & SHF_ALLOC))
			ck_assert_msg(sh[i].sh_addr + sh[i].sh_size <= sh[w].sh_addr,
			              "section %s ends past the weights' start",
			              names + sh[i].sh_name);
	return sh[w].sh_size;
}

START_TEST(library_is_the_same_whatever_the_threads)
{
	kiln_graph *g = kiln_graph_new("three");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){N, 64});
	kiln_tensor *w = rand_f32(2, (int64_t[]){64, 64}, -1, 1);
	kiln_tensor *w3 = rand_f32(2, (int64_t[]){64, 64}, -1, 1);
	kiln_value y = kiln_add(g, kiln_matmul(g, x, kiln_param(g, "w1", w)),
	                        kiln_matmul(g, x, kiln_param(g, "w2", w)));
	y = kiln_add(g, y, kiln_matmul(g, x, kiln_param(g, "w3", w3)));
	/* enough kernels for several parts */
	for (int i = 0; i < 12; i++)
		y = kiln_tanh(g, kiln_add(g, kiln_softmax(g, y, 1), kiln_sigmoid(g, y)));
	kiln_output(g, "y", y);
	char so[512];
	kiln_compile_times t1, t3;
	kiln_error e = {0};
	ck_assert_msg(kiln_compile(g, path_of(so, "three", ".so"),
	                           &(kiln_compile_opts){.jobs = 1, .times = &t1}, &e) == KILN_OK,
	              "%s", e.msg);
	size_t n1, n3;
	char *b1 = slurp_n(so, &n1);
	ck_assert_msg(kiln_compile(g, so, &(kiln_compile_opts){.jobs = 3, .times = &t3}, &e) ==
	              KILN_OK, "%s", e.msg);
	char *b3 = slurp_n(so, &n3);
	ck_assert_int_eq(n1, n3);
	ck_assert(memcmp(b1, b3, n1) == 0);
	ck_assert_int_gt(t1.parts, 1);
	ck_assert_int_eq(t3.parts, t1.parts);
	ck_assert_int_eq(t1.jobs, 1);
	ck_assert_int_eq(t3.jobs, t1.parts < 3 ? t1.parts : 3);
	/* w1 == w2: packed once, in panels of CG_PANEL_ROWS(64) rows */
	ck_assert_uint_eq(t1.weights_bytes,
	                  2 * 64 * CG_PANEL_ROWS(64) * sizeof(float));
	ck_assert_uint_ge(check_weights_last(b1, n1), t1.weights_bytes);
	ck_assert(t1.lower > 0 && t1.emit > 0 && t1.optimize > 0 && t1.codegen > 0 && t1.link > 0);
	ck_assert(t1.llvm >= 0.9 * (t1.optimize + t1.codegen)); /* one thread: the sum */
	ck_assert(t1.total >= t1.lower + t1.emit + t1.llvm + t1.link);
	lib l = open_lib(so);
	kiln_tensor *in = rand_f32(2, (int64_t[]){5, 64}, -1, 1), *ref = NULL;
	ck_assert_int_eq(kiln_graph_run(g, &in, 1, &ref, 1, NULL), KILN_OK);
	kiln_tensor *out = kiln_tensor_new(KILN_F32, 2, (int64_t[]){5, 64});
	ck_assert_int_eq(rt_model_run_tensors(l.m, (const kiln_tensor *const[]){in}, 1, &out, 1),
	                 KILN_OK);
	ck_assert_float_le(max_diff(out, ref, NULL), 1e-4f);
	close_lib(&l);
	free(b1);
	free(b3);
	kiln_tensor_free(in), kiln_tensor_free(ref), kiln_tensor_free(out);
	kiln_tensor_free(w), kiln_tensor_free(w3);
	remove_outputs("three");
	kiln_graph_free(g);
}
END_TEST

/* kiln_sgemm and kiln_transpose are compiled once per target and kept in
 * the cache folder (llvm_emit.c): a second model with a GEMM takes them
 * from there, and its library is the same bytes as one compiled without
 * the cache; a damaged cached object is compiled again and replaced; ""
 * turns the cache off. */
static kiln_graph *gemm_graph(const char *name, int64_t k)
{
	kiln_graph *g = kiln_graph_new(name);
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){N, k});
	kiln_tensor *w = rand_f32(2, (int64_t[]){k, 24}, -1, 1);
	kiln_output(g, "y", kiln_relu(g, kiln_matmul(g, x, kiln_param(g, "w", w))));
	kiln_tensor_free(w);
	return g;
}

static int count_files(const char *d)
{
	DIR *dp = opendir(d);
	int n = 0;
	for (struct dirent *e; dp && (e = readdir(dp));)
		n += e->d_name[0] != '.';
	if (dp)
		closedir(dp);
	return n;
}

START_TEST(gemm_helpers_are_cached_per_target)
{
	char cache[600], so[512], bad[1200] = "";
	snprintf(cache, sizeof cache, "%s/cache", dir);
	kiln_graph *a = gemm_graph("ga", 40), *b = gemm_graph("gb", 56);
	kiln_compile_times t;
	kiln_error e = {0};
	kiln_compile_opts o = {.cache_dir = cache, .times = &t};
	ck_assert_msg(kiln_compile(a, path_of(so, "ga", ".so"), &o, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(t.cached, 0);
	ck_assert_int_eq(count_files(cache), 1);
	ck_assert_msg(kiln_compile(b, path_of(so, "gb", ".so"), &o, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(t.cached, 1);
	ck_assert_int_eq(count_files(cache), 1);
	size_t n1, n2;
	char *b1 = slurp_n(so, &n1);
	kiln_compile_opts off = {.cache_dir = "", .times = &t};
	ck_assert(kiln_compile(b, so, &off, &e) == KILN_OK);
	ck_assert_int_eq(t.cached, 0);
	char *b2 = slurp_n(so, &n2);
	ck_assert_int_eq(n1, n2);
	ck_assert(memcmp(b1, b2, n1) == 0);
	/* damage the cached object: the compile still succeeds and repairs it */
	DIR *dp = opendir(cache);
	for (struct dirent *de; dp && (de = readdir(dp));)
		if (de->d_name[0] != '.')
			snprintf(bad, sizeof bad, "%s/%s", cache, de->d_name);
	if (dp)
		closedir(dp);
	FILE *f = fopen(bad, "wb");
	ck_assert_ptr_nonnull(f);
	fputs("not an object", f);
	fclose(f);
	ck_assert_msg(kiln_compile(a, path_of(so, "ga", ".so"), &o, &e) == KILN_OK, "%s", e.msg);
	lib l = open_lib(so);
	kiln_tensor *in = rand_f32(2, (int64_t[]){3, 40}, -1, 1), *ref = NULL;
	ck_assert_int_eq(kiln_graph_run(a, &in, 1, &ref, 1, NULL), KILN_OK);
	kiln_tensor *out = kiln_tensor_new(KILN_F32, 2, (int64_t[]){3, 24});
	ck_assert_int_eq(rt_model_run_tensors(l.m, (const kiln_tensor *const[]){in}, 1, &out, 1),
	                 KILN_OK);
	ck_assert_float_le(max_diff(out, ref, NULL), 1e-4f);
	close_lib(&l);
	struct stat sb;
	ck_assert_int_eq(stat(bad, &sb), 0);
	ck_assert_int_gt(sb.st_size, 1000); /* an object again */
	unlink(bad);
	rmdir(cache);
	free(b1), free(b2);
	kiln_tensor_free(in), kiln_tensor_free(ref), kiln_tensor_free(out);
	remove_outputs("ga"), remove_outputs("gb");
	kiln_graph_free(a), kiln_graph_free(b);
}
END_TEST

/* ---- errors -------------------------------------------------------------- */

static void expect_error(const kiln_compile_opts *o, kiln_status code, const char *want)
{
	kiln_graph *g = small_graph();
	char p[512];
	kiln_error e = {0};
	ck_assert_int_eq(kiln_compile(g, path_of(p, "bad", ".so"), o, &e), code);
	ck_assert_msg(strstr(e.msg, want), "message '%s' lacks '%s'", e.msg, want);
	ck_assert_int_ne(access(p, F_OK), 0); /* nothing half-written */
	kiln_graph_free(g);
}

START_TEST(bad_cpu_feature_or_stage_is_an_error)
{
	expect_error(&(kiln_compile_opts){.cpu = "pentium9"}, KILN_EINVAL, "unknown CPU 'pentium9'");
	expect_error(&(kiln_compile_opts){.features = "+avx9"}, KILN_EINVAL,
	             "unknown CPU feature '+avx9'");
	expect_error(&(kiln_compile_opts){.emit = "wasm"}, KILN_EINVAL, "unknown --emit 'wasm'");
	ck_assert_int_eq(kiln_compile(NULL, "x.so", NULL, NULL), KILN_EINVAL);
}
END_TEST

START_TEST(malformed_kernel_ir_is_an_error_not_a_crash)
{
	cg_module *m = unary_module(CG_EXP, 16);
	/* a read of a loop variable outside its loop */
	cg_kernel *k = cg_kernel_new(m, "k1_bad", 0);
	int i = cg_var_new(k);
	cg_append(m, k->body, cg_store(m, m->outputs[0], cg_var(m, i, KILN_I64),
	                               cg_const(m, KILN_F32, 1)));
	char p[512];
	kiln_error e = {0};
	kiln_compile_opts o = {.emit = "ll"};
	ck_assert_int_eq(cg_emit(NULL, m, path_of(p, "bad", ".ll"), &o, "bad", &e), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(e.msg, "kernel 'k1_bad'"));
	ck_assert_ptr_nonnull(strstr(e.msg, "outside the loop"));
	ck_assert_int_ne(access(p, F_OK), 0);
	cg_module_free(m);
}
END_TEST

/* A kernel the backend cannot take fails the compile naming the backend,
 * the kernel and what it cannot take, before anything is written. */
START_TEST(unsupported_kernel_names_backend_and_kernel)
{
	ck_assert_ptr_nonnull(cg_backend_find("llvm"));
	ck_assert_ptr_eq(cg_backend_find(NULL), cg_backend_find("llvm"));
	ck_assert_ptr_null(cg_backend_find("no-such-backend"));
	cg_module *m = cg_module_new(NULL);
	int a = cg_buf_new(m, CG_BUF_INPUT, KILN_I8, cg_int(m, 4));
	int b = cg_buf_new(m, CG_BUF_CONST, KILN_I8, cg_int(m, 4));
	int c = cg_buf_new(m, CG_BUF_OUTPUT, KILN_I32, cg_int(m, 4));
	m->buf[a].type = (ir_type){KILN_I8, 2, {2, 2}};
	m->buf[b].type = (ir_type){KILN_I8, 2, {2, 2}};
	m->buf[c].type = (ir_type){KILN_I32, 2, {2, 2}};
	m->inputs = malloc(sizeof(int));
	m->outputs = malloc(sizeof(int));
	m->inputs[0] = a;
	m->outputs[0] = c;
	m->ninputs = m->noutputs = 1;
	cg_kernel *k = cg_kernel_new(m, "k0_qgemm", 0);
	cg_gemm g = {.a = a, .b = b, .c = c, .bias = -1, .M = cg_int(m, 2), .N = cg_int(m, 2),
	             .K = cg_int(m, 2), .batch = cg_int(m, 1), .a_rs = cg_int(m, 2),
	             .a_cs = cg_int(m, 1), .b_rs = cg_int(m, 2), .b_cs = cg_int(m, 1),
	             .c_rs = cg_int(m, 2), .alpha = 1, .beta = 1, .acc_dt = KILN_I32};
	cg_stmt *s = cg_gemm_stmt(m, &g); /* an 8-bit GEMM adding C: no kernel takes beta */
	ck_assert_ptr_nonnull(s);
	ck_assert_int_eq(s->gemm->a_dt, KILN_I8);
	ck_assert_int_eq(s->gemm->c_dt, KILN_I32);
	cg_append(m, k->body, s);
	char p[512];
	kiln_error e = {0};
	kiln_compile_opts o = {.emit = "ll"};
	kiln_status st = cg_emit(NULL, m, path_of(p, "qgemm", ".ll"), &o, "qgemm", &e);
	ck_assert_msg(st == KILN_EUNSUPPORTED, "%d %s", st, e.msg);
	ck_assert_msg(strstr(e.msg, "backend 'llvm' cannot take kernel 'k0_qgemm'") &&
	              strstr(e.msg, "i8"), "%s", e.msg);
	ck_assert_int_ne(access(p, F_OK), 0);
	cg_module_free(m);
}
END_TEST

static Suite *codegen_suite(void)
{
	Suite *s = suite_create("codegen");
	TCase *tc = tcase_create("math");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, exp_within_2_ulp_of_libm);
	tcase_add_test(tc, tanh_within_1e6_of_libm);
	tcase_add_test(tc, erf_within_1e6_of_libm);
	tcase_add_test(tc, sigmoid_within_1e6_of_libm);
	tcase_add_test(tc, exp_kernel_vectorizes_to_zmm_on_avx512_host);
	tcase_add_test(tc, target_is_the_host_unless_overridden);
	suite_add_tcase(s, tc);
	tc = tcase_create("parallel");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, parallel_loop_is_outlined_and_runs_on_threads);
	tcase_add_test(tc, parallel_loop_reading_an_outer_local_runs_serially);
	suite_add_tcase(s, tc);
	tc = tcase_create("graphs");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, elementwise_broadcast_matches_interpreter);
	tcase_add_test(tc, bool_int_and_select_outputs_match_interpreter);
	tcase_add_test(tc, reductions_and_softmax_match_interpreter);
	tcase_add_test(tc, matmul_and_gemm_match_interpreter);
	tcase_add_test(tc, conv_pool_batchnorm_match_interpreter);
	tcase_add_test(tc, mlp_matches_interpreter_and_pytorch);
	tcase_add_test(tc, cnn_matches_interpreter_and_pytorch);
	tcase_add_test(tc, typed_entry_points_run_and_reject_bad_calls);
	suite_add_tcase(s, tc);
	tc = tcase_create("emit");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, emit_stages_write_their_formats);
	tcase_add_test(tc, library_is_the_same_whatever_the_threads);
	tcase_add_test(tc, gemm_helpers_are_cached_per_target);
	suite_add_tcase(s, tc);
	tc = tcase_create("errors");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, bad_cpu_feature_or_stage_is_an_error);
	tcase_add_test(tc, malformed_kernel_ir_is_an_error_not_a_crash);
	tcase_add_test(tc, unsupported_kernel_names_backend_and_kernel);
	tcase_add_test(tc, backend_reads_the_module_not_the_graph);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(codegen_suite)
