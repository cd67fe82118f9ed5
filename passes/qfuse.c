/*
 * qfuse.c: the `qfuse` pass, a QDQ model's float ops around their
 * DequantizeLinear and QuantizeLinear nodes turned into integer ops.
 *
 * A QDQ model (what ONNX Runtime's quantize_static writes, and PyTorch's
 * quantized exports) spells an int8 conv as f32 arithmetic between
 * quantization nodes:
 *     xq -> DQ -> Conv(., DQ(wq), DQ(bq)) -> Q -> yq
 * which means: the integer sums of (xq - xz)(wq - wz), plus a bias, scaled
 * by xs*ws/ys, rounded, plus yz: QLinearConv.  This pass rewrites
 *   DQ(x) -> Conv(DQ(w) fixed [, bias fixed]) -> Q       into QLinearConv
 *   DQ(x) -> MatMul/Gemm(DQ(w) fixed [, bias]) -> Q      into QLinearMatMul
 *                                                          (no bias), else
 *   DQ(x) -> MatMul/Gemm/Conv(DQ(w) fixed [, bias]) (f32 result, no Q after:
 *            a classifier's last layer)   into MatMulInteger/ConvInteger,
 *            a Cast to f32, a Mul by xs*ws and an Add of the bias
 *   DQ(x) -> MaxPool -> Q with the same scale and zero point   into MaxPool
 *            on the 8-bit tensor (the max commutes with a monotone map)
 * and where a Relu or Clip stands between the op and its Q, it goes too
 * when the Q's saturation already clips at its bounds (a u8 Q with zero
 * point 0 after a Relu: what kiln quantize and ORT's quantizer write).
 * so the codegen's 8-bit GEMM (codegen/llvm_qgemm.c) runs the sums and the
 * requantization is its epilogue.  The tensors between two such ops stay
 * 8-bit: the Q -> DQ pairs between them fall away, as DQ and Q of other
 * consumers (a residual Add, a pooling) remain and fuse with their
 * elementwise neighbours in the lowering.  What does not match stays as
 * written, in f32, so the pass never changes what a graph computes beyond
 * rounding: QLinearConv requantizes in f32 as ORT does, where the QDQ graph
 * rounds the f32 conv result (the difference is the requantization point's
 * rounding, a step at most).
 *
 * Conditions: x's scale and zero point one value each (what ONNX's integer
 * ops take), w's fixed, per tensor or per output channel (axis 0 of a conv
 * weight, the output column of a matmul weight); scales fixed (Constants
 * or parameters), so a bias in f32 (or dequantized from any scale) can be
 * re-expressed in units of xs*ws[c] as an i32 (equal to ORT's bq when its
 * bias scale is xs*ws, as its quantizer writes it).  Parameters count as
 * fixed, as in bnfold: the pass is for compiling inference graphs, and
 * leaves a graph marked for training alone.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"



/* The live node of op that defines v, or NULL. */
static ir_node *def_of(const kiln_graph *g, uint32_t v, kiln_op op)
{
	const ir_value *x = g->val[v];
	return x->kind == IR_V_NODE && x->def && !x->def->dead && x->def->op == op ? x->def : NULL;
}

/* v's one reader when v has exactly one and is no graph output. */
static ir_node *only_use(const kiln_graph *g, uint32_t v)
{
	const ir_value *x = g->val[v];
	return x->nuse == 1 && !pass_is_output(g, v) && !x->uses[0]->dead ? x->uses[0] : NULL;
}

static bool is8(kiln_dtype dt)
{
	return dt == KILN_U8 || dt == KILN_I8;
}

/* A DequantizeLinear's or QuantizeLinear's operands: the quantized side q,
 * the scale and zero point values (zp 0: none), the scale's data when it
 * is fixed, its length, its axis (normalised). */
typedef struct qp {
	uint32_t q, scale, zp;
	const kiln_tensor *s;
	int64_t ns;
	int axis;
} qp;

static bool params(const kiln_graph *g, const ir_node *n, uint32_t q, qp *p)
{
	p->q = q;
	p->scale = n->in[1];
	p->zp = n->nin > 2 ? n->in[2] : 0;
	p->s = pass_fixed(g, p->scale);
	int rank = g->val[n->in[0]]->type.rank;
	int64_t axis = ir_attr_int(n, "axis", 1);
	p->axis = (int)(axis < 0 ? axis + rank : axis);
	const ir_type *st = &g->val[p->scale]->type;
	p->ns = st->rank == 0 ? 1 : st->dim[0];
	return p->s && p->s->dtype == KILN_F32 && p->ns >= 1;
}

/* x as the DQ of an 8-bit tensor with one scale and zero point. */
static bool dq_tensor(const kiln_graph *g, uint32_t x, qp *p)
{
	ir_node *d = def_of(g, x, KILN_OP_DEQUANTIZE_LINEAR);
	return d && params(g, d, d->in[0], p) && p->ns == 1 && is8(g->val[d->in[0]]->type.dtype);
}

/* x as dq_tensor, or a Flatten or Reshape of such a DQ: the view then
 * moves before the DQ (a per-tensor dequantization commutes with it) and
 * p->q is the view of the 8-bit tensor. */
static bool dq_view(kiln_graph *g, uint32_t x, kiln_loc loc, qp *p)
{
	if (dq_tensor(g, x, p))
		return true;
	const ir_value *v = g->val[x];
	ir_node *f = v->kind == IR_V_NODE && v->def && !v->def->dead &&
	             (v->def->op == KILN_OP_FLATTEN || v->def->op == KILN_OP_RESHAPE) ? v->def : NULL;
	if (!f || f->nout != 1 || !dq_tensor(g, f->in[0], p))
		return false;
	uint32_t in[4] = {p->q};
	for (uint32_t i = 1; i < f->nin && i < 4; i++)
		in[i] = f->in[i];
	ir_node *n = ir_node_new(g, f->op, f->nin, in, 1, loc);
	if (!n)
		return false;
	pass_copy_attrs(g, n, f); /* Flatten's axis; Reshape's shape and allowzero */
	if (ir_infer_node(g, n) != KILN_OK)
		return false;
	p->q = n->out[0];
	return true;
}

/* w as the DQ of a fixed 8-bit weight, per tensor or per axis `axis`. */
static bool dq_weight(const kiln_graph *g, uint32_t w, int axis, qp *p)
{
	ir_node *d = def_of(g, w, KILN_OP_DEQUANTIZE_LINEAR);
	if (!d || !params(g, d, d->in[0], p) || !pass_fixed(g, d->in[0]) ||
	    !is8(g->val[d->in[0]]->type.dtype))
		return false;
	const ir_type *t = &g->val[d->in[0]]->type;
	return p->ns == 1 || (p->axis == axis && axis < t->rank && p->ns == t->dim[axis]);
}

/* The bias in f32 when it is fixed: an f32 tensor, or the DQ of a fixed
 * integer one; n values (1 broadcasts). NULL when absent or not fixed. */
static double *bias_values(const kiln_graph *g, uint32_t b, int64_t n, bool *ok)
{
	*ok = true;
	if (!b)
		return NULL;
	*ok = false;
	double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
	if (!v)
		return NULL;
	const kiln_tensor *t = pass_fixed(g, b), *s = NULL, *z = NULL;
	ir_node *d = t ? NULL : def_of(g, b, KILN_OP_DEQUANTIZE_LINEAR);
	if (d) {
		t = pass_fixed(g, d->in[0]), s = pass_fixed(g, d->in[1]);
		z = d->nin > 2 ? pass_fixed(g, d->in[2]) : NULL;
		if (!s || (d->nin > 2 && !z))
			t = NULL;
	} else if (t && !kiln_dtype_is_float(t->dtype)) {
		t = NULL;
	}
	int64_t nt = t ? kiln_tensor_numel(t) : 0;
	if (!t || (nt != 1 && nt != n) || (s && kiln_tensor_numel(s) != 1 && kiln_tensor_numel(s) != n) ||
	    (z && kiln_tensor_numel(z) != 1 && kiln_tensor_numel(z) != n)) {
		free(v);
		return NULL;
	}
	for (int64_t i = 0; i < n; i++) {
		double x = ir_load(t, nt == 1 ? 0 : i);
		if (s) {
			int64_t ks = kiln_tensor_numel(s) == 1 ? 0 : i;
			double zp = z ? ir_load(z, kiln_tensor_numel(z) == 1 ? 0 : i) : 0;
			x = (x - zp) * ir_load(s, ks);
		}
		v[i] = x;
	}
	*ok = true;
	return v;
}


/* A scalar Constant of dtype dt holding v. */
static uint32_t scalar(kiln_graph *g, kiln_loc loc, kiln_dtype dt, double v)
{
	kiln_tensor *t = kiln_tensor_new(dt, 0, NULL);
	if (!t)
		return 0;
	ir_store(t, 0, v);
	uint32_t c = pass_constant(g, loc, t);
	kiln_tensor_free(t);
	return c;
}

/* p's zero point, or a Constant 0 of q's dtype when it has none. */
static uint32_t zero_point(kiln_graph *g, kiln_loc loc, const qp *p)
{
	return p->zp ? p->zp : scalar(g, loc, g->val[p->q]->type.dtype, 0);
}

/* b[c] / (xs * ws[c]) rounded, as an i32 Constant of n values; 0 when a
 * value does not fit (the op then stays in f32). */
static uint32_t int_bias(kiln_graph *g, kiln_loc loc, const double *b, const qp *x, const qp *w,
                         int64_t n)
{
	kiln_tensor *t = kiln_tensor_new(KILN_I32, 1, &n);
	if (!t)
		return 0;
	float xs = (float)ir_load(x->s, 0);
	bool fits = true;
	for (int64_t i = 0; i < n; i++) {
		float unit = xs * (float)ir_load(w->s, w->ns == 1 ? 0 : i); /* as ORT: in f32 */
		double q = nearbyint(b[i] / unit);
		fits = fits && isfinite(q) && fabs(q) < 2147483647.0;
		ir_store(t, i, fits ? q : 0);
	}
	uint32_t c = fits ? pass_constant(g, loc, t) : 0;
	kiln_tensor_free(t);
	return c;
}


/* A new node op(in) with one inferred output; NULL on error. */
static ir_node *node(kiln_graph *g, kiln_op op, uint32_t nin, const uint32_t *in, kiln_loc loc,
                     const char *name)
{
	ir_node *n = ir_node_new(g, op, nin, in, 1, loc);
	if (n)
		n->name = name;
	return n;
}

/* new takes over old's uses and name (old's node is then dead code). */
static kiln_status take_over(kiln_graph *g, const ir_node *at, uint32_t old, uint32_t nv)
{
	ir_value *o = g->val[old], *v = g->val[nv];
	if (!ir_type_eq(&o->type, &v->type))
		return ir_errorf(g, at, KILN_EVERIFY, "qfuse: the integer op's result type differs");
	v->name = o->name;
	o->name = NULL;
	ir_replace_uses(g, old, nv);
	for (uint32_t i = 0; i < g->noutput; i++)
		if (g->output[i] == old)
			g->output[i] = nv;
	return g->status;
}

/* Whether the Relu or Clip r changes nothing that the QuantizeLinear p
 * after it keeps: Q is monotone and saturates, so Q(clip(y, lo, hi)) =
 * Q(y) when Q(lo) is the lowest 8-bit value and Q(hi) the highest. */
static bool clip_saturates(const kiln_graph *g, const ir_node *r, const qp *p)
{
	const kiln_tensor *zt = p->zp ? pass_fixed(g, p->zp) : NULL;
	if (!p->s || (p->zp && !zt))
		return false;
	bool u8 = g->val[p->q]->type.dtype == KILN_U8;
	double qmin = u8 ? 0 : -128, qmax = u8 ? 255 : 127, zp = zt ? ir_load(zt, 0) : 0;
	float s = (float)ir_load(p->s, 0);
	double lo = r->op == KILN_OP_RELU ? 0 : ir_attr_float(r, "min", -INFINITY);
	double hi = r->op == KILN_OP_RELU ? INFINITY : ir_attr_float(r, "max", INFINITY);
	return (lo == -INFINITY || nearbyintf((float)lo / s) + zp <= qmin) &&
	       (hi == INFINITY || nearbyintf((float)hi / s) + zp >= qmax);
}

/* The QuantizeLinear that quantizes y (its one reader, or the one reader
 * of a Relu or Clip reading y that the Q's saturation makes redundant)
 * with one scale and zero point, into 8 bits; NULL otherwise. */
static ir_node *q_after(const kiln_graph *g, uint32_t y, qp *p)
{
	ir_node *q = only_use(g, y), *r = NULL;
	if (q && (q->op == KILN_OP_RELU || q->op == KILN_OP_CLIP) && q->in[0] == y) {
		r = q;
		y = r->out[0];
		q = only_use(g, y);
	}
	if (!q || q->op != KILN_OP_QUANTIZE_LINEAR || q->in[0] != y)
		return NULL;
	const ir_type *st = &g->val[q->in[1]]->type;
	p->q = q->out[0];
	p->scale = q->in[1];
	p->zp = q->nin > 2 ? q->in[2] : 0;
	p->s = pass_fixed(g, p->scale);
	p->ns = st->rank == 0 ? 1 : st->dim[0];
	if (p->ns != 1 || !is8(g->val[q->out[0]]->type.dtype))
		return NULL;
	return !r || clip_saturates(g, r, p) ? q : NULL;
}

/* f32 result of an integer product: Cast(i32 -> f32) * (xs*ws) + b, the
 * scale per output channel along axis `axis` of a rank-`rank` result
 * (shape [n, 1, ...] from axis on), as Constants. */
static kiln_status float_epilogue(kiln_graph *g, const ir_node *at, uint32_t acc, const qp *x,
                                  const qp *w, const double *b, int64_t n, int axis, int rank,
                                  uint32_t old)
{
	int64_t shape[KILN_MAX_RANK];
	int r = rank - axis;
	for (int d = 0; d < r; d++)
		shape[d] = d == 0 ? n : 1;
	kiln_tensor *s = kiln_tensor_new(KILN_F32, r, shape), *bt = b ? kiln_tensor_new(KILN_F32, r, shape) : NULL;
	if (!s || (b && !bt)) {
		kiln_tensor_free(s), kiln_tensor_free(bt);
		return ir_errorf(g, at, KILN_ENOMEM, "qfuse: out of memory");
	}
	float xs = (float)ir_load(x->s, 0);
	for (int64_t i = 0; i < n; i++) {
		ir_store(s, i, xs * (float)ir_load(w->s, w->ns == 1 ? 0 : i));
		if (bt)
			ir_store(bt, i, b[i]);
	}
	uint32_t sc = pass_constant(g, at->loc, s), bc = bt ? pass_constant(g, at->loc, bt) : 0;
	kiln_tensor_free(s), kiln_tensor_free(bt);
	ir_node *c = sc && (!b || bc) ? node(g, KILN_OP_CAST, 1, &acc, at->loc, NULL) : NULL;
	if (!c)
		return g->status ? g->status : ir_errorf(g, at, KILN_ENOMEM, "qfuse: out of memory");
	ir_attr_set_dtype(g, c, "to", KILN_F32);
	if (ir_infer_node(g, c) != KILN_OK)
		return g->status;
	ir_node *m = node(g, KILN_OP_MUL, 2, (uint32_t[]){c->out[0], sc}, at->loc, NULL);
	if (!m || ir_infer_node(g, m) != KILN_OK)
		return g->status;
	uint32_t y = m->out[0];
	if (b) {
		ir_node *a = node(g, KILN_OP_ADD, 2, (uint32_t[]){y, bc}, at->loc, NULL);
		if (!a || ir_infer_node(g, a) != KILN_OK)
			return g->status;
		y = a->out[0];
	}
	return take_over(g, at, old, y);
}

/* ---- the rewrites ---------------------------------------------------------------- */

static kiln_status conv(kiln_graph *g, ir_node *n, bool *changed)
{
	qp x, w, y;
	const ir_type *wt = &g->val[n->in[1]]->type;
	if (!dq_tensor(g, n->in[0], &x) || !dq_weight(g, n->in[1], 0, &w) || wt->rank < 3)
		return KILN_OK;
	int64_t M = wt->dim[0];
	bool ok;
	double *b = bias_values(g, n->nin > 2 ? n->in[2] : 0, M, &ok);
	if (!ok)
		return KILN_OK;
	ir_node *q = q_after(g, n->out[0], &y);
	uint32_t wq = g->val[n->in[1]]->def->in[0], xz = zero_point(g, n->loc, &x);
	uint32_t wz = zero_point(g, n->loc, &w), bq = b ? int_bias(g, n->loc, b, &x, &w, M) : 0;
	kiln_status st = g->status;
	if (!xz || !wz || (b && !bq)) {
		free(b);
		return g->status;
	}
	if (q && y.s) { /* QLinearConv(x, xs, xz, w, ws, wz, ys, yz[, b]) */
		uint32_t yz = zero_point(g, n->loc, &y);
		uint32_t in[9] = {x.q, x.scale, xz, wq, w.scale, wz, y.scale, yz, bq};
		ir_node *c = yz ? node(g, KILN_OP_QLINEAR_CONV, b ? 9 : 8, in, n->loc, n->name) : NULL;
		if (c) {
			pass_copy_attrs(g, c, n);
			if (ir_infer_node(g, c) == KILN_OK)
				st = take_over(g, n, q->out[0], c->out[0]);
			n->name = NULL; /* the name is the new op's now */
		}
	} else { /* ConvInteger, then the scale and bias in f32 */
		ir_node *c = node(g, KILN_OP_CONV_INTEGER, 4, (uint32_t[]){x.q, wq, xz, wz}, n->loc, NULL);
		if (c) {
			pass_copy_attrs(g, c, n);
			if (ir_infer_node(g, c) == KILN_OK)
				st = float_epilogue(g, n, c->out[0], &x, &w, b, M, 1,
				                    g->val[n->out[0]]->type.rank, n->out[0]);
		}
	}
	free(b);
	*changed = *changed || st == KILN_OK;
	return g->status ? g->status : st;
}

/* MatMul(x, w) with w [K, N], or Gemm(x, w[, c]) (alpha 1, transA 0, beta
 * 1 or no C; transB: w [N, K], transposed here). */
static kiln_status matmul(kiln_graph *g, ir_node *n, bool *changed)
{
	bool gemm = n->op == KILN_OP_GEMM, tb = gemm && ir_attr_int(n, "transB", 0);
	if (gemm && (ir_attr_int(n, "transA", 0) || ir_attr_float(n, "alpha", 1) != 1 ||
	             (n->nin > 2 && ir_attr_float(n, "beta", 1) != 1)))
		return KILN_OK;
	qp x, w, y;
	const ir_type *wt = &g->val[n->in[1]]->type, *xt = &g->val[n->in[0]]->type;
	if (wt->rank != 2 || xt->rank < 2 || !dq_weight(g, n->in[1], tb ? 0 : 1, &w) ||
	    !dq_view(g, n->in[0], n->loc, &x))
		return KILN_OK;
	int64_t N = wt->dim[tb ? 0 : 1], K = wt->dim[tb ? 1 : 0];
	bool ok;
	double *b = bias_values(g, gemm && n->nin > 2 ? n->in[2] : 0, N, &ok);
	if (!ok)
		return KILN_OK;
	if (b && gemm && g->val[n->in[2]]->type.rank == 2 && g->val[n->in[2]]->type.dim[0] != 1) {
		free(b); /* a C with rows of its own is no bias */
		return KILN_OK;
	}
	uint32_t wq = g->val[n->in[1]]->def->in[0];
	if (tb) { /* the weight as [K, N] */
		const kiln_tensor *src = pass_fixed(g, wq);
		kiln_tensor *t = kiln_tensor_new(src->dtype, 2, (int64_t[]){K, N});
		if (!t) {
			free(b);
			return ir_errorf(g, n, KILN_ENOMEM, "qfuse: out of memory");
		}
		for (int64_t r = 0; r < N; r++)
			for (int64_t c = 0; c < K; c++)
				ir_store(t, c * N + r, ir_load(src, r * K + c));
		wq = pass_constant(g, n->loc, t);
		kiln_tensor_free(t);
	}
	ir_node *q = b ? NULL : q_after(g, n->out[0], &y);
	uint32_t xz = zero_point(g, n->loc, &x), wz = zero_point(g, n->loc, &w);
	kiln_status st = g->status;
	if (!wq || !xz || !wz) {
		free(b);
		return g->status;
	}
	if (q && y.s) { /* QLinearMatMul(a, as, az, b, bs, bz, ys, yz) */
		uint32_t yz = zero_point(g, n->loc, &y);
		uint32_t in[8] = {x.q, x.scale, xz, wq, w.scale, wz, y.scale, yz};
		ir_node *c = yz ? node(g, KILN_OP_QLINEAR_MATMUL, 8, in, n->loc, n->name) : NULL;
		if (c && ir_infer_node(g, c) == KILN_OK)
			st = take_over(g, n, q->out[0], c->out[0]);
		n->name = NULL;
	} else {
		ir_node *c = node(g, KILN_OP_MATMUL_INTEGER, 4, (uint32_t[]){x.q, wq, xz, wz}, n->loc, NULL);
		int rank = g->val[n->out[0]]->type.rank;
		if (c && ir_infer_node(g, c) == KILN_OK)
			st = float_epilogue(g, n, c->out[0], &x, &w, b, N, rank - 1, rank, n->out[0]);
	}
	free(b);
	*changed = *changed || st == KILN_OK;
	return g->status ? g->status : st;
}

/* DQ(x) -> MaxPool -> Q with the same scale and zero point: MaxPool of x. */
static kiln_status max_pool(kiln_graph *g, ir_node *n, bool *changed)
{
	qp x, y;
	ir_node *q = n->nout == 1 ? q_after(g, n->out[0], &y) : NULL;
	if (!q || !dq_tensor(g, n->in[0], &x) || !y.s ||
	    ir_load(x.s, 0) != ir_load(y.s, 0) || g->val[x.q]->type.dtype != g->val[y.q]->type.dtype)
		return KILN_OK;
	const kiln_tensor *xz = x.zp ? pass_fixed(g, x.zp) : NULL, *yz = y.zp ? pass_fixed(g, y.zp) : NULL;
	double zx = xz ? ir_load(xz, 0) : 0, zy = yz ? ir_load(yz, 0) : 0;
	if ((x.zp && !xz) || (y.zp && !yz) || zx != zy)
		return KILN_OK;
	ir_node *p = node(g, KILN_OP_MAX_POOL, 1, &x.q, n->loc, n->name);
	if (!p)
		return g->status;
	pass_copy_attrs(g, p, n);
	if (ir_infer_node(g, p) != KILN_OK)
		return g->status;
	kiln_status st = take_over(g, n, q->out[0], p->out[0]);
	n->name = NULL;
	*changed = *changed || st == KILN_OK;
	return st;
}

kiln_status pass_qfuse(kiln_graph *g, const pass_opts *o)
{
	(void)o;
	if (g->training)
		return KILN_OK;
	uint32_t count = g->nnode;
	bool changed = false;
	for (uint32_t i = 0; i < count && g->status == KILN_OK; i++) {
		ir_node *n = g->node[i];
		if (n->dead)
			continue;
		if (n->op == KILN_OP_CONV)
			conv(g, n, &changed);
		else if (n->op == KILN_OP_MATMUL || n->op == KILN_OP_GEMM)
			matmul(g, n, &changed);
		else if (n->op == KILN_OP_MAX_POOL)
			max_pool(g, n, &changed);
	}
	if (g->status != KILN_OK || !changed)
		return g->status;
	/* the new ops sit at the end of the schedule, after their readers;
	 * what they replaced is swept by dce */
	return ir_toposort(g);
}
