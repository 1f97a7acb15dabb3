/*
 * errors.c — status texts, the thread-local error detail (text and
 * location), versions.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

static _Thread_local char last_error[512];
static _Thread_local bx_error_location last_loc = {-1, -1, -1};

unsigned bx_version(void) { return BX_VERSION_NUMBER; }

const char *bx_version_string(void) { return BX_VERSION_STRING; }

const char *bx_status_str(bx_status status) {
  switch (status) {
    case BX_OK: return "BX_OK: success";
    case BX_EINVAL: return "BX_EINVAL: invalid argument";
    case BX_EDTYPE: return "BX_EDTYPE: unsupported dtype";
    case BX_EDEVICE: return "BX_EDEVICE: unsupported device";
    case BX_ELAYOUT: return "BX_ELAYOUT: unsupported or overlapping memory layout";
    case BX_ENONFINITE: return "BX_ENONFINITE: non-finite gradient";
    case BX_ENOMEM: return "BX_ENOMEM: out of memory";
    case BX_ECOMM: return "BX_ECOMM: communicator failed";
    case BX_EMISMATCH: return "BX_EMISMATCH: ranks or builds disagree";
    case BX_EINTERNAL: return "BX_EINTERNAL: internal error";
  }
  return "unknown bx_status";
}

const char *bx_last_error(void) { return last_error; }

const bx_error_location *bx_last_error_location(void) { return &last_loc; }

static long long index_of(size_t i) { return i == BX_NO_INDEX ? -1 : (long long)i; }

/* Formatted aside first: an argument may be last_error itself. */
static void set_text(const char *fmt, va_list ap) {
  char buf[sizeof last_error];
  vsnprintf(buf, sizeof buf, fmt, ap);
  memcpy(last_error, buf, sizeof buf);
}

bx_status bx_fail(bx_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_text(fmt, ap);
  va_end(ap);
  last_loc.rank = -1;
  last_loc.group = last_loc.tensor = -1;
  return st;
}

bx_status bx_fail_at(bx_status st, int rank, size_t group, size_t tensor, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_text(fmt, ap);
  va_end(ap);
  last_loc.rank = rank;
  last_loc.group = index_of(group);
  last_loc.tensor = index_of(tensor);
  return st;
}

void bx_error_set_rank(int rank) { last_loc.rank = rank; }

void bx_error_set_index(size_t group, size_t tensor) {
  last_loc.group = index_of(group);
  last_loc.tensor = index_of(tensor);
}

void bx_error_save(bx_error_saved *s) {
  memcpy(s->text, last_error, sizeof s->text);
  s->loc = last_loc;
}

void bx_error_restore(const bx_error_saved *s) {
  memcpy(last_error, s->text, sizeof last_error);
  last_loc = s->loc;
}
