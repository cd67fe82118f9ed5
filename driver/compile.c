/*
 * compile.c: kiln_compile and kiln_compile_train, the drivers from a graph
 * to a standalone library.
 *
 * The pipeline is a flat list of stages on a private clone of the graph:
 * graph passes (passes/), cg_lower, cg_memplan (codegen/), then cg_emit
 * (codegen/emit.c: LLVM, the link, the header).  kiln_compile_train (the
 * last section) builds the train step (driver/train.c), runs the same
 * stages on it and the eval model, and turns every named parameter into a
 * STATE buffer indexed into one state table (docs/TRAINING.md).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/backend.h"
#include "driver/driver.h"
#include "codegen/lower.h"
#include "passes/passes.h"

static bool ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && strcmp(s + a - b, suf) == 0;
}

/* ---- kiln_compile ------------------------------------------------------------ */
static const char *const conv_algos[] = {"auto", "im2col", "winograd", "direct"};

/* o->conv as a cg_conv_algo (check_opts has refused an unknown name). */
static cg_conv_algo conv_algo(const char *name)
{
	for (int i = 0; name && i < (int)(sizeof conv_algos / sizeof *conv_algos); i++)
		if (strcmp(name, conv_algos[i]) == 0)
			return (cg_conv_algo)i;
	return CG_CONV_AUTO;
}

static double seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* $KILN_CHUNK: unset or empty, the cost model (0); "0", off (-1); n > 0,
 * n samples per chunk; anything else is ignored. */
static int chunk_env(void)
{
	const char *s = getenv("KILN_CHUNK");
	if (!s || !*s)
		return 0;
	char *end;
	long v = strtol(s, &end, 10);
	if (*end || v < 0 || v > 1 << 20)
		return 0;
	return v == 0 ? -1 : (int)v;
}

/* Whether o's target is a GPU's (its nests all go on the grid). */
static bool gpu_target(const kiln_compile_opts *o)
{
	return o->target && !strncmp(o->target, "cuda", 4);
}

/* Graph -> optimized clone -> kernel IR with a memory plan. */
static kiln_status to_kernels(const kiln_graph *g, const kiln_compile_opts *o, bool train,
                              kiln_graph **gc, cg_module **m, kiln_error *err)
{
	*gc = ir_graph_clone(g);
	if (!*gc)
		return ir_seterr(err, KILN_ENOMEM, "out of memory cloning graph '%s'",
		                 kiln_graph_name(g));
	kiln_status st = kiln_graph_verify(*gc, err);
	/* PASS_INFERENCE treats parameters as constants (bnfold folds them into
	 * conv weights): right for an inference library, whose weights are
	 * embedded and immutable; a library that trains its parameters must
	 * name its own pass list. */
	if (st == KILN_OK)
		st = kiln_graph_optimize(*gc, o->passes ? o->passes : PASS_INFERENCE, err);
	if (st == KILN_OK)
		st = kiln_graph_verify(*gc, err);
	/* the panels the target's GEMM reads constant operands in, when they
	 * will be packed so (below): the lowering picks layouts by them */
	const char *pp = getenv("KILN_PREPACK");
	const cg_backend *be = cg_backend_find(o->target);
	cg_panels pn = {0};
	bool pack = !train && be && be->gemm_panel && !(pp && !strcmp(pp, "0"));
	if (st == KILN_OK && pack) {
		st = be->gemm_panel(o, &pn, err);
		pack = pn.a > 0 || pn.b > 0;
	}
	if (st == KILN_OK)
		st = cg_lower_ex(*gc, &(cg_lower_opts){.fuse = true, .conv = conv_algo(o->conv),
		                                        .mutable_params = train,
		                                        .par_work = gpu_target(o) ? 1 : 0,
		                                        .panels = pack ? &pn : NULL}, m,
		                 err);
	/* an inference library for the CPU runs runs of per-sample kernels chunk
	 * by chunk over the batch (codegen/chunk.c); KILN_CHUNK=0 turns it off,
	 * =n forces n samples per chunk */
	if (st == KILN_OK && !train && !gpu_target(o))
		st = cg_chunk(*m, &(cg_chunk_opts){.force = chunk_env(),
		                                   .cache_bytes = cg_host_l2_bytes()}, err);
	/* and packs the constant operands of its GEMMs once, here, in those
	 * panels (codegen/prepack.c); KILN_PREPACK=0 turns it off */
	if (st == KILN_OK && pack)
		st = cg_prepack(*m, &pn, err);
	/* without prepacking, the weights no kernel reads still keep no bytes */
	if (st == KILN_OK && !train && !pack)
		st = cg_drop_unread(*m, err);
	if (st == KILN_OK)
		st = cg_memplan(*m, err);
	return st;
}

static kiln_status check_opts(const kiln_graph *g, const char *out, const kiln_compile_opts *o,
                              kiln_error *err)
{
	static const char *const emits[] = {"so", "kir", "dot", "ll", "asm", "obj", "cu", "ptx",
	                                    "cubin"};
	if (!g || !out || !*out)
		return ir_seterr(err, KILN_EINVAL, "kiln_compile: %s is NULL",
		                 !g ? "the graph" : "the output path");
	if (kiln_graph_status(g) != KILN_OK)
		return ir_seterr(err, kiln_graph_status(g), "%s", kiln_graph_errmsg(g));
	if (ir_check_weights(g, "compile", err) != KILN_OK)
		return KILN_EINVAL;
	bool conv_ok = !o->conv;
	for (size_t i = 0; o->conv && i < sizeof conv_algos / sizeof *conv_algos; i++)
		conv_ok = conv_ok || strcmp(o->conv, conv_algos[i]) == 0;
	if (!conv_ok)
		return ir_seterr(err, KILN_EINVAL, "kiln_compile: unknown --conv '%s' (want auto, "
		                 "im2col, winograd or direct)", o->conv);
	if (o->target && !cg_backend_find(o->target))
		return ir_seterr(err, KILN_EINVAL, "kiln_compile: unknown --target '%s' (want llvm, "
		                 "cuda or cuda-emu)", o->target);
	if (o->cuda_math && strcmp(o->cuda_math, "f32") && strcmp(o->cuda_math, "fast"))
		return ir_seterr(err, KILN_EINVAL, "kiln_compile: unknown --cuda-math '%s' (want f32 "
		                 "or fast)", o->cuda_math);
	for (size_t i = 0; o->emit && i < sizeof emits / sizeof *emits; i++)
		if (strcmp(o->emit, emits[i]) == 0)
			return KILN_OK;
	return o->emit ? ir_seterr(err, KILN_EINVAL, "kiln_compile: unknown --emit '%s' (want "
	                           "so, kir, dot, ll, asm, obj, cu, ptx or cubin)", o->emit)
	               : KILN_OK;
}

KILN_API kiln_status kiln_runtime_archive(char *buf, size_t size, kiln_error *err)
{
	if (!buf || !size)
		return ir_seterr(err, KILN_EINVAL, "kiln_runtime_archive: null buffer");
	buf[0] = 0;
	return cg_runtime_archive(buf, size, err);
}

KILN_API kiln_status kiln_compile(const kiln_graph *g, const char *out_path,
                                  const kiln_compile_opts *opts, kiln_error *err)
{
	kiln_compile_opts o = opts ? *opts : (kiln_compile_opts){0};
	kiln_status st = check_opts(g, out_path, &o, err);
	if (st != KILN_OK)
		return st;
	char name[128];
	cg_c_name(name, sizeof name, o.name ? o.name : kiln_graph_name(g));
	kiln_graph *gc = NULL;
	cg_module *m = NULL;
	if (o.times)
		*o.times = (kiln_compile_times){0};
	double t0 = seconds();
	st = to_kernels(g, &o, false, &gc, &m, err);
	if (o.times)
		o.times->lower = seconds() - t0;
	if (st == KILN_OK)
		st = cg_emit(cg_backend_find(o.target ? o.target : "llvm"), m, out_path, &o, name,
		             err);
	if (o.times)
		o.times->total = seconds() - t0;
	cg_module_free(m);
	kiln_graph_free(gc);
	return st;
}

/* ---- compiled training ------------------------------------------------------------
 * The step graph from kiln_build_train_step and the eval model go through
 * to_kernels each; every named parameter of either becomes a STATE buffer
 * whose io_index is its row in the state table: the step graph's named
 * parameters in value order, so the table is exactly what kiln_trainer
 * checkpoints.  Each "<p>.next" output is paired with p's row; the eval
 * model's parameters must all be rows of the same type. */

typedef struct train_build {
	kiln_graph *step;         /* kiln_build_train_step's graph: owns the init data */
	const char **names;       /* the state table */
	const kiln_tensor **init;
	int nstate;
	int *next;                /* per step output */
	int *ready, *gbuf;        /* per step output: its last kernel (gradients); buffers */
	cg_train_info ti;
} train_build;

static void train_build_free(train_build *tb)
{
	kiln_graph_free(tb->step);
	free(tb->names), free(tb->init), free(tb->next), free(tb->ready), free(tb->gbuf);
}

static int state_index(const train_build *tb, const char *name)
{
	for (int i = 0; name && i < tb->nstate; i++)
		if (strcmp(tb->names[i], name) == 0)
			return i;
	return -1;
}

/* A clone of model whose inputs have batch (> 0) for every symbolic dim 0,
 * with every type inferred again.  Convolutions' weight gradients reduce
 * over the batch as their channel axis, which the lowering needs fixed. */
static kiln_status fix_batch(const kiln_graph *model, int64_t batch, kiln_graph **out,
                             kiln_error *err)
{
	kiln_graph *g = *out = ir_graph_clone(model);
	if (!g)
		return ir_seterr(err, KILN_ENOMEM, "kiln_compile_train: out of memory");
	for (uint32_t i = 0; i < g->ninput; i++) {
		ir_type *t = &g->val[g->input[i]]->type;
		if (t->rank > 0 && ir_dim_symbol_index(g, t->dim[0]) >= 0)
			t->dim[0] = batch;
	}
	return kiln_graph_optimize(g, "infer", err);
}

/* Training-mode Dropout must draw new masks every step, as kiln_trainer
 * reseeds each node from its traced seed and the micro-batch count before
 * each run; a compiled step cannot change a node's seed attribute, so it
 * gets the count as an i64 input CG_MICRO_INPUT and the lowering derives
 * the same seed from it in the kernel (cg_lower_dropout). */
static kiln_status add_micro(kiln_graph *g, kiln_error *err)
{
	bool random = false;
	for (uint32_t i = 0; i < g->nnode; i++) {
		const ir_node *n = g->node[i];
		random |= !n->dead && ir_op(n->op)->flags & IR_RANDOM &&
		          ir_attr_int(n, "training_mode", 0);
	}
	if (random)
		kiln_input_at(g, ir_graph_loc(g), CG_MICRO_INPUT, KILN_I64, 0, NULL);
	return g->status == KILN_OK ? KILN_OK : ir_seterr(err, g->status, "%s", g->errmsg);
}

/* The step graph and its state table. */
static kiln_status build_step(const kiln_graph *model, const kiln_train_opts *t, int64_t batch,
                              train_build *tb, kiln_error *err)
{
	kiln_graph *fixed = NULL;
	kiln_status st = batch > 0 ? fix_batch(model, batch, &fixed, err) : KILN_OK;
	if (st == KILN_OK)
		st = driver_build_train_step(fixed ? fixed : model, t, true, &tb->step, err);
	kiln_graph_free(fixed);
	if (st != KILN_OK)
		return st;
	kiln_graph *g = tb->step;
	if ((st = add_micro(g, err)) != KILN_OK)
		return st;
	tb->names = calloc(g->nval + 1, sizeof *tb->names);
	tb->init = calloc(g->nval + 1, sizeof *tb->init);
	if (!tb->names || !tb->init)
		return ir_seterr(err, KILN_ENOMEM, "kiln_compile_train: out of memory");
	for (uint32_t v = 1; v < g->nval; v++)
		if (g->val[v]->kind == IR_V_PARAM && g->val[v]->name && g->val[v]->data) {
			tb->names[tb->nstate] = g->val[v]->name;
			tb->init[tb->nstate++] = g->val[v]->data;
		}
	return KILN_OK;
}

static bool fits(const kiln_tensor *t, const cg_buf *b)
{
	if (t->dtype != b->dt || t->rank != b->type.rank)
		return false;
	for (int d = 0; d < t->rank; d++)
		if (t->shape[d] != b->type.dim[d])
			return false;
	return true;
}

/* Every parameter buffer of m becomes STATE, its row found by name. */
static kiln_status mark_state(const train_build *tb, const kiln_graph *g, cg_module *m,
                              const char *what, kiln_error *err)
{
	for (int b = 0; b < m->nbuf; b++) {
		cg_buf *cb = &m->buf[b];
		const ir_value *v = cb->value ? g->val[cb->value] : NULL;
		if (cb->kind != CG_BUF_CONST || !v || v->kind != IR_V_PARAM)
			continue;
		int k = state_index(tb, v->name);
		if (k < 0 || !fits(tb->init[k], cb))
			return ir_seterr(err, KILN_EINVAL, "kiln_compile_train: %s parameter '%s' has no "
			                 "match of the same type in the train step", what,
			                 v->name ? v->name : "?");
		cb->kind = CG_BUF_STATE;
		cb->io_index = k;
		cb->data = NULL;
	}
	return KILN_OK;
}

/* With the batch fixed, the graph still declares its symbol; a program no
 * buffer of which has a symbolic dim takes no sizes (nothing binds them). */
static void drop_unused_syms(cg_module *m)
{
	for (int b = 0; b < m->nbuf; b++)
		for (int d = 0; d < m->buf[b].type.rank; d++)
			if (m->buf[b].type.dim[d] < 0)
				return;
	m->nsym = 0;
}

/* Where the step can stop between its gradients (the "<p>.grad" outputs)
 * and the optimizer: ti->ready and ti->split, or split -1 when it cannot
 * (then the library has the whole step only; the hooked step refuses).
 * SyncBatchNorm's sums and their gradients ("*.sync_*") are ready right
 * after the kernel that stores them: the hook all-reduces them before any
 * later kernel reads them. */
static void grad_split(train_build *tb, const kiln_graph *g, const cg_module *m)
{
	cg_train_info *ti = &tb->ti;
	ti->split = -1;
	tb->ready = calloc((size_t)m->noutputs + 1, sizeof *tb->ready);
	tb->gbuf = calloc((size_t)m->noutputs + 1, sizeof *tb->gbuf);
	int *at = calloc((size_t)m->noutputs + 1, sizeof *at), n = 0, split = -1;
	if (!tb->ready || !tb->gbuf || !at) {
		free(at);
		return;
	}
	bool ok = true;
	for (int i = 0; i < m->noutputs; i++) {
		tb->ready[i] = -1;
		const char *name = g->val[g->output[i]]->name;
		bool sync = name && strstr(name, ".sync_");
		if (i > 0 && tb->next[i] < 0 && !sync)
			at[n] = i, tb->gbuf[n++] = m->outputs[i];
		else if (i > 0 && tb->next[i] < 0) /* all-reduced as soon as it is made */
			ok &= (tb->ready[i] = cg_last_store(m, m->outputs[i])) >= 0;
	}
	int *r = calloc((size_t)n + 1, sizeof *r);
	if (ok && n && r && cg_grad_split(m, tb->gbuf, n, r, &split, NULL) == KILN_OK) {
		for (int k = 0; k < n; k++)
			tb->ready[at[k]] = r[k];
		ti->ready = tb->ready;
		ti->split = split;
	}
	free(r), free(at);
}

/* Inputs "lr", "step", "apply" and each "<p>.next" output's row. */
static kiln_status step_contract(train_build *tb, const kiln_graph *g, const cg_module *m,
                                 const kiln_train_opts *t, kiln_error *err)
{
	cg_train_info *ti = &tb->ti;
	*ti = (cg_train_info){tb->nstate, tb->names, tb->init, NULL, -1, -1, -1,
	                      t->accum_steps > 1 ? t->accum_steps : 1, -1, NULL, -1};
	int *pos[4] = {&ti->lr, &ti->t, &ti->apply, &ti->micro};
	const char *names[4] = {"lr", "step", "apply", CG_MICRO_INPUT};
	for (uint32_t i = 0; i < g->ninput; i++)
		for (int k = 0; k < 4; k++)
			if (g->val[g->input[i]]->name && !strcmp(g->val[g->input[i]]->name, names[k]))
				*pos[k] = (int)i;
	if (!(tb->next = calloc((size_t)m->noutputs + 1, sizeof *tb->next)))
		return ir_seterr(err, KILN_ENOMEM, "kiln_compile_train: out of memory");
	tb->next[0] = -1;
	for (int i = 1; i < m->noutputs; i++) {
		const char *name = g->val[g->output[i]]->name;
		char p[600];
		size_t n = name ? strlen(name) : 0;
		if ((n > 5 && ends_with(name, ".grad")) || (name && strstr(name, ".sync_"))) {
			tb->next[i] = -1; /* a gradient or a SyncBatchNorm sum: the split step's */
			continue;
		}
		if (n > 5 && n - 5 < sizeof p && ends_with(name, ".next"))
			snprintf(p, sizeof p, "%.*s", (int)(n - 5), name);
		int k = n > 5 && n - 5 < sizeof p ? state_index(tb, p) : -1;
		if (k < 0 || !fits(tb->init[k], &m->buf[m->outputs[i]]))
			return ir_seterr(err, KILN_EVERIFY, "kiln_compile_train: output '%s' has no "
			                 "parameter of the same type to replace", name ? name : "?");
		tb->next[i] = k;
	}
	ti->next = tb->next;
	grad_split(tb, g, m);
	return ti->lr >= 0 && ti->t >= 0 && (ti->accum == 1) == (ti->apply < 0)
	               ? KILN_OK
	               : ir_seterr(err, KILN_EVERIFY, "kiln_compile_train: the step graph lacks "
	                           "its lr, step or apply input");
}

static kiln_status check_train(const kiln_graph *model, const kiln_graph *eval,
                               const kiln_train_opts *t, const char *out,
                               const kiln_compile_opts *o, kiln_error *err)
{
	if (!model || !eval || !t)
		return ir_seterr(err, KILN_EINVAL, "kiln_compile_train: %s is NULL", !model ? "the "
		                 "model" : !eval ? "the eval model (required)" : "the train options");
	if (ir_check_weights(model, "compile", err) != KILN_OK ||
	    ir_check_weights(eval, "compile", err) != KILN_OK)
		return KILN_EINVAL;
	if (o->passes && strstr(o->passes, "bnfold"))
		return ir_seterr(err, KILN_EINVAL, "kiln_compile_train: pass 'bnfold' folds parameters "
		                 "into constants, which a training library updates");
	/* a CUDA target also prints (cu) or NVRTC-compiles (ptx, cubin) the
	 * step's and the eval program's kernels */
	bool cuda_stage = gpu_target(o) && o->emit &&
	                  (!strcmp(o->emit, "cu") || !strcmp(o->emit, "ptx") ||
	                   !strcmp(o->emit, "cubin"));
	if (o->emit && strcmp(o->emit, "so") != 0 && !cuda_stage)
		return ir_seterr(err, KILN_EINVAL, "kiln_compile_train: --emit=%s is not supported "
		                 "for a training library (the .so; with --target=cuda also cu, ptx "
		                 "and cubin)", o->emit);
	kiln_status st = check_opts(model, out, o, err);
	return st == KILN_OK ? check_opts(eval, out, o, err) : st;
}

KILN_API kiln_status kiln_compile_train(const kiln_graph *model, const kiln_graph *eval_model,
                                        const kiln_train_opts *t, int64_t batch,
                                        const char *out_path, const kiln_compile_opts *opts,
                                        kiln_error *err)
{
	kiln_compile_opts o = opts ? *opts : (kiln_compile_opts){0};
	kiln_status st = check_train(model, eval_model, t, out_path, &o, err);
	if (st != KILN_OK)
		return st;
	o.passes = o.passes ? o.passes : PASS_DEFAULT;
	char name[128];
	cg_c_name(name, sizeof name, o.name ? o.name : kiln_graph_name(model));
	train_build tb = {0};
	kiln_graph *gs = NULL, *ge = NULL;
	cg_module *ms = NULL, *me = NULL;
	if (o.times)
		*o.times = (kiln_compile_times){0};
	double t0 = seconds();
	st = batch < 0 ? ir_seterr(err, KILN_EINVAL, "kiln_compile_train: batch %lld < 0",
	                           (long long)batch)
	               : build_step(model, t, batch, &tb, err);
	if (st == KILN_OK)
		st = to_kernels(tb.step, &o, true, &gs, &ms, err);
	if (st == KILN_OK)
		st = to_kernels(eval_model, &o, true, &ge, &me, err);
	if (st == KILN_OK)
		drop_unused_syms(ms);
	if (st == KILN_OK)
		st = mark_state(&tb, gs, ms, "train-step", err);
	if (st == KILN_OK)
		st = mark_state(&tb, ge, me, "eval", err);
	if (st == KILN_OK)
		st = step_contract(&tb, gs, ms, t, err);
	if (o.times)
		o.times->lower = seconds() - t0;
	if (st == KILN_OK)
		st = cg_emit_train(cg_backend_find(o.target ? o.target : "llvm"), ms, me, &tb.ti,
		                   out_path, &o, name, err);
	if (o.times)
		o.times->total = seconds() - t0;
	cg_module_free(ms), cg_module_free(me);
	kiln_graph_free(gs), kiln_graph_free(ge);
	train_build_free(&tb);
	return st;
}
