"""bitexact.__version__ is the C library's version (bx_version_string), whose
single source is include/bitexact.h's BX_VERSION_MAJOR/MINOR/PATCH lines:
read here independently, with the regex the build files use."""
import ctypes
import os
import re

import bitexact
from bitexact import _core
from dlpack_ctypes import BxNormOpts, c_total_norm
from helpers import random_tensors

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include",
                      "bitexact.h")


def header_version():
    text = open(HEADER, encoding="utf-8").read()
    parts = []
    for name in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#define BX_VERSION_%s (\d+)$" % name, text, re.M)
        assert m, "include/bitexact.h has no plain '#define BX_VERSION_%s N' line" % name
        parts.append(int(m.group(1)))
    return tuple(parts)


def test_version_is_the_headers():
    major, minor, patch = header_version()
    want = "%d.%d.%d" % (major, minor, patch)
    assert bitexact.__version__ == want
    assert bitexact.library_version() == want
    assert _core.VERSION_NUMBER == major * 10000 + minor * 100 + patch
    assert _core.HEADER_VERSION_NUMBER == _core.VERSION_NUMBER


def test_version_comes_from_the_library():
    assert isinstance(bitexact.__version__, str)
    assert bitexact.__version__ == _core.version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", bitexact.__version__)
    # no literal of its own in the package
    src = open(bitexact.__file__, encoding="utf-8").read()
    assert not re.search(r"^__version__\s*=\s*['\"]", src, re.M), \
        "bitexact/__init__.py hard-codes __version__"


def test_c_api_checks_struct_size():
    """A C caller (here ctypes) whose bx_norm_opts has another layout is
    refused with BX_EINVAL and a message, its output untouched."""
    lib = ctypes.CDLL(_core.__file__)
    lib.bx_last_error.restype = ctypes.c_char_p
    grads = random_tensors(5, ["float32"], count=3)
    st, norm = c_total_norm(lib, grads)
    assert st == 0 and norm == bitexact.total_norm(grads)
    right = ctypes.sizeof(BxNormOpts)
    for size in (0, right - 8, right + 8):
        st, norm = c_total_norm(lib, grads, struct_size=size)
        assert st == 1 and norm == -1.0, size  # BX_EINVAL, nothing written
        msg = lib.bx_last_error().decode()
        assert msg.startswith("bx_total_norm: opts->struct_size is %d" % size), msg
