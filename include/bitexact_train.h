/*
 * bitexact_train.h — the training kernels whose bits do not depend on the
 * layout (DESIGN §9): elementwise math built from IEEE basic operations,
 * batch-invariant GEMM, the layout-invariant token reduction (canonical
 * addends on an int64 grid), and AdamW. C11; DLPack tensors; bx_
 * names; bx_status errors with bx_last_error() as in bitexact.h (the
 * conventions listed there hold here too unless a comment says otherwise).
 *
 * One header per concern, all included here: bitexact_train_math.h
 * (elementwise math, AdamW), bitexact_train_gemm.h (GEMM),
 * bitexact_train_tokred.h (token reduction, weight gradients),
 * bitexact_train_moe.h (router, dispatch), bitexact_train_layers.h
 * (RMSNorm, RoPE, SwiGLU, attention, embedding, cross-entropy).
 *
 * Conventions of every bitexact_train_*.h (a call's comment says where it
 * differs):
 *
 * Options. A kernel that threads or has settings takes `const bx_X_opts
 * *opts` as its last argument. Every bx_X_opts begins with `size_t
 * struct_size`, set by its BX_X_OPTS_DEFAULT macro (see "Struct sizes" in
 * bitexact.h: start from the macro, set fields by name), followed by `int
 * num_threads` (0 = bx_default_threads(), >= 1 = at most that many, < 0
 * BX_EINVAL; no bit depends on it) where the call threads, then the
 * kernel's own fields; new fields go at the end. opts == NULL means the
 * macro's values; otherwise struct_size is checked before anything else
 * (BX_EINVAL, nothing written). Two structs keep an older layout:
 * bx_adamw_opts has num_threads last, bx_tokred_opts has none (its calls
 * are single-threaded).
 *
 * Ownership. DLTensors and their data are borrowed for the call only:
 * nothing is kept after it returns, except what a bx_tokred state owns
 * (created by bx_tokred_create/fork, freed by bx_tokred_destroy).
 *
 * In place. An output shares no byte with any other tensor of the call
 * (BX_ELAYOUT) unless its comment says "may be X itself": then exactly the
 * same data, byte offset and shape, nothing else. Every check runs before
 * the first write: a failing call writes nothing.
 *
 * Threading. Calls on distinct outputs (distinct bx_tokred states) may run
 * concurrently; a bx_tokred is used by one thread at a time. Threaded
 * calls split fixed pieces over the library's pool, never a reduction, so
 * no bit depends on the thread count. The caller's floating-point
 * environment is not used and is given back unchanged.
 *
 * Names. The same quantity has the same argument name in every header:
 * chunk_tokens (C, tokens per chunk of a token reduction), total_tokens
 * (tokens of the global batch), token_begin (the global id of a call's
 * first token), first_chunk (the global index of a call's first chunk),
 * chunk (one global chunk index), seq_len, num_heads, num_kv_heads,
 * head_dim, rotary_dim, grads/ntensors (the gradients a bx_tokred state was
 * created for), tensor (an index into them), s (the state).
 *
 * Devices. A call runs on the host unless its tensors say otherwise:
 * when every tensor of a call is a kDLCUDA tensor of one device, the calls
 * that have a CUDA kernel (docs/cuda.md lists them) run it there, with the
 * host's bits; the others fail with BX_EDEVICE. kDLCUDAManaged tensors
 * (managed memory, e.g. from bx_train_alloc) are host-readable: a call
 * whose tensors are all managed (or CUDA) runs its CUDA kernel when the
 * build has the CUDA backend and a device is usable, and on the host
 * otherwise; the bits are the same either way. Device calls run on the
 * legacy default stream and wait for their kernels. A call mixing host and
 * CUDA tensors fails with BX_EDEVICE naming its first CUDA tensor.
 *
 * Experimental. A header's calls that no bitexact model uses (the GLM-4.5
 * module src/glm, `bitexact train`, the Python model path) sit in its
 * closing "Experimental" section (all but bitexact_train_gemm.h have one).
 * They are tested like the rest but carry no ABI promise: they may change
 * or go in any release. docs/architecture.md ("The public training API")
 * lists them and why each is kept.
 */
#ifndef BITEXACT_TRAIN_H
#define BITEXACT_TRAIN_H

#include "bitexact.h"
#include "bitexact_train_math.h"
#include "bitexact_train_gemm.h"
#include "bitexact_train_tokred.h"
#include "bitexact_train_moe.h"
#include "bitexact_train_layers.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Memory for training tensors, zeroed, aligned to 64 bytes, at least 1
 * byte: device.device_type kDLCPU (host memory) or kDLCUDAManaged (CUDA
 * managed memory, readable and writable by the host and any device; the
 * calls above run their CUDA kernels on tensors in it: see Devices). *ptr
 * is owned by the caller and given back with bx_train_free(device, *ptr)
 * of the same device (which waits for the device's work first). Errors:
 * BX_EDEVICE (another device type; managed memory in a build without the
 * CUDA backend or with no usable device), BX_ENOMEM; *ptr is then NULL.
 * Thread-safe. */
BX_API bx_status bx_train_alloc(DLDevice device, size_t bytes, void **ptr);
BX_API void bx_train_free(DLDevice device, void *ptr);

/* The training calls of this process that went to a device backend so far
 * (see Devices), as text: one line "name count\n" per entry, in the order
 * of their first device call ("bx_gemm 120\n..."); empty when none did.
 * Writes at most cap bytes including the NUL (buf may be NULL with cap 0)
 * and returns the bytes the whole text needs including its NUL. For
 * checking that a run's calls reached the device; a call that fails after
 * choosing the device counts too. Thread-safe. */
BX_API size_t bx_train_device_calls(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* BITEXACT_TRAIN_H */
