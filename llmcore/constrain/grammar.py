"""What a request constrains its output to, as one llguidance grammar (a string).

JSON schemas compile with fixed separators (``", "`` and ``": "``) and no free
whitespace: a small model given room for whitespace can write newlines forever. An
object schema that lists its properties and says nothing of others gets no others
(``additionalProperties`` defaults to false, as in llama.cpp: a model left free to add
keys keeps adding them). Keywords llguidance does not implement are ignored
(``lenient``), as clients send schemas full of annotations; a schema or grammar it cannot
compile is a ``GrammarError`` (HTTP 400) that says why.

``json_rule`` is the piece the tool-call formats write arguments with
(``llmcore.toolcalls.grammar``).
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import RequestError

# how generated JSON is laid out (llguidance JsonCompileOptions)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                "lenient": True}
MAX_GRAMMAR_CHARS = 1_000_000  # a grammar or schema text past this is refused before compiling


class GrammarError(RequestError):
    """A schema or grammar that cannot constrain the output (HTTP 400, naming the problem)."""


def _llg():
    import llguidance

    return llguidance


def _schema_text(schema: Any, field: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise GrammarError(f"'{field}' is not valid JSON: {e}") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise GrammarError(f"'{field}' must be a JSON schema (an object)")
    text = json.dumps(schema, ensure_ascii=False)
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"'{field}' is longer than {MAX_GRAMMAR_CHARS} characters")
    return text


def closed_objects(schema, depth: int = 0):
    """`schema` with additionalProperties: false on each object schema that lists
    properties and does not say (recursively; a copy)."""
    if depth > 64:
        return schema
    if isinstance(schema, list):
        return [closed_objects(s, depth + 1) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (closed_objects(v, depth + 1) if k not in ("const", "enum", "default", "examples") else v)
           for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema \
            and "patternProperties" not in schema:
        out["additionalProperties"] = False
    return out


def with_json_options(schema: dict) -> dict:
    """The schema with closed objects and the layout options (a schema's own x-guidance
    settings win)."""
    return {**closed_objects(schema), "x-guidance": {**JSON_OPTIONS, **(schema.get("x-guidance") or {})}}


def json_schema_grammar(schema: Any, field: str = "json_schema") -> str:
    """The grammar of JSON text that fits `schema` (a dict, or its JSON text)."""
    obj = json.loads(_schema_text(schema, field))
    try:
        return _llg().LLMatcher.grammar_from_json_schema(with_json_options(obj))
    except ValueError as e:
        raise GrammarError(f"'{field}': {e}") from None


def lark_grammar(text: str, field: str = "grammar") -> str:
    _check_size(text, field)
    return _llg().LLMatcher.grammar_from_lark(text)


def gbnf_grammar(text: str, field: str = "grammar") -> str:
    """A llama.cpp GBNF grammar (or a Lark one, which the converter passes through)."""
    _check_size(text, field)
    try:
        return _llg().grammar_from("gbnf", text)
    except ValueError as e:
        raise GrammarError(f"'{field}': {e}") from None


def regex_grammar(pattern: str, field: str = "regex") -> str:
    _check_size(pattern, field)
    return _llg().LLMatcher.grammar_from_regex(pattern)


def _check_size(text: str, field: str) -> None:
    if not isinstance(text, str):
        raise GrammarError(f"'{field}' must be a string")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"'{field}' is longer than {MAX_GRAMMAR_CHARS} characters")


# ---- Lark pieces for the tool-call formats ----------------------------------------------


def json_rule(schema: dict) -> str:
    """An inline JSON-schema element (``%json {...}``) with the layout options."""
    return "%json " + json.dumps(with_json_options(schema), ensure_ascii=False)
