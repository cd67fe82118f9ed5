/*
 * onnx_compose.c: ONNX ops kiln imports as a few of its own, because they
 * are exactly that composition (ONNX's own function bodies or reference
 * formulas), so the interpreter, the lowering, the gradients and export get
 * them for nothing:
 *
 *   ReduceL1(x)         ReduceSum(Abs(x))
 *   ReduceL2(x)         Sqrt(ReduceSum(x * x))
 *   ReduceSumSquare(x)  ReduceSum(x * x)
 *   ReduceLogSum(x)     Log(ReduceSum(x))
 *   ReduceLogSumExp(x)  Log(ReduceSum(Exp(x - m))) + m, m = ReduceMax(x): no
 *                       overflow for large x
 *   ArgMin(x)           ArgMax(-x), ArgMax(-1 - x) for integers (no overflow:
 *                       a decreasing map keeps the first and last index)
 *
 * RNN, GRU and LSTM are kiln ops imported by onnx_rnn.c (onnx_ops.c's table).
 * The reductions keep the node's axes, keepdims and noop_with_empty_axes.
 * Export writes the composition, which imports back to the same graph.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "frontend/onnx/onnx.h"

/* An extra node op(in) with d's attributes of op's schema (copy), inferred;
 * its result, or 0 on a problem. */
/* The end of every step: n (made, its attributes set: ok) becomes d's own
 * result when suffix is NULL (add_node infers it), else is inferred now;
 * its result, or 0 after marking d failed. */
static uint32_t finish(onnx_imp *c, onnx_nd *d, ir_node *n, bool ok, const char *suffix)
{
	if (!n || !ok) {
		d->failed = true;
		return 0;
	}
	if (!suffix) {
		d->n = n;
		return n->out[0];
	}
	return onnx_infer(c, d, n) ? n->out[0] : (d->failed = true, 0);
}

static uint32_t step(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t nin, const uint32_t *in,
                     bool copy, const char *suffix)
{
	for (uint32_t i = 0; i < nin; i++)
		if (!in[i] || d->failed)
			return 0;
	ir_node *n = onnx_extra(c, d, op, nin, in, suffix);
	return finish(c, d, n, n && (!copy || onnx_copy_attrs_to(c, d, n, op, NULL)), suffix);
}

/* The reduction over d's axes of x (ReduceSum or ReduceMax); keep forces
 * keepdims=1. */
static uint32_t reduce(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t x, bool keep,
                       const char *suffix)
{
	if (!x || d->failed)
		return 0;
	static const char *const no_keepdims[] = {"keepdims", NULL}; /* default 1 */
	ir_node *n = onnx_extra(c, d, op, 1, &x, suffix);
	return finish(c, d, n, n && onnx_copy_attrs_to(c, d, n, op, keep ? no_keepdims : NULL),
	              suffix);
}

static uint32_t square(onnx_imp *c, onnx_nd *d, uint32_t x)
{
	return step(c, d, KILN_OP_MUL, 2, (uint32_t[]){x, x}, false, "square");
}

static void reduce_l1(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	x = step(c, d, KILN_OP_ABS, 1, &x, false, "abs");
	reduce(c, d, KILN_OP_REDUCE_SUM, x, false, NULL);
}

static void reduce_l2(onnx_imp *c, onnx_nd *d)
{
	uint32_t s = reduce(c, d, KILN_OP_REDUCE_SUM, square(c, d, onnx_input(c, d, 0, true)), false,
	                    "sum");
	step(c, d, KILN_OP_SQRT, 1, &s, false, NULL);
}

static void reduce_sum_square(onnx_imp *c, onnx_nd *d)
{
	reduce(c, d, KILN_OP_REDUCE_SUM, square(c, d, onnx_input(c, d, 0, true)), false, NULL);
}

static void reduce_log_sum(onnx_imp *c, onnx_nd *d)
{
	uint32_t s = reduce(c, d, KILN_OP_REDUCE_SUM, onnx_input(c, d, 0, true), false, "sum");
	step(c, d, KILN_OP_LOG, 1, &s, false, NULL);
}

static void reduce_log_sum_exp(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	uint32_t mk = reduce(c, d, KILN_OP_REDUCE_MAX, x, true, "max_keep");
	uint32_t m = reduce(c, d, KILN_OP_REDUCE_MAX, x, false, "max");
	uint32_t e = step(c, d, KILN_OP_SUB, 2, (uint32_t[]){x, mk}, false, "shifted");
	e = step(c, d, KILN_OP_EXP, 1, &e, false, "exp");
	uint32_t s = reduce(c, d, KILN_OP_REDUCE_SUM, e, false, "sum");
	s = step(c, d, KILN_OP_LOG, 1, &s, false, "log");
	step(c, d, KILN_OP_ADD, 2, (uint32_t[]){s, m}, false, NULL);
}

static void argmin(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true), neg = 0;
	if (!x)
		return;
	kiln_dtype dt = c->g->val[x]->type.dtype;
	if (kiln_dtype_is_float(dt)) {
		neg = step(c, d, KILN_OP_NEG, 1, &x, false, "neg");
	} else {
		kiln_tensor *t = ir_tensor_new(c->g, dt, 0, NULL);
		ir_node *k = t ? onnx_extra(c, d, KILN_OP_CONSTANT, 0, NULL, "minus_one") : NULL;
		if (k)
			ir_store(t, 0, -1);
		if (!k || ir_attr_set_tensor(c->g, k, "value", t) || !onnx_infer(c, d, k))
			return (void)(d->failed = true);
		neg = step(c, d, KILN_OP_SUB, 2, (uint32_t[]){k->out[0], x}, false, "reversed");
	}
	step(c, d, KILN_OP_ARGMAX, 1, &neg, true, NULL);
}

/* ---- elementwise ---------------------------------------------------------------- */

/* A scalar Constant of dtype dt holding v; 0 on a problem. */
static uint32_t kconst(onnx_imp *c, onnx_nd *d, kiln_dtype dt, double v, const char *suffix)
{
	kiln_tensor *t = d->failed ? NULL : ir_tensor_new(c->g, dt, 0, NULL);
	ir_node *k = t ? onnx_extra(c, d, KILN_OP_CONSTANT, 0, NULL, suffix) : NULL;
	if (k)
		ir_store(t, 0, v);
	if (!k || ir_attr_set_tensor(c->g, k, "value", t) || !onnx_infer(c, d, k)) {
		d->failed = true;
		return 0;
	}
	return k->out[0];
}

/* A Constant holding t (taken over: t is the graph's arena tensor). */
static uint32_t tconst(onnx_imp *c, onnx_nd *d, kiln_tensor *t, const char *suffix)
{
	ir_node *k = t && !d->failed ? onnx_extra(c, d, KILN_OP_CONSTANT, 0, NULL, suffix) : NULL;
	return finish(c, d, k, k && !ir_attr_set_tensor(c->g, k, "value", t), suffix);
}

static uint32_t u1(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t a, const char *suffix)
{
	return step(c, d, op, 1, &a, false, suffix);
}

static uint32_t b2(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t a, uint32_t b, const char *suffix)
{
	return step(c, d, op, 2, (uint32_t[]){a, b}, false, suffix);
}

static kiln_dtype dtype(onnx_imp *c, uint32_t v)
{
	return v ? c->g->val[v]->type.dtype : KILN_F32;
}

/* Sign: 1, -1, or x * 0 (0, and NaN for NaN). */
static void sign(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	kiln_dtype dt = dtype(c, x);
	uint32_t zero = kconst(c, d, dt, 0, "zero");
	uint32_t rest = step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){b2(c, d, KILN_OP_LESS, x, zero, "neg"),
	                     kconst(c, d, dt, -1, "minus_one"), b2(c, d, KILN_OP_MUL, x, zero, "x0")},
	                     false, "rest");
	step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){b2(c, d, KILN_OP_GREATER, x, zero, "pos"),
	     kconst(c, d, dt, 1, "one"), rest}, false, NULL);
}

/* Sinh, Cosh: (e^x -+ e^-x) / 2. */
static void hyperbolic(onnx_imp *c, onnx_nd *d, kiln_op combine)
{
	uint32_t x = onnx_input(c, d, 0, true);
	uint32_t e = u1(c, d, KILN_OP_EXP, x, "exp"), en = u1(c, d, KILN_OP_EXP, u1(c, d, KILN_OP_NEG, x, "neg"), "exp_neg");
	b2(c, d, KILN_OP_MUL, b2(c, d, combine, e, en, "sum"), kconst(c, d, dtype(c, x), 0.5, "half"), NULL);
}

static void sinh_op(onnx_imp *c, onnx_nd *d) { hyperbolic(c, d, KILN_OP_SUB); }
static void cosh_op(onnx_imp *c, onnx_nd *d) { hyperbolic(c, d, KILN_OP_ADD); }

/* Asinh: sign(x) log(|x| + sqrt(x^2 + 1)), odd by construction. */
static void asinh_op(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true), a = u1(c, d, KILN_OP_ABS, x, "abs");
	uint32_t one = kconst(c, d, dtype(c, x), 1, "one"), zero = kconst(c, d, dtype(c, x), 0, "zero");
	uint32_t r = u1(c, d, KILN_OP_SQRT, b2(c, d, KILN_OP_ADD, b2(c, d, KILN_OP_MUL, a, a, "sq"), one, "sq1"), "root");
	r = u1(c, d, KILN_OP_LOG, b2(c, d, KILN_OP_ADD, a, r, "arg"), "log");
	step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){b2(c, d, KILN_OP_LESS, x, zero, "neg"),
	     u1(c, d, KILN_OP_NEG, r, "minus"), r}, false, NULL);
}

/* Acosh: log(x + sqrt(x^2 - 1)). */
static void acosh_op(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true), one = kconst(c, d, dtype(c, x), 1, "one");
	uint32_t r = u1(c, d, KILN_OP_SQRT, b2(c, d, KILN_OP_SUB, b2(c, d, KILN_OP_MUL, x, x, "sq"), one, "sq1"), "root");
	u1(c, d, KILN_OP_LOG, b2(c, d, KILN_OP_ADD, x, r, "arg"), NULL);
}

/* Atanh: log((1 + x) / (1 - x)) / 2. */
static void atanh_op(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true), one = kconst(c, d, dtype(c, x), 1, "one");
	uint32_t q = b2(c, d, KILN_OP_DIV, b2(c, d, KILN_OP_ADD, one, x, "num"), b2(c, d, KILN_OP_SUB, one, x, "den"), "ratio");
	b2(c, d, KILN_OP_MUL, u1(c, d, KILN_OP_LOG, q, "log"), kconst(c, d, dtype(c, x), 0.5, "half"), NULL);
}

/* GreaterOrEqual, LessOrEqual: the strict comparison or equality (false
 * with a NaN, as ONNX's). */
static void or_equal(onnx_imp *c, onnx_nd *d, kiln_op strict)
{
	uint32_t a = onnx_input(c, d, 0, true), b = onnx_input(c, d, 1, true);
	b2(c, d, KILN_OP_OR, b2(c, d, strict, a, b, "strict"), b2(c, d, KILN_OP_EQUAL, a, b, "equal"), NULL);
}

static void greater_or_equal(onnx_imp *c, onnx_nd *d) { or_equal(c, d, KILN_OP_GREATER); }
static void less_or_equal(onnx_imp *c, onnx_nd *d) { or_equal(c, d, KILN_OP_LESS); }

/* Xor: (a or b) and not (a and b). */
static void xor_op(onnx_imp *c, onnx_nd *d)
{
	uint32_t a = onnx_input(c, d, 0, true), b = onnx_input(c, d, 1, true);
	b2(c, d, KILN_OP_AND, b2(c, d, KILN_OP_OR, a, b, "or"),
	   u1(c, d, KILN_OP_NOT, b2(c, d, KILN_OP_AND, a, b, "and"), "nand"), NULL);
}

/* PRelu: x < 0 ? slope x : x (slope broadcast to x). */
static void prelu(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true), s = onnx_input(c, d, 1, true);
	uint32_t neg = b2(c, d, KILN_OP_LESS, x, kconst(c, d, dtype(c, x), 0, "zero"), "neg");
	step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){neg, b2(c, d, KILN_OP_MUL, x, s, "scaled"), x}, false, NULL);
}

/* ---- shapes known at import ---------------------------------------------------- */

/* x's type when every dim from `from` on is a number; NULL after a problem. */
static const ir_type *fixed_dims(onnx_imp *c, onnx_nd *d, uint32_t x, int from, const char *what)
{
	const ir_type *t = x ? &c->g->val[x]->type : NULL;
	for (int i = from; t && i < t->rank; i++)
		if (ir_dim_expr(c->g, t->dim[i])) {
			onnx_problem(c, d, KILN_EUNSUPPORTED, "%s needs dim %d of its input to be a "
			             "number, not a symbol", what, i);
			return NULL;
		}
	return t;
}

/* A Reshape of x to shape (0: copy that dim), inferred unless last. */
static uint32_t reshape_to(onnx_imp *c, onnx_nd *d, uint32_t x, int n, const int64_t *shape,
                           const char *suffix)
{
	if (!x || d->failed)
		return 0;
	ir_node *r = onnx_extra(c, d, KILN_OP_RESHAPE, 1, &x, suffix);
	return finish(c, d, r, r && !ir_attr_set_ints(c->g, r, "shape", (uint32_t)n, shape), suffix);
}

static uint32_t transpose(onnx_imp *c, onnx_nd *d, uint32_t x, int n, const int64_t *perm,
                          const char *suffix)
{
	if (!x || d->failed)
		return 0;
	ir_node *t = onnx_extra(c, d, KILN_OP_TRANSPOSE, 1, &x, suffix);
	return finish(c, d, t, t && !ir_attr_set_ints(c->g, t, "perm", (uint32_t)n, perm), suffix);
}

static int64_t int_attr(const onnx_nd *d, const char *name, int64_t dflt)
{
	const Onnx__AttributeProto *a = onnx_attr(d, name);
	return a ? a->i : dflt;
}

/* GlobalMaxPool: ReduceMax over the spatial axes, kept. */
static void global_max_pool(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	if (!x)
		return;
	int rank = c->g->val[x]->type.rank;
	int64_t axes[KILN_MAX_RANK];
	for (int i = 2; i < rank; i++)
		axes[i - 2] = i;
	if (rank < 3)
		return (void)onnx_problem(c, d, KILN_ESHAPE, "input of rank %d: GlobalMaxPool takes "
		                          "[N, C, spatial...]", rank);
	ir_node *n = onnx_extra(c, d, KILN_OP_REDUCE_MAX, 1, &x, NULL);
	if (!n || ir_attr_set_ints(c->g, n, "axes", (uint32_t)(rank - 2), axes))
		return (void)(d->failed = true);
	d->n = n;
}

/* DepthToSpace (DCR or CRD) and SpaceToDepth: ONNX's own Reshape ->
 * Transpose -> Reshape, the batch copied (0) so it may be a symbol. */
static void depth_space(onnx_imp *c, onnx_nd *d, bool to_space)
{
	uint32_t x = onnx_input(c, d, 0, true);
	const ir_type *t = fixed_dims(c, d, x, 1, to_space ? "DepthToSpace" : "SpaceToDepth");
	int64_t b = int_attr(d, "blocksize", 0);
	if (!t)
		return;
	if (t->rank != 4 || b < 1)
		return (void)onnx_problem(c, d, KILN_EINVAL, "needs a rank-4 input and blocksize >= 1 "
		                          "(rank %d, blocksize %lld)", t->rank, (long long)b);
	int64_t C = t->dim[1], H = t->dim[2], W = t->dim[3];
	if (to_space) {
		const Onnx__AttributeProto *m = onnx_attr(d, "mode");
		bool crd = m && m->s.len == 3 && !memcmp(m->s.data, "CRD", 3);
		if (C % (b * b))
			return (void)onnx_problem(c, d, KILN_ESHAPE, "%lld channels do not split into "
			                          "blocks of %lld", (long long)C, (long long)(b * b));
		int64_t s1[6] = {0, b, b, C / (b * b), H, W}, p1[6] = {0, 3, 4, 1, 5, 2};
		int64_t s2[6] = {0, C / (b * b), b, b, H, W}, p2[6] = {0, 1, 4, 2, 5, 3};
		uint32_t r = reshape_to(c, d, x, 6, crd ? s2 : s1, "blocks");
		r = transpose(c, d, r, 6, crd ? p2 : p1, "moved");
		reshape_to(c, d, r, 4, (int64_t[]){0, C / (b * b), H * b, W * b}, NULL);
	} else {
		if (H % b || W % b)
			return (void)onnx_problem(c, d, KILN_ESHAPE, "%lldx%lld does not split into "
			                          "%lldx%lld blocks", (long long)H, (long long)W,
			                          (long long)b, (long long)b);
		uint32_t r = reshape_to(c, d, x, 6, (int64_t[]){0, C, H / b, b, W / b, b}, "blocks");
		r = transpose(c, d, r, 6, (int64_t[]){0, 3, 5, 1, 2, 4}, "moved");
		reshape_to(c, d, r, 4, (int64_t[]){0, C * b * b, H / b, W / b}, NULL);
	}
}

static void depth_to_space(onnx_imp *c, onnx_nd *d) { depth_space(c, d, true); }
static void space_to_depth(onnx_imp *c, onnx_nd *d) { depth_space(c, d, false); }

/* Tile with known repeats: x [d...] -> Reshape [1, d0, 1, d1, ...] ->
 * Expand [r0, d0, r1, d1, ...] -> Reshape [r0 d0, r1 d1, ...]. */
static void tile(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	const kiln_tensor *r = onnx_const_input(c, d, 1, "repeats", true);
	const ir_type *t = fixed_dims(c, d, x, 0, "Tile");
	if (!t || d->failed)
		return;
	if (kiln_tensor_numel(r) != t->rank || t->rank > KILN_MAX_RANK / 2)
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "repeats has %lld values for an "
		                          "input of rank %d (kiln tiles up to rank %d)",
		                          (long long)kiln_tensor_numel(r), t->rank, KILN_MAX_RANK / 2);
	int64_t s1[KILN_MAX_RANK], s2[KILN_MAX_RANK], s3[KILN_MAX_RANK];
	for (int i = 0; i < t->rank; i++) {
		int64_t k = ir_load_i64(r, i);
		if (k < 0)
			return (void)onnx_problem(c, d, KILN_EINVAL, "repeats[%d] is %lld", i, (long long)k);
		s1[2 * i] = 1, s1[2 * i + 1] = t->dim[i];
		s2[2 * i] = k, s2[2 * i + 1] = t->dim[i];
		s3[i] = k * t->dim[i];
	}
	uint32_t y = reshape_to(c, d, x, 2 * t->rank, s1, "spread");
	ir_node *e = y ? onnx_extra(c, d, KILN_OP_EXPAND, 1, &y, "repeated") : NULL;
	if (!e || ir_attr_set_ints(c->g, e, "shape", (uint32_t)(2 * t->rank), s2) ||
	    !onnx_infer(c, d, e))
		return (void)(d->failed = true);
	reshape_to(c, d, e->out[0], t->rank, s3, NULL);
}

/* Trilu: Where(mask, x, 0) with the mask of the last two dims (known). */
static void trilu(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	const ir_type *t = x ? fixed_dims(c, d, x, 0, "Trilu") : NULL;
	const kiln_tensor *kt = onnx_const_input(c, d, 1, "diagonal offset k", false);
	if (!t || d->failed)
		return;
	if (t->rank < 2 || (kt && kiln_tensor_numel(kt) != 1))
		return (void)onnx_problem(c, d, KILN_EINVAL, "needs an input of rank >= 2 and k one "
		                          "value (rank %d)", t->rank);
	int64_t k = kt ? ir_load_i64(kt, 0) : 0, n = t->dim[t->rank - 2], m = t->dim[t->rank - 1];
	bool upper = int_attr(d, "upper", 1) != 0;
	kiln_tensor *mask = ir_tensor_new(c->g, KILN_BOOL, 2, (int64_t[]){n, m});
	if (!mask)
		return (void)(d->failed = true);
	for (int64_t i = 0; i < n; i++)
		for (int64_t j = 0; j < m; j++)
			ir_store(mask, i * m + j, upper ? j - i >= k : j - i <= k);
	uint32_t mk = tconst(c, d, mask, "mask");
	step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){mk, x, kconst(c, d, t->dtype, 0, "zero")}, false,
	     NULL);
}

/* ConstantOfShape with symbolic dims in its shape (torch's zero initial
 * state of an RNN of dynamic batch: [dirs, N, hidden] from Shape(x)): an
 * Expand of the scalar to that shape, dims given as kiln's dims. */
static void constant_of_sym_shape(onnx_imp *c, onnx_nd *d, const onnx_svec *sv)
{
	const Onnx__AttributeProto *a = onnx_attr(d, "value");
	kiln_tensor *v = NULL;
	kiln_error err = {0};
	if (sv->rank != 1 || sv->n > KILN_MAX_RANK)
		return (void)onnx_problem(c, d, KILN_EINVAL, "the shape must be 1-D, of at most %d "
		                          "dims", KILN_MAX_RANK);
	if (a && a->t && onnx_tensor_read(a->t, c->dir, &v, &err))
		return (void)onnx_problem(c, d, err.code, "value: %s", err.msg);
	if (v && kiln_tensor_numel(v) != 1) {
		kiln_tensor_free(v);
		return (void)onnx_problem(c, d, KILN_EINVAL, "value must hold one element");
	}
	kiln_tensor *t = ir_tensor_new(c->g, v ? v->dtype : KILN_F32, 0, NULL);
	if (t && v && v->dtype == KILN_I64)
		ir_store_i64(t, 0, ir_load_i64(v, 0));
	else if (t)
		ir_store(t, 0, v ? ir_load(v, 0) : 0);
	kiln_tensor_free(v);
	for (int i = 0; i < sv->n; i++)
		if (!sv->sym[i] && sv->v[i] < 0)
			return (void)onnx_problem(c, d, KILN_EINVAL, "shape[%d] is %lld", i,
			                          (long long)sv->v[i]);
	uint32_t k = tconst(c, d, t, "value");
	int64_t *shape = ir_alloc(c->g->arena, (size_t)sv->n * sizeof *shape + 1);
	ir_node *e = k && shape ? onnx_extra(c, d, KILN_OP_EXPAND, 1, &k, NULL) : NULL;
	if (shape)
		memcpy(shape, sv->v, (size_t)sv->n * sizeof *shape);
	if (!e || ir_attr_set_ints(c->g, e, "shape", (uint32_t)sv->n, shape))
		return (void)(d->failed = true);
	d->n = e;
}

/* ConstantOfShape with a shape known at import: the filled Constant. */
static void constant_of_shape(onnx_imp *c, onnx_nd *d)
{
	uint32_t sh = onnx_input(c, d, 0, true);
	const onnx_svec *sv = sh && !onnx_const(c, sh) ? onnx_svec_of(c, sh) : NULL;
	if (sv)
		return constant_of_sym_shape(c, d, sv);
	const kiln_tensor *s = onnx_const_input(c, d, 0, "shape", true);
	if (d->failed)
		return;
	if (s->rank != 1 || kiln_tensor_numel(s) > KILN_MAX_RANK)
		return (void)onnx_problem(c, d, KILN_EINVAL, "the shape must be 1-D, of at most %d "
		                          "dims", KILN_MAX_RANK);
	const Onnx__AttributeProto *a = onnx_attr(d, "value");
	kiln_tensor *v = NULL;
	kiln_error err = {0};
	if (a && a->t && onnx_tensor_read(a->t, c->dir, &v, &err))
		return (void)onnx_problem(c, d, err.code, "value: %s", err.msg);
	if (v && kiln_tensor_numel(v) != 1) {
		kiln_tensor_free(v);
		return (void)onnx_problem(c, d, KILN_EINVAL, "value must hold one element");
	}
	int64_t shape[KILN_MAX_RANK], n = 1;
	int rank = (int)kiln_tensor_numel(s);
	for (int i = 0; i < rank; i++) {
		shape[i] = ir_load_i64(s, i);
		if (shape[i] < 0 || (shape[i] && n > INT64_MAX / 2 / shape[i])) {
			kiln_tensor_free(v);
			return (void)onnx_problem(c, d, KILN_EINVAL, "shape[%d] is %lld", i,
			                          (long long)shape[i]);
		}
		n *= shape[i];
	}
	kiln_tensor *t = ir_tensor_new(c->g, v ? v->dtype : KILN_F32, rank, shape);
	for (int64_t i = 0; t && i < n; i++)
		ir_store(t, i, v ? ir_load(v, 0) : 0);
	if (t && v && v->dtype == KILN_I64)
		for (int64_t i = 0; i < n; i++)
			ir_store_i64(t, i, ir_load_i64(v, 0));
	kiln_tensor_free(v);
	tconst(c, d, t, NULL);
}

/* Range whose limit is a symbolic dim L (GPT-2's arange(S)): kiln's Range
 * of n = ceil(L / delta) elements, which the dims can say for start 0 and
 * a positive integer delta ((L + delta - 1) / delta). */
static void range_sym(onnx_imp *c, onnx_nd *d, const onnx_svec *lim)
{
	const kiln_tensor *v0 = onnx_const_input(c, d, 0, "start", true);
	const kiln_tensor *v2 = onnx_const_input(c, d, 2, "delta", true);
	if (d->failed)
		return;
	if (kiln_tensor_numel(v0) != 1 || kiln_tensor_numel(v2) != 1)
		return (void)onnx_problem(c, d, KILN_EINVAL, "start and delta must be scalars");
	double start = ir_load(v0, 0), delta = ir_load(v2, 0);
	char l[96];
	ir_dim_str(c->g, lim->v[0], l, sizeof l);
	if (start != 0 || !(delta >= 1 && delta <= IR_DIM_MAX) || delta != floor(delta))
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "limit is the symbolic dim %s: "
		                          "kiln takes that with start 0 and a positive integer delta, "
		                          "not start %g, delta %g", l, start, delta);
	int64_t k = (int64_t)delta;
	int64_t n = k == 1 ? lim->v[0] : ir_dim_div(c->g, ir_dim_add(c->g, lim->v[0], k - 1), k);
	if (!onnx_emit_with(c, d, 0, NULL, NULL))
		return;
	if (ir_attr_set_dims(c->g, d->n, "n", 1, &n, 1) ||
	    ir_attr_set_dtype(c->g, d->n, "dtype", v0->dtype) ||
	    (k != 1 && ir_attr_set_float(c->g, d->n, "delta", delta)))
		onnx_problem(c, d, KILN_ENOMEM, "out of memory");
}

/* Range with start, limit and delta known at import: the Constant. */
void onnx_import_range(onnx_imp *c, onnx_nd *d)
{
	const kiln_tensor *v[3];
	static const char *const what[3] = {"start", "limit", "delta"};
	uint32_t lv = onnx_input(c, d, 1, true);
	const onnx_svec *lim = lv && !onnx_const(c, lv) ? onnx_svec_of(c, lv) : NULL;
	if (lim && lim->n == 1 && lim->sym[0])
		return range_sym(c, d, lim);
	for (uint32_t i = 0; i < 3; i++) {
		v[i] = onnx_const_input(c, d, i, what[i], true);
		if (!d->failed && kiln_tensor_numel(v[i]) != 1)
			return (void)onnx_problem(c, d, KILN_EINVAL, "%s must be a scalar", what[i]);
	}
	if (d->failed)
		return;
	double start = ir_load(v[0], 0), limit = ir_load(v[1], 0), delta = ir_load(v[2], 0);
	double cnt = delta != 0 ? ceil((limit - start) / delta) : NAN;
	if (!(cnt < 1e9))
		return (void)onnx_problem(c, d, KILN_EINVAL, "start %g, limit %g, delta %g give no "
		                          "finite length", start, limit, delta);
	int64_t n = cnt > 0 ? (int64_t)cnt : 0;
	kiln_tensor *t = ir_tensor_new(c->g, v[0]->dtype, 1, &n);
	bool ints = !kiln_dtype_is_float(v[0]->dtype);
	for (int64_t i = 0; t && i < n; i++) {
		if (ints)
			ir_store_i64(t, i, ir_load_i64(v[0], 0) + i * ir_load_i64(v[2], 0));
		else
			ir_store(t, i, start + (double)i * delta);
	}
	tconst(c, d, t, NULL);
}

/* InstanceNormalization: (x - mean) / sqrt(var + eps) * scale + bias over
 * the spatial axes, scale and bias per channel. */
static void instance_norm(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true), s = onnx_input(c, d, 1, true), b = onnx_input(c, d, 2, true);
	if (d->failed)
		return;
	int rank = c->g->val[x]->type.rank;
	if (rank < 3)
		return (void)onnx_problem(c, d, KILN_ESHAPE, "input of rank %d: InstanceNormalization "
		                          "takes [N, C, spatial...]", rank);
	const Onnx__AttributeProto *ea = onnx_attr(d, "epsilon");
	int64_t axes[KILN_MAX_RANK], cshape[KILN_MAX_RANK];
	cshape[0] = -1;
	for (int i = 2; i < rank; i++)
		axes[i - 2] = i, cshape[i - 1] = 1;
	ir_node *mean = onnx_extra(c, d, KILN_OP_REDUCE_MEAN, 1, &x, "mean");
	if (!mean || ir_attr_set_ints(c->g, mean, "axes", (uint32_t)(rank - 2), axes) ||
	    !onnx_infer(c, d, mean))
		return (void)(d->failed = true);
	uint32_t dx = b2(c, d, KILN_OP_SUB, x, mean->out[0], "centered");
	uint32_t sq = b2(c, d, KILN_OP_MUL, dx, dx, "squared");
	ir_node *var = sq ? onnx_extra(c, d, KILN_OP_REDUCE_MEAN, 1, &sq, "var") : NULL;
	if (!var || ir_attr_set_ints(c->g, var, "axes", (uint32_t)(rank - 2), axes) ||
	    !onnx_infer(c, d, var))
		return (void)(d->failed = true);
	kiln_dtype dt = dtype(c, x);
	uint32_t den = u1(c, d, KILN_OP_SQRT, b2(c, d, KILN_OP_ADD, var->out[0],
	                  kconst(c, d, dt, ea ? ea->f : 1e-5f, "epsilon"), "var_eps"), "std");
	uint32_t y = b2(c, d, KILN_OP_DIV, dx, den, "normalized");
	y = b2(c, d, KILN_OP_MUL, y, reshape_to(c, d, s, rank - 1, cshape, "scale_c"), "scaled");
	b2(c, d, KILN_OP_ADD, y, reshape_to(c, d, b, rank - 1, cshape, "bias_c"), NULL);
}

/* Size with a shape known at import: a Constant i64 scalar. */
static void size_op(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	const ir_type *t = fixed_dims(c, d, x, 0, "Size");
	if (!t)
		return;
	kiln_tensor *n = ir_tensor_new(c->g, KILN_I64, 0, NULL);
	int64_t v = 1;
	for (int i = 0; i < t->rank; i++)
		v *= t->dim[i];
	if (n)
		ir_store_i64(n, 0, v);
	tconst(c, d, n, NULL);
}

/* ---- more compositions ---------------------------------------------------------- */

/* Sum and Mean of one or more inputs: an Add chain (divided by the count). */
static void sum_mean(onnx_imp *c, onnx_nd *d, bool mean)
{
	uint32_t n = (uint32_t)d->p->n_input, acc = onnx_input(c, d, 0, true);
	if (n == 0)
		return (void)onnx_problem(c, d, KILN_EINVAL, "needs at least one input");
	for (uint32_t i = 1; i < n && acc; i++) {
		char sfx[32];
		snprintf(sfx, sizeof sfx, "sum_%u", i);
		acc = b2(c, d, KILN_OP_ADD, acc, onnx_input(c, d, i, true),
		         i + 1 == n && !mean ? NULL : sfx);
	}
	if (mean)
		b2(c, d, KILN_OP_DIV, acc, kconst(c, d, dtype(c, acc), n, "count"), NULL);
	else if (n == 1 && acc)
		u1(c, d, KILN_OP_IDENTITY, acc, NULL);
}

static void sum_op(onnx_imp *c, onnx_nd *d) { sum_mean(c, d, false); }
static void mean_op(onnx_imp *c, onnx_nd *d) { sum_mean(c, d, true); }

static double float_attr(const onnx_nd *d, const char *name, double dflt)
{
	const Onnx__AttributeProto *a = onnx_attr(d, name);
	return a ? a->f : dflt;
}

/* Shrink: x < -lambd ? x + bias : x > lambd ? x - bias : 0. */
static void shrink(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	kiln_dtype dt = dtype(c, x);
	double l = float_attr(d, "lambd", 0.5), b = float_attr(d, "bias", 0);
	uint32_t bias = kconst(c, d, dt, b, "bias");
	uint32_t hi = step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){
	                   b2(c, d, KILN_OP_GREATER, x, kconst(c, d, dt, l, "lambd"), "above"),
	                   b2(c, d, KILN_OP_SUB, x, bias, "minus_bias"), kconst(c, d, dt, 0, "zero")},
	                   false, "upper");
	step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){
	     b2(c, d, KILN_OP_LESS, x, kconst(c, d, dt, -l, "minus_lambd"), "below"),
	     b2(c, d, KILN_OP_ADD, x, bias, "plus_bias"), hi}, false, NULL);
}

/* 0, 1, ..., n-1 (i64) laid along axis of a rank-`rank` tensor of ones. */
static uint32_t iota(onnx_imp *c, onnx_nd *d, int rank, int axis, int64_t n)
{
	int64_t shape[KILN_MAX_RANK];
	for (int i = 0; i < rank; i++)
		shape[i] = i == axis ? n : 1;
	kiln_tensor *t = n >= 0 ? ir_tensor_new(c->g, KILN_I64, rank, shape) : NULL;
	for (int64_t i = 0; t && i < n; i++)
		ir_store_i64(t, i, i);
	return tconst(c, d, t, "iota");
}

/* Hardmax: 1 where the first maximum along axis is, else 0. */
static void hardmax(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	if (!x)
		return;
	const ir_type *t = &c->g->val[x]->type;
	int64_t axis = int_attr(d, "axis", c->opset >= 13 ? -1 : 1);
	axis += axis < 0 ? t->rank : 0;
	if (axis < 0 || axis >= t->rank || c->opset < 13)
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "axis %lld of rank %d (kiln imports "
		                          "Hardmax from opset 13)", (long long)axis, t->rank);
	if (ir_dim_expr(c->g, t->dim[axis]))
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "needs dim %lld (the axis) to be a "
		                          "number, not a symbol", (long long)axis);
	ir_node *am = onnx_extra(c, d, KILN_OP_ARGMAX, 1, &x, "argmax");
	/* axis 0 is ArgMax's default: left unset, as import leaves a default */
	if (!am || (axis && ir_attr_set_int(c->g, am, "axis", axis)) || !onnx_infer(c, d, am))
		return (void)(d->failed = true);
	uint32_t eq = b2(c, d, KILN_OP_EQUAL, iota(c, d, t->rank, (int)axis, t->dim[axis]),
	                 am->out[0], "is_max");
	ir_node *cast = eq ? onnx_extra(c, d, KILN_OP_CAST, 1, &eq, NULL) : NULL;
	if (!cast || ir_attr_set_dtype(c->g, cast, "to", t->dtype))
		return (void)(d->failed = true);
	d->n = cast;
}

/* OneHot(indices, depth, [off, on]): Where(Unsqueeze(idx) == iota, on,
 * off), negative indices counted from depth. */
static void one_hot(onnx_imp *c, onnx_nd *d)
{
	uint32_t idx = onnx_input(c, d, 0, true);
	const kiln_tensor *dt = onnx_const_input(c, d, 1, "depth", true);
	const kiln_tensor *vals = onnx_const_input(c, d, 2, "values", true);
	if (d->failed)
		return;
	if (kiln_tensor_numel(dt) != 1 || kiln_tensor_numel(vals) != 2)
		return (void)onnx_problem(c, d, KILN_EINVAL, "depth must be one value and values two");
	int64_t depth = (int64_t)ir_load(dt, 0);
	int rank = c->g->val[idx]->type.rank + 1;
	int64_t axis = int_attr(d, "axis", -1);
	axis += axis < 0 ? rank : 0;
	if (depth < 1 || axis < 0 || axis >= rank || rank > KILN_MAX_RANK)
		return (void)onnx_problem(c, d, KILN_EINVAL, "depth %lld, axis %lld for indices of rank "
		                          "%d", (long long)depth, (long long)int_attr(d, "axis", -1),
		                          rank - 1);
	if (dtype(c, idx) != KILN_I64) {
		ir_node *cast = onnx_extra(c, d, KILN_OP_CAST, 1, &idx, "indices_i64");
		if (!cast || ir_attr_set_dtype(c->g, cast, "to", KILN_I64) || !onnx_infer(c, d, cast))
			return (void)(d->failed = true);
		idx = cast->out[0];
	}
	uint32_t dk = kconst(c, d, KILN_I64, (double)depth, "depth");
	uint32_t wrapped = step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){
	                        b2(c, d, KILN_OP_LESS, idx, kconst(c, d, KILN_I64, 0, "zero"), "negative"),
	                        b2(c, d, KILN_OP_ADD, idx, dk, "from_end"), idx}, false, "wrapped");
	ir_node *u = wrapped ? onnx_extra(c, d, KILN_OP_UNSQUEEZE, 1, &wrapped, "unsqueezed") : NULL;
	if (!u || ir_attr_set_ints(c->g, u, "axes", 1, &axis) || !onnx_infer(c, d, u))
		return (void)(d->failed = true);
	uint32_t hot = b2(c, d, KILN_OP_EQUAL, u->out[0], iota(c, d, rank, (int)axis, depth), "hot");
	step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){hot, kconst(c, d, vals->dtype, ir_load(vals, 1), "on"),
	     kconst(c, d, vals->dtype, ir_load(vals, 0), "off")}, false, NULL);
}

/* Mod: a - b q with q = a / b truncated (fmod=1: C's fmod; floats need
 * it); fmod=0 (integers) moves a remainder whose sign differs from b's by
 * b, as Python's %. */
static void mod_op(onnx_imp *c, onnx_nd *d)
{
	uint32_t a = onnx_input(c, d, 0, true), b = onnx_input(c, d, 1, true);
	bool fmod = int_attr(d, "fmod", 0) != 0;
	kiln_dtype dt = dtype(c, a);
	if (!a || !b)
		return;
	if (kiln_dtype_is_float(dt) && !fmod)
		return (void)onnx_problem(c, d, KILN_EINVAL, "fmod=0 is defined for integers only");
	uint32_t q = b2(c, d, KILN_OP_DIV, a, b, "quotient"), zero = kconst(c, d, dt, 0, "zero");
	if (kiln_dtype_is_float(dt))
		q = step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){b2(c, d, KILN_OP_LESS, q, zero, "neg"),
		         u1(c, d, KILN_OP_CEIL, q, "ceil"), u1(c, d, KILN_OP_FLOOR, q, "floor")}, false,
		         "truncated");
	uint32_t r = b2(c, d, KILN_OP_SUB, a, b2(c, d, KILN_OP_MUL, b, q, "product"),
	                fmod ? NULL : "remainder");
	if (fmod)
		return;
	uint32_t rn = b2(c, d, KILN_OP_LESS, r, zero, "r_neg"), bn = b2(c, d, KILN_OP_LESS, b, zero, "b_neg");
	uint32_t differ = b2(c, d, KILN_OP_AND, b2(c, d, KILN_OP_OR, rn, bn, "either"),
	                     u1(c, d, KILN_OP_NOT, b2(c, d, KILN_OP_AND, rn, bn, "both"), "not_both"),
	                     "signs_differ");
	uint32_t move = b2(c, d, KILN_OP_AND, differ,
	                   u1(c, d, KILN_OP_NOT, b2(c, d, KILN_OP_EQUAL, r, zero, "r_zero"), "r_nonzero"),
	                   "move");
	step(c, d, KILN_OP_WHERE, 3, (uint32_t[]){move, b2(c, d, KILN_OP_ADD, r, b, "moved"), r}, false,
	     NULL);
}

/* ---- batch: constants, tests, windows, scans ----------------------------------- */

/* EyeLike: ones on diagonal k of x's (known) 2-D shape, in dtype (or x's). */
static void eye_like(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	const ir_type *t = fixed_dims(c, d, x, 0, "EyeLike");
	if (!t)
		return;
	if (t->rank != 2)
		return (void)onnx_problem(c, d, KILN_EINVAL, "input of rank %d: EyeLike takes 2-D",
		                          t->rank);
	const Onnx__AttributeProto *a = onnx_attr(d, "dtype");
	kiln_dtype dt = a ? onnx_dtype_to_kiln((int32_t)a->i) : t->dtype;
	if (dt == KILN_DT_INVALID)
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "dtype %lld is not one kiln has",
		                          (long long)a->i);
	int64_t k = int_attr(d, "k", 0);
	kiln_tensor *e = ir_tensor_new(c->g, dt, 2, t->dim);
	for (int64_t i = 0; e && i < t->dim[0]; i++)
		if (i + k >= 0 && i + k < t->dim[1])
			ir_store(e, i * t->dim[1] + i + k, 1);
	tconst(c, d, e, NULL);
}

/* IsNaN: x != x. */
static void is_nan(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	u1(c, d, KILN_OP_NOT, b2(c, d, KILN_OP_EQUAL, x, x, "equal"), NULL);
}

/* IsInf: x == +inf (detect_positive), or x == -inf (detect_negative). */
static void is_inf(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	bool pos = int_attr(d, "detect_positive", 1), neg = int_attr(d, "detect_negative", 1);
	kiln_dtype dt = dtype(c, x);
	if (!pos && !neg) /* never: x != x or x == x */
		return (void)b2(c, d, KILN_OP_AND, b2(c, d, KILN_OP_EQUAL, x, x, "equal"),
		                u1(c, d, KILN_OP_NOT, b2(c, d, KILN_OP_EQUAL, x, x, "equal2"), "nan"),
		                NULL);
	uint32_t p = pos ? b2(c, d, KILN_OP_EQUAL, x, kconst(c, d, dt, INFINITY, "inf"),
	                      neg ? "is_pos" : NULL) : 0;
	uint32_t q = neg ? b2(c, d, KILN_OP_EQUAL, x, kconst(c, d, dt, -INFINITY, "minus_inf"),
	                      pos ? "is_neg" : NULL) : 0;
	if (pos && neg)
		b2(c, d, KILN_OP_OR, p, q, NULL);
}

/* Tan: sin / cos. */
static void tan_op(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	b2(c, d, KILN_OP_DIV, u1(c, d, KILN_OP_SIN, x, "sin"), u1(c, d, KILN_OP_COS, x, "cos"), NULL);
}

/* Hann, Hamming and Blackman windows of a size known at import: sums of
 * a[j] cos(2 pi j n / N) with N = size (periodic) or size - 1. */
static void window(onnx_imp *c, onnx_nd *d, const double *a, int na)
{
	const kiln_tensor *s = onnx_const_input(c, d, 0, "size", true);
	if (d->failed)
		return;
	int64_t n = kiln_tensor_numel(s) == 1 ? ir_load_i64(s, 0) : -1;
	const Onnx__AttributeProto *od = onnx_attr(d, "output_datatype");
	kiln_dtype dt = od ? onnx_dtype_to_kiln((int32_t)od->i) : KILN_F32;
	if (n < 0 || n > (1 << 26) || dt == KILN_DT_INVALID)
		return (void)onnx_problem(c, d, KILN_EINVAL, "size must be one value in [0, 2^26] and "
		                          "output_datatype one kiln has");
	double den = int_attr(d, "periodic", 1) ? (double)n : (double)n - 1;
	kiln_tensor *w = ir_tensor_new(c->g, dt, 1, &n);
	for (int64_t i = 0; w && i < n; i++) {
		double v = 0;
		for (int j = 0; j < na; j++)
			v += a[j] * cos(2 * M_PI * j * (double)i / den);
		ir_store(w, i, v);
	}
	tconst(c, d, w, NULL);
}

static void hann_window(onnx_imp *c, onnx_nd *d)
{
	window(c, d, (const double[]){0.5, -0.5}, 2);
}

static void hamming_window(onnx_imp *c, onnx_nd *d)
{
	window(c, d, (const double[]){25.0 / 46, -(1 - 25.0 / 46)}, 2);
}

static void blackman_window(onnx_imp *c, onnx_nd *d)
{
	window(c, d, (const double[]){0.42, -0.5, 0.08}, 3);
}

/* Compress with a condition known at import: Gather of the positions that
 * hold (of the flattened input when there is no axis). */
static void compress(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	const kiln_tensor *cond = onnx_const_input(c, d, 1, "condition", true);
	if (d->failed)
		return;
	const Onnx__AttributeProto *ax = onnx_attr(d, "axis");
	int64_t n = 0, cnt = kiln_tensor_numel(cond);
	for (int64_t i = 0; i < cnt; i++)
		n += ir_load(cond, i) != 0;
	kiln_tensor *idx = ir_tensor_new(c->g, KILN_I64, 1, &n);
	for (int64_t i = 0, k = 0; idx && i < cnt; i++)
		if (ir_load(cond, i) != 0)
			ir_store_i64(idx, k++, i);
	uint32_t iv = tconst(c, d, idx, "positions");
	if (!ax)
		x = reshape_to(c, d, x, 1, (int64_t[]){-1}, "flat");
	ir_node *g = x && iv ? onnx_extra(c, d, KILN_OP_GATHER, 2, (uint32_t[]){x, iv}, NULL) : NULL;
	if (!g || (ax && ax->i && ir_attr_set_int(c->g, g, "axis", ax->i)))
		return (void)(d->failed = true);
	d->n = g;
}

/* A Cast of x to dt, inferred unless last (suffix NULL: d's result). */
static uint32_t cast_to(onnx_imp *c, onnx_nd *d, uint32_t x, kiln_dtype dt, const char *suffix)
{
	ir_node *n = x && !d->failed ? onnx_extra(c, d, KILN_OP_CAST, 1, &x, suffix) : NULL;
	return finish(c, d, n, n && !ir_attr_set_dtype(c->g, n, "to", dt), suffix);
}

/* CumSum along an axis of known length n: x (axis moved last) times the
 * n x n 0/1 matrix of which inputs each output sums (exclusive, reverse),
 * in f64 for integers (exact to 2^53). */
static void cum_sum(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	const kiln_tensor *at = onnx_const_input(c, d, 1, "axis", true);
	if (d->failed)
		return;
	const ir_type *t = &c->g->val[x]->type;
	int rank = t->rank;
	int64_t axis = kiln_tensor_numel(at) == 1 ? ir_load_i64(at, 0) : rank;
	axis += axis < 0 ? rank : 0;
	if (axis < 0 || axis >= rank)
		return (void)onnx_problem(c, d, KILN_EINVAL, "axis out of range for rank %d", rank);
	if (ir_dim_expr(c->g, t->dim[axis]))
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "needs dim %lld (the axis) to be a "
		                          "number, not a symbol", (long long)axis);
	int64_t n = t->dim[axis], perm[KILN_MAX_RANK], inv[KILN_MAX_RANK];
	bool excl = int_attr(d, "exclusive", 0), rev = int_attr(d, "reverse", 0);
	kiln_dtype dt = t->dtype, ct = kiln_dtype_is_float(dt) ? dt : KILN_F64;
	kiln_tensor *m = ir_tensor_new(c->g, ct, 2, (int64_t[]){n, n}); /* m[j][i]: j into i */
	for (int64_t j = 0; m && j < n; j++)
		for (int64_t i = 0; i < n; i++)
			ir_store(m, j * n + i, rev ? (excl ? j > i : j >= i) : (excl ? j < i : j <= i));
	for (int i = 0; i < rank; i++)
		perm[i] = i < axis ? i : i == rank - 1 ? axis : i + 1;
	for (int i = 0; i < rank; i++)
		inv[perm[i]] = i;
	bool move = axis != rank - 1, cast = ct != dt;
	uint32_t tri = tconst(c, d, m, "triangle"), y = x;
	if (cast)
		y = cast_to(c, d, y, ct, "as_f64");
	if (move)
		y = transpose(c, d, y, rank, perm, "axis_last");
	y = b2(c, d, KILN_OP_MATMUL, y, tri, move || cast ? "sums" : NULL);
	if (move)
		y = transpose(c, d, y, rank, inv, cast ? "axis_back" : NULL);
	if (cast)
		cast_to(c, d, y, dt, NULL);
}

/* LRN over channels: x / (bias + alpha / size * sum of x^2 over the size
 * channels around)^beta, the window sum an AveragePool (zeros counted) of
 * x^2 viewed as [N, 1, C, spatial] times size. */
static void lrn(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	const ir_type *t = fixed_dims(c, d, x, 1, "LRN");
	int64_t size = int_attr(d, "size", 0);
	if (!t)
		return;
	if (t->rank < 3 || size < 1)
		return (void)onnx_problem(c, d, KILN_EINVAL, "needs [N, C, spatial...] and size >= 1 "
		                          "(rank %d, size %lld)", t->rank, (long long)size);
	int64_t sp = 1, back[KILN_MAX_RANK];
	for (int i = 2; i < t->rank; i++)
		sp *= t->dim[i];
	for (int i = 0; i < t->rank; i++)
		back[i] = i ? t->dim[i] : 0;
	kiln_dtype dt = t->dtype;
	uint32_t sq = b2(c, d, KILN_OP_MUL, x, x, "square");
	sq = reshape_to(c, d, sq, 4, (int64_t[]){0, 1, t->dim[1], sp}, "channels_as_rows");
	ir_node *p = sq ? onnx_extra(c, d, KILN_OP_AVERAGE_POOL, 1, &sq, "window_mean") : NULL;
	int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
	if (!p || ir_attr_set_ints(c->g, p, "kernel_shape", 2, (int64_t[]){size, 1}) ||
	    ir_attr_set_ints(c->g, p, "pads", 4, (int64_t[]){lo, 0, hi, 0}) ||
	    ir_attr_set_int(c->g, p, "count_include_pad", 1) || !onnx_infer(c, d, p))
		return (void)(d->failed = true);
	uint32_t s = reshape_to(c, d, p->out[0], t->rank, back, "window_mean_back");
	double alpha = float_attr(d, "alpha", 1e-4), beta = float_attr(d, "beta", 0.75);
	uint32_t base = b2(c, d, KILN_OP_ADD, kconst(c, d, dt, float_attr(d, "bias", 1), "bias"),
	                   b2(c, d, KILN_OP_MUL, s, kconst(c, d, dt, alpha, "alpha"), "scaled"),
	                   "base");
	b2(c, d, KILN_OP_DIV, x, b2(c, d, KILN_OP_POW, base, kconst(c, d, dt, beta, "beta"), "den"),
	   NULL);
}

/* Upsample (opsets 7 to 9; scales an attribute, then an input): Resize
 * with asymmetric coordinates and floor for nearest, as it defined them. */
static void upsample(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	const Onnx__AttributeProto *sa = onnx_attr(d, "scales"), *ma = onnx_attr(d, "mode");
	const kiln_tensor *st = sa ? NULL : onnx_const_input(c, d, 1, "scales", true);
	if (d->failed || !x)
		return;
	int64_t cnt = sa ? (int64_t)sa->n_floats : kiln_tensor_numel(st);
	double *f = ir_alloc(c->g->arena, (size_t)(cnt + 1) * sizeof *f);
	for (int64_t k = 0; f && k < cnt; k++)
		f[k] = sa ? sa->floats[k] : ir_load(st, k);
	char mode[16] = "nearest";
	if (ma && ma->s.len && ma->s.len < sizeof mode)
		memcpy(mode, ma->s.data, ma->s.len), mode[ma->s.len] = 0;
	ir_node *n = f ? onnx_extra(c, d, KILN_OP_RESIZE, 1, &x, NULL) : NULL;
	if (!n || ir_attr_set_floats(c->g, n, "scales", (uint32_t)cnt, f) ||
	    (strcmp(mode, "nearest") && ir_attr_set_string(c->g, n, "mode", mode)) ||
	    ir_attr_set_string(c->g, n, "coordinate_transformation_mode", "asymmetric") ||
	    ir_attr_set_string(c->g, n, "nearest_mode", "floor"))
		return (void)(d->failed = true);
	d->n = n;
}

/* Scatter (opsets 9, 10): ScatterElements under its old name. */
static void scatter(onnx_imp *c, onnx_nd *d)
{
	uint32_t in[3] = {onnx_input(c, d, 0, true), onnx_input(c, d, 1, true),
	                  onnx_input(c, d, 2, true)};
	step(c, d, KILN_OP_SCATTER_ELEMENTS, 3, in, true, NULL);
}

/* ---- Einsum ------------------------------------------------------------------- */

/* x transposed by perm unless perm is the identity. */
static uint32_t permuted(onnx_imp *c, onnx_nd *d, uint32_t x, int n, const int64_t *perm,
                         const char *suffix)
{
	bool id = true;
	for (int i = 0; i < n; i++)
		id = id && perm[i] == i;
	return id ? x : transpose(c, d, x, n, perm, suffix);
}

/* A Reshape target whose entries may be symbolic: the one symbolic entry
 * becomes -1 (Reshape infers it); false when more than one is. */
static bool one_symbolic(onnx_imp *c, int n, int64_t *shape)
{
	int k = -1;
	for (int i = 0; i < n; i++)
		if (ir_dim_expr(c->g, shape[i])) {
			if (k >= 0)
				return false;
			k = i;
		}
	if (k >= 0)
		shape[k] = -1;
	return true;
}

/* Einsum of one or two operands (no ellipsis, no letter twice in one
 * operand): letters only one operand has and the output lacks are summed
 * first; then batch letters (both operands and the output), contracted
 * ones (both, not the output), and each side's own make one batched
 * MatMul of [B, L, C] by [B, C, R], whose result is reshaped and
 * transposed to the output's order.  A letter may be a symbol (the batch
 * N) as long as each of those reshapes has at most one symbolic extent. */
static void einsum(onnx_imp *c, onnx_nd *d)
{
	const Onnx__AttributeProto *ea = onnx_attr(d, "equation");
	char eq[128] = "", terms[3][KILN_MAX_RANK + 1] = {{0}};
	if (!ea || !ea->s.len || ea->s.len >= sizeof eq)
		return (void)onnx_problem(c, d, KILN_EINVAL, "needs an equation");
	int k = 0, nt = 0, len[3] = {0};
	bool arrow = false;
	for (size_t i = 0; i < ea->s.len; i++)
		if (ea->s.data[i] != ' ')
			eq[k++] = (char)ea->s.data[i];
	eq[k] = 0;
	for (char *p = eq; *p && nt < 3; p++) {
		if (*p == ',' && !arrow) {
			nt++;
		} else if (p[0] == '-' && p[1] == '>' && !arrow) {
			arrow = true, nt++, p++;
		} else if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) {
			if (len[nt] == KILN_MAX_RANK)
				return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "equation '%s': a term of "
				                          "more than %d letters", eq, KILN_MAX_RANK);
			terms[nt][len[nt]++] = *p;
		} else {
			return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "equation '%s': kiln takes "
			                          "letters, ',' and '->' (no ellipsis)", eq);
		}
	}
	int nin = arrow ? nt : nt + 1;
	if (nin != (int)d->p->n_input || nin < 1 || nin > 2)
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "equation '%s' for %zu inputs: kiln "
		                          "takes one or two", eq, d->p->n_input);
	if (!arrow) { /* implicit output: the letters used once, in order */
		for (char ch = 'A'; ch <= 'z'; ch++) {
			int uses = 0;
			for (int t = 0; t < nin; t++)
				uses += strchr(terms[t], ch) != NULL;
			if (uses == 1 && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')))
				terms[2][len[2]++] = ch;
		}
	} else if (nt != nin) {
		return (void)onnx_problem(c, d, KILN_EINVAL, "equation '%s' is malformed", eq);
	}
	if (nin == 1 && arrow) /* "ij->i": the output is the second term */
		memcpy(terms[2], terms[1], sizeof terms[2]), len[2] = len[1];
	const char *out = terms[2];
	int nout = len[2];
	uint32_t x[2] = {onnx_input(c, d, 0, true), nin > 1 ? onnx_input(c, d, 1, true) : 0};
	int64_t dim[128];
	bool seen[128] = {0};
	for (int t = 0; t < nin; t++) {
		const ir_type *ty = x[t] ? &c->g->val[x[t]]->type : NULL;
		if (!ty)
			return;
		if (ty->rank != len[t])
			return (void)onnx_problem(c, d, KILN_EINVAL, "term '%s' for input %d of rank %d", terms[t],
			                          t, ty->rank);
		for (int i = 0; i < len[t]; i++) {
			int ch = (unsigned char)terms[t][i];
			if (strchr(terms[t] + i + 1, ch))
				return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "equation '%s': letter '%c' "
				                          "twice in one term (a diagonal)", eq, ch);
			if (seen[ch] && dim[ch] != ty->dim[i]) {
				char da[64], db[64];
				return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "equation '%s': letter '%c' "
				                          "is %s and %s long (kiln does not broadcast "
				                          "Einsum's operands)", eq, ch,
				                          ir_dim_str(c->g, dim[ch], da, sizeof da),
				                          ir_dim_str(c->g, ty->dim[i], db, sizeof db));
			}
			dim[ch] = ty->dim[i];
			seen[ch] = true;
		}
	}
	for (int i = 0; i < nout; i++)
		if (!seen[(unsigned char)out[i]])
			return (void)onnx_problem(c, d, KILN_EINVAL, "equation '%s': output letter '%c' is "
			                          "in no input", eq, out[i]);
	/* sum what only one operand has and the output lacks */
	for (int t = 0; t < nin; t++) {
		int64_t axes[KILN_MAX_RANK];
		int na = 0, kept = 0;
		char rest[KILN_MAX_RANK + 1] = {0};
		for (int i = 0; i < len[t]; i++) {
			char ch = terms[t][i];
			bool other = nin > 1 && strchr(terms[1 - t], ch);
			if (!strchr(out, ch) && !other)
				axes[na++] = i;
			else
				rest[kept++] = ch;
		}
		if (!na)
			continue;
		ir_node *r = onnx_extra(c, d, KILN_OP_REDUCE_SUM, 1, &x[t], t ? "sum_b" : "sum_a");
		if (!r || ir_attr_set_ints(c->g, r, "axes", (uint32_t)na, axes) ||
		    ir_attr_set_int(c->g, r, "keepdims", 0) || !onnx_infer(c, d, r))
			return (void)(d->failed = true);
		x[t] = r->out[0];
		memcpy(terms[t], rest, sizeof rest);
		len[t] = kept;
	}
	uint32_t y;
	char yt[KILN_MAX_RANK + 1] = {0};
	if (nin == 1) {
		y = x[0];
		memcpy(yt, terms[0], sizeof yt);
	} else {
		char cls[4][KILN_MAX_RANK + 1] = {{0}}; /* batch, left, contracted, right */
		int nc[4] = {0};
		for (int i = 0; i < len[0]; i++) {
			char ch = terms[0][i];
			int w = strchr(terms[1], ch) ? (strchr(out, ch) ? 0 : 2) : 1;
			cls[w][nc[w]++] = ch;
		}
		for (int i = 0; i < len[1]; i++)
			if (!strchr(terms[0], terms[1][i]))
				cls[3][nc[3]++] = terms[1][i];
		int64_t pa[KILN_MAX_RANK], pb[KILN_MAX_RANK], ext[4] = {1, 1, 1, 1};
		int ka = 0, kb = 0;
		const int order_a[3] = {0, 1, 2}, order_b[3] = {0, 2, 3};
		for (int s = 0; s < 3; s++)
			for (int i = 0; i < nc[order_a[s]]; i++)
				pa[ka++] = strchr(terms[0], cls[order_a[s]][i]) - terms[0];
		for (int s = 0; s < 3; s++)
			for (int i = 0; i < nc[order_b[s]]; i++)
				pb[kb++] = strchr(terms[1], cls[order_b[s]][i]) - terms[1];
		for (int w = 0; w < 4; w++)
			for (int i = 0; i < nc[w]; i++)
				ext[w] = ir_dim_mul(c->g, ext[w], dim[(unsigned char)cls[w][i]]);
		int64_t sa[3] = {ext[0], ext[1], ext[2]}, sb[3] = {ext[0], ext[2], ext[3]};
		if (!one_symbolic(c, 3, sa) || !one_symbolic(c, 3, sb))
			return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "equation '%s': more than one "
			                          "symbolic extent among batch, kept and contracted "
			                          "letters (kiln reshapes them to 3-D)", eq);
		uint32_t a = permuted(c, d, x[0], len[0], pa, "a_ordered");
		uint32_t b = permuted(c, d, x[1], len[1], pb, "b_ordered");
		a = reshape_to(c, d, a, 3, sa, "a_3d");
		b = reshape_to(c, d, b, 3, sb, "b_3d");
		y = b2(c, d, KILN_OP_MATMUL, a, b, "product");
		int64_t shape[KILN_MAX_RANK];
		int ny = 0;
		const int order_y[3] = {0, 1, 3};
		for (int s = 0; s < 3; s++)
			for (int i = 0; i < nc[order_y[s]]; i++) {
				char ch = cls[order_y[s]][i];
				yt[ny] = ch;
				shape[ny++] = dim[(unsigned char)ch];
			}
		if (!one_symbolic(c, ny, shape))
			return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "equation '%s': the output has "
			                          "more than one symbolic extent", eq);
		y = reshape_to(c, d, y, ny, shape, "unflattened");
	}
	int64_t perm[KILN_MAX_RANK];
	for (int i = 0; i < nout; i++)
		perm[i] = strchr(yt, out[i]) - yt;
	y = permuted(c, d, y, nout, perm, "output_order");
	u1(c, d, KILN_OP_IDENTITY, y, NULL);
}

/* ReverseSequence with lengths known at import: GatherElements along the
 * time axis by the constant index t < len[b] ? len[b] - 1 - t : t. */
static void reverse_sequence(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true);
	const kiln_tensor *lens = onnx_const_input(c, d, 1, "sequence_lens", true);
	const ir_type *t = x && !d->failed ? fixed_dims(c, d, x, 0, "ReverseSequence") : NULL;
	if (!t)
		return;
	int64_t ta = int_attr(d, "time_axis", 0), ba = int_attr(d, "batch_axis", 1);
	if (t->rank < 2 || ta == ba || ta < 0 || ta > 1 || ba < 0 || ba > 1 ||
	    kiln_tensor_numel(lens) != t->dim[ba])
		return (void)onnx_problem(c, d, KILN_EINVAL, "needs time and batch axes 0 and 1 and "
		                          "one length per batch row (rank %d, %lld lengths)", t->rank,
		                          (long long)kiln_tensor_numel(lens));
	int64_t n = 1, coord[KILN_MAX_RANK];
	for (int i = 0; i < t->rank; i++)
		n *= t->dim[i];
	kiln_tensor *idx = ir_tensor_new(c->g, KILN_I64, t->rank, t->dim);
	for (int64_t i = 0; idx && i < n; i++) {
		int64_t rest = i;
		for (int k = t->rank - 1; k >= 0; k--)
			coord[k] = rest % t->dim[k], rest /= t->dim[k];
		int64_t len = ir_load_i64(lens, coord[ba]), tt = coord[ta];
		if (len < 0 || len > t->dim[ta])
			return (void)onnx_problem(c, d, KILN_EINVAL, "sequence_lens[%lld] is %lld, beyond "
			                          "the %lld steps", (long long)coord[ba], (long long)len,
			                          (long long)t->dim[ta]);
		ir_store_i64(idx, i, tt < len ? len - 1 - tt : tt);
	}
	uint32_t iv = tconst(c, d, idx, "reversed_index");
	ir_node *g = iv ? onnx_extra(c, d, KILN_OP_GATHER_ELEMENTS, 2, (uint32_t[]){x, iv}, NULL) : NULL;
	if (!g || (ta && ir_attr_set_int(c->g, g, "axis", ta)))
		return (void)(d->failed = true);
	d->n = g;
}

/* BitShift of unsigned integers: x * 2^y (bits past the top are lost) or
 * x / 2^y. */
static void bit_shift(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true), y = onnx_input(c, d, 1, true);
	const Onnx__AttributeProto *a = onnx_attr(d, "direction");
	bool left = a && a->s.len == 4 && !memcmp(a->s.data, "LEFT", 4);
	bool right = a && a->s.len == 5 && !memcmp(a->s.data, "RIGHT", 5);
	if (d->failed)
		return;
	if (!left && !right)
		return (void)onnx_problem(c, d, KILN_EINVAL, "direction must be LEFT or RIGHT");
	if (dtype(c, x) != KILN_U8)
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "shifts %s: kiln's only unsigned "
		                          "type is u8", kiln_dtype_name(dtype(c, x)));
	uint32_t p = b2(c, d, KILN_OP_POW, kconst(c, d, KILN_U8, 2, "two"), y, "power");
	b2(c, d, left ? KILN_OP_MUL : KILN_OP_DIV, x, p, NULL);
}

static void cast_like(onnx_imp *c, onnx_nd *d);

static const struct {
	const char *name;
	void (*import)(onnx_imp *c, onnx_nd *d);
} composites[] = {
	{"ReduceL1", reduce_l1},
	{"ReduceL2", reduce_l2},
	{"ReduceSumSquare", reduce_sum_square},
	{"ReduceLogSum", reduce_log_sum},
	{"ReduceLogSumExp", reduce_log_sum_exp},
	{"ArgMin", argmin},
	{"Sign", sign},
	{"Sinh", sinh_op},
	{"Cosh", cosh_op},
	{"Asinh", asinh_op},
	{"Acosh", acosh_op},
	{"Atanh", atanh_op},
	{"GreaterOrEqual", greater_or_equal},
	{"LessOrEqual", less_or_equal},
	{"Xor", xor_op},
	{"PRelu", prelu},
	{"GlobalMaxPool", global_max_pool},
	{"DepthToSpace", depth_to_space},
	{"SpaceToDepth", space_to_depth},
	{"Tile", tile},
	{"Trilu", trilu},
	{"ConstantOfShape", constant_of_shape},
	{"InstanceNormalization", instance_norm},
	{"Size", size_op},
	{"Sum", sum_op},
	{"Mean", mean_op},
	{"Shrink", shrink},
	{"Hardmax", hardmax},
	{"OneHot", one_hot},
	{"Mod", mod_op},
	{"CastLike", cast_like},
	{"EyeLike", eye_like},
	{"IsNaN", is_nan},
	{"IsInf", is_inf},
	{"Tan", tan_op},
	{"HannWindow", hann_window},
	{"HammingWindow", hamming_window},
	{"BlackmanWindow", blackman_window},
	{"Compress", compress},
	{"CumSum", cum_sum},
	{"LRN", lrn},
	{"Upsample", upsample},
	{"Scatter", scatter},
	{"Einsum", einsum},
	{"ReverseSequence", reverse_sequence},
	{"BitShift", bit_shift},
};

bool onnx_import_composite(onnx_imp *c, onnx_nd *d)
{
	for (size_t i = 0; d->p->op_type && i < sizeof composites / sizeof *composites; i++)
		if (!strcmp(d->p->op_type, composites[i].name)) {
			composites[i].import(c, d);
			return true;
		}
	return false;
}

bool onnx_op_imports(const char *domain, const char *op_type)
{
	if (!op_type)
		return false;
	if (domain && !strcmp(domain, "com.microsoft"))
		return onnx_msft_op(op_type);
	if (domain && *domain && strcmp(domain, "ai.onnx"))
		return false;
	for (size_t i = 0; i < sizeof composites / sizeof *composites; i++)
		if (!strcmp(op_type, composites[i].name))
			return true;
	return ir_op_from_onnx(op_type) != KILN_OP_COUNT;
}

/* CastLike(x, like): Cast to like's dtype. */
static void cast_like(onnx_imp *c, onnx_nd *d)
{
	uint32_t x = onnx_input(c, d, 0, true), like = onnx_input(c, d, 1, true);
	ir_node *n = x && like ? onnx_extra(c, d, KILN_OP_CAST, 1, &x, NULL) : NULL;
	if (!n || ir_attr_set_dtype(c->g, n, "to", c->g->val[like]->type.dtype))
		return (void)(d->failed = true);
	d->n = n;
}
