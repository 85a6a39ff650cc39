"""Matmuls in short bursts against the same matmuls back to back for a whole step: clocks and power.

    python benchmarks/matmul_sustained.py                                     # the check (no GPU)
    python benchmarks/matmul_sustained.py --measure --gpu h200 --out DIR      # on an NVIDIA GPU (torch only)

`decode_step_parts.py` found one TP 4 rank of Llama-3.1-70B's matmuls, run in order for a whole decode
step (80 layers, one CUDA graph, 20 replays back to back), 9-19 % slower at 128-256 rows than the sum of
the same GEMMs timed alone (16 calls a graph, `torch_timing.cuda_timer`), and no slower at 1-32 rows.
This tells a clock held down by the board's power limit from an effect of the chain itself. `--measure`
times, with NVML reading the SM clock and the power draw after each replay and the time the driver held
the clock down for power (`nvmlDeviceGetViolationStatus`, power policy) over each form:

- the gate-up GEMM of that rank (14,336 x 8,192, two weight copies alternating, both beyond the L2),
  16 calls a CUDA graph, at 16-8,192 rows: `gate_up_after_idle`, the median of 6 replays each after
  0.4 s idle, and `gate_up_sustained`, replays back to back for 2 s (the median of the second second);
- the rank's 80 layers of matmuls in step order at 32, 128 and 256 rows (`chain_after_idle`,
  `chain_sustained`);
- causal prefill attention (torch's `scaled_dot_product_attention`, 32 heads of 128, one sequence of
  1,024, 4,096 and 16,384 tokens, 8 launches a graph; `prefill_attention_*`).

Writes `<gpu>-matmul-sustained.csv`, one row per form and size (`per_call_s`: seconds of one call);
`kernels_cost_model/power_cap.py` takes its compute factor from the GEMMs of 1,024 rows and more. The
check (no GPU) prints the files and each size's sustained / after-idle ratio.
"""
from __future__ import annotations

import csv
import datetime
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from decode_step_composed import DEVICE, rank_shapes  # noqa: E402
from fa3_paged_decode import measure_or_check, measure_or_check_parser  # noqa: E402

MODEL, TP = "llama-3.1-70b", 4
GEMM_ROWS = (16, 64, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192)
CHAIN_ROWS = (32, 128, 256)
ATTENTION_CHUNKS = (1024, 4096, 16384)
REPLAYS = 6
IDLE_S = 0.4
SUSTAIN_S = 2.0
COLUMNS = ("model", "tp", "rows", "form", "calls", "per_call_s", "sm_clock_mhz", "power_w", "power_capped_s",
           "device", "source")


class Sampler:
    """The GPU's SM clock (MHz) and power draw (W) through NVML, sampled between replays."""

    def __init__(self):
        import pynvml
        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.readings: list[tuple[float, float]] = []

    def read(self) -> None:
        nvml = self.nvml
        self.readings.append((nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_SM),
                              nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3))

    def median(self) -> tuple[float, float]:
        """Median (SM clock, power) of the readings since the last call."""
        readings, self.readings = self.readings, []
        return statistics.median(c for c, _ in readings), statistics.median(p for _, p in readings)

    def capped_s(self) -> float:
        """Seconds the driver has held the clock down for the power cap since it started."""
        return self.nvml.nvmlDeviceGetViolationStatus(self.handle, self.nvml.NVML_PERF_POLICY_POWER).violationTime / 1e9


def graph_of(torch, fn):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def replay_s(torch, graph) -> float:
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3


def after_idle(torch, graph, sampler: Sampler) -> tuple[float, float, float, float]:
    """(median seconds of a replay, SM clock, power, power-capped seconds) over REPLAYS replays, each
    after IDLE_S seconds idle (the clock and power read just after each)."""
    graph.replay()
    torch.cuda.synchronize()
    capped, samples = sampler.capped_s(), []
    for _ in range(REPLAYS):
        time.sleep(IDLE_S)
        samples.append(replay_s(torch, graph))
        sampler.read()
    return (statistics.median(samples), *sampler.median(), sampler.capped_s() - capped)


def sustained(torch, graph, sampler: Sampler) -> tuple[float, float, float, float]:
    """`after_idle`'s figures for replays back to back for SUSTAIN_S seconds, over the second half."""
    capped, samples, start = sampler.capped_s(), [], time.perf_counter()
    while time.perf_counter() - start < SUSTAIN_S:
        samples.append(replay_s(torch, graph))
        if time.perf_counter() - start > SUSTAIN_S / 2:
            sampler.read()
    late = samples[len(samples) // 2:]
    return (statistics.median(late), *sampler.median(), sampler.capped_s() - capped)


def measure(gpu: str, out_dir: Path, budget_s: float) -> Path:
    import torch
    from kernels_cost_model.models import get_model
    from kernels_cost_model.torch_backend import software
    out_dir.mkdir(parents=True, exist_ok=True)
    s = rank_shapes(get_model(MODEL), TP)
    source = (f"servesim {datetime.date.today().isoformat()} ({software(torch)}, {torch.cuda.get_device_name(0)}; "
              "CUDA graphs; SM clock, power and power-capped time from NVML)")
    dtype, hidden = torch.bfloat16, s["hidden"]
    gen = torch.Generator(device=DEVICE).manual_seed(0)

    def weight(n, k):
        return torch.empty(n, k, device=DEVICE, dtype=dtype).normal_(0.0, k ** -0.5, generator=gen)

    def rows_of(m, width):
        return torch.randn(m, width, device=DEVICE, dtype=dtype) * 0.1
    q_width = s["heads"] * s["head_dim"]
    layers = [(weight((s["heads"] + 2 * s["kv_heads"]) * s["head_dim"], hidden), weight(hidden, q_width),
               weight(2 * s["inter"], hidden), weight(hidden, s["inter"])) for _ in range(s["layers"])]
    gate_up = [layers[0][2], layers[1][2]]
    linear = torch.nn.functional.linear
    sampler, path = Sampler(), out_dir / f"{gpu}-matmul-sustained.csv"
    started = time.perf_counter()
    with path.open("w", newline="") as f, torch.inference_mode():
        writer = csv.writer(f)
        writer.writerow(COLUMNS)

        def record(m, form, calls, result):
            seconds, clock, power, capped = result
            writer.writerow((MODEL, TP, m, form, calls, seconds / calls, clock, power, capped, gpu, source))
            f.flush()
            print(f"{m} rows {form}: {seconds / calls * 1e6:.1f} us a call, SM {clock:.0f} MHz, {power:.0f} W, "
                  f"capped {capped:.2f} s", flush=True)
        for m in GEMM_ROWS:
            if time.perf_counter() - started > budget_s:
                print(f"budget spent at {m} rows", flush=True)
                break
            h = rows_of(m, hidden)
            calls = 16

            def burst():
                for i in range(calls):
                    linear(h, gate_up[i % 2])
            graph = graph_of(torch, burst)
            record(m, "gate_up_after_idle", calls, after_idle(torch, graph, sampler))
            record(m, "gate_up_sustained", calls, sustained(torch, graph, sampler))
            del graph
        for m in CHAIN_ROWS:
            h, a, mid = rows_of(m, hidden), rows_of(m, q_width), rows_of(m, s["inter"])

            def chain():
                for wqkv, wo, wgu, wd in layers:
                    linear(h, wqkv)
                    linear(a, wo)
                    linear(h, wgu)
                    linear(mid, wd)
            graph = graph_of(torch, chain)
            record(m, "chain_after_idle", 1, after_idle(torch, graph, sampler))
            record(m, "chain_sustained", 1, sustained(torch, graph, sampler))
            del graph
        for chunk in ATTENTION_CHUNKS:  # causal prefill attention, 32 heads of 128 (FlashAttention-2 in torch)
            q, k, v = (torch.randn(1, 32, chunk, 128, device=DEVICE, dtype=dtype) for _ in range(3))
            calls = 8

            def prefill():
                for _ in range(calls):
                    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            graph = graph_of(torch, prefill)
            record(chunk, "prefill_attention_after_idle", calls, after_idle(torch, graph, sampler))
            record(chunk, "prefill_attention_sustained", calls, sustained(torch, graph, sampler))
            del graph
    return path


def read(path: Path) -> dict:
    """{(form without its regime, rows): {"after_idle" | "sustained": row}}."""
    pairs: dict = {}
    with path.open() as f:
        for r in csv.DictReader(f):
            kind, regime = r["form"].rsplit("_", 1) if r["form"].endswith("_sustained") else \
                (r["form"][:-len("_after_idle")], "after_idle")
            pairs.setdefault((kind, int(r["rows"])), {})[regime] = r
    return pairs


def check() -> None:
    from kernels_cost_model.gpu_calibration import MEASURED_DIR
    from kernels_cost_model.power_cap import sustained_compute_factor
    for path in sorted(MEASURED_DIR.glob("*-matmul-sustained*.csv")):
        gpu = path.name.split("-matmul-sustained")[0]
        print(f"-- {path.name} (compute factor of {gpu}, all its runs: {sustained_compute_factor(gpu):.3f})")
        print(f"   {'form':18s} {'rows':>6s} {'after idle us':>13s} {'sustained us':>12s} {'ratio':>6s} "
              f"{'SM MHz':>6s} {'W':>4s} {'capped s':>8s}")
        for (kind, rows), pair in read(path).items():
            idle, busy = (float(pair[r]["per_call_s"]) for r in ("after_idle", "sustained"))
            print(f"   {kind:18s} {rows:6d} {idle * 1e6:13.1f} {busy * 1e6:12.1f} {busy / idle:6.3f} "
                  f"{float(pair['sustained']['sm_clock_mhz']):6.0f} {float(pair['sustained']['power_w']):4.0f} "
                  f"{float(pair['sustained']['power_capped_s']):8.2f}")


def build_parser():
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    return measure_or_check_parser(__doc__.splitlines()[0], "bursts and chains", 300.0, "nothing")


def main(argv: list[str] | None = None) -> int:
    return measure_or_check(build_parser(), argv, measure, check)


if __name__ == "__main__":
    raise SystemExit(main())
