"""Compile a C harness against pyx/'s SIMD headers with chosen target flags, so that tests can
run the kernel paths this machine's build does not contain (AVX2 on an AVX-512 machine, the
plain C fallback anywhere). Skips the test when gcc is missing or does not take the flags."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PYX = Path(__file__).resolve().parent.parent / "pyx"


def build_c_harness(tmp_path: Path, source: str, flags: list[str], name: str = "h", opt: str = "-O2") -> Path:
    """`source` built with `flags` (and `opt`) against pyx/, as tmp_path/name; the path."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void){return 0;}\n")
    if subprocess.run(["gcc", *flags, str(probe), "-o", str(tmp_path / "probe")], capture_output=True).returncode:
        pytest.skip(f"gcc does not take {flags}")
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    exe = tmp_path / name
    r = subprocess.run(["gcc", opt, *flags, f"-I{PYX}", str(src), "-o", str(exe), "-lm"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:3000]
    return exe
