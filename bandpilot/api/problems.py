"""Every error is one JSON object ``{"error": "...", "status": N}``: the library's one-line messages
with the HTTP status their ``code`` maps to (one table), FastAPI's validation lists folded into one line."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bandpilot.errors import BandPilotError


def problem(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


#: The one table from an error's ``code`` (:attr:`BandPilotError.code`) to its HTTP status; any
#: other code is a 400.
STATUS_BY_CODE = {
    "invalid_request": 422,  # RequestError, PlacementError (a request that cannot be served as asked)
    "insufficient_gpus": 422,
    "constraint_unmet": 422,
    "duplicate_id": 409,  # the id exists (or was submitted concurrently)
    "not_pending": 409,  # cancel of a request that is no longer pending
    "conflict": 409,  # StateError: the state does not allow it
    "not_found": 404,  # the job, request, GPU or host named does not exist
    "quota_exceeded": 429,
    "store_busy": 503,
    "store_error": 500,
}


def status_for(exc: BaseException) -> int:
    """Which HTTP status a library error means: its code, through :data:`STATUS_BY_CODE`."""
    return STATUS_BY_CODE.get(getattr(exc, "code", ""), 400)


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
