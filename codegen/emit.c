/*
 * emit.c: a lowered, memory-planned kernel module to a standalone library
 * (cg_emit, cg_emit_train) through a backend (backend.h; the registry is
 * here); driver/compile.c runs the stages before it.
 *
 * Each kernel is first checked against the backend's supports(), so a
 * kernel it cannot take fails the compile naming the backend, the kernel
 * and why; then the backend emits the kernels and the library around them
 * and writes the library (or, with --emit, that stage: kir is printed here
 * and needs no backend).  Beside a .so goes its readable header, written
 * here from the module alone.
 *
 * Every file is written to a temporary name in its destination folder and
 * renamed into place (cg_temp_file, cg_commit_file), so a failed compile
 * never leaves a half-written library; tools (the linker) run through
 * posix_spawnp with an argument vector (no shell, so any path is safe) and
 * their exit status is checked (cg_run_tool).
 *
 * cg_emit_train (the last section) emits a training library: the step and
 * eval programs over one state table (docs/TRAINING.md).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codegen/backend.h"
#include "runtime/rt.h"

extern char **environ;

/* ---- names and files --------------------------------------------------- */

/* A C identifier from s: other characters become '_', a leading digit gets
 * one before it; "model" when s is empty. */
void cg_c_name(char *out, size_t size, const char *s)
{
	size_t n = 0;
	if (!s || !*s)
		s = "model";
	if (*s >= '0' && *s <= '9')
		out[n++] = '_';
	for (; *s && n + 1 < size; s++) {
		bool ok = (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		          (*s >= '0' && *s <= '9') || *s == '_';
		out[n++] = ok ? *s : '_';
	}
	out[n] = 0;
}

static bool ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && strcmp(s + a - b, suf) == 0;
}

/* A new, empty temporary file beside path ("<path>.tmp<pid>.<seq>"); its
 * name into tmp.  It is created with mode (0666 for data, 0777 for the
 * library) less the umask, as any new file would be: mkstemp's 0600 would
 * leave the header unreadable to others and the linker keeps the mode of
 * the file it writes over (0711). */
kiln_status cg_temp_file(const char *path, unsigned mode, char *tmp, size_t size,
                         kiln_error *err)
{
	static atomic_uint seq;
	for (int tries = 0; tries < 100; tries++) {
		if (snprintf(tmp, size, "%s.tmp%ld.%u", path, (long)getpid(),
		             atomic_fetch_add(&seq, 1)) >= (int)size)
			return ir_seterr(err, KILN_EINVAL, "%s: path too long", path);
		int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
		if (fd >= 0) {
			close(fd);
			return KILN_OK;
		}
		if (errno != EEXIST)
			break;
	}
	return ir_seterr(err, KILN_EIO, "%s: cannot create a temporary file: %s", path,
	                 strerror(errno));
}

/* fsync, then rename over path: the new contents are on disk before the
 * name points at them, so a crash leaves the old file or the new one. */
kiln_status cg_commit_file(const char *tmp, const char *path, kiln_error *err)
{
	int fd = open(tmp, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) != 0) {
		kiln_status st = ir_seterr(err, KILN_EIO, "%s: cannot write: fsync: %s", path,
		                           strerror(errno));
		if (fd >= 0)
			close(fd);
		unlink(tmp);
		return st;
	}
	close(fd);
	if (rename(tmp, path) != 0) {
		kiln_status st = ir_seterr(err, KILN_EIO, "%s: cannot write: %s", path, strerror(errno));
		unlink(tmp);
		return st;
	}
	return KILN_OK;
}

/* ---- linking -------------------------------------------------------------- */

/* argv as one line for a message, each argument with a space or quote in
 * it in single quotes; "..." once size runs out. */
static void command_line(char *const *argv, char *out, size_t size)
{
	size_t n = 0;
	out[0] = 0;
	for (int i = 0; argv[i] && n + 4 < size; i++) {
		bool q = !argv[i][0] || strpbrk(argv[i], " \t'\"\\$") != NULL;
		int k = snprintf(out + n, size - n, "%s%s%s%s", i ? " " : "", q ? "'" : "", argv[i],
		                 q ? "'" : "");
		n += k < 0 ? 0 : (size_t)k;
	}
	if (n >= size - 1 && size > 4)
		memcpy(out + size - 4, "...", 4);
}

/* The tool's output on one line, in place: trailing blanks dropped, each
 * newline a ';'. */
static void one_line(char *s)
{
	size_t n = strlen(s);
	while (n && isspace((unsigned char)s[n - 1]))
		s[--n] = 0;
	for (char *p = s; *p; p++)
		if (*p == '\n')
			*p = ';';
}

kiln_status cg_run_tool(const char *what, char *const *argv, kiln_error *err)
{
	/* every input must be there: an empty or missing path would leave only
	 * the linker's "cannot find" to say what went wrong */
	for (int i = 1; argv[i]; i++)
		if (!argv[i][0])
			return ir_seterr(err, KILN_EINVAL, "%s: cannot link: argument %d of '%s' is "
			                 "empty (a kiln bug)", what, i, argv[0]);
	int fd[2];
	if (pipe2(fd, O_CLOEXEC) != 0)
		return ir_seterr(err, KILN_EIO, "%s: cannot run '%s': pipe: %s", what, argv[0],
		                 strerror(errno));
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
	posix_spawn_file_actions_adddup2(&fa, fd[1], 2);
	pid_t pid;
	int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(fd[1]);
	if (rc != 0) {
		close(fd[0]);
		return ir_seterr(err, KILN_EIO, "%s: cannot run the linker '%s': %s", what, argv[0],
		                 strerror(rc));
	}
	/* keep the start of what it says (the first error), read the rest so
	 * that it never blocks on a full pipe */
	char said[640];
	size_t got = 0;
	for (;;) {
		char buf[4096];
		ssize_t k = read(fd[0], buf, sizeof buf);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		size_t keep = got + (size_t)k < sizeof said - 1 ? (size_t)k : sizeof said - 1 - got;
		memcpy(said + got, buf, keep);
		got += keep;
	}
	said[got] = 0;
	close(fd[0]);
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return ir_seterr(err, KILN_EIO, "%s: waiting for '%s': %s", what, argv[0],
			                 strerror(errno));
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return KILN_OK;
	char cmd[360];
	command_line(argv, cmd, sizeof cmd);
	one_line(said);
	if (WIFEXITED(status))
		return ir_seterr(err, KILN_EIO, "%s: linking failed: '%s' exited with status %d: %s"
		                 "; the command: %s", what, argv[0], WEXITSTATUS(status),
		                 said[0] ? said : "(it printed nothing)", cmd);
	return ir_seterr(err, KILN_EIO, "%s: linking failed: '%s' was killed by signal %d: %s"
	                 "; the command: %s", what, argv[0], WTERMSIG(status),
	                 said[0] ? said : "(it printed nothing)", cmd);
}

/* ---- the header ------------------------------------------------------------ */

static const char *c_type(kiln_dtype dt)
{
	static const char *const t[KILN_DT_COUNT] = {
		[KILN_F32] = "float", [KILN_F64] = "double", [KILN_I8] = "int8_t",
		[KILN_U8] = "uint8_t", [KILN_I32] = "int32_t", [KILN_I64] = "int64_t",
		[KILN_BOOL] = "uint8_t", [KILN_F16] = "uint16_t", [KILN_BF16] = "uint16_t"};
	return (unsigned)dt < KILN_DT_COUNT && t[dt] ? t[dt] : "void";
}

static const char *io_name(const cg_module *m, int b)
{
	return m->buf[b].name ? m->buf[b].name : "";
}

static const char *sym_name(const cg_module *m, int k)
{
	return m->symname && m->symname[k] ? m->symname[k] : "";
}

/* Names a prototype's parameter may not take: C and C++ keywords, the
 * types the header uses, and the entry points' own parameters. */
static bool reserved(const char *s)
{
	static const char *const r[] = {
		"auto", "break", "case", "char", "const", "continue", "default", "do", "double",
		"else", "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long",
		"register", "restrict", "return", "short", "signed", "sizeof", "static", "struct",
		"switch", "typedef", "union", "unsigned", "void", "volatile", "while", "bool",
		"class", "delete", "false", "new", "namespace", "operator", "private", "protected",
		"public", "template", "this", "throw", "true", "try", "typename", "using", "virtual",
		"int8_t", "uint8_t", "uint16_t", "int32_t", "int64_t", "ctx", "lr", "loss"};
	for (size_t i = 0; i < sizeof r / sizeof *r; i++)
		if (!strcmp(s, r[i]))
			return true;
	return false;
}

static void param_base(const cg_module *m, int io, char *out, size_t size)
{
	int b = io < m->ninputs ? m->inputs[io] : m->outputs[io - m->ninputs];
	cg_c_name(out, size, io_name(m, b));
	if (!io_name(m, b)[0] || reserved(out))
		snprintf(out, size, "%s%d", io < m->ninputs ? "in" : "out",
		         io < m->ninputs ? io : io - m->ninputs);
}

/* Parameter i of _run: the value's name as a C identifier, or in<i>/out<i>
 * when that is empty, reserved, or the same identifier as a symbol or an
 * earlier parameter ('a/b' and 'a_b' are both a_b), so every header
 * compiles. */
static void param_name(const cg_module *m, int io, char *out, size_t size)
{
	char other[256];
	param_base(m, io, out, size);
	bool clash = false;
	for (int k = 0; !clash && k < m->nsym; k++) {
		cg_c_name(other, sizeof other, sym_name(m, k));
		clash = !strcmp(other, out);
	}
	for (int j = 0; !clash && j < io; j++) {
		param_base(m, j, other, sizeof other);
		clash = !strcmp(other, out);
	}
	if (clash)
		snprintf(out, size, "%s%d", io < m->ninputs ? "in" : "out",
		         io < m->ninputs ? io : io - m->ninputs);
}

/* "f32[2,3]" of a buffer: the lowering's text, else (a module built without
 * a graph, all dims fixed) made here. */
static const char *type_text(const cg_buf *b, char *buf, size_t size)
{
	if (b->type_text)
		return b->type_text;
	size_t n = (size_t)snprintf(buf, size, "%s[", kiln_dtype_name(b->dt));
	for (int d = 0; d < b->type.rank && n < size; d++)
		n += (size_t)snprintf(buf + n, size - n, "%s%lld", d ? "," : "",
		                      (long long)b->type.dim[d]);
	if (n < size)
		snprintf(buf + n, size - n, "]");
	return buf;
}

static void header_signature(FILE *f, const cg_module *m)
{
	char ty[256];
	for (int i = 0; i < m->ninputs + m->noutputs; i++) {
		int b = i < m->ninputs ? m->inputs[i] : m->outputs[i - m->ninputs];
		fprintf(f, " *   %-7s %s: %s\n", i == 0 ? "inputs:" : i == m->ninputs ? "outputs:" : "",
		        io_name(m, b), type_text(&m->buf[b], ty, sizeof ty));
	}
	if (m->nsym) {
		fprintf(f, " *   symbols:");
		for (int k = 0; k < m->nsym; k++)
			fprintf(f, " %s", sym_name(m, k));
		fprintf(f, " (sizes bound at run time; pass them to _run)\n");
	}
}

static void header_run(FILE *f, const cg_module *m, const char *name, const char *suffix)
{
	char p[256];
	fprintf(f, "int %s_%s(%s_ctx *ctx", name, suffix, name);
	for (int k = 0; k < m->nsym; k++) {
		cg_c_name(p, sizeof p, sym_name(m, k));
		fprintf(f, ", int64_t %s", p);
	}
	for (int i = 0; i < m->ninputs + m->noutputs; i++) {
		int b = i < m->ninputs ? m->inputs[i] : m->outputs[i - m->ninputs];
		param_name(m, i, p, sizeof p);
		fprintf(f, ",\n        %s%s *%s", i < m->ninputs ? "const " : "",
		        c_type(m->buf[b].dt), p);
	}
	fprintf(f, ");\n");
}

static void write_header(FILE *f, const cg_module *m, const char *name, const char *h,
                         const char *so, bool cuda)
{
	fprintf(f, "/*\n * %s: the model '%s' compiled by kiln %s into %s.\n *\n"
	        " * Signature (row-major, dense):\n", h, m->name ? m->name : name,
	        KILN_VERSION, so);
	header_signature(f, m);
	fprintf(f, " *\n * A context owns all memory a run needs (scratch is sized at the first run\n"
	        " * and grown only for a larger batch); use one context per thread.\n"
	        " * Functions returning int return a kiln_status:\n"
	        " *   0 OK, 1 EINVAL (null pointer, a size that does not fit the signature,\n"
	        " *   a batch of 0 where it is not allowed, an index or target out of\n"
	        " *   range: the outputs are then unspecified), 3 EUNSUPPORTED, 5 ENOMEM;\n"
	        " *   %s_errmsg(ctx) says why.  %s_set_threads(ctx, 0) uses\n"
	        " *   $KILN_NUM_THREADS (default 1).  %s_create returns NULL when out of\n"
	        " *   memory.  The library also exports `kiln_model_desc`, the self-describing\n"
	        " *   signature kiln_load() reads.\n */\n", name, name, name);
	char guard[128];
	snprintf(guard, sizeof guard, "%s", name);
	for (char *p = guard; *p; p++)
		*p = (char)toupper((unsigned char)*p);
	fprintf(f, "#ifndef %s_H\n#define %s_H\n\n#include <stdint.h>\n\n#ifdef __cplusplus\n"
	        "extern \"C\" {\n#endif\n\n", guard, guard);
	fprintf(f, "typedef struct %s_ctx %s_ctx;\n\n%s_ctx *%s_create(void);\n", name, name, name,
	        name);
	header_run(f, m, name, "run");
	fprintf(f, "int %s_set_threads(%s_ctx *ctx, int nthreads);\n"
	        "const char *%s_errmsg(const %s_ctx *ctx);\nvoid %s_destroy(%s_ctx *ctx);\n",
	        name, name, name, name, name, name);
	if (cuda) {
		fprintf(f, "\n/* CUDA (docs/CUDA.md): _create opens libcuda.so.1 and the first GPU;\n"
		        " * _create_ex says why it could not (msg may be NULL).  _run copies its\n"
		        " * host arrays in and out; _run_device takes device pointers and copies\n"
		        " * nothing.  _set_threads does nothing. */\n"
		        "#include <stddef.h>\nint %s_create_ex(%s_ctx **ctx, char *msg, size_t size);\n",
		        name, name);
		header_run(f, m, name, "run_device");
	}
	fprintf(f, "\n#ifdef __cplusplus\n}\n#endif\n#endif /* %s_H */\n", guard);
}

/* Writes the header of m (and, for a training library, eval and ti). */
typedef void (*header_fn)(FILE *f, const cg_module *m, const cg_module *eval,
                          const cg_train_info *ti, const char *name, const char *h,
                          const char *so);

static void inference_header(FILE *f, const cg_module *m, const cg_module *eval,
                             const cg_train_info *ti, const char *name, const char *h,
                             const char *so)
{
	write_header(f, m, name, h, so, false);
}

static void cuda_header(FILE *f, const cg_module *m, const cg_module *eval,
                        const cg_train_info *ti, const char *name, const char *h, const char *so)
{
	write_header(f, m, name, h, so, true);
}

static kiln_status header(const cg_module *m, const cg_module *eval, const cg_train_info *ti,
                          header_fn write, const char *name, const char *so_path,
                          kiln_error *err)
{
	char path[4200], tmp[4300];
	size_t n = strlen(so_path) - (ends_with(so_path, ".so") ? 3 : 0);
	if (n + 3 >= sizeof path)
		return ir_seterr(err, KILN_EINVAL, "%s: path too long", so_path);
	snprintf(path, sizeof path, "%.*s.h", (int)n, so_path);
	kiln_status st = cg_temp_file(path, 0666, tmp, sizeof tmp, err);
	if (st != KILN_OK)
		return st;
	FILE *f = fopen(tmp, "w");
	if (!f) {
		unlink(tmp);
		return ir_seterr(err, KILN_EIO, "%s: %s", path, strerror(errno));
	}
	const char *base = strrchr(so_path, '/'), *hbase = strrchr(path, '/');
	write(f, m, eval, ti, name, hbase ? hbase + 1 : path, base ? base + 1 : so_path);
	if (ferror(f) | fclose(f)) {
		unlink(tmp);
		return ir_seterr(err, KILN_EIO, "%s: write failed: %s", path, strerror(errno));
	}
	return cg_commit_file(tmp, path, err);
}

/* ---- emission --------------------------------------------------------------- */

static kiln_status emit_dot(const cg_module *m, const char *path, kiln_error *err)
{
	char *text = cg_module_dot(m);
	if (!text)
		return ir_seterr(err, KILN_ENOMEM, "%s: out of memory drawing the graph", path);
	kiln_status st = rt_write_atomic(path, text, strlen(text), err);
	free(text);
	return st;
}

static kiln_status emit_kir(const cg_module *m, const char *path, kiln_error *err)
{
	char tmp[4200];
	kiln_status st = cg_temp_file(path, 0666, tmp, sizeof tmp, err);
	if (st != KILN_OK)
		return st;
	FILE *f = fopen(tmp, "w");
	if (!f) {
		unlink(tmp);
		return ir_seterr(err, KILN_EIO, "%s: %s", path, strerror(errno));
	}
	cg_print(m, f);
	if (ferror(f) | fclose(f)) {
		unlink(tmp);
		return ir_seterr(err, KILN_EIO, "%s: write failed", path);
	}
	return cg_commit_file(tmp, path, err);
}


/* ---- backends ------------------------------------------------------------------ */

static const cg_backend *const backends[] = {&cg_llvm_backend, &cg_cuda_backend,
                                             &cg_cuda_emu_backend};

const cg_backend *cg_backend_find(const char *name)
{
	if (!name)
		return backends[0];
	for (size_t i = 0; i < sizeof backends / sizeof *backends; i++)
		if (!strcmp(backends[i]->name, name))
			return backends[i];
	return NULL;
}

kiln_status cg_backend_check(const cg_backend *b, const cg_module *m, kiln_error *err)
{
	for (int k = 0; m && k < m->nkern; k++) {
		char why[256] = "";
		const cg_kernel *kn = &m->kern[k];
		if (!b->supports(m, kn, why, sizeof why))
			return ir_seterr(err, KILN_EUNSUPPORTED, "backend '%s' cannot take kernel '%s'%s%s%s: %s",
			                 b->name, kn->name, kn->origin ? " (from " : "",
			                 kn->origin ? kn->origin : "", kn->origin ? ")" : "",
			                 why[0] ? why : "unsupported");
	}
	return KILN_OK;
}

static bool has_stage(const cg_backend *b, const char *stage)
{
	if (!strcmp(stage, "so"))
		return true;
	for (const char *const *s = b->stages; s && *s; s++)
		if (!strcmp(*s, stage))
			return true;
	return false;
}

/* lib through backend b: check, then the calls in backend.h's order. */
static kiln_status backend(const cg_backend *b, const cg_library *lib, const char *out,
                           const char *stage, kiln_error *err)
{
	if (!b)
		return ir_seterr(err, KILN_EINVAL, "no such backend");
	if (!has_stage(b, stage))
		return ir_seterr(err, KILN_EINVAL, "backend '%s' cannot write '%s'", b->name, stage);
	kiln_status st = cg_backend_check(b, lib->m, err);
	if (st == KILN_OK)
		st = cg_backend_check(b, lib->eval, err);
	cg_session *s = NULL;
	if (st == KILN_OK)
		st = b->open(&s, lib, err);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (st == KILN_OK)
		st = b->emit_kernels(s, lib->m, err);
	if (st == KILN_OK && lib->eval)
		st = b->emit_kernels(s, lib->eval, err);
	if (st == KILN_OK)
		st = b->emit_library(s, err);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (lib->o->times)
		lib->o->times->emit = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
	if (st == KILN_OK)
		st = b->write(s, stage, out, err);
	if (s)
		b->close(s);
	return st;
}

kiln_status cg_emit(const cg_backend *b, const cg_module *m, const char *out_path,
                    const kiln_compile_opts *o, const char *name, kiln_error *err)
{
	const char *emit = o->emit ? o->emit : "so";
	if (strcmp(emit, "kir") == 0)
		return emit_kir(m, out_path, err);
	if (strcmp(emit, "dot") == 0)
		return emit_dot(m, out_path, err);
	cg_library lib = {.m = m, .name = name, .o = o};
	kiln_status st = backend(b ? b : cg_backend_find(NULL), &lib, out_path, emit, err);
	/* the emulated CUDA library is for kiln_load (tests): no typed entry points */
	if (st == KILN_OK && strcmp(emit, "so") == 0 && b != &cg_cuda_emu_backend)
		st = header(m, NULL, NULL, b == &cg_cuda_backend ? cuda_header : inference_header, name,
		            out_path, err);
	return st;
}
/* int <name>_train_step(ctx, syms..., data inputs..., double lr, T *loss) */
static void header_train_step(FILE *f, const cg_module *m, const cg_train_info *ti,
                              const char *name)
{
	char p[256];
	fprintf(f, "int %s_train_step(%s_ctx *ctx", name, name);
	for (int k = 0; k < m->nsym; k++) {
		cg_c_name(p, sizeof p, sym_name(m, k));
		fprintf(f, ", int64_t %s", p);
	}
	for (int i = 0; i < m->ninputs; i++) {
		if (i == ti->lr || i == ti->t || i == ti->apply || i == ti->micro)
			continue;
		param_name(m, i, p, sizeof p);
		fprintf(f, ",\n        const %s *%s", c_type(m->buf[m->inputs[i]].dt), p);
	}
	fprintf(f, ", double lr, %s *loss);\n", c_type(m->buf[m->outputs[0]].dt));
}

/* A training library's header; cuda: the CUDA library's (state on the
 * device, read and written tensor by tensor instead of _save/_load). */
static void write_train_header(FILE *f, const cg_module *m, const cg_module *eval,
                               const cg_train_info *ti, const char *name, const char *h,
                               const char *so, bool cuda)
{
	size_t bytes = 0;
	for (int i = 0; i < ti->nstate; i++)
		bytes += kiln_tensor_nbytes(ti->state_init[i]);
	fprintf(f, "/*\n * %s: the training library for '%s', compiled by kiln %s into %s.\n *\n"
	        " * Train step (loss, then the state it replaces):\n", h, eval->name ? eval->name : name,
	        KILN_VERSION, so);
	header_signature(f, m);
	fprintf(f, " * Eval:\n");
	header_signature(f, eval);
	fprintf(f, " *\n * The context owns %d state tensors (%zu bytes: parameters, buffers,\n"
	        " * optimizer state), initialised from the model's weights%s.  _train_step takes\n"
	        " * lr (schedules are the caller's) and counts steps itself (_steps);\n%s"
	        " * ints are kiln_status (0 OK); %s_errmsg(ctx) says why.  One context per\n"
	        " * thread.\n */\n", ti->nstate, bytes, cuda ? " in GPU memory" : "",
	        cuda ? " * _get_state/_set_state copy them to and from the host.\n"
	             : " * _save/_load write and read a safetensors checkpoint in kiln_trainer's\n"
	               " * format (atomic; a corrupt file is refused and nothing changes).\n",
	        name);
	char guard[128];
	snprintf(guard, sizeof guard, "%s_TRAIN", name);
	for (char *p = guard; *p; p++)
		*p = (char)toupper((unsigned char)*p);
	fprintf(f, "#ifndef %s_H\n#define %s_H\n\n#include <stdint.h>\n\n"
	        "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n", guard, guard);
	fprintf(f, "typedef struct %s_ctx %s_ctx;\n\n%s_ctx *%s_create(void);\n", name, name, name,
	        name);
	header_train_step(f, m, ti, name);
	header_run(f, eval, name, "eval_step");
	fprintf(f, "int64_t %s_steps(const %s_ctx *ctx);\n", name, name);
	if (!cuda)
		fprintf(f, "int %s_save(%s_ctx *ctx, const char *path);\n"
		        "int %s_load(%s_ctx *ctx, const char *path);\n", name, name, name, name);
	else
		fprintf(f, "\n/* CUDA (docs/CUDA.md): the state lives on the GPU.  _create_ex says why\n"
		        " * _create could not (no driver, no GPU); _get_state/_set_state copy\n"
		        " * state tensor i (of _num_state, named _state_name(i), _state_bytes(i)\n"
		        " * bytes, in the order of a kiln_trainer checkpoint) to or from the host;\n"
		        " * with _micro and _set_counters that is what a checkpoint holds. */\n"
		        "#include <stddef.h>\n"
		        "int %s_create_ex(%s_ctx **ctx, char *msg, size_t size);\n"
		        "int64_t %s_micro(const %s_ctx *ctx);\n"
		        "int %s_set_counters(%s_ctx *ctx, int64_t steps, int64_t micro);\n"
		        "int %s_num_state(void);\nconst char *%s_state_name(int i);\n"
		        "int64_t %s_state_bytes(int i);\n"
		        "int %s_get_state(%s_ctx *ctx, int i, void *host);\n"
		        "int %s_set_state(%s_ctx *ctx, int i, const void *host);\n", name, name, name,
		        name, name, name, name, name, name, name, name, name, name);
	fprintf(f, "int %s_set_threads(%s_ctx *ctx, int nthreads);\n"
	        "const char *%s_errmsg(const %s_ctx *ctx);\nvoid %s_destroy(%s_ctx *ctx);\n",
	        name, name, name, name, name, name);
	fprintf(f, "\n#ifdef __cplusplus\n}\n#endif\n#endif /* %s_H */\n", guard);
}

static void train_header(FILE *f, const cg_module *m, const cg_module *eval,
                         const cg_train_info *ti, const char *name, const char *h,
                         const char *so)
{
	write_train_header(f, m, eval, ti, name, h, so, false);
}

static void cuda_train_header(FILE *f, const cg_module *m, const cg_module *eval,
                              const cg_train_info *ti, const char *name, const char *h,
                              const char *so)
{
	write_train_header(f, m, eval, ti, name, h, so, true);
}

/* The back half of kiln_compile_train: the step program m (STATE buffers
 * indexed into ti's table) and its eval program into one library with its
 * header. */
kiln_status cg_emit_train(const cg_backend *b, const cg_module *m, const cg_module *eval,
                          const cg_train_info *ti, const char *out_path,
                          const kiln_compile_opts *o, const char *name, kiln_error *err)
{
	cg_library lib = {.m = m, .eval = eval, .ti = ti, .name = name, .o = o};
	const char *stage = o->emit ? o->emit : "so";
	b = b ? b : cg_backend_find(NULL);
	kiln_status st = backend(b, &lib, out_path, stage, err);
	/* an emulated CUDA library is for kiln_load (no typed entry points), a
	 * CUDA stage (cu, ptx, cubin) is no library */
	if (st == KILN_OK && b != &cg_cuda_emu_backend && !strcmp(stage, "so"))
		st = header(m, eval, ti, b == &cg_cuda_backend ? cuda_train_header : train_header, name,
		            out_path, err);
	return st;
}
