/*
 * cuda.h: the CUDA backend's private interface (cuda.c prints kernel IR as
 * CUDA C; cuda_nvrtc.c compiles it with NVRTC where the toolkit was found
 * at build time).  Nothing here needs the toolkit's headers.
 */
#ifndef KILN_CG_CUDA_H
#define KILN_CG_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "codegen/codegen.h"

/* How kernels are printed. */
typedef struct cg_cuda_opts {
	bool emulate;   /* add the host runners: one rt_kernel_fn per kernel that
	                   runs its launches as loops on the CPU (KILN_CUDA_EMULATE),
	                   and <prefix>_kernels[], the table of them */
	const char *prefix; /* of every name printed (NULL: "kiln"), so that several
	                   modules can share one NVRTC program */
} cg_cuda_opts;

#define CG_CUDA_MAX_SYM 16 /* size symbols a kernel takes (kiln_sizes) */

/* Whether the printer takes kernel k of m; if not, why (into why). */
bool cg_cuda_supports(const cg_module *m, const cg_kernel *k, char *why, size_t size);

/* m's kernels as one CUDA C translation unit, malloc'd (NULL: out of
 * memory).  It needs no header: NVRTC compiles it as it is, and with
 * -DKILN_CUDA_EMULATE a C++ compiler compiles it for the host, each kernel
 * then an rt_kernel_fn named kiln_run_<k> (k the kernel's index). */
char *cg_cuda_print(const cg_module *m, const cg_cuda_opts *o);

/* An index expression (over sizes: CG_SIZE k printed as sym[k]) as host C. */
void cg_cuda_print_expr(FILE *f, const cg_module *m, const cg_expr *e);

/* ---- NVRTC (cuda_nvrtc.c) ----------------------------------------------------- */

/* Whether this build has NVRTC (the CUDA toolkit was found by CMake). */
bool cg_nvrtc_available(void);
/* src compiled for arch ("sm_80"): cubin, or PTX when ptx (for compute_XX).
 * *out malloc'd, *n its size; warnings fail too when strict (their text in
 * the message).  KILN_EUNSUPPORTED when this build has no NVRTC. */
kiln_status cg_nvrtc_compile(const char *src, const char *name, const char *arch, bool ptx,
                             bool strict, bool fast_math, void **out, size_t *n,
                             kiln_error *err);

#endif /* KILN_CG_CUDA_H */
