"""A pipeline submitted over HTTP: checked whole (422 naming the stage), stored, and its
stages shown in the batch's status."""

from __future__ import annotations

import uuid

PIPE = {
    "defaults": {"model": "sim-small"},
    "stages": [
        {"name": "parts", "kind": "split", "by": "headings"},
        {"name": "notes", "kind": "map", "prompt": "Note it.", "schema": {"type": "object"}},
        {"name": "sum", "kind": "reduce", "prompt": "Sum up.", "schema": {"type": "object"}},
    ],
}
TEXT = "# Manual\n\nIntro.\n\n## One\n\nFirst.\n\n## Two\n\nSecond.\n"


async def test_a_pipeline_batch_is_enqueued_per_piece_and_shown_per_stage(client, pg_app):
    batch = f"pipe-{uuid.uuid4().hex[:8]}"
    docs = [{"name": "m.md", "text": TEXT}]
    r = await client.post("/evals", json={"pipeline": PIPE, "documents": docs, "batch": batch})
    assert r.status_code == 201, r.text
    assert r.json()["queued"] == 3  # the intro and two sections
    status = (await client.get(f"/evals/{batch}")).json()
    assert status["documents"] == 1 and status["done"] == 0
    assert [(s["stage"], s["pieces"], s["done"]) for s in status["stages"]] == [
        ("notes", 3, 0), ("sum", 0, 0)]  # fmt: skip
    # A pipeline runs in a batch of its own.
    again = await client.post("/evals", json={"pipeline": PIPE, "documents": docs,
                                              "batch": batch})  # fmt: skip
    assert again.status_code == 422 and "exists" in again.text


async def test_a_wrong_pipeline_is_refused_before_anything_is_stored(client):
    bad = {**PIPE, "stages": [PIPE["stages"][0], {**PIPE["stages"][2], "name": "lead-reduce"}]}
    docs = [{"name": "m.md", "text": TEXT}]
    r = await client.post("/evals", json={"pipeline": bad, "documents": docs})
    assert r.status_code == 422
    assert "stage 'lead-reduce': a reduce needs a map stage before it" in r.text
    both = await client.post("/evals", json={"pipeline": PIPE, "model": "m", "system": "s",
                                             "documents": docs})  # fmt: skip
    assert both.status_code == 422 and "not both" in both.text
