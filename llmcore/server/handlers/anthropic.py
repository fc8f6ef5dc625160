"""Anthropic Messages: POST /v1/messages and /v1/messages/count_tokens (for Claude Code).

The request becomes a chat request (requests/anthropic.py) rendered by the model's
template; errors use Anthropic's envelope."""
from __future__ import annotations

from aiohttp import web

from ..encoders.anthropic import AnthropicEncoder
from ..encoders.base import echoed_model
from ..errors import anthropic_error, uses_envelope
from ..keys import ready_engine
from ..offload import maybe_in_worker
from ..prompt import chat_prompt
from ..requests.anthropic import COUNT_TOKENS, MESSAGES, to_chat
from ..requests.body import accepts, body_is_big
from ..requests.fields import gen_params, get_bool
from ..stream import respond


@uses_envelope(anthropic_error)
@accepts(COUNT_TOKENS)
async def count_tokens(request: web.Request, body: dict) -> web.Response:
    eng = ready_engine(request)
    chat = await maybe_in_worker(request, body_is_big(request), to_chat, body)
    prompt = await chat_prompt(request, eng, chat, checkpoint=False)
    return web.json_response({"input_tokens": len(prompt.tokens)})


@uses_envelope(anthropic_error)
@accepts(MESSAGES)
async def messages(request: web.Request, body: dict) -> web.StreamResponse:
    eng = ready_engine(request)
    chat = await maybe_in_worker(request, body_is_big(request), to_chat, body)
    prompt = await chat_prompt(request, eng, chat)
    params = gen_params(chat, eng, oai=True, prompt=prompt)
    stream = get_bool(chat, "stream", False)
    task = eng.submit(prompt.tokens, params)
    return await respond(request, task, AnthropicEncoder(eng, prompt, echoed_model(body, eng)), stream)
