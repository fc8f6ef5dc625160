"""The prompt builder: a request's prompt, built once, as one `Prompt`.

For a chat (OpenAI chat, Anthropic Messages, Responses): read the chat request (messages,
tools, template variables), render the template once, check that the text can fit the
context, tokenize, and find the checkpoint position. For a text or token prompt (OpenAI
completions, native /completion): check and tokenize.

A chat is always built in a worker thread (offload.py): the template comes with the model
and is not trusted, so it renders with `RenderLimits` (ServerConfig.template_timeout_s,
and no more text than the context could hold). A text prompt goes to a worker when big."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..chat import RenderLimits, TemplateLimitError, TemplateOutputTooLarge
from ..engine import Engine, common_prefix
from ..errors import ContextFullError, RequestError
from ..toolcalls import FORMATS, detect_format, prompt_ends_in_think
from ..toolcalls.generic import render_messages
from ..toolcalls.grammar import LarkWriter, tool_call_grammar
from .keys import CONFIG
from .offload import SMALL, in_worker, maybe_in_worker
from .requests.chat import ChatRequest, read_chat, template_variables
from .requests.constraints import requested_grammar


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str = ""  # the rendered chat ("" for a text or token prompt)
    tools: list[dict] | None = None  # the tools the template got
    parse_tools: bool = False  # look for tool calls in the output
    parallel_tool_calls: bool = True
    tool_format: str = "hermes"  # the model's tool-call syntax (llmcore.toolcalls)
    starts_in_reasoning: bool = False  # the template opened a <think> block
    checkpoint_at: int | None = None  # where the last user message starts (checkpoint models)
    constraint: Any = None  # llmcore.constrain.Constraint the output must fit, or None
    parse_reasoning: bool = True  # a think block becomes reasoning (--reasoning-format deepseek)
    reasoning_budget: Any = None  # llmcore.engine.budget.ReasoningBudget, or None


@dataclass(frozen=True)
class ReasoningOptions:
    """The server's defaults for thinking (a request may set its own)."""

    format: str = "deepseek"  # or "none": the think block stays in the text
    budget: int = -1  # -1: no limit; 0: thinking off (enable_thinking=False)


async def chat_prompt(request: web.Request, eng: Engine, body: dict, checkpoint: bool = True) -> Prompt:
    """build_chat_prompt in a worker thread, with the server's render limits."""
    cfg = request.app[CONFIG]
    limits = RenderLimits(timeout_s=cfg.template_timeout_s)
    reasoning = ReasoningOptions(cfg.reasoning_format, cfg.reasoning_budget)
    return await in_worker(request, build_chat_prompt, eng, body, checkpoint, limits, reasoning)


def build_chat_prompt(eng: Engine, body: dict, checkpoint: bool = True,
                      limits: RenderLimits | None = None,
                      reasoning: ReasoningOptions = ReasoningOptions()) -> Prompt:
    """The prompt of a chat/completions-shaped body; `checkpoint=False` skips the
    checkpoint position and the output constraint (when only counting tokens)."""
    chat = read_chat(body)
    fmt = body.get("reasoning_format") or reasoning.format
    budget = body.get("reasoning_budget")
    budget = reasoning.budget if budget is None else budget
    if budget == 0 and "enable_thinking" not in chat.template_kwargs:
        chat = dataclasses.replace(chat, template_kwargs={**chat.template_kwargs, "enable_thinking": False})
    p = _build_chat(eng, chat, checkpoint, limits or RenderLimits())
    p = dataclasses.replace(p, parse_reasoning=fmt != "none",
                            reasoning_budget=_budget(eng, p, budget) if budget > 0 else None)
    if not checkpoint:
        return p
    return dataclasses.replace(p, constraint=_chat_constraint(eng, body, chat, p))


async def text_prompt(request: web.Request, eng: Engine, body: dict, field: str = "prompt") -> Prompt:
    """The prompt of a completion: text, token ids, or a mix (llama-server rules), and
    the constraint its json_schema / grammar / response_format asks for (built in a
    worker: a schema compiles)."""
    prompt = body[field]
    big = prompt_size(prompt) > SMALL
    tokens = await maybe_in_worker(request, big, tokenize_prompt, eng, prompt, field)
    if requested_grammar_fields(body):
        return Prompt(tokens=tokens, constraint=await in_worker(request, output_constraint, eng, body))
    return Prompt(tokens=tokens)


# ---- the output constraint --------------------------------------------------------------


def requested_grammar_fields(body: dict) -> bool:
    return any(body.get(k) is not None for k in ("response_format", "json_schema", "grammar"))


def make_constraint(eng: Engine, grammar: str, what: str):
    from ..constrain import Constraint, GrammarVocab

    return Constraint(GrammarVocab.of(eng.tokenizer), grammar, what)


def output_constraint(eng: Engine, body: dict):
    """The constraint of a request's response_format / json_schema / grammar, or None."""
    got = requested_grammar(body)
    return make_constraint(eng, *got) if got is not None else None


def _budget(eng: Engine, p: Prompt, tokens: int):
    """The thinking budget of a request, for a model whose thinking is a <think> block."""
    from ..engine.budget import ReasoningBudget
    from ..toolcalls import THINK_CLOSE, THINK_OPEN

    if FORMATS[p.tool_format].own_reasoning:
        return None
    enc = eng.tokenizer.encode
    close = tuple(enc(THINK_CLOSE, add_special=False, parse_special=True))
    if not close:
        return None
    return ReasoningBudget(tokens, close=close, open=tuple(enc(THINK_OPEN, add_special=False, parse_special=True)),
                           starts_inside=p.starts_in_reasoning)


def _chat_constraint(eng: Engine, body: dict, chat: ChatRequest, p: Prompt):
    """A forced tool call (tool_choice "required" or a named function) in the model's
    syntax; else the response format asked for; else, with tools, the lazy grammar that
    constrains a call once the model opens one."""
    if chat.forced_tool is None:
        got = output_constraint(eng, body)
        if got is not None:
            return got
    if not p.parse_tools or not p.tools:
        return None
    from ..constrain import GrammarVocab

    vocab = GrammarVocab.of(eng.tokenizer)
    w = LarkWriter(vocab.special_ids, free_ids=set(vocab.special_ids.values()) - set(vocab.eog_ids))
    template = getattr(eng.chat_template, "source", "") or ""
    syntax = FORMATS[p.tool_format].call_syntax(p.tools, w, template)
    # a named function is called once (as OpenAI does); "required" and "auto" may call several
    parallel = p.parallel_tool_calls and chat.forced_tool in (None, "required")
    grammar = tool_call_grammar(syntax, w, forced=chat.forced_tool is not None,
                                parallel=parallel, reasoning_open=p.starts_in_reasoning)
    if grammar is None:
        return None
    from ..constrain import lark_grammar

    return make_constraint(eng, lark_grammar(grammar, "tools"), "tools")


# ---- chat -------------------------------------------------------------------------------


def _build_chat(eng: Engine, chat: ChatRequest, checkpoint: bool, limits: RenderLimits) -> Prompt:
    # no more text than a slot's context could hold (each token has at most max_token_bytes)
    n_ctx = int(eng.n_ctx_slot or 0)
    if n_ctx and limits.max_chars is None:
        limits = RenderLimits(max_chars=n_ctx * max_token_bytes(eng), timeout_s=limits.timeout_s)
    fmt, shown = chat_format(eng), chat
    if chat.tools and not template_reads_tools(eng):
        # no tools section: the tools and the call syntax go into the system prompt
        fmt = "generic"
        shown = dataclasses.replace(chat, tools=None,
                                    messages=render_messages(chat.messages, chat.tools, chat.forced_tool))
    text, rendered = _render(eng, shown, limits)
    check_text_fits(eng, text)
    tokens = dedupe_bos(eng, eng.tokenizer.encode(text, add_special=True, parse_special=True))
    at = _last_user_start(eng, shown, rendered, tokens, limits) if checkpoint else None
    return Prompt(tokens=tokens, text=text, tools=chat.tools, parse_tools=chat.parse_tools,
                  parallel_tool_calls=chat.parallel_tool_calls, tool_format=fmt,
                  starts_in_reasoning=prompt_ends_in_think(text), checkpoint_at=at)


def _render(eng: Engine, chat: ChatRequest, limits: RenderLimits) -> tuple[str, list[dict]]:
    """The prompt text, and the messages as rendered (see _render_template)."""
    tmpl = eng.chat_template
    if tmpl is None:
        text = "".join(f"<|im_start|>{m['role']}\n{_plain(m.get('content'))}<|im_end|>\n"
                       for m in chat.messages)
        return text + "<|im_start|>assistant\n", chat.messages
    try:
        return _render_template(tmpl, chat.messages, chat.add_generation_prompt, chat, limits)
    except TemplateOutputTooLarge as e:
        n_ctx = int(eng.n_ctx_slot or 0)
        raise ContextFullError(
            f"the request exceeds the available context size, try increasing it (the chat "
            f"template built more than {e.max_chars} characters, more than {n_ctx} tokens can "
            f"hold). This model's maximum context length is {n_ctx} tokens.",
            n_prompt_tokens=n_ctx + 1, n_ctx=n_ctx) from None  # at least that many
    except RequestError:
        raise
    except Exception as e:  # noqa: BLE001 - template errors are the request's fault here
        raise RequestError(f"chat template error: {e}") from e


def _render_kwargs(tmpl, chat: ChatRequest, limits: RenderLimits) -> dict:
    return {**template_variables(chat.template_kwargs, tmpl), "limits": limits}


def _render_template(tmpl, msgs: list[dict], add_gen: bool, chat: ChatRequest,
                     limits: RenderLimits) -> tuple[str, list[dict]]:
    """Render; a template that concatenates `content` fails on the null content of an
    assistant turn that only made tool calls (valid OpenAI input): retry with "" there."""
    kwargs = _render_kwargs(tmpl, chat, limits)
    try:
        return tmpl.render(msgs, add_generation_prompt=add_gen, tools=chat.tools, **kwargs), msgs
    except TemplateLimitError:
        raise
    except RequestError:
        if not any(isinstance(m, dict) and m.get("content") is None for m in msgs):
            raise
    msgs = [{**m, "content": ""} if m.get("content") is None else m for m in msgs]
    return tmpl.render(msgs, add_generation_prompt=add_gen, tools=chat.tools, **kwargs), msgs


def _last_user_start(eng: Engine, chat: ChatRequest, msgs: list[dict], prompt: list[int],
                     limits: RenderLimits) -> int | None:
    """Token position where the last user message starts (a context checkpoint goes there):
    the common prefix of the prompt and the conversation rendered without that message.

    This is the one second render of a request, and only for models that need checkpoints
    (sliding window, recurrent): where a message starts in the tokens depends on the
    template, so the template has to say it."""
    if not eng.needs_checkpoints or eng.chat_template is None:
        return None
    idx = max((i for i, m in enumerate(msgs) if isinstance(m, dict) and m.get("role") == "user"),
              default=None)
    if not idx:
        return None
    try:
        text = eng.chat_template.render(msgs[:idx], add_generation_prompt=False, tools=chat.tools,
                                        **_render_kwargs(eng.chat_template, chat, limits))
        head = dedupe_bos(eng, eng.tokenizer.encode(text, add_special=True, parse_special=True))
    except Exception:  # noqa: BLE001 - only a hint for checkpoint placement
        return None
    n = common_prefix(head, prompt)
    return n if 0 < n < len(prompt) else None


def template_reads_tools(eng: Engine) -> bool:
    """Whether the chat template renders the `tools` it is given."""
    return bool(getattr(eng.chat_template, "reads_tools", True)) and eng.chat_template is not None


def chat_format(eng: Engine) -> str:
    """The model's tool-call format, from its chat template (or architecture)."""
    src = getattr(eng.chat_template, "source", None) or (eng.info or {}).get("chat_template") or ""
    return detect_format(src, (eng.info or {}).get("arch"))


def _plain(content) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


# ---- text and token prompts -------------------------------------------------------------


def tokenize_prompt(engine: Engine, prompt, field: str = "prompt") -> list[int]:
    """A prompt given as text, token ids, or a mix of both (llama-server rules)."""
    tok = engine.tokenizer
    if isinstance(prompt, str):
        check_text_fits(engine, prompt)
        return dedupe_bos(engine, tok.encode(prompt, add_special=True, parse_special=True))
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            return tokenize_prompt(engine, prompt[0], field)
        out: list[int] = []
        for i, p in enumerate(prompt):
            if isinstance(p, bool):
                raise RequestError(f"'{field}' items must be strings or token ids")
            if isinstance(p, int):
                out.append(p)
            elif isinstance(p, str):
                check_text_fits(engine, p)
                out.extend(tok.encode(p, add_special=(i == 0), parse_special=True))
            else:
                raise RequestError(f"'{field}' must be a string, a list of token ids, or one of those in a list (batches are not supported)")
        return out
    raise RequestError(f"'{field}' must be a string or a list of token ids")


def prompt_size(prompt) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(p) if isinstance(p, str) else 1 for p in prompt)
    return 0


def dedupe_bos(engine: Engine, ids: list[int]) -> list[int]:
    """A template that writes BOS itself plus the tokenizer's BOS gives two: keep one."""
    bos = engine.tokenizer.bos_id
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        return ids[1:]
    return ids


# ---- fitting the context ----------------------------------------------------------------


def max_token_bytes(engine: Engine) -> int:
    """Byte length of the longest token (special tokens included)."""
    return engine.tokenizer.max_piece_bytes


def fewest_tokens(engine: Engine, text: str) -> int:
    """The fewest tokens `text` could become: its bytes divided by the longest token's."""
    nb = len(text.encode("utf-8", errors="surrogatepass"))
    return -(-nb // max_token_bytes(engine))


def check_text_fits(engine: Engine, text: str) -> None:
    """ContextFullError when even the fewest tokens `text` could become do not fit a
    slot's context; cheap next to tokenizing."""
    n_ctx = int(engine.n_ctx_slot or 0)
    if not n_ctx or len(text) < n_ctx:  # each token is at least one character
        return
    lower = fewest_tokens(engine, text)
    if lower >= n_ctx:
        raise ContextFullError(
            f"the request exceeds the available context size, try increasing it "
            f"(at least {lower} prompt tokens, n_ctx {n_ctx}). This model's maximum context "
            f"length is {n_ctx} tokens. However, your messages resulted in at least {lower} tokens.",
            n_prompt_tokens=lower, n_ctx=n_ctx)


# ---- fill in the middle (/infill, /v1/completions with a suffix) ------------------------


def fim_tokens(tokenizer):
    """The model's fill-in-the-middle tokens (llmcore.tokenizer.FimTokens), or None."""
    return tokenizer.fim


class NoInfillError(RequestError):
    """The model has no fill-in-the-middle tokens (HTTP 400)."""


async def infill_prompt(request: web.Request, eng: Engine, body: dict, field: str = "input_prefix") -> Prompt:
    """A fill-in-the-middle prompt (llama-server's /infill shape), built in a worker
    when big; the constraint of its json_schema / grammar as for a completion."""
    size = sum(len(str(body.get(k) or "")) for k in ("input_prefix", "input_suffix", "prompt"))
    size += sum(len(str(c.get("text") or "")) for c in body.get("input_extra") or [] if isinstance(c, dict))
    tokens = await maybe_in_worker(request, size > SMALL, build_infill_tokens, eng, body, field)
    constraint = None
    if requested_grammar_fields(body):
        constraint = await in_worker(request, output_constraint, eng, body)
    return Prompt(tokens=tokens, constraint=constraint)


def build_infill_tokens(eng: Engine, body: dict, field: str = "input_prefix") -> list[int]:
    """[BOS] extra files, <PRE> prefix prompt <SUF> suffix <MID>, as llama-server lays it
    out: the prefix keeps its end and the suffix its start (3:1) when they must be cut to
    fit the batch; extra files come first, after <REPO> / <FILE_SEP> markers when the
    vocabulary has them."""
    tok = eng.tokenizer
    fim = fim_tokens(tok)
    if fim is None:
        raise NoInfillError("this model has no fill-in-the-middle tokens (fim_pre / fim_suf / fim_mid): "
                            "it cannot infill")

    def enc(text: str) -> list[int]:
        check_text_fits(eng, text)
        return list(tok.encode(text, add_special=False, parse_special=False)) if text else []

    chunks = [c for c in body.get("input_extra") or [] if isinstance(c, dict)]
    if not body.get("input_prefix") and not body.get("input_suffix") and not body.get("prompt") and not chunks:
        raise RequestError(f"'{field}', 'input_suffix' or 'prompt' must hold some text")
    extra: list[int] = []
    if chunks:
        if fim.rep is not None:
            extra += [fim.rep] + enc("myproject\n")
        for c in chunks:
            if fim.sep is not None:
                extra += [fim.sep] + enc(str(c.get("filename") or "tmp") + "\n")
            else:
                extra += enc("\n\n--- snippet ---\n\n")
            extra += enc(str(c.get("text") or ""))
        if fim.sep is not None:
            extra += [fim.sep] + enc("filename\n")
    prefix, suffix = enc(body.get("input_prefix") or ""), enc(body.get("input_suffix") or "")
    typed = enc(body.get("prompt") or "") if isinstance(body.get("prompt"), str) else []
    n_batch = max(4, int(eng.cfg.n_batch or 2048))
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(typed))))
    prefix = prefix[len(prefix) - n_prefix:]
    suffix = suffix[:n_suffix]
    head = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    middle = [fim.pre] + prefix + typed + [fim.suf] + suffix + [fim.mid]
    room = int(eng.n_ctx_slot or 0)
    if room and len(head) + len(extra) + len(middle) >= room:  # the extra files give way first
        keep = max(0, room - 1 - len(head) - len(middle))
        extra = extra[len(extra) - keep:] if keep else []
    out = head + extra + middle
    return out
