"""The ASGI layer in front of the app: what every request must pass before routing, and the headers
every response carries.

- Bodies over ``max_body`` bytes: 413, before the app parses them (chunked ones included).
- Paths over ``max_path`` characters: 414; control characters (NUL included) in the path or the query
  string: 422. Both are refused here so no id, filter or name with them ever reaches the database
  (PostgreSQL refuses NUL in text with an error, not a "no such row").
- Security headers on everything: a Content-Security-Policy (the dashboard's inline script allowed by
  its hash, nothing else), ``X-Frame-Options: DENY``, ``nosniff``, ``Referrer-Policy: no-referrer``.

One plain ASGI callable rather than several middlewares: each middleware layer costs every request."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any, Sequence
from urllib.parse import unquote_to_bytes

MAX_BODY = 64 * 1024  # a request is a few hundred bytes; anything near this is abuse or a mistake
MAX_PATH = 2048
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")

_COMMON = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
           (b"referrer-policy", b"no-referrer")]
API_CSP = "default-src 'none'; frame-ancestors 'none'"
# Swagger UI and ReDoc load their scripts and styles from jsDelivr (FastAPI's defaults)
DOCS_CSP = ("default-src 'none'; script-src 'unsafe-inline' https://cdn.jsdelivr.net; style-src 'unsafe-inline' "
            "https://cdn.jsdelivr.net https://fonts.googleapis.com; font-src https://fonts.gstatic.com; "
            "img-src 'self' data: https://fastapi.tiangolo.com https://cdn.redoc.ly; connect-src 'self'; "
            "worker-src blob:; frame-ancestors 'none'")


def page_csp(html: str) -> str:
    """The dashboard's policy: its own inline scripts by SHA-256 (an injected one will not run),
    styles inline (no script runs from a style), fetches to this origin only."""
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in scripts)
    return (f"default-src 'none'; script-src {hashes or chr(39) + 'none' + chr(39)}; style-src 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def problem_bytes(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 error response (connection closed), for the protocol layer below ASGI."""
    from http import HTTPStatus

    data = json.dumps({"error": message, "status": status}).encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode(), b"content-type: application/json",
            b"content-length: " + str(len(data)).encode(), b"connection: close",
            *(k + b": " + v for k, v in _COMMON), b"content-security-policy: " + API_CSP.encode()]
    return b"\r\n".join(head) + b"\r\n\r\n" + data


async def send_problem(send: Any, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps({"error": message, "status": status}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *_COMMON, (b"content-security-policy", API_CSP.encode()), *headers]})
    await send({"type": "http.response.body", "body": data})


class Guard:
    """See the module docstring. ``page_paths``: paths served with ``page_policy`` (the dashboard)."""

    def __init__(self, app: Any, *, max_body: int = MAX_BODY, max_path: int = MAX_PATH,
                 page_policy: str = API_CSP, page_paths: tuple[str, ...] = ("/",)) -> None:
        self.app, self.max, self.max_path = app, int(max_body or 0), int(max_path)
        self.page_paths = page_paths
        self._page = [*_COMMON, (b"content-security-policy", page_policy.encode())]
        self._api = [*_COMMON, (b"content-security-policy", API_CSP.encode())]
        self._docs = [*_COMMON, (b"content-security-policy", DOCS_CSP.encode())]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = scope.get("raw_path") or scope["path"].encode()
        if len(raw) > self.max_path:
            return await send_problem(send, 414, f"request path over {self.max_path} characters")
        query = scope.get("query_string") or b""
        if _CONTROL.search(unquote_to_bytes(raw)) or (query and _CONTROL.search(unquote_to_bytes(query))):
            return await send_problem(send, 422, "path or query: control characters are not allowed")
        path = scope["path"]
        extra = self._page if path in self.page_paths else self._docs if path in ("/docs", "/redoc") else self._api

        async def send_with_headers(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                msg["headers"] = [*msg.get("headers", ()), *extra]
            await send(msg)

        if not self.max or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send_with_headers)
        return await self._limited(scope, receive, send, send_with_headers)

    async def _limited(self, scope: dict[str, Any], receive: Any, send: Any, send_app: Any) -> None:
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max):
            return await send_problem(send, 413, f"request body over {self.max} bytes")
        body, more = b"", True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > self.max:
                return await send_problem(send, 413, f"request body over {self.max} bytes")
            more = msg.get("more_body", False)
        done = False

        async def replay() -> dict[str, Any]:
            nonlocal done
            if not done:
                done = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send_app)
