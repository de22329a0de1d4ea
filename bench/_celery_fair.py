"""The Celery half of fair_share.py: a queue and a task per batch, each at half the limit.

Celery has no shares of one limit between batches; the usual workaround is a task (and
a queue) per batch, each with a ``rate_limit`` of its part of the limit. The worker
processes import this module (``celery -A bench._celery_fair worker``); the settings come
from environment variables that fair_share.py sets:

    BENCH_CELERY_BROKER   redis://127.0.0.1:PORT/0 (broker, and where answers go)
    BENCH_SIM_URL         the simulator, e.g. http://127.0.0.1:PORT (no /v1)
    BENCH_RATE_LIMIT      each task's rate_limit, e.g. "300/m" (per worker process)

Each answer is recorded in RESULTS: document name -> JSON ``[batch, sent, answered]``
(epoch seconds: when the call went out and when its answer came back), the times the
windows and the small batch's end are read from.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery, Task

from bench._celery_sim import clients

TASKS = {"big": "bench.fair_big", "small": "bench.fair_small"}
QUEUES = {"big": "bench-fair-big", "small": "bench-fair-small"}
RESULTS = "bench:fair:results"


def make_app(broker: str) -> Celery:
    app = Celery("bench_fair", broker=broker)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        worker_prefetch_multiplier=4,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_routes={TASKS[b]: {"queue": QUEUES[b]} for b in TASKS},
    )
    return app


if "BENCH_CELERY_BROKER" in os.environ:  # in the worker processes (and the producer)
    app = make_app(os.environ["BENCH_CELERY_BROKER"])
    _rate = os.environ.get("BENCH_RATE_LIMIT") or None

    def _evaluate(batch: str, name: str, body: dict[str, Any]) -> None:
        http, results = clients(max_connections=64)
        sent = time.time()
        response = http.post("/chat/completions", json=body)
        response.raise_for_status()
        results.hset(RESULTS, name, json.dumps([batch, sent, time.time()]))

    # Celery's rate_limit is per task name: one task per batch is what splits the limit.
    @app.task(name=TASKS["big"], bind=True, rate_limit=_rate)
    def evaluate_big(self: Task, name: str, body: dict[str, Any]) -> None:
        _evaluate("big", name, body)

    @app.task(name=TASKS["small"], bind=True, rate_limit=_rate)
    def evaluate_small(self: Task, name: str, body: dict[str, Any]) -> None:
        _evaluate("small", name, body)
