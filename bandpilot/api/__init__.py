"""The dispatcher as a network service: a REST API with per-tenant bearer tokens and the operators'
web dashboard, both thin over the queue functions (``bandpilot api --store URL``)."""

from bandpilot.api.app import create_app
from bandpilot.api.server import serve

__all__ = ["create_app", "serve"]
