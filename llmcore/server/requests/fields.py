"""Typed reading of request fields (wrong types -> RequestError naming the field -> HTTP
400), and the generation settings (GenParams) every generating route reads the same way.

Unknown fields are ignored, never rejected (clients send many extras)."""
from __future__ import annotations

import math
from typing import Any

from ...engine import Engine, GenParams
from ...errors import RequestError
from ...sampling import SamplingParams
from .schema import AnyOf, Bool, Int, List, Map, Num, Obj, Spec, Str

_MISSING = object()


def _get(body: dict, key: str, default=_MISSING):
    v = body.get(key, None)
    return default if v is None else v


def get_int(body: dict, key: str, default: int | None) -> int | None:
    v = _get(body, key, default)
    if v is default:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise RequestError(f"'{key}' must be an integer")
    return int(v)


def get_float(body: dict, key: str, default: float) -> float:
    v = _get(body, key, default)
    if v is default:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RequestError(f"'{key}' must be a number")
    return float(v)


def get_bool(body: dict, key: str, default: bool) -> bool:
    v = _get(body, key, default)
    if not isinstance(v, bool):
        raise RequestError(f"'{key}' must be a boolean")
    return v


def get_stop(body: dict) -> list[str]:
    v = _get(body, "stop", [])
    if isinstance(v, str):
        return [v] if v else []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise RequestError("'stop' must be a string or a list of strings")
    return [s for s in v if s]


def get_logit_bias(body: dict, tokenizer) -> dict[int, float]:
    v = _get(body, "logit_bias", {})
    out: dict[int, float] = {}
    items: list[Any]
    if isinstance(v, dict):
        items = list(v.items())
    elif isinstance(v, list):
        items = [tuple(x) if isinstance(x, (list, tuple)) and len(x) == 2 else None for x in v]
    else:
        raise RequestError("'logit_bias' must be an object or a list of [token, bias] pairs")
    for it in items:
        if it is None:
            raise RequestError("'logit_bias' list items must be [token, bias] pairs")
        k, b = it
        if b is False:
            b = -math.inf
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            raise RequestError("'logit_bias' values must be numbers (or false)")
        if isinstance(k, str) and not k.lstrip("-").isdigit():
            ids = tokenizer.encode(k, add_special=False, parse_special=False) if tokenizer else []
        else:
            try:
                ids = [int(k)]
            except (TypeError, ValueError):
                raise RequestError("'logit_bias' keys must be token ids") from None
        for t in ids:
            out[t] = float(b)
    return out


def sampling_params(body: dict, engine: Engine, oai: bool = False) -> SamplingParams:
    d = engine.cfg.sampling
    n_probs = get_int(body, "n_probs", d.n_probs)
    if oai:
        lp = body.get("logprobs")
        top = get_int(body, "top_logprobs", None)
        if isinstance(lp, bool):
            if top is not None and not lp:
                raise RequestError("'top_logprobs' requires 'logprobs': true")
            if lp:
                n_probs = max(1, top or 0)
        elif lp is not None:  # legacy completions: logprobs = int
            lpi = get_int(body, "logprobs", 0)
            if lpi and lpi > 0:
                n_probs = lpi
        elif top is not None:
            raise RequestError("'top_logprobs' requires 'logprobs': true")
    rp_key = "repeat_penalty" if body.get("repeat_penalty") is not None else "repetition_penalty"
    sp = SamplingParams(
        temperature=get_float(body, "temperature", d.temperature),
        top_k=get_int(body, "top_k", d.top_k),
        top_p=get_float(body, "top_p", d.top_p),
        min_p=get_float(body, "min_p", d.min_p),
        repeat_penalty=get_float(body, rp_key, d.repeat_penalty),
        repeat_last_n=get_int(body, "repeat_last_n", d.repeat_last_n),
        presence_penalty=get_float(body, "presence_penalty", d.presence_penalty),
        frequency_penalty=get_float(body, "frequency_penalty", d.frequency_penalty),
        seed=get_int(body, "seed", d.seed),
        n_probs=min(n_probs or 0, 100),
        logit_bias=get_logit_bias(body, engine.tokenizer),
    )
    return sp.validate()


def gen_params(body: dict, engine: Engine, oai: bool = False, prompt=None) -> GenParams:
    """`oai`: OpenAI field names first (max_completion_tokens, max_tokens), `n` and
    `logprobs` read; otherwise llama-server's (n_predict). From the prompt builder's
    `prompt` (server/prompt.py Prompt): the checkpoint position, the output constraint
    and the thinking budget."""
    if oai:
        n = get_int(body, "n", 1)
        if n != 1:
            raise RequestError("only n = 1 is supported")
        n_predict = get_int(body, "max_completion_tokens", None)
        if n_predict is None:
            n_predict = get_int(body, "max_tokens", None)
        if n_predict is None:
            n_predict = get_int(body, "n_predict", engine.cfg.n_predict)
    else:
        n_predict = get_int(body, "n_predict", None)
        if n_predict is None:
            n_predict = get_int(body, "max_tokens", engine.cfg.n_predict)
    if n_predict < -1:
        raise RequestError("'n_predict'/'max_tokens' must be >= -1")
    if n_predict < 0:  # no limit asked: a slot's share of the context (Engine.default_n_predict)
        n_predict = engine.default_n_predict
    return GenParams(
        n_predict=n_predict,
        stop=get_stop(body),
        ignore_eos=get_bool(body, "ignore_eos", False),
        cache_prompt=get_bool(body, "cache_prompt", True),
        id_slot=get_int(body, "id_slot", -1),
        sampling=sampling_params(body, engine, oai),
        checkpoint_at=getattr(prompt, "checkpoint_at", None),
        min_tokens=get_int(body, "min_tokens", 0),
        constraint=getattr(prompt, "constraint", None),
        reasoning_budget=getattr(prompt, "reasoning_budget", None),
        speculative=speculative_params(body, engine),
    )


def speculative_params(body: dict, engine: Engine):
    """Prompt-lookup drafting for this request: None (the server's default), False (off),
    or SpecParams. `"speculative": true/false/{n_max, n_min, ngram_max, ngram_min}`, or
    llama-server's flat `"speculative.n_max"` / `"speculative.n_min"`."""
    from ...engine.speculative import SpecParams

    v = body.get("speculative")
    flat = {k.split(".", 1)[1]: body[k] for k in ("speculative.n_max", "speculative.n_min")
            if body.get(k) is not None}
    if v is None and not flat:
        return None
    if v is False:
        return False
    base = engine.cfg.speculative or SpecParams()
    fields = dict(n_max=base.n_max, n_min=base.n_min, ngram_max=base.ngram_max, ngram_min=base.ngram_min)
    if isinstance(v, dict):
        fields.update({k: int(x) for k, x in v.items() if k in fields and x is not None})
    fields.update({k: int(x) for k, x in flat.items()})
    return SpecParams(**fields).validate()


# ---- the schema of these fields (requests/schema.py) ----------------------------------

# the sampler works in float32: numbers past these would make logits infinite (NaN odds)
_SAMPLING = Num(-1e6, 1e6)
_PENALTY = Num(1e-6, 1e6)  # divides positive logits
MAX_LOGIT_BIAS = 4096  # entries (a string key is tokenized while the request is read)
_LOGIT_BIAS = AnyOf((Map(AnyOf((_SAMPLING, Bool())), max_items=MAX_LOGIT_BIAS),
                     List(List(AnyOf((Int(), Str(), _SAMPLING, Bool())), min_items=2, max_items=2,
                               name="a [token, bias] pair"), max_items=MAX_LOGIT_BIAS)),
                    name="an object or a list of [token, bias] pairs")
STOP = AnyOf((Str(), List(Str(), name="a list of strings")))

SAMPLING_FIELDS: dict[str, Spec] = {
    "temperature": _SAMPLING, "top_k": Int(), "top_p": _SAMPLING, "min_p": _SAMPLING,
    "repeat_penalty": _PENALTY, "repetition_penalty": _PENALTY, "repeat_last_n": Int(lo=-1),
    "presence_penalty": _SAMPLING, "frequency_penalty": _SAMPLING, "seed": Int(), "n_probs": Int(lo=0),
    "logit_bias": _LOGIT_BIAS,
}
# what gen_params reads, llama-server names and OpenAI names
GENERATION_FIELDS: dict[str, Spec] = {
    **SAMPLING_FIELDS,
    "n_predict": Int(lo=-1), "max_tokens": Int(lo=-1), "max_completion_tokens": Int(lo=-1),
    "n": Int(), "logprobs": AnyOf((Bool(), Int(lo=0))), "top_logprobs": Int(lo=0),
    "stop": STOP, "ignore_eos": Bool(), "cache_prompt": Bool(), "id_slot": Int(lo=-1),
    "stream": Bool(), "stream_options": Obj({"include_usage": Bool()}), "model": Str(),
    "min_tokens": Int(lo=0),
    "speculative": AnyOf((Bool(), Obj({"n_max": Int(lo=0, hi=64), "n_min": Int(lo=0, hi=64),
                                       "ngram_max": Int(lo=1, hi=32), "ngram_min": Int(lo=1, hi=32)})),
                         name="a boolean or an object (n_max, n_min, ngram_max, ngram_min)"),
    "speculative.n_max": Int(lo=0, hi=64), "speculative.n_min": Int(lo=0, hi=64),
}
