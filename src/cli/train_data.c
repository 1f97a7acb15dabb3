/*
 * train_data.c — token data of `bitexact train`: the .npy and .bin
 * readers, and the data order over them (train_data.h; the order and the
 * synthetic corpus themselves: src/glm/glm_data.c).
 */
#include "errbuf.h"
#include "train_data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- .npy header -------------------------------------------------------- */

typedef struct npy_lex {
  const char *p, *end;
} npy_lex;

static void skip_ws(npy_lex *l) {
  while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r'))
    l->p++;
}

/* A quoted Python string into buf (truncated); -1 if not one. */
static int lex_string(npy_lex *l, char *buf, size_t len) {
  if (l->p >= l->end || (*l->p != '\'' && *l->p != '"')) return -1;
  char q = *l->p++;
  size_t n = 0;
  while (l->p < l->end && *l->p != q) {
    if (*l->p == '\\') return -1; /* numpy never escapes */
    if (n + 1 < len) buf[n++] = *l->p;
    l->p++;
  }
  if (l->p >= l->end) return -1;
  l->p++;
  buf[n] = 0;
  return 0;
}

/* A non-negative integer (Python 2's trailing L accepted). */
static int lex_uint(npy_lex *l, uint64_t *v) {
  if (l->p >= l->end || *l->p < '0' || *l->p > '9') return -1;
  uint64_t x = 0;
  while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
    if (__builtin_mul_overflow(x, 10, &x) || __builtin_add_overflow(x, (uint64_t)(*l->p - '0'), &x))
      return -1;
    l->p++;
  }
  if (l->p < l->end && *l->p == 'L') l->p++;
  *v = x;
  return 0;
}

static int lex_word(npy_lex *l, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(l->end - l->p) < n || memcmp(l->p, w, n) != 0) return -1;
  l->p += n;
  return 0;
}

/* shape: "(" [int ("," int)* [","]] ")" -> ndim, dims (first 2 kept) */
static int lex_shape(npy_lex *l, int *ndim, uint64_t *dim0) {
  if (l->p >= l->end || *l->p != '(') return -1;
  l->p++;
  *ndim = 0;
  for (;;) {
    skip_ws(l);
    if (l->p < l->end && *l->p == ')') break;
    uint64_t v;
    if (lex_uint(l, &v)) return -1;
    if (*ndim == 0) *dim0 = v;
    if (*ndim < 64) (*ndim)++;
    skip_ws(l);
    if (l->p < l->end && *l->p == ',') {
      l->p++;
      continue;
    }
    if (l->p < l->end && *l->p == ')') break;
    return -1;
  }
  l->p++;
  return 0;
}

int td_npy_parse(const uint8_t *bytes, uint64_t size, td_npy *out, char *err, size_t errlen) {
  static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (size < 10 || memcmp(bytes, magic, 6) != 0)
    return cli_errf_ascii(err, errlen, "not a .npy file (no \\x93NUMPY magic)");
  int major = bytes[6], minor = bytes[7];
  if (major < 1 || major > 3)
    return cli_errf_ascii(err, errlen, ".npy format version %d.%d is not supported (1, 2 or 3)", major,
                 minor);
  uint64_t hlen, start;
  if (major == 1) {
    hlen = (uint64_t)bytes[8] | (uint64_t)bytes[9] << 8;
    start = 10;
  } else {
    if (size < 12) return cli_errf_ascii(err, errlen, ".npy header is truncated");
    hlen = (uint64_t)bytes[8] | (uint64_t)bytes[9] << 8 | (uint64_t)bytes[10] << 16 |
           (uint64_t)bytes[11] << 24;
    start = 12;
  }
  if (hlen > size - start)
    return cli_errf_ascii(err, errlen, ".npy header length %llu is beyond the end of the file",
                 (unsigned long long)hlen);
  npy_lex l = {(const char *)bytes + start, (const char *)bytes + start + hlen};
  char key[32], descr[32] = "";
  int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0, ndim = 0;
  uint64_t dim0 = 0;
  skip_ws(&l);
  if (l.p >= l.end || *l.p != '{') return cli_errf_ascii(err, errlen, ".npy header is not a dict");
  l.p++;
  for (;;) {
    skip_ws(&l);
    if (l.p < l.end && *l.p == '}') break;
    if (lex_string(&l, key, sizeof key)) return cli_errf_ascii(err, errlen, ".npy header: bad key");
    skip_ws(&l);
    if (l.p >= l.end || *l.p != ':') return cli_errf_ascii(err, errlen, ".npy header: ':' expected");
    l.p++;
    skip_ws(&l);
    if (strcmp(key, "descr") == 0) {
      if (lex_string(&l, descr, sizeof descr))
        return cli_errf_ascii(err, errlen, ".npy header: descr is not a simple type string");
      have_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0) {
      if (lex_word(&l, "False") == 0) fortran = 0;
      else if (lex_word(&l, "True") == 0) fortran = 1;
      else return cli_errf_ascii(err, errlen, ".npy header: fortran_order is not True or False");
      have_order = 1;
    } else if (strcmp(key, "shape") == 0) {
      if (lex_shape(&l, &ndim, &dim0)) return cli_errf_ascii(err, errlen, ".npy header: bad shape");
      have_shape = 1;
    } else {
      return cli_errf_ascii(err, errlen, ".npy header: unknown key '%s'", key);
    }
    skip_ws(&l);
    if (l.p < l.end && *l.p == ',') {
      l.p++;
      continue;
    }
    if (l.p < l.end && *l.p == '}') break;
    return cli_errf_ascii(err, errlen, ".npy header: ',' or '}' expected");
  }
  if (!have_descr || !have_order || !have_shape)
    return cli_errf_ascii(err, errlen, ".npy header lacks %s", !have_descr ? "descr"
                                                     : !have_order ? "fortran_order" : "shape");
  static const struct {
    const char *d;
    td_elem e;
    unsigned size;
  } types[] = {{"<i2", TD_I2, 2}, {"<u2", TD_U2, 2}, {"<i4", TD_I4, 4}, {"<u4", TD_U4, 4},
               {"<i8", TD_I8, 8}};
  int t = -1;
  for (int i = 0; i < 5; i++)
    if (strcmp(descr, types[i].d) == 0) t = i;
  if (t < 0)
    return cli_errf_ascii(err, errlen,
                 ".npy dtype '%s' is not supported (token ids: '<i2', '<u2', '<i4', '<u4', "
                 "'<i8')",
                 descr);
  if (fortran) return cli_errf_ascii(err, errlen, ".npy fortran_order True is not supported");
  if (ndim != 1)
    return cli_errf_ascii(err, errlen, ".npy array has %d dimensions; token ids must be a 1-D array", ndim);
  uint64_t data = start + hlen, nbytes;
  if (__builtin_mul_overflow(dim0, (uint64_t)types[t].size, &nbytes) || nbytes > size - data)
    return cli_errf_ascii(err, errlen, ".npy file is truncated: shape (%llu,) needs %llu more bytes than it holds",
                 (unsigned long long)dim0,
                 (unsigned long long)(nbytes > size - data ? nbytes - (size - data) : 0));
  if (nbytes != size - data)
    return cli_errf_ascii(err, errlen, ".npy file has %llu bytes after its array",
                 (unsigned long long)(size - data - nbytes));
  out->major = major;
  out->minor = minor;
  out->elem = types[t].e;
  out->elem_size = types[t].size;
  out->count = dim0;
  out->data_offset = data;
  return 0;
}

/* ---- opening ------------------------------------------------------------- */

static int64_t elem_at(const td_data *d, int64_t k) {
  const uint8_t *p = d->elems + (uint64_t)k * d->elem_size;
  uint64_t u = 0;
  for (unsigned b = d->elem_size; b-- > 0;) u = u << 8 | p[b];
  switch (d->elem) {
  case TD_I2: return (int16_t)(uint16_t)u;
  case TD_U2: return (uint16_t)u;
  case TD_I4: return (int32_t)(uint32_t)u;
  case TD_U4: return (uint32_t)u;
  default: return (int64_t)u;
  }
}

static int ends_with(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && strcmp(s + n - m, suf) == 0;
}

static int synth_make(td_data *d, int64_t V, char *err, size_t errlen) {
  int64_t N = TD_SYNTH_TOKENS;
  d->synth = malloc((size_t)N * sizeof *d->synth);
  if (!d->synth) return cli_errf_ascii(err, errlen, "out of memory for the synthetic corpus");
  glm_synth_tokens(d->seed, V, d->synth, N);
  double h = glm_synth_entropy_bits(V);
  d->entropy_bits = h;
  d->entropy_nats = h * 0x1.62e42fefa39efp-1;
  d->ntokens = N;
  return 0;
}

int td_open(td_data *d, const char *path, int64_t vocab, int64_t seq_len, uint64_t seed,
            int shuffle, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  d->seq_len = seq_len;
  d->seed = seed;
  d->shuffle = shuffle;
  d->perm_epoch = -1;
  d->entropy_bits = d->entropy_nats = NAN;
  int rc = -1;
  if (!path) {
    d->kind = TD_SYNTH;
    if (synth_make(d, vocab, err, errlen)) goto done;
  } else {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      cli_errf_ascii(err, errlen, "cannot open: %s", strerror(errno));
      goto done;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
      close(fd);
      cli_errf_ascii(err, errlen, "not a regular file");
      goto done;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size == 0) {
      close(fd);
      cli_errf_ascii(err, errlen, "empty file");
      goto done;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    int saved = errno;
    close(fd);
    if (map == MAP_FAILED) {
      cli_errf_ascii(err, errlen, "cannot map: %s", strerror(saved));
      goto done;
    }
    d->map = map;
    d->map_len = (size_t)size;
    const uint8_t *b = map;
    if (size >= 6 && b[0] == 0x93 && memcmp(b + 1, "NUMPY", 5) == 0) {
      td_npy h;
      if (td_npy_parse(b, size, &h, err, errlen)) goto done;
      d->kind = TD_NPY;
      d->elem = h.elem;
      d->elem_size = h.elem_size;
      d->elems = b + h.data_offset;
      d->ntokens = (int64_t)h.count;
    } else if (ends_with(path, ".bin")) {
      if (size % 2) {
        cli_errf_ascii(err, errlen, "a .bin token file (raw little-endian uint16) has an odd size, %llu bytes",
              (unsigned long long)size);
        goto done;
      }
      d->kind = TD_BIN;
      d->elem = TD_U2;
      d->elem_size = 2;
      d->elems = b;
      d->ntokens = (int64_t)(size / 2);
    } else {
      cli_errf_ascii(err, errlen, "neither a .npy file (no \\x93NUMPY magic) nor a raw uint16 file named *.bin");
      goto done;
    }
    madvise(map, (size_t)size, MADV_SEQUENTIAL);
    for (int64_t k = 0; k < d->ntokens; k++) {
      int64_t v = elem_at(d, k);
      if (v < 0 || v >= vocab) {
        cli_errf_ascii(err, errlen, "token id %lld at index %lld is out of range [0, vocab_size %lld)",
              (long long)v, (long long)k, (long long)vocab);
        goto done;
      }
    }
  }
  if (d->ntokens < seq_len + 1) {
    cli_errf_ascii(err, errlen, "%lld tokens are fewer than one sequence of seq_len + 1 = %lld",
          (long long)d->ntokens, (long long)(seq_len + 1));
    goto done;
  }
  d->nseq = (d->ntokens - 1) / seq_len;
  rc = 0;
done:
  if (rc) td_close(d);
  return rc;
}

void td_close(td_data *d) {
  if (d->map) munmap(d->map, d->map_len);
  free(d->synth);
  free(d->perm);
  memset(d, 0, sizeof *d);
}

int64_t td_sequence(td_data *d, int64_t g) {
  int64_t S = d->nseq, e = g / S, k = g % S;
  if (!d->shuffle) return k;
  if (d->perm_epoch != e) {
    if (!d->perm) d->perm = malloc((size_t)S * sizeof *d->perm);
    if (!d->perm) return -1;
    glm_epoch_perm(d->seed, e, S, d->perm);
    d->perm_epoch = e;
  }
  return d->perm[k];
}

void td_tokens(const td_data *d, int64_t i, int32_t *out) {
  int64_t first = i * d->seq_len;
  for (int64_t t = 0; t <= d->seq_len; t++)
    out[t] = d->kind == TD_SYNTH ? d->synth[first + t] : (int32_t)elem_at(d, first + t);
}
