"""Stage 6, scheduling: what runs where and when. Queue policies and quotas, the placer (one
request against an in-memory state, through the dispatcher) and the batch loop that writes the
decisions into the durable queue (:mod:`bandpilot.queue`) in one transaction. Reservations,
preemption and elastic resizes are plans added here, on top of the store."""

from bandpilot.scheduling.batch import COMMIT_MODES, check_model, model_version_of, run_batch
from bandpilot.scheduling.outcomes import BatchReport, Outcome
from bandpilot.scheduling.policies import POLICIES, order_pending, utility_prior, utility_quotas
from bandpilot.scheduling.profile import PROFILES, ProfileError, SchedulerProfile, get_profile, load_profile
from bandpilot.dispatch.demand import DEMAND_MODELS

__all__ = [
    "BatchReport", "COMMIT_MODES", "DEMAND_MODELS", "Outcome", "POLICIES", "PROFILES", "ProfileError", "SchedulerProfile",
    "check_model", "get_profile", "load_profile", "model_version_of", "order_pending", "run_batch", "utility_prior",
    "utility_quotas",
]
