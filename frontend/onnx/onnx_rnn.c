/*
 * onnx_rnn.c: ONNX's recurrent ops RNN, GRU and LSTM (opsets 7 to 17),
 * imported as kiln's fused op of the same name (ir/rnn.c), which runs and
 * compiles for any sequence length T and batch, a number or a symbol: the
 * lowering (codegen/lower_rnn.c) is one kernel whose time loop runs to the
 * run's T, after one GEMM of X against W for every step.  Training unrolls
 * a fused node with a fixed T into its per-step composition before
 * autodiff (passes/rnn_unroll.c).  Here: the attributes and inputs are
 * checked (direction, layout, clip, hidden_size against W and R, B, P and
 * the initial states' shapes, the activations ONNX allows that kiln has:
 * Relu, Tanh, Sigmoid, LeakyRelu, ThresholdedRelu, HardSigmoid, Elu,
 * Softsign, Softplus, Affine and ScaledTanh, with activation_alpha and
 * activation_beta taken in order by the activations that have such a
 * parameter, as ONNX Runtime does), and an all-zero initial state (torch's
 * ConstantOfShape or an Expand of a zero) is left out.  Every output
 * exists on kiln's node; export writes the node back as ONNX's and leaves
 * an unnamed output nothing reads out (onnx_export.c).
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "frontend/onnx/onnx.h"
#include "ir/ir.h"

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

/* ---- the node ------------------------------------------------------------- */

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
} rnn;

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

/* ---- the fused op ---------------------------------------------------------- */

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
	s.seq = xt->dim[s.layout ? 1 : 0];
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
	import_fused(c, d, &s);
}

void onnx_import_rnn(onnx_imp *c, onnx_nd *d) { import_rnn(c, d, CELL_RNN); }
void onnx_import_gru(onnx_imp *c, onnx_nd *d) { import_rnn(c, d, CELL_GRU); }
void onnx_import_lstm(onnx_imp *c, onnx_nd *d) { import_rnn(c, d, CELL_LSTM); }
