/*
 * onnx_node.c: what importing one ONNX node needs, shared by the node walk
 * (onnx_import.c) and the per-op mapping (onnx_ops.c): problem collection,
 * the ONNX-name table, attribute copying by the op's schema, inputs, kiln
 * node creation and constant inputs turned into kiln attributes.  Both
 * files call this one and it calls neither, so the importer has no call
 * circle.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/onnx/onnx.h"

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
const char *onnx_domain_of(const Onnx__NodeProto *p)
{
	return p->domain && *p->domain ? p->domain : "ai.onnx";
}

int64_t onnx_opset_of(const onnx_imp *c, const char *domain)
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
		const char *dom = onnx_domain_of(p);
		bool named = p->name && *p->name;
		snprintf(where, sizeof where, "%s%s%s%s (domain %s, opset %lld): ",
		         p->op_type ? p->op_type : "?", named ? " '" : "", named ? p->name : "",
		         named ? "'" : "", dom, (long long)onnx_opset_of(c, dom));
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
bool onnx_name_set(onnx_imp *c, const char *key, uint32_t v, bool *oom)
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

bool onnx_name_get(const onnx_imp *c, const char *key, uint32_t *v)
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
	if (!onnx_name_get(c, ir_intern(c->g, nm), &v))
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

/* v's value when it is known, or can be: a graph input the caller
 * specialised on, or a node whose inputs all are (folded now, depth-first:
 * a Cast or Add of a specialised input). */
static const kiln_tensor *known(onnx_imp *c, uint32_t v, int depth)
{
	const kiln_tensor *t = onnx_const(c, v);
	const ir_value *val = c->g->val[v];
	const onnx_svec *s = t ? NULL : onnx_svec_of(c, v);
	bool numbers = s && val->type.dtype == KILN_I64;
	for (int i = 0; numbers && i < s->n; i++)
		numbers = !s->sym[i];
	if (numbers) { /* shape arithmetic that came out all numbers */
		int64_t n = s->n;
		kiln_tensor *k = ir_tensor_new(c->g, KILN_I64, s->rank, &n);
		for (int i = 0; k && i < s->n; i++)
			ir_store_i64(k, i, s->v[i]);
		if (k && onnx_const_set(c, v, k))
			return onnx_const(c, v);
	}
	if (t || depth > 32)
		return t;
	if (val->kind == IR_V_INPUT)
		return specialize(c, v);
	if (val->kind != IR_V_NODE || !val->def || !c->specialize)
		return NULL;
	const ir_node *n = val->def;
	for (uint32_t i = 0; i < n->nin; i++)
		if (n->in[i] && !known(c, n->in[i], depth + 1))
			return NULL;
	onnx_fold(c, n);
	return onnx_const(c, v);
}

const kiln_tensor *onnx_const_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *what,
                                    bool required)
{
	uint32_t v = onnx_input(c, d, i, required);
	const kiln_tensor *t = onnx_const(c, v);
	if (v && !t)
		t = known(c, v, 0);
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

/* Whether op's schema lets attribute name hold symbolic dims (kind ds). */
static bool attr_holds_dims(kiln_op op, const char *name)
{
	ir_attr_schema sc[24];
	int ns = ir_op_schema(op, sc, 24);
	for (int k = 0; k < ns; k++)
		if (!strcmp(sc[k].name, name))
			return sc[k].dims;
	return false;
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
	if (s->rank == 1 && attr_holds_dims(d->n->op, name))
		return onnx_dims_input(c, d, i, name, true); /* Reshape to [N,S,384] */
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

bool onnx_dims_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name, bool required)
{
	uint32_t v = onnx_input(c, d, i, required);
	const onnx_svec *s = v && !onnx_const(c, v) ? onnx_svec_of(c, v) : NULL;
	uint64_t dims = 0;
	if (!s || s->rank != 1)
		return onnx_ints_input(c, d, i, name, required);
	for (int k = 0; k < s->n; k++)
		dims |= (uint64_t)s->sym[k] << k;
	if (ir_attr_set_dims(c->g, d->n, name, (uint32_t)s->n, s->v, dims))
		return onnx_problem(c, d, KILN_ENOMEM, "out of memory"), false;
	return true;
}

bool onnx_ints_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name, bool required)
{
	const kiln_tensor *t = onnx_const_input(c, d, i, name, required);
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
	const kiln_tensor *t = onnx_const_input(c, d, i, name, false);
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


bool onnx_copy_attrs_to(onnx_imp *c, onnx_nd *d, ir_node *n, kiln_op op,
                        const char *const *skip)
{
	ir_node *keep_n = d->n;
	kiln_op keep_op = d->op;
	d->n = n, d->op = op;
	bool ok = copy_attrs(c, d, skip);
	d->n = keep_n, d->op = keep_op;
	return ok;
}
