/*
 * rnn_unroll.c: a fused RNN, GRU or LSTM node (ir/rnn.c) whose sequence
 * length is a number, rewritten as the composition of kiln's ordinary ops
 * over its time steps, so that autodiff differentiates it with the rules
 * those ops already have (pass_grad runs this first).  A symbolic T cannot
 * be unrolled: that is refused with a message naming the node.
 *
 * The composition is the one frontend/onnx/onnx_rnn.c imports a fixed T
 * as (its header comment has the formulas), per direction:
 *
 *   XW = X W^T + Wb                 one MatMul for every step
 *   per step: x = Gather(XW, t); g = x + Gemm(H, R, Rb, transB); Slices of
 *   g, clip, the activations, the cell's update; past a row's length
 *   (sequence_lens) Where keeps H and C and writes Y = 0
 *   Y = Concat of the steps' Unsqueezed H; Y_h, Y_c the last H, C
 *
 * Each added node is named "<node>/<dir>/t<t>/<what>".  Large T makes
 * large graphs (about 25 nodes per step and direction): the fused op is
 * the form to run; this one is the form to differentiate.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

#define MAX_STEPS (1 << 16)

typedef struct ur {
	kiln_graph *g;
	const ir_node *n;   /* the fused node */
	ir_rnn r;
	int64_t T, H;
	kiln_dtype dt;
	bool failed;
	uint32_t in[8];     /* by ONNX position, 0: absent */
	uint32_t zero, one, lens_col;
	uint32_t *tidx;     /* per step: its index Constant */
} ur;

/* A node op(in) named "<n>/<what>" with optional attributes set by the
 * caller through the returned node before inference; 0 on a problem. */
static ir_node *mk(ur *u, kiln_op op, uint32_t nin, const uint32_t *in, const char *what)
{
	for (uint32_t i = 0; i < nin; i++)
		if (!in[i])
			u->failed = true;
	if (u->failed)
		return NULL;
	ir_node *k = ir_node_new(u->g, op, nin, in, 1, u->n->loc);
	char name[512];
	snprintf(name, sizeof name, "%s/%s", u->n->name ? u->n->name : ir_op(u->n->op)->onnx, what);
	if (!k || !(k->name = ir_intern(u->g, name)))
		u->failed = true;
	return u->failed ? NULL : k;
}

/* Infers k; its output, or 0. */
static uint32_t fin(ur *u, ir_node *k, kiln_status attrs)
{
	if (!k || attrs || ir_infer_node(u->g, k)) {
		u->failed = true;
		return 0;
	}
	return k->out[0];
}

static uint32_t b2(ur *u, kiln_op op, uint32_t a, uint32_t b, const char *what)
{
	return fin(u, mk(u, op, 2, (uint32_t[]){a, b}, what), KILN_OK);
}

static uint32_t u1(ur *u, kiln_op op, uint32_t a, const char *what)
{
	return fin(u, mk(u, op, 1, &a, what), KILN_OK);
}

static uint32_t kfill(ur *u, kiln_dtype dt, int rank, int64_t n0, int64_t n1, double v,
                      const char *what)
{
	int64_t shape[2] = {n0, n1};
	kiln_tensor *t = u->failed ? NULL : ir_tensor_new(u->g, dt, rank, shape);
	int64_t cnt = (rank > 0 ? n0 : 1) * (rank > 1 ? n1 : 1);
	for (int64_t i = 0; t && i < cnt; i++) {
		if (dt == KILN_I64)
			ir_store_i64(t, i, (int64_t)v);
		else
			ir_store(t, i, v);
	}
	ir_node *k = t ? mk(u, KILN_OP_CONSTANT, 0, NULL, what) : NULL;
	return fin(u, k, k ? ir_attr_set_tensor(u->g, k, "value", t) : KILN_ENOMEM);
}

static uint32_t slice(ur *u, uint32_t x, int64_t axis, int64_t lo, int64_t hi, const char *what)
{
	ir_node *k = mk(u, KILN_OP_SLICE, 1, &x, what);
	kiln_status st = k ? ir_attr_set_ints(u->g, k, "starts", 1, &lo) |
	                     ir_attr_set_ints(u->g, k, "ends", 1, &hi) |
	                     ir_attr_set_ints(u->g, k, "axes", 1, &axis) : KILN_OK;
	return fin(u, k, st);
}

static uint32_t gather(ur *u, uint32_t x, uint32_t idx, int64_t axis, const char *what)
{
	ir_node *k = mk(u, KILN_OP_GATHER, 2, (uint32_t[]){x, idx}, what);
	return fin(u, k, k && axis ? ir_attr_set_int(u->g, k, "axis", axis) : KILN_OK);
}

static uint32_t unsqueeze(ur *u, uint32_t x, uint32_t cnt, const int64_t *axes, const char *what)
{
	ir_node *k = mk(u, KILN_OP_UNSQUEEZE, 1, &x, what);
	return fin(u, k, k ? ir_attr_set_ints(u->g, k, "axes", cnt, axes) : KILN_OK);
}

static uint32_t concat(ur *u, uint32_t cnt, const uint32_t *in, int64_t axis, const char *what)
{
	ir_node *k = mk(u, KILN_OP_CONCAT, cnt, in, what);
	return fin(u, k, k ? ir_attr_set_int(u->g, k, "axis", axis) : KILN_OK);
}

static uint32_t gemm_t(ur *u, uint32_t a, uint32_t b, uint32_t c, const char *what)
{
	ir_node *k = mk(u, KILN_OP_GEMM, c ? 3 : 2, (uint32_t[]){a, b, c}, what);
	return fin(u, k, k ? ir_attr_set_int(u->g, k, "transB", 1) : KILN_OK);
}

/* "<dir>/t<t>/<what>" (t < 0: "<dir>/<what>") in a buffer of its own */
static const char *nm(char *buf, const char *dir, int64_t t, const char *what)
{
	if (t < 0)
		snprintf(buf, 256, "%s/%s", dir, what);
	else
		snprintf(buf, 256, "%s/t%lld/%s", dir, (long long)t, what);
	return buf;
}
#define NM(dir, t, what) nm((char[256]){""}, dir, t, what)

/* activation k of the node at x (clip first when clip), named what */
static uint32_t activate(ur *u, int k, bool clip, uint32_t x, const char *what)
{
	static const kiln_op op[IR_ACT_COUNT] = {
		[IR_ACT_RELU] = KILN_OP_RELU, [IR_ACT_TANH] = KILN_OP_TANH,
		[IR_ACT_SIGMOID] = KILN_OP_SIGMOID, [IR_ACT_SOFTSIGN] = KILN_OP_SOFTSIGN,
		[IR_ACT_SOFTPLUS] = KILN_OP_SOFTPLUS, [IR_ACT_LEAKY_RELU] = KILN_OP_LEAKY_RELU,
		[IR_ACT_THRESHOLDED_RELU] = KILN_OP_THRESHOLDED_RELU, [IR_ACT_ELU] = KILN_OP_ELU,
		[IR_ACT_HARD_SIGMOID] = KILN_OP_HARD_SIGMOID};
	char s1[300], s2[300];
	int a = u->r.act[k];
	double al = u->r.alpha[k], be = u->r.beta[k];
	if (clip && u->r.clip > 0) {
		snprintf(s1, sizeof s1, "%s_clip", what);
		ir_node *c = mk(u, KILN_OP_CLIP, 1, &x, s1);
		x = fin(u, c, c ? ir_attr_set_float(u->g, c, "min", -u->r.clip) |
		                  ir_attr_set_float(u->g, c, "max", u->r.clip) : KILN_OK);
	}
	if (a == IR_ACT_AFFINE || a == IR_ACT_SCALED_TANH) {
		snprintf(s1, sizeof s1, "%s_alpha", what);
		snprintf(s2, sizeof s2, "%s_beta", what);
		uint32_t ka = kfill(u, u->dt, 0, 0, 0, al, s1), kb = kfill(u, u->dt, 0, 0, 0, be, s2);
		snprintf(s1, sizeof s1, "%s_in", what);
		if (a == IR_ACT_AFFINE)
			return b2(u, KILN_OP_ADD, b2(u, KILN_OP_MUL, x, ka, s1), kb, what);
		snprintf(s2, sizeof s2, "%s_tanh", what);
		return b2(u, KILN_OP_MUL, u1(u, KILN_OP_TANH, b2(u, KILN_OP_MUL, x, kb, s1), s2), ka,
		          what);
	}
	ir_node *n = mk(u, op[a], 1, &x, what);
	kiln_status st = KILN_OK;
	bool has_alpha = a == IR_ACT_LEAKY_RELU || a == IR_ACT_THRESHOLDED_RELU ||
	                 a == IR_ACT_ELU || a == IR_ACT_HARD_SIGMOID;
	if (n && has_alpha)
		st |= ir_attr_set_float(u->g, n, "alpha", al);
	if (n && a == IR_ACT_HARD_SIGMOID)
		st |= ir_attr_set_float(u->g, n, "beta", be);
	return fin(u, n, st);
}

/* The [N, 1] mask of step t (0: no sequence_lens) */
static uint32_t step_mask(ur *u, int64_t t, const char *dir)
{
	if (!u->lens_col)
		return 0;
	uint32_t k = kfill(u, u->g->val[u->in[IR_RNN_LENS]]->type.dtype, 0, 0, 0, (double)t,
	                   NM(dir, t, "step"));
	return b2(u, KILN_OP_LESS, k, u->lens_col, NM(dir, t, "mask"));
}

typedef struct dir_out {
	uint32_t y, h, c;
} dir_out;

/* One step of direction k at time t from state h, cs; new H, C into *nh, *nc. */
static void cell(ur *u, int k, const char *dn, int64_t t, uint32_t x, uint32_t rec,
                 const uint32_t *w, uint32_t h, uint32_t cs, uint32_t *nh, uint32_t *nc)
{
	int64_t H = u->H;
	int f = k * u->r.nact;
	/* w: rh, rbh, pi, po, pf */
#define S(what) NM(dn, t, what)
	if (u->r.cell == IR_RNN_CELL_RNN) {
		*nh = activate(u, f, true, b2(u, KILN_OP_ADD, x, rec, S("pre")), S("h"));
	} else if (u->r.cell == IR_RNN_CELL_GRU) {
		uint32_t zr = b2(u, KILN_OP_ADD, slice(u, x, 1, 0, 2 * H, S("x_zr")), rec, S("zr_pre"));
		uint32_t z = activate(u, f, true, slice(u, zr, 1, 0, H, S("z_pre")), S("z"));
		uint32_t rr = activate(u, f, true, slice(u, zr, 1, H, 2 * H, S("r_pre")), S("r"));
		uint32_t xh = slice(u, x, 1, 2 * H, 3 * H, S("x_h")), hr;
		if (u->r.lbr) {
			hr = gemm_t(u, h, w[0], w[1], S("rec_h"));
			hr = b2(u, KILN_OP_MUL, rr, hr, S("reset_rec_h"));
		} else {
			hr = b2(u, KILN_OP_MUL, rr, h, S("reset_h"));
			hr = gemm_t(u, hr, w[0], w[1], S("rec_h"));
		}
		uint32_t hh = activate(u, f + 1, true, b2(u, KILN_OP_ADD, xh, hr, S("h_pre")),
		                       S("h_cand"));
		uint32_t dh = b2(u, KILN_OP_SUB, h, hh, S("h_delta"));
		*nh = b2(u, KILN_OP_ADD, hh, b2(u, KILN_OP_MUL, z, dh, S("h_keep")), S("h"));
	} else {
		uint32_t gs = b2(u, KILN_OP_ADD, x, rec, S("gates"));
		uint32_t gi = slice(u, gs, 1, 0, H, S("i_pre"));
		uint32_t go = slice(u, gs, 1, H, 2 * H, S("o_pre"));
		uint32_t gc = slice(u, gs, 1, 3 * H, 4 * H, S("c_pre")), ff;
		if (w[2])
			gi = b2(u, KILN_OP_ADD, gi, b2(u, KILN_OP_MUL, w[2], cs, S("i_peep")), S("i_pre_peep"));
		uint32_t ii = activate(u, f, true, gi, S("i"));
		if (u->r.input_forget) {
			ff = b2(u, KILN_OP_SUB, u->one, ii, S("f"));
		} else {
			uint32_t gf = slice(u, gs, 1, 2 * H, 3 * H, S("f_pre"));
			if (w[4])
				gf = b2(u, KILN_OP_ADD, gf, b2(u, KILN_OP_MUL, w[4], cs, S("f_peep")),
				        S("f_pre_peep"));
			ff = activate(u, f, true, gf, S("f"));
		}
		uint32_t cc = activate(u, f + 1, true, gc, S("c_cand"));
		*nc = b2(u, KILN_OP_ADD, b2(u, KILN_OP_MUL, ff, cs, S("c_keep")),
		         b2(u, KILN_OP_MUL, ii, cc, S("c_new")), S("c"));
		if (w[3])
			go = b2(u, KILN_OP_ADD, go, b2(u, KILN_OP_MUL, w[3], *nc, S("o_peep")),
			        S("o_pre_peep"));
		uint32_t oo = activate(u, f, true, go, S("o"));
		*nh = b2(u, KILN_OP_MUL, oo, activate(u, f + 2, false, *nc, S("c_act")), S("h"));
	}
#undef S
}

/* Direction k over every step. */
static dir_out run_dir(ur *u, int k)
{
	dir_out o = {0, 0, 0};
	bool reverse = ir_rnn_dir_reverse(&u->r, k);
	const char *dn = reverse ? "rev" : "fwd";
	int64_t H = u->H, GH = u->r.gates * H, taxis = u->r.layout ? 1 : 0;
	bool gru = u->r.cell == IR_RNN_CELL_GRU;
	uint32_t dk = kfill(u, KILN_I64, 0, 0, 0, (double)k, NM(dn, -1, "index"));
	uint32_t w = gather(u, u->in[1], dk, 0, NM(dn, -1, "W"));
	uint32_t r = gather(u, u->in[2], dk, 0, NM(dn, -1, "R"));
	uint32_t bias = u->in[IR_RNN_B] ? gather(u, u->in[IR_RNN_B], dk, 0, NM(dn, -1, "B")) : 0;
	ir_node *tn = mk(u, KILN_OP_TRANSPOSE, 1, &w, NM(dn, -1, "W_T"));
	uint32_t wt = fin(u, tn, tn ? ir_attr_set_ints(u->g, tn, "perm", 2, (int64_t[]){1, 0}) : 0);
	uint32_t xw = b2(u, KILN_OP_MATMUL, u->in[0], wt, NM(dn, -1, "XW"));
	if (bias)
		xw = b2(u, KILN_OP_ADD, xw, slice(u, bias, 0, 0, GH, NM(dn, -1, "Wb")), NM(dn, -1, "XW_b"));
	int64_t GR = gru ? 2 * H : GH;
	uint32_t rg = gru ? slice(u, r, 0, 0, GR, NM(dn, -1, "R_zr")) : r;
	uint32_t wx[5] = {gru ? slice(u, r, 0, GR, GH, NM(dn, -1, "R_h")) : 0,
	                  bias && gru ? slice(u, bias, 0, GH + GR, 2 * GH, NM(dn, -1, "Rb_h")) : 0};
	uint32_t rbg = bias ? slice(u, bias, 0, GH, GH + GR, NM(dn, -1, "Rb")) : 0;
	if (u->in[IR_RNN_P]) {
		uint32_t p = gather(u, u->in[IR_RNN_P], dk, 0, NM(dn, -1, "P"));
		wx[2] = slice(u, p, 0, 0, H, NM(dn, -1, "P_i"));
		wx[3] = slice(u, p, 0, H, 2 * H, NM(dn, -1, "P_o"));
		wx[4] = slice(u, p, 0, 2 * H, 3 * H, NM(dn, -1, "P_f"));
	}
	int lay = u->r.layout;
	uint32_t h = u->in[IR_RNN_H0] ? gather(u, u->in[IR_RNN_H0], dk, lay, NM(dn, -1, "H0"))
	                              : kfill(u, u->dt, 2, 1, H, 0, NM(dn, -1, "H0"));
	uint32_t cs = 0;
	if (u->r.cell == IR_RNN_CELL_LSTM)
		cs = u->in[IR_RNN_C0] ? gather(u, u->in[IR_RNN_C0], dk, lay, NM(dn, -1, "C0"))
		                      : kfill(u, u->dt, 2, 1, H, 0, NM(dn, -1, "C0"));
	uint32_t *ys = calloc((size_t)u->T, sizeof *ys);
	if (!ys)
		return u->failed = true, o;
	for (int64_t i = 0; i < u->T && !u->failed; i++) {
		int64_t t = reverse ? u->T - 1 - i : i;
		uint32_t x = gather(u, xw, u->tidx[t], taxis, NM(dn, t, "x"));
		uint32_t rec = gemm_t(u, h, rg, rbg, NM(dn, t, "rec"));
		uint32_t nh = 0, nc = 0;
		cell(u, k, dn, t, x, rec, wx, h, cs, &nh, &nc);
		uint32_t m = step_mask(u, t, dn), y = nh;
		if (m) {
			y = fin(u, mk(u, KILN_OP_WHERE, 3, (uint32_t[]){m, nh, u->zero}, NM(dn, t, "y")), 0);
			nh = fin(u, mk(u, KILN_OP_WHERE, 3, (uint32_t[]){m, nh, h}, NM(dn, t, "h_kept")), 0);
			if (nc)
				nc = fin(u, mk(u, KILN_OP_WHERE, 3, (uint32_t[]){m, nc, cs}, NM(dn, t, "c_kept")),
				         0);
		}
		ys[t] = unsqueeze(u, y, 2, lay ? (int64_t[]){1, 2} : (int64_t[]){0, 1}, NM(dn, t, "y_step"));
		h = nh, cs = nc;
	}
	if (!u->failed)
		o.y = concat(u, (uint32_t)u->T, ys, taxis, NM(dn, -1, "Y"));
	free(ys);
	o.h = h, o.c = cs;
	return o;
}

/* The directions' values stacked on the num_directions axis. */
static uint32_t stack(ur *u, const uint32_t *v, int64_t axis, int64_t rank_axis,
                      const char *what)
{
	uint32_t s[2];
	char b[300];
	for (int k = 0; k < u->r.ndir; k++) {
		snprintf(b, sizeof b, "%s/%s_dir", k ? "rev" : "fwd", what);
		s[k] = unsqueeze(u, v[k], 1, &rank_axis, b);
	}
	return u->r.ndir == 1 ? s[0] : concat(u, 2, s, axis, what);
}

/* Unrolls n (a fixed T) in place: its outputs' uses read the composition. */
static kiln_status unroll(kiln_graph *g, ir_node *n)
{
	ur u = {.g = g, .n = n};
	char why[256], desc[160];
	if (ir_rnn_parse(n, &u.r, why, sizeof why))
		return ir_errorf(g, n, KILN_EINVAL, "%s", why);
	const ir_type *xt = &g->val[n->in[0]]->type;
	u.T = xt->dim[u.r.layout ? 1 : 0], u.H = u.r.hidden, u.dt = xt->dtype;
	if (ir_dim_expr(g, u.T)) {
		char sym[128];
		ir_dim_str(g, u.T, sym, sizeof sym);
		return ir_errorf(g, n, KILN_EUNSUPPORTED, "the sequence length is the symbol '%s': "
		                 "the fused %s has no gradient rule and is differentiated by unrolling "
		                 "its time steps, which needs a fixed sequence length (import or build "
		                 "the training model with one)", sym, ir_op(n->op)->onnx);
	}
	if (u.T < 1 || u.T > MAX_STEPS)
		return ir_errorf(g, n, KILN_EUNSUPPORTED, "%s: sequence length %lld: unrolled for its "
		                 "gradient over 1 to %d steps", ir_node_desc(n, desc, sizeof desc),
		                 (long long)u.T, MAX_STEPS);
	for (int p = 0; p < 8; p++)
		u.in[p] = u.r.in[p] >= 0 ? n->in[u.r.in[p]] : 0;
	u.zero = kfill(&u, u.dt, 0, 0, 0, 0, "zero");
	if (u.r.input_forget)
		u.one = kfill(&u, u.dt, 0, 0, 0, 1, "one");
	if (u.in[IR_RNN_LENS])
		u.lens_col = unsqueeze(&u, u.in[IR_RNN_LENS], 1, (int64_t[]){1}, "lens_col");
	u.tidx = calloc((size_t)u.T, sizeof *u.tidx);
	for (int64_t t = 0; u.tidx && t < u.T; t++) {
		char b[64];
		snprintf(b, sizeof b, "t%lld", (long long)t);
		u.tidx[t] = kfill(&u, KILN_I64, 0, 0, 0, (double)t, b);
	}
	uint32_t ys[2] = {0}, hs[2] = {0}, cs[2] = {0};
	for (int k = 0; u.tidx && k < u.r.ndir && !u.failed; k++) {
		dir_out o = run_dir(&u, k);
		ys[k] = o.y, hs[k] = o.h, cs[k] = o.c;
	}
	free(u.tidx);
	int64_t lay = u.r.layout;
	uint32_t out[3] = {0};
	if (!u.failed && u.tidx) {
		out[0] = u.r.ndir == 1 ? ys[0] : concat(&u, 2, ys, lay ? 2 : 1, "Y");
		out[1] = stack(&u, hs, lay, lay, "Y_h");
		if (u.r.cell == IR_RNN_CELL_LSTM)
			out[2] = stack(&u, cs, lay, lay, "Y_c");
	}
	if (u.failed || !u.tidx)
		return g->status ? g->status
		                 : ir_errorf(g, n, KILN_ENOMEM, "unrolling for the gradient failed");
	for (uint32_t i = 0; i < n->nout; i++)
		ir_replace_uses(g, n->out[i], out[i]);
	ir_node_remove(g, n);
	return KILN_OK;
}

kiln_status pass_rnn_unroll(kiln_graph *g)
{
	bool any = false;
	for (uint32_t i = 0, nn = g->nnode; i < nn && g->status == KILN_OK; i++) {
		ir_node *n = g->node[i];
		if (!n->dead && (n->op == KILN_OP_RNN || n->op == KILN_OP_GRU || n->op == KILN_OP_LSTM))
			if (unroll(g, n) == KILN_OK)
				any = true;
	}
	if (g->status == KILN_OK && any)
		return ir_toposort(g);
	return g->status;
}

kiln_status pass_unroll_rnn(kiln_graph *g, const pass_opts *o)
{
	(void)o;
	kiln_status st = pass_rnn_unroll(g);
	return st ? st : ir_compact(g);
}
