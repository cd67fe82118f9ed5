/*
 * llvm_gemm.c: kiln_sgemm, the f32 matrix product behind every CG_GEMM,
 * emitted as LLVM vector IR for the target's vector width.
 *
 * The key idea is the BLIS design, specialised at compile time.  Columns
 * are cut into NC blocks, depth into KC blocks (the KC x NC panel of B is
 * packed into NR-wide column panels, zero-padded), rows into MC blocks (the
 * MC x KC block of A is packed into MR-tall row panels, times alpha,
 * zero-padded), and a register-blocked micro-kernel computes each MR x NR
 * tile of C over KC as MR x NV accumulators of <W x float>: per k, NV
 * vector loads of B, MR broadcasts of A, MR*NV llvm.fma.  Packing makes the
 * micro-kernel independent of the caller's strides (transposes are just
 * strides) and of the edges: padded lanes compute zeros and the tile's
 * store is masked (llvm.masked.load/store), so there is no scalar edge
 * code.  The epilogue (beta, bias per column or per row, a residual
 * matrix, a clamp to [lo, hi] that is relu, clip or nothing) runs once
 * per element: beta at the first K block (and C is never read when
 * beta == 0), bias, residual and the clamp at the last.
 *
 * Packing costs O(MK + KN) per call, which a batch-1 MLP (M = 1) cannot
 * pay back, so small or thin problems take direct paths instead: B rows
 * contiguous (b_cs == 1) gives an axpy form over strips of C's row (16,
 * then 4, then 1 vector; B prefetched a few rows ahead), A rows
 * and B columns contiguous gives a dot form, anything else a scalar loop.
 * Between those and the packed path sit the direct tiles: with B rows
 * contiguous and A of few rows or C only a panel or two wide, the same
 * register-blocked micro-kernel reads A and B in place (masked loads at the
 * right edge), which beats packing for an MLP at batch 16, small convs and
 * 7x7 feature maps.  (That B rows are contiguous for every Linear is
 * bnfold's doing: it stores a constant transB weight as [K, N].)  The
 * direct tiles come in sets of one tile shape each: the target's MR x NV,
 * a small-M shape (8 x 3 vectors with AVX-512, for batch 16) and a
 * one-vector shape for C at most a vector wide (a classifier's outputs).
 * With a thread pool, large problems split their columns over the threads
 * with rt_parallel_for, each thread packing into its own x->scratch; the
 * direct forms (batch 1) split theirs in whole vectors from 2^16
 * multiply-adds on.
 *
 * Everything is internal to the module; only kiln_sgemm is meant to be
 * called (by the kernels of llvm.c), with the ABI documented in llvm.h.
 */
#include <math.h>
#include <string.h>

#include <llvm-c/DebugInfo.h>

#include "codegen/llvm.h"

/* Blocking for a target, measured on the AVX-512 Zen 4 this was written
 * on (bench/gemm_bench.c).  MR x NV vectors of accumulators plus NV vectors
 * of B and a broadcast fit the register file: 6 x 4 zmm (24 of 32) beat
 * 14 x 2 by 10%, as it needs a broadcast per 4 FMAs instead of per 2; 6 x 2
 * ymm and 4 x 2 xmm fill 16 registers.  KC = 512 halves the passes over C
 * against 256 (+5%); the MC x KC block of A (288 KiB) sits in L2, the
 * KC x NC panel of B in L3. */
typedef struct geom {
	int W, MR, NV, NR; /* lanes, tile rows, vectors per tile row, tile cols */
	int64_t KC, MC, NC;
	int64_t GB; /* floats of packed B per group of column panels (macro_kernel) */
} geom;

static geom geometry(const cg_target *t)
{
	int bits = t && t->vec_bits >= 128 ? t->vec_bits : 128;
	geom g = {.W = bits / 32, .KC = 512, .NC = 1024};
	g.MR = g.W >= 16 ? 6 : g.W == 8 ? 6 : 4;
	g.NV = g.W >= 16 ? 4 : 2;
	g.NR = g.NV * g.W;
	g.MC = g.MR * 24;
	g.NC = (g.NC + g.NR - 1) / g.NR * g.NR; /* whole panels: packb fills them */
	/* half the core's L2 (1 MiB where the target's is unknown) */
	int64_t l2 = t && t->l2_bytes > 0 ? t->l2_bytes : 1 << 20;
	g.GB = l2 / 2 / (int64_t)sizeof(float);
	return g;
}

uint64_t cg_sgemm_scratch_floats(const cg_target *t)
{
	geom g = geometry(t);
	/* packed A block, then packed B panel (kept 64-byte aligned); at least
	 * what kiln_qgemm's panel needs (llvm_qgemm.c) */
	uint64_t f = (uint64_t)((g.MC * g.KC + 15) / 16 * 16 + g.KC * g.NC);
	uint64_t q = (cg_qgemm_scratch_bytes(t) + 3) / 4;
	return f > q ? f : q;
}

/* Parameters shared by kiln_sgemm and its internal paths, in ABI order. */
enum {
	P_X, P_M, P_N, P_K, P_ALPHA, P_A, P_ARS, P_ACS, P_B, P_BRS, P_BCS,
	P_BETA, P_C, P_CRS, P_BIAS, P_AXIS, P_LO, P_HI, P_RES, P_RRS, P_COUNT
};

typedef struct gen {
	cg_llvm *L;
	LLVMBuilderRef b;
	geom g;
	LLVMTypeRef fp, vf, vfp, vi32, vi1, xty, xp, argty;
	LLVMValueRef fma, mload, mstore; /* <W x float> intrinsics */
	LLVMValueRef prefetch;           /* llvm.prefetch */
	LLVMValueRef zero;               /* internal constant <W x float> 0 */
	LLVMValueRef fn;                 /* function being built */
	LLVMValueRef p[P_COUNT + 2];     /* its parameters */
	int nv;                          /* vectors per tile row of the micro-kernel being built */
	const char *sfx;                 /* name suffix of the tile set being built ("" default) */
	int pf;                          /* its direct micro-kernel prefetches B pf rows ahead */
	int pfa;                         /* ... and A pfa columns ahead */
	bool pb;                         /* the family of kiln_sgemm_pb: B in column panels */
	bool pbw;                        /* ... of kiln_sgemm_pbw: panels NR wide, which the
	                                    blocked path reads in place */
	bool pa;                         /* the family of kiln_sgemm_pa: A in MR-row panels */
	int P;                           /* ... P wide (CG_SGEMM_PANEL, or NR) */
	const char *fam;                 /* its functions' name prefix */
	int row_tiles;                   /* tiles of MR rows per unit of a row split (0:
	                                    ROW_BLOCK_TILES) */
	bool slow_masks;                 /* masked loads and stores cost more than plain ones
	                                    (no AVX-512): see full_first */
	LLVMValueRef allon;              /* the constant <W x i1> of all lanes on */
} gen;

/* ---- small IR helpers ---------------------------------------------------- */

static LLVMValueRef i64c(gen *g, int64_t v)
{
	return LLVMConstInt(g->L->i64, (unsigned long long)v, 1);
}

static LLVMValueRef f32c(gen *g, double v)
{
	return LLVMConstReal(g->L->f32, v);
}

static LLVMValueRef add(gen *g, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildAdd(g->b, a, b, "");
}

static LLVMValueRef mul(gen *g, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildMul(g->b, a, b, "");
}

static LLVMValueRef smin(gen *g, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, a, b, ""), a, b, "");
}

static LLVMValueRef icmp(gen *g, LLVMIntPredicate p, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildICmp(g->b, p, a, b, "");
}

/* &p[i] for a float pointer (plain GEP: bias may be null when unused) */
static LLVMValueRef at(gen *g, LLVMValueRef p, LLVMValueRef i)
{
	return LLVMBuildGEP2(g->b, g->L->f32, p, &i, 1, "");
}

/* &p[i], or null when p is (the residual: null when there is none) */
static LLVMValueRef nat(gen *g, LLVMValueRef p, LLVMValueRef i)
{
	return LLVMBuildSelect(g->b, LLVMBuildIsNotNull(g->b, p, ""), at(g, p, i), p, "");
}

static LLVMValueRef call(gen *g, LLVMValueRef fn, LLVMValueRef *args, unsigned n)
{
	return LLVMBuildCall2(g->b, LLVMGlobalGetValueType(fn), fn, args, n, "");
}

static LLVMValueRef splat(gen *g, LLVMTypeRef vty, LLVMValueRef s)
{
	LLVMValueRef v = LLVMBuildInsertElement(g->b, LLVMGetUndef(vty), s,
	                                        LLVMConstInt(g->L->i32, 0, 0), "");
	LLVMValueRef zeros = LLVMConstNull(g->vi32);
	return LLVMBuildShuffleVector(g->b, v, LLVMGetUndef(vty), zeros, "");
}

static LLVMValueRef fma3(gen *g, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c)
{
	LLVMValueRef args[] = {a, b, c};
	return call(g, g->fma, args, 3);
}

static LLVMValueRef vload(gen *g, LLVMValueRef fptr)
{
	LLVMValueRef v = LLVMBuildLoad2(g->b, g->vf, LLVMBuildBitCast(g->b, fptr, g->vfp, ""), "");
	LLVMSetAlignment(v, 4);
	return v;
}

static void vstore(gen *g, LLVMValueRef v, LLVMValueRef fptr)
{
	LLVMValueRef s = LLVMBuildStore(g->b, v, LLVMBuildBitCast(g->b, fptr, g->vfp, ""));
	LLVMSetAlignment(s, 4);
}

/* lanes of fptr[0..W) under mask, 0 elsewhere; masked-off lanes are not
 * read.  g->allon: a plain load (see full_first). */
static LLVMValueRef mload(gen *g, LLVMValueRef fptr, LLVMValueRef mask)
{
	if (mask == g->allon)
		return vload(g, fptr);
	LLVMValueRef args[] = {LLVMBuildBitCast(g->b, fptr, g->vfp, ""),
	                       LLVMConstInt(g->L->i32, 4, 0), mask, LLVMConstNull(g->vf)};
	return call(g, g->mload, args, 4);
}

static void mstore(gen *g, LLVMValueRef v, LLVMValueRef fptr, LLVMValueRef mask)
{
	if (mask == g->allon) {
		vstore(g, v, fptr);
		return;
	}
	LLVMValueRef args[] = {v, LLVMBuildBitCast(g->b, fptr, g->vfp, ""),
	                       LLVMConstInt(g->L->i32, 4, 0), mask};
	call(g, g->mstore, args, 4);
}

/* llvm.prefetch(p) for reading, into all cache levels */
static void prefetch(gen *g, LLVMValueRef fptr)
{
	LLVMValueRef args[] = {LLVMBuildBitCast(g->b, fptr, g->L->ptr, ""), LLVMConstInt(g->L->i32, 0, 0),
	                       LLVMConstInt(g->L->i32, 3, 0), LLVMConstInt(g->L->i32, 1, 0)};
	call(g, g->prefetch, args, 4);
}

/* <W x i1>: lane l is on when l < rem (rem any i64) */
static LLVMValueRef lanes(gen *g, LLVMValueRef rem)
{
	LLVMValueRef w = i64c(g, g->g.W);
	rem = LLVMBuildTrunc(g->b, smin(g, rem, w), g->L->i32, "");
	LLVMValueRef iota[64];
	for (int l = 0; l < g->g.W; l++)
		iota[l] = LLVMConstInt(g->L->i32, l, 0);
	return icmp(g, LLVMIntSLT, LLVMConstVector(iota, g->g.W), splat(g, g->vi32, rem));
}

/* Masked loads and stores cost what plain ones do with AVX-512's mask
 * registers.  Without them (vmaskmovps) they do not: on an AMD EPYC with
 * AVX2 (Zen), a 4 x 2-vector multiply-add loop whose B vectors were masked
 * loads ran 6.4 GFLOP/s against 19.8 with plain ones, and a masked store
 * cost 6x a plain one (4.0 against 0.67 ns); SSE has no masked forms at
 * all.  There, code whose masks are all on in the common case (a whole
 * tile, a whole panel) is emitted twice:
 *     for (int full = full_first(g, cond, &f); full >= 0; full = full_then(g, &f, full))
 *         BODY(full)
 * runs BODY with full = 1 where cond holds (its masks g->allon, which
 * mload and mstore make plain), else with full = 0; with AVX-512 BODY is
 * emitted once, full = 0. */
static LLVMBasicBlockRef block(gen *g, const char *name);

typedef struct fullsplit {
	LLVMBasicBlockRef part, done;
} fullsplit;

static int full_first(gen *g, LLVMValueRef cond, fullsplit *f)
{
	f->done = NULL;
	if (!g->slow_masks)
		return 0;
	LLVMBasicBlockRef on = block(g, "full");
	f->part = block(g, "part");
	f->done = block(g, "fulljoin");
	LLVMBuildCondBr(g->b, cond, on, f->part);
	LLVMPositionBuilderAtEnd(g->b, on);
	return 1;
}

static int full_then(gen *g, fullsplit *f, int full)
{
	if (!f->done)
		return -1;
	LLVMBuildBr(g->b, f->done);
	LLVMPositionBuilderAtEnd(g->b, full ? f->part : f->done);
	return full ? 0 : -1;
}

/* p if cond else the constant zero: a load that reads nothing when off */
static LLVMValueRef load_if(gen *g, LLVMValueRef cond, LLVMValueRef p)
{
	LLVMValueRef z = LLVMBuildBitCast(g->b, g->zero, g->fp, "");
	return LLVMBuildLoad2(g->b, g->L->f32, LLVMBuildSelect(g->b, cond, p, z, ""), "");
}

static LLVMValueRef hsum(gen *g, LLVMValueRef v)
{
	for (int w = g->g.W / 2; w >= 1; w /= 2) {
		LLVMValueRef lo[32], hi[32];
		for (int l = 0; l < w; l++) {
			lo[l] = LLVMConstInt(g->L->i32, l, 0);
			hi[l] = LLVMConstInt(g->L->i32, l + w, 0);
		}
		LLVMValueRef u = LLVMGetUndef(LLVMTypeOf(v));
		v = LLVMBuildFAdd(g->b, LLVMBuildShuffleVector(g->b, v, u, LLVMConstVector(lo, w), ""),
		                  LLVMBuildShuffleVector(g->b, v, u, LLVMConstVector(hi, w), ""), "");
	}
	return LLVMBuildExtractElement(g->b, v, LLVMConstInt(g->L->i32, 0, 0), "");
}

/* Rows per panel of kiln_sgemm_pb's B: CG_PANEL_ROWS(K) */
static LLVMValueRef panel_rows(gen *g, LLVMValueRef K)
{
	return LLVMBuildOr(g->b, K, i64c(g, 1), "");
}

/* kiln_sgemm_pb: the offset of column n's row 0 in B's panels of P
 * columns, each CG_PANEL_ROWS(K) rows of P floats (n a multiple of W, which
 * divides P or is a multiple of it). */
static LLVMValueRef bcol(gen *g, LLVMValueRef n)
{
	LLVMValueRef q = LLVMBuildAShr(g->b, n, i64c(g, __builtin_ctz((unsigned)g->P)), "");
	return add(g, mul(g, mul(g, q, i64c(g, g->P)), panel_rows(g, g->p[P_K])),
	           LLVMBuildAnd(g->b, n, i64c(g, g->P - 1), ""));
}

/* Columns per unit of the direct forms' column split: a vector, or in
 * kiln_sgemm_pb a whole panel (so each range starts on one). */
static int vec_unit(const gen *g)
{
	return g->pb ? g->P : g->g.W;
}

/* ---- structured control flow (llvm.h; llvm_qgemm.c uses it too) ----------- */

LLVMValueRef cg_llvm_local(cg_llvm *L, LLVMBuilderRef b, LLVMValueRef fn, LLVMTypeRef ty,
                           LLVMValueRef init)
{
	(void)L;
	LLVMBasicBlockRef cur = LLVMGetInsertBlock(b);
	LLVMBasicBlockRef entry = LLVMGetEntryBasicBlock(fn);
	LLVMValueRef first = LLVMGetFirstInstruction(entry);
	if (first)
		LLVMPositionBuilderBefore(b, first);
	else
		LLVMPositionBuilderAtEnd(b, entry);
	LLVMValueRef a = LLVMBuildAlloca(b, ty, "");
	LLVMPositionBuilderAtEnd(b, cur);
	if (init)
		LLVMBuildStore(b, init, a);
	return a;
}

LLVMValueRef cg_llvm_loop_begin(cg_llvm *L, LLVMBuilderRef b, LLVMValueRef fn, cg_llvm_loop *l,
                                LLVMValueRef lo, LLVMValueRef hi, int64_t step)
{
	LLVMBasicBlockRef pre = LLVMGetInsertBlock(b), body;
	l->head = LLVMAppendBasicBlockInContext(L->ctx, fn, "head");
	body = LLVMAppendBasicBlockInContext(L->ctx, fn, "body");
	l->exit = LLVMAppendBasicBlockInContext(L->ctx, fn, "exit");
	l->step = LLVMConstInt(L->i64, (unsigned long long)step, 1);
	LLVMBuildBr(b, l->head);
	LLVMPositionBuilderAtEnd(b, l->head);
	l->i = LLVMBuildPhi(b, L->i64, "i");
	LLVMAddIncoming(l->i, &lo, &pre, 1);
	LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, l->i, hi, ""), body, l->exit);
	LLVMPositionBuilderAtEnd(b, body);
	return l->i;
}

void cg_llvm_loop_end(LLVMBuilderRef b, cg_llvm_loop *l)
{
	LLVMValueRef next = LLVMBuildAdd(b, l->i, l->step, "");
	LLVMBasicBlockRef latch = LLVMGetInsertBlock(b);
	LLVMBuildBr(b, l->head);
	LLVMAddIncoming(l->i, &next, &latch, 1);
	LLVMPositionBuilderAtEnd(b, l->exit);
}

LLVMBasicBlockRef cg_llvm_if_begin(cg_llvm *L, LLVMBuilderRef b, LLVMValueRef fn,
                                   LLVMValueRef cond)
{
	LLVMBasicBlockRef then = LLVMAppendBasicBlockInContext(L->ctx, fn, "then");
	LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(L->ctx, fn, "join");
	LLVMBuildCondBr(b, cond, then, join);
	LLVMPositionBuilderAtEnd(b, then);
	return join;
}

void cg_llvm_if_end(LLVMBuilderRef b, LLVMBasicBlockRef join)
{
	LLVMBuildBr(b, join);
	LLVMPositionBuilderAtEnd(b, join);
}

LLVMValueRef cg_llvm_helper_fn(cg_llvm *L, LLVMBuilderRef b, const char *name,
                               LLVMTypeRef *params, unsigned n, int vec_bits)
{
	LLVMTypeRef ty = LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), params, n, 0);
	LLVMValueRef fn = LLVMAddFunction(L->mod, name, ty);
	LLVMSetLinkage(fn, LLVMInternalLinkage);
	char bits[16];
	snprintf(bits, sizeof bits, "%d", vec_bits);
	LLVMAddTargetDependentFunctionAttr(fn, "min-legal-vector-width", bits);
	LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(L->ctx, fn, "entry"));
	return fn;
}

/* this file's short forms of them */
typedef cg_llvm_loop loop;

static LLVMValueRef local(gen *g, LLVMTypeRef ty, LLVMValueRef init)
{
	return cg_llvm_local(g->L, g->b, g->fn, ty, init);
}

static LLVMBasicBlockRef block(gen *g, const char *name)
{
	return LLVMAppendBasicBlockInContext(g->L->ctx, g->fn, name);
}

static LLVMValueRef loop_begin(gen *g, loop *l, LLVMValueRef lo, LLVMValueRef hi,
                               int64_t step)
{
	return cg_llvm_loop_begin(g->L, g->b, g->fn, l, lo, hi, step);
}

static void loop_end(gen *g, loop *l)
{
	cg_llvm_loop_end(g->b, l);
}

/* loop_end, asking LLVM to unroll the loop n times (1: not at all) */
static void loop_end_unroll(gen *g, loop *l, int n)
{
	LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
	cg_llvm_loop_end(g->b, l);
	LLVMValueRef br = LLVMGetBasicBlockTerminator(latch); /* back to the head */
	const char *key = "llvm.loop.unroll.count";
	LLVMMetadataRef cnt[2] = {LLVMMDStringInContext2(g->L->ctx, key, strlen(key)),
	                          LLVMValueAsMetadata(LLVMConstInt(g->L->i32, (unsigned)n, 0))};
	LLVMMetadataRef prop = LLVMMDNodeInContext2(g->L->ctx, cnt, 2);
	cg_llvm_loop_md(g->L, br, &prop, 1);
}

static LLVMBasicBlockRef if_begin(gen *g, LLVMValueRef cond)
{
	return cg_llvm_if_begin(g->L, g->b, g->fn, cond);
}

static void if_end(gen *g, LLVMBasicBlockRef join)
{
	cg_llvm_if_end(g->b, join);
}

/* A new internal function; g->fn and g->p[] are set, builder at entry. */
static LLVMValueRef function(gen *g, const char *name, LLVMTypeRef *params, unsigned n)
{
	LLVMValueRef fn = cg_llvm_helper_fn(g->L, g->b, name, params, n, g->g.W * 32);
	g->fn = fn;
	for (unsigned i = 0; i < n && i < P_COUNT + 2; i++)
		g->p[i] = LLVMGetParam(fn, i);
	return fn;
}

/* kiln_sgemm's parameter types, then extra i64s (for [n0, n1) ranges) */
static unsigned gemm_params(gen *g, LLVMTypeRef *t, int extra)
{
	cg_llvm *L = g->L;
	LLVMTypeRef tys[P_COUNT] = {
		[P_X] = g->xp, [P_M] = L->i64, [P_N] = L->i64, [P_K] = L->i64,
		[P_ALPHA] = L->f32, [P_A] = g->fp, [P_ARS] = L->i64, [P_ACS] = L->i64,
		[P_B] = g->fp, [P_BRS] = L->i64, [P_BCS] = L->i64, [P_BETA] = L->f32,
		[P_C] = g->fp, [P_CRS] = L->i64, [P_BIAS] = g->fp, [P_AXIS] = L->i32,
		[P_LO] = L->f32, [P_HI] = L->f32, [P_RES] = g->fp, [P_RRS] = L->i64,
	};
	memcpy(t, tys, sizeof tys);
	for (int i = 0; i < extra; i++)
		t[P_COUNT + i] = L->i64;
	return P_COUNT + extra;
}

/* ---- epilogues ----------------------------------------------------------- */

/* p if cond, else the constant zeros.  Masked loads never take a mask of
 * "nothing" instead: masked-off lanes on an unmapped page (bias is NULL
 * when unused) cost a fault-suppression microcode assist, hundreds of
 * cycles, on every x86 core. */
static LLVMValueRef or_zeros(gen *g, LLVMValueRef cond, LLVMValueRef p)
{
	LLVMValueRef z = LLVMBuildBitCast(g->b, g->zero, g->fp, "");
	return LLVMBuildSelect(g->b, cond, p, z, "");
}

/* The activation as a clamp to [lo, hi]: none is [-inf, inf], relu
 * [0, inf], clip its bounds.  Compare-and-select, not minnum/maxnum, so a
 * NaN passes through as the interpreter's relu and clip keep it. */
static LLVMValueRef clamp(gen *g, LLVMValueRef v, LLVMValueRef lo, LLVMValueRef hi)
{
	LLVMTypeRef t = LLVMTypeOf(v);
	bool vec = LLVMGetTypeKind(t) == LLVMVectorTypeKind;
	if (vec)
		lo = splat(g, t, lo), hi = splat(g, t, hi);
	v = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOLT, v, lo, ""), lo, v, "");
	return LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOGT, v, hi, ""), hi, v, "");
}

/* C[cp + lanes under mask] = clamp(v + beta*C + colbias + rowb + R, lo, hi).
 * beta NULL: the plain form, v + rowb only.  Else
 * C is read only when beta != 0, colb only when colb_on, the residual at
 * rp only when rp is not null (and not at all when rp is NULL here: the
 * micro-kernel's epilogues, see ukr_epilogue). */
static void vec_epilogue(gen *g, LLVMValueRef v, LLVMValueRef cp, LLVMValueRef mask,
                         LLVMValueRef beta, LLVMValueRef colb, LLVMValueRef colb_on,
                         LLVMValueRef rowb, LLVMValueRef rp, LLVMValueRef lo,
                         LLVMValueRef hi)
{
	if (beta) { /* NULL: the plain epilogue (see ukr_epilogue) */
		LLVMValueRef bnz = LLVMBuildFCmp(g->b, LLVMRealUNE, beta, f32c(g, 0), "");
		v = fma3(g, splat(g, g->vf, beta), mload(g, or_zeros(g, bnz, cp), mask), v);
		v = LLVMBuildFAdd(g->b, v, mload(g, or_zeros(g, colb_on, colb), mask), "");
	}
	v = LLVMBuildFAdd(g->b, v, splat(g, g->vf, rowb), "");
	if (rp)
		v = LLVMBuildFAdd(g->b, v, mload(g, or_zeros(g, LLVMBuildIsNotNull(g->b, rp, ""), rp),
		                                 mask), "");
	mstore(g, clamp(g, v, lo, hi), cp, mask);
}

/* The scalar form for C[m, n] (v has alpha applied), with g->p[] args. */
static void scalar_epilogue(gen *g, LLVMValueRef v, LLVMValueRef m, LLVMValueRef n)
{
	LLVMValueRef *p = g->p, z32 = LLVMConstInt(g->L->i32, 0, 0);
	LLVMValueRef cp = at(g, p[P_C], add(g, mul(g, m, p[P_CRS]), n));
	LLVMValueRef bnz = LLVMBuildFCmp(g->b, LLVMRealUNE, p[P_BETA], f32c(g, 0), "");
	LLVMValueRef c = load_if(g, bnz, cp);
	v = LLVMBuildFAdd(g->b, v, LLVMBuildFMul(g->b, p[P_BETA], c, ""), "");
	LLVMValueRef row = icmp(g, LLVMIntEQ, p[P_AXIS], LLVMConstInt(g->L->i32, 2, 0));
	LLVMValueRef bp = at(g, p[P_BIAS], LLVMBuildSelect(g->b, row, m, n, ""));
	v = LLVMBuildFAdd(g->b, v, load_if(g, icmp(g, LLVMIntNE, p[P_AXIS], z32), bp), "");
	LLVMValueRef rp = at(g, p[P_RES], add(g, mul(g, m, p[P_RRS]), n));
	v = LLVMBuildFAdd(g->b, v, load_if(g, LLVMBuildIsNotNull(g->b, p[P_RES], ""), rp), "");
	LLVMBuildStore(g->b, clamp(g, v, p[P_LO], p[P_HI]), cp);
}

/* ---- the packed path ----------------------------------------------------- */

enum { U_AP, U_BP, U_KC, U_C, U_CRS, U_MR, U_NR, U_BETA, U_BIAS, U_BMODE, U_LO, U_HI, U_RES, U_RRS, U_COUNT,
       /* the direct micro-kernel's extra parameters */
       U_ARS = U_COUNT, U_ACS, U_BRS, U_ALPHA,
       U_BPS, /* kiln_sgemm_pb: floats from one panel of B to the next (CG_PANEL_ROWS(K) * P) */
       U_DCOUNT };

/* kiln_sgemm_ukr(Ap, Bp, kc, C, c_rs, mr, nr, beta, bias, bmode, lo, hi):
 * the MR x NR tile at C from packed panels; only its mr x nr corner is
 * stored.  bmode 1: bias[j] per column, 2: bias[i] per row (bias points at
 * the tile's first), 0: none. */
static void ukr_rows1(gen *g, LLVMValueRef *acc, bool res, bool plain, int full)
{
	LLVMValueRef *p = g->p;
	LLVMValueRef colb_on = icmp(g, LLVMIntEQ, p[U_BMODE], LLVMConstInt(g->L->i32, 1, 0));
	LLVMValueRef rowb_on = icmp(g, LLVMIntEQ, p[U_BMODE], LLVMConstInt(g->L->i32, 2, 0));
	LLVMValueRef mask[8];
	for (int j = 0; j < g->nv; j++)
		mask[j] = full ? g->allon : lanes(g, LLVMBuildSub(g->b, p[U_NR], i64c(g, j * g->g.W), ""));
	for (int i = 0; i < g->g.MR; i++) {
		LLVMBasicBlockRef join = if_begin(g, icmp(g, LLVMIntSLT, i64c(g, i), p[U_MR]));
		LLVMValueRef rowb = load_if(g, rowb_on, at(g, p[U_BIAS], i64c(g, i)));
		LLVMValueRef crow = at(g, p[U_C], mul(g, i64c(g, i), p[U_CRS]));
		LLVMValueRef rrow = res ? nat(g, p[U_RES], mul(g, i64c(g, i), p[U_RRS])) : NULL;
		for (int j = 0; j < g->nv; j++) {
			LLVMValueRef off = i64c(g, j * g->g.W);
			LLVMValueRef v = LLVMBuildLoad2(g->b, g->vf, acc[i * g->nv + j], "");
			vec_epilogue(g, v, at(g, crow, off), mask[j], plain ? NULL : p[U_BETA],
			             at(g, p[U_BIAS], off), colb_on, rowb, res ? nat(g, rrow, off) : NULL,
			             p[U_LO], p[U_HI]);
		}
		if_end(g, join);
	}
}

/* ukr_rows1, and where masks are slow a copy of it for a tile of all nv
 * vectors' columns */
static void ukr_rows(gen *g, LLVMValueRef *acc, bool res, bool plain)
{
	fullsplit f;
	LLVMValueRef whole = icmp(g, LLVMIntSGE, g->p[U_NR], i64c(g, g->nv * g->g.W));
	for (int full = full_first(g, whole, &f); full >= 0; full = full_then(g, &f, full))
		ukr_rows1(g, acc, res, plain, full);
}

/* Three copies of the tile's stores: with the residual; without it;
 * and the plain one, beta == 0 and no bias per column (a conv's GEMM:
 * its bias is per row), which reads neither C nor a column bias.  A
 * masked load of zeros per vector would cost every GEMM without them: at
 * small K the stores are a large part of a tile's work.  Plain apart (1x1
 * conv + Relu6 alone, kiln bench min over 5 x 300 runs, one thread, Zen
 * 4, ms): 16->96 channels at 112x112 0.566 -> 0.506, 32->192 at 28x28
 * 0.108 -> 0.101, 64->384 at 14x14 0.100 -> 0.096; MobileNetV2 batch 1
 * 7.51 -> 7.20. */
static void ukr_epilogue(gen *g, LLVMValueRef *acc)
{
	LLVMBasicBlockRef with = block(g, "res"), without = block(g, "nores"), done = block(g, "done");
	LLVMBasicBlockRef plain = block(g, "plain"), full = block(g, "full");
	LLVMBuildCondBr(g->b, LLVMBuildIsNotNull(g->b, g->p[U_RES], ""), with, without);
	LLVMPositionBuilderAtEnd(g->b, with);
	ukr_rows(g, acc, true, false);
	LLVMBuildBr(g->b, done);
	LLVMPositionBuilderAtEnd(g->b, without);
	LLVMValueRef b0 = LLVMBuildFCmp(g->b, LLVMRealOEQ, g->p[U_BETA], f32c(g, 0), "");
	LLVMValueRef nocol = icmp(g, LLVMIntNE, g->p[U_BMODE], LLVMConstInt(g->L->i32, 1, 0));
	LLVMBuildCondBr(g->b, LLVMBuildAnd(g->b, b0, nocol, ""), plain, full);
	LLVMPositionBuilderAtEnd(g->b, plain);
	ukr_rows(g, acc, false, true);
	LLVMBuildBr(g->b, done);
	LLVMPositionBuilderAtEnd(g->b, full);
	ukr_rows(g, acc, false, false);
	LLVMBuildBr(g->b, done);
	LLVMPositionBuilderAtEnd(g->b, done);
}

/* The direct micro-kernel's operand addressing, set up before the k loop:
 * row i of A (rows past mr repeat row mr-1, computed but never stored) and
 * the masks of the nr valid columns of B. */
static void direct_setup(gen *g, LLVMValueRef *arow, LLVMValueRef *bmask)
{
	LLVMValueRef *p = g->p, last = LLVMBuildSub(g->b, p[U_MR], i64c(g, 1), "");
	for (int i = 0; i < g->g.MR; i++)
		arow[i] = at(g, p[U_AP], mul(g, smin(g, i64c(g, i), last), p[U_ARS]));
	for (int j = 0; j < g->nv; j++)
		bmask[j] = lanes(g, LLVMBuildSub(g->b, p[U_NR], i64c(g, j * g->g.W), ""));
}

/* kiln_sgemm_ukr (packed) or kiln_sgemm_ukr_direct.  Packed: A and B are
 * the panels packa/packb wrote (alpha already in A).  Direct: A is any
 * strided matrix (a_rs, a_cs) and B row-contiguous with row stride b_rs,
 * read in place with masked loads past column nr, and alpha is applied
 * before the epilogue; no packing at all, for products too small in M to
 * pay for it.  nv < NV makes a narrow variant ("...1" for one vector) that
 * the packed path calls for a last panel of at most nv*W columns: a
 * 196-column C is three full panels and 4 columns, which the full tile
 * would compute 64 lanes wide (a 3x3 256-channel conv at 14x14 goes from
 * 82 to 100 GFLOP/s).  The direct tiles keep one call site, which LLVM
 * inlines: with a narrow variant beside it they measured 15% slower. */
/* Columns a direct tile's last vector may hold for it to run them along
 * the rows instead (emit_ukr's tail form). */
enum { TAIL_COLS = 2 }; /* at most 2: the shuffle in ukr_loop */
/* The k loop of a micro-kernel is unrolled twice, no more, and not at
 * all in the tiles with more live values.  Left to itself LLVM unrolled
 * it 8 times and scheduled the copies' loads early: the tile with tail
 * columns (a 7x7 map) spilled 46 broadcasts per pass to the stack.
 * Kernel min over 5 rounds of 100 runs, one thread, Zen 4, 1x1 conv + Relu
 * at 7x7 (ms, LLVM's choice -> 2): 320->1280 0.425 -> 0.394, 1152->192
 * 0.226 -> 0.210, 672->672 0.571 -> 0.450, 960->160 0.194 -> 0.150;
 * ResNet-18 batch 1 30.2 -> 26.7; 4 lost to 2 on every 7x7 shape and 1
 * matched 2.  Twice still spilled 10-26 zmm to the stack per pass
 * (objdump) in the tiles with tail columns (their sums, A's column) and
 * in those prefetching A (the _p tiles: the prefetch addresses); once,
 * none spills.  Sapphire Rapids, kernel time per node, min of 5
 * alternating rounds, ResNet-18 batch 1 one thread: its 3x3 convs at 7x7
 * (im2col, tail tiles) 2.49-2.99 -> 2.02-2.05 ms, its Winograd convs at
 * 56x56 and 28x28 (the _p tiles) 13-17% faster, all kernels 26.1 -> 22.4
 * ms.  Not unrolling the others either left the MLP at batch 16 slower
 * in two runs (medians 1.04x, 1.15x; mins 0.99x, 1.02x). */
enum { UKR_UNROLL = 2 };

/* The direct tiles prefetch B (SMALL_PF) only when its rows are more than
 * PF_MIN_RS vectors apart.  Closer, B is one stream the hardware follows
 * (a conv's activations on a 7x7 map: rows 49 floats apart), and the
 * prefetches only took load slots: gemm_bench, one thread, Zen 4, the
 * 1x1 convs at 7x7 (N = 49) 96-98 -> 101-104 GFLOP/s. */
enum { PF_MIN_RS = 8 };

/* The k loop of a micro-kernel: acc[i*NV + j] += A[i, k] * B[k, j*W..]
 * for the nf first vectors of each row (nf == NV: all).  With tail
 * columns (direct tiles only; nf = NV - 1), the tail columns nf*W + c,
 * c < tail, that are inside nr go along the rows: t[c] += A[0..MR, k] *
 * B[k, nf*W + c], one multiply-add of an MR-lane vector per column (A's
 * column is one load from a packed panel, else the row values already
 * loaded). */
static void ukr_loop(gen *g, bool direct, int nf, int tail, LLVMValueRef *acc, LLVMValueRef *t,
                     LLVMValueRef *arow, LLVMValueRef *bmask)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p;
	int MR = g->g.MR, NV = g->nv, W = g->g.W;
	LLVMValueRef b[8], bt[TAIL_COLS], vofs[8];
	/* vector j of B's row: j*W on, or in kiln_sgemm_pb's panels of P
	 * columns (a tile starts on a panel's first column), j*W / P panels of
	 * CG_PANEL_ROWS(K) rows and j*W % P columns on (a tail column likewise) */
	for (int j = 0; j < nf + (tail ? 1 : 0); j++)
		vofs[j] = g->pb && direct ? add(g, mul(g, i64c(g, j * W / g->P), p[U_BPS]),
		                                i64c(g, j * W % g->P))
		                          : i64c(g, j * W);
	loop lk;
	LLVMValueRef k = loop_begin(g, &lk, i64c(g, 0), p[U_KC], 1);
	LLVMValueRef bk = at(g, p[U_BP], mul(g, k, direct ? p[U_BRS] : i64c(g, g->g.NR)));
	LLVMValueRef ak = at(g, p[U_AP], mul(g, k, i64c(g, MR)));
	LLVMValueRef kofs = direct ? mul(g, k, p[U_ACS]) : NULL;
	for (int j = 0; j < nf; j++)
		b[j] = direct ? mload(g, at(g, bk, vofs[j]), bmask[j])
		              : vload(g, at(g, bk, vofs[j]));
	for (int c = 0; c < tail; c++) { /* only the columns inside nr are read */
		LLVMValueRef in = icmp(g, LLVMIntSLT, i64c(g, nf * W + c), p[U_NR]);
		bt[c] = splat(g, g->vf, load_if(g, in, at(g, bk, add(g, vofs[nf], i64c(g, c)))));
	}
	if (direct && g->pf) { /* B's rows apart (see PF_MIN_RS); LLVM unswitches the loop */
		LLVMValueRef apart = icmp(g, LLVMIntSGT, p[U_BRS], i64c(g, PF_MIN_RS * W));
		LLVMBasicBlockRef join = if_begin(g, g->pb ? LLVMConstInt(L->i1, 1, 0) : apart);
		/* not past B's last row: there a prefetch fetches what the tile
		 * never reads (a conv's im2col B of K = 9 rows: every one; the
		 * small CNN at batch 1 0.068 -> 0.040 ms here, AMD EPYC AVX2) */
		LLVMBasicBlockRef in = if_begin(g, icmp(g, LLVMIntSLT, add(g, k, i64c(g, g->pf)), p[U_KC]));
		for (int j = 0; j < nf + (tail ? 1 : 0); j++)
			prefetch(g, at(g, bk, add(g, mul(g, i64c(g, g->pf), p[U_BRS]), vofs[j])));
		if_end(g, in);
		if_end(g, join);
	}
	if (direct && g->pfa) { /* A's rows TILE_PFA columns ahead, once per line */
		LLVMValueRef line = icmp(g, LLVMIntEQ, LLVMBuildAnd(g->b, kofs, i64c(g, 15), ""), i64c(g, 0));
		LLVMBasicBlockRef join = if_begin(g, line);
		LLVMValueRef ko = add(g, kofs, mul(g, i64c(g, g->pfa), p[U_ACS]));
		for (int i = 0; i < MR; i++)
			prefetch(g, at(g, arow[i], ko));
		if_end(g, join);
	}
	LLVMValueRef acol = tail && g->pa ? mload(g, at(g, p[U_AP], kofs), lanes(g, i64c(g, MR)))
	                                  : LLVMConstNull(g->vf);
	for (int i = 0; i < MR; i++) {
		LLVMValueRef ap = direct ? at(g, arow[i], kofs) : at(g, ak, i64c(g, i));
		LLVMValueRef as = LLVMBuildLoad2(g->b, L->f32, ap, "");
		LLVMValueRef av = splat(g, g->vf, as);
		for (int j = 0; j < nf; j++) {
			LLVMValueRef s = acc[i * NV + j];
			LLVMBuildStore(g->b, fma3(g, av, b[j], LLVMBuildLoad2(g->b, g->vf, s, "")), s);
		}
		if (tail && !g->pa)
			acol = LLVMBuildInsertElement(g->b, acol, as, LLVMConstInt(L->i32, i, 0), "");
	}
	for (int c = 0; c < tail; c++)
		LLVMBuildStore(g->b, fma3(g, acol, bt[c], LLVMBuildLoad2(g->b, g->vf, t[c], "")), t[c]);
	loop_end_unroll(g, &lk, tail || g->pfa ? 1 : UKR_UNROLL);
	/* row i's last vector: lane c is tail column c's row i (one shuffle of
	 * the tail sums; the lanes past the tail are never stored, since the
	 * epilogue's mask holds nr - nf*W <= tail lanes.  Built by inserts into
	 * zeros it compiled, for 8 lanes, to a register form of vmovq that
	 * valgrind cannot decode) */
	for (int i = 0; tail && i < MR; i++) {
		LLVMValueRef sel[64], t0 = LLVMBuildLoad2(g->b, g->vf, t[0], "");
		LLVMValueRef t1 = tail > 1 ? LLVMBuildLoad2(g->b, g->vf, t[1], "") : t0;
		for (int l = 0; l < W; l++)
			sel[l] = LLVMConstInt(L->i32, l == 1 && tail > 1 ? W + i : i, 0);
		LLVMBuildStore(g->b, LLVMBuildShuffleVector(g->b, t0, t1, LLVMConstVector(sel, W), ""),
		               acc[i * NV + nf]);
	}
}

/* The micro-kernels' parameter types, U_ order (U_DCOUNT of them). */
static void ukr_types(gen *g, LLVMTypeRef *t)
{
	cg_llvm *L = g->L;
	LLVMTypeRef v[U_DCOUNT] = {
		[U_AP] = g->fp, [U_BP] = g->fp, [U_KC] = L->i64, [U_C] = g->fp, [U_CRS] = L->i64,
		[U_MR] = L->i64, [U_NR] = L->i64, [U_BETA] = L->f32, [U_BIAS] = g->fp,
		[U_BMODE] = L->i32, [U_LO] = L->f32, [U_HI] = L->f32, [U_RES] = g->fp, [U_RRS] = L->i64, [U_ARS] = L->i64, [U_ACS] = L->i64,
		[U_BRS] = L->i64, [U_ALPHA] = L->f32, [U_BPS] = L->i64,
	};
	memcpy(t, v, sizeof v);
}

/* kiln_sgemm_ukr (packed) or kiln_sgemm_ukr_direct.  Packed: A and B are
 * the panels packa/packb wrote (alpha already in A).  Direct: A is any
 * strided matrix (a_rs, a_cs) and B row-contiguous with row stride b_rs,
 * read in place with masked loads past column nr, and alpha is applied
 * before the epilogue; no packing at all, for products too small in M to
 * pay for it.  nv < NV makes a narrow variant ("...1" for one vector) that
 * the packed path calls for a last panel of at most nv*W columns: a
 * 196-column C is three full panels and 4 columns, which the full tile
 * would compute 64 lanes wide (a 3x3 256-channel conv at 14x14 goes from
 * 82 to 100 GFLOP/s).  The direct tiles keep one call site, which LLVM
 * inlines: with a narrow variant beside it they measured 15% slower.
 * tail (direct, nv > 1): a tile whose last vector would hold at most tail
 * columns (a 7x7 map: N = 49, three vectors and one column) runs a second
 * k loop in the same function that computes those columns along the rows
 * (ukr_loop): MR * (nv - 1) + tail multiply-adds per k instead of MR * nv;
 * one such loop per count of columns, 1 .. tail (with one loop for up to
 * tail, N = 49 paid a second multiply-add per k for a column past nr:
 * gemm_bench's 1x1 convs at 7x7, 94-98 -> 96-101 GFLOP/s). */
static LLVMValueRef emit_ukr(gen *g, bool direct, int nv, int tail)
{
	LLVMTypeRef t[U_DCOUNT];
	ukr_types(g, t);
	char name[48];
	char nvs[12] = "";
	if (nv < g->g.NV)
		snprintf(nvs, sizeof nvs, "%d", nv);
	snprintf(name, sizeof name, "%s_ukr%s%s%s", g->fam, direct ? "_direct" : "", nvs, g->sfx);
	LLVMValueRef fn = function(g, name, t, direct ? U_DCOUNT : U_COUNT), *p = g->p;
	g->nv = nv;
	int MR = g->g.MR, NV = nv, W = g->g.W;
	LLVMValueRef acc[64], tacc[TAIL_COLS], arow[16], bmask[8], on[8];
	for (int i = 0; i < MR * NV; i++)
		acc[i] = local(g, g->vf, LLVMConstNull(g->vf));
	if (direct)
		direct_setup(g, arow, bmask);
	/* where masks are slow, B's vectors plain when the tile is NV whole
	 * vectors wide and in the tail loops (their nf = NV - 1 vectors are) */
	for (int j = 0; j < 8; j++)
		on[j] = g->allon;
	LLVMValueRef *tmask = g->slow_masks ? on : bmask;
	LLVMValueRef whole = icmp(g, LLVMIntSGE, p[U_NR], i64c(g, NV * W));
	fullsplit fs;
	tail = direct && NV > 1 ? tail : 0;
	if (tail) {
		for (int c = 0; c < tail; c++)
			tacc[c] = local(g, g->vf, LLVMConstNull(g->vf));
		LLVMValueRef over = LLVMBuildSub(g->b, p[U_NR], i64c(g, (NV - 1) * W), "");
		LLVMValueRef use = LLVMBuildAnd(g->b, icmp(g, LLVMIntSGT, over, i64c(g, 0)),
		                                icmp(g, LLVMIntSLE, over, i64c(g, tail)), "");
		LLVMBasicBlockRef tb = block(g, "tail"), fb = block(g, "full"), jb = block(g, "kdone");
		LLVMBuildCondBr(g->b, use, tb, fb);
		LLVMPositionBuilderAtEnd(g->b, tb);
		for (int c = 1; c < tail; c++) { /* over == c: a loop of c tail columns */
			LLVMBasicBlockRef cb = block(g, "tailc"), nb = block(g, "tailn");
			LLVMBuildCondBr(g->b, icmp(g, LLVMIntEQ, over, i64c(g, c)), cb, nb);
			LLVMPositionBuilderAtEnd(g->b, cb);
			ukr_loop(g, direct, NV - 1, c, acc, tacc, arow, tmask);
			LLVMBuildBr(g->b, jb);
			LLVMPositionBuilderAtEnd(g->b, nb);
		}
		ukr_loop(g, direct, NV - 1, tail, acc, tacc, arow, tmask);
		LLVMBuildBr(g->b, jb);
		LLVMPositionBuilderAtEnd(g->b, fb);
		for (int full = full_first(g, whole, &fs); full >= 0; full = full_then(g, &fs, full))
			ukr_loop(g, direct, NV, 0, acc, NULL, arow, full ? on : bmask);
		LLVMBuildBr(g->b, jb);
		LLVMPositionBuilderAtEnd(g->b, jb);
	} else if (direct) {
		for (int full = full_first(g, whole, &fs); full >= 0; full = full_then(g, &fs, full))
			ukr_loop(g, direct, NV, 0, acc, NULL, arow, full ? on : bmask);
	} else {
		ukr_loop(g, direct, NV, 0, acc, NULL, arow, bmask);
	}
	if (direct) { /* alpha is almost always 1: its MR*NV products cost ~5% at small K */
		LLVMBasicBlockRef join = if_begin(g, LLVMBuildFCmp(g->b, LLVMRealUNE, p[U_ALPHA],
		                                                   f32c(g, 1), ""));
		for (int i = 0; i < MR * NV; i++) {
			LLVMValueRef v = LLVMBuildLoad2(g->b, g->vf, acc[i], "");
			v = LLVMBuildFMul(g->b, v, splat(g, g->vf, p[U_ALPHA]), "");
			LLVMBuildStore(g->b, v, acc[i]);
		}
		if_end(g, join);
	}
	ukr_epilogue(g, acc);
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* kiln_sgemm_packa(Ap, A, a_rs, a_cs, mc, kc, alpha): the mc x kc block at
 * A as MR-row panels, panel p at Ap + p*MR*kc, element (i, k) at k*MR + i,
 * times alpha; rows past mc are zeros. */
static LLVMValueRef emit_packa(gen *g)
{
	cg_llvm *L = g->L;
	LLVMTypeRef t[] = {g->fp, g->fp, L->i64, L->i64, L->i64, L->i64, L->f32};
	char name[48];
	snprintf(name, sizeof name, "%s_packa", g->fam);
	LLVMValueRef fn = function(g, name, t, 7), *p = g->p;
	LLVMValueRef MR = i64c(g, g->g.MR);
	LLVMValueRef np = LLVMBuildSDiv(g->b, add(g, p[4], i64c(g, g->g.MR - 1)), MR, "");
	loop lp, lk;
	LLVMValueRef pi = loop_begin(g, &lp, i64c(g, 0), np, 1);
	LLVMValueRef m0 = mul(g, pi, MR);
	LLVMValueRef dst0 = at(g, p[0], mul(g, m0, p[5]));
	LLVMValueRef k = loop_begin(g, &lk, i64c(g, 0), p[5], 1);
	LLVMValueRef dst = at(g, dst0, mul(g, k, MR)), kofs = mul(g, k, p[3]);
	for (int i = 0; i < g->g.MR; i++) {
		LLVMValueRef m = add(g, m0, i64c(g, i));
		LLVMValueRef ok = icmp(g, LLVMIntSLT, m, p[4]);
		m = LLVMBuildSelect(g->b, ok, m, i64c(g, 0), ""); /* row 0 always exists */
		LLVMValueRef v = LLVMBuildLoad2(g->b, L->f32, at(g, p[1], add(g, mul(g, m, p[2]), kofs)), "");
		v = LLVMBuildSelect(g->b, ok, LLVMBuildFMul(g->b, v, p[6], ""), f32c(g, 0), "");
		LLVMBuildStore(g->b, v, at(g, dst, i64c(g, i)));
	}
	loop_end(g, &lk);
	loop_end(g, &lp);
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* One k row of a B panel: NR columns from src (column stride cs) into dst;
 * columns at or past left are zeros. */
static void packb_row(gen *g, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef cs,
                      LLVMValueRef left, bool contiguous, int full)
{
	int W = g->g.W;
	if (contiguous) {
		for (int j = 0; j < g->g.NV; j++) {
			LLVMValueRef m = full ? g->allon : lanes(g, LLVMBuildSub(g->b, left, i64c(g, j * W), ""));
			vstore(g, mload(g, at(g, src, i64c(g, j * W)), m), at(g, dst, i64c(g, j * W)));
		}
		return;
	}
	for (int j = 0; j < g->g.NR; j++) {
		LLVMValueRef ok = icmp(g, LLVMIntSLT, i64c(g, j), left);
		LLVMValueRef n = LLVMBuildSelect(g->b, ok, i64c(g, j), i64c(g, 0), "");
		LLVMValueRef v = LLVMBuildLoad2(g->b, g->L->f32, at(g, src, mul(g, n, cs)), "");
		LLVMBuildStore(g->b, LLVMBuildSelect(g->b, ok, v, f32c(g, 0), ""),
		               at(g, dst, i64c(g, j)));
	}
}

/* kiln_sgemm_packb(Bp, B, b_rs, b_cs, kc, nc): the kc x nc panel at B as
 * NR-column panels, panel q at Bp + q*NR*kc, element (k, j) at k*NR + j;
 * columns past nc are zeros.  Rows with b_cs == 1 move as vectors. */
static LLVMValueRef emit_packb_pb(gen *g);

static LLVMValueRef emit_packb(gen *g)
{
	if (g->pb)
		return emit_packb_pb(g);
	cg_llvm *L = g->L;
	LLVMTypeRef t[] = {g->fp, g->fp, L->i64, L->i64, L->i64, L->i64};
	LLVMValueRef fn = function(g, "kiln_sgemm_packb", t, 6), *p = g->p;
	LLVMValueRef NR = i64c(g, g->g.NR);
	LLVMValueRef nq = LLVMBuildSDiv(g->b, add(g, p[5], i64c(g, g->g.NR - 1)), NR, "");
	LLVMValueRef contig = icmp(g, LLVMIntEQ, p[3], i64c(g, 1));
	for (int c = 1; c >= 0; c--) {
		LLVMBasicBlockRef join = if_begin(g, c ? contig : LLVMBuildNot(g->b, contig, ""));
		loop lq, lk;
		LLVMValueRef q = loop_begin(g, &lq, i64c(g, 0), nq, 1);
		LLVMValueRef n0 = mul(g, q, NR), left = LLVMBuildSub(g->b, p[5], n0, "");
		LLVMValueRef dst0 = at(g, p[0], mul(g, n0, p[4]));
		LLVMValueRef src0 = at(g, p[1], mul(g, n0, p[3]));
		fullsplit f; /* a whole panel: plain loads where masks are slow */
		LLVMValueRef whole = c ? icmp(g, LLVMIntSGE, left, NR) : LLVMConstInt(L->i1, 0, 0);
		for (int full = full_first(g, whole, &f); full >= 0; full = full_then(g, &f, full)) {
			LLVMValueRef k = loop_begin(g, &lk, i64c(g, 0), p[4], 1);
			packb_row(g, at(g, dst0, mul(g, k, NR)), at(g, src0, mul(g, k, p[2])), p[3], left,
			          c, full);
			loop_end(g, &lk);
		}
		loop_end(g, &lq);
		if_end(g, join);
	}
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* kiln_sgemm_pb_packb(Bp, B, K, -, kc, nc): kiln_sgemm_packb's panels
 * from B packed in panels of P columns (B at row 0 of a panel's first
 * column, CG_PANEL_ROWS(K) its rows): row k of the NR columns from n0 on is NR / P rows
 * of panels (one vector, or W / P of them, whole vectors of W lanes),
 * masked past nc.  A contiguous copy, where packb's columns of a strided
 * B are K rows apart. */
static LLVMValueRef emit_packb_pb(gen *g)
{
	cg_llvm *L = g->L;
	int W = g->g.W;
	LLVMTypeRef t[] = {g->fp, g->fp, L->i64, L->i64, L->i64, L->i64};
	char name[48];
	snprintf(name, sizeof name, "%s_packb", g->fam);
	LLVMValueRef fn = function(g, name, t, 6), *p = g->p;
	LLVMValueRef NR = i64c(g, g->g.NR);
	LLVMValueRef nq = LLVMBuildSDiv(g->b, add(g, p[5], i64c(g, g->g.NR - 1)), NR, "");
	loop lq, lk;
	LLVMValueRef q = loop_begin(g, &lq, i64c(g, 0), nq, 1);
	LLVMValueRef n0 = mul(g, q, NR), left = LLVMBuildSub(g->b, p[5], n0, "");
	LLVMValueRef dst0 = at(g, p[0], mul(g, n0, p[4]));
	LLVMValueRef src[8], mask[8];
	for (int j = 0; j < g->g.NV; j++) { /* vector j's column n0 + j*W, in its panel */
		LLVMValueRef c = add(g, n0, i64c(g, j * W));
		LLVMValueRef off = add(g, mul(g, mul(g, LLVMBuildSDiv(g->b, c, i64c(g, g->P), ""),
		                                    i64c(g, g->P)), p[2]),
		                       LLVMBuildSRem(g->b, c, i64c(g, g->P), ""));
		LLVMValueRef lj = LLVMBuildSub(g->b, left, i64c(g, j * W), "");
		mask[j] = lanes(g, lj);
		/* a vector wholly past nc reads nothing: keep its address in B */
		src[j] = at(g, p[1], LLVMBuildSelect(g->b, icmp(g, LLVMIntSGT, lj, i64c(g, 0)), off,
		                                     i64c(g, 0), ""));
	}
	fullsplit f; /* a whole panel: plain loads where masks are slow */
	for (int full = full_first(g, icmp(g, LLVMIntSGE, left, NR), &f); full >= 0;
	     full = full_then(g, &f, full)) {
		LLVMValueRef k = loop_begin(g, &lk, i64c(g, 0), p[4], 1);
		LLVMValueRef dst = at(g, dst0, mul(g, k, NR)), ko = mul(g, k, i64c(g, g->P));
		for (int j = 0; j < g->g.NV; j++)
			vstore(g, mload(g, at(g, src[j], ko), full ? g->allon : mask[j]),
			       at(g, dst, i64c(g, j * W)));
		loop_end(g, &lk);
	}
	loop_end(g, &lq);
	LLVMBuildRetVoid(g->b);
	return fn;
}

typedef struct packed_fns {
	LLVMValueRef ukr[9]; /* [v]: the micro-kernel of v vectors, 1 <= v <= NV */
	LLVMValueRef packa, packb;
} packed_fns;

/* The packed path's micro-kernels, one per width in vectors: a last
 * panel of nr columns runs the narrowest that holds it.  SqueezeNet's
 * classifier conv (N = 169: two panels and 41 columns) ran its last panel
 * 64 lanes wide, 88% of its lanes used, 96% with 3 vectors. */
static void packed_ukrs(gen *g, packed_fns *f)
{
	for (int v = 1; v <= g->g.NV; v++)
		f->ukr[v] = emit_ukr(g, false, v, 0);
}

/* The micro-kernel call for a tile nr columns wide: the variant of the
 * fewest vectors that hold them. */
static void call_ukr(gen *g, const packed_fns *f, LLVMValueRef *a, int n)
{
	int NV = g->g.NV, W = g->g.W;
	LLVMBasicBlockRef join = block(g, "join"), full = block(g, "full");
	LLVMValueRef nv = LLVMBuildSDiv(g->b, add(g, a[U_NR], i64c(g, W - 1)), i64c(g, W), "");
	LLVMValueRef sw = LLVMBuildSwitch(g->b, nv, full, (unsigned)(NV - 1));
	for (int v = 1; v < NV; v++) {
		LLVMBasicBlockRef bb = block(g, "narrow");
		LLVMAddCase(sw, i64c(g, v), bb);
		LLVMPositionBuilderAtEnd(g->b, bb);
		call(g, f->ukr[v], a, (unsigned)n);
		LLVMBuildBr(g->b, join);
	}
	LLVMPositionBuilderAtEnd(g->b, full);
	call(g, f->ukr[NV], a, (unsigned)n);
	LLVMBuildBr(g->b, join);
	LLVMPositionBuilderAtEnd(g->b, join);
}

/* The jr/ir loops over one packed MC x KC block of A and KC x NC panel of B.
 * blk: ic, jc, mc, nc, kc, beta_eff, last (i1). */
/* The packed path's tiles in groups of column panels, each group row tile
 * by row tile: a group is as many panels of B as fit in half the core's
 * L2 (geom.GB), so B is read from L2 by every row tile of a group while C
 * is written MR rows at a time, each row a run of the group's columns.
 * Down each column panel (BLIS's order: the panel of B stays in L1) a
 * tile wrote its MR rows' NR columns, 256 bytes each, rows apart; into a
 * C that is not in cache (in a model, an output buffer last touched a
 * layer or more ago) no hardware prefetcher follows that, and every line
 * waited on its read-for-ownership.  Sapphire Rapids (2 MiB L2), a
 * harness calling kiln_sgemm_pa with C cycling over 160 MB of outputs,
 * one thread, GFLOP/s, the two orders alternated, down each panel ->
 * groups: 256x3136x64 108 -> 148-150, with a residual 74 -> 109-111;
 * 128x3136x256 133 -> 146-149; 64x3136x576 106-110 -> 114; 1024x784x256
 * with a residual 146 -> 156; 128x784x1152 133 -> 136; 256x196x2304 144
 * -> 148; 256x784x512 150 -> 152-156.  Groups of a quarter of L2 gained
 * less at K >= 256; along whole 1024-column blocks (B 2 MiB at K 512)
 * lost 10-20% at K >= 512.  Prefetching C's lines for writing at
 * the start of each tile gained nothing down the panels and cost 2-3% in
 * groups. */

static void macro_kernel(gen *g, const packed_fns *f, LLVMValueRef Ap, LLVMValueRef Bp,
                         LLVMValueRef *blk)
{
	/* A's panels: kc floats apart as packa writes them, K in kiln_sgemm_pa's */
	LLVMValueRef astride = g->pa ? g->p[P_K] : blk[4];
	LLVMValueRef *p = g->p;
	LLVMValueRef ic = blk[0], jc = blk[1], mc = blk[2], nc = blk[3], kc = blk[4];
	LLVMValueRef last = blk[6];
	/* the activation at the last K block only: before it, [-inf, inf] */
	LLVMValueRef lo = LLVMBuildSelect(g->b, last, p[P_LO], f32c(g, -INFINITY), "");
	LLVMValueRef hi = LLVMBuildSelect(g->b, last, p[P_HI], f32c(g, INFINITY), "");
	LLVMValueRef bmode = LLVMBuildSelect(g->b, last, p[P_AXIS], LLVMConstInt(g->L->i32, 0, 0), "");
	LLVMValueRef row = icmp(g, LLVMIntEQ, p[P_AXIS], LLVMConstInt(g->L->i32, 2, 0));
	/* the tiles in groups of gw column panels, each group row tile by row
	 * tile (see above) */
	loop lg, lt;
	int MR = g->g.MR, NR = g->g.NR;
	LLVMValueRef nrow = LLVMBuildSDiv(g->b, add(g, mc, i64c(g, MR - 1)), i64c(g, MR), "");
	LLVMValueRef ncol = LLVMBuildSDiv(g->b, add(g, nc, i64c(g, NR - 1)), i64c(g, NR), "");
	LLVMValueRef gw = LLVMBuildSDiv(g->b, i64c(g, g->g.GB), mul(g, kc, i64c(g, NR)), "");
	gw = LLVMBuildSelect(g->b, icmp(g, LLVMIntSLT, gw, i64c(g, 1)), i64c(g, 1), gw, "");
	LLVMValueRef ng = LLVMBuildSDiv(g->b, add(g, ncol, LLVMBuildSub(g->b, gw, i64c(g, 1), "")), gw, "");
	LLVMValueRef g0 = mul(g, loop_begin(g, &lg, i64c(g, 0), ng, 1), gw);
	LLVMValueRef gn = smin(g, gw, LLVMBuildSub(g->b, ncol, g0, ""));
	LLVMValueRef tn = loop_begin(g, &lt, i64c(g, 0), mul(g, nrow, gn), 1);
	LLVMValueRef ti = LLVMBuildSDiv(g->b, tn, gn, "");
	LLVMValueRef tj = add(g, g0, LLVMBuildSRem(g->b, tn, gn, ""));
	LLVMValueRef jr = mul(g, tj, i64c(g, NR));
	LLVMValueRef nr = smin(g, i64c(g, NR), LLVMBuildSub(g->b, nc, jr, ""));
	LLVMValueRef n = add(g, jc, jr);
	LLVMValueRef ir = mul(g, ti, i64c(g, MR));
	LLVMValueRef mr = smin(g, i64c(g, MR), LLVMBuildSub(g->b, mc, ir, ""));
	LLVMValueRef m = add(g, ic, ir);
	/* B's panels: NR columns of blk[7] rows each (jr a multiple of NR) */
	LLVMValueRef a[U_COUNT] = {
		[U_AP] = at(g, Ap, mul(g, ir, astride)), [U_BP] = at(g, Bp, mul(g, jr, blk[7])),
		[U_KC] = kc, [U_C] = at(g, p[P_C], add(g, mul(g, m, p[P_CRS]), n)),
		[U_CRS] = p[P_CRS], [U_MR] = mr, [U_NR] = nr, [U_BETA] = blk[5],
		[U_BIAS] = at(g, p[P_BIAS], LLVMBuildSelect(g->b, row, m, n, "")),
		[U_BMODE] = bmode, [U_LO] = lo, [U_HI] = hi, [U_RRS] = p[P_RRS],
		/* the residual at the last K block only */
		[U_RES] = LLVMBuildSelect(g->b, last, nat(g, p[P_RES], add(g, mul(g, m, p[P_RRS]), n)),
		                          LLVMConstNull(g->fp), ""),
	};
	call_ukr(g, f, a, U_COUNT);
	loop_end(g, &lt);
	loop_end(g, &lg);
}

/* kiln_sgemm_blocked(args..., n0, n1): columns [n0, n1) of C with the
 * BLIS loops jc / pc (pack B) / ic (pack A), scratch from x.  In
 * kiln_sgemm_pb's family B is packed already: its panels of NR from row pc
 * on are the KC x NC panel, panel q K*NR floats after panel q-1. */
static LLVMValueRef emit_blocked(gen *g, const packed_fns *f)
{
	LLVMTypeRef t[P_COUNT + 2];
	char name[48];
	snprintf(name, sizeof name, "%s_blocked", g->fam);
	LLVMValueRef fn = function(g, name, t, gemm_params(g, t, 2)), *p = g->p;
	const geom *G = &g->g;
	LLVMValueRef sp = LLVMBuildStructGEP2(g->b, g->xty, p[P_X], 3, "");
	LLVMValueRef Ap = LLVMBuildLoad2(g->b, g->fp, sp, "scratch");
	LLVMValueRef Bp = at(g, Ap, i64c(g, (G->MC * G->KC + 15) / 16 * 16));
	loop lj, lp, li;
	LLVMValueRef jc = loop_begin(g, &lj, p[P_COUNT], p[P_COUNT + 1], G->NC);
	LLVMValueRef nc = smin(g, i64c(g, G->NC), LLVMBuildSub(g->b, p[P_COUNT + 1], jc, ""));
	LLVMValueRef pc = loop_begin(g, &lp, i64c(g, 0), p[P_K], G->KC);
	LLVMValueRef kc = smin(g, i64c(g, G->KC), LLVMBuildSub(g->b, p[P_K], pc, ""));
	/* kiln_sgemm_pb's packb reads B's panels: from column jc's, row pc on
	 * (jc is a multiple of NC, so of P), with K */
	LLVMValueRef bpanel = g->pb ? at(g, p[P_B], add(g, bcol(g, jc), mul(g, pc, i64c(g, g->P))))
	                            : NULL;
	/* B's panels kc rows of NR apart as packb writes them; kiln_sgemm_pbw's,
	 * NR wide already, are read in place, CG_PANEL_ROWS(K) rows apart */
	LLVMValueRef bstride = g->pbw ? panel_rows(g, g->p[P_K]) : kc;
	if (g->pbw) {
		Bp = bpanel;
	} else {
		LLVMValueRef pb[] = {Bp, g->pb ? bpanel
		                               : at(g, p[P_B], add(g, mul(g, pc, p[P_BRS]),
		                                                   mul(g, jc, p[P_BCS]))),
		                     g->pb ? panel_rows(g, g->p[P_K]) : p[P_BRS], p[P_BCS], kc, nc};
		call(g, f->packb, pb, 6);
	}
	LLVMValueRef first = icmp(g, LLVMIntEQ, pc, i64c(g, 0));
	LLVMValueRef last = icmp(g, LLVMIntEQ, add(g, pc, kc), p[P_K]);
	LLVMValueRef beta = LLVMBuildSelect(g->b, first, p[P_BETA], f32c(g, 1), "");
	LLVMValueRef ic = loop_begin(g, &li, i64c(g, 0), p[P_M], G->MC);
	LLVMValueRef mc = smin(g, i64c(g, G->MC), LLVMBuildSub(g->b, p[P_M], ic, ""));
	LLVMValueRef blk[] = {ic, jc, mc, nc, kc, beta, last, bstride};
	if (g->pa) { /* kiln_sgemm_pa: A's panels from row ic's (a multiple of MR), row pc on */
		macro_kernel(g, f, at(g, p[P_A], add(g, mul(g, ic, p[P_K]), mul(g, pc, i64c(g, G->MR)))),
		             Bp, blk);
	} else {
		LLVMValueRef pa[] = {Ap, at(g, p[P_A], add(g, mul(g, ic, p[P_ARS]), mul(g, pc, p[P_ACS]))),
		                     p[P_ARS], p[P_ACS], mc, kc, p[P_ALPHA]};
		call(g, f->packa, pa, 7);
		macro_kernel(g, f, Ap, Bp, blk);
	}
	loop_end(g, &li);
	loop_end(g, &lp);
	loop_end(g, &lj);
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* kiln_sgemm_tiles(args..., n0, n1), b_cs == 1: columns [n0, n1) of C
 * as MR x NR tiles of the direct micro-kernel, every tile of an NR-column
 * panel in turn, so the K x NR strip of B it reads stays in cache for the
 * next tile; or, when the call's B is at most TILE_ROWS_B floats (it stays
 * in cache anyway), every panel of a row tile in turn.  Nothing is packed:
 * for a few rows of A (an MLP at batch 16, a small conv's output channels)
 * packing B costs as much as the product.  narrow (may be null): the
 * kernel of nnv vectors for a last panel that fits it.
 * Along the rows, C is written MR rows at a time: a stem conv's im2col
 * GEMM (M = 32, K = 27, 896 columns a chunk) wrote its 32 rows side by
 * side, 32 store streams into an output that is cold at the start of a
 * run.  MobileNetV2's first conv (kiln bench --profile, min of 3 rounds,
 * one thread, Zen 4): 0.29-0.33 ms alone, 0.41-0.43 inside the model,
 * 0.33 there along the rows; the models (min of 5 alternating rounds):
 * MobileNetV2 8.06 -> 7.82 ms, SqueezeNet 7.05 -> 6.84, the small CNN at
 * batch 16 0.154 -> 0.151, the MLP unchanged (its B is 1.6 MB). */
enum { TILE_ROWS_B = 32768 };

/* The direct micro-kernel's arguments for the tile of mr x nr at row ir,
 * column jr. */
static void tile_args(gen *g, LLVMValueRef ir, LLVMValueRef jr, LLVMValueRef mr, LLVMValueRef nr,
                      LLVMValueRef *a)
{
	LLVMValueRef *p = g->p;
	LLVMValueRef row = icmp(g, LLVMIntEQ, p[P_AXIS], LLVMConstInt(g->L->i32, 2, 0));
	LLVMValueRef v[U_DCOUNT] = {
		/* kiln_sgemm_pa: A's panel at row ir (tiles are MR rows), rows 1 and
		 * columns MR apart in it */
		[U_AP] = at(g, p[P_A], mul(g, ir, g->pa ? p[P_K] : p[P_ARS])),
		[U_BP] = at(g, p[P_B], g->pb ? bcol(g, jr) : jr),
		[U_KC] = p[P_K], [U_C] = at(g, p[P_C], add(g, mul(g, ir, p[P_CRS]), jr)),
		[U_CRS] = p[P_CRS], [U_MR] = mr, [U_NR] = nr, [U_BETA] = p[P_BETA],
		[U_BIAS] = at(g, p[P_BIAS], LLVMBuildSelect(g->b, row, ir, jr, "")),
		[U_BMODE] = p[P_AXIS], [U_LO] = p[P_LO], [U_HI] = p[P_HI], [U_RRS] = p[P_RRS],
		[U_RES] = nat(g, p[P_RES], add(g, mul(g, ir, p[P_RRS]), jr)),
		[U_ARS] = g->pa ? i64c(g, 1) : p[P_ARS], [U_ACS] = g->pa ? i64c(g, g->g.MR) : p[P_ACS],
		[U_BRS] = p[P_BRS], [U_ALPHA] = p[P_ALPHA],
		[U_BPS] = g->pb ? mul(g, panel_rows(g, g->p[P_K]), i64c(g, g->P)) : i64c(g, 0),
	};
	memcpy(a, v, sizeof v);
}

/* rest (may be null): a one-vector kernel of MR rows.  A last panel of at
 * most NV - 1 vectors (C 196 wide: three panels and 4 columns) then runs
 * apart, after the full panels, one vector at a time, instead of as a
 * whole tile of NV vectors.  Each of its vectors costs about what a full
 * tile's does (MR multiply-adds per k), and the kernel has its own call
 * site (the one in the tile loop stays the only one of the full kernel,
 * which LLVM inlines). */
static LLVMValueRef emit_tiles(gen *g, LLVMValueRef ukr, LLVMValueRef narrow, int nnv,
                               LLVMValueRef rest)
{
	LLVMTypeRef t[P_COUNT + 2];
	char name[48];
	snprintf(name, sizeof name, "%s_tiles%s", g->fam, g->sfx);
	LLVMValueRef fn = function(g, name, t, gemm_params(g, t, 2)), *p = g->p;
	int W = g->g.W, NR = g->g.NR, MR = g->g.MR;
	/* one loop over the tiles, row tile i and column panel j of tile t
	 * either down the panels (i fastest: the K x NR strip of B stays in
	 * cache for the next tile) or, when all of this call's B is small
	 * (TILE_ROWS_B floats), along the rows (j fastest: C is written MR
	 * rows at a time, not M rows side by side).  One call site for the
	 * micro-kernel either way (see emit_ukr). */
	loop lt;
	LLVMValueRef cols = LLVMBuildSub(g->b, p[P_COUNT + 1], p[P_COUNT], "");
	LLVMValueRef main = cols, rem = i64c(g, 0);
	if (rest) { /* the last panel's columns when rest takes them, else 0 */
		LLVMValueRef r = LLVMBuildSRem(g->b, cols, i64c(g, NR), "");
		rem = LLVMBuildSelect(g->b, icmp(g, LLVMIntSLE, r, i64c(g, NR - W)), r, i64c(g, 0), "");
		main = LLVMBuildSub(g->b, cols, rem, "");
	}
	LLVMValueRef nrow = LLVMBuildSDiv(g->b, add(g, p[P_M], i64c(g, MR - 1)), i64c(g, MR), "");
	LLVMValueRef ncol = LLVMBuildSDiv(g->b, add(g, main, i64c(g, NR - 1)), i64c(g, NR), "");
	LLVMValueRef rows_first = icmp(g, LLVMIntSLE, mul(g, p[P_K], cols), i64c(g, TILE_ROWS_B));
	LLVMValueRef tn = loop_begin(g, &lt, i64c(g, 0), mul(g, nrow, ncol), 1);
	LLVMValueRef ti = LLVMBuildSelect(g->b, rows_first, LLVMBuildSDiv(g->b, tn, ncol, ""),
	                                  LLVMBuildSRem(g->b, tn, nrow, ""), "");
	LLVMValueRef tj = LLVMBuildSelect(g->b, rows_first, LLVMBuildSRem(g->b, tn, ncol, ""),
	                                  LLVMBuildSDiv(g->b, tn, nrow, ""), "");
	LLVMValueRef jr = add(g, p[P_COUNT], mul(g, tj, i64c(g, NR)));
	LLVMValueRef nr = smin(g, i64c(g, NR), LLVMBuildSub(g->b, add(g, p[P_COUNT], main), jr, ""));
	LLVMValueRef ir = mul(g, ti, i64c(g, MR));
	LLVMValueRef mr = smin(g, i64c(g, MR), LLVMBuildSub(g->b, p[P_M], ir, ""));
	LLVMValueRef a[U_DCOUNT];
	tile_args(g, ir, jr, mr, nr, a);
	if (narrow) { /* a last panel of at most nnv vectors: the narrower kernel */
		LLVMBasicBlockRef nb = block(g, "narrow"), wb = block(g, "wide"), jb = block(g, "join");
		LLVMBuildCondBr(g->b, icmp(g, LLVMIntSLE, nr, i64c(g, (int64_t)nnv * W)), nb, wb);
		LLVMPositionBuilderAtEnd(g->b, nb);
		call(g, narrow, a, U_DCOUNT);
		LLVMBuildBr(g->b, jb);
		LLVMPositionBuilderAtEnd(g->b, wb);
		call(g, ukr, a, U_DCOUNT);
		LLVMBuildBr(g->b, jb);
		LLVMPositionBuilderAtEnd(g->b, jb);
	} else {
		call(g, ukr, a, U_DCOUNT);
	}
	loop_end(g, &lt);
	if (rest) { /* the last panel's vectors, each row tile in turn */
		loop lr;
		LLVMValueRef nvec = LLVMBuildSDiv(g->b, add(g, rem, i64c(g, W - 1)), i64c(g, W), "");
		LLVMValueRef j0 = add(g, p[P_COUNT], main);
		tn = loop_begin(g, &lr, i64c(g, 0), mul(g, nrow, nvec), 1);
		ti = LLVMBuildSDiv(g->b, tn, nvec, "");
		LLVMValueRef off = mul(g, LLVMBuildSRem(g->b, tn, nvec, ""), i64c(g, W));
		ir = mul(g, ti, i64c(g, MR));
		mr = smin(g, i64c(g, MR), LLVMBuildSub(g->b, p[P_M], ir, ""));
		tile_args(g, ir, add(g, j0, off), mr, smin(g, i64c(g, W), LLVMBuildSub(g->b, rem, off, "")),
		          a);
		call(g, rest, a, U_DCOUNT);
		loop_end(g, &lr);
	}
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* ---- direct paths (no packing) ------------------------------------------- */

/* The axpy form's strips, in vectors of C's row per pass over K.  A pass
 * streams a strip of every row of B, so wide strips keep the reads long
 * and few (16 vectors: a 1 KiB run of each row, the whole 512-wide row of
 * an MLP layer in two passes); then 4-vector strips, then single vectors.
 * Each element is one accumulator summed over k in order, as every other
 * path does: splitting K over several accumulators would make the 512->10
 * layer a third faster, but changes the rounding (the CNN training parity
 * test, within PyTorch's own f32 spread, then fails). */
enum { AXPY_WIDE = 16, AXPY_MID = 4 };

/* Rows of B ahead that the full strips prefetch.  Consecutive rows of a
 * strip are N floats apart (2 KiB for a 512-wide layer), a new page every
 * row or two, where the hardware prefetchers stop; the bench MLP's weights
 * (2.7 MB) come from L3 on every run.  4 to 8 rows ahead measured alike:
 * MLP batch 1, one thread, 0.0307 -> 0.0277 ms. */
enum { AXPY_PF = 4 };

/* C[m, n + j*W + l] for j < nv under mask[j]: the sum over k of A[m, k]
 * times row k of B, then the epilogue (acc: nv locals). */
static void axpy_block(gen *g, LLVMValueRef m, LLVMValueRef n, int nv, LLVMValueRef *mask,
                       LLVMValueRef *acc)
{
	LLVMValueRef *p = g->p;
	int W = g->g.W;
	for (int j = 0; j < nv; j++)
		LLVMBuildStore(g->b, LLVMConstNull(g->vf), acc[j]);
	LLVMValueRef arow = at(g, p[P_A], mul(g, m, p[P_ARS]));
	LLVMValueRef bcolp[AXPY_WIDE]; /* row 0 of each vector's columns */
	for (int j = 0; j < nv; j++) {
		LLVMValueRef nj = add(g, n, i64c(g, j * W));
		bcolp[j] = at(g, p[P_B], g->pb ? bcol(g, nj) : nj);
	}
	loop lk;
	LLVMValueRef k = loop_begin(g, &lk, i64c(g, 0), p[P_K], 1);
	LLVMValueRef a = LLVMBuildLoad2(g->b, g->L->f32, at(g, arow, mul(g, k, p[P_ACS])), "");
	LLVMValueRef av = splat(g, g->vf, a);
	LLVMValueRef krow = mul(g, k, p[P_BRS]);
	/* the strip of row k + AXPY_PF, a line per vector (never faults); not
	 * in kiln_sgemm_pb, whose panels are contiguous streams the hardware
	 * prefetchers follow (the MLP at batch 1, one thread: 8% less time
	 * without; 8 and 16 rows ahead 7% and 16% more) */
	if (!mask && !g->pb)
		for (int j = 0; j < nv; j++)
			prefetch(g, at(g, bcolp[j], add(g, krow, mul(g, i64c(g, AXPY_PF), p[P_BRS]))));
	for (int j = 0; j < nv; j++) {
		LLVMValueRef bp = at(g, bcolp[j], krow);
		LLVMValueRef bv = mask ? mload(g, bp, mask[j]) : vload(g, bp);
		LLVMBuildStore(g->b, fma3(g, av, bv, LLVMBuildLoad2(g->b, g->vf, acc[j], "")), acc[j]);
	}
	loop_end(g, &lk);
	LLVMValueRef colb_on = icmp(g, LLVMIntEQ, p[P_AXIS], LLVMConstInt(g->L->i32, 1, 0));
	LLVMValueRef rowb = load_if(g, icmp(g, LLVMIntEQ, p[P_AXIS], LLVMConstInt(g->L->i32, 2, 0)),
	                            at(g, p[P_BIAS], m));
	LLVMValueRef crow = at(g, p[P_C], mul(g, m, p[P_CRS]));
	LLVMValueRef all = LLVMConstAllOnes(g->vi1);
	for (int j = 0; j < nv; j++) {
		LLVMValueRef off = add(g, n, i64c(g, j * W));
		LLVMValueRef v = LLVMBuildLoad2(g->b, g->vf, acc[j], "");
		v = LLVMBuildFMul(g->b, v, splat(g, g->vf, p[P_ALPHA]), "");
		vec_epilogue(g, v, at(g, crow, off), mask ? mask[j] : all, p[P_BETA],
		             at(g, p[P_BIAS], off), colb_on, rowb,
		             nat(g, nat(g, p[P_RES], mul(g, m, p[P_RRS])), off), p[P_LO], p[P_HI]);
	}
}

/* kiln_sgemm_axpy(args...), b_cs == 1: per row m of C, strips of
 * AXPY_WIDE vectors, then of AXPY_MID, then single vectors (the last one
 * masked), C[m, n..] = sum over k of A[m, k] * B[k, n..]. */
static LLVMValueRef emit_axpy(gen *g)
{
	LLVMTypeRef t[P_COUNT];
	char name[48];
	snprintf(name, sizeof name, "%s_axpy", g->fam);
	LLVMValueRef fn = function(g, name, t, gemm_params(g, t, 0)), *p = g->p;
	LLVMValueRef acc[AXPY_WIDE];
	int W = g->g.W;
	for (int j = 0; j < AXPY_WIDE; j++)
		acc[j] = local(g, g->vf, NULL);
	static const int nvs[] = {AXPY_WIDE, AXPY_MID};
	loop lm, ln, lt;
	LLVMValueRef m = loop_begin(g, &lm, i64c(g, 0), p[P_M], 1);
	LLVMValueRef n0 = i64c(g, 0);
	for (int s = 0; s < 2; s++) {
		int w = nvs[s] * W;
		/* strips of w columns in [n0, N): up to n0 + (N - n0) / w * w */
		LLVMValueRef end = add(g, n0, mul(g, LLVMBuildSDiv(g->b, LLVMBuildSub(g->b, p[P_N], n0, ""),
		                                                   i64c(g, w), ""), i64c(g, w)));
		LLVMValueRef n = loop_begin(g, &ln, n0, end, w);
		axpy_block(g, m, n, nvs[s], NULL, acc);
		loop_end(g, &ln);
		n0 = end;
	}
	LLVMValueRef n = loop_begin(g, &lt, n0, p[P_N], W);
	LLVMValueRef mask = lanes(g, LLVMBuildSub(g->b, p[P_N], n, ""));
	axpy_block(g, m, n, 1, &mask, acc);
	loop_end(g, &lt);
	loop_end(g, &lm);
	LLVMBuildRetVoid(g->b);
	return fn;
}

enum { DOT_U = 4 }; /* independent accumulators of the dot form */

/* sum over k < K of x[k] * y[k], both contiguous */
static LLVMValueRef dot(gen *g, LLVMValueRef x, LLVMValueRef y, LLVMValueRef *acc)
{
	int W = g->g.W;
	LLVMValueRef K = g->p[P_K];
	for (int u = 0; u < DOT_U; u++)
		LLVMBuildStore(g->b, LLVMConstNull(g->vf), acc[u]);
	LLVMValueRef kmain = LLVMBuildSub(g->b, K, LLVMBuildSRem(g->b, K, i64c(g, DOT_U * W), ""), "");
	loop l1, l2;
	LLVMValueRef k = loop_begin(g, &l1, i64c(g, 0), kmain, DOT_U * W);
	for (int u = 0; u < DOT_U; u++) {
		LLVMValueRef o = add(g, k, i64c(g, u * W));
		LLVMValueRef v = fma3(g, vload(g, at(g, x, o)), vload(g, at(g, y, o)),
		                      LLVMBuildLoad2(g->b, g->vf, acc[u], ""));
		LLVMBuildStore(g->b, v, acc[u]);
	}
	loop_end(g, &l1);
	k = loop_begin(g, &l2, kmain, K, W);
	LLVMValueRef m = lanes(g, LLVMBuildSub(g->b, K, k, ""));
	LLVMValueRef v = fma3(g, mload(g, at(g, x, k), m), mload(g, at(g, y, k), m),
	                      LLVMBuildLoad2(g->b, g->vf, acc[0], ""));
	LLVMBuildStore(g->b, v, acc[0]);
	loop_end(g, &l2);
	LLVMValueRef s = LLVMBuildLoad2(g->b, g->vf, acc[0], "");
	for (int u = 1; u < DOT_U; u++)
		s = LLVMBuildFAdd(g->b, s, LLVMBuildLoad2(g->b, g->vf, acc[u], ""), "");
	return hsum(g, s);
}

/* kiln_sgemm_dot(args...), a_cs == 1 and b_rs == 1: each C[m, n] is a dot
 * product of a row of A and a column of B, both contiguous. */
static LLVMValueRef emit_dot(gen *g)
{
	LLVMTypeRef t[P_COUNT];
	LLVMValueRef fn = function(g, "kiln_sgemm_dot", t, gemm_params(g, t, 0)), *p = g->p;
	LLVMValueRef acc[DOT_U];
	for (int u = 0; u < DOT_U; u++)
		acc[u] = local(g, g->vf, NULL);
	loop lm, ln;
	LLVMValueRef m = loop_begin(g, &lm, i64c(g, 0), p[P_M], 1);
	LLVMValueRef arow = at(g, p[P_A], mul(g, m, p[P_ARS]));
	LLVMValueRef n = loop_begin(g, &ln, i64c(g, 0), p[P_N], 1);
	LLVMValueRef s = dot(g, arow, at(g, p[P_B], mul(g, n, p[P_BCS])), acc);
	scalar_epilogue(g, LLVMBuildFMul(g->b, s, p[P_ALPHA], ""), m, n);
	loop_end(g, &ln);
	loop_end(g, &lm);
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* kiln_sgemm_dot_cols(args..., n0, n1): the dot form with kiln_sgemm_
 * blocked's parameters, for emit_range's row split (which passes all of
 * C's columns). */
static LLVMValueRef emit_dot_cols(gen *g, LLVMValueRef dot)
{
	LLVMTypeRef t[P_COUNT + 2];
	function(g, "kiln_sgemm_dot_cols", t, gemm_params(g, t, 2));
	call(g, dot, g->p, P_COUNT);
	LLVMBuildRetVoid(g->b);
	return g->fn;
}

/* kiln_sgemm_naive(args...): any strides, one element at a time (tiny
 * problems and K == 0). */
static LLVMValueRef emit_naive(gen *g)
{
	LLVMTypeRef t[P_COUNT];
	LLVMValueRef fn = function(g, "kiln_sgemm_naive", t, gemm_params(g, t, 0)), *p = g->p;
	LLVMValueRef s = local(g, g->L->f32, NULL);
	loop lm, ln, lk;
	LLVMValueRef m = loop_begin(g, &lm, i64c(g, 0), p[P_M], 1);
	LLVMValueRef n = loop_begin(g, &ln, i64c(g, 0), p[P_N], 1);
	LLVMBuildStore(g->b, f32c(g, 0), s);
	LLVMValueRef k = loop_begin(g, &lk, i64c(g, 0), p[P_K], 1);
	LLVMValueRef a = at(g, p[P_A], add(g, mul(g, m, p[P_ARS]), mul(g, k, p[P_ACS])));
	LLVMValueRef b = at(g, p[P_B], add(g, mul(g, k, p[P_BRS]), mul(g, n, p[P_BCS])));
	LLVMValueRef ab = LLVMBuildFMul(g->b, LLVMBuildLoad2(g->b, g->L->f32, a, ""),
	                                LLVMBuildLoad2(g->b, g->L->f32, b, ""), "");
	LLVMBuildStore(g->b, LLVMBuildFAdd(g->b, LLVMBuildLoad2(g->b, g->L->f32, s, ""), ab, ""), s);
	loop_end(g, &lk);
	LLVMValueRef v = LLVMBuildLoad2(g->b, g->L->f32, s, "");
	scalar_epilogue(g, LLVMBuildFMul(g->b, v, p[P_ALPHA], ""), m, n);
	loop_end(g, &ln);
	loop_end(g, &lm);
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* ---- threads and the entry ----------------------------------------------- */

/* kiln_sgemm_range(x, begin, end): NR-column panels [begin, end) of the
 * product whose arguments rt_parallel_for's caller put behind x->buf (a
 * field kiln_sgemm itself never needs), with this thread's x->scratch;
 * blocked is kiln_sgemm_blocked or kiln_sgemm_tiles (same arguments). */
/* Rows per unit of a row split: a multiple of MR. */
enum { ROW_BLOCK_TILES = 2 };

/* Rows per unit of a row split of tiles mr tall. */
static int64_t row_block(const gen *g, int mr)
{
	return (int64_t)mr * (g->row_tiles ? g->row_tiles : ROW_BLOCK_TILES);
}

/* rows: [begin, end) count blocks of MR * ROW_BLOCK_TILES rows of A and C
 * (all of C's columns) instead of column panels; A, C, a per-row bias and
 * the residual start at the block's first row. */
static LLVMValueRef emit_range(gen *g, LLVMValueRef blocked, const char *name, bool rows)
{
	LLVMTypeRef t[] = {g->xp, g->L->i64, g->L->i64};
	LLVMValueRef fn = function(g, name, t, 3);
	LLVMValueRef x = LLVMGetParam(fn, 0), begin = LLVMGetParam(fn, 1), end = LLVMGetParam(fn, 2);
	LLVMValueRef bp = LLVMBuildStructGEP2(g->b, g->xty, x, 0, "");
	LLVMValueRef args = LLVMBuildLoad2(g->b, LLVMStructGetTypeAtIndex(g->xty, 0), bp, "");
	args = LLVMBuildBitCast(g->b, args, LLVMPointerType(g->argty, 0), "");
	LLVMValueRef a[P_COUNT + 2];
	a[P_X] = x;
	for (int i = 1; i < P_COUNT; i++) {
		LLVMValueRef fp = LLVMBuildStructGEP2(g->b, g->argty, args, i, "");
		a[i] = LLVMBuildLoad2(g->b, LLVMStructGetTypeAtIndex(g->argty, i), fp, "");
	}
	if (rows) {
		LLVMValueRef RB = i64c(g, row_block(g, g->g.MR));
		LLVMValueRef r0 = mul(g, begin, RB), r1 = smin(g, mul(g, end, RB), a[P_M]);
		/* the bias axis (kiln_sgemm_pm's may have CG_SGEMM_C_BLOCKED) */
		LLVMValueRef ax = LLVMBuildAnd(g->b, a[P_AXIS], LLVMConstInt(g->L->i32, 3, 0), "");
		LLVMValueRef rowb = icmp(g, LLVMIntEQ, ax, LLVMConstInt(g->L->i32, 2, 0));
		a[P_M] = LLVMBuildSub(g->b, r1, r0, "");
		a[P_A] = at(g, a[P_A], mul(g, r0, g->pa ? a[P_K] : a[P_ARS])); /* pa: whole panels */
		a[P_C] = at(g, a[P_C], mul(g, r0, a[P_CRS]));
		a[P_BIAS] = LLVMBuildSelect(g->b, rowb, at(g, a[P_BIAS], r0), a[P_BIAS], "");
		a[P_RES] = nat(g, a[P_RES], mul(g, r0, a[P_RRS]));
		a[P_COUNT] = i64c(g, 0);
		a[P_COUNT + 1] = a[P_N];
	} else {
		LLVMValueRef NR = i64c(g, g->g.NR);
		a[P_COUNT] = mul(g, begin, NR);
		a[P_COUNT + 1] = smin(g, mul(g, end, NR), a[P_N]);
	}
	call(g, blocked, a, P_COUNT + 2);
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* kiln_sgemm_axpy_range / kiln_sgemm_dot_range(x, begin, end): columns
 * [begin*W, end*W) of the product behind x->buf through a direct form
 * (callee, kiln_sgemm's arguments): B, C, a per-column bias and the
 * residual start at the first column, N is the range's width. */
static LLVMValueRef emit_vec_range(gen *g, LLVMValueRef callee, const char *name)
{
	LLVMTypeRef t[] = {g->xp, g->L->i64, g->L->i64};
	LLVMValueRef fn = function(g, name, t, 3);
	LLVMValueRef x = LLVMGetParam(fn, 0), begin = LLVMGetParam(fn, 1), end = LLVMGetParam(fn, 2);
	LLVMValueRef bp = LLVMBuildStructGEP2(g->b, g->xty, x, 0, "");
	LLVMValueRef args = LLVMBuildLoad2(g->b, LLVMStructGetTypeAtIndex(g->xty, 0), bp, "");
	args = LLVMBuildBitCast(g->b, args, LLVMPointerType(g->argty, 0), "");
	LLVMValueRef a[P_COUNT];
	a[P_X] = x;
	for (int i = 1; i < P_COUNT; i++) {
		LLVMValueRef fp = LLVMBuildStructGEP2(g->b, g->argty, args, i, "");
		a[i] = LLVMBuildLoad2(g->b, LLVMStructGetTypeAtIndex(g->argty, i), fp, "");
	}
	LLVMValueRef W = i64c(g, vec_unit(g));
	LLVMValueRef n0 = mul(g, begin, W), n1 = smin(g, mul(g, end, W), a[P_N]);
	LLVMValueRef colb = icmp(g, LLVMIntEQ, a[P_AXIS], LLVMConstInt(g->L->i32, 1, 0));
	a[P_N] = LLVMBuildSub(g->b, n1, n0, "");
	/* kiln_sgemm_pb's (n0 on a panel's first column): CG_PANEL_ROWS(K) rows
	 * of P per panel */
	a[P_B] = at(g, a[P_B], g->pb ? mul(g, n0, panel_rows(g, a[P_K]))
	                             : mul(g, n0, a[P_BCS]));
	a[P_C] = at(g, a[P_C], n0);
	a[P_BIAS] = LLVMBuildSelect(g->b, colb, at(g, a[P_BIAS], n0), a[P_BIAS], "");
	a[P_RES] = nat(g, a[P_RES], n0);
	call(g, callee, a, P_COUNT);
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* Calls rt_parallel_for(&copy, panels, range) over ceil(p[dim] / unit)
 * panels, where copy is *x with buf
 * pointing at the arguments.  The copy is 128 bytes of which rt_exec uses
 * the first 40, so a runtime that copies a grown rt_exec stays in bounds. */
static void parallel(gen *g, LLVMValueRef range, int64_t unit, int dim)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p;
	LLVMValueRef args = local(g, g->argty, NULL);
	for (int i = 1; i < P_COUNT; i++)
		LLVMBuildStore(g->b, p[i], LLVMBuildStructGEP2(g->b, g->argty, args, i, ""));
	LLVMValueRef copy = local(g, LLVMArrayType(L->i64, 16), NULL);
	LLVMBuildStore(g->b, LLVMConstNull(LLVMArrayType(L->i64, 16)), copy);
	LLVMValueRef cx = LLVMBuildBitCast(g->b, copy, g->xp, "");
	LLVMBuildStore(g->b, LLVMBuildLoad2(g->b, g->xty, p[P_X], ""), cx);
	LLVMValueRef bp = LLVMBuildStructGEP2(g->b, g->xty, cx, 0, "");
	LLVMBuildStore(g->b, LLVMBuildBitCast(g->b, args, LLVMStructGetTypeAtIndex(g->xty, 0), ""),
	               bp);
	LLVMValueRef panels = LLVMBuildSDiv(g->b, add(g, p[dim], i64c(g, unit - 1)),
	                                    i64c(g, unit), "");
	LLVMTypeRef pt[3];
	LLVMGetParamTypes(LLVMGlobalGetValueType(L->par_for), pt);
	LLVMValueRef a[] = {LLVMBuildPointerCast(g->b, cx, pt[0], ""), panels,
	                    LLVMBuildPointerCast(g->b, range, pt[2], "")};
	call(g, L->par_for, a, 3);
}

/* Work (M*N*K) below which threads cost more than they save, and at or
 * below which packing does.  B rows contiguous are not packed at all (the
 * direct tiles) when A has at most TILE_M rows, or C at most two panels of
 * columns (A is then read once or twice), or A at most 2*TILE_M rows and C
 * at most TILE_N columns (B's rows close enough together that a panel's
 * strip spans few pages) or K at least TILE_DEEP_K (a tile's many k steps
 * pay for B's rows being pages apart; packing B costs as much as the
 * product at 64 rows: Sapphire Rapids, C out of cache, one thread, 64 x
 * 3136 x K packed -> direct: K 128 163 -> 140 GFLOP/s, 256 157 -> 162,
 * 384 140 -> 165, 576 134 -> 167, 1152 133 -> 168; at 96 and 128 rows
 * neither won everywhere).  Measured with bench/gemm_bench.c on the models'
 * shapes (best of runs, CPU time): MLP 784->512 at batch 16 100 GFLOP/s and
 * at batch 64 110 against 104 packed, a 1x1 conv 144->24 at 56x56 108
 * against 93, a 3x3 512-channel conv at 7x7 (N = 49) 84 against 68.  With
 * 64 rows or more and thousands of columns packing wins (the 7x7 stem conv
 * of ResNet, N = 12544: 85 against 77), so it keeps those.  Over the
 * pool from PAR_WORK: the pool's workers spin between a run's loops, so a
 * split pays from about 3 us of work on; at 2^21 SqueezeNet's squeeze
 * convs at 13x13 (48 or 64 x 169 x 192-256, a GEMM per concat part) ran
 * on one thread of two: at 2^19 (bench/ab.py --nodes, two threads, 5
 * rounds) 0.067 -> 0.050, 0.057 -> 0.041, 0.041 -> 0.028 ms, their expand
 * 1x1 convs 0.023 -> 0.015; the model 2.94 -> 2.86 ms; MobileNetV2,
 * ResNet-18, ShuffleNetV2 unchanged. */
enum { PAR_WORK = 1 << 19, SMALL_WORK = 1 << 13, THIN_M = 4, TILE_M = 32,
       TILE_N = 1024, TILE_DEEP_K = 256 };

/* Work at or above which the direct forms (a batch-1 Linear) split their
 * columns over the threads, in vectors: they stream B once, so each thread
 * reads its own columns' share of it.  See bench/gemm_bench.c's threaded
 * column: a pool dispatch costs about a microsecond. */
enum { VEC_PAR_WORK = 1 << 16 };

/* Rows of the one-vector direct tiles: 8 accumulators cover the FMA
 * latency (8 broadcasts and one load of B per 8 FMAs). */
enum { TILE1_MR = 8 };

/* Rows of B ahead that the direct tiles prefetch: their first row tile
 * reads each strip of B from L3 (the MLP's weights do not stay in L2),
 * a page or two per row.  MLP batch 16, one thread, 8 x 3 tiles: ~0.101
 * -> ~0.098 ms; 24 or 48 rows ahead no better.  The MR x NR tiles gained
 * nothing from it on Zen 5 but much on a Sapphire Rapids Xeon, whose L2
 * streamer does not cover these strides (gemm_bench, one thread, MLP
 * 784->512 at batch 48: 69% -> 83% of peak; 64: 66% -> 82%; the
 * transformer block, M = 64: ~6% less CPU time). */
enum { SMALL_PF = 8 };

/* Columns of A ahead that the direct tiles prefetch, once per line of each
 * of their rows: with C a panel or two wide (a 1x1 conv on a 7x7 map,
 * N = 49) every row tile streams its rows of A (the weights) once, from
 * L3 or memory, and the hardware prefetchers did not keep up.
 * RegNetX-800MF's 672 -> 672 1x1 convs at 7x7, batch 1, one thread
 * (kiln bench --profile, time relative to an unchanged packed GEMM in the
 * same run, median of 4): 1.86 -> 1.50, 19% less; the other direct tiles
 * (M = 64, K = 32; grouped M = 16) unchanged.  Every iteration instead of
 * once per line: the same gain, 6 more loads per 24 FMAs. */
enum { TILE_PFA = 64 };

/* ... but only there: where C is wider than PFA_MAX_N tile widths, A is
 * read by many column tiles and stays in cache, and the prefetches (8 more
 * address computations beside 24 accumulators and the rows of A, under a
 * branch in the k loop) cost instead.  On a Zen 4 (gemm_bench, one thread)
 * they had taken the MLP 784 -> 512 at batch 16 from 110 to 66 GFLOP/s, at
 * batch 48 from 111 to 67, while the 1x1 convs on 7x7 maps keep their gain
 * (160 -> 960: 76 -> 88; the 3x3 512-channel conv at 7x7: 74 -> 92). */
enum { PFA_MAX_N = 2 };

/* if (cond) { callee(args...); return; } */
static void tail_if(gen *g, LLVMValueRef cond, LLVMValueRef callee, LLVMValueRef *a, int n)
{
	LLVMBasicBlockRef then = block(g, "then"), next = block(g, "next");
	LLVMBuildCondBr(g->b, cond, then, next);
	LLVMPositionBuilderAtEnd(g->b, then);
	if (callee)
		call(g, callee, a, n);
	LLVMBuildRetVoid(g->b);
	LLVMPositionBuilderAtEnd(g->b, next);
}

/* One shape of direct tiles (mr x nr, nr = nv*W) and its split forms. */
typedef struct tile_fns {
	LLVMValueRef tiles, range, rows;
	int mr, nr;
} tile_fns;

typedef struct entry_fns {
	LLVMValueRef naive, axpy, dot, blocked, range, rows;
	LLVMValueRef axpy_range, dot_range, dot_rows;
	tile_fns t6, t6p, ts, t1; /* the target's MR x NV tiles (t6p prefetching A), small-M
	                             tiles, one-vector tiles */
} entry_fns;

/* if (cond) { par ? split dim (P_N or P_M) in units through range :
 * callee(args...); return; } */
static void direct_if(gen *g, LLVMValueRef cond, LLVMValueRef par, LLVMValueRef callee,
                      LLVMValueRef range, int64_t unit, int dim)
{
	LLVMBasicBlockRef then = block(g, "direct"), next = block(g, "next");
	LLVMBasicBlockRef split = block(g, "split"), serial = block(g, "serial");
	LLVMBuildCondBr(g->b, cond, then, next);
	LLVMPositionBuilderAtEnd(g->b, then);
	LLVMBuildCondBr(g->b, par, split, serial);
	LLVMPositionBuilderAtEnd(g->b, split);
	parallel(g, range, unit, dim);
	LLVMBuildRetVoid(g->b);
	LLVMPositionBuilderAtEnd(g->b, serial);
	call(g, callee, g->p, P_COUNT);
	LLVMBuildRetVoid(g->b);
	LLVMPositionBuilderAtEnd(g->b, next);
}

/* C one column wide with A's rows and B's column contiguous (a squeeze-
 * excite block's FC layers: a 1x1 conv on a 1x1 map, M = C_out, K = C_in):
 * the dot form, one dot product per row of A, its rows split over the
 * pool from VEC_PAR_WORK.  The one-vector tiles would use one lane of
 * each vector: gemm_bench's squeeze-excite FC 240 -> 960 took 58 us there,
 * 9 x the dot form's time. */
static void gemv_if(gen *g, LLVMValueRef cond, LLVMValueRef pool, LLVMValueRef work,
                    const entry_fns *f)
{
	int64_t unit = (int64_t)g->g.MR * ROW_BLOCK_TILES;
	LLVMValueRef par = LLVMBuildAnd(g->b, LLVMBuildIsNotNull(g->b, pool, ""),
	                                icmp(g, LLVMIntSGE, work, i64c(g, VEC_PAR_WORK)), "");
	par = LLVMBuildAnd(g->b, par, icmp(g, LLVMIntSGE, g->p[P_M], i64c(g, 2 * unit)), "");
	direct_if(g, cond, par, f->dot, f->dot_rows, unit, P_M);
}

/* Columns [0, N) through cols, over the pool's threads when par: split by
 * column panels (range), or when prows by blocks of rows (rows); then
 * returns. */
static void columns(gen *g, LLVMValueRef par, LLVMValueRef prows, LLVMValueRef cols,
                    LLVMValueRef range, LLVMValueRef rows, int mr, int nr)
{
	LLVMBasicBlockRef byrow = block(g, "byrow"), notrow = block(g, "notrow");
	LLVMBasicBlockRef bycol = block(g, "bycol"), serial = block(g, "serial");
	LLVMBuildCondBr(g->b, prows, byrow, notrow);
	LLVMPositionBuilderAtEnd(g->b, byrow);
	parallel(g, rows, row_block(g, mr), P_M);
	LLVMBuildRetVoid(g->b);
	LLVMPositionBuilderAtEnd(g->b, notrow);
	LLVMBuildCondBr(g->b, par, bycol, serial);
	LLVMPositionBuilderAtEnd(g->b, bycol);
	parallel(g, range, nr, P_N);
	LLVMBuildRetVoid(g->b);
	LLVMPositionBuilderAtEnd(g->b, serial);
	LLVMValueRef a[P_COUNT + 2];
	memcpy(a, g->p, P_COUNT * sizeof *a);
	a[P_COUNT] = i64c(g, 0);
	a[P_COUNT + 1] = g->p[P_N];
	call(g, cols, a, P_COUNT + 2);
	LLVMBuildRetVoid(g->b);
}

/* v rounded up to a multiple of unit */
static LLVMValueRef pad(gen *g, LLVMValueRef v, int64_t unit)
{
	return mul(g, LLVMBuildSDiv(g->b, add(g, v, i64c(g, unit - 1)), i64c(g, unit), ""),
	           i64c(g, unit));
}

/* Over the pool when par (a pool and work enough), with t's tiles: by
 * column panels when C has two or more; with fewer than four (which split
 * unevenly over two threads, or not at all) by blocks of rows instead when
 * there are enough; then returns. */
static void split(gen *g, LLVMValueRef par, const tile_fns *t)
{
	LLVMValueRef *p = g->p;
	LLVMValueRef wide = icmp(g, LLVMIntSGE, p[P_N], i64c(g, 4 * t->nr));
	LLVMValueRef prows = LLVMBuildAnd(g->b, par, LLVMBuildNot(g->b, wide, ""), "");
	prows = LLVMBuildAnd(g->b, prows, icmp(g, LLVMIntSGE, p[P_M],
	                                       i64c(g, 4 * t->mr * ROW_BLOCK_TILES)), "");
	LLVMValueRef pcol = LLVMBuildAnd(g->b, par, icmp(g, LLVMIntSGE, p[P_N], i64c(g, 2 * t->nr)), "");
	columns(g, pcol, prows, t->tiles, t->range, t->rows, t->mr, t->nr);
}

/* The start of an entry point: void name(kiln_sgemm's arguments),
 * returning at once when C is empty; work = M*N*K, pool = x->pool. */
static LLVMValueRef entry_begin(gen *g, const char *name, LLVMValueRef *work, LLVMValueRef *pool)
{
	LLVMTypeRef t[P_COUNT];
	LLVMValueRef fn = function(g, name, t, gemm_params(g, t, 0)), *p = g->p;
	LLVMValueRef zero = i64c(g, 0);
	LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
	    LLVMCreateEnumAttribute(g->L->ctx, LLVMGetEnumAttributeKindForName("noinline", 8), 0));
	tail_if(g, LLVMBuildOr(g->b, icmp(g, LLVMIntSLE, p[P_M], zero),
	                       icmp(g, LLVMIntSLE, p[P_N], zero), ""), NULL, NULL, 0);
	*work = mul(g, mul(g, p[P_M], p[P_N]), p[P_K]);
	*pool = LLVMBuildLoad2(g->b, LLVMStructGetTypeAtIndex(g->xty, 2),
	                       LLVMBuildStructGEP2(g->b, g->xty, p[P_X], 2, ""), "");
	return fn;
}

/* The direct forms' column split: a pool, work enough and two units of
 * columns. */
static LLVMValueRef vec_par(gen *g, LLVMValueRef work, LLVMValueRef pool)
{
	LLVMValueRef vpar = LLVMBuildAnd(g->b, LLVMBuildIsNotNull(g->b, pool, ""),
	                                 icmp(g, LLVMIntSGE, work, i64c(g, VEC_PAR_WORK)), "");
	return LLVMBuildAnd(g->b, vpar, icmp(g, LLVMIntSGE, g->p[P_N], i64c(g, 2 * vec_unit(g))), "");
}

/* The rest of every entry: the direct tiles when packing would not pay (see
 * TILE_M) and tiles_ok, else the blocked path; over the pool from PAR_WORK
 * on; then returns. */
static void tiles_or_blocked(gen *g, const entry_fns *f, LLVMValueRef work, LLVMValueRef pool,
                             LLVMValueRef tiles_ok)
{
	LLVMValueRef *p = g->p;
	LLVMValueRef par = LLVMBuildAnd(g->b, LLVMBuildIsNotNull(g->b, pool, ""),
	                                icmp(g, LLVMIntSGE, work, i64c(g, PAR_WORK)), "");
	LLVMValueRef few = LLVMBuildOr(g->b, icmp(g, LLVMIntSLE, p[P_M], i64c(g, TILE_M)),
	                               icmp(g, LLVMIntSLE, p[P_N], i64c(g, 2 * g->g.NR)), "");
	LLVMValueRef near = LLVMBuildOr(g->b, icmp(g, LLVMIntSLE, p[P_N], i64c(g, TILE_N)),
	                                icmp(g, LLVMIntSGE, p[P_K], i64c(g, TILE_DEEP_K)), "");
	LLVMValueRef mid = LLVMBuildAnd(g->b, icmp(g, LLVMIntSLE, p[P_M], i64c(g, 2 * TILE_M)), near,
	                                "");
	few = LLVMBuildOr(g->b, few, mid, "");
	LLVMValueRef tiles = LLVMBuildAnd(g->b, tiles_ok, few, "");
	LLVMBasicBlockRef then = block(g, "tiles"), next = block(g, "packed");
	LLVMBuildCondBr(g->b, tiles, then, next);
	LLVMPositionBuilderAtEnd(g->b, then);
	/* C one vector wide (a classifier's 10 outputs): the one-vector tiles,
	 * not MR x NR tiles that compute NV times the columns */
	LLVMBasicBlockRef vec1 = block(g, "one"), multi = block(g, "multi");
	LLVMBuildCondBr(g->b, icmp(g, LLVMIntSLE, p[P_N], i64c(g, g->g.W)), vec1, multi);
	LLVMPositionBuilderAtEnd(g->b, vec1);
	split(g, par, &f->t1);
	LLVMPositionBuilderAtEnd(g->b, multi);
	/* the small-M tiles when their tiles cover fewer elements of C than
	 * MR x NR ones (MLP batch 16: 16 x 528 instead of 18 x 512), up to
	 * TILE_M rows: with many rows (a 7x7 conv, M = 512) the MR x NR tiles
	 * measured faster */
	if (f->ts.tiles) {
		LLVMValueRef s = mul(g, pad(g, p[P_M], f->ts.mr), pad(g, p[P_N], f->ts.nr));
		LLVMValueRef d = mul(g, pad(g, p[P_M], g->g.MR), pad(g, p[P_N], g->g.NR));
		LLVMBasicBlockRef small = block(g, "small"), mr = block(g, "mr");
		LLVMValueRef use = LLVMBuildAnd(g->b, icmp(g, LLVMIntSLT, s, d),
		                                icmp(g, LLVMIntSLE, p[P_M], i64c(g, TILE_M)), "");
		LLVMBuildCondBr(g->b, use, small, mr);
		LLVMPositionBuilderAtEnd(g->b, small);
		split(g, par, &f->ts);
		LLVMPositionBuilderAtEnd(g->b, mr);
	}
	/* C a panel or two wide: A streamed once, the tiles that prefetch it */
	if (f->t6p.tiles) {
		LLVMBasicBlockRef narrow = block(g, "narrow"), wide = block(g, "wide");
		LLVMBuildCondBr(g->b, icmp(g, LLVMIntSLE, p[P_N], i64c(g, PFA_MAX_N * g->g.NR)), narrow,
		                wide);
		LLVMPositionBuilderAtEnd(g->b, narrow);
		split(g, par, &f->t6p);
		LLVMPositionBuilderAtEnd(g->b, wide);
	}
	split(g, par, &f->t6);
	LLVMPositionBuilderAtEnd(g->b, next);
	tile_fns packed = {.tiles = f->blocked, .range = f->range, .rows = f->rows,
	                   .mr = g->g.MR, .nr = g->g.NR};
	split(g, par, &packed);
}

/* kiln_sgemm: picks a path.  Nothing to do without rows or columns; K == 0
 * or tiny products go scalar; a few rows (M <= THIN_M) take the axpy or dot
 * forms; B rows contiguous take the direct tiles when packing would not pay
 * (see TILE_M); anything else is packed. */
static LLVMValueRef emit_entry(gen *g, const entry_fns *f)
{
	LLVMValueRef work, pool, fn = entry_begin(g, "kiln_sgemm", &work, &pool), *p = g->p;
	LLVMValueRef zero = i64c(g, 0), one = i64c(g, 1);
	tail_if(g, icmp(g, LLVMIntSLE, p[P_K], zero), f->naive, p, P_COUNT);
	LLVMValueRef direct = LLVMBuildOr(g->b, icmp(g, LLVMIntSLE, p[P_M], i64c(g, THIN_M)),
	                                  icmp(g, LLVMIntSLE, work, i64c(g, SMALL_WORK)), "");
	LLVMValueRef vpar = vec_par(g, work, pool);
	LLVMValueRef bcontig = icmp(g, LLVMIntEQ, p[P_BCS], one);
	LLVMValueRef dotok = LLVMBuildAnd(g->b, icmp(g, LLVMIntEQ, p[P_BRS], one),
	                                  icmp(g, LLVMIntEQ, p[P_ACS], one), "");
	gemv_if(g, LLVMBuildAnd(g->b, icmp(g, LLVMIntEQ, p[P_N], one), dotok, ""), pool, work, f);
	direct_if(g, LLVMBuildAnd(g->b, direct, bcontig, ""), vpar, f->axpy, f->axpy_range, g->g.W,
	          P_N);
	direct_if(g, LLVMBuildAnd(g->b, direct, dotok, ""), vpar, f->dot, f->dot_range, g->g.W, P_N);
	tail_if(g, icmp(g, LLVMIntSLE, work, i64c(g, SMALL_WORK)), f->naive, p, P_COUNT);
	tiles_or_blocked(g, f, work, pool, bcontig);
	return fn;
}

/* kiln_sgemm_pb: kiln_sgemm with B packed at compile time (cg_prepack,
 * cg_gemm.b_panel): column panels of P = CG_SGEMM_PANEL, each
 * CG_PANEL_ROWS(K) rows of P floats, zero past N and K; b_rs and b_cs unused.  The paths are kiln_sgemm's:
 * a few rows of A take the axpy form and a few more the direct tiles, which
 * read the panels in place, each vector of a tile row from its own panel:
 * a contiguous stream per vector, where a strided B's rows are a page apart
 * or more (no hardware prefetcher follows those, and the TLB misses every
 * row).  Many rows take the blocked path, whose packb copies the panels
 * (contiguously) into the micro-kernel's wider ones: measured, its packed
 * micro-kernel reading P-wide panels in place was 8% slower (the
 * transformer block at batch 16, M = 1024). */
static LLVMValueRef emit_entry_pb(gen *g, const entry_fns *f)
{
	LLVMValueRef work, pool, fn = entry_begin(g, g->fam, &work, &pool), *p = g->p;
	LLVMValueRef zero = i64c(g, 0);
	/* K == 0 too: the axpy form's sums are then 0 and B is not read */
	LLVMValueRef thin = LLVMBuildOr(g->b, icmp(g, LLVMIntSLE, p[P_M], i64c(g, THIN_M)),
	                                icmp(g, LLVMIntSLE, p[P_K], zero), "");
	direct_if(g, thin, vec_par(g, work, pool), f->axpy, f->axpy_range, vec_unit(g), P_N);
	tiles_or_blocked(g, f, work, pool, LLVMConstInt(g->L->i1, 1, 0));
	return fn;
}

/* kiln_sgemm_pa: kiln_sgemm with A packed at compile time (cg_prepack,
 * cg_gemm.a_panel: a constant A, a conv's weights): panels of MR rows, each
 * K columns of MR floats (packa's layout over all of K), alpha folded in,
 * zero rows past M; a_rs and a_cs unused.  kiln_sgemm packs A once per
 * call (and per image of a batch): 4-10% of a mid-sized conv's GEMM
 * (gemm_bench, M = 256, K = 2304: 174 us of 1654 at N = 196).  The paths:
 * the direct tiles of MR rows (one panel each; fewer rows or K == 0 too),
 * else the blocked path without packa.  (cg_prepack packs no A of fewer
 * than 33 rows, so there is no axpy form here.) */
static LLVMValueRef emit_entry_pa(gen *g, const entry_fns *f)
{
	LLVMValueRef work, pool, fn = entry_begin(g, "kiln_sgemm_pa", &work, &pool);
	tiles_or_blocked(g, f, work, pool, icmp(g, LLVMIntEQ, g->p[P_BCS], i64c(g, 1)));
	return fn;
}

/* ---- setup ---------------------------------------------------------------- */

static LLVMValueRef intrinsic(gen *g, const char *name, LLVMTypeRef *tys, size_t n)
{
	unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
	return LLVMGetIntrinsicDeclaration(g->L->mod, id, tys, n);
}

/* Types: rt_exec as {i8**, i64*, i8*, float*, i64} (runtime/model.h) unless
 * llvm.c has its own; the argument block for the threads. */
static void setup(gen *g, cg_llvm *L)
{
	memset(g, 0, sizeof *g);
	g->L = L;
	g->b = LLVMCreateBuilderInContext(L->ctx);
	g->g = geometry(L->t);
	g->sfx = "";
	g->fam = "kiln_sgemm";
	g->fp = LLVMPointerType(L->f32, 0);
	g->vf = LLVMVectorType(L->f32, g->g.W);
	g->vfp = LLVMPointerType(g->vf, 0);
	g->vi32 = LLVMVectorType(L->i32, g->g.W);
	g->vi1 = LLVMVectorType(L->i1, g->g.W);
	LLVMTypeRef xf[] = {LLVMPointerType(L->ptr, 0), LLVMPointerType(L->i64, 0), L->ptr,
	                    g->fp, L->i64};
	g->xty = L->exec_ty ? L->exec_ty : LLVMStructTypeInContext(L->ctx, xf, 5, 0);
	g->xp = LLVMPointerType(g->xty, 0);
	LLVMTypeRef at[P_COUNT];
	gemm_params(g, at, 0);
	g->argty = LLVMStructTypeInContext(L->ctx, at, P_COUNT, 0);
	g->fma = intrinsic(g, "llvm.fma", &g->vf, 1);
	LLVMTypeRef mt[] = {g->vf, g->vfp};
	g->mload = intrinsic(g, "llvm.masked.load", mt, 2);
	g->mstore = intrinsic(g, "llvm.masked.store", mt, 2);
	g->slow_masks = g->g.W < 16;
	LLVMValueRef ons[64];
	for (int l = 0; l < g->g.W; l++)
		ons[l] = LLVMConstInt(L->i1, 1, 0);
	g->allon = LLVMConstVector(ons, g->g.W);
	LLVMTypeRef pt = L->ptr;
	g->prefetch = intrinsic(g, "llvm.prefetch", &pt, 1);
	g->zero = LLVMAddGlobal(L->mod, g->vf, "kiln_sgemm_zeros");
	LLVMSetInitializer(g->zero, LLVMConstNull(g->vf));
	LLVMSetAlignment(g->zero, 64);
	LLVMSetGlobalConstant(g->zero, 1);
	LLVMSetLinkage(g->zero, LLVMInternalLinkage);
	if (!L->par_for) {
		LLVMTypeRef rt[] = {g->xp, L->i64, L->i64};
		LLVMTypeRef rfn = LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), rt, 3, 0);
		LLVMTypeRef pt[] = {g->xp, L->i64, LLVMPointerType(rfn, 0)};
		L->par_for = cg_llvm_runtime_fn(L, "rt_parallel_for",
		    LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), pt, 3, 0));
	}
}

/* ---- transposition ---------------------------------------------------------- */

/* v[0..W) := their transpose: for each bit b of the lane index, rows r and
 * r + b (bit b of r clear) swap their off-diagonal halves of every 2b-lane
 * group, which swaps bit b of the row with bit b of the column; after every
 * bit, v[c][r] is the old v[r][c]. */
static void transpose_stages(gen *g, LLVMValueRef *v, int top)
{
	int W = g->g.W;
	for (int b = top; b >= 1; b /= 2) {
		LLVMValueRef lo[64], hi[64];
		for (int l = 0; l < W; l++) {
			bool up = (l & b) != 0;
			lo[l] = LLVMConstInt(g->L->i32, up ? W + l - b : l, 0);
			hi[l] = LLVMConstInt(g->L->i32, up ? W + l : l + b, 0);
		}
		LLVMValueRef ml = LLVMConstVector(lo, W), mh = LLVMConstVector(hi, W);
		for (int r = 0; r < W; r++) {
			if (r & b)
				continue;
			LLVMValueRef a = v[r], c = v[r + b];
			v[r] = LLVMBuildShuffleVector(g->b, a, c, ml, "");
			v[r + b] = LLVMBuildShuffleVector(g->b, a, c, mh, "");
		}
	}
}

static void transpose_regs(gen *g, LLVMValueRef *v)
{
	transpose_stages(g, v, g->g.W / 2);
}

/* A whole W x W tile at src (rows srs apart) into registers with the
 * shuffle stages of 4 lanes and more already done, by the loads: after
 * them v[r][l] is A[(r & 3) | (l & ~3)][(l & 3) | (r & ~3)], so chunk q
 * (lanes 4q..4q+3) of v[r] is the 4 columns from r & ~3 of row 4q | (r &
 * 3), one 128-bit load each.  Left for transpose_stages: the stages of 2
 * and 1 lanes, 2W shuffles instead of W log2 W.  LLVM joins the chunks
 * with inserts, those of 128 bits from memory (a load and any vector ALU),
 * those of 256 bits on the shuffle port: at 16 lanes 48 shuffle-port
 * instructions per tile instead of 64, and no masks.  MNASNet's
 * 1152-channel 5x5 depthwise conv at 7x7 alone (kiln bench, min of 4
 * alternating 0.5 s runs, one thread, Sapphire Rapids, another build on
 * the other core): 0.056-0.058 -> 0.053-0.057 ms; kiln_transpose was half
 * of its time (perf record). */
static void transpose_load_chunks(gen *g, LLVMValueRef src, LLVMValueRef srs, LLVMValueRef *v)
{
	cg_llvm *L = g->L;
	int W = g->g.W;
	LLVMTypeRef v4 = LLVMVectorType(L->f32, 4);
	LLVMValueRef idx[64];
	for (int r = 0; r < W; r++) {
		LLVMValueRef part[16] = {0};
		int n = W / 4;
		for (int q = 0; q < n; q++) {
			LLVMValueRef p = at(g, src, add(g, mul(g, i64c(g, 4 * q + (r & 3)), srs),
			                                 i64c(g, r & ~3)));
			part[q] = LLVMBuildLoad2(g->b, v4, LLVMBuildBitCast(g->b, p,
			                                                       LLVMPointerType(v4, 0), ""), "");
			LLVMSetAlignment(part[q], 4);
		}
		for (int w = 4; n > 1; w *= 2, n /= 2) { /* pairs of chunks concatenated */
			for (int l = 0; l < 2 * w; l++)
				idx[l] = LLVMConstInt(L->i32, l, 0);
			for (int q = 0; q < n / 2; q++)
				part[q] = LLVMBuildShuffleVector(g->b, part[2 * q], part[2 * q + 1],
				                                 LLVMConstVector(idx, 2 * w), "");
		}
		v[r] = part[0];
	}
}

static LLVMValueRef emit_transpose(gen *g)
{
	cg_llvm *L = g->L;
	LLVMTypeRef t[] = {g->fp, L->i64, g->fp, L->i64, L->i64, L->i64};
	LLVMValueRef fn = function(g, "kiln_transpose", t, 6);
	LLVMValueRef src = LLVMGetParam(fn, 0), srs = LLVMGetParam(fn, 1);
	LLVMValueRef dst = LLVMGetParam(fn, 2), drs = LLVMGetParam(fn, 3);
	LLVMValueRef R = LLVMGetParam(fn, 4), C = LLVMGetParam(fn, 5);
	int W = g->g.W;
	LLVMValueRef Wc = i64c(g, W), v[64];
	loop li, lj;
	LLVMValueRef i0 = loop_begin(g, &li, i64c(g, 0), R, W);
	LLVMValueRef nr = smin(g, Wc, LLVMBuildSub(g->b, R, i0, ""));
	LLVMValueRef rmask = lanes(g, nr), none = LLVMConstNull(g->vi1);
	LLVMValueRef j0 = loop_begin(g, &lj, i64c(g, 0), C, W);
	LLVMValueRef nc = smin(g, Wc, LLVMBuildSub(g->b, C, j0, ""));
	/* a thin tile (at most 4W elements: the 1-row or 1-column edge of a
	 * 49-row transpose) copied element by element: the register transpose
	 * costs W loads and W log2 W shuffles at any size (a channel-blocked
	 * depthwise conv's transposes were a third of its time) */
	LLVMValueRef thin = icmp(g, LLVMIntSLE, mul(g, nr, nc), i64c(g, 4 * W));
	LLVMBasicBlockRef join = if_begin(g, thin);
	loop lr, lc;
	LLVMValueRef r = loop_begin(g, &lr, i64c(g, 0), nr, 1);
	LLVMValueRef c = loop_begin(g, &lc, i64c(g, 0), nc, 1);
	LLVMValueRef e = LLVMBuildLoad2(g->b, L->f32, at(g, src, add(g, mul(g, add(g, i0, r), srs),
	                                                         add(g, j0, c))), "");
	LLVMBuildStore(g->b, e, at(g, dst, add(g, mul(g, add(g, j0, c), drs), add(g, i0, r))));
	loop_end(g, &lc);
	loop_end(g, &lr);
	if_end(g, join);
	/* a whole tile, with 8 lanes or more: its loads do the wide stages
	 * (transpose_load_chunks) and its stores need no masks */
	LLVMValueRef whole = LLVMBuildAnd(g->b, icmp(g, LLVMIntEQ, nr, Wc), icmp(g, LLVMIntEQ, nc, Wc),
	                                  "");
	if (W >= 8) {
		join = if_begin(g, whole);
		transpose_load_chunks(g, at(g, src, add(g, mul(g, i0, srs), j0)), srs, v);
		transpose_stages(g, v, 2);
		for (int c = 0; c < W; c++)
			vstore(g, v[c], at(g, dst, add(g, mul(g, add(g, j0, i64c(g, c)), drs), i0)));
		if_end(g, join);
	}
	join = if_begin(g, LLVMBuildAnd(g->b, LLVMBuildNot(g->b, thin, ""),
	                                W >= 8 ? LLVMBuildNot(g->b, whole, "") : LLVMConstInt(L->i1, 1, 0),
	                                ""));
	LLVMValueRef cmask = lanes(g, nc);
	/* rows past the edge reload the last one: their lanes land in output
	 * lanes >= nr, which the stores mask off */
	LLVMValueRef last = LLVMBuildSub(g->b, nr, i64c(g, 1), "");
	for (int r = 0; r < W; r++) {
		LLVMValueRef row = add(g, i0, smin(g, i64c(g, r), last));
		v[r] = mload(g, at(g, src, add(g, mul(g, row, srs), j0)), cmask);
	}
	transpose_regs(g, v);
	for (int c = 0; c < W; c++) {
		LLVMValueRef on = icmp(g, LLVMIntSLT, i64c(g, c), nc);
		LLVMValueRef mask = LLVMBuildSelect(g->b, on, rmask, none, "");
		LLVMValueRef col = add(g, j0, smin(g, i64c(g, c), LLVMBuildSub(g->b, nc, i64c(g, 1), "")));
		mstore(g, v[c], at(g, dst, add(g, mul(g, col, drs), i0)), mask);
	}
	if_end(g, join);
	loop_end(g, &lj);
	loop_end(g, &li);
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* void name(t[0..n)), declared hidden: another part of the library
 * defines it (L->helpers_extern).  setup()'s constant is not needed here. */
static LLVMValueRef declare_helper(gen *g, const char *name, LLVMTypeRef *t, unsigned n)
{
	cg_llvm *L = g->L;
	LLVMDeleteGlobal(g->zero);
	LLVMValueRef d = LLVMAddFunction(L->mod, name,
	                                 LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), t, n, 0));
	LLVMSetVisibility(d, LLVMHiddenVisibility);
	LLVMAddAttributeAtIndex(d, LLVMAttributeFunctionIndex,
	    LLVMCreateEnumAttribute(L->ctx, LLVMGetEnumAttributeKindForName("nounwind", 8), 0));
	return d;
}

LLVMValueRef cg_llvm_transpose(cg_llvm *L)
{
	if (L->transpose)
		return L->transpose;
	gen g;
	setup(&g, L);
	if (L->helpers_extern) {
		LLVMTypeRef t[] = {g.fp, L->i64, g.fp, L->i64, L->i64, L->i64};
		L->transpose = declare_helper(&g, "kiln_transpose", t, 6);
	} else {
		L->transpose = emit_transpose(&g);
	}
	LLVMDisposeBuilder(g.b);
	return L->transpose;
}

void cg_llvm_export_helpers(cg_llvm *L)
{
	LLVMValueRef f[6] = {L->sgemm, L->transpose, L->sgemm_pb, L->sgemm_pa, L->sgemm_pbw,
	                     L->sgemm_pm};
	for (int i = 0; i < 6; i++)
		if (f[i] && !LLVMIsDeclaration(f[i])) {
			LLVMSetLinkage(f[i], LLVMExternalLinkage);
			LLVMSetVisibility(f[i], LLVMHiddenVisibility);
		}
}

/* The direct tiles for mr x nv vectors: micro-kernel (prefetching B pf
 * rows ahead, 0: not), with narrow_last a second one of nv - 1 vectors for
 * a last panel that fits it, else with rest a one-vector one for a last
 * panel of at most nv - 1 vectors (emit_tiles), tiles, column and row
 * splits, named with sfx. */
static tile_fns emit_tile_set(gen *g, int mr, int nv, const char *sfx, int pf, int pfa,
                              bool narrow_last, int tail, bool rest)
{
	geom saved = g->g;
	char name[48];
	g->g.MR = mr;
	g->g.NV = nv;
	g->g.NR = nv * g->g.W;
	g->sfx = sfx;
	g->pf = pf;
	g->pfa = pfa;
	tile_fns t = {.mr = mr, .nr = g->g.NR};
	LLVMValueRef narrow = narrow_last ? emit_ukr(g, true, nv - 1, 0) : NULL;
	LLVMValueRef one = rest && !narrow_last && nv > 1 ? emit_ukr(g, true, 1, 0) : NULL;
	t.tiles = emit_tiles(g, emit_ukr(g, true, nv, tail), narrow, nv - 1, one);
	snprintf(name, sizeof name, "%s_tiles%s_range", g->fam, sfx);
	t.range = emit_range(g, t.tiles, name, false);
	snprintf(name, sizeof name, "%s_tiles%s_rows", g->fam, sfx);
	t.rows = emit_range(g, t.tiles, name, true);
	g->g = saved;
	g->sfx = "";
	g->pf = 0;
	g->pfa = 0;
	return t;
}

/* The target's MR x NV direct tiles, twice: without the A prefetch (t6)
 * and with it (t6p, for C at most PFA_MAX_N tiles wide). */
static void mr_tile_sets(gen *g, entry_fns *f)
{
	f->t6 = emit_tile_set(g, g->g.MR, g->g.NV, "", SMALL_PF, 0, false, TAIL_COLS, true);
	f->t6p = emit_tile_set(g, g->g.MR, g->g.NV, "_p", SMALL_PF, TILE_PFA, false, TAIL_COLS, true);
}

/* The small-M tiles' shape for g's target: 8 x 3 vectors with 32
 * registers, 4 x NV with fewer (see cg_llvm_sgemm); 0 rows: none. */
static int small_tiles(const gen *g, int *nv)
{
	int smr = g->g.W >= 16 ? 8 : 4, snv = g->g.W >= 16 ? 3 : g->g.NV;
	*nv = snv;
	return smr != g->g.MR || snv != g->g.NV ? smr : 0;
}

LLVMValueRef cg_llvm_sgemm(cg_llvm *L)
{
	if (L->sgemm)
		return L->sgemm;
	gen g;
	setup(&g, L);
	if (L->helpers_extern) {
		LLVMTypeRef t[P_COUNT];
		unsigned n = gemm_params(&g, t, 0);
		L->sgemm = declare_helper(&g, "kiln_sgemm", t, n);
		LLVMDisposeBuilder(g.b);
		return L->sgemm;
	}
	packed_fns pf = {.packa = emit_packa(&g), .packb = emit_packb(&g)};
	packed_ukrs(&g, &pf);
	entry_fns ef = {.naive = emit_naive(&g), .axpy = emit_axpy(&g), .dot = emit_dot(&g)};
	ef.axpy_range = emit_vec_range(&g, ef.axpy, "kiln_sgemm_axpy_range");
	ef.dot_range = emit_vec_range(&g, ef.dot, "kiln_sgemm_dot_range");
	ef.dot_rows = emit_range(&g, emit_dot_cols(&g, ef.dot), "kiln_sgemm_dot_rows", true);
	ef.blocked = emit_blocked(&g, &pf);
	ef.range = emit_range(&g, ef.blocked, "kiln_sgemm_range", false);
	ef.rows = emit_range(&g, ef.blocked, "kiln_sgemm_rows", true);
	mr_tile_sets(&g, &ef);
	/* small M: 8 x 3 vectors with 32 registers (24 accumulators; B is read
	 * by half as many row tiles as with 4 x 4), 4 x NV with fewer.  A last
	 * panel of two vectors or less (512 = 10 x 48 + 32) takes an 8 x 2
	 * kernel: the MLP at batch 16 ~0.099 -> ~0.097 ms.  (The MR x NR tiles
	 * keep one kernel: see emit_ukr.) */
	int snv, smr = small_tiles(&g, &snv);
	if (smr)
		ef.ts = emit_tile_set(&g, smr, snv, "_s", SMALL_PF, 0, snv > 2, 0, false);
	ef.t1 = emit_tile_set(&g, TILE1_MR, 1, "_1", 0, TILE_PFA, false, 0, false);
	L->sgemm = emit_entry(&g, &ef);
	LLVMDisposeBuilder(g.b);
	return L->sgemm;
}

int cg_sgemm_a_panel(const cg_target *t)
{
	return geometry(t).MR;
}

/* The start of a packed-operand family named fam (kiln_sgemm_pa, _pb):
 * true when another part of the library defines it (L->helpers_extern),
 * *decl then its declaration and g done with. */
static bool family_begin(gen *g, cg_llvm *L, const char *fam, LLVMValueRef *decl)
{
	setup(g, L);
	g->fam = fam;
	if (!L->helpers_extern)
		return false;
	LLVMTypeRef t[P_COUNT];
	unsigned n = gemm_params(g, t, 0);
	*decl = declare_helper(g, fam, t, n);
	LLVMDisposeBuilder(g->b);
	return true;
}

LLVMValueRef cg_llvm_sgemm_pa(cg_llvm *L)
{
	gen g;
	if (L->sgemm_pa || family_begin(&g, L, "kiln_sgemm_pa", &L->sgemm_pa))
		return L->sgemm_pa;
	g.pa = true;
	packed_fns pf = {.packb = emit_packb(&g)};
	packed_ukrs(&g, &pf);
	entry_fns ef = {0};
	ef.blocked = emit_blocked(&g, &pf);
	ef.range = emit_range(&g, ef.blocked, "kiln_sgemm_pa_range", false);
	ef.rows = emit_range(&g, ef.blocked, "kiln_sgemm_pa_rows", true);
	/* tiles of MR rows only: each reads one panel of A */
	mr_tile_sets(&g, &ef);
	ef.t1 = emit_tile_set(&g, g.g.MR, 1, "_1", 0, TILE_PFA, false, 0, false);
	L->sgemm_pa = emit_entry_pa(&g, &ef);
	LLVMDisposeBuilder(g.b);
	return L->sgemm_pa;
}

int cg_sgemm_panel(const cg_target *t)
{
	geom g = geometry(t);
	return CG_SGEMM_PANEL % g.W == 0 ? CG_SGEMM_PANEL : 0;
}

/* kiln_sgemm_pb (P = CG_SGEMM_PANEL) or kiln_sgemm_pbw (wide: P = NR) */
static LLVMValueRef sgemm_pb_family(cg_llvm *L, bool wide, LLVMValueRef *fn)
{
	gen g;
	if (*fn || family_begin(&g, L, wide ? "kiln_sgemm_pbw" : "kiln_sgemm_pb", fn))
		return *fn;
	g.pb = true;
	g.pbw = wide;
	g.P = wide ? g.g.NR : CG_SGEMM_PANEL;
	char n1[48], n2[48], n3[48];
	snprintf(n1, sizeof n1, "%s_axpy_range", g.fam);
	snprintf(n2, sizeof n2, "%s_range", g.fam);
	snprintf(n3, sizeof n3, "%s_rows", g.fam);
	packed_fns pf = {.packa = emit_packa(&g), .packb = wide ? NULL : emit_packb(&g)};
	packed_ukrs(&g, &pf);
	entry_fns ef = {.axpy = emit_axpy(&g)};
	ef.axpy_range = emit_vec_range(&g, ef.axpy, n1);
	ef.blocked = emit_blocked(&g, &pf);
	ef.range = emit_range(&g, ef.blocked, n2, false);
	ef.rows = emit_range(&g, ef.blocked, n3, true);
	mr_tile_sets(&g, &ef);
	int snv, smr = small_tiles(&g, &snv);
	if (smr)
		ef.ts = emit_tile_set(&g, smr, snv, "_s", SMALL_PF, 0, snv > 2, 0, false);
	ef.t1 = emit_tile_set(&g, TILE1_MR, 1, "_1", 0, TILE_PFA, false, 0, false);
	*fn = emit_entry_pb(&g, &ef);
	LLVMDisposeBuilder(g.b);
	return *fn;
}

LLVMValueRef cg_llvm_sgemm_pb(cg_llvm *L)
{
	return sgemm_pb_family(L, false, &L->sgemm_pb);
}

LLVMValueRef cg_llvm_sgemm_pbw(cg_llvm *L)
{
	return sgemm_pb_family(L, true, &L->sgemm_pbw);
}

int cg_sgemm_wide_panel(const cg_target *t)
{
	geom g = geometry(t);
	int P = cg_sgemm_panel(t);
	return P && g.NR > P && g.NR % P == 0 && !(g.NR & (g.NR - 1)) ? g.NR : 0;
}


/* ---- output channels in the lanes: kiln_sgemm_pm ---------------------------- */

/* kiln_sgemm_pm: kiln_sgemm with a constant A packed at compile time in
 * panels of PM_NV vectors of rows (cg_gemm.a_panel = PM_NV * W, the
 * layout of kiln_sgemm_pa's panels, taller) and B's rows contiguous.
 * Its micro-kernel turns the tile around: the lanes run along A's rows (a
 * conv's output channels), the tile is PM_NV vectors of rows by PM_COLS
 * columns of C, and per k it loads PM_NV vectors of A's panel and
 * broadcasts PM_COLS values of B's row.  A conv on a small map (a 7x7
 * one: C 49 columns wide, three vectors and a column) then wastes no
 * lanes, B's row is read as PM_COLS scalars instead of vectors that
 * straddle cache lines, and per k it streams 2 vectors of weights instead
 * of 4 vectors of B: the BLIS shape for AVX-512 (32 x 12).  The tile's
 * sums are transposed in registers (transpose_regs) into rows of C, whose
 * epilogue is the other micro-kernels' (ukr_epilogue).  K goes in blocks
 * of PM_KC (the panel's block of A and a strip of B stay in L1/L2 across
 * the strips), C accumulated across them as the blocked path does.
 * Measured on Sapphire Rapids against kiln_sgemm_pa (a harness calling
 * both on one shape, best of runs, one thread, GFLOP/s): the 1x1 convs at
 * 7x7 (960x49x160, 320x49x960, 1152x49x192) 131-133 -> 148-157; the 3x3
 * one at 7x7 (512x49x4608) 131 -> 141; 256x196x2304 144 -> 158;
 * 256x196x1024 147 -> 164.  Where it
 * loses it is not taken (cg_sgemm_m_panel's limits): C wider than
 * PM_MAX_N (256 x N x 1152: N = 289 151 -> 155, 361 155 -> 155, 441
 * 155 -> 142, 784 152 -> 120: B's rows pages apart, broadcast one by
 * one), K below PM_MIN_K (the transposes and the 32 rows' stores per
 * tile: 576x196x96 153 -> 149, 384x196x64 171 -> 127; 672x196x112
 * 153 -> 160).  In a model the weights come from memory: without the
 * prefetch of A PM_PFA rows ahead ResNet-50's 7x7 convs were 7-14%
 * slower than kiln_sgemm_pa's tiles (which prefetch theirs); with it,
 * per graph node (bench/ab.py --nodes, min of 5 alternating rounds, batch
 * 1, one thread) the 1x1 convs at 14x14 6-11% faster, those at 7x7 up to
 * 11%, the 3x3 convs at 7x7 unchanged; the node sums ResNet-50 59.9 ->
 * 58.9 ms, MNASNet 5.94 -> 5.79, MobileNetV3-Small 1.53 -> 1.48,
 * DenseNet-121 45.9 -> 45.4, EfficientNet-B0 10.56 -> 10.52. */
/* kiln_sgemm_pm's micro-kernels take U_BPS (unused there) as the flag of
 * C in blocks of W rows */
#define U_CBLK U_BPS
/* C or B in channel blocks: read or written in place at any width up to
 * PM_BLOCKED_LIMIT (cg_sgemm_c_block); past PM_BLOCKED_MAX_N columns (a
 * 32x32 map) in blocks of PM_NC columns, each swept by every panel of A
 * while it is in cache, B packed when it is not in blocks.  So a 1x1
 * conv at 56x56 writes blocks for a depthwise conv reading them in place
 * (bench/ab.py --nodes, batch 1, one thread, 5 rounds): EfficientNet-B0's
 * 24 -> 144 expand conv 0.164 -> 0.158 ms and its 5x5 stride-2 depthwise
 * conv 0.158 -> 0.101, MobileNetV2's 3x3 one 0.141 -> 0.066 (ORT 0.068).
 * Up to PM_BLOCKED_MAX_N, B's rows (or blocks) in place whole. */
enum { PM_NV = 2, PM_COLS = 12, PM_KC = 512, PM_NC = 192, PM_PFA = 16, PM_MAX_N = 320,
       PM_MIN_K = 112, PM_SPLIT_STRIPS = 8, PM_BLOCKED_MAX_N = 1024,
       PM_BLOCKED_LIMIT = 1 << 20 };
/* a range's packed block of B lives in x->scratch, sized for the blocked
 * path's KC x NC panel of B and more (cg_sgemm_scratch_floats) */
_Static_assert(PM_KC * PM_NC <= 512 * 1024, "kiln_sgemm_pm's packed B outgrows the GEMM scratch");

/* The pm tile's stores with C in blocks of W rows (U_CBLK): the sums of
 * column j's vector v are the W floats at C + v*W*c_rs + j*W as they are,
 * no transpose; rows past mr (a last panel of one block) not stored.  No
 * residual (cg_gemm.c_block has none). */
static void pm_blocked_stores(gen *g, LLVMValueRef *acc, int cols, int nv, LLVMValueRef sc,
                              bool plain)
{
	LLVMValueRef *p = g->p;
	int W = g->g.W;
	LLVMValueRef bnz = LLVMBuildFCmp(g->b, LLVMRealUNE, p[U_BETA], f32c(g, 0), "");
	LLVMValueRef colb_on = icmp(g, LLVMIntEQ, p[U_BMODE], LLVMConstInt(g->L->i32, 1, 0));
	LLVMValueRef rowb_on = icmp(g, LLVMIntEQ, p[U_BMODE], LLVMConstInt(g->L->i32, 2, 0));
	LLVMValueRef beta = splat(g, g->vf, p[U_BETA]);
	for (int v = 0; v < nv; v++) {
		LLVMBasicBlockRef join = if_begin(g, icmp(g, LLVMIntSLT, i64c(g, v * W), p[U_MR]));
		LLVMValueRef rowb = vload(g, or_zeros(g, rowb_on, at(g, p[U_BIAS], i64c(g, v * W))));
		LLVMValueRef cv = at(g, p[U_C], mul(g, i64c(g, v * W), p[U_CRS]));
		for (int j = 0; j < cols; j++) {
			LLVMValueRef cp = at(g, cv, i64c(g, j * W));
			LLVMValueRef x = fma3(g, LLVMBuildLoad2(g->b, g->vf, acc[j * nv + v], ""), sc, rowb);
			if (!plain) {
				x = fma3(g, beta, vload(g, or_zeros(g, bnz, cp)), x);
				x = LLVMBuildFAdd(g->b, x, splat(g, g->vf, load_if(g, colb_on,
				                                                  at(g, p[U_BIAS], i64c(g, j)))),
				                  "");
			}
			vstore(g, clamp(g, x, p[U_LO], p[U_HI]), cp);
		}
		if_end(g, join);
	}
}

/* kiln_sgemm_pm_ukrC: the tile of mr x cols at C (cols <= PM_COLS, a
 * compile-time count) over kc; U_ parameters, A's panel at U_AP with rows
 * PM_NV * W floats apart, B row-contiguous (U_BRS). */
static LLVMValueRef emit_pm_ukr(gen *g, int cols, bool bblk, int NV)
{
	LLVMTypeRef t[U_DCOUNT];
	ukr_types(g, t);
	char name[48];
	snprintf(name, sizeof name, "%s_%sukr%d%s", g->fam, bblk ? "b" : "", cols,
	         NV < PM_NV ? "h" : "");
	LLVMValueRef fn = function(g, name, t, U_DCOUNT), *p = g->p;
	int W = g->g.W, cs = bblk ? W : 1;
	LLVMValueRef acc[PM_COLS * PM_NV], rows[PM_NV * 64], a[PM_NV];
	for (int i = 0; i < cols * NV; i++)
		acc[i] = local(g, g->vf, LLVMConstNull(g->vf));
	loop lk;
	LLVMValueRef k = loop_begin(g, &lk, i64c(g, 0), p[U_KC], 1);
	LLVMValueRef ak = at(g, p[U_AP], mul(g, k, i64c(g, PM_NV * W))); /* the panel's row k */
	/* B's row k: rows U_BRS apart, or in blocks of W rows (bblk: row k
	 * of the block k / W, each of its columns W floats; W a power of 2,
	 * k >= 0: a shift and a mask in the k loop) */
	LLVMValueRef bk = bblk ? at(g, p[U_BP], add(g, mul(g, LLVMBuildLShr(g->b, k, i64c(g, __builtin_ctz(W)), ""),
	                                                   mul(g, p[U_BRS], i64c(g, W))),
	                                            LLVMBuildAnd(g->b, k, i64c(g, W - 1), "")))
	                       : at(g, p[U_BP], mul(g, k, p[U_BRS]));
	for (int v = 0; v < NV; v++)
		a[v] = vload(g, at(g, ak, i64c(g, v * W)));
	for (int v = 0; v < NV; v++) /* A's lines PM_PFA rows ahead */
		prefetch(g, at(g, ak, i64c(g, (int64_t)PM_PFA * PM_NV * W + v * W)));
	for (int j = 0; j < cols; j++) {
		LLVMValueRef bj = splat(g, g->vf, LLVMBuildLoad2(g->b, g->L->f32, at(g, bk, i64c(g, j * cs)),
		                                                 ""));
		for (int v = 0; v < NV; v++) {
			LLVMValueRef s = acc[j * NV + v];
			LLVMBuildStore(g->b, fma3(g, a[v], bj, LLVMBuildLoad2(g->b, g->vf, s, "")), s);
		}
	}
	loop_end_unroll(g, &lk, UKR_UNROLL);
	LLVMValueRef sc = splat(g, g->vf, p[U_ALPHA]);
	LLVMBasicBlockRef rowm = block(g, "rowmajor");
	LLVMBasicBlockRef blk = block(g, "cblocked");
	LLVMBuildCondBr(g->b, LLVMBuildIsNotNull(g->b, p[U_CBLK], ""), blk, rowm);
	LLVMPositionBuilderAtEnd(g->b, blk);
	/* as ukr_epilogue: the plain stores (beta == 0, no bias per column: a
	 * conv's) apart, C and the column bias not read (EfficientNet-B0's
	 * expand convs writing blocks at 28x28, K = 40: 0.105 -> 0.096 ms) */
	LLVMBasicBlockRef plain = block(g, "plain"), full = block(g, "full");
	LLVMValueRef b0 = LLVMBuildFCmp(g->b, LLVMRealOEQ, p[U_BETA], f32c(g, 0), "");
	LLVMValueRef nocol = icmp(g, LLVMIntNE, p[U_BMODE], LLVMConstInt(g->L->i32, 1, 0));
	LLVMBuildCondBr(g->b, LLVMBuildAnd(g->b, b0, nocol, ""), plain, full);
	LLVMPositionBuilderAtEnd(g->b, plain);
	pm_blocked_stores(g, acc, cols, NV, sc, true);
	LLVMBuildRetVoid(g->b);
	LLVMPositionBuilderAtEnd(g->b, full);
	pm_blocked_stores(g, acc, cols, NV, sc, false);
	LLVMBuildRetVoid(g->b);
	LLVMPositionBuilderAtEnd(g->b, rowm);
	/* rows of C: vector v's lane l is row v*W + l; column j of it in
	 * the sums of column j */
	for (int v = 0; v < NV; v++) {
		LLVMValueRef tv[64];
		for (int j = 0; j < W; j++)
			tv[j] = j < cols ? LLVMBuildFMul(g->b, LLVMBuildLoad2(g->b, g->vf, acc[j * NV + v], ""),
			                                 sc, "")
			                 : LLVMConstNull(g->vf);
		transpose_regs(g, tv);
		for (int l = 0; l < W; l++)
			rows[v * W + l] = local(g, g->vf, tv[l]);
	}
	int saved = g->g.MR;
	g->g.MR = NV * W;
	g->nv = 1;
	ukr_epilogue(g, rows);
	g->g.MR = saved;
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* kiln_sgemm_pm_packb(dst, src, b_rs, kc, nc): the kc x nc block of B at
 * src as strips of PM_COLS columns, strip s at dst + s*kc*PM_COLS, row k
 * of it PM_COLS floats (zeros past nc). */
static LLVMValueRef emit_pm_packb(gen *g)
{
	cg_llvm *L = g->L;
	LLVMTypeRef t[] = {g->fp, g->fp, L->i64, L->i64, L->i64};
	char name[48];
	snprintf(name, sizeof name, "%s_packb", g->fam);
	LLVMValueRef fn = function(g, name, t, 5);
	LLVMValueRef dst = LLVMGetParam(fn, 0), src = LLVMGetParam(fn, 1), brs = LLVMGetParam(fn, 2);
	LLVMValueRef kc = LLVMGetParam(fn, 3), nc = LLVMGetParam(fn, 4);
	LLVMValueRef keep = lanes(g, i64c(g, PM_COLS));
	loop ls, lk;
	LLVMValueRef j = loop_begin(g, &ls, i64c(g, 0), nc, PM_COLS);
	LLVMValueRef left = LLVMBuildSub(g->b, nc, j, "");
	LLVMValueRef m = lanes(g, smin(g, i64c(g, PM_COLS), left));
	LLVMValueRef d = at(g, dst, mul(g, j, kc)); /* strip j / PM_COLS */
	LLVMValueRef k = loop_begin(g, &lk, i64c(g, 0), kc, 1);
	LLVMValueRef v = mload(g, at(g, src, add(g, mul(g, k, brs), j)), m);
	mstore(g, v, at(g, d, mul(g, k, i64c(g, PM_COLS))), keep);
	loop_end(g, &lk);
	loop_end(g, &ls);
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* kiln_sgemm_pm_blocked(args..., n0, n1): columns [n0, n1) of C, K in
 * blocks of PM_KC, each panel of A's rows over the strips of PM_COLS
 * columns, the last strip's columns by kernels of 8, 4, 2 and 1.  B is
 * read in place, one row's PM_COLS values per k, when the call has all
 * of C's columns or B is in blocks.  A range of them (a thread's share of a column split)
 * packs its columns of B first, in blocks of PM_NC columns, each
 * kc x PM_NC block in strips (packb, into x->scratch), then the panels
 * of A run over the strips: the previous layer wrote B from both cores,
 * and its rows read in place, 12 values each per k, took half their
 * lines from the other core's cache a line at a time.  MobileNetV2 batch
 * 1, two threads, its 1x1 convs 384 -> 64 and 576 -> 96 at 14x14 (kernel
 * time, kiln bench --profile): by rows in place 0.070 and 0.145 ms, the
 * same as one thread; by columns in place 0.058-0.063 and 0.113; by
 * columns packed 0.050 and 0.104 (kiln_sgemm_pa's tiles: 0.056, 0.120).
 * One thread packing all of B lost: 0.063 -> 0.077 ms.  B in channel
 * blocks is read in place by a range too: a column's W rows are one
 * line, which its next W values of k reuse, while the packing gathered
 * them one scalar at a time (MobileNetV2's project convs at two threads,
 * bench/ab.py --nodes, 7 rounds: 576 -> 96 at 14x14 0.113 -> 0.087 ms,
 * 384 -> 64 0.057 -> 0.039; the model 3.14 -> 3.01). */
static LLVMValueRef emit_pm_blocked(gen *g, LLVMValueRef (*ukr)[PM_COLS + 1],
                                    LLVMValueRef packb)
{
	LLVMTypeRef t[P_COUNT + 2];
	char name[48];
	snprintf(name, sizeof name, "%s_blocked", g->fam);
	LLVMValueRef fn = function(g, name, t, gemm_params(g, t, 2)), *p = g->p;
	int W = g->g.W, R = PM_NV * W;
	/* the bias axis, and C in blocks of W rows (CG_SGEMM_C_BLOCKED) */
	LLVMValueRef cblk = icmp(g, LLVMIntNE, LLVMBuildAnd(g->b, p[P_AXIS],
	                                                    LLVMConstInt(g->L->i32, CG_SGEMM_C_BLOCKED, 0), ""),
	                         LLVMConstInt(g->L->i32, 0, 0));
	LLVMValueRef axis = LLVMBuildAnd(g->b, p[P_AXIS], LLVMConstInt(g->L->i32, 3, 0), "");
	LLVMValueRef row = icmp(g, LLVMIntEQ, axis, LLVMConstInt(g->L->i32, 2, 0));
	/* a column's step in C: 1, or W floats in a block; in B likewise
	 * (CG_SGEMM_B_BLOCKED) */
	LLVMValueRef cstep = LLVMBuildSelect(g->b, cblk, i64c(g, W), i64c(g, 1), "");
	LLVMValueRef bblk = icmp(g, LLVMIntNE, LLVMBuildAnd(g->b, p[P_AXIS],
	                                                    LLVMConstInt(g->L->i32, CG_SGEMM_B_BLOCKED, 0), ""),
	                         LLVMConstInt(g->L->i32, 0, 0));
	LLVMValueRef bstep = LLVMBuildSelect(g->b, bblk, i64c(g, W), i64c(g, 1), "");
	LLVMValueRef n0 = p[P_COUNT], n1 = p[P_COUNT + 1];
	LLVMValueRef sp = LLVMBuildStructGEP2(g->b, g->xty, p[P_X], 3, "");
	LLVMValueRef Bp = LLVMBuildLoad2(g->b, g->fp, sp, "scratch");
	LLVMValueRef all = LLVMBuildSub(g->b, n1, n0, "");
	/* C wider than PM_BLOCKED_MAX_N: in blocks of PM_NC columns, each
	 * block's B packed (or in blocks, in place) and then swept by every
	 * panel of A, as a range's */
	LLVMValueRef big = icmp(g, LLVMIntSGT, p[P_N], i64c(g, PM_BLOCKED_MAX_N));
	LLVMValueRef pk = LLVMBuildAnd(g->b, LLVMBuildOr(g->b, icmp(g, LLVMIntSLT, all, p[P_N]), big, ""),
	                               LLVMBuildNot(g->b, bblk, ""), "");
	LLVMValueRef nblk = LLVMBuildSelect(g->b, LLVMBuildOr(g->b, pk, big, ""),
	                                    LLVMBuildSDiv(g->b, add(g, all, i64c(g, PM_NC - 1)),
	                                                  i64c(g, PM_NC), ""),
	                                    i64c(g, 1), "");
	loop lb, lp, li, lj;
	LLVMValueRef jb = loop_begin(g, &lb, i64c(g, 0), nblk, 1);
	LLVMValueRef bn0 = add(g, n0, mul(g, jb, i64c(g, PM_NC)));
	LLVMValueRef bn1 = LLVMBuildSelect(g->b, LLVMBuildOr(g->b, pk, big, ""),
	                                   smin(g, add(g, bn0, i64c(g, PM_NC)), n1), n1, "");
	LLVMValueRef cols = LLVMBuildSub(g->b, bn1, bn0, "");
	LLVMValueRef full = LLVMBuildSDiv(g->b, cols, i64c(g, PM_COLS), "");
	LLVMValueRef rem = LLVMBuildSRem(g->b, cols, i64c(g, PM_COLS), "");
	LLVMValueRef pc = loop_begin(g, &lp, i64c(g, 0), p[P_K], PM_KC);
	LLVMValueRef kc = smin(g, i64c(g, PM_KC), LLVMBuildSub(g->b, p[P_K], pc, ""));
	LLVMValueRef first = icmp(g, LLVMIntEQ, pc, i64c(g, 0));
	LLVMValueRef last = icmp(g, LLVMIntEQ, add(g, pc, kc), p[P_K]);
	LLVMValueRef beta = LLVMBuildSelect(g->b, first, p[P_BETA], f32c(g, 1), "");
	LLVMValueRef lo = LLVMBuildSelect(g->b, last, p[P_LO], f32c(g, -INFINITY), "");
	LLVMValueRef hi = LLVMBuildSelect(g->b, last, p[P_HI], f32c(g, INFINITY), "");
	LLVMValueRef bmode = LLVMBuildSelect(g->b, last, axis, LLVMConstInt(g->L->i32, 0, 0), "");
	LLVMValueRef brow = at(g, p[P_B], mul(g, pc, p[P_BRS]));
	LLVMBasicBlockRef join = if_begin(g, pk);
	LLVMValueRef pa[] = {Bp, at(g, brow, bn0), p[P_BRS], kc, cols};
	call(g, packb, pa, 5);
	if_end(g, join);
	/* B read in place in blocks: the micro-kernels for them */
	LLVMValueRef inb = bblk;
	LLVMValueRef ic = loop_begin(g, &li, i64c(g, 0), p[P_M], R);
	LLVMValueRef mr = smin(g, i64c(g, R), LLVMBuildSub(g->b, p[P_M], ic, ""));
	LLVMValueRef a[U_DCOUNT] = {
		[U_AP] = at(g, p[P_A], add(g, mul(g, ic, p[P_K]), mul(g, pc, i64c(g, R)))),
		[U_KC] = kc, [U_CRS] = p[P_CRS], [U_MR] = mr, [U_BETA] = beta, [U_BMODE] = bmode,
		[U_LO] = lo, [U_HI] = hi, [U_RRS] = p[P_RRS], [U_ARS] = i64c(g, 1), [U_ACS] = i64c(g, R),
		[U_BRS] = LLVMBuildSelect(g->b, pk, i64c(g, PM_COLS), p[P_BRS], ""),
		[U_ALPHA] = p[P_ALPHA], [U_CBLK] = LLVMBuildZExt(g->b, cblk, g->L->i64, ""),
	};
	/* the tile at column n (of this block), nr columns wide: B in place,
	 * or strip (n - bn0) / PM_COLS of the packed block */
#define PM_TILE(n, nr)                                                                            \
	do {                                                                                      \
		LLVMValueRef o_ = LLVMBuildSub(g->b, (n), bn0, "");                                \
		LLVMValueRef s_ = LLVMBuildSDiv(g->b, o_, i64c(g, PM_COLS), "");                   \
		LLVMValueRef c_ = LLVMBuildSRem(g->b, o_, i64c(g, PM_COLS), "");                   \
		a[U_BP] = LLVMBuildSelect(g->b, pk,                                               \
		                          at(g, Bp, add(g, mul(g, s_, mul(g, kc, i64c(g, PM_COLS))), c_)), \
		                          at(g, brow, mul(g, (n), bstep)), "");                   \
		a[U_C] = at(g, p[P_C], add(g, mul(g, ic, p[P_CRS]), mul(g, (n), cstep)));         \
		a[U_NR] = i64c(g, (nr));                                                          \
		a[U_BIAS] = at(g, p[P_BIAS], LLVMBuildSelect(g->b, row, ic, (n), ""));             \
		a[U_RES] = LLVMBuildSelect(g->b, last,                                            \
		                           nat(g, p[P_RES], add(g, mul(g, ic, p[P_RRS]), (n))),   \
		                           LLVMConstNull(g->fp), "");                             \
	} while (0)
	/* the micro-kernel: B in place in blocks or not (ukr[0..1]), a panel
	 * of one vector of rows or two (ukr[2..3]: the last of M = 80) */
	LLVMValueRef half = icmp(g, LLVMIntSLE, mr, i64c(g, W));
#define PM_CALL(w)                                                                                \
	do {                                                                                      \
		LLVMValueRef f_ = LLVMBuildSelect(                                                 \
		    g->b, half, LLVMBuildSelect(g->b, inb, ukr[3][w], ukr[2][w], ""),             \
		    LLVMBuildSelect(g->b, inb, ukr[1][w], ukr[0][w], ""), "");                    \
		LLVMBuildCall2(g->b, LLVMGlobalGetValueType(ukr[0][w]), f_, a, U_DCOUNT, "");      \
	} while (0)
	LLVMValueRef jt = loop_begin(g, &lj, i64c(g, 0), full, 1);
	PM_TILE(add(g, bn0, mul(g, jt, i64c(g, PM_COLS))), PM_COLS);
	PM_CALL(PM_COLS);
	loop_end(g, &lj);
	LLVMValueRef n = add(g, bn0, mul(g, full, i64c(g, PM_COLS)));
	for (int w = 8; w >= 1; w /= 2) { /* rem < PM_COLS <= 15: its bits */
		LLVMValueRef on = icmp(g, LLVMIntNE, LLVMBuildAnd(g->b, rem, i64c(g, w), ""), i64c(g, 0));
		LLVMBasicBlockRef jn = if_begin(g, on);
		PM_TILE(n, w);
		PM_CALL(w);
		if_end(g, jn);
		n = LLVMBuildSelect(g->b, on, add(g, n, i64c(g, w)), n, "");
	}
#undef PM_TILE
#undef PM_CALL
	loop_end(g, &li);
	loop_end(g, &lp);
	loop_end(g, &lb);
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* kiln_sgemm_pm: over the pool from PAR_WORK on: C of PM_SPLIT_STRIPS
 * strips or more (a 14x14 map) by ranges of strips, each thread packing
 * its columns of B (see emit_pm_blocked); narrower (a 7x7 map: five
 * strips would split 3:2) by panels of A's rows when there are two or
 * more (or A too big for the cache: below), each thread reading its rows
 * of A and all of B, else by strips. */
static LLVMValueRef emit_entry_pm(gen *g, LLVMValueRef blocked)
{
	char name[48];
	snprintf(name, sizeof name, "%s_range", g->fam);
	LLVMValueRef range = emit_range(g, blocked, name, false);
	snprintf(name, sizeof name, "%s_rows", g->fam);
	LLVMValueRef rows = emit_range(g, blocked, name, true);
	LLVMValueRef work, pool, fn = entry_begin(g, g->fam, &work, &pool), *p = g->p;
	int R = PM_NV * g->g.W;
	LLVMValueRef par = LLVMBuildAnd(g->b, LLVMBuildIsNotNull(g->b, pool, ""),
	                                icmp(g, LLVMIntSGE, work, i64c(g, PAR_WORK)), "");
	LLVMValueRef wide = icmp(g, LLVMIntSGE, p[P_N], i64c(g, PM_SPLIT_STRIPS * PM_COLS));
	LLVMValueRef prows = LLVMBuildAnd(g->b, par, icmp(g, LLVMIntSGE, p[P_M], i64c(g, 2 * R)), "");
	/* by rows also where C is wide but A is past half the L2 and twice
	 * as tall as C is wide: each thread then streams half of A instead of
	 * all of it (SqueezeNet's classifier conv, 1000 x 169 x 512, two
	 * threads: 0.581 -> 0.558 ms; MobileNetV2's 576 x 196 x 96, A in L2,
	 * lost by rows: 0.076 -> 0.086) */
	LLVMValueRef tall = LLVMBuildAnd(g->b, icmp(g, LLVMIntSGE, mul(g, p[P_M], p[P_K]), i64c(g, g->g.GB)),
	                                 icmp(g, LLVMIntSGE, p[P_M], mul(g, p[P_N], i64c(g, 2))), "");
	prows = LLVMBuildAnd(g->b, prows, LLVMBuildOr(g->b, tall, LLVMBuildNot(g->b, wide, ""), ""), "");
	LLVMValueRef pcol = LLVMBuildAnd(g->b, par, icmp(g, LLVMIntSGE, p[P_N], i64c(g, 2 * PM_COLS)), "");
	columns(g, pcol, prows, blocked, range, rows, R, PM_COLS);
	return fn;
}

int cg_sgemm_c_block(const cg_target *t, int *max_n)
{
	if (max_n)
		*max_n = PM_BLOCKED_LIMIT;
	return cg_sgemm_m_panel(t, NULL, NULL) ? geometry(t).W : 0;
}

int cg_sgemm_m_panel(const cg_target *t, int *max_n, int *min_k)
{
	geom g = geometry(t);
	if (max_n)
		*max_n = PM_MAX_N;
	if (min_k)
		*min_k = PM_MIN_K;
	return g.W == 16 ? PM_NV * g.W : 0;
}

LLVMValueRef cg_llvm_sgemm_pm(cg_llvm *L)
{
	gen g;
	if (L->sgemm_pm || family_begin(&g, L, "kiln_sgemm_pm", &L->sgemm_pm))
		return L->sgemm_pm;
	g.pa = true;
	g.g.MR = PM_NV * g.g.W; /* the panels' rows: emit_range's row blocks */
	g.g.NR = PM_COLS;       /* ... and its column units */
	g.row_tiles = 1;
	LLVMValueRef ukr[4][PM_COLS + 1] = {{0}}; /* [half * 2 + B blocked][columns] */
	for (int u = 0; u < 4; u++)
		for (int w = PM_COLS; w >= 1; w = w == PM_COLS ? 8 : w / 2)
			ukr[u][w] = emit_pm_ukr(&g, w, u & 1, u & 2 ? 1 : PM_NV);
	L->sgemm_pm = emit_entry_pm(&g, emit_pm_blocked(&g, ukr, emit_pm_packb(&g)));
	LLVMDisposeBuilder(g.b);
	return L->sgemm_pm;
}
