/*
 * moe_check.c — the dispatch-plan and expert-id checks of the MoE router
 * and dispatch calls (moe_internal.h). Nothing here writes a tensor.
 */
#include <string.h>

#include "error.h"
#include "moe_internal.h"

bx_status bx_moe_check_plan(const char *fn, const bx_tc_tensor *row_map,
                            const bx_tc_tensor *pos) {
  int64_t T = pos->dim[0], k = pos->dim[1], R = row_map->dim[0];
  if (row_map->dim[1] != 2)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, row_map->index,
                      "%s: tensor %zu (row_map): shape[1] = %lld, want 2", fn, row_map->index,
                      (long long)row_map->dim[1]);
  if (R != T * k)
    return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, row_map->index,
                      "%s: tensor %zu (row_map) has %lld rows, want T*k = %lld", fn,
                      row_map->index, (long long)R, (long long)(T * k));
  const int64_t *rm = bx_tc_i64(row_map), *p = bx_tc_i64(pos);
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < k; j++) {
      int64_t r = p[t * k + j];
      if (r < 0 || r >= R || rm[2 * r] != t || rm[2 * r + 1] != j)
        return bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, pos->index,
                          "%s: tensor %zu (pos): pos[%lld][%lld] = %lld is not the row of "
                          "(%lld, %lld) in row_map (not a dispatch plan)",
                          fn, pos->index, (long long)t, (long long)j, (long long)r, (long long)t,
                          (long long)j);
    }
  return BX_OK;
}

/* ---- ids of a token: in range, distinct ------------------------------------ */

bx_status bx_moe_check_ids(const char *fn, const bx_tc_tensor *ids, int64_t E,
                           unsigned char *seen) {
  int64_t T = ids->dim[0], k = ids->dim[1];
  bx_status st = BX_OK;
  for (int64_t t = 0; t < T && st == BX_OK; t++) {
    for (int64_t a = 0; a < k; a++) {
      int64_t e = bx_tc_id(ids, (size_t)(t * k + a));
      if (e < 0 || e >= E) {
        st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, ids->index,
                        "%s: tensor %zu (%s): token %lld slot %lld: expert id %lld is outside "
                        "[0, %lld)",
                        fn, ids->index, ids->name, (long long)t, (long long)a, (long long)e,
                        (long long)E);
        k = a; /* clear what was marked */
        break;
      }
      if (seen[e]) {
        st = bx_fail_at(BX_EINVAL, -1, BX_NO_INDEX, ids->index,
                        "%s: tensor %zu (%s): token %lld slot %lld: expert %lld chosen twice", fn,
                        ids->index, ids->name, (long long)t, (long long)a, (long long)e);
        k = a;
        break;
      }
      seen[e] = 1;
    }
    for (int64_t a = 0; a < k; a++) seen[bx_tc_id(ids, (size_t)(t * k + a))] = 0;
  }
  return st;
}
