/*
 * test_generated.c: libraries made by kiln_compile, end to end: the
 * example CNN (examples/models.h) compiled to a .so must need only libc,
 * libm and libpthread, must compute what the reference interpreter
 * computes (kiln_load + kiln_model_run, and its typed entry points through
 * dlsym) within 1e-4 at several batches and thread counts, must refuse bad
 * shapes, null pointers and a batch of 0 with messages, and must be clean
 * under valgrind over create/run/destroy.
 *
 * valgrind does not decode AVX-512, so its library is compiled for the
 * portable x86-64-v3 (AVX2) instead of the host; the driver it watches is
 * built against the never-sanitized runtime archive, so the check runs even
 * from an ASan build.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "examples/models.h"
#include "kiln/kiln.h"
#include "so_util.h"

static char cnn_so[1200], cnn_v3_so[1200];
static kiln_graph *cnn_graph;

static kiln_graph *trace_cnn(void)
{
	kiln_graph *g = kiln_graph_new("cnn");
	ck_assert_ptr_nonnull(g);
	kiln_graph_seed(g, 1);
	int64_t N = kiln_sym(g, "N");
	const int64_t dims[] = {N, 1, 28, 28};
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, dims);
	kiln_output(g, "logits", example_cnn(g, x));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

static void compile_to(const char *path, const char *cpu)
{
	kiln_error e = {0};
	kiln_compile_opts o = {.name = "cnn", .cpu = cpu};
	kiln_status st = kiln_compile(cnn_graph, path, &o, &e);
	ck_assert_msg(st == KILN_OK, "kiln_compile %s: %s", path, e.msg);
}

/* The CNN traced once and compiled once per process (for the host, and
 * for x86-64-v3 when valgrind wants it). */
static void setup(void)
{
	if (cnn_graph)
		return;
	cnn_graph = trace_cnn();
	snprintf(cnn_so, sizeof cnn_so, "%s/cnn.so", so_dir("generated_test"));
	compile_to(cnn_so, NULL);
}

static void teardown_all(void)
{
	kiln_graph_free(cnn_graph);
	cnn_graph = NULL;
}

static kiln_tensor *images(int64_t n, uint64_t seed)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 4, (int64_t[]){n, 1, 28, 28});
	ck_assert_ptr_nonnull(t);
	float *p = t->data;
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++) {
		seed = seed * 6364136223846793005u + 1442695040888963407u;
		p[i] = (float)((seed >> 40) & 0xffffff) / 8388608.0f - 1.0f;
	}
	return t;
}

static void assert_close(const kiln_tensor *a, const kiln_tensor *b, double tol)
{
	ck_assert_int_eq(a->rank, b->rank);
	for (int k = 0; k < a->rank; k++)
		ck_assert_int_eq(a->shape[k], b->shape[k]);
	const float *x = a->data, *y = b->data;
	for (int64_t i = 0; i < kiln_tensor_numel(a); i++)
		ck_assert_msg(fabs(x[i] - y[i]) <= tol * (1 + fabs(y[i])), "element %lld: %g vs %g",
		              (long long)i, x[i], y[i]);
}

static kiln_tensor *reference(kiln_tensor *x)
{
	kiln_tensor *y = NULL;
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_run(cnn_graph, &x, 1, &y, 1, &e) == KILN_OK, "%s", e.msg);
	return y;
}

START_TEST(library_needs_only_libc_libm_libpthread)
{
	setup();
	char extra[1024];
	if (!have_tool("readelf")) {
		printf("skipped: readelf not found\n");
		return;
	}
	ck_assert(extra_needed(cnn_so, extra, sizeof extra));
	ck_assert_msg(!extra[0], "cnn.so needs %s", extra);
}
END_TEST

START_TEST(loaded_library_matches_interpreter)
{
	setup();
	kiln_model *m;
	kiln_error e = {0};
	ck_assert_msg(kiln_load(cnn_so, &m, &e) == KILN_OK, "%s", e.msg);
	ck_assert_str_eq(kiln_model_name(m), "cnn");
	ck_assert_str_eq(kiln_model_input(m, 0)->dim_names[0], "N");
	static const int64_t batches[] = {3, 1, 8, 2};
	for (int r = 0; r < 4; r++) {
		ck_assert_int_eq(kiln_model_set_threads(m, 1 + r % 2, &e), KILN_OK);
		kiln_tensor *x = images(batches[r], (uint64_t)r + 7), *y = NULL, *want = reference(x);
		ck_assert_msg(kiln_model_run(m, &x, 1, &y, 1, &e) == KILN_OK, "%s", e.msg);
		assert_close(y, want, 1e-4);
		kiln_tensor_free(x);
		kiln_tensor_free(y);
		kiln_tensor_free(want);
	}
	kiln_model_free(m);
}
END_TEST

START_TEST(loaded_library_refuses_bad_inputs)
{
	setup();
	kiln_model *m;
	kiln_error e = {0};
	ck_assert_msg(kiln_load(cnn_so, &m, &e) == KILN_OK, "%s", e.msg);
	kiln_tensor *bad = kiln_tensor_new(KILN_F32, 4, (int64_t[]){2, 1, 28, 27}), *y = NULL;
	ck_assert_int_eq(kiln_model_run(m, &bad, 1, &y, 1, &e), KILN_ESHAPE);
	ck_assert_str_eq(e.msg, "input 'x': expected f32[N,1,28,28], got f32[2,1,28,27]");
	kiln_tensor_free(bad);
	bad = kiln_tensor_new(KILN_F32, 4, (int64_t[]){0, 1, 28, 28});
	ck_assert_int_eq(kiln_model_run(m, &bad, 1, &y, 1, &e), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(e.msg, "batch N = 0"));
	kiln_tensor_free(bad);
	bad = NULL;
	ck_assert_int_eq(kiln_model_run(m, &bad, 1, &y, 1, &e), KILN_EINVAL);
	ck_assert_str_eq(e.msg, "input 0 ('x') is NULL");
	kiln_model_free(m);
}
END_TEST

typedef void *(*create_fn)(void);
typedef int (*run_fn)(void *, int64_t, const float *, float *);
typedef const char *(*errmsg_fn)(const void *);
typedef void (*destroy_fn)(void *);

START_TEST(typed_entry_points_match_interpreter)
{
	setup();
	void *h = dlopen(cnn_so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h, "%s", dlerror());
	create_fn create = (create_fn)dlsym(h, "cnn_create");
	run_fn run = (run_fn)dlsym(h, "cnn_run");
	errmsg_fn errmsg = (errmsg_fn)dlsym(h, "cnn_errmsg");
	destroy_fn destroy = (destroy_fn)dlsym(h, "cnn_destroy");
	ck_assert(create && run && errmsg && destroy);
	void *ctx = create();
	ck_assert_ptr_nonnull(ctx);
	kiln_tensor *x = images(5, 99), *want = reference(x);
	kiln_tensor *y = kiln_tensor_new(KILN_F32, 2, (int64_t[]){5, 10});
	ck_assert_msg(run(ctx, 5, x->data, y->data) == KILN_OK, "%s", errmsg(ctx));
	assert_close(y, want, 1e-4);
	ck_assert_int_eq(run(ctx, 0, x->data, y->data), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(errmsg(ctx), "batch N = 0"));
	ck_assert_int_eq(run(ctx, 5, NULL, y->data), KILN_EINVAL);
	ck_assert_str_eq(errmsg(ctx), "input 'x' is NULL");
	destroy(ctx);
	kiln_tensor_free(x);
	kiln_tensor_free(y);
	kiln_tensor_free(want);
	dlclose(h);
}
END_TEST

START_TEST(valgrind_create_run_destroy_is_clean)
{
	setup();
	char exe[1200], out[16384], args[1300];
	if (!have_tool("valgrind")) {
		printf("skipped: valgrind not found\n");
		return;
	}
	snprintf(cnn_v3_so, sizeof cnn_v3_so, "%s/cnn_v3.so", so_dir("generated_test"));
	compile_to(cnn_v3_so, "x86-64-v3");
	snprintf(exe, sizeof exe, "%s/drive", so_dir("generated_test"));
	ck_assert_msg(build_driver(exe, out, sizeof out) == 0, "cc failed:\n%s", out);
	snprintf(args, sizeof args, "'%s' 2", cnn_v3_so);
	int rc = valgrind(exe, args, out, sizeof out);
	ck_assert_msg(rc == 0, "valgrind exit %d:\n%s", rc, out);
}
END_TEST

/* The same CNN quantized by kiln_quantize: its 8-bit library (QLinearConv,
 * a u8 MaxPool, the GEMM's scratch) is as clean over create/run/destroy. */
START_TEST(valgrind_int8_create_run_destroy_is_clean)
{
	setup();
	char so[1200], exe[1200], out[16384], args[1300];
	if (!have_tool("valgrind")) {
		printf("skipped: valgrind not found\n");
		return;
	}
	kiln_tensor *calib = images(16, 3);
	kiln_graph *q = NULL;
	kiln_error e = {0};
	ck_assert_msg(kiln_quantize(cnn_graph, &calib, 1, NULL, &q, NULL, &e) == KILN_OK, "%s", e.msg);
	snprintf(so, sizeof so, "%s/cnn_int8_v3.so", so_dir("generated_test"));
	kiln_compile_opts o = {.name = "cnn", .cpu = "x86-64-v3"};
	ck_assert_msg(kiln_compile(q, so, &o, &e) == KILN_OK, "kiln_compile %s: %s", so, e.msg);
	snprintf(exe, sizeof exe, "%s/drive", so_dir("generated_test"));
	ck_assert_msg(build_driver(exe, out, sizeof out) == 0, "cc failed:\n%s", out);
	snprintf(args, sizeof args, "'%s' 2", so);
	int rc = valgrind(exe, args, out, sizeof out);
	ck_assert_msg(rc == 0, "valgrind exit %d:\n%s", rc, out);
	kiln_tensor_free(calib), kiln_graph_free(q);
}
END_TEST

static Suite *generated_suite(void)
{
	Suite *s = suite_create("generated");
	TCase *tc = tcase_create("cnn");
	tcase_set_timeout(tc, 300); /* LLVM -O3 and valgrind */
	tcase_add_unchecked_fixture(tc, NULL, teardown_all);
	tcase_add_test(tc, library_needs_only_libc_libm_libpthread);
	tcase_add_test(tc, loaded_library_matches_interpreter);
	tcase_add_test(tc, loaded_library_refuses_bad_inputs);
	tcase_add_test(tc, typed_entry_points_match_interpreter);
	tcase_add_test(tc, valgrind_create_run_destroy_is_clean);
	tcase_add_test(tc, valgrind_int8_create_run_destroy_is_clean);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(generated_suite)
