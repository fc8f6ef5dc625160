"""From a GGUF file to what an engine serves: the model, its tokenizer, its chat template
and a few facts about the file (``info``, shown by /props and /v1/models)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

log = logging.getLogger("llmcore.loader")


class LoadedModel(NamedTuple):
    model: Any  # llmcore.engine.protocols.LanguageModel
    tokenizer: Any  # llmcore.engine.protocols.TextTokenizer
    chat_template: Any | None  # llmcore.chat.ChatTemplate, None when the file has none
    info: dict


def load_gguf(path: str | Path, **model_options) -> LoadedModel:
    """Open and build everything from one GGUF (model_options: llmcore.models.load_model's)."""
    from .chat import ChatTemplate
    from .gguf_file import GGUFFile
    from .models import load_model
    from .tokenizer import Tokenizer

    path = Path(path)
    gf = GGUFFile(path)
    model = load_model(gf, **model_options)
    tok = Tokenizer.from_gguf(gf)
    try:
        tmpl = ChatTemplate.from_gguf(gf, tok)
    except Exception as e:  # noqa: BLE001 - a model without a usable template still completes
        log.warning("no chat template: %s", e)
        tmpl = None
    meta = gf.meta
    info = {
        "path": str(path),
        "arch": gf.arch,
        "name": meta.get("general.name", path.stem),
        "size": path.stat().st_size,
        "n_embd": meta.get(f"{gf.arch}.embedding_length"),
        "n_params": sum(int(np.prod(t.shape)) for t in gf.tensors.values()),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    return LoadedModel(model, tok, tmpl, info)


__all__ = ["LoadedModel", "load_gguf"]
