"""What every chat-style route shares (chat/completions, Anthropic messages, Responses):
render the conversation (tools included), pick the model's tool-call format, and turn
generated tokens into reasoning / content / tool-call deltas (llmcore.toolcalls)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import RequestError
from ...toolcalls import NEEDS_SPECIAL, Delta, OutputParser, detect_format, prompt_ends_in_think


def tool_setup(tools, tool_choice, parallel) -> tuple[list | None, bool, bool]:
    """(tools for the template, parse tool calls?, parallel calls?) from OpenAI-style fields."""
    if tools is not None and not isinstance(tools, list):
        raise RequestError("'tools' must be a list")
    tools = [t for t in tools or [] if isinstance(t, dict)]
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError("'parallel_tool_calls' must be a boolean")
    parallel = True if parallel is None else parallel
    if not tools:
        return None, False, parallel
    if tool_choice == "none":
        return None, False, parallel
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function") if isinstance(tool_choice.get("function"), dict) else tool_choice
        name = fn.get("name")
        if isinstance(name, str):
            keep = [t for t in tools if _tool_name(t) == name]
            if not keep:
                raise RequestError(f"tool_choice names an unknown tool {name!r}")
            tools = keep
    return tools, True, parallel


def _tool_name(t: dict):
    fn = t.get("function") if isinstance(t.get("function"), dict) else t
    return fn.get("name")


def chat_format(eng) -> str:
    tmpl = eng.chat_template
    src = getattr(tmpl, "source", None) or (eng.info or {}).get("chat_template") or ""
    return detect_format(src, (eng.info or {}).get("arch"))


@dataclass
class ChatSetup:
    prompt: list[int]
    text: str = ""
    tools: list | None = None
    parse_tools: bool = False
    parallel: bool = True
    fmt: str = "hermes"
    start_in_reasoning: bool = False


class _SpecialText:
    """Token text with special tokens kept (the harmony/Mistral markers are control
    tokens the engine's decoder drops); end-of-generation tokens are left out."""

    def __init__(self, tok):
        self.tok = tok
        try:
            self.dec = tok.stream_decoder(special=True)
        except TypeError:
            self.dec = tok.stream_decoder()

    def __call__(self, ev) -> str:
        is_eog = getattr(self.tok, "is_eog", None)
        eog = getattr(self.tok, "eog_ids", ())
        out = ""
        for t in ev.tokens:
            if (is_eog(t) if is_eog else t in eog):
                continue
            out += self.dec.feed(t)
        return out


@dataclass
class ChatRun:
    """One generation's output split into deltas; counts reasoning tokens."""

    eng: object
    setup: ChatSetup
    reasoning_tokens: int = 0
    parser: OutputParser = field(init=False)

    def __post_init__(self):
        s = self.setup
        self.parser = OutputParser(s.fmt, tools=s.tools, parse_tools=s.parse_tools,
                                   start_in_reasoning=s.start_in_reasoning, parallel=s.parallel)
        self._text = _SpecialText(self.eng.tokenizer) if s.fmt in NEEDS_SPECIAL else None

    def text_of(self, ev) -> str:
        return self._text(ev) if self._text is not None else ev.text

    def feed(self, ev) -> list[Delta]:
        was = self.parser.in_reasoning
        ds = self.parser.feed(self.text_of(ev))
        if was or self.parser.in_reasoning or any(d.kind == "reasoning" for d in ds):
            self.reasoning_tokens += len(ev.tokens)
        return ds

    def count(self, ev) -> None:
        """Non-streaming: count reasoning tokens (cheap check on the text so far)."""
        self._seen = getattr(self, "_seen", "") + self.text_of(ev)
        if self.setup.start_in_reasoning or self._seen.lstrip().startswith("<think>") \
                or "<|channel|>analysis" in self._seen:
            closed = "</think>" in self._seen or "<|channel|>final" in self._seen \
                or "to=functions" in self._seen
            if not closed:
                self.reasoning_tokens += len(ev.tokens)

    def finish(self) -> list[Delta]:
        return self.parser.finish()

    def finish_reason(self, final) -> str:
        return "tool_calls" if self.parser.calls else final.finish_reason


def make_setup(eng, body: dict, text: str, prompt: list[int]) -> ChatSetup:
    tools, parse, parallel = tool_setup(body.get("tools"), body.get("tool_choice"),
                                        body.get("parallel_tool_calls"))
    return ChatSetup(prompt=prompt, text=text, tools=tools, parse_tools=parse, parallel=parallel,
                     fmt=chat_format(eng), start_in_reasoning=prompt_ends_in_think(text))


def usage_with_reasoning(base: dict, run: ChatRun) -> dict:
    return {**base, "completion_tokens_details": {"reasoning_tokens": run.reasoning_tokens}}
