"""OpenAI Responses API, stateless: POST /v1/responses (for Codex CLI).

The request becomes a chat request (requests/responses.py) rendered by the model's
template; the output becomes reasoning / message / function_call items."""
from __future__ import annotations

from aiohttp import web

from ..encoders.base import echoed_model
from ..encoders.responses import ResponsesEncoder
from ..errors import responses_error, uses_envelope
from ..keys import ready_engine
from ..offload import maybe_in_worker
from ..prompt import chat_prompt
from ..requests.body import accepts, body_is_big
from ..requests.fields import gen_params, get_bool
from ..requests.responses import RESPONSES, to_chat
from ..stream import respond


@uses_envelope(responses_error)
@accepts(RESPONSES)
async def responses(request: web.Request, body: dict) -> web.StreamResponse:
    eng = ready_engine(request)
    chat = await maybe_in_worker(request, body_is_big(request), to_chat, body)
    prompt = await chat_prompt(request, eng, chat)
    params = gen_params(chat, eng, oai=True, checkpoint_at=prompt.checkpoint_at, constraint=prompt.constraint)
    stream = get_bool(chat, "stream", False)  # before submit: a bad value must not leave a task running
    task = eng.submit(prompt.tokens, params)
    encoder = ResponsesEncoder(eng, prompt, body, echoed_model(body, eng))
    return await respond(request, task, encoder, stream)
