/*
 * _train.c — the CPython binding of the training kernels (bitexact_train.h),
 * part 1: the shared call machinery (bxk_*), the elementwise math, AdamW,
 * the GEMM, RMSNorm, RoPE, SwiGLU and attention. _train_moe.c binds the
 * router, the dispatch, the embedding and the cross-entropy;
 * _train_tokred.c the token reduction state (TokRed) and the weight
 * gradients. docs/kernels_python.md is the contract.
 *
 * Rules every function here follows:
 *  - arguments in the C order (tensors and scalars as the C call takes
 *    them; positional or by keyword), the fields of the C opts struct as
 *    keyword-only arguments whose defaults are the C DEFAULT macro's;
 *  - tensors are any DLPack producer (or a capsule), exported without a
 *    copy (bxpy_export_tensor, _dlpack.c) and released after the call;
 *    outputs are the caller's tensors, written in place: the binding never
 *    allocates a tensor; an output exported read-only (DLPack 1.0 flag) or
 *    as a copy is refused before the call;
 *  - the kernel runs with the GIL released; nothing here computes: every
 *    check of shapes, dtypes, devices, layouts, overlaps is the library's,
 *    run before its first write (a failing call writes nothing);
 *  - errors: bitexact's exception of the bx_status, text "fn: argument
 *    'name': " + bx_last_error() (the slot located by
 *    bx_last_error_location(), else by the tensor the text names), with
 *    the attributes tensor (the slot) and argument (its name).
 */
#include "_bxpy.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bitexact_train.h"

/* ------------------------------------------------------------------------
 * The call machinery
 * ---------------------------------------------------------------------- */
PyObject *bxk_raise(const bxk_call *k, bx_status st, int slot, PyObject *cause,
                    const char *fmt, ...) {
  char body[1024], msg[1280];
  va_list ap;
  va_start(ap, fmt);
  PyOS_vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  if (slot >= 0)
    PyOS_snprintf(msg, sizeof msg, "%s: argument '%s': %s", k->fn, k->names[slot], body);
  else
    PyOS_snprintf(msg, sizeof msg, "%s: %s", k->fn, body);
  bxpy_where w = {-1, -1, slot, -1, -1};
  bxpy_raise_at(st, msg, cause, &w);
  if (slot >= 0) { /* exc.argument = the name */
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *name = PyUnicode_FromString(k->names[slot]);
    if (v && name && PyObject_SetAttrString(v, "argument", name) < 0) PyErr_Clear();
    Py_XDECREF(name);
    PyErr_Restore(t, v, tb);
  }
  return NULL;
}

void bxk_release(bxk_call *k) {
  for (int i = 0; i < k->n; i++) bxpy_release_owner(&k->own[i]);
}

/* The export of slot i failed with the pending exception: raise it again
 * naming the argument (bitexact's own errors; others pass through). */
static void export_failed(bxk_call *k, int i) {
  PyObject *exc = bxpy_take_exception();
  PyObject *sto = exc ? PyObject_GetAttrString(exc, "status") : NULL;
  long st = sto && PyLong_Check(sto) ? PyLong_AsLong(sto) : -1;
  Py_XDECREF(sto);
  PyErr_Clear();
  if (st <= 0) { /* not one of ours (MemoryError, ...): as it was */
    if (exc) PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_XDECREF(exc);
    return;
  }
  PyObject *text = PyObject_Str(exc);
  const char *s = text ? PyUnicode_AsUTF8(text) : NULL;
  if (!s) {
    PyErr_Clear();
    s = "?";
  }
  char prefix[64]; /* _dlpack.c's "group -1, tensor i: " */
  PyOS_snprintf(prefix, sizeof prefix, "group -1, tensor %d: ", i);
  if (!strncmp(s, prefix, strlen(prefix))) s += strlen(prefix);
  PyObject *cause = PyException_GetCause(exc); /* the producer's error, or NULL */
  const char *hint = "";
  if (cause && PyErr_GivenExceptionMatches(cause, PyExc_BufferError) && strstr(s, "gradient"))
    hint = " (pass tensor.detach(), a view of the same memory: the kernels record no "
           "autograd; bitexact.torch's functions do)";
  bxk_raise(k, (bx_status)st, i, cause, "%s%s", s, hint);
  Py_XDECREF(text);
  Py_DECREF(exc);
}

int bxk_export(bxk_call *k, PyObject *const *objs, unsigned out, unsigned opt) {
  for (int i = 0; i < k->n; i++) {
    k->p[i] = NULL;
    k->own[i].managed = NULL;
  }
  for (int i = 0; i < k->n; i++) {
    PyObject *o = objs[i];
    if (!o || o == Py_None) {
      if (opt >> i & 1) continue;
      bxk_raise(k, BX_EINVAL, i, NULL, "a tensor is required, got None");
      goto fail;
    }
    if (bxpy_export_tensor(o, &k->dl[i], &k->own[i], -1, i) < 0) {
      export_failed(k, i);
      goto fail;
    }
    k->p[i] = &k->dl[i];
    if (out >> i & 1) {
      if (k->own[i].flags & BXPY_FLAG_READ_ONLY) {
        bxk_raise(k, BX_EINVAL, i, NULL,
                  "is read-only (its producer exported it with the DLPack read-only flag) but "
                  "it is an output; nothing was modified");
        goto fail;
      }
      if (k->own[i].flags & BXPY_FLAG_IS_COPIED) {
        bxk_raise(k, BX_EINVAL, i, NULL,
                  "was exported as a copy (DLPack IS_COPIED) but it is an output, whose "
                  "result would be lost; nothing was modified");
        goto fail;
      }
    }
  }
  return 0;
fail:
  bxk_release(k);
  return -1;
}

/* The slot the library's last error is about: its location (through
 * k->loc), else the one tensor whose name the text gives as "(name)" or
 * "tensor name"; -1 if none. */
static int locate(const bxk_call *k) {
  long long t = bx_last_error_location()->tensor;
  if (t >= 0)
    for (int i = 0; i < k->n; i++)
      if ((k->loc ? k->loc[i] : i) == t) return i;
  const char *text = bx_last_error();
  int found = -1;
  for (int i = 0; i < k->n; i++) {
    char a[80], b[80], c[80];
    PyOS_snprintf(a, sizeof a, "(%s)", k->names[i]);
    PyOS_snprintf(b, sizeof b, "tensor %s ", k->names[i]);
    PyOS_snprintf(c, sizeof c, "tensor %s:", k->names[i]);
    if (strstr(text, a) || strstr(text, b) || strstr(text, c)) {
      if (found >= 0) return -1; /* two named: leave it to the text */
      found = i;
    }
  }
  return found;
}

PyObject *bxk_done(bxk_call *k, bx_status st) {
  if (st != BX_OK) {
    bxk_raise(k, st, locate(k), NULL, "%s", bx_last_error());
    bxk_release(k);
    return NULL;
  }
  bxk_release(k);
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------
 * Elementwise math
 * ---------------------------------------------------------------------- */
#define EW_DOC(name, what)                                                                     \
  #name "(x, y, *, num_threads=0)\n--\n\n"                                                     \
  "y = " what " elementwise (bx_" #name "): every result the exact value correctly rounded\n" \
  "to fp32. x, y: fp32, host, the same shape and strides, dense; y is written (an output;\n"  \
  "y may be x itself: in place; any other overlap is a LayoutError). Threads: the library's\n" \
  "pool (num_threads 0 = default), bits independent of the count. GIL released."
#define EW(name)                                                                                \
  static PyObject *k_##name BXK_ARGS {                                                                \
    (void)self;                                                                                 \
    static char *kwl[] = {"x", "y", "num_threads", NULL};                                       \
    static const char *const nm[] = {"x", "y"};                                                 \
    PyObject *o[2];                                                                             \
    bx_math_opts op = BX_MATH_OPTS_DEFAULT;                                                     \
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$i:" #name, kwl, &o[0], &o[1],              \
                                     &op.num_threads))                                          \
      return NULL;                                                                              \
    BXK_BEGIN(k, #name, nm, o, 2u, 0u);                                                         \
    BXK_RUN(k, bx_##name(k.p[0], k.p[1], &op));                                                 \
  }                                                                                             \
  static PyObject *k_##name##_f32(PyObject *self, PyObject *arg) {                              \
    (void)self;                                                                                 \
    float x = (float)PyFloat_AsDouble(arg);                                                     \
    if (x == -1.0f && PyErr_Occurred()) return NULL;                                            \
    return PyFloat_FromDouble((double)bx_##name##_f32(x));                                      \
  }
EW(exp)
EW(log)
EW(sigmoid)
EW(silu)
EW(rsqrt)
EW(sin)
EW(cos)
#define EW_METHODS(name, what)                                                     \
  BXK_METH(#name, k_##name, EW_DOC(name, what)),                                       \
      {#name "_f32", k_##name##_f32, METH_O,                                       \
       #name "_f32(x, /)\n--\n\nbx_" #name "_f32 on one value: x rounded to fp32 " \
       "(nearest), the fp32 result as a float (the bits of the tensor call)."}

/* ------------------------------------------------------------------------
 * AdamW
 * ---------------------------------------------------------------------- */
PyDoc_STRVAR(adamw_doc,
             "adamw_step(param, grad, exp_avg, exp_avg_sq, step, *, lr=1e-3, beta1=0.9, "
             "beta2=0.999, eps=1e-8, weight_decay=1e-2, num_threads=0)\n--\n\n"
             "One torch.optim.AdamW step (foreach=False, amsgrad=False) with torch's CPU "
             "roundings (bx_adamw_step):\nparam, exp_avg, exp_avg_sq updated in place, grad "
             "read; all fp32, host, one shape, dense, no two\nsharing a byte. step >= 1 is the "
             "count after this step (torch's state['step']). On error\nnothing is written. "
             "Threads: the pool; bits independent of the count. GIL released.");
static PyObject *k_adamw BXK_ARGS {
  (void)self;
  static char *kwl[] = {"param", "grad", "exp_avg", "exp_avg_sq", "step", "lr", "beta1",
                        "beta2", "eps", "weight_decay", "num_threads", NULL};
  static const char *const nm[] = {"param", "grad", "exp_avg", "exp_avg_sq"};
  PyObject *o[4];
  long long step;
  bx_adamw_opts op = BX_ADAMW_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOL|$dddddi:adamw_step", kwl, &o[0], &o[1],
                                   &o[2], &o[3], &step, &op.lr, &op.beta1, &op.beta2, &op.eps,
                                   &op.weight_decay, &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "adamw_step", nm, o, 1u | 4u | 8u, 0u);
  BXK_RUN(k, bx_adamw_step(k.p[0], k.p[1], k.p[2], k.p[3], (int64_t)step, &op));
}

PyDoc_STRVAR(lr_at_doc,
             "lr_at(schedule, lr, step, *, total_steps, warmup_steps=0, min_lr=0.0)\n--\n\n"
             "The learning rate of step `step` (0-based) under transformers' schedule "
             "'constant',\n'linear', 'cosine' (with min_lr: cosine_with_min_lr) or "
             "'constant_with_warmup' over\ntotal_steps with warmup_steps, correctly rounded "
             "to a float (bx_lr_at): the rate\n`bitexact train --lr-scheduler` records.");
static PyObject *k_lr_at(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *kwl[] = {"schedule", "lr", "step", "total_steps", "warmup_steps", "min_lr", NULL};
  static const char *const names[] = {"constant", "linear", "cosine", "constant_with_warmup"};
  const char *name;
  double lr, min_lr = 0.0, out = 0.0;
  long long step, total = -1, warmup = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sdL|$LLd:lr_at", kwl, &name, &lr, &step, &total,
                                   &warmup, &min_lr))
    return NULL;
  if (total == -1) return PyErr_Format(PyExc_TypeError, "lr_at() needs total_steps=");
  int kind = -1;
  for (int i = 0; i < 4; i++)
    if (strcmp(name, names[i]) == 0) kind = i;
  if (kind < 0)
    return PyErr_Format(PyExc_ValueError, "lr_at: schedule '%s' is not constant, linear, cosine "
                        "or constant_with_warmup", name);
  bx_status st = bx_lr_at((bx_lr_schedule)kind, lr, min_lr, (int64_t)warmup, (int64_t)total,
                          (int64_t)step, &out);
  if (st != BX_OK) return bxpy_raise_last(st, NULL);
  return PyFloat_FromDouble(out);
}

/* ------------------------------------------------------------------------
 * GEMM
 * ---------------------------------------------------------------------- */
PyDoc_STRVAR(gemm_doc,
             "gemm(a, b, layout, c, *, accumulate=False, num_threads=0)\n--\n\n"
             "c = a . op(b) (or c += with accumulate), batch-invariant (bx_gemm): every element "
             "one\nsequential fmaf chain over k (TN: over the tokens t) from +0 (or from c).\n"
             "layout: 'nt' (0, b [N,K]: y = x W^T), 'nn' (1, b [K,N]), 'tn' (2: a [T,N], b "
             "[T,K],\nc [N,K] = a^T b, the weight gradient). a, b: fp32 or bf16 (may differ), "
             "row-major\ncontiguous, host; a (and c, NT/NN) may be 3-D [batch, rows, cols]. c: "
             "fp32, written, not\noverlapping a or b. Threads split M/N blocks (TN: N/K), never "
             "the chain. GIL released.");
static PyObject *k_gemm BXK_ARGS {
  (void)self;
  static char *kwl[] = {"a", "b", "layout", "c", "accumulate", "num_threads", NULL};
  static const char *const nm[] = {"a", "b", "c"};
  PyObject *o[3], *lay;
  bx_gemm_opts op = BX_GEMM_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|$pi:gemm", kwl, &o[0], &o[1], &lay, &o[2],
                                   &op.accumulate, &op.num_threads))
    return NULL;
  long layout = -1;
  if (PyUnicode_Check(lay)) {
    const char *s = PyUnicode_AsUTF8(lay);
    if (!s) return NULL;
    layout = !strcmp(s, "nt") || !strcmp(s, "NT")   ? BX_GEMM_NT
             : !strcmp(s, "nn") || !strcmp(s, "NN") ? BX_GEMM_NN
             : !strcmp(s, "tn") || !strcmp(s, "TN") ? BX_GEMM_TN
                                                    : -2;
    if (layout == -2)
      return bxpy_raise_fmt(BX_EINVAL, NULL, "gemm: layout '%.20s' is not 'nt', 'nn' or 'tn'", s);
  } else {
    layout = PyLong_AsLong(lay); /* the library checks the value */
    if (layout == -1 && PyErr_Occurred()) return NULL;
  }
  BXK_BEGIN(k, "gemm", nm, o, 4u, 0u);
  BXK_RUN(k, bx_gemm(k.p[0], k.p[1], (bx_gemm_layout)layout, k.p[2], &op));
}

/* ------------------------------------------------------------------------
 * RMSNorm
 * ---------------------------------------------------------------------- */
PyDoc_STRVAR(rmsnorm_fwd_doc,
             "rmsnorm_forward(x, weight, eps, y, rstd=None, *, num_threads=0)\n--\n\n"
             "Glm4MoeRMSNorm (bx_rmsnorm_forward): per row y = w * (x * rsqrt(mean(x^2) + "
             "eps)), the\nsum of squares one fmaf chain. x [T, H] (or [B, L, H]; QK-norm: [T, "
             "heads, head_dim]),\nweight [H], y like x (written; may be x itself), rstd T "
             "elements or None (written; the\nbackward needs it). fp32, host, dense. Threads: "
             "whole rows. GIL released.");
static PyObject *k_rmsnorm_fwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"x", "weight", "eps", "y", "rstd", "num_threads", NULL};
  static const char *const nm[] = {"x", "weight", "y", "rstd"};
  PyObject *o[4] = {NULL, NULL, NULL, Py_None};
  double eps;
  bx_rmsnorm_opts op = BX_RMSNORM_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOdO|O$i:rmsnorm_forward", kwl, &o[0], &o[1],
                                   &eps, &o[2], &o[3], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "rmsnorm_forward", nm, o, 4u | 8u, 8u);
  BXK_RUN(k, bx_rmsnorm_forward(k.p[0], k.p[1], eps, k.p[2], k.p[3], &op));
}

PyDoc_STRVAR(rmsnorm_bwd_doc,
             "rmsnorm_backward(x, weight, dy, rstd, chunk_tokens, dx, dweight_partials=None, *, "
             "num_threads=0)\n--\n\n"
             "The RMSNorm gradients (bx_rmsnorm_backward): dx (like x, written; may be dy "
             "itself) and\nthe weight gradient as chunk partials dweight_partials [ceil(T / "
             "chunk_tokens), H]\n(written, or None), partial c one fmaf chain over the chunk's "
             "tokens (for TokRed.add as\nchunk first_chunk + c). rstd: the forward's. fp32, "
             "host, dense. GIL released.");
static PyObject *k_rmsnorm_bwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"x", "weight", "dy", "rstd", "chunk_tokens", "dx", "dweight_partials",
                        "num_threads", NULL};
  static const char *const nm[] = {"x", "weight", "dy", "rstd", "dx", "dweight_partials"};
  PyObject *o[6] = {NULL, NULL, NULL, NULL, NULL, Py_None};
  long long ct;
  bx_rmsnorm_opts op = BX_RMSNORM_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOLO|O$i:rmsnorm_backward", kwl, &o[0], &o[1],
                                   &o[2], &o[3], &ct, &o[4], &o[5], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "rmsnorm_backward", nm, o, 16u | 32u, 32u);
  BXK_RUN(k, bx_rmsnorm_backward(k.p[0], k.p[1], k.p[2], k.p[3], (int64_t)ct, k.p[4], k.p[5],
                                 &op));
}

/* ------------------------------------------------------------------------
 * RoPE
 * ---------------------------------------------------------------------- */
PyDoc_STRVAR(rope_fwd_doc,
             "rope_forward(x, positions, head_dim, rotary_dim, theta, y, *, num_threads=0)\n--\n\n"
             "transformers' apply_rotary_pos_emb with partial rotary (rotate_half on the first\n"
             "rotary_dim features of each head; bx_rope_forward), the table from correctly "
             "rounded\npow/sin/cos. x [T, heads*head_dim] or [T, heads, head_dim] or [B, L, "
             "heads*head_dim] fp32,\npositions int64 (T elements, 0..2^24), y like x (written; "
             "may be x itself). GIL released.");
static PyObject *k_rope_fwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"x", "positions", "head_dim", "rotary_dim", "theta", "y", "num_threads",
                        NULL};
  static const char *const nm[] = {"x", "positions", "y"};
  PyObject *o[3];
  long long hd, rd;
  double theta;
  bx_rope_opts op = BX_ROPE_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOLLdO|$i:rope_forward", kwl, &o[0], &o[1], &hd,
                                   &rd, &theta, &o[2], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "rope_forward", nm, o, 4u, 0u);
  BXK_RUN(k, bx_rope_forward(k.p[0], k.p[1], (int64_t)hd, (int64_t)rd, theta, k.p[2], &op));
}

PyDoc_STRVAR(rope_bwd_doc,
             "rope_backward(dy, positions, head_dim, rotary_dim, theta, dx, *, num_threads=0)\n"
             "--\n\nThe transposed rotation of the gradient (bx_rope_backward); shapes as "
             "rope_forward, dx\nwritten (may be dy itself). GIL released.");
static PyObject *k_rope_bwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"dy", "positions", "head_dim", "rotary_dim", "theta", "dx",
                        "num_threads", NULL};
  static const char *const nm[] = {"dy", "positions", "dx"};
  PyObject *o[3];
  long long hd, rd;
  double theta;
  bx_rope_opts op = BX_ROPE_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOLLdO|$i:rope_backward", kwl, &o[0], &o[1], &hd,
                                   &rd, &theta, &o[2], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "rope_backward", nm, o, 4u, 0u);
  BXK_RUN(k, bx_rope_backward(k.p[0], k.p[1], (int64_t)hd, (int64_t)rd, theta, k.p[2], &op));
}

PyDoc_STRVAR(rope_cs_doc,
             "rope_cos_sin(positions, rotary_dim, theta, cos, sin, *, num_threads=0)\n--\n\n"
             "The RoPE table (bx_rope_cos_sin): cos and sin [T, rotary_dim/2] fp32 (written, "
             "not\noverlapping), the distinct half of torch's cat((freqs, freqs)). GIL "
             "released.");
static PyObject *k_rope_cs BXK_ARGS {
  (void)self;
  static char *kwl[] = {"positions", "rotary_dim", "theta", "cos", "sin", "num_threads", NULL};
  static const char *const nm[] = {"positions", "cos", "sin"};
  PyObject *o[3];
  long long rd;
  double theta;
  bx_rope_opts op = BX_ROPE_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OLdOO|$i:rope_cos_sin", kwl, &o[0], &rd, &theta,
                                   &o[1], &o[2], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "rope_cos_sin", nm, o, 2u | 4u, 0u);
  BXK_RUN(k, bx_rope_cos_sin(k.p[0], (int64_t)rd, theta, k.p[1], k.p[2], &op));
}

/* ------------------------------------------------------------------------
 * SwiGLU
 * ---------------------------------------------------------------------- */
#define SWIGLU_TAIL                                                                           \
  "fp32, host, dense. Threads: the pool; bits independent of the count. GIL released."
PyDoc_STRVAR(swiglu_fwd_doc,
             "swiglu_forward(gate, up, h, *, num_threads=0)\n--\n\n"
             "h = fl(silu(gate) * up) (bx_swiglu_forward). gate, up, h [T, F] (or [B, L, F]); h "
             "written\n(may be gate or up itself). " SWIGLU_TAIL);
PyDoc_STRVAR(swiglu_fwdf_doc,
             "swiglu_forward_fused(gate_up, h, *, num_threads=0)\n--\n\n"
             "swiglu_forward on gate_up [T, 2F] (gate columns [0, F), up [F, 2F)); h [T, F] "
             "written\n(bx_swiglu_forward_fused). " SWIGLU_TAIL);
PyDoc_STRVAR(swiglu_bwd_doc,
             "swiglu_backward(gate, up, dh, dgate, dup, *, num_threads=0)\n--\n\n"
             "dgate, dup from dh (bx_swiglu_backward: torch's mul then silu_backward formula); "
             "all\n[T, F]; dgate may be gate itself, dup up itself. " SWIGLU_TAIL);
PyDoc_STRVAR(swiglu_bwdf_doc,
             "swiglu_backward_fused(gate_up, dh, dgate_up, *, num_threads=0)\n--\n\n"
             "swiglu_backward in the fused layout: dgate_up [T, 2F] written (may be gate_up "
             "itself).\n" SWIGLU_TAIL);
static PyObject *k_swiglu_fwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"gate", "up", "h", "num_threads", NULL};
  static const char *const nm[] = {"gate", "up", "h"};
  PyObject *o[3];
  bx_swiglu_opts op = BX_SWIGLU_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|$i:swiglu_forward", kwl, &o[0], &o[1], &o[2],
                                   &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "swiglu_forward", nm, o, 4u, 0u);
  BXK_RUN(k, bx_swiglu_forward(k.p[0], k.p[1], k.p[2], &op));
}
static PyObject *k_swiglu_fwdf BXK_ARGS {
  (void)self;
  static char *kwl[] = {"gate_up", "h", "num_threads", NULL};
  static const char *const nm[] = {"gate_up", "h"};
  PyObject *o[2];
  bx_swiglu_opts op = BX_SWIGLU_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$i:swiglu_forward_fused", kwl, &o[0], &o[1],
                                   &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "swiglu_forward_fused", nm, o, 2u, 0u);
  BXK_RUN(k, bx_swiglu_forward_fused(k.p[0], k.p[1], &op));
}
static PyObject *k_swiglu_bwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"gate", "up", "dh", "dgate", "dup", "num_threads", NULL};
  static const char *const nm[] = {"gate", "up", "dh", "dgate", "dup"};
  PyObject *o[5];
  bx_swiglu_opts op = BX_SWIGLU_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|$i:swiglu_backward", kwl, &o[0], &o[1],
                                   &o[2], &o[3], &o[4], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "swiglu_backward", nm, o, 8u | 16u, 0u);
  BXK_RUN(k, bx_swiglu_backward(k.p[0], k.p[1], k.p[2], k.p[3], k.p[4], &op));
}
static PyObject *k_swiglu_bwdf BXK_ARGS {
  (void)self;
  static char *kwl[] = {"gate_up", "dh", "dgate_up", "num_threads", NULL};
  static const char *const nm[] = {"gate_up", "dh", "dgate_up"};
  PyObject *o[3];
  bx_swiglu_opts op = BX_SWIGLU_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|$i:swiglu_backward_fused", kwl, &o[0], &o[1],
                                   &o[2], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "swiglu_backward_fused", nm, o, 4u, 0u);
  BXK_RUN(k, bx_swiglu_backward_fused(k.p[0], k.p[1], k.p[2], &op));
}

/* ------------------------------------------------------------------------
 * Attention
 * ---------------------------------------------------------------------- */
PyDoc_STRVAR(attn_fwd_doc,
             "attention_forward(q, k, v, seq_len, num_heads, num_kv_heads, head_dim, o, stats, "
             "*,\nnum_threads=0)\n--\n\n"
             "Causal GQA attention of transformers' eager Glm4MoeAttention "
             "(bx_attention_forward) on\nprojected, normed, rotated q [T, Hq*D], k, v [T, "
             "Hkv*D] (or [B, L, F]); T = B*seq_len\ntokens, sequences one after another. o [T, "
             "Hq*D] and stats [T, Hq, 2] (m, l) written,\noverlapping nothing. fp32, host, "
             "dense. Threads: (sequence, head, block) pieces. GIL released.");
static PyObject *k_attn_fwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"q", "k", "v", "seq_len", "num_heads", "num_kv_heads", "head_dim",
                        "o", "stats", "num_threads", NULL};
  static const char *const nm[] = {"q", "k", "v", "o", "stats"};
  PyObject *o[5];
  long long L, hq, hkv, d;
  bx_attention_opts op = BX_ATTENTION_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOLLLLOO|$i:attention_forward", kwl, &o[0],
                                   &o[1], &o[2], &L, &hq, &hkv, &d, &o[3], &o[4],
                                   &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "attention_forward", nm, o, 8u | 16u, 0u);
  BXK_RUN(k, bx_attention_forward(k.p[0], k.p[1], k.p[2], (int64_t)L, (int64_t)hq,
                                  (int64_t)hkv, (int64_t)d, k.p[3], k.p[4], &op));
}

PyDoc_STRVAR(attn_bwd_doc,
             "attention_backward(dout, q, k, v, stats, seq_len, num_heads, num_kv_heads, "
             "head_dim,\ndq, dk, dv, *, num_threads=0)\n--\n\n"
             "dq, dk, dv (overwritten) from dout and the forward's stats "
             "(bx_attention_backward);\nshapes as attention_forward; outputs overlap nothing. "
             "Threads: (sequence, kv head)\npieces. GIL released.");
static PyObject *k_attn_bwd BXK_ARGS {
  (void)self;
  static char *kwl[] = {"dout", "q", "k", "v", "stats", "seq_len", "num_heads", "num_kv_heads",
                        "head_dim", "dq", "dk", "dv", "num_threads", NULL};
  static const char *const nm[] = {"dout", "q", "k", "v", "stats", "dq", "dk", "dv"};
  PyObject *o[8];
  long long L, hq, hkv, d;
  bx_attention_opts op = BX_ATTENTION_OPTS_DEFAULT;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOLLLLOOO|$i:attention_backward", kwl, &o[0],
                                   &o[1], &o[2], &o[3], &o[4], &L, &hq, &hkv, &d, &o[5], &o[6],
                                   &o[7], &op.num_threads))
    return NULL;
  BXK_BEGIN(k, "attention_backward", nm, o, 32u | 64u | 128u, 0u);
  BXK_RUN(k, bx_attention_backward(k.p[0], k.p[1], k.p[2], k.p[3], k.p[4], (int64_t)L,
                                   (int64_t)hq, (int64_t)hkv, (int64_t)d, k.p[5], k.p[6],
                                   k.p[7], &op));
}

PyMethodDef bxpy_train_methods[] = {
    EW_METHODS(exp, "e^x"),
    EW_METHODS(log, "ln x"),
    EW_METHODS(sigmoid, "1 / (1 + e^-x)"),
    EW_METHODS(silu, "x / (1 + e^-x)"),
    EW_METHODS(rsqrt, "1 / sqrt(x)"),
    EW_METHODS(sin, "sin x (|x| < 2^28)"),
    EW_METHODS(cos, "cos x (|x| < 2^28)"),
    BXK_METH("adamw_step", k_adamw, adamw_doc),
    {"lr_at", (PyCFunction)(void (*)(void))k_lr_at, METH_VARARGS | METH_KEYWORDS, lr_at_doc},
    BXK_METH("gemm", k_gemm, gemm_doc),
    BXK_METH("rmsnorm_forward", k_rmsnorm_fwd, rmsnorm_fwd_doc),
    BXK_METH("rmsnorm_backward", k_rmsnorm_bwd, rmsnorm_bwd_doc),
    BXK_METH("rope_forward", k_rope_fwd, rope_fwd_doc),
    BXK_METH("rope_backward", k_rope_bwd, rope_bwd_doc),
    BXK_METH("rope_cos_sin", k_rope_cs, rope_cs_doc),
    BXK_METH("swiglu_forward", k_swiglu_fwd, swiglu_fwd_doc),
    BXK_METH("swiglu_forward_fused", k_swiglu_fwdf, swiglu_fwdf_doc),
    BXK_METH("swiglu_backward", k_swiglu_bwd, swiglu_bwd_doc),
    BXK_METH("swiglu_backward_fused", k_swiglu_bwdf, swiglu_bwdf_doc),
    BXK_METH("attention_forward", k_attn_fwd, attn_fwd_doc),
    BXK_METH("attention_backward", k_attn_bwd, attn_bwd_doc),
    {NULL, NULL, 0, NULL}};

int bxpy_train_init(PyObject *m) {
  if (PyModule_AddFunctions(m, bxpy_train_methods) < 0 ||
      PyModule_AddFunctions(m, bxpy_train_moe_methods) < 0 ||
      PyModule_AddFunctions(m, bxpy_tokred_methods) < 0 || bxpy_tokred_init(m) < 0 ||
      PyModule_AddFunctions(m, bxpy_glm_methods) < 0 || bxpy_glm_init(m) < 0)
    return -1;
  if (PyModule_AddIntConstant(m, "GEMM_NT", BX_GEMM_NT) < 0 ||
      PyModule_AddIntConstant(m, "GEMM_NN", BX_GEMM_NN) < 0 ||
      PyModule_AddIntConstant(m, "GEMM_TN", BX_GEMM_TN) < 0)
    return -1;
  return 0;
}
