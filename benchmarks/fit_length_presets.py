"""Fit the shipped length presets (workloads/data/length_presets.json) to the public data.

Reads ../shared/data (relative to the repo root; override with --data). For each source it fits two
shapes, both Gaussian copulas of (prompt, output):
  lognormal: a clipped lognormal per column (MLE of the logs; clip = observed min/max), rho = the
             correlation of the logs;
  quantile:  a 105-knot quantile table per column (the default: it follows the data's shape),
             rho = 2 sin(pi * spearman / 6).
Fit quality is measured on 200,000 draws of the shipped sampler: two-sample KS statistic per
column and relative errors of mean/p50/p90/p99 against the source file.

    python benchmarks/fit_length_presets.py            # rewrites workloads/data/length_presets.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads.lengths import Copula, LogNormal, Quantile, read_length_columns  # noqa: E402
from workloads.rng import make_rng  # noqa: E402

SOURCES = {
    "sharegpt": ("length_stats/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                 "num_prefill_tokens", "num_decode_tokens",
                 "ShareGPT 8k filtered, Llama-2 tokenizer (project-etalon/etalon, Apache-2.0)"),
    "arxiv_summarization": ("length_stats/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
                            "num_prefill_tokens", "num_decode_tokens",
                            "arXiv summarisation 4K, Llama-2 tokenizer (microsoft/vidur, MIT)"),
    "bwb_translation": ("length_stats/bwb_stats_llama2_tokenizer_filtered_v2.csv",
                        "num_prefill_tokens", "num_decode_tokens",
                        "Bilingual Web Book en-zh translation 4K (project-etalon/etalon, Apache-2.0)"),
    "azure_code": ("azure_llm_2023/AzureLLMInferenceTrace_code.csv", "ContextTokens", "GeneratedTokens",
                   "Azure LLM inference trace 2023, code (Azure/AzurePublicDataset, CC-BY-4.0)"),
    "azure_conv": ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", "ContextTokens", "GeneratedTokens",
                   "Azure LLM inference trace 2023, conversation (Azure/AzurePublicDataset, CC-BY-4.0)"),
    "mooncake_conversation": ("mooncake_fast25/conversation_trace.jsonl", "input_length", "output_length",
                              "Mooncake FAST'25 conversation trace (kvcache-ai/Mooncake, Apache-2.0)"),
}
NUM_DRAWS = 200_000


def load(path: Path, prompt_col: str, output_col: str) -> tuple[np.ndarray, np.ndarray]:
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return (np.array([r[prompt_col] for r in rows]), np.array([r[output_col] for r in rows]))
    return tuple(read_length_columns(path, prompt_col, output_col))


def fit_column(x: np.ndarray) -> LogNormal:
    logs = np.log(x)
    return LogNormal(float(logs.mean()), float(logs.std()), int(x.min()), int(x.max()))


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    grid = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), grid, side="right") / a.size
    fb = np.searchsorted(np.sort(b), grid, side="right") / b.size
    return float(np.abs(fa - fb).max())


def quality(data: np.ndarray, draws: np.ndarray) -> dict:
    q = [50, 90, 99]
    dq, sq = np.percentile(data, q), np.percentile(draws, q)
    out = {"ks": round(ks_statistic(data, draws), 4),
           "mean_rel_err": round(float(draws.mean() / data.mean() - 1), 4)}
    out.update({f"p{p}_rel_err": round(float(s / d - 1), 4) for p, d, s in zip(q, dq, sq)})
    return out


PROBS = np.concatenate([[0, 0.001, 0.005], np.arange(1, 100) / 100, [0.995, 0.999, 1]])


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ranks = lambda x: np.argsort(np.argsort(x, kind="stable"), kind="stable")
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def lognormal_model(prompts: np.ndarray, outputs: np.ndarray) -> tuple[Copula, dict]:
    model = Copula(fit_column(prompts), fit_column(outputs),
                   float(np.corrcoef(np.log(prompts), np.log(outputs))[0, 1]))
    col = lambda ln: {"mu": round(ln.mu, 6), "sigma": round(ln.sigma, 6), "low": ln.low, "high": ln.high}
    return model, {"prompt": col(model.prompt), "output": col(model.output), "rho": round(model.rho, 6)}


def quantile_model(prompts: np.ndarray, outputs: np.ndarray) -> tuple[Copula, dict]:
    pq, oq = (np.round(np.percentile(x, PROBS * 100), 1) for x in (prompts, outputs))
    rho = round(2 * np.sin(np.pi * spearman(prompts, outputs) / 6), 6)
    model = Copula(Quantile(PROBS, pq), Quantile(PROBS, oq), rho)
    return model, {"probs": PROBS.round(4).tolist(), "prompt": pq.tolist(), "output": oq.tolist(), "rho": rho}


def fit(name: str, data_dir: Path) -> dict:
    rel, pcol, ocol, source = SOURCES[name]
    prompts, outputs = load(data_dir / rel, pcol, ocol)
    entry = {"source": source, "file": rel, "rows": int(prompts.size),
             "data_mean": {"prompt": round(float(prompts.mean()), 1), "output": round(float(outputs.mean()), 1)}}
    for shape, fitter in (("quantile", quantile_model), ("lognormal", lognormal_model)):
        model, params = fitter(prompts, outputs)
        p_draw, o_draw = model.sample(make_rng(0, f"fit:{name}:{shape}"), NUM_DRAWS)
        params["fit"] = {"prompt": quality(prompts, p_draw), "output": quality(outputs, o_draw)}
        entry[shape] = params
    return entry


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "workloads" / "data" / "length_presets.json")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    presets = {name: fit(name, args.data) for name in SOURCES}
    doc = {"_about": "(prompt, output) length presets, Gaussian copulas with quantile-table or clipped-lognormal "
                     "marginals, fitted by benchmarks/fit_length_presets.py from the public files named in "
                     "'source'/'file'. fit: KS statistic and relative errors of 200k draws vs that file.",
           "presets": presets}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for name, p in presets.items():
        for shape in ("quantile", "lognormal"):
            f = p[shape]["fit"]
            print(f"{name:22s} {shape:9s} KS prompt {f['prompt']['ks']:.3f} output {f['output']['ks']:.3f} "
                  f"mean err {f['prompt']['mean_rel_err']:+.3f}/{f['output']['mean_rel_err']:+.3f} "
                  f"rho {p[shape]['rho']:+.2f}")


if __name__ == "__main__":
    main()
