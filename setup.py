"""Build the Cython kernels in pyx/ (one extension per pyx/<name>.pyx, llmcore._kernels.<name>;
see pyx/README.md) with OpenMP and SIMD tuned for this machine.

Environment:
  LLMCORE_PORTABLE=1     no -march=native (portable wheels)
  LLMCORE_NO_OPENMP=1    build without OpenMP (serial kernels)
  LLMCORE_DEBUG_CYTHON=1 bounds checks on, -O0 -g
  LLMCORE_ONLY=mod1,mod2 build only these pyx modules
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _compiles(flags, source="int main(void){return 0;}\n", link_flags=()):
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "t.c")
        with open(src, "w") as f:
            f.write(source)
        cmd = [cc, *flags, src, "-o", os.path.join(tmp, "t"), *link_flags]
        return subprocess.run(cmd, capture_output=True).returncode == 0


OPENMP_TEST = "#include <omp.h>\nint main(void){\n#pragma omp parallel\n{ (void)omp_get_thread_num(); }\nreturn 0;}\n"

debug = os.environ.get("LLMCORE_DEBUG_CYTHON") == "1"
compile_args = ["-O0", "-g"] if debug else ["-O3"]
compile_args += ["-fno-strict-aliasing", "-Wno-unused-function", "-Wno-unreachable-code"]
link_args = []

if os.environ.get("LLMCORE_PORTABLE") != "1" and _compiles(["-march=native"]):
    compile_args.append("-march=native")
elif os.environ.get("LLMCORE_PORTABLE") != "1":
    warnings.warn("llmcore: -march=native not supported by the compiler; building portable kernels")

if os.environ.get("LLMCORE_NO_OPENMP") != "1" and _compiles(["-fopenmp"], OPENMP_TEST, ["-fopenmp"]):
    compile_args.append("-fopenmp")
    link_args.append("-fopenmp")
else:
    warnings.warn("llmcore: OpenMP not available; kernels will run on one thread")
    if _compiles(["-fopenmp-simd"]):
        # `#pragma omp simd` (vectorisation, no runtime) still applies: same sums as threaded builds
        compile_args.append("-fopenmp-simd")

extensions = [
    Extension(
        "llmcore._kernels." + os.path.splitext(os.path.basename(path))[0],
        [path],
        include_dirs=[np.get_include(), "pyx"],
        depends=sorted(glob.glob("pyx/*.h")),  # headers include each other (simd.h): rebuild on any change
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for path in sorted(glob.glob("pyx/*.pyx"))
    # LLMCORE_ONLY=a,b builds just those modules (parallel development, faster rebuilds)
    if not os.environ.get("LLMCORE_ONLY")
    or os.path.splitext(os.path.basename(path))[0] in os.environ["LLMCORE_ONLY"].split(",")
]


def _say(msg):
    """To stderr, and to the terminal when pip captures the build's output (it shows it only
    with -v): a first install should not look stuck for minutes."""
    print(msg, file=sys.stderr, flush=True)
    if not sys.stderr.isatty():
        try:
            with open("/dev/tty", "w") as tty:
                tty.write("\n" + msg + "\n")
        except OSError:
            pass


class build_kernels(build_ext):
    """build_ext that says it is compiling the kernels, how long that takes, and how long it took."""

    def run(self):
        n = len(self.extensions)
        flags = " ".join(f for f in compile_args if f.startswith(("-O", "-march", "-fopenmp")))
        # a fresh -O3 build of all of them takes about a minute on 2 cores
        _say(f"llmcore: compiling {n} kernel module(s) with {flags} (about 1 minute for all on 2 cores, "
             f"once; LLMCORE_PORTABLE=1 skips -march=native)...")
        t0 = time.monotonic()
        super().run()
        _say(f"llmcore: kernels compiled in {time.monotonic() - t0:.0f} s")


setup(
    cmdclass={"build_ext": build_kernels},
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": 3,
            "boundscheck": debug,
            "wraparound": False,
            "initializedcheck": debug,
            "cdivision": True,
        },
        quiet=True,
    ),
)
