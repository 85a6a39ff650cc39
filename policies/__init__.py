"""Scheduling policies, by name."""
from __future__ import annotations

from policies.base import EngineState, Policy, SchedulerOutput
from policies.orca import OrcaPolicy
from policies.sarathi import SarathiPolicy
from policies.static import StaticBatchingPolicy
from policies.vllm import VllmV1Policy
from policies.vllm_v0 import VllmV0Policy
from kernels_cost_model.errors import ConfigError

POLICIES: dict[str, type[Policy]] = {
    policy.name: policy
    for policy in (VllmV1Policy, VllmV0Policy, OrcaPolicy, SarathiPolicy, StaticBatchingPolicy)
}


def get_policy(name: str) -> Policy:
    """A fresh policy object for `name`."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ConfigError("policy", name, f"unknown; choose from {sorted(POLICIES)}") from None


__all__ = ["POLICIES", "EngineState", "Policy", "SchedulerOutput", "get_policy"]
