"""The Celery half of takeover.py: one task whose first delivery never ends.

The worker processes import this module (``celery -A bench._celery_takeover worker``);
the settings come from environment variables that takeover.py sets:

    BENCH_CELERY_BROKER   redis://127.0.0.1:PORT/0
    BENCH_VISIBILITY      seconds before an unacknowledged message is delivered again
    BENCH_RESTORE_EVERY   seconds between kombu's sweeps for such messages

The task counts its deliveries in Redis (STARTS); the first sleeps until its worker is
killed, a later one records when it started (RESTARTED, by ``time.time()``) and ends.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

QUEUE = "bench-takeover"
TASK = "bench.takeover.hold"
STARTS = "bench:takeover:starts"  # hash: key -> deliveries begun
RESTARTED = "bench:takeover:restarted"  # hash: key -> time.time() of the second start


def make_app(broker: str, visibility: float, restore_every: float) -> Celery:
    app = Celery("bench_takeover", broker=broker)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # What the Celery docs recommend for tasks that must survive a worker crash (as
        # in eval_cost.py): acknowledge late, requeue when the process is lost, one
        # message at a time.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={
            # The peer of herd's lease: a message unacknowledged this long goes back on
            # the queue, whether or not its worker is alive.
            "visibility_timeout": visibility,
            "unacked_restore_interval": restore_every,
            "unacked_restore_throttle": 1,
        },
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_default_queue=QUEUE,
    )
    return app


if "BENCH_CELERY_BROKER" in os.environ:
    app = make_app(
        os.environ["BENCH_CELERY_BROKER"],
        float(os.environ.get("BENCH_VISIBILITY", "30")),
        float(os.environ.get("BENCH_RESTORE_EVERY", "1")),
    )
    _redis = redis.Redis.from_url(os.environ["BENCH_CELERY_BROKER"])

    @app.task(name=TASK)
    def hold(key: str) -> None:
        if _redis.hincrby(STARTS, key, 1) == 1:
            time.sleep(3600)  # until SIGKILL
        else:
            _redis.hsetnx(RESTARTED, key, repr(time.time()))
