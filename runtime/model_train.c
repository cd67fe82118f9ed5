/*
 * model_train.c: the training context of a library made by
 * kiln_compile_train: state, a step, an eval run, and checkpoints.
 *
 * A training library holds two programs over one state table (model.h):
 * the train step (forward, loss, gradients, optimizer update) and the eval
 * forward.  The key idea is that the state lives here, once, and both
 * programs' contexts point their STATE buffers at it; the step program
 * writes every "<name>.next" result into storage of its own, and only when
 * the whole run succeeded are those copied over the state (the same commit
 * kiln_trainer does after the interpreter), so a failed step changes
 * nothing.  The step count is the context's: each step passes step =
 * steps + 1 to the graph (Adam's bias correction, SGD's first-step rule)
 * and, with accumulation, apply on every accum-th micro-batch; a step with
 * training-mode Dropout also gets the micro-batch count "__micro__", from
 * which each Dropout reseeds as kiln_trainer reseeds it.  lr is an
 * argument of every step, so schedules stay with the caller.
 *
 * The split step (rt_train_step_hook, docs/DISTRIBUTED.md) is the same run
 * with a hook after every kernel: the step's "<p>.grad" outputs live back
 * to back in buckets handed to the caller's hook once final, and waited for
 * before the optimizer's first kernel; SyncBatchNorm's "*.sync_*" sums are
 * summed over ranks right after the kernel that makes them.
 *
 * Checkpoints are kiln_trainer's format exactly (driver/train.c; RT_CKPT_* in model.h): every
 * state tensor under its name, i64 scalars "__step__", "__micro__" and
 * "__checksum__" (sum of per-tensor FNV-1a hashes of name, dtype, shape and
 * bytes), written atomically by the safetensors writer.  Loading reads and
 * checks the whole file before it copies anything in.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "runtime/model.h"


enum { ALIGN = 64 };

struct rt_train {
	const rt_train_desc *d;
	void **state;          /* per state tensor: its storage (shared by both programs) */
	kiln_tensor *next;     /* per step output: its result ([0] is the loss, unused) */
	rt_model *step, *eval;
	int64_t steps, micro;  /* optimizer steps and micro-batches so far */
	/* the split step: gradient outputs, in output order (the last layer's
	 * first), stored back to back in gstore; buckets of consecutive ones */
	int ngrad, nbucket, nsync;
	int32_t *gout;         /* per gradient: its step output */
	int32_t *sout;         /* per SyncBatchNorm sum or its gradient: its output */
	char *gstore;
	int32_t *bfirst;       /* per bucket: its first gradient; [nbucket]: ngrad */
	int32_t *bready;       /* per bucket: the kernel after which it is final */
	const kiln_grad_hook *hook; /* during rt_train_step_hook */
	char err[1024];
};

static kiln_status fail(rt_train *t, kiln_status code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static kiln_status fail(rt_train *t, kiln_status code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t->err, sizeof t->err, fmt, ap);
	va_end(ap);
	return code;
}

/* State tensor i as a kiln_tensor over its storage. */
static kiln_tensor state_tensor(const rt_train *t, uint32_t i)
{
	const rt_state_desc *s = &t->d->step->state[i];
	kiln_tensor v = {(kiln_dtype)s->dtype, s->rank, {0}, t->state[i]};
	if (s->rank)
		memcpy(v.shape, s->dims, (size_t)s->rank * sizeof v.shape[0]);
	return v;
}

/* ---- creating ------------------------------------------------------------- */

/* The step's "__micro__" input (-1: none); stored + 1, so 0 means none. */
static int32_t micro_pos(const rt_train_desc *d)
{
	return d->micro1 - 1;
}

/* Step output i (> 0) is a gradient "<p>.grad" (ABI 4), not a ".next";
 * sync: a SyncBatchNorm sum or its gradient ("*.sync_*") instead. */
static bool is_split_output(const rt_train_desc *d, uint32_t i, bool sync)
{
	const rt_io_desc *o = &d->step->outputs[i];
	size_t n = o->name ? strlen(o->name) : 0;
	if (d->next[i] >= 0 || !o->name || (sync ? !strstr(o->name, ".sync_")
	                              : n < 5 || strcmp(o->name + n - 5, ".grad") != 0))
		return false;
	for (int k = 0; k < o->rank; k++)
		if (o->dim_kind && o->dim_kind[k] != RT_DIM_FIXED)
			return false;
	return true;
}

static kiln_status check_desc(const rt_train_desc *d)
{
	if (!d || d->abi < RT_MODEL_ABI_MIN || d->abi > RT_MODEL_ABI || !d->step || !d->next ||
	    d->accum < 1)
		return KILN_EINVAL;
	const rt_model_desc *s = d->step;
	if (!s->nstate || s->noutputs < 1 || (d->eval && d->eval->state != s->state) ||
	    (d->eval && d->eval->nstate != s->nstate))
		return KILN_EINVAL;
	int32_t pos[4] = {d->lr, d->t, d->apply, micro_pos(d)};
	for (int k = 0; k < 4; k++)
		if (pos[k] >= (int32_t)s->ninputs || (k < 2 && pos[k] < 0))
			return KILN_EINVAL;
	for (uint32_t i = 1; i < s->noutputs; i++)
		if ((d->next[i] < 0 && (d->abi < 4 || !(is_split_output(d, i, false) ||
		                                        is_split_output(d, i, true)))) ||
		    (d->next[i] >= 0 && (uint32_t)d->next[i] >= s->nstate))
			return KILN_EINVAL;
	return KILN_OK;
}

/* The gradient outputs back to back, in output order, so that any run of
 * consecutive ones of one dtype is one array (a bucket); a dtype change
 * starts at the next 64-byte boundary. */
static kiln_status alloc_grads(rt_train *t)
{
	const rt_model_desc *s = t->d->step;
	if (!(t->gout = calloc(s->noutputs, sizeof *t->gout)))
		return KILN_ENOMEM;
	if (!(t->sout = calloc(s->noutputs, sizeof *t->sout)))
		return KILN_ENOMEM;
	size_t total = 0, off[s->noutputs];
	for (uint32_t i = 1; i < s->noutputs; i++) {
		if (t->d->next[i] >= 0)
			continue;
		const rt_io_desc *o = &s->outputs[i];
		kiln_tensor v = {(kiln_dtype)o->dtype, o->rank, {0}, NULL};
		for (int k = 0; k < o->rank; k++)
			v.shape[k] = o->dims[k];
		if (is_split_output(t->d, i, true)) { /* storage of its own */
			t->next[i] = v;
			if (!(t->next[i].data = malloc(kiln_tensor_nbytes(&v) + 1)))
				return KILN_ENOMEM;
			t->sout[t->nsync++] = (int32_t)i;
			continue;
		}
		if (t->ngrad && t->next[t->gout[t->ngrad - 1]].dtype != v.dtype)
			total = (total + ALIGN - 1) / ALIGN * ALIGN;
		off[i] = total;
		total += kiln_tensor_nbytes(&v);
		t->next[i] = v;
		t->gout[t->ngrad++] = (int32_t)i;
	}
	if (t->ngrad && posix_memalign((void **)&t->gstore, ALIGN, total + 1) != 0) {
		t->gstore = NULL;
		return KILN_ENOMEM;
	}
	for (int g = 0; g < t->ngrad; g++)
		t->next[t->gout[g]].data = t->gstore + off[t->gout[g]];
	return rt_train_set_bucket_bytes(t, 25 << 20);
}

/* Storage for the state (from its initial values) and the .next results. */
static kiln_status alloc_state(rt_train *t)
{
	const rt_model_desc *s = t->d->step;
	t->state = calloc(s->nstate, sizeof *t->state);
	t->next = calloc(s->noutputs, sizeof *t->next);
	if (!t->state || !t->next)
		return KILN_ENOMEM;
	for (uint32_t i = 0; i < s->nstate; i++) {
		kiln_tensor v = state_tensor(t, i);
		size_t n = kiln_tensor_nbytes(&v);
		if (posix_memalign(&t->state[i], ALIGN, n ? n : 1) != 0) {
			t->state[i] = NULL;
			return KILN_ENOMEM;
		}
		memcpy(t->state[i], s->state[i].init, n);
	}
	for (uint32_t i = 1; i < s->noutputs; i++) {
		if (t->d->next[i] < 0)
			continue;
		kiln_tensor v = state_tensor(t, (uint32_t)t->d->next[i]);
		if (!(t->next[i].data = malloc(kiln_tensor_nbytes(&v) + 1)))
			return KILN_ENOMEM;
		void *data = t->next[i].data;
		t->next[i] = v;
		t->next[i].data = data;
	}
	return alloc_grads(t);
}

kiln_status rt_train_create(const rt_train_desc *d, rt_train **out)
{
	if (!out)
		return KILN_EINVAL;
	*out = NULL;
	kiln_status st = check_desc(d);
	if (st != KILN_OK)
		return st;
	rt_train *t = calloc(1, sizeof *t);
	if (!t)
		return KILN_ENOMEM;
	t->d = d;
	st = alloc_state(t);
	if (st == KILN_OK)
		st = rt_model_create_shared(d->step, t->state, &t->step);
	if (st == KILN_OK && d->eval)
		st = rt_model_create_shared(d->eval, t->state, &t->eval);
	if (st != KILN_OK) {
		rt_train_destroy(t);
		return st;
	}
	*out = t;
	return KILN_OK;
}

void rt_train_destroy(rt_train *t)
{
	if (!t)
		return;
	rt_model_destroy(t->step);
	rt_model_destroy(t->eval);
	for (uint32_t i = 0; t->state && i < t->d->step->nstate; i++)
		free(t->state[i]);
	for (uint32_t i = 1; t->next && i < t->d->step->noutputs; i++)
		if (t->d->next[i] >= 0)
			free(t->next[i].data);
	for (int k = 0; t->sout && k < t->nsync; k++)
		free(t->next[t->sout[k]].data);
	free(t->gout), free(t->sout), free(t->gstore), free(t->bfirst), free(t->bready);
	free(t->state);
	free(t->next);
	free(t);
}

kiln_status rt_train_set_threads(rt_train *t, int n)
{
	if (!t)
		return KILN_EINVAL;
	kiln_status st = rt_model_set_threads(t->step, n);
	if (st == KILN_OK && t->eval)
		st = rt_model_set_threads(t->eval, n);
	return st == KILN_OK ? st : fail(t, st, "%s", rt_model_errmsg(t->step));
}

const char *rt_train_errmsg(const rt_train *t)
{
	return t ? t->err : "no training context (NULL)";
}

int64_t rt_train_steps(const rt_train *t)
{
	return t ? t->steps : 0;
}

rt_model *rt_train_eval_model(rt_train *t)
{
	return t ? t->eval : NULL;
}

/* ---- steps ------------------------------------------------------------------ */

/* Copies every ".next" result over its state tensor: the step's commit. */
static void commit(rt_train *t, bool apply)
{
	for (uint32_t i = 1; i < t->d->step->noutputs; i++)
		if (t->d->next[i] >= 0)
			memcpy(t->state[t->d->next[i]], t->next[i].data, kiln_tensor_nbytes(&t->next[i]));
	t->micro++;
	t->steps += apply;
}

/* The scalars this step feeds: lr, step = steps + 1, apply and the
 * micro-batches so far. */
typedef struct scalars {
	double lr, t;
	int64_t micro;
	uint8_t apply;
} scalars;

static scalars step_scalars(const rt_train *t, double lr)
{
	return (scalars){lr, (double)(t->steps + 1), t->micro,
	                 (uint8_t)((t->micro + 1) % t->d->accum == 0)};
}

/* Inputs of the step that are scalars fed here, not data. */
static int nscalars(const rt_train_desc *d)
{
	return 2 + (d->apply >= 0) + (micro_pos(d) >= 0);
}

/* Position i of the step's inputs: the next data input, or a scalar. */
static const void *scalar_at(const rt_train *t, scalars *s, uint32_t i)
{
	const rt_train_desc *d = t->d;
	return (int32_t)i == d->lr ? (void *)&s->lr : (int32_t)i == d->t ? (void *)&s->t
	       : (int32_t)i == d->apply ? (void *)&s->apply
	       : (int32_t)i == micro_pos(d) ? (void *)&s->micro : NULL;
}

kiln_status rt_train_step(rt_train *t, const int64_t *syms, const void *const *in, double lr,
                          void *loss)
{
	if (!t)
		return KILN_EINVAL;
	const rt_model_desc *s = t->d->step;
	if (t->nsync)
		return fail(t, KILN_EINVAL, "model '%s' synchronises BatchNorm across ranks: step it "
		            "with kiln_model_train_step_hook and a hook with sum", s->name);
	if ((!in && (int)s->ninputs > nscalars(t->d)) || !loss)
		return fail(t, KILN_EINVAL, "model '%s': train_step: %s is NULL", s->name,
		            !loss ? "loss" : "x");
	scalars sc = step_scalars(t, lr);
	const void *ip[s->ninputs + 1];
	void *op[s->noutputs + 1];
	for (uint32_t i = 0, k = 0; i < s->ninputs; i++) {
		const void *p = scalar_at(t, &sc, i);
		ip[i] = p ? p : in[k++];
	}
	op[0] = loss;
	for (uint32_t i = 1; i < s->noutputs; i++)
		op[i] = t->next[i].data;
	kiln_status st = rt_model_run(t->step, syms, ip, op);
	if (st != KILN_OK)
		return fail(t, st, "%s", rt_model_errmsg(t->step));
	commit(t, sc.apply);
	return KILN_OK;
}

static float f32_at(const void *p)
{
	float f;
	memcpy(&f, p, sizeof f);
	return f;
}

static kiln_status step_tensors(rt_train *t, const kiln_tensor *const *in, int nin, double lr,
                                double *loss, rt_kernel_hook hook);

kiln_status rt_train_step_tensors(rt_train *t, const kiln_tensor *const *in, int nin, double lr,
                                  double *loss)
{
	return step_tensors(t, in, nin, lr, loss, NULL);
}

static kiln_status step_tensors(rt_train *t, const kiln_tensor *const *in, int nin, double lr,
                                double *loss, rt_kernel_hook hook)
{
	if (t && !hook && t->nsync)
		return fail(t, KILN_EINVAL, "model '%s' synchronises BatchNorm across ranks: step it "
		            "with kiln_model_train_step_hook and a hook with sum",
		            t->d->step->name);
	if (!t)
		return KILN_EINVAL;
	const rt_model_desc *s = t->d->step;
	int ndata = (int)s->ninputs - nscalars(t->d);
	if (nin != ndata || (ndata && !in))
		return fail(t, KILN_EINVAL, "model '%s': a train step takes %d data input(s) "
		            "(inputs and target), got %d", s->name, ndata, nin);
	scalars sc = step_scalars(t, lr);
	kiln_tensor lrt = {KILN_F64, 0, {0}, &sc.lr}, tt = {KILN_F64, 0, {0}, &sc.t};
	kiln_tensor at = {KILN_BOOL, 0, {0}, &sc.apply}, mt = {KILN_I64, 0, {0}, &sc.micro};
	const kiln_tensor *ip[s->ninputs + 1];
	for (uint32_t i = 0, k = 0; i < s->ninputs; i++)
		ip[i] = (int32_t)i == t->d->lr ? &lrt : (int32_t)i == t->d->t ? &tt
		        : (int32_t)i == t->d->apply ? &at : (int32_t)i == micro_pos(t->d) ? &mt : in[k++];
	double lv[1];
	kiln_tensor lt = {(kiln_dtype)s->outputs[0].dtype, 0, {0}, lv};
	kiln_tensor *op[s->noutputs + 1];
	op[0] = &lt;
	for (uint32_t i = 1; i < s->noutputs; i++)
		op[i] = &t->next[i];
	kiln_status st = rt_model_run_tensors_hooked(t->step, ip, (int)s->ninputs, op,
	                                             (int)s->noutputs, hook, t);
	if (st != KILN_OK)
		return fail(t, st, "%s", rt_model_errmsg(t->step));
	commit(t, sc.apply);
	if (loss)
		*loss = lt.dtype == KILN_F64 ? lv[0] : (double)f32_at(lv);
	return KILN_OK;
}

kiln_status rt_train_eval(rt_train *t, const int64_t *syms, const void *const *in,
                          void *const *out)
{
	if (!t)
		return KILN_EINVAL;
	if (!t->eval)
		return fail(t, KILN_EINVAL, "model '%s' was compiled without an eval program",
		            t->d->step->name);
	kiln_status st = rt_model_run(t->eval, syms, in, out);
	return st == KILN_OK ? st : fail(t, st, "%s", rt_model_errmsg(t->eval));
}

/* ---- checkpoints -------------------------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

/* A sum of per-tensor hashes, so the order in the file does not matter. */
uint64_t rt_ckpt_checksum(const kiln_tensor_set *s)
{
	uint64_t sum = 0;
	for (int i = 0; i < s->count; i++) {
		const kiln_tensor *t = s->items[i].tensor;
		if (!strcmp(s->items[i].name, RT_CKPT_SUM))
			continue;
		uint64_t h = fnv(0xcbf29ce484222325ULL, s->items[i].name, strlen(s->items[i].name) + 1);
		int32_t head[2] = {(int32_t)t->dtype, t->rank};
		h = fnv(h, head, sizeof head);
		h = fnv(h, t->shape, (size_t)t->rank * sizeof t->shape[0]);
		sum += fnv(h, t->data, kiln_tensor_nbytes(t));
	}
	return sum;
}

static kiln_status add_i64(kiln_tensor_set *s, const char *name, int64_t v)
{
	return kiln_tensor_set_add(s, name, &(kiln_tensor){KILN_I64, 0, {0}, &v});
}

kiln_status rt_ckpt_add_counters(kiln_tensor_set *s, int64_t steps, int64_t micro)
{
	kiln_status st = add_i64(s, RT_CKPT_STEP, steps);
	return st == KILN_OK ? add_i64(s, RT_CKPT_MICRO, micro) : st;
}

kiln_status rt_ckpt_seal(kiln_tensor_set *s)
{
	return add_i64(s, RT_CKPT_SUM, (int64_t)rt_ckpt_checksum(s));
}

kiln_status rt_ckpt_check_sum(const kiln_tensor_set *s, const char *path, kiln_error *err)
{
	const kiln_tensor *sum = kiln_tensor_set_get(s, RT_CKPT_SUM);
	uint64_t want = 0;
	if (!sum || sum->dtype != KILN_I64 || sum->rank != 0)
		return rt_seterr(err, KILN_EPARSE, "checkpoint '%s': no " RT_CKPT_SUM " (not a kiln "
		                 "checkpoint?)", path);
	memcpy(&want, sum->data, sizeof want);
	if (want != rt_ckpt_checksum(s))
		return rt_seterr(err, KILN_EPARSE, "checkpoint '%s': checksum mismatch, the file is "
		                 "corrupt", path);
	return KILN_OK;
}

kiln_tensor_set *rt_train_state(const rt_train *t)
{
	kiln_tensor_set *s = t ? kiln_tensor_set_new() : NULL;
	bool ok = s != NULL;
	for (uint32_t i = 0; ok && i < t->d->step->nstate; i++) {
		kiln_tensor v = state_tensor(t, i);
		ok = kiln_tensor_set_add(s, t->d->step->state[i].name, &v) == KILN_OK;
	}
	if (ok && !rt_ckpt_add_counters(s, t->steps, t->micro))
		return s;
	kiln_tensor_set_free(s);
	return NULL;
}

kiln_status rt_train_save(rt_train *t, const char *path)
{
	if (!t)
		return KILN_EINVAL;
	if (!path)
		return fail(t, KILN_EINVAL, "save: path is NULL");
	kiln_tensor_set *s = rt_train_state(t);
	kiln_error e = {0};
	kiln_status st = s && !rt_ckpt_seal(s)
	                         ? kiln_safetensors_write(path, s, &e)
	                         : (e.code = KILN_ENOMEM, snprintf(e.msg, sizeof e.msg,
	                                                           "save: out of memory"), KILN_ENOMEM);
	kiln_tensor_set_free(s);
	return st == KILN_OK ? st : fail(t, st, "%s", e.msg);
}

kiln_status rt_ckpt_counters(const kiln_tensor_set *s, const char *path, int64_t *steps,
                             int64_t *micro, kiln_error *err)
{
	static const char *const names[2] = {RT_CKPT_STEP, RT_CKPT_MICRO};
	int64_t v[2];
	for (int i = 0; i < 2; i++) {
		const kiln_tensor *t = kiln_tensor_set_get(s, names[i]);
		if (!t || t->dtype != KILN_I64 || t->rank != 0)
			return rt_seterr(err, KILN_EPARSE, "checkpoint '%s': %s must be an i64 scalar",
			                 path, names[i]);
		memcpy(&v[i], t->data, sizeof v[i]);
		if (v[i] < 0 || v[i] > RT_CKPT_MAX_COUNT)
			return rt_seterr(err, KILN_EPARSE, "checkpoint '%s': %s is %lld, outside "
			                 "[0, 2^53]", path, names[i], (long long)v[i]);
	}
	if (v[0] > v[1])
		return rt_seterr(err, KILN_EPARSE, "checkpoint '%s': " RT_CKPT_STEP " is %lld but "
		                 RT_CKPT_MICRO " only %lld (every optimizer step takes a micro-batch)",
		                 path, (long long)v[0], (long long)v[1]);
	*steps = v[0], *micro = v[1];
	return KILN_OK;
}

static bool same_shape(const kiln_tensor *a, const kiln_tensor *b)
{
	return a->dtype == b->dtype && a->rank == b->rank &&
	       !memcmp(a->shape, b->shape, (size_t)a->rank * sizeof a->shape[0]);
}

static bool has_state(const rt_model_desc *d, const char *name)
{
	for (uint32_t i = 0; i < d->nstate; i++)
		if (!strcmp(d->state[i].name, name))
			return true;
	return false;
}

/* Checks a checkpoint against the state table without changing anything;
 * a file must carry its checksum (sum), a set from rt_train_state need not. */
static kiln_status check_ckpt(rt_train *t, const kiln_tensor_set *s, const char *path, bool sum)
{
	const rt_model_desc *d = t->d->step;
	int64_t steps, micro;
	kiln_error e = {0};
	if ((sum && rt_ckpt_check_sum(s, path, &e) != KILN_OK) ||
	    rt_ckpt_counters(s, path, &steps, &micro, &e) != KILN_OK)
		return fail(t, e.code, "%s", e.msg);
	for (uint32_t i = 0; i < d->nstate; i++) {
		const kiln_tensor *f = kiln_tensor_set_get(s, d->state[i].name);
		kiln_tensor v = state_tensor(t, i);
		if (!f)
			return fail(t, KILN_EINVAL, "checkpoint '%s': '%s' is missing", path,
			            d->state[i].name);
		if (!same_shape(f, &v))
			return fail(t, KILN_ESHAPE, "checkpoint '%s': '%s' has another dtype or shape "
			            "in the file (%s, rank %d) than in the model (%s, rank %d)", path,
			            d->state[i].name, kiln_dtype_name(f->dtype), f->rank,
			            kiln_dtype_name(v.dtype), v.rank);
	}
	uint32_t want = d->nstate + 2 + (kiln_tensor_set_get(s, RT_CKPT_SUM) != NULL);
	if ((uint32_t)s->count == want)
		return KILN_OK;
	for (int i = 0; i < s->count; i++)
		if (s->items[i].name[0] != '_' && !has_state(d, s->items[i].name))
			return fail(t, KILN_EINVAL, "checkpoint '%s': '%s' is not part of this model "
			            "(a different model or optimizer?)", path, s->items[i].name);
	return fail(t, KILN_EINVAL, "checkpoint '%s': %d tensors, expected %u", path, s->count,
	            want);
}

/* Copies a checked set's tensors and counters into the context. */
static void take_state(rt_train *t, const kiln_tensor_set *s, const char *path)
{
	for (uint32_t i = 0; i < t->d->step->nstate; i++) {
		const kiln_tensor *f = kiln_tensor_set_get(s, t->d->step->state[i].name);
		memcpy(t->state[i], f->data, kiln_tensor_nbytes(f));
	}
	rt_ckpt_counters(s, path, &t->steps, &t->micro, NULL);
}

kiln_status rt_train_load(rt_train *t, const char *path)
{
	if (!t)
		return KILN_EINVAL;
	if (!path)
		return fail(t, KILN_EINVAL, "load: path is NULL");
	kiln_tensor_set *s = NULL;
	kiln_error e = {0};
	kiln_status st = kiln_safetensors_read(path, &s, &e);
	if (st != KILN_OK)
		return fail(t, st, "checkpoint refused: %s", e.msg);
	st = check_ckpt(t, s, path, true);
	if (st == KILN_OK)
		take_state(t, s, path);
	kiln_tensor_set_free(s);
	return st;
}

kiln_status rt_train_set_state(rt_train *t, const kiln_tensor_set *s)
{
	if (!t)
		return KILN_EINVAL;
	if (!s)
		return fail(t, KILN_EINVAL, "set_state: the state is NULL");
	/* a set from kiln_model_state carries its checksum: check it when there */
	kiln_status st = check_ckpt(t, s, "the state given",
	                            kiln_tensor_set_get(s, RT_CKPT_SUM) != NULL);
	if (st == KILN_OK)
		take_state(t, s, "the state given");
	return st;
}

kiln_status rt_train_state_view(rt_train *t, const char *name, kiln_tensor *out)
{
	if (!t)
		return KILN_EINVAL;
	for (uint32_t i = 0; name && out && i < t->d->step->nstate; i++)
		if (!strcmp(t->d->step->state[i].name, name)) {
			*out = state_tensor(t, i);
			return KILN_OK;
		}
	return fail(t, KILN_EINVAL, "model '%s' has no state tensor '%s'", t->d->step->name,
	            name ? name : "(NULL)");
}

/* ---- the split step ------------------------------------------------------------
 * One run of the step program, stopped twice over: after the kernel that
 * finishes each bucket's last gradient, h->ready gets the bucket (its
 * gradients back to back in gstore, which the kernels wrote in place), so
 * communication overlaps the rest of backward; after the last backward
 * kernel (desc split - 1), h->wait, and then the optimizer's kernels read
 * whatever the hook left there.  A gradient whose buffer is a view of a
 * temporary is written there, not in gstore: it is copied into the bucket
 * before ready and back after wait. */

static bool splittable(const rt_train *t)
{
	return t->d->abi >= 4 && t->d->ready && t->d->split > 0 && t->ngrad > 0;
}

static size_t grad_bytes(const rt_train *t, int g)
{
	return kiln_tensor_nbytes(&t->next[t->gout[g]]);
}

kiln_status rt_train_set_bucket_bytes(rt_train *t, int64_t bytes)
{
	if (!t)
		return KILN_EINVAL;
	if (bytes < 1)
		return fail(t, KILN_EINVAL, "bucket size %lld: must be at least 1 byte",
		            (long long)bytes);
	int32_t *first = calloc((size_t)t->ngrad + 2, sizeof *first);
	int32_t *ready = calloc((size_t)t->ngrad + 2, sizeof *ready);
	if (!first || !ready) {
		free(first), free(ready);
		return fail(t, KILN_ENOMEM, "out of memory");
	}
	int nb = 0;
	size_t in_bucket = 0;
	for (int g = 0; g < t->ngrad; g++) {
		size_t n = grad_bytes(t, g);
		bool dt_change = g && t->next[t->gout[g]].dtype != t->next[t->gout[g - 1]].dtype;
		if (g == 0 || dt_change || in_bucket + n > (uint64_t)bytes) {
			first[nb] = g;
			ready[nb++] = -1;
			in_bucket = 0;
		}
		in_bucket += n;
		int32_t r = splittable(t) ? t->d->ready[t->gout[g]] : -1;
		if (r > ready[nb - 1])
			ready[nb - 1] = r;
	}
	first[nb] = t->ngrad;
	free(t->bfirst), free(t->bready);
	t->bfirst = first, t->bready = ready, t->nbucket = nb;
	return KILN_OK;
}

int rt_train_num_buckets(const rt_train *t)
{
	return t ? t->nbucket : 0;
}

/* Copies each gradient of bucket b between its kernels' buffer and gstore
 * where they differ (to_bucket: into gstore). */
static void bucket_copy(rt_train *t, rt_model *m, int b, bool to_bucket)
{
	for (int g = t->bfirst[b]; g < t->bfirst[b + 1]; g++) {
		kiln_tensor *v = &t->next[t->gout[g]];
		void *p = rt_model_buf(m, t->d->step->outputs[t->gout[g]].buf);
		if (p && p != v->data)
			memcpy(to_bucket ? v->data : p, to_bucket ? p : v->data, kiln_tensor_nbytes(v));
	}
}

static kiln_status hook_failed(rt_train *t, rt_model *m, kiln_status st, const char *what)
{
	char msg[600];
	snprintf(msg, sizeof msg, "model '%s': the gradient hook's %s failed (%s)",
	         t->d->step->name, what, kiln_status_str(st));
	return rt_model_set_error(m, st, msg);
}

static kiln_status at_kernel(void *ud, rt_model *m, uint32_t k)
{
	rt_train *t = ud;
	const kiln_grad_hook *h = t->hook;
	kiln_status st = KILN_OK;
	for (int j = 0; j < t->nsync; j++) { /* SyncBatchNorm: before any reader */
		int32_t i = t->sout[j];
		if (t->d->ready[i] != (int32_t)k)
			continue;
		kiln_tensor *v = &t->next[i];
		void *p = rt_model_buf(m, t->d->step->outputs[i].buf);
		int64_t n = (int64_t)(kiln_tensor_nbytes(v) / kiln_dtype_size(v->dtype));
		if (!h->sum)
			return hook_failed(t, m, KILN_EINVAL, "sum (missing)");
		if ((st = h->sum(h->ud, p, n, v->dtype)) != KILN_OK)
			return hook_failed(t, m, st, "sum");
	}
	for (int b = 0; b < t->nbucket && st == KILN_OK; b++) {
		if (t->bready[b] != (int32_t)k)
			continue;
		bucket_copy(t, m, b, true);
		kiln_tensor *v = &t->next[t->gout[t->bfirst[b]]];
		int64_t n = 0;
		for (int g = t->bfirst[b]; g < t->bfirst[b + 1]; g++) {
			kiln_tensor *w = &t->next[t->gout[g]];
			n += (int64_t)(kiln_tensor_nbytes(w) / kiln_dtype_size(w->dtype));
		}
		if (h->ready && (st = h->ready(h->ud, b, v->data, n, v->dtype)) != KILN_OK)
			return hook_failed(t, m, st, "ready");
	}
	if ((int32_t)k + 1 != t->d->split)
		return KILN_OK;
	if (h->wait && (st = h->wait(h->ud)) != KILN_OK)
		return hook_failed(t, m, st, "wait");
	for (int b = 0; b < t->nbucket; b++)
		bucket_copy(t, m, b, false);
	return KILN_OK;
}

kiln_status rt_train_step_hook(rt_train *t, const kiln_tensor *const *in, int nin, double lr,
                               const kiln_grad_hook *h, double *loss)
{
	if (!t)
		return KILN_EINVAL;
	if (!h)
		return rt_train_step_tensors(t, in, nin, lr, loss);
	if (!splittable(t))
		return fail(t, KILN_EUNSUPPORTED, "model '%s': this library cannot stop between its "
		            "gradients and the optimizer (compiled before kiln had the split step, "
		            "or its optimizer reads a gradient before backward ends)",
		            t->d->step->name);
	t->hook = h;
	kiln_status st = step_tensors(t, in, nin, lr, loss, at_kernel);
	t->hook = NULL;
	return st;
}
