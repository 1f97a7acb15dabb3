/*
 * error.h — setting the thread-local error detail (text and location) that
 * bx_last_error() / bx_last_error_location() return. Only failing paths
 * write it: a call that succeeds leaves the last error as it was.
 */
#ifndef BX_ERROR_H
#define BX_ERROR_H

#include <stddef.h>
#include <stdint.h>

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define BX_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define BX_PRINTF(a, b)
#endif

/* "Not applicable" for a group or tensor index (also BX_NO_GROUP). */
#define BX_NO_INDEX ((size_t)-1)

/* Set the detail text (no location: rank, group, tensor all -1) and return
 * st. The arguments may point into the current text (bx_last_error()):
 * the message is formatted aside first. */
bx_status bx_fail(bx_status st, const char *fmt, ...) BX_PRINTF(2, 3);

/* The same with a location: rank (-1 unknown), group and tensor
 * (BX_NO_INDEX: none). */
bx_status bx_fail_at(bx_status st, int rank, size_t group, size_t tensor, const char *fmt, ...)
    BX_PRINTF(5, 6);

/* Put a rank into the current error's location (a local failure found
 * before the rank was known), or the group and tensor. */
void bx_error_set_rank(int rank);
void bx_error_set_index(size_t group, size_t tensor);

/* The current error, saved and put back around a step that may write its
 * own (the agreement after a local failure must not replace the rank's own
 * message). */
typedef struct bx_error_saved {
  char text[512];
  bx_error_location loc;
} bx_error_saved;
void bx_error_save(bx_error_saved *s);
void bx_error_restore(const bx_error_saved *s);

#ifdef __cplusplus
}
#endif

#endif /* BX_ERROR_H */
