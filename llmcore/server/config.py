"""The server's own settings (the engine has its own, `EngineConfig`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    # a body past this (decoded: gzip counts expanded) is refused while it is read (413);
    # long agent histories are a few MiB
    max_body_bytes: int = 16 * 1024 * 1024
    max_json_values: int = 1_000_000  # JSON values in a body (one more: 413); parsing costs per value
    keepalive_s: float = 5.0  # SSE comment while waiting (queue, long prefill)
    # at SIGTERM / Ctrl-C: seconds running requests may still take; the rest then end
    # with an error event (and [DONE]) and the disk tier is written
    shutdown_timeout: float = 30.0
    cors_origins: tuple[str, ...] = ()  # origins allowed to call from a browser ("*": any); none: CORS off
    # connections (connections.py): like llama-server's --timeout (read/write) and keep-alive
    header_timeout_s: float = 30.0  # first byte of a request to the end of its headers
    body_timeout_s: float = 600.0  # reading a body; writing each part of an answer
    idle_timeout_s: float = 5.0  # a kept-alive connection with no request
    max_conns_per_client: int = 256  # concurrent connections per client address (0: no cap)
    template_timeout_s: float = 5.0  # one chat template render
    workers: int = 4  # threads for request work off the event loop (offload.py)
    # keys a request must bring (Authorization: Bearer KEY or x-api-key: KEY) on every route
    # but /health; none: no key asked (access.py)
    api_keys: tuple[str, ...] = ()
    reasoning_format: str = "deepseek"  # "deepseek": a think block -> reasoning_content; "none": left in the text
    reasoning_budget: int = -1  # thinking tokens a request may spend (-1: no limit, 0: thinking off)
