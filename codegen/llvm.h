/*
 * llvm.h: shared state of the LLVM backend (llvm.c, llvm_lib.c, llvm_gemm.c,
 * target.c, llvm_emit.c), which sits behind backend.h's cg_llvm_backend; only these
 * files include LLVM-C headers, and nothing outside the backend includes
 * this one (the driver uses backend.h).
 */
#ifndef KILN_CG_LLVM_H
#define KILN_CG_LLVM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

#include "codegen/backend.h"
#include "codegen/codegen.h"

/* ---- target.c ----------------------------------------------------------- */

typedef struct cg_target {
	char *triple;      /* LLVM-owned strings, freed by cg_target_free */
	char *cpu;         /* "znver4", or "generic" when LLVM 14 does not know it */
	char *features;    /* "+avx512f,+avx512bw,..." */
	int vec_bits;      /* widest float vector: 512, 256 or 128 */
	int prefer_bits;   /* "prefer-vector-width" of every function; 0: the CPU's */
	int vnni_bits;     /* widest vectors with the 8-bit dot product (vpdpbusd); 0: none */
	bool amx;          /* AMX-INT8 tiles (tdpbusd): kiln_qgemm's AMX path, taken at run
	                      time when the OS grants the tile state (rt_amx_ready) */
	int64_t l2_bytes;  /* one core's L2 (GEMM blocking); the host's when compiling for
	                      it, else 0 (unknown) */
	LLVMTargetMachineRef tm;
} cg_target;

/* cpu/features NULL: $KILN_CPU and $KILN_FEATURES when set, else the
 * host's (LLVMGetHostCPUName/Features), so LLVM 14 still uses AVX-512 on
 * CPUs it names "generic"; cpu "x86-64-v3" etc. give portable builds. */
kiln_status cg_target_init(cg_target *t, const char *cpu, const char *features,
                           kiln_error *err);
void cg_target_free(cg_target *t);

/* ---- llvm.c: kernel emission --------------------------------------------- */

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
	LLVMValueRef transpose;   /* kiln_transpose, from llvm_gemm.c */
	LLVMValueRef sgemm_pb;    /* kiln_sgemm_pb, from llvm_gemm.c */
	LLVMValueRef sgemm_pbw;   /* kiln_sgemm_pbw, from llvm_gemm.c */
	LLVMValueRef sgemm_pa;    /* kiln_sgemm_pa, from llvm_gemm.c */
	LLVMValueRef sgemm_pm;    /* kiln_sgemm_pm, from llvm_gemm.c */
	LLVMValueRef qgemm[16];   /* kiln_qgemm_*, from llvm_qgemm.c, by cg_qgemm_spec */
	const int *canon;         /* the kernel being emitted: root buffer -> its index in
	                             the kernel's table (cg_kernel_key's order) */
	const char *name;         /* the model's C name: prefix of the entry points */
	cg_blob *blob;            /* NULL: constant bytes are private globals of the module;
	                             else they go to the blob (backend.h), whose symbol
	                             CG_BLOB_SYMBOL the module declares */
	LLVMValueRef blob_sym;    /* the blob's hidden symbol, declared on first use */
	bool helpers_extern;      /* kiln_sgemm, kiln_transpose: declared here, defined by
	                             another part of the library (hidden) */
	bool small;               /* the kernel being emitted is small: its loops around
	                             vectorized loops may unroll (llvm.c, CG_OUTER) */
	int prog;                 /* the program being emitted (0, or 1: a training
	                             library's eval): names of kernels shared across parts */
} cg_llvm;

/* n bytes at data as a constant i8 pointer: a private 64-byte aligned
 * global, or, with L->blob, an offset into the blob. */
LLVMValueRef cg_llvm_bytes(cg_llvm *L, const void *data, size_t n, const char *name);

/* A runtime function (rt_*), declared once with hidden visibility: it is
 * linked into the same library, so calls to it are direct. */
LLVMValueRef cg_llvm_runtime_fn(cg_llvm *L, const char *name, LLVMTypeRef ty);

/* Constants and declarations shared by kernel emission (llvm.c) and the
 * library around it (llvm_lib.c). */
LLVMValueRef cg_llvm_i64(const cg_llvm *L, int64_t v);
LLVMValueRef cg_llvm_i32(const cg_llvm *L, int64_t v);
LLVMTypeRef cg_llvm_mem_type(const cg_llvm *L, kiln_dtype dt); /* an element in memory */
LLVMValueRef cg_llvm_fn(cg_llvm *L, const char *name, LLVMTypeRef ty, bool internal);
LLVMValueRef cg_llvm_cstr(cg_llvm *L, const char *s);         /* a private C string (llvm_lib.c) */

/* Every kernel of m as `void <kernel name>(rt_exec *)`, spread over the
 * modules of parts[0..nparts) (each its own context): kernels with equal
 * keys share one body, each group of them in one part, groups balanced by
 * an estimate of their cost (parts[0] starts with the library; the GEMM
 * helpers have a part of their own).  fns[k] is kernel k as a function of
 * parts[0]: a hidden
 * declaration where another part defines it.  m is set as every part's
 * L->m; prog names the program (0, or 1: a training library's eval). */
kiln_status cg_llvm_emit_kernels(cg_llvm *const *parts, int nparts, const cg_module *m,
                                 int prog, LLVMValueRef *fns, kiln_error *err);
/* How many parts m's kernels are worth: a deterministic function of m (so
 * the library does not depend on the threads compiling it), 1 for small
 * programs, at most max. */
int cg_llvm_parts_for(const cg_module *m, int max);
/* Whether m's kernels call kiln_sgemm or kiln_transpose. */
bool cg_llvm_uses_helpers(const cg_module *m);
/* Whether m's kernels call kiln_sgemm_pb (a GEMM with cg_gemm.b_panel
 * CG_SGEMM_PANEL; wide: kiln_sgemm_pbw, any other b_panel), kiln_sgemm_pa
 * (a_panel). */
bool cg_llvm_uses_sgemm_pb(const cg_module *m, bool wide);
bool cg_llvm_uses_a_panels(const cg_module *m, int ap);

/* L->m's numel(sym, out) and io_dims(sym, out) functions: each buffer's
 * element count, each I/O dim, from their kernel-IR expressions. */
kiln_status cg_llvm_sizes(cg_llvm *L, LLVMValueRef *numel, LLVMValueRef *io_dims,
                          kiln_error *err);

/* ---- llvm_lib.c ------------------------------------------------------------ */

/* The library around lib's kernels (fns[0]: lib->m's, fns[1]: lib->eval's):
 * the numel/io_dims functions and rt_model_desc of each program, and the
 * entry points: <name>_create/_run/_destroy/_set_threads/_errmsg over
 * runtime/model.c, or for training both rt_model_descs over one state
 * table, `kiln_train_desc`, `kiln_model_desc` (the eval program) and
 * <name>_create/_train_step/_eval_step/_save/_load/_steps/_set_threads/
 * _errmsg/_destroy over runtime/model_train.c. */
kiln_status cg_llvm_library(cg_llvm *L, const cg_library *lib, LLVMValueRef *const *fns,
                            kiln_error *err);

/* backend.h's supports(): every GEMM f32 */
bool cg_llvm_supports(const cg_module *m, const cg_kernel *k, char *why, size_t size);

/* ---- llvm_gemm.c -------------------------------------------------------- */

/* Declares once per module and returns
 *   void kiln_sgemm(rt_exec *x, i64 M, i64 N, i64 K, float alpha,
 *                   const float *A, i64 a_rs, i64 a_cs,
 *                   const float *B, i64 b_rs, i64 b_cs,
 *                   float beta, float *C, i64 c_rs,
 *                   const float *bias, i32 bias_axis, float lo, float hi,
 *                   const float *R, i64 r_rs)
 * C[m*c_rs + n] = clamp(alpha * sum_k A[m*a_rs + k*a_cs] * B[k*b_rs + n*b_cs]
 *                       + beta * C[...] + bias + R[m*r_rs + n], lo, hi)
 * (R null: no residual), bias_axis 1: bias[n],
 * 2: bias[m]; the clamp is the activation (none: [-inf, inf], relu: [0, inf],
 * clip: its bounds), compare-and-select so NaN passes;
 * beta == 0 never reads C.  Packed panels in x->scratch, a register-blocked
 * micro-kernel in vector IR of the target's width; may split work over
 * x->pool with rt_parallel_for. */
LLVMValueRef cg_llvm_sgemm(cg_llvm *L);
/* kiln_sgemm_pb, kiln_sgemm's arguments with B packed by cg_prepack
 * (cg_gemm.b_panel): column panels of cg_sgemm_panel(L->t) columns, each
 * CG_PANEL_ROWS(K) rows of that many floats; b_rs, b_cs unused. */
LLVMValueRef cg_llvm_sgemm_pb(cg_llvm *L);
/* The panel width kiln_sgemm_pb wants on t (CG_SGEMM_PANEL, or 0 when
 * the target's vectors do not divide it). */
int cg_sgemm_panel(const cg_target *t);
/* kiln_sgemm_pbw: kiln_sgemm_pb with panels of cg_sgemm_wide_panel(L->t)
 * columns (the micro-kernel's NR), which its blocked path reads in place. */
LLVMValueRef cg_llvm_sgemm_pbw(cg_llvm *L);
/* That width, or 0 when NR is no wider than cg_sgemm_panel or not a power
 * of two. */
int cg_sgemm_wide_panel(const cg_target *t);
/* kiln_sgemm_pa, kiln_sgemm's arguments with A packed by cg_prepack
 * (cg_gemm.a_panel): panels of cg_sgemm_a_panel(L->t) rows, each K columns
 * of that many floats; a_rs, a_cs unused. */
LLVMValueRef cg_llvm_sgemm_pa(cg_llvm *L);
/* The row-panel height kiln_sgemm_pa wants on t: its micro-kernel's MR. */
int cg_sgemm_a_panel(const cg_target *t);
/* kiln_sgemm_pm, kiln_sgemm's arguments with A packed as for kiln_sgemm_pa
 * in panels of cg_sgemm_m_panel(L->t) rows (0: none on this target), B's
 * rows contiguous: output channels in the micro-kernel's lanes.  Its bias
 * axis argument ORed with CG_SGEMM_C_BLOCKED: C in blocks of
 * cg_sgemm_c_block(L->t) rows (cg_gemm.c_block; c_rs = N, no residual). */
LLVMValueRef cg_llvm_sgemm_pm(cg_llvm *L);
#define CG_SGEMM_C_BLOCKED 4
/* ... and with CG_SGEMM_B_BLOCKED: B in blocks of that many rows
 * (cg_gemm.b_block; b_rs = N) */
#define CG_SGEMM_B_BLOCKED 8
/* Its panels' height on t, 0 when it has none, and (each may be NULL) the
 * widest C and the least K it is faster than kiln_sgemm_pa for. */
int cg_sgemm_m_panel(const cg_target *t, int *max_n, int *min_k);
/* The rows per block of the C it writes blocked: its vector width (0:
 * none); *max_n (may be NULL) the widest such C it is taken for. */
int cg_sgemm_c_block(const cg_target *t, int *max_n);

/* Structured control flow for the helpers' builders (b builds into fn):
 * an alloca in fn's entry block (mem2reg makes it a register), stored
 * init unless NULL; for (i = lo; i < hi; i += step), loop_begin positioned
 * at the body returning i, loop_end after the loop; if (cond) { ... }. */
typedef struct cg_llvm_loop {
	LLVMValueRef i, step;
	LLVMBasicBlockRef head, exit;
} cg_llvm_loop;
LLVMValueRef cg_llvm_local(cg_llvm *L, LLVMBuilderRef b, LLVMValueRef fn, LLVMTypeRef ty,
                           LLVMValueRef init);
LLVMValueRef cg_llvm_loop_begin(cg_llvm *L, LLVMBuilderRef b, LLVMValueRef fn, cg_llvm_loop *l,
                                LLVMValueRef lo, LLVMValueRef hi, int64_t step);
void cg_llvm_loop_end(LLVMBuilderRef b, cg_llvm_loop *l);
/* llvm.loop metadata on a loop's back branch: a distinct node whose first
 * operand is itself, then the n properties, 1 <= n <= CG_LOOP_MD_MAX
 * (callers build at most 2; outside that nothing is attached) */
enum { CG_LOOP_MD_MAX = 4 };
void cg_llvm_loop_md(cg_llvm *L, LLVMValueRef br, const LLVMMetadataRef *props, int n);
LLVMBasicBlockRef cg_llvm_if_begin(cg_llvm *L, LLVMBuilderRef b, LLVMValueRef fn,
                                   LLVMValueRef cond);
void cg_llvm_if_end(LLVMBuilderRef b, LLVMBasicBlockRef join);
/* A new internal void function name(params), its vectors vec_bits wide at
 * most ("min-legal-vector-width"), b positioned in its entry block. */
LLVMValueRef cg_llvm_helper_fn(cg_llvm *L, LLVMBuilderRef b, const char *name,
                               LLVMTypeRef *params, unsigned n, int vec_bits);
/* Makes L's kiln_sgemm and kiln_transpose, where defined, visible to the
 * library's other parts (hidden external linkage). */
void cg_llvm_export_helpers(cg_llvm *L);
/* Declares once per module and returns
 *   void kiln_transpose(const float *src, i64 src_rs, float *dst, i64 dst_rs,
 *                       i64 rows, i64 cols)
 * dst[j*dst_rs + i] = src[i*src_rs + j] for i < rows, j < cols (CG_TRANSPOSE):
 * W x W blocks (W the vector width) loaded as W rows, transposed in
 * registers by log2(W) rounds of two-source shuffles, stored as W rows;
 * masked loads and stores at the edges, so no scalar code. */
LLVMValueRef cg_llvm_transpose(cg_llvm *L);
/* floats of packing scratch kiln_sgemm needs per thread */
uint64_t cg_sgemm_scratch_floats(const cg_target *t);

/* ---- llvm_qgemm.c ------------------------------------------------------- */

/* Index of the kiln_qgemm for A, B and C of these dtypes (A and B u8 or i8;
 * C u8, i8, i32 or f32), or -1 when there is none. */
int cg_qgemm_spec(kiln_dtype a, kiln_dtype b, kiln_dtype c);
/* Builds once per module (internal to it) and returns
 *   void kiln_qgemm_<a><b>_<c>(rt_exec *x, i64 M, i64 N, i64 K,
 *        const i8 *A, i64 a_rs, const i8 *B, i64 b_rs, const i64 *b_rows,
 *        void *C, i64 c_rs,
 *        const i8 *za, i64 za_step, const i8 *zb, i64 zb_step,
 *        const i32 *bias, i32 bias_axis, const float *scale, i32 scale_axis,
 *        const i8 *cz, float lo, float hi)
 * with v = sum_k (A[m*a_rs + k] - za[m*za_step]) * (B[bk + n] - zb[n*zb_step]),
 * bk = b_rows ? b_rows[k] : k*b_rs,
 * + bias (axis 1: bias[n], 2: bias[m], 0: none), all in i32 (za, zb, cz
 * null: zero); C[m*c_rs + n] is v for an i32 C, else
 * clamp(v * scale, lo, hi) (scale_axis 1: scale[n], 2: scale[m], 3:
 * scale[0], 0: 1), for an 8-bit C plus cz[0], rounded half to even and
 * saturated.  K at most CG_QGEMM_MAX_K (the panel lives in x->scratch);
 * NULL for dtypes it does not cover. */
LLVMValueRef cg_llvm_qgemm(cg_llvm *L, kiln_dtype a, kiln_dtype b, kiln_dtype c);
/* bytes of x->scratch kiln_qgemm needs per thread */
uint64_t cg_qgemm_scratch_bytes(const cg_target *t);

#endif /* KILN_CG_LLVM_H */
