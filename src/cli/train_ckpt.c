/*
 * train_ckpt.c — checkpoints of `bitexact train` (train_ckpt.h): the
 * deterministic safetensors writer, the atomic directory, and the
 * validating read-back through src/cli/safetensors.c.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* renameat2 */
#endif
#include "train_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "safetensors.h"
#include "train_ckpt_model.h"

/* The files of a checkpoint besides the model's (tcm_is_model_file):
 * optimizer.safetensors is the layout before the optimizer/ directory. */
static const char *const ckpt_files[] = {"config.json", "optimizer.safetensors", "trainer_state.json"};
#define NFILES (sizeof ckpt_files / sizeof ckpt_files[0])
#define OPT_DIR "optimizer" /* DIR/optimizer/optimizer.safetensors: from_pretrained does not look there */

/* ---- the directory ---------------------------------------------------------- */

static int is_ckpt_file(const char *name) {
  for (size_t i = 0; i < NFILES; i++)
    if (strcmp(name, ckpt_files[i]) == 0) return 1;
  return tcm_is_model_file(name);
}

/* dir/name is a checkpoint's file, or its optimizer/ directory holding
 * nothing but optimizer.safetensors. */
static int is_ckpt_entry(const char *dir, const char *name) {
  if (strcmp(name, OPT_DIR) != 0) return is_ckpt_file(name);
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/%s", dir, OPT_DIR);
  DIR *d = opendir(p);
  if (!d) return 0;
  struct dirent *e;
  int ok = 1;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
        strcmp(e->d_name, "optimizer.safetensors") != 0)
      ok = 0;
  closedir(d);
  return ok;
}

int tc_check_save_dir(const char *dir, char *err, size_t errlen) {
  struct stat sb;
  if (strlen(dir) + 32 > PATH_MAX) return cli_errf(err, errlen, "%s: path too long", dir);
  if (stat(dir, &sb) == 0) {
    if (!S_ISDIR(sb.st_mode)) return cli_errf(err, errlen, "%s: exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (!d) return cli_errf(err, errlen, "%s: cannot read: %s", dir, strerror(errno));
    struct dirent *e;
    int other = 0;
    char name[64] = "";
    while ((e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      if (!is_ckpt_entry(dir, e->d_name) && !other) {
        other = 1;
        snprintf(name, sizeof name, "%.60s", e->d_name);
      }
    }
    closedir(d);
    if (other)
      return cli_errf(err, errlen,
                   "%s: exists and holds '%s', which is not a checkpoint file (refusing to replace "
                   "the directory)",
                   dir, name);
    if (access(dir, W_OK) != 0) return cli_errf(err, errlen, "%s: not writable", dir);
  } else if (errno != ENOENT) {
    return cli_errf(err, errlen, "%s: %s", dir, strerror(errno));
  }
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%s", dir);
  size_t l = strlen(parent);
  while (l > 1 && parent[l - 1] == '/') parent[--l] = 0;
  char *slash = strrchr(parent, '/');
  if (!slash) snprintf(parent, sizeof parent, ".");
  else if (slash == parent) parent[1] = 0;
  else *slash = 0;
  if (stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return cli_errf(err, errlen, "%s: the parent directory %s does not exist", dir, parent);
  if (access(parent, W_OK) != 0)
    return cli_errf(err, errlen, "%s: the parent directory %s is not writable", dir, parent);
  return 0;
}

/* Removes a checkpoint directory: its checkpoint files only (so rmdir
 * fails on anything else). */
static void remove_dir(const char *dir) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/%s/optimizer.safetensors", dir, OPT_DIR);
  unlink(p);
  snprintf(p, sizeof p, "%s/%s", dir, OPT_DIR);
  rmdir(p);
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (!is_ckpt_file(e->d_name)) continue;
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
    closedir(d);
  }
  rmdir(dir);
}

/* fsync of a file or a directory (a directory's entries: the files made
 * or renamed in it). 0 / -1. */
static int sync_path(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  if (close(fd) != 0) rc = -1;
  return rc;
}

/* Every file of the checkpoint in dir, its optimizer/ directory and dir
 * itself reach the disk (the writers fsync their files already; this
 * covers config.json and the directory entries), so that the rename
 * never puts in place a directory whose files a power loss could undo. */
static int sync_tree(const char *dir) {
  char p[PATH_MAX];
  int rc = 0;
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!is_ckpt_file(e->d_name)) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (sync_path(p)) rc = -1;
  }
  closedir(d);
  snprintf(p, sizeof p, "%s/%s", dir, OPT_DIR);
  if (sync_path(p)) rc = -1;
  if (sync_path(dir)) rc = -1;
  return rc;
}

/* The directory that holds target (its parent), into buf. */
static void parent_of(const char *target, char *buf, size_t len) {
  snprintf(buf, len, "%s", target);
  char *slash = strrchr(buf, '/');
  if (!slash) snprintf(buf, len, ".");
  else if (slash == buf) buf[1] = 0;
  else *slash = 0;
}

/* Removes the stale temporary directories of earlier saves to target:
 * target.tmp-XXXXXX (six or more characters: the Python trainer's too),
 * left by a save killed before its rename, or after it and before the old
 * checkpoint was removed. Only those no live writer holds: a writer keeps
 * an exclusive flock on its temporary directory until it is renamed, and
 * the lock dies with the process. Only checkpoint files are removed
 * (remove_dir), so a directory holding anything else stays. */
static void remove_stale_tmp(const char *target) {
  char parent[PATH_MAX], p[2 * PATH_MAX + 8];
  parent_of(target, parent, sizeof parent);
  const char *base = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
  size_t bl = strlen(base);
  DIR *d = opendir(parent);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *nm = e->d_name;
    if (strncmp(nm, base, bl) != 0 || strncmp(nm + bl, ".tmp-", 5) != 0 || strlen(nm + bl + 5) < 6)
      continue;
    snprintf(p, sizeof p, "%s/%s", parent, nm);
    int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) remove_dir(p);
    close(fd);
  }
  closedir(d);
}

static void hexd(char *buf, size_t len, double d) { snprintf(buf, len, "%a", d); }

static int write_state(const char *path, const tc_state *s, const tr_param *params, size_t n) {
  char lr[40], b1[40], b2[40], eps[40], wd[40], clip[40], mlr[40];
  hexd(lr, sizeof lr, s->lr);
  hexd(mlr, sizeof mlr, s->min_lr);
  hexd(b1, sizeof b1, s->beta1);
  hexd(b2, sizeof b2, s->beta2);
  hexd(eps, sizeof eps, s->eps);
  hexd(wd, sizeof wd, s->weight_decay);
  hexd(clip, sizeof clip, s->clip);
  json_t *r = json_pack(
      "{s:i,s:I,s:s,s:{s:I,s:I,s:b,s:s,s:I,s:I,s:I},s:{s:s,s:s},s:{s:s,s:s,s:s,s:s},s:s,s:s}",
      "format_version", TC_FORMAT_VERSION, "step", (json_int_t)s->step, "seed",
      "", /* placeholder: a uint64 does not fit json_int_t */
      "data", "seq_len", (json_int_t)s->seq_len, "global_batch", (json_int_t)s->global_batch,
      "shuffle", s->shuffle, "kind", s->data_kind, "tokens", (json_int_t)s->data_tokens,
      "sequences", (json_int_t)s->data_sequences, "position", (json_int_t)s->data_position,
      "lr_schedule", "kind", s->lr_scheduler[0] ? s->lr_scheduler : "constant", "lr", lr, "adamw", "beta1", b1, "beta2", b2, "eps", eps,
      "weight_decay", wd, "clip", clip, "mode", s->mode);
  if (!r) return -1;
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)s->seed);
  json_object_set_new(r, "seed", json_string(seed));
  json_t *ls = json_object_get(r, "lr_schedule");
  json_object_set_new(ls, "warmup_steps", json_integer((json_int_t)s->warmup_steps));
  json_object_set_new(ls, "total_steps", json_integer((json_int_t)s->total_steps));
  json_object_set_new(ls, "min_lr", json_string(mlr));
  json_object_set_new(r, "compute_dtype", json_string(s->compute_dtype[0] ? s->compute_dtype : "fp32"));
  if (s->history) { /* {"loss": E, NAME: E for every trainable parameter} */
    json_t *h = json_object();
    size_t j = 0;
    for (size_t i = 0; h && i < n; i++)
      if (params[i].group >= 0 && j + 1 < s->nhistory)
        json_object_set_new(h, params[i].name, json_integer(s->history[j++]));
    if (h && j + 1 == s->nhistory) json_object_set_new(h, "loss", json_integer(s->history[j]));
    if (!h || j + 1 != s->nhistory || json_object_set_new(r, "grid_history", h) != 0) {
      json_decref(r);
      return -1;
    }
  }
  FILE *fp = fopen(path, "wb");
  int rc = fp ? 0 : -1;
  if (fp) {
    if (json_dumpf(r, fp, JSON_INDENT(2) | JSON_SORT_KEYS) != 0 || fputc('\n', fp) == EOF) rc = -1;
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) rc = -1;
    if (fclose(fp) != 0) rc = -1;
  }
  json_decref(r);
  return rc;
}

int tc_save(const char *dir, const tr_config *c, const tr_param *params, size_t n,
            const tc_state *st, char *err, size_t errlen) {
  return tc_save_shards(dir, c, params, n, st, 0, err, errlen);
}

int tc_save_shards(const char *dir, const tr_config *c, const tr_param *params, size_t n,
                   const tc_state *st, uint64_t max_shard_size, char *err, size_t errlen) {
  char tmp[PATH_MAX], p[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", dir);
  size_t l = strlen(tmp);
  while (l > 1 && tmp[l - 1] == '/') tmp[--l] = 0;
  char target[PATH_MAX];
  snprintf(target, sizeof target, "%s", tmp);
  snprintf(tmp + l, sizeof tmp - l, ".tmp-XXXXXX");
  remove_stale_tmp(target);
  if (!mkdtemp(tmp)) return cli_errf(err, errlen, "%s: cannot create a temporary directory: %s", dir, strerror(errno));
  /* held until the rename: remove_stale_tmp of another save skips it */
  int lock = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock >= 0) flock(lock, LOCK_EX | LOCK_NB);
  tc_test_point("tmpdir");
  mode_t mask = umask(0);
  umask(mask);
  chmod(tmp, 0777 & ~mask); /* mkdtemp's 0700 -> what mkdir would give */
  tc_tensor *t = calloc(2 * n + 1, sizeof *t);
  char (*names)[112] = calloc(2 * n + 1, sizeof *names);
  int rc = -1;
  if (!t || !names) {
    cli_errf(err, errlen, "out of memory");
    goto done;
  }
  snprintf(p, sizeof p, "%s/config.json", tmp);
  if (tr_config_save(c, p, err, errlen)) goto done;
  tc_test_point("config");
  if (tcm_write(tmp, params, n, max_shard_size, err, errlen)) goto done;
  tc_test_point("model");
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (params[i].group < 0) continue;
    snprintf(names[m], sizeof names[m], "%s.exp_avg", params[i].name);
    t[m] = (tc_tensor){names[m], params[i].ndim, params[i].shape, params[i].numel,
                       params[i].exp_avg};
    m++;
    snprintf(names[m], sizeof names[m], "%s.exp_avg_sq", params[i].name);
    t[m] = (tc_tensor){names[m], params[i].ndim, params[i].shape, params[i].numel,
                       params[i].exp_avg_sq};
    m++;
  }
  snprintf(p, sizeof p, "%s/%s", tmp, OPT_DIR);
  if (mkdir(p, 0777) != 0) {
    cli_errf(err, errlen, "%s: cannot create: %s", p, strerror(errno));
    goto done;
  }
  snprintf(p, sizeof p, "%s/%s/optimizer.safetensors", tmp, OPT_DIR);
  if (tc_write_safetensors(p, t, m, err, errlen)) goto done;
  tc_test_point("optimizer");
  snprintf(p, sizeof p, "%s/trainer_state.json", tmp);
  if (write_state(p, st, params, n)) {
    cli_errf(err, errlen, "%s: cannot write", p);
    goto done;
  }
  tc_test_point("state");
  if (sync_tree(tmp)) {
    cli_errf(err, errlen, "%s: cannot sync: %s", tmp, strerror(errno));
    goto done;
  }
  tc_test_point("synced");
  /* into place: a plain rename, or an exchange with the old checkpoint */
  if (rename(tmp, target) != 0) {
    if (errno != ENOTEMPTY && errno != EEXIST) {
      cli_errf(err, errlen, "%s: cannot rename the temporary directory: %s", dir, strerror(errno));
      goto done;
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, target, RENAME_EXCHANGE) != 0) {
      cli_errf(err, errlen, "%s: cannot replace the old checkpoint: %s", dir, strerror(errno));
      goto done;
    }
    /* tmp now names the old checkpoint */
  }
  tc_test_point("renamed");
  /* the rename itself reaches the disk */
  parent_of(target, p, sizeof p);
  if (sync_path(p)) {
    cli_errf(err, errlen, "%s: cannot sync: %s", p, strerror(errno));
    goto done;
  }
  rc = 0;
done:
  remove_dir(tmp); /* the failed attempt, or the old checkpoint */
  if (lock >= 0) close(lock);
  if (rc == 0) tc_test_point("done");
  free(t);
  free(names);
  return rc;
}

/* ---- reading back -------------------------------------------------------- */

int tc_load_config(const char *dir, tr_config *c, char *err, size_t errlen) {
  char p[PATH_MAX], e[400];
  snprintf(p, sizeof p, "%s/config.json", dir);
  if (tr_config_load(p, c, e, sizeof e)) return cli_errf(err, errlen, "%s: %s", p, e);
  return 0;
}

/* Checks that f holds exactly the tensors want[0..n) (names, F32, shapes). */
static int check_file(const st_file *f, const char *path, char (*names)[112], const tr_param **of,
                      size_t n, char *err, size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    const st_tensor *t = st_find(f, names[i], strlen(names[i]));
    if (!t) return cli_errf(err, errlen, "%s: tensor '%s' is missing", path, names[i]);
    if (t->dtype != ST_F32)
      return cli_errf(err, errlen, "%s: tensor '%s' is %s, expected F32", path, names[i],
                   st_dtype_get(t->dtype)->name);
    int same = (int)t->ndim == of[i]->ndim;
    for (int d = 0; same && d < of[i]->ndim; d++) same = t->shape[d] == (uint64_t)of[i]->shape[d];
    if (!same) {
      char got[96], want[96] = "[";
      st_shape_str(t, got, sizeof got);
      for (int d = 0; d < of[i]->ndim; d++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
                 (long long)of[i]->shape[d]);
      strncat(want, "]", sizeof want - strlen(want) - 1);
      return cli_errf(err, errlen, "%s: tensor '%s' has shape %s, the model's is %s", path,
                   names[i], got, want);
    }
  }
  if (f->count != n) { /* every wanted name is there: the rest are extra */
    for (size_t k = 0; k < f->count; k++) {
      size_t i = 0;
      while (i < n && strcmp(names[i], f->tensors[k].name) != 0) i++;
      if (i == n)
        return cli_errf(err, errlen, "%s: tensor '%.200s' is not a tensor of this model", path,
                     f->tensors[k].name);
    }
  }
  return 0;
}

static int hex_field(json_t *o, const char *key, double *out) {
  json_t *v = json_object_get(o, key);
  if (!json_is_string(v)) return -1;
  char *end;
  *out = strtod(json_string_value(v), &end);
  return *end ? -1 : 0;
}

static int read_state(const char *path, tc_state *s, const tr_param *params, size_t n, char *err,
                      size_t errlen) {
  json_error_t je;
  json_t *r = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!r) return cli_errf(err, errlen, "%s: %s", path, je.text);
  int rc = -1;
  json_t *d = json_object_get(r, "data"), *ad = json_object_get(r, "adamw");
  json_t *ls = json_object_get(r, "lr_schedule"), *v;
  memset(s, 0, sizeof *s);
  json_int_t fv = json_is_object(r) ? json_integer_value(json_object_get(r, "format_version")) : 0;
  if (fv != 1 && fv != TC_FORMAT_VERSION) {
    cli_errf(err, errlen, "%s: not a trainer state of format version 1 or %d", path, TC_FORMAT_VERSION);
    goto done;
  }
  const char *bad = NULL;
  v = json_object_get(r, "step");
  if (!json_is_integer(v) || json_integer_value(v) < 0) bad = "step";
  else s->step = json_integer_value(v);
  v = json_object_get(r, "seed");
  char *end = NULL;
  if (!bad && json_is_string(v)) s->seed = strtoull(json_string_value(v), &end, 10);
  if (!bad && (!json_is_string(v) || *end)) bad = "seed";
  if (!bad && !json_is_object(d)) bad = "data";
  if (!bad && !json_is_object(ad)) bad = "adamw";
  if (!bad && !json_is_object(ls)) bad = "lr_schedule";
  static const char *ints[] = {"seq_len", "global_batch", "tokens", "sequences", "position"};
  int64_t *dst[] = {&s->seq_len, &s->global_batch, &s->data_tokens, &s->data_sequences,
                    &s->data_position};
  for (int i = 0; i < 5 && !bad; i++) {
    v = json_object_get(d, ints[i]);
    if (!json_is_integer(v) || json_integer_value(v) < 0) bad = ints[i];
    else *dst[i] = json_integer_value(v);
  }
  if (!bad && !json_is_boolean(json_object_get(d, "shuffle"))) bad = "data.shuffle";
  if (!bad) s->shuffle = json_is_true(json_object_get(d, "shuffle"));
  if (!bad && !json_is_string(json_object_get(d, "kind"))) bad = "data.kind";
  if (!bad) snprintf(s->data_kind, sizeof s->data_kind, "%s", json_string_value(json_object_get(d, "kind")));
  if (!bad && hex_field(ls, "lr", &s->lr)) bad = "lr_schedule.lr";
  v = json_object_get(ls, "kind");
  if (!bad && (!json_is_string(v) || strlen(json_string_value(v)) >= sizeof s->lr_scheduler))
    bad = "lr_schedule.kind";
  if (!bad) snprintf(s->lr_scheduler, sizeof s->lr_scheduler, "%s", json_string_value(v));
  s->total_steps = s->step;
  static const char *const sched_ints[] = {"warmup_steps", "total_steps"};
  int64_t *sched_dst[] = {&s->warmup_steps, &s->total_steps};
  for (int i = 0; i < 2 && !bad; i++) {
    v = json_object_get(ls, sched_ints[i]);
    if (v && (!json_is_integer(v) || json_integer_value(v) < 0)) bad = sched_ints[i];
    else if (v) *sched_dst[i] = json_integer_value(v);
  }
  if (!bad && json_object_get(ls, "min_lr") && hex_field(ls, "min_lr", &s->min_lr)) bad = "lr_schedule.min_lr";
  if (!bad && hex_field(ad, "beta1", &s->beta1)) bad = "adamw.beta1";
  if (!bad && hex_field(ad, "beta2", &s->beta2)) bad = "adamw.beta2";
  if (!bad && hex_field(ad, "eps", &s->eps)) bad = "adamw.eps";
  if (!bad && hex_field(ad, "weight_decay", &s->weight_decay)) bad = "adamw.weight_decay";
  if (!bad && hex_field(r, "clip", &s->clip)) bad = "clip";
  if (!bad && !json_is_string(json_object_get(r, "mode"))) bad = "mode";
  if (!bad) snprintf(s->mode, sizeof s->mode, "%s", json_string_value(json_object_get(r, "mode")));
  json_t *cd = json_object_get(r, "compute_dtype");
  if (!bad && cd && (!json_is_string(cd) || (strcmp(json_string_value(cd), "fp32") != 0 &&
                                             strcmp(json_string_value(cd), "bf16") != 0)))
    bad = "compute_dtype";
  if (!bad) snprintf(s->compute_dtype, sizeof s->compute_dtype, "%s", cd ? json_string_value(cd) : "fp32");
  json_t *gh = fv >= 2 ? json_object_get(r, "grid_history") : NULL;
  static char gbad[200];
  if (!bad && gh && !json_is_object(gh)) bad = "grid_history";
  if (!bad && gh) { /* every trainable parameter's name and "loss", nothing else */
    size_t ntrain = 0;
    for (size_t i = 0; i < n; i++) ntrain += params[i].group >= 0;
    s->nhistory = ntrain + 1;
    s->history = malloc(s->nhistory * sizeof *s->history);
    if (!s->history) bad = "grid_history (out of memory)";
    if (!bad && json_object_size(gh) != s->nhistory) {
      snprintf(gbad, sizeof gbad, "grid_history (%zu entries; the model's %zu parameters and "
               "\"loss\" expected)", json_object_size(gh), ntrain);
      bad = gbad;
    }
    for (size_t i = 0, j = 0; !bad && i <= n; i++) {
      if (i < n && params[i].group < 0) continue;
      const char *name = i < n ? params[i].name : "loss";
      json_t *e = json_object_get(gh, name);
      if (!json_is_integer(e) || json_integer_value(e) < -149 || json_integer_value(e) > 128) {
        snprintf(gbad, sizeof gbad, "grid_history.%.120s (an exponent in [-149, 128])", name);
        bad = gbad;
      } else {
        s->history[j++] = (int)json_integer_value(e);
      }
    }
    if (bad) {
      free(s->history);
      s->history = NULL;
      s->nhistory = 0;
    }
  }
  if (bad) {
    cli_errf(err, errlen, "%s: field '%s' is missing or invalid", path, bad);
    goto done;
  }
  rc = 0;
done:
  json_decref(r);
  return rc;
}

int tc_load(const char *dir, tr_param *params, size_t n, tc_state *st, char *err, size_t errlen) {
  char po[PATH_MAX], po_old[PATH_MAX], ps[PATH_MAX], e[512];
  /* the optimizer state: optimizer/optimizer.safetensors, or beside the
   * model (the layout before it) */
  snprintf(po, sizeof po, "%s/%s/optimizer.safetensors", dir, OPT_DIR);
  snprintf(po_old, sizeof po_old, "%s/optimizer.safetensors", dir);
  snprintf(ps, sizeof ps, "%s/trainer_state.json", dir);
  struct stat sb;
  int has_new = stat(po, &sb) == 0, has_old = stat(po_old, &sb) == 0;
  if (has_new && has_old)
    return cli_errf(err, errlen, "%s: holds both %s and %s (which is the optimizer state?)", dir,
                    OPT_DIR "/optimizer.safetensors", "optimizer.safetensors");
  if (!has_new && has_old) snprintf(po, sizeof po, "%s", po_old);
  ck_model fm;
  st_file fo;
  memset(&fm, 0, sizeof fm);
  memset(&fo, 0, sizeof fo);
  char (*names)[112] = calloc(2 * n + 1, sizeof *names);
  const tr_param **of = calloc(2 * n + 1, sizeof *of);
  int rc = -1;
  if (!names || !of) {
    cli_errf(err, errlen, "out of memory");
    goto done;
  }
  if (ck_model_open(dir, &fm, err, errlen)) goto done;
  if (st_open(po, &fo, e, sizeof e)) {
    cli_errf(err, errlen, "%s: %s", po, e);
    goto done;
  }
  if (tcm_check(&fm, params, n, TCM_RESUME, err, errlen)) goto done;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (params[i].group < 0) continue;
    snprintf(names[m], sizeof names[m], "%s.exp_avg", params[i].name);
    of[m++] = &params[i];
    snprintf(names[m], sizeof names[m], "%s.exp_avg_sq", params[i].name);
    of[m++] = &params[i];
  }
  if (check_file(&fo, po, names, of, m, err, errlen)) goto done;
  if (read_state(ps, st, params, n, err, errlen)) goto done;
  /* every check passed: copy */
  tcm_copy(&fm, params, n);
  for (size_t i = 0; i < n; i++) {
    if (params[i].group < 0) continue;
    char nm[112];
    snprintf(nm, sizeof nm, "%s.exp_avg", params[i].name);
    memcpy(params[i].exp_avg, st_find(&fo, nm, strlen(nm))->data, (size_t)params[i].numel * 4);
    snprintf(nm, sizeof nm, "%s.exp_avg_sq", params[i].name);
    memcpy(params[i].exp_avg_sq, st_find(&fo, nm, strlen(nm))->data, (size_t)params[i].numel * 4);
  }
  rc = 0;
done:
  ck_model_close(&fm);
  st_close(&fo);
  free(names);
  free(of);
  return rc;
}
