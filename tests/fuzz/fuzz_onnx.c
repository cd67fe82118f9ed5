/*
 * fuzz_onnx.c: libFuzzer target for the ONNX importer.
 *
 * Each input is taken as a serialized ModelProto and imported from memory.
 * Whatever the bytes, the importer must return a status and never crash,
 * hang, leak or allocate without bound (ASan, UBSan and libFuzzer's
 * -malloc_limit_mb catch those).  What it accepts must also be a graph that
 * passes the verifier and that the exporter can write and the importer read
 * back: a failure there is an importer bug, reported as a crash.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined by run_fuzz.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/kiln.h"

static void die(const char *what, const kiln_error *err)
{
	fprintf(stderr, "fuzz_onnx: %s: %s\n", what, err->msg);
	abort();
}

/* Export and import again; EUNSUPPORTED (no opset-17 form) is fine. */
static void roundtrip(const kiln_graph *g)
{
	kiln_error err = {0};
	void *data;
	size_t size;
	kiln_status st = kiln_onnx_export_mem(g, &data, &size, &err);
	if (st == KILN_EUNSUPPORTED)
		return;
	if (st != KILN_OK)
		die("export of an imported graph failed", &err);
	kiln_graph *back = NULL;
	if (kiln_onnx_import_mem(data, size, "fuzz.onnx", &back, &err) != KILN_OK)
		die("import of an exported graph failed", &err);
	kiln_graph_free(back);
	free(data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kiln_graph *g = NULL;
	kiln_error err = {0};
	if (kiln_onnx_import_mem(data, size, "fuzz.onnx", &g, &err) == KILN_OK) {
		if (kiln_graph_verify(g, &err) != KILN_OK)
			die("imported graph fails the verifier", &err);
		roundtrip(g);
	}
	kiln_graph_free(g);
	return 0;
}
