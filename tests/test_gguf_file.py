"""GGUF loading: our header parser equals the gguf package's reader; bad files give one-line errors."""
import numpy as np
import pytest

import gguf
from llmcore.errors import ModelLoadError
from llmcore.gguf_file import GGUFFile


def _write(path, arch="llama", extra=None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_string("test.str", "héllo")
    w.add_array("test.strs", ["a", "bc", "", "日本"])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, 1.5])
    w.add_bool("test.bool", True)
    w.add_float32("test.f32", 0.25)
    w.add_uint64("test.u64", 2**40)
    rng = np.random.default_rng(0)
    w.add_tensor("a.weight", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("b.weight", rng.standard_normal((5, 32)).astype(np.float16))
    q = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("c.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    for k, v in (extra or {}).items():
        w.add_string(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_matches_gguf_reader(tmp_path):
    p = _write(tmp_path / "m.gguf")
    g = GGUFFile(p)
    r = gguf.GGUFReader(str(p))
    for k, f in r.fields.items():
        if not k.startswith("GGUF."):
            assert g.meta[k] == f.contents(), k
    assert g.arch == "llama"
    for t in r.tensors:
        mine = g.tensors[t.name]
        assert mine.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
        assert mine.data.dtype == t.data.dtype and mine.data.shape == t.data.shape
        assert np.array_equal(mine.data.view(np.uint8), t.data.view(np.uint8))
    np.testing.assert_array_equal(g.tensors["c.weight"].dequantize(),
                                  gguf.quants.dequantize(r.tensors[2].data, gguf.GGMLQuantizationType.Q8_0))


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        GGUFFile(p)


def test_missing_and_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(ModelLoadError, match="directory"):
        GGUFFile(tmp_path)


@pytest.mark.parametrize("keep", [30, 200, -100])
def test_truncated(tmp_path, keep):
    p = _write(tmp_path / "m.gguf")
    data = p.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:keep] if keep > 0 else data[:keep])
    with pytest.raises(ModelLoadError, match="truncated"):
        GGUFFile(cut)


def test_missing_metadata_key(tmp_path):
    g = GGUFFile(_write(tmp_path / "m.gguf"))
    with pytest.raises(ModelLoadError, match="missing metadata key 'llama.context_length'"):
        g.arch_key("context_length")
    assert g.arch_key("context_length", 4096) == 4096


def test_unsupported_architecture(tmp_path):
    from llmcore.models import load_model

    with pytest.raises(ModelLoadError, match="unsupported architecture 'bert'.*supported: .*llama"):
        load_model(_write(tmp_path / "m.gguf", arch="bert"))
