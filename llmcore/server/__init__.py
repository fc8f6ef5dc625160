"""aiohttp server: OpenAI-, Anthropic- and llama-server-compatible routes over the engine.

app.py builds it; connections.py listens (timeouts, per-address cap); access.py decides
who may drive it (Host, API key, body type, CORS); requests/ reads and checks bodies;
prompt.py builds prompts and their output constraints (offload.py: in worker threads);
embeddings.py runs embedding requests; response_store.py keeps Responses for
previous_response_id; handlers/ and encoders/ answer."""
from .app import create_app, listen_socket, run_server, socket_url
from .config import ServerConfig
from .connections import start_server

__all__ = ["ServerConfig", "create_app", "listen_socket", "run_server", "socket_url", "start_server"]
