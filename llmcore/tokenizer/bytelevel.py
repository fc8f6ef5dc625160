"""GPT-2's byte-level alphabet: every byte is one printable character, so a BPE vocabulary
of strings covers arbitrary bytes (``byte_encode`` before merging, ``UNICODE_TO_BYTE``
when turning a token back into bytes)."""
from __future__ import annotations


def _bytes_to_unicode() -> list[str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = [""] * 256
    for b, c in zip(bs, cs):
        table[b] = chr(c)
    return table


BYTE_TO_UNICODE: list[str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
# str.translate table: latin-1 code point (= byte value) -> byte-level unicode char
_BYTE_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_TO_UNICODE)}


def byte_encode(text: str) -> str:
    """UTF-8 bytes of `text` mapped through GPT-2's byte-to-unicode table."""
    return text.encode("utf-8").decode("latin-1").translate(_BYTE_ENCODE_TABLE)


def byte_decode(token: str) -> bytes:
    """The bytes a byte-level token string stands for (a character outside the table, as
    some vocabularies have, stands for its own UTF-8)."""
    u2b = UNICODE_TO_BYTE
    out = bytearray()
    for ch in token:
        b = u2b.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)
