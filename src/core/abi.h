/*
 * abi.h — the struct_size checks of the public structs (bitexact.h,
 * "Struct sizes"): every public entry that takes a bx_norm_opts,
 * bx_scale_opts, bx_clip_opts or bx_comm calls the matching check first,
 * before it reads any other field of the struct. NULL passes (it means the
 * defaults, or no communicator). A wrong size sets bx_last_error() (no
 * location: rank, group and tensor -1) and returns BX_EINVAL; nothing else
 * is read.
 */
#ifndef BX_ABI_H
#define BX_ABI_H

#include <stddef.h>

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The one check behind the four below. fn names the public function,
 * field the field as the caller sees it ("opts->norm.struct_size"), type
 * the struct ("bx_norm_opts") and init its initializer macro. */
bx_status bx_check_struct_size(const char *fn, const char *field, size_t got, size_t want,
                               const char *type, const char *init);

bx_status bx_check_norm_opts_size(const char *fn, const bx_norm_opts *o);
bx_status bx_check_scale_opts_size(const char *fn, const bx_scale_opts *o);
/* The clip options and, when their own size is right, the nested norm and
 * scale options. */
bx_status bx_check_clip_opts_size(const char *fn, const bx_clip_opts *o);
bx_status bx_check_comm_size(const char *fn, const bx_comm *c);
/* bx_total_norm_info's out struct: required (NULL fails too). */
bx_status bx_check_norm_info_size(const char *fn, const bx_norm_info *info);

#ifdef __cplusplus
}
#endif

#endif /* BX_ABI_H */
