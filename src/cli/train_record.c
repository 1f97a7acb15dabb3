/*
 * train_record.c — the run record's lines (train_record.h).
 */
#include "train_record.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#else
#include <xxhash.h>
#endif

#include "cli.h"

uint64_t trec_loss_hash(const float *v, size_t n) {
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "trec_loss_hash assumes a little-endian host"
#endif
  return (uint64_t)XXH3_64bits(v, n * sizeof *v);
}

void trec_format(const trec_step *s, char *buf, size_t len) {
  char loss[40], gn[40], gd[40], ge[40], cc[40], lr[40], en[40];
  cli_hex((double)s->loss, loss, sizeof loss);
  cli_hex(s->grad_norm, gn, sizeof gn);
  cli_hex(s->norm_dense, gd, sizeof gd);
  cli_hex(s->norm_expert, ge, sizeof ge);
  cli_hex(s->clip_coef, cc, sizeof cc);
  cli_hex(s->lr, lr, sizeof lr);
  int w = snprintf(buf, len,
                   "{\"step\": %lld, \"loss\": \"%s\", \"grad_norm\": \"%s\", \"grad_norm_dense\": "
                   "\"%s\", \"grad_norm_expert\": \"%s\", \"clip_coef\": \"%s\", \"lr\": \"%s\", "
                   "\"tokens\": %lld, \"loss_hash\": \"xxh3:%016llx\", \"compute_dtype\": \"%s\", "
                   "\"passes\": %d, \"record_format\": %d",
                   (long long)s->step, loss, gn, gd, ge, cc, lr, (long long)s->tokens,
                   (unsigned long long)s->loss_hash, s->compute_dtype ? s->compute_dtype : "fp32",
                   s->passes, TREC_FORMAT);
  if (w < 0 || (size_t)w >= len) return;
  if (s->has_eval) {
    char ev[40];
    cli_hex((double)s->eval_loss, ev, sizeof ev);
    int e = snprintf(buf + w, len - (size_t)w, ", \"eval_loss\": \"%s\"", ev);
    if (e < 0 || (size_t)(w + e) >= len) return;
    w += e;
  }
  if (!isnan(s->entropy_rate)) {
    cli_hex(s->entropy_rate, en, sizeof en);
    snprintf(buf + w, len - (size_t)w, ", \"entropy_rate\": \"%s\"}", en);
  } else {
    snprintf(buf + w, len - (size_t)w, "}");
  }
}

int trec_write(FILE *fp, const trec_step *s) {
  char line[1024];
  trec_format(s, line, sizeof line);
  if (fputs(line, fp) == EOF || fputc('\n', fp) == EOF || fflush(fp) != 0) return -1;
  return 0;
}
