/*
 * elements.c — element-wise comparison for `bitexact diff`: every float
 * format of safetensors (IEEE fp16/bf16/fp32/fp64, the fp8 variants) is
 * described by its field widths and special-value rule and decoded
 * exactly to double; integers compare as integers; sub-byte formats as
 * bytes. Runs of equal bytes are skipped with memcmp first.
 */
#include "elements.h"

#include <math.h>
#include <string.h>

typedef enum special { SP_IEEE, SP_FN, SP_FNUZ, SP_E8M0 } special;

typedef struct ffmt {
  int bytes, ebits, mbits, bias;
  special sp;  /* IEEE: max exponent = inf/NaN; FN: only all-ones NaN, no inf;
                  FNUZ: 0x80 is the only NaN, no -0; E8M0: unsigned powers of 2 */
} ffmt;

static int float_format(st_dtype dt, ffmt *f) {
  switch (dt) {
    case ST_F64: *f = (ffmt){8, 11, 52, 1023, SP_IEEE}; return 1;
    case ST_F32: *f = (ffmt){4, 8, 23, 127, SP_IEEE}; return 1;
    case ST_F16: *f = (ffmt){2, 5, 10, 15, SP_IEEE}; return 1;
    case ST_BF16: *f = (ffmt){2, 8, 7, 127, SP_IEEE}; return 1;
    case ST_F8_E5M2: *f = (ffmt){1, 5, 2, 15, SP_IEEE}; return 1;
    case ST_F8_E4M3: *f = (ffmt){1, 4, 3, 7, SP_FN}; return 1;
    case ST_F8_E4M3FNUZ: *f = (ffmt){1, 4, 3, 8, SP_FNUZ}; return 1;
    case ST_F8_E5M2FNUZ: *f = (ffmt){1, 5, 2, 16, SP_FNUZ}; return 1;
    case ST_F8_E8M0: *f = (ffmt){1, 8, 0, 127, SP_E8M0}; return 1;
    default: return 0;
  }
}

static uint64_t load(const uint8_t *p, int bytes) { /* little-endian */
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static int is_nan(const ffmt *f, uint64_t bits) {
  uint64_t emax = ((uint64_t)1 << f->ebits) - 1, mmask = ((uint64_t)1 << f->mbits) - 1;
  uint64_t e = (bits >> f->mbits) & emax, m = bits & mmask;
  switch (f->sp) {
    case SP_IEEE: return e == emax && m != 0;
    case SP_FN: return e == emax && m == mmask;
    case SP_FNUZ: return bits == 0x80;
    case SP_E8M0: return bits == 0xFF;
  }
  return 0;
}

/* Exact value (NaN handled by the caller). */
static double decode(const ffmt *f, uint64_t bits) {
  uint64_t emax = ((uint64_t)1 << f->ebits) - 1, mmask = ((uint64_t)1 << f->mbits) - 1;
  uint64_t e = (bits >> f->mbits) & emax, m = bits & mmask;
  if (f->sp == SP_E8M0) return ldexp(1.0, (int)e - 127);
  int neg = (int)(bits >> (f->ebits + f->mbits)) & 1;
  double v;
  if (f->sp == SP_IEEE && e == emax) v = INFINITY;
  else if (e == 0) v = ldexp((double)m, 1 - f->bias - f->mbits);
  else v = ldexp((double)(m | (mmask + 1)), (int)e - f->bias - f->mbits);
  return neg ? -v : v;
}

/* |ord(a) - ord(b)|: ord is monotone in the value, +0 and -0 both 0. */
static uint64_t ulp_distance(const ffmt *f, uint64_t a, uint64_t b) {
  if (f->sp == SP_E8M0) return a > b ? a - b : b - a;
  int sh = f->ebits + f->mbits;
  uint64_t mask = ((uint64_t)1 << sh) - 1;
  uint64_t ma = a & mask, mb = b & mask;
  int sa = (int)(a >> sh) & 1, sb = (int)(b >> sh) & 1;
  if (sa == sb) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;
}

/* The bits of v in IEEE-like format f, when v is exactly representable
 * there (not NaN): 1, else 0. */
static int encode(const ffmt *f, double v, uint64_t *bits) {
  if (f->sp != SP_IEEE || isnan(v)) return 0;
  uint64_t emax = ((uint64_t)1 << f->ebits) - 1, sign = (uint64_t)(signbit(v) != 0)
                                                          << (f->ebits + f->mbits);
  double a = fabs(v);
  uint64_t b;
  if (isinf(a)) b = emax << f->mbits;
  else if (a < ldexp(1.0, 1 - f->bias)) /* zero or subnormal: multiples of 2^(1-bias-mbits) */
    b = (uint64_t)ldexp(a, f->bias - 1 + f->mbits);
  else {
    int e;
    double fr = frexp(a, &e); /* a = fr 2^e, fr in [0.5, 1) */
    uint64_t be = (uint64_t)(e - 1 + f->bias);
    if (be >= emax) return 0;
    b = be << f->mbits | ((uint64_t)ldexp(fr, f->mbits + 1) & (((uint64_t)1 << f->mbits) - 1));
  }
  if (decode(f, sign | b) != v) return 0; /* not exact in f */
  *bits = sign | b;
  return 1;
}

int elem_ulp_values(st_dtype dt, double a, double b, uint64_t *ulp) {
  ffmt f;
  uint64_t x, y;
  if (!float_format(dt, &f) || !encode(&f, a, &x) || !encode(&f, b, &y)) return 0;
  *ulp = ulp_distance(&f, x, y);
  return 1;
}

static void note_first(elem_stats *s, uint64_t i, double va, double vb, uint64_t ba, uint64_t bb) {
  if (s->differ++ == 0) {
    s->first = i;
    s->first_a = va;
    s->first_b = vb;
    s->first_bits_a = ba;
    s->first_bits_b = bb;
  }
}

static void note_values(elem_stats *s, double va, double vb) {
  double d = fabs(va - vb), m = fmax(fabs(va), fabs(vb));
  if (va == vb) d = 0; /* inf vs inf of one sign, +0 vs -0 */
  double r = d == 0 ? 0 : d / m;
  if (isnan(r)) r = INFINITY; /* inf vs a finite value: d = inf, m = inf */
  if (d > s->max_abs) s->max_abs = d;
  if (r > s->max_rel) s->max_rel = r;
}

static void cmp_float(const ffmt *f, const uint8_t *a, const uint8_t *b, uint64_t n,
                      uint64_t base, elem_stats *s) {
  for (uint64_t i = 0; i < n; i++) {
    uint64_t x = load(a + i * f->bytes, f->bytes), y = load(b + i * f->bytes, f->bytes);
    if (x == y) continue;
    int nx = is_nan(f, x), ny = is_nan(f, y);
    double vx = nx ? NAN : decode(f, x), vy = ny ? NAN : decode(f, y);
    note_first(s, base + i, vx, vy, x, y);
    if (nx && ny) {
      s->nan_payload++;
    } else if (nx || ny) {
      s->nan_mismatch++;
    } else {
      if (vx == 0 && vy == 0) s->signed_zero++;
      uint64_t u = ulp_distance(f, x, y);
      if (u > s->max_ulp) s->max_ulp = u;
      note_values(s, vx, vy);
    }
  }
}

static void cmp_int(int bytes, int is_signed, const uint8_t *a, const uint8_t *b, uint64_t n,
                    uint64_t base, elem_stats *s) {
  uint64_t sign = (uint64_t)1 << (8 * bytes - 1);
  for (uint64_t i = 0; i < n; i++) {
    uint64_t x = load(a + i * bytes, bytes), y = load(b + i * bytes, bytes);
    if (x == y) continue;
    double vx, vy;
    /* flip the sign bit of signed values: then unsigned order = value order */
    uint64_t ox = is_signed ? x ^ sign : x, oy = is_signed ? y ^ sign : y;
    if (is_signed) {
      int64_t sx = (int64_t)(x << (64 - 8 * bytes)) >> (64 - 8 * bytes);
      int64_t sy = (int64_t)(y << (64 - 8 * bytes)) >> (64 - 8 * bytes);
      vx = (double)sx, vy = (double)sy;
    } else {
      vx = (double)x, vy = (double)y;
    }
    note_first(s, base + i, vx, vy, x, y);
    uint64_t u = ox > oy ? ox - oy : oy - ox;
    if (u > s->max_ulp) s->max_ulp = u;
    note_values(s, vx, vy);
  }
}

void elem_compare(st_dtype dt, const uint8_t *a, const uint8_t *b, uint64_t nbytes,
                  elem_stats *s) {
  memset(s, 0, sizeof *s);
  const st_dtype_info *info = st_dtype_get(dt);
  ffmt f = {1, 0, 0, 0, SP_IEEE};
  int fl = float_format(dt, &f);
  if (dt == ST_C64) fl = float_format(ST_F32, &f); /* pairs of fp32; index halved below */
  int bytes = info->kind == ST_KIND_PACKED ? 1 : fl ? f.bytes : (int)(info->bits / 8);
  s->by_bytes = info->kind == ST_KIND_PACKED;
  s->is_integer = !fl && !s->by_bytes;
  s->has_ulp = !s->by_bytes;
  s->compared = nbytes / (uint64_t)bytes;
  s->first_a = s->first_b = NAN;
  /* blocks of 4 KiB: memcmp skips equal runs fast */
  const uint64_t block = 4096 - 4096 % (uint64_t)bytes;
  for (uint64_t off = 0; off < nbytes; off += block) {
    uint64_t len = nbytes - off < block ? nbytes - off : block;
    if (memcmp(a + off, b + off, (size_t)len) == 0) continue;
    uint64_t n = len / (uint64_t)bytes, base = off / (uint64_t)bytes;
    if (fl) {
      cmp_float(&f, a + off, b + off, n, base, s);
    } else if (s->by_bytes) {
      for (uint64_t i = 0; i < n; i++)
        if (a[off + i] != b[off + i]) note_first(s, base + i, NAN, NAN, a[off + i], b[off + i]);
    } else {
      cmp_int(bytes, info->kind == ST_KIND_INT, a + off, b + off, n, base, s);
    }
  }
  if (dt == ST_C64) {
    s->first /= 2; /* element index of the complex number */
    s->compared /= 2;
  }
}
