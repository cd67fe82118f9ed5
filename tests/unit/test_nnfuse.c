/*
 * test_nnfuse.c: the nnfuse pass.  Each case builds the primitive spelling
 * of an op the way an exporter writes it, runs it through the interpreter
 * before and after `nnfuse,dce`, and checks both that the outputs agree and
 * which nodes the pass left; each near miss (a wrong constant, a wrong
 * operand order, an intermediate with a second reader) must stay as it is
 * and still compute the same.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "passes/passes.h"

/* ---- builders ----------------------------------------------------------- */

static ir_node *mk(kiln_graph *g, kiln_op op, uint32_t nin, const uint32_t *in)
{
	ir_node *n = ir_node_new(g, op, nin, in, 1, KILN_HERE);
	ck_assert_ptr_nonnull(n);
	return n;
}

static uint32_t done(kiln_graph *g, ir_node *n)
{
	ck_assert_msg(ir_infer_node(g, n) == KILN_OK, "%s", g->errmsg);
	return n->out[0];
}

static uint32_t op1(kiln_graph *g, kiln_op op, uint32_t a)
{
	return done(g, mk(g, op, 1, (uint32_t[]){a}));
}

static uint32_t op2(kiln_graph *g, kiln_op op, uint32_t a, uint32_t b)
{
	return done(g, mk(g, op, 2, (uint32_t[]){a, b}));
}

/* A rank-0 f32 Constant, as torch.onnx.export writes a Python float. */
static uint32_t k(kiln_graph *g, double v)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 0, NULL);
	((float *)t->data)[0] = (float)v;
	ir_node *c = mk(g, KILN_OP_CONSTANT, 0, NULL);
	ck_assert_int_eq(ir_attr_set_tensor(g, c, "value", t), KILN_OK);
	kiln_tensor_free(t);
	return done(g, c);
}

static uint32_t param(kiln_graph *g, const char *name, int n, double base)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 1, (int64_t[]){n});
	for (int i = 0; i < n; i++)
		((float *)t->data)[i] = (float)(base + 0.1 * i);
	uint32_t id = ir_param_new(g, name, t, true);
	kiln_tensor_free(t);
	return id;
}

static uint32_t mean(kiln_graph *g, uint32_t x, int64_t axis)
{
	ir_node *n = mk(g, KILN_OP_REDUCE_MEAN, 1, &x);
	ck_assert_int_eq(ir_attr_set_ints(g, n, "axes", 1, &axis), KILN_OK);
	return done(g, n);
}

enum { C = 8 };

static kiln_graph *graph(uint32_t *x)
{
	kiln_graph *g = kiln_graph_new("t");
	ir_type t = {KILN_F32, 3, {2, 3, C}};
	*x = ir_input_new(g, "x", &t);
	return g;
}

static int count_op(const kiln_graph *g, kiln_op op)
{
	int n = 0;
	for (uint32_t i = 0; i < g->nnode; i++)
		n += !g->node[i]->dead && g->node[i]->op == op;
	return n;
}

/* Runs g before and after `nnfuse,dce` on the same input (values spread
 * over [-4, 4], so GELU's curved part and its tails are both hit) and
 * checks the outputs agree to tol; returns the optimised graph. */
static kiln_graph *same_after(kiln_graph *g, double tol)
{
	kiln_graph *o = ir_graph_clone(g);
	ck_assert_ptr_nonnull(o);
	kiln_error e = {0};
	pass_opts po = {.verify = true};
	ck_assert_msg(pass_run_list(o, "nnfuse,dce", &po, &e) == KILN_OK, "%s", e.msg);
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 3, (int64_t[]){2, 3, C});
	int64_t n = kiln_tensor_numel(x);
	for (int64_t i = 0; i < n; i++)
		((float *)x->data)[i] = (float)(4 * sin(1.7 * (double)i) + 0.3 * (double)(i % 5));
	kiln_tensor *y0 = NULL, *y1 = NULL;
	ck_assert_msg(kiln_graph_run(g, &x, 1, &y0, 1, &e) == KILN_OK, "%s", e.msg);
	ck_assert_msg(kiln_graph_run(o, &x, 1, &y1, 1, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(kiln_tensor_numel(y0), kiln_tensor_numel(y1));
	const float *a = y0->data, *b = y1->data;
	double worst = 0, big = 0;
	for (int64_t i = 0; i < kiln_tensor_numel(y0); i++) {
		worst = fmax(worst, fabs(a[i] - b[i]));
		big = fmax(big, fabs(a[i]));
	}
	ck_assert_msg(worst <= tol, "max difference %g > %g", worst, tol);
	ck_assert_msg(big > 0.5, "degenerate output"); /* the comparison means something */
	kiln_tensor_free(x), kiln_tensor_free(y0), kiln_tensor_free(y1);
	return o;
}

static void output(kiln_graph *g, uint32_t v)
{
	ck_assert_int_eq(ir_output_add(g, v, "y"), KILN_OK);
}

/* ---- LayerNorm ------------------------------------------------------------- */

/* torch's opset-13 LayerNorm: mean, centre, Pow 2, mean, + eps, Sqrt, Div,
 * * gamma, + beta; square_by_mul writes d*d instead, swap commutes the
 * Adds and Muls, and axis picks the reduced axis. */
static uint32_t ln(kiln_graph *g, uint32_t x, bool square_by_mul, bool swap, bool affine,
                   int64_t axis, double two)
{
	uint32_t m = mean(g, x, axis), d = op2(g, KILN_OP_SUB, x, m);
	uint32_t sq = square_by_mul ? op2(g, KILN_OP_MUL, d, d) : op2(g, KILN_OP_POW, d, k(g, two));
	uint32_t v = mean(g, sq, axis), eps = k(g, 1e-5);
	uint32_t s = op1(g, KILN_OP_SQRT, swap ? op2(g, KILN_OP_ADD, eps, v) : op2(g, KILN_OP_ADD, v, eps));
	uint32_t y = op2(g, KILN_OP_DIV, d, s);
	if (!affine)
		return y;
	uint32_t gm = param(g, "gamma", C, 0.5), bt = param(g, "beta", C, -0.3);
	y = swap ? op2(g, KILN_OP_MUL, gm, y) : op2(g, KILN_OP_MUL, y, gm);
	return swap ? op2(g, KILN_OP_ADD, bt, y) : op2(g, KILN_OP_ADD, y, bt);
}

START_TEST(layer_norm_with_pow_becomes_one_node)
{
	uint32_t x;
	kiln_graph *g = graph(&x);
	output(g, op1(g, KILN_OP_RELU, ln(g, x, false, false, true, -1, 2)));
	kiln_graph *o = same_after(g, 1e-5);
	ck_assert_int_eq(count_op(o, KILN_OP_LAYER_NORM), 1);
	ck_assert_int_eq(count_op(o, KILN_OP_REDUCE_MEAN), 0);
	ck_assert_int_eq(count_op(o, KILN_OP_POW), 0);
	ck_assert_int_eq(count_op(o, KILN_OP_DIV), 0);
	for (uint32_t i = 0; i < o->nnode; i++)
		if (o->node[i]->op == KILN_OP_LAYER_NORM) {
			ck_assert_int_eq(o->node[i]->nin, 3);
			ck_assert_int_eq(ir_attr_int(o->node[i], "axis", 0), 2);
			ck_assert_double_eq_tol(ir_attr_float(o->node[i], "epsilon", 0), 1e-5, 1e-9);
		}
	kiln_graph_free(g), kiln_graph_free(o);
}
END_TEST

START_TEST(layer_norm_with_mul_commuted_and_as_graph_output)
{
	uint32_t x;
	kiln_graph *g = graph(&x);
	output(g, ln(g, x, true, true, true, 2, 2));
	kiln_graph *o = same_after(g, 1e-5);
	ck_assert_int_eq(count_op(o, KILN_OP_LAYER_NORM), 1);
	ck_assert_int_eq(o->nnode, 1);
	ck_assert_str_eq(o->val[o->output[0]]->name, "y");
	kiln_graph_free(g), kiln_graph_free(o);
}
END_TEST

START_TEST(layer_norm_without_affine_gets_unit_scale)
{
	uint32_t x;
	kiln_graph *g = graph(&x);
	output(g, op1(g, KILN_OP_EXP, ln(g, x, false, false, false, -1, 2)));
	kiln_graph *o = same_after(g, 1e-5);
	ck_assert_int_eq(count_op(o, KILN_OP_LAYER_NORM), 1);
	ck_assert_int_eq(count_op(o, KILN_OP_REDUCE_MEAN), 0);
	kiln_graph_free(g), kiln_graph_free(o);
}
END_TEST

START_TEST(layer_norm_near_misses_stay)
{
	for (int c = 0; c < 4; c++) {
		uint32_t x;
		kiln_graph *g = graph(&x);
		uint32_t y;
		if (c == 0) { /* normalised over axis 1, not a trailing block */
			y = ln(g, x, false, false, true, 1, 2);
			/* gamma [C] cannot be per axis-1 channel: make it broadcast anyway */
		} else if (c == 1) { /* Pow 3 is not a variance (becomes Muls, no LayerNorm) */
			y = ln(g, x, false, false, true, -1, 3);
		} else if (c == 2) { /* the centred value has a third reader */
			uint32_t m = mean(g, x, -1), d = op2(g, KILN_OP_SUB, x, m);
			uint32_t v = mean(g, op2(g, KILN_OP_MUL, d, d), -1);
			uint32_t s = op1(g, KILN_OP_SQRT, op2(g, KILN_OP_ADD, v, k(g, 1e-5)));
			y = op2(g, KILN_OP_ADD, op2(g, KILN_OP_DIV, d, s), op1(g, KILN_OP_TANH, d));
		} else { /* mean - x: the sign is flipped */
			uint32_t m = mean(g, x, -1), d = op2(g, KILN_OP_SUB, m, x);
			uint32_t v = mean(g, op2(g, KILN_OP_MUL, d, d), -1);
			uint32_t s = op1(g, KILN_OP_SQRT, op2(g, KILN_OP_ADD, v, k(g, 1e-5)));
			y = op2(g, KILN_OP_DIV, d, s);
		}
		output(g, y);
		kiln_graph *o = same_after(g, 1e-5);
		ck_assert_msg(count_op(o, KILN_OP_LAYER_NORM) == 0, "case %d rewritten", c);
		ck_assert_int_eq(count_op(o, KILN_OP_REDUCE_MEAN), 2);
		kiln_graph_free(g), kiln_graph_free(o);
	}
}
END_TEST

/* ---- GELU ------------------------------------------------------------------ */

/* HF BERT: x * 0.5 * (1 + erf(x / sqrt 2)); assoc picks where 0.5 goes. */
static uint32_t gelu_erf(kiln_graph *g, uint32_t x, int assoc, double half, bool by_mul)
{
	uint32_t a = by_mul ? op2(g, KILN_OP_MUL, x, k(g, M_SQRT1_2))
	                    : op2(g, KILN_OP_DIV, x, k(g, M_SQRT2));
	uint32_t c = op2(g, KILN_OP_ADD, op1(g, KILN_OP_ERF, a), k(g, 1));
	switch (assoc) {
	case 0: return op2(g, KILN_OP_MUL, op2(g, KILN_OP_MUL, x, k(g, half)), c);
	case 1: return op2(g, KILN_OP_MUL, op2(g, KILN_OP_MUL, x, c), k(g, half));
	default: return op2(g, KILN_OP_MUL, k(g, half), op2(g, KILN_OP_MUL, c, x));
	}
}

static void only_gelu(kiln_graph *o, const char *approx)
{
	int n = 0;
	for (uint32_t i = 0; i < o->nnode; i++) {
		const ir_node *nd = o->node[i];
		ck_assert_msg(nd->op == KILN_OP_GELU || nd->op == KILN_OP_SIGMOID, "left a %s",
		              ir_op(nd->op)->onnx);
		if (nd->op == KILN_OP_GELU) {
			n++;
			ck_assert_str_eq(ir_attr_str(nd, "approximate", "none"), approx);
		}
	}
	ck_assert_int_eq(n, 1);
}

START_TEST(gelu_erf_forms_become_gelu)
{
	for (int c = 0; c < 4; c++) {
		uint32_t x;
		kiln_graph *g = graph(&x);
		output(g, gelu_erf(g, op1(g, KILN_OP_SIGMOID, x), c % 3, 0.5, c == 3));
		kiln_graph *o = same_after(g, 1e-6);
		only_gelu(o, "none");
		kiln_graph_free(g), kiln_graph_free(o);
	}
}
END_TEST

/* GPT-2: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3)))) */
static uint32_t gelu_tanh(kiln_graph *g, uint32_t x, double coef, bool by_pow)
{
	uint32_t x3 = by_pow ? op2(g, KILN_OP_POW, x, k(g, 3))
	                     : op2(g, KILN_OP_MUL, x, op2(g, KILN_OP_MUL, x, x));
	uint32_t u = op2(g, KILN_OP_ADD, x, op2(g, KILN_OP_MUL, k(g, coef), x3));
	uint32_t t = op1(g, KILN_OP_TANH, op2(g, KILN_OP_MUL, k(g, sqrt(2 / M_PI)), u));
	return op2(g, KILN_OP_MUL, op2(g, KILN_OP_MUL, k(g, 0.5), x), op2(g, KILN_OP_ADD, k(g, 1), t));
}

START_TEST(gelu_tanh_forms_become_gelu)
{
	for (int c = 0; c < 2; c++) {
		uint32_t x;
		kiln_graph *g = graph(&x);
		output(g, gelu_tanh(g, op1(g, KILN_OP_SIGMOID, x), 0.044715, c == 0));
		kiln_graph *o = same_after(g, 1e-6);
		only_gelu(o, "tanh");
		kiln_graph_free(g), kiln_graph_free(o);
	}
}
END_TEST

START_TEST(gelu_near_misses_stay)
{
	for (int c = 0; c < 4; c++) {
		uint32_t x;
		kiln_graph *g = graph(&x);
		uint32_t y;
		if (c == 0)
			y = gelu_erf(g, x, 0, 0.6, false); /* not 0.5 */
		else if (c == 1)
			y = gelu_tanh(g, x, 0.05, true); /* not 0.044715 */
		else if (c == 2) /* x / 2 inside erf */
			y = op2(g, KILN_OP_MUL, op2(g, KILN_OP_MUL, x, k(g, 0.5)),
			        op2(g, KILN_OP_ADD, op1(g, KILN_OP_ERF, op2(g, KILN_OP_DIV, x, k(g, 2))),
			            k(g, 1)));
		else { /* 1 + erf also read elsewhere */
			uint32_t e = op2(g, KILN_OP_ADD, op1(g, KILN_OP_ERF, op2(g, KILN_OP_DIV, x, k(g, M_SQRT2))),
			                 k(g, 1));
			y = op2(g, KILN_OP_ADD, op2(g, KILN_OP_MUL, op2(g, KILN_OP_MUL, x, k(g, 0.5)), e), e);
		}
		output(g, y);
		kiln_graph *o = same_after(g, 1e-5);
		ck_assert_msg(count_op(o, KILN_OP_GELU) == 0, "case %d rewritten", c);
		kiln_graph_free(g), kiln_graph_free(o);
	}
}
END_TEST

/* ---- Pow ------------------------------------------------------------------- */

START_TEST(pow_by_small_constants_becomes_mul_or_sqrt)
{
	const double e[] = {2, 3, 0.5, 2.5};
	for (int c = 0; c < 4; c++) {
		uint32_t x;
		kiln_graph *g = graph(&x);
		/* a positive base, so 0.5 and 2.5 are defined */
		output(g, op2(g, KILN_OP_POW, op2(g, KILN_OP_ADD, op1(g, KILN_OP_ABS, x), k(g, 0.25)),
		              k(g, e[c])));
		kiln_graph *o = same_after(g, 1e-4);
		ck_assert_int_eq(count_op(o, KILN_OP_POW), c == 3);
		ck_assert_int_eq(count_op(o, KILN_OP_MUL), c == 0 ? 1 : c == 1 ? 2 : 0);
		ck_assert_int_eq(count_op(o, KILN_OP_SQRT), c == 2);
		kiln_graph_free(g), kiln_graph_free(o);
	}
}
END_TEST

static Suite *nnfuse_suite(void)
{
	Suite *s = suite_create("nnfuse");
	TCase *t = tcase_create("nnfuse");
	tcase_add_test(t, layer_norm_with_pow_becomes_one_node);
	tcase_add_test(t, layer_norm_with_mul_commuted_and_as_graph_output);
	tcase_add_test(t, layer_norm_without_affine_gets_unit_scale);
	tcase_add_test(t, layer_norm_near_misses_stay);
	tcase_add_test(t, gelu_erf_forms_become_gelu);
	tcase_add_test(t, gelu_tanh_forms_become_gelu);
	tcase_add_test(t, gelu_near_misses_stay);
	tcase_add_test(t, pow_by_small_constants_becomes_mul_or_sqrt);
	suite_add_tcase(s, t);
	return s;
}

#include "check_main.h"
KILN_CHECK_MAIN(nnfuse_suite)
