/*
 * app.c: a user's program built on a compiled model, with nothing of kiln
 * but the generated model.so and model.h (examples/app.sh builds it):
 *
 *     kiln compile cnn.kir -o model.so --name cnn
 *     cc app.c -I. model.so -Wl,-rpath,'$ORIGIN' -o app && ./app
 *
 * It runs a batch of four 28x28 images through the example CNN
 * (x: f32[N,1,28,28] -> logits: f32[N,10]) and prints each image's argmax.
 * The context is created once and reused, as a server would; its scratch
 * is sized at the first run.  It lives in examples/app/ rather than beside
 * the other examples because CMake builds every .c file in examples/, and this one
 * needs a model.h that only exists once a model is compiled.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "model.h"

enum { BATCH = 4, PIXELS = 28 * 28, CLASSES = 10 };

/* A seeded pseudo-random image: what a camera would hand over. */
static void fill(float *x, int64_t n, uint32_t seed)
{
	for (int64_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		x[i] = (float)(seed >> 8) / 16777216.0f;
	}
}

int main(void)
{
	static float x[BATCH * PIXELS], logits[BATCH * CLASSES];
	cnn_ctx *ctx = cnn_create();
	if (!ctx) {
		fprintf(stderr, "app: out of memory creating the model\n");
		return 1;
	}
	fill(x, BATCH * PIXELS, 42);
	if (cnn_run(ctx, BATCH, x, logits) != 0) {
		fprintf(stderr, "app: %s\n", cnn_errmsg(ctx));
		cnn_destroy(ctx);
		return 1;
	}
	for (int b = 0; b < BATCH; b++) {
		const float *l = logits + b * CLASSES;
		int best = 0;
		for (int c = 1; c < CLASSES; c++)
			if (l[c] > l[best])
				best = c;
		printf("image %d: class %d (logit %.4f)\n", b, best, l[best]);
	}
	/* a batch of 0 is refused with a message, never run */
	if (cnn_run(ctx, 0, x, logits) != 0)
		printf("batch 0 refused: %s\n", cnn_errmsg(ctx));
	cnn_destroy(ctx);
	return 0;
}
