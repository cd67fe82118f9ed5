/*
 * shape_quant.c: shape and dtype rules of the quantization ops
 * (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
 * ConvInteger, QLinearMatMul, QLinearConv).
 *
 * What they share is the check of a scale and zero point pair: the scale
 * is f32, one value (a scalar or a one-element vector) or a vector along
 * one axis of the data it describes; the zero point has the data's
 * quantized dtype and the scale's shape.  A scale known at compile time (a
 * parameter or a Constant) must be positive and finite: a zero, negative,
 * infinite or NaN scale is an error naming the element, here rather than
 * as garbage at run time.  The rules are registered in ir_shape_table
 * through ir/shape.h, with shape.c's conventions.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/shape.h"

static bool is_q8(kiln_dtype dt)
{
	return dt == KILN_U8 || dt == KILN_I8;
}

/* The constant behind input i of n (a parameter's data or a Constant's
 * value), or NULL when it is only known at run time. */
static const kiln_tensor *known(const kiln_graph *g, const ir_node *n, uint32_t i)
{
	const ir_value *v = ir_val(g, n->in[i]);
	if (!v)
		return NULL;
	if (v->kind == IR_V_PARAM)
		return v->data;
	if (v->kind == IR_V_NODE && v->def && v->def->op == KILN_OP_CONSTANT) {
		const ir_attr *a = ir_attr_get(v->def, "value");
		return a && a->kind == IR_A_TENSOR ? a->u.t : NULL;
	}
	return NULL;
}

/* Elements in a scale or zero point of rank 0 or 1. */
static int64_t qlen(const ir_type *t)
{
	return t->rank == 0 ? 1 : t->dim[0];
}

/* Checks the scale (input is) and zero point (input iz, -1 or past nin:
 * absent) describing x.  axis >= 0: a vector of x's dim axis is allowed
 * (per-axis); -1: one value only.  zdt: the zero point's required dtype
 * (KILN_DT_INVALID: u8 or i8, whichever it is). */
static kiln_status qparams(kiln_graph *g, const ir_node *n, const ir_type *in, int is, int iz,
                           const ir_type *x, int axis, kiln_dtype zdt, const char *what)
{
	const ir_type *s = &in[is];
	tbuf a, b;
	if (s->dtype != KILN_F32)
		FAIL(KILN_ESHAPE, "%s_scale must be f32, got %s", what, TS(s, a));
	if (s->rank > 1 || qlen(s) < 1)
		FAIL(KILN_ESHAPE, "%s_scale must be a scalar or a vector, got %s", what, TS(s, a));
	int64_t len = qlen(s);
	if (len != 1 && axis < 0)
		FAIL(KILN_ESHAPE, "%s_scale must be one value, got %s", what, TS(s, a));
	if (len != 1 && len != x->dim[axis]) {
		char d[64];
		FAIL(KILN_ESHAPE, "%s_scale %s must have one value or %s (dim %d of %s)", what,
		     TS(s, a), ir_dim_str(g, x->dim[axis], d, sizeof d), axis, TS(x, b));
	}
	if (iz >= 0 && (uint32_t)iz < n->nin) {
		const ir_type *z = &in[iz];
		if (zdt != KILN_DT_INVALID ? z->dtype != zdt : !is_q8(z->dtype)) {
			if (zdt != KILN_DT_INVALID)
				FAIL(KILN_ESHAPE, "%s_zero_point %s must have dtype %s", what, TS(z, a),
				     kiln_dtype_name(zdt));
			FAIL(KILN_ESHAPE, "%s_zero_point must be u8 or i8, got %s", what, TS(z, a));
		}
		if (z->rank > 1 || qlen(z) != len)
			FAIL(KILN_ESHAPE, "%s_zero_point %s does not match %s_scale %s", what, TS(z, a),
			     what, TS(s, b));
	}
	const kiln_tensor *sv = known(g, n, (uint32_t)is);
	for (int64_t i = 0; sv && sv->dtype == KILN_F32 && i < kiln_tensor_numel(sv); i++) {
		float v = ((const float *)sv->data)[i];
		if (!(v > 0) || !isfinite(v))
			FAIL(KILN_EINVAL, "%s_scale[%lld] is %g: a scale must be positive and finite",
			     what, (long long)i, (double)v);
	}
	return KILN_OK;
}

/* QuantizeLinear's and DequantizeLinear's axis, normalised against x; -1
 * (not read) when the scale s is one value. */
static kiln_status axis_of(kiln_graph *g, const ir_node *n, const ir_type *x, const ir_type *s,
                           int *axis)
{
	if (x->rank == 0 || s->rank == 0 || qlen(s) == 1) {
		*axis = -1;
		return KILN_OK;
	}
	return ir_axis_norm(g, n, ir_attr_int(n, "axis", 1), x->rank, 0, x, axis);
}

static kiln_status quantize(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const ir_type *x = &in[0];
	if (x->dtype != KILN_F32 && x->dtype != KILN_I32) {
		tbuf a;
		FAIL(KILN_ESHAPE, "x must be f32 or i32, got %s", TS(x, a));
	}
	int axis;
	TRY(axis_of(g, n, x, &in[1], &axis));
	TRY(qparams(g, n, in, 1, 2, x, axis, KILN_DT_INVALID, "y"));
	out[0] = *x;
	out[0].dtype = n->nin > 2 ? in[2].dtype : KILN_U8;
	return KILN_OK;
}

static kiln_status dequantize(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const ir_type *x = &in[0];
	tbuf a;
	if (!is_q8(x->dtype) && x->dtype != KILN_I32)
		FAIL(KILN_ESHAPE, "x must be u8, i8 or i32, got %s", TS(x, a));
	/* an i32 x (a bias) has zero point 0: absent, or (as ONNX Runtime's
	 * quantizer writes it) i32 zeros */
	const kiln_tensor *zv = x->dtype == KILN_I32 && n->nin > 2 ? known(g, n, 2) : NULL;
	for (int64_t i = 0; zv && i < kiln_tensor_numel(zv); i++)
		if (ir_load_i64(zv, i))
			FAIL(KILN_EINVAL, "x_zero_point[%lld] is %lld: an i32 x %s takes zero point 0",
			     (long long)i, (long long)ir_load_i64(zv, i), TS(x, a));
	int axis;
	TRY(axis_of(g, n, x, &in[1], &axis));
	TRY(qparams(g, n, in, 1, 2, x, axis, x->dtype, "x"));
	out[0] = *x;
	out[0].dtype = KILN_F32;
	return KILN_OK;
}

static kiln_status dynamic_quantize(kiln_graph *g, const ir_node *n, const ir_type *in,
                                    ir_type *out)
{
	if (in[0].dtype != KILN_F32) {
		tbuf a;
		FAIL(KILN_ESHAPE, "x must be f32, got %s", TS(&in[0], a));
	}
	out[0] = in[0];
	out[0].dtype = KILN_U8;
	out[1] = (ir_type){KILN_F32, 0, {0}};
	if (n->nout > 2)
		out[2] = (ir_type){KILN_U8, 0, {0}};
	return KILN_OK;
}

static kiln_status need_q8(kiln_graph *g, const ir_node *n, const ir_type *t, const char *what)
{
	if (!is_q8(t->dtype)) {
		tbuf a;
		FAIL(KILN_ESHAPE, "%s must be u8 or i8, got %s", what, TS(t, a));
	}
	return KILN_OK;
}

/* A zero point of MatMulInteger or ConvInteger (input i, maybe absent):
 * x's dtype, one value or a vector of len (len < 0: one value only). */
static kiln_status int_zero(kiln_graph *g, const ir_node *n, const ir_type *in, uint32_t i,
                            const ir_type *x, int64_t len, const char *what)
{
	if (i >= n->nin)
		return KILN_OK;
	const ir_type *z = &in[i];
	tbuf a, b;
	if (z->dtype != x->dtype)
		FAIL(KILN_ESHAPE, "%s %s must have the dtype of %s", what, TS(z, a), TS(x, b));
	if (z->rank > 1 || (qlen(z) != 1 && (len < 0 || qlen(z) != len)))
		FAIL(KILN_ESHAPE, "%s %s must be one value%s for %s", what, TS(z, a),
		     len < 0 ? "" : " or one per row", TS(x, b));
	return KILN_OK;
}

/* The matmul's shape with both operands read as i32. */
static kiln_status mm_shape(kiln_graph *g, const ir_node *n, const ir_type *a, const ir_type *b,
                            kiln_dtype dt, ir_type *out)
{
	ir_type ab[2] = {*a, *b};
	ab[0].dtype = ab[1].dtype = KILN_I32;
	TRY(ir_shape_matmul(g, n, ab, out));
	out->dtype = dt;
	return KILN_OK;
}

/* A's rows (per-row zero points and scales), B's columns, or -1 when the
 * operand is not 2-D (one value only). */
static int64_t rows_of(const ir_type *a)
{
	return a->rank == 2 ? a->dim[0] : -1;
}

static int64_t cols_of(const ir_type *b)
{
	return b->rank == 2 ? b->dim[1] : -1;
}

static kiln_status matmul_integer(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	TRY(need_q8(g, n, &in[0], "A"));
	TRY(need_q8(g, n, &in[1], "B"));
	TRY(int_zero(g, n, in, 2, &in[0], rows_of(&in[0]), "a_zero_point"));
	TRY(int_zero(g, n, in, 3, &in[1], cols_of(&in[1]), "b_zero_point"));
	return mm_shape(g, n, &in[0], &in[1], KILN_I32, out);
}

static kiln_status conv_shape(kiln_graph *g, const ir_node *n, const ir_type *x, const ir_type *w,
                              kiln_dtype dt, ir_type *out)
{
	ir_type xw[2] = {*x, *w};
	xw[0].dtype = xw[1].dtype = KILN_I32;
	TRY(ir_shape_conv_of(g, n, xw, NULL, out));
	out->dtype = dt;
	return KILN_OK;
}

static kiln_status conv_integer(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	TRY(need_q8(g, n, &in[0], "x"));
	TRY(need_q8(g, n, &in[1], "w"));
	TRY(int_zero(g, n, in, 2, &in[0], -1, "x_zero_point"));
	int64_t M = in[1].rank ? in[1].dim[0] : -1;
	TRY(int_zero(g, n, in, 3, &in[1], M, "w_zero_point"));
	return conv_shape(g, n, &in[0], &in[1], KILN_I32, out);
}

/* The three pairs of QLinearMatMul and QLinearConv: inputs 1-2 describe x
 * (input 0), 4-5 w (input 3, per row along wax when wax >= 0), 6-7 y. */
static kiln_status qlinear_params(kiln_graph *g, const ir_node *n, const ir_type *in, int xax,
                                  int wax, const ir_type *wt, const char *xn, const char *wn)
{
	TRY(need_q8(g, n, &in[0], xn));
	TRY(need_q8(g, n, &in[3], wn));
	TRY(qparams(g, n, in, 1, 2, &in[0], xax, in[0].dtype, xn));
	TRY(qparams(g, n, in, 4, 5, wt, wax, in[3].dtype, wn));
	return qparams(g, n, in, 6, 7, &in[0], -1, KILN_DT_INVALID, "y");
}

static kiln_status qlinear_matmul(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	/* a's scale may be per row of a 2-D a, b's per column of a 2-D b */
	ir_type bt = in[3];
	if (bt.rank == 2) /* per column: the check reads dim 0 of a transposed b */
		bt.dim[0] = in[3].dim[1], bt.dim[1] = in[3].dim[0];
	TRY(qlinear_params(g, n, in, in[0].rank == 2 ? 0 : -1, bt.rank == 2 ? 0 : -1, &bt, "a",
	                   "b"));
	return mm_shape(g, n, &in[0], &in[3], in[7].dtype, out);
}

static kiln_status qlinear_conv(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	TRY(qlinear_params(g, n, in, -1, in[3].rank ? 0 : -1, &in[3], "x", "w"));
	ir_type xw[2] = {in[0], in[3]};
	xw[0].dtype = xw[1].dtype = KILN_I32;
	const ir_type *bias = n->nin > 8 ? &in[8] : NULL;
	if (bias && bias->dtype != KILN_I32) {
		tbuf a;
		FAIL(KILN_ESHAPE, "bias must be i32 (in units of x_scale * w_scale), got %s",
		     TS(bias, a));
	}
	ir_type bi = bias ? *bias : (ir_type){0};
	TRY(ir_shape_conv_of(g, n, xw, bias ? &bi : NULL, out));
	out->dtype = in[7].dtype;
	return KILN_OK;
}

const ir_shape_fn ir_shape_quant_table[KILN_OP_COUNT] = {
	[KILN_OP_QUANTIZE_LINEAR] = quantize,
	[KILN_OP_DEQUANTIZE_LINEAR] = dequantize,
	[KILN_OP_DYNAMIC_QUANTIZE_LINEAR] = dynamic_quantize,
	[KILN_OP_MATMUL_INTEGER] = matmul_integer,
	[KILN_OP_CONV_INTEGER] = conv_integer,
	[KILN_OP_QLINEAR_MATMUL] = qlinear_matmul,
	[KILN_OP_QLINEAR_CONV] = qlinear_conv,
};
