"""Tokenizers read from GGUF metadata, matching llama.cpp's ``llama-vocab.cpp``.

    tok = Tokenizer.from_gguf(gf)          # a BPETokenizer ("gpt2") or an SPMTokenizer ("llama")
    ids = tok.encode(text, add_special=True, parse_special=False)
    text = tok.decode(ids, skip_special=False)
    tok.token_to_piece(id, special=True) -> bytes
    tok.vocab_size, tok.bos_id, tok.eos_id, tok.eot_id, tok.eog_ids, tok.is_eog(id)
    tok.is_special(id)          # control/unknown: hidden when special=False
    sd = tok.stream_decoder(special=False); sd.feed(id) -> str; sd.flush() -> str

Where things live:

- ``vocab.py``: token strings <-> ids, attributes, scores;
- ``special.py``: BOS/EOS/EOG and the other special ids, llama.cpp's by-text detection,
  splitting special-token texts out before tokenizing;
- ``base.py``: ``Tokenizer``, what both kinds share (metadata, encode frame, pieces,
  detokenize);
- ``bpe.py`` (with ``pretokenize.py``, ``bytelevel.py``) and ``spm.py``: the two kinds;
- ``merge.py``: the merge loop both kinds run, ranked their own way;
- ``stream.py``: the incremental UTF-8-safe decoder for streamed output;
- ``fim.py``: the fill-in-the-middle tokens (``tok.fim``, None without them).
"""
from .base import Tokenizer
from .fim import FimTokens
from .bpe import BPETokenizer
from .bytelevel import BYTE_TO_UNICODE, UNICODE_TO_BYTE, byte_encode
from .pretokenize import PRE_TOKENIZERS, PreTokenizer, regex_split
from .spm import SPMTokenizer
from .stream import StreamDecoder
from .vocab import Vocab

__all__ = [
    "Tokenizer", "BPETokenizer", "SPMTokenizer", "StreamDecoder", "Vocab", "FimTokens",
    "PRE_TOKENIZERS", "PreTokenizer", "regex_split", "BYTE_TO_UNICODE", "UNICODE_TO_BYTE", "byte_encode",
]
