"""Model registry keyed by GGUF ``general.architecture``.

    from llmcore.models import load_model
    model = load_model("model.gguf", kv_type="f16", block_size=32, max_kv_bytes=1 << 30)
    st = model.new_state()
    logits = model.forward([(st, prompt_ids)])        # (1, n_vocab), last position
    logits = model.forward([(st, [next_id]), (st2, ids2)])

Adding an architecture: a module ``llmcore/models/<name>.py`` whose :class:`base.Model`
subclass (or a subclass of an existing architecture: ``qwen3.Qwen3`` is ``llama.Llama``
with two flags) is decorated ``@register("<general.architecture>")``; add its module name
to ``_MODULES``. The module reads as the recipe of the graph:

- ``__init__``: create one block pool per attention-layer group (``self.add_pool``; for
  a local/global layer mix, :class:`sliding_window.SlidingWindowLayers`), then build
  ``self.embed``, ``self.blocks`` (:class:`blocks.PreNormBlock`: norm, mixer, optional
  post norm, and optionally norm, FFN, post norm) and ``self.head``
  (``self.output_head()``) with the ``Model`` helpers ``norm``, ``attention``,
  ``gated_ffn``, ``experts``; a new kind of layer (a mixer ``(h, fb) -> y`` or an FFN
  ``h -> y``) is a class in the module;
- ``make_cache()``: the per-sequence state of each cache group, e.g.
  ``{"kv": KVCacheState(self.pool)}``, ``SWAKVCacheState`` for windowed layers,
  ``RecurrentState`` for recurrent ones (what the layers find in ``seq.caches[group]``);
- ``_forward`` only when the graph is not embed -> blocks (:func:`blocks.run_blocks`) ->
  head.
"""

from __future__ import annotations

import importlib
import os
from typing import Callable

from ..errors import ModelLoadError

# general.architecture -> module under llmcore.models (imported on first use)
_MODULES: dict[str, str] = {
    "llama": "llama",
    "qwen3": "qwen3",
    "mamba": "mamba",
    "mamba2": "mamba",
    "lfm2": "lfm2",
    "qwen3moe": "qwen3moe",
    "gemma3": "gemma3",
    "gpt-oss": "gpt_oss",
    "qwen35": "qwen35",
    "qwen35moe": "qwen35",
    "qwen3next": "qwen3next",
}
_REGISTRY: dict[str, type] = {}


def register(arch: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        cls.arch = arch
        _REGISTRY[arch] = cls
        _MODULES.setdefault(arch, cls.__module__.rsplit(".", 1)[-1])
        return cls
    return deco


def supported_architectures() -> list[str]:
    return sorted(set(_MODULES) | set(_REGISTRY))


def get_model_class(arch: str) -> type:
    cls = _REGISTRY.get(arch)
    if cls is None and arch in _MODULES:
        importlib.import_module(f"{__name__}.{_MODULES[arch]}")
        cls = _REGISTRY.get(arch)
    if cls is None:
        raise ModelLoadError(
            f"unsupported architecture {arch!r} (supported: {', '.join(supported_architectures())})")
    return cls


def load_model(path_or_gguf, **cfg):
    """Open a GGUF (path or GGUFFile) and build its model. cfg: kv_type, block_size,
    max_kv_bytes, max_kv_blocks, ``args=`` (a ModelArgs instead of the GGUF's), and the
    architecture's own options (``swa_full``, ``swa_slack``); others are ignored."""
    from ..gguf_file import GGUFFile

    g = path_or_gguf if isinstance(path_or_gguf, GGUFFile) else GGUFFile(os.fspath(path_or_gguf))
    cls = get_model_class(g.arch)
    try:
        return cls(g, **cfg)
    except ModelLoadError:
        raise
    except KeyError as e:
        raise ModelLoadError(f"{g.path}: missing {e}") from None


__all__ = ["register", "get_model_class", "load_model", "supported_architectures"]
