"""Who may call the API? Per-tenant bearer tokens, stored hashed in the queue store.

A token reads ``bp_<id>_<secret>``: the id is public (listed, revoked by), the secret is 256 random
bits shown once at creation. Only its SHA-256 is stored - a fast hash is enough for a random secret
of that size (no password to brute-force), and it keeps authentication to one indexed lookup."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from bandpilot.errors import RequestError
from bandpilot.queue.clock import now, iso
from bandpilot.queue.schema import T_TOKENS
from bandpilot.queue.store import Store

_TOKEN_RE = re.compile(r"^bp_([a-z0-9]{10})_([A-Za-z0-9_-]{43})$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$")
_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


@dataclass(frozen=True)
class Principal:
    """The caller a valid token stands for."""

    tenant: str
    admin: bool
    token_id: str

    @property
    def actor(self) -> str:
        return f"{self.tenant} (token {self.token_id})"


def _sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not _TENANT_RE.match(tenant):
        raise RequestError(f"invalid tenant name {tenant!r}: 1-200 letters, digits or ._@+- starting with a letter or digit")
    return tenant


def create_token(store: Store, tenant: str, *, admin: bool = False, name: str | None = None) -> tuple[str, dict[str, Any]]:
    """A new token for ``tenant``; returns ``(token, record)``. The token is not stored and cannot be shown again."""
    check_tenant(tenant)
    tid = "".join(secrets.choice(_ID_ALPHABET) for _ in range(10))
    secret = secrets.token_urlsafe(32)
    token = f"bp_{tid}_{secret}"
    ts = now()
    with store.write() as conn:
        conn.execute(sa.insert(T_TOKENS).values(id=tid, tenant=tenant, admin=bool(admin), secret_sha256=_sha(token),
                                                name=(name or None), created_at=ts, revoked_at=None))
    return token, {"id": tid, "tenant": tenant, "admin": bool(admin), "name": name, "created": iso(ts), "revoked": None}


def list_tokens(store: Store, tenant: str | None = None, *, include_revoked: bool = False) -> list[dict[str, Any]]:
    q = sa.select(T_TOKENS).order_by(T_TOKENS.c.created_at, T_TOKENS.c.id)
    if tenant:
        q = q.where(T_TOKENS.c.tenant == tenant)
    if not include_revoked:
        q = q.where(T_TOKENS.c.revoked_at.is_(None))
    with store.read() as conn:
        rows = conn.execute(q).mappings().all()
    return [{"id": r["id"], "tenant": r["tenant"], "admin": bool(r["admin"]), "name": r["name"],
             "created": iso(r["created_at"]), "revoked": iso(r["revoked_at"])} for r in rows]


def revoke(store: Store, *, token_id: str | None = None, tenant: str | None = None) -> list[str]:
    """Revoke one token, or every token of a tenant (a deleted tenant); returns the revoked ids."""
    if (token_id is None) == (tenant is None):
        raise RequestError("revoke needs exactly one of a token id or a tenant")
    cond = T_TOKENS.c.id == token_id if token_id is not None else T_TOKENS.c.tenant == tenant
    with store.write() as conn:
        ids = list(conn.execute(sa.select(T_TOKENS.c.id).where(cond, T_TOKENS.c.revoked_at.is_(None))).scalars())
        if not ids:
            raise RequestError(f"no active token {token_id!r}" if token_id is not None
                               else f"tenant {tenant!r} has no active token")
        conn.execute(sa.update(T_TOKENS).where(T_TOKENS.c.id.in_(ids)).values(revoked_at=now()))
    return ids


def token_id(token: str | None) -> str | None:
    """The public id of a well-formed token (None for anything else)."""
    m = _TOKEN_RE.match(token or "")
    return None if m is None else m.group(1)


def principal_of(row: Any, token: str) -> Principal | None:
    """The principal of ``token`` given its ``bp_tokens`` row (tenant, admin, secret_sha256,
    revoked_at; None: no such id); None if revoked or the secret does not match."""
    if row is None or row["revoked_at"] is not None or not hmac.compare_digest(row["secret_sha256"], _sha(token)):
        return None
    return Principal(row["tenant"], bool(row["admin"]), token[3:13])


#: The one lookup authentication needs (also run by the API's async PostgreSQL path).
TOKEN_LOOKUP = sa.select(T_TOKENS.c.tenant, T_TOKENS.c.admin, T_TOKENS.c.secret_sha256,
                         T_TOKENS.c.revoked_at).where(T_TOKENS.c.id == sa.bindparam("id"))


def authenticate(store: Store, token: str | None) -> Principal | None:
    """The principal of a valid, unrevoked token; None for anything else (malformed, unknown, revoked)."""
    tid = token_id(token)
    if tid is None:
        return None
    with store.read(snapshot=False) as conn:
        r = conn.execute(TOKEN_LOOKUP, {"id": tid}).mappings().first()
    return principal_of(r, token)  # type: ignore[arg-type]
