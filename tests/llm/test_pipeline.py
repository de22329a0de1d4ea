"""Evaluations in stages end to end: split, map, reduce, chain on the real queue and
store, the simulator as the provider, its call count as the bill."""

from __future__ import annotations

import json

import psycopg
import pytest

from herd import App, JobStatus, Worker
from herd.errors import InvalidInput
from herd.llm import eval as evaluate
from herd.llm.eval import results, stages, stageview
from herd.llm.eval.pipeline import from_json
from herd.llm.eval.pipesubmit import submit_pipeline, submit_pipeline_texts
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.stageview import stage_progress, stage_rows
from herd.llm.eval.status import BatchStatus, batch_status
from herd.llm.follow import summary
from tests.conftest import truncate
from tests.helpers import eventually
from tests.llm.conftest import clean_eval_tables

NOTE = {
    "type": "object",
    "properties": {"finding": {"type": "string"}, "severity": {"type": "integer"}},
    "required": ["finding", "severity"],
    "additionalProperties": False,
}
SUMMARY = {
    "type": "object",
    "properties": {"summary": {"type": "string"}},
    "required": ["summary"],
    "additionalProperties": False,
}
VERDICT = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def pipeline(reduce_prompt: str = "Summarise the findings.", *, chain: bool = False,
             on_dead: str = "fail") -> dict:  # fmt: skip
    stages_ = [
        {"name": "sections", "kind": "split", "by": "headings", "depth": 2},
        {"name": "notes", "kind": "map", "prompt": "Note the finding of this section.",
         "schema": NOTE, "on_dead": on_dead},
        {"name": "summary", "kind": "reduce", "prompt": reduce_prompt, "schema": SUMMARY},
    ]  # fmt: skip
    if chain:
        stages_.append({"name": "verdict", "kind": "chain", "prompt": "Judge it.",
                        "schema": VERDICT})  # fmt: skip
    return {"defaults": {"model": "sim-1"}, "stages": stages_}


def manual(title: str, sections: int) -> str:
    parts = [f"# {title}\n\nAn introduction to {title}."]
    for i in range(1, sections + 1):
        parts.append(f"## Register {i} of {title}\n\nBits {i} to {i + 7} hold the value {i}.")
    return "\n\n".join(parts) + "\n"


PIPE_TABLES = (
    "herd_eval_pieces, herd_eval_fanin, herd_eval_pipelines, herd_eval_piece_counts,"
    " herd_eval_stage_costs"
)


@pytest.fixture
async def app(pg_url, sim, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET")
    truncate(pg_url)
    clean_eval_tables(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {PIPE_TABLES}")
    the_app = App(database_url=pg_url)
    the_app.task(name=stages.STAGE_TASK, queue=evaluate.QUEUE, lease_seconds=5.0,
                 max_attempts=2)(stages.run_stage)  # fmt: skip
    async with the_app:
        yield the_app


async def drain(app: App) -> None:
    await Worker(app, queues=[evaluate.QUEUE], concurrency=4, poll_interval=0.05,
                 stop_when_idle=True, install_signal_handlers=False).run()  # fmt: skip


def docs(tmp_path, n: int = 2) -> object:
    folder = tmp_path / "docs"
    folder.mkdir()
    for d in range(n):
        (folder / f"m{d}.md").write_text(manual(f"Device {d}", 3 + d))
    return folder


async def test_three_stages_answer_every_document_and_show_each_stage(app, sim, tmp_path):
    folder = docs(tmp_path)
    pipe = from_json(pipeline(chain=True))
    report = await submit_pipeline(app, [folder], pipe, batch="p1")
    # m0: intro + 3 registers, m1: intro + 4: one map piece each.
    assert report.queued == 4 + 5
    await drain(app)
    # 9 maps, 2 reduces, 2 chains: each call once.
    assert sim.stats()["calls"] == 9 + 2 + 2
    rt = await EvalRuntime.of(app)
    items = await rt.store.execute(
        "SELECT path, status, result FROM herd_eval_items WHERE batch = 'p1' ORDER BY path"
    )
    assert [s for _, s, _ in items] == ["done", "done"]
    assert all(set(r["output"]) == {"ok"} and r["stage"] == "verdict" for _, _, r in items)
    progress = {s["stage"]: s for s in await stage_progress(rt, "p1")}
    seen = [(progress[n]["done"], progress[n]["pieces"], progress[n]["calls"])
            for n in ("notes", "summary", "verdict")]  # fmt: skip
    assert seen == [(9, 9, 9), (2, 2, 2), (2, 2, 2)]
    # Each reduce read every answer of its document, in document order.
    read = await rt.store.execute(
        "SELECT p.path, d.text FROM herd_eval_pieces p JOIN herd_eval_documents d"
        " ON d.hash = p.doc WHERE p.batch = 'p1' AND p.stage = 'summary' ORDER BY p.path"
    )
    assert [[r["piece"] for r in json.loads(t)] for _, t in read] == [[0, 1, 2, 3],
                                                                      [0, 1, 2, 3, 4]]  # fmt: skip
    status = await batch_status(app, "p1")
    assert status.documents == 2 and status.done == 2 and status.finished
    assert [s["stage"] for s in status.stages] == ["notes", "summary", "verdict"]
    # Results: the last stage's answer per document, with what all its stages' calls cost.
    rows = [r async for r in results.rows(app, "p1")]
    assert [(r["status"], r["source"], set(r["output"])) for r in rows] == [
        ("done", "pipeline", {"ok"})] * 2  # fmt: skip
    assert all(r["input_tokens"] > 0 and r["output_tokens"] > 0 for r in rows)
    pieces = [r async for r in stage_rows(app, "p1", "notes")]
    assert len(pieces) == 9
    first = [p for p in pieces if p["path"].endswith("m0.md")]
    assert [p["piece"] for p in first] == [0, 1, 2, 3]
    assert first[1]["loc"]["section"] == "Device 0 › Register 1 of Device 0"
    text = (folder / "m0.md").read_text()
    a, b = first[1]["loc"]["chars"]
    assert text[a:b].startswith("## Register 1 of Device 0")
    assert set(first[1]["output"]) == {"finding", "severity"}


async def test_each_later_stage_runs_ahead_of_the_earlier_ones_at_the_batchs_priority(
    app, sim, tmp_path
):
    """A stage's jobs run at the batch's priority plus the stage's rank: a document's
    reduce goes ahead of the map backlog of other documents, and the batch's own
    --priority reaches every stage (later stages were enqueued at 0)."""
    pipe = from_json(pipeline(chain=True))
    await submit_pipeline(app, [docs(tmp_path)], pipe, batch="ranked", priority=5)
    await drain(app)
    jobs = await app.broker.list_jobs(status=JobStatus.SUCCEEDED, limit=1000)
    by_stage: dict[str, set[int]] = {}
    for j in jobs:
        if j.task == stages.STAGE_TASK:
            by_stage.setdefault(j.payload["stage"], set()).add(j.priority)
    assert by_stage == {"notes": {5}, "summary": {6}, "verdict": {7}}


async def test_changing_only_the_reduce_prompt_pays_only_the_reduces(app, sim, tmp_path):
    folder = docs(tmp_path, 3)
    await submit_pipeline(app, [folder], from_json(pipeline()), batch="first")
    await drain(app)
    first = sim.stats()["calls"]
    assert first == (4 + 5 + 6) + 3
    await submit_pipeline(app, [folder], from_json(pipeline("Summarise it tersely.")),
                          batch="second")  # fmt: skip
    await drain(app)
    # One call per document (its reduce), no map call: the maps come from the cache.
    assert sim.stats()["calls"] - first == 3
    rt = await EvalRuntime.of(app)
    by_stage = {s["stage"]: s for s in await stage_progress(rt, "second")}
    assert by_stage["notes"]["calls"] == 0 and by_stage["notes"]["cached"] == 15
    assert by_stage["summary"]["calls"] == 3
    status = await batch_status(app, "second")
    assert status.done == 3


async def test_a_dead_piece_fails_its_document_or_leaves_a_marked_gap(app, sim):
    text = manual("Pump", 2)  # intro + 2 registers: 3 map calls, in order
    # The second piece's answer is invalid twice (the repair too): it dies. The second
    # run's first and third pieces come from the cache: no call of theirs in the script.
    for policy, batch, script in (("fail", "dead-fail", ["ok", "invalid", "invalid"]),
                                  ("skip", "dead-skip", ["invalid", "invalid"])):  # fmt: skip
        sim.configure(script=script)
        pipe = from_json(pipeline(f"Summarise ({policy}).", on_dead=policy))
        await submit_pipeline_texts(app, pipe, {"pump.md": text}, batch=batch)
        await Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                     stop_when_idle=True, install_signal_handlers=False).run()  # fmt: skip
        sim.configure(script=[])
    rt = await EvalRuntime.of(app)
    failed = await batch_status(app, "dead-fail")
    assert failed.dead == 1 and failed.done == 0 and failed.finished
    assert "stage 'notes': piece 1" in failed.failures[0]["error"]
    assert "section 'Pump › Register 1 of Pump'" in failed.failures[0]["error"]
    (row,) = [r async for r in results.rows(app, "dead-fail")]
    assert row["status"] == "dead" and "piece 1" in row["error"]
    skipped = await batch_status(app, "dead-skip")
    assert skipped.done == 1 and skipped.dead == 0
    # The reduce read the two answers and the gap, in document order.
    (doc,) = await rt.store.execute(
        "SELECT d.text FROM herd_eval_pieces p JOIN herd_eval_documents d ON d.hash = p.doc"
        " WHERE p.batch = 'dead-skip' AND p.stage = 'summary'"
    )
    read = json.loads(doc[0])
    assert [("answer" in r, "missing" in r) for r in read] == [(True, False), (False, True),
                                                               (True, False)]  # fmt: skip


def test_the_progress_line_shows_the_stages_under_way():
    stage = {"done": 40, "failed": 1, "cancelled": 0}
    status = BatchStatus(batch="b", documents=2, queued=2, stages=[
        {**stage, "stage": "notes", "pieces": 91},
        {**stage, "stage": "summary", "pieces": 0, "done": 0, "failed": 0}])  # fmt: skip
    assert summary(status) == "0/2 answered, notes 41/91, 2 queued"


def test_a_pipeline_is_checked_whole_before_anything_is_stored():
    with pytest.raises(InvalidInput, match="a reduce needs a map stage before it"):
        from_json({"defaults": {"model": "m"},
                   "stages": [{"name": "r", "kind": "reduce", "prompt": "x"}]})  # fmt: skip
    with pytest.raises(InvalidInput, match=r"stages\.1: Input tag 'mapp'"):
        from_json({"stages": [{"name": "s", "kind": "split"}, {"name": "m", "kind": "mapp"}]})
    with pytest.raises(InvalidInput, match="stage 'm': no model"):
        from_json({"stages": [{"name": "m", "kind": "map", "prompt": "x"}]})
    with pytest.raises(InvalidInput, match="put a reduce between the map and it"):
        from_json({"defaults": {"model": "m"},
                   "stages": [{"name": "m", "kind": "map", "prompt": "x"},
                              {"name": "c", "kind": "chain", "prompt": "y"}]})  # fmt: skip


async def test_a_piece_whose_job_dies_of_stalls_is_settled_by_its_policy(pg_url, app, sim):
    """A worker killed on every attempt never runs the piece's code to its end: the job
    is dead-lettered at a claim. The batch's status counts the piece then."""
    stalling = App(database_url=pg_url)
    stalling.task(name=stages.STAGE_TASK, queue=evaluate.QUEUE, lease_seconds=0.2,
                  max_stalls=1)(stages.run_stage)  # fmt: skip
    async with stalling:
        whole = pipeline()
        whole["stages"] = whole["stages"][1:]  # no split: the document is the one piece
        await submit_pipeline_texts(stalling, from_json(whole), {"pump.md": manual("Pump", 1)},
                                    batch="stall")  # fmt: skip
        (lease,) = await stalling.broker.claim([evaluate.QUEUE], "doomed", 1)

        async def dead() -> bool:  # claims after its leases expired dead-letter the job
            await stalling.broker.claim([evaluate.QUEUE], "doomed", 1)
            job = await stalling.broker.get_job(lease.job_id)
            return job is not None and job.status == "dead"

        await eventually(dead, timeout=20)
    status = await batch_status(app, "stall")
    assert status.dead == 1 and status.finished
    assert "stage 'notes': piece 0, chars 0-" in status.failures[0]["error"]
    assert "lease expired" in status.failures[0]["error"]


async def test_pieces_whose_jobs_died_long_ago_are_found_by_the_sweep(
    pg_url, app, sim, monkeypatch
):
    """The status read looks at the queue's newest dead jobs and sweeps the jobs of a
    page of waiting pieces a read, never all of them: deaths older than the newest dead
    letters are found a page at a time, each read going on from the last."""
    monkeypatch.setattr(stageview, "DEAD_LOOKED", 1)
    monkeypatch.setattr(stageview, "SWEEP", 1)
    stalling = App(database_url=pg_url)
    stalling.task(name=stages.STAGE_TASK, queue=evaluate.QUEUE, lease_seconds=0.2,
                  max_stalls=1)(stages.run_stage)  # fmt: skip
    async with stalling:
        whole = pipeline()
        whole["stages"] = whole["stages"][1:]  # no split: each document is one piece
        texts = {f"pump{i}.md": manual(f"Pump {i}", 1) for i in range(3)}
        await submit_pipeline_texts(stalling, from_json(whole), texts, batch="stalls")
        leases = await stalling.broker.claim([evaluate.QUEUE], "doomed", 3)
        assert len(leases) == 3

        async def dead() -> bool:  # claims after its leases expired dead-letter the jobs
            await stalling.broker.claim([evaluate.QUEUE], "doomed", 3)
            jobs = await stalling.broker.get_jobs([lease.job_id for lease in leases])
            return all(j.status == "dead" for j in jobs)

        await eventually(dead, timeout=20)
    seen = [(await batch_status(app, "stalls")).dead for _ in range(4)]
    # Read 1: the newest dead job and the first piece swept (one of them the same or
    # not); then one piece more a read, until all three are counted.
    assert seen[0] in (1, 2) and seen[-1] == 3 and seen == sorted(seen)
    assert (await batch_status(app, "stalls")).finished


async def test_a_status_read_fetches_a_page_of_the_waiting_pieces_jobs(app, tmp_path, monkeypatch):
    """No worker: every piece waits. A read fetches the jobs of SWEEP of them, not of
    every one (a batch of 18,200 waiting pieces took 575 ms a read)."""
    monkeypatch.setattr(stageview, "SWEEP", 4)
    await submit_pipeline(app, [docs(tmp_path, 3)], from_json(pipeline()), batch="waiting")
    fetched: list[int] = []
    get_jobs = app.broker.get_jobs

    async def spy(ids):  # type: ignore[no-untyped-def]
        fetched.extend(ids)
        return await get_jobs(ids)

    monkeypatch.setattr(app.broker, "get_jobs", spy)
    for _ in range(2):
        status = await batch_status(app, "waiting")
        assert status.queued == 3
    assert len(fetched) == 2 * 4 and len(set(fetched)) == 8  # the second page, not the first


async def test_a_pipeline_runs_while_a_piece_of_it_is_leased_and_is_queued_without_one(
    app, tmp_path
):
    """A pipeline's documents wait on their pieces' jobs, never one of their own: with no
    worker its batch reads queued (the dashboard's badge and `herd eval list` said
    running), and a document with a leased piece reads running."""
    await submit_pipeline(app, [docs(tmp_path, 3)], from_json(pipeline()), batch="staged")
    status = await batch_status(app, "staged")
    assert (status.running, status.queued) == (0, 3)
    # Its stages' model has no price: "unpriced", never $0.00 (its items hold no spec).
    assert status.unpriced == ["sim-1"] and "spent: unpriced" in summary(status)
    (listed,) = await evaluate.list_batches(app)
    assert (listed["state"], listed["running"], listed["unpriced"]) == ("queued", 0, ["sim-1"])
    leases = await app.broker.claim([evaluate.QUEUE], "a-worker", 2)
    assert len(leases) == 2
    pieces = {lease.payload["path"] for lease in leases}
    status = await batch_status(app, "staged")
    assert (status.running, status.queued) == (len(pieces), 3 - len(pieces))
    (listed,) = await evaluate.list_batches(app)
    assert (listed["state"], listed["running"]) == ("running", len(pieces))


async def test_a_finished_pipeline_is_purged_with_its_items(app, sim):
    await submit_pipeline_texts(app, from_json(pipeline()), {"pump.md": manual("Pump", 1)},
                                batch="old")  # fmt: skip
    await drain(app)
    rt = await EvalRuntime.of(app)
    count = "SELECT (SELECT count(*) FROM herd_eval_pieces), (SELECT count(*) FROM herd_eval_fanin)"
    assert (await rt.store.execute(count))[0] == (3, 1)  # 2 maps, 1 reduce; 1 fan-in
    await rt.store.purge(eval_ttl=0.001, ledger_ttl=0)
    assert (await rt.store.execute(count))[0] == (0, 0)
    assert (await rt.store.execute("SELECT count(*) FROM herd_eval_pipelines"))[0] == (0,)


# What the stage view read before its counters: every piece, and every paid call of the
# batch joined to its pieces. The reference its counters must agree with.
BY_ROWS = """
SELECT stage, count(*), count(*) FILTER (WHERE status = 'done'),
       count(*) FILTER (WHERE status = 'failed'), count(*) FILTER (WHERE status = 'cancelled'),
       count(*) FILTER (WHERE source IN ('hit', 'waited', 'stale')), max(round)
  FROM herd_eval_pieces WHERE batch = %(b)s GROUP BY stage"""
COSTS_BY_ROWS = """
WITH l AS (SELECT * FROM herd_eval_ledger WHERE batch = %(b)s AND state = 'closed'
              AND kind IN ('call', 'lost', 'failed', 'cut_short')),
     x AS (SELECT p.stage, l.id, l.input_tokens, l.output_tokens, l.cost
             FROM (SELECT DISTINCT stage, key FROM herd_eval_pieces WHERE batch = %(b)s) p
             JOIN l ON l.key = p.key
           UNION
           SELECT p.stage, l.id, l.input_tokens, l.output_tokens, l.cost
             FROM (SELECT DISTINCT stage, job_id FROM herd_eval_pieces
                    WHERE batch = %(b)s AND job_id IS NOT NULL) p
             JOIN l ON l.job_id = p.job_id)
SELECT stage, count(*), sum(input_tokens), sum(output_tokens), sum(cost) FROM x GROUP BY stage"""


def _rows_read(plan: dict, tables: tuple[str, ...]) -> int:
    own = 0
    if plan.get("Relation Name") in tables:
        own = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * plan.get(
            "Actual Loops", 1
        )
    return own + sum(_rows_read(p, tables) for p in plan.get("Plans", []))


async def test_the_stage_view_reads_counters_that_agree_with_the_pieces_and_the_ledger(
    app, sim, tmp_path, pg_url, monkeypatch
):
    """Each stage's progress and cost come from counters kept as pieces change and calls
    close (O(stages) a poll, the dashboard's): they agree with a count of the pieces and
    a sum of the ledger's rows, with repaired answers, a batch answered from the cache
    and a cancelled one; the read touches no piece and no ledger row."""
    folder = docs(tmp_path, 3)
    pipe = from_json(pipeline(chain=True))
    sim.script("invalid", "invalid")  # two answers outside the schema: repaired
    await submit_pipeline(app, [folder], pipe, batch="counted")
    await drain(app)
    await submit_pipeline(app, [folder], pipe, batch="again")  # every call from the cache
    await drain(app)
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.md").write_text(manual("Device X", 4))
    await submit_pipeline(app, [other], pipe, batch="dropped")
    await evaluate.cancel(app, "dropped")
    await drain(app)  # its jobs end its pieces as cancelled
    rt = await EvalRuntime.of(app)
    sent: list[tuple[str, object]] = []
    execute = rt.store.execute

    async def spy(query: str, params: object = None) -> list[tuple]:
        sent.append((stages.Q.get(query, query), params))
        return await execute(query, params)

    with psycopg.connect(pg_url) as conn:
        for batch in ("counted", "again", "dropped"):
            with monkeypatch.context() as m:
                m.setattr(rt.store, "execute", spy)
                view = {s["stage"]: s for s in await stage_progress(rt, batch)}
            counted = {
                s: (v["pieces"], v["done"], v["failed"], v["cancelled"], v["cached"], v["round"])
                for s, v in view.items()
                if v["pieces"]
            }
            rows = conn.execute(BY_ROWS, {"b": batch}).fetchall()
            assert counted == {s: tuple(int(x) for x in r) for s, *r in rows}, batch
            paid = {s: (v["calls"], v["input_tokens"], v["output_tokens"]) for s, v in view.items()
                    if v["calls"]}  # fmt: skip
            costs = conn.execute(COSTS_BY_ROWS, {"b": batch}).fetchall()
            assert paid == {s: (int(n), int(i), int(o)) for s, n, i, o, _ in costs}, batch
        progress = {s["stage"]: s for s in await stage_progress(rt, "counted")}
        # 15 pieces (3, 4 and 5 registers and an introduction each); two answers were
        # repaired, a call each.
        assert (progress["notes"]["done"], progress["notes"]["calls"]) == (15, 15 + 2)
        again = {s["stage"]: s for s in await stage_progress(rt, "again")}
        assert (again["notes"]["cached"], again["notes"]["calls"]) == (15, 0)
        dropped = {s["stage"]: s for s in await stage_progress(rt, "dropped")}
        assert dropped["notes"]["cancelled"] == dropped["notes"]["pieces"] == 5
        for sql, params in sent:
            ((plan,),) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchall()
            assert _rows_read(plan[0]["Plan"], ("herd_eval_pieces", "herd_eval_ledger")) == 0
        conn.rollback()
        # A finished batch's read asks nothing of the broker for its pieces.
        asked: list[str] = []

        async def refused(*args: object, **kwargs: object) -> list:
            asked.append("broker")
            return []

        with monkeypatch.context() as m:
            m.setattr(app.broker, "list_jobs", refused)
            m.setattr(app.broker, "get_jobs", refused)
            assert await stageview.settle_pieces(app, rt, "counted") == 0
        assert asked == []
        # Pieces deleted (as the purge does): counted out.
        conn.execute("DELETE FROM herd_eval_pieces WHERE batch = 'again' AND seq < 2")
        conn.commit()
        view = {s["stage"]: s for s in await stage_progress(rt, "again")}
        rows = conn.execute(BY_ROWS, {"b": "again"}).fetchall()
        assert {s: v["pieces"] for s, v in view.items() if v["pieces"]} == {
            s: int(n) for s, n, *_ in rows
        }
        assert view["notes"]["pieces"] == 15 - 2 * 3
