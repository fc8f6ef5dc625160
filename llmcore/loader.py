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


NO_TEMPLATE_WARNING = ("this model has no chat template: chat requests are rendered as ChatML, "
                       "which may not be what it was trained on (give one with --chat-template-file "
                       "or --chat-template NAME)")


def choose_template(gf, tok, name: str | None = None, text: str | None = None):
    """The chat template to serve: `text` (a template file's), else the GGUF's template
    called `name` (or a built-in one: chat.BUILTIN_TEMPLATES), else the GGUF's own. Returns
    (template, where it came from: "file" | "name" | "gguf" | "none"); an unknown name is a ModelLoadError."""
    from .chat import BUILTIN_TEMPLATES, ChatTemplate
    from .errors import ModelLoadError

    if text is not None:
        return ChatTemplate.from_source(text, tok), "file"
    if name:
        src = gf.meta.get(f"tokenizer.chat_template.{name}") or BUILTIN_TEMPLATES.get(name)
        if src is None:
            named = sorted(k.split(".", 2)[2] for k in gf.meta if k.startswith("tokenizer.chat_template."))
            raise ModelLoadError(f"--chat-template {name!r}: not a template of this model (it has: "
                                 f"{', '.join(named + sorted(BUILTIN_TEMPLATES))})")
        return ChatTemplate.from_source(src, tok), "name"
    if not gf.meta.get("tokenizer.chat_template"):
        log.warning(NO_TEMPLATE_WARNING)
        return ChatTemplate.from_gguf(gf, tok), "none"
    return ChatTemplate.from_gguf(gf, tok), "gguf"


def load_gguf(path: str | Path, template_name: str | None = None, template_text: str | None = None,
              **model_options) -> LoadedModel:
    """Open and build everything from one GGUF (model_options: llmcore.models.load_model's;
    template_name / template_text: see choose_template)."""
    from .gguf_file import GGUFFile
    from .models import load_model

    path = Path(path)
    gf = GGUFFile(path)
    model = load_model(gf, **model_options)
    text = _text_side(gf, path, template_name, template_text)
    return LoadedModel(model, text.tokenizer, text.chat_template, text.info)


def load_gguf_text(path: str | Path, template_name: str | None = None,
                   template_text: str | None = None) -> TextSide:
    """The tokenizer, chat template and facts of the GGUF at `path`; no tensor is read."""
    from .gguf_file import GGUFFile

    path = Path(path)
    return _text_side(GGUFFile(path), path, template_name, template_text)


def _text_side(gf, path: Path, template_name: str | None, template_text: str | None) -> TextSide:
    from .tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(gf)
    tmpl, origin = choose_template(gf, tok, template_name, template_text)
    meta = gf.meta
    info = {
        "path": str(path),
        "arch": gf.arch,
        "name": meta.get("general.name", path.stem),
        "size": path.stat().st_size,
        "n_embd": meta.get(f"{gf.arch}.embedding_length"),
        "n_params": sum(int(np.prod(t.shape)) for t in gf.tensors.values()),
        "chat_template": tmpl.source if origin != "none" else "",
        "chat_template_origin": origin,
        "template_warning": NO_TEMPLATE_WARNING if origin == "none" else None,
        "pooling": POOLING.get(int(meta.get(f"{gf.arch}.pooling_type", 0) or 0), "mean"),
    }
    return TextSide(tok, tmpl, info)


# GGUF {arch}.pooling_type -> how /v1/embeddings pools a text's hidden states ("none" and
# "rank" models get the mean, as llama-server's embeddings of a generative model do)
POOLING = {0: "mean", 1: "mean", 2: "cls", 3: "last"}

__all__ = ["LoadedModel", "TextSide", "load_gguf", "load_gguf_text", "choose_template", "NO_TEMPLATE_WARNING", "POOLING"]
