/*
 * nnfuse.c: the `nnfuse` pass, decomposed transformer ops recognised and
 * replaced by the single ops kiln lowers well.
 *
 * Exporters spell some ops out in primitives: PyTorch's LayerNorm before
 * opset 17, HuggingFace's erf GELU (BERT) and tanh GELU (GPT-2) always.
 * Lowered as written they cost a pass over memory per primitive (the
 * LayerNorm: two reductions, a broadcast subtract, a Pow, a Div ...) and
 * Pow(x, 2) or Pow(x, 3) a libm powf call per element.  This pass rewrites:
 *
 *   Pow(x, c), c a scalar Constant 2 or 3        -> Mul(x, x) (times x)
 *                           0.5                  -> Sqrt(x)
 *   m = ReduceMean(x, axes = a trailing block, keepdims)
 *   d = x - m;  v = ReduceMean(d*d or Pow(d, 2), same axes)
 *   y = d / Sqrt(v + eps) [* gamma] [+ beta]     -> LayerNormalization(x, gamma, beta)
 *   x * 0.5 * (1 + Erf(x / sqrt 2)) (or x * (1/sqrt 2))
 *                                                -> Gelu(x)
 *   0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
 *                                                -> Gelu(x, approximate="tanh")
 * with commuted operands of Add and Mul, and the 0.5 * x product in any
 * association.  Every intermediate must have a single reader and not be a
 * graph output, constants must be scalars (numel 1, no rank beyond x's)
 * matching to float precision, and x float; anything else is left as it
 * is.  A missing gamma becomes a Constant of ones.  The replacement takes
 * over the final value's uses and name.
 *
 * It runs in PASS_INFERENCE only (after fold, so the constants are
 * Constants); the rewritten graph computes the same function, up to float
 * rounding.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* The live node defining v when its op is op; NULL otherwise. */
static ir_node *def(const kiln_graph *g, uint32_t v, kiln_op op)
{
	const ir_value *x = g->val[v];
	return x->kind == IR_V_NODE && x->def && !x->def->dead && x->def->op == op ? x->def : NULL;
}

static bool is_output(const kiln_graph *g, uint32_t v)
{
	for (uint32_t i = 0; i < g->noutput; i++)
		if (g->output[i] == v)
			return true;
	return false;
}

/* v is an intermediate a rewrite may delete: read once, not an output. */
static bool single(const kiln_graph *g, uint32_t v)
{
	return g->val[v]->nuse == 1 && !is_output(g, v);
}

/* The one node reading v, or NULL. */
static ir_node *reader(const kiln_graph *g, uint32_t v)
{
	return single(g, v) && !g->val[v]->uses[0]->dead ? g->val[v]->uses[0] : NULL;
}

/* v is a float Constant of one element, no higher rank than x's: *c. */
static bool scalar(const kiln_graph *g, uint32_t v, int xrank, double *c)
{
	ir_node *n = def(g, v, KILN_OP_CONSTANT);
	const ir_attr *a = n ? ir_attr_get(n, "value") : NULL;
	if (!a || a->kind != IR_A_TENSOR || !kiln_dtype_is_float(a->u.t->dtype) ||
	    kiln_tensor_numel(a->u.t) != 1 || a->u.t->rank > xrank)
		return false;
	*c = ir_load(a->u.t, 0);
	return true;
}

static bool near(double a, double b)
{
	return fabs(a - b) <= 1e-6 * fmax(1, fabs(b));
}

/* v is a scalar Constant equal to want (float precision). */
static bool is_const(const kiln_graph *g, uint32_t v, int xrank, double want)
{
	double c;
	return scalar(g, v, xrank, &c) && fabs(c - want) <= 2e-7 * fmax(1, fabs(want));
}

/* Binary node n (commutative, or with only in[0] tried for the rest when
 * !comm): its operand that is not `known` when the other is; 0 if neither. */
static uint32_t other(const ir_node *n, uint32_t known, bool comm)
{
	if (n->in[0] == known)
		return n->in[1];
	if (comm && n->in[1] == known)
		return n->in[0];
	return 0;
}

/* Binary commutative node n with a scalar Constant operand equal to want
 * (float precision, or near() when loose): the other operand; 0 if not. */
static uint32_t with_const(const kiln_graph *g, const ir_node *n, int xrank, double want,
                           bool loose)
{
	for (int i = 0; i < 2; i++) {
		double c;
		if (scalar(g, n->in[i], xrank, &c) &&
		    (loose ? near(c, want) : fabs(c - want) <= 2e-7 * fmax(1, fabs(want))))
			return n->in[1 - i];
	}
	return 0;
}

/* Removes the nodes in order (each one's readers before it), then the
 * Constants left unread. */
static void drop(kiln_graph *g, ir_node *const *nodes, int n)
{
	for (int i = 0; i < n; i++) {
		if (!nodes[i] || nodes[i]->dead)
			continue;
		ir_node_remove(g, nodes[i]);
		for (uint32_t k = 0; k < nodes[i]->nin; k++) {
			ir_node *c = def(g, nodes[i]->in[k], KILN_OP_CONSTANT);
			if (c && !g->val[c->out[0]]->nuse && !is_output(g, c->out[0]))
				ir_node_remove(g, c);
		}
	}
}

/* f (a new node, inferred) replaces the value `old`: its uses and name. */
static kiln_status take_over(kiln_graph *g, ir_node *f, uint32_t old)
{
	if (ir_infer_node(g, f) != KILN_OK)
		return g->status;
	ir_value *o = g->val[old], *nv = g->val[f->out[0]];
	if (!ir_type_eq(&o->type, &nv->type))
		return ir_errorf(g, f, KILN_EVERIFY, "nnfuse: rewritten type differs");
	nv->name = o->name;
	o->name = NULL;
	ir_replace_uses(g, old, f->out[0]);
	return KILN_OK;
}

/* ---- Pow by a small constant ----------------------------------------------- */

static kiln_status pow_const(kiln_graph *g, ir_node *n, bool *changed)
{
	const ir_type *x = &g->val[n->in[0]]->type;
	double c;
	if (!kiln_dtype_is_float(x->dtype) || !scalar(g, n->in[1], x->rank, &c) ||
	    (c != 2 && c != 3 && c != 0.5))
		return KILN_OK;
	ir_node *f;
	if (c == 0.5) {
		f = ir_node_new(g, KILN_OP_SQRT, 1, n->in, 1, n->loc);
	} else {
		uint32_t xx[2] = {n->in[0], n->in[0]};
		f = ir_node_new(g, KILN_OP_MUL, 2, xx, 1, n->loc);
		if (f && c == 3) {
			if (ir_infer_node(g, f) != KILN_OK)
				return g->status;
			uint32_t x3[2] = {f->out[0], n->in[0]};
			f = ir_node_new(g, KILN_OP_MUL, 2, x3, 1, n->loc);
		}
	}
	if (!f)
		return g->status;
	f->name = n->name;
	if (take_over(g, f, n->out[0]) != KILN_OK)
		return g->status;
	drop(g, &n, 1);
	*changed = true;
	return g->status;
}

/* ---- LayerNorm --------------------------------------------------------------- */

/* The first axis of n's reduction when it is a trailing block of a rank-r
 * input with keepdims; -1 otherwise. */
static int trailing_axes(const ir_node *n, int r)
{
	const int64_t *ax;
	uint32_t na = ir_attr_ints(n, "axes", &ax);
	if (!na || na > (uint32_t)r || !ir_attr_int(n, "keepdims", 1))
		return -1;
	bool seen[KILN_MAX_RANK] = {0};
	for (uint32_t i = 0; i < na; i++) {
		int64_t a = ax[i] < 0 ? ax[i] + r : ax[i];
		if (a < 0 || a >= r || seen[a])
			return -1;
		seen[a] = true;
	}
	for (int a = r - (int)na; a < r; a++)
		if (!seen[a])
			return -1;
	return r - (int)na;
}

static bool same_axes(const ir_node *a, const ir_node *b, int r)
{
	return trailing_axes(a, r) >= 0 && trailing_axes(a, r) == trailing_axes(b, r);
}

/* p: a float vector along the normalised dims: exactly x's dims from axis
 * on, possibly after leading 1s. */
static bool affine_param(const kiln_graph *g, uint32_t p, const ir_type *x, int axis)
{
	const ir_type *t = &g->val[p]->type;
	int k = x->rank - axis;
	if (t->dtype != x->dtype || t->rank < k || t->rank > x->rank)
		return false;
	for (int d = 0; d < t->rank; d++) {
		int64_t want = d < t->rank - k ? 1 : x->dim[axis + d - (t->rank - k)];
		if (t->dim[d] != want)
			return false;
	}
	return true;
}

/* A Constant of ones of x's dims from axis on. */
static uint32_t ones(kiln_graph *g, const ir_type *x, int axis, kiln_loc loc)
{
	int64_t shape[KILN_MAX_RANK];
	int k = x->rank - axis;
	for (int d = 0; d < k; d++)
		if ((shape[d] = x->dim[axis + d]) < 0)
			return 0;
	kiln_tensor *t = kiln_tensor_new(x->dtype, k, shape);
	if (!t)
		return 0;
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		ir_store(t, i, 1);
	ir_node *c = ir_node_new(g, KILN_OP_CONSTANT, 0, NULL, 1, loc);
	uint32_t v = c && ir_attr_set_tensor(g, c, "value", t) == KILN_OK &&
	                     ir_infer_node(g, c) == KILN_OK ? c->out[0] : 0;
	kiln_tensor_free(t);
	return v;
}

/* From m = ReduceMean(x): the rest of the decomposed LayerNorm. */
static kiln_status layer_norm(kiln_graph *g, ir_node *m, bool *changed)
{
	uint32_t xv = m->in[0];
	const ir_type *x = &g->val[xv]->type;
	int r = x->rank, axis = trailing_axes(m, r);
	if (axis < 0 || !kiln_dtype_is_float(x->dtype))
		return KILN_OK;
	/* d = x - m: m read by this Sub alone, x its first operand */
	ir_node *sub = reader(g, m->out[0]);
	if (!sub || sub->op != KILN_OP_SUB || sub->in[0] != xv || sub->in[1] != m->out[0])
		return KILN_OK;
	uint32_t d = sub->out[0];
	/* d read by the square (d*d: two slots, or Pow(d, 2)) and the Div */
	const ir_value *dv = g->val[d];
	if (is_output(g, d) || dv->nuse < 2 || dv->nuse > 3)
		return KILN_OK;
	ir_node *sq = NULL, *div = NULL;
	for (uint32_t i = 0; i < dv->nuse; i++) {
		ir_node *u = dv->uses[i];
		if (u->op == KILN_OP_DIV && u->in[0] == d && !div)
			div = u;
		else if (u->op == KILN_OP_MUL && u->in[0] == d && u->in[1] == d)
			sq = u;
		else if (u->op == KILN_OP_POW && u->in[0] == d && is_const(g, u->in[1], r, 2))
			sq = u;
		else
			return KILN_OK;
	}
	if (!sq || !div || dv->nuse != (sq->op == KILN_OP_MUL ? 3u : 2u))
		return KILN_OK;
	ir_node *var = reader(g, sq->out[0]);
	if (!var || var->op != KILN_OP_REDUCE_MEAN || !same_axes(m, var, r))
		return KILN_OK;
	ir_node *add = reader(g, var->out[0]);
	double eps;
	if (!add || add->op != KILN_OP_ADD)
		return KILN_OK;
	uint32_t ev = other(add, var->out[0], true);
	if (!ev || !scalar(g, ev, r, &eps) || !(eps >= 0))
		return KILN_OK;
	ir_node *sqrt_n = reader(g, add->out[0]);
	if (!sqrt_n || sqrt_n->op != KILN_OP_SQRT || reader(g, sqrt_n->out[0]) != div ||
	    div->in[1] != sqrt_n->out[0])
		return KILN_OK;
	/* optional * gamma, + beta */
	ir_node *chain[10] = {div, sqrt_n, add, var, sq, sub, m};
	int nchain = 7;
	uint32_t y = div->out[0], gamma = 0, beta = 0;
	ir_node *u = reader(g, y);
	if (u && u->op == KILN_OP_MUL) {
		uint32_t p = other(u, y, true);
		if (p && p != y && affine_param(g, p, x, axis)) {
			gamma = p;
			y = u->out[0];
			chain[nchain++] = u;
			u = reader(g, y);
		}
	}
	if (u && u->op == KILN_OP_ADD) {
		uint32_t p = other(u, y, true);
		if (p && p != y && affine_param(g, p, x, axis)) {
			beta = p;
			y = u->out[0];
			chain[nchain++] = u;
		}
	}
	if (!ir_type_eq(&g->val[y]->type, x))
		return KILN_OK;
	if (!gamma && !(gamma = ones(g, x, axis, m->loc)))
		return KILN_OK;
	uint32_t in[3] = {xv, gamma, beta};
	ir_node *f = ir_node_new(g, KILN_OP_LAYER_NORM, beta ? 3 : 2, in, 1, div->loc);
	if (!f)
		return g->status;
	ir_attr_set_int(g, f, "axis", axis);
	ir_attr_set_float(g, f, "epsilon", eps);
	f->name = chain[nchain - 1]->name;
	if (take_over(g, f, y) != KILN_OK)
		return g->status;
	/* readers first: reverse of the order found */
	ir_node *rev[10];
	for (int i = 0; i < nchain; i++)
		rev[i] = chain[nchain - 1 - i];
	drop(g, rev, nchain);
	*changed = true;
	return g->status;
}

/* ---- GELU -------------------------------------------------------------------- */

/* From c = 1 + inner (inner's value is `inner`): climbs the single-use
 * Muls above c collecting the other factors until they are exactly x and
 * 0.5 (either apart or as one single-use Mul(x, 0.5)).  The last Mul's
 * node into *top, the Muls into nodes[*n..]; false if the product is not
 * x * 0.5 * c. */
static bool half_x_times(kiln_graph *g, uint32_t c, uint32_t x, ir_node **top, ir_node **nodes,
                         int *n)
{
	int r = g->val[x]->type.rank;
	bool has_x = false, has_half = false;
	uint32_t cur = c;
	while (!(has_x && has_half)) {
		ir_node *u = reader(g, cur);
		uint32_t f = u && u->op == KILN_OP_MUL ? other(u, cur, true) : 0;
		if (!f || f == cur)
			return false;
		ir_node *xm = def(g, f, KILN_OP_MUL);
		if (f == x && !has_x) {
			has_x = true;
		} else if (!has_half && is_const(g, f, r, 0.5)) {
			has_half = true;
		} else if (!has_x && !has_half && xm && single(g, f) && with_const(g, xm, r, 0.5, false) == x) {
			has_x = has_half = true;
			nodes[(*n)++] = xm;
		} else {
			return false;
		}
		nodes[(*n)++] = u;
		cur = u->out[0];
		*top = u;
	}
	return true;
}

static kiln_status gelu_done(kiln_graph *g, uint32_t x, ir_node *top, ir_node **nodes, int n,
                             bool tanh_form, bool *changed)
{
	if (!ir_type_eq(&g->val[top->out[0]]->type, &g->val[x]->type))
		return KILN_OK;
	ir_node *f = ir_node_new(g, KILN_OP_GELU, 1, &x, 1, top->loc);
	if (!f)
		return g->status;
	if (tanh_form)
		ir_attr_set_string(g, f, "approximate", "tanh");
	f->name = top->name;
	if (take_over(g, f, top->out[0]) != KILN_OK)
		return g->status;
	/* nodes were found bottom-up: drop top-down (readers first) */
	ir_node *rev[16];
	for (int i = 0; i < n; i++)
		rev[i] = nodes[n - 1 - i];
	drop(g, rev, n);
	*changed = true;
	return g->status;
}

/* From Erf(a): a = x / sqrt 2 or x * (1/sqrt 2); then 1 + erf, times x * 0.5. */
static kiln_status gelu_erf(kiln_graph *g, ir_node *e, bool *changed)
{
	ir_node *a = g->val[e->in[0]]->def;
	if (!a || a->dead || !single(g, e->in[0]))
		return KILN_OK;
	uint32_t x = 0;
	const ir_type *t = &g->val[e->in[0]]->type;
	if (a->op == KILN_OP_DIV) {
		double c;
		if (scalar(g, a->in[1], t->rank, &c) && near(c, M_SQRT2))
			x = a->in[0];
	} else if (a->op == KILN_OP_MUL) {
		x = with_const(g, a, t->rank, M_SQRT1_2, true);
	}
	if (!x || !kiln_dtype_is_float(g->val[x]->type.dtype) || !ir_type_eq(t, &g->val[x]->type))
		return KILN_OK;
	ir_node *one = reader(g, e->out[0]);
	if (!one || one->op != KILN_OP_ADD || with_const(g, one, t->rank, 1, false) != e->out[0])
		return KILN_OK;
	ir_node *nodes[16] = {a, e, one}, *top = NULL;
	int n = 3;
	if (!half_x_times(g, one->out[0], x, &top, nodes, &n))
		return KILN_OK;
	return gelu_done(g, x, top, nodes, n, false, changed);
}

/* v == x*x*x in either association (after pow_const: Pow(x, 3) is that). */
static bool cube(const kiln_graph *g, uint32_t v, uint32_t x, ir_node **nodes, int *n)
{
	ir_node *m = def(g, v, KILN_OP_MUL);
	if (!m || !single(g, v))
		return false;
	for (int i = 0; i < 2; i++) {
		ir_node *sq = def(g, m->in[i], KILN_OP_MUL);
		if (m->in[1 - i] == x && sq && single(g, m->in[i]) && sq->in[0] == x && sq->in[1] == x) {
			nodes[(*n)++] = sq;
			nodes[(*n)++] = m;
			return true;
		}
	}
	return false;
}

/* From Tanh(s): s = sqrt(2/pi) * (x + 0.044715 * x^3); then 1 + tanh,
 * times x * 0.5. */
static kiln_status gelu_tanh(kiln_graph *g, ir_node *th, bool *changed)
{
	const ir_type *t = &g->val[th->in[0]]->type;
	int r = t->rank;
	ir_node *s = def(g, th->in[0], KILN_OP_MUL);
	if (!s || !single(g, th->in[0]))
		return KILN_OK;
	uint32_t rv = with_const(g, s, r, sqrt(2 / M_PI), true);
	ir_node *sum = rv ? def(g, rv, KILN_OP_ADD) : NULL;
	if (!sum || !single(g, rv))
		return KILN_OK;
	for (int i = 0; i < 2; i++) {
		uint32_t x = sum->in[i], qv = sum->in[1 - i];
		ir_node *q = def(g, qv, KILN_OP_MUL), *nodes[16];
		int n = 0;
		if (!q || !single(g, qv) || !kiln_dtype_is_float(g->val[x]->type.dtype) ||
		    !ir_type_eq(t, &g->val[x]->type))
			continue;
		uint32_t p = with_const(g, q, r, 0.044715, true);
		if (!p || !cube(g, p, x, nodes, &n))
			continue;
		nodes[n++] = q, nodes[n++] = sum, nodes[n++] = s, nodes[n++] = th;
		ir_node *one = reader(g, th->out[0]), *top = NULL;
		if (!one || one->op != KILN_OP_ADD || with_const(g, one, r, 1, false) != th->out[0])
			return KILN_OK;
		nodes[n++] = one;
		if (!half_x_times(g, one->out[0], x, &top, nodes, &n))
			return KILN_OK;
		return gelu_done(g, x, top, nodes, n, true, changed);
	}
	return KILN_OK;
}

kiln_status pass_nnfuse(kiln_graph *g, const pass_opts *o)
{
	(void)o;
	bool changed = false;
	uint32_t count = g->nnode;
	for (uint32_t i = 0; i < count && g->status == KILN_OK; i++)
		if (!g->node[i]->dead && g->node[i]->op == KILN_OP_POW)
			pow_const(g, g->node[i], &changed);
	count = g->nnode;
	for (uint32_t i = 0; i < count && g->status == KILN_OK; i++) {
		ir_node *n = g->node[i];
		if (n->dead)
			continue;
		if (n->op == KILN_OP_REDUCE_MEAN)
			layer_norm(g, n, &changed);
		else if (n->op == KILN_OP_ERF)
			gelu_erf(g, n, &changed);
		else if (n->op == KILN_OP_TANH)
			gelu_tanh(g, n, &changed);
	}
	if (g->status != KILN_OK || !changed)
		return g->status;
	/* the new nodes sit at the end of the schedule, after their readers */
	if (ir_compact(g) != KILN_OK)
		return g->status;
	return ir_toposort(g);
}
