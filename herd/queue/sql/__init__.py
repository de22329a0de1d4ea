"""SQL files of the PostgreSQL broker: its migrations (NNNN_name.sql, applied by
herd.db.postgres.migrate) and named queries."""

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
