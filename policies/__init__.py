"""servesim: policies."""
