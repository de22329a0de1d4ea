"""herd's HTTP API, dashboard and metrics (`herd serve`), and `herd status`."""

from herd.api.app import create_app

__all__ = ["create_app"]
