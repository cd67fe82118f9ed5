/*
 * onnx_msft.c: the com.microsoft ops ONNX Runtime's quantizer writes in its
 * QOperator format, imported as the standard ops they stand for between
 * DequantizeLinear and QuantizeLinear:
 *
 *   QLinearAdd/QLinearMul(a, as, az, b, bs, bz, cs, cz)  Q(Add/Mul(DQ a, DQ b), cs, cz)
 *   QLinearSigmoid, QLinearLeakyRelu(x, xs, xz, ys, yz)  Q(op(DQ x), ys, yz)
 *   QLinearAveragePool, QLinearGlobalAveragePool         the same (NCHW only)
 *   QLinearConcat(ys, yz, x0, x0s, x0z, ...)             Q(Concat(DQ x0, ...), ys, yz)
 *   QGemm(a, as, az, b, bs, bz, c, ys, yz)               [Q](Gemm(DQ a, DQ b, DQ(c,
 *                                                        alpha*as*bs)), ys, yz)
 *
 * ORT computes these in f32 between its own dequantize and requantize, so
 * the graph means what ORT runs; kiln's lowering fuses the elementwise
 * ones into one kernel and qfuse makes QGemm's pattern integer.  An absent
 * zero point is 0 of the 8-bit operand's type (u8 unless the input is i8).
 */
#include <string.h>

#include "frontend/onnx/onnx.h"

/* A Constant 0 of dtype dt; 0 on a problem. */
static uint32_t zero(onnx_imp *c, onnx_nd *d, kiln_dtype dt, const char *suffix)
{
	kiln_tensor *t = ir_tensor_new(c->g, dt, 0, NULL);
	ir_node *z = t ? onnx_extra(c, d, KILN_OP_CONSTANT, 0, NULL, suffix) : NULL;
	if (!z || ir_attr_set_tensor(c->g, z, "value", t) || !onnx_infer(c, d, z)) {
		d->failed = true;
		return 0;
	}
	return z->out[0];
}

/* (De)QuantizeLinear(x, s, z) as an extra node (suffix NULL: d's own
 * result, inferred by the caller), per axis when axis >= 0. */
static ir_node *qdq(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t x, uint32_t s, uint32_t z,
                    int axis, const char *suffix)
{
	if (d->failed || !x || !s)
		return NULL;
	uint32_t in[3] = {x, s, z};
	ir_node *n = onnx_extra(c, d, op, z ? 3 : 2, in, suffix);
	if (!n || (axis >= 0 && ir_attr_set_int(c->g, n, "axis", axis)) ||
	    (suffix && !onnx_infer(c, d, n))) {
		d->failed = true;
		return NULL;
	}
	return n;
}

/* DQ of the 8-bit operand at ONNX inputs i (x), i + 1 (scale), i + 2
 * (zero point, optional); 0 on a problem. */
static uint32_t dq_at(onnx_imp *c, onnx_nd *d, uint32_t i, int axis, const char *suffix)
{
	uint32_t x = onnx_input(c, d, i, true), s = onnx_input(c, d, i + 1, true);
	uint32_t z = onnx_input(c, d, i + 2, false);
	ir_node *n = qdq(c, d, KILN_OP_DEQUANTIZE_LINEAR, x, s, z, axis, suffix);
	return n ? n->out[0] : 0;
}

/* The float op over in[], with d's attributes (less skip), inferred
 * unless last (d's own result: the caller infers it). */
static uint32_t float_op(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t nin, const uint32_t *in,
                         const char *const *skip, bool last)
{
	for (uint32_t i = 0; i < nin; i++)
		if (!in[i])
			return 0;
	ir_node *n = d->failed ? NULL : onnx_extra(c, d, op, nin, in, last ? NULL : "float");
	if (!n || !onnx_copy_attrs_to(c, d, n, op, skip) || (!last && !onnx_infer(c, d, n))) {
		d->failed = true;
		return 0;
	}
	return n->out[0];
}

/* d's result: y quantized by ONNX inputs i (scale) and i + 1 (zero point,
 * optional: 0 of like's dtype). */
static void quantize_to(onnx_imp *c, onnx_nd *d, uint32_t y, uint32_t i, kiln_dtype like)
{
	uint32_t s = onnx_input(c, d, i, true), z = onnx_input(c, d, i + 1, false);
	if (!z && !d->failed && like == KILN_I8)
		z = zero(c, d, KILN_I8, "zero_point");
	if (y && !d->failed)
		d->n = qdq(c, d, KILN_OP_QUANTIZE_LINEAR, y, s, z, -1, NULL);
}

static kiln_dtype dtype_of(onnx_imp *c, onnx_nd *d, uint32_t i)
{
	uint32_t v = onnx_input(c, d, i, false);
	return v ? c->g->val[v]->type.dtype : KILN_U8;
}

static bool nchw(onnx_imp *c, onnx_nd *d)
{
	const Onnx__AttributeProto *a = onnx_attr(d, "channels_last");
	if (a && a->i != 0)
		onnx_problem(c, d, KILN_EUNSUPPORTED, "channels_last=%lld is not supported (NCHW only)",
		             (long long)a->i);
	return !d->failed;
}

static const char *const skip_layout[] = {"channels_last", NULL};

static void binary(onnx_imp *c, onnx_nd *d, kiln_op op)
{
	uint32_t in[2] = {dq_at(c, d, 0, -1, "dq_a"), dq_at(c, d, 3, -1, "dq_b")};
	quantize_to(c, d, float_op(c, d, op, 2, in, NULL, false), 6, dtype_of(c, d, 0));
}

static void unary(onnx_imp *c, onnx_nd *d, kiln_op op)
{
	if (!nchw(c, d))
		return;
	uint32_t x = dq_at(c, d, 0, -1, "dq_x");
	quantize_to(c, d, float_op(c, d, op, 1, &x, skip_layout, false), 3, dtype_of(c, d, 0));
}

static void concat(onnx_imp *c, onnx_nd *d)
{
	uint32_t in[IR_VARIADIC], n = 0;
	if (d->p->n_input < 5 || (d->p->n_input - 2) % 3) {
		onnx_problem(c, d, KILN_EINVAL, "%zu inputs: QLinearConcat takes Y's scale and zero "
		             "point, then (x, scale, zero point) for each input", d->p->n_input);
		return;
	}
	for (uint32_t i = 2; i + 2 < d->p->n_input && n < IR_VARIADIC; i += 3) {
		char sfx[32];
		snprintf(sfx, sizeof sfx, "dq_%u", n);
		in[n++] = dq_at(c, d, i, -1, sfx);
	}
	quantize_to(c, d, float_op(c, d, KILN_OP_CONCAT, n, in, NULL, false), 0, dtype_of(c, d, 2));
}

/* QGemm: C (i32) is the bias in units of alpha * as * bs; without y_scale
 * the result stays f32. */
static void qgemm(onnx_imp *c, onnx_nd *d)
{
	const Onnx__AttributeProto *tb = onnx_attr(d, "transB"), *al = onnx_attr(d, "alpha");
	uint32_t bs = onnx_input(c, d, 4, true);
	int axis = bs && c->g->val[bs]->type.rank == 1 ? (tb && tb->i ? 0 : 1) : -1;
	uint32_t in[3] = {dq_at(c, d, 0, -1, "dq_a"), dq_at(c, d, 3, axis, "dq_b"), 0};
	uint32_t cv = onnx_input(c, d, 6, false), as = onnx_input(c, d, 1, true);
	const kiln_tensor *ta = as ? onnx_const(c, as) : NULL, *tbs = bs ? onnx_const(c, bs) : NULL;
	if (cv && !d->failed && ta && tbs && ta->dtype == KILN_F32 && tbs->dtype == KILN_F32 &&
	    kiln_tensor_numel(ta) == 1) {
		/* known scales (the usual case): the product as a Constant, so
		 * qfuse sees a fixed bias scale */
		kiln_tensor *t = ir_tensor_new(c->g, KILN_F32, tbs->rank, tbs->shape);
		ir_node *k = t ? onnx_extra(c, d, KILN_OP_CONSTANT, 0, NULL, "bias_scale") : NULL;
		for (int64_t i = 0; k && i < kiln_tensor_numel(t); i++)
			((float *)t->data)[i] = ((const float *)ta->data)[0] *
			                        ((const float *)tbs->data)[i] * (al ? al->f : 1.0f);
		if (!k || ir_attr_set_tensor(c->g, k, "value", t) || !onnx_infer(c, d, k))
			return (void)(d->failed = true);
		ir_node *b = qdq(c, d, KILN_OP_DEQUANTIZE_LINEAR, cv, k->out[0], 0,
		                 t->rank == 1 ? 0 : -1, "dq_c");
		if (!(in[2] = b ? b->out[0] : 0))
			return;
	} else if (cv && !d->failed) {
		ir_node *m = onnx_extra(c, d, KILN_OP_MUL, 2, (uint32_t[]){as, bs}, "bias_scale");
		if (!m || !onnx_infer(c, d, m))
			return (void)(d->failed = true);
		uint32_t scale = m->out[0];
		if (al && al->f != 1) {
			kiln_tensor *t = ir_tensor_new(c->g, KILN_F32, 0, NULL);
			ir_node *k = t ? onnx_extra(c, d, KILN_OP_CONSTANT, 0, NULL, "alpha") : NULL;
			if (k)
				((float *)t->data)[0] = al->f;
			if (!k || ir_attr_set_tensor(c->g, k, "value", t) || !onnx_infer(c, d, k))
				return (void)(d->failed = true);
			ir_node *m2 = onnx_extra(c, d, KILN_OP_MUL, 2, (uint32_t[]){scale, k->out[0]},
			                         "bias_scale_alpha");
			if (!m2 || !onnx_infer(c, d, m2))
				return (void)(d->failed = true);
			scale = m2->out[0];
		}
		int ca = c->g->val[scale]->type.rank == 1 ? 0 : -1;
		ir_node *b = qdq(c, d, KILN_OP_DEQUANTIZE_LINEAR, cv, scale, 0, ca, "dq_c");
		in[2] = b ? b->out[0] : 0;
		if (!b)
			return;
	}
	bool q = onnx_input(c, d, 7, false) != 0;
	uint32_t y = float_op(c, d, KILN_OP_GEMM, cv ? 3 : 2, in, NULL, !q);
	if (q)
		quantize_to(c, d, y, 7, dtype_of(c, d, 0));
	else if (y && !d->failed)
		d->n = c->g->val[y]->def; /* the f32 Gemm is d's result */
}

static const struct {
	const char *name;
	kiln_op op;
} unary_ops[] = {
	{"QLinearSigmoid", KILN_OP_SIGMOID},
	{"QLinearLeakyRelu", KILN_OP_LEAKY_RELU},
	{"QLinearAveragePool", KILN_OP_AVERAGE_POOL},
	{"QLinearGlobalAveragePool", KILN_OP_GLOBAL_AVERAGE_POOL},
};

static const char *const others[] = {"QLinearAdd", "QLinearMul", "QLinearConcat", "QGemm"};

bool onnx_msft_op(const char *op_type)
{
	for (size_t i = 0; i < sizeof others / sizeof *others; i++)
		if (!strcmp(op_type, others[i]))
			return true;
	for (size_t i = 0; i < sizeof unary_ops / sizeof *unary_ops; i++)
		if (!strcmp(op_type, unary_ops[i].name))
			return true;
	return false;
}

void onnx_import_msft(onnx_imp *c, onnx_nd *d)
{
	const char *t = d->p->op_type ? d->p->op_type : "";
	if (!strcmp(t, "QLinearAdd") || !strcmp(t, "QLinearMul"))
		return binary(c, d, t[7] == 'A' ? KILN_OP_ADD : KILN_OP_MUL);
	if (!strcmp(t, "QLinearConcat"))
		return concat(c, d);
	if (!strcmp(t, "QGemm"))
		return qgemm(c, d);
	for (size_t i = 0; i < sizeof unary_ops / sizeof *unary_ops; i++)
		if (!strcmp(t, unary_ops[i].name))
			return unary(c, d, unary_ops[i].op);
	onnx_problem(c, d, KILN_EUNSUPPORTED, "op is not supported in domain com.microsoft (kiln "
	             "imports QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, "
	             "QLinearAveragePool, QLinearGlobalAveragePool, QLinearConcat and QGemm "
	             "from it)");
}
