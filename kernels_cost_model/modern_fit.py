"""Fit the modern kernels (MLA attention, FP8 GEMMs, MoE by weight dtype, Gated DeltaNet) from AIConfigurator's tables.

    python -m kernels_cost_model.modern_fit ../shared/data/kernel_profiles [out_dir]

writes data/calibration_modern/<gpu>.json for every system that has the tables: roofline coefficients
(roofline_fit.fit_family) per kind and variant, each with its sample count, held-out relative error,
source files and vLLM version. Hold-out: the distinct shape keys of a variant sorted, every 5th from the
3rd (rank % 5 == 2) kept out of the fit, as calibration.holdout_split does.

Cost terms: MLA per mla.py at DeepSeek-V3's shape (the tables' model); FP8 GEMMs and MoE at their bf16
byte counts (roofline.matmul / roofline.moe with 2 bytes), so the fitted coefficients price an FP8 or
MXFP4 layer through the same formulas as a bf16 one, the narrower weights showing in s_per_byte. MoE
rows are costed with the experts their balanced routing touches (roofline.balanced_experts_hit); serving
prices the fits at uniform routing's expectation (operators.FusedMoE). An FP8
GEMM computes the rows its kernel pads the batch to (operators.padded_rows), at the row step that fits
that GPU's rows best; block-scaled (fp8_block) GEMM tables are not fitted (FITTED_GEMM_DTYPES).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from . import mla
from .aiconfigurator_modern import MOE_DTYPES, gdn_rows, gemm_rows, mla_rows, moe_rows
from .modern_kernels import GDN_STATE_BYTES, gdn_chunk_rows, gdn_cost, gdn_prefill_terms
from .operators import padded_rows
from .aiconfigurator_tables import L2_BYTES, LICENCE, SYSTEMS
from .models import get_model
from .roofline import Coeffs, balanced_experts_hit, matmul, moe
from .roofline_fit import fit_family, predict_arrays
from .shape_keys import _num

OUT_DIR = Path(__file__).parent / "data" / "calibration_modern"
DTYPE_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "nvfp4": 4.5 / 8}  # nvfp4: 4 bits + fp8 scale / 16
HOLDOUT_RULE = "per variant: distinct shape keys sorted, every 5th from the 3rd (rank % 5 == 2) held out"
MIN_SHAPE_SAMPLES = 8
MLA_MODEL = "deepseek-v3"  # the shape the MLA tables were measured at (their `model` column)
#: GEMM tables fitted. The fp8_block rows were timed eagerly, without CUDA graphs: host launch time
#: (300-900 us for a 7168 x 7168 GEMM of one token on gb300) swamps the kernel, and vLLM serves from
#: graphs, so block-scaled weights are priced at the per-tensor fit (modern_kernels.GRAPHED_GEMM).
FITTED_GEMM_DTYPES = ("fp8",)
#: vLLM's MLA decode backends (their names in the tables' kernel_source) and its MLA prefill backends
#: in the order its prefill selector tries them on Blackwell (vllm/v1/attention/backends/mla/prefill/
#: selector.py: FLASH_ATTN, TRTLLM_RAGGED, FLASHINFER; Hopper and older: FLASH_ATTN only).
MLA_DECODE_KERNELS = ("FLASHMLA", "FLASH_ATTN_MLA", "FLASHINFER_MLA", "TRITON_MLA")
MLA_PREFILL_PRIORITY = ("FLASH_ATTN", "TRTLLM_RAGGED", "FLASHINFER")
#: Candidate row steps of the FP8 GEMM kernels' M tiles (operators.padded_rows; 0: no padding).
ROW_STEPS = (0, 64, 128, 256)


def _split(keys: list[tuple]) -> np.ndarray:
    """Boolean mask of held-out samples."""
    ranks = {k: i for i, k in enumerate(sorted(set(keys)))}
    return np.array([ranks[k] % 5 == 2 for k in keys], dtype=bool)


def _coeffs_json(c: Coeffs) -> dict:
    """Five significant digits: far below the fits' error, and a fifth of the file. The path and spill
    terms are written only by the families that fit them."""
    fields = ("s_per_flop", "s_per_byte", "overhead_s", "tile_rows", "s_per_seq")
    fields += tuple(f for f in ("s_per_key", "s_per_spilled_byte", "s_per_attention_flop", "s_per_chunk_row")
                    if getattr(c, f))
    return {f: float(f"{getattr(c, f):.5g}") for f in fields}


def _fit(family: str, flops, nbytes, seconds, rows, seqs, shapes, keys, sources, path=None,
         spilled=None, attention=None, chunk_rows=None) -> dict | None:
    """Coefficients of the family and of each shape (`family@shape`, shape_keys.py's format) with at
    least MIN_SHAPE_SAMPLES kept rows, fitted on the kept rows; scored on the held-out ones (each priced
    at its shape's coefficients where fitted). `path`: a critical path's units (s_per_key), `spilled`:
    bytes beyond L2 (s_per_spilled_byte), `attention`: a module's attention FLOPs, apart from `flops`
    (s_per_attention_flop), `chunk_rows`: rows of a serial in-chunk loop (s_per_chunk_row), where the
    family has them. None when too few samples."""
    f, b, t, r = (np.asarray(x, dtype=float) for x in (flops, nbytes, seconds, rows))
    s = np.zeros_like(t) if seqs is None else np.asarray(seqs, dtype=float)
    k = None if path is None else np.asarray(path, dtype=float)
    a = None if attention is None else np.asarray(attention, dtype=float)
    cr = None if chunk_rows is None else np.asarray(chunk_rows, dtype=float)
    side = None if spilled is None else np.column_stack([np.zeros_like(t)] * 3 + [np.asarray(spilled, dtype=float)])
    out = np.zeros(len(t), dtype=bool)
    groups: dict[str, list[int]] = {}
    for i, shape in enumerate(shapes):
        groups.setdefault(shape, []).append(i)
    for idx in groups.values():  # hold out within each shape, so every shape is both fitted and tested
        out[idx] = _split([keys[i] for i in idx])
    if (~out).sum() < 8 or out.sum() < 2:
        return None
    seq = None if seqs is None else s
    pick = lambda x, m: None if x is None else x[m]  # noqa: E731
    fit = lambda m: fit_family(f[m], b[m], t[m], r[m], pick(seq, m), pick(k, m), side=pick(side, m),  # noqa: E731
                               attention=pick(a, m), chunk_rows=pick(cr, m))
    family_c = fit(~out)
    coeffs, pred = {family: family_c}, np.zeros(len(t))
    for shape, idx in groups.items():
        idx = np.asarray(idx)
        kept = idx[~out[idx]]
        c = family_c
        if len(kept) >= MIN_SHAPE_SAMPLES:
            mask = np.zeros(len(t), dtype=bool)
            mask[kept] = True
            c = coeffs[f"{family}@{shape}"] = fit(mask)
        pred[idx] = predict_arrays(c, f[idx], b[idx], r[idx], pick(seq, idx), pick(k, idx), pick(side, idx),
                                   pick(a, idx), pick(cr, idx))
    err = np.abs(pred / t - 1.0)
    held = err[out]
    return {"coeffs": {k: _coeffs_json(c) for k, c in sorted(coeffs.items())},
            "samples": int((~out).sum()), "holdout_samples": int(out.sum()),
            "fit_error": {"median": round(float(np.median(err[~out])), 4)},
            "holdout_error": {"median": round(float(np.median(held)), 4), "mean": round(float(held.mean()), 4),
                              "p90": round(float(np.quantile(held, 0.9)), 4)},
            "sources": sorted(set(sources))}


def fit_mla(root, system: str) -> dict:
    """MLA fits keyed '<phase>/<kv dtype>/<gemm dtype>' (scope recorded). Generation rows whose latent KV
    fits in L2 (`_kv_in_l2`) are fitted apart as 'generation_l2/...': the collector replays one layer on
    the same tensors, so there the KV stays in L2, while serving reads it from DRAM (as
    aiconfigurator_tables splits decode attention). A module's prefill also pays its hidden states
    beyond L2 (mla.context_spilled_bytes)."""
    spec, out, l2 = get_model(MLA_MODEL), {}, L2_BYTES[system][0]
    for phase in ("context", "generation"):
        groups: dict[tuple, list] = {}
        for row in _served_rows(mla_rows(root, system, phase), phase):
            tier = "generation_l2" if phase == "generation" and _kv_in_l2(spec, row, system) else phase
            groups.setdefault((tier, row["kv_dtype"], row["gemm"], row["scope"]), []).append(row)
        for (tier, kv, gemm, scope), rows in sorted(groups.items()):
            columns, attention = _mla_columns(spec, phase, kv, gemm, scope, rows)
            spilled = [mla.context_spilled_bytes(spec, x["batch"] * x["isl"], l2, scope) if phase == "context"
                       else 0.0 for x in rows]
            fit = _fit("mla", *columns, attention=attention, spilled=spilled if any(spilled) else None)
            if fit:
                out[f"{tier}/{kv}/{gemm}"] = {"scope": scope, **fit}
    return out


def _served_rows(rows, phase: str) -> list[dict]:
    """The MLA rows of the kernels vLLM serves that phase with. A context table also times short
    prompts on an MLA decode backend (vLLM runs query rows up to its reorder threshold through the
    absorbed decode kernel: FlashMLA rows up to 128 tokens, FlashAttention-MLA up to 512, the others at
    one), which the context fit, priced as the expanded prefill, leaves out; and where two prefill
    backends timed the same case (B200 class, fp8 KV: FLASH_ATTN and TRTLLM_RAGGED), it keeps the one
    vLLM's prefill selector tries first (FLASH_ATTN)."""
    rows = list(rows)
    if phase != "context":
        return rows
    served = [x for x in rows if x["kernel"] not in MLA_DECODE_KERNELS]
    kernels = {x["kernel"] for x in served}
    first = next((k for k in MLA_PREFILL_PRIORITY if k in kernels), None)
    return [x for x in served if first is None or x["kernel"] == first or x["kernel"] not in MLA_PREFILL_PRIORITY]


def _kv_in_l2(spec, row: dict, system: str) -> bool:
    """Whether a generation row's latent KV (kv_lora_rank + rope dims a key) fits in the GPU's L2."""
    keys = row["batch"] * (row["step"] + 1)
    width = spec.kv_lora_rank + spec.qk_rope_head_dim
    return keys * width * DTYPE_BYTES[row["kv_dtype"]] <= L2_BYTES[system][0]


def _mla_columns(spec, phase: str, kv: str, gemm: str, scope: str, rows: list[dict]) -> tuple[list, list | None]:
    """`_fit`'s columns for MLA rows of one phase and variant, and the attention FLOPs of a module's
    prefill rows (mla.split_context; None where one rate prices all)."""
    cols, attention = [[], [], [], [], [], [], [], []], []
    kvb, wb = DTYPE_BYTES[kv], DTYPE_BYTES[gemm]
    for x in rows:
        if phase == "generation":
            fb = mla.generation_cost(spec, x["heads"], x["batch"], x["batch"] * (x["step"] + 1), kvb, wb, scope)
            r = x["batch"]
        else:
            tok, isl = x["batch"] * x["isl"], x["isl"]
            *fb, a = mla.split_context(spec, x["heads"], tok, x["batch"] * isl * (isl + 1) / 2, 0.0, kvb, wb, scope)
            attention.append(a)
            r = isl
        for col, v in zip(cols, (*fb, x["seconds"], r, x["batch"], _num(x["heads"]),
                                 (x["batch"], x["isl"], x["step"]), x["source"])):
            col.append(v)
    return cols, (attention if any(attention) else None)


def fit_gemm(root, system: str) -> dict:
    """FP8 GEMM fits per weight dtype, each at the row step (operators.padded_rows) that fits its own
    samples best (no coefficient is added: the step only says which rows the kernel computes)."""
    out = {}
    for dtype in FITTED_GEMM_DTYPES:
        rows = list(gemm_rows(root, system, dtype))
        by_step = {step: _fit_gemm_rows(rows, step) for step in ROW_STEPS}
        if not by_step[0]:
            continue
        step = min(ROW_STEPS, key=lambda s: by_step[s]["fit_error"]["median"])
        out[dtype] = {**by_step[step], "row_step": step,
                      "row_step_fit_error": {str(s): by_step[s]["fit_error"]["median"] for s in ROW_STEPS},
                      "kernels": sorted({x["kernel"] for x in rows})}
    return out


def _fit_gemm_rows(rows: list[dict], step: int) -> dict | None:
    """`_fit` of GEMM rows whose compute covers padded_rows(m, step) rows (step 0: m rows), as
    operators.MatmulOp prices them."""
    computed = [padded_rows(x["m"], step) if step else x["m"] for x in rows]
    costs = [matmul(x["m"], x["n"], x["k"], 2) for x in rows]
    flops = [f * c / x["m"] for (f, _), c, x in zip(costs, computed, rows)]
    return _fit("matmul", flops, [c[1] for c in costs], [x["seconds"] for x in rows],
                computed, None, [f"{_num(x['n'])}x{_num(x['k'])}" for x in rows],
                [(x["m"],) for x in rows], [x["source"] for x in rows])


def fit_moe(root, system: str) -> dict:
    out = {}
    for dtype in MOE_DTYPES:
        rows = list(moe_rows(root, system, dtype))
        hit = [balanced_experts_hit(x["tokens"], x["experts"], x["top_k"]) for x in rows]  # as the tables route
        costs = [moe(x["tokens"], x["hidden"], x["inter"], x["experts"], x["top_k"], 2, h) for x, h in zip(rows, hit)]
        tile = [max(x["tokens"] * x["top_k"] / h, 1.0) for x, h in zip(rows, hit)]
        shapes = ["/".join(_num(x[c]) for c in ("hidden", "inter", "experts", "top_k")) for x in rows]
        routed = [x["tokens"] * x["top_k"] for x in rows]  # rows its per-row kernels handle (operator_seqs)
        fit = _fit("moe", [c[0] for c in costs], [c[1] for c in costs], [x["seconds"] for x in rows], tile, routed,
                   shapes, [(x["tokens"],) for x in rows], [x["source"] for x in rows])
        if fit:
            out[dtype] = fit
    return out


def fit_gdn(root, system: str) -> dict:
    """Gated DeltaNet layer fits per phase, per (key heads, value heads) shape (modern_kernels.gdn_cost).
    Decode rows whose recurrent states fit in L2 are fitted apart ("generation_l2"): the collector
    replays one layer, so there the states stay in L2, while serving reads them from DRAM. Prefill rows
    also pay their sequences' serial chunk path and the intermediates beyond L2 (gdn_prefill_terms), and
    the serial row loop inside a chunk (gdn_chunk_rows)."""
    out = {}
    rows = gdn_rows(root, system)
    l2 = L2_BYTES[system][0]
    for phase in ("context", "generation", "generation_l2"):
        sel = [x for x in rows if _gdn_tier(x, l2) == phase]
        costs = [gdn_cost(x["batch"] * x["seq_len"], x["batch"], x["k_heads"], x["k_dim"], x["v_heads"], x["v_dim"])
                 for x in sel]
        path = spilled = chunk_rows = None
        if phase == "context" and sel:
            path, spilled = zip(*(gdn_prefill_terms([x["seq_len"]] * int(x["batch"]), x["k_dim"], x["v_heads"],
                                                    x["v_dim"], l2) for x in sel))
            chunk_rows = [gdn_chunk_rows([x["seq_len"]]) for x in sel]
        fit = _fit("gdn", [c[0] for c in costs], [c[1] for c in costs], [x["seconds"] for x in sel],
                   [x["seq_len"] for x in sel], [x["batch"] for x in sel],
                   [f"{_num(x['k_heads'])}/{_num(x['v_heads'])}" for x in sel],
                   [(x["batch"], x["seq_len"]) for x in sel], [x["source"] for x in sel], path=path, spilled=spilled,
                   chunk_rows=chunk_rows)
        if fit:
            out[phase] = fit
    return out


def _gdn_tier(row: dict, l2_bytes: float) -> str:
    """A GDN row's fit: "context", or "generation" / "generation_l2" by whether the batch's recurrent
    states (fp32 in the tables: GDN_STATE_BYTES) fit in L2."""
    if row["phase"] == "context":
        return "context"
    states = row["batch"] * row["v_heads"] * row["k_dim"] * row["v_dim"] * GDN_STATE_BYTES
    return "generation_l2" if states <= l2_bytes else "generation"


def fit_system(root, system: str) -> dict:
    result = {"device": SYSTEMS[system], "mla": fit_mla(root, system), "gemm": fit_gemm(root, system),
              "moe": fit_moe(root, system), "gdn": fit_gdn(root, system)}
    result["provenance"] = {"kind": "aiconfigurator-modern", "licence": LICENCE, "holdout_rule": HOLDOUT_RULE,
                            "mla_shape": MLA_MODEL, "fitted_by": "kernels_cost_model.modern_fit",
                            "gemm_not_fitted": {"fp8_block": "timed without CUDA graphs (host launch time "
                                                "swamps the kernel); priced at the fp8 fit"},
                            "row_step_rule": "per GEMM dtype, the step of operators.padded_rows among "
                                             f"{list(ROW_STEPS)} with the least median error on the fitted rows"}
    return result


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    root, out_dir = Path(argv[0]), Path(argv[1]) if len(argv) > 1 else OUT_DIR
    if not (root / "aiconfigurator").is_dir():
        print(f"modern_fit: no AIConfigurator tables under {root}/aiconfigurator (give the kernel_profiles folder "
              f"of ../shared/data)", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    for system in SYSTEMS:
        result = fit_system(root, system)
        if not (result["mla"] or result["gemm"] or result["moe"] or result["gdn"]):
            continue
        path = out_dir / f"{result['device']}.json"
        path.write_text(json.dumps(result, sort_keys=True, separators=(",", ":")) + "\n")
        for kind in ("mla", "gemm", "moe", "gdn"):
            for variant, fit in result[kind].items():
                e = fit["holdout_error"]
                print(f"{result['device']:14s} {kind:4s} {variant:32s} n={fit['samples']:6d} "
                      f"held-out median {e['median']:.1%} mean {e['mean']:.1%} p90 {e['p90']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
