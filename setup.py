"""Build of the extension bitexact._core: the whole C library, from source.

The sources are globbed (src/core/*.c, src/cpu/*.c, src/cuda/*.cu) so that
kernel files added later are picked up. Every file gets the library's base
flags (with the Makefile's warnings and -Werror; BITEXACT_WERROR=0 drops
-Werror); the per-ISA kernel files (src/cpu/avx2*.c, src/cpu/avx512*.c) also
get their ISA flags and nothing else does: the binary chooses AVX-512, AVX2
or the portable kernels at run time (src/core/dispatch.c). Never
-ffast-math or -march=native: -ffp-contract=off keeps every exact path
exact (and nvcc gets --fmad=false).

The CUDA backend (src/cuda/*.cu, compiled by nvcc and linked with the
static CUDA runtime, so the extension needs no CUDA library at run time and
imports on machines without a GPU) is built when nvcc is found. The
environment variable BITEXACT_CUDA chooses: 0 never, 1 always (the build
fails without nvcc), unset or "auto": when nvcc and src/cuda/*.cu exist.
nvcc is looked up as $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, on PATH, then
/usr/local/cuda/bin/nvcc. BITEXACT_CUDA_ARCHS (default "90") lists the SM
versions to generate code for ("80 90"); PTX of the highest is embedded too.
"""
import glob
import os
import platform
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
# Relative paths: setuptools wants them relative to setup.py's directory.
os.chdir(ROOT)
os.makedirs("build-python", exist_ok=True)  # build_base / egg_base below

# The Makefile's warnings (WARN), errors included: the extension's own files
# and the library's are held to the same standard as `make`. BITEXACT_WERROR=0
# keeps the warnings but not -Werror (a newer compiler's new warnings).
WARN_FLAGS = ["-Wall", "-Wextra", "-Wshadow", "-Wstrict-prototypes", "-Wmissing-prototypes"]
if os.environ.get("BITEXACT_WERROR", "1").strip() != "0":
    WARN_FLAGS.append("-Werror")
BASE_FLAGS = ["-std=c11", "-D_GNU_SOURCE", "-ffp-contract=off", "-fno-math-errno", "-O2",
              "-pthread", "-fvisibility=default"] + WARN_FLAGS
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


# ---- the CUDA backend -----------------------------------------------------

def find_nvcc():
    """(nvcc path, CUDA root) or (None, None)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc"), root
    found = shutil.which("nvcc")
    if found:
        found = os.path.realpath(found)
        return found, os.path.dirname(os.path.dirname(found))
    if os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        return "/usr/local/cuda/bin/nvcc", "/usr/local/cuda"
    return None, None


def cuda_config():
    """The CUDA build settings (a dict), or None for a CPU-only build; the
    reason is printed either way."""
    mode = os.environ.get("BITEXACT_CUDA", "auto").strip().lower()
    if mode not in ("0", "1", "auto", ""):
        sys.exit(f"setup.py: BITEXACT_CUDA must be 0, 1 or auto, not {mode!r}")
    if mode == "0":
        print("bitexact: building the CPU backend only (BITEXACT_CUDA=0)")
        return None
    sources = sorted(glob.glob("src/cuda/*.cu"))
    nvcc, root = find_nvcc()
    why = None
    if not nvcc:
        why = "nvcc not found (set CUDA_HOME)"
    elif not sources:
        why = "no src/cuda/*.cu sources"
    else:
        libdirs = [d for d in (os.path.join(root, "lib64"), os.path.join(root, "lib"),
                               os.path.join(root, "targets", "x86_64-linux", "lib"))
                   if os.path.exists(os.path.join(d, "libcudart_static.a"))]
        if not libdirs:
            why = f"libcudart_static.a not found under {root}"
    if why:
        if mode == "1":
            sys.exit(f"setup.py: BITEXACT_CUDA=1 but {why}")
        print(f"bitexact: building the CPU backend only ({why})")
        return None
    archs = os.environ.get("BITEXACT_CUDA_ARCHS", "90").replace(";", " ").replace(",", " ").split()
    if not archs or not all(a.isdigit() for a in archs):
        sys.exit(f"setup.py: BITEXACT_CUDA_ARCHS must list SM versions like '80 90', not {archs!r}")
    archs = sorted(set(archs), key=int)
    gencode = []
    for a in archs:
        gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    gencode += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]  # PTX
    print(f"bitexact: building with the CUDA backend ({nvcc}, "
          f"{', '.join('sm_' + a for a in archs)}, {len(sources)} .cu files)")
    return {
        "nvcc": nvcc,
        "sources": sources,
        "include": os.path.join(root, "include"),
        "libdir": libdirs[0],
        "flags": ["-std=c++17", "-O2", "--fmad=false"] + gencode
                 + ["-Iinclude", "-Isrc/core", "-Isrc/common", "-Isrc/cuda",
                    "-Xcompiler", "-fPIC,-ffp-contract=off", "-DBX_HAVE_CUDA=1"],
    }


def nvcc_compile(cfg, build_temp, include_dirs, depends, force=False):
    """Compile the .cu sources (in parallel) into objects; returns their paths."""
    extra_inc = [f"-I{d}" for d in include_dirs if d not in ("include", "src/core", "src/common")]
    out = os.path.join(build_temp, "cuda")
    os.makedirs(out, exist_ok=True)
    newest_header = max((os.path.getmtime(h) for h in depends if os.path.exists(h)), default=0)
    jobs = []
    for src in cfg["sources"]:
        obj = os.path.join(out, os.path.basename(src)[:-3] + ".o")
        cmd = [cfg["nvcc"]] + cfg["flags"] + extra_inc + ["-c", src, "-o", obj]
        line = " ".join(shlex.quote(c) for c in cmd)
        stamp = obj + ".cmd"  # the command that made obj: flags changes rebuild it
        fresh = (not force and os.path.exists(obj) and os.path.exists(stamp)
                 and open(stamp).read() == line
                 and os.path.getmtime(obj) >= max(os.path.getmtime(src), newest_header))
        jobs.append((obj, None if fresh else (cmd, line, stamp)))

    def run(job):
        obj, todo = job
        if todo is None:
            return None
        cmd, line, stamp = todo
        print(line)
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            return cmd, res
        with open(stamp, "w") as f:
            f.write(line)
        return None

    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        failures = [f for f in pool.map(run, jobs) if f]
    for cmd, res in failures:
        sys.stderr.write(res.stdout + res.stderr)
    if failures:
        sys.exit(f"setup.py: nvcc failed on {', '.join(c[-3] for c, _ in failures)}")
    return [obj for obj, _ in jobs]


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
        # A different configuration (CUDA on/off, its flags) rebuilds
        # everything: setuptools alone would keep objects made with the
        # other BX_HAVE_CUDA.
        config = repr((sorted(ext.extra_compile_args), ext.include_dirs, ext.extra_link_args,
                       CUDA and CUDA["flags"]))
        stamp = os.path.join(self.build_temp, "bitexact-config.txt")
        old = open(stamp).read() if os.path.exists(stamp) else None
        if old != config:
            self.force = True
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
        if CUDA:
            objects += nvcc_compile(CUDA, self.build_temp, ext.include_dirs, ext.depends,
                                    self.force)
        ext.sources = plain
        ext.extra_objects = list(ext.extra_objects or []) + objects
        super().build_extension(ext)
        os.makedirs(self.build_temp, exist_ok=True)
        with open(stamp, "w") as f:
            f.write(config)


HEADERS = (glob.glob("include/*.h") + glob.glob("src/core/*.h") + glob.glob("src/common/*.h") + glob.glob("src/cpu/*.h")
           + glob.glob("src/cuda/*.h") + glob.glob("src/cuda/*.cuh")
           + glob.glob("python/bitexact/*.h"))

CUDA = cuda_config()  # prints which backend is built
if CUDA:
    # every C file of the library (and the binding) sees BX_HAVE_CUDA=1:
    # the core routes kDLCUDA tensors to the GPU, the binding exposes plans
    COMPILE_FLAGS = BASE_FLAGS + ["-DBX_HAVE_CUDA=1"]
    INCLUDE_DIRS = ["include", "src/core", "src/common"] + DLPACK_DIRS + [CUDA["include"]]
    # static CUDA runtime: nothing to find at run time; the driver
    # (libcuda.so) is opened at the first CUDA call, so importing works
    # without a GPU or driver
    LINK_ARGS = ["-pthread", "-L" + CUDA["libdir"], "-lcudart_static", "-ldl", "-lrt",
                 "-lstdc++"]
else:
    COMPILE_FLAGS, INCLUDE_DIRS, LINK_ARGS = BASE_FLAGS, ["include", "src/core", "src/common"] + DLPACK_DIRS, \
        ["-pthread"]

setup(
    ext_modules=[Extension(
        "bitexact._core",
        sources=sorted(glob.glob("python/bitexact/*.c")) + library_sources(),
        include_dirs=INCLUDE_DIRS,
        depends=HEADERS + (CUDA["sources"] if CUDA else []),
        extra_compile_args=COMPILE_FLAGS,
        extra_link_args=LINK_ARGS,
        libraries=["m"],
    )],
    cmdclass={"build_ext": BuildExt},
    # out of the Makefile's build/ (setuptools' default): build-python/ is ignored
    options={"build": {"build_base": "build-python"},
             "egg_info": {"egg_base": "build-python"}},
)
