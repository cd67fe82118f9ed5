/*
 * kernel.c: builders for the kernel IR (codegen.h) and its textual dump.
 *
 * Every expression and statement lives in the module's arena, so a module
 * is freed at once.  Builders are NULL-safe (a NULL operand, from a failed
 * allocation, gives NULL) so lowering code can nest calls and check once.
 * cg_bin folds integer constants and the identities x*1, x+0, x-0, x/1 and
 * x*0 on integers: index expressions built from strides and sizes then stay
 * as small as a human would write them, which keeps both the dump readable
 * and the backend's address arithmetic short.
 *
 * The dump lists buffers (kind, dtype, shape, element count, slot), then
 * each kernel as nested `for %i0 in 0..N*16 [parallel, vectorize] {` loops
 * with infix index arithmetic; locals (the targets of CG_ASSIGN) print as
 * %t<n>, loop variables as %i<n>.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

/* ---- module ------------------------------------------------------------- */

cg_module *cg_module_new(const kiln_graph *g)
{
	cg_module *m = calloc(1, sizeof *m);
	if (!m)
		return NULL;
	m->arena = ir_arena_new();
	if (!m->arena) {
		free(m);
		return NULL;
	}
	m->g = g;
	m->nsym = g ? ir_dim_nsym(g) : 0;
	return m;
}

void cg_module_free(cg_module *m)
{
	if (!m)
		return;
	ir_arena_free(m->arena);
	free(m->buf);
	free(m->kern);
	free(m->inputs);
	free(m->outputs);
	free(m);
}

static bool grow(void **p, int *cap, int need, size_t elem)
{
	if (need <= *cap)
		return true;
	int nc = *cap ? *cap * 2 : 16;
	while (nc < need)
		nc *= 2;
	void *q = realloc(*p, (size_t)nc * elem);
	if (!q)
		return false;
	*p = q;
	*cap = nc;
	return true;
}

/* -1 on ENOMEM. */
int cg_buf_new(cg_module *m, cg_buf_kind kind, kiln_dtype dt, cg_expr *numel)
{
	if (!grow((void **)&m->buf, &m->capbuf, m->nbuf + 1, sizeof *m->buf))
		return -1;
	cg_buf *b = &m->buf[m->nbuf];
	*b = (cg_buf){.id = m->nbuf, .kind = kind, .dt = dt, .numel = numel, .alias = -1,
	              .io_index = -1, .slot = -1, .first = -1, .last = -1, .chunk = -1};
	b->type.dtype = dt;
	return m->nbuf++;
}

int cg_buf_block(const cg_module *m, int b)
{
	if (b < 0 || b >= m->nbuf)
		return 0;
	return m->buf[m->buf[b].alias >= 0 ? m->buf[b].alias : b].block;
}

cg_kernel *cg_kernel_new(cg_module *m, const char *name, uint32_t node)
{
	if (!grow((void **)&m->kern, &m->capkern, m->nkern + 1, sizeof *m->kern))
		return NULL;
	cg_kernel *k = &m->kern[m->nkern++];
	*k = (cg_kernel){.name = ir_arena_strdup(m->arena, name), .node = node,
	                 .body = cg_block(m), .final_buf = -1, .act_buf = -1, .alt = -1};
	return k->name && k->body ? k : NULL;
}

kiln_status cg_module_describe(cg_module *m)
{
	const kiln_graph *g = m->g;
	if (!g)
		return KILN_OK;
	const char *gn = kiln_graph_name(g);
	m->name = gn ? ir_arena_strdup(m->arena, gn) : NULL;
	if (m->nsym > 0) {
		m->symname = ir_alloc(m->arena, (size_t)m->nsym * sizeof *m->symname);
		if (!m->symname)
			return KILN_ENOMEM;
		for (int k = 0; k < m->nsym; k++) {
			const char *s = ir_dim_symname(g, k);
			if (!(m->symname[k] = ir_arena_strdup(m->arena, s ? s : "")))
				return KILN_ENOMEM;
		}
	}
	for (int b = 0; b < m->nbuf; b++) {
		cg_buf *bf = &m->buf[b];
		for (int d = 0; d < bf->type.rank; d++)
			if (!(bf->dim[d] = cg_dim(m, bf->type.dim[d])))
				return KILN_ENOMEM;
	}
	for (int i = 0; i < m->ninputs + m->noutputs; i++) {
		int b = i < m->ninputs ? m->inputs[i] : m->outputs[i - m->ninputs];
		char ty[256];
		if (b < 0 || b >= m->nbuf)
			continue;
		ir_type_str(g, &m->buf[b].type, ty, sizeof ty);
		if (!(m->buf[b].type_text = ir_arena_strdup(m->arena, ty)))
			return KILN_ENOMEM;
	}
	for (int k = 0; k < m->nkern; k++) {
		char nd[160] = "";
		if (m->kern[k].node < g->nnode && ir_node_desc(g->node[m->kern[k].node], nd, sizeof nd)
		    && nd[0] && !(m->kern[k].origin = ir_arena_strdup(m->arena, nd)))
			return KILN_ENOMEM;
	}
	return KILN_OK;
}

int cg_var_new(cg_kernel *k)
{
	return k->nvar++;
}

/* ---- expressions -------------------------------------------------------- */

static cg_expr *expr(cg_module *m, cg_expr_kind kind, kiln_dtype dt)
{
	cg_expr *e = ir_alloc(m->arena, sizeof *e);
	if (e)
		e->kind = kind, e->dt = dt;
	return e;
}

cg_expr *cg_int(cg_module *m, int64_t v)
{
	cg_expr *e = expr(m, CG_CONST, KILN_I64);
	if (e)
		e->i = v;
	return e;
}

cg_expr *cg_const(cg_module *m, kiln_dtype dt, double v)
{
	cg_expr *e = expr(m, CG_CONST, dt);
	if (!e)
		return NULL;
	if (kiln_dtype_is_float(dt))
		e->f = v;
	else
		e->i = dt == KILN_BOOL ? v != 0 : (int64_t)v;
	return e;
}

cg_expr *cg_var(cg_module *m, int var, kiln_dtype dt)
{
	cg_expr *e = expr(m, CG_VAR, dt);
	if (e)
		e->var = var;
	return e;
}

cg_expr *cg_size(cg_module *m, int sym)
{
	cg_expr *e = expr(m, CG_SIZE, KILN_I64);
	if (e)
		e->var = sym;
	return e;
}

cg_expr *cg_load(cg_module *m, int buf, cg_expr *index)
{
	if (!index || buf < 0 || buf >= m->nbuf)
		return NULL;
	cg_expr *e = expr(m, CG_LOAD, m->buf[buf].dt);
	if (e)
		e->buf = buf, e->a = index;
	return e;
}

cg_expr *cg_un(cg_module *m, cg_unop op, cg_expr *a)
{
	if (!a)
		return NULL;
	cg_expr *e = expr(m, CG_UN, op == CG_NOT ? KILN_BOOL : a->dt);
	if (e)
		e->op = op, e->a = a;
	return e;
}

static bool is_int(const cg_expr *e, int64_t v)
{
	return e->kind == CG_CONST && !kiln_dtype_is_float(e->dt) && e->i == v;
}

/* Integer constant folding; wraps like the two's complement backends. */
static bool fold(cg_binop op, int64_t a, int64_t b, int64_t *r)
{
	uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
	switch (op) {
	case CG_ADD: *r = (int64_t)(ua + ub); return true;
	case CG_SUB: *r = (int64_t)(ua - ub); return true;
	case CG_MUL: *r = (int64_t)(ua * ub); return true;
	case CG_DIV: if (b == 0 || b == -1) return false; *r = a / b; return true;
	case CG_REM: if (b == 0 || b == -1) return false; *r = a % b; return true;
	case CG_MIN: *r = a < b ? a : b; return true;
	case CG_MAX: *r = a > b ? a : b; return true;
	case CG_XOR: *r = (int64_t)(ua ^ ub); return true;
	case CG_SHR: if (b < 0 || b > 63) return false; *r = (int64_t)(ua >> b); return true;
	default: return false;
	}
}

/* 1/y as a float expression: y, else NULL */
static cg_expr *recip_of(const cg_expr *e)
{
	return e->kind == CG_BIN && e->op == CG_DIV && e->a->kind == CG_CONST &&
	       kiln_dtype_is_float(e->a->dt) && e->a->f == 1.0 ? e->b : NULL;
}

/* x+0, x-0, x*1, x/1 and (integers only, no NaN to keep) x*0.  Floats:
 * x * (1/y) is x/y, one correctly rounded division instead of a division
 * and a product (SiLU, x * sigmoid(x), is such a product). */
static cg_expr *simplify(cg_module *m, cg_binop op, cg_expr *a, cg_expr *b)
{
	if (kiln_dtype_is_float(a->dt)) {
		cg_expr *rb = op == CG_MUL ? recip_of(b) : NULL, *ra = op == CG_MUL ? recip_of(a) : NULL;
		return rb ? cg_bin(m, CG_DIV, a, rb) : ra ? cg_bin(m, CG_DIV, b, ra) : NULL;
	}
	if ((op == CG_ADD || op == CG_SUB) && is_int(b, 0))
		return a;
	if (op == CG_ADD && is_int(a, 0))
		return b;
	if ((op == CG_MUL || op == CG_DIV) && is_int(b, 1))
		return a;
	if (op == CG_MUL && is_int(a, 1))
		return b;
	if (op == CG_MUL && (is_int(a, 0) || is_int(b, 0)) && a->dt == KILN_I64)
		return cg_int(m, 0);
	if (op == CG_REM && is_int(b, 1) && a->dt == KILN_I64)
		return cg_int(m, 0);
	return NULL;
}

cg_expr *cg_bin(cg_module *m, cg_binop op, cg_expr *a, cg_expr *b)
{
	if (!a || !b)
		return NULL;
	bool cmp = op >= CG_EQ && op <= CG_GE;
	int64_t r;
	if (a->kind == CG_CONST && b->kind == CG_CONST && a->dt == KILN_I64 && b->dt == KILN_I64 &&
	    fold(op, a->i, b->i, &r))
		return cg_int(m, r);
	if ((op == CG_AND || op == CG_OR) && (a->kind == CG_CONST || b->kind == CG_CONST)) {
		cg_expr *k = a->kind == CG_CONST ? a : b, *other = k == a ? b : a;
		return (op == CG_AND) == (k->i != 0) ? other : k; /* true && x, false || x: x */
	}
	cg_expr *s = cmp ? NULL : simplify(m, op, a, b);
	if (s)
		return s;
	cg_expr *e = expr(m, CG_BIN, cmp ? KILN_BOOL : a->dt);
	if (e)
		e->op = op, e->a = a, e->b = b;
	return e;
}

cg_expr *cg_select(cg_module *m, cg_expr *c, cg_expr *a, cg_expr *b)
{
	if (!c || !a || !b)
		return NULL;
	if (c->kind == CG_CONST)
		return c->i ? a : b;
	cg_expr *e = expr(m, CG_SELECT, a->dt);
	if (e)
		e->a = c, e->b = a, e->c = b;
	return e;
}

cg_expr *cg_cast(cg_module *m, cg_expr *a, kiln_dtype dt)
{
	if (!a || a->dt == dt)
		return a;
	if (a->kind == CG_CONST && !kiln_dtype_is_float(a->dt) && dt == KILN_I64)
		return cg_int(m, a->i);
	cg_expr *e = expr(m, CG_CAST, dt);
	if (e)
		e->a = a;
	return e;
}

cg_expr *cg_dim(cg_module *m, int64_t dim)
{
	const ir_dimexpr *d = m->g ? ir_dim_expr(m->g, dim) : NULL;
	if (!d)
		return cg_int(m, dim);
	switch (d->op) {
	case IR_DSYM: return cg_size(m, (int)d->a);
	case IR_DADD: return cg_bin(m, CG_ADD, cg_dim(m, d->a), cg_dim(m, d->b));
	case IR_DMUL: return cg_bin(m, CG_MUL, cg_dim(m, d->a), cg_dim(m, d->b));
	case IR_DDIV: return cg_bin(m, CG_DIV, cg_dim(m, d->a), cg_dim(m, d->b)); /* sizes >= 0 */
	}
	return NULL;
}

int64_t cg_expr_int(const cg_expr *e, const int64_t *sym)
{
	if (!e)
		return -1;
	switch (e->kind) {
	case CG_CONST: return kiln_dtype_is_float(e->dt) ? -1 : e->i;
	case CG_SIZE: return sym ? sym[e->var] : 1;
	case CG_BIN: {
		int64_t a = cg_expr_int(e->a, sym), b = cg_expr_int(e->b, sym), r;
		if (a < 0 || b < 0 || !fold(e->op, a, b, &r))
			return -1;
		return r;
	}
	default: return -1;
	}
}

/* ---- statements --------------------------------------------------------- */

static cg_stmt *stmt(cg_module *m, cg_stmt_kind kind)
{
	cg_stmt *s = ir_alloc(m->arena, sizeof *s);
	if (s)
		s->kind = kind;
	return s;
}

cg_stmt *cg_block(cg_module *m)
{
	return stmt(m, CG_BLOCK);
}

/* The items array grows in the arena; the old one is simply abandoned. */
void cg_append(cg_module *m, cg_stmt *block, cg_stmt *s)
{
	if (!block || !s)
		return;
	if (block->n == block->cap) {
		int nc = block->cap ? block->cap * 2 : 4;
		cg_stmt **items = ir_alloc(m->arena, nc * sizeof *items);
		if (!items)
			return;
		if (block->n)
			memcpy(items, block->items, block->n * sizeof *items);
		block->items = items;
		block->cap = nc;
	}
	block->items[block->n++] = s;
}

cg_stmt *cg_for(cg_module *m, int var, cg_expr *extent, uint32_t hints, cg_stmt *body)
{
	if (!extent || !body)
		return NULL;
	cg_stmt *s = stmt(m, CG_FOR);
	if (s)
		s->var = var, s->extent = extent, s->hints = hints, s->body = body;
	return s;
}

cg_stmt *cg_store(cg_module *m, int buf, cg_expr *index, cg_expr *value)
{
	if (!index || !value)
		return NULL;
	cg_stmt *s = stmt(m, CG_STORE);
	if (s)
		s->buf = buf, s->index = index, s->value = value;
	return s;
}

cg_stmt *cg_assign(cg_module *m, int var, kiln_dtype dt, cg_expr *value)
{
	if (!value)
		return NULL;
	cg_stmt *s = stmt(m, CG_ASSIGN);
	if (s)
		s->var = var, s->dt = dt, s->value = value;
	return s;
}

cg_stmt *cg_if(cg_module *m, cg_expr *cond, cg_stmt *then_s, cg_stmt *else_s)
{
	if (!cond || !then_s)
		return NULL;
	cg_stmt *s = stmt(m, CG_IF);
	if (s)
		s->cond = cond, s->then_s = then_s, s->else_s = else_s;
	return s;
}

cg_stmt *cg_gemm_stmt(cg_module *m, const cg_gemm *gm)
{
	cg_gemm *g = ir_alloc(m->arena, sizeof *g);
	cg_stmt *s = stmt(m, CG_GEMM);
	if (!g || !s || !gm->M || !gm->N || !gm->K || !gm->batch)
		return NULL;
	*g = *gm;
	kiln_dtype *dt[3] = {&g->a_dt, &g->b_dt, &g->c_dt};
	int bufs[3] = {g->a, g->b, g->c};
	for (int i = 0; i < 3; i++)
		if (*dt[i] == KILN_DT_INVALID && bufs[i] >= 0 && bufs[i] < m->nbuf)
			*dt[i] = m->buf[bufs[i]].dt;
	if (g->acc_dt == KILN_DT_INVALID)
		g->acc_dt = g->c_dt;
	s->gemm = g;
	return s;
}

cg_stmt *cg_transpose_stmt(cg_module *m, const cg_transpose *t)
{
	cg_transpose *c = ir_alloc(m->arena, sizeof *c);
	cg_stmt *s = stmt(m, CG_TRANSPOSE);
	if (!c || !s || !t->rows || !t->cols || !t->src_off || !t->src_rs || !t->dst_off ||
	    !t->dst_rs)
		return NULL;
	*c = *t;
	s->tr = c;
	return s;
}

static bool is_const(const cg_expr *e, int64_t v)
{
	return e && e->kind == CG_CONST && e->i == v;
}

bool cg_gemm_is_int8(const cg_gemm *g)
{
	bool a8 = g->a_dt == KILN_U8 || g->a_dt == KILN_I8, b8 = g->b_dt == KILN_U8 || g->b_dt == KILN_I8;
	bool c = g->c_dt == KILN_U8 || g->c_dt == KILN_I8 || g->c_dt == KILN_I32 || g->c_dt == KILN_F32;
	return a8 && b8 && c && g->acc_dt == KILN_I32 && is_const(g->a_cs, 1) &&
	       is_const(g->b_cs, 1) && g->alpha == 1 && g->beta == 0 && !g->has_residual &&
	       (g->act == CG_ACT_NONE || g->act == CG_ACT_RELU || g->act == CG_ACT_CLIP) &&
	       g->a_zero.axis != CG_AXIS_COL && g->b_zero.axis != CG_AXIS_ROW &&
	       (g->c_zero.axis == CG_AXIS_NONE || g->c_zero.axis == CG_AXIS_ALL) &&
	       g->K && g->K->kind == CG_CONST && g->K->i >= 0 && g->K->i <= CG_QGEMM_MAX_K;
}

bool cg_gemm_is_f32(const cg_gemm *g)
{
	return g->a_dt == KILN_F32 && g->b_dt == KILN_F32 && g->c_dt == KILN_F32 &&
	       g->acc_dt == KILN_F32 && !g->scale.axis && !g->a_zero.axis && !g->b_zero.axis &&
	       !g->c_zero.axis && !g->has_b_rows && (!g->has_residual || g->res_first) &&
	       (g->act == CG_ACT_NONE || g->act == CG_ACT_RELU || g->act == CG_ACT_CLIP);
}

cg_stmt *cg_check(cg_module *m, const char *what, cg_expr *value, cg_expr *lo, cg_expr *hi)
{
	if (!value || !lo != !hi)
		return NULL;
	cg_stmt *s = stmt(m, CG_CHECK);
	if (s && !(s->what = ir_arena_strdup(m->arena, what ? what : "index")))
		return NULL;
	if (s)
		s->value = value, s->lo = lo, s->hi = hi;
	return s;
}

/* ---- printing ----------------------------------------------------------- */

static const char *const unop_name[CG_UNOP_COUNT] = {
	[CG_NEG] = "neg", [CG_ABS] = "abs", [CG_EXP] = "exp", [CG_LOG] = "log",
	[CG_SQRT] = "sqrt", [CG_TANH] = "tanh", [CG_ERF] = "erf", [CG_SIN] = "sin",
	[CG_COS] = "cos", [CG_FLOOR] = "floor", [CG_CEIL] = "ceil", [CG_ROUND] = "round", [CG_NOT] = "not",
	[CG_ATAN] = "atan", [CG_ASIN] = "asin", [CG_ACOS] = "acos", [CG_SIGMOID] = "sigmoid",
};

/* Infix operators with their precedence; the rest print as calls. */
static const struct {
	const char *s;
	int prec;
} binop_name[CG_BINOP_COUNT] = {
	[CG_ADD] = {" + ", 4}, [CG_SUB] = {" - ", 4}, [CG_MUL] = {"*", 5}, [CG_DIV] = {"/", 5},
	[CG_REM] = {" % ", 5}, [CG_MIN] = {"min", 0}, [CG_MAX] = {"max", 0},
	[CG_POW] = {"pow", 0}, [CG_EQ] = {" == ", 2}, [CG_NE] = {" != ", 2},
	[CG_LT] = {" < ", 3}, [CG_LE] = {" <= ", 3}, [CG_GT] = {" > ", 3}, [CG_GE] = {" >= ", 3},
	[CG_AND] = {" && ", 1}, [CG_OR] = {" || ", 1}, [CG_XOR] = {"xor", 0},
	[CG_SHR] = {"lshr", 0},
};

typedef struct printer {
	const cg_module *m;
	FILE *out;
	const bool *local; /* var -> is a CG_ASSIGN target */
	int *canon;        /* key mode (cg_kernel_key): root -> index, or NULL */
	int *ncanon;
} printer;

/* A buffer reference: "buf<id>", or in key mode its root's index in order
 * of first appearance and its dtype ("B0:f32"). */
static void pref(const printer *p, int b)
{
	if (!p->canon || b < 0 || b >= p->m->nbuf) {
		fprintf(p->out, "buf%d", b);
		return;
	}
	int r = p->m->buf[b].alias >= 0 ? p->m->buf[b].alias : b;
	if (p->canon[r] < 0)
		p->canon[r] = (*p->ncanon)++;
	fprintf(p->out, "B%d:%s", p->canon[r], kiln_dtype_name(p->m->buf[b].dt));
}

static void pexpr(const printer *p, const cg_expr *e, int prec);

static void pconst(const printer *p, const cg_expr *e)
{
	if (!kiln_dtype_is_float(e->dt)) {
		if (e->dt == KILN_BOOL)
			fputs(e->i ? "true" : "false", p->out);
		else
			fprintf(p->out, "%" PRId64, e->i);
		return;
	}
	if (isinf(e->f))
		fputs(e->f < 0 ? "-inf" : "inf", p->out);
	else if (e->f == floor(e->f) && fabs(e->f) < 1e15)
		fprintf(p->out, "%.1f", e->f);
	else
		fprintf(p->out, "%.9g", e->f);
}

static void pbin(const printer *p, const cg_expr *e, int prec)
{
	int my = binop_name[e->op].prec;
	if (!my) {
		fprintf(p->out, "%s(", binop_name[e->op].s);
		pexpr(p, e->a, 0);
		fputs(", ", p->out);
		pexpr(p, e->b, 0);
		fputc(')', p->out);
		return;
	}
	if (my < prec)
		fputc('(', p->out);
	pexpr(p, e->a, my);
	fputs(binop_name[e->op].s, p->out);
	pexpr(p, e->b, my + 1); /* left-associative: a - (b - c) keeps its parens */
	if (my < prec)
		fputc(')', p->out);
}

static void pexpr(const printer *p, const cg_expr *e, int prec)
{
	if (!e) {
		fputs("<null>", p->out);
		return;
	}
	switch (e->kind) {
	case CG_CONST: pconst(p, e); break;
	case CG_VAR: fprintf(p->out, "%%%c%d", p->local[e->var] ? 't' : 'i', e->var); break;
	case CG_SIZE: {
		const char *s = p->m->g ? ir_dim_symname(p->m->g, e->var) : NULL;
		if (s)
			fputs(s, p->out);
		else
			fprintf(p->out, "$%d", e->var);
		break;
	}
	case CG_LOAD:
		pref(p, e->buf);
		fputc('[', p->out);
		pexpr(p, e->a, 0);
		fputc(']', p->out);
		break;
	case CG_UN:
		fprintf(p->out, "%s(", unop_name[e->op]);
		pexpr(p, e->a, 0);
		fputc(')', p->out);
		break;
	case CG_BIN: pbin(p, e, prec); break;
	case CG_SELECT:
		fputs("select(", p->out);
		pexpr(p, e->a, 0);
		fputs(", ", p->out);
		pexpr(p, e->b, 0);
		fputs(", ", p->out);
		pexpr(p, e->c, 0);
		fputc(')', p->out);
		break;
	case CG_CAST:
		fprintf(p->out, "%s(", kiln_dtype_name(e->dt));
		pexpr(p, e->a, 0);
		fputc(')', p->out);
		break;
	}
}

static void indent(const printer *p, int depth)
{
	for (int i = 0; i < depth; i++)
		fputs("  ", p->out);
}

static void phints(const printer *p, uint32_t h)
{
	static const char *const names[] = {"parallel", "vectorize", "unroll", "reduce", "lanes",
	                                    "tail_mask"};
	bool any = false;
	for (int k = 0; k < (int)(sizeof names / sizeof *names); k++)
		if (h & (1u << k)) {
			fprintf(p->out, "%s%s", any ? ", " : " [", names[k]);
			any = true;
		}
	if (any)
		fputc(']', p->out);
}

/* " residual=buf3[off; rs]", before the activation when it comes first */
static void presidual(const printer *p, const cg_gemm *g)
{
	fputs(" residual=", p->out);
	pref(p, g->residual);
	fputc('[', p->out);
	pexpr(p, g->res_off, 0);
	fputs("; ", p->out);
	pexpr(p, g->res_rs, 0);
	fputc(']', p->out);
}

static void pgemm(const printer *p, const cg_gemm *g)
{
	const struct {
		const char *name;
		const cg_expr *e;
	} f[] = {{"M", g->M}, {"N", g->N}, {"K", g->K}, {"batch", g->batch}};
	fputs("gemm", p->out);
	for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
		fprintf(p->out, " %s=", f[i].name);
		pexpr(p, f[i].e, 0);
	}
	const struct {
		char c;
		int buf;
		const cg_expr *off, *bs, *rs, *cs;
	} o[] = {{'A', g->a, g->a_off, g->a_bs, g->a_rs, g->a_cs},
	         {'B', g->b, g->b_off, g->b_bs, g->b_rs, g->b_cs},
	         {'C', g->c, g->c_off, g->c_bs, g->c_rs, NULL}};
	for (int i = 0; i < 3; i++) {
		fprintf(p->out, " %c=", o[i].c);
		pref(p, o[i].buf);
		fputc('[', p->out);
		pexpr(p, o[i].off, 0);
		fputs("; ", p->out);
		pexpr(p, o[i].bs, 0);
		fputs(", ", p->out);
		pexpr(p, o[i].rs, 0);
		fputs(", ", p->out);
		if (o[i].cs)
			pexpr(p, o[i].cs, 0);
		else
			fputc('1', p->out);
		fputc(']', p->out);
	}
	if (g->has_b_rows) {
		fputs(" b_rows=", p->out);
		pref(p, g->b_rows);
	}
	if (g->a_panel)
		fprintf(p->out, " a_panel=%d", g->a_panel);
	if (g->b_panel)
		fprintf(p->out, " b_panel=%d", g->b_panel);
	if (g->b_block)
		fprintf(p->out, " b_block=%d", g->b_block);
	if (g->c_block)
		fprintf(p->out, " c_block=%d", g->c_block);
	fprintf(p->out, " alpha=%g beta=%g", g->alpha, g->beta);
	if (p->canon && !g->bias_axis && g->bias >= 0) { /* passed, unread */
		fputs(" bias_buf=", p->out);
		pref(p, g->bias);
	}
	if (g->bias_axis) {
		fputs(" bias=", p->out);
		pref(p, g->bias);
		fputc('[', p->out);
		pexpr(p, g->bias_off, 0);
		fprintf(p->out, "] per %s", g->bias_axis == 1 ? "column" : "row");
	}
	if (g->has_residual && g->res_first)
		presidual(p, g);
	if (g->act == CG_ACT_RELU)
		fputs(" relu", p->out);
	else if (g->act == CG_ACT_CLIP)
		fprintf(p->out, " clip(%g, %g)", g->act_lo, g->act_hi);
	/* types and the int8 epilogue only where they differ from a plain f32
	 * GEMM, so today's dumps read as before */
	if (g->a_dt != KILN_F32 || g->b_dt != KILN_F32 || g->c_dt != KILN_F32 ||
	    g->acc_dt != KILN_F32)
		fprintf(p->out, " types=%s*%s->%s acc=%s", kiln_dtype_name(g->a_dt),
		        kiln_dtype_name(g->b_dt), kiln_dtype_name(g->c_dt), kiln_dtype_name(g->acc_dt));
	const struct {
		const char *name;
		const cg_gemm_vec *v;
	} ev[] = {{"scale", &g->scale}, {"a_zero", &g->a_zero}, {"b_zero", &g->b_zero},
	          {"c_zero", &g->c_zero}};
	static const char *const axis[] = {"", "column", "row", "all"};
	for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++) {
		if (!ev[i].v->axis || ev[i].v->axis > CG_AXIS_ALL)
			continue;
		fprintf(p->out, " %s=", ev[i].name);
		pref(p, ev[i].v->buf);
		fputc('[', p->out);
		pexpr(p, ev[i].v->off, 0);
		fprintf(p->out, "] per %s", axis[ev[i].v->axis]);
	}
	if (g->has_residual && !g->res_first)
		presidual(p, g);
}

static void pstmt(const printer *p, const cg_stmt *s, int depth)
{
	if (!s)
		return;
	if (s->kind == CG_BLOCK) {
		for (int i = 0; i < s->n; i++)
			pstmt(p, s->items[i], depth);
		return;
	}
	indent(p, depth);
	switch (s->kind) {
	case CG_FOR:
		fprintf(p->out, "for %%i%d in 0..", s->var);
		pexpr(p, s->extent, 0);
		phints(p, s->hints);
		fputs(" {\n", p->out);
		pstmt(p, s->body, depth + 1);
		indent(p, depth);
		fputs("}\n", p->out);
		return;
	case CG_STORE:
		pref(p, s->buf);
		fputc('[', p->out);
		pexpr(p, s->index, 0);
		fputs("] = ", p->out);
		pexpr(p, s->value, 0);
		break;
	case CG_ASSIGN:
		fprintf(p->out, "%%t%d: %s = ", s->var, kiln_dtype_name(s->dt));
		pexpr(p, s->value, 0);
		break;
	case CG_IF:
		fputs("if ", p->out);
		pexpr(p, s->cond, 0);
		fputs(" {\n", p->out);
		pstmt(p, s->then_s, depth + 1);
		if (s->else_s) {
			indent(p, depth);
			fputs("} else {\n", p->out);
			pstmt(p, s->else_s, depth + 1);
		}
		indent(p, depth);
		fputc('}', p->out);
		break;
	case CG_GEMM: pgemm(p, s->gemm); break;
	case CG_TRANSPOSE: {
		const cg_transpose *t = s->tr;
		fputs("transpose rows=", p->out);
		pexpr(p, t->rows, 0);
		fputs(" cols=", p->out);
		pexpr(p, t->cols, 0);
		fputc(' ', p->out);
		pref(p, t->src);
		fputc('[', p->out);
		pexpr(p, t->src_off, 0);
		fputs("; ", p->out);
		pexpr(p, t->src_rs, 0);
		fputs(", 1] -> ", p->out);
		pref(p, t->dst);
		fputc('[', p->out);
		pexpr(p, t->dst_off, 0);
		fputs("; 1, ", p->out);
		pexpr(p, t->dst_rs, 0);
		fputc(']', p->out);
		break;
	}
	case CG_CHECK:
		fputs("check ", p->out);
		pexpr(p, s->value, 0);
		if (s->lo) {
			fputs(" in [", p->out);
			pexpr(p, s->lo, 0);
			fputs(", ", p->out);
			pexpr(p, s->hi, 0);
			fputc(')', p->out);
		} else {
			fputs(" != 0", p->out);
		}
		fprintf(p->out, " \"%s\"", s->what);
		break;
	default: break;
	}
	fputc('\n', p->out);
}

static void mark_locals(const cg_stmt *s, bool *local, int nvar)
{
	if (!s)
		return;
	if (s->kind == CG_ASSIGN && s->var >= 0 && s->var < nvar)
		local[s->var] = true;
	for (int i = 0; s->kind == CG_BLOCK && i < s->n; i++)
		mark_locals(s->items[i], local, nvar);
	if (s->kind == CG_FOR)
		mark_locals(s->body, local, nvar);
	if (s->kind == CG_IF) {
		mark_locals(s->then_s, local, nvar);
		mark_locals(s->else_s, local, nvar);
	}
}

static const char *const kind_name[] = {
	[CG_BUF_INPUT] = "input", [CG_BUF_OUTPUT] = "output", [CG_BUF_CONST] = "const",
	[CG_BUF_TEMP] = "temp", [CG_BUF_STATE] = "state"};

static void pbuf(const printer *p, const cg_buf *b)
{
	char ty[256];
	fprintf(p->out, "buf%d %s %s", b->id, kind_name[b->kind],
	        ir_type_str(p->m->g, &b->type, ty, sizeof ty));
	fputs(" numel=", p->out);
	pexpr(p, b->numel, 0);
	if (b->alias >= 0)
		fprintf(p->out, " alias=buf%d", b->alias);
	if (b->io_index >= 0)
		fprintf(p->out, " io=%d", b->io_index);
	if (b->slot >= 0)
		fprintf(p->out, " slot=%d live=%d..%d", b->slot, b->first, b->last);
	if (b->name)
		fprintf(p->out, " \"%s\"", b->name);
	fputc('\n', p->out);
}

void cg_print(const cg_module *m, FILE *out)
{
	if (!m || !out)
		return;
	printer p = {m, out, NULL, NULL, NULL};
	fprintf(out, "module %s: %d buffers, %d kernels, %d slots\n",
	        m->g && m->g->name ? m->g->name : "?", m->nbuf, m->nkern, m->nslot);
	for (int i = 0; i < m->nbuf; i++)
		pbuf(&p, &m->buf[i]);
	for (int i = 0; i < m->nkern; i++) {
		const cg_kernel *k = &m->kern[i];
		bool *local = calloc(k->nvar + 1, sizeof *local);
		if (!local)
			return;
		mark_locals(k->body, local, k->nvar);
		p.local = local;
		fprintf(out, "\nkernel %s (node %u) ", k->name, k->node);
		if (k->guard) {
			fputs("if ", out);
			pexpr(&p, k->guard, 0);
			fputc(' ', out);
		}
		fputs("{\n", out);
		pstmt(&p, k->body, 1);
		fputs("}\n", out);
		free(local);
	}
}

char *cg_kernel_key(const cg_module *m, const cg_kernel *k, int *canon, int *nroot)
{
	char *text = NULL;
	size_t len = 0;
	bool *local = calloc((size_t)k->nvar + 1, sizeof *local);
	FILE *f = local ? open_memstream(&text, &len) : NULL;
	if (!f) {
		free(local);
		return NULL;
	}
	for (int b = 0; b < m->nbuf; b++)
		canon[b] = -1;
	*nroot = 0;
	mark_locals(k->body, local, k->nvar);
	printer p = {m, f, local, canon, nroot};
	fprintf(f, "nvar %d\n", k->nvar);
	if (k->guard) {
		fputs("if ", f);
		pexpr(&p, k->guard, 0);
		fputc('\n', f);
	}
	pstmt(&p, k->body, 1);
	free(local);
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}
