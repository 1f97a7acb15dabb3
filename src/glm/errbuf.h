/*
 * errbuf.h — the one-line error text of the model module's config checks
 * (glm_config.c) and of the command's parsers and file writers
 * (src/cli: safetensors.c, train_config.c, train_data.c, train_ckpt.c):
 * formatted into the caller's buffer, every control byte replaced by '?'
 * so a message stays one line whatever a file held. Header-only, so each
 * parser still builds alone into its fuzz harness.
 */
#ifndef BX_GLM_ERRBUF_H
#define BX_GLM_ERRBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* ascii_only: also replace bytes >= 0x7f (text from binary headers). */
static inline void cli_verrf(char *err, size_t errlen, int ascii_only, const char *fmt, va_list ap) {
  if (!err || errlen == 0) return;
  vsnprintf(err, errlen, fmt, ap);
  for (char *c = err; *c; c++)
    if ((unsigned char)*c < 0x20 || (ascii_only && (unsigned char)*c >= 0x7f)) *c = '?';
}

/* Writes the message; returns -1 (the parsers' failure value). */
static inline int cli_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int cli_errf(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_verrf(err, errlen, 0, fmt, ap);
  va_end(ap);
  return -1;
}

/* The same, ASCII only. */
static inline int cli_errf_ascii(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int cli_errf_ascii(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_verrf(err, errlen, 1, fmt, ap);
  va_end(ap);
  return -1;
}

#endif /* BX_GLM_ERRBUF_H */
