/*
 * loader.c: kiln_load, the public face of a generated library opened at
 * run time.
 *
 * `kiln compile` writes a .so that exports one symbol the runtime needs,
 * kiln_model_desc (an rt_model_desc, runtime/model.h), beside its typed
 * entry points.  Loading is dlopen (RTLD_NOW, so a missing symbol fails
 * here and not mid-run; RTLD_LOCAL, so two models never interpose on each
 * other), dlsym, an ABI check, and a context made by this runtime's own
 * driver (model.c): everything a loaded model does goes through the same
 * code as its typed entry points, only with shapes checked from tensors.
 *
 * The signature is translated once into kiln_model_io records owned by the
 * model, so introspection hands out stable pointers and never allocates.
 * A training library also exports kiln_train_desc: the model is then a
 * training context (model_train.c) and its rt_model is that context's eval
 * program, so kiln_model_run evaluates the current state.
 *
 * Generated libraries never link this file: nothing they use refers to it,
 * and an archive member is only pulled in when referenced.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"
#include "runtime/model.h"

struct kiln_model {
	void *dl;               /* dlopen handle */
	const rt_model_desc *d; /* inside the library */
	rt_model *rt;           /* the context (a training library's: its eval program) */
	rt_train *train;        /* a training library's context, or NULL */
	kiln_model_io *io;      /* inputs, then outputs */
	kiln_model_io *tio;     /* a training library's step: its data inputs */
	int ntio;
	uint64_t *prof;         /* per kernel: ns summed over runs, while profiling */
};

static void fill_io(const rt_model_desc *d, const rt_io_desc *src, kiln_model_io *io)
{
	io->name = src->name;
	io->dtype = (kiln_dtype)src->dtype;
	io->rank = src->rank;
	for (int k = 0; k < src->rank; k++) {
		bool fixed = src->dim_kind[k] == RT_DIM_FIXED;
		io->dims[k] = fixed ? src->dims[k] : -1;
		io->dim_names[k] = fixed                            ? NULL
		                   : src->dim_kind[k] == RT_DIM_SYM ? d->sym_names[src->dims[k]]
		                                                    : "?";
	}
}

/* dlopen searches the library path for a bare name; a user means a file. */
static void *open_lib(const char *path)
{
	if (strchr(path, '/'))
		return dlopen(path, RTLD_NOW | RTLD_LOCAL);
	size_t n = strlen(path);
	char *p = malloc(n + 3);
	if (!p)
		return NULL;
	memcpy(p, "./", 2);
	memcpy(p + 2, path, n + 1);
	void *h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
	free(p);
	return h;
}

/* The step's data inputs (x, target): every input but the scalars the
 * context feeds (lr, step, apply, __micro__). */
static kiln_status train_io(kiln_model *m, const rt_train_desc *td, const char *path,
                            kiln_error *err)
{
	const rt_model_desc *s = td->step;
	if (!(m->tio = calloc(s->ninputs + 1, sizeof *m->tio)))
		return rt_seterr(err, KILN_ENOMEM, "%s: out of memory", path);
	for (uint32_t i = 0; i < s->ninputs; i++) {
		int32_t k = (int32_t)i;
		if (k != td->lr && k != td->t && k != td->apply && k != td->micro1 - 1)
			fill_io(s, &s->inputs[i], &m->tio[m->ntio++]);
	}
	return KILN_OK;
}

/* Validates the description the library exports and makes a context. */
static kiln_status attach(kiln_model *m, const char *path, kiln_error *err)
{
	char why[512];
	m->d = dlsym(m->dl, "kiln_model_desc");
	/* a --target=cuda library is driven through its own entry points (its
	 * state and scratch are device memory, which this runtime's driver
	 * does not run) */
	if (!m->d && dlsym(m->dl, "kiln_cuda_library"))
		return rt_seterr(err, KILN_EUNSUPPORTED, "%s: a CUDA library (--target=cuda): kiln_load "
		                 "runs CPU and cuda-emu libraries; call its own entry points "
		                 "(<name>_create_ex, _run or _train_step; docs/CUDA.md)", path);
	if (!m->d)
		return rt_seterr(err, KILN_EINVAL, "%s: not a kiln model (no kiln_model_desc symbol)",
		                 path);
	kiln_status st = rt_model_validate(m->d, why, sizeof why);
	if (st != KILN_OK)
		return rt_seterr(err, st, "%s: %s", path, why);
	const rt_train_desc *td = dlsym(m->dl, "kiln_train_desc");
	if (td) {
		if ((st = rt_train_create(td, &m->train)) != KILN_OK)
			return rt_seterr(err, st, "%s: cannot create a training context for model '%s'",
			                 path, m->d->name);
		m->rt = rt_train_eval_model(m->train);
	} else if ((st = rt_model_create(m->d, &m->rt)) != KILN_OK)
		return rt_seterr(err, st, "%s: cannot create a context for model '%s'", path,
		                 m->d->name);
	m->io = calloc(m->d->ninputs + m->d->noutputs + 1, sizeof *m->io);
	if (!m->io)
		return rt_seterr(err, KILN_ENOMEM, "%s: out of memory", path);
	for (uint32_t i = 0; i < m->d->ninputs; i++)
		fill_io(m->d, &m->d->inputs[i], &m->io[i]);
	for (uint32_t i = 0; i < m->d->noutputs; i++)
		fill_io(m->d, &m->d->outputs[i], &m->io[m->d->ninputs + i]);
	return td ? train_io(m, td, path, err) : KILN_OK;
}

KILN_API kiln_status kiln_load(const char *path, kiln_model **out, kiln_error *err)
{
	if (!out)
		return rt_seterr(err, KILN_EINVAL, "kiln_load: out is NULL");
	*out = NULL;
	if (!path)
		return rt_seterr(err, KILN_EINVAL, "kiln_load: path is NULL");
	kiln_model *m = calloc(1, sizeof *m);
	if (!m)
		return rt_seterr(err, KILN_ENOMEM, "%s: out of memory", path);
	/* dlopen would wait forever on a FIFO: only a regular file gets that far */
	int fd;
	uint64_t size;
	kiln_error e = {0};
	kiln_status st = rt_open_read(path, &fd, &size, &e);
	if (st != KILN_OK) {
		size_t n = strlen(path); /* e.msg starts "path: " */
		free(m);
		return rt_seterr(err, st, "cannot load '%s': %s", path,
		                 strncmp(e.msg, path, n) == 0 && e.msg[n] == ':' ? e.msg + n + 2 : e.msg);
	}
	close(fd);
	dlerror();
	if (!(m->dl = open_lib(path))) {
		const char *why = dlerror();
		free(m);
		return rt_seterr(err, KILN_EIO, "cannot load '%s': %s", path, why ? why : "dlopen failed");
	}
	st = attach(m, path, err);
	if (st != KILN_OK) {
		kiln_model_free(m);
		return st;
	}
	*out = m;
	return KILN_OK;
}

KILN_API void kiln_model_free(kiln_model *m)
{
	if (!m)
		return;
	if (m->train)
		rt_train_destroy(m->train); /* and its eval program's m->rt */
	else
		rt_model_destroy(m->rt); /* joins the pool's threads before the code goes */
	free(m->io);
	free(m->tio);
	free(m->prof);
	if (m->dl)
		dlclose(m->dl);
	free(m);
}

KILN_API const char *kiln_model_name(const kiln_model *m)
{
	return m ? m->d->name : NULL;
}

KILN_API kiln_status kiln_model_set_threads(kiln_model *m, int n, kiln_error *err)
{
	if (!m)
		return rt_seterr(err, KILN_EINVAL, "kiln_model_set_threads: model is NULL");
	if (m->train) {
		kiln_status st = rt_train_set_threads(m->train, n);
		return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_train_errmsg(m->train));
	}
	kiln_status st = rt_model_set_threads(m->rt, n);
	return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_model_errmsg(m->rt));
}

KILN_API kiln_status kiln_model_profile(kiln_model *m, bool on, kiln_error *err)
{
	if (!m)
		return rt_seterr(err, KILN_EINVAL, "kiln_model_profile: model is NULL");
	if (on && !m->prof && !(m->prof = calloc((size_t)m->d->nkern + 1, sizeof *m->prof)))
		return rt_seterr(err, KILN_ENOMEM, "model '%s': out of memory", m->d->name);
	if (on)
		memset(m->prof, 0, ((size_t)m->d->nkern + 1) * sizeof *m->prof);
	rt_model_set_profile(m->rt, on ? m->prof : NULL);
	return KILN_OK;
}

KILN_API int kiln_model_num_kernels(const kiln_model *m)
{
	return m ? (int)m->d->nkern : 0;
}

KILN_API const char *kiln_model_kernel(const kiln_model *m, int k, double *seconds)
{
	if (!m || k < 0 || (uint32_t)k >= m->d->nkern)
		return NULL;
	if (seconds)
		*seconds = m->prof ? (double)m->prof[k] * 1e-9 : 0;
	return m->d->kernel_names && m->d->kernel_names[k] ? m->d->kernel_names[k] : "?";
}

KILN_API int kiln_model_num_inputs(const kiln_model *m)
{
	return m ? (int)m->d->ninputs : 0;
}

KILN_API int kiln_model_num_outputs(const kiln_model *m)
{
	return m ? (int)m->d->noutputs : 0;
}

KILN_API const kiln_model_io *kiln_model_input(const kiln_model *m, int i)
{
	return m && i >= 0 && (uint32_t)i < m->d->ninputs ? &m->io[i] : NULL;
}

KILN_API const kiln_model_io *kiln_model_output(const kiln_model *m, int i)
{
	return m && i >= 0 && (uint32_t)i < m->d->noutputs ? &m->io[m->d->ninputs + i] : NULL;
}

KILN_API const char *kiln_model_input_name(const kiln_model *m, int i)
{
	const kiln_model_io *io = kiln_model_input(m, i);
	return io ? io->name : NULL;
}

KILN_API const char *kiln_model_output_name(const kiln_model *m, int i)
{
	const kiln_model_io *io = kiln_model_output(m, i);
	return io ? io->name : NULL;
}

KILN_API int kiln_model_num_syms(const kiln_model *m)
{
	return m ? (int)m->d->nsym : 0;
}

KILN_API const char *kiln_model_sym_name(const kiln_model *m, int i)
{
	return m && i >= 0 && (uint32_t)i < m->d->nsym ? m->d->sym_names[i] : NULL;
}

KILN_API kiln_status kiln_model_run_into(kiln_model *m, kiln_tensor *const *inputs, int ninputs,
                                         kiln_tensor *const *outputs, int noutputs,
                                         kiln_error *err)
{
	if (!m)
		return rt_seterr(err, KILN_EINVAL, "kiln_model_run: model is NULL");
	kiln_status st = rt_model_run_tensors(m->rt, (const kiln_tensor *const *)inputs, ninputs,
	                                      outputs, noutputs);
	return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_model_errmsg(m->rt));
}

KILN_API kiln_status kiln_model_output_shape(kiln_model *m, kiln_tensor *const *inputs,
                                            int ninputs, int i, int *rank, int64_t *dims,
                                            kiln_error *err)
{
	if (!m)
		return rt_seterr(err, KILN_EINVAL, "kiln_model_output_shape: model is NULL");
	kiln_status st = rt_model_output_shape(m->rt, (const kiln_tensor *const *)inputs, ninputs,
	                                       i, rank, dims);
	return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_model_errmsg(m->rt));
}

/* Allocates every output at the shape the inputs' symbols give. */
static kiln_status alloc_outputs(kiln_model *m, kiln_tensor *const *inputs, int ninputs,
                                 kiln_tensor **outputs, kiln_error *err)
{
	const kiln_tensor *const *in = (const kiln_tensor *const *)inputs;
	for (uint32_t i = 0; i < m->d->noutputs; i++) {
		int rank;
		int64_t dims[KILN_MAX_RANK];
		kiln_status st = rt_model_output_shape(m->rt, in, ninputs, (int)i, &rank, dims);
		if (st != KILN_OK)
			return rt_seterr(err, st, "%s", rt_model_errmsg(m->rt));
		if (!(outputs[i] = kiln_tensor_new((kiln_dtype)m->d->outputs[i].dtype, rank, dims)))
			return rt_seterr(err, KILN_ENOMEM, "model '%s': cannot allocate output '%s'",
			                 m->d->name, m->d->outputs[i].name);
	}
	return KILN_OK;
}

KILN_API kiln_status kiln_model_run(kiln_model *m, kiln_tensor *const *inputs, int ninputs,
                                    kiln_tensor **outputs, int noutputs, kiln_error *err)
{
	if (!m)
		return rt_seterr(err, KILN_EINVAL, "kiln_model_run: model is NULL");
	if (!outputs)
		return rt_seterr(err, KILN_EINVAL, "model '%s': outputs is NULL", m->d->name);
	if (noutputs < 0 || (uint32_t)noutputs != m->d->noutputs)
		return rt_seterr(err, KILN_EINVAL, "model '%s' has %u output(s), got %d", m->d->name,
		                 m->d->noutputs, noutputs);
	for (int i = 0; i < noutputs; i++)
		outputs[i] = NULL;
	kiln_status st = alloc_outputs(m, inputs, ninputs, outputs, err);
	if (st == KILN_OK)
		st = kiln_model_run_into(m, inputs, ninputs, outputs, noutputs, err);
	if (st != KILN_OK)
		for (int i = 0; i < noutputs; i++) {
			kiln_tensor_free(outputs[i]);
			outputs[i] = NULL;
		}
	return st;
}

/* ---- training libraries -------------------------------------------------------------- */

KILN_API bool kiln_model_trainable(const kiln_model *m)
{
	return m && m->train;
}

static kiln_status not_trainable(const kiln_model *m, const char *fn, kiln_error *err)
{
	if (!m)
		return rt_seterr(err, KILN_EINVAL, "%s: model is NULL", fn);
	return rt_seterr(err, KILN_EINVAL, "%s: model '%s' is not a training library (compile it "
	                 "with kiln_compile_train or `kiln compile --train`)", fn, m->d->name);
}

KILN_API kiln_status kiln_model_train_step(kiln_model *m, const kiln_tensor *x,
                                           const kiln_tensor *y, double lr, double *loss,
                                           kiln_error *err)
{
	if (!kiln_model_trainable(m))
		return not_trainable(m, "kiln_model_train_step", err);
	if (!x)
		return rt_seterr(err, KILN_EINVAL, "kiln_model_train_step: x is NULL");
	const kiln_tensor *in[2] = {x, y};
	kiln_status st = rt_train_step_tensors(m->train, in, y ? 2 : 1, lr, loss);
	return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_train_errmsg(m->train));
}

KILN_API kiln_status kiln_model_train_step_hook(kiln_model *m, const kiln_tensor *x,
                                                const kiln_tensor *y, double lr,
                                                const kiln_grad_hook *hook, double *loss,
                                                kiln_error *err)
{
	if (!kiln_model_trainable(m))
		return not_trainable(m, "kiln_model_train_step_hook", err);
	if (!x)
		return rt_seterr(err, KILN_EINVAL, "kiln_model_train_step_hook: x is NULL");
	const kiln_tensor *in[2] = {x, y};
	kiln_status st = rt_train_step_hook(m->train, in, y ? 2 : 1, lr, hook, loss);
	return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_train_errmsg(m->train));
}

KILN_API kiln_status kiln_model_set_bucket_bytes(kiln_model *m, int64_t bytes, kiln_error *err)
{
	if (!kiln_model_trainable(m))
		return not_trainable(m, "kiln_model_set_bucket_bytes", err);
	kiln_status st = rt_train_set_bucket_bytes(m->train, bytes);
	return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_train_errmsg(m->train));
}

KILN_API int kiln_model_num_buckets(const kiln_model *m)
{
	return m && m->train ? rt_train_num_buckets(m->train) : 0;
}

KILN_API int64_t kiln_model_steps(const kiln_model *m)
{
	return m && m->train ? rt_train_steps(m->train) : 0;
}

KILN_API kiln_tensor_set *kiln_model_state(const kiln_model *m)
{
	return m && m->train ? rt_train_state(m->train) : NULL;
}

KILN_API kiln_status kiln_model_save(kiln_model *m, const char *path, kiln_error *err)
{
	if (!kiln_model_trainable(m))
		return not_trainable(m, "kiln_model_save", err);
	kiln_status st = rt_train_save(m->train, path);
	return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_train_errmsg(m->train));
}

KILN_API kiln_status kiln_model_load(kiln_model *m, const char *path, kiln_error *err)
{
	if (!kiln_model_trainable(m))
		return not_trainable(m, "kiln_model_load", err);
	kiln_status st = rt_train_load(m->train, path);
	return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_train_errmsg(m->train));
}

KILN_API kiln_status kiln_model_set_state(kiln_model *m, const kiln_tensor_set *s, kiln_error *err)
{
	if (!kiln_model_trainable(m))
		return not_trainable(m, "kiln_model_set_state", err);
	kiln_status st = rt_train_set_state(m->train, s);
	return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_train_errmsg(m->train));
}

KILN_API kiln_status kiln_model_state_view(kiln_model *m, const char *name, kiln_tensor *out,
                                           kiln_error *err)
{
	if (!kiln_model_trainable(m))
		return not_trainable(m, "kiln_model_state_view", err);
	if (!out)
		return rt_seterr(err, KILN_EINVAL, "kiln_model_state_view: out is NULL");
	kiln_status st = rt_train_state_view(m->train, name, out);
	return st == KILN_OK ? st : rt_seterr(err, st, "%s", rt_train_errmsg(m->train));
}

KILN_API int kiln_model_num_train_inputs(const kiln_model *m)
{
	return m && m->train ? m->ntio : 0;
}

KILN_API const kiln_model_io *kiln_model_train_input(const kiln_model *m, int i)
{
	return m && m->train && i >= 0 && i < m->ntio ? &m->tio[i] : NULL;
}
