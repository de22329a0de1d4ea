"""Who may talk to the API, and how much: bearer tokens, body limits, bind checks.

Plain ASGI middleware rather than FastAPI dependencies, so that no route can be
added without them, and so that the body limit is enforced while the body is
read (a client may lie in Content-Length, or send chunks with none).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from herd.errors import ConfigError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The dashboard's page and its script carry no data; the data they fetch needs the token.
OPEN_PATHS = ("/", "/favicon.ico")
OPEN_PREFIXES = ("/static/",)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve beyond this machine without a token."""
    if not token and not is_loopback(host):
        raise ConfigError(
            f"refusing to listen on {host} without a token: set HERD_API_TOKEN"
            " (every request must then send 'Authorization: Bearer <token>'), or bind 127.0.0.1"
        )


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value)
    return None


class BearerAuth:
    """With a token configured, every request but the dashboard's shell must carry it."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    def _open(self, scope: Scope) -> bool:
        path = scope.get("path", "")
        return scope.get("method") in ("GET", "HEAD") and (
            path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] != "http" or self._open(scope):
            return await self.app(scope, receive, send)
        scheme, _, given = (_header(scope, b"authorization") or b"").partition(b" ")
        # compare_digest: the time taken says nothing about how much of the token matched.
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token):
            return await self.app(scope, receive, send)
        await send_json(
            send,
            401,
            {"error": "missing or wrong bearer token (Authorization: Bearer <HERD_API_TOKEN>)"},
            [(b"www-authenticate", b'Bearer realm="herd"')],
        )


class BodyLimit:
    """413 once a request body passes ``limit`` bytes, declared or actually sent.

    The body is read here, in full, before the app sees it: herd's requests are
    small JSON documents, and a route can then never read past the limit.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def _too_large(self, send: Send) -> None:
        await send_json(
            send,
            413,
            {"error": f"request body too large: the limit is {self.limit} bytes"},
            [(b"connection", b"close")],
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(send)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await self._too_large(send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: a disconnect, when it comes

        await self.app(scope, replay, send)


class SecurityHeaders:
    """Headers that keep browsers from sniffing, framing or leaking referrers."""

    HEADERS = [
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"no-referrer"),
        (b"cache-control", b"no-store"),
    ]

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
