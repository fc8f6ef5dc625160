"""qwen3 (dense): llama's recipe plus per-head RMS norms on q and k (before rope) and
NeoX rope ordering (pairs i, i + n_rot/2). Output usually tied to token_embd.
"""
from __future__ import annotations

from . import register
from .llama import Llama


@register("qwen3")
class Qwen3(Llama):
    rope_neox = True
    qk_norm = True
