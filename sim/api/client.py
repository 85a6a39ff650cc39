"""Client-side latency: what an HTTP client adds to the engine's timestamps (optional, off by default).

The simulator times requests at the engine: a request arrives when the engine core receives it and a
token counts when the engine emits it. A benchmark run over HTTP (`vllm bench serve` against the
OpenAI-compatible server) times them at the client, which also sees the API server's request parsing
and tokenisation, the trip to and from the engine core process, and the detokenising and streaming
of each chunk. `[client]` adds that time to the results only; the engine runs exactly as without it:

- `ttft_s`: added to the first token's time, and so to every later one (parsing, tokenisation,
  the first chunk's streaming);
- `per_token_s`: added per later token, cumulatively (detokenising and streaming each chunk), so
  the k-th token after the first arrives `ttft_s + k x per_token_s` after the engine emitted it.

No default figure is offered: it depends on the host, the tokenizer and the client. Measure it as
the gap between the client's TTFT and TPOT (`vllm bench serve`) and the server's own
(`vllm:time_to_first_token_seconds`, `vllm:time_per_output_token_seconds` on its /metrics) at low load.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kernels_cost_model.errors import require
from sim.core.fields import check_types

#: Largest client overhead accepted, per field (s): beyond this it is not an overhead.
MAX_CLIENT_S = 60.0


@dataclass(frozen=True)
class ClientConfig:
    """Time an HTTP client adds (s): to the first token (`ttft_s`) and per later token (`per_token_s`)."""

    ttft_s: float = 0.0
    per_token_s: float = 0.0

    def __post_init__(self) -> None:
        check_types(self, "client.")
        for name in ("ttft_s", "per_token_s"):
            value = getattr(self, name)
            require(0.0 <= value <= MAX_CLIENT_S, f"client.{name}", value,
                    f"must be a duration in [0, {MAX_CLIENT_S:g}] s")

    @property
    def is_off(self) -> bool:
        return self.ttft_s == 0.0 and self.per_token_s == 0.0


def client_delays(num_output_tokens, client: ClientConfig) -> np.ndarray:
    """Per request, the delay the client adds to its last token (0 for a request with no output)."""
    n = np.asarray(num_output_tokens, dtype=float)
    return np.where(n > 0, client.ttft_s + client.per_token_s * np.maximum(n - 1, 0), 0.0)


def shift_requests(requests: pd.DataFrame, client: ClientConfig) -> pd.DataFrame:
    """The request table as the client times it (first_token_time, finish_time); arrival unchanged."""
    out = requests.copy()
    emitted = out["num_output_tokens"] > 0
    out["first_token_time"] = out["first_token_time"].where(~emitted, out["first_token_time"] + client.ttft_s)
    out["finish_time"] = out["finish_time"] + client_delays(out["num_output_tokens"], client)
    return out


def shift_token_times(token_times: list, client: ClientConfig) -> list:
    """Every token's emission time as the client sees it (None entries stay None)."""
    from array import array
    shifted = []
    for times in token_times:
        if times is None or not len(times):
            shifted.append(times)
            continue
        t = np.frombuffer(times, dtype=float) if isinstance(times, array) else np.asarray(times, dtype=float)
        shifted.append(array("d", t + client.ttft_s + client.per_token_s * np.arange(len(t))))
    return shifted
