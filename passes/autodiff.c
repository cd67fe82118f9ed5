/*
 * autodiff.c: reverse-mode differentiation of a graph, appending the
 * backward graph to it (kiln_grad and kiln_grad_params in kiln.h).
 *
 * The key idea: the schedule is already a topological order, so one
 * backward sweep over it visits every node after all of its consumers.
 * Before the sweep two marks prune the work: a forward mark of the values
 * that depend on a wrt value through differentiable ops with float
 * results, and a backward mark of the values the loss depends on; only
 * values with both carry gradients, so nothing off the wrt-to-loss path
 * gets a backward node.  The sweep seeds d(loss) = 1, calls each node's
 * rule (grad.c) with its output gradients, sums each input's contributions
 * with Add (fan-out), and first sums a rule's result back over broadcast
 * axes to the input's shape (ReduceSum, as tinygrad's gradient.py does),
 * so rules never deal with broadcasting.
 *
 * Saved values: the backward nodes read forward values directly, so by
 * default every value a rule touches is kept alive until its backward use
 * (storage).  Recomputing instead is a rewrite of this graph the memory
 * planner may make later, by cloning cheap forward nodes next to their
 * backward readers; nothing here fixes that choice.  On failure the graph
 * gets back exactly the nodes it had, with the error recorded; on success
 * the backward results nobody reads (a rule's unused input gradients) are
 * removed, so the graph holds no dead weight beyond removed-node slots that
 * the next ir_compact drops.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

enum { ACTIVE = 1, NEEDED = 2, LIVE = ACTIVE | NEEDED };

typedef struct ad {
	kiln_graph *g;
	uint32_t nval, nnode; /* the forward graph's size: backward ids are above */
	uint8_t *flag;        /* per forward value: ACTIVE, NEEDED */
	uint32_t *grad;       /* per forward value: its gradient so far, or 0 */
	uint32_t *dy, *dx;    /* scratch, one per output / input of a node */
} ad;

static bool live(const ad *a, uint32_t v)
{
	return v < a->nval && (a->flag[v] & LIVE) == LIVE;
}

/* ACTIVE: depends on a wrt value through ops with a gradient; NEEDED: the
 * loss depends on it. */
static void mark(ad *a, uint32_t loss, int nwrt, const uint32_t *wrt)
{
	kiln_graph *g = a->g;
	for (int i = 0; i < nwrt; i++)
		a->flag[wrt[i]] |= ACTIVE;
	for (uint32_t i = 0; i < a->nnode; i++) {
		const ir_node *n = g->node[i];
		bool in = false;
		for (uint32_t k = 0; k < n->nin && !n->dead; k++)
			in = in || (a->flag[n->in[k]] & ACTIVE);
		if (!in || (ir_op(n->op)->flags & IR_NODIFF))
			continue;
		for (uint32_t k = 0; k < n->nout; k++)
			if (kiln_dtype_is_float(g->val[n->out[k]]->type.dtype))
				a->flag[n->out[k]] |= ACTIVE;
	}
	a->flag[loss] |= NEEDED;
	for (uint32_t i = a->nnode; i-- > 0;) {
		const ir_node *n = g->node[i];
		bool out = false;
		for (uint32_t k = 0; k < n->nout && !n->dead; k++)
			out = out || (a->flag[n->out[k]] & NEEDED);
		for (uint32_t k = 0; out && k < n->nin; k++)
			a->flag[n->in[k]] |= NEEDED;
	}
}

/* d(loss)/d(loss) = 1, for a loss with exactly one element. */
static uint32_t seed(kiln_graph *g, kiln_loc loc, uint32_t loss)
{
	const ir_type *t = pass_gtype(g, loss);
	bool one = true;
	for (int i = 0; i < t->rank; i++)
		one = one && t->dim[i] == 1;
	if (!one || !kiln_dtype_is_float(t->dtype)) {
		char b[128];
		ir_errorf_at(g, loc, KILN_EINVAL, "gradient: the loss must be a float scalar, "
		             "got %s", ir_type_str(g, t, b, sizeof b));
		return 0;
	}
	kiln_tensor *s = kiln_tensor_new(t->dtype, t->rank, t->dim);
	if (s)
		ir_store(s, 0, 1.0);
	return pass_gconst(g, loc, s);
}

/* Sums a rule's gradient d for input k of n back to that input's type:
 * over the leading axes it lacks and the axes where it has size 1. */
static uint32_t fit(kiln_graph *g, const ir_node *n, uint32_t k, uint32_t d)
{
	const ir_type *x = pass_gtype(g, n->in[k]), *t = pass_gtype(g, d);
	int lead = t->rank - x->rank, nk = 0, nl = 0;
	int64_t keep[KILN_MAX_RANK], drop[KILN_MAX_RANK];
	bool ok = lead >= 0 && t->dtype == x->dtype;
	for (int i = 0; ok && i < x->rank; i++) {
		if (t->dim[lead + i] != x->dim[i])
			keep[nk++] = lead + i;
		ok = t->dim[lead + i] == x->dim[i] || x->dim[i] == 1;
	}
	if (!ok) {
		char a[128], b[128];
		ir_errorf(g, n, KILN_ESHAPE, "gradient for input %u is %s, which does not sum "
		          "back to the input's %s", (unsigned)k, ir_type_str(g, t, a, sizeof a),
		          ir_type_str(g, x, b, sizeof b));
		return 0;
	}
	for (int i = 0; i < lead; i++)
		drop[nl++] = i;
	if (nk)
		d = kiln_reduce_sum_at(g, n->loc, d, nk, keep, true);
	if (nl)
		d = kiln_reduce_sum_at(g, n->loc, d, nl, drop, false);
	return d;
}

/* Runs n's rule and adds each input's gradient into a->grad. */
static kiln_status step(ad *a, const ir_node *n)
{
	kiln_graph *g = a->g;
	bool any_out = false, any_in = false;
	for (uint32_t k = 0; k < n->nout; k++) {
		a->dy[k] = live(a, n->out[k]) ? a->grad[n->out[k]] : 0;
		any_out = any_out || a->dy[k];
	}
	for (uint32_t k = 0; k < n->nin; k++) {
		any_in = any_in || live(a, n->in[k]);
		a->dx[k] = 0;
	}
	if (!any_out || !any_in)
		return KILN_OK;
	pass_grad_fn rule = pass_grad_rule(n->op);
	if (!rule)
		return ir_errorf(g, n, KILN_EUNSUPPORTED, "no gradient rule for %s",
		                 ir_op(n->op)->onnx);
	kiln_status st = rule(g, n, a->dy, a->dx);
	for (uint32_t k = 0; k < n->nin && st == KILN_OK; k++) {
		uint32_t v = n->in[k], d = a->dx[k];
		if (!d || !live(a, v))
			continue;
		d = fit(g, n, k, d);
		a->grad[v] = a->grad[v] ? kiln_add_at(g, n->loc, a->grad[v], d) : d;
		st = g->status;
	}
	return st != KILN_OK ? st : g->status;
}

/* Removes backward nodes whose results nobody reads, newest first so a
 * removal frees the uses of the nodes it read. */
static void sweep(ad *a, int nkeep, const uint32_t *keep)
{
	kiln_graph *g = a->g;
	for (uint32_t i = g->nnode; i-- > a->nnode;) {
		ir_node *n = g->node[i];
		bool used = false;
		for (uint32_t k = 0; k < n->nout && !n->dead; k++)
			used = used || g->val[n->out[k]]->nuse;
		for (int k = 0; k < nkeep && !used && !n->dead; k++)
			used = g->val[keep[k]]->def == n;
		if (!used)
			ir_node_remove(g, n);
	}
}

/* Undoes everything appended since the forward graph's size. */
static void rollback(ad *a)
{
	kiln_graph *g = a->g;
	while (g->nnode > a->nnode)
		ir_node_remove(g, g->node[--g->nnode]);
	for (uint32_t i = a->nval; i < g->nval; i++)
		g->val[i]->kind = IR_V_NONE;
	if (g->nval > a->nval)
		g->nval = a->nval;
}

static kiln_status check_args(kiln_graph *g, kiln_loc loc, uint32_t loss, int nwrt,
                              const uint32_t *wrt, const uint32_t *grads)
{
	if (nwrt < 0 || (nwrt && (!wrt || !grads)))
		return ir_errorf_at(g, loc, KILN_EINVAL, "gradient: %d wrt values with %s", nwrt,
		                    wrt ? "no grads array" : "no wrt array");
	const ir_value *l = ir_val(g, loss);
	if (!loss || !l || l->kind == IR_V_NONE)
		return ir_errorf_at(g, loc, KILN_EINVAL, "gradient: the loss (handle %u) is not a "
		                    "value of graph '%s'", (unsigned)loss, g->name);
	for (int i = 0; i < nwrt; i++) {
		const ir_value *v = ir_val(g, wrt[i]);
		char b[128];
		if (!wrt[i] || !v || v->kind == IR_V_NONE)
			return ir_errorf_at(g, loc, KILN_EINVAL, "gradient: wrt[%d] (handle %u) is not "
			                    "a value of graph '%s'", i, (unsigned)wrt[i], g->name);
		if (!kiln_dtype_is_float(v->type.dtype))
			return ir_errorf_at(g, loc, KILN_EINVAL, "gradient: wrt[%d] '%s' is %s, not a "
			                    "float value", i, v->name ? v->name : "?",
			                    ir_type_str(g, &v->type, b, sizeof b));
	}
	return KILN_OK;
}

static kiln_status run(ad *a, kiln_loc loc, uint32_t loss, int nwrt, const uint32_t *wrt,
                       uint32_t *grads)
{
	kiln_graph *g = a->g;
	uint32_t most = 1;
	for (uint32_t i = 0; i < a->nnode; i++) {
		most = g->node[i]->nin > most ? g->node[i]->nin : most;
		most = g->node[i]->nout > most ? g->node[i]->nout : most;
	}
	a->flag = calloc(a->nval, sizeof *a->flag);
	a->grad = calloc(a->nval, sizeof *a->grad);
	a->dy = calloc(2 * (size_t)most, sizeof *a->dy);
	if (!a->flag || !a->grad || !a->dy)
		return ir_errorf_at(g, loc, KILN_ENOMEM, "gradient: out of memory");
	a->dx = a->dy + most;
	mark(a, loss, nwrt, wrt);
	a->grad[loss] = seed(g, loc, loss);
	for (uint32_t i = a->nnode; i-- > 0 && g->status == KILN_OK;)
		if (!g->node[i]->dead)
			step(a, g->node[i]);
	for (int i = 0; i < nwrt && g->status == KILN_OK; i++)
		grads[i] = live(a, wrt[i]) ? a->grad[wrt[i]] : KILN_NONE;
	return g->status;
}

kiln_status pass_grad(kiln_graph *g, kiln_loc loc, uint32_t loss, int nwrt,
                      const uint32_t *wrt, uint32_t *grads)
{
	if (!g)
		return KILN_EINVAL;
	if (g->status != KILN_OK || check_args(g, loc, loss, nwrt, wrt, grads))
		return g->status;
	/* fused recurrent ops are differentiated as their unrolled steps */
	if (pass_rnn_unroll(g) != KILN_OK)
		return g->status;
	ad a = {.g = g, .nval = g->nval, .nnode = g->nnode};
	kiln_status st = run(&a, loc, loss, nwrt, wrt, grads);
	if (st == KILN_OK)
		sweep(&a, nwrt, grads);
	else
		rollback(&a);
	for (int i = 0; st != KILN_OK && i < nwrt; i++)
		grads[i] = KILN_NONE;
	free(a.flag);
	free(a.grad);
	free(a.dy);
	return st;
}

/* ---- the public entry points ----------------------------------------------- */

KILN_API kiln_status kiln_grad_at(kiln_graph *g, kiln_loc loc, kiln_value loss, int nwrt,
                                  const kiln_value *wrt, kiln_value *grads)
{
	return pass_grad(g, loc, loss, nwrt, wrt, grads);
}

static bool name_taken(const kiln_graph *g, const char *name)
{
	for (uint32_t i = 1; i < g->nval; i++)
		if (g->val[i]->kind != IR_V_NONE && g->val[i]->name &&
		    !strcmp(g->val[i]->name, name))
			return true;
	return false;
}

/* Names grad "<param>.grad", through an Identity when it already has a
 * name or is not a node result (one value, one name). */
static uint32_t name_grad(kiln_graph *g, kiln_loc loc, uint32_t param, uint32_t grad)
{
	char name[512];
	snprintf(name, sizeof name, "%s.grad", g->val[param]->name);
	if (name_taken(g, name)) {
		ir_errorf_at(g, loc, KILN_EINVAL, "gradient: graph '%s' already has a value "
		             "named '%s'", g->name, name);
		return 0;
	}
	if (g->val[grad]->name || g->val[grad]->kind != IR_V_NODE)
		grad = kiln_identity_at(g, loc, grad);
	if (grad)
		g->val[grad]->name = ir_intern(g, name);
	return grad;
}

KILN_API kiln_status kiln_grad_params_at(kiln_graph *g, kiln_loc loc, kiln_value loss, int cap,
                                         kiln_value *params, kiln_value *grads, int *count)
{
	if (!g || !count)
		return KILN_EINVAL;
	*count = 0;
	for (uint32_t i = 1; i < g->nval; i++) {
		const ir_value *v = g->val[i];
		if (v->kind == IR_V_PARAM && v->trainable && kiln_dtype_is_float(v->type.dtype)) {
			if (*count < cap && params)
				params[*count] = i;
			(*count)++;
		}
	}
	if (g->status != KILN_OK)
		return g->status;
	if (*count > cap || (*count && (!params || !grads)))
		return ir_errorf_at(g, loc, KILN_EINVAL, "gradient: graph '%s' has %d trainable "
		                    "parameters, room for %d", g->name, *count, cap);
	uint32_t nnode = g->nnode, nval = g->nval;
	kiln_status st = pass_grad(g, loc, loss, *count, params, grads);
	for (int i = 0; i < *count && st == KILN_OK; i++) {
		if (grads[i])
			grads[i] = name_grad(g, loc, params[i], grads[i]);
		st = g->status;
	}
	if (st != KILN_OK) {
		ad a = {.g = g, .nval = nval, .nnode = nnode};
		rollback(&a);
		for (int i = 0; i < *count; i++)
			grads[i] = KILN_NONE;
	}
	return st;
}
