"""Request bodies of the API: unknown fields are refused (a typo must not be silently ignored)."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from bandpilot.dispatch.constraints import Constraints
from bandpilot.errors import RequestError


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitBody(_Body):
    id: Optional[str] = Field(None, max_length=200, description="Request id (generated when omitted).")
    k: int = Field(..., ge=1, le=1_000_000, description="Number of GPUs, all at once.")
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    utility: Optional[float] = Field(None, ge=0)
    constraints: Optional[dict[str, Any]] = None
    tenant: Optional[str] = Field(None, max_length=200, description="Admin tokens only: submit for this tenant.")

    @field_validator("constraints")
    @classmethod
    def _constraints(cls, v: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        """Parsed by the one :class:`Constraints` parser (a bad one is a 422 naming it), stored normalised."""
        if v is None:
            return None
        try:
            return Constraints.parse(v).to_dict()
        except RequestError as exc:
            raise PydanticCustomError("invalid_constraints", str(exc).removeprefix("constraints: ")) from None


class ReleaseBody(_Body):
    measured_gbps: Optional[float] = Field(None, ge=0, description="Bandwidth the job measured (drift monitor).")


class TelemetryBody(_Body):
    measured_gbps: float = Field(..., ge=0, description="Collective bus bandwidth the job measured, GB/s.")


class DrainBody(_Body):
    target: str = Field(..., min_length=1, max_length=400, description="A GPU id, a host, or 'domain:NAME'.")
    reason: Optional[str] = Field(None, max_length=400)


class UndrainBody(_Body):
    target: str = Field(..., min_length=1, max_length=400)


class TokenBody(_Body):
    tenant: str = Field(..., min_length=1, max_length=200)
    admin: bool = False
    name: Optional[str] = Field(None, max_length=200)


class EntropyBody(_Body):
    entropy: float = Field(..., ge=0, le=1, description="Normalized entropy at an epoch boundary (seed 001).")
    epoch: Optional[int] = Field(None, ge=0, description="Epoch number (default: the next one).")
