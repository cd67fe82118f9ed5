/* test_verify.c: the IR verifier (ir/verify.c).  Each case builds one valid
 * graph, breaks one invariant by editing the structs directly, and checks
 * that ir_verify reports that problem and names the node. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

#include "check_main.h"

/* x:f32[N,4] -> matmul w -> add b -> relu -> concat(axis 1) -> softmax -> y */
static kiln_graph *g;
static ir_node *mm, *add, *act, *cat, *sm;
static uint32_t x, w, b;
static kiln_error err;

static ir_node *mk(kiln_op op, const char *name, uint32_t nin, const uint32_t *in)
{
	ir_node *n = ir_node_new(g, op, nin, in, 1, KILN_HERE);
	ck_assert_ptr_nonnull(n);
	n->name = name ? ir_intern(g, name) : NULL;
	return n;
}

static void setup(void)
{
	g = kiln_graph_new("v");
	ir_type tx = {KILN_F32, 2, {kiln_sym(g, "N"), 4}};
	x = ir_input_new(g, "x", &tx);
	kiln_tensor *tw = kiln_tensor_new(KILN_F32, 2, (int64_t[]){4, 3});
	kiln_tensor *tb = kiln_tensor_new(KILN_F32, 1, (int64_t[]){3});
	w = ir_param_new(g, "w", tw, true);
	b = ir_param_new(g, "b", tb, true);
	kiln_tensor_free(tw);
	kiln_tensor_free(tb);
	mm = mk(KILN_OP_MATMUL, "mm", 2, (uint32_t[]){x, w});
	add = mk(KILN_OP_ADD, NULL, 2, (uint32_t[]){mm->out[0], b});
	act = mk(KILN_OP_RELU, "act", 1, (uint32_t[]){add->out[0]});
	cat = mk(KILN_OP_CONCAT, "cat", 2, (uint32_t[]){act->out[0], act->out[0]});
	ir_attr_set_int(g, cat, "axis", 1);
	sm = mk(KILN_OP_SOFTMAX, NULL, 1, (uint32_t[]){cat->out[0]});
	ir_attr_set_int(g, sm, "axis", -1);
	ir_node *all[] = {mm, add, act, cat, sm};
	for (int i = 0; i < 5; i++)
		ck_assert_int_eq(ir_infer_node(g, all[i]), KILN_OK);
	ck_assert_int_eq(ir_output_add(g, sm->out[0], "y"), KILN_OK);
	memset(&err, 0, sizeof err);
}

static void teardown(void)
{
	kiln_graph_free(g);
}

/* Asserts that verification fails with EVERIFY and every given substring. */
static void rejects(const char *sub1, const char *sub2)
{
	kiln_status st = ir_verify(g, &err);
	ck_assert_msg(st == KILN_EVERIFY, "status %s (%s)", kiln_status_str(st), err.msg);
	ck_assert_int_eq(err.code, KILN_EVERIFY);
	ck_assert_msg(strstr(err.msg, sub1), "message \"%s\" lacks \"%s\"", err.msg, sub1);
	ck_assert_msg(!sub2 || strstr(err.msg, sub2), "message \"%s\" lacks \"%s\"", err.msg,
	              sub2);
}

START_TEST(valid_graph_is_accepted)
{
	ck_assert_int_eq(ir_verify(g, &err), KILN_OK);
	ck_assert_int_eq(err.code, KILN_OK);
	ck_assert_str_eq(err.msg, "");
	ck_assert_int_eq(kiln_graph_verify(g, NULL), KILN_OK);
	ck_assert_int_eq(kiln_graph_verify(NULL, &err), KILN_EINVAL);
}
END_TEST

START_TEST(rejects_use_before_def)
{
	g->node[1] = act, act->idx = 1;
	g->node[2] = add, add->idx = 2;
	rejects("Relu 'act': use of %", "before its definition by Add node #2");
}
END_TEST

START_TEST(rejects_dangling_use_of_removed_node)
{
	ir_node_remove(g, act);
	rejects("Concat 'cat': dangling use of %", "output of removed Relu 'act'");
}
END_TEST

START_TEST(rejects_wrong_declared_type)
{
	g->val[act->out[0]]->type.dim[1] = 5;
	rejects("Relu 'act': output %", "is declared f32[N,5] but inferred f32[N,3]");
}
END_TEST

START_TEST(rejects_unknown_attribute)
{
	ir_attr_set_float(g, act, "alpha", 0.1);
	rejects("Relu 'act': unknown attribute 'alpha'", NULL);
}
END_TEST

/* Only attributes whose schema kind is ds may hold symbolic dims (a
 * permutation holds axes); one that does must hold dims of this graph. */
START_TEST(rejects_symbolic_dims_where_the_schema_has_none)
{
	ir_node *tr = mk(KILN_OP_TRANSPOSE, "tr", 1, &x);
	g->val[tr->out[0]]->type = g->val[x]->type;
	ir_attr_set_dims(g, tr, "perm", 2, (int64_t[]){1, kiln_sym(g, "N")}, 2);
	rejects("Transpose 'tr': attribute 'perm' cannot hold symbolic dims", NULL);
}
END_TEST

START_TEST(rejects_a_dim_the_graph_does_not_have)
{
	ir_node *sl = mk(KILN_OP_SLICE, "sl", 1, &x);
	g->val[sl->out[0]]->type = g->val[x]->type;
	int64_t zero = 0, bogus = -1000;
	ir_attr_set_dims(g, sl, "starts", 1, &zero, 0);
	ir_attr_set_dims(g, sl, "ends", 1, &bogus, 1);
	rejects("Slice 'sl': attribute 'ends' element 0 is no dim of the graph", NULL);
}
END_TEST

START_TEST(rejects_missing_required_attribute)
{
	cat->nattr = 0;
	rejects("Concat 'cat': missing required attribute 'axis'", NULL);
}
END_TEST

START_TEST(rejects_wrong_attribute_kind)
{
	ir_attr_set_float(g, sm, "axis", 1.5);
	rejects("Softmax node #4: attribute 'axis' must be int, not float", NULL);
}
END_TEST

START_TEST(rejects_arity_out_of_range)
{
	act->nin = 0;
	rejects("Relu 'act' has 0 inputs, Relu takes 1", NULL);
}
END_TEST

START_TEST(rejects_too_many_outputs)
{
	mm->nout = 2; /* out[] has a spare slot holding 0 */
	rejects("MatMul 'mm' has 2 outputs, MatMul gives 1", NULL);
}
END_TEST

START_TEST(rejects_missing_use)
{
	g->val[x]->nuse = 0;
	rejects("MatMul 'mm': reads %x in 1 slot(s) but its use list has 0", NULL);
}
END_TEST

START_TEST(rejects_extra_use)
{
	ir_value *v = g->val[act->out[0]];
	ck_assert_int_eq(v->nuse, 2); /* concat reads it twice */
	v->uses[1] = sm;
	rejects("Concat 'cat': reads %", "in 2 slot(s) but its use list has 1");
}
END_TEST

START_TEST(rejects_output_not_live)
{
	ir_node_remove(g, sm);
	rejects("graph output 0 (%y) is not a live value", NULL);
}
END_TEST

START_TEST(rejects_duplicate_names)
{
	g->val[b]->name = g->val[x]->name;
	rejects("duplicate value name 'x'", NULL);
}
END_TEST

START_TEST(rejects_param_shape_mismatch)
{
	g->val[b]->type.dim[0] = 4;
	rejects("param %b is declared f32[4] but its data is f32[3]", NULL);
}
END_TEST

START_TEST(rejects_broken_def_pointer)
{
	g->val[mm->out[0]]->def_out = 1;
	rejects("claims to be output 1 of MatMul 'mm'", NULL);
}
END_TEST

START_TEST(rejects_graph_without_outputs)
{
	g->noutput = 0;
	rejects("graph 'v' has no outputs", NULL);
}
END_TEST

START_TEST(rejects_graph_with_pending_error)
{
	ir_errorf(g, mm, KILN_ESHAPE, "boom");
	rejects("graph has a pending error", "MatMul 'mm': boom");
}
END_TEST

START_TEST(rejects_node_that_fails_inference)
{
	ir_set_input(g, add, 1, x); /* [N,3] + [N,4] */
	rejects("Add node #1: shape inference fails", "cannot broadcast f32[N,3] with f32[N,4]");
}
END_TEST

/* Inference inside the verifier may build dim expressions (N+N here) and
 * record errors, but only in its private view: g is unchanged. */
START_TEST(verify_leaves_graph_untouched)
{
	ir_attr_set_int(g, cat, "axis", 0); /* would be [N+N,3]; declared [N,6] */
	uint32_t ndexp = g->ndexp;
	rejects("is declared f32[N,6] but inferred f32[N+N,3]", NULL);
	ck_assert_int_eq(g->ndexp, ndexp);
	ck_assert_int_eq(kiln_graph_status(g), KILN_OK);
	ck_assert_str_eq(kiln_graph_errmsg(g), "");
}
END_TEST

static Suite *verify_suite(void)
{
	Suite *s = suite_create("verify");
	TCase *t = tcase_create("structure");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, valid_graph_is_accepted);
	tcase_add_test(t, rejects_use_before_def);
	tcase_add_test(t, rejects_dangling_use_of_removed_node);
	tcase_add_test(t, rejects_arity_out_of_range);
	tcase_add_test(t, rejects_too_many_outputs);
	tcase_add_test(t, rejects_missing_use);
	tcase_add_test(t, rejects_extra_use);
	tcase_add_test(t, rejects_output_not_live);
	tcase_add_test(t, rejects_broken_def_pointer);
	tcase_add_test(t, rejects_graph_without_outputs);
	tcase_add_test(t, rejects_graph_with_pending_error);
	suite_add_tcase(s, t);

	t = tcase_create("values");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, rejects_duplicate_names);
	tcase_add_test(t, rejects_param_shape_mismatch);
	suite_add_tcase(s, t);

	t = tcase_create("attributes");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, rejects_unknown_attribute);
	tcase_add_test(t, rejects_symbolic_dims_where_the_schema_has_none);
	tcase_add_test(t, rejects_a_dim_the_graph_does_not_have);
	tcase_add_test(t, rejects_missing_required_attribute);
	tcase_add_test(t, rejects_wrong_attribute_kind);
	suite_add_tcase(s, t);

	t = tcase_create("types");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, rejects_wrong_declared_type);
	tcase_add_test(t, rejects_node_that_fails_inference);
	tcase_add_test(t, verify_leaves_graph_untouched);
	suite_add_tcase(s, t);
	return s;
}

KILN_CHECK_MAIN(verify_suite)
