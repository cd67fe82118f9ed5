/*
 * test_models.c: end to end against PyTorch.  The example MLP and CNN are
 * traced with the DSL (examples/models.h), PyTorch's state_dicts are loaded
 * from safetensors by name, and the interpreter's logits must match
 * PyTorch's to 1e-5 (fixtures from tests/fixtures/make_model_fixtures.py).
 * Loading a state_dict that does not fit the graph fails naming the tensor.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "examples/models.h"
#include "kiln/kiln.h"

#include "check_main.h"

#define MODELS KILN_FIXTURES "/models/"

typedef kiln_value (*model_fn)(kiln_graph *g, kiln_value x);

/* Traces model on a symbolic batch: x is [N, feat...]. */
static kiln_graph *trace(const char *name, model_fn model, int rank, const int64_t *feat)
{
	kiln_graph *g = kiln_graph_new(name);
	int64_t dims[KILN_MAX_RANK] = {kiln_sym(g, "N")};
	memcpy(dims + 1, feat, (rank - 1) * sizeof *feat);
	kiln_value x = kiln_input(g, "x", KILN_F32, rank, dims);
	kiln_output(g, "logits", model(g, x));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_verify(g, &err) == KILN_OK, "%s", err.msg);
	return g;
}

static kiln_tensor_set *load_state(const char *file)
{
	kiln_tensor_set *s = NULL;
	kiln_error err = {0};
	kiln_status st = kiln_safetensors_read(file, &s, &err);
	ck_assert_msg(st == KILN_OK, "%s", err.msg);
	return s;
}

static kiln_tensor *load_npy(const char *file)
{
	kiln_tensor *t = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_npy_read(file, &t, &err) == KILN_OK, "%s", err.msg);
	return t;
}

/* Runs g on the fixture input and returns max |kiln - torch|. */
static double run_vs_torch(kiln_graph *g, const char *model)
{
	char path[512];
	snprintf(path, sizeof path, MODELS "%s.safetensors", model);
	kiln_tensor_set *s = load_state(path);
	kiln_error err = {0};
	kiln_status st = kiln_graph_load_params(g, s, &err);
	kiln_tensor_set_free(s);
	ck_assert_msg(st == KILN_OK, "%s", err.msg);
	snprintf(path, sizeof path, MODELS "%s_input.npy", model);
	kiln_tensor *x = load_npy(path);
	snprintf(path, sizeof path, MODELS "%s_output.npy", model);
	kiln_tensor *want = load_npy(path), *got = NULL;
	st = kiln_graph_run(g, &x, 1, &got, 1, &err);
	ck_assert_msg(st == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(got->dtype, KILN_F32);
	ck_assert_int_eq(got->rank, 2);
	ck_assert_int_eq(got->shape[0], want->shape[0]);
	ck_assert_int_eq(got->shape[1], want->shape[1]);
	double maxerr = 0;
	const float *a = got->data, *b = want->data;
	for (int64_t i = 0; i < kiln_tensor_numel(want); i++)
		maxerr = fmax(maxerr, fabs((double)a[i] - b[i]));
	kiln_tensor_free(x);
	kiln_tensor_free(want);
	kiln_tensor_free(got);
	return maxerr;
}

START_TEST(mlp_matches_pytorch)
{
	kiln_graph *g = trace("mlp", example_mlp, 2, (int64_t[]){784});
	double e = run_vs_torch(g, "mlp");
	ck_assert_msg(e <= 1e-5, "max abs error %g", e);
	kiln_graph_free(g);
}
END_TEST

START_TEST(cnn_matches_pytorch)
{
	kiln_graph *g = trace("cnn", example_cnn, 4, (int64_t[]){1, 28, 28});
	double e = run_vs_torch(g, "cnn");
	ck_assert_msg(e <= 1e-5, "max abs error %g", e);
	kiln_graph_free(g);
}
END_TEST

/* A copy of s without the tensor named skip (NULL: everything). */
static kiln_tensor_set *copy_without(const kiln_tensor_set *s, const char *skip)
{
	kiln_tensor_set *c = kiln_tensor_set_new();
	for (int i = 0; i < s->count; i++)
		if (!skip || strcmp(s->items[i].name, skip) != 0)
			ck_assert_int_eq(kiln_tensor_set_add(c, s->items[i].name, s->items[i].tensor),
			                 KILN_OK);
	return c;
}

static void expect_load_error(kiln_graph *g, const kiln_tensor_set *s, kiln_status code,
                              const char *name)
{
	kiln_error err = {0};
	ck_assert_int_eq(kiln_graph_load_params(g, s, &err), code);
	ck_assert_int_eq(err.code, code);
	ck_assert_msg(strstr(err.msg, name), "'%s' not named in: %s", name, err.msg);
}

START_TEST(state_dict_mismatches_name_the_tensor)
{
	kiln_graph *g = trace("cnn", example_cnn, 4, (int64_t[]){1, 28, 28});
	kiln_tensor_set *s = load_state(MODELS "cnn.safetensors");

	kiln_tensor_set *missing = copy_without(s, "features.5.running_var");
	expect_load_error(g, missing, KILN_EINVAL, "'features.5.running_var'");

	kiln_tensor_set *extra = copy_without(s, NULL);
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 1, (int64_t[]){3});
	kiln_tensor_set_add(extra, "features.9.weight", t);
	expect_load_error(g, extra, KILN_EINVAL, "'features.9.weight'");

	kiln_tensor_set *shaped = copy_without(s, NULL);
	kiln_tensor_free(t);
	t = kiln_tensor_new(KILN_F32, 2, (int64_t[]){10, 100});
	kiln_tensor_set_add(shaped, "classifier.2.weight", t);
	expect_load_error(g, shaped, KILN_ESHAPE, "'classifier.2.weight' is f32[10,100]");

	kiln_tensor_free(t);
	kiln_tensor_set_free(missing);
	kiln_tensor_set_free(extra);
	kiln_tensor_set_free(shaped);
	kiln_tensor_set_free(s);
	kiln_graph_free(g);
}
END_TEST

/* every tensor of PyTorch's state_dict is a parameter of the traced graph,
 * so the layer naming in examples/models.h matches torch.nn's */
START_TEST(traced_params_are_the_state_dict)
{
	kiln_graph *g = trace("cnn", example_cnn, 4, (int64_t[]){1, 28, 28});
	kiln_tensor_set *s = load_state(MODELS "cnn.safetensors");
	kiln_tensor_set *p = kiln_graph_params(g);
	ck_assert_int_eq(p->count, s->count);
	for (int i = 0; i < s->count; i++)
		ck_assert_msg(kiln_tensor_set_get(p, s->items[i].name), "missing %s",
		              s->items[i].name);
	ck_assert_int_eq(kiln_tensor_set_get(p, "features.1.num_batches_tracked")->dtype,
	                 KILN_I64);
	kiln_tensor_set_free(p);
	kiln_tensor_set_free(s);
	kiln_graph_free(g);
}
END_TEST

static Suite *models_suite(void)
{
	Suite *s = suite_create("models");
	TCase *tc = tcase_create("pytorch");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, mlp_matches_pytorch);
	tcase_add_test(tc, cnn_matches_pytorch);
	suite_add_tcase(s, tc);
	tc = tcase_create("state_dict");
	tcase_add_test(tc, state_dict_mismatches_name_the_tensor);
	tcase_add_test(tc, traced_params_are_the_state_dict);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(models_suite)
