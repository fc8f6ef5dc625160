"""aiohttp server: OpenAI-compatible and llama-server-compatible routes over the engine."""
from .app import ServerConfig, create_app, run_server

__all__ = ["ServerConfig", "create_app", "run_server"]
