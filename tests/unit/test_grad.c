/*
 * test_grad.c: reverse-mode autodiff.  Every gradient rule is checked
 * against central finite differences in f64 through the interpreter, with
 * seeded random inputs kept away from kinks and ties; the driver's pruning,
 * fan-out, broadcasting, naming and error paths are checked directly, and
 * a table walk fails for any differentiable op without a rule.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"
#include "kiln/kiln.h"
#include "passes/passes.h"

#include "check_main.h"

/* ---- harness ----------------------------------------------------------------- */

static kiln_graph *g;
static kiln_tensor *data[16]; /* graph input data, in input order */
static int ndata;
static uint64_t rng;
static kiln_graph *fwd;       /* the forward graph alone, for finite differences */
static kiln_tensor *outs[17]; /* loss and gradients from one run */

static void setup(void)
{
	g = kiln_graph_new("grad");
	ndata = 0;
	rng = 0x9e3779b97f4a7c15ULL;
}

static void teardown(void)
{
	kiln_graph_free(g);
	for (int i = 0; i < ndata; i++)
		kiln_tensor_free(data[i]);
	g = NULL;
	kiln_graph_free(fwd);
	fwd = NULL;
	for (int i = 0; i < 17; i++) {
		kiln_tensor_free(outs[i]);
		outs[i] = NULL;
	}
}

static double urand(void) /* xorshift64*, uniform in [0, 1) */
{
	rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
	return (double)((rng * 0x2545f4914f6cdd1dULL) >> 11) * 0x1.0p-53;
}

static kiln_value input(const char *name, kiln_dtype dt, int rank, const int64_t *dims)
{
	kiln_value v = kiln_input(g, name, dt, rank, dims);
	ck_assert_msg(v, "%s", kiln_graph_errmsg(g));
	data[ndata] = kiln_tensor_new(dt, rank, dims);
	ck_assert_ptr_nonnull(data[ndata]);
	return v;
}

static kiln_tensor *last(void)
{
	return data[ndata++];
}

/* f64 input uniform in [lo, hi) */
static kiln_value uni(const char *name, int rank, const int64_t *dims, double lo, double hi)
{
	kiln_value v = input(name, KILN_F64, rank, dims);
	kiln_tensor *t = last();
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		ir_store(t, i, lo + (hi - lo) * urand());
	return v;
}

/* f64 input of random sign with magnitude in [0.2, 1.2): no value near 0 */
static kiln_value away(const char *name, int rank, const int64_t *dims)
{
	kiln_value v = input(name, KILN_F64, rank, dims);
	kiln_tensor *t = last();
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		ir_store(t, i, (urand() < 0.5 ? -1 : 1) * (0.2 + urand()));
	return v;
}

/* i64 input with the given values */
static kiln_value ints(const char *name, int rank, const int64_t *dims, const int64_t *v)
{
	kiln_value x = input(name, KILN_I64, rank, dims);
	kiln_tensor *t = last();
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		ir_store_i64(t, i, v[i]);
	return x;
}

static kiln_value randn_like(kiln_value y)
{
	const ir_type *t = &g->val[y]->type;
	kiln_tensor *r = kiln_tensor_new(t->dtype, t->rank, t->dim);
	ck_assert_ptr_nonnull(r);
	for (int64_t i = 0; i < kiln_tensor_numel(r); i++)
		ir_store(r, i, urand() * 2 - 1);
	kiln_value c = kiln_constant(g, r);
	kiln_tensor_free(r);
	return c;
}

static double run_loss(const kiln_graph *f)
{
	kiln_tensor *out = NULL;
	kiln_error err;
	ck_assert_msg(kiln_graph_run(f, data, ndata, &out, 1, &err) == KILN_OK, "%s", err.msg);
	double v = ir_load(out, 0);
	kiln_tensor_free(out);
	return v;
}

/* Compares the gradient of the loss for input slot with central
 * differences, element by element; grad NULL means it must be zero. */
static void compare(int slot, const kiln_tensor *grad)
{
	kiln_tensor *x = data[slot];
	ck_assert(!grad || kiln_tensor_numel(grad) == kiln_tensor_numel(x));
	for (int64_t i = 0; i < kiln_tensor_numel(x); i++) {
		double v = ir_load(x, i), h = 1e-5 * (fabs(v) > 1 ? fabs(v) : 1);
		ir_store(x, i, v + h);
		double lp = run_loss(fwd);
		ir_store(x, i, v - h);
		double lm = run_loss(fwd);
		ir_store(x, i, v);
		double fd = (lp - lm) / (2 * h), an = grad ? ir_load(grad, i) : 0;
		ck_assert_msg(fabs(fd - an) <= 1e-6 * (fabs(fd) + fabs(an)) + 1e-8,
		              "d/d%s[%lld]: analytic %.12g, finite difference %.12g",
		              kiln_value_name(g, g->input[slot]), (long long)i, an, fd);
	}
}

/* loss = sum_k sum(y_k * R_k) for random R_k; checks the gradient of every
 * f64 input (KILN_NONE must mean a zero gradient), after checking that the
 * whole graph verifies. */
static void gradcheck_n(int ny, const kiln_value *ys)
{
	kiln_value loss = KILN_NONE;
	for (int k = 0; k < ny; k++) {
		ck_assert_msg(ys[k], "forward failed: %s", kiln_graph_errmsg(g));
		kiln_value s = kiln_reduce_sum(g, kiln_mul(g, ys[k], randn_like(ys[k])), 0, NULL,
		                               false);
		loss = loss ? kiln_add(g, loss, s) : s;
	}
	kiln_output(g, "loss", loss);
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	fwd = ir_graph_clone(g);
	kiln_value wrt[16], grads[16];
	int slot[16], nw = 0, no = 1, at[16];
	for (int i = 0; i < kiln_graph_num_inputs(g); i++)
		if (kiln_dtype_is_float(kiln_value_dtype(g, kiln_graph_input(g, i))))
			slot[nw] = i, wrt[nw++] = kiln_graph_input(g, i);
	ck_assert_msg(kiln_grad(g, loss, nw, wrt, grads) == KILN_OK, "%s", kiln_graph_errmsg(g));
	for (int k = 0; k < nw; k++) {
		char name[16];
		snprintf(name, sizeof name, "d%d", k);
		at[k] = grads[k] ? no++ : -1;
		if (grads[k])
			kiln_output(g, name, grads[k]);
	}
	kiln_error err;
	ck_assert_msg(kiln_graph_verify(g, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_graph_run(g, data, ndata, outs, no, &err) == KILN_OK, "%s", err.msg);
	ck_assert(fabs(ir_load(outs[0], 0) - run_loss(fwd)) < 1e-12 * (1 + fabs(ir_load(outs[0], 0))));
	for (int k = 0; k < nw; k++)
		compare(slot[k], at[k] < 0 ? NULL : outs[at[k]]);
}

static void gradcheck(kiln_value y)
{
	gradcheck_n(1, &y);
}

/* A node built by hand, for attributes or outputs the DSL does not offer. */
static ir_node *raw(kiln_op op, uint32_t nin, const kiln_value *in, uint32_t nout)
{
	ir_node *n = ir_node_new(g, op, nin, in, nout, KILN_HERE);
	ck_assert_ptr_nonnull(n);
	return n;
}

static void settle(ir_node *n)
{
	ck_assert_msg(ir_infer_node(g, n) == KILN_OK, "%s", kiln_graph_errmsg(g));
}

#define D(...) ((int64_t[]){__VA_ARGS__})

/* A one-output node of the op whose .kir mnemonic is kir. */
static kiln_value op_n(const char *kir, int nin, const kiln_value *in)
{
	ir_node *n = raw(ir_op_from_kir(kir), (uint32_t)nin, in, 1);
	settle(n);
	return n->out[0];
}

static kiln_value op1(const char *kir, kiln_value x)
{
	return op_n(kir, 1, &x);
}

/* ---- elementwise --------------------------------------------------------------- */

START_TEST(smooth_unary_ops_match_finite_differences)
{
	static const char *const ops[] = {"neg", "exp", "sin", "cos", "sigmoid", "tanh", "erf",
	                                  "identity"};
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		teardown(), setup();
		gradcheck(op1(ops[i], uni("x", 2, D(3, 4), -2, 2)));
	}
}
END_TEST

START_TEST(log_sqrt_reciprocal_match_finite_differences)
{
	gradcheck(kiln_log(g, uni("a", 2, D(2, 3), 0.3, 2)));
	teardown(), setup();
	gradcheck(kiln_sqrt(g, uni("a", 2, D(2, 3), 0.3, 2)));
	teardown(), setup();
	gradcheck(kiln_reciprocal(g, away("a", 2, D(2, 3))));
}
END_TEST

START_TEST(kinked_unary_ops_match_away_from_the_kink)
{
	gradcheck(kiln_relu(g, away("x", 2, D(3, 4))));
	teardown(), setup();
	gradcheck(kiln_abs(g, away("x", 2, D(3, 4))));
	teardown(), setup();
	gradcheck(kiln_leaky_relu(g, away("x", 2, D(3, 4)), 0.2));
}
END_TEST

START_TEST(gelu_both_forms_match_finite_differences)
{
	gradcheck(kiln_gelu(g, uni("x", 1, D(10), -3, 3), false));
	teardown(), setup();
	gradcheck(kiln_gelu(g, uni("x", 1, D(10), -3, 3), true));
}
END_TEST

/* The composites' gradients are their formulas' symbolic derivatives. */
START_TEST(composites_match_finite_differences)
{
	gradcheck(kiln_softplus(g, uni("x", 1, D(10), -4, 4)));
	teardown(), setup(); /* both flat parts and the slope; no point near a kink */
	gradcheck(kiln_hard_sigmoid(g, uni("x", 1, D(10), -4, 4)));
	teardown(), setup();
	gradcheck(kiln_hard_swish(g, uni("x", 1, D(10), -4, 4)));
	teardown(), setup();
	gradcheck(kiln_mish(g, uni("x", 1, D(10), -4, 4)));
	teardown(), setup();
	gradcheck(kiln_softsign(g, uni("x", 1, D(10), -4, 4)));
	teardown(), setup();
	gradcheck(kiln_elu(g, away("x", 2, D(3, 4))));
	teardown(), setup();
	gradcheck(kiln_selu(g, away("x", 2, D(3, 4))));
	teardown(), setup();
	gradcheck(kiln_celu(g, away("x", 2, D(3, 4))));
	teardown(), setup(); /* alpha 1: x in +-[0.2, 1.2] has points on both sides */
	gradcheck(kiln_thresholded_relu(g, away("x", 2, D(3, 4))));
}
END_TEST

START_TEST(clip_passes_gradient_only_inside_its_bounds)
{
	gradcheck(kiln_clip(g, away("x", 2, D(4, 5)), -0.5, 0.7));
	/* one-sided: only max */
	teardown(), setup();
	ir_node *n = raw(KILN_OP_CLIP, 1, (kiln_value[]){away("x", 1, D(12))}, 1);
	ir_attr_set_float(g, n, "max", 0.1);
	settle(n);
	gradcheck(n->out[0]);
}
END_TEST

START_TEST(cast_between_floats_carries_the_gradient_back)
{
	kiln_value x = uni("x", 1, D(5), -1, 1);
	gradcheck(kiln_mul(g, kiln_cast(g, x, KILN_F64), x));
	/* f64 -> f32: the gradient comes back as f64 */
	teardown(), setup();
	kiln_value y = uni("y", 1, D(5), -1, 1);
	kiln_value l = kiln_reduce_sum(g, kiln_cast(g, y, KILN_F32), 0, NULL, false);
	kiln_value d;
	ck_assert_int_eq(kiln_grad(g, l, 1, &y, &d), KILN_OK);
	ck_assert_int_eq(kiln_value_dtype(g, d), KILN_F64);
}
END_TEST

START_TEST(binary_ops_with_broadcasting_match_finite_differences)
{
	gradcheck(kiln_add(g, uni("a", 2, D(3, 4), -1, 1), uni("b", 1, D(4), -1, 1)));
	teardown(), setup();
	gradcheck(kiln_sub(g, uni("a", 3, D(2, 1, 4), -1, 1), uni("b", 2, D(3, 1), -1, 1)));
	teardown(), setup();
	gradcheck(kiln_mul(g, uni("a", 2, D(3, 4), -1, 1), uni("b", 2, D(3, 1), -1, 1)));
	teardown(), setup();
	gradcheck(kiln_div(g, uni("a", 2, D(3, 4), -1, 1), away("b", 1, D(4))));
	teardown(), setup();
	gradcheck(kiln_mul(g, uni("a", 0, NULL, -1, 1), uni("b", 2, D(2, 3), -1, 1)));
}
END_TEST

START_TEST(pow_matches_for_base_and_exponent)
{
	gradcheck(kiln_pow(g, uni("a", 2, D(3, 4), 0.2, 2), uni("b", 1, D(4), -2, 2)));
}
END_TEST

START_TEST(max_and_min_route_to_the_selected_input)
{
	kiln_value in[3] = {uni("a", 2, D(3, 4), -1, 1), uni("b", 1, D(4), -1, 1),
	                    uni("c", 2, D(3, 1), -1, 1)};
	gradcheck(op_n("max", 3, in));
	teardown(), setup();
	gradcheck(kiln_min(g, uni("a", 2, D(3, 4), -1, 1), uni("b", 2, D(3, 4), -1, 1)));
}
END_TEST

START_TEST(max_splits_the_gradient_of_a_tie)
{
	kiln_value a = input("a", KILN_F64, 1, D(2));
	last();
	kiln_value b = input("b", KILN_F64, 1, D(2));
	last();
	kiln_value l = kiln_reduce_sum(g, kiln_max(g, a, b), 0, NULL, false);
	kiln_value wrt[2] = {a, b}, d[2];
	ck_assert_int_eq(kiln_grad(g, l, 2, wrt, d), KILN_OK);
	kiln_output(g, "da", d[0]);
	kiln_output(g, "db", d[1]);
	double va[] = {1, 2}, vb[] = {1, 3};
	kiln_tensor *in[2] = {data[0], data[1]}, *out[2];
	for (int i = 0; i < 2; i++)
		ir_store(in[0], i, va[i]), ir_store(in[1], i, vb[i]);
	ck_assert_int_eq(kiln_graph_run(g, in, 2, out, 2, NULL), KILN_OK);
	ck_assert_double_eq(ir_load(out[0], 0), 0.5);
	ck_assert_double_eq(ir_load(out[1], 0), 0.5);
	ck_assert_double_eq(ir_load(out[0], 1), 0);
	ck_assert_double_eq(ir_load(out[1], 1), 1);
	kiln_tensor_free(out[0]);
	kiln_tensor_free(out[1]);
}
END_TEST

START_TEST(where_sends_the_gradient_to_the_chosen_branch)
{
	kiln_value c = input("c", KILN_BOOL, 2, D(3, 4));
	kiln_tensor *t = last();
	for (int i = 0; i < 12; i++)
		ir_store(t, i, urand() < 0.5);
	gradcheck(kiln_where(g, c, uni("a", 2, D(3, 4), -1, 1), uni("b", 1, D(4), -1, 1)));
}
END_TEST

/* ---- reductions ------------------------------------------------------------------ */

START_TEST(sum_and_mean_match_with_keepdims_0_and_1)
{
	for (int keep = 0; keep < 2; keep++) {
		teardown(), setup();
		gradcheck(kiln_reduce_sum(g, uni("x", 3, D(2, 3, 4), -1, 1), 2, D(0, -1), keep));
		teardown(), setup();
		gradcheck(kiln_reduce_mean(g, uni("x", 3, D(2, 3, 4), -1, 1), 1, D(1), keep));
		teardown(), setup();
		gradcheck(kiln_reduce_mean(g, uni("x", 2, D(3, 4), -1, 1), 0, NULL, keep));
	}
}
END_TEST

/* f64 input declared with dims sym (symbolic entries allowed), fed data of
 * the fixed dims, uniform in [lo, hi) */
static kiln_value uni_sym(const char *name, int rank, const int64_t *sym, const int64_t *dims,
                          double lo, double hi)
{
	kiln_value v = kiln_input(g, name, KILN_F64, rank, sym);
	ck_assert_msg(v, "%s", kiln_graph_errmsg(g));
	kiln_tensor *t = data[ndata++] = kiln_tensor_new(KILN_F64, rank, dims);
	ck_assert_ptr_nonnull(t);
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		ir_store(t, i, lo + (hi - lo) * urand());
	return v;
}

/* The count a mean divides by comes from the symbolic dims when the graph
 * runs (it used to be "gradient: mean over symbolic dims"): checked for
 * two batch sizes, mixed with fixed dims, and exactly 1/n for mean(x). */
START_TEST(mean_over_a_symbolic_batch_matches_finite_differences)
{
	for (int64_t n = 1; n <= 5; n += 4) {
		teardown(), setup();
		int64_t N = kiln_sym(g, "N");
		kiln_value x = uni_sym("x", 2, D(N, 3), D(n, 3), -1, 1);
		gradcheck(kiln_reduce_mean(g, kiln_mul(g, x, x), 0, NULL, false));
		teardown(), setup();
		N = kiln_sym(g, "N");
		x = uni_sym("x", 3, D(N, 3, 4), D(n, 3, 4), -1, 1);
		gradcheck(kiln_reduce_mean(g, x, 2, D(0, 2), false));
		teardown(), setup();
		N = kiln_sym(g, "N");
		int64_t M = kiln_sym(g, "M");
		x = uni_sym("x", 3, D(N, 2, M), D(n, 2, 6 - n), -1, 1);
		gradcheck(kiln_reduce_mean(g, kiln_mul(g, x, x), 2, D(2, 0), true));
		/* d mean(x) / dx = 1/(3n) exactly, with n known only at run time */
		teardown(), setup();
		N = kiln_sym(g, "N");
		x = uni_sym("x", 2, D(N, 3), D(n, 3), -1, 1);
		kiln_value y = kiln_reduce_mean(g, x, 0, NULL, false), dx;
		ck_assert_msg(kiln_grad(g, y, 1, &x, &dx) == KILN_OK, "%s", kiln_graph_errmsg(g));
		kiln_output(g, "y", y);
		kiln_output(g, "dx", dx);
		kiln_error err;
		ck_assert_msg(kiln_graph_run(g, data, 1, outs, 2, &err) == KILN_OK, "%s", err.msg);
		ck_assert_int_eq(kiln_tensor_numel(outs[1]), 3 * n);
		for (int64_t i = 0; i < 3 * n; i++)
			ck_assert_double_eq(ir_load(outs[1], i), 1.0 / (double)(3 * n));
	}
}
END_TEST

START_TEST(max_and_min_reductions_route_to_the_extreme)
{
	for (int keep = 0; keep < 2; keep++) {
		teardown(), setup();
		gradcheck(kiln_reduce_max(g, uni("x", 3, D(2, 3, 4), -1, 1), 1, D(1), keep));
		teardown(), setup();
		ir_node *n = raw(KILN_OP_REDUCE_MIN, 1, (kiln_value[]){uni("x", 2, D(3, 4), -1, 1)}, 1);
		ir_attr_set_int(g, n, "keepdims", keep);
		settle(n);
		gradcheck(n->out[0]);
	}
}
END_TEST

/* ---- linear algebra ------------------------------------------------------------------- */

START_TEST(matmul_matches_for_1d_2d_and_batched_operands)
{
	gradcheck(kiln_matmul(g, uni("a", 2, D(3, 4), -1, 1), uni("b", 2, D(4, 2), -1, 1)));
	teardown(), setup();
	gradcheck(kiln_matmul(g, uni("a", 1, D(4), -1, 1), uni("b", 3, D(2, 4, 3), -1, 1)));
	teardown(), setup();
	gradcheck(kiln_matmul(g, uni("a", 3, D(2, 3, 4), -1, 1), uni("b", 1, D(4), -1, 1)));
	teardown(), setup();
	gradcheck(kiln_matmul(g, uni("a", 1, D(4), -1, 1), uni("b", 1, D(4), -1, 1)));
	teardown(), setup();
	gradcheck(kiln_matmul(g, uni("a", 4, D(2, 1, 3, 4), -1, 1), uni("b", 3, D(3, 4, 2), -1, 1)));
}
END_TEST

START_TEST(gemm_matches_for_every_transpose_and_c_broadcast)
{
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++) {
			teardown(), setup();
			kiln_value a = uni("a", 2, ta ? D(4, 3) : D(3, 4), -1, 1);
			kiln_value b = uni("b", 2, tb ? D(2, 4) : D(4, 2), -1, 1);
			kiln_value c = uni("c", 1, D(2), -1, 1);
			gradcheck(kiln_gemm(g, a, b, c, 0.7, 1.3, ta, tb));
		}
	teardown(), setup();
	gradcheck(kiln_gemm(g, uni("a", 2, D(3, 4), -1, 1), uni("b", 2, D(4, 2), -1, 1),
	                    uni("c", 2, D(3, 1), -1, 1), 1, 1, false, false));
}
END_TEST

/* ---- convolution and pooling ------------------------------------------------------- */

static kiln_conv_opts conv2(int64_t s, int64_t p, int64_t d, int64_t grp)
{
	return (kiln_conv_opts){.stride = {s, s}, .pad = {p, p, p, p}, .dilation = {d, d},
	                        .group = grp};
}

START_TEST(conv2d_matches_with_stride_pad_dilation_and_groups)
{
	kiln_conv_opts o = conv2(2, 1, 1, 2);
	gradcheck(kiln_conv(g, uni("x", 4, D(2, 4, 5, 5), -1, 1), uni("w", 4, D(4, 2, 3, 3), -1, 1),
	                    uni("b", 1, D(4), -1, 1), &o));
	teardown(), setup();
	o = conv2(1, 2, 2, 1);
	gradcheck(kiln_conv(g, uni("x", 4, D(1, 2, 6, 5), -1, 1), uni("w", 4, D(3, 2, 2, 3), -1, 1),
	                    0, &o));
	teardown(), setup();
	o = conv2(3, 0, 1, 1); /* stride leaves a remainder: output_padding on the way back */
	gradcheck(kiln_conv(g, uni("x", 4, D(1, 1, 7, 8), -1, 1), uni("w", 4, D(2, 1, 2, 2), -1, 1),
	                    0, &o));
}
END_TEST

START_TEST(conv1d_matches_with_asymmetric_pads)
{
	kiln_conv_opts o = {.stride = {2}, .pad = {1, 2}, .dilation = {2}};
	gradcheck(kiln_conv(g, uni("x", 3, D(2, 3, 9), -1, 1), uni("w", 3, D(2, 3, 3), -1, 1),
	                    uni("b", 1, D(2), -1, 1), &o));
}
END_TEST

START_TEST(conv_with_same_padding_matches)
{
	ir_node *n = raw(KILN_OP_CONV, 2, (kiln_value[]){uni("x", 4, D(1, 2, 5, 6), -1, 1),
	                                                 uni("w", 4, D(2, 2, 3, 2), -1, 1)}, 1);
	ir_attr_set_string(g, n, "auto_pad", "SAME_UPPER");
	ir_attr_set_ints(g, n, "strides", 2, D(2, 2));
	settle(n);
	gradcheck(n->out[0]);
}
END_TEST

START_TEST(conv_transpose_matches_with_stride_pad_and_groups)
{
	kiln_conv_opts o = {.stride = {2, 2}, .pad = {1, 0, 1, 0}, .output_padding = {1, 0},
	                    .group = 2};
	gradcheck(kiln_conv_transpose(g, uni("x", 4, D(2, 4, 3, 3), -1, 1),
	                              uni("w", 4, D(4, 1, 3, 2), -1, 1), uni("b", 1, D(2), -1, 1),
	                              &o));
	teardown(), setup();
	kiln_conv_opts o1 = {.stride = {3}, .dilation = {2}};
	gradcheck(kiln_conv_transpose(g, uni("x", 3, D(1, 2, 4), -1, 1),
	                              uni("w", 3, D(2, 3, 2), -1, 1), 0, &o1));
}
END_TEST

START_TEST(max_pool_routes_to_each_windows_maximum)
{
	kiln_conv_opts o = {.kernel = {3, 3}, .stride = {2, 2}, .pad = {1, 1, 1, 1}};
	gradcheck(kiln_max_pool(g, uni("x", 4, D(2, 2, 5, 5), -1, 1), &o));
	teardown(), setup();
	kiln_conv_opts c = {.kernel = {2, 2}, .stride = {2, 2}, .ceil_mode = true};
	gradcheck(kiln_max_pool(g, uni("x", 4, D(1, 2, 5, 5), -1, 1), &c));
	teardown(), setup();
	kiln_conv_opts d = {.kernel = {2}, .stride = {1}, .dilation = {2}};
	gradcheck(kiln_max_pool(g, uni("x", 3, D(2, 2, 7), -1, 1), &d));
}
END_TEST

START_TEST(max_pool_overlapping_windows_sum_their_gradients)
{
	kiln_value x = input("x", KILN_F64, 3, D(1, 1, 3));
	double v[] = {0, 5, 1};
	kiln_tensor *t = last();
	for (int i = 0; i < 3; i++)
		ir_store(t, i, v[i]);
	kiln_conv_opts o = {.kernel = {2}, .stride = {1}};
	kiln_value l = kiln_reduce_sum(g, kiln_max_pool(g, x, &o), 0, NULL, false);
	kiln_value d;
	ck_assert_int_eq(kiln_grad(g, l, 1, &x, &d), KILN_OK);
	kiln_output(g, "d", d);
	kiln_tensor *out;
	ck_assert_int_eq(kiln_graph_run(g, data, 1, &out, 1, NULL), KILN_OK);
	ck_assert_double_eq(ir_load(out, 0), 0);
	ck_assert_double_eq(ir_load(out, 1), 2);
	ck_assert_double_eq(ir_load(out, 2), 0);
	kiln_tensor_free(out);
}
END_TEST

START_TEST(average_pool_matches_with_and_without_counted_padding)
{
	for (int incl = 0; incl < 2; incl++) {
		teardown(), setup();
		kiln_conv_opts o = {.kernel = {3, 2}, .stride = {2, 1}, .pad = {1, 1, 1, 0},
		                    .count_include_pad = incl};
		gradcheck(kiln_avg_pool(g, uni("x", 4, D(1, 2, 5, 4), -1, 1), &o));
	}
	teardown(), setup();
	kiln_conv_opts c = {.kernel = {2}, .stride = {2}, .ceil_mode = true};
	gradcheck(kiln_avg_pool(g, uni("x", 3, D(2, 1, 5), -1, 1), &c));
	teardown(), setup();
	gradcheck(kiln_global_avg_pool(g, uni("x", 4, D(2, 3, 2, 3), -1, 1)));
}
END_TEST

/* ---- normalisation and softmax ------------------------------------------------------- */

static kiln_value batch_norm(bool train, uint32_t nout, kiln_value *outs)
{
	kiln_value in[5] = {uni("x", 4, D(3, 2, 2, 2), -1, 1), uni("scale", 1, D(2), 0.5, 1.5),
	                    uni("bias", 1, D(2), -1, 1), uni("mean", 1, D(2), -0.5, 0.5),
	                    uni("var", 1, D(2), 0.5, 1.5)};
	ir_node *n = raw(KILN_OP_BATCH_NORM, 5, in, nout);
	ir_attr_set_int(g, n, "training_mode", train);
	ir_attr_set_float(g, n, "momentum", 0.8);
	settle(n);
	for (uint32_t k = 0; k < nout; k++)
		outs[k] = n->out[k];
	return n->out[0];
}

START_TEST(batch_norm_matches_in_inference_mode)
{
	kiln_value y;
	batch_norm(false, 1, &y);
	gradcheck(y);
}
END_TEST

START_TEST(batch_norm_matches_in_training_mode_with_batch_statistics)
{
	kiln_value y[3];
	batch_norm(true, 1, y);
	gradcheck(y[0]);
	teardown(), setup();
	batch_norm(true, 3, y); /* running statistics outputs differentiated too */
	gradcheck_n(3, y);
}
END_TEST

START_TEST(layer_norm_matches_over_one_and_two_axes)
{
	gradcheck(kiln_layer_norm(g, uni("x", 3, D(2, 3, 4), -1, 1), uni("s", 1, D(4), 0.5, 1.5),
	                          uni("b", 1, D(4), -1, 1), -1, 1e-5));
	teardown(), setup();
	gradcheck(kiln_layer_norm(g, uni("x", 3, D(2, 3, 4), -1, 1),
	                          uni("s", 2, D(3, 4), 0.5, 1.5), 0, 1, 1e-3));
}
END_TEST

START_TEST(softmax_and_log_softmax_match_on_any_axis)
{
	gradcheck(kiln_softmax(g, uni("x", 3, D(2, 3, 4), -2, 2), 1));
	teardown(), setup();
	gradcheck(kiln_softmax(g, uni("x", 2, D(3, 4), -2, 2), -1));
	teardown(), setup();
	gradcheck(kiln_log_softmax(g, uni("x", 3, D(2, 3, 4), -2, 2), 1));
	teardown(), setup();
	gradcheck(kiln_log_softmax(g, uni("x", 2, D(3, 4), -2, 2), -1));
}
END_TEST

START_TEST(dropout_scales_kept_elements_with_or_without_the_mask_output)
{
	gradcheck(kiln_dropout(g, uni("x", 2, D(4, 5), -1, 1), 0.3, true, 7));
	teardown(), setup();
	ir_node *n = raw(KILN_OP_DROPOUT, 1, (kiln_value[]){uni("x", 2, D(4, 5), -1, 1)}, 1);
	ir_attr_set_int(g, n, "training_mode", 1);
	ir_attr_set_float(g, n, "ratio", 0.4);
	ir_attr_set_int(g, n, "seed", 3);
	settle(n);
	gradcheck(n->out[0]);
	teardown(), setup();
	n = raw(KILN_OP_DROPOUT, 1, (kiln_value[]){uni("x", 1, D(4), -1, 1)}, 1);
	settle(n); /* inference mode: the identity */
	gradcheck(n->out[0]);
}
END_TEST

/* ---- data movement ----------------------------------------------------------------- */

START_TEST(reshape_flatten_squeeze_unsqueeze_match)
{
	gradcheck(kiln_reshape(g, uni("x", 3, D(2, 3, 4), -1, 1), 2, D(4, -1)));
	teardown(), setup();
	gradcheck(kiln_flatten(g, uni("x", 3, D(2, 3, 4), -1, 1), 1));
	teardown(), setup();
	gradcheck(kiln_squeeze(g, uni("x", 3, D(2, 1, 4), -1, 1), 1, D(1)));
	teardown(), setup();
	gradcheck(kiln_unsqueeze(g, uni("x", 2, D(2, 4), -1, 1), 2, D(0, 2)));
}
END_TEST

START_TEST(transpose_matches_with_and_without_perm)
{
	gradcheck(kiln_transpose(g, uni("x", 3, D(2, 3, 4), -1, 1), 3, D(1, 2, 0)));
	teardown(), setup();
	gradcheck(kiln_transpose(g, uni("x", 3, D(2, 3, 4), -1, 1), 0, NULL));
}
END_TEST

START_TEST(concat_and_split_match_with_unused_parts)
{
	kiln_value xs[3] = {uni("a", 2, D(2, 3), -1, 1), uni("b", 2, D(2, 1), -1, 1),
	                    uni("c", 2, D(2, 2), -1, 1)};
	gradcheck(kiln_concat(g, 3, xs, -1));
	teardown(), setup();
	kiln_value parts[3];
	ck_assert_int_eq(kiln_split(g, uni("x", 2, D(5, 2), -1, 1), 0, 3, D(1, 3, 1), parts),
	                 KILN_OK);
	kiln_value used[2] = {parts[0], parts[2]};
	gradcheck_n(2, used);
}
END_TEST

START_TEST(slice_matches_with_steps_negative_steps_and_clamping)
{
	gradcheck(kiln_slice(g, uni("x", 2, D(4, 6), -1, 1), 2, D(1, -5), D(3, 100), D(0, 1), NULL));
	teardown(), setup();
	gradcheck(kiln_slice(g, uni("x", 2, D(4, 7), -1, 1), 1, D(1), D(7), D(1), D(3)));
	teardown(), setup();
	gradcheck(kiln_slice(g, uni("x", 2, D(4, 7), -1, 1), 2, D(-1, 5), D(-100, 0), D(0, 1),
	                     D(-2, -2)));
}
END_TEST

START_TEST(gather_sums_the_gradient_of_repeated_indices)
{
	gradcheck(kiln_gather(g, uni("x", 2, D(4, 3), -1, 1), ints("i", 2, D(2, 2), D(1, -1, 1, 0)),
	                      0));
	teardown(), setup();
	gradcheck(kiln_gather(g, uni("x", 3, D(2, 4, 3), -1, 1), ints("i", 1, D(3), D(3, 0, 3)), 1));
	teardown(), setup();
	gradcheck(kiln_gather(g, uni("x", 2, D(2, 5), -1, 1), ints("i", 0, NULL, D(2)), 1));
}
END_TEST

START_TEST(expand_pad_and_identity_match)
{
	gradcheck(kiln_expand(g, uni("x", 2, D(3, 1), -1, 1), 3, D(2, 3, 4)));
	teardown(), setup();
	gradcheck(kiln_pad(g, uni("x", 2, D(3, 4), -1, 1), 2, D(1, 0, 2, 1), "constant", 0.5));
	teardown(), setup();
	gradcheck(kiln_pad(g, uni("x", 2, D(3, 4), -1, 1), 2, D(-1, 1, 0, -2), "constant", 0));
	teardown(), setup();
	gradcheck(kiln_identity(g, uni("x", 1, D(3), -1, 1)));
}
END_TEST

START_TEST(pad_in_reflect_mode_has_no_gradient_and_says_so)
{
	kiln_value x = uni("x", 1, D(4), -1, 1), d;
	kiln_value y = kiln_pad(g, x, 1, D(1, 1), "reflect", 0);
	kiln_value l = kiln_reduce_sum(g, y, 0, NULL, false);
	uint32_t nnode = g->nnode;
	ck_assert_int_eq(kiln_grad(g, l, 1, &x, &d), KILN_EUNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "Pad mode 'reflect'"));
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "test_grad.c:"));
	ck_assert_uint_eq(g->nnode, nnode);
	ck_assert_uint_eq(d, KILN_NONE);
}
END_TEST

/* ---- losses ---------------------------------------------------------------------------- */

static kiln_value loss_op(kiln_op op, kiln_value x, kiln_value t, kiln_value w,
                          const char *red, bool ignore, uint32_t nout)
{
	ir_node *n = raw(op, w ? 3 : 2, (kiln_value[]){x, t, w}, nout);
	ir_attr_set_string(g, n, "reduction", red);
	if (ignore)
		ir_attr_set_int(g, n, "ignore_index", 2);
	settle(n);
	return n->out[0];
}

START_TEST(softmax_ce_matches_with_weights_ignore_index_and_reductions)
{
	static const char *const reds[] = {"mean", "sum", "none"};
	for (int r = 0; r < 3; r++)
		for (int w = 0; w < 2; w++) {
			teardown(), setup();
			kiln_value x = uni("x", 3, D(3, 4, 2), -2, 2);
			kiln_value t = ints("t", 2, D(3, 2), D(0, 2, 3, 1, 2, 3));
			kiln_value wt = w ? uni("w", 1, D(4), 0.5, 2) : KILN_NONE;
			gradcheck(loss_op(KILN_OP_SOFTMAX_CE, x, t, wt, reds[r], w, 1));
		}
}
END_TEST

START_TEST(softmax_ce_log_prob_output_has_a_gradient_too)
{
	kiln_value x = uni("x", 2, D(3, 4), -2, 2);
	ir_node *n = raw(KILN_OP_SOFTMAX_CE, 2, (kiln_value[]){x, ints("t", 1, D(3), D(0, 3, 1))}, 2);
	settle(n);
	kiln_value both[2] = {n->out[0], n->out[1]};
	gradcheck_n(2, both);
}
END_TEST

START_TEST(nll_loss_matches_with_weights_ignore_index_and_reductions)
{
	static const char *const reds[] = {"mean", "sum", "none"};
	for (int r = 0; r < 3; r++) {
		teardown(), setup();
		kiln_value x = uni("x", 2, D(5, 3), -2, 0);
		kiln_value t = ints("t", 1, D(5), D(0, 2, 1, 2, 1));
		gradcheck(loss_op(KILN_OP_NLL_LOSS, x, t, uni("w", 1, D(3), 0.5, 2), reds[r], true, 1));
	}
}
END_TEST

START_TEST(dsl_losses_match_finite_differences)
{
	kiln_value x = uni("x", 2, D(4, 3), -2, 2);
	kiln_value t = ints("t", 1, D(4), D(0, 2, -100, 1));
	gradcheck(kiln_cross_entropy(g, x, t, uni("w", 1, D(3), 0.5, 2), "mean", -100, 0.2));
	teardown(), setup();
	kiln_value q = uni("p", 2, D(3, 4), -1, 1);
	gradcheck(kiln_l1_loss(g, q, randn_like(q), "mean"));
	teardown(), setup();
	kiln_value p = uni("p", 2, D(3, 4), -2, 2);
	gradcheck(kiln_smooth_l1_loss(g, p, kiln_mul(g, p, kiln_scalar(g, KILN_F64, 0.3)), "sum",
	                              0.5));
	teardown(), setup();
	gradcheck(kiln_bce_with_logits(g, uni("x", 2, D(3, 4), -3, 3), uni("y", 2, D(3, 4), 0, 1),
	                               uni("w", 1, D(4), 0.5, 1.5), uni("pw", 1, D(4), 0.5, 2),
	                               "mean"));
}
END_TEST

/* Every mean-reduced DSL loss over a symbolic batch, as `kiln train` traces
 * them, for two batch sizes. */
START_TEST(mean_losses_over_a_symbolic_batch_match_finite_differences)
{
	for (int64_t n = 2; n <= 5; n += 3) {
		for (int k = 0; k < 4; k++) {
			teardown(), setup();
			int64_t N = kiln_sym(g, "N");
			kiln_value p = uni_sym("p", 2, D(N, 3), D(n, 3), -2, 2);
			kiln_value t = uni_sym("t", 2, D(N, 3), D(n, 3), k == 3 ? 0 : -2, k == 3 ? 1 : 2);
			gradcheck(k == 0   ? kiln_mse_loss(g, p, t, "mean")
			          : k == 1 ? kiln_l1_loss(g, p, t, "mean")
			          : k == 2 ? kiln_smooth_l1_loss(g, p, t, "mean", 1.0)
			                   : kiln_bce_with_logits(g, p, t, KILN_NONE, KILN_NONE, "mean"));
		}
	}
}
END_TEST

/* ---- the driver ------------------------------------------------------------------------ */

/* ---- fused recurrent ops ------------------------------------------------------------ */

/* A fused node by hand: op over in[0..nin), attributes from "name=value"
 * pairs set by the caller; nout outputs. */
static ir_node *rnn_node(kiln_op op, uint32_t nin, const kiln_value *in, int64_t hidden)
{
	ir_node *n = raw(op, nin, in, op == KILN_OP_LSTM ? 3 : 2);
	ck_assert_int_eq(ir_attr_set_int(g, n, "hidden_size", hidden), KILN_OK);
	return n;
}

/* Unrolled before autodiff (passes/rnn_unroll.c): a bidirectional LSTM
 * with B, sequence_lens, both initial states and peepholes, a batch-first
 * GRU (reset before the product) with initial_h, a reverse RNN with
 * clip; every output in the loss, every float input checked. */
START_TEST(fused_lstm_gru_rnn_match_finite_differences)
{
	int64_t T = 3, N = 2, I = 2, H = 2;
	kiln_value x = uni("x", 3, D(T, N, I), -1, 1);
	kiln_value in[8] = {x, uni("w", 3, D(2, 4 * H, I), -0.8, 0.8),
	                    uni("r", 3, D(2, 4 * H, H), -0.8, 0.8), uni("b", 2, D(2, 8 * H), -0.5, 0.5),
	                    ints("l", 1, D(N), D(3, 2)), uni("h0", 3, D(2, N, H), -1, 1),
	                    uni("c0", 3, D(2, N, H), -1, 1), uni("p", 2, D(2, 3 * H), -0.5, 0.5)};
	ir_node *lstm = rnn_node(KILN_OP_LSTM, 8, in, H);
	ck_assert_int_eq(ir_attr_set_string(g, lstm, "direction", "bidirectional"), KILN_OK);
	settle(lstm);
	kiln_value xg = uni("xg", 3, D(N, T, I), -1, 1);
	kiln_value gin[4] = {xg, uni("wg", 3, D(1, 3 * H, I), -0.8, 0.8),
	                     uni("rg", 3, D(1, 3 * H, H), -0.8, 0.8), uni("hg", 3, D(N, 1, H), -1, 1)};
	ir_node *gru = rnn_node(KILN_OP_GRU, 4, gin, H);
	ck_assert_int_eq(ir_attr_set_ints(g, gru, "inputs", 1, D(5)), KILN_OK);
	ck_assert_int_eq(ir_attr_set_int(g, gru, "layout", 1), KILN_OK);
	settle(gru);
	kiln_value rin[3] = {x, uni("wr", 3, D(1, H, I), -0.8, 0.8), uni("rr", 3, D(1, H, H), -0.8, 0.8)};
	ir_node *rnn = rnn_node(KILN_OP_RNN, 3, rin, H);
	ck_assert_int_eq(ir_attr_set_string(g, rnn, "direction", "reverse"), KILN_OK);
	ck_assert_int_eq(ir_attr_set_float(g, rnn, "clip", 0.9), KILN_OK);
	settle(rnn);
	kiln_value ys[7] = {lstm->out[0], lstm->out[1], lstm->out[2], gru->out[0], gru->out[1],
	                    rnn->out[0], rnn->out[1]};
	gradcheck_n(7, ys);
}
END_TEST

/* A symbolic sequence length cannot be unrolled: refused, naming it. */
START_TEST(fused_lstm_with_a_symbolic_length_refuses_a_gradient)
{
	int64_t T = kiln_sym(g, "T");
	kiln_value in[3] = {kiln_input(g, "x", KILN_F32, 3, D(T, 1, 2)),
	                    kiln_input(g, "w", KILN_F32, 3, D(1, 8, 2)),
	                    kiln_input(g, "r", KILN_F32, 3, D(1, 8, 2))};
	ir_node *n = rnn_node(KILN_OP_LSTM, 3, in, 2);
	n->name = ir_intern(g, "enc");
	settle(n);
	kiln_value l = kiln_reduce_sum(g, n->out[1], 0, NULL, false), d;
	ck_assert_int_eq(kiln_grad(g, l, 1, &in[1], &d), KILN_EUNSUPPORTED);
	ck_assert_msg(strstr(kiln_graph_errmsg(g), "LSTM 'enc': the sequence length is the symbol "
	                     "'T'") && strstr(kiln_graph_errmsg(g), "fixed sequence length"),
	              "%s", kiln_graph_errmsg(g));
}
END_TEST

START_TEST(every_differentiable_op_has_a_rule)
{
	char missing[1024] = "";
	for (int op = 0; op < KILN_OP_COUNT; op++)
		if (!(ir_op(op)->flags & IR_NODIFF) && !pass_grad_rule(op))
			snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s",
			         ir_op(op)->onnx);
	ck_assert_msg(!missing[0], "differentiable ops without a gradient rule:%s", missing);
}
END_TEST

START_TEST(fan_out_sums_the_gradients_of_every_use)
{
	kiln_value x = uni("x", 1, D(3), -1, 1);
	kiln_value y = kiln_add(g, kiln_mul(g, x, x), kiln_sin(g, x)); /* x used three times */
	kiln_value l = kiln_reduce_sum(g, y, 0, NULL, false), d;
	ck_assert_int_eq(kiln_grad(g, l, 1, &x, &d), KILN_OK);
	kiln_output(g, "d", d);
	kiln_tensor *out;
	ck_assert_int_eq(kiln_graph_run(g, data, 1, &out, 1, NULL), KILN_OK);
	for (int i = 0; i < 3; i++) {
		double v = ir_load(data[0], i);
		ck_assert_double_eq_tol(ir_load(out, i), 2 * v + cos(v), 1e-15);
	}
	kiln_tensor_free(out);
}
END_TEST

/* Counts live nodes reading value v. */
static int readers(kiln_value v)
{
	int cnt = 0;
	for (uint32_t i = 0; i < g->nnode; i++)
		for (uint32_t k = 0; k < g->node[i]->nin && !g->node[i]->dead; k++)
			cnt += g->node[i]->in[k] == v;
	return cnt;
}

START_TEST(values_off_the_loss_path_get_no_gradient_nodes)
{
	kiln_value x = uni("x", 2, D(2, 3), -1, 1);
	kiln_value w = kiln_param(g, "w", NULL), unused = kiln_param(g, "u", NULL);
	kiln_value xf = kiln_cast(g, x, KILN_F32);
	kiln_value side = kiln_exp(g, kiln_mul(g, xf, unused)); /* not on the loss path */
	kiln_output(g, "side", side);
	kiln_value l = kiln_reduce_sum(g, kiln_mul(g, xf, w), 0, NULL, false);
	uint32_t nnode = g->nnode;
	kiln_value wrt[2] = {w, unused}, d[2];
	ck_assert_msg(kiln_grad(g, l, 2, wrt, d) == KILN_OK, "%s", kiln_graph_errmsg(g));
	ck_assert_uint_ne(d[0], KILN_NONE);
	ck_assert_uint_eq(d[1], KILN_NONE);
	ck_assert_int_eq(readers(unused), 1); /* only the forward Mul */
	ck_assert_int_eq(readers(side), 0);   /* a graph output, read by nothing */
	for (uint32_t i = nnode; i < g->nnode; i++) /* x is not wrt: no dx Cast back */
		ck_assert(g->node[i]->dead || g->node[i]->op != KILN_OP_CAST ||
		          g->val[g->node[i]->out[0]]->type.dtype != KILN_F64);
	kiln_error err;
	ck_assert_int_eq(kiln_graph_verify(g, &err), KILN_OK);
}
END_TEST

START_TEST(broadcast_gradients_sum_back_to_the_operand_shape)
{
	kiln_value x = uni("x", 3, D(2, 3, 4), -1, 1), b = uni("b", 2, D(3, 1), -1, 1), d[2];
	kiln_value l = kiln_reduce_sum(g, kiln_add(g, x, b), 0, NULL, false);
	ck_assert_int_eq(kiln_grad(g, l, 2, (kiln_value[]){x, b}, d), KILN_OK);
	char buf[64];
	ck_assert_str_eq(kiln_value_type_str(g, d[1], buf, sizeof buf), "f64[3,1]");
	kiln_output(g, "dx", d[0]);
	kiln_output(g, "db", d[1]);
	kiln_tensor *out[2];
	ck_assert_int_eq(kiln_graph_run(g, data, 2, out, 2, NULL), KILN_OK);
	ck_assert_double_eq(ir_load(out[1], 2), 8); /* 2 x 4 broadcast copies */
	kiln_tensor_free(out[0]);
	kiln_tensor_free(out[1]);
}
END_TEST

START_TEST(symbolic_batch_dims_differentiate)
{
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, D(N, 4));
	kiln_value y = kiln_linear(g, "fc", kiln_slice(g, x, 1, D(1), D(4), D(1), NULL), 2, true);
	kiln_value t = kiln_input(g, "t", KILN_I64, 1, D(N));
	kiln_value l = kiln_cross_entropy(g, kiln_relu(g, y), t, KILN_NONE, "mean", -100, 0.1);
	kiln_value p[4], d[4];
	int cnt;
	ck_assert_msg(kiln_grad_params(g, l, 4, p, d, &cnt) == KILN_OK, "%s", kiln_graph_errmsg(g));
	ck_assert_int_eq(cnt, 2);
	char buf[64];
	ck_assert_str_eq(kiln_value_name(g, d[0]), "fc.weight.grad");
	ck_assert_str_eq(kiln_value_type_str(g, d[0], buf, sizeof buf), "f32[2,3]");
	ck_assert_str_eq(kiln_value_name(g, d[1]), "fc.bias.grad");
	kiln_value dx;
	ck_assert_msg(kiln_grad(g, l, 1, &x, &dx) == KILN_OK, "%s", kiln_graph_errmsg(g));
	ck_assert_str_eq(kiln_value_type_str(g, dx, buf, sizeof buf), "f32[N,4]");
	kiln_output(g, "loss", l);
	kiln_output(g, "dx", dx);
	kiln_error err;
	ck_assert_msg(kiln_graph_verify(g, &err) == KILN_OK, "%s", err.msg);
}
END_TEST

START_TEST(grad_params_refuses_a_short_array_and_says_how_many)
{
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, D(2, 3));
	kiln_value l = kiln_reduce_sum(g, kiln_linear(g, "fc", x, 2, true), 0, NULL, false);
	kiln_value p[1], d[1];
	int cnt;
	ck_assert_int_eq(kiln_grad_params(g, l, 1, p, d, &cnt), KILN_EINVAL);
	ck_assert_int_eq(cnt, 2);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "has 2 trainable parameters, room for 1"));
}
END_TEST

START_TEST(grad_rejects_a_loss_that_is_not_a_scalar)
{
	kiln_value x = uni("x", 2, D(2, 3), -1, 1), d;
	uint32_t nnode = g->nnode;
	ck_assert_int_eq(kiln_grad(g, kiln_exp(g, x), 1, &x, &d), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "must be a float scalar, got f64[2,3]"));
	ck_assert_uint_eq(g->nnode, nnode + 1); /* just the Exp */
}
END_TEST

START_TEST(grad_rejects_integer_wrt_values)
{
	kiln_value t = ints("t", 1, D(2), D(0, 1)), d;
	kiln_value l = kiln_reduce_sum(g, kiln_cast(g, t, KILN_F32), 0, NULL, false);
	ck_assert_int_eq(kiln_grad(g, l, 1, &t, &d), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_graph_errmsg(g), "wrt[0] 't' is i64[2], not a float"));
}
END_TEST

START_TEST(gradient_graph_round_trips_through_kir)
{
	kiln_value x = uni("x", 2, D(2, 3), -1, 1), w = uni("w", 2, D(3, 2), -1, 1), d;
	kiln_value l = kiln_reduce_mean(g, kiln_tanh(g, kiln_matmul(g, x, w)), 0, NULL, false);
	ck_assert_int_eq(kiln_grad(g, l, 1, &w, &d), KILN_OK);
	kiln_output(g, "dw", d);
	ck_assert_int_eq(kiln_graph_optimize(g, "dce", NULL), KILN_OK);
	char *text = kiln_graph_to_kir(g);
	kiln_graph *back;
	ck_assert_int_eq(kiln_graph_from_kir(text, "grad.kir", &back, NULL), KILN_OK);
	char *again = kiln_graph_to_kir(back);
	ck_assert_str_eq(text, again);
	free(text), free(again);
	kiln_graph_free(back);
}
END_TEST

static Suite *grad_suite(void)
{
	Suite *s = suite_create("grad");
	struct {
		const char *name;
		const TTest *tests[16];
	} cases[] = {
		{"elementwise", {smooth_unary_ops_match_finite_differences,
		                 log_sqrt_reciprocal_match_finite_differences,
		                 kinked_unary_ops_match_away_from_the_kink,
		                 gelu_both_forms_match_finite_differences,
		                 composites_match_finite_differences,
		                 clip_passes_gradient_only_inside_its_bounds,
		                 cast_between_floats_carries_the_gradient_back,
		                 binary_ops_with_broadcasting_match_finite_differences,
		                 pow_matches_for_base_and_exponent,
		                 max_and_min_route_to_the_selected_input,
		                 max_splits_the_gradient_of_a_tie,
		                 where_sends_the_gradient_to_the_chosen_branch}},
		{"reductions", {sum_and_mean_match_with_keepdims_0_and_1,
		                max_and_min_reductions_route_to_the_extreme}},
		{"linalg", {matmul_matches_for_1d_2d_and_batched_operands,
		            gemm_matches_for_every_transpose_and_c_broadcast}},
		{"conv", {conv2d_matches_with_stride_pad_dilation_and_groups,
		          conv1d_matches_with_asymmetric_pads, conv_with_same_padding_matches,
		          conv_transpose_matches_with_stride_pad_and_groups}},
		{"pool", {max_pool_routes_to_each_windows_maximum,
		          max_pool_overlapping_windows_sum_their_gradients,
		          average_pool_matches_with_and_without_counted_padding}},
		{"norm", {batch_norm_matches_in_inference_mode,
		          batch_norm_matches_in_training_mode_with_batch_statistics,
		          layer_norm_matches_over_one_and_two_axes,
		          softmax_and_log_softmax_match_on_any_axis,
		          dropout_scales_kept_elements_with_or_without_the_mask_output}},
		{"movement", {reshape_flatten_squeeze_unsqueeze_match,
		              transpose_matches_with_and_without_perm,
		              concat_and_split_match_with_unused_parts,
		              slice_matches_with_steps_negative_steps_and_clamping,
		              gather_sums_the_gradient_of_repeated_indices, expand_pad_and_identity_match,
		              pad_in_reflect_mode_has_no_gradient_and_says_so}},
		{"losses", {softmax_ce_matches_with_weights_ignore_index_and_reductions,
		            softmax_ce_log_prob_output_has_a_gradient_too,
		            nll_loss_matches_with_weights_ignore_index_and_reductions,
		            dsl_losses_match_finite_differences}},
		{"driver", {every_differentiable_op_has_a_rule, fan_out_sums_the_gradients_of_every_use,
		            values_off_the_loss_path_get_no_gradient_nodes,
		            broadcast_gradients_sum_back_to_the_operand_shape,
		            symbolic_batch_dims_differentiate,
		            mean_over_a_symbolic_batch_matches_finite_differences,
		            mean_losses_over_a_symbolic_batch_match_finite_differences,
		            grad_params_refuses_a_short_array_and_says_how_many,
		            grad_rejects_a_loss_that_is_not_a_scalar, grad_rejects_integer_wrt_values,
		            gradient_graph_round_trips_through_kir}},
		{"recurrent", {fused_lstm_gru_rnn_match_finite_differences,
		               fused_lstm_with_a_symbolic_length_refuses_a_gradient}},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_add_checked_fixture(tc, setup, teardown);
		tcase_set_timeout(tc, 120);
		for (int k = 0; k < 16 && cases[i].tests[k]; k++)
			tcase_add_test(tc, cases[i].tests[k]);
		suite_add_tcase(s, tc);
	}
	return s;
}

KILN_CHECK_MAIN(grad_suite)
