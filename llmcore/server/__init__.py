"""aiohttp server: OpenAI-, Anthropic- and llama-server-compatible routes over the engine."""
from .app import create_app, run_server
from .config import ServerConfig
from .connections import start_server

__all__ = ["ServerConfig", "create_app", "run_server", "start_server"]
