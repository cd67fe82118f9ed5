/*
 * backend.h: the one interface between kernel IR and a code generator, in
 * the style of QBE's Target: a struct of function pointers that the
 * emission driver (emit.c: cg_emit, cg_emit_train) calls in order.  The
 * driver/ layer includes this header, never a backend's own (llvm.h).
 *
 * A backend reads only the cg_module (codegen.h) it is given: kernels,
 * buffers, each buffer's dims as kernel-IR expressions, symbol and I/O
 * names (cg_module_describe); never the graph (cg_module.g).  It may use
 * ir/'s dtype enum and helpers (kiln_dtype, kiln_dtype_name), its error
 * setter (ir_seterr) and its arena, and nothing else of ir/.
 *
 * How one library is emitted (emit.c):
 *   for every kernel of every program: supports(m, k, why) or fail, naming
 *     the backend, the kernel and why ("backend 'llvm' cannot take kernel
 *     'k3_matmul' (from MatMul 'mm'): GEMM with A i8 ...");
 *   open(lib) -> session;
 *   emit_kernels(session, program) for lib->m, then lib->eval when training;
 *   emit_library(session): the generated library's interface (descriptors,
 *     typed entry points, numel/io_dims functions, training tables);
 *   write(session, stage, path): "so" links the library, other stages
 *     (the backend's `stages`) write that stage; close(session).
 * Then emit.c writes the header (<out>.h), which needs only the module.
 */
#ifndef KILN_CG_BACKEND_H
#define KILN_CG_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codegen/codegen.h"

/* A training library (kiln_compile_train): the state table and the step
 * program's contract. */
typedef struct cg_train_info {
	int nstate;
	const char *const *state_name;     /* PyTorch names */
	const kiln_tensor *const *state_init;
	const int *next;                   /* per step output: state index (-1: loss) */
	int lr, t, apply;                  /* step input positions (apply: -1 none) */
	int accum;                         /* micro-batches per optimizer step */
	int micro;                         /* step input "__micro__" (i64: micro-batches
	                                      so far, Dropout's reseeding), -1 none */
	const int *ready;                  /* per step output: for a gradient ("<p>.grad",
	                                      next -1), the last kernel writing it; else -1 */
	int split;                         /* the first kernel after every gradient (the
	                                      optimizer's); -1: the step cannot split */
} cg_train_info;

/* What one library holds: one program (inference), or a training step and
 * its eval program over one state table. */
typedef struct cg_library {
	const cg_module *m;          /* the program; when training, the step */
	const cg_module *eval;       /* training: the eval program, else NULL */
	const cg_train_info *ti;     /* training: the state table and step contract, else NULL */
	const char *name;            /* C name: the entry points' prefix */
	const kiln_compile_opts *o;  /* target options (cpu, features) */
} cg_library;

typedef struct cg_session cg_session; /* a backend's state while emitting one library */

typedef struct cg_backend {
	const char *name;                  /* "llvm": what messages and cg_backend_find use */
	const char *const *stages;         /* what it writes besides "so" (NULL-terminated) */
	/* Whether it can emit kernel k of m; if not, a phrase saying what it
	 * cannot take into why ("GEMM with A i8 (it has f32 GEMMs only)"). */
	bool (*supports)(const cg_module *m, const cg_kernel *k, char *why, size_t size);
	kiln_status (*open)(cg_session **s, const cg_library *lib, kiln_error *err);
	/* every kernel of m, which is lib->m or lib->eval */
	kiln_status (*emit_kernels)(cg_session *s, const cg_module *m, kiln_error *err);
	/* the library around the programs' kernels */
	kiln_status (*emit_library)(cg_session *s, kiln_error *err);
	/* stage "so": the linked library at path; else that stage's file */
	kiln_status (*write)(cg_session *s, const char *stage, const char *path, kiln_error *err);
	void (*close)(cg_session *s);
	/* The height of the row panels its GEMMs read a constant A in and the
	 * widths of the column panels for a constant B, packed at compile time
	 * (cg_prepack, cg_gemm.a_panel, b_panel), for target options o; 0: it
	 * reads none (may be NULL).  KILN_OK or the target's error. */
	kiln_status (*gemm_panel)(const kiln_compile_opts *o, cg_panels *p, kiln_error *err);
} cg_backend;

extern const cg_backend cg_llvm_backend; /* llvm_emit.c */
extern const cg_backend cg_cuda_backend; /* cuda_emit.c: CUDA C, PTX, cubin */
extern const cg_backend cg_cuda_emu_backend; /* cuda_emit.c: the same kernels for the host */

/* The backend called name; NULL name: the default (llvm).  NULL if none. */
const cg_backend *cg_backend_find(const char *name);

/* KILN_OK when b supports every kernel of m, else KILN_EUNSUPPORTED naming
 * the backend, the kernel, the node it came from and why. */
kiln_status cg_backend_check(const cg_backend *b, const cg_module *m, kiln_error *err);

/* The back half of kiln_compile (driver/compile.c): a lowered,
 * memory-planned module to out_path through backend b (NULL: the default);
 * o->emit as there ("kir" needs no backend; the .so gets its header), entry
 * points prefixed with name.  Tests feed it hand-built modules. */
kiln_status cg_emit(const cg_backend *b, const cg_module *m, const char *out_path,
                    const kiln_compile_opts *o, const char *name, kiln_error *err);
/* The back half of kiln_compile_train: step program m (STATE buffers
 * indexed into ti's table) and eval into one .so at out_path, with its
 * header. */
kiln_status cg_emit_train(const cg_backend *b, const cg_module *m, const cg_module *eval,
                          const cg_train_info *ti, const char *out_path,
                          const kiln_compile_opts *o, const char *name, kiln_error *err);

/* ---- the weights' object (blob.c) ------------------------------------------
 * Constant bytes a library embeds (weights, initial training state) are laid
 * out, 64-byte aligned, in one blob that is written straight into an ELF
 * object of its own (one read-only section, one hidden symbol), so a code
 * generator never copies, hashes or emits them: ResNet-18's 85 MB took
 * about 1.5 s of a 6.5 s compile inside LLVM.  Equal byte strings are stored
 * once.  The bytes stay their owner's (the module's) until the object is
 * written. */

#define CG_BLOB_SYMBOL "kiln_blob"

typedef struct cg_blob_item {
	const void *data;
	size_t n;
	uint64_t at;             /* offset in the blob */
} cg_blob_item;

typedef struct cg_blob {
	cg_blob_item *item;
	int nitem, capitem;
	uint64_t size;           /* bytes, padding included */
	bool failed;             /* out of memory recording an item */
} cg_blob;

/* The offset of n bytes at data in bl: where an equal string already is,
 * else appended at the next multiple of 64.  -1: out of memory. */
int64_t cg_blob_add(cg_blob *bl, const void *data, size_t n);
/* An x86-64 ELF relocatable object at path (an intermediate file) defining
 * CG_BLOB_SYMBOL (hidden, 64-byte aligned, in .lrodata.kiln_blob) as bl's
 * bytes. */
kiln_status cg_blob_write_object(const cg_blob *bl, const char *path, kiln_error *err);
void cg_blob_free(cg_blob *bl);

/* ---- files (emit.c), for backends that write them -------------------------- */

/* A C identifier from s: other characters become '_', a leading digit gets
 * one before it; "model" when s is empty. */
void cg_c_name(char *out, size_t size, const char *s);
/* A new, empty temporary file beside path (mode less the umask), its name
 * into tmp; cg_commit renames it over path (fsync first). */
kiln_status cg_temp_file(const char *path, unsigned mode, char *tmp, size_t size,
                         kiln_error *err);
kiln_status cg_commit_file(const char *tmp, const char *path, kiln_error *err);
/* Runs argv (argv[0] found in $PATH, no shell) and checks its exit status;
 * its output is captured: on failure the message names what (the file being
 * made), the command and what the tool said. */
kiln_status cg_run_tool(const char *what, char *const *argv, kiln_error *err);

/* ---- the runtime archive (rtpath.c) ---------------------------------------- */

/* The runtime archive a generated library links (libkilnrt_gen.a), as an
 * absolute path into out: $KILN_RT_LIB, else found beside the running
 * executable or libkiln.so, in the build tree or the install prefix
 * (rtpath.c says in which order).  EIO naming every path tried when none
 * is there. */
kiln_status cg_runtime_archive(char *out, size_t size, kiln_error *err);
/* The same search from given places (for tests): */
typedef struct cg_rt_search {
	const char *env;       /* $KILN_RT_LIB's value, or NULL */
	const char *exe;       /* the running executable's path, or NULL */
	const char *lib;       /* the object holding libkiln's code (dladdr), or NULL */
	const char *build;     /* the build tree's archive */
	const char *installed; /* the configured install prefix's folder for it */
} cg_rt_search;
kiln_status cg_runtime_find(const cg_rt_search *w, char *out, size_t size, kiln_error *err);

/* The cache folder (llvm_emit.c): dir, else $KILN_CACHE_DIR, else
 * $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; NULL when that is ""
 * (caching off) or there is no home.  Into buf. */
const char *cg_cache_dir(const char *dir, char *buf, size_t size);
/* A string naming everything but the graph that decides a library's bytes
 * (target CPU and features, LLVM and kiln versions, this build), for cache
 * keys.  o (may be NULL) gives cpu and features. */
kiln_status cg_build_identity(const kiln_compile_opts *o, char *buf, size_t size,
                              kiln_error *err);

#endif /* KILN_CG_BACKEND_H */
