/*
 * trace_read.c — bitexact traces (format version 1, docs/trace.md) read
 * from memory and compared entry by entry (trace_read.h). A trace is a
 * header line and one JSON object per entry; every line is checked
 * (fields, types, hex digits, the per-part hashes and head values
 * matching the shape), and two entries with the same key are refused, so
 * that the comparison can trust what it reads.
 */
#include "trace_read.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "elements.h"

#define HEAD_VALUES 8
#define PARTS 16

static void set_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t n, const char *fmt, ...) {
  if (!err || !n) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
  for (char *c = err; *c; c++) /* one line */
    if (*c == '\n' || *c == '\r') *c = ' ';
}

void trace_free(trace_file *t) {
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

/* One entry line into e (borrowing o's strings); NULL, or what is wrong
 * (a fixed text, or bad[] filled). */
static const char *parse_entry(json_t *o, tentry *e, char *bad, size_t nbad) {
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
      snprintf(bad, nbad, "\"%s\" is missing or not a string", keys[i]);
      return bad;
    }
    *dst[i] = json_string_value(v);
  }
  int ph = 0;
  for (int i = 0; i < 3; i++) ph |= !strcmp(e->phase, phases[i]);
  if (!ph) return "\"phase\" is not forward, backward or optimizer";
  if (!*e->module) return "\"module\" is empty";
  if (!*e->what) return "\"what\" is empty";
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
    if (json_integer_value(d) > ((int64_t)1 << 48)) return "\"shape\" is too large";
    numel *= json_integer_value(d);
    if (numel > ((int64_t)1 << 48)) return "\"shape\" is too large";
  }
  e->numel = numel;
  v = json_object_get(o, "blocks");
  int64_t nb = numel < PARTS ? numel : PARTS;
  if (!json_is_string(v) || !is_hex(json_string_value(v), (size_t)(16 * nb)))
    return "\"blocks\" is not 16 hex digits per part (min(16, numel) parts)";
  e->blocks = json_string_value(v);
  e->head = json_object_get(o, "head");
  if (!json_is_array(e->head) ||
      json_array_size(e->head) != (size_t)(numel < HEAD_VALUES ? numel : HEAD_VALUES))
    return "\"head\" is not an array of min(8, numel) values";
  json_array_foreach(e->head, i, d) {
    char *end;
    if (!json_is_string(d)) return "\"head\" holds a non-string";
    (void)strtod(json_string_value(d), &end);
    if (*end || !*json_string_value(d)) return "\"head\" holds a value that is not a hex float";
  }
  return NULL;
}

static int parse_header(json_t *o, const char *name, char *err, size_t errlen) {
  json_t *v = json_object_get(o, "bitexact_trace");
  if (!json_is_integer(v)) {
    set_err(err, errlen, "%s: not a bitexact trace (its first line has no \"bitexact_trace\" version)", name);
    return -1;
  }
  if (json_integer_value(v) != TRACE_VERSION) {
    set_err(err, errlen, "%s: trace format version %lld; this bitexact reads version %d", name,
            (long long)json_integer_value(v), TRACE_VERSION);
    return -1;
  }
  if (!json_is_string(json_object_get(o, "model"))) {
    set_err(err, errlen, "%s: line 1: the header has no \"model\"", name);
    return -1;
  }
  return 0;
}

int trace_parse(const char *buf, size_t len, const char *name, trace_file *t, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  size_t ncap = 0, at = 0;
  int rc = 0;
  for (size_t no = 1; at < len; no++) {
    const char *nl = memchr(buf + at, '\n', len - at);
    if (!nl) {
      set_err(err, errlen, "%s: line %zu: truncated (no newline at the end of the file)", name, no);
      rc = -1;
      break;
    }
    size_t ll = (size_t)(nl - (buf + at)) + 1;
    json_error_t je;
    json_t *o = json_loadb(buf + at, ll, JSON_REJECT_DUPLICATES, &je);
    at += ll;
    if (!o) {
      set_err(err, errlen, "%s: line %zu: invalid JSON: %s", name, no, je.text);
      rc = -1;
      break;
    }
    if (no == 1) {
      if (!json_is_object(o) || parse_header(o, name, err, errlen)) {
        if (!json_is_object(o))
          set_err(err, errlen, "%s: not a bitexact trace (its first line is not a JSON object)", name);
        json_decref(o);
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
        set_err(err, errlen, "%s: out of memory", name);
        rc = -1;
        break;
      }
      t->e = ne;
    }
    tentry *e = &t->e[t->n];
    memset(e, 0, sizeof *e);
    e->obj = o;
    e->line = no;
    char why[96];
    const char *bad = parse_entry(o, e, why, sizeof why);
    if (bad) {
      set_err(err, errlen, "%s: line %zu: %s", name, no, bad);
      json_decref(o);
      rc = -1;
      break;
    }
    t->n++;
  }
  if (rc == 0 && !t->header) rc = -1, set_err(err, errlen, "%s: empty file (not a bitexact trace)", name);
  if (rc == 0) {
    t->nslot = 16;
    while (t->nslot < 2 * t->n + 16) t->nslot *= 2;
    t->slot = calloc(t->nslot, sizeof *t->slot);
    if (!t->slot) rc = -1, set_err(err, errlen, "%s: out of memory", name);
  }
  for (size_t i = 0; rc == 0 && i < t->n; i++) {
    size_t s = (size_t)key_hash(&t->e[i]) & (t->nslot - 1);
    while (t->slot[s]) {
      if (same_key(&t->e[t->slot[s] - 1], &t->e[i])) {
        set_err(err, errlen, "%s: line %zu: the same entry as line %zu (step, phase, module, what, slice)",
                name, t->e[i].line, t->e[t->slot[s] - 1].line);
        rc = -1;
        break;
      }
      s = (s + 1) & (t->nslot - 1);
    }
    if (rc == 0) t->slot[s] = i + 1;
  }
  if (rc) trace_free(t);
  return rc;
}

const tentry *trace_find(const trace_file *t, const tentry *k) {
  if (!t->nslot) return NULL;
  size_t s = (size_t)key_hash(k) & (t->nslot - 1);
  while (t->slot[s]) {
    const tentry *e = &t->e[t->slot[s] - 1];
    if (same_key(e, k)) return e;
    s = (s + 1) & (t->nslot - 1);
  }
  return NULL;
}

void trace_key_text(const tentry *e, char *buf, size_t n) {
  if (e->slice >= 0)
    snprintf(buf, n, "step %lld, %s, %s, %s, sequence %lld", (long long)e->step, e->phase, e->module,
             e->what, (long long)e->slice);
  else
    snprintf(buf, n, "step %lld, %s, %s, %s, whole", (long long)e->step, e->phase, e->module, e->what);
}

void trace_dump_key(const tentry *e, char *buf, size_t n) {
  if (e->slice >= 0)
    snprintf(buf, n, "%lld/%s/%s/%s/%lld", (long long)e->step, e->phase, e->module, e->what,
             (long long)e->slice);
  else
    snprintf(buf, n, "%lld/%s/%s/%s/-", (long long)e->step, e->phase, e->module, e->what);
}

void trace_cmp_free(trace_cmp *r) {
  free(r->mods);
  free(r->mcount);
  memset(r, 0, sizeof *r);
}

static int entries_differ(const tentry *a, const tentry *b) {
  return strcmp(a->hash, b->hash) || strcmp(a->dtype, b->dtype) || !json_equal(a->shape, b->shape);
}

/* The first differing part of r->fa / r->fb and, when in the head, the
 * element, both values and their ULP distance. */
static void locate(trace_cmp *r) {
  const tentry *a = r->fa, *b = r->fb;
  r->same_layout = !strcmp(a->dtype, b->dtype) && json_equal(a->shape, b->shape);
  if (!r->same_layout) return;
  int64_t numel = a->numel, nb = numel < PARTS ? numel : PARTS;
  for (int64_t j = 0; j < nb && r->lo < 0; j++)
    if (strncmp(a->blocks + 16 * j, b->blocks + 16 * j, 16) != 0)
      r->lo = j * numel / nb, r->hi = (j + 1) * numel / nb;
  int64_t nh = (int64_t)json_array_size(a->head);
  for (int64_t i = r->lo; r->lo >= 0 && i < r->hi && i < nh; i++) {
    const char *x = json_string_value(json_array_get(a->head, (size_t)i));
    const char *y = json_string_value(json_array_get(b->head, (size_t)i));
    if (strcmp(x, y) != 0) {
      r->elem = i, r->va = x, r->vb = y;
      st_dtype dt = !strcmp(a->dtype, "F64")    ? ST_F64
                    : !strcmp(a->dtype, "F16")  ? ST_F16
                    : !strcmp(a->dtype, "BF16") ? ST_BF16
                                                : ST_F32;
      uint64_t u;
      if (elem_ulp_values(dt, strtod(x, NULL), strtod(y, NULL), &u) && u <= INT64_MAX) r->ulp = (int64_t)u;
      break;
    }
  }
}

int trace_compare(const trace_file *A, const trace_file *B, trace_cmp *r, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  r->lo = r->hi = r->elem = r->ulp = -1;
  r->mods = calloc(A->n + 1, sizeof *r->mods);
  r->mcount = calloc(A->n + 1, sizeof *r->mcount);
  if (!r->mods || !r->mcount) {
    trace_cmp_free(r);
    set_err(err, errlen, "diff --trace: out of memory");
    return -1;
  }
  for (size_t i = 0; i < A->n; i++) {
    const tentry *a = &A->e[i], *b = trace_find(B, a);
    if (!b) {
      if (!r->only_a++) r->first_only_a = a;
      continue;
    }
    if (!entries_differ(a, b)) continue;
    if (!r->differ++) r->fa = a, r->fb = b;
    size_t m = 0;
    while (m < r->nmods && strcmp(r->mods[m], a->module) != 0) m++;
    if (m == r->nmods) r->mods[r->nmods++] = a->module;
    r->mcount[m]++;
  }
  for (size_t i = 0; i < B->n; i++)
    if (!trace_find(A, &B->e[i]) && !r->only_b++) r->first_only_b = &B->e[i];
  if (r->fa) locate(r);
  return 0;
}
