/*
 * llvm.c: kernel IR -> LLVM IR through the LLVM-C API.
 *
 * Each cg_kernel becomes `void <name>(rt_exec *x)`, a thin wrapper that
 * loads the buffer pointers from x->buf and the sizes pointer from x->sym
 * and calls `<name>.impl`, which takes one noalias pointer per alias class
 * of buffers it touches and is always inlined: after inlining LLVM keeps
 * the noalias facts as scoped alias metadata, which is what lets loads be
 * hoisted and loops vectorized without runtime alias checks.  The sizes
 * are loaded once at the top of .impl, so loop bounds are SSA values that
 * stores cannot clobber.
 *
 * Loops are emitted rotated (guard, header with an i64 phi, latch), loop
 * variables are phis and CG_ASSIGN locals are allocas that mem2reg
 * promotes.  LLVM 14's C API cannot set fast-math flags, so a CG_REDUCE
 * loop that is also CG_VECTORIZE carries llvm.loop.vectorize.enable: a
 * forced loop is one whose floating-point reduction the vectorizer may
 * reorder; every other float operation stays exact IEEE.  exp, tanh and
 * erf on f32 are inline polynomial code (Cephes) rather than libm calls, so
 * softmax, sigmoid and GELU vectorize too; f64 calls libm.
 *
 * An outermost CG_PARALLEL loop whose body reads no variable from outside
 * itself is outlined into `<name>.par<k>(x, begin, end)` and run through
 * rt_parallel_for; any other parallel loop runs serially.  CG_GEMM is a
 * loop over the batch calling kiln_sgemm, CG_TRANSPOSE a call of
 * kiln_transpose (both llvm_gemm.c).
 *
 * Then come the numel and io_dims functions, from the buffers' numel and
 * dim expressions.  The library around the kernels (descriptions, entry
 * points, training tables) is llvm_lib.c's; what this backend takes
 * (cg_llvm_supports) is the last section here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/DebugInfo.h>

#include "codegen/llvm.h"
#include "runtime/model.h"

/* ---- types ---------------------------------------------------------------- */

/* f16 and bf16 are storage types: 16 bits in memory, f32 in registers,
 * rounded (nearest-even, as the interpreter's stores) when converted to or
 * stored as them; so their arithmetic is f32's, like a CPU without native
 * half arithmetic does it. */
static bool dt_half(kiln_dtype dt) { return dt == KILN_F16 || dt == KILN_BF16; }
static bool dt_float(kiln_dtype dt) { return dt == KILN_F32 || dt == KILN_F64 || dt_half(dt); }
static bool dt_unsigned(kiln_dtype dt) { return dt == KILN_U8 || dt == KILN_BOOL; }

static bool dt_ok(kiln_dtype dt)
{
	return dt_float(dt) || dt == KILN_I8 || dt == KILN_U8 || dt == KILN_I32 ||
	       dt == KILN_I64 || dt == KILN_BOOL;
}

/* The type of a value in registers (bool is i1). */
static LLVMTypeRef vty(const cg_llvm *L, kiln_dtype dt)
{
	switch (dt) {
	case KILN_F32: case KILN_F16: case KILN_BF16: return L->f32;
	case KILN_F64: return L->f64;
	case KILN_I8: case KILN_U8: return L->i8;
	case KILN_I32: return L->i32;
	case KILN_BOOL: return L->i1;
	default: return L->i64;
	}
}

/* The type of an element in memory (bool is one byte). */
static LLVMTypeRef mty(const cg_llvm *L, kiln_dtype dt)
{
	return dt == KILN_BOOL ? L->i8 : dt_half(dt) ? LLVMInt16TypeInContext(L->ctx) : vty(L, dt);
}

static LLVMValueRef i64c(const cg_llvm *L, int64_t v)
{
	return LLVMConstInt(L->i64, (unsigned long long)v, 1);
}

static LLVMValueRef i32c(const cg_llvm *L, int64_t v)
{
	return LLVMConstInt(L->i32, (unsigned long long)v, 1);
}

static void add_attr(cg_llvm *L, LLVMValueRef f, int idx, const char *name)
{
	unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
	LLVMAddAttributeAtIndex(f, (LLVMAttributeIndex)idx,
	                        LLVMCreateEnumAttribute(L->ctx, kind, 0));
}

static LLVMValueRef add_fn(cg_llvm *L, const char *name, LLVMTypeRef ty, bool internal)
{
	LLVMValueRef f = LLVMAddFunction(L->mod, name, ty);
	if (internal)
		LLVMSetLinkage(f, LLVMInternalLinkage);
	add_attr(L, f, LLVMAttributeFunctionIndex, "nounwind");
	return f;
}

LLVMValueRef cg_llvm_i64(const cg_llvm *L, int64_t v) { return i64c(L, v); }
LLVMValueRef cg_llvm_i32(const cg_llvm *L, int64_t v) { return i32c(L, v); }
LLVMTypeRef cg_llvm_mem_type(const cg_llvm *L, kiln_dtype dt) { return mty(L, dt); }
LLVMValueRef cg_llvm_fn(cg_llvm *L, const char *name, LLVMTypeRef ty, bool internal)
{
	return add_fn(L, name, ty, internal);
}

/* An external function, declared once. */
static LLVMValueRef extern_fn(cg_llvm *L, const char *name, LLVMTypeRef ty)
{
	LLVMValueRef f = LLVMGetNamedFunction(L->mod, name);
	return f ? f : add_fn(L, name, ty, false);
}

LLVMValueRef cg_llvm_runtime_fn(cg_llvm *L, const char *name, LLVMTypeRef ty)
{
	LLVMValueRef f = extern_fn(L, name, ty);
	LLVMSetVisibility(f, LLVMHiddenVisibility);
	return f;
}

/* ---- what a statement touches ---------------------------------------------- */

typedef struct scan {
	const cg_module *m;
	int nvar;
	uint8_t *used, *bound; /* per variable */
	uint8_t *buf;          /* per buffer */
	kiln_dtype *local;     /* per variable: CG_ASSIGN's dtype, 0 for loop vars */
	bool bad;              /* a variable or buffer id out of range */
} scan;

static void scan_expr(scan *s, const cg_expr *e)
{
	if (!e)
		return;
	if (e->kind == CG_VAR && (e->var < 0 || e->var >= s->nvar))
		s->bad = true;
	else if (e->kind == CG_VAR)
		s->used[e->var] = 1;
	if (e->kind == CG_LOAD && (e->buf < 0 || e->buf >= s->m->nbuf))
		s->bad = true;
	else if (e->kind == CG_LOAD)
		s->buf[e->buf] = 1;
	scan_expr(s, e->a);
	scan_expr(s, e->b);
	scan_expr(s, e->c);
}

static void scan_buf(scan *s, int b)
{
	if (b < 0 || b >= s->m->nbuf)
		s->bad = true;
	else
		s->buf[b] = 1;
}

static void scan_gemm(scan *s, const cg_gemm *g)
{
	const cg_expr *e[] = {g->M, g->N, g->K, g->batch, g->a_off, g->a_bs, g->a_rs, g->a_cs,
	                      g->b_off, g->b_bs, g->b_rs, g->b_cs, g->c_off, g->c_bs, g->c_rs,
	                      g->bias_off};
	for (size_t i = 0; i < sizeof e / sizeof *e; i++)
		scan_expr(s, e[i]);
	scan_buf(s, g->a);
	scan_buf(s, g->b);
	scan_buf(s, g->c);
	if (g->bias >= 0)
		scan_buf(s, g->bias);
	if (g->has_b_rows)
		scan_buf(s, g->b_rows);
	if (g->has_residual) {
		scan_expr(s, g->res_off);
		scan_expr(s, g->res_rs);
		scan_buf(s, g->residual);
	}
	const cg_gemm_vec *v[] = {&g->scale, &g->a_zero, &g->b_zero, &g->c_zero};
	for (int i = 0; i < 4; i++)
		if (v[i]->axis) {
			scan_expr(s, v[i]->off);
			scan_buf(s, v[i]->buf);
		}
}

static void scan_stmt(scan *s, const cg_stmt *st)
{
	if (!st)
		return;
	for (int i = 0; st->kind == CG_BLOCK && i < st->n; i++)
		scan_stmt(s, st->items[i]);
	if ((st->kind == CG_FOR || st->kind == CG_ASSIGN) && (st->var < 0 || st->var >= s->nvar)) {
		s->bad = true;
		return;
	}
	if (st->kind == CG_FOR)
		s->bound[st->var] = 1;
	if (st->kind == CG_ASSIGN) {
		s->bound[st->var] = 1;
		s->local[st->var] = st->dt;
	}
	if (st->kind == CG_STORE)
		scan_buf(s, st->buf);
	if (st->kind == CG_GEMM && st->gemm)
		scan_gemm(s, st->gemm);
	if (st->kind == CG_TRANSPOSE && st->tr) {
		const cg_transpose *t = st->tr;
		const cg_expr *e[] = {t->rows, t->cols, t->src_off, t->src_rs, t->dst_off, t->dst_rs};
		for (size_t i = 0; i < sizeof e / sizeof *e; i++)
			scan_expr(s, e[i]);
		scan_buf(s, t->src);
		scan_buf(s, t->dst);
	}
	scan_expr(s, st->extent);
	scan_expr(s, st->index);
	scan_expr(s, st->value);
	scan_expr(s, st->cond);
	scan_expr(s, st->lo);
	scan_expr(s, st->hi);
	scan_stmt(s, st->body);
	scan_stmt(s, st->then_s);
	scan_stmt(s, st->else_s);
}

static bool scan_init(scan *s, const cg_module *m, int nvar)
{
	*s = (scan){.m = m, .nvar = nvar};
	s->used = calloc((size_t)nvar + 1, 1);
	s->bound = calloc((size_t)nvar + 1, 1);
	s->local = calloc((size_t)nvar + 1, sizeof *s->local);
	s->buf = calloc((size_t)m->nbuf + 1, 1);
	return s->used && s->bound && s->local && s->buf;
}

static void scan_free(scan *s)
{
	free(s->used);
	free(s->bound);
	free(s->local);
	free(s->buf);
}

static int root_of(const cg_module *m, int b)
{
	for (int steps = 0; m->buf[b].alias >= 0 && steps <= m->nbuf; steps++)
		b = m->buf[b].alias;
	return b;
}

/* ---- emitting one function -------------------------------------------------- */

typedef struct fn_ctx {
	cg_llvm *L;
	const cg_kernel *k;
	LLVMValueRef fn, x;     /* x: the rt_exec * */
	LLVMBasicBlockRef entry;
	LLVMValueRef *symv;     /* per symbol, loaded once in the entry block */
	LLVMValueRef *bufp;     /* per buffer: typed base pointer, or NULL */
	LLVMValueRef *var;      /* per variable: loop phi, or a local's alloca */
	const kiln_dtype *local;
	int depth;              /* loops around the current statement */
	struct lanes *ln;       /* the CG_LANES loop being emitted on vectors, or NULL */
	int *npar;              /* outlined loops of this kernel so far */
	kiln_status st;
	kiln_error *err;
} fn_ctx;

static kiln_status fail(fn_ctx *c, kiln_status code, const char *what)
{
	if (c->st == KILN_OK) {
		const char *from = c->k ? c->k->origin : NULL;
		c->st = ir_seterr(c->err, code, "LLVM backend: kernel '%s'%s%s: %s",
		                  c->k ? c->k->name : "?", from ? " from " : "", from ? from : "",
		                  what);
	}
	return c->st;
}

static LLVMValueRef expr(fn_ctx *c, const cg_expr *e);
static void stmt(fn_ctx *c, const cg_stmt *s);

/* ---- math ------------------------------------------------------------------- */

static LLVMValueRef intrinsic(fn_ctx *c, const char *name, LLVMTypeRef *tys, int ntys,
                              LLVMValueRef *args, int nargs)
{
	cg_llvm *L = c->L;
	unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
	LLVMValueRef f = LLVMGetIntrinsicDeclaration(L->mod, id, tys, (size_t)ntys);
	LLVMTypeRef ft = LLVMIntrinsicGetType(L->ctx, id, tys, (size_t)ntys);
	return LLVMBuildCall2(L->b, ft, f, args, (unsigned)nargs, "");
}

static LLVMValueRef intr1(fn_ctx *c, const char *name, LLVMValueRef a)
{
	LLVMTypeRef t = LLVMTypeOf(a);
	return intrinsic(c, name, &t, 1, &a, 1);
}

static LLVMValueRef intr2(fn_ctx *c, const char *name, LLVMValueRef a, LLVMValueRef b)
{
	LLVMTypeRef t = LLVMTypeOf(a);
	LLVMValueRef args[2] = {a, b};
	return intrinsic(c, name, &t, 1, args, 2);
}

static LLVMValueRef libm1(fn_ctx *c, const char *name, LLVMValueRef a)
{
	LLVMTypeRef t = LLVMTypeOf(a), ft = LLVMFunctionType(t, &t, 1, 0);
	return LLVMBuildCall2(c->L->b, ft, extern_fn(c->L, name, ft), &a, 1, "");
}

static LLVMValueRef fc(fn_ctx *c, double v) { return LLVMConstReal(c->L->f32, v); }
static LLVMValueRef fadd(fn_ctx *c, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFAdd(c->L->b, a, b, ""); }
static LLVMValueRef fmul(fn_ctx *c, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFMul(c->L->b, a, b, ""); }

static LLVMValueRef fsel(fn_ctx *c, LLVMRealPredicate p, LLVMValueRef a, LLVMValueRef b,
                         LLVMValueRef t, LLVMValueRef f)
{
	LLVMBuilderRef B = c->L->b;
	return LLVMBuildSelect(B, LLVMBuildFCmp(B, p, a, b, ""), t, f, "");
}

/* a*b + d, fused where the target has FMA (llvm.fmuladd): the polynomials
 * below are chains of these, and unfused they cost twice the
 * instructions (exp on AVX-512: 45 per vector, with fusion 32). */
static LLVMValueRef fmuladd(fn_ctx *c, LLVMValueRef a, LLVMValueRef b, LLVMValueRef d)
{
	LLVMTypeRef t = LLVMTypeOf(a);
	LLVMValueRef args[3] = {a, b, d};
	return intrinsic(c, "llvm.fmuladd", &t, 1, args, 3);
}

/* Horner: p[0]*x^(n-1) + ... + p[n-1] */
static LLVMValueRef poly(fn_ctx *c, LLVMValueRef x, const double *p, int n)
{
	LLVMValueRef r = fc(c, p[0]);
	for (int i = 1; i < n; i++)
		r = fmuladd(c, r, x, fc(c, p[i]));
	return r;
}

/* 2^n for an i32 n in [-126, 127], by building the exponent bits. */
static LLVMValueRef pow2i(fn_ctx *c, LLVMValueRef n)
{
	LLVMBuilderRef B = c->L->b;
	LLVMValueRef e = LLVMBuildShl(B, LLVMBuildAdd(B, n, i32c(c->L, 127), ""),
	                              i32c(c->L, 23), "");
	return LLVMBuildBitCast(B, e, c->L->f32, "");
}

/* Cephes expf's core on t already clamped to its range: n = round(t /
 * ln 2) (returned as i32 in *ni), r = t - n ln 2 (ln 2 in two parts), and
 * exp(r) by a degree-6 polynomial; exp(t) is that times 2^n. */
static LLVMValueRef exp_core(fn_ctx *c, LLVMValueRef t, LLVMValueRef *ni)
{
	static const double p[] = {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3,
	                           4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1};
	LLVMValueRef n = intr1(c, "llvm.floor", fmuladd(c, t, fc(c, 1.44269504088896341), fc(c, 0.5)));
	LLVMValueRef r = fmuladd(c, n, fc(c, -0.693359375), t);
	r = fmuladd(c, n, fc(c, 2.12194440e-4), r);
	*ni = LLVMBuildFPToSI(c->L->b, n, c->L->i32, "");
	return fmuladd(c, poly(c, r, p, 6), fmul(c, r, r), fadd(c, r, fc(c, 1.0)));
}

/* Cephes expf: exp_core's polynomial times 2^n applied as two halves so
 * that results near FLT_MAX and the subnormals stay exact.  Branch-free,
 * so loops over it vectorize; within 1 ulp on [-104, 88.72]. */
static LLVMValueRef exp_f32(fn_ctx *c, LLVMValueRef x)
{
	LLVMBuilderRef B = c->L->b;
	LLVMValueRef lo = fc(c, -104.0), hi = fc(c, 88.72283905206835), ni;
	LLVMValueRef xc = fsel(c, LLVMRealOLT, x, lo, lo, x);
	xc = fsel(c, LLVMRealOGT, xc, hi, hi, xc);
	LLVMValueRef y = exp_core(c, xc, &ni);
	LLVMValueRef n1 = LLVMBuildAShr(B, ni, i32c(c->L, 1), "");
	LLVMValueRef n2 = LLVMBuildSub(B, ni, n1, "");
	y = fmul(c, fmul(c, y, pow2i(c, n1)), pow2i(c, n2));
	y = fsel(c, LLVMRealOGT, x, hi, fc(c, __builtin_inf()), y);
	y = fsel(c, LLVMRealOLT, x, lo, fc(c, 0.0), y);
	return fsel(c, LLVMRealUNO, x, x, x, y);
}

/* 1 / (1 + exp(-x)) in f32, on t = -x clamped to [-87, 87], where 2^n
 * (n = round(t / ln 2), |n| <= 126) is a normal number and exp stays
 * below FLT_MAX: past the clamp the result is 1 (x >= 87) or within
 * 1.7e-38 of 0.  n is rounded by adding 1.5 * 2^23 + 127 (one
 * multiply-add: the sum's last bits are n + 127, so its bits shifted
 * left 23 are 2^n's), r = t - n ln 2 (ln 2 in two parts), and exp(r) on
 * |r| <= ln 2 / 2 is a degree-5 polynomial fitted to its relative error
 * (1.9e-7 evaluated in f32).  NaN stays NaN.  Relative error within
 * 2.4e-7 of 1 / (1 + exp(-x)) on [-12, 12] (test_codegen checks 1e-6
 * against libm).  A vector of 16 is about 20 instructions, each a 512-bit
 * one, which Intel's cores issue two per cycle: where exp_core's floor,
 * conversion and degree-7 form made it about 28, EfficientNet-B0's SiLU
 * kernels (x * sigmoid(x)) were compute-bound, 21 cycles a vector in L2
 * (Sapphire Rapids). */
static LLVMValueRef sigmoid_f32(fn_ctx *c, LLVMValueRef x)
{
	static const double p[] = {8.297646585864907e-3, 4.191538369396551e-2,
	                           1.6667574868050164e-1, 4.9998894837656915e-1,
	                           9.999996919466173e-1, 1.0000000716556892};
	LLVMBuilderRef B = c->L->b;
	LLVMValueRef lo = fc(c, -87.0), hi = fc(c, 87.0), magic = fc(c, 12583039.0);
	LLVMValueRef t = LLVMBuildFNeg(B, x, "");
	t = fsel(c, LLVMRealOLT, t, lo, lo, t);
	t = fsel(c, LLVMRealOGT, t, hi, hi, t);
	LLVMValueRef j = fmuladd(c, t, fc(c, 1.44269504088896341), magic);
	LLVMValueRef n = LLVMBuildFSub(B, j, magic, "");
	LLVMValueRef r = fmuladd(c, n, fc(c, -0.693359375), t);
	r = fmuladd(c, n, fc(c, 2.12194440e-4), r);
	LLVMValueRef e = LLVMBuildShl(B, LLVMBuildBitCast(B, j, c->L->i32, ""), i32c(c->L, 23), "");
	LLVMValueRef y = fmul(c, poly(c, r, p, 6), LLVMBuildBitCast(B, e, c->L->f32, ""));
	LLVMValueRef s = LLVMBuildFDiv(B, fc(c, 1.0), fadd(c, y, fc(c, 1.0)), "");
	return fsel(c, LLVMRealUNO, x, x, x, s);
}

/* Cephes tanhf below 0.625 (odd polynomial), else 1 - 2/(exp(2|x|)+1). */
static LLVMValueRef tanh_f32(fn_ctx *c, LLVMValueRef x)
{
	static const double p[] = {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2,
	                           1.33314422036E-1, -3.33332819422E-1};
	LLVMBuilderRef B = c->L->b;
	LLVMValueRef a = intr1(c, "llvm.fabs", x), z = fmul(c, x, x);
	LLVMValueRef small = fadd(c, x, fmul(c, fmul(c, x, z), poly(c, z, p, 5)));
	LLVMValueRef e = exp_f32(c, fadd(c, a, a));
	LLVMValueRef big = LLVMBuildFSub(B, fc(c, 1.0),
	                                 LLVMBuildFDiv(B, fc(c, 2.0), fadd(c, e, fc(c, 1.0)), ""), "");
	big = intr2(c, "llvm.copysign", big, x);
	return fsel(c, LLVMRealOLT, a, fc(c, 0.625), small, big);
}

/* erf(x) = x P(x^2) / Q(x^2) on x clamped to [-4, 4] (erf is 1 within
 * f32 rounding beyond), degrees 6 and 4: Eigen's rational approximation
 * (generic_fast_erf_float).  Relative error within 3.4e-7 of libm on
 * [-12, 12] (measured on 2.4M points; tested at 1e-6); NaN stays NaN
 * through the clamps.  One division and 12 multiply-adds, where the erfc
 * form it replaces took two polynomials, an exp and a division per value
 * (BERT's GELU kernel: 0.53 ms against ORT's 0.33). */
static LLVMValueRef erf_f32(fn_ctx *c, LLVMValueRef a)
{
	static const double p[] = {-2.72614225801306e-10, 2.77068142495902e-08,
	                           -2.10102402082508e-06, -5.69250639462346e-05,
	                           -7.34990630326855e-04, -2.95459980854025e-03,
	                           -1.60960333262415e-02};
	static const double q[] = {-1.45660718464996e-05, -2.13374055278905e-04,
	                           -1.68282697438203e-03, -7.37332916720468e-03,
	                           -1.42647390514189e-02};
	LLVMValueRef x = fsel(c, LLVMRealOGT, a, fc(c, 4.0), fc(c, 4.0), a);
	x = fsel(c, LLVMRealOLT, x, fc(c, -4.0), fc(c, -4.0), x);
	LLVMValueRef z = fmul(c, x, x);
	return LLVMBuildFDiv(c->L->b, fmul(c, x, poly(c, z, p, 7)), poly(c, z, q, 5), "");
}

/* ---- expressions ------------------------------------------------------------- */

/* v (f32) rounded to the half type to, nearest-even, back in f32.  f16
 * goes through LLVM's half (F16C's vcvtps2ph on x86-64-v3 and the host);
 * bf16 is the top half of an f32, rounded with integer arithmetic (LLVM 14
 * has no bfloat conversion on x86), NaN kept quiet. */
static LLVMValueRef half_round(fn_ctx *c, LLVMValueRef v, kiln_dtype to)
{
	LLVMBuilderRef B = c->L->b;
	if (to == KILN_F16)
		return LLVMBuildFPExt(B, LLVMBuildFPTrunc(B, v, LLVMHalfTypeInContext(c->L->ctx), ""),
		                      c->L->f32, "");
	LLVMValueRef u = LLVMBuildBitCast(B, v, c->L->i32, "");
	LLVMValueRef odd = LLVMBuildAnd(B, LLVMBuildLShr(B, u, i32c(c->L, 16), ""), i32c(c->L, 1), "");
	LLVMValueRef r = LLVMBuildAdd(B, u, LLVMBuildAdd(B, odd, i32c(c->L, 0x7fff), ""), "");
	r = LLVMBuildAnd(B, r, i32c(c->L, (int32_t)0xffff0000u), "");
	LLVMValueRef qnan = LLVMBuildOr(B, LLVMBuildAnd(B, u, i32c(c->L, (int32_t)0xffff0000u), ""),
	                                i32c(c->L, 0x00400000), "");
	LLVMValueRef nan = LLVMBuildFCmp(B, LLVMRealUNO, v, v, "");
	return LLVMBuildBitCast(B, LLVMBuildSelect(B, nan, qnan, r, ""), c->L->f32, "");
}

/* f64 to f32 rounded to odd (an inexact result gets its last bit set), so
 * that rounding it again to f16 or bf16 is the one correct rounding of the
 * f64: a direct fptrunc to half is a libcall whose ABI LLVM 14 and libgcc
 * disagree on. */
static LLVMValueRef f64_to_f32_odd(fn_ctx *c, LLVMValueRef v)
{
	LLVMBuilderRef B = c->L->b;
	LLVMValueRef t = LLVMBuildFPTrunc(B, v, c->L->f32, "");
	LLVMValueRef back = LLVMBuildFPExt(B, t, c->L->f64, "");
	LLVMValueRef u = LLVMBuildBitCast(B, t, c->L->i32, "");
	LLVMValueRef even = LLVMBuildICmp(B, LLVMIntEQ, LLVMBuildAnd(B, u, i32c(c->L, 1), ""),
	                                  i32c(c->L, 0), "");
	LLVMValueRef fix = LLVMBuildAnd(B, even, LLVMBuildFCmp(B, LLVMRealONE, back, v, ""), "");
	/* sign-magnitude bits: +1 moves away from zero, -1 toward it */
	LLVMValueRef up = LLVMBuildFCmp(B, LLVMRealOLT, intr1(c, "llvm.fabs", back),
	                                intr1(c, "llvm.fabs", v), "");
	LLVMValueRef step = LLVMBuildSelect(B, up, i32c(c->L, 1), i32c(c->L, -1), "");
	u = LLVMBuildSelect(B, fix, LLVMBuildAdd(B, u, step, ""), u, "");
	return LLVMBuildBitCast(B, u, c->L->f32, "");
}

/* A loaded 16-bit pattern of half type dt as an f32. */
static LLVMValueRef half_load(fn_ctx *c, LLVMValueRef bits, kiln_dtype dt)
{
	LLVMBuilderRef B = c->L->b;
	if (dt == KILN_F16)
		return LLVMBuildFPExt(B, LLVMBuildBitCast(B, bits, LLVMHalfTypeInContext(c->L->ctx), ""),
		                      c->L->f32, "");
	LLVMValueRef u = LLVMBuildShl(B, LLVMBuildZExt(B, bits, c->L->i32, ""), i32c(c->L, 16), "");
	return LLVMBuildBitCast(B, u, c->L->f32, "");
}

/* An f32 of half type dt as its 16-bit pattern, rounding it first (values
 * computed in f32 reach a store unrounded). */
static LLVMValueRef half_store(fn_ctx *c, LLVMValueRef v, kiln_dtype dt)
{
	LLVMBuilderRef B = c->L->b;
	LLVMTypeRef i16 = LLVMInt16TypeInContext(c->L->ctx);
	if (dt == KILN_F16)
		return LLVMBuildBitCast(B, LLVMBuildFPTrunc(B, v, LLVMHalfTypeInContext(c->L->ctx), ""),
		                        i16, "");
	LLVMValueRef u = LLVMBuildBitCast(B, half_round(c, v, KILN_BF16), c->L->i32, "");
	return LLVMBuildTrunc(B, LLVMBuildLShr(B, u, i32c(c->L, 16), ""), i16, "");
}

/* Converts a register value between dtypes (float -> int saturates, as the
 * interpreter's stores do; to bool is != 0). */
static LLVMValueRef convert(fn_ctx *c, LLVMValueRef v, kiln_dtype from, kiln_dtype to)
{
	LLVMBuilderRef B = c->L->b;
	LLVMTypeRef t = vty(c->L, to), ft = vty(c->L, from);
	if (from != to && dt_half(to))
		return half_round(c, from == KILN_F64 ? f64_to_f32_odd(c, v)
		                  : convert(c, v, from, KILN_F32), to);
	if (from == to || t == ft)
		return v;
	if (to == KILN_BOOL)
		return dt_float(from) ? LLVMBuildFCmp(B, LLVMRealUNE, v, LLVMConstNull(ft), "")
		                      : LLVMBuildICmp(B, LLVMIntNE, v, LLVMConstNull(ft), "");
	if (dt_float(from) && dt_float(to))
		return LLVMBuildFPCast(B, v, t, "");
	if (dt_float(from) && kiln_dtype_size(to) < 4) {
		/* 8- and 16-bit: NaN to 0, clamp to the range (exact in f32), then
		 * through i32; the same as fptosi.sat, which LLVM 14 would not
		 * vectorize (a requantizing loop ran scalar: 0.63 -> 0.37 ms) */
		int64_t span = (int64_t)1 << (8 * kiln_dtype_size(to));
		double lo = dt_unsigned(to) ? 0 : (double)(-span / 2);
		double hi = dt_unsigned(to) ? (double)(span - 1) : (double)(span / 2 - 1);
		LLVMValueRef z = LLVMConstNull(ft), l = LLVMConstReal(ft, lo), h = LLVMConstReal(ft, hi);
		v = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNO, v, v, ""), z, v, "");
		v = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, v, l, ""), l, v, "");
		v = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, v, h, ""), h, v, "");
		return LLVMBuildTrunc(B, LLVMBuildFPToSI(B, v, c->L->i32, ""), t, "");
	}
	if (dt_float(from)) {
		LLVMTypeRef tys[2] = {t, ft};
		return intrinsic(c, dt_unsigned(to) ? "llvm.fptoui.sat" : "llvm.fptosi.sat", tys, 2,
		                 &v, 1);
	}
	if (dt_float(to))
		return dt_unsigned(from) ? LLVMBuildUIToFP(B, v, t, "") : LLVMBuildSIToFP(B, v, t, "");
	return LLVMBuildIntCast2(B, v, t, !dt_unsigned(from), "");
}

static LLVMValueRef e_const(fn_ctx *c, const cg_expr *e)
{
	if (dt_float(e->dt))
		return LLVMConstReal(vty(c->L, e->dt), e->f);
	return LLVMConstInt(vty(c->L, e->dt), (unsigned long long)e->i, !dt_unsigned(e->dt));
}

static LLVMValueRef e_var(fn_ctx *c, const cg_expr *e)
{
	LLVMValueRef v = c->var && c->k && e->var >= 0 && e->var < c->k->nvar ? c->var[e->var] : NULL;
	if (!v) {
		fail(c, KILN_EINVAL, "a variable is read outside the loop or before the "
		     "assignment that defines it");
		return LLVMGetUndef(vty(c->L, e->dt));
	}
	if (c->local[e->var])
		return LLVMBuildLoad2(c->L->b, vty(c->L, c->local[e->var]), v, "");
	return convert(c, v, KILN_I64, e->dt);
}

static LLVMValueRef e_size(fn_ctx *c, const cg_expr *e)
{
	if (e->var < 0 || e->var >= c->L->m->nsym) {
		fail(c, KILN_EINVAL, "a size reads a symbol the graph does not have");
		return i64c(c->L, 0);
	}
	return c->symv[e->var];
}

static LLVMValueRef elem_ptr(fn_ctx *c, int buf, const cg_expr *index)
{
	LLVMValueRef idx = convert(c, expr(c, index), index ? index->dt : KILN_I64, KILN_I64);
	if (!c->bufp || buf < 0 || buf >= c->L->m->nbuf || !c->bufp[buf]) {
		fail(c, KILN_EINVAL, "a buffer is read where no buffer can be");
		kiln_dtype dt = buf >= 0 && buf < c->L->m->nbuf ? c->L->m->buf[buf].dt : KILN_F32;
		return LLVMConstNull(LLVMPointerType(mty(c->L, dt), 0));
	}
	return LLVMBuildInBoundsGEP2(c->L->b, mty(c->L, c->L->m->buf[buf].dt), c->bufp[buf],
	                             &idx, 1, "");
}

static LLVMValueRef e_load(fn_ctx *c, const cg_expr *e)
{
	kiln_dtype dt = c->L->m->buf[e->buf].dt;
	LLVMValueRef v = LLVMBuildLoad2(c->L->b, mty(c->L, dt), elem_ptr(c, e->buf, e->a), "");
	if (dt == KILN_BOOL)
		v = LLVMBuildICmp(c->L->b, LLVMIntNE, v, LLVMConstNull(c->L->i8), "");
	if (dt_half(dt))
		v = half_load(c, v, dt);
	return convert(c, v, dt, e->dt);
}

static LLVMValueRef u_neg(fn_ctx *c, LLVMValueRef a, kiln_dtype dt)
{
	return dt_float(dt) ? LLVMBuildFNeg(c->L->b, a, "") : LLVMBuildNeg(c->L->b, a, "");
}

static LLVMValueRef u_abs(fn_ctx *c, LLVMValueRef a, kiln_dtype dt)
{
	if (dt_float(dt))
		return intr1(c, "llvm.fabs", a);
	if (dt_unsigned(dt))
		return a;
	LLVMBuilderRef B = c->L->b;
	LLVMValueRef neg = LLVMBuildICmp(B, LLVMIntSLT, a, LLVMConstNull(LLVMTypeOf(a)), "");
	return LLVMBuildSelect(B, neg, LLVMBuildNeg(B, a, ""), a, "");
}

static LLVMValueRef u_exp(fn_ctx *c, LLVMValueRef a, kiln_dtype dt)
{
	return dt != KILN_F64 ? exp_f32(c, a) : intr1(c, "llvm.exp", a);
}

static LLVMValueRef u_tanh(fn_ctx *c, LLVMValueRef a, kiln_dtype dt)
{
	return dt != KILN_F64 ? tanh_f32(c, a) : libm1(c, "tanh", a);
}

static LLVMValueRef u_erf(fn_ctx *c, LLVMValueRef a, kiln_dtype dt)
{
	return dt != KILN_F64 ? erf_f32(c, a) : libm1(c, "erf", a);
}

static LLVMValueRef u_sigmoid(fn_ctx *c, LLVMValueRef a, kiln_dtype dt)
{
	if (dt != KILN_F64)
		return sigmoid_f32(c, a);
	LLVMValueRef one = LLVMConstReal(LLVMTypeOf(a), 1.0);
	LLVMValueRef e = intr1(c, "llvm.exp", LLVMBuildFNeg(c->L->b, a, ""));
	return LLVMBuildFDiv(c->L->b, one, LLVMBuildFAdd(c->L->b, one, e, ""), "");
}

static LLVMValueRef u_not(fn_ctx *c, LLVMValueRef a, kiln_dtype dt)
{
	return LLVMBuildNot(c->L->b, a, "");
}

/* atan, asin, acos: libm's (atanf ... in f32), one call per element */
static LLVMValueRef u_libm(fn_ctx *c, LLVMValueRef a, kiln_dtype dt, const char *name)
{
	char f[16];
	snprintf(f, sizeof f, "%s%s", name, dt == KILN_F64 ? "" : "f");
	return libm1(c, f, a);
}

static LLVMValueRef u_atan(fn_ctx *c, LLVMValueRef a, kiln_dtype dt) { return u_libm(c, a, dt, "atan"); }
static LLVMValueRef u_asin(fn_ctx *c, LLVMValueRef a, kiln_dtype dt) { return u_libm(c, a, dt, "asin"); }
static LLVMValueRef u_acos(fn_ctx *c, LLVMValueRef a, kiln_dtype dt) { return u_libm(c, a, dt, "acos"); }

typedef LLVMValueRef (*unop_fn)(fn_ctx *c, LLVMValueRef a, kiln_dtype dt);
static const unop_fn unop_table[CG_UNOP_COUNT] = {
	[CG_NEG] = u_neg, [CG_ABS] = u_abs, [CG_EXP] = u_exp, [CG_TANH] = u_tanh,
	[CG_ERF] = u_erf, [CG_NOT] = u_not, [CG_ATAN] = u_atan, [CG_ASIN] = u_asin,
	[CG_ACOS] = u_acos, [CG_SIGMOID] = u_sigmoid,
};
/* The rest are LLVM intrinsics on floats (identity on integers). */
static const char *const unop_intrinsic[CG_UNOP_COUNT] = {
	[CG_LOG] = "llvm.log", [CG_SQRT] = "llvm.sqrt", [CG_SIN] = "llvm.sin",
	[CG_COS] = "llvm.cos", [CG_FLOOR] = "llvm.floor", [CG_CEIL] = "llvm.ceil",
	[CG_ROUND] = "llvm.rint",
};

static LLVMValueRef e_un(fn_ctx *c, const cg_expr *e)
{
	kiln_dtype dt = e->a ? e->a->dt : e->dt;
	LLVMValueRef a = expr(c, e->a);
	if (e->op < 0 || e->op >= CG_UNOP_COUNT) {
		fail(c, KILN_EUNSUPPORTED, "unknown unary operator");
		return a;
	}
	if (unop_table[e->op])
		return convert(c, unop_table[e->op](c, a, dt), dt, e->dt);
	if (!dt_float(dt))
		return convert(c, a, dt, e->dt);
	return convert(c, intr1(c, unop_intrinsic[e->op], a), dt, e->dt);
}

/* Opcodes and predicates per binary operator: signed, unsigned, float. */
static const struct binop_info {
	LLVMOpcode si, ui, fl;
	LLVMIntPredicate sp, up;
	LLVMRealPredicate fp;
} binop_table[CG_BINOP_COUNT] = {
	[CG_ADD] = {LLVMAdd, LLVMAdd, LLVMFAdd},
	[CG_SUB] = {LLVMSub, LLVMSub, LLVMFSub},
	[CG_MUL] = {LLVMMul, LLVMMul, LLVMFMul},
	[CG_DIV] = {LLVMSDiv, LLVMUDiv, LLVMFDiv},
	[CG_REM] = {LLVMSRem, LLVMURem, LLVMFRem},
	[CG_AND] = {LLVMAnd, LLVMAnd},
	[CG_OR] = {LLVMOr, LLVMOr},
	[CG_XOR] = {LLVMXor, LLVMXor},
	[CG_SHR] = {LLVMLShr, LLVMLShr},
	[CG_EQ] = {.sp = LLVMIntEQ, .up = LLVMIntEQ, .fp = LLVMRealOEQ},
	[CG_NE] = {.sp = LLVMIntNE, .up = LLVMIntNE, .fp = LLVMRealUNE},
	[CG_LT] = {.sp = LLVMIntSLT, .up = LLVMIntULT, .fp = LLVMRealOLT},
	[CG_LE] = {.sp = LLVMIntSLE, .up = LLVMIntULE, .fp = LLVMRealOLE},
	[CG_GT] = {.sp = LLVMIntSGT, .up = LLVMIntUGT, .fp = LLVMRealOGT},
	[CG_GE] = {.sp = LLVMIntSGE, .up = LLVMIntUGE, .fp = LLVMRealOGE},
	[CG_MIN] = {.sp = LLVMIntSLT, .up = LLVMIntULT, .fp = LLVMRealOLT},
	[CG_MAX] = {.sp = LLVMIntSGT, .up = LLVMIntUGT, .fp = LLVMRealOGT},
};

/* min/max as the interpreter has them: a NaN in either operand wins. */
static LLVMValueRef minmax(fn_ctx *c, const struct binop_info *bi, LLVMValueRef a,
                           LLVMValueRef b, kiln_dtype dt)
{
	LLVMBuilderRef B = c->L->b;
	if (!dt_float(dt)) {
		LLVMValueRef lt = LLVMBuildICmp(B, dt_unsigned(dt) ? bi->up : bi->sp, a, b, "");
		return LLVMBuildSelect(B, lt, a, b, "");
	}
	LLVMValueRef pick = LLVMBuildFCmp(B, bi->fp, a, b, "");
	if (!LLVMIsConstant(b))
		pick = LLVMBuildOr(B, pick, LLVMBuildFCmp(B, LLVMRealUNO, a, a, ""), "");
	else /* a constant b is not NaN: unordered means a is */
		pick = LLVMBuildFCmp(B, bi->fp == LLVMRealOLT ? LLVMRealULT : LLVMRealUGT, a, b, "");
	return LLVMBuildSelect(B, pick, a, b, "");
}

/* e is a float product of two operands of its own dtype */
static bool is_fmul(const cg_expr *e)
{
	return e && e->kind == CG_BIN && e->op == CG_MUL && dt_float(e->dt) && e->a && e->b &&
	       e->a->dt == e->dt && e->b->dt == e->dt;
}

/* a*b + c and c + a*b as llvm.fmuladd, fused where the target has FMA:
 * the convolutions' tap sums and the epilogues' scale-and-shift are such
 * chains, and unfused every tap is a multiply and a dependent add (a 5x5
 * depthwise conv on AVX-512 ran at a sixth of the FMA rate). */
static LLVMValueRef e_fmuladd(fn_ctx *c, const cg_expr *e)
{
	const cg_expr *m = is_fmul(e->b) ? e->b : e->a, *o = m == e->b ? e->a : e->b;
	return fmuladd(c, expr(c, m->a), expr(c, m->b), expr(c, o));
}

static LLVMValueRef e_bin(fn_ctx *c, const cg_expr *e)
{
	LLVMBuilderRef B = c->L->b;
	kiln_dtype dt = e->a ? e->a->dt : e->dt;
	if (e->op == CG_ADD && (dt == KILN_F32 || dt == KILN_F64) && e->dt == dt && e->b &&
	    e->b->dt == dt && (is_fmul(e->a) || is_fmul(e->b)))
		return e_fmuladd(c, e);
	LLVMValueRef a = expr(c, e->a), b = convert(c, expr(c, e->b), e->b ? e->b->dt : dt, dt);
	if (e->op < 0 || e->op >= CG_BINOP_COUNT) {
		fail(c, KILN_EUNSUPPORTED, "unknown binary operator");
		return a;
	}
	const struct binop_info *bi = &binop_table[e->op];
	if (e->op == CG_MIN || e->op == CG_MAX)
		return convert(c, minmax(c, bi, a, b, dt), dt, e->dt);
	if (e->op == CG_POW) {
		LLVMValueRef fa = convert(c, a, dt, dt_float(dt) ? dt : KILN_F64);
		LLVMValueRef fb = convert(c, b, dt, dt_float(dt) ? dt : KILN_F64);
		return convert(c, intr2(c, "llvm.pow", fa, fb), dt_float(dt) ? dt : KILN_F64, e->dt);
	}
	if (bi->sp || bi->fp) {
		LLVMValueRef r = dt_float(dt) ? LLVMBuildFCmp(B, bi->fp, a, b, "")
		                              : LLVMBuildICmp(B, dt_unsigned(dt) ? bi->up : bi->sp,
		                                              a, b, "");
		return convert(c, r, KILN_BOOL, e->dt);
	}
	LLVMOpcode op = dt_float(dt) ? bi->fl : dt_unsigned(dt) ? bi->ui : bi->si;
	if (!op) {
		fail(c, KILN_EUNSUPPORTED, "a bitwise operator on floats");
		return a;
	}
	return convert(c, LLVMBuildBinOp(B, op, a, b, ""), dt, e->dt);
}

static LLVMValueRef e_select(fn_ctx *c, const cg_expr *e)
{
	LLVMValueRef cond = convert(c, expr(c, e->a), e->a ? e->a->dt : KILN_BOOL, KILN_BOOL);
	LLVMValueRef t = convert(c, expr(c, e->b), e->b ? e->b->dt : e->dt, e->dt);
	LLVMValueRef f = convert(c, expr(c, e->c), e->c ? e->c->dt : e->dt, e->dt);
	return LLVMBuildSelect(c->L->b, cond, t, f, "");
}

/* An f32 x rounded (half to even) and converted to u8 or i8, as
 * convert(rint(x)) gives it (NaN to 0, saturated; for a whole x that is
 * convert(x)), in fewer instructions:
 * x clamped to the range (whole numbers, so clamping before rounding gives
 * the same values), then rounded by adding 1.5 * 2^23, where an f32's ulp
 * is 1: the sum's low mantissa bits are rint(x) in two's complement, its
 * low byte the result.  For u8 the two compare-selects (vmaxps, vminps)
 * also send NaN to 0; i8 tests NaN first.  A requantizing store (every
 * 8-bit int kernel: a depthwise conv's, QuantizeLinear's, the fused Add's)
 * was 7 instructions per vector (vrndscaleps, a NaN test and mask, two
 * clamps, vcvttps2dq, vpmovdb), now 4 (u8) or 6. */
static LLVMValueRef round_to_8bit(fn_ctx *c, LLVMValueRef x, kiln_dtype to)
{
	LLVMBuilderRef B = c->L->b;
	LLVMTypeRef f = c->L->f32;
	bool u = dt_unsigned(to);
	LLVMValueRef lo = LLVMConstReal(f, u ? 0 : -128), hi = LLVMConstReal(f, u ? 255 : 127);
	if (!u)
		x = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNO, x, x, ""), LLVMConstNull(f), x, "");
	x = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, x, lo, ""), x, lo, "");
	x = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, x, hi, ""), x, hi, "");
	x = LLVMBuildFAdd(B, x, LLVMConstReal(f, 12582912.0), "");
	return LLVMBuildTrunc(B, LLVMBuildBitCast(B, x, c->L->i32, ""), c->L->i8, "");
}

/* Whether e's value, unless NaN, is a whole number (or infinite): a
 * rounding, an integer converted, sums, products, extremes and selections
 * of such (an f32 operation on whole numbers rounds to a whole number:
 * every f32 from 2^23 up is one). */
static bool whole(const cg_module *m, const cg_expr *e)
{
	if (!e)
		return false;
	switch (e->kind) {
	case CG_CONST: /* (NaN and the infinities fail the range test) */
		return !dt_float(e->dt) || (e->f > -0x1p62 && e->f < 0x1p62 &&
		                            e->f == (double)(int64_t)e->f);
	case CG_LOAD: return !dt_float(e->dt) || !dt_float(m->buf[e->buf].dt);
	case CG_CAST: return e->a && (!dt_float(e->a->dt) || whole(m, e->a));
	case CG_SELECT: return whole(m, e->b) && whole(m, e->c);
	case CG_UN:
		return e->op == CG_ROUND || e->op == CG_FLOOR || e->op == CG_CEIL ||
		       ((e->op == CG_NEG || e->op == CG_ABS) && whole(m, e->a));
	case CG_BIN:
		return (e->op == CG_ADD || e->op == CG_SUB || e->op == CG_MUL || e->op == CG_MIN ||
		        e->op == CG_MAX) && whole(m, e->a) && whole(m, e->b);
	default: return false;
	}
}

static LLVMValueRef e_cast(fn_ctx *c, const cg_expr *e)
{
	const cg_expr *a = e->a;
	if (a && a->dt == KILN_F32 && (e->dt == KILN_U8 || e->dt == KILN_I8)) {
		/* rint(x) to 8 bits: x clamped and rounded by the addition; a
		 * whole number: the addition is exact */
		if (a->kind == CG_UN && a->op == CG_ROUND && a->a && a->a->dt == KILN_F32)
			return round_to_8bit(c, expr(c, a->a), e->dt);
		if (whole(c->L->m, a))
			return round_to_8bit(c, expr(c, a), e->dt);
	}
	return convert(c, expr(c, e->a), e->a ? e->a->dt : e->dt, e->dt);
}

typedef LLVMValueRef (*expr_fn)(fn_ctx *c, const cg_expr *e);
static const expr_fn expr_table[] = {
	[CG_CONST] = e_const, [CG_VAR] = e_var, [CG_SIZE] = e_size, [CG_LOAD] = e_load,
	[CG_UN] = e_un, [CG_BIN] = e_bin, [CG_SELECT] = e_select, [CG_CAST] = e_cast,
};

static LLVMValueRef expr(fn_ctx *c, const cg_expr *e)
{
	if (!e || (unsigned)e->kind >= sizeof expr_table / sizeof *expr_table ||
	    !expr_table[e->kind] || !dt_ok(e->dt)) {
		fail(c, e && !dt_ok(e->dt) ? KILN_EUNSUPPORTED : KILN_EINVAL,
		     e && !dt_ok(e->dt) ? "an expression of a dtype the LLVM backend does not "
		                          "handle (f16/bf16)" : "a malformed expression");
		return i64c(c->L, 0);
	}
	return expr_table[e->kind](c, e);
}

/* ---- loops ------------------------------------------------------------------- */

typedef struct loop {
	LLVMBasicBlockRef pre, body, exit;
	LLVMValueRef iv, hi;
} loop;

/* for (iv = lo; iv < hi; iv++): guard, then the body block with the phi. */
static LLVMValueRef loop_begin(fn_ctx *c, loop *l, LLVMValueRef lo, LLVMValueRef hi)
{
	LLVMBuilderRef B = c->L->b;
	l->pre = LLVMGetInsertBlock(B);
	l->body = LLVMAppendBasicBlockInContext(c->L->ctx, c->fn, "loop");
	l->exit = LLVMAppendBasicBlockInContext(c->L->ctx, c->fn, "exit");
	l->hi = hi;
	LLVMBuildCondBr(B, LLVMBuildICmp(B, LLVMIntSLT, lo, hi, ""), l->body, l->exit);
	LLVMPositionBuilderAtEnd(B, l->body);
	l->iv = LLVMBuildPhi(B, c->L->i64, "i");
	LLVMAddIncoming(l->iv, &lo, &l->pre, 1);
	c->depth++;
	return l->iv;
}

/* !{!"name", i1 true}, or !{!"name"} for flags without a value */
static LLVMMetadataRef md_flag(cg_llvm *L, const char *name, bool value)
{
	LLVMMetadataRef ops[2] = {LLVMMDStringInContext2(L->ctx, name, strlen(name)),
	                          LLVMValueAsMetadata(LLVMConstInt(L->i1, 1, 0))};
	return LLVMMDNodeInContext2(L->ctx, ops, value ? 2 : 1);
}

/* A loop around a vectorized loop (not a CG_UNROLL one, not of one
 * iteration) in a kernel that is not small: LLVM would fully unroll a
 * short one and then vectorize every copy of the inner loop, its remainder
 * and runtime checks included; kept rolled, ResNet-18 compiles in half the
 * time (LLVM 7.2 -> 3.3 s, one thread) and its kernels outside the GEMM run
 * within 1-2%.  A small kernel (SMALL_KERNEL in cost_stmt's units) is
 * unrolled as before: the small CNN's first conv (im2col over 28-wide
 * rows, cost 1093) ran 1.5x slower rolled, 0.036 -> 0.055-0.086 ms at
 * batch 16. */
enum { CG_OUTER = 1 << 30 };
static void loop_hints(cg_llvm *L, LLVMValueRef br, uint32_t hints)
{
	LLVMMetadataRef props[CG_LOOP_MD_MAX];
	int n = 0;
	if ((hints & CG_VECTORIZE) && (hints & CG_REDUCE))
		props[n++] = md_flag(L, "llvm.loop.vectorize.enable", true);
	/* the vectorizer folds the tail into masked vector operations: only
	 * for loops that ask (a short row), as every vectorized loop with
	 * it lost 2-6% on MNASNet (node sums, 5 alternating rounds); and
	 * only with AVX-512's mask registers: without them a masked load or
	 * store is several plain ones' cost (see llvm_gemm.c's full_first) */
	if ((hints & CG_VECTORIZE) && (hints & CG_TAIL_MASK) && L->t && L->t->vec_bits >= 512)
		props[n++] = md_flag(L, "llvm.loop.vectorize.predicate.enable", true);
	if (hints & CG_UNROLL)
		props[n++] = md_flag(L, "llvm.loop.unroll.enable", false);
	else if (hints & CG_OUTER)
		props[n++] = md_flag(L, "llvm.loop.unroll.disable", false);
	if (n)
		cg_llvm_loop_md(L, br, props, n);
}

void cg_llvm_loop_md(cg_llvm *L, LLVMValueRef br, const LLVMMetadataRef *props, int n)
{
	if (n < 1 || n > CG_LOOP_MD_MAX) /* a caller's bug: hints only, so none */
		return;
	LLVMMetadataRef ops[1 + CG_LOOP_MD_MAX], tmp = LLVMTemporaryMDNode(L->ctx, NULL, 0);
	ops[0] = tmp;
	memcpy(ops + 1, props, (size_t)n * sizeof *props);
	LLVMMetadataRef node = LLVMMDNodeInContext2(L->ctx, ops, (size_t)n + 1);
	LLVMMetadataReplaceAllUsesWith(tmp, node);
	unsigned kind = LLVMGetMDKindIDInContext(L->ctx, "llvm.loop", 9);
	LLVMSetMetadata(br, kind, LLVMMetadataAsValue(L->ctx, node));
}

static void loop_end(fn_ctx *c, loop *l, uint32_t hints)
{
	LLVMBuilderRef B = c->L->b;
	LLVMBasicBlockRef latch = LLVMGetInsertBlock(B);
	LLVMValueRef next = LLVMBuildNSWAdd(B, l->iv, i64c(c->L, 1), "");
	LLVMValueRef br = LLVMBuildCondBr(B, LLVMBuildICmp(B, LLVMIntSLT, next, l->hi, ""),
	                                  l->body, l->exit);
	loop_hints(c->L, br, hints);
	LLVMAddIncoming(l->iv, &next, &latch, 1);
	LLVMPositionBuilderAtEnd(B, l->exit);
	c->depth--;
}

static void emit_loop(fn_ctx *c, int var, LLVMValueRef lo, LLVMValueRef hi, uint32_t hints,
                      const cg_stmt *body)
{
	loop l;
	LLVMValueRef saved = c->var[var];
	c->var[var] = loop_begin(c, &l, lo, hi);
	stmt(c, body);
	loop_end(c, &l, hints);
	c->var[var] = saved;
}

/* ---- statements ---------------------------------------------------------------- */

static LLVMValueRef emit_fn(cg_llvm *L, const cg_kernel *k, const char *name,
                            const cg_stmt *s, bool range, int *npar, kiln_error *err,
                            kiln_status *st, bool shared, LLVMValueRef *impl);

/* Whether s holds a vectorized loop. */
static bool has_loop(const cg_stmt *s)
{
	if (!s)
		return false;
	if (s->kind == CG_FOR && (s->hints & CG_VECTORIZE))
		return true;
	if (s->kind == CG_FOR)
		return has_loop(s->body);
	for (int i = 0; s->kind == CG_BLOCK && i < s->n; i++)
		if (has_loop(s->items[i]))
			return true;
	return has_loop(s->then_s) || has_loop(s->else_s);
}

static void s_block(fn_ctx *c, const cg_stmt *s)
{
	for (int i = 0; i < s->n && c->st == KILN_OK; i++)
		stmt(c, s->items[i]);
}

/* A parallel loop can be outlined when its body reads no variable bound
 * outside it (it sees only buffers, sizes and its own variables). */
static bool outlinable(fn_ctx *c, const cg_stmt *s)
{
	scan sc;
	bool ok = scan_init(&sc, c->L->m, c->k->nvar);
	if (ok) {
		sc.bound[s->var] = 1;
		scan_stmt(&sc, s->body);
		for (int v = 0; v < c->k->nvar && ok; v++)
			ok = !sc.used[v] || sc.bound[v];
		ok = ok && !sc.bad;
	}
	scan_free(&sc);
	return ok;
}

static void par_call(fn_ctx *c, const cg_stmt *s)
{
	cg_llvm *L = c->L;
	char name[256];
	snprintf(name, sizeof name, "%s.par%d", c->k->name, (*c->npar)++);
	LLVMBasicBlockRef here = LLVMGetInsertBlock(L->b);
	LLVMValueRef f = emit_fn(L, c->k, name, s, true, c->npar, c->err, &c->st, false, NULL);
	LLVMPositionBuilderAtEnd(L->b, here);
	if (!f)
		return;
	LLVMValueRef n = convert(c, expr(c, s->extent), s->extent->dt, KILN_I64);
	LLVMValueRef args[3] = {c->x, n, f};
	LLVMBuildCall2(L->b, LLVMGlobalGetValueType(L->par_for), L->par_for, args, 3, "");
}

static bool s_lanes(fn_ctx *c, const cg_stmt *s);

static void s_for(fn_ctx *c, const cg_stmt *s)
{
	if (!s->extent || !s->body) {
		fail(c, KILN_EINVAL, "a loop without extent or body");
		return;
	}
	if ((s->hints & CG_PARALLEL) && c->depth == 0 && outlinable(c, s)) {
		par_call(c, s);
		return;
	}
	if ((s->hints & CG_LANES) && s_lanes(c, s))
		return;
	LLVMValueRef hi = convert(c, expr(c, s->extent), s->extent->dt, KILN_I64);
	bool one = s->extent && s->extent->kind == CG_CONST && s->extent->i <= 1;
	uint32_t outer = !one && !(s->hints & CG_UNROLL) && !c->L->small && has_loop(s->body)
	                 ? CG_OUTER : 0;
	emit_loop(c, s->var, i64c(c->L, 0), hi, s->hints | outer, s->body);
}

/* ---- loops of lanes ---------------------------------------------------------
 * A CG_LANES loop (CG_VECTORIZE, a constant extent W) whose body is
 * straight-line f32 work is emitted once, on <W x float> vectors, instead
 * of as a loop for LLVM's vectorizer.  That one runs after LICM, which
 * hoists every load the loop does not index out of it first: a body that
 * multiplies one vector of weights by many broadcast inputs (the lanes
 * form of a grouped conv: 14 pixels x 36 taps) had all 504 broadcasts
 * hoisted, live at once and spilled, 31 KB of stack (3-5x slower than the
 * flat form).  Emitted as vectors there is no loop to hoist them out of:
 * each broadcast is loaded where it is used.  What qualifies: assignments
 * of f32 locals first assigned in the body, f32 stores and loads at a
 * lane-independent index plus the loop variable, float arithmetic,
 * min/max, comparisons and selects; anything else lane-dependent keeps
 * the loop (lanes_ok). */
typedef struct lanes {
	int var;            /* the loop variable */
	unsigned w;         /* its extent: lanes per vector */
	uint8_t *vec;       /* per variable: assigned in the body (a vector) */
	LLVMValueRef *val;  /* per variable: its current vector */
} lanes;

/* Whether e depends on the lanes: reads the loop variable or a local of the body. */
static bool lane_dep(const lanes *ln, const cg_expr *e)
{
	if (!e)
		return false;
	switch (e->kind) {
	case CG_VAR: return e->var == ln->var || ln->vec[e->var];
	case CG_LOAD: return lane_dep(ln, e->a);
	case CG_UN:
	case CG_CAST: return lane_dep(ln, e->a);
	case CG_BIN: return lane_dep(ln, e->a) || lane_dep(ln, e->b);
	case CG_SELECT: return lane_dep(ln, e->a) || lane_dep(ln, e->b) || lane_dep(ln, e->c);
	default: return false;
	}
}

/* Whether index e is a lane-independent base plus the loop variable. */
static bool lane_affine(const lanes *ln, const cg_expr *e)
{
	if (!e)
		return false;
	if (e->kind == CG_VAR)
		return e->var == ln->var;
	if (e->kind != CG_BIN || e->op != CG_ADD || e->dt != KILN_I64)
		return false;
	bool da = lane_dep(ln, e->a), db = lane_dep(ln, e->b);
	return da != db && lane_affine(ln, da ? e->a : e->b);
}

/* Buffer b holds f32 and the kernel has its pointer. */
static bool lane_buf(const fn_ctx *c, int b)
{
	return b >= 0 && b < c->L->m->nbuf && c->L->m->buf[b].dt == KILN_F32 && c->bufp && c->bufp[b];
}

/* Whether lane_expr can emit e; def: the body's locals assigned so far. */
static bool lane_expr_ok(const fn_ctx *c, const uint8_t *def, const cg_expr *e)
{
	const lanes *ln = c->ln;
	if (!e)
		return false;
	if (!lane_dep(ln, e))
		return true;
	switch (e->kind) {
	case CG_VAR: return e->var != ln->var && def[e->var] && e->dt == KILN_F32;
	case CG_LOAD: return e->dt == KILN_F32 && lane_buf(c, e->buf) && lane_affine(ln, e->a);
	case CG_BIN:
		if (!e->a || !e->b || e->a->dt != KILN_F32 || e->b->dt != KILN_F32)
			return false;
		if (!(e->op == CG_ADD || e->op == CG_SUB || e->op == CG_MUL || e->op == CG_DIV ||
		      e->op == CG_MIN || e->op == CG_MAX || (e->op >= CG_EQ && e->op <= CG_GE)))
			return false;
		return lane_expr_ok(c, def, e->a) && lane_expr_ok(c, def, e->b);
	case CG_SELECT:
		return e->dt == KILN_F32 && e->a && e->a->dt == KILN_BOOL && lane_expr_ok(c, def, e->a) &&
		       lane_expr_ok(c, def, e->b) && lane_expr_ok(c, def, e->c);
	default: return false;
	}
}

static bool lanes_ok(const fn_ctx *c, uint8_t *def, const cg_stmt *s)
{
	const lanes *ln = c->ln;
	if (!s)
		return false;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n; i++)
			if (!lanes_ok(c, def, s->items[i]))
				return false;
		return true;
	case CG_ASSIGN:
		if (!ln->vec[s->var] || c->local[s->var] != KILN_F32 || !s->value ||
		    s->value->dt != KILN_F32 || !lane_expr_ok(c, def, s->value))
			return false;
		def[s->var] = 1;
		return true;
	case CG_STORE:
		return lane_buf(c, s->buf) && s->value && s->value->dt == KILN_F32 &&
		       lane_affine(ln, s->index) &&
		       lane_expr_ok(c, def, s->value);
	default: return false;
	}
}

/* Marks the locals s assigns. */
static void lane_locals(lanes *ln, const cg_stmt *s)
{
	if (s && s->kind == CG_BLOCK)
		for (int i = 0; i < s->n; i++)
			lane_locals(ln, s->items[i]);
	else if (s && s->kind == CG_ASSIGN)
		ln->vec[s->var] = 1;
}

static LLVMValueRef splat(fn_ctx *c, LLVMValueRef v)
{
	LLVMBuilderRef B = c->L->b;
	unsigned w = c->ln->w;
	LLVMValueRef one = LLVMBuildInsertElement(B, LLVMGetUndef(LLVMVectorType(LLVMTypeOf(v), w)),
	                                          v, i32c(c->L, 0), "");
	return LLVMBuildShuffleVector(B, one, LLVMGetUndef(LLVMTypeOf(one)),
	                              LLVMConstNull(LLVMVectorType(c->L->i32, w)), "");
}

/* The lane-0 element index of a lane_affine index. */
static LLVMValueRef lane_base(fn_ctx *c, const cg_expr *e)
{
	if (e->kind == CG_VAR)
		return i64c(c->L, 0);
	bool da = lane_dep(c->ln, e->a);
	const cg_expr *o = da ? e->b : e->a;
	LLVMValueRef base = lane_base(c, da ? e->a : e->b);
	return LLVMBuildAdd(c->L->b, base, convert(c, expr(c, o), o->dt, KILN_I64), "");
}

static LLVMValueRef lane_ptr(fn_ctx *c, int buf, const cg_expr *index)
{
	LLVMValueRef idx = lane_base(c, index);
	LLVMValueRef p = LLVMBuildInBoundsGEP2(c->L->b, c->L->f32, c->bufp[buf], &idx, 1, "");
	return LLVMBuildBitCast(c->L->b, p,
	                        LLVMPointerType(LLVMVectorType(c->L->f32, c->ln->w), 0), "");
}

static LLVMValueRef lane_expr(fn_ctx *c, const cg_expr *e)
{
	LLVMBuilderRef B = c->L->b;
	if (!lane_dep(c->ln, e))
		return splat(c, convert(c, expr(c, e), e->dt, e->dt == KILN_BOOL ? KILN_BOOL : KILN_F32));
	switch (e->kind) {
	case CG_VAR: return c->ln->val[e->var];
	case CG_LOAD: {
		LLVMValueRef v = LLVMBuildLoad2(B, LLVMVectorType(c->L->f32, c->ln->w),
		                                lane_ptr(c, e->buf, e->a), "");
		LLVMSetAlignment(v, 4);
		return v;
	}
	case CG_SELECT:
		return LLVMBuildSelect(B, lane_expr(c, e->a), lane_expr(c, e->b), lane_expr(c, e->c), "");
	default: break;
	}
	if (e->op == CG_ADD && (is_fmul(e->a) || is_fmul(e->b))) {
		const cg_expr *m = is_fmul(e->b) ? e->b : e->a, *o = m == e->b ? e->a : e->b;
		return fmuladd(c, lane_expr(c, m->a), lane_expr(c, m->b), lane_expr(c, o));
	}
	LLVMValueRef a = lane_expr(c, e->a), b = lane_expr(c, e->b);
	const struct binop_info *bi = &binop_table[e->op];
	switch (e->op) {
	case CG_ADD: return LLVMBuildFAdd(B, a, b, "");
	case CG_SUB: return LLVMBuildFSub(B, a, b, "");
	case CG_MUL: return LLVMBuildFMul(B, a, b, "");
	case CG_DIV: return LLVMBuildFDiv(B, a, b, "");
	case CG_MIN:
	case CG_MAX: return minmax(c, bi, a, b, KILN_F32);
	default: return LLVMBuildFCmp(B, bi->fp, a, b, "");
	}
}

static void lane_stmt(fn_ctx *c, const cg_stmt *s)
{
	if (s->kind == CG_BLOCK) {
		for (int i = 0; i < s->n; i++)
			lane_stmt(c, s->items[i]);
	} else if (s->kind == CG_ASSIGN) {
		c->ln->val[s->var] = lane_expr(c, s->value);
	} else { /* CG_STORE */
		LLVMValueRef v = lane_expr(c, s->value);
		LLVMSetAlignment(LLVMBuildStore(c->L->b, v, lane_ptr(c, s->buf, s->index)), 4);
	}
}

/* s, a CG_LANES loop, emitted on vectors when it qualifies; false (nothing
 * emitted) when not. */
static bool s_lanes(fn_ctx *c, const cg_stmt *s)
{
	const cg_expr *x = s->extent;
	int nv = c->k->nvar;
	if (c->ln || !(s->hints & CG_VECTORIZE) || !x || x->kind != CG_CONST || x->i < 2 ||
	    x->i > 64 || s->var < 0 || s->var >= nv)
		return false;
	lanes ln = {.var = s->var, .w = (unsigned)x->i, .vec = calloc((size_t)nv, 2),
	            .val = calloc((size_t)nv, sizeof(LLVMValueRef))};
	bool ok = ln.vec && ln.val;
	if (ok) {
		uint8_t *def = ln.vec + nv;
		lane_locals(&ln, s->body);
		c->ln = &ln;
		ok = lanes_ok(c, def, s->body);
		if (ok)
			lane_stmt(c, s->body);
		c->ln = NULL;
	}
	free(ln.vec);
	free(ln.val);
	return ok;
}

static void s_store(fn_ctx *c, const cg_stmt *s)
{
	kiln_dtype dt = c->L->m->buf[s->buf].dt;
	LLVMValueRef v = convert(c, expr(c, s->value), s->value ? s->value->dt : dt, dt);
	if (dt == KILN_BOOL)
		v = LLVMBuildZExt(c->L->b, v, c->L->i8, "");
	if (dt_half(dt))
		v = half_store(c, v, dt);
	LLVMBuildStore(c->L->b, v, elem_ptr(c, s->buf, s->index));
}

static void s_assign(fn_ctx *c, const cg_stmt *s)
{
	kiln_dtype dt = c->local[s->var];
	LLVMValueRef v = convert(c, expr(c, s->value), s->value ? s->value->dt : dt, dt);
	LLVMBuildStore(c->L->b, v, c->var[s->var]);
}

static void s_if(fn_ctx *c, const cg_stmt *s)
{
	LLVMBuilderRef B = c->L->b;
	LLVMValueRef cond = convert(c, expr(c, s->cond), s->cond ? s->cond->dt : KILN_BOOL,
	                            KILN_BOOL);
	LLVMBasicBlockRef then_b = LLVMAppendBasicBlockInContext(c->L->ctx, c->fn, "then");
	LLVMBasicBlockRef else_b = LLVMAppendBasicBlockInContext(c->L->ctx, c->fn, "else");
	LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(c->L->ctx, c->fn, "endif");
	LLVMBuildCondBr(B, cond, then_b, else_b);
	LLVMPositionBuilderAtEnd(B, then_b);
	stmt(c, s->then_s);
	LLVMBuildBr(B, join);
	LLVMPositionBuilderAtEnd(B, else_b);
	stmt(c, s->else_s);
	LLVMBuildBr(B, join);
	LLVMPositionBuilderAtEnd(B, join);
}

static LLVMValueRef iexpr(fn_ctx *c, const cg_expr *e)
{
	return convert(c, expr(c, e), e ? e->dt : KILN_I64, KILN_I64);
}

/* p + off + b*bs, as a float * */
static LLVMValueRef gemm_ptr(fn_ctx *c, int buf, const cg_expr *off, const cg_expr *bs,
                             LLVMValueRef b)
{
	LLVMBuilderRef B = c->L->b;
	LLVMValueRef idx = off ? iexpr(c, off) : i64c(c->L, 0);
	if (bs)
		idx = LLVMBuildAdd(B, idx, LLVMBuildMul(B, b, iexpr(c, bs), ""), "");
	return LLVMBuildInBoundsGEP2(B, c->L->f32, c->bufp[buf], &idx, 1, "");
}

/* &buf[off + b*bs] as an i8 * (NULL when buf < 0) */
static LLVMValueRef byte_ptr(fn_ctx *c, int buf, const cg_expr *off, const cg_expr *bs,
                             LLVMValueRef b)
{
	LLVMBuilderRef B = c->L->b;
	if (buf < 0)
		return LLVMConstNull(c->L->ptr);
	LLVMValueRef idx = off ? iexpr(c, off) : i64c(c->L, 0);
	if (bs && b)
		idx = LLVMBuildAdd(B, idx, LLVMBuildMul(B, b, iexpr(c, bs), ""), "");
	LLVMValueRef p = LLVMBuildInBoundsGEP2(B, mty(c->L, c->L->m->buf[buf].dt), c->bufp[buf],
	                                       &idx, 1, "");
	return LLVMBuildBitCast(B, p, c->L->ptr, "");
}

/* An epilogue vector's buffer at its offset, or NULL when absent. */
static LLVMValueRef vec_ptr(fn_ctx *c, const cg_gemm_vec *v)
{
	return byte_ptr(c, v->axis ? v->buf : -1, v->off, NULL, NULL);
}

/* An 8-bit GEMM: a loop over the batch calling kiln_qgemm_* (llvm_qgemm.c). */
static void s_qgemm(fn_ctx *c, const cg_gemm *g)
{
	cg_llvm *L = c->L;
	LLVMBasicBlockRef here = LLVMGetInsertBlock(L->b);
	LLVMValueRef f = cg_llvm_qgemm(L, g->a_dt, g->b_dt, g->c_dt); /* moves the builder */
	LLVMPositionBuilderAtEnd(L->b, here);
	if (!f) {
		fail(c, KILN_EUNSUPPORTED, "8-bit GEMM of these dtypes");
		return;
	}
	loop l;
	LLVMValueRef b = loop_begin(c, &l, i64c(L, 0), g->batch ? iexpr(c, g->batch) : i64c(L, 1));
	double lo = g->act == CG_ACT_CLIP ? g->act_lo : g->act == CG_ACT_RELU ? 0 : -__builtin_inf();
	double hi = g->act == CG_ACT_CLIP ? g->act_hi : __builtin_inf();
	LLVMValueRef bias = byte_ptr(c, g->bias, g->bias_off, NULL, NULL);
	LLVMValueRef args[22] = {
		c->x, iexpr(c, g->M), iexpr(c, g->N), iexpr(c, g->K),
		byte_ptr(c, g->a, g->a_off, g->a_bs, b), iexpr(c, g->a_rs),
		byte_ptr(c, g->b, g->b_off, g->b_bs, b), iexpr(c, g->b_rs),
		byte_ptr(c, g->has_b_rows ? g->b_rows : -1, NULL, NULL, NULL),
		byte_ptr(c, g->c, g->c_off, g->c_bs, b), iexpr(c, g->c_rs),
		vec_ptr(c, &g->a_zero), i64c(L, g->a_zero.axis == CG_AXIS_ROW),
		vec_ptr(c, &g->b_zero), i64c(L, g->b_zero.axis == CG_AXIS_COL),
		bias, i32c(L, g->bias >= 0 ? g->bias_axis : 0),
		vec_ptr(c, &g->scale), i32c(L, g->scale.axis),
		vec_ptr(c, &g->c_zero), LLVMConstReal(L->f32, lo), LLVMConstReal(L->f32, hi)};
	LLVMTypeRef ft = LLVMGlobalGetValueType(f), pt[22];
	LLVMGetParamTypes(ft, pt);
	for (int i = 0; i < 22; i++)
		if (LLVMGetTypeKind(pt[i]) == LLVMPointerTypeKind)
			args[i] = LLVMBuildBitCast(L->b, args[i], pt[i], "");
	LLVMBuildCall2(L->b, ft, f, args, 22, "");
	loop_end(c, &l, 0);
}

/* A loop over the batch calling kiln_sgemm on each product. */
static void s_gemm(fn_ctx *c, const cg_stmt *s)
{
	cg_llvm *L = c->L;
	const cg_gemm *g = s->gemm;
	if (cg_gemm_is_int8(g)) {
		s_qgemm(c, g);
		return;
	}
	int bufs[] = {g->a, g->b, g->c, g->bias >= 0 ? g->bias : g->a,
	              g->has_residual ? g->residual : g->a};
	for (int i = 0; i < 5; i++)
		if (L->m->buf[bufs[i]].dt != KILN_F32) {
			fail(c, KILN_EUNSUPPORTED, "GEMM on a non-f32 buffer");
			return;
		}
	LLVMBasicBlockRef here = LLVMGetInsertBlock(L->b);
	/* B or A packed in panels at compile time (cg_prepack): kiln_sgemm_pb
	 * or kiln_sgemm_pa, whose panels are this target's */
	bool pb = g->b_panel > 0, pa = g->a_panel > 0;
	bool pbw = pb && g->b_panel == cg_sgemm_wide_panel(L->t);
	bool pm = pa && g->a_panel == cg_sgemm_m_panel(L->t, NULL, NULL);
	if ((pb && !pbw && g->b_panel != cg_sgemm_panel(L->t)) ||
	    (pa && !pm && g->a_panel != cg_sgemm_a_panel(L->t)) || (pa && pb)) {
		fail(c, KILN_EINVAL, "GEMM operand packed in panels this target's GEMM does not read");
		return;
	}
	/* C in blocks: kiln_sgemm_pm's, of its vector's rows */
	int blk = cg_sgemm_c_block(L->t, NULL);
	if ((g->c_block && (!pm || g->c_block != blk || g->has_residual)) ||
	    (g->b_block && (!pm || g->b_block != blk))) {
		fail(c, KILN_EINVAL, "GEMM with B or C in blocks of rows without kiln_sgemm_pm's panels");
		return;
	}
	/* may build it, moving the builder */
	LLVMValueRef f = pbw  ? cg_llvm_sgemm_pbw(L)
	                 : pb ? cg_llvm_sgemm_pb(L)
	                 : pm ? cg_llvm_sgemm_pm(L)
	                 : pa ? cg_llvm_sgemm_pa(L)
	                      : cg_llvm_sgemm(L);
	LLVMPositionBuilderAtEnd(L->b, here);
	loop l;
	LLVMValueRef b = loop_begin(c, &l, i64c(L, 0), g->batch ? iexpr(c, g->batch) : i64c(L, 1));
	LLVMValueRef bias = g->bias >= 0 ? gemm_ptr(c, g->bias, g->bias_off, NULL, b)
	                                 : LLVMConstNull(LLVMPointerType(L->f32, 0));
	/* the activation as a clamp to [lo, hi] */
	double act_lo = g->act == CG_ACT_CLIP ? g->act_lo : g->act == CG_ACT_RELU ? 0 : -__builtin_inf();
	double act_hi = g->act == CG_ACT_CLIP ? g->act_hi : __builtin_inf();
	LLVMValueRef res = g->has_residual ? gemm_ptr(c, g->residual, g->res_off, g->c_bs, b)
	                                   : LLVMConstNull(LLVMPointerType(L->f32, 0));
	LLVMValueRef args[20] = {
		c->x, iexpr(c, g->M), iexpr(c, g->N), iexpr(c, g->K), fc(c, g->alpha),
		gemm_ptr(c, g->a, g->a_off, g->a_bs, b), iexpr(c, g->a_rs), iexpr(c, g->a_cs),
		gemm_ptr(c, g->b, g->b_off, g->b_bs, b), iexpr(c, g->b_rs), iexpr(c, g->b_cs),
		fc(c, g->beta), gemm_ptr(c, g->c, g->c_off, g->c_bs, b), iexpr(c, g->c_rs),
		bias, i32c(L, g->bias_axis | (g->c_block ? CG_SGEMM_C_BLOCKED : 0) |
		              (g->b_block ? CG_SGEMM_B_BLOCKED : 0)),
		LLVMConstReal(L->f32, act_lo), LLVMConstReal(L->f32, act_hi),
		res, g->has_residual ? iexpr(c, g->res_rs) : i64c(L, 0)};
	LLVMTypeRef ft = LLVMGlobalGetValueType(f);
	LLVMTypeRef pt[20];
	if (LLVMCountParamTypes(ft) != 20) {
		fail(c, KILN_EINVAL, "kiln_sgemm has an unexpected signature");
		return;
	}
	LLVMGetParamTypes(ft, pt);
	for (int i = 0; i < 20; i++)
		if (LLVMGetTypeKind(pt[i]) == LLVMPointerTypeKind)
			args[i] = LLVMBuildBitCast(L->b, args[i], pt[i], "");
	LLVMBuildCall2(L->b, ft, f, args, 20, "");
	loop_end(c, &l, 0);
}

/* One call of kiln_transpose (llvm_gemm.c). */
static void s_transpose(fn_ctx *c, const cg_stmt *s)
{
	cg_llvm *L = c->L;
	const cg_transpose *t = s->tr;
	if (L->m->buf[t->src].dt != KILN_F32 || L->m->buf[t->dst].dt != KILN_F32) {
		fail(c, KILN_EUNSUPPORTED, "transpose of a non-f32 buffer");
		return;
	}
	LLVMBasicBlockRef here = LLVMGetInsertBlock(L->b);
	LLVMValueRef f = cg_llvm_transpose(L); /* may build it, moving the builder */
	LLVMPositionBuilderAtEnd(L->b, here);
	LLVMTypeRef ft = LLVMGlobalGetValueType(f), pt[6];
	LLVMGetParamTypes(ft, pt);
	LLVMValueRef args[6] = {gemm_ptr(c, t->src, t->src_off, NULL, NULL), iexpr(c, t->src_rs),
	                        gemm_ptr(c, t->dst, t->dst_off, NULL, NULL), iexpr(c, t->dst_rs),
	                        iexpr(c, t->rows), iexpr(c, t->cols)};
	args[0] = LLVMBuildBitCast(L->b, args[0], pt[0], "");
	args[2] = LLVMBuildBitCast(L->b, args[2], pt[2], "");
	LLVMBuildCall2(L->b, ft, f, args, 6, "");
}

static LLVMTypeRef exec_ptr(const cg_llvm *L);

/* if (value < lo || value >= hi) rt_out_of_range(x, what, value, lo, hi):
 * a cold call (the runtime records the first fault of a run) on a branch
 * the loop around it rarely takes.  Without lo and hi: if (value == 0),
 * reported with the empty range [0, 0) (the runtime then prints what). */
static void s_check(fn_ctx *c, const cg_stmt *s)
{
	cg_llvm *L = c->L;
	LLVMBuilderRef B = L->b;
	LLVMValueRef v = iexpr(c, s->value);
	LLVMValueRef lo = s->lo ? iexpr(c, s->lo) : i64c(L, 0), hi = s->hi ? iexpr(c, s->hi) : lo;
	LLVMValueRef bad = s->lo ? LLVMBuildOr(B, LLVMBuildICmp(B, LLVMIntSLT, v, lo, ""),
	                                       LLVMBuildICmp(B, LLVMIntSGE, v, hi, ""), "")
	                         : LLVMBuildICmp(B, LLVMIntEQ, v, lo, "");
	LLVMBasicBlockRef fault = LLVMAppendBasicBlockInContext(L->ctx, c->fn, "fault");
	LLVMBasicBlockRef ok = LLVMAppendBasicBlockInContext(L->ctx, c->fn, "checked");
	LLVMValueRef br = LLVMBuildCondBr(B, bad, fault, ok);
	LLVMValueRef w[3] = {LLVMMDStringInContext(L->ctx, "branch_weights", 14), i32c(L, 1),
	                     i32c(L, 1 << 20)};
	LLVMSetMetadata(br, LLVMGetMDKindIDInContext(L->ctx, "prof", 4),
	                LLVMMDNodeInContext(L->ctx, w, 3));
	LLVMPositionBuilderAtEnd(B, fault);
	LLVMTypeRef pt[5] = {exec_ptr(L), L->ptr, L->i64, L->i64, L->i64};
	LLVMTypeRef ft = LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), pt, 5, 0);
	LLVMValueRef f = cg_llvm_runtime_fn(L, "rt_out_of_range", ft);
	add_attr(L, f, LLVMAttributeFunctionIndex, "cold");
	LLVMValueRef args[5] = {c->x, cg_llvm_cstr(L, s->what), v, lo, hi};
	LLVMBuildCall2(B, ft, f, args, 5, "");
	LLVMBuildBr(B, ok);
	LLVMPositionBuilderAtEnd(B, ok);
}

typedef void (*stmt_fn)(fn_ctx *c, const cg_stmt *s);
static const stmt_fn stmt_table[] = {
	[CG_BLOCK] = s_block, [CG_FOR] = s_for, [CG_STORE] = s_store,
	[CG_ASSIGN] = s_assign, [CG_IF] = s_if, [CG_GEMM] = s_gemm, [CG_CHECK] = s_check,
	[CG_TRANSPOSE] = s_transpose,
};

static void stmt(fn_ctx *c, const cg_stmt *s)
{
	if (!s || c->st != KILN_OK)
		return;
	if ((unsigned)s->kind >= sizeof stmt_table / sizeof *stmt_table || !stmt_table[s->kind] ||
	    (s->kind == CG_GEMM && !s->gemm) || (s->kind == CG_TRANSPOSE && !s->tr) ||
	    (s->kind == CG_CHECK && (!s->value || !s->lo != !s->hi || !s->what))) {
		fail(c, KILN_EINVAL, "a malformed statement");
		return;
	}
	stmt_table[s->kind](c, s);
}

/* ---- kernels and outlined loops ------------------------------------------------ */

static LLVMTypeRef exec_ptr(const cg_llvm *L)
{
	return LLVMPointerType(L->exec_ty, 0);
}

/* Loads field i of *x. */
static LLVMValueRef exec_field(cg_llvm *L, LLVMValueRef x, int i, LLVMTypeRef ty)
{
	LLVMValueRef p = LLVMBuildStructGEP2(L->b, L->exec_ty, x, (unsigned)i, "");
	return LLVMBuildLoad2(L->b, ty, p, "");
}

/* The body function: (x, sym, begin, end, one noalias pointer per root). */
static void fill_impl(fn_ctx *c, const scan *sc, const int *roots, const cg_stmt *s,
                      bool range)
{
	cg_llvm *L = c->L;
	const cg_module *m = L->m;
	LLVMPositionBuilderAtEnd(L->b, c->entry);
	LLVMValueRef sym = LLVMGetParam(c->fn, 1);
	for (int k = 0; k < m->nsym; k++) {
		LLVMValueRef p = LLVMBuildInBoundsGEP2(L->b, L->i64, sym, (LLVMValueRef[]){i64c(L, k)},
		                                       1, "");
		c->symv[k] = LLVMBuildLoad2(L->b, L->i64, p, "");
	}
	for (int b = 0; b < m->nbuf; b++) {
		if (!sc->buf[b])
			continue;
		int r = root_of(m, b), i = 0;
		while (roots[i] != r)
			i++;
		c->bufp[b] = LLVMBuildBitCast(L->b, LLVMGetParam(c->fn, (unsigned)(4 + i)),
		                              LLVMPointerType(mty(L, m->buf[b].dt), 0), "");
	}
	for (int v = 0; v < sc->nvar; v++)
		if (sc->local[v])
			c->var[v] = LLVMBuildAlloca(L->b, vty(L, sc->local[v]), "");
	if (!range && c->k->guard) { /* a guarded kernel returns unless its guard holds */
		LLVMBasicBlockRef run = LLVMAppendBasicBlockInContext(L->ctx, c->fn, "guarded");
		LLVMBasicBlockRef skip = LLVMAppendBasicBlockInContext(L->ctx, c->fn, "skip");
		LLVMBuildCondBr(L->b, convert(c, expr(c, c->k->guard), c->k->guard->dt, KILN_BOOL),
		                run, skip);
		LLVMPositionBuilderAtEnd(L->b, skip);
		LLVMBuildRetVoid(L->b);
		LLVMPositionBuilderAtEnd(L->b, run);
	}
	if (range)
		emit_loop(c, s->var, LLVMGetParam(c->fn, 2), LLVMGetParam(c->fn, 3),
		          s->hints & ~(uint32_t)CG_PARALLEL, s->body);
	else
		stmt(c, s);
	LLVMBuildRetVoid(L->b);
}

/* The wrapper.  A kernel's (range false): loads x->buf[root] for each of
 * its roots in table order into a table on its stack, and calls impl with
 * a copy of *x whose buf is that table, so that the impl and the loops it
 * outlines address buffers by table index, not buffer id, and kernels with
 * equal keys share one impl.  An outlined loop's (range true): loads its
 * roots from x->buf (the kernel's table) at their table indices. */
static void fill_wrapper(cg_llvm *L, LLVMValueRef w, LLVMValueRef impl, const int *roots,
                         int nroot, bool range)
{
	LLVMPositionBuilderAtEnd(L->b, LLVMAppendBasicBlockInContext(L->ctx, w, "entry"));
	LLVMValueRef x = LLVMGetParam(w, 0);
	LLVMValueRef bufs = exec_field(L, x, 0, LLVMPointerType(L->ptr, 0));
	LLVMValueRef *args = calloc((size_t)nroot + 4, sizeof *args);
	if (!args)
		return;
	args[0] = x;
	args[1] = exec_field(L, x, 1, LLVMPointerType(L->i64, 0));
	args[2] = range ? LLVMGetParam(w, 1) : i64c(L, 0);
	args[3] = range ? LLVMGetParam(w, 2) : i64c(L, 0);
	LLVMValueRef tbl = NULL;
	if (!range) {
		LLVMTypeRef tt = LLVMArrayType(L->ptr, (unsigned)(nroot > 0 ? nroot : 1));
		tbl = LLVMBuildAlloca(L->b, tt, "table");
		LLVMValueRef xl = LLVMBuildAlloca(L->b, L->exec_ty, "x");
		LLVMBuildStore(L->b, LLVMBuildLoad2(L->b, L->exec_ty, x, ""), xl);
		LLVMValueRef t0 = LLVMBuildBitCast(L->b, tbl, LLVMPointerType(L->ptr, 0), "");
		LLVMBuildStore(L->b, t0, LLVMBuildStructGEP2(L->b, L->exec_ty, xl, 0, ""));
		args[0] = xl;
	}
	for (int i = 0; i < nroot; i++) {
		int at = range && L->canon ? L->canon[roots[i]] : roots[i];
		LLVMValueRef p = LLVMBuildInBoundsGEP2(L->b, L->ptr, bufs,
		                                       (LLVMValueRef[]){i64c(L, at)}, 1, "");
		args[4 + i] = LLVMBuildLoad2(L->b, L->ptr, p, "");
		if (tbl)
			LLVMBuildStore(L->b, args[4 + i],
			               LLVMBuildInBoundsGEP2(L->b, L->ptr,
			                                     LLVMBuildBitCast(L->b, tbl,
			                                                      LLVMPointerType(L->ptr, 0), ""),
			                                     (LLVMValueRef[]){i64c(L, i)}, 1, ""));
	}
	LLVMBuildCall2(L->b, LLVMGlobalGetValueType(impl), impl, args, (unsigned)nroot + 4, "");
	LLVMBuildRetVoid(L->b);
	free(args);
}

static LLVMValueRef make_impl(cg_llvm *L, const char *name, int nroot, bool shared)
{
	LLVMTypeRef *pt = calloc((size_t)nroot + 4, sizeof *pt);
	if (!pt)
		return NULL;
	pt[0] = exec_ptr(L);
	pt[1] = LLVMPointerType(L->i64, 0);
	pt[2] = pt[3] = L->i64;
	for (int i = 0; i < nroot; i++)
		pt[4 + i] = L->ptr;
	char iname[300];
	snprintf(iname, sizeof iname, "%s.impl", name);
	LLVMValueRef f = add_fn(L, iname, LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), pt,
	                                                  (unsigned)nroot + 4, 0), true);
	free(pt);
	/* inlined into its one wrapper; a shared impl is called by several */
	add_attr(L, f, LLVMAttributeFunctionIndex, shared ? "noinline" : "alwaysinline");
	add_attr(L, f, 2, "noalias");
	for (int i = 0; i < nroot; i++)
		add_attr(L, f, 5 + i, "noalias");
	return f;
}

/* Emits `name` (a kernel, or with range an outlined loop) and its .impl
 * (*impl, when not NULL; shared: kernels with its key will call it too);
 * returns the wrapper, NULL on error (*st, err set).  A kernel's roots are
 * in table order (L->canon). */
static LLVMValueRef emit_fn(cg_llvm *L, const cg_kernel *k, const char *name,
                            const cg_stmt *s, bool range, int *npar, kiln_error *err,
                            kiln_status *st, bool shared, LLVMValueRef *impl)
{
	const cg_module *m = L->m;
	scan sc;
	fn_ctx c = {.L = L, .k = k, .npar = npar, .err = err};
	int *roots = calloc((size_t)m->nbuf + 1, sizeof *roots), nroot = 0;
	c.symv = calloc((size_t)m->nsym + 1, sizeof *c.symv);
	c.bufp = calloc((size_t)m->nbuf + 1, sizeof *c.bufp);
	c.var = calloc((size_t)k->nvar + 1, sizeof *c.var);
	LLVMValueRef w = NULL;
	if (!scan_init(&sc, m, k->nvar) || !roots || !c.symv || !c.bufp || !c.var) {
		*st = ir_seterr(err, KILN_ENOMEM, "out of memory emitting kernel '%s'", k->name);
		goto out;
	}
	scan_stmt(&sc, s);
	if (sc.bad) {
		*st = fail(&c, KILN_EINVAL, "a variable or buffer id out of range");
		goto out;
	}
	c.local = sc.local;
	for (int b = 0; b < m->nbuf; b++) {
		int r = sc.buf[b] ? root_of(m, b) : -1, i = 0;
		while (r >= 0 && i < nroot && roots[i] != r)
			i++;
		if (r >= 0 && i == nroot)
			roots[nroot++] = r;
	}
	if (!range && L->canon) { /* table order; every root must have an index */
		int listed = 0;
		for (int b = 0; b < m->nbuf; b++)
			listed += L->canon[b] >= 0;
		for (int i = 0; i < nroot; i++)
			if (L->canon[roots[i]] < 0 || L->canon[roots[i]] >= listed) {
				*st = fail(&c, KILN_EINVAL, "a buffer the kernel key does not list");
				goto out;
			}
		nroot = listed;
		for (int b = 0; b < m->nbuf; b++)
			if (L->canon[b] >= 0 && L->canon[b] < listed)
				roots[L->canon[b]] = b;
	}
	if (range && L->canon)
		for (int i = 0; i < nroot; i++)
			if (L->canon[roots[i]] < 0) {
				*st = fail(&c, KILN_EINVAL, "an outlined loop's buffer has no table index");
				goto out;
			}
	LLVMTypeRef wt[3] = {exec_ptr(L), L->i64, L->i64};
	w = add_fn(L, name, LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), wt, range ? 3 : 1, 0),
	           true);
	c.fn = make_impl(L, name, nroot, shared);
	if (impl)
		*impl = c.fn;
	if (!c.fn) {
		*st = ir_seterr(err, KILN_ENOMEM, "out of memory emitting kernel '%s'", k->name);
		goto out;
	}
	c.x = LLVMGetParam(c.fn, 0);
	c.entry = LLVMAppendBasicBlockInContext(L->ctx, c.fn, "entry");
	fill_impl(&c, &sc, roots, s, range);
	fill_wrapper(L, w, c.fn, roots, nroot, range);
	*st = c.st;
out:
	scan_free(&sc);
	free(roots);
	free(c.symv);
	free(c.bufp);
	free(c.var);
	return *st == KILN_OK ? w : NULL;
}

/* ---- numel and io_dims ---------------------------------------------------------- */

/* Dim d of buffer b as an i64: its expression over the sizes (CG_SIZE reads
 * c->symv), or the fixed dim of a module built without a graph. */
static LLVMValueRef dim_value(fn_ctx *c, const cg_buf *b, int d)
{
	if (b->dim[d])
		return convert(c, expr(c, b->dim[d]), b->dim[d]->dt, KILN_I64);
	if (b->type.dim[d] < 0)
		fail(c, KILN_EINVAL, "a symbolic dimension has no expression");
	return i64c(c->L, b->type.dim[d]);
}

/* void f(const i64 *sym, i64 *out) with the symbols loaded into c->symv;
 * the builder is left in its entry block. */
static LLVMValueRef sizes_fn(cg_llvm *L, fn_ctx *c, const char *name)
{
	LLVMTypeRef pi = LLVMPointerType(L->i64, 0), pt[2] = {pi, pi};
	c->fn = add_fn(L, name, LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), pt, 2, 0), true);
	LLVMPositionBuilderAtEnd(L->b, LLVMAppendBasicBlockInContext(L->ctx, c->fn, "entry"));
	for (int k = 0; k < L->m->nsym; k++) {
		LLVMValueRef p = LLVMBuildInBoundsGEP2(L->b, L->i64, LLVMGetParam(c->fn, 0),
		                                       (LLVMValueRef[]){i64c(L, k)}, 1, "");
		c->symv[k] = LLVMBuildLoad2(L->b, L->i64, p, "");
	}
	return c->fn;
}

static void store_at(cg_llvm *L, LLVMValueRef base, int i, LLVMValueRef v)
{
	LLVMValueRef p = LLVMBuildInBoundsGEP2(L->b, L->i64, base, (LLVMValueRef[]){i64c(L, i)},
	                                       1, "");
	LLVMBuildStore(L->b, v, p);
}

/* numel(sym, out): out[b] = element count of buffer b. */
static LLVMValueRef numel_fn(cg_llvm *L, fn_ctx *c)
{
	const cg_module *m = L->m;
	LLVMValueRef f = sizes_fn(L, c, "kiln.numel");
	for (int b = 0; b < m->nbuf && c->st == KILN_OK; b++) {
		const cg_buf *bf = &m->buf[b];
		LLVMValueRef v = i64c(L, 1);
		if (bf->numel)
			v = convert(c, expr(c, bf->numel), bf->numel->dt, KILN_I64);
		else
			for (int d = 0; d < bf->type.rank; d++)
				v = LLVMBuildMul(L->b, v, dim_value(c, bf, d), "");
		store_at(L, LLVMGetParam(f, 1), b, v);
	}
	LLVMBuildRetVoid(L->b);
	return f;
}

/* io_dims(sym, out): every input then output dim, in signature order. */
static LLVMValueRef io_dims_fn(cg_llvm *L, fn_ctx *c)
{
	const cg_module *m = L->m;
	LLVMValueRef f = sizes_fn(L, c, "kiln.io_dims");
	int k = 0;
	for (int i = 0; i < m->ninputs + m->noutputs; i++) {
		int b = i < m->ninputs ? m->inputs[i] : m->outputs[i - m->ninputs];
		for (int d = 0; d < m->buf[b].type.rank; d++)
			store_at(L, LLVMGetParam(f, 1), k++, dim_value(c, &m->buf[b], d));
	}
	LLVMBuildRetVoid(L->b);
	return f;
}

/* ---- a program's kernels -------------------------------------------------------- */

static kiln_status check_module(const cg_module *m, kiln_error *err)
{
	for (int b = 0; b < m->nbuf; b++) {
		const cg_buf *bf = &m->buf[b];
		if (!dt_ok(bf->dt))
			return ir_seterr(err, KILN_EUNSUPPORTED, "LLVM backend: buffer %d ('%s') is "
			                 "%s, which it does not handle", b, bf->name ? bf->name : "",
			                 kiln_dtype_name(bf->dt));
		if (bf->alias >= m->nbuf || (unsigned)bf->kind > CG_BUF_STATE)
			return ir_seterr(err, KILN_EINVAL, "LLVM backend: buffer %d is malformed", b);
	}
	for (int i = 0; i < m->ninputs + m->noutputs; i++) {
		int b = i < m->ninputs ? m->inputs[i] : m->outputs[i - m->ninputs];
		if (b < 0 || b >= m->nbuf)
			return ir_seterr(err, KILN_EINVAL, "LLVM backend: signature names buffer %d", b);
	}
	return KILN_OK;
}

/* ---- kernels over parts ----------------------------------------------------------
 * A library's kernels are spread over several modules ("parts", each in its
 * own LLVM context) that llvm_emit.c optimizes and compiles on as many
 * threads, then links together: LLVM is most of a compile's time, and one
 * module is one thread.  Kernels never call each other, so nothing is lost
 * across parts but the sharing of kiln_sgemm and kiln_transpose, which the
 * first part defines for all (hidden), and of each kernel body shared by
 * kernels with equal keys, which is why those stay together. */

/* What a kernel costs LLVM, roughly: its IR nodes, a loop more (LLVM's loop
 * passes and the vectorizer's copies of its body), a call less. */
static int64_t cost_expr(const cg_expr *e)
{
	return e ? 1 + cost_expr(e->a) + cost_expr(e->b) + cost_expr(e->c) : 0;
}

static int64_t cost_stmt(const cg_stmt *s)
{
	if (!s)
		return 0;
	int64_t c = 1 + cost_expr(s->extent) + cost_expr(s->index) + cost_expr(s->value) +
	            cost_expr(s->cond) + cost_expr(s->lo) + cost_expr(s->hi);
	for (int i = 0; s->kind == CG_BLOCK && i < s->n; i++)
		c += cost_stmt(s->items[i]);
	if (s->kind == CG_FOR)
		c += 24 + (s->hints & CG_VECTORIZE ? 2 : 1) * cost_stmt(s->body);
	else
		c += cost_stmt(s->body);
	return c + cost_stmt(s->then_s) + cost_stmt(s->else_s);
}

/* The GEMM and transpose helpers (a part of their own, llvm_emit.c) and
 * the library's descriptors and entry points (parts[0], before any
 * kernel), in cost_stmt's units: kiln_sgemm's family alone compiles in
 * about the time of 10000 units of kernels (ResNet-18's are 45000 and take
 * 2.4 s, the family 0.9 s). */
enum { HELPER_COST = 10000, LIBRARY_COST = 200, PART_MIN_COST = 2000 };
/* Kernels at most this big keep LLVM's unrolling of loops around
 * vectorized loops (CG_OUTER, above). */
enum { SMALL_KERNEL = 1200 };

static bool uses_gemm(const cg_stmt *s)
{
	if (!s)
		return false;
	if (s->kind == CG_GEMM || s->kind == CG_TRANSPOSE)
		return true;
	for (int i = 0; s->kind == CG_BLOCK && i < s->n; i++)
		if (uses_gemm(s->items[i]))
			return true;
	return uses_gemm(s->body) || uses_gemm(s->then_s) || uses_gemm(s->else_s);
}

/* Whether s holds a GEMM with an operand in panels: A in panels ap tall
 * (what 0), B in CG_SGEMM_PANEL-wide panels (1) or in others (2:
 * kiln_sgemm_pbw's). */
static bool uses_panels(const cg_stmt *s, int what, int ap)
{
	if (!s)
		return false;
	if (s->kind == CG_GEMM && s->gemm) {
		int bp = s->gemm->b_panel;
		return what == 0 ? ap > 0 && s->gemm->a_panel == ap
		                 : bp > 0 && (bp == CG_SGEMM_PANEL) == (what == 1);
	}
	for (int i = 0; s->kind == CG_BLOCK && i < s->n; i++)
		if (uses_panels(s->items[i], what, ap))
			return true;
	return uses_panels(s->body, what, ap) || uses_panels(s->then_s, what, ap) ||
	       uses_panels(s->else_s, what, ap);
}

bool cg_llvm_uses_sgemm_pb(const cg_module *m, bool wide)
{
	for (int k = 0; m && k < m->nkern; k++)
		if (uses_panels(m->kern[k].body, wide ? 2 : 1, 0))
			return true;
	return false;
}

bool cg_llvm_uses_a_panels(const cg_module *m, int ap)
{
	for (int k = 0; m && k < m->nkern; k++)
		if (uses_panels(m->kern[k].body, 0, ap))
			return true;
	return false;
}

bool cg_llvm_uses_helpers(const cg_module *m)
{
	for (int k = 0; m && k < m->nkern; k++)
		if (uses_gemm(m->kern[k].body))
			return true;
	return false;
}

int cg_llvm_parts_for(const cg_module *m, int max)
{
	int64_t total = LIBRARY_COST;
	bool gemm = false;
	for (int k = 0; m && k < m->nkern; k++) {
		total += cost_stmt(m->kern[k].body);
		gemm = gemm || uses_gemm(m->kern[k].body);
	}
	total += gemm ? HELPER_COST : 0;
	int64_t n = total / PART_MIN_COST;
	return n < 1 ? 1 : n > max ? max : (int)n;
}

/* Kernel k, defined by another part as f, as a function of parts[0]: a hidden external name
 * unique in the library, declared in parts[0]. */
static LLVMValueRef share(cg_llvm *L0, LLVMValueRef f, int prog, int k)
{
	char name[64];
	snprintf(name, sizeof name, "kiln_kernel_%d_%d", prog, k);
	LLVMSetValueName2(f, name, strlen(name));
	LLVMSetLinkage(f, LLVMExternalLinkage);
	LLVMSetVisibility(f, LLVMHiddenVisibility);
	LLVMTypeRef wt = LLVMPointerType(L0->exec_ty, 0);
	LLVMValueRef d = add_fn(L0, name, LLVMFunctionType(LLVMVoidTypeInContext(L0->ctx), &wt, 1, 0),
	                        false);
	LLVMSetVisibility(d, LLVMHiddenVisibility);
	return d;
}

/* Every kernel, identical ones once: kernels whose keys (cg_kernel_key)
 * are equal compute the same thing on buffers renamed consistently, so a
 * later one is only a wrapper that builds its own buffer table and calls
 * the first one's impl (kept out of line).  ResNet-18 has 63 kernels and 33
 * distinct ones: LLVM optimizes and emits half the code.  Each group of
 * equal kernels goes, largest first, to the part with the least cost so far. */
static kiln_status emit_all(cg_llvm *const *parts, int nparts, int prog, LLVMValueRef *fns,
                            kiln_error *err)
{
	const cg_module *m = parts[0]->m;
	int n = m->nkern, nb = m->nbuf;
	char **key = calloc((size_t)n + 1, sizeof *key);
	int *canon = calloc((size_t)n * nb + 1, sizeof *canon), *nroot = calloc((size_t)n + 1, sizeof *nroot);
	int *first = calloc((size_t)n + 1, sizeof *first), *part = calloc((size_t)n + 1, sizeof *part);
	int *order = calloc((size_t)n + 1, sizeof *order);
	int64_t *cost = calloc((size_t)n + 1, sizeof *cost), *load = calloc((size_t)nparts, sizeof *load);
	bool *shared = calloc((size_t)n + 1, sizeof *shared);
	LLVMValueRef *impl = calloc((size_t)n + 1, sizeof *impl);
	int *roots = calloc((size_t)nb + 1, sizeof *roots);
	kiln_status st = KILN_OK;
	if (!key || !canon || !nroot || !first || !part || !order || !cost || !load || !shared ||
	    !impl || !roots)
		st = ir_seterr(err, KILN_ENOMEM, "out of memory emitting kernels");
	for (int k = 0; k < n && !st; k++) {
		if (!(key[k] = cg_kernel_key(m, &m->kern[k], canon + (size_t)k * nb, &nroot[k])))
			st = ir_seterr(err, KILN_ENOMEM, "out of memory emitting kernels");
		first[k] = k;
		for (int j = 0; j < k && first[k] == k; j++)
			if (first[j] == j && !strcmp(key[j], key[k]))
				first[k] = j, shared[j] = true;
		if (first[k] == k)
			cost[k] = cost_stmt(m->kern[k].body);
	}
	/* groups by cost, largest first (ties: kernel order), then greedily */
	int ng = 0;
	for (int k = 0; k < n && !st; k++)
		if (first[k] == k) {
			int i = ng++;
			while (i > 0 && cost[order[i - 1]] < cost[k]) {
				order[i] = order[i - 1];
				i--;
			}
			order[i] = k;
		}
	if (nparts > 0 && load)
		load[0] = LIBRARY_COST;
	for (int i = 0; i < ng && !st; i++) {
		int best = 0;
		for (int p = 1; p < nparts; p++)
			if (load[p] < load[best])
				best = p;
		part[order[i]] = best;
		load[best] += cost[order[i]];
	}
	for (int k = 0; k < n && !st; k++) {
		const cg_kernel *kk = &m->kern[k];
		int p = part[first[k]];
		cg_llvm *L = parts[p];
		L->canon = canon + (size_t)k * nb;
		L->small = cost[first[k]] <= SMALL_KERNEL;
		LLVMValueRef f;
		if (first[k] == k) {
			int npar = 0;
			f = emit_fn(L, kk, kk->name, kk->body, false, &npar, err, &st, shared[k], &impl[k]);
		} else {
			for (int b = 0; b < nb; b++)
				if (L->canon[b] >= 0 && L->canon[b] < nroot[k])
					roots[L->canon[b]] = b;
			LLVMTypeRef wt = exec_ptr(L);
			f = add_fn(L, kk->name, LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), &wt, 1, 0),
			           true);
			fill_wrapper(L, f, impl[first[k]], roots, nroot[k], false);
		}
		L->canon = NULL;
		fns[k] = f && p ? share(parts[0], f, prog, k) : f;
	}
	for (int k = 0; key && k < n; k++)
		free(key[k]);
	free(key), free(canon), free(nroot), free(first), free(part), free(order), free(cost);
	free(load), free(shared), free(impl), free(roots);
	return st;
}

kiln_status cg_llvm_emit_kernels(cg_llvm *const *parts, int nparts, const cg_module *m,
                                 int prog, LLVMValueRef *fns, kiln_error *err)
{
	kiln_status st = check_module(m, err);
	for (int p = 0; p < nparts && st == KILN_OK; p++) {
		cg_llvm *L = parts[p];
		L->m = m;
		L->prog = prog;
		LLVMTypeRef kt = exec_ptr(L);
		LLVMTypeRef rt[3] = {exec_ptr(L), L->i64,
		                     LLVMPointerType(LLVMFunctionType(LLVMVoidTypeInContext(L->ctx),
		                                                      (LLVMTypeRef[]){kt, L->i64, L->i64},
		                                                      3, 0), 0)};
		L->par_for = cg_llvm_runtime_fn(L, "rt_parallel_for",
		                                LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), rt, 3, 0));
	}
	return st == KILN_OK ? emit_all(parts, nparts, prog, fns, err) : st;
}

/* L->m's numel and io_dims functions, for its description. */
kiln_status cg_llvm_sizes(cg_llvm *L, LLVMValueRef *numel, LLVMValueRef *io_dims,
                          kiln_error *err)
{
	fn_ctx c = {.L = L, .err = err};
	c.symv = calloc((size_t)L->m->nsym + 1, sizeof *c.symv);
	if (!c.symv)
		return ir_seterr(err, KILN_ENOMEM, "out of memory emitting kernels");
	*numel = numel_fn(L, &c);
	*io_dims = io_dims_fn(L, &c);
	free(c.symv);
	return c.st;
}

/* ---- what this backend takes -------------------------------------------------------- */

/* An 8-bit GEMM's buffers hold what its dtypes say: A, B, C theirs, an
 * i32 bias, an f32 scale, zero points of their operand's dtype. */
static bool int8_gemm_ok(const cg_module *m, const cg_gemm *g, char *why, size_t size)
{
	const cg_gemm_vec *v[] = {&g->scale, &g->a_zero, &g->b_zero, &g->c_zero};
	int bufs[] = {g->a, g->b, g->c, g->bias, v[0]->axis ? v[0]->buf : -1,
	              v[1]->axis ? v[1]->buf : -1, v[2]->axis ? v[2]->buf : -1,
	              v[3]->axis ? v[3]->buf : -1};
	kiln_dtype want[] = {g->a_dt, g->b_dt, g->c_dt, KILN_I32, KILN_F32, g->a_dt, g->b_dt, g->c_dt};
	const char *role[] = {"A", "B", "C", "bias", "scale", "A's zero point", "B's zero point",
	                      "C's zero point"};
	for (int i = 0; i < 8; i++) {
		if (bufs[i] < 0 && i >= 3)
			continue;
		if (bufs[i] < 0 || bufs[i] >= m->nbuf) {
			snprintf(why, size, "8-bit GEMM %s names no buffer", role[i]);
			return false;
		}
		if (m->buf[bufs[i]].dt != want[i]) {
			snprintf(why, size, "8-bit GEMM with %s %s (expected %s)", role[i],
			         kiln_dtype_name(m->buf[bufs[i]].dt), kiln_dtype_name(want[i]));
			return false;
		}
	}
	if (g->bias >= 0 && g->bias_axis != 1 && g->bias_axis != 2) {
		snprintf(why, size, "8-bit GEMM bias axis %d", g->bias_axis);
		return false;
	}
	if (g->has_b_rows && (g->b_rows < 0 || g->b_rows >= m->nbuf ||
	                      m->buf[g->b_rows].dt != KILN_I64)) {
		snprintf(why, size, "8-bit GEMM whose B row offsets are not an i64 buffer");
		return false;
	}
	return true;
}

static bool gemm_ok(const cg_module *m, const cg_gemm *g, char *why, size_t size)
{
	bool res = g->c_block && g->has_residual;
	if ((g->c_block || g->b_block) && (cg_gemm_is_int8(g) || res || g->a_panel <= 0)) {
		snprintf(why, size, "GEMM with %s in blocks of %d rows and%s (only f32 ones with A "
		         "in kiln_sgemm_pm's panels, a blocked C with no residual)",
		         g->c_block ? "C" : "B", g->c_block ? g->c_block : g->b_block,
		         cg_gemm_is_int8(g) ? " 8-bit operands" : res ? " a residual" : " A not in panels");
		return false;
	}
	if (cg_gemm_is_int8(g))
		return int8_gemm_ok(m, g, why, size);
	int bufs[] = {g->a, g->b, g->c, g->bias, g->has_residual ? g->residual : -1};
	const char *role[] = {"A", "B", "C", "bias", "residual"};
	for (int i = 0; i < 5; i++) {
		if (bufs[i] < 0 && i >= 3)
			continue;
		if (bufs[i] < 0 || bufs[i] >= m->nbuf) {
			snprintf(why, size, "GEMM %s names no buffer", role[i]);
			return false;
		}
		if (m->buf[bufs[i]].dt != KILN_F32) {
			snprintf(why, size, "GEMM with %s %s (it has f32 GEMMs only)", role[i],
			         kiln_dtype_name(m->buf[bufs[i]].dt));
			return false;
		}
	}
	if (!cg_gemm_is_f32(g)) {
		snprintf(why, size, "GEMM %s*%s->%s accumulating in %s%s%s%s%s (it has f32 GEMMs "
		         "with bias, relu and clip, and 8-bit ones (cg_gemm_is_int8))", kiln_dtype_name(g->a_dt), kiln_dtype_name(g->b_dt),
		         kiln_dtype_name(g->c_dt), kiln_dtype_name(g->acc_dt),
		         g->scale.axis ? ", scale" : "",
		         g->a_zero.axis || g->b_zero.axis || g->c_zero.axis ? ", zero points" : "",
		         g->has_residual ? ", residual" : "",
		         g->act >= CG_ACT_COUNT ? ", an unknown activation" : "");
		return false;
	}
	if (g->b_panel < 0 || (g->b_panel > 0 && (g->b_panel & (g->b_panel - 1))) || g->a_panel < 0) {
		snprintf(why, size, "GEMM A or B in panels of %d rows or %d columns", g->a_panel,
		         g->b_panel);
		return false;
	}
	return true;
}

static bool stmt_ok(const cg_module *m, const cg_stmt *s, char *why, size_t size)
{
	if (!s)
		return true;
	switch (s->kind) {
	case CG_BLOCK:
		for (int i = 0; i < s->n; i++)
			if (!stmt_ok(m, s->items[i], why, size))
				return false;
		return true;
	case CG_FOR: return stmt_ok(m, s->body, why, size);
	case CG_IF: return stmt_ok(m, s->then_s, why, size) && stmt_ok(m, s->else_s, why, size);
	case CG_GEMM: return gemm_ok(m, s->gemm, why, size);
	default: return true;
	}
}

bool cg_llvm_supports(const cg_module *m, const cg_kernel *k, char *why, size_t size)
{
	return stmt_ok(m, k->body, why, size);
}
