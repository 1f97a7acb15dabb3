/*
 * fixed_bits_layers.h — part of fixed_bits.c (included once, after
 * fixed_bits_moe.h, whose helpers it uses): the layer kernels of
 * bitexact_train.h ("Layers: RMSNorm, RoPE, SwiGLU", "Layers: causal GQA
 * attention", "Layers: embedding, cross-entropy"), each at 1 and 3
 * threads, plus the results the documentation says are equal (in place
 * and not, fused and not).
 */

/* ---- RMSNorm -------------------------------------------------------------- */

static void fb_rmsnorm(void) {
  /* 3 pieces of 442 rows of 37; the QK-norm 2 pieces of 1024 rows of 16 */
  enum { NTOK = 1000, H = 37, C = 97, NC = (NTOK + C - 1) / C, QT = 400, QH = 3, QD = 16, QR = QT * QH, QC = 100 };
  static float x[NTOK * H], w[H], dy[NTOK * H], y[2][NTOK * H], rs[2][NTOK], dx[2][NTOK * H], dwp[2][NC * H], dw1[2][H];
  static float xi[NTOK * H], xq[QR * QD], wq[QD], dyq[QR * QD], yq[2][QR * QD], rsq[2][QR], dxq[2][QR * QD],
      dwq[2][(QR / QC) * QD];
  fb_f32_grad(x, NTOK * H, 0x7b01, -8, 12, 50); /* 2^50: squares near 2^100, still finite sums */
  for (int j = 0; j < H; j++) x[3 * H + j] = j % 3 ? (j % 2 ? -0.0f : 0x1p-140f) : 0.0f; /* a row of zeros, subnormals */
  fb_f32_grad(w, H, 0x7b02, -2, 3, 0);
  fb_f32_grad(dy, NTOK * H, 0x7b03, -14, 12, 0);
  fb_f32_grad(xq, QR * QD, 0x7b04, -6, 10, 20);
  fb_f32_grad(wq, QD, 0x7b05, -2, 3, 0);
  fb_f32_grad(dyq, QR * QD, 0x7b06, -14, 12, 0);
  int64_t sx[2] = {NTOK, H}, sw[1] = {H}, sr[1] = {NTOK}, sp3[2] = {NC, H}, sp1[2] = {1, H};
  int64_t sq[3] = {QT, QH, QD}, swq[1] = {QD}, srq[1] = {QR}, spq[2] = {QR / QC, QD};
  DLTensor tx = bxt_f32_view(x, 2, sx), tw = bxt_f32_view(w, 1, sw), tdy = bxt_f32_view(dy, 2, sx);
  DLTensor txq = bxt_f32_view(xq, 3, sq), twq = bxt_f32_view(wq, 1, swq), tdyq = bxt_f32_view(dyq, 3, sq);
  const char *f1 = "rmsnorm_forward x[1000,37] eps=1e-5", *b1 = "rmsnorm_backward x[1000,37]",
             *f2 = "rmsnorm_forward qk-norm x[400,3,16] eps=1e-6", *b2 = "rmsnorm_backward qk-norm x[400,3,16] C=100";
  int ok = 1;
  for (int ti = 0; ti < 2 && ok; ti++) {
    bx_rmsnorm_opts o = BX_RMSNORM_OPTS_DEFAULT;
    o.num_threads = FB_LT[ti];
    fb_pattern(dx[ti], sizeof dx[ti]);
    fb_pattern(dwp[ti], sizeof dwp[ti]);
    fb_pattern(dw1[ti], sizeof dw1[ti]);
    fb_pattern(dxq[ti], sizeof dxq[ti]);
    DLTensor ty = bxt_f32_view(y[ti], 2, sx), trs = bxt_f32_view(rs[ti], 1, sr), tdx = bxt_f32_view(dx[ti], 2, sx),
             tdwp = bxt_f32_view(dwp[ti], 2, sp3), tdw1 = bxt_f32_view(dw1[ti], 2, sp1);
    DLTensor tyq = bxt_f32_view(yq[ti], 3, sq), trsq = bxt_f32_view(rsq[ti], 1, srq),
             tdxq = bxt_f32_view(dxq[ti], 3, sq), tdwq = bxt_f32_view(dwq[ti], 2, spq);
    ok = expect_ok(f1, bx_rmsnorm_forward(&tx, &tw, 1e-5, &ty, &trs, &o)) &&
         expect_ok(b1, bx_rmsnorm_backward(&tx, &tw, &tdy, &trs, C, &tdx, &tdwp, &o)) &&
         expect_ok(b1, bx_rmsnorm_backward(&tx, &tw, &tdy, &trs, NTOK, &tdx, &tdw1, &o)) &&
         expect_ok(f2, bx_rmsnorm_forward(&txq, &twq, 1e-6, &tyq, &trsq, &o)) &&
         expect_ok(b2, bx_rmsnorm_backward(&txq, &twq, &tdyq, &trsq, QC, &tdxq, &tdwq, &o));
  }
  if (!ok) return;
  out2(f1, "y", y[0], y[1], sizeof y[0]);
  out2(f1, "rstd", rs[0], rs[1], sizeof rs[0]);
  out2(b1, "dx", dx[0], dx[1], sizeof dx[0]);
  out2(b1, "dweight_partials C=97", dwp[0], dwp[1], sizeof dwp[0]);
  out2(b1, "dweight_partials C=T", dw1[0], dw1[1], sizeof dw1[0]);
  out2(f2, "y", yq[0], yq[1], sizeof yq[0]);
  out2(f2, "rstd", rsq[0], rsq[1], sizeof rsq[0]);
  out2(b2, "dx", dxq[0], dxq[1], sizeof dxq[0]);
  out2(b2, "dweight_partials", dwq[0], dwq[1], sizeof dwq[0]);
  /* in place: y = x, rstd not saved; dx = dy */
  memcpy(xi, x, sizeof xi);
  DLTensor txi = bxt_f32_view(xi, 2, sx), trs = bxt_f32_view(rs[0], 1, sr);
  if (expect_ok("rmsnorm_forward in place", bx_rmsnorm_forward(&txi, &tw, 1e-5, &txi, NULL, NULL)))
    fb_same_bits("rmsnorm_forward in place vs not", xi, y[0], sizeof xi);
  memcpy(xi, dy, sizeof xi);
  if (expect_ok("rmsnorm_backward in place", bx_rmsnorm_backward(&tx, &tw, &txi, &trs, C, &txi, NULL, NULL)))
    fb_same_bits("rmsnorm_backward in place vs not", xi, dx[0], sizeof xi);
}

/* ---- RoPE ----------------------------------------------------------------- */

static void fb_rope(void) {
  /* 3 pieces of 273 rows of 60, 2 of 512 rows of 32 */
  enum { NTOK = 700, NH = 3, HD = 20, RD = 10, H2 = 2, HD2 = 16 };
  static int64_t pos[NTOK];
  for (int t = 0; t < NTOK; t++) pos[t] = (int64_t)(fb_hash(0x7c00, (uint64_t)t) % 40000);
  pos[0] = 0, pos[1] = 1, pos[2] = 2, pos[3] = 65535, pos[NTOK - 1] = 16777216;
  static float x1[NTOK * NH * HD], dy1[NTOK * NH * HD], y1[2][NTOK * NH * HD], dx1[2][NTOK * NH * HD];
  static float x2[NTOK * H2 * HD2], dy2[NTOK * H2 * HD2], y2[2][NTOK * H2 * HD2], dx2[2][NTOK * H2 * HD2];
  static float c1[2][NTOK * RD / 2], s1[2][NTOK * RD / 2], c2[2][NTOK * HD2 / 2], s2[2][NTOK * HD2 / 2];
  fb_f32_grad(x1, sizeof x1 / 4, 0x7c01, -6, 10, 40);
  fb_f32_grad(dy1, sizeof dy1 / 4, 0x7c02, -14, 10, 0);
  fb_f32_grad(x2, sizeof x2 / 4, 0x7c03, -6, 10, 40);
  fb_f32_grad(dy2, sizeof dy2 / 4, 0x7c04, -14, 10, 0);
  int64_t sp[1] = {NTOK}, s1s[3] = {NTOK, NH, HD}, s2s[2] = {NTOK, H2 * HD2}, sc1[2] = {NTOK, RD / 2}, sc2[2] = {NTOK, HD2 / 2};
  DLTensor tp = fb_dl_int(pos, 64, 1, sp), tx1 = bxt_f32_view(x1, 3, s1s), tdy1 = bxt_f32_view(dy1, 3, s1s),
           tx2 = bxt_f32_view(x2, 2, s2s), tdy2 = bxt_f32_view(dy2, 2, s2s);
  const char *a = "rope x[700,3,20] rotary 10 theta 10000", *b = "rope x[700,32] head_dim 16 rotary 16 theta 1e6";
  int ok = 1;
  for (int ti = 0; ti < 2 && ok; ti++) {
    bx_rope_opts o = BX_ROPE_OPTS_DEFAULT;
    o.num_threads = FB_LT[ti];
    DLTensor ty1 = bxt_f32_view(y1[ti], 3, s1s), tdx1 = bxt_f32_view(dx1[ti], 3, s1s), ty2 = bxt_f32_view(y2[ti], 2, s2s),
             tdx2 = bxt_f32_view(dx2[ti], 2, s2s), tc1 = bxt_f32_view(c1[ti], 2, sc1), ts1 = bxt_f32_view(s1[ti], 2, sc1),
             tc2 = bxt_f32_view(c2[ti], 2, sc2), ts2 = bxt_f32_view(s2[ti], 2, sc2);
    ok = expect_ok(a, bx_rope_forward(&tx1, &tp, HD, RD, 10000.0, &ty1, &o)) &&
         expect_ok(a, bx_rope_backward(&tdy1, &tp, HD, RD, 10000.0, &tdx1, &o)) &&
         expect_ok(a, bx_rope_cos_sin(&tp, RD, 10000.0, &tc1, &ts1, &o)) &&
         expect_ok(b, bx_rope_forward(&tx2, &tp, HD2, HD2, 1e6, &ty2, &o)) &&
         expect_ok(b, bx_rope_backward(&tdy2, &tp, HD2, HD2, 1e6, &tdx2, &o)) &&
         expect_ok(b, bx_rope_cos_sin(&tp, HD2, 1e6, &tc2, &ts2, &o));
  }
  if (!ok) return;
  out2(a, "forward", y1[0], y1[1], sizeof y1[0]);
  out2(a, "backward", dx1[0], dx1[1], sizeof dx1[0]);
  out2(a, "cos", c1[0], c1[1], sizeof c1[0]);
  out2(a, "sin", s1[0], s1[1], sizeof s1[0]);
  out2(b, "forward", y2[0], y2[1], sizeof y2[0]);
  out2(b, "backward", dx2[0], dx2[1], sizeof dx2[0]);
  out2(b, "cos", c2[0], c2[1], sizeof c2[0]);
  out2(b, "sin", s2[0], s2[1], sizeof s2[0]);
  out_f("rope theta 1e6 cos[699][7] (position 2^24)", c2[0][(NTOK - 1) * HD2 / 2 + 7]);
  memcpy(dx2[1], x2, sizeof x2); /* in place */
  DLTensor ti2 = bxt_f32_view(dx2[1], 2, s2s);
  if (expect_ok("rope in place", bx_rope_forward(&ti2, &tp, HD2, HD2, 1e6, &ti2, NULL)))
    fb_same_bits("rope_forward in place vs not", dx2[1], y2[0], sizeof x2);
}

/* ---- SwiGLU --------------------------------------------------------------- */

static void fb_swiglu(void) {
  enum { NTOK = 1800, F = 19 }; /* 3 pieces of 862 rows */
  static float g[NTOK * F], u[NTOK * F], dh[NTOK * F], gu[NTOK * 2 * F], h[2][NTOK * F], hf[2][NTOK * F];
  static float dg[2][NTOK * F], du[2][NTOK * F], dgu[2][NTOK * 2 * F];
  fb_f32_grad(g, NTOK * F, 0x7d01, -6, 11, 6); /* |g| up to 2^7: the sigmoid saturates */
  g[5] = 0x1p100f, g[6] = -0x1p100f, g[7] = -100.0f, g[8] = 88.75f;
  fb_f32_grad(u, NTOK * F, 0x7d02, -6, 10, 30);
  fb_f32_grad(dh, NTOK * F, 0x7d03, -14, 12, 0);
  for (int t = 0; t < NTOK; t++) {
    memcpy(gu + t * 2 * F, g + t * F, F * 4);
    memcpy(gu + t * 2 * F + F, u + t * F, F * 4);
  }
  int64_t s[2] = {NTOK, F}, s2[2] = {NTOK, 2 * F};
  DLTensor tg = bxt_f32_view(g, 2, s), tu = bxt_f32_view(u, 2, s), tdh = bxt_f32_view(dh, 2, s), tgu = bxt_f32_view(gu, 2, s2);
  const char *w = "swiglu [1800,19]";
  int ok = 1;
  for (int ti = 0; ti < 2 && ok; ti++) {
    bx_swiglu_opts o = BX_SWIGLU_OPTS_DEFAULT;
    o.num_threads = FB_LT[ti];
    DLTensor th = bxt_f32_view(h[ti], 2, s), thf = bxt_f32_view(hf[ti], 2, s), tdg = bxt_f32_view(dg[ti], 2, s),
             tdu = bxt_f32_view(du[ti], 2, s), tdgu = bxt_f32_view(dgu[ti], 2, s2);
    ok = expect_ok(w, bx_swiglu_forward(&tg, &tu, &th, &o)) &&
         expect_ok(w, bx_swiglu_forward_fused(&tgu, &thf, &o)) &&
         expect_ok(w, bx_swiglu_backward(&tg, &tu, &tdh, &tdg, &tdu, &o)) &&
         expect_ok(w, bx_swiglu_backward_fused(&tgu, &tdh, &tdgu, &o));
  }
  if (!ok) return;
  out2(w, "forward h", h[0], h[1], sizeof h[0]);
  out2(w, "backward dgate", dg[0], dg[1], sizeof dg[0]);
  out2(w, "backward dup", du[0], du[1], sizeof du[0]);
  fb_same_bits("swiglu forward_fused vs two tensors", hf[0], h[0], sizeof h[0]);
  out2(w, "backward_fused dgate_up", dgu[0], dgu[1], sizeof dgu[0]);
  int same = 1;
  for (int t = 0; t < NTOK; t++)
    same = same && !memcmp(dgu[0] + t * 2 * F, dg[0] + t * F, F * 4) &&
           !memcmp(dgu[0] + t * 2 * F + F, du[0] + t * F, F * 4);
  printf("swiglu backward_fused vs two tensors: %s\n", same ? "same bits" : "DIFFERENT bits");
  if (!same) g_errors++;
  DLTensor tin = bxt_f32_view(dgu[1], 2, s2); /* in place: dgate_up = gate_up */
  memcpy(dgu[1], gu, sizeof gu);
  if (expect_ok("swiglu backward_fused in place", bx_swiglu_backward_fused(&tin, &tdh, &tin, NULL)))
    fb_same_bits("swiglu backward_fused in place vs not", dgu[1], dgu[0], sizeof gu);
}

/* ---- causal GQA attention ------------------------------------------------- */

/* B sequences of L, Hq query heads over Hkv = Hq / 2 kv heads of D */
static void fb_attention_case(int64_t B, int64_t L, int64_t Hq, int64_t D, int three_d) {
  int64_t Hkv = Hq / 2, NTOK = B * L;
  size_t nq = (size_t)(NTOK * Hq * D), nk = (size_t)(NTOK * Hkv * D), ns = (size_t)(NTOK * Hq * 2);
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4), *buf[2] = {0, 0};
  size_t each = 2 * nq + ns + 2 * nk; /* o, stats, dq, dk, dv */
  buf[0] = malloc(each * 4), buf[1] = malloc(each * 4);
  char what[120];
  snprintf(what, sizeof what, "attention B=%d L=%d Hq=%d Hkv=%d D=%d%s", (int)B, (int)L, (int)Hq, (int)Hkv, (int)D,
           three_d ? " [B,L,F]" : "");
  if (!q || !k || !v || !dout || !buf[0] || !buf[1]) {
    printf("%s: out of memory\n", what);
    g_errors++;
    goto done;
  }
  fb_f32_grad(q, nq, 0x7e01 + (uint64_t)D, -5, 7, 4);
  fb_f32_grad(k, nk, 0x7e02 + (uint64_t)D, -5, 7, 4);
  fb_f32_grad(v, nk, 0x7e03 + (uint64_t)D, -8, 10, 20);
  fb_f32_grad(dout, nq, 0x7e04 + (uint64_t)D, -14, 10, 0);
  int64_t sq[3], sk[3], ss[3] = {NTOK, Hq, 2};
  int nd = three_d ? 3 : 2;
  if (three_d)
    sq[0] = sk[0] = B, sq[1] = sk[1] = L, sq[2] = Hq * D, sk[2] = Hkv * D;
  else
    sq[0] = sk[0] = NTOK, sq[1] = Hq * D, sk[1] = Hkv * D;
  DLTensor tq = bxt_f32_view(q, nd, sq), tk = bxt_f32_view(k, nd, sk), tv = bxt_f32_view(v, nd, sk), tdo = bxt_f32_view(dout, nd, sq);
  int ok = 1;
  for (int ti = 0; ti < 2 && ok; ti++) {
    float *o = buf[ti], *st = o + nq, *dq = st + ns, *dk = dq + nq, *dv = dk + nk;
    fb_pattern(buf[ti], each * 4);
    DLTensor to = bxt_f32_view(o, nd, sq), ts = bxt_f32_view(st, 3, ss), tdq = bxt_f32_view(dq, nd, sq),
             tdk = bxt_f32_view(dk, nd, sk), tdv = bxt_f32_view(dv, nd, sk);
    bx_attention_opts ao = BX_ATTENTION_OPTS_DEFAULT;
    ao.num_threads = FB_LT[ti];
    ok = expect_ok(what, bx_attention_forward(&tq, &tk, &tv, L, Hq, Hkv, D, &to, &ts, &ao)) &&
         expect_ok(what, bx_attention_backward(&tdo, &tq, &tk, &tv, &ts, L, Hq, Hkv, D, &tdq, &tdk, &tdv, &ao));
  }
  if (ok) {
    static const char *const parts[5] = {"o", "stats", "dq", "dk", "dv"};
    size_t sizes[5] = {nq, ns, nq, nk, nk}, at = 0;
    for (int p = 0; p < 5; p++) {
      out2(what, parts[p], buf[0] + at, buf[1] + at, sizes[p] * 4);
      at += sizes[p];
    }
  }
done:
  free(q), free(k), free(v), free(dout), free(buf[0]), free(buf[1]);
}

static void fb_attention(void) {
  fb_attention_case(3, 45, 4, 9, 0); /* several row blocks of every kernel table, odd D */
  fb_attention_case(2, 7, 2, 16, 1);
  fb_attention_case(2, 1, 2, 5, 0); /* L = 1: p = 1, o = v */
}

/* ---- embedding ------------------------------------------------------------ */

static void fb_embedding(void) {
  enum { V = 23, H = 13, NTOK = 700, C = 64, NC = (NTOK + C - 1) / C }; /* 3 pieces of 315 rows */
  static float wt[V * H], dy[NTOK * H], y[2][NTOK * H], rows[2][2][NTOK * H], dense[2][V * H];
  static int64_t ids[NTOK], rid[2][2][NTOK], off[2][2][NC + 1];
  static int32_t ids32[NTOK];
  for (int t = 0; t < NTOK; t++) ids[t] = (int64_t)(fb_hash(0x7f01, (uint64_t)t) % 9) * 2 + (t % 97 == 16 ? 4 : 0); /* repeats */
  for (int t = 0; t < NTOK; t++) ids32[t] = (int32_t)ids[t];
  fb_f32_grad(wt, V * H, 0x7f02, -8, 10, 90);
  static const uint32_t odd[3] = {0x7f812345u, 0xffd0beefu, 0x7f800000u}; /* copied bit for bit */
  for (int i = 0; i < 3; i++) memcpy(&wt[(size_t)(2 + 2 * i) * H + 1 + i], &odd[i], 4);
  fb_f32_grad(dy, NTOK * H, 0x7f03, -14, 12, 0);
  int64_t st[1] = {NTOK}, sw[2] = {V, H}, sy[2] = {NTOK, H}, so[1] = {NC + 1};
  DLTensor tw = bxt_f32_view(wt, 2, sw), ti64 = fb_dl_int(ids, 64, 1, st), ti32 = fb_dl_int(ids32, 32, 1, st),
           tdy = bxt_f32_view(dy, 2, sy);
  int ok = 1;
  for (int ti = 0; ti < 2 && ok; ti++) {
    bx_embedding_opts o = BX_EMBEDDING_OPTS_DEFAULT;
    o.num_threads = FB_LT[ti];
    DLTensor ty = bxt_f32_view(y[ti], 2, sy);
    ok = expect_ok("embedding_forward", bx_embedding_forward(&tw, &ti32, &ty, &o));
    for (int pad = 0; pad < 2 && ok; pad++) {
      o.padding_idx = pad ? ids[2] : -1;
      fb_pattern(rows[ti][pad], sizeof rows[ti][pad]);
      fb_pattern(rid[ti][pad], sizeof rid[ti][pad]);
      DLTensor tr = bxt_f32_view(rows[ti][pad], 2, sy), trid = fb_dl_int(rid[ti][pad], 64, 1, st),
               to = fb_dl_int(off[ti][pad], 64, 1, so);
      ok = expect_ok("embedding_backward", bx_embedding_backward(pad ? &ti32 : &ti64, &tdy, V, C, &trid, &tr, &to, &o));
    }
  }
  if (!ok) return;
  out2("embedding_forward V=23 H=13 T=700 int32 ids", "y", y[0], y[1], sizeof y[0]);
  for (int pad = 0; pad < 2; pad++) {
    char what[96];
    snprintf(what, sizeof what, "embedding_backward C=64 %s", pad ? "padding_idx, int32 ids" : "no padding_idx");
    out2(what, "row_ids", rid[0][pad], rid[1][pad], sizeof rid[0][pad]);
    out2(what, "rows", rows[0][pad], rows[1][pad], sizeof rows[0][pad]);
    out2(what, "offsets", off[0][pad], off[1][pad], sizeof off[0][pad]);
  }
  /* its token reduction, grid and ordinary mode: the dense [V, H] sum */
  for (int mode = 0; mode < 2; mode++) {
    DLTensor tg = bxt_f32_view(NULL, 2, sw), td = bxt_f32_view(dense[mode], 2, sw);
    DLTensor tr = bxt_f32_view(rows[0][0], 2, sy), trid = fb_dl_int(rid[0][0], 64, 1, st), to = fb_dl_int(off[0][0], 64, 1, so);
    bx_tokred_opts ro = BX_TOKRED_OPTS_DEFAULT;
    ro.mode = mode ? BX_TOKRED_ORDINARY : BX_TOKRED_GRID;
    bx_tokred *s = NULL;
    const char *what = mode ? "embedding grad tokred ordinary" : "embedding grad tokred grid";
    if (!expect_ok(what, bx_tokred_create(&tg, 1, C, NTOK, &ro, &s))) continue;
    if (expect_ok(what, bx_embedding_grad_bound(s, 0, &tr, &to)) && expect_ok(what, bx_tokred_agree(s, NULL)) &&
        expect_ok(what, bx_embedding_grad_add(s, &tg, 1, 0, 0, &trid, &tr, &to)) &&
        expect_ok(what, bx_tokred_finish(s, &td, 1, 1)))
      out_hash(what, dense[mode], sizeof dense[mode]);
    bx_tokred_destroy(s);
  }
}

/* ---- cross-entropy -------------------------------------------------------- */

static void fb_xent(void) {
  /* 5 pieces of 7 tokens; rows of 8 blocks of 256 and 5 more */
  enum { NTOK = 29, V = 2053, C = 4, NC = (NTOK + C - 1) / C, NEXTRA = 7 };
  static float z[NTOK * V], loss[2][NTOK], lp[2][NC], dz[2][NTOK * V], fl[2][NTOK], flp[2][NC], fdz[2][NTOK * V], zi[NTOK * V];
  static int64_t tg[NTOK], cnt[2][NC], fcnt[2][NC], ccnt[2][NC];
  static int32_t tg32[NTOK];
  fb_f32_grad(z, NTOK * V, 0x7f11, -4, 8, 20);
  for (int t = 0; t < NTOK; t++) tg[t] = (int64_t)(fb_hash(0x7f12, (uint64_t)t) % V);
  tg[3] = -100, tg[9] = -100, tg[20] = -100, tg[NTOK - 1] = -100; /* ignored, the last position as transformers' shift */
  z[5 * V + tg[5]] = -INFINITY;              /* loss +Inf */
  z[7 * V + 11] = NAN;                       /* a NaN row */
  z[8 * V + 2] = INFINITY;                   /* m = +Inf: a NaN row */
  for (int v = 0; v < V; v++) z[10 * V + v] = v % 2 ? 0x1p100f : -0x1p100f; /* huge, ties at the max */
  for (int t = 0; t < NTOK; t++) tg32[t] = (int32_t)tg[t];
  int64_t sz[2] = {NTOK, V}, st[1] = {NTOK}, sc[1] = {NC};
  DLTensor tz = bxt_f32_view(z, 2, sz), tt = fb_dl_int(tg, 64, 1, st), tt32 = fb_dl_int(tg32, 32, 1, st);
  int ok = 1;
  int64_t n_global = 0;
  for (int ti = 0; ti < 2 && ok; ti++) {
    bx_xent_opts o = BX_XENT_OPTS_DEFAULT;
    o.num_threads = FB_LT[ti];
    DLTensor tl = bxt_f32_view(loss[ti], 1, st), tlp = bxt_f32_view(lp[ti], 1, sc), tc = fb_dl_int(cnt[ti], 64, 1, sc),
             tcc = fb_dl_int(ccnt[ti], 64, 1, sc);
    ok = expect_ok("xent_count", bx_xent_count(&tt32, C, &tcc, &o)) &&
         expect_ok("xent_forward", bx_xent_forward(&tz, &tt, C, &tl, &tlp, &tc, &o));
    if (!ok) break;
    n_global = NEXTRA;
    for (int c = 0; c < NC; c++) n_global += ccnt[0][c];
    o.grad_scale = 0.5;
    DLTensor tdz = bxt_f32_view(dz[ti], 2, sz), tfl = bxt_f32_view(fl[ti], 1, st), tflp = bxt_f32_view(flp[ti], 1, sc),
             tfc = fb_dl_int(fcnt[ti], 64, 1, sc), tfdz = bxt_f32_view(fdz[ti], 2, sz);
    ok = expect_ok("xent_backward", bx_xent_backward(&tz, &tt32, n_global, &tdz, &o)) &&
         expect_ok("xent_forward_backward",
                   bx_xent_forward_backward(&tz, &tt, n_global, C, &tfl, &tflp, &tfc, &tfdz, &o));
  }
  if (!ok) return;
  const char *w = "xent T=29 V=2053 C=4 (4 ignored, -Inf target, NaN rows, huge ties)";
  out2(w, "count", ccnt[0], ccnt[1], sizeof ccnt[0]);
  out2(w, "forward losses", loss[0], loss[1], sizeof loss[0]);
  out2(w, "forward loss_partials", lp[0], lp[1], sizeof lp[0]);
  out2(w, "forward counts", cnt[0], cnt[1], sizeof cnt[0]);
  printf("%s backward n_global %" PRId64 " grad_scale 0.5\n", w, n_global);
  out2(w, "backward dlogits", dz[0], dz[1], sizeof dz[0]);
  fb_same_bits("xent forward_backward losses vs forward", fl[0], loss[0], sizeof loss[0]);
  fb_same_bits("xent forward_backward loss_partials vs forward", flp[0], lp[0], sizeof lp[0]);
  fb_same_bits("xent forward_backward counts vs forward", fcnt[0], cnt[0], sizeof cnt[0]);
  fb_same_bits("xent forward_backward dlogits vs backward", fdz[0], dz[0], sizeof dz[0]);
  fb_same_bits("xent count vs forward counts", ccnt[0], cnt[0], sizeof cnt[0]);
  memcpy(zi, z, sizeof zi); /* in place: dlogits = logits */
  bx_xent_opts o = BX_XENT_OPTS_DEFAULT;
  o.grad_scale = 0.5;
  DLTensor tzi = bxt_f32_view(zi, 2, sz);
  if (expect_ok("xent_backward in place", bx_xent_backward(&tzi, &tt, n_global, &tzi, &o)))
    fb_same_bits("xent backward in place vs not", zi, dz[0], sizeof zi);
}

static void fb_layers(void) {
  fb_moe();
  fb_rmsnorm();
  fb_rope();
  fb_swiglu();
  fb_attention();
  fb_embedding();
  fb_xent();
}
