"""The `servesim` command line: run, plot, sweep, capacity, calibrate."""
from sim.cli.main import main

__all__ = ["main"]
