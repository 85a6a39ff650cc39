"""Bytes vLLM keeps for MXFP4 expert weights (gpt-oss), which depend on the GPU's MoE kernel backend.

The checkpoint stores each routed expert's gate_up (2I x H) and down (H x I) weights as 4-bit values
with one 8-bit scale per 32 (OCP Microscaling v1.0) and BF16 biases; attention, router, embeddings,
lm_head and sinks are BF16 (priced at dtype bytes elsewhere). vLLM's `Mxfp4MoEMethod`
(vllm/model_executor/layers/quantization/mxfp4.py, `create_weights` and `process_weights_after_loading`)
then lays the experts out for the backend it picks:

- Hopper: OpenAI's Triton kernels. I rounds up to 64 (no-op for gpt-oss), biases become fp32, and
  the block scales get a swizzled copy (triton_kernels' Hopper MX scale layout pads the output rows to
  2 x num_warps(8) x 2 x 8 = 256) while the checkpoint-layout scales stay registered on the layer.
- Ampere, Ada, RTX Blackwell: Marlin. I rounds up to 128 and H to 256; scales and biases kept.
- Datacenter Blackwell: FlashInfer TRT-LLM. I and H round up to 256; scales shuffled in place;
  biases fp32.
- CDNA3 (ROCm Triton): I and H round up to 128; a strided copy of the scales; biases fp32.

Checked against vLLM's "Model loading took" lines: H100 gpt-oss-20b 13.47 GiB and gpt-oss-120b 64.38 GiB
(llm-d/llm-d-benchmark, config_explorer/empirical-vllm-memory-results.md), A100 gpt-oss-20b 13.72 GiB
(https://myoceane.fr/index.php/ai-vllm-a100-gemma-4/); tests/test_kv_sizing_vllm.py.
"""
from __future__ import annotations

from dataclasses import dataclass

MX_BLOCK = 32  # values per 8-bit scale


@dataclass(frozen=True, slots=True)
class Mxfp4Backend:
    name: str
    inter_align: int        # intermediate size per partition rounded up to this
    hidden_align: int       # hidden size rounded up to this (1 = unpadded)
    scale_copy_rows: int    # 0: scales kept once; else a second copy, output rows padded to this
    bias_bytes: int


TRITON_HOPPER = Mxfp4Backend("triton", 64, 1, 256, 4)
MARLIN = Mxfp4Backend("marlin", 128, 256, 0, 2)
FLASHINFER_SM100 = Mxfp4Backend("flashinfer-trtllm", 256, 256, 0, 4)
TRITON_ROCM = Mxfp4Backend("triton-rocm", 128, 128, 1, 4)
CHECKPOINT = Mxfp4Backend("checkpoint", 1, 1, 0, 2)


def backend_for(gpu) -> Mxfp4Backend:
    """The MXFP4 MoE backend vLLM picks on `gpu` by default (None: the checkpoint's own layout)."""
    if gpu is None:
        return CHECKPOINT
    arch = gpu.architecture
    if arch == "hopper":
        return TRITON_HOPPER
    if arch == "blackwell" and not gpu.name.startswith("rtx"):  # SM100 family; RTX Pro is SM120
        return FLASHINFER_SM100
    if arch == "cdna3":
        return TRITON_ROCM
    if arch == "xe2":  # vLLM's XPU MoE kernel: no padded layout of its own is known, so the checkpoint's
        return CHECKPOINT
    return MARLIN


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def expert_bytes(hidden: int, inter: int, backend: Mxfp4Backend) -> int:
    """Bytes of one MXFP4 expert (gate_up + down: values, scales, biases) on one GPU;
    `inter` is the intermediate size per TP partition."""
    i, h = _up(inter, backend.inter_align), _up(hidden, backend.hidden_align)
    values = (2 * i * h + h * i) // 2
    scales = (2 * i * h + h * i) // MX_BLOCK
    if backend.scale_copy_rows:
        r = backend.scale_copy_rows
        scales += _up(2 * i, r) * h // MX_BLOCK + _up(h, r) * i // MX_BLOCK
    return values + scales + (2 * i + h) * backend.bias_bytes
