"""Which instance's first token the client sees in a disaggregated deployment.

`first_token = "decode"` (the default) follows vLLM's disaggregated proxy: the proxy sends the
request to a prefill instance with max_tokens = 1, waits for it, discards its token and forwards the
original request to a decode instance, which loads the prompt's KV, recomputes the last prompt
token and samples the first token itself; the client streams from the decode instance only. So:

- every request is handed off, whatever its first token (the prefill run ignores EOS and stop ids);
  only a prompt of max_model_len - 1 tokens, whose first token is also its last, is answered by the
  prefill instance;
- TTFT = the decode instance's first token - arrival (it includes the prefill, the KV transfer,
  any wait for decode blocks or a seat and one decode step);
- the decode instance runs the request from its own `SamplingParams` and stop state, on the same
  token stream, so outputs equal `run_until_stop`'s.

`first_token = "prefill"` is the definition DistServe and Splitwise report (and vLLM's proxies
that stream the prefill's token): TTFT is the prefill instance's first token; a request that token
stops never moves; the decode instance continues from the second token.
"""
from __future__ import annotations

import dataclasses

from sim.core.sampling_params import SamplingParams

FIRST_TOKEN = ("decode", "prefill")
RELAXED = SamplingParams(max_tokens=None, ignore_eos=True)


def prefill_spec(spec, mode: str, engine):
    """The request the prefill instance (`engine`) runs: under "decode", one no first token can stop.
    A request the front end refuses as it is (its prompt + max_tokens over max_model_len behind `vllm
    serve`) stays as it is, so the prefill instance refuses it on arrival: the decode instance, which
    gets the client's own request, would refuse it, and that refusal is the client's answer."""
    if (mode == "prefill" or spec.num_prompt_tokens + 1 >= engine.config.max_model_len
            or engine.refuses(spec)):
        return spec
    return dataclasses.replace(spec, sampling_params=RELAXED)


def decode_request(engine, original_spec, prefilled, stream, now: float):
    """The decode instance's request for `prefilled` under "decode": the original request, its
    outputs empty, on the prefill's token stream (the caller allocates its blocks and admits it)."""
    req = engine.add_request(dataclasses.replace(original_spec, request_id=prefilled.request_id), now)
    engine.state.waiting.remove(req)
    engine.set_stream(req, stream)
    return req


def recompute_last_prompt_token(req) -> None:
    """Under "decode" the decode instance computes the last prompt token and samples the first token."""
    req.num_computed_tokens -= 1
