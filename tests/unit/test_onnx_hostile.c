/*
 * test_onnx_hostile.c: the ONNX importer against malformed and malicious
 * models.
 *
 * Every case starts from a small valid model (exported from a DSL graph),
 * unpacks it with protobuf-c, breaks one thing, packs it again and imports
 * it from memory: the importer must return an error whose code and message
 * say what is wrong, and never crash, hang or allocate without bound (the
 * tests run under ASan with leak detection, so a leak on an error path
 * fails too); deep nesting and memory-hungry encodings are built as raw
 * bytes.  Fields replaced in an unpacked model are put back before it
 * is freed, since protobuf-c frees what it finds there.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/onnx/onnx.h"

/* x: f32[N,4] -> relu -> matmul w: f32[4,3] -> y */
static void *base_model(size_t *size)
{
	kiln_graph *g = kiln_graph_new("base");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, ((int64_t[]){N, 4}));
	kiln_tensor *wt = kiln_tensor_new(KILN_F32, 2, (int64_t[]){4, 3});
	kiln_value w = kiln_param(g, "w", wt);
	kiln_output(g, "y", kiln_matmul(g, kiln_relu(g, x), w));
	ck_assert_msg(kiln_graph_status(g) == KILN_OK, "%s", kiln_graph_errmsg(g));
	void *data = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_onnx_export_mem(g, &data, size, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor_free(wt);
	kiln_graph_free(g);
	return data;
}

static Onnx__ModelProto *base_proto(void)
{
	size_t size;
	void *data = base_model(&size);
	Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, size, data);
	free(data);
	ck_assert_ptr_nonnull(m);
	ck_assert_uint_eq(m->graph->n_node, 2);
	ck_assert_str_eq(m->graph->node[0]->op_type, "Relu");
	ck_assert_uint_eq(m->graph->n_initializer, 1);
	return m;
}

/* Imports data and expects failure with code and a message holding want. */
static void expect_error(const void *data, size_t size, kiln_status code, const char *want)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	kiln_status st = kiln_onnx_import_mem(data, size, "evil.onnx", &g, &err);
	ck_assert_msg(st != KILN_OK, "import accepted a bad model (wanted \"%s\")", want);
	ck_assert_ptr_null(g);
	ck_assert_msg(st == code, "code %s, wanted %s: %s", kiln_status_str(st),
	              kiln_status_str(code), err.msg);
	ck_assert_int_eq(err.code, st);
	ck_assert_msg(strstr(err.msg, want), "message lacks \"%s\": %s", want, err.msg);
}

static void expect_proto_error(const Onnx__ModelProto *m, kiln_status code, const char *want)
{
	size_t size = onnx__model_proto__get_packed_size(m);
	uint8_t *buf = malloc(size + 1);
	onnx__model_proto__pack(m, buf);
	expect_error(buf, size, code, want);
	free(buf);
}

/* ---- broken bytes ------------------------------------------------------- */

START_TEST(hostile_truncated_file_is_a_parse_error)
{
	size_t size;
	uint8_t *data = base_model(&size);
	for (size_t cut = 1; cut < size; cut += size / 7)
		expect_error(data, size - cut, KILN_EPARSE, "evil.onnx: not a valid ONNX model");
	expect_error(data, 0, KILN_EUNSUPPORTED, "the model has no graph");
	free(data);
}
END_TEST

START_TEST(hostile_bit_flip_in_op_type_names_the_unknown_op)
{
	size_t size;
	uint8_t *data = base_model(&size);
	uint8_t *p = memmem(data, size, "Relu", 4);
	ck_assert_ptr_nonnull(p);
	p[1] ^= 0x01; /* "Rdlu" */
	expect_error(data, size, KILN_EUNSUPPORTED, "Rdlu");
	expect_error(data, size, KILN_EUNSUPPORTED, "not in kiln's op table");
	free(data);
}
END_TEST

/* Every single-bit flip of the model either imports or fails with a
 * message naming the model; none may crash, leak or hang. */
START_TEST(hostile_every_bit_flip_is_survived)
{
	size_t size;
	uint8_t *data = base_model(&size);
	int failed = 0;
	for (size_t i = 0; i < size * 8; i++) {
		data[i / 8] ^= (uint8_t)(1u << (i % 8));
		kiln_graph *g = NULL;
		kiln_error err = {0};
		kiln_status st = kiln_onnx_import_mem(data, size, "evil.onnx", &g, &err);
		if (st != KILN_OK) {
			failed++;
			ck_assert_ptr_null(g);
			ck_assert_msg(strstr(err.msg, "evil.onnx") || strstr(err.msg, "tensor"),
			              "flip %zu: message names nothing: %s", i, err.msg);
		} else {
			ck_assert_int_eq(kiln_graph_verify(g, &err), KILN_OK);
		}
		kiln_graph_free(g);
		data[i / 8] ^= (uint8_t)(1u << (i % 8));
	}
	ck_assert_int_gt(failed, 0);
	free(data);
}
END_TEST

/* A packed repeated field whose length prefix claims 2^31 bytes. */
START_TEST(hostile_huge_length_prefix_is_a_parse_error)
{
	/* ModelProto.graph (field 7, length-delimited), length 0x7fffffff */
	const uint8_t evil[] = {0x08, 0x08, 0x3a, 0xff, 0xff, 0xff, 0xff, 0x07, 0x0a, 0x00};
	expect_error(evil, sizeof evil, KILN_EPARSE, "not a valid ONNX model");
}
END_TEST

/* 200000 empty nodes: protobuf-c allocates in proportion to the input, and
 * the importer must report (not list) them without blowing up. */
START_TEST(hostile_huge_repeated_node_count_fails_boundedly)
{
	Onnx__ModelProto *m = base_proto();
	size_t n = 200000;
	Onnx__NodeProto **nodes = malloc(n * sizeof *nodes);
	Onnx__NodeProto empty = ONNX__NODE_PROTO__INIT;
	for (size_t i = 0; i < n; i++)
		nodes[i] = &empty;
	Onnx__NodeProto **old = m->graph->node;
	size_t nold = m->graph->n_node;
	m->graph->node = nodes;
	m->graph->n_node = n;
	expect_proto_error(m, KILN_EUNSUPPORTED, "more");
	m->graph->node = old;
	m->graph->n_node = nold;
	free(nodes);
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;
	for (; v >= 0x80; v >>= 7)
		p[n++] = (uint8_t)(v | 0x80);
	p[n++] = (uint8_t)v;
	return n;
}

/* Wraps the len bytes at buf + hdr in field (length-delimited) by writing
 * the tag and length just before them; returns the new start offset. */
static size_t wrap(uint8_t *buf, size_t hdr, size_t len, unsigned field)
{
	uint8_t head[16];
	size_t n = put_varint(head, field << 3 | 2);
	n += put_varint(head + n, len);
	ck_assert_uint_ge(hdr, n);
	memcpy(buf + hdr - n, head, n);
	return hdr - n;
}

/* Graph -> node -> attribute -> graph -> ... 100000 levels in 1.6 MB:
 * protobuf-c would recurse once per level and overflow the stack. */
START_TEST(hostile_deep_nesting_is_refused_before_unpacking)
{
	size_t cap = 4u << 20, start = cap, end = cap;
	uint8_t *buf = malloc(cap);
	for (int i = 0; i < 100000; i++) {
		start = wrap(buf, start, end - start, 6); /* AttributeProto.g */
		buf[--start] = 'a', buf[--start] = 1, buf[--start] = 0x0a; /* .name = "a" */
		start = wrap(buf, start, end - start, 5); /* NodeProto.attribute */
		start = wrap(buf, start, end - start, 1); /* GraphProto.node */
	}
	start = wrap(buf, start, end - start, 7);    /* ModelProto.graph */
	buf[--start] = 8, buf[--start] = 0x08;        /* ir_version 8 */
	ck_assert_int_eq(onnx_wire_depth(buf + start, end - start, 64), 65);
	expect_error(buf + start, end - start, KILN_EPARSE,
	             "evil.onnx: protobuf messages nested more than 64 deep");
	free(buf);
}
END_TEST

START_TEST(hostile_wire_depth_of_a_plain_model_is_seven)
{
	size_t size;
	uint8_t *data = base_model(&size);
	/* model > graph > input > type > tensor_type > shape > dim */
	ck_assert_int_eq(onnx_wire_depth(data, size, ONNX_MAX_DEPTH), 7);
	ck_assert_int_eq(onnx_wire_depth(data, size, 6), 7);
	ck_assert_int_eq(onnx_wire_depth(data, size - 1, ONNX_MAX_DEPTH), -1);
	free(data);
}
END_TEST

/* 4M empty nodes: 8 MB on the wire, about 450 MB once unpacked, over the
 * 16x + 64 MiB budget: refused while unpacking, not allocated. */
START_TEST(hostile_unpack_over_memory_budget_is_refused)
{
	size_t n = 4u << 20, cap = 2 * n + 32, start = 32;
	uint8_t *buf = malloc(cap);
	for (size_t i = 0; i < n; i++)
		buf[start + 2 * i] = 0x0a, buf[start + 2 * i + 1] = 0; /* GraphProto.node {} */
	start = wrap(buf, start, cap - start, 7);
	buf[--start] = 8, buf[--start] = 0x08;
	char want[160];
	size_t size = cap - start;
	snprintf(want, sizeof want, "evil.onnx: decoding needs more than %zu bytes of memory "
	         "(16x the file's %zu bytes plus 64 MiB", 16 * size + (64u << 20), size);
	expect_error(buf + start, size, KILN_ENOMEM, want);
	free(buf);
}
END_TEST

/* ---- broken tensors ----------------------------------------------------- */

START_TEST(hostile_oversized_initializer_dim_is_refused)
{
	Onnx__ModelProto *m = base_proto();
	Onnx__TensorProto *w = m->graph->initializer[0];
	int64_t dims[2] = {3, (int64_t)1 << 40}, *old = w->dims;
	w->dims = dims;
	expect_proto_error(m, KILN_EPARSE, "tensor 'w': dim 1 (1099511627776) is negative or "
	                   "the size is too large");
	w->dims = old;
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

START_TEST(hostile_raw_data_size_mismatch_is_refused)
{
	Onnx__ModelProto *m = base_proto();
	Onnx__TensorProto *w = m->graph->initializer[0];
	w->dims[0] = 5; /* [5,3] needs 60 bytes; raw_data has 48 */
	expect_proto_error(m, KILN_EPARSE, "tensor 'w': raw_data has 48 bytes, its shape needs 60");
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

/* Packs m with x's dims set to d0, d1 (then put back). */
static uint8_t *with_input_dims(Onnx__ModelProto *m, int64_t d0, int64_t d1, size_t *size)
{
	Onnx__TensorShapeProto__Dimension **d = m->graph->input[0]->type->tensor_type->shape->dim;
	Onnx__TensorShapeProto__Dimension saved = *d[0];
	int64_t old1 = d[1]->dim_value;
	d[0]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
	d[0]->dim_value = d0;
	d[1]->dim_value = d1;
	*size = onnx__model_proto__get_packed_size(m);
	uint8_t *buf = malloc(*size);
	onnx__model_proto__pack(m, buf);
	*d[0] = saved;
	d[1]->dim_value = old1;
	return buf;
}

/* A big input dim costs nothing at import (no data); running the graph on
 * a real tensor is refused, not allocated for. */
START_TEST(hostile_large_input_dim_is_refused_at_run)
{
	Onnx__ModelProto *m = base_proto();
	size_t size;
	uint8_t *buf = with_input_dims(m, (int64_t)1 << 38, 4, &size); /* 2^40 elements */
	kiln_graph *g = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_onnx_import_mem(buf, size, "evil.onnx", &g, &err) == KILN_OK, "%s",
	              err.msg);
	ck_assert_int_eq(kiln_value_dim(g, kiln_graph_input(g, 0), 0), (int64_t)1 << 38);
	kiln_tensor *x = kiln_tensor_new(KILN_F32, 2, (int64_t[]){2, 4}), *y = NULL;
	kiln_status st = kiln_graph_run(g, &x, 1, &y, 1, &err);
	ck_assert_int_ne(st, KILN_OK);
	ck_assert_ptr_null(y);
	ck_assert_msg(strstr(err.msg, "274877906944"), "%s", err.msg);
	kiln_tensor_free(x);
	kiln_graph_free(g);
	free(buf);
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

/* Input dims whose product passes kiln's 2^40-element cap, or int64
 * itself, are refused at import, naming the input and its type. */
START_TEST(hostile_input_element_count_over_the_cap_is_refused)
{
	Onnx__ModelProto *m = base_proto();
	size_t size;
	uint8_t *buf = with_input_dims(m, (int64_t)1 << 40, 4, &size);
	expect_error(buf, size, KILN_EINVAL, "evil.onnx: graph input 'x' is f32[1099511627776,4]: "
	             "more than 2^40 elements");
	free(buf);
	buf = with_input_dims(m, (int64_t)1 << 40, (int64_t)1 << 40, &size); /* 2^80 */
	expect_error(buf, size, KILN_EINVAL, "graph input 'x' is f32[1099511627776,"
	             "1099511627776]: more than 2^40 elements");
	free(buf);
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

START_TEST(hostile_negative_dims_are_refused)
{
	Onnx__ModelProto *m = base_proto();
	m->graph->initializer[0]->dims[1] = -3;
	expect_proto_error(m, KILN_EPARSE, "tensor 'w': dim 1 (-3) is negative");
	m->graph->initializer[0]->dims[1] = 3;
	m->graph->input[0]->type->tensor_type->shape->dim[1]->dim_value = -4;
	expect_proto_error(m, KILN_EINVAL, "graph input 'x': dim 1 is -4");
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

START_TEST(hostile_absurd_rank_is_refused)
{
	Onnx__ModelProto *m = base_proto();
	Onnx__TensorProto *w = m->graph->initializer[0];
	int64_t dims[100], *old = w->dims;
	size_t nold = w->n_dims;
	for (int i = 0; i < 100; i++)
		dims[i] = 1;
	w->dims = dims;
	w->n_dims = 100;
	expect_proto_error(m, KILN_EUNSUPPORTED, "tensor 'w' has rank 100; kiln allows 8");
	w->dims = old;
	w->n_dims = nold;
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

START_TEST(hostile_wrong_typed_field_is_refused)
{
	Onnx__ModelProto *m = base_proto();
	Onnx__TensorProto *w = m->graph->initializer[0];
	/* an INT64 tensor of 12 elements whose values sit in float_data */
	float f[12] = {0};
	w->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
	w->has_raw_data = 0;
	w->n_float_data = 12;
	w->float_data = f;
	expect_proto_error(m, KILN_EPARSE, "tensor 'w': 0 values for 12 elements");
	w->n_float_data = 0;
	w->float_data = NULL;
	w->has_raw_data = 1;
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

/* ---- broken graphs ------------------------------------------------------ */

START_TEST(hostile_cycle_is_refused)
{
	Onnx__ModelProto *m = base_proto();
	Onnx__NodeProto *relu = m->graph->node[0], *mm = m->graph->node[1];
	char *old = relu->input[0];
	relu->input[0] = mm->output[0]; /* relu reads matmul, which reads relu */
	expect_proto_error(m, KILN_EINVAL, "dangling name or cycle");
	relu->input[0] = old;
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

START_TEST(hostile_dangling_input_name_is_refused)
{
	Onnx__ModelProto *m = base_proto();
	Onnx__NodeProto *mm = m->graph->node[1];
	char *old = mm->input[1];
	mm->input[1] = "no_such_value";
	expect_proto_error(m, KILN_EINVAL, "input 'no_such_value' is not an earlier node's output");
	mm->input[1] = old;
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

START_TEST(hostile_too_many_inputs_is_refused)
{
	Onnx__ModelProto *m = base_proto();
	Onnx__NodeProto *relu = m->graph->node[0];
	char **old = relu->input, *three[3] = {old[0], old[0], old[0]};
	relu->input = three;
	relu->n_input = 3;
	expect_proto_error(m, KILN_EUNSUPPORTED, "3 inputs");
	relu->input = old;
	relu->n_input = 1;
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

START_TEST(hostile_unnamed_output_is_refused)
{
	Onnx__ModelProto *m = base_proto();
	char *old = m->graph->output[0]->name;
	m->graph->output[0]->name = "ghost";
	expect_proto_error(m, KILN_EINVAL, "graph output 'ghost' is not computed");
	m->graph->output[0]->name = old;
	onnx__model_proto__free_unpacked(m, NULL);
}
END_TEST

static Suite *onnx_hostile_suite(void)
{
	Suite *s = suite_create("onnx_hostile");
	TCase *t = tcase_create("bytes");
	tcase_set_timeout(t, 600);
	tcase_add_test(t, hostile_truncated_file_is_a_parse_error);
	tcase_add_test(t, hostile_bit_flip_in_op_type_names_the_unknown_op);
	tcase_add_test(t, hostile_every_bit_flip_is_survived);
	tcase_add_test(t, hostile_huge_length_prefix_is_a_parse_error);
	tcase_add_test(t, hostile_huge_repeated_node_count_fails_boundedly);
	tcase_add_test(t, hostile_deep_nesting_is_refused_before_unpacking);
	tcase_add_test(t, hostile_wire_depth_of_a_plain_model_is_seven);
	tcase_add_test(t, hostile_unpack_over_memory_budget_is_refused);
	suite_add_tcase(s, t);
	t = tcase_create("tensors");
	tcase_add_test(t, hostile_oversized_initializer_dim_is_refused);
	tcase_add_test(t, hostile_raw_data_size_mismatch_is_refused);
	tcase_add_test(t, hostile_large_input_dim_is_refused_at_run);
	tcase_add_test(t, hostile_input_element_count_over_the_cap_is_refused);
	tcase_add_test(t, hostile_negative_dims_are_refused);
	tcase_add_test(t, hostile_absurd_rank_is_refused);
	tcase_add_test(t, hostile_wrong_typed_field_is_refused);
	suite_add_tcase(s, t);
	t = tcase_create("graphs");
	tcase_add_test(t, hostile_cycle_is_refused);
	tcase_add_test(t, hostile_dangling_input_name_is_refused);
	tcase_add_test(t, hostile_too_many_inputs_is_refused);
	tcase_add_test(t, hostile_unnamed_output_is_refused);
	suite_add_tcase(s, t);
	return s;
}

#include "check_main.h"
KILN_CHECK_MAIN(onnx_hostile_suite)
