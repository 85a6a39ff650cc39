"""Drive vLLM's real V1 `Scheduler` through a conformance scenario and record its trace.

Needs vLLM installed (no GPU: see the README, "Checking the scheduler against vLLM"); imported lazily.
The driver plays the engine core's loop around the scheduler (vllm/v1/engine/core.py): `step` when async
scheduling is off, `step_with_batch_queue` with a queue of two when it is on (the next step is scheduled
before the previous step's tokens are applied); aborts that arrive while a step runs are applied before
its outputs. The "model" samples, for every request whose step catches up, the next token of the
request's scripted stream, except that below `min_tokens` it cannot sample EOS or a stop token id (vLLM's
min-tokens logits processor masks them: a filler token comes instead). Every step that schedules tokens
lasts STEP_S; the model is a config-only tiny Llama (no weights are loaded).

A spec-decoding scenario gives the scheduler an EAGLE SpeculativeConfig (the tiny Llama stands in for the
head: the scheduler reads the method and k, so use_eagle is set and num_lookahead_tokens = k). Drafts
reach it as the engine core feeds them: without async scheduling `update_draft_token_ids` after each step
with k drafts for every row, under it the AsyncScheduler's own placeholders. The model samples 1 +
accepted tokens, accepted as the scenario's `PositionalAcceptance` says (none of a padded admission's
placeholder drafts).

The front end's part is played as vLLM's does it: `max_tokens=None` becomes `max_model_len` less the
prompt (vllm/v1/engine/input_processor.py), and stop strings are looked for by vLLM's own incremental
detokenizer (vllm/v1/engine/detokenizer.py, with `token_text` as the vocabulary) on every output the
engine core sends; on a match the client's request ends "stop" and its abort reaches the engine core
while the next step runs (vllm/v1/engine/output_processor.py `reqs_to_abort`).
"""
from __future__ import annotations

import json
import os
import tempfile
from collections import deque

from sim.fidelity.conformance.scenario import EOS_TOKEN_ID, STEP_S, make_scenario_acceptance, token_text

_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
    "vocab_size": 32000, "max_position_embeddings": 1 << 16, "rms_norm_eps": 1e-6,
    "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": EOS_TOKEN_ID,
}
_model_dir: str | None = None
_hashers: dict = {}


def vllm_version() -> str:
    import vllm
    return vllm.__version__


def _tiny_model() -> str:
    global _model_dir
    if _model_dir is None:
        _model_dir = tempfile.mkdtemp(prefix="servesim-tiny-llama-")
        with open(os.path.join(_model_dir, "config.json"), "w") as f:
            json.dump(_TINY_LLAMA, f)
    return _model_dir


def _use_cpu_platform() -> None:
    """A GPU wheel on a machine without a GPU: tell vLLM it runs on the CPU platform (0.19 cannot
    infer it; the scheduler needs no device)."""
    import vllm.platforms as platforms
    if getattr(platforms, "_current_platform", None) is None:
        from vllm.platforms.cpu import CpuPlatform
        platforms._current_platform = CpuPlatform()


def make_scheduler(cfg: dict, speculative: dict | None = None):
    """vLLM's Scheduler (AsyncScheduler with async scheduling) for a scenario config; `speculative`: a
    scenario's EAGLE settings (vLLM's SpeculativeConfig, the tiny Llama's config standing in for the
    head: the scheduler reads only the method and k)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    _use_cpu_platform()
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=_tiny_model(), skip_tokenizer_init=True, dtype="float16",
                               max_model_len=cfg["max_model_len"], seed=0)
    scheduler_config = SchedulerConfig(
        max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_model_len=cfg["max_model_len"], is_encoder_decoder=False,
        long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"], async_scheduling=cfg["async_scheduling"],
        policy=cfg["scheduling"])
    cache_config = CacheConfig(block_size=cfg["block_size"], enable_prefix_caching=cfg["enable_prefix_caching"],
                               mamba_cache_mode=cfg.get("mamba_cache_mode", "none"))
    speculative_config = None
    if speculative is not None:
        speculative_config = SpeculativeConfig(
            method=speculative["method"], model=_tiny_model(), target_model_config=model_config,
            num_speculative_tokens=speculative["num_speculative_tokens"], target_parallel_config=ParallelConfig())
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, speculative_config=speculative_config)
    # the CPU platform turns async scheduling off in the config (vllm/platforms/cpu.py
    # `check_and_update_config`); on a GPU it stays as set, and 0.33's KV manager sizes the window groups'
    # admission cap by it (vllm/config/vllm.py `max_in_flight_tokens`: a batch per concurrent step)
    vllm_config.scheduler_config.async_scheduling = cfg["async_scheduling"]
    k = speculative["num_speculative_tokens"] if speculative is not None else 0
    groups = [KVCacheGroupSpec([f"layer{i}"], kv_cache_spec(group, cfg, k))
              for i, group in enumerate(cfg.get("kv_groups") or [{"kind": "full"}])]
    kv_cache_config = KVCacheConfig(num_blocks=cfg["num_gpu_blocks"], kv_cache_tensors=[], kv_cache_groups=groups)
    cache_config.num_gpu_blocks = cfg["num_gpu_blocks"]
    cls = AsyncScheduler if cfg["async_scheduling"] else Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config),
               **scheduler_block_sizes(kv_cache_config, vllm_config, cfg["block_size"]))


def scheduler_block_sizes(kv_cache_config, vllm_config, block_size: int) -> dict:
    """The block size(s) the engine core gives the Scheduler (vllm/v1/engine/core.py): 0.33 resolves a
    scheduling block (the LCM of the groups' block sizes) and a hashing block; 0.19 takes the smallest
    group block size."""
    try:
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    except ImportError:
        return {"block_size": min(g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups)}
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    return {"block_size": scheduler_block, "hash_block_size": hash_block}


def kv_cache_spec(group: dict, cfg: dict, num_speculative_tokens: int = 0):
    """vLLM's spec for one of a scenario's KV groups ({"kind": "full" | "sliding" | "chunked" | "linear",
    "window": tokens}), one tiny layer each (the scheduler reads only the kind, block size and window).
    A linear-attention group is a Mamba state of one block of max_model_len tokens, vLLM's block size for
    it without prefix caching (vllm/model_executor/models/config.py), and with speculative decoding one
    more block per draft (`num_speculative_blocks`, as the Mamba layers set it from k); in "align" mode
    (prefix caching on) a state per `block_size` tokens, the attention groups' block size."""
    import torch
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, MambaSpec, SlidingWindowSpec

    shape = dict(block_size=cfg["block_size"], num_kv_heads=1, head_size=1, dtype=torch.float32)
    kind = group["kind"]
    if kind == "sliding":
        return SlidingWindowSpec(**shape, sliding_window=group["window"])
    if kind == "chunked":
        return ChunkedLocalAttentionSpec(**shape, attention_chunk_size=group["window"])
    if kind == "linear" and cfg.get("mamba_cache_mode") == "align":  # a state per block_size tokens
        return MambaSpec(block_size=cfg["block_size"], shapes=((1,),), dtypes=(torch.float32,),
                         mamba_cache_mode="align", num_speculative_blocks=num_speculative_tokens)
    if kind == "linear":
        return MambaSpec(block_size=cfg["max_model_len"], shapes=((1,),), dtypes=(torch.float32,),
                         num_speculative_blocks=num_speculative_tokens)
    return FullAttentionSpec(**shape)


def make_request(spec: dict, block_size: int, max_model_len: int, hash_lookahead: int = 0):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.utils.hashing import sha256
    from vllm.v1.request import Request

    key = (block_size, hash_lookahead)
    if key not in _hashers:
        if not _hashers:
            init_none_hash(sha256)
        # the engine core's hasher: 0.33 with EAGLE and prefix caching hashes the token after each block too
        extra = (hash_lookahead,) if hash_lookahead else ()
        _hashers[key] = get_request_block_hasher(block_size, sha256, *extra)
    max_tokens = spec["max_tokens"]
    if max_tokens is None:  # the input processor's rule: up to max_model_len
        max_tokens = max_model_len - len(spec["prompt"])
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=spec["ignore_eos"],
                            stop_token_ids=list(spec["stop_token_ids"]), min_tokens=spec.get("min_tokens", 0),
                            stop=list(spec.get("stop", [])))
    params.update_from_generation_config({}, EOS_TOKEN_ID)
    kwargs = dict(request_id=spec["id"], prompt_token_ids=list(spec["prompt"]), sampling_params=params,
                  pooling_params=None, arrival_time=spec["arrival"], priority=spec["priority"],
                  block_hasher=_hashers[key])
    try:
        return Request(eos_token_id=EOS_TOKEN_ID, **kwargs)  # vLLM 0.19 takes the EOS id here
    except TypeError:
        return Request(**kwargs)


class _Driver:
    """The engine core's loop around one scheduler, on simulated time."""

    def __init__(self, scenario: dict):
        self.cfg = cfg = scenario["config"]
        self.spec = scenario.get("speculative")
        self.sched = make_scheduler(cfg, self.spec)
        self.specs = {r["id"]: r for r in scenario["requests"]}
        self.acceptance = make_scenario_acceptance(self.spec)
        self.index = {r["id"]: i for i, r in enumerate(sorted(scenario["requests"], key=lambda r: r["arrival"]))}
        self.arrivals = deque(sorted(scenario["requests"], key=lambda r: r["arrival"]))
        self.aborts = deque(sorted((r["abort"], r["id"]) for r in scenario["requests"] if r["abort"] is not None))
        self.steps: list[dict] = []
        self.delivered = {r["id"]: 0 for r in scenario["requests"]}
        self.finished: dict[str, list] = {}
        self.stop_reasons: dict = {}  # of the requests whose client saw "stop"
        self.now = self.gpu_free = 0.0
        self.detokenizers: dict = {}
        self.padded: dict[int, set] = {}  # id(scheduler output) -> requests whose drafts are padding
        self.frontend_aborts: list[str] = []  # stop strings found; aborts land during the next step

    def process_inputs(self) -> None:
        while self.arrivals and self.arrivals[0]["arrival"] <= self.now:
            spec = self.arrivals.popleft()
            if len(spec["prompt"]) >= self.cfg["max_model_len"]:  # the front end refuses it
                self.finished[spec["id"]] = ["rejected", 0]
                continue
            request = make_request(spec, self.cfg["block_size"], self.cfg["max_model_len"],
                                   getattr(self.sched, "num_hash_lookahead_tokens", 0))
            if request.sampling_params.stop:
                self.detokenizers[spec["id"]] = make_detokenizer(request.sampling_params)
            self.sched.add_request(request)
        self.process_aborts()

    def process_aborts(self) -> None:
        """Aborts that have come by now, of requests the scheduler has (an abort of a request still in
        the input queue waits there behind its arrival)."""
        from vllm.v1.request import RequestStatus
        left = deque()
        while self.aborts and self.aborts[0][0] <= self.now:
            when, rid = self.aborts.popleft()
            if rid not in self.sched.requests and rid not in self.finished:
                left.append((when, rid))
                continue
            req = self.sched.requests.get(rid)
            if req is not None and not req.is_finished():
                self.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                self.finished.setdefault(rid, ["abort", self.delivered[rid]])
        self.aborts.extendleft(reversed(left))

    def next_event(self) -> float | None:
        times = ([self.arrivals[0]["arrival"]] if self.arrivals else []) + ([self.aborts[0][0]] if self.aborts else [])
        return min(times) if times else None

    def schedule(self):
        before = {rid: r.status.name for rid, r in self.sched.requests.items()}
        out = self.sched.schedule()
        step = {"tokens": {}, "admitted": {}, "preempted": sorted(out.preempted_req_ids or ())}
        for rid, n in out.num_scheduled_tokens.items():
            step["tokens"][rid] = n
            if before[rid] in ("WAITING", "PREEMPTED"):
                step["admitted"][rid] = self.sched.requests[rid].num_computed_tokens - n
        # drafts of a request admitted in this step are padding (vLLM 0.33 pads a one-token admission
        # to 1 + k): placeholder ids the proposer never drafted, which the rejection sampler rejects
        self.padded[id(out)] = set(step["admitted"]) & set(out.scheduled_spec_decode_tokens)
        if step["tokens"] or step["preempted"]:
            self.steps.append(step)
        start = max(self.now, self.gpu_free)
        self.gpu_free = start + (STEP_S if out.total_num_scheduled_tokens else 0.0)
        samples = {rid for rid in out.num_scheduled_tokens if not self.sched.requests[rid].is_prefill_chunk}
        return out, self.gpu_free, samples

    def sample(self, req, offset: int = 0) -> int:
        """The scripted token `offset` places past the request's output, or a filler where the
        min-tokens logits processor masks it."""
        script, position = self.specs[req.request_id]["output"], len(req.output_token_ids) + offset
        token = script[position] if position < len(script) else 1000 + position
        params = req.sampling_params
        if position < params.min_tokens and token in params.all_stop_token_ids | set(params.stop_token_ids or ()):
            return 1000 + position
        return token

    def apply_frontend_aborts(self) -> None:
        from vllm.v1.request import RequestStatus
        for rid in self.frontend_aborts:
            req = self.sched.requests.get(rid)
            if req is not None and not req.is_finished():
                self.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        self.frontend_aborts.clear()

    def front_end(self, output) -> None:
        """The API server's view of one engine-core output: count it, look for stop strings."""
        rid = output.request_id
        if rid in self.finished:
            return  # the client's request already ended; the front end drops what follows
        detok = self.detokenizers.get(rid)
        stop_terminated = output.finish_reason is not None and str(output.finish_reason) == "stop"
        found = detok.update(list(output.new_token_ids), stop_terminated) if detok is not None else None
        if found is not None:
            self.delivered[rid] = detok.num_output_tokens()  # as the release's detokenizer keeps them
            self.finished[rid] = ["stop", self.delivered[rid]]
            self.stop_reasons[rid] = found
            if output.finish_reason is None:
                self.frontend_aborts.append(rid)
            return
        self.delivered[rid] += len(output.new_token_ids)
        if output.finish_reason is not None:
            self.finished[rid] = [str(output.finish_reason), self.delivered[rid]]
            if stop_terminated:
                self.stop_reasons[rid] = output.stop_reason

    def update(self, out, samples) -> None:
        from vllm.v1.outputs import ModelRunnerOutput
        self.process_aborts()
        self.apply_frontend_aborts()
        req_ids = list(out.num_scheduled_tokens)
        padded = self.padded.pop(id(out), ())
        tokens = []
        for rid in req_ids:
            req = self.sched.requests.get(rid)
            if rid in samples and req is not None:
                tokens.append([self.sample(req, j) for j in range(1 + self.accepted(req, out, padded))])
            else:
                tokens.append([])
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=tokens)
        for outputs in self.sched.update_from_output(out, mro).values():
            for o in outputs.outputs:
                self.front_end(o)
        if self.spec is not None and not self.cfg["async_scheduling"] and req_ids:
            self.propose(req_ids)

    def accepted(self, req, out, padded) -> int:
        """Drafts the rejection sampler accepts of those scheduled for `req` in step `out` (none of a
        request in `padded`)."""
        drafts = len(out.scheduled_spec_decode_tokens.get(req.request_id, ()))
        if not drafts or req.request_id in padded:
            return 0
        return self.acceptance.num_accepted(self.index[req.request_id], len(req.output_token_ids), drafts)

    def propose(self, req_ids: list[str]) -> None:
        """The engine core's post-step without async scheduling: the EAGLE proposer drafted k tokens for
        every row of the batch; the scheduler keeps them for requests past their prefill (under async
        scheduling the AsyncScheduler sets placeholder drafts itself)."""
        from vllm.v1.outputs import DraftTokenIds
        k = self.spec["num_speculative_tokens"]
        self.sched.update_draft_token_ids(DraftTokenIds(req_ids, [[3] * k for _ in req_ids]))

    def run(self, max_steps: int = 5000) -> dict:
        size = 2 if self.cfg["async_scheduling"] else 1
        queue: deque = deque()
        idle = 0
        while len(self.steps) < max_steps:
            self.process_inputs()
            if not self.sched.has_requests() and not queue:
                nxt = self.next_event()
                if nxt is None:
                    break
                self.now = max(self.now, nxt)
                continue
            if self.sched.has_requests() and len(queue) < size:
                out, end, samples = self.schedule()
                idle = idle + 1 if not out.total_num_scheduled_tokens else 0
                if idle > 3 and not queue:  # nothing can run until something arrives
                    nxt = self.next_event()
                    if nxt is None:
                        raise RuntimeError("vLLM scheduler is stuck: requests left, nothing schedulable")
                    self.now, idle = max(self.now, nxt), 0
                queue.appendleft((out, end, samples))
                if len(queue) < size and (out.total_num_scheduled_tokens or self.sched.has_requests()):
                    continue
            if queue:
                out, end, samples = queue.pop()
                self.now = max(self.now, end)
                self.update(out, samples)
        return {"steps": self.steps, "finished": dict(sorted(self.finished.items())),
                "stop_reasons": dict(sorted(self.stop_reasons.items()))}


def make_detokenizer(params):
    """vLLM's incremental detokenizer (its stop-string check) over the scenarios' `token_text`."""
    from types import SimpleNamespace
    from vllm.v1.engine.detokenizer import BaseIncrementalDetokenizer

    class _Detokenizer(BaseIncrementalDetokenizer):
        def decode_next(self, next_token_id: int) -> str:
            return token_text(next_token_id)

    return _Detokenizer(SimpleNamespace(sampling_params=params))


def run_vllm(scenario: dict) -> dict:
    """The trace of `scenario` under the installed vLLM's scheduler."""
    return _Driver(scenario).run()
