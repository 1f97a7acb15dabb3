/*
 * fuzz_npy.c — libFuzzer harness for the .npy header parser of `bitexact
 * train --data` (src/cli/train_data.c, td_npy_parse): any byte string
 * gives either a checked header or a one-line error — no crash, no read
 * outside the input (ASan, UBSan). On success the invariants the reader
 * relies on are checked, and a violation traps.
 *
 * Input: byte 0 bit 0 set: the rest is the header text alone, and the
 * harness writes a version-1 prefix (magic, version, length) in front and
 * 0..255 element bytes (byte 0 >> 1, doubled) after it, so the fuzzer
 * spends its time on the dict; clear: the rest is the whole file.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "train_data.h"

#define CHECK(c)                 \
  do {                           \
    if (!(c)) __builtin_trap();  \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > (1u << 20)) return 0;
  size_t n = size - 1, len;
  uint8_t *buf;
  if (data[0] & 1) {
    size_t tail = (size_t)(data[0] >> 1) * 2;
    if (n > 0xffff) return 0;
    len = 10 + n + tail;
    buf = malloc(len);
    if (!buf) return 0;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)n;
    buf[9] = (uint8_t)(n >> 8);
    memcpy(buf + 10, data + 1, n);
    memset(buf + 10 + n, 0x5a, tail);
  } else {
    len = n;
    buf = malloc(len ? len : 1); /* exact size: ASan sees any overread */
    if (!buf) return 0;
    memcpy(buf, data + 1, n);
  }
  td_npy h;
  char err[512];
  memset(err, 0, sizeof err);
  if (td_npy_parse(buf, len, &h, err, sizeof err) == 0) {
    CHECK(h.major >= 1 && h.major <= 3);
    CHECK(h.elem_size == 2 || h.elem_size == 4 || h.elem_size == 8);
    CHECK(h.data_offset <= len);
    CHECK(h.count <= (len - h.data_offset) / h.elem_size);
    CHECK(h.data_offset + h.count * h.elem_size == len);
    volatile uint8_t sink = 0;
    if (h.count) sink ^= buf[h.data_offset] ^ buf[len - 1];
    (void)sink;
  } else {
    CHECK(memchr(err, 0, sizeof err) != NULL && err[0] != 0);
    CHECK(strchr(err, '\n') == NULL);
  }
  free(buf);
  return 0;
}
