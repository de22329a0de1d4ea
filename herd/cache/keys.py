"""Canonical cache keys: equal requests give equal keys, any real change another key."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Any

from herd.jsonvalue import canonical

KEY_VERSION = 1  # bump when the key's recipe changes, so old entries stop matching


def normalize_document(text: str) -> str:
    """NFC, ``\\n`` line endings, no trailing spaces, single blank lines, no blank ends.

    Whitespace-only revisions of a document (CRLF, trailing blanks) hit the cache;
    anything a reader could see changes the key.
    """
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    # Runs of blank lines count as one: a paragraph break is all a reader sees.
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")


def canonical_key(
    *,
    model: str,
    system: str,
    schema: Any,
    params: dict[str, Any],
    document: str,
    version: int = KEY_VERSION,
    endpoint: str | None = None,
) -> str:
    """sha256 over canonical JSON of everything that determines a model's answer.

    ``endpoint``: the server asked, when it is not the provider's default one; None
    leaves it out, so keys made before it existed still match (herd.llm.eval.spec)."""
    payload = {
        "v": version,
        "model": model,
        "system": unicodedata.normalize("NFC", system),
        "schema": schema,
        "params": params,
        "document": normalize_document(document),
    }
    if endpoint is not None:
        payload["endpoint"] = endpoint
    return hashlib.sha256(canonical(payload).encode()).hexdigest()
