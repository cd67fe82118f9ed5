/*
 * test_kir.c: textual IR: printing, parsing, exact round trips for every
 * op, rejection of malformed text with located messages, and save/load
 * with weights.
 *
 * The per-op cases are written in canonical form, so the strongest check
 * applies: parse then print gives back the very same text.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ir/ir.h"

/* ---- per-op cases ---------------------------------------------------------- */

static const char *const op_cases[] = {
	/* elementwise unary */
	"graph @unary(%x: f32[N,4], %p: bool[N,4]) -> (%y: f32[N,4], %q: bool[N,4]) {\n"
	"  %0 = neg %x : f32[N,4]\n"
	"  %1 = abs %0 : f32[N,4]\n"
	"  %2 = exp %1 : f32[N,4]\n"
	"  %3 = log %2 : f32[N,4]\n"
	"  %4 = sqrt %3 : f32[N,4]\n"
	"  %5 = reciprocal %4 : f32[N,4]\n"
	"  %6 = floor %5 : f32[N,4]\n"
	"  %7 = ceil %6 : f32[N,4]\n"
	"  %8 = sin %7 : f32[N,4]\n"
	"  %9 = cos %8 : f32[N,4]\n"
	"  %10 = relu %9 : f32[N,4]\n"
	"  %11 = leaky_relu %10 {alpha=0.01} : f32[N,4]\n"
	"  %12 = sigmoid %11 : f32[N,4]\n"
	"  %13 = tanh %12 : f32[N,4]\n"
	"  %14 = gelu %13 {approximate=\"tanh\"} : f32[N,4]\n"
	"  %15 = erf %14 : f32[N,4]\n"
	"  %16 = clip %15 {max=6.0, min=0.0} : f32[N,4]\n"
	"  %17 = cast %16 {to=f64} : f64[N,4]\n"
	"  %18 = cast %17 {to=f32} : f32[N,4]\n"
	"  %y = identity %18 : f32[N,4]\n"
	"  %q = not %p : bool[N,4]\n"
	"  ret %y, %q\n"
	"}\n",
	/* elementwise binary, broadcasting, variadic max/min, where */
	"graph @binary(%a: f32[N,4], %b: f32[4]) -> (%z: f32[N,4], %m: bool[N,4]) {\n"
	"  %0 = add %a, %b : f32[N,4]\n"
	"  %1 = sub %0, %b : f32[N,4]\n"
	"  %2 = mul %1, %a : f32[N,4]\n"
	"  %3 = div %2, %b : f32[N,4]\n"
	"  %4 = pow %3, %b : f32[N,4]\n"
	"  %5 = max %4, %a, %b : f32[N,4]\n"
	"  %6 = min %5 : f32[N,4]\n"
	"  %7 = equal %6, %a : bool[N,4]\n"
	"  %8 = less %6, %b : bool[N,4]\n"
	"  %9 = greater %a, %6 : bool[N,4]\n"
	"  %10 = and %7, %8 : bool[N,4]\n"
	"  %m = or %10, %9 : bool[N,4]\n"
	"  %z = where %m, %6, %a : f32[N,4]\n"
	"  ret %z, %m\n"
	"}\n",
	/* reductions; an empty axes list stays an ints attribute */
	"graph @reduce(%x: f32[N,3,8]) -> (%0: f32[N,1,8], %1: f32[N,8], %2: f32[1,1,1], "
	"%3: f32[N,3], %4: i64[N,8]) {\n"
	"  %0 = reduce_sum %x {axes=[1], keepdims=1} : f32[N,1,8]\n"
	"  %1 = reduce_mean %x {axes=[-2], keepdims=0} : f32[N,8]\n"
	"  %2 = reduce_max %x {axes=[], keepdims=1, noop_with_empty_axes=0} : f32[1,1,1]\n"
	"  %3 = reduce_min %x {axes=[2], keepdims=0} : f32[N,3]\n"
	"  %4 = argmax %x {axis=1, keepdims=0, select_last_index=1} : i64[N,8]\n"
	"  ret %0, %1, %2, %3, %4\n"
	"}\n",
	/* matmul and gemm with an optional third operand */
	"graph @linalg(%x: f32[N,16], %w: f32[16,8], %v: f32[10,8], %c: f32[10]) -> "
	"(%1: f32[N,10]) {\n"
	"  %0 = matmul %x, %w : f32[N,8]\n"
	"  %1 = gemm %0, %v, %c {alpha=0.5, beta=2.0, transA=0, transB=1} : f32[N,10]\n"
	"  ret %1\n"
	"}\n",
	/* convolution and pooling */
	"graph @conv(%x: f32[N,3,32,32], %w: f32[8,3,3,3], %b: f32[8], %wt: f32[8,4,2,2]) -> "
	"(%4: f32[N,4,1,1]) {\n"
	"  %0 = conv %x, %w, %b {auto_pad=\"NOTSET\", dilations=[1,1], group=1, "
	"kernel_shape=[3,3], pads=[1,1,1,1], strides=[1,1]} : f32[N,8,32,32]\n"
	"  %1 = max_pool %0 {ceil_mode=0, kernel_shape=[2,2], pads=[0,0,0,0], strides=[2,2]} "
	": f32[N,8,16,16]\n"
	"  %2 = average_pool %1 {count_include_pad=1, kernel_shape=[2,2], strides=[2,2]} "
	": f32[N,8,8,8]\n"
	"  %3 = conv_transpose %2, %wt {kernel_shape=[2,2], output_padding=[0,0], "
	"strides=[2,2]} : f32[N,4,16,16]\n"
	"  %4 = global_average_pool %3 : f32[N,4,1,1]\n"
	"  ret %4\n"
	"}\n",
	/* normalisation, with the optional extra results */
	"graph @norm(%x: f32[N,4,6,6], %s: f32[4], %b: f32[4], %m: f32[4], %v: f32[4], "
	"%t: f32[N,10], %g: f32[10]) -> (%0: f32[N,4,6,6], %1: f32[N,4,6,6], "
	"%8: f32[N,10], %9: f32[N,10]) {\n"
	"  %0 = batch_norm %x, %s, %b, %m, %v {epsilon=1e-05, momentum=0.9} : f32[N,4,6,6]\n"
	"  %1, %2, %3 = batch_norm %x, %s, %b, %m, %v {training_mode=1} : f32[N,4,6,6], "
	"f32[4], f32[4]\n"
	"  %4 = layer_norm %t, %g {axis=-1, epsilon=1e-05} : f32[N,10]\n"
	"  %5, %6, %7 = layer_norm %t, %g, %g {axis=1, stash_type=1} : f32[N,10], f32[N,1], "
	"f32[N,1]\n"
	"  %8 = softmax %4 {axis=1} : f32[N,10]\n"
	"  %9 = log_softmax %5 {axis=-1} : f32[N,10]\n"
	"  ret %0, %1, %8, %9\n"
	"}\n",
	/* data movement */
	"graph @move(%x: f32[N,2,3,4], %i: i64[5]) -> (%3: f32[N,4,2], %10: f32[N*2,15], "
	"%11: f32[3,N,4,2], %12: f32[N,2,5,6], %13: i64[2]) {\n"
	"  %0 = reshape %x {allowzero=0, shape=[0,6,-1]} : f32[N,6,4]\n"
	"  %1 = transpose %0 {perm=[0,2,1]} : f32[N,4,6]\n"
	"  %2 = concat %1, %1 {axis=2} : f32[N,4,12]\n"
	"  %3, %4, %5 = split %2 {axis=2, split=[2,4,6]} : f32[N,4,2], f32[N,4,4], "
	"f32[N,4,6]\n"
	"  %6 = slice %5 {axes=[2], ends=[5], starts=[1], steps=[2]} : f32[N,4,2]\n"
	"  %7 = gather %x, %i {axis=3} : f32[N,2,3,5]\n"
	"  %8 = flatten %7 {axis=2} : f32[N*2,15]\n"
	"  %9 = unsqueeze %8 {axes=[0]} : f32[1,N*2,15]\n"
	"  %10 = squeeze %9 {axes=[0]} : f32[N*2,15]\n"
	"  %11 = expand %6 {shape=[3,1,4,2]} : f32[3,N,4,2]\n"
	"  %12 = pad %x {mode=\"constant\", pads=[0,0,1,1,0,0,1,1], value=0.5} "
	": f32[N,2,5,6]\n"
	"  %13 = shape %x {end=3, start=1} : i64[2]\n"
	"  ret %3, %10, %11, %12, %13\n"
	"}\n",
	/* constants of every dtype, scalars and empty tensors */
	"graph @consts() -> (%0: f32[3], %1: f64[2], %2: f16[4], %3: bf16[2], %4: i8[2], "
	"%5: u8[2], %6: i32[2], %7: i64[2], %8: bool[3], %9: f32[], %10: i64[0]) {\n"
	"  %0 = constant {value=dense<f32[3]>[0.1, -2.5, 3.4028235e+38]} : f32[3]\n"
	"  %1 = constant {value=dense<f64[2]>[0.1, 1e-300]} : f64[2]\n"
	"  %2 = constant {value=dense<f16[4]>[1, 0.5, 65504, -inf]} : f16[4]\n"
	"  %3 = constant {value=dense<bf16[2]>[1.5, -3]} : bf16[2]\n"
	"  %4 = constant {value=dense<i8[2]>[-128, 127]} : i8[2]\n"
	"  %5 = constant {value=dense<u8[2]>[0, 255]} : u8[2]\n"
	"  %6 = constant {value=dense<i32[2]>[-2147483648, 7]} : i32[2]\n"
	"  %7 = constant {value=dense<i64[2]>[-9223372036854775808, 9223372036854775807]} "
	": i64[2]\n"
	"  %8 = constant {value=dense<bool[3]>[1, 0, 1]} : bool[3]\n"
	"  %9 = constant {value=dense<f32[]>[2]} : f32[]\n"
	"  %10 = constant {value=dense<i64[0]>[]} : i64[0]\n"
	"  ret %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10\n"
	"}\n",
	/* dropout and losses */
	"graph @train(%x: f32[N,10], %t: i64[N], %w: f32[10]) -> (%3: f32[], %4: f32[N], "
	"%7: f32[]) {\n"
	"  %0 = dropout %x {ratio=0.25, seed=7, training_mode=1} : f32[N,10]\n"
	"  %1, %2 = dropout %0 {ratio=0.5} : f32[N,10], bool[N,10]\n"
	"  %3 = softmax_ce %1, %t {reduction=\"mean\"} : f32[]\n"
	"  %4, %5 = softmax_ce %1, %t, %w {ignore_index=-100, reduction=\"none\"} : f32[N], "
	"f32[N,10]\n"
	"  %6 = log_softmax %1 {axis=1} : f32[N,10]\n"
	"  %7 = nll_loss %6, %t, %w {ignore_index=0, reduction=\"sum\"} : f32[]\n"
	"  ret %3, %4, %7\n"
	"}\n",
	/* quoted names, symbolic dim expressions, params, node names and locs */
	"graph @\"my graph\"(%\"x y\": f32[N+1,(N+2)/2,N*3], %\"42\": f32[M]) -> "
	"(%out: f32[N+1,(N+2)/2,N*3], %\"42\": f32[M], %1: f32[2]) {\n"
	"  param %\"w\\\"q\": f32[2]\n"
	"  buffer %bn.running_var: f32[2]\n"
	"  %0 = relu %\"x y\" : f32[N+1,(N+2)/2,N*3] name(\"relu/Relu\") loc(\"model.c\":42)\n"
	"  %out = identity %0 : f32[N+1,(N+2)/2,N*3] name(\"a \\\"quoted\\\" name\\n\")\n"
	"  %1 = add %\"w\\\"q\", %bn.running_var : f32[2] loc(\"onnx::Add_7\":0)\n"
	"  ret %out, %\"42\", %1\n"
	"}\n",
	/* composites whose formula is in ir/scalar.c */
	"graph @composite(%x: f32[N,4]) -> (%y: f32[N,4]) {\n"
	"  %0 = softplus %x : f32[N,4]\n"
	"  %1 = hard_sigmoid %0 {alpha=0.25, beta=0.45} : f32[N,4]\n"
	"  %2 = hard_swish %1 : f32[N,4]\n"
	"  %3 = mish %2 : f32[N,4]\n"
	"  %4 = softsign %3 : f32[N,4]\n"
	"  %5 = elu %4 {alpha=0.5} : f32[N,4]\n"
	"  %6 = selu %5 : f32[N,4]\n"
	"  %7 = celu %6 {alpha=2.0} : f32[N,4]\n"
	"  %y = thresholded_relu %7 {alpha=0.1} : f32[N,4]\n"
	"  ret %y\n"
	"}\n",
	/* quantization: per tensor and per axis, integer sums, requantized ops */
	"graph @quant(%x: f32[N,3,8,8], %s: f32[], %z: u8[], %sc: f32[4], %zc: i8[4], "
	"%w: i8[4,3,3,3], %b: i32[4], %m: i8[8,5], %zm: i8[]) -> (%r: f32[N,3,8,8], %5: u8[N,4,8,8], "
	"%6: i32[N,4,6,6], %7: i32[N,3,8,5], %8: u8[N,3,8,5], %d: f32[N,4,8,8]) {\n"
	"  %r = round %x : f32[N,3,8,8]\n"
	"  %0 = quantize_linear %x, %s, %z : u8[N,3,8,8]\n"
	"  %1 = dequantize_linear %w, %sc, %zc {axis=0} : f32[4,3,3,3]\n"
	"  %2, %3, %4 = dynamic_quantize_linear %r : u8[N,3,8,8], f32[], u8[]\n"
	"  %5 = qlinear_conv %0, %s, %z, %w, %sc, %zc, %s, %z, %b {kernel_shape=[3,3], "
	"pads=[1,1,1,1]} : u8[N,4,8,8]\n"
	"  %6 = conv_integer %2, %w, %4 : i32[N,4,6,6]\n"
	"  %7 = matmul_integer %0, %m, %z : i32[N,3,8,5]\n"
	"  %q = quantize_linear %x, %s : u8[N,3,8,8]\n"
	"  %8 = qlinear_matmul %q, %3, %4, %m, %s, %zm, %s, %z : u8[N,3,8,5]\n"
	"  %d = dequantize_linear %5, %s, %z : f32[N,4,8,8]\n"
	"  ret %r, %5, %6, %7, %8, %d\n"
	"}\n",
	/* inverse trigonometry, product, element gathers and scatters, resize */
	"graph @more(%x: f32[N,3,4], %i: i64[N,3,2], %u: f32[N,3,2], %j: i64[2,2], "
	"%v: f32[2,4], %y: f32[N,3,5,6], %gr: f32[N,2,2,2]) -> (%3: f32[N,3], %4: f32[N,3,2], "
	"%6: f32[N,3,4], %7: f32[N,3,8], %8: f32[N,2,4], %9: i64[N,2,4], %10: f32[N,3,2,2]) {\n"
	"  %0 = atan %x : f32[N,3,4]\n"
	"  %1 = asin %0 : f32[N,3,4]\n"
	"  %2 = acos %1 : f32[N,3,4]\n"
	"  %3 = reduce_prod %2 {axes=[2], keepdims=0} : f32[N,3]\n"
	"  %4 = gather_elements %x, %i {axis=2} : f32[N,3,2]\n"
	"  %5 = scatter_elements %x, %i, %u {axis=2, reduction=\"add\"} : f32[N,3,4]\n"
	"  %6 = scatter_nd %5, %j, %v {reduction=\"mul\"} : f32[N,3,4]\n"
	"  %7 = resize %x {mode=\"linear\", scales=[1.0,1.0,2.0]} : f32[N,3,8]\n"
	"  %8, %9 = top_k %x {axis=1, k=2, largest=0} : f32[N,2,4], i64[N,2,4]\n"
	"  %10 = grid_sample %y, %gr {align_corners=1, mode=\"bicubic\"} : f32[N,3,2,2]\n"
	"  ret %3, %4, %6, %7, %8, %9, %10\n"
	"}\n",
	/* symbolic dims in attributes (kind ds): a slice ending at S, ranges
	 * of S+1 and ceil(S/4) elements, a reshape to [N,S,4] */
	"graph @dyn(%x: f32[N*S,4], %b: i64[1,512]) -> (%0: i64[1,S], %1: f32[S+1], "
	"%2: f32[N,S,4], %3: i64[(S+3)/4]) {\n"
	"  %0 = slice %b {axes=[1], ends=[S], starts=[0]} : i64[1,S]\n"
	"  %1 = range {dtype=f32, n=[S+1], start=0.5} : f32[S+1]\n"
	"  %2 = reshape %x {shape=[N,S,4]} : f32[N,S,4]\n"
	"  %3 = range {delta=4.0, dtype=i64, n=[(S+3)/4]} : i64[(S+3)/4]\n"
	"  ret %0, %1, %2, %3\n"
	"}\n",
	/* MaxPool with its Indices output, column major */
	"graph @mpi(%x: f32[N,3,5,4]) -> (%y: f32[N,3,3,2], %i: i64[N,3,3,2]) {\n"
	"  %y, %i = max_pool %x {ceil_mode=0, kernel_shape=[3,2], pads=[1,0,1,0], storage_order=1, "
	"strides=[2,2]} : f32[N,3,3,2], i64[N,3,3,2]\n"
	"  ret %y, %i\n"
	"}\n",
	/* the fused recurrent ops over a symbolic T: a bidirectional LSTM with
	 * B, sequence_lens and peepholes (inputs at ONNX positions 3, 4, 7), a
	 * batch-first GRU with initial_h only, a reverse RNN with clip */
	"graph @rnn(%x: f32[T,N,3], %w: f32[2,8,3], %r: f32[2,8,2], %b: f32[2,16], %l: i32[N], "
	"%p: f32[2,6], %xg: f32[N,T,3], %wg: f32[1,6,3], %rg: f32[1,6,2], %h: f32[N,1,2], "
	"%wr: f32[1,2,3], %rr: f32[1,2,2]) -> (%0: f32[T,2,N,2], %1: f32[2,N,2], %2: f32[2,N,2], "
	"%3: f32[N,T,1,2], %4: f32[N,1,2], %5: f32[T,1,N,2], %6: f32[1,N,2]) {\n"
	"  %0, %1, %2 = lstm %x, %w, %r, %b, %l, %p {activation_alpha=[0.5], "
	"activations=\"LeakyRelu,Tanh,Softsign\", direction=\"bidirectional\", hidden_size=2, "
	"input_forget=1, inputs=[3,4,7]} : f32[T,2,N,2], f32[2,N,2], f32[2,N,2]\n"
	"  %3, %4 = gru %xg, %wg, %rg, %h {hidden_size=2, inputs=[5], layout=1, "
	"linear_before_reset=1} : f32[N,T,1,2], f32[N,1,2]\n"
	"  %5, %6 = rnn %x, %wr, %rr {clip=0.5, direction=\"reverse\", hidden_size=2} : "
	"f32[T,1,N,2], f32[1,N,2]\n"
	"  ret %0, %1, %2, %3, %4, %5, %6\n"
	"}\n",
};
#define NCASES (int)(sizeof op_cases / sizeof op_cases[0])

static kiln_graph *parse_ok(const char *text)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	kiln_status st = ir_parse(text, "t.kir", &g, &err);
	ck_assert_msg(st == KILN_OK, "parse failed: %s\n%s", err.msg, text);
	return g;
}

static char *reprint(const char *text)
{
	kiln_graph *g = parse_ok(text);
	char *s = ir_print(g);
	kiln_graph_free(g);
	ck_assert_ptr_nonnull(s);
	return s;
}

START_TEST(every_op_has_a_round_trip_case)
{
	bool seen[KILN_OP_COUNT] = {0};
	for (int c = 0; c < NCASES; c++) {
		kiln_graph *g = parse_ok(op_cases[c]);
		for (uint32_t i = 0; i < g->nnode; i++)
			seen[g->node[i]->op] = true;
		kiln_graph_free(g);
	}
	char missing[1024] = "";
	for (int op = 0; op < KILN_OP_COUNT; op++)
		if (!seen[op]) {
			strncat(missing, " ", sizeof missing - strlen(missing) - 1);
			strncat(missing, ir_op(op)->kir, sizeof missing - strlen(missing) - 1);
		}
	ck_assert_msg(!missing[0], "ops without a .kir round-trip case:%s", missing);
}
END_TEST

START_TEST(op_case_prints_back_identically)
{
	char *once = reprint(op_cases[_i]);
	ck_assert_str_eq(once, op_cases[_i]);
	char *twice = reprint(once);
	ck_assert_str_eq(twice, once);
	free(once);
	free(twice);
}
END_TEST

START_TEST(op_case_passes_the_verifier)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	kiln_status st = kiln_graph_from_kir(op_cases[_i], "t.kir", &g, &err);
	ck_assert_msg(st == KILN_OK, "%s: %s\n%s", kiln_status_str(st), err.msg, op_cases[_i]);
	kiln_graph_free(g);
}
END_TEST

/* ---- values the text must carry exactly ------------------------------------ */

START_TEST(constants_keep_exact_bits)
{
	kiln_graph *g = parse_ok(op_cases[7]);
	const kiln_tensor *f32 = ir_attr_get(g->node[0], "value")->u.t;
	ck_assert_float_eq(((float *)f32->data)[0], 0.1f);
	ck_assert_float_eq(((float *)f32->data)[2], 3.40282347e+38f);
	const uint16_t *h = ir_attr_get(g->node[2], "value")->u.t->data;
	ck_assert_uint_eq(h[0], 0x3c00);
	ck_assert_uint_eq(h[1], 0x3800);
	ck_assert_uint_eq(h[2], 0x7bff);
	ck_assert_uint_eq(h[3], 0xfc00);
	const uint16_t *bf = ir_attr_get(g->node[3], "value")->u.t->data;
	ck_assert_uint_eq(bf[0], 0x3fc0);
	ck_assert_uint_eq(bf[1], 0xc040);
	const int64_t *i64 = ir_attr_get(g->node[7], "value")->u.t->data;
	ck_assert_int_eq(i64[0], INT64_MIN);
	ck_assert_int_eq(i64[1], INT64_MAX);
	ck_assert_int_eq(ir_attr_get(g->node[9], "value")->u.t->rank, 0);
	kiln_graph_free(g);
}
END_TEST

/* Floats that need all 17 digits, subnormals, -0 and specials survive. */
START_TEST(float_attributes_round_trip_bit_exact)
{
	static const double v[] = {0.1, 1.0 / 3, 1e-05, -0.0, 1e300, 5e-324, 2.0, NAN, -INFINITY};
	kiln_graph *g = parse_ok("graph @f(%x: f32[2]) -> (%0: f32[2]) {\n"
	                         "  %0 = relu %x : f32[2]\n  ret %0\n}\n");
	ir_attr_set_floats(g, g->node[0], "fs", 9, v);
	ir_attr_set_float(g, g->node[0], "third", 1.0 / 3);
	char *s = ir_print(g);
	ck_assert_ptr_nonnull(strstr(s, "fs=[0.1,0.3333333333333333,1e-05,-0.0,1e+300,"
	                                "5e-324,2.0,nan,-inf]"));
	kiln_graph *h = parse_ok(s);
	const ir_attr *a = ir_attr_get(h->node[0], "fs");
	ck_assert_int_eq(a->kind, IR_A_FLOATS);
	ck_assert_int_eq(a->n, 9);
	ck_assert_mem_eq(a->u.floats, v, 7 * sizeof(double));
	ck_assert(isnan(a->u.floats[7]) && isinf(a->u.floats[8]) && a->u.floats[8] < 0);
	ck_assert_double_eq(ir_attr_get(h->node[0], "third")->u.f, 1.0 / 3);
	free(s);
	kiln_graph_free(g);
	kiln_graph_free(h);
}
END_TEST

/* %5 is "no name"; a value really named "5" prints quoted; duplicates of a
 * name print numbered so the text still parses. */
START_TEST(names_that_look_like_numbers_are_quoted)
{
	kiln_graph *g = kiln_graph_new("g");
	ir_type t = {KILN_F32, 1, {2}};
	ir_input_new(g, "5", &t);
	ir_input_new(g, NULL, &t);
	ir_input_new(g, "x:", &t);
	uint32_t in[1] = {1};
	ir_node *n = ir_node_new(g, KILN_OP_RELU, 1, in, 1, (kiln_loc){0});
	g->val[n->out[0]]->type = t;
	g->val[n->out[0]]->name = ir_intern(g, "5");
	ir_output_add(g, n->out[0], NULL);
	char *s = ir_print(g);
	ck_assert_str_eq(s, "graph @g(%\"5\": f32[2], %0: f32[2], %\"x:\": f32[2]) -> "
	                    "(%1: f32[2]) {\n  %1 = relu %\"5\" : f32[2]\n  ret %1\n}\n");
	char *again = reprint(s);
	ck_assert_str_eq(again, s);
	kiln_graph *h = parse_ok(s);
	ck_assert_str_eq(h->val[h->input[0]]->name, "5");
	ck_assert_ptr_null(h->val[h->input[1]]->name);
	ck_assert_str_eq(h->val[h->input[2]]->name, "x:");
	free(s);
	free(again);
	kiln_graph_free(g);
	kiln_graph_free(h);
}
END_TEST

START_TEST(symbolic_dims_parse_to_interned_expressions)
{
	kiln_graph *g = parse_ok(op_cases[9]);
	const ir_type *t = &g->val[g->input[0]]->type;
	int64_t N = ir_dim_sym(g, "N");
	ck_assert_int_eq(t->dim[0], ir_dim_add(g, N, 1));
	ck_assert_int_eq(t->dim[1], ir_dim_div(g, ir_dim_add(g, N, 2), 2));
	ck_assert_int_eq(t->dim[2], ir_dim_mul(g, N, 3));
	/* precedence: 2+N*3 is 2+(N*3) */
	kiln_graph_free(g);
	g = parse_ok("graph @f(%x: f32[2+N*3, (N)]) -> (%x: f32[N*3+2,N]) {\n  ret %x\n}\n");
	t = &g->val[g->input[0]]->type;
	N = ir_dim_sym(g, "N");
	ck_assert_int_eq(t->dim[0], ir_dim_add(g, ir_dim_mul(g, N, 3), 2));
	ck_assert_int_eq(t->dim[1], N);
	kiln_graph_free(g);
}
END_TEST

/* Signatures may give just types (as hand-written tests do), and nodes
 * parsed from text remember the .kir line but do not print it. */
START_TEST(lenient_forms_print_canonically)
{
	char *s = reprint("graph @f(%x: f32[N,4]) -> f32[N,4] {\n"
	                  "  %a = add %x, %x   # a comment\n : f32[N,4]\n"
	                  "  %b = mul %a, %a : f32[N,4]\n  ret %b\n}\n");
	ck_assert_str_eq(s, "graph @f(%x: f32[N,4]) -> (%b: f32[N,4]) {\n"
	                    "  %a = add %x, %x : f32[N,4]\n  %b = mul %a, %a : f32[N,4]\n"
	                    "  ret %b\n}\n");
	kiln_graph *g = parse_ok(s);
	ck_assert_str_eq(g->node[1]->loc.file, "t.kir");
	ck_assert_int_eq(g->node[1]->loc.line, 3);
	free(s);
	kiln_graph_free(g);
}
END_TEST

START_TEST(dsl_graph_round_trips)
{
	kiln_graph *g = kiln_graph_new("mlp");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, ((int64_t[]){N, 8}));
	kiln_value h = kiln_relu(g, kiln_linear(g, "fc1", x, 16, true));
	kiln_output(g, "logits", kiln_linear(g, "fc2", h, 3, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	char *s = kiln_graph_to_kir(g);
	ck_assert_ptr_nonnull(strstr(s, "param %fc1.weight: f32[16,8]"));
	ck_assert_ptr_nonnull(strstr(s, "loc(\"" __FILE__ "\":"));
	kiln_graph *back = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_from_kir(s, "m.kir", &back, &err) == KILN_OK, "%s", err.msg);
	char *again = kiln_graph_to_kir(back);
	ck_assert_str_eq(again, s);
	free(s);
	free(again);
	kiln_graph_free(g);
	kiln_graph_free(back);
}
END_TEST

/* ---- malformed text -------------------------------------------------------- */

typedef struct bad_case {
	const char *body; /* inserted after the header line */
	kiln_status code;
	const char *msg;
} bad_case;

#define HDR "graph @f(%x: f32[2]) -> (%0: f32[2]) {\n"
static const bad_case bad_cases[] = {
	{"  %0 = frobnicate %x : f32[2]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:8: unknown op 'frobnicate'"},
	{"  %0 = relu %nope : f32[2]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:13: undefined value '%nope'"},
	{"  %x = relu %x : f32[2]\n  ret %x\n}\n", KILN_EPARSE, "t.kir:2:3: redefinition of '%x'"},
	{"  %0 = relu %x : f33[2]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:18: expected a dtype (f32, i64, ...), found 'f33'"},
	{"  %0 = relu %x : f32[2] name(\"abc\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:30: unterminated string"},
	{"  %0 = leaky_relu %x {alpha=} : f32[2]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:29: bad value for attribute 'alpha'"},
	{"  %0, %1 = split %x {axis=0, split=[1,1]} : f32[1]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:3:3: node has 2 results but 1 type"},
	{"  %0 = relu %x : f32[2]\n  ret %0\n}\ngarbage\n", KILN_EPARSE,
	 "t.kir:5:1: expected end of input after '}', found 'garbage'"},
	{"  %0 = add %x : f32[2]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:8: add takes 2 operands, found 1"},
	{"  %0 = relu %x : f32[2]\n  ret\n}\n", KILN_EPARSE,
	 "t.kir:3:3: ret gives 0 values but the signature declares 1"},
	{"  %0 = cast %x {to=i64} : i64[2]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:3:7: ret value '%0' is i64[2] but the signature says f32[2]"},
	{"  %0 = leaky_relu %x {alpha=0.1, alpha=0.2} : f32[2]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:34: duplicate attribute 'alpha'"},
	{"  %0 = constant {value=dense<u8[1]>[256]} : u8[1]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:37: value 256 out of range for u8"},
	{"  %0 = constant {value=dense<i64[3]>[1, 2]} : i64[3]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:42: dense<i64> has 3 elements, found 2"},
	{"  %0 = relu %x : f32[N/0]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:24: divisor must be a positive integer"},
	{"  %0 = relu %x : f32[9223372036854775807+1]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:42: dimension overflows"},
	{"  param %w: f32[N]\n  %0 = relu %x : f32[2]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:13: type f32[N] must have fixed dimensions"},
	{"  param %w: f32[1099511627776]\n  %0 = relu %x : f32[2]\n  ret %0\n}\n",
	 KILN_EPARSE, "t.kir:2:9: parameters exceed 4294967296 bytes"},
	/* element counts past 2^40, kiln's cap for one tensor, as the ONNX
	 * importer refuses them; the first two overflow 64 bits */
	{"  %0 = relu %x : f32[4294967296,4294967296,4294967296]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:18: type f32[4294967296,4294967296,4294967296] has more than 2^40 elements "
	 "(kiln's limit for one tensor)"},
	{"  param %w: u8[65536,65536,65536,65536,2]\n  %0 = relu %x : f32[2]\n  ret %0\n}\n",
	 KILN_EPARSE, "t.kir:2:13: type u8[65536,65536,65536,65536,2] has more than 2^40"},
	{"  %0 = relu %x : f32[N,1099511627777]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:18: type f32[N,1099511627777] has more than 2^40 elements"},
	{"  %0 = relu %x : f32[0,2097152,1048576]\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:18: type f32[0,2097152,1048576] has more than 2^40 elements"},
	{"  %0 = relu %x : f32[2] $\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:25: unexpected character '$'"},
	{"  %0 = relu %x : f32[2]\n}\n", KILN_EPARSE, "t.kir:3:1: expected 'ret' before '}'"},
	{"  %0 = relu %x : f32[2] extra\n  ret %0\n}\n", KILN_EPARSE,
	 "t.kir:2:25: expected a statement (param, buffer, a node or ret), found 'extra'"},
	{"  %0 = relu %x : f32[2]\n  ret %x\n}\n", KILN_EPARSE,
	 "t.kir:3:7: ret value 0 is '%x' but the signature names '%0'"},
	{"  %0 = cast %x {to=i64} : f32[2]\n  ret %0\n}\n", KILN_EVERIFY, "i64[2]"},
};
#define NBAD (int)(sizeof bad_cases / sizeof bad_cases[0])

START_TEST(malformed_text_is_rejected_with_location)
{
	const bad_case *c = &bad_cases[_i];
	char text[512];
	snprintf(text, sizeof text, "%s%s", HDR, c->body);
	kiln_graph *g = (kiln_graph *)1;
	kiln_error err = {0};
	kiln_status st = kiln_graph_from_kir(text, "t.kir", &g, &err);
	ck_assert_ptr_null(g);
	ck_assert_msg(st == c->code, "got %s: %s", kiln_status_str(st), err.msg);
	ck_assert_int_eq(err.code, c->code);
	ck_assert_msg(strstr(err.msg, c->msg), "message '%s' lacks '%s'", err.msg, c->msg);
}
END_TEST

START_TEST(deep_dim_nesting_is_refused)
{
	char text[512];
	int n = snprintf(text, sizeof text, "graph @f(%%x: f32[");
	for (int i = 0; i < 40; i++)
		text[n++] = '(';
	text[n++] = 'N';
	for (int i = 0; i < 40; i++)
		text[n++] = ')';
	snprintf(text + n, sizeof text - n, "]) -> (%%x: f32[N]) {\n  ret %%x\n}\n");
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(ir_parse(text, "t.kir", &g, &err), KILN_EPARSE);
	ck_assert_ptr_nonnull(strstr(err.msg, "t.kir:1:50: dimension expression nested too deeply"));
}
END_TEST

/* Every prefix and many one-byte mutations of a real file: never a crash
 * (ASan watches), always OK or EPARSE with a located message. */
START_TEST(truncated_and_mutated_text_never_crashes)
{
	const char *src = op_cases[9];
	size_t len = strlen(src);
	char *buf = malloc(len + 1);
	static const char subst[] = {'%', '"', '(', ')', '[', ']', ',', '9', '-', '\\', '#', '\n'};
	for (size_t cut = 0; cut <= len; cut++) {
		for (size_t k = 0; k <= sizeof subst; k++) {
			memcpy(buf, src, len + 1);
			if (k < sizeof subst && cut < len)
				buf[cut] = subst[k];
			else if (k == sizeof subst)
				buf[cut] = 0;
			kiln_graph *g = NULL;
			kiln_error err = {0};
			kiln_status st = ir_parse(buf, "m.kir", &g, &err);
			ck_assert(st == KILN_OK || st == KILN_EPARSE);
			ck_assert(st != KILN_EPARSE || strncmp(err.msg, "m.kir:", 6) == 0);
			kiln_graph_free(g);
		}
	}
	free(buf);
}
END_TEST

/* ---- save and load ---------------------------------------------------------- */

static char *tmpdir(void)
{
	char *d = strdup("/tmp/kiln_kir_XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(d));
	return d;
}

static bool exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

START_TEST(save_load_round_trips_weights)
{
	kiln_graph *g = parse_ok(op_cases[9]);
	float *w = g->val[kiln_graph_find_param(g, "w\"q")]->data->data;
	w[0] = 1.5f;
	w[1] = -2.25f;
	char *dir = tmpdir(), kir[256], st[256];
	snprintf(kir, sizeof kir, "%s/model.kir", dir);
	snprintf(st, sizeof st, "%s/model.safetensors", dir);
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_save(g, kir, &err) == KILN_OK, "%s", err.msg);
	ck_assert(exists(st));
	kiln_graph *h = NULL;
	ck_assert_msg(kiln_graph_load(kir, &h, &err) == KILN_OK, "%s", err.msg);
	const float *v = h->val[kiln_graph_find_param(h, "w\"q")]->data->data;
	ck_assert_float_eq(v[0], 1.5f);
	ck_assert_float_eq(v[1], -2.25f);
	ck_assert(h->val[kiln_graph_find_param(h, "w\"q")]->trainable);
	ck_assert(!h->val[kiln_graph_find_param(h, "bn.running_var")]->trainable);
	char *a = ir_print(g), *b = ir_print(h);
	ck_assert_str_eq(a, b);
	free(a);
	free(b);
	kiln_graph_free(g);
	kiln_graph_free(h);
	unlink(kir);
	unlink(st);
	rmdir(dir);
	free(dir);
}
END_TEST

/* No params: no weight file, and a stale one from an earlier save goes. */
START_TEST(save_without_params_removes_stale_weights)
{
	char *dir = tmpdir(), kir[256], st[256];
	snprintf(kir, sizeof kir, "%s/m.kir", dir);
	snprintf(st, sizeof st, "%s/m.safetensors", dir);
	kiln_graph *g = parse_ok(op_cases[9]);
	kiln_error err = {0};
	ck_assert_int_eq(kiln_graph_save(g, kir, &err), KILN_OK);
	ck_assert(exists(st));
	kiln_graph_free(g);
	g = parse_ok(op_cases[0]);
	ck_assert_int_eq(kiln_graph_save(g, kir, &err), KILN_OK);
	ck_assert(!exists(st));
	kiln_graph *h = NULL;
	ck_assert_msg(kiln_graph_load(kir, &h, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(h->nnode, g->nnode);
	kiln_graph_free(g);
	kiln_graph_free(h);
	unlink(kir);
	rmdir(dir);
	free(dir);
}
END_TEST

#define MISSING "model.safetensors' is missing"

/* A .kir with parameters whose weights file is missing loads (inspect and
 * opt need no weights), but running, compiling, exporting or training it
 * is refused naming the file instead of using all-zero weights; loading
 * weights lifts that, and saving it writes no weights file of zeros. */
START_TEST(missing_weights_refuse_run_compile_export_and_train)
{
	char *dir = tmpdir(), kir[256], copy[256], st[256];
	snprintf(kir, sizeof kir, "%s/model.kir", dir);
	snprintf(copy, sizeof copy, "%s/copy.kir", dir);
	snprintf(st, sizeof st, "%s/copy.safetensors", dir);
	FILE *f = fopen(kir, "w");
	ck_assert_ptr_nonnull(f);
	fputs("graph @m(%x: f32[N,2]) -> (%y: f32[N,2]) {\n  param %w: f32[2]\n"
	      "  %y = add %x, %w : f32[N,2]\n  ret %y\n}\n", f);
	fclose(f);
	kiln_graph *g = NULL, *t = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_load(kir, &g, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 2, (int64_t[]){1, 2}), *y = NULL;
	ck_assert_int_eq(kiln_graph_run(g, &x, 1, &y, 1, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "cannot run graph 'm'") && strstr(err.msg, MISSING) &&
	              strstr(err.msg, "1 parameters ('w')"), "%s", err.msg);
	void *data = NULL;
	size_t size = 0;
	ck_assert_int_eq(kiln_onnx_export_mem(g, &data, &size, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "cannot export") && strstr(err.msg, MISSING), "%s", err.msg);
	snprintf(copy, sizeof copy, "%s/m.so", dir);
	ck_assert_int_eq(kiln_compile(g, copy, NULL, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "cannot compile") && strstr(err.msg, MISSING), "%s", err.msg);
	ck_assert(!exists(copy));
	ck_assert_int_eq(kiln_train_graph_from_inference(g, 0, &t, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "cannot train") && strstr(err.msg, MISSING), "%s", err.msg);
	kiln_trainer *tr = NULL;
	kiln_train_opts o = {.optim = KILN_OPT_SGD, .loss = KILN_LOSS_MSE};
	ck_assert_int_eq(kiln_trainer_new(g, NULL, &o, &tr, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "cannot train") && strstr(err.msg, MISSING), "%s", err.msg);
	ck_assert_ptr_null(tr);
	/* saved elsewhere, it stays without weights rather than gaining zeros */
	snprintf(copy, sizeof copy, "%s/copy.kir", dir);
	ck_assert_msg(kiln_graph_save(g, copy, &err) == KILN_OK, "%s", err.msg);
	ck_assert(!exists(st));
	kiln_graph *h = NULL;
	ck_assert_msg(kiln_graph_load(copy, &h, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(kiln_graph_run(h, &x, 1, &y, 1, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "copy.safetensors' is missing"), "%s", err.msg);
	/* weights loaded: it runs, with them */
	kiln_tensor *w = kiln_tensor_new(KILN_F32, 1, (int64_t[]){2});
	((float *)w->data)[0] = 1.5f, ((float *)w->data)[1] = -2;
	kiln_tensor_set *s = kiln_tensor_set_new();
	ck_assert_int_eq(kiln_tensor_set_add(s, "w", w), KILN_OK);
	ck_assert_msg(kiln_graph_load_params(g, s, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_graph_run(g, &x, 1, &y, 1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_float_eq(((float *)y->data)[0], 1.5f);
	ck_assert_float_eq(((float *)y->data)[1], -2.0f);
	kiln_tensor_free(y);
	kiln_tensor_set_free(s), kiln_tensor_free(w), kiln_tensor_free(x);
	kiln_graph_free(g), kiln_graph_free(h);
	unlink(kir), unlink(copy);
	rmdir(dir);
	free(dir);
}
END_TEST

/* A .kir without parameters needs no weights file. */
START_TEST(graph_without_params_runs_without_weights_file)
{
	char *dir = tmpdir(), kir[256];
	snprintf(kir, sizeof kir, "%s/relu.kir", dir);
	FILE *f = fopen(kir, "w");
	ck_assert_ptr_nonnull(f);
	fputs("graph @r(%x: f32[2]) -> (%y: f32[2]) {\n  %y = relu %x : f32[2]\n  ret %y\n}\n", f);
	fclose(f);
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_load(kir, &g, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 1, (int64_t[]){2}), *y = NULL;
	((float *)x->data)[0] = -1, ((float *)x->data)[1] = 3;
	ck_assert_msg(kiln_graph_run(g, &x, 1, &y, 1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_float_eq(((float *)y->data)[0], 0);
	ck_assert_float_eq(((float *)y->data)[1], 3);
	void *data = NULL;
	size_t size = 0;
	ck_assert_msg(kiln_onnx_export_mem(g, &data, &size, &err) == KILN_OK, "%s", err.msg);
	free(data);
	kiln_tensor_free(x), kiln_tensor_free(y);
	kiln_graph_free(g);
	unlink(kir);
	rmdir(dir);
	free(dir);
}
END_TEST

START_TEST(load_reports_missing_file_and_bad_text)
{
	char *dir = tmpdir(), kir[256];
	snprintf(kir, sizeof kir, "%s/none.kir", dir);
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(kiln_graph_load(kir, &g, &err), KILN_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "none.kir"));
	FILE *f = fopen(kir, "w");
	fputs("graph @f() -> () {\n  ret\n} }\n", f);
	fclose(f);
	ck_assert_int_eq(kiln_graph_load(kir, &g, &err), KILN_EPARSE);
	ck_assert_ptr_nonnull(strstr(err.msg, "none.kir:3:3: expected end of input"));
	ck_assert_ptr_null(g);
	unlink(kir);
	rmdir(dir);
	free(dir);
}
END_TEST

static Suite *kir_suite(void)
{
	Suite *s = suite_create("kir");
	TCase *tc = tcase_create("round_trip");
	tcase_add_test(tc, every_op_has_a_round_trip_case);
	tcase_add_loop_test(tc, op_case_prints_back_identically, 0, NCASES);
	tcase_add_loop_test(tc, op_case_passes_the_verifier, 0, NCASES);
	tcase_add_test(tc, constants_keep_exact_bits);
	tcase_add_test(tc, float_attributes_round_trip_bit_exact);
	tcase_add_test(tc, names_that_look_like_numbers_are_quoted);
	tcase_add_test(tc, symbolic_dims_parse_to_interned_expressions);
	tcase_add_test(tc, lenient_forms_print_canonically);
	tcase_add_test(tc, dsl_graph_round_trips);
	suite_add_tcase(s, tc);
	tc = tcase_create("errors");
	tcase_add_loop_test(tc, malformed_text_is_rejected_with_location, 0, NBAD);
	tcase_add_test(tc, deep_dim_nesting_is_refused);
	tcase_add_test(tc, truncated_and_mutated_text_never_crashes);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	tc = tcase_create("save_load");
	tcase_add_test(tc, save_load_round_trips_weights);
	tcase_add_test(tc, save_without_params_removes_stale_weights);
	tcase_add_test(tc, load_reports_missing_file_and_bad_text);
	tcase_add_test(tc, missing_weights_refuse_run_compile_export_and_train);
	tcase_add_test(tc, graph_without_params_runs_without_weights_file);
	suite_add_tcase(s, tc);
	return s;
}

#include "check_main.h"
KILN_CHECK_MAIN(kir_suite)
