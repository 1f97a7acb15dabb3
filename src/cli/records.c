/*
 * records.c — `bitexact diff A B` for run records: JSON Lines, one object
 * per training step, {"step": 37, "loss": "0x1.8p+1", "grad_norm": ...},
 * floats as hex-float strings so that no bit is lost (plain JSON numbers
 * are read too). Steps are matched by their "step" value; every other key
 * is compared: floats bit for bit (with their ULP distance), anything else
 * as JSON values. Reports the first step whose values differ.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "records.h"

typedef cli_record record;
typedef cli_records records;

void cli_records_free(records *rs) {
  for (size_t i = 0; i < rs->n; i++) json_decref(rs->r[i].obj);
  free(rs->r);
  free(rs->text);
}

static int cmp_step(const void *a, const void *b) {
  const record *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return (x->line > y->line) - (x->line < y->line);
}

int cli_records_load(const char *path, records *rs) {
  memset(rs, 0, sizeof *rs);
  rs->path = path;
  FILE *fp = fopen(path, "rb");
  if (!fp) return cli_error("%s: cannot open: %s", path, strerror(errno)), -1;
  size_t cap = 1 << 16, len = 0, got;
  rs->text = malloc(cap + 1);
  while (rs->text && (got = fread(rs->text + len, 1, cap - len, fp)) > 0) {
    len += got;
    if (len == cap) {
      char *t = realloc(rs->text, 2 * cap + 1);
      if (!t) break;
      rs->text = t;
      cap *= 2;
    }
  }
  int bad = ferror(fp) || !rs->text;
  fclose(fp);
  if (bad) return cli_error("%s: cannot read the file", path), -1;
  rs->text[len] = 0;
  if (len == 0) return cli_error("%s: empty file (no run records)", path), -1;
  size_t lines = 1;
  for (size_t i = 0; i < len; i++) lines += rs->text[i] == '\n';
  rs->r = calloc(lines, sizeof *rs->r);
  if (!rs->r) return cli_error("%s: out of memory", path), -1;
  char *p = rs->text;
  for (size_t line = 1; p < rs->text + len; line++) {
    char *nl = memchr(p, '\n', (size_t)(rs->text + len - p));
    size_t l = nl ? (size_t)(nl - p) : (size_t)(rs->text + len - p);
    size_t k = 0;
    while (k < l && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
    if (k < l) {
      json_error_t je;
      json_t *o = json_loadb(p, l, JSON_REJECT_DUPLICATES, &je);
      if (!o) return cli_error("%s: line %zu: invalid JSON: %s (column %d)", path, line, je.text, je.column), -1;
      json_t *js = json_object_get(o, "step");
      if (!json_is_object(o) || !json_is_integer(js)) {
        json_decref(o);
        return cli_error("%s: line %zu: not a run record (an object with an integer \"step\")", path, line), -1;
      }
      rs->r[rs->n++] = (record){json_integer_value(js), o, line};
    }
    p += l + 1;
  }
  if (rs->n == 0) return cli_error("%s: no run records", path), -1;
  qsort(rs->r, rs->n, sizeof *rs->r, cmp_step);
  for (size_t i = 1; i < rs->n; i++)
    if (rs->r[i].step == rs->r[i - 1].step)
      return cli_error("%s: line %zu: step %lld appears twice (also line %zu)", path, rs->r[i].line,
                       (long long)rs->r[i].step, rs->r[i - 1].line), -1;
  return 0;
}

int cli_record_float(const json_t *v, double *d) {
  if (json_is_real(v)) return *d = json_real_value(v), 1;
  if (!json_is_string(v)) return 0;
  const char *s = json_string_value(v);
  char *end;
  if (!*s) return 0;
  *d = strtod(s, &end);
  return *end == 0;
}

uint64_t cli_ulp64(double a, double b) {
  uint64_t x = cli_bits_f64(a), y = cli_bits_f64(b), m = ~(uint64_t)0 >> 1;
  if ((x >> 63) == (y >> 63)) return (x & m) > (y & m) ? (x & m) - (y & m) : (y & m) - (x & m);
  return (x & m) + (y & m);
}

typedef struct field_stat {
  const char *key;
  size_t differ;
  uint64_t max_ulp;
  json_int_t first_step;
} field_stat;

/* Compares one value. 0 equal; else 1 and *ulp (UINT64_MAX: no ULP). */
static int compare_value(const json_t *a, const json_t *b, uint64_t *ulp) {
  double x, y;
  *ulp = UINT64_MAX;
  if (!a || !b) return 1;
  if (cli_record_float(a, &x) && cli_record_float(b, &y)) {
    if (cli_bits_f64(x) == cli_bits_f64(y)) return 0;
    if (!isnan(x) && !isnan(y)) *ulp = cli_ulp64(x, y);
    return 1;
  }
  return !json_equal((json_t *)a, (json_t *)b);
}

static void value_text(const json_t *v, char *buf, size_t len) {
  double d;
  if (!v) snprintf(buf, len, "(absent)");
  else if (cli_record_float(v, &d)) cli_hex(d, buf, len);
  else {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(buf, len, "%s", s ? s : "?");
    free(s);
  }
}

int diff_records(const char *pa, const char *pb, const cli_opts *o) {
  records A, B;
  int rc = CLI_ERROR;
  json_t *root = NULL, *first = NULL;
  field_stat fs[256];
  size_t nfs = 0;
  if (cli_records_load(pa, &A) != 0) {
    cli_records_free(&A);
    return CLI_ERROR;
  }
  if (cli_records_load(pb, &B) != 0) goto done;
  size_t common = 0, only_a = 0, only_b = 0, differ_steps = 0, ia = 0, ib = 0;
  json_int_t first_only_a = 0, first_only_b = 0;
  const record *fa = NULL, *fb = NULL;
  while (ia < A.n || ib < B.n) {
    if (ib == B.n || (ia < A.n && A.r[ia].step < B.r[ib].step)) {
      if (only_a++ == 0) first_only_a = A.r[ia].step;
      ia++;
      continue;
    }
    if (ia == A.n || B.r[ib].step < A.r[ia].step) {
      if (only_b++ == 0) first_only_b = B.r[ib].step;
      ib++;
      continue;
    }
    const record *ra = &A.r[ia++], *rb = &B.r[ib++];
    common++;
    int step_differs = 0;
    for (int side = 0; side < 2; side++) {
      const char *key;
      json_t *v;
      json_object_foreach(side ? rb->obj : ra->obj, key, v) {
        if (strcmp(key, "step") == 0) continue;
        if (side == 1 && json_object_get(ra->obj, key)) continue; /* seen from A */
        uint64_t ulp;
        if (!compare_value(json_object_get(ra->obj, key), json_object_get(rb->obj, key), &ulp)) continue;
        step_differs = 1;
        size_t f = 0;
        while (f < nfs && strcmp(fs[f].key, key) != 0) f++;
        if (f == nfs && nfs < 256) fs[nfs++] = (field_stat){key, 0, 0, ra->step};
        if (f == 256) continue;
        fs[f].differ++;
        if (ulp != UINT64_MAX && ulp > fs[f].max_ulp) fs[f].max_ulp = ulp;
      }
    }
    if (step_differs && differ_steps++ == 0) fa = ra, fb = rb;
  }
  int identical = only_a == 0 && only_b == 0 && differ_steps == 0;
  FILE *out = cli_out();
  char va[80], vb[80];

  /* the first divergence, field by field (A's keys, then B's extra keys) */
  if (fa) {
    first = json_object();
    for (int side = 0; side < 2; side++) {
      const char *key;
      json_t *v;
      json_object_foreach(side ? fb->obj : fa->obj, key, v) {
        if (strcmp(key, "step") == 0 || (side == 1 && json_object_get(fa->obj, key))) continue;
        const json_t *x = json_object_get(fa->obj, key), *y = json_object_get(fb->obj, key);
        uint64_t ulp;
        int d = compare_value(x, y, &ulp);
        value_text(x, va, sizeof va);
        value_text(y, vb, sizeof vb);
        json_t *e = json_pack("{s:b,s:s,s:s}", "equal", !d, "a", va, "b", vb);
        json_object_set_new(e, "ulp", d && ulp != UINT64_MAX && ulp <= INT64_MAX ? json_integer((json_int_t)ulp)
                                      : d ? json_null() : json_integer(0));
        json_object_set_new(first, key, e);
      }
    }
  }
  if (o->json) {
    root = json_object();
    json_object_set_new(root, "a", json_string(pa));
    json_object_set_new(root, "b", json_string(pb));
    json_object_set_new(root, "identical", json_boolean(identical));
    json_object_set_new(root, "steps_a", json_integer((json_int_t)A.n));
    json_object_set_new(root, "steps_b", json_integer((json_int_t)B.n));
    json_object_set_new(root, "common_steps", json_integer((json_int_t)common));
    json_object_set_new(root, "only_in_a", json_integer((json_int_t)only_a));
    json_object_set_new(root, "only_in_b", json_integer((json_int_t)only_b));
    json_object_set_new(root, "differing_steps", json_integer((json_int_t)differ_steps));
    if (fa) {
      json_t *fd = json_pack("{s:I,s:I,s:I}", "step", (json_int_t)fa->step, "line_a",
                             (json_int_t)fa->line, "line_b", (json_int_t)fb->line);
      json_object_set(fd, "fields", first);
      json_object_set_new(root, "first_divergence", fd);
    } else {
      json_object_set_new(root, "first_divergence", json_null());
    }
    json_t *jf = json_object();
    for (size_t f = 0; f < nfs; f++)
      json_object_set_new(jf, fs[f].key,
                          json_pack("{s:I,s:I,s:I}", "differing_steps", (json_int_t)fs[f].differ,
                                    "max_ulp", (json_int_t)(fs[f].max_ulp > INT64_MAX ? INT64_MAX : fs[f].max_ulp),
                                    "first_step", (json_int_t)fs[f].first_step));
    json_object_set_new(root, "fields", jf);
    if (json_dumpf(root, out, JSON_INDENT(2)) != 0) {
      cli_error("cannot format the JSON output");
      goto done;
    }
    fputc('\n', out);
  } else {
    fprintf(out, "A: %s (%zu steps)\nB: %s (%zu steps)\n", pa, A.n, pb, B.n);
    if (only_a) fprintf(out, "steps only in A: %zu (first: %lld)\n", only_a, (long long)first_only_a);
    if (only_b) fprintf(out, "steps only in B: %zu (first: %lld)\n", only_b, (long long)first_only_b);
    if (fa) {
      fprintf(out, "first divergence: step %lld (line %zu of A, line %zu of B)\n", (long long)fa->step,
              fa->line, fb->line);
      const char *key;
      json_t *e;
      json_object_foreach(first, key, e) {
        json_t *u = json_object_get(e, "ulp");
        char ulp[32];
        if (json_is_true(json_object_get(e, "equal"))) snprintf(ulp, sizeof ulp, "equal");
        else if (json_is_integer(u)) snprintf(ulp, sizeof ulp, "%lld ulp", (long long)json_integer_value(u));
        else snprintf(ulp, sizeof ulp, "differ");
        fprintf(out, "  %-16s %-26s %-26s %s\n", key, json_string_value(json_object_get(e, "a")),
                json_string_value(json_object_get(e, "b")), ulp);
      }
      fprintf(out, "%-18s %-16s %-10s %s\n", "field", "differing steps", "max_ulp", "first step");
      for (size_t f = 0; f < nfs; f++)
        fprintf(out, "%-18s %-16zu %-10llu %lld\n", fs[f].key, fs[f].differ,
                (unsigned long long)fs[f].max_ulp, (long long)fs[f].first_step);
    }
    fprintf(out, "summary: %zu common steps, %zu differ; %zu only in A, %zu only in B\n", common,
            differ_steps, only_a, only_b);
    fprintf(out, "result: %s\n", identical ? "identical" : "differ");
  }
  rc = identical ? CLI_OK : CLI_DIFFER;
done:
  json_decref(first);
  json_decref(root);
  cli_records_free(&A);
  cli_records_free(&B);
  return rc;
}
