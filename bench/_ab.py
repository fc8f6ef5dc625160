"""Loading a built kernel extension from a folder under its package name, for the A/B
benchmarks that run two builds in one process (bench/attn_ab.py, bench/matmul_ab.py)."""
from __future__ import annotations

import glob
import importlib.util
import os


def load_build(folder: str, module: str):
    """The extension `module` (attention, quants, kquants, ...) built into `folder`."""
    path = glob.glob(os.path.join(folder, f"{module}.*.so"))[0]
    spec = importlib.util.spec_from_file_location(f"llmcore._kernels.{module}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
