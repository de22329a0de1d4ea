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
import os
import sys
import textwrap
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.segment import Segment
from rich.text import Text
from typer.core import TyperArgument, TyperGroup, TyperOption

from herd.app import App
from herd.config import Settings
from herd.errors import HerdError
from herd.masking import MaskingFilter, mask

T = TypeVar("T")

# A reader that closed stdout early (`herd eval results | head`) ends the command
# quietly with the status a shell gives a process killed by SIGPIPE, as git and the
# coreutils end: not 1, which says the work failed. The signal itself stays ignored
# (Python's default), so a closed socket to the store is an error, never a death.
READER_GONE = 141


def reader_gone() -> NoReturn:
    # What is still buffered for stdout goes nowhere, not into an exit-time traceback.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(READER_GONE)


class _Console(Console):
    def on_broken_pipe(self) -> None:  # rich's own exits 1
        self.quiet = True
        reader_gone()

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        text = super()._render_buffer(buffer)
        if self.is_terminal:
            return text
        # Rich pads a table's every line to the width: in a file or a pipe those are
        # trailing blanks a reader's diff, grep or editor trips over. A last line not
        # ended yet (print(..., end="")) keeps its blanks: more may follow on it.
        *ended, rest = text.split("\n")
        return "".join(line.rstrip(" ") + "\n" for line in ended) + rest


# No markup: everything printed is data (payloads, errors, verse texts with [brackets]).
out = _Console(markup=False, highlight=False)
err = _Console(stderr=True, markup=False, highlight=False)


@dataclasses.dataclass
class Options:
    settings: Settings
    flags: dict[str, Any]  # the options given on the command line: they beat the app's own
    debug: bool = False


class Group(TyperGroup):
    """herd's root command: plain help that fits 80 columns, usage errors in one line.

    Typer's rich help boxes squeeze the help text into a third of an 80-column
    terminal, show a type for every flag (``<bool>``) and read ``[...]`` in help
    strings as markup (eating it). Click's plain layout has none of that. Every
    command under this one, the feature modules' included, is set to it here, so a
    module adding a command needs nothing more than a metavar for each value.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain(self)

    def invoke(self, ctx: Any) -> Any:
        # Typer turns a broken pipe met here into exit 1, the work's failure.
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            reader_gone()

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        # Not standalone: click's own error display (usage, hint, boxed error) is
        # replaced by one line; this always exits, as standalone mode does.
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except typer.TyperException as exc:
            sys.exit(_usage_error(exc))
        except typer.Abort:
            err.print("herd: aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


class _Argument(TyperArgument):
    # An argument's help row is its metavar and help; typer would add its Python
    # type (``<list[Path]>``) beside it.
    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def _plain(command: Any) -> None:
    command.rich_markup_mode = None
    for param in command.params:
        if isinstance(param, TyperArgument):
            param.__class__ = _Argument
            if param.metavar is None:
                param.metavar = (param.name or "").upper()
        elif isinstance(param, TyperOption):
            if param.is_flag or param.count:
                param.show_default = False  # "[default: no-debug]" says nothing
            elif param.metavar is None:
                param.metavar = (param.name or "").upper().replace("_", "-")
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            _plain(sub)


def _usage_error(exc: typer.TyperException) -> int:
    """One line on stderr for what click would print as usage, hint and error."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # the help itself (typer tests it so)
        out.print(exc.format_message(), soft_wrap=True)  # on stdout, as before: `herd | less`
        return exc.exit_code
    ctx = getattr(exc, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    message = exc.format_message().rstrip(".")
    err.print(f"herd: error: {message}{hint}", soft_wrap=True)
    return exc.exit_code


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


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural but for one: "1 chunk", "2 chunks", "0 chunks"."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(jsonable(value), ensure_ascii=False) + "\n")


def when(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else ""


def listing(
    title: str,
    columns: Sequence[str],
    rows: Sequence[tuple[Sequence[str], str]],
    *,
    right: Sequence[str] = (),
) -> None:
    """Rows of short cells in aligned columns, each followed by its free text (an
    error, a result) on indented lines of its own, wrapped to the terminal.

    A table cell for free text gets what is left of 80 columns after the
    identifiers: a word a line. Its own lines give it the whole width.
    """
    width = max(out.width, 40)
    widths = [max([len(c), *(len(cells[i]) for cells, _ in rows)]) for i, c in enumerate(columns)]
    # Too wide: the widest text column gives a character at a time (numbers keep theirs).
    while sum(widths) + 2 * (len(widths) - 1) > width:
        i = max((i for i, c in enumerate(columns) if c not in right), key=lambda i: widths[i])
        if widths[i] <= 8:
            break
        widths[i] -= 1

    def line(cells: Sequence[str]) -> str:
        shown = []
        for i, cell in enumerate(cells):
            w = widths[i]
            cell = cell if len(cell) <= w else cell[: w - 1] + "…"
            shown.append(cell.rjust(w) if columns[i] in right else cell.ljust(w))
        return "  ".join(shown).rstrip()

    out.print(title, style="bold", soft_wrap=True)
    if not rows:
        return
    out.print(line(columns), style="bold", soft_wrap=True)
    for cells, text in rows:
        out.print(line(cells), soft_wrap=True)
        for para in text.splitlines() or ([text] if text else []):
            for part in textwrap.wrap(para, width - 4) or [""]:
                out.print("    " + part, soft_wrap=True)


def moment(value: datetime | None) -> str:
    """A time in a listing, where a column's characters are dear: no year, no seconds."""
    return value.astimezone().strftime("%m-%d %H:%M") if value else ""


def short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"
