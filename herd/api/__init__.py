"""herd's HTTP API, dashboard and metrics (`herd serve`), and `herd status`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from herd.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # FastAPI is imported on first use, not by every `herd` command that loads the CLI.
    if name == "create_app":
        from herd.api.app import create_app

        return create_app
    raise AttributeError(name)
