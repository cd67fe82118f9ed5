/*
 * digits_app.c: a user's program on a compiled model, with nothing of kiln
 * but the generated digits.so and digits.h (examples/demo.sh builds it):
 *
 *     kiln compile digits.int8.onnx -o digits.so --name digits
 *     cc digits_app.c -I. digits.so -Wl,-rpath,'$ORIGIN' -o app
 *     ./app test_img.npy test_y.npy
 *
 * It reads held-out 8x8 digit images (f32[N,1,8,8]) and their labels
 * (i64[N]) from .npy files, runs them as one batch, prints the first
 * predictions beside the labels and the accuracy over all of them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "digits.h"

enum { CLASSES = 10, SHOWN = 16 };

/* A little-endian .npy of dtype descr ("<f4", "<i8") with n elements of
 * elem bytes, C order; its first dim into *rows.  NULL after a message. */
static void *read_npy(const char *path, const char *descr, size_t elem, int64_t *rows,
                      int64_t *count)
{
	FILE *f = fopen(path, "rb");
	unsigned char pre[10];
	char header[1024];
	void *data = NULL;
	if (!f) {
		perror(path);
		return NULL;
	}
	if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0 || pre[6] != 1) {
		fprintf(stderr, "%s: not a version 1 .npy file\n", path);
		goto out;
	}
	size_t hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
	if (hlen >= sizeof header || fread(header, 1, hlen, f) != hlen) {
		fprintf(stderr, "%s: bad header\n", path);
		goto out;
	}
	header[hlen] = 0;
	const char *shape = strstr(header, "'shape': (");
	if (!strstr(header, descr) || strstr(header, "'fortran_order': True") || !shape) {
		fprintf(stderr, "%s: want a C-order %s array\n", path, descr);
		goto out;
	}
	int64_t n = 1, first = -1;
	for (char *p = (char *)shape + 10; *p && *p != ')';) {
		long long d = strtoll(p, &p, 10);
		if (d <= 0 || d > 1 << 24) {
			fprintf(stderr, "%s: bad shape\n", path);
			goto out;
		}
		first = first < 0 ? d : first;
		n *= d;
		while (*p == ',' || *p == ' ')
			p++;
	}
	if (first < 0 || n > 1 << 26 || !(data = malloc((size_t)n * elem)) ||
	    fread(data, elem, (size_t)n, f) != (size_t)n) {
		fprintf(stderr, "%s: cannot read its data\n", path);
		free(data);
		data = NULL;
		goto out;
	}
	*rows = first, *count = n;
out:
	fclose(f);
	return data;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s IMAGES.npy LABELS.npy\n", argv[0]);
		return 2;
	}
	int64_t n = 0, nx = 0, ny = 0, nl = 0;
	float *x = read_npy(argv[1], "'<f4'", sizeof(float), &n, &nx);
	int64_t *y = read_npy(argv[2], "'<i8'", sizeof(int64_t), &ny, &nl);
	float *logits = x ? malloc(sizeof *logits * (size_t)(n * CLASSES)) : NULL;
	digits_ctx *ctx = digits_create();
	int rc = 1;
	if (!x || !y || !logits || !ctx || nx != n * 64 || nl != n || ny != n) {
		fprintf(stderr, "app: want f32[N,1,8,8] images and N labels\n");
		goto out;
	}
	if (digits_run(ctx, n, x, logits) != 0) {
		fprintf(stderr, "app: %s\n", digits_errmsg(ctx));
		goto out;
	}
	int64_t right = 0;
	for (int64_t i = 0; i < n; i++) {
		const float *l = logits + i * CLASSES;
		int best = 0;
		for (int c = 1; c < CLASSES; c++)
			if (l[c] > l[best])
				best = c;
		right += best == y[i];
		if (i < SHOWN)
			printf("%s image %2lld: predicted %d, label %lld%s\n", i ? "     " : "app:",
			       (long long)i, best, (long long)y[i], best == y[i] ? "" : "  (wrong)");
	}
	printf("app: %lld of %lld held-out images right (%.2f%%)\n", (long long)right,
	       (long long)n, 100.0 * (double)right / (double)n);
	rc = 0;
out:
	if (ctx)
		digits_destroy(ctx);
	free(logits);
	free(x);
	free(y);
	return rc;
}
