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
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "check_main.h"
#include "kiln/kiln.h"
#include "tmpdir.h"
#include "ckpt_edit.h"

#define ROWS 60 /* batches of 16: the last one has 12 rows */
#define EPOCHS 6

static void setup(void)
{
	tmp_make("kiln_cli_train");
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
	return s;
}

KILN_CHECK_MAIN(cli_train_suite)
