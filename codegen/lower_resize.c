/*
 * lower_resize.c: Resize as one kernel over the output.
 *
 * The taps (ir/resize.c, the interpreter's own arithmetic) depend only on
 * the shapes, so each resized axis gets constant tables built here: for
 * every output coordinate, T input indices (clamped) and T weights, T the
 * most taps any coordinate of that axis has (1 nearest, 2 linear, 4
 * cubic; unused taps weigh 0), and for tf_crop_and_resize a 0/1 table of
 * coordinates inside the input.  An axis the op leaves alone (the batch,
 * channels; symbolic dims must be such) reads its own coordinate.  The
 * kernel is a nest over the output; its body sums the combinations of the
 * resized axes' taps, unrolled at compile time; nearest reads one element
 * and no weight, so integers stay exact.
 */
#include <stdio.h>

#include "codegen/lower.h"

enum { MAX_TERMS = 256 };

typedef struct axis {
	bool ident;      /* reads its own coordinate */
	int taps;        /* T */
	int idx, w, ok;  /* constant buffers: [out * T] i64, [out * T] weights, [out] 0/1 */
} axis;

/* Builds axis d's tables; ident when every coordinate reads itself alone. */
static kiln_status axis_tables(cg_module *m, const ir_node *n, const ir_resize *r, int rank,
                               int d, int64_t in, int64_t out, kiln_dtype wt, int of, axis *a,
                               kiln_error *err)
{
	int64_t idx[4];
	double w[4];
	bool outside, ident = in == out;
	int T = 1;
	for (int64_t o = 0; o < out; o++) {
		int k = ir_resize_taps(r, d, rank, in, out, o, idx, w, &outside);
		T = k > T ? k : T;
		ident = ident && !outside && k == 1 && idx[0] == o && w[0] == 1;
	}
	a->ident = ident, a->taps = T, a->ok = -1;
	if (ident)
		return KILN_OK;
	kiln_tensor *ti = cg_lower_arena_tensor(m, KILN_I64, out * T);
	kiln_tensor *tw = cg_lower_arena_tensor(m, wt, out * T);
	kiln_tensor *tk = r->ctm == 5 ? cg_lower_arena_tensor(m, wt, out) : NULL;
	if (!ti || !tw || (r->ctm == 5 && !tk))
		return cg_lower_fail(m, n, err, KILN_ENOMEM, "out of memory");
	for (int64_t o = 0; o < out; o++) {
		int k = ir_resize_taps(r, d, rank, in, out, o, idx, w, &outside);
		for (int t = 0; t < T; t++) {
			ir_store_i64(ti, o * T + t, t < k ? idx[t] : 0);
			ir_store(tw, o * T + t, t < k ? w[t] : 0);
		}
		if (tk)
			ir_store(tk, o, !outside);
	}
	char sfx[3][32];
	snprintf(sfx[0], sizeof sfx[0], "resize%d_index", d);
	snprintf(sfx[1], sizeof sfx[1], "resize%d_weight", d);
	snprintf(sfx[2], sizeof sfx[2], "resize%d_inside", d);
	a->idx = cg_lower_const_buf(m, ti, of, sfx[0]);
	a->w = cg_lower_const_buf(m, tw, of, sfx[1]);
	a->ok = tk ? cg_lower_const_buf(m, tk, of, sfx[2]) : -1;
	if (a->idx < 0 || a->w < 0 || (tk && a->ok < 0))
		return cg_lower_fail(m, n, err, KILN_ENOMEM, "out of memory");
	return KILN_OK;
}

kiln_status cg_lower_resize(cg_module *m, const ir_node *n, const int *in, const int *out,
                            kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *y = cg_btype(m, out[0]);
	int rank = x->rank;
	ir_resize r;
	char why[256];
	if (ir_resize_parse(n, rank, &r, why, sizeof why) != KILN_OK)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "%s", why);
	kiln_dtype dt = x->dtype, ct = dt == KILN_F64 ? KILN_F64 : KILN_F32;
	axis ax[KILN_MAX_RANK];
	int64_t terms = 1;
	bool weighted = false, crop = false;
	for (int d = 0; d < rank; d++) {
		bool sym = x->dim[d] < 0 || y->dim[d] < 0; /* symbolic dims are negative */
		if (sym) { /* the shape rule let a symbol through only unresized */
			ax[d] = (axis){.ident = true, .taps = 1, .ok = -1};
			continue;
		}
		kiln_status st = axis_tables(m, n, &r, rank, d, x->dim[d], y->dim[d], ct, in[0], &ax[d],
		                             err);
		if (st != KILN_OK)
			return st;
		terms *= ax[d].taps;
		weighted = weighted || (!ax[d].ident && (ax[d].taps > 1 || r.mode != 0));
		crop = crop || ax[d].ok >= 0;
	}
	if (terms > MAX_TERMS)
		return cg_lower_fail(m, n, err, KILN_EUNSUPPORTED, "%lld taps per output element (at "
		                     "most %d)", (long long)terms, MAX_TERMS);
	if (weighted && !kiln_dtype_is_float(dt))
		return cg_lower_fail(m, n, err, KILN_EUNSUPPORTED, "weighted resizing of integers");
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *ext[KILN_MAX_RANK], *iv[KILN_MAX_RANK], *xs[KILN_MAX_RANK];
	uint32_t h[KILN_MAX_RANK] = {0};
	for (int d = 0; d < rank; d++)
		ext[d] = cg_dim(m, y->dim[d]), xs[d] = cg_prod(m, x, d + 1, rank);
	h[0] = cg_par(m, m->buf[out[0]].numel);
	cg_stmt *body = cg_nest(m, k, k->body, rank, ext, h, iv);
	cg_expr *yi = cg_int(m, 0);
	for (int d = 0; d < rank; d++)
		yi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, yi, ext[d]), iv[d]);
	/* the combinations of taps, as an odometer run at compile time */
	int tap[KILN_MAX_RANK] = {0};
	cg_expr *sum = NULL;
	for (int64_t t = 0; t < terms; t++) {
		cg_expr *xi = cg_int(m, 0), *w = NULL;
		for (int d = 0; d < rank; d++) {
			cg_expr *coord = iv[d];
			if (!ax[d].ident) {
				cg_expr *at = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[d], cg_int(m, ax[d].taps)),
				                     cg_int(m, tap[d]));
				coord = cg_load(m, ax[d].idx, at);
				if (weighted) {
					cg_expr *wd = cg_load(m, ax[d].w, at);
					w = w ? cg_bin(m, CG_MUL, w, wd) : wd;
				}
			}
			xi = cg_bin(m, CG_ADD, xi, cg_bin(m, CG_MUL, coord, xs[d]));
		}
		cg_expr *v = cg_load(m, in[0], xi);
		if (weighted) {
			v = cg_cast(m, v, ct);
			v = w ? cg_bin(m, CG_MUL, w, v) : v;
			sum = sum ? cg_bin(m, CG_ADD, sum, v) : v;
		} else {
			sum = v;
		}
		for (int d = rank - 1; d >= 0 && ++tap[d] == ax[d].taps; d--)
			tap[d] = 0;
	}
	if (crop) {
		cg_expr *ok = NULL;
		for (int d = 0; d < rank; d++)
			if (ax[d].ok >= 0) {
				cg_expr *od = cg_load(m, ax[d].ok, iv[d]);
				ok = ok ? cg_bin(m, CG_MUL, ok, od) : od;
			}
		cg_expr *c = cg_bin(m, CG_LT, cg_const(m, ct, 0.5), ok);
		sum = cg_select(m, c, weighted ? sum : cg_cast(m, sum, ct), cg_const(m, ct, r.extrap));
		weighted = true;
	}
	cg_append(m, body, cg_store(m, out[0], yi, weighted ? cg_cast(m, sum, dt) : sum));
	return KILN_OK;
}

/* ---- GridSample ------------------------------------------------------------------ */

typedef struct gsctx {
	cg_module *m;
	kiln_dtype ct;
	bool align;
	int pad;
} gsctx;

static cg_expr *gk(gsctx *g, double v) { return cg_const(g->m, g->ct, v); }
static cg_expr *gb(gsctx *g, cg_binop op, cg_expr *a, cg_expr *b) { return cg_bin(g->m, op, a, b); }

/* x reflected into [lo2 / 2, hi2 / 2], as ir/grid_sample.c's reflect. */
static cg_expr *g_reflect(gsctx *g, cg_expr *x, cg_expr *lo2, cg_expr *hi2)
{
	cg_module *m = g->m;
	cg_expr *lo = gb(g, CG_MUL, lo2, gk(g, 0.5)), *span = gb(g, CG_MUL, gb(g, CG_SUB, hi2, lo2),
	                                                        gk(g, 0.5));
	cg_expr *a = cg_un(m, CG_ABS, gb(g, CG_SUB, x, lo));
	cg_expr *safe = gb(g, CG_MAX, span, gk(g, 1e-30));
	cg_expr *flips = cg_un(m, CG_FLOOR, gb(g, CG_DIV, a, safe));
	cg_expr *extra = gb(g, CG_SUB, a, gb(g, CG_MUL, safe, flips));
	cg_expr *odd = gb(g, CG_SUB, flips, gb(g, CG_MUL, gk(g, 2),
	                                      cg_un(m, CG_FLOOR, gb(g, CG_MUL, flips, gk(g, 0.5)))));
	cg_expr *r = cg_select(m, gb(g, CG_EQ, odd, gk(g, 0)), gb(g, CG_ADD, extra, lo),
	                       gb(g, CG_ADD, gb(g, CG_SUB, span, extra), lo));
	return cg_select(m, gb(g, CG_EQ, lo2, hi2), gk(g, 0), r);
}

/* The padding's transform of a coordinate along an axis of size (float). */
static cg_expr *g_pad(gsctx *g, cg_expr *x, cg_expr *size)
{
	cg_expr *hi = gb(g, CG_SUB, size, gk(g, 1));
	if (g->pad == 0)
		return x;
	if (g->pad == 2)
		x = g->align ? g_reflect(g, x, gk(g, 0), gb(g, CG_MUL, gk(g, 2), hi))
		             : g_reflect(g, x, gk(g, -1), gb(g, CG_SUB, gb(g, CG_MUL, gk(g, 2), size),
		                                               gk(g, 1)));
	return gb(g, CG_MIN, gb(g, CG_MAX, x, gk(g, 0)), hi);
}

/* X at integral float coordinates (ix, iy): 0 outside the image. */
static cg_expr *g_tap(gsctx *g, int x, cg_expr *base, cg_expr *ix, cg_expr *iy, cg_expr *W,
                      cg_expr *H, cg_expr *Wi, cg_expr *Hi)
{
	cg_module *m = g->m;
	cg_expr *in = gb(g, CG_AND, gb(g, CG_AND, gb(g, CG_GE, ix, gk(g, 0)),
	                                gb(g, CG_LE, ix, gb(g, CG_SUB, W, gk(g, 1)))),
	                 gb(g, CG_AND, gb(g, CG_GE, iy, gk(g, 0)),
	                    gb(g, CG_LE, iy, gb(g, CG_SUB, H, gk(g, 1)))));
	cg_expr *xi = cg_clamp(m, cg_cast(m, ix, KILN_I64), Wi), *yi = cg_clamp(m, cg_cast(m, iy, KILN_I64), Hi);
	cg_expr *v = cg_cast(m, cg_load(m, x, cg_bin(m, CG_ADD, base, cg_bin(m, CG_ADD,
	                     cg_bin(m, CG_MUL, yi, Wi), xi))), g->ct);
	return cg_select(m, in, v, gk(g, 0));
}

static void g_cubic(gsctx *g, cg_expr *t, cg_expr **w)
{
	const double A = -0.75;
	cg_expr *u = gb(g, CG_SUB, gk(g, 1), t), *t1 = gb(g, CG_ADD, t, gk(g, 1)),
	        *u1 = gb(g, CG_ADD, u, gk(g, 1));
	cg_expr *far[2] = {t1, u1}, *near[2] = {t, u};
	for (int k = 0; k < 2; k++) { /* ((A s - 5A) s + 8A) s - 4A, ((A+2) s - (A+3)) s s + 1 */
		cg_expr *s = far[k];
		w[k ? 3 : 0] = gb(g, CG_SUB, gb(g, CG_MUL, gb(g, CG_ADD, gb(g, CG_MUL, gb(g, CG_SUB,
		               gb(g, CG_MUL, gk(g, A), s), gk(g, 5 * A)), s), gk(g, 8 * A)), s), gk(g, 4 * A));
		s = near[k];
		w[k ? 2 : 1] = gb(g, CG_ADD, gb(g, CG_MUL, gb(g, CG_MUL, gb(g, CG_SUB,
		               gb(g, CG_MUL, gk(g, A + 2), s), gk(g, A + 3)), s), s), gk(g, 1));
	}
}

kiln_status cg_lower_grid_sample(cg_module *m, const ir_node *n, const int *in, const int *out,
                                 kiln_error *err)
{
	const ir_type *x = cg_btype(m, in[0]), *y = cg_btype(m, out[0]);
	int pad, mode = ir_grid_sample_mode(n, &pad);
	if (mode < 0 || pad < 0 || x->rank != 4)
		return cg_lower_fail(m, n, err, KILN_EINVAL, "bad mode, padding or rank");
	gsctx g = {m, x->dtype == KILN_F64 ? KILN_F64 : KILN_F32,
	           ir_attr_int(n, "align_corners", 0) != 0, pad};
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return KILN_ENOMEM;
	cg_expr *Hi = cg_dim(m, x->dim[2]), *Wi = cg_dim(m, x->dim[3]);
	cg_expr *H = cg_cast(m, Hi, g.ct), *W = cg_cast(m, Wi, g.ct);
	cg_expr *ext[3] = {cg_dim(m, y->dim[0]), cg_dim(m, y->dim[1]),
	                   cg_bin(m, CG_MUL, cg_dim(m, y->dim[2]), cg_dim(m, y->dim[3]))}, *iv[3];
	uint32_t h[3] = {cg_par(m, m->buf[out[0]].numel), 0, 0};
	cg_stmt *body = cg_nest(m, k, k->body, 3, ext, h, iv);
	cg_expr *gi = cg_bin(m, CG_MUL, cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[0], ext[2]), iv[2]),
	                     cg_int(m, 2));
	cg_expr *gx = cg_cast(m, cg_load(m, in[1], gi), g.ct);
	cg_expr *gy = cg_cast(m, cg_load(m, in[1], cg_bin(m, CG_ADD, gi, cg_int(m, 1))), g.ct);
	cg_expr *base = cg_bin(m, CG_MUL, cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[0], ext[1]), iv[1]),
	                       cg_bin(m, CG_MUL, Hi, Wi));
	/* unnormalize: align ? (g + 1) / 2 (size - 1) : ((g + 1) size - 1) / 2 */
	cg_expr *px = g.align ? gb(&g, CG_MUL, gb(&g, CG_MUL, gb(&g, CG_ADD, gx, gk(&g, 1)), gk(&g, 0.5)),
	                           gb(&g, CG_SUB, W, gk(&g, 1)))
	                      : gb(&g, CG_MUL, gb(&g, CG_SUB, gb(&g, CG_MUL, gb(&g, CG_ADD, gx, gk(&g, 1)),
	                           W), gk(&g, 1)), gk(&g, 0.5));
	cg_expr *py = g.align ? gb(&g, CG_MUL, gb(&g, CG_MUL, gb(&g, CG_ADD, gy, gk(&g, 1)), gk(&g, 0.5)),
	                           gb(&g, CG_SUB, H, gk(&g, 1)))
	                      : gb(&g, CG_MUL, gb(&g, CG_SUB, gb(&g, CG_MUL, gb(&g, CG_ADD, gy, gk(&g, 1)),
	                           H), gk(&g, 1)), gk(&g, 0.5));
	px = cg_local(m, k, body, g.ct, px), py = cg_local(m, k, body, g.ct, py);
	cg_expr *v;
	if (mode == 2) {
		cg_expr *fx = cg_local(m, k, body, g.ct, cg_un(m, CG_FLOOR, px));
		cg_expr *fy = cg_local(m, k, body, g.ct, cg_un(m, CG_FLOOR, py));
		cg_expr *wx[4], *wy[4];
		g_cubic(&g, gb(&g, CG_SUB, px, fx), wx), g_cubic(&g, gb(&g, CG_SUB, py, fy), wy);
		v = NULL;
		for (int j = 0; j < 4; j++)
			for (int i = 0; i < 4; i++) {
				cg_expr *tx = g_pad(&g, gb(&g, CG_ADD, fx, gk(&g, i - 1)), W);
				cg_expr *ty = g_pad(&g, gb(&g, CG_ADD, fy, gk(&g, j - 1)), H);
				if (pad) /* truncated, as torch casts the padded coordinate */
					tx = cg_un(m, CG_FLOOR, tx), ty = cg_un(m, CG_FLOOR, ty);
				cg_expr *t = gb(&g, CG_MUL, gb(&g, CG_MUL, wx[i], wy[j]),
				                g_tap(&g, in[0], base, tx, ty, W, H, Wi, Hi));
				v = v ? gb(&g, CG_ADD, v, t) : t;
			}
	} else {
		px = cg_local(m, k, body, g.ct, g_pad(&g, px, W));
		py = cg_local(m, k, body, g.ct, g_pad(&g, py, H));
		if (mode == 1) {
			v = g_tap(&g, in[0], base, cg_un(m, CG_ROUND, px), cg_un(m, CG_ROUND, py), W, H,
			          Wi, Hi);
		} else {
			cg_expr *fx = cg_local(m, k, body, g.ct, cg_un(m, CG_FLOOR, px));
			cg_expr *fy = cg_local(m, k, body, g.ct, cg_un(m, CG_FLOOR, py));
			cg_expr *tx = gb(&g, CG_SUB, px, fx), *ty = gb(&g, CG_SUB, py, fy);
			cg_expr *ux = gb(&g, CG_SUB, gk(&g, 1), tx), *uy = gb(&g, CG_SUB, gk(&g, 1), ty);
			cg_expr *x1 = gb(&g, CG_ADD, fx, gk(&g, 1)), *y1 = gb(&g, CG_ADD, fy, gk(&g, 1));
			v = gb(&g, CG_ADD,
			       gb(&g, CG_ADD, gb(&g, CG_MUL, gb(&g, CG_MUL, ux, uy), g_tap(&g, in[0], base, fx, fy, W, H, Wi, Hi)),
			          gb(&g, CG_MUL, gb(&g, CG_MUL, tx, uy), g_tap(&g, in[0], base, x1, fy, W, H, Wi, Hi))),
			       gb(&g, CG_ADD, gb(&g, CG_MUL, gb(&g, CG_MUL, ux, ty), g_tap(&g, in[0], base, fx, y1, W, H, Wi, Hi)),
			          gb(&g, CG_MUL, gb(&g, CG_MUL, tx, ty), g_tap(&g, in[0], base, x1, y1, W, H, Wi, Hi))));
		}
	}
	cg_expr *yi = cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, cg_bin(m, CG_ADD, cg_bin(m, CG_MUL, iv[0],
	                     ext[1]), iv[1]), ext[2]), iv[2]);
	cg_append(m, body, cg_store(m, out[0], yi, cg_cast(m, v, x->dtype)));
	return KILN_OK;
}
