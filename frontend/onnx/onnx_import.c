/*
 * onnx_import.c: reads an ONNX ModelProto (parsed by protobuf-c) into a
 * kiln graph: attributes, initializers, graph inputs and outputs, the node
 * walk and the public entry points.  The per-op mapping lives in
 * onnx_ops.c, the helpers both use (problems, attributes, inputs, node
 * creation) in onnx_node.c, what is known about values at import time
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

/* ---- the graph ------------------------------------------------------------- */

static void bind(onnx_imp *c, onnx_nd *d, const char *name, uint32_t v)
{
	bool oom = false;
	const char *key = ir_intern(c->g, name);
	if (!key || !onnx_name_set(c, key, v, &oom))
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
		if (onnx_name_get(c, ir_intern(c->g, vi->name), &v))
			continue;
		v = input_type(c, vi, &t) ? ir_input_new(c->g, vi->name, &t) : 0;
		bind(c, NULL, vi->name, v);
	}
}

static void add_node(onnx_imp *c, const Onnx__NodeProto *p)
{
	onnx_nd d = {p, KILN_OP_COUNT, NULL, false};
	const char *dom = onnx_domain_of(p);
	if (!strcmp(dom, "com.microsoft"))
		onnx_import_msft(c, &d);
	else if (strcmp(dom, "ai.onnx"))
		onnx_problem(c, &d, KILN_EUNSUPPORTED, "domain '%s' is not supported (only the "
		             "default ONNX domain and ONNX Runtime's quantized ops in "
		             "com.microsoft are)", dom);
	else if (!p->op_type || ((d.op = ir_op_from_onnx(p->op_type)) == KILN_OP_COUNT &&
	                         !onnx_import_composite(c, &d)))
		onnx_problem(c, &d, KILN_EUNSUPPORTED, "op is not in kiln's op table");
	else if (d.op == KILN_OP_COUNT)
		; /* imported as a composition of kiln's ops */
	else if (c->opset < 7 && !(ir_op(d.op)->flags & IR_ONNX_PRE7))
		onnx_problem(c, &d, KILN_EUNSUPPORTED, "opsets before 7 are supported only for ops "
		             "whose definition has not changed since (this one has)");
	else
		onnx_import_node(c, &d);
	if (!d.failed && d.n && !onnx_infer(c, &d, d.n))
		d.failed = true;
	for (size_t i = 0; i < p->n_output; i++)
		if (p->output[i] && *p->output[i])
			bind(c, &d, p->output[i], d.failed ? 0 : d.nout ? (i < d.nout ? d.out[i] : 0)
			                          : !d.n || i >= d.n->nout ? 0 : d.n->out[i]);
}

static void add_outputs(onnx_imp *c, const Onnx__GraphProto *gp)
{
	for (size_t i = 0; i < gp->n_output; i++) {
		const char *nm = gp->output[i]->name;
		uint32_t v = 0;
		if (!nm || !onnx_name_get(c, ir_intern(c->g, nm), &v))
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
	c->opset = onnx_opset_of(c, "ai.onnx");
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
