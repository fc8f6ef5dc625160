"""OpenAI Responses (/v1/responses): a `response` whose output items are reasoning,
message and function_call; streamed with the response.* event lifecycle (created,
in_progress, output_item.added / deltas / done per item, completed or incomplete)."""
from __future__ import annotations

from ...engine import Engine, FinalEvent, TokenEvent
from ...toolcalls import Delta
from ..errors import openai_error
from ..prompt import Prompt
from ..sse import SSEEvent
from .base import Encoder, new_id, now
from .chat_output import ChatOutput


def _id(prefix: str) -> str:
    return new_id(prefix).replace("-", "_")


class ResponsesEncoder(Encoder):
    def __init__(self, eng: Engine, prompt: Prompt, body: dict, model: str, on_done=None):
        self.out = ChatOutput(eng.tokenizer, prompt)
        self.resp = {"id": _id("resp"), "object": "response", "created_at": now(), "model": model,
                     "status": "in_progress", "output": [], "usage": None, "error": None,
                     "incomplete_details": None, "instructions": body.get("instructions"),
                     "tools": body.get("tools") or [], "parallel_tool_calls": prompt.parallel_tool_calls}
        self.ids: dict[str, str] = {}  # item ids, the same in the stream and the final response
        self.seq = 0  # sequence_number of the next event
        self.kind: str | None = None  # the open output item's type (None: none open)
        self.index = -1  # its output_index
        self.item: dict | None = None
        self.text = ""  # its text (or arguments) so far
        self.on_done = on_done  # called with the finished response (response_store keeps it)
        self.previous = body.get("previous_response_id")

    def _item_id(self, key: str, prefix: str) -> str:
        return self.ids.setdefault(key, _id(prefix))

    def _finished(self, ev: FinalEvent) -> dict:
        r = {**self.resp, "output": self._items(), "usage": self._usage(ev),
             "previous_response_id": self.previous}
        if ev.stop_type == "limit" and not self.out.parser.calls:
            r["status"], r["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        else:
            r["status"] = "completed"
        if self.on_done is not None:
            done, self.on_done = self.on_done, None
            done(r)
        return r

    def _items(self) -> list[dict]:
        p = self.out.parser
        out = []
        if p.reasoning:
            out.append({"id": self._item_id("rs", "rs"), "type": "reasoning",
                        "summary": [], "content": [{"type": "reasoning_text", "text": p.reasoning}]})
        if p.content or not p.calls:
            out.append({"id": self._item_id("msg", "msg"), "type": "message",
                        "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": p.content, "annotations": []}]})
        for i, c in enumerate(p.calls):
            out.append({"id": self._item_id(f"fc{i}", "fc"), "type": "function_call",
                        "status": "completed", "call_id": c.id, "name": c.name,
                        "arguments": c.arguments or "{}"})
        return out

    def _usage(self, final: FinalEvent) -> dict:
        return {"input_tokens": final.n_prompt,
                "input_tokens_details": {"cached_tokens": final.timings.cache_n},
                "output_tokens": final.n_predicted,
                "output_tokens_details": {"reasoning_tokens": self.out.reasoning_tokens},
                "total_tokens": final.n_prompt + final.n_predicted}

    # ---- streaming ----

    def _emit(self, typ: str, **fields) -> SSEEvent:
        ev = SSEEvent({"type": typ, "sequence_number": self.seq, **fields}, name=typ)
        self.seq += 1
        return ev

    def opening(self) -> list[SSEEvent]:
        return [self._emit("response.created", response=self.resp),
                self._emit("response.in_progress", response=self.resp)]

    def _close_item(self) -> list[SSEEvent]:
        kind, item, idx = self.kind, self.item, self.index
        if kind is None:
            return []
        out = []
        if kind == "message":
            part = {"type": "output_text", "text": self.text, "annotations": []}
            out.append(self._emit("response.output_text.done", item_id=item["id"], output_index=idx,
                                  content_index=0, text=self.text))
            out.append(self._emit("response.content_part.done", item_id=item["id"], output_index=idx,
                                  content_index=0, part=part))
            item = {**item, "status": "completed", "content": [part]}
        elif kind == "reasoning":
            out.append(self._emit("response.reasoning_text.done", item_id=item["id"], output_index=idx,
                                  content_index=0, text=self.text))
            item = {**item, "content": [{"type": "reasoning_text", "text": self.text}]}
        else:
            args = self.text or "{}"
            out.append(self._emit("response.function_call_arguments.done", item_id=item["id"],
                                  output_index=idx, arguments=args))
            item = {**item, "status": "completed", "arguments": args}
        out.append(self._emit("response.output_item.done", output_index=idx, item=item))
        self.kind = None
        return out

    def _open_item(self, kind: str, item: dict) -> list[SSEEvent]:
        out = self._close_item()
        self.kind, self.index, self.item, self.text = kind, self.index + 1, item, ""
        out.append(self._emit("response.output_item.added", output_index=self.index, item=item))
        if kind == "message":
            out.append(self._emit("response.content_part.added", item_id=item["id"], output_index=self.index,
                                  content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
        return out

    def _open_message(self) -> list[SSEEvent]:
        return self._open_item("message", {"id": self._item_id("msg", "msg"), "type": "message",
                                           "status": "in_progress", "role": "assistant", "content": []})

    def _send(self, d: Delta) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        if d.kind == "reasoning":
            if self.kind != "reasoning":
                out = self._open_item("reasoning", {"id": self._item_id("rs", "rs"), "type": "reasoning",
                                                    "summary": []})
            self.text += d.text
            out.append(self._emit("response.reasoning_text.delta", item_id=self.item["id"],
                                  output_index=self.index, content_index=0, delta=d.text))
        elif d.kind == "content":
            if self.kind != "message":
                out = self._open_message()
            self.text += d.text
            out.append(self._emit("response.output_text.delta", item_id=self.item["id"],
                                  output_index=self.index, content_index=0, delta=d.text))
        elif d.kind == "call":
            out = self._open_item("function_call", {
                "id": self._item_id(f"fc{d.index}", "fc"), "type": "function_call", "status": "in_progress",
                "call_id": d.id, "name": d.name, "arguments": ""})
        else:
            self.text += d.text
            out.append(self._emit("response.function_call_arguments.delta", item_id=self.item["id"],
                                  output_index=self.index, delta=d.text))
        return out

    def token(self, ev: TokenEvent) -> list[SSEEvent]:
        return [e for d in self.out.feed(ev) for e in self._send(d)]

    def final(self, ev: FinalEvent) -> list[SSEEvent]:
        out = [e for d in self.out.finish() for e in self._send(d)]
        if self.index < 0:  # nothing generated: still one (empty) message item
            out += self._open_message()
        out += self._close_item()
        r = self._finished(ev)
        done = "response.incomplete" if r["status"] == "incomplete" else "response.completed"
        return out + [self._emit(done, response=r)]

    def error(self, exc: BaseException) -> list[SSEEvent]:
        message = openai_error(exc)[1]["error"]["message"]
        return [self._emit("response.failed", response={
            **self.resp, "status": "failed", "error": {"code": "server_error", "message": message}})]

    # ---- one response ----

    def collect(self, ev: TokenEvent) -> None:
        self.out.collect(ev)

    def body(self, ev: FinalEvent) -> dict:
        self.out.parse()
        return self._finished(ev)
