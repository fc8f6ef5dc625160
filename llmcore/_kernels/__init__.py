"""Compiled kernels (built from pyx/ by ``pip install``). Importing any of them goes through
this file first.

Modules: ``norms``, ``rope``, ``activations``, ``kv_rows``, ``attention`` (the ops of
llmcore.nn), ``quants``, ``kquants`` and ``iquants`` (the weight formats of llmcore.quant, one
interface), ``ssm`` (llmcore.ssm).

``ENABLED`` is the one switch between these kernels and the NumPy reference versions of the
same ops: ``LLMCORE_NO_KERNELS=1`` in the environment (read once, at import) turns the kernels
off, for tests and debugging. Otherwise the kernels are required, and a module that is not
built is an error (:class:`KernelsNotBuilt`), never a silent fallback to the slow path.

OpenMP threads that wait at a barrier sleep instead of spinning: the cores are shared (other
processes, the event loop), and a spinning waiter that gets descheduled costs a whole time
slice. libgomp reads the policy once, when the first kernel module loads it, so it is set
here; an explicit OMP_WAIT_POLICY in the environment wins.
"""
import importlib
import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ["LLMCORE_SET_OMP_WAIT_POLICY"] = "1"  # so child processes can tell it was us

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
