"""The Celery half of eval_cost.py: one task that evaluates one document, no cache.

The worker processes import this module (``celery -A bench._celery_eval worker``); the
settings come from environment variables that eval_cost.py sets:

    BENCH_CELERY_BROKER   redis://127.0.0.1:PORT/0 (broker, and where results go)
    BENCH_SIM_URL         the simulator, e.g. http://127.0.0.1:PORT (no /v1)
    BENCH_VISIBILITY      seconds before an unacknowledged message is delivered again
    BENCH_RESTORE_EVERY   seconds between kombu's sweeps for such messages

The task sends the request herd's ``OpenAICompatible`` sends (same path, headers and
body: system prompt, document, ``response_format`` json_schema, strict) with httpx, and
stores the answer in Redis keyed by the document's path. Celery has no result cache:
every delivery of a task is a paid call.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from celery import Celery

from bench._celery_sim import clients

QUEUE = "bench-eval"
TASK = "bench.eval"
RESULTS = "bench:eval:results"  # hash: document path -> the model's answer
RUNS = "bench:eval:runs"  # hash: document path -> executions that got an answer


def make_app(broker: str, visibility: float, restore_every: float) -> Celery:
    app = Celery("bench_eval", broker=broker)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,  # the task writes its own result (RESULTS)
        # The settings the Celery docs recommend for long tasks that must survive a
        # worker crash: acknowledge after the task ran, requeue if its process is lost,
        # and take one message at a time so nothing waits behind a long call.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={
            # Redis has no acknowledgements of its own: kombu keeps each delivered message
            # in an "unacked" hash, and a sweep puts back on the queue whatever has been
            # there longer than the visibility timeout, whether or not its worker is alive.
            "visibility_timeout": visibility,
            # kombu 5.7 sweeps every interval*throttle = 100 s by default; scaled down with
            # the latencies so that a killed worker's message comes back within seconds.
            "unacked_restore_interval": restore_every,
            "unacked_restore_throttle": 1,
        },
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_default_queue=QUEUE,
    )
    return app


def _schema_name(schema: dict[str, Any]) -> str:
    title = schema.get("title")
    name = re.sub(r"[^a-zA-Z0-9_-]+", "_", title).strip("_")[:64] if isinstance(title, str) else ""
    return name or "result"


def request_body(model: str, system: str, schema: dict[str, Any], document: str) -> dict[str, Any]:
    """The body herd.llm.providers.openai.OpenAICompatible sends for the same evaluation."""
    return {
        "model": model,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": _schema_name(schema), "schema": schema, "strict": True},
        },
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": document},
        ],
        "stream": False,
    }


if "BENCH_CELERY_BROKER" in os.environ:  # in the worker processes (and the producer)
    app = make_app(
        os.environ["BENCH_CELERY_BROKER"],
        float(os.environ.get("BENCH_VISIBILITY", "1")),
        float(os.environ.get("BENCH_RESTORE_EVERY", "2")),
    )

    @app.task(name=TASK)
    def evaluate(path: str, prompt: str, schema: str, model: str) -> None:
        http, results = clients()
        system = Path(prompt).read_text(encoding="utf-8")
        body = request_body(
            model,
            system,
            json.loads(Path(schema).read_text(encoding="utf-8")),
            Path(path).read_text(encoding="utf-8"),
        )
        response = http.post("/chat/completions", json=body)
        response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        pipe = results.pipeline()
        pipe.hset(RESULTS, path, answer)
        pipe.hincrby(RUNS, path, 1)
        pipe.execute()
