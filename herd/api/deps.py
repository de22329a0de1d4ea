"""What routes share: the server's herd App, as a FastAPI dependency."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from herd.app import App


def _herd(request: Request) -> App:
    app: App = request.app.state.herd
    return app


HerdApp = Annotated[App, Depends(_herd)]
