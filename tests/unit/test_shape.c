/* test_shape.c: dtype and shape inference (ir/shape.c) for every op in
 * ops.def, symbolic dims, and the errors each rule reports.
 *
 * Types are written as text ("f32[N,3]"): inputs are made from it and the
 * inferred output is compared as text, which checks dtype, rank and every
 * dim (symbolic ones by their printed expression) in one assertion. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

#include "check_main.h"

static kiln_graph *g;

static void setup(void)
{
	g = kiln_graph_new("t");
}

static void teardown(void)
{
	kiln_graph_free(g);
}

/* "f32[N,3,224]": letters name symbols of g. */
static ir_type ty(const char *s)
{
	ir_type t = {0};
	char name[32];
	size_t k = 0;
	while (*s && *s != '[' && k + 1 < sizeof name)
		name[k++] = *s++;
	name[k] = 0;
	t.dtype = kiln_dtype_from_name(name);
	ck_assert_msg(t.dtype != KILN_DT_INVALID, "bad dtype in %s", name);
	for (s++; *s && *s != ']'; s += *s == ',') {
		if (isdigit((unsigned char)*s)) {
			t.dim[t.rank++] = strtoll(s, (char **)&s, 10);
			continue;
		}
		for (k = 0; isalnum((unsigned char)*s) && k + 1 < sizeof name;)
			name[k++] = *s++;
		name[k] = 0;
		t.dim[t.rank++] = kiln_sym(g, name);
	}
	return t;
}

static uint32_t val(const char *spec)
{
	ir_type t = ty(spec);
	return ir_input_new(g, NULL, &t);
}

/* node(op, nout, "f32[2]", "f32[3]", NULL) */
static ir_node *node(kiln_op op, uint32_t nout, ...)
{
	uint32_t in[16], nin = 0;
	va_list ap;
	va_start(ap, nout);
	for (const char *s; (s = va_arg(ap, const char *)) && nin < 16;)
		in[nin++] = val(s);
	va_end(ap);
	ir_node *n = ir_node_new(g, op, nin, in, nout, KILN_HERE);
	ck_assert_ptr_nonnull(n);
	return n;
}

/* The inferred type of output i, or "error: <message>". */
static const char *out_str(ir_node *n, uint32_t i)
{
	static char buf[1200];
	if (ir_infer_node(g, n) != KILN_OK) {
		snprintf(buf, sizeof buf, "error: %s", kiln_graph_errmsg(g));
		return buf;
	}
	return ir_type_str(g, &g->val[n->out[i]]->type, buf, sizeof buf);
}

static const char *infer(ir_node *n)
{
	return out_str(n, 0);
}

/* Asserts that inference fails with code and a message containing sub. */
static void fails(ir_node *n, kiln_status code, const char *sub)
{
	kiln_status st = ir_infer_node(g, n);
	ck_assert_msg(st == code, "status %s, want %s (%s)", kiln_status_str(st),
	              kiln_status_str(code), kiln_graph_errmsg(g));
	ck_assert_msg(strstr(kiln_graph_errmsg(g), sub), "message \"%s\" lacks \"%s\"",
	              kiln_graph_errmsg(g), sub);
}

#define INTS(n, name, ...)                                                           \
	ir_attr_set_ints(g, n, name, sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), \
	                 (int64_t[]){__VA_ARGS__})

/* ---- elementwise ----------------------------------------------------- */

START_TEST(unary_ops_keep_type)
{
	static const kiln_op ops[] = {
		KILN_OP_NEG, KILN_OP_ABS, KILN_OP_EXP, KILN_OP_LOG, KILN_OP_SQRT,
		KILN_OP_RECIPROCAL, KILN_OP_FLOOR, KILN_OP_CEIL, KILN_OP_SIN, KILN_OP_COS,
		KILN_OP_RELU, KILN_OP_LEAKY_RELU, KILN_OP_SIGMOID, KILN_OP_TANH, KILN_OP_GELU,
		KILN_OP_ERF, KILN_OP_CLIP, KILN_OP_IDENTITY,
	};
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		ir_node *n = node(ops[i], 1, "f16[N,3,5]", NULL);
		ck_assert_msg(!strcmp(infer(n), "f16[N,3,5]"), "%s: %s", ir_op(ops[i])->onnx,
		              infer(n));
	}
}
END_TEST

START_TEST(intok_unary_accepts_ints)
{
	ck_assert_str_eq(infer(node(KILN_OP_NEG, 1, "i32[4]", NULL)), "i32[4]");
	ck_assert_str_eq(infer(node(KILN_OP_CLIP, 1, "i64[2,2]", NULL)), "i64[2,2]");
	ck_assert_str_eq(infer(node(KILN_OP_IDENTITY, 1, "bool[3]", NULL)), "bool[3]");
	ck_assert_str_eq(infer(node(KILN_OP_NOT, 1, "bool[N]", NULL)), "bool[N]");
}
END_TEST

START_TEST(float_op_rejects_i64)
{
	fails(node(KILN_OP_EXP, 1, "i64[2,3]", NULL), KILN_ESHAPE,
	      "Exp: needs a float input, got i64[2,3]");
}
END_TEST

START_TEST(logic_op_rejects_f32)
{
	fails(node(KILN_OP_AND, 1, "f32[2]", "f32[2]", NULL), KILN_ESHAPE,
	      "needs a bool input, got f32[2]");
}
END_TEST

START_TEST(relu_rejects_bool)
{
	fails(node(KILN_OP_RELU, 1, "bool[2]", NULL), KILN_ESHAPE, "got bool[2]");
}
END_TEST

START_TEST(cast_sets_dtype)
{
	ir_node *n = node(KILN_OP_CAST, 1, "bool[N,2]", NULL);
	ir_attr_set_dtype(g, n, "to", KILN_F64);
	ck_assert_str_eq(infer(n), "f64[N,2]");
}
END_TEST

START_TEST(cast_requires_valid_to)
{
	fails(node(KILN_OP_CAST, 1, "f32[2]", NULL), KILN_EINVAL, "'to' must be a valid dtype");
}
END_TEST

START_TEST(gelu_rejects_unknown_approximation)
{
	ir_node *n = node(KILN_OP_GELU, 1, "f32[2]", NULL);
	ir_attr_set_string(g, n, "approximate", "tanh");
	ck_assert_str_eq(infer(n), "f32[2]");
	n = node(KILN_OP_GELU, 1, "f32[2]", NULL);
	ir_attr_set_string(g, n, "approximate", "erf");
	fails(n, KILN_EINVAL, "\"erf\"");
}
END_TEST

START_TEST(arity_is_checked)
{
	fails(node(KILN_OP_ADD, 1, "f32[2]", "f32[2]", "f32[2]", NULL), KILN_EINVAL,
	      "Add: takes 2 inputs, got 3");
}
END_TEST

START_TEST(output_arity_is_checked)
{
	fails(node(KILN_OP_DROPOUT, 3, "f32[2]", NULL), KILN_EINVAL, "takes 1 to 2 outputs, got 3");
}
END_TEST

/* ---- broadcasting ----------------------------------------------------- */

START_TEST(broadcast_sym_with_1_gives_sym)
{
	ck_assert_str_eq(infer(node(KILN_OP_ADD, 1, "f32[N,3]", "f32[1,3]", NULL)), "f32[N,3]");
	ck_assert_str_eq(infer(node(KILN_OP_MUL, 1, "f32[1]", "f32[N,1]", NULL)), "f32[N,1]");
	ck_assert_str_eq(infer(node(KILN_OP_SUB, 1, "f32[N,4]", "f32[N,4]", NULL)), "f32[N,4]");
}
END_TEST

START_TEST(broadcast_right_aligns_ranks)
{
	ck_assert_str_eq(infer(node(KILN_OP_DIV, 1, "f64[2,1,5]", "f64[3,1]", NULL)),
	                 "f64[2,3,5]");
	ck_assert_str_eq(infer(node(KILN_OP_POW, 1, "f32[]", "f32[4]", NULL)), "f32[4]");
}
END_TEST

START_TEST(broadcast_rejects_sym_vs_3)
{
	fails(node(KILN_OP_ADD, 1, "f32[N,3]", "f32[3,3]", NULL), KILN_ESHAPE,
	      "cannot broadcast f32[N,3] with f32[3,3]");
}
END_TEST

START_TEST(broadcast_rejects_3_vs_4)
{
	fails(node(KILN_OP_MUL, 1, "f32[2,3]", "f32[4]", NULL), KILN_ESHAPE,
	      "cannot broadcast f32[2,3] with f32[4]");
}
END_TEST

START_TEST(broadcast_rejects_two_symbols)
{
	fails(node(KILN_OP_ADD, 1, "f32[N]", "f32[M]", NULL), KILN_ESHAPE,
	      "cannot broadcast f32[N] with f32[M]");
}
END_TEST

START_TEST(binary_rejects_mixed_dtypes)
{
	fails(node(KILN_OP_ADD, 1, "f32[2]", "i64[2]", NULL), KILN_ESHAPE,
	      "dtypes differ: f32[2] vs i64[2]");
}
END_TEST

START_TEST(comparisons_give_bool)
{
	ck_assert_str_eq(infer(node(KILN_OP_EQUAL, 1, "i64[N]", "i64[1]", NULL)), "bool[N]");
	ck_assert_str_eq(infer(node(KILN_OP_LESS, 1, "f32[2,1]", "f32[3]", NULL)), "bool[2,3]");
	ck_assert_str_eq(infer(node(KILN_OP_GREATER, 1, "i32[]", "i32[]", NULL)), "bool[]");
	ck_assert_str_eq(infer(node(KILN_OP_AND, 1, "bool[2]", "bool[1]", NULL)), "bool[2]");
	ck_assert_str_eq(infer(node(KILN_OP_OR, 1, "bool[N,1]", "bool[4]", NULL)), "bool[N,4]");
}
END_TEST

START_TEST(max_min_are_variadic)
{
	ck_assert_str_eq(infer(node(KILN_OP_MAX, 1, "f32[3,1]", "f32[4]", "f32[1,1]", NULL)),
	                 "f32[3,4]");
	ck_assert_str_eq(infer(node(KILN_OP_MIN, 1, "i32[5]", NULL)), "i32[5]");
}
END_TEST

START_TEST(where_broadcasts_all_three)
{
	ck_assert_str_eq(infer(node(KILN_OP_WHERE, 1, "bool[N,1]", "i64[3]", "i64[1]", NULL)),
	                 "i64[N,3]");
	fails(node(KILN_OP_WHERE, 1, "f32[2]", "f32[2]", "f32[2]", NULL), KILN_ESHAPE,
	      "condition must be bool, got f32[2]");
}
END_TEST

START_TEST(where_rejects_mixed_branches)
{
	fails(node(KILN_OP_WHERE, 1, "bool[2]", "f32[2]", "f64[2]", NULL), KILN_ESHAPE,
	      "dtypes differ: f32[2] vs f64[2]");
}
END_TEST

START_TEST(ir_broadcast_direct)
{
	ir_type a = ty("f32[N,1,3]"), b = ty("i64[7,1]"), o;
	ck_assert_int_eq(ir_broadcast(g, NULL, &a, &b, &o), KILN_OK);
	char buf[64];
	ck_assert_str_eq(ir_type_str(g, &o, buf, sizeof buf), "f32[N,7,3]");
}
END_TEST

/* ---- reductions ------------------------------------------------------- */

START_TEST(reduce_axes_and_keepdims)
{
	ir_node *n = node(KILN_OP_REDUCE_SUM, 1, "f32[N,3,4]", NULL);
	INTS(n, "axes", 1, -1);
	ck_assert_str_eq(infer(n), "f32[N,1,1]");
	n = node(KILN_OP_REDUCE_MEAN, 1, "f32[N,3,4]", NULL);
	INTS(n, "axes", 0);
	ir_attr_set_int(g, n, "keepdims", 0);
	ck_assert_str_eq(infer(n), "f32[3,4]");
}
END_TEST

START_TEST(reduce_empty_axes_means_all)
{
	ir_node *n = node(KILN_OP_REDUCE_MAX, 1, "i32[2,3]", NULL);
	ir_attr_set_int(g, n, "keepdims", 0);
	ck_assert_str_eq(infer(n), "i32[]");
	n = node(KILN_OP_REDUCE_MIN, 1, "f32[2,3]", NULL);
	ck_assert_str_eq(infer(n), "f32[1,1]");
	n = node(KILN_OP_REDUCE_MIN, 1, "f32[2,3]", NULL);
	ir_attr_set_int(g, n, "noop_with_empty_axes", 1);
	ck_assert_str_eq(infer(n), "f32[2,3]");
}
END_TEST

START_TEST(reduce_rejects_bad_axis)
{
	ir_node *n = node(KILN_OP_REDUCE_SUM, 1, "f32[2,3]", NULL);
	INTS(n, "axes", 2);
	fails(n, KILN_ESHAPE, "axis 2 out of range for f32[2,3]");
}
END_TEST

START_TEST(reduce_rejects_repeated_axis)
{
	ir_node *n = node(KILN_OP_REDUCE_SUM, 1, "f32[2,3]", NULL);
	INTS(n, "axes", 1, -1);
	fails(n, KILN_ESHAPE, "axis -1 repeated");
}
END_TEST

START_TEST(reduce_mean_rejects_ints)
{
	fails(node(KILN_OP_REDUCE_MEAN, 1, "i64[2]", NULL), KILN_ESHAPE, "needs a float input");
}
END_TEST

START_TEST(argmax_gives_i64)
{
	ir_node *n = node(KILN_OP_ARGMAX, 1, "f32[N,10]", NULL);
	ir_attr_set_int(g, n, "axis", -1);
	ck_assert_str_eq(infer(n), "i64[N,1]");
	n = node(KILN_OP_ARGMAX, 1, "f32[N,10]", NULL);
	ir_attr_set_int(g, n, "axis", 1);
	ir_attr_set_int(g, n, "keepdims", 0);
	ck_assert_str_eq(infer(n), "i64[N]");
}
END_TEST

/* ---- linear algebra ---------------------------------------------------- */

START_TEST(matmul_2d_and_batched)
{
	ck_assert_str_eq(infer(node(KILN_OP_MATMUL, 1, "f32[N,784]", "f32[784,10]", NULL)),
	                 "f32[N,10]");
	ck_assert_str_eq(infer(node(KILN_OP_MATMUL, 1, "f32[2,1,3,4]", "f32[5,4,6]", NULL)),
	                 "f32[2,5,3,6]");
}
END_TEST

START_TEST(matmul_1d_operands)
{
	ck_assert_str_eq(infer(node(KILN_OP_MATMUL, 1, "f32[4]", "f32[4]", NULL)), "f32[]");
	ck_assert_str_eq(infer(node(KILN_OP_MATMUL, 1, "f32[4]", "f32[B,4,6]", NULL)),
	                 "f32[B,6]");
	ck_assert_str_eq(infer(node(KILN_OP_MATMUL, 1, "i32[B,3,4]", "i32[4]", NULL)),
	                 "i32[B,3]");
}
END_TEST

START_TEST(matmul_inner_dims_differ)
{
	fails(node(KILN_OP_MATMUL, 1, "f32[8,784]", "f32[128,10]", NULL), KILN_ESHAPE,
	      "MatMul: inner dims differ: f32[8,784] x f32[128,10]");
}
END_TEST

START_TEST(gemm_transposes_and_c)
{
	ir_node *n = node(KILN_OP_GEMM, 1, "f32[4,N]", "f32[10,4]", "f32[10]", NULL);
	ir_attr_set_int(g, n, "transA", 1);
	ir_attr_set_int(g, n, "transB", 1);
	ck_assert_str_eq(infer(n), "f32[N,10]");
	ck_assert_str_eq(infer(node(KILN_OP_GEMM, 1, "f32[2,3]", "f32[3,5]", NULL)), "f32[2,5]");
}
END_TEST

START_TEST(gemm_c_broadcasts_one_way)
{
	fails(node(KILN_OP_GEMM, 1, "f32[2,3]", "f32[3,5]", "f32[4,2,5]", NULL), KILN_ESHAPE,
	      "C f32[4,2,5] does not broadcast to the result f32[2,5]");
}
END_TEST

/* ---- convolution and pooling ---------------------------------------------- */

START_TEST(conv2d_stride_pad)
{
	ir_node *n = node(KILN_OP_CONV, 1, "f32[N,3,32,32]", "f32[16,3,3,3]", "f32[16]", NULL);
	INTS(n, "strides", 2, 2);
	INTS(n, "pads", 1, 1, 1, 1);
	ck_assert_str_eq(infer(n), "f32[N,16,16,16]");
}
END_TEST

START_TEST(conv1d_and_3d)
{
	ck_assert_str_eq(infer(node(KILN_OP_CONV, 1, "f32[2,4,10]", "f32[8,4,3]", NULL)),
	                 "f32[2,8,8]");
	ir_node *n = node(KILN_OP_CONV, 1, "f32[1,2,8,9,10]", "f32[4,2,3,3,3]", NULL);
	INTS(n, "dilations", 1, 2, 3);
	ck_assert_str_eq(infer(n), "f32[1,4,6,5,4]");
}
END_TEST

START_TEST(conv_groups)
{
	ir_node *n = node(KILN_OP_CONV, 1, "f32[1,8,5,5]", "f32[8,1,3,3]", NULL);
	ir_attr_set_int(g, n, "group", 8);
	ck_assert_str_eq(infer(n), "f32[1,8,3,3]");
}
END_TEST

START_TEST(conv_auto_pad)
{
	ir_node *n = node(KILN_OP_CONV, 1, "f32[1,1,7,8]", "f32[1,1,3,3]", NULL);
	ir_attr_set_string(g, n, "auto_pad", "SAME_UPPER");
	INTS(n, "strides", 2, 2);
	ck_assert_str_eq(infer(n), "f32[1,1,4,4]");
	n = node(KILN_OP_CONV, 1, "f32[1,1,7,8]", "f32[1,1,3,3]", NULL);
	ir_attr_set_string(g, n, "auto_pad", "VALID");
	INTS(n, "pads", 5, 5, 5, 5); /* ignored with VALID */
	ck_assert_str_eq(infer(n), "f32[1,1,5,6]");
}
END_TEST

START_TEST(conv_symbolic_spatial)
{
	ir_node *n = node(KILN_OP_CONV, 1, "f32[N,3,H,W]", "f32[8,3,3,3]", NULL);
	INTS(n, "pads", 1, 1, 1, 1);
	ck_assert_str_eq(infer(n), "f32[N,8,H,W]");
	n = node(KILN_OP_CONV, 1, "f32[N,3,H,W]", "f32[8,3,3,3]", NULL);
	INTS(n, "pads", 1, 1, 1, 1);
	INTS(n, "strides", 2, 2);
	ck_assert_str_eq(infer(n), "f32[N,8,(H+1)/2,(W+1)/2]");
}
END_TEST

START_TEST(conv_symbolic_spatial_shrink_unsupported)
{
	fails(node(KILN_OP_CONV, 1, "f32[N,3,H,8]", "f32[8,3,3,3]", NULL), KILN_EUNSUPPORTED,
	      "symbolic spatial dim H of f32[N,3,H,8]");
}
END_TEST

START_TEST(conv_channel_mismatch)
{
	fails(node(KILN_OP_CONV, 1, "f32[N,3,32,32]", "f32[16,4,3,3]", NULL), KILN_ESHAPE,
	      "channels differ: x f32[N,3,32,32] has 3, weight f32[16,4,3,3] expects 4");
}
END_TEST

START_TEST(conv_bad_bias)
{
	fails(node(KILN_OP_CONV, 1, "f32[1,3,5,5]", "f32[16,3,3,3]", "f32[8]", NULL),
	      KILN_ESHAPE, "bias f32[8] must be [16]");
}
END_TEST

START_TEST(conv_kernel_bigger_than_input)
{
	fails(node(KILN_OP_CONV, 1, "f32[1,3,2,2]", "f32[4,3,3,3]", NULL), KILN_ESHAPE,
	      "exceeds padded size 2");
}
END_TEST

START_TEST(conv_transpose_output_padding)
{
	ir_node *n = node(KILN_OP_CONV_TRANSPOSE, 1, "f32[N,8,5,5]", "f32[8,3,3,3]", NULL);
	INTS(n, "strides", 2, 2);
	INTS(n, "pads", 1, 1, 1, 1);
	INTS(n, "output_padding", 1, 1);
	ck_assert_str_eq(infer(n), "f32[N,3,10,10]");
	n = node(KILN_OP_CONV_TRANSPOSE, 1, "f32[1,4,H]", "f32[4,2,4]", NULL);
	INTS(n, "strides", 2);
	INTS(n, "pads", 1, 1);
	ir_attr_set_int(g, n, "group", 2);
	ck_assert_str_eq(infer(n), "f32[1,4,H*2]");
}
END_TEST

START_TEST(conv_transpose_output_shape)
{
	ir_node *n = node(KILN_OP_CONV_TRANSPOSE, 1, "f32[1,2,3,3]", "f32[2,5,3,3]", NULL);
	INTS(n, "strides", 3, 2);
	INTS(n, "output_shape", 10, 8);
	ck_assert_str_eq(infer(n), "f32[1,5,10,8]");
	fails(node(KILN_OP_CONV_TRANSPOSE, 1, "f32[1,2,3,3]", "f32[3,5,3,3]", NULL),
	      KILN_ESHAPE, "channels differ");
}
END_TEST

START_TEST(max_pool_ceil_mode)
{
	ir_node *n = node(KILN_OP_MAX_POOL, 1, "f32[N,3,6,6]", NULL);
	INTS(n, "kernel_shape", 3, 3);
	INTS(n, "strides", 2, 2);
	ck_assert_str_eq(infer(n), "f32[N,3,2,2]");
	n = node(KILN_OP_MAX_POOL, 1, "f32[N,3,6,6]", NULL);
	INTS(n, "kernel_shape", 3, 3);
	INTS(n, "strides", 2, 2);
	ir_attr_set_int(g, n, "ceil_mode", 1);
	ck_assert_str_eq(infer(n), "f32[N,3,3,3]");
	/* the last window would start in the padding: dropped, as in PyTorch */
	n = node(KILN_OP_MAX_POOL, 1, "f32[1,1,5]", NULL);
	INTS(n, "kernel_shape", 2);
	INTS(n, "strides", 2);
	INTS(n, "pads", 1, 1);
	ir_attr_set_int(g, n, "ceil_mode", 1);
	ck_assert_str_eq(infer(n), "f32[1,1,3]");
}
END_TEST

START_TEST(pool_requires_kernel_shape)
{
	fails(node(KILN_OP_AVERAGE_POOL, 1, "f32[1,1,4,4]", NULL), KILN_EINVAL,
	      "kernel_shape is required");
}
END_TEST

START_TEST(average_pool_1d_and_global)
{
	ir_node *n = node(KILN_OP_AVERAGE_POOL, 1, "f64[2,3,9]", NULL);
	INTS(n, "kernel_shape", 3);
	INTS(n, "strides", 3);
	ck_assert_str_eq(infer(n), "f64[2,3,3]");
	ck_assert_str_eq(infer(node(KILN_OP_GLOBAL_AVERAGE_POOL, 1, "f32[N,C,7,7]", NULL)),
	                 "f32[N,C,1,1]");
	fails(node(KILN_OP_GLOBAL_AVERAGE_POOL, 1, "f32[2,3]", NULL), KILN_ESHAPE,
	      "input must have rank 3 to 8, got f32[2,3]");
}
END_TEST

START_TEST(pool_rejects_wrong_kernel_length)
{
	ir_node *n = node(KILN_OP_MAX_POOL, 1, "f32[1,1,4,4]", NULL);
	INTS(n, "kernel_shape", 2);
	fails(n, KILN_EINVAL, "kernel_shape has 1 values, expected 2");
}
END_TEST

/* ---- normalisation ------------------------------------------------------ */

START_TEST(batch_norm_inference_and_training)
{
	ck_assert_str_eq(infer(node(KILN_OP_BATCH_NORM, 1, "f32[N,4,5,5]", "f32[4]", "f32[4]",
	                            "f32[4]", "f32[4]", NULL)),
	                 "f32[N,4,5,5]");
	ir_node *n = node(KILN_OP_BATCH_NORM, 3, "f32[N,4]", "f32[4]", "f32[4]", "f32[4]",
	                  "f32[4]", NULL);
	ir_attr_set_int(g, n, "training_mode", 1);
	ck_assert_str_eq(out_str(n, 0), "f32[N,4]");
	ck_assert_str_eq(out_str(n, 1), "f32[4]");
	ck_assert_str_eq(out_str(n, 2), "f32[4]");
}
END_TEST

START_TEST(batch_norm_rejects_extra_outputs_in_inference)
{
	fails(node(KILN_OP_BATCH_NORM, 3, "f32[2,4]", "f32[4]", "f32[4]", "f32[4]", "f32[4]",
	           NULL),
	      KILN_EINVAL, "only training_mode=1 returns running stats");
}
END_TEST

START_TEST(batch_norm_rejects_wrong_channels)
{
	fails(node(KILN_OP_BATCH_NORM, 1, "f32[2,4]", "f32[3]", "f32[4]", "f32[4]", "f32[4]",
	           NULL),
	      KILN_ESHAPE, "scale f32[3] must be a float vector of the channels of X f32[2,4]");
}
END_TEST

START_TEST(layer_norm_optional_outputs)
{
	ir_node *n = node(KILN_OP_LAYER_NORM, 3, "f16[N,T,8]", "f16[8]", "f16[8]", NULL);
	ck_assert_str_eq(out_str(n, 0), "f16[N,T,8]");
	ck_assert_str_eq(out_str(n, 1), "f32[N,T,1]");
	ck_assert_str_eq(out_str(n, 2), "f32[N,T,1]");
	n = node(KILN_OP_LAYER_NORM, 2, "f32[N,T,8]", "f32[T,8]", NULL);
	ir_attr_set_int(g, n, "axis", 1);
	ck_assert_str_eq(out_str(n, 1), "f32[N,1,1]");
}
END_TEST

START_TEST(layer_norm_rejects_bad_scale)
{
	fails(node(KILN_OP_LAYER_NORM, 1, "f32[2,8]", "f32[4]", NULL), KILN_ESHAPE,
	      "cannot broadcast f32[8] with f32[4]");
}
END_TEST

START_TEST(softmax_checks_axis)
{
	ck_assert_str_eq(infer(node(KILN_OP_SOFTMAX, 1, "f32[N,10]", NULL)), "f32[N,10]");
	ir_node *n = node(KILN_OP_LOG_SOFTMAX, 1, "f32[N,10]", NULL);
	ir_attr_set_int(g, n, "axis", -3);
	fails(n, KILN_ESHAPE, "axis -3 out of range for f32[N,10]");
}
END_TEST

START_TEST(dropout_mask_is_bool)
{
	ir_node *n = node(KILN_OP_DROPOUT, 2, "f32[N,5]", NULL);
	ck_assert_str_eq(out_str(n, 0), "f32[N,5]");
	ck_assert_str_eq(out_str(n, 1), "bool[N,5]");
	n = node(KILN_OP_DROPOUT, 1, "f32[2]", NULL);
	ir_attr_set_float(g, n, "ratio", 1.0);
	fails(n, KILN_EINVAL, "ratio must be in [0, 1)");
}
END_TEST

/* ---- losses ---------------------------------------------------------- */

START_TEST(softmax_ce_reductions)
{
	ir_node *n = node(KILN_OP_SOFTMAX_CE, 2, "f32[N,10]", "i64[N]", NULL);
	ck_assert_str_eq(out_str(n, 0), "f32[]");
	ck_assert_str_eq(out_str(n, 1), "f32[N,10]");
	n = node(KILN_OP_SOFTMAX_CE, 1, "f32[N,10,4,4]", "i32[N,4,4]", "f32[10]", NULL);
	ir_attr_set_string(g, n, "reduction", "none");
	ck_assert_str_eq(infer(n), "f32[N,4,4]");
}
END_TEST

START_TEST(nll_loss_shapes)
{
	ir_node *n = node(KILN_OP_NLL_LOSS, 1, "f64[3,5]", "i64[3]", NULL);
	ir_attr_set_string(g, n, "reduction", "sum");
	ck_assert_str_eq(infer(n), "f64[]");
	fails(node(KILN_OP_NLL_LOSS, 1, "f32[3,5]", "i64[4]", NULL), KILN_ESHAPE,
	      "target i64[4] does not fit scores f32[3,5]");
}
END_TEST

START_TEST(loss_rejects_float_target_and_bad_reduction)
{
	fails(node(KILN_OP_SOFTMAX_CE, 1, "f32[3,5]", "f32[3]", NULL), KILN_ESHAPE,
	      "target must be i32 or i64, got f32[3]");
	kiln_graph_clear_error(g);
	ir_node *n = node(KILN_OP_NLL_LOSS, 1, "f32[3,5]", "i64[3]", NULL);
	ir_attr_set_string(g, n, "reduction", "avg");
	fails(n, KILN_EINVAL, "got \"avg\"");
}
END_TEST

/* ---- data movement ------------------------------------------------------ */

START_TEST(reshape_infers_minus_one)
{
	ir_node *n = node(KILN_OP_RESHAPE, 1, "f32[2,3,4]", NULL);
	INTS(n, "shape", 4, -1);
	ck_assert_str_eq(infer(n), "f32[4,6]");
	n = node(KILN_OP_RESHAPE, 1, "f32[2,3,4]", NULL);
	INTS(n, "shape", 0, 0, 2, 2);
	ck_assert_str_eq(infer(n), "f32[2,3,2,2]");
}
END_TEST

START_TEST(reshape_minus_one_with_symbols)
{
	ir_node *n = node(KILN_OP_RESHAPE, 1, "f32[N,3,4]", NULL);
	INTS(n, "shape", -1, 4);
	ck_assert_str_eq(infer(n), "f32[N*3,4]");
	n = node(KILN_OP_RESHAPE, 1, "f32[N,3,4]", NULL);
	INTS(n, "shape", 0, -1);
	ck_assert_str_eq(infer(n), "f32[N,12]");
	/* the same expression is the same int wherever it is built */
	ck_assert_int_eq(g->val[n->out[0]]->type.dim[0], kiln_sym(g, "N"));
}
END_TEST

START_TEST(reshape_rejects_count_mismatch)
{
	ir_node *n = node(KILN_OP_RESHAPE, 1, "f32[2,3]", NULL);
	INTS(n, "shape", 4, 2);
	fails(n, KILN_ESHAPE, "cannot reshape f32[2,3] to [4,2]: element count differs");
	kiln_graph_clear_error(g);
	n = node(KILN_OP_RESHAPE, 1, "f32[2,3]", NULL);
	INTS(n, "shape", 4, -1);
	fails(n, KILN_ESHAPE, "cannot reshape f32[2,3] to [4,-1]");
}
END_TEST

START_TEST(reshape_symbolic_count_mismatch)
{
	ir_node *n = node(KILN_OP_RESHAPE, 1, "f32[N,4]", NULL);
	INTS(n, "shape", 2, -1);
	ck_assert_str_eq(infer(n), "f32[2,N*2]");
	n = node(KILN_OP_RESHAPE, 1, "f32[N,4]", NULL);
	INTS(n, "shape", 8);
	fails(n, KILN_ESHAPE, "cannot reshape f32[N,4] to [8]");
}
END_TEST

START_TEST(transpose_perm_and_default)
{
	ir_node *n = node(KILN_OP_TRANSPOSE, 1, "f32[N,3,5]", NULL);
	INTS(n, "perm", 0, 2, 1);
	ck_assert_str_eq(infer(n), "f32[N,5,3]");
	ck_assert_str_eq(infer(node(KILN_OP_TRANSPOSE, 1, "i8[N,3,5]", NULL)), "i8[5,3,N]");
	n = node(KILN_OP_TRANSPOSE, 1, "f32[2,3]", NULL);
	INTS(n, "perm", 0, 0);
	fails(n, KILN_ESHAPE, "perm [0,0] is not a permutation of the axes of f32[2,3]");
}
END_TEST

START_TEST(concat_symbolic_sum)
{
	ir_node *n = node(KILN_OP_CONCAT, 1, "f32[N,4]", "f32[1,4]", NULL);
	ir_attr_set_int(g, n, "axis", 0);
	ck_assert_str_eq(infer(n), "f32[N+1,4]");
	n = node(KILN_OP_CONCAT, 1, "f32[N,4]", "f32[1,4]", "f32[2,4]", NULL);
	ir_attr_set_int(g, n, "axis", -2);
	ck_assert_str_eq(infer(n), "f32[N+3,4]");
	ck_assert_int_eq(g->val[n->out[0]]->type.dim[0],
	                 ir_dim_add(g, kiln_sym(g, "N"), 3));
}
END_TEST

START_TEST(concat_rejects_mismatch)
{
	ir_node *n = node(KILN_OP_CONCAT, 1, "f32[2,4]", "f32[2,5]", NULL);
	ir_attr_set_int(g, n, "axis", 0);
	fails(n, KILN_ESHAPE, "cannot concat f32[2,4] and f32[2,5] on axis 0");
}
END_TEST

START_TEST(split_equal_and_sizes)
{
	ir_node *n = node(KILN_OP_SPLIT, 3, "f32[N,6]", NULL);
	ir_attr_set_int(g, n, "axis", 1);
	ck_assert_str_eq(out_str(n, 2), "f32[N,2]");
	n = node(KILN_OP_SPLIT, 2, "f32[N,6]", NULL);
	ir_attr_set_int(g, n, "axis", 1);
	INTS(n, "split", 1, 5);
	ck_assert_str_eq(out_str(n, 0), "f32[N,1]");
	ck_assert_str_eq(out_str(n, 1), "f32[N,5]");
}
END_TEST

START_TEST(split_errors)
{
	ir_node *n = node(KILN_OP_SPLIT, 2, "f32[N,6]", NULL);
	fails(n, KILN_EUNSUPPORTED, "cannot split symbolic dim N of f32[N,6]");
	kiln_graph_clear_error(g);
	n = node(KILN_OP_SPLIT, 2, "f32[4,6]", NULL);
	INTS(n, "split", 1, 2);
	fails(n, KILN_ESHAPE, "split sizes [1,2] do not add up to axis 0 of f32[4,6]");
}
END_TEST

START_TEST(slice_clamps_like_onnx)
{
	ir_node *n = node(KILN_OP_SLICE, 1, "f32[10,8]", NULL);
	INTS(n, "starts", 2, -3);
	INTS(n, "ends", 1000, INT64_MAX);
	ck_assert_str_eq(infer(n), "f32[8,3]");
	n = node(KILN_OP_SLICE, 1, "f32[10,8]", NULL);
	INTS(n, "starts", -1);
	INTS(n, "ends", INT64_MIN);
	INTS(n, "axes", 1);
	INTS(n, "steps", -3);
	ck_assert_str_eq(infer(n), "f32[10,3]");
	n = node(KILN_OP_SLICE, 1, "f32[10]", NULL);
	INTS(n, "starts", 5);
	INTS(n, "ends", 2);
	ck_assert_str_eq(infer(n), "f32[0]");
}
END_TEST

START_TEST(slice_symbolic_axis)
{
	ir_node *n = node(KILN_OP_SLICE, 1, "f32[N,8]", NULL);
	INTS(n, "starts", 0, 1);
	INTS(n, "ends", INT64_MAX, 7);
	INTS(n, "axes", 0, 1);
	ck_assert_str_eq(infer(n), "f32[N,6]");
	n = node(KILN_OP_SLICE, 1, "f32[N,8]", NULL);
	INTS(n, "starts", 1);
	INTS(n, "ends", 3);
	fails(n, KILN_EUNSUPPORTED, "cannot slice symbolic dim N of f32[N,8] by [1:3:1]");
}
END_TEST

#define DIMS(n, name, mask, ...)                                                      \
	ir_attr_set_dims(g, n, name, sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t),     \
	                 (int64_t[]){__VA_ARGS__}, mask)

/* Starts and ends may be symbolic dims (kind ds): [0:S:1] is S long,
 * whatever the axis (checked at run time); -1 beside it still counts from
 * the end; other forms with a symbol are refused by name. */
START_TEST(slice_to_a_symbolic_end)
{
	int64_t S = kiln_sym(g, "S"), N = kiln_sym(g, "N");
	ir_node *n = node(KILN_OP_SLICE, 1, "i64[1,512]", NULL);
	DIMS(n, "starts", 0, 0);
	DIMS(n, "ends", 1, S);
	INTS(n, "axes", 1);
	ck_assert_str_eq(infer(n), "i64[1,S]");
	n = node(KILN_OP_SLICE, 1, "u8[1,1,1024,1024]", NULL);
	DIMS(n, "starts", 0, 0, 0, 0);
	DIMS(n, "ends", 5, ir_dim_add(g, S, 1), -1, S);
	INTS(n, "axes", 2, 1, 3);
	ck_assert_str_eq(infer(n), "u8[1,0,S+1,S]");
	n = node(KILN_OP_SLICE, 1, "f32[N,T]", NULL);
	DIMS(n, "starts", 0, 0);
	DIMS(n, "ends", 1, N);
	ck_assert_str_eq(infer(n), "f32[N,T]");
	n = node(KILN_OP_SLICE, 1, "f32[N,512]", NULL);
	DIMS(n, "starts", 0, 1);
	DIMS(n, "ends", 1, S);
	INTS(n, "axes", 1);
	fails(n, KILN_EUNSUPPORTED, "slice [1:S:1] of axis 1 of f32[N,512]: with a symbolic "
	      "start or end kiln takes only [0:end:1], the end a dim");
}
END_TEST

START_TEST(slice_from_a_symbolic_start_is_refused)
{
	int64_t S = kiln_sym(g, "S");
	ir_node *n = node(KILN_OP_SLICE, 1, "f32[N,512]", NULL);
	DIMS(n, "starts", 1, S);
	DIMS(n, "ends", 0, 512);
	INTS(n, "axes", 1);
	fails(n, KILN_EUNSUPPORTED, "slice [S:512:1] of axis 1");
}
END_TEST

/* Range's length is n, a size or a symbolic dim; Reshape's shape may name
 * dims, which need not cancel as one -1 would. */
START_TEST(range_and_reshape_take_symbolic_dims)
{
	int64_t S = kiln_sym(g, "S"), N = kiln_sym(g, "N");
	ir_node *n = node(KILN_OP_RANGE, 1, NULL);
	DIMS(n, "n", 1, ir_dim_div(g, ir_dim_add(g, S, 3), 4));
	ir_attr_set_dtype(g, n, "dtype", KILN_I64);
	ck_assert_str_eq(infer(n), "i64[(S+3)/4]");
	n = node(KILN_OP_RANGE, 1, NULL);
	DIMS(n, "n", 0, 7);
	ir_attr_set_dtype(g, n, "dtype", KILN_F32);
	ck_assert_str_eq(infer(n), "f32[7]");
	ir_type t = {KILN_F32, 2, {ir_dim_mul(g, N, S), 384}};
	uint32_t x = ir_input_new(g, NULL, &t);
	n = ir_node_new(g, KILN_OP_RESHAPE, 1, &x, 1, KILN_HERE);
	DIMS(n, "shape", 3, N, S, 384);
	ck_assert_str_eq(infer(n), "f32[N,S,384]");
	n = ir_node_new(g, KILN_OP_RESHAPE, 1, &x, 1, KILN_HERE);
	DIMS(n, "shape", 3, N, N, 384);
	fails(n, KILN_ESHAPE, "cannot reshape f32[S*N,384] to [N,N,384]: element count differs");
}
END_TEST

START_TEST(range_needs_one_length)
{
	ir_node *n = node(KILN_OP_RANGE, 1, NULL);
	DIMS(n, "n", 0, -2); /* a negative number that is no dim */
	ir_attr_set_dtype(g, n, "dtype", KILN_F32);
	fails(n, KILN_EINVAL, "n must be one size (0 to 2^48) or symbolic dim");
}
END_TEST

START_TEST(gather_shapes)
{
	ir_node *n = node(KILN_OP_GATHER, 1, "f32[100,16]", "i64[N,T]", NULL);
	ck_assert_str_eq(infer(n), "f32[N,T,16]");
	n = node(KILN_OP_GATHER, 1, "f32[3,4,5]", "i32[]", NULL);
	ir_attr_set_int(g, n, "axis", 1);
	ck_assert_str_eq(infer(n), "f32[3,5]");
	fails(node(KILN_OP_GATHER, 1, "f32[3]", "f32[2]", NULL), KILN_ESHAPE,
	      "indices must be i32 or i64, got f32[2]");
}
END_TEST

START_TEST(flatten_symbolic)
{
	ck_assert_str_eq(infer(node(KILN_OP_FLATTEN, 1, "f32[N,3,32,32]", NULL)), "f32[N,3072]");
	ir_node *n = node(KILN_OP_FLATTEN, 1, "f32[N,3,4]", NULL);
	ir_attr_set_int(g, n, "axis", 0);
	ck_assert_str_eq(infer(n), "f32[1,N*12]");
	n = node(KILN_OP_FLATTEN, 1, "f32[N,3,4]", NULL);
	ir_attr_set_int(g, n, "axis", 3);
	ck_assert_str_eq(infer(n), "f32[N*12,1]");
}
END_TEST

START_TEST(squeeze_unsqueeze)
{
	ck_assert_str_eq(infer(node(KILN_OP_SQUEEZE, 1, "f32[1,N,1,3]", NULL)), "f32[N,3]");
	ir_node *n = node(KILN_OP_SQUEEZE, 1, "f32[1,N,1,3]", NULL);
	INTS(n, "axes", -2);
	ck_assert_str_eq(infer(n), "f32[1,N,3]");
	n = node(KILN_OP_SQUEEZE, 1, "f32[2,3]", NULL);
	INTS(n, "axes", 1);
	fails(n, KILN_ESHAPE, "cannot squeeze axis 1 of f32[2,3]: size 3 is not 1");
	kiln_graph_clear_error(g);
	n = node(KILN_OP_UNSQUEEZE, 1, "f32[N,3]", NULL);
	INTS(n, "axes", 0, -1);
	ck_assert_str_eq(infer(n), "f32[1,N,3,1]");
}
END_TEST

START_TEST(expand_is_bidirectional)
{
	ir_node *n = node(KILN_OP_EXPAND, 1, "f32[3,1]", NULL);
	INTS(n, "shape", 2, 1, 4);
	ck_assert_str_eq(infer(n), "f32[2,3,4]");
	n = node(KILN_OP_EXPAND, 1, "f32[1,4]", NULL);
	INTS(n, "shape", kiln_sym(g, "N"), 1);
	ck_assert_str_eq(infer(n), "f32[N,4]");
	n = node(KILN_OP_EXPAND, 1, "f32[3]", NULL);
	INTS(n, "shape", 2);
	fails(n, KILN_ESHAPE, "cannot broadcast f32[3] with f32[2]");
}
END_TEST

START_TEST(pad_grows_and_crops)
{
	ir_node *n = node(KILN_OP_PAD, 1, "f32[N,3,4]", NULL);
	INTS(n, "pads", 0, 1, 2, 1, -1, 0);
	ck_assert_str_eq(infer(n), "f32[N+1,3,6]");
	n = node(KILN_OP_PAD, 1, "f32[2,2]", NULL);
	INTS(n, "pads", 1, 1);
	fails(n, KILN_ESHAPE, "pads [1,1] must have 2 values per axis of f32[2,2]");
}
END_TEST

START_TEST(shape_honours_start_end)
{
	ck_assert_str_eq(infer(node(KILN_OP_SHAPE, 1, "bool[N,3,4]", NULL)), "i64[3]");
	ir_node *n = node(KILN_OP_SHAPE, 1, "f32[N,3,4]", NULL);
	ir_attr_set_int(g, n, "start", -2);
	ck_assert_str_eq(infer(n), "i64[2]");
	n = node(KILN_OP_SHAPE, 1, "f32[N,3,4]", NULL);
	ir_attr_set_int(g, n, "start", 1);
	ir_attr_set_int(g, n, "end", -5);
	ck_assert_str_eq(infer(n), "i64[0]");
}
END_TEST

START_TEST(constant_from_tensor)
{
	ir_node *n = ir_node_new(g, KILN_OP_CONSTANT, 0, NULL, 1, KILN_HERE);
	kiln_tensor *t = kiln_tensor_new(KILN_I32, 2, (int64_t[]){2, 5});
	ir_attr_set_tensor(g, n, "value", t);
	kiln_tensor_free(t);
	ck_assert_str_eq(infer(n), "i32[2,5]");
	n = ir_node_new(g, KILN_OP_CONSTANT, 0, NULL, 1, KILN_HERE);
	fails(n, KILN_EINVAL, "value must be a tensor attribute");
}
END_TEST

/* Inference stores into the node's outputs and stops after an error. */
START_TEST(infer_node_is_sticky)
{
	ir_node *bad = node(KILN_OP_ADD, 1, "f32[2]", "f32[3]", NULL);
	ir_node *ok = node(KILN_OP_RELU, 1, "f32[2]", NULL);
	ck_assert_int_eq(ir_infer_node(g, bad), KILN_ESHAPE);
	ck_assert_int_eq(ir_infer_node(g, ok), KILN_ESHAPE);
	ck_assert_int_eq(g->val[ok->out[0]]->type.dtype, KILN_DT_INVALID);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "test_shape.c:"));
}
END_TEST


/* ---- hostile input ------------------------------------------------------- */

START_TEST(extreme_attributes_fail_cleanly)
{
	ir_node *n = node(KILN_OP_SLICE, 1, "f32[10]", NULL);
	INTS(n, "starts", INT64_MAX);
	INTS(n, "ends", INT64_MIN);
	INTS(n, "steps", INT64_MIN);
	ck_assert_str_eq(infer(n), "f32[1]");
	n = node(KILN_OP_SLICE, 1, "f32[10]", NULL);
	INTS(n, "starts", 0);
	INTS(n, "ends", 10);
	INTS(n, "steps", INT64_MAX);
	ck_assert_str_eq(infer(n), "f32[1]");
	n = node(KILN_OP_CONV, 1, "f32[1,1,4]", "f32[1,1,2]", NULL);
	INTS(n, "strides", INT64_MAX);
	fails(n, KILN_EINVAL, "strides[0] is 9223372036854775807, must be in [1, 2147483647]");
	kiln_graph_clear_error(g);
	n = node(KILN_OP_PAD, 1, "f32[2]", NULL);
	INTS(n, "pads", INT64_MAX, INT64_MAX);
	fails(n, KILN_ESHAPE, "overflow axis 0 of f32[2]");
	kiln_graph_clear_error(g);
	fails(node(KILN_OP_RELU, 1, "f32[1000000000000000]", NULL), KILN_EUNSUPPORTED,
	      "above the limit 2^48");
}
END_TEST

/* A small deterministic generator for the fuzz loop below. */
static uint64_t rng = 88172645463325252ULL;
static uint64_t rnd(uint64_t k)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return rng % k;
}

static int64_t rnd_int(void)
{
	static const int64_t odd[] = {INT64_MIN, INT64_MAX, -1, 0, 1, 2, 3, -2, 1 << 30};
	return odd[rnd(sizeof odd / sizeof odd[0])];
}

static uint32_t rnd_value(void)
{
	static const kiln_dtype dts[] = {KILN_F32, KILN_F64, KILN_I64, KILN_I32, KILN_BOOL};
	ir_type t = {dts[rnd(5)], (int)rnd(6), {0}};
	for (int i = 0; i < t.rank; i++)
		t.dim[i] = rnd(4) ? (int64_t)rnd(5) : kiln_sym(g, rnd(2) ? "N" : "M");
	return ir_input_new(g, NULL, &t);
}

static void rnd_attrs(ir_node *n)
{
	static const char *strs[] = {"none", "tanh", "mean", "sum", "SAME_UPPER", "VALID",
	                             "NOTSET", "reflect", "bogus"};
	ir_attr_schema sc[16];
	int ns = ir_op_schema(n->op, sc, 16);
	for (int k = 0; k < ns; k++) {
		if (rnd(3) == 0)
			continue;
		int64_t v[6];
		uint32_t cnt = (uint32_t)rnd(7);
		for (uint32_t i = 0; i < cnt; i++)
			v[i] = rnd(2) ? rnd_int() : (int64_t)rnd(4);
		switch (sc[k].kind) {
		case IR_A_INT: ir_attr_set_int(g, n, sc[k].name, v[0] = rnd_int()); break;
		case IR_A_FLOAT: ir_attr_set_float(g, n, sc[k].name, (double)rnd_int()); break;
		case IR_A_INTS: ir_attr_set_ints(g, n, sc[k].name, cnt, v); break;
		case IR_A_STRING: ir_attr_set_string(g, n, sc[k].name, strs[rnd(9)]); break;
		case IR_A_DTYPE: ir_attr_set_dtype(g, n, sc[k].name, (kiln_dtype)rnd(12)); break;
		default: {
			kiln_tensor *t = kiln_tensor_new(KILN_F32, 1, (int64_t[]){2});
			ir_attr_set_tensor(g, n, sc[k].name, t);
			kiln_tensor_free(t);
		}
		}
	}
}

/* Random dtypes, shapes, arities and attribute values for every op: any
 * status is fine, but no crash (ASan/UBSan) and success means valid types. */
START_TEST(random_nodes_never_crash)
{
	for (int op = 0; op < KILN_OP_COUNT; op++)
		for (int it = 0; it < 150; it++) {
			kiln_graph_free(g);
			g = kiln_graph_new("fuzz");
			const ir_op_info *o = ir_op(op);
			uint32_t in[8], nin = o->in_min + (uint32_t)rnd(2), nout = o->out_min + rnd(2);
			nin = nin > o->in_max ? o->in_max : nin > 8 ? 8 : nin;
			for (uint32_t i = 0; i < nin; i++)
				in[i] = rnd_value();
			ir_node *n = ir_node_new(g, (kiln_op)op, nin, in, nout, KILN_HERE);
			ck_assert_ptr_nonnull(n);
			rnd_attrs(n);
			if (ir_infer_node(g, n) != KILN_OK)
				continue;
			for (uint32_t i = 0; i < nout; i++) {
				const ir_type *t = &g->val[n->out[i]]->type;
				ck_assert_msg(t->dtype > KILN_DT_INVALID && t->dtype < KILN_DT_COUNT &&
				                      t->rank >= 0 && t->rank <= KILN_MAX_RANK,
				              "%s gave a bad type", o->onnx);
			}
		}
}
END_TEST

static TCase *tc(const char *name)
{
	TCase *t = tcase_create(name);
	tcase_add_checked_fixture(t, setup, teardown);
	return t;
}

static Suite *shape_suite(void)
{
	Suite *s = suite_create("shape");
	TCase *t = tc("elementwise");
	tcase_add_test(t, unary_ops_keep_type);
	tcase_add_test(t, intok_unary_accepts_ints);
	tcase_add_test(t, float_op_rejects_i64);
	tcase_add_test(t, logic_op_rejects_f32);
	tcase_add_test(t, relu_rejects_bool);
	tcase_add_test(t, cast_sets_dtype);
	tcase_add_test(t, cast_requires_valid_to);
	tcase_add_test(t, gelu_rejects_unknown_approximation);
	tcase_add_test(t, arity_is_checked);
	tcase_add_test(t, output_arity_is_checked);
	tcase_add_test(t, infer_node_is_sticky);
	suite_add_tcase(s, t);

	t = tc("broadcast");
	tcase_add_test(t, broadcast_sym_with_1_gives_sym);
	tcase_add_test(t, broadcast_right_aligns_ranks);
	tcase_add_test(t, broadcast_rejects_sym_vs_3);
	tcase_add_test(t, broadcast_rejects_3_vs_4);
	tcase_add_test(t, broadcast_rejects_two_symbols);
	tcase_add_test(t, binary_rejects_mixed_dtypes);
	tcase_add_test(t, comparisons_give_bool);
	tcase_add_test(t, max_min_are_variadic);
	tcase_add_test(t, where_broadcasts_all_three);
	tcase_add_test(t, where_rejects_mixed_branches);
	tcase_add_test(t, ir_broadcast_direct);
	suite_add_tcase(s, t);

	t = tc("reduce");
	tcase_add_test(t, reduce_axes_and_keepdims);
	tcase_add_test(t, reduce_empty_axes_means_all);
	tcase_add_test(t, reduce_rejects_bad_axis);
	tcase_add_test(t, reduce_rejects_repeated_axis);
	tcase_add_test(t, reduce_mean_rejects_ints);
	tcase_add_test(t, argmax_gives_i64);
	suite_add_tcase(s, t);

	t = tc("linalg");
	tcase_add_test(t, matmul_2d_and_batched);
	tcase_add_test(t, matmul_1d_operands);
	tcase_add_test(t, matmul_inner_dims_differ);
	tcase_add_test(t, gemm_transposes_and_c);
	tcase_add_test(t, gemm_c_broadcasts_one_way);
	suite_add_tcase(s, t);

	t = tc("conv");
	tcase_add_test(t, conv2d_stride_pad);
	tcase_add_test(t, conv1d_and_3d);
	tcase_add_test(t, conv_groups);
	tcase_add_test(t, conv_auto_pad);
	tcase_add_test(t, conv_symbolic_spatial);
	tcase_add_test(t, conv_symbolic_spatial_shrink_unsupported);
	tcase_add_test(t, conv_channel_mismatch);
	tcase_add_test(t, conv_bad_bias);
	tcase_add_test(t, conv_kernel_bigger_than_input);
	tcase_add_test(t, conv_transpose_output_padding);
	tcase_add_test(t, conv_transpose_output_shape);
	tcase_add_test(t, max_pool_ceil_mode);
	tcase_add_test(t, pool_requires_kernel_shape);
	tcase_add_test(t, average_pool_1d_and_global);
	tcase_add_test(t, pool_rejects_wrong_kernel_length);
	suite_add_tcase(s, t);

	t = tc("norm");
	tcase_add_test(t, batch_norm_inference_and_training);
	tcase_add_test(t, batch_norm_rejects_extra_outputs_in_inference);
	tcase_add_test(t, batch_norm_rejects_wrong_channels);
	tcase_add_test(t, layer_norm_optional_outputs);
	tcase_add_test(t, layer_norm_rejects_bad_scale);
	tcase_add_test(t, softmax_checks_axis);
	tcase_add_test(t, dropout_mask_is_bool);
	tcase_add_test(t, softmax_ce_reductions);
	tcase_add_test(t, nll_loss_shapes);
	tcase_add_test(t, loss_rejects_float_target_and_bad_reduction);
	suite_add_tcase(s, t);

	t = tc("movement");
	tcase_add_test(t, reshape_infers_minus_one);
	tcase_add_test(t, reshape_minus_one_with_symbols);
	tcase_add_test(t, reshape_rejects_count_mismatch);
	tcase_add_test(t, reshape_symbolic_count_mismatch);
	tcase_add_test(t, transpose_perm_and_default);
	tcase_add_test(t, concat_symbolic_sum);
	tcase_add_test(t, concat_rejects_mismatch);
	tcase_add_test(t, split_equal_and_sizes);
	tcase_add_test(t, split_errors);
	tcase_add_test(t, slice_clamps_like_onnx);
	tcase_add_test(t, slice_symbolic_axis);
	tcase_add_test(t, slice_to_a_symbolic_end);
	tcase_add_test(t, slice_from_a_symbolic_start_is_refused);
	tcase_add_test(t, range_and_reshape_take_symbolic_dims);
	tcase_add_test(t, range_needs_one_length);
	tcase_add_test(t, gather_shapes);
	tcase_add_test(t, flatten_symbolic);
	tcase_add_test(t, squeeze_unsqueeze);
	tcase_add_test(t, expand_is_bidirectional);
	tcase_add_test(t, pad_grows_and_crops);
	tcase_add_test(t, shape_honours_start_end);
	tcase_add_test(t, constant_from_tensor);
	suite_add_tcase(s, t);

	t = tc("hostile");
	tcase_add_test(t, extreme_attributes_fail_cleanly);
	tcase_add_test(t, random_nodes_never_crash);
	tcase_set_timeout(t, 60);
	suite_add_tcase(s, t);
	return s;
}

KILN_CHECK_MAIN(shape_suite)
