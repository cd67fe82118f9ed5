/*
 * onnx_export.c: writes a graph as an ONNX model (IR version 8, opset 17).
 *
 * The model is built as protobuf-c messages in a scratch arena and packed
 * once; every message, string and array lives in the arena, and weights are
 * not copied: initializers point raw_data at the graph's own tensor bytes
 * (little-endian, which every host kiln supports).  Freeing the arena frees
 * the whole model.
 *
 * kiln's IR holds as attributes what opset 17 takes as constant inputs
 * (Reshape's shape, Slice's starts, Clip's bounds...).  The table `moves`
 * says, per op, which attributes turn back into inputs and of what type;
 * they become Constant nodes named after the node's first output
 * ("y_shape"), so the graph's initializers stay exactly its parameters and
 * an importer folds them back into the same attributes.  Gelu has no
 * opset-17 form and is written as its Erf or Tanh formula.
 *
 * Every value gets a unique ONNX name: its own when it has one that no
 * earlier value took, else "_v<id>" (made unique), in the order inputs,
 * parameters, node results; so the same graph always exports the same bytes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/onnx/onnx.h"
#include "runtime/rt.h"

#define OPSET 17
#define IR_VERSION 8

/* ---- exporter state ----------------------------------------------------- */

typedef struct vec {
	void **p;
	size_t n, cap;
} vec;

typedef struct ex {
	const kiln_graph *g;
	ir_arena *a;           /* everything below, and every message */
	kiln_error *err;
	kiln_status st;        /* first error */
	const char **vname;    /* per value id: its unique ONNX name */
	const char **names;    /* open-addressing set of names in use */
	size_t nnames, capnames;
	vec nodes, inits, vinfo;
} ex;

static bool fail(ex *x, kiln_status code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static bool fail(ex *x, kiln_status code, const char *fmt, ...)
{
	if (x->st == KILN_OK) {
		va_list ap;
		va_start(ap, fmt);
		x->st = code;
		if (x->err) {
			x->err->code = code;
			vsnprintf(x->err->msg, sizeof x->err->msg, fmt, ap);
		}
		va_end(ap);
	}
	return false;
}

static void *alloc(ex *x, size_t n)
{
	void *p = x->st == KILN_OK ? ir_alloc(x->a, n) : NULL;
	if (!p)
		fail(x, KILN_ENOMEM, "onnx export: out of memory");
	return p;
}

static char *dup(ex *x, const char *s)
{
	char *p = alloc(x, strlen(s) + 1);
	return p ? strcpy(p, s) : NULL;
}

static bool push(ex *x, vec *v, void *item)
{
	if (!item)
		return false;
	if (v->n == v->cap) {
		size_t nc = v->cap ? v->cap * 2 : 16;
		void **p = alloc(x, nc * sizeof *p);
		if (!p)
			return false;
		if (v->n)
			memcpy(p, v->p, v->n * sizeof *p);
		v->p = p;
		v->cap = nc;
	}
	v->p[v->n++] = item;
	return true;
}

/* ---- unique names ------------------------------------------------------- */

static size_t hash(const char *s)
{
	size_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

/* Adds s (a string that outlives the export) to the set; false if taken. */
static bool claim(ex *x, const char *s)
{
	if (2 * (x->nnames + 1) > x->capnames) {
		size_t nc = x->capnames ? 2 * x->capnames : 256;
		const char **t = calloc(nc, sizeof *t);
		if (!t)
			return fail(x, KILN_ENOMEM, "onnx export: out of memory");
		for (size_t i = 0; i < x->capnames; i++) {
			if (!x->names[i])
				continue;
			size_t h = hash(x->names[i]) & (nc - 1);
			while (t[h])
				h = (h + 1) & (nc - 1);
			t[h] = x->names[i];
		}
		free(x->names);
		x->names = t;
		x->capnames = nc;
	}
	size_t h = hash(s) & (x->capnames - 1);
	for (; x->names[h]; h = (h + 1) & (x->capnames - 1))
		if (!strcmp(x->names[h], s))
			return false;
	x->names[h] = s;
	x->nnames++;
	return true;
}

/* base itself when free, else base_1, base_2, ... */
static const char *fresh(ex *x, const char *base)
{
	char buf[600];
	snprintf(buf, sizeof buf, "%s", base);
	for (unsigned k = 1; x->st == KILN_OK; k++) {
		char *s = dup(x, buf);
		if (s && claim(x, s))
			return s;
		snprintf(buf, sizeof buf, "%.500s_%u", base, k);
	}
	return NULL;
}

/* Two passes, so that a named value never loses its name to a generated
 * one: first every value keeps its name if no earlier value took it. */
static bool name_values(ex *x)
{
	const kiln_graph *g = x->g;
	x->vname = alloc(x, g->nval * sizeof *x->vname);
	if (!x->vname)
		return false;
	for (uint32_t i = 1; i < g->nval && x->st == KILN_OK; i++) {
		const ir_value *v = g->val[i];
		if (v->kind != IR_V_NONE && v->name && *v->name && claim(x, v->name))
			x->vname[i] = v->name;
	}
	for (uint32_t i = 1; i < g->nval && x->st == KILN_OK; i++) {
		const ir_value *v = g->val[i];
		char base[600];
		if (v->kind == IR_V_NONE || x->vname[i])
			continue;
		if (v->name && *v->name)
			snprintf(base, sizeof base, "%.500s", v->name);
		else
			snprintf(base, sizeof base, "_v%u", i);
		x->vname[i] = fresh(x, base);
	}
	return x->st == KILN_OK;
}

/* ---- tensors and types -------------------------------------------------- */

static Onnx__TensorProto *tensor_proto(ex *x, const char *name, const kiln_tensor *t)
{
	Onnx__TensorProto *p = alloc(x, sizeof *p);
	int64_t *dims = alloc(x, (t->rank + 1) * sizeof *dims);
	if (!p || !dims)
		return NULL;
	if (!onnx_dtype_from_kiln(t->dtype)) {
		fail(x, KILN_EINVAL, "onnx export: tensor '%s' has no ONNX dtype", name);
		return NULL;
	}
	onnx__tensor_proto__init(p);
	memcpy(dims, t->shape, t->rank * sizeof *dims);
	p->n_dims = t->rank;
	p->dims = dims;
	p->has_data_type = 1;
	p->data_type = onnx_dtype_from_kiln(t->dtype);
	p->name = (char *)name;
	p->has_raw_data = 1;
	p->raw_data.len = kiln_tensor_nbytes(t);
	p->raw_data.data = t->data; /* packed, never freed through protobuf-c */
	return p;
}

static Onnx__TypeProto *type_proto(ex *x, const ir_type *t)
{
	Onnx__TypeProto *tp = alloc(x, sizeof *tp);
	Onnx__TypeProto__Tensor *tt = alloc(x, sizeof *tt);
	Onnx__TensorShapeProto *sp = alloc(x, sizeof *sp);
	Onnx__TensorShapeProto__Dimension **dims = alloc(x, (t->rank + 1) * sizeof *dims);
	if (!tp || !tt || !sp || !dims)
		return NULL;
	onnx__type_proto__init(tp);
	onnx__type_proto__tensor__init(tt);
	onnx__tensor_shape_proto__init(sp);
	for (int i = 0; i < t->rank; i++) {
		Onnx__TensorShapeProto__Dimension *d = alloc(x, sizeof *d);
		if (!d)
			return NULL;
		onnx__tensor_shape_proto__dimension__init(d);
		if (t->dim[i] >= 0) {
			d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
			d->dim_value = t->dim[i];
		} else {
			char s[256];
			d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
			d->dim_param = dup(x, ir_dim_str(x->g, t->dim[i], s, sizeof s));
		}
		dims[i] = d;
	}
	sp->n_dim = t->rank;
	sp->dim = dims;
	tt->has_elem_type = 1;
	tt->elem_type = onnx_dtype_from_kiln(t->dtype);
	tt->shape = sp;
	tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
	tp->tensor_type = tt;
	return tp;
}

static Onnx__ValueInfoProto *value_info(ex *x, uint32_t id)
{
	Onnx__ValueInfoProto *vi = alloc(x, sizeof *vi);
	if (!vi)
		return NULL;
	onnx__value_info_proto__init(vi);
	vi->name = (char *)x->vname[id];
	vi->type = type_proto(x, &x->g->val[id]->type);
	return vi->type ? vi : NULL;
}

/* ---- nodes and attributes ----------------------------------------------- */

/* A node with room for cap inputs; outputs and name set by the caller. */
static Onnx__NodeProto *node_new(ex *x, const char *op_type, size_t cap)
{
	Onnx__NodeProto *np = alloc(x, sizeof *np);
	char **in = alloc(x, (cap + 1) * sizeof *in);
	if (!np || !in)
		return NULL;
	onnx__node_proto__init(np);
	np->op_type = (char *)op_type;
	np->input = in;
	return push(x, &x->nodes, np) ? np : NULL;
}

static Onnx__AttributeProto *attr_add(ex *x, Onnx__NodeProto *np, const char *name,
                                      Onnx__AttributeProto__AttributeType type)
{
	Onnx__AttributeProto *ap = alloc(x, sizeof *ap);
	Onnx__AttributeProto **arr = alloc(x, (np->n_attribute + 1) * sizeof *arr);
	if (!ap || !arr)
		return NULL;
	onnx__attribute_proto__init(ap);
	ap->name = (char *)name;
	ap->has_type = 1;
	ap->type = type;
	if (np->n_attribute)
		memcpy(arr, np->attribute, np->n_attribute * sizeof *arr);
	arr[np->n_attribute++] = ap;
	np->attribute = arr;
	return ap;
}

/* One kiln attribute as its ONNX attribute of the same name. */
static bool attr_copy(ex *x, Onnx__NodeProto *np, const ir_attr *a)
{
	typedef Onnx__AttributeProto__AttributeType T;
	static const T type[] = {
		[IR_A_INT] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT,
		[IR_A_FLOAT] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT,
		[IR_A_INTS] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS,
		[IR_A_FLOATS] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS,
		[IR_A_STRING] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING,
		[IR_A_TENSOR] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR,
		[IR_A_DTYPE] = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT,
	};
	Onnx__AttributeProto *ap = attr_add(x, np, a->name, type[a->kind]);
	if (!ap)
		return false;
	switch (a->kind) {
	case IR_A_INT: ap->has_i = 1; ap->i = a->u.i; break;
	case IR_A_DTYPE: ap->has_i = 1; ap->i = onnx_dtype_from_kiln((kiln_dtype)a->u.i); break;
	case IR_A_FLOAT: ap->has_f = 1; ap->f = (float)a->u.f; break;
	case IR_A_INTS: ap->n_ints = a->n; ap->ints = a->u.ints; break;
	case IR_A_STRING:
		ap->has_s = 1;
		ap->s.data = (uint8_t *)(a->u.s ? a->u.s : "");
		ap->s.len = strlen((const char *)ap->s.data);
		break;
	case IR_A_TENSOR: return (ap->t = tensor_proto(x, NULL, a->u.t)) != NULL;
	case IR_A_FLOATS:
		ap->n_floats = a->n;
		if (!(ap->floats = alloc(x, (a->n + 1) * sizeof(float))))
			return false;
		for (uint32_t i = 0; i < a->n; i++)
			ap->floats[i] = (float)a->u.floats[i];
		break;
	}
	return true;
}

/* A Constant node holding t, named fresh from base; returns its output. */
static const char *constant(ex *x, const char *base, kiln_tensor *t)
{
	const char *name = fresh(x, base);
	Onnx__NodeProto *np = name ? node_new(x, "Constant", 0) : NULL;
	char **out = alloc(x, sizeof *out);
	if (!np || !out)
		return NULL;
	out[0] = (char *)name;
	np->n_output = 1;
	np->output = out;
	Onnx__AttributeProto *ap =
		attr_add(x, np, "value", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR);
	return ap && (ap->t = tensor_proto(x, NULL, t)) ? name : NULL;
}

/* A tensor in the arena: rank 0 or 1 of n elements. */
static kiln_tensor *scratch_tensor(ex *x, kiln_dtype dt, int rank, int64_t n)
{
	kiln_tensor *t = alloc(x, sizeof *t);
	if (!t)
		return NULL;
	*t = (kiln_tensor){dt, rank, {n}, NULL};
	t->data = alloc(x, (size_t)n * kiln_dtype_size(dt) + 1);
	return t->data ? t : NULL;
}

/* A scalar of dtype dt; integer types clamp (Clip's bounds may be huge). */
static kiln_tensor *scalar(ex *x, kiln_dtype dt, double v)
{
	kiln_tensor *t = scratch_tensor(x, dt, 0, 1);
	if (!t)
		return NULL;
	if (!kiln_dtype_is_float(dt)) {
		double lo = dt == KILN_U8 || dt == KILN_BOOL ? 0 : dt == KILN_I8 ? -128
		          : dt == KILN_I32 ? INT32_MIN : -9.2233720368547748e18;
		double hi = dt == KILN_BOOL ? 1 : dt == KILN_U8 ? 255 : dt == KILN_I8 ? 127
		          : dt == KILN_I32 ? INT32_MAX : 9.2233720368547748e18;
		v = isnan(v) ? 0 : v < lo ? lo : v > hi ? hi : v;
	}
	ir_store(t, 0, v);
	return t;
}

/* Starts the ONNX node for n: its inputs, outputs and name, room for
 * extra more inputs. */
static Onnx__NodeProto *begin(ex *x, const ir_node *n, size_t extra)
{
	Onnx__NodeProto *np = node_new(x, ir_op(n->op)->onnx, n->nin + extra);
	char **out = alloc(x, (n->nout + 1) * sizeof *out);
	if (!np || !out)
		return NULL;
	for (uint32_t i = 0; i < n->nin; i++)
		np->input[i] = (char *)(n->in[i] ? x->vname[n->in[i]] : "");
	np->n_input = n->nin;
	for (uint32_t i = 0; i < n->nout; i++)
		out[i] = (char *)x->vname[n->out[i]];
	np->n_output = n->nout;
	np->output = out;
	np->name = (char *)(n->name ? n->name : "");
	return np;
}

static const char *op3(ex *x, const ir_node *n, const char *op_type, const char *a,
                       const char *b, const char *c, const char *out);
static const char *op2(ex *x, const ir_node *n, const char *op_type, const char *a,
                       const char *b, const char *out);

/* ---- symbolic dims as values computed at run time ------------------------- */

/* Appends an int attribute to the node just made (the last in x->nodes). */
static bool last_attr_i(ex *x, const char *name, int64_t v)
{
	Onnx__NodeProto *np = x->nodes.n ? x->nodes.p[x->nodes.n - 1] : NULL;
	Onnx__AttributeProto *ap =
		np ? attr_add(x, np, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT) : NULL;
	if (!ap)
		return false;
	ap->has_i = 1;
	ap->i = v;
	return true;
}

/* A 1-D int64 Constant of one element. */
static const char *const_i64_1(ex *x, const ir_node *n, int64_t v)
{
	char base[600];
	kiln_tensor *t = scratch_tensor(x, KILN_I64, 1, 1);
	snprintf(base, sizeof base, "%.500s_dim", x->vname[n->out[0]]);
	if (!t)
		return NULL;
	((int64_t *)t->data)[0] = v;
	return constant(x, base, t);
}

/* The ONNX name of a 1-D int64 tensor of one element that holds dim d when
 * the model runs: a Constant for a size; for a symbol, Shape(start=k,
 * end=k+1) of a graph input whose dim k it is; a sum, product or floor
 * quotient as Add, Mul or Div of its operands (sizes are >= 0, where ONNX's
 * truncating Div floors).  An attribute that holds S (Slice's ends=[S])
 * exports as this instead of a Constant. */
static const char *dim_value(ex *x, const ir_node *n, int64_t d, int depth)
{
	const kiln_graph *g = x->g;
	const ir_dimexpr *e = ir_dim_expr(g, d);
	char ds[128], desc[160];
	if (!e && d >= 0)
		return const_i64_1(x, n, d);
	if (!e || depth > 64) {
		fail(x, KILN_EUNSUPPORTED, "onnx export: %s: dim %s is no dim of the graph or nests "
		     "too deeply", ir_node_desc(n, desc, sizeof desc), ir_dim_str(g, d, ds, sizeof ds));
		return NULL;
	}
	if (e->op != IR_DSYM) {
		const char *a = dim_value(x, n, e->a, depth + 1), *b = dim_value(x, n, e->b, depth + 1);
		return a && b ? op2(x, n, e->op == IR_DADD ? "Add" : e->op == IR_DMUL ? "Mul" : "Div",
		                    a, b, NULL) : NULL;
	}
	for (uint32_t i = 0; i < g->ninput; i++) {
		const ir_type *t = &g->val[g->input[i]]->type;
		for (int k = 0; k < t->rank; k++) {
			const char *v;
			if (t->dim[k] != d)
				continue;
			v = op2(x, n, "Shape", x->vname[g->input[i]], NULL, NULL);
			return v && last_attr_i(x, "start", k) && last_attr_i(x, "end", k + 1) ? v : NULL;
		}
	}
	fail(x, KILN_EUNSUPPORTED, "onnx export: %s: the dim %s is no graph input's dim, so it "
	     "has no value at run time", ir_node_desc(n, desc, sizeof desc),
	     ir_dim_str(g, d, ds, sizeof ds));
	return NULL;
}

/* An ints attribute holding symbolic dims as a 1-D int64 input: the
 * elements' values (dim_value) concatenated. */
static const char *dims_input(ex *x, const ir_node *n, const ir_attr *a)
{
	char base[600];
	const char **v = alloc(x, (a->n + 1) * sizeof *v);
	for (uint32_t i = 0; v && i < a->n; i++)
		if (!(v[i] = ir_attr_is_dim(a, i) ? dim_value(x, n, a->u.ints[i], 0)
		                                  : const_i64_1(x, n, a->u.ints[i])))
			return NULL;
	if (!v || a->n == 1)
		return v ? v[0] : NULL;
	snprintf(base, sizeof base, "%.500s_%s", x->vname[n->out[0]], a->name);
	Onnx__NodeProto *np = node_new(x, "Concat", a->n);
	char **o = np ? alloc(x, sizeof *o) : NULL;
	if (!o || !(o[0] = (char *)fresh(x, base)))
		return NULL;
	for (uint32_t i = 0; i < a->n; i++)
		np->input[np->n_input++] = (char *)v[i];
	np->n_output = 1;
	np->output = o;
	return last_attr_i(x, "axis", 0) ? o[0] : NULL;
}

/* ---- attributes that opset 17 takes as inputs ---------------------------- */

typedef enum {
	MV_INTS = 1, /* int64 1-D tensor of the ints */
	MV_SHAPE,    /* the same, symbolic dims matched to the input's as 1 */
	MV_LIKE,     /* scalar of the first input's dtype */
	MV_F32,      /* float scalar */
	MV_BOOL,     /* bool scalar */
	MV_FLOATS,   /* float 1-D tensor of the floats */
	MV_I64_1,    /* int64 1-D tensor of the one int (TopK's K) */
} mv_kind;

typedef struct move {
	const char *attr;
	mv_kind kind;
} move;

/* In ONNX input order after the data input; an absent attribute becomes an
 * omitted optional input ("" unless a later one is present). */
static const move moves[KILN_OP_COUNT][4] = {
	[KILN_OP_RESHAPE] = {{"shape", MV_INTS}},
	[KILN_OP_SLICE] = {{"starts", MV_INTS}, {"ends", MV_INTS}, {"axes", MV_INTS},
	                   {"steps", MV_INTS}},
	[KILN_OP_SQUEEZE] = {{"axes", MV_INTS}},
	[KILN_OP_UNSQUEEZE] = {{"axes", MV_INTS}},
	[KILN_OP_EXPAND] = {{"shape", MV_SHAPE}},
	[KILN_OP_CLIP] = {{"min", MV_LIKE}, {"max", MV_LIKE}},
	[KILN_OP_SPLIT] = {{"split", MV_INTS}},
	[KILN_OP_PAD] = {{"pads", MV_INTS}, {"value", MV_LIKE}},
	[KILN_OP_REDUCE_SUM] = {{"axes", MV_INTS}},
	[KILN_OP_DROPOUT] = {{"ratio", MV_F32}, {"training_mode", MV_BOOL}},
	[KILN_OP_RESIZE] = {{"roi", MV_FLOATS}, {"scales", MV_FLOATS}, {"sizes", MV_INTS}},
	[KILN_OP_TOPK] = {{"k", MV_I64_1}},
};

static bool is_moved(kiln_op op, const char *name)
{
	for (int k = 0; k < 4 && moves[op][k].attr; k++)
		if (!strcmp(moves[op][k].attr, name))
			return true;
	return false;
}

/* Expand's shape broadcasts both ways, so a symbolic target dim that the
 * input already has is written as 1; one the input lacks (BERT's [1,S]
 * expanded to [N,S]) is its value at run time (dim_value), the whole shape
 * then a Concat (dims_input). */
static const char *shape_input(ex *x, const ir_node *n, const ir_attr *a)
{
	const ir_type *in = &x->g->val[n->in[0]]->type;
	ir_attr b = *a;
	int64_t *v = alloc(x, (a->n + 1) * sizeof *v);
	char base[600];
	if (!v || a->n > 64)
		return v ? (fail(x, KILN_EUNSUPPORTED, "onnx export: Expand to rank %u", a->n), NULL)
		         : NULL;
	b.u.ints = v, b.dims = 0;
	for (uint32_t i = 0; i < a->n; i++) {
		int64_t d = a->u.ints[i], j = (int64_t)i - ((int64_t)a->n - in->rank);
		v[i] = d < 0 && j >= 0 && in->dim[j] == d ? 1 : d;
		if (v[i] < 0)
			b.dims |= (uint64_t)1 << i;
	}
	if (b.dims)
		return dims_input(x, n, &b);
	kiln_tensor *t = scratch_tensor(x, KILN_I64, 1, a->n);
	if (t)
		memcpy(t->data, v, a->n * sizeof *v);
	snprintf(base, sizeof base, "%.500s_%s", x->vname[n->out[0]], a->name);
	return t ? constant(x, base, t) : NULL;
}

static const char *moved_input(ex *x, const ir_node *n, const ir_attr *a, mv_kind kind)
{
	char base[600], desc[160];
	double v = a->kind == IR_A_FLOAT ? a->u.f : (double)a->u.i;
	kiln_tensor *t = NULL;
	bool ints = kind == MV_INTS || kind == MV_SHAPE;
	if (kind == MV_FLOATS ? a->kind != IR_A_FLOATS
	                      : ints != (a->kind == IR_A_INTS) || (!ints && a->kind != IR_A_FLOAT &&
	                                                           a->kind != IR_A_INT)) {
		fail(x, KILN_EVERIFY, "onnx export: %s: attribute %s has the wrong kind",
		     ir_node_desc(n, desc, sizeof desc), a->name);
		return NULL;
	}
	if (kind == MV_INTS && a->dims)
		return dims_input(x, n, a);
	if (kind == MV_SHAPE && a->kind == IR_A_INTS)
		return shape_input(x, n, a);
	for (uint32_t i = 0; kind == MV_INTS && n->op == KILN_OP_RESIZE && i < a->n; i++)
		if (a->u.ints[i] < 0) {
			fail(x, KILN_EUNSUPPORTED, "onnx export: %s: sizes[%u] is a symbolic dim, which "
			     "has no constant form", ir_node_desc(n, desc, sizeof desc), i);
			return NULL;
		}
	if (kind == MV_I64_1 && (t = scratch_tensor(x, KILN_I64, 1, 1)))
		((int64_t *)t->data)[0] = a->u.i;
	if (kind == MV_FLOATS && (t = scratch_tensor(x, KILN_F32, 1, a->n)))
		for (uint32_t i = 0; i < a->n; i++)
			((float *)t->data)[i] = (float)a->u.floats[i];
	if (kind == MV_INTS && (t = scratch_tensor(x, KILN_I64, 1, a->n)))
		memcpy(t->data, a->u.ints, a->n * sizeof(int64_t));
	else if (kind == MV_LIKE)
		t = scalar(x, x->g->val[n->in[0]]->type.dtype, v);
	else if (kind != MV_INTS && kind != MV_FLOATS && kind != MV_I64_1)
		t = scalar(x, kind == MV_F32 ? KILN_F32 : KILN_BOOL, v);
	snprintf(base, sizeof base, "%.500s_%s", x->vname[n->out[0]], a->name);
	return t ? constant(x, base, t) : NULL;
}

/* ---- per-op export ------------------------------------------------------ */

/* The ONNX node of the same op_type; attributes in `moves` become inputs,
 * the rest are copied by name. */
static bool ex_node(ex *x, const ir_node *n)
{
	const move *mv = moves[n->op];
	const char *extra[4];
	size_t nextra = 0;
	/* the Constant nodes first: ONNX wants producers before consumers */
	for (int k = 0; k < 4 && mv[k].attr; k++) {
		const ir_attr *a = ir_attr_get(n, mv[k].attr);
		if (!(extra[k] = a ? moved_input(x, n, a, mv[k].kind) : ""))
			return false;
		if (a)
			nextra = k + 1; /* trailing omitted inputs are left off */
	}
	Onnx__NodeProto *np = begin(x, n, nextra);
	if (!np)
		return false;
	for (size_t k = 0; k < nextra; k++)
		np->input[np->n_input++] = (char *)extra[k];
	for (uint32_t i = 0; i < n->nattr; i++)
		if (!is_moved(n->op, n->attr[i].name) && !attr_copy(x, np, &n->attr[i]))
			return false;
	return true;
}

/* One helper node of a decomposition: op_type(a[, b[, c]]) into a fresh
 * value named after n's output and op (or into out when given); NULL
 * operands propagate. */
static const char *op3(ex *x, const ir_node *n, const char *op_type, const char *a,
                       const char *b, const char *c, const char *out)
{
	char base[600];
	snprintf(base, sizeof base, "%.500s_%s", x->vname[n->out[0]], ir_op(n->op)->kir);
	Onnx__NodeProto *np = a ? node_new(x, op_type, 3) : NULL;
	char **o = np ? alloc(x, sizeof *o) : NULL;
	if (!o || !(out = out ? out : fresh(x, base)))
		return NULL;
	np->input[np->n_input++] = (char *)a;
	if (b)
		np->input[np->n_input++] = (char *)b;
	if (c)
		np->input[np->n_input++] = (char *)c;
	o[0] = (char *)out;
	np->n_output = 1;
	np->output = o;
	return out;
}

static const char *op2(ex *x, const ir_node *n, const char *op_type, const char *a,
                       const char *b, const char *out)
{
	return op3(x, n, op_type, a, b, NULL, out);
}

/* An op opset 17 lacks (Gelu arrives in opset 20) is its formula from
 * ir_scalar_table, one ONNX node per instruction, the last writing n's
 * output; constants become Constant nodes in the input's dtype. */
static bool ex_formula(ex *x, const ir_node *n)
{
	static const char *const name[] = {
		[IR_S_NEG] = "Neg", [IR_S_ABS] = "Abs", [IR_S_EXP] = "Exp", [IR_S_LOG] = "Log",
		[IR_S_SQRT] = "Sqrt", [IR_S_TANH] = "Tanh", [IR_S_ERF] = "Erf", [IR_S_ADD] = "Add",
		[IR_S_SUB] = "Sub", [IR_S_MUL] = "Mul", [IR_S_DIV] = "Div", [IR_S_MAX] = "Max",
		[IR_S_MIN] = "Min", [IR_S_LT] = "Less", [IR_S_SELECT] = "Where",
	};
	ir_sexpr e;
	const char *v[IR_SEXPR_MAX];
	if (ir_scalar_build(n, &e))
		return fail(x, KILN_EINVAL, "onnx export: %s has attributes its formula refuses",
		            ir_op(n->op)->onnx);
	char base[600];
	snprintf(base, sizeof base, "%.500s_%s_c", x->vname[n->out[0]], ir_op(n->op)->kir);
	for (int i = 0; i < e.n; i++) {
		const ir_sinst *s = &e.i[i];
		const char *out = i == e.root ? x->vname[n->out[0]] : NULL;
		if (s->op == IR_S_X) {
			v[i] = x->vname[n->in[0]];
		} else if (s->op == IR_S_K) {
			kiln_tensor *t = scalar(x, x->g->val[n->in[0]]->type.dtype, s->k);
			v[i] = t ? constant(x, base, t) : NULL;
		} else {
			v[i] = op3(x, n, name[s->op], v[s->a], s->op >= IR_S_ADD ? v[s->b] : NULL,
			           s->op == IR_S_SELECT ? v[s->c] : NULL, out);
		}
		if (!v[i])
			return false;
	}
	return true;
}

/* Range of n elements as ONNX's Range(0, n, 1) in int64 (n a Constant, or
 * its value at run time when it is a symbolic dim), then Cast to the dtype,
 * times delta, plus start: the same count whatever the float rounding of
 * a limit would be. */
static bool ex_range(ex *x, const ir_node *n)
{
	const int64_t *v;
	uint64_t dims;
	char desc[160];
	kiln_dtype dt = (kiln_dtype)ir_attr_int(n, "dtype", KILN_F32);
	double start = ir_attr_float(n, "start", 0), delta = ir_attr_float(n, "delta", 1);
	if (ir_attr_dims(n, "n", &v, &dims) != 1)
		return fail(x, KILN_EVERIFY, "onnx export: %s: n must hold one element",
		            ir_node_desc(n, desc, sizeof desc));
	if (!kiln_dtype_is_float(dt) && (start != floor(start) || delta != floor(delta)))
		return fail(x, KILN_EUNSUPPORTED, "onnx export: %s: an integer Range with start %g "
		            "and delta %g has no exact ONNX form", ir_node_desc(n, desc, sizeof desc),
		            start, delta);
	kiln_tensor *k0 = scalar(x, KILN_I64, 0), *k1 = scalar(x, KILN_I64, 1), *kn;
	char base[600];
	snprintf(base, sizeof base, "%.500s_range", x->vname[n->out[0]]);
	const char *c0 = k0 ? constant(x, base, k0) : NULL, *c1 = k1 ? constant(x, base, k1) : NULL;
	const char *cnt = dims ? op2(x, n, "Squeeze", dim_value(x, n, v[0], 0), NULL, NULL)
	                : (kn = scalar(x, KILN_I64, (double)v[0])) ? constant(x, base, kn) : NULL;
	bool cast = dt != KILN_I64, mul = delta != 1, add = start != 0;
	const char *y = x->vname[n->out[0]];
	const char *r = op3(x, n, "Range", c0, cnt, c1, cast || mul || add ? NULL : y);
	if (r && cast && (r = op2(x, n, "Cast", r, NULL, mul || add ? NULL : y)) &&
	    !last_attr_i(x, "to", onnx_dtype_from_kiln(dt)))
		return false;
	kiln_tensor *kd = r && mul ? scalar(x, dt, delta) : NULL;
	if (r && mul)
		r = op2(x, n, "Mul", r, kd ? constant(x, base, kd) : NULL, add ? NULL : y);
	kiln_tensor *ks = r && add ? scalar(x, dt, start) : NULL;
	if (r && add)
		r = op2(x, n, "Add", r, ks ? constant(x, base, ks) : NULL, y);
	return r != NULL;
}

/* RNN, GRU and LSTM: ONNX's node, its optional inputs at their positions
 * (the `inputs` attribute) with "" for those left out, and activations as
 * ONNX's strings attribute. */
static bool ex_rnn(ex *x, const ir_node *n)
{
	ir_rnn r;
	char why[256], desc[160];
	if (ir_rnn_parse(n, &r, why, sizeof why))
		return fail(x, KILN_EINVAL, "onnx export: %s: %s", ir_node_desc(n, desc, sizeof desc),
		            why);
	Onnx__NodeProto *np = begin(x, n, 8);
	if (!np)
		return false;
	/* kiln's op always has Y, Y_h (and Y_c); an unnamed one nothing reads
	 * is an omitted ONNX output, as the node it was imported from had it */
	for (uint32_t i = 0; i < n->nout; i++) {
		const ir_value *ov = x->g->val[n->out[i]];
		bool used = ov->nuse > 0 || (ov->name && *ov->name);
		for (uint32_t k = 0; k < x->g->noutput && !used; k++)
			used = x->g->output[k] == n->out[i];
		if (!used)
			np->output[i] = (char *)"";
	}
	while (np->n_output > 1 && !*np->output[np->n_output - 1])
		np->n_output--;
	np->n_input = 3;
	for (int p = IR_RNN_B; p <= IR_RNN_P; p++)
		if (r.in[p] >= 0) {
			while (np->n_input < (size_t)p)
				np->input[np->n_input++] = (char *)"";
			np->input[np->n_input++] = (char *)x->vname[n->in[r.in[p]]];
		}
	for (uint32_t i = 0; i < n->nattr; i++) {
		const ir_attr *a = &n->attr[i];
		if (!strcmp(a->name, "inputs"))
			continue;
		if (strcmp(a->name, "activations")) {
			if (!attr_copy(x, np, a))
				return false;
			continue;
		}
		Onnx__AttributeProto *ap = attr_add(x, np, a->name,
		                                    ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS);
		int cnt = 1;
		for (const char *c = a->u.s; *c; c++)
			cnt += *c == ',';
		if (!ap || !(ap->strings = alloc(x, (size_t)cnt * sizeof *ap->strings)))
			return false;
		for (const char *c = a->u.s; c;) {
			const char *e = strchr(c, ',');
			size_t len = e ? (size_t)(e - c) : strlen(c);
			char *d = alloc(x, len + 1);
			if (!d)
				return false;
			memcpy(d, c, len), d[len] = 0;
			ap->strings[ap->n_strings].data = (uint8_t *)d;
			ap->strings[ap->n_strings++].len = len;
			c = e ? e + 1 : NULL;
		}
	}
	return true;
}

typedef bool (*export_fn)(ex *x, const ir_node *n);

/* ex_node's one-to-one mapping, except for ops flagged IR_EXPAND (opset 17
 * lacks them): those are their formula; and Range, whose ONNX form takes
 * its limit as an input; and the recurrent ops (ex_rnn). */
static export_fn exporter(kiln_op op)
{
	if (op == KILN_OP_RNN || op == KILN_OP_GRU || op == KILN_OP_LSTM)
		return ex_rnn;
	return op == KILN_OP_RANGE ? ex_range : ir_op(op)->flags & IR_EXPAND ? ex_formula : ex_node;
}

bool onnx_export_maps(kiln_op op)
{
	/* every op maps: one-to-one, or specially; this is what the test walks */
	return op < KILN_OP_COUNT && (exporter(op) != ex_node || ir_op(op)->onnx != NULL);
}

/* ---- graph and model ---------------------------------------------------- */

static bool inputs_and_params(ex *x, Onnx__GraphProto *gp)
{
	const kiln_graph *g = x->g;
	vec in = {0};
	for (uint32_t i = 0; i < g->ninput; i++)
		if (!push(x, &in, value_info(x, g->input[i])))
			return false;
	for (uint32_t i = 1; i < g->nval; i++)
		if (g->val[i]->kind == IR_V_PARAM &&
		    !push(x, &x->inits, tensor_proto(x, x->vname[i], g->val[i]->data)))
			return false;
	gp->n_input = in.n;
	gp->input = (Onnx__ValueInfoProto **)in.p;
	return true;
}

/* ONNX output names must be distinct: a value returned twice is returned
 * again through an Identity. */
static bool outputs(ex *x, Onnx__GraphProto *gp, bool *is_out)
{
	const kiln_graph *g = x->g;
	vec out = {0};
	for (uint32_t i = 0; i < g->noutput; i++) {
		uint32_t v = g->output[i];
		Onnx__ValueInfoProto *vi = ir_val(g, v) && g->val[v]->kind != IR_V_NONE
			? value_info(x, v) : NULL;
		if (!vi)
			return x->st == KILN_OK ? fail(x, KILN_EVERIFY, "onnx export: output %u "
			                               "is a dead value", i) : false;
		if (is_out[v]) {
			vi->name = (char *)op2(x, &(ir_node){.out = &v, .in = &v}, "Identity",
			                       x->vname[v], NULL, fresh(x, x->vname[v]));
			if (!vi->name)
				return false;
		}
		is_out[v] = true;
		if (!push(x, &out, vi))
			return false;
	}
	gp->n_output = out.n;
	gp->output = (Onnx__ValueInfoProto **)out.p;
	return true;
}

static bool build_graph(ex *x, Onnx__GraphProto *gp)
{
	const kiln_graph *g = x->g;
	bool *is_out = alloc(x, g->nval);
	if (!is_out || !name_values(x) || !inputs_and_params(x, gp))
		return false;
	for (uint32_t i = 0; i < g->nnode && x->st == KILN_OK; i++) {
		const ir_node *n = g->node[i];
		if (!n->dead)
			exporter(n->op)(x, n);
	}
	if (x->st != KILN_OK || !outputs(x, gp, is_out))
		return false;
	/* intermediate types keep symbolic dims such as N+1 */
	for (uint32_t i = 0; i < g->nnode; i++)
		for (uint32_t j = 0; !g->node[i]->dead && j < g->node[i]->nout; j++)
			if (!is_out[g->node[i]->out[j]] &&
			    !push(x, &x->vinfo, value_info(x, g->node[i]->out[j])))
				return false;
	gp->name = (char *)(g->name ? g->name : "main");
	gp->n_node = x->nodes.n;
	gp->node = (Onnx__NodeProto **)x->nodes.p;
	gp->n_initializer = x->inits.n;
	gp->initializer = (Onnx__TensorProto **)x->inits.p;
	gp->n_value_info = x->vinfo.n;
	gp->value_info = (Onnx__ValueInfoProto **)x->vinfo.p;
	return true;
}

static Onnx__ModelProto *build_model(ex *x)
{
	Onnx__ModelProto *m = alloc(x, sizeof *m);
	Onnx__GraphProto *gp = alloc(x, sizeof *gp);
	Onnx__OperatorSetIdProto *os = alloc(x, sizeof *os);
	Onnx__OperatorSetIdProto **osv = alloc(x, sizeof *osv);
	if (!m || !gp || !os || !osv)
		return NULL;
	onnx__model_proto__init(m);
	onnx__graph_proto__init(gp);
	onnx__operator_set_id_proto__init(os);
	os->domain = "";
	os->has_version = 1;
	os->version = OPSET;
	osv[0] = os;
	m->has_ir_version = 1;
	m->ir_version = IR_VERSION;
	m->n_opset_import = 1;
	m->opset_import = osv;
	m->producer_name = "kiln";
	m->producer_version = KILN_VERSION;
	m->graph = gp;
	return build_graph(x, gp) ? m : NULL;
}

KILN_API kiln_status kiln_onnx_export_mem(const kiln_graph *g, void **data, size_t *size,
                                          kiln_error *err)
{
	if (!g || !data || !size)
		return ir_seterr(err, KILN_EINVAL, "onnx export: null argument");
	*data = NULL;
	*size = 0;
	if (g->status != KILN_OK)
		return ir_seterr(err, g->status, "onnx export: graph has an error: %s", g->errmsg);
	kiln_status st = ir_check_weights(g, "export", err);
	if (st == KILN_OK)
		st = kiln_graph_verify(g, err);
	if (st != KILN_OK)
		return st;
	ex x = {.g = g, .a = ir_arena_new(), .err = err};
	if (!x.a)
		return ir_seterr(err, KILN_ENOMEM, "onnx export: out of memory");
	Onnx__ModelProto *m = build_model(&x);
	if (m) {
		size_t n = onnx__model_proto__get_packed_size(m);
		uint8_t *buf = n > INT32_MAX ? NULL : malloc(n ? n : 1);
		if (n > INT32_MAX)
			fail(&x, KILN_EUNSUPPORTED, "onnx export: model of %zu bytes is over protobuf's "
			     "2 GiB limit (external data is not written)", n);
		else if (!buf)
			fail(&x, KILN_ENOMEM, "onnx export: out of memory for %zu bytes", n);
		else {
			*size = onnx__model_proto__pack(m, buf);
			*data = buf;
		}
	}
	free(x.names);
	ir_arena_free(x.a);
	return x.st;
}

KILN_API kiln_status kiln_onnx_export(const kiln_graph *g, const char *path, kiln_error *err)
{
	void *data;
	size_t size;
	if (!path)
		return ir_seterr(err, KILN_EINVAL, "onnx export: null path");
	kiln_status st = kiln_onnx_export_mem(g, &data, &size, err);
	if (st == KILN_OK)
		st = rt_write_atomic(path, data, size, err);
	free(data);
	return st;
}
