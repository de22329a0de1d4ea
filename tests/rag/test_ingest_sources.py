"""`herd ingest` of PDF and HTML files on the real PostgreSQL: pages in answers, bad files
named and the rest indexed, usage errors exiting 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from herd.rag.ingest import RagRuntime, plan_and_apply
from herd.rag.query import answer
from tests.rag.pdfs import make_pdf
from tests.rag.support import drain
from tests.rag.test_ingest import GENESIS_1_3, collection  # noqa: F401
from tests.rag.test_sources import STATUTE

ROOT = Path(__file__).resolve().parent.parent.parent


def herd(pg_url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HERD_DATABASE_URL=pg_url, HERD_HOME=str(home), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "herd", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "UU_7_2030.pdf").write_bytes(make_pdf(STATUTE))
    (folder / "guide.html").write_text(
        "<html><body><h1>Guide</h1><h2>Leases</h2><p>A lease that is not renewed"
        " expires, and another worker takes the job over.</p></body></html>"
    )
    (folder / "kjv.txt").write_text("\n".join(GENESIS_1_3[:5]) + "\n")
    return folder


async def test_answers_from_a_pdf_say_its_pages(app, tmp_path):  # noqa: F811
    name = collection()
    plan = await plan_and_apply(app, [corpus(tmp_path)], name)
    await drain(app)
    assert plan.errors == []
    (found,) = await answer(app, name, ["waktu istirahat pekerja setiap minggu"], 3, cache=False)
    top = found.hits[0]
    assert (top["id"], top["page"], top["page_end"]) == ("uu-7-2030/bab-i/pasal-2/ayat-1", 2, 2)
    (html,) = await answer(app, name, ["what happens when a lease is not renewed"], 1)
    assert html.hits[0]["id"] == "guide/guide/leases/p1"
    assert "page" not in html.hits[0]  # pages are a PDF's; nothing made up for HTML


def test_the_cli_shows_the_pages_of_an_answer(pg_url, herd_home, tmp_path):
    name = collection()
    r = herd(pg_url, herd_home, "ingest", str(corpus(tmp_path)), "--collection", name)
    assert r.returncode == 0, r.stderr
    assert f"{name}: 11 added" in r.stdout, r.stdout
    r = herd(
        pg_url,
        herd_home,
        "query",
        "Pasal 2 ayat (1)",
        "--collection",
        name,
        "-k",
        "1",
        "--no-cache",
    )
    assert r.returncode == 0, r.stderr
    assert "(p. 2)" in r.stdout, r.stdout
    r = herd(pg_url, herd_home, "query", "Pasal 2 ayat (1)", "--collection", name, "--json")
    assert '"page": 2, "page_end": 2' in r.stdout, r.stdout


async def test_a_binary_file_is_named_and_the_rest_is_indexed(
    app,  # noqa: F811
    pg_url,
    herd_home,
    tmp_path,
):
    name = collection()
    folder = corpus(tmp_path)
    (folder / "tool").write_bytes(Path(sys.executable).read_bytes()[:4096])
    (folder / "scan.pdf").write_bytes(b"%PDF-1.7 truncated by a failed download")
    r = herd(pg_url, herd_home, "ingest", str(folder), "--collection", name)
    assert r.returncode == 1, r.stderr  # documented: some file was not read, the rest was
    assert f"{folder / 'tool'}: a binary file, not text, PDF or HTML" in r.stderr
    assert f"{folder / 'scan.pdf'}: not a readable PDF" in r.stderr
    assert r.stderr.splitlines()[-1] == (  # the last line: what failed, what to do next
        "herd: 2 files were not read (above); the rest is indexed: fix or remove them,"
        " then run herd ingest again"
    )
    assert "herd.worker" not in r.stderr  # the progress bars say what its lines would
    assert f"{name}: 11 added" in r.stdout
    rt = await RagRuntime.of(app)
    rows = await rt.store.fetch(
        "SELECT count(*), count(DISTINCT source) FROM herd_chunks WHERE collection = %s", (name,)
    )
    assert rows[0] == (11, 3)
    live = await rt.store.live(name)
    assert live is not None and await rt.store.count_missing(live) == 0
    help_text = herd(pg_url, herd_home, "ingest", "--help").stdout
    assert "1 when some file could not be read" in " ".join(help_text.split())


async def test_a_path_that_does_not_exist_is_a_usage_error(app, pg_url, herd_home, tmp_path):  # noqa: F811
    rt = await RagRuntime.of(app)
    runs = await rt.store.fetch("SELECT count(*) FROM herd_ingest_runs")
    missing = tmp_path / "nothere"
    r = herd(pg_url, herd_home, "ingest", str(missing), "--collection", collection())
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"herd: error: {missing}: no such file or directory"]
    assert await rt.store.fetch("SELECT count(*) FROM herd_ingest_runs") == runs


async def test_watch_and_status_from_the_cli(pg_url, herd_home, tmp_path):
    import asyncio
    import json
    import signal

    name = collection()
    folder = corpus(tmp_path)
    env = dict(os.environ, HERD_DATABASE_URL=pg_url, HERD_HOME=str(herd_home), PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "herd", "ingest", str(folder), "--collection", name,
        "--watch", "--json", env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 180))
        assert (first["full"], first["added"], first["embedded"]) == (True, 11, 11)
        (folder / "kjv.txt").write_text("\n".join(GENESIS_1_3[:6]) + "\n")
        sync = json.loads(await asyncio.wait_for(proc.stdout.readline(), 180))
        assert (sync["full"], sync["added"], sync["embedded"]) == (False, 1, 1)
        shown = await asyncio.to_thread(herd, pg_url, herd_home, "ingest", "--status", name)
        assert shown.returncode == 0, shown.stderr
        assert f"folders:   {folder}" in shown.stdout
        assert "pending:   none" in shown.stdout and "1 added" in shown.stdout
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    shown = await asyncio.to_thread(herd, pg_url, herd_home, "ingest", "--status", name, "--json")
    assert json.loads(shown.stdout)["stopped_at"] is not None


def test_watch_usage_errors_exit_2(pg_url, herd_home, tmp_path):
    (tmp_path / "a.txt").write_text("words\n")
    cases = [
        (["--watch", str(tmp_path / "a.txt")], "is not one"),
        (["--watch", "--plan", str(tmp_path)], "choose one"),
        (["--poll", "1", str(tmp_path)], "--poll goes with --watch"),
        ([], "give the files or folders to index and --collection"),
    ]
    for args, message in cases:
        extra = ["--collection", "c"] if args else []
        r = herd(pg_url, herd_home, "ingest", *args, *extra)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
