/*
 * fuzz_trace.c — libFuzzer harness for the trace reader and comparison of
 * `bitexact diff --trace` (src/cli/trace_read.c: trace_parse,
 * trace_compare). Any byte string gives either a checked trace or a
 * one-line error — no crash, no leak, no overread (ASan, UBSan) — and the
 * comparison keeps its invariants:
 *
 * - a rejected input leaves an empty trace and a non-empty one-line error;
 * - an accepted trace finds each of its entries by key (keys unique), and
 *   each entry's parts and head match its shape;
 * - a trace compared with itself (and with a second parse of the same
 *   bytes) is identical;
 * - two traces: common + only-in-A = A's entries, common + only-in-B =
 *   B's; the first difference is the first differing entry of A present
 *   in B, and it does differ; the first only-in-A / only-in-B entries are
 *   absent from the other side and come first in their file's order; the
 *   located part and element lie inside the value and the head; comparing
 *   B with A gives the same counts, sides swapped.
 *
 * Input: byte 0 even: one trace (the rest of the input); odd: "A\0B", two
 * traces.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_read.h"

#define CHECK(c)                \
  do {                          \
    if (!(c)) __builtin_trap(); \
  } while (0)

static void one_line(const char *err, size_t len) {
  CHECK(memchr(err, 0, len) != NULL && err[0] != 0);
  CHECK(strchr(err, '\n') == NULL);
}

static int parse(const uint8_t *p, size_t n, trace_file *t) {
  char err[512];
  memset(err, 0, sizeof err);
  if (trace_parse((const char *)p, n, "fuzz", t, err, sizeof err) != 0) {
    one_line(err, sizeof err);
    CHECK(t->n == 0 && t->e == NULL && t->header == NULL && t->slot == NULL);
    return -1;
  }
  CHECK(t->header != NULL);
  char buf[256];
  for (size_t i = 0; i < t->n; i++) {
    const tentry *e = &t->e[i];
    CHECK(trace_find(t, e) == e);
    int64_t nb = e->numel < 16 ? e->numel : 16, nh = e->numel < 8 ? e->numel : 8;
    CHECK(strlen(e->blocks) == (size_t)(16 * nb) && json_array_size(e->head) == (size_t)nh);
    trace_key_text(e, buf, sizeof buf);
    trace_dump_key(e, buf, sizeof buf);
    CHECK(buf[0] != 0);
  }
  return 0;
}

static size_t position(const trace_file *t, const tentry *e) { return (size_t)(e - t->e); }

static void check_compare(const trace_file *A, const trace_file *B) {
  trace_cmp r, s;
  char err[256];
  if (trace_compare(A, B, &r, err, sizeof err) != 0) {
    one_line(err, sizeof err);
    return;
  }
  size_t common = A->n - r.only_a;
  CHECK(r.only_a <= A->n && r.only_b <= B->n && common == B->n - r.only_b);
  CHECK(r.differ <= common && (r.differ > 0) == (r.fa != NULL));
  size_t total = 0;
  for (size_t m = 0; m < r.nmods; m++) total += r.mcount[m];
  CHECK(total == r.differ);
  if (r.fa) {
    CHECK(trace_find(B, r.fa) == r.fb && r.fb != NULL);
    CHECK(strcmp(r.fa->hash, r.fb->hash) || strcmp(r.fa->dtype, r.fb->dtype) ||
          !json_equal(r.fa->shape, r.fb->shape));
    for (size_t i = 0; i < position(A, r.fa); i++) { /* no earlier common entry differs */
      const tentry *b = trace_find(B, &A->e[i]);
      CHECK(!b || (!strcmp(A->e[i].hash, b->hash) && !strcmp(A->e[i].dtype, b->dtype) &&
                   json_equal(A->e[i].shape, b->shape)));
    }
    if (r.lo >= 0) {
      CHECK(r.same_layout && 0 <= r.lo && r.lo < r.hi && r.hi <= r.fa->numel);
      if (r.elem >= 0) {
        CHECK(r.elem >= r.lo && r.elem < r.hi && r.elem < 8 && strcmp(r.va, r.vb) != 0);
      }
    } else {
      CHECK(r.elem < 0);
    }
  }
  CHECK((r.only_a > 0) == (r.first_only_a != NULL) && (r.only_b > 0) == (r.first_only_b != NULL));
  if (r.first_only_a) {
    CHECK(trace_find(B, r.first_only_a) == NULL);
    for (size_t i = 0; i < position(A, r.first_only_a); i++) CHECK(trace_find(B, &A->e[i]) != NULL);
  }
  if (r.first_only_b) {
    CHECK(trace_find(A, r.first_only_b) == NULL);
    for (size_t i = 0; i < position(B, r.first_only_b); i++) CHECK(trace_find(A, &B->e[i]) != NULL);
  }
  if (trace_compare(B, A, &s, err, sizeof err) == 0) {
    CHECK(s.differ == r.differ && s.only_a == r.only_b && s.only_b == r.only_a);
    trace_cmp_free(&s);
  }
  trace_cmp_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > (1u << 16)) return 0;
  const uint8_t *p = data + 1;
  size_t n = size - 1;
  trace_file A, B;
  if (!(data[0] & 1)) {
    if (parse(p, n, &A) == 0) {
      trace_cmp r;
      char err[256];
      CHECK(parse(p, n, &B) == 0 && B.n == A.n);
      if (trace_compare(&A, &A, &r, err, sizeof err) == 0) { /* itself: identical */
        CHECK(r.differ == 0 && r.only_a == 0 && r.only_b == 0 && !r.fa && !r.first_only_a);
        trace_cmp_free(&r);
      }
      if (trace_compare(&A, &B, &r, err, sizeof err) == 0) { /* a second parse: identical */
        CHECK(r.differ == 0 && r.only_a == 0 && r.only_b == 0);
        trace_cmp_free(&r);
      }
      trace_free(&B);
      trace_free(&A);
    }
    return 0;
  }
  const uint8_t *z = memchr(p, 0, n);
  size_t na = z ? (size_t)(z - p) : n;
  if (parse(p, na, &A) != 0) return 0;
  if (z && parse(z + 1, n - na - 1, &B) == 0) {
    check_compare(&A, &B);
    trace_free(&B);
  }
  trace_free(&A);
  return 0;
}
