/*
 * lower_rnn.c: the fused recurrent ops RNN, GRU and LSTM (ir/rnn.c) as one
 * kernel whose time loop runs to the sequence length of the run, so one
 * library serves every T (and every batch N).
 *
 * Per direction d:
 *   XW = X W_d^T + Wb_d          one GEMM over all T*N rows of X, before
 *                                the recurrence ([T*N, G*H] scratch)
 *   Hs, Cs = initial_h, _c or 0  [N, H] state
 *   for each step (t = 0.. or ..0, sequential):
 *     G = Hs R_d^T + Rb_d        a GEMM ([N, G*H]; GRU without
 *                                linear_before_reset: z, r first, then
 *                                (r Hs) R_h^T + Rb_h once r is known)
 *     for b < N, j < H           the gates, activations and state update
 *                                fused in one loop nest, vectorised over j:
 *                                a row past its sequence length keeps Hs,
 *                                Cs and writes Y = 0
 *   Y_h, Y_c = Hs, Cs
 * The arithmetic is the interpreter's (ir/rnn.c): clip on the gates'
 * inputs, the activations with their parameters (ir_rnn_parse).  f32 only
 * (the GEMMs are the f32 ones).
 */
#include <math.h>

#include "codegen/lower.h"

static cg_expr *I(cg_module *m, int64_t v) { return cg_int(m, v); }
static cg_expr *add(cg_module *m, cg_expr *a, cg_expr *b) { return cg_bin(m, CG_ADD, a, b); }
static cg_expr *sub(cg_module *m, cg_expr *a, cg_expr *b) { return cg_bin(m, CG_SUB, a, b); }
static cg_expr *mul(cg_module *m, cg_expr *a, cg_expr *b) { return cg_bin(m, CG_MUL, a, b); }
static cg_expr *F(cg_module *m, double v) { return cg_const(m, KILN_F32, v); }

/* activation k of r (clipped first when clip) at x, as ir_rnn_act */
static cg_expr *act(cg_module *m, const ir_rnn *r, int k, cg_expr *x, bool clip)
{
	double a = r->alpha[k], b = r->beta[k];
	if (clip && r->clip > 0)
		x = cg_bin(m, CG_MIN, cg_bin(m, CG_MAX, x, F(m, -r->clip)), F(m, r->clip));
	cg_expr *z = F(m, 0), *one = F(m, 1);
	switch (r->act[k]) {
	case IR_ACT_RELU: return cg_bin(m, CG_MAX, x, z);
	case IR_ACT_TANH: return cg_un(m, CG_TANH, x);
	case IR_ACT_SIGMOID: return cg_un(m, CG_SIGMOID, x);
	case IR_ACT_SOFTSIGN: return cg_bin(m, CG_DIV, x, add(m, one, cg_un(m, CG_ABS, x)));
	case IR_ACT_SOFTPLUS: /* max(x, 0) + log(1 + exp(-|x|)) */
		return add(m, cg_bin(m, CG_MAX, x, z),
		           cg_un(m, CG_LOG, add(m, one, cg_un(m, CG_EXP, cg_un(m, CG_NEG,
		                                                              cg_un(m, CG_ABS, x))))));
	case IR_ACT_LEAKY_RELU:
		return cg_select(m, cg_bin(m, CG_GE, x, z), x, mul(m, F(m, a), x));
	case IR_ACT_THRESHOLDED_RELU: return cg_select(m, cg_bin(m, CG_GT, x, F(m, a)), x, z);
	case IR_ACT_ELU:
		return cg_select(m, cg_bin(m, CG_GE, x, z), x,
		                 mul(m, F(m, a), sub(m, cg_un(m, CG_EXP, x), one)));
	case IR_ACT_HARD_SIGMOID:
		return cg_bin(m, CG_MAX, z, cg_bin(m, CG_MIN, one, add(m, mul(m, F(m, a), x), F(m, b))));
	case IR_ACT_AFFINE: return add(m, mul(m, F(m, a), x), F(m, b));
	case IR_ACT_SCALED_TANH: return mul(m, F(m, a), cg_un(m, CG_TANH, mul(m, F(m, b), x)));
	}
	return x;
}

/* What every part of one node's lowering reads. */
typedef struct rl {
	cg_module *m;
	cg_kernel *k;
	const ir_rnn *r;
	const int *in, *out;
	cg_expr *T, *N, *I, *H, *GH;
	int xw, hs, cs, g, rh;     /* scratch */
	int rt;                    /* R^T [D, H, G*H] when R is a constant, else -1 */
} rl;

static int inb(const rl *s, int p) { return s->r->in[p] >= 0 ? s->in[s->r->in[p]] : -1; }

/* C[N, ncol] (at column c0 of G, row stride GH) = A[N, H] R_d[rows r0..]^T
 * + Rb_d[r0..] */
static void rec_gemm(const rl *s, cg_stmt *blk, int d, int a, int64_t r0, int64_t ncol)
{
	cg_module *m = s->m;
	int64_t H = s->r->hidden, GH = s->r->gates * H;
	int b = inb(s, IR_RNN_B);
	bool t = s->rt >= 0; /* R^T's rows are contiguous: no transpose per step */
	cg_gemm gm = {.a = a, .b = t ? s->rt : s->in[2], .c = s->g, .bias = b,
	              .M = s->N, .N = I(m, ncol), .K = I(m, H), .batch = I(m, 1),
	              .a_off = I(m, 0), .a_bs = I(m, 0), .a_rs = I(m, H), .a_cs = I(m, 1),
	              .b_off = I(m, t ? d * H * GH + r0 : (d * GH + r0) * H), .b_bs = I(m, 0),
	              .b_rs = I(m, t ? GH : 1), .b_cs = I(m, t ? 1 : H),
	              .c_off = I(m, r0), .c_bs = I(m, 0), .c_rs = I(m, GH),
	              .bias_off = I(m, d * 2 * GH + GH + r0), .alpha = 1, .beta = 0,
	              .bias_axis = b >= 0 ? 1 : 0};
	cg_append(m, blk, cg_gemm_stmt(m, &gm));
}

/* A loop nest b < N, j < H appended to blk; returns the inner block. */
static cg_stmt *bj(const rl *s, cg_stmt *blk, cg_expr **b, cg_expr **j)
{
	cg_stmt *ob, *ib;
	cg_append(s->m, blk, cg_loop(s->m, s->k, s->N, 0, b, &ob));
	cg_append(s->m, ob, cg_loop(s->m, s->k, s->H, CG_VECTORIZE, j, &ib));
	return ib;
}

/* Offset of state row (d, b) in initial_h / Y_h order (layout). */
static cg_expr *st_off(const rl *s, int d, cg_expr *b)
{
	cg_module *m = s->m;
	cg_expr *row = s->r->layout ? add(m, mul(m, b, I(m, s->r->ndir)), I(m, d))
	                            : add(m, mul(m, I(m, d), s->N), b);
	return mul(m, row, s->H);
}

/* One step's gates and state update at (b, j) into blk; t the time index. */
static void cell(const rl *s, cg_stmt *blk, int d, cg_expr *t, cg_expr *b, cg_expr *j)
{
	cg_module *m = s->m;
	const ir_rnn *r = s->r;
	int64_t H = r->hidden, GH = r->gates * H;
	int f = d * r->nact;
	cg_expr *row = r->layout ? add(m, mul(m, b, s->T), t) : add(m, mul(m, t, s->N), b);
	cg_expr *xo = add(m, mul(m, row, s->GH), j), *go = add(m, mul(m, b, s->GH), j);
	cg_expr *hi = add(m, mul(m, b, s->H), j);
#define X(k) cg_load(m, s->xw, add(m, xo, I(m, (k) * H)))
#define G(k) cg_load(m, s->g, add(m, go, I(m, (k) * H)))
	cg_expr *hold = cg_local(m, s->k, blk, KILN_F32, cg_load(m, s->hs, hi)), *nh, *nc = NULL;
	if (r->cell == IR_RNN_CELL_RNN) {
		nh = act(m, r, f, add(m, X(0), G(0)), true);
	} else if (r->cell == IR_RNN_CELL_GRU) {
		cg_expr *z = act(m, r, f, add(m, X(0), G(0)), true), *hh;
		if (r->lbr) {
			cg_expr *rr = act(m, r, f, add(m, X(1), G(1)), true);
			hh = act(m, r, f + 1, add(m, X(2), mul(m, rr, G(2))), true);
		} else { /* G(2) holds (r Hs) R_h^T + Rb_h already */
			hh = act(m, r, f + 1, add(m, X(2), G(2)), true);
		}
		hh = cg_local(m, s->k, blk, KILN_F32, hh);
		nh = add(m, hh, mul(m, z, sub(m, hold, hh)));
	} else { /* LSTM: i, o, f, c */
		cg_expr *cold = cg_local(m, s->k, blk, KILN_F32, cg_load(m, s->cs, hi));
		int p = inb(s, IR_RNN_P);
		cg_expr *pi = NULL, *po = NULL, *pf = NULL;
		if (p >= 0) {
			cg_expr *po0 = add(m, I(m, d * 3 * H), j);
			pi = cg_load(m, p, po0), po = cg_load(m, p, add(m, po0, I(m, H)));
			pf = cg_load(m, p, add(m, po0, I(m, 2 * H)));
		}
		cg_expr *gi = add(m, X(0), G(0)), *gf = add(m, X(2), G(2));
		if (p >= 0)
			gi = add(m, gi, mul(m, pi, cold)), gf = add(m, gf, mul(m, pf, cold));
		cg_expr *ii = cg_local(m, s->k, blk, KILN_F32, act(m, r, f, gi, true));
		cg_expr *ff = r->input_forget ? sub(m, F(m, 1), ii) : act(m, r, f, gf, true);
		cg_expr *cc = act(m, r, f + 1, add(m, X(3), G(3)), true);
		nc = cg_local(m, s->k, blk, KILN_F32, add(m, mul(m, ff, cold), mul(m, ii, cc)));
		cg_expr *go_ = add(m, X(1), G(1));
		if (p >= 0)
			go_ = add(m, go_, mul(m, po, nc));
		nh = mul(m, act(m, r, f, go_, true), act(m, r, f + 2, nc, false));
	}
#undef X
#undef G
	nh = cg_local(m, s->k, blk, KILN_F32, nh);
	cg_expr *on = NULL;
	int lens = inb(s, IR_RNN_LENS);
	if (lens >= 0)
		on = cg_bin(m, CG_LT, t, cg_cast(m, cg_load(m, lens, b), KILN_I64));
	if (s->out[0] >= 0) {
		cg_expr *yrow = r->layout ? add(m, mul(m, add(m, mul(m, b, s->T), t), I(m, r->ndir)), I(m, d))
		                          : add(m, mul(m, add(m, mul(m, t, I(m, r->ndir)), I(m, d)), s->N), b);
		cg_append(m, blk, cg_store(m, s->out[0], add(m, mul(m, yrow, s->H), j),
		                           on ? cg_select(m, on, nh, F(m, 0)) : nh));
	}
	cg_append(m, blk, cg_store(m, s->hs, hi, on ? cg_select(m, on, nh, hold) : nh));
	if (nc)
		cg_append(m, blk, cg_store(m, s->cs, hi,
		                           on ? cg_select(m, on, nc, cg_load(m, s->cs, hi)) : nc));
	(void)GH;
}

/* Direction d: XW, the initial state, the steps, Y_h and Y_c. */
static void direction(const rl *s, int d)
{
	cg_module *m = s->m;
	cg_kernel *k = s->k;
	const ir_rnn *r = s->r;
	int64_t H = r->hidden, GH = r->gates * H;
	int bias = inb(s, IR_RNN_B);
	cg_gemm xw = {.a = s->in[0], .b = s->in[1], .c = s->xw, .bias = bias,
	              .M = mul(m, s->T, s->N), .N = s->GH, .K = s->I, .batch = I(m, 1),
	              .a_off = I(m, 0), .a_bs = I(m, 0), .a_rs = s->I, .a_cs = I(m, 1),
	              .b_off = mul(m, I(m, d * GH), s->I), .b_bs = I(m, 0), .b_rs = I(m, 1),
	              .b_cs = s->I, .c_off = I(m, 0), .c_bs = I(m, 0), .c_rs = s->GH,
	              .bias_off = I(m, d * 2 * GH), .alpha = 1, .beta = 0,
	              .bias_axis = bias >= 0 ? 1 : 0};
	cg_append(m, k->body, cg_gemm_stmt(m, &xw));
	cg_expr *b, *j;
	cg_stmt *ib = bj(s, k->body, &b, &j);
	cg_expr *hi = add(m, mul(m, b, s->H), j);
	int h0 = inb(s, IR_RNN_H0), c0 = inb(s, IR_RNN_C0);
	cg_append(m, ib, cg_store(m, s->hs, hi, h0 >= 0 ? cg_load(m, h0, add(m, st_off(s, d, b), j))
	                                                : F(m, 0)));
	if (r->cell == IR_RNN_CELL_LSTM)
		cg_append(m, ib, cg_store(m, s->cs, hi, c0 >= 0 ? cg_load(m, c0, add(m, st_off(s, d, b), j))
		                                                : F(m, 0)));
	cg_expr *st;
	cg_stmt *sb;
	cg_append(m, k->body, cg_loop(m, k, s->T, 0, &st, &sb));
	cg_expr *t = ir_rnn_dir_reverse(r, d) ? cg_local(m, k, sb, KILN_I64,
	                                                 sub(m, sub(m, s->T, I(m, 1)), st))
	                                      : st;
	if (r->cell == IR_RNN_CELL_GRU && !r->lbr) {
		rec_gemm(s, sb, d, s->hs, 0, 2 * H); /* z, r */
		ib = bj(s, sb, &b, &j);
		hi = add(m, mul(m, b, s->H), j);
		cg_expr *xo = add(m, mul(m, r->layout ? add(m, mul(m, b, s->T), t)
		                                      : add(m, mul(m, t, s->N), b), s->GH), j);
		cg_expr *go = add(m, mul(m, b, s->GH), j);
		cg_expr *rr = act(m, r, d * r->nact, add(m, cg_load(m, s->xw, add(m, xo, I(m, H))),
		                                         cg_load(m, s->g, add(m, go, I(m, H)))), true);
		cg_append(m, ib, cg_store(m, s->rh, hi, mul(m, rr, cg_load(m, s->hs, hi))));
		rec_gemm(s, sb, d, s->rh, 2 * H, H);
	} else {
		rec_gemm(s, sb, d, s->hs, 0, GH);
	}
	ib = bj(s, sb, &b, &j);
	cell(s, ib, d, t, b, j);
	ib = bj(s, k->body, &b, &j);
	hi = add(m, mul(m, b, s->H), j);
	if (s->out[1] >= 0)
		cg_append(m, ib, cg_store(m, s->out[1], add(m, st_off(s, d, b), j), cg_load(m, s->hs, hi)));
	if (r->cell == IR_RNN_CELL_LSTM && s->out[2] >= 0)
		cg_append(m, ib, cg_store(m, s->out[2], add(m, st_off(s, d, b), j), cg_load(m, s->cs, hi)));
}

kiln_status cg_lower_rnn(cg_module *m, const ir_node *n, const int *in, const int *out,
                         kiln_error *err)
{
	ir_rnn r;
	char why[256];
	if (ir_rnn_parse(n, &r, why, sizeof why))
		return cg_lower_fail(m, n, err, KILN_EINVAL, "%s", why);
	const ir_type *x = cg_btype(m, in[0]);
	if (x->dtype != KILN_F32)
		return cg_lower_fail(m, n, err, KILN_EUNSUPPORTED, "the fused %s lowers f32 only, "
		                     "not %s", ir_op(n->op)->onnx, kiln_dtype_name(x->dtype));
	cg_kernel *k = cg_lower_kernel(m, n);
	if (!k)
		return cg_lower_fail(m, n, err, KILN_ENOMEM, "out of memory");
	int64_t H = r.hidden, GH = r.gates * H;
	rl s = {m, k, &r, in, out, cg_dim(m, x->dim[r.layout ? 1 : 0]),
	        cg_dim(m, x->dim[r.layout ? 0 : 1]), cg_dim(m, x->dim[2]), I(m, H), I(m, GH),
	        -1, -1, -1, -1, -1, -1};
	/* a constant R is stored transposed, [D, H, G*H], so each step's GEMM
	 * reads B's rows contiguously; a training library's R is state (no data) */
	const cg_buf *rb = &m->buf[in[2]];
	s.rt = -1;
	if (rb->kind == CG_BUF_CONST && rb->alias < 0 && rb->data) {
		int64_t D = r.ndir;
		kiln_tensor *t = cg_lower_arena_tensor(m, KILN_F32, D * H * GH);
		if (!t)
			return cg_lower_fail(m, n, err, KILN_ENOMEM, "out of memory");
		for (int64_t d = 0; d < D; d++)
			for (int64_t k = 0; k < GH; k++)
				for (int64_t j = 0; j < H; j++)
					((float *)t->data)[(d * H + j) * GH + k] =
						(float)ir_load(rb->data, (d * GH + k) * H + j);
		if ((s.rt = cg_lower_const_buf(m, t, in[2], "T")) < 0)
			return cg_lower_fail(m, n, err, KILN_ENOMEM, "out of memory");
	}
	cg_expr *nh = mul(m, s.N, s.H);
	s.xw = cg_lower_scratch(m, KILN_F32, mul(m, mul(m, s.T, s.N), s.GH));
	s.hs = cg_lower_scratch(m, KILN_F32, nh);
	s.g = cg_lower_scratch(m, KILN_F32, mul(m, s.N, s.GH));
	if (r.cell == IR_RNN_CELL_LSTM)
		s.cs = cg_lower_scratch(m, KILN_F32, nh);
	if (r.cell == IR_RNN_CELL_GRU && !r.lbr)
		s.rh = cg_lower_scratch(m, KILN_F32, nh);
	if (s.xw < 0 || s.hs < 0 || s.g < 0 || (r.cell == IR_RNN_CELL_LSTM && s.cs < 0) ||
	    (r.cell == IR_RNN_CELL_GRU && !r.lbr && s.rh < 0))
		return cg_lower_fail(m, n, err, KILN_ENOMEM, "out of memory");
	int lens = inb(&s, IR_RNN_LENS);
	if (lens >= 0)
		cg_lower_check_all(m, k, n, "sequence_lens value", lens, s.N, I(m, 0),
		                   add(m, s.T, I(m, 1)), NULL);
	for (int d = 0; d < r.ndir; d++)
		direction(&s, d);
	return KILN_OK;
}
