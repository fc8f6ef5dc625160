"""Who may drive the server: checks every request passes before its handler runs.

- Host header (DNS rebinding): on a loopback bind, a Host that is not a loopback name or
  address is refused (403). A web page on evil.example whose name resolves to 127.0.0.1
  sends `Host: evil.example`.
- Body type (CSRF): a POST body must be `application/json` (or a type its route declares,
  `accepts(..., media_types=...)`), else 415. A web page can send a text/plain or form
  POST to any address without asking (no CORS preflight), never an application/json one.
- CORS: off unless `--cors ORIGIN` names origins (or `*`): then their preflight requests
  are answered and their responses carry Access-Control-Allow-Origin.
- API key (`--api-key`, `--api-key-file`: `ServerConfig.api_keys`): every route but
  /health needs `Authorization: Bearer KEY` or `x-api-key: KEY`, compared in constant
  time with each key; else 401 in the route's own envelope. CORS preflights pass (a
  browser sends no credentials with them). A non-loopback bind without a key is warned
  about at start.
"""
from __future__ import annotations

import hmac
import ipaddress
import logging

from aiohttp import web

from .config import ServerConfig
from .errors import ForbiddenHostError, UnauthorizedError, UnsupportedMediaTypeError
from .keys import CONFIG

log = logging.getLogger("llmcore.server")

JSON_ONLY = ("application/json",)
_BODY_METHODS = ("POST", "PUT", "PATCH")


def is_loopback_address(host: str) -> bool:
    """Whether a bind address (or a Host name) only reaches this machine."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(cfg: ServerConfig) -> None:
    """At start: a bind other machines can reach, with no API key, is said in the log."""
    if not is_loopback_address(cfg.host) and not cfg.api_keys:
        log.warning("listening on %s, which other machines can reach, without an API key: anyone "
                    "who can connect can use this server (set one with --api-key or "
                    "--api-key-file, or bind to 127.0.0.1)", cfg.host)


OPEN_PATHS = frozenset({"/health", "/v1/health"})  # load balancers probe them without a key


def presented_key(request: web.Request) -> str | None:
    """The key a request brings: `Authorization: Bearer KEY` (OpenAI clients) or
    `x-api-key: KEY` (Anthropic clients)."""
    auth = request.headers.get("Authorization", "")
    scheme, _, value = auth.strip().partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = request.headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def key_matches(key: str, keys: tuple[str, ...]) -> bool:
    """Constant time in the key's content: every key is compared, never stopping early."""
    given = key.encode("utf-8", errors="surrogatepass")
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(given, k.encode("utf-8", errors="surrogatepass"))
    return ok


def check_api_key(request: web.Request, keys: tuple[str, ...]) -> None:
    if not keys or request.path in OPEN_PATHS:
        return
    key = presented_key(request)
    if key is None:
        raise UnauthorizedError("no API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'")
    if not key_matches(key, keys):
        raise UnauthorizedError("invalid API key")


def host_name(header: str) -> str:
    """The name or address of a Host header, without the port ("[::1]:8080" -> "::1")."""
    header = header.strip()
    if header.startswith("["):
        end = header.find("]")
        return header[1:end] if end > 0 else header
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header


def check_host(request: web.Request, bind: str) -> None:
    if not is_loopback_address(bind):
        return  # bound for other machines: their names are not known here
    header = request.headers.get("Host")
    if header is None:
        return  # HTTP/1.0 without Host: no browser sends that
    if not is_loopback_address(host_name(header)):
        raise ForbiddenHostError(
            f"Host {header!r} is not a loopback name or address: refused, this server is bound "
            f"to {bind} (a web page whose name points here must not drive it); bind to another "
            f"address to serve other names")


def check_media_type(request: web.Request) -> None:
    if request.method not in _BODY_METHODS or request.match_info.http_exception is not None:
        return  # no body expected, or no route (404/405 follow)
    allowed = getattr(request.match_info.handler, "media_types", JSON_ONLY)
    if request.content_type not in allowed:
        sent = request.headers.get("Content-Type")
        raise UnsupportedMediaTypeError(
            f"the body must be sent as Content-Type: {' or '.join(allowed)} "
            f"(got {sent!r})" if sent else f"the body must be sent as Content-Type: {' or '.join(allowed)}")


# ---- CORS ------------------------------------------------------------------------------

_ALLOW_HEADERS = "Authorization, Content-Type, X-Api-Key, Anthropic-Version, Anthropic-Beta, OpenAI-Organization"


def allowed_origin(request: web.Request) -> str | None:
    """The request's Origin when CORS allows it ('*' allows every origin)."""
    origins = request.app[CONFIG].cors_origins
    origin = request.headers.get("Origin")
    if not origins or origin is None:
        return None
    if "*" in origins or origin in origins:
        return origin
    return None


def _preflight(request: web.Request, origin: str, allowed: web.HTTPMethodNotAllowed) -> web.Response:
    methods = ", ".join(sorted(allowed.allowed_methods))
    return web.Response(status=204, headers={
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": methods,
        "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers", _ALLOW_HEADERS),
        "Access-Control-Max-Age": "600",
        "Vary": "Origin",
    })


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: streamed answers and errors get the header too."""
    origin = allowed_origin(request)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"


@web.middleware
async def access_middleware(request: web.Request, handler):
    cfg = request.app[CONFIG]
    check_host(request, cfg.host)
    route_error = request.match_info.http_exception
    if request.method == "OPTIONS" and isinstance(route_error, web.HTTPMethodNotAllowed) \
            and request.headers.get("Access-Control-Request-Method"):
        origin = allowed_origin(request)
        if origin is not None:
            return _preflight(request, origin, route_error)
    check_api_key(request, cfg.api_keys)  # before anything else a request can reach
    check_media_type(request)
    return await handler(request)
