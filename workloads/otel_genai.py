"""OpenTelemetry GenAI spans (OTLP JSON, as the collector's file exporter writes them) as conversations.

Reads `{"resourceSpans": [{"scopeSpans": [{"spans": [...]}]}]}` documents, one per line or one per
file. Model calls are spans whose `gen_ai.operation.name` is chat, text_completion or
generate_content, with `gen_ai.usage.input_tokens` / `gen_ai.usage.output_tokens` (the GenAI semantic
conventions). Calls group into a conversation by `gen_ai.conversation.id`, else by trace id, in start
order. The gap before a call is the recorded time between the previous call's end and its start
(tool calls and the agent's own work); the first call of each conversation starts at its recorded
offset from the earliest call. An agent's context grows, so call k's prompt is the first
input_tokens tokens of one token sequence per conversation: calls share prefixes as the real ones did.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from sim.core.sampling_params import SamplingParams
from workloads.conversations import Conversation, Turn
from workloads.errors import TraceFormatError
from workloads.spec import RequestSpec
from workloads.tokens import hashed_tokens

MODEL_CALLS = ("chat", "text_completion", "generate_content")
CONTEXT_SALT = 0x6E4A1


def otel_genai_conversations(path: str | Path, ignore_eos: bool = True) -> list[Conversation]:
    """Conversations of the model-call spans in an OTLP JSON(L) file."""
    path = Path(path)
    calls = [c for line, doc in _documents(path) for c in _model_calls(path, line, doc)]
    if not calls:
        raise TraceFormatError(path, 1, "no GenAI model-call spans (gen_ai.operation.name chat/"
                                        "text_completion/generate_content with gen_ai.usage.*_tokens)")
    origin = min(c["start"] for c in calls)
    groups: dict[str, list] = {}
    for call in sorted(calls, key=lambda c: (c["start"], c["span"])):
        groups.setdefault(call["conversation"], []).append(call)
    return [_conversation(key, group, origin, ignore_eos) for key, group in groups.items()]


def _documents(path: Path):
    text = path.read_text()
    try:
        yield 1, json.loads(text)
        return
    except json.JSONDecodeError:
        pass
    for line, raw in enumerate(text.splitlines(), 1):
        if raw.strip():
            try:
                yield line, json.loads(raw)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, line, f"not JSON: {exc.msg}") from None


def _model_calls(path: Path, line: int, doc: dict):
    if not isinstance(doc, dict) or "resourceSpans" not in doc:
        raise TraceFormatError(path, line, "not an OTLP JSON document (no resourceSpans)")
    for resource in doc["resourceSpans"]:
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                attrs = {a["key"]: _value(a.get("value", {})) for a in span.get("attributes", [])}
                if attrs.get("gen_ai.operation.name") not in MODEL_CALLS:
                    continue
                yield _call(path, line, span, attrs)


def _call(path: Path, line: int, span: dict, attrs: dict) -> dict:
    try:
        inputs, outputs = int(attrs["gen_ai.usage.input_tokens"]), int(attrs["gen_ai.usage.output_tokens"])
        start, end = int(span["startTimeUnixNano"]) / 1e9, int(span["endTimeUnixNano"]) / 1e9
    except (KeyError, ValueError, TypeError) as exc:
        raise TraceFormatError(path, line, f"span {span.get('spanId')!r}: missing or bad {exc}") from None
    if inputs < 1 or outputs < 0 or end < start:
        raise TraceFormatError(path, line, f"span {span.get('spanId')!r}: {inputs} input / {outputs} output "
                                           f"tokens, start {start} end {end}")
    return {"conversation": str(attrs.get("gen_ai.conversation.id") or span.get("traceId")),
            "span": str(span.get("spanId")), "start": start, "end": end, "input": inputs, "output": outputs}


def _value(value: dict):
    for kind in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if kind in value:
            return value[kind]
    return None


def _conversation(key: str, calls: list, origin: float, ignore_eos: bool) -> Conversation:
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=5).digest(), "little")
    context = hashed_tokens(np.arange(max(c["input"] for c in calls), dtype=np.uint64)
                            + (np.uint64(seed) << np.uint64(24)), CONTEXT_SALT)
    turns, previous_end = [], calls[0]["start"]
    for call in calls:
        output = max(1, call["output"])
        spec = RequestSpec(0.0, context[:call["input"]].copy(), output_len=output,
                           sampling_params=SamplingParams(max_tokens=output, ignore_eos=ignore_eos))
        turns.append(Turn(spec, max(0.0, call["start"] - previous_end)))
        previous_end = call["end"]
    return Conversation(f"otel-{key}", calls[0]["start"] - origin, tuple(turns))
