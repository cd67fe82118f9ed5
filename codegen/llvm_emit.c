/*
 * llvm_emit.c: the LLVM backend behind codegen/backend.h's interface
 * (cg_llvm_backend): a session is one LLVM module for one library.  Its
 * kernels come from llvm.c, the library around them (descriptors, entry
 * points, training tables) from llvm_lib.c; then LLVMVerifyModule, the new
 * pass manager's default<O3> for the target machine, and an object file,
 * LLVM IR or assembly, or a link with the system C compiler against the
 * never-sanitized runtime archive (KILN_RT_GEN_LIB, or $KILN_RT_LIB), which
 * puts the model driver and thread pool into the library so it needs only
 * libc, libm and libpthread.  LLVM diagnostics go to a handler: errors
 * become the compile's message, warnings (say, a loop hinted for
 * vectorization that LLVM would not vectorize) are dropped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "codegen/backend.h"
#include "codegen/llvm.h"

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
	kiln_status st = cg_temp_file(path, 0666, tmp, sizeof tmp, err);
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
	return st == KILN_OK ? cg_commit_file(tmp, path, err) : st;
}

/* ---- linking ---------------------------------------------------------------- */

/* cc -shared -o <tmp> <obj> <runtime archive> -lm -lpthread, then rename.
 * The library is named (SONAME) after its file, so a program linked with
 * -l:model.so records that name.  Nothing it defines binds to another
 * library's definition: the runtime archive's symbols are hidden
 * (--exclude-libs), the module's own references are internal (llvm.c),
 * and -Bsymbolic binds whatever else is exported to itself. */
static kiln_status link_so(cg_llvm *L, const char *path, kiln_error *err)
{
	char obj[4200], so[4200];
	kiln_status st = cg_temp_file(path, 0666, obj, sizeof obj, err);
	if (st != KILN_OK)
		return st;
	st = write_stage(L, "obj", obj, err);
	if (st == KILN_OK)
		st = cg_temp_file(path, 0777, so, sizeof so, err);
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	if (st == KILN_OK) {
		const char *rt = getenv("KILN_RT_LIB");
		char *argv[] = {"cc", "-shared", "-Wl,-z,defs", "-Wl,-z,noexecstack",
		                "-Wl,--exclude-libs,ALL", "-Wl,-Bsymbolic", "-Xlinker", "-soname",
		                "-Xlinker", (char *)base, "-o", so, obj,
		                (char *)(rt && *rt ? rt : KILN_RT_GEN_LIB), "-lm", "-lpthread",
		                NULL};
		st = cg_run_tool(argv, err);
		if (st == KILN_OK)
			st = cg_commit_file(so, path, err);
		else
			unlink(so);
	}
	unlink(obj);
	return st;
}

/* ---- the backend ------------------------------------------------------------ */

struct cg_session {
	cg_llvm L;
	cg_target t;
	diag d;
	const cg_library *lib;
	LLVMValueRef *fns[2];  /* kernels of lib->m, lib->eval */
};

static kiln_status s_open(cg_session **out, const cg_library *lib, kiln_error *err)
{
	cg_session *s = calloc(1, sizeof *s);
	if (!s)
		return ir_seterr(err, KILN_ENOMEM, "out of memory");
	kiln_status st = cg_target_init(&s->t, lib->o->cpu, lib->o->features, err);
	if (st != KILN_OK) {
		free(s);
		return st;
	}
	s->lib = lib;
	llvm_open(&s->L, &s->t, lib->m, lib->name, &s->d);
	*out = s;
	return KILN_OK;
}

static kiln_status s_kernels(cg_session *s, const cg_module *m, kiln_error *err)
{
	int i = m == s->lib->m ? 0 : 1;
	if (!(s->fns[i] = calloc((size_t)m->nkern + 1, sizeof *s->fns[i])))
		return ir_seterr(err, KILN_ENOMEM, "out of memory emitting kernels");
	s->L.m = m;
	return cg_llvm_emit_kernels(&s->L, s->fns[i], err);
}

static kiln_status s_library(cg_session *s, kiln_error *err)
{
	return cg_llvm_library(&s->L, s->lib, s->fns, err);
}

static kiln_status s_write(cg_session *s, const char *stage, const char *path, kiln_error *err)
{
	cg_llvm *L = &s->L;
	tune(L);
	kiln_status st = verify(L, err);
	if (st == KILN_OK)
		st = optimize(L, err);
	if (st == KILN_OK)
		st = strcmp(stage, "so") == 0 ? link_so(L, path, err) : write_stage(L, stage, path, err);
	if (st == KILN_OK && s->d.msg[0])
		st = ir_seterr(err, KILN_EINVAL, "LLVM: %s", s->d.msg);
	return st;
}

static void s_close(cg_session *s)
{
	llvm_close(&s->L);
	cg_target_free(&s->t);
	free(s->fns[0]);
	free(s->fns[1]);
	free(s);
}

static const char *const stages[] = {"ll", "asm", "obj", NULL};

const cg_backend cg_llvm_backend = {
	.name = "llvm",
	.stages = stages,
	.supports = cg_llvm_supports,
	.open = s_open,
	.emit_kernels = s_kernels,
	.emit_library = s_library,
	.write = s_write,
	.close = s_close,
};
