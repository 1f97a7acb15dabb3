/*
 * errors.c — status texts, the thread-local detail message, versions.
 */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

static _Thread_local char last_error[512];

unsigned bx_version(void) { return BX_VERSION_NUMBER; }

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

bx_status bx_fail(bx_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return st;
}

size_t bx_dtype_size(bx_dtype dt) {
  switch (dt) {
    case BX_DT_F16:
    case BX_DT_BF16: return 2;
    case BX_DT_F32: return 4;
    case BX_DT_F64: return 8;
    default: return 0;
  }
}

const char *bx_dtype_name(bx_dtype dt) {
  switch (dt) {
    case BX_DT_F16: return "float16";
    case BX_DT_BF16: return "bfloat16";
    case BX_DT_F32: return "float32";
    case BX_DT_F64: return "float64";
    default: return "?";
  }
}
