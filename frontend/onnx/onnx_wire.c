/*
 * onnx_wire.c: unpacks a ModelProto with protobuf-c under two limits that
 * protobuf-c itself does not have, so that a hostile file can neither
 * exhaust memory nor the stack.
 *
 * Memory: protobuf-c allocates a struct per submessage, so a file of empty
 * messages costs many times its size (an empty Dimension is 2 bytes on the
 * wire and 56 in memory).  The allocator handed to protobuf-c counts every
 * byte it gives out and refuses past a budget: 16x the file plus 64 MiB
 * (small models are all headers), never over 4 GiB.  Real models are
 * dominated by raw_data and need about 1x.
 *
 * Depth: protobuf-c unpacks submessages recursively with no limit, and
 * ONNX's schema is recursive (an attribute holds a graph whose nodes hold
 * attributes; a TypeProto holds a TypeProto), so a few megabytes of nested
 * length prefixes overflow the stack.  Before unpacking, one iterative walk
 * over the wire format measures the nesting, descending only into fields
 * that protobuf-c's generated descriptors say are messages (exactly where
 * protobuf-c would recurse).  It skips everything else and decodes nothing:
 * the parsing proper stays protobuf-c's.
 */
#include <stdlib.h>

#include "frontend/onnx/onnx.h"

#define BUDGET_FLOOR ((size_t)64 << 20)
#define BUDGET_CEIL ((size_t)4 << 30)
#define BUDGET_PER_BYTE 16

/* ---- the capped allocator ------------------------------------------------ */

static void *capped_alloc(void *data, size_t n)
{
	onnx_alloc *a = data;
	if (n > a->left) {
		a->exceeded = true;
		return NULL;
	}
	a->left -= n;
	return malloc(n);
}

/* Frees are not refunded: unpacking frees only on its way out. */
static void capped_free(void *data, void *p)
{
	(void)data;
	free(p);
}

void onnx_alloc_init(onnx_alloc *a, size_t file_size)
{
	size_t b = file_size > (BUDGET_CEIL - BUDGET_FLOOR) / BUDGET_PER_BYTE
	                   ? BUDGET_CEIL : file_size * BUDGET_PER_BYTE + BUDGET_FLOOR;
	a->pc.alloc = capped_alloc;
	a->pc.free = capped_free;
	a->pc.allocator_data = a;
	a->budget = a->left = b;
	a->exceeded = false;
}

/* ---- nesting depth ------------------------------------------------------- */

static bool varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64; shift += 7) {
		if (*p >= end)
			return false;
		uint8_t b = *(*p)++;
		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return true;
	}
	return false;
}

typedef struct frame {
	const uint8_t *end;
	const ProtobufCMessageDescriptor *d;
} frame;

/* One field at p inside f; pushes a frame for a submessage.  Returns
 * false on a malformed field. */
static bool field(const uint8_t **p, frame *st, int *top)
{
	const uint8_t *end = st[*top].end;
	uint64_t tag, len;
	if (!varint(p, end, &tag))
		return false;
	switch (tag & 7) {
	case 0: return varint(p, end, &len);
	case 1: return (size_t)(end - *p) >= 8 ? (*p += 8, true) : false;
	case 5: return (size_t)(end - *p) >= 4 ? (*p += 4, true) : false;
	case 2: break;
	default: return false; /* groups and invalid wire types */
	}
	if (!varint(p, end, &len) || len > (uint64_t)(end - *p))
		return false;
	const ProtobufCFieldDescriptor *f =
		tag >> 3 <= UINT32_MAX
			? protobuf_c_message_descriptor_get_field(st[*top].d, (unsigned)(tag >> 3))
			: NULL;
	if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
		st[*top + 1] = (frame){*p + len, f->descriptor};
		++*top;
	} else {
		*p += len;
	}
	return true;
}

int onnx_wire_depth(const void *data, size_t size, int max)
{
	frame st[ONNX_MAX_DEPTH + 1];
	const uint8_t *p = data;
	int top = 0, deepest = 1;
	max = max > ONNX_MAX_DEPTH ? ONNX_MAX_DEPTH : max;
	st[0] = (frame){p + size, &onnx__model_proto__descriptor};
	while (top >= 0) {
		if (p == st[top].end) {
			top--;
			continue;
		}
		if (!field(&p, st, &top))
			return -1;
		if (top + 1 > max)
			return max + 1;
		deepest = top + 1 > deepest ? top + 1 : deepest;
	}
	return deepest;
}

/* ---- unpacking ------------------------------------------------------------- */

kiln_status onnx_unpack(const void *data, size_t size, const char *path, onnx_alloc *a,
                        Onnx__ModelProto **out, kiln_error *err)
{
	int depth = onnx_wire_depth(data, size, ONNX_MAX_DEPTH);
	*out = NULL;
	onnx_alloc_init(a, size);
	if (depth > ONNX_MAX_DEPTH)
		return ir_seterr(err, KILN_EPARSE, "%s: protobuf messages nested more than %d deep "
		                 "(kiln refuses such models rather than overflow the stack)", path,
		                 ONNX_MAX_DEPTH);
	if (depth >= 0)
		*out = onnx__model_proto__unpack(&a->pc, size, data);
	if (*out)
		return KILN_OK;
	if (a->exceeded)
		return ir_seterr(err, KILN_ENOMEM, "%s: decoding needs more than %zu bytes of "
		                 "memory (%dx the file's %zu bytes plus %zu MiB; refused as hostile)",
		                 path, a->budget, BUDGET_PER_BYTE, size, BUDGET_FLOOR >> 20);
	return ir_seterr(err, KILN_EPARSE, "%s: not a valid ONNX model (protobuf decoding "
	                 "failed)", path);
}

void onnx_unpacked_free(Onnx__ModelProto *m, onnx_alloc *a)
{
	if (m)
		onnx__model_proto__free_unpacked(m, &a->pc);
}
