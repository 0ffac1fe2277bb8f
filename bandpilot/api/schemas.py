"""Request bodies of the API: strict types (``"4"`` is not a number, ``true`` not a count, ``"yes"``
not a flag), unknown fields refused (a typo must not be silently ignored), every string free of
control characters and every number range-checked here, before anything reaches the database."""

from __future__ import annotations

import re
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from bandpilot.dispatch.constraints import Constraints
from bandpilot.errors import RequestError

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Request ids a tenant may choose: no '/' (a path segment must name it) and no control characters.
API_ID = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,199}$"
INT32_MAX = 2**31 - 1  # the store's INTEGER columns


def no_control(value: Any) -> Any:
    if isinstance(value, str) and CONTROL.search(value):
        raise ValueError("control characters are not allowed")
    return value


def _clean(value: Any) -> Any:
    """Every string in a JSON value (keys too) free of control characters."""
    if isinstance(value, str):
        no_control(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _clean(k)
            _clean(v)
    elif isinstance(value, list):
        for v in value:
            _clean(v)
    return value


# Before the type and length checks: a control character is named as such, whatever else is wrong.
Text = Annotated[str, BeforeValidator(no_control)]
JSONObject = Annotated[dict[str, Any], BeforeValidator(_clean)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SubmitBody(_Body):
    id: Optional[Annotated[Text, Field(pattern=API_ID, description="Request id (generated when omitted): 1-200 "
                                      "letters, digits or ._:@+- starting with a letter or digit.")]] = None
    k: int = Field(..., ge=1, le=1_000_000, description="Number of GPUs, all at once.")
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    utility: Optional[float] = Field(None, ge=0, le=1e12, allow_inf_nan=False)
    constraints: Optional[JSONObject] = None
    tenant: Optional[Text] = Field(None, min_length=1, max_length=200, description="Admin tokens only: submit for this tenant.")
    time_limit_s: Optional[float] = Field(None, gt=0, le=1e9, allow_inf_nan=False,
                                          description="Expected run time limit (Slurm --time), for planning.")
    comm_fraction: Optional[float] = Field(None, ge=0, le=1, allow_inf_nan=False,
                                           description="Share of the run time spent in collectives.")
    preemptible: bool = Field(False, description="The job may be checkpointed and requeued.")
    checkpoint_s: Optional[float] = Field(None, gt=0, le=1e9, allow_inf_nan=False,
                                          description="Cost of one checkpoint + restart, seconds.")
    checkpoint_every_s: Optional[float] = Field(None, gt=0, le=1e9, allow_inf_nan=False,
                                                description="Checkpoint period, seconds.")
    min_k: Optional[int] = Field(None, ge=1, le=1_000_000, description="Elastic: the fewest GPUs the job runs on (default k).")
    max_k: Optional[int] = Field(None, ge=1, le=1_000_000, description="Elastic: the most GPUs the job can use (default k).")
    k_step: Optional[int] = Field(None, ge=1, le=1_000_000, description="Elastic: sizes are min_k plus multiples of this.")
    scaling: Optional[float] = Field(None, gt=0, le=1, allow_inf_nan=False,
                                     description="Elastic: compute scaling efficiency per doubling of GPUs (0, 1]; "
                                     "growth is priced by it (default: perfect, 1).")
    shape: Optional[Union[Annotated[Text, Field(max_length=400)], JSONObject]] = Field(
        None, description="Parallelism shape: 'tp=T,pp=P,dp=D[,ep=E]' or {tp, pp, dp, ep, traffic, compute_ms, model}; "
        "k must be tp*pp*dp. The assignment then carries the rank map (launch formats follow it).")

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
    measured_gbps: Optional[float] = Field(None, ge=0, le=1e6, allow_inf_nan=False,
                                           description="Bandwidth the job measured (drift monitor).")


class TelemetryBody(_Body):
    measured_gbps: float = Field(..., ge=0, le=1e6, allow_inf_nan=False,
                                 description="Collective bus bandwidth the job measured, GB/s.")


class DrainBody(_Body):
    target: Text = Field(..., min_length=1, max_length=400, description="A GPU id, a host, or 'domain:NAME'.")
    reason: Optional[Text] = Field(None, max_length=400)


class UndrainBody(_Body):
    target: Text = Field(..., min_length=1, max_length=400)


class TokenBody(_Body):
    tenant: Text = Field(..., min_length=1, max_length=200)
    admin: bool = False
    name: Optional[Text] = Field(None, max_length=200)


class EntropyBody(_Body):
    entropy: float = Field(..., ge=0, le=1, allow_inf_nan=False, description="Normalized entropy at an epoch boundary: updates the job's entropy-guided utility.")
    epoch: Optional[int] = Field(None, ge=0, le=INT32_MAX, description="Epoch number (default: the next one).")
