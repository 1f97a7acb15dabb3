"""Independent exact reference for the Python tests: Python integers only.

Every finite binary float is m * 2^e with integer m; sums of squares and
of absolute values are formed exactly as big integers at a common scale, and
rounding to a format (p significand bits, normal exponents emin..emax) is
done by integer comparison, ties to even. Nothing here uses bitexact or
floating-point arithmetic on the values.
"""
import math
from fractions import Fraction

import numpy as np

# (precision incl. hidden bit, emin, emax)
FORMATS = {
    "float64": (53, -1022, 1023),
    "float32": (24, -126, 127),
    "bfloat16": (8, -126, 127),
    "float16": (11, -14, 15),
}

MIN_EXP = -1074 - 60  # below every fp64 subnormal: a common scale for all values


def as_float64_list(arr):
    """Exact float64 values of a NumPy array or torch tensor (any float dtype)."""
    if hasattr(arr, "detach"):  # torch: bf16/fp16/fp32 widen exactly to fp64
        arr = arr.detach().to("cpu").double().numpy()
    return np.asarray(arr, dtype=np.float64).ravel().tolist()


def _int_at_scale(x, scale_exp):
    """|x| * 2^-scale_exp as an exact integer (x finite)."""
    num, den = abs(x).as_integer_ratio()  # den is a power of two
    shift = -scale_exp - (den.bit_length() - 1)
    return num << shift if shift >= 0 else (num >> -shift)  # never truncates: scale below all


def exact_sum(tensors, power):
    """(N, scale_exp) with sum |x|^power == N * 2^scale_exp exactly (power 1
    or 2), or None-flags: returns ('nan'|'inf', None) for non-finite data."""
    scale = MIN_EXP * power
    total = 0
    has_inf = False
    for t in tensors:
        for x in as_float64_list(t):
            if x != x:
                return "nan", None
            if math.isinf(x):
                has_inf = True
                continue
            if x == 0.0:
                continue
            m = _int_at_scale(x, MIN_EXP)
            total += m * m if power == 2 else m
    if has_inf:
        return "inf", None
    return total, scale


def round_fraction(v, fmt):
    """Round a non-negative Fraction to the format, ties to even -> float."""
    p, emin, emax = FORMATS[fmt]
    if v == 0:
        return 0.0
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if Fraction(2) ** e > v:
        e -= 1
    e = max(e, emin)
    q = Fraction(2) ** (e - p + 1)
    r = v / q
    n = r.numerator // r.denominator
    rem = r - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    res = n * q
    maxv = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if res > maxv:
        return math.inf
    return float(res)


def round_sqrt(n, scale_exp, fmt):
    """Correctly rounded sqrt(n * 2^scale_exp) in the format (scale_exp even)."""
    assert scale_exp % 2 == 0
    p, emin, emax = FORMATS[fmt]
    if n == 0:
        return 0.0
    e = (n.bit_length() - 1 + scale_exp) // 2  # floor(log2(sqrt(value)))
    e = max(e, emin)
    j = e - p + 1  # quantum 2^j
    # t = value / 2^(2j) = n * 2^(scale_exp - 2j)
    s = scale_exp - 2 * j
    if s >= 0:
        t_num, t_den_exp = n << s, 0
    else:
        t_num, t_den_exp = n, -s
    r = math.isqrt(t_num >> t_den_exp)  # floor(sqrt(t))
    # compare t with (r + 1/2)^2:  4 * t_num  vs  (2r+1)^2 * 2^t_den_exp
    lhs, rhs = 4 * t_num, (2 * r + 1) ** 2 << t_den_exp
    if lhs > rhs or (lhs == rhs and r % 2 == 1):
        r += 1
    res = Fraction(r) * Fraction(2) ** j
    maxv = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if res > maxv:
        return math.inf
    return float(res)


def exact_norm(tensors, fmt="float64", norm_type=2.0):
    """The exact p-norm (p = 2, 1, inf, 0) of all elements, correctly
    rounded to fmt, as a Python float."""
    if norm_type in (2.0, 1.0):
        n, scale = exact_sum(tensors, int(norm_type))
        if n == "nan":
            return math.nan
        if n == "inf":
            return math.inf
        if norm_type == 2.0:
            return round_sqrt(n, scale, fmt)
        return round_fraction(Fraction(n) * Fraction(2) ** scale, fmt)
    vals = [x for t in tensors for x in as_float64_list(t)]
    if norm_type == math.inf:
        return round_fraction(Fraction(max((abs(x) for x in vals), default=0.0)), fmt)
    if norm_type == 0.0:
        return round_fraction(Fraction(sum(1 for x in vals if x != 0)), fmt)
    raise ValueError(norm_type)


def exact_megatron(tensors):
    """Megatron-LM's reproducible norm: fp32 squares rounded to fp32, summed
    exactly, rounded once to fp32, fp32 sqrt (correctly rounded)."""
    total = Fraction(0)
    for t in tensors:
        a = np.asarray(as_float64_list(t), dtype=np.float64).astype(np.float32)
        sq = (a * a).astype(np.float32)  # fp32 multiply: rounded once to fp32
        total += sum(Fraction(float(x)) for x in sq.tolist())
    s32 = round_fraction(total, "float32")
    if math.isinf(s32):
        return math.inf
    n = Fraction(s32)
    # sqrt of an fp32 value correctly rounded to fp32
    num, den = n.numerator, n.denominator
    den_exp = den.bit_length() - 1
    if den_exp % 2:
        num, den_exp = num * 2, den_exp + 1
    return round_sqrt(num, -den_exp, "float32")
