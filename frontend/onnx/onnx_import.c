/*
 * onnx_import.c: reads an ONNX ModelProto (parsed by protobuf-c) into a
 * kiln graph: attributes, initializers, graph inputs and outputs, the node
 * walk, problem collection, and the public entry points.  The per-op
 * mapping lives in onnx_ops.c, what is known about values at import time
 * in onnx_fold.c, and TensorProto data in onnx_tensor.c.
 *
 * Key idea: the graph is built in ONNX's (topological) node order, each
 * node inferred and folded as soon as it exists, so when a later node
 * needs a constant input (Reshape's shape fed by Shape -> Gather -> Concat)
 * the value behind it is already known and becomes a kiln attribute.
 * Nodes and initializers left without a use afterwards are removed.
 *
 * Nothing stops at the first problem: each one becomes a line in a report
 * (path, op, node, domain, opset, what), the node's outputs are poisoned so
 * that nodes reading them stay quiet, and the import fails at the end with
 * every line in one message.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "frontend/onnx/onnx.h"
#include "runtime/rt.h"

#define MAX_MODEL_BYTES ((size_t)2 << 30) /* protobuf's own 2 GiB limit */
#define MAX_INPUT_NUMEL IR_MAX_NUMEL /* as ir_tensor_new allows */

/* ---- problems ------------------------------------------------------------- */

static void report_line(onnx_imp *c, kiln_status code, const char *line)
{
	size_t len = strlen(line);
	if (c->nreport + len + 2 > c->capreport) {
		size_t cap = (c->capreport + len + 2) * 2;
		char *r = realloc(c->report, cap);
		if (!r) {
			c->first = c->first ? c->first : KILN_ENOMEM;
			c->nproblem++;
			return;
		}
		c->report = r, c->capreport = cap;
	}
	memcpy(c->report + c->nreport, line, len);
	c->nreport += len;
	c->report[c->nreport++] = '\n';
	c->report[c->nreport] = 0;
	if (!c->nproblem++)
		c->first = code;
}

/* "ai.onnx" for the default domain; the opset the model imports for it. */
static const char *domain_of(const Onnx__NodeProto *p)
{
	return p->domain && *p->domain ? p->domain : "ai.onnx";
}

static int64_t opset_of(const onnx_imp *c, const char *domain)
{
	bool dflt = !strcmp(domain, "ai.onnx");
	for (size_t i = 0; i < c->m->n_opset_import; i++) {
		const char *d = c->m->opset_import[i]->domain ? c->m->opset_import[i]->domain : "";
		if (dflt ? !*d || !strcmp(d, "ai.onnx") : !strcmp(d, domain))
			return c->m->opset_import[i]->version;
	}
	return -1;
}

kiln_status onnx_problem(onnx_imp *c, onnx_nd *d, kiln_status code, const char *fmt, ...)
{
	char text[768], line[1536], where[512] = "";
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	if (d) {
		const Onnx__NodeProto *p = d->p;
		const char *dom = domain_of(p);
		bool named = p->name && *p->name;
		snprintf(where, sizeof where, "%s%s%s%s (domain %s, opset %lld): ",
		         p->op_type ? p->op_type : "?", named ? " '" : "", named ? p->name : "",
		         named ? "'" : "", dom, (long long)opset_of(c, dom));
		d->failed = true;
	}
	snprintf(line, sizeof line, "%s: %s%s", c->path, where, text);
	report_line(c, code, line);
	return code;
}

/* A graph error (from ir_node_new or shape inference) as a problem of d;
 * drops the "path: Op 'name': " prefix ir_errorf put on it. */
static void graph_problem(onnx_imp *c, onnx_nd *d, const ir_node *n)
{
	char prefix[512], desc[160];
	const char *msg = c->g->errmsg;
	snprintf(prefix, sizeof prefix, "%s: %s: ", c->path,
	         n ? ir_node_desc(n, desc, sizeof desc) : "");
	if (!strncmp(msg, prefix, strlen(prefix)))
		msg += strlen(prefix);
	onnx_problem(c, d, c->g->status ? c->g->status : KILN_EINVAL, "%s", msg);
	kiln_graph_clear_error(c->g);
}

/* ---- names and constants ---------------------------------------------------- */

static uint32_t name_slot(const onnx_imp *c, const char *key)
{
	uint32_t h = (uint32_t)(((uintptr_t)key >> 3) * 2654435761u) & (c->capname - 1);
	while (c->names[h] && c->names[h] != key)
		h = (h + 1) & (c->capname - 1);
	return h;
}

/* Binds an ONNX name (interned) to value id v; false if already bound. */
static bool name_set(onnx_imp *c, const char *key, uint32_t v, bool *oom)
{
	if (2 * (c->nname + 1) > c->capname) {
		onnx_imp big = *c;
		big.capname = c->capname ? c->capname * 2 : 64;
		big.names = calloc(big.capname, sizeof *big.names);
		big.ids = calloc(big.capname, sizeof *big.ids);
		if (!big.names || !big.ids) {
			free(big.names), free(big.ids);
			return !(*oom = true);
		}
		for (uint32_t i = 0; i < c->capname; i++)
			if (c->names[i]) {
				uint32_t h = name_slot(&big, c->names[i]);
				big.names[h] = c->names[i], big.ids[h] = c->ids[i];
			}
		free(c->names), free(c->ids);
		c->names = big.names, c->ids = big.ids, c->capname = big.capname;
	}
	uint32_t h = name_slot(c, key);
	if (c->names[h])
		return false;
	c->names[h] = key, c->ids[h] = v, c->nname++;
	return true;
}

static bool name_get(const onnx_imp *c, const char *key, uint32_t *v)
{
	if (!c->capname || !key)
		return false;
	uint32_t h = name_slot(c, key);
	*v = c->ids[h];
	return c->names[h] != NULL;
}

/* ---- attributes -------------------------------------------------------------- */

const Onnx__AttributeProto *onnx_attr(const onnx_nd *d, const char *name)
{
	for (size_t i = 0; i < d->p->n_attribute; i++)
		if (d->p->attribute[i]->name && !strcmp(d->p->attribute[i]->name, name))
			return d->p->attribute[i];
	return NULL;
}

/* IR version 1 models may leave the type out; guess it from the fields. */
static int attr_type(const Onnx__AttributeProto *a)
{
	if (a->has_type)
		return a->type;
	return a->n_ints ? ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS
	     : a->n_floats ? ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS
	     : a->t ? ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR
	     : a->has_s ? ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING
	     : a->has_i ? ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT
	     : a->has_f ? ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT
	     : ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED;
}

/* The ONNX attribute type each kiln schema kind reads. */
static const int attr_from_kind[] = {
	[IR_A_INT] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT,
	[IR_A_FLOAT] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT,
	[IR_A_INTS] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS,
	[IR_A_FLOATS] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS,
	[IR_A_STRING] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING,
	[IR_A_TENSOR] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR,
	[IR_A_DTYPE] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT,
};

static kiln_status set_string(onnx_imp *c, onnx_nd *d, const Onnx__AttributeProto *a)
{
	if (a->s.len && memchr(a->s.data, 0, a->s.len))
		return onnx_problem(c, d, KILN_EUNSUPPORTED, "attribute '%s' holds a NUL byte",
		                    a->name);
	char *s = ir_alloc(c->g->arena, a->s.len + 1);
	if (!s)
		return onnx_problem(c, d, KILN_ENOMEM, "out of memory");
	if (a->s.len)
		memcpy(s, a->s.data, a->s.len);
	return ir_attr_set_string(c->g, d->n, a->name, s);
}

static kiln_status set_tensor(onnx_imp *c, onnx_nd *d, const char *name,
                              const Onnx__TensorProto *tp)
{
	kiln_error err = {0};
	kiln_tensor *t;
	if (onnx_tensor_read(tp, c->dir, &t, &err))
		return onnx_problem(c, d, err.code, "attribute '%s': %s", name, err.msg);
	kiln_status st = ir_attr_set_tensor(c->g, d->n, name, t);
	kiln_tensor_free(t);
	return st;
}

static kiln_status set_dtype(onnx_imp *c, onnx_nd *d, const Onnx__AttributeProto *a)
{
	kiln_dtype dt = a->i >= 0 && a->i <= INT32_MAX ? onnx_dtype_to_kiln((int32_t)a->i)
	                                                : KILN_DT_INVALID;
	if (dt == KILN_DT_INVALID)
		return onnx_problem(c, d, KILN_EUNSUPPORTED, "%s=%s is a data type kiln does not "
		                    "support", a->name, onnx_dtype_name((int32_t)a->i));
	return ir_attr_set_dtype(c->g, d->n, a->name, dt);
}

/* Copies ONNX attribute a onto d->n as the kind the op's schema wants. */
static kiln_status copy_attr(onnx_imp *c, onnx_nd *d, const ir_attr_schema *s,
                             const Onnx__AttributeProto *a)
{
	kiln_graph *g = c->g;
	int got = attr_type(a);
	if (got != attr_from_kind[s->kind])
		return onnx_problem(c, d, KILN_EUNSUPPORTED, "attribute '%s' has ONNX type %d, "
		                    "expected %d", a->name, got, attr_from_kind[s->kind]);
	switch (s->kind) {
	case IR_A_INT: return ir_attr_set_int(g, d->n, a->name, a->i);
	case IR_A_FLOAT: return ir_attr_set_float(g, d->n, a->name, a->f);
	case IR_A_INTS: return ir_attr_set_ints(g, d->n, a->name, (uint32_t)a->n_ints, a->ints);
	case IR_A_STRING: return set_string(c, d, a);
	case IR_A_TENSOR: return a->t ? set_tensor(c, d, a->name, a->t)
	                              : onnx_problem(c, d, KILN_EPARSE, "attribute '%s' has no "
	                                             "tensor", a->name);
	case IR_A_DTYPE: return set_dtype(c, d, a);
	case IR_A_FLOATS: break;
	}
	double *v = ir_alloc(g->arena, (a->n_floats + 1) * sizeof *v);
	if (!v)
		return KILN_ENOMEM;
	for (size_t i = 0; i < a->n_floats; i++)
		v[i] = a->floats[i];
	return ir_attr_set_floats(g, d->n, a->name, (uint32_t)a->n_floats, v);
}

static bool skipped(const char *const *skip, const char *name)
{
	for (; skip && *skip; skip++)
		if (!strcmp(*skip, name))
			return true;
	return false;
}

/* Whether a spells out the schema's default: such attributes are dropped,
 * so a model that omits a default and one that writes it import to the
 * same graph (and export -> import gives back what import gave). */
static bool is_default(const ir_attr_schema *s, const Onnx__AttributeProto *a)
{
	if (!s->has_default || attr_type(a) != attr_from_kind[s->kind])
		return false;
	switch (s->kind) {
	case IR_A_INT: return a->i == strtoll(s->dflt, NULL, 10);
	case IR_A_FLOAT: return a->f == (float)strtod(s->dflt, NULL);
	case IR_A_STRING: return a->s.len == strlen(s->dflt) &&
	                         !memcmp(a->s.data, s->dflt, a->s.len);
	default: return false;
	}
}

static bool copy_attrs(onnx_imp *c, onnx_nd *d, const char *const *skip)
{
	ir_attr_schema sch[32];
	int ns = ir_op_schema(d->op, sch, 32);
	for (size_t i = 0; i < d->p->n_attribute && !d->failed; i++) {
		const Onnx__AttributeProto *a = d->p->attribute[i];
		int k = 0;
		if (!a->name || skipped(skip, a->name))
			continue;
		while (k < ns && strcmp(sch[k].name, a->name))
			k++;
		if (k == ns)
			onnx_problem(c, d, KILN_EUNSUPPORTED, "attribute '%s' is not supported",
			             a->name);
		else if (is_default(&sch[k], a))
			continue;
		else if (copy_attr(c, d, &sch[k], a) && !d->failed)
			onnx_problem(c, d, KILN_ENOMEM, "out of memory setting '%s'", a->name);
	}
	return !d->failed;
}

/* ---- inputs and nodes ------------------------------------------------------- */

uint32_t onnx_input(onnx_imp *c, onnx_nd *d, uint32_t i, bool must)
{
	const char *nm = i < d->p->n_input ? d->p->input[i] : NULL;
	uint32_t v = 0;
	if (!nm || !*nm) {
		if (must)
			onnx_problem(c, d, KILN_EINVAL, "input %u is required", i);
		return 0;
	}
	if (!name_get(c, ir_intern(c->g, nm), &v))
		onnx_problem(c, d, KILN_EINVAL, "input '%s' is not an earlier node's output, a "
		             "graph input or an initializer (dangling name or cycle)", nm);
	else if (!v)
		d->failed = true; /* its producer failed and was reported */
	return v;
}

bool onnx_emit_with(onnx_imp *c, onnx_nd *d, uint32_t nin, const uint32_t *in,
                    const char *const *skip)
{
	const ir_op_info *op = ir_op(d->op);
	uint32_t nout = 0;
	for (uint32_t i = 0; i < d->p->n_output; i++)
		if (d->p->output[i] && *d->p->output[i])
			nout = i + 1;
	nout = nout < op->out_min ? op->out_min : nout;
	if (nin < op->in_min || (op->in_max != IR_VARIADIC && nin > op->in_max))
		onnx_problem(c, d, KILN_EUNSUPPORTED, "%u inputs; kiln's %s takes %u to %u", nin,
		             op->onnx, op->in_min, op->in_max);
	else if (op->out_max != IR_VARIADIC && nout > op->out_max)
		onnx_problem(c, d, KILN_EUNSUPPORTED, "%u outputs; kiln's %s has at most %u", nout,
		             op->onnx, op->out_max);
	if (d->failed)
		return false;
	kiln_loc loc = {c->path, 0};
	if (!(d->n = ir_node_new(c->g, d->op, nin, in, nout, loc))) {
		graph_problem(c, d, NULL);
		return false;
	}
	if (d->p->name && *d->p->name)
		d->n->name = ir_intern(c->g, d->p->name);
	return copy_attrs(c, d, skip);
}

bool onnx_emit(onnx_imp *c, onnx_nd *d, uint32_t ndata, const char *const *skip)
{
	uint32_t in[IR_VARIADIC + 1], nin = 0;
	for (uint32_t i = 0; i < ndata && i < d->p->n_input; i++)
		if (d->p->input[i] && *d->p->input[i])
			nin = i + 1;
	if (nin > IR_VARIADIC)
		return onnx_problem(c, d, KILN_EUNSUPPORTED, "%u inputs is too many", nin), false;
	for (uint32_t i = 0; i < nin; i++) {
		in[i] = onnx_input(c, d, i, false);
		if (!in[i] && !d->failed)
			onnx_problem(c, d, KILN_EUNSUPPORTED, "optional input %u is left out (\"\") "
			             "but a later one is given", i);
	}
	return !d->failed && onnx_emit_with(c, d, nin, in, skip);
}

/* Infers n's outputs and folds it if its inputs are known. */
bool onnx_infer(onnx_imp *c, onnx_nd *d, ir_node *n)
{
	if (ir_infer_node(c->g, n) != KILN_OK) {
		graph_problem(c, d, n);
		return false;
	}
	onnx_fold(c, n);
	return true;
}

ir_node *onnx_extra(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t nin, const uint32_t *in,
                    const char *suffix)
{
	kiln_loc loc = {c->path, 0};
	ir_node *n = ir_node_new(c->g, op, nin, in, 1, loc);
	char name[512];
	if (!n) {
		graph_problem(c, d, NULL);
		return NULL;
	}
	const char *base = d->p->name && *d->p->name ? d->p->name : d->p->op_type;
	snprintf(name, sizeof name, "%s%s%s", base, suffix ? "/" : "", suffix ? suffix : "");
	n->name = ir_intern(c->g, name);
	/* an intermediate gets the node's name, which export keeps, so that
	 * export -> import names it the same (the last one is d's output) */
	if (suffix)
		c->g->val[n->out[0]]->name = n->name;
	return n;
}

/* A graph input the caller gave a value for becomes a parameter holding it
 * (kiln_onnx_opts.specialize); its type must be concrete and match. */
static const kiln_tensor *specialize(onnx_imp *c, uint32_t v)
{
	kiln_graph *g = c->g;
	ir_value *val = g->val[v];
	const kiln_tensor *t = c->specialize && val->kind == IR_V_INPUT && val->name
	                               ? kiln_tensor_set_get(c->specialize, val->name) : NULL;
	bool fits = t && t->dtype == val->type.dtype && t->rank == val->type.rank &&
	            ir_type_concrete(&val->type);
	for (int k = 0; fits && k < t->rank; k++)
		fits = t->shape[k] == val->type.dim[k];
	if (!fits || !(val->data = ir_tensor_copy(g, t)) || !onnx_const_set(c, v, val->data))
		return NULL;
	val->kind = IR_V_PARAM;
	uint32_t k = 0;
	for (uint32_t i = 0; i < g->ninput; i++)
		if (g->input[i] != v)
			g->input[k++] = g->input[i];
	g->ninput = k;
	return val->data;
}

/* Input i as a known constant tensor (NULL: absent, or a problem recorded). */
static const kiln_tensor *const_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *what,
                                      bool required)
{
	uint32_t v = onnx_input(c, d, i, required);
	const kiln_tensor *t = onnx_const(c, v);
	if (v && !t)
		t = specialize(c, v);
	if (v && !t)
		onnx_problem(c, d, KILN_EUNSUPPORTED, "input %u ('%s', the %s) is not a constant "
		             "known at import (initializer, Constant or foldable shape arithmetic)",
		             i, d->p->input[i], what);
	return t;
}

static bool set_ints(onnx_imp *c, onnx_nd *d, const char *name, int64_t n, const int64_t *src)
{
	int64_t *v = ir_alloc(c->g->arena, (size_t)(n + 1) * sizeof *v);
	if (v && n)
		memcpy(v, src, (size_t)n * sizeof *v);
	if (!v || ir_attr_set_ints(c->g, d->n, name, (uint32_t)n, v))
		return onnx_problem(c, d, KILN_ENOMEM, "out of memory"), false;
	return true;
}

bool onnx_shape_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name,
                      onnx_sym_fn resolve)
{
	uint32_t v = onnx_input(c, d, i, true);
	const onnx_svec *s = v && !onnx_const(c, v) ? onnx_svec_of(c, v) : NULL;
	int64_t out[ONNX_SVEC_MAX];
	char dims[256] = "", one[64];
	if (!s)
		return onnx_ints_input(c, d, i, name, true);
	if (s->rank == 1 && resolve(c, d, s, out))
		return set_ints(c, d, name, s->n, out);
	for (int k = 0; k < s->n; k++) {
		if (s->sym[k])
			ir_dim_str(c->g, s->v[k], one, sizeof one);
		else
			snprintf(one, sizeof one, "%lld", (long long)s->v[k]);
		if (strlen(dims) + strlen(one) + 2 < sizeof dims)
			strcat(strcat(dims, k ? "," : ""), one);
	}
	return onnx_problem(c, d, KILN_EUNSUPPORTED, "input %u ('%s', the %s) is [%s] at import, "
	                    "with symbolic dims kiln cannot turn into a static %s", i,
	                    d->p->input[i], name, dims, name), false;
}

bool onnx_ints_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name, bool required)
{
	const kiln_tensor *t = const_input(c, d, i, name, required);
	if (!t)
		return !d->failed;
	int64_t n = kiln_tensor_numel(t);
	if (kiln_dtype_is_float(t->dtype) || t->rank > 1)
		return onnx_problem(c, d, KILN_EINVAL, "the %s input must be a 1-D integer tensor, "
		                    "not %s of rank %d", name, kiln_dtype_name(t->dtype), t->rank),
		       false;
	int64_t *v = ir_alloc(c->g->arena, (size_t)(n + 1) * sizeof *v);
	for (int64_t k = 0; v && k < n; k++)
		v[k] = ir_load_i64(t, k);
	if (!v || ir_attr_set_ints(c->g, d->n, name, (uint32_t)n, v))
		return onnx_problem(c, d, KILN_ENOMEM, "out of memory"), false;
	return true;
}

static bool scalar_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name, bool isint)
{
	const kiln_tensor *t = const_input(c, d, i, name, false);
	if (!t)
		return !d->failed;
	if (kiln_tensor_numel(t) != 1)
		return onnx_problem(c, d, KILN_EINVAL, "the %s input must hold one value, not %lld",
		                    name, (long long)kiln_tensor_numel(t)),
		       false;
	kiln_status st = isint ? ir_attr_set_int(c->g, d->n, name, ir_load_i64(t, 0))
	                       : ir_attr_set_float(c->g, d->n, name, ir_load(t, 0));
	return st ? onnx_problem(c, d, st, "out of memory"), false : true;
}

bool onnx_float_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name)
{
	return scalar_input(c, d, i, name, false);
}

bool onnx_int_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name)
{
	return scalar_input(c, d, i, name, true);
}

/* ---- the graph ------------------------------------------------------------- */

static void bind(onnx_imp *c, onnx_nd *d, const char *name, uint32_t v)
{
	bool oom = false;
	const char *key = ir_intern(c->g, name);
	if (!key || !name_set(c, key, v, &oom))
		onnx_problem(c, d, oom || !key ? KILN_ENOMEM : KILN_EINVAL,
		             "'%s' is defined twice (ONNX values are assigned once)", name);
	else if (v && !c->g->val[v]->name)
		c->g->val[v]->name = key;
}

/* A symbol name that prints back as one: [A-Za-z0-9_], not leading digit. */
static int64_t sym_dim(onnx_imp *c, const char *base, int axis)
{
	char s[128];
	size_t k = 0;
	if (axis >= 0)
		snprintf(s, sizeof s, "%s_%d", base, axis);
	else
		snprintf(s, sizeof s, "%s", base);
	for (k = 0; s[k]; k++)
		if (!(s[k] == '_' || (s[k] >= '0' && s[k] <= '9') || ((s[k] | 32) >= 'a' && (s[k] | 32) <= 'z')))
			s[k] = '_';
	if (s[0] >= '0' && s[0] <= '9') {
		memmove(s + 1, s, sizeof s - 1);
		s[0] = '_';
		s[sizeof s - 1] = 0;
	}
	return ir_dim_sym(c->g, s);
}

/* The fixed dims of a graph input (symbols count as 1) must multiply to
 * at most MAX_INPUT_NUMEL elements, the cap tensors have everywhere in
 * kiln, so no later size computation can overflow int64. */
static bool numel_ok(onnx_imp *c, const char *nm, const ir_type *t)
{
	uint64_t n = 1;
	bool over = false;
	for (int k = 0; k < t->rank && !over; k++) {
		uint64_t d = t->dim[k] >= 0 ? (uint64_t)t->dim[k] : 1;
		over = d && n > MAX_INPUT_NUMEL / d;
		n *= over ? 1 : d;
	}
	if (over) {
		char ty[256];
		onnx_problem(c, NULL, KILN_EINVAL, "graph input '%s' is %s: more than 2^40 elements "
		             "(kiln's limit for one tensor)", nm, ir_type_str(c->g, t, ty, sizeof ty));
	}
	return !over;
}

/* ValueInfo -> type: dim_value fixed, dim_param a symbol, and a missing
 * dim a fresh symbol named after the input and axis. */
static bool input_type(onnx_imp *c, const Onnx__ValueInfoProto *vi, ir_type *t)
{
	const Onnx__TypeProto *tp = vi->type;
	const Onnx__TypeProto__Tensor *tt =
		tp && tp->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ? tp->tensor_type : NULL;
	const char *nm = vi->name;
	if (!tt)
		return onnx_problem(c, NULL, KILN_EUNSUPPORTED, "graph input '%s' is not a tensor", nm),
		       false;
	if ((t->dtype = onnx_dtype_to_kiln(tt->elem_type)) == KILN_DT_INVALID)
		return onnx_problem(c, NULL, KILN_EUNSUPPORTED, "graph input '%s' has data type %s, "
		                    "which kiln does not support", nm, onnx_dtype_name(tt->elem_type)),
		       false;
	if (!tt->shape || tt->shape->n_dim > KILN_MAX_RANK)
		return onnx_problem(c, NULL, KILN_EUNSUPPORTED, "graph input '%s' has %s; kiln needs "
		                    "a known rank of at most %d", nm, tt->shape ? "too many dims"
		                    : "no shape", KILN_MAX_RANK), false;
	t->rank = (int)tt->shape->n_dim;
	for (int k = 0; k < t->rank; k++) {
		const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[k];
		if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
		    dm->dim_value >= 0 && dm->dim_value <= (INT64_C(1) << 40))
			t->dim[k] = dm->dim_value;
		else if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
			return onnx_problem(c, NULL, KILN_EINVAL, "graph input '%s': dim %d is %lld", nm,
			                    k, (long long)dm->dim_value), false;
		else if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
		         dm->dim_param && *dm->dim_param)
			t->dim[k] = sym_dim(c, dm->dim_param, -1);
		else
			t->dim[k] = sym_dim(c, nm, k);
	}
	return numel_ok(c, nm, t);
}

static void add_initializers(onnx_imp *c, const Onnx__GraphProto *gp)
{
	for (size_t i = 0; i < gp->n_initializer; i++) {
		const Onnx__TensorProto *tp = gp->initializer[i];
		kiln_error err = {0};
		kiln_tensor *t;
		if (!tp->name || !*tp->name) {
			onnx_problem(c, NULL, KILN_EINVAL, "initializer %zu has no name", i);
			continue;
		}
		if (onnx_tensor_read(tp, c->dir, &t, &err)) {
			onnx_problem(c, NULL, err.code, "initializer: %s", err.msg);
			bind(c, NULL, tp->name, 0); /* poisoned: readers stay quiet */
			continue;
		}
		uint32_t v = ir_param_new(c->g, tp->name, t, kiln_dtype_is_float(t->dtype));
		kiln_tensor_free(t);
		if (!v || !onnx_const_set(c, v, c->g->val[v]->data))
			onnx_problem(c, NULL, KILN_ENOMEM, "initializer '%s': out of memory", tp->name);
		bind(c, NULL, tp->name, v);
	}
}

/* Graph inputs that are also initializers (IR < 4) stay params. */
static void add_inputs(onnx_imp *c, const Onnx__GraphProto *gp)
{
	for (size_t i = 0; i < gp->n_input; i++) {
		const Onnx__ValueInfoProto *vi = gp->input[i];
		ir_type t = {0};
		uint32_t v;
		if (!vi->name || !*vi->name) {
			onnx_problem(c, NULL, KILN_EINVAL, "graph input %zu has no name", i);
			continue;
		}
		if (name_get(c, ir_intern(c->g, vi->name), &v))
			continue;
		v = input_type(c, vi, &t) ? ir_input_new(c->g, vi->name, &t) : 0;
		bind(c, NULL, vi->name, v);
	}
}

static void add_node(onnx_imp *c, const Onnx__NodeProto *p)
{
	onnx_nd d = {p, KILN_OP_COUNT, NULL, false};
	const char *dom = domain_of(p);
	if (strcmp(dom, "ai.onnx"))
		onnx_problem(c, &d, KILN_EUNSUPPORTED, "domain '%s' is not supported (only the "
		             "default ONNX domain is)", dom);
	else if (!p->op_type || (d.op = ir_op_from_onnx(p->op_type)) == KILN_OP_COUNT)
		onnx_problem(c, &d, KILN_EUNSUPPORTED, "op is not in kiln's op table");
	else if (c->opset < 7 && !onnx_same_since_v1[d.op])
		onnx_problem(c, &d, KILN_EUNSUPPORTED, "opsets before 7 are supported only for ops "
		             "whose definition has not changed since (this one has)");
	else
		onnx_import_node(c, &d);
	if (!d.failed && d.n && !onnx_infer(c, &d, d.n))
		d.failed = true;
	for (size_t i = 0; i < p->n_output; i++)
		if (p->output[i] && *p->output[i])
			bind(c, &d, p->output[i], d.failed || !d.n || i >= d.n->nout ? 0 : d.n->out[i]);
}

static void add_outputs(onnx_imp *c, const Onnx__GraphProto *gp)
{
	for (size_t i = 0; i < gp->n_output; i++) {
		const char *nm = gp->output[i]->name;
		uint32_t v = 0;
		if (!nm || !name_get(c, ir_intern(c->g, nm), &v))
			onnx_problem(c, NULL, KILN_EINVAL, "graph output '%s' is not computed by any "
			             "node, input or initializer", nm ? nm : "");
		else if (v && ir_output_add(c->g, v, nm))
			onnx_problem(c, NULL, KILN_ENOMEM, "out of memory");
	}
}

/* Drops nodes no output depends on (the shape arithmetic folded into
 * attributes, Constants read only as attributes) and unused initializers. */
static kiln_status prune(kiln_graph *g)
{
	bool *keep = calloc(g->nval + 1, sizeof *keep);
	if (!keep)
		return KILN_ENOMEM;
	for (uint32_t i = 0; i < g->noutput; i++)
		keep[g->output[i]] = true;
	for (uint32_t i = g->nnode; i-- > 0;) {
		ir_node *n = g->node[i];
		bool used = false;
		for (uint32_t k = 0; k < n->nout && !used; k++)
			used = keep[n->out[k]] || g->val[n->out[k]]->nuse;
		if (!used)
			ir_node_remove(g, n);
	}
	for (uint32_t id = 1; id < g->nval; id++)
		if (g->val[id]->kind == IR_V_PARAM && !g->val[id]->nuse && !keep[id])
			g->val[id]->kind = IR_V_NONE;
	free(keep);
	return ir_compact(g);
}

static void check_model(onnx_imp *c)
{
	const Onnx__ModelProto *m = c->m;
	if (!m->has_ir_version || m->ir_version < 3 || m->ir_version > 8)
		onnx_problem(c, NULL, KILN_EUNSUPPORTED, "IR version %lld is not supported (3 to 8 "
		             "are)", (long long)m->ir_version);
	c->opset = opset_of(c, "ai.onnx");
	if (c->opset < 1 || c->opset > 17)
		onnx_problem(c, NULL, KILN_EUNSUPPORTED, "default-domain opset %lld is not "
		             "supported (7 to 17 are, and 1 to 6 for ops unchanged since)",
		             (long long)c->opset);
	if (!m->graph)
		onnx_problem(c, NULL, KILN_EPARSE, "the model has no graph");
}

static void import_graph(onnx_imp *c)
{
	const Onnx__GraphProto *gp = c->m->graph;
	check_model(c);
	if (!gp)
		return;
	add_initializers(c, gp);
	add_inputs(c, gp);
	for (size_t i = 0; i < gp->n_node; i++)
		add_node(c, gp->node[i]);
	add_outputs(c, gp);
	if (!c->nproblem && !gp->n_output)
		onnx_problem(c, NULL, KILN_EINVAL, "the graph has no outputs");
}

/* ---- entry points ------------------------------------------------------------ */

/* err->msg gets every problem line that fits, then how many did not. */
static kiln_status fail_report(onnx_imp *c, kiln_error *err)
{
	char tail[64];
	size_t cap = sizeof err->msg - sizeof tail, len = c->nreport ? c->nreport - 1 : 0;
	int shown = 0;
	if (!err)
		return c->first;
	err->code = c->first;
	if (!c->report) {
		snprintf(err->msg, sizeof err->msg, "%s: out of memory", c->path);
		return c->first;
	}
	if (len < sizeof err->msg) {
		memcpy(err->msg, c->report, len);
		err->msg[len] = 0;
		return c->first;
	}
	size_t k = 0;
	for (const char *nl; (nl = strchr(c->report + k, '\n')) && (size_t)(nl - c->report) < cap;
	     shown++)
		k = (size_t)(nl - c->report) + 1;
	memcpy(err->msg, c->report, k);
	snprintf(tail, sizeof tail, "... and %d more", c->nproblem - shown);
	memcpy(err->msg + k, tail, strlen(tail) + 1);
	return c->first;
}

static kiln_status finish(onnx_imp *c, const kiln_onnx_opts *o, kiln_graph **out,
                          kiln_error *err)
{
	kiln_status st = c->nproblem ? fail_report(c, err) : KILN_OK;
	if (!st && (st = prune(c->g)) != KILN_OK)
		ir_seterr(err, st, "%s: out of memory", c->path);
	if (!st && (st = ir_verify(c->g, err)) != KILN_OK && err) {
		char msg[sizeof err->msg + 128];
		snprintf(msg, sizeof msg, "%s: imported graph fails verification: %s", c->path,
		         err->msg);
		snprintf(err->msg, sizeof err->msg, "%.1023s", msg);
	}
	if (o && o->report)
		*o->report = strdup(c->report ? c->report : "");
	if (st)
		kiln_graph_free(c->g);
	else
		*out = c->g;
	free(c->names), free(c->ids), free(c->cval), free(c->sval), free(c->report);
	return st;
}

static kiln_status import_mem(const void *data, size_t size, const kiln_onnx_opts *o,
                              kiln_graph **out, kiln_error *err)
{
	const char *path = o->path ? o->path : "model.onnx";
	onnx_alloc a;
	Onnx__ModelProto *m;
	kiln_status st = onnx_unpack(data, size, path, &a, &m, err);
	if (st)
		return st;
	const char *gname = m->graph && m->graph->name && *m->graph->name ? m->graph->name : "main";
	onnx_imp c = {.g = kiln_graph_new(gname), .m = m, .dir = o->dir,
	              .specialize = o->specialize};
	st = KILN_ENOMEM;
	if (c.g && (c.path = ir_intern(c.g, path)) != NULL) {
		import_graph(&c);
		st = finish(&c, o, out, err);
	} else {
		kiln_graph_free(c.g);
		ir_seterr(err, st, "%s: out of memory", path);
	}
	onnx_unpacked_free(m, &a);
	return st;
}

/* The whole file, bounded by protobuf's 2 GiB message limit; a FIFO or
 * anything else but a regular file is refused without waiting on it. */
static kiln_status slurp(const char *path, void **data, size_t *size, kiln_error *err)
{
	kiln_error e = {0};
	kiln_status st = rt_read_file(path, MAX_MODEL_BYTES, data, size, &e);
	size_t n = strlen(path);
	const char *why = strncmp(e.msg, path, n) == 0 && e.msg[n] == ':' ? e.msg + n + 2 : e.msg;
	return st ? ir_seterr(err, st, "%s: cannot read: %s", path, why) : KILN_OK;
}

/* Reads o->path; external data defaults to the file's folder. */
static kiln_status import_file(const kiln_onnx_opts *o, kiln_graph **out, kiln_error *err)
{
	void *data;
	size_t size = 0;
	kiln_status st = slurp(o->path, &data, &size, err);
	if (st)
		return st;
	char *dir = strdup(o->path);
	char *slash = dir ? strrchr(dir, '/') : NULL;
	if (slash)
		*(slash == dir ? slash + 1 : slash) = 0;
	kiln_onnx_opts fo = *o;
	fo.dir = o->dir ? o->dir : slash ? dir : ".";
	st = dir ? import_mem(data, size, &fo, out, err)
	         : ir_seterr(err, KILN_ENOMEM, "out of memory");
	free(dir), free(data);
	return st;
}

KILN_API kiln_status kiln_onnx_import_ex(const void *data, size_t size,
                                         const kiln_onnx_opts *o, kiln_graph **out,
                                         kiln_error *err)
{
	kiln_onnx_opts dflt = {0};
	o = o ? o : &dflt;
	if (out)
		*out = NULL;
	if (o->report)
		*o->report = NULL;
	if (!out || (!data && size) || (!data && !o->path))
		return ir_seterr(err, KILN_EINVAL, "kiln_onnx_import: null argument");
	kiln_error local = {0};
	err = err ? err : &local;
	kiln_status st = data ? import_mem(data, size, o, out, err) : import_file(o, out, err);
	/* failures before or after the node walk (an unreadable file, a graph
	 * that fails verification) are the report's one line */
	if (st && o->report && (!*o->report || !**o->report)) {
		free(*o->report);
		size_t n = strlen(err->msg);
		if ((*o->report = malloc(n + 2)) != NULL)
			memcpy(*o->report, err->msg, n), strcpy(*o->report + n, "\n");
	}
	return st;
}

KILN_API kiln_status kiln_onnx_import_mem(const void *data, size_t size, const char *name,
                                          kiln_graph **out, kiln_error *err)
{
	kiln_onnx_opts o = {name, NULL, NULL, NULL};
	if (!data)
		return ir_seterr(err, KILN_EINVAL, "kiln_onnx_import_mem: null data");
	return kiln_onnx_import_ex(data, size, &o, out, err);
}

KILN_API kiln_status kiln_onnx_import(const char *path, kiln_graph **out, kiln_error *err)
{
	kiln_onnx_opts o = {path, NULL, NULL, NULL};
	if (!path)
		return ir_seterr(err, KILN_EINVAL, "kiln_onnx_import: null path");
	return kiln_onnx_import_ex(NULL, 0, &o, out, err);
}

/* By content, not name: a model saved as "m.bin" loads, and a library or an
 * array passed by mistake is named for what it is. */
KILN_API kiln_status kiln_graph_load_any(const char *path, kiln_graph **out, kiln_error *err)
{
	size_t n = path ? strlen(path) : 0;
	rt_file_kind k = rt_file_sniff(path);
	if (out)
		*out = NULL;
	switch (k) {
	case RT_FILE_ONNX:
		return kiln_onnx_import(path, out, err);
	case RT_FILE_ELF:
	case RT_FILE_NPY:
	case RT_FILE_SAFETENSORS:
		return ir_seterr(err, KILN_EINVAL, "%s: this is %s, not a model (.kir or ONNX)%s",
		                 path, rt_file_kind_name(k),
		                 k == RT_FILE_ELF ? "; 'kiln run' and 'kiln inspect' take it as it is" : "");
	case RT_FILE_UNKNOWN: /* unreadable: the loader says why, under the name's kind */
		if (n >= 5 && !strcasecmp(path + n - 5, ".onnx"))
			return kiln_onnx_import(path, out, err);
		return kiln_graph_load(path, out, err);
	default:
		return kiln_graph_load(path, out, err);
	}
}
