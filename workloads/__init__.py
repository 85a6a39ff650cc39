"""servesim: workloads."""
