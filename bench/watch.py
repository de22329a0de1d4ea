"""`herd ingest --watch` on the KJV split one file per book: from a save to the answer.

    python bench/watch.py [--home /tmp/herd-watch] [--idle 60] [--quick] [--summary PATH]

Writes the 66 books as files, starts ``herd ingest DIR --collection C --watch`` (a
child process), waits for its first sync, measures its CPU while idle (``--idle``
seconds, from /proc), then edits 10 verses in 3 books and asks, every 0.2 s, until
each new text is the first answer to itself: the time from the save to the first
and to the last of them answering, and the chunks the sync embedded (its line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _summary

from herd import App
from herd.rag.corpora import kjv_lines
from herd.rag.query import answer

EDITS = {"genesis": [1, 2, 3, 4], "psalms": [1, 2, 3], "john": [1, 2, 3]}


def split(folder: Path, only: set[str] | None = None) -> dict[str, tuple[Path, str]]:
    """One file per book (``only``: these books, lowercased); by lowercased title:
    (path, title)."""
    folder.mkdir(parents=True, exist_ok=True)
    books: dict[str, list[str]] = {}
    for line in kjv_lines():
        books.setdefault(line[: line.index(":")].rsplit(" ", 1)[0], []).append(line)
    out = {}
    for n, (book, lines) in enumerate(books.items(), 1):
        if only is not None and book.lower() not in only:
            continue
        path = folder / f"{n:02d}-{book.lower().replace(' ', '-')}.txt"
        path.write_text("\n".join(lines) + "\n")
        out[book.lower()] = (path, book)
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def edit(path: Path, title: str, verses: list[int], tag: str) -> list[str]:
    """Replace chapter 1's given verses with a sentence of their own; the new texts."""
    lines = path.read_text().splitlines()
    new = []
    for v in verses:
        prefix = f"{title} 1:{v} "
        i = next(n for n, line in enumerate(lines) if line.startswith(prefix))
        text = f"The lighthouse keeper {tag} counted {v} ships in the harbour of {title}."
        lines[i] = prefix + text
        new.append(text)
    path.write_text("\n".join(lines) + "\n")
    return new


async def wait_answers(app: App, collection: str, texts: list[str]) -> list[float]:
    start, found, times = time.monotonic(), set(), []
    while len(found) < len(texts):
        pending = [t for t in texts if t not in found]
        for a in await answer(app, collection, pending, 1, cache=False):
            if a.hits and a.hits[0]["text"] == a.query:
                found.add(a.query)
                times.append(time.monotonic() - start)
        if time.monotonic() - start > 300:
            raise SystemExit(f"only {len(found)} of {len(texts)} answered after 300 s")
        await asyncio.sleep(0.2)  # a poll of the index, as a user would re-ask
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path, help="HERD_HOME (default: a new folder)")
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--collection", default=f"kjvwatch{int(time.time())}")
    parser.add_argument("--quick", action="store_true", help="the 3 edited books, 15 s idle")
    parser.add_argument("--summary", type=Path, help="write the figures here (bench/_summary.py)")
    args = parser.parse_args()
    if args.quick:
        args.idle = 15.0
    args.home = args.home or Path(tempfile.mkdtemp(prefix="herd-bench-watch-"))
    folder = args.home / "kjv-books"
    books = split(folder, set(EDITS) if args.quick else None)
    os.environ["HERD_HOME"] = str(args.home)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "herd", "ingest", str(folder), "--collection", args.collection,
         "--watch", "--json"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert watcher.stdout is not None
    started = time.monotonic()
    first = json.loads(watcher.stdout.readline())
    print(f"first sync: {first['added']} chunks in {time.monotonic() - started:.0f} s", flush=True)
    try:
        idle, times = asyncio.run(measure(args, books, watcher.pid))
        line = json.loads(watcher.stdout.readline())
        print(f"the sync: {line}", flush=True)
    finally:
        watcher.send_signal(signal.SIGTERM)
        watcher.wait(60)
    edited = sum(len(v) for v in EDITS.values())
    _summary.write(
        args.summary, "watch", "the goals",
        [_summary.row("save to the last edit answering (goal)", times[-1], 10.0, "s", "lower"),
         _summary.row("idle watcher CPU (goal)", idle * 100, 1.0, "% of a core", "lower"),
         _summary.row("chunks embedded for the edits (goal: exactly the edited)",
                      line["embedded"], edited, "chunks",
                      "lower")],
        [f"{len(books)} books, {edited} verses edited in {len(EDITS)} files;"
         f" idle measured over {args.idle:g} s"],
        time.monotonic() - started,
    )  # fmt: skip
    return 0


async def measure(
    args: argparse.Namespace, books: dict[str, tuple[Path, str]], pid: int
) -> tuple[float, list[float]]:
    app = App()
    async with app:
        await answer(app, args.collection, ["warm the query embedder"], 1, cache=False)
        before = cpu_seconds(pid)
        await asyncio.sleep(args.idle)  # the idle period being measured
        idle = (cpu_seconds(pid) - before) / args.idle
        print(f"idle CPU: {idle * 100:.2f}% of a core over {args.idle:.0f} s", flush=True)
        tag = f"t{int(time.time())}"
        texts = []
        for book, verses in EDITS.items():
            texts += edit(*books[book], verses, tag)
        times = await wait_answers(app, args.collection, texts)
    print(
        f"{len(texts)} verses in {len(EDITS)} files: first answered {times[0]:.1f} s after"
        f" the save, all {len(texts)} after {times[-1]:.1f} s",
        flush=True,
    )
    return idle, times


if __name__ == "__main__":
    raise SystemExit(main())
