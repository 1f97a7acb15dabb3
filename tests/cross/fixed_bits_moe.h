/*
 * fixed_bits_moe.h — part of fixed_bits.c (included once, after its
 * generator and output helpers: each .c file of tests/cross is a program
 * of its own): the helpers of the layer kernels' lines, and the MoE router and
 * token dispatch of bitexact_train.h ("MoE router and token dispatch").
 * Every call runs at 1 and 3 threads (where it has a thread count); the
 * line is the 1-thread result's hash, and the 3-thread bytes must be the
 * same (else a MISMATCH line and a non-zero exit).
 */

static const int FB_LT[2] = {1, 3}; /* the layer kernels' thread counts */

/* fp32 gradient-like values (fb_f32_fill: both signs, binades
 * lo_exp .. lo_exp + nbinades - 1) and, per 64 elements on average, one
 * +0, one -0, one subnormal and (big_exp != 0) one value in the binade
 * 2^big_exp: integer bit fields only. */
static void fb_f32_grad(float *x, size_t n, uint64_t seed, int lo_exp, int nbinades, int big_exp) {
  fb_f32_fill(x, n, seed, lo_exp, nbinades);
  for (size_t i = 0; i < n; i++) {
    uint64_t h = fb_hash(seed ^ 0x5eed5eed5eedull, i);
    unsigned cls = (unsigned)(h & 63);
    uint32_t sign = (uint32_t)(h >> 63) << 31, frac = (uint32_t)((h >> 8) & 0x7fffffu), bits;
    if (cls == 0)
      bits = 0; /* +0 */
    else if (cls == 1)
      bits = 0x80000000u; /* -0 */
    else if (cls == 2)
      bits = sign | frac | 1u; /* subnormal */
    else if (cls == 3 && big_exp)
      bits = sign | ((uint32_t)(127 + big_exp) << 23) | frac;
    else
      continue;
    memcpy(&x[i], &bits, 4);
  }
}

static DLTensor fb_dl_int(void *data, int bits, int ndim, int64_t *shape) {
  return bxt_view(data, kDLInt, bits, ndim, shape);
}

/* outputs start as 0xA5 bytes: a part a call leaves alone is the same
 * bytes everywhere */
static void fb_pattern(void *p, size_t bytes) { memset(p, 0xA5, bytes); }

/* the line of one output: the 1-thread result's hash; the 3-thread
 * result must be the same bytes */
static void out2(const char *what, const char *part, const void *r1, const void *r3, size_t bytes) {
  char line[200];
  snprintf(line, sizeof line, "%s %s", what, part);
  out_hash(line, r1, bytes);
  if (memcmp(r1, r3, bytes) != 0) {
    printf("MISMATCH %s: %d threads differ from %d\n", line, FB_LT[1], FB_LT[0]);
    g_errors++;
  }
}

/* two results that the documentation says are the same bits (in place
 * and not, fused and not) */
static void fb_same_bits(const char *what, const void *a, const void *b, size_t bytes) {
  int same = memcmp(a, b, bytes) == 0;
  printf("%s: %s\n", what, same ? "same bits" : "DIFFERENT bits");
  if (!same) g_errors++;
}

/* ---- MoE router and token dispatch ------------------------------------- */

/* 150 tokens: 3 router pieces, 10 dispatch pieces; rows 0..4 are the ties */
enum { MO_T = 150, MO_E = 8, MO_K = 2, MO_H = 13, MO_R = MO_T * MO_K, MO_C = 4, MO_NC = (MO_T + 3) / 4, MO_NV = 3 };
/* plan 1's global token ids 40 + t (+3 from t = 6) lie in chunks 10 .. 10 + MO_NB - 1 */
enum { MO_G0 = 10, MO_NB = (40 + MO_T + 3 + MO_C - 1) / MO_C - MO_G0 + 1 };

static float mo_logits[MO_T * MO_E], mo_bias[MO_E];
static int64_t mo_ids[MO_NV][2][MO_T * MO_K]; /* int32 variants use the first half */
static float mo_w[MO_NV][2][MO_T * MO_K];
static int64_t mo_cnt[MO_NV][2][MO_NC * MO_E];

/* k = 2 of 8 experts: in 4 groups of 2 (2 groups kept, normalised, scaled),
 * in 1 group (not normalised, int32 ids), in 2 groups of 4 (1 kept) */
static const struct {
  int64_t n_group, topk_group;
  int norm;
  double scale;
  int bits;
} MO_V[MO_NV] = {{4, 2, 1, 2.5, 64}, {1, 1, 0, 1.0, 32}, {2, 1, 1, 1.0, 64}};

static void fb_moe_router(void) {
  fb_f32_grad(mo_logits, MO_T * MO_E, 0x7a01, -6, 9, 0);
  fb_f32_fill(mo_bias, MO_E, 0x7a02, -12, 4);
  /* ties: token 0 all equal; token 1 two equal pairs; token 2 saturated
   * (sigmoid 1.0) and +Inf; token 3 +-0 (sigmoid 0.5) and -Inf; token 4
   * subnormals (sigmoid 0.5); equal biases make equal choice scores and
   * equal group scores */
  for (int e = 0; e < MO_E; e++) {
    uint32_t sub = ((uint32_t)e << 31) | (0x1234u + (uint32_t)e);
    mo_logits[0 * MO_E + e] = 0.75f;
    mo_logits[2 * MO_E + e] = (float)(20 + 3 * e);
    memcpy(&mo_logits[4 * MO_E + e], &sub, 4);
  }
  mo_logits[1 * MO_E + 5] = mo_logits[1 * MO_E + 2];
  mo_logits[1 * MO_E + 7] = mo_logits[1 * MO_E + 0];
  mo_logits[2 * MO_E + 3] = INFINITY;
  mo_logits[3 * MO_E + 1] = -0.0f;
  mo_logits[3 * MO_E + 4] = 0.0f;
  mo_logits[3 * MO_E + 2] = -INFINITY;
  mo_logits[3 * MO_E + 6] = -INFINITY;
  mo_bias[2] = mo_bias[0];
  for (int e = 4; e < MO_E; e++) mo_bias[e] = 0.0f;
  static float dw[MO_T * MO_K], dlog[2][MO_T * MO_E];
  fb_f32_grad(dw, MO_T * MO_K, 0x7a03, -10, 8, 0);
  int64_t sl[2] = {MO_T, MO_E}, sb[1] = {MO_E}, sk[2] = {MO_T, MO_K}, sc[2] = {MO_NC, MO_E};
  for (int v = 0; v < MO_NV; v++) {
    bx_moe_router_opts o = BX_MOE_ROUTER_OPTS_DEFAULT;
    o.n_group = MO_V[v].n_group;
    o.topk_group = MO_V[v].topk_group;
    o.norm_topk_prob = MO_V[v].norm;
    o.routed_scaling_factor = MO_V[v].scale;
    char what[160];
    snprintf(what, sizeof what, "moe router_forward T=%d E=%d k=%d groups=%d/%d norm=%d scale=%g int%d", MO_T,
             MO_E, MO_K, (int)o.topk_group, (int)o.n_group, o.norm_topk_prob, o.routed_scaling_factor,
             MO_V[v].bits);
    DLTensor tl = bxt_f32_view(mo_logits, 2, sl), tb = bxt_f32_view(mo_bias, 1, sb);
    int ok = 1;
    for (int ti = 0; ti < 2 && ok; ti++) {
      fb_pattern(mo_ids[v][ti], sizeof mo_ids[v][ti]);
      fb_pattern(mo_w[v][ti], sizeof mo_w[v][ti]);
      fb_pattern(mo_cnt[v][ti], sizeof mo_cnt[v][ti]);
      DLTensor tid = fb_dl_int(mo_ids[v][ti], MO_V[v].bits, 2, sk), tw = bxt_f32_view(mo_w[v][ti], 2, sk),
               tc = fb_dl_int(mo_cnt[v][ti], 64, 2, sc);
      o.num_threads = FB_LT[ti];
      ok = expect_ok(what, bx_moe_router_forward(&tl, &tb, &tid, &tw, MO_C, &tc, &o));
    }
    if (!ok) continue;
    out2(what, "topk_ids", mo_ids[v][0], mo_ids[v][1], (size_t)MO_T * MO_K * (size_t)(MO_V[v].bits / 8));
    out2(what, "topk_weights", mo_w[v][0], mo_w[v][1], sizeof mo_w[v][0]);
    out2(what, "counts", mo_cnt[v][0], mo_cnt[v][1], sizeof mo_cnt[v][0]);
    snprintf(what, sizeof what, "moe router_backward variant %d", v);
    DLTensor tid = fb_dl_int(mo_ids[v][0], MO_V[v].bits, 2, sk), tdw = bxt_f32_view(dw, 2, sk);
    for (int ti = 0; ti < 2 && ok; ti++) {
      fb_pattern(dlog[ti], sizeof dlog[ti]);
      DLTensor td = bxt_f32_view(dlog[ti], 2, sl);
      o.num_threads = FB_LT[ti];
      ok = expect_ok(what, bx_moe_router_backward(&tl, &tid, &tdw, &td, &o));
    }
    if (ok) out2(what, "dlogits", dlog[0], dlog[1], sizeof dlog[0]);
  }
  /* the bias update: the chunk counts [38, 8] of variant 0, then one row */
  static float b[MO_E];
  memcpy(b, mo_bias, sizeof b);
  DLTensor tb = bxt_f32_view(b, 1, sb), tc2 = fb_dl_int(mo_cnt[0][0], 64, 2, sc), tc1 = fb_dl_int(mo_cnt[1][0], 64, 1, sb);
  if (expect_ok("moe bias_update", bx_moe_bias_update(&tb, &tc2, 1e-3)) &&
      expect_ok("moe bias_update", bx_moe_bias_update(&tb, &tc1, 0x1.8p-3)))
    out_hash("moe bias_update [38,8] counts rate 1e-3, then [8] rate 0.1875", b, sizeof b);
}

/* plans 0 (variant 0's int64 ids, token_ids NULL) and 1 (variant 1's
 * int32 ids, global token ids 40.. with a gap) */
static int64_t mo_off[2][2][MO_E + 1], mo_map[2][2][MO_R * 2], mo_pos[2][2][MO_T * MO_K], mo_gid[MO_T];

static void fb_moe_dispatch(void) {
  int64_t sk[2] = {MO_T, MO_K}, st[1] = {MO_T}, so[1] = {MO_E + 1}, sm[2] = {MO_R, 2}, sr[1] = {MO_R};
  for (int t = 0; t < MO_T; t++) mo_gid[t] = 40 + t + (t >= 6 ? 3 : 0);
  for (int p = 0; p < 2; p++) {
    char what[96];
    snprintf(what, sizeof what, "moe dispatch_plan %s", p ? "int32 ids, global token ids" : "int64 ids");
    DLTensor tid = fb_dl_int(mo_ids[p][0], MO_V[p].bits, 2, sk), tg = fb_dl_int(mo_gid, 64, 1, st);
    int ok = 1;
    for (int ti = 0; ti < 2 && ok; ti++) {
      fb_pattern(mo_off[p][ti], sizeof mo_off[p][ti]);
      fb_pattern(mo_map[p][ti], sizeof mo_map[p][ti]);
      fb_pattern(mo_pos[p][ti], sizeof mo_pos[p][ti]);
      DLTensor to = fb_dl_int(mo_off[p][ti], 64, 1, so), tm = fb_dl_int(mo_map[p][ti], 64, 2, sm),
               tp = fb_dl_int(mo_pos[p][ti], 64, 2, sk);
      bx_moe_dispatch_opts o = BX_MOE_DISPATCH_OPTS_DEFAULT;
      o.num_threads = FB_LT[ti];
      ok = expect_ok(what, bx_moe_dispatch_plan(&tid, p ? &tg : NULL, &to, &tm, &tp, &o));
    }
    if (!ok) return;
    out2(what, "offsets", mo_off[p][0], mo_off[p][1], sizeof mo_off[p][0]);
    out2(what, "row_map", mo_map[p][0], mo_map[p][1], sizeof mo_map[p][0]);
    out2(what, "pos", mo_pos[p][0], mo_pos[p][1], sizeof mo_pos[p][0]);
  }
  /* the order of plan 1's rows as gathered from ranks: shuffled */
  static int32_t ex[MO_R];
  static int64_t tok[MO_R], off[MO_E + 1], order[MO_R];
  const int32_t *ids1 = (const int32_t *)mo_ids[1][0];
  for (int r = 0; r < MO_R; r++) {
    int64_t t = mo_map[1][0][2 * r], j = mo_map[1][0][2 * r + 1];
    ex[r] = ids1[t * MO_K + j];
    tok[r] = mo_gid[t];
  }
  for (int i = MO_R - 1; i > 0; i--) { /* Fisher-Yates on the generator */
    int k = (int)(fb_hash(0x7a20, (uint64_t)i) % (uint64_t)(i + 1));
    int32_t e = ex[i];
    int64_t g = tok[i];
    ex[i] = ex[k], tok[i] = tok[k];
    ex[k] = e, tok[k] = g;
  }
  DLTensor te = fb_dl_int(ex, 32, 1, sr), tt = fb_dl_int(tok, 64, 1, sr), to = fb_dl_int(off, 64, 1, so),
           tr = fb_dl_int(order, 64, 1, sr);
  if (expect_ok("moe dispatch_order", bx_moe_dispatch_order(&te, &tt, &to, &tr))) {
    out_hash("moe dispatch_order 300 shuffled rows offsets", off, sizeof off);
    out_hash("moe dispatch_order 300 shuffled rows order", order, sizeof order);
  }
  /* each expert's global chunks of 4 tokens in plan 1 */
  static int64_t bounds[MO_E][MO_NB + 1], rows[MO_R];
  int ok = 1;
  for (int e = 0; e < MO_E && ok; e++) {
    int64_t b0 = mo_off[1][0][e], n = mo_off[1][0][e + 1] - b0;
    for (int64_t i = 0; i < n; i++) rows[i] = mo_gid[mo_map[1][0][2 * (b0 + i)]];
    int64_t sn[1] = {n}, s5[1] = {MO_NB + 1};
    DLTensor tn = fb_dl_int(rows, 64, 1, sn), tb = fb_dl_int(bounds[e], 64, 1, s5);
    ok = expect_ok("moe expert_chunks", bx_moe_expert_chunks(&tn, MO_C, MO_G0, &tb));
  }
  if (ok) out_hash("moe expert_chunks C=4 from chunk 10, 8 experts", bounds, sizeof bounds);
}

static void fb_moe_permute(void) {
  static float x[MO_T * MO_H], xp[2][MO_R * MO_H], dxp[MO_R * MO_H], dx[2][MO_T * MO_H];
  static float yp[MO_R * MO_H], init[MO_T * MO_H], out[2][2][MO_T * MO_H], dout[MO_T * MO_H];
  static float dyp[2][MO_R * MO_H], dwt[2][MO_T * MO_K];
  fb_f32_grad(x, MO_T * MO_H, 0x7a30, -8, 12, 60);
  /* the gather copies bits: a signalling NaN, a NaN with a payload, -Inf
   * must arrive unchanged (no arithmetic on them, so no platform's NaN rules) */
  static const uint32_t odd[3] = {0x7f812345u, 0xffd0beefu, 0xff800000u};
  for (int i = 0; i < 3; i++) memcpy(&x[5 * MO_H + 2 + 3 * i], &odd[i], 4);
  fb_f32_grad(dxp, MO_R * MO_H, 0x7a31, -12, 10, 0);
  fb_f32_grad(yp, MO_R * MO_H, 0x7a32, -8, 10, 0);
  fb_f32_grad(init, MO_T * MO_H, 0x7a33, -8, 10, 0);
  fb_f32_grad(dout, MO_T * MO_H, 0x7a34, -12, 10, 0);
  int64_t sx[2] = {MO_T, MO_H}, sp[2] = {MO_R, MO_H}, sm[2] = {MO_R, 2}, sk[2] = {MO_T, MO_K};
  DLTensor tm = fb_dl_int(mo_map[0][0], 64, 2, sm), tpos = fb_dl_int(mo_pos[0][0], 64, 2, sk),
           tw = bxt_f32_view(mo_w[0][0], 2, sk), tx = bxt_f32_view(x, 2, sx), tdxp = bxt_f32_view(dxp, 2, sp),
           typ = bxt_f32_view(yp, 2, sp), tin = bxt_f32_view(init, 2, sx), tdo = bxt_f32_view(dout, 2, sx);
  const char *w1 = "moe permute x[150,13] plan 0", *w2 = "moe permute_backward", *w4 = "moe unpermute_backward";
  int ok1 = 1, ok2 = 1, ok3 = 1, ok4 = 1;
  for (int ti = 0; ti < 2; ti++) {
    bx_moe_dispatch_opts o = BX_MOE_DISPATCH_OPTS_DEFAULT;
    o.num_threads = FB_LT[ti];
    fb_pattern(xp[ti], sizeof xp[ti]);
    fb_pattern(dx[ti], sizeof dx[ti]);
    fb_pattern(out[ti], sizeof out[ti]);
    fb_pattern(dyp[ti], sizeof dyp[ti]);
    fb_pattern(dwt[ti], sizeof dwt[ti]);
    DLTensor txp = bxt_f32_view(xp[ti], 2, sp), tdx = bxt_f32_view(dx[ti], 2, sx), to0 = bxt_f32_view(out[ti][0], 2, sx),
             to1 = bxt_f32_view(out[ti][1], 2, sx), tdyp = bxt_f32_view(dyp[ti], 2, sp),
             tdw = bxt_f32_view(dwt[ti], 2, sk);
    ok1 = ok1 && expect_ok(w1, bx_moe_permute(&tx, &tm, &txp, &o));
    ok2 = ok2 && expect_ok(w2, bx_moe_permute_backward(&tdxp, &tm, &tpos, &tdx, &o));
    ok3 = ok3 && expect_ok("moe unpermute", bx_moe_unpermute(&typ, &tw, &tm, &tpos, NULL, &to0, &o)) &&
          expect_ok("moe unpermute initial", bx_moe_unpermute(&typ, &tw, &tm, &tpos, &tin, &to1, &o));
    ok4 = ok4 && expect_ok(w4, bx_moe_unpermute_backward(&tdo, &typ, &tw, &tm, &tpos, &tdyp, &tdw, &o));
  }
  if (ok1) out2(w1, "x_perm", xp[0], xp[1], sizeof xp[0]);
  if (ok2) out2(w2, "dx", dx[0], dx[1], sizeof dx[0]);
  if (ok3) {
    out2("moe unpermute", "out", out[0][0], out[1][0], sizeof out[0][0]);
    out2("moe unpermute initial", "out", out[0][1], out[1][1], sizeof out[0][1]);
  }
  if (ok4) {
    out2(w4, "dy_perm", dyp[0], dyp[1], sizeof dyp[0]);
    out2(w4, "dweights", dwt[0], dwt[1], sizeof dwt[0]);
  }
  /* only one of the two gradients: the same bits */
  static float dwt_only[MO_T * MO_K];
  DLTensor tdw = bxt_f32_view(dwt_only, 2, sk);
  if (ok4 && expect_ok(w4, bx_moe_unpermute_backward(&tdo, &typ, &tw, &tm, &tpos, NULL, &tdw, NULL)))
    fb_same_bits("moe unpermute_backward dweights alone vs with dy_perm", dwt_only, dwt[0], sizeof dwt_only);
}

static void fb_moe(void) {
  fb_moe_router();
  fb_moe_dispatch();
  fb_moe_permute();
}
