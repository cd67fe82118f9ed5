/*
 * test_so_isolation.c: generated libraries side by side in one process.
 *
 * Two inference libraries (ma, mb: same signature, different arithmetic)
 * and two training libraries (ta, tb: same signature, different state) are
 * linked into one program with -l:, in both orders, and also dlopened into
 * this process with RTLD_GLOBAL; each must compute what it computes alone
 * (inference: exact values; training: the interpreter's eval output, and
 * the same loss as when it is the only library).  Each library's dynamic
 * symbol table must hold only its own entry points and the documented
 * descriptions (kiln_model_desc, kiln_train_desc) plus versioned libc/libm
 * imports, no relocation may refer to a symbol the library defines (its own
 * references must not go through the GOT or PLT, where another library's
 * definition could win), and the library is named (SONAME) after its file.
 *
 * The symbol-table test needs readelf; without it this executable exits
 * 77, which CTest reports as skipped.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "kiln/kiln.h"
#include "so_util.h"

static char dir[1024];
static bool built;
static kiln_graph *ta_eval, *tb_eval;

/* y = x*2 + 1 (ma) or x*-3 (mb), x f32[4] */
static kiln_graph *arith(const char *name, double mul, double add)
{
	kiln_graph *g = kiln_graph_new(name);
	kiln_value x = kiln_input(g, "x", KILN_F32, 1, (int64_t[]){4});
	kiln_value y = kiln_mul(g, x, kiln_scalar(g, KILN_F32, mul));
	if (add != 0)
		y = kiln_add(g, y, kiln_scalar(g, KILN_F32, add));
	kiln_output(g, "y", y);
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

/* x f32[N,4] -> f32[N,2]: ta one Linear, tb Linear-ReLU-Linear. */
static kiln_graph *net(const char *name, bool deep, bool training)
{
	kiln_graph *g = kiln_graph_new(name);
	kiln_graph_seed(g, deep ? 2 : 1);
	kiln_graph_set_training(g, training);
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 4});
	kiln_value h = deep ? kiln_relu(g, kiln_linear(g, "l1", x, 3, true)) : x;
	kiln_output(g, "out", kiln_linear(g, "l2", h, 2, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

static const char *lib_path(const char *name)
{
	static char p[4][1200];
	static int k;
	char *s = p[k++ % 4];
	snprintf(s, 1200, "%s/%s.so", dir, name);
	return s;
}

static void build_all(void)
{
	if (built)
		return;
	snprintf(dir, sizeof dir, "%s", so_dir("so_isolation_test"));
	kiln_error e = {0};
	kiln_graph *ma = arith("ma", 2, 1), *mb = arith("mb", -3, 0);
	ck_assert_msg(kiln_compile(ma, lib_path("ma"), NULL, &e) == KILN_OK, "ma: %s", e.msg);
	ck_assert_msg(kiln_compile(mb, lib_path("mb"), NULL, &e) == KILN_OK, "mb: %s", e.msg);
	kiln_graph_free(ma), kiln_graph_free(mb);
	kiln_train_opts o = {.optim = KILN_OPT_SGD, .loss = KILN_LOSS_MSE};
	const char *names[2] = {"ta", "tb"};
	for (int i = 0; i < 2; i++) {
		kiln_graph *t = net(names[i], i == 1, true), *ev = net(names[i], i == 1, false);
		ck_assert_msg(kiln_compile_train(t, ev, &o, 2, lib_path(names[i]), NULL, &e) ==
		              KILN_OK, "%s: %s", names[i], e.msg);
		kiln_graph_free(t);
		*(i ? &tb_eval : &ta_eval) = ev;
	}
	built = true;
}

static const float X[8] = {1, 2, 3, 4, -0.5f, 0.25f, 2.5f, -1};
static const float Y[4] = {0.5f, -1, 2, 0};

/* The interpreter's output of an eval graph on X. */
static void reference(const kiln_graph *g, float want[4])
{
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 2, (int64_t[]){2, 4}), *out = NULL;
	memcpy(x->data, X, sizeof X);
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_run(g, &x, 1, &out, 1, &e) == KILN_OK, "%s", e.msg);
	memcpy(want, out->data, 4 * sizeof *want);
	kiln_tensor_free(x), kiln_tensor_free(out);
}

/* ---- one program, linked with -l: ------------------------------------------- */

/* Each USE_<lib> prints one line: its run's status, outputs (and loss). */
static const char driver_src[] =
	"#include <stdio.h>\n"
	"#ifdef USE_ma\n#include \"ma.h\"\n#endif\n"
	"#ifdef USE_mb\n#include \"mb.h\"\n#endif\n"
	"#ifdef USE_ta\n#include \"ta.h\"\n#endif\n"
	"#ifdef USE_tb\n#include \"tb.h\"\n#endif\n"
	"static const float x4[4] = {1, 2, 3, 4};\n"
	"static const float X[8] = {1, 2, 3, 4, -0.5f, 0.25f, 2.5f, -1}, Y[4] = {0.5f, -1, 2, 0};\n"
	"#define INFER(m) { m##_ctx *c = m##_create(); float y[4] = {0};\\\n"
	"  int rc = c ? m##_run(c, x4, y) : -1;\\\n"
	"  printf(#m \" %d %.9g %.9g %.9g %.9g %s\\n\", rc, y[0], y[1], y[2], y[3],\\\n"
	"         rc ? m##_errmsg(c) : \"\"); m##_destroy(c); }\n"
	"#define TRAIN(m) { m##_ctx *c = m##_create(); float o[4] = {0}, loss = -1;\\\n"
	"  int e = c ? m##_eval_step(c, 2, X, o) : -1;\\\n"
	"  int t = c ? m##_train_step(c, X, Y, 0.1, &loss) : -1;\\\n"
	"  printf(#m \" %d %d %.9g %.9g %.9g %.9g %.9g %s\\n\", e, t, o[0], o[1], o[2], o[3],\\\n"
	"         loss, e || t ? m##_errmsg(c) : \"\"); m##_destroy(c); }\n"
	"int main(void)\n{\n"
	"#ifdef USE_ma\n\tINFER(ma)\n#endif\n"
	"#ifdef USE_mb\n\tINFER(mb)\n#endif\n"
	"#ifdef USE_ta\n\tTRAIN(ta)\n#endif\n"
	"#ifdef USE_tb\n\tTRAIN(tb)\n#endif\n"
	"\treturn 0;\n}\n";

/* Builds the driver with USE_<lib> for each of libs (space-separated, in
 * link order), runs it and returns its output in out. */
static void run_driver(const char *libs, char *out, size_t size)
{
	char src[1100], exe[1100], defs[256] = "", links[256] = "", cmd[8192];
	snprintf(src, sizeof src, "%s/drive_two.c", dir);
	snprintf(exe, sizeof exe, "%s/drive_two", dir);
	FILE *f = fopen(src, "w");
	ck_assert_ptr_nonnull(f);
	fputs(driver_src, f);
	ck_assert_int_eq(fclose(f), 0);
	char list[256];
	snprintf(list, sizeof list, "%s", libs);
	for (char *l = strtok(list, " "); l; l = strtok(NULL, " ")) {
		snprintf(defs + strlen(defs), sizeof defs - strlen(defs), " -DUSE_%s", l);
		snprintf(links + strlen(links), sizeof links - strlen(links), " -l:%s.so", l);
	}
	snprintf(cmd, sizeof cmd, "cc -O1 %s -I'%s' -o '%s' '%s' -L'%s' %s -Wl,-rpath,'%s'", defs,
	         dir, exe, src, dir, links, dir);
	ck_assert_msg(sh(cmd, out, size) == 0, "%s:\n%s", cmd, out);
	snprintf(cmd, sizeof cmd, "'%s'", exe);
	ck_assert_msg(sh(cmd, out, size) == 0, "%s:\n%s", cmd, out);
}

/* The line of out that starts with "<lib> ". */
static void line_of(const char *out, const char *lib, char *line, size_t size)
{
	char key[16];
	snprintf(key, sizeof key, "%s ", lib);
	const char *p = out;
	while (p && strncmp(p, key, strlen(key)) != 0)
		p = (p = strchr(p, '\n')) ? p + 1 : NULL;
	ck_assert_msg(p != NULL, "no line for %s in:\n%s", lib, out);
	size_t n = strcspn(p, "\n");
	snprintf(line, size, "%.*s", (int)n, p);
}

static void check_infer_line(const char *line, const float want[4])
{
	int rc = -1;
	float y[4];
	char name[8];
	ck_assert_msg(sscanf(line, "%7s %d %g %g %g %g", name, &rc, &y[0], &y[1], &y[2], &y[3]) == 6,
	              "%s", line);
	ck_assert_msg(rc == 0, "%s", line);
	for (int i = 0; i < 4; i++)
		ck_assert_msg(y[i] == want[i], "%s: y[%d] = %g, want %g", line, i, y[i], want[i]);
}

static void check_train_line(const char *line, const kiln_graph *eval)
{
	int e = -1, t = -1;
	float o[4], loss, want[4];
	char name[8];
	ck_assert_msg(sscanf(line, "%7s %d %d %g %g %g %g %g", name, &e, &t, &o[0], &o[1], &o[2],
	                     &o[3], &loss) == 8, "%s", line);
	ck_assert_msg(e == 0 && t == 0, "%s", line);
	reference(eval, want);
	for (int i = 0; i < 4; i++)
		ck_assert_msg(fabsf(o[i] - want[i]) <= 1e-5f * (1 + fabsf(want[i])),
		              "%s: out[%d] = %g, interpreter %g", line, i, o[i], want[i]);
	ck_assert_msg(isfinite(loss) && loss > 0, "%s", line);
}

static const float MA[4] = {3, 5, 7, 9}, MB[4] = {-3, -6, -9, -12};

/* Every library alone, then all four in one program in both link orders:
 * each line must be what the library printed alone. */
START_TEST(four_libraries_linked_into_one_program)
{
	build_all();
	static const char *const libs[4] = {"ma", "mb", "ta", "tb"};
	char out[8192], alone[4][512], line[512];
	for (int i = 0; i < 4; i++) {
		run_driver(libs[i], out, sizeof out);
		line_of(out, libs[i], alone[i], sizeof alone[i]);
	}
	check_infer_line(alone[0], MA);
	check_infer_line(alone[1], MB);
	check_train_line(alone[2], ta_eval);
	check_train_line(alone[3], tb_eval);
	static const char *const orders[2] = {"ma mb ta tb", "tb ta mb ma"};
	for (int k = 0; k < 2; k++) {
		run_driver(orders[k], out, sizeof out);
		for (int i = 0; i < 4; i++) {
			line_of(out, libs[i], line, sizeof line);
			ck_assert_msg(strcmp(line, alone[i]) == 0, "link order '%s': %s\nalone: %s",
			              orders[k], line, alone[i]);
		}
	}
}
END_TEST

/* ---- dlopen with RTLD_GLOBAL ---------------------------------------------------- */

typedef void *(*create_fn)(void);
typedef void (*destroy_fn)(void *);
typedef const char *(*errmsg_fn)(const void *);
typedef int (*run_fn)(void *, const float *, float *);
typedef int (*eval_fn)(void *, int64_t, const float *, float *);
typedef int (*train_fn)(void *, const float *, const float *, double, float *);

static void *sym(void *h, const char *lib, const char *what)
{
	char name[64];
	snprintf(name, sizeof name, "%s_%s", lib, what);
	void *p = dlsym(h, name);
	ck_assert_msg(p != NULL, "%s: %s", name, dlerror());
	return p;
}

static void global_infer(void *h, const char *lib, const float want[4])
{
	void *c = ((create_fn)sym(h, lib, "create"))();
	ck_assert_ptr_nonnull(c);
	float x[4] = {1, 2, 3, 4}, y[4] = {0};
	int rc = ((run_fn)sym(h, lib, "run"))(c, x, y);
	ck_assert_msg(rc == 0, "%s_run: %d %s", lib, rc, ((errmsg_fn)sym(h, lib, "errmsg"))(c));
	for (int i = 0; i < 4; i++)
		ck_assert_msg(y[i] == want[i], "%s: y[%d] = %g, want %g", lib, i, y[i], want[i]);
	((destroy_fn)sym(h, lib, "destroy"))(c);
}

static void global_train(void *h, const char *lib, const kiln_graph *eval)
{
	void *c = ((create_fn)sym(h, lib, "create"))();
	ck_assert_ptr_nonnull(c);
	float o[4] = {0}, want[4], loss = -1;
	errmsg_fn msg = (errmsg_fn)sym(h, lib, "errmsg");
	int rc = ((eval_fn)sym(h, lib, "eval_step"))(c, 2, X, o);
	ck_assert_msg(rc == 0, "%s_eval_step: %d %s", lib, rc, msg(c));
	reference(eval, want);
	for (int i = 0; i < 4; i++)
		ck_assert_msg(fabsf(o[i] - want[i]) <= 1e-5f * (1 + fabsf(want[i])),
		              "%s: out[%d] = %g, interpreter %g", lib, i, o[i], want[i]);
	rc = ((train_fn)sym(h, lib, "train_step"))(c, X, Y, 0.1, &loss);
	ck_assert_msg(rc == 0, "%s_train_step: %d %s", lib, rc, msg(c));
	ck_assert(isfinite(loss) && loss > 0);
	((destroy_fn)sym(h, lib, "destroy"))(c);
}

/* Each opened RTLD_GLOBAL (so its exports are visible to every later
 * library), then used last-opened first; kiln_load of one still reads its
 * own description. */
START_TEST(four_libraries_dlopened_rtld_global)
{
	build_all();
	static const char *const libs[4] = {"ma", "mb", "ta", "tb"};
	void *h[4];
	for (int i = 0; i < 4; i++) {
		h[i] = dlopen(lib_path(libs[i]), RTLD_NOW | RTLD_GLOBAL);
		ck_assert_msg(h[i] != NULL, "dlopen %s: %s", libs[i], dlerror());
	}
	global_train(h[3], "tb", tb_eval);
	global_train(h[2], "ta", ta_eval);
	global_infer(h[1], "mb", MB);
	global_infer(h[0], "ma", MA);
	kiln_model *m = NULL;
	kiln_error e = {0};
	ck_assert_msg(kiln_load(lib_path("mb"), &m, &e) == KILN_OK, "%s", e.msg);
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 1, (int64_t[]){4}), *y = NULL;
	memcpy(x->data, (float[]){1, 2, 3, 4}, 4 * sizeof(float));
	ck_assert_msg(kiln_model_run(m, &x, 1, &y, 1, &e) == KILN_OK, "%s", e.msg);
	ck_assert(!memcmp(y->data, MB, sizeof MB));
	kiln_tensor_free(x), kiln_tensor_free(y);
	kiln_model_free(m);
	for (int i = 3; i >= 0; i--)
		dlclose(h[i]);
}
END_TEST

/* ---- the dynamic symbol table ------------------------------------------------------ */

/* readelf -W of so into out. */
static void readelf(const char *opt, const char *so, char *out, size_t size)
{
	char cmd[1500];
	snprintf(cmd, sizeof cmd, "readelf -W %s '%s'", opt, so);
	ck_assert_msg(sh(cmd, out, size) == 0, "%s: %s", cmd, out);
}

static bool in_set(const char *name, const char *const *set)
{
	for (; *set; set++)
		if (strcmp(name, *set) == 0)
			return true;
	return false;
}

/* Defined dynamic symbols must be the allowed ones, all of them; undefined
 * ones versioned glibc symbols (or the weak hooks crt files declare); and
 * no dynamic relocation may name a symbol the library defines. */
static void check_exports(const char *lib, const char *const *allowed)
{
	const char *so = lib_path(lib);
	static char out[65536];
	readelf("--dyn-syms", so, out, sizeof out);
	char defined[64][256];
	int ndef = 0;
	for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n")) {
		char num[16], val[32], type[16], bind[16], vis[16], ndx[16], name[256] = "";
		long size;
		if (sscanf(l, "%15s %31s %ld %15s %15s %15s %15s %255s", num, val, &size, type, bind,
		           vis, ndx, name) < 7 || num[strlen(num) - 1] != ':' || !name[0])
			continue;
		if (strcmp(ndx, "UND") == 0) {
			ck_assert_msg(strstr(name, "@GLIBC_") || strcmp(bind, "WEAK") == 0,
			              "%s imports %s, which is not from libc, libm or libpthread", lib, name);
			continue;
		}
		ck_assert_msg(in_set(name, allowed), "%s exports %s", lib, name);
		ck_assert_int_lt(ndef, 64);
		snprintf(defined[ndef++], sizeof defined[0], "%s", name);
	}
	for (int i = 0; allowed[i]; i++) {
		bool found = false;
		for (int k = 0; k < ndef; k++)
			found |= strcmp(defined[k], allowed[i]) == 0;
		ck_assert_msg(found, "%s does not export %s", lib, allowed[i]);
	}
	readelf("-r", so, out, sizeof out);
	for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n")) {
		char off[32], info[32], type[64], val[32], name[256] = "";
		if (sscanf(l, "%31s %31s %63s %31s %255s", off, info, type, val, name) < 5)
			continue;
		name[strcspn(name, "@")] = 0;
		for (int k = 0; k < ndef; k++)
			ck_assert_msg(strcmp(name, defined[k]) != 0, "%s refers to its own %s through a "
			              "%s relocation: another library's definition could win", lib, name,
			              type);
	}
	readelf("-d", so, out, sizeof out);
	char want[64];
	snprintf(want, sizeof want, "Library soname: [%s.so]", lib);
	ck_assert_msg(strstr(out, want), "%s: no '%s' in\n%s", lib, want, out);
}

START_TEST(only_entry_points_exported_and_bound_locally)
{
	build_all();
	static const char *const ma[] = {"ma_create", "ma_run", "ma_set_threads", "ma_errmsg",
	                                 "ma_destroy", "kiln_model_desc", NULL};
	static const char *const ta[] = {"ta_create", "ta_train_step", "ta_eval_step", "ta_steps",
	                                 "ta_save", "ta_load", "ta_set_threads", "ta_errmsg",
	                                 "ta_destroy", "kiln_model_desc", "kiln_train_desc", NULL};
	check_exports("ma", ma);
	check_exports("ta", ta);
}
END_TEST

static void teardown_all(void)
{
	kiln_graph_free(ta_eval), kiln_graph_free(tb_eval);
	ta_eval = tb_eval = NULL;
	built = false;
}

static bool no_readelf;

static Suite *suite(void)
{
	Suite *s = suite_create("so_isolation");
	TCase *tc = tcase_create("isolation");
	tcase_set_timeout(tc, 300);
	tcase_add_unchecked_fixture(tc, NULL, teardown_all);
	tcase_add_test(tc, four_libraries_linked_into_one_program);
	tcase_add_test(tc, four_libraries_dlopened_rtld_global);
	if (have_tool("readelf"))
		tcase_add_test(tc, only_entry_points_exported_and_bound_locally);
	else
		no_readelf = true;
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *r = srunner_create(suite());
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	if (!failed && no_readelf)
		printf("skipped: readelf not found (the symbol-table test did not run)\n");
	return failed ? EXIT_FAILURE : no_readelf ? 77 : EXIT_SUCCESS;
}
