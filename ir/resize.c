/*
 * resize.c: Resize (and Upsample, imported as it), the one place its
 * arithmetic is written: ONNX's reference (onnx/backend/test/case/node/
 * resize.py) as per-axis taps.
 *
 * Each output coordinate o along an axis maps to an input coordinate x by
 * the coordinate transformation mode; the result reads 1 (nearest, or x an
 * integer), 2 (linear) or 4 (cubic) input points along that axis, indices
 * clamped to the axis (ONNX pads with the edge), with weights that
 * exclude_outside renormalises over the points inside; the N-d result is
 * the sum over every combination of the axes' taps of the product of their
 * weights.  tf_crop_and_resize gives extrapolation_value where x leaves the
 * axis.  The interpreter (below) evaluates that sum; the lowering
 * (codegen/lower_resize.c) bakes each resized axis's taps into constant
 * tables and unrolls the combinations.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp.h"
#include "ir/shape.h"

static const char *const modes[] = {"nearest", "linear", "cubic"};
static const char *const ctms[] = {"half_pixel", "pytorch_half_pixel", "align_corners",
                                   "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
static const char *const nearests[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                       "ceil"};

static int pick(const char *s, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -1;
}

kiln_status ir_resize_parse(const ir_node *n, int rank, ir_resize *r, char *why, size_t size)
{
	memset(r, 0, sizeof *r);
	const char *m = ir_attr_str(n, "mode", "nearest");
	const char *c = ir_attr_str(n, "coordinate_transformation_mode", "half_pixel");
	const char *nm = ir_attr_str(n, "nearest_mode", "round_prefer_floor");
	r->mode = pick(m, modes, 3), r->ctm = pick(c, ctms, 6), r->nearest = pick(nm, nearests, 4);
	r->a = ir_attr_float(n, "cubic_coeff_a", -0.75);
	r->exclude = ir_attr_int(n, "exclude_outside", 0) != 0;
	r->extrap = ir_attr_float(n, "extrapolation_value", 0);
	const ir_attr *sc = ir_attr_get(n, "scales"), *ro = ir_attr_get(n, "roi");
	r->nsizes = ir_attr_ints(n, "sizes", &r->sizes);
	r->scales = sc && sc->kind == IR_A_FLOATS ? sc->u.floats : NULL;
	r->nscales = r->scales ? sc->n : 0;
	r->roi = ro && ro->kind == IR_A_FLOATS ? ro->u.floats : NULL;
	r->nroi = r->roi ? ro->n : 0;
	if (r->mode < 0 || r->ctm < 0 || r->nearest < 0)
		snprintf(why, size, "mode \"%s\", coordinate_transformation_mode \"%s\" or "
		         "nearest_mode \"%s\" is not one ONNX defines", m, c, nm);
	else if ((r->nsizes > 0) == (r->nscales > 0))
		snprintf(why, size, "needs exactly one of scales and sizes (%u scales, %u sizes)",
		         r->nscales, r->nsizes);
	else if ((r->nsizes && r->nsizes != (uint32_t)rank) ||
	         (r->nscales && r->nscales != (uint32_t)rank))
		snprintf(why, size, "has %u %s for an input of rank %d", r->nsizes + r->nscales,
		         r->nsizes ? "sizes" : "scales", rank);
	else if (r->ctm == 5 && r->nroi != 2 * (uint32_t)rank)
		snprintf(why, size, "tf_crop_and_resize needs roi of 2 x %d values, not %u", rank,
		         r->nroi);
	else
		return KILN_OK;
	return KILN_EINVAL;
}

double ir_resize_scale(const ir_resize *r, int d, int64_t in, int64_t out)
{
	return r->nscales ? r->scales[d] : (double)out / (double)in;
}

int64_t ir_resize_out(const ir_resize *r, int d, int rank, int64_t in)
{
	if (r->nsizes)
		return r->sizes[d];
	double len = r->ctm == 5 ? (r->roi[rank + d] - r->roi[d]) * (double)in : (double)in;
	double v = floor(len * r->scales[d]);
	return v >= 0 && v < 1e15 ? (int64_t)v : -1;
}

/* The input coordinate of output coordinate o. */
static double source(const ir_resize *r, int d, int rank, int64_t in, int64_t out, int64_t o)
{
	/* the resized length is in * scale unrounded, as ONNX's reference has
	 * it (out itself when sizes are given) */
	double s = ir_resize_scale(r, d, in, out), x = (double)o, len = (double)in * s;
	switch (r->ctm) {
	case 0: return (x + 0.5) / s - 0.5;
	case 1: return len > 1 ? (x + 0.5) / s - 0.5 : 0;
	case 2: return len == 1 ? 0 : x * (double)(in - 1) / (len - 1);
	case 3: return x / s;
	case 4: return (x + 0.5) / s;
	default: {
		double a = r->roi[d], b = r->roi[rank + d];
		return len > 1 ? a * (double)(in - 1) + x * (b - a) * (double)(in - 1) / (len - 1)
		               : 0.5 * (a + b) * (double)(in - 1);
	}
	}
}

int ir_resize_taps(const ir_resize *r, int d, int rank, int64_t in, int64_t out, int64_t o,
                   int64_t *idx, double *w, bool *outside)
{
	double x = source(r, d, rank, in, out, o), f = floor(x), t = x - f;
	int64_t base = (int64_t)f;
	*outside = r->ctm == 5 && (x < 0 || x > (double)(in - 1));
	int n = 0;
	if (*outside)
		return 0;
	if (t == 0) { /* on an input point: every mode reads it alone */
		idx[0] = base, w[0] = 1, n = 1;
	} else if (r->mode == 0) {
		bool up = r->nearest == 0 ? t > 0.5 : r->nearest == 1 ? t >= 0.5 : r->nearest == 3;
		idx[0] = base + up, w[0] = 1, n = 1;
	} else if (r->mode == 1) {
		idx[0] = base, idx[1] = base + 1, w[0] = 1 - t, w[1] = t, n = 2;
	} else {
		double A = r->a, u = 1 - t;
		w[0] = ((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A;
		w[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
		w[2] = ((A + 2) * u - (A + 3)) * u * u + 1;
		w[3] = ((A * (u + 1) - 5 * A) * (u + 1) + 8 * A) * (u + 1) - 4 * A;
		for (int k = 0; k < 4; k++)
			idx[k] = base - 1 + k;
		n = 4;
	}
	if (r->exclude && n > 1) {
		double sum = 0;
		for (int k = 0; k < n; k++)
			sum += w[k] = idx[k] < 0 || idx[k] >= in ? 0 : w[k];
		for (int k = 0; k < n && sum != 0; k++)
			w[k] /= sum;
	}
	for (int k = 0; k < n; k++)
		idx[k] = idx[k] < 0 ? 0 : idx[k] >= in ? in - 1 : idx[k];
	return n;
}

/* ---- shape rule ---------------------------------------------------------------- */

kiln_status ir_shape_resize(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const ir_type *x = &in[0];
	ir_resize r;
	char why[256];
	tbuf a;
	if (ir_resize_parse(n, x->rank, &r, why, sizeof why) != KILN_OK)
		FAIL(KILN_EINVAL, "%s", why);
	if (r.mode != 0 && !kiln_dtype_is_float(x->dtype))
		FAIL(KILN_ESHAPE, "%s resizing of %s: only nearest takes integers", modes[r.mode],
		     TS(x, a));
	ir_type t = *x;
	for (int d = 0; d < x->rank; d++) {
		bool same = r.nsizes ? r.sizes[d] == x->dim[d] : r.scales[d] == 1 && r.ctm != 5;
		if (ir_dim_expr(g, x->dim[d]) || x->dim[d] < 0) {
			if (!same)
				FAIL(KILN_EUNSUPPORTED, "resizing symbolic dim %d of %s (only a scale of 1 "
				     "keeps a symbol)", d, TS(x, a));
			continue;
		}
		int64_t o = ir_resize_out(&r, d, x->rank, x->dim[d]);
		if (o < 0 || o > IR_DIM_MAX || (x->dim[d] == 0 && o > 0))
			FAIL(KILN_ESHAPE, "dim %d of %s resizes to %lld", d, TS(x, a), (long long)o);
		t.dim[d] = o;
	}
	out[0] = t;
	return KILN_OK;
}

/* ---- interpreter --------------------------------------------------------------- */

kiln_status ir_interp_resize(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                             kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	kiln_tensor *y = out[0];
	int rank = x->rank;
	ir_resize r;
	char why[256];
	if (ir_resize_parse(n, rank, &r, why, sizeof why) != KILN_OK)
		return ir_fail(c, n, KILN_EINVAL, "%s", why);
	if (y->rank != rank || y->dtype != x->dtype)
		return ir_fail(c, n, KILN_ESHAPE, "output does not match the input");
	/* per axis and output coordinate: up to 4 taps */
	int64_t *idx[KILN_MAX_RANK] = {0};
	double *w[KILN_MAX_RANK] = {0};
	int *nt[KILN_MAX_RANK] = {0};
	kiln_status st = KILN_OK;
	for (int d = 0; d < rank && st == KILN_OK; d++) {
		int64_t o = y->shape[d];
		idx[d] = malloc((size_t)(o + 1) * 4 * sizeof **idx);
		w[d] = malloc((size_t)(o + 1) * 4 * sizeof **w);
		nt[d] = malloc((size_t)(o + 1) * sizeof **nt);
		if (!idx[d] || !w[d] || !nt[d]) {
			st = ir_fail(c, n, KILN_ENOMEM, "out of memory");
			break;
		}
		for (int64_t k = 0; k < o; k++) {
			bool outside;
			nt[d][k] = ir_resize_taps(&r, d, rank, x->shape[d], o, k, idx[d] + 4 * k,
			                          w[d] + 4 * k, &outside);
		}
	}
	int64_t coord[KILN_MAX_RANK], tap[KILN_MAX_RANK];
	for (int64_t i = 0, cnt = kiln_tensor_numel(y); st == KILN_OK && i < cnt; i++) {
		ir_unravel(i, rank, y->shape, coord);
		bool out_of = false;
		for (int d = 0; d < rank; d++)
			out_of = out_of || nt[d][coord[d]] == 0, tap[d] = 0;
		double v = 0;
		while (!out_of) { /* odometer over the axes' taps */
			double wt = 1;
			int64_t xi = 0;
			for (int d = 0; d < rank; d++) {
				int64_t k = 4 * coord[d] + tap[d];
				wt *= w[d][k];
				xi = xi * x->shape[d] + idx[d][k];
			}
			v += wt * ir_load(x, xi);
			int d = rank - 1;
			while (d >= 0 && ++tap[d] == nt[d][coord[d]])
				tap[d--] = 0;
			if (d < 0)
				break;
		}
		if (!out_of && !kiln_dtype_is_float(x->dtype)) { /* nearest: one tap, exact */
			int64_t xi = 0;
			for (int d = 0; d < rank; d++)
				xi = xi * x->shape[d] + idx[d][4 * coord[d]];
			ir_store_i64(y, i, ir_load_i64(x, xi));
		} else {
			ir_store(y, i, out_of ? r.extrap : v);
		}
	}
	for (int d = 0; d < rank; d++)
		free(idx[d]), free(w[d]), free(nt[d]);
	return st;
}
