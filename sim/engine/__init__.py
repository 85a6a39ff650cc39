"""The engine step and its SimPy processes, built on the core, the policies and the workloads."""
from sim.engine.engine import Engine
from sim.engine.simulation import run_engine

__all__ = ["Engine", "run_engine"]
