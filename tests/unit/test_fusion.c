/* test_fusion.c: inference rewrites and elementwise fusion: the bnfold and
 * canonicalize passes (passes/bnfold.c, passes/canon.c), PASS_INFERENCE,
 * and fused lowering (cg_lower_ex with fuse, codegen/lower.c).
 *
 * Every rewrite is checked against the interpreter on the graph before it
 * (1e-5), and fused kernels through cg_eval against kiln_graph_run; the
 * structural checks count nodes by op and kernels in the module. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/lower.h"
#include "ir/ir.h"
#include "passes/passes.h"

#include "check_main.h"
#include "lower_util.h"

/* ---- helpers -------------------------------------------------------------- */

static kiln_tensor *ramp(int rank, const int64_t *shape, double lo, double hi, uint64_t seed)
{
	kiln_tensor *t = kiln_tensor_new(KILN_F32, rank, shape);
	ck_assert_ptr_nonnull(t);
	uint64_t s = seed * 2654435761u + 7;
	for (int64_t i = 0; i < kiln_tensor_numel(t); i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		ir_store(t, i, lo + (hi - lo) * ((s >> 40) * 0x1p-24));
	}
	return t;
}

/* Gives every float parameter seeded values (variances positive), so a
 * fold with PyTorch's default statistics (0 and 1) cannot pass by luck. */
static void perturb(kiln_graph *g)
{
	for (uint32_t v = 1; v < g->nval; v++) {
		ir_value *x = g->val[v];
		if (x->kind != IR_V_PARAM || !x->data || !kiln_dtype_is_float(x->data->dtype))
			continue;
		bool var = x->name && strstr(x->name, "running_var");
		uint64_t s = v * 0x9e3779b97f4a7c15ULL;
		for (int64_t i = 0; i < kiln_tensor_numel(x->data); i++) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			double u = (s >> 40) * 0x1p-24;
			ir_store(x->data, i, var ? 0.5 + u : 2 * u - 1);
		}
	}
}

static int count_op(const kiln_graph *g, kiln_op op)
{
	int n = 0;
	for (uint32_t i = 0; i < g->nnode; i++)
		n += !g->node[i]->dead && g->node[i]->op == op;
	return n;
}

static double max_diff(const kiln_tensor *a, const kiln_tensor *b)
{
	ck_assert_int_eq(kiln_tensor_numel(a), kiln_tensor_numel(b));
	ck_assert_int_eq(a->rank, b->rank);
	double worst = 0;
	for (int64_t i = 0; i < kiln_tensor_numel(a); i++) {
		double d = fabs(ir_load(a, i) - ir_load(b, i));
		worst = isnan(d) || d > worst ? (isnan(d) ? INFINITY : d) : worst;
	}
	return worst;
}

/* Runs g through the interpreter; one output. */
static kiln_tensor *run1(const kiln_graph *g, kiln_tensor **in, int nin)
{
	kiln_tensor *y = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_run(g, in, nin, &y, 1, &err) == KILN_OK, "%s", err.msg);
	return y;
}

static kiln_graph *optimized(const kiln_graph *g, const char *passes)
{
	kiln_graph *c = ir_graph_clone(g);
	kiln_error err = {0};
	ck_assert_ptr_nonnull(c);
	ck_assert_msg(kiln_graph_optimize(c, passes, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_graph_verify(c, &err) == KILN_OK, "%s", err.msg);
	return c;
}

/* The rewritten graph gives what the original gives, within tol. */
static void same_outputs(const kiln_graph *a, const kiln_graph *b, kiln_tensor **in, int nin,
                         double tol)
{
	kiln_tensor *ya = run1(a, in, nin), *yb = run1(b, in, nin);
	double e = max_diff(ya, yb);
	ck_assert_msg(e <= tol, "max error %g > %g", e, tol);
	kiln_tensor_free(ya), kiln_tensor_free(yb);
}

static cg_module *lower(const kiln_graph *g, bool fuse)
{
	cg_module *m = NULL;
	kiln_error err = {0};
	cg_lower_opts o = {.fuse = fuse};
	ck_assert_msg(cg_lower_ex(g, &o, &m, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(cg_memplan(m, &err) == KILN_OK, "%s", err.msg);
	return m;
}

/* The fused module of g computes what the interpreter computes on ref. */
static void fused_matches(const cg_module *m, const kiln_graph *ref, kiln_tensor **in, int nin)
{
	kiln_tensor *want = run1(ref, in, nin), *got = NULL;
	kiln_error err = {0};
	ck_assert_msg(cg_eval(m, in, nin, &got, 1, &err) == KILN_OK, "%s", err.msg);
	double e = max_diff(got, want);
	ck_assert_msg(e <= 1e-5, "fused max error %g", e);
	kiln_tensor_free(want), kiln_tensor_free(got);
}

/* The example CNN on [N,1,28,28] with PyTorch's trained weights. */
static kiln_graph *cnn(void)
{
	return trained_model("cnn", example_cnn, 4, (int64_t[]){1, 28, 28});
}

/* ---- bnfold ---------------------------------------------------------------- */

START_TEST(bnfold_cnn_matches_unfolded_and_drops_every_bn)
{
	kiln_graph *g = cnn();
	perturb(g);
	kiln_graph *f = optimized(g, "bnfold");
	ck_assert_int_eq(count_op(g, KILN_OP_BATCH_NORM), 2);
	ck_assert_int_eq(count_op(f, KILN_OP_BATCH_NORM), 0);
	ck_assert_int_eq(count_op(f, KILN_OP_CONV), 2);
	kiln_tensor *x = model_input("cnn");
	same_outputs(g, f, &x, 1, 1e-5);
	kiln_tensor_free(x);
	kiln_graph_free(f);
	kiln_graph_free(g);
}
END_TEST

/* Linear then BatchNorm1d: a Gemm with transB and a bias. */
START_TEST(bnfold_into_gemm_with_bias_matches)
{
	kiln_graph *g = kiln_graph_new("lin");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 6});
	kiln_value h = kiln_batchnorm(g, "bn", kiln_linear(g, "fc", x, 5, true), 1e-3, 0);
	kiln_output(g, "y", kiln_relu(g, h));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	perturb(g);
	kiln_graph *f = optimized(g, PASS_INFERENCE);
	ck_assert_int_eq(count_op(f, KILN_OP_BATCH_NORM), 0);
	ck_assert_int_eq(count_op(f, KILN_OP_GEMM), 1);
	ck_assert_str_eq(f->val[f->output[0]]->name, "y");
	kiln_tensor *in = ramp(2, (int64_t[]){3, 6}, -2, 2, 1);
	same_outputs(g, f, &in, 1, 1e-5);
	kiln_tensor_free(in);
	kiln_graph_free(f);
	kiln_graph_free(g);
}
END_TEST

/* A Linear's [N, K] weight is stored [K, N] with transB 0, so the GEMM
 * reads B's rows in place; the replaced parameter gets no buffer (it would
 * be embedded twice), and the results are unchanged. */
START_TEST(bnfold_stores_linear_weights_as_k_by_n)
{
	kiln_graph *g = kiln_graph_new("lin");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){kiln_sym(g, "N"), 6});
	kiln_output(g, "y", kiln_relu(g, kiln_linear(g, "fc", x, 5, true)));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	perturb(g);
	kiln_graph *f = optimized(g, PASS_INFERENCE);
	const ir_node *gm = NULL;
	for (uint32_t i = 0; i < f->nnode; i++)
		gm = f->node[i]->op == KILN_OP_GEMM ? f->node[i] : gm;
	ck_assert_ptr_nonnull(gm);
	ck_assert_int_eq(ir_attr_int(gm, "transB", 1), 0);
	const ir_type *bt = &f->val[gm->in[1]]->type;
	ck_assert_int_eq(bt->rank, 2);
	ck_assert_int_eq(bt->dim[0], 6);
	ck_assert_int_eq(bt->dim[1], 5);
	kiln_tensor *in = ramp(2, (int64_t[]){3, 6}, -2, 2, 4);
	same_outputs(g, f, &in, 1, 1e-6);
	cg_module *m = lower(f, true);
	int consts = 0;
	for (int b = 0; b < m->nbuf; b++) {
		if (m->buf[b].kind != CG_BUF_CONST)
			continue;
		consts++;
		ck_assert_msg(!(m->buf[b].type.rank == 2 && m->buf[b].type.dim[0] == 5),
		              "the [5,6] weight still has buffer %d", b);
	}
	ck_assert_int_eq(consts, 2); /* [6,5] weight and [5] bias */
	fused_matches(m, g, &in, 1);
	cg_module_free(m);
	kiln_tensor_free(in);
	kiln_graph_free(f);
	kiln_graph_free(g);
}
END_TEST

/* A graph marked for training keeps its BN: its parameters are not final. */
START_TEST(bnfold_leaves_training_graphs_alone)
{
	kiln_graph *g = kiln_graph_new("t");
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, (int64_t[]){2, 3, 5, 5});
	const kiln_conv_opts k3 = {.kernel = {3, 3}, .pad = {1, 1}};
	kiln_output(g, "y", kiln_batchnorm(g, "bn", kiln_conv2d(g, "c", x, 4, &k3, true), 0, 0));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_graph_set_training(g, true);
	kiln_graph *f = optimized(g, "bnfold");
	ck_assert_int_eq(count_op(f, KILN_OP_BATCH_NORM), 1);
	ck_assert_uint_eq(f->nnode, g->nnode);
	kiln_graph_free(f);
	kiln_graph_set_training(g, false); /* the same graph for inference folds */
	f = optimized(g, "bnfold");
	ck_assert_int_eq(count_op(f, KILN_OP_BATCH_NORM), 0);
	kiln_graph_free(f);
	kiln_graph_free(g);
}
END_TEST

/* Statistics that are graph inputs are not constants. */
START_TEST(bnfold_refuses_non_constant_stats)
{
	kiln_graph *g = kiln_graph_new("s");
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, (int64_t[]){1, 2, 3, 3});
	kiln_value var = kiln_input(g, "var", KILN_F32, 1, (int64_t[]){2});
	const kiln_conv_opts k1 = {.kernel = {1, 1}};
	kiln_value c = kiln_conv2d(g, "c", x, 2, &k1, true);
	kiln_value w = c ? g->node[g->val[c]->def->idx]->in[2] : KILN_NONE; /* the bias: [2] */
	kiln_output(g, "y", kiln_batch_norm(g, c, w, w, w, var, 1e-5));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_graph *f = optimized(g, "bnfold");
	ck_assert_int_eq(count_op(f, KILN_OP_BATCH_NORM), 1);
	ck_assert_uint_eq(f->nnode, g->nnode);
	kiln_graph_free(f);
	kiln_graph_free(g);
}
END_TEST

/* ---- canonicalize ---------------------------------------------------------- */

START_TEST(canonicalize_removes_every_pattern_and_preserves_outputs)
{
	const char *text =
		"graph @c(%x: f32[N,2,3,4]) -> (%y: f32[N,24]) {\n"
		"  %i = identity %x : f32[N,2,3,4]\n"
		"  %d = dropout %i {ratio=0.5} : f32[N,2,3,4]\n"
		"  %t1 = transpose %d {perm=[0,2,3,1]} : f32[N,3,4,2]\n"
		"  %t2 = transpose %t1 {perm=[0,3,1,2]} : f32[N,2,3,4]\n"
		"  %c = concat %t2 {axis=1} : f32[N,2,3,4]\n"
		"  %e = exp %c : f32[N,2,3,4]\n"
		"  %s = unsqueeze %e {axes=[1]} : f32[N,1,2,3,4]\n"
		"  %u = squeeze %s {axes=[1]} : f32[N,2,3,4]\n"
		"  %r = reshape %u {shape=[0,6,4]} : f32[N,6,4]\n"
		"  %y = flatten %r : f32[N,24]\n"
		"  ret %y\n"
		"}\n";
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_from_kir(text, "c.kir", &g, &err) == KILN_OK, "%s", err.msg);
	kiln_graph *f = optimized(g, "canonicalize");
	/* what is left: exp and one reshape, which takes the output's name */
	ck_assert_uint_eq(f->nnode, 2);
	ck_assert_int_eq(count_op(f, KILN_OP_EXP), 1);
	ck_assert_int_eq(count_op(f, KILN_OP_RESHAPE), 1);
	ck_assert_str_eq(f->val[f->output[0]]->name, "y");
	kiln_tensor *in = ramp(4, (int64_t[]){2, 2, 3, 4}, -1, 1, 3);
	same_outputs(g, f, &in, 1, 0);
	kiln_tensor_free(in);
	kiln_graph_free(f);
	kiln_graph_free(g);
}
END_TEST

START_TEST(canonicalize_keeps_a_transpose_read_elsewhere)
{
	const char *text =
		"graph @k(%x: f32[2,3]) -> (%y: f32[2,3], %z: f32[3,2]) {\n"
		"  %z = transpose %x : f32[3,2]\n"
		"  %y = transpose %z : f32[2,3]\n"
		"  ret %y, %z\n"
		"}\n";
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_from_kir(text, "k.kir", &g, &err) == KILN_OK, "%s", err.msg);
	kiln_graph *f = optimized(g, "canonicalize");
	/* %y is x itself, but x is a graph input: the output keeps its node */
	ck_assert_int_eq(count_op(f, KILN_OP_TRANSPOSE), 2);
	ck_assert_str_eq(f->val[f->output[0]]->name, "y");
	ck_assert_str_eq(f->val[f->output[1]]->name, "z");
	kiln_graph_free(f);
	kiln_graph_free(g);
}
END_TEST

/* ---- fusion ---------------------------------------------------------------- */

static uint32_t input(kiln_graph *g, const char *name, int rank, const int64_t *dims)
{
	return kiln_input(g, name, KILN_F32, rank, dims);
}

START_TEST(elementwise_chain_is_one_kernel)
{
	kiln_graph *g = kiln_graph_new("chain");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = input(g, "x", 3, (int64_t[]){N, 4, 8});
	kiln_value b = input(g, "b", 2, (int64_t[]){4, 1});
	kiln_value c = input(g, "c", 1, (int64_t[]){8});
	kiln_output(g, "y", kiln_sigmoid(g, kiln_add(g, kiln_mul(g, x, b), c)));
	cg_module *plain = lower(g, false), *m = lower(g, true);
	ck_assert_int_eq(plain->nkern, 3);
	ck_assert_int_eq(m->nkern, 1);
	ck_assert_int_eq(m->nslot, 0); /* the intermediates have no memory */
	/* its name and single read of x: tests/kir/codegen/fusion_chain.kir */
	kiln_tensor *in[3] = {ramp(3, (int64_t[]){2, 4, 8}, -3, 3, 1), ramp(2, (int64_t[]){4, 1}, -1, 1, 2),
	                      ramp(1, (int64_t[]){8}, -1, 1, 3)};
	fused_matches(m, g, in, 3);
	for (int i = 0; i < 3; i++)
		kiln_tensor_free(in[i]);
	cg_module_free(plain), cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* GELU written out as 0.5 * x * (1 + erf(x / sqrt 2)): x feeds two nodes
 * but is a leaf (an input), so the five nodes are one kernel. */
START_TEST(gelu_as_erf_chain_is_one_kernel)
{
	kiln_graph *g = kiln_graph_new("gelu");
	kiln_value x = input(g, "x", 2, (int64_t[]){kiln_sym(g, "N"), 16});
	kiln_value e = kiln_erf(g, kiln_mul(g, x, kiln_scalar(g, KILN_F32, M_SQRT1_2)));
	kiln_value one = kiln_scalar(g, KILN_F32, 1), half = kiln_scalar(g, KILN_F32, 0.5);
	kiln_output(g, "y", kiln_mul(g, kiln_mul(g, x, kiln_add(g, e, one)), half));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	cg_module *m = lower(g, true);
	ck_assert_int_eq(m->nkern, 1);
	kiln_tensor *in = ramp(2, (int64_t[]){3, 16}, -4, 4, 5);
	fused_matches(m, g, &in, 1);
	kiln_tensor_free(in);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* SiLU, x * sigmoid(x), is one kernel with sigmoid one kernel-IR op (no
 * exp and division spelled out), with the interpreter's values over a
 * range where exp(-x) under- and overflows. */
START_TEST(silu_fuses_to_one_kernel)
{
	kiln_graph *g = kiln_graph_new("silu");
	kiln_value x = input(g, "x", 2, (int64_t[]){kiln_sym(g, "N"), 16});
	kiln_output(g, "y", kiln_mul(g, x, kiln_sigmoid(g, x)));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	cg_module *m = lower(g, true);
	ck_assert_int_eq(m->nkern, 1);
	char *text = dump(m);
	ck_assert_msg(strstr(text, "]*sigmoid(buf") && !strstr(text, "exp("), "%s", text);
	free(text);
	kiln_tensor *in = ramp(2, (int64_t[]){4, 16}, -120, 120, 6);
	fused_matches(m, g, &in, 1);
	kiln_tensor_free(in);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* Not fused: an intermediate read twice, one that is a graph output, and
 * one smaller than its reader (it would be recomputed per broadcast). */
START_TEST(fusion_stops_at_shared_outputs_and_broadcasts)
{
	kiln_graph *g = kiln_graph_new("stop");
	kiln_value x = input(g, "x", 2, (int64_t[]){4, 8});
	kiln_value b = input(g, "b", 1, (int64_t[]){8});
	kiln_value twice = kiln_exp(g, x);                    /* k0: read by two */
	kiln_value s = kiln_mul(g, twice, twice);             /* k1 */
	kiln_value out = kiln_neg(g, s);                      /* k1 too: output */
	kiln_value small = kiln_exp(g, b);                    /* k2: [8] under [4,8] */
	kiln_output(g, "o", out);
	kiln_output(g, "y", kiln_add(g, kiln_tanh(g, out), small)); /* k3 */
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	cg_module *m = lower(g, true);
	ck_assert_int_eq(m->nkern, 4); /* which: tests/kir/codegen/fusion_stops.kir */
	kiln_tensor *in[2] = {ramp(2, (int64_t[]){4, 8}, -1, 1, 7), ramp(1, (int64_t[]){8}, -1, 1, 8)};
	kiln_tensor *want[2] = {0}, *got[2] = {0};
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_run(g, in, 2, want, 2, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(cg_eval(m, in, 2, got, 2, &err) == KILN_OK, "%s", err.msg);
	for (int k = 0; k < 2; k++) {
		ck_assert_double_le(max_diff(got[k], want[k]), 1e-5);
		kiln_tensor_free(got[k]), kiln_tensor_free(want[k]);
	}
	kiln_tensor_free(in[0]), kiln_tensor_free(in[1]);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* A sum of ten inputs reads more than CG_FUSE_MAX buffers: part of the
 * chain is stored first, and the answer does not change. */
START_TEST(too_many_leaves_split_the_chain)
{
	kiln_graph *g = kiln_graph_new("wide");
	kiln_value acc = KILN_NONE;
	kiln_tensor *in[10];
	for (int i = 0; i < 10; i++) {
		char name[8];
		snprintf(name, sizeof name, "x%d", i);
		kiln_value x = input(g, name, 1, (int64_t[]){5});
		acc = i ? kiln_add(g, acc, x) : x;
		in[i] = ramp(1, (int64_t[]){5}, -1, 1, 10 + i);
	}
	kiln_output(g, "y", acc);
	cg_module *m = lower(g, true);
	ck_assert_int_eq(m->nkern, 2);
	fused_matches(m, g, in, 10);
	for (int i = 0; i < 10; i++)
		kiln_tensor_free(in[i]);
	cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

/* f16 intermediates round to f16 inside the fused expression, as stores
 * between separate kernels would. */
START_TEST(f16_chain_rounds_like_separate_kernels)
{
	kiln_graph *g = kiln_graph_new("h");
	kiln_value x = kiln_input(g, "x", KILN_F16, 1, (int64_t[]){64});
	kiln_value y = kiln_mul(g, kiln_exp(g, x), kiln_scalar(g, KILN_F16, 3));
	kiln_output(g, "y", kiln_cast(g, y, KILN_F32));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_tensor *in = kiln_tensor_new(KILN_F16, 1, (int64_t[]){64}), *a = NULL, *b = NULL;
	for (int i = 0; i < 64; i++)
		ir_store(in, i, i * 0.0371 - 1.1);
	cg_module *plain = lower(g, false), *m = lower(g, true);
	ck_assert_int_eq(m->nkern, 1);
	kiln_error err = {0};
	ck_assert_msg(cg_eval(plain, &in, 1, &a, 1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(cg_eval(m, &in, 1, &b, 1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_double_eq(max_diff(a, b), 0);
	kiln_tensor_free(a), kiln_tensor_free(b), kiln_tensor_free(in);
	cg_module_free(plain), cg_module_free(m);
	kiln_graph_free(g);
}
END_TEST

START_TEST(cnn_after_inference_pipeline_has_fewer_kernels)
{
	kiln_graph *g = cnn();
	kiln_graph *f = optimized(g, PASS_INFERENCE);
	cg_module *before = lower(g, false), *after = lower(f, true);
	/* conv, bn, relu, pool twice, then the classifier.  Unoptimized, each
	 * relu folds into its BN kernel's final stores; after the pipeline the
	 * BN folds into the conv and the relu goes into the conv GEMM's
	 * epilogue: one kernel fewer per block */
	ck_assert_int_lt(after->nkern, before->nkern);
	ck_assert_int_eq(before->nkern - after->nkern, 2);
	char *btext = dump(before);
	ck_assert_int_eq(count(btext, "kernel k"), count(btext, "_relu") + before->nkern);
	free(btext);
	char *text = dump(after);
	ck_assert_int_eq(count(text, "batch_norm"), 0);
	ck_assert_int_eq(count(text, "per row relu"), 2);
	free(text);
	kiln_tensor *x = model_input("cnn");
	fused_matches(after, g, &x, 1);
	kiln_tensor_free(x);
	cg_module_free(before), cg_module_free(after);
	kiln_graph_free(f);
	kiln_graph_free(g);
}
END_TEST

/* conv-bn-relu-conv-bn, + x, relu, then the next block's conv: after
 * PASS_INFERENCE the first relu is the GEMM epilogue, and the residual add
 * and the relu after it are the second GEMM's (it reads x in its store
 * path), so three kernels, one per conv.  When the relu is a graph output
 * it stays a kernel of its own (the GEMM still takes the add). */
START_TEST(resnet_block_fuses_residual_add_and_relu)
{
	kiln_graph *g = kiln_graph_new("block");
	kiln_value x = input(g, "x", 4, (int64_t[]){kiln_sym(g, "N"), 4, 6, 6});
	const kiln_conv_opts k3 = {.kernel = {3, 3}, .pad = {1, 1}};
	kiln_value h = kiln_relu(g, kiln_batchnorm(g, "bn1", kiln_conv2d(g, "c1", x, 4, &k3, false), 0, 0));
	h = kiln_batchnorm(g, "bn2", kiln_conv2d(g, "c2", h, 4, &k3, false), 0, 0);
	h = kiln_relu(g, kiln_add(g, h, x));
	kiln_output(g, "y", kiln_conv2d(g, "c3", h, 4, &k3, false));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	perturb(g);
	kiln_graph *f = optimized(g, PASS_INFERENCE);
	cg_module *m = lower(f, true);
	char *text = dump(m);
	ck_assert_msg(m->nkern == 3, "%s", text);
	ck_assert_int_eq(count(text, "per row relu"), 1);
	/* the per-image loop's variable numbers after im2col's */
	ck_assert_int_eq(count(text, "per row residual=buf0[%i"), 1);
	ck_assert_int_eq(count(text, "*144; 36] relu"), 1);
	ck_assert_msg(!strstr(text, "add"), "%s", text);
	free(text);
	kiln_tensor *in = ramp(4, (int64_t[]){2, 4, 6, 6}, -1, 1, 9);
	fused_matches(m, g, &in, 1);
	kiln_tensor_free(in);
	cg_module_free(m);
	kiln_graph_free(f);
	kiln_graph_free(g);
}
END_TEST

/* MobileNetV2's inverted residual without the residual: 1x1 conv-bn-Relu6,
 * depthwise 3x3 conv-bn-Relu6, 1x1 conv-bn.  After PASS_INFERENCE each
 * Relu6 (Clip 0..6) is part of its producer: the expanding GEMM's epilogue
 * and the depthwise conv's store, so three kernels and no clip kernel. */
START_TEST(mobilenet_block_fuses_relu6_into_its_convs)
{
	kiln_graph *g = kiln_graph_new("ir_block");
	kiln_value x = input(g, "x", 4, (int64_t[]){kiln_sym(g, "N"), 4, 6, 6});
	const kiln_conv_opts k1 = {.kernel = {1, 1}};
	const kiln_conv_opts dw = {.kernel = {3, 3}, .pad = {1, 1}, .group = 12};
	kiln_value h = kiln_batchnorm(g, "bn1", kiln_conv2d(g, "c1", x, 12, &k1, false), 0, 0);
	h = kiln_clip(g, h, 0, 6);
	h = kiln_batchnorm(g, "bn2", kiln_conv2d(g, "dw", h, 12, &dw, false), 0, 0);
	h = kiln_clip(g, h, 0, 6);
	kiln_output(g, "y", kiln_batchnorm(g, "bn3", kiln_conv2d(g, "c3", h, 4, &k1, false), 0, 0));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	perturb(g);
	kiln_graph *f = optimized(g, PASS_INFERENCE);
	cg_module *m = lower(f, true);
	char *text = dump(m);
	ck_assert_msg(m->nkern == 3, "%s", text);
	ck_assert_int_eq(count(text, "per row clip(0, 6)"), 1);
	ck_assert_msg(!strstr(text, "_clip"), "%s", text);
	free(text);
	/* inputs of -3..3 so that both bounds bite */
	kiln_tensor *in = ramp(4, (int64_t[]){2, 4, 6, 6}, -3, 3, 9);
	fused_matches(m, g, &in, 1);
	kiln_tensor_free(in);
	cg_module_free(m);
	kiln_graph_free(f);
	kiln_graph_free(g);
}
END_TEST

/* A rank-3 Linear as PyTorch exports it, MatMul then Add of a [5] bias,
 * then Relu, read by the next MatMul: one GEMM kernel with the bias per
 * column and relu in its epilogue.  An Add of a [3,5] matrix is no bias
 * and stays a kernel (with the relu fused). */
START_TEST(matmul_bias_add_and_relu_fold_into_the_gemm)
{
	for (int mat = 0; mat < 2; mat++) {
		kiln_graph *g = kiln_graph_new("lin3");
		kiln_value x = input(g, "x", 3, (int64_t[]){kiln_sym(g, "N"), 3, 6});
		kiln_tensor *w = ramp(2, (int64_t[]){6, 5}, -1, 1, 2);
		kiln_tensor *w2 = ramp(2, (int64_t[]){5, 4}, -1, 1, 4);
		kiln_tensor *b = ramp(mat ? 2 : 1, mat ? (int64_t[]){3, 5} : (int64_t[]){5}, -1, 1, 3);
		kiln_value h = kiln_matmul(g, x, kiln_param(g, "w", w));
		h = kiln_relu(g, kiln_add(g, kiln_param(g, "b", b), h));
		kiln_output(g, "y", kiln_matmul(g, h, kiln_param(g, "w2", w2)));
		kiln_tensor_free(w), kiln_tensor_free(w2), kiln_tensor_free(b);
		ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
		cg_module *m = lower(g, true);
		char *text = dump(m);
		ck_assert_msg(m->nkern == (mat ? 3 : 2), "%s", text);
		ck_assert_int_eq(count(text, "per column relu"), !mat);
		ck_assert_msg(mat || !strstr(text, "add"), "%s", text);
		free(text);
		kiln_tensor *in = ramp(3, (int64_t[]){2, 3, 6}, -1, 1, 5);
		fused_matches(m, g, &in, 1);
		kiln_tensor_free(in);
		cg_module_free(m);
		kiln_graph_free(g);
	}
}
END_TEST

/* Attention's scores, MatMul then / sqrt(d) (or * a constant) then Softmax:
 * the scale folds into the GEMM's alpha, no kernel of its own; a scale that
 * is an input, or a MatMul result read twice, does not fold.  The softmax
 * (each exp once, kept in y) is checked against the interpreter too. */
START_TEST(matmul_scale_folds_into_alpha)
{
	for (int c = 0; c < 4; c++) {
		kiln_graph *g = kiln_graph_new("scores");
		kiln_value q = input(g, "q", 3, (int64_t[]){2, 4, 8});
		kiln_value kt = input(g, "k", 3, (int64_t[]){2, 8, 5});
		kiln_value t = input(g, "t", 0, NULL);
		kiln_value s = kiln_matmul(g, q, kt), y;
		if (c == 0)
			y = kiln_div(g, s, kiln_scalar(g, KILN_F32, 2.8284271));
		else if (c == 1)
			y = kiln_mul(g, kiln_scalar(g, KILN_F32, 0.3), s);
		else if (c == 2)
			y = kiln_div(g, s, t);
		else
			y = kiln_add(g, kiln_mul(g, s, kiln_scalar(g, KILN_F32, 0.3)), s);
		kiln_output(g, "y", kiln_softmax(g, y, -1));
		ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
		cg_module *m = lower(g, true);
		char *text = dump(m);
		ck_assert_msg(m->nkern == (c < 2 ? 2 : 3), "case %d: %s", c, text);
		ck_assert_msg(count(text, "alpha=1 ") == (c >= 2), "case %d: %s", c, text);
		free(text);
		kiln_tensor *in[3] = {ramp(3, (int64_t[]){2, 4, 8}, -2, 2, 1),
		                      ramp(3, (int64_t[]){2, 8, 5}, -2, 2, 2), ramp(0, NULL, 1.5, 2.5, 3)};
		fused_matches(m, g, in, 3);
		for (int i = 0; i < 3; i++)
			kiln_tensor_free(in[i]);
		cg_module_free(m);
		kiln_graph_free(g);
	}
}
END_TEST

/* Softmax over long rows takes its max in 16 lanes, a tree and a tail
 * (lower_nn.c softmax_into): rows of 32, 37 (a tail) and 64, with values
 * spread wide and one far above the rest per row, so a max that missed it
 * would overflow exp, against the interpreter;
 * the rows' maxima sit in lane 14, lane 3 and the last element. */
START_TEST(softmax_long_rows_match_the_interpreter)
{
	const int64_t lens[] = {32, 37, 64};
	for (int c = 0; c < 3; c++) {
		kiln_graph *g = kiln_graph_new("sm");
		kiln_value x = input(g, "x", 2, (int64_t[]){3, lens[c]});
		kiln_output(g, "y", kiln_softmax(g, x, -1));
		cg_module *m = lower(g, true);
		kiln_tensor *in = ramp(2, (int64_t[]){3, lens[c]}, -60, 60, 11 + c);
		ir_store(in, 14, 300);
		ir_store(in, lens[c] + 3, 350);
		ir_store(in, 3 * lens[c] - 1, 400);
		fused_matches(m, g, &in, 1);
		kiln_tensor_free(in);
		cg_module_free(m);
		kiln_graph_free(g);
	}
}
END_TEST

static Suite *fusion_suite(void)
{
	Suite *s = suite_create("fusion");
	TCase *tc = tcase_create("bnfold");
	tcase_add_test(tc, bnfold_cnn_matches_unfolded_and_drops_every_bn);
	tcase_add_test(tc, matmul_scale_folds_into_alpha);
	tcase_add_test(tc, softmax_long_rows_match_the_interpreter);
	tcase_add_test(tc, bnfold_into_gemm_with_bias_matches);
	tcase_add_test(tc, bnfold_stores_linear_weights_as_k_by_n);
	tcase_add_test(tc, bnfold_leaves_training_graphs_alone);
	tcase_add_test(tc, bnfold_refuses_non_constant_stats);
	suite_add_tcase(s, tc);
	tc = tcase_create("canonicalize");
	tcase_add_test(tc, canonicalize_removes_every_pattern_and_preserves_outputs);
	tcase_add_test(tc, canonicalize_keeps_a_transpose_read_elsewhere);
	suite_add_tcase(s, tc);
	tc = tcase_create("fusion");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, elementwise_chain_is_one_kernel);
	tcase_add_test(tc, gelu_as_erf_chain_is_one_kernel);
	tcase_add_test(tc, silu_fuses_to_one_kernel);
	tcase_add_test(tc, fusion_stops_at_shared_outputs_and_broadcasts);
	tcase_add_test(tc, too_many_leaves_split_the_chain);
	tcase_add_test(tc, f16_chain_rounds_like_separate_kernels);
	tcase_add_test(tc, cnn_after_inference_pipeline_has_fewer_kernels);
	tcase_add_test(tc, resnet_block_fuses_residual_add_and_relu);
	tcase_add_test(tc, mobilenet_block_fuses_relu6_into_its_convs);
	tcase_add_test(tc, matmul_bias_add_and_relu_fold_into_the_gemm);
	suite_add_tcase(s, tc);
	return s;
}

KILN_CHECK_MAIN(fusion_suite)
