"""What-ifs built on the engine: the last-token (hidden state) strategies and their comparison."""
from sim.whatif.last_token_whatif import compare_strategies

__all__ = ["compare_strategies"]
