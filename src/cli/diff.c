/*
 * diff.c — `bitexact diff A B` for two safetensors files (run records are
 * in records.c): names only in one file, dtype/shape mismatches, and per
 * common tensor bitwise equality or element statistics (elements.c).
 * Worker threads take whole tensors; the report is in name order.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "elements.h"

typedef struct pair {
  const st_tensor *a, *b;
  int equal;
  elem_stats s;
} pair;

typedef struct diff_job {
  pair *pairs;
  size_t n;
  atomic_size_t next;
  cli_progress progress;
} diff_job;

static void diff_worker(void *ctx, int worker) {
  diff_job *j = ctx;
  (void)worker;
  for (;;) {
    size_t k = atomic_fetch_add(&j->next, 1);
    if (k >= j->n) break;
    pair *p = &j->pairs[k];
    uint64_t nbytes = p->a->end - p->a->begin;
    elem_compare(p->a->dtype, p->a->data, p->b->data, nbytes, &p->s);
    p->equal = p->s.differ == 0;
    cli_progress_add(&j->progress, 2 * nbytes);
  }
}

static int same_shape(const st_tensor *a, const st_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (size_t i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

static int cmp_names(const st_tensor *a, const st_tensor *b) {
  size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
  int c = memcmp(a->name, b->name, n);
  if (c) return c;
  return (a->name_len > b->name_len) - (a->name_len < b->name_len);
}

/* "[i, j, k]" of a flat row-major index. */
static void unravel(const st_tensor *t, uint64_t flat, char *buf, size_t len, json_t *arr) {
  uint64_t idx[64];
  size_t nd = t->ndim < 64 ? t->ndim : 64;
  for (size_t d = nd; d-- > 0;) {
    uint64_t dim = t->shape[d] ? t->shape[d] : 1;
    idx[d] = flat % dim;
    flat /= dim;
  }
  size_t used = (size_t)snprintf(buf, len, "[");
  for (size_t d = 0; d < nd && used < len; d++) {
    used += (size_t)snprintf(buf + used, len - used, "%s%llu", d ? ", " : "", (unsigned long long)idx[d]);
    if (arr) json_array_append_new(arr, json_integer((json_int_t)idx[d]));
  }
  if (used < len) snprintf(buf + used, len - used, "]");
}

static void value_str(const elem_stats *s, int b, char *buf, size_t len) {
  double v = b ? s->first_b : s->first_a;
  uint64_t bits = b ? s->first_bits_b : s->first_bits_a;
  if (s->by_bytes) snprintf(buf, len, "byte 0x%02llx", (unsigned long long)bits);
  else if (s->is_integer) snprintf(buf, len, "%.17g", v);
  else if (isnan(v)) snprintf(buf, len, "nan(bits 0x%llx)", (unsigned long long)bits);
  else cli_hex(v, buf, len);
}

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_string(v > 0 ? "inf" : "nan"); }

static json_t *ju64(uint64_t v) {
  return v <= INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

static int diff_safetensors(const char *pa, const char *pb, const cli_opts *o) {
  st_file f[2];
  char *paths[2] = {(char *)pa, (char *)pb};
  memset(f, 0, sizeof f);
  if (cli_open_files(paths, 2, f) != 0) return CLI_ERROR;
  int rc = CLI_ERROR;
  json_t *root = NULL;
  diff_job j;
  memset(&j, 0, sizeof j);
  j.pairs = calloc(f[0].count + 1, sizeof *j.pairs);
  if (!j.pairs) {
    cli_error("out of memory");
    goto done;
  }
  /* merge the two name-sorted lists */
  size_t only_a = 0, only_b = 0, mismatch = 0, ia = 0, ib = 0;
  uint64_t total = 0;
  while (ia < f[0].count || ib < f[1].count) {
    int c = ia == f[0].count ? 1 : ib == f[1].count ? -1 : cmp_names(&f[0].tensors[ia], &f[1].tensors[ib]);
    if (c < 0) { only_a++; ia++; continue; }
    if (c > 0) { only_b++; ib++; continue; }
    const st_tensor *a = &f[0].tensors[ia++], *b = &f[1].tensors[ib++];
    if (a->dtype != b->dtype || !same_shape(a, b)) { mismatch++; continue; }
    j.pairs[j.n++] = (pair){a, b, 0, {0}};
    total += 2 * (a->end - a->begin);
  }
  atomic_init(&j.next, 0);
  cli_progress_init(&j.progress, o, "diff", total);
  int threads = cli_threads(o);
  if ((size_t)threads > j.n) threads = j.n ? (int)j.n : 1;
  cli_parallel(threads, diff_worker, &j, &j.progress);

  size_t nequal = 0;
  uint64_t ndiff_elems = 0;
  for (size_t k = 0; k < j.n; k++) {
    nequal += j.pairs[k].equal;
    ndiff_elems += j.pairs[k].s.differ;
  }
  int identical = only_a == 0 && only_b == 0 && mismatch == 0 && nequal == j.n;
  FILE *out = cli_out();
  char shape_a[128], shape_b[128], idx[256], va[64], vb[64];
  if (o->json) {
    root = json_object();
    json_t *ja = json_array(), *jb = json_array(), *jm = json_array(), *jt = json_object();
    for (size_t side = 0; side < 2; side++)
      for (size_t k = 0; k < f[side].count; k++) {
        const st_tensor *t = &f[side].tensors[k];
        const st_tensor *other = st_find(&f[1 - side], t->name, t->name_len);
        if (!other) json_array_append_new(side ? jb : ja, json_string(t->name));
        else if (side == 0 && (other->dtype != t->dtype || !same_shape(t, other))) {
          json_t *m = json_object();
          st_shape_str(t, shape_a, sizeof shape_a);
          st_shape_str(other, shape_b, sizeof shape_b);
          json_object_set_new(m, "name", json_string(t->name));
          json_object_set_new(m, "a", json_pack("{s:s,s:s}", "dtype", st_dtype_get(t->dtype)->name, "shape", shape_a));
          json_object_set_new(m, "b", json_pack("{s:s,s:s}", "dtype", st_dtype_get(other->dtype)->name, "shape", shape_b));
          json_array_append_new(jm, m);
        }
      }
    for (size_t k = 0; k < j.n; k++) {
      const pair *p = &j.pairs[k];
      json_t *e = json_object();
      json_object_set_new(e, "equal", json_boolean(p->equal));
      json_object_set_new(e, "dtype", json_string(st_dtype_get(p->a->dtype)->name));
      json_object_set_new(e, "elements", ju64(p->s.compared));
      if (!p->equal) {
        json_t *ji = json_array();
        unravel(p->a, p->s.first, idx, sizeof idx, p->s.by_bytes ? NULL : ji);
        value_str(&p->s, 0, va, sizeof va);
        value_str(&p->s, 1, vb, sizeof vb);
        json_object_set_new(e, "differing", ju64(p->s.differ));
        json_object_set_new(e, "max_ulp", p->s.has_ulp ? ju64(p->s.max_ulp) : json_null());
        json_object_set_new(e, "max_abs", p->s.has_ulp ? jnum(p->s.max_abs) : json_null());
        json_object_set_new(e, "max_rel", p->s.has_ulp ? jnum(p->s.max_rel) : json_null());
        json_object_set_new(e, "first_flat_index", ju64(p->s.first));
        json_object_set_new(e, "first_index", ji);
        json_object_set_new(e, "first_a", json_string(va));
        json_object_set_new(e, "first_b", json_string(vb));
        json_object_set_new(e, "nan_payload", ju64(p->s.nan_payload));
        json_object_set_new(e, "nan_mismatch", ju64(p->s.nan_mismatch));
        json_object_set_new(e, "signed_zero", ju64(p->s.signed_zero));
      }
      json_object_set_new(jt, p->a->name, e);
    }
    json_object_set_new(root, "a", json_string(pa));
    json_object_set_new(root, "b", json_string(pb));
    json_object_set_new(root, "identical", json_boolean(identical));
    json_object_set_new(root, "only_in_a", ja);
    json_object_set_new(root, "only_in_b", jb);
    json_object_set_new(root, "mismatched", jm);
    json_object_set_new(root, "tensors", jt);
    json_object_set_new(root, "summary",
                        json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "common", (json_int_t)j.n,
                                  "equal", (json_int_t)nequal, "differ", (json_int_t)(j.n - nequal),
                                  "differing_elements", (json_int_t)ndiff_elems,
                                  "only_in_a", (json_int_t)only_a, "only_in_b", (json_int_t)only_b,
                                  "mismatched", (json_int_t)mismatch));
    if (json_dumpf(root, out, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) != 0) {
      cli_error("cannot format the JSON output");
      goto done;
    }
    fputc('\n', out);
  } else {
    fprintf(out, "A: %s (%zu tensors)\nB: %s (%zu tensors)\n", pa, f[0].count, pb, f[1].count);
    for (size_t side = 0; side < 2; side++)
      for (size_t k = 0; k < f[side].count; k++) {
        const st_tensor *t = &f[side].tensors[k];
        const st_tensor *other = st_find(&f[1 - side], t->name, t->name_len);
        st_shape_str(t, shape_a, sizeof shape_a);
        if (!other) {
          fprintf(out, "only in %s: %s %s %s\n", side ? "B" : "A", t->name,
                  st_dtype_get(t->dtype)->name, shape_a);
        } else if (side == 0 && (other->dtype != t->dtype || !same_shape(t, other))) {
          st_shape_str(other, shape_b, sizeof shape_b);
          fprintf(out, "mismatch: %s: A %s %s, B %s %s\n", t->name, st_dtype_get(t->dtype)->name,
                  shape_a, st_dtype_get(other->dtype)->name, shape_b);
        }
      }
    if (j.n) {
      fprintf(out, "%-8s %-8s %-18s %-21s %-9s %-12s %-12s %-14s %s\n", "status", "dtype", "shape",
              "differing", "max_ulp", "max_abs", "max_rel", "first_index", "tensor  [first: A vs B]");
    }
    for (size_t k = 0; k < j.n; k++) {
      const pair *p = &j.pairs[k];
      if (p->equal && o->quiet) continue;
      st_shape_str(p->a, shape_a, sizeof shape_a);
      if (p->equal) {
        fprintf(out, "%-8s %-8s %-18s %-21s %-9s %-12s %-12s %-14s %s\n", "equal",
                st_dtype_get(p->a->dtype)->name, shape_a, "0", "-", "-", "-", "-", p->a->name);
        continue;
      }
      char cnt[48], ulp[24], ab[24], rel[24];
      snprintf(cnt, sizeof cnt, "%llu/%llu", (unsigned long long)p->s.differ,
               (unsigned long long)p->s.compared);
      if (p->s.has_ulp) {
        snprintf(ulp, sizeof ulp, "%llu", (unsigned long long)p->s.max_ulp);
        snprintf(ab, sizeof ab, "%.4g", p->s.max_abs);
        snprintf(rel, sizeof rel, "%.4g", p->s.max_rel);
      } else {
        snprintf(ulp, sizeof ulp, "-");
        snprintf(ab, sizeof ab, "-");
        snprintf(rel, sizeof rel, "-");
      }
      unravel(p->a, p->s.first, idx, sizeof idx, NULL);
      if (p->s.by_bytes) snprintf(idx, sizeof idx, "byte %llu", (unsigned long long)p->s.first);
      value_str(&p->s, 0, va, sizeof va);
      value_str(&p->s, 1, vb, sizeof vb);
      fprintf(out, "%-8s %-8s %-18s %-21s %-9s %-12s %-12s %-14s %s  [%s vs %s]", "DIFFER",
              st_dtype_get(p->a->dtype)->name, shape_a, cnt, ulp, ab, rel, idx, p->a->name, va, vb);
      if (p->s.nan_payload || p->s.nan_mismatch || p->s.signed_zero)
        fprintf(out, "  (NaN payloads %llu, NaN vs number %llu, +0 vs -0 %llu)",
                (unsigned long long)p->s.nan_payload, (unsigned long long)p->s.nan_mismatch,
                (unsigned long long)p->s.signed_zero);
      fputc('\n', out);
    }
    fprintf(out,
            "summary: %zu common tensors: %zu bitwise equal, %zu differ (%llu elements differ); "
            "%zu only in A, %zu only in B, %zu dtype/shape mismatches\n",
            j.n, nequal, j.n - nequal, (unsigned long long)ndiff_elems, only_a, only_b, mismatch);
    fprintf(out, "result: %s\n", identical ? "identical" : "differ");
  }
  rc = identical ? CLI_OK : CLI_DIFFER;
done:
  json_decref(root);
  free(j.pairs);
  cli_close_files(f, 2);
  return rc;
}

/* 1 if path looks like a run record (JSON Lines: first non-blank byte
 * '{'), 0 if not or if it is a safetensors file (bytes 6, 7 of the header
 * length zero and byte 8 '{', which no text file has). */
static int sniff_records(const char *path) {
  unsigned char b[9];
  FILE *fp = fopen(path, "rb");
  if (!fp) return 0; /* the safetensors reader reports the error */
  size_t n = fread(b, 1, sizeof b, fp);
  fclose(fp);
  if (n == 9 && b[6] == 0 && b[7] == 0 && b[8] == '{') return 0;
  for (size_t i = 0; i < n; i++) {
    if (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') continue;
    return b[i] == '{';
  }
  return n == 0 ? 0 : 1; /* blank so far: text */
}

/* 1 if path's first line is a bitexact trace header. */
static int sniff_trace(const char *path) {
  char b[256];
  FILE *fp = fopen(path, "rb");
  if (!fp) return 0;
  size_t n = fread(b, 1, sizeof b - 1, fp);
  fclose(fp);
  b[n] = 0;
  char *nl = strchr(b, '\n');
  if (nl) *nl = 0;
  return b[0] == '{' && strstr(b, "\"bitexact_trace\"") != NULL;
}

int cmd_diff(int argc, char **argv) {
  cli_opts o = {0, 0, -1, 0};
  const char *files[2];
  int nfiles = 0, kind = -1; /* -1 sniff, 0 safetensors, 1 records, 2 traces */
  for (int i = 1; i < argc; i++) {
    int c = cli_common_opt(argc, argv, &i, &o);
    if (c < 0) return CLI_ERROR;
    if (c) continue;
    if (strcmp(argv[i], "--records") == 0) kind = 1;
    else if (strcmp(argv[i], "--trace") == 0) kind = 2;
    else if (strcmp(argv[i], "--safetensors") == 0) kind = 0;
    else if (argv[i][0] == '-' && argv[i][1]) {
      cli_error("diff: unknown option '%s'", argv[i]);
      return CLI_ERROR;
    } else if (nfiles == 2) {
      cli_error("diff: more than two files (usage: bitexact diff [options] A B)");
      return CLI_ERROR;
    } else {
      files[nfiles++] = argv[i];
    }
  }
  if (nfiles != 2) {
    cli_error("diff: needs two files (usage: bitexact diff [--json] [--records|--trace] A B)");
    return CLI_ERROR;
  }
  if (kind < 0) kind = sniff_trace(files[0]) ? 2 : sniff_records(files[0]);
  if (kind == 2) return diff_trace(files[0], files[1], &o);
  return kind ? diff_records(files[0], files[1], &o) : diff_safetensors(files[0], files[1], &o);
}
