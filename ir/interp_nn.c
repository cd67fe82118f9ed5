/*
 * interp_nn.c: the reference interpreter's neural-network kernels:
 * convolution and its transpose, max/average/global pooling, batch and
 * layer normalisation, softmax and log-softmax, dropout, and the NLL and
 * softmax cross-entropy losses.
 *
 * They are separate from interp.c because they are the bulk of the
 * arithmetic and share a vocabulary of their own (the spatial geometry of
 * a window, per-channel statistics, log-probabilities) that the element-wise
 * and movement kernels never need.  The same rules hold as in interp.c:
 * compute in double through ir_load/ir_store, round once to the output
 * dtype, and check every index against the tensors before reading.  The
 * kernels are registered in ir_interp_table in interp.c through the
 * declarations in ir/interp.h.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/interp.h"

/* ---- convolution and pooling -------------------------------------------- */

/* Spatial geometry of a conv or pool: the rule shared with the lowering. */
typedef ir_conv_geom geom;

/* Fills g from x, y, the kernel shape k and the attributes (ir_conv_geom_of). */
static kiln_status geometry(ir_interp *c, const ir_node *n, const kiln_tensor *x,
                            const kiln_tensor *y, const int64_t *k, bool transpose, geom *g)
{
	switch (ir_conv_geom_of(n, x->rank, x->shape, y->rank, y->shape, k, transpose, g)) {
	case IR_GEOM_OK:
		return KILN_OK;
	case IR_GEOM_RANK:
		return ir_fail(c, n, KILN_EUNSUPPORTED, "%d spatial dims (1 to 3 supported)", g->nsp);
	case IR_GEOM_ATTR:
		return ir_fail(c, n, KILN_EINVAL, "strides, dilations, pads or output_padding has the wrong length");
	default:
		return ir_fail(c, n, KILN_EINVAL, "strides, dilations and kernel must be positive");
	}
}

/* Input position of output position oc and kernel tap kc, as a linear
 * spatial index, or -1 when it falls in the padding. */
static int64_t tap(const geom *g, const int64_t *oc, const int64_t *kc)
{
	int64_t off = 0;
	for (int d = 0; d < g->nsp; d++) {
		int64_t j = oc[d] * g->stride[d] + kc[d] * g->dil[d] - g->pad[d];
		if (j < 0 || j >= g->in[d])
			return -1;
		off = off * g->in[d] + j;
	}
	return off;
}

/* Checks batch and channels of x [N, C, ...], weights w ([M, C/group, k...],
 * or [C, M/group, k...] transposed), bias b [M] and y [N, M, ...]. */
static kiln_status conv_channels(ir_interp *c, const ir_node *n, const kiln_tensor *x,
                                 const kiln_tensor *w, const kiln_tensor *b,
                                 const kiln_tensor *y, bool transpose)
{
	int64_t grp = ir_attr_int(n, "group", 1), C = x->shape[1], M = y->shape[1];
	int64_t wc = transpose ? w->shape[0] : w->shape[1] * grp;
	int64_t wm = transpose ? w->shape[1] * grp : w->shape[0];
	if (grp < 1 || C % grp || M % grp || wc != C || wm != M || w->rank != x->rank ||
	    y->shape[0] != x->shape[0] || (b && kiln_tensor_numel(b) != M)) {
		char a[96], b[96];
		return ir_fail(c, n, KILN_ESHAPE, "weights %s do not fit input %s with group %lld",
		               ir_tstr(w, a, sizeof a), ir_tstr(x, b, sizeof b), (long long)grp);
	}
	return KILN_OK;
}

kiln_status ir_interp_conv(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                           kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0], *w = in[1], *b = n->nin > 2 ? in[2] : NULL;
	kiln_tensor *y = out[0];
	geom g;
	kiln_status rc = conv_channels(c, n, x, w, b, y, false);
	if (!rc)
		rc = geometry(c, n, x, y, w->shape + 2, false, &g);
	if (rc)
		return rc;
	int64_t grp = ir_attr_int(n, "group", 1), C = x->shape[1], M = y->shape[1];
	int64_t Cg = C / grp, Mg = M / grp, oc[3], kc[3];
	for (int64_t i = 0, cnt = kiln_tensor_numel(y); i < cnt; i++) {
		int64_t o = i % g.osz, m = i / g.osz % M, b0 = i / g.osz / M;
		ir_unravel(o, g.nsp, g.out, oc);
		double acc = b ? ir_load(b, m) : 0;
		for (int64_t cg = 0; cg < Cg; cg++) {
			int64_t xc = (b0 * C + m / Mg * Cg + cg) * g.isz, wc = (m * Cg + cg) * g.ksz;
			for (int64_t kk = 0; kk < g.ksz; kk++) {
				ir_unravel(kk, g.nsp, g.k, kc);
				int64_t at = tap(&g, oc, kc);
				if (at >= 0)
					acc += ir_load(x, xc + at) * ir_load(w, wc + kk);
			}
		}
		ir_store(y, i, acc);
	}
	return KILN_OK;
}

/* ConvTranspose scatters: input position i and tap k feed output position
 * i * stride + k * dil - pad.  Sums gather in double, then round once. */
kiln_status ir_interp_conv_transpose(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                     kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0], *w = in[1], *b = n->nin > 2 ? in[2] : NULL;
	kiln_tensor *y = out[0];
	geom g;
	kiln_status rc = conv_channels(c, n, x, w, b, y, true);
	if (!rc)
		rc = geometry(c, n, x, y, w->shape + 2, true, &g);
	if (rc)
		return rc;
	int64_t grp = ir_attr_int(n, "group", 1), C = x->shape[1], M = y->shape[1];
	int64_t Cg = C / grp, Mg = M / grp, ic[3], kc[3], cnt = kiln_tensor_numel(y);
	double *acc = calloc(cnt + 1, sizeof *acc);
	if (!acc)
		return ir_fail(c, n, KILN_ENOMEM, "out of memory");
	for (int64_t i = 0, nx = kiln_tensor_numel(x); i < nx; i++) {
		int64_t s = i % g.isz, ch = i / g.isz % C, b0 = i / g.isz / C;
		ir_unravel(s, g.nsp, g.in, ic);
		double v = ir_load(x, i);
		for (int64_t mg = 0; mg < Mg; mg++) {
			int64_t m = ch / Cg * Mg + mg, wc = (ch * Mg + mg) * g.ksz;
			for (int64_t kk = 0; kk < g.ksz; kk++) {
				ir_unravel(kk, g.nsp, g.k, kc);
				int64_t at = 0;
				for (int d = 0; d < g.nsp && at >= 0; d++) {
					int64_t j = ic[d] * g.stride[d] + kc[d] * g.dil[d] - g.pad[d];
					at = j < 0 || j >= g.out[d] ? -1 : at * g.out[d] + j;
				}
				if (at >= 0)
					acc[(b0 * M + m) * g.osz + at] += v * ir_load(w, wc + kk);
			}
		}
	}
	for (int64_t i = 0; i < cnt; i++)
		ir_store(y, i, acc[i] + (b ? ir_load(b, i / g.osz % M) : 0));
	free(acc);
	return KILN_OK;
}

/* MaxPool and AveragePool: padding never wins a max; AveragePool divides by
 * the taps inside the input, or with count_include_pad by those inside the
 * padded input [-pad, in + pad_end) (PyTorch's rule, also under ceil_mode). */
kiln_status ir_interp_pool(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                           kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	kiln_tensor *y = out[0];
	const int64_t *ks;
	geom g;
	uint32_t nk = ir_attr_ints(n, "kernel_shape", &ks);
	if (nk != (uint32_t)x->rank - 2 || x->rank < 3)
		return ir_fail(c, n, KILN_EINVAL, "kernel_shape has %u entries for %d spatial dims", nk,
		               x->rank - 2);
	kiln_status rc = geometry(c, n, x, y, ks, false, &g);
	if (rc)
		return rc;
	if (y->shape[0] != x->shape[0] || y->shape[1] != x->shape[1])
		return ir_fail(c, n, KILN_ESHAPE, "batch or channels change");
	bool is_max = n->op == KILN_OP_MAX_POOL, incl = ir_attr_int(n, "count_include_pad", 0);
	bool colmajor = ir_attr_int(n, "storage_order", 0) == 1;
	kiln_tensor *ind = is_max && n->nout == 2 ? out[1] : NULL;
	int64_t oc[3], kc[3];
	for (int64_t i = 0, cnt = kiln_tensor_numel(y); i < cnt; i++) {
		int64_t o = i % g.osz, xc = i / g.osz * g.isz;
		ir_unravel(o, g.nsp, g.out, oc);
		double acc = is_max ? -INFINITY : 0, best = -INFINITY;
		int64_t taps = 0, at_best = -1, at_first = -1;
		for (int64_t kk = 0; kk < g.ksz; kk++) {
			ir_unravel(kk, g.nsp, g.k, kc);
			int64_t at = tap(&g, oc, kc);
			/* Indices: the first tap holding the max (strictly greater
			 * replaces it, as ONNX Runtime's loop does; a window of -inf
			 * or NaN only: its first tap inside x) */
			if (ind && at >= 0) {
				double v = ir_load(x, xc + at);
				at_first = at_first < 0 ? at : at_first;
				if (v > best)
					best = v, at_best = at;
			}
			bool padded = true;
			for (int d = 0; d < g.nsp; d++) {
				int64_t j = oc[d] * g.stride[d] + kc[d] * g.dil[d];
				padded = padded && j < g.in[d] + g.pad[d] + g.pad_end[d];
			}
			taps += at >= 0 || (incl && padded);
			if (at >= 0)
				acc = is_max ? ir_maxd(acc, ir_load(x, xc + at)) : acc + ir_load(x, xc + at);
		}
		ir_store(y, i, is_max ? acc : acc / taps);
		if (ind) {
			int64_t at = at_best >= 0 ? at_best : at_first, pos = at;
			if (colmajor && at >= 0) { /* the plane's coordinates, first fastest */
				int64_t jc[3], stride = 1;
				ir_unravel(at, g.nsp, g.in, jc);
				pos = 0;
				for (int d = 0; d < g.nsp; d++)
					pos += jc[d] * stride, stride *= g.in[d];
			}
			((int64_t *)ind->data)[i] = xc + pos;
		}
	}
	return KILN_OK;
}

kiln_status ir_interp_global_avg_pool(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                      kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	int64_t nc = ir_prod(x->shape, 0, x->rank < 2 ? x->rank : 2), sp = kiln_tensor_numel(x) / (nc ? nc : 1);
	if (x->rank < 2 || kiln_tensor_numel(out[0]) != nc)
		return ir_fail(c, n, KILN_ESHAPE, "needs [N, C, ...] input and [N, C, 1...] output");
	for (int64_t i = 0; i < nc; i++) {
		double acc = 0;
		for (int64_t s = 0; s < sp; s++)
			acc += ir_load(x, i * sp + s);
		ir_store(out[0], i, acc / sp);
	}
	return KILN_OK;
}

/* ---- normalisation ------------------------------------------------------ */

/* Per-channel statistics of x [N, C, ...] over every axis but 1 (the
 * population variance, as ONNX's training-mode BatchNormalization uses). */
static void channel_stats(const kiln_tensor *x, int64_t ch, double *mean, double *var)
{
	int64_t C = x->shape[1], inner = ir_prod(x->shape, 2, x->rank), cnt = x->shape[0] * inner;
	double s = 0, s2 = 0;
	for (int64_t i = 0; i < cnt; i++)
		s += ir_load(x, (i / inner * C + ch) * inner + i % inner);
	*mean = s / cnt;
	for (int64_t i = 0; i < cnt; i++) {
		double d = ir_load(x, (i / inner * C + ch) * inner + i % inner) - *mean;
		s2 += d * d;
	}
	*var = s2 / cnt;
}

/* BatchNormalization: inputs X, scale, B, input_mean, input_var.  Training
 * mode normalises with batch statistics and, when asked for, outputs
 * running = input * momentum + current * (1 - momentum). */
kiln_status ir_interp_batch_norm(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                 kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	double eps = ir_attr_float(n, "epsilon", 1e-5), mom = ir_attr_float(n, "momentum", 0.9);
	bool train = ir_attr_int(n, "training_mode", 0);
	if (x->rank < 2)
		return ir_fail(c, n, KILN_ESHAPE, "input needs rank >= 2");
	int64_t C = x->shape[1], inner = ir_prod(x->shape, 2, x->rank);
	if (kiln_tensor_numel(out[0]) != kiln_tensor_numel(x))
		return ir_fail(c, n, KILN_ESHAPE, "input and output sizes differ");
	for (int k = 1; k < 5; k++)
		if (kiln_tensor_numel(in[k]) != C)
			return ir_fail(c, n, KILN_ESHAPE, "input %d has %lld entries, not C = %lld", k,
			               (long long)kiln_tensor_numel(in[k]), (long long)C);
	for (uint32_t k = 1; k < n->nout; k++)
		if (kiln_tensor_numel(out[k]) != C)
			return ir_fail(c, n, KILN_ESHAPE, "output %u must have C entries", k);
	for (int64_t ch = 0; ch < C; ch++) {
		double mean = ir_load(in[3], ch), var = ir_load(in[4], ch);
		if (train && kiln_tensor_numel(x) > 0)
			channel_stats(x, ch, &mean, &var);
		double scale = ir_load(in[1], ch) / sqrt(var + eps), bias = ir_load(in[2], ch);
		for (int64_t b = 0; b < x->shape[0]; b++)
			for (int64_t k = 0; k < inner; k++) {
				int64_t i = (b * C + ch) * inner + k;
				ir_store(out[0], i, (ir_load(x, i) - mean) * scale + bias);
			}
		if (n->nout > 1)
			ir_store(out[1], ch, ir_load(in[3], ch) * mom + mean * (1 - mom));
		if (n->nout > 2)
			ir_store(out[2], ch, ir_load(in[4], ch) * mom + var * (1 - mom));
	}
	return KILN_OK;
}

/* LayerNormalization over axes [axis, rank); scale and bias broadcast
 * against X's full shape, and the optional Mean and InvStdDev outputs hold
 * one value per outer index. */
kiln_status ir_interp_layer_norm(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                 kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0], *sc = in[1], *b = n->nin > 2 ? in[2] : NULL;
	int64_t axis = ir_naxis(ir_attr_int(n, "axis", -1), x->rank), ss[KILN_MAX_RANK], sb[KILN_MAX_RANK];
	double eps = ir_attr_float(n, "epsilon", 1e-5);
	if (axis < 0 || axis >= x->rank)
		return ir_fail(c, n, KILN_EINVAL, "axis out of range for rank %d", x->rank);
	if (!ir_bstrides(sc, x, ss))
		return ir_bcast_fail(c, n, sc, x);
	if (b && !ir_bstrides(b, x, sb))
		return ir_bcast_fail(c, n, b, x);
	int64_t outer = ir_prod(x->shape, 0, axis), inner = ir_prod(x->shape, axis, x->rank);
	if (kiln_tensor_numel(out[0]) != kiln_tensor_numel(x))
		return ir_fail(c, n, KILN_ESHAPE, "input and output sizes differ");
	for (uint32_t k = 1; k < n->nout; k++)
		if (kiln_tensor_numel(out[k]) != outer)
			return ir_fail(c, n, KILN_ESHAPE, "output %u must have %lld entries", k, (long long)outer);
	for (int64_t o = 0; o < outer; o++) {
		double s = 0, s2 = 0;
		for (int64_t k = 0; k < inner; k++)
			s += ir_load(x, o * inner + k);
		double mean = s / inner;
		for (int64_t k = 0; k < inner; k++) {
			double d = ir_load(x, o * inner + k) - mean;
			s2 += d * d;
		}
		double inv = 1 / sqrt(s2 / inner + eps);
		for (int64_t k = 0, i = o * inner; k < inner; k++, i++) {
			double v = (ir_load(x, i) - mean) * inv * ir_load(sc, ir_boff(x, ss, i));
			ir_store(out[0], i, b ? v + ir_load(b, ir_boff(x, sb, i)) : v);
		}
		if (n->nout > 1)
			ir_store(out[1], o, mean);
		if (n->nout > 2)
			ir_store(out[2], o, inv);
	}
	return KILN_OK;
}

/* log_softmax of x along axis into lp (numel(x) doubles), stable: the max
 * is subtracted before exponentiating. */
static void log_softmax_into(const kiln_tensor *x, int64_t axis, double *lp)
{
	int64_t outer = ir_prod(x->shape, 0, axis), len = x->shape[axis];
	int64_t inner = ir_prod(x->shape, axis + 1, x->rank);
	for (int64_t o = 0; o < outer; o++)
		for (int64_t k = 0; k < inner; k++) {
			int64_t base = o * len * inner + k;
			double mx = -INFINITY, s = 0;
			for (int64_t j = 0; j < len; j++)
				mx = ir_maxd(mx, ir_load(x, base + j * inner));
			for (int64_t j = 0; j < len; j++)
				s += exp(ir_load(x, base + j * inner) - mx);
			for (int64_t j = 0; j < len; j++)
				lp[base + j * inner] = ir_load(x, base + j * inner) - mx - log(s);
		}
}

/* Softmax and LogSoftmax (opset 13: one axis). */
kiln_status ir_interp_softmax(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                              kiln_tensor *const *out)
{
	int64_t axis = ir_naxis(ir_attr_int(n, "axis", -1), in[0]->rank);
	int64_t cnt = kiln_tensor_numel(in[0]);
	if (axis < 0 || axis >= in[0]->rank || kiln_tensor_numel(out[0]) != cnt)
		return ir_fail(c, n, KILN_EINVAL, "axis out of range for rank %d", in[0]->rank);
	double *lp = malloc((cnt + 1) * sizeof *lp);
	if (!lp)
		return ir_fail(c, n, KILN_ENOMEM, "out of memory");
	log_softmax_into(in[0], axis, lp);
	for (int64_t i = 0; i < cnt; i++)
		ir_store(out[0], i, n->op == KILN_OP_SOFTMAX ? exp(lp[i]) : lp[i]);
	free(lp);
	return KILN_OK;
}

/* ---- dropout ------------------------------------------------------------ */

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Dropout's counter-based generator, which every backend reproduces
 * bit-exactly: for element i (row-major) of a node with attribute seed s,
 * run with interpreter seed r,
 *     h = mix64(mix64(mix64(s) ^ r) ^ i),  u = (h >> 11) * 2^-53,
 * where mix64 is the splitmix64 step (add 0x9e3779b97f4a7c15, then the
 * 30/27/31 xor-shift-multiply finaliser).  The element is kept when
 * u >= ratio, and y = x * keep / (1 - ratio) (0 when ratio is 1). */
static double dropout_u(uint64_t seed_attr, uint64_t run_seed, uint64_t i)
{
	uint64_t h = mix64(mix64(mix64(seed_attr) ^ run_seed) ^ i);
	return (double)(h >> 11) * 0x1.0p-53;
}

kiln_status ir_interp_dropout(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                              kiln_tensor *const *out)
{
	double ratio = ir_attr_float(n, "ratio", 0.5);
	bool train = ir_attr_int(n, "training_mode", 0) && ratio > 0;
	uint64_t seed = (uint64_t)ir_attr_int(n, "seed", 0);
	int64_t cnt = kiln_tensor_numel(out[0]);
	if (ratio < 0 || ratio > 1 || kiln_tensor_numel(in[0]) != cnt ||
	    (n->nout > 1 && kiln_tensor_numel(out[1]) != cnt))
		return ir_fail(c, n, KILN_EINVAL, "ratio %g outside [0, 1] or sizes differ", ratio);
	double scale = ratio < 1 ? 1 / (1 - ratio) : 0;
	for (int64_t i = 0; i < cnt; i++) {
		bool keep = !train || dropout_u(seed, c->seed, (uint64_t)i) >= ratio;
		double x = ir_load(in[0], i);
		ir_store(out[0], i, !train ? x : keep ? x * scale : 0);
		if (n->nout > 1)
			ir_store_i64(out[1], i, keep);
	}
	return KILN_OK;
}

/* ---- losses ------------------------------------------------------------- */

/* NegativeLogLikelihoodLoss over log-probabilities lp laid out like x
 * [N, C, d...] and target t [N, d...], as the ONNX spec: an element whose
 * target is ignore_index contributes 0 and weighs 0; "mean" divides the
 * weighted sum by the summed weights of the others (NaN if none). */
static kiln_status nll_core(ir_interp *c, const ir_node *n, const double *lp,
                            const kiln_tensor *x, const kiln_tensor *t, const kiln_tensor *w,
                            kiln_tensor *loss)
{
	const char *red = ir_attr_str(n, "reduction", "mean");
	bool has_ig = ir_attr_get(n, "ignore_index") != NULL, none = !strcmp(red, "none");
	int64_t ig = ir_attr_int(n, "ignore_index", 0);
	if (none + !strcmp(red, "sum") + !strcmp(red, "mean") != 1)
		return ir_fail(c, n, KILN_EINVAL, "reduction must be none, sum or mean, not '%s'", red);
	if (x->rank < 2 || !ir_isint(t->dtype) || (w && kiln_tensor_numel(w) != x->shape[1]))
		return ir_fail(c, n, KILN_ESHAPE, "needs scores [N,C,...], integer targets, weight [C]");
	int64_t N = x->shape[0], C = x->shape[1], D = ir_prod(x->shape, 2, x->rank);
	if (kiln_tensor_numel(t) != N * D || kiln_tensor_numel(loss) != (none ? N * D : 1))
		return ir_fail(c, n, KILN_ESHAPE, "target or loss size does not match the scores");
	double sum = 0, wsum = 0;
	for (int64_t i = 0; i < N * D; i++) {
		int64_t tg = ir_load_i64(t, i), b = i / D, d = i % D;
		double l = 0, wt = 0;
		if (!has_ig || tg != ig) {
			if (tg < 0 || tg >= C)
				return ir_fail(c, n, KILN_EINVAL, "target %lld out of range [0, %lld)",
				               (long long)tg, (long long)C);
			wt = w ? ir_load(w, tg) : 1;
			l = -lp[(b * C + tg) * D + d] * wt;
		}
		if (none)
			ir_store(loss, i, l);
		sum += l, wsum += wt;
	}
	if (!none)
		ir_store(loss, 0, !strcmp(red, "sum") ? sum : sum / wsum);
	return KILN_OK;
}

kiln_status ir_interp_loss(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                           kiln_tensor *const *out)
{
	const kiln_tensor *x = in[0];
	int64_t cnt = kiln_tensor_numel(x);
	bool ce = n->op == KILN_OP_SOFTMAX_CE;
	if (x->rank < 2 || (n->nout > 1 && kiln_tensor_numel(out[1]) != cnt))
		return ir_fail(c, n, KILN_ESHAPE, "scores need rank >= 2 and log_prob their size");
	double *lp = malloc((cnt + 1) * sizeof *lp);
	if (!lp)
		return ir_fail(c, n, KILN_ENOMEM, "out of memory");
	for (int64_t i = 0; i < cnt; i++)
		lp[i] = ir_load(x, i);
	if (ce)
		log_softmax_into(x, 1, lp);
	kiln_status rc = nll_core(c, n, lp, x, in[1], n->nin > 2 ? in[2] : NULL, out[0]);
	for (int64_t i = 0; i < cnt && !rc && n->nout > 1; i++)
		ir_store(out[1], i, lp[i]);
	free(lp);
	return rc;
}
