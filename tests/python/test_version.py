"""bitexact.__version__ is the C library's version (bx_version_string), whose
single source is include/bitexact.h's BX_VERSION_MAJOR/MINOR/PATCH lines:
read here independently, with the regex the build files use."""
import os
import re

import bitexact
from bitexact import _core

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
