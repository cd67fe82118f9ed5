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
