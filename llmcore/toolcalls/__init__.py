"""Model output -> reasoning, content and tool calls, per model family (stream or not).

    fmt = detect_format(template_source, arch)           # "hermes", "qwen3coder", ...
    p = OutputParser(fmt, tools=tools, start_in_reasoning=prompt_ends_in_think(prompt_text))
    for text in pieces:
        for d in p.feed(text): ...                          # Delta objects
    for d in p.finish(): ...
    p.content, p.reasoning, p.calls                         # the whole result

Deltas: Delta("reasoning", text), Delta("content", text), Delta("call", index=i, id=...,
name=...) once per call, then Delta("args", index=i, text=fragment) (fragments concatenate
into the call's JSON arguments string).

Where things live:

- ``parser.py``: ``OutputParser``, the stages the text goes through;
- ``reasoning.py``: the leading ``<think>..</think>`` block;
- ``formats.py``: the registry of formats and ``detect_format``; one module per format:
  ``hermes.py`` (``<tool_call>`` JSON), ``qwen3coder.py`` (``<function=..>`` XML),
  ``llama3.py`` (bare JSON, ``<|python_tag|>``), ``mistral.py`` (``[TOOL_CALLS]``),
  ``harmony.py`` (gpt-oss channels), ``lfm2.py`` (Python calls), ``glm45.py``
  (``<arg_key>`` pairs), ``deepseek.py``, ``kimi_k2.py`` (special-token sections),
  ``generic.py`` (a JSON object, for templates without tools: the tools go into the
  system prompt); ``blocks.py`` reads the block-per-call formats;
- ``grammar.py``: calls as a grammar (forced, or lazy from where a call opens), from
  each format's ``call_syntax``;
- ``jsoncall.py`` / ``xmlcall.py``: a call body as it streams in; ``jsontext.py``: JSON
  as models write it; ``scan.py``: finding markers in streamed text;
- ``output.py``: ``Delta``, ``ToolCall`` and the sink the formats write to.

The markup never reaches ``content``. Streamed deltas add up to the non-streamed result
wherever the text was split, except where a stream cannot take back what it showed
(a call that the rest of the output proves malformed).
"""
from . import (deepseek, generic, glm45, harmony, hermes, kimi_k2, lfm2, llama3, mistral,  # noqa: F401
               qwen3coder)  # (registers the formats)
from .formats import DEFAULT_FORMAT, FORMATS, detect_format
from .output import Delta, ToolCall, new_call_id
from .parser import OutputParser, parse_output
from .reasoning import THINK_CLOSE, THINK_OPEN, prompt_ends_in_think

# formats whose markers are control tokens: decode them as text
NEEDS_SPECIAL = frozenset(name for name, f in FORMATS.items() if f.needs_special)

__all__ = [
    "OutputParser", "parse_output", "Delta", "ToolCall", "new_call_id", "detect_format", "FORMATS",
    "DEFAULT_FORMAT", "NEEDS_SPECIAL", "prompt_ends_in_think", "THINK_OPEN", "THINK_CLOSE",
]
