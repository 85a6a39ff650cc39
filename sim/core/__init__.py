"""Engine core, bottom layer: request state, sampling params, stop rules, KV cache, records, invariants.

Imports nothing of servesim above it (only the cost model's leaf types and errors).
"""
