/*
 * tools.h: what the files of the `kiln` CLI share, private to tools/.
 *
 * tools/kiln.c holds the dispatch table; each bigger subcommand lives in its
 * own file and exports its entry point and help text here, which kiln.c
 * lists as one table entry:
 *
 *     {"train", cmd_train, cmd_train_usage, cmd_train_summary},
 *
 * An entry point gets the arguments after the subcommand's name, prints
 * failures as one "kiln: error: ..." line on stderr and returns the exit
 * status: 0, 1 when the work failed, 2 (TOOLS_EXIT_USAGE) for a bad command
 * line.  `--help` never reaches it: kiln.c prints the usage text itself.
 */
#ifndef KILN_TOOLS_H
#define KILN_TOOLS_H

#include <stdbool.h>

#include "driver/driver.h"

enum { TOOLS_EXIT_USAGE = 2 };

/* ---- fail.c ------------------------------------------------------------- */

/* The CLI's one error helper: one "kiln: error: ..." line on stderr;
 * returns code (1, or TOOLS_EXIT_USAGE for a bad command line). */
int tool_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A library error as that line: e's message (the status name when it has
 * none), prefixed with "path: " when path is given and the message does
 * not already name it; returns 1. */
int tool_fail_err(const char *path, const kiln_error *e, kiln_status st);

/* Option readers: an option's value ("--name=V", or "--name V" / "-x V"
 * from the next argument; NULL when it has none); whether a is the option
 * (either spelling); a whole string as a number (false otherwise). */
const char *tool_optval(int argc, char **argv, int *i, const char *lng, const char *shrt);
bool tool_is_opt(const char *a, const char *lng, const char *shrt);
bool tool_num(const char *s, double *v);
/* The CPUs this process may run on (sched_getaffinity, else the online
 * ones; at most 256): the default --threads of `kiln run` and `kiln
 * train`, as ONNX Runtime and PyTorch use every core. */
int tool_cpus(void);

/* ---- files.c ------------------------------------------------------------ */

/* A file a command reads or writes, for the checks below: the flag that
 * named it ("--x", "-o", "the model"), its path, and what it is when the
 * command derives it ("the header written beside it"). */
typedef struct tool_file {
	const char *flag, *path, *note;
} tool_file;

/* 1 after one "kiln: error:" line naming both flags when an output is the
 * same file as an input or as another output (by st_dev/st_ino, so links
 * and other spellings of a name count); 0 otherwise.  NULL paths are
 * skipped. */
int files_check_clash(const tool_file *in, int nin, const tool_file *out, int nout);
/* Whether a and b are (or would be) one file; whether file lies in dir. */
bool files_same(const char *a, const char *b);
bool files_in_dir(const char *file, const char *dir);
/* Before any work: path can be written (its folder exists and takes a new
 * file; path is not a folder, nor, unless stream, a device that a rename
 * would replace).  stream: written in place (a log), so an existing file
 * must open for writing.  1 after an error line naming flag. */
int files_check_dest(const char *flag, const char *path, bool stream);
/* dir is a writable folder, or can be made (its parent takes it). */
int files_check_dir(const char *flag, const char *dir);
/* path with ext (if it ends so) replaced by with, malloc'd. */
char *files_swap_ext(const char *path, const char *ext, const char *with);
/* The weights file a model file brings with it (FILE.safetensors beside a
 * .kir graph, judged by content), malloc'd; NULL for other models. */
char *files_model_sidecar(const char *model);
/* After a rename into path: fsyncs its folder (1 after a message if that
 * fails; a folder that will not open is skipped, as rt_write_atomic does). */
int files_sync_dir(const char *path);
/* Flushes stdout: 1 after an error line when anything printed was lost. */
int files_finish_stdout(void);

/* ---- plot.c ------------------------------------------------------------- */

/* A training curve: every step's loss and learning rate, and the
 * validation accuracy where it was measured (nval points, may be 0). */
typedef struct plot_curve {
	const double *step, *loss, *lr;
	int64_t n;
	const double *val_step, *val_acc;
	int64_t nval;
} plot_curve;

/* Writes c to path as an SVG (atomically); 1 after an error line. */
int plot_curve_svg(const char *path, const plot_curve *c);

/* ---- train.c ------------------------------------------------------------ */

/* `kiln train MODEL --x X.npy --y Y.npy ...`: see the usage text. */
int cmd_train(int argc, char **argv);
extern const char cmd_train_usage[];   /* synopsis line, then option lines */
extern const char cmd_train_summary[]; /* one line for `kiln --help` */

/* ---- onnx_cli.c --------------------------------------------------------- */

int cmd_export(int argc, char **argv);
extern const char cmd_export_usage[];
extern const char cmd_export_summary[];
/* Imports an ONNX model for `kiln inspect`; on failure prints every
 * unsupported node, one per line, and returns 1. */
int onnx_cli_inspect_report(const char *path, struct kiln_graph **g);

/* ---- quantize_cli.c ------------------------------------------------------ */

enum { QUANT_CLI_MAX_INPUTS = 16, QUANT_CLI_MAX_KEEP = 64 };

/* The calibration options `kiln quantize` and `kiln compile --int8` share. */
typedef struct quant_cli {
	bool on;        /* compile: --int8 given */
	bool set;       /* any calibration option given */
	bool quiet;
	const char *calib[QUANT_CLI_MAX_INPUTS]; /* "[NAME=]X.npy" */
	int ncalib;
	const char *keep[QUANT_CLI_MAX_KEEP];
	int64_t samples;  /* --samples: 0 for all */
	kiln_quant_opts o;
} quant_cli;

/* Takes argv[*i] (and its value) when it is a calibration option: 1; 0
 * when it is not one; -1 after a usage error line.  all: every option
 * (quantize); else compile's subset: --int8 and no --batch/--quiet. */
int quant_cli_flag(const char *cmd, int argc, char **argv, int *i, quant_cli *q, bool all);
/* Loads the --calib files, quantizes g into *out and prints the report
 * (on stdout; summary: one line on stderr instead).  0, or the exit
 * status after an error line. */
int quant_cli_run(quant_cli *q, const kiln_graph *g, kiln_graph **out, bool summary);
int cmd_quantize(int argc, char **argv);
extern const char cmd_quantize_usage[];
extern const char cmd_quantize_summary[];

#endif /* KILN_TOOLS_H */
