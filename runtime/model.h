/*
 * model.h: the contract between a generated library and the runtime code
 * statically linked into it.
 *
 * A generated .so holds LLVM-compiled kernels, its weights, and one
 * constant rt_model_desc describing them.  Everything that is not
 * arithmetic (checking inputs against the signature, binding the batch
 * symbol, sizing and allocating the planned scratch once per context,
 * running kernels in order, the thread pool) is ordinary C here, in
 * runtime/model.c and runtime/pool.c, linked into every generated library.
 * The LLVM backend emits rt_model_desc with exactly this layout (all
 * pointers 8 bytes, the fields in this order; RT_MODEL_ABI changes
 * whenever it does).
 */
#ifndef KILN_RT_MODEL_H
#define KILN_RT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define RT_MODEL_ABI 5 /* 2: RT_BUF_STATE, the state table, rt_train_desc;
                          3: rt_exec.fault (kernels report bad indices);
                          4: rt_train_desc.ready and .split (the split step);
                          5: chunked runs (rt_chunk_desc), appended to
                          rt_model_desc: a 3 or 4 has none and is still run */
#define RT_MODEL_ABI_MIN 3 /* the oldest ABI this runtime runs: a loaded library's
                              kernels call its own static copy of the pool
                              (rt_parallel_for) with this runtime's rt_exec and
                              rt_pool, so any change to those is a new ABI */

typedef struct rt_pool rt_pool;

/* The first fault a run's kernels report: a data-dependent index (Gather's
 * indices, a loss's targets) outside [lo, hi), or with lo >= hi a fault
 * that what alone describes (an integer division by zero).  The kernel
 * carries on with the index clamped (the divisor made safe), so it never
 * reads outside a buffer or traps; the driver fails the run after that
 * kernel with what, value and the range. */
typedef struct rt_fault {
	_Atomic int32_t set;  /* 0 until the first report; the first one wins */
	const char *what;     /* "model.c:12: Gather 'embed': index" */
	int64_t value, lo, hi;
} rt_fault;

/* What every kernel receives.  Workers of a parallel loop get a copy with
 * their own scratch. */
typedef struct rt_exec {
	void **buf;          /* base pointer of every buffer, by buffer id */
	const int64_t *sym;  /* the runtime sizes (symbol values) */
	rt_pool *pool;       /* NULL: run parallel loops inline */
	float *scratch;      /* this thread's GEMM packing scratch */
	int64_t thread;      /* this thread's index, 0..nthreads-1 */
	rt_fault *fault;     /* where rt_out_of_range records (ABI 3) */
} rt_exec;

typedef void (*rt_kernel_fn)(rt_exec *x);
typedef void (*rt_range_fn)(rt_exec *x, int64_t begin, int64_t end);

/* Called by a kernel (CG_CHECK, codegen.h) when value is not in [lo, hi):
 * records the fault in x->fault unless one is recorded already.  Safe from
 * any thread of a parallel loop. */
void rt_out_of_range(rt_exec *x, const char *what, int64_t value, int64_t lo, int64_t hi);

/* Runs fn over [0, n) in chunks on the pool (inline when there is none or
 * when called from inside a parallel loop). */
void rt_parallel_for(rt_exec *x, int64_t n, rt_range_fn fn);

/* 1 when this process may use AMX tiles (asking Linux for them on the
 * first call), else 0: kiln_qgemm's choice of path (runtime/amx.c). */
int rt_amx_ready(void);

enum { RT_DIM_FIXED = 0, RT_DIM_SYM = 1, RT_DIM_EXPR = 2 };

typedef struct rt_io_desc {
	const char *name;
	int32_t dtype;        /* kiln_dtype */
	int32_t rank;
	const int64_t *dims;  /* per dim: a size, or a symbol number, or unused */
	const int32_t *dim_kind; /* RT_DIM_*: EXPR dims come from io_dims() */
	int32_t buf;          /* buffer id */
	int32_t pad_;
} rt_io_desc;

/* STATE: a tensor the context owns and a train step replaces (parameters,
 * BatchNorm buffers, optimizer state); its slot is its index in the
 * description's state table. */
enum { RT_BUF_INPUT = 0, RT_BUF_OUTPUT = 1, RT_BUF_CONST = 2, RT_BUF_TEMP = 3,
       RT_BUF_STATE = 4 };

typedef struct rt_buf_desc {
	int32_t kind;         /* RT_BUF_* */
	int32_t dtype;
	int32_t slot;         /* TEMP: scratch slot; STATE: state index; -1 otherwise */
	int32_t alias;        /* >= 0: same bytes as that buffer */
	const void *data;     /* CONST: embedded data (64-byte aligned) */
} rt_buf_desc;

/* One tensor of mutable state: fixed shape, initial bytes embedded. */
typedef struct rt_state_desc {
	const char *name;     /* PyTorch's name: "fc1.weight", "fc1.weight.exp_avg" */
	int32_t dtype, rank;
	const int64_t *dims;
	const void *init;     /* 64-byte aligned, dims' product times the dtype size */
} rt_state_desc;

/* A run of kernels first..last executed chunk by chunk over the batch
 * (codegen/chunk.c): when symbol sym is larger than chunk, the driver runs
 * the kernels on samples [0, chunk), then [chunk, 2*chunk), ..., with the
 * symbol bound to the chunk's size and each buffer of off[] (its dim 0 is
 * the symbol) moved to the chunk's first sample.  Buffers internal to the
 * run (rt_model_desc.chunk_of) keep their pointer and are sized for one
 * chunk. */
typedef struct rt_chunk_desc {
	int32_t first, last;  /* kernels, inclusive; runs in order, disjoint */
	int32_t sym, chunk;   /* the batch symbol; samples per chunk (>= 1) */
	int32_t noff, pad_;
	const int32_t *off;   /* buffer ids: alias roots, whose pointer the
	                         class's kernels read (numel: batch x sample) */
} rt_chunk_desc;

typedef struct rt_model_desc {
	uint32_t abi;         /* RT_MODEL_ABI */
	uint32_t nsym;
	const char *name;     /* the model's C name: "mnist" */
	const char *const *sym_names;
	uint32_t ninputs, noutputs;
	const rt_io_desc *inputs, *outputs;
	uint32_t nbuf, nslot;
	const rt_buf_desc *bufs;
	uint32_t nkern, pad_;
	const rt_kernel_fn *kernels;
	const char *const *kernel_names;
	/* element count of every buffer, given the symbols */
	void (*numel)(const int64_t *sym, int64_t *numel);
	/* every input then output dim, flattened in signature order */
	void (*io_dims)(const int64_t *sym, int64_t *dims);
	uint64_t scratch_floats; /* GEMM packing scratch per thread */
	/* the state its STATE buffers index (a training library's two programs
	 * share one table); 0 and NULL for an inference model */
	uint32_t nstate, pad2_;
	const rt_state_desc *state;
	/* ABI 5: the chunked runs; chunk_of: per buffer, the run it is internal
	 * to, else -1 (NULL when nchunk is 0) */
	uint32_t nchunk, pad3_;
	const rt_chunk_desc *chunks;
	const int32_t *chunk_of;
} rt_model_desc;

/* A training library (kiln_compile_train) exports this as `kiln_train_desc`
 * beside `kiln_model_desc` (its eval program).  The step program's inputs
 * are the data inputs, then "lr" and "step" (f64 scalars), "apply" (bool,
 * with accum > 1) and "__micro__" (i64, the micro-batches taken so far, from
 * which training-mode Dropout reseeds: with Dropout only) at the positions
 * given; its outputs are the loss, then
 * one "<name>.next" per state tensor it replaces (next[i]: that index). */
typedef struct rt_train_desc {
	uint32_t abi;         /* RT_MODEL_ABI */
	uint32_t accum;       /* micro-batches per optimizer step (>= 1) */
	const rt_model_desc *step, *eval; /* share one state table */
	const int32_t *next;  /* per step output: state index (-1 for output 0) */
	int32_t lr, t, apply; /* step input positions ("apply": -1 when accum 1) */
	int32_t micro1;       /* "__micro__" input position + 1; 0: none (this was
	                         padding, 0 in libraries made before it) */
	/* ABI 4: per step output, for a gradient "<p>.grad" (next -1) the last
	 * kernel that writes it, else -1; split: the first kernel after every
	 * gradient (the optimizer's), -1 when the step cannot stop there */
	const int32_t *ready;
	int32_t split, pad_;
} rt_train_desc;

/* ---- the driver (model.c), linked into every generated library --------- */

typedef struct rt_model rt_model;

kiln_status rt_model_create(const rt_model_desc *d, rt_model **out);
void rt_model_destroy(rt_model *m);
kiln_status rt_model_set_threads(rt_model *m, int n); /* 0: KILN_NUM_THREADS or 1 */
/* ns NULL: off; else every later run adds kernel k's wall time to ns[k]
 * (d->nkern entries, the caller's). */
void rt_model_set_profile(rt_model *m, uint64_t *ns);
const char *rt_model_errmsg(const rt_model *m);
/* Typed entry: syms[] gives each symbol (may be NULL when nsym == 0),
 * in[] and out[] the data pointers in signature order. */
kiln_status rt_model_run(rt_model *m, const int64_t *syms, const void *const *in,
                         void *const *out);
/* Generic entry: shapes are checked against the signature (symbols bound
 * from them) before any kernel runs; out[] must have the signature's
 * output shapes for those symbols (see rt_model_output_shape). */
/* rt_model_run calling hook(ud, m, k) after each kernel k that succeeded;
 * a hook's non-OK status ends the run with it (rt_model_set_error sets the
 * message).  While a hook runs, rt_model_buf(m, b) is buffer b's memory. */
typedef kiln_status (*rt_kernel_hook)(void *ud, rt_model *m, uint32_t k);
kiln_status rt_model_run_hooked(rt_model *m, const int64_t *syms, const void *const *in,
                                void *const *out, rt_kernel_hook hook, void *ud);
kiln_status rt_model_run_tensors_hooked(rt_model *m, const kiln_tensor *const *in, int nin,
                                        kiln_tensor *const *out, int nout, rt_kernel_hook hook,
                                        void *ud);
void *rt_model_buf(const rt_model *m, int32_t b);
kiln_status rt_model_set_error(rt_model *m, kiln_status code, const char *msg);
kiln_status rt_model_run_tensors(rt_model *m, const kiln_tensor *const *in, int nin,
                                 kiln_tensor *const *out, int nout);
/* The shape output i has for the symbols bound by the given inputs. */
kiln_status rt_model_output_shape(rt_model *m, const kiln_tensor *const *in, int nin, int i,
                                  int *rank, int64_t *dims);
/* Checks a description (ABI, tables, buffer/io/symbol references, alias
 * cycles) as rt_model_create does, writing why it is bad into msg. */
kiln_status rt_model_validate(const rt_model_desc *d, char *msg, size_t size);

/* A context of a model with state (nstate > 0) whose state tensors live at
 * state[i], owned by the caller, instead of its own copy. */
kiln_status rt_model_create_shared(const rt_model_desc *d, void *const *state, rt_model **out);

/* ---- the training driver (model_train.c) ----------------------------------
 * A training context owns the state (initialised from the embedded values),
 * a context for each program sharing it, the "<name>.next" results and the
 * step counters.  A step runs the step program with lr, step = steps + 1 and
 * apply, then copies every ".next" result over its state tensor; nothing is
 * committed when the run fails.  Checkpoints are kiln_trainer's format. */

typedef struct rt_train rt_train;

kiln_status rt_train_create(const rt_train_desc *d, rt_train **out);
void rt_train_destroy(rt_train *t);
kiln_status rt_train_set_threads(rt_train *t, int n);
const char *rt_train_errmsg(const rt_train *t);
int64_t rt_train_steps(const rt_train *t);
/* Typed: syms of the step program, its data inputs in order (lr, step,
 * apply and __micro__ excluded), the loss written to *loss (the loss dtype). */
kiln_status rt_train_step(rt_train *t, const int64_t *syms, const void *const *in, double lr,
                          void *loss);
/* Typed eval program run: as rt_model_run. */
kiln_status rt_train_eval(rt_train *t, const int64_t *syms, const void *const *in,
                          void *const *out);
/* Generic: shapes checked from the tensors; *loss may be NULL. */
kiln_status rt_train_step_tensors(rt_train *t, const kiln_tensor *const *in, int nin, double lr,
                                  double *loss);
rt_model *rt_train_eval_model(rt_train *t);
/* The split step (kiln_model_train_step_hook): gradients grouped into
 * buckets of at most bytes (at least one tensor each, the last layer's
 * first); rt_train_step_hook calls h->ready per bucket as soon as its last
 * kernel has run and h->wait before the optimizer's first kernel. */
kiln_status rt_train_set_bucket_bytes(rt_train *t, int64_t bytes);
int rt_train_num_buckets(const rt_train *t);
kiln_status rt_train_step_hook(rt_train *t, const kiln_tensor *const *in, int nin, double lr,
                               const kiln_grad_hook *h, double *loss);
/* Atomic safetensors checkpoint; load checks everything before changing. */
kiln_status rt_train_save(rt_train *t, const char *path);
kiln_status rt_train_load(rt_train *t, const char *path);
/* A copy of the state and counters (caller frees). */
kiln_tensor_set *rt_train_state(const rt_train *t);
/* Replaces the state and counters with s (as rt_train_state gives it; a
 * checksum is optional), checked first as a checkpoint is. */
kiln_status rt_train_set_state(rt_train *t, const kiln_tensor_set *s);
/* State tensor name over the context's own storage (no copy). */
kiln_status rt_train_state_view(rt_train *t, const char *name, kiln_tensor *out);
/* ---- the checkpoint format -------------------------------------------------
 * One format for kiln_trainer (driver/train.c) and a compiled training
 * library (rt_train_save/load): a safetensors file of every state tensor
 * under its name, i64 scalars RT_CKPT_STEP and RT_CKPT_MICRO, and
 * RT_CKPT_SUM, the sum of per-tensor FNV-1a hashes of name, dtype, shape
 * and bytes over every other tensor (so the order in the file does not
 * matter). */
#define RT_CKPT_STEP "__step__"
#define RT_CKPT_MICRO "__micro__"
#define RT_CKPT_SUM "__checksum__"
/* The checkpoint checksum: FNV-1a sums over every tensor but RT_CKPT_SUM. */
uint64_t rt_ckpt_checksum(const kiln_tensor_set *s);
/* Adds the counters to s; KILN_ENOMEM (or a duplicate name's status). */
kiln_status rt_ckpt_add_counters(kiln_tensor_set *s, int64_t steps, int64_t micro);
/* Adds RT_CKPT_SUM over everything already in s: the last step of a save. */
kiln_status rt_ckpt_seal(kiln_tensor_set *s);
/* KILN_EPARSE naming path when s has no i64 scalar RT_CKPT_SUM ("not a
 * kiln checkpoint?") or it does not match the contents ("corrupt"). */
kiln_status rt_ckpt_check_sum(const kiln_tensor_set *s, const char *path, kiln_error *err);
/* The largest step or micro-batch count a checkpoint may hold: the step
 * graph takes steps + 1 as an f64, exact up to 2^53, and no run counts
 * that far, so anything above is an edited or corrupt file. */
#define RT_CKPT_MAX_COUNT ((int64_t)1 << 53)
/* Reads "__step__" and "__micro__" from a checkpoint: i64 scalars in
 * [0, RT_CKPT_MAX_COUNT] with steps <= micro, else a message naming the
 * field and its value. */
kiln_status rt_ckpt_counters(const kiln_tensor_set *s, const char *path, int64_t *steps,
                             int64_t *micro, kiln_error *err);

#endif /* KILN_RT_MODEL_H */
