/*
 * trace_read.h — the reader of bitexact traces (format version 1,
 * docs/trace.md) and their entry-by-entry comparison, apart from the
 * command that prints it (trace_diff.c), so that a fuzzer
 * (fuzz/fuzz_trace.c) can call them: nothing here prints or exits;
 * errors come back as one line in a caller's buffer.
 */
#ifndef BX_CLI_TRACE_READ_H
#define BX_CLI_TRACE_READ_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define TRACE_VERSION 1

/* One entry line; its strings are owned by obj. */
typedef struct tentry {
  json_int_t step;
  const char *phase, *module, *what, *dtype, *hash, *blocks;
  json_int_t slice; /* -1: null (a whole tensor) */
  int64_t numel;    /* the product of shape */
  json_t *shape, *head, *obj;
  size_t line; /* 1-based line of the file */
} tentry;

typedef struct trace_file {
  json_t *header; /* line 1 (has "bitexact_trace" == 1 and a string "model") */
  tentry *e;      /* n entries, in the file's order */
  size_t n;
  size_t *slot;   /* open addressing over the keys (index + 1; 0 empty) */
  size_t nslot;
} trace_file;

/* Parses the trace held in buf[0, len) (a whole file: every line ends with
 * '\n'). name prefixes the error ("NAME: line 3: ..."). 0 and *t filled
 * (free it with trace_free), or -1 with a one-line message in err (errlen
 * bytes, NUL-terminated) and *t empty. Nothing of buf is kept. */
int trace_parse(const char *buf, size_t len, const char *name, trace_file *t, char *err, size_t errlen);
void trace_free(trace_file *t);

/* The entry of t with k's key (step, phase, module, what, slice), or NULL. */
const tentry *trace_find(const trace_file *t, const tentry *k);

/* The comparison of A with B, entries matched by key. */
typedef struct trace_cmp {
  size_t differ;               /* entries in both that differ (dtype, shape or hash) */
  size_t only_a, only_b;       /* entries in one trace only */
  const tentry *fa, *fb;       /* the first differing common entry in A's order (A's, B's); NULL: none */
  const tentry *first_only_a;  /* the first entry only in A, in A's order; NULL: none */
  const tentry *first_only_b;  /* the first entry only in B, in B's order; NULL: none */
  int same_layout;             /* fa and fb have the same dtype and shape */
  int64_t lo, hi;              /* fa's first differing part: elements [lo, hi); -1: none */
  int64_t elem;                /* its first differing element when among the head values, else -1 */
  const char *va, *vb;         /* that element's values (hex floats, borrowed from the heads) */
  int64_t ulp;                 /* their ULP distance in the entry's dtype; -1: not defined */
  /* per module, the differing common entries, modules in A's order of first difference */
  const char **mods;
  size_t *mcount;
  size_t nmods;
} trace_cmp;

/* Compares a with b into *r (free it with trace_cmp_free). 0, or -1 (out
 * of memory) with a one-line message in err. */
int trace_compare(const trace_file *a, const trace_file *b, trace_cmp *r, char *err, size_t errlen);
void trace_cmp_free(trace_cmp *r);

/* "step S, PHASE, MODULE, WHAT, sequence N" (or ", whole"). */
void trace_key_text(const tentry *e, char *buf, size_t n);
/* "S/PHASE/MODULE/WHAT/N" (or "/-"): the key of the tracers' dump= / --dump. */
void trace_dump_key(const tentry *e, char *buf, size_t n);

#endif /* BX_CLI_TRACE_READ_H */
