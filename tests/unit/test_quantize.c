/* test_quantize.c: kiln_quantize, post-training quantization by
 * calibration (driver/quantize.c, passes/quantize.c), through the public
 * API on graphs traced with the DSL: the QDQ graph it writes (which tensors,
 * their scales and zero points, the s8 weights and i32 biases), the
 * calibration methods, the report, the compiled int8 library against f32
 * and against the QDQ graph in the interpreter, and its errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ir/ir.h"

#include "check_main.h"

static uint64_t rng = 88172645463325252ull;

static double uniform(void) /* [0, 1) */
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

static kiln_tensor *random_tensor(int rank, const int64_t *shape, double lo, double hi)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, rank, shape);
	ck_assert_ptr_nonnull(t);
	float *v = t->data;
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++)
		v[i] = (float)(lo + (hi - lo) * uniform());
	return t;
}

/* x[N,3,8,8] -> conv1 (BN, Relu) -> conv2 + residual -> Relu -> MaxPool
 * -> Flatten -> fc: every kind of layer kiln_quantize handles. */
static kiln_graph *small_cnn(void)
{
	kiln_graph *g = kiln_graph_new("qnet");
	kiln_graph_seed(g, 3);
	const int64_t dims[] = {kiln_sym(g, "N"), 3, 8, 8};
	const kiln_conv_opts k3 = {.kernel = {3, 3}, .pad = {1, 1}};
	const kiln_conv_opts pool = {.kernel = {2, 2}, .stride = {2, 2}};
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, dims);
	kiln_value h = kiln_relu(g, kiln_batchnorm(g, "bn1", kiln_conv2d(g, "conv1", x, 8, &k3, false),
	                                           1e-5, 0.1));
	kiln_value r = kiln_conv2d(g, "conv2", h, 8, &k3, true);
	h = kiln_max_pool(g, kiln_relu(g, kiln_add(g, r, h)), &pool);
	kiln_output(g, "logits", kiln_linear(g, "fc", kiln_flatten(g, h, 1), 10, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

static int count_op(const kiln_graph *g, kiln_op op)
{
	int n = 0;
	for (uint32_t i = 0; i < g->nnode; i++)
		n += !g->node[i]->dead && g->node[i]->op == op;
	return n;
}

static const kiln_tensor *const_of(const kiln_graph *g, uint32_t v)
{
	const ir_value *x = g->val[v];
	ck_assert_msg(x->kind == IR_V_NODE && x->def->op == KILN_OP_CONSTANT, "value %u", v);
	return ir_attr_get(x->def, "value")->u.t;
}

/* The QuantizeLinear reading graph value v. */
static const ir_node *q_of(const kiln_graph *g, uint32_t v)
{
	for (uint32_t i = 0; i < g->nnode; i++)
		if (!g->node[i]->dead && g->node[i]->op == KILN_OP_QUANTIZE_LINEAR && g->node[i]->in[0] == v)
			return g->node[i];
	ck_abort_msg("no QuantizeLinear reads value %u", v);
	return NULL;
}

static kiln_status quantize(const kiln_graph *g, kiln_tensor *calib, const kiln_quant_opts *o,
                            kiln_graph **q, kiln_quant_report **r, kiln_error *e)
{
	return kiln_quantize(g, &calib, 1, o, q, r, e);
}

static double cosine(const kiln_tensor *a, const kiln_tensor *b)
{
	const float *x = a->data, *y = b->data;
	double d = 0, xx = 0, yy = 0;
	ck_assert_int_eq(kiln_tensor_numel(a), kiln_tensor_numel(b));
	for (int64_t i = 0; i < kiln_tensor_numel(a); i++)
		d += (double)x[i] * y[i], xx += (double)x[i] * x[i], yy += (double)y[i] * y[i];
	return d / sqrt(xx * yy);
}

static kiln_model *compile_load(const kiln_graph *g, const char *path)
{
	kiln_error e = {0};
	kiln_model *m = NULL;
	ck_assert_msg(kiln_compile(g, path, NULL, &e) == KILN_OK, "%s", e.msg);
	ck_assert_msg(kiln_load(path, &m, &e) == KILN_OK, "%s", e.msg);
	return m;
}

static kiln_tensor *run1(kiln_model *m, kiln_tensor *x)
{
	kiln_tensor *y = NULL;
	kiln_error e = {0};
	ck_assert_msg(kiln_model_run(m, &x, 1, &y, 1, &e) == KILN_OK, "%s", e.msg);
	return y;
}

/* The CNN quantizes: its four layers before fc leave as u8, the residual
 * block's Relu is absorbed, the report holds each layer in order with
 * errors that are small but not zero; compiled, the int8 library runs on
 * QLinearConv kernels (no Relu left), stays within a few steps of the QDQ
 * graph in the interpreter and close to f32 on inputs it never saw. */
START_TEST(a_cnn_quantizes_compiles_and_stays_close_to_f32)
{
	kiln_graph *g = small_cnn(), *q = NULL;
	kiln_tensor *calib = random_tensor(4, (int64_t[]){40, 3, 8, 8}, -1, 1);
	kiln_quant_report *r = NULL;
	kiln_error e = {0};
	ck_assert_msg(quantize(g, calib, NULL, &q, &r, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(r->samples, 40);
	static const char *const ops[] = {"Conv", "Conv", "Add", "MaxPool", "Gemm"};
	ck_assert_int_eq(r->nlayers, 5);
	for (int i = 0; i < 5; i++) {
		const kiln_quant_layer *l = &r->layers[i];
		ck_assert_str_eq(l->op, ops[i]);
		ck_assert_int_eq(l->quantized, i < 4);
		ck_assert_msg(l->rel_error > 1e-4 && l->rel_error < 0.05, "layer %d: %g", i, l->rel_error);
		if (l->quantized) {
			/* after a Relu: [0, hi], zero point 0; conv2 (the Add's
			 * input) has both signs; nothing saturates */
			if (i == 1)
				ck_assert_msg(l->lo < 0 && l->hi > 0 && l->zero_point > 0 &&
				              l->zero_point < 255, "conv2: [%g, %g] zp %d", l->lo, l->hi,
				              l->zero_point);
			else
				ck_assert_msg(l->lo == 0 && l->hi > 0 && l->zero_point == 0, "layer %d", i);
			ck_assert_float_eq_tol(l->scale, (l->hi - l->lo) / 255, 1e-6 * (l->hi - l->lo));
			ck_assert_msg(l->saturation == 0 && l->max_error >= 0.5 && l->max_error < 8,
			              "layer %d: saturation %g, max error %g steps", i, l->saturation,
			              l->max_error);
		}
	}
	ck_assert_int_eq(r->noutputs, 1);
	ck_assert_str_eq(r->outputs[0].name, "logits");
	ck_assert_msg(r->outputs[0].cosine > 0.999 && r->outputs[0].cosine < 1, "%g",
	              r->outputs[0].cosine);
	ck_assert_msg(r->outputs[0].top1 >= 0.9, "%g", r->outputs[0].top1);
	/* the QDQ graph: x, conv1's Relu, conv2, the Add's Relu and the pool
	 * (read through its Flatten) quantized; three weights s8 and three
	 * biases i32 (conv1's from its folded BN); no f32 weight left */
	ck_assert_int_eq(count_op(q, KILN_OP_QUANTIZE_LINEAR), 5);
	ck_assert_int_eq(count_op(q, KILN_OP_DEQUANTIZE_LINEAR), 5 + 3 + 3);
	ck_assert_int_eq(kiln_graph_num_params(q), 0);

	char dir[] = "/tmp/kiln_quantize_XXXXXX", pf[64], pq[64];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(pf, sizeof pf, "%s/f.so", dir), snprintf(pq, sizeof pq, "%s/q.so", dir);
	kiln_model *mf = compile_load(g, pf), *mq = compile_load(q, pq);
	/* both convs integer with conv1's Relu gone; the Add's Relu only in
	 * the Add's elementwise kernel; the pool on u8 */
	int qconv = 0, relu = 0, pool = 0;
	for (int k = 0; k < kiln_model_num_kernels(mq); k++) {
		const char *name = kiln_model_kernel(mq, k, NULL);
		qconv += strstr(name, "qlinear_conv") != NULL;
		relu += strstr(name, "relu") != NULL;
		ck_assert_msg(!strstr(name, "relu") || strstr(name, "add_relu"), "%s", name);
		pool += strstr(name, "max_pool") != NULL;
	}
	ck_assert_int_eq(qconv, 2);
	ck_assert_int_eq(relu, 1);
	ck_assert_int_eq(pool, 1);
	kiln_tensor *x = random_tensor(4, (int64_t[]){16, 3, 8, 8}, -1, 1);
	kiln_tensor *yf = run1(mf, x), *yq = run1(mq, x), *yi = NULL;
	ck_assert_msg(kiln_graph_run(q, &x, 1, &yi, 1, &e) == KILN_OK, "%s", e.msg);
	double c = cosine(yf, yq);
	ck_assert_msg(c > 0.998 && c < 1, "int8 vs f32 cosine %g", c);
	ck_assert_msg(cosine(yi, yq) > 0.9999, "compiled vs the QDQ graph: cosine %g", cosine(yi, yq));
	kiln_tensor_free(x), kiln_tensor_free(yf), kiln_tensor_free(yq), kiln_tensor_free(yi);
	kiln_model_free(mf), kiln_model_free(mq);
	unlink(pf), unlink(pq);
	snprintf(pf, sizeof pf, "%s/f.h", dir), snprintf(pq, sizeof pq, "%s/q.h", dir);
	unlink(pf), unlink(pq), rmdir(dir);
	kiln_quant_report_free(r), kiln_tensor_free(calib);
	kiln_graph_free(g), kiln_graph_free(q);
}
END_TEST

/* x[N,4] (or [2,4]: fixed_batch) -> Gemm (transB) -> y. */
static kiln_graph *linear(int64_t in, bool fixed_batch)
{
	kiln_graph *g = kiln_graph_new("lin");
	kiln_graph_seed(g, 5);
	const int64_t dims[] = {fixed_batch ? 2 : kiln_sym(g, "N"), in};
	kiln_output(g, "y", kiln_linear(g, "fc", kiln_input(g, "x", KILN_F32, 2, dims), 3, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

static const ir_node *only_node(const kiln_graph *g, kiln_op op)
{
	for (uint32_t i = 0; i < g->nnode; i++)
		if (!g->node[i]->dead && g->node[i]->op == op)
			return g->node[i];
	ck_abort_msg("no %s", ir_op(op)->onnx);
	return NULL;
}

/* The input x over [-1, 3]: u8 scale 4/255 and zero point round(63.75) =
 * 64; weights s8 with scale max|w[c]|/127 per output channel (one for the
 * tensor with per_tensor_weights) and values round(w / scale); the bias
 * i32 in units of x_scale * w_scale[c]. */
START_TEST(scales_zero_points_weights_and_biases)
{
	for (int per_tensor = 0; per_tensor < 2; per_tensor++) {
		kiln_graph *g = linear(4, false), *q = NULL;
		kiln_tensor *calib = random_tensor(2, (int64_t[]){6, 4}, -0.9, 2.9);
		((float *)calib->data)[5] = -1, ((float *)calib->data)[17] = 3;
		kiln_error e = {0};
		kiln_quant_opts o = {.per_tensor_weights = per_tensor};
		ck_assert_msg(quantize(g, calib, &o, &q, NULL, &e) == KILN_OK, "%s", e.msg);
		const ir_node *qx = q_of(q, q->input[0]);
		float xs = (float)ir_load(const_of(q, qx->in[1]), 0);
		ck_assert_float_eq(xs, (float)(4.0 / 255));
		ck_assert_int_eq((int)ir_load(const_of(q, qx->in[2]), 0), 64);
		ck_assert_int_eq(const_of(q, qx->in[2])->dtype, KILN_U8);

		const ir_node *gm = only_node(q, KILN_OP_GEMM);
		const ir_node *wd = q->val[gm->in[1]]->def, *bd = q->val[gm->in[2]]->def;
		ck_assert_int_eq(wd->op, KILN_OP_DEQUANTIZE_LINEAR);
		ck_assert_int_eq(bd->op, KILN_OP_DEQUANTIZE_LINEAR);
		const kiln_tensor *wq = const_of(q, wd->in[0]), *ws = const_of(q, wd->in[1]);
		const kiln_tensor *bq = const_of(q, bd->in[0]), *bs = const_of(q, bd->in[1]);
		const kiln_tensor *w = kiln_param_data(g, kiln_graph_find_param(g, "fc.weight"));
		const kiln_tensor *b = kiln_param_data(g, kiln_graph_find_param(g, "fc.bias"));
		ck_assert_int_eq(wq->dtype, KILN_I8);
		ck_assert_int_eq(bq->dtype, KILN_I32);
		ck_assert_int_eq(ws->rank, per_tensor ? 0 : 1);
		/* the inference passes may have stored the weight [in, out] */
		bool rows = wq->shape[0] == 3;
		if (!per_tensor)
			ck_assert_int_eq(ir_attr_int(wd, "axis", 1), rows ? 0 : 1);
		double amax[3] = {0}, all = 0;
		for (int c = 0; c < 3; c++)
			for (int k = 0; k < 4; k++)
				amax[c] = fmax(amax[c], fabs(ir_load(w, c * 4 + k))), all = fmax(all, amax[c]);
		for (int c = 0; c < 3; c++) {
			float s = (float)((per_tensor ? all : amax[c]) / 127);
			ck_assert_float_eq((float)ir_load(ws, per_tensor ? 0 : c), s);
			for (int k = 0; k < 4; k++)
				ck_assert_int_eq((int)ir_load(wq, rows ? c * 4 + k : k * 3 + c),
				                 (int)nearbyint(ir_load(w, c * 4 + k) / s));
			float unit = xs * s;
			ck_assert_float_eq((float)ir_load(bs, c), unit);
			ck_assert_int_eq((int)ir_load(bq, c), (int)nearbyint(ir_load(b, c) / unit));
		}
		kiln_tensor_free(calib), kiln_graph_free(g), kiln_graph_free(q);
	}
}
END_TEST

/* The input's range under each method, 2002 values in [0, 1) and one
 * outlier of 100: min-max keeps the outlier; the percentile (99.9: two
 * values clipped each side, to the edge of a bin 100/8192 wide) and the
 * entropy threshold cut it off. */
START_TEST(percentile_and_entropy_clip_an_outlier)
{
	static const kiln_calib_method m[] = {KILN_CALIB_MINMAX, KILN_CALIB_PERCENTILE,
	                                      KILN_CALIB_ENTROPY};
	static const double lo[] = {99.9, 0.99, 1}, hi[] = {100.1, 1.02, 20};
	for (int k = 0; k < 3; k++) {
		kiln_graph *g = linear(2, false), *q = NULL;
		kiln_tensor *calib = random_tensor(2, (int64_t[]){1001, 2}, 0, 1);
		((float *)calib->data)[777] = 100;
		kiln_error e = {0};
		kiln_quant_opts o = {.method = m[k], .percentile = 99.9};
		ck_assert_msg(quantize(g, calib, &o, &q, NULL, &e) == KILN_OK, "%s", e.msg);
		const ir_node *qx = q_of(q, q->input[0]);
		double top = 255 * ir_load(const_of(q, qx->in[1]), 0);
		ck_assert_msg(top > lo[k] && top < hi[k], "method %d: range [0, %g]", k, top);
		ck_assert_int_eq((int)ir_load(const_of(q, qx->in[2]), 0), 0);
		kiln_tensor_free(calib), kiln_graph_free(g), kiln_graph_free(q);
	}
}
END_TEST

/* keep_float by op type leaves fc in f32 (its weight not dequantized, not
 * in the report); the convs still quantize. */
START_TEST(keep_float_leaves_a_layer_in_f32)
{
	kiln_graph *g = small_cnn(), *q = NULL;
	kiln_tensor *calib = random_tensor(4, (int64_t[]){8, 3, 8, 8}, -1, 1);
	const char *keep[] = {"Gemm"};
	kiln_quant_opts o = {.keep_float = keep, .nkeep_float = 1};
	kiln_quant_report *r = NULL;
	kiln_error e = {0};
	ck_assert_msg(quantize(g, calib, &o, &q, &r, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(r->nlayers, 4);
	for (int i = 0; i < r->nlayers; i++)
		ck_assert_str_ne(r->layers[i].op, "Gemm");
	const ir_node *gm = only_node(q, KILN_OP_GEMM);
	ck_assert_int_ne(q->val[gm->in[0]]->def->op, KILN_OP_DEQUANTIZE_LINEAR);
	ck_assert_int_ne(q->val[gm->in[1]]->def->op, KILN_OP_DEQUANTIZE_LINEAR);
	ck_assert_int_eq(count_op(q, KILN_OP_QUANTIZE_LINEAR), 4); /* not the pool's */
	kiln_quant_report_free(r), kiln_tensor_free(calib), kiln_graph_free(g), kiln_graph_free(q);
}
END_TEST

/* A fixed batch of 2 runs the samples two at a time (6 samples: fine, 5:
 * an error); a stack of whole inputs [3, 2, 4] is the same data and gives
 * the same scale. */
START_TEST(fixed_batches_and_stacked_samples)
{
	kiln_graph *g = linear(4, true), *q1 = NULL, *q2 = NULL;
	kiln_tensor *flat = random_tensor(2, (int64_t[]){6, 4}, -2, 2);
	kiln_tensor *stack = kiln_tensor_new(KILN_F32, 3, (int64_t[]){3, 2, 4});
	memcpy(stack->data, flat->data, kiln_tensor_nbytes(flat));
	kiln_error e = {0};
	ck_assert_msg(quantize(g, flat, NULL, &q1, NULL, &e) == KILN_OK, "%s", e.msg);
	ck_assert_msg(quantize(g, stack, NULL, &q2, NULL, &e) == KILN_OK, "%s", e.msg);
	ck_assert_float_eq(ir_load(const_of(q1, q_of(q1, q1->input[0])->in[1]), 0),
	                   ir_load(const_of(q2, q_of(q2, q2->input[0])->in[1]), 0));
	kiln_graph_free(q1);
	flat->shape[0] = 5;
	ck_assert_int_eq(quantize(g, flat, NULL, &q1, NULL, &e), KILN_EINVAL);
	ck_assert_msg(strstr(e.msg, "5 calibration samples do not split into runs of 2"), "%s", e.msg);
	ck_assert_ptr_null(q1);
	kiln_tensor_free(flat), kiln_tensor_free(stack), kiln_graph_free(g), kiln_graph_free(q2);
}
END_TEST

static void expect_error(const kiln_graph *g, kiln_tensor *const *calib, int n,
                         const kiln_quant_opts *o, const char *want)
{
	kiln_graph *q = (kiln_graph *)&q; /* must come back NULL */
	kiln_quant_report *r = (kiln_quant_report *)&r;
	kiln_error e = {0};
	ck_assert_int_eq(kiln_quantize(g, calib, n, o, &q, &r, &e), KILN_EINVAL);
	ck_assert_msg(strstr(e.msg, want), "want '%s', got: %s", want, e.msg);
	ck_assert_ptr_null(q);
	ck_assert_ptr_null(r);
}

/* Each bad input is EINVAL with a message naming it, and nothing leaks. */
START_TEST(bad_graphs_data_and_options_are_errors)
{
	kiln_graph *g = linear(4, false), *q = NULL;
	kiln_tensor *good = random_tensor(2, (int64_t[]){4, 4}, -1, 1);
	kiln_tensor *nan = kiln_tensor_clone(good), *wide = random_tensor(2, (int64_t[]){4, 5}, 0, 1);
	((float *)nan->data)[9] = NAN;
	expect_error(g, &nan, 1, NULL, "input 'x' has a non-finite value at element 9");
	expect_error(g, &wide, 1, NULL, "'x' is f32[4,5]: it must be samples of f32[N,4]");
	expect_error(g, NULL, 0, NULL, "the graph has 1 input, 0 calibration tensors given");
	expect_error(g, &good, 1, &(kiln_quant_opts){.method = KILN_CALIB_PERCENTILE, .percentile = 20},
	             "percentile 20");
	expect_error(g, &good, 1, &(kiln_quant_opts){.method = (kiln_calib_method)7}, "method 7");
	kiln_error e = {0};
	ck_assert_msg(quantize(g, good, NULL, &q, NULL, &e) == KILN_OK, "%s", e.msg);
	expect_error(q, &good, 1, NULL, "is quantized already");
	kiln_graph_set_training(g, true);
	expect_error(g, &good, 1, NULL, "traced in training mode");
	kiln_graph *r = kiln_graph_new("relu");
	const int64_t dims[] = {kiln_sym(r, "N"), 4};
	kiln_output(r, "y", kiln_relu(r, kiln_input(r, "x", KILN_F32, 2, dims)));
	expect_error(r, &good, 1, NULL, "has nothing to quantize");
	kiln_tensor_free(good), kiln_tensor_free(nan), kiln_tensor_free(wide);
	kiln_graph_free(g), kiln_graph_free(q), kiln_graph_free(r);
}
END_TEST

static Suite *quantize_suite(void)
{
	Suite *s = suite_create("quantize");
	TCase *t = tcase_create("quantize");
	tcase_set_timeout(t, 120);
	tcase_add_test(t, a_cnn_quantizes_compiles_and_stays_close_to_f32);
	tcase_add_test(t, scales_zero_points_weights_and_biases);
	tcase_add_test(t, percentile_and_entropy_clip_an_outlier);
	tcase_add_test(t, keep_float_leaves_a_layer_in_f32);
	tcase_add_test(t, fixed_batches_and_stacked_samples);
	tcase_add_test(t, bad_graphs_data_and_options_are_errors);
	suite_add_tcase(s, t);
	return s;
}

KILN_CHECK_MAIN(quantize_suite)
