"""herd.integrations.langchain: LangChain's cache interface over herd's caches, real servers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from langchain_core.load import dumps
from langchain_core.messages import HumanMessage, SystemMessage

from herd import Settings
from herd.errors import ConfigError
from herd.integrations.langchain import HerdCache, HerdSemanticCache, cache_key
from tests.conftest import ROOT, flush_redis
from tests.integrations.models import CALLS, CountedModel, calls


@pytest.fixture(scope="module")
def counter(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(CALLS)
    return pg_url


@pytest.fixture(params=["postgres", "redis"])
def cache_env(request, pg_url, herd_home) -> dict[str, str]:
    """The environment a HerdCache() is built from, on each backend."""
    env = {"HERD_HOME": str(herd_home), "HERD_DATABASE_URL": pg_url}
    if request.param == "redis":
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
        env.update(HERD_CACHE="redis", HERD_REDIS_URL=url)
    return env


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex


def model(counter: str, tag: str, **kw) -> CountedModel:
    return CountedModel(responses=["the answer"], counter_url=counter, tag=tag, **kw)


def settings(pg_url, herd_home) -> Settings:
    return Settings(home=herd_home, database_url=pg_url)


def race(
    mode: str, env: dict[str, str], counter: str, tag: str, go: str, n: int
) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    argv = [sys.executable, "-m", "tests.integrations.lc_race", mode, counter, tag]
    return subprocess.Popen(
        [*argv, f"What is the answer? ({tag})", str(n), go],
        cwd=ROOT,
        env={**base, **env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(90)
def test_hundred_identical_prompts_in_two_processes_make_one_model_call(
    counter, tag, tmp_path, pg_url, herd_home
):
    # The backends' locks are shared by every process (tests/cache/test_exact.py races
    # both); on Redis this integration's own part is raced in one process, below.
    env = {"HERD_HOME": str(herd_home), "HERD_DATABASE_URL": pg_url}
    go = tmp_path / "go"
    # Two processes of 50 (one of threads, one of tasks): each process costs a few
    # seconds of imports, and two already race across processes.
    procs = [race(m, env, counter, tag, str(go), 50) for m in ("threads", "tasks")]
    for p in procs:  # every process imported LangChain and made its cache before the start
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.touch()
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 2, [err[-2000:] for _, err in outputs]
    for _, err in outputs:  # closed at exit: no pool left pending, nothing raised
        assert "Traceback" not in err and "was destroyed" not in err, err[-2000:]
    answers = [a for out, _ in outputs for a in json.loads(out)]
    assert answers == ["the answer"] * 100
    assert calls(counter, tag) == 1


async def test_threads_and_tasks_of_one_process_make_one_model_call(cache_env, counter, tag):
    cache = HerdCache(settings=Settings.from_env(cache_env), poll_interval=0.05)
    m = model(counter, tag, cache=cache, seconds=0.5)
    prompt = f"one process {tag}"
    loop = asyncio.get_running_loop()
    # The threads get a pool of their own. Not the loop's default executor (6 threads on
    # 2 cores), which is where LangChain runs a task's model call (SimpleChatModel's
    # _agenerate): had a task won the key while 6 threads were waiting for it, its
    # model call would have queued behind them until they gave up (``wait``).
    pool = ThreadPoolExecutor(10, thread_name_prefix="lc-caller")
    try:
        threads = [loop.run_in_executor(pool, m.invoke, prompt) for _ in range(10)]
        tasks = [m.ainvoke(prompt) for _ in range(10)]
        answers = await asyncio.gather(*threads, *tasks)
        assert [a.content for a in answers] == ["the answer"] * 20
        assert calls(counter, tag) == 1
    finally:
        pool.shutdown(wait=False)
        await asyncio.to_thread(cache.close)


async def test_a_task_holding_the_key_serves_threads_waiting_for_it(cache_env, counter, tag):
    """The other order: a task has the key (its model call runs) before any thread asks."""
    cache = HerdCache(settings=Settings.from_env(cache_env), poll_interval=0.05)
    m = model(counter, tag, cache=cache, seconds=0.5)
    prompt = f"task first {tag}"
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(10, thread_name_prefix="lc-caller")
    try:
        first = asyncio.ensure_future(m.ainvoke(prompt))
        deadline = time.monotonic() + 30
        while calls(counter, tag) == 0:  # the task is in its model call
            assert time.monotonic() < deadline and not first.done()
            await asyncio.sleep(0.01)
        threads = [loop.run_in_executor(pool, m.invoke, prompt) for _ in range(10)]
        answers = await asyncio.gather(first, *threads)
        assert [a.content for a in answers] == ["the answer"] * 11
        assert calls(counter, tag) == 1
    finally:
        pool.shutdown(wait=False)
        await asyncio.to_thread(cache.close)


def test_entries_are_herds_keys_and_langchains_json(counter, tag, pg_url, herd_home, monkeypatch):
    monkeypatch.setenv("HERD_HOME", str(herd_home))
    monkeypatch.setenv("HERD_DATABASE_URL", pg_url)
    monkeypatch.delenv("HERD_CACHE", raising=False)
    cache = HerdCache()  # from the settings, as App()
    try:
        m = model(counter, tag, cache=cache)
        before = cache.stats()
        first, second = m.invoke(f"hello {tag}"), m.invoke(f"hello {tag}")
        assert first.content == second.content == "the answer"
        assert calls(counter, tag) == 1
        after = cache.stats()
        for name, n in {"misses": 1, "computed": 1, "hits": 1}.items():
            assert after[name] - before.get(name, 0) == n, name
    finally:
        cache.close()
    key = cache_key(dumps([HumanMessage(content=f"hello {tag}")]), m._get_llm_string())
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT value FROM herd_cache WHERE namespace = 'langchain' AND key = %s", (key,)
        ).fetchone()
    assert row is not None
    (generation,) = row[0]  # JSON, as LangChain's dumpd writes it
    assert generation["lc"] == 1 and generation["id"][-1] == "ChatGeneration"
    assert generation["kwargs"]["message"]["kwargs"]["content"] == "the answer"


async def test_a_failed_model_call_lets_a_waiting_caller_in(counter, tag, pg_url, herd_home):
    cache = HerdCache(settings=settings(pg_url, herd_home), max_hold=120, wait=120)
    m = model(counter, tag, cache=cache, fail_calls=1, seconds=0.3)
    prompt = f"fails once {tag}"
    try:
        first = asyncio.create_task(m.ainvoke(prompt))
        deadline = time.monotonic() + 10
        while calls(counter, tag) == 0:  # the first caller is in its model call
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        started = time.monotonic()
        second = asyncio.create_task(m.ainvoke(prompt))
        with pytest.raises(ValueError, match="model call 1 failed"):
            await first
        assert (await second).content == "the answer"
        assert time.monotonic() - started < 60  # not max_hold (120 s): the failed caller let go
        assert calls(counter, tag) == 2
    finally:
        await asyncio.to_thread(cache.close)


def test_a_retry_of_the_holder_calls_again_instead_of_waiting_for_itself(
    counter, tag, pg_url, herd_home
):
    cache = HerdCache(settings=settings(pg_url, herd_home), max_hold=120, wait=120)
    try:
        m = model(counter, tag, cache=cache, fail_calls=1)
        retried = m.with_retry(stop_after_attempt=2, wait_exponential_jitter=False)
        started = time.monotonic()
        assert retried.invoke(f"retried {tag}").content == "the answer"
        assert time.monotonic() - started < 60 and calls(counter, tag) == 2  # not max_hold
    finally:
        cache.close()


def test_a_holder_that_never_updates_holds_its_key_for_max_hold_at_most(pg_url, herd_home, tag):
    cache = HerdCache(settings=settings(pg_url, herd_home), max_hold=1.0, wait=60)
    try:
        assert cache.lookup(tag, "llm") is None  # claimed; this thread stays alive
        found: list[object] = []
        other = threading.Thread(target=lambda: found.append(cache.lookup(tag, "llm")))
        started = time.monotonic()
        other.start()
        other.join(30)
        assert found == [None]  # its turn to call the model: the claim lapsed
        assert 0.5 < time.monotonic() - started < 30  # max_hold, not the wait (60 s)
    finally:
        cache.close()


def test_bad_settings_name_the_argument(pg_url, herd_home):
    with pytest.raises(ConfigError, match="wait must be a positive number"):
        HerdCache(settings=settings(pg_url, herd_home), wait=0)
    with pytest.raises(ConfigError, match="namespace"):
        HerdCache(settings=settings(pg_url, herd_home), namespace="a{b}")


def test_herd_imports_no_langchain():
    code = "import sys, herd, herd.sync, herd.cli; print('langchain_core' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip() == "False", r.stderr


@pytest.fixture(scope="module")
def embedder(herd_home):
    from herd.rag.embedders import minilm_embedder

    return minilm_embedder(herd_home)


def test_semantic_cache_serves_a_paraphrase_and_not_a_negation(cache_env, counter, tag, embedder):
    semantic = HerdSemanticCache(
        settings=Settings.from_env(cache_env), embedder=embedder, name=f"lc-{tag[:8]}"
    )
    try:
        m = model(counter, tag, cache=semantic)
        assert m.invoke("Which sins are forgiven?").content == "the answer"
        assert calls(counter, tag) == 1
        assert m.invoke("Which sins will be forgiven?").content == "the answer"
        assert calls(counter, tag) == 1  # a paraphrase: served from the cache
        m.invoke("Which sins are not forgiven?")
        assert calls(counter, tag) == 2  # a negation: the guards refuse the cached answer
        m.invoke([SystemMessage("Answer in French."), HumanMessage("Which sins are forgiven?")])
        assert calls(counter, tag) == 3  # other earlier messages: another conversation
        # A long system prompt would swamp the embedding of the whole conversation (and
        # push the question past the embedder's token limit): the question is matched.
        system = SystemMessage(" ".join(["Answer briefly, cite the verse, stay polite."] * 60))
        m.invoke([system, HumanMessage("How do I bake bread?")])
        m.invoke([system, HumanMessage("How do I repair a bicycle?")])
        assert calls(counter, tag) == 5
        other = CountedModel(responses=["another"], counter_url=counter, tag=tag, cache=semantic)
        assert other.invoke("Which sins are forgiven?").content == "another"
        assert calls(counter, tag) == 6  # another model's settings: its own entries
    finally:
        semantic.close()


def test_semantic_cache_constructs_from_the_settings(cache_env, embedder, monkeypatch):
    for name in ("HERD_CACHE", "HERD_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in cache_env.items():
        monkeypatch.setenv(name, value)
    semantic = HerdSemanticCache()
    assert semantic.cache.embedder.id == embedder.id  # herd's default embedder
    assert semantic.cache.backend.name == cache_env.get("HERD_CACHE", "postgres")
    assert semantic.lookup("Which sins are forgiven?", "llm") is None
    semantic.close()
