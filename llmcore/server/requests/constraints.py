"""What a request constrains its output to: ``response_format`` (OpenAI chat; Responses'
``text.format`` and Anthropic's ``output_format`` are translated into it), and
llama-server's ``json_schema`` and ``grammar`` (GBNF) fields on any generating route.

``requested_grammar(body)`` gives the llguidance grammar and the field it came from;
building it is work (a schema compiles), done in a worker thread by the prompt builder."""
from __future__ import annotations

from ...constrain import gbnf_grammar, json_schema_grammar
from ...errors import RequestError
from .schema import AnyOf, Bool, Map, Obj, Str, Tagged

_JSON_SCHEMA = Obj({"name": Str(), "description": Str(), "schema": AnyOf((Map(), Bool()),
                                                                          name="a JSON schema"),
                    "strict": Bool()}, name="a json_schema object")
RESPONSE_FORMAT = Tagged("type", {
    "text": Obj(name="a text format"),
    "json_object": Obj({"schema": AnyOf((Map(), Bool()), name="a JSON schema")}, name="a json_object format"),
    "json_schema": Obj({"json_schema": _JSON_SCHEMA}, name="a json_schema format"),
}, name="a response format")
# Responses' text.format: the json_schema fields sit beside "type"
TEXT_FORMAT = Tagged("type", {
    "text": Obj(name="a text format"),
    "json_object": Obj(name="a json_object format"),
    "json_schema": _JSON_SCHEMA.extend(name="a json_schema format"),
}, name="a text format")
CONSTRAINT_FIELDS = {
    "response_format": RESPONSE_FORMAT,
    "json_schema": AnyOf((Map(), Bool()), name="a JSON schema"),
    "grammar": Str(),
}


def requested_grammar(body: dict) -> tuple[str, str] | None:
    """(llguidance grammar, the field it came from) for the output a request asks for,
    or None. Only one of the fields may be given."""
    given = [k for k in ("response_format", "json_schema", "grammar") if body.get(k) is not None]
    rf = body.get("response_format")
    if rf is not None and rf.get("type", "text") == "text":
        given.remove("response_format")
    if len(given) > 1:
        raise RequestError(f"give at most one of {', '.join(repr(k) for k in given)}")
    if not given:
        return None
    key = given[0]
    if key == "grammar":
        text = body["grammar"]
        return (gbnf_grammar(text, "grammar"), "grammar") if text.strip() else None
    if key == "json_schema":
        return json_schema_grammar(body["json_schema"], "json_schema"), "json_schema"
    if rf["type"] == "json_object":
        schema = rf.get("schema")
        return json_schema_grammar({"type": "object"} if schema is None else schema,
                                   "response_format.schema"), "response_format"
    js = rf.get("json_schema") or {}
    if js.get("schema") is None:
        raise RequestError("'response_format.json_schema.schema' is required")
    return json_schema_grammar(js["schema"], "response_format.json_schema.schema"), "response_format"


def response_format_of_text_format(fmt: dict) -> dict:
    """Responses' text.format as a chat response_format."""
    kind = fmt.get("type", "text")
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict")
                                                       if k in fmt}}
    return {"type": kind}
