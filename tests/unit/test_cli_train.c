/*
 * test_cli_train.c: `kiln train` with every documented loss, run as a child
 * process on a small linear model saved as .kir.
 *
 * The regression losses (mse, l1, smooth_l1, bce_with_logits) are means
 * over the model's symbolic batch, whose gradient needs the batch size at
 * run time; they used to fail with "gradient: mean over symbolic dims".
 * Each run trains a few epochs on a learnable target, with a last partial
 * batch so the batch size changes between steps, and the test reads the
 * per-step CSV: every loss finite, the last epoch's mean loss well below
 * the first's.  A resume from a checkpoint whose position or counters were
 * edited (checksum recomputed) must be refused with one message, and so
 * must run, compile, export and train of a .kir whose weights file is gone.
 * The compiled step (kiln train's default) must train as --interp does, a
 * damaged cache entry must be rebuilt, and a step that cannot be compiled
 * must fall back to the interpreter, saying so.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "kiln/kiln.h"
#include "tmpdir.h"
#include "ckpt_edit.h"

#define ROWS 60 /* batches of 16: the last one has 12 rows */
#define EPOCHS 6

static void setup(void)
{
	tmp_make("kiln_cli_train");
	/* kiln train's compiled steps go to this test's folder, never ~/.cache */
	setenv("KILN_CACHE_DIR", tpath("cache"), 1);
}

static void teardown(void)
{
	if (!getenv("KILN_KEEP"))
		tmp_remove();
}

/* y = fc(x), fc Linear(4, 3); with log_softmax for nll. */
static void save_model(bool log_probs)
{
	kiln_graph *g = kiln_graph_new("lin");
	kiln_graph_seed(g, 3);
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 4});
	kiln_value y = kiln_linear(g, "fc", x, 3, true);
	kiln_output(g, "y", log_probs ? kiln_log_softmax(g, y, 1) : y);
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_save(g, tpath("model.kir"), &e) == KILN_OK, "%s", e.msg);
	kiln_graph_free(g);
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static double urand(void) /* xorshift64*, uniform in [0, 1) */
{
	rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
	return (double)((rng * 0x2545f4914f6cdd1dULL) >> 11) * 0x1.0p-53;
}

/* x uniform in [-1, 1); the target from z = x W for a fixed W: z itself
 * (regression), [z > 0] (bce_with_logits) or argmax z (classes). */
static void save_data(const char *loss)
{
	static const double w[4][3] = {{1, -2, 0.5}, {0.5, 1, -1}, {-1.5, 0.25, 1}, {2, 0, -0.5}};
	bool classes = !strcmp(loss, "cross_entropy") || !strcmp(loss, "nll");
	bool binary = !strcmp(loss, "bce_with_logits");
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 2, (int64_t[]){ROWS, 4});
	kiln_tensor *y = classes ? kiln_tensor_new(KILN_I64, 1, (int64_t[]){ROWS})
	                         : kiln_tensor_new(KILN_F32, 2, (int64_t[]){ROWS, 3});
	ck_assert(x && y);
	float *xf = x->data;
	for (int i = 0; i < ROWS; i++) {
		double z[3] = {0, 0, 0};
		for (int k = 0; k < 4; k++) {
			xf[i * 4 + k] = (float)(2 * urand() - 1);
			for (int j = 0; j < 3; j++)
				z[j] += xf[i * 4 + k] * w[k][j];
		}
		int best = 0;
		for (int j = 0; j < 3; j++) {
			best = z[j] > z[best] ? j : best;
			if (!classes)
				((float *)y->data)[i * 3 + j] = binary ? z[j] > 0 : (float)z[j];
		}
		if (classes)
			((int64_t *)y->data)[i] = best;
	}
	kiln_error e = {0};
	ck_assert_msg(kiln_npy_write(tpath("x.npy"), x, &e) == KILN_OK, "%s", e.msg);
	ck_assert_msg(kiln_npy_write(tpath("y.npy"), y, &e) == KILN_OK, "%s", e.msg);
	kiln_tensor_free(x), kiln_tensor_free(y);
}

/* Runs `kiln train` in the scratch folder; returns the exit status and
 * leaves stderr in err.txt. */
static int train(const char *loss, const char *optim, double lr, const char *more)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	         "cd '%s' && '%s/kiln' train model.kir --x x.npy --y y.npy --loss %s "
	         "--optimizer %s --lr %g --epochs %d --batch 16 --seed 1 --log curve.csv --quiet "
	         "%s >out.txt 2>err.txt",
	         tmpl, KILN_BIN, loss, optim, lr, EPOCHS, more);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	static char buf[1 << 16];
	size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = 0;
	return buf;
}

/* The CSV's per-epoch mean losses; every row's loss must be finite. */
static void epoch_losses(double *mean)
{
	FILE *f = fopen(tpath("curve.csv"), "r");
	ck_assert_ptr_nonnull(f);
	char line[256];
	int count[EPOCHS] = {0}, rows = 0;
	for (int e = 0; e < EPOCHS; e++)
		mean[e] = 0;
	ck_assert_ptr_nonnull(fgets(line, sizeof line, f)); /* header */
	ck_assert_str_eq(line, "step,epoch,lr,loss\n");
	while (fgets(line, sizeof line, f)) {
		long long step, epoch;
		double lr, loss;
		ck_assert_int_eq(sscanf(line, "%lld,%lld,%lf,%lf", &step, &epoch, &lr, &loss), 4);
		ck_assert_int_eq(step, ++rows);
		ck_assert(epoch >= 1 && epoch <= EPOCHS);
		ck_assert_msg(isfinite(loss) && loss >= 0, "step %lld: loss %g", step, loss);
		mean[epoch - 1] += loss, count[epoch - 1]++;
	}
	fclose(f);
	ck_assert_int_eq(rows, EPOCHS * 4);
	for (int e = 0; e < EPOCHS; e++)
		mean[e] /= count[e];
}

static void trains(const char *loss, const char *optim, double lr, double factor)
{
	save_model(!strcmp(loss, "nll"));
	save_data(loss);
	int rc = train(loss, optim, lr, "");
	ck_assert_msg(rc == 0, "kiln train --loss %s: exit %d: %s", loss, rc, slurp(tpath("err.txt")));
	double mean[EPOCHS];
	epoch_losses(mean);
	ck_assert_msg(mean[EPOCHS - 1] < factor * mean[0], "--loss %s: epoch 1 mean %g, epoch %d "
	              "mean %g (want below %g of it)", loss, mean[0], EPOCHS, mean[EPOCHS - 1],
	              factor);
}

START_TEST(mse_trains_and_the_loss_falls)
{
	trains("mse", "sgd", 0.1, 0.5);
}
END_TEST

START_TEST(l1_trains_and_the_loss_falls)
{
	trains("l1", "adam", 0.05, 0.7);
}
END_TEST

START_TEST(smooth_l1_trains_and_the_loss_falls)
{
	trains("smooth_l1", "adam", 0.05, 0.7);
}
END_TEST

START_TEST(bce_with_logits_trains_and_the_loss_falls)
{
	trains("bce_with_logits", "sgd", 1.0, 0.8);
}
END_TEST

START_TEST(cross_entropy_trains_and_the_loss_falls)
{
	trains("cross_entropy", "sgd", 0.5, 0.8);
}
END_TEST

START_TEST(nll_trains_and_the_loss_falls)
{
	trains("nll", "sgd", 0.5, 0.8);
}
END_TEST

/* ---- resuming from an edited checkpoint ---------------------------------------- */

/* A run stopped at step 8 (checkpoints at 4 and 8), its newest checkpoint
 * edited by how (checksum recomputed), then resumed: refused with one
 * error line naming msg, and nothing else on stderr (no sanitizer report
 * of an overflow). */
static void resume_refused(void (*how)(const char *path), const char *msg)
{
	save_model(false);
	save_data("mse");
	int rc = train("mse", "sgd", 0.1, "--checkpoint ck --every 4 --stop-after 8");
	ck_assert_msg(rc == 0, "exit %d: %s", rc, slurp(tpath("err.txt")));
	how(tpath("ck/ckpt-000000008.safetensors"));
	rc = train("mse", "sgd", 0.1, "--checkpoint ck --every 4 --resume ck");
	const char *err = slurp(tpath("err.txt"));
	ck_assert_int_eq(rc, 1);
	ck_assert_msg(strncmp(err, "kiln: error: ", 13) == 0 && strstr(err, msg) &&
	              strchr(err, '\n') == err + strlen(err) - 1, "stderr: %s", err);
}

static void epoch_huge(const char *path)
{
	ckpt_set_i64(path, "kiln_train.position", 0, INT64_MAX / 2);
}

static void epoch_behind(const char *path)
{
	ckpt_set_i64(path, "kiln_train.position", 0, 1); /* step 4, but 8 were taken */
}

static void step_huge(const char *path)
{
	ckpt_set_i64(path, "__step__", 0, INT64_MAX);
}

START_TEST(resume_refuses_an_edited_position)
{
	resume_refused(epoch_huge, "bad position (epoch 4611686018427387903, batch 0)");
	resume_refused(epoch_behind, "bad position (epoch 1, batch 0) for 4 batches per epoch "
	                             "and 8 optimizer steps taken");
}
END_TEST

START_TEST(resume_refuses_edited_trainer_counters)
{
	resume_refused(step_huge, "__step__ is 9223372036854775807, outside [0, 2^53]");
}
END_TEST

/* --log may be a FIFO with a reader elsewhere: a resume writes to it and
 * never reads it back (reading waited forever for a writer); timeout
 * guards the test. */
START_TEST(resume_with_a_fifo_log_does_not_hang)
{
	save_model(false);
	save_data("mse");
	int rc = train("mse", "sgd", 0.1, "--checkpoint ck --every 4 --stop-after 8");
	ck_assert_msg(rc == 0, "exit %d: %s", rc, slurp(tpath("err.txt")));
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	         "cd '%s' && mkfifo log.fifo && { timeout 40 cat log.fifo >fifo_out.txt & } && "
	         "timeout 30 '%s/kiln' train model.kir --x x.npy --y y.npy --loss mse --optimizer sgd "
	         "--lr 0.1 --epochs %d --batch 16 --seed 1 --quiet --checkpoint ck --every 4 "
	         "--resume ck --log log.fifo >out.txt 2>err.txt; st=$?; wait; exit $st",
	         tmpl, KILN_BIN, EPOCHS);
	int st = system(cmd);
	rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
	ck_assert_msg(rc == 0, "exit %d: %s", rc, slurp(tpath("err.txt")));
	const char *out = slurp(tpath("fifo_out.txt"));
	/* a stream has no rows to keep: it gets a header, then the resumed steps */
	ck_assert_msg(strncmp(out, "step,epoch,lr,loss\n9,3,", 23) == 0, "the log got: %.200s", out);
}
END_TEST

/* ---- a .kir without its weights file --------------------------------------------- */

/* Runs `kiln ARGS` in the scratch folder: the exit status, stderr in err.txt. */
static int kiln(const char *args)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "cd '%s' && '%s/kiln' %s >out.txt 2>err.txt", tmpl, KILN_BIN,
	         args);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* One "kiln: error:" line naming the missing file and a way out. */
static void refused_for_missing_weights(const char *args)
{
	int rc = kiln(args);
	const char *err = slurp(tpath("err.txt"));
	ck_assert_msg(rc == 1, "kiln %s: exit %d: %s", args, rc, err);
	ck_assert_msg(strncmp(err, "kiln: error: ", 13) == 0 &&
	              strstr(err, "weights file 'model.safetensors' is missing") &&
	              strstr(err, "put the weights file beside the .kir") &&
	              strchr(err, '\n') == err + strlen(err) - 1, "kiln %s: %s", args, err);
}

/* run, compile, export and train used to go ahead with all-zero weights */
START_TEST(kir_without_its_weights_file_is_refused)
{
	save_model(false);
	save_data("mse");
	ck_assert_int_eq(kiln("run model.kir -i x=x.npy -o outs"), 0);
	ck_assert_int_eq(remove(tpath("model.safetensors")), 0);
	refused_for_missing_weights("run model.kir -i x=x.npy -o outs");
	refused_for_missing_weights("compile model.kir -o model.so");
	refused_for_missing_weights("export model.kir -o model.onnx");
	refused_for_missing_weights("train model.kir --x x.npy --y y.npy --loss mse");
	refused_for_missing_weights("compile --train model.kir --loss mse -o step.so");
	ck_assert_ptr_null(fopen(tpath("model.so"), "r"));
	ck_assert_ptr_null(fopen(tpath("model.onnx"), "r"));
	/* inspect needs no weights */
	ck_assert_int_eq(kiln("inspect model.kir"), 0);
}
END_TEST

/* ---- the compiled step against the interpreter -------------------------------- */

/* Runs `ENV kiln train ARGS` in the scratch folder: the exit status;
 * stdout in out.txt, stderr in err.txt. */
static int kiln_env(const char *env, const char *args)
{
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "cd '%s' && %s '%s/kiln' %s >out.txt 2>err.txt", tmpl, env,
	         KILN_BIN, args);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* An eval-mode CNN on [N,1,6,6]: Conv(1->4, 3x3, pad 1, no bias: before a
 * BatchNorm its gradient is zero up to rounding, which Adam would turn into
 * steps of random sign, in PyTorch too)-BatchNorm-ReLU-
 * Dropout(0.25)-MaxPool(2)-Linear(36, 3), as cnn.kir; 60 samples with
 * classes from a fixed rule, as cx.npy and y.npy. */
static void save_cnn(void)
{
	kiln_graph *g = kiln_graph_new("cnn");
	kiln_graph_seed(g, 5);
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, (int64_t[]){kiln_sym(g, "N"), 1, 6, 6});
	kiln_value h = kiln_conv2d(g, "conv1", x, 4, &(kiln_conv_opts){.kernel = {3, 3},
	                           .pad = {1, 1, 1, 1}}, false);
	h = kiln_relu(g, kiln_batchnorm(g, "bn1", h, 0, 0));
	h = kiln_dropout(g, h, 0.25, false, 7);
	h = kiln_max_pool(g, h, &(kiln_conv_opts){.kernel = {2, 2}, .stride = {2, 2}});
	kiln_output(g, "logits", kiln_linear(g, "fc", kiln_flatten(g, h, 1), 3, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_save(g, tpath("cnn.kir"), &e) == KILN_OK, "%s", e.msg);
	kiln_graph_free(g);
	kiln_tensor *x6 = kiln_tensor_new(KILN_F32, 4, (int64_t[]){ROWS, 1, 6, 6});
	kiln_tensor *y = kiln_tensor_new(KILN_I64, 1, (int64_t[]){ROWS});
	ck_assert(x6 && y);
	for (int i = 0; i < ROWS; i++) {
		double top = 0, left = 0;
		for (int k = 0; k < 36; k++) {
			float v = (float)(2 * urand() - 1);
			((float *)x6->data)[i * 36 + k] = v;
			top += k < 18 ? v : 0, left += k % 6 < 3 ? v : 0;
		}
		((int64_t *)y->data)[i] = top > 0 ? 0 : left > 0 ? 1 : 2;
	}
	ck_assert_msg(kiln_npy_write(tpath("cx.npy"), x6, &e) == KILN_OK, "%s", e.msg);
	ck_assert_msg(kiln_npy_write(tpath("y.npy"), y, &e) == KILN_OK, "%s", e.msg);
	kiln_tensor_free(x6), kiln_tensor_free(y);
}

/* The loss column of a --log CSV (at most cap rows); the row count. */
static int csv_losses(const char *name, double *loss, int cap)
{
	FILE *f = fopen(tpath(name), "r");
	ck_assert_ptr_nonnull(f);
	char line[256];
	int n = 0;
	ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
	while (n < cap && fgets(line, sizeof line, f)) {
		long long step, epoch;
		double lr;
		ck_assert_int_eq(sscanf(line, "%lld,%lld,%lf,%lf", &step, &epoch, &lr, &loss[n]), 4);
		ck_assert_int_eq(step, n + 1);
		n++;
	}
	fclose(f);
	return n;
}

/* Trains cnn.kir with args both ways, same seed and order: every step's
 * loss within f32 rounding, and every exported parameter and buffer. */
static void compiled_matches_interp(const char *args)
{
	char a[1024];
	snprintf(a, sizeof a, "train cnn.kir --x cx.npy --y y.npy --batch 16 --epochs 3 --seed 1 "
	         "--no-shuffle --threads 2 --log c.csv --export c.kir %s", args);
	int rc = kiln_env("", a);
	ck_assert_msg(rc == 0, "compiled: exit %d: %s", rc, slurp(tpath("err.txt")));
	const char *out = slurp(tpath("out.txt"));
	ck_assert_msg(strstr(out, "train step for batch 16: compiled") &&
	              strstr(out, "train step for batch 12: compiled"), "stdout: %s", out);
	snprintf(a, sizeof a, "train cnn.kir --x cx.npy --y y.npy --batch 16 --epochs 3 --seed 1 "
	         "--no-shuffle --interp --log i.csv --export i.kir %s", args);
	rc = kiln_env("", a);
	ck_assert_msg(rc == 0, "--interp: exit %d: %s", rc, slurp(tpath("err.txt")));
	ck_assert_msg(!strstr(slurp(tpath("out.txt")), "train step"), "--interp compiled");
	double lc[64], li[64];
	int nc = csv_losses("c.csv", lc, 64), ni = csv_losses("i.csv", li, 64);
	ck_assert_int_eq(nc, 12);
	ck_assert_int_eq(ni, 12);
	for (int i = 0; i < nc; i++)
		ck_assert_msg(fabs(lc[i] - li[i]) <= 2e-5 * fabs(li[i]) + 1e-7,
		              "%s: step %d: compiled loss %.9g, interpreter %.9g", args, i + 1, lc[i], li[i]);
	kiln_tensor_set *sc = NULL, *si = NULL;
	kiln_error e = {0};
	ck_assert_msg(kiln_safetensors_read(tpath("c.safetensors"), &sc, &e) == KILN_OK, "%s", e.msg);
	ck_assert_msg(kiln_safetensors_read(tpath("i.safetensors"), &si, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(sc->count, si->count);
	ck_assert_int_ge(sc->count, 7); /* conv, bn (4 + count), fc */
	for (int k = 0; k < si->count; k++) {
		const kiln_tensor *t = si->items[k].tensor, *u = kiln_tensor_set_get(sc, si->items[k].name);
		ck_assert_msg(u && kiln_tensor_numel(u) == kiln_tensor_numel(t), "%s", si->items[k].name);
		for (int64_t j = 0; j < kiln_tensor_numel(t); j++) {
			double want = kiln_tensor_get(t, j), got = kiln_tensor_get(u, j);
			ck_assert_msg(fabs(got - want) <= 1e-4 * (1 + fabs(want)), "%s: '%s'[%lld]: compiled "
			              "%.9g, interpreter %.9g", args, si->items[k].name, (long long)j, got, want);
		}
	}
	kiln_tensor_set_free(sc), kiln_tensor_set_free(si);
}

/* Both ways, with the last batch short (60 = 3 x 16 + 12: the compiled run
 * hands the state to a second library and back), BatchNorm, Dropout (its
 * masks follow the micro-batch count across both libraries), schedules,
 * momentum, clipping and accumulation. */
START_TEST(compiled_step_matches_the_interpreter)
{
	save_cnn();
	compiled_matches_interp("--optimizer sgd --lr 0.05 --momentum 0.9 --nesterov "
	                        "--weight-decay 5e-4 --schedule cosine");
	compiled_matches_interp("--optimizer adamw --lr 0.01 --clip-norm 0.5 --accum 2 "
	                        "--schedule warmup:2,step:3:0.5");
}
END_TEST

/* The first step of --no-shuffle trains on rows 0-15: its loss is the
 * untrained model's MSE there, computed here; a shuffled run's is not.  A
 * checkpoint records the choice. */
START_TEST(no_shuffle_keeps_the_file_order)
{
	save_model(false);
	save_data("mse");
	int rc = kiln_env("", "train model.kir --x x.npy --y y.npy --loss mse --batch 16 --epochs 1 "
	                  "--no-shuffle --log n.csv --checkpoint ck --every 2 --stop-after 2 --quiet");
	ck_assert_msg(rc == 0, "exit %d: %s", rc, slurp(tpath("err.txt")));
	rc = kiln_env("", "train model.kir --x x.npy --y y.npy --loss mse --batch 16 --epochs 1 "
	              "--log s.csv --quiet");
	ck_assert_msg(rc == 0, "exit %d: %s", rc, slurp(tpath("err.txt")));
	kiln_graph *g = NULL;
	kiln_tensor *x = NULL, *y = NULL, *out = NULL;
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_load(tpath("model.kir"), &g, &e) == KILN_OK, "%s", e.msg);
	ck_assert(kiln_npy_read(tpath("x.npy"), &x, &e) == KILN_OK);
	ck_assert(kiln_npy_read(tpath("y.npy"), &y, &e) == KILN_OK);
	x->shape[0] = 16;
	ck_assert_msg(kiln_graph_run(g, &x, 1, &out, 1, &e) == KILN_OK, "%s", e.msg);
	double mse = 0;
	for (int64_t i = 0; i < 16 * 3; i++) {
		double d = kiln_tensor_get(out, i) - kiln_tensor_get(y, i);
		mse += d * d / (16 * 3);
	}
	double ln[8], ls[8];
	ck_assert_int_eq(csv_losses("n.csv", ln, 8), 2);
	ck_assert_int_eq(csv_losses("s.csv", ls, 8), 4);
	ck_assert_msg(fabs(ln[0] - mse) <= 1e-5 * mse, "--no-shuffle: step 1 loss %.9g, the "
	              "first 16 rows' %.9g", ln[0], mse);
	ck_assert_msg(fabs(ls[0] - mse) > 1e-3 * mse, "shuffled: step 1 loss %.9g is rows 0-15's",
	              ls[0]);
	rc = kiln_env("", "train model.kir --x x.npy --y y.npy --loss mse --batch 16 --epochs 1 "
	              "--checkpoint ck --resume ck");
	ck_assert_int_eq(rc, 1);
	ck_assert_msg(strstr(slurp(tpath("err.txt")), "it was made with --no-shuffle, this run has "
	              "--shuffle"), "%s", slurp(tpath("err.txt")));
	kiln_graph_free(g);
	kiln_tensor_free(x), kiln_tensor_free(y), kiln_tensor_free(out);
}
END_TEST

/* Flips one byte in the middle of file path. */
static void flip_byte(const char *path)
{
	FILE *f = fopen(path, "r+b");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
	long n = ftell(f);
	ck_assert_int_eq(fseek(f, n / 2, SEEK_SET), 0);
	int c = fgetc(f);
	ck_assert_int_eq(fseek(f, n / 2, SEEK_SET), 0);
	fputc(c ^ 0x5a, f);
	fclose(f);
}

/* A cached library altered or torn after it was written is found out by
 * its hash, compiled again (said once on stderr) and gives the same run;
 * the next run loads it from the cache. */
START_TEST(a_damaged_cache_entry_is_rebuilt)
{
	save_model(false);
	save_data("mse");
	const char *env = "KILN_CACHE_DIR=cache", *args = "train model.kir --x x.npy --y y.npy "
	                  "--loss mse --batch 16 --epochs 2 --seed 3 --log %s";
	char a[512];
	snprintf(a, sizeof a, args, "a.csv");
	int rc = kiln_env(env, a);
	ck_assert_msg(rc == 0, "exit %d: %s", rc, slurp(tpath("err.txt")));
	/* the two libraries (16 and 12 rows): one altered, one torn */
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "ls '%s'/train-*.so > '%s'", tpath("cache"), tpath("libs.txt"));
	ck_assert_int_eq(system(cmd), 0);
	char libs[2][512];
	FILE *f = fopen(tpath("libs.txt"), "r");
	ck_assert(f && fscanf(f, "%511s %511s", libs[0], libs[1]) == 2);
	fclose(f);
	flip_byte(libs[0]);
	ck_assert_int_eq(truncate(libs[1], 1000), 0);
	snprintf(a, sizeof a, args, "b.csv");
	rc = kiln_env(env, a);
	const char *err = slurp(tpath("err.txt"));
	ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
	ck_assert_msg(strstr(err, "was damaged; compiled it again") &&
	              strstr(strstr(err, "damaged") + 1, "was damaged"), "stderr: %s", err);
	snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", tpath("a.csv"), tpath("b.csv"));
	ck_assert_msg(system(cmd) == 0, "the rebuilt libraries trained differently");
	snprintf(a, sizeof a, args, "c.csv");
	rc = kiln_env(env, a);
	ck_assert_msg(rc == 0 && !slurp(tpath("err.txt"))[0], "exit %d: %s", rc,
	              slurp(tpath("err.txt")));
	ck_assert_msg(strstr(slurp(tpath("out.txt")), "train step for batch 12: from the cache"),
	              "%s", slurp(tpath("out.txt")));
}
END_TEST

/* A step that cannot be compiled (here: the runtime archive to link is
 * missing) trains through the interpreter, after one line saying so. */
START_TEST(an_uncompilable_step_falls_back_to_the_interpreter)
{
	save_model(false);
	save_data("mse");
	const char *args = "train model.kir --x x.npy --y y.npy --loss mse --batch 16 --epochs 2 "
	                   "--seed 3 --quiet --log %s %s";
	char a[512];
	snprintf(a, sizeof a, args, "f.csv", "");
	int rc = kiln_env("KILN_CACHE_DIR=cache2 KILN_RT_LIB=/nonexistent/libkilnrt.a", a);
	const char *err = slurp(tpath("err.txt"));
	ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
	const char *note = strstr(err, "kiln: note: the train step cannot be compiled ($KILN_RT_LIB "
	                               "is '/nonexistent/libkilnrt.a'");
	ck_assert_msg(note && (note == err || note[-1] == '\n') &&
	              strstr(note, "); training through the interpreter instead (as --interp)\n") &&
	              strchr(note, '\n') == err + strlen(err) - 1 && !strstr(err, "kiln: error"),
	              "stderr: %s", err);
	snprintf(a, sizeof a, args, "i.csv", "--interp");
	ck_assert_int_eq(kiln_env("", a), 0);
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", tpath("f.csv"), tpath("i.csv"));
	ck_assert_msg(system(cmd) == 0, "the fallback did not train as --interp does");
}
END_TEST

static Suite *cli_train_suite(void)
{
	Suite *s = suite_create("cli_train");
	TCase *tc = tcase_create("losses");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, mse_trains_and_the_loss_falls);
	tcase_add_test(tc, l1_trains_and_the_loss_falls);
	tcase_add_test(tc, smooth_l1_trains_and_the_loss_falls);
	tcase_add_test(tc, bce_with_logits_trains_and_the_loss_falls);
	tcase_add_test(tc, cross_entropy_trains_and_the_loss_falls);
	tcase_add_test(tc, nll_trains_and_the_loss_falls);
	suite_add_tcase(s, tc);
	tc = tcase_create("resume");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, resume_refuses_an_edited_position);
	tcase_add_test(tc, resume_refuses_edited_trainer_counters);
	tcase_add_test(tc, resume_with_a_fifo_log_does_not_hang);
	suite_add_tcase(s, tc);
	tc = tcase_create("weights");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, kir_without_its_weights_file_is_refused);
	suite_add_tcase(s, tc);
	tc = tcase_create("compiled");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, compiled_step_matches_the_interpreter);
	tcase_add_test(tc, no_shuffle_keeps_the_file_order);
	tcase_add_test(tc, a_damaged_cache_entry_is_rebuilt);
	tcase_add_test(tc, an_uncompilable_step_falls_back_to_the_interpreter);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(cli_train_suite)
