/* test_interp.c: the reference interpreter (ir/interp.c) against PyTorch.
 *
 * Every op case of op_cases.h (fixtures in tests/fixtures/ops) becomes a
 * one-node graph run by kiln_graph_run; dtype, shape and values must match
 * the fixture outputs (1e-5 for f32, 1e-12 for f64 cases, exact for
 * integers and bools).  Then the driver's checks and errors, symbolic
 * batches, and element access by dtype. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

#include "check_main.h"
#include "op_cases.h"

/* ---- the op cases ------------------------------------------------------ */

START_TEST(op_case_matches_reference_fixture)
{
	opcase_graph c = opcase_build(opcase_get(_i));
	kiln_tensor *got[4] = {0};
	kiln_error err = {0};
	kiln_status st = kiln_graph_run(c.g, c.in, c.nin, got, c.nout, &err);
	ck_assert_msg(st == KILN_OK, "%s: %s", c.name, err.msg);
	expect_close(c.name, got, c.want, c.nout, c.tol);
	for (int k = 0; k < 4; k++)
		kiln_tensor_free(got[k]);
	opcase_free(&c);
}
END_TEST

static bool has_kernel(kiln_op op)
{
	return ir_interp_kernel(op) != NULL;
}

START_TEST(every_op_has_a_kernel_and_a_fixture_case)
{
	char missing[1024];
	opcase_uncovered(missing, sizeof missing, has_kernel);
	ck_assert_msg(!missing[0], "ops without a kernel or a case:%s", missing);
}
END_TEST

/* ---- graphs built by hand ------------------------------------------------ */

START_TEST(constant_yields_its_value)
{
	kiln_graph *g = kiln_graph_new("c");
	double v[] = {4, -2, 7};
	kiln_tensor *t = tensor(KILN_I32, 1, (int64_t[]){3}, v), *out[1];
	ir_node *n = ir_node_new(g, KILN_OP_CONSTANT, 0, NULL, 1, KILN_HERE);
	ck_assert_int_eq(ir_attr_set_tensor(g, n, "value", t), KILN_OK);
	ck_assert_int_eq(ir_infer_node(g, n), KILN_OK);
	ir_output_add(g, n->out[0], "c");
	ck_assert_int_eq(kiln_graph_run(g, NULL, 0, out, 1, NULL), KILN_OK);
	ck_assert_int_eq(out[0]->dtype, KILN_I32);
	ck_assert_int_eq(ir_load_i64(out[0], 0), 4);
	ck_assert_int_eq(ir_load_i64(out[0], 1), -2);
	ck_assert_int_eq(ir_load_i64(out[0], 2), 7);
	kiln_tensor_free(out[0]), kiln_tensor_free(t);
	kiln_graph_free(g);
}
END_TEST

START_TEST(shape_reads_the_bound_symbolic_dims)
{
	kiln_graph *g = kiln_graph_new("s");
	uint32_t x = input(g, "x", KILN_F32, 3, (int64_t[]){kiln_sym(g, "N"), 3, 5});
	ir_output_add(g, op1(g, KILN_OP_SHAPE, 1, &x, ""), "all");
	ir_output_add(g, op1(g, KILN_OP_SHAPE, 1, &x, "start=-2"), "tail");
	kiln_tensor *in = tensor(KILN_F32, 3, (int64_t[]){2, 3, 5}, NULL), *out[2];
	ck_assert_int_eq(kiln_graph_run(g, &in, 1, out, 2, NULL), KILN_OK);
	ck_assert_int_eq(out[0]->dtype, KILN_I64);
	ck_assert_int_eq(kiln_tensor_numel(out[0]), 3);
	ck_assert_int_eq(ir_load_i64(out[0], 0), 2);
	ck_assert_int_eq(ir_load_i64(out[0], 2), 5);
	ck_assert_int_eq(kiln_tensor_numel(out[1]), 2);
	ck_assert_int_eq(ir_load_i64(out[1], 0), 3);
	kiln_tensor_free(out[0]), kiln_tensor_free(out[1]), kiln_tensor_free(in);
	kiln_graph_free(g);
}
END_TEST

/* y = relu(x) @ w + b with x: f32[N,4] and parameters w, b; intermediates
 * are freed on the way (ASan's leak check sees any that are not). */
static kiln_graph *mlp(void)
{
	kiln_graph *g = kiln_graph_new("mlp");
	uint32_t x = input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 4});
	double wv[8] = {1, -1, 2, 0.5, 0, 3, -2, 1}, bv[2] = {0.25, -0.5};
	kiln_tensor *w = tensor(KILN_F32, 2, (int64_t[]){4, 2}, wv);
	kiln_tensor *b = tensor(KILN_F32, 1, (int64_t[]){2}, bv);
	uint32_t r = op1(g, KILN_OP_RELU, 1, &x, "");
	uint32_t mm[2] = {r, ir_param_new(g, "w", w, true)};
	uint32_t m = op1(g, KILN_OP_MATMUL, 2, mm, "");
	uint32_t ad[2] = {m, ir_param_new(g, "b", b, true)};
	ir_output_add(g, op1(g, KILN_OP_ADD, 2, ad, ""), "y");
	kiln_tensor_free(w), kiln_tensor_free(b);
	return g;
}

START_TEST(symbolic_batch_runs_at_two_sizes)
{
	kiln_graph *g = mlp();
	static const double wv[8] = {1, -1, 2, 0.5, 0, 3, -2, 1}, bv[2] = {0.25, -0.5};
	for (int64_t N = 2; N <= 5; N += 3) {
		double xv[20];
		for (int i = 0; i < N * 4; i++)
			xv[i] = (i % 7) - 3 + 0.5 * (i % 2);
		kiln_tensor *x = tensor(KILN_F32, 2, (int64_t[]){N, 4}, xv), *y;
		kiln_error err = {0};
		ck_assert_msg(kiln_graph_run(g, &x, 1, &y, 1, &err) == KILN_OK, "%s", err.msg);
		ck_assert_int_eq(y->shape[0], N);
		ck_assert_int_eq(y->shape[1], 2);
		for (int i = 0; i < N; i++)
			for (int j = 0; j < 2; j++) {
				double acc = bv[j];
				for (int k = 0; k < 4; k++)
					acc += fmax(xv[i * 4 + k], 0) * wv[k * 2 + j];
				ck_assert_double_eq_tol(ir_load(y, i * 2 + j), acc, 1e-6);
			}
		kiln_tensor_free(x), kiln_tensor_free(y);
	}
	kiln_graph_free(g);
}
END_TEST

/* ---- kiln_graph_run's checks -------------------------------------------- */

/* Runs g on the given inputs expecting failure; returns the error. */
static kiln_error run_fails(kiln_graph *g, kiln_tensor **in, int nin, int nout)
{
	kiln_tensor *out[4] = {0};
	kiln_error err = {0};
	kiln_status st = kiln_graph_run(g, in, nin, out, nout, &err);
	ck_assert_int_ne(st, KILN_OK);
	ck_assert_int_eq(st, err.code);
	for (int k = 0; k < nout; k++)
		ck_assert_ptr_null(out[k]);
	return err;
}

START_TEST(run_rejects_wrong_input_count)
{
	kiln_graph *g = mlp();
	kiln_error err = run_fails(g, NULL, 0, 1);
	ck_assert_int_eq(err.code, KILN_EINVAL);
	ck_assert_str_eq(err.msg, "kiln_graph_run: graph 'mlp' has 1 inputs and 1 outputs, got 0 and 1");
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_wrong_dtype)
{
	kiln_graph *g = mlp();
	kiln_tensor *x = tensor(KILN_I32, 2, (int64_t[]){2, 4}, NULL);
	kiln_error err = run_fails(g, &x, 1, 1);
	ck_assert_int_eq(err.code, KILN_ESHAPE);
	ck_assert_str_eq(err.msg, "kiln_graph_run: input 'x' expects f32[N,4], got i32[2,4] "
	                          "(dtype i32, expected f32)");
	kiln_tensor_free(x);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_wrong_fixed_dim)
{
	kiln_graph *g = mlp();
	kiln_tensor *x = tensor(KILN_F32, 2, (int64_t[]){2, 5}, NULL);
	kiln_error err = run_fails(g, &x, 1, 1);
	ck_assert_int_eq(err.code, KILN_ESHAPE);
	ck_assert_ptr_nonnull(strstr(err.msg, "input 'x' expects f32[N,4], got f32[2,5]"));
	ck_assert_ptr_nonnull(strstr(err.msg, "dim 1 is 5, expected 4"));
	kiln_tensor_free(x);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_inconsistent_symbol_binding)
{
	kiln_graph *g = kiln_graph_new("two");
	int64_t N = kiln_sym(g, "N");
	uint32_t ab[2] = {input(g, "a", KILN_F32, 2, (int64_t[]){N, 4}),
	                  input(g, "b", KILN_F32, 2, (int64_t[]){N, 4})};
	ir_output_add(g, op1(g, KILN_OP_ADD, 2, ab, ""), "y");
	kiln_tensor *in[2] = {tensor(KILN_F32, 2, (int64_t[]){2, 4}, NULL),
	                      tensor(KILN_F32, 2, (int64_t[]){3, 4}, NULL)};
	kiln_error err = run_fails(g, in, 2, 1);
	ck_assert_int_eq(err.code, KILN_ESHAPE);
	ck_assert_ptr_nonnull(strstr(err.msg, "input 'b' expects f32[N,4], got f32[3,4]"));
	ck_assert_ptr_nonnull(strstr(err.msg, "N=2 vs N=3"));
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

/* An empty input may carry any other dim (a .npy of shape (0, 2^63-1) is
 * valid); a symbol is not bound past 2^48, so M + M below cannot overflow
 * (it used to: UBSan's signed overflow in ir_dim_eval). */
START_TEST(run_rejects_a_symbol_bound_past_2_48)
{
	kiln_graph *g = kiln_graph_new("cat");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"),
	                                                          kiln_sym(g, "M")});
	kiln_output(g, "y", kiln_concat(g, 2, (kiln_value[]){x, x}, 1));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_tensor *in = kiln_tensor_new(KILN_F32, 2, (int64_t[]){0, INT64_MAX});
	kiln_error err = run_fails(g, &in, 1, 1);
	ck_assert_int_eq(err.code, KILN_ESHAPE);
	ck_assert_msg(strstr(err.msg, "dim 1 is 9223372036854775807, more than a symbolic dim may "
	                     "be (2^48)"), "%s", err.msg);
	kiln_tensor_free(in);
	/* at 2^48 it runs: an empty result of twice that */
	in = kiln_tensor_new(KILN_F32, 2, (int64_t[]){0, (int64_t)1 << 48});
	kiln_tensor *y = NULL;
	ck_assert_msg(kiln_graph_run(g, &in, 1, &y, 1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(y->shape[1], (int64_t)1 << 49);
	kiln_tensor_free(in), kiln_tensor_free(y);
	/* dim expressions that overflow evaluate to -1, the "unbound" answer */
	int64_t N = kiln_sym(g, "N"), M = kiln_sym(g, "M");
	int64_t big[2] = {INT64_MAX / 2, 3};
	ck_assert_int_eq(ir_dim_eval(g, ir_dim_mul(g, N, M), big), -1);
	ck_assert_int_eq(ir_dim_eval(g, ir_dim_add(g, ir_dim_add(g, N, N), N), big), -1);
	ck_assert_int_eq(ir_dim_eval(g, ir_dim_add(g, N, M), big), INT64_MAX / 2 + 3);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_gather_index_out_of_range)
{
	kiln_graph *g = kiln_graph_new("gather");
	uint32_t xi[2] = {input(g, "x", KILN_F32, 2, (int64_t[]){4, 3}),
	                  input(g, "i", KILN_I64, 1, (int64_t[]){2})};
	ir_output_add(g, op1(g, KILN_OP_GATHER, 2, xi, ""), "y");
	kiln_tensor *in[2] = {tensor(KILN_F32, 2, (int64_t[]){4, 3}, NULL),
	                      tensor(KILN_I64, 1, (int64_t[]){2}, (double[]){-4, 4})};
	kiln_error err = run_fails(g, in, 2, 1);
	ck_assert_int_eq(err.code, KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "Gather: index 4 out of range for axis 0 of f32[4,3]"));
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_integer_division_by_zero)
{
	kiln_graph *g = kiln_graph_new("div");
	uint32_t ab[2] = {input(g, "a", KILN_I32, 1, (int64_t[]){2}),
	                  input(g, "b", KILN_I32, 1, (int64_t[]){2})};
	ir_output_add(g, op1(g, KILN_OP_DIV, 2, ab, ""), "y");
	kiln_tensor *in[2] = {tensor(KILN_I32, 1, (int64_t[]){2}, (double[]){-7, 1}),
	                      tensor(KILN_I32, 1, (int64_t[]){2}, (double[]){2, 0})};
	kiln_error err = run_fails(g, in, 2, 1);
	ck_assert_int_eq(err.code, KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "Div: integer division by zero"));
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_loss_target_out_of_range)
{
	kiln_graph *g = kiln_graph_new("nll");
	uint32_t xt[2] = {input(g, "x", KILN_F32, 2, (int64_t[]){2, 3}),
	                  input(g, "t", KILN_I64, 1, (int64_t[]){2})};
	ir_output_add(g, op1(g, KILN_OP_NLL_LOSS, 2, xt, ""), "l");
	kiln_tensor *in[2] = {tensor(KILN_F32, 2, (int64_t[]){2, 3}, NULL),
	                      tensor(KILN_I64, 1, (int64_t[]){2}, (double[]){0, 3})};
	kiln_error err = run_fails(g, in, 2, 1);
	ck_assert_int_eq(err.code, KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "target 3 out of range [0, 3)"));
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_reports_the_graphs_sticky_error)
{
	kiln_graph *g = mlp();
	ir_errorf(g, NULL, KILN_ESHAPE, "earlier trouble");
	kiln_tensor *x = tensor(KILN_F32, 2, (int64_t[]){2, 4}, NULL);
	kiln_error err = run_fails(g, &x, 1, 1);
	ck_assert_int_eq(err.code, KILN_ESHAPE);
	ck_assert_str_eq(err.msg, "kiln_graph_run: graph 'mlp' has an error: earlier trouble");
	kiln_tensor_free(x);
	kiln_graph_free(g);
}
END_TEST

/* Kernels get shapes from inference; a wrong output shape is an error,
 * never a read outside an input. */
START_TEST(kernel_rejects_an_output_shape_it_cannot_fill)
{
	kiln_graph *g = kiln_graph_new("bad");
	uint32_t x = input(g, "x", KILN_F32, 2, (int64_t[]){2, 3});
	op1(g, KILN_OP_TRANSPOSE, 1, &x, "");
	ir_node *n = g->node[g->nnode - 1];
	kiln_tensor *in = tensor(KILN_F32, 2, (int64_t[]){2, 3}, NULL);
	kiln_tensor *out = tensor(KILN_F32, 2, (int64_t[]){2, 3}, NULL);
	kiln_error err = {0};
	ir_interp c = {g, &err, 0};
	ck_assert_int_eq(ir_interp_node(&c, n, &in, &out), KILN_ESHAPE);
	ck_assert_ptr_nonnull(strstr(err.msg, "Transpose: output is not the permuted input"));
	kiln_tensor_free(in), kiln_tensor_free(out);
	kiln_graph_free(g);
}
END_TEST

/* Attributes holding S: the same graph at S = 3 and S = 5 slices, counts
 * and reshapes to that S (dynseq_kir in op_cases.h). */
START_TEST(symbolic_attributes_run_at_two_lengths)
{
	kiln_graph *g = dynseq_graph();
	for (int64_t s = 3; s <= 5; s += 2) {
		kiln_tensor *in[2], *out[3] = {0};
		kiln_error err = {0};
		dynseq_inputs(s, in);
		ck_assert_msg(kiln_graph_run(g, in, 2, out, 3, &err) == KILN_OK, "%s", err.msg);
		dynseq_expect("interpreter", s, out);
		for (int k = 0; k < 3; k++)
			kiln_tensor_free(out[k]);
		kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	}
	kiln_graph_free(g);
}
END_TEST

/* [0:S] of an 8-long axis is S long only while S <= 8: at S = 9 the run
 * fails naming the slice and the promise, instead of clamping to a shape
 * the graph did not declare. */
START_TEST(symbolic_slice_end_past_the_axis_is_an_error)
{
	kiln_graph *g = dynseq_graph();
	kiln_tensor *in[2], *out[3] = {0};
	kiln_error err = {0};
	dynseq_inputs(9, in);
	ck_assert_int_eq(kiln_graph_run(g, in, 2, out, 3, &err), KILN_ESHAPE);
	ck_assert_msg(strstr(err.msg, "dynseq.kir:3: Slice: end S=9 is past the 8 of axis 1 of "
	                     "i64[1,8]; the graph takes S <= 8"), "%s", err.msg);
	ck_assert_ptr_null(out[0]);
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

/* ---- element access by dtype ------------------------------------------- */

static uint16_t bits16(kiln_dtype dt, double v)
{
	kiln_tensor *t = tensor(dt, 1, (int64_t[]){1}, &v);
	uint16_t b = *(uint16_t *)t->data;
	kiln_tensor_free(t);
	return b;
}

START_TEST(f16_rounds_to_nearest_even)
{
	ck_assert_uint_eq(bits16(KILN_F16, 1.0), 0x3c00);
	ck_assert_uint_eq(bits16(KILN_F16, 1.0 / 3), 0x3555);
	ck_assert_uint_eq(bits16(KILN_F16, 1 + 0x1p-11), 0x3c00);     /* tie: stays even */
	ck_assert_uint_eq(bits16(KILN_F16, 1 + 3 * 0x1p-11), 0x3c02); /* tie: up to even */
	ck_assert_uint_eq(bits16(KILN_F16, 65519), 0x7bff);           /* 65504 */
	ck_assert_uint_eq(bits16(KILN_F16, 65520), 0x7c00);           /* overflows to inf */
	ck_assert_uint_eq(bits16(KILN_F16, -0x1p-24), 0x8001);        /* smallest subnormal */
	ck_assert_uint_eq(bits16(KILN_F16, 0x1p-25), 0x0000);         /* tie to even zero */
	ck_assert_uint_eq(bits16(KILN_F16, 3 * 0x1p-25), 0x0002);
	ck_assert_uint_eq(bits16(KILN_F16, NAN) & 0x7e00, 0x7e00);
	kiln_tensor *t = tensor(KILN_F16, 1, (int64_t[]){1}, (double[]){0x1p-24});
	ck_assert_double_eq(ir_load(t, 0), 0x1p-24);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(bf16_rounds_to_nearest_even)
{
	ck_assert_uint_eq(bits16(KILN_BF16, 1.0), 0x3f80);
	ck_assert_uint_eq(bits16(KILN_BF16, 1 + 0x1p-8), 0x3f80);     /* tie: stays even */
	ck_assert_uint_eq(bits16(KILN_BF16, 1 + 3 * 0x1p-8), 0x3f82); /* tie: up to even */
	ck_assert_uint_eq(bits16(KILN_BF16, 1 + 0x1p-8 + 0x1p-30), 0x3f81); /* no double rounding */
	ck_assert_uint_eq(bits16(KILN_BF16, -3.0e38), 0xff62);
	ck_assert_uint_eq(bits16(KILN_BF16, 1e39), 0x7f80);
	kiln_tensor *t = tensor(KILN_BF16, 1, (int64_t[]){1}, (double[]){-2.5});
	ck_assert_double_eq(ir_load(t, 0), -2.5);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(integer_stores_truncate_saturate_and_wrap)
{
	kiln_tensor *t = tensor(KILN_I8, 1, (int64_t[]){4}, (double[]){-2.9, 300, NAN, -1e9});
	ck_assert_int_eq(ir_load_i64(t, 0), -2);
	ck_assert_int_eq(ir_load_i64(t, 1), 127);
	ck_assert_int_eq(ir_load_i64(t, 2), 0);
	ck_assert_int_eq(ir_load_i64(t, 3), -128);
	ir_store_i64(t, 0, 300); /* integer to integer wraps, as numpy's astype */
	ck_assert_int_eq(ir_load_i64(t, 0), 44);
	kiln_tensor_free(t);
	kiln_tensor *b = tensor(KILN_BOOL, 1, (int64_t[]){3}, (double[]){0.0, -0.5, NAN});
	ck_assert_int_eq(((uint8_t *)b->data)[0], 0);
	ck_assert_int_eq(((uint8_t *)b->data)[1], 1);
	ck_assert_int_eq(((uint8_t *)b->data)[2], 1);
	kiln_tensor_free(b);
	kiln_tensor *l = tensor(KILN_I64, 1, (int64_t[]){1}, NULL);
	ir_store_i64(l, 0, INT64_MAX);
	ck_assert_int_eq(ir_load_i64(l, 0), INT64_MAX);
	ir_store(l, 0, 1e300);
	ck_assert_int_eq(ir_load_i64(l, 0), INT64_MAX);
	kiln_tensor_free(l);
}
END_TEST

static Suite *interp_suite(void)
{
	Suite *s = suite_create("interp");
	opcase_add_tcases(s, op_case_matches_reference_fixture);
	TCase *tc = tcase_create("coverage");
	tcase_add_test(tc, every_op_has_a_kernel_and_a_fixture_case);
	tcase_add_test(tc, constant_yields_its_value);
	tcase_add_test(tc, shape_reads_the_bound_symbolic_dims);
	suite_add_tcase(s, tc);
	tc = tcase_create("driver");
	tcase_add_test(tc, symbolic_batch_runs_at_two_sizes);
	tcase_add_test(tc, run_rejects_wrong_input_count);
	tcase_add_test(tc, run_rejects_wrong_dtype);
	tcase_add_test(tc, run_rejects_wrong_fixed_dim);
	tcase_add_test(tc, run_rejects_inconsistent_symbol_binding);
	tcase_add_test(tc, run_rejects_a_symbol_bound_past_2_48);
	tcase_add_test(tc, run_rejects_gather_index_out_of_range);
	tcase_add_test(tc, run_rejects_integer_division_by_zero);
	tcase_add_test(tc, run_rejects_loss_target_out_of_range);
	tcase_add_test(tc, run_reports_the_graphs_sticky_error);
	tcase_add_test(tc, kernel_rejects_an_output_shape_it_cannot_fill);
	tcase_add_test(tc, symbolic_attributes_run_at_two_lengths);
	tcase_add_test(tc, symbolic_slice_end_past_the_axis_is_an_error);
	suite_add_tcase(s, tc);
	tc = tcase_create("dtypes");
	tcase_add_test(tc, f16_rounds_to_nearest_even);
	tcase_add_test(tc, bf16_rounds_to_nearest_even);
	tcase_add_test(tc, integer_stores_truncate_saturate_and_wrap);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(interp_suite)
