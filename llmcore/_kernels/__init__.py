"""Compiled kernels (built from pyx/ by ``pip install``). Importing any of them goes through
this file first.

Modules: ``norms``, ``rope``, ``activations``, ``kv_rows``, ``attention`` (the ops of
llmcore.nn), ``quants``, ``kquants`` and ``iquants`` (the weight formats of llmcore.quant, one
interface), ``ssm`` (llmcore.ssm), ``deltanet`` (llmcore.models.deltanet), ``moe`` (the
expert-output sum of llmcore.models.moe).

``ENABLED`` is the one switch between these kernels and the NumPy reference versions of the
same ops: ``LLMCORE_NO_KERNELS=1`` in the environment (read once, at import) turns the kernels
off, for tests and debugging. Otherwise the kernels are required, and a module that is not
built is an error (:class:`KernelsNotBuilt`), never a silent fallback to the slow path.

OpenMP threads that wait at a barrier sleep instead of spinning: the cores are shared (other
processes, the event loop), and a spinning waiter burns the core another thread needs or gets
descheduled and costs a whole time slice (measured on a loaded 2-core machine: with 1000
spins, a 2-thread SmolLM2 decode step took 15 ms at best against 7.7 ms passive). On a
dedicated machine a brief spin pays: a decode step is a chain of short parallel regions a
few microseconds of Python apart, and a waiter that sleeps at once pays a futex wake-up at
each. ``LLMCORE_OMP_SPIN=N`` (default 0) makes waiters spin N iterations of libgomp's pause
loop (~50 ns each on current x86 cores) before they sleep, and then small decode matmuls are
split over the threads too (``quant.MIN_BYTES_PER_THREAD``). libgomp reads these once, when
the first kernel module loads it, so they are set here; an explicit OMP_WAIT_POLICY or
GOMP_SPINCOUNT in the environment wins.
"""
import importlib
import os

SPIN_COUNT = int(os.environ.get("LLMCORE_OMP_SPIN", "0") or 0)

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ["LLMCORE_SET_OMP_WAIT_POLICY"] = "1"  # so child processes can tell it was us
    # (only when asked: PASSIVE alone means no spin, and child processes such as the
    # benchmarks' llama.cpp peers then inherit nothing they must undo)
    if SPIN_COUNT > 0 and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
        os.environ["LLMCORE_SET_GOMP_SPINCOUNT"] = "1"

# A spinning waiter makes splitting a small matmul over threads cheap (quant.MIN_BYTES_PER_THREAD)
SPINNING = os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE" or int(os.environ.get("GOMP_SPINCOUNT", "0") or 0) > 0

ENABLED = os.environ.get("LLMCORE_NO_KERNELS") != "1"


class KernelsNotBuilt(ImportError):
    """A kernel module is missing: the package was not built (or built without it)."""


def load(name: str):
    """The compiled module ``llmcore._kernels.<name>``."""
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise KernelsNotBuilt(
            f"llmcore kernel module {name!r} is not built: run `pip install -e .` (or "
            f"`python setup.py build_ext --inplace`), or set LLMCORE_NO_KERNELS=1 to run the "
            f"NumPy reference ops instead") from e
