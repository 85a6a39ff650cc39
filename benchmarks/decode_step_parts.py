"""A decode step's parts on one GPU: where the composed step's time goes, against the price of each part.

    python benchmarks/decode_step_parts.py                                     # the check (no GPU)
    python benchmarks/decode_step_parts.py --measure --gpu h100-sxm --out DIR  # on an NVIDIA GPU (torch only)

`decode_step_composed.py` times whole decode steps of one rank built from the kernels vLLM runs; at 128 and
256 requests of one TP 4 rank of Llama-3.1-70B servesim's price falls 5-14 % below them. This times the
same rank's step in parts, each part in a CUDA graph of its own (median of 20 replays, the composed
step's weights, operators and batches), so the gap can be put on a part:

- `no_attention`: the whole step with the FlashAttention launch left out (its output taken to be the
  query; the KV-cache write stays), which needs no FlashAttention build;
- `matmuls`: the step's matmuls alone, in the step's order (QKV, O, gate-up and down per layer; the LM head);
- `kv_write_two`: the KV-cache write as the composed step does it, two copies a layer (K, then V);
- `kv_write_one`: the write as vLLM's `reshape_and_cache_flash` does it, one kernel a layer writing K and V
  (here one strided copy of the QKV output's K and V columns into a cache holding both).

The check (no GPU) reads `<gpu>-decode-step-parts.csv` beside the composed steps and prints, per rank and
batch: the matmuls measured against their price (QKV, O, MLP and LM head summed); the rest of the step
without attention (norms, rotary embedding, activation, embedding, argmax and the gaps between
kernels: `no_attention` less `matmuls` and `kv_write_two`) against the norms and activations' price;
and the attention in the step (composed step less `no_attention`, less the second copy vLLM does not make)
against the decode attention's price, which includes vLLM's layer around the kernel. The composed steps
were timed on another machine of the same kind, so that difference carries both machines' noise.
"""
from __future__ import annotations

import csv
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from decode_step_composed import (DEVICE, GPUS, Rank, for_each_rank, measured_csv, priced_parts,  # noqa: E402
                                  read as read_steps, time_step)
from fa3_paged_decode import measure_or_check, measure_or_check_parser  # noqa: E402

#: the TP 4 rank first: its large batches are the gap this looks for
RANKS = (("llama-3.1-70b", 4), ("llama-3.1-70b", 8), ("llama-3.1-8b", 1))
BATCHES = (1, 32, 128, 256)
CONTEXTS = (128, 1024)
PARTS = ("no_attention", "matmuls", "kv_write_two", "kv_write_one")
COLUMNS = ("model", "tp", "layers", "batch", "context", "part", "measured_s", "p10_s", "p90_s", "device", "source")
MATMUL_TERMS = ("qkv_proj", "o_proj", "mlp", "lm_head")


class PartsRank(Rank):
    """A `Rank` whose step can be built in parts (`part(name, batch, context)` returns a callable)."""

    def part(self, name: str, batch: int, context: int):
        return getattr(self, name)(batch, context)

    def _widths(self) -> tuple[int, int]:
        return self.s["heads"] * self.s["head_dim"], self.s["kv_heads"] * self.s["head_dim"]

    def no_attention(self, batch: int, context: int):
        """The composed step (`Rank.step`) with the attention launch left out."""
        torch = self.torch
        ids = torch.randint(0, self.s["vocab"], (batch,), device=DEVICE)
        positions = torch.full((batch,), context, dtype=torch.long, device=DEVICE)
        write = self._write_two(batch, context)

        def attention(cache, q, k, v):  # its KV write only; the query stands for its output
            write(cache, k, v)
            return q.contiguous()
        return self.layers_around(ids, positions, attention)

    def matmuls(self, batch: int, context: int):
        """The step's matmuls in order, each on an input of its own shape (no operator between them)."""
        torch, s = self.torch, self.s
        q_width, _ = self._widths()

        def rows(width):
            return torch.randn(batch, width, device=DEVICE, dtype=self.dtype) * 0.1
        h, a, m = rows(s["hidden"]), rows(q_width), rows(s["inter"])
        linear = torch.nn.functional.linear

        def fn():
            for w in self.layers:
                linear(h, w["qkv"])
                linear(a, w["o"])
                linear(h, w["gate_up"])
                linear(m, w["down"])
            return linear(h, self.lm_head)
        return fn

    def _kv_rows(self, batch: int):
        _, kv_width = self._widths()
        return self.torch.randn(batch, 2 * kv_width, device=DEVICE, dtype=self.dtype)

    def _write_two(self, batch: int, context: int):
        kvh, hd = self.s["kv_heads"], self.s["head_dim"]

        def write(cache, k, v):
            kc, vc = cache
            kc[:batch, context] = k.view(batch, kvh, hd)
            vc[:batch, context] = v.view(batch, kvh, hd)
        return write

    def kv_write_two(self, batch: int, context: int):
        """Every layer's KV-cache write as the composed step makes it: K, then V."""
        kv = self._kv_rows(batch)
        k, v = kv.chunk(2, dim=-1)
        write = self._write_two(batch, context)

        def fn():
            for cache in self.caches:
                write(cache, k, v)
        return fn

    def kv_write_one(self, batch: int, context: int):
        """Every layer's KV-cache write in one copy of K and V (the cache's two halves are one tensor)."""
        kvh, hd = self.s["kv_heads"], self.s["head_dim"]
        kv = self._kv_rows(batch).view(batch, 2, kvh, hd).transpose(0, 1)

        def fn():
            for cache in self.caches:
                cache[:, :batch, context].copy_(kv)
        return fn


def measure(gpu: str, out_dir: Path, budget_s: float) -> Path:
    import torch
    started = time.perf_counter()
    path = out_dir / f"{gpu}-decode-step-parts.csv"
    with measured_csv(torch, path, COLUMNS, "one rank composed of the kernels vLLM runs, in parts, CUDA graph "
                      "per part") as (writer, f, source):

        def measure_rank(model, tp, shapes, rank):
            for context in CONTEXTS:
                for batch in BATCHES:
                    for name in PARTS:
                        med, p10, p90 = time_step(torch, rank.part(name, batch, context))
                        writer.writerow((model, tp, shapes["layers"], batch, context, name, med, p10, p90, gpu,
                                         source))
                        f.flush()
                    print(f"{model} TP{tp} batch {batch} context {context} done at "
                          f"{time.perf_counter() - started:.0f} s", flush=True)
        for_each_rank(torch, RANKS, budget_s,
                      lambda ops, shapes: PartsRank(torch, None, ops, shapes, max(CONTEXTS) + 1), measure_rank)
    return path


def read(path: Path) -> dict:
    """{(model, tp, batch, context): {part: median seconds}}."""
    parts: dict = {}
    with path.open() as f:
        for r in csv.DictReader(f):
            key = (r["model"], int(r["tp"]), int(r["batch"]), int(r["context"]))
            parts.setdefault(key, {})[r["part"]] = float(r["measured_s"])
    return parts


def attribution(key: tuple, parts: dict, step_s: float | None, gpu: str) -> list[tuple[str, float, float]]:
    """(part, measured s, priced s) for the matmuls, the rest without attention, and the attention."""
    model, tp, batch, context = key
    row = {"model": model, "tp": tp, "batch": batch, "context": context}
    price, capped = priced_parts(row, gpu), priced_parts(row, gpu, "sustained")
    rest = parts["no_attention"] - parts["matmuls"] - parts["kv_write_two"]
    rows = [("matmuls", parts["matmuls"], sum(price[term] for term in MATMUL_TERMS)),
            ("matmuls, sustained clocks", parts["matmuls"], sum(capped[term] for term in MATMUL_TERMS)),
            ("norms, rope, activation, gaps", rest, price["norms_activations"])]
    if step_s is not None:
        attention = step_s - parts["no_attention"] + parts["kv_write_one"]
        rows.append(("attention + KV write (vLLM's)", attention, price["decode_attention"]))
    return rows


def check() -> None:
    from kernels_cost_model.gpu_calibration import MEASURED_DIR
    for gpu in GPUS:
        path = MEASURED_DIR / f"{gpu}-decode-step-parts.csv"
        if not path.is_file():
            continue
        steps_path = MEASURED_DIR / f"{gpu}-decode-steps.csv"
        steps = {(r["model"], r["tp"], r["batch"], r["context"]): r["measured_s"]
                 for r in (read_steps(steps_path) if steps_path.is_file() else [])}
        print(f"-- {gpu}: a step's parts measured against their price (ms)")
        print(f"   {'model':14s} {'tp':>2s} {'context':>7s} {'batch':>5s} {'part':32s} {'measured':>9s} "
              f"{'priced':>8s} {'error':>7s}")
        errors: dict = {}
        for key, parts in read(path).items():
            for name, measured, price in attribution(key, parts, steps.get(key), gpu):
                errors.setdefault(name, []).append(price / measured - 1.0)
                print(f"   {key[0]:14s} {key[1]:2d} {key[3]:7d} {key[2]:5d} {name:32s} {measured * 1e3:9.3f} "
                      f"{price * 1e3:8.3f} {100 * errors[name][-1]:+6.1f}%")
            writes = parts["kv_write_two"], parts["kv_write_one"]
            print(f"   {'':31s} KV write, two copies {writes[0] * 1e3:.3f} ms, one {writes[1] * 1e3:.3f} ms")
        for name, values in errors.items():
            print(f"   {name}: median error {100 * statistics.median(values):+.1f} %, "
                  f"median |error| {100 * statistics.median(abs(e) for e in values):.1f} % ({len(values)})")


def build_parser():
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    return measure_or_check_parser(__doc__.splitlines()[0], "parts", 300.0, "no further rank is started")


def main(argv: list[str] | None = None) -> int:
    return measure_or_check(build_parser(), argv, measure, check)


if __name__ == "__main__":
    raise SystemExit(main())
