"""One function that hides credentials in whatever herd prints, logs, stores or serves.

:func:`mask` takes a bare URL or any text that may hold one (an error message, a
traceback, a log line) and hides:

* the password of a URL's userinfo, in any scheme, multi-host URLs included
  (``postgresql://u:****@h1,h2/db``); the password runs to the last ``@`` of the
  URL, so an unencoded ``/``, ``@`` or ``:`` in it is hidden too;
* the value of a secret-named query parameter or libpq keyword (``?password=``,
  ``sslpassword=``, ``api_key=``, ``token=``, ``host=h password='x y'``) and of a
  secret-named key in a repr or JSON (``'api_token': '…'``);
* the configured secrets themselves wherever they appear verbatim: secret-named
  environment variables (``HERD_API_TOKEN``, ``OPENAI_API_KEY``, ``PGPASSWORD``…),
  the passwords inside ``*_URL`` variables, and what :func:`remember` and
  :func:`remember_urls` were given (settings and providers built in code).

It hides too much rather than too little: text that merely looks like a credential
is masked as well.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

MASK = "****"
# A shorter "secret" (a test value, a placeholder) would mask common words everywhere.
MIN_VERBATIM = 4

# Bounded, and a scheme or a key starts a word: masking stays linear in the length of
# the text, which may be a traceback of megabytes.
_USERINFO = re.compile(
    r"(?P<head>(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,31}://[^\s:@/]{0,256}):(?P<pw>\S{0,1024})@",
    re.I,
)
_CREDENTIAL_NAME = (
    r"[\w.-]{0,64}?(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key)"
)
# key=value: a URL query, a libpq keyword string, an environment dump, a dataclass repr.
_PARAM = re.compile(
    rf"(?P<head>(?<![\w.-])(?P<key>{_CREDENTIAL_NAME})\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|\S+)",
    re.I,
)
# 'key': 'value' in a dict's repr or in JSON.
_QUOTED_KEY = re.compile(
    rf"(?P<head>(?P<q>['\"])(?P<key>{_CREDENTIAL_NAME})(?P=q)\s*:\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")",
    re.I,
)
_BEARER = re.compile(r"\b(?P<head>Bearer\s+)(?P<value>[\w.~+/=-]{8,})")
# A numbered one too: a pool's second key (OPENAI_API_KEY_2, herd.limits.config).
_SECRET_ENV = re.compile(
    r"(?:^|_)(?:API_?KEY|TOKEN|PASSWORD|PASSWD|SECRET|ACCESS_KEY)(?:_?\d{1,3})?$", re.I
)
# What ends an unquoted value besides whitespace: the next query parameter, a fragment,
# or the quote and brackets of the repr around it.
_QUERY_END = re.compile(r"[&#]")
_PIECES = re.compile(r"[\s/@:]+")
_TRAILING = "'\")]},;"

_remembered: set[str] = set()
_lock = threading.Lock()


def mask(text: str) -> str:
    """``text`` with every credential it holds replaced by ``****``."""
    if not text:
        return text
    text = _USERINFO.sub(_userinfo, text)
    text = _QUOTED_KEY.sub(_quoted, text)
    text = _PARAM.sub(_param, text)
    text = _BEARER.sub(lambda m: m["head"] + MASK, text)
    for secret in _verbatim():
        text = text.replace(secret, MASK)
    return text


def remember(*secrets: str | None) -> None:
    """Mask these secrets (an API token, a provider key) verbatim from now on."""
    _add({s for s in secrets if s})


def remember_urls(*urls: str | None) -> None:
    """Mask the passwords of these URLs or libpq strings verbatim from now on: an error
    about a URL it could not parse may repeat a piece of it without the URL's shape."""
    _add({s for u in urls if u for s in _passwords_in(u)})


def _add(found: set[str]) -> None:
    found = {s for s in found if len(s) >= MIN_VERBATIM}
    if found - _remembered:
        with _lock:
            _remembered.update(found)


def _userinfo(m: re.Match[str]) -> str:
    return f"{m['head']}:{MASK}@" if m["pw"] else m[0]


def _quoted(m: re.Match[str]) -> str:
    quote = m["value"][0]
    return f"{m['head']}{quote}{MASK}{quote}"


def _param(m: re.Match[str]) -> str:
    value, rest = _value(m)
    if value[:1] in "'\"":
        return f"{m['head']}{value[0]}{MASK}{value[0]}{rest}"
    if value.startswith(MASK):  # already hidden, e.g. by the userinfo rule
        return m[0]
    return f"{m['head']}{MASK}{rest}"


def _value(m: re.Match[str]) -> tuple[str, str]:
    """The secret value of a key=value match, and what follows it in the match."""
    value = m["value"]
    if value[0] in "'\"":
        return value, ""
    before = m.string[m.start() - 1] if m.start() else ""
    if before in "?&;":  # a query parameter ends at the next one
        end = _QUERY_END.search(value)
        if end:
            return value[: end.start()], value[end.start() :]
    kept = value.rstrip(_TRAILING) or value
    return kept, value[len(kept) :]


def _passwords_in(url: str) -> set[str]:
    found = {m["pw"] for m in _USERINFO.finditer(url)}
    for m in _PARAM.finditer(url):
        value, _ = _value(m)
        if value[:1] in "'\"":
            value = value[1:-1] if len(value) > 1 and value[-1] == value[0] else value[1:]
        found.add(value)
    found |= {unquote(s) for s in found}
    # libpq splits an unencoded password at its first '/' or '@' (and a keyword string at
    # a space) and then quotes the piece it could not use: "failed to resolve host 'w0rd@h'".
    return found | {piece for s in found for piece in _PIECES.split(s)}


def _verbatim() -> list[str]:
    """The configured secrets, longest first (a secret containing another goes first)."""
    found = set(_remembered)
    for name, value in os.environ.items():
        if not value:
            continue
        if _SECRET_ENV.search(name):
            found |= _passwords_in(value) if "://" in value else {value}
        elif name.upper().endswith(("_URL", "_DSN")):
            found |= _passwords_in(value)
    return sorted((s for s in found if len(s) >= MIN_VERBATIM), key=len, reverse=True)


class MaskingFilter(logging.Filter):
    """Masks a record's message, arguments and traceback before any handler formats it.

    Installed on handlers (a logger's filter does not see its children's records).
    The arguments stay arguments: uvicorn's access formatter reads them one by one.
    """

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = mask(record.msg)
        else:
            record.msg = mask(str(record.msg))
        if isinstance(record.args, Mapping):
            record.args = {k: _masked_arg(v) for k, v in record.args.items()}
        elif record.args:
            record.args = tuple(_masked_arg(a) for a in record.args)
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask(record.exc_text)
        if record.stack_info:
            record.stack_info = mask(record.stack_info)
        return True


def _masked_arg(value: Any) -> Any:
    # Numbers keep their type for %d and %.2f; anything else may carry a URL in its str().
    if value is None or isinstance(value, bool | int | float):
        return value
    return mask(value if isinstance(value, str) else str(value))
