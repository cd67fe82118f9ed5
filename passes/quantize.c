/*
 * quantize.c: post-training int8 quantization of an inference graph, the
 * graph side: which values become 8-bit (pass_qplan_build) and the QDQ
 * graph that quantizes them (pass_qplan_apply), once calibration has found
 * each value's range (driver/quantize.c runs the model to find them).
 *
 * The graph it writes is a QDQ model, as ONNX Runtime's quantize_static
 * writes one, so ORT runs it and kiln's qfuse pass turns it into integer
 * ops:
 *   - the layers are Conv, MatMul and Gemm with fixed f32 weights, the
 *     residual Add (two activations of one shape) and MaxPool; a node or op
 *     type named in keep stays f32;
 *   - every activation a layer reads is quantized once: QuantizeLinear ->
 *     DequantizeLinear, u8, one scale and zero point (asymmetric, the range
 *     widened to hold 0, as ORT's), and every reader of the value (not only
 *     layers) takes the DQ, so a conv's result has one reader and fuses;
 *     a graph output stays f32;
 *   - a Relu or Clip that is a layer's only reader is absorbed: the value
 *     quantized is its result, whose range starts at the bound, so the
 *     8-bit saturation does its work and qfuse drops it;
 *   - a MaxPool's result shares its input's scale and zero point (the max
 *     commutes with a monotone map: qfuse pools the 8-bit tensor);
 *   - weights: s8, symmetric (zero point 0, [-127, 127]), one scale per
 *     output channel (axis 0 of a conv weight, the column of a matmul's) or
 *     one for the tensor; a bias: i32 in units of x_scale * w_scale[c] with
 *     zero point 0, where it fits, else it stays f32.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

static bool keep_float(const ir_node *n, const char *const *keep, int nkeep)
{
	for (int i = 0; i < nkeep; i++)
		if (keep[i] && (strcmp(keep[i], ir_op(n->op)->onnx) == 0 ||
		                (n->name && strcmp(keep[i], n->name) == 0)))
			return true;
	return false;
}

/* An f32 value computed at run time. */
static bool activation(const kiln_graph *g, uint32_t v)
{
	return v && g->val[v]->type.dtype == KILN_F32 && !pass_fixed(g, v);
}

static const kiln_tensor *fixed_f32(const kiln_graph *g, uint32_t v)
{
	const kiln_tensor *t = v ? pass_fixed(g, v) : NULL;
	return t && t->dtype == KILN_F32 ? t : NULL;
}

/* Gemm's output columns, and whether its C is a bias over them (absent,
 * or a fixed [N] / [1, N] with beta 1). */
static bool gemm_ok(const kiln_graph *g, const ir_node *n)
{
	const kiln_tensor *w = fixed_f32(g, n->in[1]);
	if (!w || w->rank != 2 || ir_attr_int(n, "transA", 0) || ir_attr_float(n, "alpha", 1) != 1)
		return false;
	if (n->nin < 3 || !n->in[2])
		return true;
	int64_t N = w->shape[ir_attr_int(n, "transB", 0) ? 0 : 1];
	const kiln_tensor *c = fixed_f32(g, n->in[2]);
	return c && ir_attr_float(n, "beta", 1) == 1 && kiln_tensor_numel(c) == N &&
	       (c->rank == 1 || (c->rank == 2 && c->shape[0] == 1));
}

/* Whether n is a layer the rewrite quantizes, and how many of its first
 * inputs are activations to quantize. */
static int layer_inputs(const kiln_graph *g, const ir_node *n)
{
	switch (n->op) {
	case KILN_OP_CONV: {
		const kiln_tensor *w = fixed_f32(g, n->in[1]);
		bool bias = n->nin < 3 || !n->in[2] || fixed_f32(g, n->in[2]);
		return activation(g, n->in[0]) && w && w->rank >= 3 && bias ? 1 : 0;
	}
	case KILN_OP_MATMUL: {
		const kiln_tensor *w = fixed_f32(g, n->in[1]);
		return activation(g, n->in[0]) && g->val[n->in[0]]->type.rank >= 2 && w &&
		       w->rank == 2 ? 1 : 0;
	}
	case KILN_OP_GEMM:
		return activation(g, n->in[0]) && gemm_ok(g, n) ? 1 : 0;
	case KILN_OP_ADD:
		return activation(g, n->in[0]) && activation(g, n->in[1]) &&
		       ir_type_eq(&g->val[n->in[0]]->type, &g->val[n->in[1]]->type) ? 2 : 0;
	case KILN_OP_MAX_POOL:
		return n->nout == 1 && activation(g, n->in[0]) ? 1 : 0;
	default:
		return 0;
	}
}

/* v, or the activation a chain of Flatten/Reshape views it: a layer
 * reading a view of a quantized tensor reads it 8-bit (qfuse moves the
 * view before the DQ), so the tensor to quantize is the one viewed. */
static uint32_t viewed(const kiln_graph *g, uint32_t v)
{
	for (;;) {
		const ir_value *x = g->val[v];
		const ir_node *d = x->kind == IR_V_NODE ? x->def : NULL;
		if (!d || d->dead || (d->op != KILN_OP_FLATTEN && d->op != KILN_OP_RESHAPE) ||
		    !activation(g, d->in[0]))
			return v;
		v = d->in[0];
	}
}

static int find_tensor(const pass_qplan *p, uint32_t v)
{
	for (int i = 0; i < p->nt; i++)
		if (p->t[i].v == v)
			return i;
	return -1;
}

static int add_tensor(kiln_graph *g, pass_qplan *p, uint32_t v)
{
	int i = find_tensor(p, v);
	if (i >= 0)
		return i;
	pass_qtensor *t = realloc(p->t, (size_t)(p->nt + 1) * sizeof *t);
	if (!t)
		return ir_errorf(g, NULL, KILN_ENOMEM, "quantize: out of memory"), -1;
	p->t = t;
	p->t[p->nt] = (pass_qtensor){.v = v, .same_as = -1};
	return p->nt++;
}

/* n's result, or the result of a Relu or Clip that is its one reader. */
static uint32_t absorbed_out(const kiln_graph *g, const ir_node *n)
{
	uint32_t y = n->out[0];
	const ir_value *v = g->val[y];
	if (n->op == KILN_OP_MAX_POOL || v->nuse != 1 || pass_is_output(g, y))
		return y;
	const ir_node *r = v->uses[0];
	return !r->dead && (r->op == KILN_OP_RELU || r->op == KILN_OP_CLIP) && r->in[0] == y ? r->out[0]
	                                                                                     : y;
}

void pass_qplan_free(pass_qplan *p)
{
	free(p->t);
	free(p->l);
	*p = (pass_qplan){0};
}

kiln_status pass_qplan_build(kiln_graph *g, const char *const *keep, int nkeep, pass_qplan *p)
{
	*p = (pass_qplan){0};
	for (uint32_t i = 0; i < g->nnode && g->status == KILN_OK; i++) {
		const ir_node *n = g->node[i];
		int na = n->dead || keep_float(n, keep, nkeep) ? 0 : layer_inputs(g, n);
		if (!na)
			continue;
		pass_qlayer *l = realloc(p->l, (size_t)(p->nl + 1) * sizeof *l);
		if (!l)
			return ir_errorf(g, n, KILN_ENOMEM, "quantize: out of memory");
		p->l = l;
		l = &p->l[p->nl++];
		*l = (pass_qlayer){.node = i, .nact = na, .out = absorbed_out(g, n), .q = -1};
		for (int k = 0; k < na; k++)
			if ((l->x[k] = add_tensor(g, p, na == 1 ? viewed(g, n->in[k]) : n->in[k])) < 0)
				return g->status;
	}
	for (int i = 0; i < p->nl; i++) {
		pass_qlayer *l = &p->l[i];
		l->q = pass_is_output(g, l->out) ? -1 : find_tensor(p, l->out);
		if (l->q >= 0 && g->node[l->node]->op == KILN_OP_MAX_POOL)
			p->t[l->q].same_as = l->x[0];
	}
	return g->status;
}

void pass_qparams(double lo, double hi, float *scale, int *zp)
{
	double rmin = fmin(lo, 0), rmax = fmax(hi, 0);
	float s = (float)((rmax - rmin) / 255.0);
	if (!(s > 0) || !isfinite(s) || s < 1e-30f) { /* all zeros: any scale will do */
		*scale = 1, *zp = 0;
		return;
	}
	double z = nearbyint(-rmin / (double)s);
	*scale = s;
	*zp = (int)fmin(fmax(z, 0), 255);
}

/* ---- the rewrite -------------------------------------------------------------- */

static uint32_t tensor_const(kiln_graph *g, kiln_loc loc, kiln_dtype dt, int rank,
                             const int64_t *shape, const double *v)
{
	kiln_tensor *t = kiln_tensor_new(dt, rank, shape);
	if (!t)
		return ir_errorf_at(g, loc, KILN_ENOMEM, "quantize: out of memory"), 0;
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		ir_store(t, i, v ? v[i] : 0);
	uint32_t c = pass_constant(g, loc, t);
	kiln_tensor_free(t);
	return c;
}

/* (De)QuantizeLinear(x, s, z) with axis (< 0: none); its result or 0. */
static uint32_t qnode(kiln_graph *g, kiln_op op, kiln_loc loc, uint32_t x, uint32_t s, uint32_t z,
                      int axis)
{
	ir_node *n = ir_node_new(g, op, z ? 3 : 2, (uint32_t[]){x, s, z}, 1, loc);
	if (!n || (axis >= 0 && ir_attr_set_int(g, n, "axis", axis) != KILN_OK) ||
	    ir_infer_node(g, n) != KILN_OK)
		return 0;
	return n->out[0];
}

/* Q -> DQ of tensor t; every reader of t's value but the Q (and a graph
 * output) reads the DQ. */
static kiln_status quantize_tensor(kiln_graph *g, pass_qtensor *t)
{
	const ir_value *v = g->val[t->v];
	kiln_loc loc = v->kind == IR_V_NODE && v->def ? v->def->loc : ir_graph_loc(g);
	double s = t->scale, z = t->zp;
	uint32_t sc = tensor_const(g, loc, KILN_F32, 0, NULL, &s);
	uint32_t zc = sc ? tensor_const(g, loc, KILN_U8, 0, NULL, &z) : 0;
	uint32_t q = zc ? qnode(g, KILN_OP_QUANTIZE_LINEAR, loc, t->v, sc, zc, -1) : 0;
	uint32_t dq = q ? qnode(g, KILN_OP_DEQUANTIZE_LINEAR, loc, q, sc, zc, -1) : 0;
	if (!dq)
		return g->status ? g->status : ir_errorf_at(g, loc, KILN_ENOMEM, "quantize: out of memory");
	t->dq = dq;
	const ir_node *qn = g->val[q]->def;
	uint32_t nr = g->val[t->v]->nuse;
	ir_node **readers = malloc((size_t)nr * sizeof *readers);
	if (!readers)
		return ir_errorf_at(g, loc, KILN_ENOMEM, "quantize: out of memory");
	memcpy(readers, g->val[t->v]->uses, (size_t)nr * sizeof *readers);
	for (uint32_t u = 0; u < nr; u++)
		for (uint32_t k = 0; k < readers[u]->nin && readers[u] != qn; k++)
			if (readers[u]->in[k] == t->v)
				ir_set_input(g, readers[u], k, dq);
	free(readers);
	return g->status;
}

/* The weight of layer n as DQ(s8 constant), per channel along axis unless
 * per_tensor; its scales into *ws (malloc'd, *nws of them). 0 on error. */
static uint32_t quantize_weight(kiln_graph *g, const ir_node *n, int axis, bool per_tensor,
                                float **ws, int64_t *nws)
{
	const kiln_tensor *w = fixed_f32(g, n->in[1]);
	int64_t C = per_tensor ? 1 : w->shape[axis], inner = 1, N = kiln_tensor_numel(w);
	for (int d = axis + 1; d < w->rank; d++)
		inner *= w->shape[d];
	double *amax = calloc((size_t)C, sizeof *amax), *q = malloc((size_t)N * sizeof *q);
	double *sd = malloc((size_t)C * sizeof *sd);
	*ws = malloc((size_t)C * sizeof **ws);
	*nws = C;
	uint32_t r = 0;
	if (!amax || !q || !sd || !*ws) {
		ir_errorf(g, n, KILN_ENOMEM, "quantize: out of memory");
		goto out;
	}
	for (int64_t i = 0; i < N; i++) {
		double x = ir_load(w, i);
		int64_t c = per_tensor ? 0 : (i / inner) % w->shape[axis];
		if (!isfinite(x)) {
			ir_errorf(g, n, KILN_EINVAL, "quantize: the weight has a non-finite value (%g at "
			          "element %lld)", x, (long long)i);
			goto out;
		}
		amax[c] = fmax(amax[c], fabs(x));
	}
	for (int64_t c = 0; c < C; c++) {
		float s = (float)(amax[c] / 127.0);
		(*ws)[c] = s > 1e-30f && isfinite(s) ? s : 1.0f;
		sd[c] = (*ws)[c];
	}
	for (int64_t i = 0; i < N; i++) {
		int64_t c = per_tensor ? 0 : (i / inner) % w->shape[axis];
		q[i] = fmin(fmax(nearbyint(ir_load(w, i) / (double)(*ws)[c]), -127), 127);
	}
	uint32_t wq = tensor_const(g, n->loc, KILN_I8, w->rank, w->shape, q);
	uint32_t sc = wq ? tensor_const(g, n->loc, KILN_F32, per_tensor ? 0 : 1, &C, sd) : 0;
	uint32_t zc = sc ? tensor_const(g, n->loc, KILN_I8, per_tensor ? 0 : 1, &C, NULL) : 0;
	r = zc ? qnode(g, KILN_OP_DEQUANTIZE_LINEAR, n->loc, wq, sc, zc, per_tensor ? -1 : axis) : 0;
out:
	free(amax), free(q), free(sd);
	return r;
}

/* The bias b (fixed f32, M values) as DQ(i32) in units of xs * ws[c], or
 * b itself when a value does not fit. */
static uint32_t quantize_bias(kiln_graph *g, const ir_node *n, uint32_t b, float xs,
                              const float *ws, int64_t nws)
{
	const kiln_tensor *t = fixed_f32(g, b);
	int64_t M = kiln_tensor_numel(t);
	double *q = malloc((size_t)M * sizeof *q), *s = malloc((size_t)M * sizeof *s);
	uint32_t r = 0;
	if (!q || !s) {
		free(q), free(s);
		return ir_errorf(g, n, KILN_ENOMEM, "quantize: out of memory"), 0;
	}
	bool fits = true;
	for (int64_t c = 0; c < M; c++) {
		s[c] = (float)(xs * ws[nws == 1 ? 0 : c]); /* ORT's product, in f32 */
		q[c] = nearbyint(ir_load(t, c) / s[c]);
		fits = fits && isfinite(q[c]) && fabs(q[c]) < 2147483647.0;
	}
	if (fits) {
		uint32_t bq = tensor_const(g, n->loc, KILN_I32, 1, &M, q);
		uint32_t sc = bq ? tensor_const(g, n->loc, KILN_F32, 1, &M, s) : 0;
		r = sc ? qnode(g, KILN_OP_DEQUANTIZE_LINEAR, n->loc, bq, sc, 0, 0) : 0;
	}
	free(q), free(s);
	return fits ? r : b;
}

static kiln_status quantize_layer(kiln_graph *g, ir_node *n, const pass_qtensor *x,
                                  bool per_tensor)
{
	bool gemm = n->op == KILN_OP_GEMM, tb = gemm && ir_attr_int(n, "transB", 0);
	int axis = n->op == KILN_OP_CONV || tb ? 0 : 1;
	float *ws = NULL;
	int64_t nws = 0;
	uint32_t w = quantize_weight(g, n, axis, per_tensor, &ws, &nws);
	if (w)
		ir_set_input(g, n, 1, w);
	uint32_t b = w && n->nin > 2 && n->in[2] ? quantize_bias(g, n, n->in[2], x->scale, ws, nws) : 0;
	if (b)
		ir_set_input(g, n, 2, b);
	free(ws);
	return g->status;
}

kiln_status pass_qplan_apply(kiln_graph *g, pass_qplan *p, bool per_tensor_weights)
{
	for (int i = 0; i < p->nt; i++) {
		pass_qtensor *t = &p->t[i];
		int src = i;
		for (int hops = 0; p->t[src].same_as >= 0 && hops < p->nt; hops++)
			src = p->t[src].same_as;
		if (!(p->t[src].lo <= p->t[src].hi) || !isfinite(p->t[src].lo) ||
		    !isfinite(p->t[src].hi))
			return ir_errorf(g, NULL, KILN_EINVAL, "quantize: tensor %d has no finite range "
			                 "[%g, %g]", src, p->t[src].lo, p->t[src].hi);
		t->lo = p->t[src].lo, t->hi = p->t[src].hi; /* a shared tensor reports its source's */
		pass_qparams(t->lo, t->hi, &t->scale, &t->zp);
	}
	for (int i = 0; i < p->nl && g->status == KILN_OK; i++) {
		ir_node *n = g->node[p->l[i].node];
		if (n->op == KILN_OP_CONV || n->op == KILN_OP_MATMUL || n->op == KILN_OP_GEMM)
			quantize_layer(g, n, &p->t[p->l[i].x[0]], per_tensor_weights);
	}
	for (int i = 0; i < p->nt && g->status == KILN_OK; i++)
		quantize_tensor(g, &p->t[i]);
	if (g->status != KILN_OK)
		return g->status;
	return ir_toposort(g);
}
