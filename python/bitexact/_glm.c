/*
 * _glm.c — the GLM-4.5 model module (src/glm) seen from Python: the
 * entries the bindings' trainers call instead of computing the same thing
 * again (docs/architecture.md rule 10). Now: the data order and the
 * synthetic corpus (glm_data.h). No numerics here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "_bxpy.h"
#include "glm_data.h"

/* glm_synth_tokens(seed, vocab, n) -> bytes: n int32 tokens (native order)
 * of the synthetic corpus. */
static PyObject *py_synth_tokens(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long seed;
  long long vocab, n;
  if (!PyArg_ParseTuple(args, "KLL:glm_synth_tokens", &seed, &vocab, &n)) return NULL;
  if (vocab < 2 || vocab > ((long long)1 << 31) || n < 0 || n > GLM_SYNTH_TOKENS)
    return bxpy_raise_fmt(BX_EINVAL, NULL, "glm_synth_tokens: vocab %lld (2 .. 2^31) or n %lld "
                          "(0 .. %lld) out of range", vocab, n, (long long)GLM_SYNTH_TOKENS);
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * (long long)sizeof(int32_t)));
  if (!out) return NULL;
  Py_BEGIN_ALLOW_THREADS
  glm_synth_tokens((uint64_t)seed, (int64_t)vocab, (int32_t *)PyBytes_AS_STRING(out), (int64_t)n);
  Py_END_ALLOW_THREADS
  return out;
}

/* glm_synth_entropy_bits(vocab) -> float */
static PyObject *py_synth_entropy(PyObject *self, PyObject *args) {
  (void)self;
  long long vocab;
  if (!PyArg_ParseTuple(args, "L:glm_synth_entropy_bits", &vocab)) return NULL;
  if (vocab < 2) return bxpy_raise_fmt(BX_EINVAL, NULL, "glm_synth_entropy_bits: vocab %lld < 2", vocab);
  return PyFloat_FromDouble(glm_synth_entropy_bits((int64_t)vocab));
}

/* glm_epoch_perm(seed, epoch, nseq) -> bytes: nseq int64 (native order),
 * perm_e(k) for k in [0, nseq). */
static PyObject *py_epoch_perm(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long seed;
  long long epoch, S;
  if (!PyArg_ParseTuple(args, "KLL:glm_epoch_perm", &seed, &epoch, &S)) return NULL;
  if (epoch < 0 || S < 1 || S > ((long long)1 << 40))
    return bxpy_raise_fmt(BX_EINVAL, NULL, "glm_epoch_perm: epoch %lld or nseq %lld out of range",
                          epoch, S);
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(S * (long long)sizeof(int64_t)));
  if (!out) return NULL;
  Py_BEGIN_ALLOW_THREADS
  glm_epoch_perm((uint64_t)seed, (int64_t)epoch, (int64_t)S, (int64_t *)PyBytes_AS_STRING(out));
  Py_END_ALLOW_THREADS
  return out;
}

PyMethodDef bxpy_glm_methods[] = {
    {"glm_synth_tokens", py_synth_tokens, METH_VARARGS,
     "glm_synth_tokens(seed, vocab, n) -> bytes of n int32: the synthetic corpus (glm_data.h)"},
    {"glm_synth_entropy_bits", py_synth_entropy, METH_VARARGS,
     "glm_synth_entropy_bits(vocab) -> the synthetic corpus' entropy rate in bits"},
    {"glm_epoch_perm", py_epoch_perm, METH_VARARGS,
     "glm_epoch_perm(seed, epoch, nseq) -> bytes of nseq int64: the --shuffle permutation"},
    {NULL, NULL, 0, NULL}};
