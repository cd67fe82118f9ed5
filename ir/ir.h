/*
 * ir.h: the graph IR, private to the library; one section per file that
 * owns each part (ir.c, shape.c, verify.c, kir_print.c, kir_parse.c,
 * interp.c).  shape_nn.c and interp_nn.c hold the neural-network rules and
 * kernels; what they share with shape.c and interp.c is in the private
 * headers ir/shape.h and ir/interp.h, not here.
 *
 * A graph owns an arena.  Values and nodes are arena objects reached
 * through two pointer arrays, so an ir_node * or ir_value * stays valid
 * until ir_compact(); nodes refer to values by 32-bit id (QBE's Ref), id 0
 * being "no value".  The node array is the schedule: every node comes after
 * the nodes defining its inputs (SSA order; the verifier checks it).
 *
 * A dimension is an int64_t: >= 0 is a fixed size; < 0 is -(k+1) for entry
 * k of the graph's hash-consed dimension expressions (a symbol, or a sum,
 * product or floor quotient), so equal expressions compare equal as ints.
 */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <stdarg.h>
#include <stdint.h>

#include "kiln/kiln.h"

/* ---- the op table ------------------------------------------------------ */

#define IR_VARIADIC 255

enum {
	IR_ELEM = 1 << 0,   /* elementwise: output[i] depends on inputs[i] */
	IR_BCAST = 1 << 1,  /* inputs broadcast NumPy-style */
	IR_COMM = 1 << 2,   /* commutative */
	IR_INTOK = 1 << 3,  /* accepts integer dtypes (floats always) */
	IR_CMP = 1 << 4,    /* comparison: output is bool */
	IR_LOGIC = 1 << 5,  /* bool in, bool out */
	IR_REDUCE = 1 << 6, /* reduction over axes */
	IR_MOVE = 1 << 7,   /* pure data movement, no arithmetic */
	IR_NODIFF = 1 << 8, /* output is not differentiable */
	IR_RANDOM = 1 << 9, /* draws random numbers (in training mode) */
	IR_EXPAND = 1 << 10, /* ONNX opset 17 lacks it: exported as its formula (scalar.c) */
	IR_ONNX_PRE7 = 1 << 11, /* its ONNX definition predates opset 7 (later versions only
	                           widened the types): models older than opset 7 may use it */
};

typedef enum kiln_op {
#define OP(id, ...) KILN_OP_##id,
#include "ops.def"
#undef OP
	KILN_OP_COUNT
} kiln_op;

typedef struct ir_op_info {
	const char *onnx;  /* ONNX op_type */
	const char *kir;   /* .kir mnemonic */
	uint8_t in_min, in_max, out_min, out_max; /* IR_VARIADIC: unbounded */
	uint32_t flags;
	const char *attrs; /* schema, see ops.def */
} ir_op_info;

extern const ir_op_info ir_op_info_table[KILN_OP_COUNT];
#define ir_op(op) (&ir_op_info_table[(op)])

/* ---- arena and strings (ir.c) ------------------------------------------ */

typedef struct ir_arena ir_arena;
ir_arena *ir_arena_new(void);
void ir_arena_free(ir_arena *a);
/* Zeroed memory aligned to 16 bytes (64 for requests of 64 bytes or more);
 * NULL when out of memory. */
void *ir_alloc(ir_arena *a, size_t n);
char *ir_arena_strdup(ir_arena *a, const char *s);
/* FNV-1a of s, for the open-addressing string tables (interning, .kir names). */
uint32_t ir_hash_str(const char *s);

/* ---- types and dimensions (ir.c) -------------------------------------- */

typedef struct ir_type {
	kiln_dtype dtype;
	int rank;
	int64_t dim[KILN_MAX_RANK];
} ir_type;

typedef enum { IR_DSYM, IR_DADD, IR_DMUL, IR_DDIV } ir_dim_op;

typedef struct ir_dimexpr {
	ir_dim_op op;
	int64_t a, b;     /* operands (dims); DDIV: b is a constant > 0 */
	const char *sym;  /* IR_DSYM: interned name */
} ir_dimexpr;

int64_t ir_dim_sym(kiln_graph *g, const char *name);
int64_t ir_dim_add(kiln_graph *g, int64_t a, int64_t b);
int64_t ir_dim_mul(kiln_graph *g, int64_t a, int64_t b);
int64_t ir_dim_div(kiln_graph *g, int64_t a, int64_t b); /* floor; b > 0 const */
const ir_dimexpr *ir_dim_expr(const kiln_graph *g, int64_t d); /* NULL if fixed */
/* Prints a dim ("N", "N+1", "(N+2)/2", "3") into buf; returns buf. */
char *ir_dim_str(const kiln_graph *g, int64_t d, char *buf, size_t size);
/* Evaluates a dim given a value for each symbol (symval indexed like
 * ir_dim_symbols); returns -1 if a symbol is unbound (symval < 0). */
int64_t ir_dim_eval(const kiln_graph *g, int64_t d, const int64_t *symval);
/* Index of the symbol a dim is, or -1 when it is not a bare symbol. */
int ir_dim_symbol_index(const kiln_graph *g, int64_t d);
int ir_dim_nsym(const kiln_graph *g);           /* symbols 0..n-1 */
const char *ir_dim_symname(const kiln_graph *g, int k);
/* "f32[N,3,224,224]" */
char *ir_type_str(const kiln_graph *g, const ir_type *t, char *buf, size_t size);
/* Graphviz text of g (dot.c): cluster NULL, or per node the cluster it is
 * drawn in (-1: none), label[c] naming cluster c < ncluster.  malloc'd;
 * NULL on ENOMEM. */
char *ir_graph_dot(const kiln_graph *g, const int *cluster, const char *const *label,
                   int ncluster);
bool ir_type_eq(const ir_type *a, const ir_type *b);
bool ir_type_concrete(const ir_type *t); /* no symbolic dim */

/* ---- values, nodes, attributes (ir.c) --------------------------------- */

typedef enum {
	IR_V_NONE = 0, /* id 0, or a value whose node was removed */
	IR_V_INPUT,    /* graph input */
	IR_V_PARAM,    /* named initializer with data (weight or buffer) */
	IR_V_NODE,     /* result of a node */
} ir_value_kind;

typedef struct ir_node ir_node;

typedef struct ir_value {
	uint32_t id;
	ir_value_kind kind;
	ir_type type;
	const char *name;   /* interned; NULL: printed by number */
	ir_node *def;       /* IR_V_NODE: defining node */
	int def_out;        /* which output of def */
	kiln_tensor *data;  /* IR_V_PARAM: initial data (arena-owned) */
	bool trainable;     /* IR_V_PARAM: a weight (true) or a buffer */
	ir_node **uses;     /* one entry per operand slot that reads this */
	uint32_t nuse, capuse;
} ir_value;

typedef enum { IR_A_INT, IR_A_FLOAT, IR_A_INTS, IR_A_FLOATS, IR_A_STRING,
	       IR_A_TENSOR, IR_A_DTYPE } ir_attr_kind;

typedef struct ir_attr {
	const char *name; /* interned */
	ir_attr_kind kind;
	uint32_t n;       /* element count for INTS/FLOATS */
	/* INTS whose schema kind is ds: bit i set when element i is a symbolic
	 * dim (< 0, an ir_dim_* handle) rather than a number, so a Slice can end
	 * at S while -1 still means "one from the end".  At most 64 elements. */
	uint64_t dims;
	union {
		int64_t i;    /* INT, DTYPE */
		double f;
		int64_t *ints;
		double *floats;
		const char *s;
		kiln_tensor *t;
	} u;
} ir_attr;

struct ir_node {
	uint32_t idx;     /* position in the schedule (g->node[idx] == this) */
	kiln_op op;
	uint32_t nin, nout;
	uint32_t *in, *out; /* value ids */
	ir_attr *attr;
	uint32_t nattr, capattr;
	const char *name; /* interned, may be NULL */
	kiln_loc loc;     /* where it came from: DSL caller, .kir line, model */
	bool dead;
};

struct kiln_graph {
	ir_arena *arena;
	const char *name;
	ir_value **val;   /* val[0] is the "no value" placeholder */
	uint32_t nval, capval;
	ir_node **node;   /* the schedule */
	uint32_t nnode, capnode;
	uint32_t *input, ninput, capinput;
	uint32_t *output, noutput, capoutput;
	ir_dimexpr *dexp;
	uint32_t ndexp, capdexp;
	const char **sym; /* symbol names in order of creation */
	uint32_t nsym, capsym;
	const char **strtab; /* open-addressing intern table */
	uint32_t nstr, capstr;
	kiln_status status;
	char errmsg[1024];
	uint64_t rng;       /* parameter initialisation generator state */
	bool training;
	/* The weights file a .kir's parameters need that kiln_graph_load did
	 * not find; until weights are loaded the parameters hold zeros, and
	 * run, compile, export and train refuse the graph (ir_check_weights). */
	const char *weights_missing;
};

const char *ir_intern(kiln_graph *g, const char *s);
ir_value *ir_val(const kiln_graph *g, uint32_t id); /* NULL if out of range */
/* A new value; kind and type set by the caller. 0 on ENOMEM. */
uint32_t ir_value_new(kiln_graph *g, ir_value_kind kind, const ir_type *t, const char *name);
uint32_t ir_input_new(kiln_graph *g, const char *name, const ir_type *t);
uint32_t ir_param_new(kiln_graph *g, const char *name, const kiln_tensor *data, bool trainable);
kiln_status ir_output_add(kiln_graph *g, uint32_t v, const char *name);
/* Appends a node reading in[0..nin) with nout fresh output values whose
 * types are unset (dtype invalid); NULL on error (recorded in g). */
ir_node *ir_node_new(kiln_graph *g, kiln_op op, uint32_t nin, const uint32_t *in,
                     uint32_t nout, kiln_loc loc);
void ir_set_input(kiln_graph *g, ir_node *n, uint32_t i, uint32_t v); /* fixes uses */
/* Every use of from now reads to (graph outputs included). */
void ir_replace_uses(kiln_graph *g, uint32_t from, uint32_t to);
/* Detaches n from its inputs and marks it and its outputs dead. */
void ir_node_remove(kiln_graph *g, ir_node *n);
/* Drops dead nodes and unused dead values, renumbering value ids; value ids
 * held outside the graph are invalid afterwards. */
kiln_status ir_compact(kiln_graph *g);
/* Reorders the schedule topologically (stable); ESHAPE-free, EVERIFY on a cycle. */
kiln_status ir_toposort(kiln_graph *g);
/* A deep copy; NULL on ENOMEM. */
/* Dims above this are refused at the door (shape inference, and the sizes
 * kiln_graph_run binds symbols to), so that sums of a few of them and
 * products with window sizes cannot overflow. */
#define IR_DIM_MAX ((int64_t)1 << 48)
/* The most elements one tensor may have anywhere in kiln (ir_tensor_new,
 * the ONNX importer's inputs and initializers, .kir types). */
#define IR_MAX_NUMEL (UINT64_C(1) << 40)
kiln_graph *ir_graph_clone(const kiln_graph *g);
/* KILN_OK, or an error naming the missing weights file when g came from a
 * .kir whose parameters have no data (what: "run", "compile", ...). */
kiln_status ir_check_weights(const kiln_graph *g, const char *what, kiln_error *err);

/* attributes: set replaces; get returns the default when absent */
kiln_status ir_attr_set_int(kiln_graph *g, ir_node *n, const char *name, int64_t v);
kiln_status ir_attr_set_float(kiln_graph *g, ir_node *n, const char *name, double v);
kiln_status ir_attr_set_ints(kiln_graph *g, ir_node *n, const char *name, uint32_t cnt,
                             const int64_t *v);
/* Ints of which those marked in dims (bit i: element i) are symbolic dims;
 * fixed dims (>= 0) are stored as plain numbers.  EINVAL past 64 elements
 * with a mark. */
kiln_status ir_attr_set_dims(kiln_graph *g, ir_node *n, const char *name, uint32_t cnt,
                             const int64_t *v, uint64_t dims);
kiln_status ir_attr_set_floats(kiln_graph *g, ir_node *n, const char *name, uint32_t cnt,
                               const double *v);
kiln_status ir_attr_set_string(kiln_graph *g, ir_node *n, const char *name, const char *s);
kiln_status ir_attr_set_tensor(kiln_graph *g, ir_node *n, const char *name,
                               const kiln_tensor *t); /* copies into the arena */
kiln_status ir_attr_set_dtype(kiln_graph *g, ir_node *n, const char *name, kiln_dtype dt);
const ir_attr *ir_attr_get(const ir_node *n, const char *name);
int64_t ir_attr_int(const ir_node *n, const char *name, int64_t dflt);
double ir_attr_float(const ir_node *n, const char *name, double dflt);
const char *ir_attr_str(const ir_node *n, const char *name, const char *dflt);
/* Ints attribute: count (0 when absent) and pointer through *v.  One that
 * holds symbolic dims reads as absent: only code that asks ir_attr_dims
 * can tell a dim from a number. */
uint32_t ir_attr_ints(const ir_node *n, const char *name, const int64_t **v);
/* The same for any ints attribute; *dims gets its mask of symbolic dims. */
uint32_t ir_attr_dims(const ir_node *n, const char *name, const int64_t **v, uint64_t *dims);
/* Element i of ints attribute a as a dim: symbolic when marked, else the
 * number itself. */
static inline bool ir_attr_is_dim(const ir_attr *a, uint32_t i)
{
	return i < 64 && (a->dims >> i & 1);
}
/* Parsed schema entry for one attribute of an op; false if not in schema. */
typedef struct ir_attr_schema {
	char name[48];
	ir_attr_kind kind;
	bool required, has_default;
	bool dims;  /* kind ds: ints that may hold symbolic dims */
	char dflt[48];
} ir_attr_schema;
int ir_op_schema(kiln_op op, ir_attr_schema *out, int max); /* count */
kiln_op ir_op_from_kir(const char *mnemonic);  /* KILN_OP_COUNT if unknown */
kiln_op ir_op_from_onnx(const char *op_type);  /* KILN_OP_COUNT if unknown */

/* Errors: keeps the first (sticky), returns code.  The message is
 * "file:line: Op 'node': text" when loc and n are given. */
kiln_status ir_errorf(kiln_graph *g, const ir_node *n, kiln_status code, const char *fmt,
                      ...) __attribute__((format(printf, 4, 5)));
kiln_status ir_errorf_at(kiln_graph *g, kiln_loc loc, kiln_status code, const char *fmt,
                         ...) __attribute__((format(printf, 4, 5)));
/* Where nodes that kiln adds on the user's behalf (a loss, optimizer
 * updates, counters) say they come from: the location of the node behind
 * the first output that has one (the model file, or its .kir line or DSL
 * call), else of any node; {0} when none has one.  Never kiln's own
 * source, so messages about those nodes name the user's file. */
kiln_loc ir_graph_loc(const kiln_graph *g);
/* Fill a caller's kiln_error (may be NULL); returns code. */
kiln_status ir_seterr(kiln_error *err, kiln_status code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* "Conv 'conv1/Conv'" or "Conv" into buf, for messages. */
const char *ir_node_desc(const ir_node *n, char *buf, size_t size);

/* Seeded generator for initialisation: uniform in [0,1), and normal. */
double ir_rand_uniform(kiln_graph *g);
double ir_rand_normal(kiln_graph *g);

/* tensors in the graph's arena (freed with it) */
kiln_tensor *ir_tensor_new(kiln_graph *g, kiln_dtype dt, int rank, const int64_t *shape);
kiln_tensor *ir_tensor_copy(kiln_graph *g, const kiln_tensor *t);

/* ---- shape.c ------------------------------------------------------------ */

/* Infers the output types of n from its input types and attributes and
 * stores them in its output values; errors name node, op and shapes. */
kiln_status ir_infer_node(kiln_graph *g, ir_node *n);
/* Computes n's output types into out[] without storing them. */
kiln_status ir_infer_types(kiln_graph *g, const ir_node *n, ir_type *out);
/* NumPy broadcast of two types' shapes into *out (dtype from a). */
kiln_status ir_broadcast(kiln_graph *g, const ir_node *n, const ir_type *a, const ir_type *b,
                         ir_type *out);
/* Begin/end padding of one spatial dim of a conv or conv-transpose whose
 * input and output sizes are known: derived from auto_pad (SAME_UPPER puts
 * the odd pixel at the end, SAME_LOWER and output_shape at the start) when
 * derive is set, zero for VALID, else the pads attribute's pair. */
void ir_conv_pad(const char *auto_pad, bool derive, bool transpose, int64_t in, int64_t out,
                 int64_t span, int64_t stride, int64_t opad, int64_t attr_begin,
                 int64_t attr_end, int64_t *begin, int64_t *end);
/* Spatial geometry of a conv, conv-transpose or pool over x [N, C, in...]
 * -> y [N, M, out...] with kernel k[] (conv_geom.c): the rule the
 * interpreter and the lowering share. */
typedef struct ir_conv_geom {
	int nsp;                                      /* spatial dims, 1..3 */
	int64_t in[3], out[3], k[3], stride[3], dil[3];
	int64_t pad[3], pad_end[3];                   /* begin and end padding */
	int64_t isz, osz, ksz;                        /* products of in, out, k */
} ir_conv_geom;
typedef enum ir_geom_status {
	IR_GEOM_OK,
	IR_GEOM_RANK, /* not 1 to 3 spatial dims, or x and y ranks differ */
	IR_GEOM_ATTR, /* strides, dilations, pads or output_padding of the wrong length */
	IR_GEOM_DIM,  /* a symbolic (negative) size, or a stride, dilation or kernel < 1 */
} ir_geom_status;
/* Fills g from the dims of x and y (ranks xrank, yrank), the kernel's
 * spatial dims k and n's attributes.  For transpose the roles of in and
 * out swap in the padding rule: explicit output_shape or SAME padding
 * derives pads from the sizes (ONNX ConvTranspose).  The caller words the
 * error for what it returns. */
ir_geom_status ir_conv_geom_of(const ir_node *n, int xrank, const int64_t *x, int yrank,
                               const int64_t *y, const int64_t *k, bool transpose,
                               ir_conv_geom *g);
typedef kiln_status (*ir_shape_fn)(kiln_graph *g, const ir_node *n, const ir_type *in,
                                   ir_type *out);
extern const ir_shape_fn ir_shape_table[KILN_OP_COUNT];
/* op's entry in ir_shape_table, or the default its flags give (NULL: none) */
ir_shape_fn ir_shape_rule(kiln_op op);

/* ---- verify.c ----------------------------------------------------------- */

/* Checks SSA order, arity, attribute schema, use lists, and that every
 * output type equals what inference gives; the message names the node. */
kiln_status ir_verify(const kiln_graph *g, kiln_error *err);

/* ---- grid_sample.c: GridSample's arithmetic (interpreter and lowering) -- */

/* mode: 0 bilinear, 1 nearest, 2 bicubic; *pad: 0 zeros, 1 border, 2
 * reflection; -1 for a name ONNX does not define. */
int ir_grid_sample_mode(const ir_node *n, int *pad);
double ir_grid_unnormalize(double g, int64_t size, bool align);
double ir_grid_pad_coord(double x, int64_t size, int pad, bool align);
/* X[n, c] (base: its offset) sampled at grid point (gx, gy). */
double ir_grid_sample_at(const kiln_tensor *x, int64_t base, double gx, double gy, int mode,
                         int pad, bool align);

/* ---- resize.c: Resize's per-axis taps (interpreter and lowering) ------- */

typedef struct ir_resize {
	int mode;     /* 0 nearest, 1 linear, 2 cubic */
	int ctm;      /* coordinate_transformation_mode: 0 half_pixel, 1 pytorch_half_pixel,
	                 2 align_corners, 3 asymmetric, 4 tf_half_pixel_for_nn,
	                 5 tf_crop_and_resize */
	int nearest;  /* 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil */
	double a, extrap;
	bool exclude;
	const double *scales, *roi;
	const int64_t *sizes;
	uint32_t nscales, nsizes, nroi;
} ir_resize;

/* n's attributes for an input of rank rank; EINVAL with why otherwise. */
kiln_status ir_resize_parse(const ir_node *n, int rank, ir_resize *r, char *why, size_t size);
/* Output length of axis d (-1 when it does not fit). */
int64_t ir_resize_out(const ir_resize *r, int d, int rank, int64_t in);
double ir_resize_scale(const ir_resize *r, int d, int64_t in, int64_t out);
/* The taps of output coordinate o along axis d (in -> out): count (0 when
 * tf_crop_and_resize leaves the axis: *outside), indices clamped into the
 * axis, weights (idx, w: room for 4). */
int ir_resize_taps(const ir_resize *r, int d, int rank, int64_t in, int64_t out, int64_t o,
                   int64_t *idx, double *w, bool *outside);

/* ---- rnn.c: the fused recurrent ops' attributes (shape, interpreter,
 * lowering, ONNX export) -------------------------------------------------- */

enum { IR_RNN_CELL_RNN, IR_RNN_CELL_GRU, IR_RNN_CELL_LSTM };
/* activation functions ONNX's recurrent ops name (IR_RNN_ACT_NAMES order) */
enum { IR_ACT_RELU, IR_ACT_TANH, IR_ACT_SIGMOID, IR_ACT_SOFTSIGN, IR_ACT_SOFTPLUS,
       IR_ACT_LEAKY_RELU, IR_ACT_THRESHOLDED_RELU, IR_ACT_ELU, IR_ACT_HARD_SIGMOID,
       IR_ACT_AFFINE, IR_ACT_SCALED_TANH, IR_ACT_COUNT };
extern const char *const ir_rnn_act_names[IR_ACT_COUNT];

/* ONNX input positions of a fused recurrent node's optional inputs */
enum { IR_RNN_B = 3, IR_RNN_LENS = 4, IR_RNN_H0 = 5, IR_RNN_C0 = 6, IR_RNN_P = 7 };

typedef struct ir_rnn {
	int cell;                 /* IR_RNN_CELL_* */
	int gates, nact, ndir;    /* G: 1, 3, 4; activations per direction; 1 or 2 */
	bool reverse;             /* direction "reverse" (one direction run backwards) */
	int layout;               /* 0: [T,N,.], 1: batch first */
	bool lbr, input_forget;   /* GRU linear_before_reset, LSTM input_forget */
	double clip;              /* > 0: gates' inputs clipped to [-clip, clip]; 0: none */
	int64_t hidden;
	int act[6];               /* IR_ACT_*, [dir * nact + j]: f, g, h */
	double alpha[6], beta[6]; /* each activation's parameters */
	int in[8];                /* ONNX position -> kiln input index, -1: absent */
} ir_rnn;

/* n's attributes and inputs (n an RNN, GRU or LSTM node); EINVAL with why
 * when they do not make sense. */
kiln_status ir_rnn_parse(const ir_node *n, ir_rnn *r, char *why, size_t size);
/* activation act with its parameters at x (double), as ONNX defines it */
double ir_rnn_act(int act, double alpha, double beta, double x);
/* Whether direction k of r runs backwards in time. */
static inline bool ir_rnn_dir_reverse(const ir_rnn *r, int k) { return r->reverse || k == 1; }

/* ---- kir_print.c / kir_parse.c ----------------------------------------- */

char *ir_print(const kiln_graph *g); /* malloc'd */
kiln_status ir_parse(const char *text, const char *filename, kiln_graph **out,
                     kiln_error *err);

/* ---- scalar.c ----------------------------------------------------------- */

/* An elementwise op's arithmetic, written once: an SSA list of primitives
 * over the input x, built from the node's attributes by the op's rule. */
typedef enum ir_sop {
	IR_S_X,      /* the op's input */
	IR_S_K,      /* the constant k */
	IR_S_NEG, IR_S_ABS, IR_S_EXP, IR_S_LOG, IR_S_SQRT, IR_S_TANH, IR_S_ERF, /* op(a) */
	IR_S_ADD, IR_S_SUB, IR_S_MUL, IR_S_DIV, /* a op b */
	IR_S_MAX, IR_S_MIN, /* propagate NaN, as the kernels do */
	IR_S_LT,     /* a < b: a condition, read only by SELECT */
	IR_S_SELECT, /* a ? b : c */
} ir_sop;
typedef struct ir_sinst {
	ir_sop op;
	int a, b, c; /* earlier instructions */
	double k;    /* IR_S_K */
} ir_sinst;
#define IR_SEXPR_MAX 128
typedef struct ir_sexpr {
	ir_sinst i[IR_SEXPR_MAX];
	int n, root; /* root: the instruction whose value is the result */
	bool full;
} ir_sexpr;
/* A rule: appends n's formula over instruction x, returns its instruction
 * (-1 on an attribute it refuses). */
typedef int (*ir_scalar_rule)(ir_sexpr *e, const ir_node *n, int x);
extern const ir_scalar_rule ir_scalar_table[KILN_OP_COUNT];
int ir_sx(ir_sexpr *e, ir_sop op, int a, int b, int c, double k);
/* n's formula (KILN_EUNSUPPORTED: the op has no rule; KILN_EINVAL: a bad
 * attribute), and its derivative with respect to x. */
kiln_status ir_scalar_build(const ir_node *n, ir_sexpr *e);
kiln_status ir_scalar_deriv(const ir_node *n, ir_sexpr *e);
double ir_scalar_eval(const ir_sexpr *e, double x);

/* ---- interp.c ----------------------------------------------------------- */

typedef struct ir_interp {
	const kiln_graph *g;
	kiln_error *err;
	uint64_t seed;   /* mixed into Dropout's counter-based generator */
	/* each symbol's size in this run (ir_dim_eval), for attributes that
	 * hold symbolic dims; NULL where nothing binds them (constant folding) */
	const int64_t *sym;
} ir_interp;

/* Computes one node: in[] and out[] are concrete; out[] is preallocated
 * with the node's output dtypes and concrete shapes. */
typedef kiln_status (*ir_interp_fn)(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                                    kiln_tensor *const *out);
extern const ir_interp_fn ir_interp_table[KILN_OP_COUNT];
/* op's entry in ir_interp_table, or its formula's evaluator (NULL: none) */
ir_interp_fn ir_interp_kernel(kiln_op op);
kiln_status ir_interp_node(ir_interp *c, const ir_node *n, kiln_tensor *const *in,
                           kiln_tensor *const *out);
/* dtype-generic element access used by kernels (and constant folding) */
double ir_load(const kiln_tensor *t, int64_t i);
void ir_store(kiln_tensor *t, int64_t i, double v);
int64_t ir_load_i64(const kiln_tensor *t, int64_t i);
void ir_store_i64(kiln_tensor *t, int64_t i, int64_t v);

#endif /* KILN_IR_H */
