"""Multi-turn and agentic traces replayed closed-loop: Mooncake prefix-hash and OpenTelemetry GenAI
importers on small fixtures made here, and the closed-loop timing rule."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.api.simulator import SimulationConfig, simulate
from workloads.conversations import ConversationReplay, mooncake_conversations
from workloads.errors import TraceFormatError
from workloads.otel_genai import otel_genai_conversations

MOONCAKE = Path("/work/shared/data/mooncake_fast25/conversation_trace.jsonl")


def _mooncake_fixture(tmp_path) -> Path:
    rows = [  # conversation A: blocks 0,1,2 (+ partial 3); its next turn keeps 0,1,2 and adds; B unrelated
        {"timestamp": 0, "input_length": 1800, "output_length": 20, "hash_ids": [0, 1, 2, 3]},
        {"timestamp": 500, "input_length": 900, "output_length": 10, "hash_ids": [0, 7]},
        {"timestamp": 4000, "input_length": 2600, "output_length": 30, "hash_ids": [0, 1, 2, 4, 5, 6]},
    ]
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _span(trace, span, op, start_ms, end_ms, **attrs):
    values = [{"key": "gen_ai.operation.name", "value": {"stringValue": op}}]
    values += [{"key": f"gen_ai.usage.{k}", "value": {"intValue": str(v)}} for k, v in attrs.items()]
    return {"traceId": trace, "spanId": span, "name": op, "startTimeUnixNano": str(int(start_ms * 1e6)),
            "endTimeUnixNano": str(int(end_ms * 1e6)), "attributes": values}


def _otel_fixture(tmp_path) -> Path:
    spans = [_span("t1", "a", "chat", 0, 800, input_tokens=600, output_tokens=40),
             _span("t1", "b", "execute_tool", 800, 2800),
             _span("t1", "c", "chat", 3000, 3500, input_tokens=900, output_tokens=25),
             _span("t2", "d", "chat", 1000, 1400, input_tokens=300, output_tokens=12)]
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(doc))
    return path


def test_mooncake_turns_chain_by_their_full_blocks(tmp_path):
    conversations = mooncake_conversations(_mooncake_fixture(tmp_path))
    assert [len(c.turns) for c in conversations] == [2, 1]
    a = conversations[0]
    assert [t.gap_s for t in a.turns] == [0.0, 4.0]
    assert [t.spec.num_prompt_tokens for t in a.turns] == [1800, 2600]
    slower = mooncake_conversations(_mooncake_fixture(tmp_path), time_scale=10)
    assert [t.gap_s for t in slower[0].turns] == [0.0, 40.0] and slower[1].start_s == 5.0


def test_each_turn_arrives_after_the_previous_answer_plus_its_gap(tmp_path):
    replay = ConversationReplay(mooncake_conversations(_mooncake_fixture(tmp_path)))
    r = simulate(SimulationConfig(), workload=replay).requests.set_index("request_id")
    assert r.loc["mc0-t1", "arrival_time"] == pytest.approx(r.loc["mc0-t0", "finish_time"] + 4.0)
    assert r.loc["mc1-t0", "arrival_time"] == pytest.approx(0.5)
    assert r.loc["mc0-t1", "num_cached_tokens"] == 3 * 512   # blocks 0-2 shared
    first = simulate(SimulationConfig(), workload=replay).requests
    assert first.equals(simulate(SimulationConfig(), workload=replay).requests)


def test_otel_genai_calls_group_by_trace_with_tool_time_gaps(tmp_path):
    conversations = {c.session_id: c for c in otel_genai_conversations(_otel_fixture(tmp_path))}
    agent = conversations["otel-t1"]
    assert [t.gap_s for t in agent.turns] == pytest.approx([0.0, 2.2])   # tool + agent time
    assert [t.spec.num_prompt_tokens for t in agent.turns] == [600, 900]
    assert (agent.turns[1].spec.prompt_token_ids[:600] == agent.turns[0].spec.prompt_token_ids).all()
    assert conversations["otel-t2"].start_s == pytest.approx(1.0)
    r = simulate(SimulationConfig(), workload=ConversationReplay(list(conversations.values()))).requests
    r = r.set_index("request_id")
    assert r.loc["otel-t1-t1", "arrival_time"] == pytest.approx(r.loc["otel-t1-t0", "finish_time"] + 2.2)
    assert r.loc["otel-t1-t1", "num_cached_tokens"] == 592        # 37 full blocks of the shared context


def test_files_without_genai_model_calls_are_named_errors(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        _span("t", "s", "execute_tool", 0, 1)]}]}]}))
    with pytest.raises(TraceFormatError, match="no GenAI model-call spans"):
        otel_genai_conversations(path)
    path.write_text('{"not": "otlp"}')
    with pytest.raises(TraceFormatError, match="no resourceSpans"):
        otel_genai_conversations(path)


def _one_call(**usage) -> dict:
    return {"resourceSpans": [{"scopeSpans": [{"spans": [_span("t", "s1", "chat", 0, 1, **usage)]}]}]}


@pytest.mark.parametrize("content, message", [
    ('{"resourceSpans": 5}', "resourceSpans must be a list of objects, not 5"),
    ('{"resourceSpans": [5]}', r"resourceSpans must be a list of objects, not \[5\]"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"attributes": "x"}]}]}]}',
     "attributes must be a list of objects, not 'x'"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "s1", "attributes": [{"value": {}}]}]}]}]}',
     "span 's1': attribute {'value': {}} must be"),
    (json.dumps(_one_call(input_tokens=99999999999, output_tokens=10)),
     "span 's1': gen_ai.usage.input_tokens='99999999999' must be an integer in \\[1, 16777216\\]"),
    (json.dumps(_one_call(input_tokens=10, output_tokens=2**24 + 1)),
     "span 's1': gen_ai.usage.output_tokens='16777217' must be an integer in \\[0, 16777216\\]"),
    (json.dumps(_one_call(input_tokens="1.5", output_tokens=10)), "span 's1': gen_ai.usage.input_tokens='1.5' must be"),
    (json.dumps(_one_call(output_tokens=10)), "span 's1': missing 'gen_ai.usage.input_tokens'"),
    (json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        _span("t", "s1", "chat", 0, 1, input_tokens=5, output_tokens=1),
        _span("t", "s2", "chat", 0, 2e12, input_tokens=5, output_tokens=1)]}]}]}),
     "span 's2' ends 2e\\+09 s after the first call starts; at most 1e\\+09 s"),
])
def test_malformed_otel_files_are_errors_naming_file_span_and_value(tmp_path, content, message):
    path = tmp_path / "spans.json"
    path.write_text(content)
    with pytest.raises(TraceFormatError, match=f"^{path}:1: {message}"):
        otel_genai_conversations(path)


def test_otel_bytes_that_are_not_utf8_name_the_line(tmp_path):
    path = tmp_path / "spans.json"
    path.write_bytes(b'{"resourceSpans": []}\n\xff\xfe\x00')
    with pytest.raises(TraceFormatError, match=f"^{path}:2: not UTF-8 text \\(byte 0xff\\)"):
        otel_genai_conversations(path)


@pytest.mark.skipif(not MOONCAKE.exists(), reason="Mooncake trace not present")
def test_the_mooncake_conversation_trace_has_multi_turn_conversations():
    conversations = mooncake_conversations(MOONCAKE, max_requests=2000)
    assert sum(len(c.turns) for c in conversations) == 2000
    assert sum(len(c.turns) > 1 for c in conversations) > 100
