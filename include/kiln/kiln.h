/*
 * kiln.h: the public C API of kiln, a static-graph compiler for neural nets.
 *
 * A model is traced into a graph: each builder call appends one node and
 * returns a value handle, so ordinary C loops and ifs run at trace time and
 * the graph that comes out is static.  Layers register parameters under
 * PyTorch's names, so a state_dict saved as safetensors loads by name.
 *
 *     kiln_graph *g = kiln_graph_new("mlp");
 *     int64_t N = kiln_sym(g, "N");                  // symbolic batch
 *     kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){N, 784});
 *     kiln_value h = kiln_relu(g, kiln_linear(g, "fc1", x, 256, true));
 *     kiln_value y = kiln_linear(g, "fc2", h, 10, true);
 *     kiln_output(g, "logits", y);
 *     if (kiln_graph_status(g) != KILN_OK)           // sticky first error
 *         fprintf(stderr, "%s\n", kiln_graph_errmsg(g));
 *     kiln_tensor *in[1] = {x_batch}, *out[1];
 *     kiln_graph_run(g, in, 1, out, 1, &err);        // reference interpreter
 *     kiln_graph_free(g);                            // frees everything
 *
 * Errors: every call that can fail returns a kiln_status, or records one in
 * the graph.  A graph keeps its first error (op, node, shapes and the caller's
 * file:line); builder calls after it do nothing and return KILN_NONE until
 * kiln_graph_clear_error().  Nothing in the library aborts or exits.
 */
#ifndef KILN_H
#define KILN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KILN_BUILD)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#define KILN_VERSION "0.1.0"
#define KILN_MAX_RANK 8

/* ---- status codes ---------------------------------------------------- */

typedef enum kiln_status {
	KILN_OK = 0,       /* success */
	KILN_EINVAL,       /* bad argument: null pointer, unknown name, bad attr */
	KILN_ESHAPE,       /* shapes or dtypes that do not fit the op */
	KILN_EUNSUPPORTED, /* valid input that kiln cannot handle (yet) */
	KILN_EPARSE,       /* malformed text or file */
	KILN_ENOMEM,       /* allocation failed */
	KILN_EIO,          /* file could not be read or written */
	KILN_EVERIFY,      /* graph violates an IR invariant */
} kiln_status;

KILN_API const char *kiln_status_str(kiln_status st);

/* A caller-owned error: code plus one message.  Any function taking a
 * kiln_error * accepts NULL when the caller only wants the code. */
typedef struct kiln_error {
	kiln_status code;
	char msg[1024];
} kiln_error;

/* Where a DSL call came from; every node remembers it for messages. */
typedef struct kiln_loc {
	const char *file; /* static string or interned in the graph */
	int line;
} kiln_loc;
#define KILN_HERE ((kiln_loc){__FILE__, __LINE__})

/* ---- dtypes and tensors ---------------------------------------------- */

typedef enum kiln_dtype {
	KILN_DT_INVALID = 0,
	KILN_F32,  /* IEEE binary32 */
	KILN_F64,  /* IEEE binary64 */
	KILN_F16,  /* IEEE binary16 */
	KILN_BF16, /* bfloat16: top half of a binary32 */
	KILN_I8,
	KILN_U8,
	KILN_I32,
	KILN_I64,
	KILN_BOOL, /* one byte, 0 or 1 */
	KILN_DT_COUNT
} kiln_dtype;

KILN_API size_t kiln_dtype_size(kiln_dtype dt);
KILN_API const char *kiln_dtype_name(kiln_dtype dt); /* "f32", "i64", ... */
KILN_API kiln_dtype kiln_dtype_from_name(const char *name);
KILN_API bool kiln_dtype_is_float(kiln_dtype dt);

/* A dense, row-major tensor with a concrete shape.  kiln_tensor_new makes
 * one allocation: header plus 64-byte aligned, zeroed data. */
typedef struct kiln_tensor {
	kiln_dtype dtype;
	int rank;
	int64_t shape[KILN_MAX_RANK];
	void *data;
} kiln_tensor;

KILN_API kiln_tensor *kiln_tensor_new(kiln_dtype dt, int rank, const int64_t *shape);
KILN_API void kiln_tensor_free(kiln_tensor *t);
KILN_API int64_t kiln_tensor_numel(const kiln_tensor *t);
KILN_API size_t kiln_tensor_nbytes(const kiln_tensor *t);
KILN_API kiln_tensor *kiln_tensor_clone(const kiln_tensor *t);

/* Named tensors, as in a safetensors file or a state_dict. */
typedef struct kiln_named_tensor {
	char *name;
	kiln_tensor *tensor;
} kiln_named_tensor;

typedef struct kiln_tensor_set {
	int count;
	kiln_named_tensor *items;
} kiln_tensor_set;

KILN_API kiln_tensor_set *kiln_tensor_set_new(void);
/* Adds a copy of t under name (replacing any tensor of that name). */
KILN_API kiln_status kiln_tensor_set_add(kiln_tensor_set *s, const char *name,
                                         const kiln_tensor *t);
KILN_API const kiln_tensor *kiln_tensor_set_get(const kiln_tensor_set *s,
                                                const char *name);
KILN_API void kiln_tensor_set_free(kiln_tensor_set *s);

/* ---- tensor files (runtime/) ----------------------------------------- */

KILN_API kiln_status kiln_npy_read(const char *path, kiln_tensor **out, kiln_error *err);
KILN_API kiln_status kiln_npy_write(const char *path, const kiln_tensor *t, kiln_error *err);
KILN_API kiln_status kiln_safetensors_read(const char *path, kiln_tensor_set **out,
                                           kiln_error *err);
/* size bytes of data as the file path, written atomically (a temporary file
 * beside it, fsync, rename): the old file stays whole if anything fails. */
KILN_API kiln_status kiln_write_file(const char *path, const void *data, size_t size,
                                     kiln_error *err);
/* Written atomically: temporary file, fsync, rename. */
KILN_API kiln_status kiln_safetensors_write(const char *path, const kiln_tensor_set *s,
                                            kiln_error *err);

/* What a file holds, judged by its first bytes, never by its name. */
typedef enum kiln_file_kind {
	KILN_FILE_UNKNOWN,     /* unreadable, not a regular file, or none of these */
	KILN_FILE_KIR,         /* text that (after blanks and # comments) starts "graph" */
	KILN_FILE_ONNX,        /* binary that is not one of the others: a protobuf */
	KILN_FILE_ELF,         /* \x7fELF: a compiled library */
	KILN_FILE_NPY,         /* \x93NUMPY */
	KILN_FILE_SAFETENSORS, /* u64 header length, then '{' */
	KILN_FILE_TEXT,        /* other text: a .kir that will not parse */
} kiln_file_kind;
KILN_API kiln_file_kind kiln_file_sniff(const char *path);
/* "a compiled library (ELF shared object)", "an ONNX model", ...; "?" for
 * a value out of range. */
KILN_API const char *kiln_file_kind_name(kiln_file_kind k);

/* ---- graphs ---------------------------------------------------------- */

typedef struct kiln_graph kiln_graph;

/* A value handle: a small index into its graph.  0 is "no value". */
typedef uint32_t kiln_value;
#define KILN_NONE ((kiln_value)0)

KILN_API kiln_graph *kiln_graph_new(const char *name);
KILN_API void kiln_graph_free(kiln_graph *g);
KILN_API const char *kiln_graph_name(const kiln_graph *g);
KILN_API kiln_status kiln_graph_status(const kiln_graph *g);
KILN_API const char *kiln_graph_errmsg(const kiln_graph *g); /* "" when OK */
KILN_API void kiln_graph_clear_error(kiln_graph *g);
/* Seeds the generator behind parameter initialisation (default 0). */
KILN_API void kiln_graph_seed(kiln_graph *g, uint64_t seed);
/* Train mode changes what BatchNorm and Dropout layers trace. */
KILN_API void kiln_graph_set_training(kiln_graph *g, bool training);

/* A dimension: >= 0 is a fixed size, < 0 a handle to a symbolic size. */
KILN_API int64_t kiln_sym(kiln_graph *g, const char *name);

KILN_API kiln_value kiln_input_at(kiln_graph *g, kiln_loc loc, const char *name,
                                  kiln_dtype dt, int rank, const int64_t *dims);
KILN_API void kiln_output_at(kiln_graph *g, kiln_loc loc, const char *name, kiln_value v);
/* A parameter owned by the graph; data copied from init (NULL: zeros). */
KILN_API kiln_value kiln_param_at(kiln_graph *g, kiln_loc loc, const char *name,
                                  const kiln_tensor *init);
/* A constant folded into the graph (a Constant node). */
KILN_API kiln_value kiln_constant_at(kiln_graph *g, kiln_loc loc, const kiln_tensor *t);
KILN_API kiln_value kiln_scalar_at(kiln_graph *g, kiln_loc loc, kiln_dtype dt, double v);
#define kiln_input(g, ...) kiln_input_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_output(g, ...) kiln_output_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_param(g, ...) kiln_param_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_constant(g, ...) kiln_constant_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_scalar(g, ...) kiln_scalar_at(g, KILN_HERE, __VA_ARGS__)

/* Introspection of a value (shape dims may be symbolic handles). */
KILN_API kiln_dtype kiln_value_dtype(const kiln_graph *g, kiln_value v);
KILN_API int kiln_value_rank(const kiln_graph *g, kiln_value v);
KILN_API int64_t kiln_value_dim(const kiln_graph *g, kiln_value v, int axis);
/* Prints a value's type, e.g. "f32[N,784]", into buf. */
KILN_API const char *kiln_value_type_str(const kiln_graph *g, kiln_value v, char *buf,
                                         size_t size);

KILN_API int kiln_graph_num_inputs(const kiln_graph *g);
KILN_API int kiln_graph_num_outputs(const kiln_graph *g);
KILN_API kiln_value kiln_graph_input(const kiln_graph *g, int i);
KILN_API kiln_value kiln_graph_output(const kiln_graph *g, int i);
KILN_API const char *kiln_value_name(const kiln_graph *g, kiln_value v);

/* Parameters (initializers) by name, and loading a state_dict into them:
 * a missing, extra or mis-shaped tensor is an error naming it. */
KILN_API kiln_value kiln_graph_find_param(const kiln_graph *g, const char *name);
KILN_API kiln_status kiln_graph_load_params(kiln_graph *g, const kiln_tensor_set *s,
                                            kiln_error *err);
KILN_API kiln_tensor_set *kiln_graph_params(const kiln_graph *g); /* a copy */

/* Parameters one by one, in value (creation) order: trainable weights and
 * buffers (trainable=false: BatchNorm running stats, kiln_buffer state).
 * kiln_graph_param is KILN_NONE when i is out of range. */
KILN_API int kiln_graph_num_params(const kiln_graph *g);
KILN_API kiln_value kiln_graph_param(const kiln_graph *g, int i);
KILN_API bool kiln_param_trainable(const kiln_graph *g, kiln_value p);
/* The parameter's tensor, owned by the graph; NULL when p is not a
 * parameter.  Its values may be written in place (same shape): the next
 * run, step or save reads them (e.g. kiln_trainer_graph's buffers). */
KILN_API kiln_tensor *kiln_param_data(const kiln_graph *g, kiln_value p);
/* A buffer: a parameter the optimizer never updates (trainable=false, as
 * PyTorch's register_buffer), data copied from init.  A duplicate name or a
 * bad tensor is recorded in the graph as kiln_param_at does. */
KILN_API kiln_value kiln_buffer_at(kiln_graph *g, kiln_loc loc, const char *name,
                                   const kiln_tensor *init);
#define kiln_buffer(g, ...) kiln_buffer_at(g, KILN_HERE, __VA_ARGS__)

/* Where the graph's nodes came from, for nodes a client adds to a loaded
 * model so that messages name the model's file: the location of the node
 * defining its first located output, else of its first located node;
 * {NULL, 0} when none has one. */
KILN_API kiln_loc kiln_graph_loc(const kiln_graph *g);
/* Prints the type dt[dims] as kiln_value_type_str does ("f32[N,784]"):
 * dims may be g's symbols (negative handles from kiln_sym). */
KILN_API const char *kiln_type_str(const kiln_graph *g, kiln_dtype dt, int rank,
                                   const int64_t *dims, char *buf, size_t size);

/* The op histogram of the live nodes: one entry per op the graph uses, op
 * being its .kir name ("conv", "add"), most used first, ties by name.
 * Fills out[0..min(cap, n)) and returns n, the number of distinct ops (so
 * cap 0 asks for the size; KILN_OP_KINDS always suffices); *nodes (may be
 * NULL) gets the number of live nodes.  0 for a NULL graph. */
typedef struct kiln_op_count {
	const char *op;
	int count;
} kiln_op_count;
#define KILN_OP_KINDS 256
KILN_API int kiln_graph_op_histogram(const kiln_graph *g, kiln_op_count *out, int cap,
                                     int *nodes);

/* Element i (row-major) of a tensor of any dtype, converted as a cast
 * would: as a double, or as an int64 (saturating). */
KILN_API double kiln_tensor_get(const kiln_tensor *t, int64_t i);
KILN_API int64_t kiln_tensor_get_i64(const kiln_tensor *t, int64_t i);

/* ---- textual IR (.kir) ----------------------------------------------- */

/* Returns a malloc'd string; the caller frees it. */
KILN_API char *kiln_graph_to_kir(const kiln_graph *g);
/* The graph as Graphviz text (`kiln inspect --dot`): a box per node with
 * the parameters it reads, an ellipse per input and output, each edge
 * labelled with its type.  Render with `dot -Tsvg`.  malloc'd; NULL when
 * out of memory. */
KILN_API char *kiln_graph_to_dot(const kiln_graph *g);
KILN_API kiln_status kiln_graph_from_kir(const char *text, const char *filename,
                                         kiln_graph **out, kiln_error *err);
/* FILE.kir plus its weights in FILE.safetensors (when it has parameters). */
KILN_API kiln_status kiln_graph_save(const kiln_graph *g, const char *kir_path,
                                     kiln_error *err);
KILN_API kiln_status kiln_graph_load(const char *kir_path, kiln_graph **out,
                                     kiln_error *err);
KILN_API kiln_status kiln_graph_verify(const kiln_graph *g, kiln_error *err);

/* ---- passes and the interpreter -------------------------------------- */

/* Runs a comma-separated pass list ("fold,cse,dce"); NULL: the default. */
KILN_API kiln_status kiln_graph_optimize(kiln_graph *g, const char *passes, kiln_error *err);

/* The pass registry, in the order `kiln opt --help` lists it: name and a
 * one-line description of pass i (NULL when i is out of range). */
KILN_API int kiln_pass_count(void);
KILN_API const char *kiln_pass_name(int i);
KILN_API const char *kiln_pass_desc(int i);
KILN_API bool kiln_pass_known(const char *name);
/* The pipeline "default" stands for in a list ("infer,fold,cse,dce"). */
KILN_API const char *kiln_pass_default(void);

typedef struct kiln_pass_opts {
	bool verify;            /* verify the graph after every pass (always in
	                           debug builds); a failure is KILN_EVERIFY */
	const char *dump_after; /* a pass name or "all": print the IR after it */
	FILE *dump;             /* where dumps go; NULL: stderr */
} kiln_pass_opts;

/* kiln_graph_optimize with options: list is comma-separated, "default"
 * expands to kiln_pass_default(), "" runs nothing, NULL is "default".
 * Every name is checked before any pass runs, so an unknown one changes
 * nothing (EINVAL, the message lists the known passes); a pass's error is
 * copied into err and left in the graph.  o may be NULL. */
KILN_API kiln_status kiln_graph_run_passes(kiln_graph *g, const char *list,
                                           const kiln_pass_opts *o, kiln_error *err);

/* Runs the graph through the reference interpreter.  inputs are in graph
 * input order; outputs are allocated here and owned by the caller. */
KILN_API kiln_status kiln_graph_run(const kiln_graph *g, kiln_tensor *const *inputs,
                                    int ninputs, kiln_tensor **outputs, int noutputs,
                                    kiln_error *err);

/* ---- ops (the tracing DSL) ------------------------------------------- */
/* Each is a variadic macro passing the caller's location to the _at
 * function, so compound literals such as (int64_t[]){N, 784} work. */

#define KILN_UNARY_OPS(X) X(neg) X(abs) X(exp) X(log) X(sqrt) X(reciprocal) \
	X(relu) X(sigmoid) X(tanh) X(erf) X(not) X(identity) X(floor) X(ceil) X(sin) X(cos) \
	X(softplus) X(hard_sigmoid) X(hard_swish) X(mish) X(softsign) X(elu) X(selu) X(celu) \
	X(thresholded_relu)
#define KILN_BINARY_OPS(X) X(add) X(sub) X(mul) X(div) X(pow) X(max) X(min) \
	X(equal) X(less) X(greater) X(and) X(or)

#define KILN_DECL_UNARY(op) \
	KILN_API kiln_value kiln_##op##_at(kiln_graph *g, kiln_loc loc, kiln_value x);
#define KILN_DECL_BINARY(op) \
	KILN_API kiln_value kiln_##op##_at(kiln_graph *g, kiln_loc loc, kiln_value a, kiln_value b);
KILN_UNARY_OPS(KILN_DECL_UNARY)
KILN_BINARY_OPS(KILN_DECL_BINARY)
#define kiln_neg(g, ...) kiln_neg_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_abs(g, ...) kiln_abs_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_exp(g, ...) kiln_exp_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_log(g, ...) kiln_log_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_sqrt(g, ...) kiln_sqrt_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_reciprocal(g, ...) kiln_reciprocal_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_relu(g, ...) kiln_relu_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_sigmoid(g, ...) kiln_sigmoid_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_tanh(g, ...) kiln_tanh_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_erf(g, ...) kiln_erf_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_not(g, ...) kiln_not_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_identity(g, ...) kiln_identity_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_floor(g, ...) kiln_floor_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_ceil(g, ...) kiln_ceil_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_sin(g, ...) kiln_sin_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_cos(g, ...) kiln_cos_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_softplus(g, ...) kiln_softplus_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_hard_sigmoid(g, ...) kiln_hard_sigmoid_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_hard_swish(g, ...) kiln_hard_swish_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_mish(g, ...) kiln_mish_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_softsign(g, ...) kiln_softsign_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_elu(g, ...) kiln_elu_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_selu(g, ...) kiln_selu_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_celu(g, ...) kiln_celu_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_thresholded_relu(g, ...) kiln_thresholded_relu_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_add(g, ...) kiln_add_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_sub(g, ...) kiln_sub_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_mul(g, ...) kiln_mul_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_div(g, ...) kiln_div_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_pow(g, ...) kiln_pow_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_max(g, ...) kiln_max_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_min(g, ...) kiln_min_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_equal(g, ...) kiln_equal_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_less(g, ...) kiln_less_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_greater(g, ...) kiln_greater_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_and(g, ...) kiln_and_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_or(g, ...) kiln_or_at(g, KILN_HERE, __VA_ARGS__)

KILN_API kiln_value kiln_leaky_relu_at(kiln_graph *g, kiln_loc loc, kiln_value x, double alpha);
KILN_API kiln_value kiln_gelu_at(kiln_graph *g, kiln_loc loc, kiln_value x, bool tanh_approx);
KILN_API kiln_value kiln_clip_at(kiln_graph *g, kiln_loc loc, kiln_value x, double lo, double hi);
KILN_API kiln_value kiln_cast_at(kiln_graph *g, kiln_loc loc, kiln_value x, kiln_dtype to);
KILN_API kiln_value kiln_where_at(kiln_graph *g, kiln_loc loc, kiln_value cond, kiln_value a,
                                  kiln_value b);
#define kiln_leaky_relu(g, ...) kiln_leaky_relu_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_gelu(g, ...) kiln_gelu_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_clip(g, ...) kiln_clip_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_cast(g, ...) kiln_cast_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_where(g, ...) kiln_where_at(g, KILN_HERE, __VA_ARGS__)

/* Reductions over naxes axes (negative counts from the end; 0 axes: all). */
KILN_API kiln_value kiln_reduce_sum_at(kiln_graph *g, kiln_loc loc, kiln_value x, int naxes,
                                       const int64_t *axes, bool keepdims);
KILN_API kiln_value kiln_reduce_mean_at(kiln_graph *g, kiln_loc loc, kiln_value x, int naxes,
                                        const int64_t *axes, bool keepdims);
KILN_API kiln_value kiln_reduce_max_at(kiln_graph *g, kiln_loc loc, kiln_value x, int naxes,
                                       const int64_t *axes, bool keepdims);
KILN_API kiln_value kiln_argmax_at(kiln_graph *g, kiln_loc loc, kiln_value x, int64_t axis,
                                   bool keepdims);
#define kiln_reduce_sum(g, ...) kiln_reduce_sum_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_reduce_mean(g, ...) kiln_reduce_mean_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_reduce_max(g, ...) kiln_reduce_max_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_argmax(g, ...) kiln_argmax_at(g, KILN_HERE, __VA_ARGS__)

KILN_API kiln_value kiln_matmul_at(kiln_graph *g, kiln_loc loc, kiln_value a, kiln_value b);
/* Y = alpha * op(A) op(B) + beta * C; c may be KILN_NONE. */
KILN_API kiln_value kiln_gemm_at(kiln_graph *g, kiln_loc loc, kiln_value a, kiln_value b,
                                 kiln_value c, double alpha, double beta, bool trans_a,
                                 bool trans_b);
#define kiln_matmul(g, ...) kiln_matmul_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_gemm(g, ...) kiln_gemm_at(g, KILN_HERE, __VA_ARGS__)

/* Convolution and pooling geometry, for 1-D and 2-D (nsp spatial dims).
 * Zero fields take ONNX defaults: stride 1, dilation 1, pads 0, group 1. */
typedef struct kiln_conv_opts {
	int64_t kernel[3];
	int64_t stride[3];
	int64_t pad[6]; /* begin for each spatial dim, then end for each */
	int64_t dilation[3];
	int64_t output_padding[3]; /* ConvTranspose only */
	int64_t group;
	bool ceil_mode;         /* pooling only */
	bool count_include_pad; /* AveragePool only */
} kiln_conv_opts;

/* w: [C_out, C_in/group, k...]; b may be KILN_NONE.  Kernel size from w. */
KILN_API kiln_value kiln_conv_at(kiln_graph *g, kiln_loc loc, kiln_value x, kiln_value w,
                                 kiln_value b, const kiln_conv_opts *o);
/* w: [C_in, C_out/group, k...] */
KILN_API kiln_value kiln_conv_transpose_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                           kiln_value w, kiln_value b, const kiln_conv_opts *o);
KILN_API kiln_value kiln_max_pool_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                     const kiln_conv_opts *o);
KILN_API kiln_value kiln_avg_pool_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                     const kiln_conv_opts *o);
KILN_API kiln_value kiln_global_avg_pool_at(kiln_graph *g, kiln_loc loc, kiln_value x);
#define kiln_conv(g, ...) kiln_conv_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_conv_transpose(g, ...) kiln_conv_transpose_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_max_pool(g, ...) kiln_max_pool_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_avg_pool(g, ...) kiln_avg_pool_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_global_avg_pool(g, ...) kiln_global_avg_pool_at(g, KILN_HERE, __VA_ARGS__)

/* Inference-mode batch norm with running statistics. */
KILN_API kiln_value kiln_batch_norm_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                       kiln_value scale, kiln_value bias, kiln_value mean,
                                       kiln_value var, double eps);
/* Normalises over the axes from axis to the end; scale/bias may be NONE. */
KILN_API kiln_value kiln_layer_norm_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                       kiln_value scale, kiln_value bias, int64_t axis,
                                       double eps);
KILN_API kiln_value kiln_softmax_at(kiln_graph *g, kiln_loc loc, kiln_value x, int64_t axis);
KILN_API kiln_value kiln_log_softmax_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                        int64_t axis);
KILN_API kiln_value kiln_dropout_at(kiln_graph *g, kiln_loc loc, kiln_value x, double p,
                                    bool training, uint64_t seed);
#define kiln_batch_norm(g, ...) kiln_batch_norm_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_layer_norm(g, ...) kiln_layer_norm_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_softmax(g, ...) kiln_softmax_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_log_softmax(g, ...) kiln_log_softmax_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_dropout(g, ...) kiln_dropout_at(g, KILN_HERE, __VA_ARGS__)

/* Shape ops.  Reshape dims: -1 infers one dim, 0 copies the input's. */
KILN_API kiln_value kiln_reshape_at(kiln_graph *g, kiln_loc loc, kiln_value x, int rank,
                                    const int64_t *dims);
KILN_API kiln_value kiln_transpose_at(kiln_graph *g, kiln_loc loc, kiln_value x, int rank,
                                      const int64_t *perm);
KILN_API kiln_value kiln_concat_at(kiln_graph *g, kiln_loc loc, int n, const kiln_value *xs,
                                   int64_t axis);
/* Splits into n parts of the given sizes (NULL: equal parts) into out[]. */
KILN_API kiln_status kiln_split_at(kiln_graph *g, kiln_loc loc, kiln_value x, int64_t axis,
                                   int n, const int64_t *sizes, kiln_value *out);
KILN_API kiln_value kiln_slice_at(kiln_graph *g, kiln_loc loc, kiln_value x, int n,
                                  const int64_t *starts, const int64_t *ends,
                                  const int64_t *axes, const int64_t *steps);
KILN_API kiln_value kiln_gather_at(kiln_graph *g, kiln_loc loc, kiln_value x,
                                   kiln_value indices, int64_t axis);
KILN_API kiln_value kiln_flatten_at(kiln_graph *g, kiln_loc loc, kiln_value x, int64_t axis);
KILN_API kiln_value kiln_squeeze_at(kiln_graph *g, kiln_loc loc, kiln_value x, int n,
                                    const int64_t *axes);
KILN_API kiln_value kiln_unsqueeze_at(kiln_graph *g, kiln_loc loc, kiln_value x, int n,
                                      const int64_t *axes);
KILN_API kiln_value kiln_expand_at(kiln_graph *g, kiln_loc loc, kiln_value x, int rank,
                                   const int64_t *dims);
/* pads: begin for each axis, then end for each axis (ONNX order). */
KILN_API kiln_value kiln_pad_at(kiln_graph *g, kiln_loc loc, kiln_value x, int rank,
                                const int64_t *pads, const char *mode, double value);
KILN_API kiln_value kiln_shape_of_at(kiln_graph *g, kiln_loc loc, kiln_value x);
#define kiln_reshape(g, ...) kiln_reshape_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_transpose(g, ...) kiln_transpose_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_concat(g, ...) kiln_concat_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_split(g, ...) kiln_split_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_slice(g, ...) kiln_slice_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_gather(g, ...) kiln_gather_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_flatten(g, ...) kiln_flatten_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_squeeze(g, ...) kiln_squeeze_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_unsqueeze(g, ...) kiln_unsqueeze_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_expand(g, ...) kiln_expand_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_pad(g, ...) kiln_pad_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_shape_of(g, ...) kiln_shape_of_at(g, KILN_HERE, __VA_ARGS__)

/* Losses over logits [N,C,...] and integer targets [N,...]; reduction is
 * "mean", "sum" or "none"; ignore_index < 0 with has_ignore false: none. */
KILN_API kiln_value kiln_softmax_cross_entropy_at(kiln_graph *g, kiln_loc loc,
                                                  kiln_value logits, kiln_value target,
                                                  kiln_value weight, const char *reduction,
                                                  bool has_ignore, int64_t ignore_index);
KILN_API kiln_value kiln_nll_loss_at(kiln_graph *g, kiln_loc loc, kiln_value logp,
                                     kiln_value target, kiln_value weight,
                                     const char *reduction, bool has_ignore,
                                     int64_t ignore_index);
KILN_API kiln_value kiln_mse_loss_at(kiln_graph *g, kiln_loc loc, kiln_value pred,
                                     kiln_value target, const char *reduction);
#define kiln_softmax_cross_entropy(g, ...) kiln_softmax_cross_entropy_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_nll_loss(g, ...) kiln_nll_loss_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_mse_loss(g, ...) kiln_mse_loss_at(g, KILN_HERE, __VA_ARGS__)

/* ---- layers ----------------------------------------------------------- */
/* Each registers its parameters as "<name>.weight" etc., initialised as
 * PyTorch initialises them, from the graph's seeded generator.  Input
 * feature/channel counts are read from x's shape. */

KILN_API kiln_value kiln_linear_at(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                                   int64_t out_features, bool bias);
/* Conv1d/Conv2d: kernel, stride, pad (symmetric), dilation, group in o. */
KILN_API kiln_value kiln_conv1d_at(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                                   int64_t out_channels, const kiln_conv_opts *o, bool bias);
KILN_API kiln_value kiln_conv2d_at(kiln_graph *g, kiln_loc loc, const char *name, kiln_value x,
                                   int64_t out_channels, const kiln_conv_opts *o, bool bias);
/* BatchNorm1d/2d: running stats in eval mode, batch stats in train mode. */
KILN_API kiln_value kiln_batchnorm_at(kiln_graph *g, kiln_loc loc, const char *name,
                                      kiln_value x, double eps, double momentum);
KILN_API kiln_value kiln_layernorm_at(kiln_graph *g, kiln_loc loc, const char *name,
                                      kiln_value x, int nnorm, double eps);
KILN_API kiln_value kiln_embedding_at(kiln_graph *g, kiln_loc loc, const char *name,
                                      kiln_value idx, int64_t num, int64_t dim);
#define kiln_linear(g, ...) kiln_linear_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_conv1d(g, ...) kiln_conv1d_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_conv2d(g, ...) kiln_conv2d_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_batchnorm(g, ...) kiln_batchnorm_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_layernorm(g, ...) kiln_layernorm_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_embedding(g, ...) kiln_embedding_at(g, KILN_HERE, __VA_ARGS__)

/* A Sequential: layers named "<name>.<index>" as torch.nn.Sequential does. */
typedef enum kiln_layer_kind {
	KILN_L_END = 0,    /* terminates a layer list */
	KILN_L_LINEAR,     /* n = out_features */
	KILN_L_CONV1D,     /* n = out_channels, conv = geometry */
	KILN_L_CONV2D,     /* n = out_channels, conv = geometry */
	KILN_L_BATCHNORM,  /* 1d or 2d from the input rank */
	KILN_L_LAYERNORM,  /* over the last dim */
	KILN_L_DROPOUT,    /* p */
	KILN_L_MAXPOOL2D,  /* conv = geometry */
	KILN_L_AVGPOOL2D,  /* conv = geometry */
	KILN_L_ADAPTIVEAVGPOOL2D_1, /* output size 1 */
	KILN_L_FLATTEN,    /* from dim 1 */
	KILN_L_RELU,
	KILN_L_GELU,
	KILN_L_SIGMOID,
	KILN_L_TANH,
	KILN_L_SOFTMAX,    /* over dim 1 */
} kiln_layer_kind;

typedef struct kiln_layer {
	kiln_layer_kind kind;
	int64_t n;
	double p;
	bool no_bias;
	kiln_conv_opts conv;
} kiln_layer;

KILN_API kiln_value kiln_sequential_at(kiln_graph *g, kiln_loc loc, const char *name,
                                       kiln_value x, const kiln_layer *layers);
#define kiln_sequential(g, ...) kiln_sequential_at(g, KILN_HERE, __VA_ARGS__)

/* ---- ONNX ---- */
/* Import of ONNX models (IR versions 3-8, default-domain opsets 7-17) into a
 * graph; see docs/ONNX.md.  Inputs that ONNX passes as constant tensors
 * (Reshape's shape, Slice's starts, ...) must be known at import: from
 * initializers, Constant nodes or foldable shape arithmetic.  When anything
 * is unsupported, the error lists every offending node, one per line
 * ("model.onnx: Op 'name' (domain '', opset 13): what"), not just the first;
 * err->msg is cut at its size with "... and N more", so callers that need
 * the whole list ask for opts->report. */
typedef struct kiln_onnx_opts {
	const char *path; /* name used in messages and node locations */
	const char *dir;  /* folder holding external data; NULL: refuse it */
	char **report;    /* non-NULL: gets a malloc'd list of every problem
	                     (one per line, "" when none); caller frees */
	/* Values for graph inputs, by name, used only where the importer needs
	 * a constant (a Reshape shape or Clip bound fed by a graph input): such
	 * an input is specialised into a parameter holding the value and is no
	 * longer a graph input.  NULL: none. */
	const kiln_tensor_set *specialize;
} kiln_onnx_opts;

/* path: a .onnx file; external data is read relative to its folder. */
KILN_API kiln_status kiln_onnx_import(const char *path, kiln_graph **out, kiln_error *err);
/* A serialized ModelProto in memory; name labels messages; no external data. */
KILN_API kiln_status kiln_onnx_import_mem(const void *data, size_t size, const char *name,
                                          kiln_graph **out, kiln_error *err);
/* data NULL: reads opts->path (external data from its folder unless
 * opts->dir says otherwise). */
KILN_API kiln_status kiln_onnx_import_ex(const void *data, size_t size,
                                         const kiln_onnx_opts *opts, kiln_graph **out,
                                         kiln_error *err);
/* Loads a graph by extension: .onnx through the importer, anything else
 * (.kir) through kiln_graph_load. */
KILN_API kiln_status kiln_graph_load_any(const char *path, kiln_graph **out, kiln_error *err);

/* ---- ONNX export ---- */
/* Writes g as an ONNX model (IR version 8, opset 17) that onnx.checker and
 * ONNX Runtime accept: parameters become initializers (raw_data) under their
 * names, node and value names are kept (unnamed values get "_v<id>"),
 * symbolic dims become dim_param ("N", "N+1"), and attributes that opset 17
 * takes as inputs (Reshape's shape, Slice's starts, Clip's bounds...) become
 * Constant nodes named "<output>_<attr>".  Gelu is written as its Erf (or
 * Tanh) formula, since ONNX has it only from opset 20.  The graph must pass
 * kiln_graph_verify.  The file is written atomically (temporary, fsync,
 * rename). */
KILN_API kiln_status kiln_onnx_export(const kiln_graph *g, const char *path, kiln_error *err);
/* The same model in memory: *data is malloc'd (caller frees), *size bytes. */
KILN_API kiln_status kiln_onnx_export_mem(const kiln_graph *g, void **data, size_t *size,
                                          kiln_error *err);

/* ---- loaded models ---- */
/* A library made by `kiln compile`, opened with dlopen and run through the
 * signature it describes itself.  A kiln_model is one context (its scratch
 * and thread pool): use one per calling thread.  Symbolic dims (the batch
 * "N") are bound from the inputs' shapes, and every input and output is
 * checked before anything runs; errors name the tensor, the expected shape
 * with its symbols and the shape given. */
typedef struct kiln_model kiln_model;

/* One input or output of a loaded model; owned by the model. */
typedef struct kiln_model_io {
	const char *name;
	kiln_dtype dtype;
	int rank;
	int64_t dims[KILN_MAX_RANK];          /* a fixed size, or -1 when symbolic */
	const char *dim_names[KILN_MAX_RANK]; /* NULL for a fixed size, the symbol
	                                         ("N"), or "?" for a size computed
	                                         from symbols */
} kiln_model_io;

KILN_API kiln_status kiln_load(const char *path, kiln_model **out, kiln_error *err);
KILN_API void kiln_model_free(kiln_model *m);
KILN_API const char *kiln_model_name(const kiln_model *m);
/* Threads for this context's parallel loops; 0: KILN_NUM_THREADS, else 1. */
KILN_API kiln_status kiln_model_set_threads(kiln_model *m, int n, kiln_error *err);
/* Where a model's time goes: with on, the counts restart and every later
 * run adds each kernel's wall time (two clock reads per kernel); off stops
 * counting.  kiln_model_kernel gives kernel k's name ("k4_conv": `kiln
 * compile --emit=kir` shows which node it came from) and, into *seconds
 * (may be NULL), its time so far.  NULL for k out of range.  A training
 * library's counts are its eval program's. */
KILN_API kiln_status kiln_model_profile(kiln_model *m, bool on, kiln_error *err);
KILN_API int kiln_model_num_kernels(const kiln_model *m);
KILN_API const char *kiln_model_kernel(const kiln_model *m, int k, double *seconds);
KILN_API int kiln_model_num_inputs(const kiln_model *m);
KILN_API int kiln_model_num_outputs(const kiln_model *m);
/* NULL when i is out of range. */
KILN_API const kiln_model_io *kiln_model_input(const kiln_model *m, int i);
KILN_API const kiln_model_io *kiln_model_output(const kiln_model *m, int i);
KILN_API const char *kiln_model_input_name(const kiln_model *m, int i);
KILN_API const char *kiln_model_output_name(const kiln_model *m, int i);
KILN_API int kiln_model_num_syms(const kiln_model *m);
KILN_API const char *kiln_model_sym_name(const kiln_model *m, int i);
/* Runs on inputs in signature order; outputs are allocated here and owned
 * by the caller (as kiln_graph_run does). */
KILN_API kiln_status kiln_model_run(kiln_model *m, kiln_tensor *const *inputs, int ninputs,
                                    kiln_tensor **outputs, int noutputs, kiln_error *err);
/* The same into outputs the caller allocated at the right shapes (no
 * allocation per run once the context's scratch has grown). */
KILN_API kiln_status kiln_model_run_into(kiln_model *m, kiln_tensor *const *inputs, int ninputs,
                                         kiln_tensor *const *outputs, int noutputs,
                                         kiln_error *err);
/* The shape output i has for these inputs (checked as a run checks them,
 * nothing runs): *rank and dims[0..rank), so a caller can allocate the
 * outputs kiln_model_run_into takes, even where a dim is computed from
 * symbols ("?" in kiln_model_io). */
KILN_API kiln_status kiln_model_output_shape(kiln_model *m, kiln_tensor *const *inputs,
                                            int ninputs, int i, int *rank, int64_t *dims,
                                            kiln_error *err);

/* ---- training ---- */
/* A train step is one graph: forward, loss, gradients (kiln_grad) and the
 * optimizer update, built from a model traced in train mode; see
 * docs/TRAINING.md.  kiln_trainer runs it through the interpreter and owns
 * the parameters, buffers and optimizer state between steps.
 *
 *     kiln_train_opts o = {.optim = KILN_OPT_SGD, .momentum = 0.9,
 *                          .weight_decay = 5e-4, .loss = KILN_LOSS_CROSS_ENTROPY};
 *     kiln_trainer *tr;
 *     kiln_trainer_new(train_model, eval_model, &o, &tr, &err);
 *     for (int64_t s = 0; s < steps; s++)
 *         kiln_trainer_step(tr, x[s], y[s], kiln_sched_lr(&sched, s), &loss, &err);
 *     kiln_trainer_save(tr, "ckpt.safetensors", &err);
 */

typedef enum kiln_optim_kind {
	KILN_OPT_SGD = 0, /* torch.optim.SGD: momentum, dampening, nesterov, weight_decay */
	KILN_OPT_ADAM,    /* torch.optim.Adam: L2 weight_decay added to the gradient */
	KILN_OPT_ADAMW,   /* torch.optim.AdamW: decoupled decay p -= lr*wd*p */
} kiln_optim_kind;

typedef enum kiln_loss_kind {
	KILN_LOSS_OUTPUT = 0,    /* the model computes it: a scalar output named "loss" */
	KILN_LOSS_CROSS_ENTROPY, /* mean softmax cross-entropy, i64 class "target" input */
	KILN_LOSS_MSE,           /* mean squared error, "target" shaped like the output */
} kiln_loss_kind;

/* Hyper-parameters are PyTorch's; a zero beta1, beta2 or eps means PyTorch's
 * default (0.9, 0.999, 1e-8).  weight_decay is literal for every optimizer
 * (AdamW's PyTorch default 0.01 must be passed). */
typedef struct kiln_train_opts {
	kiln_optim_kind optim;
	double momentum, dampening; /* SGD */
	bool nesterov;              /* SGD; needs momentum > 0 and dampening 0 */
	double weight_decay;
	double beta1, beta2, eps;   /* Adam, AdamW */
	bool amsgrad;               /* not supported: refused with a message */
	double clip_norm;           /* > 0: clip_grad_norm_(params, clip_norm) first */
	int accum_steps;            /* k > 1: an update every k-th micro-batch, on the
	                               mean of the k gradients; adds the "apply" input */
	kiln_loss_kind loss;
	const char *output;         /* the output the loss reads; NULL: the first
	                               output whose name does not end in ".next" */
} kiln_train_opts;

/* The step graph.  Inputs: the model's, then "target" (when o->loss adds
 * the loss), "lr" and "step" (scalars of the parameters' dtype; step is the
 * 1-based optimizer step t), and "apply" (bool scalar) when accum_steps > 1.
 * Outputs: "loss", then "<name>.next" for every tensor a step replaces:
 * parameters, BatchNorm buffers, optimizer state ("<p>.momentum_buffer",
 * "<p>.exp_avg", "<p>.exp_avg_sq", "<p>.grad_accum"), which are parameters
 * (trainable=false) of the step graph. */
KILN_API kiln_status kiln_build_train_step(const kiln_graph *model, const kiln_train_opts *o,
                                           kiln_graph **step, kiln_error *err);

typedef struct kiln_trainer kiln_trainer;

/* eval_model (may be NULL) is the same model traced in eval mode; it shares
 * the trainer's parameters and buffers by name. */
KILN_API kiln_status kiln_trainer_new(const kiln_graph *model, const kiln_graph *eval_model,
                                      const kiln_train_opts *o, kiln_trainer **out,
                                      kiln_error *err);
KILN_API void kiln_trainer_free(kiln_trainer *tr);
/* One micro-batch: x feeds the model's first input, y the target; *loss
 * (may be NULL) gets the batch loss.  Dropout draws from a stream fixed by
 * the layer's seed and the micro-batch count, so a resumed run repeats it. */
KILN_API kiln_status kiln_trainer_step(kiln_trainer *tr, const kiln_tensor *x,
                                       const kiln_tensor *y, double lr, double *loss,
                                       kiln_error *err);
/* Runs the eval model on x with the current parameters; *out is the
 * caller's (the model's first output). */
KILN_API kiln_status kiln_trainer_eval(kiln_trainer *tr, const kiln_tensor *x,
                                       kiln_tensor **out, kiln_error *err);
KILN_API int64_t kiln_trainer_steps(const kiln_trainer *tr); /* optimizer steps taken */
KILN_API const kiln_graph *kiln_trainer_graph(const kiln_trainer *tr);
/* A copy of everything a checkpoint holds (caller frees). */
KILN_API kiln_tensor_set *kiln_trainer_state(const kiln_trainer *tr);
/* Checkpoint: safetensors with parameters and buffers under PyTorch's names,
 * optimizer state, i64 scalars "__step__", "__micro__" and "__checksum__"
 * (FNV-1a over every other tensor); written atomically.  load refuses a
 * truncated, corrupt or mismatched file and then changes nothing. */
KILN_API kiln_status kiln_trainer_save(const kiln_trainer *tr, const char *path,
                                       kiln_error *err);
KILN_API kiln_status kiln_trainer_load(kiln_trainer *tr, const char *path, kiln_error *err);

/* The train-mode model of an inference graph (what torch.onnx.export writes
 * in eval mode), for kiln_trainer_new or kiln_compile_train with the
 * inference graph as the eval model: every BatchNormalization reads the
 * batch mean and biased variance, and its running stats update as
 * PyTorch's do ("<running>.next" outputs: momentum_torch = 1 - the ONNX
 * momentum attribute, unbiased variance; "<bn>.num_batches_tracked" counts
 * up when the model has it); every Dropout turns on with its own seed
 * derived from seed and its node.  A training-mode export (BatchNorm
 * training_mode=1, Dropout on) is taken as the inference model
 * kiln_inference_graph_from_train gives.  A graph already traced in train
 * mode (an output named "*.next") or a BatchNorm whose running stats are
 * not named parameters is refused.  *train is the caller's. */
KILN_API kiln_status kiln_train_graph_from_inference(const kiln_graph *inference, uint64_t seed,
                                                     kiln_graph **train, kiln_error *err);
/* The inference model of a training-mode export (torch.onnx.export with
 * training=torch.onnx.TrainingMode.TRAINING): every BatchNormalization with
 * training_mode=1 reads its running stats again (parameters become buffers;
 * its running-stat outputs go, and one that is read is refused) and every
 * Dropout is off (an identity, kept for kiln_train_graph_from_inference to
 * turn back on).  This is the eval model, and the graph to export after
 * training.  Any other graph comes back as a copy.  *nchanged (may be
 * NULL) gets the number of nodes switched; *inference is the caller's. */
KILN_API kiln_status kiln_inference_graph_from_train(const kiln_graph *g, kiln_graph **inference,
                                                     int *nchanged, kiln_error *err);
/* Loads every named parameter of g (weights and BatchNorm buffers) by name
 * from a training checkpoint (kiln_trainer_save, a compiled library's
 * _save): optimizer state, counters and other entries g lacks are ignored;
 * a missing or mis-typed parameter, or a checksum mismatch, is refused and
 * then nothing changes.  Then kiln_onnx_export writes the trained model. */
KILN_API kiln_status kiln_graph_load_trained(kiln_graph *g, const char *path, kiln_error *err);

/* Learning-rate schedules (runtime/sched.c): pure functions of the step,
 * PyTorch's last_epoch (0 for the first optimizer step).  Zero fields take
 * PyTorch's defaults. */
typedef enum kiln_sched_kind {
	KILN_SCHED_CONSTANT = 0, /* base_lr */
	KILN_SCHED_STEP,         /* StepLR(step_size, gamma=0.1) */
	KILN_SCHED_COSINE,       /* CosineAnnealingLR(T_max = t_max, eta_min) */
	KILN_SCHED_ONECYCLE,     /* OneCycleLR(max_lr = base_lr, total_steps, pct_start=0.3,
	                            div_factor=25, final_div_factor=1e4); lr only */
	KILN_SCHED_LINEAR,       /* LinearLR(start_factor=1/3, end_factor=1, total_iters =
	                            total_steps (5)) */
} kiln_sched_kind;

typedef struct kiln_sched {
	kiln_sched_kind kind;
	double base_lr;                   /* the optimizer's lr; OneCycle: max_lr */
	int64_t step_size;                /* STEP */
	double gamma;                     /* STEP */
	int64_t t_max;                    /* COSINE */
	double eta_min;                   /* COSINE */
	int64_t total_steps;              /* ONECYCLE; LINEAR: total_iters */
	double pct_start, div_factor, final_div_factor; /* ONECYCLE */
	bool anneal_linear, three_phase;  /* ONECYCLE */
	double start_factor, end_factor;  /* LINEAR */
	int64_t warmup_steps;             /* > 0: SequentialLR([LinearLR(warmup_start_factor,
	                                     total_iters=warmup_steps), this], [warmup_steps]) */
	double warmup_start_factor;       /* 0: 1/3 */
} kiln_sched;

KILN_API kiln_status kiln_sched_check(const kiln_sched *s, kiln_error *err);
/* NaN for a schedule kiln_sched_check refuses. */
KILN_API double kiln_sched_lr(const kiln_sched *s, int64_t step);

/* ---- compiling ---- */
/* Compiles a graph (on a private copy: the default passes or o->passes,
 * then kernel IR, memory plan, LLVM -O3 for the host CPU) into a shared
 * library at out_path that needs only libc, libm and libpthread, and writes
 * its header beside it (model.so -> model.h): typed entry points
 * <name>_create/_run/_set_threads/_errmsg/_destroy, plus the exported
 * self-describing `kiln_model_desc` that kiln_load reads.  The library is
 * linked with `cc` against the runtime archive (kiln_runtime_archive).
 * Files appear atomically or not at all. */
typedef struct kiln_compile_opts {
	const char *name;     /* C name of the model (entry-point prefix);
	                         NULL: the graph's name, made an identifier */
	const char *cpu;      /* LLVM CPU ("x86-64-v3", "skylake-avx512"); NULL:
	                         $KILN_CPU if set, else the host */
	const char *features; /* "+avx2,-avx512f"...; NULL: $KILN_FEATURES if set,
	                         else the host's when the CPU is the host, else
	                         the cpu's own.  With AVX-512 the kernels prefer
	                         512-bit vectors unless this has +prefer-256-bit */
	const char *emit;     /* NULL or "so": the library; "kir" (kernel IR), "ll"
	                         (LLVM IR after -O3), "asm", "obj": that stage only */
	const char *passes;   /* graph passes as for kiln_graph_optimize; NULL: default */
	const char *conv;     /* f32 convolution algorithm: NULL or "auto" (a cost
	                         model picks per layer), "im2col" (im2col + GEMM
	                         everywhere), "winograd" (Winograd F(4x4,3x3) on
	                         every 2-D 3x3 conv of stride and dilation 1) or
	                         "direct" (the direct kernel on every grouped 2-D
	                         conv that is not depthwise) */
	int jobs;             /* threads LLVM may use; 0: the online CPUs (at most 8).
	                         The library is the same whatever the number */
	struct kiln_compile_times *times; /* NULL, or filled with where the time went */
	const char *cache_dir; /* where compiled GEMM helpers (one object per target and
	                          kiln version, ~0.1 MB) are kept: NULL: $KILN_CACHE_DIR,
	                          else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; "": none */
	const char *target;   /* NULL or "llvm": this CPU's code; "cuda": kernels as CUDA
	                         C for NVIDIA GPUs (emit "cu", "ptx", "cubin"; docs/CUDA.md);
	                         "cuda-emu": those kernels compiled for the host, a .so
	                         for tests */
	const char *cuda_arch; /* "sm_80,sm_90" (NULL: that): what NVRTC compiles for */
	const char *cuda_math; /* NULL or "f32": strict f32 (no fast math, no FMA
	                          contraction); "fast": -use_fast_math */
} kiln_compile_opts;

/* Where a kiln_compile's time went (wall clock, seconds).  LLVM works on
 * the library in parts on opts.jobs threads: optimize and codegen add up
 * every part's time, llvm the wall time of both. */
typedef struct kiln_compile_times {
	double total;
	double lower;     /* graph passes, lowering to kernel IR, memory plan */
	double emit;      /* kernel IR to LLVM IR */
	double llvm;      /* LLVM's O3 and object emission, all parts, wall */
	double optimize;  /* LLVM's O3 pipeline, summed over parts */
	double codegen;   /* LLVM's object emission, summed over parts */
	double link;      /* the weights' object and the system linker */
	int parts, jobs;  /* LLVM modules, and threads that compiled them */
	int cached;       /* parts taken from the cache (cache_dir) instead */
	unsigned long long weights_bytes; /* constant bytes embedded */
} kiln_compile_times;

/* opts may be NULL (all defaults).  Errors: EINVAL (bad option, unknown CPU
 * or feature), EUNSUPPORTED (an op or dtype without a lowering, naming the
 * node), EIO (writing or linking failed). */
KILN_API kiln_status kiln_compile(const kiln_graph *g, const char *out_path,
                                  const kiln_compile_opts *opts, kiln_error *err);
/* The runtime archive (libkilnrt_gen.a: model driver, thread pool) that
 * kiln_compile links into every library, as an absolute path into buf:
 * $KILN_RT_LIB when set and not empty; else the first that exists of
 * lib/kiln/ beside the running program's bin/ folder, lib/kiln/ beside
 * libkiln.so, the build tree's (when running from it), the configured
 * install prefix's, the build tree's.  EIO, naming every path tried, when
 * there is none: then kiln_compile fails the same way before any work. */
KILN_API kiln_status kiln_runtime_archive(char *buf, size_t size, kiln_error *err);

/* ---- int8 quantization ---- */
/* Post-training quantization (docs/QUANTIZATION.md): calibrates g on
 * sample inputs by running it compiled (kiln_compile, to a temporary
 * library) and returns the QDQ graph ONNX Runtime's quantize_static would
 * write: u8 activations with one scale and zero point, s8 symmetric
 * weights with a scale per output channel, i32 biases, around every Conv,
 * MatMul, Gemm (fixed f32 weights), residual Add and MaxPool; a Relu or
 * Clip after a layer is absorbed into its output's range.  kiln_compile
 * runs the result on 8-bit kernels; kiln_onnx_export writes it for ORT.
 *
 * calib[i] feeds graph input i: either a stack of samples along axis 0 of
 * the input's own rank (batched o->batch at a time when dim 0 is a symbol,
 * else dim 0 at a time) or one more axis in front, each slice a whole
 * input.  Every sample is run.  g must be an inference graph. */
typedef enum kiln_calib_method {
	KILN_CALIB_MINMAX = 0, /* the range seen */
	KILN_CALIB_PERCENTILE, /* the range holding o->percentile % of values on
	                          each side (default 99.999) */
	KILN_CALIB_ENTROPY,    /* the clip threshold that minimizes the KL
	                          divergence of the 8-bit histogram from the f32
	                          one (TensorRT's method, 2048 bins) */
} kiln_calib_method;

typedef struct kiln_quant_opts {
	kiln_calib_method method;
	double percentile;          /* KILN_CALIB_PERCENTILE; 0: 99.999 */
	const char *const *keep_float; /* node names or ONNX op types ("Gemm")
	                               left in f32 */
	int nkeep_float;
	bool per_tensor_weights;    /* one scale per weight instead of per channel */
	int64_t batch;              /* samples per calibration run for a symbolic
	                               batch dim; 0: 16 */
	int threads;                /* for the calibration runs; 0: 1 */
	const kiln_compile_opts *compile; /* how the calibration libraries are
	                                     compiled (cpu, features); NULL: host */
} kiln_quant_opts;

/* One quantized layer, measured on the calibration set against f32. */
typedef struct kiln_quant_layer {
	const char *name;    /* the node's name, or "<op>#<k>" */
	const char *op;      /* ONNX op type */
	bool quantized;      /* its result leaves as u8 (else f32) */
	double scale;        /* quantized: its result's u8 scale and zero point */
	int zero_point;
	double lo, hi;       /* the calibrated range (quantized) */
	double saturation;   /* share of f32 results outside the u8 range */
	double rel_error;    /* ||int8 - f32|| / ||f32|| of its result, where the
	                        int8 model's result is taken after DQ */
	double max_error;    /* max |int8 - f32|: in steps of scale when
	                        quantized, absolute otherwise */
} kiln_quant_layer;

/* A graph output, int8 model against f32. */
typedef struct kiln_quant_output {
	const char *name;
	double rel_error, cosine;
	double top1;         /* rank-2 [N, C] outputs: share of rows whose argmax
	                        agrees; NaN otherwise */
} kiln_quant_output;

typedef struct kiln_quant_report {
	int64_t samples;
	kiln_calib_method method;
	int nlayers, noutputs;
	kiln_quant_layer *layers;
	kiln_quant_output *outputs;
} kiln_quant_report;

/* *out (and *report, when report is not NULL) are the caller's.  Errors:
 * EINVAL (a training graph, an already quantized one, nothing to quantize,
 * calibration data that does not fit an input or is not finite, a value
 * that overflows), EUNSUPPORTED and EIO from compiling. */
KILN_API kiln_status kiln_quantize(const kiln_graph *g, kiln_tensor *const *calib, int ncalib,
                                   const kiln_quant_opts *o, kiln_graph **out,
                                   kiln_quant_report **report, kiln_error *err);
KILN_API void kiln_quant_report_free(kiln_quant_report *r);

/* ---- autodiff and losses ---- */
/* Reverse-mode gradients (docs/TRAINING.md): appends to g the backward graph
 * of loss (a float value with one element) with respect to wrt[0..nwrt)
 * and stores each gradient in grads[i]: an ordinary value of wrt[i]'s type,
 * or KILN_NONE when loss does not depend on wrt[i].  Only nodes on a path
 * from a wrt value to the loss get backward nodes.  On failure the graph is
 * left as it was, with the error recorded. */
KILN_API kiln_status kiln_grad_at(kiln_graph *g, kiln_loc loc, kiln_value loss, int nwrt,
                                  const kiln_value *wrt, kiln_value *grads);
/* The same for every trainable float parameter, in creation (state_dict)
 * order: *count gets their number, params[i] the parameter and grads[i] its
 * gradient, named "<param>.grad" (KILN_NONE off the loss path).  With cap
 * below the count nothing is built and EINVAL says how many there are. */
KILN_API kiln_status kiln_grad_params_at(kiln_graph *g, kiln_loc loc, kiln_value loss, int cap,
                                         kiln_value *params, kiln_value *grads, int *count);
#define kiln_grad(g, ...) kiln_grad_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_grad_params(g, ...) kiln_grad_params_at(g, KILN_HERE, __VA_ARGS__)

/* PyTorch's losses (reduction "mean", "sum" or "none"; NULL: "mean").
 * cross_entropy: logits [N,C,d...], integer targets [N,d...]; weight [C] or
 * KILN_NONE; targets equal to ignore_index (PyTorch's default -100) count
 * for nothing; label_smoothing in [0, 1] as F.cross_entropy defines it.
 * NLL over log-probabilities is kiln_nll_loss above. */
KILN_API kiln_value kiln_cross_entropy_at(kiln_graph *g, kiln_loc loc, kiln_value logits,
                                          kiln_value target, kiln_value weight,
                                          const char *reduction, int64_t ignore_index,
                                          double label_smoothing);
KILN_API kiln_value kiln_l1_loss_at(kiln_graph *g, kiln_loc loc, kiln_value pred,
                                    kiln_value target, const char *reduction);
/* 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta; beta 0 is L1. */
KILN_API kiln_value kiln_smooth_l1_loss_at(kiln_graph *g, kiln_loc loc, kiln_value pred,
                                           kiln_value target, const char *reduction,
                                           double beta);
/* Binary cross-entropy on logits, stable for any logit; weight (broadcast
 * to the loss) and pos_weight (broadcast over the last dim) may be NONE. */
KILN_API kiln_value kiln_bce_with_logits_at(kiln_graph *g, kiln_loc loc, kiln_value logits,
                                            kiln_value target, kiln_value weight,
                                            kiln_value pos_weight, const char *reduction);
#define kiln_cross_entropy(g, ...) kiln_cross_entropy_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_l1_loss(g, ...) kiln_l1_loss_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_smooth_l1_loss(g, ...) kiln_smooth_l1_loss_at(g, KILN_HERE, __VA_ARGS__)
#define kiln_bce_with_logits(g, ...) kiln_bce_with_logits_at(g, KILN_HERE, __VA_ARGS__)

/* ---- compiled training ---- */
/* A training library: the step kiln_build_train_step(model, t) builds and
 * eval_model (the same model traced in eval mode, required) compiled into
 * one .so whose context owns the parameters, buffers and optimizer state,
 * initialised from the model's weights at create (docs/TRAINING.md):
 *
 *     kiln_compile_train(train, eval, &o, 16, "step.so", NULL, &err);
 *     // in C, through step.h:
 *     step_ctx *c = step_create();
 *     step_train_step(c, x, y, lr, &loss);      // float *x, int64_t *y
 *     step_eval_step(c, N, x, logits);
 *     step_save(c, "ckpt.safetensors");         // kiln_trainer's format
 *
 * lr is an argument of every step (schedules stay with the caller); the
 * step count lives in the context and feeds the graph's "step" input.  The
 * entry points are <name>_create/_destroy/_set_threads/_errmsg,
 * <name>_train_step(ctx, syms..., data inputs..., double lr, T *loss),
 * <name>_eval_step(ctx, syms..., inputs..., outputs...), <name>_steps,
 * <name>_save and <name>_load (ints are kiln_status).  batch > 0 fixes
 * dim 0 of every model input whose dim 0 is a symbol (the batch) in the
 * train step (the eval program keeps it symbolic); a CNN needs it, since a
 * conv's weight gradient reduces over the batch as its channel axis, which
 * the lowering needs fixed.  batch 0 keeps the symbols as arguments of
 * _train_step (fine for an MLP).  Parameters are
 * never folded into constants (o->passes must not name bnfold).
 * Training-mode Dropout draws kiln_trainer's masks: the context feeds the
 * micro-batch count to the step (an input "__micro__" that is not an
 * argument of _train_step).  For an inference model file, pass
 * kiln_train_graph_from_inference's graph as model and the file's as
 * eval_model (what `kiln compile --train` does). */
KILN_API kiln_status kiln_compile_train(const kiln_graph *model, const kiln_graph *eval_model,
                                        const kiln_train_opts *t, int64_t batch,
                                        const char *out_path, const kiln_compile_opts *o,
                                        kiln_error *err);

/* A training library opened with kiln_load: kiln_model_run and the
 * introspection calls describe its eval program, run on the current state;
 * these mirror kiln_trainer_step/_steps/_state/_save/_load.  On a library
 * that is not trainable they return EINVAL (NULL, 0). */
KILN_API bool kiln_model_trainable(const kiln_model *m);
/* One micro-batch: x, and y (the target) when the step has one. */
KILN_API kiln_status kiln_model_train_step(kiln_model *m, const kiln_tensor *x,
                                           const kiln_tensor *y, double lr, double *loss,
                                           kiln_error *err);
/* The split step, for data-parallel training (docs/DISTRIBUTED.md): the
 * same step as kiln_model_train_step, stopped between the gradients and the
 * optimizer.  Gradients lie in buckets (the last layer's first, up to
 * kiln_model_set_bucket_bytes each, 25 MB by default as DDP's; one dtype per
 * bucket); as soon as backward has finished a bucket, ready(ud, bucket,
 * data, n, dtype) gets its n elements, contiguous, to read and change in
 * place (start an all-reduce and return, so communication overlaps the rest
 * of backward); before the optimizer's first kernel, wait(ud) must leave
 * every bucket final.  Buckets come in the same order on every call.  Either
 * function may be NULL; a status other than KILN_OK ends the step with
 * nothing changed.  A NULL hook is kiln_model_train_step.  EUNSUPPORTED for
 * a library that cannot split (compiled by an older kiln). */
typedef struct kiln_grad_hook {
	kiln_status (*ready)(void *ud, int bucket, void *data, int64_t n, kiln_dtype dtype);
	kiln_status (*wait)(void *ud);
	void *ud;
	/* a library with synchronised BatchNorm (driver_train_graph_sync_bn):
	 * replace data's n elements by their sum over ranks, now (blocking);
	 * called for each BatchNorm's batch sums in the forward and for their
	 * gradients in backward.  Required for such a library, unused otherwise. */
	kiln_status (*sum)(void *ud, void *data, int64_t n, kiln_dtype dtype);
} kiln_grad_hook;
KILN_API kiln_status kiln_model_train_step_hook(kiln_model *m, const kiln_tensor *x,
                                                const kiln_tensor *y, double lr,
                                                const kiln_grad_hook *hook, double *loss,
                                                kiln_error *err);
/* ---- data-parallel communication (docs/DISTRIBUTED.md) ----
 * One small interface over a distributed engine: MPI today (kiln_comm_mpi_open,
 * in the kiln_mpi library, built where MPI is found), NCCL later behind the
 * same functions.  Every call is collective (all ranks, same order) except
 * rank/size/errmsg.  Waits give up after the timeout given at open with
 * KILN_EIO and a message naming the ranks that did not arrive; a rank that
 * gets it (or fails otherwise) should call abandon instead of close and then
 * exit with an error: close finalizes, which a hung peer never lets finish,
 * while the launcher (mpirun) ends the other ranks once one exits so.
 *
 *     kiln_comm *c;  kiln_comm_mpi_open(&argc, &argv, 60, &c, &err);
 *     kiln_grad_hook h = kiln_comm_grad_hook(c);     // all-reduce mean per bucket
 *     kiln_model_train_step_hook(m, &x, &y, lr, &h, &loss, &err);
 *     c->close(c); */
typedef struct kiln_comm kiln_comm;
struct kiln_comm {
	int rank, size;
	/* start an in-place all-reduce mean of n elements of dt at buf (the
	 * buffer must stay untouched until wait) */
	kiln_status (*allreduce_mean_start)(kiln_comm *c, void *buf, int64_t n, kiln_dtype dt);
	/* every started all-reduce finished; step names the step in messages */
	kiln_status (*wait)(kiln_comm *c, int64_t step);
	/* blocking in-place all-reduce sum and mean */
	kiln_status (*allreduce_sum)(kiln_comm *c, void *buf, int64_t n, kiln_dtype dt);
	kiln_status (*allreduce_mean)(kiln_comm *c, void *buf, int64_t n, kiln_dtype dt);
	kiln_status (*broadcast)(kiln_comm *c, void *buf, int64_t bytes, int root);
	kiln_status (*barrier)(kiln_comm *c);
	const char *(*errmsg)(const kiln_comm *c);
	void (*close)(kiln_comm *c);           /* collective: finalizes, frees */
	void (*abandon)(kiln_comm *c);         /* after a failure: frees c, leaves
	                                          MPI unfinalized; not collective */
	int64_t step;                          /* kiln_comm_grad_hook's wait passes it */
};
/* A gradient hook that all-reduces (mean) each bucket as it is ready and
 * waits before the optimizer: DDP's default hook. */
KILN_API kiln_grad_hook kiln_comm_grad_hook(kiln_comm *c);
/* MPI: MPI_Init_thread (argc, argv may be NULL), MPI_COMM_WORLD; waits give
 * up after timeout_s (> 0).  Defined in libkiln_mpi only. */
KILN_API kiln_status kiln_comm_mpi_open(int *argc, char ***argv, double timeout_s,
                                        kiln_comm **out, kiln_error *err);

/* Regroups the gradients into buckets of at most bytes (>= 1; a gradient
 * larger than that is a bucket of its own). */
KILN_API kiln_status kiln_model_set_bucket_bytes(kiln_model *m, int64_t bytes, kiln_error *err);
KILN_API int kiln_model_num_buckets(const kiln_model *m);
KILN_API int64_t kiln_model_steps(const kiln_model *m);
KILN_API kiln_tensor_set *kiln_model_state(const kiln_model *m); /* caller frees */
KILN_API kiln_status kiln_model_save(kiln_model *m, const char *path, kiln_error *err);
KILN_API kiln_status kiln_model_load(kiln_model *m, const char *path, kiln_error *err);
/* Replaces the whole state and the counters with s, a set as
 * kiln_model_state returns it (every state tensor, "__step__", "__micro__";
 * "__checksum__" optional, checked when present): refused as kiln_model_load
 * refuses a file, and then nothing changes.  kiln train uses it to start
 * from the model's weights and to hand the state between two libraries. */
KILN_API kiln_status kiln_model_set_state(kiln_model *m, const kiln_tensor_set *s,
                                          kiln_error *err);
/* *out is state tensor name over the context's own storage, no copy: valid
 * until the model is freed; writing through it changes the state. */
KILN_API kiln_status kiln_model_state_view(kiln_model *m, const char *name, kiln_tensor *out,
                                           kiln_error *err);
/* The train step's data inputs (x, then the target when it has one), as
 * kiln_model_input describes the eval program's; 0 and NULL for a library
 * that does not train. */
KILN_API int kiln_model_num_train_inputs(const kiln_model *m);
KILN_API const kiln_model_io *kiln_model_train_input(const kiln_model *m, int i);

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */
