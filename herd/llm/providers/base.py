"""The part every HTTP provider shares: tries, waits, timeouts and error translation.

A provider subclass supplies three things: the request (URL path, headers, body),
how to read a successful answer, and its name. This class owns the policy: which
answers are retried (408, 409, 429, 5xx, and failures to connect), how long to wait
(``Retry-After`` when the provider says, else exponential backoff with jitter), when
to give up, and the translation of every httpx error into ``herd.llm.errors``.

Cancelling the task that awaits ``complete()`` closes the HTTP connection at once
(httpx/httpcore drop a connection whose exchange was interrupted), so the provider
sees the client go away and a long generation is not left running for nothing.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

import httpx

from herd.errors import ConfigError, InvalidInput
from herd.limits.base import key_id as limits_key_id
from herd.limits.base import pause_seconds
from herd.llm.completion import Completion, RateLimitInfo, Timeouts, Usage
from herd.llm.errors import (
    ProviderAuthError,
    ProviderError,
    ProviderResponseInvalid,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
)
from herd.masking import mask, remember, remember_urls

log = logging.getLogger("herd.llm")

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
EXCERPT_CHARS = 300
REDACTED = "[REDACTED]"


@runtime_checkable
class Provider(Protocol):
    """What an evaluation task needs from a model provider."""

    name: str
    model: str

    @property
    def key_id(self) -> str:
        """The API key's id (a hash prefix, never the key): the account a fleet-wide
        provider limit counts against."""
        ...

    async def complete(
        self,
        system: str,
        user: str,
        *,
        schema: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Completion: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class RetryPolicy:
    """When to try again and how long to wait first.

    ``max_tries`` counts the first try. The n-th wait is
    ``min(max_delay, initial_delay * 2**(n-1))`` scaled by a random factor in
    ``[1 - jitter, 1]``. A ``Retry-After`` from the provider replaces that wait (plus
    up to 10 % so that many clients told the same time do not come back together);
    one longer than ``max_retry_after`` is not waited out: ``RateLimited`` is raised
    at once with ``retry_after`` set, so that a job queue can reschedule the job
    instead of holding a worker. Read and write timeouts are not retried unless
    ``retry_timeouts``: the provider may still be generating (and billing) the answer.
    With ``retry_rate_limited=False`` a 429 is raised at once as ``RateLimited``: a
    fleet-wide limiter, not this one caller, decides when to try again.

    A 429 without ``Retry-After`` waits for the reset of the limit its rate-limit headers
    show exhausted (``RateLimited.scope``), else the backoff.
    """

    max_tries: int = 4
    initial_delay: float = 1.0
    max_delay: float = 30.0
    jitter: float = 0.5
    max_retry_after: float = 60.0
    retry_timeouts: bool = False
    retry_rate_limited: bool = True

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed try number ``attempt`` (1-based)."""
        if retry_after is not None:
            return retry_after * (1.0 + 0.1 * random.random())
        base = min(self.max_delay, self.initial_delay * 2.0 ** (attempt - 1))
        return base * (1.0 - self.jitter * random.random())


def _bounded(seconds: float | None) -> float | None:
    """A wait a provider asked for, bounded (pause_seconds); None when it is no number."""
    try:
        return None if seconds is None else pause_seconds(seconds)
    except InvalidInput:
        return None


def parse_retry_after(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms``, or ``Retry-After`` in seconds or an HTTP date,
    at most MAX_PAUSE; a value that is not a finite number (``inf``, ``1e400``) is not one."""
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            ms = _bounded(float(raw_ms) / 1000.0)
        except ValueError:
            ms = None
        if ms is not None:
            return ms
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        return _bounded(float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _bounded((when - (now or datetime.now(UTC))).total_seconds())


def redact(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` and every other credential (herd.masking) hidden."""
    if secret:
        text = text.replace(secret, REDACTED)
    return mask(text)


def excerpt(body: str, secret: str | None) -> str:
    """The error message of a JSON error body, else the start of the body; redacted, one line."""
    text = body
    try:
        data = json.loads(body)
    except ValueError:
        pass
    else:
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
    text = " ".join(redact(text, secret).split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


class HTTPProvider(ABC):
    """A model provider reached over HTTP with one pooled ``httpx.AsyncClient``.

    Use it as an async context manager, or call ``aclose()``. The client belongs to
    the event loop that first uses it.
    """

    name: str
    model: str

    def __init__(
        self,
        *,
        name: str,
        model: str,
        base_url: str,
        api_key: str | None,
        timeout: float | Timeouts | None = None,
        retry: RetryPolicy | None = None,
        max_connections: int = 100,
    ) -> None:
        self.name = name
        self.model = model
        self.base_url = base_url.rstrip("/")
        try:
            scheme = httpx.URL(self.base_url).scheme
        except httpx.InvalidURL:
            scheme = ""
        if scheme not in ("http", "https"):
            raise ConfigError(f"{name}: the base URL must start with http:// or https://")
        self.timeouts = Timeouts.of(timeout)
        self.retry = retry or RetryPolicy()
        self.__api_key = _Secret(api_key) if api_key else None
        # A key or a base URL's password given in code is masked wherever it shows up
        # later (a job's last_error, a traceback, a log line), like one from the environment.
        remember(api_key)
        remember_urls(self.base_url)
        t = self.timeouts
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            headers={"user-agent": "herd-llm/0.1"},
        )

    def __repr__(self) -> str:
        key = "set" if self.__api_key else "none"
        where = mask(self.base_url)
        return f"{type(self).__name__}(model={self.model!r}, base_url={where!r}, key={key})"

    @property
    def _api_key(self) -> str | None:
        return self.__api_key.reveal() if self.__api_key else None

    @property
    def key_id(self) -> str:
        """The API key's id (a hash prefix, never the key): the account a fleet-wide
        provider limit counts against."""
        return limits_key_id(self._api_key)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    # What a subclass supplies -------------------------------------------------------

    @abstractmethod
    def _request(
        self,
        system: str,
        user: str,
        schema: Mapping[str, Any] | None,
        params: Mapping[str, Any],
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        """The URL path (after the base URL), headers and JSON body of the call."""

    def _rate_limits(self, headers: Mapping[str, str]) -> RateLimitInfo | None:
        """The answer's rate-limit headers, read; None when the provider sends none."""
        return None

    @abstractmethod
    def _parse(self, data: Any) -> tuple[str, Usage, str | None, str | None, str | None]:
        """Text, usage, model, finish reason and id of a 2xx answer; ``KeyError`` etc. if bad."""

    # The call -----------------------------------------------------------------------

    async def complete(
        self,
        system: str,
        user: str,
        *,
        schema: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Completion:
        """Ask the model; retry what is worth retrying; raise a ``ProviderError`` otherwise.

        ``schema`` is a JSON Schema the answer should follow (structured output where
        the provider has it); ``params`` are merged into the request body as they are
        (``temperature``, ``max_tokens``, ``seed``…) and win over the defaults.
        """
        path, headers, body = self._request(system, user, schema, params or {})
        url = self.base_url + path
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            sent = time.monotonic()
            retry_after: float | None = None
            try:
                response = await self._client.post(url, json=body, headers=headers)
            except httpx.TimeoutException as exc:
                phase = _timeout_phase(exc)
                limit = getattr(self.timeouts, phase)
                error: ProviderError = ProviderTimeout(
                    f"{self._who()}: no answer within the {phase} timeout of {limit:g} s"
                    f"{_tries(attempt)}",
                    provider=self.name,
                    model=self.model,
                    attempts=attempt,
                )
                retriable = phase in ("connect", "pool") or self.retry.retry_timeouts
                cause: BaseException = exc
            except httpx.TransportError as exc:
                error = ProviderUnavailable(
                    f"{self._who()}: {type(exc).__name__} talking to {mask(self.base_url)}"
                    f"{_tries(attempt)}: {redact(str(exc), self._api_key) or 'no detail'}",
                    provider=self.name,
                    model=self.model,
                    attempts=attempt,
                )
                # A connection refused or dropped may be retried; a URL we cannot speak not.
                retriable = not isinstance(exc, httpx.UnsupportedProtocol | httpx.ProxyError)
                cause = exc
            else:
                latency = time.monotonic() - sent
                if 200 <= response.status_code < 300:
                    return self._completion(response, latency, started, attempt)
                retry_after = parse_retry_after(response.headers)
                error = self._status_error(response, attempt, retry_after)
                if isinstance(error, RateLimited):
                    retry_after = error.retry_after
                retriable = response.status_code in RETRY_STATUSES and (
                    response.status_code != 429 or self.retry.retry_rate_limited
                )
                cause = error
            too_long = retry_after is not None and retry_after > self.retry.max_retry_after
            if not retriable or attempt >= self.retry.max_tries or too_long:
                if cause is error:
                    raise error
                raise error from cause
            wait = self.retry.delay(attempt, retry_after)
            log.warning(
                "%s: %s; try %d of %d in %.2f s",
                self._who(),
                _short(error),
                attempt + 1,
                self.retry.max_tries,
                wait,
            )
            await asyncio.sleep(wait)

    def _who(self) -> str:
        return f"{self.name} {self.model}"

    def _completion(
        self, response: httpx.Response, latency: float, started: float, attempt: int
    ) -> Completion:
        try:
            data = response.json()
            text, usage, model, finish, rid = self._parse(data)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ProviderResponseInvalid(
                f"{self._who()}: HTTP {response.status_code} answer is not a {self.name} "
                f"response ({type(exc).__name__}): {excerpt(response.text, self._api_key)}",
                provider=self.name,
                model=self.model,
                status=response.status_code,
                body=excerpt(response.text, self._api_key),
                attempts=attempt,
            ) from None
        return Completion(
            text=text,
            usage=usage,
            model=model or self.model,
            provider=self.name,
            raw_status=response.status_code,
            latency=latency,
            elapsed=time.monotonic() - started,
            attempts=attempt,
            finish_reason=finish,
            response_id=rid,
            rate_limits=self._safe_rate_limits(response.headers),
        )

    def _safe_rate_limits(self, headers: Mapping[str, str]) -> RateLimitInfo | None:
        try:
            return self._rate_limits(headers)
        except Exception:  # an odd header must never fail a call that was paid for
            log.debug("%s: unreadable rate-limit headers", self._who(), exc_info=True)
            return None

    def _status_error(
        self, response: httpx.Response, attempt: int, retry_after: float | None
    ) -> ProviderError:
        status = response.status_code
        body = excerpt(response.text, self._api_key)
        head = f"{self._who()}: HTTP {status} {response.reason_phrase}{_tries(attempt)}"
        kw: dict[str, Any] = {
            "provider": self.name,
            "model": self.model,
            "status": status,
            "body": body,
            "attempts": attempt,
        }
        if status == 429:
            info = self._safe_rate_limits(response.headers)
            scope = info.refused_by() if info is not None else None
            if retry_after is None and info is not None:
                retry_after = _bounded(info.reset_of(scope))
            after = f" (retry after {retry_after:g} s)" if retry_after is not None else ""
            on = f" on {scope}" if scope else ""
            return RateLimited(
                f"{head}{on}{after}: {body}", retry_after=retry_after, scope=scope, **kw
            )
        if status in (401, 403):
            return ProviderAuthError(f"{head}: {body}", **kw)
        return ProviderError(f"{head}: {body}", **kw)


class _Secret:
    """A string that does not show itself in reprs, ``vars()`` dumps or debuggers."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def __repr__(self) -> str:
        return "<secret>"

    def reveal(self) -> str:
        return self._value


def _timeout_phase(exc: httpx.TimeoutException) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect"
    if isinstance(exc, httpx.WriteTimeout):
        return "write"
    if isinstance(exc, httpx.PoolTimeout):
        return "pool"
    return "read"


def _tries(attempt: int) -> str:
    return "" if attempt == 1 else f" after {attempt} tries"


def _short(error: ProviderError) -> str:
    if error.status is not None:
        return f"HTTP {error.status}"
    return type(error).__name__


def int_or_zero(value: Any) -> int:
    """A token count from a usage field that may be missing or null."""
    return int(value) if isinstance(value, int | float) else 0
