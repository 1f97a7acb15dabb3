/*
 * moe_internal.h — the checks of the MoE router (router.c) and the token
 * dispatch (permute.c) beyond one tensor's (train_check.h): the dispatch
 * plan (row_map and pos, each other's inverse) and the expert ids of a
 * token (in range, distinct).
 */
#ifndef BX_MOE_INTERNAL_H
#define BX_MOE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"
#include "train_check.h"

/* row_map [R, 2] and pos [T, k] (checked int64 tensors) describe R = T*k
 * rows: pos[t][j] in [0, R) and row_map[pos[t][j]] == (t, j) for all
 * (t, j) — so pos is a bijection and row_map its inverse. */
bx_status bx_moe_check_plan(const char *fn, const bx_tc_tensor *row_map,
                            const bx_tc_tensor *pos);

/* Each row of ids [T, k] holds k distinct experts in [0, E) (BX_EINVAL
 * naming token and slot). seen: E zero bytes of scratch, left zero. */
bx_status bx_moe_check_ids(const char *fn, const bx_tc_tensor *ids, int64_t E,
                           unsigned char *seen);

#endif /* BX_MOE_INTERNAL_H */
