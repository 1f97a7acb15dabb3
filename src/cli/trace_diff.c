/*
 * trace_diff.c — `bitexact diff --trace A B` (docs/trace.md): two bitexact
 * traces (format version 1, JSON Lines: a header, then one entry per
 * traced value) compared entry by entry, matched by (step, phase, module,
 * what, slice). The first difference in A's order (A's entries are in
 * execution order: step, then forward, backward, optimizer) is reported
 * with its part of the value (the per-part hashes) and, when it lies among
 * the first values kept in "head", the element, both values and their ULP
 * distance in the entry's dtype; then how many entries differ, by module.
 * Exit 0 identical, 1 different, 2 error (a file that is not a trace, a
 * corrupt or truncated line, another format version, another model).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cli.h"
#include "elements.h"

#define TRACE_VERSION 1

typedef struct tentry {
  json_int_t step;
  const char *phase, *module, *what, *dtype, *hash, *blocks;
  json_int_t slice; /* -1: null */
  json_t *shape, *head, *obj;
  size_t line;
  int matched;
} tentry;

typedef struct trace {
  const char *path;
  json_t *header;
  tentry *e;
  size_t n;
  size_t *slot; /* open addressing over keys (index + 1; 0 empty) */
  size_t nslot;
} trace;

static void trace_free(trace *t) {
  for (size_t i = 0; i < t->n; i++) json_decref(t->e[i].obj);
  json_decref(t->header);
  free(t->e);
  free(t->slot);
  memset(t, 0, sizeof *t);
}

/* The hash of an entry's key (a long key is hashed by its first 1 KiB:
 * same_key decides). */
static uint64_t key_hash(const tentry *e) {
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "%lld|%lld|%s|%s|%s", (long long)e->step, (long long)e->slice,
                   e->phase, e->module, e->what);
  size_t len = n < 0 ? 0 : (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1;
  return (uint64_t)XXH3_64bits(buf, len);
}

static int same_key(const tentry *a, const tentry *b) {
  return a->step == b->step && a->slice == b->slice && !strcmp(a->phase, b->phase) &&
         !strcmp(a->module, b->module) && !strcmp(a->what, b->what);
}

static int is_hex(const char *s, size_t n) {
  if (strlen(s) != n) return 0;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return 1;
}

/* One entry line into e (borrowing o's strings); NULL or what is wrong. */
static const char *parse_entry(json_t *o, tentry *e) {
  static const char *const phases[] = {"forward", "backward", "optimizer"};
  json_t *v;
  if (!json_is_object(o)) return "not a JSON object";
  v = json_object_get(o, "step");
  if (!json_is_integer(v) || json_integer_value(v) < 0) return "\"step\" is not an integer >= 0";
  e->step = json_integer_value(v);
  const char *keys[5] = {"phase", "module", "what", "dtype", "hash"};
  const char **dst[5] = {&e->phase, &e->module, &e->what, &e->dtype, &e->hash};
  for (int i = 0; i < 5; i++) {
    v = json_object_get(o, keys[i]);
    if (!json_is_string(v)) {
      static char msg[64];
      snprintf(msg, sizeof msg, "\"%s\" is missing or not a string", keys[i]);
      return msg;
    }
    *dst[i] = json_string_value(v);
  }
  int ph = 0;
  for (int i = 0; i < 3; i++) ph |= !strcmp(e->phase, phases[i]);
  if (!ph) return "\"phase\" is not forward, backward or optimizer";
  if (strcmp(e->dtype, "F32") && strcmp(e->dtype, "F64") && strcmp(e->dtype, "F16") &&
      strcmp(e->dtype, "BF16"))
    return "\"dtype\" is not F32, F64, F16 or BF16";
  if (!is_hex(e->hash, 16)) return "\"hash\" is not 16 hex digits";
  v = json_object_get(o, "slice");
  if (json_is_null(v)) e->slice = -1;
  else if (json_is_integer(v) && json_integer_value(v) >= 0) e->slice = json_integer_value(v);
  else return "\"slice\" is not null or an integer >= 0";
  e->shape = json_object_get(o, "shape");
  if (!json_is_array(e->shape)) return "\"shape\" is not an array";
  int64_t numel = 1;
  size_t i;
  json_t *d;
  json_array_foreach(e->shape, i, d) {
    if (!json_is_integer(d) || json_integer_value(d) < 0) return "\"shape\" holds a bad dimension";
    numel *= json_integer_value(d);
    if (numel > ((int64_t)1 << 48)) return "\"shape\" is too large";
  }
  v = json_object_get(o, "blocks");
  int64_t nb = numel < 16 ? numel : 16;
  if (!json_is_string(v) || !is_hex(json_string_value(v), (size_t)(16 * nb)))
    return "\"blocks\" is not 16 hex digits per part (min(16, numel) parts)";
  e->blocks = json_string_value(v);
  e->head = json_object_get(o, "head");
  if (!json_is_array(e->head) || json_array_size(e->head) != (size_t)(numel < 8 ? numel : 8))
    return "\"head\" is not an array of min(8, numel) values";
  json_array_foreach(e->head, i, d) {
    char *end;
    if (!json_is_string(d)) return "\"head\" holds a non-string";
    (void)strtod(json_string_value(d), &end);
    if (*end || !*json_string_value(d)) return "\"head\" holds a value that is not a hex float";
  }
  return NULL;
}

static int load_trace(const char *path, trace *t) {
  memset(t, 0, sizeof *t);
  t->path = path;
  FILE *fp = fopen(path, "rb");
  if (!fp) return cli_error("%s: cannot open: %s", path, strerror(errno)), -1;
  char *line = NULL;
  size_t cap = 0, ncap = 0;
  ssize_t len;
  int rc = 0;
  for (size_t no = 1; (len = getline(&line, &cap, fp)) >= 0; no++) {
    if (len == 0 || line[len - 1] != '\n') {
      cli_error("%s: line %zu: truncated (no newline at the end of the file)", path, no);
      rc = -1;
      break;
    }
    json_error_t je;
    json_t *o = json_loadb(line, (size_t)len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
      cli_error("%s: line %zu: invalid JSON: %s", path, no, je.text);
      rc = -1;
      break;
    }
    if (no == 1) {
      json_t *v = json_object_get(o, "bitexact_trace");
      if (!json_is_integer(v)) {
        json_decref(o);
        cli_error("%s: not a bitexact trace (its first line has no \"bitexact_trace\" version)", path);
        rc = -1;
        break;
      }
      if (json_integer_value(v) != TRACE_VERSION) {
        cli_error("%s: trace format version %lld; this bitexact reads version %d", path,
                  (long long)json_integer_value(v), TRACE_VERSION);
        json_decref(o);
        rc = -1;
        break;
      }
      if (!json_is_string(json_object_get(o, "model"))) {
        json_decref(o);
        cli_error("%s: line 1: the header has no \"model\"", path);
        rc = -1;
        break;
      }
      t->header = o;
      continue;
    }
    if (t->n == ncap) {
      ncap = ncap ? 2 * ncap : 1024;
      tentry *ne = realloc(t->e, ncap * sizeof *ne);
      if (!ne) {
        json_decref(o);
        cli_error("%s: out of memory", path);
        rc = -1;
        break;
      }
      t->e = ne;
    }
    tentry *e = &t->e[t->n];
    memset(e, 0, sizeof *e);
    e->obj = o;
    e->line = no;
    const char *bad = parse_entry(o, e);
    if (bad) {
      cli_error("%s: line %zu: %s", path, no, bad);
      json_decref(o);
      rc = -1;
      break;
    }
    t->n++;
  }
  if (rc == 0 && ferror(fp)) rc = -1, cli_error("%s: cannot read the file", path);
  if (rc == 0 && !t->header) rc = -1, cli_error("%s: empty file (not a bitexact trace)", path);
  free(line);
  fclose(fp);
  if (rc) return -1;
  t->nslot = 16;
  while (t->nslot < 2 * t->n + 16) t->nslot *= 2;
  t->slot = calloc(t->nslot, sizeof *t->slot);
  if (!t->slot) return cli_error("%s: out of memory", path), -1;
  for (size_t i = 0; i < t->n; i++) {
    size_t s = (size_t)key_hash(&t->e[i]) & (t->nslot - 1);
    while (t->slot[s]) {
      if (same_key(&t->e[t->slot[s] - 1], &t->e[i]))
        return cli_error("%s: line %zu: the same entry as line %zu (step, phase, module, what, slice)",
                         path, t->e[i].line, t->e[t->slot[s] - 1].line), -1;
      s = (s + 1) & (t->nslot - 1);
    }
    t->slot[s] = i + 1;
  }
  return 0;
}

static tentry *find(trace *t, const tentry *k) {
  size_t s = (size_t)key_hash(k) & (t->nslot - 1);
  while (t->slot[s]) {
    tentry *e = &t->e[t->slot[s] - 1];
    if (same_key(e, k)) return e;
    s = (s + 1) & (t->nslot - 1);
  }
  return NULL;
}

static void key_text(const tentry *e, char *buf, size_t n) {
  if (e->slice >= 0)
    snprintf(buf, n, "step %lld, %s, %s, %s, sequence %lld", (long long)e->step, e->phase, e->module,
             e->what, (long long)e->slice);
  else
    snprintf(buf, n, "step %lld, %s, %s, %s", (long long)e->step, e->phase, e->module, e->what);
}

int diff_trace(const char *pa, const char *pb, const cli_opts *o) {
  trace A, B;
  int rc = CLI_ERROR;
  json_t *js = NULL;
  if (load_trace(pa, &A) || load_trace(pb, &B)) {
    trace_free(&A);
    trace_free(&B);
    return CLI_ERROR;
  }
  const char *ma = json_string_value(json_object_get(A.header, "model"));
  const char *mb = json_string_value(json_object_get(B.header, "model"));
  if (strcmp(ma, mb) != 0) {
    cli_error("diff --trace: %s traces model '%s', %s model '%s': traces of different models or "
              "configs are not compared", pa, ma, pb, mb);
    goto done;
  }
  size_t differ = 0, only_a = 0, only_b = 0;
  const tentry *fa = NULL, *fb = NULL;
  /* per module: the count of differing entries, in A's order of first difference */
  const char **mods = calloc(A.n + 1, sizeof *mods);
  size_t *mcount = calloc(A.n + 1, sizeof *mcount), nmods = 0;
  if (!mods || !mcount) {
    free(mods);
    free(mcount);
    cli_error("diff --trace: out of memory");
    goto done;
  }
  for (size_t i = 0; i < A.n; i++) {
    tentry *a = &A.e[i], *b = find(&B, a);
    int d;
    if (!b) {
      only_a++;
      d = 1;
    } else {
      b->matched = 1;
      d = strcmp(a->hash, b->hash) || strcmp(a->dtype, b->dtype) || !json_equal(a->shape, b->shape);
    }
    if (!d) continue;
    differ++;
    if (!fa) fa = a, fb = b;
    size_t m = 0;
    while (m < nmods && strcmp(mods[m], a->module) != 0) m++;
    if (m == nmods) mods[nmods++] = a->module;
    mcount[m]++;
  }
  for (size_t i = 0; i < B.n; i++) only_b += !B.e[i].matched;
  int identical = differ == 0 && only_b == 0;
  /* the first difference: its part and, when in the head, its element */
  char where[512] = "", va[48] = "", vb[48] = "";
  int64_t lo = -1, hi = -1, elem = -1, ulp = -1;
  if (fa) key_text(fa, where, sizeof where);
  if (fa && fb && !strcmp(fa->dtype, fb->dtype) && json_equal(fa->shape, fb->shape)) {
    int64_t numel = 1;
    size_t k;
    json_t *dm;
    json_array_foreach(fa->shape, k, dm) numel *= json_integer_value(dm);
    int64_t nb = numel < 16 ? numel : 16;
    for (int64_t j = 0; j < nb && lo < 0; j++)
      if (strncmp(fa->blocks + 16 * j, fb->blocks + 16 * j, 16) != 0)
        lo = j * numel / nb, hi = (j + 1) * numel / nb;
    for (int64_t i = lo < 0 ? 0 : lo; lo >= 0 && i < hi && i < (int64_t)json_array_size(fa->head); i++) {
      const char *x = json_string_value(json_array_get(fa->head, (size_t)i));
      const char *y = json_string_value(json_array_get(fb->head, (size_t)i));
      if (strcmp(x, y) != 0) {
        elem = i;
        snprintf(va, sizeof va, "%s", x);
        snprintf(vb, sizeof vb, "%s", y);
        st_dtype dt = !strcmp(fa->dtype, "F64")   ? ST_F64
                      : !strcmp(fa->dtype, "F16") ? ST_F16
                      : !strcmp(fa->dtype, "BF16") ? ST_BF16
                                                   : ST_F32;
        uint64_t u;
        if (elem_ulp_values(dt, strtod(x, NULL), strtod(y, NULL), &u) && u <= INT64_MAX)
          ulp = (int64_t)u;
        break;
      }
    }
  }
  FILE *out = cli_out();
  if (o->json) {
    js = json_pack("{s:b,s:s,s:I,s:I,s:I,s:I,s:I}", "identical", identical, "model", ma, "entries_a",
                   (json_int_t)A.n, "entries_b", (json_int_t)B.n, "differ", (json_int_t)differ,
                   "only_in_a", (json_int_t)only_a, "only_in_b", (json_int_t)only_b);
    if (fa) {
      json_t *f = json_pack("{s:I,s:s,s:s,s:s,s:s,s:b}", "step", (json_int_t)fa->step, "phase", fa->phase,
                            "module", fa->module, "what", fa->what, "dtype", fa->dtype, "in_b", fb != NULL);
      json_object_set_new(f, "slice", fa->slice >= 0 ? json_integer(fa->slice) : json_null());
      if (lo >= 0) {
        json_object_set_new(f, "elements", json_pack("[I,I]", (json_int_t)lo, (json_int_t)hi));
        json_object_set_new(f, "element", elem >= 0 ? json_integer(elem) : json_null());
        json_object_set_new(f, "a", elem >= 0 ? json_string(va) : json_null());
        json_object_set_new(f, "b", elem >= 0 ? json_string(vb) : json_null());
        json_object_set_new(f, "ulp", ulp >= 0 ? json_integer(ulp) : json_null());
      }
      json_object_set_new(js, "first", f);
      json_t *ms = json_array();
      for (size_t m = 0; m < nmods; m++)
        json_array_append_new(ms, json_pack("{s:s,s:I}", "module", mods[m], "differ", (json_int_t)mcount[m]));
      json_object_set_new(js, "modules", ms);
    }
    char *s = json_dumps(js, JSON_COMPACT);
    if (s) fprintf(out, "%s\n", s);
    free(s);
  } else if (identical) {
    fprintf(out, "identical: %zu entries, model %s\n", A.n, ma);
  } else {
    if (fa && !fb) {
      fprintf(out, "first difference: %s: only in %s\n", where, pa);
    } else if (fa) {
      fprintf(out, "first difference: %s (%s, %zu-d)\n", where, fa->dtype, json_array_size(fa->shape));
      if (strcmp(fa->dtype, fb->dtype) || !json_equal(fa->shape, fb->shape))
        fprintf(out, "  dtype or shape differ\n");
      else if (elem >= 0)
        fprintf(out, "  element %lld: %s vs %s (%lld ULP)\n", (long long)elem, va, vb, (long long)ulp);
      else if (lo >= 0)
        fprintf(out, "  first differing element in [%lld, %lld) (beyond the first values kept)\n",
                (long long)lo, (long long)hi);
    } else {
      fprintf(out, "first difference: entries only in %s\n", pb);
    }
    fprintf(out, "%zu of %zu entries differ (%zu only in %s, %zu only in %s)", differ, A.n, only_a, pa,
            only_b, pb);
    for (size_t m = 0; m < nmods && m < 10; m++)
      fprintf(out, "%s %s (%zu)", m ? "," : "; in", mods[m], mcount[m]);
    fprintf(out, "%s\n", nmods > 10 ? ", ..." : "");
  }
  rc = identical ? CLI_OK : CLI_DIFFER;
  free(mods);
  free(mcount);
done:
  json_decref(js);
  trace_free(&A);
  trace_free(&B);
  return rc;
}
