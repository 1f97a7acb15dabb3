/*
 * records.h — run records (JSON Lines, one object per training step with an
 * integer "step"; floats as hex-float strings) as `bitexact diff` and
 * `bitexact plot` read them.
 */
#ifndef BX_CLI_RECORDS_H
#define BX_CLI_RECORDS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cli_record {
  json_int_t step;
  json_t *obj;
  size_t line;
} cli_record;

typedef struct cli_records {
  const char *path;
  cli_record *r; /* sorted by step, each step once */
  size_t n;
  char *text;
} cli_records;

/* Reads path (at least one record; blank lines skipped). 0, or -1 with
 * the error printed (naming the file and line); cli_records_free after
 * either. */
int cli_records_load(const char *path, cli_records *rs);
void cli_records_free(cli_records *rs);

/* A float value: a JSON real, or a string strtod reads whole (hex floats,
 * "nan", "inf"). 1 if v is one (in *d), else 0. */
int cli_record_float(const json_t *v, double *d);

/* The ULP distance of two doubles (sign-magnitude order, +-0 equal). */
uint64_t cli_ulp64(double a, double b);

#endif /* BX_CLI_RECORDS_H */
