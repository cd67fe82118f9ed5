/*
 * shape.h: what shape.c and shape_nn.c share, private to the two of them:
 * the message and early-return macros every rule is written with, the
 * checks defined in shape.c that the neural-network rules also call, and
 * the rules defined in shape_nn.c that shape.c's ir_shape_table registers.
 *
 * A header of its own rather than a section of ir.h, because nothing else
 * in the library calls these, and the short macros (TS, FAIL, TRY) assume
 * a rule's own g and n in scope: they must not leak into other files.
 */
#ifndef KILN_IR_SHAPE_H
#define KILN_IR_SHAPE_H

#include "ir/ir.h"

/* A type as text, for messages; each call needs its own buffer. */
typedef char tbuf[192];
#define TS(t, b) ir_type_str(g, (t), (b), sizeof(b))
#define FAIL(code, ...) return ir_errorf(g, n, code, __VA_ARGS__)
#define TRY(x)                                                                    \
	do {                                                                      \
		kiln_status st_ = (x);                                            \
		if (st_ != KILN_OK)                                               \
			return st_;                                               \
	} while (0)

/* ---- checks (shape.c) ---------------------------------------------------- */

/* "[1,2,3]" for an ints attribute, for messages. */
const char *ir_ints_str(const int64_t *v, uint32_t cnt, char *buf, size_t size);
/* Normalises axis against rank (ONNX: [-rank, rank-1], or [-rank, rank]
 * when extra is 1, as for Flatten and Unsqueeze). */
kiln_status ir_axis_norm(kiln_graph *g, const ir_node *n, int64_t axis, int rank,
                         int extra, const ir_type *t, int *out);
/* ir_dim_mul with an overflow check on the concrete part. */
kiln_status ir_dim_mul_checked(kiln_graph *g, const ir_node *n, int64_t a, int64_t b,
                               int64_t *out);

/* ---- neural-network rules (shape_nn.c), each an ir_shape_fn -------------- */

kiln_status ir_shape_matmul(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out);
kiln_status ir_shape_gemm(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out);
kiln_status ir_shape_conv(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out);
/* Conv's rule for x = in[0], w = in[1] and bias (NULL: none) given apart:
 * ConvInteger's and QLinearConv's other inputs sit between them. */
kiln_status ir_shape_conv_of(kiln_graph *g, const ir_node *n, const ir_type *in,
                             const ir_type *bias, ir_type *out);
kiln_status ir_shape_conv_transpose(kiln_graph *g, const ir_node *n, const ir_type *in,
                                    ir_type *out);
/* MaxPool and AveragePool */
kiln_status ir_shape_pool(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out);
kiln_status ir_shape_global_pool(kiln_graph *g, const ir_node *n, const ir_type *in,
                                 ir_type *out);
kiln_status ir_shape_batch_norm(kiln_graph *g, const ir_node *n, const ir_type *in,
                                ir_type *out);
kiln_status ir_shape_layer_norm(kiln_graph *g, const ir_node *n, const ir_type *in,
                                ir_type *out);
/* Softmax and LogSoftmax */
kiln_status ir_shape_softmax(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out);
kiln_status ir_shape_dropout(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out);
/* grid_sample.c */
kiln_status ir_shape_grid_sample(kiln_graph *g, const ir_node *n, const ir_type *in,
                                 ir_type *out);
/* resize.c */
kiln_status ir_shape_resize(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out);
/* SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss */
kiln_status ir_shape_loss(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out);

/* rnn.c: RNN, GRU and LSTM */
kiln_status ir_shape_rnn(kiln_graph *g, const ir_node *n, const ir_type *in, ir_type *out);

/* ---- quantization rules (shape_quant.c), by op; NULL where none ---------- */

extern const ir_shape_fn ir_shape_quant_table[KILN_OP_COUNT];

#endif /* KILN_IR_SHAPE_H */
