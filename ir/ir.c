/*
 * ir.c: the graph IR's storage: arena, interned strings, dimension
 * expressions, values, nodes, attributes, use lists and errors.
 *
 * Everything a graph owns lives in its arena except the four growable
 * index arrays (values, nodes, inputs/outputs), which are realloc'd; so
 * kiln_graph_free is one arena release plus a few frees.  Values and nodes
 * are arena objects whose addresses never move, and nodes name values by id,
 * which keeps printing, cloning and compaction simple.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

const ir_op_info ir_op_info_table[KILN_OP_COUNT] = {
#define OP(id, onnx, kir, imin, imax, omin, omax, flags, attrs) \
	[KILN_OP_##id] = {onnx, kir, imin, imax, omin, omax, flags, attrs},
#include "ops.def"
#undef OP
};

/* ---- arena ------------------------------------------------------------ */

typedef struct chunk {
	struct chunk *next;
	size_t used, size;
	_Alignas(64) unsigned char mem[];
} chunk;

struct ir_arena {
	chunk *head;
};

ir_arena *ir_arena_new(void)
{
	return calloc(1, sizeof(ir_arena));
}

void ir_arena_free(ir_arena *a)
{
	if (!a)
		return;
	for (chunk *c = a->head, *next; c; c = next) {
		next = c->next;
		free(c);
	}
	free(a);
}

void *ir_alloc(ir_arena *a, size_t n)
{
	size_t align = n >= 64 ? 64 : 16;
	if (n == 0)
		n = 1;
	if (n > ((size_t)1 << 40))
		return NULL;
	chunk *c = a->head;
	size_t off = c ? (c->used + align - 1) & ~(align - 1) : 0;
	if (!c || off + n > c->size) {
		/* Big requests get a chunk of their own, placed behind the current
		 * one so the current chunk keeps serving small requests. */
		size_t size = n > 32768 ? n : 65536;
		chunk *nc = aligned_alloc(64, (sizeof(chunk) + size + 63) & ~(size_t)63);
		if (!nc)
			return NULL;
		nc->size = size;
		nc->used = 0;
		if (c && n > 32768) {
			nc->next = c->next;
			c->next = nc;
		} else {
			nc->next = c;
			a->head = nc;
		}
		c = nc;
		off = 0;
	}
	c->used = off + n;
	void *p = c->mem + off;
	memset(p, 0, n);
	return p;
}

char *ir_arena_strdup(ir_arena *a, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = ir_alloc(a, n);
	if (p)
		memcpy(p, s, n);
	return p;
}

/* Grows *arr (elements of size sz) to hold at least need; malloc-backed. */
static bool grow(void **arr, uint32_t *cap, uint32_t need, size_t sz)
{
	if (need <= *cap)
		return true;
	uint32_t nc = *cap ? *cap * 2 : 16;
	while (nc < need)
		nc *= 2;
	void *p = realloc(*arr, (size_t)nc * sz);
	if (!p)
		return false;
	*arr = p;
	*cap = nc;
	return true;
}

/* ---- errors ----------------------------------------------------------- */

const char *ir_node_desc(const ir_node *n, char *buf, size_t size)
{
	if (!n)
		snprintf(buf, size, "?");
	else if (n->name)
		snprintf(buf, size, "%s '%s'", ir_op(n->op)->onnx, n->name);
	else
		snprintf(buf, size, "%s", ir_op(n->op)->onnx);
	return buf;
}

static kiln_status verror(kiln_graph *g, kiln_loc loc, const ir_node *n, kiln_status code,
                          const char *fmt, va_list ap)
{
	if (!g || g->status != KILN_OK)
		return g ? g->status : code;
	char *p = g->errmsg, *end = g->errmsg + sizeof g->errmsg;
	if (loc.file && loc.line > 0)
		p += snprintf(p, end - p, "%s:%d: ", loc.file, loc.line);
	else if (loc.file)
		p += snprintf(p, end - p, "%s: ", loc.file);
	if (n && p < end) {
		char d[160];
		p += snprintf(p, end - p, "%s: ", ir_node_desc(n, d, sizeof d));
	}
	if (p < end)
		vsnprintf(p, end - p, fmt, ap);
	g->status = code;
	return code;
}

kiln_status ir_errorf(kiln_graph *g, const ir_node *n, kiln_status code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kiln_status st = verror(g, n ? n->loc : (kiln_loc){0}, n, code, fmt, ap);
	va_end(ap);
	return st;
}

kiln_loc ir_graph_loc(const kiln_graph *g)
{
	for (uint32_t i = 0; g && i < g->noutput; i++) {
		const ir_node *d = g->val[g->output[i]]->def;
		if (d && d->loc.file)
			return d->loc;
	}
	for (uint32_t i = 0; g && i < g->nnode; i++)
		if (g->node[i]->loc.file)
			return g->node[i]->loc;
	return (kiln_loc){0};
}

kiln_status ir_errorf_at(kiln_graph *g, kiln_loc loc, kiln_status code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kiln_status st = verror(g, loc, NULL, code, fmt, ap);
	va_end(ap);
	return st;
}

kiln_status ir_seterr(kiln_error *err, kiln_status code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		err->code = code;
		vsnprintf(err->msg, sizeof err->msg, fmt, ap);
		va_end(ap);
	}
	return code;
}

KILN_API kiln_status kiln_graph_status(const kiln_graph *g)
{
	return g ? g->status : KILN_EINVAL;
}

KILN_API const char *kiln_graph_errmsg(const kiln_graph *g)
{
	return g ? g->errmsg : "null graph";
}

KILN_API void kiln_graph_clear_error(kiln_graph *g)
{
	if (g) {
		g->status = KILN_OK;
		g->errmsg[0] = 0;
	}
}

/* ---- graph ------------------------------------------------------------ */

KILN_API kiln_graph *kiln_graph_new(const char *name)
{
	kiln_graph *g = calloc(1, sizeof *g);
	if (!g)
		return NULL;
	g->arena = ir_arena_new();
	if (!g->arena) {
		free(g);
		return NULL;
	}
	g->name = ir_intern(g, name && *name ? name : "main");
	g->rng = 0x853c49e6748fea9bULL;
	/* value 0 is the "no value" placeholder */
	if (g->name)
		ir_value_new(g, IR_V_NONE, NULL, NULL);
	if (!g->name || g->nval != 1) {
		kiln_graph_free(g);
		return NULL;
	}
	return g;
}

KILN_API void kiln_graph_free(kiln_graph *g)
{
	if (!g)
		return;
	free(g->val);
	free(g->node);
	free(g->input);
	free(g->output);
	free(g->dexp);
	free(g->sym);
	free(g->strtab);
	ir_arena_free(g->arena);
	free(g);
}

KILN_API const char *kiln_graph_name(const kiln_graph *g)
{
	return g ? g->name : NULL;
}

KILN_API void kiln_graph_seed(kiln_graph *g, uint64_t seed)
{
	if (g)
		g->rng = seed * 0x9e3779b97f4a7c15ULL + 0x853c49e6748fea9bULL;
}

KILN_API void kiln_graph_set_training(kiln_graph *g, bool training)
{
	if (g)
		g->training = training;
}

/* splitmix64: small, seedable, good enough for initialisation */
static uint64_t next_u64(kiln_graph *g)
{
	uint64_t z = (g->rng += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

double ir_rand_uniform(kiln_graph *g)
{
	return (double)(next_u64(g) >> 11) * 0x1.0p-53;
}

double ir_rand_normal(kiln_graph *g)
{
	double u1 = ir_rand_uniform(g), u2 = ir_rand_uniform(g);
	if (u1 < 1e-300)
		u1 = 1e-300;
	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* ---- interned strings ------------------------------------------------- */

uint32_t ir_hash_str(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

const char *ir_intern(kiln_graph *g, const char *s)
{
	if (!s)
		return NULL;
	if (g->nstr * 2 >= g->capstr) {
		uint32_t nc = g->capstr ? g->capstr * 2 : 256;
		const char **t = calloc(nc, sizeof *t);
		if (!t)
			return NULL;
		for (uint32_t i = 0; i < g->capstr; i++) {
			if (!g->strtab[i])
				continue;
			uint32_t h = ir_hash_str(g->strtab[i]) & (nc - 1);
			while (t[h])
				h = (h + 1) & (nc - 1);
			t[h] = g->strtab[i];
		}
		free(g->strtab);
		g->strtab = t;
		g->capstr = nc;
	}
	uint32_t h = ir_hash_str(s) & (g->capstr - 1);
	for (; g->strtab[h]; h = (h + 1) & (g->capstr - 1))
		if (strcmp(g->strtab[h], s) == 0)
			return g->strtab[h];
	char *p = ir_arena_strdup(g->arena, s);
	if (!p)
		return NULL;
	g->strtab[h] = p;
	g->nstr++;
	return p;
}

/* ---- dimensions -------------------------------------------------------- */

static int64_t dim_intern(kiln_graph *g, ir_dim_op op, int64_t a, int64_t b, const char *sym)
{
	for (uint32_t k = 0; k < g->ndexp; k++) {
		ir_dimexpr *e = &g->dexp[k];
		if (e->op == op && e->a == a && e->b == b && e->sym == sym)
			return -(int64_t)k - 1;
	}
	if (!grow((void **)&g->dexp, &g->capdexp, g->ndexp + 1, sizeof *g->dexp))
		return 0;
	g->dexp[g->ndexp] = (ir_dimexpr){op, a, b, sym};
	return -(int64_t)(g->ndexp++) - 1;
}

const ir_dimexpr *ir_dim_expr(const kiln_graph *g, int64_t d)
{
	if (d >= 0 || (uint64_t)(-(d + 1)) >= g->ndexp)
		return NULL;
	return &g->dexp[-(d + 1)];
}

int64_t ir_dim_sym(kiln_graph *g, const char *name)
{
	const char *s = ir_intern(g, name);
	if (!s)
		return 0;
	for (uint32_t k = 0; k < g->nsym; k++)
		if (g->sym[k] == s)
			return dim_intern(g, IR_DSYM, k, 0, s);
	if (!grow((void **)&g->sym, &g->capsym, g->nsym + 1, sizeof *g->sym))
		return 0;
	g->sym[g->nsym] = s;
	return dim_intern(g, IR_DSYM, g->nsym++, 0, s);
}

KILN_API int64_t kiln_sym(kiln_graph *g, const char *name)
{
	if (!g || !name || !*name)
		return 0;
	return ir_dim_sym(g, name);
}

int ir_dim_nsym(const kiln_graph *g)
{
	return (int)g->nsym;
}

const char *ir_dim_symname(const kiln_graph *g, int k)
{
	return k >= 0 && (uint32_t)k < g->nsym ? g->sym[k] : NULL;
}

int ir_dim_symbol_index(const kiln_graph *g, int64_t d)
{
	const ir_dimexpr *e = ir_dim_expr(g, d);
	return e && e->op == IR_DSYM ? (int)e->a : -1;
}

/* Splits d into (base, constant offset) when d is base + c. */
static int64_t split_off(const kiln_graph *g, int64_t d, int64_t *off)
{
	const ir_dimexpr *e = ir_dim_expr(g, d);
	if (e && e->op == IR_DADD && e->b >= 0) {
		*off = e->b;
		return e->a;
	}
	*off = 0;
	return d;
}

int64_t ir_dim_add(kiln_graph *g, int64_t a, int64_t b)
{
	if (a >= 0 && b >= 0)
		return a + b;
	if (a >= 0) { /* constant last */
		int64_t t = a;
		a = b;
		b = t;
	}
	if (b == 0)
		return a;
	if (b > 0) { /* (x + c1) + c2 = x + (c1 + c2) */
		int64_t off, base = split_off(g, a, &off);
		return off + b == 0 ? base : dim_intern(g, IR_DADD, base, off + b, NULL);
	}
	if (a < b) { /* order two symbolic operands canonically */
		int64_t t = a;
		a = b;
		b = t;
	}
	return dim_intern(g, IR_DADD, a, b, NULL);
}

int64_t ir_dim_mul(kiln_graph *g, int64_t a, int64_t b)
{
	if (a >= 0 && b >= 0)
		return a * b;
	if (a >= 0) {
		int64_t t = a;
		a = b;
		b = t;
	}
	if (b == 1)
		return a;
	if (b == 0)
		return 0;
	if (b > 0) { /* (x * c1) * c2 */
		const ir_dimexpr *e = ir_dim_expr(g, a);
		if (e && e->op == IR_DMUL && e->b >= 0)
			return dim_intern(g, IR_DMUL, e->a, e->b * b, NULL);
	} else if (a < b) {
		int64_t t = a;
		a = b;
		b = t;
	}
	return dim_intern(g, IR_DMUL, a, b, NULL);
}

int64_t ir_dim_div(kiln_graph *g, int64_t a, int64_t b)
{
	if (b <= 0)
		return 0;
	if (a >= 0)
		return a / b;
	if (b == 1)
		return a;
	const ir_dimexpr *e = ir_dim_expr(g, a);
	if (e && e->op == IR_DMUL && e->b >= 0 && e->b % b == 0) /* (x*c1)/c2 */
		return ir_dim_mul(g, e->a, e->b / b);
	return dim_intern(g, IR_DDIV, a, b, NULL);
}

static int dim_prec(const kiln_graph *g, int64_t d)
{
	const ir_dimexpr *e = ir_dim_expr(g, d);
	return !e || e->op == IR_DSYM ? 3 : e->op == IR_DADD ? 1 : 2;
}

/* Prints with the fewest parentheses that parse back to the same tree
 * (left-associative + and *, /): a left operand needs them below the
 * operator's precedence, a right operand at or below it. */
static int dim_fmt(const kiln_graph *g, int64_t d, char *buf, size_t size)
{
	const ir_dimexpr *e = ir_dim_expr(g, d);
	if (!e)
		return snprintf(buf, size, "%lld", (long long)d);
	if (e->op == IR_DSYM)
		return snprintf(buf, size, "%s", e->sym);
	static const char opch[] = {[IR_DADD] = '+', [IR_DMUL] = '*', [IR_DDIV] = '/'};
	int p = e->op == IR_DADD ? 1 : 2;
	bool lp = dim_prec(g, e->a) < p, rp = dim_prec(g, e->b) <= p;
	size_t n = 0;
	n += snprintf(buf + n, n < size ? size - n : 0, "%s", lp ? "(" : "");
	n += dim_fmt(g, e->a, buf + (n < size ? n : size), n < size ? size - n : 0);
	n += snprintf(buf + (n < size ? n : size), n < size ? size - n : 0, "%s%c%s",
	              lp ? ")" : "", opch[e->op], rp ? "(" : "");
	n += dim_fmt(g, e->b, buf + (n < size ? n : size), n < size ? size - n : 0);
	n += snprintf(buf + (n < size ? n : size), n < size ? size - n : 0, "%s", rp ? ")" : "");
	return (int)n;
}

char *ir_dim_str(const kiln_graph *g, int64_t d, char *buf, size_t size)
{
	if (size)
		buf[0] = 0;
	dim_fmt(g, d, buf, size);
	return buf;
}

int64_t ir_dim_eval(const kiln_graph *g, int64_t d, const int64_t *symval)
{
	const ir_dimexpr *e = ir_dim_expr(g, d);
	if (!e)
		return d;
	if (e->op == IR_DSYM)
		return symval ? symval[e->a] : -1;
	int64_t a = ir_dim_eval(g, e->a, symval), b = ir_dim_eval(g, e->b, symval), r;
	if (a < 0 || b < 0)
		return -1;
	switch (e->op) { /* symbols come from input shapes: overflow is -1, never UB */
	case IR_DADD: return __builtin_add_overflow(a, b, &r) ? -1 : r;
	case IR_DMUL: return __builtin_mul_overflow(a, b, &r) ? -1 : r;
	case IR_DDIV: return b ? a / b : -1;
	default: return -1;
	}
}

char *ir_type_str(const kiln_graph *g, const ir_type *t, char *buf, size_t size)
{
	size_t n = snprintf(buf, size, "%s[", kiln_dtype_name(t->dtype));
	for (int i = 0; i < t->rank && n < size; i++) {
		char d[128];
		n += snprintf(buf + n, size - n, "%s%s", i ? "," : "", ir_dim_str(g, t->dim[i], d, sizeof d));
	}
	if (n < size)
		snprintf(buf + n, size - n, "]");
	return buf;
}

bool ir_type_eq(const ir_type *a, const ir_type *b)
{
	if (a->dtype != b->dtype || a->rank != b->rank)
		return false;
	for (int i = 0; i < a->rank; i++)
		if (a->dim[i] != b->dim[i])
			return false;
	return true;
}

bool ir_type_concrete(const ir_type *t)
{
	for (int i = 0; i < t->rank; i++)
		if (t->dim[i] < 0)
			return false;
	return true;
}

/* ---- tensors in the arena ---------------------------------------------- */

kiln_tensor *ir_tensor_new(kiln_graph *g, kiln_dtype dt, int rank, const int64_t *shape)
{
	if (rank < 0 || rank > KILN_MAX_RANK || kiln_dtype_size(dt) == 0)
		return NULL;
	uint64_t n = 1;
	for (int i = 0; i < rank; i++) {
		if (shape[i] < 0 || (shape[i] && n > IR_MAX_NUMEL / (uint64_t)shape[i]))
			return NULL;
		n *= (uint64_t)shape[i];
	}
	kiln_tensor *t = ir_alloc(g->arena, sizeof *t);
	if (!t)
		return NULL;
	t->dtype = dt;
	t->rank = rank;
	for (int i = 0; i < rank; i++)
		t->shape[i] = shape[i];
	t->data = ir_alloc(g->arena, n * kiln_dtype_size(dt));
	return t->data ? t : NULL;
}

kiln_tensor *ir_tensor_copy(kiln_graph *g, const kiln_tensor *src)
{
	kiln_tensor *t = ir_tensor_new(g, src->dtype, src->rank, src->shape);
	if (t)
		memcpy(t->data, src->data, kiln_tensor_nbytes(src));
	return t;
}

/* ---- values ---------------------------------------------------------- */

ir_value *ir_val(const kiln_graph *g, uint32_t id)
{
	return id < g->nval ? g->val[id] : NULL;
}

uint32_t ir_value_new(kiln_graph *g, ir_value_kind kind, const ir_type *t, const char *name)
{
	if (!grow((void **)&g->val, &g->capval, g->nval + 1, sizeof *g->val))
		return 0;
	ir_value *v = ir_alloc(g->arena, sizeof *v);
	if (!v)
		return 0;
	v->id = g->nval;
	v->kind = kind;
	if (t)
		v->type = *t;
	v->name = name ? ir_intern(g, name) : NULL;
	g->val[g->nval] = v;
	return g->nval++;
}

uint32_t ir_input_new(kiln_graph *g, const char *name, const ir_type *t)
{
	uint32_t id = ir_value_new(g, IR_V_INPUT, t, name);
	if (!id || !grow((void **)&g->input, &g->capinput, g->ninput + 1, sizeof *g->input))
		return 0;
	g->input[g->ninput++] = id;
	return id;
}

uint32_t ir_param_new(kiln_graph *g, const char *name, const kiln_tensor *data, bool trainable)
{
	ir_type t = {data->dtype, data->rank, {0}};
	for (int i = 0; i < data->rank; i++)
		t.dim[i] = data->shape[i];
	uint32_t id = ir_value_new(g, IR_V_PARAM, &t, name);
	if (!id)
		return 0;
	ir_value *v = g->val[id];
	v->trainable = trainable;
	v->data = ir_tensor_copy(g, data);
	return v->data ? id : 0;
}

kiln_status ir_output_add(kiln_graph *g, uint32_t v, const char *name)
{
	if (!grow((void **)&g->output, &g->capoutput, g->noutput + 1, sizeof *g->output))
		return KILN_ENOMEM;
	g->output[g->noutput++] = v;
	if (name && !g->val[v]->name)
		g->val[v]->name = ir_intern(g, name);
	return KILN_OK;
}

static bool use_add(kiln_graph *g, ir_value *v, ir_node *n)
{
	if (v->nuse == v->capuse) {
		uint32_t nc = v->capuse ? v->capuse * 2 : 4;
		ir_node **u = ir_alloc(g->arena, nc * sizeof *u);
		if (!u)
			return false;
		if (v->nuse)
			memcpy(u, v->uses, v->nuse * sizeof *u);
		v->uses = u;
		v->capuse = nc;
	}
	v->uses[v->nuse++] = n;
	return true;
}

static void use_del(ir_value *v, ir_node *n)
{
	for (uint32_t i = 0; i < v->nuse; i++)
		if (v->uses[i] == n) {
			v->uses[i] = v->uses[--v->nuse];
			return;
		}
}

/* ---- nodes ------------------------------------------------------------ */

ir_node *ir_node_new(kiln_graph *g, kiln_op op, uint32_t nin, const uint32_t *in,
                     uint32_t nout, kiln_loc loc)
{
	if (op >= KILN_OP_COUNT) {
		ir_errorf_at(g, loc, KILN_EINVAL, "unknown op %d", (int)op);
		return NULL;
	}
	for (uint32_t i = 0; i < nin; i++)
		if (!in[i] || in[i] >= g->nval || g->val[in[i]]->kind == IR_V_NONE) {
			ir_errorf_at(g, loc, KILN_EINVAL, "%s: input %u is not a value of this graph",
			             ir_op(op)->onnx, i);
			return NULL;
		}
	ir_node *n = ir_alloc(g->arena, sizeof *n);
	if (!n || !grow((void **)&g->node, &g->capnode, g->nnode + 1, sizeof *g->node))
		goto oom;
	n->op = op;
	n->loc = loc;
	n->nin = nin;
	n->nout = nout;
	n->in = ir_alloc(g->arena, (nin + 1) * sizeof *n->in);
	n->out = ir_alloc(g->arena, (nout + 1) * sizeof *n->out);
	if (!n->in || !n->out)
		goto oom;
	for (uint32_t i = 0; i < nin; i++) {
		n->in[i] = in[i];
		if (!use_add(g, g->val[in[i]], n))
			goto oom;
	}
	for (uint32_t i = 0; i < nout; i++) {
		uint32_t id = ir_value_new(g, IR_V_NODE, NULL, NULL);
		if (!id)
			goto oom;
		g->val[id]->def = n;
		g->val[id]->def_out = (int)i;
		n->out[i] = id;
	}
	n->idx = g->nnode;
	g->node[g->nnode++] = n;
	return n;
oom:
	ir_errorf_at(g, loc, KILN_ENOMEM, "out of memory adding %s", ir_op(op)->onnx);
	return NULL;
}

void ir_set_input(kiln_graph *g, ir_node *n, uint32_t i, uint32_t v)
{
	if (i >= n->nin || n->in[i] == v)
		return;
	use_del(g->val[n->in[i]], n);
	n->in[i] = v;
	if (!use_add(g, g->val[v], n))
		ir_errorf(g, n, KILN_ENOMEM, "out of memory");
}

void ir_replace_uses(kiln_graph *g, uint32_t from, uint32_t to)
{
	if (from == to)
		return;
	ir_value *f = g->val[from];
	while (f->nuse) {
		ir_node *n = f->uses[0];
		for (uint32_t i = 0; i < n->nin; i++)
			if (n->in[i] == from)
				ir_set_input(g, n, i, to);
	}
	for (uint32_t i = 0; i < g->noutput; i++)
		if (g->output[i] == from) {
			g->output[i] = to;
			/* keep the graph output's public name on the replacement */
			if (f->name && !g->val[to]->name)
				g->val[to]->name = f->name;
		}
}

void ir_node_remove(kiln_graph *g, ir_node *n)
{
	if (n->dead)
		return;
	for (uint32_t i = 0; i < n->nin; i++)
		use_del(g->val[n->in[i]], n);
	n->dead = true;
	for (uint32_t i = 0; i < n->nout; i++)
		g->val[n->out[i]]->kind = IR_V_NONE;
}

kiln_status ir_compact(kiln_graph *g)
{
	uint32_t k = 0;
	for (uint32_t i = 0; i < g->nnode; i++)
		if (!g->node[i]->dead) {
			g->node[k] = g->node[i];
			g->node[k]->idx = k;
			k++;
		}
	g->nnode = k;
	/* renumber live values; remap[] is scratch in a malloc'd buffer */
	uint32_t *remap = calloc(g->nval, sizeof *remap);
	if (!remap)
		return ir_errorf(g, NULL, KILN_ENOMEM, "out of memory compacting graph");
	uint32_t nv = 1;
	for (uint32_t i = 1; i < g->nval; i++) {
		ir_value *v = g->val[i];
		if (v->kind == IR_V_NONE)
			continue;
		remap[i] = nv;
		v->id = nv;
		g->val[nv++] = v;
	}
	g->nval = nv;
	for (uint32_t i = 0; i < g->nnode; i++) {
		ir_node *n = g->node[i];
		for (uint32_t j = 0; j < n->nin; j++)
			n->in[j] = remap[n->in[j]];
		for (uint32_t j = 0; j < n->nout; j++)
			n->out[j] = remap[n->out[j]];
	}
	for (uint32_t i = 0; i < g->ninput; i++)
		g->input[i] = remap[g->input[i]];
	for (uint32_t i = 0; i < g->noutput; i++)
		g->output[i] = remap[g->output[i]];
	free(remap);
	return KILN_OK;
}

/* min-heap of schedule positions: the earliest ready node goes first */
static void heap_push(uint32_t *h, uint32_t *n, uint32_t v)
{
	uint32_t i = (*n)++;
	for (; i && h[(i - 1) / 2] > v; i = (i - 1) / 2)
		h[i] = h[(i - 1) / 2];
	h[i] = v;
}

static uint32_t heap_pop(uint32_t *h, uint32_t *n)
{
	uint32_t top = h[0], last = h[--*n], i = 0;
	for (;;) {
		uint32_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && h[c + 1] < h[c])
			c++;
		if (last <= h[c])
			break;
		h[i] = h[c];
		i = c;
	}
	h[i] = last;
	return top;
}

kiln_status ir_toposort(kiln_graph *g)
{
	/* Kahn's algorithm taking the earliest ready node first, so an already
	 * ordered schedule is left unchanged; O(E log V). */
	uint32_t n = g->nnode, nord = 0, nready = 0;
	uint32_t *pending = calloc(n + 1, sizeof *pending);
	uint32_t *ready = malloc((n + 1) * sizeof *ready);
	ir_node **order = malloc((n + 1) * sizeof *order);
	if (!pending || !order || !ready) {
		free(pending), free(order), free(ready);
		return ir_errorf(g, NULL, KILN_ENOMEM, "out of memory sorting graph");
	}
	for (uint32_t i = 0; i < n; i++) {
		ir_node *nd = g->node[i];
		/* dead nodes have left their inputs' use lists: they never wait */
		for (uint32_t j = 0; j < nd->nin && !nd->dead; j++) {
			ir_value *v = g->val[nd->in[j]];
			if (v->kind == IR_V_NODE && v->def && !v->def->dead)
				pending[i]++;
		}
		if (!pending[i])
			heap_push(ready, &nready, i);
	}
	while (nready) {
		ir_node *nd = g->node[heap_pop(ready, &nready)];
		order[nord++] = nd;
		for (uint32_t o = 0; o < nd->nout; o++) {
			ir_value *v = g->val[nd->out[o]];
			for (uint32_t u = 0; u < v->nuse; u++) {
				uint32_t k = v->uses[u]->idx;
				if (k < n && g->node[k] == v->uses[u] && --pending[k] == 0)
					heap_push(ready, &nready, k);
			}
		}
	}
	kiln_status st = KILN_OK;
	if (nord < n)
		st = ir_errorf(g, NULL, KILN_EVERIFY, "graph has a cycle");
	else
		for (uint32_t i = 0; i < n; i++) {
			g->node[i] = order[i];
			order[i]->idx = i;
		}
	free(pending), free(order), free(ready);
	return st;
}

/* ---- attributes -------------------------------------------------------- */

static ir_attr *attr_slot(kiln_graph *g, ir_node *n, const char *name)
{
	const char *s = ir_intern(g, name);
	if (!s)
		return NULL;
	for (uint32_t i = 0; i < n->nattr; i++)
		if (n->attr[i].name == s)
			return &n->attr[i];
	if (n->nattr == n->capattr) {
		uint32_t nc = n->capattr ? n->capattr * 2 : 4;
		ir_attr *a = ir_alloc(g->arena, nc * sizeof *a);
		if (!a)
			return NULL;
		if (n->nattr)
			memcpy(a, n->attr, n->nattr * sizeof *a);
		n->attr = a;
		n->capattr = nc;
	}
	ir_attr *a = &n->attr[n->nattr++];
	memset(a, 0, sizeof *a);
	a->name = s;
	return a;
}

#define ATTR_OR_OOM(a)                                                            \
	if (!(a))                                                                 \
		return ir_errorf(g, n, KILN_ENOMEM, "out of memory setting attribute")

kiln_status ir_attr_set_int(kiln_graph *g, ir_node *n, const char *name, int64_t v)
{
	ir_attr *a = attr_slot(g, n, name);
	ATTR_OR_OOM(a);
	a->kind = IR_A_INT;
	a->u.i = v;
	return KILN_OK;
}

kiln_status ir_attr_set_dtype(kiln_graph *g, ir_node *n, const char *name, kiln_dtype dt)
{
	ir_attr *a = attr_slot(g, n, name);
	ATTR_OR_OOM(a);
	a->kind = IR_A_DTYPE;
	a->u.i = dt;
	return KILN_OK;
}

kiln_status ir_attr_set_float(kiln_graph *g, ir_node *n, const char *name, double v)
{
	ir_attr *a = attr_slot(g, n, name);
	ATTR_OR_OOM(a);
	a->kind = IR_A_FLOAT;
	a->u.f = v;
	return KILN_OK;
}

kiln_status ir_attr_set_ints(kiln_graph *g, ir_node *n, const char *name, uint32_t cnt,
                             const int64_t *v)
{
	ir_attr *a = attr_slot(g, n, name);
	ATTR_OR_OOM(a);
	int64_t *p = ir_alloc(g->arena, (cnt + 1) * sizeof *p);
	ATTR_OR_OOM(p);
	if (cnt)
		memcpy(p, v, cnt * sizeof *p);
	a->kind = IR_A_INTS;
	a->n = cnt;
	a->u.ints = p;
	a->dims = 0;
	return KILN_OK;
}

kiln_status ir_attr_set_dims(kiln_graph *g, ir_node *n, const char *name, uint32_t cnt,
                             const int64_t *v, uint64_t dims)
{
	uint64_t keep = 0;
	for (uint32_t i = 0; i < cnt; i++)
		if (i < 64 && (dims >> i & 1) && v[i] < 0)
			keep |= (uint64_t)1 << i;
		else if (i >= 64 && dims)
			return ir_errorf(g, n, KILN_EINVAL, "attribute %s: symbolic dims only in the "
			                 "first 64 of %u elements", name, cnt);
	kiln_status st = ir_attr_set_ints(g, n, name, cnt, v);
	if (st == KILN_OK)
		((ir_attr *)ir_attr_get(n, name))->dims = keep;
	return st;
}

kiln_status ir_attr_set_floats(kiln_graph *g, ir_node *n, const char *name, uint32_t cnt,
                               const double *v)
{
	ir_attr *a = attr_slot(g, n, name);
	ATTR_OR_OOM(a);
	double *p = ir_alloc(g->arena, (cnt + 1) * sizeof *p);
	ATTR_OR_OOM(p);
	if (cnt)
		memcpy(p, v, cnt * sizeof *p);
	a->kind = IR_A_FLOATS;
	a->n = cnt;
	a->u.floats = p;
	return KILN_OK;
}

kiln_status ir_attr_set_string(kiln_graph *g, ir_node *n, const char *name, const char *s)
{
	ir_attr *a = attr_slot(g, n, name);
	ATTR_OR_OOM(a);
	a->kind = IR_A_STRING;
	a->u.s = ir_intern(g, s);
	ATTR_OR_OOM(a->u.s);
	return KILN_OK;
}

kiln_status ir_attr_set_tensor(kiln_graph *g, ir_node *n, const char *name, const kiln_tensor *t)
{
	ir_attr *a = attr_slot(g, n, name);
	ATTR_OR_OOM(a);
	a->kind = IR_A_TENSOR;
	a->u.t = ir_tensor_copy(g, t);
	ATTR_OR_OOM(a->u.t);
	return KILN_OK;
}

const ir_attr *ir_attr_get(const ir_node *n, const char *name)
{
	/* names are interned per graph, but callers pass literals: strcmp */
	for (uint32_t i = 0; i < n->nattr; i++)
		if (strcmp(n->attr[i].name, name) == 0)
			return &n->attr[i];
	return NULL;
}

int64_t ir_attr_int(const ir_node *n, const char *name, int64_t dflt)
{
	const ir_attr *a = ir_attr_get(n, name);
	return a && (a->kind == IR_A_INT || a->kind == IR_A_DTYPE) ? a->u.i : dflt;
}

double ir_attr_float(const ir_node *n, const char *name, double dflt)
{
	const ir_attr *a = ir_attr_get(n, name);
	if (a && a->kind == IR_A_FLOAT)
		return a->u.f;
	if (a && a->kind == IR_A_INT)
		return (double)a->u.i;
	return dflt;
}

const char *ir_attr_str(const ir_node *n, const char *name, const char *dflt)
{
	const ir_attr *a = ir_attr_get(n, name);
	return a && a->kind == IR_A_STRING ? a->u.s : dflt;
}

uint32_t ir_attr_ints(const ir_node *n, const char *name, const int64_t **v)
{
	const ir_attr *a = ir_attr_get(n, name);
	if (!a || a->kind != IR_A_INTS || a->dims) {
		*v = NULL;
		return 0;
	}
	*v = a->u.ints;
	return a->n;
}

uint32_t ir_attr_dims(const ir_node *n, const char *name, const int64_t **v, uint64_t *dims)
{
	const ir_attr *a = ir_attr_get(n, name);
	*dims = a && a->kind == IR_A_INTS ? a->dims : 0;
	if (!a || a->kind != IR_A_INTS) {
		*v = NULL;
		return 0;
	}
	*v = a->u.ints;
	return a->n;
}

int ir_op_schema(kiln_op op, ir_attr_schema *out, int max)
{
	const char *p = ir_op(op)->attrs;
	int k = 0;
	while (*p && k < max) {
		while (*p == ' ')
			p++;
		if (!*p)
			break;
		ir_attr_schema s = {0};
		size_t i = 0;
		while (*p && *p != ':' && i + 1 < sizeof s.name)
			s.name[i++] = *p++;
		if (*p == ':')
			p++;
		char kind[4] = {0};
		for (i = 0; *p && *p != ' ' && *p != '=' && *p != '!' && i < 3;)
			kind[i++] = *p++;
		s.kind = !strcmp(kind, "i")    ? IR_A_INT
		         : !strcmp(kind, "f")  ? IR_A_FLOAT
		         : !strcmp(kind, "is") ? IR_A_INTS
		         : !strcmp(kind, "ds") ? IR_A_INTS
		         : !strcmp(kind, "fs") ? IR_A_FLOATS
		         : !strcmp(kind, "s")  ? IR_A_STRING
		         : !strcmp(kind, "t")  ? IR_A_TENSOR
		                               : IR_A_DTYPE;
		s.dims = !strcmp(kind, "ds");
		if (*p == '!') {
			s.required = true;
			p++;
		}
		if (*p == '=') {
			p++;
			s.has_default = true;
			for (i = 0; *p && *p != ' ' && i + 1 < sizeof s.dflt;)
				s.dflt[i++] = *p++;
		}
		out[k++] = s;
		while (*p && *p != ' ')
			p++;
	}
	return k;
}

kiln_op ir_op_from_kir(const char *m)
{
	for (int i = 0; i < KILN_OP_COUNT; i++)
		if (strcmp(ir_op_info_table[i].kir, m) == 0)
			return (kiln_op)i;
	return KILN_OP_COUNT;
}

kiln_op ir_op_from_onnx(const char *m)
{
	for (int i = 0; i < KILN_OP_COUNT; i++)
		if (strcmp(ir_op_info_table[i].onnx, m) == 0)
			return (kiln_op)i;
	return KILN_OP_COUNT;
}

/* ---- public introspection ---------------------------------------------- */

static const ir_value *pubval(const kiln_graph *g, kiln_value v)
{
	return g && v && v < g->nval && g->val[v]->kind != IR_V_NONE ? g->val[v] : NULL;
}

KILN_API kiln_dtype kiln_value_dtype(const kiln_graph *g, kiln_value v)
{
	const ir_value *p = pubval(g, v);
	return p ? p->type.dtype : KILN_DT_INVALID;
}

KILN_API int kiln_value_rank(const kiln_graph *g, kiln_value v)
{
	const ir_value *p = pubval(g, v);
	return p ? p->type.rank : -1;
}

KILN_API int64_t kiln_value_dim(const kiln_graph *g, kiln_value v, int axis)
{
	const ir_value *p = pubval(g, v);
	if (!p)
		return 0;
	if (axis < 0)
		axis += p->type.rank;
	return axis >= 0 && axis < p->type.rank ? p->type.dim[axis] : 0;
}

KILN_API const char *kiln_value_type_str(const kiln_graph *g, kiln_value v, char *buf,
                                         size_t size)
{
	const ir_value *p = pubval(g, v);
	if (!p) {
		snprintf(buf, size, "?");
		return buf;
	}
	return ir_type_str(g, &p->type, buf, size);
}

KILN_API const char *kiln_value_name(const kiln_graph *g, kiln_value v)
{
	const ir_value *p = pubval(g, v);
	return p ? p->name : NULL;
}

KILN_API int kiln_graph_num_inputs(const kiln_graph *g)
{
	return g ? (int)g->ninput : 0;
}

KILN_API int kiln_graph_num_outputs(const kiln_graph *g)
{
	return g ? (int)g->noutput : 0;
}

KILN_API kiln_value kiln_graph_input(const kiln_graph *g, int i)
{
	return g && i >= 0 && (uint32_t)i < g->ninput ? g->input[i] : KILN_NONE;
}

KILN_API kiln_value kiln_graph_output(const kiln_graph *g, int i)
{
	return g && i >= 0 && (uint32_t)i < g->noutput ? g->output[i] : KILN_NONE;
}

KILN_API kiln_value kiln_graph_find_param(const kiln_graph *g, const char *name)
{
	if (!g || !name)
		return KILN_NONE;
	for (uint32_t i = 1; i < g->nval; i++) {
		const ir_value *v = g->val[i];
		if (v->kind == IR_V_PARAM && v->name && strcmp(v->name, name) == 0)
			return i;
	}
	return KILN_NONE;
}

KILN_API kiln_status kiln_graph_load_params(kiln_graph *g, const kiln_tensor_set *s,
                                            kiln_error *err)
{
	if (!g || !s)
		return ir_seterr(err, KILN_EINVAL, "kiln_graph_load_params: null argument");
	/* every tensor must name a parameter of the right type ... */
	for (int i = 0; i < s->count; i++) {
		const kiln_tensor *t = s->items[i].tensor;
		kiln_value id = kiln_graph_find_param(g, s->items[i].name);
		if (!id)
			return ir_seterr(err, KILN_EINVAL,
			                 "load_params: '%s' is not a parameter of graph '%s'",
			                 s->items[i].name, g->name);
		ir_value *v = g->val[id];
		ir_type tt = {t->dtype, t->rank, {0}};
		for (int d = 0; d < t->rank; d++)
			tt.dim[d] = t->shape[d];
		if (!ir_type_eq(&tt, &v->type)) {
			char a[256], b[256];
			return ir_seterr(err, KILN_ESHAPE,
			                 "load_params: '%s' is %s in the file but %s in the graph",
			                 v->name, ir_type_str(g, &tt, a, sizeof a),
			                 ir_type_str(g, &v->type, b, sizeof b));
		}
	}
	/* ... and every parameter must be given */
	for (uint32_t i = 1; i < g->nval; i++) {
		ir_value *v = g->val[i];
		if (v->kind == IR_V_PARAM && v->name && !kiln_tensor_set_get(s, v->name))
			return ir_seterr(err, KILN_EINVAL, "load_params: parameter '%s' missing from the file",
			                 v->name);
	}
	for (int i = 0; i < s->count; i++) {
		ir_value *v = g->val[kiln_graph_find_param(g, s->items[i].name)];
		memcpy(v->data->data, s->items[i].tensor->data, kiln_tensor_nbytes(v->data));
	}
	g->weights_missing = NULL; /* every parameter has its data now */
	return KILN_OK;
}

kiln_status ir_check_weights(const kiln_graph *g, const char *what, kiln_error *err)
{
	if (!g || !g->weights_missing)
		return KILN_OK;
	uint32_t n = 0, first = 0;
	for (uint32_t i = 1; i < g->nval; i++)
		if (g->val[i]->kind == IR_V_PARAM) {
			first = first ? first : i;
			n++;
		}
	return ir_seterr(err, KILN_EINVAL, "cannot %s graph '%s': its weights file '%s' is missing, "
	                 "so its %u parameters ('%s'%s) have no values; put the weights file "
	                 "beside the .kir (kiln_graph_save writes both), or load weights first "
	                 "(kiln_graph_load_params, kiln_graph_load_trained, kiln export --weights)",
	                 what, g->name, g->weights_missing, n,
	                 first && g->val[first]->name ? g->val[first]->name : "?",
	                 n > 1 ? ", ..." : "");
}

KILN_API kiln_tensor_set *kiln_graph_params(const kiln_graph *g)
{
	kiln_tensor_set *s = kiln_tensor_set_new();
	if (!s || !g)
		return s;
	for (uint32_t i = 1; i < g->nval; i++) {
		const ir_value *v = g->val[i];
		if (v->kind == IR_V_PARAM && v->name &&
		    kiln_tensor_set_add(s, v->name, v->data) != KILN_OK) {
			kiln_tensor_set_free(s);
			return NULL;
		}
	}
	return s;
}

/* ---- clone ------------------------------------------------------------ */

kiln_graph *ir_graph_clone(const kiln_graph *g)
{
	kiln_graph *c = kiln_graph_new(g->name);
	if (!c)
		return NULL;
	c->rng = g->rng;
	c->training = g->training;
	if (g->weights_missing && !(c->weights_missing = ir_intern(c, g->weights_missing)))
		goto fail;
	/* symbols and expressions are copied verbatim, so dim ints carry over */
	if (!grow((void **)&c->sym, &c->capsym, g->nsym, sizeof *c->sym) ||
	    !grow((void **)&c->dexp, &c->capdexp, g->ndexp, sizeof *c->dexp))
		goto fail;
	for (uint32_t k = 0; k < g->nsym; k++)
		if (!(c->sym[k] = ir_intern(c, g->sym[k])))
			goto fail;
	c->nsym = g->nsym;
	for (uint32_t k = 0; k < g->ndexp; k++) {
		c->dexp[k] = g->dexp[k];
		if (g->dexp[k].sym && !(c->dexp[k].sym = ir_intern(c, g->dexp[k].sym)))
			goto fail;
	}
	c->ndexp = g->ndexp;
	for (uint32_t i = 1; i < g->nval; i++) {
		const ir_value *v = g->val[i];
		uint32_t id = ir_value_new(c, v->kind, &v->type, v->name);
		if (!id)
			goto fail;
		c->val[id]->trainable = v->trainable;
		if (v->data && !(c->val[id]->data = ir_tensor_copy(c, v->data)))
			goto fail;
	}
	for (uint32_t i = 0; i < g->nnode; i++) {
		const ir_node *n = g->node[i];
		ir_node *m = ir_alloc(c->arena, sizeof *m);
		if (!m || !grow((void **)&c->node, &c->capnode, c->nnode + 1, sizeof *c->node))
			goto fail;
		*m = *n;
		m->idx = c->nnode;
		m->name = n->name ? ir_intern(c, n->name) : NULL;
		/* a .kir file name lives in the source graph's arena: copy it */
		m->loc.file = n->loc.file ? ir_intern(c, n->loc.file) : NULL;
		m->in = ir_alloc(c->arena, (n->nin + 1) * sizeof *m->in);
		m->out = ir_alloc(c->arena, (n->nout + 1) * sizeof *m->out);
		m->attr = NULL;
		m->nattr = m->capattr = 0;
		if (!m->in || !m->out)
			goto fail;
		memcpy(m->in, n->in, n->nin * sizeof *m->in);
		memcpy(m->out, n->out, n->nout * sizeof *m->out);
		for (uint32_t j = 0; j < n->nin; j++)
			if (!use_add(c, c->val[n->in[j]], m))
				goto fail;
		for (uint32_t j = 0; j < n->nout; j++) {
			c->val[n->out[j]]->def = m;
			c->val[n->out[j]]->def_out = (int)j;
		}
		c->node[c->nnode++] = m;
		for (uint32_t j = 0; j < n->nattr; j++) {
			const ir_attr *a = &n->attr[j];
			kiln_status st;
			switch (a->kind) {
			case IR_A_INT: st = ir_attr_set_int(c, m, a->name, a->u.i); break;
			case IR_A_DTYPE: st = ir_attr_set_dtype(c, m, a->name, (kiln_dtype)a->u.i); break;
			case IR_A_FLOAT: st = ir_attr_set_float(c, m, a->name, a->u.f); break;
			case IR_A_INTS: st = ir_attr_set_dims(c, m, a->name, a->n, a->u.ints, a->dims); break;
			case IR_A_FLOATS: st = ir_attr_set_floats(c, m, a->name, a->n, a->u.floats); break;
			case IR_A_STRING: st = ir_attr_set_string(c, m, a->name, a->u.s); break;
			default: st = ir_attr_set_tensor(c, m, a->name, a->u.t); break;
			}
			if (st != KILN_OK)
				goto fail;
		}
	}
	for (uint32_t i = 0; i < g->ninput; i++) {
		if (!grow((void **)&c->input, &c->capinput, c->ninput + 1, sizeof *c->input))
			goto fail;
		c->input[c->ninput++] = g->input[i];
	}
	for (uint32_t i = 0; i < g->noutput; i++)
		if (ir_output_add(c, g->output[i], NULL) != KILN_OK)
			goto fail;
	c->status = g->status;
	memcpy(c->errmsg, g->errmsg, sizeof c->errmsg);
	return c;
fail:
	kiln_graph_free(c);
	return NULL;
}
