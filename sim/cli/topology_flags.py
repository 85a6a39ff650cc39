"""`servesim run` flags for the deployment topology and multi-turn replay, with vLLM's names:
`-pp/--pipeline-parallel-size` (`--pipeline-layer-partition`: vLLM's VLLM_PP_LAYER_PARTITION),
`--kv-offloading-size` (GiB of host memory for a CPU KV tier) and
`--conversations PATH` (a Mooncake prefix-hash trace or OpenTelemetry GenAI spans, replayed closed-loop).

Without these flags `servesim run` is `simulate(config)`; with PP or a CPU tier the engine is built by
sim.planning.instances.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from kernels_cost_model.errors import ConfigError, require


PIPELINE_LINK, OFFLOADING_LINK = "nvlink4", "pcie5"
"""The links --pipeline-link and --kv-offloading-link default to."""


def add_topology_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("topology")
    g.add_argument("--pipeline-parallel-size", "-pp", "--pp", dest="pp", type=int, metavar="N",
                   help="pipeline stages per replica (vLLM's flag; default 1)")
    g.add_argument("--pipeline-link", metavar="LINK",
                   help=f"link between stages, with -pp > 1 (kernels_cost_model/data/links.csv; default "
                        f"{PIPELINE_LINK})")
    g.add_argument("--pipeline-layer-partition", metavar="N,N,...",
                   help="layers of each stage, comma-separated (vLLM's VLLM_PP_LAYER_PARTITION; default vLLM's "
                        "partition: num_layers // PP each, the remainder on the stages before the last)")
    g.add_argument("--kv-offloading-size", type=float, metavar="GIB",
                   help="CPU KV tier of GIB GiB of host memory, at most 1e5 (vLLM's flag; needs prefix caching)")
    g.add_argument("--kv-offloading-link", metavar="LINK",
                   help=f"host-to-GPU link of the CPU tier, with --kv-offloading-size (default {OFFLOADING_LINK})")
    g.add_argument("--conversations", metavar="PATH",
                   help="replay multi-turn conversations closed-loop: a Mooncake prefix-hash JSONL "
                        "trace or OpenTelemetry GenAI spans (OTLP JSON), in place of the workload flags; "
                        "--num-prompts caps Mooncake rows")
    g.add_argument("--conversation-time-scale", type=float, metavar="X",
                   help="stretch a Mooncake --conversations trace's start times and gaps by X (default 1)")


WORKLOAD_FLAGS = {"workload": "--workload", "rate": "--request-rate", "lengths": "--lengths", "cv": "--cv",
                  "burstiness": "--burstiness", "num_users": "--num-users", "max_tokens": "--max-tokens",
                  "shared_prefix_len": "--shared-prefix-len", "trace": "--trace", "trace_format": "--trace-format",
                  "target_rate": "--target-rate"}
"""Flag dests of the traffic settings a --conversations replay replaces, and their flags."""


def instance_shape(args):
    """The InstanceShape the flags ask for, or None for the plain engine."""
    from kernels_cost_model.links import get_link
    from sim.planning.instances import InstanceShape
    from sim.planning.offload import OffloadConfig, check_offloading_size
    from sim.planning.pipeline import PipelineConfig
    pp, size = getattr(args, "pp", None), getattr(args, "kv_offloading_size", None)
    for flag, dest in (("--pipeline-link", "pipeline_link"), ("--kv-offloading-link", "kv_offloading_link")):
        link = getattr(args, dest, None)
        try:  # (named even where the link is not used: a typo should not pass unseen)
            link is None or get_link(link)
        except ConfigError as exc:
            raise ConfigError(flag, link, exc.reason) from None
    partition = _layer_partition(getattr(args, "pipeline_layer_partition", None), pp)
    warn_idle_links(args)
    if (pp is None or pp == 1) and size is None:
        return None
    require(pp is None or pp >= 1, "--pipeline-parallel-size", pp, "must be an integer >= 1")
    if size is not None:
        check_offloading_size("--kv-offloading-size", size)
    try:
        pipeline = PipelineConfig(pp, args.pipeline_link or PIPELINE_LINK, partition) if pp and pp > 1 else None
    except ConfigError as exc:
        if exc.field == "pipeline.layer_partition":
            raise ConfigError("--pipeline-layer-partition", args.pipeline_layer_partition, exc.reason) from None
        raise ConfigError("--pipeline-link", args.pipeline_link, exc.reason) from None
    try:
        link = args.kv_offloading_link or OFFLOADING_LINK
        offload = OffloadConfig(cpu_bytes=size * 2**30, link=link) if size else None
    except ConfigError as exc:
        raise ConfigError("--kv-offloading-link", args.kv_offloading_link, exc.reason) from None
    return InstanceShape(pipeline, offload)


def warn_idle_links(args) -> None:
    """Say so when a link flag is given without what it prices (as --save-detailed without --save-result,
    it then changes nothing): --pipeline-link without -pp > 1, --kv-offloading-link without
    --kv-offloading-size."""
    pp = getattr(args, "pp", None)
    if getattr(args, "pipeline_link", None) is not None and (pp is None or pp <= 1):
        _warn("--pipeline-link prices the sends between pipeline stages; without --pipeline-parallel-size > 1 "
              "it changes nothing")
    if getattr(args, "kv_offloading_link", None) is not None and getattr(args, "kv_offloading_size", None) is None:
        _warn("--kv-offloading-link prices the CPU KV tier's copies; without --kv-offloading-size it changes nothing")


def _warn(message: str) -> None:
    print(f"servesim: warning: {message}", file=sys.stderr)


def _layer_partition(text: str | None, pp: int | None) -> tuple[int, ...] | None:
    """--pipeline-layer-partition "31,30" as (31, 30); only with -pp > 1."""
    if text is None:
        return None
    require(pp is not None and pp > 1, "--pipeline-layer-partition", text, "needs --pipeline-parallel-size > 1")
    try:
        return tuple(int(n) for n in text.split(","))
    except ValueError:
        raise ConfigError("--pipeline-layer-partition", text, "must be comma-separated layer counts, "
                          "one per stage (e.g. 31,30)") from None


def conversation_workload(args, config):
    """The ConversationReplay of --conversations, or None (ConfigError on a setting it would ignore)."""
    path, scale = getattr(args, "conversations", None), getattr(args, "conversation_time_scale", None)
    if path is None:
        require(scale is None, "--conversation-time-scale", scale, "applies only with --conversations")
        return None
    from workloads.conversations import ConversationReplay, mooncake_conversations
    from workloads.otel_genai import otel_genai_conversations
    path = Path(path)
    if not path.is_file():
        raise ConfigError("--conversations", str(path),
                          "is a folder, not a file" if path.is_dir() else "file not found")
    require(scale is None or math.isfinite(scale) and scale > 0, "--conversation-time-scale", scale,
            "must be a finite number > 0")
    _check_replaced_workload(args, config, path)
    ignore_eos = config.workload.ignore_eos
    if _is_mooncake(path):
        return ConversationReplay(mooncake_conversations(path, getattr(args, "num_requests", None), ignore_eos,
                                                         scale or 1.0))
    conversations = otel_genai_conversations(path, ignore_eos)  # (a file of neither kind is named here)
    for dest, flag in (("num_requests", "--num-prompts"), ("conversation_time_scale", "--conversation-time-scale")):
        require(getattr(args, dest, None) is None, flag, getattr(args, dest, None),
                "applies to a Mooncake conversation trace; OpenTelemetry GenAI spans replay whole, as recorded")
    return ConversationReplay(conversations)


def _check_replaced_workload(args, config, path: Path) -> None:
    """--conversations brings its own traffic: a workload flag or [workload] setting it would ignore is an error."""
    flags = [flag for dest, flag in WORKLOAD_FLAGS.items() if getattr(args, dest, None) is not None]
    require(not flags, "--conversations", str(path), f"replays the file's own traffic; it cannot be combined "
                                                     f"with {', '.join(flags)}")
    default = type(config.workload)()
    changed = {f.name: getattr(config.workload, f.name) for f in dataclasses.fields(config.workload)
               if f.name not in ("num_requests", "ignore_eos")
               and getattr(config.workload, f.name) != getattr(default, f.name)}
    require(not changed, "--conversations", str(path), f"replays the file's own traffic; the config's [workload] "
                                                       f"settings {changed} would be ignored: remove them")


def describe_conversations(results, args, workload) -> None:
    """Name the conversation file as the run's workload in results.meta (the header, summary.json)."""
    scale = getattr(args, "conversation_time_scale", None)
    results.meta["config"]["workload"] = {
        "kind": "conversations", "path": str(args.conversations), "num_requests": workload.num_requests,
        "ignore_eos": results.meta["config"]["workload"]["ignore_eos"], "time_scale": scale or 1.0}


def _is_mooncake(path: Path) -> bool:
    with path.open("rb") as f:
        first = f.readline()
    try:
        row = json.loads(first.decode("utf-8", errors="replace"))
    except ValueError:
        return False
    return isinstance(row, dict) and "hash_ids" in row


def simulate_from_args(config, args, progress=None):
    """Results of `servesim run`: the plain engine, or one with PP / a CPU tier, on the config's
    workload or the --conversations replay."""
    shape, workload = instance_shape(args), conversation_workload(args, config)
    results = _simulate_shape(config, args, shape, workload, progress)
    if workload is not None:
        describe_conversations(results, args, workload)
    return results


def _simulate_shape(config, args, shape, workload, progress):
    from sim.api.simulator import simulate
    from sim.planning.instances import simulate_instance
    from sim.api.validation import check_model_limits, check_step_budget
    if shape is None:
        return simulate(config, workload=workload, progress=progress)
    check_model_limits(config)  # (an unknown model is the deployment's error, not the PP or tier flag's)
    check_step_budget(config.engine)
    if shape.offload is not None:
        require(config.engine.enable_prefix_caching, "--kv-offloading-size", args.kv_offloading_size,
                "the CPU tier needs prefix caching")
        try:
            shape.offload.cpu_blocks(config)
        except ConfigError as exc:
            raise ConfigError("--kv-offloading-size", args.kv_offloading_size, exc.reason) from None
    return simulate_instance(config, shape, workload=workload)
