/*
 * interp_quant.c: the reference interpreter's quantization kernels:
 * QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
 * ConvInteger, QLinearMatMul and QLinearConv.
 *
 * The arithmetic follows ONNX's reference to the bit where it can: f32
 * division and half-to-even rounding (x / scale, then rint, then + zero
 * point, then saturation), and the integer products summed exactly.  The
 * sums reuse the float kernels of MatMul and Conv on operands with their
 * zero points already subtracted (i32 for MatMul; f64 for Conv, exact for
 * any sum below 2^53), so the geometry lives in one place.  Scales that
 * arrive at run time are checked here: not positive or not finite is an
 * error naming the element.  The kernels are registered in ir_interp_table
 * through ir/interp.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/interp.h"

/* A scale and zero point, each one value or a vector. */
typedef struct qp {
	const kiln_tensor *s, *z; /* z may be NULL: 0 */
	int64_t len;
} qp;

static kiln_status qp_read(ir_interp *c, const ir_node *n, const kiln_tensor *s,
                           const kiln_tensor *z, int64_t want, const char *what, qp *q)
{
	q->s = s, q->z = z, q->len = kiln_tensor_numel(s);
	if (s->dtype != KILN_F32 || (q->len != 1 && q->len != want) ||
	    (z && kiln_tensor_numel(z) != q->len)) {
		char a[96];
		return ir_fail(c, n, KILN_ESHAPE, "%s_scale %s does not fit (%lld values wanted)",
		               what, ir_tstr(s, a, sizeof a), (long long)want);
	}
	for (int64_t i = 0; i < q->len; i++) {
		float v = ((const float *)s->data)[i];
		if (!(v > 0) || !isfinite(v))
			return ir_fail(c, n, KILN_EINVAL, "%s_scale[%lld] is %g: a scale must be "
			               "positive and finite", what, (long long)i, (double)v);
	}
	return KILN_OK;
}

static float qp_scale(const qp *q, int64_t i)
{
	return ((const float *)q->s->data)[q->len == 1 ? 0 : i];
}

static int64_t qp_zero(const qp *q, int64_t i)
{
	return q->z ? ir_load_i64(q->z, q->len == 1 ? 0 : i) : 0;
}

/* Which slice along axis element i of x lies in, given the elements per
 * slice step (inner) and the axis length; 0 for per-tensor. */
typedef struct along {
	int64_t inner, len;
} along;

static along along_axis(const ir_node *n, const kiln_tensor *x, int64_t qlen)
{
	if (qlen == 1 || x->rank == 0)
		return (along){1, 1};
	int axis = (int)ir_naxis(ir_attr_int(n, "axis", 1), x->rank);
	return (along){ir_prod(x->shape, axis + 1, x->rank), x->shape[axis]};
}

static int64_t at(along a, int64_t i)
{
	return a.len == 1 ? 0 : i / a.inner % a.len;
}

static int64_t axis_len(const ir_node *n, const kiln_tensor *x)
{
	if (x->rank == 0)
		return 1;
	int64_t axis = ir_naxis(ir_attr_int(n, "axis", 1), x->rank);
	return axis >= 0 && axis < x->rank ? x->shape[axis] : -1;
}

/* rint(x / scale) + zero_point, in f32 (f64 for i32 x); ir_store into
 * the u8 or i8 result saturates it (NaN gives 0). */
static double quant1(double x, bool f32, float s, int64_t z)
{
	return (f32 ? (double)nearbyintf((float)x / s) : nearbyint(x / s)) + (double)z;
}

static kiln_status quantize(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                            kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	qp q;
	kiln_status rc = qp_read(c, n, in[1], n->nin > 2 ? in[2] : NULL, axis_len(n, x), "y", &q);
	if (rc)
		return rc;
	along a = along_axis(n, x, q.len);
	bool f32 = x->dtype == KILN_F32;
	for (int64_t i = 0, cnt = kiln_tensor_numel(x); i < cnt; i++) {
		int64_t k = at(a, i);
		ir_store(out[0], i, quant1(ir_load(x, i), f32, qp_scale(&q, k), qp_zero(&q, k)));
	}
	return KILN_OK;
}

/* (x - zero_point) * scale in f32, as ONNX's reference. */
static kiln_status dequantize(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                              kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	qp q;
	kiln_status rc = qp_read(c, n, in[1], n->nin > 2 ? in[2] : NULL, axis_len(n, x), "x", &q);
	if (rc)
		return rc;
	along a = along_axis(n, x, q.len);
	for (int64_t i = 0, cnt = kiln_tensor_numel(x); i < cnt; i++) {
		int64_t k = at(a, i);
		float d = (float)ir_load_i64(x, i) - (float)qp_zero(&q, k);
		ir_store(out[0], i, (double)(d * qp_scale(&q, k)));
	}
	return KILN_OK;
}

/* u8 over [min(x, 0), max(x, 0)]: scale = range / 255 (1/255 for an
 * all-zero x), zero point = saturate(rint(-min / scale)).  NaNs take no
 * part in the range and quantize to 0; an infinite range gives an
 * infinite scale and zero point 0, as the compiled kernel does. */
static kiln_status dynamic_quantize(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                    kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	float lo = 0, hi = 0;
	int64_t cnt = kiln_tensor_numel(x);
	for (int64_t i = 0; i < cnt; i++) {
		float v = (float)ir_load(x, i);
		lo = v < lo ? v : lo, hi = v > hi ? v : hi;
	}
	float s = (hi == lo ? 1.0f : hi - lo) / 255.0f;
	float zf = 0.0f - lo / s;
	int64_t z = !(zf > 0) ? 0 : zf > 255 ? 255 : (int64_t)nearbyintf(zf);
	for (int64_t i = 0; i < cnt; i++)
		ir_store(out[0], i, quant1(ir_load(x, i), true, s, z));
	ir_store(out[1], 0, s);
	if (n->nout > 2 && out[2])
		ir_store_i64(out[2], 0, z);
	return KILN_OK;
}

/* ---- integer sums ------------------------------------------------------------ */

/* A copy of t as dt with zero point z subtracted: z one value, or (per
 * slice) one per index i / inner % len. */
static kiln_tensor *minus_zero(const kiln_tensor *t, const kiln_tensor *z, int64_t inner,
                               kiln_dtype dt)
{
	kiln_tensor *r = kiln_tensor_new(dt, t->rank, t->shape);
	int64_t len = z ? kiln_tensor_numel(z) : 1;
	for (int64_t i = 0, cnt = r ? kiln_tensor_numel(t) : 0; i < cnt; i++) {
		int64_t zv = z ? ir_load_i64(z, len == 1 ? 0 : i / inner % len) : 0;
		ir_store_i64(r, i, ir_load_i64(t, i) - zv);
	}
	return r;
}

/* y (i32, or f64 for requantization) = sum (a - a_zp)(b - b_zp) over
 * MatMul's shapes: a_zp per row of a 2-D a, b_zp per column of a 2-D b. */
static kiln_status mm_sum(ir_interp *c, const ir_node *n, const kiln_tensor *a,
                          const kiln_tensor *az, const kiln_tensor *b, const kiln_tensor *bz,
                          kiln_tensor *y)
{
	kiln_tensor *ta = minus_zero(a, az, a->rank == 2 ? a->shape[1] : 1, KILN_I32);
	kiln_tensor *tb = minus_zero(b, bz, 1, KILN_I32);
	kiln_status rc = ta && tb ? KILN_OK : ir_fail(c, n, KILN_ENOMEM, "out of memory");
	if (!rc) {
		kiln_tensor *mm_in[2] = {ta, tb};
		ir_node mm = *n;
		mm.nin = 2;
		rc = ir_interp_table[KILN_OP_MATMUL](c, &mm, mm_in, &y);
	}
	kiln_tensor_free(ta);
	kiln_tensor_free(tb);
	return rc;
}

/* y = conv(x - x_zp, w - w_zp) + bias, exactly (in f64), w_zp per output
 * channel or one value. */
static kiln_status conv_sum(ir_interp *c, const ir_node *n, const kiln_tensor *x,
                            const kiln_tensor *xz, const kiln_tensor *w, const kiln_tensor *wz,
                            const kiln_tensor *bias, kiln_tensor *y)
{
	if (x->rank < 3 || w->rank != x->rank) {
		char a[96], b[96];
		return ir_fail(c, n, KILN_ESHAPE, "weights %s do not fit input %s",
		               ir_tstr(w, a, sizeof a), ir_tstr(x, b, sizeof b));
	}
	kiln_tensor *tx = minus_zero(x, xz, 1, KILN_F64);
	kiln_tensor *tw = minus_zero(w, wz, ir_prod(w->shape, 1, w->rank), KILN_F64);
	kiln_tensor *tb = bias ? kiln_tensor_new(KILN_F64, bias->rank, bias->shape) : NULL;
	kiln_status rc = tx && tw && (!bias || tb) ? KILN_OK
	                                           : ir_fail(c, n, KILN_ENOMEM, "out of memory");
	for (int64_t i = 0; !rc && tb && i < kiln_tensor_numel(tb); i++)
		ir_store(tb, i, (double)ir_load_i64(bias, i));
	if (!rc) {
		kiln_tensor *cv_in[3] = {tx, tw, tb};
		ir_node cv = *n;
		cv.nin = tb ? 3 : 2;
		rc = ir_interp_conv(c, &cv, cv_in, &y);
	}
	kiln_tensor_free(tx);
	kiln_tensor_free(tw);
	kiln_tensor_free(tb);
	return rc;
}

static kiln_status matmul_integer(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                  kiln_tensor *const *out)
{
	return mm_sum(c, n, in[0], n->nin > 2 ? in[2] : NULL, in[1], n->nin > 3 ? in[3] : NULL,
	              out[0]);
}

static kiln_status conv_integer(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                kiln_tensor *const *out)
{
	return conv_sum(c, n, in[0], n->nin > 2 ? in[2] : NULL, in[1], n->nin > 3 ? in[3] : NULL,
	                NULL, out[0]);
}

/* y = saturate(rint(sum * (x_scale * w_scale / y_scale)) + y_zp), the
 * multiplier in f32 and the product in f64 (ONNX's reference promotes the
 * i32 sums); the multiplier's w_scale per row of the result (rows: the
 * output channels of a conv, A's rows of a matmul) or per column. */
static kiln_status requantize(ir_interp *c, const ir_node *n, const kiln_tensor *acc,
                              const qp *xq, const qp *wq, const qp *yq, int64_t xinner,
                              int64_t winner, kiln_tensor *y)
{
	float ys = qp_scale(yq, 0);
	int64_t yz = qp_zero(yq, 0);
	for (int64_t i = 0, cnt = kiln_tensor_numel(y); i < cnt; i++) {
		float xs = qp_scale(xq, xq->len == 1 ? 0 : i / xinner % xq->len);
		float ws = qp_scale(wq, wq->len == 1 ? 0 : i / winner % wq->len);
		float mult = xs * ws / ys;
		ir_store(y, i, nearbyint(ir_load(acc, i) * (double)mult) + (double)yz);
	}
	return KILN_OK;
}

static kiln_status qlinear_matmul(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                  kiln_tensor *const *out)
{
	const kiln_tensor *a = in[0], *b = in[3];
	kiln_tensor *y = out[0];
	int64_t M = a->rank == 2 ? a->shape[0] : 1, N = b->rank == 2 ? b->shape[1] : 1;
	qp aq, bq, yq;
	kiln_status rc = qp_read(c, n, in[1], in[2], M, "a", &aq);
	if (!rc)
		rc = qp_read(c, n, in[4], in[5], N, "b", &bq);
	if (!rc)
		rc = qp_read(c, n, in[6], in[7], 1, "y", &yq);
	kiln_tensor *acc = rc ? NULL : kiln_tensor_new(KILN_I32, y->rank, y->shape);
	if (!rc && !acc)
		rc = ir_fail(c, n, KILN_ENOMEM, "out of memory");
	if (!rc)
		rc = mm_sum(c, n, a, in[2], b, in[5], acc);
	/* per row of a: the result's rows, N apart; per column of b: stride 1 */
	if (!rc)
		rc = requantize(c, n, acc, &aq, &bq, &yq, y->rank ? y->shape[y->rank - 1] : 1, 1, y);
	kiln_tensor_free(acc);
	return rc;
}

static kiln_status qlinear_conv(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                kiln_tensor *const *out)
{
	kiln_tensor *y = out[0];
	int64_t M = y->rank > 1 ? y->shape[1] : 1, plane = ir_prod(y->shape, 2, y->rank);
	qp xq, wq, yq;
	kiln_status rc = qp_read(c, n, in[1], in[2], 1, "x", &xq);
	if (!rc)
		rc = qp_read(c, n, in[4], in[5], M, "w", &wq);
	if (!rc)
		rc = qp_read(c, n, in[6], in[7], 1, "y", &yq);
	kiln_tensor *acc = rc ? NULL : kiln_tensor_new(KILN_F64, y->rank, y->shape);
	if (!rc && !acc)
		rc = ir_fail(c, n, KILN_ENOMEM, "out of memory");
	if (!rc)
		rc = conv_sum(c, n, in[0], in[2], in[3], in[5], n->nin > 8 ? in[8] : NULL, acc);
	if (!rc)
		rc = requantize(c, n, acc, &xq, &wq, &yq, 1, plane, y);
	kiln_tensor_free(acc);
	return rc;
}

const ir_interp_fn ir_interp_quant_table[KILN_OP_COUNT] = {
	[KILN_OP_QUANTIZE_LINEAR] = quantize,
	[KILN_OP_DEQUANTIZE_LINEAR] = dequantize,
	[KILN_OP_DYNAMIC_QUANTIZE_LINEAR] = dynamic_quantize,
	[KILN_OP_MATMUL_INTEGER] = matmul_integer,
	[KILN_OP_CONV_INTEGER] = conv_integer,
	[KILN_OP_QLINEAR_MATMUL] = qlinear_matmul,
	[KILN_OP_QLINEAR_CONV] = qlinear_conv,
};
