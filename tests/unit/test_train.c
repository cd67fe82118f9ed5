/*
 * test_train.c: train steps built by kiln_build_train_step and run by
 * kiln_trainer, against PyTorch.
 *
 * The fixtures (tests/fixtures/make_train_fixtures.py) hold an MLP and a
 * Conv-BatchNorm CNN on sklearn's digits with fixed initial weights and
 * batches, and PyTorch's per-step losses for 20 steps of several optimizers
 * in f64 and f32.  The same models are traced here with the DSL in train
 * mode; in f64 every loss must match to 1e-9 relative (the semantics are
 * exactly PyTorch's), in f32 to 1e-4.  Checkpoints must resume bit for bit,
 * and a truncated or corrupt file must be refused without touching the
 * trainer or the previous checkpoint.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "tmpdir.h"
#include "ckpt_edit.h"
#include "kiln/kiln.h"

#define DIR KILN_FIXTURES "/train/"
#define STEPS 20

/* ---- fixtures and models ------------------------------------------------ */

static kiln_tensor *npy(const char *name)
{
	char path[512];
	snprintf(path, sizeof path, DIR "%s", name);
	kiln_tensor *t = NULL;
	kiln_error err;
	ck_assert_msg(kiln_npy_read(path, &t, &err) == KILN_OK, "%s", err.msg);
	return t;
}

/* The f32 fixture tensor t in dtype dt (frees t). */
static kiln_tensor *as(kiln_tensor *t, kiln_dtype dt)
{
	if (t->dtype == dt)
		return t;
	kiln_tensor *c = kiln_tensor_new(dt, t->rank, t->shape);
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		((double *)c->data)[i] = ((float *)t->data)[i];
	kiln_tensor_free(t);
	return c;
}

/* Batch s of a stacked [STEPS, ...] tensor, as a view (rows b0..b1). */
static kiln_tensor view(const kiln_tensor *t, int s, int64_t b0, int64_t b1)
{
	kiln_tensor v = {t->dtype, t->rank - 1, {0}, NULL};
	memcpy(v.shape, t->shape + 1, (size_t)v.rank * sizeof v.shape[0]);
	int64_t row = kiln_tensor_nbytes(t) / t->shape[0] / t->shape[1];
	v.shape[0] = b1 - b0;
	v.data = (char *)t->data + (s * t->shape[1] + b0) * row;
	return v;
}

static void load_init(kiln_graph *g, const char *model, kiln_dtype dt)
{
	char path[512];
	snprintf(path, sizeof path, DIR "%s_init_%s.safetensors", model, kiln_dtype_name(dt));
	kiln_tensor_set *s = NULL;
	kiln_error err;
	ck_assert_msg(kiln_safetensors_read(path, &s, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_graph_load_params(g, s, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor_set_free(s);
}

/* mlp: fc1 Linear(64, 32), ReLU, fc2 Linear(32, 10); p > 0 adds Dropout. */
static kiln_graph *mlp(kiln_dtype dt, bool training, double p)
{
	kiln_graph *g = kiln_graph_new("mlp");
	kiln_graph_set_training(g, training);
	kiln_value x = kiln_input(g, "x", dt, 2, (int64_t[]){kiln_sym(g, "N"), 64});
	kiln_value h = kiln_relu(g, kiln_linear(g, "fc1", x, 32, true));
	if (p > 0)
		h = kiln_dropout(g, h, p, training, 7);
	kiln_output(g, "logits", kiln_linear(g, "fc2", h, 10, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	load_init(g, "mlp", dt);
	return g;
}

/* cnn: conv1 Conv2d(1, 4, 3, padding=1), bn1, ReLU, MaxPool2d(2), fc. */
static kiln_graph *cnn(kiln_dtype dt, bool training)
{
	kiln_graph *g = kiln_graph_new("cnn");
	kiln_graph_set_training(g, training);
	kiln_value x = kiln_input(g, "x", dt, 4, (int64_t[]){kiln_sym(g, "N"), 1, 8, 8});
	kiln_conv_opts c = {.kernel = {3, 3}, .pad = {1, 1}};
	kiln_value h = kiln_conv2d(g, "conv1", x, 4, &c, true);
	h = kiln_relu(g, kiln_batchnorm(g, "bn1", h, 0, 0));
	h = kiln_max_pool(g, h, &(kiln_conv_opts){.kernel = {2, 2}, .stride = {2, 2}});
	kiln_output(g, "logits", kiln_linear(g, "fc", kiln_flatten(g, h, 1), 10, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	load_init(g, "cnn", dt);
	return g;
}

static kiln_graph *model(const char *name, kiln_dtype dt, bool training)
{
	return strcmp(name, "cnn") == 0 ? cnn(dt, training) : mlp(dt, training, 0);
}

static kiln_trainer *trainer(const char *name, kiln_dtype dt, const kiln_train_opts *o)
{
	kiln_graph *m = model(name, dt, true), *e = model(name, dt, false);
	kiln_trainer *tr = NULL;
	kiln_error err;
	ck_assert_msg(kiln_trainer_new(m, e, o, &tr, &err) == KILN_OK, "%s", err.msg);
	kiln_graph_free(m), kiln_graph_free(e);
	return tr;
}

/* The data of one model in dtype dt. */
typedef struct data {
	kiln_tensor *x, *y;
} data;

static data load_data(const char *name, kiln_dtype dt)
{
	char xs[64], ys[64];
	snprintf(xs, sizeof xs, "%s_x.npy", name);
	snprintf(ys, sizeof ys, "%s_y.npy", name);
	return (data){as(npy(xs), dt), npy(ys)};
}

static void free_data(data d)
{
	kiln_tensor_free(d.x), kiln_tensor_free(d.y);
}

/* Micro-batch i of `per` rows (k micro-batches per fixture batch). */
static void step(kiln_trainer *tr, data d, int i, int k, double lr, double *loss)
{
	int64_t rows = d.x->shape[1] / k, b0 = (i % k) * rows;
	kiln_tensor x = view(d.x, i / k, b0, b0 + rows), y = view(d.y, i / k, b0, b0 + rows);
	kiln_error err;
	ck_assert_msg(kiln_trainer_step(tr, &x, &y, lr, loss, &err) == KILN_OK, "step %d: %s", i,
	              err.msg);
}

/* Runs `run` ("mlp_sgd", ...) and compares every loss with PyTorch's. */
static kiln_trainer *parity(const char *run, kiln_dtype dt, const kiln_train_opts *o,
                            const kiln_sched *sched, double lr, double tol)
{
	char name[16], file[96];
	snprintf(name, sizeof name, "%.3s", run);
	snprintf(file, sizeof file, "%s_loss_%s.npy", run, kiln_dtype_name(dt));
	kiln_tensor *want = npy(file);
	int k = o->accum_steps > 1 ? o->accum_steps : 1;
	ck_assert_int_eq(kiln_tensor_numel(want), STEPS * k);
	data d = load_data(name, dt);
	kiln_trainer *tr = trainer(name, dt, o);
	for (int i = 0; i < STEPS * k; i++) {
		double loss;
		step(tr, d, i, k, sched ? kiln_sched_lr(sched, kiln_trainer_steps(tr)) : lr, &loss);
		double w = ((double *)want->data)[i];
		ck_assert_msg(fabs(loss - w) <= tol * fabs(w), "%s %s step %d: kiln %.17g, torch "
		              "%.17g (rel %.3g)", run, kiln_dtype_name(dt), i, loss, w,
		              fabs(loss - w) / fabs(w));
	}
	ck_assert_int_eq(kiln_trainer_steps(tr), STEPS);
	free_data(d);
	kiln_tensor_free(want);
	return tr;
}

static void parity_free(const char *run, kiln_dtype dt, const kiln_train_opts *o,
                        const kiln_sched *sched, double lr, double tol)
{
	kiln_trainer_free(parity(run, dt, o, sched, lr, tol));
}

static const kiln_train_opts SGD = {.optim = KILN_OPT_SGD, .momentum = 0.9,
                                    .weight_decay = 5e-4, .loss = KILN_LOSS_CROSS_ENTROPY};
static const kiln_train_opts NESTEROV = {.optim = KILN_OPT_SGD, .momentum = 0.9,
                                         .nesterov = true, .weight_decay = 5e-4,
                                         .loss = KILN_LOSS_CROSS_ENTROPY};
static const kiln_train_opts ADAMW = {.optim = KILN_OPT_ADAMW, .weight_decay = 0.01,
                                      .loss = KILN_LOSS_CROSS_ENTROPY};

/* ---- f64 parity: the semantics ------------------------------------------ */

START_TEST(mlp_sgd_momentum_wd_f64_matches_torch)
{
	parity_free("mlp_sgd", KILN_F64, &SGD, NULL, 0.1, 1e-9);
}
END_TEST

START_TEST(mlp_nesterov_f64_matches_torch)
{
	parity_free("mlp_nesterov", KILN_F64, &NESTEROV, NULL, 0.1, 1e-9);
}
END_TEST

START_TEST(mlp_adamw_f64_matches_torch)
{
	parity_free("mlp_adamw", KILN_F64, &ADAMW, NULL, 0.01, 1e-9);
}
END_TEST

START_TEST(mlp_adam_l2_f64_matches_torch)
{
	kiln_train_opts o = {.optim = KILN_OPT_ADAM, .weight_decay = 1e-3,
	                     .loss = KILN_LOSS_CROSS_ENTROPY};
	parity_free("mlp_adam", KILN_F64, &o, NULL, 0.01, 1e-9);
}
END_TEST

START_TEST(mlp_dampening_f64_matches_torch)
{
	kiln_train_opts o = {.optim = KILN_OPT_SGD, .momentum = 0.9, .dampening = 0.3,
	                     .loss = KILN_LOSS_CROSS_ENTROPY};
	parity_free("mlp_damp", KILN_F64, &o, NULL, 0.1, 1e-9);
}
END_TEST

START_TEST(mlp_clip_grad_norm_f64_matches_torch)
{
	kiln_train_opts o = {.optim = KILN_OPT_SGD, .momentum = 0.9, .clip_norm = 0.5,
	                     .loss = KILN_LOSS_CROSS_ENTROPY};
	parity_free("mlp_clip", KILN_F64, &o, NULL, 0.5, 1e-9);
}
END_TEST

START_TEST(mlp_accumulate_two_micro_batches_f64_matches_torch)
{
	kiln_train_opts o = SGD;
	o.accum_steps = 2, o.clip_norm = 1.0;
	parity_free("mlp_accum", KILN_F64, &o, NULL, 0.1, 1e-9);
}
END_TEST

START_TEST(mlp_cosine_schedule_f64_matches_torch)
{
	kiln_train_opts o = {.optim = KILN_OPT_SGD, .momentum = 0.9,
	                     .loss = KILN_LOSS_CROSS_ENTROPY};
	kiln_sched s = {.kind = KILN_SCHED_COSINE, .base_lr = 0.1, .t_max = 20};
	parity_free("mlp_cos", KILN_F64, &o, &s, 0, 1e-9);
}
END_TEST

/* The final parameters and BatchNorm buffers (unbiased running_var,
 * num_batches_tracked) equal PyTorch's state_dict after 20 steps, except
 * the tensors named in skip[] (NULL-terminated). */
static void final_state(kiln_trainer *tr, const char *run, const char *const *skip)
{
	char path[512];
	snprintf(path, sizeof path, DIR "%s_final_f64.safetensors", run);
	kiln_tensor_set *want = NULL, *got = kiln_trainer_state(tr);
	kiln_error err;
	ck_assert_msg(kiln_safetensors_read(path, &want, &err) == KILN_OK, "%s", err.msg);
	for (int i = 0; i < want->count; i++) {
		const kiln_tensor *w = want->items[i].tensor;
		bool skipped = false;
		for (int k = 0; skip[k]; k++)
			skipped = skipped || !strcmp(want->items[i].name, skip[k]);
		if (skipped)
			continue;
		const kiln_tensor *g = kiln_tensor_set_get(got, want->items[i].name);
		ck_assert_msg(g != NULL, "no %s", want->items[i].name);
		ck_assert_int_eq(g->dtype, w->dtype);
		ck_assert_int_eq(kiln_tensor_numel(g), kiln_tensor_numel(w));
		for (int64_t j = 0; j < kiln_tensor_numel(w); j++) {
			double a = w->dtype == KILN_I64 ? (double)((int64_t *)g->data)[j]
			                                : ((double *)g->data)[j];
			double b = w->dtype == KILN_I64 ? (double)((int64_t *)w->data)[j]
			                                : ((double *)w->data)[j];
			ck_assert_msg(fabs(a - b) <= 1e-8 * fabs(b) + 1e-12, "%s[%lld]: kiln %.17g, "
			              "torch %.17g", want->items[i].name, (long long)j, a, b);
		}
	}
	kiln_tensor_set_free(want), kiln_tensor_set_free(got);
}

START_TEST(cnn_sgd_f64_matches_torch_with_bn_buffers)
{
	kiln_trainer *tr = parity("cnn_sgd", KILN_F64, &SGD, NULL, 0.1, 1e-9);
	final_state(tr, "cnn_sgd", (const char *[]){NULL});
	kiln_trainer_free(tr);
}
END_TEST

START_TEST(cnn_nesterov_f64_matches_torch)
{
	parity_free("cnn_nesterov", KILN_F64, &NESTEROV, NULL, 0.1, 1e-9);
}
END_TEST

START_TEST(cnn_adamw_f64_matches_torch_with_bn_buffers)
{
	kiln_trainer *tr = parity("cnn_adamw", KILN_F64, &ADAMW, NULL, 0.01, 1e-9);
	/* BatchNorm cancels conv1.bias, so its gradient is rounding noise that
	 * Adam scales up to full steps, in PyTorch as here: the bias and the
	 * running mean that sees it follow the noise, the loss does not */
	final_state(tr, "cnn_adamw", (const char *[]){"conv1.bias", "bn1.running_mean", NULL});
	kiln_trainer_free(tr);
}
END_TEST

/* ---- f32 parity ------------------------------------------------------------ */

START_TEST(mlp_sgd_f32_within_1e4)
{
	parity_free("mlp_sgd", KILN_F32, &SGD, NULL, 0.1, 1e-4);
}
END_TEST

START_TEST(mlp_adamw_f32_within_1e4)
{
	parity_free("mlp_adamw", KILN_F32, &ADAMW, NULL, 0.01, 1e-4);
}
END_TEST

START_TEST(cnn_sgd_f32_within_1e4)
{
	parity_free("cnn_sgd", KILN_F32, &SGD, NULL, 0.1, 1e-4);
}
END_TEST

/* ---- the step graph's contract ---------------------------------------------- */

static bool has_output(const kiln_graph *g, const char *name)
{
	for (int i = 0; i < kiln_graph_num_outputs(g); i++)
		if (!strcmp(kiln_value_name(g, kiln_graph_output(g, i)), name))
			return true;
	return false;
}

START_TEST(step_graph_has_documented_inputs_and_outputs)
{
	kiln_graph *m = cnn(KILN_F32, true), *s = NULL;
	kiln_train_opts o = ADAMW;
	o.accum_steps = 4;
	kiln_error err;
	ck_assert_msg(kiln_build_train_step(m, &o, &s, &err) == KILN_OK, "%s", err.msg);
	const char *in[] = {"x", "target", "lr", "step", "apply"};
	ck_assert_int_eq(kiln_graph_num_inputs(s), 5);
	for (int i = 0; i < 5; i++)
		ck_assert_str_eq(kiln_value_name(s, kiln_graph_input(s, i)), in[i]);
	ck_assert_int_eq(kiln_value_dtype(s, kiln_graph_input(s, 1)), KILN_I64);
	ck_assert_int_eq(kiln_value_dtype(s, kiln_graph_input(s, 2)), KILN_F64);
	ck_assert_int_eq(kiln_value_dtype(s, kiln_graph_input(s, 4)), KILN_BOOL);
	ck_assert_str_eq(kiln_value_name(s, kiln_graph_output(s, 0)), "loss");
	ck_assert(!has_output(s, "logits"));
	const char *out[] = {"bn1.running_mean.next", "bn1.running_var.next",
	                     "bn1.num_batches_tracked.next", "conv1.weight.next",
	                     "conv1.weight.exp_avg.next", "fc.bias.exp_avg_sq.next",
	                     "fc.bias.grad_accum.next"};
	for (int i = 0; i < 7; i++)
		ck_assert_msg(has_output(s, out[i]), "no output %s", out[i]);
	ck_assert(kiln_graph_find_param(s, "conv1.weight.exp_avg") != KILN_NONE);
	ck_assert_int_eq(kiln_graph_verify(s, &err), KILN_OK);
	kiln_graph_free(m), kiln_graph_free(s);
}
END_TEST

START_TEST(build_rejects_amsgrad_with_message)
{
	kiln_graph *m = mlp(KILN_F32, true, 0), *s = NULL;
	kiln_train_opts o = ADAMW;
	o.amsgrad = true;
	kiln_error err;
	ck_assert_int_eq(kiln_build_train_step(m, &o, &s, &err), KILN_EUNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(err.msg, "amsgrad is not supported"));
	ck_assert_ptr_null(s);
	kiln_graph_free(m);
}
END_TEST

START_TEST(build_rejects_nesterov_without_momentum)
{
	kiln_graph *m = mlp(KILN_F32, true, 0), *s = NULL;
	kiln_train_opts o = {.optim = KILN_OPT_SGD, .nesterov = true,
	                     .loss = KILN_LOSS_CROSS_ENTROPY};
	kiln_error err;
	ck_assert_int_eq(kiln_build_train_step(m, &o, &s, &err), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "Nesterov momentum requires a momentum"));
	kiln_graph_free(m);
}
END_TEST

START_TEST(build_rejects_missing_loss_output)
{
	kiln_graph *m = mlp(KILN_F32, true, 0), *s = NULL;
	kiln_train_opts o = {.optim = KILN_OPT_SGD}; /* KILN_LOSS_OUTPUT, but no "loss" */
	kiln_error err;
	ck_assert_int_eq(kiln_build_train_step(m, &o, &s, &err), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "has no output named 'loss'"));
	kiln_graph_free(m);
}
END_TEST

/* ---- train-mode BatchNorm, forward only ---------------------------------------- */

/* running_var.next uses the unbiased batch variance and PyTorch's momentum. */
START_TEST(batchnorm_train_updates_buffers_like_torch)
{
	kiln_graph *g = kiln_graph_new("bn");
	kiln_graph_set_training(g, true);
	kiln_value x = kiln_input(g, "x", KILN_F64, 4, (int64_t[]){kiln_sym(g, "N"), 2, 2, 2});
	kiln_output(g, "y", kiln_batchnorm(g, "bn", x, 1e-5, 0.25));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	ck_assert_int_eq(kiln_graph_num_outputs(g), 4);
	kiln_tensor *in = kiln_tensor_new(KILN_F64, 4, (int64_t[]){3, 2, 2, 2}), *out[4];
	double *xv = in->data;
	for (int i = 0; i < 24; i++)
		xv[i] = sin(i * 1.7) * 3 + (i / 4 % 2);
	kiln_error err;
	ck_assert_msg(kiln_graph_run(g, &in, 1, out, 4, &err) == KILN_OK, "%s", err.msg);
	for (int c = 0; c < 2; c++) {
		double s = 0, s2 = 0;
		for (int n = 0; n < 3; n++)
			for (int k = 0; k < 4; k++)
				s += xv[(n * 2 + c) * 4 + k];
		double mean = s / 12;
		for (int n = 0; n < 3; n++)
			for (int k = 0; k < 4; k++)
				s2 += pow(xv[(n * 2 + c) * 4 + k] - mean, 2);
		double y0 = (xv[c * 4] - mean) / sqrt(s2 / 12 + 1e-5);
		/* the buffer updates come first: the layer adds them as it is traced */
		ck_assert_double_eq_tol(((double *)out[0]->data)[c], 0.25 * mean, 1e-12);
		ck_assert_double_eq_tol(((double *)out[1]->data)[c], 0.75 + 0.25 * s2 / 11, 1e-12);
		ck_assert_double_eq_tol(((double *)out[3]->data)[c * 4], y0, 1e-12);
	}
	ck_assert_int_eq(*(int64_t *)out[2]->data, 1);
	for (int i = 0; i < 4; i++)
		kiln_tensor_free(out[i]);
	kiln_tensor_free(in);
	kiln_graph_free(g);
}
END_TEST

/* ---- checkpoints ------------------------------------------------------------------ */

static void mktmp(void)
{
	tmp_make("kiln_train");
}

static void rmtmp(void)
{
	tmp_remove();
}

/* Uninterrupted 12 steps vs 6, save, a fresh trainer loads, 6 more: the
 * losses agree exactly (dropout included, through the micro-batch count). */
static void resume_exactly(const char *name, const kiln_train_opts *o, double p)
{
	data d = load_data(name, KILN_F32);
	double whole[12], part[12];
	kiln_trainer *a = trainer(name, KILN_F32, o);
	if (p > 0) { /* the MLP with dropout instead */
		kiln_trainer_free(a);
		kiln_graph *m = mlp(KILN_F32, true, p);
		kiln_error err;
		ck_assert_msg(kiln_trainer_new(m, NULL, o, &a, &err) == KILN_OK, "%s", err.msg);
		kiln_graph_free(m);
		char *kir = kiln_graph_to_kir(kiln_trainer_graph(a));
		ck_assert_ptr_nonnull(strstr(kir, "dropout"));
		free(kir);
	}
	kiln_trainer *b = NULL;
	kiln_error err;
	for (int i = 0; i < 12; i++)
		step(a, d, i, 1, 0.05, &whole[i]);
	kiln_trainer_free(a);
	kiln_graph *m = p > 0 ? mlp(KILN_F32, true, p) : model(name, KILN_F32, true);
	for (int round = 0; round < 2; round++) {
		ck_assert_int_eq(kiln_trainer_new(m, NULL, o, &b, &err), KILN_OK);
		if (round == 1)
			ck_assert_msg(kiln_trainer_load(b, tpath("ck.safetensors"), &err) == KILN_OK,
			              "%s", err.msg);
		for (int i = 6 * round; i < 6 * round + 6; i++)
			step(b, d, i, 1, 0.05, &part[i]);
		if (round == 0)
			ck_assert_msg(kiln_trainer_save(b, tpath("ck.safetensors"), &err) == KILN_OK,
			              "%s", err.msg);
		kiln_trainer_free(b);
	}
	for (int i = 0; i < 12; i++)
		ck_assert_msg(whole[i] == part[i], "step %d: %.17g vs %.17g after resume", i,
		              whole[i], part[i]);
	kiln_graph_free(m);
	free_data(d);
}

START_TEST(cnn_adamw_resume_reproduces_losses_exactly)
{
	resume_exactly("cnn", &ADAMW, 0);
}
END_TEST

START_TEST(mlp_dropout_resume_reproduces_losses_exactly)
{
	resume_exactly("mlp", &SGD, 0.3);
}
END_TEST

static long fsize(const char *path)
{
	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fclose(f);
	return n;
}

/* Steps 0..2 saved to good, 3..4 to bad; bad is damaged by how; loading it
 * fails with msg and leaves the trainer as it was; good still loads. */
static void refuse(void (*how)(const char *path), const char *msg)
{
	data d = load_data("cnn", KILN_F32);
	kiln_trainer *tr = trainer("cnn", KILN_F32, &SGD);
	kiln_error err;
	for (int i = 0; i < 5; i++) {
		step(tr, d, i, 1, 0.1, NULL);
		if (i == 2 || i == 4)
			ck_assert(!kiln_trainer_save(tr, tpath(i == 2 ? "good" : "bad"), &err));
	}
	how(tpath("bad"));
	kiln_tensor_set *before = kiln_trainer_state(tr);
	ck_assert_int_ne(kiln_trainer_load(tr, tpath("bad"), &err), KILN_OK);
	ck_assert_msg(strstr(err.msg, msg) != NULL, "message: %s", err.msg);
	kiln_tensor_set *after = kiln_trainer_state(tr);
	ck_assert_int_eq(kiln_trainer_steps(tr), 5);
	for (int i = 0; i < before->count; i++) {
		const kiln_tensor *a = before->items[i].tensor;
		ck_assert(!memcmp(a->data, kiln_tensor_set_get(after, before->items[i].name)->data,
		                  kiln_tensor_nbytes(a)));
	}
	ck_assert_msg(kiln_trainer_load(tr, tpath("good"), &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(kiln_trainer_steps(tr), 3);
	kiln_tensor_set_free(before), kiln_tensor_set_free(after);
	kiln_trainer_free(tr);
	free_data(d);
}

static void truncate_half(const char *path)
{
	ck_assert_int_eq(truncate(path, fsize(path) / 2), 0);
}

static void flip_last_byte(const char *path)
{
	FILE *f = fopen(path, "r+b");
	ck_assert_ptr_nonnull(f);
	fseek(f, -3, SEEK_END);
	int c = fgetc(f);
	fseek(f, -3, SEEK_END);
	fputc(c ^ 0x10, f);
	fclose(f);
}

START_TEST(truncated_checkpoint_is_refused_and_previous_intact)
{
	mktmp();
	refuse(truncate_half, "checkpoint refused");
	rmtmp();
}
END_TEST

START_TEST(corrupt_checkpoint_is_refused_by_checksum)
{
	mktmp();
	refuse(flip_last_byte, "checksum mismatch, the file is corrupt");
	rmtmp();
}
END_TEST

/* Counters edited with the checksum recomputed: refused with the field and
 * its value before anything can overflow (INT64_MAX used to load, and the
 * next step computed steps + 1). */
static void step_max(const char *path)
{
	ckpt_set_i64(path, "__step__", 0, INT64_MAX);
}

static void micro_max(const char *path)
{
	ckpt_set_i64(path, "__micro__", 0, INT64_MAX);
}

static void step_negative(const char *path)
{
	ckpt_set_i64(path, "__step__", 0, -5);
}

static void step_past_micro(const char *path)
{
	ckpt_set_i64(path, "__step__", 0, 9);
}

START_TEST(edited_counters_are_refused_naming_field_and_value)
{
	mktmp();
	refuse(step_max, "__step__ is 9223372036854775807, outside [0, 2^53]");
	refuse(micro_max, "__micro__ is 9223372036854775807, outside [0, 2^53]");
	refuse(step_negative, "__step__ is -5, outside [0, 2^53]");
	refuse(step_past_micro, "__step__ is 9 but __micro__ only 5");
	rmtmp();
}
END_TEST

START_TEST(checkpoint_of_another_optimizer_is_refused)
{
	mktmp();
	kiln_trainer *a = trainer("mlp", KILN_F32, &SGD), *b = trainer("mlp", KILN_F32, &ADAMW);
	kiln_error err;
	ck_assert(!kiln_trainer_save(a, tpath("sgd"), &err));
	ck_assert_int_eq(kiln_trainer_load(b, tpath("sgd"), &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "exp_avg' is missing") != NULL, "message: %s", err.msg);
	kiln_trainer_free(a), kiln_trainer_free(b);
	rmtmp();
}
END_TEST

/* ---- eval ----------------------------------------------------------------------- */

START_TEST(eval_uses_the_trained_parameters)
{
	data d = load_data("cnn", KILN_F32);
	kiln_trainer *tr = trainer("cnn", KILN_F32, &SGD);
	kiln_tensor x = view(d.x, 0, 0, 16), *before, *after;
	kiln_error err;
	ck_assert_msg(kiln_trainer_eval(tr, &x, &before, &err) == KILN_OK, "%s", err.msg);
	for (int i = 0; i < 5; i++)
		step(tr, d, i, 1, 0.1, NULL);
	ck_assert(!kiln_trainer_eval(tr, &x, &after, &err));
	ck_assert_int_eq(after->rank, 2);
	ck_assert_int_eq(after->shape[1], 10);
	ck_assert(memcmp(before->data, after->data, kiln_tensor_nbytes(after)) != 0);
	/* eval mode: the same input gives the same output, the state unchanged */
	kiln_tensor *again;
	ck_assert(!kiln_trainer_eval(tr, &x, &again, &err));
	ck_assert(!memcmp(again->data, after->data, kiln_tensor_nbytes(after)));
	kiln_tensor_free(before), kiln_tensor_free(after), kiln_tensor_free(again);
	kiln_trainer_free(tr);
	free_data(d);
}
END_TEST

static Suite *train_suite(void)
{
	Suite *s = suite_create("train");
	TCase *tc = tcase_create("torch_parity_f64");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, mlp_sgd_momentum_wd_f64_matches_torch);
	tcase_add_test(tc, mlp_nesterov_f64_matches_torch);
	tcase_add_test(tc, mlp_adamw_f64_matches_torch);
	tcase_add_test(tc, mlp_adam_l2_f64_matches_torch);
	tcase_add_test(tc, mlp_dampening_f64_matches_torch);
	tcase_add_test(tc, mlp_clip_grad_norm_f64_matches_torch);
	tcase_add_test(tc, mlp_accumulate_two_micro_batches_f64_matches_torch);
	tcase_add_test(tc, mlp_cosine_schedule_f64_matches_torch);
	tcase_add_test(tc, cnn_sgd_f64_matches_torch_with_bn_buffers);
	tcase_add_test(tc, cnn_nesterov_f64_matches_torch);
	tcase_add_test(tc, cnn_adamw_f64_matches_torch_with_bn_buffers);
	suite_add_tcase(s, tc);
	tc = tcase_create("torch_parity_f32");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, mlp_sgd_f32_within_1e4);
	tcase_add_test(tc, mlp_adamw_f32_within_1e4);
	tcase_add_test(tc, cnn_sgd_f32_within_1e4);
	suite_add_tcase(s, tc);
	tc = tcase_create("step_graph");
	tcase_add_test(tc, step_graph_has_documented_inputs_and_outputs);
	tcase_add_test(tc, build_rejects_amsgrad_with_message);
	tcase_add_test(tc, build_rejects_nesterov_without_momentum);
	tcase_add_test(tc, build_rejects_missing_loss_output);
	tcase_add_test(tc, batchnorm_train_updates_buffers_like_torch);
	suite_add_tcase(s, tc);
	tc = tcase_create("checkpoints");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, cnn_adamw_resume_reproduces_losses_exactly);
	tcase_add_test(tc, mlp_dropout_resume_reproduces_losses_exactly);
	tcase_add_test(tc, truncated_checkpoint_is_refused_and_previous_intact);
	tcase_add_test(tc, corrupt_checkpoint_is_refused_by_checksum);
	tcase_add_test(tc, checkpoint_of_another_optimizer_is_refused);
	tcase_add_test(tc, edited_counters_are_refused_naming_field_and_value);
	tcase_add_test(tc, eval_uses_the_trained_parameters);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(train_suite)
