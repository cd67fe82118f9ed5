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

enum { TOOLS_EXIT_USAGE = 2 };

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

#endif /* KILN_TOOLS_H */
