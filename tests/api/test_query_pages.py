"""POST /query says the pages of an answer that came from a PDF."""

from __future__ import annotations

import uuid

from herd.builtin import tasks as builtin_tasks
from herd.rag.ingest import plan_and_apply
from tests.rag.pdfs import make_pdf
from tests.rag.test_ingest import drain
from tests.rag.test_sources import STATUTE


async def test_a_hit_from_a_pdf_carries_its_pages(client, pg_app, herd_home, tmp_path):
    name = f"c{uuid.uuid4().hex[:10]}"
    (tmp_path / "UU_7_2030.pdf").write_bytes(make_pdf(STATUTE))
    (tmp_path / "notes.md").write_text("# Notes\n\nWorkers rest on Sundays.\n")
    pg_app.settings = pg_app.settings.override(home=herd_home)
    pg_app.include(builtin_tasks)
    await plan_and_apply(pg_app, [tmp_path], name)
    await drain(pg_app)
    r = await client.post(
        "/query", json={"texts": ["Pasal 3", "rest on Sundays"], "collection": name, "k": 1}
    )
    assert r.status_code == 200, r.text
    law, notes = r.json()["answers"]
    assert law["hits"][0]["id"] == "uu-7-2030/bab-ii/pasal-3"
    assert (law["hits"][0]["page"], law["hits"][0]["page_end"]) == (3, 3)
    assert (notes["hits"][0]["page"], notes["hits"][0]["page_end"]) == (None, None)
