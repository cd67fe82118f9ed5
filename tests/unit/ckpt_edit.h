/* ckpt_edit.h: edits a kiln checkpoint the way a careless or hostile user
 * would, keeping it valid: set_i64 changes one element of an i64 tensor and
 * reseals the file with a recomputed "__checksum__" (docs/TRAINING.md: the
 * sum over every other tensor of FNV-1a over its name with the NUL, dtype
 * and rank as two int32s, its shape and its bytes). */
#ifndef KILN_TEST_CKPT_EDIT_H
#define KILN_TEST_CKPT_EDIT_H
#include <check.h>
#include <string.h>

#include "kiln/kiln.h"

static uint64_t ckpt_fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

static void ckpt_set_i64(const char *path, const char *name, int64_t at, int64_t value)
{
	kiln_tensor_set *s = NULL;
	kiln_error err = {0};
	ck_assert_msg(kiln_safetensors_read(path, &s, &err) == KILN_OK, "%s", err.msg);
	const kiln_tensor *t = kiln_tensor_set_get(s, name);
	ck_assert_msg(t && t->dtype == KILN_I64 && at < kiln_tensor_numel(t), "no i64 '%s'", name);
	((int64_t *)t->data)[at] = value;
	uint64_t sum = 0;
	for (int i = 0; i < s->count; i++) {
		const kiln_tensor *u = s->items[i].tensor;
		if (!strcmp(s->items[i].name, "__checksum__"))
			continue;
		uint64_t h = ckpt_fnv(0xcbf29ce484222325ULL, s->items[i].name,
		                      strlen(s->items[i].name) + 1);
		int32_t head[2] = {(int32_t)u->dtype, u->rank};
		h = ckpt_fnv(h, head, sizeof head);
		h = ckpt_fnv(h, u->shape, (size_t)u->rank * sizeof u->shape[0]);
		sum += ckpt_fnv(h, u->data, kiln_tensor_nbytes(u));
	}
	int64_t v = (int64_t)sum;
	ck_assert(kiln_tensor_set_add(s, "__checksum__", &(kiln_tensor){KILN_I64, 0, {0}, &v}) ==
	          KILN_OK);
	ck_assert_msg(kiln_safetensors_write(path, s, &err) == KILN_OK, "%s", err.msg);
	kiln_tensor_set_free(s);
}
#endif
