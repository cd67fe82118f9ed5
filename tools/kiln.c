/*
 * kiln.c: the `kiln` command-line tool: inspect, run and optimize .kir
 * graphs.
 *
 * Each subcommand is one function in a table with its usage text, so
 * `kiln help CMD`, `kiln CMD --help` and the usage error all print the same
 * lines.  Failures print exactly one line, "kiln: error: ...", on stderr,
 * carrying the library's own message (which names the file, line and op),
 * and exit non-zero: 1 when the work failed, 2 when the command line was
 * wrong.  The tool is a client of kiln/kiln.h (and driver/driver.h) only:
 * `opt` runs the pass registry through kiln_graph_run_passes to get
 * --dump-after, `inspect` reads the graph through its accessors.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "tools/tools.h"

typedef struct command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *usage;   /* first line: synopsis; then option lines */
	const char *summary; /* one line for `kiln --help` */
} command;

static const command *find_command(const char *name);

static int usage_error(const char *cmd, const char *fmt, const char *arg)
{
	char msg[512];
	snprintf(msg, sizeof msg, fmt, arg);
	return tool_fail(TOOLS_EXIT_USAGE, "%s (see 'kiln %s --help')", msg, cmd);
}

static bool is_help(const char *a)
{
	return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

static void print_usage(const command *c, FILE *f)
{
	fprintf(f, "usage: kiln %s\n", c->usage);
	if (strcmp(c->name, "opt") == 0) {
		fprintf(f, "\npasses (--passes=default is %s):\n", kiln_pass_default());
		for (int i = 0; i < kiln_pass_count(); i++)
			fprintf(f, "  %-10s %s\n", kiln_pass_name(i), kiln_pass_desc(i));
	}
}

/* Loads FILE.kir (and FILE.safetensors beside it) and verifies it. */
static int load(const char *path, kiln_graph **g)
{
	kiln_error e = {0};
	kiln_status st = kiln_graph_load_any(path, g, &e);
	if (st == KILN_OK && (st = kiln_graph_verify(*g, &e)) != KILN_OK) {
		kiln_graph_free(*g);
		*g = NULL;
	}
	if (st == KILN_OK)
		return 0;
	/* parse errors carry file:line:col already; others get the file */
	if (!strstr(e.msg, path))
		return tool_fail(1, "%s: %s", path, e.msg[0] ? e.msg : kiln_status_str(st));
	return tool_fail_err(NULL, &e, st);
}


/* Takes the single FILE argument; *file stays set on a second one. */
static int positional(const char *cmd, const char *arg, const char **file)
{
	if (arg[0] == '-' && arg[1])
		return usage_error(cmd, "unknown option '%s'", arg);
	if (*file)
		return usage_error(cmd, "unexpected argument '%s'", arg);
	*file = arg;
	return 0;
}

/* ---- inspect ------------------------------------------------------------ */

/* The graph's inputs (outputs: false) with their types. */
static void print_values(const kiln_graph *g, const char *title, bool inputs)
{
	char buf[512];
	int n = inputs ? kiln_graph_num_inputs(g) : kiln_graph_num_outputs(g);
	printf("%s: %d\n", title, n);
	for (int i = 0; i < n; i++) {
		kiln_value v = inputs ? kiln_graph_input(g, i) : kiln_graph_output(g, i);
		const char *name = kiln_value_name(g, v);
		printf("  %s: %s\n", name ? name : "?", kiln_value_type_str(g, v, buf, sizeof buf));
	}
}

static void print_params(const kiln_graph *g)
{
	int64_t cnt[2] = {0}, elems[2] = {0}, bytes[2] = {0}; /* [buffer, trainable] */
	for (int i = 0; i < kiln_graph_num_params(g); i++) {
		kiln_value p = kiln_graph_param(g, i);
		const kiln_tensor *t = kiln_param_data(g, p);
		int k = kiln_param_trainable(g, p);
		if (!t)
			continue;
		cnt[k]++;
		elems[k] += kiln_tensor_numel(t);
		bytes[k] += (int64_t)kiln_tensor_nbytes(t);
	}
	printf("parameters: %lld tensors, %lld elements, %lld bytes\n",
	       (long long)(cnt[0] + cnt[1]), (long long)(elems[0] + elems[1]),
	       (long long)(bytes[0] + bytes[1]));
	printf("  trainable: %lld tensors, %lld elements, %lld bytes\n", (long long)cnt[1],
	       (long long)elems[1], (long long)bytes[1]);
	printf("  buffers: %lld tensors, %lld elements, %lld bytes\n", (long long)cnt[0],
	       (long long)elems[0], (long long)bytes[0]);
}

static void print_histogram(const kiln_graph *g)
{
	kiln_op_count h[KILN_OP_KINDS];
	int live = 0, n = kiln_graph_op_histogram(g, h, KILN_OP_KINDS, &live);
	printf("nodes: %d\nop histogram:\n", live);
	for (int i = 0; i < n && i < KILN_OP_KINDS; i++)
		printf("  %6d  %s\n", h[i].count, h[i].op);
}

static int load_so(const char *path, kiln_model **m);
static const char *io_type(const kiln_model_io *io, char *buf, size_t size);

/* `kiln inspect model.so`: the signature a compiled library describes. */
static int inspect_so(const char *file)
{
	kiln_model *m = NULL;
	if (load_so(file, &m))
		return 1;
	char ty[256];
	bool train = kiln_model_trainable(m);
	printf("library: %s\nmodel: %s\nkind: %s\n", file, kiln_model_name(m),
	       train ? "training library (train step, eval, save, load; the signature is the "
	               "eval program's)" : "inference library");
	int nin = kiln_model_num_inputs(m), nout = kiln_model_num_outputs(m);
	printf("inputs: %d\n", nin);
	for (int i = 0; i < nin; i++)
		printf("  %s: %s\n", kiln_model_input_name(m, i), io_type(kiln_model_input(m, i), ty, sizeof ty));
	printf("outputs: %d\n", nout);
	for (int i = 0; i < nout; i++)
		printf("  %s: %s\n", kiln_model_output_name(m, i),
		       io_type(kiln_model_output(m, i), ty, sizeof ty));
	if (kiln_model_num_syms(m) > 0) {
		printf("symbols:");
		for (int i = 0; i < kiln_model_num_syms(m); i++)
			printf(" %s", kiln_model_sym_name(m, i));
		printf("\n");
	}
	if (train) {
		kiln_tensor_set *st = kiln_model_state(m);
		printf("steps taken: %lld\n", (long long)kiln_model_steps(m));
		if (st) {
			int64_t bytes = 0;
			for (int i = 0; i < st->count; i++)
				bytes += (int64_t)kiln_tensor_nbytes(st->items[i].tensor);
			printf("state: %d tensors, %lld bytes\n", st->count, (long long)bytes);
		}
		kiln_tensor_set_free(st);
	}
	kiln_model_free(m);
	return 0;
}

/* `kiln inspect --dot OUT`: the graph as Graphviz (OUT "-": stdout) */
static int inspect_dot(kiln_graph *g, const char *out)
{
	char *text = kiln_graph_to_dot(g);
	kiln_graph_free(g);
	if (!text)
		return tool_fail(1, "out of memory drawing the graph");
	int rc = 0;
	if (strcmp(out, "-") == 0) {
		fputs(text, stdout);
	} else {
		kiln_error e = {0};
		kiln_status st = kiln_write_file(out, text, strlen(text), &e);
		if (st != KILN_OK)
			rc = tool_fail_err(NULL, &e, st);
		else
			fprintf(stderr, "kiln: wrote %s (render: dot -Tsvg %s -o graph.svg)\n", out, out);
	}
	free(text);
	return rc;
}

static int cmd_inspect(int argc, char **argv)
{
	const char *file = NULL, *dot = NULL;
	bool ir = true;
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--no-ir") == 0)
			ir = false;
		else if (tool_is_opt(argv[i], "--dot", NULL)) {
			if (!(dot = tool_optval(argc, argv, &i, "--dot", NULL)))
				return usage_error("inspect", "%s", "--dot needs OUT.dot (or - for stdout)");
		} else if (positional("inspect", argv[i], &file))
			return TOOLS_EXIT_USAGE;
	}
	if (!file)
		return usage_error("inspect", "missing %s", "FILE.kir or FILE.onnx");
	kiln_graph *g;
	kiln_file_kind kind = kiln_file_sniff(file);
	if (kind == KILN_FILE_ELF)
		return dot ? usage_error("inspect", "%s", "--dot draws a graph (.kir or .onnx), not a "
		                         "compiled library") : inspect_so(file);
	/* an ONNX model lists every unsupported node, not just the first */
	if (kind == KILN_FILE_ONNX ? onnx_cli_inspect_report(file, &g) : load(file, &g))
		return 1;
	if (dot)
		return inspect_dot(g, dot);
	printf("graph: %s\n", kiln_graph_name(g));
	print_values(g, "inputs", true);
	print_values(g, "outputs", false);
	print_params(g);
	print_histogram(g);
	if (ir) {
		char *text = kiln_graph_to_kir(g);
		if (!text) {
			kiln_graph_free(g);
			return tool_fail(1, "out of memory printing the IR");
		}
		printf("\n%s", text);
		free(text);
	}
	kiln_graph_free(g);
	return 0;
}

/* ---- run ---------------------------------------------------------------- */

typedef struct run_args {
	const char *file, *outdir;
	const char **spec; /* the -i NAME=FILE arguments */
	int nspec;
	int threads;       /* a library's pool (default: every CPU we may use) */
} run_args;

static int run_parse(int argc, char **argv, run_args *a)
{
	for (int i = 0; i < argc; i++) {
		const char *v;
		if (tool_is_opt(argv[i], "--input", "-i")) {
			if (!(v = tool_optval(argc, argv, &i, "--input", "-i")))
				return usage_error("run", "option '%s' needs NAME=FILE.npy", argv[i]);
			a->spec[a->nspec++] = v;
		} else if (tool_is_opt(argv[i], "--output", "-o")) {
			if (!(v = tool_optval(argc, argv, &i, "--output", "-o")))
				return usage_error("run", "option '%s' needs a directory", argv[i]);
			a->outdir = v;
		} else if (tool_is_opt(argv[i], "--threads", "-t")) {
			const char *opt = argv[i];
			double n;
			if (!(v = tool_optval(argc, argv, &i, "--threads", "-t")) || !tool_num(v, &n) ||
			    n < 1 || n > 256 || n != (int)n)
				return usage_error("run", "option '%s' needs a number in [1, 256]", opt);
			a->threads = (int)n;
		} else if (positional("run", argv[i], &a->file)) {
			return TOOLS_EXIT_USAGE;
		}
	}
	if (!a->file)
		return usage_error("run", "missing %s", "FILE.kir");
	return 0;
}

static const char *input_name(const kiln_graph *g, int i)
{
	return kiln_value_name(g, kiln_graph_input(g, i));
}

static int input_index(const kiln_graph *g, const char *name, size_t len)
{
	for (int i = 0; i < kiln_graph_num_inputs(g); i++) {
		const char *n = input_name(g, i);
		if (n && strlen(n) == len && strncmp(n, name, len) == 0)
			return i;
	}
	return -1;
}

static void input_names(const kiln_graph *g, char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = 0;
	for (int i = 0; i < kiln_graph_num_inputs(g) && n < size; i++) {
		const char *s = input_name(g, i);
		n += snprintf(buf + n, size - n, "%s%s", i ? ", " : "", s ? s : "?");
	}
}

/* Reads every -i into in[] (graph input order); all inputs must be given. */
/* -i NAME (of length n) was bound into the graph at import. */
static bool was_bound(const kiln_tensor_set *bound, const char *name, size_t n)
{
	for (int i = 0; bound && i < bound->count; i++)
		if (strlen(bound->items[i].name) == n && !strncmp(bound->items[i].name, name, n))
			return true;
	return false;
}

static int read_inputs(const kiln_graph *g, const run_args *a, kiln_tensor **in,
                       const kiln_tensor_set *bound)
{
	char names[512];
	for (int k = 0; k < a->nspec; k++) {
		const char *eq = strchr(a->spec[k], '=');
		if (!eq || eq == a->spec[k] || !eq[1])
			return tool_fail(TOOLS_EXIT_USAGE, "bad -i '%s': expected NAME=FILE.npy", a->spec[k]);
		int i = input_index(g, a->spec[k], eq - a->spec[k]);
		if (i < 0 && was_bound(bound, a->spec[k], (size_t)(eq - a->spec[k])))
			continue;
		input_names(g, names, sizeof names);
		if (i < 0)
			return tool_fail(TOOLS_EXIT_USAGE, "unknown input '%.*s'; graph '%s' has inputs: %s",
			            (int)(eq - a->spec[k]), a->spec[k], kiln_graph_name(g), names);
		if (in[i])
			return tool_fail(TOOLS_EXIT_USAGE, "input '%s' given twice", input_name(g, i));
		kiln_error e = {0};
		kiln_status st = kiln_npy_read(eq + 1, &in[i], &e);
		if (st != KILN_OK)
			return tool_fail_err(NULL, &e, st);
	}
	for (int i = 0; i < kiln_graph_num_inputs(g); i++)
		if (!in[i]) {
			char ty[256];
			const char *name = input_name(g, i);
			return tool_fail(TOOLS_EXIT_USAGE, "missing input '%s' (%s): give -i %s=FILE.npy", name,
			            kiln_value_type_str(g, kiln_graph_input(g, i), ty, sizeof ty), name);
		}
	return 0;
}

static const char *tensor_type(const kiln_tensor *t, char *buf, size_t size)
{
	size_t n = snprintf(buf, size, "%s[", kiln_dtype_name(t->dtype));
	for (int i = 0; i < t->rank && n < size; i++)
		n += snprintf(buf + n, size - n, "%s%lld", i ? "," : "", (long long)t->shape[i]);
	if (n < size)
		snprintf(buf + n, size - n, "]");
	return buf;
}

/* The output files of `run -o DIR`: DIR/<name>.npy, one file per output.
 * Path separators and a leading dot become '_'.  Outputs whose names are
 * plain file names claim them first, in output order; every other output
 * takes its cleaned name if still free, else the first suffix _1, _2, ...
 * that is neither taken nor some output's own name.  So the files depend
 * only on the outputs' names and order. */
typedef struct out_files {
	int n;
	char **path;  /* [n] */
	bool *renamed; /* [n]: the file is not DIR/<name>.npy */
} out_files;

static void out_files_free(out_files *f)
{
	for (int i = 0; f->path && i < f->n; i++)
		free(f->path[i]);
	free(f->path);
	free(f->renamed);
	*f = (out_files){0};
}

static void safe_name(char *buf, size_t size, const char *name, int i)
{
	if (!name || !*name)
		snprintf(buf, size, "output%d", i);
	else
		snprintf(buf, size, "%s", name);
	for (char *p = buf; *p; p++)
		if (*p == '/' || *p == '\\' || (p == buf && *p == '.'))
			*p = '_';
}

static bool name_used(char (*names)[256], int n, const char *s)
{
	for (int k = 0; k < n; k++)
		if (!strcmp(names[k], s))
			return true;
	return false;
}

static int out_files_make(const char *dir, int n, const char *const *names, out_files *f)
{
	char (*base)[256] = calloc((size_t)n + 1, sizeof *base);
	char (*got)[256] = calloc((size_t)n + 1, sizeof *got); /* "": not yet chosen */
	*f = (out_files){n, calloc((size_t)n + 1, sizeof *f->path),
	                 calloc((size_t)n + 1, sizeof *f->renamed)};
	bool ok = base && got && f->path && f->renamed;
	for (int i = 0; ok && i < n; i++)
		safe_name(base[i], sizeof base[i], names[i], i);
	for (int i = 0; ok && i < n; i++)
		if (names[i] && !strcmp(names[i], base[i]) && !name_used(got, n, base[i]))
			snprintf(got[i], sizeof got[i], "%s", base[i]);
	for (int i = 0; ok && i < n; i++) {
		if (!got[i][0]) {
			char cand[256];
			snprintf(cand, sizeof cand, "%s", base[i]);
			for (int k = 1; name_used(got, n, cand) || (k > 1 && name_used(base, n, cand)); k++)
				snprintf(cand, sizeof cand, "%.240s_%d", base[i], k);
			memcpy(got[i], cand, sizeof cand);
		}
		size_t len = strlen(dir) + strlen(got[i]) + 8;
		if (!(f->path[i] = malloc(len))) {
			ok = false;
			break;
		}
		snprintf(f->path[i], len, "%s/%s.npy", dir, got[i]);
		f->renamed[i] = !names[i] || strcmp(names[i], got[i]) != 0;
	}
	free(base);
	free(got);
	if (!ok)
		out_files_free(f);
	return ok ? 0 : tool_fail(1, "out of memory");
}

/* Before running: the output folder takes files, and no output file is an
 * input (the model, its weights, an -i file). */
static int out_files_check(const run_args *a, const out_files *f)
{
	if (!a->outdir)
		return 0;
	if (files_check_dir("-o", a->outdir))
		return 1;
	int nin = a->nspec + 2;
	tool_file *in = calloc((size_t)nin, sizeof *in), *out = calloc((size_t)f->n + 1, sizeof *out);
	char *side = files_model_sidecar(a->file);
	int rc = in && out ? 0 : tool_fail(1, "out of memory");
	if (!rc) {
		in[0] = (tool_file){"the model", a->file, NULL};
		in[1] = (tool_file){"the model", side, " (its weights)"};
		for (int k = 0; k < a->nspec; k++) {
			const char *eq = strchr(a->spec[k], '=');
			in[k + 2] = (tool_file){"-i", eq ? eq + 1 : NULL, NULL};
		}
		for (int i = 0; i < f->n; i++)
			out[i] = (tool_file){"-o", f->path[i], " (an output of the model)"};
		rc = files_check_clash(in, nin, out, f->n);
		for (int i = 0; !rc && i < f->n; i++) /* an existing name must be a plain file */
			rc = access(f->path[i], F_OK) == 0 && files_check_dest("-o", f->path[i], false);
	}
	free(side);
	free(in);
	free(out);
	return rc;
}

/* Writes (or, without -o, describes) every output; a renamed file says
 * which output it holds. */
static int write_outputs(const char *dir, const char *const *names, const out_files *f,
                         kiln_tensor **out)
{
	if (dir && mkdir(dir, 0777) != 0 && errno != EEXIST)
		return tool_fail(1, "cannot create directory '%s': %s", dir, strerror(errno));
	for (int i = 0; i < f->n; i++) {
		const char *name = names[i] ? names[i] : "?";
		char ty[256];
		if (!dir) {
			printf("%s: %s\n", name, tensor_type(out[i], ty, sizeof ty));
			continue;
		}
		kiln_error e = {0};
		kiln_status st = kiln_npy_write(f->path[i], out[i], &e);
		if (st != KILN_OK)
			return tool_fail_err(NULL, &e, st);
		printf("%s: %s -> %s%s\n", name, tensor_type(out[i], ty, sizeof ty), f->path[i],
		       f->renamed[i] ? " (file name changed: the output's name is not a unique, "
		                       "plain file name)" : "");
	}
	return 0;
}

/* ---- compiled libraries (.so): run and bench ------------------------------- */

static int load_so(const char *path, kiln_model **m)
{
	kiln_error e = {0};
	kiln_file_kind k = kiln_file_sniff(path);
	if (k != KILN_FILE_ELF && k != KILN_FILE_UNKNOWN)
		return tool_fail(1, "%s: this is %s, not a compiled library: make one with 'kiln compile'",
		            path, kiln_file_kind_name(k));
	kiln_status st = kiln_load(path, m, &e);
	return st == KILN_OK ? 0 : tool_fail_err(NULL, &e, st);
}

/* "f32[N,784]" from a loaded model's signature. */
static const char *io_type(const kiln_model_io *io, char *buf, size_t size)
{
	size_t n = snprintf(buf, size, "%s[", kiln_dtype_name(io->dtype));
	for (int k = 0; k < io->rank && n < size; k++) {
		if (io->dim_names[k])
			n += snprintf(buf + n, size - n, "%s%s", k ? "," : "", io->dim_names[k]);
		else
			n += snprintf(buf + n, size - n, "%s%lld", k ? "," : "", (long long)io->dims[k]);
	}
	if (n < size)
		snprintf(buf + n, size - n, "]");
	return buf;
}

static int so_input_index(const kiln_model *m, const char *name, size_t len)
{
	for (int i = 0; i < kiln_model_num_inputs(m); i++) {
		const char *n = kiln_model_input_name(m, i);
		if (strlen(n) == len && strncmp(n, name, len) == 0)
			return i;
	}
	return -1;
}

/* Reads every -i into in[] (signature order); all inputs must be given. */
static int so_read_inputs(const kiln_model *m, const run_args *a, kiln_tensor **in)
{
	for (int k = 0; k < a->nspec; k++) {
		const char *eq = strchr(a->spec[k], '=');
		if (!eq || eq == a->spec[k] || !eq[1])
			return tool_fail(TOOLS_EXIT_USAGE, "bad -i '%s': expected NAME=FILE.npy", a->spec[k]);
		int i = so_input_index(m, a->spec[k], eq - a->spec[k]);
		if (i < 0)
			return tool_fail(TOOLS_EXIT_USAGE, "unknown input '%.*s'; model '%s' has %d input(s), the first '%s'",
			            (int)(eq - a->spec[k]), a->spec[k], kiln_model_name(m),
			            kiln_model_num_inputs(m), kiln_model_input_name(m, 0));
		if (in[i])
			return tool_fail(TOOLS_EXIT_USAGE, "input '%s' given twice", kiln_model_input_name(m, i));
		kiln_error e = {0};
		kiln_status st = kiln_npy_read(eq + 1, &in[i], &e);
		if (st != KILN_OK)
			return tool_fail_err(NULL, &e, st);
	}
	for (int i = 0; i < kiln_model_num_inputs(m); i++)
		if (!in[i]) {
			char ty[256];
			const kiln_model_io *io = kiln_model_input(m, i);
			return tool_fail(TOOLS_EXIT_USAGE, "missing input '%s' (%s): give -i %s=FILE.npy", io->name,
			            io_type(io, ty, sizeof ty), io->name);
		}
	return 0;
}

/* `kiln run model.so`: the same, through kiln_load. */
static int run_so(const run_args *a)
{
	kiln_model *m = NULL;
	int rc = load_so(a->file, &m), nin = 0, nout = 0;
	kiln_tensor **in = NULL, **out = NULL;
	const char **names = NULL;
	out_files f = {0};
	kiln_error te = {0};
	if (!rc && kiln_model_set_threads(m, a->threads, &te) != KILN_OK)
		rc = tool_fail_err(NULL, &te, te.code);
	if (!rc) {
		nin = kiln_model_num_inputs(m);
		nout = kiln_model_num_outputs(m);
		in = calloc(nin + 1, sizeof *in);
		out = calloc(nout + 1, sizeof *out);
		names = calloc(nout + 1, sizeof *names);
		rc = in && out && names ? so_read_inputs(m, a, in) : tool_fail(1, "out of memory");
	}
	for (int i = 0; !rc && i < nout; i++)
		names[i] = kiln_model_output_name(m, i);
	if (!rc)
		rc = out_files_make(a->outdir ? a->outdir : ".", nout, names, &f);
	if (!rc)
		rc = out_files_check(a, &f);
	if (!rc) {
		kiln_error e = {0};
		kiln_status st = kiln_model_run(m, in, nin, out, nout, &e);
		rc = st == KILN_OK ? write_outputs(a->outdir, names, &f, out) : tool_fail_err(NULL, &e, st);
	}
	for (int i = 0; in && i < nin; i++)
		kiln_tensor_free(in[i]);
	for (int i = 0; out && i < nout; i++)
		kiln_tensor_free(out[i]);
	free(in);
	free(out);
	free(names);
	out_files_free(&f);
	kiln_model_free(m);
	return rc;
}

/* An ONNX model run with -i values: imported with them at hand, so an
 * input the import needs as a constant (a Reshape's shape...) takes its
 * value (*bound: those, said on stderr). */
static int load_onnx_with(const char *file, const run_args *a, kiln_graph **g,
                          kiln_tensor_set **bound)
{
	kiln_tensor_set *set = kiln_tensor_set_new();
	kiln_error e = {0};
	int rc = set ? 0 : tool_fail(1, "out of memory");
	for (int k = 0; !rc && k < a->nspec; k++) {
		const char *eq = strchr(a->spec[k], '=');
		char name[256];
		kiln_tensor *t = NULL;
		if (!eq || eq == a->spec[k] || !eq[1] || (size_t)(eq - a->spec[k]) >= sizeof name)
			return kiln_tensor_set_free(set),
			       tool_fail(TOOLS_EXIT_USAGE, "bad -i '%s': expected NAME=FILE.npy", a->spec[k]);
		memcpy(name, a->spec[k], (size_t)(eq - a->spec[k]));
		name[eq - a->spec[k]] = 0;
		kiln_status st = kiln_npy_read(eq + 1, &t, &e);
		rc = st != KILN_OK ? tool_fail_err(NULL, &e, st)
		   : kiln_tensor_set_add(set, name, t) != KILN_OK ? tool_fail(1, "out of memory") : 0;
		kiln_tensor_free(t);
	}
	if (!rc) {
		kiln_onnx_opts o = {file, NULL, NULL, set};
		kiln_status st = kiln_onnx_import_ex(NULL, 0, &o, g, &e);
		if (st == KILN_OK)
			st = kiln_graph_verify(*g, &e);
		rc = st == KILN_OK ? 0 : tool_fail_err(file, &e, st);
	}
	*bound = kiln_tensor_set_new();
	for (int i = 0; !rc && *bound && i < set->count; i++) {
		bool input = false;
		for (int k = 0; k < kiln_graph_num_inputs(*g); k++)
			input = input || !strcmp(kiln_value_name(*g, kiln_graph_input(*g, k)), set->items[i].name);
		if (!input && kiln_tensor_set_add(*bound, set->items[i].name, set->items[i].tensor) == KILN_OK)
			fprintf(stderr, "kiln: input '%s' is bound into the graph at import (a value the "
			        "import needs as a constant)\n", set->items[i].name);
	}
	kiln_tensor_set_free(set);
	return rc;
}

static int cmd_run(int argc, char **argv)
{
	const char **spec = calloc(argc + 1, sizeof *spec);
	run_args a = {.spec = spec, .threads = tool_cpus()};
	kiln_graph *g = NULL;
	kiln_tensor **in = NULL, **out = NULL;
	const char **names = NULL;
	out_files f = {0};
	int rc = spec ? run_parse(argc, argv, &a) : tool_fail(1, "out of memory");
	if (!rc && kiln_file_sniff(a.file) == KILN_FILE_ELF) {
		rc = run_so(&a);
		free(spec);
		return rc;
	}
	kiln_tensor_set *bound = NULL;
	if (!rc && kiln_file_sniff(a.file) == KILN_FILE_ONNX && a.nspec)
		rc = load_onnx_with(a.file, &a, &g, &bound);
	else if (!rc)
		rc = load(a.file, &g);
	int nin = g ? kiln_graph_num_inputs(g) : 0, nout = g ? kiln_graph_num_outputs(g) : 0;
	if (!rc) {
		in = calloc((size_t)nin + 1, sizeof *in);
		out = calloc((size_t)nout + 1, sizeof *out);
		names = calloc((size_t)nout + 1, sizeof *names);
		rc = in && out && names ? read_inputs(g, &a, in, bound) : tool_fail(1, "out of memory");
	}
	for (int i = 0; !rc && i < nout; i++)
		names[i] = kiln_value_name(g, kiln_graph_output(g, i));
	if (!rc)
		rc = out_files_make(a.outdir ? a.outdir : ".", nout, names, &f);
	if (!rc)
		rc = out_files_check(&a, &f);
	if (!rc) {
		kiln_error e = {0};
		kiln_status st = kiln_graph_run(g, in, nin, out, nout, &e);
		rc = st == KILN_OK ? write_outputs(a.outdir, names, &f, out) : tool_fail_err(NULL, &e, st);
	}
	for (int i = 0; in && i < nin; i++)
		kiln_tensor_free(in[i]);
	for (int i = 0; out && i < nout; i++)
		kiln_tensor_free(out[i]);
	free(in);
	free(out);
	free(names);
	out_files_free(&f);
	free(spec);
	kiln_graph_free(g);
	kiln_tensor_set_free(bound);
	return rc;
}

/* ---- opt ---------------------------------------------------------------- */

/* Before any work: no output (out[0], and out[1] derived from it by
 * swapping ext for with, when out[1].path is NULL and ext is given) is the
 * model file, its weights or another output, and each can be written. */
static int check_outputs(const char *model, tool_file *out, int nout, const char *ext,
                         const char *with)
{
	char *side = files_model_sidecar(model), *derived = NULL;
	if (ext && nout > 1 && !out[1].path)
		out[1].path = derived = files_swap_ext(out[0].path, ext, with);
	tool_file in[] = {{"the model", model, NULL}, {"the model", side, " (its weights)"}};
	int rc = files_check_clash(in, 2, out, nout);
	for (int i = 0; !rc && i < nout; i++)
		rc = out[i].path && files_check_dest(out[i].flag, out[i].path, false);
	free(side);
	free(derived);
	return rc;
}

static int cmd_opt(int argc, char **argv)
{
	const char *file = NULL, *passes = "", *outfile = NULL, *v;
	kiln_pass_opts o = {.dump = stderr};
	for (int i = 0; i < argc; i++) {
		if (tool_is_opt(argv[i], "--passes", NULL)) {
			if (!(v = tool_optval(argc, argv, &i, "--passes", NULL)))
				return usage_error("opt", "option '%s' needs a pass list", argv[i]);
			passes = v;
		} else if (tool_is_opt(argv[i], "--dump-after", NULL)) {
			if (!(v = tool_optval(argc, argv, &i, "--dump-after", NULL)))
				return usage_error("opt", "option '%s' needs a pass name or 'all'", argv[i]);
			if (strcmp(v, "all") != 0 && !kiln_pass_known(v))
				return usage_error("opt", "--dump-after: unknown pass '%s'", v);
			o.dump_after = v;
		} else if (tool_is_opt(argv[i], "--output", "-o")) {
			if (!(v = tool_optval(argc, argv, &i, "--output", "-o")))
				return usage_error("opt", "option '%s' needs a file name", argv[i]);
			outfile = v;
		} else if (strcmp(argv[i], "--verify") == 0) {
			o.verify = true;
		} else if (positional("opt", argv[i], &file)) {
			return TOOLS_EXIT_USAGE;
		}
	}
	if (!file)
		return usage_error("opt", "missing %s", "FILE.kir");
	if (outfile && check_outputs(file, (tool_file[]){{"-o", outfile, NULL},
	                             {"-o", NULL, " (the weights written beside it)"}}, 2, ".kir",
	                             ".safetensors"))
		return 1;
	kiln_graph *g;
	if (load(file, &g))
		return 1;
	kiln_error e = {0};
	kiln_status st = kiln_graph_run_passes(g, passes, &o, &e);
	int rc = 0;
	if (st != KILN_OK) {
		rc = tool_fail_err(NULL, &e, st);
	} else if (outfile) {
		st = kiln_graph_save(g, outfile, &e);
		rc = st == KILN_OK ? 0 : tool_fail_err(NULL, &e, st);
	} else {
		char *text = kiln_graph_to_kir(g);
		rc = text ? (fputs(text, stdout), 0) : tool_fail(1, "out of memory printing the IR");
		free(text);
	}
	kiln_graph_free(g);
	return rc;
}

/* ---- bench ----------------------------------------------------------------- */

typedef struct bench_args {
	const char *file;
	double batch, threads, warmup, runs; /* runs 0: as many as fit in seconds */
	double seconds;
	bool json, profile;
	bool eval, train; /* --eval; timing a training library's step (not --eval) */
	double start_rss; /* peak RSS MiB before the model was loaded */
} bench_args;

static int bench_parse(int argc, char **argv, bench_args *a)
{
	const struct {
		const char *lng, *shrt;
		double *dst;
	} opts[] = {{"--batch", "-b", &a->batch},    {"--threads", "-t", &a->threads},
	            {"--warmup", NULL, &a->warmup},  {"--runs", "-n", &a->runs},
	            {"--time", NULL, &a->seconds}};
	for (int i = 0; i < argc; i++) {
		size_t k = 0;
		while (k < sizeof opts / sizeof opts[0] && !tool_is_opt(argv[i], opts[k].lng, opts[k].shrt))
			k++;
		if (strcmp(argv[i], "--json") == 0) {
			a->json = true;
		} else if (strcmp(argv[i], "--profile") == 0) {
			a->profile = true;
		} else if (strcmp(argv[i], "--eval") == 0) {
			a->eval = true;
		} else if (k < sizeof opts / sizeof opts[0]) {
			const char *o = argv[i], *v = tool_optval(argc, argv, &i, opts[k].lng, opts[k].shrt);
			char *end = NULL;
			if (!v || (*opts[k].dst = strtod(v, &end), end == v || *end) || *opts[k].dst < 0)
				return usage_error("bench", "option '%s' needs a number >= 0", o);
		} else if (positional("bench", argv[i], &a->file)) {
			return TOOLS_EXIT_USAGE;
		}
	}
	if (!a->file)
		return usage_error("bench", "missing %s", "MODEL.so");
	if (a->batch < 1 || a->threads > 256)
		return usage_error("bench", "%s", "--batch must be at least 1, --threads at most 256");
	return 0;
}

/* Random inputs (fixed seed) with every symbolic dim set to the batch: the
 * model's, or a training library's step's (x, target) when train. */
static int bench_inputs(const kiln_model *m, int64_t batch, bool train, kiln_tensor **in)
{
	uint64_t s = 0x9e3779b97f4a7c15u;
	int n = train ? kiln_model_num_train_inputs(m) : kiln_model_num_inputs(m);
	for (int i = 0; i < n; i++) {
		const kiln_model_io *io = train ? kiln_model_train_input(m, i) : kiln_model_input(m, i);
		int64_t dims[KILN_MAX_RANK];
		for (int k = 0; k < io->rank; k++) {
			if (io->dim_names[k] && strcmp(io->dim_names[k], "?") == 0)
				return tool_fail(1, "input '%s' has a computed dim: give inputs with 'kiln run'",
				            io->name);
			dims[k] = io->dim_names[k] ? batch : io->dims[k];
		}
		if (!(in[i] = kiln_tensor_new(io->dtype, io->rank, dims)))
			return tool_fail(1, "cannot allocate input '%s'", io->name);
		if (io->dtype != KILN_F32)
			continue; /* zeros: valid indices and masks */
		float *p = in[i]->data;
		for (int64_t j = 0; j < kiln_tensor_numel(in[i]); j++) {
			s = s * 6364136223846793005u + 1442695040888963407u;
			p[j] = (float)((s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
		}
	}
	return 0;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* This process's peak resident set in MiB (VmHWM of /proc/self/status, the
 * high-water mark of its own address space: unlike getrusage's ru_maxrss it
 * does not start from the parent's peak when the parent forked and exec'd
 * us), or -1 where there is no such file. */
static double peak_rss_mib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	double kib = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "VmHWM: %lf kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib < 0 ? -1 : kib / 1024;
}

typedef struct kernel_time {
	const char *name;
	double s;
} kernel_time;

static int by_time_desc(const void *a, const void *b)
{
	double x = ((const kernel_time *)a)->s, y = ((const kernel_time *)b)->s;
	return (x < y) - (x > y);
}

/* --profile: n more runs with every kernel timed (kiln_model_profile), after
 * the timed ones so the clock reads do not touch their numbers; the kernels
 * by time, most first (text: those above 0.5% and the rest summed). */
static int bench_profile(kiln_model *m, const bench_args *a, kiln_tensor **in,
                         kiln_tensor **out, int n)
{
	int nin = kiln_model_num_inputs(m), nout = kiln_model_num_outputs(m);
	int nk = kiln_model_num_kernels(m);
	kiln_error e = {0};
	kernel_time *kt = calloc((size_t)nk + 1, sizeof *kt);
	if (!kt)
		return tool_fail(1, "out of memory");
	if (kiln_model_profile(m, true, &e) != KILN_OK)
		return free(kt), tool_fail_err(NULL, &e, e.code);
	for (int i = 0; i < n; i++)
		if (kiln_model_run_into(m, in, nin, out, nout, &e) != KILN_OK)
			return free(kt), tool_fail_err(NULL, &e, e.code);
	kiln_model_profile(m, false, &e);
	double total = 0;
	for (int k = 0; k < nk; k++) {
		kt[k].name = kiln_model_kernel(m, k, &kt[k].s);
		kt[k].s = kt[k].s * 1e3 / n; /* ms per run */
		total += kt[k].s;
	}
	qsort(kt, (size_t)nk, sizeof *kt, by_time_desc);
	if (a->json) {
		printf("{\"profile\": [");
		for (int k = 0; k < nk; k++)
			printf("%s{\"kernel\": \"%s\", \"ms\": %.6f}", k ? ", " : "", kt[k].name, kt[k].s);
		printf("], \"runs\": %d}\n", n);
	} else {
		printf("  kernels over %d profiled runs (%.4f ms per run; kiln compile --emit=kir "
		       "says which node each came from):\n", n, total);
		double cum = 0, rest = 0;
		int shown = 0;
		for (int k = 0; k < nk; k++) {
			if (total > 0 && kt[k].s < 0.005 * total) {
				rest += kt[k].s;
				continue;
			}
			cum += kt[k].s;
			shown++;
			printf("  %-32s %9.4f ms %5.1f%% %5.1f%%\n", kt[k].name, kt[k].s,
			       total > 0 ? 100 * kt[k].s / total : 0, total > 0 ? 100 * cum / total : 0);
		}
		if (shown < nk)
			printf("  %d more kernels                  %9.4f ms %5.1f%%\n", nk - shown, rest,
			       total > 0 ? 100 * rest / total : 0);
	}
	free(kt);
	return 0;
}

/* One timed run: the model (its eval program) into out, or a training
 * library's step on (x, target) at lr 0, so the state stays what it was
 * while the step does all its work (the update is computed and applied). */
static kiln_status bench_once(kiln_model *m, const bench_args *a, kiln_tensor **in,
                              kiln_tensor **out, kiln_error *e)
{
	if (a->train)
		return kiln_model_train_step(m, in[0], kiln_model_num_train_inputs(m) > 1 ? in[1] : NULL,
		                             0.0, NULL, e);
	return kiln_model_run_into(m, in, kiln_model_num_inputs(m), out, kiln_model_num_outputs(m),
	                           e);
}

/* Warm-up, then timed runs into preallocated outputs; prints the stats. */
static int bench_time(kiln_model *m, const bench_args *a, kiln_tensor **in, kiln_tensor **out)
{
	int cap = 100000, n = 0;
	double *t = malloc(cap * sizeof *t), start = now_ms();
	kiln_error e = {0};
	if (!t)
		return tool_fail(1, "out of memory");
	for (int i = 0; i < (int)a->warmup; i++)
		if (bench_once(m, a, in, out, &e) != KILN_OK)
			return free(t), tool_fail_err(NULL, &e, e.code);
	start = now_ms();
	while (n < cap && (a->runs ? n < (int)a->runs : n < 10 || now_ms() - start < a->seconds * 1e3)) {
		double t0 = now_ms();
		bench_once(m, a, in, out, &e);
		t[n++] = now_ms() - t0;
	}
	qsort(t, n, sizeof *t, by_value);
	double med = t[n / 2], p10 = t[n / 10], p90 = t[n * 9 / 10], spread = (p90 - p10) / med * 100;
	/* a train step's batch is its x's rows (fixed when it was compiled) */
	long long rows = a->train ? (long long)in[0]->shape[0] : (long long)a->batch;
	if (a->json)
		printf("{\"model\": \"%s\", \"batch\": %lld, \"threads\": %d, \"runs\": %d, "
		       "\"median_ms\": %.6f, \"min_ms\": %.6f, \"p90_ms\": %.6f, \"spread_pct\": %.2f, "
		       "\"peak_rss_mib\": %.1f, \"start_rss_mib\": %.1f, \"program\": \"%s\", "
		       "\"steps\": %lld}\n",
		       kiln_model_name(m), rows, (int)a->threads, n, med, t[0], p90, spread,
		       peak_rss_mib(), a->start_rss, a->train ? "train_step" : "run",
		       (long long)kiln_model_steps(m));
	else
		printf("model %s%s: batch %lld, threads %d, %d runs after %d warm-up\n"
		       "  median %.4f ms   min %.4f ms   p90 %.4f ms   spread (p90-p10)/median %.1f%%\n"
		       "  %.1f runs/s, %.1f samples/s, peak RSS %.1f MiB (%.1f before loading)\n",
		       kiln_model_name(m), a->train ? ", train step" : "", rows, (int)a->threads, n,
		       (int)a->warmup, med, t[0], p90, spread, 1e3 / med, 1e3 * rows / med,
		       peak_rss_mib(), a->start_rss);
	if (!a->json && a->train)
		printf("  %lld optimizer steps taken (warm-up and timed)\n",
		       (long long)kiln_model_steps(m));
	free(t);
	return a->profile ? bench_profile(m, a, in, out, n) : 0;
}

static int cmd_bench(int argc, char **argv)
{
	bench_args a = {.batch = 1, .threads = 1, .warmup = 10, .seconds = 1.0};
	int rc = bench_parse(argc, argv, &a), nin = 0, nout = 0;
	kiln_model *m = NULL;
	kiln_tensor **in = NULL, **out = NULL;
	kiln_error e = {0};
	a.start_rss = peak_rss_mib();
	if (!rc)
		rc = load_so(a.file, &m);
	if (!rc && kiln_model_set_threads(m, (int)a.threads, &e) != KILN_OK)
		rc = tool_fail_err(NULL, &e, e.code);
	a.train = !rc && kiln_model_trainable(m) && !a.eval;
	if (a.train && a.profile)
		rc = tool_fail(TOOLS_EXIT_USAGE, "--profile times the eval program's kernels: add --eval "
		               "for a training library (see 'kiln bench --help')");
	if (!rc) {
		nin = a.train ? kiln_model_num_train_inputs(m) : kiln_model_num_inputs(m);
		nout = kiln_model_num_outputs(m);
		in = calloc(nin + 1, sizeof *in);
		out = calloc(nout + 1, sizeof *out);
		rc = in && out ? bench_inputs(m, (int64_t)a.batch, a.train, in)
		               : tool_fail(1, "out of memory");
	}
	/* the first run allocates the outputs and the context's scratch */
	if (!rc && !a.train && kiln_model_run(m, in, nin, out, nout, &e) != KILN_OK)
		rc = tool_fail_err(NULL, &e, e.code);
	if (!rc)
		rc = bench_time(m, &a, in, out);
	for (int i = 0; in && i < nin; i++)
		kiln_tensor_free(in[i]);
	for (int i = 0; out && i < nout; i++)
		kiln_tensor_free(out[i]);
	free(in);
	free(out);
	kiln_model_free(m);
	return rc;
}

/* ---- compile --train --------------------------------------------------------- */

typedef struct train_cli {
	bool on, wd_set, other; /* --train; --weight-decay; any other training flag */
	kiln_train_opts t;
	int64_t batch, seed; /* --batch; --seed: Dropout's masks */
} train_cli;


/* A loss or optimizer name into t; false when unknown. */
static bool train_choice(const char *flag, const char *v, kiln_train_opts *t)
{
	static const struct {
		const char *flag, *name;
		int kind;
	} ch[] = {{"--loss", "cross_entropy", KILN_LOSS_CROSS_ENTROPY}, {"--loss", "mse", KILN_LOSS_MSE},
	          {"--optimizer", "sgd", KILN_OPT_SGD}, {"--optimizer", "adam", KILN_OPT_ADAM},
	          {"--optimizer", "adamw", KILN_OPT_ADAMW}};
	for (size_t k = 0; k < sizeof ch / sizeof *ch; k++)
		if (!strcmp(flag, ch[k].flag) && !strcmp(v, ch[k].name)) {
			*(flag[2] == 'l' ? (int *)&t->loss : (int *)&t->optim) = ch[k].kind;
			return true;
		}
	return false;
}

/* One training flag at argv[*i]: 1 taken, 0 not one, -1 a usage error. */
static int train_flag(int argc, char **argv, int *i, train_cli *tc)
{
	static const struct {
		const char *flag;
		size_t off; /* a double in kiln_train_opts; SIZE_MAX: special */
	} f[] = {{"--momentum", offsetof(kiln_train_opts, momentum)},
	         {"--dampening", offsetof(kiln_train_opts, dampening)},
	         {"--weight-decay", offsetof(kiln_train_opts, weight_decay)},
	         {"--eps", offsetof(kiln_train_opts, eps)},
	         {"--clip-norm", offsetof(kiln_train_opts, clip_norm)},
	         {"--loss", SIZE_MAX}, {"--optimizer", SIZE_MAX}, {"--betas", SIZE_MAX},
	         {"--accum", SIZE_MAX}, {"--batch", SIZE_MAX}, {"--seed", SIZE_MAX}};
	if (!strcmp(argv[*i], "--train") || !strcmp(argv[*i], "--nesterov")) {
		if (argv[*i][2] == 't')
			tc->on = true;
		else
			tc->t.nesterov = tc->other = true;
		return 1;
	}
	size_t k = 0;
	while (k < sizeof f / sizeof *f && !tool_is_opt(argv[*i], f[k].flag, NULL))
		k++;
	if (k == sizeof f / sizeof *f)
		return 0;
	const char *v = tool_optval(argc, argv, i, f[k].flag, NULL);
	double d;
	char tail;
	bool ok = v != NULL;
	if (ok && f[k].off != SIZE_MAX) {
		ok = tool_num(v, (double *)(void *)((char *)&tc->t + f[k].off));
		tc->wd_set |= k == 2;
	} else if (ok && k <= 6) {
		ok = train_choice(f[k].flag, v, &tc->t);
	} else if (ok && k == 7) {
		ok = sscanf(v, "%lf,%lf%c", &tc->t.beta1, &tc->t.beta2, &tail) == 2;
	} else if (ok) { /* --accum K >= 1, --batch B >= 0, --seed S >= 0: integers */
		ok = tool_num(v, &d) && d >= (k == 8) && d == (double)(int64_t)d && d < 1e15;
		ok = ok && (k == 10 || d < 1e9);
		if (k == 8)
			tc->t.accum_steps = (int)d;
		else
			*(k == 9 ? &tc->batch : &tc->seed) = (int64_t)d;
	}
	if (!ok)
		return usage_error("compile", "bad value for '%s'", f[k].flag), -1;
	tc->other = true;
	return 1;
}

/* ---- compile ---------------------------------------------------------------- */

enum { MAX_BINDS = 16 };

/* `--bind NAME=X.npy`: an ONNX model imported with those inputs' values
 * where it needs a constant (a Reshape's shape, a Resize's sizes...); each
 * input so used becomes part of the library and leaves its signature. */
static int load_bound(const char *file, const char *const *binds, int nb, kiln_graph **g)
{
	kiln_tensor_set *set = kiln_tensor_set_new();
	kiln_error e = {0};
	int rc = set ? 0 : tool_fail(1, "out of memory");
	if (!rc && kiln_file_sniff(file) != KILN_FILE_ONNX)
		rc = tool_fail(TOOLS_EXIT_USAGE, "--bind takes an ONNX model (%s is not one)", file);
	for (int i = 0; !rc && i < nb; i++) {
		const char *eq = strchr(binds[i], '=');
		char name[256];
		kiln_tensor *t = NULL;
		if (!eq || eq == binds[i] || (size_t)(eq - binds[i]) >= sizeof name) {
			rc = tool_fail(TOOLS_EXIT_USAGE, "--bind needs NAME=X.npy, got '%s'", binds[i]);
			break;
		}
		memcpy(name, binds[i], (size_t)(eq - binds[i]));
		name[eq - binds[i]] = 0;
		kiln_status st = kiln_npy_read(eq + 1, &t, &e);
		if (st != KILN_OK)
			rc = tool_fail_err(eq + 1, &e, st);
		else if (kiln_tensor_set_add(set, name, t) != KILN_OK)
			rc = tool_fail(1, "out of memory");
		kiln_tensor_free(t);
	}
	if (!rc) {
		kiln_onnx_opts o = {file, NULL, NULL, set};
		kiln_status st = kiln_onnx_import_ex(NULL, 0, &o, g, &e);
		rc = st == KILN_OK ? 0 : tool_fail_err(file, &e, st);
	}
	for (int i = 0; !rc && i < set->count; i++) {
		bool input = false;
		for (int k = 0; k < kiln_graph_num_inputs(*g); k++)
			input = input || !strcmp(kiln_value_name(*g, kiln_graph_input(*g, k)), set->items[i].name);
		fprintf(stderr, "kiln: --bind %s: %s\n", set->items[i].name,
		        input ? "not needed at import, stays an input" : "bound into the library");
	}
	kiln_tensor_set_free(set);
	return rc;
}

static int cmd_compile(int argc, char **argv)
{
	const char *file = NULL, *out = NULL, *v;
	kiln_compile_opts o = {0};
	train_cli tc = {.t = {.loss = KILN_LOSS_CROSS_ENTROPY, .accum_steps = 1}};
	quant_cli qc = {0};
	static const struct {
		const char *lng, *shrt;
		size_t off;
	} opts[] = {{"--output", "-o", 0}, {"--name", NULL, offsetof(kiln_compile_opts, name)},
	            {"--cpu", NULL, offsetof(kiln_compile_opts, cpu)},
	            {"--features", NULL, offsetof(kiln_compile_opts, features)},
	            {"--emit", NULL, offsetof(kiln_compile_opts, emit)},
	            {"--passes", NULL, offsetof(kiln_compile_opts, passes)},
	            {"--conv", NULL, offsetof(kiln_compile_opts, conv)},
	            {"--target", NULL, offsetof(kiln_compile_opts, target)},
	            {"--cuda-arch", NULL, offsetof(kiln_compile_opts, cuda_arch)},
	            {"--cuda-math", NULL, offsetof(kiln_compile_opts, cuda_math)}};
	kiln_compile_times times;
	bool report = false;
	const char *binds[MAX_BINDS];
	int nb = 0;
	for (int i = 0; i < argc; i++) {
		size_t k = 0;
		if (tool_is_opt(argv[i], "--bind", NULL)) {
			if (!(v = tool_optval(argc, argv, &i, "--bind", NULL)))
				return usage_error("compile", "%s", "--bind needs NAME=X.npy");
			if (nb == MAX_BINDS)
				return usage_error("compile", "%s", "too many --bind options");
			binds[nb++] = v;
			continue;
		}
		if (!strcmp(argv[i], "--time-report")) {
			report = true;
			o.times = &times;
			continue;
		}
		if (tool_is_opt(argv[i], "--jobs", "-j") || (!strncmp(argv[i], "-j", 2) && argv[i][2])) {
			double d; /* -j N, --jobs N, --jobs=N, or make's -jN */
			v = argv[i][1] == 'j' && argv[i][2] ? argv[i] + 2 : tool_optval(argc, argv, &i, "--jobs", "-j");
			if (!v || !tool_num(v, &d) || d < 0 || d > 1024 || d != (double)(int)d)
				return usage_error("compile", "%s", "--jobs needs a whole number >= 0");
			o.jobs = (int)d;
			continue;
		}
		while (k < sizeof opts / sizeof *opts && !tool_is_opt(argv[i], opts[k].lng, opts[k].shrt))
			k++;
		int qf = k == sizeof opts / sizeof *opts ? quant_cli_flag("compile", argc, argv, &i, &qc, false)
		                                        : 0;
		if (qf < 0)
			return TOOLS_EXIT_USAGE;
		if (qf > 0)
			continue;
		int tf = k == sizeof opts / sizeof *opts ? train_flag(argc, argv, &i, &tc) : 0;
		if (tf < 0)
			return TOOLS_EXIT_USAGE;
		if (tf > 0)
			continue;
		if (k == sizeof opts / sizeof *opts) {
			if (positional("compile", argv[i], &file))
				return TOOLS_EXIT_USAGE;
			continue;
		}
		if (!(v = tool_optval(argc, argv, &i, opts[k].lng, opts[k].shrt)))
			return usage_error("compile", "option '%s' needs a value", argv[i]);
		if (k == 0)
			out = v;
		else
			*(const char **)((char *)&o + opts[k].off) = v;
	}
	if (!file || !out)
		return usage_error("compile", "missing %s", !file ? "FILE.kir or FILE.onnx" : "-o OUT");
	if (tc.other && !tc.on)
		return usage_error("compile", "%s", "optimizer and loss options need --train");
	if (qc.set && !qc.on)
		return usage_error("compile", "%s", "calibration options need --int8");
	if (qc.on && (tc.on || !qc.ncalib))
		return usage_error("compile", "%s", tc.on ? "--int8 and --train do not mix"
		                                            : "--int8 needs --calib X.npy");
	bool lib = !o.emit || !strcmp(o.emit, "so"); /* a library brings its header */
	if (check_outputs(file, (tool_file[]){{"-o", out, NULL},
	                  {"-o", NULL, " (the header written beside the library)"}}, lib ? 2 : 1,
	                  ".so", ".h"))
		return 1;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kiln_graph *g = NULL;
	kiln_error e = {0};
	kiln_status st = KILN_OK;
	if (nb) {
		int brc = load_bound(file, binds, nb, &g);
		if (brc)
			return brc;
	} else {
		st = kiln_graph_load_any(file, &g, &e);
	}
	if (tc.on && !tc.wd_set && tc.t.optim == KILN_OPT_ADAMW)
		tc.t.weight_decay = 0.01; /* PyTorch's AdamW default */
	if (st == KILN_OK && qc.on) {
		kiln_graph *q = NULL;
		qc.o.compile = &o;
		if (quant_cli_run(&qc, g, &q, true)) {
			kiln_graph_free(g);
			return 1;
		}
		kiln_graph_free(g);
		g = q;
	}
	if (st == KILN_OK)
		st = tc.on ? driver_compile_train_inference(g, (uint64_t)tc.seed, &tc.t, tc.batch, out,
		                                            &o, &e)
		           : kiln_compile(g, out, &o, &e);
	kiln_graph_free(g);
	if (st != KILN_OK)
		return tool_fail_err(NULL, &e, st);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	fprintf(stderr, "kiln: compiled %s -> %s in %.2f s\n", file, out,
	        (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
	if (report)
		fprintf(stderr, "kiln: time: lower %.2f s, LLVM IR %.2f s, LLVM %.2f s on %d thread%s "
		        "(%d part%s, %d cached: O3 %.2f s + objects %.2f s), link %.2f s (%.1f MB of "
		        "weights)\n", times.lower, times.emit, times.llvm, times.jobs,
		        times.jobs == 1 ? "" : "s", times.parts, times.parts == 1 ? "" : "s",
		        times.cached, times.optimize, times.codegen, times.link,
		        (double)times.weights_bytes / 1e6);
	return 0;
}

/* ---- help and dispatch ---------------------------------------------------- */

static int cmd_help(int argc, char **argv);

static const command commands[] = {
	{"inspect", cmd_inspect,
	 "inspect FILE.kir|FILE.onnx|MODEL.so [--no-ir] [--dot OUT.dot]\n"
	 "  Prints the graph's name, inputs and outputs with their types, parameter\n"
	 "  counts and bytes (trainable and buffers), node count, op histogram, then\n"
	 "  the IR.  Weights load from FILE.safetensors beside it when present.  A\n"
	 "  compiled library prints its signature and whether it trains.  Files are\n"
	 "  recognised by content, not by name.\n"
	 "  --no-ir      omit the IR\n"
	 "  --dot OUT    write the graph as Graphviz instead (- for stdout): a box\n"
	 "               per node with the weights it reads, types on the edges;\n"
	 "               render with dot -Tsvg OUT -o graph.svg",
	 "summarize a graph: signature, parameters, op histogram, IR"},
	{"run", cmd_run,
	 "run FILE.kir|MODEL.so -i NAME=X.npy [-i ...] [-o DIR] [--threads N]\n"
	 "  Runs the graph through the reference interpreter, or a library made by\n"
	 "  'kiln compile' through kiln_load (inputs checked against its signature).\n"
	 "  -i, --input NAME=X.npy   the graph input NAME (every input is required)\n"
	 "  -t, --threads N          a library's threads (default: every CPU this\n"
	 "                           process may use; the interpreter uses one)\n"
	 "  -o, --output DIR         write DIR/<output name>.npy for every output\n"
	 "                           (created if missing; without -o only shapes print);\n"
	 "                           '/' in a name becomes '_', and a name another\n"
	 "                           output took gets _1, _2, ... (printed)",
	 "run a graph through the reference interpreter on .npy inputs"},
	{"opt", cmd_opt,
	 "opt FILE.kir [--passes=LIST] [--dump-after=PASS|all] [--verify] [-o OUT.kir]\n"
	 "  Runs passes and prints the resulting IR (no --passes: a round trip).\n"
	 "  --passes=LIST        comma-separated passes; 'default' is the default pipeline\n"
	 "  --dump-after=PASS    print the IR to stderr after PASS ('all': after each)\n"
	 "  --verify             verify the graph after every pass (always in debug builds)\n"
	 "  -o, --output OUT.kir write OUT.kir (and OUT.safetensors) instead of stdout",
	 "run graph passes and print or save the result"},
	{"bench", cmd_bench,
	 "bench MODEL.so [--batch B] [--threads T] [--warmup W] [--runs R] [--time S] [--json]\n"
	 "        [--profile] [--eval]\n"
	 "  Times a compiled library on random inputs (fixed seed), every symbolic\n"
	 "  dim set to B, after W warm-up runs (default 10); prints the median, min,\n"
	 "  p90 and spread (p90-p10)/median of the runs, in ms and runs/s, and the\n"
	 "  process's peak resident set (VmHWM) in MiB, at the end and before the\n"
	 "  library was loaded.  A training library (kiln compile --train, kiln\n"
	 "  train's cache) times its train step (forward, loss, backward, update) on\n"
	 "  random x and target 0 at lr 0, so its state stays put.\n"
	 "  -b, --batch B     the symbolic batch (default 1)\n"
	 "  -t, --threads T   threads of the model's pool (default 1; 0: KILN_NUM_THREADS)\n"
	 "  -n, --runs R      timed runs (default: as many as fit in --time, at least 10)\n"
	 "  --time S          seconds of timed runs when --runs is not given (default 1)\n"
	 "  --json            one JSON line instead of text\n"
	 "  --profile         then as many runs again with each kernel timed: the\n"
	 "                    kernels by time per run (with --json, a second line)\n"
	 "  --eval            a training library: time its eval program instead",
	 "time a compiled model: median and spread of many runs"},
	{"compile", cmd_compile,
	 "compile FILE.kir|FILE.onnx -o OUT.so [--name N] [--cpu C] [--features F]\n"
	 "        [--emit=kir|dot|ll|asm|obj|cu|ptx|cubin] [--passes=LIST] [--conv=ALGO] [-j N]\n"
	 "        [--time-report] [--target=llvm|cuda|cuda-emu] [--cuda-arch=sm_80,sm_90]\n"
	 "        [--cuda-math=f32|fast]\n"
	 "        [--int8 --calib X.npy ...] [--bind NAME=X.npy ...]\n"
	 "  Compiles the graph to a shared library needing only libc, libm and\n"
	 "  libpthread, and writes its header beside it (OUT.h); prints the time.\n"
	 "  -o, --output OUT     the library (or, with --emit, that stage's file)\n"
	 "  --name N             C name of the model, prefix of its entry points\n"
	 "                       (default: the graph's name)\n"
	 "  --cpu C              LLVM CPU, e.g. x86-64-v3 for a portable AVX2 build\n"
	 "                       (default: $KILN_CPU, else this machine with its features)\n"
	 "  --features F         e.g. +avx2,-avx512f (default: $KILN_FEATURES, else the\n"
	 "                       CPU's)\n"
	 "  --emit=STAGE         write kernel IR (kir), the compiled graph as Graphviz\n"
	 "                       with each kernel a cluster of the nodes fused into\n"
	 "                       it (dot), LLVM IR after -O3 (ll), assembly (asm) or\n"
	 "                       an object file (obj) instead\n"
	 "  --passes=LIST        graph passes before lowering (default: the default)\n"
	 "  --conv=ALGO          f32 convolutions: auto (default: a cost model picks\n"
	 "                       per layer), im2col, winograd (F(4x4,3x3) on every\n"
	 "                       2-D 3x3 conv of stride and dilation 1), or direct\n"
	 "                       (every grouped 2-D conv that is not depthwise)\n"
	 "  --target=T           llvm (default: this CPU), cuda (NVIDIA GPUs: the kernels\n"
	 "                       as CUDA C with --emit=cu, PTX (ptx) or a cubin (cubin)\n"
	 "                       for the first --cuda-arch, by NVRTC; docs/CUDA.md), or\n"
	 "                       cuda-emu (those kernels compiled for this CPU: tests)\n"
	 "  --cuda-arch=LIST     GPU architectures (default sm_80,sm_90)\n"
	 "  --cuda-math=M        f32 (default: strict, no fast math, no FMA contraction)\n"
	 "                       or fast (-use_fast_math)\n"
	 "  -j, --jobs N         threads for LLVM (default 0: one per CPU, at most 8);\n"
	 "                       the library is the same whatever N is\n"
	 "  --time-report        print where the compile's time went\n"
	 "  The GEMM helpers, the same for every model, are compiled once per target\n"
	 "  and kept in $KILN_CACHE_DIR (default $XDG_CACHE_HOME/kiln or\n"
	 "  ~/.cache/kiln; set it empty for none)\n"
	 "  Runs of per-sample layers over a symbolic batch execute chunk by chunk\n"
	 "  (intermediates sized for a chunk, kept in cache): $KILN_CHUNK=0 turns that\n"
	 "  off, =N forces N samples per chunk (default: a cost model on the L2 size)\n"
	 "  Constant GEMM operands (Linear and conv weights) are packed at compile\n"
	 "  time in the panels the target's GEMM reads: $KILN_PREPACK=0 turns that off\n"
	 "  The library is linked with cc against kiln's runtime archive: $KILN_RT_LIB,\n"
	 "  else the one installed beside kiln (kiln --version says which)\n"	 "  --train              a training library instead (docs/TRAINING.md): the\n"
	 "                       model's train step (loss, gradients, optimizer) and\n"
	 "                       its eval forward, with entry points _train_step,\n"
	 "                       _eval_step, _save, _load over state it owns; the\n"
	 "                       file is the inference model: BatchNorm trains on\n"
	 "                       batch statistics, Dropout is on in the step (a\n"
	 "                       training-mode export is taken as its inference model);\n"
	 "                       with --target=cuda the state lives on the GPU\n"
	 "                       (_get_state/_set_state instead of _save/_load) and\n"
	 "                       --emit=cu|ptx|cubin prints or compiles the step;\n"
	 "                       --target=cuda-emu trains on the host (docs/CUDA.md)\n"
	 "  --loss L             cross_entropy (default) or mse, of the first output\n"
	 "  --optimizer O        sgd (default), adam or adamw\n"
	 "  --momentum M --dampening D --nesterov --weight-decay W (AdamW: 0.01)\n"
	 "  --betas B1,B2 --eps E  Adam, AdamW (default 0.9,0.999 and 1e-8)\n"
	 "  --clip-norm C        clip the global gradient norm to C first\n"
	 "  --accum K            update every K micro-batches (default 1)\n"
	 "  --batch B            fix the train step's batch (needed with convolutions)\n"
	 "  --seed S             Dropout's masks (default 0), as kiln train --seed\n"
	 "  --bind NAME=X.npy    an ONNX model's input NAME fixed to X's value where the\n"
	 "                       import needs a constant (a Reshape's shape, Resize's sizes,\n"
	 "                       a Range's bounds...): it becomes part of the library\n"
	 "  --int8               quantize first, as 'kiln quantize' does (docs/QUANTIZATION.md),\n"
	 "                       and compile the int8 model: needs --calib [NAME=]X.npy;\n"
	 "                       takes quantize's --method, --percentile, --keep-float,\n"
	 "                       --per-tensor, --samples and --threads",
	 "compile a graph to a standalone .so and its header"},
	{"train", cmd_train, cmd_train_usage, cmd_train_summary},
	{"quantize", cmd_quantize, cmd_quantize_usage, cmd_quantize_summary},
	{"export", cmd_export, cmd_export_usage, cmd_export_summary},
	{"help", cmd_help, "help [CMD]\n  Prints help for CMD, or the list of commands.",
	 "show help for a command"},
};
#define NCOMMANDS ((int)(sizeof commands / sizeof commands[0]))

static const command *find_command(const char *name)
{
	for (int i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

static void main_help(FILE *f)
{
	fprintf(f, "usage: kiln [--version] [--help] COMMAND [ARGS]\n\n"
	           "kiln %s, a static-graph compiler for neural networks.\n\ncommands:\n",
	        KILN_VERSION);
	for (int i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\n'kiln help COMMAND' or 'kiln COMMAND --help' describes one.\n");
}

static int cmd_help(int argc, char **argv)
{
	if (argc == 0) {
		main_help(stdout);
		return 0;
	}
	const command *c = find_command(argv[0]);
	if (!c || argc > 1)
		return tool_fail(TOOLS_EXIT_USAGE, "unknown command '%s' (see 'kiln --help')",
		            c ? argv[1] : argv[0]);
	print_usage(c, stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		main_help(stderr);
		return TOOLS_EXIT_USAGE;
	}
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
		/* where `kiln compile` takes its runtime from, or why it cannot */
		char rt[4096];
		kiln_error e = {0};
		printf("kiln %s\nruntime: %s\n", KILN_VERSION,
		       kiln_runtime_archive(rt, sizeof rt, &e) == KILN_OK ? rt : e.msg);
		return 0;
	}
	if (is_help(argv[1])) {
		main_help(stdout);
		return 0;
	}
	const command *c = find_command(argv[1]);
	if (!c) {
		if (argv[1][0] == '-')
			return tool_fail(TOOLS_EXIT_USAGE, "unknown option '%s' (see 'kiln --help')", argv[1]);
		return tool_fail(TOOLS_EXIT_USAGE, "unknown command '%s' (see 'kiln --help')", argv[1]);
	}
	for (int i = 2; i < argc; i++)
		if (is_help(argv[i])) {
			print_usage(c, stdout);
			return 0;
		}
	int rc = c->run(argc - 2, argv + 2);
	/* what was printed is output too: a full disk must not exit 0 */
	return files_finish_stdout() && !rc ? 1 : rc;
}
