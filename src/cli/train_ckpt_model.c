/*
 * train_ckpt_model.c — the model part of `bitexact train`'s checkpoints
 * (train_ckpt_model.h): checks and copies between a checkpoint directory
 * and the tr_param list, and the (sharded) writer.
 */
#include "train_ckpt_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "st_write.h"

static int is_ecb(const char *name) {
  const char *s = ".mlp.gate.e_score_correction_bias";
  size_t n = strlen(name), k = strlen(s);
  return n > k && strcmp(name + n - k, s) == 0;
}

static const tr_param *sort_params;
static int cmp_param(const void *a, const void *b) {
  return strcmp(sort_params[*(const size_t *)a].name, sort_params[*(const size_t *)b].name);
}

/* The element index of the first NaN or infinity, or -1. */
static int64_t first_nonfinite(const st_tensor *t) {
  const uint8_t *p = t->data;
  for (uint64_t i = 0; i < t->nelem; i++) {
    int bad;
    if (t->dtype == ST_F32) {
      uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                   (uint32_t)p[4 * i + 3] << 24;
      bad = (u & 0x7f800000u) == 0x7f800000u;
    } else {
      uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
      bad = t->dtype == ST_BF16 ? (h & 0x7f80) == 0x7f80 : (h & 0x7c00) == 0x7c00;
    }
    if (bad) return (int64_t)i;
  }
  return -1;
}

int tcm_check(const ck_model *m, const tr_param *params, size_t n, tcm_mode mode, char *err,
              size_t errlen) {
  const char *where = m->sharded ? m->index_path : m->paths[0];
  for (size_t i = 0; i < n; i++) {
    const char *path = where;
    const st_tensor *t = ck_model_find(m, params[i].name, &path);
    if (!t) {
      if (mode == TCM_INIT && params[i].group < 0 && is_ecb(params[i].name)) continue; /* zeros */
      return cli_errf(err, errlen, "%s: tensor '%s' is missing", where, params[i].name);
    }
    const char *dt = st_dtype_get(t->dtype)->name;
    if (mode == TCM_RESUME && t->dtype != ST_F32)
      return cli_errf(err, errlen, "%s: tensor '%s' is %s, expected F32", path, params[i].name, dt);
    if (mode == TCM_INIT && t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
      return cli_errf(err, errlen, "%s: tensor '%s' is %s, expected F32, BF16 or F16", path,
                      params[i].name, dt);
    const tr_param *q = &params[i];
    int same = (int)t->ndim == q->ndim;
    for (int d = 0; same && d < q->ndim; d++) same = t->shape[d] == (uint64_t)q->shape[d];
    if (!same) {
      char got[96], want[96] = "[";
      st_shape_str(t, got, sizeof got);
      for (int d = 0; d < q->ndim; d++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
                 (long long)q->shape[d]);
      strncat(want, "]", sizeof want - strlen(want) - 1);
      return cli_errf(err, errlen, "%s: tensor '%s' has shape %s, the model's is %s", path, q->name,
                      got, want);
    }
    int64_t bad = mode == TCM_INIT ? first_nonfinite(t) : -1;
    if (bad >= 0)
      return cli_errf(err, errlen, "%s: tensor '%s' holds a NaN or an infinity (element %lld)", path,
                      q->name, (long long)bad);
  }
  /* every parameter is there: any other tensor is extra */
  size_t total = ck_model_count(m);
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  if (!order) return cli_errf(err, errlen, "out of memory");
  for (size_t i = 0; i < n; i++) order[i] = i;
  sort_params = params;
  qsort(order, n, sizeof *order, cmp_param);
  int rc = 0;
  for (size_t k = 0; k < total && rc == 0; k++) {
    const char *path = NULL;
    const st_tensor *t = ck_model_tensor(m, k, &path);
    size_t lo = 0, hi = n;
    while (lo < hi) { /* bytewise search of the tensor's name among the parameters' */
      size_t mid = (lo + hi) / 2;
      const char *pn = params[order[mid]].name;
      size_t pl = strlen(pn), ml = pl < t->name_len ? pl : t->name_len;
      int c = memcmp(pn, t->name, ml);
      if (c == 0) c = (pl > t->name_len) - (pl < t->name_len);
      if (c == 0) {
        lo = hi = mid + n + 1; /* found */
        break;
      }
      if (c < 0) lo = mid + 1;
      else hi = mid;
    }
    if (lo <= n)
      rc = cli_errf(err, errlen, "%s: tensor '%.200s' is not a tensor of this model", path, t->name);
  }
  free(order);
  return rc;
}

void tcm_copy(const ck_model *m, tr_param *params, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const st_tensor *t = ck_model_find(m, params[i].name, NULL);
    if (t) ck_widen_f32(t, params[i].data); /* tcm_check: F32, BF16 or F16 */
  }
}

int tcm_init_from(const char *dir, tr_param *params, size_t n, char *err, size_t errlen) {
  ck_model m;
  if (ck_model_open(dir, &m, err, errlen)) return -1;
  int rc = tcm_check(&m, params, n, TCM_INIT, err, errlen);
  if (rc == 0) tcm_copy(&m, params, n);
  ck_model_close(&m);
  return rc;
}

int tcm_is_model_file(const char *name) {
  if (strcmp(name, CK_SINGLE_NAME) == 0 || strcmp(name, CK_INDEX_NAME) == 0) return 1;
  /* model-NNNNN-of-NNNNN.safetensors, at least 5 digits each */
  const char *p = name;
  if (strncmp(p, "model-", 6) != 0) return 0;
  p += 6;
  for (int part = 0; part < 2; part++) {
    size_t d = strspn(p, "0123456789");
    if (d < 5) return 0;
    p += d;
    if (part == 0) {
      if (strncmp(p, "-of-", 4) != 0) return 0;
      p += 4;
    }
  }
  return strcmp(p, ".safetensors") == 0;
}

int tcm_write(const char *dir, const tr_param *params, size_t n, uint64_t max_shard_size,
              char *err, size_t errlen) {
  size_t *order = malloc((n ? n : 1) * sizeof *order), *shard_of = malloc((n ? n : 1) * sizeof *shard_of);
  uint64_t *bytes = calloc(n + 1, sizeof *bytes);
  tc_tensor *t = calloc(n + 1, sizeof *t);
  const char **names = calloc(n + 1, sizeof *names);
  char *used = calloc(n + 1, 1);
  char path[4200], file[64];
  int rc = -1;
  if (!order || !shard_of || !bytes || !t || !names || !used) {
    cli_errf(err, errlen, "out of memory");
    goto done;
  }
  /* transformers' state_dict order: each layer's e_score_correction_bias
   * right after its mlp.gate.weight */
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (used[i] || is_ecb(params[i].name)) continue;
    order[k++] = i;
    used[i] = 1;
    size_t len = strlen(params[i].name);
    if (len > 16 && strcmp(params[i].name + len - 16, ".mlp.gate.weight") == 0) {
      char want[128];
      snprintf(want, sizeof want, "%.*se_score_correction_bias", (int)(len - 6), params[i].name);
      for (size_t j = 0; j < n; j++)
        if (!used[j] && strcmp(params[j].name, want) == 0) {
          order[k++] = j;
          used[j] = 1;
        }
    }
  }
  for (size_t i = 0; i < n; i++)
    if (!used[i]) order[k++] = i;
  uint64_t total_size = 0, total_params = 0;
  for (size_t i = 0; i < n; i++) {
    const tr_param *q = &params[order[i]];
    bytes[i] = (uint64_t)q->numel * 4;
    total_size += bytes[i];
    if (q->group >= 0) total_params += (uint64_t)q->numel;
    names[i] = q->name;
  }
  size_t nshards = max_shard_size ? ck_shard_plan(bytes, n, max_shard_size, shard_of) : 1;
  if (nshards <= 1) {
    for (size_t i = 0; i < n; i++)
      t[i] = (tc_tensor){params[i].name, params[i].ndim, params[i].shape, params[i].numel,
                         params[i].data};
    snprintf(path, sizeof path, "%s/%s", dir, CK_SINGLE_NAME);
    rc = tc_write_safetensors(path, t, n, err, errlen);
    goto done;
  }
  for (size_t s = 0; s < nshards; s++) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
      if (shard_of[i] == s) {
        const tr_param *q = &params[order[i]];
        t[m++] = (tc_tensor){q->name, q->ndim, q->shape, q->numel, q->data};
      }
    ck_shard_name(s, nshards, file, sizeof file);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (tc_write_safetensors(path, t, m, err, errlen)) goto done;
  }
  snprintf(path, sizeof path, "%s/%s", dir, CK_INDEX_NAME);
  rc = ck_write_index(path, names, shard_of, n, nshards, total_size, total_params, err, errlen);
done:
  free(order);
  free(shard_of);
  free(bytes);
  free(t);
  free(names);
  free(used);
  return rc;
}
