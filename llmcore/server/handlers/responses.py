"""OpenAI Responses API: POST /v1/responses (for Codex CLI).

The request becomes a chat request (requests/responses.py) rendered by the model's
template; the output becomes reasoning / message / function_call items. A finished
response is kept (unless `store: false`) so a later request can continue it with
`previous_response_id` (response_store.py)."""
from __future__ import annotations

from aiohttp import web

from ..encoders.base import echoed_model
from ..encoders.responses import ResponsesEncoder
from ..errors import responses_error, uses_envelope
from ..keys import RESPONSES, ready_engine
from ..offload import maybe_in_worker
from ..prompt import chat_prompt
from ..requests.body import accepts, body_is_big
from ..requests.fields import gen_params, get_bool
from ..requests.responses import RESPONSES as RESPONSES_BODY, to_chat
from ..response_store import output_as_input
from ..stream import respond


@uses_envelope(responses_error)
@accepts(RESPONSES_BODY)
async def responses(request: web.Request, body: dict) -> web.StreamResponse:
    eng = ready_engine(request)
    store = request.app[RESPONSES]
    items = body["input"] if isinstance(body["input"], list) else [
        {"type": "message", "role": "user", "content": body["input"]}]
    if body.get("previous_response_id"):
        items = store.get(body["previous_response_id"]) + items
        body = {**body, "input": items}
    chat = await maybe_in_worker(request, body_is_big(request), to_chat, body)
    prompt = await chat_prompt(request, eng, chat)
    params = gen_params(chat, eng, oai=True, prompt=prompt)
    stream = get_bool(chat, "stream", False)  # before submit: a bad value must not leave a task running
    task = eng.submit(prompt.tokens, params)
    keep = None
    if body.get("store") is not False:
        def keep(response: dict) -> None:
            store.put(response["id"], items + output_as_input(response["output"]))
    encoder = ResponsesEncoder(eng, prompt, body, echoed_model(body, eng), on_done=keep)
    return await respond(request, task, encoder, stream)
