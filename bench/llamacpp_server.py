#!/usr/bin/env python3
"""llama.cpp's OpenAI-compatible server through llama-cpp-python (``pip install
'llama-cpp-python[server]==0.3.36'``), as the peer of ``llmcore bench load``:

    python bench/llamacpp_server.py --model M.gguf --port 8081 --n_ctx 16384 \\
        --type_k 2 --type_v 2 --flash_attn true      # q4_0 K and V (ggml type 2)

The arguments are llama_cpp.server's. Weights load with ``use_extra_bufts = False``, as
in bench/_peer_llamacpp.py (llama.cpp's AMX repacking crashed on some machines). This
server runs one request at a time (no parallel slots): concurrent requests queue.
"""
import runpy
import sys

import llama_cpp.llama_cpp as L

_default = L.llama_model_default_params


def _no_extra_bufts():
    p = _default()
    p.use_extra_bufts = False
    return p


L.llama_model_default_params = _no_extra_bufts
sys.argv[0] = "llama_cpp.server"
runpy.run_module("llama_cpp.server", run_name="__main__")
