/* test_lower.c: graph -> kernel IR lowering (codegen/lower*.c), the kernel
 * IR evaluator (codegen/keval.c), the memory plan (codegen/memplan.c) and
 * the kernel IR dump (codegen/kernel.c).
 *
 * Every op case of op_cases.h (the one-node graphs test_interp.c checks
 * against PyTorch) is lowered, planned and run through cg_eval, and must
 * match kiln_graph_run: 1e-5 for f32, 1e-12 for f64, exact for integers
 * and bools.  The example MLP and CNN with
 * PyTorch's weights must match the interpreter too.  Then the memory plan's
 * invariants, golden substrings of the dump, and lowering errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "ir/ir.h"

#include "check_main.h"
#include "lower_util.h"
#include "op_cases.h"

/* ---- helpers -------------------------------------------------------------- */

/* Lowers g, plans memory and checks the plan, returning the module. */
static cg_module *lower(const kiln_graph *g)
{
	cg_module *m = NULL;
	kiln_error err = {0};
	ck_assert_msg(cg_lower(g, &m, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(cg_memplan(m, &err) == KILN_OK, "%s", err.msg);
	for (int a = 0; a < m->nbuf; a++)
		for (int b = a + 1; b < m->nbuf; b++) {
			const cg_buf *x = &m->buf[a], *y = &m->buf[b];
			if (x->slot < 0 || x->slot != y->slot)
				continue;
			ck_assert_msg(x->last < y->first || y->last < x->first,
			              "buf%d [%d,%d] and buf%d [%d,%d] overlap in slot %d", a, x->first,
			              x->last, b, y->first, y->last, x->slot);
		}
	for (int b = 0; b < m->nbuf; b++) {
		const cg_buf *x = &m->buf[b];
		bool planned = x->kind == CG_BUF_TEMP && x->alias < 0;
		ck_assert_msg(planned == (x->slot >= 0), "buf%d: slot %d", b, x->slot);
		ck_assert_int_lt(x->slot, m->nslot);
	}
	return m;
}

/* Interpreter and lowered module on the same inputs: max error per output. */
static void compare(const kiln_graph *g, kiln_tensor **in, int nin, int nout, double tol,
                    const char *name)
{
	kiln_tensor *want[8] = {0}, *got[8] = {0};
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_run(g, in, nin, want, nout, &err) == KILN_OK, "%s: %s", name, err.msg);
	cg_module *m = lower(g);
	kiln_status st = cg_eval(m, in, nin, got, nout, &err);
	ck_assert_msg(st == KILN_OK, "%s: %s", name, err.msg);
	expect_close(name, got, want, nout, tol);
	for (int k = 0; k < nout; k++)
		kiln_tensor_free(want[k]), kiln_tensor_free(got[k]);
	cg_module_free(m);
}

/* ---- the op cases ------------------------------------------------------------ */

START_TEST(op_case_matches_interpreter)
{
	opcase_graph c = opcase_build(opcase_get(_i));
	compare(c.g, c.in, c.nin, c.nout, c.tol, c.name);
	opcase_free(&c);
}
END_TEST

/* Constant is a CONST buffer made by the driver; Shape is tested below */
static bool has_lowering(kiln_op op)
{
	return op == KILN_OP_CONSTANT || cg_lower_rule(op);
}

START_TEST(every_op_has_a_lowering_and_a_case)
{
	char missing[1024];
	opcase_uncovered(missing, sizeof missing, has_lowering);
	ck_assert_msg(!missing[0], "ops without a lowering or a case:%s", missing);
}
END_TEST

/* ---- hand-built graphs ------------------------------------------------------ */

static kiln_tensor *ramp(kiln_dtype dt, int rank, const int64_t *shape)
{
	kiln_tensor *t = tensor(dt, rank, shape, NULL);
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		ir_store(t, i, ((i * 7) % 11) * 0.25 - 1);
	return t;
}

START_TEST(same_shape_add_is_one_flat_vectorized_loop)
{
	kiln_graph *g = kiln_graph_new("add");
	int64_t N = kiln_sym(g, "N");
	uint32_t ab[2] = {input(g, "a", KILN_F32, 2, (int64_t[]){N, 16}),
	                  input(g, "b", KILN_F32, 2, (int64_t[]){N, 16})};
	ir_output_add(g, op1(g, KILN_OP_ADD, 2, ab, ""), "y");
	cg_module *m = lower(g);
	/* its printed loop: tests/kir/codegen/add.kir */
	ck_assert_int_eq(m->nkern, 1);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(matmul_lowers_to_one_gemm_with_the_batch_folded)
{
	kiln_graph *g = kiln_graph_new("mm");
	int64_t B = kiln_sym(g, "B");
	uint32_t ab[2] = {input(g, "a", KILN_F32, 3, (int64_t[]){B, 5, 8}),
	                  input(g, "w", KILN_F32, 2, (int64_t[]){8, 3})};
	ir_output_add(g, op1(g, KILN_OP_MATMUL, 2, ab, ""), "y");
	cg_module *m = lower(g); /* its printed GEMM: tests/kir/codegen/matmul.kir */
	int64_t shape[3] = {3, 5, 8};
	kiln_tensor *in[2] = {ramp(KILN_F32, 3, shape), ramp(KILN_F32, 2, (int64_t[]){8, 3})};
	compare(g, in, 2, 1, 1e-5, "matmul folded");
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(broadcast_batch_matmul_uses_stride_zero)
{
	kiln_graph *g = kiln_graph_new("bmm");
	uint32_t ab[2] = {input(g, "a", KILN_F32, 4, (int64_t[]){2, 1, 4, 3}),
	                  input(g, "b", KILN_F32, 3, (int64_t[]){5, 3, 2})};
	ir_output_add(g, op1(g, KILN_OP_MATMUL, 2, ab, ""), "y");
	kiln_tensor *in[2] = {ramp(KILN_F32, 4, (int64_t[]){2, 1, 4, 3}),
	                      ramp(KILN_F32, 3, (int64_t[]){5, 3, 2})};
	compare(g, in, 2, 1, 1e-5, "broadcast matmul");
	cg_module *m = lower(g); /* its strides: tests/kir/codegen/batch_matmul.kir */
	cg_module_free(m);
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(gemm_vector_c_becomes_a_column_bias)
{
	kiln_graph *g = kiln_graph_new("gemm");
	uint32_t abc[3] = {input(g, "a", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 6}),
	                   input(g, "b", KILN_F32, 2, (int64_t[]){4, 6}),
	                   input(g, "c", KILN_F32, 1, (int64_t[]){4})};
	ir_output_add(g, op1(g, KILN_OP_GEMM, 3, abc, "transB=1"), "y");
	cg_module *m = lower(g); /* its epilogue: tests/kir/codegen/gemm_epilogue.kir */
	ck_assert_int_eq(m->nkern, 1);
	kiln_tensor *in[3] = {ramp(KILN_F32, 2, (int64_t[]){3, 6}), ramp(KILN_F32, 2, (int64_t[]){4, 6}),
	                      ramp(KILN_F32, 1, (int64_t[]){4})};
	compare(g, in, 3, 1, 1e-5, "gemm bias");
	for (int i = 0; i < 3; i++)
		kiln_tensor_free(in[i]);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(relu_after_gemm_fuses_into_its_epilogue)
{
	kiln_graph *g = kiln_graph_new("mlp");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){N, 12});
	kiln_value h = kiln_relu(g, kiln_linear(g, "fc1", x, 8, true));
	kiln_output(g, "y", kiln_relu(g, kiln_linear(g, "fc2", h, 4, true)));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	cg_module *m = lower(g);
	/* fc1's relu is fused; fc2's result is a graph output, so its relu is
	 * not (the printed epilogues: tests/kir/codegen/gemm_epilogue.kir) */
	ck_assert_int_eq(m->nkern, 3);
	kiln_tensor *in = ramp(KILN_F32, 2, (int64_t[]){3, 12});
	compare(g, &in, 1, 1, 1e-5, "fused relu");
	kiln_tensor_free(in);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(pointwise_conv_is_a_gemm_without_im2col)
{
	kiln_graph *g = kiln_graph_new("pw");
	uint32_t xw[2] = {input(g, "x", KILN_F32, 4, (int64_t[]){kiln_sym(g, "N"), 3, 4, 5}),
	                  input(g, "w", KILN_F32, 4, (int64_t[]){6, 3, 1, 1})};
	ir_output_add(g, op1(g, KILN_OP_CONV, 2, xw, ""), "y");
	cg_module *m = lower(g); /* its GEMM: tests/kir/codegen/conv1x1.kir */
	ck_assert_int_eq(m->nbuf, 3); /* no im2col scratch */
	kiln_tensor *in[2] = {ramp(KILN_F32, 4, (int64_t[]){2, 3, 4, 5}),
	                      ramp(KILN_F32, 4, (int64_t[]){6, 3, 1, 1})};
	compare(g, in, 2, 1, 1e-5, "pointwise conv");
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* Depthwise with a channel multiplier (6 outputs from 3 channels), stride
 * 1 and symmetric padding, then asymmetric padding, stride 2 rows and
 * dilated columns without a bias: the edge columns and the interior span
 * (no column test) must agree with the interpreter at every border. */
START_TEST(depthwise_conv_edges_multiplier_and_dilation_match)
{
	static const struct { int64_t kw; const char *attrs; int bias; } c[] = {
		{3, "group=3 pads=1,1,1,1", 1},
		{2, "group=3 pads=0,2,1,1 strides=2,1 dilations=1,2", 0},
	};
	for (int i = 0; i < 2; i++) {
		kiln_graph *g = kiln_graph_new("dw");
		int64_t M = c[i].bias ? 6 : 3;
		uint32_t xwb[3] = {input(g, "x", KILN_F32, 4, (int64_t[]){2, 3, 5, 9}),
		                   input(g, "w", KILN_F32, 4, (int64_t[]){M, 1, 3, c[i].kw})};
		if (c[i].bias)
			xwb[2] = input(g, "b", KILN_F32, 1, (int64_t[]){M});
		ir_output_add(g, op1(g, KILN_OP_CONV, 2 + c[i].bias, xwb, c[i].attrs), "y");
		kiln_tensor *in[3] = {ramp(KILN_F32, 4, (int64_t[]){2, 3, 5, 9}),
		                      ramp(KILN_F32, 4, (int64_t[]){M, 1, 3, c[i].kw}),
		                      ramp(KILN_F32, 1, (int64_t[]){M})};
		compare(g, in, 2 + c[i].bias, 1, 1e-5, c[i].attrs);
		for (int k = 0; k < 3; k++)
			kiln_tensor_free(in[k]);
		kiln_graph_free(g);
	}
}
END_TEST

START_TEST(depthwise_conv_with_symbolic_batch_matches)
{
	kiln_graph *g = kiln_graph_new("dw");
	uint32_t xwb[3] = {input(g, "x", KILN_F32, 4, (int64_t[]){kiln_sym(g, "N"), 4, 6, 6}),
	                   input(g, "w", KILN_F32, 4, (int64_t[]){4, 1, 3, 3}),
	                   input(g, "b", KILN_F32, 1, (int64_t[]){4})};
	ir_output_add(g, op1(g, KILN_OP_CONV, 3, xwb, "group=4 pads=1,1,1,1 strides=2,2"), "y");
	for (int64_t N = 1; N <= 3; N += 2) {
		kiln_tensor *in[3] = {ramp(KILN_F32, 4, (int64_t[]){N, 4, 6, 6}),
		                      ramp(KILN_F32, 4, (int64_t[]){4, 1, 3, 3}),
		                      ramp(KILN_F32, 1, (int64_t[]){4})};
		compare(g, in, 3, 1, 1e-5, "depthwise");
		for (int i = 0; i < 3; i++)
			kiln_tensor_free(in[i]);
	}
	kiln_graph_free(g);
}
END_TEST

START_TEST(shape_stores_the_bound_symbolic_dims)
{
	kiln_graph *g = kiln_graph_new("s");
	uint32_t x = input(g, "x", KILN_F32, 3, (int64_t[]){kiln_sym(g, "N"), 3, 5});
	ir_output_add(g, op1(g, KILN_OP_SHAPE, 1, &x, ""), "all");
	ir_output_add(g, op1(g, KILN_OP_SHAPE, 1, &x, "start=-2"), "tail");
	kiln_tensor *in = tensor(KILN_F32, 3, (int64_t[]){4, 3, 5}, NULL), *out[2];
	cg_module *m = lower(g);
	kiln_error err = {0};
	ck_assert_msg(cg_eval(m, &in, 1, out, 2, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(out[0]->dtype, KILN_I64);
	ck_assert_int_eq(ir_load_i64(out[0], 0), 4);
	ck_assert_int_eq(ir_load_i64(out[0], 2), 5);
	ck_assert_int_eq(kiln_tensor_numel(out[1]), 2);
	ck_assert_int_eq(ir_load_i64(out[1], 0), 3);
	kiln_tensor_free(out[0]), kiln_tensor_free(out[1]), kiln_tensor_free(in);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(constant_output_and_repeated_outputs_are_copied)
{
	kiln_graph *g = kiln_graph_new("c");
	uint32_t x = input(g, "x", KILN_F32, 1, (int64_t[]){3});
	kiln_tensor *t = tensor(KILN_F32, 1, (int64_t[]){3}, (double[]){4, -2, 7});
	ir_node *n = ir_node_new(g, KILN_OP_CONSTANT, 0, NULL, 1, KILN_HERE);
	ck_assert_int_eq(ir_attr_set_tensor(g, n, "value", t), KILN_OK);
	ck_assert_int_eq(ir_infer_node(g, n), KILN_OK);
	uint32_t r = op1(g, KILN_OP_RELU, 1, &x, "");
	uint32_t v = op1(g, KILN_OP_RESHAPE, 1, &r, "shape=3");
	ir_output_add(g, n->out[0], "c");
	ir_output_add(g, x, "x_again");
	ir_output_add(g, r, "r");
	ir_output_add(g, r, "r_again");
	ir_output_add(g, v, "view");
	kiln_tensor *in = tensor(KILN_F32, 1, (int64_t[]){3}, (double[]){-1, 2, -3});
	compare(g, &in, 1, 5, 0, "copies");
	cg_module *m = lower(g);
	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(m->buf[m->outputs[i]].kind, CG_BUF_OUTPUT);
		ck_assert_int_eq(m->buf[m->outputs[i]].io_index, i);
	}
	ck_assert_int_eq(m->nkern, 5); /* relu and four copies (c, x, r again, view) */
	cg_module_free(m);
	kiln_tensor_free(in), kiln_tensor_free(t);
	kiln_graph_free(g);
}
END_TEST

/* Turns every CG_CHECK under s into an empty block. */
static void strip_checks(cg_stmt *s)
{
	if (!s)
		return;
	if (s->kind == CG_CHECK)
		*s = (cg_stmt){.kind = CG_BLOCK};
	for (int i = 0; s->kind == CG_BLOCK && i < s->n; i++)
		strip_checks(s->items[i]);
	strip_checks(s->body);
	strip_checks(s->then_s);
	strip_checks(s->else_s);
}

/* An index outside [-dim, dim) is the interpreter's error in the kernels
 * too (a CG_CHECK of every index, before any is used), and each use is
 * clamped besides: with the checks stripped, the evaluator (which
 * bounds-checks every access) sees no stray read. */
START_TEST(gather_checks_then_clamps_out_of_range_indices)
{
	kiln_graph *g = kiln_graph_new("gather");
	uint32_t xi[2] = {input(g, "x", KILN_F32, 2, (int64_t[]){4, 2}),
	                  input(g, "i", KILN_I64, 1, (int64_t[]){3})};
	ir_output_add(g, op1(g, KILN_OP_GATHER, 2, xi, ""), "y");
	kiln_tensor *in[2] = {ramp(KILN_F32, 2, (int64_t[]){4, 2}),
	                      tensor(KILN_I64, 1, (int64_t[]){3}, (double[]){-1, 9, -9})};
	kiln_tensor *y;
	cg_module *m = lower(g);
	kiln_error err = {0};
	ck_assert_int_eq(cg_eval(m, in, 2, &y, 1, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "Gather: axis 0 index 9 out of range [-4, 4)"), "%s",
	              err.msg);
	strip_checks(m->kern[0].body);
	ck_assert_msg(cg_eval(m, in, 2, &y, 1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_double_eq(ir_load(y, 0), ir_load(in[0], 6)); /* -1: the last row */
	ck_assert_double_eq(ir_load(y, 2), ir_load(in[0], 6)); /* 9: clamped to the last */
	ck_assert_double_eq(ir_load(y, 4), ir_load(in[0], 0)); /* -9: clamped to the first */
	kiln_tensor_free(y), kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* The kernel IR printer names every buffer kind (a training module's
 * state too) and prints checks with their range and message. */
START_TEST(printer_names_state_buffers_and_checks)
{
	cg_module *m = cg_module_new(NULL);
	int s = cg_buf_new(m, CG_BUF_STATE, KILN_F32, cg_int(m, 4));
	int i = cg_buf_new(m, CG_BUF_INPUT, KILN_I64, cg_int(m, 4));
	m->buf[s].type = (ir_type){KILN_F32, 1, {4}};
	m->buf[i].type = (ir_type){KILN_I64, 1, {4}};
	cg_kernel *k = cg_kernel_new(m, "k0_check", 0);
	cg_append(m, k->body, cg_check(m, "Gather 'g': index", cg_load(m, i, cg_int(m, 1)),
	                               cg_int(m, -4), cg_int(m, 4)));
	cg_append(m, k->body, cg_check(m, "Div: integer division by zero",
	                               cg_load(m, i, cg_int(m, 2)), NULL, NULL));
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	cg_print(m, f);
	fclose(f);
	ck_assert_msg(strstr(text, "buf0 state f32[4]"), "%s", text);
	ck_assert_msg(strstr(text, "check buf1[1] in [-4, 4) \"Gather 'g': index\""), "%s", text);
	ck_assert_msg(strstr(text, "check buf1[2] != 0 \"Div: integer division by zero\""), "%s",
	              text);
	free(text);
	cg_module_free(m);
}
END_TEST

START_TEST(lowering_rejects_symbolic_channels)
{
	kiln_graph *g = kiln_graph_new("conv");
	int64_t C = kiln_sym(g, "C");
	uint32_t xw[2] = {input(g, "x", KILN_F32, 4, (int64_t[]){1, C, 5, 5}),
	                  input(g, "w", KILN_F32, 4, (int64_t[]){3, C, 3, 3})};
	ir_node *n = ir_node_new(g, KILN_OP_CONV, 2, xw, 1, (kiln_loc){"net.c", 12});
	n->name = ir_intern(g, "c1");
	ck_assert_msg(ir_infer_node(g, n) == KILN_OK, "%s", kiln_graph_errmsg(g));
	ir_output_add(g, n->out[0], "y");
	cg_module *m = (cg_module *)1;
	kiln_error err = {0};
	ck_assert_int_eq(cg_lower(g, &m, &err), KILN_EUNSUPPORTED);
	ck_assert_ptr_null(m);
	ck_assert_int_eq(err.code, KILN_EUNSUPPORTED);
	ck_assert_msg(strstr(err.msg, "net.c:12: Conv 'c1': symbolic channel counts"), "%s", err.msg);
	kiln_graph_free(g);
}
END_TEST

/* The typed GEMM's epilogue as cg_eval defines it (codegen.h): an int8
 * product with zero points (one for A, per column for B), an i32 bias, a
 * requantization scale, clip, a residual and C's zero point, rounded half
 * to even into i8.  No lowering makes one yet; this is the oracle a
 * backend that takes them is checked against. */
START_TEST(eval_computes_an_int8_gemm_epilogue)
{
	cg_module *m = cg_module_new(NULL);
	static const struct {
		kiln_dtype dt;
		int rank;
		int64_t d0, d1;
		double v[6];
	} in[] = {
		{KILN_I8, 2, 2, 3, {1, 2, 3, 4, 5, 6}}, /* A */
		{KILN_I8, 2, 3, 2, {1, 1, 0, 2, 1, 2}}, /* B */
		{KILN_I8, 1, 1, 0, {1}},                /* a_zero, whole A */
		{KILN_I8, 1, 2, 0, {0, 1}},             /* b_zero per column */
		{KILN_I32, 1, 2, 0, {10, -4}},          /* bias per column */
		{KILN_F32, 1, 1, 0, {0.5}},             /* scale */
		{KILN_I8, 2, 2, 2, {1, 2, 3, 4}},       /* residual */
		{KILN_I8, 1, 1, 0, {2}},                /* c_zero */
	};
	enum { NIN = sizeof in / sizeof in[0] };
	kiln_tensor *t[NIN];
	m->inputs = malloc(NIN * sizeof *m->inputs);
	m->outputs = malloc(sizeof *m->outputs);
	for (int i = 0; i < NIN; i++) {
		int64_t shape[2] = {in[i].d0, in[i].d1};
		int64_t n = in[i].d0 * (in[i].rank > 1 ? in[i].d1 : 1);
		m->inputs[i] = cg_buf_new(m, CG_BUF_INPUT, in[i].dt, cg_int(m, n));
		m->buf[m->inputs[i]].type = (ir_type){in[i].dt, in[i].rank, {in[i].d0, in[i].d1}};
		m->buf[m->inputs[i]].io_index = i;
		t[i] = tensor(in[i].dt, in[i].rank, shape, in[i].v);
	}
	m->ninputs = NIN;
	int c = cg_buf_new(m, CG_BUF_OUTPUT, KILN_I8, cg_int(m, 4));
	m->buf[c].type = (ir_type){KILN_I8, 2, {2, 2}};
	m->buf[c].io_index = 0;
	m->outputs[0] = c;
	m->noutputs = 1;
	cg_kernel *k = cg_kernel_new(m, "k0_qgemm", 0);
	cg_expr *z = cg_int(m, 0);
	cg_gemm g = {.a = 0, .b = 1, .c = c, .bias = 4, .M = cg_int(m, 2), .N = cg_int(m, 2),
	             .a_off = z, .a_bs = z, .b_off = z, .b_bs = z, .c_off = z, .c_bs = z,
	             .bias_off = z, .res_off = z,
	             .K = cg_int(m, 3), .batch = cg_int(m, 1), .a_rs = cg_int(m, 3),
	             .a_cs = cg_int(m, 1), .b_rs = cg_int(m, 2), .b_cs = cg_int(m, 1),
	             .c_rs = cg_int(m, 2), .alpha = 1, .bias_axis = 1, .acc_dt = KILN_I32,
	             .act = CG_ACT_CLIP, .act_lo = -3, .act_hi = 20,
	             .a_zero = {2, z, CG_AXIS_ALL}, .b_zero = {3, z, CG_AXIS_COL},
	             .scale = {5, z, CG_AXIS_ALL}, .c_zero = {7, z, CG_AXIS_ALL},
	             .has_residual = true, .residual = 6, .res_rs = cg_int(m, 2)};
	cg_append(m, k->body, cg_gemm_stmt(m, &g));
	/* A - 1 = [[0,1,2],[3,4,5]]; B - b_zero = [[1,0],[0,1],[1,1]]: acc = [[2,3],[8,9]];
	 * + bias = [[12,-1],[18,5]]; * 0.5 = [[6,-0.5],[9,2.5]]; clip [-3,20] keeps
	 * them; + residual + 2 = [[9,3.5],[14,8.5]], rounded half to even */
	kiln_tensor *y = NULL;
	kiln_error err = {0};
	ck_assert_msg(cg_eval(m, t, NIN, &y, 1, &err) == KILN_OK, "%s", err.msg);
	const int8_t want[4] = {9, 4, 14, 8};
	ck_assert_mem_eq(y->data, want, 4);
	char *text = dump(m);
	ck_assert_msg(strstr(text, "bias=buf4[0] per column clip(-3, 20) types=i8*i8->i8 acc=i32 "
	                           "scale=buf5[0] per all "
	                           "a_zero=buf2[0] per all b_zero=buf3[0] per column "
	                           "c_zero=buf7[0] per all residual=buf6[0; 2]"), "%s", text);
	free(text);
	kiln_tensor_free(y);
	for (int i = 0; i < NIN; i++)
		kiln_tensor_free(t[i]);
	cg_module_free(m);
}
END_TEST

START_TEST(eval_rejects_wrong_input_count_and_shape)
{
	kiln_graph *g = kiln_graph_new("r");
	uint32_t x = input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 4});
	ir_output_add(g, op1(g, KILN_OP_RELU, 1, &x, ""), "y");
	cg_module *m = lower(g);
	kiln_tensor *bad = tensor(KILN_F32, 2, (int64_t[]){2, 5}, NULL), *y = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(cg_eval(m, NULL, 0, &y, 1, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "module has 1 inputs and 1 outputs, got 0 and 1"), "%s", err.msg);
	ck_assert_int_eq(cg_eval(m, &bad, 1, &y, 1, &err), KILN_ESHAPE);
	ck_assert_msg(strstr(err.msg, "input 0 dim 1 is 5"), "%s", err.msg);
	ck_assert_ptr_null(y);
	kiln_tensor_free(bad);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* ---- memory plan ------------------------------------------------------------- */

START_TEST(chain_of_ten_relus_uses_two_slots)
{
	kiln_graph *g = kiln_graph_new("chain");
	uint32_t v = input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 8});
	for (int i = 0; i < 10; i++)
		v = op1(g, KILN_OP_RELU, 1, &v, "");
	ir_output_add(g, v, "y");
	cg_module *m = lower(g);
	ck_assert_int_eq(m->nkern, 10);
	ck_assert_int_le(m->nslot, 2);
	ck_assert_int_ge(m->nslot, 2);
	kiln_tensor *x = ramp(KILN_F32, 2, (int64_t[]){3, 8});
	compare(g, &x, 1, 1, 0, "chain");
	kiln_tensor_free(x);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(views_extend_their_base_lifetime)
{
	kiln_graph *g = kiln_graph_new("view");
	uint32_t x = input(g, "x", KILN_F32, 2, (int64_t[]){4, 6});
	uint32_t a = op1(g, KILN_OP_NEG, 1, &x, "");           /* k0 writes a */
	uint32_t r = op1(g, KILN_OP_RESHAPE, 1, &a, "shape=24"); /* view of a */
	uint32_t b = op1(g, KILN_OP_EXP, 1, &x, "");             /* k1 */
	uint32_t c = op1(g, KILN_OP_ABS, 1, &b, "");             /* k2 */
	uint32_t rc[2] = {op1(g, KILN_OP_RESHAPE, 1, &c, "shape=24"), r};
	ir_output_add(g, op1(g, KILN_OP_ADD, 2, rc, ""), "y"); /* k3 reads the view */
	cg_module *m = lower(g);
	int ab = -1, rb = -1;
	for (int i = 0; i < m->nbuf; i++) {
		if (m->buf[i].value == a)
			ab = i;
		if (m->buf[i].value == r)
			rb = i;
	}
	ck_assert_int_eq(m->buf[rb].alias, ab);
	ck_assert_int_eq(m->buf[ab].first, 0);
	ck_assert_int_eq(m->buf[ab].last, 3);
	ck_assert_int_eq(m->buf[rb].slot, -1);
	kiln_tensor *in = ramp(KILN_F32, 2, (int64_t[]){4, 6});
	compare(g, &in, 1, 1, 1e-6, "view lifetime");
	kiln_tensor_free(in);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* ---- the example models ------------------------------------------------------ */

static void model_matches(const char *name, model_fn model, int rank, const int64_t *feat)
{
	kiln_graph *g = trained_model(name, model, rank, feat);
	kiln_tensor *x = model_input(name);
	compare(g, &x, 1, 1, 1e-5, name);
	kiln_tensor_free(x);
	kiln_graph_free(g);
}

START_TEST(mlp_matches_interpreter)
{
	model_matches("mlp", example_mlp, 2, (int64_t[]){784});
}
END_TEST

START_TEST(cnn_matches_interpreter)
{
	model_matches("cnn", example_cnn, 4, (int64_t[]){1, 28, 28});
}
END_TEST

static Suite *lower_suite(void)
{
	Suite *s = suite_create("lower");
	opcase_add_tcases(s, op_case_matches_interpreter);
	TCase *tc = tcase_create("coverage");
	tcase_add_test(tc, every_op_has_a_lowering_and_a_case);
	tcase_add_test(tc, shape_stores_the_bound_symbolic_dims);
	tcase_add_test(tc, constant_output_and_repeated_outputs_are_copied);
	tcase_add_test(tc, gather_checks_then_clamps_out_of_range_indices);
	tcase_add_test(tc, printer_names_state_buffers_and_checks);
	tcase_add_test(tc, lowering_rejects_symbolic_channels);
	tcase_add_test(tc, eval_computes_an_int8_gemm_epilogue);
	tcase_add_test(tc, eval_rejects_wrong_input_count_and_shape);
	suite_add_tcase(s, tc);
	tc = tcase_create("loops");
	tcase_add_test(tc, same_shape_add_is_one_flat_vectorized_loop);
	tcase_add_test(tc, matmul_lowers_to_one_gemm_with_the_batch_folded);
	tcase_add_test(tc, broadcast_batch_matmul_uses_stride_zero);
	tcase_add_test(tc, gemm_vector_c_becomes_a_column_bias);
	tcase_add_test(tc, relu_after_gemm_fuses_into_its_epilogue);
	tcase_add_test(tc, pointwise_conv_is_a_gemm_without_im2col);
	tcase_add_test(tc, depthwise_conv_with_symbolic_batch_matches);
	tcase_add_test(tc, depthwise_conv_edges_multiplier_and_dilation_match);
	suite_add_tcase(s, tc);
	tc = tcase_create("memplan");
	tcase_add_test(tc, chain_of_ten_relus_uses_two_slots);
	tcase_add_test(tc, views_extend_their_base_lifetime);
	suite_add_tcase(s, tc);
	tc = tcase_create("models");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, mlp_matches_interpreter);
	tcase_add_test(tc, cnn_matches_interpreter);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(lower_suite)
