"""Scheduling policies, by name."""
from __future__ import annotations

from policies.base import EngineState, Policy, SchedulerOutput
from policies.vllm import VllmV1Policy
from sim.errors import ConfigError

POLICIES: dict[str, type[Policy]] = {
    VllmV1Policy.name: VllmV1Policy,
}


def get_policy(name: str) -> Policy:
    """A fresh policy object for `name`."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ConfigError("policy", name, f"unknown; choose from {sorted(POLICIES)}") from None


__all__ = ["POLICIES", "EngineState", "Policy", "SchedulerOutput", "get_policy"]
