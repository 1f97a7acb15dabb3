/*
 * collective.h — talking to the other ranks through a bx_comm: the one
 * all-reduce wrapper (failures become BX_ECOMM; a user callback runs in the
 * caller's floating-point environment; a device communicator is staged
 * through the device backend), and the agreement step (src/common/agree.h
 * holds its layout).
 */
#ifndef BX_COLLECTIVE_H
#define BX_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "agree.h"
#include "backend.h"
#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* comm->allreduce_i64 (or, for a device communicator, the backend's staged
 * all-reduce through dev, prepared before the call's first collective)
 * with its failure turned into BX_ECOMM. */
bx_status bx_comm_allreduce(const bx_comm *comm, bx_device_call *dev, const char *fn,
                            const char *what, int64_t *buf, size_t n, bx_op op);

/* The agreement step: one MAX all-reduce of this rank's items (agree.h:
 * items[BX_AGREE_ITEMS]), its NaN/Inf key (*offender; out: the first over
 * all ranks), its local status (local: BX_OK or the failure found before
 * the collective, whose message and location stay this rank's) and its
 * dtype mask (*dtypes; out: all ranks'). Returns BX_OK when every rank
 * passed its checks and all items agree; else on every rank the lowest
 * failing rank's status (the others' message names it and where it
 * failed) or BX_EMISMATCH naming the first item that differs. */
bx_status bx_agree(const bx_comm *comm, bx_device_call *dev, const char *fn,
                   const int64_t *items, bx_status local, int64_t *offender, unsigned *dtypes);

/* A NaN/Inf location as a key whose MAX over ranks is the first location
 * (lowest rank, then group, then tensor); -1 means none. */
int64_t bx_offender_key(int rank, size_t group, size_t tensor, int is_nan);
void bx_offender_decode(int64_t key, int *rank, size_t *group, size_t *tensor, int *is_nan);

#ifdef __cplusplus
}
#endif

#endif /* BX_COLLECTIVE_H */
