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


class TextSide(NamedTuple):
    """What a front end needs of a model without its weights: tokenizing prompts, rendering
    chats, the facts /props shows (llmcore.cluster's front end to remote replicas)."""

    tokenizer: Any
    chat_template: Any | None
    info: dict


def load_gguf(path: str | Path, **model_options) -> LoadedModel:
    """Open and build everything from one GGUF (model_options: llmcore.models.load_model's)."""
    from .gguf_file import GGUFFile
    from .models import load_model

    path = Path(path)
    gf = GGUFFile(path)
    model = load_model(gf, **model_options)
    text = _text_side(gf, path)
    return LoadedModel(model, text.tokenizer, text.chat_template, text.info)


def load_gguf_text(path: str | Path) -> TextSide:
    """The tokenizer, chat template and facts of the GGUF at `path`; no tensor is read."""
    from .gguf_file import GGUFFile

    path = Path(path)
    return _text_side(GGUFFile(path), path)


def _text_side(gf, path: Path) -> TextSide:
    from .chat import ChatTemplate
    from .tokenizer import Tokenizer

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
    return TextSide(tok, tmpl, info)


__all__ = ["LoadedModel", "TextSide", "load_gguf", "load_gguf_text"]
