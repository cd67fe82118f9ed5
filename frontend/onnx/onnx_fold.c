/*
 * onnx_fold.c: what the importer knows about values at import time: the
 * constant tensor behind a value, and, for small integer vectors computed
 * from shapes, each element as a number or a symbolic kiln dim.
 *
 * Exporters compute Reshape and Expand shapes at run time from Shape(x):
 * Shape -> Gather -> Unsqueeze -> Concat -> Reshape.  With fixed dims the
 * whole chain is constant and folds by running each node's interpreter
 * kernel on its constant inputs.  With a symbolic batch ("N") it is not,
 * but its elements are still dims kiln can name, so a small symbolic
 * evaluator follows such vectors through the usual shape-arithmetic ops
 * (one rule per op, in a table).  Where the vector ends up as Reshape's
 * shape, an element equal to the input's dim at the same place becomes 0
 * ("copy") and one other unknown becomes -1: the static attribute kiln
 * needs, derived from the symbolic shape.
 */
#include <stdlib.h>
#include <string.h>

#include "frontend/onnx/onnx.h"

#define FOLD_MAX_ELEMS (1 << 16) /* fold only small results */

/* ---- storage ---------------------------------------------------------------- */

const kiln_tensor *onnx_const(const onnx_imp *c, uint32_t v)
{
	return v && v < c->capcval ? c->cval[v] : NULL;
}

static bool grow(onnx_imp *c, uint32_t v)
{
	if (v < c->capcval)
		return true;
	uint32_t cap = c->capcval ? c->capcval : 64;
	while (cap <= v)
		cap *= 2;
	const kiln_tensor **p = realloc(c->cval, cap * sizeof *p);
	if (p)
		c->cval = p;
	const onnx_svec **s = p ? realloc(c->sval, cap * sizeof *s) : NULL;
	if (!s)
		return false;
	c->sval = s;
	memset(p + c->capcval, 0, (cap - c->capcval) * sizeof *p);
	memset(s + c->capcval, 0, (cap - c->capcval) * sizeof *s);
	c->capcval = cap;
	return true;
}

bool onnx_const_set(onnx_imp *c, uint32_t v, const kiln_tensor *t)
{
	if (!grow(c, v))
		return false;
	c->cval[v] = t;
	return true;
}

static bool is_int(kiln_dtype dt)
{
	return dt == KILN_I64 || dt == KILN_I32;
}

/* A small integer constant reads as a vector of numbers. */
const onnx_svec *onnx_svec_of(onnx_imp *c, uint32_t v)
{
	if (v && v < c->capcval && c->sval[v])
		return c->sval[v];
	const kiln_tensor *t = onnx_const(c, v);
	if (!t || !is_int(t->dtype) || t->rank > 1 || kiln_tensor_numel(t) > ONNX_SVEC_MAX)
		return NULL;
	onnx_svec *s = ir_alloc(c->g->arena, sizeof *s);
	if (!s)
		return NULL;
	s->rank = t->rank;
	s->n = (int)kiln_tensor_numel(t);
	for (int i = 0; i < s->n; i++)
		s->v[i] = ir_load_i64(t, i);
	return c->sval[v] = s;
}

/* Records s for v, and the constant it is when every element is a number. */
static void svec_set(onnx_imp *c, uint32_t v, const onnx_svec *s)
{
	onnx_svec *p = ir_alloc(c->g->arena, sizeof *p);
	const ir_type *t = &c->g->val[v]->type;
	if (!p || !grow(c, v))
		return;
	*p = *s;
	c->sval[v] = p;
	bool fixed = is_int(t->dtype) && t->rank == s->rank;
	for (int i = 0; i < s->n && fixed; i++)
		fixed = !s->sym[i];
	int64_t n = s->n;
	kiln_tensor *k = fixed ? ir_tensor_new(c->g, t->dtype, s->rank, &n) : NULL;
	for (int i = 0; k && i < s->n; i++)
		ir_store_i64(k, i, s->v[i]);
	if (k)
		c->cval[v] = k;
}

/* ---- symbolic rules: one per shape-arithmetic op ---------------------------- */

typedef bool (*sym_rule)(onnx_imp *c, const ir_node *n, onnx_svec *o);

static int64_t clampi(int64_t v, int64_t lo, int64_t hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

static bool sym_shape(onnx_imp *c, const ir_node *n, onnx_svec *o)
{
	const ir_type *x = &c->g->val[n->in[0]]->type;
	int64_t r = x->rank, start = ir_attr_int(n, "start", 0), end = ir_attr_int(n, "end", r);
	start = clampi(start < 0 ? start + r : start, 0, r);
	end = clampi(end < 0 ? end + r : end, 0, r);
	o->rank = 1;
	for (int64_t i = start; i < end; i++, o->n++) {
		o->v[o->n] = x->dim[i];
		o->sym[o->n] = x->dim[i] < 0;
	}
	return true;
}

/* Gather along axis 0 of a vector, at constant indices. */
static bool sym_gather(onnx_imp *c, const ir_node *n, onnx_svec *o)
{
	const onnx_svec *x = onnx_svec_of(c, n->in[0]), *idx = onnx_svec_of(c, n->in[1]);
	int64_t axis = ir_attr_int(n, "axis", 0);
	if (!x || !idx || x->rank != 1 || (axis != 0 && axis != -1))
		return false;
	o->rank = idx->rank;
	for (int i = 0; i < idx->n; i++, o->n++) {
		int64_t k = idx->v[i] < 0 ? idx->v[i] + x->n : idx->v[i];
		if (idx->sym[i] || k < 0 || k >= x->n)
			return false;
		o->v[o->n] = x->v[k], o->sym[o->n] = x->sym[k];
	}
	return true;
}

/* Unsqueeze of a scalar, Squeeze of a one-element vector, Cast and
 * Identity between integer types: the elements stay. */
static bool sym_same(onnx_imp *c, const ir_node *n, onnx_svec *o)
{
	const onnx_svec *x = onnx_svec_of(c, n->in[0]);
	const ir_type *t = &c->g->val[n->out[0]]->type;
	if (!x || !is_int(t->dtype) || t->rank > 1 || (t->rank == 1 && t->dim[0] != x->n))
		return false;
	*o = *x;
	o->rank = t->rank;
	return true;
}

static bool sym_concat(onnx_imp *c, const ir_node *n, onnx_svec *o)
{
	o->rank = 1;
	for (uint32_t k = 0; k < n->nin; k++) {
		const onnx_svec *x = onnx_svec_of(c, n->in[k]);
		if (!x || x->rank != 1 || o->n + x->n > ONNX_SVEC_MAX)
			return false;
		memcpy(o->v + o->n, x->v, x->n * sizeof *x->v);
		memcpy(o->sym + o->n, x->sym, x->n * sizeof *x->sym);
		o->n += x->n;
	}
	return true;
}

/* Slice of a vector with step 1 along axis 0. */
static bool sym_slice(onnx_imp *c, const ir_node *n, onnx_svec *o)
{
	const onnx_svec *x = onnx_svec_of(c, n->in[0]);
	const int64_t *st, *en, *ax, *sp;
	uint32_t ns = ir_attr_ints(n, "starts", &st), ne = ir_attr_ints(n, "ends", &en);
	uint32_t na = ir_attr_ints(n, "axes", &ax), nsp = ir_attr_ints(n, "steps", &sp);
	if (!x || x->rank != 1 || ns != 1 || ne != 1 || (na && (na != 1 || (ax[0] != 0 && ax[0] != -1))) ||
	    (nsp && (nsp != 1 || sp[0] != 1)))
		return false;
	int64_t b = clampi(st[0] < 0 ? st[0] + x->n : st[0], 0, x->n);
	int64_t e = clampi(en[0] < 0 ? en[0] + x->n : en[0], 0, x->n);
	o->rank = 1;
	for (int64_t i = b; i < e; i++, o->n++)
		o->v[o->n] = x->v[i], o->sym[o->n] = x->sym[i];
	return true;
}

/* One element of Add/Sub/Mul/Div: numbers compute as ONNX integers do;
 * with a symbol, only what kiln's dim expressions can say. */
static bool arith(kiln_graph *g, kiln_op op, int64_t a, bool sa, int64_t b, bool sb,
                  int64_t *r, bool *sr)
{
	if (op == KILN_OP_EQUAL) { /* a symbol (a size, >= 1) differs from any number below 1 */
		if ((sa && sb && a != b) || (sa != sb && (sa ? b : a) >= 1))
			return false;
		*sr = false, *r = a == b && sa == sb;
		return true;
	}
	*sr = sa || sb;
	if (!*sr) {
		*r = op == KILN_OP_ADD ? a + b : op == KILN_OP_SUB ? a - b : op == KILN_OP_MUL ? a * b
		   : b ? a / b : 0;
		return op != KILN_OP_DIV || b != 0;
	}
	if (op == KILN_OP_SUB && sa && sb && a == b)
		return *r = 0, !(*sr = false);
	if ((!sa && a < 0) || (!sb && b < 0) || op == KILN_OP_SUB)
		return false;
	if (op == KILN_OP_DIV && (sb || b == 0))
		return false;
	*r = op == KILN_OP_ADD ? ir_dim_add(g, a, b) : op == KILN_OP_MUL ? ir_dim_mul(g, a, b)
	   : ir_dim_div(g, a, b);
	return true;
}

static bool sym_arith(onnx_imp *c, const ir_node *n, onnx_svec *o)
{
	const onnx_svec *a = onnx_svec_of(c, n->in[0]), *b = onnx_svec_of(c, n->in[1]);
	if (!a || !b || (a->n != b->n && a->n != 1 && b->n != 1))
		return false;
	o->rank = a->rank > b->rank ? a->rank : b->rank;
	o->n = a->n > b->n ? a->n : b->n;
	for (int i = 0; i < o->n; i++) {
		int ia = a->n == 1 ? 0 : i, ib = b->n == 1 ? 0 : i;
		if (!arith(c->g, n->op, a->v[ia], a->sym[ia], b->v[ib], b->sym[ib], &o->v[i],
		           &o->sym[i]))
			return false;
	}
	return true;
}

/* Where of vectors with a known condition: the elements it picks. */
static bool sym_where(onnx_imp *c, const ir_node *n, onnx_svec *o)
{
	const onnx_svec *k = onnx_svec_of(c, n->in[0]), *a = onnx_svec_of(c, n->in[1]);
	const onnx_svec *b = onnx_svec_of(c, n->in[2]);
	if (!k || !a || !b)
		return false;
	o->n = k->n > a->n ? k->n : a->n;
	o->n = o->n > b->n ? o->n : b->n;
	o->rank = o->n == 1 && k->rank == 0 && a->rank == 0 && b->rank == 0 ? 0 : 1;
	for (int i = 0; i < o->n; i++) {
		int ik = k->n == 1 ? 0 : i, ia = a->n == 1 ? 0 : i, ib = b->n == 1 ? 0 : i;
		if (k->sym[ik] || (k->n != 1 && k->n != o->n) || (a->n != 1 && a->n != o->n) ||
		    (b->n != 1 && b->n != o->n))
			return false;
		const onnx_svec *s = k->v[ik] ? a : b;
		int is = k->v[ik] ? ia : ib;
		o->v[i] = s->v[is], o->sym[i] = s->sym[is];
	}
	return true;
}

static const sym_rule sym_rules[KILN_OP_COUNT] = {
	[KILN_OP_EQUAL] = sym_arith, [KILN_OP_WHERE] = sym_where, [KILN_OP_RESHAPE] = sym_same,
	[KILN_OP_SHAPE] = sym_shape, [KILN_OP_GATHER] = sym_gather,
	[KILN_OP_UNSQUEEZE] = sym_same, [KILN_OP_SQUEEZE] = sym_same, [KILN_OP_CAST] = sym_same,
	[KILN_OP_IDENTITY] = sym_same, [KILN_OP_CONCAT] = sym_concat, [KILN_OP_SLICE] = sym_slice,
	[KILN_OP_ADD] = sym_arith, [KILN_OP_SUB] = sym_arith, [KILN_OP_MUL] = sym_arith,
	[KILN_OP_DIV] = sym_arith,
};

/* ---- folding ----------------------------------------------------------------- */

/* Runs n's kernel when all its inputs are known and its outputs small. */
static bool fold_values(onnx_imp *c, const ir_node *n)
{
	kiln_tensor *in[IR_VARIADIC + 1] = {0}, *out[IR_VARIADIC + 1] = {0};
	if ((ir_op(n->op)->flags & IR_RANDOM) || n->nin > IR_VARIADIC || n->nout > IR_VARIADIC)
		return false;
	for (uint32_t i = 0; i < n->nin; i++)
		if (!(in[i] = (kiln_tensor *)onnx_const(c, n->in[i])))
			return false;
	for (uint32_t i = 0; i < n->nout; i++) {
		const ir_type *t = &c->g->val[n->out[i]]->type;
		int64_t numel = 1;
		for (int k = 0; k < t->rank && numel <= FOLD_MAX_ELEMS; k++)
			numel = t->dim[k] > FOLD_MAX_ELEMS ? FOLD_MAX_ELEMS + 1 : numel * t->dim[k];
		if (!ir_type_concrete(t) || numel > FOLD_MAX_ELEMS ||
		    !(out[i] = ir_tensor_new(c->g, t->dtype, t->rank, t->dim)))
			return false;
	}
	kiln_error err = {0};
	ir_interp ic = {c->g, &err, 0};
	if (ir_interp_node(&ic, n, in, out) != KILN_OK)
		return false; /* left to run time, which reports it */
	for (uint32_t i = 0; i < n->nout; i++)
		onnx_const_set(c, n->out[i], out[i]);
	return true;
}

void onnx_fold(onnx_imp *c, const ir_node *n)
{
	const ir_attr *a = ir_attr_get(n, "value");
	onnx_svec s = {0};
	if (n->op == KILN_OP_CONSTANT) {
		if (a && a->kind == IR_A_TENSOR)
			onnx_const_set(c, n->out[0], a->u.t);
	} else if (!fold_values(c, n) && sym_rules[n->op] && n->nout == 1 &&
	           sym_rules[n->op](c, n, &s)) {
		svec_set(c, n->out[0], &s);
	}
}
