"""uvicorn's httptools protocol, answering requests it cannot parse (e.g. a 100,000-character path)
with the API's JSON error shape instead of a plain-text 400. Named by import string in
:mod:`bandpilot.api.server` so worker processes load it too."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bandpilot.api.guard import MAX_PATH, problem_bytes


class JSONErrorsProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        if len(getattr(self, "url", b"") or b"") > MAX_PATH:
            data = problem_bytes(414, f"request path over {MAX_PATH} characters")
        else:
            data = problem_bytes(400, "malformed HTTP request")
        self.transport.write(data)
        self.transport.close()
