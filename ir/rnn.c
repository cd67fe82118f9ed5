/*
 * rnn.c: the fused recurrent ops RNN, GRU and LSTM (ONNX's, opsets 7 to
 * 17): their attributes read once (ir_rnn_parse, which the shape rule,
 * the interpreter, the lowering and ONNX export share), the shape rule and
 * the interpreter's reference loop.
 *
 * The key idea is that the time dim T is only a loop bound: the shape rule
 * passes X's T (a number or a symbol) through to Y, and nothing else
 * depends on it, so a model exported with a dynamic sequence length
 * imports, runs and compiles.  The semantics are those of the composition
 * frontend/onnx/onnx_rnn.c unrolls a fixed T into (its header comment):
 * per direction and step, gates = X_t W^T + Wb + H R^T + Rb, clip on the
 * gates' inputs (not on the C that LSTM's h() reads), the activations
 * taking activation_alpha/_beta in order, and past a row's sequence
 * length H and C keep their value and Y is 0 (the reverse pass starts at
 * the row's last step).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ir/interp.h"
#include "ir/ir.h"
#include "ir/shape.h"

const char *const ir_rnn_act_names[IR_ACT_COUNT] = {
	"Relu", "Tanh", "Sigmoid", "Softsign", "Softplus", "LeakyRelu", "ThresholdedRelu", "Elu",
	"HardSigmoid", "Affine", "ScaledTanh"};

/* which parameters each activation takes, and their defaults */
static const struct {
	bool alpha, beta;
	double alpha_dflt, beta_dflt;
} act_info[IR_ACT_COUNT] = {
	[IR_ACT_LEAKY_RELU] = {true, false, 0.01, 0},
	[IR_ACT_THRESHOLDED_RELU] = {true, false, 1, 0},
	[IR_ACT_ELU] = {true, false, 1, 0},
	[IR_ACT_HARD_SIGMOID] = {true, true, 0.2, 0.5},
	[IR_ACT_AFFINE] = {true, true, 1, 0},
	[IR_ACT_SCALED_TANH] = {true, true, 1, 1},
};

double ir_rnn_act(int act, double a, double b, double x)
{
	switch (act) {
	case IR_ACT_RELU: return x > 0 ? x : 0;
	case IR_ACT_TANH: return tanh(x);
	case IR_ACT_SIGMOID: return 1 / (1 + exp(-x));
	case IR_ACT_SOFTSIGN: return x / (1 + fabs(x));
	case IR_ACT_SOFTPLUS: return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
	case IR_ACT_LEAKY_RELU: return x >= 0 ? x : a * x;
	case IR_ACT_THRESHOLDED_RELU: return x > a ? x : 0;
	case IR_ACT_ELU: return x >= 0 ? x : a * (exp(x) - 1);
	case IR_ACT_HARD_SIGMOID: return fmax(0, fmin(1, a * x + b));
	case IR_ACT_AFFINE: return a * x + b;
	case IR_ACT_SCALED_TANH: return a * tanh(b * x);
	}
	return x;
}

/* The activation named s[0..len) (case-insensitive), or -1. */
static int act_of(const char *s, size_t len)
{
	for (int k = 0; k < IR_ACT_COUNT; k++)
		if (strlen(ir_rnn_act_names[k]) == len && !strncasecmp(s, ir_rnn_act_names[k], len))
			return k;
	return -1;
}

#define WHY(...) (snprintf(why, size, __VA_ARGS__), KILN_EINVAL)

/* r->act, alpha, beta from the activations list (or the defaults). */
static kiln_status parse_acts(const ir_node *n, ir_rnn *r, char *why, size_t size)
{
	static const int dflt[3][3] = {{IR_ACT_TANH},
	                               {IR_ACT_SIGMOID, IR_ACT_TANH},
	                               {IR_ACT_SIGMOID, IR_ACT_TANH, IR_ACT_TANH}};
	const char *s = ir_attr_str(n, "activations", NULL);
	const double *al = NULL, *be = NULL;
	const ir_attr *aa = ir_attr_get(n, "activation_alpha"), *ba = ir_attr_get(n, "activation_beta");
	uint32_t nal = aa ? aa->n : 0, nbe = ba ? ba->n : 0, ia = 0, ib = 0;
	al = aa ? aa->u.floats : NULL, be = ba ? ba->u.floats : NULL;
	int cnt = 0, total = r->nact * r->ndir;
	bool given = s != NULL;
	while (s && *s && cnt <= total) {
		const char *e = strchr(s, ',');
		size_t len = e ? (size_t)(e - s) : strlen(s);
		if (cnt == total)
			return WHY("activations '%s' lists more than %d functions", ir_attr_str(n, "activations", ""), total);
		int k = act_of(s, len);
		if (k < 0)
			return WHY("activation '%.*s' is not one kiln takes (Relu, Tanh, Sigmoid, "
			           "Softsign, Softplus, LeakyRelu, ThresholdedRelu, Elu, HardSigmoid, "
			           "Affine, ScaledTanh)", (int)len, s);
		r->act[cnt++] = k;
		s = e ? e + 1 : NULL;
	}
	if (given && cnt != r->nact && cnt != total)
		return WHY("activations lists %d functions; %s takes %d per direction (%d here)", cnt,
		           ir_op(n->op)->onnx, r->nact, total);
	for (int k = 0; k < total; k++) {
		if (!given)
			r->act[k] = dflt[r->cell][k % r->nact];
		else if (k >= cnt) /* one direction's list serves both */
			r->act[k] = r->act[k - r->nact];
		int a = r->act[k];
		r->alpha[k] = act_info[a].alpha_dflt, r->beta[k] = act_info[a].beta_dflt;
		if (given && k >= cnt) {
			r->alpha[k] = r->alpha[k - r->nact], r->beta[k] = r->beta[k - r->nact];
			continue;
		}
		if (act_info[a].alpha && ia < nal)
			r->alpha[k] = al[ia++];
		if (act_info[a].beta && ib < nbe)
			r->beta[k] = be[ib++];
	}
	return KILN_OK;
}

kiln_status ir_rnn_parse(const ir_node *n, ir_rnn *r, char *why, size_t size)
{
	memset(r, 0, sizeof *r);
	r->cell = n->op == KILN_OP_LSTM ? IR_RNN_CELL_LSTM
	        : n->op == KILN_OP_GRU ? IR_RNN_CELL_GRU : IR_RNN_CELL_RNN;
	r->gates = (int[]){1, 3, 4}[r->cell];
	r->nact = (int[]){1, 2, 3}[r->cell];
	const char *dir = ir_attr_str(n, "direction", "forward");
	r->reverse = !strcmp(dir, "reverse");
	r->ndir = !strcmp(dir, "bidirectional") ? 2 : 1;
	if (r->ndir == 1 && !r->reverse && strcmp(dir, "forward"))
		return WHY("direction '%s' is not forward, reverse or bidirectional", dir);
	r->layout = (int)ir_attr_int(n, "layout", 0);
	if (r->layout != 0 && r->layout != 1)
		return WHY("layout %d is not 0 or 1", r->layout);
	r->lbr = ir_attr_int(n, "linear_before_reset", 0) != 0;
	r->input_forget = ir_attr_int(n, "input_forget", 0) != 0;
	r->clip = ir_attr_float(n, "clip", 0);
	if (ir_attr_get(n, "clip") && !(r->clip > 0))
		return WHY("clip %g must be positive", r->clip);
	r->hidden = ir_attr_int(n, "hidden_size", 0);
	if (r->hidden < 1 || r->hidden > (INT64_C(1) << 24))
		return WHY("hidden_size %lld", (long long)r->hidden);
	for (int k = 0; k < 8; k++)
		r->in[k] = k < 3 ? k : -1;
	const int64_t *pos = NULL;
	uint32_t np = ir_attr_ints(n, "inputs", &pos);
	int maxpos = r->cell == IR_RNN_CELL_LSTM ? IR_RNN_P : IR_RNN_H0;
	if (np && np != n->nin - 3)
		return WHY("inputs lists %u positions for %u optional inputs", np, n->nin - 3);
	for (uint32_t i = 3, last = 2; i < n->nin; i++) {
		int64_t p = np ? pos[i - 3] : (int64_t)i;
		if (p <= last || p > maxpos)
			return WHY("input %u's ONNX position %lld is not after %u and at most %d", i,
			           (long long)p, last, maxpos);
		r->in[p] = (int)i, last = (uint32_t)p;
	}
	return parse_acts(n, r, why, size);
}

/* ---- shape rule -------------------------------------------------------------- */

/* Whether dims a and b can be the same size: equal, or either symbolic
 * (bound at run time, where the input check catches a mismatch). */
static bool dim_ok(kiln_graph *g, int64_t a, int64_t b)
{
	return a == b || ir_dim_expr(g, a) || ir_dim_expr(g, b);
}

kiln_status ir_shape_rnn(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out)
{
	ir_rnn r;
	char why[256];
	tbuf a, b, c;
	if (ir_rnn_parse(n, &r, why, sizeof why))
		FAIL(KILN_EINVAL, "%s", why);
	const ir_type *x = &in[0], *w = &in[1], *rr = &in[2];
	if (!kiln_dtype_is_float(x->dtype) || x->rank != 3 || w->rank != 3 || rr->rank != 3 ||
	    w->dtype != x->dtype || rr->dtype != x->dtype)
		FAIL(KILN_ESHAPE, "X, W and R must be 3-D floats of one type: %s, %s, %s", TS(x, a),
		     TS(w, b), TS(rr, c));
	int64_t H = r.hidden, GH = r.gates * H, D = r.ndir;
	int64_t T = x->dim[r.layout ? 1 : 0], N = x->dim[r.layout ? 0 : 1];
	if (w->dim[0] != D || w->dim[1] != GH || !dim_ok(g, w->dim[2], x->dim[2]) ||
	    rr->dim[0] != D || rr->dim[1] != GH || rr->dim[2] != H)
		FAIL(KILN_ESHAPE, "X %s, W %s and R %s do not fit %lld direction(s) of %d gate(s) of "
		     "hidden size %lld", TS(x, a), TS(w, b), TS(rr, c), (long long)D, r.gates,
		     (long long)H);
	static const char *const what[8] = {"", "", "", "B", "sequence_lens", "initial_h",
	                                    "initial_c", "P"};
	for (int p = IR_RNN_B; p <= IR_RNN_P; p++) {
		if (r.in[p] < 0)
			continue;
		const ir_type *t = &in[r.in[p]];
		int64_t want[3] = {D, 2 * GH, 0};
		int rank = 2;
		if (p == IR_RNN_P)
			want[1] = 3 * H;
		if (p == IR_RNN_LENS)
			rank = 1, want[0] = N;
		if (p == IR_RNN_H0 || p == IR_RNN_C0) {
			rank = 3, want[2] = H;
			want[0] = r.layout ? N : D, want[1] = r.layout ? D : N;
		}
		bool ok = t->rank == rank &&
		          (p == IR_RNN_LENS ? t->dtype == KILN_I32 || t->dtype == KILN_I64
		                            : t->dtype == x->dtype);
		for (int d = 0; ok && d < rank; d++)
			ok = dim_ok(g, t->dim[d], want[d]);
		if (!ok)
			FAIL(KILN_ESHAPE, "%s is %s; it does not fit X %s (%lld direction(s), hidden size "
			     "%lld%s)", what[p], TS(t, a), TS(x, b), (long long)D, (long long)H,
			     p == IR_RNN_LENS ? ", i32 or i64 lengths" : "");
	}
	/* Y [T, D, N, H] or [N, T, D, H]; Y_h, Y_c [D, N, H] or [N, D, H] */
	ir_type y = {x->dtype, 4, {0}}, s = {x->dtype, 3, {0}};
	if (r.layout) {
		y.dim[0] = N, y.dim[1] = T, y.dim[2] = D, y.dim[3] = H;
		s.dim[0] = N, s.dim[1] = D, s.dim[2] = H;
	} else {
		y.dim[0] = T, y.dim[1] = D, y.dim[2] = N, y.dim[3] = H;
		s.dim[0] = D, s.dim[1] = N, s.dim[2] = H;
	}
	out[0] = y;
	for (uint32_t i = 1; i < n->nout; i++)
		out[i] = s;
	return KILN_OK;
}

/* ---- interpreter: the reference loop ------------------------------------------ */

/* The per-run view of a node's tensors and sizes. */
typedef struct run {
	const ir_rnn *r;
	const kiln_tensor *x, *w, *rw, *b, *lens, *h0, *c0, *p;
	kiln_tensor *y, *yh, *yc;
	int64_t T, N, I, H;
	double *h, *c, *g, *hr; /* state [N,H], C [N,H], gates [G H], scratch [H] */
} run;

static double act(const run *s, int dir, int j, double x, bool clip)
{
	const ir_rnn *r = s->r;
	int k = dir * r->nact + j;
	if (clip && r->clip > 0)
		x = fmin(fmax(x, -r->clip), r->clip);
	return ir_rnn_act(r->act[k], r->alpha[k], r->beta[k], x);
}

/* Offsets of X[t, b, 0] and of state row (dir, b) in layout order. */
static int64_t x_off(const run *s, int64_t t, int64_t b)
{
	return (s->r->layout ? b * s->T + t : t * s->N + b) * s->I;
}

static int64_t st_off(const run *s, int d, int64_t b)
{
	return (s->r->layout ? b * s->r->ndir + d : d * s->N + b) * s->H;
}

/* g[k] = X_t W_k^T + Wb_k for gates [k0, k1) of direction d, plus (rec)
 * H R_k^T + Rb_k with hrow as H. */
static void affine(const run *s, int d, int64_t t, int64_t b, int64_t k0, int64_t k1,
                   const double *hrow, bool rec)
{
	int64_t GH = s->r->gates * s->H, xo = x_off(s, t, b);
	for (int64_t k = k0; k < k1; k++) {
		double v = s->b ? ir_load(s->b, d * 2 * GH + k) : 0;
		for (int64_t i = 0; i < s->I; i++)
			v += ir_load(s->x, xo + i) * ir_load(s->w, (d * GH + k) * s->I + i);
		if (rec) {
			v += s->b ? ir_load(s->b, d * 2 * GH + GH + k) : 0;
			for (int64_t j = 0; j < s->H; j++)
				v += hrow[j] * ir_load(s->rw, (d * GH + k) * s->H + j);
		}
		s->g[k] = v;
	}
}

/* One step of direction d at time t for batch row b: updates h, c rows. */
static void step(const run *s, int d, int64_t t, int64_t b)
{
	const ir_rnn *r = s->r;
	int64_t H = s->H;
	double *h = s->h + b * H, *c = s->c + b * H, *g = s->g;
	if (r->cell == IR_RNN_CELL_RNN) {
		affine(s, d, t, b, 0, H, h, true);
		for (int64_t j = 0; j < H; j++)
			h[j] = act(s, d, 0, g[j], true);
	} else if (r->cell == IR_RNN_CELL_GRU) {
		affine(s, d, t, b, 0, 2 * H, h, true);
		for (int64_t j = 0; j < 2 * H; j++)
			g[j] = act(s, d, 0, g[j], true); /* z, r */
		int64_t GH = 3 * H;
		if (r->lbr) {
			affine(s, d, t, b, 2 * H, 3 * H, h, true); /* x_h + H R_h^T + Rb_h + Wb_h */
			for (int64_t j = 0; j < H; j++) { /* split x_h from the recurrent part */
				double rec = s->b ? ir_load(s->b, d * 2 * GH + GH + 2 * H + j) : 0;
				for (int64_t i = 0; i < H; i++)
					rec += h[i] * ir_load(s->rw, (d * GH + 2 * H + j) * H + i);
				s->hr[j] = g[H + j] * rec + (g[2 * H + j] - rec);
			}
		} else {
			for (int64_t i = 0; i < H; i++)
				s->hr[i] = g[H + i] * h[i];
			affine(s, d, t, b, 2 * H, 3 * H, s->hr, true);
			for (int64_t j = 0; j < H; j++)
				s->hr[j] = g[2 * H + j];
		}
		for (int64_t j = 0; j < H; j++) {
			double hh = act(s, d, 1, s->hr[j], true);
			s->hr[j] = hh + g[j] * (h[j] - hh);
		}
		memcpy(h, s->hr, (size_t)H * sizeof *h);
	} else { /* LSTM: gates i, o, f, c */
		affine(s, d, t, b, 0, 4 * H, h, true);
		for (int64_t j = 0; j < H; j++) {
			double pi = s->p ? ir_load(s->p, d * 3 * H + j) : 0;
			double po = s->p ? ir_load(s->p, d * 3 * H + H + j) : 0;
			double pf = s->p ? ir_load(s->p, d * 3 * H + 2 * H + j) : 0;
			double i = act(s, d, 0, g[j] + pi * c[j], true);
			double f = r->input_forget ? 1 - i : act(s, d, 0, g[2 * H + j] + pf * c[j], true);
			double cc = act(s, d, 1, g[3 * H + j], true);
			double nc = f * c[j] + i * cc;
			double o = act(s, d, 0, g[H + j] + po * nc, true);
			c[j] = nc;
			s->hr[j] = o * act(s, d, 2, nc, false);
		}
		memcpy(h, s->hr, (size_t)H * sizeof *h);
	}
}

/* Direction d over every step. */
static void run_dir(const run *s, int d)
{
	const ir_rnn *r = s->r;
	int64_t H = s->H, N = s->N, D = r->ndir;
	for (int64_t b = 0; b < N; b++)
		for (int64_t j = 0; j < H; j++) {
			s->h[b * H + j] = s->h0 ? ir_load(s->h0, st_off(s, d, b) + j) : 0;
			s->c[b * H + j] = s->c0 ? ir_load(s->c0, st_off(s, d, b) + j) : 0;
		}
	for (int64_t i = 0; i < s->T; i++) {
		int64_t t = ir_rnn_dir_reverse(r, d) ? s->T - 1 - i : i;
		for (int64_t b = 0; b < N; b++) {
			bool on = !s->lens || t < ir_load_i64(s->lens, b);
			if (on)
				step(s, d, t, b);
			int64_t yo = (r->layout ? (b * s->T + t) * D + d : (t * D + d) * N + b) * H;
			for (int64_t j = 0; j < H; j++)
				ir_store(s->y, yo + j, on ? s->h[b * H + j] : 0);
		}
	}
	for (int64_t b = 0; b < N; b++)
		for (int64_t j = 0; j < H; j++) {
			ir_store(s->yh, st_off(s, d, b) + j, s->h[b * H + j]);
			if (s->yc)
				ir_store(s->yc, st_off(s, d, b) + j, s->c[b * H + j]);
		}
}

kiln_status ir_interp_rnn(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                          kiln_tensor *const *out)
{
	ir_rnn r;
	char why[256];
	if (ir_rnn_parse(n, &r, why, sizeof why))
		return ir_fail(c, n, KILN_EINVAL, "%s", why);
	const kiln_tensor *x = in[0];
#define IN(p) (r.in[p] >= 0 ? in[r.in[p]] : NULL)
	run s = {&r, x, in[1], in[2], IN(IR_RNN_B), IN(IR_RNN_LENS), IN(IR_RNN_H0), IN(IR_RNN_C0),
	         IN(IR_RNN_P), out[0], out[1], n->nout > 2 ? out[2] : NULL,
	         x->shape[r.layout ? 1 : 0], x->shape[r.layout ? 0 : 1], x->shape[2], r.hidden,
	         NULL, NULL, NULL, NULL};
#undef IN
	if (s.w->shape[2] != s.I || (s.lens && s.lens->shape[0] != s.N))
		return ir_fail(c, n, KILN_ESHAPE, "W's input size %lld or sequence_lens' length "
		               "does not fit X", (long long)s.w->shape[2]);
	for (int64_t b = 0; s.lens && b < s.N; b++) {
		int64_t l = ir_load_i64(s.lens, b);
		if (l < 0 || l > s.T)
			return ir_fail(c, n, KILN_EINVAL, "sequence_lens[%lld] is %lld, outside [0, %lld]",
			               (long long)b, (long long)l, (long long)s.T);
	}
	size_t nh = (size_t)(s.N * s.H), ng = (size_t)(r.gates * s.H);
	double *buf = calloc(2 * nh + ng + (size_t)s.H, sizeof *buf);
	if (!buf)
		return ir_fail(c, n, KILN_ENOMEM, "out of memory");
	s.h = buf, s.c = buf + nh, s.g = buf + 2 * nh, s.hr = buf + 2 * nh + ng;
	for (int d = 0; d < r.ndir; d++)
		run_dir(&s, d);
	free(buf);
	return KILN_OK;
}
