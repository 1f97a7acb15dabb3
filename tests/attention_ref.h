/*
 * attention_ref.h — the two references of test_attention.c and
 * test_attention_tiles.c (through attention_prob.h): (1) causal GQA
 * attention and its gradient in fp64, with a first-order rounding-error
 * bound of the documented fp32 order for every output element; (2) the documented fp32 order itself (bitexact_train.h,
 * "Layers: causal GQA attention"), written as whole score, probability and
 * gradient matrices per (sequence, head) and explicit chains — a different
 * loop structure from src/train/attention*.c, the same bits.
 */
#ifndef BX_TEST_ATTENTION_REF_H
#define BX_TEST_ATTENTION_REF_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"

typedef struct ashape {
  size_t B, L, Hq, Hkv, D;
} ashape;

/* element (t, h, d) of a [T, H*D] tensor */
#define AIX(t, h, d, H, D) (((t) * (H) + (h)) * (D) + (d))

/* ---- (1) fp64 reference ------------------------------------------------------

 * Bounds (u = 2^-24, g(n) = n u / (1 - n u)), first order with a margin
 * (factor 1.05) for the second-order terms and for the reference's own fp64
 * error (relative 2^-53 per operation, far below u):
 *  score:  |s^ - s| <= Es = scale (g(D) sum_d |q k|) + 2u |s|  (the chain,
 *          the fp32 scale's rounding, the product's rounding)
 *  p:      ln p^ - ln p <= 2 max_j Es + u (m - s_j + 2 Es) + u (ln(i+1) + 5)
 *          + (i+1) 2^-53: the scores' errors move ln p by at most twice the
 *          largest one (softmax is shift invariant); the rounded s - m is an
 *          error u|s - m| in the exponent of e_j and, averaged with weights p
 *          in l, at most u ln(i+1) (sum p x <= entropy); exp, the fp64 sum,
 *          its fp32 rounding and the division; plus 2^-148 absolute (p below
 *          the normal range).
 *  o:      sum_j |p^ - p||v_j| + g(i+1) sum_j |p^||v_j|.
 *  backward: each quantity's bound from its operands' (|a^b^ - ab| <= |a||b^
 *          - b| + |a^ - a||b^|, one u per rounding), chained through dp, delta,
 *          ds, gs into the dq, dk, dv chains (n terms: g(n)). */
typedef struct aref_out {
  double *o, *dq, *dk, *dv;     /* values */
  double *bo, *bdq, *bdk, *bdv; /* bounds (NULL: not computed) */
} aref_out;

static double aref_g(double n) {
  double u = 0x1p-24;
  return n * u / (1 - n * u);
}

static void aref_run(const ashape *s, const double *q, const double *k, const double *v,
                     const double *dout, aref_out *out) {
  size_t L = s->L, Hq = s->Hq, Hkv = s->Hkv, D = s->D, R = Hq / Hkv, T = s->B * L;
  const double u = 0x1p-24, sc = 1.0 / sqrt((double)D), tiny = 0x1p-148;
  int wb = out->bo != NULL;
  memset(out->dk, 0, T * Hkv * D * sizeof(double));
  memset(out->dv, 0, T * Hkv * D * sizeof(double));
  if (wb) {
    memset(out->bdk, 0, T * Hkv * D * sizeof(double));
    memset(out->bdv, 0, T * Hkv * D * sizeof(double));
  }
  double *S = malloc(L * sizeof(double) * 8), *P = S + L, *Pb = P + L, *DP = Pb + L,
         *DPb = DP + L, *G = DPb + L, *Gb = G + L, *Es = Gb + L;
  double *mk = calloc(2 * T * Hkv * D + 1, sizeof(double)), *mv = mk + T * Hkv * D;
  for (size_t b = 0; b < s->B; b++)
    for (size_t h = 0; h < Hq; h++) {
      size_t g = h / R;
      for (size_t i = 0; i < L; i++) {
        size_t ti = b * L + i;
        double m = -INFINITY, emax = 0;
        for (size_t j = 0; j <= i; j++) {
          size_t tj = b * L + j;
          double dot = 0, mag = 0;
          for (size_t d = 0; d < D; d++) {
            double t = q[AIX(ti, h, d, Hq, D)] * k[AIX(tj, g, d, Hkv, D)];
            dot += t;
            mag += fabs(t);
          }
          S[j] = dot * sc;
          Es[j] = sc * aref_g((double)D) * mag + 2 * u * fabs(S[j]) + D * 0x1p-149;
          if (S[j] > m) m = S[j];
          if (Es[j] > emax) emax = Es[j];
        }
        double z = 0;
        for (size_t j = 0; j <= i; j++) z += exp(S[j] - m);
        for (size_t j = 0; j <= i; j++) {
          P[j] = exp(S[j] - m) / z;
          double eps = 2 * emax + u * (m - S[j] + 2 * emax) + u * (log((double)i + 1) + 5) +
                       (double)(i + 1) * 0x1p-53;
          Pb[j] = 1.05 * (P[j] * expm1(eps) + tiny);
        }
        for (size_t d = 0; d < D; d++) {
          double acc = 0, e = 0, mag = 0;
          for (size_t j = 0; j <= i; j++) {
            double vv = v[AIX(b * L + j, g, d, Hkv, D)];
            acc += P[j] * vv;
            e += Pb[j] * fabs(vv);
            mag += (P[j] + Pb[j]) * fabs(vv);
          }
          out->o[AIX(ti, h, d, Hq, D)] = acc;
          if (wb) out->bo[AIX(ti, h, d, Hq, D)] = 1.05 * (e + aref_g((double)i + 1) * mag) + (i + 1) * 0x1p-149;
        }
        /* backward */
        double delta = 0, delb = 0, dmag = 0;
        for (size_t j = 0; j <= i; j++) {
          size_t tj = b * L + j;
          double dot = 0, mag = 0;
          for (size_t d = 0; d < D; d++) {
            double t = dout[AIX(ti, h, d, Hq, D)] * v[AIX(tj, g, d, Hkv, D)];
            dot += t;
            mag += fabs(t);
          }
          DP[j] = dot;
          DPb[j] = aref_g((double)D) * mag + D * 0x1p-149;
          delta += P[j] * DP[j];
          delb += Pb[j] * (fabs(DP[j]) + DPb[j]) + P[j] * DPb[j];
          dmag += (P[j] + Pb[j]) * (fabs(DP[j]) + DPb[j]);
        }
        delb += (double)(i + 1) * 0x1p-53 * dmag + u * (fabs(delta) + delb);
        for (size_t j = 0; j <= i; j++) {
          double x = DP[j] - delta, xb = DPb[j] + delb;
          xb += u * (fabs(x) + xb);
          double ds = P[j] * x, dsb = Pb[j] * (fabs(x) + xb) + P[j] * xb;
          dsb += u * (fabs(ds) + dsb);
          G[j] = ds * sc;
          Gb[j] = 1.05 * (sc * dsb + 2 * u * fabs(G[j])) + 0x1p-149;
        }
        for (size_t d = 0; d < D; d++) {
          double acc = 0, e = 0, mag = 0;
          for (size_t j = 0; j <= i; j++) {
            double kk = k[AIX(b * L + j, g, d, Hkv, D)];
            acc += G[j] * kk;
            e += Gb[j] * fabs(kk);
            mag += (fabs(G[j]) + Gb[j]) * fabs(kk);
          }
          out->dq[AIX(ti, h, d, Hq, D)] = acc;
          if (wb) out->bdq[AIX(ti, h, d, Hq, D)] = 1.05 * (e + aref_g((double)i + 1) * mag) + (i + 1) * 0x1p-149;
        }
        for (size_t j = 0; j <= i; j++) {
          size_t tj = b * L + j;
          for (size_t d = 0; d < D; d++) {
            size_t e = AIX(tj, g, d, Hkv, D);
            double qq = q[AIX(ti, h, d, Hq, D)], oo = dout[AIX(ti, h, d, Hq, D)];
            out->dk[e] += G[j] * qq;
            out->dv[e] += P[j] * oo;
            if (wb) {
              out->bdk[e] += Gb[j] * fabs(qq);
              out->bdv[e] += Pb[j] * fabs(oo);
              mk[e] += (fabs(G[j]) + Gb[j]) * fabs(qq);
              mv[e] += (P[j] + Pb[j]) * fabs(oo);
            }
          }
        }
      }
    }
  if (wb) /* the chains' own roundings: n = R (L - j) terms */
    for (size_t t = 0; t < T; t++) {
      double n = (double)(R * (L - t % L));
      for (size_t e = t * Hkv * D; e < (t + 1) * Hkv * D; e++) {
        out->bdk[e] = 1.05 * (out->bdk[e] + aref_g(n) * mk[e]) + n * 0x1p-149;
        out->bdv[e] = 1.05 * (out->bdv[e] + aref_g(n) * mv[e]) + n * 0x1p-149;
      }
    }
  free(S);
  free(mk);
}

/* ---- (2) the documented order, as whole matrices ---------------------------- */

/* fp32 nearest to D^-1/2 (1/sqrt in fp64 is within 2^-52 relative of the
 * exact value, and no fp32 midpoint is that close for small D: the test
 * also compares it with bx_rsqrt_f32) */
static float achain_scale(size_t D) { return (float)(1.0 / sqrt((double)D)); }

/* o [T, Hq*D], stats [T, Hq, 2] */
static void achain_forward(const ashape *s, const float *q, const float *k, const float *v,
                           float *o, float *stats) {
  size_t L = s->L, Hq = s->Hq, Hkv = s->Hkv, D = s->D, R = Hq / Hkv;
  float sc = achain_scale(D);
  float *S = malloc(L * L * sizeof(float) * 2 + 4), *P = S + L * L;
  for (size_t b = 0; b < s->B; b++)
    for (size_t h = 0; h < Hq; h++) {
      size_t g = h / R, t0 = b * L;
      for (size_t i = 0; i < L; i++)
        for (size_t j = 0; j <= i; j++) {
          float dot = 0.0f;
          for (size_t d = 0; d < D; d++)
            dot = fmaf(q[AIX(t0 + i, h, d, Hq, D)], k[AIX(t0 + j, g, d, Hkv, D)], dot);
          S[i * L + j] = dot * sc;
        }
      for (size_t i = 0; i < L; i++) {
        float m = S[i * L];
        for (size_t j = 1; j <= i; j++)
          if (S[i * L + j] > m) m = S[i * L + j];
        double z = 0.0;
        for (size_t j = 0; j <= i; j++) {
          P[i * L + j] = bx_exp_f32(S[i * L + j] - m);
          z += P[i * L + j];
        }
        float l = (float)z;
        for (size_t j = 0; j <= i; j++) P[i * L + j] /= l;
        stats[((t0 + i) * Hq + h) * 2] = m;
        stats[((t0 + i) * Hq + h) * 2 + 1] = l;
      }
      for (size_t i = 0; i < L; i++)
        for (size_t d = 0; d < D; d++) {
          float acc = 0.0f;
          for (size_t j = 0; j <= i; j++) acc = fmaf(P[i * L + j], v[AIX(t0 + j, g, d, Hkv, D)], acc);
          o[AIX(t0 + i, h, d, Hq, D)] = acc;
        }
    }
  free(S);
}

/* dq [T, Hq*D], dk, dv [T, Hkv*D] from the given stats */
static void achain_backward(const ashape *s, const float *dout, const float *q, const float *k,
                            const float *v, const float *stats, float *dq, float *dk, float *dv) {
  size_t L = s->L, Hq = s->Hq, Hkv = s->Hkv, D = s->D, R = Hq / Hkv;
  float sc = achain_scale(D);
  float *P = malloc(R * L * L * sizeof(float) * 2 + 4), *G = P + R * L * L;
  for (size_t b = 0; b < s->B; b++)
    for (size_t g = 0; g < Hkv; g++) {
      size_t t0 = b * L;
      for (size_t r = 0; r < R; r++) {
        size_t h = g * R + r;
        float *Pr = P + r * L * L, *Gr = G + r * L * L;
        for (size_t i = 0; i < L; i++) {
          float m = stats[((t0 + i) * Hq + h) * 2], l = stats[((t0 + i) * Hq + h) * 2 + 1];
          float dp[1024];
          double delta = 0.0;
          for (size_t j = 0; j <= i; j++) {
            float dot = 0.0f, dd = 0.0f;
            for (size_t d = 0; d < D; d++) {
              dot = fmaf(q[AIX(t0 + i, h, d, Hq, D)], k[AIX(t0 + j, g, d, Hkv, D)], dot);
              dd = fmaf(dout[AIX(t0 + i, h, d, Hq, D)], v[AIX(t0 + j, g, d, Hkv, D)], dd);
            }
            Pr[i * L + j] = bx_exp_f32(dot * sc - m) / l;
            dp[j] = dd;
            delta += (double)Pr[i * L + j] * (double)dd;
          }
          float de = (float)delta;
          for (size_t j = 0; j <= i; j++) {
            float x = dp[j] - de;
            float ds = Pr[i * L + j] * x;
            Gr[i * L + j] = ds * sc;
          }
        }
        for (size_t i = 0; i < L; i++)
          for (size_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (size_t j = 0; j <= i; j++) acc = fmaf(Gr[i * L + j], k[AIX(t0 + j, g, d, Hkv, D)], acc);
            dq[AIX(t0 + i, h, d, Hq, D)] = acc;
          }
      }
      for (size_t j = 0; j < L; j++)
        for (size_t d = 0; d < D; d++) {
          float ak = 0.0f, av = 0.0f;
          for (size_t r = 0; r < R; r++)
            for (size_t i = j; i < L; i++) {
              size_t h = g * R + r, e = r * L * L + i * L + j;
              ak = fmaf(G[e], q[AIX(t0 + i, h, d, Hq, D)], ak);
              av = fmaf(P[e], dout[AIX(t0 + i, h, d, Hq, D)], av);
            }
          dk[AIX(t0 + j, g, d, Hkv, D)] = ak;
          dv[AIX(t0 + j, g, d, Hkv, D)] = av;
        }
    }
  free(P);
}

#endif /* BX_TEST_ATTENTION_REF_H */
