/*
 * grid_sample.c: GridSample (opset 16) on 4-D inputs, as torch's
 * grid_sampler_2d computes it (what ONNX's reference follows): the shape
 * rule and the interpreter's kernel; codegen/lower_resize.c lowers it with
 * the same formulas.
 *
 * A grid point (x, y) in [-1, 1] maps to pixel coordinates (align_corners:
 * -1 and 1 are the corner pixels' centres, else their outer edges); for
 * nearest and bilinear, border padding clips the point into the image and
 * reflection reflects it about the borders first; then nearest reads the
 * pixel at the point rounded half to even, bilinear the four around it,
 * bicubic (A = -0.75) the sixteen, each through the padding (zeros: 0
 * outside).
 */
#include <math.h>
#include <string.h>

#include "ir/interp.h"
#include "ir/shape.h"

static const char *const gs_modes[] = {"bilinear", "nearest", "bicubic"};
static const char *const gs_pads[] = {"zeros", "border", "reflection"};

static int gs_pick(const char *s, const char *const *names)
{
	for (int i = 0; i < 3; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -1;
}

int ir_grid_sample_mode(const ir_node *n, int *pad)
{
	*pad = gs_pick(ir_attr_str(n, "padding_mode", "zeros"), gs_pads);
	return gs_pick(ir_attr_str(n, "mode", "bilinear"), gs_modes);
}

double ir_grid_unnormalize(double g, int64_t size, bool align)
{
	return align ? (g + 1) / 2 * (double)(size - 1) : ((g + 1) * (double)size - 1) / 2;
}

/* x reflected into [lo2 / 2, hi2 / 2] (torch's reflect_coordinates). */
static double reflect(double x, double lo2, double hi2)
{
	if (lo2 == hi2)
		return 0;
	double lo = lo2 / 2, span = (hi2 - lo2) / 2;
	x = fabs(x - lo);
	double extra = fmod(x, span), flips = floor(x / span);
	return fmod(flips, 2) == 0 ? extra + lo : span - extra + lo;
}

double ir_grid_pad_coord(double x, int64_t size, int pad, bool align)
{
	if (pad == 1)
		return fmin(fmax(x, 0), (double)(size - 1));
	if (pad == 2) {
		x = align ? reflect(x, 0, 2.0 * (double)(size - 1)) : reflect(x, -1, 2.0 * (double)size - 1);
		return fmin(fmax(x, 0), (double)(size - 1));
	}
	return x;
}

kiln_status ir_shape_grid_sample(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	const ir_type *x = &in[0], *gr = &in[1];
	tbuf a, b;
	int pad, mode = ir_grid_sample_mode(n, &pad);
	if (mode < 0 || pad < 0)
		FAIL(KILN_EINVAL, "mode \"%s\" or padding_mode \"%s\" is not one ONNX defines",
		     ir_attr_str(n, "mode", ""), ir_attr_str(n, "padding_mode", ""));
	if (x->rank != 4 || gr->rank != 4 || gr->dim[3] != 2 || !kiln_dtype_is_float(x->dtype) ||
	    gr->dtype != x->dtype)
		FAIL(KILN_ESHAPE, "X %s and grid %s must be [N, C, H, W] and [N, H_out, W_out, 2] of one "
		     "float type", TS(x, a), TS(gr, b));
	if (x->dim[0] != gr->dim[0] && x->dim[0] >= 0 && gr->dim[0] >= 0)
		FAIL(KILN_ESHAPE, "X %s and grid %s differ in the batch", TS(x, a), TS(gr, b));
	out[0] = (ir_type){x->dtype, 4, {x->dim[0], x->dim[1], gr->dim[1], gr->dim[2]}};
	return KILN_OK;
}

/* X[n, c] at integer (ix, iy) through the padding (bicubic's taps). */
static double tap(const kiln_tensor *x, int64_t base, int64_t ix, int64_t iy, int pad, bool align)
{
	int64_t H = x->shape[2], W = x->shape[3];
	if (pad) {
		ix = (int64_t)ir_grid_pad_coord((double)ix, W, pad, align);
		iy = (int64_t)ir_grid_pad_coord((double)iy, H, pad, align);
	}
	return ix < 0 || ix >= W || iy < 0 || iy >= H ? 0 : ir_load(x, base + iy * W + ix);
}

static void cubic(double t, double *w)
{
	const double A = -0.75;
	double u = 1 - t;
	w[0] = ((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A;
	w[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
	w[2] = ((A + 2) * u - (A + 3)) * u * u + 1;
	w[3] = ((A * (u + 1) - 5 * A) * (u + 1) + 8 * A) * (u + 1) - 4 * A;
}

double ir_grid_sample_at(const kiln_tensor *x, int64_t base, double gx, double gy, int mode, int pad,
                         bool align)
{
	int64_t H = x->shape[2], W = x->shape[3];
	double px = ir_grid_unnormalize(gx, W, align), py = ir_grid_unnormalize(gy, H, align);
	if (mode == 2) {
		double fx = floor(px), fy = floor(py), wx[4], wy[4], v = 0;
		cubic(px - fx, wx), cubic(py - fy, wy);
		for (int j = 0; j < 4; j++)
			for (int i = 0; i < 4; i++)
				v += wx[i] * wy[j] * tap(x, base, (int64_t)fx - 1 + i, (int64_t)fy - 1 + j, pad, align);
		return v;
	}
	px = ir_grid_pad_coord(px, W, pad, align), py = ir_grid_pad_coord(py, H, pad, align);
	if (mode == 1)
		return tap(x, base, (int64_t)nearbyint(px), (int64_t)nearbyint(py), 0, align);
	double fx = floor(px), fy = floor(py), tx = px - fx, ty = py - fy;
	int64_t x0 = (int64_t)fx, y0 = (int64_t)fy;
	return (1 - tx) * (1 - ty) * tap(x, base, x0, y0, 0, align) +
	       tx * (1 - ty) * tap(x, base, x0 + 1, y0, 0, align) +
	       (1 - tx) * ty * tap(x, base, x0, y0 + 1, 0, align) +
	       tx * ty * tap(x, base, x0 + 1, y0 + 1, 0, align);
}

kiln_status ir_interp_grid_sample(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                  kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0], *gr = in[1];
	kiln_tensor *y = out[0];
	int pad, mode = ir_grid_sample_mode(n, &pad);
	bool align = ir_attr_int(n, "align_corners", 0) != 0;
	if (mode < 0 || pad < 0 || x->rank != 4 || gr->rank != 4 || y->rank != 4)
		return ir_fail(c, n, KILN_EINVAL, "bad mode, padding or ranks");
	int64_t N = y->shape[0], C = y->shape[1], Ho = y->shape[2], Wo = y->shape[3];
	for (int64_t b = 0; b < N; b++)
		for (int64_t ch = 0; ch < C; ch++)
			for (int64_t i = 0; i < Ho * Wo; i++) {
				int64_t gi = (b * Ho * Wo + i) * 2;
				double v = ir_grid_sample_at(x, (b * C + ch) * x->shape[2] * x->shape[3],
				                             ir_load(gr, gi), ir_load(gr, gi + 1), mode, pad,
				                             align);
				ir_store(y, (b * C + ch) * Ho * Wo + i, v);
			}
	return KILN_OK;
}
