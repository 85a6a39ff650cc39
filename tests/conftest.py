"""Hypothesis profiles: `ci` is bounded (CI=true), `dev` the default, `thorough` runs thousands.

Choose with HYPOTHESIS_PROFILE=thorough pytest.
"""
import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=60, derandomize=True, **_COMMON)
settings.register_profile("dev", max_examples=300, **_COMMON)
settings.register_profile("thorough", max_examples=3000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _default_engine_mode(mode: str) -> None:
    """SERVESIM_ENGINE_MODE=step runs the whole suite on the step-by-step reference engine (the
    default is "fast"; both must pass every test)."""
    import dataclasses

    from sim.core.config import ENGINE_MODES, EngineConfig
    if mode not in ENGINE_MODES:
        raise ValueError(f"SERVESIM_ENGINE_MODE={mode!r}: choose from {ENGINE_MODES}")
    names = [f.name for f in dataclasses.fields(EngineConfig)]
    defaults = list(EngineConfig.__init__.__defaults__)
    defaults[names.index("mode") - (len(names) - len(defaults))] = mode
    EngineConfig.__init__.__defaults__ = tuple(defaults)


if os.environ.get("SERVESIM_ENGINE_MODE"):
    _default_engine_mode(os.environ["SERVESIM_ENGINE_MODE"])
