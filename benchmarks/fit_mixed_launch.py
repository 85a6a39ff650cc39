"""Decode rows beside a prefill chunk on FA2 GPUs: the mechanism's figures and their held-out error.

    python benchmarks/fit_mixed_launch.py [--profiles ../shared/data/kernel_profiles] [--search]

Prices every measured mixed launch of LLMServingSim's vLLM 0.19 profiles (casys-kaist/LLMServingSim
profiler/perf/<hw>/*/attention.csv, MIT; one chunk beside n decodes of one context; RTX PRO 6000 and
RTX 4090) with the serving cost model (kernels_cost_model/mixed_launch.py) at the shipped calibrations
and prints the error on the held-out split (per GPU: distinct shapes sorted, every 5th from the 3rd),
beside the measured mixed-batch rates it replaces. `--search` reruns the grid search of the four figures
on the fit split (both GPUs together; see `search`): the shipped values are its best.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import warnings
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model import mixed_launch  # noqa: E402
from kernels_cost_model.batch import BatchShape  # noqa: E402
from kernels_cost_model.builder import make_cost_model  # noqa: E402
from kernels_cost_model.llmservingsim_profiles import read_mixed_launches  # noqa: E402

#: LLMServingSim hardware folder -> the calibration the replays of that GPU use.
GPUS = {"RTXPRO6000": ("rtx-pro-6000", "rtx-pro-6000@vllm-0.19"), "RTX4090": ("rtx-4090", "default")}
GRID = {"EMPTY_UNIT_S": (0.3e-6, 0.35e-6), "UNIT_WAVE_S": (0.5e-6, 1e-6, 2e-6),
        "DRAM_EFFICIENCY": (0.9, 0.95), "PAIR_WINDOW": (1.0, 1.15, 1.3, 1.5)}


def shape(r: dict) -> tuple:
    return r["model"], r["tp"], r["chunk"], r["kv_prefill"], r["n_decode"], r["kv_decode"]


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(fit rows, held-out rows): every 5th distinct shape from the 3rd is held out."""
    held = {k for i, k in enumerate(sorted({shape(r) for r in rows})) if i % 5 == 2}
    return [r for r in rows if shape(r) not in held], [r for r in rows if shape(r) in held]


def attention_s(rows: list[dict], gpu: str, calibration: str, rates_only: bool = False) -> list[float]:
    """The serving model's attention time of one layer for each row (`rates_only`: the measured mixed-batch
    rates instead of the mechanism)."""
    models, out = {}, []
    for r in rows:
        key = (r["model"], r["tp"])
        if key not in models:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cm = make_cost_model(r["model"].split("/")[1], gpu, r["tp"], calibration=calibration,
                                     enforce_eager=True, cpu_overhead=False)
            models[key] = dataclasses.replace(cm, mixed_launch=()) if rates_only else cm
        cm = models[key]
        n = r["n_decode"]
        b = cm.breakdown(BatchShape([r["chunk"]] + [1] * n, [r["kv_prefill"]] + [r["kv_decode"]] * n, n + 1))
        out.append((b["prefill_attention"] + b["decode_attention"]) / cm.layers)
    return out


def errors(rows: list[dict], priced: list[float]) -> dict[str, tuple[int, float, float]]:
    """{bucket: (rows, median error, median |error|)} for all rows and those of more / at most 64 decodes."""
    rel = [(p / r["measured_s"] - 1.0, r["n_decode"]) for r, p in zip(rows, priced)]
    out = {}
    for name, keep in (("all", lambda n: True), ("> 64 decodes", lambda n: n > 64), ("<= 64 decodes", lambda n: n <= 64)):
        e = [x for x, n in rel if keep(n)]
        if e:
            out[name] = (len(e), median(e), median(abs(x) for x in e))
    return out


def search(data: dict) -> None:
    """Every combination of GRID on the fit split; the best minimises the sum over both GPUs of the median
    |error| of all launches and of those past 64 decodes."""
    best = None
    for values in itertools.product(*GRID.values()):
        for name, v in zip(GRID, values):
            setattr(mixed_launch, name, v)
        line, score = [], 0.0
        for hw, (fit, _held) in data.items():
            gpu, cal = GPUS[hw]
            e = errors(fit, attention_s(fit, gpu, cal))
            score += e["all"][2] + e["> 64 decodes"][2]
            line.append(f"{hw} {100 * e['all'][2]:.1f} % (> 64: {100 * e['> 64 decodes'][2]:.1f} %)")
        print(dict(zip(GRID, values)), "fit |error|:", "; ".join(line), flush=True)
        if best is None or score < best[0]:
            best = (score, dict(zip(GRID, values)))
    print("best:", best[1])


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "kernel_profiles")
    parser.add_argument("--search", action="store_true", help="rerun the grid search on the fit split")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not (args.profiles / "llmservingsim").is_dir():
        print(f"no LLMServingSim profiles under {args.profiles}")
        return 1
    data = {hw: split(list(read_mixed_launches(args.profiles, hw))) for hw in GPUS}
    if args.search:
        search(data)
        return 0
    for hw, (_fit, held) in data.items():
        gpu, cal = GPUS[hw]
        old, new = errors(held, attention_s(held, gpu, cal, True)), errors(held, attention_s(held, gpu, cal))
        for bucket in new:
            n, m0, a0 = old[bucket]
            _, m1, a1 = new[bucket]
            print(f"{hw:10s} held out {bucket:14s} n={n:6d}  measured rates: median {100 * m0:+5.1f} % "
                  f"|{100 * a0:4.1f} %|   units in waves: median {100 * m1:+5.1f} % |{100 * a1:4.1f} %|")
    return 0


if __name__ == "__main__":
    sys.exit(main())
