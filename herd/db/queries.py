"""Named SQL statements kept in a package's ``queries.sql``: one block per statement,
each under a ``-- name: NAME`` header, so a concept's SQL reads in one file."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.M)


@cache
def named(package: str, filename: str = "queries.sql") -> dict[str, str]:
    """The blocks of ``package``'s ``filename`` by their ``-- name:`` header."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _NAME.split(text)
    return {
        name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }
