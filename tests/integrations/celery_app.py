"""The Celery side of tests/integrations/test_celery.py: a task that asks the simulator
for an answer through ``herd.integrations.celery.once`` and stores it in Redis.

Worker processes import it (``celery -A tests.integrations.celery_app worker``) and read
CELERY_TEST_BROKER (redis://...), CELERY_TEST_SIM (the simulator's /v1 URL) and herd's
own settings from the environment.
"""

from __future__ import annotations

import os

import httpx
import redis
from celery import Celery

from herd.integrations.celery import once

QUEUE = "herd-celery-test"
ANSWERS = "herd:celery-test:answers"  # hash: request id -> the answer

app = Celery("herd_celery_test", broker=os.environ.get("CELERY_TEST_BROKER", "redis://"))
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    # What the Celery docs recommend for work that must survive a worker's death.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    # A killed worker's message comes back within seconds (kombu's sweep of unacked ones).
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("CELERY_TEST_VISIBILITY", "30")),
        "unacked_restore_interval": 0.5,
        "unacked_restore_throttle": 1,
    },
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue=QUEUE,
)


def ask_model(prompt: str) -> str:
    r = httpx.post(
        os.environ["CELERY_TEST_SIM"] + "/chat/completions",
        headers={"authorization": "Bearer sk-test"},
        json={"model": "sim-1", "messages": [{"role": "user", "content": prompt}]},
        timeout=60,
    )
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


@app.task(name="herd_celery_test.ask")
def ask(request_id: str, prompt: str) -> None:
    answer = once({"model": "sim-1", "prompt": prompt}, lambda: ask_model(prompt))
    redis.Redis.from_url(os.environ["CELERY_TEST_BROKER"]).hset(ANSWERS, request_id, answer)
