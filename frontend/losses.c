/*
 * losses.c: PyTorch's loss functions as DSL composites (MSE, cross-entropy
 * with label smoothing, L1, smooth L1, binary cross-entropy with logits).
 *
 * Each loss is traced from ordinary ops with gradient rules, so kiln_grad
 * differentiates it with no loss-specific backward code, and each follows
 * the formula in PyTorch's own implementation so that values and gradients
 * match it to rounding.  Plain cross-entropy is the SoftmaxCrossEntropyLoss
 * op; label smoothing adds PyTorch's smoothing term, normalised the way
 * aten's cross_entropy_loss_label_smoothing normalises it.  Binary
 * cross-entropy takes log(sigmoid(x)) and log(1 - sigmoid(x)) from a
 * LogSoftmax over the pair [x, 0], which is stable for any logit and,
 * unlike max(x, 0) + log1p(exp(-|x|)), has no kink whose subgradient
 * would be wrong at x = 0.  A failed call leaves the graph as it was.
 */
#include <string.h>

#include "frontend/frontend.h"

/* Records EINVAL unless r names a reduction; NULL means "mean". */
static const char *reduction(kiln_graph *g, kiln_loc loc, const char *what, const char *r)
{
	r = r ? r : "mean";
	if (strcmp(r, "mean") && strcmp(r, "sum") && strcmp(r, "none")) {
		ir_errorf_at(g, loc, KILN_EINVAL, "%s: reduction '%s' is not mean, sum or none",
		             what, r);
		return NULL;
	}
	return r;
}

static kiln_value reduce(kiln_graph *g, kiln_loc loc, kiln_value v, const char *r)
{
	if (!strcmp(r, "mean"))
		return kiln_reduce_mean_at(g, loc, v, 0, NULL, false);
	if (!strcmp(r, "sum"))
		return kiln_reduce_sum_at(g, loc, v, 0, NULL, false);
	return v;
}

/* Keeps a traced result, or undoes everything since m when it failed. */
static kiln_value done(kiln_graph *g, ir_mark m, kiln_value y)
{
	if (g->status != KILN_OK || !y) {
		ir_rollback(g, m);
		return KILN_NONE;
	}
	return y;
}

static kiln_dtype dtype_of(const kiln_graph *g, kiln_value v)
{
	return g->val[v]->type.dtype;
}

/* PyTorch's smoothing term: -sum_c w_c lp_c per element, 0 where ignored;
 * "mean" divides the sum by the summed target weights (or the count). */
static kiln_value smoothing(kiln_graph *g, kiln_loc loc, kiln_value lp, kiln_value target,
                            kiln_value weight, const char *r, int64_t ignore)
{
	const ir_type *t = &g->val[lp]->type;
	kiln_dtype dt = t->dtype, it = dtype_of(g, target);
	int64_t one = 1, axes[KILN_MAX_RANK] = {0};
	for (int i = 2; i < t->rank; i++)
		axes[i - 1] = i;
	kiln_value s = lp;
	if (weight)
		s = kiln_mul_at(g, loc, lp, kiln_unsqueeze_at(g, loc, weight, t->rank - 1, axes));
	s = kiln_neg_at(g, loc, kiln_reduce_sum_at(g, loc, s, 1, &one, false));
	kiln_value ig = kiln_equal_at(g, loc, target, kiln_scalar_at(g, loc, it, (double)ignore));
	kiln_value keep = kiln_cast_at(g, loc, kiln_not_at(g, loc, ig), dt);
	s = kiln_mul_at(g, loc, s, keep);
	if (strcmp(r, "mean"))
		return reduce(g, loc, s, r);
	kiln_value den = keep;
	if (weight) { /* ignored targets may be out of range: gather class 0 there */
		kiln_value safe = kiln_where_at(g, loc, ig, kiln_scalar_at(g, loc, it, 0), target);
		den = kiln_mul_at(g, loc, keep, kiln_gather_at(g, loc, weight, safe, 0));
	}
	return kiln_div_at(g, loc, kiln_reduce_sum_at(g, loc, s, 0, NULL, false),
	                   kiln_reduce_sum_at(g, loc, den, 0, NULL, false));
}

KILN_API kiln_value kiln_cross_entropy_at(kiln_graph *g, kiln_loc loc, kiln_value logits,
                                          kiln_value target, kiln_value weight,
                                          const char *r, int64_t ignore_index,
                                          double label_smoothing)
{
	if (!g || g->status != KILN_OK || !(r = reduction(g, loc, "CrossEntropyLoss", r)))
		return KILN_NONE;
	if (!(label_smoothing >= 0 && label_smoothing <= 1)) {
		ir_errorf_at(g, loc, KILN_EINVAL, "CrossEntropyLoss: label_smoothing %g is not in "
		             "[0, 1]", label_smoothing);
		return KILN_NONE;
	}
	if (label_smoothing == 0)
		return kiln_softmax_cross_entropy_at(g, loc, logits, target, weight, r, true,
		                                     ignore_index);
	ir_mark m = ir_mark_of(g);
	kiln_value lp = kiln_log_softmax_at(g, loc, logits, 1);
	kiln_value nll = kiln_nll_loss_at(g, loc, lp, target, weight, r, true, ignore_index);
	if (!nll)
		return done(g, m, KILN_NONE);
	int64_t C = g->val[lp]->type.dim[1];
	if (C < 0) {
		ir_errorf_at(g, loc, KILN_EUNSUPPORTED, "CrossEntropyLoss: label smoothing needs a "
		             "fixed class count, got logits %s",
		             ir_type_str(g, &g->val[lp]->type, (char[128]){0}, 128));
		return done(g, m, KILN_NONE);
	}
	kiln_dtype dt = dtype_of(g, lp);
	kiln_value s = smoothing(g, loc, lp, target, weight, r, ignore_index);
	kiln_value a = kiln_mul_at(g, loc, nll, kiln_scalar_at(g, loc, dt, 1 - label_smoothing));
	kiln_value b = kiln_mul_at(g, loc, s, kiln_scalar_at(g, loc, dt, label_smoothing / C));
	return done(g, m, kiln_add_at(g, loc, a, b));
}

/* MSE is a composite: (pred - target)^2, then mean, sum or nothing. */
KILN_API kiln_value kiln_mse_loss_at(kiln_graph *g, kiln_loc loc, kiln_value pred,
                                     kiln_value target, const char *r)
{
	if (!g || g->status != KILN_OK || !(r = reduction(g, loc, "MSELoss", r)))
		return KILN_NONE;
	ir_mark m = ir_mark_of(g);
	kiln_value d = kiln_sub_at(g, loc, pred, target);
	return done(g, m, reduce(g, loc, kiln_mul_at(g, loc, d, d), r));
}

KILN_API kiln_value kiln_l1_loss_at(kiln_graph *g, kiln_loc loc, kiln_value pred,
                                    kiln_value target, const char *r)
{
	if (!g || g->status != KILN_OK || !(r = reduction(g, loc, "L1Loss", r)))
		return KILN_NONE;
	ir_mark m = ir_mark_of(g);
	kiln_value d = kiln_abs_at(g, loc, kiln_sub_at(g, loc, pred, target));
	return done(g, m, reduce(g, loc, d, r));
}

KILN_API kiln_value kiln_smooth_l1_loss_at(kiln_graph *g, kiln_loc loc, kiln_value pred,
                                           kiln_value target, const char *r, double beta)
{
	if (!g || g->status != KILN_OK || !(r = reduction(g, loc, "SmoothL1Loss", r)))
		return KILN_NONE;
	if (!(beta >= 0)) {
		ir_errorf_at(g, loc, KILN_EINVAL, "SmoothL1Loss: beta %g is negative", beta);
		return KILN_NONE;
	}
	if (beta == 0) /* PyTorch's special case: exactly L1 */
		return kiln_l1_loss_at(g, loc, pred, target, r);
	ir_mark m = ir_mark_of(g);
	kiln_value d = kiln_abs_at(g, loc, kiln_sub_at(g, loc, pred, target));
	kiln_dtype dt = d ? dtype_of(g, d) : KILN_F32;
	kiln_value q = kiln_mul_at(g, loc, kiln_mul_at(g, loc, d, d),
	                           kiln_scalar_at(g, loc, dt, 0.5 / beta));
	kiln_value l = kiln_sub_at(g, loc, d, kiln_scalar_at(g, loc, dt, 0.5 * beta));
	kiln_value y = kiln_where_at(g, loc, kiln_less_at(g, loc, d, kiln_scalar_at(g, loc, dt, beta)),
	                             q, l);
	return done(g, m, reduce(g, loc, y, r));
}

/* log(sigmoid(x)) (k = 0) or log(1 - sigmoid(x)) (k = 1) from the pair lsm
 * = log_softmax([x, 0]) along a new last axis. */
static kiln_value half(kiln_graph *g, kiln_loc loc, kiln_value lsm, int64_t k)
{
	int64_t end = k + 1, axis = -1;
	kiln_value s = kiln_slice_at(g, loc, lsm, 1, &k, &end, &axis, NULL);
	return kiln_squeeze_at(g, loc, s, 1, &axis);
}

KILN_API kiln_value kiln_bce_with_logits_at(kiln_graph *g, kiln_loc loc, kiln_value logits,
                                            kiln_value target, kiln_value weight,
                                            kiln_value pos_weight, const char *r)
{
	if (!g || g->status != KILN_OK || !(r = reduction(g, loc, "BCEWithLogitsLoss", r)) ||
	    !ir_operand(g, loc, "BCEWithLogitsLoss", "logits", logits))
		return KILN_NONE;
	ir_mark m = ir_mark_of(g);
	kiln_dtype dt = dtype_of(g, logits);
	int64_t last = -1;
	kiln_value zero = kiln_mul_at(g, loc, logits, kiln_scalar_at(g, loc, dt, 0));
	kiln_value pair[2] = {kiln_unsqueeze_at(g, loc, logits, 1, &last),
	                      kiln_unsqueeze_at(g, loc, zero, 1, &last)};
	kiln_value lsm = kiln_log_softmax_at(g, loc, kiln_concat_at(g, loc, 2, pair, -1), -1);
	kiln_value a = pos_weight ? kiln_mul_at(g, loc, target, pos_weight) : target;
	kiln_value not_t = kiln_sub_at(g, loc, kiln_scalar_at(g, loc, dt, 1), target);
	kiln_value l = kiln_add_at(g, loc, kiln_mul_at(g, loc, a, half(g, loc, lsm, 0)),
	                           kiln_mul_at(g, loc, not_t, half(g, loc, lsm, 1)));
	l = kiln_neg_at(g, loc, l);
	if (weight)
		l = kiln_mul_at(g, loc, l, weight);
	return done(g, m, reduce(g, loc, l, r));
}
