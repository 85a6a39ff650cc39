"""A simulated run in the comparison's terms: the per-request and per-step tables both replays produce."""
from __future__ import annotations

import dataclasses

import pandas as pd


@dataclasses.dataclass(frozen=True)
class Replay:
    """A simulated run in the comparison's terms: per-request table and per-step table."""

    requests: pd.DataFrame   # request_id, arrival_s, first_token_s, finish_s, ttft_s, tpot_s, e2e_s
    steps: pd.DataFrame      # end_s, num_running, num_waiting (summed over DP ranks)
    num_gpu_blocks: int


def request_table(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"request_id": df["request_id"], "arrival_s": df["arrival_time"],
                         "first_token_s": df["first_token_time"], "finish_s": df["finish_time"],
                         "ttft_s": df["ttft_s"], "tpot_s": df["tpot_s"], "e2e_s": df["e2e_s"],
                         "num_output_tokens": df["num_output_tokens"]})


def step_table(steps: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"end_s": steps["start_time"] + steps["duration"],
                         "duration_s": steps["duration"],
                         "num_running": steps["num_running"], "num_waiting": steps["num_waiting"],
                         "num_prefill_tokens": steps["num_prefill_tokens"],
                         "num_decode_tokens": steps["num_decode_tokens"],
                         "batch_size": steps["batch_size"]})
