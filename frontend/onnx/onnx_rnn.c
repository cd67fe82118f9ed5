/*
 * onnx_rnn.c: ONNX's recurrent ops RNN, GRU and LSTM (opsets 7 to 17).
 * When the sequence length (X's time dim) is symbolic, the node becomes
 * kiln's fused op of the same name (ir/rnn.c; import_fused below), which
 * runs and compiles for any T.  When it is a number, the recurrence is
 * unrolled over the time steps into kiln's own ops, as below (the same
 * composition passes/rnn_unroll.c builds from a fused node for autodiff);
 * a symbolic batch is fine either way.  Per direction (forward, reverse, or
 * both, concatenated on the num_directions axis):
 *
 *   XW = X W^T + Wb                 one MatMul for every step, [.., G H]
 *   per step t (t = 0.. or ..0):
 *     x = Gather(XW, t)              on the time axis (layout 0 or 1)
 *     g = x + Gemm(H, R, Rb, transB) the recurrent part, [batch, G H]
 *     the gates: Slices of g, with clip and the activations
 *     RNN   H = f(g)
 *     GRU   z, r = f(..), h = g(x_h + (r H) R_h^T + Rb_h), or with
 *           linear_before_reset g(x_h + r (H R_h^T + Rb_h)); H = h + z (H - h)
 *     LSTM  i, o, f, c (P: peepholes on C; input_forget: f = 1 - i),
 *           C = f C + i g(c), H = o h(C)
 *   sequence_lens: past a row's length H and C keep their value and Y is
 *     0 (Where on a [batch, 1] mask per step: a Constant when the lengths
 *     are known at import, else Less(t, lengths));
 *   Y    the steps' H (masked), concatenated on the time axis
 *   Y_h  the last H, Y_c the last C
 *
 * initial_h / initial_c absent (or all zeros) are a [1, hidden] zero that
 * broadcasts.
 * clip bounds the inputs of the gates' activations, not the cell state
 * LSTM's h() reads (ONNX Runtime's reading of the spec).
 * Activations are kiln's unary ops (Relu, Tanh, Sigmoid, LeakyRelu,
 * ThresholdedRelu, HardSigmoid, Elu, Softsign, Softplus) or Affine and
 * ScaledTanh as Mul/Add; activation_alpha and activation_beta are taken in
 * order by the activations that have such a parameter, as ONNX Runtime
 * does.  Each output's last node is named after the ONNX output, so that
 * export writes the composition and re-import gives the same graph.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "frontend/onnx/onnx.h"
#include "ir/ir.h"

#define MAX_STEPS (1 << 16) /* per direction: each is ~25 nodes */

/* ---- node helpers (as onnx_compose.c's) ----------------------------------- */

/* An extra node op(in) named "<d>/<suffix>", inferred; its result, or 0 on a
 * problem (any input 0 gives 0). */
static uint32_t op_n(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t nin, const uint32_t *in,
                     const char *suffix)
{
	for (uint32_t i = 0; i < nin; i++)
		if (!in[i] || d->failed)
			return 0;
	ir_node *n = onnx_extra(c, d, op, nin, in, suffix);
	if (!n || !onnx_infer(c, d, n)) {
		d->failed = true;
		return 0;
	}
	return n->out[0];
}

static uint32_t u1(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t a, const char *suffix)
{
	return op_n(c, d, op, 1, &a, suffix);
}

static uint32_t b2(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t a, uint32_t b, const char *suffix)
{
	return op_n(c, d, op, 2, (uint32_t[]){a, b}, suffix);
}

/* The same with attributes: set(n) before inference. */
typedef struct attrs {
	const char *ints_name; /* one ints attribute */
	uint32_t nints;
	const int64_t *ints;
	const char *int_name;  /* one int attribute */
	int64_t ival;
	const char *f1_name, *f2_name; /* up to two float attributes */
	double f1, f2;
} attrs;

static uint32_t op_a(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t nin, const uint32_t *in,
                     const attrs *a, const char *suffix)
{
	for (uint32_t i = 0; i < nin; i++)
		if (!in[i] || d->failed)
			return 0;
	ir_node *n = onnx_extra(c, d, op, nin, in, suffix);
	kiln_graph *g = c->g;
	if (!n || (a->ints_name && ir_attr_set_ints(g, n, a->ints_name, a->nints, a->ints)) ||
	    (a->int_name && ir_attr_set_int(g, n, a->int_name, a->ival)) ||
	    (a->f1_name && ir_attr_set_float(g, n, a->f1_name, a->f1)) ||
	    (a->f2_name && ir_attr_set_float(g, n, a->f2_name, a->f2)) || !onnx_infer(c, d, n)) {
		d->failed = true;
		return 0;
	}
	return n->out[0];
}

/* A Constant holding t (an arena tensor of c->g). */
static uint32_t tconst(onnx_imp *c, onnx_nd *d, kiln_tensor *t, const char *suffix)
{
	ir_node *k = t && !d->failed ? onnx_extra(c, d, KILN_OP_CONSTANT, 0, NULL, suffix) : NULL;
	if (!k || ir_attr_set_tensor(c->g, k, "value", t) || !onnx_infer(c, d, k)) {
		d->failed = true;
		return 0;
	}
	return k->out[0];
}

/* A Constant of dtype dt and shape [n0] or [n0, n1] (rank 0..2) filled with v. */
static uint32_t kfill(onnx_imp *c, onnx_nd *d, kiln_dtype dt, int rank, int64_t n0, int64_t n1,
                      double v, const char *suffix)
{
	int64_t shape[2] = {n0, n1};
	kiln_tensor *t = d->failed ? NULL : ir_tensor_new(c->g, dt, rank, shape);
	int64_t n = (rank > 0 ? n0 : 1) * (rank > 1 ? n1 : 1);
	for (int64_t i = 0; t && i < n; i++) {
		if (dt == KILN_I64)
			ir_store_i64(t, i, (int64_t)v);
		else
			ir_store(t, i, v);
	}
	if (!t)
		d->failed = true;
	return tconst(c, d, t, suffix);
}

/* x[..., lo:hi, ...] on axis. */
static uint32_t slice(onnx_imp *c, onnx_nd *d, uint32_t x, int64_t axis, int64_t lo, int64_t hi,
                      const char *suffix)
{
	if (!x || d->failed)
		return 0;
	ir_node *n = onnx_extra(c, d, KILN_OP_SLICE, 1, &x, suffix);
	if (!n || ir_attr_set_ints(c->g, n, "starts", 1, &lo) ||
	    ir_attr_set_ints(c->g, n, "ends", 1, &hi) ||
	    ir_attr_set_ints(c->g, n, "axes", 1, &axis) || !onnx_infer(c, d, n)) {
		d->failed = true;
		return 0;
	}
	return n->out[0];
}

/* Gather(x, idx) on axis (0 left unset: the default). */
static uint32_t gather(onnx_imp *c, onnx_nd *d, uint32_t x, uint32_t idx, int64_t axis,
                       const char *suffix)
{
	attrs a = {.int_name = axis ? "axis" : NULL, .ival = axis};
	return op_a(c, d, KILN_OP_GATHER, 2, (uint32_t[]){x, idx}, &a, suffix);
}

static uint32_t unsqueeze(onnx_imp *c, onnx_nd *d, uint32_t x, uint32_t n, const int64_t *axes,
                          const char *suffix)
{
	attrs a = {.ints_name = "axes", .nints = n, .ints = axes};
	return op_a(c, d, KILN_OP_UNSQUEEZE, 1, &x, &a, suffix);
}

static uint32_t concat(onnx_imp *c, onnx_nd *d, uint32_t n, const uint32_t *in, int64_t axis,
                       const char *suffix)
{
	attrs a = {.int_name = "axis", .ival = axis};
	return op_a(c, d, KILN_OP_CONCAT, n, in, &a, suffix);
}

/* ---- activations ------------------------------------------------------------ */

enum { ACT_OP, ACT_AFFINE, ACT_SCALED_TANH };

typedef struct act {
	int kind;
	kiln_op op;                /* ACT_OP */
	const char *alpha_name, *beta_name; /* the kiln attribute each sets */
	double alpha, beta;
	double alpha_dflt, beta_dflt; /* kiln's schema defaults (left unset) */
} act;

static const struct {
	const char *name;
	int kind;
	kiln_op op;
	bool alpha, beta;          /* takes activation_alpha / _beta */
	double alpha_dflt, beta_dflt;
} act_table[] = {
	{"Relu", ACT_OP, KILN_OP_RELU, false, false, 0, 0},
	{"Tanh", ACT_OP, KILN_OP_TANH, false, false, 0, 0},
	{"Sigmoid", ACT_OP, KILN_OP_SIGMOID, false, false, 0, 0},
	{"Softsign", ACT_OP, KILN_OP_SOFTSIGN, false, false, 0, 0},
	{"Softplus", ACT_OP, KILN_OP_SOFTPLUS, false, false, 0, 0},
	{"LeakyRelu", ACT_OP, KILN_OP_LEAKY_RELU, true, false, 0.01, 0},
	{"ThresholdedRelu", ACT_OP, KILN_OP_THRESHOLDED_RELU, true, false, 1, 0},
	{"Elu", ACT_OP, KILN_OP_ELU, true, false, 1, 0},
	{"HardSigmoid", ACT_OP, KILN_OP_HARD_SIGMOID, true, true, 0.2, 0.5},
	{"Affine", ACT_AFFINE, KILN_OP_COUNT, true, true, 1, 0},
	{"ScaledTanh", ACT_SCALED_TANH, KILN_OP_COUNT, true, true, 1, 1},
};

/* The activations of d: nper per direction, ndir directions (the defaults,
 * or the attribute's, one direction's list serving both); false after a
 * problem. */
static bool read_acts(onnx_imp *c, onnx_nd *d, int nper, int ndir, const char *const *dflt,
                      act *out)
{
	const Onnx__AttributeProto *a = onnx_attr(d, "activations");
	const Onnx__AttributeProto *al = onnx_attr(d, "activation_alpha");
	const Onnx__AttributeProto *be = onnx_attr(d, "activation_beta");
	size_t n = a ? a->n_strings : 0, ia = 0, ib = 0;
	if (a && n != (size_t)(nper * ndir) && n != (size_t)nper)
		return onnx_problem(c, d, KILN_EINVAL, "activations lists %zu functions; %s takes %d "
		                    "per direction (%d here)", n, d->p->op_type, nper, nper * ndir),
		       false;
	for (int k = 0; k < nper * ndir; k++) {
		char name[32] = "";
		if (a && (size_t)k >= n) { /* one direction's list: the second is the first */
			out[k] = out[k - nper];
			continue;
		}
		if (!a)
			snprintf(name, sizeof name, "%s", dflt[k % nper]);
		else if (a->strings[k].len < sizeof name)
			memcpy(name, a->strings[k].data, a->strings[k].len), name[a->strings[k].len] = 0;
		size_t t = 0, nt = sizeof act_table / sizeof *act_table;
		while (t < nt && strcasecmp(name, act_table[t].name))
			t++;
		if (t == nt)
			return onnx_problem(c, d, KILN_EUNSUPPORTED, "activation '%.*s' is not one kiln "
			                    "imports (Relu, Tanh, Sigmoid, LeakyRelu, ThresholdedRelu, "
			                    "HardSigmoid, Elu, Softsign, Softplus, Affine, ScaledTanh)",
			                    (int)(a ? a->strings[k].len : 0),
			                    a ? (const char *)a->strings[k].data : ""),
			       false;
		act *x = &out[k];
		*x = (act){act_table[t].kind, act_table[t].op, NULL, NULL, act_table[t].alpha_dflt,
		           act_table[t].beta_dflt, act_table[t].alpha_dflt, act_table[t].beta_dflt};
		if (act_table[t].alpha && al && ia < al->n_floats)
			x->alpha = al->floats[ia++];
		if (act_table[t].beta && be && ib < be->n_floats)
			x->beta = be->floats[ib++];
		if (x->kind == ACT_OP) {
			x->alpha_name = act_table[t].alpha ? "alpha" : NULL;
			x->beta_name = act_table[t].beta ? "beta" : NULL;
		}
	}
	return true;
}

/* An activation of x (clip first when clip > 0); suffix names the result. */
static uint32_t activate(onnx_imp *c, onnx_nd *d, const act *f, double clip, uint32_t x,
                         const char *suffix)
{
	char sfx[256];
	kiln_dtype dt = x ? c->g->val[x]->type.dtype : KILN_F32;
	if (clip > 0) {
		snprintf(sfx, sizeof sfx, "%s_clip", suffix);
		attrs a = {.f1_name = "min", .f1 = -clip, .f2_name = "max", .f2 = clip};
		x = op_a(c, d, KILN_OP_CLIP, 1, &x, &a, sfx);
	}
	if (f->kind == ACT_OP) { /* parameters equal to the default left unset */
		bool sa = f->alpha_name && (float)f->alpha != (float)f->alpha_dflt;
		bool sb = f->beta_name && (float)f->beta != (float)f->beta_dflt;
		attrs a = {.f1_name = sa ? f->alpha_name : NULL, .f1 = f->alpha,
		           .f2_name = sb ? f->beta_name : NULL, .f2 = f->beta};
		return op_a(c, d, f->op, 1, &x, &a, suffix);
	}
	char s1[256], s2[256], s3[256];
	snprintf(s1, sizeof s1, "%s_alpha", suffix);
	snprintf(s2, sizeof s2, "%s_beta", suffix);
	if (f->kind == ACT_AFFINE) { /* alpha x + beta */
		snprintf(s3, sizeof s3, "%s_scaled", suffix);
		uint32_t y = b2(c, d, KILN_OP_MUL, x, kfill(c, d, dt, 0, 0, 0, f->alpha, s1), s3);
		return b2(c, d, KILN_OP_ADD, y, kfill(c, d, dt, 0, 0, 0, f->beta, s2), suffix);
	}
	/* ScaledTanh: alpha tanh(beta x) */
	snprintf(s3, sizeof s3, "%s_in", suffix);
	uint32_t y = b2(c, d, KILN_OP_MUL, x, kfill(c, d, dt, 0, 0, 0, f->beta, s2), s3);
	snprintf(s3, sizeof s3, "%s_tanh", suffix);
	y = u1(c, d, KILN_OP_TANH, y, s3);
	return b2(c, d, KILN_OP_MUL, y, kfill(c, d, dt, 0, 0, 0, f->alpha, s1), suffix);
}

/* ---- the unrolled recurrence ---------------------------------------------- */

enum { CELL_RNN, CELL_GRU, CELL_LSTM };

typedef struct rnn {
	int cell, gates, nact;      /* G: 1, 3, 4 gates */
	int ndir, layout;
	int64_t seq, hidden;
	kiln_dtype dt;
	double clip;
	bool lbr, input_forget;
	act acts[6];
	/* inputs (0: absent) */
	uint32_t x, w, r, b, lens, h0, c0, p;
	const kiln_tensor *lens_k;  /* sequence_lens known at import */
	uint32_t *tidx;             /* per step: its index Constant */
	uint32_t lens_col;          /* runtime lengths as [batch, 1] */
	uint32_t zero;              /* scalar 0 of dt */
	uint32_t one;               /* scalar 1 of dt (input_forget) */
} rnn;

/* What one direction computes: the steps' Y (in time order), the last H, C. */
typedef struct dir_out {
	uint32_t y, h, c;
} dir_out;

/* Suffix "<dir>/<what>" or "<dir>/t<t>/<what>" in buf. */
static const char *sfx(char *buf, size_t size, const char *dir, int64_t t, const char *what)
{
	if (t < 0)
		snprintf(buf, size, "%s/%s", dir, what);
	else
		snprintf(buf, size, "%s/t%lld/%s", dir, (long long)t, what);
	return buf;
}

/* sfx into a buffer of its own (a compound literal per use), so that
 * suffixes built in one expression do not overwrite each other. */
#define NM(dir, t, what) sfx((char[256]){""}, 256, dir, t, what)

/* The [batch, 1] mask of step t: a Constant, or Less(t, lengths); 0 when
 * every row runs at t (no masking). */
static uint32_t step_mask(onnx_imp *c, onnx_nd *d, rnn *s, int64_t t, const char *dir)
{
	char b[256];
	if (!s->lens)
		return 0;
	if (s->lens_k) {
		int64_t nb = kiln_tensor_numel(s->lens_k);
		bool all = true;
		for (int64_t i = 0; i < nb; i++)
			all = all && t < ir_load_i64(s->lens_k, i);
		if (all)
			return 0;
		kiln_tensor *m = ir_tensor_new(c->g, KILN_BOOL, 2, (int64_t[]){nb, 1});
		for (int64_t i = 0; m && i < nb; i++)
			ir_store(m, i, t < ir_load_i64(s->lens_k, i));
		if (!m)
			d->failed = true;
		return tconst(c, d, m, sfx(b, sizeof b, dir, t, "mask"));
	}
	kiln_dtype lt = c->g->val[s->lens]->type.dtype;
	uint32_t k = kfill(c, d, lt, 0, 0, 0, (double)t, sfx(b, sizeof b, dir, t, "step"));
	return b2(c, d, KILN_OP_LESS, k, s->lens_col, sfx(b, sizeof b, dir, t, "mask"));
}

/* Runs direction k (0: forward in time, unless the op is reverse-only; 1:
 * reverse) and returns its outputs. */
static dir_out run_dir(onnx_imp *c, onnx_nd *d, rnn *s, int k, bool reverse)
{
	dir_out o = {0, 0, 0};
	const char *dn = reverse ? "rev" : "fwd";
	int64_t H = s->hidden, GH = s->gates * H, taxis = s->layout ? 1 : 0;
	const act *f = &s->acts[k * s->nact], *g = f + 1, *hact = f + 2;
	kiln_graph *gr = c->g;
	uint32_t dk = kfill(c, d, KILN_I64, 0, 0, 0, (double)k, NM(dn, -1, "index"));
	/* weights of this direction */
	uint32_t w = gather(c, d, s->w, dk, 0, NM(dn, -1, "W"));
	uint32_t r = gather(c, d, s->r, dk, 0, NM(dn, -1, "R"));
	uint32_t bias = s->b ? gather(c, d, s->b, dk, 0, NM(dn, -1, "B")) : 0;
	uint32_t wt = 0;
	{
		attrs a = {.ints_name = "perm", .nints = 2, .ints = (int64_t[]){1, 0}};
		wt = op_a(c, d, KILN_OP_TRANSPOSE, 1, &w, &a, NM(dn, -1, "W_T"));
	}
	uint32_t xw = b2(c, d, KILN_OP_MATMUL, s->x, wt, NM(dn, -1, "XW"));
	if (s->b)
		xw = b2(c, d, KILN_OP_ADD, xw, slice(c, d, bias, 0, 0, GH, NM(dn, -1, "Wb")),
		        NM(dn, -1, "XW_b"));
	/* the recurrent weights and biases: GRU's h gate apart */
	int64_t GR = s->cell == CELL_GRU ? 2 * H : GH;
	uint32_t rg = s->cell == CELL_GRU ? slice(c, d, r, 0, 0, GR, NM(dn, -1, "R_zr")) : r;
	uint32_t rh = s->cell == CELL_GRU ? slice(c, d, r, 0, GR, GH, NM(dn, -1, "R_h")) : 0;
	uint32_t rbg = s->b ? slice(c, d, bias, 0, GH, GH + GR, NM(dn, -1, "Rb")) : 0;
	uint32_t rbh = s->b && s->cell == CELL_GRU
	               ? slice(c, d, bias, 0, GH + GR, 2 * GH, NM(dn, -1, "Rb_h")) : 0;
	uint32_t pi = 0, po = 0, pf = 0;
	if (s->p) {
		uint32_t p = gather(c, d, s->p, dk, 0, NM(dn, -1, "P"));
		pi = slice(c, d, p, 0, 0, H, NM(dn, -1, "P_i"));
		po = slice(c, d, p, 0, H, 2 * H, NM(dn, -1, "P_o"));
		pf = slice(c, d, p, 0, 2 * H, 3 * H, NM(dn, -1, "P_f"));
	}
	/* the initial state: given ([dirs, batch, hidden], batch first in
	 * layout 1), or a [1, hidden] zero */
	uint32_t h = s->h0 ? gather(c, d, s->h0, dk, s->layout, NM(dn, -1, "H0"))
	                   : kfill(c, d, s->dt, 2, 1, H, 0, NM(dn, -1, "H0"));
	uint32_t cs = 0;
	if (s->cell == CELL_LSTM)
		cs = s->c0 ? gather(c, d, s->c0, dk, s->layout, NM(dn, -1, "C0"))
		           : kfill(c, d, s->dt, 2, 1, H, 0, NM(dn, -1, "C0"));
	uint32_t *ys = ir_alloc(gr->arena, (size_t)s->seq * sizeof *ys);
	if (!ys)
		return onnx_problem(c, d, KILN_ENOMEM, "out of memory"), o;
	const attrs tb = {.int_name = "transB", .ival = 1};
	for (int64_t i = 0; i < s->seq && !d->failed; i++) {
		int64_t t = reverse ? s->seq - 1 - i : i;
#define S(what) NM(dn, t, what)
		uint32_t x = gather(c, d, xw, s->tidx[t], taxis, S("x"));
		uint32_t rec = op_a(c, d, KILN_OP_GEMM, rbg ? 3 : 2, (uint32_t[]){h, rg, rbg}, &tb,
		                    S("rec"));
		uint32_t nh = 0, nc = 0;
		if (s->cell == CELL_RNN) {
			nh = activate(c, d, f, s->clip, b2(c, d, KILN_OP_ADD, x, rec, S("pre")), S("h"));
		} else if (s->cell == CELL_GRU) {
			uint32_t zr = b2(c, d, KILN_OP_ADD, slice(c, d, x, 1, 0, 2 * H, S("x_zr")), rec,
			                 S("zr_pre"));
			uint32_t z = activate(c, d, f, s->clip, slice(c, d, zr, 1, 0, H, S("z_pre")), S("z"));
			uint32_t rr = activate(c, d, f, s->clip, slice(c, d, zr, 1, H, 2 * H, S("r_pre")),
			                       S("r"));
			uint32_t xh = slice(c, d, x, 1, 2 * H, 3 * H, S("x_h")), hr;
			if (s->lbr) {
				hr = op_a(c, d, KILN_OP_GEMM, rbh ? 3 : 2, (uint32_t[]){h, rh, rbh}, &tb,
				          S("rec_h"));
				hr = b2(c, d, KILN_OP_MUL, rr, hr, S("reset_rec_h"));
			} else {
				hr = b2(c, d, KILN_OP_MUL, rr, h, S("reset_h"));
				hr = op_a(c, d, KILN_OP_GEMM, rbh ? 3 : 2, (uint32_t[]){hr, rh, rbh}, &tb,
				          S("rec_h"));
			}
			uint32_t hh = activate(c, d, g, s->clip, b2(c, d, KILN_OP_ADD, xh, hr, S("h_pre")),
			                       S("h_cand"));
			/* (1 - z) hh + z H = hh + z (H - hh) */
			uint32_t dh = b2(c, d, KILN_OP_SUB, h, hh, S("h_delta"));
			nh = b2(c, d, KILN_OP_ADD, hh, b2(c, d, KILN_OP_MUL, z, dh, S("h_keep")), S("h"));
		} else {
			uint32_t gs = b2(c, d, KILN_OP_ADD, x, rec, S("gates"));
			uint32_t gi = slice(c, d, gs, 1, 0, H, S("i_pre"));
			uint32_t go = slice(c, d, gs, 1, H, 2 * H, S("o_pre"));
			uint32_t gc = slice(c, d, gs, 1, 3 * H, 4 * H, S("c_pre"));
			if (s->p)
				gi = b2(c, d, KILN_OP_ADD, gi, b2(c, d, KILN_OP_MUL, pi, cs, S("i_peep")),
				        S("i_pre_peep"));
			uint32_t ii = activate(c, d, f, s->clip, gi, S("i")), ff;
			if (s->input_forget) {
				ff = b2(c, d, KILN_OP_SUB, s->one, ii, S("f"));
			} else {
				uint32_t gf = slice(c, d, gs, 1, 2 * H, 3 * H, S("f_pre"));
				if (s->p)
					gf = b2(c, d, KILN_OP_ADD, gf, b2(c, d, KILN_OP_MUL, pf, cs, S("f_peep")),
					        S("f_pre_peep"));
				ff = activate(c, d, f, s->clip, gf, S("f"));
			}
			uint32_t cc = activate(c, d, g, s->clip, gc, S("c_cand"));
			nc = b2(c, d, KILN_OP_ADD, b2(c, d, KILN_OP_MUL, ff, cs, S("c_keep")),
			        b2(c, d, KILN_OP_MUL, ii, cc, S("c_new")), S("c"));
			if (s->p)
				go = b2(c, d, KILN_OP_ADD, go, b2(c, d, KILN_OP_MUL, po, nc, S("o_peep")),
				        S("o_pre_peep"));
			uint32_t oo = activate(c, d, f, s->clip, go, S("o"));
			/* clip bounds the gates' inputs, not C (as ONNX Runtime) */
			nh = b2(c, d, KILN_OP_MUL, oo, activate(c, d, hact, 0, nc, S("c_act")), S("h"));
		}
		uint32_t m = step_mask(c, d, s, t, dn), y = nh;
		if (m) { /* rows past their length: H, C kept, Y 0 */
			y = op_n(c, d, KILN_OP_WHERE, 3, (uint32_t[]){m, nh, s->zero}, S("y"));
			nh = op_n(c, d, KILN_OP_WHERE, 3, (uint32_t[]){m, nh, h}, S("h_kept"));
			if (nc)
				nc = op_n(c, d, KILN_OP_WHERE, 3, (uint32_t[]){m, nc, cs}, S("c_kept"));
		}
		/* [1, 1, batch, hidden], or [batch, 1, 1, hidden] batch first */
		ys[t] = unsqueeze(c, d, y, 2, s->layout ? (int64_t[]){1, 2} : (int64_t[]){0, 1},
		                  S("y_step"));
		h = nh, cs = nc;
#undef S
	}
	if (d->failed)
		return o;
	o.y = concat(c, d, (uint32_t)s->seq, ys, taxis, NM(dn, -1, "Y"));
	o.h = h, o.c = cs;
	return o;
}

/* The value of ONNX output i, or 0 when it is omitted (""). */
static bool wanted(const onnx_nd *d, size_t i)
{
	return i < d->p->n_output && d->p->output[i] && *d->p->output[i];
}

/* Names the value of ONNX output i after it (the composition's last node of
 * that output) and records it in d->out. */
static void set_output(onnx_imp *c, onnx_nd *d, size_t i, uint32_t v)
{
	if (!v || d->failed)
		return;
	const char *nm = ir_intern(c->g, d->p->output[i]);
	if (!nm)
		return (void)onnx_problem(c, d, KILN_ENOMEM, "out of memory");
	c->g->val[v]->name = nm;
	d->out[i] = v;
	if (d->nout < i + 1)
		d->nout = (uint32_t)i + 1;
}

/* An output made of per-direction values: Unsqueeze of each on the
 * num_directions axis, Concat when there are two; the last node is named
 * by set_output. */
static uint32_t stack_dirs(onnx_imp *c, onnx_nd *d, const rnn *s, const uint32_t *v,
                           const char *what)
{
	char b[300], nm[256];
	int64_t axis = s->layout ? 1 : 0;
	uint32_t u[2];
	for (int k = 0; k < s->ndir; k++) {
		if (s->ndir == 1)
			snprintf(nm, sizeof nm, "%s", what);
		else
			snprintf(nm, sizeof nm, "%s/%s", k ? "rev" : "fwd", what);
		snprintf(b, sizeof b, "%s_dir", nm);
		u[k] = unsqueeze(c, d, v[k], 1, &axis, s->ndir == 1 ? what : b);
	}
	return s->ndir == 1 ? u[0] : concat(c, d, 2, u, axis, what);
}

/* Whether v is all zeros: a known constant, or an Expand of one (a zero
 * state of symbolic batch, as torch writes it); such an initial state is
 * the absent one, and its Expand is left unused. */
static bool all_zero(onnx_imp *c, uint32_t v)
{
	const ir_value *val = v ? c->g->val[v] : NULL;
	const kiln_tensor *t = v ? onnx_const(c, v) : NULL;
	if (!t && val && val->kind == IR_V_NODE && val->def && val->def->op == KILN_OP_EXPAND)
		t = onnx_const(c, val->def->in[0]);
	for (int64_t i = 0; t && i < kiln_tensor_numel(t); i++)
		if (ir_load(t, i) != 0)
			return false;
	return t != NULL;
}

/* Whether optional input v (0: absent) has the rank and dims want (-1:
 * any, the batch) and dtype dt (X's); a problem naming it when not. */
static bool fits(onnx_imp *c, onnx_nd *d, uint32_t v, const char *what, kiln_dtype dt,
                 int rank, const int64_t *want)
{
	const ir_type *t = v ? &c->g->val[v]->type : NULL;
	bool ok = !t || (t->rank == rank && t->dtype == dt);
	for (int i = 0; t && ok && i < rank; i++)
		ok = want[i] < 0 || ir_dim_expr(c->g, t->dim[i]) || t->dim[i] == want[i];
	if (!ok) {
		char ty[256], sh[160] = "";
		for (int i = 0; i < rank; i++) {
			char one[32] = "batch";
			if (want[i] >= 0)
				snprintf(one, sizeof one, "%lld", (long long)want[i]);
			snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%s", i ? ", " : "", one);
		}
		onnx_problem(c, d, KILN_ESHAPE, "%s is %s; it must be [%s] of X's type", what,
		             ir_type_str(c->g, t, ty, sizeof ty), sh);
	}
	return ok;
}

/* ---- the fused op (a symbolic sequence length) ------------------------------- */

/* d as one kiln RNN, GRU or LSTM node (ir/rnn.c) reading s's inputs, an
 * all-zero initial state left out as the unroller leaves it out; the
 * attributes copied by the schema, activations joined by commas (unset
 * when they are the op's defaults), hidden_size set from R when ONNX's is
 * absent, and `inputs` naming the optional inputs' positions unless they
 * are 3, 4, ... in order. */
static void import_fused(onnx_imp *c, onnx_nd *d, const rnn *s)
{
	static const char *const skip[] = {"activations", NULL};
	static const char *const dflt[3][2] = {{"Tanh", "Tanh,Tanh"},
	                                       {"Sigmoid,Tanh", "Sigmoid,Tanh,Sigmoid,Tanh"},
	                                       {"Sigmoid,Tanh,Tanh",
	                                        "Sigmoid,Tanh,Tanh,Sigmoid,Tanh,Tanh"}};
	uint32_t opt[5] = {s->b, s->lens, s->h0, s->c0, s->p};
	uint32_t in[8] = {s->x, s->w, s->r}, nin = 3;
	int64_t pos[5];
	bool positional = true;
	for (int k = 0; k < 5; k++)
		if (opt[k]) {
			pos[nin - 3] = IR_RNN_B + k;
			positional = positional && nin == (uint32_t)(IR_RNN_B + k);
			in[nin++] = opt[k];
		}
	if (!onnx_emit_with(c, d, nin, in, skip))
		return;
	kiln_graph *g = c->g;
	ir_node *n = d->n;
	if ((!positional && ir_attr_set_ints(g, n, "inputs", nin - 3, pos)) ||
	    (!onnx_attr(d, "hidden_size") && ir_attr_set_int(g, n, "hidden_size", s->hidden)))
		return (void)(d->failed = true);
	char acts[256] = "";
	const char *nm[6];
	const Onnx__AttributeProto *a = onnx_attr(d, "activations");
	for (size_t k = 0; a && k < a->n_strings && k < 6; k++) {
		nm[k] = NULL;
		for (int j = 0; j < IR_ACT_COUNT; j++)
			if (strlen(ir_rnn_act_names[j]) == a->strings[k].len &&
			    !strncasecmp((const char *)a->strings[k].data, ir_rnn_act_names[j],
			                 a->strings[k].len))
				nm[k] = ir_rnn_act_names[j];
		if (!nm[k]) /* read_acts named it already */
			return (void)(d->failed = true);
		snprintf(acts + strlen(acts), sizeof acts - strlen(acts), "%s%s", k ? "," : "", nm[k]);
	}
	if (a && strcmp(acts, dflt[s->cell][0]) && strcmp(acts, dflt[s->cell][1]) &&
	    ir_attr_set_string(g, n, "activations", acts))
		d->failed = true;
}

/* The shared import: cell picks RNN, GRU or LSTM. */
static void import_rnn(onnx_imp *c, onnx_nd *d, int cell)
{
	static const char *const dflt_acts[3][3] = {
		{"Tanh"}, {"Sigmoid", "Tanh"}, {"Sigmoid", "Tanh", "Tanh"}};
	static const int gates[3] = {1, 3, 4}, nact[3] = {1, 2, 3};
	const char *op = d->p->op_type;
	rnn s = {.cell = cell, .gates = gates[cell], .nact = nact[cell]};
	if (c->opset < 7)
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "kiln imports %s from opset 7 "
		                          "(earlier versions have other attributes)", op);
	/* direction, layout, attributes */
	const Onnx__AttributeProto *da = onnx_attr(d, "direction");
	char dir[32] = "forward";
	if (da && da->s.len < sizeof dir)
		memcpy(dir, da->s.data, da->s.len), dir[da->s.len] = 0;
	else if (da)
		dir[0] = 0;
	bool fwd = !strcmp(dir, "forward"), rev = !strcmp(dir, "reverse");
	bool bi = !strcmp(dir, "bidirectional");
	if (!fwd && !rev && !bi)
		return (void)onnx_problem(c, d, KILN_EINVAL, "direction '%s' is not forward, reverse "
		                          "or bidirectional", dir);
	s.ndir = bi ? 2 : 1;
	const Onnx__AttributeProto *la = onnx_attr(d, "layout"), *ca = onnx_attr(d, "clip");
	const Onnx__AttributeProto *ha = onnx_attr(d, "hidden_size");
	s.layout = la ? (int)la->i : 0;
	s.clip = ca ? ca->f : 0;
	s.lbr = cell == CELL_GRU && onnx_attr(d, "linear_before_reset") &&
	        onnx_attr(d, "linear_before_reset")->i;
	s.input_forget = cell == CELL_LSTM && onnx_attr(d, "input_forget") &&
	                 onnx_attr(d, "input_forget")->i;
	if (la && la->i != 0 && la->i != 1)
		return (void)onnx_problem(c, d, KILN_EINVAL, "layout %lld is not 0 or 1",
		                          (long long)la->i);
	if (ca && !(ca->f > 0))
		return (void)onnx_problem(c, d, KILN_EINVAL, "clip %g must be positive", ca->f);
	if (!read_acts(c, d, s.nact, s.ndir, dflt_acts[cell], s.acts))
		return;
	/* inputs: X, W, R, B, sequence_lens, initial_h, (LSTM) initial_c, P */
	s.x = onnx_input(c, d, 0, true);
	s.w = onnx_input(c, d, 1, true);
	s.r = onnx_input(c, d, 2, true);
	s.b = onnx_input(c, d, 3, false);
	s.lens = onnx_input(c, d, 4, false);
	s.h0 = onnx_input(c, d, 5, false);
	if (cell == CELL_LSTM) {
		s.c0 = onnx_input(c, d, 6, false);
		s.p = onnx_input(c, d, 7, false);
	} else if (d->p->n_input > 6 && !d->failed) {
		return (void)onnx_problem(c, d, KILN_EINVAL, "%zu inputs; %s takes at most 6",
		                          d->p->n_input, op);
	}
	if (d->failed)
		return;
	if (all_zero(c, s.h0))
		s.h0 = 0;
	if (all_zero(c, s.c0))
		s.c0 = 0;
	const ir_type *xt = &c->g->val[s.x]->type, *rt = &c->g->val[s.r]->type;
	const ir_type *wt = &c->g->val[s.w]->type;
	s.dt = xt->dtype;
	if (!kiln_dtype_is_float(s.dt) || xt->rank != 3 || wt->rank != 3 || rt->rank != 3)
		return (void)onnx_problem(c, d, KILN_EINVAL, "X, W and R must be 3-D floats");
	int64_t seq = xt->dim[s.layout ? 1 : 0];
	bool fused = ir_dim_expr(c->g, seq) != NULL; /* a symbolic T: the fused op */
	if (!fused && (seq < 1 || seq > MAX_STEPS))
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "sequence length %lld: kiln unrolls "
		                          "%s over 1 to %d time steps", (long long)seq, op, MAX_STEPS);
	s.seq = seq;
	if (ha && (ha->i < 1 || ha->i > (INT64_C(1) << 24)))
		return (void)onnx_problem(c, d, KILN_EINVAL, "hidden_size %lld", (long long)ha->i);
	s.hidden = ha ? ha->i : rt->dim[2];
	if (ir_dim_expr(c->g, s.hidden) || ir_dim_expr(c->g, rt->dim[1]) ||
	    ir_dim_expr(c->g, wt->dim[1]) || ir_dim_expr(c->g, wt->dim[0]))
		return (void)onnx_problem(c, d, KILN_EUNSUPPORTED, "W and R need fixed shapes "
		                          "(hidden_size from R's)");
	if (wt->dim[0] != s.ndir || wt->dim[1] != s.gates * s.hidden ||
	    rt->dim[1] != s.gates * s.hidden || rt->dim[2] != s.hidden)
		return (void)onnx_problem(c, d, KILN_ESHAPE, "W [%lld, %lld, .] and R [%lld, %lld, "
		                          "%lld] do not fit %d direction(s) of %d gate(s) of hidden "
		                          "size %lld", (long long)wt->dim[0], (long long)wt->dim[1],
		                          (long long)rt->dim[0], (long long)rt->dim[1],
		                          (long long)rt->dim[2], s.ndir, s.gates,
		                          (long long)s.hidden);
	int64_t nd = s.ndir, gh = s.gates * s.hidden, hid = s.hidden, bt = xt->dim[s.layout ? 0 : 1];
	bt = ir_dim_expr(c->g, bt) ? -1 : bt;
	const int64_t *state = s.layout ? (int64_t[]){bt, nd, hid} : (int64_t[]){nd, bt, hid};
	if (!fits(c, d, s.b, "B", s.dt, 2, (int64_t[]){nd, 2 * gh}) ||
	    !fits(c, d, s.p, "P", s.dt, 2, (int64_t[]){nd, 3 * hid}) ||
	    !fits(c, d, s.h0, "initial_h", s.dt, 3, state) ||
	    !fits(c, d, s.c0, "initial_c", s.dt, 3, state))
		return;
	if (fused)
		return import_fused(c, d, &s);
	/* sequence_lens: known at import (a constant, or a specialised graph
	 * input), else compared at run time */
	if (s.lens) {
		const ir_type *lt = &c->g->val[s.lens]->type;
		int64_t batch = xt->dim[s.layout ? 0 : 1];
		if ((lt->dtype != KILN_I32 && lt->dtype != KILN_I64) || lt->rank != 1 ||
		    (!ir_dim_expr(c->g, lt->dim[0]) && !ir_dim_expr(c->g, batch) && lt->dim[0] != batch))
			return (void)onnx_problem(c, d, KILN_EINVAL, "sequence_lens must be a 1-D i32 or "
			                          "i64 tensor of one length per batch row");
		s.lens_k = onnx_const(c, s.lens);
		if (!s.lens_k && c->specialize && c->g->val[s.lens]->kind == IR_V_INPUT &&
		    c->g->val[s.lens]->name && kiln_tensor_set_get(c->specialize, c->g->val[s.lens]->name))
			s.lens_k = onnx_const_input(c, d, 4, "sequence_lens", false);
		if (d->failed)
			return;
		for (int64_t i = 0; s.lens_k && i < kiln_tensor_numel(s.lens_k); i++)
			if (ir_load_i64(s.lens_k, i) < 0 || ir_load_i64(s.lens_k, i) > seq)
				return (void)onnx_problem(c, d, KILN_EINVAL, "sequence_lens[%lld] is %lld, "
				                          "outside [0, %lld]", (long long)i,
				                          (long long)ir_load_i64(s.lens_k, i), (long long)seq);
		if (!s.lens_k)
			s.lens_col = unsqueeze(c, d, s.lens, 1, (int64_t[]){1}, "lens_col");
	}
	/* shared constants */
	s.zero = kfill(c, d, s.dt, 0, 0, 0, 0, "zero");
	if (s.input_forget)
		s.one = kfill(c, d, s.dt, 0, 0, 0, 1, "one");
	s.tidx = ir_alloc(c->g->arena, (size_t)seq * sizeof *s.tidx);
	if (!s.tidx)
		return (void)onnx_problem(c, d, KILN_ENOMEM, "out of memory");
	for (int64_t t = 0; t < seq; t++) {
		char b[64];
		snprintf(b, sizeof b, "t%lld", (long long)t);
		s.tidx[t] = kfill(c, d, KILN_I64, 0, 0, 0, (double)t, b);
	}
	uint32_t ys[2], hs[2], cs[2];
	for (int k = 0; k < s.ndir && !d->failed; k++) {
		dir_out o = run_dir(c, d, &s, k, rev || k == 1);
		ys[k] = o.y, hs[k] = o.h, cs[k] = o.c;
	}
	if (d->failed)
		return;
	if (wanted(d, 0)) {
		int64_t axis = s.layout ? 2 : 1;
		/* one direction: its Concat over time is Y */
		set_output(c, d, 0, s.ndir == 1 ? ys[0] : concat(c, d, 2, ys, axis, "Y"));
	}
	if (wanted(d, 1))
		set_output(c, d, 1, stack_dirs(c, d, &s, hs, "Y_h"));
	if (wanted(d, 2) && cell == CELL_LSTM)
		set_output(c, d, 2, stack_dirs(c, d, &s, cs, "Y_c"));
	else if (wanted(d, 2) || d->p->n_output > 3)
		onnx_problem(c, d, KILN_EINVAL, "%zu outputs; %s has %d", d->p->n_output, op,
		             cell == CELL_LSTM ? 3 : 2);
}

void onnx_import_rnn(onnx_imp *c, onnx_nd *d) { import_rnn(c, d, CELL_RNN); }
void onnx_import_gru(onnx_imp *c, onnx_nd *d) { import_rnn(c, d, CELL_GRU); }
void onnx_import_lstm(onnx_imp *c, onnx_nd *d) { import_rnn(c, d, CELL_LSTM); }
