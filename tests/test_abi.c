/*
 * test_abi.c — the ABI rules of bitexact.h ("Struct sizes") and the version
 * functions. Every entry that takes a bx_norm_opts, bx_scale_opts,
 * bx_clip_opts (and its nested norm and scale options) or bx_comm refuses
 * a struct_size other than the library's sizeof — 0, smaller, larger, and
 * a program built against 0.1 whose structs have no struct_size — with
 * BX_EINVAL, the message that names the case, no location, outputs and
 * gradients untouched, and a refused comm never called.
 *
 * The structs handed over are heap blocks of exactly the size the "caller"
 * claims (or the 0.1 layout's size), so under AddressSanitizer a library
 * that read past the struct_size it was told, or copied the struct before
 * checking, fails the run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(BX_HAVE_CUDA)
#include "bitexact_cuda.h"
#endif
#include "checks.h"
#include "harness.h"
#include "tests.h"
#include "util.h"

#define SENTINEL -4242.5

/* ---- versions ----------------------------------------------------------- */

void test_abi_version(void) {
  CHECK(bx_version() == BX_VERSION_NUMBER, "bx_version() %u == BX_VERSION_NUMBER %d",
        bx_version(), BX_VERSION_NUMBER);
  CHECK(BX_VERSION_NUMBER == BX_VERSION_MAJOR * 10000 + BX_VERSION_MINOR * 100 + BX_VERSION_PATCH,
        "BX_VERSION_NUMBER from the three macros");
  const char *s = bx_version_string();
  CHECK(s != NULL, "bx_version_string() is not NULL");
  if (!s) return;
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", BX_VERSION_MAJOR, BX_VERSION_MINOR, BX_VERSION_PATCH);
  CHECK(strcmp(s, want) == 0, "bx_version_string() \"%s\" == \"%s\" (the macros)", s, want);
  CHECK(strcmp(BX_VERSION_STRING, want) == 0, "BX_VERSION_STRING \"%s\" == \"%s\"",
        BX_VERSION_STRING, want);
  CHECK(bx_version_string() == s, "static storage: the same pointer on every call");
  unsigned v = bx_version();
  char from_number[32];
  snprintf(from_number, sizeof from_number, "%u.%u.%u", v / 10000, v / 100 % 100, v % 100);
  CHECK(strcmp(s, from_number) == 0, "bx_version_string() \"%s\" agrees with bx_version() %u", s,
        v);
}

/* ---- the initializer macros ------------------------------------------- */

void test_abi_defaults(void) {
  bx_norm_opts n = BX_NORM_OPTS_DEFAULT;
  bx_scale_opts s = BX_SCALE_OPTS_DEFAULT;
  bx_clip_opts c = BX_CLIP_OPTS_DEFAULT;
  bx_comm m = BX_COMM_DEFAULT;
  CHECK(n.struct_size == sizeof(bx_norm_opts), "BX_NORM_OPTS_DEFAULT: struct_size %zu", n.struct_size);
  CHECK(n.norm_type == 2.0 && n.error_if_nonfinite == 0 && n.num_threads == 0 &&
            n.flavor == BX_EXACT && n.norm_dtype == BX_NORM_F64,
        "BX_NORM_OPTS_DEFAULT is {size, 2, 0, 0, BX_EXACT, BX_NORM_F64}");
  CHECK(s.struct_size == sizeof(bx_scale_opts) && s.mode == BX_SCALE_TORCH && s.num_threads == 0,
        "BX_SCALE_OPTS_DEFAULT is {size, BX_SCALE_TORCH, 0}");
  CHECK(c.struct_size == sizeof(bx_clip_opts) && c.norm.struct_size == sizeof(bx_norm_opts) &&
            c.scale.struct_size == sizeof(bx_scale_opts),
        "BX_CLIP_OPTS_DEFAULT: sizes %zu, nested %zu and %zu", c.struct_size, c.norm.struct_size,
        c.scale.struct_size);
  CHECK(c.eps == 1e-6 && c.formula == BX_COEF_TORCH && c.norm.norm_type == 2.0 &&
            c.scale.mode == BX_SCALE_TORCH,
        "BX_CLIP_OPTS_DEFAULT nests the other defaults");
  CHECK(m.struct_size == sizeof(bx_comm) && m.allreduce_i64 == NULL && m.ctx == NULL &&
            m.rank == 0 && m.on_device == 0 && m.stream == NULL && m.allreduce_i64_async == NULL &&
            m.allreduce_f32 == NULL,
        "BX_COMM_DEFAULT: struct_size, everything else zero");
  /* struct_size leads: it is where a program of another layout has it */
  CHECK(offsetof(bx_norm_opts, struct_size) == 0 && offsetof(bx_scale_opts, struct_size) == 0 &&
            offsetof(bx_clip_opts, struct_size) == 0 && offsetof(bx_comm, struct_size) == 0,
        "struct_size is the first field of every struct");
}

/* ---- refusals --------------------------------------------------------- */

/* The message the library must give for struct_size `got` (want: its
 * sizeof), as bitexact.h describes the four cases: the start of the text,
 * which must match exactly. */
static void expected_text(char *buf, size_t cap, const char *fn, const char *field, size_t got,
                          size_t want, const char *type, const char *init) {
  if (got == 0)
    snprintf(buf, cap, "%s: %s is 0, not sizeof(%s) = %zu: initialise it with %s", fn, field,
             type, want, init);
  else if (got > 4096)
    snprintf(buf, cap, "%s: %s is %zu, not a size (sizeof(%s) = %zu in bitexact %s): the struct "
             "was not initialised with %s", fn, field, got, type, want, BX_VERSION_STRING, init);
  else
    snprintf(buf, cap, "%s: %s is %zu: this program was built against %s bitexact (%s of %zu "
             "bytes) than the library it runs with (%s, %zu bytes)", fn, field, got,
             got > want ? "a newer" : "an older", type, got, BX_VERSION_STRING, want);
}

/* status BX_EINVAL, the text, the location (rank want_rank, no group or
 * tensor). */
static void check_refused(const char *what, bx_status st, const char *want_text, int want_rank) {
  CHECK_STATUS(st, BX_EINVAL, "%s", what);
  const char *e = bx_last_error();
  CHECK(strncmp(e, want_text, strlen(want_text)) == 0, "%s: bx_last_error() is\n      \"%s\"\n"
        "    want it to begin\n      \"%s\"", what, e, want_text);
  const bx_error_location *l = bx_last_error_location();
  CHECK(l->rank == want_rank && l->group == -1 && l->tensor == -1,
        "%s: location rank %d group %lld tensor %lld, want %d, -1, -1", what, l->rank, l->group,
        l->tensor, want_rank);
}

/* A heap copy of proto (a correct struct of proto_size bytes) as a caller
 * whose struct is `claimed` bytes long would pass it: a block of exactly
 * that many bytes (the full struct for 0), the fields it shares with proto
 * copied, the rest 0xA5, struct_size = claimed. */
static void *caller_struct(const void *proto, size_t proto_size, size_t claimed) {
  size_t bytes = claimed == 0 || claimed > 4096 ? proto_size : claimed;
  unsigned char *p = malloc(bytes);
  if (!p) abort();
  memset(p, 0xA5, bytes);
  memcpy(p, proto, bytes < proto_size ? bytes : proto_size);
  memcpy(p, &claimed, sizeof claimed);
  return p;
}

/* The sizes a call must refuse, for a struct of `want` bytes. */
static size_t bad_size(size_t want, int k) {
  switch (k) {
    case 0: return 0;
    case 1: return want - sizeof(size_t);   /* older or hand-made */
    case 2: return want + sizeof(size_t);   /* newer: a field appended */
    case 3: return want + 64;               /* much newer */
    default: return (size_t)0x4000000000000000ull; /* not a size (2.0's bits) */
  }
}
#define NBAD 5

/* A one-rank communicator that counts its calls (identity all-reduce). */
static int counting_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  (void)buf, (void)n, (void)op;
  ++*(int *)ctx;
  return 0;
}

typedef struct abi_fixture {
  bxt_tensor x[2]; /* fp32 and bf16 gradients */
  bxt_tensor copy[2];
  DLTensor dl[2];
  bx_group g;
  double norm; /* of x, computed with NULL options */
} abi_fixture;

static void fixture_make(abi_fixture *f) {
  bxt_rng r;
  bxt_rng_init(&r);
  bxt_tensor_alloc(&f->x[0], REF_F32, 1000);
  bxt_tensor_alloc(&f->x[1], REF_BF16, 700);
  for (int k = 0; k < 2; k++) {
    bxt_fill_gradient(&r, &f->x[k], 1.0);
    bxt_tensor_clone(&f->copy[k], &f->x[k]);
    f->dl[k] = f->x[k].t;
  }
  f->g.tensors = f->dl;
  f->g.count = 2;
  f->norm = SENTINEL;
  CHECK_STATUS(bx_total_norm(&f->g, 1, NULL, NULL, &f->norm, NULL), BX_OK, "fixture norm");
}

static void fixture_check_untouched(const abi_fixture *f, const char *what) {
  for (int k = 0; k < 2; k++)
    CHECK(memcmp(f->x[k].buf, f->copy[k].buf, f->x[k].n * bxt_dt_size(f->x[k].dt)) == 0,
          "%s: tensor %d was modified", what, k);
}

static void fixture_free(abi_fixture *f) {
  for (int k = 0; k < 2; k++) {
    bxt_tensor_free(&f->x[k]);
    bxt_tensor_free(&f->copy[k]);
  }
}

/* bx_total_norm: opts, then comm. */
static void refuse_total_norm(abi_fixture *f) {
  static const bx_norm_opts proto = BX_NORM_OPTS_DEFAULT;
  char what[160], want[512];
  for (int k = 0; k < NBAD; k++) {
    size_t sz = bad_size(sizeof proto, k);
    bx_norm_opts *o = caller_struct(&proto, sizeof proto, sz);
    double total = SENTINEL, gn[1] = {SENTINEL};
    snprintf(what, sizeof what, "bx_total_norm, opts->struct_size %zu", sz);
    expected_text(want, sizeof want, "bx_total_norm", "opts->struct_size", sz, sizeof proto,
                  "bx_norm_opts", "BX_NORM_OPTS_DEFAULT");
    check_refused(what, bx_total_norm(&f->g, 1, NULL, o, &total, gn), want, -1);
    CHECK(total == SENTINEL && gn[0] == SENTINEL, "%s: an output was written", what);
    free(o);
  }
  bx_comm good = BX_COMM_DEFAULT;
  int calls = 0;
  good.allreduce_i64 = counting_allreduce;
  good.ctx = &calls;
  good.rank = 3;
  for (int k = 0; k < NBAD; k++) {
    size_t sz = bad_size(sizeof good, k);
    bx_comm *c = caller_struct(&good, sizeof good, sz);
    double total = SENTINEL, gn[1] = {SENTINEL};
    snprintf(what, sizeof what, "bx_total_norm, comm->struct_size %zu", sz);
    expected_text(want, sizeof want, "bx_total_norm", "comm->struct_size", sz, sizeof good,
                  "bx_comm", "BX_COMM_DEFAULT");
    calls = 0;
    check_refused(what, bx_total_norm(&f->g, 1, c, NULL, &total, gn), want, -1);
    CHECK(total == SENTINEL && gn[0] == SENTINEL, "%s: an output was written", what);
    CHECK(calls == 0, "%s: the refused comm was called %d times", what, calls);
    free(c);
  }
}

/* bx_scale: opts; the tensors stay as they were. */
static void refuse_scale(abi_fixture *f) {
  static const bx_scale_opts proto = BX_SCALE_OPTS_DEFAULT;
  char what[160], want[512];
  for (int k = 0; k < NBAD; k++) {
    size_t sz = bad_size(sizeof proto, k);
    bx_scale_opts *o = caller_struct(&proto, sizeof proto, sz);
    snprintf(what, sizeof what, "bx_scale, opts->struct_size %zu", sz);
    expected_text(want, sizeof want, "bx_scale", "opts->struct_size", sz, sizeof proto,
                  "bx_scale_opts", "BX_SCALE_OPTS_DEFAULT");
    check_refused(what, bx_scale(f->dl, 2, 0.5, o), want, -1);
    fixture_check_untouched(f, what);
    free(o);
  }
}

/* Which struct_size of a bx_clip_opts a case sets: the outer one (in a
 * block of that size) or a nested one (inside a full struct). */
enum { CLIP_OUTER, CLIP_NORM, CLIP_SCALE, CLIP_FIELDS };

static bx_clip_opts *clip_case(int field, size_t sz, char *want, size_t cap, const char *fn) {
  static const bx_clip_opts proto = BX_CLIP_OPTS_DEFAULT;
  if (field == CLIP_OUTER) {
    expected_text(want, cap, fn, "opts->struct_size", sz, sizeof proto, "bx_clip_opts",
                  "BX_CLIP_OPTS_DEFAULT");
    return caller_struct(&proto, sizeof proto, sz);
  }
  bx_clip_opts *o = caller_struct(&proto, sizeof proto, sizeof proto);
  if (field == CLIP_NORM) {
    o->norm.struct_size = sz;
    expected_text(want, cap, fn, "opts->norm.struct_size", sz, sizeof proto.norm, "bx_norm_opts",
                  "BX_NORM_OPTS_DEFAULT");
  } else {
    o->scale.struct_size = sz;
    expected_text(want, cap, fn, "opts->scale.struct_size", sz, sizeof proto.scale,
                  "bx_scale_opts", "BX_SCALE_OPTS_DEFAULT");
  }
  return o;
}

/* bad_size for the struct that holds clip field `field` */
static size_t clip_bad_size(int field, int k) {
  return bad_size(field == CLIP_OUTER ? sizeof(bx_clip_opts)
                  : field == CLIP_NORM ? sizeof(bx_norm_opts)
                                       : sizeof(bx_scale_opts), k);
}

static const char *const clip_field_name[CLIP_FIELDS] = {
    "opts->struct_size", "opts->norm.struct_size", "opts->scale.struct_size"};

/* bx_clip_grad_norm and bx_clip_coef: every struct_size of the options,
 * then bx_clip_grad_norm's comm. max_norm is small: a call that went
 * through would scale. */
static void refuse_clip(abi_fixture *f) {
  char what[160], want[512];
  double max_norm = f->norm / 4;
  for (int field = 0; field < CLIP_FIELDS; field++)
    for (int k = 0; k < NBAD; k++) {
      size_t sz = clip_bad_size(field, k);
      /* nested fields live inside a full struct: "not a size" is the case
       * that matters there, not a short block */
      bx_clip_opts *o = clip_case(field, sz, want, sizeof want, "bx_clip_grad_norm");
      double total = SENTINEL, coef = SENTINEL;
      snprintf(what, sizeof what, "bx_clip_grad_norm, %s %zu", clip_field_name[field], sz);
      check_refused(what, bx_clip_grad_norm(&f->g, 1, NULL, max_norm, o, &total, &coef), want, -1);
      CHECK(total == SENTINEL && coef == SENTINEL, "%s: an output was written", what);
      fixture_check_untouched(f, what);
      free(o);
      o = clip_case(field, sz, want, sizeof want, "bx_clip_coef");
      coef = SENTINEL;
      snprintf(what, sizeof what, "bx_clip_coef, %s %zu", clip_field_name[field], sz);
      check_refused(what, bx_clip_coef(f->norm, max_norm, o, &coef), want, -1);
      CHECK(coef == SENTINEL, "%s: coef was written", what);
      free(o);
    }
  bx_comm good = BX_COMM_DEFAULT;
  int calls = 0;
  good.allreduce_i64 = counting_allreduce;
  good.ctx = &calls;
  for (int k = 0; k < NBAD; k++) {
    size_t sz = bad_size(sizeof good, k);
    bx_comm *c = caller_struct(&good, sizeof good, sz);
    double total = SENTINEL, coef = SENTINEL;
    snprintf(what, sizeof what, "bx_clip_grad_norm, comm->struct_size %zu", sz);
    expected_text(want, sizeof want, "bx_clip_grad_norm", "comm->struct_size", sz, sizeof good,
                  "bx_comm", "BX_COMM_DEFAULT");
    calls = 0;
    check_refused(what, bx_clip_grad_norm(&f->g, 1, c, max_norm, NULL, &total, &coef), want, -1);
    CHECK(total == SENTINEL && coef == SENTINEL, "%s: an output was written", what);
    CHECK(calls == 0, "%s: the refused comm was called %d times", what, calls);
    fixture_check_untouched(f, what);
    free(c);
  }
}

/* bx_cuda_plan_create (CUDA builds): the sizes are checked before the
 * device is looked for, so this runs without a GPU too. *out is NULL on
 * failure, as documented. */
static void refuse_plan(abi_fixture *f) {
#if defined(BX_HAVE_CUDA)
  char what[160], want[512];
  bx_cuda_plan *dummy = (bx_cuda_plan *)(void *)f; /* any non-NULL value */
  for (int field = 0; field < CLIP_FIELDS; field++)
    for (int k = 0; k < NBAD; k++) {
      size_t sz = clip_bad_size(field, k);
      bx_clip_opts *o = clip_case(field, sz, want, sizeof want, "bx_cuda_plan_create");
      bx_cuda_plan *p = dummy;
      snprintf(what, sizeof what, "bx_cuda_plan_create, %s %zu", clip_field_name[field], sz);
      check_refused(what, bx_cuda_plan_create(&f->g, 1, NULL, o, &p), want, -1);
      CHECK(p == NULL, "%s: *out is not NULL", what);
      free(o);
    }
  bx_comm good = BX_COMM_DEFAULT;
  int calls = 0;
  good.allreduce_i64 = counting_allreduce;
  good.ctx = &calls;
  for (int k = 0; k < NBAD; k++) {
    size_t sz = bad_size(sizeof good, k);
    bx_comm *c = caller_struct(&good, sizeof good, sz);
    bx_cuda_plan *p = dummy;
    snprintf(what, sizeof what, "bx_cuda_plan_create, comm->struct_size %zu", sz);
    expected_text(want, sizeof want, "bx_cuda_plan_create", "comm->struct_size", sz, sizeof good,
                  "bx_comm", "BX_COMM_DEFAULT");
    calls = 0;
    check_refused(what, bx_cuda_plan_create(&f->g, 1, c, NULL, &p), want, -1);
    CHECK(p == NULL, "%s: *out is not NULL", what);
    CHECK(calls == 0, "%s: the refused comm was called %d times", what, calls);
    free(c);
  }
#else
  (void)f;
#endif
}

void test_abi_struct_sizes(void) {
  abi_fixture f;
  fixture_make(&f);
  refuse_total_norm(&f);
  refuse_scale(&f);
  refuse_clip(&f);
  refuse_plan(&f);
  fixture_free(&f);
}

/* ---- a program built against 0.1 ------------------------------------- */

/* The 0.1.0 layouts: no struct_size. */
typedef struct v01_norm_opts {
  double norm_type;
  int error_if_nonfinite;
  int num_threads;
  bx_norm_flavor flavor;
  bx_norm_dtype norm_dtype;
} v01_norm_opts;
typedef struct v01_scale_opts {
  bx_scale_mode mode;
  int num_threads;
} v01_scale_opts;
typedef struct v01_clip_opts {
  v01_norm_opts norm;
  v01_scale_opts scale;
  double eps;
  bx_coef_formula formula;
} v01_clip_opts;
typedef struct v01_comm {
  int (*allreduce_i64)(int64_t *buf, size_t n, bx_op op, void *ctx);
  void *ctx;
  int rank;
  int on_device;
  void *stream;
  int (*allreduce_i64_async)(int64_t *buf, size_t n, bx_op op, void *ctx, void *s);
} v01_comm;

/* The struct in a heap block of its own size; *first: its first 8 bytes as
 * the library reads them (struct_size). */
static void *v01_block(const void *s, size_t bytes, size_t *first) {
  void *p = malloc(bytes);
  if (!p) abort();
  memcpy(p, s, bytes);
  memcpy(first, s, sizeof *first);
  return p;
}

void test_abi_old_binary(void) {
  abi_fixture f;
  fixture_make(&f);
  char want[512];
  size_t first;
  int calls = 0;
  double total = SENTINEL, coef = SENTINEL;

  /* 0.1's BX_NORM_OPTS_DEFAULT: struct_size reads 2.0's bits */
  const v01_norm_opts n01 = {2.0, 0, 0, BX_EXACT, BX_NORM_F64};
  bx_norm_opts *n = v01_block(&n01, sizeof n01, &first);
  expected_text(want, sizeof want, "bx_total_norm", "opts->struct_size", first,
                sizeof(bx_norm_opts), "bx_norm_opts", "BX_NORM_OPTS_DEFAULT");
  check_refused("0.1 norm options", bx_total_norm(&f.g, 1, NULL, n, &total, NULL), want, -1);
  CHECK(strstr(bx_last_error(), "0.1") != NULL, "the text names 0.1: \"%s\"", bx_last_error());
  free(n);

  /* 0.1's scale options: {0, 0} reads as 0, {EXACT, 4} as no size */
  const v01_scale_opts s01[2] = {{BX_SCALE_TORCH, 0}, {BX_SCALE_EXACT, 4}};
  for (int k = 0; k < 2; k++) {
    bx_scale_opts *s = v01_block(&s01[k], sizeof s01[k], &first);
    expected_text(want, sizeof want, "bx_scale", "opts->struct_size", first,
                  sizeof(bx_scale_opts), "bx_scale_opts", "BX_SCALE_OPTS_DEFAULT");
    check_refused(k ? "0.1 scale options {EXACT, 4}" : "0.1 scale options {TORCH, 0}",
                  bx_scale(f.dl, 2, 0.5, s), want, -1);
    free(s);
  }

  const v01_clip_opts c01 = {{2.0, 0, 0, BX_EXACT, BX_NORM_F64}, {BX_SCALE_TORCH, 0}, 1e-6,
                             BX_COEF_TORCH};
  bx_clip_opts *c = v01_block(&c01, sizeof c01, &first);
  expected_text(want, sizeof want, "bx_clip_grad_norm", "opts->struct_size", first,
                sizeof(bx_clip_opts), "bx_clip_opts", "BX_CLIP_OPTS_DEFAULT");
  check_refused("0.1 clip options",
                bx_clip_grad_norm(&f.g, 1, NULL, f.norm / 4, c, &total, &coef), want, -1);
  expected_text(want, sizeof want, "bx_clip_coef", "opts->struct_size", first,
                sizeof(bx_clip_opts), "bx_clip_opts", "BX_CLIP_OPTS_DEFAULT");
  check_refused("0.1 clip options, bx_clip_coef", bx_clip_coef(f.norm, 1.0, c, &coef), want, -1);
  free(c);

  /* 0.1's {fn, ctx, rank} comm: struct_size reads the function's address,
   * and the function is never called */
  v01_comm m01;
  memset(&m01, 0, sizeof m01);
  m01.allreduce_i64 = counting_allreduce;
  m01.ctx = &calls;
  bx_comm *m = v01_block(&m01, sizeof m01, &first);
  CHECK(first > 4096, "a function's address reads as no size (%zu)", first);
  expected_text(want, sizeof want, "bx_total_norm", "comm->struct_size", first, sizeof(bx_comm),
                "bx_comm", "BX_COMM_DEFAULT");
  check_refused("0.1 comm", bx_total_norm(&f.g, 1, m, NULL, &total, NULL), want, -1);
  expected_text(want, sizeof want, "bx_clip_grad_norm", "comm->struct_size", first,
                sizeof(bx_comm), "bx_comm", "BX_COMM_DEFAULT");
  check_refused("0.1 comm, clip",
                bx_clip_grad_norm(&f.g, 1, m, f.norm / 4, NULL, &total, &coef), want, -1);
  CHECK(calls == 0, "the 0.1 comm's function was called %d times", calls);
  free(m);

  CHECK(total == SENTINEL && coef == SENTINEL, "an output was written");
  fixture_check_untouched(&f, "0.1 structs");
  fixture_free(&f);
}

/* ---- communicators built from BX_COMM_DEFAULT ----------------------- */

void test_abi_comm_default(void) {
  abi_fixture f;
  fixture_make(&f);
  int calls = 0;
  bx_comm c = BX_COMM_DEFAULT;
  c.allreduce_i64 = counting_allreduce;
  c.ctx = &calls;
  c.rank = 5;
  double total = SENTINEL, gn[1] = {SENTINEL};
  CHECK_STATUS(bx_total_norm(&f.g, 1, &c, NULL, &total, gn), BX_OK, "BX_COMM_DEFAULT comm");
  CHECK_BITS_D(total, f.norm, "BX_COMM_DEFAULT comm: the norm of one process");
  CHECK_BITS_D(gn[0], f.norm, "BX_COMM_DEFAULT comm: group 0");
  CHECK(calls == 2, "one agreement and one norm collective (%d calls)", calls);

  /* options of another layout with a good comm: a local failure that still
   * takes part in the agreement step (one call), with its own message and
   * this rank in the location */
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.struct_size += 8;
  char want[512];
  expected_text(want, sizeof want, "bx_total_norm", "opts->struct_size", o.struct_size,
                sizeof(bx_norm_opts), "bx_norm_opts", "BX_NORM_OPTS_DEFAULT");
  calls = 0;
  total = SENTINEL;
  check_refused("bad norm options, good comm", bx_total_norm(&f.g, 1, &c, &o, &total, gn), want, 5);
  CHECK(calls == 1, "bad options, good comm: the agreement step only (%d calls)", calls);
  CHECK(total == SENTINEL, "bad options, good comm: total written");

  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  co.scale.struct_size = 0;
  expected_text(want, sizeof want, "bx_clip_grad_norm", "opts->scale.struct_size", 0,
                sizeof(bx_scale_opts), "bx_scale_opts", "BX_SCALE_OPTS_DEFAULT");
  calls = 0;
  double coef = SENTINEL;
  check_refused("bad nested scale options, good comm",
                bx_clip_grad_norm(&f.g, 1, &c, f.norm / 4, &co, &total, &coef), want, 5);
  CHECK(calls == 1, "bad clip options, good comm: the agreement step only (%d calls)", calls);
  CHECK(total == SENTINEL && coef == SENTINEL, "bad clip options, good comm: output written");
  fixture_check_untouched(&f, "bad clip options, good comm");

  /* and a clip through it, against the clip of one process */
  bxt_tensor y[2];
  DLTensor dl[2];
  for (int k = 0; k < 2; k++) {
    bxt_tensor_clone(&y[k], &f.x[k]);
    dl[k] = y[k].t;
  }
  bx_group gy = {dl, 2};
  double t1 = SENTINEL, c1 = SENTINEL, t2 = SENTINEL, c2 = SENTINEL;
  CHECK_STATUS(bx_clip_grad_norm(&f.g, 1, NULL, f.norm / 4, NULL, &t1, &c1), BX_OK, "clip alone");
  calls = 0;
  CHECK_STATUS(bx_clip_grad_norm(&gy, 1, &c, f.norm / 4, NULL, &t2, &c2), BX_OK,
               "clip with a BX_COMM_DEFAULT comm");
  CHECK(calls == 2, "clip: two collectives (%d)", calls);
  CHECK_BITS_D(t2, t1, "clip: total");
  CHECK_BITS_D(c2, c1, "clip: coefficient");
  for (int k = 0; k < 2; k++)
    CHECK(memcmp(y[k].buf, f.x[k].buf, y[k].n * bxt_dt_size(y[k].dt)) == 0,
          "clip with the comm scaled tensor %d as the clip alone did", k);
  for (int k = 0; k < 2; k++) bxt_tensor_free(&y[k]);
  fixture_free(&f);
}
