"""``Tokenizer``: what BPE and SPM tokenizers share, over a ``Vocab`` and its special tokens.

- construction from GGUF metadata (``tokenizer.ggml.*``), choosing the kind by
  ``tokenizer.ggml.model`` among the registered subclasses (``bpe.py``: "gpt2",
  ``spm.py``: "llama");
- encoding's frame: special texts split out, BOS/EOS added; each text fragment between
  special tokens goes to the kind's ``_encode_fragment`` (long ones through the
  ``FragmentCache``: a repeated chat history is looked up, not tokenized again);
- pieces (a token's bytes, cached; the kind says how a normal token's string becomes
  bytes) and llama.cpp's detokenize, with its clean_spaces passes;
- token attributes and the end-of-generation test.
"""
from __future__ import annotations

import functools

from typing import Any, ClassVar, Sequence

from ..errors import ModelLoadError
from .fim import FimTokens
from .fragment_cache import FragmentCache
from .special import DefaultIds, SpecialSplitter, find_special_tokens
from .stream import StreamDecoder
from .vocab import ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_USER_DEFINED, Vocab

_WORD_CACHE_SIZE = 50000


class Tokenizer:
    """A GGUF vocabulary with its tokenizer; ``from_gguf`` gives the right subclass.

    Subclasses set ``model`` (the ``tokenizer.ggml.model`` they read), ``type``,
    ``default_ids``, and implement ``_encode_fragment`` and ``_normal_piece``.
    """

    model: ClassVar[str]
    type: ClassVar[str]
    fim: FimTokens | None = None  # fill-in-the-middle tokens (from_metadata sets them)
    default_ids: ClassVar[DefaultIds]
    _kinds: ClassVar[dict[str, type["Tokenizer"]]] = {}

    # llama.cpp's defaults for the kind: a subclass sets them before calling __init__ here
    add_space_prefix: bool
    add_bos: bool
    add_eos: bool = False
    clean_spaces: bool = False

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "model" in cls.__dict__:
            Tokenizer._kinds[cls.model] = cls

    def __init__(
        self,
        vocab: Vocab,
        bos_id: int | None = None,
        eos_id: int | None = None,
        eot_id: int | None = None,
        eom_id: int | None = None,
        unk_id: int | None = None,
        pad_id: int | None = None,
        add_bos: bool | None = None,
        add_eos: bool | None = None,
        add_space_prefix: bool | None = None,
    ):
        """Shared set-up, after the subclass has set its defaults: metadata overrides,
        special ids (checked, then found by text), the special-text splitter."""
        self.vocab = vocab
        if add_space_prefix is not None:
            self.add_space_prefix = bool(add_space_prefix)
        if add_bos is not None:
            self.add_bos = bool(add_bos)
        if add_eos is not None:
            self.add_eos = bool(add_eos)
        sp = find_special_tokens(vocab, self.default_ids, bos=bos_id, eos=eos_id, eot=eot_id, eom=eom_id,
                                 unk=unk_id, pad=pad_id)
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = sp.bos, sp.eos, sp.unk, sp.pad
        self.eot_id, self.eom_id = sp.eot, sp.eom
        self.eog_ids: frozenset[int] = sp.eog
        if self.add_bos and self.bos_id is None:
            raise ModelLoadError("tokenizer: add_bos_token is true, but bos_token_id is not set")
        if self.add_eos and self.eos_id is None:
            raise ModelLoadError("tokenizer: add_eos_token is true, but eos_token_id is not set")
        self._specials = SpecialSplitter(vocab)
        self._pieces: list[bytes | None] = [None] * len(vocab)
        self._word_cache: dict[str, list[int]] = {}  # pre-tokenized word / SPM segment -> ids
        self.fragments = FragmentCache()  # fragment between special tokens -> ids

    # --- construction -----------------------------------------------------------------
    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> "Tokenizer":
        """From a GGUF metadata dict (keys tokenizer.ggml.*): a BPETokenizer or an
        SPMTokenizer, as ``tokenizer.ggml.model`` says."""
        g = meta.get
        model = g("tokenizer.ggml.model")
        if model is None:
            raise ModelLoadError("no tokenizer in this GGUF (tokenizer.ggml.model missing)")
        tokens = g("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelLoadError("no tokenizer vocabulary in this GGUF (tokenizer.ggml.tokens missing)")
        kind = cls._kinds.get(str(model))
        if kind is None:
            supported = ", ".join(sorted(cls._kinds))
            raise ModelLoadError(f"unsupported tokenizer model {str(model)!r} (supported: {supported})")
        tok = kind._from_metadata(
            meta,
            tokens=tokens,
            token_types=g("tokenizer.ggml.token_type"),
            bos_id=g("tokenizer.ggml.bos_token_id"),
            eos_id=g("tokenizer.ggml.eos_token_id"),
            eot_id=g("tokenizer.ggml.eot_token_id"),
            eom_id=g("tokenizer.ggml.eom_token_id"),
            unk_id=g("tokenizer.ggml.unknown_token_id"),
            pad_id=g("tokenizer.ggml.padding_token_id"),
            add_bos=g("tokenizer.ggml.add_bos_token"),
            add_eos=g("tokenizer.ggml.add_eos_token"),
            add_space_prefix=g("tokenizer.ggml.add_space_prefix"),
        )
        tok.fim = FimTokens.from_metadata(meta, tok.vocab)
        return tok

    @classmethod
    def _from_metadata(cls, meta: dict[str, Any], **common: Any) -> "Tokenizer":
        """The kind's constructor, given the shared fields and the metadata for its own."""
        raise NotImplementedError

    @classmethod
    def from_gguf(cls, gf) -> "Tokenizer":
        """From an opened `llmcore.gguf_file.GGUFFile`."""
        return cls.from_metadata(gf.meta)

    # --- vocabulary and attributes -----------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def n_vocab(self) -> int:
        return len(self.vocab)

    def token_text(self, tid: int) -> str:
        """The raw vocabulary string of a token (byte-level / ▁-escaped form)."""
        return self.vocab.texts[tid]

    def token_id(self, text: str) -> int | None:
        """Id of the token whose vocabulary string is exactly `text`, or None."""
        return self.vocab.ids.get(text)

    def token_attr(self, tid: int) -> int:
        return self.vocab.attrs[tid]

    def is_special(self, tid: int) -> bool:
        """Control or unknown token: rendered only when special=True (like llama.cpp)."""
        return bool(self.vocab.attrs[tid] & (ATTR_CONTROL | ATTR_UNKNOWN))

    def is_control(self, tid: int) -> bool:
        return bool(self.vocab.attrs[tid] & ATTR_CONTROL)

    def is_user_defined(self, tid: int) -> bool:
        return bool(self.vocab.attrs[tid] & ATTR_USER_DEFINED)

    def is_eog(self, tid: int) -> bool:
        return tid in self.eog_ids

    @functools.cached_property
    def max_piece_bytes(self) -> int:
        """Byte length of the longest token's piece, special tokens included (computed once)."""
        n = 1
        for i in range(self.vocab_size):
            try:
                n = max(n, len(self.token_to_piece(i)))
            except Exception:  # noqa: BLE001 - a token without a piece: no length to count
                continue
        return n

    # --- encode ------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`. add_special adds BOS/EOS as the vocab says (add_bos/add_eos);
        parse_special turns control-token texts (e.g. "<|im_start|>") into their ids."""
        frags = self._specials.split(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)  # type: ignore[arg-type]
        after_special = True  # the text starts, or follows a special token
        cache = self.fragments
        for f in frags:
            if isinstance(f, str):
                if cache.wants(f):
                    ids = cache.get(f, after_special)
                    if ids is None:
                        n = len(out)
                        self._encode_fragment(f, out, after_special)
                        cache.put(f, after_special, out[n:])
                    else:
                        out.extend(ids)
                else:
                    self._encode_fragment(f, out, after_special)
                after_special = False
            else:
                out.append(f)
                after_special = True
        if add_special and self.add_eos:
            out.append(self.eos_id)  # type: ignore[arg-type]
        return out

    def _encode_fragment(self, text: str, out: list[int], after_special: bool) -> None:
        """Append the ids of a text without special tokens."""
        raise NotImplementedError

    def _remember(self, word: str, ids: list[int]) -> None:
        """Cache a word's ids; the cache starts over when full (prompts repeat words)."""
        if len(self._word_cache) > _WORD_CACHE_SIZE:
            self._word_cache.clear()
        self._word_cache[word] = ids

    # --- pieces and decode -------------------------------------------------------------
    def token_to_piece(self, tid: int, special: bool = True) -> bytes:
        """The bytes a token stands for. Control/unknown tokens give b"" unless special."""
        if not 0 <= tid < len(self._pieces):
            return b""
        if not special and self.vocab.attrs[tid] & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        p = self._pieces[tid]
        if p is None:
            p = self._make_piece(tid)
            self._pieces[tid] = p
        return p

    def _make_piece(self, tid: int) -> bytes:
        a = self.vocab.attrs[tid]
        text = self.vocab.texts[tid]
        if a & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if a & ATTR_NORMAL:
            return self._normal_piece(text)
        if a & ATTR_BYTE:
            if text.startswith("<0x") and len(text) == 6:
                return bytes([int(text[3:5], 16)])
            return text.encode("utf-8")
        return b""

    def _normal_piece(self, text: str) -> bytes:
        """The bytes of a normal token's vocabulary string."""
        raise NotImplementedError

    def piece(self, tid: int, special: bool = True) -> str:
        """token_to_piece decoded as UTF-8 (invalid bytes become U+FFFD)."""
        return self.token_to_piece(tid, special).decode("utf-8", errors="replace")

    def detokenize(
        self,
        ids: Sequence[int],
        remove_special: bool = False,
        unparse_special: bool = True,
        clean_spaces: bool | None = None,
    ) -> bytes:
        """llama.cpp llama_detokenize, as bytes. clean_spaces defaults to the vocab's."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for tid in ids:
            p = self.token_to_piece(tid, unparse_special)
            if remove_space and p.startswith(b" "):
                p = p[1:]
            remove_space = False
            parts.append(p)
        text = b"".join(parts)
        if (self.clean_spaces if clean_spaces is None else clean_spaces) and text:
            text = clean_up_spaces(text)
        return text

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of `ids`. skip_special drops control tokens (and a leading BOS / trailing EOS
        the vocab adds itself)."""
        return self.detokenize(ids, remove_special=skip_special, unparse_special=not skip_special).decode(
            "utf-8", errors="replace"
        )

    def stream_decoder(self, special: bool = False) -> StreamDecoder:
        """An incremental decoder over this tokenizer's pieces (see stream.py)."""
        return StreamDecoder(self, special=special)


def clean_up_spaces(text: bytes) -> bytes:
    """llama.cpp's clean_spaces passes (BPE vocabs whose pre-tokenizer keeps them on)."""
    t = bytearray(text)
    # " ?", " !", " .", " ,"
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    t = out
    # " ' " -> "'"
    out = bytearray(t[:1])
    i = 1
    while i < len(t):
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            out.append(x)
            i += 2
            continue
        out.append(x)
        i += 1
    t = out
    # " 's", " 'm", " 're", " 've"
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < len(t):
            x1 = t[i + 1]
            if x1 in b"sm":
                out.pop()
            elif i + 2 < len(t) and ((x1 == ord("r") and t[i + 2] == ord("e")) or (x1 == ord("v") and t[i + 2] == ord("e"))):
                out.pop()
        out.append(x)
    return bytes(out)
