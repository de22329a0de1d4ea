"""`herd eval list` and `herd eval status` read at 80 columns (the rules of
tests/test_cli_text.py): no line over 80, no box, no Python reprs."""

from __future__ import annotations

from herd import App, console
from herd.llm import eval as evaluate
from herd.llm.eval import EvalSpec, submit
from herd.llm.eval.status import BatchStatus
from herd.llm.follow import print_status
from tests.conftest import truncate
from tests.helpers import priced
from tests.llm.conftest import clean_eval_tables, run_until
from tests.test_cli import herd
from tests.test_cli_text import REPR, WIDTH

SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer"}, "summary": {"type": "string"}},
    "required": ["score", "summary"],
}
SPEC = EvalSpec(model="sim-1", system="Rate the paper from 1 to 10.", schema=SCHEMA)


async def test_eval_list_and_status_fit_80_columns(pg_url, sim, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    priced(monkeypatch, tmp_path, "sim-1")
    truncate(pg_url)
    clean_eval_tables(pg_url)
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"p{i}.txt").write_text(f"Paper {i}.\nIt has results number {i}.\n")
    batch = "a-batch-with-a-name-long-enough-to-need-its-column"
    app = App(database_url=pg_url)
    app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=5.0)(evaluate.task.evaluate)
    async with app:
        await submit(app, [docs], SPEC, batch=batch, budget=5.0)

        async def answered():  # type: ignore[no-untyped-def]
            found = await evaluate.batch_status(app, batch)
            return found if found.done == 3 else None

        await run_until(app, answered)

    env = {"COLUMNS": str(WIDTH), "HERD_PRICES": str(tmp_path / "prices.json")}
    for args in (["eval", "list"], ["eval", "status", batch], ["eval", "show", batch]):
        r = herd(*args, url=pg_url, **env)
        assert r.returncode == 0, (args, r.stderr)
        wide = [line for line in r.stdout.splitlines() if len(line) > WIDTH]
        assert not wide, (args, wide)
        assert not REPR.search(r.stdout), (args, r.stdout)
        assert "┃" not in r.stdout and "│" not in r.stdout, (args, r.stdout)
        assert "3/3 answered" in r.stdout or "3/3" in r.stdout, (args, r.stdout)
    listed = herd("eval", "list", url=pg_url, **env).stdout.splitlines()
    assert listed[0].split() == ["batch", "created", "answered", "spent", "state"]
    # The name folded over lines of its own column, never cut; the figures on its first.
    assert "".join(line.split()[0] for line in listed[1:] if line.strip()) == batch, listed
    assert "3/3" in listed[1] and "done" in listed[1], listed


def test_the_unpriced_models_line_folds_at_80_columns():
    """It was printed unwrapped: 112 columns for two models of ordinary names."""
    models = ["claude-sonnet-4-5-20250929", "gpt-4.1-mini-2025-04-14"]
    status = BatchStatus(batch="b", documents=3, queued=3, unpriced=models)
    with console.out.capture() as shown:
        print_status(status)
    text = shown.get()
    assert "claude-sonnet-4-5-20250929" in text and "HERD_PRICES" in text, text
    assert all(len(line) <= WIDTH for line in text.splitlines()), text
