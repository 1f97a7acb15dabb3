/*
 * fuzz_safetensors.c — libFuzzer harness for the safetensors reader of the
 * bitexact command (src/cli/safetensors.c): any byte string must give
 * either a checked st_file or a one-line error — no crash, no leak, no
 * read outside the input (ASan, UBSan). Built by mk/cli.mk (it needs
 * jansson, not the library).
 *
 * Input: byte 0 selects the form, the rest is the payload:
 *   even: the payload is a whole file (length prefix included);
 *   odd:  the payload is "HEADER-JSON \0 DATA": the harness writes the
 *         8-byte length of HEADER-JSON in front (so the fuzzer spends its
 *         time on the JSON and the offsets, not on guessing the length).
 * On success every invariant the commands rely on is checked, and a
 * violation traps.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

#define CHECK(c)                 \
  do {                           \
    if (!(c)) __builtin_trap();  \
  } while (0)

static void check_file(const st_file *f, const uint8_t *bytes, size_t size) {
  CHECK(f->bytes == bytes && f->size == size);
  CHECK(8 + f->header_len + f->buffer_size == size);
  for (size_t i = 0; i < f->count; i++) {
    const st_tensor *t = &f->tensors[i];
    const st_dtype_info *d = st_dtype_get(t->dtype);
    CHECK(d != NULL);
    CHECK(t->begin <= t->end && t->end <= f->buffer_size);
    CHECK(t->data == f->buffer + t->begin);
    CHECK(strlen(t->name) == t->name_len);
    CHECK(t->nelem * d->bits == (t->end - t->begin) * 8);
    volatile uint8_t sink = 0;
    if (t->end > t->begin) sink ^= t->data[0] ^ t->data[t->end - t->begin - 1];
    (void)sink;
    if (i > 0) { /* sorted, unique names */
      const st_tensor *p = &f->tensors[i - 1];
      size_t n = p->name_len < t->name_len ? p->name_len : t->name_len;
      int c = memcmp(p->name, t->name, n);
      CHECK(c < 0 || (c == 0 && p->name_len < t->name_len));
    }
    CHECK(st_find(f, t->name, t->name_len) == t);
    char shape[64];
    st_shape_str(t, shape, sizeof shape);
    CHECK(memchr(shape, 0, sizeof shape) != NULL);
  }
  /* no two non-empty tensors share a byte */
  for (size_t i = 0; i < f->count && i < 64; i++)
    for (size_t j = i + 1; j < f->count && j < 64; j++) {
      const st_tensor *a = &f->tensors[i], *b = &f->tensors[j];
      if (a->end > a->begin && b->end > b->begin) CHECK(a->end <= b->begin || b->end <= a->begin);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t n = size - 1;
  uint8_t *buf;
  size_t len;
  if (data[0] & 1) {
    const uint8_t *zero = memchr(data + 1, 0, n);
    size_t hlen = zero ? (size_t)(zero - (data + 1)) : n;
    size_t dlen = zero ? n - hlen - 1 : 0;
    len = 8 + hlen + dlen;
    buf = malloc(len);
    if (!buf) return 0;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, data + 1, hlen);
    if (dlen) memcpy(buf + 8 + hlen, zero + 1, dlen);
  } else {
    len = n;
    buf = malloc(len ? len : 1); /* an exact-size copy: ASan sees any overread */
    if (!buf) return 0;
    memcpy(buf, data + 1, n);
  }
  st_file f;
  char err[512];
  if (st_parse(buf, len, &f, err, sizeof err) == 0) {
    check_file(&f, buf, len);
    st_close(&f);
  } else {
    CHECK(memchr(err, 0, sizeof err) != NULL && err[0] != 0);
    CHECK(strchr(err, '\n') == NULL);
  }
  free(buf);
  return 0;
}
