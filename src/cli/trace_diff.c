/*
 * trace_diff.c — `bitexact diff --trace A B` (docs/trace.md): two bitexact
 * traces (read and compared by trace_read.c) and what the command prints.
 * The first difference is the first entry of A (A's entries are in
 * execution order: step, then forward, backward, optimizer) that B also
 * has and whose dtype, shape or bits differ, with its part of the value
 * (the per-part hashes) and, when it lies among the first values kept in
 * "head", the element, both values and their ULP distance in the entry's
 * dtype; otherwise the part's element range and the --dump key that gets
 * the whole value. Then how many common entries differ, by module, and
 * the entries only in A or only in B (each side's first one named): two
 * frameworks' models rarely have the same set of submodules, so the first
 * *common* difference is what a user looks for. Exit 0 identical, 1
 * different (or entries on one side only), 2 error (a file that is not a
 * trace, a corrupt or truncated line, another format version, another
 * model).
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trace_read.h"

/* The whole file in *buf (malloc'd, *len bytes); -1 with the error printed. */
static int read_file(const char *path, char **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  FILE *fp = fopen(path, "rb");
  if (!fp) return cli_error("%s: cannot open: %s", path, strerror(errno)), -1;
  size_t cap = 0;
  int rc = 0;
  for (;;) {
    if (*len == cap) {
      size_t ncap = cap ? 2 * cap : (size_t)1 << 16;
      char *nb = realloc(*buf, ncap);
      if (!nb) {
        cli_error("%s: out of memory", path);
        rc = -1;
        break;
      }
      *buf = nb, cap = ncap;
    }
    size_t got = fread(*buf + *len, 1, cap - *len, fp);
    *len += got;
    if (got == 0) {
      if (ferror(fp)) cli_error("%s: cannot read the file", path), rc = -1;
      break;
    }
  }
  fclose(fp);
  if (rc) free(*buf), *buf = NULL;
  return rc;
}

static int load_trace(const char *path, trace_file *t) {
  char *buf, err[1024];
  size_t len;
  memset(t, 0, sizeof *t);
  if (read_file(path, &buf, &len)) return -1;
  int rc = trace_parse(buf, len, path, t, err, sizeof err);
  free(buf);
  if (rc) cli_error("%s", err);
  return rc;
}

static json_t *key_json(const tentry *e) {
  json_t *k = json_pack("{s:I,s:s,s:s,s:s}", "step", (json_int_t)e->step, "phase", e->phase, "module",
                        e->module, "what", e->what);
  json_object_set_new(k, "slice", e->slice >= 0 ? json_integer(e->slice) : json_null());
  return k;
}

static void print_json(FILE *out, const trace_file *A, const trace_file *B, const trace_cmp *r,
                       const char *model, int identical) {
  json_t *js = json_pack("{s:b,s:s,s:I,s:I,s:I,s:I,s:I}", "identical", identical, "model", model,
                         "entries_a", (json_int_t)A->n, "entries_b", (json_int_t)B->n, "differ",
                         (json_int_t)r->differ, "only_in_a", (json_int_t)r->only_a, "only_in_b",
                         (json_int_t)r->only_b);
  json_t *f = json_null();
  if (r->fa) {
    char dk[1024];
    f = key_json(r->fa);
    trace_dump_key(r->fa, dk, sizeof dk);
    json_object_set_new(f, "dtype", json_string(r->fa->dtype));
    json_object_set_new(f, "dtype_b", json_string(r->fb->dtype));
    json_object_set_new(f, "same_layout", json_boolean(r->same_layout));
    json_object_set_new(f, "dump_key", json_string(dk));
    if (r->lo >= 0) {
      json_object_set_new(f, "elements", json_pack("[I,I]", (json_int_t)r->lo, (json_int_t)r->hi));
      json_object_set_new(f, "element", r->elem >= 0 ? json_integer(r->elem) : json_null());
      json_object_set_new(f, "a", r->elem >= 0 ? json_string(r->va) : json_null());
      json_object_set_new(f, "b", r->elem >= 0 ? json_string(r->vb) : json_null());
      json_object_set_new(f, "ulp", r->ulp >= 0 ? json_integer(r->ulp) : json_null());
    }
  }
  json_object_set_new(js, "first", f);
  json_object_set_new(js, "first_only_in_a", r->first_only_a ? key_json(r->first_only_a) : json_null());
  json_object_set_new(js, "first_only_in_b", r->first_only_b ? key_json(r->first_only_b) : json_null());
  json_t *ms = json_array();
  for (size_t m = 0; m < r->nmods; m++)
    json_array_append_new(ms, json_pack("{s:s,s:I}", "module", r->mods[m], "differ", (json_int_t)r->mcount[m]));
  json_object_set_new(js, "modules", ms);
  char *s = json_dumps(js, JSON_COMPACT);
  if (s) fprintf(out, "%s\n", s);
  free(s);
  json_decref(js);
}

static void print_text(FILE *out, const char *pa, const char *pb, const trace_file *A,
                       const trace_cmp *r) {
  char where[1024], dk[1024];
  size_t common = A->n - r->only_a;
  if (r->fa) {
    trace_key_text(r->fa, where, sizeof where);
    fprintf(out, "first difference: %s (%s, %zu-d)\n", where, r->fa->dtype, json_array_size(r->fa->shape));
    if (!r->same_layout) {
      char sa[256], sb[256];
      char *ja = json_dumps(r->fa->shape, JSON_COMPACT), *jb = json_dumps(r->fb->shape, JSON_COMPACT);
      snprintf(sa, sizeof sa, "%s %s", r->fa->dtype, ja ? ja : "?");
      snprintf(sb, sizeof sb, "%s %s", r->fb->dtype, jb ? jb : "?");
      free(ja);
      free(jb);
      fprintf(out, "  dtype or shape differ: %s vs %s\n", sa, sb);
    } else if (r->elem >= 0) {
      if (r->ulp >= 0)
        fprintf(out, "  element %lld: %s vs %s (%lld ULP)\n", (long long)r->elem, r->va, r->vb, (long long)r->ulp);
      else
        fprintf(out, "  element %lld: %s vs %s (no ULP distance: a NaN, or a value not in %s)\n",
                (long long)r->elem, r->va, r->vb, r->fa->dtype);
    } else if (r->lo >= 0) {
      trace_dump_key(r->fa, dk, sizeof dk);
      fprintf(out, "  first differing element in [%lld, %lld) (beyond the first values kept)\n",
              (long long)r->lo, (long long)r->hi);
      fprintf(out, "  rerun both with --dump '%s' and bitexact diff the two .dump.safetensors files\n", dk);
    }
  } else {
    fprintf(out, "first difference: none among the %zu common entries; entries only in one trace "
            "(%zu only in %s, %zu only in %s)\n", common, r->only_a, pa, r->only_b, pb);
  }
  fprintf(out, "%zu of %zu common entries differ", r->differ, common);
  for (size_t m = 0; m < r->nmods && m < 10; m++)
    fprintf(out, "%s %s (%zu)", m ? "," : "; in", r->mods[m], r->mcount[m]);
  fprintf(out, "%s\n", r->nmods > 10 ? ", ..." : "");
  if (r->first_only_a) {
    trace_key_text(r->first_only_a, where, sizeof where);
    fprintf(out, "%zu entries only in %s (first: %s)\n", r->only_a, pa, where);
  }
  if (r->first_only_b) {
    trace_key_text(r->first_only_b, where, sizeof where);
    fprintf(out, "%zu entries only in %s (first: %s)\n", r->only_b, pb, where);
  }
}

int diff_trace(const char *pa, const char *pb, const cli_opts *o) {
  trace_file A, B;
  trace_cmp r;
  char err[512];
  memset(&B, 0, sizeof B);
  if (load_trace(pa, &A) || load_trace(pb, &B)) {
    trace_free(&A);
    trace_free(&B);
    return CLI_ERROR;
  }
  int rc = CLI_ERROR;
  const char *ma = json_string_value(json_object_get(A.header, "model"));
  const char *mb = json_string_value(json_object_get(B.header, "model"));
  if (strcmp(ma, mb) != 0) {
    cli_error("diff --trace: %s traces model '%s', %s model '%s': traces of different models or "
              "configs are not compared (the tracers' model= sets one id for both)", pa, ma, pb, mb);
    goto done;
  }
  if (trace_compare(&A, &B, &r, err, sizeof err)) {
    cli_error("%s", err);
    goto done;
  }
  int identical = r.differ == 0 && r.only_a == 0 && r.only_b == 0;
  FILE *out = cli_out();
  if (o->json) print_json(out, &A, &B, &r, ma, identical);
  else if (identical) fprintf(out, "identical: %zu entries, model %s\n", A.n, ma);
  else print_text(out, pa, pb, &A, &r);
  rc = identical ? CLI_OK : CLI_DIFFER;
  trace_cmp_free(&r);
done:
  trace_free(&A);
  trace_free(&B);
  return rc;
}
