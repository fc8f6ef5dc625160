"""The server's own settings (the engine has its own, `EngineConfig`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    client_max_size: int = 64 * 1024 * 1024  # long agent histories exceed aiohttp's 1 MiB
    keepalive_s: float = 5.0  # SSE comment while waiting (queue, long prefill)
    shutdown_timeout: float = 5.0
