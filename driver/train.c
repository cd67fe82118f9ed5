/*
 * train.c: the train-step builder, the interpreter-driven trainer and its
 * checkpoints.
 *
 * kiln_build_train_step turns a model traced in train mode into one graph
 * computing a whole step: it clones the model, adds the loss (or takes the
 * model's "loss" output), differentiates it with respect to every trainable
 * parameter (pass_grad), adds the scalar inputs "lr", "step" (and "apply"
 * when accumulating) and appends the optimizer update (pass_optim).  Its
 * outputs are "loss" followed by one "<name>.next" per tensor the step
 * replaces: the model's own (BatchNorm buffers) and the optimizer's.
 *
 * kiln_train_graph_from_inference derives that train-mode model from an
 * inference graph (an eval-mode ONNX export): BatchNorm on batch statistics
 * with PyTorch's running-stat updates as "<name>.next" outputs, Dropout on
 * with a per-node seed.  `kiln train` and `kiln compile --train` both use it.
 * kiln_inference_graph_from_train goes the other way for a training-mode
 * export (torch.onnx.export with TrainingMode.TRAINING: BatchNorm with
 * training_mode=1, Dropout on): the inference model it stands for, which
 * is the eval model and the one exported after training; the train-mode
 * derivation starts from it too, so such a file trains as PyTorch trains
 * (unbiased running_var), not as the ONNX op's own running outputs would.
 *
 * The key idea of the trainer is that state lives in the step graph's own
 * parameters: a step runs the graph through kiln_graph_run and copies each
 * "<name>.next" output over parameter <name>, so the graph is always the
 * current model (a compiled library does the same copy in place).  The eval
 * graph, a clone of the model traced in eval mode, receives the parameters
 * and buffers by name before each run.  A checkpoint is every named
 * parameter of the step graph, PyTorch's names for the model's, plus the
 * step counters and a checksum; loading checks the whole file against the
 * graph before touching anything, so a refused file changes nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "runtime/model.h"

#define HERE ir_graph_loc(g) /* the model's place, never this file: messages name the user's */

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* ---- the step graph ---------------------------------------------------------- */

/* The output the loss reads: o->output by name, else the first output that
 * is not a state update. */
static uint32_t prediction(kiln_graph *g, const kiln_train_opts *o)
{
	for (uint32_t i = 0; i < g->noutput; i++) {
		const char *name = g->val[g->output[i]]->name;
		if (name && (o->output ? !strcmp(name, o->output) : !ends_with(name, ".next")))
			return g->output[i];
	}
	ir_errorf(g, NULL, KILN_EINVAL, "train step: graph '%s' has no output %s%s%s", g->name,
	          o->output ? "named '" : "to compute a loss from", o->output ? o->output : "",
	          o->output ? "'" : "");
	return 0;
}

/* The scalar loss: the model's "loss" output, or o->loss of the prediction
 * against a new "target" input. */
static uint32_t add_loss(kiln_graph *g, const kiln_train_opts *o)
{
	if (o->loss == KILN_LOSS_OUTPUT) {
		for (uint32_t i = 0; i < g->noutput; i++)
			if (g->val[g->output[i]]->name && !strcmp(g->val[g->output[i]]->name, "loss"))
				return g->output[i];
		ir_errorf(g, NULL, KILN_EINVAL, "train step: graph '%s' has no output named 'loss' "
		          "(or choose a loss kind in kiln_train_opts)", g->name);
		return 0;
	}
	uint32_t pred = prediction(g, o);
	if (!pred)
		return 0;
	ir_type t = g->val[pred]->type;
	if (o->loss == KILN_LOSS_CROSS_ENTROPY) {
		if (t.rank < 2) {
			char b[256];
			ir_errorf(g, NULL, KILN_ESHAPE, "train step: cross-entropy needs logits [N,C,...], "
			          "got %s", ir_type_str(g, &t, b, sizeof b));
			return 0;
		}
		memmove(&t.dim[1], &t.dim[2], (size_t)(t.rank - 2) * sizeof t.dim[0]);
		t.rank--, t.dtype = KILN_I64;
		uint32_t y = kiln_input_at(g, HERE, "target", KILN_I64, t.rank, t.dim);
		return kiln_softmax_cross_entropy_at(g, HERE, pred, y, KILN_NONE, "mean", false, 0);
	}
	if (o->loss == KILN_LOSS_MSE) {
		uint32_t y = kiln_input_at(g, HERE, "target", t.dtype, t.rank, t.dim);
		return kiln_mse_loss_at(g, HERE, pred, y, "mean");
	}
	ir_errorf(g, NULL, KILN_EINVAL, "train step: unknown loss kind %d", (int)o->loss);
	return 0;
}

/* Each gradient as an output "<p>.grad", in the order backward computes
 * them (by defining node: the last layer's first), so a compiled step can
 * hand them to a hook before the optimizer reads them (the split step). */
static void add_grad_outputs(kiln_graph *g, int m, const uint32_t *param, const uint32_t *grad)
{
	uint32_t *order = calloc((size_t)m + 1, sizeof *order);
	if (!order) {
		ir_errorf(g, NULL, KILN_ENOMEM, "train step: out of memory");
		return;
	}
	for (int i = 0; i < m; i++)
		order[i] = (uint32_t)i;
	for (int i = 1; i < m; i++) /* insertion sort by where each gradient is made */
		for (int j = i; j > 0; j--) {
			const ir_node *a = g->val[grad[order[j - 1]]]->def, *b = g->val[grad[order[j]]]->def;
			if (!a || !b || a->idx <= b->idx)
				break;
			uint32_t k = order[j];
			order[j] = order[j - 1], order[j - 1] = k;
		}
	for (int i = 0; i < m && g->status == KILN_OK; i++) {
		char name[600];
		snprintf(name, sizeof name, "%s.grad", g->val[param[order[i]]]->name);
		ir_value *v = g->val[grad[order[i]]];
		if (v->kind != IR_V_NODE || v->name)
			ir_errorf(g, NULL, KILN_EUNSUPPORTED, "train step: the gradient of '%s' is not a "
			          "value of its own", g->val[param[order[i]]]->name);
		else
			v->name = ir_intern(g, name), ir_output_add(g, grad[order[i]], NULL);
	}
	free(order);
}

/* Differentiates loss by every trainable parameter and appends the update;
 * parameters the loss does not reach are left alone, as PyTorch skips a
 * parameter whose .grad is None. */
static void add_update(kiln_graph *g, const kiln_train_opts *o, uint32_t loss, bool grads)
{
	int n = 0;
	uint32_t *param = calloc(g->nval + 1, sizeof *param), *grad = calloc(g->nval + 1, sizeof *grad);
	if (!param || !grad) {
		ir_errorf(g, NULL, KILN_ENOMEM, "train step: out of memory");
		goto out;
	}
	for (uint32_t i = 1; i < g->nval; i++)
		if (g->val[i]->kind == IR_V_PARAM && g->val[i]->trainable)
			param[n++] = i;
	/* SyncBatchNorm's sums (outputs "*.sync_*"): their adjoints too, which
	 * the split step all-reduces before backward goes on through them */
	int nsync = 0;
	for (uint32_t i = 0; grads && i < g->noutput; i++) {
		const char *name = g->val[g->output[i]]->name;
		if (name && strstr(name, ".sync_"))
			param[n + nsync++] = g->output[i];
	}
	if (pass_grad(g, HERE, loss, n + nsync, param, grad) != KILN_OK)
		goto out;
	for (int i = n; i < n + nsync && g->status == KILN_OK; i++) {
		char name[600];
		snprintf(name, sizeof name, "%s_adj", g->val[param[i]]->name);
		ir_value *v = grad[i] ? g->val[grad[i]] : NULL;
		if (!v || v->kind != IR_V_NODE || v->name)
			ir_errorf(g, NULL, KILN_EUNSUPPORTED, "train step: synchronised BatchNorm: the "
			          "gradient of '%s' is not a value of its own", g->val[param[i]]->name);
		else
			v->name = ir_intern(g, name), ir_output_add(g, grad[i], NULL);
	}
	int m = 0;
	for (int i = 0; i < n; i++)
		if (grad[i])
			param[m] = param[i], grad[m++] = grad[i];
	uint32_t lr = kiln_input_at(g, HERE, "lr", KILN_F64, 0, NULL);
	uint32_t step = kiln_input_at(g, HERE, "step", KILN_F64, 0, NULL);
	uint32_t apply = o->accum_steps > 1 ? kiln_input_at(g, HERE, "apply", KILN_BOOL, 0, NULL) : 0;
	if (g->status == KILN_OK && grads)
		add_grad_outputs(g, m, param, grad);
	if (g->status == KILN_OK)
		pass_optim(g, o, &(pass_optim_io){m, param, grad, lr, step, apply});
out:
	free(param), free(grad);
}

KILN_API kiln_status kiln_build_train_step(const kiln_graph *model, const kiln_train_opts *o,
                                           kiln_graph **step, kiln_error *err)
{
	return driver_build_train_step(model, o, false, step, err);
}

kiln_status driver_build_train_step(const kiln_graph *model, const kiln_train_opts *o,
                                    bool grad_outputs, kiln_graph **step, kiln_error *err)
{
	if (!model || !o || !step)
		return ir_seterr(err, KILN_EINVAL, "kiln_build_train_step: null argument");
	*step = NULL;
	if (model->status != KILN_OK)
		return ir_seterr(err, model->status, "kiln_build_train_step: graph '%s' has an error: "
		                 "%s", model->name, model->errmsg);
	if (ir_check_weights(model, "train", err) != KILN_OK)
		return KILN_EINVAL;
	kiln_graph *g = ir_graph_clone(model);
	if (!g)
		return ir_seterr(err, KILN_ENOMEM, "kiln_build_train_step: out of memory");
	uint32_t loss = add_loss(g, o);
	kiln_dtype ldt = loss ? g->val[loss]->type.dtype : KILN_DT_INVALID;
	if (loss && (g->val[loss]->type.rank != 0 || !kiln_dtype_is_float(ldt)))
		ir_errorf(g, NULL, KILN_ESHAPE, "train step: the loss must be a float scalar");
	/* outputs: "loss", the model's state updates, then the optimizer's */
	uint32_t nold = g->noutput, *old = calloc(nold + 1, sizeof *old);
	if (old && g->status == KILN_OK) {
		memcpy(old, g->output, nold * sizeof *old);
		g->noutput = 0;
		if (g->val[loss]->name && !strcmp(g->val[loss]->name, "loss"))
			ir_output_add(g, loss, NULL);
		else
			kiln_output_at(g, HERE, "loss", loss);
		for (uint32_t i = 0; i < nold; i++)
			if (g->val[old[i]]->name && (ends_with(g->val[old[i]]->name, ".next") ||
			                             strstr(g->val[old[i]]->name, ".sync_")))
				ir_output_add(g, old[i], NULL);
		add_update(g, o, loss, grad_outputs);
	} else if (!old) {
		ir_errorf(g, NULL, KILN_ENOMEM, "train step: out of memory");
	}
	free(old);
	if (g->status == KILN_OK)
		pass_run_list(g, "cse,dce", &(pass_opts){0}, NULL);
	if (g->status == KILN_OK && kiln_graph_verify(g, err) == KILN_OK) {
		*step = g;
		return KILN_OK;
	}
	kiln_status st = g->status != KILN_OK
	                         ? ir_seterr(err, g->status, "%s", g->errmsg)
	                         : (err ? err->code : KILN_EVERIFY);
	kiln_graph_free(g);
	return st;
}

/* ---- the inference graph of a training-mode model ---------------------------------- */

/* Where value v is read, for a message: a node, a graph output, or NULL. */
static const char *reader(const kiln_graph *g, uint32_t v, char *buf, size_t size)
{
	const ir_value *x = g->val[v];
	for (uint32_t i = 0; i < g->noutput; i++)
		if (g->output[i] == v)
			return snprintf(buf, size, "graph output '%s'", x->name ? x->name : "?"), buf;
	return x->nuse ? ir_node_desc(x->uses[0], buf, size) : NULL;
}

/* A training-mode BatchNormalization (training_mode=1, what
 * torch.onnx.export writes with TrainingMode.TRAINING) made an inference
 * one: it reads its running stats, which become buffers, and loses the
 * outputs with their ONNX-style updates, which nothing may read: in the
 * train-mode graph kiln updates the running stats itself, PyTorch's way. */
static bool bn_to_inference(kiln_graph *g, ir_node *n)
{
	if (!ir_attr_int(n, "training_mode", 0))
		return false;
	static const char *const what[] = {"", "running_mean", "running_var"};
	for (uint32_t i = 1; i < n->nout; i++) {
		char by[300];
		const ir_value *o = g->val[n->out[i]];
		if (reader(g, n->out[i], by, sizeof by)) {
			ir_errorf(g, n, KILN_EUNSUPPORTED, "output %u ('%s', the ONNX-style updated %s) "
			          "is read by %s; kiln keeps running statistics as buffers that its train "
			          "step updates, so nothing may read that output", i,
			          o->name ? o->name : "?", what[i < 3 ? i : 0], by);
			return false;
		}
	}
	for (uint32_t i = 1; i < n->nout; i++)
		g->val[n->out[i]]->kind = IR_V_NONE; /* unread: ir_compact drops them */
	n->nout = 1;
	if (ir_attr_set_int(g, n, "training_mode", 0))
		return false;
	for (uint32_t i = 3; i < 5; i++)
		if (g->val[n->in[i]]->kind == IR_V_PARAM)
			g->val[n->in[i]]->trainable = false;
	return true;
}

/* Dropout off: the identity, kept in the graph so that the train-mode
 * graph derived from it turns it back on with its ratio. */
static bool dropout_to_inference(kiln_graph *g, ir_node *n)
{
	if (!ir_attr_int(n, "training_mode", 0))
		return false;
	return ir_attr_set_int(g, n, "training_mode", 0) == KILN_OK;
}

/* Every training-mode node of g made its inference form, in place; the
 * count of nodes changed, or -1 with the error recorded in g. */
static int to_inference(kiln_graph *g)
{
	int changed = 0;
	for (uint32_t i = 0; i < g->nnode && g->status == KILN_OK; i++) {
		ir_node *n = g->node[i];
		if (!n->dead && n->op == KILN_OP_BATCH_NORM)
			changed += bn_to_inference(g, n);
		else if (!n->dead && n->op == KILN_OP_DROPOUT)
			changed += dropout_to_inference(g, n);
	}
	if (g->status == KILN_OK && changed)
		ir_compact(g);
	return g->status == KILN_OK ? changed : -1;
}

KILN_API kiln_status kiln_inference_graph_from_train(const kiln_graph *g, kiln_graph **inference,
                                                     int *nchanged, kiln_error *err)
{
	if (nchanged)
		*nchanged = 0;
	if (!g || !inference)
		return ir_seterr(err, KILN_EINVAL, "kiln_inference_graph_from_train: null argument");
	*inference = NULL;
	if (g->status != KILN_OK)
		return ir_seterr(err, g->status, "kiln_inference_graph_from_train: graph '%s' has an "
		                 "error: %s", g->name, g->errmsg);
	kiln_graph *c = ir_graph_clone(g);
	if (!c)
		return ir_seterr(err, KILN_ENOMEM, "kiln_inference_graph_from_train: out of memory");
	int n = to_inference(c);
	kiln_status st = n >= 0 ? kiln_graph_verify(c, err)
	                        : ir_seterr(err, c->status, "%s", c->errmsg);
	if (st != KILN_OK) {
		kiln_graph_free(c);
		return st;
	}
	if (nchanged)
		*nchanged = n;
	*inference = c;
	return KILN_OK;
}

/* ---- the train-mode graph of an inference model ------------------------------------ */

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* running * (1 - m) + batch * m, output as "<running>.next" */
static void update(kiln_graph *g, kiln_loc loc, const ir_value *run, kiln_value batch, double m)
{
	kiln_dtype dt = run->type.dtype;
	char name[600];
	snprintf(name, sizeof name, "%s.next", run->name);
	kiln_value keep = kiln_mul_at(g, loc, run->id, kiln_scalar_at(g, loc, dt, 1 - m));
	kiln_output_at(g, loc, name, kiln_add_at(g, loc, keep,
	                                         kiln_mul_at(g, loc, batch, kiln_scalar_at(g, loc, dt, m))));
}

/* An inference BatchNormalization turned into PyTorch's training-mode batch
 * norm, as kiln_batchnorm traces it in train mode: the node reads the batch
 * mean and biased variance instead of its running stats, which update with
 * PyTorch's momentum (ONNX's momentum attribute is 1 - PyTorch's) and the
 * unbiased variance; "<prefix>num_batches_tracked", if the model has it,
 * counts up.  A BatchNorm that already reads computed statistics (PyTorch's
 * track_running_stats=False exports the batch's, from ReduceMean) has no
 * running stats to update and normalises with what it reads in both modes,
 * so it stays as it is. */
static void bn_to_train(kiln_graph *g, ir_node *n, uint64_t seed, int ranks)
{
	(void)seed;
	ir_value *rm = g->val[n->in[3]], *rv = g->val[n->in[4]];
	if (rm->kind == IR_V_NODE && rv->kind == IR_V_NODE)
		return;
	if (rm->kind != IR_V_PARAM || rv->kind != IR_V_PARAM || !rm->name || !rv->name) {
		ir_errorf(g, n, KILN_EUNSUPPORTED, "the running mean and variance must be named "
		          "parameters to be trained");
		return;
	}
	kiln_loc loc = n->loc;
	double m = 1 - ir_attr_float(n, "momentum", 0.9);
	fe_bn_stats st = fe_bn_batch_stats_sync(g, loc, n->in[0], rm->type.dtype, ranks, rm->name);
	if (g->status != KILN_OK)
		return;
	ir_set_input(g, n, 3, st.mean);
	ir_set_input(g, n, 4, st.var);
	rm->trainable = rv->trainable = false;
	update(g, loc, rm, st.mean, m);
	update(g, loc, rv, st.unbiased, m);
	char nbt[600];
	size_t k = strlen(rm->name), s = strlen("running_mean");
	snprintf(nbt, sizeof nbt, "%.*snum_batches_tracked", (int)(k >= s ? k - s : 0), rm->name);
	uint32_t p = k > s && !strcmp(rm->name + k - s, "running_mean") ? kiln_graph_find_param(g, nbt) : 0;
	if (p && g->val[p]->type.dtype == KILN_I64 && g->val[p]->type.rank == 0)
		update(g, loc, g->val[p], kiln_add_at(g, loc, p, kiln_scalar_at(g, loc, KILN_I64, 1)), 1);
}

/* Dropout on, each node with its own stream derived from the seed and its
 * node index (the trainer then varies it per micro-batch). */
static void dropout_to_train(kiln_graph *g, ir_node *n, uint64_t seed, int ranks)
{
	(void)ranks;
	ir_attr_set_int(g, n, "training_mode", 1);
	ir_attr_set_int(g, n, "seed", (int64_t)(mix64(seed ^ mix64(n->idx)) >> 1));
}

typedef void (*to_train_fn)(kiln_graph *g, ir_node *n, uint64_t seed, int ranks);
static const to_train_fn to_train[KILN_OP_COUNT] = {
	[KILN_OP_BATCH_NORM] = bn_to_train,
	[KILN_OP_DROPOUT] = dropout_to_train,
};

/* A graph with "<name>.next" outputs was traced in train mode already. */
static kiln_status refuse_train_mode(const kiln_graph *g, kiln_error *err)
{
	for (uint32_t i = 0; i < g->noutput; i++) {
		const char *name = g->val[g->output[i]]->name;
		if (name && ends_with(name, ".next"))
			return ir_seterr(err, KILN_EINVAL, "kiln_train_graph_from_inference: graph '%s': "
			                 "output '%s' is a state update, so the model was traced in train "
			                 "mode; this needs the inference-mode model", g->name, name);
	}
	return KILN_OK;
}

KILN_API kiln_status kiln_train_graph_from_inference(const kiln_graph *inference, uint64_t seed,
                                                     kiln_graph **train, kiln_error *err)
{
	return driver_train_graph_sync_bn(inference, seed, 1, train, err);
}

kiln_status driver_train_graph_sync_bn(const kiln_graph *inference, uint64_t seed, int ranks,
                                       kiln_graph **train, kiln_error *err)
{
	if (!inference || !train)
		return ir_seterr(err, KILN_EINVAL, "kiln_train_graph_from_inference: null argument");
	*train = NULL;
	if (inference->status != KILN_OK)
		return ir_seterr(err, inference->status, "kiln_train_graph_from_inference: graph '%s' "
		                 "has an error: %s", inference->name, inference->errmsg);
	kiln_status st = ir_check_weights(inference, "train", err);
	if (st == KILN_OK)
		st = refuse_train_mode(inference, err);
	if (st != KILN_OK)
		return st;
	kiln_graph *g = ir_graph_clone(inference);
	if (!g)
		return ir_seterr(err, KILN_ENOMEM, "kiln_train_graph_from_inference: out of memory");
	/* a training-mode export (BatchNorm training_mode=1, Dropout on) is
	 * first made the inference model it stands for */
	uint32_t nnode = to_inference(g) < 0 ? 0 : g->nnode; /* the conversions append nodes */
	for (uint32_t i = 0; i < nnode && g->status == KILN_OK; i++)
		if (!g->node[i]->dead && to_train[g->node[i]->op])
			to_train[g->node[i]->op](g, g->node[i], seed, ranks);
	if (g->status == KILN_OK) /* BatchNorm nodes now read values made after them */
		ir_toposort(g);
	if (g->status == KILN_OK && kiln_graph_verify(g, err) == KILN_OK) {
		*train = g;
		return KILN_OK;
	}
	st = g->status != KILN_OK ? ir_seterr(err, g->status, "%s", g->errmsg)
	                          : (err ? err->code : KILN_EVERIFY);
	kiln_graph_free(g);
	return st;
}

/* ---- the trainer ---------------------------------------------------------------- */

struct kiln_trainer {
	kiln_graph *g;          /* the step graph: its parameters are the state */
	kiln_graph *eval;       /* the eval model's clone, or NULL */
	uint32_t *dst;          /* per output of g: the parameter it replaces (0: loss) */
	uint32_t *share;        /* per value of eval: the step graph's parameter (0: none) */
	ir_node **drop;         /* g's Dropout nodes ... */
	int64_t *seed;          /* ... and the seeds they were traced with */
	uint32_t ndrop;
	int x, y, lr, t, apply; /* positions among g's inputs (-1: none) */
	int accum;              /* micro-batches per update */
	int64_t steps, micro;   /* optimizer steps and micro-batches so far */
};

/* Finds where each input goes: "lr", "step", "apply" by name, then the
 * first other input is x and the second y. */
static kiln_status place_inputs(kiln_trainer *tr, kiln_error *err)
{
	const kiln_graph *g = tr->g;
	int *slot[] = {&tr->lr, &tr->t, &tr->apply}, ndata = 0;
	const char *fixed[] = {"lr", "step", "apply"};
	tr->x = tr->y = tr->lr = tr->t = tr->apply = -1;
	for (uint32_t i = 0; i < g->ninput; i++) {
		const char *name = g->val[g->input[i]]->name;
		int k = 0;
		while (k < 3 && strcmp(name, fixed[k]))
			k++;
		if (k < 3)
			*slot[k] = (int)i;
		else if (ndata++ < 2)
			*(ndata == 1 ? &tr->x : &tr->y) = (int)i;
		else
			return ir_seterr(err, KILN_EUNSUPPORTED, "kiln_trainer_new: the trainer feeds "
			                 "one data input and one target, but the step graph also has "
			                 "input '%s'", name);
	}
	if (tr->x < 0 || tr->lr < 0 || tr->t < 0)
		return ir_seterr(err, KILN_EINVAL, "kiln_trainer_new: the step graph needs a data "
		                 "input, \"lr\" and \"step\"");
	return KILN_OK;
}

/* Pairs every "<p>.next" output with parameter p of the same type. */
static kiln_status map_outputs(kiln_trainer *tr, kiln_error *err)
{
	kiln_graph *g = tr->g;
	if (!(tr->dst = calloc(g->noutput + 1, sizeof *tr->dst)))
		return ir_seterr(err, KILN_ENOMEM, "kiln_trainer_new: out of memory");
	for (uint32_t i = 1; i < g->noutput; i++) {
		const ir_value *o = g->val[g->output[i]];
		char name[600];
		size_t n = o->name ? strlen(o->name) : 0;
		if (n < 6 || n - 5 >= sizeof name || !ends_with(o->name, ".next"))
			return ir_seterr(err, KILN_EVERIFY, "kiln_trainer_new: output %u ('%s') is not a "
			                 "\"<name>.next\" state update", (unsigned)i, o->name ? o->name : "?");
		memcpy(name, o->name, n - 5);
		name[n - 5] = '\0';
		uint32_t p = kiln_graph_find_param(g, name);
		if (!p || !ir_type_eq(&g->val[p]->type, &o->type))
			return ir_seterr(err, KILN_EVERIFY, "kiln_trainer_new: output '%s' has no "
			                 "parameter '%s' of the same type to replace", o->name, name);
		tr->dst[i] = p;
	}
	return KILN_OK;
}

/* Links each eval parameter to the step graph's of the same name. */
static kiln_status share_params(kiln_trainer *tr, kiln_error *err)
{
	const kiln_graph *e = tr->eval;
	if (!(tr->share = calloc(e->nval + 1, sizeof *tr->share)))
		return ir_seterr(err, KILN_ENOMEM, "kiln_trainer_new: out of memory");
	if (e->ninput != 1 || e->noutput < 1)
		return ir_seterr(err, KILN_EUNSUPPORTED, "kiln_trainer_new: the eval model needs one "
		                 "input and an output, it has %u and %u", e->ninput, e->noutput);
	for (uint32_t i = 1; i < e->nval; i++) {
		const ir_value *v = e->val[i];
		if (v->kind != IR_V_PARAM || !v->name)
			continue;
		uint32_t p = kiln_graph_find_param(tr->g, v->name);
		if (!p || !ir_type_eq(&tr->g->val[p]->type, &v->type))
			return ir_seterr(err, KILN_EINVAL, "kiln_trainer_new: eval parameter '%s' has no "
			                 "match of the same type in the train model", v->name);
		tr->share[i] = p;
	}
	return KILN_OK;
}

static kiln_status find_dropouts(kiln_trainer *tr, kiln_error *err)
{
	kiln_graph *g = tr->g;
	tr->drop = calloc(g->nnode + 1, sizeof *tr->drop);
	tr->seed = calloc(g->nnode + 1, sizeof *tr->seed);
	if (!tr->drop || !tr->seed)
		return ir_seterr(err, KILN_ENOMEM, "kiln_trainer_new: out of memory");
	for (uint32_t i = 0; i < g->nnode; i++)
		if (!g->node[i]->dead && ir_op(g->node[i]->op)->flags & IR_RANDOM) {
			tr->drop[tr->ndrop] = g->node[i];
			tr->seed[tr->ndrop++] = ir_attr_int(g->node[i], "seed", 0);
		}
	return KILN_OK;
}

KILN_API kiln_status kiln_trainer_new(const kiln_graph *model, const kiln_graph *eval_model,
                                      const kiln_train_opts *o, kiln_trainer **out,
                                      kiln_error *err)
{
	if (!out)
		return ir_seterr(err, KILN_EINVAL, "kiln_trainer_new: null argument");
	*out = NULL;
	if (eval_model && eval_model->status != KILN_OK)
		return ir_seterr(err, eval_model->status, "kiln_trainer_new: eval graph '%s' has an "
		                 "error: %s", eval_model->name, eval_model->errmsg);
	if (ir_check_weights(eval_model, "evaluate", err) != KILN_OK)
		return KILN_EINVAL;
	kiln_trainer *tr = calloc(1, sizeof *tr);
	if (!tr)
		return ir_seterr(err, KILN_ENOMEM, "kiln_trainer_new: out of memory");
	kiln_status rc = kiln_build_train_step(model, o, &tr->g, err);
	tr->accum = o && o->accum_steps > 1 ? o->accum_steps : 1;
	if (!rc)
		rc = place_inputs(tr, err);
	if (!rc)
		rc = map_outputs(tr, err);
	if (!rc)
		rc = find_dropouts(tr, err);
	if (!rc && eval_model && !(tr->eval = ir_graph_clone(eval_model)))
		rc = ir_seterr(err, KILN_ENOMEM, "kiln_trainer_new: out of memory");
	if (!rc && tr->eval)
		rc = share_params(tr, err);
	if (rc) {
		kiln_trainer_free(tr);
		return rc;
	}
	*out = tr;
	return KILN_OK;
}

KILN_API void kiln_trainer_free(kiln_trainer *tr)
{
	if (!tr)
		return;
	kiln_graph_free(tr->g);
	kiln_graph_free(tr->eval);
	free(tr->dst), free(tr->share), free(tr->drop), free(tr->seed);
	free(tr);
}

KILN_API int64_t kiln_trainer_steps(const kiln_trainer *tr)
{
	return tr ? tr->steps : 0;
}

KILN_API const kiln_graph *kiln_trainer_graph(const kiln_trainer *tr)
{
	return tr ? tr->g : NULL;
}

/* ---- running steps ---------------------------------------------------------------- */

/* Each micro-batch gets fresh dropout masks, fixed by the layer's traced
 * seed and the micro-batch count, which a checkpoint keeps. */
static void reseed(kiln_trainer *tr)
{
	for (uint32_t i = 0; i < tr->ndrop; i++)
		ir_attr_set_int(tr->g, tr->drop[i], "seed",
		                (int64_t)mix64((uint64_t)tr->seed[i] ^ mix64((uint64_t)tr->micro)));
}

/* Copies every ".next" output over its parameter: the step's commit. */
static void commit(kiln_trainer *tr, kiln_tensor *const *out)
{
	for (uint32_t i = 1; i < tr->g->noutput; i++) {
		kiln_tensor *p = tr->g->val[tr->dst[i]]->data;
		memcpy(p->data, out[i]->data, kiln_tensor_nbytes(p));
	}
}

KILN_API kiln_status kiln_trainer_step(kiln_trainer *tr, const kiln_tensor *x,
                                       const kiln_tensor *y, double lr, double *loss,
                                       kiln_error *err)
{
	if (!tr || !x || (tr->y >= 0 && !y))
		return ir_seterr(err, KILN_EINVAL, "kiln_trainer_step: null argument (x%s)",
		                 tr && tr->y >= 0 ? " and y are required" : " is required");
	uint32_t nin = tr->g->ninput, nout = tr->g->noutput;
	bool apply = (tr->micro + 1) % tr->accum == 0;
	double t = (double)(tr->steps + 1);
	kiln_tensor lrt = {KILN_F64, 0, {0}, &lr}, tt = {KILN_F64, 0, {0}, &t};
	kiln_tensor at = {KILN_BOOL, 0, {0}, &apply};
	kiln_tensor **in = calloc(nin + 1, sizeof *in), **out = calloc(nout + 1, sizeof *out);
	if (!in || !out) {
		free(in), free(out);
		return ir_seterr(err, KILN_ENOMEM, "kiln_trainer_step: out of memory");
	}
	in[tr->x] = (kiln_tensor *)x;
	if (tr->y >= 0)
		in[tr->y] = (kiln_tensor *)y;
	in[tr->lr] = &lrt, in[tr->t] = &tt;
	if (tr->apply >= 0)
		in[tr->apply] = &at;
	reseed(tr);
	kiln_status rc = kiln_graph_run(tr->g, in, (int)nin, out, (int)nout, err);
	if (!rc) {
		commit(tr, out);
		if (loss)
			*loss = ir_load(out[0], 0);
		tr->micro++;
		tr->steps += apply;
	}
	for (uint32_t i = 0; i < nout; i++)
		kiln_tensor_free(out[i]);
	free(in), free(out);
	return rc;
}

KILN_API kiln_status kiln_trainer_eval(kiln_trainer *tr, const kiln_tensor *x,
                                       kiln_tensor **out, kiln_error *err)
{
	if (!tr || !x || !out)
		return ir_seterr(err, KILN_EINVAL, "kiln_trainer_eval: null argument");
	*out = NULL;
	if (!tr->eval)
		return ir_seterr(err, KILN_EINVAL, "kiln_trainer_eval: the trainer was made without "
		                 "an eval model");
	kiln_graph *e = tr->eval;
	for (uint32_t i = 1; i < e->nval; i++)
		if (tr->share[i])
			memcpy(e->val[i]->data->data, tr->g->val[tr->share[i]]->data->data,
			       kiln_tensor_nbytes(e->val[i]->data));
	kiln_tensor **res = calloc(e->noutput + 1, sizeof *res);
	if (!res)
		return ir_seterr(err, KILN_ENOMEM, "kiln_trainer_eval: out of memory");
	kiln_status rc = kiln_graph_run(e, (kiln_tensor *const[]){(kiln_tensor *)x}, 1, res,
	                                (int)e->noutput, err);
	if (!rc)
		*out = res[0], res[0] = NULL;
	for (uint32_t i = 0; i < e->noutput; i++)
		kiln_tensor_free(res[i]);
	free(res);
	return rc;
}

/* ---- checkpoints ------------------------------------------------------------------ */

/* The format is runtime/model.h's (RT_CKPT_*), which a compiled training
 * library reads and writes too. */

/* Every named parameter of the step graph and the counters. */
KILN_API kiln_tensor_set *kiln_trainer_state(const kiln_trainer *tr)
{
	kiln_tensor_set *s = tr ? kiln_graph_params(tr->g) : NULL;
	if (s && rt_ckpt_add_counters(s, tr->steps, tr->micro)) {
		kiln_tensor_set_free(s);
		return NULL;
	}
	return s;
}

KILN_API kiln_status kiln_trainer_save(const kiln_trainer *tr, const char *path,
                                       kiln_error *err)
{
	if (!tr || !path)
		return ir_seterr(err, KILN_EINVAL, "kiln_trainer_save: null argument");
	kiln_tensor_set *s = kiln_trainer_state(tr);
	kiln_status rc = s && !rt_ckpt_seal(s)
	                         ? kiln_safetensors_write(path, s, err)
	                         : ir_seterr(err, KILN_ENOMEM, "kiln_trainer_save: out of memory");
	kiln_tensor_set_free(s);
	return rc;
}

/* Checks a checkpoint against the trainer without changing anything. */
static kiln_status check_ckpt(const kiln_trainer *tr, const kiln_tensor_set *s,
                              const char *path, kiln_error *err)
{
	const kiln_graph *g = tr->g;
	int64_t steps, micro;
	kiln_status rc = rt_ckpt_check_sum(s, path, err);
	if (rc == KILN_OK)
		rc = rt_ckpt_counters(s, path, &steps, &micro, err);
	if (rc)
		return rc;
	int nparam = 0;
	for (uint32_t i = 1; i < g->nval; i++) {
		const ir_value *v = g->val[i];
		if (v->kind != IR_V_PARAM || !v->name)
			continue;
		nparam++;
		const kiln_tensor *t = kiln_tensor_set_get(s, v->name);
		ir_type tt = {t ? t->dtype : KILN_DT_INVALID, t ? t->rank : 0, {0}};
		for (int d = 0; t && d < t->rank; d++)
			tt.dim[d] = t->shape[d];
		char a[256], b[256];
		if (!t)
			return ir_seterr(err, KILN_EINVAL, "checkpoint '%s': '%s' is missing", path,
			                 v->name);
		if (!ir_type_eq(&tt, &v->type))
			return ir_seterr(err, KILN_ESHAPE, "checkpoint '%s': '%s' is %s in the file but "
			                 "%s in the trainer", path, v->name, ir_type_str(g, &tt, a, sizeof a),
			                 ir_type_str(g, &v->type, b, sizeof b));
	}
	for (int i = 0; i < s->count && s->count != nparam + 3; i++)
		if (s->items[i].name[0] != '_' && !kiln_graph_find_param(g, s->items[i].name))
			return ir_seterr(err, KILN_EINVAL, "checkpoint '%s': '%s' is not part of this "
			                 "trainer (a different model or optimizer?)", path,
			                 s->items[i].name);
	if (s->count != nparam + 3)
		return ir_seterr(err, KILN_EINVAL, "checkpoint '%s': %d tensors, expected %d", path,
		                 s->count, nparam + 3);
	return KILN_OK;
}

KILN_API kiln_status kiln_trainer_load(kiln_trainer *tr, const char *path, kiln_error *err)
{
	if (!tr || !path)
		return ir_seterr(err, KILN_EINVAL, "kiln_trainer_load: null argument");
	kiln_tensor_set *s = NULL;
	kiln_error e = {0};
	kiln_status rc = kiln_safetensors_read(path, &s, &e);
	if (rc) {
		ir_seterr(err, rc, "checkpoint refused: %s", e.msg);
		return rc;
	}
	rc = check_ckpt(tr, s, path, err);
	for (int i = 0; !rc && i < s->count; i++) {
		uint32_t p = kiln_graph_find_param(tr->g, s->items[i].name);
		if (p)
			memcpy(tr->g->val[p]->data->data, s->items[i].tensor->data,
			       kiln_tensor_nbytes(s->items[i].tensor));
	}
	if (!rc)
		rt_ckpt_counters(s, path, &tr->steps, &tr->micro, NULL);
	kiln_tensor_set_free(s);
	return rc;
}

/* Checks every named parameter of g against s without changing anything. */
static kiln_status check_trained(const kiln_graph *g, const kiln_tensor_set *s, const char *path,
                                 kiln_error *err)
{
	for (uint32_t i = 1; i < g->nval; i++) {
		const ir_value *v = g->val[i];
		if (v->kind != IR_V_PARAM || !v->name)
			continue;
		const kiln_tensor *t = kiln_tensor_set_get(s, v->name);
		if (!t)
			return ir_seterr(err, KILN_EINVAL, "weights '%s': parameter '%s' of graph '%s' is "
			                 "missing", path, v->name, g->name);
		ir_type tt = {t->dtype, t->rank, {0}};
		for (int d = 0; d < t->rank; d++)
			tt.dim[d] = t->shape[d];
		char a[256], b[256];
		if (!ir_type_eq(&tt, &v->type))
			return ir_seterr(err, KILN_ESHAPE, "weights '%s': '%s' is %s in the file but %s in "
			                 "graph '%s'", path, v->name, ir_type_str(g, &tt, a, sizeof a),
			                 ir_type_str(g, &v->type, b, sizeof b), g->name);
	}
	return KILN_OK;
}

KILN_API kiln_status kiln_graph_load_trained(kiln_graph *g, const char *path, kiln_error *err)
{
	if (!g || !path)
		return ir_seterr(err, KILN_EINVAL, "kiln_graph_load_trained: null argument");
	kiln_tensor_set *s = NULL;
	kiln_error e = {0};
	kiln_status rc = kiln_safetensors_read(path, &s, &e);
	if (rc)
		return ir_seterr(err, rc, "weights refused: %s", e.msg);
	const kiln_tensor *st = kiln_tensor_set_get(s, RT_CKPT_SUM);
	int64_t sum = 0;
	if (st && st->dtype == KILN_I64 && st->rank == 0)
		memcpy(&sum, st->data, sizeof sum);
	if (st && (st->dtype != KILN_I64 || st->rank != 0 || (uint64_t)sum != rt_ckpt_checksum(s)))
		rc = ir_seterr(err, KILN_EPARSE, "weights '%s': checksum mismatch, the file is corrupt",
		               path);
	if (!rc)
		rc = check_trained(g, s, path, err);
	for (uint32_t i = 1; !rc && i < g->nval; i++) {
		ir_value *v = g->val[i];
		if (v->kind == IR_V_PARAM && v->name)
			memcpy(v->data->data, kiln_tensor_set_get(s, v->name)->data,
			       kiln_tensor_nbytes(v->data));
	}
	if (!rc)
		g->weights_missing = NULL; /* every parameter was in the file */
	kiln_tensor_set_free(s);
	return rc;
}
