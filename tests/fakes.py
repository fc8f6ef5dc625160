"""Deterministic stand-ins for the model, tokenizer and chat template (engine/server tests).

FakeTokenizer: byte-level. id 0 = <unk>, 1 = <s> (BOS), 2 = </s> (EOS), id b+3 = byte b.
FakeModel: the most likely next token after letter c is the next letter (a->b->...->y->z),
after 'z' comes EOS, after anything else comes 'a'. Logits fall off with the distance to
that target, so sampling at a temperature still varies. States count their tokens.

FakeModel and FakeState implement the engine's protocols in full
(llmcore.engine.protocols.LanguageModel / SequenceState): a state is its token list, a
snapshot a copy of it; no block pools, nothing needs checkpoints.
"""
from __future__ import annotations

import codecs
import threading
import time

import numpy as np

from llmcore.cache.protocol import Footprint

BOS, EOS, N_SPECIAL = 1, 2, 3
VOCAB = 256 + N_SPECIAL


def tid(ch: str) -> int:
    return ord(ch) + N_SPECIAL


class FakeStreamDecoder:
    def __init__(self, tok: "FakeTokenizer"):
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token: int) -> str:
        if token < N_SPECIAL:
            return ""
        return self._dec.decode(bytes([token - N_SPECIAL]))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class FakeTokenizer:
    bos_id = BOS
    eos_id = EOS
    eog_ids = frozenset({EOS})
    vocab_size = VOCAB
    add_bos = True
    fim = None
    max_piece_bytes = 5  # "<unk>"
    _special = {"<unk>": 0, "<s>": BOS, "</s>": EOS}

    def is_eog(self, tid: int) -> bool:
        return tid in self.eog_ids

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        out = [BOS] if add_special else []
        i = 0
        while i < len(text):
            if parse_special:
                hit = next((s for s in self._special if text.startswith(s, i)), None)
                if hit:
                    out.append(self._special[hit])
                    i += len(hit)
                    continue
            out.extend(b + N_SPECIAL for b in text[i].encode())
            i += 1
        return out

    def token_to_piece(self, token: int) -> bytes:
        if token < N_SPECIAL:
            return [k for k, v in self._special.items() if v == token][0].encode()
        return bytes([token - N_SPECIAL])

    def decode(self, tokens, skip_special: bool = True) -> str:
        data = b"".join(
            self.token_to_piece(t) for t in tokens if not (skip_special and t < N_SPECIAL)
        )
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self, special: bool = False) -> FakeStreamDecoder:
        return FakeStreamDecoder(self)


class FakeChatTemplate:
    """<|role|>content newline per message; generation prompt '<|assistant|>'."""

    def render(self, messages, add_generation_prompt: bool = True, tools=None, **extra) -> str:
        out = "<s>"
        for m in messages:
            content = m.get("content") or ""
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            out += f"<|{m['role']}|>{content}\n"
        if add_generation_prompt:
            out += "<|assistant|>"
        return out


def next_token(last: int) -> int:
    ch = last - N_SPECIAL
    if ord("a") <= ch < ord("z"):
        return last + 1
    if ch == ord("z"):
        return EOS
    return tid("a")


class FakeSnapshot:
    """A copy of a FakeState's tokens (16 bytes a token, owned outright)."""

    def __init__(self, tokens):
        self.tokens = tuple(tokens)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return 16 * len(self.tokens)

    def footprint(self) -> Footprint:
        return Footprint(own_bytes=self.nbytes)


class FakeState:
    needs_checkpoints = False
    checkpoint_nbytes = 0
    fixed_state_nbytes = 0

    def __init__(self, model: "FakeModel"):
        self.model = model
        self.tokens: list[int] = []
        self.caches: dict = {}
        self.released = False

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return 16 * len(self.tokens)

    def min_trim(self) -> int:
        return 0

    def can_trim(self, n: int) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = max(0, min(n, len(self.tokens)))
        del self.tokens[n:]
        return n

    def blocks_needed(self, n: int) -> dict:
        return {}

    def blocks_held(self) -> dict:
        return {}

    def blocks_to_hold(self, n_tokens: int, chunk: int) -> dict:
        return {}

    def snapshot(self) -> FakeSnapshot:
        return FakeSnapshot(self.tokens)

    def restore(self, snap: FakeSnapshot) -> None:
        self.tokens = list(snap.tokens)

    def release_snapshot(self, snap: FakeSnapshot) -> None:
        pass

    def release(self) -> None:
        self.tokens.clear()


class FakeModel:
    """Deterministic logits, counts what it evaluates; optional delay and failure token."""

    arch = "fake"
    n_vocab = VOCAB
    pools: dict = {}

    def __init__(self, n_ctx_train: int = 256, delay: float = 0.0, fail_token: int | None = None):
        self.n_ctx_train = n_ctx_train
        self.delay = delay
        self.fail_token = fail_token
        self.forward_calls = 0
        self.argmax_calls = 0  # forwards asked for each row's argmax (greedy requests)
        self.tokens_evaluated = 0
        self.batch_sizes: list[int] = []  # segments per forward
        self.max_segment = 0
        self.lock = threading.Lock()
        self._dist = np.arange(VOCAB)

    def new_state(self) -> FakeState:
        return FakeState(self)

    def stats(self) -> dict:
        return {"forward_calls": float(self.forward_calls)}

    def logits_for(self, last: int) -> np.ndarray:
        target = next_token(last)
        d = np.abs(self._dist - target).astype(np.float32)
        return (10.0 - d).astype(np.float32)

    N_EMBD = 8  # hidden states (output="hidden"): a token's features, for embedding tests

    def hidden_for(self, token: int) -> np.ndarray:
        """A token's hidden state: letters a-z fall on a circle (near letters, near
        vectors), everything else on its own axis."""
        h = np.zeros(self.N_EMBD, dtype=np.float32)
        ch = token - N_SPECIAL
        if ord("a") <= ch <= ord("z"):
            ang = (ch - ord("a")) / 26 * np.pi
            h[0], h[1] = np.cos(ang), np.sin(ang)
        else:
            h[2 + token % (self.N_EMBD - 2)] = 1.0
        return h

    def forward(self, batch, all_logits: bool = False, output: str = "logits", n_logits=None,
                argmax=None) -> np.ndarray:
        seen = set()
        for state, toks in batch:
            assert id(state) not in seen, "one segment per state per forward"
            seen.add(id(state))
            assert len(toks) > 0
            if self.fail_token is not None and self.fail_token in list(toks):
                raise RuntimeError("fake model failure")
        if self.delay:
            time.sleep(self.delay)
        if output == "hidden":
            rows = []
            for state, toks in batch:
                toks = [int(t) for t in toks]
                state.tokens.extend(toks)
                self.tokens_evaluated += len(toks)
                rows += [self.hidden_for(t) for t in toks]
            self.forward_calls += 1
            self.batch_sizes.append(len(batch))
            return np.stack(rows)
        rows = []
        for i, (state, toks) in enumerate(batch):
            toks = [int(t) for t in toks]
            state.tokens.extend(toks)
            self.tokens_evaluated += len(toks)
            self.max_segment = max(self.max_segment, len(toks))
            k = len(toks) if all_logits else (1 if n_logits is None else int(n_logits[i]))
            rows += [self.logits_for(t) for t in toks[len(toks) - k:]]
        self.forward_calls += 1
        self.batch_sizes.append(len(batch))
        out = np.stack(rows).astype(np.float32)
        if argmax is not None:  # as the real model's: one int64 per logits row
            assert argmax.dtype == np.int64 and argmax.shape == (out.shape[0],)
            argmax[:] = np.argmax(out, axis=1)
            self.argmax_calls += 1
        return out


def expected_text(prompt_last_char: str, n: int) -> str:
    """Greedy continuation of FakeModel after a prompt ending in this character."""
    out, last = "", tid(prompt_last_char)
    for _ in range(n):
        last = next_token(last)
        if last == EOS:
            break
        out += chr(last - N_SPECIAL)
    return out
