"""Tool calls as grammars (llmcore.toolcalls.grammar): for every format, the call it
writes is what its grammar accepts, and what its parser reads back; a forced grammar
refuses anything but a call to a known tool with fitting arguments; the lazy grammar
of tool_choice "auto" lets text through and constrains from where a call opens."""
import json

import pytest

from fakes import FakeTokenizer
from llmcore.constrain import Constraint, GrammarVocab, lark_grammar
from llmcore.toolcalls import FORMATS, parse_output
from llmcore.toolcalls.grammar import LarkWriter, tool_call_grammar

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
]
TOK = FakeTokenizer()
ARGS = {"city": "Paris", "days": 3}

# what each format's model writes for get_weather(city="Paris", days=3)
CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
    "qwen3coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                  "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]',
    "lfm2": '<|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>',
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
             "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
    "deepseek": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|><|tool_calls_section_end|>',
    "generic": '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]}',
    "harmony": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 3}',
}
TEMPLATES = {"deepseek": "```json"}  # the R1 form: arguments in a fence


def grammar(fmt: str, forced: bool, parallel: bool = True):
    v = GrammarVocab.of(TOK)
    w = LarkWriter(v.special_ids, free_ids=set(v.special_ids.values()) - set(v.eog_ids))
    g = tool_call_grammar(FORMATS[fmt].call_syntax(TOOLS, w, TEMPLATES.get(fmt, "")), w,
                          forced=forced, parallel=parallel)
    return None if g is None else Constraint(GrammarVocab.of(TOK), lark_grammar(g))


def accepts(c: Constraint, text: str) -> bool:
    return all(c.consume(t) for t in TOK.encode(text, add_special=False))


def test_every_format_has_a_call_syntax():
    assert set(CALLS) == set(FORMATS)


@pytest.mark.parametrize("fmt", sorted(CALLS))
def test_the_call_a_format_writes_fits_its_grammar_and_parses_back(fmt):
    c = grammar(fmt, forced=True)
    assert accepts(c, CALLS[fmt]), (fmt, c.error)
    assert c.accepting
    p = parse_output(CALLS[fmt], fmt, tools=TOOLS)
    assert [(x.name, json.loads(x.arguments)) for x in p.calls] == [("get_weather", ARGS)]


@pytest.mark.parametrize("fmt", sorted(CALLS))
def test_a_forced_call_refuses_unknown_tools_and_text(fmt):
    wrong_name = CALLS[fmt].replace("get_weather", "get_wxather")
    assert not accepts(grammar(fmt, forced=True), wrong_name)
    assert not accepts(grammar(fmt, forced=True), "Sure! " + CALLS[fmt])


@pytest.mark.parametrize("fmt", ["hermes", "qwen3coder", "mistral", "lfm2", "glm45", "deepseek", "kimi_k2"])
def test_auto_lets_text_through_and_constrains_an_opened_call(fmt):
    c = grammar(fmt, forced=False)
    assert accepts(c, "Let me look that up. " + CALLS[fmt] + " Done.")
    bad = grammar(fmt, forced=False)
    assert not accepts(bad, "Let me look that up. " + CALLS[fmt].replace("get_weather", "get_wxather"))
    assert accepts(grammar(fmt, forced=False), "No tool is needed here.")


def test_auto_for_whole_output_formats_is_text_or_calls():
    for fmt in ("generic", "llama3"):
        assert accepts(grammar(fmt, forced=False), "Plain words.")
        assert accepts(grammar(fmt, forced=False), CALLS[fmt])
        assert not accepts(grammar(fmt, forced=False), CALLS[fmt].replace('"days": 3', '"days": "3"'))
    assert grammar("harmony", forced=False) is None  # its channels open every message


def test_arguments_must_fit_the_schema():
    c = grammar("hermes", forced=True)
    assert not accepts(c, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}')  # days missing
    c = grammar("hermes", forced=True, parallel=False)
    assert accepts(c, CALLS["hermes"]) and c.stopped  # one call, then only the end


def test_free_text_may_hold_special_tokens_but_not_the_end():
    """A model's own markers (a think block's control tokens) pass in free text; an
    end-of-generation token only where the grammar may end."""
    from fakes import BOS, EOS

    c = grammar("hermes", forced=False)
    ids = TOK.encode("a", add_special=False) + [BOS] + TOK.encode("b " + CALLS["hermes"], add_special=False)
    assert all(c.consume(t) for t in ids) and c.accepting
    c = grammar("hermes", forced=False)
    assert all(c.consume(t) for t in TOK.encode("a <tool_call>", add_special=False))
    assert not c.consume(EOS)  # inside an opened call: it must be finished first


def test_a_special_token_is_named_by_id():
    w = LarkWriter({"<tool_call>": 7})
    assert w.lit("<tool_call>") == "<[7]>"
    assert w.lit("a<tool_call>b") == '"a" <[7]> "b"'
