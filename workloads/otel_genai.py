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
from workloads.traces import MAX_TRACE_SECONDS, MAX_TRACE_TOKENS

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
    last = max(calls, key=lambda c: c["end"])
    if last["end"] - origin > MAX_TRACE_SECONDS:
        raise TraceFormatError(path, last["line"], f"span {last['span']!r} ends {last['end'] - origin:.6g} s after "
                                                   f"the first call starts; at most {MAX_TRACE_SECONDS:g} s")
    groups: dict[str, list] = {}
    for call in sorted(calls, key=lambda c: (c["start"], c["span"])):
        groups.setdefault(call["conversation"], []).append(call)
    return [_conversation(key, group, origin, ignore_eos) for key, group in groups.items()]


def _documents(path: Path):
    text = _text(path)
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


def _text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise TraceFormatError(path, line, f"not UTF-8 text (byte {raw[exc.start]:#04x})") from None


def _model_calls(path: Path, line: int, doc: dict):
    if not isinstance(doc, dict) or "resourceSpans" not in doc:
        raise TraceFormatError(path, line, "not an OTLP JSON document (no resourceSpans)")
    for resource in _objects(path, line, doc, "resourceSpans"):
        for scope in _objects(path, line, resource, "scopeSpans"):
            for span in _objects(path, line, scope, "spans"):
                attrs = _attributes(path, line, span)
                if attrs.get("gen_ai.operation.name") not in MODEL_CALLS:
                    continue
                yield _call(path, line, span, attrs)


def _objects(path: Path, line: int, parent: dict, key: str) -> list[dict]:
    """parent[key], a list of JSON objects (absent: none)."""
    items = parent.get(key, [])
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise TraceFormatError(path, line, f"{key} must be a list of objects, not {_short(items)}")
    return items


def _attributes(path: Path, line: int, span: dict) -> dict:
    attrs = {}
    for attr in _objects(path, line, span, "attributes"):
        key, value = attr.get("key"), attr.get("value", {})
        if not isinstance(key, str) or not isinstance(value, dict):
            raise TraceFormatError(path, line, f"span {span.get('spanId')!r}: attribute {_short(attr)} must be "
                                               '{"key": "...", "value": {"stringValue"|"intValue"|...: ...}}')
        attrs[key] = _value(value)
    return attrs


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _call(path: Path, line: int, span: dict, attrs: dict) -> dict:
    where = f"span {span.get('spanId')!r}"
    inputs = _tokens(path, line, where, attrs, "gen_ai.usage.input_tokens", 1)
    outputs = _tokens(path, line, where, attrs, "gen_ai.usage.output_tokens", 0)
    try:
        start, end = int(span["startTimeUnixNano"]) / 1e9, int(span["endTimeUnixNano"]) / 1e9
    except (KeyError, ValueError, TypeError, OverflowError) as exc:
        raise TraceFormatError(path, line, f"{where}: missing or bad {exc}") from None
    if end < start:
        raise TraceFormatError(path, line, f"{where}: ends ({end} s) before it starts ({start} s)")
    return {"conversation": str(attrs.get("gen_ai.conversation.id") or span.get("traceId")),
            "span": str(span.get("spanId")), "start": start, "end": end, "input": inputs, "output": outputs,
            "line": line}


def _tokens(path: Path, line: int, where: str, attrs: dict, key: str, minimum: int) -> int:
    """A token count: an integer (OTLP JSON writes intValue as a string) in [minimum, MAX_TRACE_TOKENS]."""
    if key not in attrs:
        raise TraceFormatError(path, line, f"{where}: missing {key!r}")
    value, number = attrs[key], None
    if isinstance(value, float) and value.is_integer() or isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            number = int(value)
        except ValueError:
            pass
    if number is None or not minimum <= number <= MAX_TRACE_TOKENS:
        raise TraceFormatError(path, line, f"{where}: {key}={value!r} must be an integer in "
                                           f"[{minimum}, {MAX_TRACE_TOKENS}]")
    return number


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
