/*
 * testutil.h: helpers the compiled-library tests share (testutil.c, one
 * small archive linked into every unit test, onnx_conformance and
 * cuda_nvrtc_check): temporary folders, whole files, the f32 tolerance
 * policy of the op cases, reason lists, and "compile g into a fresh
 * folder, load it, run it" for any target.
 *
 * Plain C over the public API, no Check: the callers assert.
 */
#ifndef KILN_TESTUTIL_H
#define KILN_TESTUTIL_H

#include <stddef.h>

#include "kiln/kiln.h"

/* Removes every file in dir, then dir. */
void tu_remove_dir(const char *dir);

/* The whole file, NUL-terminated (free it); its size into *size when not
 * NULL.  NULL when it cannot be read. */
char *tu_slurp(const char *path, size_t *size);

/* An op case's tolerance for one output: f32, f16 and bf16 at least 1e-4
 * absolute (compiled kernels reassociate sums and use their own exp, tanh
 * and erf; test_compiled_ops.c says why), other dtypes the case's own. */
double tu_tolerance(const kiln_tensor *want, double case_tol);

/* A list of names with why, ended by {NULL, NULL} (known gaps, refused
 * cases); tu_reason_of gives name's reason or NULL. */
typedef struct tu_reason {
	const char *name, *reason;
} tu_reason;
const char *tu_reason_of(const tu_reason *list, const char *name);

/* kiln_compile(g, o) into "<name>.so" (name: o->name, else "model") in a
 * fresh folder $TMPDIR/<prefix>.XXXXXX, kiln_load, the folder removed,
 * kiln_model_run on in.  The status of the first step that fails, its
 * message in err; nothing is cached between calls. */
kiln_status tu_compile_run(const kiln_graph *g, const kiln_compile_opts *o, const char *prefix,
                           kiln_tensor *const *in, int nin, kiln_tensor **out, int nout,
                           kiln_error *err);

#endif /* KILN_TESTUTIL_H */
