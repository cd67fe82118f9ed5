/*
 * llvm.h: shared state of the LLVM backend (llvm.c, llvm_gemm.c, target.c,
 * emit.c); only these files include LLVM-C headers.
 */
#ifndef KILN_CG_LLVM_H
#define KILN_CG_LLVM_H

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

#include "codegen/codegen.h"

/* ---- target.c ----------------------------------------------------------- */

typedef struct cg_target {
	char *triple;      /* LLVM-owned strings, freed by cg_target_free */
	char *cpu;         /* "znver4", or "generic" when LLVM 14 does not know it */
	char *features;    /* "+avx512f,+avx512bw,..." */
	int vec_bits;      /* widest float vector: 512, 256 or 128 */
	int prefer_bits;   /* "prefer-vector-width" of every function; 0: the CPU's */
	LLVMTargetMachineRef tm;
} cg_target;

/* cpu/features NULL: $KILN_CPU and $KILN_FEATURES when set, else the
 * host's (LLVMGetHostCPUName/Features), so LLVM 14 still uses AVX-512 on
 * CPUs it names "generic"; cpu "x86-64-v3" etc. give portable builds. */
kiln_status cg_target_init(cg_target *t, const char *cpu, const char *features,
                           kiln_error *err);
void cg_target_free(cg_target *t);

/* ---- llvm.c ------------------------------------------------------------- */

typedef struct cg_llvm {
	LLVMContextRef ctx;
	LLVMModuleRef mod;
	LLVMBuilderRef b;
	const cg_target *t;
	const cg_module *m;
	LLVMTypeRef i1, i8, i32, i64, f32, f64, ptr; /* ptr: i8* */
	LLVMTypeRef exec_ty;      /* struct rt_exec (runtime/model.h) */
	LLVMValueRef par_for;     /* declared rt_parallel_for */
	LLVMValueRef sgemm;       /* kiln_sgemm, from llvm_gemm.c */
	const char *name;         /* the model's C name: prefix of the entry points */
} cg_llvm;

/* A runtime function (rt_*), declared once with hidden visibility: it is
 * linked into the same library, so calls to it are direct. */
LLVMValueRef cg_llvm_runtime_fn(cg_llvm *L, const char *name, LLVMTypeRef ty);

/* Emits every kernel of m as `void <kernel name>(rt_exec *)` plus the
 * numel/io_dims functions and the rt_model_desc; see emit.c for the rest. */
kiln_status cg_llvm_kernels(cg_llvm *L, kiln_error *err);

/* A training library (kiln_compile_train): the state table and the step
 * program's contract, for cg_llvm_train. */
typedef struct cg_train_info {
	int nstate;
	const char *const *state_name;     /* PyTorch names */
	const kiln_tensor *const *state_init;
	const int *next;                   /* per step output: state index (-1: loss) */
	int lr, t, apply;                  /* step input positions (apply: -1 none) */
	int accum;                         /* micro-batches per optimizer step */
	int micro;                         /* step input "__micro__" (i64: micro-batches
	                                      so far, Dropout's reseeding), -1 none */
} cg_train_info;

/* Emits L->m (the step program, STATE buffers indexed into ti's table) and
 * eval (its eval program) into one module: both rt_model_descs over one
 * state table, `kiln_train_desc`, `kiln_model_desc` (the eval program) and
 * the entry points <name>_create/_train_step/_eval_step/_save/_load/_steps/
 * _set_threads/_errmsg/_destroy over runtime/model_train.c. */
kiln_status cg_llvm_train(cg_llvm *L, const cg_module *eval, const cg_train_info *ti,
                          kiln_error *err);

/* ---- llvm_gemm.c -------------------------------------------------------- */

/* Declares once per module and returns
 *   void kiln_sgemm(rt_exec *x, i64 M, i64 N, i64 K, float alpha,
 *                   const float *A, i64 a_rs, i64 a_cs,
 *                   const float *B, i64 b_rs, i64 b_cs,
 *                   float beta, float *C, i64 c_rs,
 *                   const float *bias, i32 bias_axis, i32 act)
 * C[m*c_rs + n] = act(alpha * sum_k A[m*a_rs + k*a_cs] * B[k*b_rs + n*b_cs]
 *                     + beta * C[...] + bias), bias_axis 1: bias[n], 2: bias[m];
 * beta == 0 never reads C.  Packed panels in x->scratch, a register-blocked
 * micro-kernel in vector IR of the target's width; may split work over
 * x->pool with rt_parallel_for. */
LLVMValueRef cg_llvm_sgemm(cg_llvm *L);
/* floats of packing scratch kiln_sgemm needs per thread */
uint64_t cg_sgemm_scratch_floats(const cg_target *t);

/* ---- emit.c ------------------------------------------------------------- */

/* The back half of kiln_compile (driver/compile.c): a lowered, memory-planned module to
 * out_path (o->emit as there; the .so gets its header), entry points
 * prefixed with name.  Tests feed it hand-built modules. */
kiln_status cg_emit(const cg_module *m, const char *out_path, const kiln_compile_opts *o,
                    const char *name, kiln_error *err);
/* The back half of kiln_compile_train: step program m (STATE buffers
 * indexed into ti's table) and eval into one .so at out_path, with its
 * header. */
kiln_status cg_emit_train(const cg_module *m, const cg_module *eval, const cg_train_info *ti,
                          const char *out_path, const kiln_compile_opts *o, const char *name,
                          kiln_error *err);
/* A C identifier from s: other characters become '_', a leading digit gets
 * one before it; "model" when s is empty. */
void cg_c_name(char *out, size_t size, const char *s);

#endif /* KILN_CG_LLVM_H */
