/*
 * lower_wino.c: 3x3, stride-1 convolutions by Winograd's minimal filtering
 * F(4x4, 3x3) (Lavin and Gray, "Fast Algorithms for Convolutional Neural
 * Networks", 2015), with the interpolation points 0, +-1, +-2 and infinity.
 *
 * Each 4x4 block of output pixels (a tile) of one output channel is
 *     Y = A^T [ sum_c (G g_c G^T) . (B^T d_c B) ] A
 * where d_c is the 6x6 input patch of channel c under the tile and g_c the
 * 3x3 filter: 36 products per tile and channel pair instead of 144, so the
 * heavy part, summing over c for every one of the 36 positions xi of the
 * 6x6 transformed tile, is 36 GEMMs a quarter the size of im2col's.
 * Constant filters are transformed here, at compile time, in double
 * precision, into a constant U[xi][C][M] (others by a kernel at run time:
 * graph inputs, a training library's parameters); the transforms of the
 * input and of the products are kernels.
 *
 * Layout is what makes the transforms vectorize: the GEMMs contract over
 * channels, so the transforms run with channels innermost (one vector lane
 * per channel, every load and store contiguous) on channel-last copies:
 *   k1  x[N,C,H,W]        -> xp[N,PH,PW,C]   zero padding added, tiles rounded up
 *   k2  xp                -> V[T][36][C]     B^T d B per tile (T = N * tiles)
 *   k3  V[:, xi] x U[xi]  -> Mt[T][36][M]    36 GEMMs per part of the tile
 *                                            rows, over the threads
 *   k4  Mt                -> yb[N,TH*4,TW*4,M]  A^T m A per tile, then per
 *       yb + bias         -> y[N,M,OH,OW]    tile row its output rows into
 *                                            y and the bias: the only stores
 *                                            of y, final, where an activation
 *                                            or residual fuses
 *                                            (cg_kernel.final_buf)
 * Every kernel cuts the rows of tiles over the threads in the same
 * proportion, so a thread's tiles stay in its core's cache from k2 to k4.
 * k1 and k4 transpose (CG_TRANSPOSE: in registers, block by block); k2
 * and k3 are contiguous.  Rounding the output up to whole tiles (TH = ceil(OH/4))
 * computes a few pixels k4 never copies out, and k1's rows and columns past the
 * input are zeros, so no kernel tests a bound in its inner loop.
 *
 * Error: the transforms' largest coefficients are 5 (B) and 8 (A), so the
 * f32 result differs from direct summation by a few ulps of the largest
 * partial sums; tests hold it to 1e-4 of the interpreter on real models.
 */
#include <math.h>
#include <string.h>

#include "codegen/lower.h"

enum { TILE = 4, PATCH = 6, NXI = PATCH * PATCH };

static const double BT[PATCH][PATCH] = {
	{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
	{0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1},
};
static const double G[PATCH][3] = {
	{1.0 / 4, 0, 0},
	{-1.0 / 6, -1.0 / 6, -1.0 / 6},
	{-1.0 / 6, 1.0 / 6, -1.0 / 6},
	{1.0 / 24, 1.0 / 12, 1.0 / 6},
	{1.0 / 24, -1.0 / 12, 1.0 / 6},
	{0, 0, 1},
};
static const double AT[TILE][PATCH] = {
	{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1},
};

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

static kiln_status nomem(const cg_module *m, const ir_node *n, kiln_error *err)
{
	return cg_lower_fail(m, n, err, KILN_ENOMEM, "out of memory");
}

/* sum_i c[i] * v[i] over the nonzero c[i], as few operations as the
 * coefficients allow (1 and -1 need no multiply). */
static cg_expr *combo(cg_module *m, const double *c, cg_expr *const *v, int n)
{
	cg_expr *s = NULL;
	for (int i = 0; i < n; i++) {
		if (c[i] == 0)
			continue;
		double a = fabs(c[i]);
		cg_expr *t = a == 1 ? v[i] : mul(m, cg_const(m, KILN_F32, a), v[i]);
		s = !s ? (c[i] < 0 ? cg_un(m, CG_NEG, t) : t) : cg_bin(m, c[i] < 0 ? CG_SUB : CG_ADD, s, t);
	}
	return s ? s : cg_const(m, KILN_F32, 0);
}

bool cg_conv_winograd_ok(const cg_module *m, const ir_node *n, const int *in,
                         const ir_conv_geom *g)
{
	const cg_buf *w = &m->buf[in[1]];
	const ir_type *x = cg_btype(m, in[0]);
	return g->nsp == 2 && g->k[0] == 3 && g->k[1] == 3 && g->stride[0] == 1 &&
	       g->stride[1] == 1 && g->dil[0] == 1 && g->dil[1] == 1 &&
	       ir_attr_int(n, "group", 1) == 1 && x->dtype == KILN_F32 && w->dt == KILN_F32 &&
	       x->dim[1] > 0 && cg_btype(m, in[1])->dim[0] > 0;
}

int64_t cg_conv_winograd_batch(const cg_module *m, const ir_node *n, const int *in,
                               const ir_conv_geom *g)
{
	(void)n;
	int64_t C = cg_btype(m, in[0])->dim[1], M = cg_btype(m, in[1])->dim[0];
	int64_t tiles = (g->out[0] + TILE - 1) / TILE * ((g->out[1] + TILE - 1) / TILE);
	/* The GEMMs are 4x smaller but read a filter 4x larger, and the four
	 * transforms cost per channel what a GEMM costs per channel pair: it
	 * pays with enough channels to amortise them and enough tiles in the
	 * batch (rows of each GEMM, 16 and up) that U is not streamed for a
	 * few rows.  A 7x7 map (4 tiles) pays from a batch of 4. */
	if (C < 16 || M < 16)
		return -1;
	int64_t b = (16 + tiles - 1) / tiles;
	return b <= 16 ? b : -1;
}

/* A kernel computing U (below) from w at run time, into a scratch buffer:
 * for weights that are not constants (graph inputs, a training library's
 * parameters).  M * C * 36 values of a few operations each: small next to
 * the convolution. */
static int transform_kernel(cg_module *m, const ir_node *n, int wb, int64_t C, int64_t M)
{
	int u = cg_lower_scratch(m, KILN_F32, I(m, NXI * C * M));
	cg_kernel *k = cg_lower_kernel(m, n);
	if (u < 0 || !k)
		return -1;
	cg_expr *mo, *c, *f[9], *t[PATCH][3];
	cg_stmt *mb, *cb;
	/* output channels innermost: U's stores are contiguous and vectorize
	 * (the filter's loads are 9*C apart: gathers, 9 per 36 stores) */
	cg_append(m, k->body, cg_loop(m, k, I(m, C), cg_par(m, I(m, NXI * C * M * 4)), &c, &mb));
	cg_append(m, mb, cg_loop(m, k, I(m, M), CG_VECTORIZE, &mo, &cb));
	cg_expr *base = mul(m, add(m, mul(m, mo, I(m, C)), c), I(m, 9));
	for (int i = 0; i < 9; i++)
		f[i] = cg_local(m, k, cb, KILN_F32, cg_load(m, wb, add(m, base, I(m, i))));
	for (int a = 0; a < PATCH; a++)
		for (int s = 0; s < 3; s++) {
			cg_expr *col[3] = {f[s], f[3 + s], f[6 + s]};
			t[a][s] = cg_local(m, k, cb, KILN_F32, combo(m, G[a], col, 3));
		}
	for (int a = 0; a < PATCH; a++)
		for (int b = 0; b < PATCH; b++)
			cg_append(m, cb, cg_store(m, u, add(m, mul(m, add(m, mul(m, I(m, a * PATCH + b),
			                                                         I(m, C)), c), I(m, M)), mo),
			                          combo(m, G[b], t[a], 3)));
	return u;
}

/* U[xi][c][mo] = (G g G^T)[xi] for the filter g = w[mo, c]: computed here
 * for a constant w, else by a kernel (transform_kernel). */
static int transformed_weights(cg_module *m, const ir_node *n, int wb, int64_t C, int64_t M,
                               bool at_run)
{
	const cg_buf *wbuf = &m->buf[wb];
	if (at_run || wbuf->kind != CG_BUF_CONST || wbuf->alias >= 0 || !wbuf->data ||
	    wbuf->data->dtype != KILN_F32)
		return transform_kernel(m, n, wb, C, M);
	const float *w = m->buf[wb].data->data;
	kiln_tensor *u = ir_alloc(m->arena, sizeof *u);
	float *d = ir_alloc(m->arena, (size_t)(NXI * C * M) * sizeof *d);
	if (!u || !d)
		return -1;
	*u = (kiln_tensor){.dtype = KILN_F32, .rank = 3, .shape = {NXI, C, M}, .data = d};
	for (int64_t mo = 0; mo < M; mo++)
		for (int64_t c = 0; c < C; c++) {
			const float *f = w + (mo * C + c) * 9;
			double t[PATCH][3];
			for (int a = 0; a < PATCH; a++)
				for (int s = 0; s < 3; s++)
					t[a][s] = G[a][0] * f[s] + G[a][1] * f[3 + s] + G[a][2] * f[6 + s];
			for (int a = 0; a < PATCH; a++)
				for (int b = 0; b < PATCH; b++)
					d[((a * PATCH + b) * C + c) * M + mo] =
						(float)(t[a][0] * G[b][0] + t[a][1] * G[b][1] + t[a][2] * G[b][2]);
		}
	int b = cg_buf_new(m, CG_BUF_CONST, KILN_F32, I(m, NXI * C * M));
	if (b < 0)
		return -1;
	cg_buf *cb = &m->buf[b];
	cb->data = u;
	cb->type.rank = 3;
	cb->type.dim[0] = NXI, cb->type.dim[1] = C, cb->type.dim[2] = M;
	const char *wn = m->buf[wb].name;
	size_t len = (wn ? strlen(wn) : 1) + 12;
	char *name = ir_alloc(m->arena, len);
	if (name)
		snprintf(name, len, "%s.winograd", wn ? wn : "w");
	cb->name = name;
	return b;
}

/* k1: xp[b, r, s, c] = x[b, c, r - pt, s - pl], 0 outside x: the
 * padding zeroed row by row, then each input row transposed from [C, W]
 * (rows H*W apart) into the channels-last row [W, C] (CG_TRANSPOSE). */
static kiln_status pack_input(cg_module *m, const ir_node *n, int x, int xp, const ir_conv_geom *g,
                              cg_expr *nb, int64_t C, int64_t PH, int64_t PW)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	int64_t H = g->in[0], W = g->in[1], pt = g->pad[0], pl = g->pad[1];
	cg_expr *r, *q, *z = cg_const(m, KILN_F32, 0);
	cg_stmt *rb, *qb;
	/* zeros: whole rows above and below x, the columns left and right */
	cg_append(m, k->body, cg_loop(m, k, mul(m, nb, I(m, PH)),
	                              cg_par(m, mul(m, nb, I(m, PH * PW * C))), &r, &rb));
	cg_expr *row = cg_bin(m, CG_REM, r, I(m, PH)), *base = mul(m, r, I(m, PW * C));
	cg_expr *outside = cg_bin(m, CG_OR, cg_bin(m, CG_LT, row, I(m, pt)),
	                          cg_bin(m, CG_GE, row, I(m, pt + H)));
	cg_stmt *whole = cg_block(m), *sides = cg_block(m);
	cg_append(m, whole, cg_loop(m, k, I(m, PW * C), CG_VECTORIZE, &q, &qb));
	cg_append(m, qb, cg_store(m, xp, add(m, base, q), z));
	int64_t right = PW - pl - W;
	if (pl > 0) {
		cg_append(m, sides, cg_loop(m, k, I(m, pl * C), CG_VECTORIZE, &q, &qb));
		cg_append(m, qb, cg_store(m, xp, add(m, base, q), z));
	}
	if (right > 0) {
		cg_append(m, sides, cg_loop(m, k, I(m, right * C), CG_VECTORIZE, &q, &qb));
		cg_append(m, qb, cg_store(m, xp, add(m, add(m, base, I(m, (pl + W) * C)), q), z));
	}
	cg_append(m, rb, cg_if(m, outside, whole, sides));
	/* the rows of x */
	cg_expr *bh;
	cg_stmt *hb;
	cg_append(m, k->body, cg_loop(m, k, mul(m, nb, I(m, H)),
	                              cg_par(m, mul(m, nb, I(m, H * W * C))), &bh, &hb));
	cg_expr *b = cg_bin(m, CG_DIV, bh, I(m, H)), *h = cg_bin(m, CG_REM, bh, I(m, H));
	cg_transpose t = {
		.src = x, .dst = xp, .rows = I(m, C), .cols = I(m, W),
		.src_off = add(m, mul(m, b, I(m, C * H * W)), mul(m, h, I(m, W))), .src_rs = I(m, H * W),
		.dst_off = mul(m, add(m, mul(m, add(m, mul(m, b, I(m, PH)), add(m, h, I(m, pt))),
		                             I(m, PW)), I(m, pl)), I(m, C)),
		.dst_rs = I(m, C)};
	cg_stmt *ts = cg_transpose_stmt(m, &t);
	if (!ts)
		return KILN_ENOMEM;
	cg_append(m, hb, ts);
	return KILN_OK;
}

/* k2: V[t][xi][c] = (B^T d B)[xi], d the 6x6 patch of xp under tile t.
 * xi before c with C a constant: the stores of one c are a known distance
 * apart, which the vectorizer needs (xi outermost, T*C apart with a
 * symbolic batch, it cannot prove them apart and stays scalar). */
static kiln_status input_transform(cg_module *m, const ir_node *n, int xp, int v, cg_expr *nb,
                                   cg_expr *T, int64_t C, int64_t TH, int64_t TW, int64_t PH,
                                   int64_t PW)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *bt, *tw, *c;
	cg_stmt *bb, *tb, *cb;
	cg_append(m, k->body, cg_loop(m, k, mul(m, nb, I(m, TH)),
	                              cg_par(m, mul(m, T, I(m, NXI * C * 4))), &bt, &bb));
	cg_append(m, bb, cg_loop(m, k, I(m, TW), 0, &tw, &tb));
	cg_append(m, tb, cg_loop(m, k, I(m, C), CG_VECTORIZE, &c, &cb));
	cg_expr *b = cg_bin(m, CG_DIV, bt, I(m, TH)), *th = cg_bin(m, CG_REM, bt, I(m, TH));
	/* pixel (th*4 + i, tw*4 + j) of image b */
	cg_expr *base = add(m, mul(m, add(m, mul(m, b, I(m, PH)), mul(m, th, I(m, TILE))), I(m, PW)),
	                    mul(m, tw, I(m, TILE)));
	cg_expr *d[PATCH][PATCH], *t[PATCH][PATCH];
	for (int i = 0; i < PATCH; i++)
		for (int j = 0; j < PATCH; j++)
			d[i][j] = cg_local(m, k, cb, KILN_F32,
			                   cg_load(m, xp, add(m, mul(m, add(m, base, I(m, i * PW + j)),
			                                             I(m, C)), c)));
	for (int j = 0; j < PATCH; j++) { /* t = B^T d, a column at a time */
		cg_expr *col[PATCH];
		for (int r = 0; r < PATCH; r++)
			col[r] = d[r][j];
		for (int i = 0; i < PATCH; i++)
			t[i][j] = cg_local(m, k, cb, KILN_F32, combo(m, BT[i], col, PATCH));
	}
	cg_expr *tile = add(m, mul(m, bt, I(m, TW)), tw);
	for (int i = 0; i < PATCH; i++) /* V = t B */
		for (int kk = 0; kk < PATCH; kk++) {
			cg_expr *at = mul(m, add(m, mul(m, tile, I(m, NXI)), I(m, i * PATCH + kk)), I(m, C));
			cg_append(m, cb, cg_store(m, v, add(m, at, c), combo(m, BT[kk], t[i], PATCH)));
		}
	return KILN_OK;
}

/* Parts the tiles' rows are cut into for the products (k3): each part's
 * 36 GEMMs run on the thread that transformed its tiles (k2) and will
 * transform their products back (k4), since every kernel of a conv splits
 * the same rows of tiles over the threads in proportion.  With the 36
 * GEMMs alone over the threads, each thread read the other's half of V and
 * wrote half of its Mt for the other: on two threads those lines moved
 * between the cores (SqueezeNet, batch 1: the transforms ran slower on two
 * threads than on one).  Each part's GEMMs keep at least PART_ROWS rows
 * of an image's tiles; up to MAX_PARTS parts (two or four threads). */
enum { PART_ROWS = 24, MAX_PARTS = 4 };

static int64_t tile_parts(int64_t TH, int64_t TW)
{
	int64_t p = 1;
	while (p < MAX_PARTS && TH * TW / (2 * p) >= PART_ROWS && TH >= 2 * p)
		p *= 2;
	return p;
}

/* k3: Mt[:, xi] = V[:, xi] x U[xi], one GEMM per part of the tile rows and
 * xi (rows 36 * C apart), over the threads part-major. */
static kiln_status products(cg_module *m, const ir_node *n, int v, int u, int mt, cg_expr *nb,
                            int64_t C, int64_t M, int64_t TH, int64_t TW)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	int64_t P = tile_parts(TH, TW);
	cg_expr *pi, *rows = mul(m, nb, I(m, TH));
	cg_stmt *body;
	cg_append(m, k->body, cg_loop(m, k, I(m, P * NXI), CG_PARALLEL, &pi, &body));
	cg_expr *part = cg_bin(m, CG_DIV, pi, I(m, NXI)), *xi = cg_bin(m, CG_REM, pi, I(m, NXI));
	/* tile rows [r0, r1) of the part: the proportional cut the other kernels' loops make */
	cg_expr *r0 = cg_local(m, k, body, KILN_I64, cg_bin(m, CG_DIV, mul(m, part, rows), I(m, P)));
	cg_expr *r1 = cg_bin(m, CG_DIV, mul(m, add(m, part, I(m, 1)), rows), I(m, P));
	cg_expr *t0 = mul(m, r0, I(m, TW));
	cg_gemm gm = {.a = v, .b = u, .c = mt, .bias = -1,
	              .M = mul(m, cg_bin(m, CG_SUB, r1, r0), I(m, TW)), .N = I(m, M), .K = I(m, C),
	              .batch = I(m, 1),
	              .a_off = add(m, mul(m, t0, I(m, NXI * C)), mul(m, xi, I(m, C))), .a_bs = I(m, 0),
	              .a_rs = I(m, NXI * C), .a_cs = I(m, 1),
	              .b_off = mul(m, xi, I(m, C * M)), .b_bs = I(m, 0), .b_rs = I(m, M),
	              .b_cs = I(m, 1),
	              .c_off = add(m, mul(m, t0, I(m, NXI * M)), mul(m, xi, I(m, M))), .c_bs = I(m, 0),
	              .c_rs = I(m, NXI * M), .bias_off = I(m, 0), .alpha = 1, .beta = 0};
	cg_stmt *s = cg_gemm_stmt(m, &gm);
	if (!s)
		return KILN_ENOMEM;
	cg_append(m, body, s);
	return KILN_OK;
}

/* k4, per (image b, tile row th) over the threads, three steps on rows
 * that stay in this core's cache:
 *  - yb[b, th*4 + i, tw*4 + j, mo] = (A^T m A)[i][j], m the 36 products of
 *    tile (th, tw) and output channel mo (channels innermost: vectors);
 *  - each of the tile row's output rows (fewer in the last one when OH is
 *    not a multiple of 4) transposed from [OW, M] (rows M apart) into y's
 *    planes (CG_TRANSPOSE);
 *  - a pass over those rows of every plane adds the bias.  Its stores are
 *    the kernel's only CG_STOREs of y and final (cg_kernel.final_buf): an
 *    activation or a residual after the conv folds into them.
 * As three kernels (the transform, the transpose by output rows, the bias
 * by planes) the last two split their loops differently from the first,
 * and on two threads y's lines moved between the cores twice. */
static kiln_status output_rows(cg_module *m, const ir_node *n, const int *in, int mt, int yb,
                               int y, cg_expr *nb, cg_expr *T, int64_t M, int64_t OH, int64_t OW,
                               int64_t TH, int64_t TW)
{
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *bt, *tw, *mo, *i, *f;
	cg_stmt *bb, *tb, *mb, *ib, *fb;
	cg_append(m, k->body, cg_loop(m, k, mul(m, nb, I(m, TH)),
	                              cg_par(m, mul(m, T, I(m, NXI * M * 6))), &bt, &bb));
	cg_append(m, bb, cg_loop(m, k, I(m, TW), 0, &tw, &tb));
	cg_append(m, tb, cg_loop(m, k, I(m, M), CG_VECTORIZE, &mo, &mb));
	cg_expr *tile = add(m, mul(m, bt, I(m, TW)), tw);
	cg_expr *p[PATCH][PATCH], *s[PATCH][TILE];
	for (int a = 0; a < PATCH; a++)
		for (int b = 0; b < PATCH; b++)
			p[a][b] = cg_local(m, k, mb, KILN_F32,
			                   cg_load(m, mt, add(m, mul(m, add(m, mul(m, tile, I(m, NXI)),
			                                                    I(m, a * PATCH + b)), I(m, M)), mo)));
	for (int a = 0; a < PATCH; a++) /* s = m A */
		for (int j = 0; j < TILE; j++)
			s[a][j] = cg_local(m, k, mb, KILN_F32, combo(m, AT[j], p[a], PATCH));
	int64_t OWp = TW * TILE;
	/* row th*4 + i of image b: (bt*4 + i), as bt = b*TH + th */
	for (int r = 0; r < TILE; r++)
		for (int j = 0; j < TILE; j++) {
			cg_expr *col[PATCH];
			for (int a = 0; a < PATCH; a++)
				col[a] = s[a][j];
			cg_expr *px = add(m, mul(m, add(m, mul(m, bt, I(m, TILE)), I(m, r)), I(m, OWp)),
			                  add(m, mul(m, tw, I(m, TILE)), I(m, j)));
			cg_append(m, mb, cg_store(m, yb, add(m, mul(m, px, I(m, M)), mo),
			                          combo(m, AT[r], col, PATCH)));
		}
	cg_expr *b = cg_local(m, k, bb, KILN_I64, cg_bin(m, CG_DIV, bt, I(m, TH)));
	cg_expr *oh0 = cg_local(m, k, bb, KILN_I64, mul(m, cg_bin(m, CG_REM, bt, I(m, TH)), I(m, TILE)));
	cg_expr *nrow = cg_local(m, k, bb, KILN_I64,
	                         cg_bin(m, CG_MIN, I(m, TILE), cg_bin(m, CG_SUB, I(m, OH), oh0)));
	cg_append(m, bb, cg_loop(m, k, nrow, 0, &i, &ib));
	cg_transpose t = {
		.src = yb, .dst = y, .rows = I(m, OW), .cols = I(m, M),
		.src_off = mul(m, add(m, mul(m, bt, I(m, TILE)), i), I(m, OWp * M)), .src_rs = I(m, M),
		.dst_off = add(m, mul(m, b, I(m, M * OH * OW)), mul(m, add(m, oh0, i), I(m, OW))),
		.dst_rs = I(m, OH * OW)};
	cg_stmt *ts = cg_transpose_stmt(m, &t);
	if (!ts)
		return KILN_ENOMEM;
	cg_append(m, ib, ts);
	/* the bias pass: whole tile rows (all but a last partial one) with a
	 * constant extent, which LLVM vectorizes with no runtime remainder test */
	cg_stmt *whole = cg_block(m), *last = OH % TILE ? cg_block(m) : NULL;
	for (int w = 0; w < (last ? 2 : 1); w++) {
		cg_append(m, w ? last : whole, cg_loop(m, k, I(m, M), 0, &mo, &mb));
		cg_expr *ext = w ? mul(m, I(m, OH % TILE), I(m, OW)) : I(m, TILE * OW);
		cg_append(m, mb, cg_loop(m, k, ext, CG_VECTORIZE, &f, &fb));
		cg_expr *at = add(m, add(m, mul(m, add(m, mul(m, b, I(m, M)), mo), I(m, OH * OW)),
		                         mul(m, oh0, I(m, OW))), f);
		cg_expr *v = cg_load(m, y, at);
		if (n->nin > 2 && in[2] >= 0)
			v = add(m, v, cg_load(m, in[2], mo));
		cg_append(m, fb, cg_store(m, y, at, v));
	}
	cg_append(m, bb, last ? cg_if(m, cg_bin(m, CG_EQ, nrow, I(m, TILE)), whole, last) : whole);
	k->final_buf = y;
	return KILN_OK;
}

kiln_status cg_lower_conv_winograd(cg_module *m, const ir_node *n, const int *in, int y,
                                   const ir_conv_geom *g, bool weights_at_run, kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]);
	int64_t batch = x->dim[0], C = x->dim[1], M = cg_btype(m, y)->dim[1];
	int64_t OH = g->out[0], OW = g->out[1];
	int64_t TH = (OH + TILE - 1) / TILE, TW = (OW + TILE - 1) / TILE;
	int64_t PH = TH * TILE + 2, PW = TW * TILE + 2;
	cg_expr *nb = cg_dim(m, batch), *T = mul(m, nb, I(m, TH * TW));
	/* cg_buf_new may move m->buf: x is dead from here */
	int u = transformed_weights(m, n, in[1], C, M, weights_at_run);
	int xp = cg_lower_scratch(m, KILN_F32, mul(m, nb, I(m, PH * PW * C)));
	int v = cg_lower_scratch(m, KILN_F32, mul(m, T, I(m, NXI * C)));
	int mt = cg_lower_scratch(m, KILN_F32, mul(m, T, I(m, NXI * M)));
	int yb = cg_lower_scratch(m, KILN_F32, mul(m, nb, I(m, TH * TW * TILE * TILE * M)));
	if (u < 0 || xp < 0 || v < 0 || mt < 0 || yb < 0 ||
	    pack_input(m, n, in[0], xp, g, nb, C, PH, PW) ||
	    input_transform(m, n, xp, v, nb, T, C, TH, TW, PH, PW) ||
	    products(m, n, v, u, mt, nb, C, M, TH, TW) ||
	    output_rows(m, n, in, mt, yb, y, nb, T, M, OH, OW, TH, TW))
		return nomem(m, n, err);
	return KILN_OK;
}
