"""The `servesim` command line: run, plot, report, sweep, capacity, calibrate."""
from sim.cli.main import main

__all__ = ["main"]
