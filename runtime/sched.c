/*
 * sched.c: host-side learning-rate schedules, the policies that feed a
 * train step's "lr" input (torch.optim.lr_scheduler's StepLR,
 * CosineAnnealingLR, OneCycleLR and LinearLR, and a linear warmup in front
 * of any of them).
 *
 * The key idea: the learning rate is a graph input, so a schedule is not
 * part of the compiled step at all; it is a pure function from the optimizer
 * step count to a number.  PyTorch computes most schedules recursively
 * (each lr from the previous one); kiln uses the closed forms PyTorch
 * documents, which agree with the recursion to rounding and make resuming
 * from a checkpoint trivial: the step count is the whole scheduler state.
 * "step" below is PyTorch's last_epoch: the number of scheduler.step()
 * calls before the optimizer step that uses the lr, starting at 0.
 *
 * Pure C on libc and libm, like the rest of runtime/, so a generated
 * training library can link it.
 */
#include <math.h>
#include <stdio.h>

#include "rt.h"

/* Zero fields mean PyTorch's defaults; resolved in one place. */
static kiln_sched defaults(const kiln_sched *s)
{
	kiln_sched d = *s;
	d.gamma = d.gamma != 0 ? d.gamma : 0.1;
	d.pct_start = d.pct_start != 0 ? d.pct_start : 0.3;
	d.div_factor = d.div_factor != 0 ? d.div_factor : 25;
	d.final_div_factor = d.final_div_factor != 0 ? d.final_div_factor : 1e4;
	d.start_factor = d.start_factor != 0 ? d.start_factor : 1.0 / 3;
	d.end_factor = d.end_factor != 0 ? d.end_factor : 1.0;
	d.total_steps = d.kind == KILN_SCHED_LINEAR && d.total_steps == 0 ? 5 : d.total_steps;
	d.warmup_start_factor = d.warmup_start_factor != 0 ? d.warmup_start_factor : 1.0 / 3;
	return d;
}

KILN_API kiln_status kiln_sched_check(const kiln_sched *s, kiln_error *err)
{
	if (!s)
		return rt_seterr(err, KILN_EINVAL, "schedule: null pointer");
	kiln_sched d = defaults(s);
	const char *why = NULL;
	if ((unsigned)d.kind > KILN_SCHED_LINEAR)
		why = "unknown kind";
	else if (!(d.base_lr >= 0) || !isfinite(d.base_lr))
		why = "base_lr must be finite and >= 0";
	else if (d.kind == KILN_SCHED_STEP && d.step_size <= 0)
		why = "StepLR needs step_size > 0";
	else if (d.kind == KILN_SCHED_COSINE && d.t_max <= 0)
		why = "CosineAnnealingLR needs t_max > 0";
	else if (d.kind == KILN_SCHED_ONECYCLE && d.total_steps <= 1)
		why = "OneCycleLR needs total_steps > 1";
	else if (d.kind == KILN_SCHED_ONECYCLE && !(d.pct_start > 0 && d.pct_start < 1))
		why = "OneCycleLR needs pct_start in (0, 1)";
	else if (d.kind == KILN_SCHED_LINEAR &&
	         (!(d.start_factor > 0 && d.start_factor <= 1) || d.end_factor < 0 ||
	          d.end_factor > 1 || d.total_steps <= 0))
		why = "LinearLR needs start_factor in (0, 1], end_factor in [0, 1], total_steps > 0";
	else if (d.warmup_steps < 0 || !(d.warmup_start_factor > 0 && d.warmup_start_factor <= 1))
		why = "warmup needs warmup_steps >= 0 and warmup_start_factor in (0, 1]";
	if (why)
		return rt_seterr(err, KILN_EINVAL, "schedule (kind %d): %s", (int)s->kind, why);
	return KILN_OK;
}

/* ---- one function per schedule, indexed by kind ------------------------- */

typedef double (*sched_fn)(const kiln_sched *s, int64_t step);

static double constant(const kiln_sched *s, int64_t step)
{
	return s->base_lr;
}

/* StepLR: base * gamma^floor(step / step_size). */
static double step_lr(const kiln_sched *s, int64_t step)
{
	return s->base_lr * pow(s->gamma, (double)(step / s->step_size));
}

/* CosineAnnealingLR's closed form (periodic with period 2 t_max, as its
 * recursion is). */
static double cosine(const kiln_sched *s, int64_t step)
{
	return s->eta_min + (s->base_lr - s->eta_min) *
	                    (1 + cos(M_PI * (double)step / (double)s->t_max)) / 2;
}

static double anneal(const kiln_sched *s, double start, double end, double pct)
{
	if (s->anneal_linear)
		return (end - start) * pct + start;
	return end + (start - end) / 2.0 * (cos(M_PI * pct) + 1);
}

/* OneCycleLR: up from max/div to max over pct_start of the steps, then
 * down to max/div/final_div (three_phase: back to max/div first).  Phase
 * boundaries are the same float expressions PyTorch uses; steps past
 * total_steps - 1 hold the last step's value instead of raising. */
static double onecycle(const kiln_sched *s, int64_t step)
{
	double init = s->base_lr / s->div_factor, lo = init / s->final_div_factor;
	double up = s->pct_start * (double)s->total_steps - 1, last = (double)s->total_steps - 1;
	double end[3], from[3], to[3];
	int n;
	if (s->three_phase) {
		n = 3;
		end[0] = up, end[1] = 2 * s->pct_start * (double)s->total_steps - 2, end[2] = last;
		from[0] = init, to[0] = s->base_lr, from[1] = s->base_lr, to[1] = init;
		from[2] = init, to[2] = lo;
	} else {
		n = 2;
		end[0] = up, end[1] = last;
		from[0] = init, to[0] = s->base_lr, from[1] = s->base_lr, to[1] = lo;
	}
	double t = step < s->total_steps ? (double)step : last, start = 0;
	for (int i = 0; i < n; i++) {
		if (t <= end[i] || i == n - 1)
			return anneal(s, from[i], to[i], (t - start) / (end[i] - start));
		start = end[i];
	}
	return lo; /* not reached */
}

/* LinearLR: the factor moves linearly from start to end over total_steps. */
static double linear(const kiln_sched *s, int64_t step)
{
	double k = (double)(step < s->total_steps ? step : s->total_steps) / (double)s->total_steps;
	return s->base_lr * (s->start_factor + (s->end_factor - s->start_factor) * k);
}

static const sched_fn sched_table[] = {
	[KILN_SCHED_CONSTANT] = constant,
	[KILN_SCHED_STEP] = step_lr,
	[KILN_SCHED_COSINE] = cosine,
	[KILN_SCHED_ONECYCLE] = onecycle,
	[KILN_SCHED_LINEAR] = linear,
};

/* Warmup then the schedule, as SequentialLR([LinearLR(warmup_start_factor,
 * total_iters=warmup_steps), schedule], milestones=[warmup_steps]): the
 * schedule restarts its own count at the milestone. */
KILN_API double kiln_sched_lr(const kiln_sched *s, int64_t step)
{
	if (kiln_sched_check(s, NULL) != KILN_OK)
		return NAN;
	kiln_sched d = defaults(s);
	step = step < 0 ? 0 : step;
	if (step < d.warmup_steps) {
		kiln_sched w = d;
		w.start_factor = d.warmup_start_factor, w.end_factor = 1, w.total_steps = d.warmup_steps;
		return linear(&w, step);
	}
	return sched_table[d.kind](&d, step - d.warmup_steps);
}
