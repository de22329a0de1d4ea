"""What every simulator route does on its connection: HTTP/1.1, the JSON answer, the key check.

The synchronous routes (``server.py``) and the Batch APIs (``batches.py``) both answer
through ``Exchange``; it lives apart from both so that neither imports the other's
handler.
"""

from __future__ import annotations

import hmac
import json
import socket
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any

MAX_BODY_BYTES = 32 * 1024 * 1024  # a request body past this is refused with 413


class Exchange(BaseHTTPRequestHandler):
    """One client connection, kept alive between requests."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; without this, Nagle's algorithm and the
        # client's delayed ACK add ~40 ms to every answer.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> bool:
        """Send a JSON answer; False if the client had gone."""
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("x-request-id", uuid.uuid4().hex)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return False
        return True


def same_key(given: str | None, key: str) -> bool:
    """Compared in constant time: how long a refusal takes says nothing of the key."""
    # Header values arrive decoded as Latin-1: encoding them back gives the bytes sent.
    return given is not None and hmac.compare_digest(
        given.encode("latin-1", "replace"), key.encode("utf-8")
    )


def given_key(headers: Any, api: str) -> str | None:
    """The API key a call carries: OpenAI's bearer token; Anthropic's ``x-api-key``, or a
    bearer token, which its SDK (2.x) sends instead."""
    bearer = (headers.get("authorization") or "").removeprefix("Bearer ").strip()
    if api == "anthropic":
        return headers.get("x-api-key") or bearer or None
    return bearer
