/*
 * vmath_body.h — the vector kernels of the elementwise math (kernels.h's
 * bx_math_kernels), written once over a small set of lane operations and
 * included by avx512_math.c (8 fp64 lanes) and avx2_math.c (4 fp64
 * lanes), which define them. Not a header of its own: it defines static
 * functions and the table object VM_TABLE named VM_NAME.
 *
 * Why the bits are the scalar functions'. math_det.h's functions return
 * the correctly rounded fp32 value on every input (proved per function,
 * and checked on all 2^32 inputs by dev/math_exhaustive.c). Each kernel
 * here computes, per lane, a binary64 approximation y of f(x) with a
 * proved relative error below 2^-49 (bounds at each function), and tests
 * it: a lane is *near* when the 29 bits of y's significand below fp32
 * precision lie within 2^8 of the midpoint pattern 1 0...0, i.e. when a
 * midpoint between two floats lies within 2^8 binary64 ulps (>= 2^-45
 * relative) of y. A lane that is not near has no midpoint between y and
 * f(x) (|y - f(x)| < 2^-49 |y| < 2^4 ulps), so (float)y, rounded to
 * nearest, is f(x) correctly rounded: the scalar function's result. This
 * holds where y and f(x) are normal fp32 values and y is finite; every
 * other input (each function's range test: NaN, Inf, saturated values,
 * fp32-subnormal or overflowing results, zero, negative arguments of
 * log/rsqrt, SiLU below 2^-60) and every near lane (probability ~2^-20)
 * is recomputed by the scalar function itself (its early returns make the
 * saturated and special inputs cheap there). sin and cos are the
 * exception in method: their lanes run math_det.h's own fast path
 * operation for operation and its rounding test (below), so they are bit
 * for bit the scalar fast value; their |x| < 2^-12 lanes take x and 1 as
 * the scalar functions do. dev/math_exhaustive.c --vector compares every
 * kernel with the scalar function on all 2^32 inputs.
 *
 * The fast paths use fma (a correctly rounded IEEE operation: the same
 * bits on every ISA), and on AVX-512 the 2^-14 reciprocal and reciprocal
 * square root estimates refined by Newton steps (VRECIP, VRSQRT: relative
 * error < 2^-52 each, stated in avx512_math.c; on AVX2 they are the IEEE
 * division and square root). Their results differ from math_det.h's
 * binary64 values in the last bits; only the near/not-near decision and
 * the correctly rounded float matter.
 *
 * The operations an including file defines (VD: W doubles; VF: W floats;
 * VFI: W int32; VI: W int64 in a VD's bits; VM: a W-lane mask):
 *   VSET1 VADD VSUB VMUL VNEG VABS VFMA(a,b,c) = a b + c, VFNMA(a,b,c) =
 *   c - a b, VFNMS(a,b,c) = -a b - c, VRECIP(d) ~ 1/d, VRSQRT(x) ~ 1/sqrt(x),
 *   VTAB16(t, i): t[i mod 16] (bits) for a 16-entry uint64_t table
 *   VCVT_PD (VF -> VD, exact) VCVT_PS (VD -> VF, rounded)
 *   VCMP(a, b, _CMP_*) -> VM; VBLEND(m, a, b) = m ? b : a
 *   M_OR M_AND M_NOT M_ANDN(a, b) = a & ~b; M_BITS(m): lane i -> bit i
 *   VF_NE(a, b) -> VM (float compare, unordered or not equal)
 *   VI_BITS(d) VI_FROM(i) VI_SET1 VI_ADD VI_SLL VI_AND VI_TESTZ(i, c)
 *   (lanes with i & c == 0) VI_TESTNZ, VI_TEST_AND(m, i, c) = m & (i & c != 0)
 *   VFI_IN(b, lo, hi): lanes with lo <= b < hi (unsigned int32) as a VM
 *   VFI_* on the float bits for log: VF_BITS VFI_FLT VFI_SET1 VFI_SRL
 *   VFI_AND VFI_OR VFI_SUB VFI_GT VFI_CVT_PD (exact int32 -> double)
 *   VF_LOAD VF_STORE (unaligned); U: vectors a step (interleaved)
 */

#include "math_det.h"

/* every statement over the U vectors of a step, step-major, so the
 * dependency chains of the U vectors interleave */
#define EACH(stmt) _Pragma("GCC unroll 8") for (int u = 0; u < U; u++) { stmt; }

/* ---- shared pieces ---------------------------------------------------------- */

/* Lanes of ok whose y is not near (top comment): bits 0..28 of y further
 * than 2^8 from 2^28, i.e. bits 9..28 of bits(y) + 2^8 - 2^28 not all 0. */
static inline __attribute__((always_inline)) VM vm_good(VM ok, VD y) {
  return VI_TEST_AND(ok, VI_ADD(VI_BITS(y), VI_SET1(0x100 - 0x10000000)), VI_SET1(0x1ffffe00));
}

/* Lanes whose fp32 input bits b satisfy lo <= b < hi (unsigned; with the
 * sign bit cleared first for VM_ABS_IN): the range tests of the fast
 * paths. Lanes outside compute garbage (Inf, NaN: the exceptions are
 * masked) and are redone. */
#define VM_BITS_IN(xf, lo, hi) VFI_IN(VF_BITS(xf), lo, hi)
#define VM_ABS_IN(xf, lo, hi) VFI_IN(VFI_AND(VF_BITS(xf), VFI_SET1(0x7fffffff)), lo, hi)

/* 2^(j/16) rounded to double, j = 0..15 (0x1p+0, 0x1.0b5586cf9890fp+0,
 * 0x1.172b83c7d517bp+0, ... 0x1.ea4afa2a490dap+0), each as its bits minus
 * j 2^48: bits(s) << 48 is k 2^48 = (k >> 4) 2^52 + (k & 15) 2^48 (mod
 * 2^64; bits(s) = bits(1.5 2^52) + k, whose low 16 bits are k's), so entry
 * (k & 15) plus bits(s) << 48 is bits(2^(k >> 4) 2^((k & 15)/16)). */
static const uint64_t vm_exp_tab[16] __attribute__((aligned(64))) = {
    0x3ff0000000000000u, 0x3fefb5586cf9890fu, 0x3fef72b83c7d517bu, 0x3fef387a6e756238u,
    0x3fef06fe0a31b715u, 0x3feedea64c123422u, 0x3feebfdad5362a27u, 0x3feeab07dd485429u,
    0x3feea09e667f3bcdu, 0x3feea11473eb0187u, 0x3feeace5422aa0dbu, 0x3feec49182a3f090u,
    0x3feee89f995ad3adu, 0x3fef199bdd85529cu, 0x3fef5818dcfba487u, 0x3fefa4afa2a490dau};

/* e^(sx) for s = +1 (neg = 0) or -1 (neg = 1), |x| <= 111, relative error
 * < 2^-50.3: k = nearest(16 s x / ln2) by one fma against 1.5 2^52
 * (|k| < 2^12; its bits are the low bits of the sum); r = s x - k ln2/16
 * with ln2/16 = L1 + L2, L1 of 39 bits: the first fma is exact (s x - k L1
 * is a multiple of 2^-43 below 2^-5.5 when k != 0), the second adds
 * < 2^-58.5; |r| <= ln2/32 (1 + 2^-40). e^r = 1 + r a(r), a from the
 * Taylor polynomial to r^6 (remainder r^7/7! e^|r| < 2^-51.0), Horner by
 * fma (< 2^-52 relative on 1 + r a). 2^(k/16) = 2^(k >> 4) t[k & 15],
 * t[j] = 2^(j/16) rounded (2^-53), the power of two added into t's
 * exponent field by one integer add (exact: normal results; the table
 * above); the last fma t' + t' (r a) (2^-53). The bounds sum to
 * < 2^-50.3. */
static inline __attribute__((always_inline)) void vm_exp_core(const VD *x, VD *y, int neg) {
  const VD magic = VSET1(0x1.8p52);
  const VD c = VSET1(neg ? -0x1.71547652b82fep+4 : 0x1.71547652b82fep+4);
  VD s[U], k[U], r[U], a[U], t[U];
  EACH(s[u] = VFMA(x[u], c, magic));
  EACH(k[u] = VSUB(s[u], magic));
  if (neg) {
    EACH(r[u] = VFNMS(k[u], VSET1(0x1.62e42fefa4000p-5), x[u])); /* -x - k L1 */
  } else {
    EACH(r[u] = VFNMA(k[u], VSET1(0x1.62e42fefa4000p-5), x[u])); /* x - k L1 */
  }
  EACH(r[u] = VFNMA(k[u], VSET1(-0x1.8432a1b0e2634p-47), r[u]));
  EACH(t[u] = VI_FROM(VI_ADD(VTAB16(vm_exp_tab, VI_BITS(s[u])), VI_SLL(VI_BITS(s[u]), 48))));
  EACH(a[u] = VFMA(VSET1(0x1.a01a01a01a01ap-13), r[u], VSET1(0x1.6c16c16c16c17p-10)));
  EACH(a[u] = VFMA(a[u], r[u], VSET1(0x1.1111111111111p-7)));
  EACH(a[u] = VFMA(a[u], r[u], VSET1(0x1.5555555555555p-5)));
  EACH(a[u] = VFMA(a[u], r[u], VSET1(0x1.5555555555555p-3)));
  EACH(a[u] = VFMA(a[u], r[u], VSET1(0.5)));
  EACH(a[u] = VFMA(a[u], r[u], VSET1(1.0)));
  EACH(y[u] = VFMA(t[u], VMUL(r[u], a[u]), t[u]));
}

#define VM_ALL ((1u << W) - 1u)

/* ---- U vectors of W inputs per function: the results, and in redo[] the
 * lanes the scalar function recomputes (its own early returns make the
 * saturated and special inputs cheap there) --------------------------------------- */

/* exp: fp32-normal results for |x| <= 87 (e^-87 > 2^-126); other inputs
 * redone. */
static inline __attribute__((always_inline)) void vm_exp_n(const VF *xf, VF *out, unsigned *redo) {
  VD x[U], y[U];
  VM ok[U];
  EACH(ok[u] = VM_ABS_IN(xf[u], 0, 0x42ae0001)); /* |x| <= 87 */
  EACH(x[u] = VCVT_PD(xf[u]));
  vm_exp_core(x, y, 0);
  EACH(redo[u] = M_BITS(vm_good(ok[u], y[u])) ^ VM_ALL);
  EACH(out[u] = VCVT_PS(y[u]));
}

/* sigmoid = 1 / (1 + e^-x): e^-x < 2^-50.3, 1 + e (2^-53), VRECIP
 * (< 2^-52): < 2^-49.4. The fast path for |x| < 40 (fp32-normal
 * results); other inputs redone. */
static inline __attribute__((always_inline)) void vm_sigmoid_n(const VF *xf, VF *out, unsigned *redo) {
  VD x[U], y[U];
  VM ok[U];
  EACH(ok[u] = VM_ABS_IN(xf[u], 0, 0x42200000)); /* |x| < 40 */
  EACH(x[u] = VCVT_PD(xf[u]));
  vm_exp_core(x, y, 1);
  EACH(y[u] = VRECIP(VADD(VSET1(1.0), y[u])));
  EACH(redo[u] = M_BITS(vm_good(ok[u], y[u])) ^ VM_ALL);
  EACH(out[u] = VCVT_PS(y[u]));
}

/* SiLU = x / (1 + e^-x) as x VRECIP(1 + e^-x): < 2^-49.3. The fast path
 * for 2^-60 <= |x| < 40 (fp32-normal results: |silu(-40)| > 2^-55,
 * |silu(x)| > |x|/4 near 0); other inputs (+-0, |x| < 2^-60 among them)
 * redone. */
static inline __attribute__((always_inline)) void vm_silu_n(const VF *xf, VF *out, unsigned *redo) {
  VD x[U], y[U];
  VM ok[U];
  EACH(ok[u] = VM_ABS_IN(xf[u], 0x21800000, 0x42200000)); /* 2^-60 <= |x| < 40 */
  EACH(x[u] = VCVT_PD(xf[u]));
  vm_exp_core(x, y, 1);
  EACH(y[u] = VMUL(x[u], VRECIP(VADD(VSET1(1.0), y[u]))));
  EACH(redo[u] = M_BITS(vm_good(ok[u], y[u])) ^ VM_ALL);
  EACH(out[u] = VCVT_PS(y[u]));
}

/* rsqrt = VRSQRT(x) (< 2^-51.9) for 2^-149 <= x <= FLT_MAX (results in
 * [2^-64, 2^74.5], fp32-normal); NaN, +-0, negatives, +Inf redone. */
static inline __attribute__((always_inline)) void vm_rsqrt_n(const VF *xf, VF *out, unsigned *redo) {
  VD x[U], y[U];
  VM ok[U];
  EACH(ok[u] = VM_BITS_IN(xf[u], 1, 0x7f800000)); /* 2^-149 <= x <= FLT_MAX */
  EACH(x[u] = VCVT_PD(xf[u]));
  EACH(y[u] = VRSQRT(x[u]));
  EACH(redo[u] = M_BITS(vm_good(ok[u], y[u])) ^ VM_ALL);
  EACH(out[u] = VCVT_PS(y[u]));
}

/* log for normal finite x > 0 (other inputs redone): bx_logf_det's split
 * x = m 2^e, m in [sqrt(1/2), sqrt(2)) (int32 lanes: the compare's
 * all-ones lane takes 2^23 off the mantissa bits and adds 1 to e); s =
 * (m - 1) VRECIP(m + 1) (m - 1, m + 1 exact; < 2^-51.9), the series
 * 2 s + s z p(z), z = s^2, to s^23 by fma (remainder < 2^-60; the Horner
 * rounding damped by z <= 2^-5: < 2^-52 relative on the sum), e ln2 with
 * the 32-bit ln2_hi exact, the sum cancelling at most a factor 3
 * (|log x| >= 0.34 when e != 0): < 2^-49.5. log 1 = +0 exactly (s = 0;
 * +0 is not near and converts to +0). |log x| >= 2^-24 otherwise. */
static inline __attribute__((always_inline)) void vm_log_n(const VF *xf, VF *out, unsigned *redo) {
  VD m[U], s[U], z[U], p[U], de[U], y[U];
  VFI b[U], e[U], mb[U], big[U];
  VM ok[U];
  EACH(ok[u] = VM_BITS_IN(xf[u], 0x00800000, 0x7f800000)); /* 2^-126 <= x <= FLT_MAX */
  EACH(b[u] = VF_BITS(xf[u]));
  EACH(e[u] = VFI_SUB(VFI_SRL(b[u], 23), VFI_SET1(127)));
  EACH(mb[u] = VFI_OR(VFI_AND(b[u], VFI_SET1(0x007fffff)), VFI_SET1(0x3f800000)));
  EACH(big[u] = VFI_GT(mb[u], VFI_SET1(0x3fb504f3)));
  EACH(mb[u] = VFI_SUB(mb[u], VFI_AND(big[u], VFI_SET1(0x00800000))));
  EACH(e[u] = VFI_SUB(e[u], big[u]));
  EACH(m[u] = VCVT_PD(VFI_FLT(mb[u])));
  EACH(s[u] = VMUL(VSUB(m[u], VSET1(1.0)), VRECIP(VADD(m[u], VSET1(1.0)))));
  EACH(z[u] = VMUL(s[u], s[u]));
  EACH(p[u] = VFMA(VSET1(0x1.642c8590b2164p-4), z[u], VSET1(0x1.8618618618618p-4)));
  EACH(p[u] = VFMA(p[u], z[u], VSET1(0x1.af286bca1af28p-4)));
  EACH(p[u] = VFMA(p[u], z[u], VSET1(0x1.e1e1e1e1e1e1ep-4)));
  EACH(p[u] = VFMA(p[u], z[u], VSET1(0x1.1111111111111p-3)));
  EACH(p[u] = VFMA(p[u], z[u], VSET1(0x1.3b13b13b13b14p-3)));
  EACH(p[u] = VFMA(p[u], z[u], VSET1(0x1.745d1745d1746p-3)));
  EACH(p[u] = VFMA(p[u], z[u], VSET1(0x1.c71c71c71c71cp-3)));
  EACH(p[u] = VFMA(p[u], z[u], VSET1(0x1.2492492492492p-2)));
  EACH(p[u] = VFMA(p[u], z[u], VSET1(0x1.999999999999ap-2)));
  EACH(p[u] = VFMA(p[u], z[u], VSET1(0x1.5555555555555p-1)));
  EACH(y[u] = VFMA(VMUL(s[u], z[u]), p[u], VADD(s[u], s[u]))); /* 2 s + s z p */
  EACH(de[u] = VFI_CVT_PD(e[u]));
  EACH(y[u] = VFMA(de[u], VSET1(0x1.62e42fee00000p-1), VFMA(de[u], VSET1(0x1.a39ef35793c76p-33), y[u])));
  EACH(redo[u] = M_BITS(vm_good(ok[u], y[u])) ^ VM_ALL);
  EACH(out[u] = VCVT_PS(y[u]));
}

/* ---- sin, cos: math_det.h's fast path lane for lane ------------------------------ */

/* bx_md_hard, lane for lane. */
static inline __attribute__((always_inline)) VM vm_hard(VD y) {
  VD d = VMUL(y, VSET1(0x1p-45));
  return VF_NE(VCVT_PS(VSUB(y, d)), VCVT_PS(VADD(y, d)));
}

/* sin (want_sin) or cos: bx_md_trig_reduce, the quadrant from the bits
 * of t + magic (their low two bits are k's: bits(magic) ends in zeros),
 * both polynomials, the one the quadrant picks, its sign. */
static inline __attribute__((always_inline)) VF vm_trig(VF xf, unsigned *redo, int want_sin) {
  VD x = VCVT_PD(xf);
  VD ax = VABS(x);
  VM outside = VCMP(ax, VSET1(0x1p28), _CMP_NLT_UQ); /* NaN too */
  VM small = VCMP(ax, VSET1(0x1p-12), _CMP_LT_OQ);
  VD xs = VBLEND(M_OR(outside, small), x, VSET1(1.0));
  const VD magic = VSET1(0x1.8p52);
  VD s = VADD(VMUL(xs, VSET1(0x1.45f306dc9c883p-1)), magic);
  VD k = VSUB(s, magic);
  VD a = VSUB(VSUB(xs, VMUL(k, VSET1(0x1.921fb5p+0))), VMUL(k, VSET1(0x1.110b46p-26)));
  VD b = VNEG(VMUL(k, VSET1(0x1.1a6263p-54)));
  VD hi = VADD(a, b); /* two_sum(a, b) */
  VD bb = VSUB(hi, a);
  VD lo = VADD(VSUB(a, VSUB(hi, bb)), VSUB(b, bb));
  VD l2 = VSUB(lo, VMUL(k, VSET1(0x1.8a2e03707344ap-81))); /* fast_two_sum(hi, l2) */
  VD rh = VADD(hi, l2);
  VD rl = VSUB(l2, VSUB(rh, hi));
  VI q = VI_BITS(s);
  if (!want_sin) q = VI_ADD(q, VI_SET1(1)); /* cos x = sin(x + pi/2) */
  VM use_sin = VI_TESTZ(q, VI_SET1(1));
  VM neg = VI_TESTNZ(q, VI_SET1(2));
  VD z = VMUL(rh, rh);
  VD ps = VSET1(-0x1.2f49b46814157p-57);
  ps = VADD(VSET1(0x1.952c77030ad4ap-49), VMUL(z, ps));
  ps = VADD(VSET1(-0x1.ae7f3e733b81fp-41), VMUL(z, ps));
  ps = VADD(VSET1(0x1.6124613a86d09p-33), VMUL(z, ps));
  ps = VADD(VSET1(-0x1.ae64567f544e4p-26), VMUL(z, ps));
  ps = VADD(VSET1(0x1.71de3a556c734p-19), VMUL(z, ps));
  ps = VADD(VSET1(-0x1.a01a01a01a01ap-13), VMUL(z, ps));
  ps = VADD(VSET1(0x1.1111111111111p-7), VMUL(z, ps));
  ps = VADD(VSET1(-0x1.5555555555555p-3), VMUL(z, ps));
  VD ys = VADD(rh, VADD(VMUL(VMUL(rh, z), ps), rl));
  VD pc = VSET1(0x1.e542ba4020225p-62);
  pc = VADD(VSET1(-0x1.6827863b97d97p-53), VMUL(z, pc));
  pc = VADD(VSET1(0x1.ae7f3e733b81fp-45), VMUL(z, pc));
  pc = VADD(VSET1(-0x1.93974a8c07c9dp-37), VMUL(z, pc));
  pc = VADD(VSET1(0x1.1eed8eff8d898p-29), VMUL(z, pc));
  pc = VADD(VSET1(-0x1.27e4fb7789f5cp-22), VMUL(z, pc));
  pc = VADD(VSET1(0x1.a01a01a01a01ap-16), VMUL(z, pc));
  pc = VADD(VSET1(-0x1.6c16c16c16c17p-10), VMUL(z, pc));
  pc = VADD(VSET1(0x1.5555555555555p-5), VMUL(z, pc));
  pc = VADD(VSET1(-0.5), VMUL(z, pc));
  VD yc = VADD(VSET1(1.0), VSUB(VMUL(z, pc), VMUL(rh, rl)));
  VD y = VBLEND(use_sin, yc, ys);
  y = VBLEND(neg, y, VNEG(y));
  VM hard = M_ANDN(vm_hard(y), small);
  y = VBLEND(small, y, want_sin ? x : VSET1(1.0));
  *redo = M_BITS(M_OR(hard, outside));
  return VCVT_PS(y);
}

static inline __attribute__((always_inline)) void vm_sin_n(const VF *xf, VF *out, unsigned *redo) {
  EACH(out[u] = vm_trig(xf[u], &redo[u], 1));
}
static inline __attribute__((always_inline)) void vm_cos_n(const VF *xf, VF *out, unsigned *redo) {
  EACH(out[u] = vm_trig(xf[u], &redo[u], 0));
}

/* ---- the loops ------------------------------------------------------------------ */

/* The flagged lanes of one vector, by the scalar function. */
#ifdef VM_COUNT
long vm_count;
#endif
static __attribute__((noinline, cold)) VF vm_redo(VF xv, VF r, unsigned m, float (*f)(float)) {
#ifdef VM_COUNT
  vm_count += __builtin_popcount(m);
#endif
  float xs[W], rs[W];
  VF_STORE(xs, xv);
  VF_STORE(rs, r);
  while (m) {
    int j = __builtin_ctz(m);
    rs[j] = f(xs[j]);
    m &= m - 1;
  }
  return VF_LOAD(rs);
}

static float vm_scalar_exp(float x) { return bx_expf_det(x); }
static float vm_scalar_log(float x) { return bx_logf_det(x); }
static float vm_scalar_sigmoid(float x) { return bx_sigmoidf_det(x); }
static float vm_scalar_silu(float x) { return bx_siluf_det(x); }
static float vm_scalar_rsqrt(float x) { return bx_rsqrtf_det(x); }
static float vm_scalar_sin(float x) { return bx_sinf_det(x); }
static float vm_scalar_cos(float x) { return bx_cosf_det(x); }

/* y[0..n) = f(x[0..n)), U vectors a step (the step's inputs loaded
 * before its results are stored: x may be y), the tail through a
 * zero-padded buffer of U vectors (padding lanes never redone, never
 * stored). */
#define VM_LOOP(name)                                                                  \
  static void vm_loop_##name(const float *x, float *y, size_t n) {                     \
    VF in[U], out[U];                                                                  \
    unsigned redo[U];                                                                  \
    size_t i = 0;                                                                      \
    for (; i + U * W <= n; i += U * W) {                                               \
      unsigned any = 0;                                                                \
      EACH(in[u] = VF_LOAD(x + i + (size_t)u * W));                                    \
      vm_##name##_n(in, out, redo);                                                    \
      EACH(any |= redo[u]);                                                            \
      if (__builtin_expect(any != 0, 0))                                               \
        for (int u = 0; u < U; u++)                                                    \
          if (redo[u]) out[u] = vm_redo(in[u], out[u], redo[u], vm_scalar_##name);     \
      EACH(VF_STORE(y + i + (size_t)u * W, out[u]));                                   \
    }                                                                                  \
    if (i < n) {                                                                       \
      float buf[U * W] = {0};                                                          \
      size_t len = n - i;                                                              \
      for (size_t j = 0; j < len; j++) buf[j] = x[i + j];                              \
      EACH(in[u] = VF_LOAD(buf + (size_t)u * W));                                      \
      vm_##name##_n(in, out, redo);                                                    \
      for (int u = 0; u < U; u++) {                                                    \
        size_t lo = (size_t)u * W;                                                     \
        unsigned live = len <= lo ? 0u : len - lo >= W ? (1u << W) - 1u : (1u << (len - lo)) - 1u; \
        if (redo[u] & live) out[u] = vm_redo(in[u], out[u], redo[u] & live, vm_scalar_##name); \
        VF_STORE(buf + lo, out[u]);                                                    \
      }                                                                                \
      for (size_t j = 0; j < len; j++) y[i + j] = buf[j];                              \
    }                                                                                  \
  }
VM_LOOP(exp)
VM_LOOP(log)
VM_LOOP(sigmoid)
VM_LOOP(silu)
VM_LOOP(rsqrt)
VM_LOOP(sin)
VM_LOOP(cos)
#undef VM_LOOP
#undef EACH

#include "adamw_body.h"
#include "bf16_body.h"

const bx_math_kernels VM_TABLE = {VM_NAME,         vm_loop_exp,  vm_loop_log,
                                  vm_loop_sigmoid, vm_loop_silu, vm_loop_rsqrt,
                                  vm_loop_sin,     vm_loop_cos,  adamw_loop,
                                  bf16_round_loop};
