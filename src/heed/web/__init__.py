"""The browser UI: static files (plain ES modules and CSS, no build step) served by heed.

``GET /`` serves the single page; its assets live under ``/ui/``. Nothing is
fetched from a CDN: every file the page loads ships in this package.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["STATIC_DIR", "mount_web"]

STATIC_DIR = Path(__file__).parent / "static"


def mount_web(app: FastAPI) -> None:
    """Serve the UI at ``/`` and its assets at ``/ui``."""

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/ui", StaticFiles(directory=STATIC_DIR), name="ui")
