/*
 * lower_nn.c: lowerings of the neural-network ops: MatMul and Gemm,
 * convolutions, pooling, normalisation, softmax, dropout and losses.
 *
 * Matrix products in f32 become one CG_GEMM each, transposes and batch
 * broadcasts being strides (a broadcast batch has stride 0, and a batch of
 * row-major matrices times one shared matrix folds into a single taller
 * GEMM).  Conv in f32 is im2col into a kernel-private buffer then a GEMM
 * per image (W[M, C*k] x col[C*k, OH*OW], bias per row), a grouped conv
 * with wide groups one GEMM per group over the same columns, one with
 * narrow groups (ResNeXt, RegNet) a direct register-blocked kernel over
 * zero-padded phase planes (conv_grouped); a 1x1, stride-1, unpadded conv
 * is a GEMM straight on the input, and a 3x3 stride-1 conv may be Winograd
 * (lower_wino.c; cg_lower_conv asks its cost model).  Depthwise convs
 * have their own vector kernel.  ConvTranspose and non-f32 convs are direct loop nests
 * that accumulate into the output tap by tap, so the innermost loop walks
 * contiguous output pixels.  Padding never reads memory: taps outside the
 * input load from a clamped index and are masked with a select.
 *
 * Reductions (norms, softmax, losses) accumulate in locals in double-safe
 * orders: max, then the sum of exp(x - max), then normalise.  Loops marked
 * CG_PARALLEL are always direct children of the kernel body and read no
 * local assigned outside them (see codegen.h).
 */
#include <math.h>
#include <string.h>

#include "codegen/lower.h"

static cg_expr *I(cg_module *m, int64_t v)
{
	return cg_int(m, v);
}

static cg_expr *add(cg_module *m, cg_expr *a, cg_expr *b)
{
	return cg_bin(m, CG_ADD, a, b);
}

static cg_expr *mul(cg_module *m, cg_expr *a, cg_expr *b)
{
	return cg_bin(m, CG_MUL, a, b);
}

static cg_expr *fc(cg_module *m, kiln_dtype dt, double v)
{
	return cg_const(m, dt, v);
}

static kiln_status nomem(const cg_module *m, const ir_node *n, kiln_error *err)
{
	return cg_lower_fail(m, n, err, KILN_ENOMEM, "out of memory");
}

/* ---- MatMul and Gemm ------------------------------------------------------ */

/* Batch dims of y broadcast from a's and b's: nest extents and, per
 * operand, the batch stride in whole matrices. */
typedef struct mm_batch {
	int n;
	cg_expr *ext[KILN_MAX_RANK], *sa[KILN_MAX_RANK], *sb[KILN_MAX_RANK], *sy[KILN_MAX_RANK];
} mm_batch;

static void mm_groups(cg_module *m, const ir_type *a, const ir_type *b, const ir_type *y,
                      int nb, mm_batch *g)
{
	ir_type ab = {a->dtype, a->rank > 1 ? a->rank - 2 : 0, {0}};
	ir_type bb = {b->dtype, b->rank > 1 ? b->rank - 2 : 0, {0}};
	ir_type yb = {y->dtype, nb, {0}};
	memcpy(ab.dim, a->dim, ab.rank * sizeof(int64_t));
	memcpy(bb.dim, b->dim, bb.rank * sizeof(int64_t));
	memcpy(yb.dim, y->dim, nb * sizeof(int64_t));
	g->n = 0;
	bool pa = false, pb = false;
	for (int d = 0; d < nb; d++) {
		if (yb.dim[d] == 1)
			continue;
		int ja = d - (nb - ab.rank), jb = d - (nb - bb.rank);
		bool ca = ja >= 0 && ab.dim[ja] != 1, cb = jb >= 0 && bb.dim[jb] != 1;
		if (g->n && ca == pa && cb == pb)
			g->ext[g->n - 1] = mul(m, g->ext[g->n - 1], cg_dim(m, yb.dim[d]));
		else
			g->ext[g->n++] = cg_dim(m, yb.dim[d]);
		g->sa[g->n - 1] = ca ? cg_stride(m, &ab, ja) : I(m, 0);
		g->sb[g->n - 1] = cb ? cg_stride(m, &bb, jb) : I(m, 0);
		g->sy[g->n - 1] = cg_stride(m, &yb, d);
		pa = ca, pb = cb;
	}
}

static bool is_zero(const cg_expr *e)
{
	return e && e->kind == CG_CONST && e->i == 0;
}

/* An integer matmul's extras: zero points (buffers, -1 when absent: one
 * value, or per row of A / per column of B) and, for QLinearMatMul, its
 * inputs, whose scales and y_zero_point requantize the sums. */
typedef struct mm_int {
	int az, bz;
	const int *q;
} mm_int;

static cg_gemm_vec qvec(cg_module *m, int buf, cg_expr *off, int axis);
static int live_zp(const cg_module *m, int z);
static int folded_bias(cg_module *m, int w, int wz, int xz, int bias, int64_t M, int64_t K,
                       int64_t si, int64_t sk);

/* Whether buffer b (-1: none) holds more than one value */
static bool is_vector(cg_module *m, int b)
{
	const ir_type *t = b >= 0 ? cg_btype(m, b) : NULL;
	return t && t->rank > 0 && t->dim[0] != 1;
}

static bool grid_target(const cg_module *m);

/* Work per matrix below which a batch of f32 GEMMs goes over the threads
 * by matrices: the LLVM GEMM splits one only from 2^21 multiply-adds
 * (llvm_gemm.c's PAR_WORK), so attention's per-head products (64 x 64 x
 * 64, batch x heads of them) ran on one thread. */
enum { MM_SMALL_WORK = 1 << 21 };

/* One GEMM, inside loops over all but the innermost batch group (over all
 * of them, the outermost parallel, when each product is small): f32, or
 * with z an 8-bit one (zero points, and for QLinearMatMul the multiplier
 * buffer mult per row or column of C and y's zero point). */
static kiln_status matmul_gemm(cg_module *m, const ir_node *n, const int *in, int out,
                               cg_expr *M, cg_expr *N, cg_expr *K, mm_batch *g, bool a1,
                               const mm_int *z, int mult, kiln_error *err)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	cg_expr *mk = mul(m, M, K), *kn = mul(m, K, N), *mn = mul(m, M, N), *iv[KILN_MAX_RANK];
	bool mult_rows = z && z->q && is_vector(m, z->q[1]);
	bool per_row = z && (is_vector(m, z->az) || mult_rows);
	/* a stack of row-major matrices times one shared B: a single taller GEMM
	 * (unless something is per row of one matrix) */
	if (g->n == 1 && is_zero(g->sb[0]) && !is_zero(g->sa[0]) && !a1 && !per_row) {
		M = mul(m, M, g->ext[0]);
		g->n = 0;
	}
	bool each = !z && g->n > 0 && !grid_target(m) && M->kind == CG_CONST &&
	            N->kind == CG_CONST && K->kind == CG_CONST &&
	            M->i * N->i * K->i < MM_SMALL_WORK;
	int loops = g->n ? (each ? g->n : g->n - 1) : 0;
	uint32_t hints[KILN_MAX_RANK] = {0};
	if (each) {
		cg_expr *w = I(m, M->i * N->i * K->i);
		for (int d = 0; d < g->n; d++)
			w = mul(m, w, g->ext[d]);
		hints[0] = cg_par(m, w);
	}
	cg_stmt *body = cg_nest(m, k, k->body, loops, g->ext, each ? hints : NULL, iv);
	cg_expr *oa = I(m, 0), *ob = I(m, 0), *oy = I(m, 0);
	for (int d = 0; d < loops; d++) {
		oa = add(m, oa, mul(m, iv[d], mul(m, g->sa[d], mk)));
		ob = add(m, ob, mul(m, iv[d], mul(m, g->sb[d], kn)));
		oy = add(m, oy, mul(m, iv[d], mul(m, g->sy[d], mn)));
	}
	bool bat = g->n > 0 && !each;
	cg_gemm gm = {.a = in[0], .b = in[1], .c = out, .bias = -1, .M = M, .N = N, .K = K,
	              .batch = bat ? g->ext[g->n - 1] : I(m, 1),
	              .a_off = oa, .a_bs = bat ? mul(m, g->sa[g->n - 1], mk) : I(m, 0),
	              .a_rs = K, .a_cs = I(m, 1),
	              .b_off = ob, .b_bs = bat ? mul(m, g->sb[g->n - 1], kn) : I(m, 0),
	              .b_rs = N, .b_cs = I(m, 1),
	              .c_off = oy, .c_bs = bat ? mul(m, g->sy[g->n - 1], mn) : I(m, 0), .c_rs = N,
	              .bias_off = I(m, 0), .alpha = 1, .beta = 0};
	if (z) {
		gm.acc_dt = KILN_I32;
		gm.a_zero = qvec(m, z->az, I(m, 0), CG_AXIS_ROW);
		gm.b_zero = qvec(m, z->bz, I(m, 0), CG_AXIS_COL);
		/* a constant B (the weights): A's zero point into a column bias */
		const ir_type *bt = cg_btype(m, in[1]);
		int64_t kc = K->kind == CG_CONST ? K->i : 0, nc = N->kind == CG_CONST ? N->i : 0;
		int fb = z->az >= 0 && bt->rank == 2 && kc > 0 && nc > 0
		         ? folded_bias(m, in[1], z->bz, z->az, -1, nc, kc, 1, nc) : -1;
		if (fb >= 0)
			gm.a_zero = qvec(m, -1, NULL, 0), gm.bias = fb, gm.bias_axis = 1;
		if (z->q) {
			gm.c_zero = qvec(m, z->q[7], I(m, 0), CG_AXIS_ALL);
			gm.scale = qvec(m, mult, I(m, 0), mult_rows ? CG_AXIS_ROW : CG_AXIS_COL);
		}
	}
	cg_append(m, body, cg_gemm_stmt(m, &gm));
	return body && body->n ? KILN_OK : nomem(m, n, err);
}

/* ---- quantized arithmetic ---------------------------------------------------- */

/* Element idx of a scale or zero point buffer that holds one value (read
 * at 0) or a vector (read at idx). */
static cg_expr *qv(cg_module *m, int buf, cg_expr *idx)
{
	const ir_type *t = cg_btype(m, buf);
	bool one = t->rank == 0 || t->dim[0] == 1;
	return cg_ld(m, buf, one ? I(m, 0) : idx);
}

/* v - zero point z (buffer, -1: none; read at idx), in i32. */
static cg_expr *minus_zp(cg_module *m, cg_expr *v, int z, cg_expr *idx)
{
	v = cg_cast(m, v, KILN_I32);
	return z < 0 ? v : cg_bin(m, CG_SUB, v, cg_cast(m, qv(m, z, idx), KILN_I32));
}

/* rint(acc * (xs * ws / ys)) + yz, which the store into the u8 or i8
 * result saturates: the multiplier in f32, the product in f64, exactly as
 * the interpreter (ir/interp_quant.c). */
static cg_expr *requant(cg_module *m, cg_expr *acc, cg_expr *xs, cg_expr *ws, cg_expr *ys,
                        cg_expr *yz)
{
	cg_expr *mult = cg_bin(m, CG_DIV, mul(m, xs, ws), ys);
	cg_expr *v = cg_un(m, CG_ROUND, mul(m, cg_cast(m, acc, KILN_F64), cg_cast(m, mult, KILN_F64)));
	return add(m, v, cg_cast(m, yz, KILN_F64));
}

/* Other dtypes: plain loops, accumulating in a local of the compute dtype
 * (integers wrap, as the interpreter's do); with z, the sums of
 * (a - a_zp)(b - b_zp) in i32. */
static kiln_status matmul_loops(cg_module *m, const ir_node *n, const int *in, int out,
                                cg_expr *M, cg_expr *N, cg_expr *K, mm_batch *g,
                                const mm_int *z, kiln_error *err)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	cg_expr *ext[KILN_MAX_RANK + 2], *iv[KILN_MAX_RANK + 3];
	uint32_t h[KILN_MAX_RANK + 2] = {0};
	memcpy(ext, g->ext, g->n * sizeof *ext);
	ext[g->n] = M, ext[g->n + 1] = N;
	h[0] = cg_par(m, mul(m, m->buf[out].numel, K));
	cg_stmt *body = cg_nest(m, k, k->body, g->n + 2, ext, h, iv), *kb;
	cg_expr *oa = I(m, 0), *ob = I(m, 0), *oy = I(m, 0), *i = iv[g->n], *j = iv[g->n + 1], *kk;
	for (int d = 0; d < g->n; d++) {
		oa = add(m, oa, mul(m, iv[d], mul(m, g->sa[d], mul(m, M, K))));
		ob = add(m, ob, mul(m, iv[d], mul(m, g->sb[d], mul(m, K, N))));
		oy = add(m, oy, mul(m, iv[d], mul(m, g->sy[d], mul(m, M, N))));
	}
	kiln_dtype ct = z ? KILN_I32 : cg_ctype(m->buf[out].dt);
	cg_expr *acc = cg_local(m, k, body, ct, fc(m, ct, 0));
	cg_append(m, body, cg_loop(m, k, K, CG_REDUCE, &kk, &kb));
	cg_expr *av = cg_ld(m, in[0], add(m, oa, add(m, mul(m, i, K), kk)));
	cg_expr *bv = cg_ld(m, in[1], add(m, ob, add(m, mul(m, kk, N), j)));
	if (z)
		av = minus_zp(m, av, z->az, i), bv = minus_zp(m, bv, z->bz, j);
	cg_set(m, kb, acc, add(m, acc, mul(m, av, bv)));
	cg_expr *v = acc;
	if (z && z->q)
		v = requant(m, acc, qv(m, z->q[1], i), qv(m, z->q[4], j), qv(m, z->q[6], I(m, 0)),
		            qv(m, z->q[7], I(m, 0)));
	cg_append(m, body, cg_st(m, out, add(m, oy, add(m, mul(m, i, N), j)), v));
	return KILN_OK;
}

static int multiplier(cg_module *m, const ir_node *n, int xs, int ws, int ys);

/* Whether an integer matmul is an 8-bit GEMM: 8-bit operands, a constant
 * depth within CG_QGEMM_MAX_K, and for QLinearMatMul a multiplier that is
 * per row or per column of C, not both (a_scale per row and b_scale per
 * column). */
static bool int8_matmul_ok(cg_module *m, const ir_type *a, const ir_type *b, cg_expr *K,
                           const mm_int *z)
{
	bool a8 = a->dtype == KILN_U8 || a->dtype == KILN_I8, b8 = b->dtype == KILN_U8 || b->dtype == KILN_I8;
	bool k = K->kind == CG_CONST && K->i <= CG_QGEMM_MAX_K;
	return a8 && b8 && k && !(z->q && is_vector(m, z->q[1]) && is_vector(m, z->q[4]));
}

/* a x b into y, MatMul's broadcasting: f32 as one GEMM, 8-bit integer
 * ones (z) as one 8-bit GEMM where int8_matmul_ok, else loops. */
static kiln_status matmul_of(cg_module *m, const ir_node *n, int ia, int ib, int iy,
                             const mm_int *z, kiln_error *err)
{
	const ir_type *a = cg_btype(m, ia), *b = cg_btype(m, ib), *y = cg_btype(m, iy);
	if (a->rank < 1 || b->rank < 1)
		return cg_lower_fail(m, n, err, KILN_ESHAPE, "MatMul of a scalar");
	bool a1 = a->rank == 1, b1 = b->rank == 1;
	cg_expr *M = a1 ? I(m, 1) : cg_dim(m, a->dim[a->rank - 2]);
	cg_expr *K = cg_dim(m, a->dim[a->rank - 1]);
	cg_expr *N = b1 ? I(m, 1) : cg_dim(m, b->dim[b->rank - 1]);
	mm_batch g;
	mm_groups(m, a, b, y, y->rank - !a1 - !b1, &g);
	int in[2] = {ia, ib};
	if (!z && a->dtype == KILN_F32 && b->dtype == KILN_F32)
		return matmul_gemm(m, n, in, iy, M, N, K, &g, a1, NULL, -1, err);
	if (z && int8_matmul_ok(m, a, b, K, z)) {
		int mult = -1;
		if (z->q && (mult = multiplier(m, n, z->q[1], z->q[4], z->q[6])) < 0)
			return nomem(m, n, err);
		return matmul_gemm(m, n, in, iy, M, N, K, &g, a1, z, mult, err);
	}
	return matmul_loops(m, n, in, iy, M, N, K, &g, z, err);
}

kiln_status cg_lower_matmul(cg_module *m, const ir_node *n, const int *in, const int *out,
                            kiln_error *err)
{
	return matmul_of(m, n, in[0], in[1], out[0], NULL, err);
}

kiln_status cg_lower_matmul_integer(cg_module *m, const ir_node *n, const int *in,
                                    const int *out, kiln_error *err)
{
	mm_int z = {live_zp(m, n->nin > 2 ? in[2] : -1), live_zp(m, n->nin > 3 ? in[3] : -1), NULL};
	return matmul_of(m, n, in[0], in[1], out[0], &z, err);
}

kiln_status cg_lower_qlinear_matmul(cg_module *m, const ir_node *n, const int *in,
                                    const int *out, kiln_error *err)
{
	mm_int z = {live_zp(m, in[2]), live_zp(m, in[5]), in};
	return matmul_of(m, n, in[0], in[3], out[0], &z, err);
}

static cg_expr *s_beta(cg_module *m, const ir_node *n, cg_expr *c, kiln_dtype ct)
{
	return mul(m, c, fc(m, ct, ir_attr_float(n, "beta", 1)));
}

/* y = beta * C broadcast to [M, N]: the GEMM then accumulates with beta 1. */
static kiln_status gemm_c_copy(cg_module *m, const ir_node *n, int c, int y, kiln_error *err)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	const ir_type *ct = cg_btype(m, c), *yt = cg_btype(m, y);
	cg_expr *ext[2] = {cg_dim(m, yt->dim[0]), cg_dim(m, yt->dim[1])}, *iv[2], *cs[2];
	for (int d = 0; d < 2; d++) {
		int j = d - (2 - ct->rank);
		cs[d] = j >= 0 && ct->dim[j] != 1 ? cg_stride(m, ct, j) : I(m, 0);
	}
	uint32_t h[2] = {cg_par(m, m->buf[y].numel), CG_VECTORIZE};
	cg_stmt *body = cg_nest(m, k, k->body, 2, ext, h, iv);
	cg_expr *v = cg_ld(m, c, add(m, mul(m, iv[0], cs[0]), mul(m, iv[1], cs[1])));
	cg_append(m, body, cg_st(m, y, add(m, mul(m, iv[0], ext[1]), iv[1]),
	                         s_beta(m, n, v, cg_ctype(m->buf[y].dt))));
	return KILN_OK;
}

/* Gemm's C as a GEMM bias: 1 along N ([N] or [1,N]), 2 along M ([M,1]). */
static int bias_axis(const ir_type *c, int64_t M, int64_t N)
{
	if ((c->rank == 1 && c->dim[0] == N) || (c->rank == 2 && c->dim[0] == 1 && c->dim[1] == N))
		return 1;
	if (c->rank == 2 && c->dim[0] == M && c->dim[1] == 1)
		return 2;
	return 0;
}

static kiln_status gemm_loops(cg_module *m, const ir_node *n, const int *in, int y,
                              kiln_error *err);

kiln_status cg_lower_gemm(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err)
{
	const ir_type *a = cg_btype(m, in[0]), *b = cg_btype(m, in[1]);
	bool ta = ir_attr_int(n, "transA", 0), tb = ir_attr_int(n, "transB", 0);
	double alpha = ir_attr_float(n, "alpha", 1), beta = ir_attr_float(n, "beta", 1);
	int c = n->nin > 2 ? in[2] : -1;
	if (a->rank != 2 || b->rank != 2)
		return cg_lower_fail(m, n, err, KILN_ESHAPE, "Gemm needs 2-D A and B");
	if (a->dtype != KILN_F32)
		return gemm_loops(m, n, in, out[0], err);
	int64_t Md = a->dim[ta], Kd = a->dim[!ta], Nd = b->dim[!tb];
	cg_expr *M = cg_dim(m, Md), *K = cg_dim(m, Kd), *N = cg_dim(m, Nd);
	int axis = c >= 0 && beta == 1 ? bias_axis(cg_btype(m, c), Md, Nd) : 0;
	if (c >= 0 && beta != 0 && !axis) {
		kiln_status st = gemm_c_copy(m, n, c, out[0], err);
		if (st)
			return st;
	}
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	cg_gemm gm = {.a = in[0], .b = in[1], .c = out[0], .bias = axis ? c : -1,
	              .M = M, .N = N, .K = K, .batch = I(m, 1),
	              .a_off = I(m, 0), .a_bs = I(m, 0), .a_rs = ta ? I(m, 1) : K,
	              .a_cs = ta ? M : I(m, 1),
	              .b_off = I(m, 0), .b_bs = I(m, 0), .b_rs = tb ? I(m, 1) : N,
	              .b_cs = tb ? K : I(m, 1),
	              .c_off = I(m, 0), .c_bs = I(m, 0), .c_rs = N, .bias_off = I(m, 0),
	              .alpha = alpha, .beta = c >= 0 && beta != 0 && !axis ? 1 : 0,
	              .bias_axis = axis};
	cg_append(m, k->body, cg_gemm_stmt(m, &gm));
	return k->body->n ? KILN_OK : nomem(m, n, err);
}

static kiln_status gemm_loops(cg_module *m, const ir_node *n, const int *in, int y,
                              kiln_error *err)
{
	const ir_type *a = cg_btype(m, in[0]), *b = cg_btype(m, in[1]);
	bool ta = ir_attr_int(n, "transA", 0), tb = ir_attr_int(n, "transB", 0);
	kiln_dtype ct = cg_ctype(m->buf[y].dt);
	cg_expr *M = cg_dim(m, a->dim[ta]), *K = cg_dim(m, a->dim[!ta]), *N = cg_dim(m, b->dim[!tb]);
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	cg_expr *ext[2] = {M, N}, *iv[2], *kk;
	uint32_t h[2] = {cg_par(m, mul(m, m->buf[y].numel, K)), 0};
	cg_stmt *body = cg_nest(m, k, k->body, 2, ext, h, iv), *kb;
	cg_expr *acc = cg_local(m, k, body, ct, fc(m, ct, 0));
	cg_append(m, body, cg_loop(m, k, K, CG_REDUCE, &kk, &kb));
	cg_expr *ai = ta ? add(m, mul(m, kk, M), iv[0]) : add(m, mul(m, iv[0], K), kk);
	cg_expr *bi = tb ? add(m, mul(m, iv[1], K), kk) : add(m, mul(m, kk, N), iv[1]);
	cg_set(m, kb, acc, add(m, acc, mul(m, cg_ld(m, in[0], ai), cg_ld(m, in[1], bi))));
	cg_expr *v = mul(m, acc, fc(m, ct, ir_attr_float(n, "alpha", 1)));
	if (n->nin > 2) {
		const ir_type *c = cg_btype(m, in[2]);
		cg_expr *ci = I(m, 0);
		for (int d = 0; d < 2; d++) {
			int j = d - (2 - c->rank);
			if (j >= 0 && c->dim[j] != 1)
				ci = add(m, ci, mul(m, iv[d], cg_stride(m, c, j)));
		}
		v = add(m, v, s_beta(m, n, cg_ld(m, in[2], ci), ct));
	}
	cg_append(m, body, cg_st(m, y, add(m, mul(m, iv[0], N), iv[1]), v));
	return KILN_OK;
}

/* ---- convolution geometry ---------------------------------------------- */

typedef ir_conv_geom geom;

/* The interpreter's rule (ir_conv_geom_of), on fixed spatial dims. */
static kiln_status geometry(cg_module *m, const ir_node *n, const ir_type *x, const ir_type *y,
                            const int64_t *k, bool transpose, geom *g, kiln_error *err)
{
	switch (ir_conv_geom_of(n, x->rank, x->dim, y->rank, y->dim, k, transpose, g)) {
	case IR_GEOM_OK:
		return KILN_OK;
	case IR_GEOM_RANK:
		return cg_lower_fail(m, n, err, KILN_EUNSUPPORTED, "%d spatial dims", g->nsp);
	case IR_GEOM_ATTR:
		return cg_lower_fail(m, n, err, KILN_EINVAL, "spatial attribute of the wrong length");
	default:
		return cg_lower_fail(m, n, err, KILN_EUNSUPPORTED,
		                     "symbolic spatial dims or bad strides/kernel");
	}
}

/* Fixed channel dims (the batch alone may be symbolic). */
static bool fixed_channels(const ir_type *x, const ir_type *w, const ir_type *y)
{
	return x->dim[1] >= 0 && y->dim[1] >= 0 && w->dim[0] >= 0 && w->dim[1] >= 0;
}

/* Row-major linear index of coordinates c[0..nsp) in dims. */
static cg_expr *lin(cg_module *m, int nsp, cg_expr *const *c, const int64_t *dims)
{
	cg_expr *s = I(m, 0);
	for (int d = 0; d < nsp; d++)
		s = add(m, mul(m, s, I(m, dims[d])), c[d]);
	return s;
}

/* Input coordinate of output position o and tap t on each spatial dim,
 * clamped into the input; *valid says whether all were inside. */
static void taps(cg_module *m, const geom *g, cg_expr *const *o, cg_expr *const *t,
                 cg_expr **j, cg_expr **valid)
{
	*valid = cg_const(m, KILN_BOOL, 1);
	for (int d = 0; d < g->nsp; d++) {
		cg_expr *p = add(m, add(m, mul(m, o[d], I(m, g->stride[d])), mul(m, t[d], I(m, g->dil[d]))),
		                 I(m, -g->pad[d]));
		cg_expr *in = cg_bin(m, CG_AND, cg_bin(m, CG_GE, p, I(m, 0)),
		                     cg_bin(m, CG_LT, p, I(m, g->in[d])));
		*valid = cg_bin(m, CG_AND, *valid, in);
		j[d] = cg_clamp(m, p, I(m, g->in[d]));
	}
}

static void out_loops_hints(int nsp, uint32_t *h)
{
	for (int d = 0; d < nsp; d++)
		h[d] = d == nsp - 1 ? CG_VECTORIZE : 0;
}

/* ---- Conv ------------------------------------------------------------------- */

/* What an integer conv's GEMMs add to an f32 one's (NULL: f32): the
 * dtype of x (its im2col copy's), the padding value (x's zero point: a
 * padded tap then adds (zp - zp) * w = 0), the zero points of x, w and y
 * (-1: none) and the f32 requantization multiplier per output channel or
 * one value (-1: none, an i32 or f32 C of plain sums). */
typedef struct conv_int {
	kiln_dtype xdt;
	cg_expr *pad;
	int xz, wz, yz, mult;
} conv_int;

/* An epilogue operand from buffer buf (-1: none): one value (ALL) when the
 * buffer holds one, else per row or column (axis) from off. */
static cg_gemm_vec qvec(cg_module *m, int buf, cg_expr *off, int axis)
{
	if (buf < 0)
		return (cg_gemm_vec){.buf = -1, .axis = CG_AXIS_NONE};
	const ir_type *t = cg_btype(m, buf);
	bool one = t->rank == 0 || t->dim[0] == 1;
	return (cg_gemm_vec){.buf = buf, .off = one ? I(m, 0) : off, .axis = one ? CG_AXIS_ALL : axis};
}

/* gm as q's integer GEMM, its output channels from row0 (a group's first) */
static void int_gemm(cg_module *m, cg_gemm *gm, const conv_int *q, cg_expr *row0)
{
	if (!q)
		return;
	gm->acc_dt = KILN_I32;
	gm->a_zero = qvec(m, q->wz, row0, CG_AXIS_ROW);
	gm->b_zero = qvec(m, q->xz, I(m, 0), CG_AXIS_ALL);
	gm->c_zero = qvec(m, q->yz, I(m, 0), CG_AXIS_ALL);
	gm->scale = qvec(m, q->mult, row0, CG_AXIS_ROW);
}

static kiln_dtype col_dt(const conv_int *q)
{
	return q ? q->xdt : KILN_F32;
}

static cg_expr *pad_value(cg_module *m, const conv_int *q)
{
	return q ? q->pad : fc(m, KILN_F32, 0);
}

/* Whether conv g is a GEMM on x's pixels: 1x1 taps, no padding, and
 * either stride 1 (strided false) or, strided, any stride whose every
 * sampled pixel is inside x (conv_1x1 then gathers them first). */
static bool pointwise_geom(const geom *g, bool strided)
{
	for (int d = 0; d < g->nsp; d++) {
		if (g->k[d] != 1 || g->pad[d] != 0)
			return false;
		if (!strided && (g->stride[d] != 1 || g->pad_end[d] != 0 || g->in[d] != g->out[d]))
			return false;
		if (strided && (g->out[d] - 1) * g->stride[d] >= g->in[d])
			return false;
	}
	return true;
}

/* 1x1, no padding: y[b] = W[M, C] x x[b][C, HW] (+ bias per row).  With a
 * stride (a ResNet or RegNet block's downsampling shortcut) the pixels it
 * samples are first gathered into a scratch x'[b][C, OH*OW], one
 * vectorized pass over (image, channel) planes on the threads, and the
 * GEMM reads that: im2col's stride-2 path split whole input planes into
 * even and odd columns (rows it never reads included) and then copied
 * rows again, 3.3x ORT's NCHWc kernel on RegNetX's 32 -> 64 conv at
 * 112 -> 56 (0.26 against 0.079 ms). */
static kiln_status conv_1x1(cg_module *m, const ir_node *n, const int *in, int y, const geom *g,
                            const conv_int *q, kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *yt = cg_btype(m, y);
	int64_t C = x->dim[1], M = yt->dim[1], batch = x->dim[0];
	bool strided = !pointwise_geom(g, false);
	int src = in[0];
	int64_t bstride = C * g->isz, brow = g->isz;
	if (strided) { /* cg_lower_scratch may move m->buf: x and yt are dead after this */
		src = cg_lower_scratch(m, col_dt(q), mul(m, cg_dim(m, batch), I(m, C * g->osz)));
		if (src < 0)
			return nomem(m, n, err);
		bstride = C * g->osz, brow = g->osz;
	}
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	if (strided) {
		cg_expr *pc, *iv[3], *ext[3];
		uint32_t hints[3];
		cg_stmt *pb;
		cg_expr *planes = mul(m, cg_dim(m, batch), I(m, C));
		cg_append(m, k->body, cg_loop(m, k, planes, cg_par(m, mul(m, planes, I(m, g->osz))),
		                              &pc, &pb));
		for (int d = 0; d < g->nsp; d++) {
			ext[d] = I(m, g->out[d]);
			hints[d] = d == g->nsp - 1 ? CG_VECTORIZE : 0;
		}
		cg_stmt *ib = cg_nest(m, k, pb, g->nsp, ext, hints, iv);
		cg_expr *si = mul(m, pc, I(m, g->isz)), *di = mul(m, pc, I(m, g->osz));
		int64_t is = 1, os = 1;
		for (int d = g->nsp - 1; d >= 0; d--) {
			si = add(m, si, mul(m, iv[d], I(m, g->stride[d] * is)));
			di = add(m, di, mul(m, iv[d], I(m, os)));
			is *= g->in[d];
			os *= g->out[d];
		}
		cg_append(m, ib, cg_st(m, src, di, cg_ld(m, in[0], si)));
	}
	bool bias = n->nin > 2 && in[2] >= 0;
	/* one GEMM per image, the images over the threads (a batch of one
	 * runs inline, its GEMM then splitting its columns) */
	cg_expr *b;
	cg_stmt *gb;
	cg_append(m, k->body, cg_loop(m, k, cg_dim(m, batch), CG_PARALLEL, &b, &gb));
	cg_gemm gm = {.a = in[1], .b = src, .c = y, .bias = bias ? in[2] : -1,
	              .M = I(m, M), .N = I(m, g->osz), .K = I(m, C), .batch = I(m, 1),
	              .a_off = I(m, 0), .a_bs = I(m, 0), .a_rs = I(m, C), .a_cs = I(m, 1),
	              .b_off = mul(m, b, I(m, bstride)), .b_bs = I(m, 0), .b_rs = I(m, brow),
	              .b_cs = I(m, 1),
	              .c_off = mul(m, b, I(m, M * g->osz)), .c_bs = I(m, 0), .c_rs = I(m, g->osz),
	              .bias_off = I(m, 0), .alpha = 1, .beta = 0, .bias_axis = bias ? 2 : 0,
	              /* see cg_conv_blocked_ok, cg_conv_reads_blocked_ok */
	              .b_block = cg_buf_block(m, src), .c_block = m->buf[y].block};
	if (strided && cg_buf_block(m, in[0]))
		return cg_lower_fail(m, n, err, KILN_EINVAL, "strided 1x1 conv of channel blocks "
		                     "(internal error)");
	int_gemm(m, &gm, q, I(m, 0));
	cg_append(m, gb, cg_gemm_stmt(m, &gm));
	return gb && gb->n ? KILN_OK : nomem(m, n, err);
}

/* The output positions o of the innermost spatial dim whose tap t lands
 * inside the input, o*s + t*dil - pad in [0, in): [lo, hi), both clamped
 * to [0, out].  Splitting the row there leaves the middle part a plain
 * (for stride 1 contiguous) copy with no per-pixel bounds test. */
static void inner_span(cg_module *m, const geom *g, cg_expr *t, cg_expr **lo, cg_expr **hi)
{
	int d = g->nsp - 1;
	cg_expr *s = I(m, g->stride[d]), *sm1 = I(m, g->stride[d] - 1), *out = I(m, g->out[d]);
	cg_expr *off = add(m, I(m, g->pad[d]), mul(m, t, I(m, -g->dil[d])));
	/* ceil(a / s) for a >= 0 is (a + s - 1) / s; below 0 the clamp gives 0 */
	cg_expr *first = cg_bin(m, CG_DIV, add(m, off, sm1), s);
	cg_expr *end = cg_bin(m, CG_DIV, add(m, add(m, off, I(m, g->in[d])), sm1), s);
	*lo = cg_bin(m, CG_MIN, cg_bin(m, CG_MAX, first, I(m, 0)), out);
	*hi = cg_bin(m, CG_MAX, cg_bin(m, CG_MIN, end, out), *lo);
}

/* Input row (all spatial dims but the innermost) of output row o and taps
 * t, clamped, as a linear index times in[last]; *valid: inside the input. */
static cg_expr *tap_row(cg_module *m, const geom *g, cg_expr *const *o, cg_expr *const *t,
                        cg_expr **valid)
{
	cg_expr *j[3];
	*valid = cg_const(m, KILN_BOOL, 1);
	for (int d = 0; d < g->nsp - 1; d++) {
		cg_expr *p = add(m, add(m, mul(m, o[d], I(m, g->stride[d])), mul(m, t[d], I(m, g->dil[d]))),
		                 I(m, -g->pad[d]));
		*valid = cg_bin(m, CG_AND, *valid, cg_bin(m, CG_AND, cg_bin(m, CG_GE, p, I(m, 0)),
		                                          cg_bin(m, CG_LT, p, I(m, g->in[d]))));
		j[d] = cg_clamp(m, p, I(m, g->in[d]));
	}
	return mul(m, lin(m, g->nsp - 1, j, g->in), I(m, g->in[g->nsp - 1]));
}

/* Input column of output column o (innermost dim) and tap t; inside the
 * input whenever o is in the tap's span. */
static cg_expr *tap_col(cg_module *m, const geom *g, cg_expr *o, cg_expr *t)
{
	int d = g->nsp - 1;
	return add(m, add(m, mul(m, o, I(m, g->stride[d])), mul(m, t, I(m, g->dil[d]))),
	           I(m, -g->pad[d]));
}

/* Loops c, taps, output rows over ext/iv (2*nsp entries after c), leaving
 * the innermost output dim to the caller: the common shape of im2col and
 * the direct conv. */
static cg_stmt *conv_nest(cg_module *m, cg_kernel *k, cg_stmt *blk, int64_t C, const geom *g,
                          cg_expr **iv)
{
	cg_expr *ext[7];
	int ns = g->nsp;
	ext[0] = I(m, C);
	for (int d = 0; d < ns; d++)
		ext[1 + d] = I(m, g->k[d]);
	for (int d = 0; d < ns - 1; d++)
		ext[1 + ns + d] = I(m, g->out[d]);
	return cg_nest(m, k, blk, 2 * ns, ext, NULL, iv);
}

/* Output columns [lo, hi) of a 2-D conv whose every tap column lands inside
 * the input: there a row needs no column test. */
static void dw_span_d(const geom *g, int d, int64_t *lo, int64_t *hi)
{
	int64_t s = g->stride[d], p = g->pad[d], last = (g->k[d] - 1) * g->dil[d];
	*lo = (p + s - 1) / s;
	*hi = g->in[d] - 1 - last + p < 0 ? 0 : (g->in[d] - 1 - last + p) / s + 1;
	*lo = *lo > g->out[d] ? g->out[d] : *lo;
	*hi = *hi > g->out[d] ? g->out[d] : *hi < *lo ? *lo : *hi;
}

static void dw_span(const geom *g, int64_t *lo, int64_t *hi)
{
	dw_span_d(g, 1, lo, hi);
}

/* The interior [c0, c0 + ext) of a row whose every output is a final,
 * recomputable value (a depthwise conv's, a pool's) as spans whose lengths
 * are whole vectors: [c0, c0 + ext rounded down to TAIL_VEC) and, for the
 * rest, the last TAIL_VEC outputs again, overlapping the first span (they
 * get the same values).  A row of 110 then runs 7 vector iterations
 * instead of 6 and a scalar remainder of 14 (LLVM 14 does not fold loop
 * tails into masks).  Fills start[], len[]; returns the span count. */
enum { TAIL_VEC = 16 };
static int vector_spans(int64_t c0, int64_t ext, int64_t *start, int64_t *len)
{
	int64_t whole = ext / TAIL_VEC * TAIL_VEC;
	if (ext < TAIL_VEC || whole == ext) {
		start[0] = c0, len[0] = ext;
		return 1;
	}
	start[0] = c0, len[0] = whole;
	start[1] = c0 + ext - TAIL_VEC, len[1] = TAIL_VEC;
	return 2;
}

/* ---- stride-2 rows, split ----------------------------------------------- */

/* A 2-D window op with stride 2 along columns (a pool, a depthwise conv)
 * loads tap t of output column o from input column 2o + d, d = t*dil - pad:
 * a stride-2 access per tap, which the vectorizer turns into element by
 * element inserts.  Instead, each input plane is first copied with every
 * row split into its even and its odd columns (one pass of complete
 * stride-2 pairs, which vectorizes as two loads and shuffles), and tap t
 * reads the half of parity d & 1 at o + (d >> 1): contiguous in o. */
typedef struct split {
	int buf;      /* the split copy, one plane per window-op plane; -1: none */
	int64_t half; /* elements per half row: ceil(W / 2), or lead + what the
	                 taps read (guarded) */
	bool guard;   /* zeros before each half's columns (lead of them) and
	                 after them to the half's end: a depthwise conv's copy,
	                 whose every column then reads it (else nothing past the
	                 columns is written) */
	int64_t lead;
	cg_expr *plane; /* element offset of this iteration's plane in buf */
	bool rows;      /* buf holds, per output row, the rows its taps read (split_rows),
	                   indexed by tap row; else the whole plane */
} split;

/* Whether a 2-D op with geometry g should split its rows: stride 2 along
 * columns and an interior span (dw_span) wide enough to vectorize. */
static bool want_split(const geom *g)
{
	int64_t lo, hi;
	if (g->nsp != 2 || g->stride[1] != 2)
		return false;
	dw_span(g, &lo, &hi);
	return hi - lo >= 8;
}

static void zeros(cg_module *m, cg_kernel *k, cg_stmt *blk, int P, cg_expr *at, int64_t n);

/* Appends to blk the split copy of the row of x at src (W elements) to
 * sp->buf at dst: [evens | odds], each half sp->half, its columns from
 * sp->lead on (zeros around them when guarded). */
static void split_row(cg_module *m, cg_kernel *k, cg_stmt *blk, int x, cg_expr *src,
                      const split *sp, cg_expr *dst, int64_t W)
{
	cg_expr *q;
	cg_stmt *qb;
	int64_t L = sp->lead, H = sp->half;
	cg_append(m, blk, cg_loop(m, k, I(m, W / 2), CG_VECTORIZE, &q, &qb));
	cg_expr *q2 = mul(m, q, I(m, 2));
	cg_append(m, qb, cg_st(m, sp->buf, add(m, dst, add(m, I(m, L), q)), cg_ld(m, x, add(m, src, q2))));
	cg_append(m, qb, cg_st(m, sp->buf, add(m, add(m, dst, I(m, H + L)), q),
	                       cg_ld(m, x, add(m, add(m, src, q2), I(m, 1)))));
	if (W % 2) /* the last even column has no odd partner */
		cg_append(m, blk, cg_st(m, sp->buf, add(m, dst, I(m, L + W / 2)),
		                        cg_ld(m, x, add(m, src, I(m, W - 1)))));
}

/* A guarded split copy's zeros (sp->guard): before and after the columns
 * of each half of its rows [0, nrows) (x's rows W wide), which the copies
 * of the rows never overwrite, so they are written once per plane. */
static void split_guards(cg_module *m, cg_kernel *k, cg_stmt *blk, const split *sp,
                         int64_t nrows, int64_t W)
{
	cg_expr *h;
	cg_stmt *hb;
	int64_t L = sp->lead, H = sp->half;
	if (!sp->guard)
		return;
	cg_append(m, blk, cg_loop(m, k, I(m, nrows), 0, &h, &hb));
	cg_expr *dst = add(m, sp->plane, mul(m, h, I(m, 2 * H)));
	zeros(m, k, hb, sp->buf, dst, L);
	zeros(m, k, hb, sp->buf, add(m, dst, I(m, L + (W + 1) / 2)), H - L - (W + 1) / 2);
	zeros(m, k, hb, sp->buf, add(m, dst, I(m, H)), L);
	zeros(m, k, hb, sp->buf, add(m, dst, I(m, H + L + W / 2)), H - L - W / 2);
}

/* Appends to blk the split copy of x's plane at element xoff (H x W) into
 * sp->buf at sp->plane (H rows of [evens | odds], each half sp->half). */
static void split_plane(cg_module *m, cg_kernel *k, cg_stmt *blk, int x, cg_expr *xoff,
                        const split *sp, int64_t H, int64_t W)
{
	cg_expr *h;
	cg_stmt *hb;
	cg_append(m, blk, cg_loop(m, k, I(m, H), 0, &h, &hb));
	split_row(m, k, hb, x, add(m, xoff, mul(m, h, I(m, W))), sp,
	          add(m, sp->plane, mul(m, h, I(m, 2 * sp->half))), W);
}

/* Whether the split copy goes row by row (split_rows): when a plane is big
 * enough that a copy of all of it would leave the cache before it is read
 * (the max pool after SqueezeNet's first conv, 64 planes of 111 x 111: the
 * whole-plane copies moved 3x the input through L3, 0.43 ms against ORT's
 * 0.16), and with 3 taps a column from 16 x 16 on, where each input row is
 * split 1.5 times, in L1, instead of written and read back as a plane
 * (MobileNetV2's 144-channel 56 -> 28 depthwise conv 0.22 -> 0.19 ms, the
 * model -3%; with 5 taps MNASNet's 5x5 ones lost, 2.5 splits a row).
 * Each input row is then split about k/stride times, in L1. */
enum { SPLIT_ROWS_MIN = 64 * 64, SPLIT_ROWS_3 = 16 * 16 };
static bool by_rows(const geom *g)
{
	int64_t plane = g->in[0] * g->in[1];
	return plane >= SPLIT_ROWS_MIN || (g->k[0] <= 3 && plane >= SPLIT_ROWS_3);
}

/* Per output row oh: the split copies of the input rows its taps read,
 * row of tap t at sp->plane + t * 2*half (clamped rows: their taps are
 * masked by the row test). */
static void split_rows(cg_module *m, cg_kernel *k, cg_stmt *blk, int x, cg_expr *xoff,
                       const split *sp, const geom *g, cg_expr *oh)
{
	cg_expr *t;
	cg_stmt *tb;
	cg_append(m, blk, cg_loop(m, k, I(m, g->k[0]), 0, &t, &tb));
	cg_expr *r = add(m, add(m, mul(m, oh, I(m, g->stride[0])), mul(m, t, I(m, g->dil[0]))),
	                 I(m, -g->pad[0]));
	cg_expr *src = add(m, xoff, mul(m, cg_clamp(m, r, I(m, g->in[0])), I(m, g->in[1])));
	split_row(m, k, tb, x, src, sp, add(m, sp->plane, mul(m, t, I(m, 2 * sp->half))), g->in[1]);
}

/* The split copy's index of input row j0 (clamped by the caller), column
 * 2*o + t*dil - pad: half (d & 1), position o + (d >> 1), d computed
 * non-negatively (pad + 2 pairs up) so % and / are floor operations. */
static cg_expr *split_at(cg_module *m, const geom *g, const split *sp, cg_expr *j0, cg_expr *o,
                         cg_expr *t)
{
	int64_t K = g->pad[1] / 2 + 2;
	cg_expr *d = add(m, mul(m, t, I(m, g->dil[1])), I(m, 2 * K - g->pad[1]));
	cg_expr *par = cg_bin(m, CG_REM, d, I(m, 2));
	cg_expr *sh = add(m, cg_bin(m, CG_DIV, d, I(m, 2)), I(m, -K));
	return add(m, add(m, sp->plane, mul(m, j0, I(m, 2 * sp->half))),
	           add(m, mul(m, par, I(m, sp->half)), add(m, o, add(m, sh, I(m, sp->lead)))));
}

/* col[(c*ksz + t)*osz + o] = x[b, c, tap(o, t)], 0 in the padding: per
 * output row, zeros before the tap's span, a copy inside it, zeros after. */
static void im2col(cg_module *m, cg_kernel *k, cg_stmt *blk, int x, int col, cg_expr *b,
                   cg_expr *c, int64_t C, const geom *g, const split *sp, cg_expr *pad)
{
	cg_expr *iv[7], *valid, *lo, *hi, *v[3];
	cg_stmt *lb[3];
	int ns = g->nsp;
	int64_t W = g->out[ns - 1];
	cg_stmt *body = conv_nest(m, k, blk, 1, g, iv);
	iv[0] = c; /* one channel per call: the caller's loop picks it */
	cg_expr *row = add(m, mul(m, add(m, mul(m, b, I(m, C)), c), I(m, g->ksz)),
	                   lin(m, ns, iv + 1, g->k));
	cg_expr *orow = iv[1 + ns];
	for (int d = 1; d < ns - 1; d++)
		orow = add(m, mul(m, orow, I(m, g->out[d])), iv[1 + ns + d]);
	cg_expr *cbase = add(m, mul(m, row, I(m, g->osz)), ns > 1 ? mul(m, orow, I(m, W)) : I(m, 0));
	cg_expr *xrow = add(m, mul(m, add(m, mul(m, b, I(m, C)), iv[0]), I(m, g->isz)),
	                    tap_row(m, g, iv + 1 + ns, iv + 1, &valid));
	inner_span(m, g, iv[ns], &lo, &hi);
	cg_expr *ext[3] = {lo, cg_bin(m, CG_SUB, hi, lo), cg_bin(m, CG_SUB, I(m, W), hi)};
	cg_expr *start[3] = {I(m, 0), lo, hi};
	for (int p = 0; p < 3; p++) {
		cg_append(m, body, cg_loop(m, k, ext[p], CG_VECTORIZE, &v[p], &lb[p]));
		cg_expr *o = add(m, start[p], v[p]), *val = pad;
		if (p == 1 && sp && sp->buf >= 0) { /* 2-D, stride 2: the split rows */
			cg_expr *j0 = cg_clamp(m, add(m, add(m, mul(m, iv[1 + ns], I(m, g->stride[0])),
			                                     mul(m, iv[1], I(m, g->dil[0]))),
			                              I(m, -g->pad[0])), I(m, g->in[0]));
			val = cg_select(m, valid, cg_load(m, sp->buf, split_at(m, g, sp, j0, o, iv[ns])), val);
		} else if (p == 1)
			val = cg_select(m, valid, cg_load(m, x, add(m, xrow, tap_col(m, g, o, iv[ns]))), val);
		cg_append(m, lb[p], cg_store(m, col, add(m, cbase, o), val));
	}
}

/* A 2-D conv's chunked im2col: chunks of output rows, each at most
 * CHUNK_COLS columns of the GEMM (at least one row) and, where its K x
 * columns slice (K = C*ksz) would pass CHUNK_BYTES, fewer, down to
 * CHUNK_MIN_COLS: the slice then stays in L2 between its im2col and its
 * GEMM.  At most, not about: past TILE_N columns (llvm_gemm.c) the GEMM
 * packs its B, a second copy of the slice (ResNet's 7x7 stem: 10 rows of
 * 112 columns packed, 9 rows read in place: 2.97 -> 2.83 ms at batch 1).
 * The chunks go in CHUNK_PARTS parts, each reusing one slice: 512
 * columns (4 rows of 112) in 4 parts took the stem inside ResNet-18 from
 * 3.0 to 2.0 ms; 1024 columns in 8 parts 2.6, 256 in 4 parts 2.2.  Taken
 * from CHUNK_MIN chunks on.  The rows per chunk divide the output's
 * height where a divisor at least half as many does, so that every chunk
 * is one GEMM of a constant width, which cg_prepack can match to a
 * micro-kernel (kiln_sgemm_pm's output channels in the lanes up to 320
 * columns).  ResNet-50's 3x3 stride-2 conv to 128 channels at 28x28 (K
 * 1152, columns 3.6 MB per image; bench/ab.py --nodes, min of 5 rounds,
 * batch 1, one thread, Sapphire Rapids): whole, 2.26 ms; in 7 chunks of
 * 4 rows, 1.94; in 4 of 7 rows (slices of 900 KB), 1.98.  Narrower
 * chunks lost: its 256-channel conv at 14x14 (K 2304) in 7 chunks of 2
 * rows 1.93 -> 2.01 ms, in 2 chunks of 7 rows 2.08; the 512-channel one at
 * 7x7 (K 4608) in 7 chunks of one row 2.29 -> 5.15. */
enum { COL_ALIGN = 16 }; /* floats in a cache line */
enum { CHUNK_COLS = 512, CHUNK_MIN_COLS = 96, CHUNK_BYTES = 512 << 10, CHUNK_MIN = 4,
       CHUNK_PARTS = 4 };

/* The output rows per chunk for a slice row of row_bytes (K elements of
 * the columns' dtype). */
static int64_t chunk_rows(const geom *g, int64_t row_bytes)
{
	int64_t cols = row_bytes > 0 ? CHUNK_BYTES / row_bytes : CHUNK_COLS;
	cols = cols < CHUNK_MIN_COLS ? CHUNK_MIN_COLS : cols > CHUNK_COLS ? CHUNK_COLS : cols;
	int64_t R = cols / g->out[1] > 0 ? cols / g->out[1] : 1;
	for (int64_t r = R; 2 * r >= R; r--)
		if (g->out[0] % r == 0)
			return r;
	return R;
}

/* Appends to blk: P[at + c] = v for c < n (nothing when n <= 0). */
static void fill(cg_module *m, cg_kernel *k, cg_stmt *blk, int P, cg_expr *at, int64_t n,
                 cg_expr *v)
{
	cg_expr *c;
	cg_stmt *cb;
	if (n <= 0)
		return;
	cg_append(m, blk, cg_loop(m, k, I(m, n), CG_VECTORIZE, &c, &cb));
	cg_append(m, cb, cg_st(m, P, add(m, at, c), v));
}

/* P[at + c] = 0 (f32) for c < n */
static void zeros(cg_module *m, cg_kernel *k, cg_stmt *blk, int P, cg_expr *at, int64_t n)
{
	fill(m, k, blk, P, at, n, fc(m, KILN_F32, 0));
}

/* col[base + (c*ksz + t)*ld + (oh - oh0)*W + ow] = x[b, c, tap((oh, ow), t)]
 * (0 in the padding) for the rr output rows oh from oh0 of a 2-D conv:
 * per tap and row, zeros before the tap's span, a copy inside, zeros after,
 * or zeros for a row of padding.  The column taps are unrolled here, so
 * each span is a constant and the copy whole vectors and an overlapping
 * last one (with the span's length a run-time value, the copies of
 * ResNet's stem left 40 of 110 columns to the vectorizer's 8-wide and
 * masked scalar remainders, and tested the row per element). */
static void im2col_rows(cg_module *m, cg_kernel *k, cg_stmt *blk, int x, int col, cg_expr *b,
                        cg_expr *c, int64_t C, const geom *g, cg_expr *oh0, cg_expr *rr,
                        cg_expr *base, int64_t ld, const split *sp, cg_expr *pad)
{
	cg_expr *t[2], *r, *valid, *lo, *hi, *v;
	cg_stmt *tb, *rb, *lb;
	int64_t W = g->out[1];
	cg_append(m, blk, cg_loop(m, k, I(m, g->k[0]), 0, &t[0], &tb));
	for (int64_t tw = 0; tw < g->k[1]; tw++) {
		t[1] = I(m, tw);
		cg_append(m, tb, cg_loop(m, k, rr, 0, &r, &rb));
		cg_expr *oh = add(m, oh0, r);
		cg_expr *crow = add(m, base, add(m, mul(m, add(m, mul(m, c, I(m, g->ksz)),
		                                                  add(m, mul(m, t[0], I(m, g->k[1])), t[1])),
		                                           I(m, ld)), mul(m, r, I(m, W))));
		cg_expr *xrow = add(m, mul(m, add(m, mul(m, b, I(m, C)), c), I(m, g->isz)),
		                    tap_row(m, g, &oh, t, &valid));
		inner_span(m, g, t[1], &lo, &hi);
		int64_t l0 = cg_expr_int(lo, NULL), h0 = cg_expr_int(hi, NULL), st[2], len[2];
		cg_stmt *in = cg_block(m), *out = cg_block(m);
		fill(m, k, in, col, crow, l0, pad);
		int ns = vector_spans(l0, h0 - l0, st, len);
		for (int q = 0; q < ns; q++) {
			if (len[q] <= 0)
				continue;
			cg_append(m, in, cg_loop(m, k, I(m, len[q]), CG_VECTORIZE, &v, &lb));
			cg_expr *o = add(m, I(m, st[q]), v), *val;
			if (sp->buf >= 0) { /* stride 2: the split rows of plane (b, c) */
				split spc = *sp;
				spc.plane = mul(m, add(m, mul(m, b, I(m, C)), c), I(m, g->in[0] * 2 * sp->half));
				cg_expr *j0 = cg_clamp(m, add(m, add(m, mul(m, oh, I(m, g->stride[0])),
				                                     mul(m, t[0], I(m, g->dil[0]))),
				                              I(m, -g->pad[0])), I(m, g->in[0]));
				val = cg_load(m, sp->buf, split_at(m, g, &spc, j0, o, t[1]));
			} else {
				val = cg_load(m, x, add(m, xrow, tap_col(m, g, o, t[1])));
			}
			cg_append(m, lb, cg_store(m, col, add(m, crow, o), val));
		}
		fill(m, k, in, col, add(m, crow, I(m, h0)), W - h0, pad);
		if (valid->kind == CG_CONST && valid->i) { /* no row of this tap is padding */
			cg_append(m, rb, in);
			continue;
		}
		fill(m, k, out, col, crow, W, pad); /* a row of padding */
		cg_append(m, rb, valid->kind == CG_CONST ? out : cg_if(m, valid, in, out));
	}
}

/* Slots 0..ns in parts_count contiguous parts over the threads (min(ns,
 * cap); all ns on a grid target), each part's slots one after another:
 * scratch indexed by the part is reused by its slots while still in cache,
 * where scratch per slot is written to memory and read back.  parts_loop
 * appends the loop over the np parts (flags: its parallel hint) to body and
 * returns the block of the slot loop inside it, *part the part and *slot
 * the slot. */
static cg_expr *parts_count(cg_module *m, cg_expr *ns, int64_t cap)
{
	return grid_target(m) ? ns : cg_bin(m, CG_MIN, ns, I(m, cap));
}

static cg_stmt *parts_loop(cg_module *m, cg_kernel *k, cg_stmt *body, cg_expr *ns, cg_expr *np,
                           uint32_t flags, cg_expr **part, cg_expr **slot)
{
	cg_expr *pi, *sl;
	cg_stmt *pb, *blk;
	cg_append(m, body, cg_loop(m, k, np, flags, &pi, &pb));
	cg_expr *s_lo = cg_local(m, k, pb, KILN_I64, cg_bin(m, CG_DIV, mul(m, pi, ns), np));
	cg_expr *s_hi = cg_bin(m, CG_DIV, mul(m, add(m, pi, I(m, 1)), ns), np);
	cg_append(m, pb, cg_loop(m, k, cg_bin(m, CG_SUB, s_hi, s_lo), 0, &sl, &blk));
	*part = pi;
	*slot = cg_local(m, k, blk, KILN_I64, add(m, s_lo, sl));
	return blk;
}

/* A 2-D conv with large output maps: per (image, chunk of output rows),
 * over the threads, the chunk's im2col and then its GEMM (per group), so
 * the columns are still in cache when the GEMM reads them and a batch of
 * one still has many independent pieces (the stem of a ResNet has 3 input
 * channels: a per-channel im2col gave two threads three pieces). */
static kiln_status conv_im2col_chunked(cg_module *m, const ir_node *n, const int *in, int y,
                                       const geom *g, int64_t R, const conv_int *q)
{
	const ir_type *x = cg_btype(m, in[0]), *yt = cg_btype(m, y);
	int64_t grp = ir_attr_int(n, "group", 1);
	int64_t C = x->dim[1], M = yt->dim[1], rows = C * g->ksz, batch = x->dim[0];
	int64_t Cg = C / grp, Mg = M / grp, grows = Cg * g->ksz;
	int64_t OH = g->out[0], W = g->out[1], nch = (OH + R - 1) / R;
	/* the slice's rows a whole number of cache lines apart, so that the
	 * GEMM's vector loads of B split none (SqueezeNet's stem, 3 rows of
	 * 111 columns: 0.487 -> 0.465 ms) */
	int64_t ld = (R * W + COL_ALIGN - 1) / COL_ALIGN * COL_ALIGN;
	cg_expr *bd = cg_dim(m, batch);
	/* the (image, chunk) slots in at most CHUNK_PARTS contiguous parts over
	 * the threads, each part's slots one after another through its own
	 * columns, which stay in L2 for the next: a column buffer per slot was
	 * 7.7 MB for ResNet's 7x7 stem at batch 1, written to memory and read
	 * back (in the model, where other layers' data fill the caches, the
	 * stem took 3.0 ms; alone, 2.2) */
	cg_expr *ns = mul(m, bd, I(m, nch)), *np = parts_count(m, ns, CHUNK_PARTS);
	int col = cg_lower_scratch(m, col_dt(q), mul(m, np, I(m, rows * ld)));
	cg_kernel *k = cg_lower_kernel(m, n);
	if (col < 0 || !k)
		return KILN_ENOMEM;
	cg_expr *bc, *c, *gi = I(m, 0), *pi;
	cg_stmt *body, *cb, *pb;
	/* stride 2: every input plane split into even and odd columns first */
	split sp = {.buf = -1, .half = (g->in[1] + 1) / 2};
	if (want_split(g)) {
		int64_t psz = g->in[0] * 2 * sp.half;
		cg_expr *pi;
		cg_stmt *sb;
		sp.buf = cg_lower_scratch(m, col_dt(q), mul(m, mul(m, bd, I(m, C)), I(m, psz)));
		if (sp.buf < 0)
			return KILN_ENOMEM;
		cg_append(m, k->body, cg_loop(m, k, mul(m, bd, I(m, C)),
		                              cg_par(m, mul(m, bd, I(m, C * psz))), &pi, &sb));
		sp.plane = mul(m, pi, I(m, psz));
		split_plane(m, k, sb, in[0], mul(m, pi, I(m, g->isz)), &sp, g->in[0], g->in[1]);
	}
	body = parts_loop(m, k, k->body, ns, np, CG_PARALLEL, &pi, &bc);
	cg_expr *b = cg_bin(m, CG_DIV, bc, I(m, nch)), *ch = cg_bin(m, CG_REM, bc, I(m, nch));
	cg_expr *oh0 = cg_local(m, k, body, KILN_I64, mul(m, ch, I(m, R)));
	/* rows in this chunk: R, a constant where R divides OH */
	cg_expr *rr = OH % R == 0 ? I(m, R)
	                          : cg_local(m, k, body, KILN_I64,
	                                     cg_bin(m, CG_MIN, I(m, R), cg_bin(m, CG_SUB, I(m, OH), oh0)));
	cg_expr *base = mul(m, pi, I(m, rows * ld));
	cg_append(m, body, cg_loop(m, k, I(m, C), 0, &c, &cb));
	im2col_rows(m, k, cb, in[0], col, b, c, C, g, oh0, rr, base, ld, &sp, pad_value(m, q));
	pb = body;
	if (grp > 1)
		cg_append(m, body, cg_loop(m, k, I(m, grp), 0, &gi, &pb));
	bool bias = n->nin > 2 && in[2] >= 0;
	cg_gemm gm = {.a = in[1], .b = col, .c = y, .bias = bias ? in[2] : -1,
	              .M = I(m, Mg), .N = mul(m, rr, I(m, W)), .K = I(m, grows), .batch = I(m, 1),
	              .a_off = mul(m, gi, I(m, Mg * grows)), .a_bs = I(m, 0), .a_rs = I(m, grows),
	              .a_cs = I(m, 1),
	              .b_off = add(m, base, mul(m, gi, I(m, grows * ld))),
	              .b_bs = I(m, 0), .b_rs = I(m, ld), .b_cs = I(m, 1),
	              .c_off = add(m, mul(m, add(m, mul(m, b, I(m, M)), mul(m, gi, I(m, Mg))),
	                                  I(m, g->osz)), mul(m, oh0, I(m, W))),
	              .c_bs = I(m, 0), .c_rs = I(m, g->osz),
	              .bias_off = mul(m, gi, I(m, Mg)), .alpha = 1, .beta = 0,
	              .bias_axis = bias ? 2 : 0};
	int_gemm(m, &gm, q, mul(m, gi, I(m, Mg)));
	cg_stmt *gs = cg_gemm_stmt(m, &gm);
	if (!gs)
		return KILN_ENOMEM;
	cg_append(m, pb, gs);
	return KILN_OK;
}

static kiln_status conv_im2col(cg_module *m, const ir_node *n, const int *in, int y, const geom *g,
                               const conv_int *q, kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *yt = cg_btype(m, y);
	int64_t grp = ir_attr_int(n, "group", 1);
	int64_t C = x->dim[1], M = yt->dim[1], rows = C * g->ksz, batch = x->dim[0];
	int64_t Cg = C / grp, Mg = M / grp, grows = Cg * g->ksz;
	if (g->nsp == 2) {
		int64_t R = chunk_rows(g, rows * (int64_t)kiln_dtype_size(col_dt(q)));
		if ((g->out[0] + R - 1) / R >= CHUNK_MIN)
			return conv_im2col_chunked(m, n, in, y, g, R, q) ? nomem(m, n, err) : KILN_OK;
	}
	/* cg_lower_scratch may move m->buf: x and yt are dead after this */
	/* columns for the whole batch, each image its own, so that images can
	 * run on different threads; a symbolic batch picks a path at run time */
	cg_expr *bd = cg_dim(m, batch);
	int col = cg_lower_scratch(m, col_dt(q), mul(m, bd, I(m, rows * g->osz)));
	cg_kernel *k = cg_lower_kernel(m, n);
	if (col < 0 || !k)
		return nomem(m, n, err);
	cg_expr *bc, *b, *c, *gi;
	cg_stmt *body = NULL, *gb, *cb, *one = cg_block(m), *many = cg_block(m);
	bool fixed = batch >= 0;
	/* stride 2: each input plane split into even and odd columns just
	 * before its im2col */
	split sp = {.buf = -1, .half = (g->in[g->nsp - 1] + 1) / 2};
	int64_t psz = g->in[0] * 2 * sp.half;
	if (want_split(g) &&
	    (sp.buf = cg_lower_scratch(m, col_dt(q), mul(m, mul(m, bd, I(m, C)), I(m, psz)))) < 0)
		return nomem(m, n, err);
	/* one image: im2col over its channels on the threads, then the GEMM
	 * splits its columns */
	if (!fixed || batch == 1) {
		cg_append(m, fixed ? k->body : one,
		          cg_loop(m, k, mul(m, bd, I(m, C)),
		                  cg_par(m, mul(m, bd, I(m, rows * g->osz))), &bc, &body));
		if (sp.buf >= 0) {
			sp.plane = mul(m, bc, I(m, psz));
			split_plane(m, k, body, in[0], mul(m, bc, I(m, g->isz)), &sp, g->in[0], g->in[1]);
		}
		im2col(m, k, body, in[0], col, cg_bin(m, CG_DIV, bc, I(m, C)),
		       cg_bin(m, CG_REM, bc, I(m, C)), C, g, &sp, pad_value(m, q));
		if (!fixed)
			cg_append(m, k->body, cg_if(m, cg_bin(m, CG_LT, bd, I(m, 2)), one, cg_block(m)));
	}
	/* more: per image its im2col and GEMM on one thread, the columns
	 * still in cache when the GEMM reads them */
	cg_append(m, k->body, cg_loop(m, k, bd, CG_PARALLEL, &b, &gb));
	if (!fixed || batch > 1) {
		cg_append(m, fixed ? gb : many, cg_loop(m, k, I(m, C), 0, &c, &cb));
		if (sp.buf >= 0) {
			cg_expr *pi = add(m, mul(m, b, I(m, C)), c);
			sp.plane = mul(m, pi, I(m, psz));
			split_plane(m, k, cb, in[0], mul(m, pi, I(m, g->isz)), &sp, g->in[0], g->in[1]);
		}
		im2col(m, k, cb, in[0], col, b, c, C, g, &sp, pad_value(m, q));
		if (!fixed)
			cg_append(m, gb, cg_if(m, cg_bin(m, CG_GE, bd, I(m, 2)), many, cg_block(m)));
	}
	/* a grouped conv: per group g its block of W's rows, of the columns'
	 * rows and of y's channels, one GEMM each (a loop of one: none) */
	cg_stmt *pb = gb;
	gi = I(m, 0);
	if (grp > 1)
		cg_append(m, gb, cg_loop(m, k, I(m, grp), 0, &gi, &pb));
	bool bias = n->nin > 2 && in[2] >= 0;
	cg_gemm gm = {.a = in[1], .b = col, .c = y, .bias = bias ? in[2] : -1,
	              .M = I(m, Mg), .N = I(m, g->osz), .K = I(m, grows), .batch = I(m, 1),
	              .a_off = mul(m, gi, I(m, Mg * grows)), .a_bs = I(m, 0), .a_rs = I(m, grows),
	              .a_cs = I(m, 1),
	              .b_off = add(m, mul(m, b, I(m, rows * g->osz)), mul(m, gi, I(m, grows * g->osz))),
	              .b_bs = I(m, 0), .b_rs = I(m, g->osz), .b_cs = I(m, 1),
	              .c_off = add(m, mul(m, b, I(m, M * g->osz)), mul(m, gi, I(m, Mg * g->osz))),
	              .c_bs = I(m, 0), .c_rs = I(m, g->osz),
	              .bias_off = mul(m, gi, I(m, Mg)), .alpha = 1, .beta = 0,
	              .bias_axis = bias ? 2 : 0};
	int_gemm(m, &gm, q, mul(m, gi, I(m, Mg)));
	cg_append(m, pb, cg_gemm_stmt(m, &gm));
	return pb && pb->n && k->body->n ? KILN_OK : nomem(m, n, err);
}

/* y[b, m, :] = bias[m] (or 0), in its own nest over the output pixels. */
static void init_bias(cg_module *m, cg_kernel *k, cg_stmt *blk, int bias, int y, cg_expr *bm,
                      cg_expr *mi, const geom *g)
{
	cg_expr *ext[3], *iv[3];
	uint32_t h[3];
	for (int d = 0; d < g->nsp; d++)
		ext[d] = I(m, g->out[d]);
	out_loops_hints(g->nsp, h);
	cg_stmt *body = cg_nest(m, k, blk, g->nsp, ext, h, iv);
	kiln_dtype ct = cg_ctype(m->buf[y].dt);
	cg_expr *v = bias >= 0 ? cg_cast(m, cg_ld(m, bias, mi), ct) : fc(m, ct, 0);
	cg_append(m, body, cg_st(m, y, add(m, mul(m, bm, I(m, g->osz)), lin(m, g->nsp, iv, g->out)), v));
}

/* Integer convs' operands: x, w, their zero points (-1: none; w's one
 * value or one per output channel) and an i32 bias (-1: none). */
typedef struct conv_ops {
	int x, w, xz, wz, bias;
	const ir_type *yt; /* the result's type (NULL: its buffer's) */
} conv_ops;

/* Grouped, depthwise and non-f32 convs: per (image, out channel), the
 * output plane accumulates one (input channel, tap) at a time, each output
 * row only over the tap's span (the padding adds nothing).  Integer convs
 * sum (x - x_zp)(w - w_zp) in i32, so padding is x's zero point. */
static kiln_status conv_direct(cg_module *m, const ir_node *n, const conv_ops *op, bool integer,
                               int y, const geom *g, kiln_error *err)
{
	const int in[2] = {op->x, op->w};
	const ir_type *x = cg_btype(m, in[0]), *yt = op->yt ? op->yt : cg_btype(m, y);
	int64_t grp = ir_attr_int(n, "group", 1), C = x->dim[1], M = yt->dim[1];
	int64_t Cg = C / grp, Mg = M / grp, W = g->out[g->nsp - 1];
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	cg_expr *bm, *iv[7], *valid, *lo, *hi, *v;
	cg_stmt *blk, *vb;
	cg_expr *nm = mul(m, cg_dim(m, x->dim[0]), I(m, M));
	cg_append(m, k->body, cg_loop(m, k, nm, cg_par(m, mul(m, m->buf[y].numel, I(m, Cg * g->ksz))),
	                              &bm, &blk));
	cg_expr *mi = cg_bin(m, CG_REM, bm, I(m, M)), *bi = cg_bin(m, CG_DIV, bm, I(m, M));
	init_bias(m, k, blk, op->bias, y, bm, mi, g);
	int ns = g->nsp;
	cg_stmt *body = conv_nest(m, k, blk, Cg, g, iv);
	inner_span(m, g, iv[ns], &lo, &hi);
	cg_append(m, body, cg_loop(m, k, cg_bin(m, CG_SUB, hi, lo), CG_VECTORIZE, &v, &vb));
	cg_expr *o = add(m, lo, v), *orow = I(m, 0);
	for (int d = 0; d < ns - 1; d++)
		orow = add(m, mul(m, orow, I(m, g->out[d])), iv[1 + ns + d]);
	cg_expr *c = add(m, mul(m, cg_bin(m, CG_DIV, mi, I(m, Mg)), I(m, Cg)), iv[0]);
	cg_expr *xi = add(m, add(m, mul(m, add(m, mul(m, bi, I(m, C)), c), I(m, g->isz)),
	                         tap_row(m, g, iv + 1 + ns, iv + 1, &valid)), tap_col(m, g, o, iv[ns]));
	cg_expr *wi = add(m, mul(m, add(m, mul(m, mi, I(m, Cg)), iv[0]), I(m, g->ksz)),
	                  lin(m, ns, iv + 1, g->k));
	cg_expr *yi = add(m, mul(m, bm, I(m, g->osz)), add(m, mul(m, orow, I(m, W)), o));
	kiln_dtype ct = cg_ctype(m->buf[y].dt);
	cg_expr *xv = cg_ld(m, in[0], xi), *wv = cg_ld(m, in[1], wi);
	if (integer)
		xv = minus_zp(m, xv, op->xz, I(m, 0)), wv = minus_zp(m, wv, op->wz, mi);
	xv = cg_select(m, valid, xv, fc(m, ct, 0));
	cg_append(m, vb, cg_st(m, y, yi, add(m, cg_ld(m, y, yi), mul(m, xv, wv))));
	return KILN_OK;
}

static kiln_status conv_geometry(cg_module *m, const ir_node *n, int x, int w, int y, geom *g,
                                 kiln_error *err)
{
	const ir_type *xt = cg_btype(m, x), *wt = cg_btype(m, w), *yt = cg_btype(m, y);
	if (!fixed_channels(xt, wt, yt))
		return cg_lower_fail(m, n, err, KILN_EUNSUPPORTED, "symbolic channel counts");
	return geometry(m, n, xt, yt, wt->dim + 2, false, g, err);
}

/* An integer conv as GEMMs (conv_1x1 or im2col, as f32 ones, through the
 * backend's 8-bit kernel) when x and w are 8-bit, the sum's depth fits
 * CG_QGEMM_MAX_K and each group has rows enough to be a matrix product
 * (a depthwise conv's one row per group is not). */
static bool int_gemm_ok(cg_module *m, const ir_node *n, int x, int w, const geom *g)
{
	const ir_type *xt = cg_btype(m, x), *wt = cg_btype(m, w);
	int64_t grp = ir_attr_int(n, "group", 1), Mg = wt->dim[0] / grp;
	int64_t K = wt->dim[1] * g->ksz;
	bool x8 = xt->dtype == KILN_U8 || xt->dtype == KILN_I8;
	bool w8 = wt->dtype == KILN_U8 || wt->dtype == KILN_I8;
	return x8 && w8 && K <= CG_QGEMM_MAX_K && (grp == 1 || (Mg >= 4 && K >= 16));
}

/* Buffer b's data when it is a constant (not a view), else NULL. */
static const kiln_tensor *const_data(const cg_module *m, int b)
{
	const cg_buf *cb = b >= 0 ? &m->buf[b] : NULL;
	return cb && cb->kind == CG_BUF_CONST && cb->alias < 0 ? cb->data : NULL;
}

/* Zero point buffer z, or -1 (none) when it is a constant of zeros, as
 * symmetric weights' are: the GEMM then computes no sums for it. */
static int live_zp(const cg_module *m, int z)
{
	const kiln_tensor *t = const_data(m, z);
	for (int64_t i = 0; t && i < kiln_tensor_numel(t); i++)
		if (ir_load(t, i) != 0)
			return z;
	return t ? -1 : z;
}

/* A new constant buffer holding t (arena-owned), named "<of's name>.sfx". */
static int const_buf(cg_module *m, kiln_tensor *t, int of, const char *sfx)
{
	int64_t n = kiln_tensor_numel(t);
	int b = cg_buf_new(m, CG_BUF_CONST, t->dtype, I(m, n));
	if (b < 0)
		return -1;
	cg_buf *cb = &m->buf[b];
	cb->data = t;
	cb->type = (ir_type){t->dtype, 1, {n}};
	const char *on = m->buf[of].name;
	size_t len = (on ? strlen(on) : 1) + strlen(sfx) + 2;
	char *name = ir_alloc(m->arena, len);
	if (name)
		snprintf(name, len, "%s.%s", on ? on : "w", sfx);
	cb->name = name;
	return b;
}

/* An arena tensor of n values of dtype dt (NULL when out of memory). */
static kiln_tensor *arena_tensor(cg_module *m, kiln_dtype dt, int64_t n)
{
	kiln_tensor *t = ir_alloc(m->arena, sizeof *t);
	void *d = ir_alloc(m->arena, (size_t)(n ? n : 1) * kiln_dtype_size(dt));
	if (!t || !d)
		return NULL;
	*t = (kiln_tensor){.dtype = dt, .rank = 1, .shape = {n}, .data = d};
	return t;
}

/* x's zero point folded into the bias at compile time, when the weights,
 * both zero points and the bias (if any) are constants: the sums of
 * (w - wz)(x - xz) are sum w x - xz * sum_k w[m, k] - wz[m] * sum_k x
 * + K wz[m] xz, and every term but the third depends on m alone, so
 *   bias'[m] = bias[m] - xz * rowsum(w[m]) + K * wz[m] * xz
 * and the GEMM then needs neither x's zero point nor, per call, the row
 * sums of w (6% of ResNet-18's int8 time).  Element k of w's item m is
 * w[m*si + k*sk]: a conv's rows (si = K, sk = 1), a matmul's columns of B
 * (si = 1, sk = N).  -1 when it does not apply or a value leaves i32. */
static int folded_bias(cg_module *m, int w, int wz, int xz, int bias, int64_t M, int64_t K,
                       int64_t si, int64_t sk)
{
	const kiln_tensor *wt = const_data(m, w), *zt = wz >= 0 ? const_data(m, wz) : NULL;
	const kiln_tensor *xt = const_data(m, xz), *bt = bias >= 0 ? const_data(m, bias) : NULL;
	if (!wt || !xt || (wz >= 0 && !zt) || (bias >= 0 && !bt) || kiln_tensor_numel(wt) != M * K ||
	    kiln_tensor_numel(xt) != 1)
		return -1;
	kiln_tensor *t = arena_tensor(m, KILN_I32, M);
	if (!t)
		return -1;
	int64_t x0 = (int64_t)ir_load(xt, 0), nz = zt ? kiln_tensor_numel(zt) : 0;
	for (int64_t r = 0; r < M; r++) {
		int64_t sum = 0, z = zt ? (int64_t)ir_load(zt, nz == 1 ? 0 : r) : 0;
		for (int64_t k = 0; k < K; k++)
			sum += (int64_t)ir_load(wt, r * si + k * sk);
		int64_t v = (bt ? (int64_t)ir_load(bt, r) : 0) - x0 * sum + K * z * x0;
		if (v < INT32_MIN || v > INT32_MAX)
			return -1;
		((int32_t *)t->data)[r] = (int32_t)v;
	}
	return const_buf(m, t, w, "qbias");
}

/* ---- implicit im2col: 8-bit 2-D convs ------------------------------------------ */

/* Whether an integer conv (of one group, not conv_1x1's) runs as
 * conv_wide: 2-D, one group. */
static bool want_wide(const geom *g, int64_t grp)
{
	return g->nsp == 2 && grp == 1;
}

/* Phase planes of a stride (sy, sx) conv: which of the sy*sx phases
 * (py, px) its taps read (tap t reads phase (t*dil) % s of a dim), each
 * numbered by its slot (-1: unread); returns the count. */
static int phase_slots(const geom *g, int *slot)
{
	int64_t sy = g->stride[0], sx = g->stride[1];
	int nph = 0;
	for (int64_t p = 0; p < sy * sx; p++)
		slot[p] = -1;
	for (int64_t kh = 0; kh < g->k[0]; kh++)
		for (int64_t kw = 0; kw < g->k[1]; kw++) {
			int64_t p = (kh * g->dil[0]) % sy * sx + (kw * g->dil[1]) % sx;
			if (slot[p] < 0)
				slot[p] = nph++;
		}
	return nph;
}

/* A 2-D integer conv as one 8-bit GEMM per image on a copy of x, with no
 * im2col.  x is copied once, padded with its zero point and split by the
 * stride (sy, sx) into phase planes: phase (py, px) holds the padded
 * input's rows sy*i + py and columns sx*j + px (a stride-1 conv has one
 * phase, the padded plane).  Tap (kh, kw) of output (oh, ow) is then
 * element (oh + kh*dh / sy)*Wq + ow + kw*dw / sx of phase
 * (kh*dh % sy, kw*dw % sx), so over the GEMM's wide columns
 * n = oh*Wq + ow, row k = (c, kh, kw) of B is a contiguous run of one
 * phase plane: the GEMM packs its panels from there (b_rows: K constant
 * offsets).  It computes the Wq - OW columns between output rows too,
 * into a wide copy of y, and a last loop copies the real columns into y.
 * The im2col this replaces wrote each image's K x OH*OW columns, every
 * byte of x ksz / (sy*sx) times, and rows of 7 bytes for ResNet's 7x7 maps
 * (ResNet-18 int8 on AMX: 36% of the time at batch 1, 42% at 16); the
 * phase planes and the wide result are about one copy each of x and y. */
static kiln_status conv_wide(cg_module *m, const ir_node *n, const int *in, int y, const geom *g,
                             const conv_int *q, kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *yt = cg_btype(m, y);
	int64_t C = x->dim[1], M = yt->dim[1], batch = x->dim[0], H = g->in[0], W = g->in[1];
	int64_t OH = g->out[0], OW = g->out[1], K = C * g->ksz, sy = g->stride[0], sx = g->stride[1];
	int64_t e0 = (g->k[0] - 1) * g->dil[0] / sy, e1 = (g->k[1] - 1) * g->dil[1] / sx;
	int64_t Hq = (H + g->pad[0] + g->pad_end[0] + sy - 1) / sy;
	int64_t Wq = (W + g->pad[1] + g->pad_end[1] + sx - 1) / sx;
	Hq = Hq > OH + e0 ? Hq : OH + e0; /* every tap's rows inside its plane */
	Wq = Wq > OW + e1 ? Wq : OW + e1;
	int slot[64];
	if (sy * sx > 64)
		return conv_im2col(m, n, in, y, g, q, err);
	int nph = phase_slots(g, slot);
	int64_t plane = Hq * Wq, NW = (OH - 1) * Wq + OW;
	kiln_dtype ydt = m->buf[y].dt;
	bool bias = n->nin > 2 && in[2] >= 0;
	kiln_tensor *t = arena_tensor(m, KILN_I64, K);
	if (!t)
		return nomem(m, n, err);
	for (int64_t c = 0, k = 0; c < C; c++)
		for (int64_t kh = 0; kh < g->k[0]; kh++)
			for (int64_t kw = 0; kw < g->k[1]; kw++) {
				int64_t dh = kh * g->dil[0], dw = kw * g->dil[1];
				int64_t ph = slot[dh % sy * sx + dw % sx];
				((int64_t *)t->data)[k++] = (c * nph + ph) * plane + dh / sy * Wq + dw / sx;
			}
	/* new buffers may move m->buf: x and yt are dead after this */
	int rows = const_buf(m, t, in[1], "rows");
	cg_expr *bd = cg_dim(m, batch);
	int xp = rows < 0 ? -1 : cg_lower_scratch(m, q->xdt, mul(m, bd, I(m, C * nph * plane)));
	int yw = xp < 0 ? -1 : cg_lower_scratch(m, ydt, mul(m, bd, I(m, M * OH * Wq)));
	cg_kernel *k = yw < 0 ? NULL : cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	/* the phase planes over the threads: per plane of x (b, c) and phase,
	 * each row the zero point where it is padding, else zero points, the
	 * columns of x that land inside, zero points */
	for (int64_t p = 0; p < sy * sx; p++) {
		if (slot[p] < 0)
			continue;
		int64_t py = p / sx, px = p % sx;
		/* columns j with sx*j + px - pad in [0, W): [jlo, jhi) */
		int64_t jlo = (g->pad[1] - px + sx - 1) / sx, jhi = (g->pad[1] + W - px + sx - 1) / sx;
		jlo = jlo < 0 ? 0 : jlo > Wq ? Wq : jlo;
		jhi = jhi > Wq ? Wq : jhi < jlo ? jlo : jhi;
		cg_expr *pc, *r, *v;
		cg_stmt *pb, *rb, *lb, *row = cg_block(m), *pad = cg_block(m);
		cg_append(m, k->body, cg_loop(m, k, mul(m, bd, I(m, C)),
		                              cg_par(m, mul(m, bd, I(m, C * plane))), &pc, &pb));
		cg_append(m, pb, cg_loop(m, k, I(m, Hq), 0, &r, &rb));
		cg_expr *ih = add(m, mul(m, r, I(m, sy)), I(m, py - g->pad[0]));
		cg_expr *dst = add(m, mul(m, add(m, mul(m, pc, I(m, nph)), I(m, slot[p])), I(m, plane)),
		                   mul(m, r, I(m, Wq)));
		cg_expr *inside = cg_bin(m, CG_AND, cg_bin(m, CG_GE, ih, I(m, 0)),
		                         cg_bin(m, CG_LT, ih, I(m, H)));
		fill(m, k, row, xp, dst, jlo, q->pad);
		if (jhi > jlo) {
			cg_append(m, row, cg_loop(m, k, I(m, jhi - jlo), CG_VECTORIZE, &v, &lb));
			cg_expr *src = add(m, mul(m, pc, I(m, H * W)), mul(m, cg_clamp(m, ih, I(m, H)), I(m, W)));
			cg_expr *col = add(m, mul(m, add(m, I(m, jlo), v), I(m, sx)), I(m, px - g->pad[1]));
			cg_append(m, lb, cg_st(m, xp, add(m, dst, add(m, I(m, jlo), v)),
			                       cg_ld(m, in[0], add(m, src, col))));
		}
		fill(m, k, row, xp, add(m, dst, I(m, jhi)), Wq - jhi, q->pad);
		fill(m, k, pad, xp, dst, Wq, q->pad);
		cg_append(m, rb, cg_if(m, inside, row, pad));
	}
	/* per image one GEMM (a batch of one inline: its GEMM splits) */
	cg_expr *b;
	cg_stmt *gb;
	cg_append(m, k->body, cg_loop(m, k, bd, CG_PARALLEL, &b, &gb));
	cg_gemm gm = {.a = in[1], .b = xp, .c = yw, .bias = bias ? in[2] : -1,
	              .M = I(m, M), .N = I(m, NW), .K = I(m, K), .batch = I(m, 1),
	              .a_off = I(m, 0), .a_bs = I(m, 0), .a_rs = I(m, K), .a_cs = I(m, 1),
	              .b_off = mul(m, b, I(m, C * nph * plane)), .b_bs = I(m, 0), .b_rs = I(m, 0),
	              .b_cs = I(m, 1), .has_b_rows = true, .b_rows = rows,
	              .c_off = mul(m, b, I(m, M * OH * Wq)), .c_bs = I(m, 0), .c_rs = I(m, OH * Wq),
	              .bias_off = I(m, 0), .alpha = 1, .beta = 0, .bias_axis = bias ? 2 : 0};
	int_gemm(m, &gm, q, I(m, 0));
	cg_stmt *gs = cg_gemm_stmt(m, &gm);
	if (!gs)
		return nomem(m, n, err);
	cg_append(m, gb, gs);
	/* the outputs' columns of the wide result into y */
	cg_expr *ext[3] = {mul(m, bd, I(m, M)), I(m, OH), I(m, OW)}, *iv[3];
	uint32_t h[3] = {cg_par(m, mul(m, bd, I(m, M * OH * OW))), 0, CG_VECTORIZE};
	cg_stmt *body = cg_nest(m, k, k->body, 3, ext, h, iv);
	cg_expr *orow = add(m, mul(m, iv[0], I(m, OH)), iv[1]);
	cg_append(m, body, cg_st(m, y, add(m, mul(m, orow, I(m, OW)), iv[2]),
	                         cg_ld(m, yw, add(m, mul(m, orow, I(m, Wq)), iv[2]))));
	return body && body->n ? KILN_OK : nomem(m, n, err);
}

static kiln_status conv_int_gemms(cg_module *m, const ir_node *n, int x, int w, int bias, int y,
                                  const geom *g, conv_int *q, kiln_error *err)
{
	const ir_type *wt = cg_btype(m, w);
	int64_t M = wt->dim[0], K = wt->dim[1] * g->ksz;
	int fb = q->xz >= 0 ? folded_bias(m, w, q->wz, q->xz, bias, M, K, K, 1) : -1;
	if (fb >= 0) /* the padding is still x's zero point (q->pad) */
		bias = fb, q->xz = -1;
	const int in[3] = {x, w, bias};
	bool pointwise = ir_attr_int(n, "group", 1) == 1;
	for (int d = 0; d < g->nsp; d++)
		pointwise = pointwise && g->k[d] == 1 && g->stride[d] == 1 && g->pad[d] == 0 &&
		            g->pad_end[d] == 0 && g->in[d] == g->out[d];
	if (pointwise)
		return conv_1x1(m, n, in, y, g, q, err);
	if (want_wide(g, ir_attr_int(n, "group", 1)))
		return conv_wide(m, n, in, y, g, q, err);
	return conv_im2col(m, n, in, y, g, q, err);
}

/* x's zero point as the padding value (0 without one) */
static cg_expr *x_pad(cg_module *m, int xz, kiln_dtype xdt)
{
	return xz >= 0 ? cg_ld(m, xz, I(m, 0)) : fc(m, xdt, 0);
}

/* What a depthwise conv's final stores become for QLinearConv (NULL: the
 * f32 sums into y as they are): rint((sum + bias[c]) * mult[c] + yz)
 * stored into the 8-bit result q (bias -1: none), the requantization that
 * otherwise is a pass over the sums (MobileNetV2 int8: 0.42 of 3.98 ms). */
typedef struct dw_requant {
	int q, bias, mult, yz;
} dw_requant;

/* An 8-bit x whose planes a depthwise conv converts itself, each before
 * it reads it: in[0][plane] = f32(x[plane]) - f32(x_zp) (xz -1: none). */
typedef struct dw_convert {
	int x, xz;
} dw_convert;

static kiln_status conv_depthwise(cg_module *m, const ir_node *n, const int *in, int y,
                                  const geom *g, const dw_requant *rq, const dw_convert *cv,
                                  kiln_error *err);
/* a depthwise conv of this shape runs channel-blocked (dw_blocked) */
static bool dw_blocked_shape(const geom *g, int64_t Mg, bool f32);
/* ... or on flat padded planes (dw_flat) */
static bool want_flat(const cg_module *m, const geom *g, int x, bool x8, bool q);

/* Whether an integer conv is depthwise (2-D, one input channel per group)
 * with sums that f32 holds exactly: (x - x_zp) and (w - w_zp) are integers
 * of magnitude at most 255, so any sum of up to 2^24 / 255^2 = 258 taps of
 * their products is an exact f32, and the f32 depthwise kernels (blocked,
 * flat, split by stride, vectorized) compute the integer sums. */
static bool int_dw_ok(cg_module *m, const ir_node *n, int x, int w, const geom *g)
{
	const ir_type *xt = cg_btype(m, x), *wt = cg_btype(m, w);
	int64_t grp = ir_attr_int(n, "group", 1);
	bool x8 = xt->dtype == KILN_U8 || xt->dtype == KILN_I8;
	bool w8 = wt->dtype == KILN_U8 || wt->dtype == KILN_I8;
	return x8 && w8 && g->nsp == 2 && grp > 1 && grp == xt->dim[1] && wt->dim[1] == 1 &&
	       g->ksz * 255 * 255 < (1 << 24);
}

/* A new f32 buffer shaped as like (its dims) holding src - z: the zero
 * point z (-1: none) one value, or one per run of `per` elements. */
/* A new f32 scratch buffer of src's size, shaped as like (-1: no memory). */
static int f32_like(cg_module *m, int src, int like)
{
	ir_type t = *cg_btype(m, like);
	int dst = cg_lower_scratch(m, KILN_F32, m->buf[src].numel);
	if (dst >= 0) {
		t.dtype = KILN_F32;
		m->buf[dst].type = t;
	}
	return dst;
}

static int minus_zp_f32(cg_module *m, const ir_node *n, int src, int z, int64_t per, int like)
{
	cg_expr *numel = m->buf[src].numel;
	int dst = f32_like(m, src, like);
	cg_kernel *k = dst < 0 ? NULL : cg_lower_kernel(m, n);
	if (!k)
		return -1;
	cg_expr *i;
	cg_stmt *b;
	cg_append(m, k->body, cg_loop(m, k, numel, CG_PARALLEL | CG_VECTORIZE, &i, &b));
	cg_expr *v = cg_cast(m, cg_ld(m, src, i), KILN_F32);
	if (z >= 0)
		v = cg_bin(m, CG_SUB, v, cg_cast(m, qv(m, z, cg_bin(m, CG_DIV, i, I(m, per))), KILN_F32));
	cg_append(m, b, cg_st(m, dst, i, v));
	return b->n ? dst : -1;
}

/* minus_zp_f32's values at compile time, as a new constant, where src and
 * its zero point z (-1: none) are constants (a depthwise conv's weights:
 * a kernel per conv and run less, 17 in MobileNetV2); -2 where they are
 * not, -1 when out of memory. */
static int const_minus_zp_f32(cg_module *m, int src, int z, int64_t per)
{
	const kiln_tensor *st = const_data(m, src), *zt = z >= 0 ? const_data(m, z) : NULL;
	if (!st || (z >= 0 && !zt))
		return -2;
	int64_t n = kiln_tensor_numel(st), nz = zt ? kiln_tensor_numel(zt) : 0;
	kiln_tensor *t = arena_tensor(m, KILN_F32, n);
	if (!t)
		return -1;
	for (int64_t i = 0; i < n; i++)
		((float *)t->data)[i] = (float)(ir_load(st, i) - (zt ? ir_load(zt, nz == 1 ? 0 : i / per) : 0));
	return const_buf(m, t, src, "f32");
}

/* int_dw_ok's conv: its exact sums, without bias, into the f32 buffer yf
 * (shaped as the result), or with rq requantized into rq->q.  x - x_zp in
 * f32 is a pass over x before the conv, or with rq and one output per
 * channel made per plane by the conv's own loop just before the plane's
 * taps read it (dw_convert), while it is still in cache: MobileNetV2 int8
 * at batch 16 spent 23 of 93 ms in the passes, writing 4 bytes per input
 * to memory that the conv then read back (at batch 1, where the planes of
 * a pass stay in cache, it is the same either way). */
static kiln_status dw_integer(cg_module *m, const ir_node *n, const conv_ops *op, int yf,
                              const geom *g, const dw_requant *rq, kiln_error *err)
{
	/* x - 0 where the conv copies x anyway (split rows, flat padded planes):
	 * those copies convert it; its taps' own loads of a converted plane are
	 * cheaper than converting at each of ksz taps (MobileNetV2's stride-1
	 * 56x56 conv: 0.24 ms per plane converted, 0.35 converting per tap) */
	bool direct = rq && op->xz < 0 && (want_split(g) || want_flat(m, g, op->x, true, true));
	bool per_plane = rq && !direct && cg_btype(m, yf)->dim[1] == cg_btype(m, op->x)->dim[1];
	int xf = direct || per_plane ? op->x : minus_zp_f32(m, n, op->x, op->xz, 1, op->x);
	int wf = xf < 0 ? -1 : const_minus_zp_f32(m, op->w, op->wz, g->ksz);
	if (wf == -2)
		wf = minus_zp_f32(m, n, op->w, op->wz, g->ksz, op->w);
	if (wf < 0)
		return nomem(m, n, err);
	const int in[3] = {xf, wf, -1};
	dw_convert cv = {op->x, op->xz};
	return conv_depthwise(m, n, in, yf, g, rq, per_plane ? &cv : NULL, err);
}

/* A scratch buffer for an integer conv's sums, shaped as y: f32 for
 * dw_integer, else i32. */
static int sums_buf(cg_module *m, int y, bool dw)
{
	ir_type t = *cg_btype(m, y);
	int b = cg_lower_scratch(m, dw ? KILN_F32 : KILN_I32, m->buf[y].numel);
	if (b >= 0) {
		t.dtype = dw ? KILN_F32 : KILN_I32;
		m->buf[b].type = t;
	}
	return b;
}

kiln_status cg_lower_conv_integer(cg_module *m, const ir_node *n, const int *in, const int *out,
                                  kiln_error *err)
{
	conv_ops op = {in[0], in[1], live_zp(m, n->nin > 2 ? in[2] : -1),
	               live_zp(m, n->nin > 3 ? in[3] : -1), -1, NULL};
	geom g;
	kiln_status st = conv_geometry(m, n, op.x, op.w, out[0], &g, err);
	if (st)
		return st;
	if (int_gemm_ok(m, n, op.x, op.w, &g)) {
		kiln_dtype xdt = cg_btype(m, op.x)->dtype;
		conv_int q = {xdt, x_pad(m, op.xz, xdt), op.xz, op.wz, -1, -1};
		return conv_int_gemms(m, n, op.x, op.w, -1, out[0], &g, &q, err);
	}
	if (!int_dw_ok(m, n, op.x, op.w, &g))
		return conv_direct(m, n, &op, true, out[0], &g, err);
	int yf = sums_buf(m, out[0], true);
	if (yf < 0)
		return nomem(m, n, err);
	st = dw_integer(m, n, &op, yf, &g, NULL, err);
	cg_kernel *k = st ? NULL : cg_lower_kernel(m, n);
	if (!k)
		return st ? st : nomem(m, n, err);
	cg_expr *i;
	cg_stmt *b;
	cg_append(m, k->body, cg_loop(m, k, m->buf[out[0]].numel, CG_PARALLEL | CG_VECTORIZE, &i, &b));
	cg_append(m, b, cg_st(m, out[0], i, cg_cast(m, cg_ld(m, yf, i), KILN_I32)));
	return KILN_OK;
}

/* mult[i] = x_scale[i] * w_scale[i] / y_scale in f32, the requantization
 * multiplier of QLinearConv and QLinearMatMul (one value, or one per
 * element of whichever scale is a vector: an output channel, a row of A
 * or a column of B): a constant computed here when the scales are
 * constants, else a new scratch buffer a kernel fills; -1 when out of
 * memory. */
static int multiplier(cg_module *m, const ir_node *n, int xs, int ws, int ys)
{
	const ir_type *wt = cg_btype(m, ws), *xt = cg_btype(m, xs);
	int64_t lw = wt->rank == 0 ? 1 : wt->dim[0], lx = xt->rank == 0 ? 1 : xt->dim[0];
	int64_t len = lw > lx ? lw : lx;
	const kiln_tensor *cx = const_data(m, xs), *cw = const_data(m, ws), *cy = const_data(m, ys);
	if (cx && cw && cy) { /* the same f32 product and quotient the kernel computes */
		kiln_tensor *t = arena_tensor(m, KILN_F32, len);
		if (!t)
			return -1;
		for (int64_t i = 0; i < len; i++) {
			float p = (float)ir_load(cx, lx == 1 ? 0 : i) * (float)ir_load(cw, lw == 1 ? 0 : i);
			((float *)t->data)[i] = p / (float)ir_load(cy, 0);
		}
		return const_buf(m, t, ws, "qscale");
	}
	int buf = cg_lower_scratch(m, KILN_F32, I(m, len));
	cg_kernel *k = buf < 0 ? NULL : cg_lower_kernel(m, n);
	if (!k)
		return -1;
	cg_expr *i;
	cg_stmt *b;
	cg_append(m, k->body, cg_loop(m, k, I(m, len), 0, &i, &b));
	cg_append(m, b, cg_st(m, buf, i, cg_bin(m, CG_DIV, mul(m, qv(m, xs, i), qv(m, ws, i)),
	                                         qv(m, ys, I(m, 0)))));
	return b->n ? buf : -1;
}

/* As GEMMs where int_gemm_ok, the requantization in their epilogue; else
 * the sums into a scratch buffer (dw_integer's f32 ones for a depthwise
 * conv, conv_direct's i32 ones otherwise), then one requantizing pass over
 * y (w_scale per output channel or one value). */
kiln_status cg_lower_qlinear_conv(cg_module *m, const ir_node *n, const int *in, const int *out,
                                  kiln_error *err)
{
	int y = out[0];
	/* the sums' buffer is typed as y (sums_buf): no yt, which a new
	 * scratch buffer would leave pointing into a moved m->buf */
	conv_ops op = {in[0], in[3], live_zp(m, in[2]), live_zp(m, in[5]), n->nin > 8 ? in[8] : -1,
	               NULL};
	geom g;
	kiln_status st = conv_geometry(m, n, op.x, op.w, y, &g, err);
	if (st)
		return st;
	if (int_gemm_ok(m, n, op.x, op.w, &g)) {
		kiln_dtype xdt = cg_btype(m, op.x)->dtype;
		int mult = multiplier(m, n, in[1], in[4], in[6]);
		if (mult < 0)
			return nomem(m, n, err);
		conv_int q = {xdt, x_pad(m, op.xz, xdt), op.xz, op.wz, in[7], mult};
		return conv_int_gemms(m, n, op.x, op.w, op.bias, y, &g, &q, err);
	}
	bool dw = int_dw_ok(m, n, op.x, op.w, &g);
	int acc = sums_buf(m, y, dw), mult = acc < 0 ? -1 : multiplier(m, n, in[1], in[4], in[6]);
	if (mult < 0)
		return nomem(m, n, err);
	/* a depthwise conv requantizes in its own stores where its kernel
	 * stores each sum once (not the channel-blocked one's transposes) */
	int64_t Mg = cg_btype(m, y)->dim[1] / cg_btype(m, op.x)->dim[1];
	dw_requant rq = {y, op.bias, mult, in[7]};
	bool fused = dw && !dw_blocked_shape(&g, Mg, false);
	st = dw ? dw_integer(m, n, &op, acc, &g, fused ? &rq : NULL, err)
	        : conv_direct(m, n, &op, true, acc, &g, err);
	if (st || fused)
		return st;
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return st ? st : nomem(m, n, err);
	const ir_type *yt = cg_btype(m, y);
	cg_expr *ext[2] = {mul(m, cg_dim(m, yt->dim[0]), I(m, yt->dim[1])), I(m, g.osz)}, *iv[2];
	uint32_t h[2] = {cg_par(m, m->buf[y].numel), CG_VECTORIZE};
	cg_stmt *body = cg_nest(m, k, k->body, 2, ext, h, iv);
	cg_expr *mi = cg_bin(m, CG_REM, iv[0], I(m, yt->dim[1]));
	cg_expr *yi = add(m, mul(m, iv[0], I(m, g.osz)), iv[1]);
	/* in f32 with the multiplier per channel, as the 8-bit GEMM's epilogue
	 * (dw_integer's sums are exact f32s: no conversion, which as a
	 * saturating f32 -> i32 kept this loop from vectorizing) */
	cg_expr *sum = cg_cast(m, cg_ld(m, acc, yi), KILN_F32);
	if (dw && op.bias >= 0) /* conv_direct starts from the bias; dw_integer does not */
		sum = add(m, sum, cg_cast(m, cg_ld(m, op.bias, mi), KILN_F32));
	cg_expr *v = add(m, mul(m, sum, qv(m, mult, mi)), cg_cast(m, qv(m, in[7], I(m, 0)), KILN_F32));
	cg_append(m, body, cg_st(m, y, yi, cg_un(m, CG_ROUND, v)));
	return KILN_OK;
}

/* The taps of a depthwise conv's output (kh, kw unrolled), summed into acc
 * one kernel row at a time: each row's taps are a chain of k[1] multiply-
 * adds into a partial sum *part (the caller adds to it in the returned
 * body), and the rows' sums then join acc.  One chain over all taps is
 * k[0]*k[1] dependent FMAs (100 cycles of latency per output vector for
 * 5x5), more than the out-of-order window overlaps.  MobileNetV3-Large's
 * 5x5 depthwise kernels (batch 1, one thread, best of 3 alternating runs):
 * 12-17% faster; MobileNetV2's 3x3 ones were 8-20% slower split (3 more
 * adds per 9 taps), so up to TAP_CHAIN taps stay one chain. */
enum { TAP_CHAIN = 9 };
/* ... for na outputs at once (acc[na], part[na]), each its own chains */
static cg_stmt *tap_rows_n(cg_module *m, cg_kernel *k, cg_stmt *blk, const geom *g, int na,
                           cg_expr **acc, cg_expr **tv, cg_expr **part)
{
	cg_stmt *rb, *cb;
	if (g->ksz <= TAP_CHAIN) { /* one chain: no partial sums to add */
		cg_expr *ext2[2] = {I(m, g->k[0]), I(m, g->k[1])};
		uint32_t h[2] = {CG_UNROLL, CG_UNROLL};
		for (int a = 0; a < na; a++)
			part[a] = acc[a];
		return cg_nest(m, k, blk, 2, ext2, h, tv);
	}
	cg_append(m, blk, cg_loop(m, k, I(m, g->k[0]), CG_UNROLL, &tv[0], &rb));
	for (int a = 0; a < na; a++)
		part[a] = cg_local(m, k, rb, acc[a]->dt, fc(m, acc[a]->dt, 0));
	cg_append(m, rb, cg_loop(m, k, I(m, g->k[1]), CG_UNROLL, &tv[1], &cb));
	for (int a = 0; a < na; a++)
		cg_set(m, rb, acc[a], add(m, acc[a], part[a]));
	return cb;
}

static cg_stmt *tap_rows(cg_module *m, cg_kernel *k, cg_stmt *blk, const geom *g, cg_expr *acc,
                         cg_expr **tv, cg_expr **part)
{
	return tap_rows_n(m, k, blk, g, 1, &acc, tv, part);
}

/* na sums of a depthwise conv's outputs in body, each a local from the
 * bias (or 0), their taps' loops (tap_rows_n) around the returned body;
 * *w is the tap's weight of output channel pl[1]. */
static cg_stmt *dw_sums(cg_module *m, cg_kernel *k, cg_stmt *body, const ir_node *n,
                        const int *in, const geom *g, cg_expr **pl, kiln_dtype ct, int na,
                        cg_expr **acc, cg_expr **tv, cg_expr **part, cg_expr **w)
{
	for (int a = 0; a < na; a++)
		acc[a] = cg_local(m, k, body, ct, n->nin > 2 && in[2] >= 0 ? cg_ld(m, in[2], pl[1])
		                                                           : fc(m, ct, 0));
	cg_stmt *tb = tap_rows_n(m, k, body, g, na, acc, tv, part);
	*w = cg_ld(m, in[1], add(m, mul(m, pl[1], I(m, g->ksz)), lin(m, 2, tv, g->k)));
	return tb;
}

/* One span of output columns [c0, c0 + ext) of output row oh of plane bm:
 * y = bias + the sum over taps of x * w, kept in a local (taps loops of
 * constant extent, which LLVM unrolls, so the column loop is innermost and
 * vectorizes; inside the interior span the column index is affine and only
 * the row, invariant in the loop, is tested). */
/* A depthwise conv's final value of output channel ch: sum, or with rq
 * the requantized value (stored into rq->q), as the requantization pass of
 * cg_lower_qlinear_conv computes it. */
static cg_expr *dw_value(cg_module *m, const dw_requant *rq, cg_expr *sum, cg_expr *ch)
{
	if (!rq)
		return sum;
	if (rq->bias >= 0)
		sum = add(m, sum, cg_cast(m, cg_ld(m, rq->bias, ch), KILN_F32));
	cg_expr *v = add(m, mul(m, sum, qv(m, rq->mult, ch)), cg_cast(m, qv(m, rq->yz, I(m, 0)), KILN_F32));
	return cg_un(m, CG_ROUND, v);
}

/* Output rows per pass of a stride-1 depthwise conv's interior rows
 * (dw_cols_rows), which share their tap loads, on rows of at most
 * DW_ROWS_W outputs.  One 3x3 depthwise + Clip, batch 1, one thread, kiln
 * bench min over 5 x 200 runs (ms, Zen 4, one row -> four): 144 channels
 * 56x56 0.190 -> 0.161, 192 channels 28x28 0.070 -> 0.055; in
 * MobileNetV2 (kernel min, 5 alternating rounds) 0.168 -> 0.132 and 0.064
 * -> 0.050.  Its 32 channels at 112x112 went 0.138 -> 0.109 alone but
 * 0.125 -> 0.146 in the model, where its input comes from L3 and a pass
 * reads six rows of 448 bytes at once: rows that wide stay one at a time. */
enum { DW_ROWS = 4, DW_ROWS_W = 64 };

static void dw_cols(cg_module *m, cg_kernel *k, cg_stmt *blk, const ir_node *n, const int *in,
                    int y, const geom *g, cg_expr **pl, cg_expr *oh, int64_t c0, int64_t ext,
                    bool interior, bool row_in, const split *sp, const dw_requant *rq)
{
	cg_expr *v, *tv[2];
	cg_stmt *vb;
	cg_append(m, blk, cg_loop(m, k, I(m, ext), interior ? CG_VECTORIZE : 0, &v, &vb));
	cg_expr *o[2] = {oh, add(m, I(m, c0), v)};
	kiln_dtype ct = cg_ctype(m->buf[y].dt);
	cg_expr *acc, *part, *wv;
	cg_stmt *tb = dw_sums(m, k, vb, n, in, g, pl, ct, 1, &acc, tv, &part, &wv);
	cg_expr *j[2], *valid;
	taps(m, g, o, tv, j, &valid);
	if (interior && row_in) { /* row and column inside: no test, no clamp */
		valid = cg_const(m, KILN_BOOL, 1);
		j[0] = add(m, add(m, mul(m, oh, I(m, g->stride[0])), mul(m, tv[0], I(m, g->dil[0]))),
		           I(m, -g->pad[0]));
		j[1] = tap_col(m, g, o[1], tv[1]);
	} else if (interior) { /* the column is inside: only the row is tested */
		tap_row(m, g, o, tv, &valid);
		j[1] = tap_col(m, g, o[1], tv[1]);
	}
	cg_expr *xi = add(m, pl[3], lin(m, 2, j, g->in));
	cg_expr *xv = cg_select(m, valid, interior && sp->buf >= 0
	                                      ? cg_ld(m, sp->buf, split_at(m, g, sp, sp->rows ? tv[0] : j[0],
	                                                                   o[1], tv[1]))
	                                      : cg_cast(m, cg_ld(m, in[0], xi), ct), fc(m, ct, 0));
	cg_set(m, tb, part, add(m, part, mul(m, xv, wv)));
	cg_append(m, vb, cg_st(m, rq ? rq->q : y, add(m, mul(m, pl[0], I(m, g->osz)),
	                                              add(m, mul(m, oh, I(m, g->out[1])), o[1])),
	                       dw_value(m, rq, acc, pl[1])));
}

/* dw_cols' interior for DW_ROWS output rows from oh0 at once, stride 1,
 * every tap inside: per vector of columns, one sum per row, the rows'
 * taps the first row's shifted down, so that the DW_ROWS x k0 rows of tap
 * loads are k0 + DW_ROWS - 1 rows (LLVM merges the equal loads); the
 * sums, and their order, are dw_cols' (the same bits).  See DW_ROWS. */
static void dw_cols_rows(cg_module *m, cg_kernel *k, cg_stmt *blk, const ir_node *n,
                         const int *in, int y, const geom *g, cg_expr **pl, cg_expr *oh0,
                         int64_t c0, int64_t ext, const dw_requant *rq)
{
	cg_expr *v, *tv[2], *acc[DW_ROWS], *part[DW_ROWS];
	cg_stmt *vb;
	cg_append(m, blk, cg_loop(m, k, I(m, ext), CG_VECTORIZE, &v, &vb));
	cg_expr *oc = add(m, I(m, c0), v);
	cg_expr *wv;
	cg_stmt *tb = dw_sums(m, k, vb, n, in, g, pl, cg_ctype(m->buf[y].dt), DW_ROWS, acc, tv, part,
	                      &wv);
	cg_expr *j[2];
	j[1] = tap_col(m, g, oc, tv[1]);
	for (int a = 0; a < DW_ROWS; a++) {
		j[0] = add(m, add(m, add(m, oh0, I(m, a)), mul(m, tv[0], I(m, g->dil[0]))),
		           I(m, -g->pad[0]));
		cg_expr *xv = cg_cast(m, cg_ld(m, in[0], add(m, pl[3], lin(m, 2, j, g->in))), acc[a]->dt);
		cg_set(m, tb, part[a], add(m, part[a], mul(m, xv, wv)));
	}
	for (int a = 0; a < DW_ROWS; a++) {
		cg_expr *oh = add(m, oh0, I(m, a));
		cg_append(m, vb, cg_st(m, rq ? rq->q : y, add(m, mul(m, pl[0], I(m, g->osz)),
		                                              add(m, mul(m, oh, I(m, g->out[1])), oc)),
		                       dw_value(m, rq, acc[a], pl[1])));
	}
}

/* Appends to blk the zero-padded copy at P[pp] (Hp x Wp pixels of e
 * elements: e = 1 for a plane, a block of channels channels-last) of the
 * hin x win source pixels at src[soff] (rows srs elements apart), placed at
 * row pt, column pw: zero rows above and below, and each source row between
 * zero columns.  whole: the rows are copied in whole vectors of TAIL_VEC
 * (padded_rows). */
static void padded_rows(cg_module *m, cg_kernel *k, cg_stmt *rb, int P, cg_expr *row, int src,
                        cg_expr *sro, int64_t win, int64_t V);
static void padded_plane(cg_module *m, cg_kernel *k, cg_stmt *blk, int P, cg_expr *pp, int src,
                         cg_expr *soff, int64_t srs, int64_t hin, int64_t win, int64_t Hp,
                         int64_t Wp, int64_t pt, int64_t pw, int64_t e, bool whole)
{
	cg_expr *r, *c;
	cg_stmt *rb, *cb;
	zeros(m, k, blk, P, pp, pt * Wp * e);
	/* whole, rows narrower than a vector: every row but the last copies V
	 * elements, the V - win past its end landing in its right padding and
	 * the next row's first elements, which that row's zeros and copy then
	 * overwrite (read from the next source row: inside the plane while
	 * V <= srs + win) */
	int64_t V = TAIL_VEC, n = win * e;
	bool over = whole && e == 1 && n < V && hin > 1 && V <= srs + win && 2 * n >= V;
	int64_t r0[2] = {0, hin - 1}, rn[2] = {over ? hin - 1 : hin, over ? 1 : 0};
	for (int part = 0; part < 2; part++) {
		if (!rn[part])
			continue;
		cg_append(m, blk, cg_loop(m, k, I(m, rn[part]), 0, &r, &rb));
		if (part)
			r = add(m, I(m, r0[part]), r);
		cg_expr *row = add(m, pp, mul(m, add(m, r, I(m, pt)), I(m, Wp * e)));
		cg_expr *sro = add(m, soff, mul(m, r, I(m, srs)));
		zeros(m, k, rb, P, row, pw * e);
		if (whole) {
			padded_rows(m, k, rb, P, add(m, row, I(m, pw * e)), src, sro, n,
			            over && !part ? V : n);
		} else {
			cg_append(m, rb, cg_loop(m, k, I(m, n), CG_VECTORIZE, &c, &cb));
			cg_append(m, cb, cg_st(m, P, add(m, add(m, row, I(m, pw * e)), c),
			                       cg_ld(m, src, add(m, sro, c))));
		}
		zeros(m, k, rb, P, add(m, row, I(m, (pw + win) * e)), (Wp - pw - win) * e);
	}
	zeros(m, k, blk, P, add(m, pp, I(m, (pt + hin) * Wp * e)), (Hp - pt - hin) * Wp * e);
}

/* P[dst + c] = src[sro + c] for c < V (V >= n, the row's n elements and
 * what follows them) in whole vectors: with V >= TAIL_VEC, the last
 * vector overlapping the one before (vector_spans), not a scalar
 * remainder of up to 15 copies per row (LLVM 14 does not fold tails). */
static void padded_rows(cg_module *m, cg_kernel *k, cg_stmt *rb, int P, cg_expr *dst, int src,
                        cg_expr *sro, int64_t n, int64_t V)
{
	(void)n;
	int64_t st[2], len[2];
	int ns = vector_spans(0, V, st, len);
	for (int q = 0; q < ns; q++) {
		cg_expr *c;
		cg_stmt *cb;
		cg_append(m, rb, cg_loop(m, k, I(m, len[q]), CG_VECTORIZE, &c, &cb));
		cg_expr *o = add(m, I(m, st[q]), c);
		cg_append(m, cb, cg_st(m, P, add(m, dst, o), cg_ld(m, src, add(m, sro, o))));
	}
}

/* ---- depthwise on small planes: padded and flat ----------------------------
 * A row of a small plane (7 or 14 outputs: MobileNet's last stages) is
 * mostly edges, which run scalar with every tap tested.  Instead, with
 * stride 1, the plane is first copied into a zero-padded one (Hp x Wp), so
 * every tap of every output reads inside it, and output (r, c) is the sum
 * over taps of P[(r*Wp + c) + ky*dil*Wp + kx*dil]: one flat, contiguous
 * index f = r*Wp + c for the whole plane, whose f with c >= Wout are
 * garbage nobody reads.  So the plane is one vector loop of
 * (Hout - 1)*Wp + Wout outputs into T, then its rows are copied out.
 * MobileNetV2 at batch 1 on one thread (kiln bench --profile): the
 * 384-channel 14x14 depthwise 0.081 -> 0.044-0.050 ms (ORT 0.048), the
 * 960-channel 7x7 one 0.088 -> 0.051 ms (ORT 0.034). */
enum { FLAT_W = 32 };

/* In f32 with 3 columns of taps, the flat form pays on rows of fewer than
 * FLAT_W_F32 outputs only: the row form (dw_cols: a scalar edge column on
 * each side, the interior in whole vectors) measured faster from 18
 * columns on.  One 3x3 depthwise conv of 256 channels, pads 1, batch 1,
 * one thread (kiln bench, flat against row form, 6 alternating rounds,
 * ms): 14x14 0.024 / 0.028, 16x16 0.032 / 0.032, 18x18 0.048 / 0.032,
 * 24x24 0.115 / 0.074; MobileNetV2's 28x28 ones 0.10 -> 0.06.  Wider
 * kernels keep FLAT_W: their row form has two scalar edge columns a side
 * of 25 taps each (5x5, 240 channels, pads 2: 20x20 0.098 / 0.153, 28x28
 * 0.229 / 0.351, and 1.3-1.6x at batch 16).  So does the int8 form (not
 * measured here). */
enum { FLAT_W_F32 = 16 };

/* x8: an 8-bit x the kernel may copy to f32 itself (exact); q: the
 * conv requantizes (int8) */
static bool want_flat(const cg_module *m, const geom *g, int x, bool x8, bool q)
{
	return g->nsp == 2 && g->stride[0] == 1 && g->stride[1] == 1 &&
	       g->out[1] < (q || g->k[1] > 3 ? FLAT_W : FLAT_W_F32) &&
	       (m->buf[x].dt == KILN_F32 || x8);
}

/* dw_flat's outputs FLAT_ROWS rows at a time, when its rows are whole
 * vectors (Wp, T's and P's row stride, rounded up to a multiple of
 * TAIL_VEC where that wastes at most a quarter of a row): per vector of
 * the top row, the vectors one, two and three rows down (Wp apart) too,
 * whose taps are the top one's shifted by rows, so the four outputs' 4 x
 * k0 rows of tap loads are k0 + 3 rows (LLVM merges the equal loads).
 * The flat form is bound by its loads, each tap an unaligned vector; the
 * sums, and their order, are one row's (the same bits).  The rows past
 * the last group of four run as one group of fewer.  One depthwise +
 * Clip, batch 1, one thread, kiln bench min over 5 x 300 runs, Zen 4 (ms,
 * one row -> 2 -> 4): 384 channels 14x14 3x3 0.0407 -> 0.0342 -> 0.0335,
 * 576 channels 0.0611 -> 0.0509 -> 0.0501; 120 channels 28x28 5x5 0.0987
 * -> 0.0876 -> 0.0728, 240 channels 0.197 -> 0.171 -> 0.140 (ORT 0.178
 * with its reorders).  (The flat form in rows of four for 3x3 beyond
 * FLAT_W_F32 against the row form: 28x28 and 56x56 3-4% faster, 112x112
 * 27% slower: the row form stays.) */
enum { FLAT_ROWS = 4 };
static void dw_flat_rows(cg_module *m, cg_kernel *k, cg_stmt *blk, const ir_node *n,
                          const int *in, const geom *g, cg_expr **pl, int P, cg_expr *pp, int T,
                          cg_expr *tp, int64_t Wp)
{
	int64_t Ho = g->out[0];
	for (int last = 0; last < 2; last++) {
		int64_t nr = last ? Ho % FLAT_ROWS != 0 : Ho / FLAT_ROWS;
		int na = last ? (int)(Ho % FLAT_ROWS) : FLAT_ROWS;
		if (!nr)
			continue;
		cg_expr *pr, *i, *tv[2], *acc[FLAT_ROWS], *part[FLAT_ROWS];
		cg_stmt *prb, *ib;
		cg_append(m, blk, cg_loop(m, k, I(m, nr), 0, &pr, &prb));
		cg_expr *row = last ? I(m, Ho - na) : mul(m, pr, I(m, FLAT_ROWS));
		cg_append(m, prb, cg_loop(m, k, I(m, Wp), CG_VECTORIZE, &i, &ib));
		cg_expr *fi = add(m, mul(m, row, I(m, Wp)), i);
		cg_expr *wv;
		cg_stmt *tb = dw_sums(m, k, ib, n, in, g, pl, KILN_F32, na, acc, tv, part, &wv);
		cg_expr *tap = add(m, mul(m, tv[0], I(m, g->dil[0] * Wp)), mul(m, tv[1], I(m, g->dil[1])));
		for (int a = 0; a < na; a++) {
			cg_expr *pi = add(m, add(m, pp, add(m, fi, I(m, a * Wp))), tap);
			cg_set(m, tb, part[a], add(m, part[a], mul(m, cg_ld(m, P, pi), wv)));
		}
		for (int a = 0; a < na; a++)
			cg_append(m, ib, cg_st(m, T, add(m, tp, add(m, fi, I(m, a * Wp))), acc[a]));
	}
}

static kiln_status dw_flat(cg_module *m, cg_kernel *k, cg_stmt *blk, const ir_node *n,
                           const int *in, int y, const geom *g, cg_expr **pl, cg_expr *nslot,
                           const dw_requant *rq, kiln_error *err)
{
	/* pl: conv_depthwise's plane values; the scratch planes P and T are
	 * per slot pl[4], nslot of them */
	int64_t H = g->in[0], W = g->in[1], pt = g->pad[0], pw = g->pad[1];
	int64_t Hp = g->out[0] + (g->k[0] - 1) * g->dil[0], Wp = g->out[1] + (g->k[1] - 1) * g->dil[1];
	/* rows of whole vectors (Wp rounded up, at most a quarter of each row
	 * then wasted): the outputs in groups of rows (dw_flat_rows) */
	int64_t Wq = (Wp + TAIL_VEC - 1) / TAIL_VEC * TAIL_VEC;
	bool grouped = g->out[0] > 1 && 4 * g->out[1] >= 3 * Wq;
	if (grouped)
		Wp = Wq;
	/* in groups, T holds whole rows and P a row more, which only the
	 * columns past Wo of the last row read */
	int64_t L = grouped ? g->out[0] * Wp : (g->out[0] - 1) * Wp + g->out[1];
	int64_t psz = (Hp + (grouped ? 1 : 0)) * Wp;
	int P = cg_lower_scratch(m, KILN_F32, mul(m, nslot, I(m, psz)));
	int T = cg_lower_scratch(m, KILN_F32, mul(m, nslot, I(m, L)));
	if (P < 0 || T < 0)
		return nomem(m, n, err);
	cg_expr *pp = mul(m, pl[4], I(m, psz)), *tp = mul(m, pl[4], I(m, L));
	cg_expr *xp = pl[3];
	cg_expr *r, *c, *f, *tv[2];
	cg_stmt *rb, *cb, *fb;
	/* the padded plane; input rows and columns past Hp - pt, Wp - pw are
	 * read by no output */
	int64_t hin = H < Hp - pt ? H : Hp - pt, win = W < Wp - pw ? W : Wp - pw;
	padded_plane(m, k, blk, P, pp, in[0], xp, W, hin, win, Hp + (grouped ? 1 : 0), Wp, pt, pw, 1,
	             m->buf[in[0]].dt == KILN_F32);
	kiln_dtype ct = KILN_F32;
	if (grouped)
		dw_flat_rows(m, k, blk, n, in, g, pl, P, pp, T, tp, Wp);
	/* else the flat outputs, in whole vectors (the last one overlapping) */
	int64_t st[2], len[2];
	int ns = grouped ? 0 : vector_spans(0, L, st, len);
	for (int q = 0; q < ns; q++) {
		cg_append(m, blk, cg_loop(m, k, I(m, len[q]), CG_VECTORIZE, &f, &fb));
		cg_expr *fi = add(m, I(m, st[q]), f);
		cg_expr *acc, *part, *wv;
		cg_stmt *tb = dw_sums(m, k, fb, n, in, g, pl, ct, 1, &acc, tv, &part, &wv);
		cg_expr *pi = add(m, add(m, pp, fi), add(m, mul(m, tv[0], I(m, g->dil[0] * Wp)),
		                                         mul(m, tv[1], I(m, g->dil[1]))));
		cg_set(m, tb, part, add(m, part, mul(m, cg_ld(m, P, pi), wv)));
		cg_append(m, fb, cg_st(m, T, add(m, tp, fi), acc));
	}
	/* the rows out: an activation folds into the flat loop's stores instead */
	k->act_buf = T;
	/* Every row but the last in whole vectors: V >= Wo outputs, the V - Wo
	 * past the row's end landing on the next row's first ones, which that
	 * row's stores then overwrite, and read from T's next row (inside L
	 * while V <= Wp + Wo).  A 14-output row was a vector of 8, one of 4 and
	 * two scalar requantizations (or copies, in f32); now it is one
	 * vector.  A residual Add folded into these stores (fuse_store_residual)
	 * reads another buffer (memplan never gives a kernel's input and output
	 * the same bytes), so the early stores do not change what it reads. */
	int64_t Ho = g->out[0], Wo = g->out[1], V = (Wo + TAIL_VEC - 1) / TAIL_VEC * TAIL_VEC;
	bool whole = Ho > 1 && V > Wo && V - Wo <= Wo && V <= Wp + Wo;
	int64_t r0[2] = {0, whole ? Ho - 1 : 0}, rn[2] = {whole ? Ho - 1 : Ho, whole ? 1 : 0};
	for (int part = 0; part < 2; part++) {
		if (!rn[part])
			continue;
		cg_append(m, blk, cg_loop(m, k, I(m, rn[part]), 0, &r, &rb));
		if (r0[part])
			r = add(m, I(m, r0[part]), r);
		cg_append(m, rb, cg_loop(m, k, I(m, whole && !part ? V : Wo), CG_VECTORIZE, &c, &cb));
		cg_append(m, cb, cg_st(m, rq ? rq->q : y, add(m, mul(m, pl[0], I(m, g->osz)),
		                                              add(m, mul(m, r, I(m, g->out[1])), c)),
		                       dw_value(m, rq, cg_ld(m, T, add(m, tp, add(m, mul(m, r, I(m, Wp)), c))),
		                                pl[1])));
	}
	return KILN_OK;
}

/* ---- depthwise on small planes: channel-blocked ---------------------------
 * On a plane of a few columns (7x7: the last stage of MobileNets and
 * EfficientNets, reached by stride 2 from 14x14) a row has too few outputs
 * to fill vectors, and stride 2 makes every tap a gather.  So the vectors
 * run over channels instead, as ORT's NCHWc kernels do.  Per image and
 * block of DW_CB channels: the block's input planes are transposed (one
 * CG_TRANSPOSE, in registers) into Q[H*W][DW_CB], copied into a zero-padded
 * P[Hp][Wp][DW_CB], and the weights into WL[taps][DW_CB] (another
 * transpose); each output pixel is one vector of channels summed over the
 * taps, P[(oh*s + kh*d)*Wp + ow*s + kw*d][:] * WL[tap][:], stored in
 * T[Ho*Wo][DW_CB], and T is transposed back into y's planes.  Lanes past C
 * in the last block compute values nobody copies out.  An activation
 * folds into T's stores (cg_kernel.act_buf); y is written by a transpose
 * only, so a residual Add does not fold (final_act_only).
 * The transposes cost about as much as a 3x3 conv's taps, so this pays only
 * where the planar forms waste most: MobileNetV3-Large at batch 1, one
 * thread (kiln bench --profile, best of 3, against the flat or strided
 * forms with the same multiply-adds): 672 channels 14x14 -> 7x7, 5x5
 * stride 2: 0.29 -> 0.10 ms; 960 channels 7x7, 5x5: 0.098 -> 0.071-0.09 ms;
 * MobileNetV2's 960 channels 7x7, 3x3: 0.049 -> 0.048 ms; but at 14x14,
 * 3x3 it was 10-25% slower than the flat form, and at 28x28 15% slower. */
enum { DW_CB = 16, DW_BLOCK_W = 8 };

/* Whether the channel-blocked form computes this depthwise conv: f32, one
 * output channel per input channel, 2-D, rows of at most DW_BLOCK_W
 * outputs, or DW_BLOCK_W2 at stride 2 along rows, where the planar forms
 * split every row first and a 14-column row is an 8-wide vector and
 * scalar edges.  One depthwise + ReLU6, batch 1, one thread, kiln bench
 * min over 5 x 200 runs, planar -> blocked (ms, Zen 4): 28x28 -> 14x14
 * 240 channels 5x5 0.147 -> 0.090, 192 channels 3x3 0.093 -> 0.063 (ORT
 * 0.071, 0.044 with its reorders); 56 -> 28 lost (144 channels 3x3 0.118
 * -> 0.223, 72 channels 5x5 0.106 -> 0.114).  So do 25 taps or more (5x5)
 * at stride 1, whose 25 multiply-adds per output pay for the transposes
 * that 3x3's 9 do not (dw_flat there): one depthwise + ReLU6 at 14x14,
 * kiln bench min over 5 x 300 runs, flat -> blocked (ms, Zen 4): 480
 * channels 0.113 -> 0.096, 672 channels 0.159 -> 0.133 (ORT 0.133 and
 * 0.204 with its reorders); in EfficientNet-B0 (kernel min, 7 alternating
 * rounds) 0.113 -> 0.098, 0.159 -> 0.138, 0.157 -> 0.140; at 28x28 it
 * stays planar.  The 8-bit convs (f32 false) keep DW_BLOCK_W: not
 * measured there. */
enum { DW_BLOCK_W2 = 16 };
/* The blocks in at most DW_PARTS parts over the threads, each part reusing
 * one set of Q, P and T (about 115 KB for 16 channels of 28x28): with 16
 * parts, one thread went through 1.4 MB of scratch per conv, out of L2.
 * MobileNetV2 batch 1, one thread, kernel min over 5 alternating rounds
 * (ms, Zen 4): 192 channels 28x28 -> 14x14 0.106 -> 0.074 (alone, its
 * scratch in cache between runs, 0.053), 576 channels 14x14 -> 7x7 0.058
 * -> 0.052; MNASNet's 240 channels 5x5 28x28 -> 14x14 0.174 -> 0.147.
 * Four parts keep two threads even (as CHUNK_PARTS). */
enum { DW_PARTS = 4 };
/* Input rows wider than this are transposed one by one straight into the
 * padded block, the narrower ones all at once and then copied into it:
 * MNASNet's 240-channel 5x5 stride-2 conv at 28x28 (bench/ab.py --nodes,
 * min of 7 rounds, batch 1, one thread, Sapphire Rapids) 0.089 -> 0.076
 * ms row by row; its 1152-channel 5x5 at 7x7 row by row 0.054 -> 0.064
 * (7 register transposes of 7 columns each instead of 4 over 49). */
enum { DW_ROW_T = 16 };
static bool dw_blocked_shape(const geom *g, int64_t Mg, bool f32)
{
	return g->nsp == 2 && Mg == 1 &&
	       g->out[1] <= (f32 && (g->stride[1] == 2 || g->ksz >= 25) ? DW_BLOCK_W2 : DW_BLOCK_W);
}

/* 3x3 taps at stride 1 take it too.  They stayed with the flat form
 * (dw_flat) when it measured faster on Zen 4 (one 3x3 depthwise conv +
 * ReLU6, batch 1, one thread, blocked -> flat: MobileNetV2's 960 channels
 * 7x7 0.057 -> 0.043 ms, MNASNet's 1152 channels 0.062 -> 0.052), before
 * the blocked form read its bias once per block and its weights packed at
 * compile time (1152 channels 5x5 at 7x7 on that Zen 4: 0.094 -> 0.071).
 * Since, on Sapphire Rapids (bench/ab.py --nodes, min of 7 rounds, batch
 * 1, one thread), flat -> blocked: MobileNetV2's three 960-channel 3x3
 * convs at 7x7 0.043 -> 0.033-0.035 ms, MNASNet's 1152-channel one 0.057
 * -> 0.043, EfficientNet-B0's 0.052 -> 0.038.  (Not re-measured on Zen
 * 4.) */
static bool want_blocked(const cg_module *m, const geom *g, int x, int64_t Mg)
{
	return dw_blocked_shape(g, Mg, true) && m->buf[x].dt == KILN_F32;
}

/* dw_blocked's weights and bias packed at compile time, when constant:
 * per block of DW_CB channels, its taps' vectors, tap-major, then its bias
 * vector, lanes past C zero.  -1 when not constant (a training library's
 * state) or out of memory. */
static int dw_packed(cg_module *m, const ir_node *n, const int *in, int64_t C, int64_t taps)
{
	const kiln_tensor *wt = const_data(m, in[1]);
	const kiln_tensor *bt = n->nin > 2 && in[2] >= 0 ? const_data(m, in[2]) : NULL;
	if (!wt || kiln_tensor_numel(wt) != C * taps || (n->nin > 2 && in[2] >= 0 && !bt))
		return -1;
	int64_t NB = (C + DW_CB - 1) / DW_CB, wsz = (taps + 1) * DW_CB;
	kiln_tensor *t = arena_tensor(m, KILN_F32, NB * wsz);
	if (!t)
		return -1;
	float *d = t->data;
	memset(d, 0, (size_t)(NB * wsz) * sizeof *d);
	for (int64_t c = 0; c < C; c++) {
		float *blk = d + c / DW_CB * wsz + c % DW_CB;
		for (int64_t i = 0; i < taps; i++)
			blk[i * DW_CB] = (float)ir_load(wt, c * taps + i);
		blk[taps * DW_CB] = bt ? (float)ir_load(bt, c) : 0.0f;
	}
	return const_buf(m, t, in[1], "blk");
}

/* Where dw_blocked's sums read their block: src at base, rows of rw
 * pixels (DW_CB floats each), tap (kh, kw) of output (r, c) at pixel
 * (r*s0 + kh*d0 - oy, c*s1 + kw*d1 - ox); guard: that pixel may lie
 * outside the h x w plane (x read in place: zero there). */
typedef struct dw_src {
	int buf;
	cg_expr *base;
	int64_t rw, oy, ox, h, w;
} dw_src;

/* dw_blocked's sums of the outputs [r0, r1) x [c0, c1) into T at tp,
 * each a vector of the block's channels from the bias (at bo in WL, when
 * bias) over the taps (weights at wp in WL) */
static void dw_blocked_sums(cg_module *m, cg_kernel *k, cg_stmt *qb, const geom *g,
                            const dw_src *sr, bool guard, int64_t r0, int64_t r1, int64_t c0,
                            int64_t c1, int WL, cg_expr *wp, cg_expr *bo, bool bias, int T,
                            cg_expr *tp)
{
	if (r1 <= r0 || c1 <= c0)
		return;
	int64_t Wo = g->out[1];
	cg_expr *r, *c, *l, *tv[2], *part;
	cg_stmt *rb, *cb, *lb;
	cg_append(m, qb, cg_loop(m, k, I(m, r1 - r0), 0, &r, &rb));
	cg_append(m, rb, cg_loop(m, k, I(m, c1 - c0), 0, &c, &cb));
	r = add(m, r, I(m, r0)), c = add(m, c, I(m, c0));
	cg_append(m, cb, cg_loop(m, k, I(m, DW_CB), CG_VECTORIZE, &l, &lb));
	cg_expr *acc = cg_local(m, k, lb, KILN_F32, bias ? cg_ld(m, WL, add(m, bo, l))
	                                               : fc(m, KILN_F32, 0));
	cg_stmt *tb = tap_rows(m, k, lb, g, acc, tv, &part);
	cg_expr *ih = add(m, add(m, mul(m, r, I(m, g->stride[0])), mul(m, tv[0], I(m, g->dil[0]))),
	                  I(m, -sr->oy));
	cg_expr *iw = add(m, add(m, mul(m, c, I(m, g->stride[1])), mul(m, tv[1], I(m, g->dil[1]))),
	                  I(m, -sr->ox));
	cg_expr *valid = NULL;
	if (guard) {
		valid = cg_bin(m, CG_AND, cg_bin(m, CG_AND, cg_bin(m, CG_GE, ih, I(m, 0)),
		                                 cg_bin(m, CG_LT, ih, I(m, sr->h))),
		               cg_bin(m, CG_AND, cg_bin(m, CG_GE, iw, I(m, 0)),
		                      cg_bin(m, CG_LT, iw, I(m, sr->w))));
		ih = cg_clamp(m, ih, I(m, sr->h)), iw = cg_clamp(m, iw, I(m, sr->w));
	}
	cg_expr *xi = add(m, add(m, sr->base, mul(m, add(m, mul(m, ih, I(m, sr->rw)), iw),
	                                          I(m, DW_CB))), l);
	cg_expr *xv = cg_ld(m, sr->buf, xi);
	if (valid)
		xv = cg_select(m, valid, xv, fc(m, KILN_F32, 0));
	cg_expr *wi = add(m, add(m, wp, mul(m, lin(m, 2, tv, g->k), I(m, DW_CB))), l);
	cg_set(m, tb, part, add(m, part, mul(m, xv, cg_ld(m, WL, wi))));
	cg_append(m, lb, cg_st(m, T, add(m, add(m, tp, mul(m, add(m, mul(m, r, I(m, Wo)), c),
	                                                       I(m, DW_CB))), l), acc));
}

/* The share of a blocked conv's outputs, in tenths, whose taps must all
 * lie inside x for dw_blocked to read x in place (the rest, guarded tap
 * by tap, cost more than the copy into P): MNASNet (bench/ab.py --nodes,
 * min of 5 rounds, batch 1, one thread, Sapphire Rapids), in place ->
 * copied: its 5x5 convs at 14x14 (100 of 196 inside) 0.054 -> 0.050 ms,
 * at 7x7 (9 of 49) 0.039 -> 0.031; its 3x3 ones at 14x14 (144 of 196)
 * copied -> in place 0.027 -> 0.020, the 5x5 stride-2 one to 14x14 (144)
 * 0.046 -> 0.023. */
enum { DW_DIRECT_TENTHS = 6, DW_DIRECT_W = 28 };
/* cg_dw_direct_ok: 5x5 taps read in place take blocks up to DW_DIRECT_W
 * wide (EfficientNet-B0's 240-channel 5x5 conv at 28x28, planar -> in
 * place, 0.145 -> 0.128 ms, bench/ab.py --nodes as above), and 3x3 ones
 * at stride 2, whose planar form splits the rows first (MobileNetV2's
 * 144-channel 56 -> 28: 0.141 -> 0.066 ms, its 1x1 conv writing the
 * blocks at 56x56); 3x3 ones at stride 1 stay planar at 28x28
 * (MobileNetV2's 192-channel ones 0.050 -> 0.060). */

/* The outputs [lo, hi) of one dim whose every tap lies inside the input
 * (n long, padded by pad before): lo = ceil(pad / s), hi past the last
 * o with o*s + (k - 1)*d - pad <= n - 1; hi >= lo, both within [0, out]. */
static void inside_span(int64_t out, int64_t n, int64_t pad, int64_t s, int64_t k, int64_t d,
                        int64_t *lo, int64_t *hi)
{
	int64_t a = (pad + s - 1) / s, top = n - 1 + pad - (k - 1) * d;
	int64_t b = top < 0 ? 0 : top / s + 1;
	*lo = a < out ? a : out;
	*hi = b < *lo ? *lo : b > out ? out : b;
}

static kiln_status dw_blocked(cg_module *m, const ir_node *n, const int *in, int y,
                              const geom *g, int64_t C, kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	int64_t H = g->in[0], W = g->in[1], pt = g->pad[0], pw = g->pad[1];
	int64_t Ho = g->out[0], Wo = g->out[1], s0 = g->stride[0], s1 = g->stride[1];
	int64_t Hp = (Ho - 1) * s0 + (g->k[0] - 1) * g->dil[0] + 1;
	int64_t Wp = (Wo - 1) * s1 + (g->k[1] - 1) * g->dil[1] + 1;
	/* input rows and columns past Hp - pt, Wp - pw are read by no output */
	int64_t hin = H < Hp - pt ? H : Hp - pt, win = W < Wp - pw ? W : Wp - pw;
	int64_t NB = (C + DW_CB - 1) / DW_CB, taps = g->ksz;
	int64_t qsz = hin * W * DW_CB, psz = Hp * Wp * DW_CB, tsz = Ho * Wo * DW_CB;
	int64_t wsz = (taps + 1) * DW_CB; /* the weights, tap-major, then the bias */
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	/* the (image, block) slots in parts (parts_loop), the scratch per part */
	cg_expr *nq = mul(m, cg_dim(m, x->dim[0]), I(m, NB)), *np = parts_count(m, nq, DW_PARTS);
	/* x with its channels in blocks (cg_conv_blocked_ok): a block's rows
	 * are Q's as they lie in x, read in place (direct, below) or copied
	 * into P's padding with no transpose */
	bool inb = cg_buf_block(m, in[0]) != 0;
	if (inb && (cg_buf_block(m, in[0]) != DW_CB || C % DW_CB))
		return cg_lower_fail(m, n, err, KILN_EINVAL, "input in blocks of %d channels, of %lld "
		                     "(internal error)", cg_buf_block(m, in[0]), (long long)C);
	/* rows wider than DW_ROW_T go straight into P: no Q */
	bool per_row = W > DW_ROW_T && !inb;
	int Q = per_row || inb ? -1 : cg_lower_scratch(m, KILN_F32, mul(m, np, I(m, qsz)));
	/* x in blocks is read in place where most outputs have every tap
	 * inside it (direct; the others' taps guarded): no P */
	int64_t rlo, rhi, clo, chi;
	inside_span(Ho, H, pt, s0, g->k[0], g->dil[0], &rlo, &rhi);
	inside_span(Wo, W, pw, s1, g->k[1], g->dil[1], &clo, &chi);
	bool direct = inb && 10 * (rhi - rlo) * (chi - clo) >= DW_DIRECT_TENTHS * Ho * Wo;
	int P = direct ? -1 : cg_lower_scratch(m, KILN_F32, mul(m, np, I(m, psz)));
	/* y in channel blocks (lower.c's blocked_chain): T is y's block */
	bool outb = m->buf[y].block != 0;
	if (outb && (m->buf[y].block != DW_CB || C % DW_CB))
		return cg_lower_fail(m, n, err, KILN_EINVAL, "output in blocks of %d channels, of %lld "
		                     "(internal error)", m->buf[y].block, (long long)C);
	int T = outb ? y : cg_lower_scratch(m, KILN_F32, mul(m, np, I(m, tsz)));
	int WB = dw_packed(m, n, in, C, taps);
	int WL = WB >= 0 ? WB : cg_lower_scratch(m, KILN_F32, mul(m, np, I(m, wsz)));
	if ((Q < 0 && !per_row && !inb) || (P < 0 && !direct) || T < 0 || WL < 0)
		return nomem(m, n, err);
	cg_expr *pi, *q, *l;
	cg_stmt *qb, *lb;
	qb = parts_loop(m, k, k->body, nq, np, cg_par(m, mul(m, m->buf[y].numel, I(m, taps))), &pi,
	                &q);
	cg_expr *b = cg_bin(m, CG_DIV, q, I(m, NB)), *c0 = mul(m, cg_bin(m, CG_REM, q, I(m, NB)),
	                                                         I(m, DW_CB));
	cg_expr *nc = cg_bin(m, CG_MIN, I(m, DW_CB), cg_bin(m, CG_SUB, I(m, C), c0));
	cg_expr *qp = mul(m, pi, I(m, qsz)), *pp = mul(m, pi, I(m, psz));
	cg_expr *tp = mul(m, outb ? q : pi, I(m, tsz));
	cg_expr *wp = WB >= 0 ? mul(m, cg_bin(m, CG_REM, q, I(m, NB)), I(m, wsz)) : mul(m, pi, I(m, wsz));
	/* P: the block's input rows, channels last, zero-padded; WL: its
	 * weights, tap-major (packed so at compile time when constant: WB).
	 * Rows wider than DW_ROW_T: per input row a transpose into its place
	 * inside the padding; narrower, one transpose of the rows into Q, then
	 * Q copied into the padding (see DW_ROW_T) */
	cg_expr *src0 = mul(m, add(m, mul(m, b, I(m, C)), c0), I(m, H * W)), *ir = NULL, *prow = NULL;
	cg_stmt *irb = NULL;
	if (per_row) {
		zeros(m, k, qb, P, pp, pt * Wp * DW_CB);
		cg_append(m, qb, cg_loop(m, k, I(m, hin), 0, &ir, &irb));
		prow = add(m, pp, mul(m, add(m, ir, I(m, pt)), I(m, Wp * DW_CB)));
		zeros(m, k, irb, P, prow, pw * DW_CB);
	}
	cg_transpose tr[2] = {
		{.src = in[0], .dst = Q, .rows = nc, .cols = I(m, hin * W), .src_off = src0,
		 .src_rs = I(m, H * W), .dst_off = qp, .dst_rs = I(m, DW_CB)},
		{.src = in[1], .dst = WL, .rows = nc, .cols = I(m, taps),
		 .src_off = mul(m, c0, I(m, taps)), .src_rs = I(m, taps), .dst_off = wp,
		 .dst_rs = I(m, DW_CB)},
	};
	if (per_row) {
		tr[0].dst = P;
		tr[0].cols = I(m, win);
		tr[0].src_off = add(m, src0, mul(m, ir, I(m, W)));
		tr[0].dst_off = add(m, prow, I(m, pw * DW_CB));
	}
	for (int i = inb; i < (WB >= 0 ? 1 : 2); i++) {
		cg_stmt *ts = cg_transpose_stmt(m, &tr[i]);
		if (!ts)
			return nomem(m, n, err);
		cg_append(m, i == 0 && per_row ? irb : qb, ts);
	}
	if (per_row) {
		zeros(m, k, irb, P, add(m, prow, I(m, (pw + win) * DW_CB)), (Wp - pw - win) * DW_CB);
		zeros(m, k, qb, P, add(m, pp, I(m, (pt + hin) * Wp * DW_CB)),
		      (Hp - pt - hin) * Wp * DW_CB);
	} else if (inb && !direct) { /* block q of x: (image, block) in order, H*W rows of DW_CB */
		padded_plane(m, k, qb, P, pp, in[0], mul(m, q, I(m, H * W * DW_CB)), W * DW_CB, hin,
		             win, Hp, Wp, pt, pw, DW_CB, false);
	} else if (!inb) {
		padded_plane(m, k, qb, P, pp, Q, qp, W * DW_CB, hin, win, Hp, Wp, pt, pw, DW_CB, false);
	}
	/* the block's bias after its weights in WL, once per block: read per
	 * output pixel with the lanes past C masked, LLVM loaded it with two
	 * gathers per pixel.  One 5x5 depthwise conv + ReLU6, 1152 channels
	 * 7x7, batch 1, one thread, kiln bench min of 5 x 200 runs (ms, Zen
	 * 4): 0.094 -> 0.080; the weights packed at compile time (dw_packed)
	 * -> 0.071 (ORT 0.065-0.070 with its reorders) */
	cg_expr *bo = add(m, wp, I(m, taps * DW_CB));
	bool bias = n->nin > 2 && in[2] >= 0;
	if (bias && WB < 0) {
		cg_append(m, qb, cg_loop(m, k, I(m, DW_CB), CG_VECTORIZE, &l, &lb));
		cg_expr *ch = add(m, c0, l), *bv = cg_ld(m, in[2], cg_clamp(m, ch, I(m, C)));
		if (C % DW_CB)
			bv = cg_select(m, cg_bin(m, CG_LT, ch, I(m, C)), bv, fc(m, KILN_F32, 0));
		cg_append(m, lb, cg_st(m, WL, add(m, bo, l), bv));
	}
	/* T: one vector of channels per output pixel; the bias of lanes past
	 * C is 0, not read.  From P, or from x's block in place: the outputs
	 * whose taps all lie inside x unguarded, the rest (the borders) with
	 * each tap's load guarded.  The copy into P's padding (memcpy per
	 * row) was most of a blocked conv's time: EfficientNet-B0's
	 * 240-channel 3x3 stride-2 conv at 28x28 (a 1x1 conv -> Relu -> it ->
	 * Relu, batch 1, one thread, kiln bench --profile, Sapphire Rapids)
	 * 0.048 -> 0.022 ms, and with a 1x1 conv reading its blocks 0.034 ->
	 * 0.010 (ORT 0.016) */
	if (direct) {
		dw_src sr = {.buf = in[0], .base = mul(m, q, I(m, H * W * DW_CB)), .rw = W, .oy = pt,
		             .ox = pw, .h = H, .w = W};
		dw_blocked_sums(m, k, qb, g, &sr, true, 0, rlo, 0, Wo, WL, wp, bo, bias, T, tp);
		dw_blocked_sums(m, k, qb, g, &sr, true, rlo, rhi, 0, clo, WL, wp, bo, bias, T, tp);
		dw_blocked_sums(m, k, qb, g, &sr, false, rlo, rhi, clo, chi, WL, wp, bo, bias, T, tp);
		dw_blocked_sums(m, k, qb, g, &sr, true, rlo, rhi, chi, Wo, WL, wp, bo, bias, T, tp);
		dw_blocked_sums(m, k, qb, g, &sr, true, rhi, Ho, 0, Wo, WL, wp, bo, bias, T, tp);
	} else {
		dw_src sr = {.buf = P, .base = pp, .rw = Wp, .h = Hp, .w = Wp};
		dw_blocked_sums(m, k, qb, g, &sr, false, 0, Ho, 0, Wo, WL, wp, bo, bias, T, tp);
	}
	/* y's planes: T transposed back */
	cg_transpose to = {.src = T, .dst = y, .rows = I(m, Ho * Wo), .cols = nc,
	                   .src_off = tp, .src_rs = I(m, DW_CB),
	                   .dst_off = mul(m, add(m, mul(m, b, I(m, C)), c0), I(m, Ho * Wo)),
	                   .dst_rs = I(m, Ho * Wo)};
	cg_stmt *ts = outb ? NULL : cg_transpose_stmt(m, &to);
	if (!ts && !outb)
		return nomem(m, n, err);
	if (ts)
		cg_append(m, qb, ts);
	k->final_buf = y;
	k->act_buf = T;
	k->final_act_only = true;
	return KILN_OK;
}

/* The planes of a requantizing depthwise conv per chunk (conv_depthwise):
 * the largest divisor of its M channels up to DW_CHUNK that leaves at
 * least DW_CHUNKS chunks per image to share among threads at batch 1. */
enum { DW_CHUNK = 16, DW_CHUNKS = 8 };
static int64_t dw_chunk(int64_t M)
{
	for (int64_t c = DW_CHUNK; c > 1; c--)
		if (M % c == 0 && M / c >= DW_CHUNKS)
			return c;
	return 1;
}

/* The f32 depthwise planes in parts (parts_loop), each part's scratch
 * copies of a plane (padded: dw_flat; split: stride 2; converted) reused by
 * its planes while in cache, as many parts as keep them all within
 * DW_SCRATCH floats (at least DW_PARTS, at most DW_PLANE_PARTS, so more
 * threads than two still get pieces of small planes).  A copy per plane
 * made the scratch larger than the conv's input and output together
 * (MobileNetV2's 576-channel 14x14: 1.1 MB of it), each line of it
 * written once and read once. */
enum { DW_SCRATCH = 64 * 1024, DW_PLANE_PARTS = 64 };
static cg_expr *dw_plane_parts(cg_module *m, cg_expr *nm, const geom *g)
{
	int64_t hp = g->in[0] + (g->k[0] - 1) * g->dil[0] + 2;
	int64_t wp = g->in[1] + (g->k[1] - 1) * g->dil[1] + 2 * TAIL_VEC;
	int64_t per = 2 * hp * wp + g->isz, np = DW_SCRATCH / per;
	np = np < DW_PARTS ? DW_PARTS : np > DW_PLANE_PARTS ? DW_PLANE_PARTS : np;
	return parts_count(m, nm, np);
}

/* Depthwise 2-D conv (one input channel per output channel): per (image,
 * channel) plane and output row, the left edge, the interior and the right
 * edge of the row each accumulate all taps of an output pixel in a local
 * and store it once, instead of sweeping the plane once per tap. */
static kiln_status conv_depthwise(cg_module *m, const ir_node *n, const int *in, int y,
                                  const geom *g, const dw_requant *rq, const dw_convert *cv,
                                  kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *yt = cg_btype(m, y);
	int64_t C = x->dim[1], M = yt->dim[1], Mg = M / C, lo, hi;
	/* x in channel blocks: dw_blocked whatever the shape (lower.c's
	 * blocked_chain took it for one reading and writing blocks) */
	bool blocks = cg_buf_block(m, in[0]) || m->buf[y].block;
	if ((want_blocked(m, g, in[0], Mg) || blocks) && !rq && !cv)
		return dw_blocked(m, n, in, y, g, C, err);
	if (blocks) /* blocked_chain promised dw_blocked */
		return cg_lower_fail(m, n, err, KILN_EINVAL, "channel blocks, not the blocked "
		                     "depthwise form (internal error)");
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	cg_expr *bm, *oh, *slot, *j;
	cg_stmt *blk, *rb;
	cg_expr *nm = mul(m, cg_dim(m, x->dim[0]), I(m, M));
	/* with rq, the planes go in chunks of ch, one after the other on a
	 * thread, and the scratch copies of a plane (converted, split, padded)
	 * are per chunk: the next plane's copies overwrite them while they
	 * are in cache.  One copy per plane made the scratch as large as x in
	 * f32 (at batch 16, MobileNetV2's 144-channel 56x56 planes: 29 MB of
	 * it written to memory and read back) */
	int64_t ch = rq ? dw_chunk(M) : 1;
	cg_expr *nslot;
	uint32_t par = cg_par(m, mul(m, m->buf[y].numel, I(m, g->ksz)));
	if (!rq) { /* f32: the planes in parts, each reusing its scratch (dw_plane_parts) */
		nslot = dw_plane_parts(m, nm, g);
		blk = parts_loop(m, k, k->body, nm, nslot, par, &slot, &bm);
	} else {
		nslot = ch > 1 ? mul(m, cg_dim(m, x->dim[0]), I(m, M / ch)) : nm;
		cg_append(m, k->body, cg_loop(m, k, nslot, par, &bm, &blk));
		slot = bm;
	}
	if (ch > 1) {
		cg_stmt *cb;
		cg_append(m, blk, cg_loop(m, k, I(m, ch), 0, &j, &cb));
		blk = cb;
		bm = add(m, mul(m, slot, I(m, ch)), j);
	}
	cg_expr *mi = cg_bin(m, CG_REM, bm, I(m, M));
	/* plane of y, channel (weight row), plane of x, the element offset of
	 * that plane in xin[0] (x, or its converted copy), the scratch slot */
	cg_expr *pl[5] = {bm, mi, add(m, mul(m, cg_bin(m, CG_DIV, bm, I(m, M)), I(m, C)),
	                                 cg_bin(m, CG_DIV, mi, I(m, Mg))), NULL, slot};
	pl[3] = mul(m, pl[2], I(m, g->isz));
	int xin[3] = {in[0], in[1], n->nin > 2 ? in[2] : -1};
	if (cv) { /* this plane of x in f32 (one output per channel: no other reads it) */
		cg_expr *i, *at;
		cg_stmt *ib;
		xin[0] = cg_lower_scratch(m, KILN_F32, mul(m, nslot, I(m, g->isz)));
		if (xin[0] < 0)
			return nomem(m, n, err);
		cg_append(m, blk, cg_loop(m, k, I(m, g->isz), CG_VECTORIZE, &i, &ib));
		at = add(m, pl[3], i);
		cg_expr *v = cg_cast(m, cg_ld(m, cv->x, at), KILN_F32);
		if (cv->xz >= 0)
			v = cg_bin(m, CG_SUB, v, cg_cast(m, qv(m, cv->xz, at), KILN_F32));
		pl[3] = mul(m, slot, I(m, g->isz));
		cg_append(m, ib, cg_st(m, xin[0], add(m, pl[3], i), v));
	}
	in = xin;
	/* with rq, x may be the 8-bit tensor itself (no zero point): its
	 * copies (split, padded planes) and loads convert it */
	bool x8 = rq && m->buf[in[0]].dt != KILN_F32;
	if (want_flat(m, g, in[0], x8, rq != NULL)) {
		kiln_status st = dw_flat(m, k, blk, n, in, y, g, pl, nslot, rq, err);
		k->final_buf = rq ? -1 : y;
		return st;
	}
	/* stride 2: the plane of x split into even and odd columns first */
	split sp = {.buf = -1, .half = (g->in[1] + 1) / 2};
	if (want_split(g) && (m->buf[in[0]].dt == KILN_F32 || x8)) {
		sp.rows = by_rows(g);
		/* guarded: zeros around each half's columns, as many as the taps
		 * of the first and last output columns read, so every column runs
		 * in the vector loop (the edge columns ran scalar, each tap tested
		 * and clamped); the columns start a vector in (lead) and the halves
		 * are whole vectors, so two of a 3x3 row's three tap loads are
		 * aligned (with lead = 1, all three straddled lines: 16% slower).
		 * One conv + ReLU, batch 1, one thread, min of 5 x 200 runs, Zen 4
		 * (ms): 48 channels 112 -> 56 3x3 0.104 -> 0.093, 96 channels
		 * 0.204 -> 0.187; in MobileNetV2 (kernel min of 3 x 60 runs) its
		 * 112 -> 56 0.201 -> 0.192, 56 -> 28 0.119 -> 0.109. */
		int64_t dmax = (g->k[1] - 1) * g->dil[1] - g->pad[1];
		int64_t need = g->out[1] - 1 + (dmax >= 0 ? dmax / 2 : -((1 - dmax) / 2)) + 1;
		sp.guard = true;
		sp.lead = ((g->pad[1] + 1) / 2 + TAIL_VEC - 1) / TAIL_VEC * TAIL_VEC;
		sp.half = sp.lead + (need > (g->in[1] + 1) / 2 ? need : (g->in[1] + 1) / 2);
		sp.half = (sp.half + TAIL_VEC - 1) / TAIL_VEC * TAIL_VEC;
		int64_t psz = (sp.rows ? g->k[0] : g->in[0]) * 2 * sp.half;
		sp.buf = cg_lower_scratch(m, KILN_F32, mul(m, nslot, I(m, psz)));
		if (sp.buf < 0)
			return nomem(m, n, err);
		sp.plane = mul(m, slot, I(m, psz));
		split_guards(m, k, blk, &sp, sp.rows ? g->k[0] : g->in[0], g->in[1]);
		if (!sp.rows)
			split_plane(m, k, blk, in[0], pl[3], &sp, g->in[0], g->in[1]);
	}
	/* the output rows whose taps all lie inside run apart, with no row
	 * tests: LLVM made each tap row's test a branch around the interior's
	 * loads (MobileNetV2 int8 at batch 1, one thread, kiln bench
	 * --profile: the 144-channel 56x56 stride-1 conv 0.25 -> 0.17-0.19
	 * ms; the whole model 2.65 -> 2.45 ms).  In f32, one depthwise conv +
	 * ReLU, batch 1, one thread, min of 5 x 100 runs (ms, Zen 4): 144
	 * channels 56x56 3x3 0.240 -> 0.201, 32 at 112x112 0.153 -> 0.140,
	 * 144 at 56 -> 28 5x5 0.217 -> 0.170, 72 channels 0.105 -> 0.085; the
	 * 28x28 and 14x14 5x5 ones and 112 -> 56 within 1%. */
	int64_t rlo, rhi;
	dw_span_d(g, 0, &rlo, &rhi);
	int64_t r0[3] = {0, rlo, rhi}, rext[3] = {rlo, rhi - rlo, g->out[0] - rhi};
	dw_span(g, &lo, &hi);
	if (sp.guard) /* every column reads the guarded copy */
		lo = 0, hi = g->out[1];
	int64_t c0[3] = {0, lo, hi}, ext[3] = {lo, hi - lo, g->out[1] - hi};
	/* stride 1, unsplit: the rows with every tap inside in groups of
	 * DW_ROWS (dw_cols_rows), the rest one at a time */
	bool grouped = sp.buf < 0 && g->stride[0] == 1 && g->stride[1] == 1 && rext[1] >= DW_ROWS &&
	               g->out[1] <= DW_ROWS_W;
	if (grouped) {
		int64_t ng = rext[1] / DW_ROWS;
		cg_expr *gi;
		cg_append(m, blk, cg_loop(m, k, I(m, ng), 0, &gi, &rb));
		cg_expr *oh0 = add(m, I(m, rlo), mul(m, gi, I(m, DW_ROWS)));
		for (int r = 0; r < 3; r++) {
			int64_t st[2] = {c0[r]}, len[2] = {ext[r]};
			int ns = r == 1 ? vector_spans(c0[r], ext[r], st, len) : 1;
			for (int q = 0; q < ns; q++) {
				if (len[q] <= 0)
					continue;
				if (r == 1)
					dw_cols_rows(m, k, rb, n, in, y, g, pl, oh0, st[q], len[q], rq);
				else
					for (int a = 0; a < DW_ROWS; a++)
						dw_cols(m, k, rb, n, in, y, g, pl, add(m, oh0, I(m, a)), st[q], len[q],
						        false, true, &sp, rq);
			}
		}
		r0[1] = rlo + ng * DW_ROWS;
		rext[1] -= ng * DW_ROWS;
	}
	for (int seg = 0; seg < 3; seg++) {
		if (rext[seg] <= 0)
			continue;
		cg_append(m, blk, cg_loop(m, k, I(m, rext[seg]), 0, &oh, &rb));
		if (r0[seg])
			oh = add(m, I(m, r0[seg]), oh);
		if (sp.buf >= 0 && sp.rows)
			split_rows(m, k, rb, in[0], pl[3], &sp, g, oh);
		for (int r = 0; r < 3; r++) {
			int64_t st[2] = {c0[r]}, len[2] = {ext[r]};
			int ns = r == 1 ? vector_spans(c0[r], ext[r], st, len) : 1;
			for (int q = 0; q < ns; q++)
				if (len[q] > 0)
					dw_cols(m, k, rb, n, in, y, g, pl, oh, st[q], len[q], r == 1, seg == 1,
					        &sp, rq);
		}
	}
	k->final_buf = rq ? -1 : y;
	return KILN_OK;
}

/* ---- grouped convs: direct, register-blocked -------------------------------
 * A grouped 2-D conv with several input channels per group (ResNeXt: 4-32,
 * RegNet: 8 and up) as im2col and one GEMM per group runs GEMMs of M = Mg
 * rows, too few to fill the GEMM's tiles and amortise its packing, and
 * moves ksz copies of the input through memory.  Instead, per (image,
 * group, chunk of R output rows), over the threads:
 *  - the group's input rows the chunk reads are copied, zero-padded, into
 *    Q as s0 x s1 phase planes (stride s: plane (p0, p1) holds the padded
 *    input's rows s*i + p0, columns s*j + p1), so that tap (kh, kw) of
 *    output (r, c) is element (r + a, c + b) of plane ((kh*d0) % s0,
 *    (kw*d1) % s1), a = kh*d0 / s0, b = kw*d1 / s1: every tap, stride 1 or
 *    2, is a contiguous run with no bounds test (the padding is zeros);
 *  - per block of MB output channels, the outputs run flat over the
 *    chunk's rows of Wq columns (f = r*Wq + c, the Wq - Wo columns past a
 *    row's end computed and dropped), GC_NP vectors of f per iteration (f
 *    and f + F/GC_NP) with MB accumulators each, over CU input channels
 *    and every tap unrolled here: each loaded vector of Q feeds MB
 *    multiply-adds and each weight GC_NP.  Between chunks of CU channels
 *    the sums go through T (in L1: MB x at most 2*GC_FLAT).
 *  - T's rows are copied into y: the only stores to y, so an activation
 *    and a residual Add fold into them (final_buf).
 * The MB x CU*ksz weights of a flat loop are invariant in it, and LLVM
 * hoists them all as broadcast vectors: they must fit the registers beside
 * the accumulators.  MB = 8 over 8 channels of 3x3 (576 weights) spilled
 * them to 36 KB of stack; 4 x one channel of 3x3 (36) does not.  Per
 * layer, against im2col + GEMM (min of 3 alternating rounds of kiln bench,
 * batch 1, one thread; one 3x3 conv + Relu; ms): ResNeXt-50's 128 channels
 * 56x56, 32 groups 1.78 -> 0.52, 1024 channels 7x7 0.39 -> 0.26; RegNetX-
 * 800MF's 64 channels 56x56, 4 groups 0.86 -> 0.58, 672 channels 7x7
 * 0.137 -> 0.098; MB = 8 and 8 channels lost to the GEMMs on 7x7 planes
 * (0.39 -> 0.51).  The weights, spilled (36 with 4 accumulators), are
 * reloaded once per GC_NP vectors: with 2, RegNetX-800MF's grouped convs
 * (Zen 4, kernel min over 5 x 100 runs, ms) 64 channels 112x112 stride
 * 2 0.94 -> 0.82, 128 channels 28x28 0.396 -> 0.328, 288 at 14x14 0.214
 * -> 0.187, 672 at 7x7 0.131 -> 0.125 (ORT: 0.835, 0.374, 0.222, 0.182);
 * 4 vectors rounded 14x14's F up to 64 lanes (0.237), and MB = 2 with 4
 * vectors was 1-11% slower than 4 with 2.  Groups of 128 channels lost (1.97 -> 2.31 ms, 512
 * channels 14x14, 4 groups): conv_grouped_wins keeps the GEMMs there.
 * docs/PERFORMANCE.md has the rest. */
enum { GC_FLAT = 512, GC_MB = 4, GC_TAPS = 9, GC_PARTS = 4, GC_NP = 2 };


/* A target that wants every nest on its grid (a GPU: cg_lower_opts.par_work
 * 1) would run conv_grouped's slots one thread each, their loops serial:
 * there the GEMMs stay, unless forced. */
static bool grid_target(const cg_module *m)
{
	return m->par_work == 1;
}

/* The largest divisor of v that is at most cap (1 at least). */
static int64_t divisor_upto(int64_t v, int64_t cap)
{
	for (int64_t d = cap < v ? cap : v; d > 1; d--)
		if (v % d == 0)
			return d;
	return 1;
}

/* Whether the direct form computes this conv: f32, 2-D, grouped with more
 * than one input channel per group. */
static bool grouped_shape(const cg_module *m, const ir_node *n, int x, const geom *g)
{
	const ir_type *xt = cg_btype((cg_module *)m, x);
	int64_t grp = ir_attr_int(n, "group", 1);
	return g->nsp == 2 && grp > 1 && xt->dim[1] / grp > 1 && m->buf[x].dt == KILN_F32 &&
	       g->stride[0] <= 4 && g->stride[1] <= 4;
}

/* ---- grouped convs, output channels in the lanes --------------------------
 * Where a group's output channels fill whole vectors (Mg a multiple of
 * GL_OB: RegNetX's groups of 16, ResNeXt's later stages), the sums run the
 * other way round, as ORT's NCHWc convs do: one vector holds GL_OB output
 * channels of one output pixel, and per input channel and tap it takes one
 * vector of weights (packed at compile time, gl_packed) times one input
 * value broadcast from Q (the padded rows conv_grouped copies),
 * for GL_RT pixels of a row at a time: GL_RT multiply-adds per weight load,
 * no lane computing a pixel past the row's end, where the flat form spends
 * a load of Q and a spilled weight per few multiply-adds and computes
 * Wq - Wo padding columns per row.  T holds the chunk's pixels, GL_OB
 * channels each; a transpose writes them into y's planes (so an activation
 * folds into TF's stores, a residual Add does not), or, where a 1x1 conv
 * reads y in channel blocks of GL_OB (cg_grouped_blocked_ok), TF is y's
 * block and the tiles store it as it is: RegNetX-800MF's grouped convs
 * (batch 1, one thread, bench/ab.py --nodes, 7 rounds) 288 channels at
 * 14x14 0.158 -> 0.142 ms, 672 at 7x7 0.112 -> 0.100, their 1x1 readers
 * 672 -> 672 at 7x7 0.338 -> 0.320 (B in blocks, kiln_sgemm_pm's); all
 * kernels 12.69 -> 12.30 ms.  The vector loop is
 * CG_LANES: left to LLVM's vectorizer, LICM hoisted its 504 broadcasts
 * and spilled them (3-5x slower than the flat form).  One grouped conv +
 * Relu, groups of 16, batch 1, one thread, kiln bench min of 5 x 200 runs
 * (ms, Zen 4), flat -> lanes: 288 channels 14x14 0.185 -> 0.163, 128
 * channels 28x28 0.312 -> 0.287, 64 channels 112 -> 56 stride 2 0.736 ->
 * 0.663, 672 channels 7x7 0.125 -> 0.098 (ORT alone 0.170, 0.301, 0.655,
 * 0.133); RegNetX-800MF 17.18 -> 16.41.  Tiles of 7 or 8 pixels and
 * passes of 2 or 8 channels measured within 2% of 14 and 4. */
enum { GL_OB = 16, GL_RT = 14, GL_CU = 4 };

/* The lanes of the lanes form's vectors for Mg output channels a group:
 * GL_OB, or 0 (the flat form).  Groups of 8 (RegNetY-400MF's) in vectors
 * of 8 measured slower than the flat form (one conv + Relu, batch 1, one
 * thread, min of 5 x 200 runs, Zen 4: 208 channels 14x14 0.073 -> 0.076
 * ms, 104 channels 28x28 0.138 -> 0.152). */
static int64_t gl_lanes(int64_t Mg)
{
	return Mg % GL_OB == 0 ? GL_OB : 0;
}

/* The weights w[M][Cg][taps] packed per block of ob output channels,
 * [M / ob][Cg][taps][ob]; -1 when not constant or out of memory. */
static int gl_packed(cg_module *m, const int *in, int64_t M, int64_t Cg, int64_t taps, int64_t ob)
{
	const kiln_tensor *wt = const_data(m, in[1]);
	if (!wt || kiln_tensor_numel(wt) != M * Cg * taps)
		return -1;
	kiln_tensor *t = arena_tensor(m, KILN_F32, M * Cg * taps);
	if (!t)
		return -1;
	float *d = t->data;
	for (int64_t oc = 0; oc < M; oc++)
		for (int64_t ci = 0; ci < Cg; ci++)
			for (int64_t i = 0; i < taps; i++)
				d[((oc / ob * Cg + ci) * taps + i) * ob + oc % ob] =
				    (float)ir_load(wt, (oc * Cg + ci) * taps + i);
	return const_buf(m, t, in[1], "gl");
}

/* One slot of conv_grouped for the lanes form: image b, group gi, output
 * rows r0 .. r0 + R; its scratch Q (at qp, filled), T and TF (at tp); the
 * packed weights WB in blocks of ob output channels. */
typedef struct gl_slot {
	cg_expr *b, *gi, *r0, *qp, *tp;
	int Q, T, TF, WB;
	int64_t R, Wq, qpl, Cg, Mg, M, ob;
	int64_t c0, c1; /* Q's phases a dim (1: the padded rows as they are) */
	bool yblk;      /* y in channel blocks of ob: TF is y's block itself */
} gl_slot;

/* One tile of na pixels of a row (columns col on, row r of the chunk) of
 * one block of ob output channels (oc0; its weights at wb): CU input
 * channels per pass, unrolled with the taps (LLVM vectorizes innermost
 * loops only); the first pass starts from the bias, the others from T,
 * and the last stores into TF, where an activation folds (act_buf: not
 * into T's partial sums). */
static void gl_tile(cg_module *m, cg_kernel *k, cg_stmt *tb, const ir_node *n, const int *in,
                    const geom *g, const gl_slot *s, cg_expr *oc0, cg_expr *wb, cg_expr *r,
                    cg_expr *col, int64_t na)
{
	int64_t Wo = g->out[1], s0 = g->stride[0], s1 = g->stride[1], ksz = g->ksz, ob = s->ob;
	int64_t Cg = s->Cg, CU = divisor_upto(Cg, GL_CU), nch = Cg / CU;
	int64_t q0s = s->c0, q1s = s->c1, js = s1 / q1s; /* a pixel's step in Q's row */
	cg_expr *c0 = add(m, mul(m, r, I(m, s0 / q0s * s->Wq)), mul(m, col, I(m, js)));
	cg_expr *px = add(m, mul(m, r, I(m, Wo)), col);
	bool bias = n->nin > 2 && in[2] >= 0;
	for (int pass = 0; pass < 3; pass++) {
		int64_t cnt = pass == 1 ? nch - 2 : 1, first = pass == 2 ? nch - 1 : pass;
		if (cnt <= 0 || (pass == 2 && nch == 1))
			continue;
		cg_expr *cc = I(m, first), *l;
		cg_stmt *body = tb, *ccb, *lb;
		if (pass == 1) {
			cg_append(m, tb, cg_loop(m, k, I(m, cnt), 0, &cc, &ccb));
			body = ccb;
			cc = add(m, cc, I(m, 1));
		}
		bool fin = pass == 2 || nch == 1;
		int dst = fin ? s->TF : s->T;
		/* TF's pixel 0 of this block: T's, or y's (its block oc0 / ob,
		 * row r0) */
		cg_expr *fo = fin && s->yblk ? add(m, mul(m, add(m, mul(m, s->b, I(m, s->M)), oc0),
		                                          I(m, g->osz)),
		                                   mul(m, s->r0, I(m, Wo * ob)))
		                             : s->tp;
		cg_append(m, body, cg_loop(m, k, I(m, ob), CG_VECTORIZE | CG_LANES, &l, &lb));
		cg_expr *acc[GL_RT], *ti[GL_RT], *di[GL_RT];
		for (int64_t j = 0; j < na; j++) {
			ti[j] = add(m, add(m, s->tp, mul(m, add(m, px, I(m, j)), I(m, ob))), l);
			di[j] = add(m, add(m, fo, mul(m, add(m, px, I(m, j)), I(m, ob))), l);
			cg_expr *init = pass ? cg_ld(m, s->T, ti[j])
			                     : bias ? cg_ld(m, in[2], add(m, oc0, l)) : fc(m, KILN_F32, 0);
			acc[j] = cg_local(m, k, lb, KILN_F32, init);
		}
		for (int64_t u = 0; u < CU; u++) {
			cg_expr *ci = add(m, mul(m, cc, I(m, CU)), I(m, u));
			for (int64_t kh = 0; kh < g->k[0]; kh++)
				for (int64_t kw = 0; kw < g->k[1]; kw++) {
					int64_t ph = (kh * g->dil[0]) % q0s * q1s + (kw * g->dil[1]) % q1s;
					int64_t off = (kh * g->dil[0] / q0s) * s->Wq + kw * g->dil[1] / q1s;
					cg_expr *wi = add(m, mul(m, ci, I(m, ksz)), I(m, kh * g->k[1] + kw));
					cg_expr *wv = cg_ld(m, s->WB, add(m, add(m, wb, mul(m, wi, I(m, ob))), l));
					cg_expr *q0 = add(m, add(m, s->qp, mul(m, add(m, mul(m, ci, I(m, q0s * q1s)),
					                                               I(m, ph)), I(m, s->qpl))),
					                  add(m, I(m, off), c0));
					for (int64_t j = 0; j < na; j++)
						cg_set(m, lb, acc[j], add(m, acc[j], mul(m, cg_ld(m, s->Q, add(m, q0, I(m, j * js))),
						                                         wv)));
				}
		}
		for (int64_t j = 0; j < na; j++)
			cg_append(m, lb, cg_st(m, dst, di[j], acc[j]));
	}
}

/* The lanes form's sums for one slot of conv_grouped (image b, group gi,
 * output rows r0 .. r0 + R), its Q at qp filled: per block of ob output
 * channels of the group, T's pixels in tiles of at most GL_RT a row (as
 * even as whole tiles allow: 17 columns are 9 + 8, not 14 + 3), then y's
 * planes by a transpose (none when the tiles stored y's blocks). */
static kiln_status gl_sums(cg_module *m, cg_kernel *k, cg_stmt *blk, const ir_node *n,
                           const int *in, int y, const geom *g, const gl_slot *s, kiln_error *err)
{
	int64_t Wo = g->out[1], ob = s->ob, nt = (Wo + GL_RT - 1) / GL_RT;
	int64_t RT = (Wo + nt - 1) / nt, full = Wo / RT, rest = Wo - full * RT;
	cg_expr *mb, *r, *t;
	cg_stmt *mbb, *rb, *tb;
	cg_append(m, blk, cg_loop(m, k, I(m, s->Mg / ob), 0, &mb, &mbb));
	cg_expr *oc0 = add(m, mul(m, s->gi, I(m, s->Mg)), mul(m, mb, I(m, ob)));
	cg_expr *wb = mul(m, oc0, I(m, s->Cg * g->ksz)); /* oc0 / ob * Cg * ksz * ob */
	cg_append(m, mbb, cg_loop(m, k, I(m, s->R), 0, &r, &rb));
	cg_append(m, rb, cg_loop(m, k, I(m, full), 0, &t, &tb));
	gl_tile(m, k, tb, n, in, g, s, oc0, wb, r, mul(m, t, I(m, RT)), RT);
	if (rest)
		gl_tile(m, k, rb, n, in, g, s, oc0, wb, r, I(m, full * RT), rest);
	k->final_buf = y;
	k->act_buf = s->TF;
	k->final_act_only = true;
	if (s->yblk) /* the tiles stored y's blocks */
		return KILN_OK;
	cg_transpose to = {.src = s->TF, .dst = y, .rows = I(m, s->R * Wo), .cols = I(m, ob),
	                   .src_off = s->tp, .src_rs = I(m, ob),
	                   .dst_off = add(m, mul(m, add(m, mul(m, s->b, I(m, s->M)), oc0), I(m, g->osz)),
	                                  mul(m, s->r0, I(m, Wo))),
	                   .dst_rs = I(m, g->osz)};
	cg_stmt *ts = cg_transpose_stmt(m, &to);
	if (!ts)
		return nomem(m, n, err);
	cg_append(m, mbb, ts);
	return KILN_OK;
}

static kiln_status conv_grouped(cg_module *m, const ir_node *n, const int *in, int y,
                                const geom *g, kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *yt = cg_btype(m, y);
	int64_t grp = ir_attr_int(n, "group", 1), C = x->dim[1], M = yt->dim[1], batch = x->dim[0];
	int64_t Cg = C / grp, Mg = M / grp, H = g->in[0], W = g->in[1];
	int64_t Ho = g->out[0], Wo = g->out[1], s0 = g->stride[0], s1 = g->stride[1];
	int64_t d0 = g->dil[0], d1 = g->dil[1], k0 = g->k[0], k1 = g->k[1], ksz = g->ksz;
	int64_t Wq = Wo + (k1 - 1) * d1 / s1;
	/* rows per chunk: a divisor of Ho, the chunk's flat outputs at most
	 * GC_FLAT (all of Ho when it fits twice that) */
	int64_t R = Ho * Wq <= 2 * GC_FLAT ? Ho : divisor_upto(Ho, GC_FLAT / Wq > 1 ? GC_FLAT / Wq : 1);
	/* F flat outputs, rounded up to whole vectors: the ones past F read
	 * the zeros past each plane's rows and are never copied out (sums that
	 * go on through T cannot use vector_spans' overlapping last vector) */
	int64_t nch = Ho / R, Rq = R + (k0 - 1) * d0 / s0;
	int64_t F = ((R - 1) * Wq + Wo + GC_NP * TAIL_VEC - 1) / (GC_NP * TAIL_VEC) * (GC_NP * TAIL_VEC);
	int64_t qpl = Rq * Wq + F - ((R - 1) * Wq + Wo), qsz = Cg * s0 * s1 * qpl;
	int64_t MB = divisor_upto(Mg, GC_MB), CU = divisor_upto(Cg, GC_TAPS / ksz > 1 ? GC_TAPS / ksz : 1);
	int64_t nchunk = Cg / CU, tsz = MB * F;
	/* the lanes form (gl_sums) where the group's channels fill vectors */
	int64_t ob = gl_lanes(Mg);
	int WB = ob && !grid_target(m) ? gl_packed(m, in, M, Cg, ksz, ob) : -1;
	/* Q's phases a dim (qs0 x qs1 planes a channel): the flat form's
	 * vectors need each tap's run contiguous, so s0 x s1 phase planes;
	 * the lanes form broadcasts one value at a time, so with a stride its
	 * Q holds the padded rows as they are (one plane, read s1 apart):
	 * the copy is a plain one, not a split into phases (RegNetX-800MF,
	 * batch 1, one thread, bench/ab.py --nodes, 5 rounds: its stride-2
	 * grouped convs 64 channels at 56x56 0.76 -> 0.67 ms, 128 at 28x28
	 * 0.336 -> 0.304, 288 at 14x14 0.26 -> 0.17, 672 at 7x7 0.18 ->
	 * 0.12; all kernels 13.46 -> 13.12).  Stride 1 keeps the flat form's
	 * Q (the same plane, rows padded past F) */
	int64_t qs0 = s0, qs1 = s1;
	if (WB >= 0) {
		tsz = R * Wo * ob;
		if (s0 * s1 > 1) {
			qs0 = qs1 = 1;
			Wq = (Wo - 1) * s1 + (k1 - 1) * d1 + 1;
			Rq = (R - 1) * s0 + (k0 - 1) * d0 + 1;
			qpl = Rq * Wq;
			qsz = Cg * qpl;
		}
	}
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	/* the slots (image, group, chunk) in at most GC_PARTS contiguous parts
	 * over the threads (so at most that many threads), each part's slots
	 * one after another through its own Q and T, which stay in cache: a Q
	 * and T per slot were 3.6 MB of scratch per run of ResNeXt's 56x56
	 * grouped conv (0.64 -> 0.49-0.53 ms with 16 parts, kiln bench min).
	 * 4 parts instead of 16, RegNetX-800MF batch 1, one thread, kernel
	 * min over 5 alternating rounds (ms, Zen 4): 64 channels 112x112
	 * stride 2 1.26 -> 1.03, 128 channels 56x56 stride 2 0.54 -> 0.44,
	 * 288 channels 28x28 stride 2 0.44 -> 0.35, at 14x14 0.275 -> 0.251
	 * each, 672 channels 14x14 stride 2 0.273 -> 0.252; the model's
	 * kernels 20.4 -> 19.3 (fewer threads than 4 can share them now) */
	cg_expr *ns = mul(m, cg_dim(m, batch), I(m, grp * nch));
	cg_expr *np = parts_count(m, ns, GC_PARTS);
	int Q = cg_lower_scratch(m, KILN_F32, mul(m, np, I(m, qsz)));
	int T = cg_lower_scratch(m, KILN_F32, mul(m, np, I(m, tsz)));
	if (Q < 0 || T < 0)
		return nomem(m, n, err);
	cg_expr *pi, *sl, *ci, *i, *j, *mb, *cc, *f, *r, *c;
	cg_stmt *blk, *cb, *ib, *jb, *mbb, *ccb, *fb, *rb, *lb;
	blk = parts_loop(m, k, k->body, ns, np, cg_par(m, mul(m, m->buf[y].numel, I(m, Cg * ksz))),
	                 &pi, &sl);
	cg_expr *b = cg_bin(m, CG_DIV, sl, I(m, grp * nch));
	cg_expr *gi = cg_bin(m, CG_REM, cg_bin(m, CG_DIV, sl, I(m, nch)), I(m, grp));
	cg_expr *r0 = mul(m, cg_bin(m, CG_REM, sl, I(m, nch)), I(m, R));
	cg_expr *qp = mul(m, pi, I(m, qsz)), *tp = mul(m, pi, I(m, tsz));
	/* Q: per channel of the group and phase, Rq rows of Wq: zeros where
	 * the padded input is padding, x's row (every s1-th column) inside.
	 * The s1 column phases of a row are copied in one loop, so its loads
	 * are one interleaved group (wide loads and shuffles), not the gathers
	 * a loop per phase compiled to (within the noise per layer: RegNetX-
	 * 800MF's 64-channel 112x112 stride-2 conv 0.88 and 0.90 ms). */
	cg_append(m, blk, cg_loop(m, k, I(m, Cg), 0, &ci, &cb));
	cg_expr *xpl = mul(m, add(m, mul(m, b, I(m, C)), add(m, mul(m, gi, I(m, Cg)), ci)), I(m, H * W));
	int64_t jlo[4], jhi[4], Jlo = 0, Jhi = Wq;
	for (int64_t p1 = 0; p1 < qs1; p1++) {
		/* columns j of x column j*s1 + p1 - pad inside [0, W): [jlo, jhi) */
		int64_t o = p1 - g->pad[1];
		jlo[p1] = o >= 0 ? 0 : (-o + qs1 - 1) / qs1;
		jhi[p1] = W - o <= 0 ? 0 : (W - o + qs1 - 1) / qs1;
		jlo[p1] = jlo[p1] > Wq ? Wq : jlo[p1];
		jhi[p1] = jhi[p1] > Wq ? Wq : jhi[p1] < jlo[p1] ? jlo[p1] : jhi[p1];
		Jlo = jlo[p1] > Jlo ? jlo[p1] : Jlo;
		Jhi = jhi[p1] < Jhi ? jhi[p1] : Jhi;
	}
	Jhi = Jhi < Jlo ? Jlo : Jhi;
	for (int64_t p0 = 0; p0 < qs0; p0++) {
		cg_append(m, cb, cg_loop(m, k, I(m, Rq), 0, &i, &ib));
		/* padded row r0*s0 + i*qs0 + p0 */
		cg_expr *xr = add(m, qs0 == s0 ? mul(m, add(m, r0, i), I(m, s0)) : add(m, mul(m, r0, I(m, s0)), i),
		                  I(m, p0 - g->pad[0]));
		cg_expr *valid = cg_bin(m, CG_AND, cg_bin(m, CG_GE, xr, I(m, 0)),
		                        cg_bin(m, CG_LT, xr, I(m, H)));
		cg_expr *xrow = add(m, xpl, mul(m, xr, I(m, W)));
		cg_expr *qrow[4];
		cg_stmt *inb = cg_block(m), *outb = cg_block(m);
		for (int64_t p1 = 0; p1 < qs1; p1++) {
			cg_expr *q0 = add(m, qp, mul(m, add(m, mul(m, ci, I(m, qs0 * qs1)), I(m, p0 * qs1 + p1)),
			                             I(m, qpl)));
			qrow[p1] = add(m, q0, mul(m, i, I(m, Wq)));
			zeros(m, k, outb, Q, qrow[p1], Wq);
			zeros(m, k, inb, Q, qrow[p1], jlo[p1]);
			/* the columns of this phase only, outside [Jlo, Jhi) */
			int64_t e0[2] = {jlo[p1], Jhi}, e1[2] = {Jlo < jhi[p1] ? Jlo : jhi[p1], jhi[p1]};
			for (int e = 0; e < 2; e++) {
				if (e1[e] <= e0[e])
					continue;
				cg_append(m, inb, cg_loop(m, k, I(m, e1[e] - e0[e]), 0, &j, &jb));
				cg_expr *jj = add(m, I(m, e0[e]), j);
				cg_append(m, jb, cg_st(m, Q, add(m, qrow[p1], jj),
				                       cg_ld(m, in[0], add(m, xrow, add(m, mul(m, jj, I(m, qs1)),
				                                                        I(m, p1 - g->pad[1]))))));
			}
			zeros(m, k, inb, Q, add(m, qrow[p1], I(m, jhi[p1])), Wq - jhi[p1]);
		}
		/* every phase inside: one loop, its last partial vector masked
		 * (LLVM left a 55-column row's last 7 to scalar code: RegNetX's
		 * 64-channel stride-2 conv at 112x112, 16 channels a group,
		 * 0.74 -> 0.65-0.70 ms, kiln bench --profile, one thread) */
		if (Jhi > Jlo) {
			cg_append(m, inb, cg_loop(m, k, I(m, Jhi - Jlo), CG_VECTORIZE | CG_TAIL_MASK, &j, &jb));
			cg_expr *jj = add(m, I(m, Jlo), j);
			for (int64_t p1 = 0; p1 < qs1; p1++)
				cg_append(m, jb, cg_st(m, Q, add(m, qrow[p1], jj),
				                       cg_ld(m, in[0], add(m, xrow, add(m, mul(m, jj, I(m, qs1)),
				                                                        I(m, p1 - g->pad[1]))))));
		}
		cg_append(m, ib, cg_if(m, valid, inb, outb));
	}
	/* the zeros past each plane's last row (the flat loop's last vector reads them) */
	for (int64_t p = 0; p < qs0 * qs1 && qpl > Rq * Wq; p++)
		zeros(m, k, cb, Q, add(m, add(m, qp, mul(m, add(m, mul(m, ci, I(m, qs0 * qs1)), I(m, p)),
		                                         I(m, qpl))), I(m, Rq * Wq)), qpl - Rq * Wq);
	/* y in channel blocks (cg_grouped_blocked_ok): the tiles store them */
	bool yblk = m->buf[y].block != 0;
	if (yblk && (WB < 0 || m->buf[y].block != ob))
		return cg_lower_fail(m, n, err, KILN_EINVAL, "output in blocks of %d channels, of "
		                     "groups of %lld (internal error)", m->buf[y].block, (long long)Mg);
	if (WB >= 0) {
		int TF = yblk ? y : cg_lower_scratch(m, KILN_F32, mul(m, np, I(m, tsz)));
		if (TF < 0)
			return nomem(m, n, err);
		gl_slot gs = {.b = b, .gi = gi, .r0 = r0, .qp = qp, .tp = tp, .Q = Q, .T = T, .TF = TF, .WB = WB,
		              .R = R, .Wq = Wq, .qpl = qpl, .Cg = Cg, .Mg = Mg, .M = M, .ob = ob,
		              .c0 = qs0, .c1 = qs1, .yblk = yblk};
		return gl_sums(m, k, blk, n, in, y, g, &gs, err);
	}
	/* per block of MB output channels: the flat sums into T, then y */
	cg_append(m, blk, cg_loop(m, k, I(m, Mg / MB), 0, &mb, &mbb));
	cg_expr *m0 = add(m, mul(m, gi, I(m, Mg)), mul(m, mb, I(m, MB)));
	bool bias = n->nin > 2 && in[2] >= 0;
	/* the first chunk of CU channels starts from the bias, the others from
	 * T (the same flat loop twice: no pass that fills T with the bias) */
	for (int pass = 0; pass < 2 && (pass == 0 || nchunk > 1); pass++) {
		cg_stmt *cbody = mbb;
		cc = I(m, 0);
		if (pass) {
			cg_append(m, mbb, cg_loop(m, k, I(m, nchunk - 1), 0, &cc, &ccb));
			cbody = ccb;
			cc = add(m, cc, I(m, 1));
		}
		cg_append(m, cbody, cg_loop(m, k, I(m, F / GC_NP), CG_VECTORIZE, &f, &fb));
		cg_expr *fi[GC_NP], *acc[GC_NP][GC_MB];
		for (int np = 0; np < GC_NP; np++) {
			fi[np] = add(m, f, I(m, np * (F / GC_NP)));
			for (int64_t a = 0; a < MB; a++) {
				cg_expr *init = fc(m, KILN_F32, 0);
				if (pass)
					init = cg_ld(m, T, add(m, add(m, tp, I(m, a * F)), fi[np]));
				else if (bias)
					init = cg_ld(m, in[2], add(m, m0, I(m, a)));
				acc[np][a] = cg_local(m, k, fb, KILN_F32, init);
			}
		}
		for (int64_t u = 0; u < CU; u++) {
			cg_expr *cu = add(m, mul(m, cc, I(m, CU)), I(m, u));
			for (int64_t kh = 0; kh < k0; kh++)
				for (int64_t kw = 0; kw < k1; kw++) {
					int64_t ph = (kh * d0) % s0 * s1 + (kw * d1) % s1;
					int64_t off = (kh * d0 / s0) * Wq + kw * d1 / s1;
					cg_expr *wv[GC_MB];
					for (int64_t a = 0; a < MB; a++)
						wv[a] = cg_ld(m, in[1], add(m, mul(m, add(m, mul(m, add(m, m0, I(m, a)), I(m, Cg)), cu),
						                                   I(m, ksz)), I(m, kh * k1 + kw)));
					for (int np = 0; np < GC_NP; np++) {
						cg_expr *qi = add(m, add(m, qp, mul(m, add(m, mul(m, cu, I(m, s0 * s1)), I(m, ph)),
						                                    I(m, qpl))), add(m, I(m, off), fi[np]));
						cg_expr *xv = cg_ld(m, Q, qi);
						for (int64_t a = 0; a < MB; a++)
							cg_set(m, fb, acc[np][a], add(m, acc[np][a], mul(m, xv, wv[a])));
					}
				}
		}
		for (int np = 0; np < GC_NP; np++)
			for (int64_t a = 0; a < MB; a++)
				cg_append(m, fb, cg_st(m, T, add(m, add(m, tp, I(m, a * F)), fi[np]), acc[np][a]));
	}
	/* T's rows into y */
	cg_append(m, mbb, cg_loop(m, k, I(m, MB), 0, &j, &jb));
	cg_append(m, jb, cg_loop(m, k, I(m, R), 0, &r, &rb));
	cg_append(m, rb, cg_loop(m, k, I(m, Wo), CG_VECTORIZE, &c, &lb));
	cg_expr *yi = add(m, mul(m, add(m, mul(m, b, I(m, M)), add(m, m0, j)), I(m, g->osz)),
	                  add(m, mul(m, add(m, r0, r), I(m, Wo)), c));
	cg_append(m, lb, cg_st(m, y, yi, cg_ld(m, T, add(m, add(m, tp, mul(m, j, I(m, F))),
	                                                    add(m, mul(m, r, I(m, Wq)), c)))));
	k->final_buf = y;
	return KILN_OK;
}

/* Whether conv_grouped should compute this grouped conv rather than
 * im2col and a GEMM per group (CG_CONV_AUTO). */
/* im2col + GEMM per group pays for its copies once the GEMM has rows
 * enough (Mg): 64-channel groups ran direct 0.62 -> 0.52 ms, 128-channel
 * ones 1.97 -> 2.31 (see above). */
enum { GC_MAX_MG = 64 };
static bool conv_grouped_wins(const cg_module *m, int64_t Mg)
{
	return Mg <= GC_MAX_MG && !grid_target(m);
}

/* Each part after the first reads and writes y once more (a GEMM with
 * beta = 1) where the Concat's copy read and wrote x: parts pay while
 * (nparts - 1) * M <= C / 2.  SqueezeNet 1.1, batch 1, one thread
 * (bench/ab.py --nodes, 5 rounds): its squeeze convs (M = 16 to 64 of C =
 * 128 to 512) gain their concat's 0.03-0.11 ms and lose 0.01; its
 * classifier (M = 1000 of C = 512) lost 0.07 ms and gained 0.02. */
bool cg_conv_parts_ok(const kiln_graph *g, const ir_node *n, int nparts)
{
	if (n->op != KILN_OP_CONV || n->nin < 2 || !n->in[0] || !n->in[1] ||
	    ir_attr_int(n, "group", 1) != 1)
		return false;
	const ir_type *x = &g->val[n->in[0]]->type, *w = &g->val[n->in[1]]->type;
	const ir_type *y = &g->val[n->out[0]]->type;
	geom gm;
	if (x->dtype != KILN_F32 || w->dtype != KILN_F32 || x->rank < 3 || w->rank != x->rank ||
	    !fixed_channels(x, w, y) ||
	    ir_conv_geom_of(n, x->rank, x->dim, y->rank, y->dim, w->dim + 2, false, &gm) != IR_GEOM_OK)
		return false;
	return pointwise_geom(&gm, false) && (nparts - 1) * w->dim[0] <= x->dim[1] / 2;
}

kiln_status cg_lower_conv_parts(cg_module *m, const ir_node *n, const cg_parts *x,
                                const int *in, const int *out, kiln_error *err)
{
	const ir_type *yt = cg_btype(m, out[0]);
	int64_t M = yt->dim[1], C = x->C->i, HW = cg_btype(m, out[0])->dim[2];
	for (int d = 3; d < yt->rank; d++)
		HW *= yt->dim[d];
	cg_expr *batch = cg_dim(m, yt->dim[0]);
	bool bias = n->nin > 2 && in[2] >= 0;
	/* a constant W gets a copy of its columns per part, whose rows the
	 * GEMM's prepacking takes whole (cg_prepack wants A's rows K apart) */
	const kiln_tensor *wt = const_data(m, in[1]);
	int wp[CG_PARTS_MAX];
	for (int p = 0; p < x->n; p++) {
		wp[p] = in[1];
		if (!wt || x->n == 1)
			continue;
		kiln_tensor *t = arena_tensor(m, KILN_F32, M * x->len[p]);
		if (!t)
			return nomem(m, n, err);
		float *d = t->data;
		for (int64_t i = 0; i < M; i++)
			for (int64_t c = 0; c < x->len[p]; c++)
				d[i * x->len[p] + c] = (float)ir_load(wt, i * C + x->at[p] + c);
		char sfx[16];
		snprintf(sfx, sizeof sfx, "part%d", p);
		if ((wp[p] = const_buf(m, t, in[1], sfx)) < 0)
			return nomem(m, n, err);
	}
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	cg_expr *b;
	cg_stmt *gb;
	cg_append(m, k->body, cg_loop(m, k, batch, CG_PARALLEL, &b, &gb));
	for (int p = 0; p < x->n; p++) {
		bool last = p == x->n - 1, own = wp[p] != in[1];
		int64_t K = x->len[p];
		cg_gemm gm = {.a = wp[p], .b = x->buf[p], .c = out[0], .bias = bias && last ? in[2] : -1,
		              .M = I(m, M), .N = I(m, HW), .K = I(m, K), .batch = I(m, 1),
		              .a_off = I(m, own ? 0 : x->at[p]), .a_bs = I(m, 0), .a_rs = I(m, own ? K : C),
		              .a_cs = I(m, 1),
		              .b_off = mul(m, b, I(m, K * HW)), .b_bs = I(m, 0), .b_rs = I(m, HW),
		              .b_cs = I(m, 1),
		              .c_off = mul(m, b, I(m, M * HW)), .c_bs = I(m, 0), .c_rs = I(m, HW),
		              .bias_off = I(m, 0), .alpha = 1, .beta = p ? 1 : 0,
		              .bias_axis = bias && last ? 2 : 0};
		cg_append(m, gb, cg_gemm_stmt(m, &gm));
	}
	return gb->n == x->n ? KILN_OK : nomem(m, n, err);
}

/* Whether n is an f32 2-D conv the channel-block predicates below can
 * look at: x (no other operand the same value) and W f32 rank 4, fixed
 * channels, its geometry valid (*gm). */
static bool f32_conv2d(const kiln_graph *g, const ir_node *n, geom *gm)
{
	if (n->op != KILN_OP_CONV || n->nin < 2 || !n->in[0] || !n->in[1] || n->in[1] == n->in[0] ||
	    (n->nin > 2 && n->in[2] == n->in[0]))
		return false;
	const ir_type *x = &g->val[n->in[0]]->type, *w = &g->val[n->in[1]]->type;
	const ir_type *y = &g->val[n->out[0]]->type;
	return x->dtype == KILN_F32 && w->dtype == KILN_F32 && x->rank == 4 && w->rank == 4 &&
	       fixed_channels(x, w, y) &&
	       ir_conv_geom_of(n, x->rank, x->dim, y->rank, y->dim, w->dim + 2, false, gm) ==
	           IR_GEOM_OK &&
	       gm->nsp == 2;
}

/* Whether u is an f32 2-D depthwise conv over a multiple of cb (DW_CB)
 * channels that dw_blocked can take in blocks; *gd its geometry. */
static bool dw_block_geom(const cg_module *m, const kiln_graph *g, const ir_node *u, int64_t cb,
                          geom *gd)
{
	if (cb != DW_CB || grid_target(m) || !f32_conv2d(g, u, gd))
		return false;
	const ir_type *xt = &g->val[u->in[0]]->type, *yt = &g->val[u->out[0]]->type;
	return ir_attr_int(u, "group", 1) == xt->dim[1] && yt->dim[1] == xt->dim[1] &&
	       xt->dim[1] % cb == 0;
}

bool cg_dw_direct_ok(const cg_module *m, const kiln_graph *g, const ir_node *u, int64_t cb)
{
	geom gd;
	if (!dw_block_geom(m, g, u, cb, &gd) || gd.out[1] > DW_DIRECT_W ||
	    (gd.ksz < 25 && gd.stride[1] != 2))
		return false;
	int64_t rlo, rhi, clo, chi;
	inside_span(gd.out[0], gd.in[0], gd.pad[0], gd.stride[0], gd.k[0], gd.dil[0], &rlo, &rhi);
	inside_span(gd.out[1], gd.in[1], gd.pad[1], gd.stride[1], gd.k[1], gd.dil[1], &clo, &chi);
	return 10 * (rhi - rlo) * (chi - clo) >= DW_DIRECT_TENTHS * gd.out[0] * gd.out[1];
}

bool cg_dw_blocked_ok(const cg_module *m, const kiln_graph *g, const ir_node *u, int64_t cb,
                      bool both)
{
	geom gd;
	return dw_block_geom(m, g, u, cb, &gd) &&
	       (dw_blocked_shape(&gd, 1, true) || (both && gd.out[1] <= DW_BLOCK_W2));
}

/* Whether n is a 1x1 conv whose GEMM kiln_sgemm_pm computes with C or B
 * in channel blocks of cb (cg_prepack gives it its panels): f32, group
 * 1, a constant W (buffer wb); strided (x gathered first) only when its
 * input is not the blocked one (!reads). */
static bool pointwise_blocked(const cg_module *m, const kiln_graph *g, const ir_node *n, int wb,
                              int64_t cb, bool reads)
{
	geom gm;
	if (cb != DW_CB || cb != m->panels.c_block || grid_target(m) ||
	    ir_attr_int(n, "group", 1) != 1 || !f32_conv2d(g, n, &gm) || !pointwise_geom(&gm, !reads))
		return false;
	const ir_type *x = &g->val[n->in[0]]->type, *y = &g->val[n->out[0]]->type;
	return wb >= 0 && const_data(m, wb) && (reads ? x->dim[1] : y->dim[1]) % cb == 0 &&
	       cg_prepack_lanes_fit(&m->panels, y->dim[1], gm.osz, x->dim[1], true);
}

bool cg_grouped_blocked_ok(const cg_module *m, const kiln_graph *g, const ir_node *n,
                           const int *in)
{
	geom gm;
	if (m->panels.c_block != GL_OB || m->conv == CG_CONV_IM2COL || grid_target(m) || in[1] < 0 ||
	    !f32_conv2d(g, n, &gm))
		return false;
	const ir_type *x = &g->val[n->in[0]]->type, *y = &g->val[n->out[0]]->type;
	int64_t grp = ir_attr_int(n, "group", 1), M = y->dim[1];
	if (grp <= 1 || x->dim[1] % grp || M % grp || x->dim[1] / grp <= 1 ||
	    gm.stride[0] > 4 || gm.stride[1] > 4 || !gl_lanes(M / grp) ||
	    !(m->conv == CG_CONV_DIRECT || conv_grouped_wins(m, M / grp)))
		return false;
	const kiln_tensor *wt = const_data(m, in[1]);
	return wt && kiln_tensor_numel(wt) == M * (x->dim[1] / grp) * gm.ksz;
}

bool cg_conv_blocked_ok(const cg_module *m, const kiln_graph *g, const ir_node *n, const int *in)
{
	return pointwise_blocked(m, g, n, in[1], m->panels.c_block, false);
}

bool cg_conv_reads_blocked_ok(const cg_module *m, const kiln_graph *g, const ir_node *u, int w,
                              int64_t cb)
{
	return pointwise_blocked(m, g, u, w, cb, true);
}

kiln_status cg_lower_conv(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *w = cg_btype(m, in[1]), *y = cg_btype(m, out[0]);
	geom g;
	if (!fixed_channels(x, w, y))
		return cg_lower_fail(m, n, err, KILN_EUNSUPPORTED, "symbolic channel counts");
	kiln_status st = geometry(m, n, x, y, w->dim + 2, false, &g, err);
	if (st)
		return st;
	int64_t grp = ir_attr_int(n, "group", 1);
	/* cg_conv_blocked_ok's, cg_conv_reads_blocked_ok's: its GEMM writes or
	 * reads the channel blocks */
	if (m->buf[out[0]].block || cg_buf_block(m, in[0])) {
		if (grp == 1 && pointwise_geom(&g, true))
			return conv_1x1(m, n, in, out[0], &g, NULL, err);
		if (m->buf[out[0]].block && !cg_buf_block(m, in[0]) && grp > 1 && grp != x->dim[1] &&
		    cg_grouped_blocked_ok(m, m->g, n, in))
			return conv_grouped(m, n, in, out[0], &g, err);
		if (!(grp > 1 && grp == x->dim[1]))
			return cg_lower_fail(m, n, err, KILN_EINVAL, "channel blocks for a conv neither "
			                     "1x1, depthwise nor grouped in vectors (internal error)");
	}
	if (grp > 1 && grp == x->dim[1] && g.nsp == 2)
		return conv_depthwise(m, n, in, out[0], &g, NULL, NULL, err);
	if (x->dtype != KILN_F32) {
		conv_ops op = {in[0], in[1], -1, -1, n->nin > 2 ? in[2] : -1, NULL};
		return conv_direct(m, n, &op, false, out[0], &g, err);
	}
	if (grp != 1 && grouped_shape(m, n, in[0], &g) && m->conv != CG_CONV_IM2COL &&
	    (m->conv == CG_CONV_DIRECT || conv_grouped_wins(m, y->dim[1] / grp)))
		return conv_grouped(m, n, in, out[0], &g, err);
	if (grp != 1) /* grouped: a GEMM per group over one im2col */
		return conv_im2col(m, n, in, out[0], &g, NULL, err);
	int64_t wb = m->conv != CG_CONV_IM2COL && cg_conv_winograd_ok(m, n, in, &g)
	             ? (m->conv == CG_CONV_WINOGRAD ? 1 : cg_conv_winograd_batch(m, n, in, &g)) : -1;
	int64_t batch = x->dim[0];
	if (wb == 1 || (wb > 1 && batch >= wb))
		return cg_lower_conv_winograd(m, n, in, out[0], &g, false, err);
	bool pointwise = pointwise_geom(&g, true);
	int first = m->nkern;
	st = pointwise ? conv_1x1(m, n, in, out[0], &g, NULL, err)
	               : conv_im2col(m, n, in, out[0], &g, NULL, err);
	if (st || wb <= 1 || batch >= 0)
		return st;
	/* a symbolic batch, and Winograd pays from batch wb: both, each
	 * guarded by the batch; the GEMM's kernel takes what folds into
	 * Winograd's last kernel too (cg_kernel.alt) */
	int gemm_k = m->nkern - 1, wino = m->nkern;
	cg_expr *bd = cg_dim(m, batch);
	st = cg_lower_conv_winograd(m, n, in, out[0], &g, true, err);
	if (st)
		return st;
	for (int k = first; k < m->nkern; k++)
		m->kern[k].guard = cg_bin(m, k < wino ? CG_LT : CG_GE, bd, I(m, wb));
	m->kern[m->nkern - 1].alt = gemm_k;
	return KILN_OK;
}

/* ConvTranspose as a gather: output position o takes tap t from input
 * position (o + pad - t*dil) / stride when that divides exactly. */
kiln_status cg_lower_conv_transpose(cg_module *m, const ir_node *n, const int *in,
                                    const int *out, kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *w = cg_btype(m, in[1]), *yt = cg_btype(m, out[0]);
	geom g;
	if (!fixed_channels(x, w, yt))
		return cg_lower_fail(m, n, err, KILN_EUNSUPPORTED, "symbolic channel counts");
	kiln_status st = geometry(m, n, x, yt, w->dim + 2, true, &g, err);
	cg_kernel *k = st ? NULL : cg_lower_kernel(m, n);
	if (!k)
		return st ? st : nomem(m, n, err);
	int64_t grp = ir_attr_int(n, "group", 1), C = x->dim[1], M = yt->dim[1];
	int64_t Cg = C / grp, Mg = M / grp;
	int y = out[0], ns = g.nsp;
	cg_expr *bm, *ext[7], *iv[7], *j[3];
	cg_stmt *blk;
	cg_append(m, k->body, cg_loop(m, k, mul(m, cg_dim(m, x->dim[0]), I(m, M)),
	                              cg_par(m, mul(m, m->buf[y].numel, I(m, Cg * g.ksz))), &bm, &blk));
	cg_expr *mi = cg_bin(m, CG_REM, bm, I(m, M)), *bi = cg_bin(m, CG_DIV, bm, I(m, M));
	init_bias(m, k, blk, n->nin > 2 ? in[2] : -1, y, bm, mi, &g);
	uint32_t h[7] = {0};
	ext[0] = I(m, Cg);
	for (int d = 0; d < ns; d++)
		ext[1 + d] = I(m, g.k[d]), ext[1 + ns + d] = I(m, g.out[d]);
	out_loops_hints(ns, h + 1 + ns);
	cg_stmt *body = cg_nest(m, k, blk, 1 + 2 * ns, ext, h, iv);
	cg_expr *valid = cg_const(m, KILN_BOOL, 1);
	for (int d = 0; d < ns; d++) {
		cg_expr *t = add(m, add(m, iv[1 + ns + d], I(m, g.pad[d])), mul(m, iv[1 + d], I(m, -g.dil[d])));
		cg_expr *s = I(m, g.stride[d]), *q = cg_bin(m, CG_DIV, t, s);
		cg_expr *ok = cg_bin(m, CG_AND, cg_bin(m, CG_GE, t, I(m, 0)),
		                     cg_bin(m, CG_EQ, cg_bin(m, CG_REM, t, s), I(m, 0)));
		valid = cg_bin(m, CG_AND, valid, cg_bin(m, CG_AND, ok, cg_bin(m, CG_LT, q, I(m, g.in[d]))));
		j[d] = cg_clamp(m, q, I(m, g.in[d]));
	}
	cg_expr *c = add(m, mul(m, cg_bin(m, CG_DIV, mi, I(m, Mg)), I(m, Cg)), iv[0]);
	cg_expr *xi = add(m, mul(m, add(m, mul(m, bi, I(m, C)), c), I(m, g.isz)), lin(m, ns, j, g.in));
	cg_expr *wi = add(m, mul(m, add(m, mul(m, c, I(m, Mg)), cg_bin(m, CG_REM, mi, I(m, Mg))),
	                         I(m, g.ksz)), lin(m, ns, iv + 1, g.k));
	cg_expr *yi = add(m, mul(m, bm, I(m, g.osz)), lin(m, ns, iv + 1 + ns, g.out));
	kiln_dtype ct = cg_ctype(m->buf[y].dt);
	cg_expr *xv = cg_select(m, valid, cg_ld(m, in[0], xi), fc(m, ct, 0));
	cg_append(m, body, cg_st(m, y, yi, add(m, cg_ld(m, y, yi), mul(m, xv, cg_ld(m, in[1], wi)))));
	return KILN_OK;
}

/* ---- pooling --------------------------------------------------------------- */

/* MaxPool: padding never wins; AveragePool divides by the taps inside the
 * input, or with count_include_pad by those inside [-pad, in + pad_end). */
/* One output pixel of a pool at output coordinates o: the max, or the
 * average, over its taps (a nest appended to blk); in the interior of a 2-D
 * pool's row (interior: every tap column inside the input) the column is
 * neither clamped nor tested, so a loop over o[1] vectorizes. */
static cg_expr *pool_pixel(cg_module *m, cg_kernel *k, cg_stmt *blk, const ir_node *n,
                           const int *in, const geom *g, cg_expr *b, cg_expr *const *o,
                           bool interior, const split *sp)
{
	bool is_max = n->op == KILN_OP_MAX_POOL, incl = ir_attr_int(n, "count_include_pad", 0);
	kiln_dtype ct = cg_ctype(m->buf[in[0]].dt);
	int ns = g->nsp;
	cg_expr *ext[3], *t[3], *j[3], *valid;
	uint32_t h[3];
	/* a max starts below every value: -inf, or an 8-bit tensor's least */
	kiln_dtype xt = m->buf[in[0]].dt;
	double least = kiln_dtype_is_float(xt) ? -INFINITY : xt == KILN_U8 ? 0 : xt == KILN_I8 ? -128 : -2147483648.0;
	cg_expr *acc = cg_local(m, k, blk, ct, fc(m, ct, is_max ? least : 0));
	cg_expr *cnt = is_max ? NULL : cg_local(m, k, blk, ct, fc(m, ct, 0));
	for (int d = 0; d < ns; d++) {
		ext[d] = I(m, g->k[d]);
		h[d] = g->ksz <= 64 ? CG_UNROLL : 0;
	}
	cg_stmt *tb = cg_nest(m, k, blk, ns, ext, h, t);
	taps(m, g, o, t, j, &valid);
	if (interior) { /* the column is inside: only the rows are tested */
		tap_row(m, g, o, t, &valid);
		j[ns - 1] = tap_col(m, g, o[ns - 1], t[ns - 1]);
	}
	cg_expr *xv = interior && sp && sp->buf >= 0
	              ? cg_ld(m, sp->buf, split_at(m, g, sp, sp->rows ? t[0] : j[0], o[1], t[1]))
	              : cg_ld(m, in[0], add(m, mul(m, b, I(m, g->isz)), lin(m, ns, j, g->in)));
	if (is_max) {
		cg_set(m, tb, acc, cg_bin(m, CG_MAX, acc, cg_select(m, valid, xv, fc(m, ct, least))));
		return acc;
	}
	cg_expr *counted = valid;
	for (int d = 0; d < ns && incl; d++) {
		cg_expr *p = add(m, mul(m, o[d], I(m, g->stride[d])), mul(m, t[d], I(m, g->dil[d])));
		cg_expr *pin = cg_bin(m, CG_LT, p, I(m, g->in[d] + g->pad[d] + g->pad_end[d]));
		counted = d ? cg_bin(m, CG_AND, counted, pin) : pin;
	}
	cg_set(m, tb, acc, add(m, acc, cg_select(m, valid, xv, fc(m, ct, 0))));
	cg_set(m, tb, cnt, add(m, cnt, cg_select(m, counted, fc(m, ct, 1), fc(m, ct, 0))));
	return cg_bin(m, CG_DIV, acc, cnt);
}

/* ---- pools of disjoint windows on short rows --------------------------------
 * A 2-D pool whose windows tile the plane exactly (kernel == stride, no
 * padding, no dilation, in == k * out: LeNet-style CNNs' and VGG's 2x2/2)
 * on rows of few outputs (a 2x2/2 max pool 14x14 -> 7x7: seven outputs a
 * row, every tap a gather and the split copies per row besides) runs per
 * plane in two flat loops: V = the max (or sum) over the kernel's rows,
 * row by row in whole input rows (k0 contiguous loads per vector), then
 * y[j] = the max (sum) of V[s1*j .. s1*j + s1) over the plane's outputs j
 * in one loop (V's row oh holds W = s1*Wo columns, so output (oh, ow) =
 * j = oh*Wo + ow reads V[s1*j + kw]): the s1 loads of an iteration are one
 * interleaved group (wide loads and shuffles).  The bench's small CNN at
 * batch 16, one thread (kiln bench --profile, Zen 4): its 2x2 max pools
 * 28 -> 14 and 14 -> 7 0.050 and 0.038-0.044 ms -> 0.012 and 0.008, the
 * model 0.21-0.25 -> 0.18 ms.  Longer rows keep the split path. */
enum { POOL_FLAT_W = 16, POOL_FLAT_K = 16 };

static bool pool_flat_ok(const cg_module *m, const geom *g, int x)
{
	if (g->nsp != 2 || m->buf[x].dt != KILN_F32 || g->ksz > POOL_FLAT_K || g->out[1] > POOL_FLAT_W)
		return false;
	for (int d = 0; d < 2; d++)
		if (g->k[d] != g->stride[d] || g->dil[d] != 1 || g->pad[d] || g->pad_end[d] ||
		    g->in[d] != g->k[d] * g->out[d])
			return false;
	return true;
}

/* acc combined with t by a max pool's max or an average pool's sum (t
 * alone when acc is NULL: the first tap) */
static cg_expr *pool_combine(cg_module *m, bool is_max, cg_expr *acc, cg_expr *t)
{
	return !acc ? t : is_max ? cg_bin(m, CG_MAX, acc, t) : add(m, acc, t);
}

static kiln_status pool_flat(cg_module *m, cg_kernel *k, cg_stmt *blk, const ir_node *n,
                             const int *in, int y, const geom *g, cg_expr *nc, cg_expr *b,
                             kiln_error *err)
{
	bool is_max = n->op == KILN_OP_MAX_POOL;
	int64_t Ho = g->out[0], Wo = g->out[1], W = g->in[1], k0 = g->k[0], k1 = g->k[1];
	int64_t vsz = Ho * W;
	int V = cg_lower_scratch(m, KILN_F32, mul(m, nc, I(m, vsz)));
	if (V < 0)
		return nomem(m, n, err);
	cg_expr *vp = mul(m, b, I(m, vsz)), *xp = mul(m, b, I(m, g->isz)), *oh, *w, *j;
	cg_stmt *rb, *wb, *jb;
	cg_append(m, blk, cg_loop(m, k, I(m, Ho), 0, &oh, &rb));
	cg_append(m, rb, cg_loop(m, k, I(m, W), CG_VECTORIZE, &w, &wb));
	cg_expr *xr = add(m, xp, add(m, mul(m, oh, I(m, k0 * W)), w)), *v = NULL;
	for (int64_t kh = 0; kh < k0; kh++)
		v = pool_combine(m, is_max, v, cg_ld(m, in[0], add(m, xr, I(m, kh * W))));
	cg_append(m, wb, cg_st(m, V, add(m, vp, add(m, mul(m, oh, I(m, W)), w)), v));
	cg_append(m, blk, cg_loop(m, k, I(m, Ho * Wo), CG_VECTORIZE, &j, &jb));
	cg_expr *vj = add(m, vp, mul(m, j, I(m, k1)));
	v = NULL;
	for (int64_t kw = 0; kw < k1; kw++)
		v = pool_combine(m, is_max, v, cg_ld(m, V, add(m, vj, I(m, kw))));
	if (!is_max) /* divided by the count, as pool_pixel's average */
		v = cg_bin(m, CG_DIV, v, fc(m, KILN_F32, (double)g->ksz));
	cg_append(m, jb, cg_st(m, y, add(m, mul(m, b, I(m, g->osz)), j), v));
	return KILN_OK;
}

/* ---- separable max pools ------------------------------------------------------
 * A 2-D f32 max pool is a max over the window's rows, then over its
 * columns: per output row oh, V = the max over the k0 tap rows of x (whole
 * rows, k0 contiguous loads per vector; a tap row in the padding gives
 * -inf), written into a row of Wp with pad[1] columns of -inf before x's
 * columns and -inf after, then y[oh, ow] = the max of V[ow*s1 + kw*d1]
 * over kw: no column is clamped or tested anywhere, and at stride 2 the
 * taps of a vector are one interleaved group (wide loads and shuffles).
 * The window-by-window form reads k0*k1 values per output, behind a split
 * copy of each row at stride 2, and its rows of 55 or 27 outputs ran a
 * third of their columns in scalar remainders.  One 3x3/2 max pool, kiln
 * bench min over 5 x 200 runs, one thread, Zen 4, window form -> this
 * (ms): SqueezeNet 1.1's 128 x 55x55 0.121 -> 0.106, 256 x 27x27 0.125 ->
 * 0.071 (ORT 0.114, 0.064); planes of 64 x 64 and more stay with the
 * split rows, which measured 8-12% faster there (64 x 111x111 0.204
 * against 0.228, ResNet's 64 x 112x112 pad 1 0.207 against 0.225). */
/* pool_sep's limits: column stride (phase rows), window rows.  Planes of
 * SPLIT_ROWS_MIN and more take it for windows of 9 taps or more: one
 * max pool, batch 1, one thread, kiln bench min over 5 x 100 runs, split
 * rows -> separable (ms, Zen 4): 64 x 111x111 3x3/2 ceil 0.196 -> 0.110,
 * 64 x 112x112 3x3/2 pad 1 0.202 -> 0.127, 3x3/1 pad 1 0.544 -> 0.211
 * (ORT 0.171, 0.169, 0.420 with its reorders); 64 x 224x224 2x2/2 lost
 * (0.311 -> 0.742) and keeps the split rows. */
enum { SEP_MAX_S = 4, SEP_MAX_K = 8, SEP_BIG_TAPS = 9 };
static bool pool_sep_ok(const cg_module *m, const ir_node *n, const geom *g, int x)
{
	return n->op == KILN_OP_MAX_POOL && g->nsp == 2 && m->buf[x].dt == KILN_F32 &&
	       (g->in[0] * g->in[1] < SPLIT_ROWS_MIN || g->k[0] * g->k[1] >= SEP_BIG_TAPS) &&
	       g->stride[1] <= SEP_MAX_S && g->k[0] <= SEP_MAX_K;
}

/* One output row oh of pool_sep: the vertical max of the rows kh of
 * rows[0..nr) (all in x) into V's phase rows, then the horizontal max into
 * y.  oh is the loop's variable for the interior rows, a constant for each
 * edge row (whose rows outside x are left out at compile time). */
static int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

typedef struct sep_geom {
	int64_t W, Wo, s1, d1, pl;
	int64_t P, Q;                 /* V's phase rows and their length */
	int64_t ilo[SEP_MAX_S], ihi[SEP_MAX_S]; /* per phase, the i whose column is in x */
	int64_t I0, I1;               /* the i inside x in every phase */
} sep_geom;

static void sep_row(cg_module *m, cg_kernel *k, cg_stmt *rb, const int *in, int y,
                    const geom *g, const sep_geom *sg, int V, cg_expr *vp, cg_expr *xp,
                    cg_expr *yp, cg_expr *oh, const int64_t *rows, int nr, bool over)
{
	int64_t P = sg->P, st[2], len[2];
	cg_expr *least = fc(m, KILN_F32, -INFINITY), *i, *j;
	cg_stmt *ib, *jb;
	/* the vertical max of padded column c = i*P + p (x's column c - pl)
	 * into phase row p at i: the phases of one i in one loop, so their
	 * loads form one interleaved group (wide loads and shuffles); the
	 * interior in whole vectors (vector_spans: the last overlapping) */
	cg_expr *rowp[SEP_MAX_K];
	for (int q = 0; q < nr; q++)
		rowp[q] = add(m, xp, mul(m, add(m, mul(m, oh, I(m, g->stride[0])),
		                                  I(m, rows[q] * g->dil[0] - g->pad[0])),
		                         I(m, sg->W)));
	for (int pass = 0; pass < 3; pass++) {
		/* pass 0: the common interior, all phases; 1, 2: each phase's own
		 * columns left and right of it (a few elements) */
		for (int64_t p = 0; p < (pass ? P : 1); p++) {
			int64_t lo = pass == 0 ? sg->I0 : pass == 1 ? sg->ilo[p] : imax(sg->I1, sg->ilo[p]);
			int64_t hi = pass == 0 ? sg->I1 : pass == 1 ? imin(sg->I0, sg->ihi[p]) : sg->ihi[p];
			if (hi <= lo)
				continue;
			int64_t ist[2] = {lo}, ilen[2] = {hi - lo};
			int ni = pass ? 1 : vector_spans(lo, hi - lo, ist, ilen);
			for (int u = 0; u < ni; u++) {
				cg_append(m, rb, cg_loop(m, k, I(m, ilen[u]), pass ? 0 : CG_VECTORIZE, &i, &ib));
				i = add(m, I(m, ist[u]), i);
				for (int64_t ph = pass ? p : 0; ph < (pass ? p + 1 : P); ph++) {
					cg_expr *col = add(m, mul(m, i, I(m, P)), I(m, ph - sg->pl)), *v = NULL;
					for (int q = 0; q < nr; q++)
						v = pool_combine(m, true, v, cg_ld(m, in[0], add(m, rowp[q], col)));
					cg_append(m, ib, cg_st(m, V, add(m, vp, add(m, I(m, ph * sg->Q), i)),
					                       v ? v : least));
				}
			}
		}
	}
	/* the horizontal max: tap kw of output j, padded column j*s1 + kw*d1,
	 * is phase (kw*d1) % P at j + (kw*d1) / P when P is s1 (contiguous in
	 * j), element j*s1 + kw*d1 of the one row when P is 1 */
	/* over: a row narrower than a vector as one whole vector, whose lanes
	 * past Wo write the start of the next row (computed after this one) */
	int ns = over ? (st[0] = 0, len[0] = TAIL_VEC, 1) : vector_spans(0, sg->Wo, st, len);
	for (int q = 0; q < ns; q++) {
		cg_append(m, rb, cg_loop(m, k, I(m, len[q]), CG_VECTORIZE, &j, &jb));
		j = add(m, I(m, st[q]), j);
		cg_expr *v = NULL;
		for (int64_t kw = 0; kw < g->k[1]; kw++) {
			int64_t t = kw * sg->d1;
			cg_expr *e = P > 1 ? add(m, I(m, t % P * sg->Q), add(m, j, I(m, t / P)))
			                   : add(m, mul(m, j, I(m, sg->s1)), I(m, t));
			v = pool_combine(m, true, v, cg_ld(m, V, add(m, vp, e)));
		}
		cg_append(m, jb, cg_st(m, y, add(m, yp, add(m, mul(m, oh, I(m, sg->Wo)), j)), v));
	}
}

/* sg's P phase rows of a padded row of Wp columns (padded column c at
 * phase c % P, element c / P), which elements of each hold x's columns,
 * and which do in every phase. */
static void sep_phases(sep_geom *sg, int64_t Wp, int64_t P)
{
	sg->P = P;
	sg->Q = (Wp + P - 1) / P;
	sg->I0 = 0, sg->I1 = sg->Q;
	for (int64_t p = 0; p < P; p++) {
		/* i*P + p - pl in [0, W) */
		int64_t lo = sg->pl - p <= 0 ? 0 : (sg->pl - p + P - 1) / P;
		int64_t hi = sg->pl + sg->W - p <= 0 ? 0 : (sg->pl + sg->W - p + P - 1) / P;
		sg->ilo[p] = imin(lo, sg->Q);
		sg->ihi[p] = imax(imin(hi, sg->Q), sg->ilo[p]);
		sg->I0 = imax(sg->I0, sg->ilo[p]);
		sg->I1 = imin(sg->I1, sg->ihi[p]);
	}
	sg->I1 = imax(sg->I1, sg->I0);
}

/* A separable 2-D max pool (f32; pool_sep_ok says which): per output
 * row, the max over the window's rows into V, then over its columns, both
 * in whole vectors.  V holds the row padded with -inf as s1 phase rows
 * (phase p, element i: padded column i*s1 + p) when each phase keeps a
 * whole vector of columns inside x, so the horizontal taps are contiguous
 * at any stride (read at stride 2 from one row, LLVM loaded a tap with
 * gathers), else as the one row.  Rows narrower than a vector run as one
 * whole vector each, overshooting into the next row, which is computed
 * after it (13 outputs ran scalar).  The output rows whose window rows all
 * lie in x run in one loop with no row tests; each other row is emitted
 * on its own, its rows outside x left out at compile time.  SqueezeNet's
 * 3x3/2 ceil-mode pools, batch 1, one thread, kiln bench min over 5 x 200
 * runs (ms, Zen 4): 128 x 55x55 0.101 -> 0.072, 256 x 27x27 0.070 ->
 * 0.054 (ORT 0.110, 0.063 with its reorders). */
static kiln_status pool_sep(cg_module *m, cg_kernel *k, cg_stmt *blk, const ir_node *n,
                            const int *in, int y, const geom *g, cg_expr *nc, cg_expr *b,
                            kiln_error *err)
{
	int64_t H = g->in[0], Ho = g->out[0], s0 = g->stride[0], d0 = g->dil[0], k0 = g->k[0];
	sep_geom sg = {.W = g->in[1], .Wo = g->out[1], .s1 = g->stride[1], .d1 = g->dil[1],
	               .pl = g->pad[1]};
	int64_t last = (sg.Wo - 1) * sg.s1 + (g->k[1] - 1) * sg.d1 + 1;
	int64_t Wp = sg.pl + sg.W > last ? sg.pl + sg.W : last;
	/* phase rows where each still has a whole vector of columns inside x
	 * (a 27-column row at stride 2 ran its 13 scalar), else the one row */
	sep_phases(&sg, Wp, sg.s1);
	if (sg.s1 > 1 && sg.I1 - sg.I0 < TAIL_VEC)
		sep_phases(&sg, Wp, 1);
	/* rows narrower than a vector: one whole vector each (sep_row's over),
	 * V long enough for its taps, -inf past the row */
	int64_t ovr = Ho * sg.Wo >= TAIL_VEC ? (Ho * sg.Wo - TAIL_VEC) / sg.Wo + 1 : 0;
	bool over = sg.Wo < TAIL_VEC && sg.P == 1 && ovr > 0; /* rows [0, ovr) may */
	if (over) {
		int64_t need = (TAIL_VEC - 1) * sg.s1 + (g->k[1] - 1) * sg.d1 + 1;
		sg.Q = sg.Q > need ? sg.Q : need;
		sg.ihi[0] = sg.ihi[0] < sg.Q ? sg.ihi[0] : sg.Q;
	}
	int64_t P = sg.P, vsz = P * sg.Q;
	int V = cg_lower_scratch(m, KILN_F32, mul(m, nc, I(m, vsz)));
	if (V < 0)
		return nomem(m, n, err);
	cg_expr *vp = mul(m, b, I(m, vsz)), *xp = mul(m, b, I(m, g->isz));
	cg_expr *yp = mul(m, b, I(m, g->osz)), *least = fc(m, KILN_F32, -INFINITY), *w, *oh;
	cg_stmt *wb, *rb;
	/* each phase row's -inf outside x, once per plane */
	for (int64_t p = 0; p < P; p++) {
		int64_t r[2][2] = {{0, sg.ilo[p]}, {sg.ihi[p], sg.Q}};
		for (int e = 0; e < 2; e++) {
			if (r[e][1] <= r[e][0])
				continue;
			cg_append(m, blk, cg_loop(m, k, I(m, r[e][1] - r[e][0]), 0, &w, &wb));
			cg_append(m, wb, cg_st(m, V, add(m, vp, add(m, I(m, p * sg.Q + r[e][0]), w)), least));
		}
	}
	/* output rows whose window rows oh*s0 - pad0 + kh*d0 are all in x:
	 * one loop; the others each on its own, in row order (an overshooting
	 * row must come before the ones it writes into); rows from ovr on, whose
	 * vector would pass the plane's end, do not overshoot */
	int64_t R0 = (g->pad[0] + s0 - 1) / s0;
	int64_t R1 = H - 1 + g->pad[0] - (k0 - 1) * d0 < 0 ? 0
	           : (H - 1 + g->pad[0] - (k0 - 1) * d0) / s0 + 1;
	R0 = R0 < Ho ? R0 : Ho;
	R1 = R1 < R0 ? R0 : R1 < Ho ? R1 : Ho;
	if (over && R1 > ovr)
		R1 = ovr > R0 ? ovr : R0;
	for (int64_t r = 0; r < Ho; r++) {
		int64_t rows[SEP_MAX_K];
		int nr = 0;
		for (int64_t kh = 0; kh < k0; kh++) {
			int64_t xr = r * s0 - g->pad[0] + kh * d0;
			if ((r >= R0 && r < R1) || (xr >= 0 && xr < H))
				rows[nr++] = kh;
		}
		if (r == R0 && R1 > R0) {
			cg_append(m, blk, cg_loop(m, k, I(m, R1 - R0), 0, &oh, &rb));
			sep_row(m, k, rb, in, y, g, &sg, V, vp, xp, yp, add(m, I(m, R0), oh), rows, nr,
			        over);
			r = R1 - 1;
			continue;
		}
		sep_row(m, k, blk, in, y, g, &sg, V, vp, xp, yp, I(m, r), rows, nr, over && r < ovr);
	}
	return KILN_OK;
}

static kiln_status pool_values(cg_module *m, const ir_node *n, const int *in, const int *out,
                               kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	const int64_t *ks;
	geom g;
	uint32_t nk = ir_attr_ints(n, "kernel_shape", &ks);
	if (x->rank < 3 || nk != (uint32_t)x->rank - 2)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "kernel_shape does not fit rank %d", x->rank);
	kiln_status st = geometry(m, n, x, cg_btype(m, out[0]), ks, false, &g, err);
	cg_kernel *k = st ? NULL : cg_lower_kernel(m, n);
	if (!k)
		return st ? st : nomem(m, n, err);
	int ns = g.nsp;
	cg_expr *nc = mul(m, cg_dim(m, x->dim[0]), cg_dim(m, x->dim[1])), *b, *ext[3], *o[3];
	cg_stmt *blk;
	/* a tap is a clamped load, four bounds tests and a select: 4 operations */
	cg_append(m, k->body, cg_loop(m, k, nc, cg_par(m, mul(m, m->buf[out[0]].numel, I(m, 4 * g.ksz))),
	                              &b, &blk));
	if (pool_flat_ok(m, &g, in[0]))
		return pool_flat(m, k, blk, n, in, out[0], &g, nc, b, err);
	if (pool_sep_ok(m, n, &g, in[0]))
		return pool_sep(m, k, blk, n, in, out[0], &g, nc, b, err);
	if (ns != 2) {
		for (int d = 0; d < ns; d++)
			ext[d] = I(m, g.out[d]);
		cg_stmt *ob = cg_nest(m, k, blk, ns, ext, NULL, o);
		cg_expr *v = pool_pixel(m, k, ob, n, in, &g, b, o, false, NULL);
		cg_append(m, ob, cg_st(m, out[0], add(m, mul(m, b, I(m, g.osz)), lin(m, ns, o, g.out)), v));
		return KILN_OK;
	}
	/* 2-D: per output row, the left edge, the interior (vectorized, no
	 * column tests) and the right edge, as the depthwise conv does */
	cg_stmt *rb, *cb;
	int64_t lo, hi;
	/* stride 2: the plane of x split into even and odd columns first */
	split sp = {.buf = -1, .half = (g.in[1] + 1) / 2};
	bool rows = false;
	if (want_split(&g) && (x->dtype == KILN_F32 || x->dtype == KILN_U8 || x->dtype == KILN_I8)) {
		/* the copy keeps x's dtype: a u8 max pool of a quantized model too */
		kiln_dtype xdt = x->dtype;
		rows = by_rows(&g);
		int64_t psz = (rows ? g.k[0] : g.in[0]) * 2 * sp.half;
		sp.buf = cg_lower_scratch(m, xdt, mul(m, nc, I(m, psz)));
		if (sp.buf < 0)
			return nomem(m, n, err);
		sp.plane = mul(m, b, I(m, psz));
		sp.rows = rows;
		if (!rows)
			split_plane(m, k, blk, in[0], mul(m, b, I(m, g.isz)), &sp, g.in[0], g.in[1]);
	}
	cg_append(m, blk, cg_loop(m, k, I(m, g.out[0]), 0, &o[0], &rb));
	if (rows)
		split_rows(m, k, rb, in[0], mul(m, b, I(m, g.isz)), &sp, &g, o[0]);
	dw_span(&g, &lo, &hi);
	int64_t c0[3] = {0, lo, hi}, cext[3] = {lo, hi - lo, g.out[1] - hi};
	for (int r = 0; r < 3; r++) {
		int64_t st[2] = {c0[r]}, len[2] = {cext[r]};
		int nsp = r == 1 ? vector_spans(c0[r], cext[r], st, len) : 1;
		for (int q = 0; q < nsp; q++) {
			if (len[q] <= 0)
				continue;
			cg_expr *v;
			cg_append(m, rb, cg_loop(m, k, I(m, len[q]), r == 1 ? CG_VECTORIZE : 0, &v, &cb));
			cg_expr *oc[2] = {o[0], add(m, I(m, st[q]), v)};
			cg_expr *val = pool_pixel(m, k, cb, n, in, &g, b, oc, r == 1, &sp);
			cg_append(m, cb, cg_st(m, out[0], add(m, mul(m, b, I(m, g.osz)),
			                                      add(m, mul(m, o[0], I(m, g.out[1])), oc[1])),
			                       val));
		}
	}
	return KILN_OK;
}

/* MaxPool's second output, Indices (ONNX): for each output the flat index
 * into x of the first tap holding the window's max (x's plane offset plus
 * the tap's place in the plane, row major, or with storage_order 1 column
 * major), taps in the padding never chosen.  Its own kernel beside the
 * values' (which keep their vectorized edges and interior): a strictly
 * greater value replaces the best, as ONNX Runtime's loop does; a window
 * of -inf or NaN only gives its first tap inside x. */
static kiln_status pool_indices(cg_module *m, const ir_node *n, const int *in, int ind,
                                kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	const int64_t *ks;
	geom g;
	ir_attr_ints(n, "kernel_shape", &ks);
	kiln_status st = geometry(m, n, x, cg_btype(m, ind), ks, false, &g, err);
	cg_kernel *k = st ? NULL : cg_lower_kernel(m, n);
	if (!k)
		return st ? st : nomem(m, n, err);
	int ns = g.nsp;
	bool colmajor = ir_attr_int(n, "storage_order", 0) == 1;
	kiln_dtype xt = m->buf[in[0]].dt, ct = cg_ctype(xt);
	double least = kiln_dtype_is_float(xt) ? -INFINITY : xt == KILN_U8 ? 0
	               : xt == KILN_I8 ? -128 : -2147483648.0;
	cg_expr *nc = mul(m, cg_dim(m, x->dim[0]), cg_dim(m, x->dim[1])), *b, *ext[3], *o[3];
	cg_expr *t[3], *j[3], *valid;
	uint32_t h[3];
	cg_stmt *blk;
	cg_append(m, k->body, cg_loop(m, k, nc, cg_par(m, mul(m, m->buf[ind].numel, I(m, 6 * g.ksz))),
	                              &b, &blk));
	for (int d = 0; d < ns; d++)
		ext[d] = I(m, g.out[d]);
	cg_stmt *ob = cg_nest(m, k, blk, ns, ext, NULL, o);
	cg_expr *best = cg_local(m, k, ob, ct, fc(m, ct, least));
	cg_expr *at = cg_local(m, k, ob, KILN_I64, I(m, -1));
	cg_expr *first = cg_local(m, k, ob, KILN_I64, I(m, -1));
	for (int d = 0; d < ns; d++) {
		ext[d] = I(m, g.k[d]);
		h[d] = g.ksz <= 64 ? CG_UNROLL : 0;
	}
	cg_stmt *tb = cg_nest(m, k, ob, ns, ext, h, t);
	taps(m, &g, o, t, j, &valid);
	cg_expr *base = mul(m, b, I(m, g.isz));
	cg_expr *xv = cg_ld(m, in[0], add(m, base, lin(m, ns, j, g.in)));
	cg_expr *pos = NULL; /* the tap's place in its plane */
	if (!colmajor) {
		pos = lin(m, ns, j, g.in);
	} else {
		int64_t stride = 1;
		for (int d = 0; d < ns; d++) {
			cg_expr *term = mul(m, j[d], I(m, stride));
			pos = pos ? add(m, pos, term) : term;
			stride *= g.in[d];
		}
	}
	cg_expr *take = cg_bin(m, CG_AND, valid, cg_bin(m, CG_GT, xv, best));
	cg_set(m, tb, first, cg_select(m, cg_bin(m, CG_AND, valid, cg_bin(m, CG_LT, first, I(m, 0))),
	                               pos, first));
	cg_set(m, tb, at, cg_select(m, take, pos, at));
	cg_set(m, tb, best, cg_select(m, take, xv, best));
	cg_expr *chosen = cg_select(m, cg_bin(m, CG_GE, at, I(m, 0)), at, first);
	cg_append(m, ob, cg_st(m, ind, add(m, mul(m, b, I(m, g.osz)), lin(m, ns, o, g.out)),
	                       add(m, base, chosen)));
	return KILN_OK;
}

kiln_status cg_lower_pool(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err)
{
	kiln_status st = pool_values(m, n, in, out, err);
	if (st == KILN_OK && n->op == KILN_OP_MAX_POOL && n->nout == 2)
		st = pool_indices(m, n, in, out[1], err);
	return st;
}

kiln_status cg_lower_global_avg_pool(cg_module *m, const ir_node *n, const int *in,
                                     const int *out, kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	if (x->rank < 2)
		return cg_lower_fail(m, n, err, KILN_ESHAPE, "needs [N, C, ...] input");
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	kiln_dtype ct = cg_ctype(x->dtype);
	cg_expr *nc = cg_prod(m, x, 0, 2), *sp = cg_prod(m, x, 2, x->rank), *b, *s;
	cg_stmt *blk, *sb;
	int cb = cg_buf_block(m, in[0]);
	if (cb) { /* x in channel blocks (lower.c's blocked_chain) */
		if (x->rank < 3 || x->dim[1] % cb || ct != KILN_F32)
			return cg_lower_fail(m, n, err, KILN_EINVAL, "input in blocks of %d channels "
			                     "(internal error)", cb);
		/* per (image, block): its channels' sums in y's vector of them,
		 * one vector of x added per pixel, then scaled */
		cg_expr *l, *y0;
		cg_stmt *lb;
		cg_append(m, k->body, cg_loop(m, k, cg_bin(m, CG_DIV, nc, I(m, cb)),
		                              cg_par(m, m->buf[in[0]].numel), &b, &blk));
		y0 = mul(m, b, I(m, cb));
		cg_append(m, blk, cg_loop(m, k, I(m, cb), CG_VECTORIZE, &l, &lb));
		cg_append(m, lb, cg_st(m, out[0], add(m, y0, l), fc(m, ct, 0)));
		cg_append(m, blk, cg_loop(m, k, sp, 0, &s, &sb));
		cg_append(m, sb, cg_loop(m, k, I(m, cb), CG_VECTORIZE, &l, &lb));
		cg_expr *xi = add(m, mul(m, add(m, mul(m, b, sp), s), I(m, cb)), l);
		cg_append(m, lb, cg_st(m, out[0], add(m, y0, l),
		                       add(m, cg_ld(m, out[0], add(m, y0, l)), cg_ld(m, in[0], xi))));
		cg_append(m, blk, cg_loop(m, k, I(m, cb), CG_VECTORIZE, &l, &lb));
		cg_append(m, lb, cg_st(m, out[0], add(m, y0, l),
		                       cg_bin(m, CG_DIV, cg_ld(m, out[0], add(m, y0, l)),
		                              cg_cast(m, sp, ct))));
		return KILN_OK;
	}
	cg_append(m, k->body, cg_loop(m, k, nc, cg_par(m, m->buf[in[0]].numel), &b, &blk));
	cg_expr *acc = cg_local(m, k, blk, ct, fc(m, ct, 0));
	cg_append(m, blk, cg_loop(m, k, sp, CG_REDUCE | CG_VECTORIZE, &s, &sb));
	cg_set(m, sb, acc, add(m, acc, cg_ld(m, in[0], add(m, mul(m, b, sp), s))));
	cg_append(m, blk, cg_st(m, out[0], b, cg_bin(m, CG_DIV, acc, cg_cast(m, sp, ct))));
	return KILN_OK;
}

/* ---- normalisation -------------------------------------------------------- */

/* Part lo..hi-1 of x's channels (bn_infer) chosen by channel c: a tree of
 * ifs on c, each leaf one vector loop over the row's pixels reading its
 * part. */
static void bn_parts(cg_module *m, cg_kernel *k, cg_stmt *blk, const cg_parts *x, int lo,
                     int hi, cg_expr *r, cg_expr *c, cg_expr *inner, cg_expr *sc, cg_expr *sh, int y)
{
	if (hi - lo > 1) {
		int mid = (lo + hi) / 2;
		cg_stmt *a = cg_block(m), *b = cg_block(m);
		bn_parts(m, k, a, x, lo, mid, r, c, inner, sc, sh, y);
		bn_parts(m, k, b, x, mid, hi, r, c, inner, sc, sh, y);
		cg_append(m, blk, cg_if(m, cg_bin(m, CG_LT, c, I(m, x->at[mid])), a, b));
		return;
	}
	cg_expr *s;
	cg_stmt *sb;
	cg_append(m, blk, cg_loop(m, k, inner, CG_VECTORIZE, &s, &sb));
	cg_expr *i = add(m, mul(m, r, inner), s), *xi = i;
	if (x->n > 1) /* image r / C, channel c - at of the part's len */
		xi = add(m, mul(m, add(m, mul(m, cg_bin(m, CG_DIV, r, x->C), I(m, x->len[lo])),
		                       cg_bin(m, CG_SUB, c, I(m, x->at[lo]))),
		                inner), s);
	cg_append(m, sb, cg_st(m, y, i, add(m, mul(m, cg_ld(m, x->buf[lo], xi), sc), sh)));
}

/* Inference: one fused loop, scale = gamma / sqrt(var + eps) and shift
 * computed per (image, channel) row in the kernel.  x may come in parts
 * along its channels (a Concat no kernel materialized: cg_lower_bn_parts). */
static kiln_status bn_infer(cg_module *m, const ir_node *n, const cg_parts *x, const int *in,
                            int y, kiln_error *err)
{
	const ir_type *t = cg_btype(m, y);
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	kiln_dtype ct = cg_ctype(t->dtype);
	cg_expr *C = x->C, *inner = cg_prod(m, t, 2, t->rank), *r;
	cg_stmt *blk;
	cg_append(m, k->body, cg_loop(m, k, mul(m, cg_dim(m, t->dim[0]), C),
	                              cg_par(m, m->buf[y].numel), &r, &blk));
	cg_expr *c = cg_bin(m, CG_REM, r, C);
	double eps = ir_attr_float(n, "epsilon", 1e-5);
	cg_expr *sd = cg_un(m, CG_SQRT, add(m, cg_ld(m, in[4], c), fc(m, ct, eps)));
	cg_expr *sc = cg_local(m, k, blk, ct, cg_bin(m, CG_DIV, cg_ld(m, in[1], c), sd));
	cg_expr *sh = cg_local(m, k, blk, ct, cg_bin(m, CG_SUB, cg_ld(m, in[2], c),
	                                             mul(m, cg_ld(m, in[3], c), sc)));
	bn_parts(m, k, blk, x, 0, x->n, r, c, inner, sc, sh, y);
	/* each element stored once at its own index: a Relu after the BN (a
	 * pre-activation block: DenseNet's concat -> BN -> Relu, where bnfold
	 * has no conv to fold the BN into) or a residual Add folds into these
	 * stores instead of a pass of its own */
	k->final_buf = y;
	return KILN_OK;
}

/* Sum over (image, pixel) of f(x) for channel c, into a fresh local. */
static cg_expr *chan_sum(cg_module *m, cg_kernel *k, cg_stmt *blk, int x, cg_expr *c,
                         cg_expr *mean, kiln_dtype ct)
{
	const ir_type *t = cg_btype(m, x);
	cg_expr *inner = cg_prod(m, t, 2, t->rank), *ext[2] = {cg_dim(m, t->dim[0]), inner}, *iv[2];
	uint32_t h[2] = {CG_REDUCE, CG_REDUCE | CG_VECTORIZE};
	cg_expr *acc = cg_local(m, k, blk, ct, fc(m, ct, 0));
	cg_stmt *body = cg_nest(m, k, blk, 2, ext, h, iv);
	cg_expr *v = cg_ld(m, x, add(m, mul(m, add(m, mul(m, iv[0], cg_dim(m, t->dim[1])), c), inner), iv[1]));
	if (mean)
		v = cg_bin(m, CG_SUB, v, mean), v = mul(m, v, v);
	cg_set(m, body, acc, add(m, acc, v));
	return acc;
}

/* Training: batch statistics per channel (population variance), then the
 * running statistics out = input * momentum + batch * (1 - momentum). */
static kiln_status bn_train(cg_module *m, const ir_node *n, const int *in, const int *out,
                            kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	kiln_dtype ct = cg_ctype(x->dtype);
	cg_expr *C = cg_dim(m, x->dim[1]), *inner = cg_prod(m, x, 2, x->rank), *c, *iv[2];
	cg_expr *cnt = cg_cast(m, mul(m, cg_dim(m, x->dim[0]), inner), ct);
	cg_stmt *blk;
	double eps = ir_attr_float(n, "epsilon", 1e-5), mom = ir_attr_float(n, "momentum", 0.9);
	cg_append(m, k->body, cg_loop(m, k, C, cg_par(m, m->buf[in[0]].numel), &c, &blk));
	cg_expr *mean = cg_local(m, k, blk, ct, cg_bin(m, CG_DIV, chan_sum(m, k, blk, in[0], c, NULL, ct), cnt));
	cg_expr *var = cg_local(m, k, blk, ct, cg_bin(m, CG_DIV, chan_sum(m, k, blk, in[0], c, mean, ct), cnt));
	cg_expr *sc = cg_local(m, k, blk, ct, cg_bin(m, CG_DIV, cg_ld(m, in[1], c),
	                                             cg_un(m, CG_SQRT, add(m, var, fc(m, ct, eps)))));
	cg_expr *ext[2] = {cg_dim(m, x->dim[0]), inner};
	uint32_t h[2] = {0, CG_VECTORIZE};
	cg_stmt *body = cg_nest(m, k, blk, 2, ext, h, iv);
	cg_expr *i = add(m, mul(m, add(m, mul(m, iv[0], C), c), inner), iv[1]);
	cg_append(m, body, cg_st(m, out[0], i, add(m, mul(m, cg_bin(m, CG_SUB, cg_ld(m, in[0], i), mean), sc),
	                                          cg_ld(m, in[2], c))));
	cg_expr *stat[2] = {mean, var};
	for (int s = 1; s < 3 && s < (int)n->nout; s++)
		if (out[s] >= 0)
			cg_append(m, blk, cg_st(m, out[s], c, add(m, mul(m, cg_ld(m, in[2 + s], c), fc(m, ct, mom)),
			                                         mul(m, stat[s - 1], fc(m, ct, 1 - mom)))));
	return KILN_OK;
}

kiln_status cg_lower_batch_norm(cg_module *m, const ir_node *n, const int *in, const int *out,
                                kiln_error *err)
{
	if (cg_btype(m, in[0])->rank < 2)
		return cg_lower_fail(m, n, err, KILN_ESHAPE, "input needs rank >= 2");
	if (ir_attr_int(n, "training_mode", 0))
		return bn_train(m, n, in, out, err);
	cg_parts x = {.n = 1, .buf = {in[0]}, .C = cg_dim(m, cg_btype(m, in[0])->dim[1])};
	return cg_lower_bn_parts(m, n, &x, in, out, err);
}

kiln_status cg_lower_bn_parts(cg_module *m, const ir_node *n, const cg_parts *x,
                              const int *in, const int *out, kiln_error *err)
{
	kiln_status st = bn_infer(m, n, x, in, out[0], err);
	/* outside training the running statistics pass through unchanged */
	for (int s = 1; !st && s < (int)n->nout; s++)
		if (out[s] >= 0)
			st = cg_lower_copy(m, n, in[2 + s], out[s], err);
	return st;
}

/* Index into t broadcast (right-aligned) against x at flat index i of x. */
static cg_expr *bcast_index(cg_module *m, const ir_type *x, const ir_type *t, cg_expr *i)
{
	cg_expr *idx = I(m, 0);
	for (int d = 0; d < x->rank; d++) {
		int j = d - (x->rank - t->rank);
		if (j < 0 || t->dim[j] == 1)
			continue;
		cg_expr *coord = cg_bin(m, CG_REM, cg_bin(m, CG_DIV, i, cg_stride(m, x, d)), cg_dim(m, x->dim[d]));
		idx = add(m, idx, mul(m, coord, cg_stride(m, t, j)));
	}
	return idx;
}

/* Index of scale/bias t at (o, k) of x viewed as [outer, inner]: k itself
 * when t is exactly x's dims from axis on, else general broadcasting. */
static cg_expr *ln_index(cg_module *m, const ir_type *x, const ir_type *t, int axis, cg_expr *o,
                         cg_expr *k, cg_expr *inner)
{
	bool exact = t->rank == x->rank - axis;
	for (int j = 0; exact && j < t->rank; j++)
		exact = t->dim[j] == x->dim[axis + j];
	return exact ? k : bcast_index(m, x, t, add(m, mul(m, o, inner), k));
}

kiln_status cg_lower_layer_norm(cg_module *m, const ir_node *n, const int *in, const int *out,
                                kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	int64_t axis = ir_attr_int(n, "axis", -1);
	axis = axis < 0 ? axis + x->rank : axis;
	if (axis < 0 || axis >= x->rank)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "axis out of range for rank %d", x->rank);
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	kiln_dtype ct = cg_ctype(x->dtype);
	cg_expr *outer = cg_prod(m, x, 0, (int)axis), *inner = cg_prod(m, x, (int)axis, x->rank);
	cg_expr *o, *j[3], *cnt = cg_cast(m, inner, ct);
	cg_stmt *blk, *b[3];
	cg_append(m, k->body, cg_loop(m, k, outer, cg_par(m, m->buf[in[0]].numel), &o, &blk));
	cg_expr *s = cg_local(m, k, blk, ct, fc(m, ct, 0));
	cg_append(m, blk, cg_loop(m, k, inner, CG_REDUCE | CG_VECTORIZE, &j[0], &b[0]));
	cg_set(m, b[0], s, add(m, s, cg_ld(m, in[0], add(m, mul(m, o, inner), j[0]))));
	cg_expr *mean = cg_local(m, k, blk, ct, cg_bin(m, CG_DIV, s, cnt));
	cg_expr *s2 = cg_local(m, k, blk, ct, fc(m, ct, 0));
	cg_append(m, blk, cg_loop(m, k, inner, CG_REDUCE | CG_VECTORIZE, &j[1], &b[1]));
	cg_expr *d = cg_bin(m, CG_SUB, cg_ld(m, in[0], add(m, mul(m, o, inner), j[1])), mean);
	cg_set(m, b[1], s2, add(m, s2, mul(m, d, d)));
	cg_expr *inv = cg_local(m, k, blk, ct, cg_bin(m, CG_DIV, fc(m, ct, 1),
	                        cg_un(m, CG_SQRT, add(m, cg_bin(m, CG_DIV, s2, cnt),
	                                              fc(m, ct, ir_attr_float(n, "epsilon", 1e-5))))));
	cg_append(m, blk, cg_loop(m, k, inner, CG_VECTORIZE, &j[2], &b[2]));
	cg_expr *i = add(m, mul(m, o, inner), j[2]);
	cg_expr *v = mul(m, mul(m, cg_bin(m, CG_SUB, cg_ld(m, in[0], i), mean), inv),
	                 cg_ld(m, in[1], ln_index(m, x, cg_btype(m, in[1]), (int)axis, o, j[2], inner)));
	if (n->nin > 2 && in[2] >= 0)
		v = add(m, v, cg_ld(m, in[2], ln_index(m, x, cg_btype(m, in[2]), (int)axis, o, j[2], inner)));
	cg_append(m, b[2], cg_st(m, out[0], i, v));
	if (n->nout > 1 && out[1] >= 0)
		cg_append(m, blk, cg_st(m, out[1], o, mean));
	if (n->nout > 2 && out[2] >= 0)
		cg_append(m, blk, cg_st(m, out[2], o, inv));
	return KILN_OK;
}

/* ---- softmax ---------------------------------------------------------------- */

/* (log_)softmax of x along axis into y, stable: max, sum of exp(x - max),
 * normalise.  When the axis is innermost the three loops are contiguous. */
static kiln_status softmax_into(cg_module *m, const ir_node *n, int x, int64_t axis, int y,
                                bool logp, kiln_error *err)
{
	const ir_type *t = cg_btype(m, x);
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	kiln_dtype ct = cg_ctype(t->dtype);
	cg_expr *outer = cg_prod(m, t, 0, (int)axis), *len = cg_dim(m, t->dim[axis]);
	cg_expr *inner = cg_prod(m, t, (int)axis + 1, t->rank), *o, *kk = I(m, 0), *j[3];
	bool contig = cg_expr_int(inner, NULL) == 1 && inner->kind == CG_CONST;
	uint32_t vec = contig ? CG_VECTORIZE : 0;
	cg_stmt *blk, *b[3];
	cg_append(m, k->body, cg_loop(m, k, outer, cg_par(m, m->buf[x].numel), &o, &blk));
	if (!contig) {
		cg_stmt *kb;
		cg_append(m, blk, cg_loop(m, k, inner, 0, &kk, &kb));
		blk = kb;
	}
	cg_expr *base = add(m, mul(m, o, mul(m, len, inner)), kk);
	/* softmax into a y of the compute type: each exp once, kept in y (the
	 * row is in cache) and scaled by 1/sum in the last pass */
	bool once = !logp && x != y && m->buf[y].dt == ct;
	/* The max: a float max reduction does not vectorize (LLVM wants
	 * no-NaNs for it), so a contiguous row of >= 2*U is scanned as U
	 * independent lanes, a block of U contiguous loads per step that the
	 * SLP vectorizer turns into vector max, then the lanes and the tail
	 * combine.  Comparisons skip NaNs, which reach the output anyway
	 * through exp(x - max). */
	enum { U = 16 };
	int64_t L = len->kind == CG_CONST ? cg_expr_int(len, NULL) : -1, head = 0;
	cg_expr *init = fc(m, ct, -INFINITY);
	if (contig && L >= 2 * U) {
		int64_t nb = L / U;
		cg_expr *lane[U], *jo;
		cg_stmt *lb;
		for (int u = 0; u < U; u++)
			lane[u] = cg_local(m, k, blk, ct, cg_ld(m, x, add(m, base, I(m, u))));
		cg_append(m, blk, cg_loop(m, k, I(m, nb - 1), 0, &jo, &lb));
		for (int u = 0; u < U; u++) {
			cg_expr *v = cg_ld(m, x, add(m, base, add(m, mul(m, add(m, jo, I(m, 1)), I(m, U)),
			                                          I(m, u))));
			cg_set(m, lb, lane[u], cg_select(m, cg_bin(m, CG_GT, v, lane[u]), v, lane[u]));
		}
		for (int w = U / 2; w >= 1; w /= 2) /* a tree: lane[u] = max(lane[u], lane[u + w]) */
			for (int u = 0; u < w; u++)
				cg_set(m, blk, lane[u], cg_select(m, cg_bin(m, CG_GT, lane[u + w], lane[u]),
				                                  lane[u + w], lane[u]));
		init = lane[0];
		head = nb * U;
	}
	cg_expr *mx = cg_local(m, k, blk, ct, init), *xv[3], *s = NULL, *r = NULL;
	for (int p = 0; p < 3; p++) {
		if (p == 1)
			s = cg_local(m, k, blk, ct, fc(m, ct, 0));
		if (p == 2 && once)
			r = cg_local(m, k, blk, ct, cg_bin(m, CG_DIV, fc(m, ct, 1), s));
		cg_expr *ext = p == 0 && head ? I(m, L - head) : len;
		cg_append(m, blk, cg_loop(m, k, ext, vec | (p < 2 ? CG_REDUCE : 0), &j[p], &b[p]));
		cg_expr *jj = p == 0 && head ? add(m, j[p], I(m, head)) : j[p];
		xv[p] = cg_ld(m, x, add(m, base, mul(m, jj, inner)));
	}
	cg_set(m, b[0], mx, cg_bin(m, CG_MAX, mx, xv[0]));
	cg_expr *e = cg_un(m, CG_EXP, cg_bin(m, CG_SUB, xv[1], mx));
	if (once) {
		cg_expr *yi = add(m, base, mul(m, j[1], inner));
		cg_append(m, b[1], cg_st(m, y, yi, e));
		cg_set(m, b[1], s, add(m, s, cg_ld(m, y, yi)));
		cg_expr *yj = add(m, base, mul(m, j[2], inner));
		cg_append(m, b[2], cg_st(m, y, yj, mul(m, cg_ld(m, y, yj), r)));
		return KILN_OK;
	}
	cg_set(m, b[1], s, add(m, s, e));
	cg_expr *d = cg_bin(m, CG_SUB, xv[2], mx), *v;
	if (logp)
		v = cg_bin(m, CG_SUB, d, cg_un(m, CG_LOG, s));
	else
		v = cg_bin(m, CG_DIV, cg_un(m, CG_EXP, d), s);
	cg_append(m, b[2], cg_st(m, y, add(m, base, mul(m, j[2], inner)), v));
	return KILN_OK;
}

kiln_status cg_lower_softmax(cg_module *m, const ir_node *n, const int *in, const int *out,
                             kiln_error *err)
{
	int rank = cg_btype(m, in[0])->rank;
	int64_t axis = ir_attr_int(n, "axis", -1);
	axis = axis < 0 ? axis + rank : axis;
	if (axis < 0 || axis >= rank)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "axis out of range for rank %d", rank);
	return softmax_into(m, n, in[0], axis, out[0], n->op == KILN_OP_LOG_SOFTMAX, err);
}

/* ---- dropout ------------------------------------------------------------------ */

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* z ^ (z >> s), then times mul (0: no multiply), as i64 with wrapping. */
static cg_expr *xs(cg_module *m, cg_kernel *k, cg_stmt *blk, cg_expr *z, int s, uint64_t mulc)
{
	cg_expr *v = cg_bin(m, CG_XOR, z, cg_bin(m, CG_SHR, z, I(m, s)));
	if (mulc)
		v = mul(m, v, I(m, (int64_t)mulc));
	return cg_local(m, k, blk, KILN_I64, v);
}

/* mix64 of the i64 expression z, in the kernel. */
static cg_expr *mix_expr(cg_module *m, cg_kernel *k, cg_stmt *blk, cg_expr *z)
{
	z = cg_local(m, k, blk, KILN_I64, add(m, z, I(m, (int64_t)0x9e3779b97f4a7c15ULL)));
	z = xs(m, k, blk, z, 30, 0xbf58476d1ce4e5b9ULL);
	z = xs(m, k, blk, z, 27, 0x94d049bb133111ebULL);
	return xs(m, k, blk, z, 31, 0);
}

/* K for a node with seed s: mix64(mix64(s) ^ 0), folded; with the graph
 * input CG_MICRO_INPUT (count c) the seed is s' = mix64(s ^ mix64(c)), as
 * kiln_trainer reseeds before each run, computed per element (cheap beside
 * the generator, and it keeps the loop free of outside locals). */
static cg_expr *dropout_key(cg_module *m, cg_kernel *k, cg_stmt *blk, uint64_t s)
{
	for (uint32_t j = 0; j < m->g->ninput; j++) {
		const ir_value *v = m->g->val[m->g->input[j]];
		if (!v->name || strcmp(v->name, CG_MICRO_INPUT) || v->type.dtype != KILN_I64 ||
		    v->type.rank != 0)
			continue;
		cg_expr *c = mix_expr(m, k, blk, cg_ld(m, m->inputs[j], I(m, 0)));
		cg_expr *s1 = mix_expr(m, k, blk, cg_bin(m, CG_XOR, I(m, (int64_t)s), c));
		return mix_expr(m, k, blk, mix_expr(m, k, blk, s1));
	}
	return I(m, (int64_t)mix64(mix64(s) ^ 0));
}

/* Training mode reproduces the interpreter's counter-based generator (see
 * dropout_u in ir/interp.c) with run seed 0, the seed every compiled run
 * uses: h = mix64(K ^ i) with K from dropout_key. */
static kiln_status dropout_train(cg_module *m, const ir_node *n, const int *in, const int *out,
                                 double ratio, kiln_error *err)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	kiln_dtype ct = cg_ctype(m->buf[in[0]].dt);
	cg_expr *i;
	cg_stmt *blk;
	cg_append(m, k->body, cg_loop(m, k, m->buf[in[0]].numel,
	                              cg_par(m, m->buf[in[0]].numel) | CG_VECTORIZE, &i, &blk));
	cg_expr *K = dropout_key(m, k, blk, (uint64_t)ir_attr_int(n, "seed", 0));
	cg_expr *z = mix_expr(m, k, blk, cg_bin(m, CG_XOR, K, i));
	cg_expr *u = mul(m, cg_cast(m, cg_bin(m, CG_SHR, z, I(m, 11)), KILN_F64), fc(m, KILN_F64, 0x1.0p-53));
	cg_expr *keep = cg_local(m, k, blk, KILN_BOOL, cg_bin(m, CG_GE, u, fc(m, KILN_F64, ratio)));
	double scale = ratio < 1 ? 1 / (1 - ratio) : 0;
	cg_expr *y = cg_select(m, keep, mul(m, cg_ld(m, in[0], i), fc(m, ct, scale)), fc(m, ct, 0));
	cg_append(m, blk, cg_st(m, out[0], i, y));
	if (n->nout > 1 && out[1] >= 0)
		cg_append(m, blk, cg_st(m, out[1], i, keep));
	return KILN_OK;
}

kiln_status cg_lower_dropout(cg_module *m, const ir_node *n, const int *in, const int *out,
                             kiln_error *err)
{
	double ratio = ir_attr_float(n, "ratio", 0.5);
	if (ratio < 0 || ratio > 1)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "ratio %g outside [0, 1]", ratio);
	if (ir_attr_int(n, "training_mode", 0) && ratio > 0)
		return dropout_train(m, n, in, out, ratio, err);
	kiln_status st = KILN_OK;
	if (m->buf[out[0]].kind == CG_BUF_TEMP) { /* a view of x */
		int r = in[0];
		while (m->buf[r].alias >= 0)
			r = m->buf[r].alias;
		m->buf[out[0]].alias = r;
	} else {
		st = cg_lower_copy(m, n, in[0], out[0], err);
	}
	if (!st && n->nout > 1 && out[1] >= 0) { /* every element kept */
		cg_kernel *k = cg_lower_kernel(m, n);
		cg_expr *i;
		cg_stmt *blk;
		if (!k)
			return nomem(m, n, err);
		cg_append(m, k->body, cg_loop(m, k, m->buf[out[1]].numel, CG_VECTORIZE, &i, &blk));
		cg_append(m, blk, cg_store(m, out[1], i, cg_const(m, KILN_BOOL, 1)));
	}
	return st;
}

/* ---- losses ---------------------------------------------------------------- */

/* NLL over log-probabilities lp [N, C, d...] and targets t [N, d...]: an
 * ignored target adds 0 and weighs 0; "mean" divides by the summed weights.
 * Every target that is not ignored is checked against [0, C) first
 * (cg_lower_check_all: the interpreter's error), then used clamped, so even
 * a failing run never reads outside lp. */
static kiln_status nll(cg_module *m, const ir_node *n, const ir_type *x, int lp, int t, int w,
                       int y, kiln_error *err)
{
	const char *red = ir_attr_str(n, "reduction", "mean");
	bool none = !strcmp(red, "none"), sum = !strcmp(red, "sum");
	if (!none && !sum && strcmp(red, "mean"))
		return cg_lower_fail(m, n, err, KILN_EINVAL, "reduction must be none, sum or mean, not '%s'", red);
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return nomem(m, n, err);
	kiln_dtype ct = cg_ctype(x->dtype);
	cg_expr *C = cg_dim(m, x->dim[1]), *D = cg_prod(m, x, 2, x->rank), *i;
	cg_expr *cnt = mul(m, cg_dim(m, x->dim[0]), D);
	cg_stmt *blk;
	int64_t ignore = ir_attr_int(n, "ignore_index", 0);
	cg_lower_check_all(m, k, n, "target", t, cnt, I(m, 0), C,
	                   ir_attr_get(n, "ignore_index") ? &ignore : NULL);
	cg_expr *s = none ? NULL : cg_local(m, k, k->body, ct, fc(m, ct, 0));
	cg_expr *ws = none ? NULL : cg_local(m, k, k->body, ct, fc(m, ct, 0));
	cg_append(m, k->body, cg_loop(m, k, cnt, none ? cg_par(m, cnt) : CG_REDUCE, &i, &blk));
	cg_expr *tg = cg_local(m, k, blk, KILN_I64, cg_cast(m, cg_load(m, t, i), KILN_I64));
	cg_expr *valid = cg_const(m, KILN_BOOL, 1);
	if (ir_attr_get(n, "ignore_index"))
		valid = cg_bin(m, CG_NE, tg, I(m, ir_attr_int(n, "ignore_index", 0)));
	cg_expr *tc = cg_clamp(m, tg, C);
	cg_expr *wt = cg_select(m, valid, w >= 0 ? cg_ld(m, w, tc) : fc(m, ct, 1), fc(m, ct, 0));
	cg_expr *li = add(m, mul(m, add(m, mul(m, cg_bin(m, CG_DIV, i, D), C), tc), D), cg_bin(m, CG_REM, i, D));
	cg_expr *l = cg_select(m, valid, mul(m, cg_un(m, CG_NEG, cg_ld(m, lp, li)), wt), fc(m, ct, 0));
	if (none) {
		cg_append(m, blk, cg_st(m, y, i, l));
		return KILN_OK;
	}
	cg_set(m, blk, s, add(m, s, l));
	cg_set(m, blk, ws, add(m, ws, wt));
	cg_append(m, k->body, cg_st(m, y, I(m, 0), sum ? s : cg_bin(m, CG_DIV, s, ws)));
	return KILN_OK;
}

kiln_status cg_lower_loss(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err)
{
	/* a copy: cg_lower_scratch below may move m->buf */
	const ir_type xt = *cg_btype(m, in[0]), *x = &xt;
	if (x->rank < 2 || kiln_dtype_is_float(m->buf[in[1]].dt))
		return cg_lower_fail(m, n, err, KILN_ESHAPE, "needs scores [N,C,...] and integer targets");
	int w = n->nin > 2 ? in[2] : -1, lp = in[0];
	if (n->op == KILN_OP_SOFTMAX_CE) {
		lp = n->nout > 1 && out[1] >= 0 ? out[1] : cg_lower_scratch(m, x->dtype, m->buf[in[0]].numel);
		if (lp < 0)
			return nomem(m, n, err);
		kiln_status st = softmax_into(m, n, in[0], 1, lp, true, err);
		if (st)
			return st;
	}
	return nll(m, n, x, lp, in[1], w, out[0], err);
}

/* ---- shared with the other lowering files (lower.h) ----------------------------- */

int cg_lower_const_buf(cg_module *m, kiln_tensor *t, int of, const char *sfx)
{
	return const_buf(m, t, of, sfx);
}

kiln_tensor *cg_lower_arena_tensor(cg_module *m, kiln_dtype dt, int64_t n)
{
	return arena_tensor(m, dt, n);
}
