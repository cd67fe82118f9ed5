/*
 * lower.c: graph -> kernel IR.  The driver, the helpers both lowering files
 * share, and the lowerings of elementwise ops, reductions and data movement
 * (lower_nn.c has the rest).
 *
 * cg_lower gives every graph input a buffer (INPUT, in signature order),
 * every parameter and Constant a CONST buffer holding its tensor, and every
 * node result a TEMP buffer, or an OUTPUT one for the first appearance of a
 * graph output, then calls one function per op from cg_lower_table.  Views
 * (Reshape, Flatten, Squeeze, Unsqueeze, Identity, and Dropout outside
 * training) become alias buffers with no kernel; a view, input or constant
 * that is a graph output, or an output listed twice, gets a copy kernel.
 * A Relu or Clip that is the only use of an f32 GEMM's result becomes the GEMM's
 * epilogue (cg_gemm.act) and a view.  With cg_lower_ex's fuse option,
 * chains of elementwise nodes also become one kernel each: an intermediate
 * with one reader, of that reader's shape and no graph output, is computed
 * inline in its reader's loop nest and gets no buffer (see "elementwise
 * fusion" below); so conv+bias -> relu (once bnfold gave the conv its
 * bias), mul -> add -> sigmoid, GELU spelled with erf, or a residual
 * add -> relu each cost one pass over memory.
 *
 * The key idea for fast loops is dimension grouping: output dims are merged
 * whenever every operand is either contiguous across both or broadcast
 * across both, so a same-shape elementwise op is one flat loop, a bias add
 * over [N,C,H,W] + [C,1,1] is three, and a reduction over the last axis is
 * an outer loop around one contiguous inner reduction.  The innermost loop
 * of a nest walks the contiguous dim (CG_VECTORIZE); the outermost loop is
 * CG_PARALLEL when the nest does at least CG_PAR_WORK element operations.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/lower.h"

/* ---- shared helpers ----------------------------------------------------- */

kiln_status cg_lower_fail(const cg_module *m, const ir_node *n, kiln_error *err,
                          kiln_status code, const char *fmt, ...)
{
	char head[512] = "", d[160], body[512];
	size_t k = 0;
	if (n && n->loc.file)
		k += snprintf(head, sizeof head, "%s:%d: ", n->loc.file, n->loc.line);
	if (n && k < sizeof head)
		snprintf(head + k, sizeof head - k, "%s: ", ir_node_desc(n, d, sizeof d));
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(body, sizeof body, fmt, ap);
	va_end(ap);
	return ir_seterr(err, code, "%s%s", head, body);
}

cg_stmt *cg_lower_check(cg_module *m, const ir_node *n, const char *what, cg_expr *v,
                        cg_expr *lo, cg_expr *hi)
{
	char head[700] = "", d[160];
	size_t k = 0;
	if (n && n->loc.file)
		k += snprintf(head, sizeof head, "%s:%d: ", n->loc.file, n->loc.line);
	if (n && k < sizeof head)
		snprintf(head + k, sizeof head - k, "%s: %s", ir_node_desc(n, d, sizeof d), what);
	return cg_check(m, head, v, lo, hi);
}

void cg_lower_check_all(cg_module *m, cg_kernel *k, const ir_node *n, const char *what,
                        int b, cg_expr *count, cg_expr *lo, cg_expr *hi, const int64_t *ignore)
{
	cg_expr *mn = cg_local(m, k, k->body, KILN_I64, cg_int(m, INT64_MAX));
	cg_expr *mx = cg_local(m, k, k->body, KILN_I64, cg_int(m, INT64_MIN));
	cg_expr *j, *v, *one = cg_int(m, 1), *zero = cg_int(m, 0);
	cg_stmt *body, *slow = cg_block(m);
	cg_append(m, k->body, cg_loop(m, k, count, CG_VECTORIZE | CG_REDUCE, &j, &body));
	v = cg_cast(m, cg_load(m, b, j), KILN_I64);
	if (!lo) /* nonzero: the range [1, 2) of v != 0 */
		v = cg_select(m, cg_bin(m, CG_EQ, v, zero), zero, one);
	cg_expr *skip = ignore ? cg_bin(m, CG_EQ, v, cg_int(m, *ignore)) : NULL;
	cg_set(m, body, mn, cg_bin(m, CG_MIN, mn, skip ? cg_select(m, skip, lo, v) : v));
	cg_set(m, body, mx, cg_bin(m, CG_MAX, mx, skip ? cg_select(m, skip, lo, v) : v));
	cg_append(m, slow, cg_loop(m, k, count, 0, &j, &body));
	v = cg_local(m, k, body, KILN_I64, cg_cast(m, cg_load(m, b, j), KILN_I64));
	cg_stmt *chk = cg_lower_check(m, n, what, v, lo, hi);
	if (ignore)
		chk = cg_if(m, cg_bin(m, CG_NE, v, cg_int(m, *ignore)), chk, NULL);
	cg_append(m, body, chk);
	cg_append(m, k->body, cg_if(m, cg_bin(m, CG_OR, cg_bin(m, CG_LT, mn, lo ? lo : one),
	                                      cg_bin(m, CG_GE, mx, hi ? hi : cg_int(m, 2))),
	                            slow, NULL));
}

cg_kernel *cg_lower_kernel(cg_module *m, const ir_node *n)
{
	char name[64];
	snprintf(name, sizeof name, "k%d_%s", m->nkern, n ? ir_op(n->op)->kir : "copy");
	return cg_kernel_new(m, name, n ? n->idx : 0);
}

int cg_lower_scratch(cg_module *m, kiln_dtype dt, cg_expr *numel)
{
	int b = cg_buf_new(m, CG_BUF_TEMP, dt, numel);
	if (b >= 0) {
		m->buf[b].type.rank = 1;
		m->buf[b].type.dim[0] = cg_expr_int(numel, NULL); /* an estimate, for the dump */
	}
	return b;
}

const ir_type *cg_btype(const cg_module *m, int buf)
{
	return &m->buf[buf].type;
}

cg_expr *cg_prod(cg_module *m, const ir_type *t, int from, int to)
{
	cg_expr *p = cg_int(m, 1);
	for (int d = from; d < to; d++)
		p = cg_bin(m, CG_MUL, p, cg_dim(m, t->dim[d]));
	return p;
}

cg_expr *cg_stride(cg_module *m, const ir_type *t, int d)
{
	return cg_prod(m, t, d + 1, t->rank);
}

kiln_dtype cg_ctype(kiln_dtype dt)
{
	return dt == KILN_F16 || dt == KILN_BF16 ? KILN_F32 : dt;
}

cg_expr *cg_ld(cg_module *m, int buf, cg_expr *idx)
{
	return cg_cast(m, cg_load(m, buf, idx), cg_ctype(m->buf[buf].dt));
}

cg_stmt *cg_st(cg_module *m, int buf, cg_expr *idx, cg_expr *v)
{
	return cg_store(m, buf, idx, cg_cast(m, v, m->buf[buf].dt));
}

uint32_t cg_par(cg_module *m, cg_expr *work)
{
	int64_t sym[64];
	for (int k = 0; k < 64; k++)
		sym[k] = CG_PAR_SYM;
	int64_t w = m->nsym <= 64 ? cg_expr_int(work, sym) : cg_expr_int(work, NULL);
	return w >= (m->par_work > 0 ? m->par_work : CG_PAR_WORK) ? CG_PARALLEL : 0;
}

cg_stmt *cg_loop(cg_module *m, cg_kernel *k, cg_expr *extent, uint32_t hints, cg_expr **iv,
                 cg_stmt **body)
{
	int v = cg_var_new(k);
	*iv = cg_var(m, v, KILN_I64);
	*body = cg_block(m);
	return cg_for(m, v, extent, hints, *body);
}

cg_stmt *cg_nest(cg_module *m, cg_kernel *k, cg_stmt *parent, int n, cg_expr *const *ext,
                 const uint32_t *hints, cg_expr **iv)
{
	uint32_t carry = 0; /* a parallel hint of an elided loop moves inward */
	for (int d = 0; d < n; d++) {
		uint32_t h = (hints ? hints[d] : 0) | carry;
		cg_stmt *body;
		carry = 0;
		if (ext[d] && ext[d]->kind == CG_CONST && ext[d]->i == 1 && d < n - 1) {
			iv[d] = cg_int(m, 0); /* no loop of one iteration */
			carry = h & CG_PARALLEL;
			continue;
		}
		cg_append(m, parent, cg_loop(m, k, ext[d], h, &iv[d], &body));
		parent = body;
	}
	return parent;
}

cg_expr *cg_clamp(cg_module *m, cg_expr *v, cg_expr *hi)
{
	return cg_bin(m, CG_MAX, cg_bin(m, CG_MIN, v, cg_bin(m, CG_SUB, hi, cg_int(m, 1))),
	              cg_int(m, 0));
}

cg_expr *cg_local(cg_module *m, cg_kernel *k, cg_stmt *block, kiln_dtype dt, cg_expr *v)
{
	int var = cg_var_new(k);
	cg_append(m, block, cg_assign(m, var, dt, v));
	return cg_var(m, var, dt);
}

void cg_set(cg_module *m, cg_stmt *block, cg_expr *var, cg_expr *v)
{
	cg_append(m, block, cg_assign(m, var->var, var->dt, v));
}

/* ---- dimension grouping -------------------------------------------------- */

/* A nest over the output's dims merged into groups; per group its extent
 * and, per operand, the stride of its innermost dim (0: broadcast). */
typedef struct groups {
	int n;
	cg_expr *ext[KILN_MAX_RANK];
	cg_expr *st[CG_FUSE_MAX + 1][KILN_MAX_RANK]; /* operand k; the output is last */
} groups;

/* Operand t right-aligned against out: does it vary along out's dim d? */
static bool present(const ir_type *t, const ir_type *out, int d)
{
	int j = d - (out->rank - t->rank);
	return j >= 0 && t->dim[j] != 1;
}

/* Groups out's dims for operands t[0..nop) broadcast to it; the output's
 * own strides are stored as operand nop. */
static void group(cg_module *m, const ir_type *out, int nop, const ir_type *const *t, groups *gr)
{
	bool prev[CG_FUSE_MAX] = {0};
	int last = -1;
	gr->n = 0;
	for (int d = 0; d < out->rank; d++) {
		if (out->dim[d] == 1)
			continue;
		bool cur[CG_FUSE_MAX], same = last >= 0;
		for (int k = 0; k < nop; k++) {
			cur[k] = present(t[k], out, d);
			same = same && cur[k] == prev[k];
		}
		if (same) {
			gr->ext[gr->n - 1] = cg_bin(m, CG_MUL, gr->ext[gr->n - 1], cg_dim(m, out->dim[d]));
		} else {
			gr->ext[gr->n++] = cg_dim(m, out->dim[d]);
		}
		for (int k = 0; k < nop; k++) {
			int off = out->rank - t[k]->rank;
			gr->st[k][gr->n - 1] = cur[k] ? cg_stride(m, t[k], d - off) : cg_int(m, 0);
			prev[k] = cur[k];
		}
		gr->st[nop][gr->n - 1] = cg_stride(m, out, d);
		last = d;
	}
}

static cg_expr *dot(cg_module *m, int n, cg_expr *const *iv, cg_expr *const *st)
{
	cg_expr *s = cg_int(m, 0);
	for (int d = 0; d < n; d++)
		s = cg_bin(m, CG_ADD, s, cg_bin(m, CG_MUL, iv[d], st[d]));
	return s;
}

/* Nest hints: the outermost loop parallel when there is enough work, the
 * innermost (contiguous in the output) vectorized. */
static void nest_hints(cg_module *m, int n, cg_expr *work, uint32_t *h)
{
	for (int d = 0; d < n; d++)
		h[d] = 0;
	if (n) {
		h[0] |= cg_par(m, work);
		h[n - 1] |= CG_VECTORIZE;
	}
}

/* ---- elementwise --------------------------------------------------------- */

static bool quant_axis_type(const ir_node *n, const ir_type *x, const ir_type *s, ir_type *t);

/* Builds an op's value from its operands (already in compute dtype ct). */
typedef cg_expr *(*scal_fn)(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct);

/* out[i] = f(in[0][bcast i], ...) over grouped dims; raw: move the bytes
 * (no compute-dtype conversion). */
static kiln_status elemwise(cg_module *m, const ir_node *n, int nop, const int *in, int out,
                            scal_fn f, bool raw)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	const ir_type *t[4];
	ir_type qt;
	for (int i = 0; i < nop; i++)
		t[i] = cg_btype(m, in[i]);
	if (nop > 1 && quant_axis_type(n, t[0], t[1], &qt))
		t[1] = t[nop - 1] = &qt; /* the zero point's shape is the scale's */
	groups gr;
	group(m, cg_btype(m, out), nop, t, &gr);
	uint32_t h[KILN_MAX_RANK] = {0}; /* nest_hints fills n; gcc -O3 cannot see it */
	cg_expr *iv[KILN_MAX_RANK], *a[4];
	nest_hints(m, gr.n, m->buf[out].numel, h);
	cg_stmt *body = cg_nest(m, k, k->body, gr.n, gr.ext, h, iv);
	for (int i = 0; i < nop; i++) {
		cg_expr *idx = dot(m, gr.n, iv, gr.st[i]);
		a[i] = raw ? cg_load(m, in[i], idx) : cg_ld(m, in[i], idx);
	}
	kiln_dtype ct = cg_ctype(m->buf[in[nop > 1 && n->op == KILN_OP_WHERE ? 1 : 0]].dt);
	cg_expr *v = f ? f(m, n, a, ct) : a[0];
	cg_stmt *s = raw ? cg_store(m, out, dot(m, gr.n, iv, gr.st[nop]), v)
	                 : cg_st(m, out, dot(m, gr.n, iv, gr.st[nop]), v);
	if (!s)
		return KILN_ENOMEM;
	cg_append(m, body, s);
	return KILN_OK;
}

kiln_status cg_lower_copy(cg_module *m, const ir_node *n, int src, int dst, kiln_error *err)
{
	/* same element count, maybe another shape: copy flat */
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *iv;
	cg_stmt *body;
	cg_stmt *loop = cg_loop(m, k, m->buf[dst].numel,
	                        cg_par(m, m->buf[dst].numel) | CG_VECTORIZE, &iv, &body);
	cg_append(m, k->body, loop);
	cg_append(m, body, cg_store(m, dst, iv, cg_load(m, src, iv)));
	return loop && body->n ? KILN_OK : KILN_ENOMEM;
}

static cg_expr *fc(cg_module *m, kiln_dtype dt, double v)
{
	return cg_const(m, dt, v);
}

static const cg_unop unop_of[KILN_OP_COUNT] = {
	[KILN_OP_NEG] = CG_NEG, [KILN_OP_ABS] = CG_ABS, [KILN_OP_EXP] = CG_EXP,
	[KILN_OP_LOG] = CG_LOG, [KILN_OP_SQRT] = CG_SQRT, [KILN_OP_FLOOR] = CG_FLOOR,
	[KILN_OP_CEIL] = CG_CEIL, [KILN_OP_ROUND] = CG_ROUND, [KILN_OP_SIN] = CG_SIN, [KILN_OP_COS] = CG_COS,
	[KILN_OP_ATAN] = CG_ATAN, [KILN_OP_ASIN] = CG_ASIN, [KILN_OP_ACOS] = CG_ACOS,
	[KILN_OP_TANH] = CG_TANH, [KILN_OP_ERF] = CG_ERF, [KILN_OP_NOT] = CG_NOT,
};

static cg_expr *s_unary(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	return cg_un(m, unop_of[n->op], a[0]);
}

static cg_expr *s_recip(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	return cg_bin(m, CG_DIV, fc(m, ct, 1), a[0]);
}

/* max(x, 0) propagates NaN, as the interpreter's relu does. */
static cg_expr *s_relu(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	return cg_bin(m, CG_MAX, a[0], fc(m, ct, 0));
}

/* 1/(1+exp(-x)), one kernel-IR op: the backends compute it with fewer
 * instructions than a general exp and a division (codegen/llvm.c). */
static cg_expr *s_sigmoid(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	return cg_un(m, CG_SIGMOID, a[0]);
}

/* An op with a formula in ir_scalar_table (Gelu, Softplus, ...): the
 * formula, instruction by instruction, as kernel-IR scalar expressions
 * (shared subexpressions stay shared). */
static const cg_unop sunop[] = {
	[IR_S_NEG] = CG_NEG, [IR_S_ABS] = CG_ABS, [IR_S_EXP] = CG_EXP, [IR_S_LOG] = CG_LOG,
	[IR_S_SQRT] = CG_SQRT, [IR_S_TANH] = CG_TANH, [IR_S_ERF] = CG_ERF,
};
static const cg_binop sbinop[] = {
	[IR_S_ADD] = CG_ADD, [IR_S_SUB] = CG_SUB, [IR_S_MUL] = CG_MUL, [IR_S_DIV] = CG_DIV,
	[IR_S_MAX] = CG_MAX, [IR_S_MIN] = CG_MIN, [IR_S_LT] = CG_LT,
};

static cg_expr *s_formula(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	ir_sexpr e;
	cg_expr *v[IR_SEXPR_MAX];
	if (ir_scalar_build(n, &e))
		return NULL;
	for (int i = 0; i < e.n; i++) {
		const ir_sinst *s = &e.i[i];
		switch (s->op) {
		case IR_S_X: v[i] = a[0]; break;
		case IR_S_K: v[i] = fc(m, ct, s->k); break;
		case IR_S_NEG: case IR_S_ABS: case IR_S_EXP: case IR_S_LOG: case IR_S_SQRT:
		case IR_S_TANH: case IR_S_ERF:
			v[i] = cg_un(m, sunop[s->op], v[s->a]);
			break;
		case IR_S_SELECT: v[i] = cg_select(m, v[s->a], v[s->b], v[s->c]); break;
		default: v[i] = cg_bin(m, sbinop[s->op], v[s->a], v[s->b]); break;
		}
	}
	return v[e.root];
}

/* Absent bounds are unbounded; NaN passes (comparisons with NaN fail);
 * integer bounds round inward, as the interpreter's. */
static cg_expr *s_clip(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	double lo = ir_attr_float(n, "min", -INFINITY), hi = ir_attr_float(n, "max", INFINITY);
	bool fl = kiln_dtype_is_float(ct);
	cg_expr *x = a[0];
	if (!fl)
		lo = ceil(lo), hi = floor(hi);
	if (isfinite(lo) || (fl && lo == INFINITY))
		x = cg_select(m, cg_bin(m, CG_LT, x, fc(m, ct, lo)), fc(m, ct, lo), x);
	if (isfinite(hi) || (fl && hi == -INFINITY))
		x = cg_select(m, cg_bin(m, CG_GT, x, fc(m, ct, hi)), fc(m, ct, hi), x);
	return x;
}

static cg_expr *s_cast(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	return cg_cast(m, a[0], (kiln_dtype)ir_attr_int(n, "to", KILN_F32));
}

static const cg_binop binop_of[KILN_OP_COUNT] = {
	[KILN_OP_ADD] = CG_ADD, [KILN_OP_SUB] = CG_SUB, [KILN_OP_MUL] = CG_MUL,
	[KILN_OP_DIV] = CG_DIV, [KILN_OP_POW] = CG_POW, [KILN_OP_MAX] = CG_MAX,
	[KILN_OP_MIN] = CG_MIN, [KILN_OP_EQUAL] = CG_EQ, [KILN_OP_LESS] = CG_LT,
	[KILN_OP_GREATER] = CG_GT, [KILN_OP_AND] = CG_AND, [KILN_OP_OR] = CG_OR,
};

/* Integer division never traps: a zero divisor gives 0 (the interpreter
 * reports an error; a kernel cannot) and -1 negates, so INT_MIN / -1 wraps. */
static cg_expr *int_div(cg_module *m, cg_expr *a, cg_expr *b, kiln_dtype ct)
{
	cg_expr *zero = fc(m, ct, 0), *one = fc(m, ct, 1), *m1 = fc(m, ct, -1);
	cg_expr *bad = cg_bin(m, CG_OR, cg_bin(m, CG_EQ, b, zero), cg_bin(m, CG_EQ, b, m1));
	cg_expr *q = cg_bin(m, CG_DIV, a, cg_select(m, bad, one, b));
	q = cg_select(m, cg_bin(m, CG_EQ, b, m1), cg_un(m, CG_NEG, a), q);
	return cg_select(m, cg_bin(m, CG_EQ, b, zero), zero, q);
}

/* Folds the operands left to right (Max and Min are variadic). */
static cg_expr *s_binary(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	cg_expr *acc = a[0];
	for (uint32_t k = 1; k < n->nin; k++)
		acc = n->op == KILN_OP_DIV && !kiln_dtype_is_float(ct)
			      ? int_div(m, acc, a[k], ct)
			      : cg_bin(m, binop_of[n->op], acc, a[k]);
	return acc;
}

static cg_expr *s_where(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	return cg_select(m, cg_cast(m, a[0], KILN_BOOL), a[1], a[2]);
}

/* QuantizeLinear: rint(x / scale) + zero_point, in f32 as the interpreter
 * (f64 for an i32 x); the conversion to the u8 or i8 result (a store, or
 * a fused reader's cast) saturates it, NaN giving 0. */
static cg_expr *s_quantize(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	kiln_dtype ft = ct == KILN_F32 ? KILN_F32 : KILN_F64;
	cg_expr *q = cg_un(m, CG_ROUND, cg_bin(m, CG_DIV, cg_cast(m, a[0], ft), cg_cast(m, a[1], ft)));
	return n->nin > 2 ? cg_bin(m, CG_ADD, q, cg_cast(m, a[2], ft)) : q;
}

/* DequantizeLinear: (x - zero_point) * scale in f32. */
static cg_expr *s_dequantize(cg_module *m, const ir_node *n, cg_expr **a, kiln_dtype ct)
{
	cg_expr *d = cg_cast(m, a[0], KILN_F32);
	if (n->nin > 2)
		d = cg_bin(m, CG_SUB, d, cg_cast(m, a[2], KILN_F32));
	return cg_bin(m, CG_MUL, d, a[1]);
}

/* A QuantizeLinear's or DequantizeLinear's scale along an axis of x, as a
 * shape that broadcasts to x ([C] -> [C,1,1] for axis 1 of a 4-D x), in
 * *t; false when scale s is one value, which broadcasts as it is. */
static bool quant_axis_type(const ir_node *n, const ir_type *x, const ir_type *s, ir_type *t)
{
	if ((n->op != KILN_OP_QUANTIZE_LINEAR && n->op != KILN_OP_DEQUANTIZE_LINEAR) ||
	    s->rank != 1 || s->dim[0] == 1 || x->rank == 0)
		return false;
	int64_t axis = ir_attr_int(n, "axis", 1);
	axis = axis < 0 ? axis + x->rank : axis;
	*t = (ir_type){s->dtype, x->rank - (int)axis, {s->dim[0]}};
	for (int d = 1; d < t->rank; d++)
		t->dim[d] = 1;
	return true;
}

static const scal_fn scal[KILN_OP_COUNT] = {
	[KILN_OP_NEG] = s_unary, [KILN_OP_ABS] = s_unary, [KILN_OP_EXP] = s_unary,
	[KILN_OP_LOG] = s_unary, [KILN_OP_SQRT] = s_unary, [KILN_OP_FLOOR] = s_unary,
	[KILN_OP_CEIL] = s_unary, [KILN_OP_ROUND] = s_unary, [KILN_OP_SIN] = s_unary, [KILN_OP_COS] = s_unary,
	[KILN_OP_ATAN] = s_unary, [KILN_OP_ASIN] = s_unary, [KILN_OP_ACOS] = s_unary,
	[KILN_OP_TANH] = s_unary, [KILN_OP_ERF] = s_unary, [KILN_OP_NOT] = s_unary,
	[KILN_OP_RECIPROCAL] = s_recip, [KILN_OP_RELU] = s_relu,
	[KILN_OP_SIGMOID] = s_sigmoid, [KILN_OP_CLIP] = s_clip,
	[KILN_OP_CAST] = s_cast,
	[KILN_OP_ADD] = s_binary, [KILN_OP_SUB] = s_binary, [KILN_OP_MUL] = s_binary,
	[KILN_OP_DIV] = s_binary, [KILN_OP_POW] = s_binary, [KILN_OP_MAX] = s_binary,
	[KILN_OP_MIN] = s_binary, [KILN_OP_EQUAL] = s_binary, [KILN_OP_LESS] = s_binary,
	[KILN_OP_GREATER] = s_binary, [KILN_OP_AND] = s_binary, [KILN_OP_OR] = s_binary,
	[KILN_OP_WHERE] = s_where,
	[KILN_OP_QUANTIZE_LINEAR] = s_quantize, [KILN_OP_DEQUANTIZE_LINEAR] = s_dequantize,
};

/* The table's entry, else the op's formula. */
static scal_fn scal_of(kiln_op op)
{
	return scal[op] ? scal[op] : s_formula;
}

/* An integer Div the interpreter refuses to run on a zero divisor: so does
 * the kernel (never fused, fusible below), checking every divisor first. */
static bool int_div_node(const kiln_graph *g, const ir_node *n)
{
	return n->op == KILN_OP_DIV && !kiln_dtype_is_float(g->val[n->out[0]]->type.dtype);
}

static kiln_status elementwise(cg_module *m, const ir_node *n, const int *in, const int *out,
                               kiln_error *err)
{
	if (n->nin > 4)
		return cg_lower_fail(m, n, err, KILN_EUNSUPPORTED, "%u operands (at most 4)", n->nin);
	cg_kernel *k = NULL;
	if (int_div_node(m->g, n) && !(k = cg_lower_kernel(m, n)))
		return cg_lower_fail(m, n, err, KILN_ENOMEM, "out of memory");
	for (uint32_t i = 1; k && i < n->nin; i++)
		cg_lower_check_all(m, k, n, "integer division by zero", in[i], m->buf[in[i]].numel,
		                   NULL, NULL, NULL);
	kiln_status st = elemwise(m, n, (int)n->nin, in, out[0], scal_of(n->op), false);
	return st ? cg_lower_fail(m, n, err, st, "out of memory") : KILN_OK;
}

static kiln_status expand(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err)
{
	kiln_status st = elemwise(m, n, 1, in, out[0], NULL, true);
	return st ? cg_lower_fail(m, n, err, st, "out of memory") : KILN_OK;
}

/* Views share their input's bytes; one that is a graph output (its buffer
 * not TEMP) is copied instead. */
static int root(const cg_module *m, int b)
{
	while (m->buf[b].alias >= 0)
		b = m->buf[b].alias;
	return b;
}

static kiln_status view(cg_module *m, const ir_node *n, const int *in, const int *out,
                        kiln_error *err)
{
	if (m->buf[out[0]].kind != CG_BUF_TEMP) {
		kiln_status st = cg_lower_copy(m, n, in[0], out[0], err);
		return st ? cg_lower_fail(m, n, err, st, "out of memory") : KILN_OK;
	}
	m->buf[out[0]].alias = root(m, in[0]);
	return KILN_OK;
}

/* ---- reductions ----------------------------------------------------------- */

/* Axes reduced by n over rank dims; *noop when the op is an identity. */
static bool reduced(const ir_node *n, int rank, bool *mask, bool *noop)
{
	const int64_t *axes;
	uint32_t na = ir_attr_ints(n, "axes", &axes);
	*noop = na == 0 && ir_attr_int(n, "noop_with_empty_axes", 0);
	for (int d = 0; d < rank; d++)
		mask[d] = na == 0;
	for (uint32_t k = 0; k < na; k++) {
		int64_t a = axes[k] < 0 ? axes[k] + rank : axes[k];
		if (a < 0 || a >= rank)
			return false;
		mask[a] = true;
	}
	return true;
}

/* The smallest (or largest) value of an integer dtype: Max and Min start there. */
static int64_t int_limit(kiln_dtype dt, bool hi)
{
	switch (dt) {
	case KILN_I8: return hi ? INT8_MAX : INT8_MIN;
	case KILN_U8: return hi ? UINT8_MAX : 0;
	case KILN_I32: return hi ? INT32_MAX : INT32_MIN;
	case KILN_I64: return hi ? INT64_MAX : INT64_MIN;
	default: return hi; /* bool */
	}
}

/* Start value of a reduction in dtype ct. */
static cg_expr *red_init(cg_module *m, kiln_op op, kiln_dtype ct)
{
	bool mx = op == KILN_OP_REDUCE_MAX, mn = op == KILN_OP_REDUCE_MIN;
	double one = op == KILN_OP_REDUCE_PROD;
	if (kiln_dtype_is_float(ct))
		return fc(m, ct, mx ? -INFINITY : mn ? INFINITY : one);
	cg_expr *e = fc(m, ct, one);
	if (e && (mx || mn))
		e->i = int_limit(ct, mn);
	return e;
}

static const cg_binop red_step[KILN_OP_COUNT] = {
	[KILN_OP_REDUCE_SUM] = CG_ADD, [KILN_OP_REDUCE_MEAN] = CG_ADD,
	[KILN_OP_REDUCE_MAX] = CG_MAX, [KILN_OP_REDUCE_MIN] = CG_MIN,
	[KILN_OP_REDUCE_PROD] = CG_MUL,
};

/* Groups x's dims by kept/reduced: kept groups index the output. */
typedef struct rgroups {
	int nk, nr;
	cg_expr *kext[KILN_MAX_RANK], *kst[KILN_MAX_RANK]; /* kept: extent, x stride */
	cg_expr *rext[KILN_MAX_RANK], *rst[KILN_MAX_RANK]; /* reduced */
	bool last_reduced; /* x's innermost (non-1) dim is reduced */
} rgroups;

static void rgroup(cg_module *m, const ir_type *x, const bool *mask, rgroups *g)
{
	int prev = -1;
	g->nk = g->nr = 0;
	g->last_reduced = false;
	for (int d = 0; d < x->rank; d++) {
		if (x->dim[d] == 1)
			continue;
		cg_expr **ext = mask[d] ? g->rext : g->kext, **st = mask[d] ? g->rst : g->kst;
		int *cnt = mask[d] ? &g->nr : &g->nk;
		if (prev == mask[d])
			ext[*cnt - 1] = cg_bin(m, CG_MUL, ext[*cnt - 1], cg_dim(m, x->dim[d]));
		else
			ext[(*cnt)++] = cg_dim(m, x->dim[d]);
		st[*cnt - 1] = cg_stride(m, x, d);
		prev = mask[d];
		g->last_reduced = mask[d];
	}
}

static kiln_status reduce(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	bool mask[KILN_MAX_RANK], noop;
	if (!reduced(n, x->rank, mask, &noop))
		return cg_lower_fail(m, n, err, KILN_EINVAL, "axis out of range for rank %d", x->rank);
	if (noop)
		return cg_lower_copy(m, n, in[0], out[0], err);
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	rgroups g;
	rgroup(m, x, mask, &g);
	kiln_dtype ct = cg_ctype(m->buf[in[0]].dt);
	cg_expr *kv[KILN_MAX_RANK], *rv[KILN_MAX_RANK], *kst_out[KILN_MAX_RANK];
	uint32_t kh[KILN_MAX_RANK] = {0}, rh[KILN_MAX_RANK];
	if (g.nk)
		kh[0] = cg_par(m, m->buf[in[0]].numel);
	for (int d = 0; d < g.nr; d++)
		rh[d] = CG_REDUCE | (d == g.nr - 1 && g.last_reduced ? CG_VECTORIZE : 0);
	if (g.nk && !g.last_reduced)
		kh[g.nk - 1] |= g.nr ? 0 : CG_VECTORIZE;
	for (int d = g.nk - 1; d >= 0; d--) /* the output is the kept groups, row-major */
		kst_out[d] = d == g.nk - 1 ? cg_int(m, 1) : cg_bin(m, CG_MUL, kst_out[d + 1], g.kext[d + 1]);
	/* f32 sums accumulate in f64: a training step's BatchNorm statistics
	 * and gradient sums run over a whole batch, and PyTorch's CPU kernels
	 * sum those in double too (the CNN parity in docs/TRAINING.md) */
	kiln_dtype at = ct == KILN_F32 && red_step[n->op] == CG_ADD ? KILN_F64 : ct;
	cg_stmt *outer = cg_nest(m, k, k->body, g.nk, g.kext, kh, kv);
	cg_expr *acc = cg_local(m, k, outer, at, red_init(m, n->op, at));
	cg_stmt *inner = cg_nest(m, k, outer, g.nr, g.rext, rh, rv);
	cg_expr *xi = cg_bin(m, CG_ADD, dot(m, g.nk, kv, g.kst), dot(m, g.nr, rv, g.rst));
	cg_set(m, inner, acc, cg_bin(m, red_step[n->op], acc, cg_cast(m, cg_ld(m, in[0], xi), at)));
	cg_expr *res = acc;
	if (n->op == KILN_OP_REDUCE_MEAN) {
		cg_expr *cnt = cg_int(m, 1);
		for (int d = 0; d < g.nr; d++)
			cnt = cg_bin(m, CG_MUL, cnt, g.rext[d]);
		res = cg_bin(m, CG_DIV, acc, cg_cast(m, cnt, at));
	}
	cg_append(m, outer, cg_st(m, out[0], dot(m, g.nk, kv, kst_out), cg_cast(m, res, ct)));
	return outer->n ? KILN_OK : KILN_ENOMEM;
}

/* ArgMax keeps the first maximum (or the last with select_last_index); NaN
 * beats any number, as in the interpreter.  Not reassociable: no hint. */
static kiln_status argmax(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	int64_t axis = ir_attr_int(n, "axis", 0);
	axis = axis < 0 ? axis + x->rank : axis;
	if (axis < 0 || axis >= x->rank)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "axis out of range for rank %d", x->rank);
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	bool last = ir_attr_int(n, "select_last_index", 0), fl = kiln_dtype_is_float(x->dtype);
	kiln_dtype ct = cg_ctype(x->dtype);
	cg_expr *ext[2] = {cg_prod(m, x, 0, (int)axis), cg_prod(m, x, (int)axis + 1, x->rank)};
	cg_expr *len = cg_dim(m, x->dim[axis]), *iv[2], *j;
	uint32_t h[2] = {cg_par(m, m->buf[in[0]].numel), 0};
	cg_stmt *body = cg_nest(m, k, k->body, 2, ext, h, iv), *jb;
	cg_expr *base = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[0], cg_bin(m, CG_MUL, len, ext[1])), iv[1]);
	cg_expr *best = cg_local(m, k, body, KILN_I64, cg_int(m, 0));
	cg_expr *bv = cg_local(m, k, body, ct, cg_ld(m, in[0], cg_bin(m, CG_ADD, base, cg_int(m, 0))));
	cg_append(m, body, cg_loop(m, k, len, 0, &j, &jb));
	cg_expr *v = cg_local(m, k, jb, ct, cg_ld(m, in[0], cg_bin(m, CG_ADD, base,
	                                                         cg_bin(m, CG_MUL, j, ext[1]))));
	cg_expr *more = cg_bin(m, CG_GT, v, bv);
	if (fl) /* NaN wins over a number */
		more = cg_bin(m, CG_OR, more, cg_bin(m, CG_AND, cg_bin(m, CG_NE, v, v),
		                                     cg_bin(m, CG_EQ, bv, bv)));
	if (last)
		more = cg_bin(m, CG_OR, more, cg_bin(m, CG_EQ, v, bv));
	cg_set(m, jb, best, cg_select(m, more, j, best));
	cg_set(m, jb, bv, cg_select(m, more, v, bv));
	cg_append(m, body, cg_st(m, out[0], cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[0], ext[1]), iv[1]),
	                         best));
	return KILN_OK;
}

/* ---- data movement --------------------------------------------------------- */

/* Columns of the source per CG_TRANSPOSE of a Transpose's plane: the
 * (outer index, chunk) pairs go over the pool. */
enum { TRANSPOSE_CHUNK = 256 };

/* A Transpose whose innermost output dimension group a is not the input's
 * contiguous one (group b, input stride 1): as a loop nest its inner loop
 * gathers (attention's K^T: 64 floats 16 KiB apart per output row, 0.73 of
 * the bench transformer's 17 ms at batch 16).  Instead, per index of the
 * other groups and per TRANSPOSE_CHUNK of b, the plane of a x b moves as
 * CG_TRANSPOSE (W x W blocks in registers): dst[j*ys_b + i] =
 * src[i*xs_a + j].  Groups (ext, input strides xs, output strides ys) as
 * transpose() makes them; false (nothing added) when it does not apply. */
static bool transpose_blocks(cg_module *m, cg_kernel *k, int src, int dst, int ng, cg_expr **ext,
                             cg_expr **xs, cg_expr **ys)
{
	int a = ng - 1, b = -1;
	for (int g = 0; g < a; g++)
		if (xs[g]->kind == CG_CONST && xs[g]->i == 1)
			b = g;
	if (ng < 2 || b < 0 || ys[a]->kind != CG_CONST || ys[a]->i != 1 ||
	    (ext[a]->kind == CG_CONST && ext[a]->i < 8) || (ext[b]->kind == CG_CONST && ext[b]->i < 8))
		return false;
	cg_expr *oext[KILN_MAX_RANK], *iv[KILN_MAX_RANK];
	int og[KILN_MAX_RANK], no = 0;
	for (int g = 0; g < a; g++)
		if (g != b)
			og[no] = g, oext[no++] = ext[g];
	cg_expr *chunk = cg_int(m, TRANSPOSE_CHUNK);
	oext[no] = cg_bin(m, CG_DIV, cg_bin(m, CG_ADD, ext[b], cg_int(m, TRANSPOSE_CHUNK - 1)), chunk);
	uint32_t h[KILN_MAX_RANK] = {cg_par(m, m->buf[dst].numel)};
	cg_stmt *body = cg_nest(m, k, k->body, no + 1, oext, h, iv);
	cg_expr *j0 = cg_bin(m, CG_MUL, iv[no], chunk);
	cg_expr *so = j0, *dof = cg_bin(m, CG_MUL, j0, ys[b]);
	for (int g = 0; g < no; g++) {
		so = cg_bin(m, CG_ADD, so, cg_bin(m, CG_MUL, iv[g], xs[og[g]]));
		dof = cg_bin(m, CG_ADD, dof, cg_bin(m, CG_MUL, iv[g], ys[og[g]]));
	}
	cg_transpose t = {.src = src, .dst = dst, .rows = ext[a],
	                  .cols = cg_bin(m, CG_MIN, chunk, cg_bin(m, CG_SUB, ext[b], j0)),
	                  .src_off = so, .src_rs = xs[a], .dst_off = dof, .dst_rs = ys[b]};
	cg_append(m, body, cg_transpose_stmt(m, &t));
	return true;
}

/* Output dims d and d+1 merge when they are adjacent in the input too. */
static kiln_status transpose(cg_module *m, const ir_node *n, const int *in, const int *out,
                             kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *y = cg_btype(m, out[0]);
	const int64_t *perm;
	uint32_t np = ir_attr_ints(n, "perm", &perm);
	int p[KILN_MAX_RANK], ng = 0;
	for (int d = 0; d < x->rank; d++)
		p[d] = np ? (int)(perm[d] < 0 ? perm[d] + x->rank : perm[d]) : x->rank - 1 - d;
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *ext[KILN_MAX_RANK], *xs[KILN_MAX_RANK], *ys[KILN_MAX_RANK], *iv[KILN_MAX_RANK];
	int prevp = -2;
	for (int d = 0; d < y->rank; d++) {
		if (y->dim[d] == 1)
			continue;
		if (ng && p[d] == prevp + 1) {
			ext[ng - 1] = cg_bin(m, CG_MUL, ext[ng - 1], cg_dim(m, y->dim[d]));
		} else {
			ext[ng++] = cg_dim(m, y->dim[d]);
		}
		xs[ng - 1] = cg_stride(m, x, p[d]);
		ys[ng - 1] = cg_stride(m, y, d);
		prevp = p[d];
	}
	uint32_t h[KILN_MAX_RANK] = {0}; /* nest_hints fills n; gcc -O3 cannot see it */
	if (x->dtype == KILN_F32 && y->dtype == KILN_F32 &&
	    transpose_blocks(m, k, in[0], out[0], ng, ext, xs, ys))
		return k->body->n ? KILN_OK : KILN_ENOMEM;
	nest_hints(m, ng, m->buf[out[0]].numel, h);
	cg_stmt *body = cg_nest(m, k, k->body, ng, ext, h, iv);
	cg_append(m, body, cg_store(m, out[0], dot(m, ng, iv, ys),
	                            cg_load(m, in[0], dot(m, ng, iv, xs))));
	return KILN_OK;
}

/* Concat and Split move [axis..] blocks: per outer index, piece k holds
 * dim_k * inner contiguous elements at offset at_k * inner of the whole. */
/* Elements per chunk of a Concat's or Split's copy over the pool (about
 * 64 KiB: a dispatch costs about a microsecond). */
enum { BLOCK_CHUNK = 16384 };

static kiln_status blocks(cg_module *m, const ir_node *n, int whole, const int *parts,
                          int nparts, bool split, kiln_error *err)
{
	const ir_type *w = cg_btype(m, whole);
	int64_t axis = ir_attr_int(n, "axis", 0);
	axis = axis < 0 ? axis + w->rank : axis;
	if (axis < 0 || axis >= w->rank)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "axis out of range for rank %d", w->rank);
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *outer = cg_prod(m, w, 0, (int)axis), *inner = cg_prod(m, w, (int)axis + 1, w->rank);
	cg_expr *wrow = cg_bin(m, CG_MUL, cg_dim(m, w->dim[axis]), inner), *at = cg_int(m, 0);
	for (int p = 0; p < nparts; p++) {
		cg_expr *plen = cg_dim(m, cg_btype(m, parts[p] >= 0 ? parts[p] : whole)->dim[axis]);
		cg_expr *prow = cg_bin(m, CG_MUL, plen, inner), *iv[2];
		if (parts[p] >= 0) {
			/* rows of the part cut into chunks of BLOCK_CHUNK elements or
			 * more, the (row, chunk) pairs over the pool: with one row
			 * (a batch of 1) the copy would otherwise run on one thread */
			int64_t len = prow->kind == CG_CONST ? prow->i : 0;
			int64_t nch = len >= 2 * BLOCK_CHUNK ? len / BLOCK_CHUNK : 1;
			int64_t chunk = (len + nch - 1) / nch;
			cg_expr *q, *c;
			cg_stmt *qb, *body;
			cg_append(m, k->body, cg_loop(m, k, cg_bin(m, CG_MUL, outer, cg_int(m, nch)),
			                              cg_par(m, cg_bin(m, CG_MUL, outer, prow)), &q, &qb));
			iv[0] = nch > 1 ? cg_bin(m, CG_DIV, q, cg_int(m, nch)) : q;
			cg_expr *c0 = nch > 1 ? cg_bin(m, CG_MUL, cg_bin(m, CG_REM, q, cg_int(m, nch)),
			                                   cg_int(m, chunk)) : cg_int(m, 0);
			cg_expr *clen = nch > 1 ? cg_bin(m, CG_MIN, cg_int(m, chunk),
			                                 cg_bin(m, CG_SUB, prow, c0)) : prow;
			cg_append(m, qb, cg_loop(m, k, clen, CG_VECTORIZE, &c, &body));
			iv[1] = cg_bin(m, CG_ADD, c0, c);
			cg_expr *wi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[0], wrow),
			                     cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, at, inner), iv[1]));
			cg_expr *pi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[0], prow), iv[1]);
			cg_append(m, body, split ? cg_store(m, parts[p], pi, cg_load(m, whole, wi))
			                         : cg_store(m, whole, wi, cg_load(m, parts[p], pi)));
		}
		at = cg_bin(m, CG_ADD, at, plen);
	}
	return KILN_OK;
}

static kiln_status concat(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err)
{
	return blocks(m, n, out[0], in, (int)n->nin, false, err);
}

/* Unused outputs arrive as -1 and are skipped. */
static kiln_status split(cg_module *m, const ir_node *n, const int *in, const int *out,
                         kiln_error *err)
{
	if (out[0] < 0)
		return KILN_OK;
	return blocks(m, n, in[0], out, (int)n->nout, true, err);
}

/* Per axis the first index (starts clamped as the interpreter does) and
 * step; the output shape gives the count. */
static kiln_status slice(cg_module *m, const ir_node *n, const int *in, const int *out,
                         kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *y = cg_btype(m, out[0]);
	const int64_t *starts, *ends, *axes, *steps;
	uint64_t sd, ed;
	uint32_t ns = ir_attr_dims(n, "starts", &starts, &sd), na = ir_attr_ints(n, "axes", &axes);
	uint32_t nst = ir_attr_ints(n, "steps", &steps), ne = ir_attr_dims(n, "ends", &ends, &ed);
	cg_expr *first[KILN_MAX_RANK], *ext[KILN_MAX_RANK], *iv[KILN_MAX_RANK];
	int64_t step[KILN_MAX_RANK];
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	for (int d = 0; d < x->rank; d++)
		first[d] = cg_int(m, 0), step[d] = 1, ext[d] = cg_dim(m, y->dim[d]);
	for (uint32_t k2 = 0; k2 < ns; k2++) {
		int64_t a = na ? axes[k2] : (int64_t)k2;
		a = a < 0 ? a + x->rank : a;
		if (a < 0 || a >= x->rank || (nst && steps[k2] == 0) || ne != ns || (sd >> k2 & 1))
			return cg_lower_fail(m, n, err, KILN_EINVAL, "bad axis, zero step or symbolic "
			                     "start at %u", k2);
		cg_expr *dim = cg_dim(m, x->dim[a]), *s = cg_int(m, starts[k2]);
		step[a] = nst ? steps[k2] : 1;
		if (ed >> k2 & 1) { /* [0:E:1], E a dim: the shape rule took E <= dim */
			char what[160], e[96];
			snprintf(what, sizeof what, "axis %lld end %s =", (long long)a,
			         ir_dim_str(m->g, ends[k2], e, sizeof e));
			cg_append(m, k->body, cg_lower_check(m, n, what, cg_dim(m, ends[k2]),
			                                     cg_int(m, 0), cg_bin(m, CG_ADD, dim,
			                                                          cg_int(m, 1))));
		}
		if (starts[k2] < 0)
			s = cg_bin(m, CG_ADD, s, dim);
		cg_expr *hi = step[a] > 0 ? dim : cg_bin(m, CG_SUB, dim, cg_int(m, 1));
		first[a] = cg_bin(m, CG_MAX, cg_bin(m, CG_MIN, s, hi), cg_int(m, 0));
	}
	uint32_t h[KILN_MAX_RANK] = {0}; /* nest_hints fills n; gcc -O3 cannot see it */
	nest_hints(m, x->rank, m->buf[out[0]].numel, h);
	cg_stmt *body = cg_nest(m, k, k->body, x->rank, ext, h, iv);
	cg_expr *xi = cg_int(m, 0), *yi = cg_int(m, 0);
	for (int d = 0; d < x->rank; d++) {
		cg_expr *j = cg_bin(m, CG_ADD, first[d], cg_bin(m, CG_MUL, iv[d], cg_int(m, step[d])));
		xi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, xi, cg_dim(m, x->dim[d])), j);
		yi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, yi, ext[d]), iv[d]);
	}
	cg_append(m, body, cg_store(m, out[0], yi, cg_load(m, in[0], xi)));
	return KILN_OK;
}

/* Range: start + i * delta in double, as the interpreter computes it, then
 * converted to the output's dtype; the length is the output's (n). */
static kiln_status range(cg_module *m, const ir_node *n, const int *in, const int *out,
                         kiln_error *err)
{
	const ir_type *y = cg_btype(m, out[0]);
	cg_kernel *k = cg_lower_kernel(m, n);
	(void)in, (void)err;
	if (!k)
		return KILN_ENOMEM;
	cg_expr *ext = cg_dim(m, y->dim[0]), *iv;
	uint32_t h = CG_VECTORIZE;
	cg_stmt *body = cg_nest(m, k, k->body, 1, &ext, &h, &iv);
	cg_expr *v = cg_bin(m, CG_ADD, cg_const(m, KILN_F64, ir_attr_float(n, "start", 0)),
	                    cg_bin(m, CG_MUL, cg_cast(m, iv, KILN_F64),
	                           cg_const(m, KILN_F64, ir_attr_float(n, "delta", 1))));
	cg_append(m, body, cg_store(m, out[0], iv, cg_cast(m, v, y->dtype)));
	return KILN_OK;
}

/* Gather: negative indices count from the end.  Every index is checked
 * against [-dim, dim) first (cg_lower_check_all: the interpreter's error;
 * the copy loops stay free of branches), and then used clamped into
 * [0, dim), so even a failing run never reads outside the data. */
static kiln_status gather(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	int64_t axis = ir_attr_int(n, "axis", 0);
	axis = axis < 0 ? axis + x->rank : axis;
	if (axis < 0 || axis >= x->rank || kiln_dtype_is_float(m->buf[in[1]].dt))
		return cg_lower_fail(m, n, err, KILN_EINVAL, "bad axis or non-integer indices");
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *dim = cg_dim(m, x->dim[axis]), *ni = m->buf[in[1]].numel;
	char what[64];
	snprintf(what, sizeof what, "axis %lld index", (long long)axis);
	cg_lower_check_all(m, k, n, what, in[1], ni, cg_bin(m, CG_SUB, cg_int(m, 0), dim), dim,
	                   NULL);
	cg_expr *ext[3] = {cg_prod(m, x, 0, (int)axis), ni, cg_prod(m, x, (int)axis + 1, x->rank)};
	uint32_t h[3] = {cg_par(m, m->buf[out[0]].numel), 0, CG_VECTORIZE};
	cg_expr *iv[3];
	cg_stmt *body = cg_nest(m, k, k->body, 3, ext, h, iv);
	cg_expr *v = cg_cast(m, cg_load(m, in[1], iv[1]), KILN_I64);
	cg_expr *at = cg_select(m, cg_bin(m, CG_LT, v, cg_int(m, 0)), cg_bin(m, CG_ADD, v, dim), v);
	at = cg_clamp(m, at, dim);
	cg_expr *xi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, cg_bin(m, CG_ADD,
	                     cg_bin(m, CG_MUL, iv[0], dim), at), ext[2]), iv[2]);
	cg_expr *yi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, cg_bin(m, CG_ADD,
	                     cg_bin(m, CG_MUL, iv[0], ni), iv[1]), ext[2]), iv[2]);
	cg_append(m, body, cg_store(m, out[0], yi, cg_load(m, in[0], xi)));
	return KILN_OK;
}

/* GatherElements' and ScatterElements' walk over the indices: a nest over
 * their dims (par: the first loop's hint) in k; *ii is the indices' (and
 * the updates') linear index, *xi x's offset with the index on the axis
 * (negative from the end; checked against x's dim, then clamped). */
static cg_stmt *element_walk(cg_module *m, cg_kernel *k, const ir_node *n, int x, int idx,
                             int64_t axis, uint32_t par, cg_expr **ii, cg_expr **xi)
{
	const ir_type *xt = cg_btype(m, x), *it = cg_btype(m, idx);
	cg_expr *dim = cg_dim(m, xt->dim[axis]);
	char what[64];
	snprintf(what, sizeof what, "axis %lld index", (long long)axis);
	cg_lower_check_all(m, k, n, what, idx, m->buf[idx].numel,
	                   cg_bin(m, CG_SUB, cg_int(m, 0), dim), dim, NULL);
	int r = it->rank;
	cg_expr *ext[KILN_MAX_RANK] = {0}, *iv[KILN_MAX_RANK];
	uint32_t h[KILN_MAX_RANK] = {0};
	for (int d = 0; d < r; d++)
		ext[d] = cg_dim(m, it->dim[d]);
	h[0] = par;
	cg_stmt *body = cg_nest(m, k, k->body, r, ext, h, iv);
	*ii = cg_int(m, 0), *xi = cg_int(m, 0);
	for (int d = 0; d < r; d++)
		*ii = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, *ii, ext[d]), iv[d]);
	cg_expr *v = cg_cast(m, cg_load(m, idx, *ii), KILN_I64);
	cg_expr *at = cg_select(m, cg_bin(m, CG_LT, v, cg_int(m, 0)), cg_bin(m, CG_ADD, v, dim), v);
	at = cg_clamp(m, at, dim);
	for (int d = 0; d < r; d++)
		*xi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, *xi, cg_dim(m, xt->dim[d])),
		             d == axis ? at : iv[d]);
	return body;
}

/* The axis of a GatherElements or ScatterElements whose indices have x's
 * rank, or -1. */
static int64_t element_axis(cg_module *m, const ir_node *n, const int *in)
{
	const ir_type *x = cg_btype(m, in[0]), *ix = cg_btype(m, in[1]);
	int64_t axis = ir_attr_int(n, "axis", 0);
	axis = axis < 0 ? axis + x->rank : axis;
	return axis < 0 || axis >= x->rank || ix->rank != x->rank ||
	       kiln_dtype_is_float(m->buf[in[1]].dt) ? -1 : axis;
}

/* GatherElements: out[c] = x[c with the index on the axis]. */
static kiln_status gather_elements(cg_module *m, const ir_node *n, const int *in,
                                   const int *out, kiln_error *err)
{
	int64_t axis = element_axis(m, n, in);
	if (axis < 0)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "bad axis, indices or ranks");
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *ii, *xi;
	cg_stmt *body = element_walk(m, k, n, in[0], in[1], axis, cg_par(m, m->buf[out[0]].numel),
	                             &ii, &xi);
	cg_append(m, body, cg_store(m, out[0], ii, cg_load(m, in[0], xi)));
	return KILN_OK;
}

/* ---- TopK ------------------------------------------------------------------------- */

/* Per slice, k passes over the axis, each keeping the best element that
 * comes after the previous pass's pick in the order (value, then lower
 * index): branch-free selects, O(k n), fine for the small k models use. */
static kiln_status topk(cg_module *m, const ir_node *n, const int *in, const int *out,
                        kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	int64_t axis = ir_attr_int(n, "axis", -1), k = ir_attr_int(n, "k", 0);
	axis = axis < 0 ? axis + x->rank : axis;
	bool largest = ir_attr_int(n, "largest", 1) != 0;
	if (axis < 0 || axis >= x->rank || x->dim[axis] < 0)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "bad axis");
	cg_kernel *kr = cg_lower_kernel(m, n);
	if (!kr)
		return KILN_ENOMEM;
	kiln_dtype dt = x->dtype, ct = kiln_dtype_is_float(dt) ? dt : KILN_I64;
	cg_expr *len = cg_int(m, x->dim[axis]), *kk = cg_int(m, k);
	cg_expr *ext[2] = {cg_prod(m, x, 0, (int)axis), cg_prod(m, x, (int)axis + 1, x->rank)};
	uint32_t h[2] = {cg_par(m, m->buf[out[0]].numel), 0};
	cg_expr *iv[2], *j, *i;
	cg_stmt *slice = cg_nest(m, kr, kr->body, 2, ext, h, iv), *jb, *ib;
	cg_expr *pv = cg_local(m, kr, slice, ct, cg_const(m, ct, 0));
	cg_expr *pi = cg_local(m, kr, slice, KILN_I64, cg_int(m, -1));
	cg_append(m, slice, cg_loop(m, kr, kk, 0, &j, &jb));
	cg_expr *best = cg_local(m, kr, jb, ct, cg_const(m, ct, 0));
	cg_expr *bi = cg_local(m, kr, jb, KILN_I64, cg_int(m, -1));
	cg_append(m, jb, cg_loop(m, kr, len, 0, &i, &ib));
	cg_expr *xi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[0],
	                     len), i), ext[1]), iv[1]);
	cg_expr *v = cg_cast(m, cg_load(m, in[0], xi), ct), *zero = cg_int(m, 0);
	cg_binop past = largest ? CG_LT : CG_GT, beats = largest ? CG_GT : CG_LT;
	cg_expr *after = cg_bin(m, CG_OR, cg_bin(m, CG_LT, pi, zero),
	                        cg_bin(m, CG_OR, cg_bin(m, past, v, pv),
	                               cg_bin(m, CG_AND, cg_bin(m, CG_EQ, v, pv), cg_bin(m, CG_GT, i, pi))));
	cg_expr *better = cg_bin(m, CG_OR, cg_bin(m, CG_LT, bi, zero), cg_bin(m, beats, v, best));
	/* decided once, before best and bi change */
	cg_expr *take = cg_local(m, kr, ib, KILN_I64, cg_select(m, cg_bin(m, CG_AND, after, better),
	                                                        cg_int(m, 1), zero));
	take = cg_bin(m, CG_NE, take, zero);
	cg_set(m, ib, best, cg_select(m, take, v, best));
	cg_set(m, ib, bi, cg_select(m, take, i, bi));
	cg_expr *oi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[0],
	                     kk), j), ext[1]), iv[1]);
	cg_expr *src = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[0],
	                      len), cg_clamp(m, bi, len)), ext[1]), iv[1]);
	cg_append(m, jb, cg_store(m, out[0], oi, cg_load(m, in[0], src)));
	cg_append(m, jb, cg_store(m, out[1], oi, bi));
	cg_set(m, jb, pv, best);
	cg_set(m, jb, pi, bi);
	return KILN_OK;
}

/* ---- ScatterElements, ScatterND ---------------------------------------------------- */

/* out's element at oi given update u: u, or old + u, old * u. */
static cg_stmt *scatter_store(cg_module *m, const ir_node *n, int o, cg_expr *oi, cg_expr *u)
{
	const char *r = ir_attr_str(n, "reduction", "none");
	if (!strcmp(r, "add"))
		u = cg_bin(m, CG_ADD, cg_load(m, o, oi), u);
	else if (!strcmp(r, "mul"))
		u = cg_bin(m, CG_MUL, cg_load(m, o, oi), u);
	return cg_store(m, o, oi, u);
}

/* The kernel's first loop: out = x (the updates then land in order, on one
 * thread: with a reduction, repeated indices accumulate). */
static cg_kernel *scatter_copy(cg_module *m, const ir_node *n, const int *in, const int *out)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return NULL;
	cg_expr *numel = m->buf[out[0]].numel, *i;
	cg_stmt *body;
	cg_append(m, k->body, cg_loop(m, k, numel, cg_par(m, numel) | CG_VECTORIZE, &i, &body));
	cg_append(m, body, cg_store(m, out[0], i, cg_load(m, in[0], i)));
	return k;
}

static kiln_status scatter_elements(cg_module *m, const ir_node *n, const int *in,
                                    const int *out, kiln_error *err)
{
	int64_t axis = element_axis(m, n, in);
	if (axis < 0)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "bad axis, indices or ranks");
	cg_kernel *k = scatter_copy(m, n, in, out);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *ui, *oi; /* in order, on one thread */
	cg_stmt *body = element_walk(m, k, n, out[0], in[1], axis, 0, &ui, &oi);
	cg_append(m, body, scatter_store(m, n, out[0], oi, cg_load(m, in[2], ui)));
	return KILN_OK;
}

static kiln_status scatter_nd(cg_module *m, const ir_node *n, const int *in, const int *out,
                              kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *ix = cg_btype(m, in[1]);
	int64_t kk = ix->rank ? ix->dim[ix->rank - 1] : 0;
	if (kk < 1 || kk > x->rank)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "bad index length");
	cg_kernel *k = scatter_copy(m, n, in, out);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *q = cg_bin(m, CG_DIV, m->buf[in[1]].numel, cg_int(m, kk));
	cg_expr *s = cg_prod(m, x, (int)kk, x->rank), *qi, *si;
	cg_stmt *qb, *sb;
	cg_append(m, k->body, cg_loop(m, k, q, 0, &qi, &qb));
	cg_expr *base = cg_local(m, k, qb, KILN_I64, cg_int(m, 0));
	for (int64_t j = 0; j < kk; j++) {
		cg_expr *dim = cg_dim(m, x->dim[j]);
		cg_expr *v = cg_cast(m, cg_load(m, in[1], cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, qi,
		                     cg_int(m, kk)), cg_int(m, j))), KILN_I64);
		char what[64];
		snprintf(what, sizeof what, "index %lld", (long long)j);
		cg_append(m, qb, cg_lower_check(m, n, what, v, cg_bin(m, CG_SUB, cg_int(m, 0), dim), dim));
		cg_expr *at = cg_clamp(m, cg_select(m, cg_bin(m, CG_LT, v, cg_int(m, 0)),
		                                    cg_bin(m, CG_ADD, v, dim), v), dim);
		cg_set(m, qb, base, cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, base, dim), at));
	}
	cg_append(m, qb, cg_loop(m, k, s, 0, &si, &sb));
	cg_expr *oi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, base, s), si);
	cg_expr *ui = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, qi, s), si);
	cg_append(m, sb, scatter_store(m, n, out[0], oi, cg_load(m, in[2], ui)));
	return KILN_OK;
}

/* Where padded coordinate j reads: reflect mirrors without repeating the
 * edge (period 2(dim-1)), edge clamps; dims of 1 behave as edge. */
static cg_expr *pad_src(cg_module *m, int mode, cg_expr *j, cg_expr *dim)
{
	if (mode == 2)
		return cg_clamp(m, j, dim);
	cg_expr *one = cg_int(m, 1), *two = cg_int(m, 2);
	cg_expr *per = cg_bin(m, CG_MAX, cg_bin(m, CG_MUL, two, cg_bin(m, CG_SUB, dim, one)), one);
	cg_expr *t = cg_bin(m, CG_REM, cg_bin(m, CG_ADD, cg_bin(m, CG_REM, j, per), per), per);
	cg_expr *r = cg_select(m, cg_bin(m, CG_LT, t, dim), t, cg_bin(m, CG_SUB, per, t));
	return cg_clamp(m, r, dim);
}

static kiln_status pad(cg_module *m, const ir_node *n, const int *in, const int *out,
                       kiln_error *err)
{
	static const char *const modes[] = {"constant", "reflect", "edge"};
	const ir_type *x = cg_btype(m, in[0]), *y = cg_btype(m, out[0]);
	const int64_t *pads;
	uint32_t np = ir_attr_ints(n, "pads", &pads);
	const char *ms = ir_attr_str(n, "mode", "constant");
	int mode = 0;
	while (mode < 3 && strcmp(ms, modes[mode]))
		mode++;
	if (mode == 3)
		return cg_lower_fail(m, n, err, KILN_EUNSUPPORTED, "pad mode '%s'", ms);
	if (np != 2 * (uint32_t)x->rank)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "pads has %u entries, need %d", np,
		                     2 * x->rank);
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *ext[KILN_MAX_RANK], *iv[KILN_MAX_RANK];
	for (int d = 0; d < y->rank; d++)
		ext[d] = cg_dim(m, y->dim[d]);
	uint32_t h[KILN_MAX_RANK] = {0}; /* nest_hints fills n; gcc -O3 cannot see it */
	nest_hints(m, y->rank, m->buf[out[0]].numel, h);
	cg_stmt *body = cg_nest(m, k, k->body, y->rank, ext, h, iv);
	cg_expr *xi = cg_int(m, 0), *yi = cg_int(m, 0), *inside = cg_const(m, KILN_BOOL, 1);
	for (int d = 0; d < x->rank; d++) {
		cg_expr *dim = cg_dim(m, x->dim[d]), *j = cg_bin(m, CG_SUB, iv[d], cg_int(m, pads[d]));
		if (pads[d] || pads[x->rank + d]) {
			inside = cg_bin(m, CG_AND, inside, cg_bin(m, CG_AND, cg_bin(m, CG_GE, j, cg_int(m, 0)),
			                                           cg_bin(m, CG_LT, j, dim)));
			j = mode ? pad_src(m, mode, j, dim) : cg_clamp(m, j, dim);
		}
		xi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, xi, dim), j);
		yi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, yi, ext[d]), iv[d]);
	}
	cg_expr *v = cg_load(m, in[0], xi);
	if (mode == 0)
		v = cg_select(m, inside, v, cg_cast(m, cg_const(m, KILN_F64, ir_attr_float(n, "value", 0)),
		                                    x->dtype));
	cg_append(m, body, cg_store(m, out[0], yi, v));
	return KILN_OK;
}

/* The dims of the input, as the symbols are bound at run time. */
static kiln_status shape(cg_module *m, const ir_node *n, const int *in, const int *out,
                         kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	int r = x->rank;
	int64_t start = ir_attr_int(n, "start", 0), end = ir_attr_int(n, "end", r);
	start = start < 0 ? start + r : start, end = end < 0 ? end + r : end;
	start = start < 0 ? 0 : start > r ? r : start;
	end = end < start ? start : end > r ? r : end;
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	for (int64_t d = start; d < end; d++)
		cg_append(m, k->body, cg_st(m, out[0], cg_int(m, d - start), cg_dim(m, x->dim[d])));
	return KILN_OK;
}

/* ---- DynamicQuantizeLinear ------------------------------------------------------ */

/* One pass for the range [min(x, 0), max(x, 0)] (NaNs take no part), the
 * scale and zero point as the interpreter computes them, then x quantized
 * to u8 with them. */
static kiln_status dynamic_quantize(cg_module *m, const ir_node *n, const int *in, const int *out,
                                    kiln_error *err)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return cg_lower_fail(m, n, err, KILN_ENOMEM, "out of memory");
	cg_expr *cnt = m->buf[in[0]].numel, *iv, *zero = fc(m, KILN_F32, 0);
	cg_stmt *b1, *b2;
	cg_expr *lo = cg_local(m, k, k->body, KILN_F32, zero);
	cg_expr *hi = cg_local(m, k, k->body, KILN_F32, zero);
	cg_append(m, k->body, cg_loop(m, k, cnt, CG_REDUCE, &iv, &b1));
	cg_expr *v = cg_ld(m, in[0], iv);
	cg_set(m, b1, lo, cg_select(m, cg_bin(m, CG_LT, v, lo), v, lo));
	cg_set(m, b1, hi, cg_select(m, cg_bin(m, CG_GT, v, hi), v, hi));
	cg_expr *range = cg_select(m, cg_bin(m, CG_EQ, hi, lo), fc(m, KILN_F32, 1),
	                           cg_bin(m, CG_SUB, hi, lo));
	cg_expr *s = cg_local(m, k, k->body, KILN_F32,
	                      cg_bin(m, CG_DIV, range, fc(m, KILN_F32, 255)));
	cg_expr *zf = cg_bin(m, CG_SUB, zero, cg_bin(m, CG_DIV, lo, s));
	cg_expr *zr = cg_select(m, cg_bin(m, CG_GT, zf, fc(m, KILN_F32, 255)), fc(m, KILN_F32, 255),
	                        cg_un(m, CG_ROUND, zf));
	cg_expr *z = cg_local(m, k, k->body, KILN_F32,
	                      cg_select(m, cg_bin(m, CG_GT, zf, zero), zr, zero));
	if (out[1] >= 0)
		cg_append(m, k->body, cg_st(m, out[1], cg_int(m, 0), s));
	if (n->nout > 2 && out[2] >= 0)
		cg_append(m, k->body, cg_st(m, out[2], cg_int(m, 0), z));
	cg_append(m, k->body, cg_loop(m, k, cnt, CG_VECTORIZE, &iv, &b2));
	cg_expr *q = cg_un(m, CG_ROUND, cg_bin(m, CG_DIV, cg_ld(m, in[0], iv), s));
	cg_append(m, b2, cg_st(m, out[0], iv, cg_bin(m, CG_ADD, q, z))); /* saturates */
	return KILN_OK;
}

/* ---- the table --------------------------------------------------------------- */

const cg_lower_fn cg_lower_table[KILN_OP_COUNT] = {
	[KILN_OP_NEG] = elementwise, [KILN_OP_ABS] = elementwise, [KILN_OP_EXP] = elementwise,
	[KILN_OP_LOG] = elementwise, [KILN_OP_SQRT] = elementwise,
	[KILN_OP_RECIPROCAL] = elementwise, [KILN_OP_FLOOR] = elementwise,
	[KILN_OP_CEIL] = elementwise, [KILN_OP_ROUND] = elementwise,
	[KILN_OP_SIN] = elementwise, [KILN_OP_COS] = elementwise,
	[KILN_OP_ATAN] = elementwise, [KILN_OP_ASIN] = elementwise, [KILN_OP_ACOS] = elementwise,
	[KILN_OP_RELU] = elementwise,
	[KILN_OP_SIGMOID] = elementwise, [KILN_OP_TANH] = elementwise,
	[KILN_OP_ERF] = elementwise, [KILN_OP_CLIP] = elementwise,
	[KILN_OP_NOT] = elementwise, [KILN_OP_CAST] = elementwise, [KILN_OP_IDENTITY] = view,
	[KILN_OP_ADD] = elementwise, [KILN_OP_SUB] = elementwise, [KILN_OP_MUL] = elementwise,
	[KILN_OP_DIV] = elementwise, [KILN_OP_POW] = elementwise, [KILN_OP_MAX] = elementwise,
	[KILN_OP_MIN] = elementwise, [KILN_OP_EQUAL] = elementwise, [KILN_OP_LESS] = elementwise,
	[KILN_OP_GREATER] = elementwise, [KILN_OP_AND] = elementwise, [KILN_OP_OR] = elementwise,
	[KILN_OP_WHERE] = elementwise,
	[KILN_OP_REDUCE_SUM] = reduce, [KILN_OP_REDUCE_MEAN] = reduce,
	[KILN_OP_REDUCE_MAX] = reduce, [KILN_OP_REDUCE_MIN] = reduce, [KILN_OP_ARGMAX] = argmax,
	[KILN_OP_REDUCE_PROD] = reduce,
	[KILN_OP_MATMUL] = cg_lower_matmul, [KILN_OP_GEMM] = cg_lower_gemm,
	[KILN_OP_CONV] = cg_lower_conv, [KILN_OP_CONV_TRANSPOSE] = cg_lower_conv_transpose,
	[KILN_OP_MAX_POOL] = cg_lower_pool, [KILN_OP_AVERAGE_POOL] = cg_lower_pool,
	[KILN_OP_GLOBAL_AVERAGE_POOL] = cg_lower_global_avg_pool,
	[KILN_OP_RNN] = cg_lower_rnn, [KILN_OP_GRU] = cg_lower_rnn, [KILN_OP_LSTM] = cg_lower_rnn,
	[KILN_OP_RESIZE] = cg_lower_resize, [KILN_OP_GRID_SAMPLE] = cg_lower_grid_sample,
	[KILN_OP_BATCH_NORM] = cg_lower_batch_norm, [KILN_OP_LAYER_NORM] = cg_lower_layer_norm,
	[KILN_OP_SOFTMAX] = cg_lower_softmax, [KILN_OP_LOG_SOFTMAX] = cg_lower_softmax,
	[KILN_OP_RESHAPE] = view, [KILN_OP_TRANSPOSE] = transpose, [KILN_OP_CONCAT] = concat,
	[KILN_OP_SPLIT] = split, [KILN_OP_SLICE] = slice, [KILN_OP_GATHER] = gather,
	[KILN_OP_GATHER_ELEMENTS] = gather_elements,
	[KILN_OP_SCATTER_ELEMENTS] = scatter_elements, [KILN_OP_SCATTER_ND] = scatter_nd,
	[KILN_OP_TOPK] = topk,
	[KILN_OP_FLATTEN] = view, [KILN_OP_SQUEEZE] = view, [KILN_OP_UNSQUEEZE] = view,
	[KILN_OP_EXPAND] = expand, [KILN_OP_PAD] = pad, [KILN_OP_SHAPE] = shape,
	[KILN_OP_CONSTANT] = NULL, /* a CONST buffer, made by the driver */
	[KILN_OP_RANGE] = range,
	[KILN_OP_DROPOUT] = cg_lower_dropout,
	[KILN_OP_SOFTMAX_CE] = cg_lower_loss, [KILN_OP_NLL_LOSS] = cg_lower_loss,
	[KILN_OP_QUANTIZE_LINEAR] = elementwise, [KILN_OP_DEQUANTIZE_LINEAR] = elementwise,
	[KILN_OP_DYNAMIC_QUANTIZE_LINEAR] = dynamic_quantize,
	[KILN_OP_MATMUL_INTEGER] = cg_lower_matmul_integer,
	[KILN_OP_CONV_INTEGER] = cg_lower_conv_integer,
	[KILN_OP_QLINEAR_MATMUL] = cg_lower_qlinear_matmul,
	[KILN_OP_QLINEAR_CONV] = cg_lower_qlinear_conv,
};

cg_lower_fn cg_lower_rule(kiln_op op)
{
	if (op >= KILN_OP_COUNT)
		return NULL;
	return cg_lower_table[op] ? cg_lower_table[op] : ir_scalar_table[op] ? elementwise : NULL;
}

/* ---- the driver ---------------------------------------------------------------- */

typedef struct lowering {
	cg_module *m;
	const kiln_graph *g;
	int *vbuf;      /* value id -> buffer */
	int *out_of;    /* value id -> graph output index it is written to directly, or -1 */
	kiln_error *err;
	bool fuse;      /* elementwise fusion on */
	bool *defer;    /* value id -> computed inline by its only reader (no buffer) */
	uint32_t bias_node; /* the Add last folded into a GEMM's bias (fuse_bias), or 0 */
	bool mutable_params; /* cg_lower_opts.mutable_params: parameters get no data */
} lowering;

static int value_buf(lowering *L, cg_buf_kind kind, uint32_t v)
{
	const ir_value *val = L->g->val[v];
	int b = cg_buf_new(L->m, kind, val->type.dtype, cg_prod(L->m, &val->type, 0, val->type.rank));
	if (b < 0)
		return -1;
	cg_buf *cb = &L->m->buf[b];
	cb->type = val->type;
	cb->value = v;
	cb->name = val->name ? ir_arena_strdup(L->m->arena, val->name) : NULL;
	L->vbuf[v] = b;
	return b;
}

/* ---- elementwise fusion ----------------------------------------------------- */

/* A tree of elementwise nodes is one kernel: its root is the node whose
 * result is stored, the other nodes are deferred (L->defer), each computed
 * inline where its only reader loads it, by expression substitution over
 * the root's loop nest.  Deferring needs the intermediate to have exactly
 * the reader's result shape, so no broadcast makes the kernel recompute it
 * (exp of a bias then added over an image stays its own small kernel); an
 * intermediate is rounded to its dtype in the expression (a cast there and
 * back), so f16 or integer chains give what separate kernels give.  The
 * leaves, the distinct buffers the tree reads, are all right-aligned
 * broadcasts of the root's result, so the one dimension grouping of
 * elemwise covers them.  At most CG_FUSE_MAX leaves: past that, the root's
 * deferred operands are stored by kernels of their own first. */

typedef struct tree {
	int n;
	int buf[CG_FUSE_MAX];   /* leaf buffers */
	cg_expr *ld[CG_FUSE_MAX]; /* their loads at the root's index */
} tree;

/* A per-axis QuantizeLinear or DequantizeLinear broadcasts its scale
 * differently from NumPy's rule the tree's leaves share: not fused. */
static bool fusible(const kiln_graph *g, const ir_node *n)
{
	ir_type qt;
	return cg_lower_rule(n->op) == elementwise && n->nout == 1 && n->nin <= 4 &&
	       !int_div_node(g, n) &&
	       !(n->nin > 1 && quant_axis_type(n, &g->val[n->in[0]]->type,
	                                       &g->val[n->in[1]]->type, &qt));
}

/* n's result can be computed inline by its only reader. */
static bool deferrable(const lowering *L, const ir_node *n)
{
	const ir_value *y = L->g->val[n->out[0]];
	if (y->nuse != 1 || L->out_of[n->out[0]] >= 0 || !fusible(L->g, y->uses[0]))
		return false;
	const ir_type *u = &L->g->val[y->uses[0]->out[0]]->type;
	if (u->rank != y->type.rank)
		return false;
	for (int d = 0; d < u->rank; d++)
		if (u->dim[d] != y->type.dim[d])
			return false;
	return true;
}

/* Adds the buffers n's tree reads to t; false past CG_FUSE_MAX. */
static bool leaves(const lowering *L, const ir_node *n, tree *t)
{
	for (uint32_t i = 0; i < n->nin; i++) {
		uint32_t v = n->in[i];
		if (L->defer[v]) {
			if (!leaves(L, L->g->val[v]->def, t))
				return false;
			continue;
		}
		int k = 0;
		while (k < t->n && t->buf[k] != L->vbuf[v])
			k++;
		if (k == t->n && t->n == CG_FUSE_MAX)
			return false;
		if (k == t->n)
			t->buf[t->n++] = L->vbuf[v];
	}
	return true;
}

/* The value of n at the root's index, in n's compute dtype. */
static cg_expr *tree_expr(const lowering *L, const ir_node *n, const tree *t)
{
	cg_module *m = L->m;
	cg_expr *a[4];
	for (uint32_t i = 0; i < n->nin; i++) {
		uint32_t v = n->in[i];
		kiln_dtype dt = L->g->val[v]->type.dtype;
		int k = 0;
		if (L->defer[v]) {
			cg_expr *e = tree_expr(L, L->g->val[v]->def, t);
			a[i] = cg_cast(m, cg_cast(m, e, dt), cg_ctype(dt));
			continue;
		}
		while (t->buf[k] != L->vbuf[v])
			k++;
		a[i] = t->ld[k];
	}
	kiln_dtype ct = cg_ctype(L->g->val[n->in[n->op == KILN_OP_WHERE ? 1 : 0]]->type.dtype);
	return scal_of(n->op)(m, n, a, ct);
}

/* "add_relu": the tree's ops in schedule order, for the kernel's name. */
static void tree_name(const lowering *L, const ir_node *n, char *buf, size_t size)
{
	for (uint32_t i = 0; i < n->nin; i++)
		if (L->defer[n->in[i]])
			tree_name(L, L->g->val[n->in[i]]->def, buf, size);
	size_t k = strlen(buf);
	if (k + 1 < size)
		snprintf(buf + k, size - k, "%s%s", k ? "_" : "", ir_op(n->op)->kir);
}

static kiln_status materialize(lowering *L, const ir_node *n);

/* The deferred subtree below n reading the most buffers within
 * CG_FUSE_MAX, into *best (with *most leaves). */
static void biggest(const lowering *L, const ir_node *n, const ir_node **best, int *most)
{
	for (uint32_t i = 0; i < n->nin; i++) {
		if (!L->defer[n->in[i]])
			continue;
		const ir_node *d = L->g->val[n->in[i]]->def;
		tree t = {0};
		if (leaves(L, d, &t) && t.n > *most)
			*best = d, *most = t.n;
		biggest(L, d, best, most);
	}
}

/* Fills t with root's leaves, first storing the biggest deferred subtree
 * that fits by a kernel of its own, as long as the tree reads too many
 * buffers (a chain of adds of 10 inputs splits into 8 and the rest). */
static kiln_status fit(lowering *L, const ir_node *root, tree *t)
{
	for (;;) {
		t->n = 0;
		if (leaves(L, root, t))
			return KILN_OK;
		const ir_node *best = NULL;
		int most = 0;
		biggest(L, root, &best, &most);
		if (!best) /* unreachable: one deferred node reads at most 4 */
			return cg_lower_fail(L->m, root, L->err, KILN_EUNSUPPORTED, "too many operands");
		kiln_status st = materialize(L, best);
		if (st)
			return st;
	}
}

/* Whether t, broadcast against out ([N, C, spatial...]), holds one value
 * per channel (and per image, or one for all): right-aligned, 1 or C at
 * out's channel dim, 1 or N at its batch dim, 1 elsewhere (a
 * squeeze-and-excitation's scale [N, C, 1, 1]). */
static bool per_channel(const ir_type *t, const ir_type *out)
{
	if (t->rank > out->rank || out->rank < 3)
		return false;
	for (int d = 0; d < out->rank; d++) {
		int j = d - (out->rank - t->rank);
		int64_t v = j >= 0 ? t->dim[j] : 1;
		if (v != 1 && !(d < 2 && v == out->dim[d]))
			return false;
	}
	return true;
}

/* Whether type t holds one element (a scalar operand, broadcast alike
 * over any layout). */
static bool one_element(const ir_type *t)
{
	for (int d = 0; d < t->rank; d++)
		if (t->dim[d] != 1)
			return false;
	return true;
}

/* One kernel storing root's tree (leaves in t) into buffer out. */
static kiln_status fused(lowering *L, const ir_node *root, int out, tree *t)
{
	cg_module *m = L->m;
	char name[64], ops[48] = "";
	tree_name(L, root, ops, sizeof ops);
	snprintf(name, sizeof name, "k%d_%s", m->nkern, ops);
	cg_kernel *k = cg_kernel_new(m, name, root->idx);
	if (!k)
		return cg_lower_fail(m, root, L->err, KILN_ENOMEM, "out of memory");
	const ir_type *ty[CG_FUSE_MAX];
	for (int i = 0; i < t->n; i++)
		ty[i] = cg_btype(m, t->buf[i]);
	/* element by element, the result keeps its leaves' channel blocks
	 * (cg_buf.block; blocked_chain's ops): every other leaf a scalar or
	 * one value per channel (per_channel), read per block.  The SE Mul
	 * blocked (EfficientNet-B0, its depthwise convs' results in blocks for
	 * the project convs, bench/ab.py --nodes, 7 rounds, batch 1, one
	 * thread): 9.49 -> 9.16 ms of kernels; MobileNetV3-Large 4.66 -> 4.53.
	 * Its pixels' 16-channel vectors as loops of 16 took MobileNetV3-Small's
	 * HardSwish kernels from 0.008 to 0.03 ms: where no leaf is per channel
	 * the nest stays flat */
	int blk = 0;
	bool chan = false; /* a leaf per channel */
	for (int i = 0; i < t->n; i++)
		blk = cg_buf_block(m, t->buf[i]) ? cg_buf_block(m, t->buf[i]) : blk;
	for (int i = 0; blk && i < t->n; i++)
		chan = chan || (cg_buf_block(m, t->buf[i]) != blk && !one_element(ty[i]));
	groups gr;
	const ir_type *ot = cg_btype(m, out);
	uint32_t h[KILN_MAX_RANK] = {0}; /* nest_hints fills n; gcc -O3 cannot see it */
	if (chan) {
		if (ot->rank < 3 || ot->dim[1] % blk)
			return cg_lower_fail(m, root, L->err, KILN_EINVAL, "channel blocks of %d for a "
			                     "result of %lld channels (internal error)", blk,
			                     (long long)ot->dim[1]);
		/* [N][C / blk][spatial][blk], the vector of a pixel's blk channels
		 * emitted as one (CG_LANES: no loop of 16 with its alias checks) */
		cg_expr *sp = cg_prod(m, ot, 2, ot->rank), *C = cg_int(m, ot->dim[1]), *B = cg_int(m, blk);
		gr.n = 4;
		gr.ext[0] = cg_dim(m, ot->dim[0]), gr.ext[1] = cg_int(m, ot->dim[1] / blk);
		gr.ext[2] = sp, gr.ext[3] = B;
		h[1] = cg_par(m, m->buf[out].numel), h[3] = CG_VECTORIZE | CG_LANES;
		cg_expr *full[4] = {cg_bin(m, CG_MUL, C, sp), cg_bin(m, CG_MUL, B, sp), B, cg_int(m, 1)};
		for (int i = 0; i <= t->n; i++) {
			const ir_type *lt = i < t->n ? ty[i] : ot;
			bool whole = i == t->n || cg_buf_block(m, t->buf[i]) == blk;
			if (!whole && !one_element(lt) && !per_channel(lt, ot))
				return cg_lower_fail(m, root, L->err, KILN_EINVAL, "operand in channel "
				                     "blocks beside one that is not (internal error)");
			for (int d = 0; d < 4; d++)
				gr.st[i][d] = whole ? full[d] : cg_int(m, 0);
			if (whole || one_element(lt))
				continue;
			int off = ot->rank - lt->rank; /* per channel: its own strides */
			if (off <= 0 && lt->dim[0] != 1)
				gr.st[i][0] = cg_stride(m, lt, 0);
			if (1 - off >= 0 && lt->dim[1 - off] != 1) {
				cg_expr *cs = cg_stride(m, lt, 1 - off);
				gr.st[i][1] = cg_bin(m, CG_MUL, cs, B), gr.st[i][3] = cs;
			}
		}
	} else { /* blocks or not, every leaf laid out as the result or a scalar */
		group(m, ot, t->n, ty, &gr);
		nest_hints(m, gr.n, m->buf[out].numel, h);
	}
	cg_expr *iv[KILN_MAX_RANK];
	cg_stmt *body = cg_nest(m, k, k->body, gr.n, gr.ext, h, iv);
	for (int i = 0; i < t->n; i++)
		t->ld[i] = cg_ld(m, t->buf[i], dot(m, gr.n, iv, gr.st[i]));
	cg_stmt *s = cg_st(m, out, dot(m, gr.n, iv, gr.st[t->n]), tree_expr(L, root, t));
	if (!s)
		return cg_lower_fail(m, root, L->err, KILN_ENOMEM, "out of memory");
	cg_append(m, body, s);
	m->buf[out].block = blk;
	return KILN_OK;
}

/* A deferred node stored after all, by a kernel of its own. */
static kiln_status materialize(lowering *L, const ir_node *n)
{
	tree t;
	L->defer[n->out[0]] = false;
	kiln_status st = fit(L, n, &t);
	if (st)
		return st;
	int b = value_buf(L, CG_BUF_TEMP, n->out[0]);
	if (b < 0)
		return ir_seterr(L->err, KILN_ENOMEM, "cg_lower: out of memory");
	return fused(L, n, b, &t);
}

/* The GEMM that ends kernel k (maybe inside its loops), or NULL. */
static cg_gemm *last_gemm(const cg_kernel *k)
{
	const cg_stmt *s = k->body;
	while (s && (s->kind == CG_BLOCK || s->kind == CG_FOR))
		s = s->kind == CG_FOR ? s->body : s->n ? s->items[s->n - 1] : NULL;
	return s && s->kind == CG_GEMM ? s->gemm : NULL;
}

/* The GEMM of the last kernel when value v is its result (or a view of it
 * that an epilogue fold made) with one reader and no buffer of its own to
 * keep: *root gets C's buffer.  NULL otherwise. */
static cg_gemm *gemm_result(lowering *L, uint32_t v, int *root)
{
	cg_module *m = L->m;
	const ir_value *x = L->g->val[v];
	int xb = L->vbuf[v];
	if (x->type.dtype != KILN_F32 || x->nuse != 1 || !x->def || xb < 0 ||
	    m->buf[xb].kind != CG_BUF_TEMP || !m->nkern)
		return NULL;
	*root = m->buf[xb].alias >= 0 ? m->buf[xb].alias : xb;
	uint32_t last = m->kern[m->nkern - 1].node;
	if (last != x->def->idx && !(L->bias_node && L->bias_node == x->def->idx + 1))
		return NULL;
	cg_gemm *gm = last_gemm(&m->kern[m->nkern - 1]);
	return gm && gm->c == *root ? gm : NULL;
}

/* n's result becomes a view of buffer root (a GEMM's C that computes it). */
static bool view_of(lowering *L, const ir_node *n, int root)
{
	int b = value_buf(L, CG_BUF_TEMP, n->out[0]);
	if (b < 0)
		return false;
	L->m->buf[b].alias = root;
	return true;
}

/* A GEMM epilogue takes n's activation (Relu, or Clip with its bounds). */
static void gemm_take_act(cg_gemm *gm, const ir_node *n)
{
	gm->act = n->op == KILN_OP_RELU ? CG_ACT_RELU : CG_ACT_CLIP;
	if (n->op == KILN_OP_CLIP) {
		gm->act_lo = ir_attr_float(n, "min", -INFINITY);
		gm->act_hi = ir_attr_float(n, "max", INFINITY);
	}
}

/* Whether a GEMM epilogue can still take a residual: none yet, and
 * nothing applied after the product that the residual must precede. */
static bool gemm_residual_ok(const cg_gemm *gm)
{
	return !gm->has_residual && !gm->act && gm->beta == 0 && gm->acc_dt == KILN_F32 &&
	       !gm->c_block;
}

/* A GEMM epilogue adds buffer rb, laid out as C, before its activation. */
static void gemm_take_residual(cg_gemm *gm, int rb)
{
	gm->has_residual = gm->res_first = true;
	gm->residual = rb;
	gm->res_off = gm->c_off;
	gm->res_rs = gm->c_rs;
}

/* Relu or Clip (Relu6: any constant bounds) of an f32 GEMM's result, its
 * only use, folds into the GEMM's epilogue; the activation's result
 * becomes a view of the GEMM's output.  MobileNetV2's conv -> Clip(0, 6)
 * then writes its tensor once instead of writing, reading and rewriting. */
static bool fuse_act(lowering *L, const ir_node *n)
{
	int root;
	if ((n->op != KILN_OP_RELU && n->op != KILN_OP_CLIP) || L->out_of[n->out[0]] >= 0)
		return false;
	cg_gemm *gm = gemm_result(L, n->in[0], &root);
	if (!gm || gm->act || !view_of(L, n, root))
		return false;
	gemm_take_act(gm, n);
	return true;
}

/* What a fold does to each value a kernel stores into the folded buffer:
 * wrap it in an activation (n's rule), or add a residual buffer r at the
 * store's own index (same shape: the same linear index). */
typedef struct store_fold {
	const ir_node *act; /* Relu or Clip, or NULL */
	int residual;       /* >= 0: the buffer added */
} store_fold;

/* Applies f to every value kernel body s stores into buf. */
static void fold_stores(cg_module *m, cg_stmt *s, int buf, const store_fold *f)
{
	if (!s)
		return;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n; i++)
			fold_stores(m, s->items[i], buf, f);
		break;
	case CG_FOR: fold_stores(m, s->body, buf, f); break;
	case CG_IF:
		fold_stores(m, s->then_s, buf, f);
		fold_stores(m, s->else_s, buf, f);
		break;
	case CG_STORE:
		if (s->buf != buf)
			break;
		if (f->act)
			s->value = (f->act->op == KILN_OP_RELU ? s_relu : s_clip)(m, f->act, &s->value,
			                                                        KILN_F32);
		if (f->residual >= 0)
			s->value = cg_bin(m, CG_ADD, s->value, cg_load(m, f->residual, s->index));
		break;
	default: break;
	}
}

/* The kernel last lowered when value v, an f32 TEMP with one reader, is
 * (a view of) the buffer whose every store in it is final
 * (cg_kernel.final_buf: a depthwise conv, a Winograd conv); *root gets
 * that buffer.  NULL otherwise. */
static cg_kernel *final_result(lowering *L, uint32_t v, int *root)
{
	cg_module *m = L->m;
	const ir_value *x = L->g->val[v];
	int xb = L->vbuf[v];
	if (x->type.dtype != KILN_F32 || x->nuse != 1 || xb < 0 || m->buf[xb].kind != CG_BUF_TEMP ||
	    !m->nkern)
		return NULL;
	*root = m->buf[xb].alias >= 0 ? m->buf[xb].alias : xb;
	cg_kernel *k = &m->kern[m->nkern - 1];
	return k->final_buf == *root ? k : NULL;
}

/* Relu or Clip of a result whose kernel stores only final values, its
 * only use, folds into those stores (MobileNetV2's depthwise conv ->
 * Relu6; a Winograd conv -> Relu).  Grouped convs accumulate in y: not
 * those. */
static bool fuse_store_act(lowering *L, const ir_node *n)
{
	int root;
	if ((n->op != KILN_OP_RELU && n->op != KILN_OP_CLIP) || L->out_of[n->out[0]] >= 0)
		return false;
	cg_kernel *k = final_result(L, n->in[0], &root);
	cg_gemm *alt = k && k->alt >= 0 ? last_gemm(&L->m->kern[k->alt]) : NULL;
	if (!k || k->final_act || (k->alt >= 0 && (!alt || alt->c != root || alt->act)) ||
	    !view_of(L, n, root))
		return false;
	fold_stores(L->m, k->body, k->act_buf >= 0 ? k->act_buf : root,
	            &(store_fold){.act = n, .residual = -1});
	k->final_act = true;
	if (alt) /* the other algorithm's GEMM, as fuse_act does */
		gemm_take_act(alt, n);
	return true;
}

/* The residual Add of a ResNet block after such a kernel: as
 * fuse_residual does for a GEMM, x is added in the store path (before any
 * activation, which may fold after it). */
static bool fuse_store_residual(lowering *L, const ir_node *n)
{
	if (n->op != KILN_OP_ADD || L->out_of[n->out[0]] >= 0)
		return false;
	const ir_type *y = &L->g->val[n->out[0]]->type;
	for (int i = 0; i < 2; i++) {
		int root, rb = L->vbuf[n->in[1 - i]];
		const ir_type *x = &L->g->val[n->in[i]]->type, *r = &L->g->val[n->in[1 - i]]->type;
		cg_kernel *k = final_result(L, n->in[i], &root);
		cg_gemm *alt = k && k->alt >= 0 ? last_gemm(&L->m->kern[k->alt]) : NULL;
		if (!k || k->final_act || k->final_act_only || !ir_type_eq(x, y) || !ir_type_eq(r, y) || rb < 0 ||
		    L->defer[n->in[1 - i]] ||
		    (k->alt >= 0 && (!alt || alt->c != root || !gemm_residual_ok(alt))) ||
		    (L->m->buf[rb].alias >= 0 ? L->m->buf[rb].alias : rb) == root ||
		    !view_of(L, n, root))
			continue;
		fold_stores(L->m, k->body, root, &(store_fold){.act = NULL, .residual = rb});
		k->act_buf = -1; /* an activation now comes after the residual */
		if (alt) /* the other algorithm's GEMM, as fuse_residual does */
			gemm_take_residual(alt, rb);
		return true;
	}
	return false;
}

/* MatMul + Add of a vector along the last axis (a rank-3 Linear, as
 * PyTorch exports it) folds the vector into the GEMM as its bias per
 * column, so C is written once instead of written, read and rewritten;
 * a Relu or Clip after it then folds too (fuse_act). */
static bool fuse_bias(lowering *L, const ir_node *n)
{
	if (n->op != KILN_OP_ADD || L->out_of[n->out[0]] >= 0)
		return false;
	const ir_type *y = &L->g->val[n->out[0]]->type;
	for (int i = 0; i < 2; i++) {
		int root, bb = L->vbuf[n->in[1 - i]];
		const ir_type *x = &L->g->val[n->in[i]]->type, *b = &L->g->val[n->in[1 - i]]->type;
		cg_gemm *gm = gemm_result(L, n->in[i], &root);
		int64_t N = gm ? cg_expr_int(gm->N, NULL) : -1;
		if (!gm || gm->bias >= 0 || gm->act || gm->beta != 0 || !ir_type_eq(x, y) ||
		    bb < 0 || b->dtype != KILN_F32 || b->rank < 1 || b->rank > y->rank ||
		    N < 1 || b->dim[b->rank - 1] != N || y->dim[y->rank - 1] != N)
			continue;
		bool vec = true;
		for (int d = 0; d < b->rank - 1; d++)
			vec = vec && b->dim[d] == 1;
		if (!vec || !view_of(L, n, root))
			continue;
		gm->bias = bb;
		gm->bias_axis = 1;
		gm->bias_off = cg_int(L->m, 0);
		L->bias_node = n->idx + 1;
		return true;
	}
	return false;
}

/* n's input v as a float Constant of one element, into *c. */
static bool scalar_const(const kiln_graph *g, uint32_t v, double *c)
{
	const ir_value *x = g->val[v];
	const ir_attr *a = x->kind == IR_V_NODE && x->def && x->def->op == KILN_OP_CONSTANT
	                           ? ir_attr_get(x->def, "value") : NULL;
	if (!a || a->kind != IR_A_TENSOR || !kiln_dtype_is_float(a->u.t->dtype) ||
	    kiln_tensor_numel(a->u.t) != 1)
		return false;
	*c = ir_load(a->u.t, 0);
	return isfinite(*c) && *c != 0;
}

/* MatMul then Mul or Div by a scalar Constant (attention's scores /
 * sqrt(d)): the scalar folds into the GEMM's alpha, applied while A is
 * packed, so the scores are written once, already scaled.  Only a GEMM
 * with nothing after its product yet (no bias, activation or residual:
 * those would be scaled too). */
static bool fuse_scale(lowering *L, const ir_node *n)
{
	if ((n->op != KILN_OP_MUL && n->op != KILN_OP_DIV) || L->out_of[n->out[0]] >= 0)
		return false;
	const ir_type *y = &L->g->val[n->out[0]]->type;
	for (int i = 0; i < (n->op == KILN_OP_MUL ? 2 : 1); i++) {
		int root;
		double c;
		const ir_type *x = &L->g->val[n->in[i]]->type;
		if (!scalar_const(L->g, n->in[1 - i], &c) || !ir_type_eq(x, y))
			continue;
		cg_gemm *gm = gemm_result(L, n->in[i], &root);
		if (!gm || gm->bias >= 0 || gm->act || gm->has_residual || gm->beta != 0 ||
		    !view_of(L, n, root))
			continue;
		gm->alpha *= n->op == KILN_OP_DIV ? 1 / c : c;
		L->bias_node = n->idx + 1;
		return true;
	}
	return false;
}

/* The residual Add of a ResNet block, conv (+ bias) + x with x of the same
 * shape, folds into the conv's GEMM as a residual read in its store path
 * (before the activation, so a Relu after the Add then folds too:
 * fuse_act): the conv's output is written once and never re-read.  x is
 * an input of the Add, so it is computed before it; that it is computed
 * before the GEMM is gemm_result's test that the GEMM's kernel is the last
 * one lowered.  Only an exact shape match: no broadcast. */
static bool fuse_residual(lowering *L, const ir_node *n)
{
	if (n->op != KILN_OP_ADD || L->out_of[n->out[0]] >= 0)
		return false;
	const ir_type *y = &L->g->val[n->out[0]]->type;
	for (int i = 0; i < 2; i++) {
		int root, rb = L->vbuf[n->in[1 - i]];
		const ir_type *x = &L->g->val[n->in[i]]->type, *r = &L->g->val[n->in[1 - i]]->type;
		cg_gemm *gm = gemm_result(L, n->in[i], &root);
		if (!gm || !gemm_residual_ok(gm) || !ir_type_eq(x, y) ||
		    !ir_type_eq(r, y) || rb < 0 || L->defer[n->in[1 - i]] ||
		    (L->m->buf[rb].alias >= 0 ? L->m->buf[rb].alias : rb) == root ||
		    !view_of(L, n, root))
			continue;
		gemm_take_residual(gm, rb);
		L->bias_node = n->idx + 1;
		return true;
	}
	return false;
}

/* Buffers for n's results into out[]: OUTPUT for a graph output written in
 * place, else TEMP; -1 for an unused extra output (not computed). */
static kiln_status out_bufs(lowering *L, const ir_node *n, int *out)
{
	cg_module *m = L->m;
	for (uint32_t k = 0; k < n->nout; k++) {
		uint32_t v = n->out[k];
		int oi = L->out_of[v];
		out[k] = -1;
		if (k > 0 && L->g->val[v]->nuse == 0 && oi < 0)
			continue;
		out[k] = value_buf(L, oi >= 0 ? CG_BUF_OUTPUT : CG_BUF_TEMP, v);
		if (out[k] < 0)
			return ir_seterr(L->err, KILN_ENOMEM, "cg_lower: out of memory");
		if (oi >= 0) {
			m->buf[out[k]].io_index = oi;
			m->outputs[oi] = out[k];
		}
	}
	return KILN_OK;
}

/* The scales a quantization op reads that are only known at run time
 * (the verifier checks constant ones) are checked before it runs: each
 * must be positive and finite, or the run fails naming the node, as the
 * interpreter's does.  A scale computed inline by the op's reader (a
 * deferred elementwise result) has no buffer to check. */
static kiln_status check_scales(lowering *L, const ir_node *n)
{
	static const char *const qlin[3][3] = {
		{"y_scale", NULL, NULL}, {"x_scale", NULL, NULL}, {"x_scale", "w_scale", "y_scale"}};
	static const uint32_t at[3] = {1, 4, 6};
	int row = n->op == KILN_OP_QUANTIZE_LINEAR ? 0 : n->op == KILN_OP_DEQUANTIZE_LINEAR ? 1
	        : n->op == KILN_OP_QLINEAR_CONV || n->op == KILN_OP_QLINEAR_MATMUL ? 2 : -1;
	cg_module *m = L->m;
	for (int i = 0; row >= 0 && i < 3 && qlin[row][i]; i++) {
		uint32_t v = n->in[at[i]];
		const ir_value *sv = L->g->val[v];
		int b = L->vbuf[v];
		if (sv->kind == IR_V_PARAM || (sv->def && sv->def->op == KILN_OP_CONSTANT) || b < 0 ||
		    L->defer[v])
			continue;
		const char *what = qlin[row][i];
		if (n->op == KILN_OP_QLINEAR_MATMUL && i < 2)
			what = i ? "b_scale" : "a_scale";
		char msg[96];
		snprintf(msg, sizeof msg, "%s: a scale must be positive and finite", what);
		cg_kernel *k = cg_lower_kernel(m, n);
		cg_expr *j;
		cg_stmt *body;
		if (!k)
			return cg_lower_fail(m, n, L->err, KILN_ENOMEM, "out of memory");
		cg_append(m, k->body, cg_loop(m, k, m->buf[b].numel, 0, &j, &body));
		cg_expr *x = cg_ld(m, b, j);
		cg_expr *ok = cg_bin(m, CG_AND, cg_bin(m, CG_GT, x, cg_const(m, KILN_F32, 0)),
		                     cg_bin(m, CG_LT, x, cg_const(m, KILN_F32, INFINITY)));
		cg_append(m, body, cg_lower_check(m, n, msg, cg_cast(m, ok, KILN_I64), NULL, NULL));
		if (!body->n)
			return cg_lower_fail(m, n, L->err, KILN_ENOMEM, "out of memory");
	}
	return KILN_OK;
}

/* A Concat on the channels (axis 1) whose only reader takes its parts
 * where they lie is never stored: an inference BatchNormalization
 * (DenseNet's pre-activation dense layers: concat -> BN -> Relu -> conv;
 * cg_lower_bn_parts) or a 1x1 conv (SqueezeNet's fire modules: one GEMM
 * per part, cg_lower_conv_parts).  The features are then read once
 * instead of copied and read again.  The parts' channel counts must be
 * fixed. */
static bool concat_into_reader(const lowering *L, const ir_node *n)
{
	const ir_value *y = L->g->val[n->out[0]];
	if (!L->fuse || n->op != KILN_OP_CONCAT || y->nuse != 1 || L->out_of[n->out[0]] >= 0 ||
	    n->nin > CG_PARTS_MAX || y->type.rank < 2 || y->type.dtype != KILN_F32)
		return false;
	const ir_node *u = y->uses[0];
	int64_t axis = ir_attr_int(n, "axis", 0);
	if (u->in[0] != n->out[0] || (axis < 0 ? axis + y->type.rank : axis) != 1)
		return false;
	int nparts = 0;
	for (uint32_t i = 0; i < n->nin; i++)
		nparts += n->in[i] && L->g->val[n->in[i]]->type.dim[1] != 0;
	if (u->op == KILN_OP_BATCH_NORM ? ir_attr_int(u, "training_mode", 0) != 0
	                                : !cg_conv_parts_ok(L->g, u, nparts))
		return false;
	for (uint32_t i = 1; i < u->nin; i++)
		if (u->in[i] == n->out[0])
			return false;
	for (uint32_t i = 0; i < n->nin; i++)
		if (!n->in[i] || L->vbuf[n->in[i]] < 0 || L->g->val[n->in[i]]->type.dim[1] < 0)
			return false;
	return true;
}

/* The parts of the Concat concat_into_reader left unmaterialized. */
static void concat_parts(lowering *L, const ir_node *cat, cg_parts *x)
{
	int64_t at = 0;
	x->n = 0;
	for (uint32_t i = 0; i < cat->nin; i++) {
		int64_t len = L->g->val[cat->in[i]]->type.dim[1];
		if (len > 0) {
			x->buf[x->n] = L->vbuf[cat->in[i]], x->at[x->n] = at, x->len[x->n] = len;
			x->n++;
		}
		at += len;
	}
	x->C = cg_int(L->m, at);
}

/* Whether conv n's result y can be stored with its channels in blocks of
 * cb (cg_buf.block) for its readers: a chain of element-wise ops (Relu,
 * Clip, SiLU's Sigmoid and Mul, HardSwish), each of y's type and reading
 * only the chain's values, scalars and values of one per channel (a
 * squeeze-and-excitation's scale: per_channel), with global average pools
 * beside it (its squeeze, which reads the blocks), that ends in exactly one conv
 * taking blocks (end: cg_dw_blocked_ok after a 1x1 conv,
 * cg_conv_reads_blocked_ok after a depthwise one); no value of it a graph
 * output.  An element-wise kernel computes each element where it lies, so
 * the chain keeps the layout (fused); a Relu or Clip right after the conv
 * folds into its stores (fuse_act, fuse_store_act) as before. */
enum { BLOCKED_CHAIN_MAX = 8 };

typedef bool (*blocked_end)(const lowering *L, const ir_node *u, int64_t cb);
static bool blocked_chain(const lowering *L, const ir_node *n, int64_t cb, blocked_end end);

/* The ends of blocked_chain: a 1x1 conv reading blocks; a depthwise conv
 * reading them, of a shape that pays either way or that pays when it
 * also writes blocks for a 1x1 conv. */
static bool end_pointwise(const lowering *L, const ir_node *u, int64_t cb)
{
	return cg_conv_reads_blocked_ok(L->m, L->g, u, L->vbuf[u->in[1]], cb);
}

static bool end_depthwise(const lowering *L, const ir_node *u, int64_t cb)
{
	return cg_dw_blocked_ok(L->m, L->g, u, cb, false) || cg_dw_direct_ok(L->m, L->g, u, cb) ||
	       (cg_dw_blocked_ok(L->m, L->g, u, cb, true) && blocked_chain(L, u, cb, end_pointwise));
}

static bool blocked_chain(const lowering *L, const ir_node *n, int64_t cb, blocked_end end)
{
	const kiln_graph *g = L->g;
	uint32_t S[BLOCKED_CHAIN_MAX], ns = 0;
	int64_t pending = 0; /* readers of the chain's values not yet seen */
	const ir_node *dw = NULL;
	S[ns++] = n->out[0];
	pending += g->val[n->out[0]]->nuse;
	if (L->out_of[n->out[0]] >= 0)
		return false;
	for (uint32_t i = n->idx + 1; i < g->nnode && pending > 0; i++) {
		const ir_node *u = g->node[i];
		int reads = 0;
		for (uint32_t k = 0; k < u->nin; k++)
			for (uint32_t j = 0; j < ns; j++)
				reads += u->in[k] && u->in[k] == S[j];
		if (!reads)
			continue;
		pending -= reads;
		/* a global average pool reads the blocks (its result, one value
		 * per channel, is laid out the same either way) */
		if (u->op == KILN_OP_GLOBAL_AVERAGE_POOL && reads == 1 && L->out_of[u->out[0]] < 0 &&
		    g->val[u->in[0]]->type.dtype == KILN_F32 && g->val[u->in[0]]->type.rank == 4)
			continue;
		if (u->op == KILN_OP_CONV) {
			bool own = false;
			for (uint32_t j = 0; j < ns; j++)
				own = own || u->in[0] == S[j];
			if (dw || !own || reads != 1 || !end(L, u, cb))
				return false;
			dw = u;
			continue;
		}
		if (!fusible(g, u) || ns == BLOCKED_CHAIN_MAX || L->out_of[u->out[0]] >= 0 ||
		    !ir_type_eq(&g->val[u->out[0]]->type, &g->val[n->out[0]]->type))
			return false;
		for (uint32_t k = 0; k < u->nin; k++) {
			bool chain = false;
			for (uint32_t j = 0; u->in[k] && j < ns; j++)
				chain = chain || u->in[k] == S[j];
			if (u->in[k] && !chain && !one_element(&g->val[u->in[k]]->type) &&
			    !per_channel(&g->val[u->in[k]]->type, &g->val[n->out[0]]->type))
				return false;
		}
		S[ns++] = u->out[0];
		pending += g->val[u->out[0]]->nuse;
	}
	return dw && pending == 0;
}

static kiln_status lower_node(lowering *L, const ir_node *n)
{
	cg_module *m = L->m;
	int in[IR_VARIADIC + 1], out[IR_VARIADIC + 1];
	if (n->op == KILN_OP_CONSTANT) {
		const ir_attr *a = ir_attr_get(n, "value");
		int b = value_buf(L, CG_BUF_CONST, n->out[0]);
		if (b < 0)
			return ir_seterr(L->err, KILN_ENOMEM, "cg_lower: out of memory");
		m->buf[b].data = a && a->kind == IR_A_TENSOR ? a->u.t : NULL;
		return KILN_OK;
	}
	if (fuse_act(L, n) || fuse_store_act(L, n) || fuse_bias(L, n) || fuse_scale(L, n) ||
	    fuse_residual(L, n) ||
	    fuse_store_residual(L, n))
		return KILN_OK;
	if (!cg_lower_rule(n->op))
		return cg_lower_fail(m, n, L->err, KILN_EUNSUPPORTED, "no lowering for %s",
		                     ir_op(n->op)->onnx);
	kiln_status sc = check_scales(L, n);
	if (sc)
		return sc;
	if (concat_into_reader(L, n)) {
		L->defer[n->out[0]] = true;
		return KILN_OK;
	}
	bool fusing = L->fuse && fusible(L->g, n);
	if (fusing && deferrable(L, n)) {
		L->defer[n->out[0]] = true;
		return KILN_OK;
	}
	tree t;
	kiln_status st = fusing ? fit(L, n, &t) : KILN_OK;
	for (uint32_t k = 0; k < n->nin; k++)
		in[k] = n->in[k] ? L->vbuf[n->in[k]] : -1;
	if (!st)
		st = out_bufs(L, n, out);
	if (st)
		return st;
	/* channels in blocks (cg_buf.block): written by a 1x1 conv for the
	 * depthwise conv its chain of element-wise ops ends in (blocked_chain),
	 * kept by those ops (fused), read by nothing else */
	for (uint32_t k = 0; k < n->nin; k++)
		if (cg_buf_block(m, in[k]) && !fusing &&
		    (k || (n->op != KILN_OP_CONV && n->op != KILN_OP_GLOBAL_AVERAGE_POOL)))
			return cg_lower_fail(m, n, L->err, KILN_EINVAL, "input %u stored in channel "
			                     "blocks (internal error)", k);
	int64_t cb = m->panels.c_block;
	if (n->op == KILN_OP_CONV && L->fuse && cb && !L->defer[n->in[0]] &&
	    ((cg_conv_blocked_ok(m, L->g, n, in) && blocked_chain(L, n, cb, end_depthwise)) ||
	     (cg_grouped_blocked_ok(m, L->g, n, in) && blocked_chain(L, n, cb, end_pointwise)) ||
	     ((cg_dw_blocked_ok(m, L->g, n, cb, false) ||
	       (cg_buf_block(m, in[0]) && (cg_dw_blocked_ok(m, L->g, n, cb, true) ||
	                                   cg_dw_direct_ok(m, L->g, n, cb)))) &&
	      blocked_chain(L, n, cb, end_pointwise))))
		m->buf[out[0]].block = (int)cb;
	if ((n->op == KILN_OP_BATCH_NORM || n->op == KILN_OP_CONV) && L->defer[n->in[0]]) {
		cg_parts x;
		concat_parts(L, L->g->val[n->in[0]]->def, &x);
		st = n->op == KILN_OP_CONV ? cg_lower_conv_parts(m, n, &x, in, out, L->err)
		                           : cg_lower_bn_parts(m, n, &x, in, out, L->err);
	} else {
		st = fusing ? fused(L, n, out[0], &t) : cg_lower_rule(n->op)(m, n, in, out, L->err);
	}
	if (st == KILN_ENOMEM && L->err && !L->err->msg[0])
		cg_lower_fail(m, n, L->err, st, "out of memory");
	return st;
}

static kiln_status lower_io(lowering *L)
{
	cg_module *m = L->m;
	const kiln_graph *g = L->g;
	for (uint32_t i = 0; i < g->ninput; i++) {
		int b = value_buf(L, CG_BUF_INPUT, g->input[i]);
		if (b < 0)
			return KILN_ENOMEM;
		m->buf[b].io_index = (int)i;
		m->inputs[i] = b;
	}
	/* a parameter nothing reads (bnfold replaced it) is not embedded */
	bool *read = calloc(g->nval + 1, sizeof *read);
	if (!read)
		return KILN_ENOMEM;
	for (uint32_t i = 0; i < g->noutput; i++)
		read[g->output[i]] = true;
	for (uint32_t v = 1; v < g->nval; v++)
		if (g->val[v]->kind == IR_V_PARAM && (g->val[v]->nuse || read[v])) {
			int b = value_buf(L, CG_BUF_CONST, v);
			if (b < 0) {
				free(read);
				return KILN_ENOMEM;
			}
			m->buf[b].data = L->mutable_params ? NULL : g->val[v]->data;
		}
	free(read);
	/* the first listing of a node's result is written in place */
	for (uint32_t i = 0; i < g->noutput; i++) {
		uint32_t v = g->output[i];
		bool seen = false;
		for (uint32_t j = 0; j < i; j++)
			seen = seen || g->output[j] == v;
		if (!seen && g->val[v]->kind == IR_V_NODE && g->val[v]->def &&
		    g->val[v]->def->op != KILN_OP_CONSTANT)
			L->out_of[v] = (int)i;
	}
	return KILN_OK;
}

/* Outputs not written in place: copies of inputs, constants, repeats. */
static kiln_status lower_output_copies(lowering *L)
{
	cg_module *m = L->m;
	const kiln_graph *g = L->g;
	for (uint32_t i = 0; i < g->noutput; i++) {
		if (m->outputs[i] >= 0)
			continue;
		uint32_t v = g->output[i];
		int src = L->vbuf[v], dst = value_buf(L, CG_BUF_OUTPUT, v);
		if (dst < 0)
			return ir_seterr(L->err, KILN_ENOMEM, "cg_lower: out of memory");
		L->vbuf[v] = src;
		m->buf[dst].io_index = (int)i;
		m->outputs[i] = dst;
		kiln_status st = cg_lower_copy(m, NULL, src, dst, L->err);
		if (st)
			return st;
	}
	return KILN_OK;
}

static kiln_status lower_graph(lowering *L)
{
	cg_module *m = L->m;
	const kiln_graph *g = L->g;
	m->ninputs = (int)g->ninput;
	m->noutputs = (int)g->noutput;
	m->inputs = malloc((g->ninput + 1) * sizeof *m->inputs);
	m->outputs = malloc((g->noutput + 1) * sizeof *m->outputs);
	if (!m->inputs || !m->outputs || lower_io(L))
		return ir_seterr(L->err, KILN_ENOMEM, "cg_lower: out of memory");
	for (uint32_t i = 0; i < g->noutput; i++)
		m->outputs[i] = -1;
	for (uint32_t i = 0; i < g->nnode; i++) {
		if (g->node[i]->dead)
			continue;
		kiln_status st = lower_node(L, g->node[i]);
		if (st)
			return st;
	}
	return lower_output_copies(L);
}

kiln_status cg_lower_ex(const kiln_graph *g, const cg_lower_opts *o, cg_module **out,
                        kiln_error *err)
{
	if (!g || !out)
		return ir_seterr(err, KILN_EINVAL, "cg_lower: null argument");
	*out = NULL;
	kiln_status st = ir_verify(g, err);
	if (st)
		return st;
	lowering L = {cg_module_new(g), g, calloc(g->nval + 1, sizeof(int)),
	              calloc(g->nval + 1, sizeof(int)), err, o && o->fuse,
	              calloc(g->nval + 1, sizeof(bool)), 0, o && o->mutable_params};
	if (!L.m || !L.vbuf || !L.out_of || !L.defer)
		st = ir_seterr(err, KILN_ENOMEM, "cg_lower: out of memory");
	else
		L.m->conv = o ? o->conv : CG_CONV_AUTO;
	if (!st)
		L.m->par_work = o ? o->par_work : 0;
	if (!st && o && o->panels)
		L.m->panels = *o->panels;
	for (uint32_t v = 0; !st && v <= g->nval; v++)
		L.vbuf[v] = L.out_of[v] = -1;
	if (!st)
		st = lower_graph(&L);
	free(L.vbuf), free(L.out_of), free(L.defer);
	if (!st && cg_module_describe(L.m))
		st = ir_seterr(err, KILN_ENOMEM, "cg_lower: out of memory");
	if (st) {
		cg_module_free(L.m);
		return st;
	}
	*out = L.m;
	return KILN_OK;
}

kiln_status cg_lower(const kiln_graph *g, cg_module **out, kiln_error *err)
{
	return cg_lower_ex(g, NULL, out, err);
}
