/*
 * test_onnx_export.c: ONNX export (frontend/onnx/onnx_export.c).
 *
 * The exported bytes are unpacked with protobuf-c and inspected (opset, IR
 * version, initializers, names, dim_params, attributes turned into Constant
 * inputs); DSL graphs covering the op table go through export -> import ->
 * export -> import, which must give the same .kir text twice and the same
 * interpreter outputs.  Each such model is also left in KILN_BIN/onnx_export
 * with its inputs and kiln's outputs as .npy, for check_export.py to run in
 * ONNX Runtime (ctest onnx_export_ort).
 *
 * The real_models case runs only when KILN_REAL_MODELS names the folder that
 * tests/onnx/make_real_models.py filled (ctest onnx_real_models sets it).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frontend/onnx/onnx.h"
#include "op_cases.h"

#define EXPORT_DIR KILN_BIN "/onnx_export"

/* ---- helpers ------------------------------------------------------------ */

static Onnx__ModelProto *export_proto(const kiln_graph *g)
{
	void *data = NULL;
	size_t size = 0;
	kiln_error err = {0};
	kiln_status st = kiln_onnx_export_mem(g, &data, &size, &err);
	ck_assert_msg(st == KILN_OK, "export failed: %s", err.msg);
	Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, size, data);
	free(data);
	ck_assert_ptr_nonnull(m);
	return m;
}

static const Onnx__NodeProto *producer(const Onnx__ModelProto *m, const char *out)
{
	for (size_t i = 0; i < m->graph->n_node; i++)
		for (size_t j = 0; j < m->graph->node[i]->n_output; j++)
			if (!strcmp(m->graph->node[i]->output[j], out))
				return m->graph->node[i];
	return NULL;
}

static const Onnx__NodeProto *node_of_type(const Onnx__ModelProto *m, const char *op_type)
{
	for (size_t i = 0; i < m->graph->n_node; i++)
		if (!strcmp(m->graph->node[i]->op_type, op_type))
			return m->graph->node[i];
	return NULL;
}

/* The tensor a Constant node holds, found by the name of its output. */
static const Onnx__TensorProto *constant_of(const Onnx__ModelProto *m, const char *out)
{
	const Onnx__NodeProto *c = producer(m, out);
	ck_assert_msg(c != NULL, "no node makes %s", out);
	ck_assert_str_eq(c->op_type, "Constant");
	ck_assert_uint_eq(c->n_attribute, 1);
	return c->attribute[0]->t;
}

static kiln_graph *parse(const char *kir)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_graph_from_kir(kir, "t.kir", &g, &err) == KILN_OK, "%s", err.msg);
	return g;
}

static kiln_tensor *random_tensor(kiln_dtype dt, int rank, const int64_t *shape,
                                  uint64_t seed, double lo, double hi)
{
	kiln_tensor *t = kiln_tensor_new(dt, rank, shape);
	int64_t n = kiln_tensor_numel(t);
	for (int64_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		double u = (double)(seed >> 11) / 9007199254740992.0;
		double v = lo + (hi - lo) * u;
		if (dt == KILN_F32)
			((float *)t->data)[i] = (float)v;
		else if (dt == KILN_I64)
			((int64_t *)t->data)[i] = (int64_t)floor(v);
		else if (dt == KILN_BOOL)
			((uint8_t *)t->data)[i] = v > (lo + hi) / 2;
	}
	return t;
}

static double max_abs_diff(const kiln_tensor *a, const kiln_tensor *b)
{
	ck_assert_int_eq(a->dtype, b->dtype);
	ck_assert_int_eq(a->rank, b->rank);
	for (int i = 0; i < a->rank; i++)
		ck_assert_int_eq(a->shape[i], b->shape[i]);
	double m = 0;
	int64_t n = kiln_tensor_numel(a);
	for (int64_t i = 0; i < n; i++) {
		double x = a->dtype == KILN_F32 ? ((float *)a->data)[i]
		         : a->dtype == KILN_I64 ? (double)((int64_t *)a->data)[i]
		         : a->dtype == KILN_BOOL ? ((uint8_t *)a->data)[i] : NAN;
		double y = b->dtype == KILN_F32 ? ((float *)b->data)[i]
		         : b->dtype == KILN_I64 ? (double)((int64_t *)b->data)[i]
		         : b->dtype == KILN_BOOL ? ((uint8_t *)b->data)[i] : NAN;
		if (isnan(x) && isnan(y))
			continue;
		m = fmax(m, fabs(x - y));
		if (isnan(x) != isnan(y))
			m = INFINITY;
	}
	return m;
}

static kiln_graph *import_mem(const void *data, size_t size)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	kiln_status st = kiln_onnx_import_mem(data, size, "model.onnx", &g, &err);
	ck_assert_msg(st == KILN_OK, "import failed: %s", err.msg);
	return g;
}

/* export then import */
static kiln_graph *reimport(const kiln_graph *g)
{
	void *data = NULL;
	size_t size = 0;
	kiln_error err = {0};
	ck_assert_msg(kiln_onnx_export_mem(g, &data, &size, &err) == KILN_OK, "%s", err.msg);
	kiln_graph *back = import_mem(data, size);
	free(data);
	ck_assert_msg(kiln_graph_verify(back, &err) == KILN_OK, "%s", err.msg);
	return back;
}

static void run(const kiln_graph *g, kiln_tensor **in, int nin, kiln_tensor **out)
{
	kiln_error err = {0};
	int nout = kiln_graph_num_outputs(g);
	kiln_status st = kiln_graph_run(g, in, nin, out, nout, &err);
	ck_assert_msg(st == KILN_OK, "run failed: %s", err.msg);
}

/* Leaves name.onnx, name.in<i>.npy and name.out<i>.npy (kiln's outputs)
 * for check_export.py. */
static void write_case(const char *name, const kiln_graph *g, kiln_tensor **in, int nin)
{
	char path[512];
	kiln_error err = {0};
	mkdir(EXPORT_DIR, 0777);
	snprintf(path, sizeof path, "%s/%s.onnx", EXPORT_DIR, name);
	ck_assert_msg(kiln_onnx_export(g, path, &err) == KILN_OK, "%s", err.msg);
	for (int i = 0; i < nin; i++) {
		snprintf(path, sizeof path, "%s/%s.in%d.npy", EXPORT_DIR, name, i);
		ck_assert_msg(kiln_npy_write(path, in[i], &err) == KILN_OK, "%s", err.msg);
	}
	int nout = kiln_graph_num_outputs(g);
	kiln_tensor *out[16] = {0};
	ck_assert_int_le(nout, 16);
	run(g, in, nin, out);
	for (int i = 0; i < nout; i++) {
		snprintf(path, sizeof path, "%s/%s.out%d.npy", EXPORT_DIR, name, i);
		ck_assert_msg(kiln_npy_write(path, out[i], &err) == KILN_OK, "%s", err.msg);
		kiln_tensor_free(out[i]);
	}
}

/* The acceptance check: g -> export -> import (g1) -> export -> import (g2)
 * gives the same .kir for g1 and g2, and g1 computes what g computes. */
static void check_roundtrip(const char *name, const kiln_graph *g, kiln_tensor **in, int nin,
                            double tol)
{
	kiln_graph *g1 = reimport(g), *g2 = reimport(g1);
	char *k1 = kiln_graph_to_kir(g1), *k2 = kiln_graph_to_kir(g2);
	ck_assert_ptr_nonnull(k1);
	ck_assert_ptr_nonnull(k2);
	ck_assert_msg(!strcmp(k1, k2), "%s: .kir differs after a second round trip:\n%s\n---\n%s",
	              name, k1, k2);
	int nout = kiln_graph_num_outputs(g);
	ck_assert_int_eq(kiln_graph_num_outputs(g1), nout);
	kiln_tensor *a[16] = {0}, *b[16] = {0};
	run(g, in, nin, a);
	run(g1, in, nin, b);
	for (int i = 0; i < nout; i++) {
		double d = max_abs_diff(a[i], b[i]);
		ck_assert_msg(d <= tol, "%s: output %d differs by %g after export/import", name, i, d);
		kiln_tensor_free(a[i]);
		kiln_tensor_free(b[i]);
	}
	write_case(name, g, in, nin);
	free(k1);
	free(k2);
	kiln_graph_free(g1);
	kiln_graph_free(g2);
}

static void free_all(kiln_tensor **t, int n)
{
	for (int i = 0; i < n; i++)
		kiln_tensor_free(t[i]);
}

/* ---- the model's frame -------------------------------------------------- */

static kiln_graph *mlp(void)
{
	kiln_graph *g = kiln_graph_new("mlp");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, ((int64_t[]){N, 12}));
	kiln_value h = kiln_relu(g, kiln_linear(g, "fc1", x, 8, true));
	kiln_output(g, "logits", kiln_linear(g, "fc2", h, 3, true));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	return g;
}

START_TEST(export_writes_ir8_opset17_and_producer)
{
	kiln_graph *g = mlp();
	Onnx__ModelProto *m = export_proto(g);
	ck_assert_int_eq(m->ir_version, 8);
	ck_assert_uint_eq(m->n_opset_import, 1);
	ck_assert_str_eq(m->opset_import[0]->domain, "");
	ck_assert_int_eq(m->opset_import[0]->version, 17);
	ck_assert_str_eq(m->producer_name, "kiln");
	ck_assert_str_eq(m->graph->name, "mlp");
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_params_become_raw_initializers_by_name)
{
	kiln_graph *g = mlp();
	Onnx__ModelProto *m = export_proto(g);
	const Onnx__TensorProto *w = NULL;
	ck_assert_uint_eq(m->graph->n_initializer, 4);
	for (size_t i = 0; i < m->graph->n_initializer; i++)
		if (!strcmp(m->graph->initializer[i]->name, "fc1.weight"))
			w = m->graph->initializer[i];
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(w->data_type, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
	ck_assert_uint_eq(w->n_dims, 2);
	ck_assert_int_eq(w->dims[0], 8);
	ck_assert_int_eq(w->dims[1], 12);
	ck_assert(w->has_raw_data);
	ck_assert_uint_eq(w->raw_data.len, 8 * 12 * sizeof(float));
	kiln_tensor_set *ps = kiln_graph_params(g);
	const kiln_tensor *pw = kiln_tensor_set_get(ps, "fc1.weight");
	ck_assert_ptr_nonnull(pw);
	ck_assert_mem_eq(w->raw_data.data, pw->data, w->raw_data.len);
	kiln_tensor_set_free(ps);
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_keeps_input_output_names_and_dim_params)
{
	kiln_graph *g = mlp();
	Onnx__ModelProto *m = export_proto(g);
	ck_assert_uint_eq(m->graph->n_input, 1);
	const Onnx__ValueInfoProto *x = m->graph->input[0];
	ck_assert_str_eq(x->name, "x");
	const Onnx__TensorShapeProto *s = x->type->tensor_type->shape;
	ck_assert_uint_eq(s->n_dim, 2);
	ck_assert_int_eq(s->dim[0]->value_case, ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM);
	ck_assert_str_eq(s->dim[0]->dim_param, "N");
	ck_assert_int_eq(s->dim[1]->dim_value, 12);
	ck_assert_uint_eq(m->graph->n_output, 1);
	ck_assert_str_eq(m->graph->output[0]->name, "logits");
	ck_assert_ptr_nonnull(producer(m, "logits"));
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_dim_expressions_become_dim_params)
{
	kiln_graph *g = parse("graph @f(%x: f32[N,4]) -> (%y: f32[N+N,4]) {\n"
	                      "  %y = concat %x, %x {axis=0} : f32[N+N,4]\n"
	                      "  ret %y\n}\n");
	Onnx__ModelProto *m = export_proto(g);
	const Onnx__TensorShapeProto *s = m->graph->output[0]->type->tensor_type->shape;
	ck_assert_str_eq(s->dim[0]->dim_param, "N+N");
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_names_unnamed_and_duplicate_values_uniquely)
{
	kiln_graph *g = parse("graph @f(%x: f32[2]) -> (%y: f32[2]) {\n"
	                      "  %0 = relu %x : f32[2]\n"
	                      "  %1 = neg %0 : f32[2]\n"
	                      "  %y = abs %1 : f32[2]\n"
	                      "  ret %y\n}\n");
	Onnx__ModelProto *m = export_proto(g);
	const Onnx__NodeProto *neg = node_of_type(m, "Neg"), *relu = node_of_type(m, "Relu");
	ck_assert_ptr_nonnull(neg);
	ck_assert_str_eq(neg->input[0], relu->output[0]);
	ck_assert_str_ne(neg->output[0], relu->output[0]);
	ck_assert(!strncmp(relu->output[0], "_v", 2));
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

/* ---- attributes that opset 17 takes as inputs ---------------------------- */

START_TEST(export_reshape_shape_is_an_int64_constant_input)
{
	kiln_graph *g = parse("graph @f(%x: f32[N,6]) -> (%y: f32[N,2,3]) {\n"
	                      "  %y = reshape %x {shape=[0,2,-1]} : f32[N,2,3] name(\"r1\")\n"
	                      "  ret %y\n}\n");
	Onnx__ModelProto *m = export_proto(g);
	const Onnx__NodeProto *r = producer(m, "y");
	ck_assert_str_eq(r->op_type, "Reshape");
	ck_assert_str_eq(r->name, "r1");
	ck_assert_uint_eq(r->n_input, 2);
	ck_assert_str_eq(r->input[1], "y_shape");
	const Onnx__TensorProto *t = constant_of(m, "y_shape");
	ck_assert_int_eq(t->data_type, ONNX__TENSOR_PROTO__DATA_TYPE__INT64);
	ck_assert_uint_eq(t->n_dims, 1);
	ck_assert_int_eq(t->dims[0], 3);
	const int64_t want[] = {0, 2, -1};
	ck_assert_mem_eq(t->raw_data.data, want, sizeof want);
	for (size_t i = 0; i < r->n_attribute; i++)
		ck_assert_str_ne(r->attribute[i]->name, "shape");
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_clip_bounds_are_scalars_of_the_input_dtype)
{
	kiln_graph *g = parse("graph @f(%x: i32[4]) -> (%y: i32[4]) {\n"
	                      "  %y = clip %x {max=6.0} : i32[4]\n"
	                      "  ret %y\n}\n");
	Onnx__ModelProto *m = export_proto(g);
	const Onnx__NodeProto *c = producer(m, "y");
	ck_assert_uint_eq(c->n_input, 3);
	ck_assert_str_eq(c->input[1], ""); /* min omitted */
	const Onnx__TensorProto *t = constant_of(m, c->input[2]);
	ck_assert_int_eq(t->data_type, ONNX__TENSOR_PROTO__DATA_TYPE__INT32);
	ck_assert_uint_eq(t->n_dims, 0);
	ck_assert_int_eq(*(const int32_t *)t->raw_data.data, 6);
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_slice_leaves_off_trailing_absent_inputs)
{
	kiln_graph *g = parse("graph @f(%x: f32[8,8]) -> (%y: f32[2,8], %z: f32[8,4]) {\n"
	                      "  %y = slice %x {ends=[4], starts=[2]} : f32[2,8]\n"
	                      "  %z = slice %x {ends=[8], starts=[0], axes=[1], steps=[2]} : f32[8,4]\n"
	                      "  ret %y, %z\n}\n");
	Onnx__ModelProto *m = export_proto(g);
	ck_assert_uint_eq(producer(m, "y")->n_input, 3);
	const Onnx__NodeProto *z = producer(m, "z");
	ck_assert_uint_eq(z->n_input, 5);
	ck_assert_str_eq(z->input[3], "z_axes");
	ck_assert_int_eq(((const int64_t *)constant_of(m, "z_steps")->raw_data.data)[0], 2);
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_dropout_ratio_is_a_float_and_mode_a_bool)
{
	kiln_graph *g = parse("graph @f(%x: f32[4]) -> (%y: f32[4]) {\n"
	                      "  %y = dropout %x {ratio=0.25, training_mode=0} : f32[4]\n"
	                      "  ret %y\n}\n");
	Onnx__ModelProto *m = export_proto(g);
	const Onnx__NodeProto *d = producer(m, "y");
	ck_assert_uint_eq(d->n_input, 3);
	const Onnx__TensorProto *r = constant_of(m, d->input[1]), *t = constant_of(m, d->input[2]);
	ck_assert_int_eq(r->data_type, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
	ck_assert_float_eq(*(const float *)r->raw_data.data, 0.25f);
	ck_assert_int_eq(t->data_type, ONNX__TENSOR_PROTO__DATA_TYPE__BOOL);
	ck_assert_int_eq(t->raw_data.data[0], 0);
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_cast_to_is_the_onnx_dtype_code)
{
	kiln_graph *g = parse("graph @f(%x: f32[4]) -> (%y: i64[4]) {\n"
	                      "  %y = cast %x {to=i64} : i64[4]\n"
	                      "  ret %y\n}\n");
	Onnx__ModelProto *m = export_proto(g);
	const Onnx__NodeProto *c = producer(m, "y");
	ck_assert_uint_eq(c->n_attribute, 1);
	ck_assert_str_eq(c->attribute[0]->name, "to");
	ck_assert_int_eq(c->attribute[0]->i, ONNX__TENSOR_PROTO__DATA_TYPE__INT64);
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_expand_symbolic_dim_the_input_has_is_1)
{
	kiln_graph *g = kiln_graph_new("f");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, ((int64_t[]){N, 1}));
	kiln_output(g, "y", kiln_expand(g, x, 2, ((int64_t[]){N, 5})));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	Onnx__ModelProto *m = export_proto(g);
	const int64_t *s = (const int64_t *)constant_of(m, "y_shape")->raw_data.data;
	ck_assert_int_eq(s[0], 1);
	ck_assert_int_eq(s[1], 5);
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);
}
END_TEST

/* A target dim the input lacks is its value at run time: Shape of the
 * graph input that has it, sliced to that dim, concatenated with the
 * constant dims; with no input to take it from, the export fails. */
START_TEST(export_expand_to_a_new_symbolic_dim_reads_it_from_an_input)
{
	kiln_graph *g = kiln_graph_new("f");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, ((int64_t[]){1, 4}));
	kiln_input(g, "ids", KILN_I64, 2, ((int64_t[]){3, N}));
	kiln_output(g, "y", kiln_expand(g, x, 2, ((int64_t[]){N, 4})));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	Onnx__ModelProto *m = export_proto(g);
	const Onnx__NodeProto *cat = producer(m, node_of_type(m, "Expand")->input[1]);
	ck_assert_str_eq(cat->op_type, "Concat");
	ck_assert_uint_eq(cat->n_input, 2);
	const Onnx__NodeProto *sh = producer(m, cat->input[0]);
	ck_assert_str_eq(sh->op_type, "Shape");
	ck_assert_str_eq(sh->input[0], "ids");
	ck_assert_uint_eq(sh->n_attribute, 2);
	ck_assert_int_eq(sh->attribute[0]->i, 1); /* start */
	ck_assert_int_eq(sh->attribute[1]->i, 2); /* end */
	ck_assert_int_eq(((const int64_t *)constant_of(m, cat->input[1])->raw_data.data)[0], 4);
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph_free(g);

	g = kiln_graph_new("f");
	N = kiln_sym(g, "N");
	x = kiln_input(g, "x", KILN_F32, 2, ((int64_t[]){1, 4}));
	kiln_output(g, "y", kiln_expand(g, x, 2, ((int64_t[]){N, 4})));
	kiln_error err = {0};
	void *data = NULL;
	size_t size;
	ck_assert_int_eq(kiln_onnx_export_mem(g, &data, &size, &err), KILN_EUNSUPPORTED);
	ck_assert_ptr_null(data);
	ck_assert_msg(strstr(err.msg, "Expand: the dim N is no graph input's dim, so it has no "
	                     "value at run time"), "%s", err.msg);
	kiln_graph_free(g);
}
END_TEST

/* Attributes holding S (dynseq_kir in op_cases.h) export as Shape(ids)
 * arithmetic, read back into the same attributes, and compute the same at
 * S = 3 and S = 5; both runs are left for check_export.py (ONNX Runtime). */
START_TEST(roundtrip_symbolic_attributes_at_two_lengths)
{
	kiln_graph *g = dynseq_graph();
	Onnx__ModelProto *m = export_proto(g);
	const Onnx__NodeProto *sl = node_of_type(m, "Slice");
	ck_assert_str_eq(producer(m, sl->input[2])->op_type, "Shape"); /* ends = [S] */
	ck_assert_str_eq(producer(m, producer(m, "y")->input[1])->op_type, "Concat");
	ck_assert_ptr_nonnull(node_of_type(m, "Range"));
	onnx__model_proto__free_unpacked(m, NULL);
	kiln_graph *g1 = reimport(g);
	const int64_t *v;
	uint64_t dims;
	for (uint32_t i = 0; i < g1->nnode; i++)
		if (g1->node[i]->op == KILN_OP_SLICE) {
			ck_assert_uint_eq(ir_attr_dims(g1->node[i], "ends", &v, &dims), 1);
			ck_assert_uint_eq(dims, 1);
			ck_assert_int_eq(v[0], ir_dim_sym(g1, "S"));
		}
	kiln_graph_free(g1);
	for (int64_t s = 3; s <= 5; s += 2) {
		kiln_tensor *in[2];
		char name[32];
		dynseq_inputs(s, in);
		snprintf(name, sizeof name, "dynseq_s%lld", (long long)s);
		check_roundtrip(name, g, in, 2, 0);
		free_all(in, 2);
	}
	kiln_graph_free(g);
}
END_TEST

/* ---- files and errors --------------------------------------------------- */

START_TEST(export_file_reads_back_and_replaces_atomically)
{
	kiln_graph *g = mlp();
	kiln_error err = {0};
	char path[512];
	snprintf(path, sizeof path, "%s/export_file_test.onnx", KILN_BIN);
	ck_assert_int_eq(kiln_onnx_export(g, path, &err), KILN_OK);
	ck_assert_int_eq(kiln_onnx_export(g, path, &err), KILN_OK); /* over an old one */
	kiln_graph *back = NULL;
	ck_assert_msg(kiln_onnx_import(path, &back, &err) == KILN_OK, "%s", err.msg);
	ck_assert_int_eq(kiln_graph_num_inputs(back), 1);
	ck_assert_uint_ne(kiln_graph_find_param(back, "fc2.bias"), KILN_NONE);
	remove(path);
	kiln_graph_free(back);
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_to_missing_folder_is_eio_naming_the_path)
{
	kiln_graph *g = mlp();
	kiln_error err = {0};
	kiln_status st = kiln_onnx_export(g, "/nonexistent-kiln-dir/m.onnx", &err);
	ck_assert_int_eq(st, KILN_EIO);
	ck_assert_int_eq(err.code, KILN_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent-kiln-dir/m.onnx"));
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_refuses_a_graph_in_error)
{
	kiln_graph *g = kiln_graph_new("bad");
	kiln_value a = kiln_input(g, "a", KILN_F32, 1, ((int64_t[]){3}));
	kiln_value b = kiln_input(g, "b", KILN_F32, 1, ((int64_t[]){4}));
	kiln_add(g, a, b);
	kiln_error err = {0};
	void *data = NULL;
	size_t size = 0;
	ck_assert_int_eq(kiln_onnx_export_mem(g, &data, &size, &err), KILN_ESHAPE);
	ck_assert_ptr_nonnull(strstr(err.msg, "graph has an error"));
	ck_assert_ptr_null(data);
	ck_assert_int_eq(kiln_onnx_export_mem(NULL, &data, &size, &err), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "null argument"));
	kiln_graph_free(g);
}
END_TEST

START_TEST(export_maps_every_op_in_the_table)
{
	char missing[1024] = "";
	for (int op = 0; op < KILN_OP_COUNT; op++)
		if (!onnx_export_maps((kiln_op)op))
			strncat(missing, ir_op((kiln_op)op)->kir, sizeof missing - strlen(missing) - 2);
	ck_assert_msg(!missing[0], "ops without an ONNX export: %s", missing);
}
END_TEST

/* ---- round trips over the op table -------------------------------------- */

START_TEST(roundtrip_elementwise_ops)
{
	kiln_graph *g = kiln_graph_new("elementwise");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, ((int64_t[]){N, 6}));
	kiln_value y = kiln_input(g, "y", KILN_F32, 2, ((int64_t[]){1, 6}));
	kiln_value p = kiln_add(g, kiln_abs(g, x), kiln_scalar(g, KILN_F32, 0.5));
	kiln_value u = kiln_add(g, kiln_log(g, p), kiln_sqrt(g, p));
	u = kiln_add(g, u, kiln_mul(g, kiln_reciprocal(g, p), kiln_exp(g, kiln_neg(g, x))));
	u = kiln_sub(g, u, kiln_div(g, kiln_floor(g, x), kiln_add(g, kiln_ceil(g, p), y)));
	u = kiln_add(g, u, kiln_mul(g, kiln_sin(g, x), kiln_cos(g, y)));
	u = kiln_add(g, u, kiln_pow(g, p, kiln_scalar(g, KILN_F32, 1.5)));
	u = kiln_add(g, u, kiln_leaky_relu(g, kiln_relu(g, x), 0.2));
	u = kiln_add(g, u, kiln_mul(g, kiln_sigmoid(g, x), kiln_tanh(g, y)));
	u = kiln_add(g, u, kiln_erf(g, kiln_clip(g, x, -1, 1)));
	u = kiln_max(g, u, kiln_min(g, x, kiln_identity(g, y)));
	kiln_value c = kiln_and(g, kiln_less(g, x, y), kiln_not(g, kiln_equal(g, x, y)));
	c = kiln_or(g, c, kiln_greater(g, x, kiln_scalar(g, KILN_F32, 1.0)));
	kiln_output(g, "u", kiln_where(g, c, u, kiln_cast(g, kiln_cast(g, x, KILN_I64), KILN_F32)));
	kiln_output(g, "mask", c);
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_tensor *in[2] = {random_tensor(KILN_F32, 2, (int64_t[]){3, 6}, 1, -2, 2),
	                      random_tensor(KILN_F32, 2, (int64_t[]){1, 6}, 2, -2, 2)};
	check_roundtrip("elementwise", g, in, 2, 0);
	free_all(in, 2);
	kiln_graph_free(g);
}
END_TEST

START_TEST(roundtrip_reduction_and_shape_ops)
{
	kiln_graph *g = kiln_graph_new("shapes");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 3, ((int64_t[]){N, 4, 6}));
	kiln_value idx = kiln_input(g, "idx", KILN_I64, 1, ((int64_t[]){3}));
	kiln_value parts[2];
	kiln_split(g, x, 2, 2, ((int64_t[]){2, 4}), parts);
	kiln_value a = kiln_concat(g, 2, ((kiln_value[]){parts[1], parts[0]}), 2);
	a = kiln_transpose(g, a, 3, ((int64_t[]){0, 2, 1}));            /* [N,6,4] */
	a = kiln_reshape(g, a, 3, ((int64_t[]){0, 3, -1}));             /* [N,3,8] */
	a = kiln_slice(g, a, 1, ((int64_t[]){1}), ((int64_t[]){7}), ((int64_t[]){2}),
	               ((int64_t[]){2}));                                 /* [N,3,3] */
	a = kiln_gather(g, a, idx, 1);                                    /* [N,3,3] */
	a = kiln_unsqueeze(g, a, 1, ((int64_t[]){1}));                    /* [N,1,3,3] */
	a = kiln_pad(g, a, 4, ((int64_t[]){0, 0, 1, 0, 0, 0, 1, 2}), "constant", 0.5);
	a = kiln_squeeze(g, a, 1, ((int64_t[]){1}));                      /* [N,5,5] */
	kiln_value s = kiln_reduce_sum(g, a, 1, ((int64_t[]){2}), true);  /* [N,5,1] */
	a = kiln_add(g, kiln_expand(g, s, 3, ((int64_t[]){N, 5, 5})), a);
	kiln_value m = kiln_reduce_mean(g, a, 1, ((int64_t[]){1}), false);
	kiln_value mx = kiln_reduce_max(g, kiln_softmax(g, a, -1), 0, NULL, false);
	kiln_output(g, "flat", kiln_flatten(g, kiln_log_softmax(g, a, 1), 1));
	kiln_output(g, "mean", kiln_add(g, m, mx));
	kiln_output(g, "arg", kiln_argmax(g, a, 2, false));
	kiln_output(g, "shape", kiln_shape_of(g, a));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_tensor *in[2] = {random_tensor(KILN_F32, 3, (int64_t[]){2, 4, 6}, 3, -2, 2),
	                      random_tensor(KILN_I64, 1, (int64_t[]){3}, 4, 0, 3)};
	check_roundtrip("shapes", g, in, 2, 0);
	free_all(in, 2);
	kiln_graph_free(g);
}
END_TEST

START_TEST(roundtrip_conv_norm_and_pool_ops)
{
	kiln_graph *g = kiln_graph_new("cnn");
	kiln_graph_seed(g, 7);
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 4, ((int64_t[]){N, 3, 10, 10}));
	kiln_conv_opts c3 = {.kernel = {3, 3}, .pad = {1, 1, 1, 1}};
	kiln_value h = kiln_relu(g, kiln_batchnorm(g, "bn1", kiln_conv2d(g, "conv1", x, 4, &c3,
	                                                                true), 1e-5, 0.1));
	kiln_conv_opts p2 = {.kernel = {2, 2}, .stride = {2, 2}};
	kiln_value a = kiln_max_pool(g, h, &p2);
	kiln_value b = kiln_avg_pool(g, h, &p2);
	kiln_tensor *wt = random_tensor(KILN_F32, 4, (int64_t[]){4, 2, 2, 2}, 9, -0.5, 0.5);
	kiln_value w = kiln_param(g, "up.weight", wt);
	kiln_value up = kiln_conv_transpose(g, kiln_add(g, a, b), w, KILN_NONE, &p2);
	kiln_value gp = kiln_flatten(g, kiln_global_avg_pool(g, up), 1);
	kiln_value f = kiln_layernorm(g, "ln", kiln_linear(g, "fc", gp, 5, true), 1, 1e-5);
	kiln_output(g, "y", kiln_dropout(g, f, 0.3, false, 0));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_tensor *in[1] = {random_tensor(KILN_F32, 4, (int64_t[]){2, 3, 10, 10}, 5, -1, 1)};
	check_roundtrip("cnn", g, in, 1, 0);
	free_all(in, 1);
	kiln_tensor_free(wt);
	kiln_graph_free(g);
}
END_TEST

START_TEST(roundtrip_losses_and_gemm)
{
	kiln_graph *g = kiln_graph_new("losses");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, ((int64_t[]){4, 5}));
	kiln_value t = kiln_input(g, "t", KILN_I64, 1, ((int64_t[]){4}));
	kiln_tensor *bt = random_tensor(KILN_F32, 2, (int64_t[]){5, 5}, 11, -1, 1);
	kiln_value logits = kiln_gemm(g, x, kiln_param(g, "B", bt), KILN_NONE, 0.5, 1, false, true);
	kiln_output(g, "ce", kiln_softmax_cross_entropy(g, logits, t, KILN_NONE, "mean", false, 0));
	kiln_output(g, "nll", kiln_nll_loss(g, kiln_log_softmax(g, logits, 1), t, KILN_NONE, "sum",
	                                    true, 2));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_tensor *in[2] = {random_tensor(KILN_F32, 2, (int64_t[]){4, 5}, 12, -2, 2),
	                      random_tensor(KILN_I64, 1, (int64_t[]){4}, 13, 0, 5)};
	check_roundtrip("losses", g, in, 2, 0);
	free_all(in, 2);
	kiln_tensor_free(bt);
	kiln_graph_free(g);
}
END_TEST

/* Gelu and Mish (opset 20 and 18) leave as their formulas: the re-imported
 * graph has no gelu or mish node but computes the same within float
 * rounding. */
START_TEST(roundtrip_gelu_as_formula_matches)
{
	kiln_graph *g = kiln_graph_new("gelu");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, ((int64_t[]){3, 7}));
	kiln_output(g, "exact", kiln_gelu(g, x, false));
	kiln_output(g, "tanh", kiln_gelu(g, x, true));
	kiln_output(g, "mish", kiln_mish(g, x));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	kiln_tensor *in[1] = {random_tensor(KILN_F32, 2, (int64_t[]){3, 7}, 21, -4, 4)};
	kiln_graph *g1 = reimport(g);
	char *k = kiln_graph_to_kir(g1);
	ck_assert_ptr_null(strstr(k, "= gelu "));
	ck_assert_ptr_null(strstr(k, "= mish "));
	ck_assert_ptr_nonnull(strstr(k, "= erf "));
	ck_assert_ptr_nonnull(strstr(k, "= tanh "));
	free(k);
	kiln_tensor *a[3], *b[3];
	run(g, in, 1, a);
	run(g1, in, 1, b);
	for (int i = 0; i < 3; i++) {
		ck_assert_double_le(max_abs_diff(a[i], b[i]), 1e-6);
		kiln_tensor_free(a[i]);
		kiln_tensor_free(b[i]);
	}
	write_case("gelu", g, in, 1);
	free_all(in, 1);
	kiln_graph_free(g1);
	kiln_graph_free(g);
}
END_TEST

/* ---- real PyTorch models ------------------------------------------------ */

/* .kir leaves weights out: every parameter comes back with its bytes. */
static void assert_same_params(const char *name, const kiln_graph *a, const kiln_graph *b)
{
	int n = 0;
	for (uint32_t i = 1; i < a->nval; i++) {
		const ir_value *v = a->val[i];
		if (v->kind != IR_V_PARAM)
			continue;
		kiln_value w = kiln_graph_find_param(b, v->name);
		ck_assert_msg(w, "%s: parameter '%s' is lost in export/import", name, v->name);
		const kiln_tensor *x = v->data, *y = b->val[w]->data;
		ck_assert_msg(x->dtype == y->dtype && kiln_tensor_nbytes(x) == kiln_tensor_nbytes(y) &&
		              !memcmp(x->data, y->data, kiln_tensor_nbytes(x)),
		              "%s: parameter '%s' changes in export/import", name, v->name);
		n++;
	}
	ck_assert_int_gt(n, 0);
}

static void real_model(const char *name)
{
	const char *dir = getenv("KILN_REAL_MODELS");
	if (!dir) {
		printf("real_models/%s: skipped: KILN_REAL_MODELS unset (ctest -R onnx_real_models)\n",
		       name);
		return;
	}
	char path[512], ipath[512], opath[512];
	snprintf(path, sizeof path, "%s/%s.onnx", dir, name);
	snprintf(ipath, sizeof ipath, "%s/%s_input.npy", dir, name);
	snprintf(opath, sizeof opath, "%s/%s_output.npy", dir, name);
	kiln_error err = {0};
	kiln_graph *g = NULL;
	kiln_tensor *in = NULL, *want = NULL, *got = NULL;
	ck_assert_msg(kiln_npy_read(ipath, &in, &err) == KILN_OK,
	              "%s (run tests/onnx/make_real_models.py %s)", err.msg, dir);
	ck_assert_msg(kiln_npy_read(opath, &want, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_onnx_import(path, &g, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_graph_verify(g, &err) == KILN_OK, "%s", err.msg);
	ck_assert_msg(kiln_graph_run(g, &in, 1, &got, 1, &err) == KILN_OK, "%s", err.msg);
	double d = max_abs_diff(got, want);
	printf("real_models/%s: max abs error vs PyTorch %.3g\n", name, d);
	ck_assert_msg(d <= 1e-4, "%s: max abs error %g vs PyTorch", name, d);
	/* import -> export -> import gives the same graph */
	void *data = NULL;
	size_t size = 0;
	ck_assert_msg(kiln_onnx_export_mem(g, &data, &size, &err) == KILN_OK, "%s", err.msg);
	kiln_graph *back = NULL;
	ck_assert_msg(kiln_onnx_import_mem(data, size, path, &back, &err) == KILN_OK, "%s",
	              err.msg);
	char *k1 = kiln_graph_to_kir(g), *k2 = kiln_graph_to_kir(back);
	ck_assert_msg(k1 && k2 && !strcmp(k1, k2), "%s: .kir differs after export/import", name);
	assert_same_params(name, g, back);
	free(k1);
	free(k2);
	free(data);
	kiln_tensor *pin[1] = {in};
	write_case(name, g, pin, 1);
	kiln_graph_free(back);
	kiln_graph_free(g);
	kiln_tensor_free(in);
	kiln_tensor_free(want);
	kiln_tensor_free(got);
}

START_TEST(real_resnet18_matches_pytorch_and_roundtrips) { real_model("resnet18"); }
END_TEST
START_TEST(real_mobilenet_v2_matches_pytorch_and_roundtrips) { real_model("mobilenet_v2"); }
END_TEST
START_TEST(real_transformer_matches_pytorch_and_roundtrips) { real_model("transformer"); }
END_TEST
START_TEST(real_transformer_static_matches_pytorch_and_roundtrips)
{
	real_model("transformer_static");
}
END_TEST

static Suite *onnx_export_suite(void)
{
	Suite *s = suite_create("onnx_export");
	TCase *t = tcase_create("model");
	tcase_add_test(t, export_writes_ir8_opset17_and_producer);
	tcase_add_test(t, export_params_become_raw_initializers_by_name);
	tcase_add_test(t, export_keeps_input_output_names_and_dim_params);
	tcase_add_test(t, export_dim_expressions_become_dim_params);
	tcase_add_test(t, export_names_unnamed_and_duplicate_values_uniquely);
	suite_add_tcase(s, t);
	t = tcase_create("inputs_from_attributes");
	tcase_add_test(t, export_reshape_shape_is_an_int64_constant_input);
	tcase_add_test(t, export_clip_bounds_are_scalars_of_the_input_dtype);
	tcase_add_test(t, export_slice_leaves_off_trailing_absent_inputs);
	tcase_add_test(t, export_dropout_ratio_is_a_float_and_mode_a_bool);
	tcase_add_test(t, export_cast_to_is_the_onnx_dtype_code);
	tcase_add_test(t, export_expand_symbolic_dim_the_input_has_is_1);
	tcase_add_test(t, export_expand_to_a_new_symbolic_dim_reads_it_from_an_input);
	suite_add_tcase(s, t);
	t = tcase_create("files_and_errors");
	tcase_add_test(t, export_file_reads_back_and_replaces_atomically);
	tcase_add_test(t, export_to_missing_folder_is_eio_naming_the_path);
	tcase_add_test(t, export_refuses_a_graph_in_error);
	tcase_add_test(t, export_maps_every_op_in_the_table);
	suite_add_tcase(s, t);
	t = tcase_create("roundtrip");
	tcase_add_test(t, roundtrip_elementwise_ops);
	tcase_add_test(t, roundtrip_reduction_and_shape_ops);
	tcase_add_test(t, roundtrip_conv_norm_and_pool_ops);
	tcase_add_test(t, roundtrip_losses_and_gemm);
	tcase_add_test(t, roundtrip_gelu_as_formula_matches);
	tcase_add_test(t, roundtrip_symbolic_attributes_at_two_lengths);
	suite_add_tcase(s, t);
	t = tcase_create("real_models");
	tcase_set_timeout(t, 1200);
	tcase_add_test(t, real_resnet18_matches_pytorch_and_roundtrips);
	tcase_add_test(t, real_mobilenet_v2_matches_pytorch_and_roundtrips);
	tcase_add_test(t, real_transformer_matches_pytorch_and_roundtrips);
	tcase_add_test(t, real_transformer_static_matches_pytorch_and_roundtrips);
	suite_add_tcase(s, t);
	return s;
}

#include "check_main.h"
KILN_CHECK_MAIN(onnx_export_suite)
