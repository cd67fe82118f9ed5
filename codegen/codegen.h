/*
 * codegen.h: the kernel IR, its lowering, evaluation and memory plan;
 * private to the library, one section per file (kernel.c, lower*.c,
 * keval.c, memplan.c).  The backends that read it sit behind backend.h.
 *
 * A cg_module is what a graph becomes before any backend sees it: a list of
 * buffers (inputs, outputs, weights, planned scratch) and an ordered list of
 * kernels, each a small statement tree of loop nests over those buffers with
 * i64 index expressions, scalar locals for reductions, and hints (parallel,
 * vectorize, unroll).  Matrix products are one leaf statement, CG_GEMM, that
 * every backend implements with its own tuned routine (the LLVM backend
 * emits a packed, register-blocked micro-kernel as vector IR; CUDA will emit
 * a tiled kernel).  Nothing here is LLVM-specific: a new backend is a
 * printer of this IR.
 *
 * Sizes may depend on the graph's symbols (the batch N): CG_SIZE k reads
 * runtime size k, bound when the generated library checks its inputs.
 */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include <stdbool.h>
#include <stdio.h>

#include "ir/ir.h"

/* ---- kernel IR (kernel.c) ---------------------------------------------- */

typedef enum cg_expr_kind {
	CG_CONST,  /* i (integer dtypes, bool, index) or f (float dtypes) */
	CG_VAR,    /* a loop variable or a local scalar: var */
	CG_SIZE,   /* runtime size: graph symbol number var (e.g. N) */
	CG_LOAD,   /* buf[a]; a is an i64 element index */
	CG_UN,     /* op(a) with op a cg_unop */
	CG_BIN,    /* op(a, b) with op a cg_binop */
	CG_SELECT, /* a ? b : c; a is bool */
	CG_CAST,   /* a converted to dt (float->int truncates toward zero) */
} cg_expr_kind;

typedef enum cg_unop {
	CG_NEG, CG_ABS, CG_EXP, CG_LOG, CG_SQRT, CG_TANH, CG_ERF, CG_SIN, CG_COS,
	CG_FLOOR, CG_CEIL, CG_ROUND, CG_NOT, /* ROUND: to nearest, ties to even; NOT: bool */
	CG_ATAN, CG_ASIN, CG_ACOS, /* libm calls */
	CG_SIGMOID,                /* 1 / (1 + exp(-a)) */
	CG_UNOP_COUNT
} cg_unop;

typedef enum cg_binop {
	CG_ADD, CG_SUB, CG_MUL, CG_DIV, /* int DIV truncates toward zero */
	CG_REM,                          /* int only, C semantics */
	CG_MIN, CG_MAX, CG_POW,
	CG_EQ, CG_NE, CG_LT, CG_LE, CG_GT, CG_GE, /* -> bool */
	CG_AND, CG_OR,                            /* bool */
	CG_XOR, CG_SHR, /* i64 only: bitwise xor, logical shift right (0..63);
	                 * Dropout's generator (added by lower) */
	CG_BINOP_COUNT
} cg_binop;

typedef struct cg_expr cg_expr;
struct cg_expr {
	cg_expr_kind kind;
	kiln_dtype dt;   /* result dtype; index arithmetic is KILN_I64 */
	int op;          /* cg_unop / cg_binop */
	int var;         /* CG_VAR: variable; CG_SIZE: symbol number */
	int buf;         /* CG_LOAD */
	int64_t i;       /* CG_CONST, integer dtypes */
	double f;        /* CG_CONST, float dtypes */
	cg_expr *a, *b, *c;
};

typedef enum cg_stmt_kind {
	CG_BLOCK,  /* items[0..n) in order */
	CG_FOR,    /* for (var = 0; var < extent; var++) body */
	CG_STORE,  /* buf[index] = value */
	CG_ASSIGN, /* var = value (a local scalar of type dt) */
	CG_IF,     /* if (cond) then else (else may be NULL) */
	CG_GEMM,   /* gemm (see cg_gemm) */
	CG_TRANSPOSE, /* a 2-D transposition between buffers (see cg_transpose) */
	CG_CHECK,  /* unless lo <= value < hi (i64): the run fails with "<what>
	              <value> out of range [lo, hi)" after this kernel, which
	              carries on (the first failed check of a run is reported);
	              lo and hi NULL: unless value != 0, failing with "<what>" */
} cg_stmt_kind;

enum {
	CG_PARALLEL = 1 << 0,  /* iterations independent: may run on threads */
	CG_VECTORIZE = 1 << 1, /* innermost, contiguous: vectorize */
	CG_UNROLL = 1 << 2,    /* small constant extent: unroll */
	CG_REDUCE = 1 << 3,    /* carries a reduction in a local (reassociable) */
	CG_LANES = 1 << 4,     /* with CG_VECTORIZE, a constant extent W: one vector
	                        * of W lanes; a backend may emit the body once on
	                        * vectors (codegen/llvm.c, s_lanes) */
	CG_TAIL_MASK = 1 << 5, /* with CG_VECTORIZE, a short run (a row of a few
	                        * vectors): the last partial vector under a mask
	                        * rather than element by element */
};

/* The activation a GEMM's epilogue applies (data, not code: a backend
 * maps each to its own instructions). */
typedef enum cg_act {
	CG_ACT_NONE = 0,
	CG_ACT_RELU = 1,  /* max(x, 0), NaN kept */
	CG_ACT_CLIP = 2,  /* min(max(x, act_lo), act_hi) */
	CG_ACT_COUNT
} cg_act;

/* Where a per-row, per-column or per-tensor epilogue operand lives. */
enum {
	CG_AXIS_NONE = 0, /* not present */
	CG_AXIS_COL = 1,  /* v[off + n] */
	CG_AXIS_ROW = 2,  /* v[off + m] */
	CG_AXIS_ALL = 3,  /* v[off]: one value for the whole product */
};

typedef struct cg_gemm_vec {
	int buf;
	cg_expr *off;
	int axis;                     /* CG_AXIS_*; NONE: absent (buf unused) */
} cg_gemm_vec;

/* C[b] = epilogue(alpha * A[b] x B[b] + beta * C[b]), for b in [0, batch).
 * Element (m,k) of A[b] is A[a_off + b*a_bs + m*a_rs + k*a_cs]; B, C
 * likewise, so transposes are just strides.
 *
 * Types: a_dt, b_dt, c_dt are the element types of A, B, C and acc_dt the
 * type products are summed in; cg_gemm_stmt fills any left 0 (invalid)
 * from the buffers, acc_dt from C.  Each element is, in this order:
 *   acc = sum_k (A - a_zero) * (B - b_zero)     (in acc_dt)
 *   v = alpha * acc + beta * C + bias           (bias in acc units, as
 *                                                QLinearConv's int32 bias)
 *   v = act(v * scale) + residual + c_zero      (scale: requantization;
 *       residual R[res_off + b*c_bs + m*res_rs + n]; with res_first it
 *       is added before scale and act instead: relu(conv + x) of ResNet)
 *   C = v converted to c_dt (an integer C: rounded half to even, saturated).
 * cg_eval implements all of it; which parts a backend implements is its
 * supports()'s answer.  Today's lowering makes f32 GEMMs with bias,
 * relu or clip and a res_first residual only. */
typedef struct cg_gemm {
	int a, b, c, bias;            /* buffers; bias -1 when none */
	cg_expr *M, *N, *K, *batch;
	cg_expr *a_off, *a_bs, *a_rs, *a_cs;
	cg_expr *b_off, *b_bs, *b_rs, *b_cs;
	cg_expr *c_off, *c_bs, *c_rs; /* C is row-major within a batch: c_cs = 1 */
	cg_expr *bias_off;
	double alpha, beta;
	int bias_axis;                /* 0: none, 1: bias[n] per column, 2: bias[m] per row */
	cg_act act;                   /* fused activation */
	double act_lo, act_hi;        /* CG_ACT_CLIP's bounds */
	kiln_dtype a_dt, b_dt, c_dt, acc_dt;
	cg_gemm_vec scale;            /* requantization scale (f32) */
	cg_gemm_vec a_zero, b_zero, c_zero; /* zero points */
	bool has_b_rows;              /* B's row k starts at b_rows[k] (a constant i64 buffer of K
	                                 offsets) instead of k*b_rs: an implicit im2col (int8) */
	int b_rows;
	int a_panel;                  /* > 0: A is packed in row panels this tall, each K
	                                 columns of a_panel floats, zero past M: element
	                                 (m, k) at a_off + (m / a_panel) * K * a_panel +
	                                 k * a_panel + m % a_panel (a_rs, a_cs, a_bs unused);
	                                 cg_prepack, for kiln_sgemm_pa */
	int b_panel;                  /* > 0: B is packed in column panels this wide, each
	                                 CG_PANEL_ROWS(K) rows of b_panel floats (rows from K
	                                 on and columns past N zero): element (k, n) at b_off
	                                 + (n / b_panel) * CG_PANEL_ROWS(K) * b_panel
	                                 + k * b_panel + n % b_panel (b_rs, b_cs, b_bs
	                                 unused); cg_prepack makes them for the LLVM
	                                 backend's kiln_sgemm_pb */
	int b_block;                  /* > 0: B's rows in blocks of this many, K a multiple of
	                                 it: element (k, n) at b_off + b*b_bs + (k / b_block) *
	                                 b_block * b_rs + n * b_block + k % b_block, b_rs = N
	                                 (cg_buf.block's layout, read by a 1x1 conv); as
	                                 c_block, kiln_sgemm_pm's only */
	int c_block;                  /* > 0: C's rows (a conv's channels) in blocks of this
	                                 many, M a multiple of it: element (m, n) at c_off +
	                                 b*c_bs + (m / c_block) * c_block * c_rs + n * c_block
	                                 + m % c_block, c_rs = N (the buffer's cg_buf.block
	                                 layout); no residual.  The LLVM backend writes it
	                                 from kiln_sgemm_pm only (A in its a_lanes panels) */
	bool has_residual;            /* residual: a buffer added after act */
	bool res_first;               /* ... or before scale and act */
	int residual;
	cg_expr *res_off, *res_rs;
} cg_gemm;

/* The column-panel width of the LLVM backend's packed constant B
 * (cg_gemm.b_panel): a 64-byte line per row per panel.  Narrow panels
 * measured better than the micro-kernel's width (64 with AVX-512): an MLP
 * at batch 16 reads each vector of a tile row from its own stream, 12%
 * less time than the original layout, where 64-wide panels took 5% more. */
#define CG_SGEMM_PANEL 16

/* Rows per panel of a packed B (cg_gemm.b_panel) for a K-row GEMM: K made
 * odd.  A batch-1 GEMM streams 16 panels at once (the axpy form), row k of
 * each; with K * 64 bytes a multiple of 4 KiB (K = 512) all 16 rows fell in
 * one L1 set (8 ways) and missed: an odd number of lines between panels
 * puts them in 16 different sets.  The bench MLP's 512 -> 512 layer at
 * batch 1: 20.8 -> 10-11 us. */
#define CG_PANEL_ROWS(K) ((K) | 1)

/* The panels a backend's GEMM reads constant operands in (cg_prepack). */
typedef struct cg_panels {
	int a;      /* > 0: a constant A in row panels this tall (cg_gemm.a_panel) */
	int b;      /* > 0: a constant B in column panels this wide (cg_gemm.b_panel) */
	int b_wide; /* > 0: ... this wide instead when the GEMM has a fixed M of more
	               than CG_WIDE_MIN_M rows and more than 2 * b_wide columns: the
	               LLVM GEMM's blocked path, whose micro-kernel reads these
	               panels in place instead of copying B's on every call */
	int a_lanes;       /* > 0: a constant A in row panels this tall instead, for the
	                      GEMM whose micro-kernel has A's rows in its lanes, when
	                      B's rows are contiguous, C at most a_lanes_max_n
	                      columns wide, K at least a_lanes_min_k and M wastes at
	                      most an eighth of the last panel (LLVM: kiln_sgemm_pm) */
	int a_lanes_max_n, a_lanes_min_k;
	int c_block;       /* > 0: that GEMM also writes C in blocks of this many rows
	                      (cg_gemm.c_block): its vector width; at any K, C up to
	                      c_block_max_n columns wide; an A of one panel will do */
	int c_block_max_n;
} cg_panels;

/* The LLVM GEMM (llvm_gemm.c) takes its blocked path for more than 64 rows
 * and more than two micro-kernel panels of columns (TILE_M = 32; 33 to 64
 * rows only past 1024 columns). */
#define CG_WIDE_MIN_M 64

/* The largest K of an 8-bit GEMM (A, B u8 or i8, i32 sums): the LLVM
 * backend packs a whole K x panel of B into its per-thread scratch; the
 * lowering uses loop nests beyond it. */
#define CG_QGEMM_MAX_K 16384

/* Whether g is an 8-bit GEMM the backends' int8 kernels take: A and B u8
 * or i8, i32 sums, C u8, i8, i32 or f32, A's and B's rows contiguous (B's
 * at a stride or at b_rows' offsets),
 * alpha 1, beta 0, no residual, zero points of A per row or one value, of
 * B per column or one value, of C one value, a constant K at most
 * CG_QGEMM_MAX_K.  (cg_eval takes every GEMM.) */
bool cg_gemm_is_int8(const cg_gemm *g);

/* Whether g is a plain GEMM: every type f32, no scale or zero points, B's
 * rows at a stride, a residual only before act, act none, relu or clip (what the lowering
 * makes today). */
bool cg_gemm_is_f32(const cg_gemm *g);

/* dst[dst_off + j*dst_rs + i] = src[src_off + i*src_rs + j] for i < rows,
 * j < cols, both buffers f32: row i of the source (contiguous) becomes
 * column i of the destination (whose rows are contiguous).  A loop nest
 * would gather or scatter on one side; a backend transposes W x W blocks
 * in registers instead.  Layout changes use it (a Winograd conv's copies
 * between NCHW and channels-last). */
typedef struct cg_transpose {
	int src, dst;
	cg_expr *rows, *cols;
	cg_expr *src_off, *src_rs, *dst_off, *dst_rs;
} cg_transpose;

typedef struct cg_stmt cg_stmt;
struct cg_stmt {
	cg_stmt_kind kind;
	cg_stmt **items;       /* CG_BLOCK */
	int n, cap;
	int var;               /* CG_FOR, CG_ASSIGN */
	kiln_dtype dt;         /* CG_ASSIGN: the local's dtype */
	cg_expr *extent;       /* CG_FOR */
	uint32_t hints;        /* CG_FOR: CG_PARALLEL ... */
	cg_stmt *body;         /* CG_FOR */
	int buf;               /* CG_STORE */
	cg_expr *index, *value;
	cg_expr *cond;         /* CG_IF */
	cg_stmt *then_s, *else_s;
	cg_gemm *gemm;         /* CG_GEMM */
	cg_transpose *tr;      /* CG_TRANSPOSE */
	cg_expr *lo, *hi;      /* CG_CHECK: the range of value (NULL: nonzero) */
	const char *what;      /* CG_CHECK: "file:12: Gather 'g': index" */
};

typedef enum cg_buf_kind {
	CG_BUF_INPUT,  /* caller's input, read-only */
	CG_BUF_OUTPUT, /* caller's output */
	CG_BUF_CONST,  /* weights and constants: data embedded in the library */
	CG_BUF_TEMP,   /* intermediate: lives in the planned scratch arena */
	CG_BUF_STATE,  /* training state (a parameter a step replaces): owned by the
	                  context, io_index is its index in the state table */
} cg_buf_kind;

typedef struct cg_buf {
	int id;
	cg_buf_kind kind;
	kiln_dtype dt;
	const char *name;      /* value name, or NULL */
	uint32_t value;        /* graph value it holds (0 for kernel scratch) */
	ir_type type;          /* its shape, dims possibly symbolic (a backend reads
	                          only type.rank, and type.dim[d] where dim[d] is NULL) */
	cg_expr *dim[KILN_MAX_RANK]; /* each dim as an i64 expression over CG_SIZE
	                          (cg_module_describe); NULL: type.dim[d] is fixed */
	const char *type_text; /* INPUT/OUTPUT: "f32[N,784]", for headers and messages */
	cg_expr *numel;        /* element count, may use CG_SIZE */
	const kiln_tensor *data; /* CG_BUF_CONST */
	int alias;             /* >= 0: a view of buffer alias (same bytes) */
	int io_index;          /* INPUT/OUTPUT: position in the signature */
	/* memory plan (memplan.c): TEMP buffers share slots by lifetime */
	int slot;              /* -1: not planned */
	int first, last;       /* first and last kernel touching it */
	/* >= 0: internal to chunked run chunk (chunk.c): touched by no kernel
	 * outside it, so it holds one chunk of the batch and is sized for it */
	int chunk;
	/* > 0: an activation [N, C, spatial...] stored with its channels in
	 * blocks of this many, [N][C / block][spatial][block] (C a multiple
	 * of it), between a producer and a reader that both take it with no
	 * transpose: a 1x1 conv's GEMM (cg_gemm.c_block) for a depthwise conv
	 * (dw_blocked), that one for a 1x1 conv's GEMM (cg_gemm.b_block),
	 * element-wise ops between them keeping it (lower.c's blocked_chain).
	 * 0: row-major. */
	int block;
} cg_buf;

typedef struct cg_kernel {
	const char *name;      /* "k3_conv" ... unique within the module */
	uint32_t node;         /* graph node index it came from (for messages) */
	const char *origin;    /* that node described ("Gather 'emb' at m.c:12"), or NULL */
	cg_stmt *body;
	int nvar;              /* variables 0..nvar-1 (loop vars and locals) */
	/* >= 0: every CG_STORE this kernel makes to buffer final_buf is a
	 * final value of that buffer, made once per element at the element's
	 * linear index (other statements may write it before) (a depthwise conv's, a Winograd conv's last kernel): an
	 * activation or a same-shape residual Add after it folds into those
	 * stores (lower.c); final_act: an activation already has */
	int final_buf;
	bool final_act;
	/* >= 0: where an activation (an elementwise fold that ignores the
	 * index: not a residual) folds instead: a buffer whose stored values
	 * the kernel then copies, unchanged, to final_buf (a small-plane
	 * depthwise conv's flat rows, a long vector loop, where the copy is
	 * rows of 7 or 14); -1: final_buf itself */
	int act_buf;
	/* the kernel writes final_buf other than by CG_STOREs (transposes):
	 * only an activation folds (into act_buf), a residual cannot */
	bool final_act_only;
	/* >= 0: the kernel that computes the same buffer when guard is false
	 * (the other algorithm of a choice made at run time); an activation or
	 * residual folded into this kernel's stores folds into that kernel's
	 * GEMM epilogue too (lower.c) */
	int alt;
	/* NULL, or a bool expression over the sizes (CG_SIZE): the kernel runs
	 * only where it is true.  A lowering that picks its algorithm by the
	 * batch at run time emits both, each kernel guarded. */
	cg_expr *guard;
} cg_kernel;

/* Algorithms an f32 convolution may be lowered with. */
typedef enum cg_conv_algo {
	CG_CONV_AUTO = 0,  /* per layer, by lower_nn.c's cost model */
	CG_CONV_IM2COL,    /* im2col + GEMM (a 1x1 conv: the GEMM alone) */
	CG_CONV_WINOGRAD,  /* F(4x4, 3x3) wherever it applies (2-D 3x3, stride and dilation 1) */
	CG_CONV_DIRECT,    /* grouped 2-D convs (not depthwise): lower_nn.c's direct
	                      kernel wherever it applies; the rest as CG_CONV_AUTO */
} cg_conv_algo;

/* A run of consecutive kernels executed chunk by chunk over the batch
 * (chunk.c): for each chunk of `chunk` samples, kernels first..last run in
 * order with symbol sym bound to the chunk's size and each buffer of off[]
 * moved to the chunk's first sample: alias-class roots, since a kernel reads
 * its class's one pointer, whose views the run touches are sample-major
 * (dim 0 is the symbol) with the root's numel.
 * Buffers internal to the run (cg_buf.chunk) keep their base and hold one
 * chunk; every other buffer it touches lives across the whole run. */
typedef struct cg_chunk_run {
	int first, last;       /* kernels, inclusive */
	int sym;               /* the batch symbol */
	int chunk;             /* samples per chunk (>= 1) */
	int *off, noff;        /* roots offset per chunk (arena-allocated) */
} cg_chunk_run;

typedef struct cg_module {
	ir_arena *arena;       /* all statements, expressions, names */
	const kiln_graph *g;   /* lowering, keval and cg_print only: no backend reads it */
	const char *name;      /* the graph's name, or NULL */
	const char **symname;  /* nsym symbol names ("N"), or NULL */
	cg_buf *buf;           /* malloc'd */
	int nbuf, capbuf;
	cg_kernel *kern;       /* malloc'd; run in this order */
	int nkern, capkern;
	int nsym;              /* runtime sizes: the graph's symbols */
	int *inputs, ninputs;  /* buffer ids in signature order */
	int *outputs, noutputs;
	/* memory plan: slot sizes in bytes are max over their buffers, each
	 * buffer's size computed at run time from its numel expression */
	int nslot;
	/* lowering choice (cg_lower_opts.conv): the algorithm for f32
	 * convolutions, CG_CONV_AUTO letting the cost model pick per layer */
	int conv;
	cg_chunk_run *chunk;   /* arena-allocated, in kernel order (chunk.c) */
	int nchunk;
	/* lowering choice (cg_lower_opts.par_work): the work from which a
	 * nest's outer loop is CG_PARALLEL; 0: CG_PAR_WORK */
	int64_t par_work;
	/* lowering choice (cg_lower_opts.panels): the panels cg_prepack will
	 * give constant GEMM operands; all 0 when it will not run */
	cg_panels panels;
} cg_module;

cg_module *cg_module_new(const kiln_graph *g);
void cg_module_free(cg_module *m);
/* Records in m what a backend needs from the graph, so that none reads it:
 * name, symbol names, every buffer's dims as expressions, I/O type texts,
 * kernel origins.  cg_lower calls it last; a hand-built module without a
 * graph needs none of it (fixed dims, no symbols).  KILN_ENOMEM or OK. */
kiln_status cg_module_describe(cg_module *m);
int cg_buf_new(cg_module *m, cg_buf_kind kind, kiln_dtype dt, cg_expr *numel);
/* Buffer b's channel blocks (cg_buf.block), its alias's for a view; 0 for
 * none or no such buffer. */
int cg_buf_block(const cg_module *m, int b);
cg_kernel *cg_kernel_new(cg_module *m, const char *name, uint32_t node);
int cg_var_new(cg_kernel *k);
/* expression builders (arena-allocated; NULL-safe: NULL in -> NULL out) */
cg_expr *cg_int(cg_module *m, int64_t v);             /* i64 constant */
cg_expr *cg_const(cg_module *m, kiln_dtype dt, double v);
cg_expr *cg_var(cg_module *m, int var, kiln_dtype dt);
cg_expr *cg_size(cg_module *m, int sym);
cg_expr *cg_load(cg_module *m, int buf, cg_expr *index);
cg_expr *cg_un(cg_module *m, cg_unop op, cg_expr *a);
cg_expr *cg_bin(cg_module *m, cg_binop op, cg_expr *a, cg_expr *b); /* folds constants */
cg_expr *cg_select(cg_module *m, cg_expr *c, cg_expr *a, cg_expr *b);
cg_expr *cg_cast(cg_module *m, cg_expr *a, kiln_dtype dt);
/* an ir dim (fixed or symbolic expression) as an i64 expression */
cg_expr *cg_dim(cg_module *m, int64_t dim);
/* statement builders */
cg_stmt *cg_block(cg_module *m);
void cg_append(cg_module *m, cg_stmt *block, cg_stmt *s);
cg_stmt *cg_for(cg_module *m, int var, cg_expr *extent, uint32_t hints, cg_stmt *body);
cg_stmt *cg_store(cg_module *m, int buf, cg_expr *index, cg_expr *value);
cg_stmt *cg_assign(cg_module *m, int var, kiln_dtype dt, cg_expr *value);
cg_stmt *cg_if(cg_module *m, cg_expr *cond, cg_stmt *then_s, cg_stmt *else_s);
cg_stmt *cg_gemm_stmt(cg_module *m, const cg_gemm *gm);
cg_stmt *cg_transpose_stmt(cg_module *m, const cg_transpose *t);
/* lo and hi both NULL: a check that value is not 0 */
cg_stmt *cg_check(cg_module *m, const char *what, cg_expr *value, cg_expr *lo, cg_expr *hi);
/* Textual dump of the whole module (`kiln compile --emit=kir`). */
void cg_print(const cg_module *m, FILE *out);
/* The module's graph as Graphviz text with each kernel a cluster around the
 * nodes fused into it (`kiln compile --emit=dot`, dot_groups.c).  malloc'd;
 * NULL on ENOMEM or when m has no graph. */
char *cg_module_dot(const cg_module *m);
/* A text equal for two kernels of m exactly when they compute the same
 * thing with their buffers renamed consistently: the body as cg_print
 * prints it, each buffer written as its root's index in order of first
 * appearance and its dtype.  canon (m->nbuf entries) gets root -> that
 * index (-1: unused), *nroot their count.  malloc'd; NULL on ENOMEM.  A
 * backend emits one function for kernels with equal keys. */
char *cg_kernel_key(const cg_module *m, const cg_kernel *k, int *canon, int *nroot);
/* Value of an index expression (constants, sizes, + - * / % min max) with
 * sym[k] for each symbol, or 1 for every symbol when sym is NULL (a static
 * size estimate); -1 when it reads a variable or a buffer. */
int64_t cg_expr_int(const cg_expr *e, const int64_t *sym);

/* ---- lowering (lower.c, lower_nn.c) ------------------------------------- */

/* Graph -> kernels.  The graph must verify; shape/view ops (Reshape,
 * Flatten, Squeeze, Unsqueeze, Identity) become buffer aliases, not
 * kernels.  Errors name the node and op (KILN_EUNSUPPORTED for an op or
 * dtype without a lowering).
 *
 * What the lowering guarantees, and what a backend must implement (the
 * oracle for all of it is cg_eval in keval.c):
 * - Buffers: inputs, then parameters, then node results in schedule order.
 *   A graph output is written in place (kind OUTPUT, io_index set) unless
 *   it is an input, a constant, a view or listed twice: then a copy kernel
 *   fills a fresh OUTPUT buffer.  An alias buffer (views, inference-mode
 *   Dropout) has kind TEMP, alias = its root (never itself an alias, always
 *   a smaller id) and slot -1.  Kernel-private scratch (im2col columns,
 *   softmax-CE log-probabilities) is TEMP with value 0, planned like the
 *   rest.  Unused extra outputs (Dropout's mask, BatchNorm's and
 *   LayerNorm's statistics) get no buffer and are not computed.
 * - Loops: i64 variables from 0 to extent, step 1.  CG_PARALLEL is only
 *   ever on a loop that is a direct child of the kernel body and that reads
 *   no local assigned outside it (so an outlined body needs nothing but
 *   rt_exec); it may also carry CG_VECTORIZE (one flat loop: split the
 *   range over threads, vectorize each chunk).  Locals (CG_ASSIGN targets)
 *   are per-iteration private when assigned inside a loop; a local assigned
 *   in a CG_REDUCE loop may be reassociated.
 * - CG_GEMM may sit inside sequential loops (Conv: one per image), its
 *   offsets using the loop variables.
 * - Integer arithmetic wraps (no nsw/nuw); CG_DIV/CG_REM never see a zero
 *   or -1 divisor at run time (integer Div divides by a made-safe divisor
 *   and selects: x/0 gives 0, x/-1 is -x); CG_REM is C's (srem).  CG_XOR and
 *   CG_SHR (logical) are i64, used by training-mode Dropout only.
 * - With cg_lower_ex(.fuse = true) (what kiln_compile uses), a chain of
 *   elementwise nodes whose intermediates have one reader of the same shape
 *   and are no graph output is one kernel named after its ops
 *   ("k2_add_relu"); the intermediates get no buffer and are not computed
 *   on their own.
 * - Both arms of CG_SELECT are safe to evaluate: indices that may leave a
 *   buffer (padding taps, Gather indices, loss targets) are clamped first.
 *   Where the interpreter rejects such an index (Gather's indices, a loss's
 *   targets), a CG_CHECK of every one runs before it is used clamped, so the
 *   run fails with the interpreter's reason (a backend records the first
 *   failed check of a run, from any thread, and fails the run after that
 *   kernel: rt_out_of_range in runtime/model.h).  Likewise every divisor of
 *   an integer Div is checked (nonzero) before the division, which is never
 *   fused with other nodes.
 * - Float CG_MAX/CG_MIN propagate NaN: max(a, b) = (a > b || a != a) ? a : b
 *   (Relu is max(x, 0)).  Comparisons are ordered (NaN: false; CG_NE true).
 * - CG_CAST: float -> integer truncates toward zero and saturates to the
 *   target's range, NaN -> 0 (llvm.fptosi.sat); float -> bool is x != 0
 *   (NaN true); integer -> integer wraps (u8 and bool sources are
 *   unsigned); integer -> float rounds once; f16/bf16 round to nearest even.
 * - f16 and bf16 buffers are only loaded and stored: arithmetic on them is
 *   done in f32 (loads wrapped in CG_CAST to f32, stores in CG_CAST back).
 *   Bools are one byte, 0 or 1, in memory.
 * - Index expressions are i64 and non-negative; CG_SIZE k is symbol k
 *   (rt_exec.sym[k]). */
kiln_status cg_lower(const kiln_graph *g, cg_module **out, kiln_error *err);
typedef kiln_status (*cg_lower_fn)(cg_module *m, const ir_node *n, const int *in,
                                   const int *out, kiln_error *err);
extern const cg_lower_fn cg_lower_table[KILN_OP_COUNT];
/* op's entry in cg_lower_table, or the elementwise lowering of its formula
 * in ir_scalar_table (NULL: none) */
cg_lower_fn cg_lower_rule(kiln_op op);

/* ---- evaluation of kernel IR (keval.c) ---------------------------------- */

/* Runs a module on concrete tensors (inputs in signature order), the way a
 * backend would, in double/int64: the oracle that tests lowering against
 * the graph interpreter without any backend.  After cg_memplan, TEMP
 * buffers share their planned slots (so a bad plan gives wrong answers);
 * every load and store is bounds-checked (KILN_EVERIFY naming the kernel). */
kiln_status cg_eval(const cg_module *m, kiln_tensor *const *inputs, int ninputs,
                    kiln_tensor **outputs, int noutputs, kiln_error *err);

/* ---- memory planning (memplan.c) --------------------------------------- */

/* Assigns TEMP buffers (following aliases) to slots by lifetime so that
 * buffers live at the same time never share one; fills slot/first/last and
 * m->nslot. */
kiln_status cg_memplan(cg_module *m, kiln_error *err);
/* Where a training step can stop between backward and the optimizer:
 * *split, the first kernel after the last store to any of bufs (the
 * gradients, through their aliases), and ready[i], the last kernel before
 * it that touches bufs[i] (its writer, or a later backward kernel that
 * reads it: BatchNorm's dx reads dgamma).  It relies on the step graph
 * placing every optimizer node after every gradient (driver/train.c) and
 * the lowering keeping node order. */
kiln_status cg_grad_split(const cg_module *m, const int *bufs, int n, int *ready, int *split,
                          kiln_error *err);
/* The last kernel storing buffer buf (through its aliases); -1 if none. */
int cg_last_store(const cg_module *m, int buf);
/* Calls fn(ctx, buf, write) for every buffer statement s reads or writes
 * (buffer ids as written, aliases not followed; a buffer may repeat). */
void cg_stmt_bufs(const cg_stmt *s, void (*fn)(void *ctx, int buf, bool write), void *ctx);

/* ---- batch chunking (chunk.c) ------------------------------------------ */

/* How cg_chunk picks chunk sizes. */
typedef struct cg_chunk_opts {
	int force;             /* > 0: this many samples per chunk wherever a run
	                          may be chunked; < 0: no chunking; 0: the cost model */
	int64_t cache_bytes;   /* the cost model's budget per chunk (the host's L2) */
} cg_chunk_opts;

/* Finds runs of consecutive per-sample kernels over a symbolic batch whose
 * working set per sample is large against the cache, and records them in
 * m->chunk with the buffers internal to each (cg_buf.chunk); before
 * cg_memplan, which keeps every other buffer a run touches alive across the
 * whole run.  KILN_ENOMEM or OK. */
kiln_status cg_chunk(cg_module *m, const cg_chunk_opts *o, kiln_error *err);
/* prepack.c: packs the B of each plain f32 GEMM whose B is a constant
 * matrix (fixed N and K, rows contiguous and N apart) in column panels
 * b_panel wide (a power of two; cg_gemm.b_panel), else its A, when that is
 * a constant matrix (fixed M and K, rows contiguous and K apart), in row
 * panels a_panel tall, alpha folded in (cg_gemm.a_panel); 0: not that
 * operand.  One packed copy per weight, offset (and alpha); a weight no
 * kernel reads any more keeps no data.  For a CPU library, before
 * cg_memplan.  KILN_ENOMEM or OK. */
kiln_status cg_prepack(cg_module *m, const cg_panels *p, kiln_error *err);
/* Empties every constant no kernel reads and nothing views (a weight
 * prepacked, split per part by cg_lower_conv_parts, or transformed at
 * compile time for Winograd): the library keeps one copy of each weight.
 * cg_prepack ends with it; kiln_compile runs it where cg_prepack does not
 * (CUDA, KILN_PREPACK=0).  Before cg_memplan.  KILN_ENOMEM or OK. */
kiln_status cg_drop_unread(cg_module *m, kiln_error *err);
/* Whether cg_prepack gives an M x N x K GEMM's constant A (B's rows
 * contiguous, A's K apart, whole) the a_lanes panels of p: rather than
 * its a ones, or none (too few rows).  blocked: a GEMM with C or B in
 * blocks (cg_gemm.c_block, b_block), which only that GEMM computes,
 * within its limits (p->c_block_max_n); the caller checks M or K is a
 * multiple of p->c_block. */
bool cg_prepack_lanes_fit(const cg_panels *p, int64_t M, int64_t N, int64_t K, bool blocked);
/* The host's L2 cache per core in bytes (1 MiB when it cannot tell). */
int64_t cg_host_l2_bytes(void);

#endif /* KILN_CODEGEN_H */
