/*
 * gemm_jit.h: kiln_sgemm on its own, JIT-compiled, for its test
 * (tests/unit/test_gemm.c) and its benchmark (bench/gemm_bench.c).
 *
 * Builds a module holding only what cg_llvm_sgemm emits plus an exported
 * wrapper with the C ABI, runs default<O3> with the host target machine
 * (cg_target_init) exactly as `kiln compile` does, and hands it to ORC's
 * LLJIT, which maps rt_parallel_for to whatever function the caller gives.
 * Header-only (static functions) so that both programs share it without a
 * library of test helpers.
 */
#ifndef KILN_BENCH_GEMM_JIT_H
#define KILN_BENCH_GEMM_JIT_H

#include <stdio.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "codegen/llvm.h"
#include "runtime/model.h"

typedef void (*kiln_sgemm_fn)(rt_exec *x, int64_t M, int64_t N, int64_t K, float alpha,
                              const float *A, int64_t a_rs, int64_t a_cs,
                              const float *B, int64_t b_rs, int64_t b_cs,
                              float beta, float *C, int64_t c_rs,
                              const float *bias, int32_t bias_axis, float lo, float hi,
                              const float *res, int64_t res_rs);

typedef struct gemm_jit {
	LLVMOrcLLJITRef jit;
	kiln_sgemm_fn fn;
	uint64_t scratch_floats; /* per thread, from cg_sgemm_scratch_floats */
	int a_panel;             /* > 0: fn is kiln_sgemm_pa or _pm, A in panels this tall */
	int vec_bits;
	char err[1200];
} gemm_jit;

/* The exported wrapper `kiln_sgemm_test`, same signature as kiln_sgemm. */
static void gemm_jit_wrapper(cg_llvm *L, LLVMValueRef sgemm)
{
	LLVMTypeRef fty = LLVMGlobalGetValueType(sgemm);
	LLVMValueRef w = LLVMAddFunction(L->mod, "kiln_sgemm_test", fty);
	LLVMValueRef args[32];
	unsigned n = LLVMCountParams(w);
	for (unsigned i = 0; i < n; i++)
		args[i] = LLVMGetParam(w, i);
	LLVMPositionBuilderAtEnd(L->b, LLVMAppendBasicBlockInContext(L->ctx, w, "entry"));
	LLVMBuildCall2(L->b, fty, sgemm, args, n, "");
	LLVMBuildRetVoid(L->b);
}

static int gemm_jit_fail(gemm_jit *J, const char *what, LLVMErrorRef e)
{
	char *m = e ? LLVMGetErrorMessage(e) : NULL;
	snprintf(J->err, sizeof J->err, "%s: %s", what, m ? m : "failed");
	if (m)
		LLVMDisposeErrorMessage(m);
	return -1;
}

/* Verifies, optimises (default<O3>) and sets the target of mod. */
static int gemm_jit_optimise(gemm_jit *J, LLVMModuleRef mod, const cg_target *t)
{
	char *msg = NULL;
	if (LLVMVerifyModule(mod, LLVMReturnStatusAction, &msg)) {
		snprintf(J->err, sizeof J->err, "invalid IR: %s", msg);
		LLVMDisposeMessage(msg);
		return -1;
	}
	LLVMDisposeMessage(msg);
	LLVMSetTarget(mod, t->triple);
	LLVMTargetDataRef td = LLVMCreateTargetDataLayout(t->tm);
	char *dl = LLVMCopyStringRepOfTargetData(td);
	LLVMSetDataLayout(mod, dl);
	LLVMDisposeMessage(dl);
	LLVMDisposeTargetData(td);
	LLVMPassBuilderOptionsRef o = LLVMCreatePassBuilderOptions();
	LLVMErrorRef e = LLVMRunPasses(mod, "default<O3>", t->tm, o);
	LLVMDisposePassBuilderOptions(o);
	return e ? gemm_jit_fail(J, "default<O3>", e) : 0;
}

/* Hands mod to a new LLJIT with rt_parallel_for bound to par_for. */
static int gemm_jit_load(gemm_jit *J, LLVMOrcThreadSafeModuleRef tsm, void *par_for)
{
	LLVMErrorRef e = LLVMOrcCreateLLJIT(&J->jit, LLVMOrcCreateLLJITBuilder());
	if (e) {
		LLVMOrcDisposeThreadSafeModule(tsm);
		return gemm_jit_fail(J, "LLJIT", e);
	}
	LLVMOrcJITDylibRef jd = LLVMOrcLLJITGetMainJITDylib(J->jit);
	LLVMJITCSymbolMapPair sym = {
		.Name = LLVMOrcLLJITMangleAndIntern(J->jit, "rt_parallel_for"),
		.Sym = {.Address = (LLVMOrcExecutorAddress)(uintptr_t)par_for,
		        .Flags = {.GenericFlags = LLVMJITSymbolGenericFlagsExported |
		                                  LLVMJITSymbolGenericFlagsCallable}},
	};
	LLVMOrcMaterializationUnitRef mu = LLVMOrcAbsoluteSymbols(&sym, 1);
	if ((e = LLVMOrcJITDylibDefine(jd, mu))) {
		LLVMOrcDisposeMaterializationUnit(mu);
		LLVMOrcDisposeThreadSafeModule(tsm);
		return gemm_jit_fail(J, "define rt_parallel_for", e);
	}
	LLVMOrcDefinitionGeneratorRef gen = NULL; /* memset, memcpy */
	if ((e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
	         &gen, LLVMOrcLLJITGetGlobalPrefix(J->jit), NULL, NULL))) {
		LLVMOrcDisposeThreadSafeModule(tsm);
		return gemm_jit_fail(J, "process symbols", e);
	}
	LLVMOrcJITDylibAddGenerator(jd, gen);
	if ((e = LLVMOrcLLJITAddLLVMIRModule(J->jit, jd, tsm)))
		return gemm_jit_fail(J, "add module", e);
	LLVMOrcExecutorAddress addr = 0;
	if ((e = LLVMOrcLLJITLookup(J->jit, &addr, "kiln_sgemm_test")))
		return gemm_jit_fail(J, "lookup", e);
	J->fn = (kiln_sgemm_fn)(uintptr_t)addr;
	return 0;
}

static void gemm_jit_types(cg_llvm *L)
{
	L->i1 = LLVMInt1TypeInContext(L->ctx);
	L->i8 = LLVMInt8TypeInContext(L->ctx);
	L->i32 = LLVMInt32TypeInContext(L->ctx);
	L->i64 = LLVMInt64TypeInContext(L->ctx);
	L->f32 = LLVMFloatTypeInContext(L->ctx);
	L->f64 = LLVMDoubleTypeInContext(L->ctx);
	L->ptr = LLVMPointerType(L->i8, 0);
}

/* The function a JIT holds: kiln_sgemm, or a family that takes A packed
 * at compile time (cg_prepack's layout, J->a_panel rows per panel). */
enum { GEMM_JIT_SGEMM, GEMM_JIT_PA, GEMM_JIT_PM };

/* vec_bits 0: the host's width; 256 or 128 force narrower micro-kernels
 * (still run on this host).  l2_bytes >= 0: the target's L2 instead of
 * the host's (0: unknown), which sets the blocked path's groups of column
 * panels.  fam: GEMM_JIT_PA (cg_sgemm_a_panel) or GEMM_JIT_PM
 * (cg_sgemm_m_panel; J->fn NULL and J->err saying why when the target has
 * none) instead of kiln_sgemm.  Returns 0, or -1 with J->err set. */
static int gemm_jit_build_target(gemm_jit *J, int vec_bits, int64_t l2_bytes, void *par_for,
                                 int fam)
{
	memset(J, 0, sizeof *J);
	cg_target t;
	kiln_error kerr;
	if (cg_target_init(&t, NULL, NULL, &kerr) != KILN_OK) {
		snprintf(J->err, sizeof J->err, "target: %s", kerr.msg);
		return -1;
	}
	if (vec_bits)
		t.vec_bits = vec_bits;
	if (l2_bytes >= 0)
		t.l2_bytes = l2_bytes;
	J->vec_bits = t.vec_bits;
	J->scratch_floats = cg_sgemm_scratch_floats(&t);
	LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
	cg_llvm L = {.ctx = LLVMOrcThreadSafeContextGetContext(tsc), .t = &t};
	L.mod = LLVMModuleCreateWithNameInContext("gemm", L.ctx);
	L.b = LLVMCreateBuilderInContext(L.ctx);
	gemm_jit_types(&L);
	bool pm = fam == GEMM_JIT_PM;
	J->a_panel = pm ? cg_sgemm_m_panel(&t, NULL, NULL) : fam == GEMM_JIT_PA ? cg_sgemm_a_panel(&t) : 0;
	if (pm && !J->a_panel) {
		snprintf(J->err, sizeof J->err, "no kiln_sgemm_pm for %d-bit vectors", t.vec_bits);
		LLVMDisposeBuilder(L.b);
		LLVMDisposeModule(L.mod);
		LLVMOrcDisposeThreadSafeContext(tsc);
		cg_target_free(&t);
		return -1;
	}
	LLVMValueRef (*build)(cg_llvm *) = pm                    ? cg_llvm_sgemm_pm
	                                   : fam == GEMM_JIT_PA ? cg_llvm_sgemm_pa
	                                                        : cg_llvm_sgemm;
	LLVMValueRef f = build(&L);
	int rc = f && build(&L) == f
	             ? 0
	             : gemm_jit_fail(J, "cg_llvm_sgemm", NULL);
	if (rc == 0) {
		gemm_jit_wrapper(&L, f);
		rc = gemm_jit_optimise(J, L.mod, &t);
	}
	LLVMDisposeBuilder(L.b);
	cg_target_free(&t);
	if (rc != 0) {
		LLVMDisposeModule(L.mod);
		LLVMOrcDisposeThreadSafeContext(tsc);
		return rc;
	}
	LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(L.mod, tsc);
	LLVMOrcDisposeThreadSafeContext(tsc);
	return gemm_jit_load(J, tsm, par_for);
}

static int gemm_jit_build_family(gemm_jit *J, int vec_bits, void *par_for, int fam)
{
	return gemm_jit_build_target(J, vec_bits, -1, par_for, fam);
}

static int gemm_jit_build(gemm_jit *J, int vec_bits, void *par_for)
{
	return gemm_jit_build_family(J, vec_bits, par_for, GEMM_JIT_SGEMM);
}

static void gemm_jit_free(gemm_jit *J)
{
	if (J->jit) {
		LLVMErrorRef e = LLVMOrcDisposeLLJIT(J->jit);
		if (e)
			LLVMConsumeError(e);
	}
	memset(J, 0, sizeof *J);
}

#endif /* KILN_BENCH_GEMM_JIT_H */
