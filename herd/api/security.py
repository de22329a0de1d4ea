"""Who may talk to the API, and how much: bearer tokens, host names, body limits, bind checks.

Plain ASGI middleware rather than FastAPI dependencies, so that no route can be
added without them, and so that the body limit is enforced while the body is
read (a client may lie in Content-Length, or send chunks with none).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from herd.config import MIN_TOKEN_LENGTH, TenantToken
from herd.errors import ConfigError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The dashboard's page and its script carry no data; the data they fetch needs the token.
OPEN_PATHS = ("/", "/favicon.ico")
OPEN_PREFIXES = ("/static/",)

# A token bound to tenants may call these only (method, path): it is a tenant's client,
# not the fleet's operator.
TENANT_ROUTES = (("POST", "/query"), ("GET", "/healthz"))
TENANTS_KEY = "herd.tenants"  # in the ASGI scope's state: the tenants a request may use
# ... and the evaluations' routes, on batches it made only (herd.llm.eval.control):
# a batch records the hash of the token that made it.
TENANT_PREFIXES = (("POST", "/evals/"), ("GET", "/evals/"))
TENANT_ROUTES_EVAL = (("POST", "/evals"),)
CALLER_KEY = "herd.caller"  # in the scope's state: (owner, admin) of the token sent
# Requests that change nothing: a browser may send them cross-site without harm.
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def token_owner(token: bytes) -> str:
    """What a batch made with ``token`` records: a hash, never the token."""
    return "token:" + hashlib.sha256(token).hexdigest()[:32]


def tenant_may(method: str, path: str) -> bool:
    return (
        (method, path) in TENANT_ROUTES
        or (method, path) in TENANT_ROUTES_EVAL
        or any(method == m and path.startswith(p) for m, p in TENANT_PREFIXES)
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def strong(token: str | None) -> bool:
    return token is not None and len(token) >= MIN_TOKEN_LENGTH


def weakest(tokens: Sequence[str | None]) -> str | None:
    """The shortest token configured: it decides how far the server may answer."""
    given = [t for t in tokens if t]
    return min(given, key=len) if given else None


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve beyond this machine without a token long enough not to be guessed."""
    if is_loopback(host):
        return
    if not token:
        raise ConfigError(
            f"refusing to listen on {host} without a token: set HERD_API_TOKEN"
            " (every request must then send 'Authorization: Bearer <token>'), or bind 127.0.0.1"
        )
    if not strong(token):
        raise ConfigError(
            f"refusing to listen on {host} with a HERD_API_TOKEN of {len(token)} characters:"
            f" off loopback it needs at least {MIN_TOKEN_LENGTH}, or bind 127.0.0.1"
        )


def host_name(header: str) -> str | None:
    """The name of a Host header, lowercase, without its port; None when malformed."""
    name, port = header.strip().lower(), ""
    if name.startswith("["):
        end = name.find("]")
        if end < 0:
            return None
        name, port = name[: end + 1], name[end + 1 :]
    elif ":" in name:
        name, _, rest = name.partition(":")
        port = ":" + rest
    if port and not (port.startswith(":") and port[1:].isdigit()):
        return None
    return name.removesuffix(".") or None


def _client_is_local(scope: Scope) -> bool:
    client = scope.get("client")
    # No peer address: a Unix socket or an in-process call, both on this machine.
    return not client or is_loopback(str(client[0]))


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


class LocalOrTrusted:
    """Which clients and which Host names the server answers, whoever built it.

    The bind check of `herd serve` cannot see ``uvicorn --factory ... --host 0.0.0.0``,
    so without a token long enough the app itself answers loopback clients only (403).
    Without a token, a browser on this machine can be made to call the API by any
    page whose name an attacker re-points at 127.0.0.1 (DNS rebinding): only loopback
    names and HERD_API_TRUSTED_HOSTS are then answered (400). With a token, an
    attacker's page cannot send it; the list, when given, is still enforced.
    """

    def __init__(self, app: ASGIApp, token: str | None, trusted_hosts: Sequence[str] = ()) -> None:
        self.app = app
        self.token = token
        self.trusted = tuple(h.lower() for h in trusted_hosts)

    def host_allowed(self, header: bytes | None) -> bool:
        name = host_name(header.decode("latin-1")) if header else None
        if name is None:
            return False
        if is_loopback(name):
            return True
        if not self.trusted:
            return bool(self.token)
        return any(
            t == "*" or name == t or (t.startswith("*.") and name.endswith(t[1:]))
            for t in self.trusted
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if not strong(self.token) and not _client_is_local(scope):
            return await send_json(
                send,
                403,
                {
                    "error": "this server answers loopback clients only: set HERD_API_TOKEN"
                    f" (at least {MIN_TOKEN_LENGTH} characters) to serve other machines"
                },
            )
        if not self.host_allowed(_header(scope, b"host")):
            trusted = "HERD_API_TRUSTED_HOSTS" + ("" if self.token else " (or set HERD_API_TOKEN)")
            return await send_json(
                send,
                400,
                {
                    "error": "the Host header names no host this server answers for: use"
                    f" localhost, 127.0.0.1 or [::1], or a name listed in {trusted}"
                },
            )
        await self.app(scope, receive, send)


class BearerAuth:
    """With a token configured, every request but the dashboard's shell must carry one.

    ``token`` may do anything; each of ``bound`` (HERD_API_TOKENS) may call
    TENANT_ROUTES only, and the tenants it may use go in the scope's state (TENANTS_KEY)
    for the route to check.
    """

    def __init__(self, app: ASGIApp, token: str | None, bound: Sequence[TenantToken] = ()) -> None:
        self.app = app
        self._tokens: list[tuple[bytes, frozenset[str] | None]] = [
            *([(token.encode(), None)] if token else []),
            *((b.token.encode(), b.tenants) for b in bound),
        ]

    def _open(self, scope: Scope) -> bool:
        path = scope.get("path", "")
        return scope.get("method") in ("GET", "HEAD") and (
            path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)
        )

    def _match(self, scope: Scope) -> tuple[bool, frozenset[str] | None, bytes]:
        scheme, _, given = (_header(scope, b"authorization") or b"").partition(b" ")
        given = given.strip()
        found, tenants = False, None
        # compare_digest, and every token compared: the time taken says nothing about how
        # much of a token matched, nor which.
        for token, bound in self._tokens:
            if hmac.compare_digest(given, token):
                found, tenants = True, bound
        return found and scheme.lower() == b"bearer", tenants, given

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._tokens or scope["type"] != "http" or self._open(scope):
            return await self.app(scope, receive, send)
        found, tenants, given = self._match(scope)
        if not found:
            return await send_json(
                send,
                401,
                {"error": "missing or wrong bearer token (Authorization: Bearer <HERD_API_TOKEN>)"},
                [(b"www-authenticate", b'Bearer realm="herd"')],
            )
        state = scope.setdefault("state", {})
        state[CALLER_KEY] = (token_owner(given), tenants is None)
        if tenants is not None:
            if not tenant_may(str(scope.get("method")), str(scope.get("path"))):
                routes = ", ".join(f"{m} {p}" for m, p in TENANT_ROUTES)
                return await send_json(
                    send,
                    403,
                    {
                        "error": f"this token is bound to tenants: it may call {routes}"
                        " and the evaluations' routes of batches it made only"
                    },
                )
            state[TENANTS_KEY] = tenants
        await self.app(scope, receive, send)


def _origin_of(value: str) -> tuple[str, str] | None:
    """(scheme, host:port) of an Origin header, the port made explicit; None if malformed."""
    scheme, sep, rest = value.strip().lower().partition("://")
    if not sep or scheme not in ("http", "https") or not rest or "/" in rest:
        return None
    return scheme, _with_port(rest, scheme)


def _with_port(host: str, scheme: str) -> str:
    """``name:port`` of a Host (or an Origin's authority), the scheme's port when none
    is given; '' when malformed."""
    name = host_name(host)
    if name is None:
        return ""
    rest = host[host.find("]") + 1 :] if host.startswith("[") else host.partition(":")[1:][1]
    port = rest.lstrip(":") if host.startswith("[") else rest
    return f"{name}:{port or ('443' if scheme == 'https' else '80')}"


class SameOrigin:
    """403 for a request that changes something (POST, PUT, DELETE, ...) sent by a page
    of another site: ``Sec-Fetch-Site`` other than same-origin or none (typed by the
    user), or an ``Origin`` whose scheme, host and port are not the server's own.

    Without a token a loopback server trusts any local client, and a browser sends a
    page's request to 127.0.0.1 without asking first when it is "simple" (a POST with
    no body, or a text/plain one): a page on any site could cancel a batch. Clients
    that are not browsers send neither header, and are not refused.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def _refused(self, scope: Scope) -> str | None:
        site = _header(scope, b"sec-fetch-site")
        if site is not None and site.strip().lower() not in (b"same-origin", b"none"):
            return f"Sec-Fetch-Site: {site.decode('latin-1')[:40]}"
        origin = _header(scope, b"origin")
        if origin is None:
            return None
        shown = origin.decode("latin-1")
        found = _origin_of(shown)
        host = _header(scope, b"host")
        scheme = str(scope.get("scheme", "http"))
        own = _with_port(host.decode("latin-1").strip().lower(), scheme) if host else ""
        if found is None or not own or found != (scheme, own):
            return f"Origin: {shown[:80]}"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in SAFE_METHODS:
            return await self.app(scope, receive, send)
        why = self._refused(scope)
        if why is not None:
            return await send_json(
                send,
                403,
                {"error": f"refused a cross-site request ({why}): send it from this"
                          " server's own pages, or from a client that is not a browser"},
            )  # fmt: skip
        await self.app(scope, receive, send)


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


# A JSON answer loads nothing and may be framed by no one; the pages that load
# something (the dashboard, /docs) send their own policy, which is kept.
DEFAULT_CSP = b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"content-security-policy", DEFAULT_CSP),
]


def with_security_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` plus each security header that the response does not set itself."""
    present = {bytes(k).lower() for k, _ in headers}
    return [*headers, *((k, v) for k, v in HEADERS if k not in present)]


class SecurityHeaders:
    """Headers that keep browsers from sniffing, framing, leaking referrers or loading
    anything a response did not ask for, on every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = with_security_headers(message.get("headers", []))
            await send(message)

        await self.app(scope, receive, with_headers)
