/* test_lower.c: graph -> kernel IR lowering (codegen/lower*.c), the kernel
 * IR evaluator (codegen/keval.c), the memory plan (passes/memplan.c) and
 * the kernel IR dump (codegen/kernel.c).
 *
 * Every op case of test_interp.c (same fixture inputs from tests/fixtures/
 * ops, same attributes; keep the tables in step) is lowered, planned and
 * run through cg_eval, and must match kiln_graph_run: 1e-5 for f32, 1e-12
 * for f64, exact for integers and bools.  The example MLP and CNN with
 * PyTorch's weights must match the interpreter too.  Then the memory plan's
 * invariants, golden substrings of the dump, and lowering errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "examples/models.h"
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

/* ---- helpers -------------------------------------------------------------- */

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

static kiln_tensor *load_npy(const char *path)
{
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

/* Largest |got - want| (0 when both are NaN); dtype and shape must agree;
 * integers compare exactly. */
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
			e = INFINITY;
		worst = isnan(e) || e > worst ? (isnan(e) ? INFINITY : e) : worst;
	}
	return worst;
}

/* Lowers g, plans memory and checks the plan, returning the module. */
static cg_module *lower(const kiln_graph *g)
{
	cg_module *m = NULL;
	kiln_error err = {0};
	ck_assert_msg(cg_lower(g, &m, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(cg_memplan(m, &err) == KILN_OK, "%s", err.msg);
	for (int a = 0; a < m->nbuf; a++)
		for (int b = a + 1; b < m->nbuf; b++) {
			const cg_buf *x = &m->buf[a], *y = &m->buf[b];
			if (x->slot < 0 || x->slot != y->slot)
				continue;
			ck_assert_msg(x->last < y->first || y->last < x->first,
			              "buf%d [%d,%d] and buf%d [%d,%d] overlap in slot %d", a, x->first,
			              x->last, b, y->first, y->last, x->slot);
		}
	for (int b = 0; b < m->nbuf; b++) {
		const cg_buf *x = &m->buf[b];
		bool planned = x->kind == CG_BUF_TEMP && x->alias < 0;
		ck_assert_msg(planned == (x->slot >= 0), "buf%d: slot %d", b, x->slot);
		ck_assert_int_lt(x->slot, m->nslot);
	}
	return m;
}

/* Interpreter and lowered module on the same inputs: max error per output. */
static void compare(const kiln_graph *g, kiln_tensor **in, int nin, int nout, double tol,
                    const char *name)
{
	kiln_tensor *want[8] = {0}, *got[8] = {0};
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_run(g, in, nin, want, nout, &err) == KILN_OK, "%s: %s", name, err.msg);
	cg_module *m = lower(g);
	kiln_status st = cg_eval(m, in, nin, got, nout, &err);
	ck_assert_msg(st == KILN_OK, "%s: %s", name, err.msg);
	for (int k = 0; k < nout; k++) {
		double e = max_err(name, k, got[k], want[k]);
		ck_assert_msg(e <= tol, "%s out%d: max error %g > %g", name, k, e, tol);
	}
	for (int k = 0; k < nout; k++)
		kiln_tensor_free(want[k]), kiln_tensor_free(got[k]);
	cg_module_free(m);
}

static void run_case(const opcase *c)
{
	kiln_tensor *in[8] = {0}, *want;
	uint32_t ids[8], nin = 0, nout = 0;
	kiln_graph *g = kiln_graph_new(c->name);
	for (; nin < 8 && (in[nin] = fixture(c->name, "in", nin)); nin++) {
		ir_type t = type_of(in[nin]);
		ids[nin] = ir_input_new(g, NULL, &t);
	}
	while (nout < 4 && (want = fixture(c->name, "out", nout))) {
		kiln_tensor_free(want);
		nout++;
	}
	ck_assert_msg(nout > 0, "%s: no fixture outputs", c->name);
	ir_node *n = ir_node_new(g, c->op, nin, ids, nout, KILN_HERE);
	ck_assert_ptr_nonnull(n);
	set_attrs(g, n, c->attrs);
	ck_assert_msg(ir_infer_node(g, n) == KILN_OK, "%s: %s", c->name, kiln_graph_errmsg(g));
	for (uint32_t k = 0; k < nout; k++)
		ir_output_add(g, n->out[k], NULL);
	compare(g, in, (int)nin, (int)nout, c->tol ? c->tol : 1e-5, c->name);
	for (int k = 0; k < 8; k++)
		kiln_tensor_free(in[k]);
	kiln_graph_free(g);
}

START_TEST(elementwise_ops_match_interpreter) { run_case(&elementwise[_i]); }
END_TEST
START_TEST(broadcasting_ops_match_interpreter) { run_case(&broadcasting[_i]); }
END_TEST
START_TEST(reductions_match_interpreter) { run_case(&reductions[_i]); }
END_TEST
START_TEST(matmul_and_gemm_match_interpreter) { run_case(&linalg[_i]); }
END_TEST
START_TEST(convolutions_match_interpreter) { run_case(&convs[_i]); }
END_TEST
START_TEST(pools_match_interpreter) { run_case(&pools[_i]); }
END_TEST
START_TEST(normalisations_match_interpreter) { run_case(&norms[_i]); }
END_TEST
START_TEST(data_movement_matches_interpreter) { run_case(&movement[_i]); }
END_TEST
START_TEST(dropout_matches_interpreter_bit_for_bit) { run_case(&regularisation[_i]); }
END_TEST
START_TEST(losses_match_interpreter) { run_case(&losses[_i]); }
END_TEST

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

START_TEST(every_op_has_a_lowering_and_a_case)
{
	char missing[1024] = "";
	for (int op = 0; op < KILN_OP_COUNT; op++) {
		/* Constant is a CONST buffer made by the driver; Shape is tested below */
		bool covered = op == KILN_OP_CONSTANT || op == KILN_OP_SHAPE;
		bool lowered = op == KILN_OP_CONSTANT || cg_lower_table[op];
		for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
			for (int i = 0; i < tables[t].n; i++)
				covered = covered || tables[t].cases[i].op == (kiln_op)op;
		if (!covered || !lowered)
			snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s",
			         ir_op(op)->onnx);
	}
	ck_assert_msg(!missing[0], "ops without a lowering or a case:%s", missing);
}
END_TEST

/* ---- hand-built graphs ------------------------------------------------------ */

static kiln_tensor *tensor(kiln_dtype dt, int rank, const int64_t *shape, const double *v)
{
	kiln_tensor *t = kiln_tensor_new(dt, rank, shape);
	ck_assert_ptr_nonnull(t);
	for (int64_t i = 0; v && i < kiln_tensor_numel(t); i++)
		ir_store(t, i, v[i]);
	return t;
}

static kiln_tensor *ramp(kiln_dtype dt, int rank, const int64_t *shape)
{
	kiln_tensor *t = tensor(dt, rank, shape, NULL);
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		ir_store(t, i, ((i * 7) % 11) * 0.25 - 1);
	return t;
}

static uint32_t input(kiln_graph *g, const char *name, kiln_dtype dt, int rank,
                      const int64_t *dims)
{
	ir_type t = {dt, rank, {0}};
	memcpy(t.dim, dims, rank * sizeof *dims);
	return ir_input_new(g, name, &t);
}

static uint32_t op1(kiln_graph *g, kiln_op op, uint32_t nin, const uint32_t *in, const char *attrs)
{
	ir_node *n = ir_node_new(g, op, nin, in, 1, KILN_HERE);
	ck_assert_ptr_nonnull(n);
	set_attrs(g, n, attrs);
	ck_assert_msg(ir_infer_node(g, n) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return n->out[0];
}

/* Captures cg_print's text. */
static char *dump(const cg_module *m)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	ck_assert_ptr_nonnull(f);
	cg_print(m, f);
	fclose(f);
	return text;
}

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

START_TEST(same_shape_add_is_one_flat_vectorized_loop)
{
	kiln_graph *g = kiln_graph_new("add");
	int64_t N = kiln_sym(g, "N");
	uint32_t ab[2] = {input(g, "a", KILN_F32, 2, (int64_t[]){N, 16}),
	                  input(g, "b", KILN_F32, 2, (int64_t[]){N, 16})};
	ir_output_add(g, op1(g, KILN_OP_ADD, 2, ab, ""), "y");
	cg_module *m = lower(g);
	char *text = dump(m);
	ck_assert_int_eq(m->nkern, 1);
	ck_assert_int_eq(count(text, "for "), 1);
	ck_assert_msg(strstr(text, "for %i0 in 0..N*16 [vectorize] {"), "%s", text);
	ck_assert_msg(strstr(text, "buf2[%i0] = buf0[%i0] + buf1[%i0]"), "%s", text);
	ck_assert_msg(strstr(text, "buf2 output f32[N,16] numel=N*16 io=0 \"y\""), "%s", text);
	free(text);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(bias_add_over_channels_groups_the_pixels)
{
	kiln_graph *g = kiln_graph_new("bias");
	uint32_t ab[2] = {input(g, "x", KILN_F32, 4, (int64_t[]){kiln_sym(g, "N"), 64, 32, 32}),
	                  input(g, "b", KILN_F32, 3, (int64_t[]){64, 1, 1})};
	ir_output_add(g, op1(g, KILN_OP_ADD, 2, ab, ""), "y");
	cg_module *m = lower(g);
	char *text = dump(m);
	/* [N] [64] [32*32]: three loops, the big one parallel, the pixels contiguous */
	ck_assert_int_eq(count(text, "for "), 3);
	ck_assert_msg(strstr(text, "for %i0 in 0..N [parallel] {"), "%s", text);
	ck_assert_msg(strstr(text, "for %i2 in 0..1024 [vectorize] {"), "%s", text);
	ck_assert_msg(strstr(text, "buf1[%i1]"), "%s", text);
	free(text);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(softmax_reduces_in_locals_along_the_contiguous_axis)
{
	kiln_graph *g = kiln_graph_new("sm");
	uint32_t x = input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 10});
	ir_output_add(g, op1(g, KILN_OP_SOFTMAX, 1, &x, ""), "y");
	cg_module *m = lower(g);
	char *text = dump(m);
	ck_assert_int_eq(count(text, "[vectorize, reduce]"), 2);
	ck_assert_msg(strstr(text, "%t1: f32 = max(%t1, buf0[%i0*10 + %i2])"), "%s", text);
	ck_assert_msg(strstr(text, "exp(buf0[%i0*10 + %i4] - %t1)"), "%s", text);
	free(text);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(matmul_lowers_to_one_gemm_with_the_batch_folded)
{
	kiln_graph *g = kiln_graph_new("mm");
	int64_t B = kiln_sym(g, "B");
	uint32_t ab[2] = {input(g, "a", KILN_F32, 3, (int64_t[]){B, 5, 8}),
	                  input(g, "w", KILN_F32, 2, (int64_t[]){8, 3})};
	ir_output_add(g, op1(g, KILN_OP_MATMUL, 2, ab, ""), "y");
	cg_module *m = lower(g);
	char *text = dump(m);
	ck_assert_msg(strstr(text, "gemm M=5*B N=3 K=8 batch=1 A=buf0[0; 0, 8, 1] B=buf1[0; 0, 3, 1]"),
	              "%s", text);
	ck_assert_int_eq(count(text, "for "), 0);
	free(text);
	int64_t shape[3] = {3, 5, 8};
	kiln_tensor *in[2] = {ramp(KILN_F32, 3, shape), ramp(KILN_F32, 2, (int64_t[]){8, 3})};
	compare(g, in, 2, 1, 1e-5, "matmul folded");
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(broadcast_batch_matmul_uses_stride_zero)
{
	kiln_graph *g = kiln_graph_new("bmm");
	uint32_t ab[2] = {input(g, "a", KILN_F32, 4, (int64_t[]){2, 1, 4, 3}),
	                  input(g, "b", KILN_F32, 3, (int64_t[]){5, 3, 2})};
	ir_output_add(g, op1(g, KILN_OP_MATMUL, 2, ab, ""), "y");
	kiln_tensor *in[2] = {ramp(KILN_F32, 4, (int64_t[]){2, 1, 4, 3}),
	                      ramp(KILN_F32, 3, (int64_t[]){5, 3, 2})};
	compare(g, in, 2, 1, 1e-5, "broadcast matmul");
	cg_module *m = lower(g);
	char *text = dump(m);
	ck_assert_msg(strstr(text, "batch=5 A=buf0[%i0*12; 0, 3, 1] B=buf1[0; 6, 2, 1]"), "%s", text);
	free(text);
	cg_module_free(m);
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	kiln_graph_free(g);
}
END_TEST

START_TEST(gemm_vector_c_becomes_a_column_bias)
{
	kiln_graph *g = kiln_graph_new("gemm");
	uint32_t abc[3] = {input(g, "a", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 6}),
	                   input(g, "b", KILN_F32, 2, (int64_t[]){4, 6}),
	                   input(g, "c", KILN_F32, 1, (int64_t[]){4})};
	ir_output_add(g, op1(g, KILN_OP_GEMM, 3, abc, "transB=1"), "y");
	cg_module *m = lower(g);
	char *text = dump(m);
	ck_assert_int_eq(m->nkern, 1);
	ck_assert_msg(strstr(text, "B=buf1[0; 0, 1, 6]"), "%s", text);
	ck_assert_msg(strstr(text, "bias=buf2[0] per column"), "%s", text);
	free(text);
	kiln_tensor *in[3] = {ramp(KILN_F32, 2, (int64_t[]){3, 6}), ramp(KILN_F32, 2, (int64_t[]){4, 6}),
	                      ramp(KILN_F32, 1, (int64_t[]){4})};
	compare(g, in, 3, 1, 1e-5, "gemm bias");
	for (int i = 0; i < 3; i++)
		kiln_tensor_free(in[i]);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(relu_after_gemm_fuses_into_its_epilogue)
{
	kiln_graph *g = kiln_graph_new("mlp");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){N, 12});
	kiln_value h = kiln_relu(g, kiln_linear(g, "fc1", x, 8, true));
	kiln_output(g, "y", kiln_relu(g, kiln_linear(g, "fc2", h, 4, true)));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	cg_module *m = lower(g);
	char *text = dump(m);
	/* fc1's relu is fused; fc2's result is a graph output, so its relu is not */
	ck_assert_int_eq(m->nkern, 3);
	ck_assert_int_eq(count(text, "per column relu"), 1);
	ck_assert_int_eq(count(text, "_relu"), 1);
	free(text);
	kiln_tensor *in = ramp(KILN_F32, 2, (int64_t[]){3, 12});
	compare(g, &in, 1, 1, 1e-5, "fused relu");
	kiln_tensor_free(in);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(pointwise_conv_is_a_gemm_without_im2col)
{
	kiln_graph *g = kiln_graph_new("pw");
	uint32_t xw[2] = {input(g, "x", KILN_F32, 4, (int64_t[]){kiln_sym(g, "N"), 3, 4, 5}),
	                  input(g, "w", KILN_F32, 4, (int64_t[]){6, 3, 1, 1})};
	ir_output_add(g, op1(g, KILN_OP_CONV, 2, xw, ""), "y");
	cg_module *m = lower(g);
	char *text = dump(m);
	ck_assert_int_eq(m->nbuf, 3); /* no im2col scratch */
	ck_assert_msg(strstr(text, "gemm M=6 N=20 K=3 batch=N"), "%s", text);
	free(text);
	kiln_tensor *in[2] = {ramp(KILN_F32, 4, (int64_t[]){2, 3, 4, 5}),
	                      ramp(KILN_F32, 4, (int64_t[]){6, 3, 1, 1})};
	compare(g, in, 2, 1, 1e-5, "pointwise conv");
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(depthwise_conv_with_symbolic_batch_matches)
{
	kiln_graph *g = kiln_graph_new("dw");
	uint32_t xwb[3] = {input(g, "x", KILN_F32, 4, (int64_t[]){kiln_sym(g, "N"), 4, 6, 6}),
	                   input(g, "w", KILN_F32, 4, (int64_t[]){4, 1, 3, 3}),
	                   input(g, "b", KILN_F32, 1, (int64_t[]){4})};
	ir_output_add(g, op1(g, KILN_OP_CONV, 3, xwb, "group=4 pads=1,1,1,1 strides=2,2"), "y");
	for (int64_t N = 1; N <= 3; N += 2) {
		kiln_tensor *in[3] = {ramp(KILN_F32, 4, (int64_t[]){N, 4, 6, 6}),
		                      ramp(KILN_F32, 4, (int64_t[]){4, 1, 3, 3}),
		                      ramp(KILN_F32, 1, (int64_t[]){4})};
		compare(g, in, 3, 1, 1e-5, "depthwise");
		for (int i = 0; i < 3; i++)
			kiln_tensor_free(in[i]);
	}
	kiln_graph_free(g);
}
END_TEST

START_TEST(shape_stores_the_bound_symbolic_dims)
{
	kiln_graph *g = kiln_graph_new("s");
	uint32_t x = input(g, "x", KILN_F32, 3, (int64_t[]){kiln_sym(g, "N"), 3, 5});
	ir_output_add(g, op1(g, KILN_OP_SHAPE, 1, &x, ""), "all");
	ir_output_add(g, op1(g, KILN_OP_SHAPE, 1, &x, "start=-2"), "tail");
	kiln_tensor *in = tensor(KILN_F32, 3, (int64_t[]){4, 3, 5}, NULL), *out[2];
	cg_module *m = lower(g);
	kiln_error err = {0};
	ck_assert_msg(cg_eval(m, &in, 1, out, 2, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(out[0]->dtype, KILN_I64);
	ck_assert_int_eq(ir_load_i64(out[0], 0), 4);
	ck_assert_int_eq(ir_load_i64(out[0], 2), 5);
	ck_assert_int_eq(kiln_tensor_numel(out[1]), 2);
	ck_assert_int_eq(ir_load_i64(out[1], 0), 3);
	kiln_tensor_free(out[0]), kiln_tensor_free(out[1]), kiln_tensor_free(in);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(constant_output_and_repeated_outputs_are_copied)
{
	kiln_graph *g = kiln_graph_new("c");
	uint32_t x = input(g, "x", KILN_F32, 1, (int64_t[]){3});
	kiln_tensor *t = tensor(KILN_F32, 1, (int64_t[]){3}, (double[]){4, -2, 7});
	ir_node *n = ir_node_new(g, KILN_OP_CONSTANT, 0, NULL, 1, KILN_HERE);
	ck_assert_int_eq(ir_attr_set_tensor(g, n, "value", t), KILN_OK);
	ck_assert_int_eq(ir_infer_node(g, n), KILN_OK);
	uint32_t r = op1(g, KILN_OP_RELU, 1, &x, "");
	uint32_t v = op1(g, KILN_OP_RESHAPE, 1, &r, "shape=3");
	ir_output_add(g, n->out[0], "c");
	ir_output_add(g, x, "x_again");
	ir_output_add(g, r, "r");
	ir_output_add(g, r, "r_again");
	ir_output_add(g, v, "view");
	kiln_tensor *in = tensor(KILN_F32, 1, (int64_t[]){3}, (double[]){-1, 2, -3});
	compare(g, &in, 1, 5, 0, "copies");
	cg_module *m = lower(g);
	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(m->buf[m->outputs[i]].kind, CG_BUF_OUTPUT);
		ck_assert_int_eq(m->buf[m->outputs[i]].io_index, i);
	}
	ck_assert_int_eq(m->nkern, 5); /* relu and four copies (c, x, r again, view) */
	cg_module_free(m);
	kiln_tensor_free(in), kiln_tensor_free(t);
	kiln_graph_free(g);
}
END_TEST

/* Kernels cannot fail: an index outside [-dim, dim) is clamped, and the
 * evaluator (which bounds-checks every access) sees no stray read. */
START_TEST(gather_clamps_out_of_range_indices)
{
	kiln_graph *g = kiln_graph_new("gather");
	uint32_t xi[2] = {input(g, "x", KILN_F32, 2, (int64_t[]){4, 2}),
	                  input(g, "i", KILN_I64, 1, (int64_t[]){3})};
	ir_output_add(g, op1(g, KILN_OP_GATHER, 2, xi, ""), "y");
	kiln_tensor *in[2] = {ramp(KILN_F32, 2, (int64_t[]){4, 2}),
	                      tensor(KILN_I64, 1, (int64_t[]){3}, (double[]){-1, 9, -9})};
	kiln_tensor *y;
	cg_module *m = lower(g);
	kiln_error err = {0};
	ck_assert_msg(cg_eval(m, in, 2, &y, 1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_double_eq(ir_load(y, 0), ir_load(in[0], 6)); /* -1: the last row */
	ck_assert_double_eq(ir_load(y, 2), ir_load(in[0], 6)); /* 9: clamped to the last */
	ck_assert_double_eq(ir_load(y, 4), ir_load(in[0], 0)); /* -9: clamped to the first */
	kiln_tensor_free(y), kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(lowering_rejects_symbolic_channels)
{
	kiln_graph *g = kiln_graph_new("conv");
	int64_t C = kiln_sym(g, "C");
	uint32_t xw[2] = {input(g, "x", KILN_F32, 4, (int64_t[]){1, C, 5, 5}),
	                  input(g, "w", KILN_F32, 4, (int64_t[]){3, C, 3, 3})};
	ir_node *n = ir_node_new(g, KILN_OP_CONV, 2, xw, 1, (kiln_loc){"net.c", 12});
	n->name = ir_intern(g, "c1");
	ck_assert_msg(ir_infer_node(g, n) == KILN_OK, "%s", kiln_graph_errmsg(g));
	ir_output_add(g, n->out[0], "y");
	cg_module *m = (cg_module *)1;
	kiln_error err = {0};
	ck_assert_int_eq(cg_lower(g, &m, &err), KILN_EUNSUPPORTED);
	ck_assert_ptr_null(m);
	ck_assert_int_eq(err.code, KILN_EUNSUPPORTED);
	ck_assert_msg(strstr(err.msg, "net.c:12: Conv 'c1': symbolic channel counts"), "%s", err.msg);
	kiln_graph_free(g);
}
END_TEST

START_TEST(eval_rejects_wrong_input_count_and_shape)
{
	kiln_graph *g = kiln_graph_new("r");
	uint32_t x = input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 4});
	ir_output_add(g, op1(g, KILN_OP_RELU, 1, &x, ""), "y");
	cg_module *m = lower(g);
	kiln_tensor *bad = tensor(KILN_F32, 2, (int64_t[]){2, 5}, NULL), *y = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(cg_eval(m, NULL, 0, &y, 1, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "module has 1 inputs and 1 outputs, got 0 and 1"), "%s", err.msg);
	ck_assert_int_eq(cg_eval(m, &bad, 1, &y, 1, &err), KILN_ESHAPE);
	ck_assert_msg(strstr(err.msg, "input 0 dim 1 is 5"), "%s", err.msg);
	ck_assert_ptr_null(y);
	kiln_tensor_free(bad);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* ---- memory plan ------------------------------------------------------------- */

START_TEST(chain_of_ten_relus_uses_two_slots)
{
	kiln_graph *g = kiln_graph_new("chain");
	uint32_t v = input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 8});
	for (int i = 0; i < 10; i++)
		v = op1(g, KILN_OP_RELU, 1, &v, "");
	ir_output_add(g, v, "y");
	cg_module *m = lower(g);
	ck_assert_int_eq(m->nkern, 10);
	ck_assert_int_le(m->nslot, 2);
	ck_assert_int_ge(m->nslot, 2);
	kiln_tensor *x = ramp(KILN_F32, 2, (int64_t[]){3, 8});
	compare(g, &x, 1, 1, 0, "chain");
	kiln_tensor_free(x);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(views_extend_their_base_lifetime)
{
	kiln_graph *g = kiln_graph_new("view");
	uint32_t x = input(g, "x", KILN_F32, 2, (int64_t[]){4, 6});
	uint32_t a = op1(g, KILN_OP_NEG, 1, &x, "");           /* k0 writes a */
	uint32_t r = op1(g, KILN_OP_RESHAPE, 1, &a, "shape=24"); /* view of a */
	uint32_t b = op1(g, KILN_OP_EXP, 1, &x, "");             /* k1 */
	uint32_t c = op1(g, KILN_OP_ABS, 1, &b, "");             /* k2 */
	uint32_t rc[2] = {op1(g, KILN_OP_RESHAPE, 1, &c, "shape=24"), r};
	ir_output_add(g, op1(g, KILN_OP_ADD, 2, rc, ""), "y"); /* k3 reads the view */
	cg_module *m = lower(g);
	int ab = -1, rb = -1;
	for (int i = 0; i < m->nbuf; i++) {
		if (m->buf[i].value == a)
			ab = i;
		if (m->buf[i].value == r)
			rb = i;
	}
	ck_assert_int_eq(m->buf[rb].alias, ab);
	ck_assert_int_eq(m->buf[ab].first, 0);
	ck_assert_int_eq(m->buf[ab].last, 3);
	ck_assert_int_eq(m->buf[rb].slot, -1);
	kiln_tensor *in = ramp(KILN_F32, 2, (int64_t[]){4, 6});
	compare(g, &in, 1, 1, 1e-6, "view lifetime");
	kiln_tensor_free(in);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* ---- the example models ------------------------------------------------------ */

typedef kiln_value (*model_fn)(kiln_graph *g, kiln_value x);

static void model_matches(const char *name, model_fn model, int rank, const int64_t *feat)
{
	kiln_graph *g = kiln_graph_new(name);
	int64_t dims[KILN_MAX_RANK] = {kiln_sym(g, "N")};
	memcpy(dims + 1, feat, (rank - 1) * sizeof *feat);
	kiln_output(g, "logits", model(g, kiln_input(g, "x", KILN_F32, rank, dims)));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	char path[512];
	snprintf(path, sizeof path, "%s/models/%s.safetensors", KILN_FIXTURES, name);
	kiln_tensor_set *s = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_safetensors_read(path, &s, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_graph_load_params(g, s, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor_set_free(s);
	snprintf(path, sizeof path, "%s/models/%s_input.npy", KILN_FIXTURES, name);
	kiln_tensor *x = load_npy(path);
	compare(g, &x, 1, 1, 1e-5, name);
	kiln_tensor_free(x);
	kiln_graph_free(g);
}

START_TEST(mlp_matches_interpreter)
{
	model_matches("mlp", example_mlp, 2, (int64_t[]){784});
}
END_TEST

START_TEST(cnn_matches_interpreter)
{
	model_matches("cnn", example_cnn, 4, (int64_t[]){1, 28, 28});
}
END_TEST

static Suite *lower_suite(void)
{
	Suite *s = suite_create("lower");
	struct {
		const char *name;
		const TTest *fn;
		int n;
	} loops[] = {
		{"elementwise", elementwise_ops_match_interpreter, NCASES(elementwise)},
		{"broadcasting", broadcasting_ops_match_interpreter, NCASES(broadcasting)},
		{"reductions", reductions_match_interpreter, NCASES(reductions)},
		{"linalg", matmul_and_gemm_match_interpreter, NCASES(linalg)},
		{"conv", convolutions_match_interpreter, NCASES(convs)},
		{"pool", pools_match_interpreter, NCASES(pools)},
		{"norm", normalisations_match_interpreter, NCASES(norms)},
		{"movement", data_movement_matches_interpreter, NCASES(movement)},
		{"dropout", dropout_matches_interpreter_bit_for_bit, NCASES(regularisation)},
		{"losses", losses_match_interpreter, NCASES(losses)},
	};
	for (size_t i = 0; i < sizeof loops / sizeof loops[0]; i++) {
		TCase *tc = tcase_create(loops[i].name);
		tcase_add_loop_test(tc, loops[i].fn, 0, loops[i].n);
		suite_add_tcase(s, tc);
	}
	TCase *tc = tcase_create("coverage");
	tcase_add_test(tc, every_op_has_a_lowering_and_a_case);
	tcase_add_test(tc, shape_stores_the_bound_symbolic_dims);
	tcase_add_test(tc, constant_output_and_repeated_outputs_are_copied);
	tcase_add_test(tc, gather_clamps_out_of_range_indices);
	tcase_add_test(tc, lowering_rejects_symbolic_channels);
	tcase_add_test(tc, eval_rejects_wrong_input_count_and_shape);
	suite_add_tcase(s, tc);
	tc = tcase_create("loops");
	tcase_add_test(tc, same_shape_add_is_one_flat_vectorized_loop);
	tcase_add_test(tc, bias_add_over_channels_groups_the_pixels);
	tcase_add_test(tc, softmax_reduces_in_locals_along_the_contiguous_axis);
	tcase_add_test(tc, matmul_lowers_to_one_gemm_with_the_batch_folded);
	tcase_add_test(tc, broadcast_batch_matmul_uses_stride_zero);
	tcase_add_test(tc, gemm_vector_c_becomes_a_column_bias);
	tcase_add_test(tc, relu_after_gemm_fuses_into_its_epilogue);
	tcase_add_test(tc, pointwise_conv_is_a_gemm_without_im2col);
	tcase_add_test(tc, depthwise_conv_with_symbolic_batch_matches);
	suite_add_tcase(s, tc);
	tc = tcase_create("memplan");
	tcase_add_test(tc, chain_of_ten_relus_uses_two_slots);
	tcase_add_test(tc, views_extend_their_base_lifetime);
	suite_add_tcase(s, tc);
	tc = tcase_create("models");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, mlp_matches_interpreter);
	tcase_add_test(tc, cnn_matches_interpreter);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(lower_suite)
