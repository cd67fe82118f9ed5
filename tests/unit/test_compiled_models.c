/*
 * test_compiled_models.c: whole models compiled by kiln_compile into a .so
 * and run through kiln_load + kiln_model_run must match the reference
 * interpreter (kiln_graph_run) within 1e-4 max abs error, at batch 1 and 2:
 * the example MLP and CNN of examples/models.h with PyTorch's weights
 * (tests/fixtures/models), and the real models PyTorch exports
 * (ResNet-18, MobileNetV2, a transformer encoder block, and that block at a
 * fixed batch; BERT- and GPT-2-style blocks whose decomposed LayerNorm and
 * GELUs the nnfuse pass rewrites) from $KILN_REAL_MODELS, filled by
 * tests/onnx/make_real_models.py; ctest sets it (cmake/onnx_extra.cmake).
 * Without it the real-model tests print "SKIPPED: ..." and pass.
 *
 * The key idea: the batch-1 and batch-2 inputs are the first rows of the
 * fixture batch, and one library serves both, so the symbolic batch is
 * resolved at run time as a user's program would.  A model whose batch is
 * fixed runs at that batch only.  Each library lives in its own mkdtemp
 * folder, removed afterwards; nothing is cached between tests.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "kiln/kiln.h"
#include "lower_util.h"
#include "testutil.h"

#define TOL 1e-4

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The first n entries of x along dim 0, as a new tensor. */
static kiln_tensor *first_rows(const kiln_tensor *x, int64_t n)
{
	ck_assert_int_ge(x->shape[0], n);
	int64_t shape[KILN_MAX_RANK];
	memcpy(shape, x->shape, sizeof shape);
	shape[0] = n;
	kiln_tensor *t = kiln_tensor_new(x->dtype, x->rank, shape);
	ck_assert_ptr_nonnull(t);
	memcpy(t->data, x->data, kiln_tensor_nbytes(t));
	return t;
}

/* Largest |a - b| over two f32 tensors of the same shape. */
static double max_abs_diff(const char *what, const kiln_tensor *a, const kiln_tensor *b)
{
	ck_assert_int_eq(a->dtype, KILN_F32);
	ck_assert_int_eq(b->dtype, KILN_F32);
	ck_assert_int_eq(a->rank, b->rank);
	for (int k = 0; k < a->rank; k++)
		ck_assert_msg(a->shape[k] == b->shape[k], "%s: dim %d is %lld vs %lld", what, k,
		              (long long)a->shape[k], (long long)b->shape[k]);
	const float *x = a->data, *y = b->data;
	double worst = 0;
	for (int64_t i = 0; i < kiln_tensor_numel(a); i++) {
		double d = fabs((double)x[i] - y[i]);
		worst = d > worst || d != d ? (d != d ? INFINITY : d) : worst;
	}
	return worst;
}

/* Compiles g into a fresh folder, runs it on the first 1 and 2 rows of x
 * (or at g's fixed batch only) and compares with the interpreter. */
static void compiled_matches(const char *name, const kiln_graph *g, const kiln_tensor *x)
{
	char dir[] = "/tmp/kiln_compiled_models.XXXXXX", so[1200];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(so, sizeof so, "%s/%s.so", dir, name);
	kiln_error err = {0};
	kiln_compile_opts o = {.name = name};
	double t0 = now();
	kiln_status st = kiln_compile(g, so, &o, &err);
	double t1 = now();
	kiln_model *m = NULL;
	if (st == KILN_OK)
		st = kiln_load(so, &m, &err);
	tu_remove_dir(dir);
	ck_assert_msg(st == KILN_OK, "%s: %s: %s", name, kiln_status_str(st), err.msg);
	int64_t fixed = kiln_value_dim(g, kiln_graph_input(g, 0), 0);
	for (int64_t n = 1; n <= 2; n++) {
		if (fixed >= 0 && n != fixed)
			continue;
		kiln_tensor *in = first_rows(x, n), *want = NULL, *got = NULL;
		ck_assert_msg(kiln_graph_run(g, &in, 1, &want, 1, &err) == KILN_OK, "%s: %s", name,
		              err.msg);
		ck_assert_msg(kiln_model_run(m, &in, 1, &got, 1, &err) == KILN_OK, "%s: %s", name,
		              err.msg);
		double d = max_abs_diff(name, got, want);
		printf("%s: batch %lld: max abs error vs interpreter %.3g (compile %.1f s)\n", name,
		       (long long)n, d, t1 - t0);
		ck_assert_msg(d <= TOL, "%s batch %lld: max abs error %g > %g", name, (long long)n, d,
		              TOL);
		kiln_tensor_free(in);
		kiln_tensor_free(want);
		kiln_tensor_free(got);
	}
	kiln_model_free(m);
}

/* ---- the DSL examples ---------------------------------------------------- */

static void example_matches(const char *name, model_fn model, int rank, const int64_t *feat)
{
	kiln_graph *g = trained_model(name, model, rank, feat);
	kiln_tensor *x = model_input(name);
	compiled_matches(name, g, x);
	kiln_tensor_free(x);
	kiln_graph_free(g);
}

START_TEST(compiled_mlp_matches_interpreter)
{
	example_matches("mlp", example_mlp, 2, (int64_t[]){784});
}
END_TEST

START_TEST(compiled_cnn_matches_interpreter)
{
	example_matches("cnn", example_cnn, 4, (int64_t[]){1, 28, 28});
}
END_TEST

/* ---- real PyTorch models --------------------------------------------------- */

static void real_model_matches(const char *name)
{
	const char *dir = getenv("KILN_REAL_MODELS");
	char path[1024], ipath[1024];
	snprintf(path, sizeof path, "%s/%s.onnx", dir ? dir : "", name);
	snprintf(ipath, sizeof ipath, "%s/%s_input.npy", dir ? dir : "", name);
	if (!dir || access(path, R_OK) || access(ipath, R_OK)) {
		printf("SKIPPED: %s: %s (ctest -R test_compiled_models sets KILN_REAL_MODELS; "
		       "tests/onnx/make_real_models.py fills it)\n", name,
		       dir ? "no model in KILN_REAL_MODELS" : "KILN_REAL_MODELS unset");
		return;
	}
	kiln_error err = {0};
	kiln_graph *g = NULL;
	kiln_tensor *x = NULL;
	ck_assert_msg(kiln_npy_read(ipath, &x, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_onnx_import(path, &g, &err) == KILN_OK, "%s", err.msg);
	compiled_matches(name, g, x);
	kiln_graph_free(g);
	kiln_tensor_free(x);
}

START_TEST(compiled_resnet18_matches_interpreter) { real_model_matches("resnet18"); }
END_TEST
START_TEST(compiled_mobilenet_v2_matches_interpreter) { real_model_matches("mobilenet_v2"); }
END_TEST
START_TEST(compiled_transformer_matches_interpreter) { real_model_matches("transformer"); }
END_TEST
START_TEST(compiled_transformer_static_matches_interpreter)
{
	real_model_matches("transformer_static");
}
END_TEST

START_TEST(compiled_bert_o13_matches_interpreter) { real_model_matches("bert_o13"); }
END_TEST
START_TEST(compiled_gpt2_o13_matches_interpreter) { real_model_matches("gpt2_o13"); }
END_TEST
START_TEST(compiled_gpt2_o17_matches_interpreter) { real_model_matches("gpt2_o17"); }
END_TEST

static Suite *compiled_models_suite(void)
{
	Suite *s = suite_create("compiled_models");
	TCase *t = tcase_create("examples");
	tcase_add_test(t, compiled_mlp_matches_interpreter);
	tcase_add_test(t, compiled_cnn_matches_interpreter);
	suite_add_tcase(s, t);
	t = tcase_create("real_models");
	tcase_set_timeout(t, 1200);
	tcase_add_test(t, compiled_resnet18_matches_interpreter);
	tcase_add_test(t, compiled_mobilenet_v2_matches_interpreter);
	tcase_add_test(t, compiled_transformer_matches_interpreter);
	tcase_add_test(t, compiled_transformer_static_matches_interpreter);
	tcase_add_test(t, compiled_bert_o13_matches_interpreter);
	tcase_add_test(t, compiled_gpt2_o13_matches_interpreter);
	tcase_add_test(t, compiled_gpt2_o17_matches_interpreter);
	suite_add_tcase(s, t);
	return s;
}

KILN_CHECK_MAIN(compiled_models_suite)
