"""Slot save / restore / erase (llama-server's /slots/{id}?action=...), engine side: a slot
saved and restored on another slot continues with exactly the same tokens; llama-server's
result shapes; bad file names, a missing file and a server without --slot-save-path are
refused with their error classes. Dense, sliding-window and recurrent tiny models."""
import pytest

from llmcore.errors import NotSupportedError, RequestError, SlotFileError
from llmcore.engine.slot_files import validate_filename
from test_disk_cache import MODELS, gp, identical, start, toks


@pytest.fixture(params=list(MODELS))
def model_path(request, tiny_models, built_model):
    return MODELS[request.param](tiny_models, built_model)


def test_save_then_restore_on_another_slot_gives_the_same_next_tokens(model_path, tmp_path):
    eng = start(model_path, n_parallel=2, slot_save_path=str(tmp_path), cache_ram_mib=0)
    try:
        p1 = toks(1, 150)
        r1 = eng.generate_sync(p1, gp(id_slot=0))
        saved = eng.save_slot(0, "conv.bin").result(30)
        n = len(p1) + len(r1.tokens) - 1
        assert saved["id_slot"] == 0 and saved["filename"] == "conv.bin" and saved["n_saved"] == n
        assert saved["n_written"] == (tmp_path / "conv.bin").stat().st_size > 0
        assert saved["timings"]["save_ms"] >= 0
        p2 = p1 + r1.tokens + toks(2, 40)
        restored = eng.restore_slot(1, "conv.bin").result(30)
        assert restored == {"id_slot": 1, "filename": "conv.bin", "n_restored": n, "n_read": saved["n_written"],
                            "timings": restored["timings"]}
        assert eng.slots[1].n_tokens == n
        on_1 = eng.generate_sync(p2, gp(id_slot=1))
        assert on_1.final.timings.cache_n == n and on_1.final.timings.cache_source == "slot"
        on_0 = eng.generate_sync(p2, gp(id_slot=0))  # the original slot, never saved or restored
        assert on_0.final.timings.cache_n == n
        identical(on_1, on_0)
        erased = eng.erase_slot(1).result(30)
        assert erased == {"id_slot": 1, "n_erased": eng_n(on_1, p2)} and eng.slots[1].n_tokens == 0
    finally:
        eng.stop()


def eng_n(c, prompt):
    return len(prompt) + len(c.tokens) - 1


def test_restored_checkpoints_still_roll_back(built_model, tmp_path):
    """A recurrent slot restored from a file keeps its checkpoints: a prompt that diverges
    before the end is served from one of them."""
    eng = start(built_model("mamba2"), n_parallel=2, slot_save_path=str(tmp_path), cache_ram_mib=0)
    try:
        p1 = toks(3, 200)
        eng.generate_sync(p1, gp(id_slot=0))
        assert len(eng.slots[0].checkpoints) > 0
        eng.save_slot(0, "m").result(30)
        eng.restore_slot(1, "m").result(30)
        assert eng.slots[1].checkpoints.positions() == eng.slots[0].checkpoints.positions()
        diverge = p1[:150] + toks(4, 30)
        a = eng.generate_sync(diverge, gp(id_slot=1))
        b = eng.generate_sync(diverge, gp(id_slot=0))
        assert a.final.timings.cache_source == "checkpoint" and a.final.timings.cache_n == b.final.timings.cache_n > 0
        identical(a, b)
    finally:
        eng.stop()


def test_refusals(tiny_models, tmp_path):
    path = tiny_models["llama-f32"]
    off = start(path)
    try:
        with pytest.raises(NotSupportedError):
            off.save_slot(0, "x")
        assert off.erase_slot(0).result(10) == {"id_slot": 0, "n_erased": 0}  # needs no files
    finally:
        off.stop()
    eng = start(path, slot_save_path=str(tmp_path))
    try:
        for bad in ("", "../x", "a/b", ".", "..", "x.", " x", "a\x00b", "a:b", "é" * 200):
            with pytest.raises(SlotFileError, match="Invalid filename"):
                eng.save_slot(0, bad)
        with pytest.raises(RequestError, match="slot id"):
            eng.save_slot(5, "x")
        with pytest.raises(RequestError, match="action"):
            eng.slot_action("dump", 0, "x")
        with pytest.raises(SlotFileError, match="file not found"):
            eng.restore_slot(0, "missing.bin").result(10)
        (tmp_path / "junk.bin").write_bytes(b"not a state")
        with pytest.raises(SlotFileError, match="invalid slot save file"):
            eng.restore_slot(0, "junk.bin").result(10)
        assert eng.generate_sync(toks(5, 20), gp()).tokens  # still serving
    finally:
        eng.stop()


def test_a_busy_slot_is_saved_once_its_request_ends(tiny_models, tmp_path):
    eng = start(tiny_models["llama-f32"], slot_save_path=str(tmp_path))
    try:
        task = eng.submit(toks(6, 100), gp(n_predict=200), sync=True)
        fut = eng.save_slot(0, "later")
        out = task.collect_sync()
        res = fut.result(30)
        assert res["n_saved"] == 100 + len(out.tokens) - 1  # the state after the request
    finally:
        eng.stop()


def test_validate_filename_accepts_plain_names():
    for ok in ("a", "conv-1.bin", "slot_0.state", "ü.bin", "x" * 255):
        assert validate_filename(ok) == ok
