/*
 * grad.c: the gradient rules, one short function per op, and the table that
 * the autodiff driver (autodiff.c) indexes by op.
 *
 * The key idea, from tinygrad and ggml: a rule builds its result from
 * ordinary forward ops through the DSL builders, placed at the forward
 * node's source location, so the backward graph is a graph like any other:
 * it verifies, prints, folds, runs in the interpreter and compiles on every
 * backend, and a shape error in a rule names the user's line.  Rules read
 * forward values (inputs and outputs) directly; whether those are stored
 * or recomputed is the memory planner's decision, not the rules'.
 *
 * A rule may return a gradient in the broadcast shape of the node's output
 * (Add's dy for both inputs); the driver, not the rule, sums it back to the
 * input's shape.  Rules for conv, pooling, normalisation, softmax, dropout
 * and the losses live in grad_nn.c.  A rule returns the graph's status: the
 * DSL builders turn into no-ops after the first error, so rules need no
 * error checks of their own between steps.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/grad.h" /* the rules' shorthand: ADD, MUL, K, ... */

/* ---- helpers shared with grad_nn.c ---------------------------------------- */

const ir_type *pass_gtype(const kiln_graph *g, uint32_t v)
{
	return &g->val[v]->type;
}

uint32_t pass_gconst(kiln_graph *g, kiln_loc loc, kiln_tensor *t)
{
	if (!t) {
		ir_errorf_at(g, loc, KILN_ENOMEM, "gradient: out of memory for a constant");
		return 0;
	}
	uint32_t c = kiln_constant_at(g, loc, t);
	kiln_tensor_free(t);
	return c;
}

/* Reshape to the dims of `to`: fixed dims as numbers, a symbolic dim as 0
 * (copy) when v has the same dim at that index, else as the one -1. */
uint32_t pass_greshape(kiln_graph *g, kiln_loc loc, uint32_t v, const ir_type *to)
{
	if (!v || g->status != KILN_OK)
		return 0;
	const ir_type *t = pass_gtype(g, v);
	int64_t dims[KILN_MAX_RANK];
	bool same = t->rank == to->rank, infer = false;
	for (int i = 0; i < to->rank; i++) {
		same = same && t->dim[i] == to->dim[i];
		if (to->dim[i] >= 0)
			dims[i] = to->dim[i];
		else if (i < t->rank && t->dim[i] == to->dim[i])
			dims[i] = 0;
		else if (!infer)
			dims[i] = -1, infer = true;
		else {
			char a[128], b[128];
			ir_errorf_at(g, loc, KILN_EUNSUPPORTED, "gradient: cannot reshape %s to %s "
			             "with two symbolic dims moving", ir_type_str(g, t, a, sizeof a),
			             ir_type_str(g, to, b, sizeof b));
			return 0;
		}
	}
	return same ? v : kiln_reshape_at(g, loc, v, to->rank, dims);
}

/* Broadcasts v to the shape of value like with Expand; an axis where v
 * already has the right size stays 1 in Expand's shape, so only the axes v
 * broadcasts along need fixed sizes.  Otherwise Where over like == like
 * (true or not, both branches are v) does the broadcast. */
uint32_t pass_gbcast(kiln_graph *g, kiln_loc loc, uint32_t v, uint32_t like)
{
	if (!v || g->status != KILN_OK)
		return 0;
	const ir_type *t = pass_gtype(g, v), *to = pass_gtype(g, like);
	int64_t dims[KILN_MAX_RANK];
	bool same = t->rank == to->rank, fixed = true;
	for (int i = 0; i < to->rank; i++) {
		int j = i - (to->rank - t->rank);
		bool has = j >= 0 && t->dim[j] == to->dim[i];
		same = same && has;
		dims[i] = has ? 1 : to->dim[i];
		fixed = fixed && dims[i] >= 0;
	}
	if (same)
		return v;
	if (fixed)
		return kiln_expand_at(g, loc, v, to->rank, dims);
	return kiln_where_at(g, loc, kiln_equal_at(g, loc, like, like), v, v);
}

/* The number of elements of x over the axes in mask[], as a scalar of x's
 * dtype: a constant when those dims are fixed, else the fixed part times
 * the symbolic dims read from Shape(x) when the graph runs, so a mean over
 * a symbolic batch differentiates in the interpreter and in compiled code
 * alike (Shape, Gather and Cast are ordinary ops on both). */
uint32_t pass_gcount(kiln_graph *g, kiln_loc loc, uint32_t x, const bool *mask)
{
	const ir_type *xt = pass_gtype(g, x);
	double fixed = 1;
	uint32_t shp = 0, cnt = 0;
	for (int d = 0; d < xt->rank; d++) {
		if (!mask[d])
			continue;
		if (xt->dim[d] >= 0) {
			fixed *= (double)xt->dim[d];
			continue;
		}
		if (!shp)
			shp = kiln_cast_at(g, loc, kiln_shape_of_at(g, loc, x), xt->dtype);
		uint32_t dim = kiln_gather_at(g, loc, shp, kiln_scalar_at(g, loc, KILN_I64, d), 0);
		cnt = cnt ? kiln_mul_at(g, loc, cnt, dim) : dim;
	}
	uint32_t k = kiln_scalar_at(g, loc, xt->dtype, fixed);
	return !cnt ? k : fixed == 1 ? cnt : kiln_mul_at(g, loc, cnt, k);
}

/* Sum (or mean) over mask[] of x reduced to dy: dy gets its reduced axes
 * back as 1s, is divided by the count for a mean, then broadcast to x. */
uint32_t pass_greduce_back(kiln_graph *g, kiln_loc loc, uint32_t dy, uint32_t x,
                           const bool *mask, bool keepdims, bool mean)
{
	if (!dy || g->status != KILN_OK)
		return 0;
	const ir_type *xt = pass_gtype(g, x);
	int64_t axes[KILN_MAX_RANK];
	int na = 0;
	for (int d = 0; d < xt->rank; d++)
		if (mask[d])
			axes[na++] = d;
	if (!keepdims && na)
		dy = kiln_unsqueeze_at(g, loc, dy, na, axes);
	if (mean)
		dy = kiln_div_at(g, loc, dy, pass_gcount(g, loc, x, mask));
	return pass_gbcast(g, loc, dy, x);
}

/* ---- elementwise unary ------------------------------------------------------ */

static kiln_status gneg(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = NEG(dy[0]);
	return g->status;
}

static kiln_status gidentity(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	(void)n;
	dx[0] = dy[0];
	return g->status;
}

/* sign(x) with sign(0) = 0, as PyTorch's abs backward */
static kiln_status gabs(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t x = n->in[0];
	uint32_t neg = kiln_where_at(g, L, kiln_less_at(g, L, x, K(0)), NEG(dy[0]), K(0));
	dx[0] = kiln_where_at(g, L, kiln_greater_at(g, L, x, K(0)), dy[0], neg);
	return g->status;
}

static kiln_status gexp(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = MUL(dy[0], n->out[0]);
	return g->status;
}

static kiln_status glog(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = DIV(dy[0], n->in[0]);
	return g->status;
}

static kiln_status gsqrt(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = DIV(MUL(dy[0], K(0.5)), n->out[0]);
	return g->status;
}

static kiln_status grecip(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = NEG(MUL(dy[0], MUL(n->out[0], n->out[0])));
	return g->status;
}

static kiln_status gsin(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = MUL(dy[0], kiln_cos_at(g, L, n->in[0]));
	return g->status;
}

static kiln_status gcos(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = NEG(MUL(dy[0], kiln_sin_at(g, L, n->in[0])));
	return g->status;
}

/* atan' = 1 / (1 + x^2); asin' = 1 / sqrt(1 - x^2); acos' = -asin' */
static kiln_status gatan(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t x = n->in[0];
	dx[0] = DIV(dy[0], kiln_add_at(g, L, K(1), MUL(x, x)));
	return g->status;
}

static kiln_status gasin(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t x = n->in[0], d = kiln_sqrt_at(g, L, kiln_sub_at(g, L, K(1), MUL(x, x)));
	dx[0] = n->op == KILN_OP_ACOS ? NEG(DIV(dy[0], d)) : DIV(dy[0], d);
	return g->status;
}

static kiln_status grelu(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = ZERO_WHERE(kiln_greater_at(g, L, n->in[0], K(0)), dy[0]);
	return g->status;
}

static kiln_status gsigmoid(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t y = n->out[0];
	dx[0] = MUL(dy[0], MUL(y, SUB(K(1), y)));
	return g->status;
}

static kiln_status gtanh(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t y = n->out[0];
	dx[0] = MUL(dy[0], SUB(K(1), MUL(y, y)));
	return g->status;
}

/* d erf(x) = 2/sqrt(pi) exp(-x^2) */
static kiln_status gerf(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t x = n->in[0];
	uint32_t e = kiln_exp_at(g, L, NEG(MUL(x, x)));
	dx[0] = MUL(dy[0], MUL(e, K(2 / sqrt(M_PI))));
	return g->status;
}

/* An op with a formula in ir_scalar_table (Gelu, Softplus, ...): dy times
 * the formula's symbolic derivative, written out as graph nodes; only the
 * instructions the derivative reads are emitted. */
static uint32_t emit(kiln_graph *g, const ir_node *n, const ir_sexpr *e, int i, uint32_t *v)
{
	if (v[i])
		return v[i];
	const ir_sinst *s = &e->i[i];
	uint32_t a = s->op > IR_S_K ? emit(g, n, e, s->a, v) : 0;
	uint32_t b = s->op >= IR_S_ADD ? emit(g, n, e, s->b, v) : 0;
	switch (s->op) {
	case IR_S_X: return v[i] = n->in[0];
	case IR_S_K: return v[i] = K(s->k);
	case IR_S_NEG: return v[i] = NEG(a);
	case IR_S_ABS: return v[i] = kiln_abs_at(g, L, a);
	case IR_S_EXP: return v[i] = kiln_exp_at(g, L, a);
	case IR_S_LOG: return v[i] = kiln_log_at(g, L, a);
	case IR_S_SQRT: return v[i] = kiln_sqrt_at(g, L, a);
	case IR_S_TANH: return v[i] = kiln_tanh_at(g, L, a);
	case IR_S_ERF: return v[i] = kiln_erf_at(g, L, a);
	case IR_S_ADD: return v[i] = ADD(a, b);
	case IR_S_SUB: return v[i] = SUB(a, b);
	case IR_S_MUL: return v[i] = MUL(a, b);
	case IR_S_DIV: return v[i] = DIV(a, b);
	case IR_S_MAX: return v[i] = kiln_max_at(g, L, a, b);
	case IR_S_MIN: return v[i] = kiln_min_at(g, L, a, b);
	case IR_S_LT: return v[i] = kiln_less_at(g, L, a, b);
	case IR_S_SELECT: return v[i] = kiln_where_at(g, L, a, b, emit(g, n, e, s->c, v));
	}
	return 0;
}

static kiln_status gformula(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	ir_sexpr e;
	uint32_t v[IR_SEXPR_MAX] = {0};
	kiln_status st = ir_scalar_deriv(n, &e);
	if (st)
		return ir_errorf(g, n, st, "gradient: cannot build the derivative of the formula");
	dx[0] = MUL(dy[0], emit(g, n, &e, e.root, v));
	return g->status;
}

/* Passes the gradient where min <= x <= max (PyTorch's clamp backward). */
static kiln_status gclip(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t x = n->in[0], d = dy[0];
	if (ir_attr_get(n, "min"))
		d = kiln_where_at(g, L, kiln_less_at(g, L, x, K(ir_attr_float(n, "min", 0))), K(0), d);
	if (ir_attr_get(n, "max"))
		d = kiln_where_at(g, L, kiln_greater_at(g, L, x, K(ir_attr_float(n, "max", 0))),
		                  K(0), d);
	dx[0] = d;
	return g->status;
}

/* float -> float casts carry the gradient back in the input's dtype */
static kiln_status gcast(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	kiln_dtype from = pass_gtype(g, n->in[0])->dtype;
	if (kiln_dtype_is_float(from) && kiln_dtype_is_float(pass_gtype(g, dy[0])->dtype))
		dx[0] = kiln_cast_at(g, L, dy[0], from);
	return g->status;
}

/* ---- elementwise binary ------------------------------------------------------ */

static kiln_status gadd(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	(void)n;
	dx[0] = dx[1] = dy[0];
	return g->status;
}

static kiln_status gsub(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = dy[0];
	dx[1] = NEG(dy[0]);
	return g->status;
}

static kiln_status gmul(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = MUL(dy[0], n->in[1]);
	dx[1] = MUL(dy[0], n->in[0]);
	return g->status;
}

static kiln_status gdiv(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = DIV(dy[0], n->in[1]);
	dx[1] = NEG(DIV(MUL(dy[0], n->out[0]), n->in[1]));
	return g->status;
}

/* d a^b = b a^(b-1) da + a^b log(a) db; the exponent's gradient is 0
 * where a == 0, as PyTorch masks it. */
static kiln_status gpow(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t a = n->in[0], b = n->in[1], y = n->out[0];
	uint32_t am1 = kiln_pow_at(g, L, a, SUB(b, K(1)));
	dx[0] = MUL(dy[0], MUL(b, am1));
	uint32_t zero = kiln_equal_at(g, L, a, K(0));
	uint32_t lg = kiln_log_at(g, L, kiln_where_at(g, L, zero, K(1), a));
	dx[1] = MUL(dy[0], MUL(y, lg));
	return g->status;
}

/* Max and Min: each input equal to the result gets an equal share of dy,
 * so ties split it evenly (torch.maximum's rule). */
static kiln_status gselect(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	kiln_dtype dt = pass_gtype(g, n->out[0])->dtype;
	uint32_t count = 0, *hit = calloc(n->nin + 1, sizeof *hit);
	if (!hit)
		return ir_errorf(g, n, KILN_ENOMEM, "gradient: out of memory");
	for (uint32_t k = 0; k < n->nin; k++) {
		hit[k] = kiln_cast_at(g, L, kiln_equal_at(g, L, n->in[k], n->out[0]), dt);
		count = count ? ADD(count, hit[k]) : hit[k];
	}
	uint32_t share = DIV(dy[0], count);
	for (uint32_t k = 0; k < n->nin; k++)
		dx[k] = MUL(share, hit[k]);
	free(hit);
	return g->status;
}

static kiln_status gwhere(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t zero = kiln_scalar_at(g, L, pass_gtype(g, dy[0])->dtype, 0);
	dx[1] = kiln_where_at(g, L, n->in[0], dy[0], zero);
	dx[2] = kiln_where_at(g, L, n->in[0], zero, dy[0]);
	return g->status;
}

/* ---- reductions ---------------------------------------------------------------- */

/* The reduced axes of a Reduce node over rank; false: it is an identity. */
static bool reduced(const ir_node *n, int rank, bool *mask)
{
	const int64_t *axes;
	uint32_t na = ir_attr_ints(n, "axes", &axes);
	for (int d = 0; d < rank; d++)
		mask[d] = na == 0;
	for (uint32_t k = 0; k < na; k++)
		mask[axes[k] < 0 ? axes[k] + rank : axes[k]] = true;
	return na || !ir_attr_int(n, "noop_with_empty_axes", 0);
}

static kiln_status greduce(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	bool mask[KILN_MAX_RANK];
	if (!reduced(n, pass_gtype(g, n->in[0])->rank, mask))
		return gidentity(g, n, dy, dx);
	dx[0] = pass_greduce_back(g, L, dy[0], n->in[0], mask, ir_attr_int(n, "keepdims", 1),
	                          n->op == KILN_OP_REDUCE_MEAN);
	return g->status;
}

/* ReduceMax/Min: dy goes to the elements equal to the result, split evenly
 * among ties (amax's rule). */
static kiln_status gextreme(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]);
	bool mask[KILN_MAX_RANK], keep = ir_attr_int(n, "keepdims", 1);
	if (!reduced(n, xt->rank, mask))
		return gidentity(g, n, dy, dx);
	int64_t axes[KILN_MAX_RANK];
	int na = 0;
	for (int d = 0; d < xt->rank; d++)
		if (mask[d])
			axes[na++] = d;
	uint32_t y = n->out[0], d = dy[0];
	if (!keep) {
		y = kiln_unsqueeze_at(g, L, y, na, axes);
		d = kiln_unsqueeze_at(g, L, d, na, axes);
	}
	uint32_t hit = kiln_cast_at(g, L, kiln_equal_at(g, L, n->in[0], y), xt->dtype);
	uint32_t count = kiln_reduce_sum_at(g, L, hit, na, axes, true);
	dx[0] = MUL(hit, DIV(d, count));
	return g->status;
}

static kiln_status ggap(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	bool mask[KILN_MAX_RANK];
	for (int i = 0; i < pass_gtype(g, n->in[0])->rank; i++)
		mask[i] = i >= 2;
	dx[0] = pass_greduce_back(g, L, dy[0], n->in[0], mask, true, true);
	return g->status;
}

/* ---- linear algebra -------------------------------------------------------------- */

/* Swaps the last two axes. */
static uint32_t tr(kiln_graph *g, kiln_loc loc, uint32_t v)
{
	int r = pass_gtype(g, v)->rank;
	int64_t perm[KILN_MAX_RANK];
	for (int i = 0; i < r; i++)
		perm[i] = i;
	perm[r - 1] = r - 2, perm[r - 2] = r - 1;
	return kiln_transpose_at(g, loc, v, r, perm);
}

/* NumPy matmul: 1-D operands are lifted to matrices (a: [1,K], b: [K,1])
 * and the matching axis of dy restored, so both cases reduce to
 * da = dy b^T, db = a^T dy; the driver sums broadcast batch dims. */
static kiln_status gmatmul(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t a = n->in[0], b = n->in[1], d = dy[0];
	bool a1 = pass_gtype(g, a)->rank == 1, b1 = pass_gtype(g, b)->rank == 1;
	if (a1 && b1) {
		dx[0] = MUL(d, b);
		dx[1] = MUL(d, a);
		return g->status;
	}
	int64_t m2 = -2, m1 = -1, z = 0;
	if (a1) {
		a = kiln_unsqueeze_at(g, L, a, 1, &z);
		d = kiln_unsqueeze_at(g, L, d, 1, &m2);
	}
	if (b1) {
		b = kiln_unsqueeze_at(g, L, b, 1, &m1);
		d = kiln_unsqueeze_at(g, L, d, 1, &m1);
	}
	uint32_t da = kiln_matmul_at(g, L, d, tr(g, L, b));
	uint32_t db = kiln_matmul_at(g, L, tr(g, L, a), d);
	dx[0] = a1 ? kiln_squeeze_at(g, L, da, 1, &m2) : da;
	dx[1] = b1 ? kiln_squeeze_at(g, L, db, 1, &m1) : db;
	return g->status;
}

/* Y = alpha A' B' + beta C: each gradient is itself one Gemm whose
 * transposes follow from transA/transB. */
static kiln_status ggemm(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	uint32_t a = n->in[0], b = n->in[1], d = dy[0];
	bool ta = ir_attr_int(n, "transA", 0), tb = ir_attr_int(n, "transB", 0);
	double alpha = ir_attr_float(n, "alpha", 1), beta = ir_attr_float(n, "beta", 1);
	dx[0] = ta ? kiln_gemm_at(g, L, b, d, 0, alpha, 0, tb, true)
	           : kiln_gemm_at(g, L, d, b, 0, alpha, 0, false, !tb);
	dx[1] = tb ? kiln_gemm_at(g, L, d, a, 0, alpha, 0, true, ta)
	           : kiln_gemm_at(g, L, a, d, 0, alpha, 0, !ta, false);
	if (n->nin > 2)
		dx[2] = beta == 1 ? d : MUL(d, K(beta));
	return g->status;
}

/* ---- data movement ----------------------------------------------------------------- */

/* Reshape, Flatten, Squeeze, Unsqueeze: the gradient takes x's shape back. */
static kiln_status greshape(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	dx[0] = pass_greshape(g, L, dy[0], pass_gtype(g, n->in[0]));
	return g->status;
}

static kiln_status gtranspose(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	int r = pass_gtype(g, n->in[0])->rank;
	const int64_t *p;
	int64_t inv[KILN_MAX_RANK];
	uint32_t np = ir_attr_ints(n, "perm", &p);
	for (int i = 0; i < r; i++) /* no perm: reversed axes, its own inverse */
		inv[np ? p[i] : i] = np ? i : r - 1 - i;
	dx[0] = kiln_transpose_at(g, L, dy[0], r, inv);
	return g->status;
}

/* Zeros shaped like value v (a fixed shape is needed for a constant). */
static uint32_t zeros_like(kiln_graph *g, kiln_loc loc, uint32_t v)
{
	const ir_type *t = pass_gtype(g, v);
	if (!ir_type_concrete(t)) {
		ir_errorf_at(g, loc, KILN_EUNSUPPORTED, "gradient: zeros of symbolic shape %s",
		             ir_type_str(g, t, (char[128]){0}, 128));
		return 0;
	}
	return pass_gconst(g, loc, kiln_tensor_new(t->dtype, t->rank, t->dim));
}

static int axis_of(const ir_node *n, int rank, int64_t dflt)
{
	int64_t a = ir_attr_int(n, "axis", dflt);
	return (int)(a < 0 ? a + rank : a);
}

static kiln_status gconcat(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	int axis = axis_of(n, pass_gtype(g, n->out[0])->rank, 0);
	int64_t *sizes = malloc((n->nin + 1) * sizeof *sizes);
	if (!sizes)
		return ir_errorf(g, n, KILN_ENOMEM, "gradient: out of memory");
	for (uint32_t k = 0; k < n->nin; k++)
		sizes[k] = pass_gtype(g, n->in[k])->dim[axis];
	kiln_split_at(g, L, dy[0], axis, (int)n->nin, sizes, dx);
	free(sizes);
	return g->status;
}

static kiln_status gsplit(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	int axis = axis_of(n, pass_gtype(g, n->in[0])->rank, 0);
	uint32_t *parts = malloc((n->nout + 1) * sizeof *parts);
	if (!parts)
		return ir_errorf(g, n, KILN_ENOMEM, "gradient: out of memory");
	for (uint32_t k = 0; k < n->nout; k++)
		parts[k] = dy[k] ? dy[k] : zeros_like(g, L, n->out[k]);
	dx[0] = kiln_concat_at(g, L, (int)n->nout, parts, axis);
	free(parts);
	return g->status;
}

static kiln_status gexpand(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	(void)n;
	dx[0] = dy[0]; /* broadcast: the driver sums it back */
	return g->status;
}

/* Constant Pad: the gradient is the interior of dy; a negative pad (a
 * crop) becomes a zero pad of dy first. */
static kiln_status gpad(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]);
	const int64_t *p;
	int r = xt->rank;
	ir_attr_ints(n, "pads", &p);
	if (strcmp(ir_attr_str(n, "mode", "constant"), "constant"))
		return ir_errorf(g, n, KILN_EUNSUPPORTED, "no gradient for Pad mode '%s' (only "
		                 "constant)", ir_attr_str(n, "mode", ""));
	int64_t crop[2 * KILN_MAX_RANK], st[KILN_MAX_RANK], en[KILN_MAX_RANK], ax[KILN_MAX_RANK];
	bool any = false;
	for (int i = 0; i < 2 * r; i++)
		any |= (crop[i] = p[i] < 0 ? -p[i] : 0) != 0;
	uint32_t d = any ? kiln_pad_at(g, L, dy[0], r, crop, "constant", 0) : dy[0];
	int ns = 0;
	for (int i = 0; i < r; i++) {
		if (p[i] <= 0 && p[r + i] <= 0)
			continue;
		if (xt->dim[i] < 0)
			return ir_errorf(g, n, KILN_EUNSUPPORTED, "gradient: padded axis %d is symbolic", i);
		ax[ns] = i, st[ns] = p[i] > 0 ? p[i] : 0, en[ns] = st[ns] + xt->dim[i], ns++;
	}
	dx[0] = ns ? kiln_slice_at(g, L, d, ns, st, en, ax, NULL) : d;
	return g->status;
}

/* Slice backward, one sliced axis at a time: a negative step is reversed,
 * a step s > 1 spreads dy out with s-1 zeros after each element (unsqueeze,
 * pad, merge), and padding puts the result at the first index. */
static uint32_t unslice_axis(kiln_graph *g, const ir_node *n, uint32_t d, int a, int64_t first,
                             int64_t step, int64_t dim)
{
	const ir_type *t = pass_gtype(g, d);
	int64_t cnt = t->dim[a], r = t->rank, big = INT64_MIN, one = -1, up = a + 1;
	if (step < 0) {
		int64_t ax = a, st = -1;
		d = kiln_slice_at(g, L, d, 1, &one, &big, &ax, &st);
		first += (cnt - 1) * step, step = -step;
	}
	if (step > 1) {
		int64_t pads[2 * KILN_MAX_RANK] = {0};
		pads[r + 1 + up] = step - 1;
		d = kiln_unsqueeze_at(g, L, d, 1, &up);
		d = kiln_pad_at(g, L, d, (int)r + 1, pads, "constant", 0);
		ir_type to = *t;
		to.dim[a] = cnt * step;
		d = pass_greshape(g, L, d, &to);
	}
	int64_t len = step > 1 ? cnt * step : cnt, pads[2 * KILN_MAX_RANK] = {0};
	if (first + len > dim) { /* the spread tail runs past the end */
		int64_t z = 0, e = dim - first, ax = a;
		d = kiln_slice_at(g, L, d, 1, &z, &e, &ax, NULL);
		len = dim - first;
	}
	pads[a] = first, pads[r + a] = dim - first - len;
	return kiln_pad_at(g, L, d, (int)r, pads, "constant", 0);
}

static kiln_status gslice(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]);
	const int64_t *st, *ax, *sp, *en;
	uint64_t sd, ed;
	uint32_t ns = ir_attr_dims(n, "starts", &st, &sd), na = ir_attr_ints(n, "axes", &ax);
	uint32_t nsp = ir_attr_ints(n, "steps", &sp);
	uint32_t d = dy[0];
	ir_attr_dims(n, "ends", &en, &ed);
	if (sd | ed) /* its length is a symbol: the padding back would be too */
		return ir_errorf(g, n, KILN_EUNSUPPORTED, "gradient of Slice needs a fixed start "
		                 "and end, not symbolic dims");
	for (uint32_t k = 0; k < ns; k++) {
		int a = (int)(na ? (ax[k] < 0 ? ax[k] + xt->rank : ax[k]) : k);
		int64_t dim = xt->dim[a], step = nsp ? sp[k] : 1;
		if (dim < 0 || pass_gtype(g, n->out[0])->dim[a] < 0)
			return ir_errorf(g, n, KILN_EUNSUPPORTED, "gradient of Slice needs a fixed "
			                 "size on sliced axis %d of %s", a,
			                 ir_type_str(g, xt, (char[128]){0}, 128));
		int64_t s = st[k] < 0 ? st[k] + dim : st[k], hi = step > 0 ? dim : dim - 1;
		s = s < 0 ? 0 : s > hi ? hi : s;
		if (pass_gtype(g, d)->dim[a] == 0) { /* an empty slice */
			d = zeros_like(g, L, n->in[0]);
			break;
		}
		d = unslice_axis(g, n, d, a, s, step, dim);
	}
	dx[0] = d;
	return g->status;
}

/* Gather backward is a scatter-add, built as a one-hot matmul so repeated
 * indices sum: onehot[j, i] = (idx[j] == i) over the J indices and the
 * gathered axis, then dx[o, i, r] = sum_j onehot[j, i] dy[o, j, r].  It
 * costs J x dim memory; a ScatterAdd op would not (TODO(#5)). */
static kiln_status ggather(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]), *it = pass_gtype(g, n->in[1]);
	int axis = axis_of(n, xt->rank, 0);
	int64_t dim = xt->dim[axis], J = 1, O = 1, R = 1;
	for (int i = 0; i < it->rank; i++)
		J = J >= 0 && it->dim[i] >= 0 ? J * it->dim[i] : -1;
	for (int i = 0; i < xt->rank; i++) {
		int64_t *p = i < axis ? &O : &R;
		if (i != axis)
			*p = *p >= 0 && xt->dim[i] >= 0 ? *p * xt->dim[i] : -1;
	}
	if (dim < 0 || J < 0 || R < 0 || (O < 0 && axis != 1))
		return ir_errorf(g, n, KILN_EUNSUPPORTED, "gradient of Gather needs fixed indices "
		                 "and fixed dims apart from a leading batch dim");
	kiln_tensor *ar = kiln_tensor_new(it->dtype, 2, (int64_t[]){1, dim});
	for (int64_t i = 0; ar && i < dim; i++)
		ir_store_i64(ar, i, i);
	uint32_t idx = n->in[1], zero = kiln_scalar_at(g, L, it->dtype, 0);
	uint32_t wrap = ADD(idx, kiln_scalar_at(g, L, it->dtype, (double)dim));
	idx = kiln_where_at(g, L, kiln_less_at(g, L, idx, zero), wrap, idx);
	idx = kiln_reshape_at(g, L, idx, 2, (int64_t[]){J, 1});
	uint32_t hot = kiln_equal_at(g, L, idx, pass_gconst(g, L, ar));
	hot = kiln_cast_at(g, L, hot, xt->dtype);
	ir_type flat = {xt->dtype, 3, {O >= 0 ? O : xt->dim[0], J, R}};
	uint32_t d3 = pass_greshape(g, L, dy[0], &flat);
	uint32_t s = kiln_matmul_at(g, L, tr(g, L, hot), d3);
	dx[0] = pass_greshape(g, L, s, xt);
	return g->status;
}

pass_grad_fn pass_grad_rule(kiln_op op)
{
	if (op >= KILN_OP_COUNT)
		return NULL;
	return pass_grad_table[op] ? pass_grad_table[op] : ir_scalar_table[op] ? gformula : NULL;
}

/* ---- the table ---------------------------------------------------------------------- */

/* RNN, GRU and LSTM: pass_grad unrolls them into ordinary ops first
 * (rnn_unroll.c), so a node reaches this rule only if that was skipped. */
static kiln_status grnn(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	(void)dy, (void)dx;
	return ir_errorf(g, n, KILN_EUNSUPPORTED, "a fused %s is differentiated as its unrolled "
	                 "time steps (pass_rnn_unroll), which did not run", ir_op(n->op)->onnx);
}

const pass_grad_fn pass_grad_table[KILN_OP_COUNT] = {
	[KILN_OP_RNN] = grnn, [KILN_OP_GRU] = grnn, [KILN_OP_LSTM] = grnn,
	[KILN_OP_NEG] = gneg, [KILN_OP_ABS] = gabs, [KILN_OP_EXP] = gexp, [KILN_OP_LOG] = glog,
	[KILN_OP_SQRT] = gsqrt, [KILN_OP_RECIPROCAL] = grecip, [KILN_OP_SIN] = gsin,
	[KILN_OP_COS] = gcos, [KILN_OP_RELU] = grelu,
	[KILN_OP_ATAN] = gatan, [KILN_OP_ASIN] = gasin, [KILN_OP_ACOS] = gasin,
	[KILN_OP_SIGMOID] = gsigmoid, [KILN_OP_TANH] = gtanh,
	[KILN_OP_ERF] = gerf, [KILN_OP_CLIP] = gclip, [KILN_OP_CAST] = gcast,
	[KILN_OP_IDENTITY] = gidentity,

	[KILN_OP_ADD] = gadd, [KILN_OP_SUB] = gsub, [KILN_OP_MUL] = gmul, [KILN_OP_DIV] = gdiv,
	[KILN_OP_POW] = gpow, [KILN_OP_MAX] = gselect, [KILN_OP_MIN] = gselect,
	[KILN_OP_WHERE] = gwhere,

	[KILN_OP_REDUCE_SUM] = greduce, [KILN_OP_REDUCE_MEAN] = greduce,
	[KILN_OP_REDUCE_MAX] = gextreme, [KILN_OP_REDUCE_MIN] = gextreme,

	[KILN_OP_MATMUL] = gmatmul, [KILN_OP_GEMM] = ggemm,

	[KILN_OP_CONV] = pass_grad_conv, [KILN_OP_CONV_TRANSPOSE] = pass_grad_conv_transpose,
	[KILN_OP_MAX_POOL] = pass_grad_max_pool, [KILN_OP_AVERAGE_POOL] = pass_grad_avg_pool,
	[KILN_OP_GLOBAL_AVERAGE_POOL] = ggap,

	[KILN_OP_BATCH_NORM] = pass_grad_batch_norm, [KILN_OP_LAYER_NORM] = pass_grad_layer_norm,
	[KILN_OP_SOFTMAX] = pass_grad_softmax, [KILN_OP_LOG_SOFTMAX] = pass_grad_softmax,

	[KILN_OP_RESHAPE] = greshape, [KILN_OP_FLATTEN] = greshape, [KILN_OP_SQUEEZE] = greshape,
	[KILN_OP_UNSQUEEZE] = greshape, [KILN_OP_TRANSPOSE] = gtranspose,
	[KILN_OP_CONCAT] = gconcat, [KILN_OP_SPLIT] = gsplit, [KILN_OP_SLICE] = gslice,
	[KILN_OP_GATHER] = ggather, [KILN_OP_EXPAND] = gexpand, [KILN_OP_PAD] = gpad,

	[KILN_OP_DROPOUT] = pass_grad_dropout,
	[KILN_OP_SOFTMAX_CE] = pass_grad_loss, [KILN_OP_NLL_LOSS] = pass_grad_loss,
};
