/*
 * passes.h: graph-to-graph passes and the pipeline that runs them, private
 * to the library; one section per file.
 *
 * Every pass is one function with one signature, exported by its own file
 * (QBE's layout), so the pipeline is a table from name to function and a
 * pass can be run alone from `kiln opt --passes=NAME`.  A pass reads and
 * rewrites the graph in place, reports failures through ir_errorf (so the
 * graph's sticky error names the node), and leaves a valid graph behind: a
 * schedule in SSA order, use lists intact, dead nodes compacted away.  Value
 * ids held outside the graph are invalid after any pass (ir_compact
 * renumbers them); graph inputs, outputs and parameters keep their names.
 */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include <stdbool.h>
#include <stdio.h>

#include "ir/ir.h"

/* Options shared by every pass; a zeroed struct means the defaults. */
typedef struct pass_opts {
	bool verify;            /* ir_verify after each pass (always with KILN_DEBUG) */
	const char *dump_after; /* pass name, or "all": print the IR after it */
	FILE *dump;             /* where dumps go (NULL: stderr) */
	int64_t fold_max_elems; /* fold: largest tensor it creates (0: 1M elements) */
} pass_opts;

typedef kiln_status (*pass_fn)(kiln_graph *g, const pass_opts *o);

/* ---- pipeline.c --------------------------------------------------------- */

#define PASS_DEFAULT "infer,fold,cse,dce"

typedef struct pass_info {
	const char *name;
	pass_fn run;
	const char *desc; /* one line, for `kiln opt --help` */
} pass_info;

/* The registry, in the order `kiln opt --help` lists it. */
extern const pass_info pass_table[];
extern const int pass_count;
const pass_info *pass_find(const char *name); /* NULL if unknown */
/* Runs a comma-separated list ("default" expands to PASS_DEFAULT; "" runs
 * nothing).  Every name is checked before any pass runs, so an unknown one
 * changes nothing; its message lists the known passes.  A pass error or a
 * verifier failure is copied into err and left in the graph. */
kiln_status pass_run_list(kiln_graph *g, const char *list, const pass_opts *o,
                          kiln_error *err);

/* ---- rewrite.c: shared by the rewriting passes ----------------------------- */

/* v's tensor when v is the result of a live Constant, else NULL. */
const kiln_tensor *pass_const_of(const kiln_graph *g, uint32_t v);
/* ... or a parameter's data: fixed when compiling for inference. */
const kiln_tensor *pass_fixed(const kiln_graph *g, uint32_t v);
bool pass_is_output(const kiln_graph *g, uint32_t v);
/* A new Constant holding a copy of t, inferred; 0 on error (in g). */
uint32_t pass_constant(kiln_graph *g, kiln_loc loc, const kiln_tensor *t);
/* Every attribute of src set on dst. */
void pass_copy_attrs(kiln_graph *g, ir_node *dst, const ir_node *src);

/* ---- infer.c ------------------------------------------------------------ */

/* Re-runs shape inference over the schedule, in order. */
kiln_status pass_infer(kiln_graph *g, const pass_opts *o);

/* ---- fold.c ------------------------------------------------------------- */

/* Evaluates nodes whose inputs are all Constant outputs with the
 * interpreter's own kernels, and Shape of statically known dims; each result
 * becomes a Constant node.  Parameters are never folded: they are weights
 * that kiln_graph_load_params or training may replace later. */
kiln_status pass_fold(kiln_graph *g, const pass_opts *o);

/* ---- dce.c -------------------------------------------------------------- */

/* Removes nodes no graph output depends on; keeps inputs and parameters. */
kiln_status pass_dce(kiln_graph *g, const pass_opts *o);

/* ---- cse.c -------------------------------------------------------------- */

/* Merges nodes with the same op, inputs (in any order for IR_COMM ops) and
 * attributes; random ops are never merged. */
kiln_status pass_cse(kiln_graph *g, const pass_opts *o);

/* ---- autodiff.c --------------------------------------------------------- */

/* Reverse-mode differentiation (kiln_grad_at in kiln.h is the public face):
 * appends the backward graph of loss with respect to wrt[] and stores one
 * gradient value per wrt in grads (0 when loss does not depend on it). */
kiln_status pass_grad(kiln_graph *g, kiln_loc loc, uint32_t loss, int nwrt,
                      const uint32_t *wrt, uint32_t *grads);

/* ---- grad.c, grad_nn.c -------------------------------------------------- */

/* A gradient rule: given the node, one output gradient per output (0: none)
 * and dx[] zeroed, sets dx[i] to d(loss)/d(input i) built from ordinary
 * forward ops, or leaves 0 (integer inputs, no gradient).  A dx may have
 * the broadcast shape of the node's output: the driver sums it back to the
 * input's shape.  Unused results are swept by the driver. */
typedef kiln_status (*pass_grad_fn)(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                                    uint32_t *dx);
extern const pass_grad_fn pass_grad_table[KILN_OP_COUNT];
/* op's entry in pass_grad_table, or dy times its formula's derivative
 * (NULL: none) */
pass_grad_fn pass_grad_rule(kiln_op op);

/* Helpers shared by the rule files (grad.c). */
const ir_type *pass_gtype(const kiln_graph *g, uint32_t v);
uint32_t pass_gconst(kiln_graph *g, kiln_loc loc, kiln_tensor *t); /* frees t */
uint32_t pass_greshape(kiln_graph *g, kiln_loc loc, uint32_t v, const ir_type *to);
uint32_t pass_gbcast(kiln_graph *g, kiln_loc loc, uint32_t v, uint32_t like);
/* Elements of x over the axes in mask[], as a scalar of x's dtype; symbolic
 * dims come from Shape(x) at run time. */
uint32_t pass_gcount(kiln_graph *g, kiln_loc loc, uint32_t x, const bool *mask);
/* Gradient of a sum (mean) over the axes in mask[] of x: dy broadcast back. */
uint32_t pass_greduce_back(kiln_graph *g, kiln_loc loc, uint32_t dy, uint32_t x,
                           const bool *mask, bool keepdims, bool mean);

/* grad_nn.c: conv, pooling, normalisation, softmax, dropout and losses */
kiln_status pass_grad_conv(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx);
kiln_status pass_grad_conv_transpose(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                                     uint32_t *dx);
kiln_status pass_grad_max_pool(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                               uint32_t *dx);
kiln_status pass_grad_avg_pool(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                               uint32_t *dx);
kiln_status pass_grad_batch_norm(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                                 uint32_t *dx);
kiln_status pass_grad_layer_norm(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                                 uint32_t *dx);
kiln_status pass_grad_softmax(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                              uint32_t *dx);
kiln_status pass_grad_dropout(kiln_graph *g, const ir_node *n, const uint32_t *dy,
                              uint32_t *dx);
kiln_status pass_grad_loss(kiln_graph *g, const ir_node *n, const uint32_t *dy, uint32_t *dx);

/* ---- optim.c ------------------------------------------------------------ */

/* What the optimizer rewrite reads: each parameter to update with its
 * gradient, and the step's scalar inputs (see optim.c). */
typedef struct pass_optim_io {
	int n;                        /* parameters to update */
	const uint32_t *param, *grad; /* value ids: param[i] and d loss / d param[i] */
	uint32_t lr, step;            /* f64 scalar inputs: learning rate, 1-based t */
	uint32_t apply;               /* bool scalar input when accum_steps > 1, else 0 */
} pass_optim_io;

/* Appends the update of o (SGD/Adam/AdamW, clipping, accumulation) as graph
 * ops, optimizer state as trainable=false parameters "<p>.<slot>", and an
 * output "<name>.next" for every parameter and state tensor it replaces. */
kiln_status pass_optim(kiln_graph *g, const kiln_train_opts *o, const pass_optim_io *io);

/* ---- canon.c ------------------------------------------------------------ */

/* Removes Identity, inference-mode Dropout, identity and paired Transposes,
 * chains of Reshape/Flatten/Squeeze/Unsqueeze (to one Reshape, or nothing
 * when the shapes agree); graph outputs keep their names. */
kiln_status pass_canon(kiln_graph *g, const pass_opts *o);

/* ---- bnfold.c ----------------------------------------------------------- */

/* Folds inference-mode BatchNormalization into the single-use Conv, Gemm or
 * rank-2 MatMul before it when weights and statistics are Constants or
 * parameters (parameters count as final: inference compiles only, never a
 * graph to be trained; graphs marked for training are left alone). */
kiln_status pass_bnfold(kiln_graph *g, const pass_opts *o);

/* ---- nnfuse.c ----------------------------------------------------------- */

/* Replaces LayerNorm and GELU (erf and tanh forms) spelled out in
 * primitives, as exporters write them, by LayerNormalization and Gelu
 * nodes, and Pow by a scalar Constant 2, 3 or 0.5 by Muls or Sqrt. */
kiln_status pass_nnfuse(kiln_graph *g, const pass_opts *o);

/* ---- qfuse.c ------------------------------------------------------------ */

/* Replaces a QDQ model's DequantizeLinear -> Conv/MatMul/Gemm ->
 * QuantizeLinear by QLinearConv/QLinearMatMul (ConvInteger/MatMulInteger
 * and an f32 scale where no Q follows), and DQ -> MaxPool -> Q by a MaxPool
 * of the 8-bit tensor, where weights and scales are fixed (see qfuse.c);
 * leaves graphs marked for training alone. */
kiln_status pass_qfuse(kiln_graph *g, const pass_opts *o);

/* ---- quantize.c ------------------------------------------------------------ */

/* Post-training quantization's graph side (driver/quantize.c calibrates).
 * A value to quantize: an f32 activation some layer reads. */
typedef struct pass_qtensor {
	uint32_t v;     /* the f32 value */
	int same_as;    /* >= 0: takes that tensor's scale and zero point (a
	                   MaxPool's result takes its input's) */
	double lo, hi;  /* the range to cover, set by the caller before apply (which
	                   gives a shared tensor its source's) */
	float scale;    /* set by apply: u8, asymmetric */
	int zp;
	uint32_t dq;    /* set by apply: the DequantizeLinear its readers take */
} pass_qtensor;

/* A layer: Conv/MatMul/Gemm (fixed f32 weight), residual Add, MaxPool. */
typedef struct pass_qlayer {
	uint32_t node;  /* its index in the schedule (a clone's is the same) */
	int nact;       /* activation inputs: in[0] (and in[1] for Add) */
	int x[2];       /* their tensors */
	uint32_t out;   /* its result, or that of the Relu/Clip it absorbs */
	int q;          /* out's tensor when a layer reads it, else -1 (f32) */
} pass_qlayer;

typedef struct pass_qplan {
	pass_qtensor *t;
	int nt;
	pass_qlayer *l;
	int nl;
} pass_qplan;

/* The layers of g and the activations they read, in schedule order; nodes
 * whose name or ONNX op type is in keep[0..nkeep) stay f32.  g is not
 * changed (value ids and node indices hold for a clone). */
kiln_status pass_qplan_build(kiln_graph *g, const char *const *keep, int nkeep, pass_qplan *p);
void pass_qplan_free(pass_qplan *p);
/* u8 scale and zero point of [lo, hi] widened to hold 0 (ORT's rule; an
 * all-zero range gets scale 1). */
void pass_qparams(double lo, double hi, float *scale, int *zp);
/* Rewrites g (the graph p was built on, or a clone) into the QDQ graph:
 * every tensor's Q -> DQ with its range's parameters, weights s8 per
 * channel (one scale when per_tensor_weights), biases i32.  Sets each
 * tensor's scale, zp and dq. */
kiln_status pass_qplan_apply(kiln_graph *g, pass_qplan *p, bool per_tensor_weights);

/* The pipeline for compiling an inference graph (kiln_compile's default):
 * qfuse before the folds (which would turn a weight's DequantizeLinear into
 * an f32 constant), bnfold between two folds, so BN parameters behind
 * foldable ops fold too. */
#define PASS_INFERENCE "infer,canonicalize,qfuse,fold,nnfuse,bnfold,fold,cse,dce"

/* ---- rnn_unroll.c -------------------------------------------------------- */

/* Every fused RNN, GRU and LSTM node with a fixed sequence length becomes
 * the composition of ordinary ops over its time steps (autodiff's form of
 * it); one with a symbolic length is an EUNSUPPORTED error naming it.  The
 * replaced nodes are left dead and value ids stay valid (no compaction:
 * pass_grad runs it on a graph whose ids its caller holds). */
kiln_status pass_rnn_unroll(kiln_graph *g);
/* The same as a pipeline pass ("unroll_rnn"), compacting afterwards. */
kiln_status pass_unroll_rnn(kiln_graph *g, const pass_opts *o);

#endif /* KILN_PASSES_H */
