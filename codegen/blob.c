/*
 * blob.c: the weights of a library as an ELF object of their own
 * (backend.h's cg_blob).  The object is written directly: header, the
 * bytes (one SHT_PROGBITS section, SHF_ALLOC, 64-byte aligned), an empty
 * .note.GNU-stack (no executable stack), a symbol table whose one global
 * symbol, CG_BLOB_SYMBOL, is hidden (the library's own code reaches it
 * PC-relative and it is not exported), and the string tables.  No
 * assembler or code generator sees the bytes; the system linker copies
 * them into the library.
 *
 * The section is a large-data one (.lrodata, SHF_X86_64_LARGE), which the
 * linker places after .data and .bss, at the end of the library: in
 * .rodata the weights sat between the code and the GOT, .data and the
 * other read-only data, and past 2 GiB of weights (ViT-H/14: 2.5 GB) the
 * code's 32-bit PC-relative references to those no longer reached.  The
 * library reaches the weights only through pointer tables (64-bit
 * relocations), whatever their size.
 */
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/backend.h"

#ifndef SHF_X86_64_LARGE
#define SHF_X86_64_LARGE 0x10000000 /* the x86-64 psABI's large section flag */
#endif

int64_t cg_blob_add(cg_blob *bl, const void *data, size_t n)
{
	for (int i = 0; i < bl->nitem; i++)
		if (bl->item[i].n == n && (!n || !memcmp(bl->item[i].data, data, n)))
			return (int64_t)bl->item[i].at;
	if (bl->nitem == bl->capitem) {
		int cap = bl->capitem ? 2 * bl->capitem : 64;
		void *p = realloc(bl->item, (size_t)cap * sizeof *bl->item);
		if (!p) {
			bl->failed = true;
			return -1;
		}
		bl->item = p;
		bl->capitem = cap;
	}
	uint64_t at = (bl->size + 63) & ~(uint64_t)63;
	bl->item[bl->nitem++] = (cg_blob_item){data, n, at};
	bl->size = at + n;
	return (int64_t)at;
}

void cg_blob_free(cg_blob *bl)
{
	free(bl->item);
	memset(bl, 0, sizeof *bl);
}

/* section indices */
enum { S_NULL, S_DATA, S_NOTE, S_SYMTAB, S_STRTAB, S_SHSTRTAB, S_COUNT };

static const char shstr[] = "\0.lrodata.kiln_blob\0.note.GNU-stack\0.symtab\0.strtab\0.shstrtab";
enum { N_DATA = 1, N_NOTE = 20, N_SYMTAB = 36, N_STRTAB = 44, N_SHSTRTAB = 52 };
_Static_assert(sizeof shstr == N_SHSTRTAB + sizeof ".shstrtab", "section name offsets");
static const char str[] = "\0" CG_BLOB_SYMBOL;

static bool put(FILE *f, const void *p, size_t n)
{
	return !n || fwrite(p, 1, n, f) == n;
}

static bool pad_to(FILE *f, uint64_t *at, uint64_t to)
{
	static const char zero[64];
	while (*at < to) {
		size_t k = to - *at > sizeof zero ? sizeof zero : (size_t)(to - *at);
		if (!put(f, zero, k))
			return false;
		*at += k;
	}
	return true;
}

kiln_status cg_blob_write_object(const cg_blob *bl, const char *path, kiln_error *err)
{
	if (bl->failed)
		return ir_seterr(err, KILN_ENOMEM, "out of memory laying out the weights");
	FILE *f = fopen(path, "wb");
	uint64_t data_off = 64, data_end = data_off + bl->size;
	uint64_t sym_off = (data_end + 7) & ~(uint64_t)7;
	uint64_t str_off = sym_off + 2 * sizeof(Elf64_Sym);
	uint64_t shstr_off = str_off + sizeof str;
	uint64_t sh_off = (shstr_off + sizeof shstr + 7) & ~(uint64_t)7;
	Elf64_Ehdr eh = {
		.e_ident = {ELFMAG0, ELFMAG1, ELFMAG2, ELFMAG3, ELFCLASS64, ELFDATA2LSB, EV_CURRENT,
		            ELFOSABI_SYSV},
		.e_type = ET_REL, .e_machine = EM_X86_64, .e_version = EV_CURRENT,
		.e_shoff = sh_off, .e_ehsize = sizeof(Elf64_Ehdr),
		.e_shentsize = sizeof(Elf64_Shdr), .e_shnum = S_COUNT, .e_shstrndx = S_SHSTRTAB};
	Elf64_Sym sym[2] = {{0}, {
		.st_name = 1, .st_info = ELF64_ST_INFO(STB_GLOBAL, STT_OBJECT),
		.st_other = STV_HIDDEN, .st_shndx = S_DATA, .st_value = 0, .st_size = bl->size}};
	Elf64_Shdr sh[S_COUNT] = {
		[S_DATA] = {.sh_name = N_DATA, .sh_type = SHT_PROGBITS,
		            .sh_flags = SHF_ALLOC | SHF_X86_64_LARGE,
		            .sh_offset = data_off, .sh_size = bl->size, .sh_addralign = 64},
		[S_NOTE] = {.sh_name = N_NOTE, .sh_type = SHT_PROGBITS, .sh_offset = data_end,
		            .sh_addralign = 1},
		[S_SYMTAB] = {.sh_name = N_SYMTAB, .sh_type = SHT_SYMTAB, .sh_offset = sym_off,
		              .sh_size = sizeof sym, .sh_link = S_STRTAB, .sh_info = 1,
		              .sh_addralign = 8, .sh_entsize = sizeof(Elf64_Sym)},
		[S_STRTAB] = {.sh_name = N_STRTAB, .sh_type = SHT_STRTAB, .sh_offset = str_off,
		              .sh_size = sizeof str, .sh_addralign = 1},
		[S_SHSTRTAB] = {.sh_name = N_SHSTRTAB, .sh_type = SHT_STRTAB, .sh_offset = shstr_off,
		                .sh_size = sizeof shstr, .sh_addralign = 1}};
	uint64_t at = 0;
	bool ok = f && put(f, &eh, sizeof eh) && (at = sizeof eh, pad_to(f, &at, data_off));
	for (int i = 0; ok && i < bl->nitem; i++) {
		const cg_blob_item *it = &bl->item[i];
		ok = pad_to(f, &at, data_off + it->at) && put(f, it->data, it->n);
		at += it->n;
	}
	ok = ok && pad_to(f, &at, sym_off) && put(f, sym, sizeof sym) &&
	     put(f, str, sizeof str) && put(f, shstr, sizeof shstr) &&
	     (at = shstr_off + sizeof shstr, pad_to(f, &at, sh_off)) && put(f, sh, sizeof sh);
	if (f && fclose(f) != 0)
		ok = false;
	if (!ok)
		return ir_seterr(err, KILN_EIO, "%s: cannot write the weights' object (%llu bytes)",
		                 path, (unsigned long long)bl->size);
	return KILN_OK;
}
