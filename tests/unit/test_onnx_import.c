/*
 * test_onnx_import.c: the ONNX importer on small models built here with
 * protobuf-c's structs and packed in memory: the attribute-versus-input
 * changes across opsets, dims, initializers (typed, raw, external), folding
 * of shape arithmetic, and error reports that list every problem at once.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/wait.h>

#include "frontend/onnx/onnx.h"
#include "check_main.h"

/* ---- a tiny model builder: every allocation is freed by pool_free ------- */

static void *pool[4096];
static int npool;

static void *A(size_t n)
{
	void *p = calloc(1, n ? n : 1);
	ck_assert_int_lt(npool, 4096);
	return pool[npool++] = p;
}

static char *S(const char *s)
{
	return strcpy(A(strlen(s) + 1), s);
}

static void pool_free(void)
{
	while (npool)
		free(pool[--npool]);
}

#define PUSH(arr, n, v)                                                   \
	do {                                                              \
		void **na = A(((n) + 1) * sizeof(void *));                \
		if (n)                                                    \
			memcpy(na, arr, (n) * sizeof(void *));            \
		na[(n)++] = (v);                                          \
		(arr) = (void *)na;                                       \
	} while (0)

static Onnx__ModelProto *model(int64_t opset)
{
	Onnx__ModelProto *m = A(sizeof *m);
	Onnx__GraphProto *g = A(sizeof *g);
	Onnx__OperatorSetIdProto *os = A(sizeof *os);
	onnx__model_proto__init(m);
	onnx__graph_proto__init(g);
	onnx__operator_set_id_proto__init(os);
	os->domain = S(""), os->has_version = 1, os->version = opset;
	PUSH(m->opset_import, m->n_opset_import, os);
	m->has_ir_version = 1, m->ir_version = 8, m->graph = g;
	g->name = S("t");
	return m;
}

/* dims: "2,N,?" — a number is dim_value, a name dim_param, '?' missing. */
static Onnx__ValueInfoProto *vinfo(const char *name, int32_t elem, const char *dims)
{
	Onnx__ValueInfoProto *vi = A(sizeof *vi);
	Onnx__TypeProto *tp = A(sizeof *tp);
	Onnx__TypeProto__Tensor *tt = A(sizeof *tt);
	Onnx__TensorShapeProto *sp = A(sizeof *sp);
	onnx__value_info_proto__init(vi), onnx__type_proto__init(tp);
	onnx__type_proto__tensor__init(tt), onnx__tensor_shape_proto__init(sp);
	vi->name = S(name), vi->type = tp;
	tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE, tp->tensor_type = tt;
	tt->has_elem_type = 1, tt->elem_type = elem, tt->shape = sp;
	char *copy = S(dims), *save = NULL;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		Onnx__TensorShapeProto__Dimension *d = A(sizeof *d);
		onnx__tensor_shape_proto__dimension__init(d);
		if (*t >= '0' && *t <= '9')
			d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE,
			d->dim_value = atoll(t);
		else if (*t != '?')
			d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM,
			d->dim_param = S(t);
		PUSH(sp->dim, sp->n_dim, d);
	}
	return vi;
}

static void input(Onnx__ModelProto *m, const char *name, int32_t elem, const char *dims)
{
	PUSH(m->graph->input, m->graph->n_input, vinfo(name, elem, dims));
}

static void output(Onnx__ModelProto *m, const char *name)
{
	PUSH(m->graph->output, m->graph->n_output, vinfo(name, 1, ""));
}

/* ins/outs: comma-separated names; an empty field is an omitted input. */
static Onnx__NodeProto *node(Onnx__ModelProto *m, const char *op, const char *ins,
                             const char *outs, const char *name)
{
	Onnx__NodeProto *n = A(sizeof *n);
	onnx__node_proto__init(n);
	n->op_type = S(op), n->name = name ? S(name) : NULL;
	for (const char *p = ins; *p;) {
		size_t k = strcspn(p, ",");
		char *s = A(k + 1);
		memcpy(s, p, k);
		PUSH(n->input, n->n_input, s);
		p += k + (p[k] == ',');
	}
	char *copy = S(outs), *save = NULL;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
		PUSH(n->output, n->n_output, S(t));
	PUSH(m->graph->node, m->graph->n_node, n);
	return n;
}

static Onnx__AttributeProto *attr(Onnx__NodeProto *n, const char *name, int type)
{
	Onnx__AttributeProto *a = A(sizeof *a);
	onnx__attribute_proto__init(a);
	a->name = S(name), a->has_type = 1, a->type = type;
	PUSH(n->attribute, n->n_attribute, a);
	return a;
}

static void attr_i(Onnx__NodeProto *n, const char *name, int64_t v)
{
	Onnx__AttributeProto *a = attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
	a->has_i = 1, a->i = v;
}

static void attr_f(Onnx__NodeProto *n, const char *name, float v)
{
	Onnx__AttributeProto *a = attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
	a->has_f = 1, a->f = v;
}

static void attr_ints(Onnx__NodeProto *n, const char *name, int cnt, const int64_t *v)
{
	Onnx__AttributeProto *a = attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
	a->n_ints = (size_t)cnt, a->ints = A(cnt * sizeof *v);
	memcpy(a->ints, v, cnt * sizeof *v);
}

static void attr_s(Onnx__NodeProto *n, const char *name, const char *v)
{
	Onnx__AttributeProto *a = attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
	a->has_s = 1, a->s.len = strlen(v), a->s.data = (uint8_t *)S(v);
}

static Onnx__TensorProto *tensor(const char *name, int32_t type, int rank, const int64_t *dims)
{
	Onnx__TensorProto *t = A(sizeof *t);
	onnx__tensor_proto__init(t);
	t->name = S(name), t->has_data_type = 1, t->data_type = type;
	t->n_dims = (size_t)rank, t->dims = A(rank * sizeof *dims);
	if (rank)
		memcpy(t->dims, dims, rank * sizeof *dims);
	return t;
}

/* An int64 initializer in int64_data. */
static void init_i64(Onnx__ModelProto *m, const char *name, int cnt, const int64_t *v)
{
	int64_t dim = cnt;
	Onnx__TensorProto *t = tensor(name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, &dim);
	t->n_int64_data = (size_t)cnt, t->int64_data = A(cnt * sizeof *v);
	memcpy(t->int64_data, v, cnt * sizeof *v);
	PUSH(m->graph->initializer, m->graph->n_initializer, t);
}

/* Packs m and imports it; the status, with the graph in *g. */
static kiln_status import(Onnx__ModelProto *m, kiln_graph **g, kiln_error *err)
{
	size_t n = onnx__model_proto__get_packed_size(m);
	uint8_t *buf = A(n + 1);
	onnx__model_proto__pack(m, buf);
	return kiln_onnx_import_mem(buf, n, "t.onnx", g, err);
}

static kiln_graph *import_ok(Onnx__ModelProto *m)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	kiln_status st = import(m, &g, &err);
	ck_assert_msg(st == KILN_OK, "import failed: %s", err.msg);
	return g;
}

/* Runs g on one f32 input filled with 0, 1, 2, ...; returns output 0. */
static kiln_tensor *run_iota(kiln_graph *g, int rank, const int64_t *shape)
{
	kiln_tensor *x = kiln_tensor_new(KILN_F32, rank, shape), *y = NULL;
	for (int64_t i = 0; i < kiln_tensor_numel(x); i++)
		((float *)x->data)[i] = (float)i - 5;
	kiln_error err = {0};
	kiln_status st = kiln_graph_run(g, &x, 1, &y, 1, &err);
	kiln_tensor_free(x);
	ck_assert_msg(st == KILN_OK, "run failed: %s", err.msg);
	return y;
}

static int count_op(const kiln_graph *g, kiln_op op)
{
	int n = 0;
	for (uint32_t i = 0; i < g->nnode; i++)
		n += !g->node[i]->dead && g->node[i]->op == op;
	return n;
}

static const ir_node *only_node(const kiln_graph *g, kiln_op op)
{
	const ir_node *found = NULL;
	for (uint32_t i = 0; i < g->nnode; i++)
		if (!g->node[i]->dead && g->node[i]->op == op)
			found = g->node[i];
	ck_assert_ptr_nonnull(found);
	return found;
}

static void assert_ints(const ir_node *n, const char *name, int cnt, const int64_t *want)
{
	const int64_t *v;
	ck_assert_int_eq(ir_attr_ints(n, name, &v), cnt);
	for (int i = 0; i < cnt; i++)
		ck_assert_int_eq(v[i], want[i]);
}

#define F32 ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT
#define I64 ONNX__TENSOR_PROTO__DATA_TYPE__INT64

/* ---- opset variants ------------------------------------------------------- */

START_TEST(reshape_shape_input_from_initializer_becomes_attribute)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "2,3,4");
	init_i64(m, "shape", 2, (int64_t[]){0, -1});
	node(m, "Reshape", "x,shape", "y", "r");
	output(m, "y");
	kiln_graph *g = import_ok(m);
	const ir_node *n = only_node(g, KILN_OP_RESHAPE);
	assert_ints(n, "shape", 2, (int64_t[]){0, -1});
	ck_assert_int_eq(g->val[n->out[0]]->type.dim[1], 12);
	ck_assert_int_eq(kiln_graph_find_param(g, "shape"), KILN_NONE); /* folded away */
	ck_assert_str_eq(n->name, "r");
	kiln_graph_free(g);
	pool_free();
}
END_TEST

/* Slice takes attributes before opset 10 and inputs from then on. */
static kiln_graph *slice_model(int64_t opset)
{
	Onnx__ModelProto *m = model(opset);
	input(m, "x", F32, "4,6");
	Onnx__NodeProto *n;
	if (opset < 10) {
		n = node(m, "Slice", "x", "y", NULL);
		attr_ints(n, "starts", 1, (int64_t[]){1});
		attr_ints(n, "ends", 1, (int64_t[]){-1});
		attr_ints(n, "axes", 1, (int64_t[]){1});
	} else {
		init_i64(m, "st", 1, (int64_t[]){1});
		init_i64(m, "en", 1, (int64_t[]){-1});
		init_i64(m, "ax", 1, (int64_t[]){1});
		init_i64(m, "sp", 1, (int64_t[]){2});
		node(m, "Slice", "x,st,en,ax,sp", "y", NULL);
	}
	output(m, "y");
	return import_ok(m);
}

START_TEST(slice_opset9_attributes_and_opset13_inputs_agree)
{
	kiln_graph *g9 = slice_model(9), *g13 = slice_model(13);
	kiln_tensor *y9 = run_iota(g9, 2, (int64_t[]){4, 6});
	kiln_tensor *y13 = run_iota(g13, 2, (int64_t[]){4, 6});
	ck_assert_int_eq(y9->shape[1], 4);  /* columns 1..4 */
	ck_assert_int_eq(y13->shape[1], 2); /* columns 1, 3 */
	ck_assert_float_eq(((float *)y9->data)[0], -4);
	ck_assert_float_eq(((float *)y13->data)[1], -2);
	assert_ints(only_node(g13, KILN_OP_SLICE), "steps", 1, (int64_t[]){2});
	kiln_tensor_free(y9), kiln_tensor_free(y13);
	kiln_graph_free(g9), kiln_graph_free(g13);
	pool_free();
}
END_TEST

static kiln_graph *clip_model(int64_t opset, bool omit_min)
{
	Onnx__ModelProto *m = model(opset);
	input(m, "x", F32, "8");
	if (opset < 11) {
		Onnx__NodeProto *n = node(m, "Clip", "x", "y", NULL);
		attr_f(n, "min", -1), attr_f(n, "max", 2);
	} else {
		Onnx__TensorProto *lo = tensor("lo", F32, 0, NULL), *hi = tensor("hi", F32, 0, NULL);
		lo->n_float_data = hi->n_float_data = 1;
		lo->float_data = A(sizeof(float)), hi->float_data = A(sizeof(float));
		lo->float_data[0] = -1, hi->float_data[0] = 2;
		PUSH(m->graph->initializer, m->graph->n_initializer, lo);
		PUSH(m->graph->initializer, m->graph->n_initializer, hi);
		node(m, "Clip", omit_min ? "x,,hi" : "x,lo,hi", "y", NULL);
	}
	output(m, "y");
	return import_ok(m);
}

/* Clip-6 (opsets 6 to 10) has min/max attributes, Clip-11 optional inputs. */
START_TEST(clip_v6_attributes_and_v11_inputs_agree)
{
	kiln_graph *g6 = clip_model(10, false), *g11 = clip_model(11, false);
	kiln_graph *g12 = clip_model(12, true);
	kiln_tensor *a = run_iota(g6, 1, (int64_t[]){8}), *b = run_iota(g11, 1, (int64_t[]){8});
	kiln_tensor *c = run_iota(g12, 1, (int64_t[]){8});
	for (int i = 0; i < 8; i++) {
		float want = fminf(fmaxf((float)i - 5, -1), 2);
		ck_assert_float_eq(((float *)a->data)[i], want);
		ck_assert_float_eq(((float *)b->data)[i], want);
		ck_assert_float_eq(((float *)c->data)[i], fminf((float)i - 5, 2));
	}
	ck_assert_ptr_null(ir_attr_get(only_node(g12, KILN_OP_CLIP), "min"));
	kiln_tensor_free(a), kiln_tensor_free(b), kiln_tensor_free(c);
	kiln_graph_free(g6), kiln_graph_free(g11), kiln_graph_free(g12);
	pool_free();
}
END_TEST

/* Squeeze and ReduceSum: axes attribute up to opset 12, input from 13. */
static kiln_graph *axes_model(const char *op, int64_t opset)
{
	Onnx__ModelProto *m = model(opset);
	input(m, "x", F32, "3,1,4");
	if (opset < 13) {
		attr_ints(node(m, op, "x", "y", NULL), "axes", 1, (int64_t[]){1});
	} else {
		init_i64(m, "axes", 1, (int64_t[]){1});
		node(m, op, "x,axes", "y", NULL);
	}
	output(m, "y");
	return import_ok(m);
}

START_TEST(squeeze_and_reduce_sum_axes_attribute_opset11_input_opset13)
{
	const char *ops[] = {"Squeeze", "ReduceSum"};
	kiln_op kops[] = {KILN_OP_SQUEEZE, KILN_OP_REDUCE_SUM};
	for (int k = 0; k < 2; k++)
		for (int64_t opset = 11; opset <= 13; opset += 2) {
			kiln_graph *g = axes_model(ops[k], opset);
			const ir_node *n = only_node(g, kops[k]);
			assert_ints(n, "axes", 1, (int64_t[]){1});
			ck_assert_int_eq(g->val[n->out[0]]->type.rank, k == 0 ? 2 : 3);
			kiln_graph_free(g);
		}
	pool_free();
}
END_TEST

/* Opset 11 Softmax over axis 1 of [2,3,4] normalises each row of 12. */
START_TEST(softmax_opset11_coerces_to_2d_at_axis)
{
	Onnx__ModelProto *m = model(11);
	input(m, "x", F32, "2,3,4");
	attr_i(node(m, "Softmax", "x", "y", "sm"), "axis", 1);
	output(m, "y");
	kiln_graph *g = import_ok(m);
	kiln_tensor *y = run_iota(g, 3, (int64_t[]){2, 3, 4});
	double sum = 0;
	for (int i = 0; i < 12; i++)
		sum += ((float *)y->data)[i];
	ck_assert_double_eq_tol(sum, 1.0, 1e-5);
	/* the last of the row -5..6: e^6 / sum e^k = (1 - 1/e) / (1 - e^-12) */
	ck_assert_double_eq_tol(((float *)y->data)[11], (1 - exp(-1)) / (1 - exp(-12)), 1e-5);
	ck_assert_int_eq(y->rank, 3);
	only_node(g, KILN_OP_FLATTEN);
	kiln_tensor_free(y);
	kiln_graph_free(g);
	pool_free();
}
END_TEST

START_TEST(reshape_shape_from_graph_input_is_rejected)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "2,3");
	input(m, "s", I64, "2");
	node(m, "Reshape", "x,s", "y", "r1");
	output(m, "y");
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(import(m, &g, &err), KILN_EUNSUPPORTED);
	ck_assert_ptr_null(g);
	ck_assert_str_eq(err.msg, "t.onnx: Reshape 'r1' (domain ai.onnx, opset 13): input 1 "
	                 "('s', the shape) is not a constant known at import (initializer, "
	                 "Constant or foldable shape arithmetic)");
	pool_free();
}
END_TEST

/* Gelu has no ONNX 1.12 conformance case (it is an opset 20 op), so it is
 * checked here: approximate="tanh" copies over as a string attribute. */
START_TEST(gelu_imports_with_its_approximate_attribute)
{
	Onnx__ModelProto *m = model(17);
	input(m, "x", F32, "8");
	Onnx__AttributeProto *a = attr(node(m, "Gelu", "x", "y", NULL), "approximate",
	                               ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
	a->has_s = 1, a->s.len = 4, a->s.data = (uint8_t *)S("tanh");
	output(m, "y");
	kiln_graph *g = import_ok(m);
	ck_assert_str_eq(ir_attr_str(only_node(g, KILN_OP_GELU), "approximate", ""), "tanh");
	kiln_tensor *y = run_iota(g, 1, (int64_t[]){8});
	double x = 1; /* element 6 */
	double want = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
	ck_assert_double_eq_tol(((float *)y->data)[6], want, 1e-6);
	kiln_tensor_free(y);
	kiln_graph_free(g);
	pool_free();
}
END_TEST

/* Pow's exponent may have another dtype: an integer base takes a float
 * power in floats (4 ^ 0.5 = 2, not 4 ^ 0) and gives the base's type. */
START_TEST(pow_integer_base_float_exponent_is_taken_in_floats)
{
	Onnx__ModelProto *m = model(15);
	input(m, "x", ONNX__TENSOR_PROTO__DATA_TYPE__INT32, "4");
	Onnx__TensorProto *e = tensor("e", F32, 0, NULL);
	e->n_float_data = 1, e->float_data = A(sizeof(float)), e->float_data[0] = 0.5f;
	PUSH(m->graph->initializer, m->graph->n_initializer, e);
	node(m, "Pow", "x,e", "y", "p");
	output(m, "y");
	kiln_graph *g = import_ok(m);
	kiln_tensor *x = kiln_tensor_new(KILN_I32, 1, (int64_t[]){4}), *y = NULL;
	memcpy(x->data, (int32_t[]){4, 9, 2, 3}, 4 * sizeof(int32_t));
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_run(g, &x, 1, &y, 1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(y->dtype, KILN_I32);
	int32_t *v = y->data;
	ck_assert_msg(v[0] == 2 && v[1] == 3 && v[2] == 1 && v[3] == 1, "got %d %d %d %d", v[0],
	              v[1], v[2], v[3]);
	kiln_tensor_free(x), kiln_tensor_free(y);
	kiln_graph_free(g);
	pool_free();
}
END_TEST

/* Integer Pow is exact (3^39 does not fit a double's mantissa). */
START_TEST(pow_of_integers_is_exact)
{
	Onnx__ModelProto *m = model(15);
	input(m, "x", I64, "3");
	init_i64(m, "e", 3, (int64_t[]){39, 3, 0});
	node(m, "Pow", "x,e", "y", "p");
	output(m, "y");
	kiln_graph *g = import_ok(m);
	kiln_tensor *x = kiln_tensor_new(KILN_I64, 1, (int64_t[]){3}), *y = NULL;
	memcpy(x->data, (int64_t[]){3, -2, 7}, 3 * sizeof(int64_t));
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_run(g, &x, 1, &y, 1, &err) == KILN_OK, "%s", err.msg);
	int64_t *v = y->data;
	ck_assert_int_eq(v[0], INT64_C(4052555153018976267));
	ck_assert_int_eq(v[1], -8);
	ck_assert_int_eq(v[2], 1);
	kiln_tensor_free(x), kiln_tensor_free(y);
	kiln_graph_free(g);
	pool_free();
}
END_TEST

/* An attribute spelling out its default imports as if left out, so the
 * two models give the same .kir (and export -> import gives it back). */
START_TEST(defaults_spelled_out_import_like_defaults_left_out)
{
	char *k[2];
	for (int spelled = 0; spelled < 2; spelled++) {
		Onnx__ModelProto *m = model(13);
		input(m, "x", F32, "2,3");
		Onnx__NodeProto *a = node(m, "LeakyRelu", "x", "a", "lr");
		Onnx__NodeProto *b = node(m, "Softmax", "a", "b", "sm");
		Onnx__NodeProto *c = node(m, "ArgMax", "b", "y", "am");
		if (spelled) {
			attr_f(a, "alpha", 0.01f);
			attr_i(b, "axis", -1);
			attr_i(c, "keepdims", 1);
		}
		attr_i(c, "axis", 1); /* not the default: kept */
		output(m, "y");
		kiln_graph *g = import_ok(m);
		k[spelled] = kiln_graph_to_kir(g);
		kiln_graph_free(g);
		pool_free();
	}
	ck_assert_str_eq(k[0], k[1]);
	ck_assert_ptr_nonnull(strstr(k[0], "argmax %b {axis=1}"));
	free(k[0]), free(k[1]);
}
END_TEST

/* ---- dims ---------------------------------------------------------------- */

START_TEST(dim_param_is_a_symbol_and_missing_dim_a_fresh_one)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "N,?,4");
	node(m, "Relu", "x", "y", NULL);
	output(m, "y");
	kiln_graph *g = import_ok(m);
	const ir_type *t = &g->val[g->input[0]]->type;
	char buf[128];
	ck_assert_str_eq(ir_type_str(g, t, buf, sizeof buf), "f32[N,x_1,4]");
	ck_assert_int_eq(ir_dim_nsym(g), 2);
	ck_assert_str_eq(g->val[g->output[0]]->name, "y");
	kiln_graph_free(g);
	pool_free();
}
END_TEST

/* ---- initializers ------------------------------------------------------------ */

/* y = x + w with w in float_data or raw_data: the same param. */
static const float add_w[4] = {0.5f, -1.0f, 2.25f, 3.0f};

static Onnx__ModelProto *add_proto(bool raw, const char *ext_location)
{
	const float *w = add_w;
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "4");
	Onnx__TensorProto *t = tensor("w", F32, 1, (int64_t[]){4});
	if (ext_location) {
		Onnx__StringStringEntryProto *e = A(sizeof *e);
		onnx__string_string_entry_proto__init(e);
		e->key = S("location"), e->value = S(ext_location);
		PUSH(t->external_data, t->n_external_data, e);
		t->has_data_location = 1;
		t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
	} else if (raw) {
		t->has_raw_data = 1, t->raw_data.len = sizeof add_w;
		t->raw_data.data = memcpy(A(sizeof add_w), w, sizeof add_w);
	} else {
		t->n_float_data = 4, t->float_data = memcpy(A(sizeof add_w), w, sizeof add_w);
	}
	PUSH(m->graph->initializer, m->graph->n_initializer, t);
	node(m, "Add", "x,w", "y", NULL);
	output(m, "y");
	return m;
}

/* Writes dir/model.onnx (w's data external, at ext_location) and dir/w.bin. */
static void write_ext_model(const char *dir, const char *ext_location)
{
	Onnx__ModelProto *m = add_proto(false, ext_location);
	char path[600];
	mkdir(dir, 0755);
	snprintf(path, sizeof path, "%s/w.bin", dir);
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	fwrite(add_w, sizeof add_w, 1, f);
	fclose(f);
	snprintf(path, sizeof path, "%s/model.onnx", dir);
	size_t n = onnx__model_proto__get_packed_size(m);
	uint8_t *buf = A(n);
	onnx__model_proto__pack(m, buf);
	f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	fwrite(buf, n, 1, f);
	fclose(f);
}

static kiln_graph *add_model(bool raw, const char *ext_location)
{
	if (!ext_location)
		return import_ok(add_proto(raw, NULL));
	/* external data needs a file next to the model */
	char dir[512], path[600];
	snprintf(dir, sizeof dir, "%s/onnx_import_test", KILN_BIN);
	write_ext_model(dir, ext_location);
	snprintf(path, sizeof path, "%s/model.onnx", dir);
	kiln_graph *g = NULL;
	kiln_error err = {0};
	kiln_onnx_import(path, &g, &err);
	if (!g)
		ck_assert_msg(strstr(err.msg, "must be a relative path"), "%s", err.msg);
	return g;
}

static void assert_w(kiln_graph *g)
{
	const ir_value *w = g->val[kiln_graph_find_param(g, "w")];
	ck_assert_int_eq(w->kind, IR_V_PARAM);
	ck_assert_int_eq(w->data->shape[0], 4);
	ck_assert_float_eq(((float *)w->data->data)[2], 2.25f);
	kiln_tensor *y = run_iota(g, 1, (int64_t[]){4});
	ck_assert_float_eq(((float *)y->data)[3], -2 + 3.0f);
	kiln_tensor_free(y);
	kiln_graph_free(g);
}

START_TEST(raw_and_typed_initializers_give_the_same_param)
{
	assert_w(add_model(false, NULL));
	assert_w(add_model(true, NULL));
	pool_free();
}
END_TEST

START_TEST(external_data_is_read_next_to_the_model)
{
	assert_w(add_model(false, "w.bin"));
	pool_free();
}
END_TEST

START_TEST(external_data_outside_the_model_folder_is_refused)
{
	ck_assert_ptr_null(add_model(false, "../w.bin"));
	ck_assert_ptr_null(add_model(false, "/etc/passwd"));
	pool_free();
}
END_TEST

/* A scratch folder holding a model whose external data is at loc, and
 * what importing it gave. */
static char ext_dir[64];

static kiln_status import_ext(const char *loc, kiln_graph **g, kiln_error *err)
{
	char path[128];
	snprintf(path, sizeof path, "%s/model.onnx", ext_dir);
	write_ext_model(ext_dir, loc);
	return kiln_onnx_import(path, g, err);
}

static void ext_setup(void)
{
	strcpy(ext_dir, "/tmp/kiln_ext_XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(ext_dir));
}

static void ext_teardown(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", ext_dir);
	ck_assert_int_eq(system(cmd), 0);
}

/* A symbolic link in the model's folder to a file outside it is refused,
 * whatever the file holds (it used to be read as the weights). */
START_TEST(external_data_symlink_out_of_the_folder_is_refused)
{
	char sub[96], out[128], link[128];
	FILE *f;
	snprintf(out, sizeof out, "%s/secret.bin", ext_dir);
	ck_assert_ptr_nonnull(f = fopen(out, "wb"));
	fwrite(add_w, sizeof add_w, 1, f);
	fclose(f);
	snprintf(sub, sizeof sub, "%s/model", ext_dir);
	mkdir(sub, 0755);
	snprintf(link, sizeof link, "%s/link.bin", sub);
	ck_assert_int_eq(symlink(out, link), 0);
	char saved[sizeof ext_dir];
	strcpy(saved, ext_dir);
	strcpy(ext_dir, sub);
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(import_ext("link.bin", &g, &err), KILN_EINVAL);
	ck_assert_ptr_null(g);
	ck_assert_msg(strstr(err.msg, "tensor 'w'") && strstr(err.msg, "outside the folder") &&
	              strstr(err.msg, "secret.bin"), "%s", err.msg);
	/* a link to a folder outside is no way round it */
	snprintf(link, sizeof link, "%s/up", sub);
	ck_assert_int_eq(symlink(saved, link), 0);
	ck_assert_int_eq(import_ext("up/secret.bin", &g, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "outside the folder"), "%s", err.msg);
	/* nor a link to /etc/passwd */
	snprintf(link, sizeof link, "%s/passwd.bin", sub);
	ck_assert_int_eq(symlink("/etc/passwd", link), 0);
	ck_assert_int_eq(import_ext("passwd.bin", &g, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "outside the folder"), "%s", err.msg);
	strcpy(ext_dir, saved);
	pool_free();
}
END_TEST

/* A link that stays inside the folder is followed; ".." inside a name is
 * no escape, only a ".." component is. */
START_TEST(external_data_symlink_inside_the_folder_is_read)
{
	char link[128];
	snprintf(link, sizeof link, "%s/link.bin", ext_dir);
	ck_assert_int_eq(symlink("w.bin", link), 0);
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(import_ext("link.bin", &g, &err) == KILN_OK, "%s", err.msg);
	assert_w(g);
	snprintf(link, sizeof link, "%s/w..v2.bin", ext_dir);
	ck_assert_int_eq(symlink("w.bin", link), 0);
	ck_assert_msg(import_ext("./w..v2.bin", &g, &err) == KILN_OK, "%s", err.msg);
	assert_w(g);
	ck_assert_int_eq(import_ext("sub/../w.bin", &g, &err), KILN_EINVAL);
	ck_assert_msg(strstr(err.msg, "must be a relative path inside the folder"), "%s", err.msg);
	pool_free();
}
END_TEST

static void on_alarm(int sig)
{
	(void)sig;
	static const char msg[] = "a FIFO made the importer hang\n";
	ssize_t r = write(2, msg, sizeof msg - 1);
	(void)r;
	_exit(3);
}

/* A FIFO as the model or as its external data is refused at once; the
 * alarm fails the test instead of letting it hang. */
START_TEST(fifos_are_refused_without_blocking)
{
	signal(SIGALRM, on_alarm);
	alarm(10);
	char fifo[128], path[128];
	snprintf(fifo, sizeof fifo, "%s/fifo.bin", ext_dir);
	ck_assert_int_eq(mkfifo(fifo, 0644), 0);
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(import_ext("fifo.bin", &g, &err), KILN_EIO);
	ck_assert_msg(strstr(err.msg, "tensor 'w'") && strstr(err.msg, "not a regular file (a FIFO)"),
	              "%s", err.msg);
	ck_assert_ptr_null(g);
	snprintf(path, sizeof path, "%s/fifo.onnx", ext_dir);
	ck_assert_int_eq(mkfifo(path, 0644), 0);
	ck_assert_int_eq(kiln_onnx_import(path, &g, &err), KILN_EIO);
	ck_assert_msg(strstr(err.msg, "fifo.onnx: cannot read") && strstr(err.msg, "FIFO"), "%s",
	              err.msg);
	ck_assert_ptr_null(g);
	/* a folder is not data either */
	snprintf(path, sizeof path, "%s/sub", ext_dir);
	mkdir(path, 0755);
	ck_assert_int_eq(import_ext("sub", &g, &err), KILN_EIO);
	ck_assert_msg(strstr(err.msg, "directory"), "%s", err.msg);
	alarm(0);
	signal(SIGALRM, SIG_DFL);
	pool_free();
}
END_TEST

START_TEST(raw_data_of_the_wrong_size_is_an_error)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "4");
	Onnx__TensorProto *t = tensor("w", F32, 1, (int64_t[]){4});
	t->has_raw_data = 1, t->raw_data.len = 8, t->raw_data.data = A(8);
	PUSH(m->graph->initializer, m->graph->n_initializer, t);
	node(m, "Add", "x,w", "y", NULL);
	output(m, "y");
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(import(m, &g, &err), KILN_EPARSE);
	ck_assert_str_eq(err.msg, "t.onnx: initializer: tensor 'w': raw_data has 8 bytes, its "
	                 "shape needs 16");
	pool_free();
}
END_TEST

/* ---- folding -------------------------------------------------------------- */

/* y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): the shape
 * arithmetic folds into one reshape attribute and disappears. */
START_TEST(shape_gather_concat_reshape_chain_folds)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "2,3,4");
	init_i64(m, "zero", 1, (int64_t[]){0});
	init_i64(m, "minus1", 1, (int64_t[]){-1});
	node(m, "Shape", "x", "s", NULL);
	Onnx__NodeProto *ga = node(m, "Gather", "s,zero", "n", NULL);
	attr_i(ga, "axis", 0);
	Onnx__NodeProto *c = node(m, "Concat", "n,minus1", "shape", NULL);
	attr_i(c, "axis", 0);
	node(m, "Reshape", "x,shape", "y", "flat");
	output(m, "y");
	kiln_graph *g = import_ok(m);
	ck_assert_int_eq(g->nnode, 1);
	assert_ints(only_node(g, KILN_OP_RESHAPE), "shape", 2, (int64_t[]){2, -1});
	kiln_tensor *y = run_iota(g, 3, (int64_t[]){2, 3, 4});
	ck_assert_int_eq(y->shape[0], 2);
	ck_assert_int_eq(y->shape[1], 12);
	kiln_tensor_free(y);
	kiln_graph_free(g);
	pool_free();
}
END_TEST

/* With a symbolic batch the chain is not constant, but its elements are
 * dims: [N, -1] becomes Reshape's static [0, -1] ("copy N"). */
START_TEST(symbolic_shape_chain_becomes_copy_and_infer)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "N,3,4");
	init_i64(m, "zero", 1, (int64_t[]){0});
	init_i64(m, "minus1", 1, (int64_t[]){-1});
	node(m, "Shape", "x", "s", NULL);
	node(m, "Gather", "s,zero", "n", NULL);
	attr_i(node(m, "Concat", "n,minus1", "shape", NULL), "axis", 0);
	node(m, "Reshape", "x,shape", "y", NULL);
	output(m, "y");
	kiln_graph *g = import_ok(m);
	ck_assert_int_eq(g->nnode, 1);
	assert_ints(only_node(g, KILN_OP_RESHAPE), "shape", 2, (int64_t[]){0, -1});
	char buf[64];
	ck_assert_str_eq(ir_type_str(g, &g->val[g->output[0]]->type, buf, sizeof buf),
	                 "f32[N,12]");
	kiln_graph_free(g);
	pool_free();
}
END_TEST

/* [3, N, N] cannot be said with 0 and -1, so Reshape keeps the dims
 * themselves (shape's kind is ds); from [N, 3] that is the wrong element
 * count, which shape inference reports with the dims by name. */
START_TEST(symbolic_shape_of_another_count_is_rejected)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "N,3");
	init_i64(m, "three", 1, (int64_t[]){3});
	init_i64(m, "zero", 1, (int64_t[]){0});
	node(m, "Shape", "x", "s", NULL);
	node(m, "Gather", "s,zero", "n", NULL);
	attr_i(node(m, "Concat", "three,n,n", "shape", NULL), "axis", 0);
	node(m, "Reshape", "x,shape", "y", "r");
	output(m, "y");
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(import(m, &g, &err), KILN_ESHAPE);
	ck_assert_str_eq(err.msg, "t.onnx: Reshape 'r' (domain ai.onnx, opset 13): cannot "
	                 "reshape f32[N,3] to [3,N,N]: element count differs");
	pool_free();
}
END_TEST

/* An int64 scalar initializer. */
static void scalar_i64(Onnx__ModelProto *m, const char *name, int64_t v)
{
	Onnx__TensorProto *t = tensor(name, I64, 0, NULL);
	t->n_int64_data = 1, t->int64_data = A(sizeof v);
	t->int64_data[0] = v;
	PUSH(m->graph->initializer, m->graph->n_initializer, t);
}

/* ids: i64[N,S]; S = Shape(ids)[1] as a scalar (Gather at a scalar). */
static void seq_len(Onnx__ModelProto *m)
{
	input(m, "ids", I64, "N,S");
	scalar_i64(m, "one", 1);
	node(m, "Shape", "ids", "shp", NULL);
	node(m, "Gather", "shp,one", "s", NULL);
}

/* Range(0, S, 2) of a sequence length S: kiln's Range of (S+1)/2 elements;
 * Slice ends fed by Unsqueeze(S) keep S itself. */
START_TEST(symbolic_limit_and_end_become_dims)
{
	Onnx__ModelProto *m = model(13);
	seq_len(m);
	init_i64(m, "zero1", 1, (int64_t[]){0});
	init_i64(m, "table", 4, (int64_t[]){0, 0, 0, 0});
	scalar_i64(m, "z", 0);
	scalar_i64(m, "two", 2);
	node(m, "Range", "z,s,two", "r", NULL);
	node(m, "Unsqueeze", "s,zero1", "s1", NULL);
	node(m, "Slice", "table,zero1,s1", "t", NULL);
	output(m, "r");
	output(m, "t");
	kiln_graph *g = import_ok(m);
	char buf[64];
	ck_assert_str_eq(ir_type_str(g, &g->val[g->output[0]]->type, buf, sizeof buf),
	                 "i64[(S+1)/2]");
	ck_assert_str_eq(ir_type_str(g, &g->val[g->output[1]]->type, buf, sizeof buf), "i64[S]");
	ck_assert_double_eq(ir_attr_float(only_node(g, KILN_OP_RANGE), "delta", 1), 2);
	kiln_graph_free(g);
	pool_free();
}
END_TEST

/* From 1 to S the count would be S-1, which kiln's dims cannot say. */
START_TEST(symbolic_limit_from_another_start_is_reported)
{
	Onnx__ModelProto *m = model(13);
	seq_len(m);
	scalar_i64(m, "k1", 1);
	node(m, "Range", "k1,s,k1", "r", "pos");
	output(m, "r");
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(import(m, &g, &err), KILN_EUNSUPPORTED);
	ck_assert_str_eq(err.msg, "t.onnx: Range 'pos' (domain ai.onnx, opset 13): limit is the "
	                 "symbolic dim S: kiln takes that with start 0 and a positive integer "
	                 "delta, not start 1, delta 1");
	pool_free();
}
END_TEST

START_TEST(constant_node_feeds_unsqueeze_axes)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "3");
	Onnx__NodeProto *k = node(m, "Constant", "", "axes", NULL);
	attr_ints(k, "value_ints", 2, (int64_t[]){0, 2});
	node(m, "Unsqueeze", "x,axes", "y", NULL);
	output(m, "y");
	kiln_graph *g = import_ok(m);
	ck_assert_int_eq(g->nnode, 1);
	char buf[64];
	ck_assert_str_eq(ir_type_str(g, &g->val[g->output[0]]->type, buf, sizeof buf),
	                 "f32[1,3,1]");
	kiln_graph_free(g);
	pool_free();
}
END_TEST

/* ---- errors -------------------------------------------------------------- */

/* Three bad nodes, one error listing each on its own line; nodes reading a
 * failed node's output stay quiet. */
START_TEST(every_unsupported_node_is_listed_at_once)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "2,3");
	node(m, "Frobnicate", "x", "a", "f1");
	node(m, "Relu", "a", "b", "quiet");
	Onnx__NodeProto *c = node(m, "Relu", "x", "c", "r2");
	attr_i(c, "bogus", 1);
	Onnx__NodeProto *d = node(m, "Relu", "x", "d", NULL);
	d->domain = S("com.example");
	node(m, "Det", "b,c,d", "y", "s");
	output(m, "y");
	kiln_graph *g = NULL;
	kiln_error err = {0};
	char *report = NULL;
	size_t n = onnx__model_proto__get_packed_size(m);
	uint8_t *buf = A(n);
	onnx__model_proto__pack(m, buf);
	kiln_onnx_opts o = {"t.onnx", NULL, &report, NULL};
	ck_assert_int_eq(kiln_onnx_import_ex(buf, n, &o, &g, &err), KILN_EUNSUPPORTED);
	const char *want =
		"t.onnx: Frobnicate 'f1' (domain ai.onnx, opset 13): op is not in kiln's op table\n"
		"t.onnx: Relu 'r2' (domain ai.onnx, opset 13): attribute 'bogus' is not supported\n"
		"t.onnx: Relu (domain com.example, opset -1): domain 'com.example' is not supported "
		"(only the default ONNX domain and ONNX Runtime's quantized ops in com.microsoft "
		"are)\n"
		"t.onnx: Det 's' (domain ai.onnx, opset 13): op is not in kiln's op table";
	ck_assert_str_eq(err.msg, want);
	ck_assert_int_eq(strlen(report), strlen(want) + 1);
	ck_assert_ptr_null(g);
	free(report);
	pool_free();
}
END_TEST

/* An initializer of ONNX type `type` (float_data for FLOAT, int32_data
 * for the 8-bit and 32-bit integer types). */
static void init_t(Onnx__ModelProto *m, const char *name, int32_t type, int rank,
                   const int64_t *dims, const double *v)
{
	Onnx__TensorProto *t = tensor(name, type, rank, dims);
	size_t n = 1;
	for (int i = 0; i < rank; i++)
		n *= (size_t)dims[i];
	if (type == F32) {
		t->n_float_data = n, t->float_data = A(n * sizeof(float));
		for (size_t i = 0; i < n; i++)
			t->float_data[i] = (float)v[i];
	} else {
		t->n_int32_data = n, t->int32_data = A(n * sizeof(int32_t));
		for (size_t i = 0; i < n; i++)
			t->int32_data[i] = (int32_t)v[i];
	}
	PUSH(m->graph->initializer, m->graph->n_initializer, t);
}

#define U8 ONNX__TENSOR_PROTO__DATA_TYPE__UINT8
#define I8 ONNX__TENSOR_PROTO__DATA_TYPE__INT8
#define I32 ONNX__TENSOR_PROTO__DATA_TYPE__INT32

/* x f32[1,2,2,2] -> Q -> com.microsoft QLinearAdd (x + x) ->
 * QLinearGlobalAveragePool -> Flatten -> QGemm (transB, per-column
 * scales, i32 bias, no y_scale: f32 logits): ORT's QOperator ops. */
static Onnx__ModelProto *msft_model(void)
{
	Onnx__ModelProto *m = model(13);
	Onnx__OperatorSetIdProto *os = A(sizeof *os);
	onnx__operator_set_id_proto__init(os);
	os->domain = S("com.microsoft"), os->has_version = 1, os->version = 1;
	PUSH(m->opset_import, m->n_opset_import, os);
	input(m, "x", F32, "1,2,2,2");
	const int64_t d3[] = {3}, w32[] = {3, 2};
	init_t(m, "xs", F32, 0, NULL, (double[]){0.1}), init_t(m, "xz", U8, 0, NULL, (double[]){128});
	init_t(m, "cs", F32, 0, NULL, (double[]){0.25}), init_t(m, "cz", U8, 0, NULL, (double[]){100});
	init_t(m, "gs", F32, 0, NULL, (double[]){0.5}), init_t(m, "gz", U8, 0, NULL, (double[]){128});
	init_t(m, "w", I8, 2, w32, (double[]){1, 2, 3, -4, -5, 6});
	init_t(m, "ws", F32, 1, d3, (double[]){0.5, 0.25, 0.125});
	init_t(m, "wz", I8, 1, d3, (double[]){0, 0, 0});
	init_t(m, "bias", I32, 1, d3, (double[]){10, -20, 40});
	node(m, "QuantizeLinear", "x,xs,xz", "xq", "q");
	node(m, "QLinearAdd", "xq,xs,xz,xq,xs,xz,cs,cz", "c", "add")->domain = S("com.microsoft");
	node(m, "QLinearGlobalAveragePool", "c,cs,cz,gs,gz", "g", "gap")->domain = S("com.microsoft");
	node(m, "Flatten", "g", "gf", "flat");
	Onnx__NodeProto *qg = node(m, "QGemm", "gf,gs,gz,w,ws,wz,bias", "y", "fc");
	qg->domain = S("com.microsoft");
	attr_i(qg, "transB", 1);
	output(m, "y");
	return m;
}

/* They import as standard ops between DQ and Q and compute what ORT does:
 * x = -5..2 in steps of 1, so every quantization is exact; the channel
 * means of 2x are -7 and 1; the logits are ((-7, 1) . w[c]) * 0.5 * ws[c]
 * plus bias[c] * 0.5 * ws[c]: 0, -8.75, 7.625. */
START_TEST(msft_qoperator_ops_import_as_dq_op_q)
{
	Onnx__ModelProto *m = msft_model();
	kiln_graph *g = import_ok(m);
	ck_assert_int_eq(count_op(g, KILN_OP_ADD), 1);
	ck_assert_int_eq(count_op(g, KILN_OP_GLOBAL_AVERAGE_POOL), 1);
	ck_assert_int_eq(count_op(g, KILN_OP_GEMM), 1);
	ck_assert_int_eq(count_op(g, KILN_OP_QUANTIZE_LINEAR), 3);
	kiln_tensor *y = run_iota(g, 4, (int64_t[]){1, 2, 2, 2});
	const float *v = y->data, want[3] = {0, -8.75f, 7.625f};
	for (int i = 0; i < 3; i++)
		ck_assert_msg(fabsf(v[i] - want[i]) < 1e-5f, "y[%d] = %g, want %g", i, v[i], want[i]);
	ck_assert_str_eq(kiln_value_name(g, kiln_graph_output(g, 0)), "y");
	kiln_tensor_free(y);
	kiln_graph_free(g);
	/* NHWC pooling and other ops of the domain are named problems */
	m = msft_model();
	attr_i(m->graph->node[2], "channels_last", 1);
	m->graph->node[3]->op_type = S("QLinearFrob");
	m->graph->node[3]->domain = S("com.microsoft");
	kiln_error err = {0};
	ck_assert_int_eq(import(m, &g, &err), KILN_EUNSUPPORTED);
	ck_assert_msg(strstr(err.msg, "QLinearGlobalAveragePool 'gap' (domain com.microsoft, opset 1): "
	                              "channels_last=1 is not supported") &&
	              strstr(err.msg, "QLinearFrob 'flat' (domain com.microsoft, opset 1): op is "
	                              "not supported in domain com.microsoft"), "%s", err.msg);
	pool_free();
}
END_TEST

/* ArgMin of integers is ArgMax of -1 - x: INT64_MIN, which has no
 * negation, is still the minimum; select_last_index picks the last of equal
 * minima.  ReduceLogSumExp subtracts the maximum first: x = 1000 gives
 * 1000 + log 3, not inf. */
START_TEST(argmin_of_integers_and_logsumexp_of_large_values)
{
	for (int last = 0; last < 2; last++) {
		Onnx__ModelProto *m = model(13);
		input(m, "x", I64, "5");
		Onnx__NodeProto *n = node(m, "ArgMin", "x", "y", "am");
		attr_i(n, "select_last_index", last);
		output(m, "y");
		kiln_graph *g = import_ok(m);
		kiln_tensor *x = kiln_tensor_new(KILN_I64, 1, (int64_t[]){5}), *y = NULL;
		const int64_t v[5] = {7, INT64_MIN, 3, INT64_MIN, INT64_MAX};
		memcpy(x->data, v, sizeof v);
		kiln_error e = {0};
		ck_assert_msg(kiln_graph_run(g, &x, 1, &y, 1, &e) == KILN_OK, "%s", e.msg);
		ck_assert_int_eq(((int64_t *)y->data)[0], last ? 3 : 1);
		kiln_tensor_free(x), kiln_tensor_free(y), kiln_graph_free(g);
		pool_free();
	}
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "2,3");
	Onnx__NodeProto *n = node(m, "ReduceLogSumExp", "x", "y", "lse");
	attr_ints(n, "axes", 1, (int64_t[]){1});
	attr_i(n, "keepdims", 0);
	output(m, "y");
	kiln_graph *g = import_ok(m);
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 2, (int64_t[]){2, 3}), *y = NULL;
	const float v[6] = {1000, 1000, 1000, -1, 0, 1};
	memcpy(x->data, v, sizeof v);
	kiln_error e = {0};
	ck_assert_msg(kiln_graph_run(g, &x, 1, &y, 1, &e) == KILN_OK, "%s", e.msg);
	ck_assert_int_eq(y->rank, 1);
	ck_assert_float_eq_tol(((float *)y->data)[0], 1000 + logf(3), 1e-3);
	ck_assert_float_eq_tol(((float *)y->data)[1], logf(expf(-1) + 1 + expf(1)), 1e-5);
	kiln_tensor_free(x), kiln_tensor_free(y), kiln_graph_free(g);
	pool_free();
}
END_TEST

static void expect_import_error(Onnx__ModelProto *m, const char *want)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(import(m, &g, &err) != KILN_OK, "imported; wanted: %s", want);
	ck_assert_msg(strstr(err.msg, want), "want '%s', got: %s", want, err.msg);
	ck_assert_ptr_null(g);
}

/* ---- training mode: PyTorch's TrainingMode.TRAINING exports ------------------- */

/* x f32[2,2,1,2] -> BatchNormalization (scale, bias, mean, var initializers)
 * with outs, then Dropout(ratio 0.25, training_mode from tm: "" for none,
 * "t" for a graph input, "c" for a constant true) -> y. */
static Onnx__ModelProto *bn_model(int64_t opset, const char *outs, const char *tm)
{
	Onnx__ModelProto *m = model(opset);
	input(m, "x", F32, "2,2,1,2");
	int64_t c = 2;
	init_t(m, "s", F32, 1, &c, (double[]){1, 2});
	init_t(m, "b", F32, 1, &c, (double[]){0, 0.5});
	init_t(m, "bn.running_mean", F32, 1, &c, (double[]){0.5, -1});
	init_t(m, "bn.running_var", F32, 1, &c, (double[]){4, 0.25});
	init_t(m, "ratio", F32, 0, NULL, (double[]){0.25});
	Onnx__NodeProto *n = node(m, "BatchNormalization", "x,s,b,bn.running_mean,bn.running_var",
	                          outs, "bn");
	if (opset >= 14 && strchr(outs, ','))
		attr_i(n, "training_mode", 1);
	if (!strcmp(tm, "t")) {
		input(m, "t", ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, "");
	} else if (*tm) {
		init_t(m, "t", ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, 0, NULL, (double[]){1});
	}
	node(m, "Dropout", *tm ? "h,ratio,t" : "h,ratio", "y", "drop");
	output(m, "y");
	return m;
}

/* Opset 13 says training mode with outputs besides Y, opset 14 with the
 * attribute: the same graph, and the saved batch statistics (outputs 3
 * and 4 before 14, which kiln does not compute) may be named but not read. */
START_TEST(batchnorm_training_mode_before_and_from_opset14_agree)
{
	kiln_graph *a = import_ok(bn_model(13, "h,rm,rv,sm,sv", "c"));
	kiln_graph *b = import_ok(bn_model(14, "h,rm,rv", "c"));
	const ir_node *n = only_node(a, KILN_OP_BATCH_NORM);
	ck_assert_int_eq(ir_attr_int(n, "training_mode", 0), 1);
	ck_assert_int_eq(n->nout, 3);
	char *ka = kiln_graph_to_kir(a), *kb = kiln_graph_to_kir(b);
	ck_assert_str_eq(ka, kb);
	free(ka), free(kb);
	kiln_graph_free(a), kiln_graph_free(b);
	/* opset 13 with Y alone is inference */
	a = import_ok(bn_model(13, "h", "c"));
	ck_assert_int_eq(ir_attr_int(only_node(a, KILN_OP_BATCH_NORM), "training_mode", 0), 0);
	kiln_graph_free(a);
	Onnx__ModelProto *m = bn_model(13, "h,rm,rv,sm,sv", "c");
	node(m, "Identity", "sm", "z", "reads_saved_mean");
	output(m, "z");
	expect_import_error(m, "output 3 ('sm', the saved batch mean of opset 13's training mode) "
	                    "is read; kiln computes Y and the running mean and variance only");
	/* Dropout's training_mode must be known at import */
	expect_import_error(bn_model(14, "h", "t"), "input 2 ('t', the training_mode) is not a "
	                    "constant known at import");
	pool_free();
}
END_TEST

/* kiln_inference_graph_from_train: BatchNorm reads its running stats,
 * which become buffers, and Dropout is off; what kiln_train_graph_from_
 * inference derives from it is what it derives from the import itself. */
START_TEST(inference_graph_of_a_training_mode_export)
{
	kiln_graph *g = import_ok(bn_model(14, "h,rm,rv", "c")), *inf = NULL, *t1 = NULL, *t2 = NULL;
	kiln_error err = {0};
	int changed = -1;
	ck_assert_int_eq(ir_attr_int(only_node(g, KILN_OP_DROPOUT), "training_mode", 0), 1);
	ck_assert_msg(kiln_inference_graph_from_train(g, &inf, &changed, &err) == KILN_OK, "%s",
	              err.msg);
	ck_assert_int_eq(changed, 2);
	const ir_node *bn = only_node(inf, KILN_OP_BATCH_NORM);
	ck_assert_int_eq(ir_attr_int(bn, "training_mode", 0), 0);
	ck_assert_int_eq(bn->nout, 1);
	ck_assert(!inf->val[bn->in[3]]->trainable && !inf->val[bn->in[4]]->trainable);
	ck_assert(inf->val[bn->in[1]]->trainable);
	ck_assert_int_eq(ir_attr_int(only_node(inf, KILN_OP_DROPOUT), "training_mode", 1), 0);
	/* y = s (x - mean) / sqrt(var + eps) + b, no dropout */
	kiln_tensor *y = run_iota(inf, 4, (int64_t[]){2, 2, 1, 2});
	static const double s[] = {1, 2}, b[] = {0, 0.5}, mu[] = {0.5, -1}, var[] = {4, 0.25};
	for (int i = 0; i < 8; i++) {
		int ch = (i / 2) % 2;
		double want = s[ch] * ((i - 5) - mu[ch]) / sqrt(var[ch] + 1e-5) + b[ch];
		ck_assert_msg(fabs(((float *)y->data)[i] - want) < 1e-5, "y[%d] = %g, want %g", i,
		              ((float *)y->data)[i], want);
	}
	kiln_tensor_free(y);
	ck_assert_msg(kiln_train_graph_from_inference(g, 3, &t1, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_train_graph_from_inference(inf, 3, &t2, &err) == KILN_OK, "%s", err.msg);
	char *k1 = kiln_graph_to_kir(t1), *k2 = kiln_graph_to_kir(t2);
	ck_assert_str_eq(k1, k2);
	ck_assert_msg(strstr(k1, "bn.running_var.next") && strstr(k1, "training_mode=1"), "%s", k1);
	free(k1), free(k2);
	kiln_graph_free(t1), kiln_graph_free(t2), kiln_graph_free(inf), kiln_graph_free(g);
	/* a graph without training-mode nodes comes back as it is */
	g = import_ok(bn_model(14, "h", ""));
	ck_assert_int_eq(kiln_inference_graph_from_train(g, &inf, &changed, &err), KILN_OK);
	ck_assert_int_eq(changed, 0);
	k1 = kiln_graph_to_kir(g), k2 = kiln_graph_to_kir(inf);
	ck_assert_str_eq(k1, k2);
	free(k1), free(k2);
	kiln_graph_free(inf), kiln_graph_free(g);
	pool_free();
}
END_TEST

/* The ONNX-style running-stat outputs have no place in kiln's training
 * (its step updates the buffers PyTorch's way): one that is read is
 * refused, naming it, by both conversions. */
START_TEST(training_mode_running_stat_output_that_is_read_is_refused)
{
	Onnx__ModelProto *m = bn_model(14, "h,rm,rv", "c");
	output(m, "rv");
	kiln_graph *g = import_ok(m), *out = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(kiln_inference_graph_from_train(g, &out, NULL, &err), KILN_EUNSUPPORTED);
	ck_assert_ptr_null(out);
	const char *want = "output 2 ('rv', the ONNX-style updated running_var) is read by graph "
	                   "output 'rv'";
	ck_assert_msg(strstr(err.msg, want) && strstr(err.msg, "BatchNormalization"), "%s", err.msg);
	ck_assert_int_eq(kiln_train_graph_from_inference(g, 0, &out, &err), KILN_EUNSUPPORTED);
	ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
	ck_assert_ptr_null(out);
	kiln_graph_free(g);
	m = bn_model(14, "h,rm,rv", "c");
	node(m, "Neg", "rm", "z", "reads_running_mean");
	output(m, "z");
	g = import_ok(m);
	ck_assert_int_eq(kiln_inference_graph_from_train(g, &out, NULL, &err), KILN_EUNSUPPORTED);
	ck_assert_msg(strstr(err.msg, "output 1 ('rm', the ONNX-style updated running_mean) is read "
	                     "by Neg 'reads_running_mean'"), "%s", err.msg);
	kiln_graph_free(g);
	pool_free();
}
END_TEST

/* PyTorch's track_running_stats=False exports feed BatchNormalization
 * (training_mode=1) the batch's own statistics from ReduceMean: in both
 * modes it normalises with them, so the train-mode graph keeps it and has
 * no running stats to update. */
START_TEST(batchnorm_on_computed_statistics_trains_as_it_is)
{
	Onnx__ModelProto *m = model(14);
	input(m, "x", F32, "N,2,3");
	int64_t c = 2;
	init_t(m, "s", F32, 1, &c, (double[]){1, 2});
	init_t(m, "b", F32, 1, &c, (double[]){0, 0.5});
	node(m, "Transpose", "x", "xt", "t");
	attr_ints(m->graph->node[0], "perm", 3, (int64_t[]){0, 2, 1});
	Onnx__NodeProto *r = node(m, "ReduceMean", "xt", "mean", "mean");
	attr_ints(r, "axes", 2, (int64_t[]){0, 1}), attr_i(r, "keepdims", 0);
	r = node(m, "ReduceMean", "xt", "mk", "mean_keep");
	attr_ints(r, "axes", 2, (int64_t[]){0, 1});
	node(m, "Sub", "xt,mk", "d", "sub");
	node(m, "Mul", "d,d", "d2", "sq");
	r = node(m, "ReduceMean", "d2", "var", "var");
	attr_ints(r, "axes", 2, (int64_t[]){0, 1}), attr_i(r, "keepdims", 0);
	Onnx__NodeProto *n = node(m, "BatchNormalization", "x,s,b,mean,var", "y,o1,o2", "bn");
	attr_i(n, "training_mode", 1);
	output(m, "y");
	kiln_graph *g = import_ok(m), *inf = NULL, *t = NULL;
	kiln_error err = {0};
	kiln_tensor *want = run_iota(g, 3, (int64_t[]){2, 2, 3});
	ck_assert_msg(kiln_inference_graph_from_train(g, &inf, NULL, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor *got = run_iota(inf, 3, (int64_t[]){2, 2, 3});
	for (int i = 0; i < 12; i++)
		ck_assert_msg(fabs(((float *)got->data)[i] - ((float *)want->data)[i]) < 1e-5,
		              "y[%d]: %g, training mode %g", i, ((float *)got->data)[i],
		              ((float *)want->data)[i]);
	ck_assert_msg(kiln_train_graph_from_inference(inf, 0, &t, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(kiln_graph_num_outputs(t), 1);
	kiln_tensor_free(want), kiln_tensor_free(got);
	kiln_graph_free(t), kiln_graph_free(inf), kiln_graph_free(g);
	pool_free();
}
END_TEST

/* The ops imported as compositions say what they need when a model does
 * not give it: dims known at import, constants, shapes that fit. */
START_TEST(composites_refuse_what_they_cannot_know)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "N,3");
	init_i64(m, "reps", 2, (int64_t[]){2, 2});
	node(m, "Tile", "x,reps", "y", "t");
	output(m, "y");
	expect_import_error(m, "Tile 't' (domain ai.onnx, opset 13): Tile needs dim 0 of its input "
	                       "to be a number, not a symbol");
	m = model(13);
	input(m, "lim", I64, "");
	init_i64(m, "zero", 1, (int64_t[]){0});
	node(m, "Squeeze", "zero", "z", "sq");
	node(m, "Range", "z,lim,z", "y", "r");
	output(m, "y");
	expect_import_error(m, "input 1 ('lim', the limit) is not a constant known at import");
	m = model(13);
	init_i64(m, "shape", 2, (int64_t[]){-1, 2});
	node(m, "ConstantOfShape", "shape", "y", "c");
	output(m, "y");
	expect_import_error(m, "ConstantOfShape 'c' (domain ai.onnx, opset 13): shape[0] is -1");
	m = model(13);
	input(m, "x", F32, "1,4,2,2");
	attr_i(node(m, "DepthToSpace", "x", "y", "d2s"), "blocksize", 3);
	output(m, "y");
	expect_import_error(m, "4 channels do not split into blocks of 9");
	pool_free();
}
END_TEST

/* Einsum over a symbolic batch letter (MaxViT's window attention:
 * "bghij,bghjd->bghid" with b the batch N): the batched MatMul's reshapes
 * infer the one symbolic extent, checked against the sum at two batches;
 * two symbolic letters in one reshape are refused by name. */
START_TEST(einsum_with_a_symbolic_batch_letter)
{
	Onnx__ModelProto *m = model(13);
	input(m, "z", F32, "Z"); /* N is not the first symbol (whose dim reads as -1) */
	input(m, "a", F32, "N,2,3");
	input(m, "b", F32, "N,3,4");
	attr_s(node(m, "Einsum", "a,b", "y", "es"), "equation", "b i j, b j k -> b k i");
	node(m, "Identity", "z", "z2", "keep");
	output(m, "y");
	output(m, "z2");
	kiln_graph *g = import_ok(m);
	for (int64_t n = 2; n <= 3; n++) {
		kiln_tensor *x[3] = {kiln_tensor_new(KILN_F32, 1, (int64_t[]){1}),
		                     kiln_tensor_new(KILN_F32, 3, (int64_t[]){n, 2, 3}),
		                     kiln_tensor_new(KILN_F32, 3, (int64_t[]){n, 3, 4})}, *y[2] = {0};
		float *a = x[1]->data, *b = x[2]->data;
		((float *)x[0]->data)[0] = 1;
		for (int64_t i = 0; i < n * 6; i++)
			a[i] = (float)((i * 7) % 5) - 2;
		for (int64_t i = 0; i < n * 12; i++)
			b[i] = (float)((i * 3) % 7) - 3;
		kiln_error e = {0};
		ck_assert_msg(kiln_graph_run(g, x, 3, y, 2, &e) == KILN_OK, "%s", e.msg);
		ck_assert_int_eq(y[0]->rank, 3);
		ck_assert_int_eq(y[0]->shape[0], n);
		ck_assert_int_eq(y[0]->shape[1], 4);
		ck_assert_int_eq(y[0]->shape[2], 2);
		for (int64_t bb = 0; bb < n; bb++)
			for (int k = 0; k < 4; k++)
				for (int i = 0; i < 2; i++) {
					float want = 0;
					for (int j = 0; j < 3; j++)
						want += a[bb * 6 + i * 3 + j] * b[bb * 12 + j * 4 + k];
					ck_assert_float_eq_tol(((float *)y[0]->data)[bb * 8 + k * 2 + i], want,
					                       1e-5);
				}
		for (int i = 0; i < 3; i++)
			kiln_tensor_free(x[i]);
		kiln_tensor_free(y[0]), kiln_tensor_free(y[1]);
	}
	kiln_graph_free(g);
	pool_free();
	m = model(13);
	input(m, "a", F32, "N,M,3");
	input(m, "b", F32, "N,3,4");
	attr_s(node(m, "Einsum", "a,b", "y", "es2"), "equation", "bij,bjk->bik");
	output(m, "y");
	expect_import_error(m, "more than one symbolic extent");
	pool_free();
}
END_TEST

/* MaxPool's Indices: flat indices into the whole x (the plane's offset
 * n*C*H*W + c*H*W included), of the first tap holding the window's max
 * (ties: the earlier tap), never a padded one, row major or with
 * storage_order 1 column major within the plane; the interpreter and the
 * compiled library against a loop written here, on N = 2, C = 3 with
 * padding, a stride and repeated values. */
START_TEST(maxpool_indices_interpreted_and_compiled)
{
	enum { N = 2, C = 3, H = 5, W = 4, OH = 3, OW = 2 };
	float xv[N * C * H * W];
	for (int i = 0; i < N * C * H * W; i++)
		xv[i] = (float)((i * 7) % 5) - (i % 11 == 0 ? 9 : 0); /* many ties */
	for (int order = 0; order < 2; order++) {
		Onnx__ModelProto *m = model(12);
		input(m, "x", F32, "2,3,5,4");
		Onnx__NodeProto *n = node(m, "MaxPool", "x", "y,i", "mp");
		attr_ints(n, "kernel_shape", 2, (int64_t[]){3, 2});
		attr_ints(n, "pads", 4, (int64_t[]){1, 0, 1, 0});
		attr_ints(n, "strides", 2, (int64_t[]){2, 2});
		if (order)
			attr_i(n, "storage_order", 1);
		output(m, "y");
		output(m, "i");
		kiln_graph *g = import_ok(m);
		/* the reference: strictly greater replaces, taps in order */
		int64_t want[N * C * OH * OW];
		float wantv[N * C * OH * OW];
		for (int p = 0; p < N * C; p++)
			for (int oh = 0; oh < OH; oh++)
				for (int ow = 0; ow < OW; ow++) {
					float best = -INFINITY;
					int64_t at = -1;
					for (int kh = 0; kh < 3; kh++)
						for (int kw = 0; kw < 2; kw++) {
							int h = oh * 2 - 1 + kh, w = ow * 2 + kw;
							if (h < 0 || h >= H || w >= W)
								continue;
							float v = xv[p * H * W + h * W + w];
							if (v > best) {
								best = v;
								at = order ? h + (int64_t)w * H : (int64_t)h * W + w;
							}
						}
					want[(p * OH + oh) * OW + ow] = p * H * W + at;
					wantv[(p * OH + oh) * OW + ow] = best;
				}
		char dir[] = "/tmp/kiln_mpidx_XXXXXX", so[64];
		ck_assert_ptr_nonnull(mkdtemp(dir));
		snprintf(so, sizeof so, "%s/mp.so", dir);
		kiln_error e = {0};
		ck_assert_msg(kiln_compile(g, so, NULL, &e) == KILN_OK, "%s", e.msg);
		kiln_model *lib = NULL;
		ck_assert_msg(kiln_load(so, &lib, &e) == KILN_OK, "%s", e.msg);
		for (int path = 0; path < 2; path++) {
			kiln_tensor *x = kiln_tensor_new(KILN_F32, 4, (int64_t[]){N, C, H, W});
			kiln_tensor *y[2] = {0};
			memcpy(x->data, xv, sizeof xv);
			kiln_status st = path ? kiln_model_run(lib, &x, 1, y, 2, &e)
			                      : kiln_graph_run(g, &x, 1, y, 2, &e);
			ck_assert_msg(st == KILN_OK, "%s", e.msg);
			ck_assert_int_eq(y[1]->dtype, KILN_I64);
			ck_assert_int_eq(kiln_tensor_numel(y[1]), N * C * OH * OW);
			for (int i = 0; i < N * C * OH * OW; i++) {
				ck_assert_msg(((int64_t *)y[1]->data)[i] == want[i], "%s order %d: index "
				              "[%d] %lld, want %lld", path ? "compiled" : "interpreted", order,
				              i, (long long)((int64_t *)y[1]->data)[i], (long long)want[i]);
				ck_assert_float_eq(((float *)y[0]->data)[i], wantv[i]);
			}
			kiln_tensor_free(x), kiln_tensor_free(y[0]), kiln_tensor_free(y[1]);
		}
		kiln_model_free(lib);
		unlink(so);
		snprintf(so, sizeof so, "%s/mp.h", dir);
		unlink(so);
		rmdir(dir);
		kiln_graph_free(g);
		pool_free();
	}
}
END_TEST

/* torch's expand(N, -1, -1) of a class token, as ViT exports it: the
 * target shape is Where(Equal(shape, -1), 1, shape) over
 * Concat(Shape(x)[0], -1, -1) reshaped; the symbolic shape arithmetic
 * follows it, and the Expand broadcasts the token's 1 to the batch N. */
START_TEST(expand_to_the_batch_through_where_and_equal)
{
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "N,4");
	init_t(m, "tok", F32, 3, (int64_t[]){1, 1, 3}, (double[]){1.5, -2, 0.25});
	init_i64(m, "zero", 1, (int64_t[]){0});
	init_i64(m, "minus1", 1, (int64_t[]){-1});
	init_i64(m, "flat", 1, (int64_t[]){-1});
	init_i64(m, "three", 1, (int64_t[]){3});
	node(m, "Shape", "x", "s", "shape");
	node(m, "Gather", "s,zero", "n", "batch");
	attr_i(node(m, "Concat", "n,minus1,minus1", "c", "cat"), "axis", 0);
	node(m, "Reshape", "c,flat", "t", "vec");
	node(m, "Equal", "t,minus1", "e", "eq");
	Onnx__NodeProto *k = node(m, "ConstantOfShape", "three", "ones", "ones");
	Onnx__AttributeProto *a = attr(k, "value", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR);
	a->t = tensor("v", I64, 1, (int64_t[]){1});
	a->t->n_int64_data = 1, a->t->int64_data = A(sizeof(int64_t)), a->t->int64_data[0] = 1;
	node(m, "Where", "e,ones,t", "w", "where");
	node(m, "Expand", "tok,w", "y", "expand");
	output(m, "y");
	kiln_graph *g = import_ok(m);
	const ir_type *yt = &g->val[kiln_graph_output(g, 0)]->type;
	ck_assert_int_eq(yt->rank, 3);
	ck_assert_int_lt(yt->dim[0], 0); /* the symbol N */
	ck_assert_int_eq(yt->dim[2], 3);
	kiln_tensor *y = run_iota(g, 2, (int64_t[]){2, 4});
	ck_assert_int_eq(y->shape[0], 2);
	const float *v = y->data, tok[3] = {1.5f, -2, 0.25f};
	for (int i = 0; i < 6; i++)
		ck_assert_float_eq(v[i], tok[i % 3]);
	kiln_tensor_free(y), kiln_graph_free(g);
	pool_free();
}
END_TEST

/* ---- recurrent ops (unrolled at import) ----------------------------------- */

enum { RS = 3, RB = 2, RI = 2, RH = 2 }; /* steps, batch, input, hidden */

static double lstm_w(int dir, int k, int j) { return 0.3 * sin(1.0 + dir + 0.7 * k + 1.3 * j); }
static double lstm_r(int dir, int k, int j) { return 0.4 * cos(2.0 + dir + 0.9 * k - 0.5 * j); }
static double lstm_b(int dir, int k) { return 0.1 * (k % 5) - 0.2 + 0.05 * dir; }
static double lstm_x(int t, int b, int i) { return 0.5 * t - 0.8 * b + 0.3 * i - 0.2; }
static double sigm(double v) { return 1 / (1 + exp(-v)); }

/* A bidirectional LSTM over RS steps with sequence_lens {3, 1}: an
 * initializer (masks known at import) or a graph input (compared at run
 * time).  y, yh, yc get what ONNX defines, computed here step by step:
 * past a row's length Y is 0 and H, C keep their last value (the reverse
 * pass starts at the row's last step). */
static void lstm_ref(const int32_t *lens, float *y, float *yh, float *yc)
{
	for (int dir = 0; dir < 2; dir++)
		for (int b = 0; b < RB; b++) {
			double h[RH] = {0}, c[RH] = {0};
			for (int s = 0; s < RS; s++) {
				int t = dir ? RS - 1 - s : s;
				for (int j = 0; j < RH; j++)
					y[((t * 2 + dir) * RB + b) * RH + j] = 0;
				if (t >= lens[b])
					continue;
				double g[4 * RH], nh[RH];
				for (int k = 0; k < 4 * RH; k++) {
					g[k] = lstm_b(dir, k) + lstm_b(dir, k + 4 * RH);
					for (int i = 0; i < RI; i++)
						g[k] += lstm_w(dir, k, i) * lstm_x(t, b, i);
					for (int j = 0; j < RH; j++)
						g[k] += lstm_r(dir, k, j) * h[j];
				}
				for (int j = 0; j < RH; j++) { /* gates i, o, f, c */
					c[j] = sigm(g[2 * RH + j]) * c[j] + sigm(g[j]) * tanh(g[3 * RH + j]);
					nh[j] = sigm(g[RH + j]) * tanh(c[j]);
				}
				for (int j = 0; j < RH; j++)
					h[j] = nh[j], y[((t * 2 + dir) * RB + b) * RH + j] = (float)h[j];
			}
			for (int j = 0; j < RH; j++)
				yh[(dir * RB + b) * RH + j] = (float)h[j], yc[(dir * RB + b) * RH + j] = (float)c[j];
		}
}

/* lens_dims: the graph input's dims, or NULL for an initializer. */
static Onnx__ModelProto *lstm_model(const char *xdims, const char *lens_dims, const int32_t *lens)
{
	Onnx__ModelProto *m = model(14);
	double w[2 * 4 * RH * RI], r[2 * 4 * RH * RH], bias[2 * 8 * RH];
	for (int dir = 0; dir < 2; dir++) {
		for (int k = 0; k < 4 * RH; k++) {
			for (int i = 0; i < RI; i++)
				w[(dir * 4 * RH + k) * RI + i] = lstm_w(dir, k, i);
			for (int j = 0; j < RH; j++)
				r[(dir * 4 * RH + k) * RH + j] = lstm_r(dir, k, j);
		}
		for (int k = 0; k < 8 * RH; k++)
			bias[dir * 8 * RH + k] = lstm_b(dir, k);
	}
	input(m, "x", F32, xdims);
	init_t(m, "w", F32, 3, (int64_t[]){2, 4 * RH, RI}, w);
	init_t(m, "r", F32, 3, (int64_t[]){2, 4 * RH, RH}, r);
	init_t(m, "b", F32, 2, (int64_t[]){2, 8 * RH}, bias);
	if (lens_dims)
		input(m, "lens", I32, lens_dims);
	else
		init_t(m, "lens", I32, 1, (int64_t[]){RB}, (double[]){lens[0], lens[1]});
	Onnx__NodeProto *n = node(m, "LSTM", "x,w,r,b,lens", "y,yh,yc", "lstm");
	Onnx__AttributeProto *a = attr(n, "direction", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
	a->has_s = 1, a->s.data = (uint8_t *)S("bidirectional"), a->s.len = strlen("bidirectional");
	attr_i(n, "hidden_size", RH);
	output(m, "y"), output(m, "yh"), output(m, "yc");
	return m;
}

START_TEST(lstm_sequence_lens_zero_y_and_keep_state_past_the_length)
{
	const int32_t lens[RB] = {3, 1};
	float want[3][RS * 2 * RB * RH];
	lstm_ref(lens, want[0], want[1], want[2]);
	/* lens an initializer, a graph input, and one of a symbolic batch */
	const char *const xdims[3] = {"3,2,2", "3,2,2", "3,N,2"}, *const ldims[3] = {NULL, "2", "N"};
	for (int v = 0; v < 3; v++) {
		int as_input = ldims[v] != NULL;
		kiln_graph *g = import_ok(lstm_model(xdims[v], ldims[v], lens));
		ck_assert_int_eq(kiln_graph_num_inputs(g), 1 + as_input);
		kiln_tensor *in[2] = {kiln_tensor_new(KILN_F32, 3, (int64_t[]){RS, RB, RI}),
		                      kiln_tensor_new(KILN_I32, 1, (int64_t[]){RB})};
		kiln_tensor *out[3] = {0};
		for (int t = 0; t < RS; t++)
			for (int b = 0; b < RB; b++)
				for (int i = 0; i < RI; i++)
					((float *)in[0]->data)[(t * RB + b) * RI + i] = (float)lstm_x(t, b, i);
		memcpy(in[1]->data, lens, sizeof lens);
		kiln_error e = {0};
		ck_assert_msg(kiln_graph_run(g, in, 1 + as_input, out, 3, &e) == KILN_OK, "%s", e.msg);
		const int64_t numel[3] = {RS * 2 * RB * RH, 2 * RB * RH, 2 * RB * RH};
		for (int o = 0; o < 3; o++) {
			ck_assert_int_eq(kiln_tensor_numel(out[o]), numel[o]);
			for (int64_t i = 0; i < numel[o]; i++)
				ck_assert_msg(fabsf(((float *)out[o]->data)[i] - want[o][i]) < 1e-5f,
				              "variant %d: output %d[%lld] = %g, want %g", v, o,
				              (long long)i, ((float *)out[o]->data)[i], want[o][i]);
		}
		/* row 1 (length 1): Y is 0 from step 1 on, Y_h is its step-0 H */
		for (int dir = 0; dir < 2; dir++)
			for (int j = 0; j < RH; j++) {
				ck_assert_float_eq(((float *)out[0]->data)[((2 * 2 + dir) * RB + 1) * RH + j], 0);
				ck_assert_float_eq(((float *)out[1]->data)[(dir * RB + 1) * RH + j],
				                   ((float *)out[0]->data)[((0 * 2 + dir) * RB + 1) * RH + j]);
				ck_assert_float_ne(((float *)out[1]->data)[(dir * RB + 1) * RH + j], 0);
			}
		for (int k = 0; k < 3; k++)
			kiln_tensor_free(out[k]);
		kiln_tensor_free(in[0]), kiln_tensor_free(in[1]), kiln_graph_free(g);
		pool_free();
	}
}
END_TEST

/* Unrolling needs the number of steps: a symbolic sequence length is
 * refused, naming the op, the node and what is needed (a symbolic batch
 * is fine: above); so are activations and shapes it cannot take. */
START_TEST(rnn_symbolic_sequence_length_and_bad_inputs_are_refused)
{
	/* a symbolic sequence length (it used to be refused) imports as one
	 * fused node whose outputs keep the symbol; the optional inputs given
	 * are B and sequence_lens, positions 3 and 4, so no `inputs` */
	const int32_t lens[RB] = {3, 3};
	kiln_graph *g = import_ok(lstm_model("T,2,2", NULL, lens));
	char *kir = kiln_graph_to_kir(g);
	ck_assert_msg(strstr(kir, "%y, %yh, %yc = lstm %x, %w, %r, %b, %lens {direction="
	                          "\"bidirectional\", hidden_size=2} : f32[T,2,2,2], f32[2,2,2], "
	                          "f32[2,2,2] name(\"lstm\")"), "%s", kir);
	free(kir), kiln_graph_free(g);
	pool_free();
	Onnx__ModelProto *m = model(14);
	input(m, "x", F32, "N,T,2");
	init_t(m, "w", F32, 3, (int64_t[]){1, 3, 2}, (double[]){1, 2, 3, 4, 5, 6});
	init_t(m, "r", F32, 3, (int64_t[]){1, 3, 3}, (double[]){1, 2, 3, 4, 5, 6, 7, 8, 9});
	attr_i(node(m, "RNN", "x,w,r", "y", "rnn"), "layout", 1);
	output(m, "y");
	g = import_ok(m);
	kir = kiln_graph_to_kir(g);
	ck_assert_msg(strstr(kir, " = rnn %x, %w, %r {hidden_size=3, layout=1} : f32[N,T,1,3], "
	                          "f32[N,1,3]"), "%s", kir);
	free(kir), kiln_graph_free(g);
	pool_free();
	/* an activation kiln has no op for, a list of the wrong length, and a B
	 * of the wrong shape, each by name (one direction's list serves both) */
	m = lstm_model("3,2,2", NULL, lens);
	Onnx__AttributeProto *a = attr(m->graph->node[0], "activations",
	                               ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS);
	a->n_strings = 3, a->strings = A(3 * sizeof *a->strings);
	const char *const acts[3] = {"Sigmoid", "Gelu", "Tanh"};
	for (int i = 0; i < 3; i++)
		a->strings[i].data = (uint8_t *)S(acts[i]), a->strings[i].len = strlen(acts[i]);
	expect_import_error(m, "LSTM 'lstm' (domain ai.onnx, opset 14): activation 'Gelu' is not "
	                       "one kiln imports (Relu, Tanh, Sigmoid, ");
	a->n_strings = 2;
	expect_import_error(m, "LSTM 'lstm' (domain ai.onnx, opset 14): activations lists 2 "
	                       "functions; LSTM takes 3 per direction (6 here)");
	pool_free();
	m = lstm_model("3,2,2", NULL, lens);
	m->graph->initializer[2]->dims[1] = 8, m->graph->initializer[2]->n_float_data = 16;
	expect_import_error(m, "LSTM 'lstm' (domain ai.onnx, opset 14): B is f32[2,8]; it must be "
	                       "[2, 16] of X's type");
	pool_free();
}
END_TEST

/* A model protobuf-c cannot decode still gets a report: its one error. */
START_TEST(report_of_an_undecodable_model_is_its_one_error)
{
	kiln_graph *g = NULL;
	char *report = NULL;
	kiln_onnx_opts o = {"junk.onnx", NULL, &report, NULL};
	ck_assert_int_eq(kiln_onnx_import_ex("\xff\xff\xff\xff", 4, &o, &g, NULL), KILN_EPARSE);
	ck_assert_str_eq(report, "junk.onnx: not a valid ONNX model (protobuf decoding failed)\n");
	ck_assert_ptr_null(g);
	free(report);
}
END_TEST

/* Writes m to path. */
static void save(Onnx__ModelProto *m, const char *path)
{
	size_t n = onnx__model_proto__get_packed_size(m);
	uint8_t *buf = A(n);
	onnx__model_proto__pack(m, buf);
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(buf, 1, n, f), n);
	fclose(f);
}

/* Runs cmd; its stdout and stderr in out, the exit status returned. */
static int run_cmd(const char *cmd, char *out, size_t size)
{
	char full[2200];
	snprintf(full, sizeof full, "%s 2>&1", cmd);
	FILE *p = popen(full, "r");
	ck_assert_ptr_nonnull(p);
	size_t n = fread(out, 1, size - 1, p);
	out[n] = 0;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `kiln inspect` names every unsupported node of a model, not the first.
 * Needs the CLI's export and inspect wired to tools/onnx_cli.c. */
START_TEST(cli_inspect_lists_every_unsupported_node)
{
	char cmd[2048], out[8192], path[512];
	if (run_cmd(KILN_BIN "/kiln export --help", out, sizeof out) != 0) {
		printf("cli_inspect_lists_every_unsupported_node: skipped: %s/kiln has no 'export' "
		       "yet (wire tools/onnx_cli.c into tools/kiln.c)\n", KILN_BIN);
		return;
	}
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "2,3");
	node(m, "Frobnicate", "x", "a", "frob1");
	node(m, "Relu", "a", "b", "quiet");
	node(m, "Det", "x", "c", "tri2");
	Onnx__NodeProto *d = node(m, "Relu", "x", "d", "custom3");
	d->domain = S("com.example");
	node(m, "Add", "b,c", "e", "add");
	node(m, "Add", "e,d", "y", "add2");
	output(m, "y");
	snprintf(path, sizeof path, "%s/cli_unsupported.onnx", KILN_BIN);
	save(m, path);
	snprintf(cmd, sizeof cmd, "%s/kiln inspect %s --no-ir", KILN_BIN, path);
	ck_assert_int_eq(run_cmd(cmd, out, sizeof out), 1);
	static const char *const want[] = {
		"Frobnicate 'frob1' (domain ai.onnx, opset 13): op is not in kiln's op table",
		"Det 'tri2' (domain ai.onnx, opset 13): op is not in kiln's op table",
		("Relu 'custom3' (domain com.example, opset -1): domain 'com.example' is not "
		 "supported"),
		"kiln: error: ", "3 problems",
	};
	for (size_t i = 0; i < sizeof want / sizeof *want; i++)
		ck_assert_msg(strstr(out, want[i]), "inspect output lacks \"%s\":\n%s", want[i], out);
	ck_assert_msg(!strstr(out, "'quiet'"), "a node reading a failed one was reported:\n%s",
	              out);
	/* and the CLI exports what it imports */
	snprintf(cmd, sizeof cmd, "%s/kiln export %s -o %s.out.onnx", KILN_BIN, path, path);
	ck_assert_int_eq(run_cmd(cmd, out, sizeof out), 1);
	ck_assert_msg(strstr(out, "kiln: error: ") && strstr(out, "Frobnicate 'frob1'"), "%s", out);
	remove(path);
	pool_free();
}
END_TEST

START_TEST(old_opset_only_for_unchanged_ops)
{
	Onnx__ModelProto *m = model(6);
	input(m, "x", ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, "3");
	node(m, "Not", "x", "a", NULL);
	node(m, "Cast", "a", "b", NULL);
	output(m, "b");
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(import(m, &g, &err), KILN_EUNSUPPORTED);
	ck_assert_str_eq(err.msg, "t.onnx: Cast (domain ai.onnx, opset 6): opsets before 7 are "
	                 "supported only for ops whose definition has not changed since (this "
	                 "one has)");
	m->graph->n_node = 1;
	m->graph->output[0]->name = S("a");
	g = import_ok(m);
	kiln_graph_free(g);
	pool_free();
}
END_TEST

START_TEST(garbage_bytes_are_a_parse_error)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(kiln_onnx_import_mem("\xff\xff\xff\xff", 4, "junk.onnx", &g, &err),
	                 KILN_EPARSE);
	ck_assert_ptr_null(g);
	ck_assert_str_eq(err.msg, "junk.onnx: not a valid ONNX model (protobuf decoding failed)");
}
END_TEST

START_TEST(load_any_dispatches_on_the_extension)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_int_eq(kiln_graph_load_any("/nonexistent/m.onnx", &g, &err), KILN_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/m.onnx: cannot read"));
	ck_assert_int_ne(kiln_graph_load_any("/nonexistent/m.kir", &g, &err), KILN_OK);
	ck_assert_ptr_null(strstr(err.msg, "ONNX"));
	ck_assert_ptr_null(g);
}
END_TEST

/* `kiln compile --bind NAME=X.npy`: a Reshape whose shape is a graph input
 * does not compile alone; bound to [3, 2] it does, the input leaves the
 * library's signature, and the library reshapes.  `kiln run` of the model
 * binds it from its -i values. */
START_TEST(cli_compile_binds_an_input_the_import_needs)
{
	char cmd[4096], out[8192], path[512], npy[512], so[512], xn[512], od[400], yp[512];
	Onnx__ModelProto *m = model(13);
	input(m, "x", F32, "2,3");
	input(m, "shape", I64, "2");
	node(m, "Reshape", "x,shape", "y", "r");
	output(m, "y");
	snprintf(path, sizeof path, "%s/cli_bind.onnx", KILN_BIN);
	snprintf(npy, sizeof npy, "%s/cli_bind_shape.npy", KILN_BIN);
	snprintf(xn, sizeof xn, "%s/cli_bind_x.npy", KILN_BIN);
	snprintf(so, sizeof so, "%s/cli_bind.so", KILN_BIN);
	snprintf(od, sizeof od, "%s/cli_bind_out", KILN_BIN);
	save(m, path);
	kiln_tensor *s = kiln_tensor_new(KILN_I64, 1, (int64_t[]){2});
	((int64_t *)s->data)[0] = 3, ((int64_t *)s->data)[1] = 2;
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 2, (int64_t[]){2, 3});
	for (int i = 0; i < 6; i++)
		((float *)x->data)[i] = (float)i;
	kiln_error e = {0};
	ck_assert_int_eq(kiln_npy_write(npy, s, &e), KILN_OK);
	ck_assert_int_eq(kiln_npy_write(xn, x, &e), KILN_OK);
	snprintf(cmd, sizeof cmd, "%s/kiln compile %s -o %s", KILN_BIN, path, so);
	ck_assert_int_eq(run_cmd(cmd, out, sizeof out), 1);
	ck_assert_msg(strstr(out, "('shape', the shape) is not a constant known at import"), "%s", out);
	snprintf(cmd, sizeof cmd, "%s/kiln compile %s --bind shape=%s -o %s", KILN_BIN, path, npy, so);
	ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
	ck_assert_msg(strstr(out, "--bind shape: bound into the library"), "%s", out);
	snprintf(cmd, sizeof cmd, "%s/kiln run %s -i x=%s -o %s", KILN_BIN, so, xn, od);
	ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
	snprintf(yp, sizeof yp, "%s/y.npy", od);
	kiln_tensor *y = NULL;
	ck_assert_int_eq(kiln_npy_read(yp, &y, &e), KILN_OK);
	ck_assert_int_eq(y->rank, 2);
	ck_assert_int_eq(y->shape[0], 3);
	ck_assert_int_eq(y->shape[1], 2);
	ck_assert_float_eq(((float *)y->data)[5], 5);
	kiln_tensor_free(y), y = NULL;
	/* `kiln run MODEL.onnx` binds it from its -i values, and says so */
	snprintf(cmd, sizeof cmd, "%s/kiln run %s -i x=%s -i shape=%s -o %s", KILN_BIN, path, xn, npy,
	         od);
	ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
	ck_assert_msg(strstr(out, "input 'shape' is bound into the graph at import"), "%s", out);
	ck_assert_int_eq(kiln_npy_read(yp, &y, &e), KILN_OK);
	ck_assert_int_eq(y->shape[0], 3);
	snprintf(cmd, sizeof cmd, "%s/kiln compile %s --bind shape -o %s", KILN_BIN, path, so);
	ck_assert_int_eq(run_cmd(cmd, out, sizeof out), 2);
	kiln_tensor_free(s), kiln_tensor_free(x), kiln_tensor_free(y);
	pool_free();
}
END_TEST

static Suite *onnx_import_suite(void)
{
	Suite *s = suite_create("onnx_import");
	TCase *t = tcase_create("opsets");
	tcase_add_test(t, reshape_shape_input_from_initializer_becomes_attribute);
	tcase_add_test(t, slice_opset9_attributes_and_opset13_inputs_agree);
	tcase_add_test(t, clip_v6_attributes_and_v11_inputs_agree);
	tcase_add_test(t, squeeze_and_reduce_sum_axes_attribute_opset11_input_opset13);
	tcase_add_test(t, softmax_opset11_coerces_to_2d_at_axis);
	tcase_add_test(t, reshape_shape_from_graph_input_is_rejected);
	tcase_add_test(t, gelu_imports_with_its_approximate_attribute);
	tcase_add_test(t, pow_integer_base_float_exponent_is_taken_in_floats);
	tcase_add_test(t, pow_of_integers_is_exact);
	tcase_add_test(t, defaults_spelled_out_import_like_defaults_left_out);
	suite_add_tcase(s, t);
	t = tcase_create("dims");
	tcase_add_test(t, dim_param_is_a_symbol_and_missing_dim_a_fresh_one);
	tcase_add_test(t, einsum_with_a_symbolic_batch_letter);
	tcase_add_test(t, maxpool_indices_interpreted_and_compiled);
	suite_add_tcase(s, t);
	t = tcase_create("initializers");
	tcase_add_test(t, raw_and_typed_initializers_give_the_same_param);
	tcase_add_test(t, external_data_is_read_next_to_the_model);
	tcase_add_test(t, external_data_outside_the_model_folder_is_refused);
	tcase_add_test(t, raw_data_of_the_wrong_size_is_an_error);
	suite_add_tcase(s, t);
	t = tcase_create("external files");
	tcase_add_checked_fixture(t, ext_setup, ext_teardown);
	tcase_add_test(t, external_data_symlink_out_of_the_folder_is_refused);
	tcase_add_test(t, external_data_symlink_inside_the_folder_is_read);
	tcase_add_test(t, fifos_are_refused_without_blocking);
	suite_add_tcase(s, t);
	t = tcase_create("folding");
	tcase_add_test(t, shape_gather_concat_reshape_chain_folds);
	tcase_add_test(t, constant_node_feeds_unsqueeze_axes);
	tcase_add_test(t, symbolic_shape_chain_becomes_copy_and_infer);
	tcase_add_test(t, symbolic_limit_and_end_become_dims);
	tcase_add_test(t, symbolic_limit_from_another_start_is_reported);
	tcase_add_test(t, symbolic_shape_of_another_count_is_rejected);
	suite_add_tcase(s, t);
	t = tcase_create("training mode");
	tcase_add_test(t, batchnorm_training_mode_before_and_from_opset14_agree);
	tcase_add_test(t, inference_graph_of_a_training_mode_export);
	tcase_add_test(t, training_mode_running_stat_output_that_is_read_is_refused);
	tcase_add_test(t, batchnorm_on_computed_statistics_trains_as_it_is);
	suite_add_tcase(s, t);
	t = tcase_create("errors");
	tcase_add_test(t, every_unsupported_node_is_listed_at_once);
	tcase_add_test(t, msft_qoperator_ops_import_as_dq_op_q);
	tcase_add_test(t, argmin_of_integers_and_logsumexp_of_large_values);
	tcase_add_test(t, composites_refuse_what_they_cannot_know);
	tcase_add_test(t, expand_to_the_batch_through_where_and_equal);
	tcase_add_test(t, cli_compile_binds_an_input_the_import_needs);
	tcase_add_test(t, lstm_sequence_lens_zero_y_and_keep_state_past_the_length);
	tcase_add_test(t, rnn_symbolic_sequence_length_and_bad_inputs_are_refused);
	tcase_add_test(t, report_of_an_undecodable_model_is_its_one_error);
	tcase_add_test(t, cli_inspect_lists_every_unsupported_node);
	tcase_add_test(t, old_opset_only_for_unchanged_ops);
	tcase_add_test(t, garbage_bytes_are_a_parse_error);
	tcase_add_test(t, load_any_dispatches_on_the_extension);
	suite_add_tcase(s, t);
	return s;
}

KILN_CHECK_MAIN(onnx_import_suite)
