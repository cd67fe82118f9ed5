/*
 * prog.c: a user's program built against an installed kiln (ctest install,
 * tests/install/install.sh builds it with pkg-config and with CMake's
 * find_package, shared and static).
 *
 *     prog DIR    builds y = x*x - relu(x) with the C DSL, runs it through
 *                 the interpreter, compiles it into DIR/sq.so with
 *                 kiln_compile, loads and runs that, and checks both
 *                 against values worked out by hand; prints the runtime
 *                 archive kiln_compile linked ("runtime: PATH").
 *
 * Exit 0 only when every value is right; every error is printed.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <kiln/kiln.h>

/* x and x*x - relu(x), by hand */
static const float X[2][4] = {{-2, 3, 0.5f, -1}, {4, -0.25f, 0, 1.5f}};
static const float WANT[2][4] = {{4, 6, -0.25f, 1}, {12, 0.0625f, 0, 0.75f}};

static int check(const char *what, const kiln_tensor *y)
{
	if (y->dtype != KILN_F32 || y->rank != 2 || y->shape[0] != 2 || y->shape[1] != 4) {
		fprintf(stderr, "prog: %s: the output is not f32[2,4]\n", what);
		return 1;
	}
	const float *v = y->data;
	for (int i = 0; i < 8; i++)
		if (fabsf(v[i] - WANT[i / 4][i % 4]) > 1e-6f) {
			fprintf(stderr, "prog: %s: y[%d] = %g, want %g\n", what, i, v[i],
			        WANT[i / 4][i % 4]);
			return 1;
		}
	printf("%s: ok\n", what);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: prog DIR\n");
		return 2;
	}
	int bad = 0;
	kiln_error err = {0};
	kiln_graph *g = kiln_graph_new("sq");
	int64_t N = kiln_sym(g, "N");
	kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){N, 4});
	kiln_output(g, "y", kiln_sub(g, kiln_mul(g, x, x), kiln_relu(g, x)));
	kiln_tensor *in = kiln_tensor_new(KILN_F32, 2, (int64_t[]){2, 4});
	kiln_tensor *y = NULL;
	if (kiln_graph_status(g) != KILN_OK || !in) {
		fprintf(stderr, "prog: %s\n", in ? kiln_graph_errmsg(g) : "out of memory");
		bad = 1;
		goto out;
	}
	memcpy(in->data, X, sizeof X);

	if (kiln_graph_run(g, &in, 1, &y, 1, &err) != KILN_OK) {
		fprintf(stderr, "prog: interpreter: %s\n", err.msg);
		bad = 1;
		goto out;
	}
	bad |= check("interpreter", y);
	kiln_tensor_free(y);
	y = NULL;

	char rt[4096], so[4096];
	if (kiln_runtime_archive(rt, sizeof rt, &err) != KILN_OK) {
		fprintf(stderr, "prog: %s\n", err.msg);
		bad = 1;
		goto out;
	}
	printf("runtime: %s\n", rt);
	snprintf(so, sizeof so, "%s/sq.so", argv[1]);
	kiln_model *m = NULL;
	if (kiln_compile(g, so, NULL, &err) != KILN_OK || kiln_load(so, &m, &err) != KILN_OK ||
	    kiln_model_run(m, &in, 1, &y, 1, &err) != KILN_OK) {
		fprintf(stderr, "prog: compiled: %s\n", err.msg);
		bad = 1;
	} else {
		bad |= check("compiled", y);
	}
	kiln_model_free(m);
out:
	kiln_tensor_free(y);
	kiln_tensor_free(in);
	kiln_graph_free(g);
	return bad;
}
