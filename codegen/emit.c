/*
 * emit.c: kiln_compile, the driver from a graph to a standalone library.
 *
 * The pipeline is a flat list of stages on a private clone of the graph:
 * graph passes, cg_lower, cg_memplan, LLVM IR (llvm.c), LLVMVerifyModule,
 * the new pass manager's default<O3> for the target machine, an object
 * file, and a link with the system C compiler against the never-sanitized
 * runtime archive (KILN_RT_GEN_LIB, or $KILN_RT_LIB), which puts the model
 * driver and thread pool into the library so it needs only libc, libm and
 * libpthread.  --emit stops early and writes that stage instead (kir, ll,
 * asm, obj).  Beside a .so goes its readable header.
 *
 * Every file is written to a temporary name in its destination folder and
 * renamed into place, so a failed compile never leaves a half-written
 * library; the linker runs through posix_spawnp with an argument vector
 * (no shell, so any path is safe) and its exit status is checked.  LLVM
 * diagnostics go to a handler: errors become the compile's message,
 * warnings (say, a loop hinted for vectorization that LLVM would not
 * vectorize) are dropped.
 *
 * kiln_compile_train (the last section) runs the same stages on two graphs,
 * the train step and the eval model, and turns every named parameter into
 * a STATE buffer indexed into one state table (docs/TRAINING.md).  The link
 * hides every symbol the runtime archive brings (--exclude-libs), so a
 * library exports only its entry points and descriptions, never kiln_*
 * functions that would clash with a process's own kiln.
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
#include <unistd.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "codegen/llvm.h"
#include "passes/passes.h"
#include "codegen/lower.h"

extern char **environ;

/* ---- names and files --------------------------------------------------- */

/* A C identifier from s: other characters become '_', a leading digit gets
 * one before it; "model" when s is empty. */
static void c_name(char *out, size_t size, const char *s)
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
static kiln_status make_temp(const char *path, mode_t mode, char *tmp, size_t size,
                             kiln_error *err)
{
	static atomic_uint seq;
	for (int tries = 0; tries < 100; tries++) {
		if (snprintf(tmp, size, "%s.tmp%ld.%u", path, (long)getpid(),
		             atomic_fetch_add(&seq, 1)) >= (int)size)
			return ir_seterr(err, KILN_EINVAL, "%s: path too long", path);
		int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
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
static kiln_status commit(const char *tmp, const char *path, kiln_error *err)
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

/* ---- LLVM ---------------------------------------------------------------- */

typedef struct diag {
	char msg[512];
} diag;

static void on_diag(LLVMDiagnosticInfoRef di, void *ud)
{
	diag *d = ud;
	if (LLVMGetDiagInfoSeverity(di) != LLVMDSError || d->msg[0])
		return;
	char *s = LLVMGetDiagInfoDescription(di);
	snprintf(d->msg, sizeof d->msg, "%s", s ? s : "error");
	LLVMDisposeMessage(s);
}

static void llvm_open(cg_llvm *L, const cg_target *t, const cg_module *m, const char *name,
                      diag *d)
{
	memset(L, 0, sizeof *L);
	L->ctx = LLVMContextCreate();
	LLVMContextSetDiagnosticHandler(L->ctx, on_diag, d);
	L->mod = LLVMModuleCreateWithNameInContext(name, L->ctx);
	L->b = LLVMCreateBuilderInContext(L->ctx);
	L->t = t;
	L->m = m;
	L->name = name;
	LLVMSetTarget(L->mod, t->triple);
	LLVMTargetDataRef td = LLVMCreateTargetDataLayout(t->tm);
	LLVMSetModuleDataLayout(L->mod, td);
	LLVMDisposeTargetData(td);
	L->i1 = LLVMInt1TypeInContext(L->ctx);
	L->i8 = LLVMInt8TypeInContext(L->ctx);
	L->i32 = LLVMInt32TypeInContext(L->ctx);
	L->i64 = LLVMInt64TypeInContext(L->ctx);
	L->f32 = LLVMFloatTypeInContext(L->ctx);
	L->f64 = LLVMDoubleTypeInContext(L->ctx);
	L->ptr = LLVMPointerType(L->i8, 0);
	/* struct rt_exec { void **buf; const int64_t *sym; rt_pool *pool;
	 *                  float *scratch; int64_t thread; rt_fault *fault; } */
	L->exec_ty = LLVMStructCreateNamed(L->ctx, "rt_exec");
	LLVMTypeRef f[6] = {LLVMPointerType(L->ptr, 0), LLVMPointerType(L->i64, 0), L->ptr,
	                    LLVMPointerType(L->f32, 0), L->i64, L->ptr};
	LLVMStructSetBody(L->exec_ty, f, 6, 0);
}

static void llvm_close(cg_llvm *L)
{
	if (L->b)
		LLVMDisposeBuilder(L->b);
	if (L->mod)
		LLVMDisposeModule(L->mod);
	if (L->ctx)
		LLVMContextDispose(L->ctx);
	memset(L, 0, sizeof *L);
}

/* The target's preferred vector width on every function defined, so that
 * the vectorizer does not follow a CPU's prefer-256-bit tuning (target.c). */
static void tune(cg_llvm *L)
{
	char w[16];
	snprintf(w, sizeof w, "%d", L->t->prefer_bits);
	for (LLVMValueRef f = LLVMGetFirstFunction(L->mod); f && L->t->prefer_bits;
	     f = LLVMGetNextFunction(f))
		if (!LLVMIsDeclaration(f))
			LLVMAddTargetDependentFunctionAttr(f, "prefer-vector-width", w);
}

static kiln_status verify(cg_llvm *L, kiln_error *err)
{
	char *msg = NULL;
	kiln_status st = KILN_OK;
	if (LLVMVerifyModule(L->mod, LLVMReturnStatusAction, &msg))
		st = ir_seterr(err, KILN_EINVAL, "LLVM rejected the generated module (a kiln bug): "
		               "%.900s", msg ? msg : "?");
	LLVMDisposeMessage(msg);
	return st;
}

static kiln_status optimize(cg_llvm *L, kiln_error *err)
{
	LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
	LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
	LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
	LLVMPassBuilderOptionsSetLoopUnrolling(po, 1);
	LLVMPassBuilderOptionsSetLoopInterleaving(po, 1);
	LLVMErrorRef e = LLVMRunPasses(L->mod, "default<O3>", L->t->tm, po);
	LLVMDisposePassBuilderOptions(po);
	if (!e)
		return KILN_OK;
	char *msg = LLVMGetErrorMessage(e);
	kiln_status st = ir_seterr(err, KILN_EINVAL, "LLVM pass pipeline failed: %s", msg);
	LLVMDisposeErrorMessage(msg);
	return st;
}

/* LLVM IR (after O3), assembly or an object file at path, atomically. */
static kiln_status write_stage(cg_llvm *L, const char *emit, const char *path, kiln_error *err)
{
	char tmp[4200];
	kiln_status st = make_temp(path, 0666, tmp, sizeof tmp, err);
	if (st != KILN_OK)
		return st;
	char *msg = NULL;
	LLVMBool bad;
	if (strcmp(emit, "ll") == 0)
		bad = LLVMPrintModuleToFile(L->mod, tmp, &msg);
	else
		bad = LLVMTargetMachineEmitToFile(L->t->tm, L->mod, tmp,
		                                  strcmp(emit, "asm") == 0 ? LLVMAssemblyFile
		                                                           : LLVMObjectFile, &msg);
	if (bad) {
		st = ir_seterr(err, KILN_EIO, "%s: LLVM could not write %s: %s", path, emit,
		               msg ? msg : "?");
		unlink(tmp);
	}
	LLVMDisposeMessage(msg);
	return st == KILN_OK ? commit(tmp, path, err) : st;
}

/* ---- linking -------------------------------------------------------------- */

static kiln_status run_cc(char *const *argv, kiln_error *err)
{
	pid_t pid;
	int rc = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);
	if (rc != 0)
		return ir_seterr(err, KILN_EIO, "cannot run the linker '%s': %s", argv[0],
		                 strerror(rc));
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return ir_seterr(err, KILN_EIO, "waiting for '%s': %s", argv[0], strerror(errno));
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return ir_seterr(err, KILN_EIO, "linking failed: '%s -shared ...' exited with "
		                 "status %d (its messages are above)", argv[0],
		                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	return KILN_OK;
}

/* cc -shared -o <tmp> <obj> <runtime archive> -lm -lpthread, then rename.
 * The library is named (SONAME) after its file, so a program linked with
 * -l:model.so records that name.  Nothing it defines binds to another
 * library's definition: the runtime archive's symbols are hidden
 * (--exclude-libs), the module's own references are internal (llvm.c),
 * and -Bsymbolic binds whatever else is exported to itself. */
static kiln_status link_so(cg_llvm *L, const char *path, kiln_error *err)
{
	char obj[4200], so[4200];
	kiln_status st = make_temp(path, 0666, obj, sizeof obj, err);
	if (st != KILN_OK)
		return st;
	st = write_stage(L, "obj", obj, err);
	if (st == KILN_OK)
		st = make_temp(path, 0777, so, sizeof so, err);
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	if (st == KILN_OK) {
		const char *rt = getenv("KILN_RT_LIB");
		char *argv[] = {"cc", "-shared", "-Wl,-z,defs", "-Wl,-z,noexecstack",
		                "-Wl,--exclude-libs,ALL", "-Wl,-Bsymbolic", "-Xlinker", "-soname",
		                "-Xlinker", (char *)base, "-o", so, obj,
		                (char *)(rt && *rt ? rt : KILN_RT_GEN_LIB), "-lm", "-lpthread",
		                NULL};
		st = run_cc(argv, err);
		if (st == KILN_OK)
			st = commit(so, path, err);
		else
			unlink(so);
	}
	unlink(obj);
	return st;
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
	const ir_value *v = m->g ? ir_val(m->g, m->buf[b].value) : NULL;
	return m->buf[b].name ? m->buf[b].name : v && v->name ? v->name : "";
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
	c_name(out, size, io_name(m, b));
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
		c_name(other, sizeof other, ir_dim_symname(m->g, k));
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

static void header_signature(FILE *f, const cg_module *m)
{
	char ty[256];
	for (int i = 0; i < m->ninputs + m->noutputs; i++) {
		int b = i < m->ninputs ? m->inputs[i] : m->outputs[i - m->ninputs];
		fprintf(f, " *   %-7s %s: %s\n", i == 0 ? "inputs:" : i == m->ninputs ? "outputs:" : "",
		        io_name(m, b), ir_type_str(m->g, &m->buf[b].type, ty, sizeof ty));
	}
	if (m->nsym) {
		fprintf(f, " *   symbols:");
		for (int k = 0; k < m->nsym; k++)
			fprintf(f, " %s", ir_dim_symname(m->g, k));
		fprintf(f, " (sizes bound at run time; pass them to _run)\n");
	}
}

static void header_run(FILE *f, const cg_module *m, const char *name, const char *suffix)
{
	char p[256];
	fprintf(f, "int %s_%s(%s_ctx *ctx", name, suffix, name);
	for (int k = 0; k < m->nsym; k++) {
		c_name(p, sizeof p, ir_dim_symname(m->g, k));
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
                         const char *so)
{
	fprintf(f, "/*\n * %s: the model '%s' compiled by kiln %s into %s.\n *\n"
	        " * Signature (row-major, dense):\n", h, m->g ? kiln_graph_name(m->g) : name,
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
	write_header(f, m, name, h, so);
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
	kiln_status st = make_temp(path, 0666, tmp, sizeof tmp, err);
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
	return commit(tmp, path, err);
}

/* ---- kiln_compile ------------------------------------------------------------ */

static kiln_status emit_kir(const cg_module *m, const char *path, kiln_error *err)
{
	char tmp[4200];
	kiln_status st = make_temp(path, 0666, tmp, sizeof tmp, err);
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
	return commit(tmp, path, err);
}

/* Graph -> optimized clone -> kernel IR with a memory plan. */
static kiln_status to_kernels(const kiln_graph *g, const kiln_compile_opts *o, kiln_graph **gc,
                              cg_module **m, kiln_error *err)
{
	*gc = ir_graph_clone(g);
	if (!*gc)
		return ir_seterr(err, KILN_ENOMEM, "out of memory cloning graph '%s'",
		                 kiln_graph_name(g));
	kiln_status st = kiln_graph_verify(*gc, err);
	/* PASS_INFERENCE treats parameters as constants (bnfold folds them into
	 * conv weights): right for an inference library, whose weights are
	 * embedded and immutable; a library that trains its parameters must
	 * name its own pass list. */
	if (st == KILN_OK)
		st = kiln_graph_optimize(*gc, o->passes ? o->passes : PASS_INFERENCE, err);
	if (st == KILN_OK)
		st = kiln_graph_verify(*gc, err);
	if (st == KILN_OK)
		st = cg_lower_ex(*gc, &(cg_lower_opts){.fuse = true}, m, err);
	if (st == KILN_OK)
		st = cg_memplan(*m, err);
	return st;
}

static kiln_status check_opts(const kiln_graph *g, const char *out, const kiln_compile_opts *o,
                              kiln_error *err)
{
	static const char *const emits[] = {"so", "kir", "ll", "asm", "obj"};
	if (!g || !out || !*out)
		return ir_seterr(err, KILN_EINVAL, "kiln_compile: %s is NULL",
		                 !g ? "the graph" : "the output path");
	if (kiln_graph_status(g) != KILN_OK)
		return ir_seterr(err, kiln_graph_status(g), "%s", kiln_graph_errmsg(g));
	if (ir_check_weights(g, "compile", err) != KILN_OK)
		return KILN_EINVAL;
	for (size_t i = 0; o->emit && i < sizeof emits / sizeof *emits; i++)
		if (strcmp(o->emit, emits[i]) == 0)
			return KILN_OK;
	return o->emit ? ir_seterr(err, KILN_EINVAL, "kiln_compile: unknown --emit '%s' (want "
	                           "so, kir, ll, asm or obj)", o->emit) : KILN_OK;
}

/* What a training library adds to backend(): its eval program and state. */
typedef struct train_part {
	const cg_module *eval;
	const cg_train_info *ti;
} train_part;

static kiln_status backend(const cg_module *m, const char *out, const kiln_compile_opts *o,
                           const char *name, const char *emit, const train_part *tp,
                           kiln_error *err)
{
	cg_target t;
	kiln_status st = cg_target_init(&t, o->cpu, o->features, err);
	if (st != KILN_OK)
		return st;
	cg_llvm L;
	diag d = {{0}};
	llvm_open(&L, &t, m, name, &d);
	st = tp ? cg_llvm_train(&L, tp->eval, tp->ti, err) : cg_llvm_kernels(&L, err);
	if (st == KILN_OK)
		tune(&L);
	if (st == KILN_OK)
		st = verify(&L, err);
	if (st == KILN_OK)
		st = optimize(&L, err);
	if (st == KILN_OK)
		st = strcmp(emit, "so") == 0 ? link_so(&L, out, err) : write_stage(&L, emit, out, err);
	if (st == KILN_OK && d.msg[0])
		st = ir_seterr(err, KILN_EINVAL, "LLVM: %s", d.msg);
	llvm_close(&L);
	cg_target_free(&t);
	return st;
}

kiln_status cg_emit(const cg_module *m, const char *out_path, const kiln_compile_opts *o,
                    const char *name, kiln_error *err)
{
	const char *emit = o->emit ? o->emit : "so";
	if (strcmp(emit, "kir") == 0)
		return emit_kir(m, out_path, err);
	kiln_status st = backend(m, out_path, o, name, emit, NULL, err);
	if (st == KILN_OK && strcmp(emit, "so") == 0)
		st = header(m, NULL, NULL, inference_header, name, out_path, err);
	return st;
}

KILN_API kiln_status kiln_compile(const kiln_graph *g, const char *out_path,
                                  const kiln_compile_opts *opts, kiln_error *err)
{
	kiln_compile_opts o = opts ? *opts : (kiln_compile_opts){0};
	kiln_status st = check_opts(g, out_path, &o, err);
	if (st != KILN_OK)
		return st;
	char name[128];
	c_name(name, sizeof name, o.name ? o.name : kiln_graph_name(g));
	kiln_graph *gc = NULL;
	cg_module *m = NULL;
	st = to_kernels(g, &o, &gc, &m, err);
	if (st == KILN_OK)
		st = cg_emit(m, out_path, &o, name, err);
	cg_module_free(m);
	kiln_graph_free(gc);
	return st;
}

/* ---- compiled training ------------------------------------------------------------
 * The step graph from kiln_build_train_step and the eval model go through
 * to_kernels each; every named parameter of either becomes a STATE buffer
 * whose io_index is its row in the state table: the step graph's named
 * parameters in value order, so the table is exactly what kiln_trainer
 * checkpoints.  Each "<p>.next" output is paired with p's row; the eval
 * model's parameters must all be rows of the same type. */

typedef struct train_build {
	kiln_graph *step;         /* kiln_build_train_step's graph: owns the init data */
	const char **names;       /* the state table */
	const kiln_tensor **init;
	int nstate;
	int *next;                /* per step output */
	cg_train_info ti;
} train_build;

static void train_build_free(train_build *tb)
{
	kiln_graph_free(tb->step);
	free(tb->names), free(tb->init), free(tb->next);
}

static int state_index(const train_build *tb, const char *name)
{
	for (int i = 0; name && i < tb->nstate; i++)
		if (strcmp(tb->names[i], name) == 0)
			return i;
	return -1;
}

/* A clone of model whose inputs have batch (> 0) for every symbolic dim 0,
 * with every type inferred again.  Convolutions' weight gradients reduce
 * over the batch as their channel axis, which the lowering needs fixed. */
static kiln_status fix_batch(const kiln_graph *model, int64_t batch, kiln_graph **out,
                             kiln_error *err)
{
	kiln_graph *g = *out = ir_graph_clone(model);
	if (!g)
		return ir_seterr(err, KILN_ENOMEM, "kiln_compile_train: out of memory");
	for (uint32_t i = 0; i < g->ninput; i++) {
		ir_type *t = &g->val[g->input[i]]->type;
		if (t->rank > 0 && ir_dim_symbol_index(g, t->dim[0]) >= 0)
			t->dim[0] = batch;
	}
	return kiln_graph_optimize(g, "infer", err);
}

/* Training-mode Dropout must draw new masks every step, as kiln_trainer
 * reseeds each node from its traced seed and the micro-batch count before
 * each run; a compiled step cannot change a node's seed attribute, so it
 * gets the count as an i64 input CG_MICRO_INPUT and the lowering derives
 * the same seed from it in the kernel (cg_lower_dropout). */
static kiln_status add_micro(kiln_graph *g, kiln_error *err)
{
	bool random = false;
	for (uint32_t i = 0; i < g->nnode; i++) {
		const ir_node *n = g->node[i];
		random |= !n->dead && ir_op(n->op)->flags & IR_RANDOM &&
		          ir_attr_int(n, "training_mode", 0);
	}
	if (random)
		kiln_input_at(g, ir_graph_loc(g), CG_MICRO_INPUT, KILN_I64, 0, NULL);
	return g->status == KILN_OK ? KILN_OK : ir_seterr(err, g->status, "%s", g->errmsg);
}

/* The step graph and its state table. */
static kiln_status build_step(const kiln_graph *model, const kiln_train_opts *t, int64_t batch,
                              train_build *tb, kiln_error *err)
{
	kiln_graph *fixed = NULL;
	kiln_status st = batch > 0 ? fix_batch(model, batch, &fixed, err) : KILN_OK;
	if (st == KILN_OK)
		st = kiln_build_train_step(fixed ? fixed : model, t, &tb->step, err);
	kiln_graph_free(fixed);
	if (st != KILN_OK)
		return st;
	kiln_graph *g = tb->step;
	if ((st = add_micro(g, err)) != KILN_OK)
		return st;
	tb->names = calloc(g->nval + 1, sizeof *tb->names);
	tb->init = calloc(g->nval + 1, sizeof *tb->init);
	if (!tb->names || !tb->init)
		return ir_seterr(err, KILN_ENOMEM, "kiln_compile_train: out of memory");
	for (uint32_t v = 1; v < g->nval; v++)
		if (g->val[v]->kind == IR_V_PARAM && g->val[v]->name && g->val[v]->data) {
			tb->names[tb->nstate] = g->val[v]->name;
			tb->init[tb->nstate++] = g->val[v]->data;
		}
	return KILN_OK;
}

static bool fits(const kiln_tensor *t, const cg_buf *b)
{
	if (t->dtype != b->dt || t->rank != b->type.rank)
		return false;
	for (int d = 0; d < t->rank; d++)
		if (t->shape[d] != b->type.dim[d])
			return false;
	return true;
}

/* Every parameter buffer of m becomes STATE, its row found by name. */
static kiln_status mark_state(const train_build *tb, const kiln_graph *g, cg_module *m,
                              const char *what, kiln_error *err)
{
	for (int b = 0; b < m->nbuf; b++) {
		cg_buf *cb = &m->buf[b];
		const ir_value *v = cb->value ? g->val[cb->value] : NULL;
		if (cb->kind != CG_BUF_CONST || !v || v->kind != IR_V_PARAM)
			continue;
		int k = state_index(tb, v->name);
		if (k < 0 || !fits(tb->init[k], cb))
			return ir_seterr(err, KILN_EINVAL, "kiln_compile_train: %s parameter '%s' has no "
			                 "match of the same type in the train step", what,
			                 v->name ? v->name : "?");
		cb->kind = CG_BUF_STATE;
		cb->io_index = k;
		cb->data = NULL;
	}
	return KILN_OK;
}

/* With the batch fixed, the graph still declares its symbol; a program no
 * buffer of which has a symbolic dim takes no sizes (nothing binds them). */
static void drop_unused_syms(cg_module *m)
{
	for (int b = 0; b < m->nbuf; b++)
		for (int d = 0; d < m->buf[b].type.rank; d++)
			if (m->buf[b].type.dim[d] < 0)
				return;
	m->nsym = 0;
}

/* Inputs "lr", "step", "apply" and each "<p>.next" output's row. */
static kiln_status step_contract(train_build *tb, const kiln_graph *g, const cg_module *m,
                                 const kiln_train_opts *t, kiln_error *err)
{
	cg_train_info *ti = &tb->ti;
	*ti = (cg_train_info){tb->nstate, tb->names, tb->init, NULL, -1, -1, -1,
	                      t->accum_steps > 1 ? t->accum_steps : 1, -1};
	int *pos[4] = {&ti->lr, &ti->t, &ti->apply, &ti->micro};
	const char *names[4] = {"lr", "step", "apply", CG_MICRO_INPUT};
	for (uint32_t i = 0; i < g->ninput; i++)
		for (int k = 0; k < 4; k++)
			if (g->val[g->input[i]]->name && !strcmp(g->val[g->input[i]]->name, names[k]))
				*pos[k] = (int)i;
	if (!(tb->next = calloc((size_t)m->noutputs + 1, sizeof *tb->next)))
		return ir_seterr(err, KILN_ENOMEM, "kiln_compile_train: out of memory");
	tb->next[0] = -1;
	for (int i = 1; i < m->noutputs; i++) {
		const char *name = g->val[g->output[i]]->name;
		char p[600];
		size_t n = name ? strlen(name) : 0;
		if (n > 5 && n - 5 < sizeof p && ends_with(name, ".next"))
			snprintf(p, sizeof p, "%.*s", (int)(n - 5), name);
		int k = n > 5 && n - 5 < sizeof p ? state_index(tb, p) : -1;
		if (k < 0 || !fits(tb->init[k], &m->buf[m->outputs[i]]))
			return ir_seterr(err, KILN_EVERIFY, "kiln_compile_train: output '%s' has no "
			                 "parameter of the same type to replace", name ? name : "?");
		tb->next[i] = k;
	}
	ti->next = tb->next;
	return ti->lr >= 0 && ti->t >= 0 && (ti->accum == 1) == (ti->apply < 0)
	               ? KILN_OK
	               : ir_seterr(err, KILN_EVERIFY, "kiln_compile_train: the step graph lacks "
	                           "its lr, step or apply input");
}

/* int <name>_train_step(ctx, syms..., data inputs..., double lr, T *loss) */
static void header_train_step(FILE *f, const cg_module *m, const cg_train_info *ti,
                              const char *name)
{
	char p[256];
	fprintf(f, "int %s_train_step(%s_ctx *ctx", name, name);
	for (int k = 0; k < m->nsym; k++) {
		c_name(p, sizeof p, ir_dim_symname(m->g, k));
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

static void train_header(FILE *f, const cg_module *m, const cg_module *eval,
                         const cg_train_info *ti, const char *name, const char *h,
                         const char *so)
{
	size_t bytes = 0;
	for (int i = 0; i < ti->nstate; i++)
		bytes += kiln_tensor_nbytes(ti->state_init[i]);
	fprintf(f, "/*\n * %s: the training library for '%s', compiled by kiln %s into %s.\n *\n"
	        " * Train step (loss, then the state it replaces):\n", h, kiln_graph_name(eval->g),
	        KILN_VERSION, so);
	header_signature(f, m);
	fprintf(f, " * Eval:\n");
	header_signature(f, eval);
	fprintf(f, " *\n * The context owns %d state tensors (%zu bytes: parameters, buffers,\n"
	        " * optimizer state), initialised from the model's weights.  _train_step takes\n"
	        " * lr (schedules are the caller's) and counts steps itself (_steps);\n"
	        " * _save/_load write and read a safetensors checkpoint in kiln_trainer's\n"
	        " * format (atomic; a corrupt file is refused and nothing changes).  ints\n"
	        " * are kiln_status (0 OK); %s_errmsg(ctx) says why.  One context per thread.\n"
	        " */\n", ti->nstate, bytes, name);
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
	fprintf(f, "int64_t %s_steps(const %s_ctx *ctx);\n"
	        "int %s_save(%s_ctx *ctx, const char *path);\n"
	        "int %s_load(%s_ctx *ctx, const char *path);\n", name, name, name, name, name, name);
	fprintf(f, "int %s_set_threads(%s_ctx *ctx, int nthreads);\n"
	        "const char *%s_errmsg(const %s_ctx *ctx);\nvoid %s_destroy(%s_ctx *ctx);\n",
	        name, name, name, name, name, name);
	fprintf(f, "\n#ifdef __cplusplus\n}\n#endif\n#endif /* %s_H */\n", guard);
}

static kiln_status check_train(const kiln_graph *model, const kiln_graph *eval,
                               const kiln_train_opts *t, const char *out,
                               const kiln_compile_opts *o, kiln_error *err)
{
	if (!model || !eval || !t)
		return ir_seterr(err, KILN_EINVAL, "kiln_compile_train: %s is NULL", !model ? "the "
		                 "model" : !eval ? "the eval model (required)" : "the train options");
	if (ir_check_weights(model, "compile", err) != KILN_OK ||
	    ir_check_weights(eval, "compile", err) != KILN_OK)
		return KILN_EINVAL;
	if (o->passes && strstr(o->passes, "bnfold"))
		return ir_seterr(err, KILN_EINVAL, "kiln_compile_train: pass 'bnfold' folds parameters "
		                 "into constants, which a training library updates");
	if (o->emit && strcmp(o->emit, "so") != 0)
		return ir_seterr(err, KILN_EINVAL, "kiln_compile_train: --emit=%s is not supported "
		                 "for a training library (only the .so)", o->emit);
	kiln_status st = check_opts(model, out, o, err);
	return st == KILN_OK ? check_opts(eval, out, o, err) : st;
}

KILN_API kiln_status kiln_compile_train(const kiln_graph *model, const kiln_graph *eval_model,
                                        const kiln_train_opts *t, int64_t batch,
                                        const char *out_path, const kiln_compile_opts *opts,
                                        kiln_error *err)
{
	kiln_compile_opts o = opts ? *opts : (kiln_compile_opts){0};
	kiln_status st = check_train(model, eval_model, t, out_path, &o, err);
	if (st != KILN_OK)
		return st;
	o.passes = o.passes ? o.passes : PASS_DEFAULT;
	char name[128];
	c_name(name, sizeof name, o.name ? o.name : kiln_graph_name(model));
	train_build tb = {0};
	kiln_graph *gs = NULL, *ge = NULL;
	cg_module *ms = NULL, *me = NULL;
	st = batch < 0 ? ir_seterr(err, KILN_EINVAL, "kiln_compile_train: batch %lld < 0",
	                           (long long)batch)
	               : build_step(model, t, batch, &tb, err);
	if (st == KILN_OK)
		st = to_kernels(tb.step, &o, &gs, &ms, err);
	if (st == KILN_OK)
		st = to_kernels(eval_model, &o, &ge, &me, err);
	if (st == KILN_OK)
		drop_unused_syms(ms);
	if (st == KILN_OK)
		st = mark_state(&tb, gs, ms, "train-step", err);
	if (st == KILN_OK)
		st = mark_state(&tb, ge, me, "eval", err);
	if (st == KILN_OK)
		st = step_contract(&tb, gs, ms, t, err);
	train_part tp = {me, &tb.ti};
	if (st == KILN_OK)
		st = backend(ms, out_path, &o, name, "so", &tp, err);
	if (st == KILN_OK)
		st = header(ms, me, &tb.ti, train_header, name, out_path, err);
	cg_module_free(ms), cg_module_free(me);
	kiln_graph_free(gs), kiln_graph_free(ge);
	train_build_free(&tb);
	return st;
}
