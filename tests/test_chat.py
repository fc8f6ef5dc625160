"""Chat template tests: the template a GGUF carries renders ChatML prompts and its special
tokens parse (the tiny chat model of fixtures.py, and SmolLM2's real template when pulled),
ChatML fallback, HF-compatible environment (tojson, raise_exception, strftime_now, loop
controls, trim/lstrip blocks), content parts, errors as RequestError."""
from __future__ import annotations

import json
import logging
from datetime import datetime

import pytest

from fixtures import DEFAULT_SYSTEM
from llmcore.chat import CHATML_TEMPLATE, ChatTemplate
from llmcore.errors import ImagesNotSupportedError, RequestError

CHAT_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 17 * 23? Answer briefly."},
]
# CHAT_MESSAGES in ChatML with the generation prompt: the conformance set's "chat" prompt
CHATML_PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                 "<|im_start|>user\nWhat is 17 * 23? Answer briefly.<|im_end|>\n"
                 "<|im_start|>assistant\n")


def _load(path):
    from llmcore.gguf_file import GGUFFile
    from llmcore.tokenizer import Tokenizer

    gf = GGUFFile(path)
    tok = Tokenizer.from_gguf(gf)
    return gf, tok, ChatTemplate.from_gguf(gf, tok)


@pytest.fixture(scope="module")
def chat(built_model):
    """Tokenizer + template of the tiny chat model (ChatML with a default system message)."""
    return _load(built_model("chat"))


def test_gguf_template_renders_chatml(chat):
    _, tok, tmpl = chat
    assert not tmpl.is_fallback
    text = tmpl.render(CHAT_MESSAGES, add_generation_prompt=True)
    assert text == CHATML_PROMPT
    ids = tok.encode(text, add_special=True, parse_special=True)
    start, end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    assert ids[0] == start and ids.count(start) == 3 and ids.count(end) == 2
    assert tok.decode(ids, skip_special=False) == text
    # without a system message the template inserts its own
    text = tmpl.render(CHAT_MESSAGES[1:], add_generation_prompt=False)
    assert text.startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\n")
    assert not text.endswith("<|im_start|>assistant\n")


def test_chat_prompt_is_the_conformance_prompt(conformance):
    """The prompt these tests expect is the one llama.cpp's outputs were recorded for."""
    d = json.loads((conformance / "oracle" / "SmolLM2-135M-Instruct.Q4_1.json").read_text())
    assert next(p for p in d["prompts"] if p["name"] == "chat")["text"] == CHATML_PROMPT


def test_content_parts_are_flattened(chat):
    _, _, tmpl = chat
    parts = [
        CHAT_MESSAGES[0],
        {"role": "user", "content": [{"type": "text", "text": "What is 17 * 23?"}, {"type": "text", "text": "Answer briefly."}]},
    ]
    flat = [CHAT_MESSAGES[0], {"role": "user", "content": "What is 17 * 23?\nAnswer briefly."}]
    assert tmpl.render(parts) == tmpl.render(flat)
    with pytest.raises(ImagesNotSupportedError, match="image input is not supported"):
        tmpl.render([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(RequestError, match="'audio' is not supported"):
        tmpl.render([{"role": "user", "content": [{"type": "audio", "audio": {}}]}])
    with pytest.raises(RequestError, match="role"):
        tmpl.render([{"content": "hi"}])


def test_real_smollm2_template(smollm2_path):
    _, _, tmpl = _load(smollm2_path)
    assert not tmpl.is_fallback
    assert tmpl.render(CHAT_MESSAGES) == CHATML_PROMPT
    assert tmpl.special["bos_token"] == "<|im_start|>" and tmpl.special["eos_token"] == "<|im_end|>"
    # without a system message SmolLM2's template inserts its own
    text = tmpl.render(CHAT_MESSAGES[1:], add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert not text.endswith("<|im_start|>assistant\n")


def test_no_template_falls_back_to_chatml(caplog):
    meta = {"tokenizer.ggml.model": "llama"}  # like gemma-3-270m's GGUF: no chat_template
    with caplog.at_level(logging.INFO, logger="llmcore"):
        tmpl = ChatTemplate.from_gguf(meta)
    assert tmpl.is_fallback and tmpl.source == CHATML_TEMPLATE
    assert "ChatML" in caplog.text
    text = tmpl.render(CHAT_MESSAGES + [{"role": "assistant", "content": None}], add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 17 * 23? Answer briefly.<|im_end|>\n"
        "<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_builtin_gemma_template_renders_gemma_turns():
    # llama-server's built-in "gemma" (--chat-template gemma) for Gemma GGUFs without a template
    from llmcore.chat import BUILTIN_TEMPLATES

    tmpl = ChatTemplate(BUILTIN_TEMPLATES["gemma"], bos_token="<bos>")
    msgs = CHAT_MESSAGES + [{"role": "assistant", "content": " 391 "}, {"role": "user", "content": "Why?"}]
    assert tmpl.render(msgs, add_generation_prompt=True) == (
        "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nWhat is 17 * 23? Answer briefly.<end_of_turn>\n"
        "<start_of_turn>model\n391<end_of_turn>\n"
        "<start_of_turn>user\nWhy?<end_of_turn>\n"
        "<start_of_turn>model\n")
    assert tmpl.render(CHAT_MESSAGES[1:], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nWhat is 17 * 23? Answer briefly.<end_of_turn>\n")


@pytest.mark.slow
@pytest.mark.realmodel
def test_gemma3_has_no_template_and_falls_back(gemma3_path):
    _, _, tmpl = _load(gemma3_path)
    assert tmpl.is_fallback and tmpl.special["bos_token"] == "<bos>"
    assert tmpl.render(CHAT_MESSAGES) == CHATML_PROMPT


def test_raise_exception_is_request_error():
    tmpl = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('tools are not supported') }}"
        "{% endif %}{{ m.content }}{% endfor %}"
    )
    assert tmpl.render([{"role": "user", "content": "hi"}]) == "hi"
    with pytest.raises(RequestError, match="tools are not supported"):
        tmpl.render([{"role": "tool", "content": "x"}])
    with pytest.raises(RequestError, match="chat template error"):
        ChatTemplate("{{ messages[5].content }}{{ (1 / 0) }}").render([])
    # the sandbox forbids mutating data
    with pytest.raises(RequestError):
        ChatTemplate("{{ messages.append(1) }}").render([])


def test_tojson_does_not_escape_and_tools_are_passed():
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter <heute> & \"morgen\"",
                                               "parameters": {"type": "object", "properties": {}}}}]
    tmpl = ChatTemplate("{% for t in tools %}{{ t | tojson }}|{{ t.function.name | tojson(indent=2) }}{% endfor %}")
    out = tmpl.render([], tools=tools)
    assert out == json.dumps(tools[0], ensure_ascii=False) + '|"get_weather"'
    assert "<heute>" in out and "&amp;" not in out and "\\u" not in out
    assert json.loads(ChatTemplate("{{ x | tojson(indent=2) }}").render([], x={"k": [1, "ü"]})) == {"k": [1, "ü"]}
    assert "\n  " in ChatTemplate("{{ x | tojson(indent=2) }}").render([], x={"k": 1})


def test_tool_call_arguments_become_objects():
    tmpl = ChatTemplate(
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{{ c.function.name }}:{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}"
    )
    msgs = [{"role": "assistant", "content": None,
             "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}]
    assert tmpl.render(msgs) == 'f:{"a": 1}'
    assert msgs[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # the caller's data is untouched


def test_environment_matches_hf():
    # trim_blocks / lstrip_blocks, loop controls, strftime_now, extra variables, bos/eos
    src = (
        "{{ bos_token }}\n"
        "    {% for m in messages %}\n"
        "{% if m.role == 'skip' %}{% continue %}{% endif %}\n"
        "{% if m.role == 'stop' %}{% break %}{% endif %}\n"
        "[{{ m.content }}]\n"
        "    {% endfor %}\n"
        "{{ strftime_now('%Y') }}{% if enable_thinking is defined and not enable_thinking %} nothink{% endif %}"
        "{{ eos_token }}"
    )
    tmpl = ChatTemplate(src, bos_token="<s>", eos_token="</s>")
    msgs = [{"role": "user", "content": "a"}, {"role": "skip", "content": "b"}, {"role": "user", "content": "c"},
            {"role": "stop", "content": "d"}, {"role": "user", "content": "e"}]
    out = tmpl.render(msgs, enable_thinking=False)
    assert out == f"<s>\n[a]\n[c]\n{datetime.now().year} nothink</s>"


def test_bad_template_falls_back(caplog):
    with caplog.at_level(logging.WARNING, logger="llmcore"):
        tmpl = ChatTemplate("{% for m in messages %}{{ m.content }")
    assert tmpl.is_fallback and "ChatML" in caplog.text
