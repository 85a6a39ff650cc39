"""The plain definition of a run's inter-token latencies, the reference the summary's ITL is checked
against: every positive gap between consecutive token times of completed requests, in seconds."""
from __future__ import annotations

import numpy as np


def pooled_itl(token_times, completed) -> np.ndarray:
    """Positive gaps (s) of the completed requests, request after request (zero gaps: tokens of one
    step, one chunk to the client, as vLLM's serving benchmark counts them)."""
    gaps = [np.diff(np.asarray(t, dtype=float)) for t, ok in zip(token_times, completed)
            if ok and t is not None and len(t) > 1]
    if not gaps:
        return np.empty(0)
    pooled = np.concatenate(gaps)
    return pooled[pooled > 0]
