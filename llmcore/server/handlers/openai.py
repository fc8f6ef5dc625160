"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""
from __future__ import annotations

import base64

import numpy as np
from aiohttp import web

from ...errors import RequestError
from ..encoders.openai_chat import OpenAIChatEncoder
from ..encoders.openai_text import OpenAITextEncoder
from ..keys import ENGINE, ready_engine
from ..errors import ModelNotFoundError
from ..prompt import chat_prompt, infill_prompt, text_prompt
from ..requests.body import accepts
from ..embeddings import embed_all
from ..requests.chat import CHAT
from ..requests.embeddings import EMBEDDINGS, inputs_of
from ..requests.fields import gen_params, get_bool
from ..requests.text import OPENAI_COMPLETION
from ..stream import respond


def model_card(eng) -> dict:
    """The model as /v1/models lists it: its id (alias or file name), and the context a
    request gets here (max_model_len: a slot's n_ctx), not only the training length."""
    info = eng.info
    meta = {k: info.get(k) for k in ("n_vocab", "n_ctx_train", "n_embd", "n_params", "size")}
    meta.update(n_ctx=eng.n_ctx_slot, n_ctx_total=eng.n_ctx, n_slots=eng.stats().n_slots)
    return {"id": eng.model_name, "object": "model", "created": int(eng.t_start), "owned_by": "llmcore",
            "max_model_len": eng.n_ctx_slot, "context_length": eng.n_ctx_slot, "meta": meta}


async def models(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    return web.json_response({"object": "list", "data": [model_card(eng)]})


async def model(request: web.Request) -> web.Response:
    """GET /v1/models/{id}: the model, by its id (an id with slashes is taken whole)."""
    eng = request.app[ENGINE]
    wanted = request.match_info["model_id"]
    if wanted != eng.model_name:
        raise ModelNotFoundError(f"the model {wanted!r} does not exist here (this server serves "
                                 f"{eng.model_name!r})")
    return web.json_response(model_card(eng))


@accepts(OPENAI_COMPLETION)
async def completions(request: web.Request, body: dict) -> web.StreamResponse:
    eng = ready_engine(request)
    if body.get("echo") or body.get("best_of") not in (None, 1):
        raise RequestError("'echo' and 'best_of' are not supported")
    if body.get("suffix"):  # fill in the middle, between the prompt and the suffix
        prompt = await infill_prompt(request, eng, {"input_prefix": body["prompt"], "input_suffix": body["suffix"]},
                                     field="prompt")
    else:
        prompt = await text_prompt(request, eng, body)
    params = gen_params(body, eng, oai=True, prompt=prompt)
    stream = get_bool(body, "stream", False)
    task = eng.submit(prompt.tokens, params)
    return await respond(request, task, OpenAITextEncoder(eng, params), stream)


@accepts(EMBEDDINGS)
async def embeddings(request: web.Request, body: dict) -> web.Response:
    """POST /v1/embeddings: each input's pooled hidden states (the model's pooling type,
    else the mean), L2-normed; float lists or base64 float32."""
    eng = ready_engine(request)
    if body.get("dimensions") not in (None, int(eng.info.get("n_embd") or 0)):
        raise RequestError(f"'dimensions': this model's embeddings have {eng.info.get('n_embd')} dimensions")
    vectors, n_tokens = await embed_all(request, eng, inputs_of(body["input"]))
    b64 = body.get("encoding_format") == "base64"
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() if b64 else v}
            for i, v in enumerate(vectors)]
    return web.json_response({"object": "list", "data": data, "model": eng.model_name,
                              "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


@accepts(CHAT)
async def chat_completions(request: web.Request, body: dict) -> web.StreamResponse:
    eng = ready_engine(request)
    prompt = await chat_prompt(request, eng, body)
    params = gen_params(body, eng, oai=True, prompt=prompt)
    stream = get_bool(body, "stream", False)
    task = eng.submit(prompt.tokens, params)
    return await respond(request, task, OpenAIChatEncoder(eng, prompt, params), stream)
