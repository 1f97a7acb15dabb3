/*
 * train_trace.c — the C trainer's trace writer (train_trace.h). Each entry
 * is one line of the format (docs/trace.md) formatted as Python's
 * json.dumps(entry, separators=(", ", ": ")) writes it, the head values as
 * float.hex writes them, so the torch / Paddle trainers' files are the
 * same bytes. Entries are kept per step with their sort key (phase, the
 * module's order, slice, what) and written sorted at the step's end.
 */
#include "train_trace.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "cli.h"
#include "st_write.h"
#include "train_mpi.h"

enum { TT_HEAD = 8, TT_BLOCKS = 16 };
static const char *const phase_names[3] = {"forward", "backward", "optimizer"};
/* tensors sort after every module of their phase, in parameter order */
#define TT_TENSOR_ORDER ((int64_t)1 << 40)

typedef struct tt_entry {
  int32_t phase;
  int64_t order, slice; /* slice -1: a whole tensor (null) */
  char what[16];
  char *line;           /* without the newline */
  uint32_t len;
} tt_entry;

struct tt_trace {
  FILE *f;
  int rank, write_failed;
  int64_t L, step;
  char *path;
  char *dump;                 /* the --dump key, or NULL */
  char *plant;                /* BITEXACT_TRACE_PLANT's key, or NULL */
  int64_t plant_el;
  tt_entry *e;
  size_t n, cap;
  char **names[2];            /* modules first seen in this step's forward / backward */
  size_t nnames[2], capnames[2];
  int oom;
  tr_trace hook;
};

/* ---- formatting ------------------------------------------------------------------------ */

/* Python's float.hex of a double (v a widened float: never a subnormal double). */
static void py_hex(double v, char *out, size_t n) {
  if (isnan(v)) {
    snprintf(out, n, "nan");
    return;
  }
  if (isinf(v)) {
    snprintf(out, n, v > 0 ? "inf" : "-inf");
    return;
  }
  uint64_t b;
  memcpy(&b, &v, 8);
  const char *sign = b >> 63 ? "-" : "";
  int e = (int)((b >> 52) & 0x7ff);
  uint64_t m = b & ((UINT64_C(1) << 52) - 1);
  if (e == 0 && m == 0) snprintf(out, n, "%s0x0.0p+0", sign);
  else if (e == 0) snprintf(out, n, "%s0x0.%013llxp-1022", sign, (unsigned long long)m);
  else snprintf(out, n, "%s0x1.%013llxp%+d", sign, (unsigned long long)m, e - 1023);
}

typedef struct sbuf {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void sb_put(sbuf *s, const char *fmt, ...) {
  if (s->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(s->p ? s->p + s->n : NULL, s->p ? s->cap - s->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      s->oom = 1;
      return;
    }
    if (s->p && s->n + (size_t)k < s->cap) {
      s->n += (size_t)k;
      return;
    }
    size_t nc = s->cap ? s->cap * 2 : 512;
    while (nc <= s->n + (size_t)k) nc *= 2;
    char *q = realloc(s->p, nc);
    if (!q) {
      s->oom = 1;
      return;
    }
    s->p = q;
    s->cap = nc;
  }
}

/* One entry's line (dtype F32: the trainer's values are fp32). */
static char *entry_line(int64_t step, int phase, const char *module, const char *what, int64_t slice,
                        const float *x, int ndim, const int64_t *shape, uint32_t *len) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  sbuf s = {0};
  sb_put(&s, "{\"step\": %lld, \"phase\": \"%s\", \"module\": \"%s\", \"what\": \"%s\", \"slice\": ",
         (long long)step, phase_names[phase], module, what);
  if (slice < 0) sb_put(&s, "null");
  else sb_put(&s, "%lld", (long long)slice);
  sb_put(&s, ", \"dtype\": \"F32\", \"shape\": [");
  for (int d = 0; d < ndim; d++) sb_put(&s, "%s%lld", d ? ", " : "", (long long)shape[d]);
  /* each part's hash, and the whole's as a stream over the parts (each part read from memory
   * once, then from the cache) */
  int64_t nb = n < TT_BLOCKS ? n : TT_BLOCKS;
  unsigned long long bh[TT_BLOCKS] = {0}, whole;
  XXH3_state_t *st = XXH3_createState();
  if (!st || XXH3_64bits_reset(st) != XXH_OK) s.oom = 1;
  for (int64_t j = 0; j < nb && !s.oom; j++) {
    int64_t a = j * n / nb, b = (j + 1) * n / nb;
    bh[j] = XXH3_64bits(x + a, (size_t)(b - a) * sizeof(float));
    if (XXH3_64bits_update(st, x + a, (size_t)(b - a) * sizeof(float)) != XXH_OK) s.oom = 1;
  }
  whole = s.oom ? 0 : XXH3_64bits_digest(st);
  XXH3_freeState(st);
  sb_put(&s, "], \"hash\": \"%016llx\", \"blocks\": \"", whole);
  for (int64_t j = 0; j < nb; j++) sb_put(&s, "%016llx", bh[j]);
  sb_put(&s, "\", \"head\": [");
  for (int64_t i = 0; i < n && i < TT_HEAD; i++) {
    char h[40];
    py_hex((double)x[i], h, sizeof h);
    sb_put(&s, "%s\"%s\"", i ? ", " : "", h);
  }
  sb_put(&s, "]}");
  if (s.oom) {
    free(s.p);
    return NULL;
  }
  *len = (uint32_t)s.n;
  return s.p;
}

void tt_config_text(const tr_config *c, char *out, size_t outlen) {
  char a[40], b[40], e[40], r[40];
  py_hex(c->partial_rotary_factor, a, sizeof a);
  py_hex(c->rope_theta, b, sizeof b);
  py_hex(c->rms_norm_eps, e, sizeof e);
  py_hex(c->routed_scaling_factor, r, sizeof r);
  snprintf(out, outlen,
           "partial_rotary_factor=%s;rope_theta=%s;rms_norm_eps=%s;num_experts_per_tok=%lld;"
           "n_group=%lld;topk_group=%lld;norm_topk_prob=%d;routed_scaling_factor=%s;",
           a, b, e, (long long)c->num_experts_per_tok, (long long)c->n_group, (long long)c->topk_group,
           c->norm_topk_prob ? 1 : 0, r);
}

void tt_model_id(const char *const *names, const int *ndims, const int64_t *const *shapes, size_t n,
                 const tr_config *cfg, char *out, size_t outlen) {
  XXH3_state_t *st = XXH3_createState();
  unsigned long long h = 0;
  if (st && XXH3_64bits_reset(st) == XXH_OK) {
    for (size_t i = 0; i < n; i++) {
      char b[96];
      XXH3_64bits_update(st, names[i], strlen(names[i]));
      for (int d = 0; d < ndims[i]; d++) {
        int k = snprintf(b, sizeof b, "%s%lld", d ? "," : ":", (long long)shapes[i][d]);
        XXH3_64bits_update(st, b, (size_t)k);
      }
      if (ndims[i] == 0) XXH3_64bits_update(st, ":", 1);
      XXH3_64bits_update(st, ";", 1);
    }
    h = XXH3_64bits_digest(st);
  }
  XXH3_freeState(st);
  char ct[512];
  tt_config_text(cfg, ct, sizeof ct);
  snprintf(out, outlen, "Glm4MoeForCausalLM:%016llx:%016llx", h,
           (unsigned long long)XXH3_64bits(ct, strlen(ct)));
}

/* ---- entries --------------------------------------------------------------------------- */

static int push(tt_trace *t, tt_entry e) {
  if (t->n == t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 256;
    tt_entry *q = realloc(t->e, nc * sizeof *q);
    if (!q) return -1;
    t->e = q;
    t->cap = nc;
  }
  t->e[t->n++] = e;
  return 0;
}

/* The module's order in this step's phase (first seen first); -1: out of memory. */
static int64_t module_order(tt_trace *t, int phase, const char *name) {
  for (size_t i = 0; i < t->nnames[phase]; i++)
    if (strcmp(t->names[phase][i], name) == 0) return (int64_t)i;
  if (t->nnames[phase] == t->capnames[phase]) {
    size_t nc = t->capnames[phase] ? t->capnames[phase] * 2 : 64;
    char **q = realloc(t->names[phase], nc * sizeof *q);
    if (!q) return -1;
    t->names[phase] = q;
    t->capnames[phase] = nc;
  }
  char *c = strdup(name);
  if (!c) return -1;
  t->names[phase][t->nnames[phase]] = c;
  return (int64_t)t->nnames[phase]++;
}

static void key_of(char *key, size_t n, int64_t step, int phase, const char *module, const char *what,
                   int64_t slice) {
  if (slice < 0) snprintf(key, n, "%lld/%s/%s/%s/-", (long long)step, phase_names[phase], module, what);
  else snprintf(key, n, "%lld/%s/%s/%s/%lld", (long long)step, phase_names[phase], module, what,
                (long long)slice);
}

/* --dump: the entry's values to path.dump.safetensors (atomic). */
static void write_dump(tt_trace *t, const char *key, const float *x, int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  size_t pl = strlen(t->path) + 64;
  char *dst = malloc(pl), *tmp = malloc(pl);
  char err[512];
  if (!dst || !tmp) {
    cli_error("train: --dump: out of memory");
    t->write_failed = 1;
  } else {
    snprintf(dst, pl, "%s.dump.safetensors", t->path);
    snprintf(tmp, pl, "%s.dump.tmp-%d", t->path, (int)getpid());
    tc_tensor tc = {key, ndim, shape, n, x};
    if (tc_write_safetensors(tmp, &tc, 1, err, sizeof err) || rename(tmp, dst) != 0) {
      cli_error("train: --dump %s: %s", dst, err[0] ? err : strerror(errno));
      unlink(tmp);
      t->write_failed = 1;
    }
  }
  free(dst);
  free(tmp);
}

static int add_entry(tt_trace *t, int phase, int64_t order, const char *module, const char *what,
                     int64_t slice, float *x, int ndim, const int64_t *shape, int plantable) {
  char key[512];
  if (t->plant || t->dump) key_of(key, sizeof key, t->step, phase, module, what, slice);
  if (plantable && t->plant && strcmp(key, t->plant) == 0) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (t->plant_el < n) x[t->plant_el] = nextafterf(x[t->plant_el], INFINITY);
  }
  if (t->dump && strcmp(key, t->dump) == 0) write_dump(t, key, x, ndim, shape);
  tt_entry e = {phase, order, slice, {0}, NULL, 0};
  snprintf(e.what, sizeof e.what, "%s", what);
  e.line = entry_line(t->step, phase, module, what, slice, x, ndim, shape, &e.len);
  if (!e.line || push(t, e)) {
    free(e.line);
    return -1;
  }
  return 0;
}

static int on_rows(void *ctx, int phase, const char *module, const char *what, float *x, int64_t T,
                   int64_t cols, int64_t tok0) {
  tt_trace *t = ctx;
  int64_t order = module_order(t, phase, module), L = t->L;
  if (order < 0) return -1;
  for (int64_t i = 0; i * L < T; i++) {
    int64_t shape[2] = {T - i * L < L ? T - i * L : L, cols};
    if (add_entry(t, phase, order, module, what, tok0 / L + i, x + i * L * cols, 2, shape, 1)) return -1;
  }
  return 0;
}

static void drop_entries(tt_trace *t, int keep_tensors) {
  size_t k = 0;
  for (size_t i = 0; i < t->n; i++) {
    if (keep_tensors && t->e[i].order >= TT_TENSOR_ORDER) t->e[k++] = t->e[i];
    else free(t->e[i].line);
  }
  t->n = k;
  for (int p = 0; p < 2; p++) {
    for (size_t i = 0; i < t->nnames[p]; i++) free(t->names[p][i]);
    t->nnames[p] = 0;
  }
}

static void on_pass(void *ctx) { drop_entries(ctx, 1); }

/* ---- the API --------------------------------------------------------------------------- */

tt_trace *tt_open(const char *path, const char *model, const char *dump, int64_t seq_len, int rank,
                  char *err, size_t errlen) {
  tt_trace *t = calloc(1, sizeof *t);
  if (!t || !(t->path = strdup(path)) || (dump && !(t->dump = strdup(dump)))) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  t->rank = rank;
  t->L = seq_len;
  const char *pl = getenv("BITEXACT_TRACE_PLANT");
  if (pl && *pl) {
    const char *sl = strrchr(pl, '/');
    char *end = NULL;
    long long el = sl ? strtoll(sl + 1, &end, 10) : -1;
    int slashes = 0;
    for (const char *q = pl; *q; q++) slashes += *q == '/';
    if (!sl || end == sl + 1 || *end || el < 0 || slashes != 5) {
      snprintf(err, errlen, "BITEXACT_TRACE_PLANT '%s': STEP/PHASE/MODULE/WHAT/SLICE/ELEMENT expected", pl);
      goto fail;
    }
    if (!(t->plant = strndup(pl, (size_t)(sl - pl)))) {
      snprintf(err, errlen, "out of memory");
      goto fail;
    }
    t->plant_el = el;
  }
  if (rank == 0) {
    if (!(t->f = fopen(path, "w"))) {
      snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
      goto fail;
    }
    fprintf(t->f,
            "{\"bitexact_trace\": 1, \"blocks\": %d, \"hash\": \"xxh3-64\", \"head\": %d, \"model\": "
            "\"%s\", \"producer\": \"bitexact train %s\"}\n",
            TT_BLOCKS, TT_HEAD, model, bx_version_string());
    if (fflush(t->f) != 0) t->write_failed = 1;
  }
  t->hook.rows = on_rows;
  t->hook.pass = on_pass;
  t->hook.ctx = t;
  return t;
fail:
  if (t) {
    free(t->path);
    free(t->dump);
    free(t->plant);
    free(t);
  }
  return NULL;
}

const tr_trace *tt_hook(tt_trace *t) { return &t->hook; }

void tt_begin_step(tt_trace *t, int64_t step) {
  drop_entries(t, 0);
  t->step = step;
}

int tt_tensor(tt_trace *t, int phase, const char *name, const char *what, int64_t order,
              const float *x, int ndim, const int64_t *shape) {
  return add_entry(t, phase, TT_TENSOR_ORDER + order, name, what, -1, (float *)x, ndim, shape, 0);
}

static int cmp_entry(const void *pa, const void *pb) {
  const tt_entry *a = pa, *b = pb;
  if (a->phase != b->phase) return a->phase < b->phase ? -1 : 1;
  if (a->order != b->order) return a->order < b->order ? -1 : 1;
  if (a->slice != b->slice) return a->slice < b->slice ? -1 : 1;
  return strcmp(a->what, b->what);
}

/* This rank's entries as bytes: per entry phase (4), order (8), slice (8),
 * what (16), length (4), the line. NULL: out of memory. */
static unsigned char *pack(const tt_trace *t, int64_t *bytes) {
  size_t n = 0;
  for (size_t i = 0; i < t->n; i++) n += 40 + t->e[i].len;
  unsigned char *b = malloc(n ? n : 1), *p = b;
  if (!b) return NULL;
  for (size_t i = 0; i < t->n; i++) {
    const tt_entry *e = &t->e[i];
    memcpy(p, &e->phase, 4);
    memcpy(p + 4, &e->order, 8);
    memcpy(p + 12, &e->slice, 8);
    memcpy(p + 20, e->what, 16);
    memcpy(p + 36, &e->len, 4);
    memcpy(p + 40, e->line, e->len);
    p += 40 + e->len;
  }
  *bytes = (int64_t)n;
  return b;
}

static int unpack(tt_trace *t, const unsigned char *p, int64_t bytes) {
  const unsigned char *end = p + bytes;
  while (p < end) {
    tt_entry e;
    memcpy(&e.phase, p, 4);
    memcpy(&e.order, p + 4, 8);
    memcpy(&e.slice, p + 12, 8);
    memcpy(e.what, p + 20, 16);
    memcpy(&e.len, p + 36, 4);
    if (!(e.line = malloc(e.len ? e.len : 1))) return -1;
    memcpy(e.line, p + 40, e.len);
    if (push(t, e)) {
      free(e.line);
      return -1;
    }
    p += 40 + e.len;
  }
  return 0;
}

static int agree_bad(const bx_comm *comm, int bad) {
  if (!comm) return bad;
  int64_t v = bad;
  if (comm->allreduce_i64(&v, 1, BX_OP_MAX, comm->ctx) != 0) return 1;
  return (int)v;
}

int tt_end_step(tt_trace *t, int P, const bx_comm *comm, char *err, size_t errlen) {
  int bad = 0;
  if (P > 1) {
    int64_t mine = 0, *sizes = calloc((size_t)P, sizeof *sizes);
    unsigned char *b = pack(t, &mine), **got = calloc((size_t)P, sizeof *got);
    bad = !sizes || !b || !got;
    if (agree_bad(comm, bad)) {
      snprintf(err, errlen, "trace: out of memory gathering the step's entries");
      free(sizes), free(b), free(got);
      return -1;
    }
    for (int r = 1; r < P; r++) { /* the sizes, then (all agreed) the entries */
      sizes[r] = mine;
      bad |= trm_to_root(&sizes[r], sizeof sizes[r], r) != 0;
      if (t->rank == 0 && !bad && !(got[r] = malloc(sizes[r] ? (size_t)sizes[r] : 1))) bad = 1;
    }
    if (!agree_bad(comm, bad))
      for (int r = 1; r < P; r++) {
        bad |= trm_to_root(t->rank == 0 ? got[r] : b, (size_t)sizes[r], r) != 0;
        if (t->rank == 0 && !bad) bad |= unpack(t, got[r], sizes[r]) != 0;
      }
    for (int r = 0; r < P; r++) free(got[r]);
    free(sizes), free(b), free(got);
    if (agree_bad(comm, bad)) {
      snprintf(err, errlen, "trace: gathering the step's entries failed");
      return -1;
    }
  }
  if (t->rank == 0) {
    qsort(t->e, t->n, sizeof *t->e, cmp_entry);
    for (size_t i = 0; i < t->n; i++)
      if (fwrite(t->e[i].line, 1, t->e[i].len, t->f) != t->e[i].len || fputc('\n', t->f) == EOF)
        t->write_failed = 1;
    if (fflush(t->f) != 0) t->write_failed = 1;
  }
  drop_entries(t, 0);
  if (agree_bad(comm, t->write_failed)) {
    snprintf(err, errlen, "trace: %s: a write failed", t->path);
    return -1;
  }
  return 0;
}

int tt_close(tt_trace *t) {
  if (!t) return 0;
  int bad = t->write_failed;
  if (t->f && fclose(t->f) != 0) bad = 1;
  drop_entries(t, 0);
  for (int p = 0; p < 2; p++) free(t->names[p]);
  free(t->e);
  free(t->path);
  free(t->dump);
  free(t->plant);
  free(t);
  return bad ? -1 : 0;
}
