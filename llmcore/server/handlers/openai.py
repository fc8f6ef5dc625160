"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""
from __future__ import annotations

from aiohttp import web

from ...errors import RequestError
from ..encoders.openai_chat import OpenAIChatEncoder
from ..encoders.openai_text import OpenAITextEncoder
from ..keys import ENGINE, ready_engine
from ..prompt import chat_prompt, text_prompt
from ..requests.body import accepts
from ..requests.chat import CHAT
from ..requests.fields import gen_params, get_bool
from ..requests.text import OPENAI_COMPLETION
from ..stream import respond


async def models(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    info = eng.info
    meta = {k: info.get(k) for k in ("n_vocab", "n_ctx_train", "n_embd", "n_params", "size")}
    return web.json_response({
        "object": "list",
        "data": [{"id": eng.model_name, "object": "model", "created": int(eng.t_start),
                  "owned_by": "llmcore", "meta": meta}],
    })


@accepts(OPENAI_COMPLETION)
async def completions(request: web.Request, body: dict) -> web.StreamResponse:
    eng = ready_engine(request)
    if body.get("echo") or body.get("best_of") not in (None, 1) or body.get("suffix"):
        raise RequestError("'echo', 'best_of' and 'suffix' are not supported")
    prompt = await text_prompt(request, eng, body)
    params = gen_params(body, eng, oai=True, constraint=prompt.constraint)
    stream = get_bool(body, "stream", False)
    task = eng.submit(prompt.tokens, params)
    return await respond(request, task, OpenAITextEncoder(eng, params), stream)


@accepts(CHAT)
async def chat_completions(request: web.Request, body: dict) -> web.StreamResponse:
    eng = ready_engine(request)
    prompt = await chat_prompt(request, eng, body)
    params = gen_params(body, eng, oai=True, checkpoint_at=prompt.checkpoint_at, constraint=prompt.constraint)
    stream = get_bool(body, "stream", False)
    task = eng.submit(prompt.tokens, params)
    return await respond(request, task, OpenAIChatEncoder(eng, prompt, params), stream)
