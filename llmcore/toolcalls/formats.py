"""The tool-call formats, by name, and how a model's format is found.

Each format is a ``Format`` subclass in its own module, registered under its name with
``@register``. A format is fed the model's text in pieces (``feed(text, final)``) and
writes reasoning, content and calls to an ``Output``. Unless it splits reasoning itself
(``own_reasoning``), it gets the text after the leading think block.

``detect_format`` picks the format from the chat template's markup (and the
architecture), most specific markup first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Sequence

from .output import Output

if TYPE_CHECKING:  # pragma: no cover
    from .grammar import CallSyntax, LarkWriter

DEFAULT_FORMAT = "hermes"


@dataclass(frozen=True)
class ParseOptions:
    tools: list = field(default_factory=list)
    parse_tools: bool = False  # False: markup stays in the content
    start_in_reasoning: bool = False  # the prompt opened the think block
    parse_reasoning: bool = True


class Stage:
    """Something fed the model's text piece by piece (final: no more text will come)."""

    in_reasoning: bool = False  # inside a reasoning block that is still open

    def feed(self, text: str, final: bool) -> None:
        raise NotImplementedError


class PlainContent(Stage):
    """No tool calls: all the text is content."""

    def __init__(self, out: Output):
        self.out = out

    def feed(self, text: str, final: bool) -> None:
        self.out.add_content(text)


class Format(Stage):
    """One model family's tool-call markup (see the module docstring)."""

    name: ClassVar[str]
    needs_special: ClassVar[bool] = False  # its markers are control tokens: decode them as text
    own_reasoning: ClassVar[bool] = False  # it is fed the raw text and splits reasoning itself

    def __init__(self, out: Output, opts: ParseOptions):
        self.out = out
        self.opts = opts

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        """Whether a chat template (and architecture, lower case) uses this format."""
        return False

    @classmethod
    def call_syntax(cls, tools: Sequence[dict], w: "LarkWriter", template: str = "") -> "CallSyntax | None":
        """How this format writes calls to `tools`, in Lark (grammar.py); None: calls in
        this format cannot be constrained."""
        return None


FORMATS: dict[str, type[Format]] = {}

# most specific first: a Qwen3-Coder template also has <tool_call>, a harmony one is
# recognised by the architecture too
_DETECTION_ORDER = ("harmony", "kimi_k2", "deepseek", "lfm2", "glm45", "qwen3coder", "hermes",
                    "mistral", "llama3")


def register(cls: type[Format]) -> type[Format]:
    FORMATS[cls.name] = cls
    return cls


def detect_format(template: str | None, arch: str | None = None) -> str:
    """The tool-call format a model uses, from its chat template text (and architecture)."""
    t, a = template or "", (arch or "").lower()
    for name in _DETECTION_ORDER:
        if FORMATS[name].detects(t, a):
            return name
    return DEFAULT_FORMAT
