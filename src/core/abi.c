/*
 * abi.c — the struct_size checks (abi.h).
 *
 * A program built against other headers than the library it runs with may
 * hand over a struct of another layout. The leading struct_size says which
 * layout the caller's compiler saw; this library accepts its own sizeof
 * only, and says in the message which way the two disagree. A program
 * built against bitexact 0.1 (no struct_size at all) passes its first
 * field here: a double's bits, a function pointer or two small ints, which
 * read as an implausibly large size (or as 0 for all-zero scale options).
 */
#include "abi.h"
#include "error.h"

/* No public struct of bitexact will ever be this large: a bigger
 * struct_size is not a size at all. */
#define BX_STRUCT_SIZE_PLAUSIBLE ((size_t)4096)

bx_status bx_check_struct_size(const char *fn, const char *field, size_t got, size_t want,
                               const char *type, const char *init) {
  if (got == want) return BX_OK;
  if (got == 0)
    return bx_fail(BX_EINVAL, "%s: %s is 0, not sizeof(%s) = %zu: initialise it with %s", fn,
                   field, type, want, init);
  if (got > BX_STRUCT_SIZE_PLAUSIBLE)
    return bx_fail(BX_EINVAL,
                   "%s: %s is %zu, not a size (sizeof(%s) = %zu in bitexact %s): the struct "
                   "was not initialised with %s; a program built against bitexact 0.1, whose "
                   "structs have no struct_size, must be rebuilt against this version",
                   fn, field, got, type, want, BX_VERSION_STRING, init);
  if (got > want)
    return bx_fail(BX_EINVAL,
                   "%s: %s is %zu: this program was built against a newer bitexact (%s of %zu "
                   "bytes) than the library it runs with (%s, %zu bytes); run it with the "
                   "library it was built against, or rebuild it",
                   fn, field, got, type, got, BX_VERSION_STRING, want);
  return bx_fail(BX_EINVAL,
                 "%s: %s is %zu: this program was built against an older bitexact (%s of %zu "
                 "bytes) than the library it runs with (%s, %zu bytes), or set the field by "
                 "hand; initialise the struct with %s and rebuild",
                 fn, field, got, type, got, BX_VERSION_STRING, want, init);
}

bx_status bx_check_norm_opts_size(const char *fn, const bx_norm_opts *o) {
  if (!o) return BX_OK;
  return bx_check_struct_size(fn, "opts->struct_size", o->struct_size, sizeof *o, "bx_norm_opts",
                              "BX_NORM_OPTS_DEFAULT");
}

bx_status bx_check_scale_opts_size(const char *fn, const bx_scale_opts *o) {
  if (!o) return BX_OK;
  return bx_check_struct_size(fn, "opts->struct_size", o->struct_size, sizeof *o, "bx_scale_opts",
                              "BX_SCALE_OPTS_DEFAULT");
}

bx_status bx_check_clip_opts_size(const char *fn, const bx_clip_opts *o) {
  if (!o) return BX_OK;
  /* the nested structs are where this library expects them only when the
   * outer size matches */
  bx_status st = bx_check_struct_size(fn, "opts->struct_size", o->struct_size, sizeof *o,
                                      "bx_clip_opts", "BX_CLIP_OPTS_DEFAULT");
  if (st == BX_OK)
    st = bx_check_struct_size(fn, "opts->norm.struct_size", o->norm.struct_size, sizeof o->norm,
                              "bx_norm_opts", "BX_NORM_OPTS_DEFAULT");
  if (st == BX_OK)
    st = bx_check_struct_size(fn, "opts->scale.struct_size", o->scale.struct_size,
                              sizeof o->scale, "bx_scale_opts", "BX_SCALE_OPTS_DEFAULT");
  return st;
}

bx_status bx_check_comm_size(const char *fn, const bx_comm *c) {
  if (!c) return BX_OK;
  return bx_check_struct_size(fn, "comm->struct_size", c->struct_size, sizeof *c, "bx_comm",
                              "BX_COMM_DEFAULT (or an adapter: bx_comm_mpi, bx_comm_nccl)");
}

bx_status bx_check_norm_info_size(const char *fn, const bx_norm_info *info) {
  if (!info) return bx_fail(BX_EINVAL, "%s: info is NULL", fn);
  return bx_check_struct_size(fn, "info->struct_size", info->struct_size, sizeof *info,
                              "bx_norm_info", "BX_NORM_INFO_DEFAULT");
}
