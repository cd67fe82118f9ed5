/*
 * bnfold.c: the `bnfold` pass, inference-mode BatchNormalization folded
 * into the linear op that feeds it.
 *
 * Outside training, BN is an affine map per channel, y = s*x + t with
 * s = gamma / sqrt(var + eps) and t = beta - mean * s.  When x is the
 * single-use result of a linear op whose output channel c is a row (or
 * column) of a constant weight, the map folds into that op:
 *   Conv  W[c, ...] * s[c], bias b[c] * s[c] + t[c]            (axis 1 = c)
 *   Gemm  B's output column scaled (rows with transB), C' = beta*C*s + t
 *   MatMul of a rank-2 A by a constant [K, C] matrix: becomes the Gemm
 *         A x (B*s) + t (BN's channel axis is then the last one)
 * The new weights are Constant nodes computed in double and stored in the
 * weights' dtype; the BN and the old op go, and the folded op takes the
 * BN's result name, so graph outputs keep their names.
 *
 * Parameters count as constants here, unlike in `fold`: this pass is for
 * compiling inference graphs, where weights are final (kiln_compile runs it
 * on its private clone of the graph, through PASS_INFERENCE).  It must not
 * run on a graph that is still to be trained or to have parameters loaded:
 * the folded weights would be stale copies.  So it leaves alone a graph
 * marked for training (kiln_graph_set_training), a BN in training mode, and
 * a BN whose statistics are computed in the graph (train-mode batch norm,
 * or statistics fed as inputs): only Constant nodes and parameters fold.
 *
 * The same reasoning lets it choose a weight's layout.  A Gemm with transB
 * reads B as [N, K] (every Linear exported from PyTorch does), which the
 * GEMM kernel can only use by gathering columns; when B is fixed and read
 * by that Gemm alone it is stored transposed instead, and transB becomes 0,
 * so B's rows are contiguous in memory and kiln_sgemm multiplies straight
 * from it (codegen/llvm_gemm.c), as ONNX Runtime's pre-packing does.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* v's float tensor when it is fixed at compile time: a Constant or a
 * parameter. */
static const kiln_tensor *fixed(const kiln_graph *g, uint32_t v)
{
	const kiln_tensor *t = pass_fixed(g, v);
	return t && kiln_dtype_is_float(t->dtype) ? t : NULL;
}



/* w with every slice along axis k multiplied by s[k] (the per-channel scale). */
static kiln_tensor *scale_along(const kiln_tensor *w, int axis, const double *s)
{
	kiln_tensor *r = kiln_tensor_new(w->dtype, w->rank, w->shape);
	int64_t inner = 1, n = kiln_tensor_numel(w);
	for (int d = axis + 1; d < w->rank; d++)
		inner *= w->shape[d];
	for (int64_t i = 0; r && i < n; i++)
		ir_store(r, i, ir_load(w, i) * s[(i / inner) % w->shape[axis]]);
	return r;
}

/* The new bias: beta * b[c] (b of numel C or 1, or absent) * s[c] + t[c]. */
static kiln_tensor *bias(kiln_dtype dt, const kiln_tensor *b, double beta, const double *s,
                         const double *t, int64_t C)
{
	kiln_tensor *r = kiln_tensor_new(dt, 1, &C);
	int64_t nb = b ? kiln_tensor_numel(b) : 0;
	for (int64_t c = 0; r && c < C; c++)
		ir_store(r, c, (nb ? beta * ir_load(b, nb == 1 ? 0 : c) : 0) * s[c] + t[c]);
	return r;
}


/* Removes n, then the Constants that fed only n. */
static void drop(kiln_graph *g, ir_node *n)
{
	ir_node_remove(g, n);
	for (uint32_t i = 0; i < n->nin; i++) {
		const ir_value *x = g->val[n->in[i]];
		if (x->kind == IR_V_NODE && x->def && x->def->op == KILN_OP_CONSTANT && !x->nuse &&
		    !pass_is_output(g, n->in[i]))
			ir_node_remove(g, x->def);
	}
}

/* Replaces bn and its producer p by op(in[0..nin)) with p's attributes
 * (Gemm's beta then 1), which takes over bn's result and its name. */
static kiln_status rebuild(kiln_graph *g, ir_node *bn, ir_node *p, kiln_op op, uint32_t nin,
                           const uint32_t *in, kiln_tensor **owned, int nowned)
{
	uint32_t cin[3] = {in[0], 0, 0};
	for (int k = 0; k < nowned; k++) /* owned[k] is the weight tensor of in[1 + k] */
		if (!owned[k] || !(cin[1 + k] = pass_constant(g, p->loc, owned[k])))
			return g->status ? g->status : ir_errorf(g, bn, KILN_ENOMEM, "bnfold: out of memory");
	for (uint32_t k = 1 + nowned; k < nin; k++)
		cin[k] = in[k];
	ir_node *f = ir_node_new(g, op, nin, cin, 1, p->loc);
	if (!f)
		return g->status;
	f->name = p->name;
	if (op == p->op)
		pass_copy_attrs(g, f, p);
	if (op == KILN_OP_GEMM)
		ir_attr_set_float(g, f, "beta", 1);
	if (ir_infer_node(g, f) != KILN_OK)
		return g->status;
	ir_value *old = g->val[bn->out[0]], *nv = g->val[f->out[0]];
	if (!ir_type_eq(&old->type, &nv->type))
		return ir_errorf(g, bn, KILN_EVERIFY, "bnfold: folded type differs");
	nv->name = old->name;
	old->name = NULL;
	ir_replace_uses(g, bn->out[0], f->out[0]);
	drop(g, bn);
	drop(g, p);
	return g->status;
}

/* How one producer absorbs y = s*x + t per channel (C channels);
 * *done tells whether it did. */
typedef kiln_status (*into_fn)(kiln_graph *g, ir_node *bn, ir_node *p, const double *s,
                               const double *t, int64_t C, bool *done);

static kiln_status into_conv(kiln_graph *g, ir_node *bn, ir_node *p, const double *s,
                             const double *t, int64_t C, bool *done)
{
	const kiln_tensor *w = fixed(g, p->in[1]), *b = p->nin > 2 ? fixed(g, p->in[2]) : NULL;
	if (!w || w->rank < 1 || w->shape[0] != C || (p->nin > 2 && (!b || kiln_tensor_numel(b) != C)))
		return KILN_OK;
	kiln_tensor *k[2] = {scale_along(w, 0, s), bias(w->dtype, b, 1, s, t, C)};
	uint32_t in[3] = {p->in[0]};
	kiln_status st = rebuild(g, bn, p, KILN_OP_CONV, 3, in, k, 2);
	kiln_tensor_free(k[0]), kiln_tensor_free(k[1]);
	*done = st == KILN_OK;
	return st;
}

/* C broadcasts along the output columns: numel 1, or C entries on its last axis. */
static bool per_column(const kiln_tensor *c, int64_t C)
{
	int64_t n = kiln_tensor_numel(c);
	return n == 1 || (n == C && c->rank >= 1 && c->rank <= 2 && c->shape[c->rank - 1] == C);
}

static kiln_status into_gemm(kiln_graph *g, ir_node *bn, ir_node *p, const double *s,
                             const double *t, int64_t C, bool *done)
{
	bool tb = ir_attr_int(p, "transB", 0);
	double beta = ir_attr_float(p, "beta", 1);
	const kiln_tensor *w = fixed(g, p->in[1]), *c = p->nin > 2 ? fixed(g, p->in[2]) : NULL;
	if (!w || w->rank != 2 || w->shape[tb ? 0 : 1] != C ||
	    (p->nin > 2 && (!c || !per_column(c, C))))
		return KILN_OK;
	kiln_tensor *k[2] = {scale_along(w, tb ? 0 : 1, s), bias(w->dtype, c, beta, s, t, C)};
	uint32_t in[3] = {p->in[0]};
	kiln_status st = rebuild(g, bn, p, KILN_OP_GEMM, 3, in, k, 2);
	kiln_tensor_free(k[0]), kiln_tensor_free(k[1]);
	*done = st == KILN_OK;
	return st;
}

/* MatMul [M, K] x [K, C]: BN's channel axis is the last, so it becomes the
 * Gemm A x (B*s) + t. */
static kiln_status into_matmul(kiln_graph *g, ir_node *bn, ir_node *p, const double *s,
                               const double *t, int64_t C, bool *done)
{
	const kiln_tensor *w = fixed(g, p->in[1]);
	if (!w || w->rank != 2 || w->shape[1] != C || g->val[p->in[0]]->type.rank != 2)
		return KILN_OK;
	kiln_tensor *k[2] = {scale_along(w, 1, s), bias(w->dtype, NULL, 1, s, t, C)};
	uint32_t in[3] = {p->in[0]};
	kiln_status st = rebuild(g, bn, p, KILN_OP_GEMM, 3, in, k, 2);
	kiln_tensor_free(k[0]), kiln_tensor_free(k[1]);
	*done = st == KILN_OK;
	return st;
}

static const into_fn into[KILN_OP_COUNT] = {
	[KILN_OP_CONV] = into_conv,
	[KILN_OP_GEMM] = into_gemm,
	[KILN_OP_MATMUL] = into_matmul,
};

/* The producer bn can fold into, or NULL: an op from the table whose only
 * use is bn, with BN in inference mode and its extra outputs unused. */
static ir_node *producer(const kiln_graph *g, const ir_node *bn)
{
	const ir_value *x = g->val[bn->in[0]];
	if (ir_attr_int(bn, "training_mode", 0) || x->kind != IR_V_NODE || !x->def ||
	    !into[x->def->op] || x->nuse != 1 || pass_is_output(g, bn->in[0]) || x->type.rank < 2 ||
	    !kiln_dtype_is_float(x->type.dtype) || x->type.dim[1] < 0)
		return NULL;
	for (uint32_t k = 1; k < bn->nout; k++)
		if (g->val[bn->out[k]]->nuse || pass_is_output(g, bn->out[k]))
			return NULL;
	return x->def;
}

/* s and t of bn (C channels) when its four statistics are fixed and give
 * finite numbers; false otherwise. */
static bool affine(const kiln_graph *g, const ir_node *bn, int64_t C, double *s, double *t)
{
	const kiln_tensor *p[4];
	for (int k = 0; k < 4; k++)
		if (!(p[k] = fixed(g, bn->in[1 + k])) || kiln_tensor_numel(p[k]) != C)
			return false;
	double eps = ir_attr_float(bn, "epsilon", 1e-5);
	for (int64_t c = 0; c < C; c++) {
		s[c] = ir_load(p[0], c) / sqrt(ir_load(p[3], c) + eps);
		t[c] = ir_load(p[1], c) - ir_load(p[2], c) * s[c];
		if (!isfinite(s[c]) || !isfinite(t[c]))
			return false;
	}
	return true;
}

static kiln_status fold_bn(kiln_graph *g, ir_node *bn, bool *changed)
{
	ir_node *p = producer(g, bn);
	if (!p)
		return KILN_OK;
	int64_t C = g->val[bn->in[0]]->type.dim[1];
	double *s = malloc(2 * (C ? C : 1) * sizeof *s);
	if (!s)
		return ir_errorf(g, bn, KILN_ENOMEM, "bnfold: out of memory");
	kiln_status st = KILN_OK;
	bool done = false;
	if (affine(g, bn, C, s, s + C))
		st = into[p->op](g, bn, p, s, s + C, C, &done);
	free(s);
	*changed = *changed || done;
	return st;
}

/* dst[c][r] = src[r][c] for an R x C matrix of es-byte elements, in
 * tiles that stay in L1 on both sides: VGG's 4096 x 25088 classifier
 * weight took seconds element by element, since every write of a row
 * walked a column 16 KB apart. */
static void transpose(void *dst, const void *src, int64_t R, int64_t C, size_t es)
{
	enum { T = 32 };
	for (int64_t r0 = 0; r0 < R; r0 += T)
		for (int64_t c0 = 0; c0 < C; c0 += T) {
			int64_t r1 = r0 + T < R ? r0 + T : R, c1 = c0 + T < C ? c0 + T : C;
			for (int64_t r = r0; r < r1; r++) {
#define TILE(type)                                                                 \
	for (int64_t c = c0; c < c1; c++)                                              \
		((type *)dst)[c * R + r] = ((const type *)src)[r * C + c];
				switch (es) {
				case 4: TILE(uint32_t) break;
				case 2: TILE(uint16_t) break;
				case 8: TILE(uint64_t) break;
				case 1: TILE(uint8_t) break;
				default:
					for (int64_t c = c0; c < c1; c++)
						memcpy((char *)dst + (c * R + r) * es,
						       (const char *)src + (r * C + c) * es, es);
				}
#undef TILE
			}
		}
}

/* Gemm(transB=1) with a fixed B read by it alone: B stored as [K, N]. */
static kiln_status untranspose_b(kiln_graph *g, ir_node *n, bool *changed)
{
	uint32_t v = n->in[1];
	const kiln_tensor *w = fixed(g, v);
	if (!ir_attr_int(n, "transB", 0) || !w || w->rank != 2 || g->val[v]->nuse != 1 ||
	    pass_is_output(g, v))
		return KILN_OK;
	int64_t N = w->shape[0], K = w->shape[1];
	kiln_tensor *t = kiln_tensor_new(w->dtype, 2, (int64_t[]){K, N});
	if (!t)
		return ir_errorf(g, n, KILN_ENOMEM, "bnfold: out of memory");
	transpose(t->data, w->data, N, K, kiln_dtype_size(w->dtype));
	uint32_t c = pass_constant(g, n->loc, t);
	kiln_tensor_free(t);
	if (!c)
		return g->status ? g->status : ir_errorf(g, n, KILN_ENOMEM, "bnfold: out of memory");
	const ir_value *old = g->val[v];
	ir_set_input(g, n, 1, c);
	ir_attr_set_int(g, n, "transB", 0);
	if (old->kind == IR_V_NODE && old->def && old->def->op == KILN_OP_CONSTANT && !old->nuse)
		ir_node_remove(g, old->def);
	*changed = true;
	return g->status;
}

kiln_status pass_bnfold(kiln_graph *g, const pass_opts *o)
{
	(void)o;
	if (g->training)
		return KILN_OK; /* weights still change: nothing is final */
	uint32_t count = g->nnode; /* the nodes it appends need no visit */
	bool changed = false;
	for (uint32_t i = 0; i < count && g->status == KILN_OK; i++) {
		ir_node *n = g->node[i];
		if (!n->dead && n->op == KILN_OP_BATCH_NORM)
			fold_bn(g, n, &changed);
	}
	/* after the folds, which may have made new Gemms */
	for (uint32_t i = 0; i < g->nnode && g->status == KILN_OK; i++) {
		ir_node *n = g->node[i];
		if (!n->dead && n->op == KILN_OP_GEMM)
			untranspose_b(g, n, &changed);
	}
	if (g->status != KILN_OK || !changed)
		return g->status;
	/* the folded ops sit at the end of the schedule, after their readers */
	if (ir_compact(g) != KILN_OK)
		return g->status;
	return ir_toposort(g);
}
