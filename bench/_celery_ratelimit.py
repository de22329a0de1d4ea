"""The Celery half of rate_limits.py: one task per document, Celery's own ``rate_limit``.

The worker processes import this module (``celery -A bench._celery_ratelimit worker``);
the settings come from environment variables that rate_limits.py sets:

    BENCH_CELERY_BROKER   redis://127.0.0.1:PORT/0 (broker, and where answers go)
    BENCH_SIM_URL         the simulator, e.g. http://127.0.0.1:PORT (no /v1)
    BENCH_RATE_LIMIT      the task's rate_limit, e.g. "150/m" (per worker process)
    BENCH_MAX_TOKENS      max_tokens of each request

Celery's ``rate_limit`` is enforced by each worker on its own (a token bucket in the
consumer), so N workers together allow N times it. A 429 is retried the way a Celery
user would write it: ``self.retry(countdown=Retry-After)``, without a cap on retries.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task

from bench._celery_sim import clients

QUEUE = "bench-rl"
TASK = "bench.rl_eval"
RESULTS = "bench:rl:results"  # hash: document name -> the model's answer
RATE_LIMITED = "bench:rl:429"  # counter of 429s the tasks received


def make_app(broker: str) -> Celery:
    app = Celery("bench_rl", broker=broker)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        worker_prefetch_multiplier=4,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_default_queue=QUEUE,
    )
    return app


if "BENCH_CELERY_BROKER" in os.environ:  # in the worker processes (and the producer)
    app = make_app(os.environ["BENCH_CELERY_BROKER"])

    @app.task(name=TASK, bind=True, rate_limit=os.environ.get("BENCH_RATE_LIMIT") or None)
    def evaluate(self: Task, name: str, body: dict[str, Any]) -> None:
        http, results = clients(max_connections=64)
        response = http.post("/chat/completions", json=body)
        if response.status_code == 429:
            results.incr(RATE_LIMITED)
            after = float(response.headers.get("retry-after") or 1)
            raise self.retry(countdown=after, max_retries=None)
        response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        results.hset(RESULTS, name, answer)
