/*
 * train.c: `kiln train`, a training loop from .npy data: shuffled batches,
 * epochs, a learning-rate schedule, a progress bar and per-epoch accuracy, a
 * CSV curve, checkpoints that resume exactly, and the trained model exported
 * as ONNX.
 *
 * The key idea: the model file is the inference graph (what PyTorch exports
 * in eval mode, and what gets exported again at the end); the train-mode
 * graph is derived from it by kiln_train_graph_from_inference (BatchNorm
 * on batch statistics with PyTorch's running-stat updates, Dropout on),
 * plus here the loss and a count of correct predictions, all as
 * "<name>.next" state of one step graph.  That graph is compiled (forward,
 * loss, backward and update in one library function, kiln_compile_train,
 * through a cache of libraries: driver_train_lib) and run with the model
 * runtime; `--interp` runs it through kiln_trainer instead, and a model the
 * compiler cannot take falls back to it, saying so.  The compiled step has
 * a fixed batch (a convolution's weight gradient needs it), so a run whose
 * last batch is short compiles a second library for that size and hands the
 * state over before and after each such step (kiln_model_set_state).
 * Everything that orders the data is a pure function of (seed, epoch), so a
 * run's position is just (epoch, batch), which each checkpoint stores in the
 * parameter "kiln_train.position" beside the trainer's own state; resuming
 * replays the same shuffles, dropout masks and schedule bit for bit.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "tools/tools.h"

/* Nodes the tool adds (loss, counters) carry the model's location, so a
 * message about them names the user's file, never this one. */
#define HERE kiln_graph_loc(g)
#define POS_NAME "kiln_train.position"
#define CORRECT_NAME "kiln_train.correct"
#define EVAL_CHUNK 256 /* rows per eval run: bounds the interpreter's memory */

const char cmd_train_summary[] = "train a model on .npy data; checkpoints, resume, ONNX export";
const char cmd_train_usage[] =
	"train MODEL.kir|MODEL.onnx --x X.npy --y Y.npy [options]\n"
	"  Trains the inference-mode MODEL (symbolic batch dim, one input; its first\n"
	"  output is the prediction).  The train-mode graph is derived: BatchNorm\n"
	"  uses batch statistics and updates its running stats as PyTorch does,\n"
	"  Dropout is on.  Forward, loss, backward and update are compiled into one\n"
	"  library, kept in $KILN_CACHE_DIR (else $XDG_CACHE_HOME/kiln, else\n"
	"  ~/.cache/kiln) so the next run with the same model and options compiles\n"
	"  nothing; a model it cannot compile trains in the interpreter (said on\n"
	"  stderr).  Each epoch draws a fresh order from --seed; the last partial\n"
	"  batch is kept (DataLoader's default).  A step is one batch; with\n"
	"  --accum K the optimizer updates every K steps.  An output that is an\n"
	"  input, or a destination that cannot be written, is refused before\n"
	"  anything loads, and NaN or inf in the data when it loads.\n"
	"  --x X.npy, --y Y.npy    training inputs and targets (classes: integers)\n"
	"  --val-x F --val-y F     validation set: accuracy after every epoch\n"
	"  --loss L                cross_entropy (default), nll, mse, l1, smooth_l1,\n"
	"                          bce_with_logits\n"
	"  --label-smoothing S     for cross_entropy (default 0)\n"
	"  --optimizer O           sgd (default), adam, adamw\n"
	"  --lr LR                 learning rate (default: adam, adamw 0.001 as PyTorch;\n"
	"                          sgd 0.01, where PyTorch requires one)\n"
	"  --momentum M --dampening D --nesterov          SGD (defaults 0, 0, off)\n"
	"  --weight-decay W        default 0; adamw: 0.01 (PyTorch's defaults)\n"
	"  --betas B1,B2 --eps E   Adam/AdamW (defaults 0.9,0.999 and 1e-8)\n"
	"  --clip-norm X           clip the global gradient norm to X\n"
	"  --accum K               accumulate K batches per update (default 1)\n"
	"  --schedule S            step:STEP:GAMMA, cosine[:T_MAX], onecycle:MAX_LR,\n"
	"                          warmup:N, or warmup:N,<one of the others>; counted\n"
	"                          in optimizer updates (default: constant --lr)\n"
	"  --epochs E --batch B    defaults 1 and 32\n"
	"  --seed S                shuffles and dropout masks (default 0)\n"
	"  --shuffle, --no-shuffle a new order every epoch (default), or the file's\n"
	"                          order every epoch\n"
	"  --threads N             threads of the compiled step (default: every CPU\n"
	"                          this process may use); the interpreter uses one\n"
	"  --interp                run the step in the interpreter, not compiled\n"
	"  --checkpoint DIR        DIR/ckpt-<step>.safetensors every --every N steps\n"
	"  --every N               and at the end; the last two are kept\n"
	"  --resume CKPT|DIR       continue a run exactly (DIR: its newest checkpoint)\n"
	"  --log CURVE.csv         step,epoch,lr,loss[,val_acc] per step (on resume,\n"
	"                          rows after the checkpoint are dropped first)\n"
	"  --plot CURVE.svg        the loss, validation accuracy and learning rate\n"
	"                          against step as a picture, redrawn every epoch\n"
	"                          (on resume with --log, the logged steps too)\n"
	"  --export OUT.onnx       the trained inference model (.kir: kiln's format)\n"
	"  --val-out OUT.npy       the trained model's outputs on --val-x\n"
	"  --quiet                 print nothing but errors\n"
	"  --distributed           data-parallel under `mpirun -np K` (docs/DISTRIBUTED.md):\n"
	"                          --batch is the global batch (K must divide it),\n"
	"                          each rank takes its share of every epoch's order\n"
	"                          (PyTorch's DistributedSampler), gradients are\n"
	"                          averaged per bucket during backward; rank 0 logs,\n"
	"                          checkpoints and exports\n"
	"  --drop-last             the sampler drops the tail that K does not divide\n"
	"                          (default: pads it with the order's first samples)\n"
	"  --bucket-mb M           gradient bucket size (default 25, DDP's)\n"
	"  --comm-timeout S        a rank that dies or hangs fails the others after S\n"
	"                          seconds, naming it (default 300)\n"
	"  --sync-bn               synchronised BatchNorm (SyncBatchNorm): batch statistics\n"
	"                          over the global batch, not each rank's share";

/* ---- errors ------------------------------------------------------------ */

/* ---- options ------------------------------------------------------------ */

typedef struct opts {
	const char *model, *x, *y, *val_x, *val_y, *loss, *optim, *sched, *ckpt_dir, *resume,
		*log, *export_path, *betas, *val_out, *plot;
	double lr, momentum, dampening, wd, eps, clip, smoothing;
	int64_t accum, epochs, batch, seed, every, stop_after, threads;
	bool nesterov, quiet, interp, shuffle, no_shuffle;
	bool distributed, drop_last, sync_bn;
	double bucket_mb, comm_timeout;
	bool batch_set; /* --batch given, so it may not exceed the data */
} opts;

typedef enum { O_STR, O_F64, O_I64, O_FLAG } opt_kind;

typedef struct opt_def {
	const char *name;
	opt_kind kind;
	size_t off;
} opt_def;

#define OPT(name, kind, field) {name, kind, offsetof(opts, field)}
static const opt_def opt_defs[] = {
	OPT("--x", O_STR, x), OPT("--y", O_STR, y), OPT("--val-x", O_STR, val_x),
	OPT("--val-y", O_STR, val_y), OPT("--loss", O_STR, loss),
	OPT("--label-smoothing", O_F64, smoothing), OPT("--optimizer", O_STR, optim),
	OPT("--lr", O_F64, lr), OPT("--momentum", O_F64, momentum),
	OPT("--dampening", O_F64, dampening), OPT("--nesterov", O_FLAG, nesterov),
	OPT("--weight-decay", O_F64, wd), OPT("--betas", O_STR, betas), OPT("--eps", O_F64, eps),
	OPT("--clip-norm", O_F64, clip), OPT("--accum", O_I64, accum),
	OPT("--schedule", O_STR, sched), OPT("--epochs", O_I64, epochs),
	OPT("--batch", O_I64, batch), OPT("--seed", O_I64, seed),
	OPT("--checkpoint", O_STR, ckpt_dir), OPT("--every", O_I64, every),
	OPT("--resume", O_STR, resume), OPT("--log", O_STR, log),
	OPT("--export", O_STR, export_path), OPT("--val-out", O_STR, val_out),
	OPT("--plot", O_STR, plot),
	OPT("--quiet", O_FLAG, quiet), OPT("--shuffle", O_FLAG, shuffle),
	OPT("--no-shuffle", O_FLAG, no_shuffle), OPT("--threads", O_I64, threads),
	OPT("--interp", O_FLAG, interp), OPT("--distributed", O_FLAG, distributed),
	OPT("--drop-last", O_FLAG, drop_last), OPT("--sync-bn", O_FLAG, sync_bn),
	OPT("--bucket-mb", O_F64, bucket_mb), OPT("--comm-timeout", O_F64, comm_timeout),
	/* not in the usage text: stops after step N as a kill would (no final
	 * checkpoint, no export), for the resume tests */
	OPT("--stop-after", O_I64, stop_after),
};
#define NOPTS ((int)(sizeof opt_defs / sizeof opt_defs[0]))

static int usage_error(const char *fmt, const char *arg)
{
	char msg[512];
	snprintf(msg, sizeof msg, fmt, arg);
	return tool_fail(TOOLS_EXIT_USAGE, "%s (see 'kiln train --help')", msg);
}

static bool parse_f64(const char *s, double *v)
{
	char *end;
	errno = 0;
	*v = strtod(s, &end);
	return end != s && !*end && !errno && isfinite(*v);
}

static bool parse_i64(const char *s, int64_t *v)
{
	char *end;
	errno = 0;
	long long x = strtoll(s, &end, 10);
	*v = x;
	return end != s && !*end && !errno;
}

/* Stores one option's value (from "--name=V" or the next argument). */
static int set_opt(opts *o, const opt_def *d, const char *val)
{
	char *field = (char *)o + d->off;
	if (d->kind == O_STR)
		*(const char **)(void *)field = val;
	else if (d->kind == O_F64 && !parse_f64(val, (double *)(void *)field))
		return usage_error("bad number '%s'", val);
	else if (d->kind == O_I64 && !parse_i64(val, (int64_t *)(void *)field))
		return usage_error("bad integer '%s'", val);
	return 0;
}

static const opt_def *find_opt(const char *arg, const char **inline_val)
{
	for (int i = 0; i < NOPTS; i++) {
		size_t n = strlen(opt_defs[i].name);
		if (strncmp(arg, opt_defs[i].name, n) == 0 && (!arg[n] || arg[n] == '=')) {
			*inline_val = arg[n] ? arg + n + 1 : NULL;
			return &opt_defs[i];
		}
	}
	return NULL;
}

static int check_opts(const opts *o)
{
	if (!o->model)
		return usage_error("missing %s", "MODEL.kir or MODEL.onnx");
	if (!o->x || !o->y)
		return usage_error("missing %s", "--x X.npy and --y Y.npy");
	if (!o->val_x != !o->val_y)
		return usage_error("%s", "--val-x and --val-y go together");
	if (o->epochs < 1 || o->batch < 1 || o->accum < 1 || o->every < 0)
		return usage_error("%s", "--epochs, --batch and --accum must be >= 1, --every >= 0");
	if (!(o->lr > 0))
		return usage_error("%s", "--lr must be > 0");
	if (o->shuffle && o->no_shuffle)
		return usage_error("%s", "--shuffle and --no-shuffle contradict each other");
	if (o->threads < 1 || o->threads > 256)
		return usage_error("%s", "--threads must be in [1, 256]");
	if (o->val_out && !o->val_x)
		return usage_error("%s", "--val-out needs --val-x");
	if (o->every && !o->ckpt_dir)
		return usage_error("%s", "--every needs --checkpoint DIR");
	if (!o->distributed && (o->drop_last || o->sync_bn))
		return usage_error("%s", "--drop-last and --sync-bn need --distributed");
	if (o->distributed && o->interp)
		return usage_error("%s", "--distributed needs the compiled step (not --interp)");
	if (!(o->bucket_mb > 0) || !(o->comm_timeout > 0))
		return usage_error("%s", "--bucket-mb and --comm-timeout must be > 0");
	return 0;
}

static int parse_args(int argc, char **argv, opts *o)
{
	*o = (opts){.loss = "cross_entropy", .optim = "sgd", .lr = -1, .wd = -1, .accum = 1,
	            .epochs = 1, .batch = 32, .stop_after = -1, .threads = tool_cpus(),
	            .bucket_mb = 25, .comm_timeout = 300};
	for (int i = 0; i < argc; i++) {
		const char *val = NULL;
		const opt_def *d = argv[i][0] == '-' ? find_opt(argv[i], &val) : NULL;
		if (!d && argv[i][0] == '-' && argv[i][1])
			return usage_error("unknown option '%s'", argv[i]);
		if (!d && o->model)
			return usage_error("unexpected argument '%s'", argv[i]);
		if (!d) {
			o->model = argv[i];
			continue;
		}
		if (d->kind == O_FLAG) {
			if (val)
				return usage_error("option '%s' takes no value", d->name);
			*(bool *)(void *)((char *)o + d->off) = true;
			continue;
		}
		if (!val && i + 1 >= argc)
			return usage_error("option '%s' needs a value", d->name);
		o->batch_set |= d->off == offsetof(opts, batch);
		if (set_opt(o, d, val ? val : argv[++i]))
			return TOOLS_EXIT_USAGE;
		if (d->off == offsetof(opts, lr) && !(o->lr > 0))
			return usage_error("%s", "--lr must be > 0");
	}
	/* PyTorch's Adam and AdamW default to 1e-3; its SGD has none (lr is
	 * required), and kiln keeps the 0.01 it always had there */
	if (o->lr < 0)
		o->lr = strcmp(o->optim, "adam") && strcmp(o->optim, "adamw") ? 0.01 : 1e-3;
	return check_opts(o);
}

/* ---- schedule, loss and optimizer choices ---------------------------------- */

/* One "kind[:a[:b]]" item of --schedule into s; total is the run's number
 * of optimizer updates, the default length of cosine and onecycle. */
static int sched_item(char *item, kiln_sched *s)
{
	char *f[3] = {item, NULL, NULL};
	for (int k = 1; k < 3 && f[k - 1] && (f[k] = strchr(f[k - 1], ':')); k++)
		*f[k]++ = '\0';
	int64_t i = 0;
	double d = 0;
	if (!strcmp(f[0], "warmup") && f[1] && !f[2] && parse_i64(f[1], &i) && i > 0)
		s->warmup_steps = i;
	else if (!strcmp(f[0], "step") && f[2] && parse_i64(f[1], &i) && parse_f64(f[2], &d))
		s->kind = KILN_SCHED_STEP, s->step_size = i, s->gamma = d;
	else if (!strcmp(f[0], "cosine") && !f[2] && (!f[1] || parse_i64(f[1], &i)))
		s->kind = KILN_SCHED_COSINE, s->t_max = i;
	else if (!strcmp(f[0], "onecycle") && f[1] && !f[2] && parse_f64(f[1], &d) && d > 0)
		s->kind = KILN_SCHED_ONECYCLE, s->base_lr = d;
	else if (strcmp(f[0], "constant") || f[1])
		return -1;
	return 0;
}

static int parse_sched(const opts *o, int64_t total, kiln_sched *s)
{
	*s = (kiln_sched){.kind = KILN_SCHED_CONSTANT, .base_lr = o->lr};
	char *buf = o->sched ? strdup(o->sched) : NULL; /* any length */
	if (o->sched && !buf)
		return tool_fail(1, "out of memory");
	char *save = NULL;
	for (char *it = buf ? strtok_r(buf, ",", &save) : NULL; it; it = strtok_r(NULL, ",", &save))
		if (sched_item(it, s)) {
			free(buf);
			return usage_error("bad --schedule '%s': expected step:STEP:GAMMA, "
			                   "cosine[:T_MAX], onecycle:MAX_LR or warmup:N", o->sched);
		}
	free(buf);
	/* after a warmup the main schedule starts from its own step 0
	 * (SequentialLR), so by default it spans what is left */
	int64_t rest = total - s->warmup_steps;
	if (s->kind == KILN_SCHED_COSINE && !s->t_max)
		s->t_max = rest;
	if (s->kind == KILN_SCHED_ONECYCLE)
		s->total_steps = rest;
	kiln_error e = {0};
	if (kiln_sched_check(s, &e) != KILN_OK)
		return tool_fail(TOOLS_EXIT_USAGE, "--schedule '%s' over %lld updates: %s",
		            o->sched ? o->sched : "constant", (long long)total, e.msg);
	return 0;
}

typedef kiln_value (*loss_fn)(kiln_graph *g, kiln_value pred, kiln_value y, const opts *o);

static kiln_value loss_ce(kiln_graph *g, kiln_value pred, kiln_value y, const opts *o)
{
	return kiln_cross_entropy_at(g, HERE, pred, y, KILN_NONE, "mean", -100, o->smoothing);
}

static kiln_value loss_nll(kiln_graph *g, kiln_value pred, kiln_value y, const opts *o)
{
	return kiln_nll_loss_at(g, HERE, pred, y, KILN_NONE, "mean", false, 0);
}

static kiln_value loss_mse(kiln_graph *g, kiln_value pred, kiln_value y, const opts *o)
{
	return kiln_mse_loss_at(g, HERE, pred, y, "mean");
}

static kiln_value loss_l1(kiln_graph *g, kiln_value pred, kiln_value y, const opts *o)
{
	return kiln_l1_loss_at(g, HERE, pred, y, "mean");
}

static kiln_value loss_smooth_l1(kiln_graph *g, kiln_value pred, kiln_value y, const opts *o)
{
	return kiln_smooth_l1_loss_at(g, HERE, pred, y, "mean", 1.0);
}

static kiln_value loss_bce(kiln_graph *g, kiln_value pred, kiln_value y, const opts *o)
{
	return kiln_bce_with_logits_at(g, HERE, pred, y, KILN_NONE, KILN_NONE, "mean");
}

/* classify: integer class targets [N, d...] for predictions [N, C, d...],
 * and accuracy is reported; otherwise targets are shaped like predictions. */
typedef struct loss_info {
	const char *name;
	loss_fn build;
	bool classify;
} loss_info;

static const loss_info losses[] = {
	{"cross_entropy", loss_ce, true}, {"nll", loss_nll, true},
	{"mse", loss_mse, false},         {"l1", loss_l1, false},
	{"smooth_l1", loss_smooth_l1, false}, {"bce_with_logits", loss_bce, false},
};

static const struct optim_info {
	const char *name;
	kiln_optim_kind kind;
	double wd; /* PyTorch's default weight decay */
} optims[] = {{"sgd", KILN_OPT_SGD, 0}, {"adam", KILN_OPT_ADAM, 0}, {"adamw", KILN_OPT_ADAMW, 0.01}};

static int train_opts(const opts *o, const loss_info **L, kiln_train_opts *t)
{
	*L = NULL;
	for (size_t i = 0; i < sizeof losses / sizeof losses[0]; i++)
		if (!strcmp(o->loss, losses[i].name))
			*L = &losses[i];
	if (!*L)
		return usage_error("unknown --loss '%s'", o->loss);
	if (o->val_x && !(*L)->classify)
		return usage_error("--val-x reports accuracy, which needs a classification loss "
		                   "(cross_entropy or nll), not '%s'", o->loss);
	const struct optim_info *opt = NULL;
	for (size_t i = 0; i < sizeof optims / sizeof optims[0]; i++)
		if (!strcmp(o->optim, optims[i].name))
			opt = &optims[i];
	if (!opt)
		return usage_error("unknown --optimizer '%s' (sgd, adam or adamw)", o->optim);
	*t = (kiln_train_opts){.optim = opt->kind, .momentum = o->momentum,
	                       .dampening = o->dampening, .nesterov = o->nesterov,
	                       .weight_decay = o->wd >= 0 ? o->wd : opt->wd, .eps = o->eps,
	                       .clip_norm = o->clip, .accum_steps = (int)o->accum,
	                       .loss = KILN_LOSS_OUTPUT};
	char tail;
	if (o->betas && sscanf(o->betas, "%lf,%lf%c", &t->beta1, &t->beta2, &tail) != 2)
		return usage_error("bad --betas '%s': expected B1,B2", o->betas);
	return 0;
}

/* ---- the train-mode graph ------------------------------------------------------ */

/* A library-style error into err (kiln_error's code and message); returns
 * code. */
static kiln_status set_err(kiln_error *err, kiln_status code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static kiln_status set_err(kiln_error *err, kiln_status code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	err->code = code;
	vsnprintf(err->msg, sizeof err->msg, fmt, ap);
	va_end(ap);
	return code;
}

/* A value's type, to print or to derive the target's from. */
typedef struct vtype {
	kiln_dtype dtype;
	int rank;
	int64_t dim[KILN_MAX_RANK]; /* >= 0 fixed, < 0 the graph's symbol */
} vtype;

static vtype type_of(const kiln_graph *g, kiln_value v)
{
	vtype t = {kiln_value_dtype(g, v), kiln_value_rank(g, v), {0}};
	for (int i = 0; i < t.rank && i < KILN_MAX_RANK; i++)
		t.dim[i] = kiln_value_dim(g, v, i);
	return t;
}

static const char *type_str(const kiln_graph *g, const vtype *t, char *buf, size_t size)
{
	return kiln_type_str(g, t->dtype, t->rank, t->dim, buf, size);
}

/* The class targets' type of class scores t ([N,C,d...] -> i64[N,d...]). */
static vtype class_type(vtype t)
{
	memmove(&t.dim[1], &t.dim[2], (size_t)(t.rank - 2) * sizeof t.dim[0]);
	t.rank--, t.dtype = KILN_I64;
	return t;
}

/* The "target" input, the "loss" output, the position buffer and, when
 * classifying, the batch's count of correct argmaxes as state.  Builder
 * errors stay in g; the one of its own goes to err. */
static kiln_status add_loss(kiln_graph *g, const opts *o, const loss_info *L, kiln_error *err)
{
	kiln_value pred = kiln_graph_output(g, 0);
	vtype t = type_of(g, pred);
	if (L->classify) {
		if (t.rank < 2) {
			char b[256];
			return set_err(err, KILN_ESHAPE, "--loss %s needs class scores [N,C,...] as the "
			               "model's first output, it is %s", L->name, type_str(g, &t, b, sizeof b));
		}
		t = class_type(t);
	}
	kiln_value y = kiln_input_at(g, HERE, "target", t.dtype, t.rank, t.dim);
	kiln_output_at(g, HERE, "loss", L->build(g, pred, y, o));
	kiln_tensor *pos = kiln_tensor_new(KILN_I64, 1, (int64_t[]){8});
	if (pos)
		kiln_buffer_at(g, HERE, POS_NAME, pos);
	kiln_tensor_free(pos);
	if (!pos)
		return set_err(err, KILN_ENOMEM, "out of memory");
	if (!L->classify || kiln_graph_status(g) != KILN_OK)
		return KILN_OK;
	kiln_value hit = kiln_equal_at(g, HERE, kiln_argmax_at(g, HERE, pred, 1, false), y);
	kiln_value cnt = kiln_reduce_sum_at(g, HERE, kiln_cast_at(g, HERE, hit, KILN_I64), 0, NULL,
	                                    false);
	int64_t zero = 0;
	kiln_buffer_at(g, HERE, CORRECT_NAME, &(kiln_tensor){KILN_I64, 0, {0}, &zero});
	kiln_output_at(g, HERE, CORRECT_NAME ".next", cnt);
	return KILN_OK;
}

/* The library's train-mode form of the model (BatchNorm on batch
 * statistics, Dropout on with --seed), plus the loss and the counters. */
static kiln_graph *train_graph(const kiln_graph *eval, const opts *o, const loss_info *L,
                               int sync_ranks, kiln_error *err)
{
	kiln_graph *g = NULL;
	if (driver_train_graph_sync_bn(eval, (uint64_t)o->seed, sync_ranks, &g, err) != KILN_OK)
		return NULL;
	kiln_status st = add_loss(g, o, L, err);
	if (st == KILN_OK && (st = kiln_graph_status(g)) != KILN_OK)
		set_err(err, st, "%s", kiln_graph_errmsg(g));
	if (st == KILN_OK && kiln_graph_verify(g, err) == KILN_OK)
		return g;
	kiln_graph_free(g);
	return NULL;
}

/* ---- data ---------------------------------------------------------------------- */

static const char *tensor_str(const kiln_tensor *t, char *buf, size_t size)
{
	size_t n = snprintf(buf, size, "%s[", kiln_dtype_name(t->dtype));
	for (int i = 0; i < t->rank && n < size; i++)
		n += snprintf(buf + n, size - n, "%s%lld", i ? "," : "", (long long)t->shape[i]);
	if (n < size)
		snprintf(buf + n, size - n, "]");
	return buf;
}

/* t must be [rows] + want's dims after the first (symbolic ones match
 * anything) with want's dtype (any integer dtype when ints). */
static int check_rows(const char *path, const kiln_tensor *t, int64_t rows, const kiln_graph *g,
                      const vtype *want, bool ints, const char *what)
{
	bool ok = t->rank == want->rank && t->rank >= 1 && (rows < 0 || t->shape[0] == rows);
	for (int i = 1; ok && i < t->rank; i++)
		ok = want->dim[i] < 0 || want->dim[i] == t->shape[i];
	if (ints)
		ok = ok && !kiln_dtype_is_float(t->dtype) && t->dtype != KILN_BOOL;
	else
		ok = ok && t->dtype == want->dtype;
	if (ok)
		return 0;
	char a[256], b[256];
	return tool_fail(1, "%s is %s, but %s is %s%s%s", path, tensor_str(t, a, sizeof a), what,
	            type_str(g, want, b, sizeof b), ints ? " (any integer dtype)" : "",
	            rows >= 0 ? ", one row per sample of --x" : "");
}

/* Class targets as i64, each checked against the class count C. */
static int class_targets(const char *path, kiln_tensor **y, int64_t C)
{
	kiln_tensor *t = kiln_tensor_new(KILN_I64, (*y)->rank, (*y)->shape);
	if (!t)
		return tool_fail(1, "out of memory");
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++) {
		int64_t c = kiln_tensor_get_i64(*y, i);
		if (c < 0 || (C >= 0 && c >= C)) {
			kiln_tensor_free(t);
			return tool_fail(1, "%s: target %lld at element %lld is not a class of the model's %lld",
			            path, (long long)c, (long long)i, (long long)C);
		}
		((int64_t *)t->data)[i] = c;
	}
	kiln_tensor_free(*y);
	*y = t;
	return 0;
}

/* A NaN or an infinity in the data is the file's fault, not the learning
 * rate's: name the file and the first bad element, as an index. */
static int check_finite(const char *path, const kiln_tensor *t)
{
	if (!kiln_dtype_is_float(t->dtype))
		return 0;
	int64_t n = kiln_tensor_numel(t);
	for (int64_t i = 0; i < n; i++) {
		double v = kiln_tensor_get(t, i);
		if (isfinite(v))
			continue;
		char idx[256];
		size_t k = 0;
		int64_t rest = i, stride = n;
		for (int d = 0; d < t->rank && k < sizeof idx; d++) {
			stride = t->shape[d] ? stride / t->shape[d] : 1;
			k += snprintf(idx + k, sizeof idx - k, "%s%lld", d ? "," : "",
			              (long long)(stride ? rest / stride : 0));
			rest = stride ? rest % stride : 0;
		}
		return tool_fail(1, "%s: element [%s] (sample %lld) is %s; the data must be finite",
		            path, idx, (long long)(t->rank ? i / (n / t->shape[0]) : 0),
		            isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf");
	}
	return 0;
}

/* Reads one (x, y) pair and checks it against the model's input and output. */
static int load_pair(const char *xp, const char *yp, const kiln_graph *g, const loss_info *L,
                     kiln_tensor **x, kiln_tensor **y)
{
	kiln_error e = {0};
	kiln_status st = kiln_npy_read(xp, x, &e);
	if (st == KILN_OK)
		st = kiln_npy_read(yp, y, &e);
	if (st != KILN_OK)
		return tool_fail_err(NULL, &e, st);
	kiln_value out = kiln_graph_output(g, 0);
	vtype in = type_of(g, kiln_graph_input(g, 0)), want = type_of(g, out);
	if (check_rows(xp, *x, -1, g, &in, false, "the model's input") || check_finite(xp, *x) ||
	    check_finite(yp, *y))
		return 1;
	char b[256];
	if (L->classify && want.rank < 2)
		return tool_fail(1, "--loss %s needs class scores [N,C,...] as the model's first output, "
		            "it is %s", L->name, type_str(g, &want, b, sizeof b));
	int64_t classes = L->classify ? want.dim[1] : 0;
	if (L->classify)
		want = class_type(want);
	char what[300];
	const char *oname = kiln_value_name(g, out);
	snprintf(what, sizeof what, "the target of '%s' for --loss %s", oname ? oname : "?", L->name);
	if (check_rows(yp, *y, (*x)->shape[0], g, &want, L->classify, what))
		return 1;
	return L->classify ? class_targets(yp, y, classes) : 0;
}

/* ---- the run ------------------------------------------------------------------- */

/* of POS_NAME; POS_UNSHUFFLED is 1 for --no-shuffle (0 in checkpoints made
 * before the flag, which always shuffled) */
enum { POS_EPOCH, POS_BATCH, POS_SEED, POS_BSIZE, POS_NTRAIN, POS_ACCUM, POS_UNSHUFFLED };

typedef struct run {
	const opts *o;
	const loss_info *L;
	kiln_graph *eval;         /* the model as loaded, exported at the end */
	kiln_trainer *tr;         /* --interp (or the fallback): the interpreter's */
	kiln_model *lib[2];       /* else the compiled step at lib_rows[k] rows: [0] the
	                             --batch one, which holds the state between steps;
	                             [1] the last short batch's, when there is one */
	int64_t lib_rows[2];
	kiln_tensor *x, *y, *vx, *vy; /* data sets (targets as the step takes them) */
	kiln_tensor *bx, *by;     /* one batch */
	int64_t *perm;            /* this epoch's order: this process's share of all */
	int64_t *all;             /* this epoch's order of the whole data set */
	int64_t n, nb;            /* samples, batches per epoch */
	int64_t nr, pb;           /* samples and batch of this process (n and --batch
	                             unless --distributed) */
	kiln_comm *comm;          /* --distributed */
	int64_t epoch, batch;     /* the next batch to run */
	int64_t first;            /* the step this process started from */
	int64_t last_ckpt;        /* step of the last checkpoint written (-1: none) */
	kiln_sched sched;
	FILE *log;
	bool tty;
	double loss_sum, step_time, val_acc; /* this epoch's, and the run's */
	int64_t seen, correct, counted;
	double t_start;           /* when this process's first step began */
	double t_drawn;           /* when the progress bar was last drawn */
	/* --plot: every step's (step, loss, lr), every evaluation's (step, acc) */
	double *c_step, *c_loss, *c_lr, *c_vstep, *c_vacc;
	int64_t c_n, c_cap, c_nv, c_vcap;
	bool c_oom;
} run;

/* Appends to --plot's curve (no-op without --plot; out of memory is
 * reported once, at the end). */
static void curve_add(run *r, double step, double loss, double lr, bool val, double acc)
{
	if (!r->o->plot || r->c_oom)
		return;
	if (r->c_n == r->c_cap) {
		int64_t cap = r->c_cap ? 2 * r->c_cap : 1024;
		double *a = realloc(r->c_step, sizeof *a * (size_t)cap);
		double *b = a ? realloc(r->c_loss, sizeof *b * (size_t)cap) : NULL;
		double *c = b ? realloc(r->c_lr, sizeof *c * (size_t)cap) : NULL;
		if (a)
			r->c_step = a;
		if (b)
			r->c_loss = b;
		if (!c) {
			r->c_oom = true;
			return;
		}
		r->c_lr = c, r->c_cap = cap;
	}
	r->c_step[r->c_n] = step, r->c_loss[r->c_n] = loss, r->c_lr[r->c_n++] = lr;
	if (!val)
		return;
	if (r->c_nv == r->c_vcap) {
		int64_t cap = r->c_vcap ? 2 * r->c_vcap : 64;
		double *a = realloc(r->c_vstep, sizeof *a * (size_t)cap);
		double *b = a ? realloc(r->c_vacc, sizeof *b * (size_t)cap) : NULL;
		if (a)
			r->c_vstep = a;
		if (!b) {
			r->c_oom = true;
			return;
		}
		r->c_vacc = b, r->c_vcap = cap;
	}
	r->c_vstep[r->c_nv] = step, r->c_vacc[r->c_nv++] = acc;
}

static int write_plot(run *r)
{
	if (!r->o->plot || !r->c_n)
		return 0;
	if (r->c_oom)
		return tool_fail(1, "out of memory keeping the curve for --plot");
	plot_curve c = {r->c_step, r->c_loss, r->c_lr, r->c_n, r->c_vstep, r->c_vacc, r->c_nv};
	return plot_curve_svg(r->o->plot, &c);
}

static int64_t step_no(const run *r)
{
	return r->epoch * r->nb + r->batch; /* steps done */
}

/* SplitMix64's output function. */
static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Epoch e's order: Fisher-Yates from the last element, j = next() mod
 * (i + 1), drawing from SplitMix64 whose state starts at
 * mix64(seed ^ mix64(e)), mix64 being SplitMix64's output function; the
 * file's order when on is false (--no-shuffle). */
static void shuffle(int64_t *perm, int64_t n, uint64_t seed, int64_t epoch, bool on)
{
	uint64_t s = mix64(seed ^ mix64((uint64_t)epoch));
	for (int64_t i = 0; i < n; i++)
		perm[i] = i;
	for (int64_t i = n - 1; on && i > 0; i--) {
		uint64_t z = mix64(s);
		s += 0x9e3779b97f4a7c15ULL;
		int64_t j = (int64_t)(z % (uint64_t)(i + 1)), t = perm[i];
		perm[i] = perm[j], perm[j] = t;
	}
}

/* This process's share of the epoch's order, by PyTorch's
 * DistributedSampler: the order padded with its own first samples to a
 * multiple of the ranks K (or cut to one, drop_last), then every K-th from
 * this rank on.  So batch b of every rank together is batch b of the
 * padded order, and one process (K = 1) takes the order as it is. */
static void sample(run *r)
{
	int k = r->comm ? r->comm->size : 1, rank = r->comm ? r->comm->rank : 0;
	for (int64_t i = 0; i < r->nr; i++) /* padding repeats the order from its start */
		r->perm[i] = r->all[(rank + i * k) % r->n];
}

/* Gathers batch b of the current order into bx, by (the last may be short). */
static void fill_batch(run *r, int64_t b)
{
	int64_t lo = b * r->pb, cnt = r->nr - lo < r->pb ? r->nr - lo : r->pb;
	size_t xrow = kiln_tensor_nbytes(r->x) / (size_t)r->n;
	size_t yrow = kiln_tensor_nbytes(r->y) / (size_t)r->n;
	for (int64_t i = 0; i < cnt; i++) {
		memcpy((char *)r->bx->data + i * xrow, (char *)r->x->data + r->perm[lo + i] * xrow, xrow);
		memcpy((char *)r->by->data + i * yrow, (char *)r->y->data + r->perm[lo + i] * yrow, yrow);
	}
	r->bx->shape[0] = r->by->shape[0] = cnt;
}

/* ---- the step: compiled, or the interpreter's ----------------------------------
 * Everything below the setup goes through these, so the loop, checkpoints,
 * resume and export are one code for both. */

/* The step's i64 state tensor called name, in place: the trainer's
 * parameter, or the compiled library's own storage. */
static int64_t *state_i64(const run *r, const char *name)
{
	if (r->tr) {
		const kiln_graph *g = kiln_trainer_graph(r->tr);
		kiln_tensor *t = kiln_param_data(g, kiln_graph_find_param(g, name));
		return t ? t->data : NULL;
	}
	kiln_tensor v;
	kiln_error e = {0};
	return kiln_model_state_view(r->lib[0], name, &v, &e) == KILN_OK ? v.data : NULL;
}

static int64_t eng_steps(const run *r)
{
	return r->tr ? kiln_trainer_steps(r->tr) : kiln_model_steps(r->lib[0]);
}

/* Copies the whole state and counters of one library into another. */
static kiln_status hand_over(kiln_model *from, kiln_model *to, kiln_error *e)
{
	kiln_tensor_set *s = kiln_model_state(from);
	kiln_status st = s ? kiln_model_set_state(to, s, e)
	                   : (snprintf(e->msg, sizeof e->msg, "out of memory"), KILN_ENOMEM);
	kiln_tensor_set_free(s);
	return st;
}

static kiln_status eng_step(run *r, double lr, double *loss, kiln_error *e)
{
	if (r->tr)
		return kiln_trainer_step(r->tr, r->bx, r->by, lr, loss, e);
	int k = r->bx->shape[0] == r->lib_rows[0] ? 0 : 1;
	if (k && (!r->lib[1] || r->bx->shape[0] != r->lib_rows[1])) {
		snprintf(e->msg, sizeof e->msg, "no compiled step for a batch of %lld rows",
		         (long long)r->bx->shape[0]);
		return KILN_EINVAL;
	}
	kiln_status st = k ? hand_over(r->lib[0], r->lib[1], e) : KILN_OK;
	kiln_grad_hook h = r->comm ? kiln_comm_grad_hook(r->comm) : (kiln_grad_hook){0};
	if (r->comm)
		r->comm->step = step_no(r) + 1;
	if (st == KILN_OK)
		st = kiln_model_train_step_hook(r->lib[k], r->bx, r->by, lr, r->comm ? &h : NULL, loss,
		                                e);
	if (st != KILN_OK && r->comm && strstr(e->msg, "gradient hook"))
		snprintf(e->msg, sizeof e->msg, "%s", r->comm->errmsg(r->comm));
	return st == KILN_OK && k ? hand_over(r->lib[1], r->lib[0], e) : st;
}

/* The eval model's first output on x, with the current state. */
static kiln_status eng_eval(run *r, const kiln_tensor *x, kiln_tensor **out, kiln_error *e)
{
	if (r->tr)
		return kiln_trainer_eval(r->tr, x, out, e);
	int n = kiln_model_num_outputs(r->lib[0]);
	kiln_tensor *outs[n + 1];
	kiln_status st = kiln_model_run(r->lib[0], (kiln_tensor *const[]){(kiln_tensor *)x}, 1, outs,
	                                n, e);
	if (st != KILN_OK)
		return st;
	*out = outs[0];
	for (int i = 1; i < n; i++)
		kiln_tensor_free(outs[i]);
	return KILN_OK;
}

static kiln_tensor_set *eng_state(const run *r)
{
	return r->tr ? kiln_trainer_state(r->tr) : kiln_model_state(r->lib[0]);
}

static kiln_status eng_save(const run *r, const char *path, kiln_error *e)
{
	return r->tr ? kiln_trainer_save(r->tr, path, e) : kiln_model_save(r->lib[0], path, e);
}

static kiln_status eng_load(run *r, const char *path, kiln_error *e)
{
	return r->tr ? kiln_trainer_load(r->tr, path, e) : kiln_model_load(r->lib[0], path, e);
}

/* ---- checkpoints ----------------------------------------------------------------- */

/* Whether name is one kiln writes, "ckpt-<step, 9 digits>.safetensors". */
static bool ckpt_name(const char *name, long long *step)
{
	char tail[32], canon[300];
	if (sscanf(name, "ckpt-%lld.%31s", step, tail) != 2 || *step < 0)
		return false;
	snprintf(canon, sizeof canon, "ckpt-%09lld.safetensors", *step);
	return !strcmp(canon, name);
}

/* Steps of DIR's "ckpt-<step>.safetensors" files, ascending; *n of them. */
static int64_t *list_ckpts(const char *dir, int *n)
{
	DIR *d = opendir(dir);
	int64_t *v = NULL;
	int cap = 0;
	*n = 0;
	for (struct dirent *e; d && (e = readdir(d));) {
		long long s;
		if (!ckpt_name(e->d_name, &s))
			continue; /* only names we write */
		if (*n == cap) {
			int64_t *nv = realloc(v, (size_t)(cap = cap * 2 + 8) * sizeof *v);
			if (!nv)
				break;
			v = nv;
		}
		int k = (*n)++;
		for (; k > 0 && v[k - 1] > s; k--)
			v[k] = v[k - 1];
		v[k] = s;
	}
	if (d)
		closedir(d);
	return v;
}

static void ckpt_path(char *buf, size_t size, const char *dir, int64_t step)
{
	snprintf(buf, size, "%s/ckpt-%09lld.safetensors", dir, (long long)step);
}

/* Writes DIR/ckpt-<step> (atomically, by the trainer), then deletes all
 * but the newest two. */
static int save_ckpt(run *r)
{
	int64_t *pos = state_i64(r, POS_NAME);
	const opts *o = r->o;
	pos[POS_EPOCH] = r->epoch, pos[POS_BATCH] = r->batch, pos[POS_SEED] = o->seed;
	pos[POS_BSIZE] = o->batch, pos[POS_NTRAIN] = r->n, pos[POS_ACCUM] = o->accum;
	pos[POS_UNSHUFFLED] = o->no_shuffle;
	char path[4096];
	ckpt_path(path, sizeof path, o->ckpt_dir, step_no(r));
	kiln_error e = {0};
	kiln_status st = eng_save(r, path, &e);
	if (st != KILN_OK)
		return tool_fail_err(NULL, &e, st);
	r->last_ckpt = step_no(r);
	int n;
	int64_t *all = list_ckpts(o->ckpt_dir, &n);
	for (int i = 0; i + 2 < n; i++) {
		ckpt_path(path, sizeof path, o->ckpt_dir, all[i]);
		unlink(path);
	}
	free(all);
	return 0;
}

/* One field of the checkpoint's position against this run's option. */
static int same(const char *ck, const char *what, int64_t saved, int64_t now)
{
	if (saved == now)
		return 0;
	return tool_fail(1, "cannot resume from '%s': it was made with %s %lld, this run has %lld", ck,
	            what, (long long)saved, (long long)now);
}

static int resume(run *r)
{
	char path[4096];
	struct stat sb;
	const char *ck = r->o->resume;
	if (stat(ck, &sb) == 0 && S_ISDIR(sb.st_mode)) {
		int n;
		int64_t *all = list_ckpts(ck, &n);
		if (n)
			ckpt_path(path, sizeof path, ck, all[n - 1]);
		free(all);
		if (!n)
			return tool_fail(1, "--resume '%s': no ckpt-<step>.safetensors in it", ck);
		ck = path;
	}
	kiln_error e = {0};
	kiln_status st = eng_load(r, ck, &e);
	if (st != KILN_OK && strstr(e.msg, ck))
		return tool_fail(1, "cannot resume: %s", e.msg);
	if (st != KILN_OK)
		return tool_fail(1, "cannot resume from '%s': %s", ck, e.msg);
	const int64_t *pos = state_i64(r, POS_NAME);
	if (same(ck, "--seed", pos[POS_SEED], r->o->seed) ||
	    same(ck, "--batch", pos[POS_BSIZE], r->o->batch) ||
	    same(ck, "--accum", pos[POS_ACCUM], r->o->accum) ||
	    same(ck, "training samples", pos[POS_NTRAIN], r->n))
		return 1;
	if (pos[POS_UNSHUFFLED] != r->o->no_shuffle)
		return tool_fail(1, "cannot resume from '%s': it was made with %s, this run has %s", ck,
		                 pos[POS_UNSHUFFLED] ? "--no-shuffle" : "--shuffle",
		                 r->o->no_shuffle ? "--no-shuffle" : "--shuffle");
	/* the position must be where the trainer's own counters say the run
	 * is: (epoch * batches + batch) steps, one optimizer update per --accum */
	if (pos[POS_EPOCH] < 0 || pos[POS_BATCH] < 0 || pos[POS_BATCH] >= r->nb ||
	    pos[POS_EPOCH] > (INT64_MAX - pos[POS_BATCH]) / r->nb ||
	    (pos[POS_EPOCH] * r->nb + pos[POS_BATCH]) / r->o->accum != eng_steps(r))
		return tool_fail(1, "cannot resume from '%s': bad position (epoch %lld, batch %lld) for "
		            "%lld batches per epoch and %lld optimizer steps taken", ck,
		            (long long)pos[POS_EPOCH], (long long)pos[POS_BATCH], (long long)r->nb,
		            (long long)eng_steps(r));
	r->epoch = pos[POS_EPOCH], r->batch = pos[POS_BATCH];
	r->last_ckpt = step_no(r);
	if (!r->o->quiet)
		printf("resumed from %s at step %lld (epoch %lld, batch %lld)\n", ck,
		       (long long)step_no(r), (long long)r->epoch + 1, (long long)r->batch);
	return 0;
}

/* ---- the CSV curve ---------------------------------------------------------------- */

/* A failed write to the log is an error, never a shorter curve. */
static int log_error(run *r, const char *what)
{
	int e = errno ? errno : EIO;
	return tool_fail(1, "cannot write --log '%s' (%s): %s", r->o->log, what, strerror(e));
}

/* Keeps the header and the rows up to step `upto` of an existing log,
 * written to a temporary, fsynced and renamed over it.  Only a regular file
 * is read back: a FIFO or device given as --log is never waited on here. */
static int trim_log(run *r, const char *path, int64_t upto)
{
	struct stat sb;
	if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
		return 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	char tmp[4096], line[1024];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *w = fopen(tmp, "w");
	if (!w) {
		fclose(f);
		return tool_fail(1, "cannot write '%s': %s", tmp, strerror(errno));
	}
	bool ok = true;
	for (bool first = true; ok && fgets(line, sizeof line, f); first = false) {
		long long s;
		long long ep;
		double lr, loss, acc;
		int k = first ? 0 : sscanf(line, "%lld,%lld,%lf,%lf,%lf", &s, &ep, &lr, &loss, &acc);
		if (first || (k >= 1 && s <= upto)) {
			ok = fputs(line, w) >= 0;
			if (k >= 4) /* the steps before the checkpoint, for --plot */
				curve_add(r, (double)s, loss, lr, k == 5, acc);
		}
	}
	if (ferror(f)) { /* a read error must not cut the curve short */
		int e = errno;
		fclose(f), fclose(w), unlink(tmp);
		return tool_fail(1, "cannot read --log '%s': %s", path, strerror(e ? e : EIO));
	}
	fclose(f);
	errno = 0;
	ok = ok && fflush(w) == 0 && fsync(fileno(w)) == 0;
	int e = errno;
	ok = (fclose(w) == 0) & ok;
	if (ok && rename(tmp, path) == 0)
		return files_sync_dir(path);
	e = e ? e : errno;
	unlink(tmp);
	return tool_fail(1, "cannot rewrite --log '%s': %s", path, strerror(e ? e : EIO));
}

static int open_log(run *r)
{
	const char *path = r->o->log;
	struct stat sb;
	if (!path)
		return 0;
	/* a device or pipe (/dev/stdout) has nothing to cut back */
	bool regular = stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
	errno = 0;
	if (r->o->resume && regular) {
		if (trim_log(r, path, step_no(r)))
			return 1;
		r->log = fopen(path, "a");
	} else if ((r->log = fopen(path, "w"))) {
		fprintf(r->log, "step,epoch,lr,loss%s\n", r->vx ? ",val_acc" : "");
	}
	if (!r->log)
		return tool_fail(1, "cannot write --log '%s': %s", path, strerror(errno));
	return ferror(r->log) || fflush(r->log) ? log_error(r, "the header") : 0;
}

/* Closes the log; 1 after a message when what it held did not reach it. */
static int close_log(run *r)
{
	if (!r->log)
		return 0;
	errno = 0;
	bool bad = ferror(r->log) || fflush(r->log) != 0;
	int e = errno;
	bad = (fclose(r->log) != 0) | bad;
	r->log = NULL;
	errno = e ? e : errno;
	return bad ? log_error(r, "closing it") : 0;
}

/* ---- evaluation ------------------------------------------------------------------- */

/* Rows of y (class targets, [n, d...]) that out ([n, C, d...]) gets right. */
static int64_t count_correct(const kiln_tensor *out, const int64_t *y, int64_t n)
{
	int64_t C = out->shape[1], inner = kiln_tensor_numel(out) / (n * C), hits = 0;
	for (int64_t i = 0; i < n; i++)
		for (int64_t j = 0; j < inner; j++) {
			int64_t best = 0;
			for (int64_t c = 1; c < C; c++)
				if (kiln_tensor_get(out, (i * C + c) * inner + j) >
				    kiln_tensor_get(out, (i * C + best) * inner + j))
					best = c;
			hits += best == y[i * inner + j];
		}
	return hits;
}

/* Accuracy of the eval model on (x, y); keep (may be NULL) gets every
 * output row of the model's first output. */
static int accuracy(run *r, const kiln_tensor *x, const kiln_tensor *y, double *acc,
                    kiln_tensor **keep)
{
	int64_t n = x->shape[0], hits = 0;
	size_t xrow = kiln_tensor_nbytes(x) / (size_t)n, orow = 0;
	for (int64_t lo = 0; lo < n; lo += EVAL_CHUNK) {
		kiln_tensor view = *x, *out = NULL;
		view.shape[0] = n - lo < EVAL_CHUNK ? n - lo : EVAL_CHUNK;
		view.data = (char *)x->data + lo * xrow;
		kiln_error e = {0};
		kiln_status st = eng_eval(r, &view, &out, &e);
		if (st != KILN_OK)
			return tool_fail_err(NULL, &e, st);
		hits += count_correct(out, (const int64_t *)y->data + lo * (kiln_tensor_numel(y) / n),
		                      view.shape[0]);
		if (keep && !*keep) {
			int64_t shape[KILN_MAX_RANK];
			memcpy(shape, out->shape, sizeof shape);
			shape[0] = n;
			orow = kiln_tensor_nbytes(out) / (size_t)view.shape[0];
			*keep = kiln_tensor_new(out->dtype, out->rank, shape);
		}
		if (keep && *keep)
			memcpy((char *)(*keep)->data + lo * orow, out->data, kiln_tensor_nbytes(out));
		kiln_tensor_free(out);
	}
	*acc = (double)hits / (double)kiln_tensor_numel(y);
	return keep && !*keep ? tool_fail(1, "out of memory") : 0;
}

/* ---- the loop ------------------------------------------------------------------- */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* "1:05" or "1:02:03" */
static void hms(char *buf, size_t size, double secs)
{
	long long t = secs > 0 && secs < 1e9 ? (long long)(secs + 0.5) : 0;
	if (t >= 3600)
		snprintf(buf, size, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
	else
		snprintf(buf, size, "%lld:%02lld", t / 60, t % 60);
}

/* The bar, with this process's rate (steps and samples per second of wall
 * time since its first step) and the time the remaining steps would take
 * at that rate. */
static void progress(const run *r, double loss)
{
	int width = 24, done = (int)((r->batch + 1) * width / r->nb);
	int64_t ran = step_no(r) + 1 - r->first, left = r->o->epochs * r->nb - step_no(r) - 1;
	double wall = now() - r->t_start, sps = wall > 0 ? (double)ran / wall : 0;
	char eta[32];
	hms(eta, sizeof eta, sps > 0 ? (double)left / sps : 0);
	fprintf(stderr, "\r\033[Kepoch %lld/%lld [%.*s%*s] %lld/%lld loss %.4f | %.1f step/s, "
	        "%.0f samples/s, ETA %s", (long long)r->epoch + 1, (long long)r->o->epochs, done,
	        "########################", width - done, "", (long long)r->batch + 1,
	        (long long)r->nb, loss, sps, sps * (double)r->bx->shape[0], eta);
	fflush(stderr);
}

static void epoch_summary(run *r, int64_t epoch, double secs)
{
	if (r->tty)
		fputs("\r\033[K", stderr);
	printf("epoch %lld/%lld: loss %.4f", (long long)epoch + 1, (long long)r->o->epochs,
	       r->loss_sum / (double)r->seen);
	if (r->L->classify)
		printf(", acc %.2f%%", 100.0 * (double)r->correct / (double)r->counted);
	if (r->vx)
		printf(", val_acc %.2f%%", 100.0 * r->val_acc);
	printf(" (%.1f s)\n", secs);
	fflush(stdout);
	r->loss_sum = 0, r->seen = r->correct = r->counted = 0;
}

/* Runs batch r->batch of the current epoch and logs it. */
static int one_step(run *r)
{
	fill_batch(r, r->batch);
	double lr = kiln_sched_lr(&r->sched, eng_steps(r)), loss = 0, t0 = now();
	kiln_error e = {0};
	kiln_status st = eng_step(r, lr, &loss, &e);
	r->step_time += now() - t0;
	if (st != KILN_OK)
		return tool_fail(1, "step %lld: %s", (long long)step_no(r) + 1, e.msg);
	int64_t rows = r->bx->shape[0], correct = r->L->classify ? *state_i64(r, CORRECT_NAME) : 0;
	if (r->comm) { /* the global batch's loss and counts: every rank's rows */
		double v[3] = {loss, (double)correct, (double)rows};
		if ((st = r->comm->allreduce_sum(r->comm, v, 3, KILN_F64)) != KILN_OK)
			return tool_fail(1, "step %lld: %s", (long long)step_no(r) + 1,
			                 r->comm->errmsg(r->comm));
		loss = v[0] / r->comm->size, correct = (int64_t)v[1], rows = (int64_t)v[2];
	}
	if (!isfinite(loss))
		return tool_fail(1, "step %lld: the loss is %g (lower --lr, or --clip-norm?)",
		            (long long)step_no(r) + 1, loss);
	r->loss_sum += loss * (double)rows;
	r->seen += rows;
	if (r->L->classify) {
		r->correct += correct;
		r->counted += kiln_tensor_numel(r->by) / r->bx->shape[0] * rows;
	}
	bool last = r->batch + 1 == r->nb;
	if (last && r->vx && accuracy(r, r->vx, r->vy, &r->val_acc, NULL))
		return 1;
	curve_add(r, (double)step_no(r) + 1, loss, lr, last && r->vx, r->val_acc);
	if (r->log) {
		errno = 0;
		fprintf(r->log, "%lld,%lld,%.17g,%.17g", (long long)step_no(r) + 1,
		        (long long)r->epoch + 1, lr, loss);
		if (r->vx)
			fprintf(r->log, last ? ",%.6f\n" : ",\n", r->val_acc);
		else
			fputc('\n', r->log);
		if (ferror(r->log) || fflush(r->log) != 0) {
			char what[64];
			snprintf(what, sizeof what, "step %lld", (long long)step_no(r) + 1);
			return log_error(r, what);
		}
	}
	/* the bar at most 20 times a second: a small model's steps take
	 * microseconds, and drawing each one would cost more than the step */
	if (r->tty && (last || now() - r->t_drawn >= 0.05)) {
		progress(r, loss);
		r->t_drawn = now();
	}
	return 0;
}

/* 0: done; 1: failed; -1: stopped by --stop-after. */
static int train_loop(run *r)
{
	const opts *o = r->o;
	while (r->epoch < o->epochs) {
		double t0 = now();
		int64_t epoch = r->epoch;
		shuffle(r->all, r->n, (uint64_t)o->seed, epoch, !o->no_shuffle);
		sample(r);
		while (r->epoch == epoch) {
			if (step_no(r) == o->stop_after)
				return -1;
			if (one_step(r))
				return 1;
			if (++r->batch == r->nb)
				r->epoch++, r->batch = 0;
			if (o->every && step_no(r) % o->every == 0 && save_ckpt(r))
				return 1;
		}
		if (!o->quiet)
			epoch_summary(r, epoch, now() - t0);
		if (write_plot(r)) /* every epoch, so a run cut short leaves its picture */
			return 1;
	}
	return 0;
}

/* ---- setup, export and the command ------------------------------------------------- */

/* An ONNX model with neither BatchNorm nor Dropout is often an eval-mode
 * export that folded or dropped them: say how to keep them (one line). */
static void training_export_hint(const char *path, const kiln_graph *g)
{
	kiln_op_count h[KILN_OP_KINDS];
	int n = kiln_file_sniff(path) != KILN_FILE_ONNX ? -1
	        : kiln_graph_op_histogram(g, h, KILN_OP_KINDS, NULL);
	for (int i = 0; i < n; i++)
		if (!strcmp(h[i].op, "batch_norm") || !strcmp(h[i].op, "dropout"))
			return;
	if (n >= 0)
		fprintf(stderr, "kiln: note: %s has no BatchNormalization and no Dropout; an eval-mode "
		        "torch.onnx.export folds BatchNorm into the convolutions and drops Dropout, so to "
		        "train with them export with training=torch.onnx.TrainingMode.TRAINING, "
		        "do_constant_folding=False\n", path);
}

static int load_model(const char *path, kiln_graph **g, bool quiet)
{
	kiln_error e = {0};
	kiln_graph *inf = NULL;
	kiln_status st = kiln_graph_load_any(path, g, &e);
	if (st == KILN_OK)
		st = kiln_graph_verify(*g, &e);
	/* a training-mode export trains, evaluates and exports as the
	 * inference model it stands for (running stats, Dropout off) */
	if (st == KILN_OK && (st = kiln_inference_graph_from_train(*g, &inf, NULL, &e)) == KILN_OK) {
		kiln_graph_free(*g);
		*g = inf;
	}
	if (st != KILN_OK) {
		kiln_graph_free(*g);
		*g = NULL;
	}
	if (st != KILN_OK)
		return strstr(e.msg, path) ? tool_fail_err(NULL, &e, st) : tool_fail(1, "%s: %s", path, e.msg);
	const kiln_graph *m = *g;
	for (int i = 0; i < kiln_graph_num_outputs(m); i++) {
		const char *name = kiln_value_name(m, kiln_graph_output(m, i));
		size_t n = name ? strlen(name) : 0;
		if (n > 5 && !strcmp(name + n - 5, ".next"))
			return tool_fail(1, "%s: output '%s' is a state update, so the model was traced in train "
			            "mode; kiln train needs the inference-mode model", path, name);
	}
	for (int i = 0; i < kiln_graph_num_params(m); i++) {
		kiln_value p = kiln_graph_param(m, i);
		const kiln_tensor *t = kiln_param_data(m, p);
		if (!t || !kiln_dtype_is_float(t->dtype))
			continue;
		const char *name = kiln_value_name(m, p);
		for (int64_t k = 0; k < kiln_tensor_numel(t); k++)
			if (!isfinite(kiln_tensor_get(t, k)))
				return tool_fail(1, "%s: parameter '%s' is not finite (element %lld is %g)", path,
				            name ? name : "?", (long long)k, kiln_tensor_get(t, k));
	}
	char b[256];
	int nin = kiln_graph_num_inputs(m), nout = kiln_graph_num_outputs(m);
	kiln_value in = nin == 1 ? kiln_graph_input(m, 0) : KILN_NONE;
	if (!in || nout < 1)
		return tool_fail(1, "%s: kiln train needs one input and at least one output, the model "
		            "has %d and %d", path, nin, nout);
	if (kiln_value_rank(m, in) < 1 || kiln_value_dim(m, in, 0) >= 0)
		return tool_fail(1, "%s: input '%s' is %s; kiln train needs a symbolic batch dim first "
		            "(e.g. dynamic_axes in torch.onnx.export)", path, kiln_value_name(m, in),
		            kiln_value_type_str(m, in, b, sizeof b));
	if (!quiet)
		training_export_hint(path, m);
	return 0;
}

/* Before anything loads or trains: no output is an input or another
 * output, none is a checkpoint's name inside --checkpoint (those are written
 * and deleted there), and every destination takes files, so that a bad
 * --export or --checkpoint fails now and not after the last epoch. */
static int check_files(const opts *o)
{
	struct stat sb;
	bool resume_dir = o->resume && stat(o->resume, &sb) == 0 && S_ISDIR(sb.st_mode);
	size_t n = o->export_path ? strlen(o->export_path) : 0;
	bool kir = n > 4 && !strcmp(o->export_path + n - 4, ".kir");
	char *side = files_model_sidecar(o->model);
	char *eside = kir ? files_swap_ext(o->export_path, ".kir", ".safetensors") : NULL;
	tool_file in[] = {{"the model", o->model, NULL}, {"the model", side, " (its weights)"},
	                  {"--x", o->x, NULL}, {"--y", o->y, NULL}, {"--val-x", o->val_x, NULL},
	                  {"--val-y", o->val_y, NULL},
	                  {"--resume", resume_dir ? NULL : o->resume, NULL}};
	tool_file out[] = {{"--log", o->log, NULL}, {"--plot", o->plot, NULL},
	                   {"--val-out", o->val_out, NULL},
	                   {"--export", o->export_path, NULL},
	                   {"--export", eside, " (the weights written beside it)"}};
	int nin = sizeof in / sizeof *in, nout = sizeof out / sizeof *out;
	int rc = files_check_clash(in, nin, out, nout);
	for (int k = 0; !rc && o->ckpt_dir && k < nin - 1 + nout; k++) {
		const tool_file *f = k < nin - 1 ? &in[k] : &out[k - nin + 1]; /* not --resume */
		const char *base = f->path ? strrchr(f->path, '/') : NULL;
		long long step;
		if (f->path && ckpt_name(base ? base + 1 : f->path, &step) &&
		    files_in_dir(f->path, o->ckpt_dir))
			rc = tool_fail(1, "%s '%s' is a checkpoint's name inside --checkpoint '%s', where "
			          "checkpoints are written and the older ones deleted", f->flag, f->path,
			          o->ckpt_dir);
	}
	for (int k = 0; !rc && k < nout; k++)
		rc = out[k].path && files_check_dest(out[k].flag, out[k].path, k == 0);
	if (!rc && o->ckpt_dir)
		rc = files_check_dir("--checkpoint", o->ckpt_dir);
	free(side);
	free(eside);
	return rc;
}

/* The step's state from the model: each state tensor the train graph has
 * as a parameter (weights, BatchNorm buffers) takes its data, the rest
 * (optimizer state, counters) starts at zero, as kiln_trainer starts. */
static kiln_status initial_state(kiln_model *m, const kiln_graph *tg, kiln_error *e)
{
	kiln_tensor_set *s = kiln_model_state(m);
	if (!s) {
		snprintf(e->msg, sizeof e->msg, "out of memory");
		return KILN_ENOMEM;
	}
	for (int i = 0; i < s->count; i++) {
		kiln_tensor *t = s->items[i].tensor;
		const kiln_tensor *d = kiln_param_data(tg, kiln_graph_find_param(tg, s->items[i].name));
		if (d && kiln_tensor_nbytes(d) == kiln_tensor_nbytes(t) && d->dtype == t->dtype)
			memcpy(t->data, d->data, kiln_tensor_nbytes(t));
		else
			memset(t->data, 0, kiln_tensor_nbytes(t));
	}
	kiln_status st = kiln_model_set_state(m, s, e);
	kiln_tensor_set_free(s);
	return st;
}

/* One compiled step of rows rows into r->lib[k], from the cache when it
 * is there. */
static kiln_status compile_step(run *r, const kiln_graph *tg, const kiln_train_opts *to, int k,
                                int64_t rows, kiln_error *e)
{
	driver_cache_info info;
	double t0 = now();
	kiln_status st = driver_train_lib(tg, r->eval, to, rows, NULL, &r->lib[k], &info, e);
	if (st != KILN_OK)
		return st;
	r->lib_rows[k] = rows;
	if (info.rebuilt)
		fprintf(stderr, "kiln: note: cached train step '%s' was damaged; compiled it again\n",
		        info.path);
	if (!r->o->quiet)
		printf("train step for batch %lld: %s%s (%.1f s)\n", (long long)rows,
		       info.hit ? "from the cache, " : "compiled",
		       info.hit ? info.path : info.path[0] ? ", cached" : "", now() - t0);
	st = kiln_model_set_threads(r->lib[k], (int)r->o->threads, e);
	if (st == KILN_OK && r->comm)
		st = kiln_model_set_bucket_bytes(r->lib[k], (int64_t)(r->o->bucket_mb * 1048576.0), e);
	return st == KILN_OK && k == 0 ? initial_state(r->lib[0], tg, e) : st;
}

/* The compiled step: one library for --batch rows and, when the data ends
 * in a short batch, one for that; a model the compiler cannot take falls
 * back to the interpreter (r->lib[0] stays NULL) with one line saying why. */
static kiln_status compiled(run *r, const kiln_graph *tg, const kiln_train_opts *to,
                            kiln_error *e)
{
	int64_t rows = r->pb < r->nr ? r->pb : r->nr, tail = r->nr % rows;
	kiln_status st = compile_step(r, tg, to, 0, rows, e);
	if (st == KILN_OK && tail)
		st = compile_step(r, tg, to, 1, tail, e);
	if (st == KILN_OK || st == KILN_ENOMEM)
		return st;
	char why[sizeof e->msg];
	snprintf(why, sizeof why, "%s", e->msg[0] ? e->msg : kiln_status_str(st));
	for (char *c = why; *c; c++)
		*c = *c == '\n' ? ' ' : *c;
	fprintf(stderr, "kiln: note: the train step cannot be compiled (%s); training through the "
	        "interpreter instead (as --interp)\n", why);
	kiln_model_free(r->lib[0]), kiln_model_free(r->lib[1]);
	r->lib[0] = r->lib[1] = NULL;
	*e = (kiln_error){0};
	return KILN_OK;
}

static int setup(run *r, const opts *o)
{
	kiln_train_opts to;
	int rc = train_opts(o, &r->L, &to);
	if (rc || load_model(o->model, &r->eval, o->quiet))
		return rc ? rc : 1;
	if (load_pair(o->x, o->y, r->eval, r->L, &r->x, &r->y) ||
	    (o->val_x && load_pair(o->val_x, o->val_y, r->eval, r->L, &r->vx, &r->vy)))
		return 1;
	r->n = r->x->shape[0];
	if (r->n < 1)
		return tool_fail(1, "%s has no samples", o->x);
	/* before any batch buffer is allocated: an explicit --batch larger than
	 * the data is a mistake; the default 32 on a smaller data set makes one
	 * short batch, as DataLoader does (buffers hold at most the data) */
	if (o->batch > r->n && o->batch_set)
		return tool_fail(TOOLS_EXIT_USAGE, "--batch %lld is more than the %lld samples in %s: pass "
		            "--batch %lld or less", (long long)o->batch, (long long)r->n, o->x,
		            (long long)r->n);
	int k = r->comm ? r->comm->size : 1;
	if (o->batch % k)
		return tool_fail(TOOLS_EXIT_USAGE, "--batch %lld is the global batch: the %d ranks must "
		                 "divide it", (long long)o->batch, k);
	if (r->n < k)
		return tool_fail(1, "%s has %lld samples, fewer than the %d ranks", o->x,
		                 (long long)r->n, k);
	r->pb = o->batch / k;
	r->nr = o->drop_last ? r->n / k : (r->n + k - 1) / k; /* DistributedSampler's num_samples */
	r->nb = (r->nr + r->pb - 1) / r->pb;
	if (o->accum > r->nb * o->epochs)
		return tool_fail(TOOLS_EXIT_USAGE, "--accum %lld is more than the run's %lld steps (%lld "
		            "epoch(s) of %lld batches): no optimizer update would happen",
		            (long long)o->accum, (long long)(r->nb * o->epochs), (long long)o->epochs,
		            (long long)r->nb);
	if (parse_sched(o, r->nb * o->epochs / o->accum, &r->sched))
		return TOOLS_EXIT_USAGE;
	kiln_error e = {0};
	kiln_graph *tg = train_graph(r->eval, o, r->L, o->sync_bn ? k : 1, &e);
	kiln_status st = tg ? KILN_OK : e.code;
	if (tg && !o->interp)
		st = compiled(r, tg, &to, &e);
	if (st == KILN_OK && !r->lib[0])
		st = kiln_trainer_new(tg, r->eval, &to, &r->tr, &e);
	kiln_graph_free(tg);
	if (st != KILN_OK)
		return e.msg[0] && strstr(e.msg, o->model) ? tool_fail_err(NULL, &e, st)
		       : tool_fail(1, "%s: %s", o->model, e.msg[0] ? e.msg : kiln_status_str(st));
	int64_t bshape[KILN_MAX_RANK];
	memcpy(bshape, r->x->shape, sizeof bshape);
	bshape[0] = r->pb < r->nr ? r->pb : r->nr;
	r->bx = kiln_tensor_new(r->x->dtype, r->x->rank, bshape);
	memcpy(bshape, r->y->shape, sizeof bshape);
	bshape[0] = r->pb < r->nr ? r->pb : r->nr;
	r->by = kiln_tensor_new(r->y->dtype, r->y->rank, bshape);
	r->perm = malloc((size_t)r->nr * sizeof *r->perm);
	r->all = malloc((size_t)r->n * sizeof *r->all);
	if (!r->bx || !r->by || !r->perm || !r->all)
		return tool_fail(1, "out of memory");
	if (o->ckpt_dir && mkdir(o->ckpt_dir, 0777) != 0 && errno != EEXIST)
		return tool_fail(1, "cannot create '%s': %s", o->ckpt_dir, strerror(errno));
	return 0;
}

/* The inference model with the trained parameters and buffers. */
static int export_model(run *r, const char *path)
{
	kiln_tensor_set *s = eng_state(r);
	if (!s)
		return tool_fail(1, "out of memory");
	kiln_graph *g = r->eval;
	for (int i = 0; i < kiln_graph_num_params(g); i++) {
		kiln_value p = kiln_graph_param(g, i);
		const char *name = kiln_value_name(g, p);
		kiln_tensor *d = kiln_param_data(g, p);
		const kiln_tensor *t = name && d ? kiln_tensor_set_get(s, name) : NULL;
		if (t && kiln_tensor_nbytes(t) == kiln_tensor_nbytes(d))
			memcpy(d->data, t->data, kiln_tensor_nbytes(t));
	}
	kiln_tensor_set_free(s);
	size_t n = strlen(path);
	bool kir = n > 4 && !strcmp(path + n - 4, ".kir");
	kiln_error e = {0};
	kiln_status st = kir ? kiln_graph_save(g, path, &e) : kiln_onnx_export(g, path, &e);
	if (st != KILN_OK)
		return tool_fail(1, "--export '%s': %s", path, e.msg[0] ? e.msg : kiln_status_str(st));
	if (!r->o->quiet)
		printf("exported %s\n", path);
	return 0;
}

static int write_val_out(run *r, const char *path)
{
	kiln_tensor *out = NULL;
	kiln_error e = {0};
	kiln_status st;
	int rc = accuracy(r, r->vx, r->vy, &r->val_acc, &out);
	if (!rc && (st = kiln_npy_write(path, out, &e)) != KILN_OK)
		rc = tool_fail_err(NULL, &e, st);
	kiln_tensor_free(out);
	return rc;
}

static int finish(run *r)
{
	const opts *o = r->o;
	int64_t steps = step_no(r);
	if (o->ckpt_dir && r->last_ckpt != steps && save_ckpt(r))
		return 1;
	if (!o->quiet) {
		int64_t ran = steps - r->first;
		printf("trained %lld steps (%lld updates)", (long long)steps,
		       (long long)eng_steps(r));
		if (ran > 0)
			printf(", %.2f ms/step", 1e3 * r->step_time / (double)ran);
		if (r->vx)
			printf(", val_acc %.2f%%", 100.0 * r->val_acc);
		printf("\n");
	}
	if (o->val_out && write_val_out(r, o->val_out))
		return 1;
	return o->export_path ? export_model(r, o->export_path) : 0;
}

static void run_free(run *r)
{
	kiln_trainer_free(r->tr);
	kiln_model_free(r->lib[0]), kiln_model_free(r->lib[1]);
	kiln_graph_free(r->eval);
	kiln_tensor_free(r->x), kiln_tensor_free(r->y), kiln_tensor_free(r->vx);
	kiln_tensor_free(r->vy), kiln_tensor_free(r->bx), kiln_tensor_free(r->by);
	free(r->perm), free(r->all);
	free(r->c_step), free(r->c_loss), free(r->c_lr), free(r->c_vstep), free(r->c_vacc);
	if (r->log)
		fclose(r->log); /* after a failure; success closes it with close_log */
}

/* ---- --distributed ------------------------------------------------------------------ */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ULL;
	return h;
}

/* Every rank must train the same model with the same options: a hash of
 * the command line and the model file's bytes, checked against rank 0's
 * before any work, so a mismatch fails every rank naming the ones that
 * differ instead of diverging silently. */
static int check_same(kiln_comm *c, int argc, char **argv, const opts *o)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	for (int i = 0; i < argc; i++)
		h = fnv(h, argv[i], strlen(argv[i]) + 1);
	FILE *f = o->model ? fopen(o->model, "rb") : NULL;
	char buf[65536];
	size_t n;
	while (f && (n = fread(buf, 1, sizeof buf, f)) > 0)
		h = fnv(h, buf, n);
	if (f)
		fclose(f);
	uint64_t h0 = h;
	int64_t *bad = calloc((size_t)c->size, sizeof *bad);
	if (!bad)
		return tool_fail(1, "out of memory");
	kiln_status st = c->broadcast(c, &h0, sizeof h0, 0);
	bad[c->rank] = h0 != h;
	if (st == KILN_OK)
		st = c->allreduce_sum(c, bad, c->size, KILN_I64);
	if (st != KILN_OK) {
		free(bad);
		return tool_fail(1, "--distributed: %s", c->errmsg(c));
	}
	char who[256] = "";
	size_t len = 0;
	for (int i = 0; i < c->size; i++)
		if (bad[i] && len < sizeof who - 16)
			len += (size_t)snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", i);
	free(bad);
	if (len)
		return tool_fail(1, "--distributed: rank%s %s %s a different model or options than "
		                 "rank 0 (hash of the command line and the model file)",
		                 strchr(who, ',') ? "s" : "", who, strchr(who, ',') ? "have" : "has");
	return 0;
}

/* Rank 0's state (the initial weights, or its resumed checkpoint) to every
 * rank, as DDP broadcasts the module's parameters at construction. */
static int broadcast_state(run *r)
{
	kiln_tensor_set *s = kiln_model_state(r->lib[0]);
	kiln_error e = {0};
	kiln_status st = s ? KILN_OK : KILN_ENOMEM;
	for (int i = 0; st == KILN_OK && i < s->count; i++)
		st = r->comm->broadcast(r->comm, s->items[i].tensor->data,
		                        (int64_t)kiln_tensor_nbytes(s->items[i].tensor), 0);
	if (st != KILN_OK)
		snprintf(e.msg, sizeof e.msg, "%s", s ? r->comm->errmsg(r->comm) : "out of memory");
	else
		st = kiln_model_set_state(r->lib[0], s, &e);
	kiln_tensor_set_free(s);
	return st == KILN_OK ? 0 : tool_fail(1, "--distributed: broadcasting the state: %s", e.msg);
}

/* Ranks other than 0 train silently: no log, curve, checkpoint or export. */
static void follower(opts *o)
{
	o->quiet = true;
	o->log = o->plot = o->export_path = o->val_out = o->ckpt_dir = NULL;
	o->every = 0;
}

/* A finished rank finalizes.  A failed one abandons the communicator (its
 * peers may be stuck in a collective, and finalizing would wait for them)
 * and exits with rc: mpirun then ends the other ranks. */
static int end_comm(run *r, int rc)
{
	if (r->comm && rc) {
		fflush(stdout);
		fflush(stderr);
		r->comm->abandon(r->comm);
	} else if (r->comm) {
		r->comm->close(r->comm);
	}
	r->comm = NULL;
	return rc;
}

static int open_comm(run *r, opts *o, int argc, char **argv)
{
#ifdef KILN_HAVE_MPI
	kiln_error e = {0};
	kiln_status st = kiln_comm_mpi_open(NULL, NULL, o->comm_timeout, &r->comm, &e);
	if (st != KILN_OK)
		return tool_fail(1, "--distributed: %s", e.msg[0] ? e.msg : kiln_status_str(st));
	if (r->comm->rank != 0)
		follower(o);
	r->tty = !o->quiet && isatty(2);
	if (!o->quiet)
		printf("distributed: %d ranks, global batch %lld (%lld per rank)\n", r->comm->size,
		       (long long)o->batch, (long long)(o->batch / r->comm->size));
	return check_same(r->comm, argc, argv, o);
#else
	(void)r, (void)o, (void)argc, (void)argv;
	return tool_fail(1, "--distributed: this kiln was built without MPI (install "
	                 "libopenmpi-dev and openmpi-bin: scripts/install-deps.sh, then build again)");
#endif
}

int cmd_train(int argc, char **argv)
{
	opts o;
	int rc = parse_args(argc, argv, &o);
	if (rc || (rc = check_files(&o)))
		return rc;
	run r = {.o = &o, .last_ckpt = -1, .tty = !o.quiet && isatty(2)};
	if (o.distributed && (rc = open_comm(&r, &o, argc, argv)))
		return end_comm(&r, rc);
	rc = setup(&r, &o);
	if (!rc && o.resume)
		rc = resume(&r);
	if (!rc && r.comm)
		rc = broadcast_state(&r);
	r.first = step_no(&r);
	r.t_start = now();
	if (!rc)
		rc = open_log(&r);
	if (!rc && (rc = train_loop(&r)) < 0) {
		if (r.tty)
			fputs("\r\033[K", stderr);
		fprintf(stderr, "kiln: stopped before step %lld (--stop-after)\n",
		        (long long)step_no(&r) + 1);
		rc = close_log(&r);
	} else if (!rc) {
		rc = close_log(&r);
		if (!rc)
			rc = finish(&r);
	}
	run_free(&r);
	return end_comm(&r, rc);
}
