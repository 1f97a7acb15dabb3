"""bitexact traces (docs/trace.md): the framework-neutral part of the
tracers, and the writer of the trace format, version 1. One JSON object
per line (JSON Lines, UTF-8):

- line 1, the header: ``{"bitexact_trace": 1, "model": ID, "producer": ...,
  "hash": "xxh3-64", "blocks": 16, "head": 8}``;
- then one entry per traced value, per step, in canonical order (phase:
  forward, backward, optimizer; then the modules in the order they were
  first seen in that phase of the step; then the slice; then ``what``):
  ``{"step", "phase", "module", "what", "slice", "dtype", "shape", "hash",
  "blocks", "head"}``.

``hash`` is XXH3-64 (seed 0) of the value's bytes (C order, little-endian)
as 16 hex digits; ``blocks`` the hashes of the value cut into
``min(16, numel)`` consecutive parts (part j: elements [j n // nb, (j+1) n
// nb)), concatenated; ``head`` the first ``min(8, numel)`` values as hex
floats. So ``bitexact diff --trace`` finds the first differing entry, the
part holding its first differing element, and the element itself with
both values when it is among the first eight.

Because entries are written per step in this canonical order (not in the
order a layout produced them), the same run on another micro-batching
writes the same bytes wherever its slices are the same sequences.

:class:`TracerCore` holds what bitexact.torch.trace and
bitexact.paddle.trace share (slicing per sequence, the default model id,
gradients and parameters at the step's end, discard, dump); the framework
modules add only their hooks and the tensor -> numpy conversion.
"""
import contextlib
import json
import os
import warnings

import numpy as np

VERSION = 1
HEAD = 8
BLOCKS = 16
PHASES = ("forward", "backward", "optimizer")

_DTYPES = {np.dtype("float32"): "F32", np.dtype("float64"): "F64",
           np.dtype("float16"): "F16"}


def _xxh(b):
    import xxhash
    return xxhash.xxh3_64_hexdigest(b)


def _hexf(v):
    v = float(v)
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return v.hex()


def bf16_values(bits):
    """float64 values of bf16 bit patterns (a uint16 array)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def entry_fields(arr, dtype=None, values=None):
    """hash, blocks, head of a C-contiguous numpy array (dtype: the
    format's dtype name when arr holds raw bits, e.g. BF16 as uint16, with
    values the float64 widening for the head; for BF16 values default to
    the widening of the bits)."""
    a = np.ascontiguousarray(arr)
    name = dtype or _DTYPES.get(a.dtype)
    if name is None:
        raise TypeError(f"trace: dtype {a.dtype} is not traced (F32, F64, F16, BF16)")
    flat = a.reshape(-1)
    n = flat.size
    raw = flat.tobytes()
    nb = min(BLOCKS, n)
    esz = a.dtype.itemsize
    blocks = "".join(_xxh(raw[(j * n // nb) * esz:((j + 1) * n // nb) * esz]) for j in range(nb))
    if values is None and name == "BF16":
        values = bf16_values(flat[:HEAD])
    vals = values.reshape(-1)[:HEAD] if values is not None else flat[:HEAD]
    return {"dtype": name, "shape": list(a.shape), "hash": _xxh(raw), "blocks": blocks,
            "head": [_hexf(v) for v in vals]}


def model_id(class_name, named_shapes):
    """The default model id of a trace header: ``CLASS:`` and the XXH3-64
    (hex) of ``NAME:D0,D1,...;`` over the parameters in order, shapes in
    torch layout (so a torch and a Paddle model of the same architecture
    and parameter names agree)."""
    s = "".join(f"{n}:{','.join(str(int(d)) for d in shape)};" for n, shape in named_shapes)
    return f"{class_name}:{_xxh(s.encode())}"


def dump_key(step, phase, module, what, slice_index):
    """The key naming one entry for ``dump=``: STEP/PHASE/MODULE/WHAT/SLICE
    (SLICE the sequence, or '-' for a whole tensor)."""
    return f"{step}/{phase}/{module}/{what}/{'-' if slice_index is None else slice_index}"


def _save_dump(path, key, arr, dtype):
    """arr (the entry's bytes: BF16 as its uint16 bits) as the only tensor
    of a safetensors file, written to a temporary file then renamed."""
    tmp = f"{path}.tmp{os.getpid()}"
    a = np.ascontiguousarray(arr)
    if dtype == "BF16":
        from safetensors import TensorSpec, serialize_file
        serialize_file({key: TensorSpec(dtype="bfloat16", shape=a.shape, data_ptr=a.ctypes.data,
                                        data_len=a.nbytes)}, tmp, None)
    else:
        from safetensors.numpy import save_file
        save_file({key: a}, tmp)
    os.replace(tmp, path)


class TraceWriter:
    """Buffers one step's entries and writes them in canonical order at
    end_step(). Not thread-safe; one writer per file.

    dump: a key (:func:`dump_key`); when the entry of that key is added,
    its value is also written whole to ``path + ".dump.safetensors"``.

    A value recorded twice in one step under the same (phase, module,
    what, slice) (a module called twice, or a whole tensor in two
    micro-batches) gets ``what`` suffixed ``@k`` for its k-th repeat, so
    that every entry of a trace has its own key."""

    def __init__(self, path, model_id, producer, dump=None):
        self.f = open(path, "w", encoding="utf-8")
        self.f.write(json.dumps({"bitexact_trace": VERSION, "model": model_id,
                                 "producer": producer, "hash": "xxh3-64", "blocks": BLOCKS,
                                 "head": HEAD}, sort_keys=True) + "\n")
        self.step = 0
        self.dump = dump
        self.dump_path = path + ".dump.safetensors"
        self.dumped = False
        self._buf = []
        self._seen = {p: {} for p in PHASES}
        self._keys = {}

    def add(self, phase, module, what, slice_index, arr, dtype=None, values=None):
        k = (phase, module, what, slice_index)
        rep = self._keys.get(k, 0)
        self._keys[k] = rep + 1
        if rep:
            what = f"{what}@{rep}"
        order = self._seen[phase].setdefault(module, len(self._seen[phase]))
        e = {"step": self.step, "phase": phase, "module": module, "what": what,
             "slice": slice_index}
        e.update(entry_fields(arr, dtype, values))
        key = (PHASES.index(phase), order, -1 if slice_index is None else slice_index, what)
        self._buf.append((key, e))
        if self.dump is not None and dump_key(self.step, phase, module, what, slice_index) == self.dump:
            _save_dump(self.dump_path, self.dump, arr, e["dtype"])
            self.dumped = True

    def discard(self, keep):
        """Drops the buffered entries e for which keep(e) is false; the
        remaining modules keep their relative order."""
        self._buf = [(k, e) for k, e in self._buf if keep(e)]
        seen = {p: {} for p in PHASES}
        for _, e in sorted(self._buf, key=lambda t: t[0]):
            seen[e["phase"]].setdefault(e["module"], len(seen[e["phase"]]))
        self._buf = [((k[0], seen[e["phase"]][e["module"]], k[2], k[3]), e) for k, e in self._buf]
        self._seen = seen  # the dropped modules take their place when seen again
        keys = {}
        for _, e in self._buf:
            w = e["what"].split("@")[0]
            kk = (e["phase"], e["module"], w, e["slice"])
            keys[kk] = keys.get(kk, 0) + 1
        self._keys = keys

    def end_step(self, merge=None):
        """Writes this step's entries in canonical order and starts the
        next step.

        merge: for a distributed caller, a function called with this rank's
        list of ``(sort_key, line)`` (line: one entry's JSON text, without
        the newline; sort_key: a tuple of ints and a string that does not
        depend on the rank: phase, the module's first-seen order in that
        phase, the slice (-1 whole), what) that returns the merged list to
        write (e.g. on rank 0: every rank's lists gathered, duplicates
        dropped), or None to write nothing (the other ranks). The merged
        list is written sorted by sort_key."""
        lines = [(k, json.dumps(e, separators=(", ", ": "))) for k, e in
                 sorted(self._buf, key=lambda t: t[0])]
        if merge is not None:
            lines = merge(lines)
            if lines is not None:
                lines = sorted(lines, key=lambda t: tuple(t[0]))
        for _, line in lines or ():
            self.f.write(line + "\n")
        self.f.flush()
        self._buf = []
        self._seen = {p: {} for p in PHASES}
        self._keys = {}
        self.step += 1

    def close(self):
        if self._buf:
            self.end_step()
        self.f.close()
        if self.dump is not None and not self.dumped:
            warnings.warn(f"trace: dump key '{self.dump}' matched no entry; "
                          f"nothing written to {self.dump_path}", stacklevel=3)


def flatten_outputs(out, is_tensor):
    """The tensors a module returned, as (what, tensor): ``output`` for one
    tensor, ``output.k`` for the k-th value of a tuple, list or mapping
    (transformers' ModelOutput: its non-None fields in order) of several;
    non-tensor values are skipped but keep their index."""
    if is_tensor(out):
        return [("output", out)]
    if isinstance(out, dict) or (hasattr(out, "keys") and hasattr(out, "values")):
        outs = tuple(out.values())
    elif isinstance(out, (tuple, list)):
        outs = tuple(out)
    else:
        return []
    if len(outs) == 1:
        return [("output", outs[0])] if is_tensor(outs[0]) else []
    return [(f"output.{k}", o) for k, o in enumerate(outs) if is_tensor(o)]


class TracerCore:
    """What every framework's tracer shares. A subclass implements
    _float_array(t) -> (numpy array, dtype name or None) for a
    floating-point tensor or None for anything else, and _parameters() ->
    [(name, value array, dtype, grad array or None, grad dtype)] in
    parameter order (torch layout), and installs its hooks, calling
    set_batch() at the root's forward and activation() from the hooks."""

    def __init__(self, path, model_id, producer, batch_dim=0, seq_len=None, dump=None):
        if seq_len is not None and (int(seq_len) != seq_len or seq_len < 1):
            raise ValueError(f"trace: seq_len must be a positive integer, not {seq_len!r}")
        self.batch_dim, self.seq_len, self.seq_offset = batch_dim, seq_len, 0
        self.w = TraceWriter(path, model_id, producer, dump=dump)
        self._batch = None
        self._grads_done = False

    def set_batch(self, shape):
        """The batch size B from the shape of the root's first tensor input
        (None: no tensor input)."""
        d = self.batch_dim
        self._batch = shape[d] if shape is not None and len(shape) > d else None

    def activation(self, phase, name, what, t):
        """Records a module's output or input gradient t (a tensor of the
        framework), sliced per sequence along batch_dim: size B: B entries
        (the batch dimension dropped); size B * seq_len: B entries of
        seq_len rows; else the whole tensor (slice null)."""
        conv = self._float_array(t)
        if conv is None:
            return
        a, dt = conv
        d, B, L = self.batch_dim, self._batch, self.seq_len
        n = a.shape[d] if a.ndim > d else None
        if B is not None and n == B:
            for i in range(B):
                self.w.add(phase, name, what, self.seq_offset + i, np.take(a, i, axis=d), dt)
        elif B is not None and L is not None and n == B * L:
            for i in range(B):
                idx = (slice(None),) * d + (slice(i * L, (i + 1) * L),)
                self.w.add(phase, name, what, self.seq_offset + i, a[idx], dt)
        else:
            self.w.add(phase, name, what, None, a, dt)

    def grads(self):
        """Records every parameter's gradient now (phase backward, what
        ``grad``): call it where the gradients are final but not yet
        clipped; step() then records only the parameters."""
        for n, _, _, g, gdt in self._parameters(grads=True):
            if g is not None:
                self.w.add("backward", n, "grad", None, g, gdt)
        self._grads_done = True

    def discard(self):
        """Drops the forward and backward activation entries buffered so
        far in this step (before rerunning the step's passes, so that only
        the last run is traced); gradients and parameters recorded by
        grads() stay."""
        self.w.discard(lambda e: e["what"].split("@")[0] in ("grad", "param"))

    def step(self, merge=None):
        """The parameters' gradients (backward phase; unless grads() was
        called in this step) and values (optimizer phase), then this step's
        lines (merge: see TraceWriter.end_step); call it after the
        optimizer's step."""
        if not self._grads_done:
            self.grads()
        for n, v, vdt, _, _ in self._parameters(grads=False):
            self.w.add("optimizer", n, "param", None, v, vdt)
        self.end_step(merge)

    def end_step(self, merge=None):
        self.w.end_step(merge)
        self._grads_done = False

    def close(self):
        """Removes the hooks (the subclass keeps them in ``self._hooks``)
        and closes the file (the last step's entries are written)."""
        for h in getattr(self, "_hooks", ()):
            h.remove()
        self._hooks = []
        self.w.close()


@contextlib.contextmanager
def traced(tracer):
    """The context of bitexact.torch.trace / bitexact.paddle.trace: yields
    the tracer, closes it at the end of the block."""
    try:
        yield tracer
    finally:
        tracer.close()
