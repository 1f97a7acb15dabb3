"""Helpers for the command-line tests: exact reference norms computed with
Python integers (independent of bitexact), the canonical hash recomputed
with the `xxhash` package, and a raw safetensors writer that lets a test
choose tensor order, padding and deliberate corruption."""
import json
import math
import struct
from fractions import Fraction

# ------------------------------------------------------------ exact norms


def exact_sumsq(values):
    """Exact sum of squares of Python floats, as a Fraction."""
    buckets = {}
    for x in values:
        n, d = x.as_integer_ratio()
        k = d.bit_length() - 1  # d == 2**k
        buckets[k] = buckets.get(k, 0) + n * n
    if not buckets:
        return Fraction(0)
    top = max(buckets)
    s = 0
    for k, v in buckets.items():
        s += v << (2 * (top - k))
    return Fraction(s, 1 << (2 * top))


def sqrt_rounded(q):
    """Correctly rounded (nearest-even) double sqrt of a non-negative
    Fraction whose denominator is a power of two (or 1)."""
    if q == 0:
        return 0.0
    num, den = q.numerator, q.denominator
    # den = 2**m; make the exponent even, then scale so the root has >= 64 bits
    m = den.bit_length() - 1
    if m % 2:
        num <<= 1
        m += 1
    shift = max(0, 140 - num.bit_length())
    shift += shift % 2
    big = num << shift
    r = math.isqrt(big)
    exact = r * r == big
    # true root in [r, r + 1); r has >= 70 bits, so a rounding boundary at 53
    # bits is an integer: r + 1/2 rounds like the true root unless exact
    root = Fraction(2 * r + (0 if exact else 1), 2)
    return float(root / (1 << (m // 2 + shift // 2)))


def ref_norm(values, ord_=2.0):
    vals = list(values)
    if any(math.isnan(v) for v in vals):
        return math.nan
    if ord_ == 2.0:
        if any(math.isinf(v) for v in vals):
            return math.inf
        return sqrt_rounded(exact_sumsq(vals))
    if ord_ == 1.0:
        if any(math.isinf(v) for v in vals):
            return math.inf
        total = sum((Fraction(abs(v)) for v in vals), Fraction(0))
        try:
            return float(total)  # correctly rounded
        except OverflowError:
            return math.inf
    if ord_ == math.inf:
        return max((abs(v) for v in vals), default=0.0)
    if ord_ == -math.inf:
        return min((abs(v) for v in vals), default=0.0)
    if ord_ == 0.0:
        return float(sum(1 for v in vals if v != 0))
    raise ValueError(ord_)


# ------------------------------------------------------------ the hash


def tensor_hash(xxhash, name, dtype, shape, data):
    """The canonical tensor hash of `bitexact hash --help`."""
    h = xxhash.xxh3_128(seed=0)
    u64 = lambda v: struct.pack("<Q", v)
    nb = name.encode()
    h.update(u64(len(nb)) + nb)
    h.update(u64(len(dtype)) + dtype.encode())
    h.update(u64(len(shape)) + b"".join(u64(d) for d in shape))
    h.update(u64(len(data)))
    h.update(data)
    return h.digest()


def checkpoint_hash(xxhash, digests_by_name):
    h = xxhash.xxh3_128(seed=0)
    for name in sorted(digests_by_name, key=lambda s: s.encode()):
        h.update(digests_by_name[name])
    return h.hexdigest()


# ------------------------------------------------------------ raw writer


def write_raw(path, tensors, order=None, gap=0, lead=0, tail=0, metadata=None,
              header_pad=0, header_override=None):
    """tensors: list of (name, dtype, shape, data bytes). order: indices in
    the order their bytes are laid out; gap/lead/tail: padding bytes between,
    before and after the tensors; header_override: a JSON text to use as is."""
    order = list(range(len(tensors))) if order is None else order
    header, chunks, off = {}, [], lead
    chunks.append(b"\xee" * lead)
    for i in order:
        name, dtype, shape, data = tensors[i]
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
        chunks.append(b"\xee" * gap)
        off += gap
    chunks.append(b"\xee" * tail)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = header_override if header_override is not None else json.dumps(header)
    hb = text.encode() + b" " * header_pad
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        f.write(b"".join(chunks))
