/* test_quant.c: hostile quantization parameters.  A scale that is zero,
 * negative, infinite or NaN, a zero point of the wrong dtype, and per-axis
 * vectors of the wrong length are each an error naming the op, the input
 * and the shapes: at shape inference when the parameter is a constant, in
 * the interpreter when it arrives at run time.  (The compiled library's run
 * time check is in test_compiled_ops.c; the values themselves are checked
 * by the op fixtures and the ONNX node suite.) */
#include <math.h>
#include <string.h>

#include "ir/ir.h"

#include "check_main.h"
#include "op_cases.h"

static const int64_t d6[1] = {6}, d3[1] = {3}, d2[1] = {2}, x4[4] = {1, 3, 2, 2};

/* A one-node graph op(in...) whose node must fail shape inference with a
 * message holding want (and the op's name). */
static void expect_shape_error(kiln_graph *g, kiln_op op, uint32_t nin, const uint32_t *in,
                               const char *attrs, const char *want)
{
	ir_node *n = ir_node_new(g, op, nin, in, 1, KILN_HERE);
	ck_assert_ptr_nonnull(n);
	set_attrs(g, n, attrs);
	ck_assert_int_ne(ir_infer_node(g, n), KILN_OK);
	const char *msg = kiln_graph_errmsg(g);
	ck_assert_msg(strstr(msg, want) && strstr(msg, ir_op(op)->onnx), "got: %s", msg);
}

static uint32_t param(kiln_graph *g, const char *name, kiln_dtype dt, int rank,
                      const int64_t *shape, const double *v)
{
	kiln_tensor *t = tensor(dt, rank, shape, v);
	uint32_t id = ir_param_new(g, name, t, false);
	kiln_tensor_free(t);
	ck_assert_uint_ne(id, 0);
	return id;
}

/* QLinearConv's eight inputs as graph inputs: x u8 [1,3,2,2] with zero
 * point of dtype xz, w i8 [4,3,1,1] with nw scales and zero points (0:
 * scalars), y u8. */
static void qlinear_conv_inputs(kiln_graph *g, kiln_dtype xz, int64_t nw, uint32_t *qc)
{
	const int64_t w4[4] = {4, 3, 1, 1}, dn[1] = {nw};
	int rw = nw ? 1 : 0;
	uint32_t in[8] = {input(g, "x", KILN_U8, 4, x4), input(g, "xs", KILN_F32, 0, NULL),
	                  input(g, "xz", xz, 0, NULL), input(g, "w", KILN_I8, 4, w4),
	                  input(g, "ws", KILN_F32, rw, dn), input(g, "wz", KILN_I8, rw, dn),
	                  input(g, "ys", KILN_F32, 0, NULL), input(g, "yz", KILN_U8, 0, NULL)};
	memcpy(qc, in, sizeof in);
}

START_TEST(constant_scales_must_be_positive_and_finite)
{
	static const double bad[] = {0, -0.5, INFINITY, NAN};
	static const char *const want[] = {"y_scale[1] is 0", "y_scale[1] is -0.5",
	                                   "y_scale[1] is inf", "y_scale[1] is nan"};
	for (int k = 0; k < 4; k++) {
		kiln_graph *g = kiln_graph_new("q");
		uint32_t in[2] = {input(g, "x", KILN_F32, 4, x4),
		                  param(g, "s", KILN_F32, 1, d3, (double[]){0.1, bad[k], 0.2})};
		expect_shape_error(g, KILN_OP_QUANTIZE_LINEAR, 2, in, "axis=1", want[k]);
		kiln_graph_free(g);
	}
	/* the same value one position off is a valid per-axis scale */
	kiln_graph *g = kiln_graph_new("q");
	uint32_t in[2] = {input(g, "x", KILN_F32, 4, x4),
	                  param(g, "s", KILN_F32, 1, d3, (double[]){0.1, 0.3, 0.2})};
	op1(g, KILN_OP_QUANTIZE_LINEAR, 2, in, "axis=1");
	kiln_graph_free(g);
}
END_TEST

START_TEST(per_axis_vectors_must_fit_the_axis)
{
	kiln_graph *g = kiln_graph_new("q");
	uint32_t in[3] = {input(g, "x", KILN_U8, 4, x4), input(g, "s", KILN_F32, 1, d2),
	                  input(g, "z", KILN_U8, 1, d2)};
	expect_shape_error(g, KILN_OP_DEQUANTIZE_LINEAR, 3, in, "axis=1",
	                   "x_scale f32[2] must have one value or 3 (dim 1 of u8[1,3,2,2])");
	kiln_graph_free(g);
	/* axis 2 has 2: fine there, but the zero point must match the scale */
	g = kiln_graph_new("q");
	uint32_t in2[3] = {input(g, "x", KILN_U8, 4, x4), input(g, "s", KILN_F32, 1, d2),
	                   input(g, "z", KILN_U8, 1, d3)};
	expect_shape_error(g, KILN_OP_DEQUANTIZE_LINEAR, 3, in2, "axis=2",
	                   "x_zero_point u8[3] does not match x_scale f32[2]");
	kiln_graph_free(g);
	/* QLinearConv's w_scale is per output channel: 3 values for 4 channels */
	g = kiln_graph_new("q");
	const int64_t d4[1] = {4};
	uint32_t qc[8];
	qlinear_conv_inputs(g, KILN_U8, 3, qc);
	expect_shape_error(g, KILN_OP_QLINEAR_CONV, 8, qc, "",
	                   "w_scale f32[3] must have one value or 4 (dim 0 of i8[4,3,1,1])");
	kiln_graph_free(g);
	/* MatMulInteger's a_zero_point: one per row of A, not per column */
	g = kiln_graph_new("q");
	const int64_t a24[2] = {2, 4}, b43[2] = {4, 3};
	uint32_t mm[3] = {input(g, "a", KILN_U8, 2, a24), input(g, "b", KILN_I8, 2, b43),
	                  input(g, "az", KILN_U8, 1, d4)};
	expect_shape_error(g, KILN_OP_MATMUL_INTEGER, 3, mm, "",
	                   "a_zero_point u8[4] must be one value or one per row for u8[2,4]");
	kiln_graph_free(g);
}
END_TEST

/* A zero point's dtype is the quantized type: it must be u8 or i8, and
 * where it describes an operand it must be that operand's dtype. */
START_TEST(zero_points_must_have_the_quantized_dtype)
{
	kiln_graph *g = kiln_graph_new("q");
	uint32_t in[3] = {input(g, "x", KILN_F32, 1, d6), input(g, "s", KILN_F32, 0, NULL),
	                  input(g, "z", KILN_I32, 0, NULL)};
	expect_shape_error(g, KILN_OP_QUANTIZE_LINEAR, 3, in, "",
	                   "y_zero_point must be u8 or i8, got i32[]");
	kiln_graph_free(g);
	g = kiln_graph_new("q");
	uint32_t qc[8];
	qlinear_conv_inputs(g, KILN_I8, 0, qc);
	expect_shape_error(g, KILN_OP_QLINEAR_CONV, 8, qc, "",
	                   "x_zero_point i8[] must have dtype u8");
	kiln_graph_free(g);
	/* a scale of another float type */
	g = kiln_graph_new("q");
	uint32_t in2[2] = {input(g, "x", KILN_U8, 1, d6), input(g, "s", KILN_F64, 0, NULL)};
	expect_shape_error(g, KILN_OP_DEQUANTIZE_LINEAR, 2, in2, "",
	                   "x_scale must be f32, got f64[]");
	kiln_graph_free(g);
}
END_TEST

/* Scales that arrive as inputs are checked when the interpreter runs. */
START_TEST(runtime_scales_are_checked_by_the_interpreter)
{
	kiln_graph *g = kiln_graph_new("q");
	const int64_t one[1] = {1};
	uint32_t q[2] = {input(g, "x", KILN_F32, 1, d6), input(g, "s", KILN_F32, 1, one)};
	ir_output_add(g, op1(g, KILN_OP_QUANTIZE_LINEAR, 2, q, ""), NULL);
	g->node[g->nnode - 1]->name = ir_intern(g, "quant");
	kiln_tensor *x = tensor(KILN_F32, 1, d6, (double[]){0.1, 0.2, -3, 4, 1e9, -1e9});
	static const double bad[] = {0, -1, NAN, INFINITY};
	for (int k = 0; k < 4; k++) {
		kiln_tensor *s = tensor(KILN_F32, 1, one, &bad[k]), *in2[2] = {x, s}, *y = NULL;
		kiln_error e = {0};
		ck_assert_int_eq(kiln_graph_run(g, in2, 2, &y, 1, &e), KILN_EINVAL);
		ck_assert_msg(strstr(e.msg, "QuantizeLinear 'quant'") &&
		              strstr(e.msg, "y_scale[0] is") &&
		              strstr(e.msg, "a scale must be positive and finite"), "%s", e.msg);
		ck_assert_ptr_null(y);
		kiln_tensor_free(s);
	}
	/* and a good one quantizes: saturating, ties to even */
	kiln_tensor *s = tensor(KILN_F32, 1, one, (double[]){0.2}), *in2[2] = {x, s}, *y = NULL;
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_run(g, in2, 2, &y, 1, &e) == KILN_OK, "%s", e.msg);
	const uint8_t *q8 = y->data;
	/* 0.1/0.2 = 0.5 -> 0 (even), 0.2/0.2 = 1, -15 -> 0, 20, 255, 0 */
	ck_assert_int_eq(q8[0], 0);
	ck_assert_int_eq(q8[1], 1);
	ck_assert_int_eq(q8[2], 0);
	ck_assert_int_eq(q8[3], 20);
	ck_assert_int_eq(q8[4], 255);
	ck_assert_int_eq(q8[5], 0);
	kiln_tensor_free(y), kiln_tensor_free(s), kiln_tensor_free(x);
	kiln_graph_free(g);
}
END_TEST

static Suite *quant_suite(void)
{
	Suite *s = suite_create("quant");
	TCase *t = tcase_create("hostile");
	tcase_add_test(t, constant_scales_must_be_positive_and_finite);
	tcase_add_test(t, per_axis_vectors_must_fit_the_axis);
	tcase_add_test(t, zero_points_must_have_the_quantized_dtype);
	tcase_add_test(t, runtime_scales_are_checked_by_the_interpreter);
	suite_add_tcase(s, t);
	return s;
}

KILN_CHECK_MAIN(quant_suite)
