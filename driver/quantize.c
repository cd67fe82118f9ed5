/*
 * quantize.c: kiln_quantize, post-training int8 quantization by
 * calibration (docs/QUANTIZATION.md).
 *
 * The stages, on a private clone of the graph:
 *   1. prepare: the inference passes that change what a layer is (BN folded
 *      into its conv, Identity/Dropout gone), but not nnfuse or qfuse;
 *   2. plan (passes/quantize.c): the layers and the activations they read;
 *   3. calibrate: the graph with every observed value made an output is
 *      compiled (kiln_compile into a temporary folder, then kiln_load) and
 *      run over the samples: min/max, then for percentile and entropy a
 *      histogram of each value in a second sweep;
 *   4. apply: the QDQ graph with the ranges found (the result);
 *   5. measure: the QDQ graph, with each layer's result (after its DQ) an
 *      output too, compiled as kiln_compile would compile it (qfuse: the
 *      8-bit kernels) and run beside the f32 one over the samples: each
 *      layer's error, saturation, and the outputs' error, cosine, top-1.
 * A graph input that a layer reads is observed from the samples themselves.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "passes/passes.h"

#define PREPARE "infer,canonicalize,fold,bnfold,fold,cse,dce"
enum { ENTROPY_BINS = 2048, PERCENTILE_BINS = 8192 };

/* What one observed f32 value accumulates over the samples. */
typedef struct obs {
	uint32_t v;         /* value id in the prepared graph */
	int out;            /* its output index in the f32 library, -1: a graph input */
	int input;          /* ... which input, when out is -1 */
	double min, max;    /* sweep 1 */
	uint64_t *hist;     /* sweep 2 */
	double hlo, hwidth; /* the histogram's left edge and bin width */
	int nbins;
	bool abs;           /* histogram of |x| (entropy on a signed value) */
} obs;

/* A layer's or output's error against f32 (sweep 3). */
typedef struct err_acc {
	double d2, f2, q2, dot, maxd;
	int64_t n, sat, rows, agree;
} err_acc;

typedef struct qctx {
	const kiln_quant_opts *o;
	kiln_graph *g;          /* prepared */
	pass_qplan plan;
	obs *ob;                /* one per tensor, then per layer result not a tensor */
	int nob;
	int *layer_ob;          /* layer i's result: its obs */
	kiln_tensor *const *calib;
	int ncalib;
	int64_t samples, per_run;
	bool stacked;           /* calib has an extra leading axis */
	kiln_model *mf, *mq;    /* the f32 and int8 observer libraries */
	int nf_out;             /* outputs of the f32 graph before the observed ones */
	int *q_out;             /* layer i's result in mq's outputs */
	err_acc *lerr, *oerr;   /* per layer, per graph output (sweep 3) */
	kiln_error *err;
} qctx;


/* ---- inputs ------------------------------------------------------------------ */

static kiln_status check_calib(qctx *c)
{
	const kiln_graph *g = c->g;
	char want[256], got[256];
	if (c->ncalib != (int)g->ninput)
		return ir_seterr(c->err, KILN_EINVAL, "quantize: the graph has %u input%s, %d "
		                 "calibration tensor%s given", g->ninput, g->ninput == 1 ? "" : "s",
		                 c->ncalib, c->ncalib == 1 ? "" : "s");
	for (int i = 0; i < c->ncalib; i++) {
		const ir_value *in = g->val[g->input[i]];
		const kiln_tensor *t = c->calib[i];
		const ir_type *ty = &in->type;
		ir_type_str(g, ty, want, sizeof want);
		if (!t)
			return ir_seterr(c->err, KILN_EINVAL, "quantize: no calibration tensor for "
			                 "input '%s'", in->name ? in->name : "?");
		kiln_type_str(g, t->dtype, t->rank, t->shape, got, sizeof got);
		bool stacked = t->rank == ty->rank + 1, ok = t->dtype == ty->dtype &&
		               (stacked || t->rank == ty->rank) && t->rank >= 1 && t->shape[0] > 0;
		for (int d = 1; ok && d < t->rank; d++) {
			int64_t dim = ty->dim[stacked ? d - 1 : d];
			ok = ir_dim_expr(g, dim) != NULL || dim == t->shape[d];
		}
		if (ok && stacked && ir_dim_expr(g, ty->dim[0]) == NULL && ty->rank > 0)
			ok = ty->dim[0] == t->shape[1];
		if (!ok)
			return ir_seterr(c->err, KILN_EINVAL, "quantize: calibration data for input '%s' "
			                 "is %s: it must be samples of %s stacked along axis 0 (the same "
			                 "rank, or one axis more)", in->name ? in->name : "?", got, want);
		if (i == 0) {
			c->stacked = stacked, c->samples = t->shape[0];
		} else if (stacked != c->stacked || t->shape[0] != c->samples) {
			return ir_seterr(c->err, KILN_EINVAL, "quantize: calibration tensors disagree on "
			                 "the number of samples (input '%s' has %s)",
			                 in->name ? in->name : "?", got);
		}
		if (kiln_dtype_is_float(t->dtype))
			for (int64_t k = 0; k < kiln_tensor_numel(t); k++)
				if (!isfinite(ir_load(t, k)))
					return ir_seterr(c->err, KILN_EINVAL, "quantize: calibration data for "
					                 "input '%s' has a non-finite value at element %lld",
					                 in->name ? in->name : "?", (long long)k);
	}
	/* a run takes dim 0 of the input when it is fixed, else o->batch */
	const ir_type *t0 = &g->val[g->input[0]]->type;
	bool sym = t0->rank > 0 && ir_dim_expr(g, t0->dim[0]) != NULL;
	c->per_run = c->stacked ? 1 : sym ? (c->o->batch > 0 ? c->o->batch : 16) : t0->dim[0];
	if (!c->stacked && !sym && c->samples % c->per_run)
		return ir_seterr(c->err, KILN_EINVAL, "quantize: %lld calibration samples do not split "
		                 "into runs of %lld (dim 0 of input '%s' is fixed)",
		                 (long long)c->samples, (long long)c->per_run,
		                 g->val[g->input[0]]->name ? g->val[g->input[0]]->name : "?");
	return KILN_OK;
}

/* Inputs for samples [s, s + n): slices (or, stacked, the one sample). */
static kiln_status slice_inputs(qctx *c, int64_t s, int64_t n, kiln_tensor **in)
{
	for (int i = 0; i < c->ncalib; i++) {
		const kiln_tensor *t = c->calib[i];
		int64_t shape[KILN_MAX_RANK];
		int rank = c->stacked ? t->rank - 1 : t->rank;
		for (int d = 0; d < rank; d++)
			shape[d] = c->stacked ? t->shape[d + 1] : d == 0 ? n : t->shape[d];
		size_t row = kiln_tensor_nbytes(t) / (size_t)t->shape[0];
		if (!(in[i] = kiln_tensor_new(t->dtype, rank, shape)))
			return ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
		memcpy(in[i]->data, (const char *)t->data + (size_t)s * row, (size_t)n * row);
	}
	return KILN_OK;
}

/* ---- the observer libraries -------------------------------------------------- */

/* Output index of v in g, adding it (named "name" when unnamed) if absent. */
static int output_of(kiln_graph *g, uint32_t v, const char *name)
{
	for (uint32_t i = 0; i < g->noutput; i++)
		if (g->output[i] == v)
			return (int)i;
	return ir_output_add(g, v, name) == KILN_OK ? (int)g->noutput - 1 : -1;
}

/* Compiles g into a temporary folder and loads it; the files are gone
 * again once loaded. */
static kiln_status build(qctx *c, const kiln_graph *g, const char *tag, kiln_model **m)
{
	const char *tmp = getenv("TMPDIR");
	char dir[4096], so[4200], h[4200];
	snprintf(dir, sizeof dir, "%s/kiln-quantize-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		return ir_seterr(c->err, KILN_EIO, "quantize: cannot make a temporary folder in %s: %s",
		                 tmp && *tmp ? tmp : "/tmp", strerror(errno));
	snprintf(so, sizeof so, "%s/%s.so", dir, tag);
	snprintf(h, sizeof h, "%s/%s.h", dir, tag);
	kiln_compile_opts co = c->o->compile ? *c->o->compile : (kiln_compile_opts){0};
	co.name = tag, co.emit = NULL, co.passes = NULL, co.times = NULL;
	kiln_status st = kiln_compile(g, so, &co, c->err);
	if (st == KILN_OK)
		st = kiln_load(so, m, c->err);
	if (st == KILN_OK)
		st = kiln_model_set_threads(*m, c->o->threads, c->err);
	unlink(so), unlink(h), rmdir(dir);
	return st;
}

/* The f32 library: the prepared graph, every observed value an output. */
static kiln_status build_f32(qctx *c)
{
	kiln_graph *f = ir_graph_clone(c->g);
	if (!f)
		return ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
	c->nf_out = (int)f->noutput;
	char name[64];
	for (int i = 0; i < c->nob; i++) {
		obs *o = &c->ob[i];
		o->out = o->input = -1;
		if (f->val[o->v]->kind == IR_V_INPUT) {
			for (uint32_t k = 0; k < f->ninput; k++)
				if (f->input[k] == o->v)
					o->input = (int)k;
			continue;
		}
		snprintf(name, sizeof name, "kiln_observe_%d", i);
		if ((o->out = output_of(f, o->v, name)) < 0) {
			kiln_graph_free(f);
			return ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
		}
	}
	kiln_status st = build(c, f, "kiln_calib_f32", &c->mf);
	kiln_graph_free(f);
	return st;
}

/* Runs the f32 library (and the int8 one when both) over every sample:
 * visit(c, f32 outputs, int8 outputs, inputs, samples in the run). */
typedef kiln_status (*visit_fn)(qctx *c, kiln_tensor **fo, kiln_tensor **qo, kiln_tensor **in,
                                int64_t n);

static kiln_status sweep(qctx *c, bool both, visit_fn visit)
{
	int nf = kiln_model_num_outputs(c->mf), nq = both ? kiln_model_num_outputs(c->mq) : 0;
	kiln_tensor **fo = calloc((size_t)nf + 1, sizeof *fo), **qo = calloc((size_t)nq + 1, sizeof *qo);
	kiln_tensor **in = calloc((size_t)c->ncalib + 1, sizeof *in);
	kiln_status st = fo && qo && in ? KILN_OK : ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
	for (int64_t s = 0; st == KILN_OK && s < c->samples; s += c->per_run) {
		int64_t n = c->samples - s < c->per_run ? c->samples - s : c->per_run;
		st = slice_inputs(c, s, n, in);
		if (st == KILN_OK)
			st = kiln_model_run(c->mf, in, c->ncalib, fo, nf, c->err);
		if (st == KILN_OK && both)
			st = kiln_model_run(c->mq, in, c->ncalib, qo, nq, c->err);
		if (st == KILN_OK)
			st = visit(c, fo, qo, in, c->stacked ? 1 : n);
		for (int i = 0; i < nf; i++)
			kiln_tensor_free(fo[i]), fo[i] = NULL;
		for (int i = 0; i < nq; i++)
			kiln_tensor_free(qo[i]), qo[i] = NULL;
		for (int i = 0; i < c->ncalib; i++)
			kiln_tensor_free(in[i]), in[i] = NULL;
	}
	free(fo), free(qo), free(in);
	return st;
}

static const kiln_tensor *observed(const obs *o, kiln_tensor **fo, kiln_tensor **in)
{
	return o->out >= 0 ? fo[o->out] : in[o->input];
}

static const char *value_name(const qctx *c, uint32_t v)
{
	const ir_value *x = c->g->val[v];
	if (x->name)
		return x->name;
	return x->kind == IR_V_NODE && x->def && x->def->name ? x->def->name : "?";
}

/* ---- calibration ---------------------------------------------------------------- */

static kiln_status visit_minmax(qctx *c, kiln_tensor **fo, kiln_tensor **qo, kiln_tensor **in,
                                int64_t n)
{
	(void)qo, (void)n;
	for (int i = 0; i < c->plan.nt; i++) {
		obs *o = &c->ob[i];
		const kiln_tensor *t = observed(o, fo, in);
		const float *x = t->data;
		for (int64_t k = 0; k < kiln_tensor_numel(t); k++) {
			if (!isfinite(x[k]))
				return ir_seterr(c->err, KILN_EINVAL, "quantize: '%s' is %g on a calibration "
				                 "sample: the f32 model overflows there", value_name(c, o->v),
				                 (double)x[k]);
			o->min = x[k] < o->min ? x[k] : o->min;
			o->max = x[k] > o->max ? x[k] : o->max;
		}
	}
	return KILN_OK;
}

static kiln_status visit_hist(qctx *c, kiln_tensor **fo, kiln_tensor **qo, kiln_tensor **in,
                              int64_t n)
{
	(void)qo, (void)n;
	for (int i = 0; i < c->plan.nt; i++) {
		obs *o = &c->ob[i];
		const kiln_tensor *t = observed(o, fo, in);
		const float *x = t->data;
		for (int64_t k = 0; k < kiln_tensor_numel(t); k++) {
			double v = o->abs ? fabs(x[k]) : x[k];
			double b = o->hwidth > 0 ? floor((v - o->hlo) / o->hwidth) : 0;
			int bin = b < 0 ? 0 : b >= o->nbins ? o->nbins - 1 : (int)b;
			o->hist[bin]++;
		}
	}
	return KILN_OK;
}

/* TensorRT's entropy calibration over h[0..nb): the threshold (in bins)
 * whose nq-level quantization of the histogram is closest, in KL
 * divergence, to the histogram with the outliers folded into its edge. */
static int kl_threshold(const uint64_t *h, int nb, int nq)
{
	double *p = malloc((size_t)nb * sizeof *p), *q = malloc((size_t)nb * sizeof *q);
	double *tail = malloc(((size_t)nb + 1) * sizeof *tail);
	if (!p || !q || !tail) {
		free(p), free(q), free(tail);
		return nb;
	}
	tail[nb] = 0;
	for (int i = nb; i-- > 0;)
		tail[i] = tail[i + 1] + (double)h[i];
	int best = nb;
	double best_kl = INFINITY;
	for (int i = nq; i <= nb; i++) {
		double sp = 0, sq = 0;
		for (int j = 0; j < i; j++)
			p[j] = (double)h[j];
		p[i - 1] += tail[i];
		for (int k = 0; k < nq; k++) {
			int a = (int)((int64_t)k * i / nq), b = (int)((int64_t)(k + 1) * i / nq);
			double tot = 0;
			int nz = 0;
			for (int j = a; j < b; j++)
				tot += (double)h[j], nz += h[j] != 0;
			for (int j = a; j < b; j++)
				q[j] = h[j] ? tot / nz : 0;
		}
		for (int j = 0; j < i; j++)
			sp += p[j], sq += q[j];
		if (sp <= 0 || sq <= 0)
			continue;
		double kl = 0;
		for (int j = 0; j < i; j++) {
			if (p[j] <= 0)
				continue;
			double pj = p[j] / sp, qj = q[j] > 0 ? q[j] / sq : 1e-4 / sq;
			kl += pj * log(pj / qj);
		}
		if (kl < best_kl)
			best_kl = kl, best = i;
	}
	free(p), free(q), free(tail);
	return best;
}

/* Bin edge below which share `tail` of the histogram's mass lies, counted
 * from the left (or from the right when from_right). */
static double percentile_edge(const obs *o, double tail, bool from_right)
{
	uint64_t total = 0;
	for (int b = 0; b < o->nbins; b++)
		total += o->hist[b];
	double want = tail * (double)total, acc = 0;
	for (int k = 0; k < o->nbins; k++) {
		int b = from_right ? o->nbins - 1 - k : k;
		acc += (double)o->hist[b];
		if (acc > want)
			return o->hlo + o->hwidth * (from_right ? b + 1 : b);
	}
	return from_right ? o->hlo : o->hlo + o->hwidth * o->nbins;
}

static kiln_status calibrate(qctx *c)
{
	for (int i = 0; i < c->plan.nt; i++)
		c->ob[i].min = INFINITY, c->ob[i].max = -INFINITY;
	kiln_status st = sweep(c, false, visit_minmax);
	kiln_calib_method m = c->o->method;
	if (st != KILN_OK || m == KILN_CALIB_MINMAX) {
		for (int i = 0; st == KILN_OK && i < c->plan.nt; i++)
			c->plan.t[i].lo = c->ob[i].min, c->plan.t[i].hi = c->ob[i].max;
		return st;
	}
	for (int i = 0; i < c->plan.nt; i++) {
		obs *o = &c->ob[i];
		o->abs = m == KILN_CALIB_ENTROPY && o->min < 0;
		o->nbins = m == KILN_CALIB_ENTROPY ? ENTROPY_BINS : PERCENTILE_BINS;
		o->hlo = m == KILN_CALIB_ENTROPY ? 0 : o->min;
		double top = m == KILN_CALIB_ENTROPY ? fmax(fabs(o->min), fabs(o->max)) : o->max;
		o->hwidth = (top - o->hlo) / o->nbins;
		if (!(o->hist = calloc((size_t)o->nbins, sizeof *o->hist)))
			return ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
	}
	if ((st = sweep(c, false, visit_hist)) != KILN_OK)
		return st;
	double pct = c->o->percentile > 0 ? c->o->percentile : 99.999;
	for (int i = 0; i < c->plan.nt; i++) {
		obs *o = &c->ob[i];
		pass_qtensor *t = &c->plan.t[i];
		if (m == KILN_CALIB_PERCENTILE) {
			t->lo = percentile_edge(o, 1 - pct / 100, false);
			t->hi = percentile_edge(o, 1 - pct / 100, true);
		} else {
			/* a value >= 0 (after a Relu) piles up at 0, which u8 holds
			 * exactly whatever the threshold: the spike only drowns
			 * the comparison of the rest, so it is left out */
			if (!o->abs)
				o->hist[0] = 0;
			int b = kl_threshold(o->hist, o->nbins, o->abs ? 128 : 255);
			double thr = o->hwidth * b;
			t->lo = o->abs ? fmax(o->min, -thr) : fmax(o->min, 0);
			t->hi = fmin(o->max, thr);
		}
		t->lo = fmax(t->lo, o->min), t->hi = fmin(t->hi, o->max);
		if (t->lo > t->hi) /* a constant value */
			t->lo = o->min, t->hi = o->max;
	}
	return KILN_OK;
}

/* ---- measuring the result ---------------------------------------------------------- */

/* The QDQ graph with each layer's result (after its DQ) an output too. */
static kiln_status build_int8(qctx *c, const kiln_graph *q)
{
	kiln_graph *m = ir_graph_clone(q);
	if (!m || !(c->q_out = calloc((size_t)c->plan.nl + 1, sizeof *c->q_out))) {
		kiln_graph_free(m);
		return ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
	}
	char name[64];
	for (int i = 0; i < c->plan.nl; i++) {
		const pass_qlayer *l = &c->plan.l[i];
		uint32_t v = l->q >= 0 ? c->plan.t[l->q].dq : l->out;
		snprintf(name, sizeof name, "kiln_observe_q%d", i);
		if ((c->q_out[i] = output_of(m, v, name)) < 0) {
			kiln_graph_free(m);
			return ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
		}
	}
	kiln_status st = build(c, m, "kiln_calib_int8", &c->mq);
	kiln_graph_free(m);
	return st;
}

static void accumulate(err_acc *a, const float *f, const float *q, int64_t n, const float *bound)
{
	for (int64_t k = 0; k < n; k++) {
		double d = (double)q[k] - f[k];
		a->d2 += d * d, a->f2 += (double)f[k] * f[k], a->q2 += (double)q[k] * q[k];
		a->dot += (double)f[k] * q[k];
		a->maxd = fmax(a->maxd, fabs(d));
		if (bound && (f[k] < bound[0] || f[k] > bound[1]))
			a->sat++;
	}
	a->n += n;
}

/* The u8 range of tensor t in f32, half a step beyond each end. */
static void u8_bounds(const pass_qtensor *t, float *b)
{
	b[0] = (float)((0 - t->zp - 0.5) * t->scale);
	b[1] = (float)((255 - t->zp + 0.5) * t->scale);
}

static kiln_status visit_errors(qctx *c, kiln_tensor **fo, kiln_tensor **qo, kiln_tensor **in,
                                int64_t n)
{
	(void)n;
	for (int i = 0; i < c->plan.nl; i++) {
		const pass_qlayer *l = &c->plan.l[i];
		const kiln_tensor *f = observed(&c->ob[c->layer_ob[i]], fo, in), *q = qo[c->q_out[i]];
		float b[2];
		if (l->q >= 0)
			u8_bounds(&c->plan.t[l->q], b);
		if (kiln_tensor_numel(f) != kiln_tensor_numel(q))
			return ir_seterr(c->err, KILN_EVERIFY, "quantize: layer %d's result has %lld "
			                 "values in f32, %lld in int8", i, (long long)kiln_tensor_numel(f),
			                 (long long)kiln_tensor_numel(q));
		accumulate(&c->lerr[i], f->data, q->data, kiln_tensor_numel(f), l->q >= 0 ? b : NULL);
	}
	for (int i = 0; i < c->nf_out; i++) {
		const kiln_tensor *f = fo[i], *q = qo[i];
		if (f->dtype != KILN_F32 || q->dtype != KILN_F32 ||
		    kiln_tensor_numel(f) != kiln_tensor_numel(q))
			continue;
		accumulate(&c->oerr[i], f->data, q->data, kiln_tensor_numel(f), NULL);
		if (f->rank != 2 || f->shape[1] < 2)
			continue;
		const float *a = f->data, *b = q->data;
		for (int64_t r = 0; r < f->shape[0]; r++) {
			int64_t C = f->shape[1], ia = 0, ib = 0;
			for (int64_t k = 1; k < C; k++) {
				ia = a[r * C + k] > a[r * C + ia] ? k : ia;
				ib = b[r * C + k] > b[r * C + ib] ? k : ib;
			}
			c->oerr[i].rows++, c->oerr[i].agree += ia == ib;
		}
	}
	return KILN_OK;
}

/* ---- the report ----------------------------------------------------------------- */

static char *dup_str(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = malloc(n);
	return d ? memcpy(d, s, n) : NULL;
}

KILN_API void kiln_quant_report_free(kiln_quant_report *r)
{
	if (!r)
		return;
	for (int i = 0; r->layers && i < r->nlayers; i++)
		free((char *)r->layers[i].name);
	for (int i = 0; r->outputs && i < r->noutputs; i++)
		free((char *)r->outputs[i].name);
	free(r->layers), free(r->outputs), free(r);
}

static double ratio(double a, double b)
{
	return b > 0 ? sqrt(a / b) : a > 0 ? INFINITY : 0;
}

static kiln_status make_report(qctx *c, kiln_quant_report **out)
{
	kiln_quant_report *r = calloc(1, sizeof *r);
	if (!r)
		return ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
	r->samples = c->samples, r->method = c->o->method;
	r->layers = calloc((size_t)c->plan.nl + 1, sizeof *r->layers);
	r->outputs = calloc((size_t)c->nf_out + 1, sizeof *r->outputs);
	bool ok = r->layers && r->outputs;
	int count[KILN_OP_COUNT] = {0};
	char buf[128];
	for (int i = 0; ok && i < c->plan.nl; i++, r->nlayers++) {
		const pass_qlayer *l = &c->plan.l[i];
		const ir_node *n = c->g->node[l->node];
		kiln_quant_layer *y = &r->layers[i];
		const err_acc *e = &c->lerr[i];
		snprintf(buf, sizeof buf, "%s#%d", ir_op(n->op)->onnx, count[n->op]++);
		ok = (y->name = dup_str(n->name ? n->name : buf)) != NULL;
		y->op = ir_op(n->op)->onnx;
		y->quantized = l->q >= 0;
		y->rel_error = ratio(e->d2, e->f2);
		y->max_error = e->maxd;
		y->scale = NAN, y->lo = y->hi = NAN;
		if (y->quantized) {
			const pass_qtensor *t = &c->plan.t[l->q]; /* lo, hi: its source's (apply) */
			y->scale = t->scale, y->zero_point = t->zp;
			y->lo = t->lo, y->hi = t->hi;
			y->saturation = e->n ? (double)e->sat / (double)e->n : 0;
			y->max_error /= t->scale;
		}
	}
	for (int i = 0; ok && i < c->nf_out; i++, r->noutputs++) {
		const err_acc *e = &c->oerr[i];
		kiln_quant_output *y = &r->outputs[i];
		ok = (y->name = dup_str(kiln_model_output_name(c->mf, i))) != NULL;
		y->rel_error = e->n ? ratio(e->d2, e->f2) : NAN;
		y->cosine = e->n ? (e->f2 > 0 && e->q2 > 0 ? e->dot / sqrt(e->f2 * e->q2) : 1) : NAN;
		y->top1 = e->rows ? (double)e->agree / (double)e->rows : NAN;
	}
	if (!ok) {
		kiln_quant_report_free(r);
		return ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
	}
	*out = r;
	return KILN_OK;
}

/* ---- kiln_quantize ------------------------------------------------------------- */

static bool is_quant_op(kiln_op op)
{
	return op == KILN_OP_QUANTIZE_LINEAR || op == KILN_OP_DEQUANTIZE_LINEAR ||
	       op == KILN_OP_QLINEAR_CONV || op == KILN_OP_QLINEAR_MATMUL ||
	       op == KILN_OP_CONV_INTEGER || op == KILN_OP_MATMUL_INTEGER ||
	       op == KILN_OP_DYNAMIC_QUANTIZE_LINEAR;
}

static kiln_status prepare(qctx *c, const kiln_graph *g)
{
	if (g->training)
		return ir_seterr(c->err, KILN_EINVAL, "quantize: graph '%s' is traced in training mode: "
		                 "quantize its eval-mode graph", g->name ? g->name : "?");
	for (uint32_t i = 0; i < g->nnode; i++)
		if (!g->node[i]->dead && is_quant_op(g->node[i]->op)) {
			char d[160];
			return ir_seterr(c->err, KILN_EINVAL, "quantize: graph '%s' is quantized already "
			                 "(%s)", g->name ? g->name : "?", ir_node_desc(g->node[i], d, sizeof d));
		}
	if (!(c->g = ir_graph_clone(g)))
		return ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
	kiln_status st = kiln_graph_verify(c->g, c->err);
	if (st == KILN_OK)
		st = pass_run_list(c->g, PREPARE, &(pass_opts){0}, c->err);
	if (st == KILN_OK && (st = pass_qplan_build(c->g, c->o->keep_float, c->o->nkeep_float,
	                                              &c->plan)) != KILN_OK)
		ir_seterr(c->err, st, "%s", c->g->errmsg);
	if (st == KILN_OK && c->plan.nl == 0)
		return ir_seterr(c->err, KILN_EINVAL, "quantize: graph '%s' has nothing to quantize (no "
		                 "Conv, MatMul or Gemm with fixed f32 weights%s)",
		                 g->name ? g->name : "?", c->o->nkeep_float ? " outside --keep-float" : "");
	return st;
}

/* The observed values: the tensors, then each layer result that is not one. */
static kiln_status observe(qctx *c)
{
	c->ob = calloc((size_t)(c->plan.nt + c->plan.nl) + 1, sizeof *c->ob);
	c->layer_ob = calloc((size_t)c->plan.nl + 1, sizeof *c->layer_ob);
	c->lerr = calloc((size_t)c->plan.nl + 1, sizeof *c->lerr);
	if (!c->ob || !c->layer_ob || !c->lerr)
		return ir_seterr(c->err, KILN_ENOMEM, "quantize: out of memory");
	for (int i = 0; i < c->plan.nt; i++)
		c->ob[c->nob++].v = c->plan.t[i].v;
	for (int i = 0; i < c->plan.nl; i++) {
		int k = 0;
		while (k < c->nob && c->ob[k].v != c->plan.l[i].out)
			k++;
		if (k == c->nob)
			c->ob[c->nob++].v = c->plan.l[i].out;
		c->layer_ob[i] = k;
	}
	return KILN_OK;
}

/* Parameters nothing reads any more (the f32 weights quantized away). */
static kiln_status drop_unused(kiln_graph *g)
{
	kiln_status st = pass_run_list(g, "dce", &(pass_opts){0}, NULL);
	for (uint32_t i = 1; st == KILN_OK && i < g->nval; i++)
		if (g->val[i]->kind == IR_V_PARAM && g->val[i]->nuse == 0 && !pass_is_output(g, i))
			g->val[i]->kind = IR_V_NONE;
	return st == KILN_OK ? ir_compact(g) : st;
}

KILN_API kiln_status kiln_quantize(const kiln_graph *g, kiln_tensor *const *calib, int ncalib,
                                   const kiln_quant_opts *o, kiln_graph **out,
                                   kiln_quant_report **report, kiln_error *err)
{
	kiln_quant_opts dflt = {0};
	qctx c = {.o = o ? o : &dflt, .calib = calib, .ncalib = ncalib, .err = err};
	if (out)
		*out = NULL;
	if (report)
		*report = NULL;
	if (!g || !out || (ncalib && !calib))
		return ir_seterr(err, KILN_EINVAL, "quantize: NULL argument");
	if ((unsigned)c.o->method > KILN_CALIB_ENTROPY || c.o->nkeep_float < 0 ||
	    (c.o->nkeep_float && !c.o->keep_float) || c.o->batch < 0 ||
	    (c.o->method == KILN_CALIB_PERCENTILE && c.o->percentile != 0 &&
	     !(c.o->percentile > 50 && c.o->percentile <= 100)))
		return ir_seterr(err, KILN_EINVAL, "quantize: bad options (method %d, percentile %g: "
		                 "it must be in (50, 100])", (int)c.o->method, c.o->percentile);
	kiln_graph *q = NULL;
	kiln_status st = prepare(&c, g);
	if (st == KILN_OK)
		st = check_calib(&c);
	if (st == KILN_OK)
		st = observe(&c);
	if (st == KILN_OK)
		st = build_f32(&c);
	if (st == KILN_OK)
		st = calibrate(&c);
	if (st == KILN_OK && !(q = ir_graph_clone(c.g)))
		st = ir_seterr(err, KILN_ENOMEM, "quantize: out of memory");
	if (st == KILN_OK && (st = pass_qplan_apply(q, &c.plan, c.o->per_tensor_weights)) != KILN_OK)
		ir_seterr(err, st, "%s", q->errmsg);
	if (st == KILN_OK && report) {
		c.oerr = calloc((size_t)c.nf_out + 1, sizeof *c.oerr);
		st = c.oerr ? build_int8(&c, q) : ir_seterr(err, KILN_ENOMEM, "quantize: out of memory");
		if (st == KILN_OK)
			st = sweep(&c, true, visit_errors);
		if (st == KILN_OK)
			st = make_report(&c, report);
	}
	if (st == KILN_OK && (st = drop_unused(q)) == KILN_OK)
		st = kiln_graph_verify(q, err);
	if (st == KILN_OK)
		*out = q, q = NULL;
	kiln_graph_free(q);
	kiln_model_free(c.mf), kiln_model_free(c.mq);
	for (int i = 0; c.ob && i < c.nob; i++)
		free(c.ob[i].hist);
	free(c.ob), free(c.layer_ob), free(c.lerr), free(c.oerr), free(c.q_out);
	pass_qplan_free(&c.plan);
	kiln_graph_free(c.g);
	return st;
}
