/*
 * fold.c: the `fold` pass, constant folding through the interpreter.
 *
 * A node whose inputs are all outputs of Constant nodes is computed now,
 * by ir_interp_node, the very kernels kiln_graph_run executes, so a folded
 * graph and an unfolded one cannot disagree; each used output becomes a new
 * Constant node holding the result, and the folded node goes.  Shape is
 * folded whenever the dims it reports are known, whatever its input is.
 * One forward sweep folds whole constant chains, because a node's inputs are
 * replaced by constants before the sweep reaches it.
 *
 * What is not folded, and why:
 * - parameters (IR_V_PARAM): they are weights, replaced later by
 *   kiln_graph_load_params or changed by training, so their value at compile
 *   time is not their value at run time;
 * - random ops (IR_RANDOM) in training mode: each run must draw anew;
 * - nodes with a symbolic output dim (nothing concrete to compute);
 * - results above fold_max_elems (1M elements by default): folding must not
 *   turn a small Expand into megabytes of graph;
 * - nodes the interpreter rejects: they stay, so running the graph reports
 *   the error where it happens instead of the compiler.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

#define FOLD_MAX_ELEMS ((int64_t)1 << 20)



static bool wanted(const kiln_graph *g, uint32_t v)
{
	return g->val[v]->nuse > 0 || pass_is_output(g, v);
}

static int64_t numel(const ir_type *t)
{
	int64_t n = 1;
	for (int i = 0; i < t->rank; i++) {
		if (t->dim[i] < 0)
			return -1;
		if (t->dim[i] && n > INT64_MAX / t->dim[i])
			return INT64_MAX;
		n *= t->dim[i];
	}
	return n;
}

/* Replaces value v by a new Constant holding t (copied); the Constant takes
 * v's name and location, so the printed IR still reads as the user wrote it. */
static kiln_status replace(kiln_graph *g, const ir_node *n, uint32_t v, const kiln_tensor *t)
{
	ir_node *c = ir_node_new(g, KILN_OP_CONSTANT, 0, NULL, 1, n->loc);
	if (!c || ir_attr_set_tensor(g, c, "value", t) != KILN_OK)
		return g->status;
	c->name = n->name;
	ir_value *old = g->val[v], *nv = g->val[c->out[0]];
	nv->type = old->type;
	nv->name = old->name;
	old->name = NULL;
	ir_replace_uses(g, v, c->out[0]);
	return g->status;
}

/* Removes n, then any Constant that fed only n and is not a graph output. */
static void drop(kiln_graph *g, ir_node *n)
{
	ir_node_remove(g, n);
	for (uint32_t i = 0; i < n->nin; i++) {
		uint32_t v = n->in[i];
		if (pass_const_of(g, v) && !wanted(g, v))
			ir_node_remove(g, g->val[v]->def);
	}
}

static bool foldable(const kiln_graph *g, const ir_node *n, int64_t cap)
{
	if (n->op == KILN_OP_CONSTANT || n->nin == 0)
		return false;
	if ((ir_op(n->op)->flags & IR_RANDOM) && ir_attr_int(n, "training_mode", 0) != 0)
		return false;
	for (uint32_t i = 0; i < n->nin; i++)
		if (!pass_const_of(g, n->in[i]))
			return false;
	for (uint32_t k = 0; k < n->nout; k++) {
		const ir_type *t = &g->val[n->out[k]]->type;
		int64_t e = numel(t);
		if (t->dtype == KILN_DT_INVALID || e < 0 || e > cap)
			return false;
	}
	return true;
}

/* Runs n's kernel on its constant inputs; *done tells whether it folded. */
static kiln_status eval(kiln_graph *g, ir_node *n, bool *done)
{
	kiln_tensor **in = calloc(n->nin + n->nout, sizeof *in), **out = in + n->nin;
	kiln_status st = KILN_OK;
	if (!in)
		return ir_errorf(g, n, KILN_ENOMEM, "fold: out of memory");
	for (uint32_t i = 0; i < n->nin; i++)
		in[i] = (kiln_tensor *)pass_const_of(g, n->in[i]); /* kernels only read inputs */
	for (uint32_t k = 0; k < n->nout && st == KILN_OK; k++) {
		const ir_type *t = &g->val[n->out[k]]->type;
		if (!(out[k] = kiln_tensor_new(t->dtype, t->rank, t->dim)))
			st = ir_errorf(g, n, KILN_ENOMEM, "fold: out of memory");
	}
	kiln_error e = {0};
	ir_interp c = {.g = g, .err = &e, .seed = 0};
	if (st == KILN_OK && ir_interp_node(&c, n, in, out) == KILN_OK) {
		for (uint32_t k = 0; k < n->nout && st == KILN_OK; k++)
			if (wanted(g, n->out[k]))
				st = replace(g, n, n->out[k], out[k]);
		if (st == KILN_OK) {
			drop(g, n);
			*done = true;
		}
	} else if (e.code == KILN_ENOMEM) {
		st = ir_errorf(g, n, KILN_ENOMEM, "fold: %s", e.msg);
	}
	for (uint32_t k = 0; k < n->nout; k++)
		kiln_tensor_free(out[k]);
	free(in);
	return st;
}

/* Shape's result is its input's dims [start, end) (ONNX clamping), known
 * whenever those dims are, even for a non-constant input. */
static kiln_status shape(kiln_graph *g, ir_node *n, bool *done)
{
	const ir_type *t = &g->val[n->in[0]]->type, *ot = &g->val[n->out[0]]->type;
	int64_t r = t->rank, s = ir_attr_int(n, "start", 0);
	int64_t e = ir_attr_get(n, "end") ? ir_attr_int(n, "end", r) : r;
	s = s < 0 ? s + r : s;
	e = e < 0 ? e + r : e;
	s = s < 0 ? 0 : s > r ? r : s;
	e = e < s ? s : e > r ? r : e;
	if (t->dtype == KILN_DT_INVALID || ot->dtype != KILN_I64 || ot->rank != 1 ||
	    ot->dim[0] != e - s)
		return KILN_OK; /* stale types: leave it to infer and verify */
	for (int64_t i = s; i < e; i++)
		if (t->dim[i] < 0)
			return KILN_OK;
	int64_t len = e - s;
	kiln_tensor *v = kiln_tensor_new(KILN_I64, 1, &len);
	if (!v)
		return ir_errorf(g, n, KILN_ENOMEM, "fold: out of memory");
	memcpy(v->data, t->dim + s, len * sizeof(int64_t));
	kiln_status st = wanted(g, n->out[0]) ? replace(g, n, n->out[0], v) : KILN_OK;
	kiln_tensor_free(v);
	if (st == KILN_OK) {
		drop(g, n);
		*done = true;
	}
	return st;
}

kiln_status pass_fold(kiln_graph *g, const pass_opts *o)
{
	int64_t cap = o && o->fold_max_elems > 0 ? o->fold_max_elems : FOLD_MAX_ELEMS;
	uint32_t count = g->nnode; /* the Constants it appends need no visit */
	bool changed = false;
	for (uint32_t i = 0; i < count && g->status == KILN_OK; i++) {
		ir_node *n = g->node[i];
		if (n->dead)
			continue;
		if (n->op == KILN_OP_SHAPE)
			shape(g, n, &changed);
		else if (foldable(g, n, cap))
			eval(g, n, &changed);
	}
	if (g->status != KILN_OK || !changed)
		return g->status;
	/* new Constants sit at the end of the schedule, after their readers;
	 * compact first, since toposort must not see dead nodes */
	if (ir_compact(g) != KILN_OK)
		return g->status;
	return ir_toposort(g);
}
