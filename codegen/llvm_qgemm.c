/*
 * llvm_qgemm.c: kiln_qgemm, the 8-bit integer matrix product behind the
 * quantized ops' CG_GEMMs (QLinearConv, QLinearMatMul, ConvInteger,
 * MatMulInteger), emitted as LLVM vector IR around the dot-product
 * instruction of AVX512-VNNI / AVX-VNNI (vpdpbusd: per 32-bit lane, the
 * sum of four u8 x s8 products added to an i32, without saturation).
 *
 * The key idea: C = A x B with A's rows broadcast 4 bytes at a time (the
 * four k of one row as one i32) and B packed so that each 32-bit lane of a
 * vector holds the four k of one column.  One vpdpbusd then does W x 4
 * multiply-adds; an MR x NV register tile of accumulators (6 x 4 zmm, as
 * kiln_sgemm's f32 tile) does MR x NV of them per group of four k, reading
 * NV vectors of packed B and MR broadcasts of A.  A is read in place (its
 * rows contiguous: the conv's weights, or a matmul's activations); B is
 * packed per NR-column panel into the thread's scratch, zero-padded past
 * K and past the last column, so the tile needs no edge code but masked
 * stores and one partial group when K % 4 != 0.
 *
 * vpdpbusd multiplies unsigned bytes by signed ones.  Whichever of A and B
 * is signed is used as the signed operand; when both have the same
 * signedness B's bytes are flipped (xor 0x80) while packing, which moves
 * its values by 128, and its zero point with them.  Zero points are then
 * algebra in the epilogue:
 *   sum_k (A - za)(B - zb) = S - zb * rowsum(A) - za * colsum(B) + K za zb
 * with rowsum(A) computed per block of rows and colsum(B) while packing,
 * only when the zero points (or the flip) make them count (the lowering
 * folds a constant B zero point into the bias and drops zero points that
 * are constant zeros, so a quantized model's convs pass neither).  The epilogue
 * adds the i32 bias (per row or column), and for an f32 or 8-bit C
 * multiplies by the requantization scale in f32 (per row, per column or one
 * value, as ONNX Runtime's kernels do), clamps to the activation, adds the
 * output zero point, rounds half to even and saturates.
 *
 * The work is (column panel, block of rows) items: over the pool with
 * rt_parallel_for when there is a pool and work enough, else in one call.
 * Each item packs its own panel (A's block is the larger operand re-read).
 * Where the target has no VNNI the same code runs with the dot product
 * spelled out in generic vector IR (widen, multiply, add four lanes).
 */
#include <string.h>

#include "codegen/llvm.h"

/* kiln_qgemm's parameters (llvm.h documents them). */
enum {
	Q_X, Q_M, Q_N, Q_K, Q_A, Q_ARS, Q_B, Q_BRS, Q_BROWS, Q_C, Q_CRS, Q_ZA, Q_ZAS, Q_ZB, Q_ZBS,
	Q_BIAS, Q_BAXIS, Q_SCALE, Q_SAXIS, Q_CZ, Q_LO, Q_HI, Q_COUNT,
	/* the argument block of the range function also carries: */
	Q_RB = Q_COUNT, Q_NPAN, Q_ARGS
};

/* Rows per item: with a pool, small blocks so that a batch-1 conv on a
 * 7x7 map (one column panel) still splits; alone, large ones (each block
 * re-packs its panel).  Work (M*N*K) below which threads are not used. */
enum { ROWS_PAR = 8, ROWS_SERIAL = 40, QPAR_WORK = 1 << 20 };

/* The AMX path's tile registers (C's 2 x 2 tiles of 16 x 16 i32, two row
 * tiles of A, two column tiles of B), its rows per step and per item (with
 * a pool, alone), the bytes of copy_tail's rows, and the least K and M
 * it runs on (below, the VNNI tile wastes less: K = 16..32 pointwise
 * convs, a batch-1 matmul's one row). */
enum { T_C = 0, T_A = 4, T_B = 6, AMX_MR = 32, AMX_ROWS_PAR = 64, AMX_ROWS_SERIAL = 512,
       AMX_TAIL = (AMX_ROWS_SERIAL + 16) * 64, AMX_MIN_K = 64 };

typedef struct qgen {
	cg_llvm *L;
	LLVMBuilderRef b;
	LLVMValueRef fn;
	int W, MR, NV, NR;
	bool a_u8, b_u8; /* A's and B's bytes unsigned (B is packed with the other signedness than A) */
	bool flip;       /* B's bytes flipped (xor 0x80) while packing: A and B alike */
	bool amx;        /* the target has AMX: a second range function on tiles */
	bool zp;         /* the tile being emitted subtracts zero point terms (else none is
	                    live: the range function has a copy of its loop without them) */
	bool rows_only;  /* ... nor a bias or scale per column: the tile loop's third copy */
	LLVMValueRef czf, qlo, qhi, lo, hi; /* the range's epilogue_consts */
	int b_delta;     /* what the flip adds to B's values and zero point (+-128) */
	kiln_dtype c_dt;
	LLVMTypeRef i8p, i32p, f32p, vi32, vf, vi1, xty, xp, argty;
	LLVMValueRef dot;    /* the vpdpbusd intrinsic, NULL: generic IR */
	LLVMValueRef cvt;    /* vcvtps2dq (W lanes, the current rounding), NULL: rint + fptosi */
	LLVMValueRef zeros;  /* a constant 64 zero bytes: what a guarded load reads when off */
	LLVMValueRef tcfg;   /* the AMX path's tile configuration (64 bytes) */
	LLVMValueRef p[Q_ARGS];
} qgen;

/* ---- small IR helpers ---------------------------------------------------- */

static LLVMValueRef c64(qgen *g, int64_t v) { return LLVMConstInt(g->L->i64, (unsigned long long)v, 1); }
static LLVMValueRef c32(qgen *g, int64_t v) { return LLVMConstInt(g->L->i32, (unsigned long long)v, 1); }
static LLVMValueRef add(qgen *g, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildAdd(g->b, a, b, ""); }
static LLVMValueRef sub(qgen *g, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildSub(g->b, a, b, ""); }
static LLVMValueRef mul(qgen *g, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildMul(g->b, a, b, ""); }

static LLVMValueRef lt(qgen *g, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildICmp(g->b, LLVMIntSLT, a, b, "");
}

static LLVMValueRef smin(qgen *g, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildSelect(g->b, lt(g, a, b), a, b, "");
}

/* &p[i] for p of element type ty */
static LLVMValueRef gep(qgen *g, LLVMTypeRef ty, LLVMValueRef p, LLVMValueRef i)
{
	return LLVMBuildGEP2(g->b, ty, p, &i, 1, "");
}

static LLVMValueRef cast_ptr(qgen *g, LLVMValueRef p, LLVMTypeRef to)
{
	return LLVMBuildBitCast(g->b, p, to, "");
}

static LLVMValueRef load(qgen *g, LLVMTypeRef ty, LLVMValueRef p, unsigned align)
{
	LLVMValueRef v = LLVMBuildLoad2(g->b, ty, cast_ptr(g, p, LLVMPointerType(ty, 0)), "");
	LLVMSetAlignment(v, align);
	return v;
}

static void store(qgen *g, LLVMValueRef v, LLVMValueRef p, unsigned align)
{
	LLVMValueRef s = LLVMBuildStore(g->b, v, cast_ptr(g, p, LLVMPointerType(LLVMTypeOf(v), 0)));
	LLVMSetAlignment(s, align);
}

static LLVMValueRef call(qgen *g, LLVMValueRef fn, LLVMValueRef *args, unsigned n)
{
	return LLVMBuildCall2(g->b, LLVMGlobalGetValueType(fn), fn, args, n, "");
}

static LLVMValueRef intrinsic(qgen *g, const char *name, LLVMTypeRef *tys, size_t n)
{
	unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
	return id ? LLVMGetIntrinsicDeclaration(g->L->mod, id, tys, n) : NULL;
}

static LLVMValueRef splat(qgen *g, LLVMTypeRef vty, LLVMValueRef s)
{
	unsigned n = LLVMGetVectorSize(vty);
	LLVMValueRef v = LLVMBuildInsertElement(g->b, LLVMGetUndef(vty), s, c32(g, 0), "");
	return LLVMBuildShuffleVector(g->b, v, LLVMGetUndef(vty),
	                              LLVMConstNull(LLVMVectorType(g->L->i32, n)), "");
}

/* <n x i1>: lane l on when l < rem (any i64) */
static LLVMValueRef lanes(qgen *g, int n, LLVMValueRef rem)
{
	LLVMValueRef iota[256];
	for (int l = 0; l < n; l++)
		iota[l] = c32(g, l);
	rem = LLVMBuildTrunc(g->b, smin(g, LLVMBuildSelect(g->b, lt(g, rem, c64(g, 0)), c64(g, 0),
	                                                   rem, ""), c64(g, n)), g->L->i32, "");
	return LLVMBuildICmp(g->b, LLVMIntSLT, LLVMConstVector(iota, (unsigned)n),
	                     splat(g, LLVMVectorType(g->L->i32, (unsigned)n), rem), "");
}

/* llvm.masked.load of <ty> at p (lanes off read nothing and are 0) */
static LLVMValueRef mload(qgen *g, LLVMTypeRef vty, LLVMValueRef p, LLVMValueRef mask,
                          unsigned align)
{
	LLVMTypeRef pty = LLVMPointerType(vty, 0), t[] = {vty, pty};
	LLVMValueRef f = intrinsic(g, "llvm.masked.load", t, 2);
	LLVMValueRef a[] = {cast_ptr(g, p, pty), c32(g, align), mask, LLVMConstNull(vty)};
	return call(g, f, a, 4);
}

static void mstore(qgen *g, LLVMValueRef v, LLVMValueRef p, LLVMValueRef mask, unsigned align)
{
	LLVMTypeRef vty = LLVMTypeOf(v), pty = LLVMPointerType(vty, 0), t[] = {vty, pty};
	LLVMValueRef f = intrinsic(g, "llvm.masked.store", t, 2);
	LLVMValueRef a[] = {v, cast_ptr(g, p, pty), c32(g, align), mask};
	call(g, f, a, 4);
}

/* llvm_gemm.c's structured control flow in this file's builder */
typedef cg_llvm_loop qloop;

static LLVMValueRef local(qgen *g, LLVMTypeRef ty, LLVMValueRef init)
{
	return cg_llvm_local(g->L, g->b, g->fn, ty, init);
}

static LLVMBasicBlockRef block(qgen *g, const char *name)
{
	return LLVMAppendBasicBlockInContext(g->L->ctx, g->fn, name);
}

static LLVMValueRef loop_begin(qgen *g, qloop *l, LLVMValueRef lo, LLVMValueRef hi, int64_t step)
{
	return cg_llvm_loop_begin(g->L, g->b, g->fn, l, lo, hi, step);
}

static void loop_end(qgen *g, qloop *l)
{
	cg_llvm_loop_end(g->b, l);
}

static LLVMBasicBlockRef if_begin(qgen *g, LLVMValueRef cond)
{
	return cg_llvm_if_begin(g->L, g->b, g->fn, cond);
}

static void if_end(qgen *g, LLVMBasicBlockRef join)
{
	cg_llvm_if_end(g->b, join);
}

/* p when cond, else the constant zeros: a load that reads nothing when off */
static LLVMValueRef or_zeros(qgen *g, LLVMValueRef cond, LLVMValueRef p)
{
	return LLVMBuildSelect(g->b, cond, cast_ptr(g, p, g->i8p), cast_ptr(g, g->zeros, g->i8p), "");
}

static LLVMValueRef not_null(qgen *g, LLVMValueRef p)
{
	return LLVMBuildIsNotNull(g->b, p, "");
}

/* byte p[0] of a zero point as i32: signed or not; 0 when p is null */
static LLVMValueRef zp_at(qgen *g, LLVMValueRef p, LLVMValueRef i, bool u8)
{
	LLVMValueRef on = not_null(g, p);
	LLVMValueRef v = load(g, g->L->i8, or_zeros(g, on, gep(g, g->L->i8, p, i)), 1);
	return u8 ? LLVMBuildZExt(g->b, v, g->L->i32, "") : LLVMBuildSExt(g->b, v, g->L->i32, "");
}

/* ---- the dot product ------------------------------------------------------ */

/* acc + per lane the sum of four u8 (u) x s8 (s) byte products */
static LLVMValueRef dot4(qgen *g, LLVMValueRef acc, LLVMValueRef u, LLVMValueRef s)
{
	if (g->dot) {
		LLVMValueRef a[] = {acc, u, s};
		return call(g, g->dot, a, 3);
	}
	/* generic: widen the 4W bytes, multiply, add lanes 4l..4l+3 */
	unsigned n = (unsigned)(4 * g->W);
	LLVMTypeRef vb = LLVMVectorType(g->L->i8, n), vw = LLVMVectorType(g->L->i32, n);
	LLVMValueRef uw = LLVMBuildZExt(g->b, LLVMBuildBitCast(g->b, u, vb, ""), vw, "");
	LLVMValueRef sw = LLVMBuildSExt(g->b, LLVMBuildBitCast(g->b, s, vb, ""), vw, "");
	LLVMValueRef pr = mul(g, uw, sw);
	for (int r = 0; r < 4; r++) {
		LLVMValueRef idx[64];
		for (int l = 0; l < g->W; l++)
			idx[l] = c32(g, 4 * l + r);
		acc = add(g, acc, LLVMBuildShuffleVector(g->b, pr, LLVMGetUndef(vw),
		                                         LLVMConstVector(idx, (unsigned)g->W), ""));
	}
	return acc;
}

/* ---- packing B -------------------------------------------------------------- */

/* shufflevector of a and b with the n indices idx */
static LLVMValueRef shuffle(qgen *g, LLVMValueRef a, LLVMValueRef b, const int *idx, int n)
{
	LLVMValueRef m[64];
	for (int i = 0; i < n; i++)
		m[i] = c32(g, idx[i]);
	return LLVMBuildShuffleVector(g->b, a, b, LLVMConstVector(m, (unsigned)n), "");
}

/* pack_group's interleave for 64-byte rows (one zmm each) into four zmm,
 * as x86 does it: bytes of rows 0/1 and 2/3 unpacked (vpunpck[lh]bw), the
 * pairs' words unpacked (vpunpck[lh]wd), which leaves column c of 128-bit
 * lane L in output (c / 4) % 4, so a transpose of 128-bit lanes
 * (vshufi64x2) puts the columns in order.  The generic shufflevector of
 * four rows measured 2.4 of ResNet-18's 9.6 ms int8 batch 1 in packing. */
static void interleave_512(qgen *g, LLVMValueRef *row, LLVMValueRef dst)
{
	cg_llvm *L = g->L;
	int idx[64];
	LLVMValueRef t[4], o[4];
	for (int h = 0; h < 2; h++) /* bytes: lo and hi halves of each lane */
		for (int p = 0; p < 2; p++) {
			for (int l = 0; l < 4; l++)
				for (int j = 0; j < 8; j++) {
					idx[16 * l + 2 * j] = 16 * l + 8 * h + j;
					idx[16 * l + 2 * j + 1] = 64 + 16 * l + 8 * h + j;
				}
			t[2 * p + h] = shuffle(g, row[2 * p], row[2 * p + 1], idx, 64);
		}
	LLVMTypeRef w16 = LLVMVectorType(LLVMInt16TypeInContext(L->ctx), 32);
	for (int h = 0; h < 2; h++) /* words of t[h] (rows 0,1) with t[2 + h] (rows 2,3) */
		for (int k = 0; k < 2; k++) {
			for (int l = 0; l < 4; l++)
				for (int j = 0; j < 4; j++) {
					idx[8 * l + 2 * j] = 8 * l + 4 * k + j;
					idx[8 * l + 2 * j + 1] = 32 + 8 * l + 4 * k + j;
				}
			LLVMValueRef a = LLVMBuildBitCast(g->b, t[h], w16, "");
			LLVMValueRef b = LLVMBuildBitCast(g->b, t[2 + h], w16, "");
			o[2 * h + k] = LLVMBuildBitCast(g->b, shuffle(g, a, b, idx, 32), g->vi32, "");
		}
	/* o[q] lane L holds columns 16L + 4q .. + 3: transpose the 4 x 4 lanes */
	LLVMValueRef u[4];
	for (int p = 0; p < 2; p++)
		for (int h = 0; h < 2; h++) { /* lanes {2h, 2h+1} of o[2p] and o[2p+1] */
			for (int i = 0; i < 16; i++) {
				int lane = 2 * h + (i / 4) % 2, src = i / 8;
				idx[i] = 16 * src + 4 * lane + i % 4;
			}
			u[2 * p + h] = shuffle(g, o[2 * p], o[2 * p + 1], idx, 16);
		}
	/* u[2p+h] = [o[2p].L(2h), o[2p].L(2h+1), o[2p+1].L(2h), o[2p+1].L(2h+1)] */
	for (int v = 0; v < 4; v++) {
		int h = v / 2, e = v % 2; /* v = 2h + e: lane e of each pair */
		for (int i = 0; i < 16; i++) {
			int q = i / 4; /* output lane q holds columns 16v + 4q: o[q] lane v */
			int srcv = q / 2, pos = 2 * (q % 2) + e;
			idx[i] = 16 * srcv + 4 * pos + i % 4;
		}
		LLVMValueRef out = shuffle(g, u[h], u[2 + h], idx, 16);
		store(g, out, gep(g, L->i8, dst, c64(g, (int64_t)v * 64)), 4);
	}
}

/* Where B's row k (in: k < K) starts: k*b_rs, or b_rows[k] when b_rows
 * is given (an implicit im2col's taps); past K (masked off) anything. */
static LLVMValueRef row_at(qgen *g, LLVMValueRef k, LLVMValueRef in)
{
	LLVMValueRef *p = g->p, on = LLVMBuildAnd(g->b, in, not_null(g, p[Q_BROWS]), "");
	LLVMValueRef at = gep(g, g->L->i64, p[Q_BROWS], k);
	LLVMValueRef v = load(g, g->L->i64, or_zeros(g, on, at), 8);
	return LLVMBuildSelect(g->b, on, v, mul(g, k, p[Q_BRS]), "");
}

/* Rows 4q..4q+3 of the panel's columns [0, nr) (B at the panel's first
 * column, row k at B + k*b_rs or, with b_rows, at B + b_rows[k]) as NV vectors of W 32-bit lanes, lane l of vector v holding the
 * four rows' bytes of column v*W + l, stored at dst; rows past K and
 * columns past nr are 0 (flipped bytes too).  With sums, colsum (NV
 * vectors of i32) gains the packed values. */
static void pack_group(qgen *g, LLVMValueRef q, LLVMValueRef nrmask, LLVMValueRef dst,
                       LLVMValueRef *colsum)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p, row[4];
	LLVMTypeRef vb = LLVMVectorType(L->i8, (unsigned)g->NR);
	LLVMValueRef none = LLVMConstNull(LLVMVectorType(L->i1, (unsigned)g->NR));
	for (int r = 0; r < 4; r++) {
		LLVMValueRef k = add(g, mul(g, q, c64(g, 4)), c64(g, r));
		LLVMValueRef in = lt(g, k, p[Q_K]), mask = LLVMBuildSelect(g->b, in, nrmask, none, "");
		row[r] = mload(g, vb, gep(g, L->i8, p[Q_B], row_at(g, k, in)), mask, 1);
		if (g->flip) /* only the lanes loaded: padding stays 0 */
			row[r] = LLVMBuildXor(g->b, row[r],
			                      LLVMBuildSelect(g->b, mask, splat(g, vb, LLVMConstInt(L->i8, 0x80, 0)),
			                                      LLVMConstNull(vb), ""), "");
		if (colsum) {
			LLVMTypeRef vw = LLVMVectorType(L->i32, (unsigned)g->NR);
			/* the packed bytes' signedness: signed when A is unsigned */
			LLVMValueRef w = g->a_u8 ? LLVMBuildSExt(g->b, row[r], vw, "")
			                         : LLVMBuildZExt(g->b, row[r], vw, "");
			for (int v = 0; v < g->NV; v++) {
				LLVMValueRef idx[64];
				for (int l = 0; l < g->W; l++)
					idx[l] = c32(g, v * g->W + l);
				LLVMValueRef part = LLVMBuildShuffleVector(g->b, w, LLVMGetUndef(vw),
				                                           LLVMConstVector(idx, (unsigned)g->W), "");
				LLVMBuildStore(g->b, add(g, LLVMBuildLoad2(g->b, g->vi32, colsum[v], ""), part),
				               colsum[v]);
			}
		}
	}
	/* interleave: byte 4l + r of vector v is row r's byte v*W + l */
	if (g->W == 16 && g->NV == 4) {
		interleave_512(g, row, dst);
		return;
	}
	LLVMValueRef cat[2], idx[256];
	for (int h = 0; h < 2; h++) {
		for (int i = 0; i < 2 * g->NR; i++)
			idx[i] = c32(g, i);
		cat[h] = LLVMBuildShuffleVector(g->b, row[2 * h], row[2 * h + 1],
		                                LLVMConstVector(idx, (unsigned)(2 * g->NR)), "");
	}
	for (int v = 0; v < g->NV; v++) {
		for (int l = 0; l < g->W; l++)
			for (int r = 0; r < 4; r++)
				idx[4 * l + r] = c32(g, (r / 2) * 2 * g->NR + (r % 2) * g->NR + v * g->W + l);
		LLVMValueRef out = LLVMBuildShuffleVector(g->b, cat[0], cat[1],
		                                          LLVMConstVector(idx, (unsigned)(4 * g->W)), "");
		store(g, out, gep(g, L->i8, dst, c64(g, (int64_t)v * 4 * g->W)), 4);
	}
}

/* The panel of columns [j0, j0 + nr) into Bp: k4 groups of NV vectors
 * (ceil(K/4), or more for the AMX path: the groups past K are zeros); with sums (A's zero point present) their column sums into cb,
 * else zeros there. */
static void pack_panel(qgen *g, LLVMValueRef Bp, LLVMValueRef cb, LLVMValueRef nr, LLVMValueRef k4)
{
	LLVMValueRef *p = g->p;
	LLVMValueRef nrmask = lanes(g, g->NR, nr), colsum[8];
	for (int v = 0; v < g->NV; v++)
		colsum[v] = local(g, g->vi32, NULL);
	for (int v = 0; v < g->NV; v++)
		LLVMBuildStore(g->b, LLVMConstNull(g->vi32), colsum[v]);
	LLVMBasicBlockRef with = block(g, "sums"), without = block(g, "nosums"), done = block(g, "packed");
	LLVMBuildCondBr(g->b, not_null(g, p[Q_ZA]), with, without);
	for (int s = 0; s < 2; s++) {
		LLVMPositionBuilderAtEnd(g->b, s ? without : with);
		qloop lq;
		LLVMValueRef q = loop_begin(g, &lq, c64(g, 0), k4, 1);
		pack_group(g, q, nrmask, gep(g, g->L->i8, Bp, mul(g, q, c64(g, 4 * g->NR))),
		           s ? NULL : colsum);
		loop_end(g, &lq);
		LLVMBuildBr(g->b, done);
	}
	LLVMPositionBuilderAtEnd(g->b, done);
	for (int v = 0; v < g->NV; v++)
		store(g, LLVMBuildLoad2(g->b, g->vi32, colsum[v], ""),
		      gep(g, g->L->i32, cb, c64(g, (int64_t)v * g->W)), 4);
}

/* ra[i - m0] = sum_k A[i, k] for i in [m0, m1) (A's own signedness) */
static void row_sums(qgen *g, LLVMValueRef ra, LLVMValueRef m0, LLVMValueRef m1)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p;
	qloop li, lk;
	LLVMValueRef i = loop_begin(g, &li, m0, m1, 1);
	LLVMValueRef arow = gep(g, L->i8, p[Q_A], mul(g, i, p[Q_ARS]));
	LLVMValueRef s = local(g, L->i32, NULL);
	LLVMBuildStore(g->b, c32(g, 0), s);
	LLVMValueRef k = loop_begin(g, &lk, c64(g, 0), p[Q_K], 1);
	LLVMValueRef a = load(g, L->i8, gep(g, L->i8, arow, k), 1);
	a = g->a_u8 ? LLVMBuildZExt(g->b, a, L->i32, "") : LLVMBuildSExt(g->b, a, L->i32, "");
	LLVMBuildStore(g->b, add(g, LLVMBuildLoad2(g->b, L->i32, s, ""), a), s);
	loop_end(g, &lk);
	store(g, LLVMBuildLoad2(g->b, L->i32, s, ""), gep(g, L->i32, ra, sub(g, i, m0)), 4);
	loop_end(g, &li);
}

/* ---- the tile ---------------------------------------------------------------- */

/* Per panel: B's zero point per column as the flip moved it, A's zero point
 * times B's column sums, the column bias and the column scale (the one
 * value where the scale is one value, 1 where it is per row or absent),
 * and each vector's store mask. */
typedef struct panel {
	LLVMValueRef zb[8], cb[8], bias[8], scale[8], mask[8];
} panel;

static void panel_vectors(qgen *g, panel *pn, LLVMValueRef j0, LLVMValueRef nr, LLVMValueRef cb)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p;
	LLVMTypeRef vb = LLVMVectorType(L->i8, (unsigned)g->W);
	LLVMValueRef none = LLVMConstNull(g->vi1);
	LLVMValueRef colzb = LLVMBuildAnd(g->b, not_null(g, p[Q_ZB]),
	                                  LLVMBuildICmp(g->b, LLVMIntNE, p[Q_ZBS], c64(g, 0), ""), "");
	LLVMValueRef zb0 = splat(g, g->vi32, add(g, zp_at(g, p[Q_ZB], c64(g, 0), g->b_u8),
	                                         c32(g, g->b_delta)));
	LLVMValueRef colb = LLVMBuildICmp(g->b, LLVMIntEQ, p[Q_BAXIS], c32(g, 1), "");
	LLVMValueRef cols = LLVMBuildICmp(g->b, LLVMIntEQ, p[Q_SAXIS], c32(g, 1), "");
	LLVMValueRef alls = LLVMBuildICmp(g->b, LLVMIntEQ, p[Q_SAXIS], c32(g, 3), "");
	LLVMValueRef s0 = load(g, L->f32, or_zeros(g, alls, p[Q_SCALE]), 4);
	LLVMValueRef one = splat(g, g->vf, LLVMBuildSelect(g->b, alls, s0, LLVMConstReal(L->f32, 1), ""));
	for (int v = 0; v < g->NV; v++) {
		LLVMValueRef off = add(g, j0, c64(g, (int64_t)v * g->W));
		pn->mask[v] = lanes(g, g->W, sub(g, nr, c64(g, (int64_t)v * g->W)));
		LLVMValueRef m = LLVMBuildSelect(g->b, colzb, pn->mask[v], none, "");
		LLVMValueRef zv = mload(g, vb, or_zeros(g, colzb, gep(g, L->i8, p[Q_ZB], off)), m, 1);
		zv = g->b_u8 ? LLVMBuildZExt(g->b, zv, g->vi32, "") : LLVMBuildSExt(g->b, zv, g->vi32, "");
		zv = add(g, zv, splat(g, g->vi32, c32(g, g->b_delta)));
		pn->zb[v] = LLVMBuildSelect(g->b, colzb, zv, zb0, "");
		pn->cb[v] = load(g, g->vi32, gep(g, L->i32, cb, c64(g, (int64_t)v * g->W)), 4);
		m = LLVMBuildSelect(g->b, colb, pn->mask[v], none, "");
		pn->bias[v] = mload(g, g->vi32, or_zeros(g, colb, gep(g, L->i32, p[Q_BIAS], off)), m, 4);
		m = LLVMBuildSelect(g->b, cols, pn->mask[v], none, "");
		LLVMValueRef sv = mload(g, g->vf, or_zeros(g, cols, gep(g, L->f32, p[Q_SCALE], off)), m, 4);
		pn->scale[v] = LLVMBuildSelect(g->b, cols, sv, one, "");
	}
}

static LLVMValueRef fclamp(qgen *g, LLVMValueRef v, LLVMValueRef lo, LLVMValueRef hi)
{
	v = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOLT, v, lo, ""), lo, v, "");
	return LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOGT, v, hi, ""), hi, v, "");
}

/* What every row's epilogue shares, once per range call: an f32 C's
 * activation bounds; an 8-bit C's zero point and one clamp for both the
 * activation and the saturation.  With h(x) = rint(x + cz), monotone,
 * clamp(h(clamp(f, lo, hi)), qlo, qhi) = clamp(h(f), L, U) for
 * L = clamp(h(lo), qlo, qhi), U = clamp(h(hi), qlo, qhi): the same values
 * with two compares per vector fewer. */
static void epilogue_consts(qgen *g)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p;
	g->lo = splat(g, g->vf, p[Q_LO]), g->hi = splat(g, g->vf, p[Q_HI]);
	if (g->c_dt != KILN_U8 && g->c_dt != KILN_I8)
		return;
	bool u8 = g->c_dt == KILN_U8;
	LLVMValueRef cz = LLVMBuildSIToFP(g->b, zp_at(g, p[Q_CZ], c64(g, 0), u8), L->f32, "");
	LLVMValueRef qlo = LLVMConstReal(L->f32, u8 ? 0 : -128), qhi = LLVMConstReal(L->f32, u8 ? 255 : 127);
	LLVMTypeRef f = L->f32;
	LLVMValueRef rint = intrinsic(g, "llvm.rint", &f, 1), b[2];
	for (int i = 0; i < 2; i++) {
		LLVMValueRef a[] = {LLVMBuildFAdd(g->b, p[i ? Q_HI : Q_LO], cz, "")};
		b[i] = fclamp(g, call(g, rint, a, 1), qlo, qhi);
	}
	g->czf = splat(g, g->vf, cz);
	g->qlo = splat(g, g->vf, b[0]), g->qhi = splat(g, g->vf, b[1]);
}

/* rint(v) clamped to [qlo, qhi] as i32.  Where the target has a
 * conversion that rounds as the current mode does (half to even:
 * vcvtps2dq), v is clamped first and converted by it: the same values
 * (qlo and qhi are whole numbers, rint is monotone; NaN converts to
 * INT_MIN either way and truncates to 0), one instruction fewer than
 * vrndscaleps + vcvttps2dq per vector of a small-K GEMM's epilogue. */
static LLVMValueRef to_int(qgen *g, LLVMValueRef v)
{
	if (g->cvt) {
		v = fclamp(g, v, g->qlo, g->qhi);
		if (g->W == 16) {
			LLVMTypeRef i16 = LLVMInt16TypeInContext(g->L->ctx);
			LLVMValueRef a[] = {v, LLVMGetUndef(g->vi32), LLVMConstInt(i16, 0xffff, 0),
			                    c32(g, 4)}; /* all lanes, the current rounding */
			return call(g, g->cvt, a, 4);
		}
		return call(g, g->cvt, &v, 1);
	}
	LLVMTypeRef vf = g->vf;
	LLVMValueRef rint = intrinsic(g, "llvm.rint", &vf, 1);
	LLVMValueRef f = fclamp(g, call(g, rint, &v, 1), g->qlo, g->qhi);
	return LLVMBuildFPToSI(g->b, f, g->vi32, "");
}

/* Row m's NV vectors of sums (acc) through the epilogue into C (ra: A's
 * row sum, read only with g->zp). */
static void epilogue_row(qgen *g, const panel *pn, LLVMValueRef *acc, LLVMValueRef m,
                         LLVMValueRef ra, LLVMValueRef j0)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p, rzv = NULL, zav = NULL;
	if (g->zp) { /* zb'(n) * (rowsum - K za) + za * colsum(n) */
		LLVMValueRef za = zp_at(g, p[Q_ZA], mul(g, m, p[Q_ZAS]), g->a_u8);
		LLVMValueRef rz = sub(g, ra, mul(g, LLVMBuildTrunc(g->b, p[Q_K], L->i32, ""), za));
		rzv = splat(g, g->vi32, rz), zav = splat(g, g->vi32, za);
	}
	LLVMValueRef rowb_on = LLVMBuildICmp(g->b, LLVMIntEQ, p[Q_BAXIS], c32(g, 2), "");
	LLVMValueRef rowb = load(g, L->i32, or_zeros(g, rowb_on, gep(g, L->i32, p[Q_BIAS], m)), 4);
	LLVMValueRef rows_on = LLVMBuildICmp(g->b, LLVMIntEQ, p[Q_SAXIS], c32(g, 2), "");
	LLVMValueRef rs = load(g, L->f32, or_zeros(g, rows_on, gep(g, L->f32, p[Q_SCALE], m)), 4);
	rs = splat(g, g->vf, LLVMBuildSelect(g->b, rows_on, rs, LLVMConstReal(L->f32, 1), ""));
	LLVMValueRef rowbv = splat(g, g->vi32, rowb);
	bool f32c = g->c_dt == KILN_F32, i32c = g->c_dt == KILN_I32;
	LLVMTypeRef ety = f32c ? L->f32 : i32c ? L->i32 : L->i8;
	LLVMValueRef crow = mul(g, m, p[Q_CRS]);
	for (int v = 0; v < g->NV; v++) {
		LLVMValueRef s = LLVMBuildLoad2(g->b, g->vi32, acc[v], "");
		if (g->zp)
			s = sub(g, s, add(g, mul(g, pn->zb[v], rzv), mul(g, zav, pn->cb[v])));
		s = add(g, s, g->rows_only ? rowbv : add(g, pn->bias[v], rowbv));
		LLVMValueRef at = gep(g, ety, cast_ptr(g, p[Q_C], LLVMPointerType(ety, 0)),
		                      add(g, crow, add(g, j0, c64(g, (int64_t)v * g->W))));
		if (i32c) {
			mstore(g, s, at, pn->mask[v], 4);
			continue;
		}
		LLVMValueRef f = LLVMBuildSIToFP(g->b, s, g->vf, "");
		f = LLVMBuildFMul(g->b, f, g->rows_only ? rs : LLVMBuildFMul(g->b, pn->scale[v], rs, ""), "");
		if (f32c) {
			mstore(g, fclamp(g, f, g->lo, g->hi), at, pn->mask[v], 4);
			continue;
		}
		LLVMValueRef iv = to_int(g, LLVMBuildFAdd(g->b, f, g->czf, ""));
		iv = LLVMBuildTrunc(g->b, iv, LLVMVectorType(L->i8, (unsigned)g->W), "");
		mstore(g, iv, at, pn->mask[v], 1);
	}
}

/* Rows [i0, min(i0 + MR, m1)) of the panel at Bp: the k loop over whole
 * groups of four, a last partial group, the epilogue.  Rows past m1 repeat
 * row m1 - 1 (computed, never stored). */
static void tile(qgen *g, const panel *pn, LLVMValueRef Bp, LLVMValueRef i0, LLVMValueRef m0,
                 LLVMValueRef m1, LLVMValueRef ra, LLVMValueRef j0)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p, arow[16], acc[64], bv[8];
	int MR = g->MR, NV = g->NV;
	LLVMValueRef last = sub(g, m1, c64(g, 1));
	for (int i = 0; i < MR; i++)
		arow[i] = gep(g, L->i8, p[Q_A], mul(g, smin(g, add(g, i0, c64(g, i)), last), p[Q_ARS]));
	for (int i = 0; i < MR * NV; i++) {
		acc[i] = local(g, g->vi32, NULL);
		LLVMBuildStore(g->b, LLVMConstNull(g->vi32), acc[i]);
	}
	LLVMValueRef kfull = LLVMBuildSDiv(g->b, p[Q_K], c64(g, 4), "");
	LLVMValueRef rem = LLVMBuildSRem(g->b, p[Q_K], c64(g, 4), "");
	unsigned valign = (unsigned)(4 * g->W < 64 ? 4 * g->W : 64);
	for (int part = 0; part < 2; part++) {
		qloop lq;
		LLVMBasicBlockRef join = NULL;
		LLVMValueRef q;
		if (part == 0) {
			q = loop_begin(g, &lq, c64(g, 0), kfull, 1);
		} else { /* the last group of K % 4 rows */
			join = if_begin(g, LLVMBuildICmp(g->b, LLVMIntSGT, rem, c64(g, 0), ""));
			q = kfull;
		}
		LLVMValueRef bq = gep(g, L->i8, Bp, mul(g, q, c64(g, 4 * g->NR)));
		for (int v = 0; v < NV; v++)
			bv[v] = load(g, g->vi32, gep(g, L->i8, bq, c64(g, (int64_t)v * 4 * g->W)), valign);
		for (int i = 0; i < MR; i++) {
			LLVMValueRef ap = gep(g, L->i8, arow[i], mul(g, q, c64(g, 4))), a;
			if (part == 0) {
				a = load(g, L->i32, ap, 1);
			} else { /* bytes t < rem, zeros above: never read past the row */
				a = c32(g, 0);
				for (int t = 0; t < 3; t++) {
					LLVMValueRef on = lt(g, c64(g, t), rem);
					LLVMValueRef byte = load(g, L->i8, or_zeros(g, on, gep(g, L->i8, ap, c64(g, t))), 1);
					byte = LLVMBuildZExt(g->b, byte, L->i32, "");
					a = LLVMBuildOr(g->b, a, LLVMBuildShl(g->b, byte, c32(g, 8 * t), ""), "");
				}
			}
			LLVMValueRef av = splat(g, g->vi32, a);
			for (int v = 0; v < NV; v++) {
				LLVMValueRef s = LLVMBuildLoad2(g->b, g->vi32, acc[i * NV + v], "");
				s = g->a_u8 ? dot4(g, s, av, bv[v]) : dot4(g, s, bv[v], av);
				LLVMBuildStore(g->b, s, acc[i * NV + v]);
			}
		}
		if (part == 0)
			loop_end(g, &lq);
		else
			if_end(g, join);
	}
	for (int i = 0; i < MR; i++) {
		LLVMValueRef m = add(g, i0, c64(g, i));
		LLVMBasicBlockRef join = if_begin(g, lt(g, m, m1));
		LLVMValueRef r = g->zp ? load(g, L->i32, gep(g, L->i32, ra, sub(g, m, m0)), 4) : NULL;
		epilogue_row(g, pn, acc + i * NV, m, r, j0);
		if_end(g, join);
	}
}

/* ---- the AMX tile ------------------------------------------------------------ */

/* A tile intrinsic (llvm.x86.<name>) on tile registers named by immediates */
static void tile_op(qgen *g, const char *name, LLVMValueRef *a, unsigned n)
{
	char full[48];
	snprintf(full, sizeof full, "llvm.x86.%s", name);
	call(g, intrinsic(g, full, NULL, 0), a, n);
}

static LLVMValueRef treg(qgen *g, int t)
{
	return LLVMConstInt(g->L->i8, (unsigned long long)t, 0);
}

/* The first row of A's t-th row tile at i0: i0 + 16t, moved up so that
 * the tile ends at M (the AMX path runs only when M >= 16), so a tile
 * reads no row past A's last. */
static LLVMValueRef tile_row(qgen *g, LLVMValueRef i0, int t)
{
	return smin(g, add(g, i0, c64(g, 16 * t)), sub(g, g->p[Q_M], c64(g, 16)));
}

/* Per block of rows from tb (tile_row's first of the block) to m1: the
 * bytes of A's last step of 64 k when K is not a multiple of 64, zeros
 * past K, as rows of 64 bytes at tail; tiles read the step from there. */
static void copy_tail(qgen *g, LLVMValueRef tail, LLVMValueRef tb, LLVMValueRef m1)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p;
	LLVMValueRef k0 = mul(g, LLVMBuildSDiv(g->b, p[Q_K], c64(g, 64), ""), c64(g, 64));
	LLVMValueRef n = sub(g, p[Q_K], k0);
	LLVMBasicBlockRef join = if_begin(g, LLVMBuildICmp(g->b, LLVMIntSGT, n, c64(g, 0), ""));
	LLVMValueRef mask = lanes(g, 64, n);
	qloop lr;
	LLVMValueRef r = loop_begin(g, &lr, tb, m1, 1);
	LLVMValueRef v = mload(g, LLVMVectorType(L->i8, 64),
	                       gep(g, L->i8, p[Q_A], add(g, mul(g, r, p[Q_ARS]), k0)), mask, 1);
	store(g, v, gep(g, L->i8, tail, mul(g, sub(g, r, tb), c64(g, 64))), 64);
	loop_end(g, &lr);
	if_end(g, join);
}

/* Tile T_A + t: A's rows [r0, r0 + 16), bytes [64 kc, 64 kc + 64): in
 * place, or for the last step of a K that is not a multiple of 64 from
 * copy_tail's rows (the packed B is 0 past K, so its zeros add nothing). */
static void load_a(qgen *g, int t, LLVMValueRef r0, LLVMValueRef kc, LLVMValueRef tail,
                   LLVMValueRef tb)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p, k0 = mul(g, kc, c64(g, 64));
	LLVMValueRef full = LLVMBuildICmp(g->b, LLVMIntSLE, add(g, k0, c64(g, 64)), p[Q_K], "");
	LLVMValueRef in = gep(g, L->i8, p[Q_A], add(g, mul(g, r0, p[Q_ARS]), k0));
	LLVMValueRef cp = gep(g, L->i8, tail, mul(g, sub(g, r0, tb), c64(g, 64)));
	LLVMValueRef a[] = {treg(g, T_A + t), LLVMBuildSelect(g->b, full, in, cp, ""),
	                    LLVMBuildSelect(g->b, full, p[Q_ARS], c64(g, 64), "")};
	tile_op(g, "tileloadd64", a, 3);
}

/* amx_tile: tile()'s work for rows [i0, min(i0 + AMX_MR, m1)) on AMX:
 * per half panel (32 columns; the second only when the panel has more),
 * a 2 x 2 block of C tiles over ceil(K / 64) steps, each two row tiles of
 * A (read in place, as tile() does; tile_row) times two column tiles of
 * the packed B, whose layout is already the one tdpbusd reads (group q:
 * four k of 16 columns per 64 bytes), then stored to ctile (32 rows of NR
 * i32) for epilogue_row. */
static void amx_tile(qgen *g, const panel *pn, LLVMValueRef Bp, LLVMValueRef i0, LLVMValueRef m0,
                     LLVMValueRef m1, LLVMValueRef ra, LLVMValueRef j0, LLVMValueRef nr,
                     LLVMValueRef ctile, LLVMValueRef tail, LLVMValueRef tb)
{
	cg_llvm *L = g->L;
	LLVMValueRef *p = g->p;
	int64_t gb = 4 * g->NR; /* bytes of a packed group of four k, and of a ctile row */
	LLVMValueRef kc_n = LLVMBuildSDiv(g->b, add(g, p[Q_K], c64(g, 63)), c64(g, 64), "");
	LLVMValueRef r0[2] = {tile_row(g, i0, 0), tile_row(g, i0, 1)};
	const char *dp = g->a_u8 ? "tdpbusd" : "tdpbsud"; /* A's signedness, then B's */
	for (int h = 0; h < 2; h++) {
		LLVMBasicBlockRef join = h ? if_begin(g, LLVMBuildICmp(g->b, LLVMIntSGT, nr, c64(g, 32), ""))
		                           : NULL;
		for (int c = 0; c < 4; c++) {
			LLVMValueRef a[] = {treg(g, T_C + c)};
			tile_op(g, "tilezero", a, 1);
		}
		qloop lk;
		LLVMValueRef kc = loop_begin(g, &lk, c64(g, 0), kc_n, 1);
		for (int t = 0; t < 2; t++)
			load_a(g, t, r0[t], kc, tail, tb);
		for (int c = 0; c < 2; c++) {
			LLVMValueRef at = add(g, mul(g, kc, c64(g, 16 * gb)), c64(g, (int64_t)(2 * h + c) * 64));
			LLVMValueRef a[] = {treg(g, T_B + c), gep(g, L->i8, Bp, at), c64(g, gb)};
			tile_op(g, "tileloadd64", a, 3);
		}
		for (int r = 0; r < 2; r++)
			for (int c = 0; c < 2; c++) {
				LLVMValueRef a[] = {treg(g, T_C + 2 * r + c), treg(g, T_A + r), treg(g, T_B + c)};
				tile_op(g, dp, a, 3);
			}
		loop_end(g, &lk);
		for (int r = 0; r < 2; r++)
			for (int c = 0; c < 2; c++) {
				LLVMValueRef at = c64(g, (int64_t)r * 16 * gb + (2 * h + c) * 64);
				LLVMValueRef a[] = {treg(g, T_C + 2 * r + c), gep(g, L->i8, ctile, at), c64(g, gb)};
				tile_op(g, "tilestored64", a, 3);
			}
		if (h)
			if_end(g, join);
	}
	/* row m = i0 + i of tile t = i / 16 is row m - r0[t] of that tile */
	qloop li;
	LLVMValueRef i = loop_begin(g, &li, c64(g, 0), c64(g, AMX_MR), 1), m = add(g, i0, i);
	LLVMBasicBlockRef join = if_begin(g, lt(g, m, m1));
	LLVMValueRef second = LLVMBuildICmp(g->b, LLVMIntSGE, i, c64(g, 16), "");
	LLVMValueRef crow = add(g, LLVMBuildSelect(g->b, second, c64(g, 16), c64(g, 0), ""),
	                        sub(g, m, LLVMBuildSelect(g->b, second, r0[1], r0[0], "")));
	LLVMValueRef acc[8], r = g->zp ? load(g, L->i32, gep(g, L->i32, ra, sub(g, m, m0)), 4) : NULL;
	LLVMValueRef row = gep(g, L->i8, ctile, mul(g, crow, c64(g, gb)));
	for (int v = 0; v < g->NV; v++)
		acc[v] = cast_ptr(g, gep(g, L->i8, row, c64(g, (int64_t)v * 64)),
		                  LLVMPointerType(g->vi32, 0));
	epilogue_row(g, pn, acc, m, r, j0);
	if_end(g, join);
	loop_end(g, &li);
}

/* ---- the work items and the entry ------------------------------------------- */

static void param_types(qgen *g, LLVMTypeRef *t)
{
	cg_llvm *L = g->L;
	LLVMTypeRef tys[Q_ARGS] = {
		[Q_X] = g->xp, [Q_M] = L->i64, [Q_N] = L->i64, [Q_K] = L->i64,
		[Q_A] = g->i8p, [Q_ARS] = L->i64, [Q_B] = g->i8p, [Q_BRS] = L->i64,
		[Q_BROWS] = LLVMPointerType(L->i64, 0),
		[Q_C] = g->i8p, [Q_CRS] = L->i64, [Q_ZA] = g->i8p, [Q_ZAS] = L->i64,
		[Q_ZB] = g->i8p, [Q_ZBS] = L->i64, [Q_BIAS] = g->i32p, [Q_BAXIS] = L->i32,
		[Q_SCALE] = g->f32p, [Q_SAXIS] = L->i32, [Q_CZ] = g->i8p, [Q_LO] = L->f32,
		[Q_HI] = L->f32, [Q_RB] = L->i64, [Q_NPAN] = L->i64,
	};
	memcpy(t, tys, sizeof tys);
}

static LLVMValueRef function(qgen *g, const char *name, LLVMTypeRef *params, unsigned n)
{
	return g->fn = cg_llvm_helper_fn(g->L, g->b, name, params, n, g->W * 32);
}

/* <name>_range(x, begin, end): items [begin, end), the arguments in the
 * block at x->buf; item t is row block t / npan, column panel t % npan, so
 * a thread's consecutive items share their rows of A, whose sums it then
 * computes once. */
static LLVMValueRef emit_range(qgen *g, const char *name, bool amx)
{
	cg_llvm *L = g->L;
	LLVMTypeRef t[] = {g->xp, L->i64, L->i64};
	LLVMValueRef fn = function(g, name, t, 3), *p = g->p;
	LLVMValueRef x = LLVMGetParam(fn, 0), begin = LLVMGetParam(fn, 1), end = LLVMGetParam(fn, 2);
	LLVMValueRef bp = LLVMBuildStructGEP2(g->b, g->xty, x, 0, "");
	LLVMValueRef args = LLVMBuildLoad2(g->b, LLVMStructGetTypeAtIndex(g->xty, 0), bp, "");
	args = cast_ptr(g, args, LLVMPointerType(g->argty, 0));
	p[Q_X] = x;
	for (int i = 1; i < Q_ARGS; i++)
		p[i] = LLVMBuildLoad2(g->b, LLVMStructGetTypeAtIndex(g->argty, (unsigned)i),
		                      LLVMBuildStructGEP2(g->b, g->argty, args, (unsigned)i, ""), "");
	LLVMValueRef scratch = LLVMBuildLoad2(g->b, LLVMStructGetTypeAtIndex(g->xty, 3),
	                                      LLVMBuildStructGEP2(g->b, g->xty, x, 3, ""), "");
	LLVMValueRef Bp = cast_ptr(g, scratch, g->i8p);
	/* the scratch: the packed panel, its column sums, A's row sums; for
	 * AMX whole steps of 64 k packed, then the C tiles and A's tail rows */
	LLVMValueRef k4 = amx ? mul(g, LLVMBuildSDiv(g->b, add(g, p[Q_K], c64(g, 63)), c64(g, 64), ""),
	                            c64(g, 16))
	                      : LLVMBuildSDiv(g->b, add(g, p[Q_K], c64(g, 3)), c64(g, 4), "");
	LLVMValueRef cb = cast_ptr(g, gep(g, L->i8, Bp, mul(g, k4, c64(g, 4 * g->NR))), g->i32p);
	LLVMValueRef ra = gep(g, L->i32, cb, c64(g, g->NR));
	LLVMValueRef ctile = cast_ptr(g, gep(g, L->i32, ra, c64(g, AMX_ROWS_SERIAL)), g->i8p);
	LLVMValueRef tail = gep(g, L->i8, ctile, c64(g, (int64_t)AMX_MR * 4 * g->NR));
	epilogue_consts(g);
	if (amx) { /* this thread's tile configuration: 8 tiles of 16 rows of 64 bytes */
		LLVMValueRef a[] = {cast_ptr(g, g->tcfg, g->i8p)};
		tile_op(g, "ldtilecfg", a, 1);
	}
	LLVMValueRef need_ra = g->flip ? LLVMConstInt(L->i1, 1, 0) : not_null(g, p[Q_ZB]);
	LLVMValueRef last_rb = local(g, L->i64, NULL);
	LLVMBuildStore(g->b, c64(g, -1), last_rb);
	qloop lt_, li;
	LLVMValueRef it = loop_begin(g, &lt_, begin, end, 1);
	LLVMValueRef rb = LLVMBuildSDiv(g->b, it, p[Q_NPAN], ""), pi = LLVMBuildSRem(g->b, it, p[Q_NPAN], "");
	LLVMValueRef j0 = mul(g, pi, c64(g, g->NR)), nr = smin(g, c64(g, g->NR), sub(g, p[Q_N], j0));
	LLVMValueRef m0 = mul(g, rb, p[Q_RB]), m1 = smin(g, p[Q_M], add(g, m0, p[Q_RB]));
	/* the panel: B from its first column */
	LLVMValueRef B0 = p[Q_B];
	p[Q_B] = gep(g, L->i8, B0, j0);
	pack_panel(g, Bp, cb, nr, k4);
	p[Q_B] = B0;
	LLVMValueRef new_rows = LLVMBuildICmp(g->b, LLVMIntNE, rb, LLVMBuildLoad2(g->b, L->i64, last_rb, ""), "");
	LLVMValueRef tb = amx ? tile_row(g, m0, 0) : NULL;
	LLVMBasicBlockRef join = if_begin(g, new_rows);
	LLVMBasicBlockRef sums = if_begin(g, need_ra);
	row_sums(g, ra, m0, m1);
	if_end(g, sums);
	if (amx)
		copy_tail(g, tail, tb, m1);
	LLVMBuildStore(g->b, rb, last_rb);
	if_end(g, join);
	panel pn;
	panel_vectors(g, &pn, j0, nr, cb);
	/* the tiles three times: with zero point terms; without (most quantized
	 * models' convs: weights symmetric, x's zero point folded into the
	 * bias); without them and with a bias and scale per row or none (those
	 * convs again: an add and a multiply per vector fewer) */
	LLVMValueRef live = LLVMBuildOr(g->b, not_null(g, p[Q_ZA]), not_null(g, p[Q_ZB]), "");
	LLVMValueRef rows = LLVMBuildAnd(g->b,
		LLVMBuildICmp(g->b, LLVMIntNE, p[Q_BAXIS], c32(g, 1), ""),
		LLVMBuildOr(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, p[Q_SAXIS], c32(g, 2), ""),
		            LLVMBuildICmp(g->b, LLVMIntEQ, p[Q_SAXIS], c32(g, 0), ""), ""), "");
	LLVMBasicBlockRef v[3] = {block(g, "zp"), block(g, "nozp"), block(g, "rows")};
	LLVMBasicBlockRef nozp = block(g, "nozp?"), tiled = block(g, "tiled");
	LLVMBuildCondBr(g->b, g->flip ? LLVMConstInt(L->i1, 1, 0) : live, v[0], nozp);
	LLVMPositionBuilderAtEnd(g->b, nozp);
	LLVMBuildCondBr(g->b, rows, v[2], v[1]);
	for (int z = 0; z < 3; z++) { /* with the flip only the first runs (folded away) */
		LLVMPositionBuilderAtEnd(g->b, v[z]);
		g->zp = z == 0, g->rows_only = z == 2;
		LLVMValueRef i0 = loop_begin(g, &li, m0, m1, amx ? AMX_MR : g->MR);
		if (amx)
			amx_tile(g, &pn, Bp, i0, m0, m1, ra, j0, nr, ctile, tail, tb);
		else
			tile(g, &pn, Bp, i0, m0, m1, ra, j0);
		loop_end(g, &li);
		LLVMBuildBr(g->b, tiled);
	}
	LLVMPositionBuilderAtEnd(g->b, tiled);
	loop_end(g, &lt_);
	if (amx)
		tile_op(g, "tilerelease", NULL, 0);
	LLVMBuildRetVoid(g->b);
	return fn;
}

static const char *dt_tag(kiln_dtype dt)
{
	return dt == KILN_U8 ? "u8" : dt == KILN_I8 ? "i8" : dt == KILN_I32 ? "i32" : "f32";
}

/* The entry: the items over the pool or in one call, of range_amx (NULL:
 * none) when the process may use AMX tiles (rt_amx_ready), else range. */
static LLVMValueRef emit_entry(qgen *g, const char *name, LLVMValueRef range,
                               LLVMValueRef range_amx)
{
	cg_llvm *L = g->L;
	LLVMTypeRef t[Q_ARGS];
	param_types(g, t);
	LLVMValueRef fn = function(g, name, t, Q_COUNT), *p = g->p;
	for (int i = 0; i < Q_COUNT; i++)
		p[i] = LLVMGetParam(fn, (unsigned)i);
	LLVMValueRef zero = c64(g, 0);
	LLVMValueRef empty = LLVMBuildOr(g->b, LLVMBuildICmp(g->b, LLVMIntSLE, p[Q_M], zero, ""),
	                                 LLVMBuildICmp(g->b, LLVMIntSLE, p[Q_N], zero, ""), "");
	LLVMBasicBlockRef ret = block(g, "ret"), go = block(g, "go");
	LLVMBuildCondBr(g->b, empty, ret, go);
	LLVMPositionBuilderAtEnd(g->b, ret);
	LLVMBuildRetVoid(g->b);
	LLVMPositionBuilderAtEnd(g->b, go);
	LLVMValueRef pool = LLVMBuildLoad2(g->b, LLVMStructGetTypeAtIndex(g->xty, 2),
	                                   LLVMBuildStructGEP2(g->b, g->xty, p[Q_X], 2, ""), "");
	LLVMValueRef work = mul(g, mul(g, p[Q_M], p[Q_N]), p[Q_K]);
	LLVMValueRef par = LLVMBuildAnd(g->b, not_null(g, pool),
	                                LLVMBuildICmp(g->b, LLVMIntSGE, work, c64(g, QPAR_WORK), ""), "");
	LLVMValueRef RB = LLVMBuildSelect(g->b, par, c64(g, (int64_t)g->MR * ROWS_PAR),
	                                  c64(g, (int64_t)g->MR * ROWS_SERIAL), "");
	LLVMValueRef fnp = range;
	if (range_amx) {
		LLVMTypeRef rt = LLVMFunctionType(L->i32, NULL, 0, 0);
		LLVMValueRef ready = call(g, cg_llvm_runtime_fn(L, "rt_amx_ready", rt), NULL, 0);
		LLVMValueRef big = LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntSGE, p[Q_K], c64(g, AMX_MIN_K), ""),
		                                LLVMBuildICmp(g->b, LLVMIntSGE, p[Q_M], c64(g, 16), ""), "");
		LLVMValueRef on = LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntNE, ready, c32(g, 0), ""),
		                               big, "");
		RB = LLVMBuildSelect(g->b, on, LLVMBuildSelect(g->b, par, c64(g, AMX_ROWS_PAR),
		                                               c64(g, AMX_ROWS_SERIAL), ""), RB, "");
		fnp = LLVMBuildSelect(g->b, on, range_amx, range, "");
	}
	LLVMValueRef nrb = LLVMBuildSDiv(g->b, add(g, p[Q_M], sub(g, RB, c64(g, 1))), RB, "");
	LLVMValueRef npan = LLVMBuildSDiv(g->b, add(g, p[Q_N], c64(g, g->NR - 1)), c64(g, g->NR), "");
	LLVMValueRef args = local(g, g->argty, NULL);
	p[Q_RB] = RB, p[Q_NPAN] = npan;
	for (int i = 1; i < Q_ARGS; i++)
		LLVMBuildStore(g->b, p[i], LLVMBuildStructGEP2(g->b, g->argty, args, (unsigned)i, ""));
	/* *x with buf pointing at the arguments (128 bytes: a runtime whose
	 * rt_exec grows stays in bounds) */
	LLVMValueRef copy = local(g, LLVMArrayType(L->i64, 16), NULL);
	LLVMBuildStore(g->b, LLVMConstNull(LLVMArrayType(L->i64, 16)), copy);
	LLVMValueRef cx = cast_ptr(g, copy, g->xp);
	LLVMBuildStore(g->b, LLVMBuildLoad2(g->b, g->xty, p[Q_X], ""), cx);
	LLVMBuildStore(g->b, cast_ptr(g, args, LLVMStructGetTypeAtIndex(g->xty, 0)),
	               LLVMBuildStructGEP2(g->b, g->xty, cx, 0, ""));
	LLVMValueRef items = mul(g, npan, nrb);
	LLVMBasicBlockRef split = block(g, "split"), serial = block(g, "serial");
	LLVMBuildCondBr(g->b, par, split, serial);
	LLVMPositionBuilderAtEnd(g->b, split);
	LLVMTypeRef pt[3];
	LLVMGetParamTypes(LLVMGlobalGetValueType(L->par_for), pt);
	LLVMValueRef a[] = {LLVMBuildPointerCast(g->b, cx, pt[0], ""), items,
	                    LLVMBuildPointerCast(g->b, fnp, pt[2], "")};
	call(g, L->par_for, a, 3);
	LLVMBuildRetVoid(g->b);
	LLVMPositionBuilderAtEnd(g->b, serial);
	LLVMValueRef r[] = {cx, zero, items};
	LLVMBuildCall2(g->b, LLVMGlobalGetValueType(range), fnp, r, 3, "");
	LLVMBuildRetVoid(g->b);
	return fn;
}

/* The target's dot-product instruction for W lanes, or NULL. */
static LLVMValueRef vnni(qgen *g)
{
	const cg_target *t = g->L->t;
	if (!t || !t->vnni_bits)
		return NULL;
	const char *name = g->W == 16 && t->vnni_bits >= 512 ? "llvm.x86.avx512.vpdpbusd.512"
	                 : g->W == 8 ? "llvm.x86.avx512.vpdpbusd.256"
	                 : g->W == 4 ? "llvm.x86.avx512.vpdpbusd.128" : NULL;
	return name ? intrinsic(g, name, NULL, 0) : NULL;
}

int cg_qgemm_spec(kiln_dtype a, kiln_dtype b, kiln_dtype c)
{
	if ((a != KILN_U8 && a != KILN_I8) || (b != KILN_U8 && b != KILN_I8))
		return -1;
	int ci = c == KILN_U8 ? 0 : c == KILN_I8 ? 1 : c == KILN_I32 ? 2 : c == KILN_F32 ? 3 : -1;
	return ci < 0 ? -1 : ((a == KILN_U8) * 2 + (b == KILN_U8)) * 4 + ci;
}

LLVMValueRef cg_llvm_qgemm(cg_llvm *L, kiln_dtype a, kiln_dtype b, kiln_dtype c)
{
	int spec = cg_qgemm_spec(a, b, c);
	if (spec < 0)
		return NULL;
	if (L->qgemm[spec])
		return L->qgemm[spec];
	qgen g = {.L = L, .b = LLVMCreateBuilderInContext(L->ctx), .a_u8 = a == KILN_U8,
	          .b_u8 = b == KILN_U8, .c_dt = c};
	int bits = L->t && L->t->vec_bits >= 128 ? L->t->vec_bits : 128;
	g.W = bits / 32;
	g.NV = g.W >= 16 ? 4 : 2;
	g.MR = g.W >= 8 ? 6 : 4;
	g.NR = g.NV * g.W;
	g.flip = g.a_u8 == g.b_u8;
	g.b_delta = !g.flip ? 0 : g.b_u8 ? -128 : 128;
	g.i8p = L->ptr;
	g.i32p = LLVMPointerType(L->i32, 0);
	g.f32p = LLVMPointerType(L->f32, 0);
	g.vi32 = LLVMVectorType(L->i32, (unsigned)g.W);
	g.vf = LLVMVectorType(L->f32, (unsigned)g.W);
	g.vi1 = LLVMVectorType(L->i1, (unsigned)g.W);
	LLVMTypeRef xf[] = {LLVMPointerType(L->ptr, 0), LLVMPointerType(L->i64, 0), L->ptr,
	                    g.f32p, L->i64};
	g.xty = L->exec_ty ? L->exec_ty : LLVMStructTypeInContext(L->ctx, xf, 5, 0);
	g.xp = LLVMPointerType(g.xty, 0);
	LLVMTypeRef at[Q_ARGS];
	param_types(&g, at);
	g.argty = LLVMStructTypeInContext(L->ctx, at, Q_ARGS, 0);
	g.dot = vnni(&g);
	/* x86 only: W = 16 where the target has AVX-512, 8 with AVX */
	if (L->t && L->t->triple && strncmp(L->t->triple, "x86_64", 6) == 0 && g.W >= 8)
		g.cvt = intrinsic(&g, g.W == 16 ? "llvm.x86.avx512.mask.cvtps2dq.512"
		                                : "llvm.x86.avx.cvt.ps2dq.256", NULL, 0);
	LLVMTypeRef zt = LLVMArrayType(L->i8, 64);
	g.zeros = LLVMAddGlobal(L->mod, zt, "kiln_qgemm_zeros");
	LLVMSetInitializer(g.zeros, LLVMConstNull(zt));
	LLVMSetAlignment(g.zeros, 64);
	LLVMSetGlobalConstant(g.zeros, 1);
	LLVMSetLinkage(g.zeros, LLVMInternalLinkage);
	g.amx = L->t && L->t->amx && g.W == 16 && g.NV == 4 && g.dot;
	if (g.amx) { /* palette 1; per tile: bytes per row (u16 at 16 + 2t), rows (48 + t) */
		uint8_t cfg[64] = {1};
		for (int t = 0; t < 8; t++)
			cfg[16 + 2 * t] = 64, cfg[48 + t] = 16;
		LLVMValueRef cv = LLVMConstStringInContext(L->ctx, (const char *)cfg, 64, 1);
		g.tcfg = LLVMAddGlobal(L->mod, LLVMTypeOf(cv), "kiln_qgemm_tilecfg");
		LLVMSetInitializer(g.tcfg, cv);
		LLVMSetAlignment(g.tcfg, 64);
		LLVMSetGlobalConstant(g.tcfg, 1);
		LLVMSetLinkage(g.tcfg, LLVMInternalLinkage);
	}
	if (!L->par_for) {
		LLVMTypeRef rt[] = {g.xp, L->i64, L->i64};
		LLVMTypeRef rfn = LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), rt, 3, 0);
		LLVMTypeRef pt[] = {g.xp, L->i64, LLVMPointerType(rfn, 0)};
		L->par_for = cg_llvm_runtime_fn(L, "rt_parallel_for",
		    LLVMFunctionType(LLVMVoidTypeInContext(L->ctx), pt, 3, 0));
	}
	char name[64], rname[72];
	snprintf(name, sizeof name, "kiln_qgemm_%s%s_%s", dt_tag(a), dt_tag(b), dt_tag(c));
	snprintf(rname, sizeof rname, "%s_range", name);
	LLVMValueRef range = emit_range(&g, rname, false), range_amx = NULL;
	if (g.amx) {
		snprintf(rname, sizeof rname, "%s_amx", name);
		range_amx = emit_range(&g, rname, true);
	}
	L->qgemm[spec] = emit_entry(&g, name, range, range_amx);
	LLVMDisposeBuilder(g.b);
	return L->qgemm[spec];
}

uint64_t cg_qgemm_scratch_bytes(const cg_target *t)
{
	int bits = t && t->vec_bits >= 128 ? t->vec_bits : 128, W = bits / 32;
	int64_t NR = (W >= 16 ? 4 : 2) * W, MR = W >= 8 ? 6 : 4;
	uint64_t vnni = (uint64_t)((CG_QGEMM_MAX_K + 3) / 4 * 4 * NR + NR * 4 + MR * ROWS_SERIAL * 4);
	/* emit_range's AMX layout: the ctile and tail after AMX_ROWS_SERIAL row sums */
	uint64_t amx = (uint64_t)((CG_QGEMM_MAX_K + 63) / 64 * 16 * 4 * NR + NR * 4 +
	                          AMX_ROWS_SERIAL * 4 + AMX_MR * 4 * NR + AMX_TAIL);
	return t && t->amx && vnni < amx ? amx : vnni;
}
