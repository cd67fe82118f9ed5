/*
 * canon.c: the `canonicalize` pass, local rewrites that remove data
 * movement which computes nothing.
 *
 *   identity(x)                         -> x
 *   dropout(x) outside training         -> x      (its mask unused)
 *   concat(x) of one input              -> x      (DenseNet's first layer
 *                                                  of each block)
 *   transpose(transpose(x, p), q)       -> transpose(x, p∘q), or x if that is
 *                                          the identity (any lone identity
 *                                          permutation goes too)
 *   view(view(x)), view one of Reshape, Flatten, Squeeze, Unsqueeze
 *                                       -> reshape(x), or x when the shapes
 *                                          agree (an Unsqueeze undoing a
 *                                          Squeeze cancels)
 *   a view to its input's own shape     -> x
 *
 * One forward sweep suffices: a node's producer has already been rewritten
 * when the sweep reaches it, so chains collapse pairwise from the front.
 * A rewrite that replaces a value by another keeps graph outputs' names:
 * the replacement takes the name, which only a node result that is not
 * itself a graph output can do (an Identity from a graph input to a graph
 * output stays, since both names must survive).  Every new node's type is
 * re-inferred and must equal the type it replaces, else the rewrite is not
 * done, so the graph keeps verifying.  Producers a rewrite leaves unused go
 * with it.
 */
#include <string.h>

#include "passes/passes.h"


static bool unused(const kiln_graph *g, uint32_t v)
{
	return g->val[v]->nuse == 0 && !pass_is_output(g, v);
}

/* Removes n, then whatever fed only n (kiln ops are pure). */
static void drop(kiln_graph *g, ir_node *n)
{
	ir_node_remove(g, n);
	for (uint32_t i = 0; i < n->nin; i++) {
		const ir_value *x = g->val[n->in[i]];
		bool dead = x->kind == IR_V_NODE && x->def && !x->def->dead;
		for (uint32_t k = 0; dead && k < x->def->nout; k++)
			dead = unused(g, x->def->out[k]);
		if (dead)
			drop(g, x->def);
	}
}

/* Every use of n's result now reads src, of the same type; false when the
 * names cannot be kept. */
static bool forward(kiln_graph *g, ir_node *n, uint32_t src)
{
	ir_value *y = g->val[n->out[0]], *x = g->val[src];
	if (!ir_type_eq(&x->type, &y->type))
		return false;
	if (pass_is_output(g, n->out[0])) {
		if (x->kind != IR_V_NODE || pass_is_output(g, src))
			return false;
		if (y->name)
			x->name = y->name;
		y->name = NULL;
	}
	ir_replace_uses(g, n->out[0], src);
	drop(g, n);
	return true;
}

/* Infers f's type speculatively: a failure only means the rewrite is not
 * done, so it must not stay as the graph's sticky error. */
static bool try_infer(kiln_graph *g, ir_node *f)
{
	if (ir_infer_node(g, f) == KILN_OK)
		return true;
	if (g->status != KILN_ENOMEM) {
		g->status = KILN_OK;
		g->errmsg[0] = 0;
	}
	return false;
}

/* n replaced by f, a new node of the same result type; f goes instead when
 * its type differs. */
static bool replace(kiln_graph *g, ir_node *n, ir_node *f)
{
	if (!f)
		return false;
	f->name = n->name;
	ir_value *y = g->val[n->out[0]], *fy = g->val[f->out[0]];
	if (!try_infer(g, f) || !ir_type_eq(&y->type, &fy->type)) {
		ir_node_remove(g, f);
		return false;
	}
	fy->name = y->name;
	y->name = NULL;
	ir_replace_uses(g, n->out[0], f->out[0]);
	drop(g, n);
	return true;
}

static const ir_node *producer(const kiln_graph *g, const ir_node *n)
{
	const ir_value *x = g->val[n->in[0]];
	return x->kind == IR_V_NODE && x->def && !x->def->dead ? x->def : NULL;
}

typedef bool (*rule_fn)(kiln_graph *g, ir_node *n);

static bool identity(kiln_graph *g, ir_node *n)
{
	return forward(g, n, n->in[0]);
}

static bool concat1(kiln_graph *g, ir_node *n)
{
	return n->nin == 1 && forward(g, n, n->in[0]);
}

static bool dropout(kiln_graph *g, ir_node *n)
{
	if (ir_attr_int(n, "training_mode", 0) || (n->nout > 1 && !unused(g, n->out[1])))
		return false;
	return forward(g, n, n->in[0]);
}

/* n's permutation (reversed dims when absent); false if malformed. */
static bool perm_of(const ir_node *n, int rank, int64_t *p)
{
	const int64_t *a;
	uint32_t na = ir_attr_ints(n, "perm", &a);
	if (na && na != (uint32_t)rank)
		return false;
	for (int d = 0; d < rank; d++) {
		p[d] = na ? (a[d] < 0 ? a[d] + rank : a[d]) : rank - 1 - d;
		if (p[d] < 0 || p[d] >= rank)
			return false;
	}
	return true;
}

/* out[i] = in[p[i]], so transpose(transpose(x, p), q) reads x at p[q[i]]. */
static bool transpose(kiln_graph *g, ir_node *n)
{
	const ir_node *p = producer(g, n);
	int rank = g->val[n->in[0]]->type.rank;
	int64_t q[KILN_MAX_RANK], pp[KILN_MAX_RANK], c[KILN_MAX_RANK];
	bool pair = p && p->op == KILN_OP_TRANSPOSE;
	if (!perm_of(n, rank, q) || (pair && !perm_of(p, rank, pp)))
		return false;
	bool ident = true;
	for (int d = 0; d < rank; d++) {
		c[d] = pair ? pp[q[d]] : q[d];
		ident = ident && c[d] == d;
	}
	uint32_t src = pair ? p->in[0] : n->in[0];
	if (ident)
		return forward(g, n, src);
	if (!pair)
		return false;
	ir_node *f = ir_node_new(g, KILN_OP_TRANSPOSE, 1, &src, 1, n->loc);
	return f && ir_attr_set_ints(g, f, "perm", (uint32_t)rank, c) == KILN_OK && replace(g, n, f);
}

static bool is_view(kiln_op op)
{
	return op == KILN_OP_RESHAPE || op == KILN_OP_FLATTEN || op == KILN_OP_SQUEEZE ||
	       op == KILN_OP_UNSQUEEZE;
}

/* Reshape's shape attribute taking x to y: fixed dims literally, a symbolic
 * dim as 0 (copy) where x has it at the same place, else one -1; false when
 * that cannot say it (a zero dim, two unresolved symbolic dims). */
static bool shape_attr(const ir_type *x, const ir_type *y, int64_t *s)
{
	bool infer = false;
	for (int d = 0; d < y->rank; d++) {
		if (y->dim[d] > 0)
			s[d] = y->dim[d];
		else if (y->dim[d] < 0 && d < x->rank && x->dim[d] == y->dim[d])
			s[d] = 0;
		else if (y->dim[d] < 0 && !infer)
			s[d] = -1, infer = true;
		else
			return false;
	}
	return true;
}

static bool view(kiln_graph *g, ir_node *n)
{
	const ir_node *p = producer(g, n);
	if (forward(g, n, n->in[0]))
		return true;
	if (!p || !is_view(p->op) || ir_attr_int(p, "allowzero", 0))
		return false;
	uint32_t src = p->in[0];
	if (forward(g, n, src))
		return true;
	int64_t s[KILN_MAX_RANK];
	const ir_type *y = &g->val[n->out[0]]->type;
	if (!shape_attr(&g->val[src]->type, y, s))
		return false;
	ir_node *f = ir_node_new(g, KILN_OP_RESHAPE, 1, &src, 1, n->loc);
	return f && ir_attr_set_ints(g, f, "shape", (uint32_t)y->rank, s) == KILN_OK &&
	       replace(g, n, f);
}

static const rule_fn rule[KILN_OP_COUNT] = {
	[KILN_OP_IDENTITY] = identity,
	[KILN_OP_DROPOUT] = dropout,
	[KILN_OP_CONCAT] = concat1,
	[KILN_OP_TRANSPOSE] = transpose,
	[KILN_OP_RESHAPE] = view,
	[KILN_OP_FLATTEN] = view,
	[KILN_OP_SQUEEZE] = view,
	[KILN_OP_UNSQUEEZE] = view,
};

kiln_status pass_canon(kiln_graph *g, const pass_opts *o)
{
	(void)o;
	uint32_t count = g->nnode; /* nodes it appends are already canonical */
	bool changed = false;
	for (uint32_t i = 0; i < count && g->status == KILN_OK; i++) {
		ir_node *n = g->node[i];
		if (!n->dead && rule[n->op] && rule[n->op](g, n))
			changed = true;
	}
	if (g->status != KILN_OK || !changed)
		return g->status;
	/* new nodes sit at the end of the schedule, after their readers */
	if (ir_compact(g) != KILN_OK)
		return g->status;
	return ir_toposort(g);
}
