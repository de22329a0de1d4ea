"""Scripture: hashes that follow the verse, streaming in bounded memory, layout corner cases."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import psutil

from herd.rag.chunkers import VerseChunker

GOLDEN = Path(__file__).parent / "golden"


def chunks(text: str) -> list[tuple[str, str]]:
    return [(c.id, c.text) for c in VerseChunker().chunk("kjv", [text])]


def golden_lines() -> list[str]:
    return (GOLDEN / "kjv-references.txt").read_text(encoding="utf-8").splitlines(keepends=True)


def test_a_changed_verse_changes_exactly_its_own_hash() -> None:
    lines = golden_lines()
    before = {c.id: c.hash for c in VerseChunker().chunk("kjv", lines)}
    edited = [line.replace("face of the deep", "face of the depths") for line in lines]
    after = {c.id: c.hash for c in VerseChunker().chunk("kjv", edited)}
    assert before.keys() == after.keys()
    assert [i for i in before if before[i] != after[i]] == ["kjv/genesis/1/2"]


def test_rechunking_unchanged_input_gives_identical_ids_and_hashes() -> None:
    first = [(c.id, c.hash, c.metadata) for c in VerseChunker().chunk("kjv", golden_lines())]
    second = [(c.id, c.hash, c.metadata) for c in VerseChunker().chunk("kjv", golden_lines())]
    assert first == second


def test_moving_verses_to_other_lines_keeps_their_hashes() -> None:
    lines = golden_lines()
    before = {c.id: c for c in VerseChunker().chunk("kjv", lines)}
    moved = {c.id: c for c in VerseChunker().chunk("kjv", ["\n", "\n", "\n", *lines])}
    assert before.keys() == moved.keys()
    for chunk_id, chunk in before.items():
        assert moved[chunk_id].hash == chunk.hash
        assert moved[chunk_id].metadata["start_line"] == chunk.metadata["start_line"] + 3


def test_a_repeated_reference_keeps_every_text() -> None:
    text = "Genesis 1:1 first\nGenesis 1:1 second\nGenesis 1:1 third\n"
    assert chunks(text) == [
        ("kjv/genesis/1/1", "first"),
        ("kjv/genesis/1/1~2", "second"),
        ("kjv/genesis/1/1~3", "third"),
    ]


def test_out_of_order_verses_keep_their_canonical_ids() -> None:
    text = "Genesis 1:1 a\nGenesis 2:1 b\nExodus 1:1 c\nGenesis 1:2 d\n"
    ids = [i for i, _ in chunks(text)]
    assert ids == ["kjv/genesis/1/1", "kjv/genesis/2/1", "kjv/exodus/1/1", "kjv/genesis/1/2"]


def test_line_endings_and_unicode_forms_do_not_matter() -> None:
    unix = "Genesis 1:1 Cafe\u0301 here  \nand there\n"
    windows = "\ufeffGenesis 1:1 Caf\u00e9 here\r\nand there\r\n"
    assert chunks(unix) == chunks(windows) == [("kjv/genesis/1/1", "Caf\u00e9 here\nand there")]


def test_a_wrapped_line_that_starts_with_a_number_stays_in_its_verse() -> None:
    text = (
        "Chapter 5\n25 And Methuselah lived an hundred eighty and\n187 years, and begat Lamech.\n"
    )
    text += "26 And Methuselah lived after he begat Lamech.\n"
    assert chunks(text) == [
        ("kjv/5/25", "And Methuselah lived an hundred eighty and\n187 years, and begat Lamech."),
        ("kjv/5/26", "And Methuselah lived after he begat Lamech."),
    ]


def test_a_psalm_header_without_a_book_title_is_in_psalms() -> None:
    got = [(c.id, c.breadcrumb) for c in VerseChunker().chunk("kjv", ["Psalm 117\n", "1 O praise"])]
    assert got == [("kjv/psalms/117/1", "Psalms 117:1")]


def test_text_after_a_blank_line_is_a_paragraph_of_the_chapter_not_the_verse() -> None:
    text = "Genesis 1:5 And the evening and the morning were the first day.\n\nThe Firmament\n"
    text += "Genesis 1:6 And God said, Let there be a firmament.\n"
    got = list(VerseChunker().chunk("kjv", [text]))
    assert [(c.id, c.text) for c in got] == [
        ("kjv/genesis/1/5", "And the evening and the morning were the first day."),
        ("kjv/genesis/1/p1", "The Firmament"),
        ("kjv/genesis/1/6", "And God said, Let there be a firmament."),
    ]
    assert got[1].metadata["after_verse"] == 5


def verse_file(megabytes: int) -> Iterator[str]:
    """A generated corpus: 50 verses a chapter, each wrapped over ten lines of ~100 bytes."""
    wrapped = "and the Spirit of God moved upon the face of the waters, and God saw the light"
    size, chapter = 0, 1
    while size < megabytes * 1_000_000:
        for verse in range(1, 51):
            head = f"Genesis {chapter}:{verse} In the beginning of chapter {chapter}\n"
            size += len(head)
            yield head
            for line in range(9):
                text = f"{wrapped} {line}\n"  # a new string each time, as a file gives
                size += len(text)
                yield text
        chapter += 1


def test_a_50_mb_corpus_streams_in_bounded_memory() -> None:
    process = psutil.Process()
    baseline = process.memory_info().rss
    growth = count = 0
    started = time.monotonic()
    for count, chunk in enumerate(VerseChunker().chunk("kjv", verse_file(50)), 1):
        if count % 5000 == 0:
            growth = max(growth, process.memory_info().rss - baseline)
            assert chunk.text.count("\n") == 9
    elapsed = time.monotonic() - started
    assert count > 40_000
    # The input is 50 MB: holding it, or its lines, or one id per verse would show here.
    print(f"RSS grew {growth / 1e6:.1f} MB in {elapsed:.1f}s for {count} verses")
    assert growth < 25_000_000, f"RSS grew {growth / 1e6:.1f} MB over {elapsed:.1f}s"


def test_python_allocations_do_not_grow_with_the_input() -> None:
    tracemalloc.start()
    try:
        for _ in VerseChunker().chunk("kjv", verse_file(3)):
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"peak {peak / 1e6:.2f} MB for a 3 MB input"
