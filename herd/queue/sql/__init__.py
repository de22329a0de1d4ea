"""SQL files of the PostgreSQL backend: migrations (NNNN_name.sql) and named queries."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.M)


@cache
def queries() -> dict[str, str]:
    """The blocks of queries.sql by their ``-- name:`` header."""
    text = resources.files(__name__).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    return {
        name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def migrations(package: str = __name__) -> list[tuple[int, str, str]]:
    """(version, name, sql) for every migration file of ``package``, in order."""
    out = []
    for entry in resources.files(package).iterdir():
        m = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if m:
            out.append((int(m[1]), m[2], entry.read_text(encoding="utf-8")))
    return sorted(out)
