"""aiohttp server: OpenAI-, Anthropic- and llama-server-compatible routes over the engine.

app.py builds it; connections.py listens (timeouts, per-address cap); access.py decides
who may drive it (Host, body type, CORS); requests/ reads and checks bodies; prompt.py
builds prompts (offload.py: in worker threads); handlers/ and encoders/ answer."""
from .app import create_app, listen_socket, run_server, socket_url
from .config import ServerConfig
from .connections import start_server

__all__ = ["ServerConfig", "create_app", "listen_socket", "run_server", "socket_url", "start_server"]
