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
		if (d->next[i] < 0 || (uint32_t)d->next[i] >= s->nstate)
			return KILN_EINVAL;
	return KILN_OK;
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
		kiln_tensor v = state_tensor(t, (uint32_t)t->d->next[i]);
		if (!(t->next[i].data = malloc(kiln_tensor_nbytes(&v) + 1)))
			return KILN_ENOMEM;
		void *data = t->next[i].data;
		t->next[i] = v;
		t->next[i].data = data;
	}
	return KILN_OK;
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
		free(t->next[i].data);
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

kiln_status rt_train_step_tensors(rt_train *t, const kiln_tensor *const *in, int nin, double lr,
                                  double *loss)
{
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
	kiln_status st = rt_model_run_tensors(t->step, ip, (int)s->ninputs, op, (int)s->noutputs);
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
