/*
 * test_torch_trainmode.c: PyTorch models exported in training mode
 * (torch.onnx.export(..., training=torch.onnx.TrainingMode.TRAINING,
 * do_constant_folding=False)) train in kiln as they train in PyTorch.
 *
 * tests/train/torch_trainmode.py (Debian's /usr/bin/python3 with torch and
 * onnx) writes the exports and PyTorch's run into a scratch folder first;
 * without torch the whole test reports itself skipped (77).  The CNN is
 * Conv-BatchNorm(training_mode=1)-ReLU-Dropout(p=0)-Linear: 6 SGD steps
 * (momentum 0.9) on fixed batches through the interpreter trainer and
 * through a compiled training library must give PyTorch's float32 losses
 * within 1e-4 relative, and BatchNorm's running_mean and running_var after
 * them (PyTorch's momentum and unbiased variance, not ONNX's) within 1e-4;
 * the opset-13 export (BatchNormalization with five outputs) the same.  The
 * trained model exports as an inference graph that gives PyTorch's eval
 * output (and ONNX Runtime's, when .venv has it).  A Dropout(p=0.5) model
 * drops in training (loss at lr 0 differs from the eval loss, and between
 * steps) and not in eval (same output twice), with the same masks
 * compiled.  `kiln train` on the export matches PyTorch's full-batch run
 * from its CSV, and says how to export for training when given an eval-mode
 * export with neither BatchNorm nor Dropout.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "so_util.h"

#define STEPS 6
#define BATCH 16
#define EPOCHS 4
#define TOL 1e-4

static char dir[64]; /* what torch_trainmode.py wrote */

static const char *path(const char *name)
{
	static char bufs[4][256];
	static int k;
	char *b = bufs[k++ % 4];
	snprintf(b, 256, "%s/%s", dir, name);
	return b;
}

static kiln_tensor *npy(const char *name)
{
	kiln_tensor *t = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_npy_read(path(name), &t, &err) == KILN_OK, "%s", err.msg);
	return t;
}

/* Batch s of a stacked [STEPS, B, ...] tensor, as a view. */
static kiln_tensor view(const kiln_tensor *t, int s)
{
	kiln_tensor v = {t->dtype, t->rank - 1, {0}, NULL};
	memcpy(v.shape, t->shape + 1, (size_t)v.rank * sizeof v.shape[0]);
	v.data = (char *)t->data + s * (kiln_tensor_nbytes(t) / t->shape[0]);
	return v;
}

static const kiln_train_opts SGD = {.optim = KILN_OPT_SGD, .momentum = 0.9,
                                    .loss = KILN_LOSS_CROSS_ENTROPY};

/* The file's inference model (changed: the training-mode nodes it had) and
 * the train-mode graph derived from it. */
static kiln_graph *load(const char *file, int changed, kiln_graph **train)
{
	kiln_graph *g = NULL, *inf = NULL;
	kiln_error err = {0};
	int n = -1;
	ck_assert_msg(kiln_onnx_import(path(file), &g, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_inference_graph_from_train(g, &inf, &n, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(n, changed);
	char *kir = kiln_graph_to_kir(inf);
	ck_assert_msg(kir && !strstr(kir, "training_mode=1"), "%s", kir);
	free(kir);
	kiln_graph_free(g);
	ck_assert_msg(kiln_train_graph_from_inference(inf, 0, train, &err) == KILN_OK, "%s",
	              err.msg);
	return inf;
}

/* Every element of got within tol of want, relative to max(|want|, floor). */
static void assert_close(const char *what, const kiln_tensor *got, const kiln_tensor *want,
                         double tol, double floor)
{
	ck_assert_msg(got && kiln_tensor_numel(got) == kiln_tensor_numel(want), "%s: size", what);
	double worst = 0;
	for (int64_t i = 0; i < kiln_tensor_numel(want); i++) {
		double a = kiln_tensor_get(got, i), b = kiln_tensor_get(want, i);
		double rel = fabs(a - b) / fmax(fabs(b), floor);
		worst = fmax(worst, rel);
		ck_assert_msg(rel <= tol, "%s[%lld]: kiln %.9g, torch %.9g (rel %.3g)", what,
		              (long long)i, a, b, rel);
	}
	printf("%s: worst relative difference %.3g\n", what, worst);
}

/* One step's loss within TOL relative of PyTorch's loss.npy[s]. */
static void assert_loss(const char *what, int s, double got, const kiln_tensor *want, double *worst)
{
	double w = ((double *)want->data)[s], rel = fabs(got - w) / fabs(w);
	*worst = fmax(*worst, rel);
	ck_assert_msg(rel <= TOL, "%s step %d: kiln %.9g, torch %.9g (rel %.3g)", what, s, got, w,
	              rel);
}

static void assert_running_stats(const char *what, const kiln_tensor_set *st)
{
	char name[128];
	kiln_tensor *rm = npy("running_mean.npy"), *rv = npy("running_var.npy");
	snprintf(name, sizeof name, "%s bn.running_mean", what);
	assert_close(name, kiln_tensor_set_get(st, "bn.running_mean"), rm, TOL, 1e-2);
	snprintf(name, sizeof name, "%s bn.running_var", what);
	assert_close(name, kiln_tensor_set_get(st, "bn.running_var"), rv, TOL, 1e-2);
	kiln_tensor_free(rm), kiln_tensor_free(rv);
}

/* ---- the interpreter trainer ----------------------------------------------------- */

static void interp_parity(const char *file)
{
	kiln_graph *tg = NULL, *inf = load(file, 2, &tg);
	kiln_trainer *tr = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_trainer_new(tg, inf, &SGD, &tr, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor *x = npy("x.npy"), *y = npy("y.npy"), *want = npy("loss.npy");
	double worst = 0;
	for (int s = 0; s < STEPS; s++) {
		kiln_tensor xs = view(x, s), ys = view(y, s);
		double loss = NAN;
		ck_assert_msg(kiln_trainer_step(tr, &xs, &ys, 0.1, &loss, &err) == KILN_OK, "%s",
		              err.msg);
		assert_loss(file, s, loss, want, &worst);
	}
	printf("%s, interpreter: worst loss difference %.3g\n", file, worst);
	kiln_tensor_set *st = kiln_trainer_state(tr);
	assert_running_stats(file, st);
	kiln_tensor_set_free(st);

	/* evaluation: running stats, no dropout, as PyTorch's eval() */
	kiln_tensor *ex = npy("eval_x.npy"), *el = npy("eval_logits.npy"), *out = NULL;
	ck_assert_msg(kiln_trainer_eval(tr, ex, &out, &err) == KILN_OK, "%s", err.msg);
	assert_close("eval logits", out, el, TOL, 1);
	kiln_tensor_free(out);

	/* the trained inference model, exported and imported again */
	ck_assert_msg(kiln_trainer_save(tr, path("ckpt.safetensors"), &err) == KILN_OK, "%s",
	              err.msg);
	ck_assert_msg(kiln_graph_load_trained(inf, path("ckpt.safetensors"), &err) == KILN_OK,
	              "%s", err.msg);
	ck_assert_msg(kiln_onnx_export(inf, path("trained.onnx"), &err) == KILN_OK, "%s", err.msg);
	kiln_graph *back = NULL;
	ck_assert_msg(kiln_onnx_import(path("trained.onnx"), &back, &err) == KILN_OK, "%s", err.msg);
	char *kir = kiln_graph_to_kir(back);
	ck_assert_msg(kir && strstr(kir, "batch_norm") && !strstr(kir, "training_mode=1"), "%s", kir);
	free(kir);
	ck_assert_msg(kiln_graph_run(back, &ex, 1, &out, 1, &err) == KILN_OK, "%s", err.msg);
	assert_close("exported model's logits", out, el, TOL, 1);
	ck_assert_msg(kiln_npy_write(path("kiln_out.npy"), out, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor_free(out);
	kiln_graph_free(back);
	const char *py = KILN_SRC "/.venv/bin/python";
	if (access(py, X_OK) != 0) {
		printf("ONNX Runtime check skipped: no %s (scripts/setup-venv.sh)\n", py);
	} else {
		char cmd[2048], res[8192];
		snprintf(cmd, sizeof cmd, "'%s' '%s/tests/train/check_ort.py' '%s' '%s' '%s'", py,
		         KILN_SRC, path("trained.onnx"), path("eval_x.npy"), path("kiln_out.npy"));
		int rc = sh(cmd, res, sizeof res);
		ck_assert_msg(rc == 0 || rc == 77, "%s\n%s", cmd, res);
		printf("%s", res);
	}
	kiln_tensor_free(ex), kiln_tensor_free(el);
	kiln_tensor_free(x), kiln_tensor_free(y), kiln_tensor_free(want);
	kiln_trainer_free(tr);
	kiln_graph_free(tg), kiln_graph_free(inf);
}

START_TEST(interpreter_trains_the_opset14_export_as_pytorch)
{
	interp_parity("cnn.onnx");
}
END_TEST

START_TEST(interpreter_trains_the_opset13_export_as_pytorch)
{
	interp_parity("cnn13.onnx");
}
END_TEST

/* ---- the compiled training library ---------------------------------------------- */

/* Trains the library so 6 steps against PyTorch and saves its checkpoint
 * as ckpt. */
static void compiled_parity(const char *so, const char *what, const char *ckpt)
{
	kiln_error err = {0};
	kiln_model *m = NULL;
	ck_assert_msg(kiln_load(so, &m, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor *x = npy("x.npy"), *y = npy("y.npy"), *want = npy("loss.npy");
	double worst = 0;
	for (int s = 0; s < STEPS; s++) {
		kiln_tensor xs = view(x, s), ys = view(y, s);
		double loss = NAN;
		ck_assert_msg(kiln_model_train_step(m, &xs, &ys, 0.1, &loss, &err) == KILN_OK, "%s",
		              err.msg);
		assert_loss(what, s, loss, want, &worst);
	}
	printf("%s: worst loss difference %.3g\n", what, worst);
	kiln_tensor_set *st = kiln_model_state(m);
	assert_running_stats(what, st);
	kiln_tensor_set_free(st);
	kiln_tensor *ex = npy("eval_x.npy"), *el = npy("eval_logits.npy"), *out = NULL;
	ck_assert_msg(kiln_model_run(m, &ex, 1, &out, 1, &err) == KILN_OK, "%s", err.msg);
	assert_close("compiled eval logits", out, el, TOL, 1);
	ck_assert_msg(kiln_model_save(m, path(ckpt), &err) == KILN_OK, "%s", err.msg);
	kiln_tensor_free(out), kiln_tensor_free(ex), kiln_tensor_free(el);
	kiln_tensor_free(x), kiln_tensor_free(y), kiln_tensor_free(want);
	kiln_model_free(m);
}

static int kiln(const char *args);
static char *slurp(const char *p);

START_TEST(compiled_step_trains_the_export_as_pytorch)
{
	kiln_graph *tg = NULL, *inf = load("cnn.onnx", 2, &tg);
	kiln_error err = {0};
	char so[1100];
	ck_assert_int_lt(snprintf(so, sizeof so, "%s/cnn_step.so", so_dir("torch_trainmode_test")),
	                 (int)sizeof so);
	ck_assert_msg(kiln_compile_train(tg, inf, &SGD, BATCH, so,
	                                 &(kiln_compile_opts){.name = "cnn"}, &err) == KILN_OK,
	              "%s", err.msg);
	compiled_parity(so, "cnn.onnx, compiled", "lib.safetensors");
	kiln_graph_free(tg), kiln_graph_free(inf);
}
END_TEST

/* `kiln compile --train` of the export, then `kiln export --weights`: the
 * trained inference model gives PyTorch's eval output. */
START_TEST(kiln_compile_train_and_export_weights)
{
	int rc = kiln("compile --train cnn.onnx --optimizer sgd --momentum 0.9 --batch 16 "
	              "-o cli_step.so");
	ck_assert_msg(rc == 0, "exit %d: %s", rc, slurp(path("err.txt")));
	compiled_parity(path("cli_step.so"), "kiln compile --train", "cli.safetensors");
	rc = kiln("export cnn.onnx --weights cli.safetensors -o cli_trained.onnx");
	ck_assert_msg(rc == 0, "exit %d: %s", rc, slurp(path("err.txt")));
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_onnx_import(path("cli_trained.onnx"), &g, &err) == KILN_OK, "%s",
	              err.msg);
	char *kir = kiln_graph_to_kir(g);
	ck_assert_msg(kir && strstr(kir, "batch_norm") && !strstr(kir, "training_mode=1"), "%s", kir);
	free(kir);
	kiln_tensor *ex = npy("eval_x.npy"), *el = npy("eval_logits.npy"), *out = NULL;
	ck_assert_msg(kiln_graph_run(g, &ex, 1, &out, 1, &err) == KILN_OK, "%s", err.msg);
	assert_close("kiln export --weights", out, el, TOL, 1);
	kiln_tensor_free(out), kiln_tensor_free(ex), kiln_tensor_free(el);
	kiln_graph_free(g);
}
END_TEST

/* ---- Dropout(p=0.5) --------------------------------------------------------------- */

/* Mean cross-entropy of logits [N,C] against y. */
static double cross_entropy(const kiln_tensor *logits, const kiln_tensor *y)
{
	int64_t n = logits->shape[0], c = logits->shape[1];
	double sum = 0;
	for (int64_t i = 0; i < n; i++) {
		double mx = -INFINITY, z = 0;
		for (int64_t k = 0; k < c; k++)
			mx = fmax(mx, kiln_tensor_get(logits, i * c + k));
		for (int64_t k = 0; k < c; k++)
			z += exp(kiln_tensor_get(logits, i * c + k) - mx);
		sum += mx + log(z) - kiln_tensor_get(logits, i * c + kiln_tensor_get_i64(y, i));
	}
	return sum / (double)n;
}

START_TEST(dropout_drops_in_training_only_interpreted_and_compiled)
{
	kiln_graph *tg = NULL, *inf = load("drop.onnx", 1, &tg);
	kiln_trainer *tr = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_trainer_new(tg, inf, &SGD, &tr, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor *x = npy("x.npy"), *y = npy("y.npy");
	kiln_tensor xb = view(x, 0), yb = view(y, 0);
	xb.rank = 2, xb.shape[1] = 64; /* [16,1,8,8] as [16,64] */
	kiln_tensor *e1 = NULL, *e2 = NULL;
	ck_assert_msg(kiln_trainer_eval(tr, &xb, &e1, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor *want = npy("drop_eval_logits.npy");
	assert_close("dropout model's eval logits", e1, want, TOL, 1); /* PyTorch's eval() */
	kiln_tensor_free(want);
	double eval_loss = cross_entropy(e1, &yb), train_loss[3];
	/* lr 0: the weights stay, so only the masks change the loss */
	for (int s = 0; s < 3; s++)
		ck_assert_msg(kiln_trainer_step(tr, &xb, &yb, 0, &train_loss[s], &err) == KILN_OK, "%s",
		              err.msg);
	ck_assert_msg(kiln_trainer_eval(tr, &xb, &e2, &err) == KILN_OK, "%s", err.msg);
	printf("dropout: eval loss %.9g, training losses %.9g %.9g %.9g\n", eval_loss,
	       train_loss[0], train_loss[1], train_loss[2]);
	ck_assert_msg(!memcmp(e1->data, e2->data, kiln_tensor_nbytes(e1)),
	              "eval output changed between runs");
	for (int s = 0; s < 3; s++)
		ck_assert_msg(fabs(train_loss[s] - eval_loss) > 1e-3 * eval_loss,
		              "step %d: training loss %.9g equals the eval loss: dropout is off", s,
		              train_loss[s]);
	ck_assert_msg(train_loss[0] != train_loss[1] && train_loss[1] != train_loss[2],
	              "the same mask twice");

	/* the compiled step draws the interpreter trainer's masks */
	char so[1100];
	ck_assert_int_lt(snprintf(so, sizeof so, "%s/drop_step.so", so_dir("torch_trainmode_test")),
	                 (int)sizeof so);
	ck_assert_msg(kiln_compile_train(tg, inf, &SGD, 0, so, &(kiln_compile_opts){.name = "drop"},
	                                 &err) == KILN_OK, "%s", err.msg);
	kiln_model *m = NULL;
	ck_assert_msg(kiln_load(so, &m, &err) == KILN_OK, "%s", err.msg);
	for (int s = 0; s < 3; s++) {
		double loss = NAN;
		ck_assert_msg(kiln_model_train_step(m, &xb, &yb, 0, &loss, &err) == KILN_OK, "%s",
		              err.msg);
		ck_assert_msg(fabs(loss - train_loss[s]) <= 1e-5 * fabs(train_loss[s]),
		              "compiled step %d: %.9g, interpreter %.9g", s, loss, train_loss[s]);
	}
	kiln_model_free(m);
	kiln_tensor_free(e1), kiln_tensor_free(e2);
	kiln_tensor_free(x), kiln_tensor_free(y);
	kiln_trainer_free(tr);
	kiln_graph_free(tg), kiln_graph_free(inf);
}
END_TEST

/* ---- kiln train ------------------------------------------------------------------- */

static char *slurp(const char *p)
{
	static char buf[4][1 << 15];
	static int k;
	char *b = buf[k++ % 4];
	FILE *f = fopen(p, "r");
	size_t n = f ? fread(b, 1, sizeof buf[0] - 1, f) : 0;
	b[n] = 0;
	if (f)
		fclose(f);
	return b;
}

static int kiln(const char *args)
{
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "cd '%s' && '%s/kiln' %s >out.txt 2>err.txt", dir, KILN_BIN, args);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* With --batch the whole set, each epoch is one step on every sample:
 * PyTorch's full-batch run (row order inside a batch only rounds). */
START_TEST(kiln_train_on_the_export_matches_pytorch)
{
	int rc = kiln("train cnn.onnx --x all_x.npy --y all_y.npy --batch 96 --epochs 4 "
	              "--optimizer sgd --lr 0.1 --momentum 0.9 --log log.csv --export cli.onnx "
	              "--val-x eval_x.npy --val-y eval_y.npy --val-out cli_out.npy");
	ck_assert_msg(rc == 0, "exit %d: %s", rc, slurp(path("err.txt")));
	ck_assert_msg(!strstr(slurp(path("err.txt")), "note:"), "%s", slurp(path("err.txt")));
	kiln_tensor *want = npy("full_loss.npy");
	char *csv = slurp(path("log.csv")), *line = strchr(csv, '\n');
	double worst = 0;
	for (int s = 0; s < EPOCHS; s++) {
		ck_assert_msg(line, "log.csv has %d rows: %s", s, csv);
		long step = 0, epoch = 0;
		double lr = 0, loss = NAN;
		ck_assert_int_eq(sscanf(line + 1, "%ld,%ld,%lf,%lf", &step, &epoch, &lr, &loss), 4);
		assert_loss("kiln train", s, loss, want, &worst);
		line = strchr(line + 1, '\n');
	}
	printf("kiln train: worst loss difference %.3g\n", worst);
	kiln_tensor_free(want);
	/* the export is the inference model */
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_onnx_import(path("cli.onnx"), &g, &err) == KILN_OK, "%s", err.msg);
	char *kir = kiln_graph_to_kir(g);
	ck_assert_msg(kir && strstr(kir, "batch_norm") && !strstr(kir, "training_mode=1"), "%s", kir);
	free(kir);
	kiln_tensor *ex = npy("eval_x.npy"), *mine = npy("cli_out.npy"), *out = NULL;
	ck_assert_msg(kiln_graph_run(g, &ex, 1, &out, 1, &err) == KILN_OK, "%s", err.msg);
	assert_close("kiln train export vs --val-out", out, mine, 1e-6, 1);
	kiln_tensor_free(ex), kiln_tensor_free(mine), kiln_tensor_free(out);
	kiln_graph_free(g);
}
END_TEST

/* An eval-mode export (BatchNorm folded, Dropout gone) gets one line on
 * how to export for training; --quiet silences it. */
START_TEST(kiln_train_says_how_to_export_for_training)
{
	const char *args = "train cnn_eval.onnx --x all_x.npy --y all_y.npy --batch 96 "
	                   "--epochs 1 --optimizer sgd --lr 0.1";
	ck_assert_int_eq(kiln(args), 0);
	const char *err = slurp(path("err.txt"));
	const char *want = "kiln: note: cnn_eval.onnx has no BatchNormalization and no Dropout; "
	                   "an eval-mode torch.onnx.export folds BatchNorm into the convolutions "
	                   "and drops Dropout, so to train with them export with "
	                   "training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False\n";
	ck_assert_msg(!strcmp(err, want), "stderr: %s", err);
	ck_assert_msg(!strstr(slurp(path("out.txt")), "note"), "%s", slurp(path("out.txt")));
	char quiet[512];
	snprintf(quiet, sizeof quiet, "%s --quiet", args);
	ck_assert_int_eq(kiln(quiet), 0);
	ck_assert_str_eq(slurp(path("err.txt")), "");
}
END_TEST

static Suite *torch_trainmode_suite(void)
{
	Suite *s = suite_create("torch_trainmode");
	TCase *tc = tcase_create("parity");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, interpreter_trains_the_opset14_export_as_pytorch);
	tcase_add_test(tc, interpreter_trains_the_opset13_export_as_pytorch);
	tcase_add_test(tc, compiled_step_trains_the_export_as_pytorch);
	tcase_add_test(tc, dropout_drops_in_training_only_interpreted_and_compiled);
	suite_add_tcase(s, tc);
	tc = tcase_create("cli");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, kiln_train_on_the_export_matches_pytorch);
	tcase_add_test(tc, kiln_compile_train_and_export_weights);
	tcase_add_test(tc, kiln_train_says_how_to_export_for_training);
	suite_add_tcase(s, tc);
	return s;
}

/* PyTorch's side runs once, before any test; no torch: skipped (77). */
int main(void)
{
	snprintf(dir, sizeof dir, "/tmp/kiln_trainmode_XXXXXX");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return EXIT_FAILURE;
	}
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/train/torch_trainmode.py' '%s'",
	         KILN_SRC, dir);
	int st = system(cmd), rc = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
	if (rc == 0) {
		SRunner *r = srunner_create(torch_trainmode_suite());
		srunner_run_all(r, CK_NORMAL);
		rc = srunner_ntests_failed(r) ? EXIT_FAILURE : EXIT_SUCCESS;
		srunner_free(r);
	} else if (rc != 77) {
		fprintf(stderr, "%s: exit status %d\n", cmd, rc);
		rc = EXIT_FAILURE;
	}
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (!getenv("KILN_KEEP") && system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return rc;
}
