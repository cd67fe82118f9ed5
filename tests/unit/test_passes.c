/*
 * test_passes.c: the pass pipeline and the fold, dce and cse passes.
 *
 * Graphs are built with the IR's own builders (ir_node_new plus
 * ir_infer_node) so each test controls exactly which nodes exist; results
 * are checked on the graph after the pass, by value, and the last case runs
 * a small model before and after the default pipeline through the
 * interpreter and compares the outputs.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "passes/passes.h"

/* ---- builders ----------------------------------------------------------- */

static ir_node *mk(kiln_graph *g, kiln_op op, uint32_t nin, const uint32_t *in, uint32_t nout)
{
	ir_node *n = ir_node_new(g, op, nin, in, nout, KILN_HERE);
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
	return done(g, mk(g, op, 1, (uint32_t[]){a}, 1));
}

static uint32_t op2(kiln_graph *g, kiln_op op, uint32_t a, uint32_t b)
{
	return done(g, mk(g, op, 2, (uint32_t[]){a, b}, 1));
}

static uint32_t cvec(kiln_graph *g, int n, const float *v)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 1, (int64_t[]){n});
	memcpy(t->data, v, n * sizeof *v);
	ir_node *c = mk(g, KILN_OP_CONSTANT, 0, NULL, 1);
	ck_assert_int_eq(ir_attr_set_tensor(g, c, "value", t), KILN_OK);
	kiln_tensor_free(t);
	return done(g, c);
}

static uint32_t input(kiln_graph *g, const char *name, int rank, const int64_t *dims)
{
	ir_type t = {KILN_F32, rank, {0}};
	memcpy(t.dim, dims, rank * sizeof *dims);
	return ir_input_new(g, name, &t);
}

static uint32_t param(kiln_graph *g, const char *name, int n, const float *v)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 1, (int64_t[]){n});
	memcpy(t->data, v, n * sizeof *v);
	uint32_t id = ir_param_new(g, name, t, true);
	kiln_tensor_free(t);
	return id;
}

static int count_op(const kiln_graph *g, kiln_op op)
{
	int k = 0;
	for (uint32_t i = 0; i < g->nnode; i++)
		k += !g->node[i]->dead && g->node[i]->op == op;
	return k;
}

static const ir_node *def_of_output(const kiln_graph *g, int i)
{
	return g->val[g->output[i]]->def;
}

static const kiln_tensor *const_value(const ir_node *n)
{
	ck_assert_ptr_nonnull(n);
	ck_assert_int_eq(n->op, KILN_OP_CONSTANT);
	return ir_attr_get(n, "value")->u.t;
}

static kiln_status run(kiln_graph *g, const char *passes, kiln_error *err)
{
	pass_opts o = {.verify = true};
	return pass_run_list(g, passes, &o, err);
}

static void ok(kiln_graph *g, const char *passes)
{
	kiln_error e = {0};
	ck_assert_msg(run(g, passes, &e) == KILN_OK, "%s", e.msg);
}

/* ---- fold --------------------------------------------------------------- */

START_TEST(fold_evaluates_add_of_constants)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t a = cvec(g, 3, (float[]){1, 2, 3}), b = cvec(g, 3, (float[]){10, 20, 30});
	ir_output_add(g, op2(g, KILN_OP_ADD, a, b), "y");
	ok(g, "fold");
	ck_assert_int_eq(g->nnode, 1);
	const kiln_tensor *t = const_value(def_of_output(g, 0));
	ck_assert_int_eq(t->rank, 1);
	ck_assert_int_eq(t->shape[0], 3);
	const float *v = t->data;
	ck_assert_float_eq(v[0], 11);
	ck_assert_float_eq(v[1], 22);
	ck_assert_float_eq(v[2], 33);
	ck_assert_str_eq(g->val[g->output[0]]->name, "y");
	kiln_graph_free(g);
}
END_TEST

START_TEST(fold_collapses_a_constant_chain_and_its_inputs)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t x = input(g, "x", 1, (int64_t[]){3});
	uint32_t a = cvec(g, 3, (float[]){1, 2, 3}), b = cvec(g, 3, (float[]){10, 20, 30});
	uint32_t s = op1(g, KILN_OP_NEG, op2(g, KILN_OP_ADD, a, b));
	ir_output_add(g, op2(g, KILN_OP_MUL, x, s), "y");
	ok(g, "fold");
	/* the add, the neg and both original constants are gone */
	ck_assert_int_eq(g->nnode, 2);
	ck_assert_int_eq(count_op(g, KILN_OP_CONSTANT), 1);
	const ir_node *mul = def_of_output(g, 0);
	ck_assert_int_eq(mul->op, KILN_OP_MUL);
	const float *v = const_value(g->val[mul->in[1]]->def)->data;
	ck_assert_float_eq(v[0], -11);
	ck_assert_float_eq(v[2], -33);
	kiln_graph_free(g);
}
END_TEST

START_TEST(fold_never_folds_params)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t w = param(g, "w", 2, (float[]){1, 2}), c = cvec(g, 2, (float[]){3, 4});
	ir_output_add(g, op2(g, KILN_OP_ADD, w, c), "y");
	ok(g, "fold");
	ck_assert_int_eq(count_op(g, KILN_OP_ADD), 1);
	ck_assert_int_eq(count_op(g, KILN_OP_CONSTANT), 1);
	kiln_graph_free(g);
}
END_TEST

static kiln_graph *dropout_graph(int training)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t c = cvec(g, 4, (float[]){1, 2, 3, 4});
	ir_node *d = mk(g, KILN_OP_DROPOUT, 1, &c, 1);
	ir_attr_set_int(g, d, "training_mode", training);
	ir_attr_set_float(g, d, "ratio", 0.5);
	ir_output_add(g, done(g, d), "y");
	return g;
}

START_TEST(fold_keeps_random_ops_in_training_mode)
{
	kiln_graph *g = dropout_graph(1);
	ok(g, "fold");
	ck_assert_int_eq(count_op(g, KILN_OP_DROPOUT), 1);
	kiln_graph_free(g);
}
END_TEST

START_TEST(fold_evaluates_dropout_in_inference_mode)
{
	kiln_graph *g = dropout_graph(0);
	ok(g, "fold");
	ck_assert_int_eq(count_op(g, KILN_OP_DROPOUT), 0);
	const float *v = const_value(def_of_output(g, 0))->data;
	ck_assert_float_eq(v[3], 4);
	kiln_graph_free(g);
}
END_TEST

START_TEST(fold_shape_of_concrete_dims_even_from_an_input)
{
	kiln_graph *g = kiln_graph_new("f");
	int64_t N = ir_dim_sym(g, "N");
	uint32_t x = input(g, "x", 3, (int64_t[]){N, 3, 5});
	ir_node *all = mk(g, KILN_OP_SHAPE, 1, &x, 1), *tail = mk(g, KILN_OP_SHAPE, 1, &x, 1);
	ir_attr_set_int(g, tail, "start", -2);
	ir_output_add(g, done(g, all), "all");
	ir_output_add(g, done(g, tail), "tail");
	ok(g, "fold");
	/* [N,3,5] is not known; its last two dims are */
	ck_assert_int_eq(def_of_output(g, 0)->op, KILN_OP_SHAPE);
	const kiln_tensor *t = const_value(def_of_output(g, 1));
	ck_assert_int_eq(t->dtype, KILN_I64);
	ck_assert_int_eq(t->shape[0], 2);
	ck_assert_int_eq(((const int64_t *)t->data)[0], 3);
	ck_assert_int_eq(((const int64_t *)t->data)[1], 5);
	kiln_graph_free(g);
}
END_TEST

START_TEST(fold_respects_the_size_cap)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t a = cvec(g, 3, (float[]){1, 2, 3});
	ir_output_add(g, op2(g, KILN_OP_ADD, a, a), "y");
	pass_opts o = {.fold_max_elems = 2};
	kiln_error e = {0};
	ck_assert_int_eq(pass_run_list(g, "fold", &o, &e), KILN_OK);
	ck_assert_int_eq(count_op(g, KILN_OP_ADD), 1);
	o.fold_max_elems = 3;
	ck_assert_int_eq(pass_run_list(g, "fold", &o, &e), KILN_OK);
	ck_assert_int_eq(count_op(g, KILN_OP_ADD), 0);
	kiln_graph_free(g);
}
END_TEST

START_TEST(fold_leaves_a_node_the_interpreter_rejects)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t data = cvec(g, 3, (float[]){1, 2, 3});
	kiln_tensor *t = kiln_tensor_new(KILN_I64, 1, (int64_t[]){1});
	((int64_t *)t->data)[0] = 7; /* out of range for 3 rows */
	ir_node *c = mk(g, KILN_OP_CONSTANT, 0, NULL, 1);
	ir_attr_set_tensor(g, c, "value", t);
	kiln_tensor_free(t);
	ir_output_add(g, op2(g, KILN_OP_GATHER, data, done(g, c)), "y");
	ok(g, "fold");
	/* running the graph, not compiling it, is where the error belongs */
	ck_assert_int_eq(count_op(g, KILN_OP_GATHER), 1);
	kiln_tensor *y = NULL;
	kiln_error e = {0};
	ck_assert_int_eq(kiln_graph_run(g, NULL, 0, &y, 1, &e), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(e.msg, "index 7 out of range"));
	ck_assert_ptr_null(y);
	kiln_graph_free(g);
}
END_TEST

/* ---- dce ---------------------------------------------------------------- */

START_TEST(dce_removes_dead_chains_and_keeps_outputs)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t x = input(g, "x", 1, (int64_t[]){4});
	uint32_t w = param(g, "unused.weight", 2, (float[]){1, 2});
	op1(g, KILN_OP_EXP, op1(g, KILN_OP_RELU, x)); /* dead: nobody reads exp */
	uint32_t keep = op1(g, KILN_OP_NEG, x);
	ir_output_add(g, op1(g, KILN_OP_ABS, keep), "y");
	ok(g, "dce");
	ck_assert_int_eq(g->nnode, 2);
	ck_assert_int_eq(count_op(g, KILN_OP_RELU) + count_op(g, KILN_OP_EXP), 0);
	ck_assert_int_eq(def_of_output(g, 0)->op, KILN_OP_ABS);
	/* parameters are interface: kept even when unread */
	ck_assert_uint_ne(kiln_graph_find_param(g, "unused.weight"), 0);
	(void)w;
	kiln_graph_free(g);
}
END_TEST

START_TEST(dce_keeps_a_multi_output_node_used_through_one_output)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t x = input(g, "x", 1, (int64_t[]){4});
	ir_node *s = mk(g, KILN_OP_SPLIT, 1, &x, 2);
	ck_assert_int_eq(ir_infer_node(g, s), KILN_OK);
	ir_output_add(g, op1(g, KILN_OP_NEG, s->out[1]), "y");
	ok(g, "dce");
	ck_assert_int_eq(count_op(g, KILN_OP_SPLIT), 1);
	ck_assert_int_eq(g->nnode, 2);
	kiln_graph_free(g);
}
END_TEST

/* ---- cse ---------------------------------------------------------------- */

START_TEST(cse_merges_duplicates)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t x = input(g, "x", 1, (int64_t[]){4}), y = input(g, "y", 1, (int64_t[]){4});
	uint32_t a = op2(g, KILN_OP_ADD, x, y), b = op2(g, KILN_OP_ADD, x, y);
	ir_output_add(g, op2(g, KILN_OP_MUL, a, b), "z");
	ok(g, "cse");
	ck_assert_int_eq(count_op(g, KILN_OP_ADD), 1);
	const ir_node *mul = def_of_output(g, 0);
	ck_assert_uint_eq(mul->in[0], mul->in[1]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(cse_merges_commutative_operands_in_either_order)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t x = input(g, "x", 1, (int64_t[]){4}), y = input(g, "y", 1, (int64_t[]){4});
	uint32_t a = op2(g, KILN_OP_MUL, x, y), b = op2(g, KILN_OP_MUL, y, x);
	uint32_t c = op2(g, KILN_OP_SUB, x, y), d = op2(g, KILN_OP_SUB, y, x);
	ir_output_add(g, op2(g, KILN_OP_ADD, op2(g, KILN_OP_ADD, a, b),
	                     op2(g, KILN_OP_ADD, c, d)), "z");
	ok(g, "cse");
	ck_assert_int_eq(count_op(g, KILN_OP_MUL), 1);
	ck_assert_int_eq(count_op(g, KILN_OP_SUB), 2); /* x-y and y-x differ */
	kiln_graph_free(g);
}
END_TEST

static uint32_t leaky(kiln_graph *g, uint32_t x, double alpha)
{
	ir_node *n = mk(g, KILN_OP_LEAKY_RELU, 1, &x, 1);
	ir_attr_set_float(g, n, "alpha", alpha);
	return done(g, n);
}

START_TEST(cse_keeps_different_attributes_apart)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t x = input(g, "x", 1, (int64_t[]){4});
	uint32_t a = leaky(g, x, 0.1), b = leaky(g, x, 0.2), c = leaky(g, x, 0.1);
	ir_output_add(g, op2(g, KILN_OP_ADD, op2(g, KILN_OP_ADD, a, b), c), "z");
	ok(g, "cse");
	ck_assert_int_eq(count_op(g, KILN_OP_LEAKY_RELU), 2);
	kiln_graph_free(g);
}
END_TEST

START_TEST(cse_merges_equal_constants_by_bytes)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t x = input(g, "x", 1, (int64_t[]){2});
	uint32_t a = cvec(g, 2, (float[]){1, 2}), b = cvec(g, 2, (float[]){1, 2});
	uint32_t c = cvec(g, 2, (float[]){1, 3});
	uint32_t s = op2(g, KILN_OP_ADD, op2(g, KILN_OP_MUL, x, a), op2(g, KILN_OP_MUL, x, b));
	ir_output_add(g, op2(g, KILN_OP_SUB, s, c), "z");
	ok(g, "cse");
	ck_assert_int_eq(count_op(g, KILN_OP_CONSTANT), 2);
	ck_assert_int_eq(count_op(g, KILN_OP_MUL), 1); /* merged once its operands were */
	kiln_graph_free(g);
}
END_TEST

START_TEST(cse_never_merges_random_ops)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t x = input(g, "x", 1, (int64_t[]){4});
	uint32_t d[2];
	for (int i = 0; i < 2; i++) {
		ir_node *n = mk(g, KILN_OP_DROPOUT, 1, &x, 1);
		ir_attr_set_int(g, n, "training_mode", 1);
		d[i] = done(g, n);
	}
	ir_output_add(g, op2(g, KILN_OP_ADD, d[0], d[1]), "z");
	ok(g, "cse");
	ck_assert_int_eq(count_op(g, KILN_OP_DROPOUT), 2);
	kiln_graph_free(g);
}
END_TEST

START_TEST(cse_keeps_two_graph_outputs_apart)
{
	kiln_graph *g = kiln_graph_new("f");
	uint32_t x = input(g, "x", 1, (int64_t[]){4});
	ir_output_add(g, op1(g, KILN_OP_RELU, x), "a");
	ir_output_add(g, op1(g, KILN_OP_RELU, x), "b");
	ok(g, "cse");
	ck_assert_int_eq(count_op(g, KILN_OP_RELU), 2);
	ck_assert_str_eq(g->val[g->output[0]]->name, "a");
	ck_assert_str_eq(g->val[g->output[1]]->name, "b");
	kiln_graph_free(g);
}
END_TEST

/* ---- pipeline ----------------------------------------------------------- */

static kiln_graph *small(void)
{
	kiln_graph *g = kiln_graph_new("small");
	uint32_t x = input(g, "x", 1, (int64_t[]){2});
	uint32_t a = op1(g, KILN_OP_RELU, x), b = op1(g, KILN_OP_RELU, x);
	ir_output_add(g, op2(g, KILN_OP_ADD, a, b), "y");
	return g;
}

START_TEST(pipeline_rejects_an_unknown_pass_and_lists_the_known_ones)
{
	kiln_graph *g = small();
	kiln_error e = {0};
	ck_assert_int_eq(kiln_graph_optimize(g, "cse,bogus", &e), KILN_EINVAL);
	ck_assert_int_eq(e.code, KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(e.msg, "unknown pass 'bogus'"));
	ck_assert_ptr_nonnull(strstr(e.msg, "infer, fold, cse, dce"));
	/* names are checked before anything runs: cse did not run */
	ck_assert_int_eq(count_op(g, KILN_OP_RELU), 2);
	ck_assert_int_eq(kiln_graph_status(g), KILN_OK);
	kiln_graph_free(g);
}
END_TEST

START_TEST(pipeline_runs_the_default_for_null_and_default)
{
	kiln_graph *g = small(), *h = small();
	kiln_error e = {0};
	ck_assert_int_eq(kiln_graph_optimize(g, NULL, &e), KILN_OK);
	ck_assert_int_eq(kiln_graph_optimize(h, "default", &e), KILN_OK);
	ck_assert_int_eq(count_op(g, KILN_OP_RELU), 1);
	ck_assert_int_eq(count_op(h, KILN_OP_RELU), 1);
	ck_assert_int_eq(kiln_graph_optimize(h, "", &e), KILN_OK); /* nothing to run */
	kiln_graph_free(g);
	kiln_graph_free(h);
}
END_TEST

static char *dump_of(kiln_graph *g, const char *passes, const char *after)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	pass_opts o = {.dump_after = after, .dump = f};
	kiln_error e = {0};
	ck_assert_int_eq(pass_run_list(g, passes, &o, &e), KILN_OK);
	fclose(f);
	return text;
}

START_TEST(pipeline_dump_after_prints_the_ir_after_that_pass)
{
	kiln_graph *g = small();
	char *text = dump_of(g, "cse,dce", "cse");
	ck_assert_ptr_nonnull(strstr(text, "IR after cse"));
	ck_assert_ptr_null(strstr(text, "IR after dce"));
	ck_assert_ptr_nonnull(strstr(text, "graph @small"));
	ck_assert_ptr_nonnull(strstr(text, "relu"));
	free(text);
	kiln_graph_free(g);
}
END_TEST

START_TEST(pipeline_dump_after_all_prints_after_every_pass)
{
	kiln_graph *g = small();
	char *text = dump_of(g, "default", "all");
	const char *p = text;
	const char *order[] = {"IR after infer", "IR after fold", "IR after cse", "IR after dce"};
	for (int i = 0; i < 4; i++) {
		p = strstr(p, order[i]);
		ck_assert_msg(p != NULL, "missing '%s' in:\n%s", order[i], text);
	}
	free(text);
	kiln_graph_free(g);
}
END_TEST

START_TEST(pipeline_reports_an_earlier_graph_error)
{
	kiln_graph *g = small();
	ir_errorf(g, NULL, KILN_ESHAPE, "broken before the passes");
	kiln_error e = {0};
	ck_assert_int_eq(kiln_graph_optimize(g, NULL, &e), KILN_ESHAPE);
	ck_assert_ptr_nonnull(strstr(e.msg, "broken before the passes"));
	kiln_graph_free(g);
}
END_TEST

/* y = relu(x*w + (c1+c2)) + relu(x*w + (c1+c2)), plus a dead branch: every
 * pass has work, and the result must not change. */
static kiln_graph *model(void)
{
	kiln_graph *g = kiln_graph_new("model");
	int64_t N = ir_dim_sym(g, "N");
	uint32_t x = input(g, "x", 2, (int64_t[]){N, 3});
	uint32_t w = param(g, "w", 3, (float[]){0.5f, -1, 2});
	uint32_t c = op2(g, KILN_OP_ADD, cvec(g, 3, (float[]){1, 2, 3}), cvec(g, 3, (float[]){-4, 0, .5f}));
	uint32_t h[2];
	for (int i = 0; i < 2; i++)
		h[i] = op1(g, KILN_OP_RELU, op2(g, KILN_OP_ADD, op2(g, KILN_OP_MUL, x, w), c));
	op1(g, KILN_OP_EXP, h[0]); /* dead */
	ir_output_add(g, op2(g, KILN_OP_ADD, h[0], h[1]), "y");
	return g;
}

START_TEST(optimize_keeps_what_the_model_computes)
{
	kiln_graph *g = model(), *opt = ir_graph_clone(g);
	ck_assert_ptr_nonnull(opt);
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_optimize(opt, NULL, &e) == KILN_OK, "%s", e.msg);
	ck_assert_uint_lt(opt->nnode, g->nnode);
	ck_assert_int_eq(count_op(opt, KILN_OP_EXP), 0);
	ck_assert_int_eq(count_op(opt, KILN_OP_RELU), 1);
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 2, (int64_t[]){2, 3});
	float xs[6] = {1, 2, 3, -1, -2, -3};
	memcpy(x->data, xs, sizeof xs);
	kiln_tensor *y0 = NULL, *y1 = NULL;
	ck_assert_msg(kiln_graph_run(g, &x, 1, &y0, 1, &e) == KILN_OK, "%s", e.msg);
	ck_assert_msg(kiln_graph_run(opt, &x, 1, &y1, 1, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(kiln_tensor_numel(y1), 6);
	const float *a = y0->data, *b = y1->data;
	for (int i = 0; i < 6; i++)
		ck_assert_float_eq(a[i], b[i]);
	/* row 0: relu(x*w + c) = relu([0.5-3, -2+2, 6+3.5]) = [0, 0, 9.5], doubled */
	ck_assert_float_eq(b[2], 19);
	ck_assert_float_eq(b[0], 0);
	kiln_tensor_free(x);
	kiln_tensor_free(y0);
	kiln_tensor_free(y1);
	kiln_graph_free(g);
	kiln_graph_free(opt);
}
END_TEST

/* ---- qfuse -------------------------------------------------------------- */

/* A Constant of dtype dt and shape (rank 0: a scalar) holding v[i], or
 * f(i) when v is NULL. */
static uint32_t qconst(kiln_graph *g, kiln_dtype dt, int rank, const int64_t *shape,
                       const double *v, double (*f)(int64_t))
{
	kiln_tensor *t = kiln_tensor_new(dt, rank, shape);
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		ir_store(t, i, v ? v[i] : f(i));
	ir_node *c = mk(g, KILN_OP_CONSTANT, 0, NULL, 1);
	ck_assert_int_eq(ir_attr_set_tensor(g, c, "value", t), KILN_OK);
	kiln_tensor_free(t);
	return done(g, c);
}

static double wpat(int64_t i) { return (double)((i * 37 + 11) % 201 - 100); }
static double bpat(int64_t i) { return (double)((i * 53) % 900 - 450); }

static uint32_t qnode(kiln_graph *g, kiln_op op, uint32_t x, uint32_t s, uint32_t z, int64_t axis)
{
	ir_node *n = mk(g, op, 3, (uint32_t[]){x, s, z}, 1);
	if (axis >= 0)
		ir_attr_set_int(g, n, "axis", axis);
	return done(g, n);
}

/* The QDQ form ORT's quantizer writes: Q(x) -> DQ -> Conv(DQ(w) per
 * channel, DQ(b) in units of xs*ws) -> Q -> DQ -> MaxPool -> Q (same
 * scale) -> DQ -> Flatten -> Gemm(DQ(w2) per column, transB, f32 bias): a
 * classifier's f32 logits. */
static kiln_graph *qdq_graph_act(kiln_op act, double clip_max, double yzv);

static kiln_graph *qdq_graph(void)
{
	return qdq_graph_act(KILN_OP_COUNT, 0, 60);
}

/* The same with a Relu or Clip(0, clip_max) (act; KILN_OP_COUNT: none)
 * between the conv and its Q, whose zero point is yzv. */
static kiln_graph *qdq_graph_act(kiln_op act, double clip_max, double yzv)
{
	kiln_graph *g = kiln_graph_new("qdq");
	int64_t sx[] = {2, 3, 8, 8}, sw[] = {4, 3, 3, 3}, s4[] = {4}, sf[] = {5, 64}, s5[] = {5};
	uint32_t x = input(g, "x", 4, sx);
	const double ws[] = {0.01, 0.02, 0.015, 0.012}, xs = 0.02;
	uint32_t xsc = qconst(g, KILN_F32, 0, NULL, &xs, NULL);
	uint32_t xz = qconst(g, KILN_U8, 0, NULL, (double[]){128}, NULL);
	uint32_t xq = qnode(g, KILN_OP_QUANTIZE_LINEAR, x, xsc, xz, -1);
	uint32_t xd = qnode(g, KILN_OP_DEQUANTIZE_LINEAR, xq, xsc, xz, -1);
	uint32_t w = qconst(g, KILN_I8, 4, sw, NULL, wpat);
	uint32_t wd = qnode(g, KILN_OP_DEQUANTIZE_LINEAR, w, qconst(g, KILN_F32, 1, s4, ws, NULL),
	                    qconst(g, KILN_I8, 1, s4, (double[]){0, 0, 0, 0}, NULL), 0);
	double bs[4];
	for (int c = 0; c < 4; c++)
		bs[c] = (float)xs * (float)ws[c];
	uint32_t bd = qnode(g, KILN_OP_DEQUANTIZE_LINEAR, qconst(g, KILN_I32, 1, s4, NULL, bpat),
	                    qconst(g, KILN_F32, 1, s4, bs, NULL),
	                    qconst(g, KILN_I32, 1, s4, (double[]){0, 0, 0, 0}, NULL), 0);
	ir_node *cv = mk(g, KILN_OP_CONV, 3, (uint32_t[]){xd, wd, bd}, 1);
	ir_attr_set_ints(g, cv, "pads", 4, (int64_t[]){1, 1, 1, 1});
	uint32_t y = done(g, cv);
	if (act != KILN_OP_COUNT) {
		ir_node *a = mk(g, act, 1, &y, 1);
		if (act == KILN_OP_CLIP)
			ir_attr_set_float(g, a, "min", 0), ir_attr_set_float(g, a, "max", clip_max);
		y = done(g, a);
	}
	uint32_t ysc = qconst(g, KILN_F32, 0, NULL, (double[]){0.05}, NULL);
	uint32_t yz = qconst(g, KILN_U8, 0, NULL, &yzv, NULL);
	y = qnode(g, KILN_OP_DEQUANTIZE_LINEAR, qnode(g, KILN_OP_QUANTIZE_LINEAR, y, ysc, yz, -1), ysc, yz, -1);
	ir_node *mp = mk(g, KILN_OP_MAX_POOL, 1, &y, 1);
	ir_attr_set_ints(g, mp, "kernel_shape", 2, (int64_t[]){2, 2});
	ir_attr_set_ints(g, mp, "strides", 2, (int64_t[]){2, 2});
	y = done(g, mp);
	y = qnode(g, KILN_OP_DEQUANTIZE_LINEAR, qnode(g, KILN_OP_QUANTIZE_LINEAR, y, ysc, yz, -1), ysc, yz, -1);
	y = op1(g, KILN_OP_FLATTEN, y);
	const double w2s[] = {0.003, 0.004, 0.005, 0.006, 0.007};
	uint32_t w2 = qnode(g, KILN_OP_DEQUANTIZE_LINEAR, qconst(g, KILN_I8, 2, sf, NULL, wpat),
	                    qconst(g, KILN_F32, 1, s5, w2s, NULL),
	                    qconst(g, KILN_I8, 1, s5, (double[]){0, 0, 0, 0, 0}, NULL), 0);
	ir_node *gm = mk(g, KILN_OP_GEMM, 3, (uint32_t[]){y, w2, qconst(g, KILN_F32, 1, s5, NULL, bpat)}, 1);
	ir_attr_set_int(g, gm, "transB", 1);
	ck_assert_int_eq(ir_output_add(g, done(g, gm), "logits"), KILN_OK);
	return g;
}

/* qfuse turns the QDQ pattern into QLinearConv, an 8-bit MaxPool and
 * MatMulInteger with an f32 scale and bias, and the graph computes what it
 * did: every logit within 1e-4 of the QDQ graph's in the interpreter (the
 * same integers; only f32 rounding of the scale products differs). */
START_TEST(qfuse_turns_qdq_into_integer_ops)
{
	kiln_graph *ref = qdq_graph(), *g = qdq_graph();
	ok(g, "infer,qfuse,dce");
	ck_assert_int_eq(count_op(g, KILN_OP_QLINEAR_CONV), 1);
	ck_assert_int_eq(count_op(g, KILN_OP_MATMUL_INTEGER), 1);
	ck_assert_int_eq(count_op(g, KILN_OP_CONV) + count_op(g, KILN_OP_GEMM), 0);
	ck_assert_int_eq(count_op(g, KILN_OP_MAX_POOL), 1);
	for (uint32_t i = 0; i < g->nnode; i++)
		if (!g->node[i]->dead && g->node[i]->op == KILN_OP_MAX_POOL)
			ck_assert_int_eq(g->val[g->node[i]->in[0]]->type.dtype, KILN_U8);
	/* the input's Q stays; no DQ is left but the weights' */
	ck_assert_int_eq(count_op(g, KILN_OP_QUANTIZE_LINEAR), 1);
	ck_assert_int_eq(count_op(g, KILN_OP_DEQUANTIZE_LINEAR), 0);
	int64_t sx[] = {2, 3, 8, 8};
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 4, sx);
	float *xv = x->data;
	for (int64_t i = 0; i < kiln_tensor_numel(x); i++)
		xv[i] = (float)(((i * 29) % 97) / 30.0 - 1.5);
	kiln_tensor *y0 = NULL, *y1 = NULL;
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_run(ref, &x, 1, &y0, 1, &e) == KILN_OK, "%s", e.msg);
	ck_assert_msg(kiln_graph_run(g, &x, 1, &y1, 1, &e) == KILN_OK, "%s", e.msg);
	const float *a = y0->data, *b = y1->data;
	double lo = INFINITY, hi = -INFINITY;
	for (int i = 0; i < 10; i++) {
		ck_assert_msg(fabs(a[i] - b[i]) <= 1e-4 * (1 + fabs(a[i])), "logit %d: %g vs %g", i,
		              a[i], b[i]);
		lo = a[i] < lo ? a[i] : lo, hi = a[i] > hi ? a[i] : hi;
	}
	ck_assert_msg(hi - lo > 1, "logits span only [%g, %g]", lo, hi);
	kiln_tensor_free(x), kiln_tensor_free(y0), kiln_tensor_free(y1);
	kiln_graph_free(ref), kiln_graph_free(g);
}
END_TEST

/* The logits of ref and g agree in the interpreter (within 1e-4), on an
 * input that reaches both sides of the activations' bounds. */
static void same_logits(kiln_graph *ref, kiln_graph *g)
{
	int64_t sx[] = {2, 3, 8, 8};
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 4, sx), *y0 = NULL, *y1 = NULL;
	float *xv = x->data;
	for (int64_t i = 0; i < kiln_tensor_numel(x); i++)
		xv[i] = (float)(((i * 29) % 97) / 30.0 - 1.5);
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_run(ref, &x, 1, &y0, 1, &e) == KILN_OK, "%s", e.msg);
	ck_assert_msg(kiln_graph_run(g, &x, 1, &y1, 1, &e) == KILN_OK, "%s", e.msg);
	const float *a = y0->data, *b = y1->data;
	for (int i = 0; i < 10; i++)
		ck_assert_msg(fabs(a[i] - b[i]) <= 1e-4 * (1 + fabs(a[i])), "logit %d: %g vs %g", i,
		              a[i], b[i]);
	kiln_tensor_free(x), kiln_tensor_free(y0), kiln_tensor_free(y1);
}

/* A Relu or Clip between the conv and its Q goes when the Q saturates at
 * its bounds (zero point 0 for the Relu's 0; Clip's max quantized to 255
 * or beyond: 12.74 / 0.05 rounds to 255, 12.7 / 0.05 to 254), and stays, with the conv
 * in f32, when it does not; either way the logits are the QDQ graph's. */
START_TEST(qfuse_absorbs_a_relu_or_clip_only_when_the_q_saturates_there)
{
	static const struct {
		kiln_op act;
		double max, yz;
		bool fused;
	} c[] = {{KILN_OP_RELU, 0, 0, true},    {KILN_OP_RELU, 0, 60, false},
	         {KILN_OP_CLIP, 13, 0, true},   {KILN_OP_CLIP, 12.74, 0, true},
	         {KILN_OP_CLIP, 12.7, 0, false}, {KILN_OP_CLIP, 6, 0, false},
	         {KILN_OP_CLIP, 13, 3, false}};
	for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
		kiln_graph *ref = qdq_graph_act(c[k].act, c[k].max, c[k].yz);
		kiln_graph *g = qdq_graph_act(c[k].act, c[k].max, c[k].yz);
		ok(g, "infer,qfuse,dce");
		ck_assert_msg(count_op(g, KILN_OP_QLINEAR_CONV) == (c[k].fused ? 1 : 0), "case %zu", k);
		ck_assert_msg(count_op(g, c[k].act) == (c[k].fused ? 0 : 1), "case %zu", k);
		same_logits(ref, g);
		kiln_graph_free(ref), kiln_graph_free(g);
	}
}
END_TEST

/* x [2,3,4] -> Q -> DQ -> Reshape [6, 4] -> MatMul(DQ(w [4, 5])): qfuse
 * moves the Reshape (its shape attribute with it) before the DQ and makes
 * a MatMulInteger of the 8-bit rows; the result is the QDQ graph's. */
static kiln_graph *reshape_matmul(void)
{
	kiln_graph *g = kiln_graph_new("rmm");
	int64_t sx[] = {2, 3, 4}, sw[] = {4, 5};
	uint32_t x = input(g, "x", 3, sx);
	uint32_t xs = qconst(g, KILN_F32, 0, NULL, (double[]){0.05}, NULL);
	uint32_t xz = qconst(g, KILN_U8, 0, NULL, (double[]){128}, NULL);
	uint32_t xd = qnode(g, KILN_OP_DEQUANTIZE_LINEAR, qnode(g, KILN_OP_QUANTIZE_LINEAR, x, xs, xz, -1),
	                    xs, xz, -1);
	ir_node *r = mk(g, KILN_OP_RESHAPE, 1, &xd, 1);
	ir_attr_set_ints(g, r, "shape", 2, (int64_t[]){6, 4});
	uint32_t w = qnode(g, KILN_OP_DEQUANTIZE_LINEAR, qconst(g, KILN_I8, 2, sw, NULL, wpat),
	                   qconst(g, KILN_F32, 0, NULL, (double[]){0.01}, NULL),
	                   qconst(g, KILN_I8, 0, NULL, (double[]){0}, NULL), -1);
	ck_assert_int_eq(ir_output_add(g, op2(g, KILN_OP_MATMUL, done(g, r), w), "y"), KILN_OK);
	return g;
}

START_TEST(qfuse_moves_a_reshape_with_its_shape_before_the_dq)
{
	kiln_graph *ref = reshape_matmul(), *g = reshape_matmul();
	ok(g, "infer,qfuse,dce");
	ck_assert_int_eq(count_op(g, KILN_OP_MATMUL_INTEGER), 1);
	ck_assert_int_eq(count_op(g, KILN_OP_MATMUL), 0);
	int64_t sx[] = {2, 3, 4};
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 3, sx), *y0 = NULL, *y1 = NULL;
	for (int64_t i = 0; i < 24; i++)
		((float *)x->data)[i] = (float)((i * 7) % 23) / 5 - 2;
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_run(ref, &x, 1, &y0, 1, &e) == KILN_OK, "%s", e.msg);
	ck_assert_msg(kiln_graph_run(g, &x, 1, &y1, 1, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(y1->rank, 2);
	ck_assert_int_eq(y1->shape[0], 6);
	for (int i = 0; i < 30; i++)
		ck_assert_float_eq_tol(((float *)y1->data)[i], ((float *)y0->data)[i], 1e-5);
	kiln_tensor_free(x), kiln_tensor_free(y0), kiln_tensor_free(y1);
	kiln_graph_free(ref), kiln_graph_free(g);
}
END_TEST

/* A Conv whose input is not dequantized (an f32 activation) stays f32, and
 * a graph marked for training is left alone. */
START_TEST(qfuse_leaves_float_convs_and_training_graphs)
{
	kiln_graph *g = qdq_graph();
	kiln_graph_set_training(g, true);
	ok(g, "infer,qfuse,dce");
	ck_assert_int_eq(count_op(g, KILN_OP_CONV), 1);
	ck_assert_int_eq(count_op(g, KILN_OP_QLINEAR_CONV), 0);
	kiln_graph_free(g);
	g = kiln_graph_new("f32conv");
	int64_t sx[] = {1, 2, 4, 4}, sw[] = {2, 2, 1, 1};
	uint32_t x = input(g, "x", 4, sx);
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 4, sw);
	ir_node *c = mk(g, KILN_OP_CONSTANT, 0, NULL, 1);
	ir_attr_set_tensor(g, c, "value", t);
	kiln_tensor_free(t);
	ir_output_add(g, op2(g, KILN_OP_CONV, x, done(g, c)), NULL);
	ok(g, "infer,qfuse,dce");
	ck_assert_int_eq(count_op(g, KILN_OP_CONV), 1);
	kiln_graph_free(g);
}
END_TEST

/* ---- suite -------------------------------------------------------------- */

static Suite *passes_suite(void)
{
	Suite *s = suite_create("passes");
	TCase *fold = tcase_create("fold"), *dce = tcase_create("dce");
	TCase *cse = tcase_create("cse"), *pipe = tcase_create("pipeline");
	tcase_add_test(fold, fold_evaluates_add_of_constants);
	tcase_add_test(fold, fold_collapses_a_constant_chain_and_its_inputs);
	tcase_add_test(fold, fold_never_folds_params);
	tcase_add_test(fold, fold_keeps_random_ops_in_training_mode);
	tcase_add_test(fold, fold_evaluates_dropout_in_inference_mode);
	tcase_add_test(fold, fold_shape_of_concrete_dims_even_from_an_input);
	tcase_add_test(fold, fold_respects_the_size_cap);
	tcase_add_test(fold, fold_leaves_a_node_the_interpreter_rejects);
	tcase_add_test(dce, dce_removes_dead_chains_and_keeps_outputs);
	tcase_add_test(dce, dce_keeps_a_multi_output_node_used_through_one_output);
	tcase_add_test(cse, cse_merges_duplicates);
	tcase_add_test(cse, cse_merges_commutative_operands_in_either_order);
	tcase_add_test(cse, cse_keeps_different_attributes_apart);
	tcase_add_test(cse, cse_merges_equal_constants_by_bytes);
	tcase_add_test(cse, cse_never_merges_random_ops);
	tcase_add_test(cse, cse_keeps_two_graph_outputs_apart);
	tcase_add_test(pipe, pipeline_rejects_an_unknown_pass_and_lists_the_known_ones);
	tcase_add_test(pipe, pipeline_runs_the_default_for_null_and_default);
	tcase_add_test(pipe, pipeline_dump_after_prints_the_ir_after_that_pass);
	tcase_add_test(pipe, pipeline_dump_after_all_prints_after_every_pass);
	tcase_add_test(pipe, pipeline_reports_an_earlier_graph_error);
	tcase_add_test(pipe, optimize_keeps_what_the_model_computes);
	tcase_add_test(pipe, qfuse_turns_qdq_into_integer_ops);
	tcase_add_test(pipe, qfuse_leaves_float_convs_and_training_graphs);
	tcase_add_test(pipe, qfuse_absorbs_a_relu_or_clip_only_when_the_q_saturates_there);
	tcase_add_test(pipe, qfuse_moves_a_reshape_with_its_shape_before_the_dq);
	suite_add_tcase(s, fold);
	suite_add_tcase(s, dce);
	suite_add_tcase(s, cse);
	suite_add_tcase(s, pipe);
	return s;
}

#include "check_main.h"
KILN_CHECK_MAIN(passes_suite)
