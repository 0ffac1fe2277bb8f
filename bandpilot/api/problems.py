"""Every error is one JSON object ``{"error": "...", "status": N}``: the library's one-line messages
mapped to HTTP status codes, FastAPI's validation lists folded into one line."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bandpilot.errors import BandPilotError, RequestError, StateError
from bandpilot.queue.intake import SubmitError
from bandpilot.queue.store import StoreError


def problem(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


def status_for(exc: BaseException) -> int:
    """Which HTTP status a library error means."""
    msg = str(exc)
    if isinstance(exc, StoreError):
        return 503 if "busy" in msg else 500
    if isinstance(exc, SubmitError):
        return 409 if "already exists" in msg or "concurrently" in msg else 422
    if isinstance(exc, StateError):
        missing = (msg.startswith("no ") and "(request " not in msg) or "unknown GPU, host or domain" in msg
        return 404 if missing else 409
    if isinstance(exc, RequestError):
        return 409 if "not pending" in msg else 422
    return 400


def _validation_line(exc: RequestValidationError) -> tuple[int, str]:
    errs: list[dict[str, Any]] = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errs):
        return 400, "malformed JSON body"
    def line(e: dict[str, Any]) -> str:
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        if e.get("type") == "extra_forbidden":
            return f"unknown field {where!r}"
        return f"{where}: {e.get('msg', 'invalid')}"

    # every problem, so a client fixes them all in one round trip
    return 422, "; ".join(line(e) for e in errs) or "body: invalid"


def install(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return problem(*_validation_line(exc))

    @app.exception_handler(BandPilotError)
    async def _library(_: Request, exc: BandPilotError) -> JSONResponse:
        return problem(status_for(exc), str(exc))
