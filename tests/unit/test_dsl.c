/*
 * test_dsl.c: the tracing DSL and the layers: each builder makes the right
 * op, attributes and type; errors carry the caller's file:line, are sticky
 * and leave the graph as it was; layers register PyTorch's parameter names,
 * shapes and initialisation.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"
#include "kiln/kiln.h"

#include "check_main.h"

/* ---- helpers ------------------------------------------------------------- */

static kiln_graph *g;
static int64_t N;

static void setup(void)
{
	g = kiln_graph_new("t");
	N = kiln_sym(g, "N");
}

static void teardown(void)
{
	kiln_graph_free(g);
	g = NULL;
}

static const char *ty(kiln_value v)
{
	static char buf[256];
	return kiln_value_type_str(g, v, buf, sizeof buf);
}

static ir_node *def(kiln_value v)
{
	ck_assert_uint_ne(v, KILN_NONE);
	ck_assert_int_eq(g->val[v]->kind, IR_V_NODE);
	return g->val[v]->def;
}

static kiln_value in_f32(const char *name, int rank, const int64_t *dims)
{
	kiln_value v = kiln_input(g, name, KILN_F32, rank, dims);
	ck_assert_uint_ne(v, KILN_NONE);
	return v;
}

static void ints_eq(ir_node *n, const char *attr, int cnt, const int64_t *want)
{
	const int64_t *v;
	ck_assert_int_eq(ir_attr_ints(n, attr, &v), cnt);
	for (int i = 0; i < cnt; i++)
		ck_assert_int_eq(v[i], want[i]);
}

static uint32_t live_nodes(void)
{
	uint32_t k = 0;
	for (uint32_t i = 0; i < g->nnode; i++)
		k += !g->node[i]->dead;
	return k;
}

/* the verifier accepts the graph: rollbacks leave no dangling state */
static void verified(void)
{
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_verify(g, &err) == KILN_OK, "%s", err.msg);
}

static const ir_value *param(const char *name)
{
	kiln_value v = kiln_graph_find_param(g, name);
	ck_assert_msg(v != KILN_NONE, "no parameter %s", name);
	return g->val[v];
}

/* ---- elementwise ---------------------------------------------------------- */

/* every X-macro builder traces the op whose .kir mnemonic is its name */
START_TEST(elementwise_builders_trace_their_op)
{
	kiln_value xf = in_f32("x", 2, ((int64_t[]){N, 3}));
	kiln_value xb = kiln_input(g, "b", KILN_BOOL, 2, ((int64_t[]){N, 3}));
	const char *logic[] = {"not", "and", "or"};
#define CHECK_UNARY(name)                                                        \
	{                                                                      \
		bool lg = !strcmp(#name, logic[0]);                              \
		kiln_value y = kiln_##name(g, lg ? xb : xf);                     \
		ck_assert_str_eq(ir_op(def(y)->op)->kir, #name);                 \
		ck_assert_str_eq(ty(y), lg ? "bool[N,3]" : "f32[N,3]");        \
	}
#define CHECK_BINARY(name)                                                       \
	{                                                                      \
		bool lg = !strcmp(#name, logic[1]) || !strcmp(#name, logic[2]);    \
		kiln_value y = kiln_##name(g, lg ? xb : xf, lg ? xb : xf);       \
		ck_assert_str_eq(ir_op(def(y)->op)->kir, #name);                 \
	}
	KILN_UNARY_OPS(CHECK_UNARY)
	KILN_BINARY_OPS(CHECK_BINARY)
	ck_assert_int_eq(kiln_graph_status(g), KILN_OK);
}
END_TEST

START_TEST(add_broadcasts_symbolic_and_fixed)
{
	kiln_value a = in_f32("a", 3, ((int64_t[]){N, 1, 4}));
	kiln_value b = in_f32("b", 2, ((int64_t[]){3, 1}));
	kiln_value y = kiln_add(g, a, b);
	ck_assert_str_eq(ty(y), "f32[N,3,4]");
	ck_assert_int_eq(def(y)->op, KILN_OP_ADD);
	ck_assert_str_eq(ty(kiln_less(g, a, b)), "bool[N,3,4]");
}
END_TEST

START_TEST(attribute_ops_set_schema_attrs)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){N, 3}));
	ir_node *n = def(kiln_leaky_relu(g, x, 0.2));
	ck_assert_double_eq(ir_attr_float(n, "alpha", 0), 0.2);
	n = def(kiln_gelu(g, x, true));
	ck_assert_str_eq(ir_attr_str(n, "approximate", ""), "tanh");
	n = def(kiln_gelu(g, x, false));
	ck_assert_str_eq(ir_attr_str(n, "approximate", ""), "none");
	n = def(kiln_clip(g, x, -1, 6));
	ck_assert_double_eq(ir_attr_float(n, "min", 0), -1);
	ck_assert_double_eq(ir_attr_float(n, "max", 0), 6);
	kiln_value c = kiln_cast(g, x, KILN_I64);
	ck_assert_str_eq(ty(c), "i64[N,3]");
	ck_assert_int_eq(ir_attr_int(def(c), "to", 0), KILN_I64);
	kiln_value w = kiln_where(g, kiln_greater(g, x, x), x, kiln_neg(g, x));
	ck_assert_int_eq(def(w)->op, KILN_OP_WHERE);
	ck_assert_str_eq(ty(w), "f32[N,3]");
}
END_TEST

START_TEST(cast_to_invalid_dtype_is_einval)
{
	kiln_value x = in_f32("x", 1, ((int64_t[]){3}));
	ck_assert_uint_eq(kiln_cast(g, x, KILN_DT_COUNT), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "Cast: cast to invalid dtype"));
}
END_TEST

/* ---- reductions and linear algebra ---------------------------------------- */

START_TEST(reductions_take_axes_and_keepdims)
{
	kiln_value x = in_f32("x", 3, ((int64_t[]){N, 3, 4}));
	kiln_value m = kiln_reduce_mean(g, x, 1, ((int64_t[]){1}), false);
	ck_assert_str_eq(ty(m), "f32[N,4]");
	ints_eq(def(m), "axes", 1, ((int64_t[]){1}));
	ck_assert_int_eq(ir_attr_int(def(m), "keepdims", 1), 0);
	kiln_value s = kiln_reduce_sum(g, x, 0, NULL, false); /* all axes */
	ck_assert_str_eq(ty(s), "f32[]");
	ck_assert_ptr_null(ir_attr_get(def(s), "axes"));
	ck_assert_str_eq(ty(kiln_reduce_max(g, x, 1, ((int64_t[]){-1}), true)), "f32[N,3,1]");
	kiln_value a = kiln_argmax(g, x, -1, false);
	ck_assert_str_eq(ty(a), "i64[N,3]");
	ck_assert_int_eq(ir_attr_int(def(a), "axis", 0), -1);
}
END_TEST

START_TEST(matmul_and_gemm_shapes)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){N, 784}));
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 2, ((int64_t[]){784, 10}));
	kiln_value w = kiln_param(g, "w", t);
	kiln_tensor_free(t);
	ck_assert_str_eq(ty(kiln_matmul(g, x, w)), "f32[N,10]");
	t = kiln_tensor_new(KILN_F32, 2, ((int64_t[]){10, 784}));
	kiln_value wt = kiln_param(g, "wt", t);
	kiln_tensor_free(t);
	kiln_value y = kiln_gemm(g, x, wt, KILN_NONE, 2.0, 1.0, false, true);
	ck_assert_str_eq(ty(y), "f32[N,10]");
	ck_assert_int_eq(def(y)->nin, 2);
	ck_assert_int_eq(ir_attr_int(def(y), "transB", 0), 1);
	ck_assert_double_eq(ir_attr_float(def(y), "alpha", 0), 2.0);
}
END_TEST

/* ---- convolution and pooling ------------------------------------------------- */

static kiln_value weight(const char *name, int rank, const int64_t *dims)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, rank, dims);
	kiln_value v = kiln_param(g, name, t);
	kiln_tensor_free(t);
	return v;
}

START_TEST(conv_attrs_from_opts_and_weight)
{
	kiln_value x = in_f32("x", 4, ((int64_t[]){N, 1, 28, 28}));
	kiln_value w = weight("w", 4, ((int64_t[]){8, 1, 3, 3}));
	kiln_value b = weight("b", 1, ((int64_t[]){8}));
	kiln_conv_opts o = {.pad = {1, 1, 1, 1}};
	kiln_value y = kiln_conv(g, x, w, b, &o);
	ck_assert_str_eq(ty(y), "f32[N,8,28,28]");
	ir_node *n = def(y);
	ints_eq(n, "kernel_shape", 2, ((int64_t[]){3, 3}));
	ints_eq(n, "pads", 4, ((int64_t[]){1, 1, 1, 1}));
	ints_eq(n, "strides", 2, ((int64_t[]){1, 1}));
	ints_eq(n, "dilations", 2, ((int64_t[]){1, 1}));
	ck_assert_int_eq(ir_attr_int(n, "group", 0), 1);
	o = (kiln_conv_opts){.stride = {2, 2}};
	ck_assert_str_eq(ty(kiln_conv(g, x, w, KILN_NONE, &o)), "f32[N,8,13,13]");
	ck_assert_str_eq(ty(kiln_conv(g, x, w, KILN_NONE, NULL)), "f32[N,8,26,26]");
}
END_TEST

START_TEST(conv_kernel_that_disagrees_with_weight_is_eshape)
{
	kiln_value x = in_f32("x", 4, ((int64_t[]){N, 1, 28, 28}));
	kiln_value w = weight("w", 4, ((int64_t[]){8, 1, 3, 3}));
	kiln_conv_opts o = {.kernel = {5, 5}};
	ck_assert_uint_eq(kiln_conv(g, x, w, KILN_NONE, &o), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_ESHAPE);
	ck_assert_ptr_nonnull(
		strstr(kiln_graph_errmsg(g), "Conv: kernel[0] = 5 but weight is f32[8,1,3,3]"));
	ck_assert_uint_eq(live_nodes(), 0);
}
END_TEST

START_TEST(conv_transpose_upsamples)
{
	kiln_value x = in_f32("x", 4, ((int64_t[]){N, 8, 7, 7}));
	kiln_value w = weight("w", 4, ((int64_t[]){8, 4, 2, 2}));
	kiln_conv_opts o = {.stride = {2, 2}};
	kiln_value y = kiln_conv_transpose(g, x, w, KILN_NONE, &o);
	ck_assert_str_eq(ty(y), "f32[N,4,14,14]");
	ints_eq(def(y), "output_padding", 2, ((int64_t[]){0, 0}));
}
END_TEST

START_TEST(pools_and_global_pool)
{
	kiln_value x = in_f32("x", 4, ((int64_t[]){N, 8, 28, 28}));
	kiln_conv_opts o = {.kernel = {2, 2}, .stride = {2, 2}};
	kiln_value m = kiln_max_pool(g, x, &o);
	ck_assert_str_eq(ty(m), "f32[N,8,14,14]");
	ck_assert_int_eq(def(m)->op, KILN_OP_MAX_POOL);
	ints_eq(def(m), "kernel_shape", 2, ((int64_t[]){2, 2}));
	o = (kiln_conv_opts){.kernel = {3, 3}, .pad = {1, 1, 1, 1}, .count_include_pad = true};
	kiln_value a = kiln_avg_pool(g, x, &o);
	ck_assert_str_eq(ty(a), "f32[N,8,28,28]");
	ck_assert_int_eq(ir_attr_int(def(a), "count_include_pad", 0), 1);
	ck_assert_ptr_null(ir_attr_get(def(a), "dilations"));
	ck_assert_str_eq(ty(kiln_global_avg_pool(g, x)), "f32[N,8,1,1]");
}
END_TEST

START_TEST(pool_without_kernel_is_einval)
{
	kiln_value x = in_f32("x", 4, ((int64_t[]){N, 8, 28, 28}));
	ck_assert_uint_eq(kiln_max_pool(g, x, NULL), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "MaxPool: needs a positive kernel"));
}
END_TEST

/* ---- normalisation, softmax, dropout ------------------------------------------ */

START_TEST(norms_softmax_and_dropout)
{
	kiln_value x = in_f32("x", 4, ((int64_t[]){N, 4, 5, 5}));
	kiln_value c = weight("c", 1, ((int64_t[]){4}));
	kiln_value bn = kiln_batch_norm(g, x, c, c, c, c, 1e-3);
	ck_assert_str_eq(ty(bn), "f32[N,4,5,5]");
	ck_assert_double_eq_tol(ir_attr_float(def(bn), "epsilon", 0), 1e-3, 1e-12);
	/* no scale: a Constant of ones over the normalised dims stands in */
	kiln_value ln = kiln_layer_norm(g, x, KILN_NONE, KILN_NONE, -2, 1e-5);
	ck_assert_msg(ln != KILN_NONE, "%s", kiln_graph_errmsg(g));
	ck_assert_str_eq(ty(ln), "f32[N,4,5,5]");
	kiln_value sc = def(ln)->in[1];
	ck_assert_int_eq(def(sc)->op, KILN_OP_CONSTANT);
	ck_assert_str_eq(ty(sc), "f32[5,5]");
	ck_assert_int_eq(ir_attr_int(def(kiln_softmax(g, x, 1)), "axis", -1), 1);
	ck_assert_int_eq(def(kiln_log_softmax(g, x, -1))->op, KILN_OP_LOG_SOFTMAX);
}
END_TEST

START_TEST(dropout_eval_is_identity_train_is_node)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){N, 8}));
	uint32_t before = g->nnode;
	ck_assert_uint_eq(kiln_dropout(g, x, 0.5, false, 0), x);
	ck_assert_uint_eq(g->nnode, before);
	kiln_value y = kiln_dropout(g, x, 0.25, true, 7);
	ir_node *n = def(y);
	ck_assert_int_eq(n->op, KILN_OP_DROPOUT);
	ck_assert_int_eq(n->nout, 2);
	ck_assert_double_eq(ir_attr_float(n, "ratio", 0), 0.25);
	ck_assert_int_eq(ir_attr_int(n, "training_mode", 0), 1);
	ck_assert_int_eq(ir_attr_int(n, "seed", 0), 7);
	ck_assert_uint_eq(kiln_dropout(g, x, 1.0, true, 0), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
}
END_TEST

/* ---- shape ops ----------------------------------------------------------------- */

START_TEST(shape_ops_have_expected_types)
{
	kiln_value x = in_f32("x", 4, ((int64_t[]){N, 16, 7, 7}));
	ck_assert_str_eq(ty(kiln_flatten(g, x, 1)), "f32[N,784]");
	ck_assert_str_eq(ty(kiln_reshape(g, x, 2, ((int64_t[]){0, -1}))), "f32[N,784]");
	ck_assert_str_eq(ty(kiln_transpose(g, x, 4, ((int64_t[]){0, 2, 3, 1}))), "f32[N,7,7,16]");
	kiln_value parts[2];
	ck_assert_int_eq(kiln_split(g, x, 1, 2, NULL, parts), KILN_OK);
	ck_assert_str_eq(ty(parts[1]), "f32[N,8,7,7]");
	ck_assert_int_eq(kiln_split(g, x, 1, 2, ((int64_t[]){4, 12}), parts), KILN_OK);
	ck_assert_str_eq(ty(parts[0]), "f32[N,4,7,7]");
	ck_assert_str_eq(ty(parts[1]), "f32[N,12,7,7]");
	ck_assert_str_eq(ty(kiln_concat(g, 2, parts, 1)), "f32[N,16,7,7]");
	kiln_value s = kiln_slice(g, x, 1, ((int64_t[]){1}), ((int64_t[]){5}), ((int64_t[]){2}), NULL);
	ck_assert_str_eq(ty(s), "f32[N,16,4,7]");
	kiln_value u = kiln_unsqueeze(g, x, 1, ((int64_t[]){1}));
	ck_assert_str_eq(ty(u), "f32[N,1,16,7,7]");
	ck_assert_str_eq(ty(kiln_squeeze(g, u, 1, ((int64_t[]){1}))), "f32[N,16,7,7]");
	ck_assert_str_eq(ty(kiln_pad(g, x, 4, ((int64_t[]){0, 0, 1, 1, 0, 0, 1, 1}), NULL, 0)),
	                 "f32[N,16,9,9]");
	ck_assert_str_eq(ty(kiln_shape_of(g, x)), "i64[4]");
	kiln_value r = in_f32("r", 2, ((int64_t[]){1, 3}));
	ck_assert_str_eq(ty(kiln_expand(g, r, 2, ((int64_t[]){5, 3}))), "f32[5,3]");
	kiln_value idx = kiln_input(g, "idx", KILN_I64, 2, ((int64_t[]){N, 6}));
	kiln_value tab = weight("tab", 2, ((int64_t[]){100, 32}));
	ck_assert_str_eq(ty(kiln_gather(g, tab, idx, 0)), "f32[N,6,32]");
	ck_assert_int_eq(kiln_graph_status(g), KILN_OK);
}
END_TEST

START_TEST(split_failure_leaves_out_none)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){4, 6}));
	kiln_value parts[2] = {99, 99};
	kiln_status st = kiln_split(g, x, 1, 2, ((int64_t[]){1, 2}), parts);
	ck_assert_int_eq(st, KILN_ESHAPE);
	ck_assert_uint_eq(parts[0], KILN_NONE);
	ck_assert_uint_eq(parts[1], KILN_NONE);
}
END_TEST

/* ---- losses ---------------------------------------------------------------------- */

START_TEST(losses_and_mse_composite)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){N, 10}));
	kiln_value t = kiln_input(g, "t", KILN_I64, 1, ((int64_t[]){N}));
	kiln_value ce = kiln_softmax_cross_entropy(g, x, t, KILN_NONE, "mean", true, -100);
	ck_assert_str_eq(ty(ce), "f32[]");
	ck_assert_int_eq(ir_attr_int(def(ce), "ignore_index", 0), -100);
	kiln_value nl = kiln_nll_loss(g, kiln_log_softmax(g, x, 1), t, KILN_NONE, "none", false, 0);
	ck_assert_str_eq(ty(nl), "f32[N]");
	ck_assert_ptr_null(ir_attr_get(def(nl), "ignore_index"));
	kiln_value y = in_f32("y", 2, ((int64_t[]){N, 10}));
	kiln_value mse = kiln_mse_loss(g, x, y, "mean");
	ck_assert_str_eq(ty(mse), "f32[]");
	ir_node *mean = def(mse), *sq = def(mean->in[0]), *d = def(sq->in[0]);
	ck_assert_int_eq(mean->op, KILN_OP_REDUCE_MEAN);
	ck_assert_int_eq(sq->op, KILN_OP_MUL);
	ck_assert_uint_eq(sq->in[1], sq->in[0]);
	ck_assert_int_eq(d->op, KILN_OP_SUB);
	ck_assert_str_eq(ty(kiln_mse_loss(g, x, y, "none")), "f32[N,10]");
	uint32_t before = g->nnode;
	ck_assert_uint_eq(kiln_mse_loss(g, x, y, "avg"), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "reduction 'avg'"));
	ck_assert_uint_eq(g->nnode, before);
}
END_TEST

START_TEST(mse_shape_error_rolls_back_composite)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){4, 10}));
	kiln_value y = in_f32("y", 2, ((int64_t[]){4, 3}));
	uint32_t nn = g->nnode, nv = g->nval;
	ck_assert_uint_eq(kiln_mse_loss(g, x, y, "sum"), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_ESHAPE);
	ck_assert_uint_eq(g->nnode, nn);
	ck_assert_uint_eq(g->nval, nv);
}
END_TEST

/* ---- inputs, outputs, parameters, constants ---------------------------------------- */

START_TEST(input_names_must_be_unique)
{
	in_f32("x", 1, ((int64_t[]){3}));
	ck_assert_uint_eq(kiln_input(g, "x", KILN_F32, 1, ((int64_t[]){3})), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "Input: the name 'x' is already used"));
	ck_assert_int_eq(kiln_graph_num_inputs(g), 1);
	kiln_graph_clear_error(g);
	ck_assert_uint_eq(kiln_input(g, "bad", KILN_F32, 1, ((int64_t[]){-12345})), KILN_NONE);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "neither a size nor a kiln_sym"));
}
END_TEST

START_TEST(output_names_value_or_inserts_identity)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){N, 3}));
	kiln_value y = kiln_relu(g, x);
	kiln_output(g, "y", y);
	ck_assert_int_eq(kiln_graph_num_outputs(g), 1);
	ck_assert_uint_eq(kiln_graph_output(g, 0), y);
	ck_assert_str_eq(kiln_value_name(g, y), "y");
	/* an input, and a value already output under another name, get Identity */
	kiln_output(g, "x_out", x);
	kiln_output(g, "y2", y);
	kiln_value o1 = kiln_graph_output(g, 1), o2 = kiln_graph_output(g, 2);
	ck_assert_int_eq(def(o1)->op, KILN_OP_IDENTITY);
	ck_assert_uint_eq(def(o1)->in[0], x);
	ck_assert_str_eq(kiln_value_name(g, o1), "x_out");
	ck_assert_uint_eq(def(o2)->in[0], y);
	ck_assert_str_eq(kiln_value_name(g, o2), "y2");
	kiln_output(g, "y", kiln_neg(g, x));
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "'y' is already used"));
	ck_assert_int_eq(kiln_graph_num_outputs(g), 3);
}
END_TEST

START_TEST(params_constants_and_scalars)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, 1, ((int64_t[]){3}));
	((float *)t->data)[1] = 2.5f;
	kiln_value p = kiln_param(g, "p", t);
	kiln_value c = kiln_constant(g, t);
	kiln_tensor_free(t);
	ck_assert_int_eq(g->val[p]->kind, IR_V_PARAM);
	ck_assert(g->val[p]->trainable);
	ck_assert_float_eq(((float *)g->val[p]->data->data)[1], 2.5f);
	ck_assert_int_eq(def(c)->op, KILN_OP_CONSTANT);
	ck_assert_str_eq(ty(c), "f32[3]");
	kiln_value s = kiln_scalar(g, KILN_I64, 42);
	ck_assert_str_eq(ty(s), "i64[]");
	const ir_attr *a = ir_attr_get(def(s), "value");
	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(((int64_t *)a->u.t->data)[0], 42);
	kiln_value z = kiln_param(g, "z", NULL);
	ck_assert_str_eq(ty(z), "f32[]");
	ck_assert_uint_eq(kiln_param(g, "p", NULL), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
}
END_TEST

/* ---- errors ------------------------------------------------------------------------ */

START_TEST(shape_error_names_caller_line_and_shapes)
{
	kiln_value a = in_f32("a", 2, ((int64_t[]){8, 784}));
	kiln_value b = in_f32("b", 2, ((int64_t[]){128, 10}));
	uint32_t nn = g->nnode, nv = g->nval;
	kiln_value y = kiln_matmul(g, a, b); int line = __LINE__;
	ck_assert_uint_eq(y, KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_ESHAPE);
	char want[512];
	snprintf(want, sizeof want, "%s:%d: MatMul: inner dims differ: f32[8,784] x f32[128,10]",
	         __FILE__, line);
	ck_assert_str_eq(kiln_graph_errmsg(g), want);
	/* the failed node is gone: the graph is as it was */
	ck_assert_uint_eq(g->nnode, nn);
	ck_assert_uint_eq(g->nval, nv);
}
END_TEST

START_TEST(error_is_sticky_until_cleared)
{
	kiln_value a = in_f32("a", 2, ((int64_t[]){8, 784}));
	kiln_value b = in_f32("b", 2, ((int64_t[]){128, 10}));
	kiln_matmul(g, a, b);
	char first[1024];
	strcpy(first, kiln_graph_errmsg(g));
	uint32_t nn = g->nnode;
	ck_assert_uint_eq(kiln_relu(g, a), KILN_NONE);
	ck_assert_uint_eq(kiln_linear(g, "fc", a, 4, true), KILN_NONE);
	ck_assert_uint_eq(kiln_input(g, "c", KILN_F32, 0, NULL), KILN_NONE);
	kiln_output(g, "o", a);
	ck_assert_uint_eq(g->nnode, nn);
	ck_assert_int_eq(kiln_graph_num_outputs(g), 0);
	ck_assert_uint_eq(kiln_graph_find_param(g, "fc.weight"), KILN_NONE);
	ck_assert_str_eq(kiln_graph_errmsg(g), first);
	kiln_graph_clear_error(g);
	ck_assert_int_eq(kiln_graph_status(g), KILN_OK);
	ck_assert_str_eq(kiln_graph_errmsg(g), "");
	kiln_value r = kiln_relu(g, a);
	ck_assert_str_eq(ty(r), "f32[8,784]");
	kiln_output(g, "r", r);
	verified();
}
END_TEST

START_TEST(none_or_foreign_handle_is_einval)
{
	kiln_value a = in_f32("a", 1, ((int64_t[]){3}));
	kiln_value y = kiln_add(g, a, KILN_NONE); int line = __LINE__;
	ck_assert_uint_eq(y, KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	char want[256];
	snprintf(want, sizeof want, "%s:%d: Add: input 1 is KILN_NONE", __FILE__, line);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), want));
	kiln_graph_clear_error(g);
	/* a handle from a bigger graph is out of this one's range */
	kiln_graph *other = kiln_graph_new("other");
	kiln_value f = KILN_NONE;
	const char *names[] = {"o", "p", "q", "r", "s"};
	for (int i = 0; i < 5; i++)
		f = kiln_input(other, names[i], KILN_F32, 1, ((int64_t[]){3}));
	kiln_graph_free(other);
	ck_assert_uint_eq(kiln_relu(g, f), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g),
	                             "Relu: input 0 (handle 5) is not a value of graph 't'"));
	ck_assert_uint_eq(kiln_relu(NULL, a), KILN_NONE);
}
END_TEST

/* ---- layers --------------------------------------------------------------------------- */

static void check_uniform(const ir_value *p, double bound)
{
	const kiln_tensor *t = p->data;
	int64_t n = kiln_tensor_numel(t);
	double sum = 0, sq = 0, lo = 1e9, hi = -1e9;
	for (int64_t i = 0; i < n; i++) {
		double v = ((float *)t->data)[i];
		sum += v, sq += v * v;
		lo = fmin(lo, v), hi = fmax(hi, v);
	}
	ck_assert_double_ge(lo, -bound);
	ck_assert_double_le(hi, bound);
	if (n < 1000) /* too few draws for statistics */
		return;
	/* spread over the whole range: U(-b, b) has variance b^2/3 */
	ck_assert_double_lt(lo, -0.9 * bound);
	ck_assert_double_gt(hi, 0.9 * bound);
	ck_assert_double_eq_tol(sum / n, 0, 0.05 * bound);
	ck_assert_double_eq_tol(sq / n, bound * bound / 3, 0.1 * bound * bound / 3);
}

static void check_fill(const ir_value *p, float v, bool trainable)
{
	ck_assert_int_eq(p->trainable, trainable);
	for (int64_t i = 0; i < kiln_tensor_numel(p->data); i++)
		ck_assert_float_eq(((float *)p->data->data)[i], v);
}

START_TEST(linear_registers_torch_params_and_uses_gemm)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){N, 784}));
	kiln_value y = kiln_linear(g, "fc1", x, 256, true);
	ck_assert_str_eq(ty(y), "f32[N,256]");
	ir_node *n = def(y);
	ck_assert_int_eq(n->op, KILN_OP_GEMM);
	ck_assert_str_eq(n->name, "fc1");
	ck_assert_int_eq(ir_attr_int(n, "transB", 0), 1);
	const ir_value *w = param("fc1.weight"), *b = param("fc1.bias");
	ck_assert_str_eq(ty(w->id), "f32[256,784]");
	ck_assert_str_eq(ty(b->id), "f32[256]");
	ck_assert(w->trainable && b->trainable);
	check_uniform(w, 1 / sqrt(784.0));
	ck_assert_uint_eq(kiln_graph_find_param(g, "fc2.bias"), KILN_NONE);
	kiln_linear(g, "fc2", y, 10, false);
	ck_assert_uint_eq(kiln_graph_find_param(g, "fc2.bias"), KILN_NONE);
	ck_assert_uint_ne(kiln_graph_find_param(g, "fc2.weight"), KILN_NONE);
}
END_TEST

START_TEST(linear_on_rank3_is_matmul_add)
{
	kiln_value x = in_f32("x", 3, ((int64_t[]){N, 5, 16}));
	kiln_value y = kiln_linear(g, "proj", x, 8, true);
	ck_assert_str_eq(ty(y), "f32[N,5,8]");
	ir_node *add = def(y), *mm = def(add->in[0]);
	ck_assert_int_eq(add->op, KILN_OP_ADD);
	ck_assert_int_eq(mm->op, KILN_OP_MATMUL);
	ck_assert_int_eq(def(mm->in[1])->op, KILN_OP_TRANSPOSE);
	ck_assert_str_eq(ty(param("proj.weight")->id), "f32[8,16]");
}
END_TEST

START_TEST(linear_with_symbolic_features_is_eshape)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){4, N}));
	uint32_t nv = g->nval;
	kiln_value y = kiln_linear(g, "fc", x, 3, true); int line = __LINE__;
	ck_assert_uint_eq(y, KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_ESHAPE);
	char want[256];
	snprintf(want, sizeof want, "%s:%d: Linear 'fc': input f32[4,N]", __FILE__, line);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), want));
	ck_assert_uint_eq(g->nval, nv);
}
END_TEST

START_TEST(conv2d_params_and_fan_in)
{
	kiln_value x = in_f32("x", 4, ((int64_t[]){N, 8, 14, 14}));
	kiln_conv_opts o = {.kernel = {3, 3}, .pad = {1, 1}};
	kiln_value y = kiln_conv2d(g, "conv", x, 16, &o, true);
	ck_assert_str_eq(ty(y), "f32[N,16,14,14]");
	ints_eq(def(y), "pads", 4, ((int64_t[]){1, 1, 1, 1}));
	ck_assert_str_eq(ty(param("conv.weight")->id), "f32[16,8,3,3]");
	check_uniform(param("conv.weight"), 1 / sqrt(72.0));
	check_uniform(param("conv.bias"), 1 / sqrt(72.0));
	kiln_conv_opts gr = {.kernel = {3}, .group = 4};
	kiln_value x1 = in_f32("x1", 3, ((int64_t[]){N, 8, 20}));
	ck_assert_str_eq(ty(kiln_conv1d(g, "dw", x1, 8, &gr, false)), "f32[N,8,18]");
	ck_assert_str_eq(ty(param("dw.weight")->id), "f32[8,2,3]");
	kiln_conv_opts bad = {.kernel = {3}, .group = 3};
	ck_assert_uint_eq(kiln_conv1d(g, "bad", x1, 8, &bad, false), KILN_NONE);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "Conv1d 'bad': groups 3 must divide"));
}
END_TEST

START_TEST(batchnorm_eval_params_and_buffers)
{
	kiln_value x = in_f32("x", 4, ((int64_t[]){N, 8, 5, 5}));
	kiln_value y = kiln_batchnorm(g, "bn1", x, 0, 0);
	ir_node *n = def(y);
	ck_assert_int_eq(n->op, KILN_OP_BATCH_NORM);
	ck_assert_int_eq(n->nout, 1);
	ck_assert_double_eq_tol(ir_attr_float(n, "epsilon", 0), 1e-5, 1e-15);
	check_fill(param("bn1.weight"), 1, true);
	check_fill(param("bn1.bias"), 0, true);
	check_fill(param("bn1.running_mean"), 0, false);
	check_fill(param("bn1.running_var"), 1, false);
	const ir_value *nbt = param("bn1.num_batches_tracked");
	ck_assert_str_eq(ty(nbt->id), "i64[]");
	ck_assert(!nbt->trainable);
	ck_assert_uint_eq(n->in[3], param("bn1.running_mean")->id);
	ck_assert_int_eq(kiln_graph_num_outputs(g), 0);
}
END_TEST

START_TEST(batchnorm_train_outputs_updated_stats)
{
	kiln_graph_set_training(g, true);
	kiln_value x = in_f32("x", 2, ((int64_t[]){N, 8}));
	kiln_value y = kiln_batchnorm(g, "bn", x, 1e-3, 0.2);
	/* PyTorch semantics: the inference op fed the batch statistics, and
	 * the running stats updated with momentum 0.2 (unbiased variance) */
	ir_node *n = def(y);
	ck_assert_int_eq(n->op, KILN_OP_BATCH_NORM);
	ck_assert_int_eq(n->nout, 1);
	ck_assert_int_eq(ir_attr_int(n, "training_mode", 0), 0);
	ck_assert_int_eq(ir_val(g, n->in[3])->kind, IR_V_NODE); /* batch mean, not a buffer */
	ck_assert_int_eq(kiln_graph_num_outputs(g), 3);
	ck_assert_str_eq(kiln_value_name(g, kiln_graph_output(g, 0)), "bn.running_mean.next");
	ck_assert_str_eq(kiln_value_name(g, kiln_graph_output(g, 1)), "bn.running_var.next");
	kiln_value nb = kiln_graph_output(g, 2);
	ck_assert_str_eq(kiln_value_name(g, nb), "bn.num_batches_tracked.next");
	ck_assert_str_eq(ty(nb), "i64[]");
	ck_assert_int_eq(def(nb)->op, KILN_OP_ADD);
	ck_assert_str_eq(ty(kiln_graph_output(g, 1)), "f32[8]");
	kiln_output(g, "y", y);
	verified();
}
END_TEST

START_TEST(layernorm_and_embedding)
{
	kiln_value x = in_f32("x", 3, ((int64_t[]){N, 5, 16}));
	kiln_value y = kiln_layernorm(g, "ln", x, 1, 0);
	ck_assert_str_eq(ty(y), "f32[N,5,16]");
	ck_assert_int_eq(ir_attr_int(def(y), "axis", 0), -1);
	check_fill(param("ln.weight"), 1, true);
	ck_assert_str_eq(ty(param("ln.bias")->id), "f32[16]");
	kiln_value idx = kiln_input(g, "idx", KILN_I64, 2, ((int64_t[]){N, 7}));
	kiln_value e = kiln_embedding(g, "emb", idx, 1000, 32);
	ck_assert_str_eq(ty(e), "f32[N,7,32]");
	const kiln_tensor *w = param("emb.weight")->data;
	double s = 0, sq = 0;
	for (int i = 0; i < 32000; i++) {
		double v = ((float *)w->data)[i];
		s += v, sq += v * v;
	}
	ck_assert_double_eq_tol(s / 32000, 0, 0.03);    /* N(0, 1) */
	ck_assert_double_eq_tol(sq / 32000, 1, 0.05);
}
END_TEST

START_TEST(sequential_names_layers_like_torch)
{
	kiln_value x = in_f32("x", 4, ((int64_t[]){N, 1, 28, 28}));
	const kiln_layer layers[] = {
		{KILN_L_CONV2D, .n = 4, .conv = {.kernel = {3, 3}, .pad = {1, 1}}},
		{KILN_L_BATCHNORM},
		{KILN_L_RELU},
		{KILN_L_MAXPOOL2D, .conv = {.kernel = {2, 2}}},
		{KILN_L_DROPOUT, .p = 0.5},
		{KILN_L_ADAPTIVEAVGPOOL2D_1},
		{KILN_L_FLATTEN},
		{KILN_L_LINEAR, .n = 10, .no_bias = true},
		{KILN_L_SOFTMAX},
		{KILN_L_END},
	};
	kiln_value y = kiln_sequential(g, "features", x, layers);
	ck_assert_str_eq(ty(y), "f32[N,10]");
	ck_assert_str_eq(ty(param("features.0.weight")->id), "f32[4,1,3,3]");
	param("features.1.running_var");
	ck_assert_str_eq(ty(param("features.7.weight")->id), "f32[10,4]");
	ck_assert_uint_eq(kiln_graph_find_param(g, "features.7.bias"), KILN_NONE);
	/* top-level Sequential: "0.weight" */
	kiln_value z = in_f32("z", 2, ((int64_t[]){N, 3}));
	const kiln_layer top[] = {{KILN_L_TANH}, {KILN_L_LINEAR, .n = 2}, {KILN_L_END}};
	kiln_sequential(g, "", z, top);
	ck_assert_str_eq(ty(param("1.weight")->id), "f32[2,3]");
	kiln_output(g, "y", y);
	verified();
}
END_TEST

START_TEST(sequential_failure_rolls_back_every_layer)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){N, 3}));
	uint32_t nn = g->nnode, nv = g->nval;
	const kiln_layer bad[] = {{KILN_L_LINEAR, .n = 4}, {KILN_L_RELU}, {KILN_L_CONV2D, .n = 2},
	                          {KILN_L_END}};
	kiln_value y = kiln_sequential(g, "s", x, bad);
	ck_assert_uint_eq(y, KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_ESHAPE);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "Conv2d 's.2': input f32[N,4]"));
	ck_assert_uint_eq(g->nnode, nn);
	ck_assert_uint_eq(g->nval, nv);
	ck_assert_uint_eq(kiln_graph_find_param(g, "s.0.weight"), KILN_NONE);
	kiln_graph_clear_error(g);
	const kiln_layer relu[] = {{KILN_L_RELU}, {KILN_L_END}};
	kiln_output(g, "y", kiln_sequential(g, "s", x, relu));
	verified();
	const kiln_layer unknown[] = {{(kiln_layer_kind)99}, {KILN_L_END}};
	kiln_sequential(g, "s", x, unknown);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "layer 0 has unknown kind 99"));
}
END_TEST

START_TEST(duplicate_layer_name_is_einval)
{
	kiln_value x = in_f32("x", 2, ((int64_t[]){N, 3}));
	kiln_linear(g, "fc", x, 3, true);
	ck_assert_uint_eq(kiln_linear(g, "fc", x, 3, true), KILN_NONE);
	ck_assert_int_eq(kiln_graph_status(g), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "parameter 'fc.weight' already exists"));
}
END_TEST

START_TEST(seed_makes_init_reproducible)
{
	float w[3][4];
	for (int k = 0; k < 3; k++) {
		kiln_graph *h = kiln_graph_new("h");
		kiln_graph_seed(h, k < 2 ? 42 : 43);
		kiln_value x = kiln_input(h, "x", KILN_F32, 2, ((int64_t[]){1, 4}));
		kiln_linear(h, "fc", x, 1, false);
		const kiln_tensor *t = h->val[kiln_graph_find_param(h, "fc.weight")]->data;
		memcpy(w[k], t->data, sizeof w[k]);
		kiln_graph_free(h);
	}
	ck_assert_mem_eq(w[0], w[1], sizeof w[0]);
	ck_assert(memcmp(w[0], w[2], sizeof w[0]) != 0);
}
END_TEST

static Suite *dsl_suite(void)
{
	Suite *s = suite_create("dsl");
	struct {
		const char *name;
		const TTest *tests[12];
	} cases[] = {
		{"elementwise", {elementwise_builders_trace_their_op, add_broadcasts_symbolic_and_fixed,
		                 attribute_ops_set_schema_attrs, cast_to_invalid_dtype_is_einval}},
		{"linalg", {reductions_take_axes_and_keepdims, matmul_and_gemm_shapes}},
		{"conv", {conv_attrs_from_opts_and_weight,
		          conv_kernel_that_disagrees_with_weight_is_eshape, conv_transpose_upsamples,
		          pools_and_global_pool, pool_without_kernel_is_einval}},
		{"norm", {norms_softmax_and_dropout, dropout_eval_is_identity_train_is_node}},
		{"shape_ops", {shape_ops_have_expected_types, split_failure_leaves_out_none}},
		{"losses", {losses_and_mse_composite, mse_shape_error_rolls_back_composite}},
		{"graph_io", {input_names_must_be_unique, output_names_value_or_inserts_identity,
		              params_constants_and_scalars}},
		{"errors", {shape_error_names_caller_line_and_shapes, error_is_sticky_until_cleared,
		            none_or_foreign_handle_is_einval}},
		{"layers", {linear_registers_torch_params_and_uses_gemm, linear_on_rank3_is_matmul_add,
		            linear_with_symbolic_features_is_eshape, conv2d_params_and_fan_in,
		            batchnorm_eval_params_and_buffers, batchnorm_train_outputs_updated_stats,
		            layernorm_and_embedding, duplicate_layer_name_is_einval,
		            seed_makes_init_reproducible}},
		{"sequential", {sequential_names_layers_like_torch,
		                sequential_failure_rolls_back_every_layer}},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_add_checked_fixture(tc, setup, teardown);
		for (int j = 0; cases[i].tests[j]; j++)
			tcase_add_test(tc, cases[i].tests[j]);
		suite_add_tcase(s, tc);
	}
	return s;
}

KILN_CHECK_MAIN(dsl_suite)
