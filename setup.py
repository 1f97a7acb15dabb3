"""Build of the extension bitexact._core: the whole C library, from source.

The sources are globbed (src/core/*.c, src/cpu/*.c) so that kernel files
added later are picked up. Every file gets the library's base flags; the
per-ISA kernel files (src/cpu/avx2*.c, src/cpu/avx512*.c) also get their
ISA flags and nothing else does: the binary chooses AVX-512, AVX2 or the
portable kernels at run time (src/core/dispatch.c). Never -ffast-math or
-march=native: -ffp-contract=off keeps every exact path exact.
"""
import glob
import os
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
# Relative paths: setuptools wants them relative to setup.py's directory.
os.chdir(ROOT)
os.makedirs("build-python", exist_ok=True)  # build_base / egg_base below

BASE_FLAGS = ["-std=c11", "-D_GNU_SOURCE", "-ffp-contract=off", "-fno-math-errno", "-O2",
              "-pthread", "-fvisibility=default", "-Wall"]
ISA_FLAGS = {
    "avx2": ["-mavx2", "-mfma", "-mf16c", "-mbmi2"],
    "avx512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl",
               "-mavx2", "-mfma", "-mf16c", "-mbmi2"],
}
X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def isa_of(path):
    """'avx2', 'avx512' or None for a library source file."""
    name = os.path.basename(path)
    for isa in ("avx512", "avx2"):
        if name == isa + ".c" or name.startswith(isa + "_"):
            return isa
    return None


def library_sources():
    core = sorted(glob.glob("src/core/*.c"))
    cpu = sorted(glob.glob("src/cpu/*.c"))
    if not core or not cpu:
        sys.exit("setup.py: src/core/*.c or src/cpu/*.c not found; build from the "
                 "bitexact repository root")
    if not X86:  # the ISA kernels are x86 only; dispatch.c refers to them on x86 only
        cpu = [f for f in cpu if isa_of(f) is None]
    return core + cpu


# /usr/include is searched anyway (and must not be given with -I).
HAVE_DLPACK = any(os.path.exists(os.path.join(d, "dlpack", "dlpack.h"))
                  for d in ("/usr/include", "/usr/local/include"))
DLPACK_DIRS = [d for d in ("/usr/local/include",)
               if os.path.exists(os.path.join(d, "dlpack", "dlpack.h"))]


class BuildExt(build_ext):
    """build_ext with per-file flags: ISA kernels are compiled first, with
    their extra flags, and linked in as objects."""

    def build_extension(self, ext):
        if not HAVE_DLPACK and not os.environ.get("BITEXACT_DLPACK_INCLUDE"):
            raise SystemExit("bitexact: <dlpack/dlpack.h> not found; install Debian's "
                             "libdlpack-dev (apt-get install libdlpack-dev) or set "
                             "BITEXACT_DLPACK_INCLUDE to the directory holding dlpack/")
        if os.environ.get("BITEXACT_DLPACK_INCLUDE"):
            ext.include_dirs.append(os.environ["BITEXACT_DLPACK_INCLUDE"])
        plain, objects = [], []
        by_isa = {}
        for src in ext.sources:
            isa = isa_of(src) if src.startswith("src/cpu/") else None
            (by_isa.setdefault(isa, []) if isa else plain).append(src)
        for isa, srcs in sorted(by_isa.items()):
            objects += self.compiler.compile(
                srcs, output_dir=self.build_temp, include_dirs=ext.include_dirs,
                extra_postargs=ext.extra_compile_args + ISA_FLAGS[isa],
                depends=ext.depends, debug=self.debug)
        ext.sources = plain
        ext.extra_objects = list(ext.extra_objects or []) + objects
        super().build_extension(ext)


HEADERS = (glob.glob("include/*.h") + glob.glob("src/core/*.h") + glob.glob("src/cpu/*.h")
           + glob.glob("python/bitexact/*.h"))

setup(
    ext_modules=[Extension(
        "bitexact._core",
        sources=sorted(glob.glob("python/bitexact/*.c")) + library_sources(),
        include_dirs=["include", "src/core"] + DLPACK_DIRS,
        depends=HEADERS,
        extra_compile_args=BASE_FLAGS,
        extra_link_args=["-pthread"],
        libraries=["m"],
    )],
    cmdclass={"build_ext": BuildExt},
    # out of the Makefile's build/ (setuptools' default): build-python/ is ignored
    options={"build": {"build_base": "build-python"},
             "egg_info": {"egg_base": "build-python"}},
)
