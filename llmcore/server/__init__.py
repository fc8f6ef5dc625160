"""aiohttp server: OpenAI-, Anthropic- and llama-server-compatible routes over the engine."""
from .app import create_app, listen_socket, run_server, socket_url
from .config import ServerConfig

__all__ = ["ServerConfig", "create_app", "listen_socket", "run_server", "socket_url"]
