/*
 * grad_nn.c: gradient rules for the neural-network ops: convolution,
 * pooling, normalisation, softmax, dropout and the losses.
 *
 * Like grad.c, every rule is built from forward ops only, so no backward
 * op needs a kernel of its own.  Convolution's input gradient is a
 * ConvTranspose with the same weights and its weight gradient a Conv of x
 * with dy (stride and dilation swapped, batch as the reduced channel), one
 * per group.  Pooling uses a fixed one-hot "unfold" kernel: a grouped Conv
 * lays each window's taps out as channels, ArgMax picks the first maximum
 * (PyTorch's tie rule), and a ConvTranspose with the same kernel scatters
 * dy back and sums overlapping windows.  Normalisation and softmax rules
 * recompute their statistics from x with Reduce ops rather than reading
 * hidden state.  Class-index ops (losses, one-hot masks) need a fixed
 * class count to build their index constants.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/grad.h" /* the rules' shorthand: ADD, MUL, K, ... */

/* ---- window geometry -------------------------------------------------------- */

/* Resolved geometry of a conv or pool: explicit pads whatever auto_pad said. */
typedef struct cgeo {
	int nsp;
	int64_t k[3], s[3], d[3], pb[3], pe[3];
} cgeo;

static void spatial(const ir_node *n, const char *name, int cnt, int64_t dflt, int64_t *v)
{
	const int64_t *a;
	uint32_t na = ir_attr_ints(n, name, &a);
	for (int i = 0; i < cnt; i++)
		v[i] = na > (uint32_t)i ? a[i] : dflt;
}

/* in: x's spatial dims, out: the result's; kernel from k (or the node's
 * kernel_shape when NULL).  SAME padding and ConvTranspose's output_shape
 * derive the pads from the sizes, as the interpreter does. */
static kiln_status geometry(kiln_graph *g, const ir_node *n, const int64_t *in,
                            const int64_t *out, const int64_t *k, bool transpose, cgeo *o)
{
	int64_t pads[6], opad[3];
	const int64_t *os;
	o->nsp = pass_gtype(g, n->in[0])->rank - 2;
	spatial(n, "kernel_shape", o->nsp, 1, o->k);
	for (int i = 0; k && i < o->nsp; i++)
		o->k[i] = k[i];
	spatial(n, "strides", o->nsp, 1, o->s);
	spatial(n, "dilations", o->nsp, 1, o->d);
	spatial(n, "pads", 2 * o->nsp, 0, pads);
	spatial(n, "output_padding", o->nsp, 0, opad);
	const char *ap = ir_attr_str(n, "auto_pad", "NOTSET");
	bool derive = !strncmp(ap, "SAME", 4) || (transpose && ir_attr_ints(n, "output_shape", &os));
	for (int i = 0; i < o->nsp; i++) {
		int64_t span = (o->k[i] - 1) * o->d[i] + 1;
		o->pb[i] = pads[i], o->pe[i] = pads[o->nsp + i];
		if (!strcmp(ap, "VALID"))
			o->pb[i] = o->pe[i] = 0;
		if (!derive)
			continue;
		if (in[i] < 0 || out[i] < 0)
			return ir_errorf(g, n, KILN_EUNSUPPORTED, "gradient: derived padding needs "
			                 "fixed spatial dims");
		int64_t total = transpose ? o->s[i] * (in[i] - 1) + opad[i] + span - out[i]
		                          : (out[i] - 1) * o->s[i] + span - in[i];
		total = total < 0 ? 0 : total;
		o->pb[i] = !strcmp(ap, "SAME_UPPER") ? total / 2 : total - total / 2;
		o->pe[i] = total - o->pb[i];
	}
	return KILN_OK;
}

/* DSL options for a conv of geometry o (stride and dilation swapped when
 * swap), with end padding pe and the given output_padding. */
static kiln_conv_opts opts_of(const cgeo *o, const int64_t *pe, const int64_t *opad,
                              int64_t group, bool swap)
{
	kiln_conv_opts c = {.group = group};
	for (int i = 0; i < o->nsp; i++) {
		c.stride[i] = swap ? o->d[i] : o->s[i];
		c.dilation[i] = swap ? o->s[i] : o->d[i];
		c.pad[i] = o->pb[i], c.pad[o->nsp + i] = pe[i];
		c.output_padding[i] = opad ? opad[i] : 0;
	}
	return c;
}

/* output_padding making a ConvTranspose of size out come back to size in:
 * in - ((out - 1) s + span - pb - pe); 0 whenever the stride is 1. */
static kiln_status back_pad(kiln_graph *g, const ir_node *n, const cgeo *o, const int64_t *in,
                            const int64_t *out, const int64_t *pe, int64_t *opad)
{
	for (int i = 0; i < o->nsp; i++) {
		if (o->s[i] == 1) {
			opad[i] = 0;
			continue;
		}
		if (in[i] < 0 || out[i] < 0)
			return ir_errorf(g, n, KILN_EUNSUPPORTED, "gradient: stride %lld over a "
			                 "symbolic spatial dim", (long long)o->s[i]);
		opad[i] = in[i] - ((out[i] - 1) * o->s[i] + (o->k[i] - 1) * o->d[i] + 1 - o->pb[i] - pe[i]);
	}
	return KILN_OK;
}

/* ---- convolution ---------------------------------------------------------- */

static uint32_t swap01(kiln_graph *g, kiln_loc loc, uint32_t v)
{
	int r = pass_gtype(g, v)->rank;
	int64_t perm[KILN_MAX_RANK] = {1, 0, 2, 3, 4};
	return kiln_transpose_at(g, loc, v, r, perm);
}

/* The weight gradient of one group: sum over batch and positions of
 * big[n, c, o s + t d - p] small[n, m, o], computed as a Conv with the batch
 * as channels (stride d, dilation s) and cut to the kernel: [m, c, k...]. */
static uint32_t wgrad_group(kiln_graph *g, const ir_node *n, uint32_t big, uint32_t small,
                            const cgeo *o)
{
	kiln_conv_opts c = opts_of(o, o->pe, NULL, 1, true);
	uint32_t r = kiln_conv_at(g, L, swap01(g, L, big), swap01(g, L, small), 0, &c);
	if (!r)
		return 0;
	int64_t st[3] = {0}, ax[3] = {2, 3, 4};
	bool cut = false;
	for (int i = 0; i < o->nsp; i++)
		cut |= pass_gtype(g, r)->dim[2 + i] != o->k[i];
	if (cut)
		r = kiln_slice_at(g, L, r, o->nsp, st, o->k, ax, NULL);
	return swap01(g, L, r);
}

/* Weight gradient [C_small, C_big/group, k...], one group at a time. */
static uint32_t wgrad(kiln_graph *g, const ir_node *n, uint32_t big, uint32_t small,
                      const cgeo *o)
{
	int64_t grp = ir_attr_int(n, "group", 1);
	if (grp == 1)
		return wgrad_group(g, n, big, small, o);
	uint32_t *parts = calloc(3 * grp, sizeof *parts), r = 0;
	if (!parts) {
		ir_errorf(g, n, KILN_ENOMEM, "gradient: out of memory");
		return 0;
	}
	uint32_t *bs = parts + grp, *ss = parts + 2 * grp;
	kiln_split_at(g, L, big, 1, (int)grp, NULL, bs);
	kiln_split_at(g, L, small, 1, (int)grp, NULL, ss);
	for (int64_t i = 0; i < grp && g->status == KILN_OK; i++)
		parts[i] = wgrad_group(g, n, bs[i], ss[i], o);
	if (g->status == KILN_OK)
		r = kiln_concat_at(g, L, (int)grp, parts, 0);
	free(parts);
	return r;
}

/* The bias gradient: dy summed over every axis but the channels. */
static uint32_t bgrad(kiln_graph *g, const ir_node *n, uint32_t d)
{
	int r = pass_gtype(g, d)->rank, na = 0;
	int64_t axes[KILN_MAX_RANK];
	for (int i = 0; i < r; i++)
		if (i != 1)
			axes[na++] = i;
	return kiln_reduce_sum_at(g, L, d, na, axes, false);
}

kiln_status pass_grad_conv(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]), *wt = pass_gtype(g, n->in[1]);
	const ir_type *yt = pass_gtype(g, n->out[0]);
	cgeo o;
	int64_t opad[3];
	if (geometry(g, n, xt->dim + 2, yt->dim + 2, wt->dim + 2, false, &o) ||
	    back_pad(g, n, &o, xt->dim + 2, yt->dim + 2, o.pe, opad))
		return g->status;
	kiln_conv_opts c = opts_of(&o, o.pe, opad, ir_attr_int(n, "group", 1), false);
	dx[0] = kiln_conv_transpose_at(g, L, dy[0], n->in[1], 0, &c);
	dx[1] = wgrad(g, n, n->in[0], dy[0], &o);
	if (n->nin > 2)
		dx[2] = bgrad(g, n, dy[0]);
	return g->status;
}

/* ConvTranspose is Conv's adjoint in x: its x gradient is a Conv of dy
 * with the same weights, and its weight gradient the Conv rule's with the
 * roles of x and dy exchanged. */
kiln_status pass_grad_conv_transpose(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                                     uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]), *wt = pass_gtype(g, n->in[1]);
	const ir_type *yt = pass_gtype(g, n->out[0]);
	cgeo o;
	if (geometry(g, n, xt->dim + 2, yt->dim + 2, wt->dim + 2, true, &o))
		return g->status;
	kiln_conv_opts c = opts_of(&o, o.pe, NULL, ir_attr_int(n, "group", 1), false);
	dx[0] = kiln_conv_at(g, L, dy[0], n->in[1], 0, &c);
	dx[1] = wgrad(g, n, dy[0], n->in[0], &o);
	if (n->nin > 2)
		dx[2] = bgrad(g, n, dy[0]);
	return g->status;
}

/* ---- pooling ------------------------------------------------------------------ */

/* Pool geometry with fixed sizes, and the end padding pe that makes a Conv
 * of x produce exactly the pool's output size (ceil_mode adds some). */
static kiln_status pool_geo(kiln_graph *g, const ir_node *n, cgeo *o, int64_t *pe,
                            int64_t *opad, int64_t *taps)
{
	const ir_type *xt = pass_gtype(g, n->in[0]), *yt = pass_gtype(g, n->out[0]);
	bool fixed = true;
	for (int i = 1; i < xt->rank; i++)
		fixed = fixed && xt->dim[i] >= 0 && yt->dim[i] >= 0;
	if (!fixed)
		return ir_errorf(g, n, KILN_EUNSUPPORTED, "gradient of pooling needs fixed "
		                 "channels and spatial dims, got %s",
		                 ir_type_str(g, xt, (char[128]){0}, 128));
	if (geometry(g, n, xt->dim + 2, yt->dim + 2, NULL, false, o))
		return g->status;
	*taps = 1;
	for (int i = 0; i < o->nsp; i++) {
		int64_t span = (o->k[i] - 1) * o->d[i] + 1;
		int64_t need = (yt->dim[2 + i] - 1) * o->s[i] + span - xt->dim[2 + i] - o->pb[i];
		pe[i] = need > 0 ? need : 0;
		*taps *= o->k[i];
	}
	return back_pad(g, n, o, xt->dim + 2, yt->dim + 2, pe, opad);
}

/* A kernel [C*K or C, 1, k...]: one-hot per tap (unfold) or all ones. */
static uint32_t tap_kernel(kiln_graph *g, const ir_node *n, const cgeo *o, int64_t C,
                           int64_t K, bool onehot)
{
	int64_t shape[5] = {onehot ? C * K : C, 1, o->k[0], o->k[1], o->k[2]};
	kiln_tensor *t = kiln_tensor_new(pass_gtype(g, n->in[0])->dtype, o->nsp + 2, shape);
	for (int64_t i = 0; t && i < shape[0] * K; i++)
		ir_store(t, i, !onehot || i / K % K == i % K);
	return pass_gconst(g, L, t);
}

/* Visits every (tap, output position) pair of the window; f gets the tap,
 * the output's linear index and whether the tap falls inside x, or inside
 * x plus its declared padding. */
static void each_tap(const cgeo *o, const int64_t *in, const int64_t *out, const int64_t *pe,
                     void (*f)(void *, int64_t, int64_t, bool, bool), void *arg)
{
	int64_t K = o->k[0] * (o->nsp > 1 ? o->k[1] : 1) * (o->nsp > 2 ? o->k[2] : 1);
	int64_t P = out[0] * (o->nsp > 1 ? out[1] : 1) * (o->nsp > 2 ? out[2] : 1);
	for (int64_t t = 0; t < K; t++)
		for (int64_t p = 0; p < P; p++) {
			bool inside = true, padded = true;
			int64_t tr = t, pr = p;
			for (int i = o->nsp - 1; i >= 0; i--) {
				int64_t j = pr % out[i] * o->s[i] + tr % o->k[i] * o->d[i] - o->pb[i];
				inside = inside && j >= 0 && j < in[i];
				padded = padded && j < in[i] + pe[i];
				tr /= o->k[i], pr /= out[i];
			}
			f(arg, t, p, inside, padded);
		}
}

typedef struct tapacc {
	kiln_tensor *t;
	int64_t P;
	bool incl, any_out;
} tapacc;

static void mark_inside(void *a, int64_t t, int64_t p, bool inside, bool padded)
{
	tapacc *c = a;
	(void)padded;
	ir_store(c->t, t * c->P + p, inside);
	c->any_out |= !inside;
}

static void count_taps(void *a, int64_t t, int64_t p, bool inside, bool padded)
{
	tapacc *c = a;
	(void)t;
	ir_store(c->t, p, ir_load(c->t, p) + (inside || (c->incl && padded)));
}

/* The window taps as channels [N, C, K, out...], padding taps at -inf. */
static uint32_t unfold(kiln_graph *g, const ir_node *n, const cgeo *o, const int64_t *pe,
                       int64_t K, uint32_t w1)
{
	const ir_type *xt = pass_gtype(g, n->in[0]), *yt = pass_gtype(g, n->out[0]);
	kiln_conv_opts c = opts_of(o, pe, NULL, xt->dim[1], false);
	uint32_t p = kiln_conv_at(g, L, n->in[0], w1, 0, &c);
	ir_type five = {xt->dtype, xt->rank + 1, {xt->dim[0], xt->dim[1], K}};
	int64_t ms[KILN_MAX_RANK] = {1, 1, K};
	for (int i = 0; i < o->nsp; i++)
		five.dim[3 + i] = ms[3 + i] = yt->dim[2 + i];
	p = pass_greshape(g, L, p, &five);
	tapacc acc = {kiln_tensor_new(KILN_BOOL, five.rank, ms), 0, false, false};
	if (!acc.t)
		ir_errorf(g, n, KILN_ENOMEM, "gradient: out of memory");
	if (g->status != KILN_OK) {
		kiln_tensor_free(acc.t);
		return 0;
	}
	acc.P = kiln_tensor_numel(acc.t) / K;
	each_tap(o, xt->dim + 2, yt->dim + 2, pe, mark_inside, &acc);
	if (!acc.any_out) {
		kiln_tensor_free(acc.t);
		return p;
	}
	uint32_t ninf = kiln_scalar_at(g, L, xt->dtype, -INFINITY);
	return kiln_where_at(g, L, pass_gconst(g, L, acc.t), p, ninf);
}

/* MaxPool: dy goes to each window's first maximum (ArgMax over the
 * unfolded taps), and ConvTranspose with the unfold kernel sums it back. */
kiln_status pass_grad_max_pool(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                               uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]);
	cgeo o;
	int64_t pe[3], opad[3], K, C = xt->dim[1];
	if (pool_geo(g, n, &o, pe, opad, &K))
		return g->status;
	uint32_t w1 = tap_kernel(g, n, &o, C, K, true);
	uint32_t taps = unfold(g, n, &o, pe, K, w1);
	uint32_t am = kiln_argmax_at(g, L, taps, 2, true);
	int64_t ars[KILN_MAX_RANK] = {1, 1, K, 1, 1, 1}, two = 2;
	kiln_tensor *ar = kiln_tensor_new(KILN_I64, xt->rank + 1, ars);
	for (int64_t i = 0; ar && i < K; i++)
		ir_store_i64(ar, i, i);
	uint32_t hot = kiln_equal_at(g, L, am, pass_gconst(g, L, ar));
	hot = kiln_cast_at(g, L, hot, xt->dtype);
	uint32_t gk = MUL(hot, kiln_unsqueeze_at(g, L, dy[0], 1, &two));
	ir_type flat = *pass_gtype(g, dy[0]);
	flat.dim[1] = C * K;
	gk = g->status ? 0 : pass_greshape(g, L, gk, &flat);
	kiln_conv_opts c = opts_of(&o, pe, opad, C, false);
	dx[0] = kiln_conv_transpose_at(g, L, gk, w1, 0, &c);
	return g->status;
}

/* AveragePool: dy divided by each window's tap count, spread over the
 * window by a ConvTranspose with a ones kernel. */
kiln_status pass_grad_avg_pool(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                               uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]), *yt = pass_gtype(g, n->out[0]);
	cgeo o;
	int64_t pe[3], opad[3], K, C = xt->dim[1], cs[KILN_MAX_RANK] = {1, 1, 1, 1, 1};
	if (pool_geo(g, n, &o, pe, opad, &K))
		return g->status;
	for (int i = 0; i < o.nsp; i++)
		cs[2 + i] = yt->dim[2 + i];
	tapacc acc = {kiln_tensor_new(xt->dtype, xt->rank, cs), 0,
	              ir_attr_int(n, "count_include_pad", 0) != 0, false};
	if (!acc.t)
		return ir_errorf(g, n, KILN_ENOMEM, "gradient: out of memory");
	/* count_include_pad counts the declared padding, not ceil_mode's extra */
	each_tap(&o, xt->dim + 2, yt->dim + 2, o.pe, count_taps, &acc);
	for (int64_t i = 0; i < kiln_tensor_numel(acc.t); i++)
		ir_store(acc.t, i, 1 / ir_load(acc.t, i));
	uint32_t d = MUL(dy[0], pass_gconst(g, L, acc.t));
	kiln_conv_opts c = opts_of(&o, pe, opad, C, false);
	dx[0] = kiln_conv_transpose_at(g, L, d, tap_kernel(g, n, &o, C, K, false), 0, &c);
	return g->status;
}

/* ---- normalisation ------------------------------------------------------------- */

/* A [C] vector as [1, C, 1...] against x of rank r. */
static uint32_t chan(kiln_graph *g, kiln_loc loc, uint32_t v, int r)
{
	int64_t axes[KILN_MAX_RANK] = {0};
	for (int i = 2; i < r; i++)
		axes[i - 1] = i;
	return kiln_unsqueeze_at(g, loc, v, r - 1, axes);
}

/* Normalised x and 1/sqrt(var + eps) over the axes in mask (kept as 1s). */
static uint32_t normalize(kiln_graph *g, const ir_node *n, const bool *mask, double eps,
                          uint32_t *xc, uint32_t *istd)
{
	const ir_type *xt = pass_gtype(g, n->in[0]);
	int64_t axes[KILN_MAX_RANK];
	int na = 0;
	for (int i = 0; i < xt->rank; i++)
		if (mask[i])
			axes[na++] = i;
	uint32_t mu = kiln_reduce_mean_at(g, L, n->in[0], na, axes, true);
	*xc = SUB(n->in[0], mu);
	uint32_t var = kiln_reduce_mean_at(g, L, MUL(*xc, *xc), na, axes, true);
	*istd = kiln_reciprocal_at(g, L, kiln_sqrt_at(g, L, ADD(var, K(eps))));
	return MUL(*xc, *istd);
}

/* dx of y = xhat * s with batch statistics over mask: with u = dy s,
 * dx = istd (u - mean(u) - xhat mean(u xhat)). */
static uint32_t norm_dx(kiln_graph *g, const ir_node *n, const bool *mask, uint32_t u,
                        uint32_t xhat, uint32_t istd)
{
	int64_t axes[KILN_MAX_RANK];
	int na = 0;
	for (int i = 0; i < pass_gtype(g, n->in[0])->rank; i++)
		if (mask[i])
			axes[na++] = i;
	uint32_t m1 = kiln_reduce_mean_at(g, L, u, na, axes, true);
	uint32_t m2 = kiln_reduce_mean_at(g, L, MUL(u, xhat), na, axes, true);
	return MUL(istd, SUB(SUB(u, m1), MUL(xhat, m2)));
}

/* Inference mode: running statistics are inputs, so y is affine in x. */
static void bn_eval(kiln_graph *g, const ir_node *n, uint32_t d, uint32_t *dx)
{
	int r = pass_gtype(g, n->in[0])->rank;
	double eps = ir_attr_float(n, "epsilon", 1e-5);
	uint32_t sc = n->in[1], istd = kiln_reciprocal_at(g, L, kiln_sqrt_at(g, L, ADD(n->in[4], K(eps))));
	uint32_t xc = SUB(n->in[0], chan(g, L, n->in[3], r));
	uint32_t ds = bgrad(g, n, MUL(d, xc)), db = bgrad(g, n, d);
	dx[0] = MUL(d, chan(g, L, MUL(sc, istd), r));
	dx[1] = MUL(ds, istd);
	dx[2] = db;
	dx[3] = kiln_neg_at(g, L, MUL(db, MUL(sc, istd)));
	dx[4] = MUL(MUL(ds, sc), MUL(K(-0.5), MUL(istd, MUL(istd, istd))));
}

/* Training mode: batch statistics, so x's gradient has the mean and
 * variance terms; the running-stat outputs (input * momentum + batch stat
 * * (1 - momentum)) pass their gradients on too. */
static void bn_train(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]);
	bool mask[KILN_MAX_RANK];
	for (int i = 0; i < xt->rank; i++)
		mask[i] = i != 1;
	double mom = ir_attr_float(n, "momentum", 0.9);
	uint32_t xc, istd, xhat = normalize(g, n, mask, ir_attr_float(n, "epsilon", 1e-5), &xc, &istd);
	uint32_t d = 0;
	if (dy[0]) {
		uint32_t u = MUL(dy[0], chan(g, L, n->in[1], xt->rank));
		d = norm_dx(g, n, mask, u, xhat, istd);
		dx[1] = bgrad(g, n, MUL(dy[0], xhat));
		dx[2] = bgrad(g, n, dy[0]);
	}
	if (n->nout > 1 && dy[1]) { /* d batch_mean / dx = 1/M */
		uint32_t m = pass_greduce_back(g, L, MUL(dy[1], K(1 - mom)), n->in[0], mask, false, true);
		d = d ? ADD(d, m) : m;
		dx[3] = MUL(dy[1], K(mom));
	}
	if (n->nout > 2 && dy[2]) { /* d batch_var / dx = 2 (x - mean) / M */
		uint32_t v = pass_greduce_back(g, L, MUL(dy[2], K(2 * (1 - mom))), n->in[0], mask,
		                               false, true);
		v = MUL(v, xc);
		d = d ? ADD(d, v) : v;
		dx[4] = MUL(dy[2], K(mom));
	}
	dx[0] = d;
}

kiln_status pass_grad_batch_norm(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                                 uint32_t *dx)
{
	if (ir_attr_int(n, "training_mode", 0))
		bn_train(g, n, dy, dx);
	else
		bn_eval(g, n, dy[0], dx);
	return g->status;
}

kiln_status pass_grad_layer_norm(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                                 uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]);
	int64_t axis = ir_attr_int(n, "axis", -1);
	bool mask[KILN_MAX_RANK];
	if ((n->nout > 1 && dy[1]) || (n->nout > 2 && dy[2]))
		return ir_errorf(g, n, KILN_EUNSUPPORTED, "no gradient through LayerNormalization's "
		                 "Mean and InvStdDev outputs");
	axis = axis < 0 ? axis + xt->rank : axis;
	for (int i = 0; i < xt->rank; i++)
		mask[i] = i >= axis;
	uint32_t xc, istd, xhat = normalize(g, n, mask, ir_attr_float(n, "epsilon", 1e-5), &xc, &istd);
	dx[0] = norm_dx(g, n, mask, MUL(dy[0], n->in[1]), xhat, istd);
	dx[1] = MUL(dy[0], xhat); /* the driver sums both back to their shapes */
	if (n->nin > 2)
		dx[2] = dy[0];
	return g->status;
}

/* Softmax: y (dy - sum(dy y)); LogSoftmax: dy - exp(y) sum(dy). */
kiln_status pass_grad_softmax(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                              uint32_t *dx)
{
	int64_t axis = ir_attr_int(n, "axis", -1);
	uint32_t y = n->out[0];
	if (n->op == KILN_OP_SOFTMAX) {
		uint32_t s = kiln_reduce_sum_at(g, L, MUL(dy[0], y), 1, &axis, true);
		dx[0] = MUL(y, SUB(dy[0], s));
	} else {
		uint32_t s = kiln_reduce_sum_at(g, L, dy[0], 1, &axis, true);
		dx[0] = SUB(dy[0], MUL(kiln_exp_at(g, L, y), s));
	}
	return g->status;
}

/* ---- dropout ---------------------------------------------------------------------- */

static void copy_attrs(kiln_graph *g, ir_node *to, const ir_node *from)
{
	for (uint32_t i = 0; i < from->nattr; i++) {
		const ir_attr *a = &from->attr[i];
		if (a->kind == IR_A_INT)
			ir_attr_set_int(g, to, a->name, a->u.i);
		else if (a->kind == IR_A_FLOAT)
			ir_attr_set_float(g, to, a->name, a->u.f);
	}
}

/* The keep mask: output 1, or that of a twin Dropout with the same seed
 * (the generator is counter-based, so the twin draws the same mask). */
static uint32_t keep_mask(kiln_graph *g, const ir_node *n)
{
	if (n->nout > 1)
		return n->out[1];
	ir_node *twin = ir_node_new(g, KILN_OP_DROPOUT, 1, n->in, 2, n->loc);
	if (!twin)
		return 0;
	copy_attrs(g, twin, n);
	return ir_infer_node(g, twin) == KILN_OK ? twin->out[1] : 0;
}

kiln_status pass_grad_dropout(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	double ratio = ir_attr_float(n, "ratio", 0.5);
	if (!ir_attr_int(n, "training_mode", 0) || ratio == 0) {
		dx[0] = dy[0];
		return g->status;
	}
	kiln_dtype dt = pass_gtype(g, n->in[0])->dtype;
	uint32_t keep = kiln_cast_at(g, L, keep_mask(g, n), dt);
	dx[0] = MUL(dy[0], MUL(keep, K(1 / (1 - ratio))));
	return g->status;
}

/* ---- losses ------------------------------------------------------------------------- */

/* onehot[N, C, d...] of the targets, as x's dtype. */
static uint32_t onehot(kiln_graph *g, const ir_node *n)
{
	const ir_type *xt = pass_gtype(g, n->in[0]), *tt = pass_gtype(g, n->in[1]);
	int64_t shape[KILN_MAX_RANK], one = 1;
	for (int i = 0; i < xt->rank; i++)
		shape[i] = i == 1 ? xt->dim[1] : 1;
	kiln_tensor *ar = kiln_tensor_new(tt->dtype, xt->rank, shape);
	for (int64_t i = 0; ar && i < xt->dim[1]; i++)
		ir_store_i64(ar, i, i);
	uint32_t t = kiln_unsqueeze_at(g, L, n->in[1], 1, &one);
	return kiln_cast_at(g, L, kiln_equal_at(g, L, t, pass_gconst(g, L, ar)), xt->dtype);
}

/* 1 where the target counts, 0 where it is ignore_index, as x's dtype. */
static uint32_t keep_of(kiln_graph *g, const ir_node *n)
{
	const ir_type *tt = pass_gtype(g, n->in[1]);
	uint32_t t = n->in[1], keep;
	if (ir_attr_get(n, "ignore_index")) {
		uint32_t ig = kiln_scalar_at(g, L, tt->dtype, (double)ir_attr_int(n, "ignore_index", 0));
		keep = kiln_not_at(g, L, kiln_equal_at(g, L, t, ig));
	} else
		keep = kiln_equal_at(g, L, t, t); /* all true: integers are never NaN */
	return kiln_cast_at(g, L, keep, pass_gtype(g, n->in[0])->dtype);
}

/* The class weight of each element's target, [N, d...]. */
static uint32_t target_weight(kiln_graph *g, const ir_node *n, uint32_t hot)
{
	int64_t one = 1;
	uint32_t w = MUL(hot, chan(g, L, n->in[2], pass_gtype(g, n->in[0])->rank));
	return kiln_reduce_sum_at(g, L, w, 1, &one, false);
}

/* d loss / d weight[c]: per element, -lp[t] where t == c; "mean" divides by
 * the summed weights W and subtracts the loss: (-lp[t] - loss) / W. */
static uint32_t class_wgrad(kiln_graph *g, const ir_node *n, uint32_t hot, uint32_t keep,
                            uint32_t dl, uint32_t total)
{
	int64_t one = 1;
	uint32_t lp = n->op == KILN_OP_SOFTMAX_CE ? kiln_log_softmax_at(g, L, n->in[0], 1) : n->in[0];
	uint32_t e = kiln_neg_at(g, L, kiln_reduce_sum_at(g, L, MUL(hot, lp), 1, &one, false));
	if (total)
		e = DIV(SUB(e, n->out[0]), total);
	uint32_t c = kiln_unsqueeze_at(g, L, MUL(MUL(keep, e), dl), 1, &one);
	return bgrad(g, n, MUL(hot, c));
}

/* SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: per element,
 * loss = -w[t] lp[t], so d/dlp = -w[t] onehot, scaled by the reduction
 * (mean divides by the summed weights); through log_softmax that becomes
 * (softmax - onehot) w[t]. */
kiln_status pass_grad_loss(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx)
{
	const ir_type *xt = pass_gtype(g, n->in[0]);
	bool ce = n->op == KILN_OP_SOFTMAX_CE;
	int64_t one = 1;
	if (xt->dim[1] < 0)
		return ir_errorf(g, n, KILN_EUNSUPPORTED, "gradient of a loss needs a fixed class "
		                 "count, got scores %s", ir_type_str(g, xt, (char[128]){0}, 128));
	uint32_t p = ce ? kiln_softmax_at(g, L, n->in[0], 1) : 0, d = 0;
	if (dy[0]) {
		uint32_t hot = onehot(g, n), keep = keep_of(g, n), dl = dy[0], total = 0;
		uint32_t w = n->nin > 2 ? MUL(keep, target_weight(g, n, hot)) : keep;
		if (!strcmp(ir_attr_str(n, "reduction", "mean"), "mean")) {
			total = kiln_reduce_sum_at(g, L, w, 0, NULL, false);
			dl = DIV(dl, total);
		}
		uint32_t c = kiln_unsqueeze_at(g, L, MUL(w, dl), 1, &one);
		d = MUL(ce ? SUB(p, hot) : kiln_neg_at(g, L, hot), c);
		if (n->nin > 2)
			dx[2] = class_wgrad(g, n, hot, keep, dy[0], total);
	}
	if (ce && n->nout > 1 && dy[1]) { /* through the log_prob output */
		uint32_t s = kiln_reduce_sum_at(g, L, dy[1], 1, &one, true);
		uint32_t e = SUB(dy[1], MUL(p, s));
		d = d ? ADD(d, e) : e;
	}
	dx[0] = d;
	return g->status;
}
