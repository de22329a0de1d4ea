"""--embedder: a folder ONNX model, a Hugging Face id (from a local cache), remote:
URLs; a collection remembers its embedder. Real PostgreSQL, real ONNX models (a
folder built from the default model's files; no network)."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest

from herd.errors import InvalidInput
from herd.rag.corpora import kjv_lines
from herd.rag.embedders import folder as folders
from herd.rag.embedders import spec as specs
from herd.rag.embedders.base import ModelUnavailable, embed_queries
from herd.rag.embedders.onnx import minilm_files
from herd.rag.errors import IndexError_
from herd.rag.ingest import IngestError, RagRuntime, plan_and_apply
from herd.rag.query import answer
from tests.rag.support import drain

GENESIS_1 = [line for line in kjv_lines(1) if line.split()[1].startswith("1:")]


def model_folder(root: Path, config: dict | None = None) -> Path:
    """A folder as an ONNX export ships: model.onnx, tokenizer.json, a config."""
    model, tokenizer = minilm_files()
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(model, root / "model.onnx")
    shutil.copy(tokenizer, root / "tokenizer.json")
    if config is not None:
        (root / folders.CONFIG_FILE).write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def e5_like(tmp_path_factory) -> Path:
    return model_folder(
        tmp_path_factory.mktemp("models") / "mini-e5",
        {"query_prefix": "query: ", "passage_prefix": "passage: ", "max_length": 128},
    )


def test_a_folder_model_with_e5_prefixes(e5_like):
    embedder = specs.build(specs.canonical(str(e5_like)))
    assert embedder.id.startswith("onnx:mini-e5;") and "query_prefix=query: " in embedder.id
    assert "prefix=passage: " in embedder.id and "max_length=128" in embedder.id
    text = ["In the beginning God created the heaven and the earth."]
    passage, query = embedder.embed(text), embed_queries(embedder, text)
    assert passage.shape == query.shape == (1, embedder.dim)
    assert not np.allclose(passage, query)  # the prefixes differ, so do the vectors
    assert np.isclose(np.linalg.norm(query), 1.0, atol=1e-5)


def test_a_sentence_transformers_export_is_read(tmp_path):
    folder = model_folder(tmp_path / "st")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (folder / "modules.json").write_text(
        json.dumps([{"type": "sentence_transformers.models.Transformer"}])
    )
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "q: ", "document": "d: "}})
    )
    embedder = folders.folder_embedder(folder)
    assert "pooling=cls" in embedder.id and "normalize=none" in embedder.id
    assert "prefix=d: " in embedder.id and "query_prefix=q: " in embedder.id
    assert not np.isclose(np.linalg.norm(embedder.embed(["light"])), 1.0)  # not normalized


def test_bad_specs_and_folders_are_refused_by_name(tmp_path):
    with pytest.raises(InvalidInput, match="--embedder: 'nowhere' is not a folder"):
        specs.canonical("nowhere")
    with pytest.raises(InvalidInput, match=r"needs the model: add \?model=NAME"):
        specs.canonical("remote:http://localhost:8080/v1")
    with pytest.raises(InvalidInput, match="not an http"):
        specs.canonical("remote:ftp://x/v1?model=m")
    with pytest.raises(ModelUnavailable, match="needs model.onnx"):
        specs.build(specs.canonical(str(tmp_path)))
    bad = model_folder(tmp_path / "bad", {"pooling": "max"})
    with pytest.raises(InvalidInput, match="pooling must be one of mean, cls, not 'max'"):
        folders.folder_embedder(bad)
    assert specs._remote_parts("http://h:1/v1/embeddings?model=bge&x=1", "f") == (
        "http://h:1/v1?x=1",
        "bge",
    )


def test_a_hugging_face_id_from_the_local_cache(tmp_path, monkeypatch, e5_like):
    """The hf: path as it runs without network: the snapshot comes from the cache."""
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--herd-test--mini-e5"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(e5_like, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    embedder = specs.build(specs.canonical("hf:herd-test/mini-e5"))
    assert "query_prefix=query: " in embedder.id
    with pytest.raises(ModelUnavailable, match="hf:herd-test/absent.*does not hold it"):
        specs.build("hf:herd-test/absent")


async def test_a_collection_remembers_its_embedder(app, tmp_path, e5_like, monkeypatch):
    name = f"c{uuid.uuid4().hex[:10]}"
    kjv = tmp_path / "kjv.txt"
    kjv.write_text("\n".join(GENESIS_1) + "\n")
    await plan_and_apply(app, [kjv], name, embedder=str(e5_like))
    await drain(app)
    rt = await RagRuntime.of(app)
    live = await rt.store.live(name)
    assert live.settings["embedder_spec"] == f"onnx:{e5_like.resolve()}"
    assert live.settings["embedder"] != rt.embedder.id  # not the default model's id
    # A re-run without --embedder keeps the collection's: nothing to embed again.
    again = await plan_and_apply(app, [kjv], name)
    assert (again.new_generation, again.generation, again.to_embed) == (False, live.id, 0)
    await drain(app)

    # A query needs no --embedder: the collection's own answers it (query prefix too).
    folder = await rt.embedder_for(live.settings["embedder_spec"])
    (a,) = await answer(app, name, ["Let there be light"], 3, cache=False, mode="dense")
    assert a.hits[0]["id"] == "kjv/genesis/1/3"
    expected = await rt.store.search(live, embed_queries(folder, ["Let there be light"])[0], 3)
    assert [h["score"] for h in a.hits] == [round(h.score, 4) for h in expected]
    # Another one is refused with a message naming both, from the argument or the env.
    with pytest.raises(IndexError_, match=r"indexed with embedder onnx:.*mini-e5, not default"):
        await answer(app, name, ["light"], 3, embedder="default")
    monkeypatch.setenv(specs.ENV, "default")
    with pytest.raises(IndexError_, match="--new-generation"):
        await answer(app, name, ["light"], 3)
    # An ingest with another one too, unless it asks for a new generation.
    with pytest.raises(IngestError, match="add --new-generation"):
        await plan_and_apply(app, [kjv], name)
    rebuilt = await plan_and_apply(app, [kjv], name, new_generation=True)
    assert rebuilt.new_generation and rebuilt.generation != live.id
    await drain(app)
    monkeypatch.delenv(specs.ENV)
    now = await rt.store.live(name)
    assert now.id == rebuilt.generation and now.settings["embedder_spec"] == "default"
    assert (await answer(app, name, ["Let there be light"], 1, cache=False))[0].hits[0]["id"] == (
        "kjv/genesis/1/3"
    )


def test_the_cli_flags(pg_url, herd_home, tmp_path, e5_like):
    from tests.test_cli import herd

    name = f"c{uuid.uuid4().hex[:10]}"
    kjv = tmp_path / "kjv.txt"
    kjv.write_text("\n".join(GENESIS_1[:10]) + "\n")
    env = {"HERD_HOME": str(herd_home)}
    r = herd("ingest", str(kjv), "--collection", name, "--embedder", str(e5_like),
             "--language", "simple", url=pg_url, **env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = herd("query", "firmament", "--collection", name, "--mode", "lexical", "--json",
             url=pg_url, **env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    hits = json.loads(r.stdout)["hits"]
    assert hits and all("firmament" in h["text"] for h in hits)
    r = herd("query", "light", "--collection", name, "--embedder", "default", url=pg_url, **env)
    assert r.returncode == 1 and "indexed with embedder onnx:" in r.stderr
