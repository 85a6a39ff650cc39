"""Differential conformance with vLLM's real scheduler: scenarios, servesim's and vLLM's traces, their
comparison and recorded traces (benchmarks/vllm_conformance.py drives it; README has how to install
vLLM for it without a GPU)."""
