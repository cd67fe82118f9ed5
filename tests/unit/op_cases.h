/*
 * op_cases.h: the op fixture cases every backend is checked against, and
 * the helpers that turn a case into a runnable one-node graph; included by
 * test executables only (test_interp.c, test_lower.c, ...).
 *
 * Each case names a fixture prefix in tests/fixtures/ops (written by
 * make_op_fixtures.py; keep its tables and these in step), the op and its
 * attributes as "name=value" text parsed with the op's schema.  Its inputs
 * are <case>_in<k>.npy and it has as many outputs as there are
 * <case>_out<k>.npy files.  A backend test walks the cases as
 *
 *     START_TEST(op_matches_torch)
 *     {
 *             opcase_graph c = opcase_build(opcase_get(_i));
 *             ... run c.g on c.in, check with expect_close(c.name, got, c.want,
 *                 c.nout, c.tol) ...
 *             opcase_free(&c);
 *     }
 *     opcase_add_tcases(suite, op_matches_torch);  one TCase per group
 *
 * The key idea: the cases live in one flat numbering over the groups, so a
 * single loop test covers them and each group still gets its own TCase
 * (CK_RUN_CASE=conv runs the convolutions).  Tolerances: 1e-5 unless the
 * case says otherwise (1e-12 for f64); integers and bools compare exactly.
 *
 * Below the cases are short helpers for graphs built by hand (tensor,
 * input, op1), unprefixed as in so_util.h: a test that includes this
 * header uses them rather than its own.
 */
#ifndef KILN_OP_CASES_H
#define KILN_OP_CASES_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>

#include "ir/ir.h"
#include "testutil.h"

#ifndef KILN_FIXTURES
#error "KILN_FIXTURES must name tests/fixtures"
#endif

typedef struct opcase {
	const char *name;  /* fixture prefix */
	kiln_op op;
	const char *attrs; /* "axes=0,2 keepdims=0 mode=reflect" */
	double tol;        /* 0: 1e-5 */
} opcase;

#define F64TOL 1e-12

/* ---- the cases ------------------------------------------------------------ */

static const opcase opcase_elementwise[] = {
	{"neg", KILN_OP_NEG, ""}, {"abs", KILN_OP_ABS, ""}, {"exp", KILN_OP_EXP, ""},
	{"log", KILN_OP_LOG, ""}, {"sqrt", KILN_OP_SQRT, ""},
	{"reciprocal", KILN_OP_RECIPROCAL, ""}, {"floor", KILN_OP_FLOOR, ""},
	{"ceil", KILN_OP_CEIL, ""}, {"sin", KILN_OP_SIN, ""}, {"cos", KILN_OP_COS, ""},
	{"atan", KILN_OP_ATAN, ""}, {"asin", KILN_OP_ASIN, ""}, {"acos", KILN_OP_ACOS, ""},
	{"relu", KILN_OP_RELU, ""}, {"sigmoid", KILN_OP_SIGMOID, ""}, {"tanh", KILN_OP_TANH, ""},
	{"erf", KILN_OP_ERF, ""}, {"identity", KILN_OP_IDENTITY, ""},
	{"leaky_relu", KILN_OP_LEAKY_RELU, "alpha=0.2"}, {"gelu", KILN_OP_GELU, ""},
	{"gelu_tanh", KILN_OP_GELU, "approximate=tanh"}, {"softplus", KILN_OP_SOFTPLUS, ""},
	{"hard_sigmoid", KILN_OP_HARD_SIGMOID, "alpha=0.25 beta=0.45"},
	{"hard_swish", KILN_OP_HARD_SWISH, ""}, {"mish", KILN_OP_MISH, ""},
	{"softsign", KILN_OP_SOFTSIGN, ""}, {"elu", KILN_OP_ELU, "alpha=0.5"},
	{"selu", KILN_OP_SELU, ""}, {"celu", KILN_OP_CELU, "alpha=2"},
	{"thresholded_relu", KILN_OP_THRESHOLDED_RELU, "alpha=0.3"},
	{"clip", KILN_OP_CLIP, "min=-0.5 max=0.7"}, {"clip_min_only", KILN_OP_CLIP, "min=0"},
	{"sigmoid_f64", KILN_OP_SIGMOID, "", F64TOL}, {"neg_i64", KILN_OP_NEG, ""},
	{"clip_i64", KILN_OP_CLIP, "min=-2 max=4"}, {"not", KILN_OP_NOT, ""},
	{"cast_f32_i32", KILN_OP_CAST, "to=i32"}, {"cast_f32_bool", KILN_OP_CAST, "to=bool"},
	{"cast_f32_f16", KILN_OP_CAST, "to=f16"}, {"cast_f16_f32", KILN_OP_CAST, "to=f32"},
	{"cast_f32_bf16", KILN_OP_CAST, "to=bf16"}, {"cast_i64_f32", KILN_OP_CAST, "to=f32"},
	{"cast_i64_i32", KILN_OP_CAST, "to=i32"}, {"cast_bool_f32", KILN_OP_CAST, "to=f32"},
};

static const opcase opcase_broadcasting[] = {
	{"add_bcast", KILN_OP_ADD, ""}, {"sub_bcast", KILN_OP_SUB, ""},
	{"mul_bcast", KILN_OP_MUL, ""}, {"div", KILN_OP_DIV, ""}, {"pow", KILN_OP_POW, ""},
	{"add_f64", KILN_OP_ADD, "", F64TOL}, {"add_i64", KILN_OP_ADD, ""},
	{"div_i64", KILN_OP_DIV, ""}, {"max3", KILN_OP_MAX, ""}, {"min2", KILN_OP_MIN, ""},
	{"equal", KILN_OP_EQUAL, ""}, {"less", KILN_OP_LESS, ""},
	{"greater", KILN_OP_GREATER, ""}, {"and", KILN_OP_AND, ""}, {"or", KILN_OP_OR, ""},
	{"where", KILN_OP_WHERE, ""},
};

static const opcase opcase_reductions[] = {
	{"reduce_sum", KILN_OP_REDUCE_SUM, "axes=1"},
	{"reduce_sum_all", KILN_OP_REDUCE_SUM, "keepdims=0"},
	{"reduce_mean", KILN_OP_REDUCE_MEAN, "axes=0,2 keepdims=0"},
	{"reduce_max", KILN_OP_REDUCE_MAX, "axes=-1"},
	{"reduce_min", KILN_OP_REDUCE_MIN, "axes=1 keepdims=0"},
	{"reduce_sum_noop", KILN_OP_REDUCE_SUM, "noop_with_empty_axes=1"},
	{"reduce_sum_i64", KILN_OP_REDUCE_SUM, "axes=0 keepdims=0"},
	{"reduce_prod", KILN_OP_REDUCE_PROD, "axes=1 keepdims=0"},
	{"reduce_prod_i64", KILN_OP_REDUCE_PROD, "axes=1"},
	{"argmax", KILN_OP_ARGMAX, "axis=1"},
	{"topk", KILN_OP_TOPK, "k=2 axis=1"},
	{"topk_smallest_i64", KILN_OP_TOPK, "k=3 largest=0"},
	{"argmax_last", KILN_OP_ARGMAX, "axis=1 keepdims=0 select_last_index=1"},
};

static const opcase opcase_linalg[] = {
	{"matmul", KILN_OP_MATMUL, ""}, {"matmul_batch", KILN_OP_MATMUL, ""},
	{"matmul_vec_mat", KILN_OP_MATMUL, ""}, {"matmul_mat_vec", KILN_OP_MATMUL, ""},
	{"matmul_vec_vec", KILN_OP_MATMUL, ""}, {"matmul_f64", KILN_OP_MATMUL, "", F64TOL},
	{"gemm", KILN_OP_GEMM, ""},
	{"gemm_trans", KILN_OP_GEMM, "alpha=0.5 beta=2 transA=1 transB=1"},
	{"gemm_no_c", KILN_OP_GEMM, ""},
};

static const opcase opcase_convs[] = {
	{"conv2d", KILN_OP_CONV, ""},
	{"conv2d_stride_pad", KILN_OP_CONV, "strides=2,2 pads=1,1,1,1"},
	{"conv2d_dilation", KILN_OP_CONV, "dilations=2,2 pads=1,2,1,2"},
	{"conv2d_groups", KILN_OP_CONV, "group=2"},
	{"conv1d", KILN_OP_CONV, "strides=2 pads=1,1"},
	{"conv3d", KILN_OP_CONV, "pads=1,1,1,1,1,1"},
	{"conv2d_f64", KILN_OP_CONV, "strides=2,2", F64TOL},
	{"conv2d_same_upper", KILN_OP_CONV, "auto_pad=SAME_UPPER strides=2,2"},
	{"conv_transpose2d", KILN_OP_CONV_TRANSPOSE, "strides=2,2 pads=1,1,1,1 output_padding=1,1"},
	{"conv_transpose1d_groups", KILN_OP_CONV_TRANSPOSE, "group=2 dilations=2"},
	{"conv_transpose1d_output_shape", KILN_OP_CONV_TRANSPOSE, "strides=2 output_shape=8"},
};

static const opcase opcase_pools[] = {
	{"max_pool", KILN_OP_MAX_POOL, "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"},
	{"max_pool_dilation", KILN_OP_MAX_POOL, "kernel_shape=2,2 dilations=2,2 strides=2,2"},
	{"max_pool_ceil", KILN_OP_MAX_POOL, "kernel_shape=3,3 strides=2,2 ceil_mode=1"},
	{"max_pool1d", KILN_OP_MAX_POOL, "kernel_shape=3 strides=2 pads=1,1"},
	{"avg_pool", KILN_OP_AVERAGE_POOL, "kernel_shape=2,2 strides=2,2"},
	{"avg_pool_pad_incl", KILN_OP_AVERAGE_POOL,
	 "kernel_shape=3,3 strides=2,2 pads=1,1,1,1 count_include_pad=1"},
	{"avg_pool_pad_excl", KILN_OP_AVERAGE_POOL, "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"},
	{"avg_pool_ceil", KILN_OP_AVERAGE_POOL, "kernel_shape=3,3 strides=2,2 ceil_mode=1"},
	{"global_average_pool", KILN_OP_GLOBAL_AVERAGE_POOL, ""},
};

static const opcase opcase_norms[] = {
	{"batch_norm", KILN_OP_BATCH_NORM, ""},
	{"batch_norm_train", KILN_OP_BATCH_NORM, "training_mode=1 epsilon=0.001"},
	{"layer_norm", KILN_OP_LAYER_NORM, ""},
	{"layer_norm_stats", KILN_OP_LAYER_NORM, "axis=1 epsilon=0.001"},
	{"layer_norm_f64", KILN_OP_LAYER_NORM, "", F64TOL},
	{"softmax", KILN_OP_SOFTMAX, "axis=1"}, {"softmax_axis0", KILN_OP_SOFTMAX, "axis=0"},
	{"log_softmax", KILN_OP_LOG_SOFTMAX, ""}, {"softmax_f64", KILN_OP_SOFTMAX, "", F64TOL},
};

static const opcase opcase_movement[] = {
	{"reshape", KILN_OP_RESHAPE, "shape=4,6"},
	{"transpose", KILN_OP_TRANSPOSE, "perm=1,2,0"},
	{"transpose_default", KILN_OP_TRANSPOSE, ""},
	{"concat", KILN_OP_CONCAT, "axis=1"},
	{"split", KILN_OP_SPLIT, "axis=1"},
	{"split_sizes", KILN_OP_SPLIT, "axis=0 split=1,4"},
	{"slice_neg_step", KILN_OP_SLICE, "starts=-1,4 ends=-1000,0 axes=0,1 steps=-2,-1"},
	{"slice_clamp", KILN_OP_SLICE, "starts=-100,1 ends=100,1000 axes=1,2"},
	{"range", KILN_OP_RANGE, "n=5 dtype=f32 start=2.5 delta=-0.5"},
	{"range_i64", KILN_OP_RANGE, "n=4 dtype=i64 start=3 delta=2"},
	{"gather", KILN_OP_GATHER, "axis=0"}, {"gather_axis1", KILN_OP_GATHER, "axis=1"},
	{"gather_elements", KILN_OP_GATHER_ELEMENTS, "axis=1"},
	{"gather_elements_axis0", KILN_OP_GATHER_ELEMENTS, "axis=-3"},
	{"scatter_elements", KILN_OP_SCATTER_ELEMENTS, "axis=1"},
	{"scatter_elements_add", KILN_OP_SCATTER_ELEMENTS, "axis=0 reduction=add"},
	{"scatter_nd_mul", KILN_OP_SCATTER_ND, "reduction=mul"},
	{"flatten", KILN_OP_FLATTEN, "axis=2"}, {"squeeze", KILN_OP_SQUEEZE, "axes=0,2"},
	{"unsqueeze", KILN_OP_UNSQUEEZE, "axes=0,5"}, {"expand", KILN_OP_EXPAND, "shape=2,3,4"},
	{"pad_constant", KILN_OP_PAD, "pads=0,0,1,2,0,0,2,1 value=1.5"},
	{"pad_reflect", KILN_OP_PAD, "pads=0,0,1,2,0,0,2,1 mode=reflect"},
	{"pad_edge", KILN_OP_PAD, "pads=0,0,1,2,0,0,2,1 mode=edge"},
	{"pad_i32", KILN_OP_PAD, "pads=0,1,1,0 value=7"},
	{"resize_linear", KILN_OP_RESIZE, "mode=linear scales=1,1,2,1.5"},
	{"resize_nearest_i64", KILN_OP_RESIZE,
	 "sizes=1,1,4,5 coordinate_transformation_mode=asymmetric nearest_mode=floor"},
	{"resize_cubic", KILN_OP_RESIZE, "mode=cubic scales=1,1,0.75,0.75"},
	{"grid_sample", KILN_OP_GRID_SAMPLE, ""},
	{"grid_sample_nearest_border", KILN_OP_GRID_SAMPLE,
	 "mode=nearest padding_mode=border align_corners=1"},
	{"grid_sample_bicubic_reflection", KILN_OP_GRID_SAMPLE, "mode=bicubic padding_mode=reflection"},
};

static const opcase opcase_regularisation[] = {
	{"dropout_eval", KILN_OP_DROPOUT, "ratio=0.3"},
	{"dropout_train", KILN_OP_DROPOUT, "ratio=0.3 training_mode=1 seed=42"},
};

static const opcase opcase_losses[] = {
	{"softmax_ce", KILN_OP_SOFTMAX_CE, ""},
	{"softmax_ce_weight", KILN_OP_SOFTMAX_CE, ""},
	{"softmax_ce_ignore", KILN_OP_SOFTMAX_CE, "ignore_index=3"},
	{"softmax_ce_none", KILN_OP_SOFTMAX_CE, "reduction=none"},
	{"softmax_ce_sum_3d", KILN_OP_SOFTMAX_CE, "reduction=sum"},
	{"nll_loss", KILN_OP_NLL_LOSS, ""},
	{"nll_loss_weight_ignore", KILN_OP_NLL_LOSS, "ignore_index=3"},
	{"nll_loss_none", KILN_OP_NLL_LOSS, "reduction=none ignore_index=3"},
	{"nll_loss_sum", KILN_OP_NLL_LOSS, "reduction=sum"},
};

static const opcase opcase_quantization[] = {
	{"quantize_u8", KILN_OP_QUANTIZE_LINEAR, ""},
	{"quantize_no_zp", KILN_OP_QUANTIZE_LINEAR, ""},
	{"quantize_i8_axis", KILN_OP_QUANTIZE_LINEAR, "axis=1"},
	{"dequantize_i8_axis", KILN_OP_DEQUANTIZE_LINEAR, "axis=-1"},
	{"dequantize_i32", KILN_OP_DEQUANTIZE_LINEAR, ""},
	{"dynamic_quantize", KILN_OP_DYNAMIC_QUANTIZE_LINEAR, ""},
	{"matmul_integer", KILN_OP_MATMUL_INTEGER, ""},
	{"matmul_integer_batch", KILN_OP_MATMUL_INTEGER, ""},
	{"conv_integer", KILN_OP_CONV_INTEGER, "strides=2,2 pads=1,1,1,1"},
	{"qlinear_matmul", KILN_OP_QLINEAR_MATMUL, ""},
	{"qlinear_conv", KILN_OP_QLINEAR_CONV, "group=2 pads=1,1,1,1"},
	{"round", KILN_OP_ROUND, ""},
};

/* the fused recurrent ops: fixtures from torch's modules (ONNX gate order) */
static const opcase opcase_recurrent[] = {
	{"lstm_bidir", KILN_OP_LSTM, "direction=bidirectional hidden_size=3 inputs=3,5,6"},
	{"gru_layout1", KILN_OP_GRU, "hidden_size=3 inputs=3,5 layout=1 linear_before_reset=1"},
	{"rnn_reverse_lens", KILN_OP_RNN, "direction=reverse hidden_size=3 activations=Relu"},
};

#define OPCASE_GROUP(name, t) {name, t, (int)(sizeof(t) / sizeof(t[0]))}

/* The groups in numbering order; each name is its TCase's. */
static const struct opcase_group {
	const char *name;
	const opcase *cases;
	int n;
} opcase_groups[] = {
	OPCASE_GROUP("elementwise", opcase_elementwise),
	OPCASE_GROUP("broadcasting", opcase_broadcasting),
	OPCASE_GROUP("reductions", opcase_reductions),
	OPCASE_GROUP("linalg", opcase_linalg),
	OPCASE_GROUP("conv", opcase_convs),
	OPCASE_GROUP("pool", opcase_pools),
	OPCASE_GROUP("norm", opcase_norms),
	OPCASE_GROUP("movement", opcase_movement),
	OPCASE_GROUP("dropout", opcase_regularisation),
	OPCASE_GROUP("losses", opcase_losses),
	OPCASE_GROUP("quantization", opcase_quantization),
	OPCASE_GROUP("recurrent", opcase_recurrent),
};

#define OPCASE_NGROUPS ((int)(sizeof opcase_groups / sizeof opcase_groups[0]))

/* How many cases there are over all groups. */
static inline int opcase_count(void)
{
	int n = 0;
	for (int g = 0; g < OPCASE_NGROUPS; g++)
		n += opcase_groups[g].n;
	return n;
}

/* Case i of opcase_count(), counting through the groups in order. */
static inline const opcase *opcase_get(int i)
{
	for (int g = 0; g < OPCASE_NGROUPS; i -= opcase_groups[g++].n)
		if (i < opcase_groups[g].n)
			return &opcase_groups[g].cases[i];
	ck_abort_msg("no op case %d", i);
	return NULL;
}

/* Adds to s one TCase per group, looping test over that group's numbers. */
static inline void opcase_add_tcases(Suite *s, const TTest *test)
{
	for (int g = 0, first = 0; g < OPCASE_NGROUPS; first += opcase_groups[g++].n) {
		TCase *tc = tcase_create(opcase_groups[g].name);
		tcase_add_loop_test(tc, test, first, first + opcase_groups[g].n);
		suite_add_tcase(s, tc);
	}
}

/* Writes into missing (" Name Name ...", "" when none) each op that has no
 * case or for which has_impl is false.  Constant and Shape need no case:
 * they have no fixtures, each test checks them by hand. */
static inline void opcase_uncovered(char *missing, size_t size, bool (*has_impl)(kiln_op))
{
	missing[0] = 0;
	for (int op = 0; op < KILN_OP_COUNT; op++) {
		bool covered = op == KILN_OP_CONSTANT || op == KILN_OP_SHAPE;
		for (int i = 0, n = opcase_count(); i < n && !covered; i++)
			covered = opcase_get(i)->op == (kiln_op)op;
		size_t len = strlen(missing);
		if (!covered || !has_impl(op))
			snprintf(missing + len, size - len, " %s", ir_op(op)->onnx);
	}
}

/* ---- one-node graphs by hand ----------------------------------------------- */

/* Sets "name=v1,v2" attributes on n, typed by the op's schema. */
static inline void set_attrs(kiln_graph *g, ir_node *n, const char *spec)
{
	ir_attr_schema sch[16];
	int ns = ir_op_schema(n->op, sch, 16);
	char buf[256], *save = NULL;
	snprintf(buf, sizeof buf, "%s", spec);
	for (char *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		char *val = strchr(tok, '=');
		ck_assert_msg(val, "attribute '%s' has no value", tok);
		*val++ = 0;
		int k = 0;
		while (k < ns && strcmp(sch[k].name, tok))
			k++;
		ck_assert_msg(k < ns, "'%s' is not an attribute of %s", tok, ir_op(n->op)->onnx);
		int64_t ints[16];
		double floats[16];
		uint32_t cnt = 0, nf = 0;
		for (char *p = val; *p && nf < 16; p += *p == ',')
			floats[nf++] = strtod(p, &p);
		for (char *p = val; *p && cnt < 16; p += *p == ',')
			ints[cnt++] = strtoll(p, &p, 10);
		kiln_status st = KILN_OK;
		switch (sch[k].kind) {
		case IR_A_INT: st = ir_attr_set_int(g, n, tok, strtoll(val, NULL, 10)); break;
		case IR_A_FLOAT: st = ir_attr_set_float(g, n, tok, strtod(val, NULL)); break;
		case IR_A_INTS: st = ir_attr_set_ints(g, n, tok, cnt, ints); break;
		case IR_A_FLOATS: st = ir_attr_set_floats(g, n, tok, nf, floats); break;
		case IR_A_STRING: st = ir_attr_set_string(g, n, tok, val); break;
		case IR_A_DTYPE: st = ir_attr_set_dtype(g, n, tok, kiln_dtype_from_name(val)); break;
		default: ck_abort_msg("attribute kind of '%s' not handled by the test", tok);
		}
		ck_assert_int_eq(st, KILN_OK);
	}
}

/* A new tensor holding v (zeros when v is NULL). */
static inline kiln_tensor *tensor(kiln_dtype dt, int rank, const int64_t *shape, const double *v)
{
	kiln_tensor *t = kiln_tensor_new(dt, rank, shape);
	ck_assert_ptr_nonnull(t);
	for (int64_t i = 0; v && i < kiln_tensor_numel(t); i++)
		ir_store(t, i, v[i]);
	return t;
}

static inline uint32_t input(kiln_graph *g, const char *name, kiln_dtype dt, int rank,
                             const int64_t *dims)
{
	ir_type t = {dt, rank, {0}};
	if (rank) /* a scalar's dims may be NULL */
		memcpy(t.dim, dims, rank * sizeof *dims);
	return ir_input_new(g, name, &t);
}

/* Appends op on in[0..nin) with one output, inferred. */
static inline uint32_t op1(kiln_graph *g, kiln_op op, uint32_t nin, const uint32_t *in,
                           const char *attrs)
{
	ir_node *n = ir_node_new(g, op, nin, in, 1, KILN_HERE);
	ck_assert_msg(n != NULL, "%s", kiln_graph_errmsg(g));
	set_attrs(g, n, attrs);
	ck_assert_msg(ir_infer_node(g, n) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return n->out[0];
}

/* The .npy at path, which must read. */
static inline kiln_tensor *npy_load(const char *path)
{
	kiln_tensor *t = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_npy_read(path, &t, &err) == KILN_OK, "%s: %s", path, err.msg);
	return t;
}

static inline ir_type type_of(const kiln_tensor *t)
{
	ir_type ty = {t->dtype, t->rank, {0}};
	memcpy(ty.dim, t->shape, t->rank * sizeof(int64_t));
	return ty;
}

/* ---- a case as a graph ------------------------------------------------------ */

/* Most inputs a case has (QLinearConv's nine). */
#define OPCASE_MAX_IN 9

/* A case's one-node graph with its fixtures; opcase_free releases it all. */
typedef struct opcase_graph {
	const char *name;
	kiln_graph *g;       /* inputs in[k], outputs the node's, inferred */
	kiln_tensor *in[OPCASE_MAX_IN]; /* <case>_in<k>.npy */
	kiln_tensor *want[4]; /* <case>_out<k>.npy */
	int nin, nout;
	double tol; /* the case's, 1e-5 unless it says */
} opcase_graph;

/* <case>_<kind><k>.npy, or NULL when there is none. */
static inline kiln_tensor *opcase_fixture(const char *name, const char *kind, int k)
{
	char path[512];
	snprintf(path, sizeof path, "%s/ops/%s_%s%d.npy", KILN_FIXTURES, name, kind, k);
	return access(path, R_OK) == 0 ? npy_load(path) : NULL;
}

static inline opcase_graph opcase_build(const opcase *c)
{
	opcase_graph r = {c->name, kiln_graph_new(c->name), {0}, {0}, 0, 0, c->tol ? c->tol : 1e-5};
	uint32_t ids[OPCASE_MAX_IN];
	ck_assert_ptr_nonnull(r.g);
	for (; r.nin < OPCASE_MAX_IN && (r.in[r.nin] = opcase_fixture(c->name, "in", r.nin)); r.nin++) {
		ir_type t = type_of(r.in[r.nin]);
		ids[r.nin] = ir_input_new(r.g, NULL, &t);
	}
	while (r.nout < 4 && (r.want[r.nout] = opcase_fixture(c->name, "out", r.nout)))
		r.nout++;
	ck_assert_msg(r.nout > 0, "%s: no fixture outputs (run make_op_fixtures.py)", c->name);
	ir_node *n = ir_node_new(r.g, c->op, r.nin, ids, r.nout, KILN_HERE);
	ck_assert_ptr_nonnull(n);
	set_attrs(r.g, n, c->attrs);
	ck_assert_msg(ir_infer_node(r.g, n) == KILN_OK, "%s: %s", c->name, kiln_graph_errmsg(r.g));
	for (int k = 0; k < r.nout; k++)
		ir_output_add(r.g, n->out[k], NULL);
	return r;
}

static inline void opcase_free(opcase_graph *r)
{
	for (int k = 0; k < OPCASE_MAX_IN; k++)
		kiln_tensor_free(r->in[k]);
	for (int k = 0; k < 4; k++)
		kiln_tensor_free(r->want[k]);
	kiln_graph_free(r->g);
	*r = (opcase_graph){0};
}

/* ---- comparing outputs --------------------------------------------------------- */

/* Largest |got - want| (0 when both are NaN); dtype and shape must agree;
 * integers compare exactly, beyond 2^53 too. */
static inline double max_err(const char *name, int k, const kiln_tensor *got,
                             const kiln_tensor *want)
{
	char a[128], b[128];
	ir_type tg = type_of(got), tw = type_of(want);
	ck_assert_msg(ir_type_eq(&tg, &tw), "%s out%d: got %s, want %s", name, k,
	              ir_type_str(NULL, &tg, a, sizeof a), ir_type_str(NULL, &tw, b, sizeof b));
	double worst = 0;
	for (int64_t i = 0, cnt = kiln_tensor_numel(want); i < cnt; i++) {
		double x = ir_load(got, i), y = ir_load(want, i);
		double e = isnan(x) && isnan(y) ? 0 : x == y ? 0 : fabs(x - y);
		if (!kiln_dtype_is_float(want->dtype) && ir_load_i64(got, i) != ir_load_i64(want, i))
			e = INFINITY;
		worst = isnan(e) || e > worst ? (isnan(e) ? INFINITY : e) : worst;
	}
	return worst;
}

/* Each of the n outputs got[k] is want[k] within tol. */
static inline void expect_close(const char *name, kiln_tensor *const *got,
                                kiln_tensor *const *want, int n, double tol)
{
	for (int k = 0; k < n; k++) {
		double e = max_err(name, k, got[k], want[k]);
		ck_assert_msg(e <= tol, "%s out%d: max error %g > %g", name, k, e, tol);
	}
}

/* Whether case c compiled with o (into a fresh $TMPDIR/<prefix>.XXXXXX,
 * tu_compile_run) matches the interpreter: bit for bit when exact (NaN
 * matching NaN), else within tu_tolerance; why not into why.  The compiled
 * backends' tests (test_compiled_ops.c, test_cuda.c) share it. */
static inline bool opcase_matches(const opcase_graph *c, const kiln_compile_opts *o,
                                  const char *prefix, bool exact, char *why, size_t size)
{
	kiln_tensor *want[4] = {0}, *got[4] = {0};
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_run(c->g, (kiln_tensor **)c->in, c->nin, want, c->nout, &err) ==
	                  KILN_OK, "%s: interpreter: %s", c->name, err.msg);
	kiln_status st = tu_compile_run(c->g, o, prefix, (kiln_tensor **)c->in, c->nin, got,
	                                c->nout, &err);
	bool ok = st == KILN_OK;
	if (!ok)
		snprintf(why, size, "%s: %s", kiln_status_str(st), err.msg);
	for (int k = 0; ok && k < c->nout; k++) {
		double e = max_err(c->name, k, got[k], want[k]);
		double tol = exact ? 0 : tu_tolerance(want[k], c->tol);
		if (e > tol)
			snprintf(why, size, "out%d: max error %g > %g", k, e, tol), ok = false;
	}
	for (int k = 0; k < c->nout; k++)
		kiln_tensor_free(want[k]), kiln_tensor_free(got[k]);
	return ok;
}

/* ---- symbolic dims in attributes ------------------------------------------- */

/* A graph whose attributes hold the symbolic dim S (schema kind ds), as an
 * imported text model's do: position ids as a slice of an 8-long buffer
 * ending at S, a Range of S elements, and a reshape of [N*S,2] back to
 * [N,S,2] (two symbols, which 0 and -1 cannot say).  ids binds N and S. */
static const char dynseq_kir[] =
	"graph @dynseq(%ids: i64[N,S], %x: f32[N,S,2]) -> (%pos: i64[1,S], %r: f32[S], "
	"%y: f32[N,S,2]) {\n"
	"  buffer %table: i64[1,8]\n"
	"  %pos = slice %table {axes=[1], ends=[S], starts=[0]} : i64[1,S]\n"
	"  %r = range {delta=0.5, dtype=f32, n=[S], start=1.0} : f32[S]\n"
	"  %f = reshape %x {shape=[-1,2]} : f32[N*S,2]\n"
	"  %y = reshape %f {shape=[N,S,2]} : f32[N,S,2]\n"
	"  ret %pos, %r, %y\n"
	"}\n";

/* dynseq_kir parsed, its buffer holding 10, 11, ..., 17. */
static inline kiln_graph *dynseq_graph(void)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(ir_parse(dynseq_kir, "dynseq.kir", &g, &err) == KILN_OK, "%s", err.msg);
	for (uint32_t id = 1; id < g->nval; id++)
		for (int64_t i = 0; g->val[id]->kind == IR_V_PARAM && i < 8; i++)
			ir_store_i64(g->val[id]->data, i, 10 + i);
	return g;
}

/* Its inputs at N = 2 and S = s: ids of zeros, x[i] = 0.25 i. */
static inline void dynseq_inputs(int64_t s, kiln_tensor **in)
{
	in[0] = tensor(KILN_I64, 2, (int64_t[]){2, s}, NULL);
	in[1] = tensor(KILN_F32, 3, (int64_t[]){2, s, 2}, NULL);
	for (int64_t i = 0; i < 4 * s; i++)
		ir_store(in[1], i, 0.25 * (double)i);
}

/* Its outputs at S = s, exactly. */
static inline void dynseq_expect(const char *who, int64_t s, kiln_tensor *const *out)
{
	ck_assert_msg(out[0]->rank == 2 && out[0]->shape[0] == 1 && out[0]->shape[1] == s,
	              "%s: pos is not [1,%lld]", who, (long long)s);
	ck_assert_msg(out[1]->rank == 1 && out[1]->shape[0] == s, "%s: r is not [%lld]", who,
	              (long long)s);
	ck_assert_msg(out[2]->rank == 3 && out[2]->shape[0] == 2 && out[2]->shape[1] == s &&
	              out[2]->shape[2] == 2, "%s: y is not [2,%lld,2]", who, (long long)s);
	for (int64_t i = 0; i < s; i++) {
		ck_assert_msg(ir_load_i64(out[0], i) == 10 + i, "%s: pos[%lld] = %lld", who,
		              (long long)i, (long long)ir_load_i64(out[0], i));
		ck_assert_msg(ir_load(out[1], i) == 1 + 0.5 * (double)i, "%s: r[%lld] = %g", who,
		              (long long)i, ir_load(out[1], i));
	}
	for (int64_t i = 0; i < 4 * s; i++)
		ck_assert_msg(ir_load(out[2], i) == 0.25 * (double)i, "%s: y[%lld] = %g", who,
		              (long long)i, ir_load(out[2], i));
}

#endif /* KILN_OP_CASES_H */
