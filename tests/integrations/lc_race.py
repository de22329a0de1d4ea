"""A process of N concurrent LangChain callers of one prompt (the singleflight test's contender).

usage: python -m tests.integrations.lc_race threads|tasks COUNTER_URL TAG PROMPT CALLERS GO_FILE
The cache is HerdCache() from the environment; the model counts its calls in
COUNTER_URL. Prints "ready", waits for GO_FILE, then one JSON line of the answers.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from langchain_core.globals import set_llm_cache

from herd.integrations.langchain import HerdCache
from tests.integrations.models import CountedModel


def main(mode: str, url: str, tag: str, prompt: str, callers: int, go: Path) -> None:
    cache = HerdCache(poll_interval=0.05)
    cache.stats()  # opened before the start, so that every caller starts at once
    set_llm_cache(cache)
    model = CountedModel(responses=["the answer"], counter_url=url, tag=tag, seconds=1.0)
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not go.exists():  # the test starts every process's callers at once
        if time.monotonic() > deadline:
            raise SystemExit("no go")
        time.sleep(0.01)
    if mode == "threads":
        with ThreadPoolExecutor(callers) as pool:
            answers = list(pool.map(lambda _: model.invoke(prompt).content, range(callers)))
    else:

        async def run() -> list[object]:
            found = await asyncio.gather(*(model.ainvoke(prompt) for _ in range(callers)))
            return [m.content for m in found]

        answers = asyncio.run(run())
    print(json.dumps(answers), flush=True)


if __name__ == "__main__":
    m, u, t, p, n, g = sys.argv[1:7]
    main(m, u, t, p, int(n), Path(g))
