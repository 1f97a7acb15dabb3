/*
 * norm_pow.c — `bitexact norm --ord P` for P other than 2, 1, 0, +-inf:
 * |x|^P is rounded per element before the exact sum, so partial results
 * cannot be combined exactly the way norm.c combines chunks; the library
 * computes everything in one call (deterministic, any thread count).
 */
#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "norm_internal.h"

int norm_pow(norm_job *j, size_t nshard, size_t nuniq, const group_def *groups,
                    size_t ngroups, int threads, int error_nonfinite, double *total,
                    double *gnorm, void ***copies) {
  int rc = -1;
  DLTensor *dl = calloc(nshard ? nshard : 1, sizeof *dl);
  int64_t *shapes = calloc(nshard ? nshard : 1, sizeof *shapes);
  bx_group *g = calloc(nuniq ? nuniq : 1, sizeof *g);
  DLTensor *gdl = calloc(nshard ? nshard : 1, sizeof *gdl);
  bx_group *ug = calloc(ngroups ? ngroups : 1, sizeof *ug);
  double *un = calloc(nuniq ? nuniq : 1, sizeof *un);
  *copies = calloc(nshard ? nshard : 1, sizeof **copies);
  if (!dl || !shapes || !g || !gdl || !ug || !un || !*copies) {
    cli_error("out of memory");
    goto done;
  }
  size_t ng = 0, nd = 0;
  for (size_t u = 0; u < nuniq; u++) {
    utensor *t = &j->tensors[u];
    if (!t->included) continue;
    g[ng].tensors = &dl[nd];
    for (size_t s = t->first; s < t->first + t->nshards; s++) {
      const st_tensor *st = j->shards[s].t;
      size_t es = st_dtype_get(st->dtype)->bits / 8;
      const void *p = cli_aligned(st->data, st->nelem * es, es, &(*copies)[s], 0);
      if (!p) {
        cli_error("%s: tensor '%s': out of memory for an aligned copy",
                  j->files[j->shards[s].file].path, st->name);
        goto done;
      }
      shapes[nd] = (int64_t)st->nelem;
      dl[nd].data = (void *)p;
      dl[nd].device.device_type = kDLCPU;
      dl[nd].ndim = 1;
      dl[nd].dtype = norm_dl_dtype(st->dtype);
      dl[nd].shape = &shapes[nd];
      nd++;
    }
    g[ng].count = (size_t)(&dl[nd] - g[ng].tensors);
    ng++;
  }
  bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
  o.norm_type = error_nonfinite ? INFINITY : j->ord; /* max |x| first: finds NaN/Inf */
  o.num_threads = threads;
  bx_status st = bx_total_norm(g, ng, NULL, &o, total, un);
  for (size_t u = 0, k = 0; st == BX_OK && error_nonfinite && u < nuniq; u++) {
    if (!j->tensors[u].included) continue;
    if (!isfinite(un[k++])) {
      const shard *s = &j->shards[j->tensors[u].first];
      cli_error("%s: tensor '%s' holds NaN or Inf (--error-if-nonfinite)", j->files[s->file].path,
                s->t->name);
      goto done;
    }
  }
  o.norm_type = j->ord;
  if (st == BX_OK && error_nonfinite) st = bx_total_norm(g, ng, NULL, &o, total, un);
  if (st != BX_OK) {
    cli_error("%s: %s", bx_status_str(st), bx_last_error());
    goto done;
  }
  for (size_t u = 0, k = 0; u < nuniq; u++)
    if (j->tensors[u].included) j->tensors[u].norm = un[k++];
  if (ngroups) {
    size_t ngd = 0;
    for (size_t gi = 0; gi < ngroups; gi++) {
      ug[gi].tensors = &gdl[ngd];
      for (size_t u = 0, k = 0; u < nuniq; u++) {
        utensor *t = &j->tensors[u];
        if (!t->included) continue;
        if (fnmatch(groups[gi].glob, t->name, 0) == 0)
          for (size_t s = 0; s < g[k].count; s++) gdl[ngd++] = g[k].tensors[s];
        k++;
      }
      ug[gi].count = (size_t)(&gdl[ngd] - ug[gi].tensors);
    }
    double dummy;
    o.error_if_nonfinite = 0;
    st = bx_total_norm(ug, ngroups, NULL, &o, &dummy, gnorm);
    if (st != BX_OK) {
      cli_error("%s: %s", bx_status_str(st), bx_last_error());
      goto done;
    }
  }
  rc = 0;
done:
  free(dl);
  free(shapes);
  free(g);
  free(gdl);
  free(ug);
  free(un);
  return rc;
}

