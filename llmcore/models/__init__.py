"""Model registry keyed by GGUF ``general.architecture``.

    from llmcore.models import load_model
    model = load_model("model.gguf", kv_type="f16", block_size=32, max_kv_bytes=1 << 30)
    st = model.new_state()
    logits = model.forward([(st, prompt_ids)])        # (1, n_vocab), last position
    logits = model.forward([(st, [next_id]), (st2, ids2)])

Adding an architecture: a module ``llmcore/models/<name>.py`` with a ``Model`` subclass
(``base.Model``, or ``llama.Llama`` to override ``make_block``/``make_attention``) decorated
``@register("<general.architecture>")``, and its module name in ``_MODULES``. In
``__init__``: build layers from ``layers.py`` blocks, create one block pool per
attention-layer group with ``self.add_kv_pool(group, n_layers, ...,
state_factory=...)`` (each Attention gets ``group``, its ``layer_idx`` within the group and
``pool``), or ``self.add_cache(group, factory)`` for state without a pool (recurrent);
implement ``_forward(fb, all_logits)`` (``fb``: :class:`base.ForwardBatch`).
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
}
_REGISTRY: dict[str, type] = {}


def register(arch: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
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
    max_kv_bytes, max_kv_blocks, and ModelArgs overrides via ``args=``."""
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
