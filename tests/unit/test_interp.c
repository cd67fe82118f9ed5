/* test_interp.c: the reference interpreter (ir/interp.c) against PyTorch.
 *
 * Each case names a fixture prefix in tests/fixtures/ops (written by
 * make_op_fixtures.py; keep the tables in step), the op and its attributes
 * as "name=value" text parsed with the op's schema.  The case builds a
 * one-node graph whose inputs are the <case>_in<k>.npy files and whose
 * outputs are as many as there are <case>_out<k>.npy files, infers types,
 * runs kiln_graph_run and compares dtype, shape and values (1e-5 for f32,
 * 1e-12 for f64 cases, exact for integers and bools).  Then the driver's
 * checks and errors, symbolic batches, and element access by dtype. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ir/ir.h"

#include "check_main.h"

typedef struct opcase {
	const char *name;  /* fixture prefix */
	kiln_op op;
	const char *attrs; /* "axes=0,2 keepdims=0 mode=reflect" */
	double tol;        /* 0: 1e-5 */
} opcase;

#define F64TOL 1e-12

static const opcase elementwise[] = {
	{"neg", KILN_OP_NEG, ""}, {"abs", KILN_OP_ABS, ""}, {"exp", KILN_OP_EXP, ""},
	{"log", KILN_OP_LOG, ""}, {"sqrt", KILN_OP_SQRT, ""},
	{"reciprocal", KILN_OP_RECIPROCAL, ""}, {"floor", KILN_OP_FLOOR, ""},
	{"ceil", KILN_OP_CEIL, ""}, {"sin", KILN_OP_SIN, ""}, {"cos", KILN_OP_COS, ""},
	{"relu", KILN_OP_RELU, ""}, {"sigmoid", KILN_OP_SIGMOID, ""}, {"tanh", KILN_OP_TANH, ""},
	{"erf", KILN_OP_ERF, ""}, {"identity", KILN_OP_IDENTITY, ""},
	{"leaky_relu", KILN_OP_LEAKY_RELU, "alpha=0.2"}, {"gelu", KILN_OP_GELU, ""},
	{"gelu_tanh", KILN_OP_GELU, "approximate=tanh"},
	{"clip", KILN_OP_CLIP, "min=-0.5 max=0.7"}, {"clip_min_only", KILN_OP_CLIP, "min=0"},
	{"sigmoid_f64", KILN_OP_SIGMOID, "", F64TOL}, {"neg_i64", KILN_OP_NEG, ""},
	{"clip_i64", KILN_OP_CLIP, "min=-2 max=4"}, {"not", KILN_OP_NOT, ""},
	{"cast_f32_i32", KILN_OP_CAST, "to=i32"}, {"cast_f32_bool", KILN_OP_CAST, "to=bool"},
	{"cast_f32_f16", KILN_OP_CAST, "to=f16"}, {"cast_f16_f32", KILN_OP_CAST, "to=f32"},
	{"cast_f32_bf16", KILN_OP_CAST, "to=bf16"}, {"cast_i64_f32", KILN_OP_CAST, "to=f32"},
	{"cast_i64_i32", KILN_OP_CAST, "to=i32"}, {"cast_bool_f32", KILN_OP_CAST, "to=f32"},
};

static const opcase broadcasting[] = {
	{"add_bcast", KILN_OP_ADD, ""}, {"sub_bcast", KILN_OP_SUB, ""},
	{"mul_bcast", KILN_OP_MUL, ""}, {"div", KILN_OP_DIV, ""}, {"pow", KILN_OP_POW, ""},
	{"add_f64", KILN_OP_ADD, "", F64TOL}, {"add_i64", KILN_OP_ADD, ""},
	{"div_i64", KILN_OP_DIV, ""}, {"max3", KILN_OP_MAX, ""}, {"min2", KILN_OP_MIN, ""},
	{"equal", KILN_OP_EQUAL, ""}, {"less", KILN_OP_LESS, ""},
	{"greater", KILN_OP_GREATER, ""}, {"and", KILN_OP_AND, ""}, {"or", KILN_OP_OR, ""},
	{"where", KILN_OP_WHERE, ""},
};

static const opcase reductions[] = {
	{"reduce_sum", KILN_OP_REDUCE_SUM, "axes=1"},
	{"reduce_sum_all", KILN_OP_REDUCE_SUM, "keepdims=0"},
	{"reduce_mean", KILN_OP_REDUCE_MEAN, "axes=0,2 keepdims=0"},
	{"reduce_max", KILN_OP_REDUCE_MAX, "axes=-1"},
	{"reduce_min", KILN_OP_REDUCE_MIN, "axes=1 keepdims=0"},
	{"reduce_sum_noop", KILN_OP_REDUCE_SUM, "noop_with_empty_axes=1"},
	{"reduce_sum_i64", KILN_OP_REDUCE_SUM, "axes=0 keepdims=0"},
	{"argmax", KILN_OP_ARGMAX, "axis=1"},
	{"argmax_last", KILN_OP_ARGMAX, "axis=1 keepdims=0 select_last_index=1"},
};

static const opcase linalg[] = {
	{"matmul", KILN_OP_MATMUL, ""}, {"matmul_batch", KILN_OP_MATMUL, ""},
	{"matmul_vec_mat", KILN_OP_MATMUL, ""}, {"matmul_mat_vec", KILN_OP_MATMUL, ""},
	{"matmul_vec_vec", KILN_OP_MATMUL, ""}, {"matmul_f64", KILN_OP_MATMUL, "", F64TOL},
	{"gemm", KILN_OP_GEMM, ""},
	{"gemm_trans", KILN_OP_GEMM, "alpha=0.5 beta=2 transA=1 transB=1"},
	{"gemm_no_c", KILN_OP_GEMM, ""},
};

static const opcase convs[] = {
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

static const opcase pools[] = {
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

static const opcase norms[] = {
	{"batch_norm", KILN_OP_BATCH_NORM, ""},
	{"batch_norm_train", KILN_OP_BATCH_NORM, "training_mode=1 epsilon=0.001"},
	{"layer_norm", KILN_OP_LAYER_NORM, ""},
	{"layer_norm_stats", KILN_OP_LAYER_NORM, "axis=1 epsilon=0.001"},
	{"layer_norm_f64", KILN_OP_LAYER_NORM, "", F64TOL},
	{"softmax", KILN_OP_SOFTMAX, "axis=1"}, {"softmax_axis0", KILN_OP_SOFTMAX, "axis=0"},
	{"log_softmax", KILN_OP_LOG_SOFTMAX, ""}, {"softmax_f64", KILN_OP_SOFTMAX, "", F64TOL},
};

static const opcase movement[] = {
	{"reshape", KILN_OP_RESHAPE, "shape=4,6"},
	{"transpose", KILN_OP_TRANSPOSE, "perm=1,2,0"},
	{"transpose_default", KILN_OP_TRANSPOSE, ""},
	{"concat", KILN_OP_CONCAT, "axis=1"},
	{"split", KILN_OP_SPLIT, "axis=1"},
	{"split_sizes", KILN_OP_SPLIT, "axis=0 split=1,4"},
	{"slice_neg_step", KILN_OP_SLICE, "starts=-1,4 ends=-1000,0 axes=0,1 steps=-2,-1"},
	{"slice_clamp", KILN_OP_SLICE, "starts=-100,1 ends=100,1000 axes=1,2"},
	{"gather", KILN_OP_GATHER, "axis=0"}, {"gather_axis1", KILN_OP_GATHER, "axis=1"},
	{"flatten", KILN_OP_FLATTEN, "axis=2"}, {"squeeze", KILN_OP_SQUEEZE, "axes=0,2"},
	{"unsqueeze", KILN_OP_UNSQUEEZE, "axes=0,5"}, {"expand", KILN_OP_EXPAND, "shape=2,3,4"},
	{"pad_constant", KILN_OP_PAD, "pads=0,0,1,2,0,0,2,1 value=1.5"},
	{"pad_reflect", KILN_OP_PAD, "pads=0,0,1,2,0,0,2,1 mode=reflect"},
	{"pad_edge", KILN_OP_PAD, "pads=0,0,1,2,0,0,2,1 mode=edge"},
	{"pad_i32", KILN_OP_PAD, "pads=0,1,1,0 value=7"},
};

static const opcase regularisation[] = {
	{"dropout_eval", KILN_OP_DROPOUT, "ratio=0.3"},
	{"dropout_train", KILN_OP_DROPOUT, "ratio=0.3 training_mode=1 seed=42"},
};

static const opcase losses[] = {
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

#define NCASES(t) ((int)(sizeof(t) / sizeof(t[0])))

/* ---- building and running one-node graphs -------------------------------- */

/* Sets "name=v1,v2" attributes on n, typed by the op's schema. */
static void set_attrs(kiln_graph *g, ir_node *n, const char *spec)
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
		uint32_t cnt = 0;
		for (char *p = val; *p && cnt < 16; p += *p == ',')
			ints[cnt++] = strtoll(p, &p, 10);
		kiln_status st = KILN_OK;
		switch (sch[k].kind) {
		case IR_A_INT: st = ir_attr_set_int(g, n, tok, strtoll(val, NULL, 10)); break;
		case IR_A_FLOAT: st = ir_attr_set_float(g, n, tok, strtod(val, NULL)); break;
		case IR_A_INTS: st = ir_attr_set_ints(g, n, tok, cnt, ints); break;
		case IR_A_STRING: st = ir_attr_set_string(g, n, tok, val); break;
		case IR_A_DTYPE: st = ir_attr_set_dtype(g, n, tok, kiln_dtype_from_name(val)); break;
		default: ck_abort_msg("attribute kind of '%s' not handled by the test", tok);
		}
		ck_assert_int_eq(st, KILN_OK);
	}
}

static kiln_tensor *fixture(const char *name, const char *kind, int k)
{
	char path[512];
	snprintf(path, sizeof path, "%s/ops/%s_%s%d.npy", KILN_FIXTURES, name, kind, k);
	if (access(path, R_OK) != 0)
		return NULL;
	kiln_tensor *t = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_npy_read(path, &t, &err) == KILN_OK, "%s: %s", path, err.msg);
	return t;
}

static ir_type type_of(const kiln_tensor *t)
{
	ir_type ty = {t->dtype, t->rank, {0}};
	memcpy(ty.dim, t->shape, t->rank * sizeof(int64_t));
	return ty;
}

/* Largest |got - want| (0 when both are NaN); the shapes must agree. */
static double max_err(const char *name, int k, const kiln_tensor *got, const kiln_tensor *want)
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
			e = INFINITY; /* integers compare exactly, beyond 2^53 too */
		worst = isnan(e) || e > worst ? (isnan(e) ? INFINITY : e) : worst;
	}
	return worst;
}

static void run_case(const opcase *c)
{
	kiln_tensor *in[8] = {0}, *want[4] = {0}, *got[4] = {0};
	uint32_t ids[8], nin = 0, nout = 0;
	kiln_graph *g = kiln_graph_new(c->name);
	for (; nin < 8 && (in[nin] = fixture(c->name, "in", nin)); nin++) {
		ir_type t = type_of(in[nin]);
		ids[nin] = ir_input_new(g, NULL, &t);
	}
	while (nout < 4 && (want[nout] = fixture(c->name, "out", nout)))
		nout++;
	ck_assert_msg(nout > 0, "%s: no fixture outputs (run make_op_fixtures.py)", c->name);
	ir_node *n = ir_node_new(g, c->op, nin, ids, nout, KILN_HERE);
	ck_assert_ptr_nonnull(n);
	set_attrs(g, n, c->attrs);
	ck_assert_msg(ir_infer_node(g, n) == KILN_OK, "%s: %s", c->name, kiln_graph_errmsg(g));
	for (uint32_t k = 0; k < nout; k++)
		ir_output_add(g, n->out[k], NULL);
	kiln_error err = {0};
	kiln_status st = kiln_graph_run(g, in, nin, got, nout, &err);
	ck_assert_msg(st == KILN_OK, "%s: %s", c->name, err.msg);
	double tol = c->tol ? c->tol : 1e-5;
	for (uint32_t k = 0; k < nout; k++) {
		double e = max_err(c->name, k, got[k], want[k]);
		ck_assert_msg(e <= tol, "%s out%u: max error %g > %g", c->name, k, e, tol);
	}
	for (int k = 0; k < 8; k++)
		kiln_tensor_free(in[k]);
	for (int k = 0; k < 4; k++)
		kiln_tensor_free(want[k]), kiln_tensor_free(got[k]);
	kiln_graph_free(g);
}

START_TEST(elementwise_ops_match_torch) { run_case(&elementwise[_i]); }
END_TEST
START_TEST(broadcasting_binary_ops_match_torch) { run_case(&broadcasting[_i]); }
END_TEST
START_TEST(reductions_match_torch) { run_case(&reductions[_i]); }
END_TEST
START_TEST(matmul_and_gemm_match_torch) { run_case(&linalg[_i]); }
END_TEST
START_TEST(convolutions_match_torch) { run_case(&convs[_i]); }
END_TEST
START_TEST(pools_match_torch) { run_case(&pools[_i]); }
END_TEST
START_TEST(normalisations_match_torch) { run_case(&norms[_i]); }
END_TEST
START_TEST(data_movement_matches_torch) { run_case(&movement[_i]); }
END_TEST
START_TEST(dropout_matches_documented_generator) { run_case(&regularisation[_i]); }
END_TEST
START_TEST(losses_match_torch) { run_case(&losses[_i]); }
END_TEST

/* ---- every op has a kernel and a case ---------------------------------- */

static const struct {
	const opcase *cases;
	int n;
} tables[] = {
	{elementwise, NCASES(elementwise)}, {broadcasting, NCASES(broadcasting)},
	{reductions, NCASES(reductions)},   {linalg, NCASES(linalg)},
	{convs, NCASES(convs)},             {pools, NCASES(pools)},
	{norms, NCASES(norms)},             {movement, NCASES(movement)},
	{regularisation, NCASES(regularisation)}, {losses, NCASES(losses)},
};

START_TEST(every_op_has_a_kernel_and_a_fixture_case)
{
	char missing[1024] = "";
	for (int op = 0; op < KILN_OP_COUNT; op++) {
		/* Constant and Shape are checked directly below */
		bool covered = op == KILN_OP_CONSTANT || op == KILN_OP_SHAPE;
		for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
			for (int i = 0; i < tables[t].n; i++)
				covered = covered || tables[t].cases[i].op == (kiln_op)op;
		if (!covered || !ir_interp_table[op])
			snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s",
			         ir_op(op)->onnx);
	}
	ck_assert_msg(!missing[0], "ops without a kernel or a case:%s", missing);
}
END_TEST

/* ---- graphs built by hand ------------------------------------------------ */

static kiln_tensor *tensor(kiln_dtype dt, int rank, const int64_t *shape, const double *v)
{
	kiln_tensor *t = kiln_tensor_new(dt, rank, shape);
	ck_assert_ptr_nonnull(t);
	for (int64_t i = 0; v && i < kiln_tensor_numel(t); i++)
		ir_store(t, i, v[i]);
	return t;
}

static uint32_t input(kiln_graph *g, const char *name, kiln_dtype dt, int rank,
                      const int64_t *dims)
{
	ir_type t = {dt, rank, {0}};
	memcpy(t.dim, dims, rank * sizeof *dims);
	return ir_input_new(g, name, &t);
}

/* Appends op on in[0..nin) with one output, inferred. */
static uint32_t op1(kiln_graph *g, kiln_op op, uint32_t nin, const uint32_t *in, const char *attrs)
{
	ir_node *n = ir_node_new(g, op, nin, in, 1, KILN_HERE);
	ck_assert_ptr_nonnull(n);
	set_attrs(g, n, attrs);
	ck_assert_msg(ir_infer_node(g, n) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return n->out[0];
}

START_TEST(constant_yields_its_value)
{
	kiln_graph *g = kiln_graph_new("c");
	double v[] = {4, -2, 7};
	kiln_tensor *t = tensor(KILN_I32, 1, (int64_t[]){3}, v), *out[1];
	ir_node *n = ir_node_new(g, KILN_OP_CONSTANT, 0, NULL, 1, KILN_HERE);
	ck_assert_int_eq(ir_attr_set_tensor(g, n, "value", t), KILN_OK);
	ck_assert_int_eq(ir_infer_node(g, n), KILN_OK);
	ir_output_add(g, n->out[0], "c");
	ck_assert_int_eq(kiln_graph_run(g, NULL, 0, out, 1, NULL), KILN_OK);
	ck_assert_int_eq(out[0]->dtype, KILN_I32);
	ck_assert_int_eq(ir_load_i64(out[0], 0), 4);
	ck_assert_int_eq(ir_load_i64(out[0], 1), -2);
	ck_assert_int_eq(ir_load_i64(out[0], 2), 7);
	kiln_tensor_free(out[0]), kiln_tensor_free(t);
	kiln_graph_free(g);
}
END_TEST

START_TEST(shape_reads_the_bound_symbolic_dims)
{
	kiln_graph *g = kiln_graph_new("s");
	uint32_t x = input(g, "x", KILN_F32, 3, (int64_t[]){kiln_sym(g, "N"), 3, 5});
	ir_output_add(g, op1(g, KILN_OP_SHAPE, 1, &x, ""), "all");
	ir_output_add(g, op1(g, KILN_OP_SHAPE, 1, &x, "start=-2"), "tail");
	kiln_tensor *in = tensor(KILN_F32, 3, (int64_t[]){2, 3, 5}, NULL), *out[2];
	ck_assert_int_eq(kiln_graph_run(g, &in, 1, out, 2, NULL), KILN_OK);
	ck_assert_int_eq(out[0]->dtype, KILN_I64);
	ck_assert_int_eq(kiln_tensor_numel(out[0]), 3);
	ck_assert_int_eq(ir_load_i64(out[0], 0), 2);
	ck_assert_int_eq(ir_load_i64(out[0], 2), 5);
	ck_assert_int_eq(kiln_tensor_numel(out[1]), 2);
	ck_assert_int_eq(ir_load_i64(out[1], 0), 3);
	kiln_tensor_free(out[0]), kiln_tensor_free(out[1]), kiln_tensor_free(in);
	kiln_graph_free(g);
}
END_TEST

/* y = relu(x) @ w + b with x: f32[N,4] and parameters w, b; intermediates
 * are freed on the way (ASan's leak check sees any that are not). */
static kiln_graph *mlp(void)
{
	kiln_graph *g = kiln_graph_new("mlp");
	uint32_t x = input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 4});
	double wv[8] = {1, -1, 2, 0.5, 0, 3, -2, 1}, bv[2] = {0.25, -0.5};
	kiln_tensor *w = tensor(KILN_F32, 2, (int64_t[]){4, 2}, wv);
	kiln_tensor *b = tensor(KILN_F32, 1, (int64_t[]){2}, bv);
	uint32_t r = op1(g, KILN_OP_RELU, 1, &x, "");
	uint32_t mm[2] = {r, ir_param_new(g, "w", w, true)};
	uint32_t m = op1(g, KILN_OP_MATMUL, 2, mm, "");
	uint32_t ad[2] = {m, ir_param_new(g, "b", b, true)};
	ir_output_add(g, op1(g, KILN_OP_ADD, 2, ad, ""), "y");
	kiln_tensor_free(w), kiln_tensor_free(b);
	return g;
}

START_TEST(symbolic_batch_runs_at_two_sizes)
{
	kiln_graph *g = mlp();
	static const double wv[8] = {1, -1, 2, 0.5, 0, 3, -2, 1}, bv[2] = {0.25, -0.5};
	for (int64_t N = 2; N <= 5; N += 3) {
		double xv[20];
		for (int i = 0; i < N * 4; i++)
			xv[i] = (i % 7) - 3 + 0.5 * (i % 2);
		kiln_tensor *x = tensor(KILN_F32, 2, (int64_t[]){N, 4}, xv), *y;
		kiln_error err = {0};
		ck_assert_msg(kiln_graph_run(g, &x, 1, &y, 1, &err) == KILN_OK, "%s", err.msg);
		ck_assert_int_eq(y->shape[0], N);
		ck_assert_int_eq(y->shape[1], 2);
		for (int i = 0; i < N; i++)
			for (int j = 0; j < 2; j++) {
				double acc = bv[j];
				for (int k = 0; k < 4; k++)
					acc += fmax(xv[i * 4 + k], 0) * wv[k * 2 + j];
				ck_assert_double_eq_tol(ir_load(y, i * 2 + j), acc, 1e-6);
			}
		kiln_tensor_free(x), kiln_tensor_free(y);
	}
	kiln_graph_free(g);
}
END_TEST

/* ---- kiln_graph_run's checks -------------------------------------------- */

/* Runs g on the given inputs expecting failure; returns the error. */
static kiln_error run_fails(kiln_graph *g, kiln_tensor **in, int nin, int nout)
{
	kiln_tensor *out[4] = {0};
	kiln_error err = {0};
	kiln_status st = kiln_graph_run(g, in, nin, out, nout, &err);
	ck_assert_int_ne(st, KILN_OK);
	ck_assert_int_eq(st, err.code);
	for (int k = 0; k < nout; k++)
		ck_assert_ptr_null(out[k]);
	return err;
}

START_TEST(run_rejects_wrong_input_count)
{
	kiln_graph *g = mlp();
	kiln_error err = run_fails(g, NULL, 0, 1);
	ck_assert_int_eq(err.code, KILN_EINVAL);
	ck_assert_str_eq(err.msg, "kiln_graph_run: graph 'mlp' has 1 inputs and 1 outputs, got 0 and 1");
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_wrong_dtype)
{
	kiln_graph *g = mlp();
	kiln_tensor *x = tensor(KILN_I32, 2, (int64_t[]){2, 4}, NULL);
	kiln_error err = run_fails(g, &x, 1, 1);
	ck_assert_int_eq(err.code, KILN_ESHAPE);
	ck_assert_str_eq(err.msg, "kiln_graph_run: input 'x' expects f32[N,4], got i32[2,4] "
	                          "(dtype i32, expected f32)");
	kiln_tensor_free(x);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_wrong_fixed_dim)
{
	kiln_graph *g = mlp();
	kiln_tensor *x = tensor(KILN_F32, 2, (int64_t[]){2, 5}, NULL);
	kiln_error err = run_fails(g, &x, 1, 1);
	ck_assert_int_eq(err.code, KILN_ESHAPE);
	ck_assert_ptr_nonnull(strstr(err.msg, "input 'x' expects f32[N,4], got f32[2,5]"));
	ck_assert_ptr_nonnull(strstr(err.msg, "dim 1 is 5, expected 4"));
	kiln_tensor_free(x);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_inconsistent_symbol_binding)
{
	kiln_graph *g = kiln_graph_new("two");
	int64_t N = kiln_sym(g, "N");
	uint32_t ab[2] = {input(g, "a", KILN_F32, 2, (int64_t[]){N, 4}),
	                  input(g, "b", KILN_F32, 2, (int64_t[]){N, 4})};
	ir_output_add(g, op1(g, KILN_OP_ADD, 2, ab, ""), "y");
	kiln_tensor *in[2] = {tensor(KILN_F32, 2, (int64_t[]){2, 4}, NULL),
	                      tensor(KILN_F32, 2, (int64_t[]){3, 4}, NULL)};
	kiln_error err = run_fails(g, in, 2, 1);
	ck_assert_int_eq(err.code, KILN_ESHAPE);
	ck_assert_ptr_nonnull(strstr(err.msg, "input 'b' expects f32[N,4], got f32[3,4]"));
	ck_assert_ptr_nonnull(strstr(err.msg, "N=2 vs N=3"));
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_gather_index_out_of_range)
{
	kiln_graph *g = kiln_graph_new("gather");
	uint32_t xi[2] = {input(g, "x", KILN_F32, 2, (int64_t[]){4, 3}),
	                  input(g, "i", KILN_I64, 1, (int64_t[]){2})};
	ir_output_add(g, op1(g, KILN_OP_GATHER, 2, xi, ""), "y");
	kiln_tensor *in[2] = {tensor(KILN_F32, 2, (int64_t[]){4, 3}, NULL),
	                      tensor(KILN_I64, 1, (int64_t[]){2}, (double[]){-4, 4})};
	kiln_error err = run_fails(g, in, 2, 1);
	ck_assert_int_eq(err.code, KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "Gather: index 4 out of range for axis 0 of f32[4,3]"));
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_integer_division_by_zero)
{
	kiln_graph *g = kiln_graph_new("div");
	uint32_t ab[2] = {input(g, "a", KILN_I32, 1, (int64_t[]){2}),
	                  input(g, "b", KILN_I32, 1, (int64_t[]){2})};
	ir_output_add(g, op1(g, KILN_OP_DIV, 2, ab, ""), "y");
	kiln_tensor *in[2] = {tensor(KILN_I32, 1, (int64_t[]){2}, (double[]){-7, 1}),
	                      tensor(KILN_I32, 1, (int64_t[]){2}, (double[]){2, 0})};
	kiln_error err = run_fails(g, in, 2, 1);
	ck_assert_int_eq(err.code, KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "Div: integer division by zero"));
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_rejects_loss_target_out_of_range)
{
	kiln_graph *g = kiln_graph_new("nll");
	uint32_t xt[2] = {input(g, "x", KILN_F32, 2, (int64_t[]){2, 3}),
	                  input(g, "t", KILN_I64, 1, (int64_t[]){2})};
	ir_output_add(g, op1(g, KILN_OP_NLL_LOSS, 2, xt, ""), "l");
	kiln_tensor *in[2] = {tensor(KILN_F32, 2, (int64_t[]){2, 3}, NULL),
	                      tensor(KILN_I64, 1, (int64_t[]){2}, (double[]){0, 3})};
	kiln_error err = run_fails(g, in, 2, 1);
	ck_assert_int_eq(err.code, KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "target 3 out of range [0, 3)"));
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(run_reports_the_graphs_sticky_error)
{
	kiln_graph *g = mlp();
	ir_errorf(g, NULL, KILN_ESHAPE, "earlier trouble");
	kiln_tensor *x = tensor(KILN_F32, 2, (int64_t[]){2, 4}, NULL);
	kiln_error err = run_fails(g, &x, 1, 1);
	ck_assert_int_eq(err.code, KILN_ESHAPE);
	ck_assert_str_eq(err.msg, "kiln_graph_run: graph 'mlp' has an error: earlier trouble");
	kiln_tensor_free(x);
	kiln_graph_free(g);
}
END_TEST

/* Kernels get shapes from inference; a wrong output shape is an error,
 * never a read outside an input. */
START_TEST(kernel_rejects_an_output_shape_it_cannot_fill)
{
	kiln_graph *g = kiln_graph_new("bad");
	uint32_t x = input(g, "x", KILN_F32, 2, (int64_t[]){2, 3});
	op1(g, KILN_OP_TRANSPOSE, 1, &x, "");
	ir_node *n = g->node[g->nnode - 1];
	kiln_tensor *in = tensor(KILN_F32, 2, (int64_t[]){2, 3}, NULL);
	kiln_tensor *out = tensor(KILN_F32, 2, (int64_t[]){2, 3}, NULL);
	kiln_error err = {0};
	ir_interp c = {g, &err, 0};
	ck_assert_int_eq(ir_interp_node(&c, n, &in, &out), KILN_ESHAPE);
	ck_assert_ptr_nonnull(strstr(err.msg, "Transpose: output is not the permuted input"));
	kiln_tensor_free(in), kiln_tensor_free(out);
	kiln_graph_free(g);
}
END_TEST

/* ---- element access by dtype ------------------------------------------- */

static uint16_t bits16(kiln_dtype dt, double v)
{
	kiln_tensor *t = tensor(dt, 1, (int64_t[]){1}, &v);
	uint16_t b = *(uint16_t *)t->data;
	kiln_tensor_free(t);
	return b;
}

START_TEST(f16_rounds_to_nearest_even)
{
	ck_assert_uint_eq(bits16(KILN_F16, 1.0), 0x3c00);
	ck_assert_uint_eq(bits16(KILN_F16, 1.0 / 3), 0x3555);
	ck_assert_uint_eq(bits16(KILN_F16, 1 + 0x1p-11), 0x3c00);     /* tie: stays even */
	ck_assert_uint_eq(bits16(KILN_F16, 1 + 3 * 0x1p-11), 0x3c02); /* tie: up to even */
	ck_assert_uint_eq(bits16(KILN_F16, 65519), 0x7bff);           /* 65504 */
	ck_assert_uint_eq(bits16(KILN_F16, 65520), 0x7c00);           /* overflows to inf */
	ck_assert_uint_eq(bits16(KILN_F16, -0x1p-24), 0x8001);        /* smallest subnormal */
	ck_assert_uint_eq(bits16(KILN_F16, 0x1p-25), 0x0000);         /* tie to even zero */
	ck_assert_uint_eq(bits16(KILN_F16, 3 * 0x1p-25), 0x0002);
	ck_assert_uint_eq(bits16(KILN_F16, NAN) & 0x7e00, 0x7e00);
	kiln_tensor *t = tensor(KILN_F16, 1, (int64_t[]){1}, (double[]){0x1p-24});
	ck_assert_double_eq(ir_load(t, 0), 0x1p-24);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(bf16_rounds_to_nearest_even)
{
	ck_assert_uint_eq(bits16(KILN_BF16, 1.0), 0x3f80);
	ck_assert_uint_eq(bits16(KILN_BF16, 1 + 0x1p-8), 0x3f80);     /* tie: stays even */
	ck_assert_uint_eq(bits16(KILN_BF16, 1 + 3 * 0x1p-8), 0x3f82); /* tie: up to even */
	ck_assert_uint_eq(bits16(KILN_BF16, 1 + 0x1p-8 + 0x1p-30), 0x3f81); /* no double rounding */
	ck_assert_uint_eq(bits16(KILN_BF16, -3.0e38), 0xff62);
	ck_assert_uint_eq(bits16(KILN_BF16, 1e39), 0x7f80);
	kiln_tensor *t = tensor(KILN_BF16, 1, (int64_t[]){1}, (double[]){-2.5});
	ck_assert_double_eq(ir_load(t, 0), -2.5);
	kiln_tensor_free(t);
}
END_TEST

START_TEST(integer_stores_truncate_saturate_and_wrap)
{
	kiln_tensor *t = tensor(KILN_I8, 1, (int64_t[]){4}, (double[]){-2.9, 300, NAN, -1e9});
	ck_assert_int_eq(ir_load_i64(t, 0), -2);
	ck_assert_int_eq(ir_load_i64(t, 1), 127);
	ck_assert_int_eq(ir_load_i64(t, 2), 0);
	ck_assert_int_eq(ir_load_i64(t, 3), -128);
	ir_store_i64(t, 0, 300); /* integer to integer wraps, as numpy's astype */
	ck_assert_int_eq(ir_load_i64(t, 0), 44);
	kiln_tensor_free(t);
	kiln_tensor *b = tensor(KILN_BOOL, 1, (int64_t[]){3}, (double[]){0.0, -0.5, NAN});
	ck_assert_int_eq(((uint8_t *)b->data)[0], 0);
	ck_assert_int_eq(((uint8_t *)b->data)[1], 1);
	ck_assert_int_eq(((uint8_t *)b->data)[2], 1);
	kiln_tensor_free(b);
	kiln_tensor *l = tensor(KILN_I64, 1, (int64_t[]){1}, NULL);
	ir_store_i64(l, 0, INT64_MAX);
	ck_assert_int_eq(ir_load_i64(l, 0), INT64_MAX);
	ir_store(l, 0, 1e300);
	ck_assert_int_eq(ir_load_i64(l, 0), INT64_MAX);
	kiln_tensor_free(l);
}
END_TEST

static Suite *interp_suite(void)
{
	Suite *s = suite_create("interp");
	struct {
		const char *name;
		const TTest *fn;
		int n;
	} loops[] = {
		{"elementwise", elementwise_ops_match_torch, NCASES(elementwise)},
		{"broadcasting", broadcasting_binary_ops_match_torch, NCASES(broadcasting)},
		{"reductions", reductions_match_torch, NCASES(reductions)},
		{"linalg", matmul_and_gemm_match_torch, NCASES(linalg)},
		{"conv", convolutions_match_torch, NCASES(convs)},
		{"pool", pools_match_torch, NCASES(pools)},
		{"norm", normalisations_match_torch, NCASES(norms)},
		{"movement", data_movement_matches_torch, NCASES(movement)},
		{"dropout", dropout_matches_documented_generator, NCASES(regularisation)},
		{"losses", losses_match_torch, NCASES(losses)},
	};
	for (size_t i = 0; i < sizeof loops / sizeof loops[0]; i++) {
		TCase *tc = tcase_create(loops[i].name);
		tcase_add_loop_test(tc, loops[i].fn, 0, loops[i].n);
		suite_add_tcase(s, tc);
	}
	TCase *tc = tcase_create("coverage");
	tcase_add_test(tc, every_op_has_a_kernel_and_a_fixture_case);
	tcase_add_test(tc, constant_yields_its_value);
	tcase_add_test(tc, shape_reads_the_bound_symbolic_dims);
	suite_add_tcase(s, tc);
	tc = tcase_create("driver");
	tcase_add_test(tc, symbolic_batch_runs_at_two_sizes);
	tcase_add_test(tc, run_rejects_wrong_input_count);
	tcase_add_test(tc, run_rejects_wrong_dtype);
	tcase_add_test(tc, run_rejects_wrong_fixed_dim);
	tcase_add_test(tc, run_rejects_inconsistent_symbol_binding);
	tcase_add_test(tc, run_rejects_gather_index_out_of_range);
	tcase_add_test(tc, run_rejects_integer_division_by_zero);
	tcase_add_test(tc, run_rejects_loss_target_out_of_range);
	tcase_add_test(tc, run_reports_the_graphs_sticky_error);
	tcase_add_test(tc, kernel_rejects_an_output_shape_it_cannot_fill);
	suite_add_tcase(s, tc);
	tc = tcase_create("dtypes");
	tcase_add_test(tc, f16_rounds_to_nearest_even);
	tcase_add_test(tc, bf16_rounds_to_nearest_even);
	tcase_add_test(tc, integer_stores_truncate_saturate_and_wrap);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(interp_suite)
