/*
 * fixed_bits_nan.h — part of fixed_bits.c (included once, after
 * fixed_bits_layers.h, whose helpers it uses): NaN-producing data through
 * every kernel that computes. NaN operands of both signs with payloads,
 * quiet and signalling, and NaN-free data whose arithmetic makes NaNs
 * (Inf - Inf, 0 * Inf, overflow then Inf * 0): x86-64's default NaN is
 * negative, aarch64's positive, and which operand's payload survives
 * differs, so these lines are the same bytes on both only because every
 * NaN the library stores is the canonical one (docs/design.md, "NaN").
 * Data from integer bit fields only, as the rest of the file.
 */

/* NaNs of every kind: quiet and signalling, both signs, with payloads */
static const uint32_t FBN_NAN[8] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u,
                                    0x7fffffffu, 0xffffffffu, 0x7fa00000u, 0xffd0beefu};

/* about one element in 16 a NaN of FBN_NAN, one in 32 a +-Inf */
static void fbn_specials(float *x, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) {
    uint64_t h = fb_hash(seed ^ 0xa11a5ull, i);
    unsigned cls = (unsigned)(h & 31);
    uint32_t b;
    if (cls < 2) b = FBN_NAN[(h >> 8) & 7];
    else if (cls == 2) b = (uint32_t)((h >> 63) << 31) | 0x7f800000u;
    else continue;
    memcpy(&x[i], &b, 4);
  }
}

static void fbn_set(float *x, uint32_t bits) { memcpy(x, &bits, 4); }

/* number of NaN elements, to print beside the hashes (not compared alone) */
static size_t fbn_count(const float *x, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t b;
    memcpy(&b, &x[i], 4);
    k += (b & 0x7fffffffu) > 0x7f800000u;
  }
  return k;
}

static void fbn_out(const char *what, const char *part, const float *r1, const float *r3, size_t n) {
  char w[200];
  snprintf(w, sizeof w, "%s (%zu NaN)", what, fbn_count(r1, n));
  out2(w, part, r1, r3, n * 4);
}

/* ---- elementwise math, bf16 rounding, AdamW, scaling, norms ---------------- */

static void fbn_elementwise(void) {
  enum { N = 1024 };
  static float x[N], y[2][N], p[2][N], m[2][N], v[2][N], g[N], f[2][N];
  static uint16_t h[N], b[2][N], hf[2][N];
  static double d[2][N];
  int64_t sh[1] = {N};
  typedef bx_status (*fn_t)(const DLTensor *, DLTensor *, const bx_math_opts *);
  static const fn_t fns[] = {bx_exp, bx_log, bx_sigmoid, bx_silu, bx_rsqrt, bx_sin, bx_cos};
  static const char *const names[] = {"exp", "log", "sigmoid", "silu", "rsqrt", "sin", "cos"};
  for (int fi = 0; fi < 7; fi++) {
    fb_f32_grad(x, N, 0x9100 + (uint64_t)fi, -6, 12, 0); /* negative x: log, rsqrt invalid */
    fbn_specials(x, N, 0x9100 + (uint64_t)fi);
    DLTensor tx = bxt_f32_view(x, 1, sh);
    int ok = 1;
    for (int ti = 0; ti < 2 && ok; ti++) {
      bx_math_opts o = BX_MATH_OPTS_DEFAULT;
      o.num_threads = FB_LT[ti];
      DLTensor ty = bxt_f32_view(y[ti], 1, sh);
      ok = expect_ok(names[fi], fns[fi](&tx, &ty, &o));
    }
    char what[64];
    snprintf(what, sizeof what, "nan math %s", names[fi]);
    if (ok) fbn_out(what, "y", y[0], y[1], N);
  }
  fb_f32_grad(x, N, 0x9200, -6, 12, 0);
  fbn_specials(x, N, 0x9200);
  DLTensor tx = bxt_f32_view(x, 1, sh), th = bxt_view(h, kDLBfloat, 16, 1, sh);
  if (expect_ok("nan round_bf16", bx_round_bf16(&tx, &th, NULL))) out_hash("nan round_bf16", h, sizeof h);
  /* AdamW: NaN and Inf gradients and parameters, two steps */
  for (int ti = 0; ti < 2; ti++) {
    fb_f32_grad(p[ti], N, 0x9300, -6, 6, 0);
    fbn_specials(p[ti], N, 0x9300);
    fb_f32_grad(m[ti], N, 0x9301, -12, 4, 0);
    fbn_specials(m[ti], N, 0x9301);
    memset(v[ti], 0, sizeof v[ti]);
    DLTensor tp = bxt_f32_view(p[ti], 1, sh), tg = bxt_f32_view(g, 1, sh), tm = bxt_f32_view(m[ti], 1, sh),
             tv = bxt_f32_view(v[ti], 1, sh);
    bx_adamw_opts ao = BX_ADAMW_OPTS_DEFAULT;
    ao.num_threads = FB_LT[ti];
    for (int64_t step = 1; step <= 2; step++) {
      fb_f32_grad(g, N, 0x9310 + (uint64_t)step, -10, 8, 0);
      fbn_specials(g, N, 0x9310 + (uint64_t)step);
      if (!expect_ok("nan adamw", bx_adamw_step(&tp, &tg, &tm, &tv, step, &ao))) return;
    }
  }
  fbn_out("nan adamw 2 steps", "param", p[0], p[1], N);
  fbn_out("nan adamw 2 steps", "exp_avg", m[0], m[1], N);
  fbn_out("nan adamw 2 steps", "exp_avg_sq", v[0], v[1], N);
  /* scaling: NaN payloads times 0.75, and (no NaN) +-Inf times 0, in
   * fp32, fp64, bf16, fp16, both modes */
  for (int mode = 0; mode < 2; mode++)
    for (int kind = 0; kind < 2; kind++) {
      double coef = kind ? 0.0 : 0.75;
      for (int ti = 0; ti < 2; ti++) {
        fb_f32_grad(f[ti], N, 0x9400, -8, 16, 0);
        fbn_specials(f[ti], N, 0x9400);
        for (int i = 0; i < N; i++) {
          uint32_t u;
          memcpy(&u, &f[ti][i], 4);
          uint32_t a = u & 0x7fffffffu, s = u & 0x80000000u;
          if (kind && a > 0x7f800000u) u = s | 0x7f800000u, a = 0x7f800000u; /* NaN -> Inf */
          memcpy(&f[ti][i], &u, 4);
          b[ti][i] = (uint16_t)(u >> 16);
          hf[ti][i] = (uint16_t)((s >> 16) | (a > 0x7f800000u ? 0x7c01u | ((u >> 13) & 0x3ffu)
                                              : a == 0x7f800000u ? 0x7c00u : 0x3800u | ((u >> 13) & 0x3ffu)));
          uint64_t w = a > 0x7f800000u ? 0x7ff0000000000001ull | ((uint64_t)a << 20)
                       : a == 0x7f800000u ? 0x7ff0000000000000ull : 0x3ff0000000000000ull | ((uint64_t)u << 12);
          w |= (uint64_t)s << 32;
          memcpy(&d[ti][i], &w, 8);
        }
        DLTensor ts[4] = {bxt_f32_view(f[ti], 1, sh), bxt_view(d[ti], kDLFloat, 64, 1, sh),
                          bxt_view(b[ti], kDLBfloat, 16, 1, sh), bxt_view(hf[ti], kDLFloat, 16, 1, sh)};
        bx_scale_opts so = BX_SCALE_OPTS_DEFAULT;
        so.mode = mode ? BX_SCALE_EXACT : BX_SCALE_TORCH;
        so.num_threads = FB_LT[ti];
        if (!expect_ok("nan scale", bx_scale(ts, 4, coef, &so))) return;
      }
      char what[96];
      snprintf(what, sizeof what, "nan scale mode=%s coef=%a (%s)", mode ? "exact" : "torch", coef,
               kind ? "Inf * 0" : "NaN payloads");
      fbn_out(what, "fp32", f[0], f[1], N);
      out2(what, "fp64", d[0], d[1], sizeof d[0]);
      out2(what, "bf16", b[0], b[1], sizeof b[0]);
      out2(what, "fp16", hf[0], hf[1], sizeof hf[0]);
    }
  /* the clip: an Inf gradient (coefficient 0, then Inf * 0), a NaN one
   * (NaN norm and coefficient) */
  for (int kind = 0; kind < 2; kind++) {
    fb_f32_grad(f[0], N, 0x9500, -8, 8, 0);
    fbn_set(&f[0][17], kind ? 0xff812345u : 0xff800000u);
    fbn_set(&f[0][400], 0x7f800000u);
    DLTensor t = bxt_f32_view(f[0], 1, sh);
    bx_group gr = {&t, 1};
    double total = 0, coef = 0;
    const char *what = kind ? "nan clip_grad_norm (a NaN gradient)" : "nan clip_grad_norm (Inf gradients)";
    if (!expect_ok(what, bx_clip_grad_norm(&gr, 1, NULL, 1.0, NULL, &total, &coef))) continue;
    char line[128];
    snprintf(line, sizeof line, "%s total", what);
    out_d(line, total);
    snprintf(line, sizeof line, "%s coef", what);
    out_d(line, coef);
    snprintf(line, sizeof line, "%s grads (%zu NaN)", what, fbn_count(f[0], N));
    out_hash(line, f[0], N * 4);
  }
  /* the norm of NaN data into each format, and the accumulator's reads */
  fb_f32_grad(f[0], N, 0x9600, -8, 8, 0);
  fbn_specials(f[0], N, 0x9600);
  DLTensor t = bxt_f32_view(f[0], 1, sh);
  bx_group gr = {&t, 1};
  static const double ps[] = {2.0, 1.0, INFINITY, 3.0, -1.0};
  for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++)
    for (int nd = 0; nd < 5; nd++) {
      bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
      o.norm_type = ps[pi];
      o.norm_dtype = (bx_norm_dtype)nd;
      double total = 0;
      char what[96];
      snprintf(what, sizeof what, "nan norm p=%g norm_dtype=%s", ps[pi], NORM_DT_NAME[nd]);
      if (expect_ok(what, bx_total_norm(&gr, 1, NULL, &o, &total, NULL))) out_d(what, total);
    }
  bx_acc acc;
  bx_acc_init(&acc);
  if (expect_ok("nan acc", bx_acc_add_squares(&acc, &t))) out_acc("nan acc squares", &acc, 1);
}

/* ---- GEMM --------------------------------------------------------------------- */

static void fbn_gemm(void) {
  enum { M = 21, K = 300, N = 19 }; /* K > 256: the chains cross k blocks */
  static float a[M * K], bm[K * N], c[2][M * N];
  for (int kind = 0; kind < 2; kind++) {
    fb_f32_fill(a, M * K, 0x9700 + (uint64_t)kind, -4, 8);
    fb_f32_fill(bm, K * N, 0x9710 + (uint64_t)kind, -4, 8);
    if (kind == 0) {
      fbn_specials(a, M * K, 0x9700);
      fbn_specials(bm, K * N, 0x9710);
    } else { /* no NaN operand: Inf rows against huge columns of both signs */
      for (int i = 0; i < M; i += 3) {
        fbn_set(&a[i * K + i % K], (i & 2) ? 0xff800000u : 0x7f800000u);
        fbn_set(&a[i * K + (i + 1) % K], 0x7f800000u);
      }
      for (int j = 0; j < K * N; j += 7) fbn_set(&bm[j], (j & 8) ? 0x7f000000u : 0xff000000u); /* +-2^127 */
    }
    for (int layout = 0; layout < 3; layout++) {
      int64_t sa[2], sb[2], sc[2] = {M, N};
      bx_gemm_layout l = layout == 0 ? BX_GEMM_NT : layout == 1 ? BX_GEMM_NN : BX_GEMM_TN;
      if (layout == 2) sa[0] = K, sa[1] = M;
      else sa[0] = M, sa[1] = K;
      if (layout == 0) sb[0] = N, sb[1] = K;
      else sb[0] = K, sb[1] = N;
      DLTensor ta = bxt_f32_view(a, 2, sa), tb = bxt_f32_view(bm, 2, sb);
      char what[96];
      snprintf(what, sizeof what, "nan gemm %s [%d,%d]x%d (%s)", layout == 0 ? "NT" : layout == 1 ? "NN" : "TN", M, K,
               N, kind ? "Inf - Inf" : "NaN operands");
      int ok = 1;
      for (int ti = 0; ti < 2 && ok; ti++) {
        DLTensor tc = bxt_f32_view(c[ti], 2, sc);
        bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
        o.num_threads = FB_LT[ti];
        ok = expect_ok(what, bx_gemm(&ta, &tb, l, &tc, &o));
      }
      if (ok) fbn_out(what, "c", c[0], c[1], M * N);
    }
  }
}

/* ---- the layers ------------------------------------------------------------------ */

static void fbn_layers(void) {
  enum { NTOK = 200, H = 24, HD = 8, C = 64, NC = (NTOK + C - 1) / C };
  static float x[NTOK * H], w[H], dy[NTOK * H], y[2][NTOK * H], rs[2][NTOK], dx[2][NTOK * H], dwp[2][NC * H];
  static float g[NTOK * H], u[NTOK * H], hh[2][NTOK * H], dg[2][NTOK * H], du[2][NTOK * H], ry[2][NTOK * H], rdx[2][NTOK * H];
  static int64_t pos[NTOK];
  fb_f32_grad(x, NTOK * H, 0x9800, -4, 8, 0);
  fbn_specials(x, NTOK * H, 0x9800);
  for (int j = 0; j < H; j++) fbn_set(&x[5 * H + j], (j & 1) ? 0x7f000000u : 0xff000000u); /* +-2^127 */
  fbn_set(&x[5 * H + 3], 0xff800000u); /* a NaN-free row: Inf^2, rstd 0, Inf * 0 */
  fb_f32_grad(w, H, 0x9801, -2, 3, 0);
  fb_f32_grad(dy, NTOK * H, 0x9802, -10, 8, 0);
  fbn_specials(dy, NTOK * H, 0x9802);
  fb_f32_grad(g, NTOK * H, 0x9803, -4, 8, 0);
  fbn_specials(g, NTOK * H, 0x9803);
  fb_f32_grad(u, NTOK * H, 0x9804, -4, 8, 0);
  fbn_specials(u, NTOK * H, 0x9804);
  for (int t = 0; t < NTOK; t++) pos[t] = (int64_t)(fb_hash(0x9805, (uint64_t)t) % 4096);
  int64_t sx[2] = {NTOK, H}, sw[1] = {H}, sr[1] = {NTOK}, sp[2] = {NC, H}, spp[1] = {NTOK};
  DLTensor tx = bxt_f32_view(x, 2, sx), tw = bxt_f32_view(w, 1, sw), tdy = bxt_f32_view(dy, 2, sx),
           tg = bxt_f32_view(g, 2, sx), tu = bxt_f32_view(u, 2, sx), tp = fb_dl_int(pos, 64, 1, spp);
  int ok = 1;
  for (int ti = 0; ti < 2 && ok; ti++) {
    DLTensor ty = bxt_f32_view(y[ti], 2, sx), trs = bxt_f32_view(rs[ti], 1, sr), tdx = bxt_f32_view(dx[ti], 2, sx),
             tdwp = bxt_f32_view(dwp[ti], 2, sp), th = bxt_f32_view(hh[ti], 2, sx), tdg = bxt_f32_view(dg[ti], 2, sx),
             tdu = bxt_f32_view(du[ti], 2, sx), try_ = bxt_f32_view(ry[ti], 2, sx), trdx = bxt_f32_view(rdx[ti], 2, sx);
    bx_rmsnorm_opts ro = BX_RMSNORM_OPTS_DEFAULT;
    ro.num_threads = FB_LT[ti];
    bx_rope_opts po = BX_ROPE_OPTS_DEFAULT;
    po.num_threads = FB_LT[ti];
    bx_swiglu_opts so = BX_SWIGLU_OPTS_DEFAULT;
    so.num_threads = FB_LT[ti];
    ok = expect_ok("nan rmsnorm", bx_rmsnorm_forward(&tx, &tw, 1e-5, &ty, &trs, &ro)) &&
         expect_ok("nan rmsnorm", bx_rmsnorm_backward(&tx, &tw, &tdy, &trs, C, &tdx, &tdwp, &ro)) &&
         expect_ok("nan rope", bx_rope_forward(&tx, &tp, HD, HD, 10000.0, &try_, &po)) &&
         expect_ok("nan rope", bx_rope_backward(&tdy, &tp, HD, HD, 10000.0, &trdx, &po)) &&
         expect_ok("nan swiglu", bx_swiglu_forward(&tg, &tu, &th, &so)) &&
         expect_ok("nan swiglu", bx_swiglu_backward(&tg, &tu, &tdy, &tdg, &tdu, &so));
  }
  if (!ok) return;
  fbn_out("nan rmsnorm [200,24]", "y", y[0], y[1], NTOK * H);
  fbn_out("nan rmsnorm [200,24]", "rstd", rs[0], rs[1], NTOK);
  fbn_out("nan rmsnorm [200,24]", "dx", dx[0], dx[1], NTOK * H);
  fbn_out("nan rmsnorm [200,24]", "dweight_partials", dwp[0], dwp[1], NC * H);
  fbn_out("nan rope [200,3,8]", "forward", ry[0], ry[1], NTOK * H);
  fbn_out("nan rope [200,3,8]", "backward", rdx[0], rdx[1], NTOK * H);
  fbn_out("nan swiglu [200,24]", "h", hh[0], hh[1], NTOK * H);
  fbn_out("nan swiglu [200,24]", "dgate", dg[0], dg[1], NTOK * H);
  fbn_out("nan swiglu [200,24]", "dup", du[0], du[1], NTOK * H);
}

static void fbn_attention(void) {
  enum { B = 2, L = 21, HQ = 4, HKV = 2, D = 9, NQ = B * L };
  static float q[NQ * HQ * D], k[NQ * HKV * D], v[NQ * HKV * D], dout[NQ * HQ * D];
  static float o[2][NQ * HQ * D], st[2][NQ * HQ * 2], dq[2][NQ * HQ * D], dk[2][NQ * HKV * D], dv[2][NQ * HKV * D];
  for (int kind = 0; kind < 2; kind++) {
    fb_f32_fill(q, NQ * HQ * D, 0x9900, -4, 4);
    fb_f32_fill(k, NQ * HKV * D, 0x9901, -4, 4);
    fb_f32_fill(v, NQ * HKV * D, 0x9902, -4, 6);
    fb_f32_fill(dout, NQ * HQ * D, 0x9903, -10, 6);
    if (kind == 0) {
      fbn_set(&q[(3 * HQ + 1) * D + 2], 0xff812345u);
      fbn_set(&v[(20 * HKV + 1) * D + 5], 0x7f800001u);
      fbn_set(&dout[(30 * HQ + 2) * D + 7], 0xffc00000u);
    } else { /* NaN-free: scores of +-Inf (m = Inf: Inf - Inf) */
      fbn_set(&q[(L + 4) * HQ * D], 0x72000000u);      /* 2^101 */
      fbn_set(&k[(L + 2) * HKV * D], 0x72000000u);
      fbn_set(&q[(L + 9) * HQ * D + 1], 0xf2000000u);  /* -2^101 */
      fbn_set(&k[(L + 1) * HKV * D + 1], 0x72000000u);
    }
    int64_t sq[2] = {NQ, HQ * D}, sk[2] = {NQ, HKV * D}, ss[3] = {NQ, HQ, 2};
    DLTensor tq = bxt_f32_view(q, 2, sq), tk = bxt_f32_view(k, 2, sk), tv = bxt_f32_view(v, 2, sk),
             tdo = bxt_f32_view(dout, 2, sq);
    int ok = 1;
    for (int ti = 0; ti < 2 && ok; ti++) {
      DLTensor to = bxt_f32_view(o[ti], 2, sq), ts = bxt_f32_view(st[ti], 3, ss), tdq = bxt_f32_view(dq[ti], 2, sq),
               tdk = bxt_f32_view(dk[ti], 2, sk), tdv = bxt_f32_view(dv[ti], 2, sk);
      bx_attention_opts ao = BX_ATTENTION_OPTS_DEFAULT;
      ao.num_threads = FB_LT[ti];
      ok = expect_ok("nan attention", bx_attention_forward(&tq, &tk, &tv, L, HQ, HKV, D, &to, &ts, &ao)) &&
           expect_ok("nan attention", bx_attention_backward(&tdo, &tq, &tk, &tv, &ts, L, HQ, HKV, D, &tdq, &tdk, &tdv, &ao));
    }
    if (!ok) continue;
    const char *what = kind ? "nan attention B=2 L=21 Hq=4 Hkv=2 D=9 (Inf scores)" : "nan attention B=2 L=21 Hq=4 Hkv=2 D=9 (NaN inputs)";
    fbn_out(what, "o", o[0], o[1], NQ * HQ * D);
    fbn_out(what, "stats", st[0], st[1], NQ * HQ * 2);
    fbn_out(what, "dq", dq[0], dq[1], NQ * HQ * D);
    fbn_out(what, "dk", dk[0], dk[1], NQ * HKV * D);
    fbn_out(what, "dv", dv[0], dv[1], NQ * HKV * D);
  }
}

static void fbn_moe_embedding(void) {
  /* the router's backward with NaN/Inf dweights, on variant 0's choices */
  static float dw[MO_T * MO_K], dlog[2][MO_T * MO_E];
  fb_f32_grad(dw, MO_T * MO_K, 0x9a00, -10, 8, 0);
  fbn_specials(dw, MO_T * MO_K, 0x9a00);
  int64_t sl[2] = {MO_T, MO_E}, sk[2] = {MO_T, MO_K};
  DLTensor tl = bxt_f32_view(mo_logits, 2, sl), tid = fb_dl_int(mo_ids[0][0], 64, 2, sk), tdw = bxt_f32_view(dw, 2, sk);
  int ok = 1;
  for (int ti = 0; ti < 2 && ok; ti++) {
    bx_moe_router_opts o = BX_MOE_ROUTER_OPTS_DEFAULT;
    o.n_group = MO_V[0].n_group;
    o.topk_group = MO_V[0].topk_group;
    o.norm_topk_prob = MO_V[0].norm;
    o.routed_scaling_factor = MO_V[0].scale;
    o.num_threads = FB_LT[ti];
    DLTensor td = bxt_f32_view(dlog[ti], 2, sl);
    ok = expect_ok("nan router_backward", bx_moe_router_backward(&tl, &tid, &tdw, &td, &o));
  }
  if (ok) fbn_out("nan moe router_backward (NaN/Inf dweights)", "dlogits", dlog[0], dlog[1], MO_T * MO_E);
  /* permute_backward, unpermute (an Inf weight: Inf * 0), unpermute_backward */
  static float dxp[MO_R * MO_H], dx[2][MO_T * MO_H], yp[MO_R * MO_H], out[2][MO_T * MO_H], dout[MO_T * MO_H],
      dyp[2][MO_R * MO_H], dwt[2][MO_T * MO_K], wi[MO_T * MO_K];
  fb_f32_grad(dxp, MO_R * MO_H, 0x9a10, -12, 10, 0);
  fbn_specials(dxp, MO_R * MO_H, 0x9a10);
  fb_f32_grad(yp, MO_R * MO_H, 0x9a11, -8, 10, 0);
  fbn_specials(yp, MO_R * MO_H, 0x9a11);
  fb_f32_grad(dout, MO_T * MO_H, 0x9a12, -12, 10, 0);
  fbn_specials(dout, MO_T * MO_H, 0x9a12);
  memcpy(wi, mo_w[0][0], sizeof wi);
  fbn_set(&wi[5], 0x7f800000u);
  int64_t sx[2] = {MO_T, MO_H}, sp[2] = {MO_R, MO_H}, sm[2] = {MO_R, 2};
  DLTensor tm = fb_dl_int(mo_map[0][0], 64, 2, sm), tpos = fb_dl_int(mo_pos[0][0], 64, 2, sk),
           tw = bxt_f32_view(wi, 2, sk), tdxp = bxt_f32_view(dxp, 2, sp), typ = bxt_f32_view(yp, 2, sp),
           tdo = bxt_f32_view(dout, 2, sx);
  ok = 1;
  for (int ti = 0; ti < 2 && ok; ti++) {
    bx_moe_dispatch_opts o = BX_MOE_DISPATCH_OPTS_DEFAULT;
    o.num_threads = FB_LT[ti];
    DLTensor tdx = bxt_f32_view(dx[ti], 2, sx), to = bxt_f32_view(out[ti], 2, sx), tdyp = bxt_f32_view(dyp[ti], 2, sp),
             tdwt = bxt_f32_view(dwt[ti], 2, sk);
    ok = expect_ok("nan permute_backward", bx_moe_permute_backward(&tdxp, &tm, &tpos, &tdx, &o)) &&
         expect_ok("nan unpermute", bx_moe_unpermute(&typ, &tw, &tm, &tpos, NULL, &to, &o)) &&
         expect_ok("nan unpermute_backward", bx_moe_unpermute_backward(&tdo, &typ, &tw, &tm, &tpos, &tdyp, &tdwt, &o));
  }
  if (ok) {
    fbn_out("nan moe permute_backward", "dx", dx[0], dx[1], MO_T * MO_H);
    fbn_out("nan moe unpermute (Inf weight)", "out", out[0], out[1], MO_T * MO_H);
    fbn_out("nan moe unpermute_backward", "dy_perm", dyp[0], dyp[1], MO_R * MO_H);
    fbn_out("nan moe unpermute_backward", "dweights", dwt[0], dwt[1], MO_T * MO_K);
  }
  /* the embedding's backward: NaN rows of dy, Inf + -Inf of one id */
  enum { V = 17, H = 9, NTOK = 200, C = 32, NC = (NTOK + C - 1) / C };
  static float edy[NTOK * H], rows[2][NTOK * H];
  static int64_t ids[NTOK], rid[2][NTOK], off[2][NC + 1];
  for (int t = 0; t < NTOK; t++) ids[t] = (int64_t)(fb_hash(0x9a20, (uint64_t)t) % V);
  ids[1] = ids[0];
  fb_f32_grad(edy, NTOK * H, 0x9a21, -8, 8, 0);
  fbn_specials(edy, NTOK * H, 0x9a21);
  fbn_set(&edy[0], 0x7f800000u);
  fbn_set(&edy[H], 0xff800000u);
  int64_t st[1] = {NTOK}, sy[2] = {NTOK, H}, so[1] = {NC + 1};
  DLTensor tids = fb_dl_int(ids, 64, 1, st), tedy = bxt_f32_view(edy, 2, sy);
  ok = 1;
  for (int ti = 0; ti < 2 && ok; ti++) {
    bx_embedding_opts o = BX_EMBEDDING_OPTS_DEFAULT;
    o.num_threads = FB_LT[ti];
    fb_pattern(rows[ti], sizeof rows[ti]);
    DLTensor tr = bxt_f32_view(rows[ti], 2, sy), trid = fb_dl_int(rid[ti], 64, 1, st), to = fb_dl_int(off[ti], 64, 1, so);
    ok = expect_ok("nan embedding_backward", bx_embedding_backward(&tids, &tedy, V, C, &trid, &tr, &to, &o));
  }
  if (ok) fbn_out("nan embedding_backward V=17 H=9 NTOK=200 C=32", "rows", rows[0], rows[1], NTOK * H);
}

static void fb_nan(void) {
  fbn_elementwise();
  fbn_gemm();
  fbn_layers();
  fbn_attention();
  fbn_moe_embedding();
}
