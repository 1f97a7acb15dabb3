"""bitexact traces (docs/trace.md): the framework-neutral writer of the
trace format, version 1. One JSON object per line (JSON Lines, UTF-8):

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
"""
import json

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


def entry_fields(arr, dtype=None, values=None):
    """hash, blocks, head of a C-contiguous numpy array (dtype: the
    format's dtype name when arr holds raw bits, e.g. BF16 as uint16, with
    values the float64 widening for the head)."""
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
    vals = values.reshape(-1)[:HEAD] if values is not None else flat[:HEAD]
    return {"dtype": name, "shape": list(a.shape), "hash": _xxh(raw), "blocks": blocks,
            "head": [_hexf(v) for v in vals]}


class TraceWriter:
    """Buffers one step's entries and writes them in canonical order at
    end_step(). Not thread-safe; one writer per file."""

    def __init__(self, path, model_id, producer):
        self.f = open(path, "w", encoding="utf-8")
        self.f.write(json.dumps({"bitexact_trace": VERSION, "model": model_id,
                                 "producer": producer, "hash": "xxh3-64", "blocks": BLOCKS,
                                 "head": HEAD}, sort_keys=True) + "\n")
        self.step = 0
        self._buf = []
        self._seen = {p: {} for p in PHASES}

    def add(self, phase, module, what, slice_index, arr, dtype=None, values=None):
        order = self._seen[phase].setdefault(module, len(self._seen[phase]))
        e = {"step": self.step, "phase": phase, "module": module, "what": what,
             "slice": slice_index}
        e.update(entry_fields(arr, dtype, values))
        key = (PHASES.index(phase), order, -1 if slice_index is None else slice_index, what)
        self._buf.append((key, e))

    def end_step(self):
        for _, e in sorted(self._buf, key=lambda t: t[0]):
            self.f.write(json.dumps(e, separators=(", ", ": ")) + "\n")
        self.f.flush()
        self._buf = []
        self._seen = {p: {} for p in PHASES}
        self.step += 1

    def close(self):
        if self._buf:
            self.end_step()
        self.f.close()
