/*
 * optim.c: the optimizer rewrite: appends a parameter update (SGD, Adam or
 * AdamW with PyTorch's formulas), global-norm gradient clipping and gradient
 * accumulation to a graph that already computes each parameter's gradient,
 * as ordinary graph ops that every pass and backend handles.
 *
 * The key idea is that a train step is a pure function from (state, batch,
 * lr, t) to (loss, next state).  Optimizer state (momentum buffers, Adam's
 * moments, accumulated gradients) becomes parameters of the graph with
 * trainable=false, named "<param>.<slot>" and zero-initialised, and every
 * tensor a step replaces is a graph output named "<name>.next"; whoever runs
 * the step (the interpreter-driven kiln_trainer, a compiled library) copies
 * each ".next" output over its namesake afterwards.  The learning rate and
 * the 1-based step count t are f64 scalar inputs, so schedules stay on the
 * host and nothing is recompiled when they change.
 *
 * Rounding follows PyTorch: scalar arithmetic on lr and t (bias
 * corrections, step sizes, AdamW's 1 - lr*wd, the first-step test) is done
 * in f64, as Python does it, and cast to the parameter's dtype where it
 * meets a tensor, as PyTorch converts a Python scalar; hyper-parameters are
 * constants of the parameter's dtype.
 *
 * Accumulation over k micro-batches: a bool "apply" input.  Each run adds
 * grad/k to "<p>.grad_accum"; when apply is true the sum is clipped and fed
 * to the update, and the accumulator restarts at zero, else the parameters
 * and optimizer state pass through unchanged (Where(apply, new, old)).  One
 * graph with a flag, rather than separate accumulate and apply graphs, keeps
 * one entry point per compiled library; the price is an update computed and
 * discarded on k-1 of every k micro-batches, small beside the backward pass.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* the model's location (ir_graph_loc), so messages name the user's file */
#define HERE (s->loc)

/* One rewrite: the graph, its options and the scalar inputs. */
typedef struct opt {
	kiln_graph *g;
	const kiln_train_opts *o;
	uint32_t lr, step, apply; /* f64, f64, bool (0 without accumulation) */
	uint32_t first;           /* bool: t <= 1, PyTorch's "no momentum buffer yet" */
	double b1, b2, eps;       /* resolved Adam defaults */
	kiln_loc loc;             /* of every node added: ir_graph_loc of the model */
} opt;

/* ---- small builders ------------------------------------------------------ */

static uint32_t num(opt *s, kiln_dtype dt, double v)
{
	return kiln_scalar_at(s->g, HERE, dt, v);
}

/* v as dtype dt (a Cast only when it differs). */
static uint32_t as(opt *s, uint32_t v, kiln_dtype dt)
{
	if (!v || s->g->status != KILN_OK || s->g->val[v]->type.dtype == dt)
		return v;
	return kiln_cast_at(s->g, HERE, v, dt);
}

static kiln_dtype dtype(const opt *s, uint32_t v)
{
	return s->g->val[v]->type.dtype;
}

/* A zero state tensor shaped like param p, named "<p>.<slot>". */
static uint32_t state(opt *s, uint32_t p, const char *slot)
{
	kiln_graph *g = s->g;
	if (g->status != KILN_OK)
		return 0;
	const char *pname = g->val[p]->name;
	char name[512];
	snprintf(name, sizeof name, "%s.%s", pname, slot);
	if (kiln_graph_find_param(g, name)) {
		ir_errorf(g, NULL, KILN_EINVAL, "optimizer: parameter '%s' needs state '%s', but "
		          "the graph already has a parameter of that name", pname, name);
		return 0;
	}
	ir_type t = g->val[p]->type;
	kiln_tensor *z = kiln_tensor_new(t.dtype, t.rank, t.dim);
	uint32_t id = z ? ir_param_new(g, name, z, false) : 0;
	kiln_tensor_free(z);
	if (!id)
		ir_errorf(g, NULL, KILN_ENOMEM, "optimizer: cannot allocate state '%s'", name);
	return id;
}

/* Output "<name of old>.next" = v, or Where(apply, v, old) when
 * accumulating, so a non-applying micro-batch changes nothing. */
static void next(opt *s, uint32_t old, uint32_t v)
{
	kiln_graph *g = s->g;
	if (g->status != KILN_OK)
		return;
	char name[600];
	snprintf(name, sizeof name, "%s.next", g->val[old]->name);
	if (s->apply)
		v = kiln_where_at(g, HERE, s->apply, v, old);
	kiln_output_at(g, HERE, name, v);
}

/* ---- accumulation and clipping -------------------------------------------- */

/* grad[i] becomes acc_i + grad_i / k, and acc_i restarts when applying. */
static void accumulate(opt *s, int n, const uint32_t *param, uint32_t *grad)
{
	kiln_graph *g = s->g;
	for (int i = 0; i < n && g->status == KILN_OK; i++) {
		kiln_dtype dt = dtype(s, grad[i]);
		uint32_t acc = state(s, param[i], "grad_accum");
		uint32_t sum = kiln_add_at(g, HERE, acc,
		                           kiln_mul_at(g, HERE, grad[i], num(s, dt, 1.0 / s->o->accum_steps)));
		if (g->status != KILN_OK)
			return;
		char name[600];
		snprintf(name, sizeof name, "%s.next", g->val[acc]->name);
		kiln_output_at(g, HERE, name, kiln_where_at(g, HERE, s->apply, num(s, dt, 0), sum));
		grad[i] = sum;
	}
}

/* clip_grad_norm_: total = sqrt(sum of squares of every gradient), each
 * scaled by min(max_norm / (total + 1e-6), 1), in the gradients' dtype. */
static void clip(opt *s, int n, uint32_t *grad)
{
	kiln_graph *g = s->g;
	if (n == 0)
		return;
	kiln_dtype dt = dtype(s, grad[0]);
	uint32_t sq = 0;
	for (int i = 0; i < n && g->status == KILN_OK; i++) {
		uint32_t gi = as(s, grad[i], dt);
		uint32_t si = kiln_reduce_sum_at(g, HERE, kiln_mul_at(g, HERE, gi, gi), 0, NULL, false);
		sq = sq ? kiln_add_at(g, HERE, sq, si) : si;
	}
	uint32_t total = kiln_sqrt_at(g, HERE, sq);
	uint32_t coef = kiln_div_at(g, HERE, num(s, dt, s->o->clip_norm),
	                            kiln_add_at(g, HERE, total, num(s, dt, 1e-6)));
	coef = kiln_min_at(g, HERE, coef, num(s, dt, 1.0));
	for (int i = 0; i < n && g->status == KILN_OK; i++)
		grad[i] = kiln_mul_at(g, HERE, grad[i], as(s, coef, dtype(s, grad[i])));
}

/* ---- the optimizers, one function each ------------------------------------- */

typedef void (*update_fn)(opt *s, uint32_t p, uint32_t grad);

/* torch.optim.SGD: d = g + wd p; buf = g on the first step, else
 * momentum buf + (1 - dampening) d; d = d + momentum buf (Nesterov) or buf;
 * p -= lr d.  The first-step rule is folded into two f64 scalars. */
static void sgd(opt *s, uint32_t p, uint32_t grad)
{
	kiln_graph *g = s->g;
	const kiln_train_opts *o = s->o;
	kiln_dtype dt = dtype(s, p);
	uint32_t d = as(s, grad, dt);
	if (o->weight_decay != 0)
		d = kiln_add_at(g, HERE, d, kiln_mul_at(g, HERE, p, num(s, dt, o->weight_decay)));
	if (o->momentum != 0) {
		uint32_t buf = state(s, p, "momentum_buffer");
		uint32_t m = kiln_where_at(g, HERE, s->first, num(s, KILN_F64, 0),
		                           num(s, KILN_F64, o->momentum));
		uint32_t c = kiln_where_at(g, HERE, s->first, num(s, KILN_F64, 1),
		                           num(s, KILN_F64, 1 - o->dampening));
		uint32_t nb = kiln_add_at(g, HERE, kiln_mul_at(g, HERE, buf, as(s, m, dt)),
		                          kiln_mul_at(g, HERE, d, as(s, c, dt)));
		next(s, buf, nb);
		d = o->nesterov ? kiln_add_at(g, HERE, d,
		                              kiln_mul_at(g, HERE, nb, num(s, dt, o->momentum)))
		                : nb;
	}
	next(s, p, kiln_sub_at(g, HERE, p, kiln_mul_at(g, HERE, d, as(s, s->lr, dt))));
}

/* torch.optim.Adam / AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).  Adam adds wd p to
 * g first; AdamW scales p by 1 - lr wd first. */
static void adam(opt *s, uint32_t p, uint32_t grad)
{
	kiln_graph *g = s->g;
	const kiln_train_opts *o = s->o;
	kiln_dtype dt = dtype(s, p);
	uint32_t gr = as(s, grad, dt), p0 = p;
	bool decoupled = o->optim == KILN_OPT_ADAMW;
	if (o->weight_decay != 0 && !decoupled)
		gr = kiln_add_at(g, HERE, gr, kiln_mul_at(g, HERE, p, num(s, dt, o->weight_decay)));
	if (o->weight_decay != 0 && decoupled) {
		uint32_t f = kiln_sub_at(g, HERE, num(s, KILN_F64, 1),
		                         kiln_mul_at(g, HERE, s->lr, num(s, KILN_F64, o->weight_decay)));
		p = kiln_mul_at(g, HERE, p, as(s, f, dt));
	}
	uint32_t m = state(s, p0, "exp_avg"), v = state(s, p0, "exp_avg_sq");
	uint32_t nm = kiln_add_at(g, HERE, kiln_mul_at(g, HERE, m, num(s, dt, s->b1)),
	                          kiln_mul_at(g, HERE, gr, num(s, dt, 1 - s->b1)));
	uint32_t nv = kiln_add_at(g, HERE, kiln_mul_at(g, HERE, v, num(s, dt, s->b2)),
	                          kiln_mul_at(g, HERE, kiln_mul_at(g, HERE, gr, gr),
	                                      num(s, dt, 1 - s->b2)));
	uint32_t one = num(s, KILN_F64, 1);
	uint32_t bc1 = kiln_sub_at(g, HERE, one, kiln_pow_at(g, HERE, num(s, KILN_F64, s->b1), s->step));
	uint32_t bc2 = kiln_sub_at(g, HERE, one, kiln_pow_at(g, HERE, num(s, KILN_F64, s->b2), s->step));
	uint32_t size = as(s, kiln_div_at(g, HERE, s->lr, bc1), dt);
	uint32_t denom = kiln_add_at(g, HERE,
	                             kiln_div_at(g, HERE, kiln_sqrt_at(g, HERE, nv),
	                                         as(s, kiln_sqrt_at(g, HERE, bc2), dt)),
	                             num(s, dt, s->eps));
	uint32_t upd = kiln_mul_at(g, HERE, kiln_div_at(g, HERE, nm, denom), size);
	next(s, m, nm);
	next(s, v, nv);
	next(s, p0, kiln_sub_at(g, HERE, p, upd));
}

static const update_fn update_table[] = {
	[KILN_OPT_SGD] = sgd,
	[KILN_OPT_ADAM] = adam,
	[KILN_OPT_ADAMW] = adam,
};

/* ---- the pass ----------------------------------------------------------------- */

/* Options PyTorch would refuse, or kiln cannot do: a message, or NULL. */
static const char *bad_opts(const kiln_train_opts *o)
{
	if ((unsigned)o->optim >= sizeof update_table / sizeof *update_table)
		return "unknown optimizer kind";
	if (o->amsgrad)
		return "amsgrad is not supported (TODO(#5)); use Adam or AdamW without it";
	if (o->momentum < 0 || o->weight_decay < 0 || o->clip_norm < 0 || o->accum_steps < 0)
		return "momentum, weight_decay, clip_norm and accum_steps must be >= 0";
	if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
		return "Nesterov momentum requires a momentum and zero dampening";
	if (o->beta1 < 0 || o->beta1 >= 1 || o->beta2 < 0 || o->beta2 >= 1 || o->eps < 0)
		return "betas must be in [0, 1) and eps >= 0";
	return NULL;
}

kiln_status pass_optim(kiln_graph *g, const kiln_train_opts *o, const pass_optim_io *io)
{
	if (g->status != KILN_OK)
		return g->status;
	const char *why = bad_opts(o);
	if (why)
		return ir_errorf(g, NULL, o->amsgrad ? KILN_EUNSUPPORTED : KILN_EINVAL,
		                 "optimizer: %s", why);
	if ((o->accum_steps > 1) != (io->apply != 0))
		return ir_errorf(g, NULL, KILN_EINVAL, "optimizer: accum_steps %d needs an apply "
		                 "input exactly when > 1", o->accum_steps);
	opt s = {g, o, io->lr, io->step, io->apply, 0, o->beta1 ? o->beta1 : 0.9,
	         o->beta2 ? o->beta2 : 0.999, o->eps ? o->eps : 1e-8, ir_graph_loc(g)};
	s.first = kiln_less_at(g, s.loc, io->step, num(&s, KILN_F64, 1.5));
	uint32_t *grad = calloc((size_t)io->n + 1, sizeof *grad);
	if (!grad)
		return ir_errorf(g, NULL, KILN_ENOMEM, "optimizer: out of memory");
	memcpy(grad, io->grad, (size_t)io->n * sizeof *grad);
	for (int i = 0; i < io->n && g->status == KILN_OK; i++)
		if (!g->val[io->param[i]]->name)
			ir_errorf(g, NULL, KILN_EINVAL, "optimizer: parameter %u has no name",
			          (unsigned)io->param[i]);
	if (s.apply)
		accumulate(&s, io->n, io->param, grad);
	if (o->clip_norm > 0)
		clip(&s, io->n, grad);
	for (int i = 0; i < io->n && g->status == KILN_OK; i++)
		update_table[o->optim](&s, io->param[i], grad[i]);
	free(grad);
	return g->status;
}
