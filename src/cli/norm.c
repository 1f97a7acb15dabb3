/*
 * norm.c — `bitexact norm FILE...`: the exact norm of every floating
 * tensor of one or more safetensors files, per tensor, per group and in
 * total, in one pass over the memory-mapped data.
 *
 * p = 2 and p = 1: the tensors are cut into chunks of at most 16 MiB;
 * worker threads run bx_acc_add_squares / bx_acc_add_abs on a chunk into a
 * fresh accumulator and merge it into the tensor's (integer addition: the
 * order cannot matter); tensor accumulators merge into group and total
 * accumulators, and each is rounded once. The result is bit for bit what
 * bx_total_norm gives on the same tensors, for any thread count.
 * p = inf, -inf, 0: bx_total_norm per chunk (one thread each); max, min
 * and counts combine exactly. Other p: norm_pow.c (one bx_total_norm call
 * over all tensors and one more for --group, since |x|^p sums are not
 * exposed as accumulators; no progress bar there).
 *
 * A name present in several files is read as shards of one tensor: its
 * norm covers all of its elements (how tensor-parallel dumps come).
 */
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <bitexact.h>

#include "norm_internal.h"

DLDataType norm_dl_dtype(st_dtype dt) {
  DLDataType d = {kDLFloat, 32, 1};
  if (dt == ST_F16) d.bits = 16;
  else if (dt == ST_BF16) d.code = kDLBfloat, d.bits = 16;
  else if (dt == ST_F64) d.bits = 64;
  return d;
}

static int is_norm_dtype(st_dtype dt) {
  return dt == ST_F16 || dt == ST_BF16 || dt == ST_F32 || dt == ST_F64;
}

static void job_fail(norm_job *j, const shard *s, bx_status st) {
  pthread_mutex_lock(&j->lock);
  if (!atomic_load(&j->failed))
    snprintf(j->error, sizeof j->error, "%s: tensor '%s': %s: %s", j->files[s->file].path,
             s->t->name, bx_status_str(st), bx_last_error());
  atomic_store(&j->failed, 1);
  pthread_mutex_unlock(&j->lock);
}

static void norm_worker(void *ctx, int worker) {
  norm_job *j = ctx;
  (void)worker;
  void *scratch = NULL;
  bx_acc local;
  for (;;) {
    size_t k = atomic_fetch_add(&j->next, 1);
    if (k >= j->nitems || atomic_load(&j->failed)) break;
    item *it = &j->items[k];
    shard *s = &j->shards[it->shard];
    utensor *u = &j->tensors[s->id];
    size_t es = st_dtype_get(it->dt)->bits / 8;
    const void *p = cli_aligned(it->data, it->n * es, es, &scratch, CHUNK_BYTES);
    if (!p) {
      job_fail(j, s, BX_ENOMEM);
      break;
    }
    int64_t shape = (int64_t)it->n;
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)p;
    t.device.device_type = kDLCPU;
    t.ndim = 1;
    t.dtype = norm_dl_dtype(it->dt);
    t.shape = &shape;
    bx_status st;
    if (j->mode == ORD_SQ || j->mode == ORD_ABS) {
      bx_acc_init(&local);
      st = j->mode == ORD_SQ ? bx_acc_add_squares(&local, &t) : bx_acc_add_abs(&local, &t);
      if (st == BX_OK) {
        pthread_mutex_lock(&j->lock);
        bx_acc_merge(&j->accs[s->id], &local);
        if (local.nan_count || local.inf_count) s->nonfinite = 1;
        pthread_mutex_unlock(&j->lock);
      }
    } else {
      bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
      o.norm_type = j->ord;
      o.num_threads = 1;
      bx_group g = {&t, 1};
      double v = 0;
      st = bx_total_norm(&g, 1, NULL, &o, &v, NULL);
      if (st == BX_OK) {
        pthread_mutex_lock(&j->lock);
        /* a non-finite max / min comes from a NaN/Inf in this chunk (the
         * count of p = 0 never is one) */
        if (!isfinite(v)) s->nonfinite = 1;
        if (isnan(v)) u->nan = 1;
        else if (j->mode == ORD_NNZ) u->nnz += (uint64_t)v;
        else if (!u->any) u->ext = v;
        else if (j->mode == ORD_MAX ? v > u->ext : v < u->ext) u->ext = v;
        u->any = 1;
        pthread_mutex_unlock(&j->lock);
      }
    }
    if (st != BX_OK) {
      job_fail(j, s, st);
      break;
    }
    cli_progress_add(&j->progress, it->n * es);
  }
  free(scratch);
}

/* EXT-mode state of a set of tensors combined into one norm. */
typedef struct ext_state {
  int nan, any;
  double ext;
  uint64_t nnz;
} ext_state;

static void ext_add(ord_mode m, ext_state *e, const utensor *u) {
  if (u->nan) e->nan = 1;
  e->nnz += u->nnz;
  if (!u->any) return;
  if (!e->any || (m == ORD_MAX ? u->ext > e->ext : u->ext < e->ext)) e->ext = u->ext;
  e->any = 1;
}

static double ext_value(ord_mode m, const ext_state *e) {
  if (e->nan) return NAN;
  if (m == ORD_NNZ) return (double)e->nnz;
  return e->any ? e->ext : 0.0;
}

/* The norm an accumulator holds (the library's one rounding, with its
 * NaN/Inf rules). */
static double acc_value(ord_mode m, const bx_acc *a) {
  double v = NAN;
  DLDataType f64 = {kDLFloat, 64, 1};
  bx_acc_norm(a, m == ORD_SQ ? 2.0 : 1.0, f64, &v); /* cannot fail: our own accumulators */
  return v;
}

static int cmp_shard(const void *a, const void *b) {
  const shard *x = a, *y = b;
  size_t n = x->t->name_len < y->t->name_len ? x->t->name_len : y->t->name_len;
  int c = memcmp(x->t->name, y->t->name, n);
  if (c) return c;
  if (x->t->name_len != y->t->name_len) return x->t->name_len < y->t->name_len ? -1 : 1;
  return (x->file > y->file) - (x->file < y->file);
}

/* by address: within a file, forwards */
static int cmp_item(const void *a, const void *b) {
  const item *x = a, *y = b;
  return (x->data > y->data) - (x->data < y->data);
}

static int parse_ord(const char *s, double *ord, ord_mode *m) {
  char *end;
  double p = strtod(s, &end);
  if (end == s || *end || isnan(p) || (p < 0 && p != -INFINITY)) {
    cli_error("--ord: '%s' is not a norm order (2, 1, inf, -inf, 0 or any p > 0)", s);
    return -1;
  }
  *ord = p;
  *m = p == 2 ? ORD_SQ : p == 1 ? ORD_ABS : p == INFINITY ? ORD_MAX
     : p == -INFINITY ? ORD_MIN : p == 0 ? ORD_NNZ : ORD_POW;
  return 0;
}

static void usage_norm(void) {
  fputs("usage: bitexact norm [--ord P] [--group NAME=GLOB]... [--json] [--threads N]\n"
        "                     [-q] [--error-if-nonfinite] [--[no-]progress] FILE...\n"
        "(bitexact --help for details)\n", stderr);
}

/* json_real, or null for NaN/Inf (not JSON numbers; the _hex twin says which) */
static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *jhex(double v) {
  char b[40];
  cli_hex(v, b, sizeof b);
  return json_string(b);
}

static void print_line(FILE *out, double v, const char *dtype, const char *shape,
                       const char *name) {
  char hex[40];
  cli_hex(v, hex, sizeof hex);
  fprintf(out, "%-24.17g %-24s %-8s %-18s %s\n", v, hex, dtype, shape, name);
}

int cmd_norm(int argc, char **argv) {
  cli_opts o = {0, 0, -1, 0};
  double ord = 2;
  ord_mode mode = ORD_SQ;
  group_def groups[MAX_GROUPS];
  size_t ngroups = 0, nfiles = 0;
  int error_nonfinite = 0;
  char **paths = calloc((size_t)argc, sizeof *paths);
  if (!paths) return cli_error("out of memory"), CLI_ERROR;
  for (int i = 1; i < argc; i++) {
    int c = cli_common_opt(argc, argv, &i, &o);
    if (c < 0) return free(paths), CLI_ERROR;
    if (c) continue;
    const char *a = argv[i], *val = NULL;
    if ((strcmp(a, "--ord") == 0 || strcmp(a, "--group") == 0) && i + 1 < argc) val = argv[++i];
    else if (strncmp(a, "--ord=", 6) == 0) val = a + 6, a = "--ord";
    else if (strncmp(a, "--group=", 8) == 0) val = a + 8, a = "--group";
    if (val && strcmp(a, "--ord") == 0) {
      if (parse_ord(val, &ord, &mode)) return free(paths), CLI_ERROR;
    } else if (val && strcmp(a, "--group") == 0) {
      char *eq = strchr(val, '=');
      if (!eq || eq == val || !eq[1] || ngroups == MAX_GROUPS) {
        cli_error("--group: '%s' is not NAME=GLOB (at most %d groups)", val, MAX_GROUPS);
        return free(paths), CLI_ERROR;
      }
      *eq = 0;
      for (size_t g = 0; g < ngroups; g++)
        if (strcmp(groups[g].name, val) == 0) {
          cli_error("--group: group '%s' given twice", val);
          return free(paths), CLI_ERROR;
        }
      groups[ngroups++] = (group_def){val, eq + 1};
    } else if (strcmp(a, "--error-if-nonfinite") == 0) {
      error_nonfinite = 1;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage_norm();
      return free(paths), CLI_OK;
    } else if (a[0] == '-' && a[1]) {
      cli_error("norm: unknown option '%s'", a);
      usage_norm();
      return free(paths), CLI_ERROR;
    } else {
      paths[nfiles++] = argv[i];
    }
  }
  if (nfiles == 0) {
    cli_error("norm: no input file");
    usage_norm();
    return free(paths), CLI_ERROR;
  }

  int rc = CLI_ERROR;
  st_file *files = calloc(nfiles, sizeof *files);
  norm_job j;
  memset(&j, 0, sizeof j);
  pthread_mutex_init(&j.lock, NULL);
  void **copies = NULL;
  size_t nshard = 0;
  json_t *root = NULL;
  if (!files) {
    cli_error("out of memory");
    goto done_nofiles;
  }
  if (cli_open_files(paths, nfiles, files) != 0) goto done_nofiles;

  /* shards sorted by (name, file); equal names form one tensor */
  for (size_t f = 0; f < nfiles; f++) nshard += files[f].count;
  j.files = files;
  j.mode = mode;
  j.ord = ord;
  j.shards = calloc(nshard ? nshard : 1, sizeof *j.shards);
  j.tensors = calloc(nshard ? nshard : 1, sizeof *j.tensors);
  if (!j.shards || !j.tensors) {
    cli_error("out of memory");
    goto done;
  }
  for (size_t f = 0, k = 0; f < nfiles; f++)
    for (size_t t = 0; t < files[f].count; t++) j.shards[k++] = (shard){f, &files[f].tensors[t], 0, 0};
  qsort(j.shards, nshard, sizeof *j.shards, cmp_shard);
  size_t nuniq = 0, nskipped = 0;
  uint64_t total_bytes = 0, total_elems = 0, nitems = 0;
  for (size_t s = 0; s < nshard; s++) {
    if (s == 0 || cmp_shard(&(shard){0, j.shards[s - 1].t, 0, 0}, &(shard){0, j.shards[s].t, 0, 0})) {
      j.tensors[nuniq] = (utensor){.name = j.shards[s].t->name, .first = s, .included = 1};
      nuniq++;
    }
    utensor *u = &j.tensors[nuniq - 1];
    j.shards[s].id = nuniq - 1;
    u->nshards++;
    u->nelem += j.shards[s].t->nelem;
    if (!is_norm_dtype(j.shards[s].t->dtype)) u->included = 0;
  }
  for (size_t u = 0; u < nuniq; u++) {
    if (!j.tensors[u].included) {
      nskipped++;
      continue;
    }
    for (size_t s = j.tensors[u].first; s < j.tensors[u].first + j.tensors[u].nshards; s++) {
      const st_tensor *t = j.shards[s].t;
      total_bytes += t->end - t->begin;
      total_elems += t->nelem;
      nitems += (t->end - t->begin + CHUNK_BYTES - 1) / CHUNK_BYTES;
    }
  }
  if (nskipped) {
    size_t first = 0;
    while (j.tensors[first].included) first++;
    const st_tensor *t = j.shards[j.tensors[first].first].t;
    cli_note("%zu tensor%s skipped: not F16/BF16/F32/F64 (e.g. '%s', %s in %s)", nskipped,
             nskipped > 1 ? "s" : "", t->name, st_dtype_get(t->dtype)->name,
             files[j.shards[j.tensors[first].first].file].path);
  }

  double total = 0, gnorm[MAX_GROUPS];
  if (mode == ORD_POW) {
    if (norm_pow(&j, nshard, nuniq, groups, ngroups, cli_threads(&o), error_nonfinite, &total,
                 gnorm, &copies) != 0)
      goto done;
  } else {
    j.items = calloc(nitems ? nitems : 1, sizeof *j.items);
    if (mode == ORD_SQ || mode == ORD_ABS) j.accs = malloc((nuniq ? nuniq : 1) * sizeof *j.accs);
    if (!j.items || ((mode == ORD_SQ || mode == ORD_ABS) && !j.accs)) {
      cli_error("out of memory");
      goto done;
    }
    for (size_t u = 0; j.accs && u < nuniq; u++) bx_acc_init(&j.accs[u]);
    /* items in file order, so that the workers walk each file forwards */
    size_t k = 0;
    for (size_t f = 0; f < nfiles; f++) {
      for (size_t s = 0; s < nshard; s++) {
        const st_tensor *t = j.shards[s].t;
        if (j.shards[s].file != f || !j.tensors[j.shards[s].id].included) continue;
        size_t es = st_dtype_get(t->dtype)->bits / 8;
        uint64_t per = CHUNK_BYTES / es;
        for (uint64_t off = 0; off < t->nelem; off += per)
          j.items[k++] = (item){t->data + off * es, t->nelem - off < per ? t->nelem - off : per,
                                t->dtype, s};
      }
    }
    j.nitems = k;
    atomic_init(&j.next, 0);
    atomic_init(&j.failed, 0);
    qsort(j.items, k, sizeof *j.items, cmp_item);
    cli_progress_init(&j.progress, &o, "norm", total_bytes);
    cli_parallel(cli_threads(&o), norm_worker, &j, &j.progress);
    if (atomic_load(&j.failed)) {
      cli_error("%s", j.error);
      goto done;
    }
    /* round each tensor, group and the total once */
    bx_acc acc_total, acc_group;
    ext_state e_total = {0, 0, 0, 0};
    bx_acc_init(&acc_total);
    for (size_t u = 0; u < nuniq; u++) {
      utensor *t = &j.tensors[u];
      if (!t->included) continue;
      if (j.accs) {
        t->norm = acc_value(mode, &j.accs[u]);
        bx_acc_merge(&acc_total, &j.accs[u]);
      } else {
        ext_state e = {0, 0, 0, 0};
        ext_add(mode, &e, t);
        t->norm = ext_value(mode, &e);
        ext_add(mode, &e_total, t);
      }
    }
    total = j.accs ? acc_value(mode, &acc_total) : ext_value(mode, &e_total);
    for (size_t g = 0; g < ngroups; g++) {
      ext_state e = {0, 0, 0, 0};
      bx_acc_init(&acc_group);
      for (size_t u = 0; u < nuniq; u++) {
        if (!j.tensors[u].included || fnmatch(groups[g].glob, j.tensors[u].name, 0) != 0) continue;
        if (j.accs) bx_acc_merge(&acc_group, &j.accs[u]);
        else ext_add(mode, &e, &j.tensors[u]);
      }
      gnorm[g] = j.accs ? acc_value(mode, &acc_group) : ext_value(mode, &e);
    }
    /* torch's rule (the library's): only a non-finite total fails */
    if (error_nonfinite && !isfinite(total)) {
      size_t s = 0;
      while (s < nshard && !j.shards[s].nonfinite) s++;
      if (s < nshard)
        cli_error("%s: tensor '%s' holds NaN or Inf (--error-if-nonfinite)",
                  files[j.shards[s].file].path, j.shards[s].t->name);
      else
        cli_error("the total norm is %s: it overflows fp64 (--error-if-nonfinite)",
                  isnan(total) ? "NaN" : "infinite");
      goto done;
    }
  }

  FILE *out = cli_out();
  if (o.json) {
    root = json_object();
    json_t *jt = json_object(), *jth = json_object(), *jg = json_object(), *jgh = json_object();
    json_t *jf = json_array(), *jskip = json_object();
    for (size_t f = 0; f < nfiles; f++) json_array_append_new(jf, json_string(paths[f]));
    json_object_set_new(root, "files", jf);
    json_object_set_new(root, "ord", isfinite(ord) ? json_real(ord) : json_string(ord > 0 ? "inf" : "-inf"));
    json_object_set_new(root, "total_norm", jnum(total));
    json_object_set_new(root, "total_norm_hex", jhex(total));
    json_object_set_new(root, "elements", json_integer((json_int_t)total_elems));
    for (size_t u = 0; u < nuniq; u++) {
      const utensor *t = &j.tensors[u];
      if (!t->included) {
        json_object_set_new(jskip, t->name, json_string(st_dtype_get(j.shards[t->first].t->dtype)->name));
        continue;
      }
      json_object_set_new(jt, t->name, jnum(t->norm));
      json_object_set_new(jth, t->name, jhex(t->norm));
    }
    for (size_t g = 0; g < ngroups; g++) {
      json_object_set_new(jg, groups[g].name, jnum(gnorm[g]));
      json_object_set_new(jgh, groups[g].name, jhex(gnorm[g]));
    }
    json_object_set_new(root, "tensors", jt);
    json_object_set_new(root, "tensors_hex", jth);
    json_object_set_new(root, "groups", jg);
    json_object_set_new(root, "groups_hex", jgh);
    json_object_set_new(root, "skipped", jskip);
    if (json_dumpf(root, out, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) != 0) {
      cli_error("cannot format the JSON output");
      goto done;
    }
    fputc('\n', out);
  } else {
    if (!o.quiet) {
      fprintf(out, "%-24s %-24s %-8s %-18s %s\n", "norm", "hex", "dtype", "shape", "tensor");
      for (size_t u = 0; u < nuniq; u++) {
        const utensor *t = &j.tensors[u];
        if (!t->included) continue;
        char shape[64], dt[24];
        const st_tensor *s0 = j.shards[t->first].t;
        st_shape_str(s0, shape, sizeof shape);
        if (t->nshards > 1) snprintf(shape, sizeof shape, "%zu shards", t->nshards);
        snprintf(dt, sizeof dt, "%s", st_dtype_get(s0->dtype)->name);
        print_line(out, t->norm, dt, shape, t->name);
      }
    }
    for (size_t g = 0; g < ngroups; g++) {
      char name[160];
      snprintf(name, sizeof name, "group %s='%s'", groups[g].name, groups[g].glob);
      print_line(out, gnorm[g], "", "", name);
    }
    char what[96];
    snprintf(what, sizeof what, "%zu tensors", nuniq - nskipped);
    char ordbuf[32];
    snprintf(ordbuf, sizeof ordbuf, "ord %g", ord);
    print_line(out, total, ordbuf, what, "total_norm");
  }
  rc = CLI_OK;
done:
  cli_close_files(files, nfiles);
done_nofiles:
  if (copies)
    for (size_t s = 0; s < nshard; s++) free(copies[s]);
  free(copies);
  json_decref(root);
  free(j.shards);
  free(j.tensors);
  free(j.items);
  free(j.accs);
  pthread_mutex_destroy(&j.lock);
  free(files);
  free(paths);
  return rc;
}
