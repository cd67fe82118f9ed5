/*
 * lower.h: helpers shared by lower.c (the driver, elementwise, reductions,
 * data movement, fusion) and lower_nn.c (linear algebra, convolution,
 * pooling, normalisation, losses), plus cg_lower_ex, the lowering with
 * options, for drivers (driver/compile.c) and tests.
 */
#ifndef KILN_CG_LOWER_H
#define KILN_CG_LOWER_H

#include "codegen/codegen.h"

/* Loops doing at least this many element operations are marked
 * CG_PARALLEL (below it a pool dispatch costs more than it saves), each
 * symbol counted as CG_PAR_SYM: a symbolic batch usually means more than
 * one, and the pool runs a short range inline anyway. */
#define CG_PAR_WORK 32768
#define CG_PAR_SYM 8

/* Most distinct buffers one fused elementwise kernel reads. */
#define CG_FUSE_MAX 8

/* Lowering choices; a NULL or zeroed struct is what cg_lower does. */
typedef struct cg_lower_opts {
	/* Elementwise fusion: a chain of elementwise nodes whose intermediate
	 * results have one reader, the same shape as that reader's result and
	 * are no graph output becomes one kernel (see lower.c); the
	 * intermediates get no buffer.  Off in cg_lower, which keeps one
	 * kernel per node; kiln_compile wants it on. */
	bool fuse;
	/* The algorithm for f32 convolutions (cg_conv_algo): AUTO, or one
	 * forced wherever it applies (tests run each on every conv case). */
	cg_conv_algo conv;
	/* The parameters are state a training library replaces between runs:
	 * their buffers get no data, so no lowering bakes their values into
	 * the code (Winograd's filter transform, packed int8 weights) where a
	 * later step would read the first step's weights.  The caller turns
	 * them into CG_BUF_STATE afterwards (driver/compile.c's mark_state). */
	bool mutable_params;
	/* The element operations from which a nest's outer loop is
	 * CG_PARALLEL (0: CG_PAR_WORK, threads of a CPU); a GPU target wants
	 * every nest on its grid (1). */
	int64_t par_work;
	/* The panels cg_prepack will give constant GEMM operands after
	 * lowering (the backend's gemm_panel), or NULL when it will not run:
	 * a layout only the target's panel GEMM writes (cg_buf.block) is
	 * chosen only where that GEMM will compute it. */
	const cg_panels *panels;
} cg_lower_opts;

/* cg_lower with options (o may be NULL); same contract (codegen.h). */
kiln_status cg_lower_ex(const kiln_graph *g, const cg_lower_opts *o, cg_module **out,
                        kiln_error *err);

/* "file:line: Op 'name': " + text into err; returns code. */
kiln_status cg_lower_fail(const cg_module *m, const ir_node *n, kiln_error *err,
                          kiln_status code, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* A kernel for node n named k<index>_<kir mnemonic>; NULL on ENOMEM. */
cg_kernel *cg_lower_kernel(cg_module *m, const ir_node *n);
/* CG_CHECK of v in [lo, hi) whose message names n as cg_lower_fail does:
 * "<file>:<line>: <Op> '<name>': <what> <v> out of range [lo, hi)". */
cg_stmt *cg_lower_check(cg_module *m, const ir_node *n, const char *what, cg_expr *v,
                        cg_expr *lo, cg_expr *hi);
/* Appends to k's body a check that each of the count elements of integer
 * buffer b is in [lo, hi) (or equals *ignore, when not NULL), or with lo
 * and hi NULL is not 0, reporting the first that is not by cg_lower_check.  A branch-free min/max pass (it
 * vectorizes) decides; only when it finds one out of range does a second
 * loop check them in order, so valid indices cost one streaming pass. */
void cg_lower_check_all(cg_module *m, cg_kernel *k, const ir_node *n, const char *what,
                        int b, cg_expr *count, cg_expr *lo, cg_expr *hi, const int64_t *ignore);
/* A kernel-private TEMP buffer (value 0) of numel elements. */
int cg_lower_scratch(cg_module *m, kiln_dtype dt, cg_expr *numel);
const ir_type *cg_btype(const cg_module *m, int buf);
/* Product of dims [from, to) of t as an i64 expression. */
cg_expr *cg_prod(cg_module *m, const ir_type *t, int from, int to);
/* Row-major stride of dim d of t. */
cg_expr *cg_stride(cg_module *m, const ir_type *t, int d);
/* The dtype arithmetic happens in: f16 and bf16 compute in f32. */
kiln_dtype cg_ctype(kiln_dtype dt);
/* buf[idx] converted to its compute dtype; a store converting back. */
cg_expr *cg_ld(cg_module *m, int buf, cg_expr *idx);
cg_stmt *cg_st(cg_module *m, int buf, cg_expr *idx, cg_expr *v);
/* CG_PARALLEL when work (an element count estimate) is large enough. */
uint32_t cg_par(cg_module *m, cg_expr *work);
/* A loop `for var in 0..extent` whose body is a fresh block (*body);
 * *iv is the loop variable. */
cg_stmt *cg_loop(cg_module *m, cg_kernel *k, cg_expr *extent, uint32_t hints, cg_expr **iv,
                 cg_stmt **body);
/* Appends a nest over ext[0..n) (outermost first) to parent: iv[] gets the
 * variables, the innermost block is returned (parent itself when n == 0);
 * hints[d] per loop. */
cg_stmt *cg_nest(cg_module *m, cg_kernel *k, cg_stmt *parent, int n, cg_expr *const *ext,
                 const uint32_t *hints, cg_expr **iv);
/* A kernel copying buffer src to dst element by element (same dtype). */
kiln_status cg_lower_copy(cg_module *m, const ir_node *n, int src, int dst, kiln_error *err);
/* v clamped to [0, hi - 1]: index arithmetic that must not leave a buffer. */
cg_expr *cg_clamp(cg_module *m, cg_expr *v, cg_expr *hi);
/* Local scalar: a fresh variable of the kernel assigned v in block. */
cg_expr *cg_local(cg_module *m, cg_kernel *k, cg_stmt *block, kiln_dtype dt, cg_expr *v);
/* Re-assigns local var (from cg_local) in block. */
void cg_set(cg_module *m, cg_stmt *block, cg_expr *var, cg_expr *v);

/* lower_wino.c: Winograd F(4x4, 3x3).  _ok: it applies to conv n (2-D,
 * 3x3, stride and dilation 1, group 1, f32); cg_lower_conv_winograd lowers it into output y. */
bool cg_conv_winograd_ok(const cg_module *m, const ir_node *n, const int *in,
                         const ir_conv_geom *g);
/* The cost model: the smallest batch from which Winograd pays for conv n,
 * -1 for none up to 16. */
int64_t cg_conv_winograd_batch(const cg_module *m, const ir_node *n, const int *in,
                               const ir_conv_geom *g);
/* weights_at_run: transform even a constant filter at run time (the
 * Winograd half of a choice by batch, so the library does not carry both
 * the filter and its 4x larger transform). */
kiln_status cg_lower_conv_winograd(cg_module *m, const ir_node *n, const int *in, int y,
                                   const ir_conv_geom *g, bool weights_at_run, kiln_error *err);

/* lower_nn.c */
/* A constant buffer holding t (an arena tensor, cg_lower_arena_tensor),
 * named "<buffer of's name>.sfx"; -1 when out of memory. */
int cg_lower_const_buf(cg_module *m, kiln_tensor *t, int of, const char *sfx);
kiln_tensor *cg_lower_arena_tensor(cg_module *m, kiln_dtype dt, int64_t n);
kiln_status cg_lower_matmul(cg_module *m, const ir_node *n, const int *in, const int *out,
                            kiln_error *err);
kiln_status cg_lower_gemm(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err);
kiln_status cg_lower_conv(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err);
kiln_status cg_lower_conv_transpose(cg_module *m, const ir_node *n, const int *in,
                                    const int *out, kiln_error *err);
/* MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv: i32 sums of
 * (x - x_zp)(w - w_zp) as loop nests, requantized (QLinear*) in f64 as
 * the interpreter does. */
kiln_status cg_lower_matmul_integer(cg_module *m, const ir_node *n, const int *in,
                                    const int *out, kiln_error *err);
kiln_status cg_lower_qlinear_matmul(cg_module *m, const ir_node *n, const int *in,
                                    const int *out, kiln_error *err);
kiln_status cg_lower_conv_integer(cg_module *m, const ir_node *n, const int *in, const int *out,
                                  kiln_error *err);
kiln_status cg_lower_qlinear_conv(cg_module *m, const ir_node *n, const int *in, const int *out,
                                  kiln_error *err);
kiln_status cg_lower_pool(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err);
/* lower_resize.c */
kiln_status cg_lower_resize(cg_module *m, const ir_node *n, const int *in, const int *out,
                            kiln_error *err);
kiln_status cg_lower_grid_sample(cg_module *m, const ir_node *n, const int *in, const int *out,
                                 kiln_error *err);
kiln_status cg_lower_global_avg_pool(cg_module *m, const ir_node *n, const int *in,
                                     const int *out, kiln_error *err);
kiln_status cg_lower_batch_norm(cg_module *m, const ir_node *n, const int *in, const int *out,
                                kiln_error *err);
/* A tensor in n parts along its channels (dim 1): part p is buffer buf[p],
 * holding channels [at[p], at[p] + len[p]) of the C (a Concat on axis 1
 * that lower.c leaves unmaterialized, its only reader taking the parts
 * where they lie).  n = 1 with buf[0] the whole tensor is the plain case. */
enum { CG_PARTS_MAX = 64 };
typedef struct cg_parts {
	int n;
	int buf[CG_PARTS_MAX];
	int64_t at[CG_PARTS_MAX], len[CG_PARTS_MAX];
	cg_expr *C;
} cg_parts;
/* An inference BatchNormalization of x in parts (DenseNet's dense layers:
 * concat -> BN -> Relu).  in[0] is not read. */
kiln_status cg_lower_bn_parts(cg_module *m, const ir_node *n, const cg_parts *x,
                              const int *in, const int *out, kiln_error *err);
/* Whether conv n is f32, ungrouped, 1x1 at stride 1 with no padding, so
 * that it can read x in nparts parts: y = sum over parts of W[:, part] x
 * part, one GEMM per part accumulating into y (cg_lower_conv_parts; in[0]
 * not read), and whether that pays (few output channels for the parts).
 * SqueezeNet's fire modules: expand 1x1 and 3x3 -> concat -> the next
 * squeeze 1x1. */
bool cg_conv_parts_ok(const kiln_graph *g, const ir_node *n, int nparts);
kiln_status cg_lower_conv_parts(cg_module *m, const ir_node *n, const cg_parts *x,
                                const int *in, const int *out, kiln_error *err);
/* Whether 1x1 conv n (its input buffers in[]) can write y with the
 * channels in blocks (cg_buf.block): f32, a constant W, and m->panels has
 * a GEMM writing such a C (cg_panels.c_block) that cg_prepack will give
 * these weights.  Whether its reader takes them is lower.c's question
 * (blocked_chain). */
bool cg_conv_blocked_ok(const cg_module *m, const kiln_graph *g, const ir_node *n, const int *in);
/* Whether grouped conv n (its input buffers in[]) is one conv_grouped
 * computes with a group's output channels in the lanes (whole vectors of
 * them, a constant W), which can then store y in channel blocks of that
 * many (m->panels.c_block) for a 1x1 conv reading them. */
bool cg_grouped_blocked_ok(const cg_module *m, const kiln_graph *g, const ir_node *n,
                           const int *in);
/* Whether conv u is a depthwise one that reads its input in[0] in blocks
 * of cb channels (dw_blocked), and reads it only there; such a conv can
 * also write its result so.  both: the shapes that pay only when it does
 * both (rows up to DW_BLOCK_W2 wide: a 3x3 conv at 14x14, which the
 * planar form computes faster when dw_blocked transposes). */
bool cg_dw_blocked_ok(const cg_module *m, const kiln_graph *g, const ir_node *u, int64_t cb,
                      bool both);
/* Whether depthwise conv u (5x5 taps or more, or stride 2), its input in
 * blocks of cb channels, reads them in place (most of its outputs' taps
 * inside the input) at rows up to 28 wide, past dw_blocked's own widths:
 * it then takes blocks, and writes its result so too when a 1x1 conv
 * reads it. */
bool cg_dw_direct_ok(const cg_module *m, const kiln_graph *g, const ir_node *u, int64_t cb);
/* Whether 1x1 conv u reads its input in[0] (only there) in blocks of cb
 * channels (cg_gemm.b_block): as cg_conv_blocked_ok, stride 1; w is its
 * weight's buffer (-1: none yet, then not). */
bool cg_conv_reads_blocked_ok(const cg_module *m, const kiln_graph *g, const ir_node *u, int w,
                              int64_t cb);
kiln_status cg_lower_layer_norm(cg_module *m, const ir_node *n, const int *in, const int *out,
                                kiln_error *err);
kiln_status cg_lower_softmax(cg_module *m, const ir_node *n, const int *in, const int *out,
                             kiln_error *err);
/* A graph input of this name (i64 scalar: a training library's micro-batch
 * count, added by kiln_compile_train) reseeds every training-mode Dropout
 * per run as kiln_trainer does: the seed becomes mix64(seed ^ mix64(count)). */
#define CG_MICRO_INPUT "__micro__"
kiln_status cg_lower_dropout(cg_module *m, const ir_node *n, const int *in, const int *out,
                             kiln_error *err);
kiln_status cg_lower_loss(cg_module *m, const ir_node *n, const int *in, const int *out,
                          kiln_error *err);

/* lower_rnn.c: RNN, GRU and LSTM, one kernel looping over the run's T */
kiln_status cg_lower_rnn(cg_module *m, const ir_node *n, const int *in, const int *out,
                         kiln_error *err);

#endif /* KILN_CG_LOWER_H */
