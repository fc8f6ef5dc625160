"""Text and token requests: native /completion, OpenAI /v1/completions, /tokenize and
/detokenize (their schemas; the prompt itself is read by server/prompt.py)."""
from __future__ import annotations

from .constraints import CONSTRAINT_FIELDS
from .fields import GENERATION_FIELDS
from .schema import AnyOf, Bool, Int, List, Obj, Str

TOKEN_ID = Int(lo=0, integral_floats=False)
# a string, token ids, or a mix (llama-server); one of those alone in a list
PROMPT = AnyOf((Str(), List(AnyOf((TOKEN_ID, Str(), List(AnyOf((TOKEN_ID, Str())), name="a list of token ids")),
                                  name="a string or a token id"),
                            name="a list of token ids and strings")),
               name="a string or a list of token ids")

COMPLETION = Obj({**GENERATION_FIELDS, **CONSTRAINT_FIELDS, "prompt": PROMPT, "return_tokens": Bool()},
                 required=("prompt",))
OPENAI_COMPLETION = Obj({**GENERATION_FIELDS, **CONSTRAINT_FIELDS, "prompt": PROMPT, "echo": Bool(),
                         "best_of": Int(), "suffix": Str(), "user": Str()}, required=("prompt",))
INFILL = Obj({**GENERATION_FIELDS, **CONSTRAINT_FIELDS, "input_prefix": Str(), "input_suffix": Str(),
              "input_extra": List(Obj({"filename": Str(), "text": Str()}, name="a file object"),
                                  name="a list of file objects"),
              "prompt": Str(), "return_tokens": Bool()})
TOKENIZE = Obj({"content": Str(), "add_special": Bool(), "parse_special": Bool(), "with_pieces": Bool()},
               required=("content",))
SLOT_ACTION = Obj({"filename": Str()})
DETOKENIZE = Obj({"tokens": List(TOKEN_ID, name="a list of token ids")}, required=("tokens",))
