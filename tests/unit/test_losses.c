/*
 * test_losses.c: the DSL's losses against PyTorch.  Each case loads the
 * inputs, loss and autograd gradient that tests/fixtures/make_grad_fixtures.py
 * wrote (f64), traces the same loss with kiln's DSL, differentiates
 * sum(loss * r) with kiln_grad and runs both through the interpreter:
 * values and gradients must agree to 1e-10.  Bad arguments are refused with
 * a message and leave the graph as it was.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"
#include "kiln/kiln.h"

#include "check_main.h"

typedef enum { CE, NLL, MSE, L1, SL1, BCE } kind;

/* One fixture case: the loss and its options, as the script calls it. */
typedef struct lcase {
	const char *name;
	kind k;
	const char *red;
	int64_t ignore;  /* CE and NLL */
	double opt;      /* label smoothing (CE) or beta (smooth L1) */
	bool weight, pos_weight;
} lcase;

static const lcase cases[] = {
	{"ce_mean", CE, "mean", -100, 0, false, false},
	{"ce_weight_smooth", CE, "mean", -100, 0.1, true, false},
	{"ce_smooth_mean", CE, "mean", -100, 0.25, false, false},
	{"ce_spatial_sum_smooth", CE, "sum", 1, 0.2, false, false},
	{"ce_none_weight", CE, "none", -100, 0.3, true, false},
	{"nll_weight_ignore", NLL, "mean", 2, 0, true, false},
	{"nll_sum", NLL, "sum", -100, 0, false, false},
	{"mse_mean", MSE, "mean", 0, 0, false, false},
	{"l1_mean", L1, "mean", 0, 0, false, false},
	{"l1_none", L1, "none", 0, 0, false, false},
	{"smooth_l1_sum", SL1, "sum", 0, 0.5, false, false},
	{"smooth_l1_beta0", SL1, "mean", 0, 0, false, false},
	{"bce_mean", BCE, "mean", 0, 0, false, false},
	{"bce_weights_none", BCE, "none", 0, 0, true, true},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static kiln_graph *g;
static kiln_tensor *fx[8]; /* x, target, weight, pos_weight, r, loss, dx */
static kiln_tensor *outs[2];

enum { X, T, W, PW, R, LOSS, DX, NFX };

static void setup(void)
{
	g = kiln_graph_new("losses");
}

static void teardown(void)
{
	kiln_graph_free(g);
	g = NULL;
	for (int i = 0; i < NFX; i++) {
		kiln_tensor_free(fx[i]);
		fx[i] = NULL;
	}
	for (int i = 0; i < 2; i++) {
		kiln_tensor_free(outs[i]);
		outs[i] = NULL;
	}
}

static kiln_tensor *load(const char *cse, const char *what)
{
	char path[512];
	kiln_tensor *t = NULL;
	kiln_error err;
	snprintf(path, sizeof path, "%s/grad/%s_%s.npy", KILN_FIXTURES, cse, what);
	ck_assert_msg(kiln_npy_read(path, &t, &err) == KILN_OK, "%s", err.msg);
	return t;
}

static kiln_value trace(const lcase *c, kiln_value x, kiln_value t)
{
	kiln_value w = c->weight ? kiln_constant(g, fx[W]) : KILN_NONE;
	kiln_value pw = c->pos_weight ? kiln_constant(g, fx[PW]) : KILN_NONE;
	switch (c->k) {
	case CE: return kiln_cross_entropy(g, x, t, w, c->red, c->ignore, c->opt);
	case NLL: return kiln_nll_loss(g, x, t, w, c->red, true, c->ignore);
	case MSE: return kiln_mse_loss(g, x, t, c->red);
	case L1: return kiln_l1_loss(g, x, t, c->red);
	case SL1: return kiln_smooth_l1_loss(g, x, t, c->red, c->opt);
	case BCE: return kiln_bce_with_logits(g, x, t, w, pw, c->red);
	}
	return KILN_NONE;
}

static void close_to(const kiln_tensor *got, const kiln_tensor *want, const char *what,
                     const char *cse)
{
	ck_assert_int_eq(kiln_tensor_numel(got), kiln_tensor_numel(want));
	for (int64_t i = 0; i < kiln_tensor_numel(want); i++) {
		double a = ir_load(got, i), b = ir_load(want, i);
		ck_assert_msg(fabs(a - b) <= 1e-10 * fabs(b) + 1e-12, "%s %s[%lld]: kiln %.17g, "
		              "PyTorch %.17g", cse, what, (long long)i, a, b);
	}
}

START_TEST(loss_and_gradient_match_pytorch)
{
	const lcase *c = &cases[_i];
	static const char *const names[NFX] = {"x", "target", "weight", "pos_weight", "r",
	                                       "loss", "dx"};
	for (int i = 0; i < NFX; i++)
		if ((i != W || c->weight) && (i != PW || c->pos_weight))
			fx[i] = load(c->name, names[i]);
	kiln_value x = kiln_input(g, "x", KILN_F64, fx[X]->rank, fx[X]->shape);
	kiln_value t = kiln_input(g, "target", fx[T]->dtype, fx[T]->rank, fx[T]->shape);
	kiln_value loss = trace(c, x, t);
	ck_assert_msg(loss, "%s: %s", c->name, kiln_graph_errmsg(g));
	kiln_value total = kiln_reduce_sum(g, kiln_mul(g, loss, kiln_constant(g, fx[R])), 0, NULL,
	                                   false);
	kiln_value dx;
	ck_assert_msg(kiln_grad(g, total, 1, &x, &dx) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_output(g, "loss", loss);
	kiln_output(g, "dx", dx);
	kiln_error err;
	ck_assert_msg(kiln_graph_verify(g, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor *in[2] = {fx[X], fx[T]};
	ck_assert_msg(kiln_graph_run(g, in, 2, outs, 2, &err) == KILN_OK, "%s", err.msg);
	close_to(outs[0], fx[LOSS], "loss", c->name);
	close_to(outs[1], fx[DX], "dx", c->name);
}
END_TEST

/* ---- refused arguments ------------------------------------------------------- */

START_TEST(cross_entropy_rejects_label_smoothing_outside_0_1)
{
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){2, 3});
	kiln_value t = kiln_input(g, "t", KILN_I64, 1, (int64_t[]){2});
	uint32_t nnode = g->nnode;
	ck_assert_uint_eq(kiln_cross_entropy(g, x, t, KILN_NONE, "mean", -100, 1.5), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "test_losses.c:"));
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "label_smoothing 1.5 is not in [0, 1]"));
	ck_assert_uint_eq(g->nnode, nnode);
}
END_TEST

START_TEST(losses_reject_an_unknown_reduction)
{
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){2, 3});
	ck_assert_uint_eq(kiln_l1_loss(g, x, x, "avg"), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "L1Loss: reduction 'avg' is not mean"));
}
END_TEST

START_TEST(smooth_l1_rejects_a_negative_beta)
{
	kiln_value x = kiln_input(g, "x", KILN_F32, 1, (int64_t[]){3});
	ck_assert_uint_eq(kiln_smooth_l1_loss(g, x, x, "sum", -1.0), KILN_NONE);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "SmoothL1Loss: beta -1 is negative"));
}
END_TEST

START_TEST(a_failed_loss_leaves_no_nodes_behind)
{
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){2, 3});
	kiln_value y = kiln_input(g, "y", KILN_F32, 2, (int64_t[]){2, 4});
	uint32_t nnode = g->nnode, nval = g->nval;
	ck_assert_uint_eq(kiln_bce_with_logits(g, x, y, KILN_NONE, KILN_NONE, "mean"), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_ESHAPE);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "f32[2,4]"));
	ck_assert_uint_eq(g->nnode, nnode);
	ck_assert_uint_eq(g->nval, nval);
}
END_TEST

START_TEST(cross_entropy_with_smoothing_needs_fixed_classes)
{
	int64_t C = kiln_sym(g, "C");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){2, C});
	kiln_value t = kiln_input(g, "t", KILN_I64, 1, (int64_t[]){2});
	ck_assert_uint_eq(kiln_cross_entropy(g, x, t, KILN_NONE, "sum", -100, 0.1), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EUNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "fixed class count, got logits f32[2,C]"));
}
END_TEST

static Suite *losses_suite(void)
{
	Suite *s = suite_create("losses");
	TCase *tc = tcase_create("pytorch");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, loss_and_gradient_match_pytorch, 0, NCASES);
	suite_add_tcase(s, tc);
	tc = tcase_create("errors");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, cross_entropy_rejects_label_smoothing_outside_0_1);
	tcase_add_test(tc, losses_reject_an_unknown_reduction);
	tcase_add_test(tc, smooth_l1_rejects_a_negative_beta);
	tcase_add_test(tc, a_failed_loss_leaves_no_nodes_behind);
	tcase_add_test(tc, cross_entropy_with_smoothing_needs_fixed_classes);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(losses_suite)
