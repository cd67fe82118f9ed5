/*
 * train_models.h: the parity models and data of the compiled-training
 * tests (test_compiled_train.c, test_cuda_emu_train.c), test_train.c's:
 * fixtures from tests/fixtures/train/ (make_train_fixtures.py), an MLP and
 * a Conv-BatchNorm CNN with fixed initial weights, 20 fixed batches of
 * sklearn's digits, and the SGD-momentum and AdamW options of the parity
 * runs.
 */
#ifndef KILN_TRAIN_MODELS_H
#define KILN_TRAIN_MODELS_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kiln/kiln.h"

#define DIR KILN_FIXTURES "/train/"

/* ---- fixtures and models (as test_train.c) ----------------------------------- */

static inline kiln_tensor *npy(const char *name)
{
	char path[512];
	snprintf(path, sizeof path, DIR "%s", name);
	kiln_tensor *t = NULL;
	kiln_error err;
	ck_assert_msg(kiln_npy_read(path, &t, &err) == KILN_OK, "%s", err.msg);
	return t;
}

static inline double npy_scalar(const char *name)
{
	kiln_tensor *t = npy(name);
	double v = ((double *)t->data)[0];
	kiln_tensor_free(t);
	return v;
}

/* Batch s of a stacked [STEPS, B, ...] tensor, as a view. */
static inline kiln_tensor view(const kiln_tensor *t, int s)
{
	kiln_tensor v = {t->dtype, t->rank - 1, {0}, NULL};
	memcpy(v.shape, t->shape + 1, (size_t)v.rank * sizeof v.shape[0]);
	v.data = (char *)t->data + s * (kiln_tensor_nbytes(t) / t->shape[0]);
	return v;
}

static inline void load_init(kiln_graph *g, const char *model)
{
	char path[512];
	snprintf(path, sizeof path, DIR "%s_init_f32.safetensors", model);
	kiln_tensor_set *s = NULL;
	kiln_error err;
	ck_assert_msg(kiln_safetensors_read(path, &s, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_graph_load_params(g, s, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor_set_free(s);
}

/* mlp: fc1 Linear(64, 32), ReLU, fc2 Linear(32, 10); p > 0 adds Dropout. */
static inline kiln_graph *mlp(bool training, double p)
{
	kiln_graph *g = kiln_graph_new("mlp");
	kiln_graph_set_training(g, training);
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 64});
	kiln_value h = kiln_relu(g, kiln_linear(g, "fc1", x, 32, true));
	if (p > 0)
		h = kiln_dropout(g, h, p, training, 7);
	kiln_output(g, "logits", kiln_linear(g, "fc2", h, 10, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	load_init(g, "mlp");
	return g;
}

/* cnn: conv1 Conv2d(1, 4, 3, padding=1), bn1, ReLU, MaxPool2d(2), fc. */
static inline kiln_graph *cnn(bool training)
{
	kiln_graph *g = kiln_graph_new("cnn");
	kiln_graph_set_training(g, training);
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, (int64_t[]){kiln_sym(g, "N"), 1, 8, 8});
	kiln_conv_opts c = {.kernel = {3, 3}, .pad = {1, 1}};
	kiln_value h = kiln_conv2d(g, "conv1", x, 4, &c, true);
	h = kiln_relu(g, kiln_batchnorm(g, "bn1", h, 0, 0));
	h = kiln_max_pool(g, h, &(kiln_conv_opts){.kernel = {2, 2}, .stride = {2, 2}});
	kiln_output(g, "logits", kiln_linear(g, "fc", kiln_flatten(g, h, 1), 10, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	load_init(g, "cnn");
	return g;
}

static inline kiln_graph *model(const char *name, bool training)
{
	return strcmp(name, "cnn") == 0 ? cnn(training) : mlp(training, 0);
}

static const kiln_train_opts SGD = {.optim = KILN_OPT_SGD, .momentum = 0.9,
                                    .weight_decay = 5e-4, .loss = KILN_LOSS_CROSS_ENTROPY};
static const kiln_train_opts ADAMW = {.optim = KILN_OPT_ADAMW, .weight_decay = 0.01,
                                      .loss = KILN_LOSS_CROSS_ENTROPY};

typedef struct data {
	kiln_tensor *x, *y;
} data;

static inline data load_data(const char *name)
{
	char xs[64], ys[64];
	snprintf(xs, sizeof xs, "%s_x.npy", name);
	snprintf(ys, sizeof ys, "%s_y.npy", name);
	return (data){npy(xs), npy(ys)};
}

static inline void free_data(data d)
{
	kiln_tensor_free(d.x), kiln_tensor_free(d.y);
}

/* One kiln_model_train_step on batch s of d; its loss. */
static inline double step(kiln_model *m, data d, int s, double lr)
{
	kiln_tensor x = view(d.x, s), y = view(d.y, s);
	double loss = NAN;
	kiln_error err;
	ck_assert_msg(kiln_model_train_step(m, &x, &y, lr, &loss, &err) == KILN_OK, "step %d: %s",
	              s, err.msg);
	return loss;
}

#endif /* KILN_TRAIN_MODELS_H */
