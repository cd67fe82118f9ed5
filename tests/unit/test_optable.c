/* test_optable.c: the op table in ops.def and the per-stage tables that
 * hang off it.  A new op row fails here, listing what it still lacks, until
 * every stage has an entry for it. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

#include "check_main.h"

/* Appends name to a space-separated list, for messages. */
static void note(char *list, size_t size, const char *name)
{
	size_t k = strlen(list);
	snprintf(list + k, size - k, "%s%s", k ? " " : "", name);
}

START_TEST(every_op_has_a_shape_rule)
{
	char missing[2048] = "";
	for (int op = 0; op < KILN_OP_COUNT; op++)
		if (!ir_shape_rule(op))
			note(missing, sizeof missing, ir_op(op)->onnx);
	ck_assert_msg(!missing[0], "ops without a shape rule (ir_shape_rule): %s", missing);
}
END_TEST

START_TEST(every_op_has_an_interpreter)
{
	char missing[2048] = "";
	for (int op = 0; op < KILN_OP_COUNT; op++)
		if (!ir_interp_kernel(op))
			note(missing, sizeof missing, ir_op(op)->onnx);
	ck_assert_msg(!missing[0], "ops without an interpreter kernel (ir_interp_kernel): %s", missing);
}
END_TEST

/* Every formula in ir/scalar.c builds with its attributes' defaults, and
 * its symbolic derivative agrees with central differences of the formula,
 * in double, at points away from every kink. */
START_TEST(every_formula_has_a_matching_derivative)
{
	static const double at[] = {-1.3, -0.41, 0.37, 2.1};
	for (int op = 0; op < KILN_OP_COUNT; op++) {
		if (!ir_scalar_table[op])
			continue;
		ir_node n = {.op = (kiln_op)op};
		ir_sexpr f, d;
		ck_assert_msg(ir_scalar_build(&n, &f) == KILN_OK, "%s: no formula", ir_op(op)->onnx);
		ck_assert_msg(ir_scalar_deriv(&n, &d) == KILN_OK, "%s: no derivative",
		              ir_op(op)->onnx);
		for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
			double h = 1e-6, x = at[i];
			double fd = (ir_scalar_eval(&f, x + h) - ir_scalar_eval(&f, x - h)) / (2 * h);
			double got = ir_scalar_eval(&d, x);
			ck_assert_msg(fabs(got - fd) <= 1e-6 * (1 + fabs(fd)),
			              "%s'(%g) = %.9g, central difference %.9g", ir_op(op)->onnx, x,
			              got, fd);
		}
	}
}
END_TEST

/* The schema parser maps an unknown kind to dtype, so the kinds are checked
 * against the text here. */
static bool kind_known(const char *tok)
{
	static const char *const kinds[] = {"i", "f", "is", "ds", "fs", "s", "t", "dt"};
	const char *k = strchr(tok, ':');
	if (!k)
		return false;
	size_t len = strcspn(++k, "=! ");
	for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
		if (strlen(kinds[i]) == len && !strncmp(kinds[i], k, len))
			return true;
	return false;
}

START_TEST(every_schema_parses)
{
	for (int op = 0; op < KILN_OP_COUNT; op++) {
		const char *attrs = ir_op(op)->attrs, *onnx = ir_op(op)->onnx;
		ir_attr_schema sc[32];
		int n = ir_op_schema(op, sc, 32), tokens = 0;
		for (const char *p = attrs; *p;) {
			p += strspn(p, " ");
			if (!*p)
				break;
			ck_assert_msg(kind_known(p), "%s: bad attribute kind in \"%s\"", onnx, p);
			tokens++;
			p += strcspn(p, " ");
		}
		ck_assert_msg(n == tokens, "%s: schema \"%s\" parsed into %d of %d entries", onnx,
		              attrs, n, tokens);
		for (int i = 0; i < n; i++) {
			ck_assert_msg(sc[i].name[0], "%s: attribute %d has no name", onnx, i);
			ck_assert_msg(!(sc[i].required && sc[i].has_default),
			              "%s: '%s' is both required and defaulted", onnx, sc[i].name);
			for (int j = 0; j < i; j++)
				ck_assert_msg(strcmp(sc[i].name, sc[j].name), "%s: '%s' listed twice",
				              onnx, sc[i].name);
		}
	}
}
END_TEST

START_TEST(schema_reads_kinds_and_defaults)
{
	ir_attr_schema sc[8];
	ck_assert_int_eq(ir_op_schema(KILN_OP_CAST, sc, 8), 1);
	ck_assert_str_eq(sc[0].name, "to");
	ck_assert_int_eq(sc[0].kind, IR_A_DTYPE);
	ck_assert(sc[0].required);
	ck_assert_int_eq(ir_op_schema(KILN_OP_LEAKY_RELU, sc, 8), 1);
	ck_assert_int_eq(sc[0].kind, IR_A_FLOAT);
	ck_assert_str_eq(sc[0].dflt, "0.01");
	ck_assert_int_eq(ir_op_schema(KILN_OP_RELU, sc, 8), 0);
}
END_TEST

START_TEST(kir_and_onnx_names_are_unique)
{
	for (int a = 0; a < KILN_OP_COUNT; a++) {
		ck_assert_int_eq(ir_op_from_kir(ir_op(a)->kir), a);
		ck_assert_int_eq(ir_op_from_onnx(ir_op(a)->onnx), a);
		for (int b = 0; b < a; b++) {
			ck_assert_msg(strcmp(ir_op(a)->kir, ir_op(b)->kir), "kir name %s used twice",
			              ir_op(a)->kir);
			ck_assert_msg(strcmp(ir_op(a)->onnx, ir_op(b)->onnx),
			              "onnx name %s used twice", ir_op(a)->onnx);
		}
	}
	ck_assert_int_eq(ir_op_from_kir("no_such_op"), KILN_OP_COUNT);
}
END_TEST

START_TEST(arity_ranges_are_sane)
{
	for (int op = 0; op < KILN_OP_COUNT; op++) {
		const ir_op_info *o = ir_op(op);
		ck_assert_msg(o->in_min <= o->in_max, "%s: in_min > in_max", o->onnx);
		ck_assert_msg(o->out_min >= 1 && o->out_min <= o->out_max, "%s: bad outputs",
		              o->onnx);
	}
}
END_TEST

static Suite *optable_suite(void)
{
	Suite *s = suite_create("optable");
	TCase *t = tcase_create("tables");
	tcase_add_test(t, every_op_has_a_shape_rule);
	tcase_add_test(t, every_op_has_an_interpreter);
	tcase_add_test(t, every_formula_has_a_matching_derivative);
	suite_add_tcase(s, t);
	t = tcase_create("schema");
	tcase_add_test(t, every_schema_parses);
	tcase_add_test(t, schema_reads_kinds_and_defaults);
	tcase_add_test(t, kir_and_onnx_names_are_unique);
	tcase_add_test(t, arity_ranges_are_sane);
	suite_add_tcase(s, t);
	return s;
}

KILN_CHECK_MAIN(optable_suite)
