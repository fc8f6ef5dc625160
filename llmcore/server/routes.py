"""All routes in one place."""
from __future__ import annotations

from aiohttp import web

from .handlers import anthropic, native, openai, responses


def setup_routes(app: web.Application) -> None:
    r = app.router
    for path in ("/health", "/v1/health"):
        r.add_get(path, native.health)
    r.add_get("/props", native.props)
    r.add_get("/slots", native.slots)
    r.add_post("/slots/{id_slot}", native.slot_action)
    r.add_get("/metrics", native.metrics)
    r.add_post("/tokenize", native.tokenize)
    r.add_post("/detokenize", native.detokenize)
    r.add_post("/completion", native.completion)
    for path in ("/v1/models", "/models"):
        r.add_get(path, openai.models)
        r.add_get(path + "/{model_id:.+}", openai.model)
    r.add_post("/apply-template", native.apply_template)
    r.add_post("/infill", native.infill)
    for path in ("/embedding", "/embeddings"):
        r.add_post(path, native.embedding)
    for path in ("/v1/embeddings",):
        r.add_post(path, openai.embeddings)
    for path in ("/v1/completions", "/completions"):
        r.add_post(path, openai.completions)
    for path in ("/v1/chat/completions", "/chat/completions"):
        r.add_post(path, openai.chat_completions)
    r.add_post("/v1/messages", anthropic.messages)
    r.add_post("/v1/messages/count_tokens", anthropic.count_tokens)
    for path in ("/v1/responses", "/responses"):
        r.add_post(path, responses.responses)
