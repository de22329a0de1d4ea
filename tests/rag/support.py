"""What the corpus tests share besides fixtures (tests/rag/conftest.py)."""

from __future__ import annotations

from herd import App, Worker
from herd.rag import ingest


async def drain(app: App) -> None:
    """Run the embed queue here until it is empty: a run's jobs, then its finalize."""
    await Worker(
        app,
        queues=[ingest.QUEUE],
        concurrency=2,
        poll_interval=0.05,
        stop_when_idle=True,
        install_signal_handlers=False,
    ).run()
