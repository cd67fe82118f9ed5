/*
 * verify.c: the IR verifier, run between passes in debug builds (as QBE's
 * ssacheck is) and by kiln_graph_verify.
 *
 * It checks the invariants the rest of kiln assumes and reports the first
 * broken one, naming the node ("Conv 'c1'" or "node #3") and the value:
 * values well formed, SSA order, no dangling uses of removed nodes, arity,
 * attributes against the op's schema, use lists that match operand slots
 * exactly, live graph outputs, params whose data fits their type, unique
 * names, and declared output types equal to what shape inference gives.
 *
 * The graph is const and stays untouched.  Shape rules need a mutable
 * graph only because they may intern new dimension expressions (and record
 * errors), so the verifier runs them on a shallow view of the graph that
 * owns a private copy of the expression table and its own error slot: the
 * values, nodes and strings are shared read-only, existing dims keep their
 * meaning, and nothing the rules write reaches g.  This is much cheaper than
 * ir_graph_clone, which would copy every weight.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

typedef struct vctx {
	const kiln_graph *g;
	kiln_error *err;
} vctx;

/* "Conv 'c1'" when the node has a name, else "Conv node #3". */
static const char *who(const ir_node *n, char *buf, size_t size)
{
	if (n->op >= KILN_OP_COUNT)
		snprintf(buf, size, "node #%u", n->idx);
	else if (n->name)
		snprintf(buf, size, "%s '%s'", ir_op(n->op)->onnx, n->name);
	else
		snprintf(buf, size, "%s node #%u", ir_op(n->op)->onnx, n->idx);
	return buf;
}

/* "%x" for a named value, "%12" otherwise. */
static const char *vname(const kiln_graph *g, uint32_t id, char *buf, size_t size)
{
	const ir_value *v = ir_val(g, id);
	if (v && v->name)
		snprintf(buf, size, "%%%s", v->name);
	else
		snprintf(buf, size, "%%%u", id);
	return buf;
}

#define BAD(...) return ir_seterr(c->err, KILN_EVERIFY, __VA_ARGS__)
#define TRY(x)                                                                    \
	do {                                                                      \
		kiln_status st_ = (x);                                            \
		if (st_ != KILN_OK)                                               \
			return st_;                                               \
	} while (0)

/* ---- values ------------------------------------------------------------ */

static bool type_valid(const kiln_graph *g, const ir_type *t)
{
	if (t->dtype <= KILN_DT_INVALID || t->dtype >= KILN_DT_COUNT || t->rank < 0 ||
	    t->rank > KILN_MAX_RANK)
		return false;
	for (int i = 0; i < t->rank; i++)
		if (t->dim[i] < 0 && !ir_dim_expr(g, t->dim[i]))
			return false;
	return true;
}

static kiln_status check_param(vctx *c, const ir_value *v)
{
	const kiln_graph *g = c->g;
	char a[96], b[192];
	const kiln_tensor *d = v->data;
	if (!d)
		BAD("param %s has no data", vname(g, v->id, a, sizeof a));
	ir_type dt = {d->dtype, d->rank, {0}};
	if (d->rank >= 0 && d->rank <= KILN_MAX_RANK)
		memcpy(dt.dim, d->shape, d->rank * sizeof d->shape[0]);
	if (d->rank < 0 || d->rank > KILN_MAX_RANK || !ir_type_eq(&dt, &v->type)) {
		char e[192];
		BAD("param %s is declared %s but its data is %s", vname(g, v->id, a, sizeof a),
		    ir_type_str(g, &v->type, b, sizeof b),
		    d->rank >= 0 && d->rank <= KILN_MAX_RANK ? ir_type_str(g, &dt, e, sizeof e)
		                                             : "of bad rank");
	}
	return KILN_OK;
}

/* Each live value: id matches its slot, a valid type, and a node result
 * points at a live node whose output slot names it back. */
static kiln_status check_value(vctx *c, uint32_t id)
{
	const kiln_graph *g = c->g;
	const ir_value *v = g->val[id];
	char a[96], b[96];
	if (!v || v->id != id)
		BAD("value slot %u holds value %d", id, v ? (int)v->id : -1);
	if (v->kind == IR_V_NONE)
		return KILN_OK;
	if (!type_valid(g, &v->type))
		BAD("value %s has no valid type", vname(g, id, a, sizeof a));
	if (v->kind == IR_V_PARAM)
		return check_param(c, v);
	if (v->kind != IR_V_NODE)
		return KILN_OK;
	const ir_node *d = v->def;
	if (!d || d->idx >= g->nnode || g->node[d->idx] != d)
		BAD("value %s has no defining node in the schedule", vname(g, id, a, sizeof a));
	if (d->dead)
		BAD("value %s is live but its node %s was removed", vname(g, id, a, sizeof a),
		    who(d, b, sizeof b));
	if (v->def_out < 0 || (uint32_t)v->def_out >= d->nout || d->out[v->def_out] != id)
		BAD("value %s claims to be output %d of %s, which does not name it",
		    vname(g, id, a, sizeof a), v->def_out, who(d, b, sizeof b));
	return KILN_OK;
}

/* Inputs, params and graph outputs are addressed by name: no two alike. */
static kiln_status check_names(vctx *c)
{
	const kiln_graph *g = c->g;
	uint32_t cnt = 0, cap = g->ninput + g->noutput + g->nval;
	const char **seen = malloc((cap + 1) * sizeof *seen);
	uint32_t *ids = malloc((cap + 1) * sizeof *ids);
	kiln_status st = KILN_OK;
	if (!seen || !ids) {
		free(seen), free(ids);
		return ir_seterr(c->err, KILN_ENOMEM, "out of memory verifying graph");
	}
	for (uint32_t i = 1; i < g->nval; i++) {
		const ir_value *v = g->val[i];
		bool out = false;
		for (uint32_t k = 0; k < g->noutput && !out; k++)
			out = g->output[k] == i;
		if (!v->name || v->kind == IR_V_NONE ||
		    !(v->kind == IR_V_INPUT || v->kind == IR_V_PARAM || out))
			continue;
		for (uint32_t k = 0; k < cnt && st == KILN_OK; k++)
			if (strcmp(seen[k], v->name) == 0)
				st = ir_seterr(c->err, KILN_EVERIFY,
				               "duplicate value name '%s' (values %%%u and %%%u)",
				               v->name, ids[k], i);
		seen[cnt] = v->name;
		ids[cnt++] = i;
	}
	free(seen), free(ids);
	return st;
}

static kiln_status check_io(vctx *c)
{
	const kiln_graph *g = c->g;
	char a[96];
	if (g->noutput == 0)
		BAD("graph '%s' has no outputs", g->name ? g->name : "?");
	for (uint32_t i = 0; i < g->ninput; i++) {
		const ir_value *v = ir_val(g, g->input[i]);
		if (!v || g->input[i] == 0 || v->kind != IR_V_INPUT)
			BAD("graph input %u (%s) is not an input value", i,
			    vname(g, g->input[i], a, sizeof a));
	}
	for (uint32_t i = 0; i < g->noutput; i++) {
		const ir_value *v = ir_val(g, g->output[i]);
		if (!v || g->output[i] == 0 || v->kind == IR_V_NONE)
			BAD("graph output %u (%s) is not a live value", i,
			    vname(g, g->output[i], a, sizeof a));
	}
	return KILN_OK;
}

/* ---- nodes ------------------------------------------------------------- */

/* "1 to 3", "1 or more", "2" */
static const char *range(unsigned lo, unsigned hi, char *buf, size_t size)
{
	if (hi == IR_VARIADIC)
		snprintf(buf, size, "%u or more", lo);
	else if (lo == hi)
		snprintf(buf, size, "%u", lo);
	else
		snprintf(buf, size, "%u to %u", lo, hi);
	return buf;
}

static kiln_status check_arity(vctx *c, const ir_node *n)
{
	const ir_op_info *oi = ir_op(n->op);
	char w[160], r[32];
	if (n->nin < oi->in_min || (oi->in_max != IR_VARIADIC && n->nin > oi->in_max))
		BAD("%s has %u inputs, %s takes %s", who(n, w, sizeof w), n->nin, oi->onnx,
		    range(oi->in_min, oi->in_max, r, sizeof r));
	if (n->nout < oi->out_min || (oi->out_max != IR_VARIADIC && n->nout > oi->out_max))
		BAD("%s has %u outputs, %s gives %s", who(n, w, sizeof w), n->nout, oi->onnx,
		    range(oi->out_min, oi->out_max, r, sizeof r));
	return KILN_OK;
}

/* Every operand is live and defined by an input, a param or an earlier
 * live node; every result names n back. */
static kiln_status check_operands(vctx *c, const ir_node *n)
{
	const kiln_graph *g = c->g;
	char w[160], a[96], b[160];
	for (uint32_t i = 0; i < n->nin; i++) {
		const ir_value *v = ir_val(g, n->in[i]);
		if (!v || n->in[i] == 0)
			BAD("%s: input %u refers to no value (%%%u)", who(n, w, sizeof w), i,
			    n->in[i]);
		if (v->kind == IR_V_NONE)
			BAD("%s: dangling use of %s%s%s", who(n, w, sizeof w),
			    vname(g, v->id, a, sizeof a), v->def ? ", output of removed " : "",
			    v->def ? who(v->def, b, sizeof b) : "");
		if (v->kind == IR_V_NODE && v->def->idx >= n->idx)
			BAD("%s: use of %s before its definition by %s", who(n, w, sizeof w),
			    vname(g, v->id, a, sizeof a), who(v->def, b, sizeof b));
	}
	for (uint32_t i = 0; i < n->nout; i++) {
		const ir_value *v = ir_val(g, n->out[i]);
		if (!v || n->out[i] == 0 || v->kind != IR_V_NODE || v->def != n ||
		    v->def_out != (int)i)
			BAD("%s: output %u (%s) does not point back to it", who(n, w, sizeof w), i,
			    vname(g, n->out[i], a, sizeof a));
	}
	return KILN_OK;
}

/* The schema's kind for an attribute; ints stand in for floats and dtypes
 * because the .kir and ONNX readers cannot always tell them apart. */
static bool kind_fits(ir_attr_kind want, ir_attr_kind got)
{
	return got == want || (got == IR_A_INT && (want == IR_A_FLOAT || want == IR_A_DTYPE));
}

static const char *const kind_name[] = {
	[IR_A_INT] = "int", [IR_A_FLOAT] = "float", [IR_A_INTS] = "ints",
	[IR_A_FLOATS] = "floats", [IR_A_STRING] = "string", [IR_A_TENSOR] = "tensor",
	[IR_A_DTYPE] = "dtype",
};

static kiln_status check_attrs(vctx *c, const ir_node *n)
{
	ir_attr_schema sc[24];
	int ns = ir_op_schema(n->op, sc, 24);
	char w[160];
	for (uint32_t i = 0; i < n->nattr; i++) {
		const ir_attr *a = &n->attr[i];
		int k = 0;
		while (k < ns && strcmp(sc[k].name, a->name))
			k++;
		if (k == ns)
			BAD("%s: unknown attribute '%s'", who(n, w, sizeof w), a->name);
		if ((unsigned)a->kind > IR_A_DTYPE || !kind_fits(sc[k].kind, a->kind))
			BAD("%s: attribute '%s' must be %s, not %s", who(n, w, sizeof w), a->name,
			    kind_name[sc[k].kind],
			    (unsigned)a->kind > IR_A_DTYPE ? "?" : kind_name[a->kind]);
		if (a->kind == IR_A_INTS && a->dims && !sc[k].dims)
			BAD("%s: attribute '%s' cannot hold symbolic dims", who(n, w, sizeof w), a->name);
		for (uint32_t j = 0; a->kind == IR_A_INTS && j < a->n && j < 64; j++)
			if (ir_attr_is_dim(a, j) && !ir_dim_expr(c->g, a->u.ints[j]))
				BAD("%s: attribute '%s' element %u is no dim of the graph",
				    who(n, w, sizeof w), a->name, j);
		for (uint32_t j = 0; j < i; j++)
			if (!strcmp(n->attr[j].name, a->name))
				BAD("%s: attribute '%s' set twice", who(n, w, sizeof w), a->name);
	}
	for (int k = 0; k < ns; k++)
		if (sc[k].required && !ir_attr_get(n, sc[k].name))
			BAD("%s: missing required attribute '%s'", who(n, w, sizeof w), sc[k].name);
	return KILN_OK;
}

/* Declared output types must be what inference gives; inference runs on
 * view (see the file comment). */
static kiln_status check_types(vctx *c, kiln_graph *view, const ir_node *n, ir_type *out)
{
	char w[160], a[96], x[192], y[192];
	view->status = KILN_OK;
	view->errmsg[0] = 0;
	if (ir_infer_types(view, n, out) != KILN_OK)
		BAD("%s: shape inference fails: %s", who(n, w, sizeof w), view->errmsg);
	for (uint32_t i = 0; i < n->nout; i++) {
		const ir_value *v = c->g->val[n->out[i]];
		if (!ir_type_eq(&v->type, &out[i]))
			BAD("%s: output %s is declared %s but inferred %s", who(n, w, sizeof w),
			    vname(c->g, n->out[i], a, sizeof a), ir_type_str(view, &v->type, x, sizeof x),
			    ir_type_str(view, &out[i], y, sizeof y));
	}
	return KILN_OK;
}

/* Use lists: each live node appears in an input's list once per operand
 * slot reading it, and a list holds nothing else. */
static kiln_status check_uses(vctx *c)
{
	const kiln_graph *g = c->g;
	char w[160], a[96];
	uint32_t *slots = calloc(g->nval + 1, sizeof *slots);
	if (!slots)
		return ir_seterr(c->err, KILN_ENOMEM, "out of memory verifying graph");
	kiln_status st = KILN_OK;
	for (uint32_t i = 0; i < g->nnode && st == KILN_OK; i++) {
		const ir_node *n = g->node[i];
		for (uint32_t j = 0; !n->dead && j < n->nin && st == KILN_OK; j++) {
			const ir_value *v = g->val[n->in[j]];
			uint32_t want = 0, have = 0;
			slots[n->in[j]]++;
			for (uint32_t k = 0; k < n->nin; k++)
				want += n->in[k] == n->in[j];
			for (uint32_t k = 0; k < v->nuse; k++)
				have += v->uses[k] == n;
			if (want != have)
				st = ir_seterr(c->err, KILN_EVERIFY,
				               "%s: reads %s in %u slot(s) but its use list has %u",
				               who(n, w, sizeof w), vname(g, v->id, a, sizeof a), want,
				               have);
		}
	}
	for (uint32_t i = 1; i < g->nval && st == KILN_OK; i++)
		if (g->val[i]->nuse != slots[i])
			st = ir_seterr(c->err, KILN_EVERIFY,
			               "value %s has %u uses listed but %u operand slots read it",
			               vname(g, i, a, sizeof a), g->val[i]->nuse, slots[i]);
	free(slots);
	return st;
}

static kiln_status check_node(vctx *c, kiln_graph *view, uint32_t idx, ir_type *out)
{
	const ir_node *n = c->g->node[idx];
	if (!n || n->idx != idx)
		BAD("schedule slot %u holds node #%d", idx, n ? (int)n->idx : -1);
	if (n->dead)
		return KILN_OK;
	if (n->op >= KILN_OP_COUNT)
		BAD("node #%u has unknown op %d", idx, (int)n->op);
	TRY(check_arity(c, n));
	TRY(check_operands(c, n));
	TRY(check_attrs(c, n));
	return check_types(c, view, n, out);
}

/* Structure first, so that the later checks may follow ids and pointers. */
static kiln_status verify(vctx *c, kiln_graph *view)
{
	const kiln_graph *g = c->g;
	if (g->status != KILN_OK)
		BAD("graph has a pending error: %s", g->errmsg);
	if (g->nval == 0 || !g->val[0])
		BAD("graph has no value table");
	for (uint32_t i = 1; i < g->nval; i++)
		TRY(check_value(c, i));
	TRY(check_io(c));
	TRY(check_names(c));
	uint32_t maxout = 1;
	for (uint32_t i = 0; i < g->nnode; i++)
		if (g->node[i] && g->node[i]->nout > maxout)
			maxout = g->node[i]->nout;
	ir_type *out = malloc(maxout * sizeof *out);
	if (!out)
		return ir_seterr(c->err, KILN_ENOMEM, "out of memory verifying graph");
	kiln_status st = KILN_OK;
	for (uint32_t i = 0; i < g->nnode && st == KILN_OK; i++)
		st = check_node(c, view, i, out);
	free(out);
	TRY(st);
	return check_uses(c);
}

kiln_status ir_verify(const kiln_graph *g, kiln_error *err)
{
	if (!g)
		return ir_seterr(err, KILN_EINVAL, "verify: null graph");
	vctx c = {g, err};
	kiln_graph view = *g;
	view.dexp = NULL;
	view.capdexp = 0;
	if (g->ndexp) {
		if (!(view.dexp = malloc(g->ndexp * sizeof *g->dexp)))
			return ir_seterr(err, KILN_ENOMEM, "out of memory verifying graph");
		memcpy(view.dexp, g->dexp, g->ndexp * sizeof *g->dexp);
		view.capdexp = g->ndexp;
	}
	kiln_status st = verify(&c, &view);
	free(view.dexp);
	if (st == KILN_OK && err) {
		err->code = KILN_OK;
		err->msg[0] = 0;
	}
	return st;
}

KILN_API kiln_status kiln_graph_verify(const kiln_graph *g, kiln_error *err)
{
	return ir_verify(g, err);
}
