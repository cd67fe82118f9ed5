/*
 * interp.h: what interp.c and interp_nn.c share, private to the two of
 * them: the kernel helpers defined in interp.c, and the neural-network
 * kernels defined in interp_nn.c that interp.c's ir_interp_table registers.
 *
 * A header of its own rather than a section of ir.h, because nothing else
 * in the library calls these: ir.h stays the IR's interface (ir_interp_node,
 * ir_load, ir_store), and these helpers, which work on concrete tensors and
 * report into an ir_interp's kiln_error, stay out of every other file's view.
 */
#ifndef KILN_IR_INTERP_H
#define KILN_IR_INTERP_H

#include "ir/ir.h"

/* ---- kernel helpers (interp.c) ------------------------------------------- */

/* Like ir_errorf, but into the run's kiln_error: the graph is const here. */
kiln_status ir_fail(ir_interp *c, const ir_node *n, kiln_status code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
bool ir_isint(kiln_dtype dt);
/* "f32[2,3]" for a concrete tensor, for messages. */
const char *ir_tstr(const kiln_tensor *t, char *buf, size_t size);
int64_t ir_prod(const int64_t *dims, int from, int to); /* dims[from..to) */
/* Row-major coordinates of linear index i in shape[0..rank). */
void ir_unravel(int64_t i, int rank, const int64_t *shape, int64_t *idx);
/* Strides of t broadcast to out's shape (right-aligned, 0 on a broadcast
 * dim); false when t does not broadcast to out. */
bool ir_bstrides(const kiln_tensor *t, const kiln_tensor *out, int64_t *st);
/* Offset into a tensor with broadcast strides st of out's element i. */
int64_t ir_boff(const kiln_tensor *out, const int64_t *st, int64_t i);
int64_t ir_naxis(int64_t axis, int rank); /* a negative axis counts from the end */
double ir_maxd(double a, double b);       /* NaN wins, as ONNX Max */
/* "t does not broadcast to out", as an ESHAPE error. */
kiln_status ir_bcast_fail(ir_interp *c, const ir_node *n, const kiln_tensor *t,
                          const kiln_tensor *out);

/* ---- neural-network kernels (interp_nn.c), each an ir_interp_fn ---------- */

kiln_status ir_interp_conv(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                           kiln_tensor *const *out);
kiln_status ir_interp_conv_transpose(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                     kiln_tensor *const *out);
/* MaxPool and AveragePool */
kiln_status ir_interp_pool(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                           kiln_tensor *const *out);
kiln_status ir_interp_global_avg_pool(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                      kiln_tensor *const *out);
kiln_status ir_interp_batch_norm(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                 kiln_tensor *const *out);
kiln_status ir_interp_layer_norm(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                 kiln_tensor *const *out);
/* Softmax and LogSoftmax */
kiln_status ir_interp_softmax(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                              kiln_tensor *const *out);
kiln_status ir_interp_dropout(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                              kiln_tensor *const *out);
/* SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss */
kiln_status ir_interp_loss(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                           kiln_tensor *const *out);

/* grid_sample.c */
kiln_status ir_interp_grid_sample(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                  kiln_tensor *const *out);
/* resize.c */
kiln_status ir_interp_resize(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                             kiln_tensor *const *out);

/* rnn.c: RNN, GRU and LSTM, the reference loop */
kiln_status ir_interp_rnn(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                          kiln_tensor *const *out);
/* ---- quantization kernels (interp_quant.c), by op; NULL where none ----- */

extern const ir_interp_fn ir_interp_quant_table[KILN_OP_COUNT];

#endif /* KILN_IR_INTERP_H */
