"""servesim's version: one place, read by pyproject.toml (dynamic version) and recorded in every summary."""
__version__ = "0.1.0"
