/*
 * test_cli.c: the `kiln` command-line tool, run as a child process.
 *
 * Each test runs KILN_BIN/kiln through popen in a fresh temporary
 * directory, with stderr sent to a file, and checks the exit code, what was
 * printed, and the files written (outputs read back and compared with
 * kiln_graph_run on the same graph).
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ir/ir.h"

static char dir[64];

static void setup(void)
{
	strcpy(dir, "/tmp/kiln_cli_XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	/* kiln train's compiled steps go to this test's folder, never ~/.cache */
	char cache[sizeof dir + 8];
	snprintf(cache, sizeof cache, "%s/cache", dir);
	setenv("KILN_CACHE_DIR", cache, 1);
}

/* KILN_KEEP=1 keeps the directory, to look at what a failing test saw. */
static void teardown(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (!getenv("KILN_KEEP"))
		ck_assert_int_eq(system(cmd), 0);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return strdup("");
	char *s = NULL;
	size_t n = 0, cap = 0;
	for (int c; (c = fgetc(f)) != EOF;) {
		if (n + 2 > cap)
			s = realloc(s, cap = cap * 2 + 256);
		s[n++] = (char)c;
	}
	fclose(f);
	if (!s)
		return strdup("");
	s[n] = 0;
	return s;
}

typedef struct result {
	int rc;
	char *out, *err;
} result;

/* Runs `kiln ARGS` in dir; ARGS is a shell fragment. */
static result kiln(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static result kiln(const char *fmt, ...)
{
	char args[2048], cmd[4096], errpath[128];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof args, fmt, ap);
	va_end(ap);
	snprintf(errpath, sizeof errpath, "%s/stderr.txt", dir);
	snprintf(cmd, sizeof cmd, "cd '%s' && '%s/kiln' %s 2>'%s'", dir, KILN_BIN, args, errpath);
	FILE *p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	result r = {0};
	size_t n = 0, cap = 256;
	r.out = malloc(cap);
	for (int c; (c = fgetc(p)) != EOF;) {
		if (n + 2 > cap)
			r.out = realloc(r.out, cap *= 2);
		r.out[n++] = (char)c;
	}
	r.out[n] = 0;
	int st = pclose(p);
	r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
	r.err = slurp(errpath);
	return r;
}

static void result_free(result *r)
{
	free(r->out);
	free(r->err);
}

static int lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* A failure: non-zero exit, one "kiln: error: " line containing want. */
static void assert_fails(result r, const char *want)
{
	ck_assert_int_ne(r.rc, 0);
	ck_assert_msg(strncmp(r.err, "kiln: error: ", 13) == 0, "stderr: %s", r.err);
	ck_assert_msg(strstr(r.err, want) != NULL, "'%s' not in stderr: %s", want, r.err);
	ck_assert_int_eq(lines(r.err), 1);
}

#define contains(s, sub) ck_assert_msg(strstr((s), (sub)) != NULL, "'%s' not in:\n%s", (sub), (s))

/* y = relu(x*w + b) + relu(x*w + b): w trainable, b a buffer. */
static void save_model(const char *name)
{
	kiln_graph *g = kiln_graph_new("m");
	ir_type xt = {KILN_F32, 2, {ir_dim_sym(g, "N"), 3}};
	uint32_t x = ir_input_new(g, "x", &xt);
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 1, (int64_t[]){3});
	memcpy(t->data, (float[]){0.5f, -1, 2}, 3 * sizeof(float));
	uint32_t w = ir_param_new(g, "w", t, true);
	memcpy(t->data, (float[]){1, 1, -1}, 3 * sizeof(float));
	uint32_t b = ir_param_new(g, "b", t, false);
	kiln_tensor_free(t);
	uint32_t h[2];
	for (int i = 0; i < 2; i++) {
		ir_node *m = ir_node_new(g, KILN_OP_MUL, 2, (uint32_t[]){x, w}, 1, KILN_HERE);
		ck_assert_int_eq(ir_infer_node(g, m), KILN_OK);
		ir_node *a = ir_node_new(g, KILN_OP_ADD, 2, (uint32_t[]){m->out[0], b}, 1, KILN_HERE);
		ck_assert_int_eq(ir_infer_node(g, a), KILN_OK);
		ir_node *r = ir_node_new(g, KILN_OP_RELU, 1, a->out, 1, KILN_HERE);
		ck_assert_int_eq(ir_infer_node(g, r), KILN_OK);
		h[i] = r->out[0];
	}
	ir_node *y = ir_node_new(g, KILN_OP_ADD, 2, h, 1, KILN_HERE);
	ck_assert_int_eq(ir_infer_node(g, y), KILN_OK);
	ir_output_add(g, y->out[0], "y");
	char path[128];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_save(g, path, &e) == KILN_OK, "%s", e.msg);
	kiln_graph_free(g);
}

static void write_file(const char *name, const char *text)
{
	char path[128];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

static int mkdir_in(const char *name)
{
	char path[128];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return mkdir(path, 0777);
}

/* ---- help and version --------------------------------------------------- */

START_TEST(version_prints_the_version)
{
	result r = kiln("--version");
	ck_assert_int_eq(r.rc, 0);
	contains(r.out, "kiln " KILN_VERSION);
	result_free(&r);
}
END_TEST

START_TEST(help_lists_every_command)
{
	result r = kiln("--help");
	ck_assert_int_eq(r.rc, 0);
	contains(r.out, "inspect");
	contains(r.out, "run");
	contains(r.out, "opt");
	result_free(&r);
}
END_TEST

START_TEST(help_cmd_and_cmd_help_print_the_same)
{
	result a = kiln("help opt"), b = kiln("opt --help");
	ck_assert_int_eq(a.rc, 0);
	ck_assert_int_eq(b.rc, 0);
	ck_assert_str_eq(a.out, b.out);
	contains(a.out, "--passes");
	contains(a.out, "cse"); /* the pass list */
	result_free(&a);
	result_free(&b);
	for (const char *const *c = (const char *const[]){"inspect", "run", "help", NULL}; *c; c++) {
		result h = kiln("%s --help", *c);
		ck_assert_int_eq(h.rc, 0);
		contains(h.out, "usage: kiln ");
		result_free(&h);
	}
}
END_TEST

START_TEST(no_command_prints_usage_and_fails)
{
	result r = kiln("%s", "");
	ck_assert_int_ne(r.rc, 0);
	contains(r.err, "usage: kiln");
	result_free(&r);
}
END_TEST

/* ---- errors ------------------------------------------------------------- */

START_TEST(unknown_subcommand_fails)
{
	result r = kiln("frobnicate x.kir");
	assert_fails(r, "unknown command 'frobnicate'");
	result_free(&r);
}
END_TEST

START_TEST(unknown_flag_fails)
{
	save_model("m.kir");
	result r = kiln("inspect --bogus m.kir");
	assert_fails(r, "unknown option '--bogus'");
	ck_assert_int_eq(r.rc, 2);
	result_free(&r);
}
END_TEST

START_TEST(missing_file_fails)
{
	result r = kiln("inspect nosuch.kir");
	assert_fails(r, "nosuch.kir");
	result_free(&r);
	r = kiln("run nosuch.kir -i x=x.npy");
	assert_fails(r, "nosuch.kir");
	result_free(&r);
}
END_TEST

START_TEST(parse_error_names_file_and_line)
{
	write_file("bad.kir", "graph @f(%x: f32[2]) -> (%y: f32[2]) {\n"
	                      "  %y = frobnicate %x : f32[2]\n"
	                      "  ret %y\n}\n");
	result r = kiln("opt bad.kir");
	assert_fails(r, "bad.kir:2:");
	result_free(&r);
}
END_TEST

/* ---- inspect ------------------------------------------------------------ */

START_TEST(inspect_prints_signature_params_and_histogram)
{
	save_model("m.kir");
	result r = kiln("inspect m.kir");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "graph: m");
	contains(r.out, "x: f32[N,3]");
	contains(r.out, "y: f32[N,3]");
	contains(r.out, "parameters: 2 tensors, 6 elements, 24 bytes");
	contains(r.out, "trainable: 1 tensors, 3 elements, 12 bytes");
	contains(r.out, "buffers: 1 tensors, 3 elements, 12 bytes");
	contains(r.out, "nodes: 7");
	/* sorted by count: 3 adds, then 2 muls and 2 relus by name */
	contains(r.out, "       3  add\n       2  mul\n       2  relu\n");
	contains(r.out, "graph @m");
	result_free(&r);
	r = kiln("inspect --no-ir m.kir");
	ck_assert_int_eq(r.rc, 0);
	ck_assert_ptr_null(strstr(r.out, "graph @m"));
	result_free(&r);
}
END_TEST

/* ---- run ---------------------------------------------------------------- */

static void write_x(const char *name, const float *v, int64_t rows)
{
	char path[128];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 2, (int64_t[]){rows, 3});
	memcpy(t->data, v, rows * 3 * sizeof *v);
	kiln_error e = {0};
	ck_assert_msg(kiln_npy_write(path, t, &e) == KILN_OK, "%s", e.msg);
	kiln_tensor_free(t);
}

START_TEST(run_writes_outputs_matching_the_interpreter)
{
	save_model("m.kir");
	float xs[6] = {1, 2, 3, -4, 5, -6};
	write_x("x.npy", xs, 2);
	result r = kiln("run m.kir -i x=x.npy -o out");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "y: f32[2,3]");
	result_free(&r);

	char path[128];
	kiln_error e = {0};
	kiln_graph *g = NULL;
	kiln_tensor *x = NULL, *want = NULL, *got = NULL;
	snprintf(path, sizeof path, "%s/m.kir", dir);
	ck_assert_int_eq(kiln_graph_load(path, &g, &e), KILN_OK);
	snprintf(path, sizeof path, "%s/x.npy", dir);
	ck_assert_int_eq(kiln_npy_read(path, &x, &e), KILN_OK);
	ck_assert_msg(kiln_graph_run(g, &x, 1, &want, 1, &e) == KILN_OK, "%s", e.msg);
	snprintf(path, sizeof path, "%s/out/y.npy", dir);
	ck_assert_msg(kiln_npy_read(path, &got, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(kiln_tensor_numel(got), 6);
	for (int i = 0; i < 6; i++)
		ck_assert_float_eq(((float *)got->data)[i], ((float *)want->data)[i]);
	/* y[0] = 2*relu([0.5+1, -2+1, 6-1]) = [3, 0, 10] */
	ck_assert_float_eq(((float *)got->data)[0], 3);
	ck_assert_float_eq(((float *)got->data)[1], 0);
	ck_assert_float_eq(((float *)got->data)[2], 10);
	kiln_tensor_free(x);
	kiln_tensor_free(want);
	kiln_tensor_free(got);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_bad_inputs)
{
	save_model("m.kir");
	write_x("x.npy", (float[]){1, 2, 3}, 1);
	result r = kiln("run m.kir -i x");
	assert_fails(r, "bad -i 'x': expected NAME=FILE.npy");
	result_free(&r);
	r = kiln("run m.kir -i nosuch=x.npy");
	assert_fails(r, "unknown input 'nosuch'; graph 'm' has inputs: x");
	result_free(&r);
	r = kiln("run m.kir");
	assert_fails(r, "missing input 'x' (f32[N,3])");
	result_free(&r);
	r = kiln("run m.kir -i x=missing.npy");
	assert_fails(r, "missing.npy");
	result_free(&r);
}
END_TEST

/* ---- opt ---------------------------------------------------------------- */

START_TEST(opt_without_passes_round_trips)
{
	save_model("m.kir");
	result r = kiln("opt m.kir");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	char path[128];
	snprintf(path, sizeof path, "%s/m.kir", dir);
	char *saved = slurp(path);
	ck_assert_str_eq(r.out, saved);
	free(saved);
	result_free(&r);
}
END_TEST

START_TEST(opt_runs_passes_and_dumps_to_stderr)
{
	save_model("m.kir");
	result r = kiln("opt m.kir --passes=cse,dce --dump-after=cse");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.err, "IR after cse");
	ck_assert_ptr_null(strstr(r.err, "IR after dce"));
	int relus = 0;
	for (const char *p = r.out; (p = strstr(p, "= relu")); p++)
		relus++;
	ck_assert_int_eq(relus, 1);
	result_free(&r);
}
END_TEST

START_TEST(opt_rejects_an_unknown_pass_listing_the_known_ones)
{
	save_model("m.kir");
	result r = kiln("opt m.kir --passes=fold,bogus");
	assert_fails(r, "unknown pass 'bogus' (known passes: infer, fold, cse, dce");
	result_free(&r);
	r = kiln("opt m.kir --dump-after=bogus");
	assert_fails(r, "unknown pass 'bogus'");
	result_free(&r);
}
END_TEST

/* ---- outputs that are inputs (the same file, by inode) -------------------- */

static void write_npy(const char *name, kiln_dtype dt, int rank, const int64_t *shape,
                      const void *data)
{
	char path[128];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	kiln_tensor *t = kiln_tensor_new(dt, rank, shape);
	memcpy(t->data, data, kiln_tensor_nbytes(t));
	kiln_error e = {0};
	ck_assert_msg(kiln_npy_write(path, t, &e) == KILN_OK, "%s", e.msg);
	kiln_tensor_free(t);
}

/* dir/file: a safetensors file holding one f32 tensor name (the weights
 * beside a hand-written .kir; without them the .kir is refused). */
static void write_weights(const char *file, const char *name, int rank, const int64_t *shape,
                          float fill)
{
	char path[128];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	kiln_tensor *t = kiln_tensor_new(KILN_F32, rank, shape);
	float *d = t->data;
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		d[i] = fill * (float)(1 + i % 3);
	kiln_tensor_set *set = kiln_tensor_set_new();
	kiln_error e = {0};
	ck_assert(kiln_tensor_set_add(set, name, t) == KILN_OK);
	kiln_tensor_free(t);
	ck_assert_msg(kiln_safetensors_write(path, set, &e) == KILN_OK, "%s", e.msg);
	kiln_tensor_set_free(set);
}

/* A trainable .kir written by hand (so node locations are its lines):
 * y = relu(x * w) [N,3], and 8 samples of x with class targets y.npy and
 * regression targets yr.npy. */
static void train_data(void)
{
	write_file("t.kir", "graph @t(%x: f32[N,3]) -> (%y: f32[N,3]) {\n"
	                    "  param %w: f32[3]\n"
	                    "  %0 = mul %x, %w : f32[N,3]\n"
	                    "  %y = relu %0 : f32[N,3]\n"
	                    "  ret %y\n}\n");
	write_weights("t.safetensors", "w", 1, (int64_t[]){3}, 0.5f);
	float x[24];
	for (int i = 0; i < 24; i++)
		x[i] = (float)(i % 7) - 3;
	write_npy("x.npy", KILN_F32, 2, (int64_t[]){8, 3}, x);
	write_npy("yr.npy", KILN_F32, 2, (int64_t[]){8, 3}, x);
	write_npy("y.npy", KILN_I64, 1, (int64_t[]){8}, (int64_t[]){0, 1, 2, 0, 1, 2, 0, 1});
}

/* The bytes of dir/name, to show that a refused command left it alone. */
static char *file_bytes(const char *name)
{
	char path[128];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return slurp(path);
}

static void assert_unchanged(const char *name, const char *before)
{
	char *now = file_bytes(name);
	ck_assert_msg(strcmp(now, before) == 0 && strlen(before) > 0, "%s was changed", name);
	free(now);
}

START_TEST(compile_refuses_to_overwrite_its_model)
{
	save_model("m.kir");
	char *kir = file_bytes("m.kir");
	result r = kiln("compile m.kir -o m.kir");
	assert_fails(r, "-o 'm.kir' is the same file as the model 'm.kir'");
	result_free(&r);
	r = kiln("compile m.kir -o ./m.kir --emit=kir"); /* another spelling, same inode */
	assert_fails(r, "the same file as the model 'm.kir'");
	result_free(&r);
	char cmd[256];
	snprintf(cmd, sizeof cmd, "ln -s m.kir '%s/link.kir'", dir);
	ck_assert_int_eq(system(cmd), 0);
	r = kiln("compile m.kir -o link.kir --emit=kir");
	assert_fails(r, "-o 'link.kir' is the same file as the model 'm.kir'");
	result_free(&r);
	/* derived files: the weights the model brings, the header beside a library */
	r = kiln("compile m.kir -o m.safetensors --emit=kir");
	assert_fails(r, "the model 'm.safetensors' (its weights)");
	result_free(&r);
	save_model("lib.h");
	r = kiln("compile lib.h -o lib.so");
	assert_fails(r, "-o 'lib.h' (the header written beside the library) is the same file as "
	                "the model 'lib.h'");
	result_free(&r);
	assert_unchanged("m.kir", kir);
	free(kir);
}
END_TEST

/* What kiln compile writes gets a new file's permissions (0666 or, for the
 * library, 0777, less the umask), not mkstemp's 0600: a header no one else
 * can read, or a library other users cannot load. */
START_TEST(compile_outputs_get_the_umask_permissions)
{
	save_model("m.kir");
	mode_t old = umask(027); /* inherited by the child */
	result r = kiln("compile m.kir -o m.so");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	result_free(&r);
	r = kiln("compile m.kir -o m.ll --emit=ll");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	result_free(&r);
	umask(old);
	const char *names[] = {"m.so", "m.h", "m.ll"};
	mode_t want[] = {0750, 0640, 0640};
	for (int i = 0; i < 3; i++) {
		char path[128];
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		ck_assert_int_eq(stat(path, &st), 0);
		ck_assert_msg((st.st_mode & 07777) == want[i], "%s has mode %o, want %o", names[i],
		              (unsigned)(st.st_mode & 07777), (unsigned)want[i]);
	}
}
END_TEST

/* -j N, -jN, --jobs N and --jobs=N all set LLVM's threads; --time-report
 * says how many parts ran on how many; a bad count is a usage error. */
START_TEST(compile_jobs_and_time_report)
{
	save_model("m.kir");
	const char *forms[] = {"-j 1", "-j2", "--jobs 3", "--jobs=1"};
	for (int i = 0; i < 4; i++) {
		result r = kiln("compile m.kir -o m.so --time-report %s", forms[i]);
		ck_assert_msg(r.rc == 0, "%s: %s", forms[i], r.err);
		contains(r.err, "kiln: time: lower ");
		contains(r.err, " part");
		result_free(&r);
	}
	const char *bad[] = {"-jx", "-j -1", "--jobs=2.5"};
	for (int i = 0; i < 3; i++) {
		result r = kiln("compile m.kir -o m.so %s", bad[i]);
		assert_fails(r, "--jobs needs a whole number >= 0");
		result_free(&r);
	}
}
END_TEST

START_TEST(opt_export_and_run_refuse_to_overwrite_an_input)
{
	save_model("m.kir");
	char *kir = file_bytes("m.kir");
	result r = kiln("opt m.kir --passes=cse -o m.kir");
	assert_fails(r, "-o 'm.kir' is the same file as the model 'm.kir'");
	result_free(&r);
	r = kiln("export m.kir -o m.kir");
	assert_fails(r, "-o 'm.kir' is the same file as the model 'm.kir'");
	result_free(&r);
	assert_unchanged("m.kir", kir);
	free(kir);
	/* run -o DIR writes DIR/y.npy: not when that is an -i file */
	ck_assert_int_eq(mkdir_in("out"), 0);
	write_x("out/y.npy", (float[]){1, 2, 3}, 1);
	char *y = file_bytes("out/y.npy");
	r = kiln("run m.kir -i x=out/y.npy -o out");
	assert_fails(r, "-o 'out/y.npy' (an output of the model) is the same file as -i 'out/y.npy'");
	result_free(&r);
	assert_unchanged("out/y.npy", y);
	free(y);
}
END_TEST

START_TEST(train_refuses_outputs_that_are_its_data)
{
	train_data();
	char *y = file_bytes("y.npy"), *x = file_bytes("x.npy");
	result r = kiln("train t.kir --x x.npy --y y.npy --log y.npy");
	assert_fails(r, "--log 'y.npy' is the same file as --y 'y.npy'");
	result_free(&r);
	r = kiln("train t.kir --x x.npy --y y.npy --val-x x.npy --val-y y.npy --val-out x.npy");
	assert_fails(r, "--val-out 'x.npy' is the same file as --x 'x.npy'");
	result_free(&r);
	r = kiln("train t.kir --x x.npy --y y.npy --export t.kir");
	assert_fails(r, "--export 't.kir' is the same file as the model 't.kir'");
	result_free(&r);
	r = kiln("train t.kir --x x.npy --y y.npy --export x.kir --log x.safetensors");
	assert_fails(r, "the weights written beside it) are the same file");
	result_free(&r);
	r = kiln("train t.kir --x x.npy --y y.npy --checkpoint . --log ckpt-000000001.safetensors");
	assert_fails(r, "--log 'ckpt-000000001.safetensors' is a checkpoint's name inside "
	                "--checkpoint '.'");
	result_free(&r);
	assert_unchanged("y.npy", y);
	assert_unchanged("x.npy", x);
	free(x), free(y);
}
END_TEST

/* ---- failed writes ------------------------------------------------------- */

START_TEST(train_log_on_a_full_disk_fails)
{
	if (access("/dev/full", W_OK) != 0) {
		printf("skipped train_log_on_a_full_disk_fails: no writable /dev/full\n");
		return;
	}
	train_data();
	result r = kiln("train t.kir --x x.npy --y y.npy --batch 2 --epochs 3 --log /dev/full");
	assert_fails(r, "cannot write --log '/dev/full'");
	contains(r.err, strerror(ENOSPC));
	result_free(&r);
	/* standard output is an output too */
	save_model("m.kir");
	r = kiln("opt m.kir > /dev/full");
	assert_fails(r, "cannot write to standard output");
	contains(r.err, strerror(ENOSPC));
	result_free(&r);
}
END_TEST

/* ---- destinations are checked before the work -------------------------------- */

START_TEST(train_checks_destinations_before_training)
{
	train_data();
	write_file("afile", "x");
	const char *bad[][2] = {
		{"--export nosuch/t.onnx", "--export 'nosuch/t.onnx': the folder 'nosuch' does not exist"},
		{"--val-x x.npy --val-y y.npy --val-out nosuch/o.npy", "--val-out 'nosuch/o.npy'"},
		{"--log nosuch/c.csv", "--log 'nosuch/c.csv'"},
		{"--checkpoint afile", "--checkpoint 'afile' is not a folder"},
		{"--checkpoint nosuch/ck", "--checkpoint 'nosuch/ck': the folder 'nosuch' does not exist"},
		{"--export .", "--export '.' is a folder"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		result r = kiln("train t.kir --x x.npy --y y.npy --batch 2 --epochs 2 %s", bad[i][0]);
		assert_fails(r, bad[i][1]);
		ck_assert_msg(!strstr(r.out, "epoch"), "trained before failing: %s", r.out);
		result_free(&r);
	}
}
END_TEST

/* ---- run -o DIR: one file per output ------------------------------------------- */

START_TEST(run_gives_every_output_its_own_file)
{
	write_file("d.kir", "graph @d(%x: f32[N,3]) -> (%a/b: f32[N,3], %a_b: f32[N,3], %c: f32[N,3]) {\n"
	                    "  %a/b = relu %x : f32[N,3]\n"
	                    "  %a_b = neg %x : f32[N,3]\n"
	                    "  %c = abs %x : f32[N,3]\n"
	                    "  ret %a/b, %a_b, %c\n}\n");
	write_x("x.npy", (float[]){1, -2, 3}, 1);
	result r = kiln("run d.kir -i x=x.npy -o out");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "a/b: f32[1,3] -> out/a_b_1.npy (file name changed");
	contains(r.out, "a_b: f32[1,3] -> out/a_b.npy\n");
	contains(r.out, "c: f32[1,3] -> out/c.npy\n");
	result_free(&r);
	const char *file[] = {"out/a_b_1.npy", "out/a_b.npy"};
	const float want[][3] = {{1, 0, 3}, {-1, 2, -3}};
	for (int k = 0; k < 2; k++) {
		char path[128];
		kiln_tensor *t = NULL;
		kiln_error e = {0};
		snprintf(path, sizeof path, "%s/%s", dir, file[k]);
		ck_assert_msg(kiln_npy_read(path, &t, &e) == KILN_OK, "%s", e.msg);
		for (int i = 0; i < 3; i++)
			ck_assert_float_eq(((float *)t->data)[i], want[k][i]);
		kiln_tensor_free(t);
	}
}
END_TEST

/* The header's parameters are names too: 'a/b' and 'a_b' are one C
 * identifier, 'N' is the symbol's, 'float' a keyword.  It must compile. */
START_TEST(compile_header_parameters_are_distinct_identifiers)
{
	write_file("hd.kir", "graph @hd(%a/b: f32[N,3], %a_b: f32[N,3]) -> (%N: f32[N,3], "
	                     "%float: f32[N,3]) {\n"
	                     "  %N = add %a/b, %a_b : f32[N,3]\n"
	                     "  %float = neg %a_b : f32[N,3]\n"
	                     "  ret %N, %float\n}\n");
	result r = kiln("compile hd.kir -o hd.so");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	result_free(&r);
	char cmd[256];
	snprintf(cmd, sizeof cmd, "cc -fsyntax-only -x c '%s/hd.h'", dir);
	ck_assert_msg(system(cmd) == 0, "hd.h does not compile");
}
END_TEST

/* ---- kiln train: options checked against the data -------------------------------- */

START_TEST(train_validates_batch_schedule_accum_and_data)
{
	train_data();
	result r = kiln("train t.kir --x x.npy --y y.npy --batch 100000000000");
	assert_fails(r, "--batch 100000000000 is more than the 8 samples in x.npy");
	result_free(&r);
	r = kiln("train t.kir --x x.npy --y y.npy --batch 4 --accum 3");
	assert_fails(r, "--accum 3 is more than the run's 2 steps");
	result_free(&r);
	/* a schedule of any length is read, not dropped */
	char sched[600] = "";
	for (int i = 0; i < 40; i++)
		strcat(sched, "warmup:1,");
	r = kiln("train t.kir --x x.npy --y y.npy --batch 2 --schedule %sbogus", sched);
	assert_fails(r, "bad --schedule");
	result_free(&r);
	r = kiln("train t.kir --x x.npy --y y.npy --batch 2 --epochs 3 --schedule %scosine --quiet",
	         sched);
	ck_assert_msg(r.rc == 0, "%s", r.err);
	result_free(&r);
	/* NaN in the data is the data's fault: name the file and the index */
	float x[24] = {0};
	x[3 * 5 + 1] = 0.0f / 0.0f;
	write_npy("nan.npy", KILN_F32, 2, (int64_t[]){8, 3}, x);
	r = kiln("train t.kir --x nan.npy --y y.npy --batch 2");
	assert_fails(r, "nan.npy: element [5,1] (sample 5) is NaN");
	ck_assert_ptr_null(strstr(r.err, "--lr"));
	result_free(&r);
}
END_TEST

/* ---- compile --train: what a CNN needs ------------------------------------------ */

START_TEST(compile_train_cnn_without_batch_says_so)
{
	write_file("cnn.kir", "graph @cnn(%x: f32[N,1,4,4]) -> (%y: f32[N,2,4,4]) {\n"
	                      "  param %w: f32[2,1,3,3]\n"
	                      "  %y = conv %x, %w {pads=[1,1,1,1]} : f32[N,2,4,4] name(\"conv1\")\n"
	                      "  ret %y\n}\n");
	write_weights("cnn.safetensors", "w", 4, (int64_t[]){2, 1, 3, 3}, 0.1f);
	result r = kiln("compile --train cnn.kir -o c.so");
	assert_fails(r, "training a model with Conv 'conv1' needs a fixed batch size: pass --batch N");
	result_free(&r);
}
END_TEST

/* ---- bench --json ---------------------------------------------------------------------- */

/* The number after "key": in a JSON line, failing when there is none. */
static double json_number(const char *out, const char *key)
{
	char k[64];
	snprintf(k, sizeof k, "\"%s\": ", key);
	const char *p = strstr(out, k);
	ck_assert_msg(p, "no %s in: %s", k, out);
	return strtod(p + strlen(k), NULL);
}

/* peak_rss_mib is the bench process's own peak and start_rss_mib its peak
 * before the library was loaded: a batch of 4M rows of f32[3] in and out
 * (2 x 46 MiB) must add at least 80 MiB to the start, a batch of 1 less
 * than 16 MiB. */
START_TEST(bench_json_reports_the_peak_rss)
{
	save_model("m.kir");
	result r = kiln("compile m.kir -o m.so");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	result_free(&r);
	double peak[2], start[2];
	const char *batch[2] = {"1", "4000000"};
	for (int i = 0; i < 2; i++) {
		r = kiln("bench m.so --batch %s --runs 3 --warmup 1 --json", batch[i]);
		ck_assert_msg(r.rc == 0, "%s", r.err);
		ck_assert_msg(json_number(r.out, "median_ms") > 0, "%s", r.out);
		peak[i] = json_number(r.out, "peak_rss_mib");
		start[i] = json_number(r.out, "start_rss_mib");
		ck_assert_msg(start[i] > 0 && start[i] <= peak[i], "%s", r.out);
		result_free(&r);
	}
	ck_assert_msg(peak[0] - start[0] < 16, "batch 1: peak RSS %.1f MiB, %.1f at the start",
	              peak[0], start[0]);
	ck_assert_msg(peak[1] - start[1] > 80, "batch 4M: peak RSS %.1f MiB, %.1f at the start",
	              peak[1], start[1]);
}
END_TEST

/* --profile: a second JSON line with every kernel of the library (as
 * --emit=kir names them) and its time per run, not all zero; the text
 * form lists them with their shares. */
START_TEST(bench_profile_lists_every_kernel)
{
	save_model("m.kir");
	result r = kiln("compile m.kir -o m.so");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	result_free(&r);
	r = kiln("compile m.kir --emit=kir -o mk.kir");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	result_free(&r);
	char kp[600];
	snprintf(kp, sizeof kp, "%s/mk.kir", dir);
	char *kir = slurp(kp);
	int nk = 0;
	for (const char *p = kir; (p = strstr(p, "\nkernel ")); p++)
		nk++;
	ck_assert_int_gt(nk, 0);
	r = kiln("bench m.so --batch 200000 --runs 5 --warmup 1 --json --profile");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	double med = json_number(r.out, "median_ms");
	const char *prof = strstr(r.out, "\n{\"profile\": [");
	ck_assert_msg(prof, "no profile line: %s", r.out);
	int listed = 0;
	double sum = 0;
	for (const char *p = prof; (p = strstr(p, "{\"kernel\": \"")); listed++) {
		p += strlen("{\"kernel\": \"");
		char name[64] = "", pat[80];
		sscanf(p, "%63[^\"]", name);
		snprintf(pat, sizeof pat, "kernel %s ", name);
		ck_assert_msg(strstr(kir, pat), "'%s' is not a kernel of: %s", name, kir);
		double ms = json_number(p, "ms");
		ck_assert(ms >= 0);
		sum += ms;
	}
	ck_assert_int_eq(listed, nk);
	/* timed: something, but no bound on how much (tests assert no wall times) */
	ck_assert_msg(sum > 0 && med > 0, "kernels %.4f ms, a run %.4f ms", sum, med);
	result_free(&r);
	r = kiln("bench m.so --batch 1000 --runs 3 --profile");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "kernels over 3 profiled runs");
	result_free(&r);
	free(kir);
}
END_TEST

/* ---- inspect a compiled library; kinds by content ------------------------------------ */

START_TEST(inspect_prints_a_library_signature)
{
	save_model("m.kir");
	result r = kiln("compile m.kir -o m.so");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	result_free(&r);
	r = kiln("inspect m.so");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "model: m\n");
	contains(r.out, "kind: inference library");
	contains(r.out, "inputs: 1\n  x: f32[N,3]\n");
	contains(r.out, "outputs: 1\n  y: f32[N,3]\n");
	result_free(&r);
	r = kiln("compile --train m.kir --loss mse --batch 4 -o step.so");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	result_free(&r);
	r = kiln("inspect step.so");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "kind: training library");
	result_free(&r);
	/* bench times the train step (compiled for batch 4, whatever --batch
	 * says): 1 + 3 optimizer steps taken; --eval times the eval program */
	r = kiln("bench step.so --batch 7 --warmup 1 --runs 3 --json");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "\"batch\": 4,");
	contains(r.out, "\"runs\": 3,");
	contains(r.out, "\"program\": \"train_step\", \"steps\": 4}");
	result_free(&r);
	r = kiln("bench step.so --batch 7 --warmup 1 --runs 3 --json --eval");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "\"batch\": 7,");
	contains(r.out, "\"program\": \"run\", \"steps\": 0}");
	result_free(&r);
	r = kiln("bench step.so --profile");
	assert_fails(r, "--profile times the eval program's kernels: add --eval");
	result_free(&r);
	/* by content, not name: a library called .bin, a graph called .onnx */
	char cmd[512];
	snprintf(cmd, sizeof cmd, "cd '%s' && cp m.so lib.bin && cp m.kir g.onnx && "
	         "cp m.safetensors g.safetensors", dir);
	ck_assert_int_eq(system(cmd), 0);
	r = kiln("inspect lib.bin");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "kind: inference library");
	result_free(&r);
	write_x("x.npy", (float[]){1, 2, 3}, 1);
	r = kiln("run lib.bin -i x=x.npy");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "y: f32[1,3]");
	result_free(&r);
	/* every CPU by default; --threads N for the library's pool */
	r = kiln("run lib.bin -i x=x.npy --threads 3");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "y: f32[1,3]");
	result_free(&r);
	r = kiln("run lib.bin -i x=x.npy --threads 0");
	assert_fails(r, "option '--threads' needs a number in [1, 256]");
	result_free(&r);
	r = kiln("inspect --no-ir g.onnx");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "graph: m");
	result_free(&r);
	r = kiln("export m.kir -o m.onnx");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	result_free(&r);
	snprintf(cmd, sizeof cmd, "cd '%s' && cp m.onnx model.bin", dir);
	ck_assert_int_eq(system(cmd), 0);
	r = kiln("inspect --no-ir model.bin");
	ck_assert_msg(r.rc == 0, "%s", r.err);
	contains(r.out, "graph: m");
	contains(r.out, "x: f32[N,3]");
	result_free(&r);
	r = kiln("inspect x.npy");
	assert_fails(r, "x.npy: this is a NumPy array (.npy), not a model");
	result_free(&r);
	r = kiln("bench m.kir");
	assert_fails(r, "m.kir: this is a .kir graph, not a compiled library");
	result_free(&r);
}
END_TEST

/* ---- messages name the user's files, never kiln's sources ------------------------------- */

/* No "<file>.c:" of kiln's and no path into kiln's source tree. */
static void assert_no_source_paths(const result *r)
{
	ck_assert_msg(!strstr(r->err, KILN_SRC), "a kiln source path in: %s", r->err);
	ck_assert_msg(!strstr(r->err, ".c:"), "a C source location in: %s", r->err);
}

START_TEST(messages_name_no_kiln_source_file)
{
	train_data();
	write_file("cnn.kir", "graph @cnn(%x: f32[N,1,4,4]) -> (%y: f32[N,2,4,4]) {\n"
	                      "  param %w: f32[2,1,3,3]\n"
	                      "  %y = conv %x, %w {pads=[1,1,1,1]} : f32[N,2,4,4]\n"
	                      "  ret %y\n}\n");
	write_weights("cnn.safetensors", "w", 4, (int64_t[]){2, 1, 3, 3}, 0.1f);
	/* the optimizer is traced by the tool: its message names t.kir */
	result r = kiln("train t.kir --x x.npy --y yr.npy --loss mse --batch 2 --clip-norm -1");
	ck_assert_int_ne(r.rc, 0);
	contains(r.err, "t.kir:");
	assert_no_source_paths(&r);
	result_free(&r);
	const char *cmds[] = {
		"train t.kir --x x.npy --y yr.npy --loss smooth_l1 --batch 2",
		"train t.kir --x x.npy --y y.npy --loss nll --batch 2 --optimizer adam --clip-norm 1",
		"compile --train cnn.kir -o c.so",
		"compile --train t.kir --loss cross_entropy --accum 2 -o c.so --emit=bogus",
		"train cnn.kir --x x.npy --y y.npy",
		"run t.kir -i x=y.npy",
	};
	for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
		r = kiln("%s", cmds[i]);
		assert_no_source_paths(&r);
		result_free(&r);
	}
}
END_TEST

static Suite *cli_suite(void)
{
	Suite *s = suite_create("cli");
	TCase *help = tcase_create("help"), *err = tcase_create("errors");
	TCase *ins = tcase_create("inspect"), *run = tcase_create("run"), *opt = tcase_create("opt");
	TCase *files = tcase_create("files"), *train = tcase_create("train");
	TCase *all[] = {help, err, ins, run, opt, files, train};
	int nall = sizeof all / sizeof *all;
	for (int i = 0; i < nall; i++) {
		tcase_add_checked_fixture(all[i], setup, teardown);
		tcase_set_timeout(all[i], 120);
	}
	tcase_add_test(help, version_prints_the_version);
	tcase_add_test(help, help_lists_every_command);
	tcase_add_test(help, help_cmd_and_cmd_help_print_the_same);
	tcase_add_test(help, no_command_prints_usage_and_fails);
	tcase_add_test(err, unknown_subcommand_fails);
	tcase_add_test(err, unknown_flag_fails);
	tcase_add_test(err, missing_file_fails);
	tcase_add_test(err, parse_error_names_file_and_line);
	tcase_add_test(err, messages_name_no_kiln_source_file);
	tcase_add_test(ins, inspect_prints_signature_params_and_histogram);
	tcase_add_test(ins, inspect_prints_a_library_signature);
	tcase_add_test(run, run_writes_outputs_matching_the_interpreter);
	tcase_add_test(run, run_rejects_bad_inputs);
	tcase_add_test(run, run_gives_every_output_its_own_file);
	tcase_add_test(run, compile_header_parameters_are_distinct_identifiers);
	tcase_add_test(run, bench_json_reports_the_peak_rss);
	tcase_add_test(run, bench_profile_lists_every_kernel);
	tcase_add_test(run, compile_jobs_and_time_report);
	tcase_add_test(opt, opt_without_passes_round_trips);
	tcase_add_test(opt, opt_runs_passes_and_dumps_to_stderr);
	tcase_add_test(opt, opt_rejects_an_unknown_pass_listing_the_known_ones);
	tcase_add_test(files, compile_refuses_to_overwrite_its_model);
	tcase_add_test(files, compile_outputs_get_the_umask_permissions);
	tcase_add_test(files, opt_export_and_run_refuse_to_overwrite_an_input);
	tcase_add_test(files, train_refuses_outputs_that_are_its_data);
	tcase_add_test(files, train_log_on_a_full_disk_fails);
	tcase_add_test(files, train_checks_destinations_before_training);
	tcase_add_test(train, train_validates_batch_schedule_accum_and_data);
	tcase_add_test(train, compile_train_cnn_without_batch_says_so);
	for (int i = 0; i < nall; i++)
		suite_add_tcase(s, all[i]);
	return s;
}

#include "check_main.h"
KILN_CHECK_MAIN(cli_suite)
