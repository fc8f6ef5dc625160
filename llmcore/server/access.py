"""Who may drive the server: checks every request passes before its handler runs.

- Host header (DNS rebinding): on a loopback bind, a Host that is not a loopback name or
  address is refused (403). A web page on evil.example whose name resolves to 127.0.0.1
  sends `Host: evil.example`.
- Body type (CSRF): a POST body must be `application/json` (or a type its route declares,
  `accepts(..., media_types=...)`), else 415. A web page can send a text/plain or form
  POST to any address without asking (no CORS preflight), never an application/json one.
- CORS: off unless `--cors ORIGIN` names origins (or `*`): then their preflight requests
  are answered and their responses carry Access-Control-Allow-Origin.
- API key (`--api-key`): every route but /health needs `Authorization: Bearer KEY` (or
  Anthropic's `x-api-key: KEY`), else 401; checked first. A non-loopback bind without one
  is warned about at start.
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
    if not is_loopback_address(cfg.host) and not cfg.api_key:
        log.warning("listening on %s, which other machines can reach, without an API key: anyone "
                    "who can connect can use this server (bind to 127.0.0.1, or put an "
                    "authenticating proxy in front)", cfg.host)


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


PUBLIC_PATHS = frozenset({"/health", "/v1/health"})  # as llama-server: probes need no key


def check_api_key(request: web.Request, key: str) -> None:
    if request.path in PUBLIC_PATHS:
        return
    auth = request.headers.get("Authorization", "")
    given = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("X-Api-Key", "")
    if not hmac.compare_digest(given.encode(), key.encode()):
        raise UnauthorizedError("Invalid API Key")


@web.middleware
async def access_middleware(request: web.Request, handler):
    cfg = request.app[CONFIG]
    check_host(request, cfg.host)
    if cfg.api_key and request.method != "OPTIONS":  # before anything else a request can reach
        check_api_key(request, cfg.api_key)
    route_error = request.match_info.http_exception
    if request.method == "OPTIONS" and isinstance(route_error, web.HTTPMethodNotAllowed) \
            and request.headers.get("Access-Control-Request-Method"):
        origin = allowed_origin(request)
        if origin is not None:
            return _preflight(request, origin, route_error)
    check_media_type(request)
    return await handler(request)
