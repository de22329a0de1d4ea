"""Records already cut into units: one JSON object per line, ``{"id", "text", ...}``.

The record's own ``id`` is the chunk id, as given (it is someone else's key, so
it is not slugged or lowercased); every other field is metadata. A line that is
not such an object stops the run with a ``ChunkError`` naming the line: a corpus
with a bad record is a corpus to fix, not one to index partly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from herd.errors import NotJSONSerializable
from herd.jsonvalue import JSON, check
from herd.rag.chunkers.base import (
    LINE_KEYS,
    BaseChunker,
    Chunk,
    ChunkError,
    Emitter,
    Marker,
    normalize_text,
    raw_lines,
)


def _no_constant(name: str) -> JSON:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, JSON]]) -> dict[str, JSON]:
    record: dict[str, JSON] = {}
    for key, value in pairs:
        if key in record:
            raise ValueError(f"field {key!r} appears twice")
        record[key] = value
    return record


class JsonlChunker(BaseChunker):
    name = "jsonl"
    version = "1"

    def events(self, doc_id: str, lines: Iterable[str]) -> Iterator[Chunk | Marker]:
        emitter = Emitter(self, doc_id)
        for number, line in enumerate(raw_lines(lines), 1):
            if not line.strip():
                continue
            record = self._parse(doc_id, number, line)
            raw_id = record.pop("id", None)
            text = record.pop("text", None)
            if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or raw_id == "":
                raise ChunkError(
                    'the record needs an "id" (a non-empty string or an integer)',
                    doc=doc_id,
                    line=number,
                )
            if not isinstance(text, str):
                raise ChunkError('the record needs a "text" string', doc=doc_id, line=number)
            reserved = sorted(LINE_KEYS & record.keys())
            if reserved:
                raise ChunkError(
                    f"field {reserved[0]!r} is reserved for the line number",
                    doc=doc_id,
                    line=number,
                )
            record_id = str(raw_id)
            title = record.get("title")
            crumb = title if isinstance(title, str) and title.strip() else record_id
            yield emitter.make(record_id, normalize_text(text), crumb, record, number, number)

    @staticmethod
    def _parse(doc_id: str, number: int, line: str) -> dict[str, JSON]:
        try:
            value = json.loads(line, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise ChunkError(f"not a JSON record: {exc}", doc=doc_id, line=number) from None
        if not isinstance(value, dict):
            raise ChunkError(
                f"a record must be a JSON object, not {type(value).__name__}",
                doc=doc_id,
                line=number,
            )
        try:
            # An escape (\u0000, a lone \ud800) decodes to what no store can keep.
            check(value, what="the record")
        except NotJSONSerializable as exc:
            raise ChunkError(str(exc), doc=doc_id, line=number) from None
        return value
