/*
 * emit.c: a lowered, memory-planned kernel module to a standalone library
 * (cg_emit, cg_emit_train); driver/compile.c runs the stages before it.
 *
 * The stages here: LLVM IR (llvm.c), LLVMVerifyModule,
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
 * cg_emit_train (the last section) emits a training library: the step and
 * eval programs over one state table (docs/TRAINING.md).  The link
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
#include "codegen/lower.h"

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
		cg_c_name(other, sizeof other, ir_dim_symname(m->g, k));
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
		cg_c_name(p, sizeof p, ir_dim_symname(m->g, k));
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

/* ---- emission --------------------------------------------------------------- */

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

/* int <name>_train_step(ctx, syms..., data inputs..., double lr, T *loss) */
static void header_train_step(FILE *f, const cg_module *m, const cg_train_info *ti,
                              const char *name)
{
	char p[256];
	fprintf(f, "int %s_train_step(%s_ctx *ctx", name, name);
	for (int k = 0; k < m->nsym; k++) {
		cg_c_name(p, sizeof p, ir_dim_symname(m->g, k));
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

/* The back half of kiln_compile_train: the step program m (STATE buffers
 * indexed into ti's table) and its eval program into one library with its
 * header. */
kiln_status cg_emit_train(const cg_module *m, const cg_module *eval, const cg_train_info *ti,
                          const char *out_path, const kiln_compile_opts *o, const char *name,
                          kiln_error *err)
{
	train_part tp = {eval, ti};
	kiln_status st = backend(m, out_path, o, name, "so", &tp, err);
	if (st == KILN_OK)
		st = header(m, eval, ti, train_header, name, out_path, err);
	return st;
}
