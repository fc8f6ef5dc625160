"""Embedding requests: OpenAI's /v1/embeddings (``input``: a string, token ids, or a list
of either) and llama-server's /embedding (``content``)."""
from __future__ import annotations

from ...errors import RequestError
from .schema import AnyOf, Enum, Int, List, Obj, Str
from .text import TOKEN_ID

MAX_INPUTS = 256  # texts in one request (each takes a slot in turn)
_INPUT = AnyOf((Str(), List(AnyOf((TOKEN_ID, Str(), List(TOKEN_ID, min_items=1, name="a list of token ids"))),
                            min_items=1, max_items=MAX_INPUTS, name="a list of strings or token lists")),
               name="a string, token ids, or a list of them")
EMBEDDINGS = Obj({"input": _INPUT, "model": Str(), "encoding_format": Enum(("float", "base64")),
                  "dimensions": Int(lo=1), "user": Str()}, required=("input",))
EMBEDDING = Obj({"content": _INPUT, "input": _INPUT, "embd_normalize": Int(lo=-1)})


def inputs_of(value) -> list:
    """The texts (or token lists) of an `input` / `content` field."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        return [value]  # one text given as token ids
    if isinstance(value, list) and value and all(isinstance(x, (str, list)) for x in value):
        return list(value)
    raise RequestError("'input' must be a string, token ids, or a list of strings or token lists")
