"""servesim: kernels_cost_model."""
