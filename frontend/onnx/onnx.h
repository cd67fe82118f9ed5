/*
 * onnx.h: ONNX import and export, private to frontend/onnx/ (and the tests
 * and tools that reach inside); one section per file.
 *
 * Models are parsed and packed with protobuf-c through the structs that
 * protoc-c generates from Debian's onnx.proto at build time (cmake/onnx.cmake
 * puts onnx.pb-c.h on the include path): Onnx__ModelProto and friends.
 *
 * The importer walks the ONNX graph in order, mapping each node through a
 * per-op table (onnx_ops.c) onto kiln's op table.  ONNX passes some
 * compile-time constants as inputs (Reshape's shape, Slice's starts, ...)
 * where kiln's IR takes attributes, so the importer keeps, for every value
 * it can, the constant tensor behind it (initializers, Constant nodes, and
 * nodes it folded by running the interpreter on constant inputs), or a
 * vector of symbolic dims for shape arithmetic, and turns such inputs into
 * attributes.  Problems are collected, not raised: every
 * unsupported node is listed in one error.
 */
#ifndef KILN_ONNX_H
#define KILN_ONNX_H

#include <onnx.pb-c.h>

#include "ir/ir.h"

/* ---- onnx_tensor.c ------------------------------------------------------ */

/* ONNX TensorProto.DataType <-> kiln dtype; KILN_DT_INVALID / 0 when kiln
 * has no equivalent (string, complex, u16, u32, u64, i16, f8...). */
kiln_dtype onnx_dtype_to_kiln(int32_t onnx_type);
int32_t onnx_dtype_from_kiln(kiln_dtype dt);
/* ONNX's name of a TensorProto.DataType ("FLOAT", "INT64", ...). */
const char *onnx_dtype_name(int32_t onnx_type);

/* A TensorProto's data as a malloc'd tensor (kiln_tensor_free it): typed
 * fields, little-endian raw_data, or external data read from a file under
 * dir (NULL: external data refused; '..' and absolute paths always are).
 * Sizes are checked against the data present before anything is allocated.
 * On failure returns the code and writes why into err. */
kiln_status onnx_tensor_read(const Onnx__TensorProto *tp, const char *dir, kiln_tensor **out,
                             kiln_error *err);

/* ---- onnx_wire.c -------------------------------------------------------- */

/* Deepest message nesting protobuf-c may recurse through (a model is 1, a
 * Dimension of a graph input 7, each subgraph adds 3). */
#define ONNX_MAX_DEPTH 64

/* A protobuf-c allocator that gives out at most a budget in total. */
typedef struct onnx_alloc {
	ProtobufCAllocator pc; /* what protobuf-c is handed */
	size_t budget, left;
	bool exceeded;         /* an allocation was refused */
} onnx_alloc;
/* Budget for a file of file_size bytes: 16x plus 64 MiB, at most 4 GiB. */
void onnx_alloc_init(onnx_alloc *a, size_t file_size);
/* How deeply data's messages nest (descending where protobuf-c would),
 * walking the wire format without recursion: max + 1 as soon as it is
 * deeper than max (at most ONNX_MAX_DEPTH), -1 when the bytes are not
 * well-formed protobuf. */
int onnx_wire_depth(const void *data, size_t size, int max);
/* Unpacks a ModelProto under both limits; on failure, EPARSE (malformed or
 * too deep) or ENOMEM (over budget) with a message naming path.  Free
 * with onnx_unpacked_free(m, a). */
kiln_status onnx_unpack(const void *data, size_t size, const char *path, onnx_alloc *a,
                        Onnx__ModelProto **out, kiln_error *err);
void onnx_unpacked_free(Onnx__ModelProto *m, onnx_alloc *a);

/* ---- onnx_node.c (helpers of onnx_import.c and onnx_ops.c) ------------- */

/* A small integer vector (rank 0 or 1) computed from shapes: each element
 * a number, or (sym) a kiln dim that may be symbolic. */
#define ONNX_SVEC_MAX 16
typedef struct onnx_svec {
	int rank, n;
	int64_t v[ONNX_SVEC_MAX];
	bool sym[ONNX_SVEC_MAX];
} onnx_svec;

/* The importer's state, shared with the per-op functions in onnx_ops.c. */
typedef struct onnx_imp {
	kiln_graph *g;
	const Onnx__ModelProto *m;
	const char *path;     /* interned in g: node locations and messages */
	const char *dir;      /* external data folder, or NULL */
	const kiln_tensor_set *specialize; /* kiln_onnx_opts.specialize */
	int64_t opset;        /* version of the default domain */
	/* ONNX name -> value id (0: poisoned, its producer failed) */
	const char **names;   /* interned keys, open addressing */
	uint32_t *ids;
	uint32_t nname, capname;
	/* per value id: the constant tensor behind it, and its symbolic
	 * vector, when known (onnx_fold.c) */
	const kiln_tensor **cval;
	const onnx_svec **sval;
	uint32_t capcval;
	/* every problem, one per line */
	char *report;
	size_t nreport, capreport;
	int nproblem;
	kiln_status first;    /* code of the first problem */
} onnx_imp;

/* One ONNX node being imported. */
#define ONNX_ND_MAXOUT 4
typedef struct onnx_nd {
	const Onnx__NodeProto *p;
	kiln_op op;
	ir_node *n;   /* the kiln node whose outputs are the ONNX outputs */
	bool failed;  /* a problem was recorded; outputs get poisoned */
	/* a composition whose ONNX outputs come from several kiln nodes (LSTM's
	 * Y, Y_h, Y_c) leaves n NULL and sets nout and out[i], the value of
	 * ONNX output i (0: omitted), each inferred and named after it */
	uint32_t nout;
	uint32_t out[ONNX_ND_MAXOUT];
} onnx_nd;

/* Records a problem about node d (one line: path, op, name, domain, opset,
 * text) and marks it failed; returns code. */
kiln_status onnx_problem(onnx_imp *c, onnx_nd *d, kiln_status code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* The value id behind ONNX input i of d (0: absent or "", or an error was
 * recorded when must is set). */
uint32_t onnx_input(onnx_imp *c, onnx_nd *d, uint32_t i, bool must);
/* Creates a kiln node for d reading ONNX inputs [0, ndata) (trailing ""
 * dropped), with d's outputs, name and location, and copies d's ONNX
 * attributes by op's schema; names in skip (NULL-terminated, may be NULL)
 * are legacy attributes to ignore.  Sets d->n; false on a problem. */
bool onnx_emit(onnx_imp *c, onnx_nd *d, uint32_t ndata, const char *const *skip);
/* The same with explicit value ids for the data inputs. */
bool onnx_emit_with(onnx_imp *c, onnx_nd *d, uint32_t nin, const uint32_t *in,
                    const char *const *skip);
/* Infers n's output types and folds it when its inputs are known; false
 * (problem recorded against d) when inference fails. */
bool onnx_infer(onnx_imp *c, onnx_nd *d, ir_node *n);
/* An extra node with one output (for ops imported as several), named
 * "<d's name>/<suffix>"; the caller sets attributes and calls onnx_infer.
 * NULL on a problem (recorded against d). */
ir_node *onnx_extra(onnx_imp *c, onnx_nd *d, kiln_op op, uint32_t nin, const uint32_t *in,
                    const char *suffix);
/* ONNX input i of d, which must be a known constant integer tensor, as an
 * ints attribute name on d->n; absent inputs are fine unless required. */
bool onnx_ints_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name, bool required);
/* The same for an attribute whose schema kind is ds: elements the importer
 * knows only as symbolic dims (Slice's ends = Unsqueeze(Shape(x)[1])) are
 * kept as those dims (ir_attr_set_dims). */
bool onnx_dims_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name, bool required);
/* Turns a shape vector with symbolic elements into attribute values (e.g.
 * Reshape's 0 and -1); false when it cannot. */
typedef bool (*onnx_sym_fn)(onnx_imp *c, onnx_nd *d, const onnx_svec *s, int64_t *out);
/* The same for a required shape input that may hold symbolic dims. */
bool onnx_shape_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name,
                      onnx_sym_fn resolve);
/* Input i as a known constant tensor: a constant or foldable, or a graph
 * input the caller specialised on (kiln_onnx_opts.specialize); NULL when
 * absent, or after a problem naming the input and what it is. */
const kiln_tensor *onnx_const_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *what,
                                    bool required);
/* ONNX input i of d as a scalar float / int attribute (absent: not set). */
bool onnx_float_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name);
bool onnx_int_input(onnx_imp *c, onnx_nd *d, uint32_t i, const char *name);
/* Copies d's ONNX attributes onto another node n by op's schema (an op a
 * node is imported as several of); names in skip are ignored. */
bool onnx_copy_attrs_to(onnx_imp *c, onnx_nd *d, ir_node *n, kiln_op op,
                        const char *const *skip);
/* The ONNX attribute called name on d, or NULL. */
const Onnx__AttributeProto *onnx_attr(const onnx_nd *d, const char *name);
/* The domain of node p ("" for the default) and the opset c imports it at. */
const char *onnx_domain_of(const Onnx__NodeProto *p);
int64_t onnx_opset_of(const onnx_imp *c, const char *domain);
/* The ONNX-name table: key (interned in c->g) -> value id (0: poisoned). */
bool onnx_name_set(onnx_imp *c, const char *key, uint32_t v, bool *oom);
bool onnx_name_get(const onnx_imp *c, const char *key, uint32_t *v);

/* ---- onnx_fold.c -------------------------------------------------------- */

/* The constant tensor behind value id v, or NULL when it is not known. */
const kiln_tensor *onnx_const(const onnx_imp *c, uint32_t v);
bool onnx_const_set(onnx_imp *c, uint32_t v, const kiln_tensor *t); /* false: ENOMEM */
/* v as a symbolic vector (also for small integer constants), or NULL. */
const onnx_svec *onnx_svec_of(onnx_imp *c, uint32_t v);
/* Records what is known about n's outputs: constants by running its kernel
 * when all inputs are known, else symbolic vectors for shape arithmetic. */
void onnx_fold(onnx_imp *c, const ir_node *n);

/* ---- onnx_ops.c --------------------------------------------------------- */

/* Imports one node whose op is in kiln's table (d->op set). */
typedef void (*onnx_import_fn)(onnx_imp *c, onnx_nd *d);
extern const onnx_import_fn onnx_import_table[KILN_OP_COUNT];
void onnx_import_node(onnx_imp *c, onnx_nd *d);

/* ---- onnx_compose.c ----------------------------------------------------- */

/* Imports d when its op is one kiln spells with its own (ReduceL1 as
 * ReduceSum(Abs x), ArgMin as ArgMax of the negation...): true when it
 * was one (d->n or d->failed set), false for any other op. */
bool onnx_import_composite(onnx_imp *c, onnx_nd *d);
/* Whether the importer takes op_type of domain ("" or NULL: the default):
 * an op of kiln's table, a composition above, or a com.microsoft op. */
bool onnx_op_imports(const char *domain, const char *op_type);
/* Range (onnx_import_table's entry): a Constant when start, limit and delta
 * are known, else kiln's Range of a symbolic length when only the limit is
 * a dim. */
void onnx_import_range(onnx_imp *c, onnx_nd *d);

/* ---- onnx_rnn.c --------------------------------------------------------- */

/* RNN, GRU and LSTM (opsets 7 to 17), onnx_import_table's entries: with a
 * symbolic sequence length one fused kiln node of the same op (ir/rnn.c);
 * with a fixed one unrolled into kiln's own ops: one MatMul of X by W^T
 * for every step, then per step a Gemm by R^T, the gates' Slices and
 * activations, Where masks for sequence_lens; outputs set through d->out. */
void onnx_import_rnn(onnx_imp *c, onnx_nd *d);
void onnx_import_gru(onnx_imp *c, onnx_nd *d);
void onnx_import_lstm(onnx_imp *c, onnx_nd *d);

/* ---- onnx_msft.c -------------------------------------------------------- */

/* Imports a node of the com.microsoft domain that ONNX Runtime's quantizer
 * writes in its QOperator format (QLinearAdd, QGemm...) as standard ops
 * between DequantizeLinear and QuantizeLinear; records a problem for any
 * other. */
void onnx_import_msft(onnx_imp *c, onnx_nd *d);
bool onnx_msft_op(const char *op_type); /* one onnx_import_msft takes */

/* ---- onnx_export.c ------------------------------------------------------ */

/* Whether the exporter maps op to ONNX (one-to-one, or as a formula for ops
 * opset 17 lacks, such as Gelu); the tests walk the op table with it. */
bool onnx_export_maps(kiln_op op);

#endif /* KILN_ONNX_H */
