/*
 * keval.c: cg_eval, an interpreter of the kernel IR: the oracle that tests
 * lowering (and the memory plan) against the graph interpreter without any
 * backend.
 *
 * It does what a generated library does: binds each symbol from the input
 * shapes, gives every buffer its memory (inputs and weights borrowed,
 * outputs allocated for the caller, temporaries in the planned slots when
 * cg_memplan has run so that a wrong plan shows up as a wrong answer, else
 * one allocation each; an alias shares its base's bytes), then runs the
 * kernels in order.  Floats compute in double and round once on store, as
 * ir/interp.c does; integers compute in int64 and wrap to their dtype after
 * every operation, as a backend's fixed-width arithmetic does.  Both arms
 * of a select are evaluated (a backend's select is not lazy), and every
 * load and store is bounds-checked, so a kernel that would read outside a
 * buffer on some input is an error here, not a silent read.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

typedef struct val {
	double f;
	int64_t i;
} val;

typedef struct ev {
	const cg_module *m;
	kiln_error *err;
	int64_t *sym;
	kiln_tensor *view; /* per buffer: data pointer, dtype, shape [numel] */
	val *var;
	const cg_kernel *k;
	kiln_status st;
} ev;

static bool isfl(kiln_dtype dt)
{
	return kiln_dtype_is_float(dt);
}

static kiln_status fail(ev *e, kiln_status code, const char *what, int64_t a, int64_t b)
{
	if (!e->st)
		e->st = ir_seterr(e->err, code, "cg_eval: kernel %s: %s (%lld, %lld)",
		                  e->k ? e->k->name : "?", what, (long long)a, (long long)b);
	return e->st;
}

/* Integer results wrap to the width of their dtype. */
static int64_t wrap(int64_t v, kiln_dtype dt)
{
	switch (dt) {
	case KILN_I8: return (int8_t)(uint8_t)v;
	case KILN_U8: return (uint8_t)v;
	case KILN_I32: return (int32_t)(uint32_t)v;
	case KILN_BOOL: return v != 0;
	default: return v;
	}
}

/* Float to float rounds to the target format (through a one-element
 * tensor, so f16 and bf16 round exactly as stores do). */
static double round_fl(double v, kiln_dtype dt)
{
	if (dt == KILN_F64)
		return v;
	uint32_t bits = 0;
	kiln_tensor t = {.dtype = dt, .rank = 1, .shape = {1}, .data = &bits};
	ir_store(&t, 0, v);
	return ir_load(&t, 0);
}

static int64_t sat(double v, kiln_dtype dt)
{
	uint64_t bits = 0;
	kiln_tensor t = {.dtype = dt, .rank = 1, .shape = {1}, .data = &bits};
	ir_store(&t, 0, v); /* truncates toward zero, saturates, NaN -> 0 */
	return ir_load_i64(&t, 0);
}

static val expr(ev *e, const cg_expr *x);

static val cast(const cg_expr *x, val a)
{
	val r = {0, 0};
	kiln_dtype from = x->a->dt, to = x->dt;
	if (isfl(from) && isfl(to))
		r.f = round_fl(a.f, to);
	else if (isfl(from))
		r.i = to == KILN_BOOL ? a.f != 0 || isnan(a.f) : sat(a.f, to);
	else if (isfl(to))
		r.f = to == KILN_F32 ? (double)(float)a.i : round_fl((double)a.i, to);
	else
		r.i = wrap(a.i, to);
	return r;
}

static double unf(cg_unop op, double a)
{
	switch (op) {
	case CG_NEG: return -a;
	case CG_ABS: return fabs(a);
	case CG_EXP: return exp(a);
	case CG_LOG: return log(a);
	case CG_SQRT: return sqrt(a);
	case CG_TANH: return tanh(a);
	case CG_ERF: return erf(a);
	case CG_SIN: return sin(a);
	case CG_COS: return cos(a);
	case CG_ATAN: return atan(a);
	case CG_ASIN: return asin(a);
	case CG_ACOS: return acos(a);
	case CG_FLOOR: return floor(a);
	case CG_CEIL: return ceil(a);
	case CG_ROUND: return nearbyint(a);
	case CG_SIGMOID: return a >= 0 ? 1 / (1 + exp(-a)) : exp(a) / (1 + exp(a));
	default: return NAN;
	}
}

static val un(const cg_expr *x, val a)
{
	val r = {0, 0};
	if (isfl(x->dt))
		r.f = unf(x->op, a.f);
	else if (x->op == CG_NEG)
		r.i = wrap((int64_t)(0 - (uint64_t)a.i), x->dt);
	else if (x->op == CG_ABS)
		r.i = wrap(a.i < 0 ? (int64_t)(0 - (uint64_t)a.i) : a.i, x->dt);
	else if (x->op == CG_NOT)
		r.i = !a.i;
	else
		r.i = a.i;
	return r;
}

/* Max and min propagate NaN, as the interpreter's do. */
static double binf(cg_binop op, double a, double b)
{
	switch (op) {
	case CG_ADD: return a + b;
	case CG_SUB: return a - b;
	case CG_MUL: return a * b;
	case CG_DIV: return a / b;
	case CG_REM: return fmod(a, b);
	case CG_MIN: return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
	case CG_MAX: return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
	case CG_POW: return pow(a, b);
	case CG_EQ: return a == b;
	case CG_NE: return a != b;
	case CG_LT: return a < b;
	case CG_LE: return a <= b;
	case CG_GT: return a > b;
	case CG_GE: return a >= b;
	default: return NAN;
	}
}

static val bin_int(ev *e, const cg_expr *x, int64_t a, int64_t b)
{
	uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
	int64_t r = 0;
	switch (x->op) {
	case CG_ADD: r = (int64_t)(ua + ub); break;
	case CG_SUB: r = (int64_t)(ua - ub); break;
	case CG_MUL: r = (int64_t)(ua * ub); break;
	case CG_DIV:
	case CG_REM:
		if (b == 0)
			fail(e, KILN_EVERIFY, "integer division by zero", a, b);
		else if (b == -1)
			r = x->op == CG_DIV ? (int64_t)(0 - ua) : 0;
		else
			r = x->op == CG_DIV ? a / b : a % b;
		break;
	case CG_MIN: r = a < b ? a : b; break;
	case CG_MAX: r = a > b ? a : b; break;
	case CG_POW: r = (int64_t)pow((double)a, (double)b); break;
	case CG_EQ: r = a == b; break;
	case CG_NE: r = a != b; break;
	case CG_LT: r = a < b; break;
	case CG_LE: r = a <= b; break;
	case CG_GT: r = a > b; break;
	case CG_GE: r = a >= b; break;
	case CG_AND: r = a && b; break;
	case CG_OR: r = a || b; break;
	case CG_XOR: r = (int64_t)(ua ^ ub); break;
	case CG_SHR:
		if (b < 0 || b > 63)
			fail(e, KILN_EVERIFY, "shift out of range", a, b);
		else
			r = (int64_t)(ua >> b);
		break;
	default: break;
	}
	return (val){0, wrap(r, x->dt)};
}

static val bin(ev *e, const cg_expr *x)
{
	val a = expr(e, x->a), b = expr(e, x->b);
	if (!isfl(x->a->dt))
		return bin_int(e, x, a.i, b.i);
	double r = binf(x->op, a.f, b.f);
	if (x->dt == KILN_BOOL)
		return (val){0, r != 0};
	return (val){r, 0};
}

static bool in_range(ev *e, int buf, int64_t i, const char *what)
{
	if (buf < 0 || buf >= e->m->nbuf)
		return fail(e, KILN_EVERIFY, "bad buffer", buf, i), false;
	int64_t n = e->view[buf].shape[0];
	if (i < 0 || i >= n) {
		char msg[64];
		snprintf(msg, sizeof msg, "%s buf%d out of bounds (index, numel)", what, buf);
		return fail(e, KILN_EVERIFY, msg, i, n), false;
	}
	return true;
}

static val load(ev *e, const cg_expr *x)
{
	val ix = expr(e, x->a), r = {0, 0};
	if (e->st || !in_range(e, x->buf, ix.i, "load from"))
		return r;
	const kiln_tensor *t = &e->view[x->buf];
	if (isfl(t->dtype))
		r.f = ir_load(t, ix.i);
	else
		r.i = ir_load_i64(t, ix.i);
	return r;
}

static val expr(ev *e, const cg_expr *x)
{
	val r = {0, 0};
	if (!x || e->st)
		return r;
	switch (x->kind) {
	case CG_CONST: return (val){x->f, x->i};
	case CG_VAR: return x->var < e->k->nvar ? e->var[x->var] : r;
	case CG_SIZE: return (val){0, x->var < e->m->nsym ? e->sym[x->var] : 0};
	case CG_LOAD: return load(e, x);
	case CG_UN: return un(x, expr(e, x->a));
	case CG_BIN: return bin(e, x);
	case CG_SELECT: {
		val c = expr(e, x->a), a = expr(e, x->b), b = expr(e, x->c);
		return c.i ? a : b;
	}
	case CG_CAST: return cast(x, expr(e, x->a));
	}
	return r;
}

static void store(ev *e, int buf, int64_t i, kiln_dtype vdt, val v)
{
	if (!in_range(e, buf, i, "store to"))
		return;
	kiln_tensor *t = &e->view[buf];
	if (isfl(vdt))
		ir_store(t, i, v.f);
	else
		ir_store_i64(t, i, v.i);
}

/* ---- GEMM --------------------------------------------------------------- */

static int64_t ix(ev *e, const cg_expr *x)
{
	return x ? expr(e, x).i : 0;
}

/* An epilogue operand at row i, column j of the product; 0 when absent. */
static double vec_at(ev *e, const cg_gemm_vec *v, int64_t i, int64_t j, const char *what)
{
	if (!v->axis)
		return 0;
	int64_t at = ix(e, v->off) + (v->axis == CG_AXIS_COL ? j : v->axis == CG_AXIS_ROW ? i : 0);
	return in_range(e, v->buf, at, what) ? ir_load(&e->view[v->buf], at) : 0;
}

static void gemm(ev *e, const cg_gemm *g)
{
	int64_t M = ix(e, g->M), N = ix(e, g->N), K = ix(e, g->K), B = ix(e, g->batch);
	int64_t ao = ix(e, g->a_off), abs = ix(e, g->a_bs), ars = ix(e, g->a_rs), acs = ix(e, g->a_cs);
	int64_t bo = ix(e, g->b_off), bbs = ix(e, g->b_bs), brs = ix(e, g->b_rs), bcs = ix(e, g->b_cs);
	int64_t co = ix(e, g->c_off), cbs = ix(e, g->c_bs), crs = ix(e, g->c_rs);
	int64_t bias_off = ix(e, g->bias_off);
	if (g->act >= CG_ACT_COUNT) {
		fail(e, KILN_EUNSUPPORTED, "gemm activation", g->act, 0);
		return;
	}
	if (g->c_block < 0 || (g->c_block > 0 && (g->has_residual || M % g->c_block))) {
		fail(e, KILN_EUNSUPPORTED, "gemm C in blocks of rows", g->c_block, M);
		return;
	}
	if (g->b_block < 0 || (g->b_block > 0 && (g->has_b_rows || K % g->b_block))) {
		fail(e, KILN_EUNSUPPORTED, "gemm B in blocks of rows", g->b_block, K);
		return;
	}
	int64_t res_off = ix(e, g->res_off), res_rs = ix(e, g->res_rs);
	bool int_c = !isfl(g->c_dt);
	for (int64_t b = 0; b < B && !e->st; b++)
		for (int64_t i = 0; i < M && !e->st; i++)
			for (int64_t j = 0; j < N && !e->st; j++) {
				double acc = 0, az = vec_at(e, &g->a_zero, i, j, "gemm a_zero");
				double bz = vec_at(e, &g->b_zero, i, j, "gemm b_zero");
				for (int64_t k = 0; k < K && !e->st; k++) {
					int64_t ai = ao + b * abs + i * ars + k * acs;
					if (g->a_panel > 0) /* row panels (cg_gemm.a_panel) */
						ai = ao + i / g->a_panel * K * g->a_panel + k * g->a_panel +
						     i % g->a_panel;
					int64_t bk = k * brs;
					if (g->has_b_rows && in_range(e, g->b_rows, k, "gemm b_rows"))
						bk = (int64_t)ir_load(&e->view[g->b_rows], k);
					int64_t bi = bo + b * bbs + bk + j * bcs;
					if (g->b_block > 0) /* rows in blocks (cg_gemm.b_block) */
						bi = bo + b * bbs + k / g->b_block * g->b_block * brs +
						     j * g->b_block + k % g->b_block;
					if (g->b_panel > 0) /* column panels (cg_gemm.b_panel) */
						bi = bo + j / g->b_panel * CG_PANEL_ROWS(K) * g->b_panel + k * g->b_panel +
						     j % g->b_panel;
					if (in_range(e, g->a, ai, "gemm A") && in_range(e, g->b, bi, "gemm B"))
						acc += (ir_load(&e->view[g->a], ai) - az) *
						       (ir_load(&e->view[g->b], bi) - bz);
				}
				int64_t ci = co + b * cbs + i * crs + j;
				if (g->c_block > 0) /* rows in blocks (cg_gemm.c_block) */
					ci = co + b * cbs + i / g->c_block * g->c_block * crs + j * g->c_block +
					     i % g->c_block;
				if (!in_range(e, g->c, ci, "gemm C"))
					return;
				acc *= g->alpha;
				if (g->beta != 0)
					acc += g->beta * ir_load(&e->view[g->c], ci);
				if (g->bias_axis) {
					int64_t bi = bias_off + (g->bias_axis == 1 ? j : i);
					if (!in_range(e, g->bias, bi, "gemm bias"))
						return;
					acc += ir_load(&e->view[g->bias], bi);
				}
				if (g->has_residual && g->res_first) {
					int64_t ri = res_off + b * cbs + i * res_rs + j;
					if (!in_range(e, g->residual, ri, "gemm residual"))
						return;
					acc += ir_load(&e->view[g->residual], ri);
				}
				if (g->scale.axis)
					acc *= vec_at(e, &g->scale, i, j, "gemm scale");
				if (g->act == CG_ACT_RELU && !(acc > 0) && !isnan(acc))
					acc = 0;
				else if (g->act == CG_ACT_CLIP && !isnan(acc))
					acc = acc < g->act_lo ? g->act_lo : acc > g->act_hi ? g->act_hi : acc;
				if (g->has_residual && !g->res_first) {
					int64_t ri = res_off + b * cbs + i * res_rs + j;
					if (!in_range(e, g->residual, ri, "gemm residual"))
						return;
					acc += ir_load(&e->view[g->residual], ri);
				}
				acc += vec_at(e, &g->c_zero, i, j, "gemm c_zero");
				if (int_c)
					acc = nearbyint(acc); /* half to even, then saturated by the store */
				ir_store(&e->view[g->c], ci, acc);
			}
}

/* ---- statements --------------------------------------------------------- */

static void stmt(ev *e, const cg_stmt *s)
{
	if (!s || e->st)
		return;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n && !e->st; i++)
			stmt(e, s->items[i]);
		break;
	case CG_FOR: {
		int64_t n = expr(e, s->extent).i;
		for (int64_t i = 0; i < n && !e->st; i++) {
			e->var[s->var] = (val){0, i};
			stmt(e, s->body);
		}
		break;
	}
	case CG_STORE: {
		int64_t i = expr(e, s->index).i;
		val v = expr(e, s->value);
		if (!e->st)
			store(e, s->buf, i, s->value->dt, v);
		break;
	}
	case CG_ASSIGN: e->var[s->var] = expr(e, s->value); break;
	case CG_IF:
		if (expr(e, s->cond).i)
			stmt(e, s->then_s);
		else
			stmt(e, s->else_s);
		break;
	case CG_GEMM: gemm(e, s->gemm); break;
	case CG_TRANSPOSE: {
		const cg_transpose *t = s->tr;
		int64_t R = ix(e, t->rows), C = ix(e, t->cols), so = ix(e, t->src_off);
		int64_t srs = ix(e, t->src_rs), d0 = ix(e, t->dst_off), drs = ix(e, t->dst_rs);
		for (int64_t i = 0; i < R && !e->st; i++)
			for (int64_t j = 0; j < C && !e->st; j++)
				if (in_range(e, t->src, so + i * srs + j, "transpose from"))
					store(e, t->dst, d0 + j * drs + i, KILN_F32,
					      (val){ir_load(&e->view[t->src], so + i * srs + j), 0});
		break;
	}
	case CG_CHECK: {
		int64_t v = expr(e, s->value).i;
		int64_t lo = s->lo ? expr(e, s->lo).i : 0, hi = s->hi ? expr(e, s->hi).i : 0;
		if (!e->st && !s->lo && v == 0)
			e->st = ir_seterr(e->err, KILN_EINVAL, "%s (kernel %s)", s->what,
			                  e->k ? e->k->name : "?");
		else if (!e->st && s->lo && (v < lo || v >= hi))
			e->st = ir_seterr(e->err, KILN_EINVAL, "%s %lld out of range [%lld, %lld) "
			                  "(kernel %s)", s->what, (long long)v, (long long)lo,
			                  (long long)hi, e->k ? e->k->name : "?");
		break;
	}
	}
}

/* ---- binding and memory ------------------------------------------------- */

static kiln_status bind(ev *e, kiln_tensor *const *in, int nin)
{
	const cg_module *m = e->m;
	for (int k = 0; k < m->nsym; k++)
		e->sym[k] = -1;
	for (int i = 0; i < nin; i++) {
		const cg_buf *b = &m->buf[m->inputs[i]];
		if (!in[i] || in[i]->dtype != b->dt || in[i]->rank != b->type.rank)
			return ir_seterr(e->err, KILN_ESHAPE, "cg_eval: input %d does not match its "
			                 "dtype and rank", i);
		for (int d = 0; d < in[i]->rank; d++) {
			int s = m->g ? ir_dim_symbol_index(m->g, b->type.dim[d]) : -1;
			if (s >= 0 && e->sym[s] < 0)
				e->sym[s] = in[i]->shape[d];
		}
	}
	for (int i = 0; i < nin; i++) {
		const cg_buf *b = &m->buf[m->inputs[i]];
		for (int d = 0; d < in[i]->rank; d++)
			if (ir_dim_eval(m->g, b->type.dim[d], e->sym) != in[i]->shape[d])
				return ir_seterr(e->err, KILN_ESHAPE, "cg_eval: input %d dim %d is %lld, "
				                 "which the signature does not allow", i, d,
				                 (long long)in[i]->shape[d]);
	}
	return KILN_OK;
}

static int root(const cg_module *m, int b)
{
	while (m->buf[b].alias >= 0)
		b = m->buf[b].alias;
	return b;
}

/* Outputs first (allocated for the caller), then slots, then the rest. */
static kiln_status place(ev *e, kiln_tensor *const *in, kiln_tensor **out, void ***own,
                         int *nown)
{
	const cg_module *m = e->m;
	int64_t *slot_bytes = calloc(m->nslot + 1, sizeof *slot_bytes);
	void **slot = calloc(m->nslot + 1, sizeof *slot);
	kiln_status st = slot_bytes && slot ? KILN_OK : KILN_ENOMEM;
	for (int b = 0; b < m->nbuf && !st; b++) {
		const cg_buf *cb = &m->buf[b];
		int64_t n = cg_expr_int(cb->numel, e->sym);
		e->view[b] = (kiln_tensor){.dtype = cb->dt, .rank = 1, .shape = {n < 0 ? 0 : n}};
		if (cb->slot >= 0 && cb->slot < m->nslot && cb->alias < 0) {
			int64_t bytes = n * (int64_t)kiln_dtype_size(cb->dt);
			slot_bytes[cb->slot] = bytes > slot_bytes[cb->slot] ? bytes : slot_bytes[cb->slot];
		}
	}
	for (int s = 0; s < m->nslot && !st; s++)
		if (!(slot[s] = (*own)[(*nown)++] = calloc(1, slot_bytes[s] + 64)))
			st = KILN_ENOMEM;
	for (int b = 0; b < m->nbuf && !st; b++) {
		const cg_buf *cb = &m->buf[b];
		kiln_tensor *v = &e->view[b];
		if (cb->alias >= 0)
			continue;
		if (cb->kind == CG_BUF_INPUT)
			v->data = in[cb->io_index]->data;
		else if (cb->kind == CG_BUF_CONST)
			v->data = cb->data ? cb->data->data : NULL;
		else if (cb->kind == CG_BUF_OUTPUT) {
			int64_t shape[KILN_MAX_RANK];
			for (int d = 0; d < cb->type.rank; d++)
				shape[d] = ir_dim_eval(m->g, cb->type.dim[d], e->sym);
			out[cb->io_index] = kiln_tensor_new(cb->dt, cb->type.rank, shape);
			v->data = out[cb->io_index] ? out[cb->io_index]->data : NULL;
		} else if (cb->slot >= 0 && cb->slot < m->nslot)
			v->data = slot[cb->slot];
		else
			v->data = (*own)[(*nown)++] = calloc(1, v->shape[0] * kiln_dtype_size(cb->dt) + 64);
		if (!v->data && cb->kind != CG_BUF_CONST)
			st = KILN_ENOMEM;
	}
	for (int b = 0; b < m->nbuf && !st; b++)
		if (m->buf[b].alias >= 0)
			e->view[b].data = e->view[root(m, b)].data;
	free(slot_bytes), free(slot);
	return st ? ir_seterr(e->err, st, "cg_eval: out of memory") : KILN_OK;
}

static kiln_status run(ev *e, kiln_tensor *const *in, kiln_tensor **out)
{
	const cg_module *m = e->m;
	void **own = calloc(m->nbuf + m->nslot + 1, sizeof *own);
	int nown = 0;
	kiln_status st = own ? bind(e, in, m->ninputs) : KILN_ENOMEM;
	if (!st)
		st = place(e, in, out, &own, &nown);
	for (int i = 0; i < m->nkern && !st; i++) {
		e->k = &m->kern[i];
		e->var = calloc(e->k->nvar + 1, sizeof *e->var);
		if (!e->var)
			st = ir_seterr(e->err, KILN_ENOMEM, "cg_eval: out of memory");
		else if (!e->k->guard || expr(e, e->k->guard).i)
			stmt(e, e->k->body);
		free(e->var);
		e->var = NULL;
		st = st ? st : e->st;
	}
	for (int i = 0; own && i < nown; i++)
		free(own[i]);
	free(own);
	return st;
}

kiln_status cg_eval(const cg_module *m, kiln_tensor *const *inputs, int ninputs,
                    kiln_tensor **outputs, int noutputs, kiln_error *err)
{
	if (!m || (ninputs && !inputs) || (noutputs && !outputs))
		return ir_seterr(err, KILN_EINVAL, "cg_eval: null argument");
	if (ninputs != m->ninputs || noutputs != m->noutputs)
		return ir_seterr(err, KILN_EINVAL, "cg_eval: module has %d inputs and %d outputs, "
		                 "got %d and %d", m->ninputs, m->noutputs, ninputs, noutputs);
	for (int i = 0; i < noutputs; i++)
		outputs[i] = NULL;
	ev e = {.m = m, .err = err, .sym = calloc(m->nsym + 1, sizeof *e.sym),
	        .view = calloc(m->nbuf + 1, sizeof *e.view)};
	kiln_status st = e.sym && e.view ? run(&e, inputs, outputs)
	                                 : ir_seterr(err, KILN_ENOMEM, "cg_eval: out of memory");
	for (int i = 0; i < noutputs && st; i++) {
		kiln_tensor_free(outputs[i]);
		outputs[i] = NULL;
	}
	free(e.sym), free(e.view);
	return st;
}
