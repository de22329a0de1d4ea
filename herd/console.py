"""What every herd command shares: the consoles, the options in force, running
app work with errors turned into one line, and JSON output.

Feature commands (``herd.llm.cli``, ``herd.rag.cli``, ``herd.api.cli`` …) import
this module; ``herd.cli`` assembles them into one command line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from herd.app import App
from herd.config import Settings
from herd.errors import HerdError
from herd.masking import MaskingFilter, mask

T = TypeVar("T")

# No markup: everything printed is data (payloads, errors, verse texts with [brackets]).
out = Console(markup=False, highlight=False)
err = Console(stderr=True, markup=False, highlight=False)


@dataclasses.dataclass
class Options:
    settings: Settings
    flags: dict[str, Any]  # the options given on the command line: they beat the app's own
    debug: bool = False


def opts(ctx: typer.Context) -> Options:
    opts: Options = ctx.obj
    return opts


def run(
    opts: Options,
    work: Callable[[App], Awaitable[T]],
    app: App | None = None,
    *,
    open_wait: float = 0.0,
    open_store: bool = True,
) -> T:
    """Open an app (retrying an unreachable store for ``open_wait`` s), run ``work``,
    and turn herd errors into one line on stderr. ``open_store=False``: ``work`` gets
    the app unopened (`herd migrate`: opening would migrate, or refuse to)."""

    async def main() -> T:
        the_app = app or App(settings=opts.settings)
        if not open_store:
            return await work(the_app)
        await the_app.open(wait=open_wait)
        async with the_app:
            return await work(the_app)

    try:
        return asyncio.run(main())
    except HerdError as exc:
        if opts.debug:
            raise
        err.print(Text.assemble(("herd: error:", "red"), f" {mask(str(exc))}"), soft_wrap=True)
        raise typer.Exit(1) from None


def mask_logs() -> None:
    """Mask credentials in every record the root logger's and uvicorn's handlers write.

    Called once logging is configured (the CLI's root callback; `herd serve` again once
    uvicorn has installed its own handlers).
    """
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, MaskingFilter) for f in handler.filters):
                handler.addFilter(MaskingFilter())


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(jsonable(value), ensure_ascii=False) + "\n")


def when(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else ""


def short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"
