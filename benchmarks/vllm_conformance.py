"""Differential conformance: servesim's `vllm` scheduler profiles against vLLM's real V1 Scheduler.

    python benchmarks/vllm_conformance.py compare -n 1000            # live: needs vLLM (README)
    python benchmarks/vllm_conformance.py record -n 1000             # write tests/data/vllm_conformance/
    python benchmarks/vllm_conformance.py replay tests/data/vllm_conformance/vllm-0.33.0.jsonl.gz
    python benchmarks/vllm_conformance.py record --stop-rules -n 1000   # vllm-<version>-stop.jsonl.gz
    python benchmarks/vllm_conformance.py record --spec -n 300          # vllm-<version>-spec.jsonl.gz
    python benchmarks/vllm_conformance.py record --spec --stop-rules -n 300   # vllm-<version>-spec-stop.jsonl.gz
    python benchmarks/vllm_conformance.py record --hybrid -n 300        # vllm-<version>-hybrid.jsonl.gz
    python benchmarks/vllm_conformance.py record --hybrid --spec -n 300   # vllm-<version>-hybrid-spec.jsonl.gz
    python benchmarks/vllm_conformance.py record --hybrid --align -n 300  # vllm-<version>-hybrid-align.jsonl.gz

`compare` drives both with the same random scenarios (seeds start..start+n) and prints the agreement
rate and, for each disagreement, the first differing step of the scenario shrunk to fewer requests.
`record` stores vLLM's traces of the hand-made regression scenarios (sim/fidelity/conformance/cases.py)
and the random ones, with its version, so tests replay them against servesim without vLLM.
`replay` checks servesim against a recorded file. The scheduler profile defaults to the one named
after the vLLM version (vllm-0.33 for 0.33.x). `--stop-rules` uses the stop-rule scenarios instead
(min_tokens, max_tokens unset, stop strings found by vLLM's detokenizer; the hand-made ones from
`stop_rule_cases`). `--spec` uses speculative-decoding scenarios (EAGLE with k drafts and a seeded
acceptance pattern both sides share, KV often tight; random ones only). `--spec --stop-rules`: the
stop-rule requests under speculative decoding, where a stop string often completes inside a step that
verifies several tokens (hand-made ones from `spec_stop_cases`); servesim finds the stop strings in the
front end there, as vLLM does (`stop_string_detection="frontend"`). `--hybrid` uses hybrid models'
KV groups (full attention with sliding-window, chunked local or linear-attention state groups, one
shared block pool; random ones only). `--hybrid --spec`: EAGLE on a hybrid model (sliding-window or
state groups; not chunked local attention, for which vLLM turns its hybrid KV manager off under EAGLE),
random ones only. `--hybrid --align`: a state model with prefix caching on, in vLLM's "align" Mamba cache
mode (0.33's default for hybrids with prefix caching), random ones only.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.fidelity.conformance.cases import regression_cases, spec_stop_cases, stop_rule_cases  # noqa: E402
from sim.fidelity.conformance.compare import first_difference, shrink  # noqa: E402
from sim.fidelity.conformance.recorded import profile_for_version, read_recorded  # noqa: E402
from sim.fidelity.conformance.scenario import (  # noqa: E402
    random_hybrid_align_scenario, random_hybrid_scenario, random_hybrid_spec_scenario, random_scenario,
    random_spec_scenario)
from sim.fidelity.conformance.servesim_trace import run_servesim  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm_conformance"


def draw(seed: int, args) -> dict:
    """The random scenario of `seed` for the chosen mode."""
    if args.hybrid and args.align:
        return random_hybrid_align_scenario(seed)
    if args.hybrid:
        return random_hybrid_spec_scenario(seed) if args.spec else random_hybrid_scenario(seed)
    return random_spec_scenario(seed, args.stop_rules) if args.spec else random_scenario(seed, args.stop_rules)


def needs_vllm(command: str) -> None:
    """Exit with a message, not an ImportError, where vLLM is not installed (compare and record run it)."""
    try:
        import vllm  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "vllm":
            raise
        raise SystemExit(f"{command} drives vLLM's own scheduler, and vLLM is not installed here: install it in a "
                         "virtual environment of its own (README, \"Checking the scheduler against vLLM\"); "
                         "replay needs no vLLM") from None


def compare(args) -> int:
    needs_vllm("compare")
    from sim.fidelity.conformance.vllm_trace import run_vllm, vllm_version
    profile = args.profile or profile_for_version(vllm_version())
    agree, failures = 0, []
    for seed in range(args.start, args.start + args.n):
        scenario = draw(seed, args)
        diff = first_difference(run_vllm(scenario), run_servesim(scenario, profile))
        if diff is None:
            agree += 1
            continue
        small = shrink(scenario, lambda s: first_difference(run_vllm(s), run_servesim(s, profile)) is not None)
        failures.append((seed, first_difference(run_vllm(small), run_servesim(small, profile)), small))
    print(f"vLLM {vllm_version()} vs servesim scheduler_profile={profile}: "
          f"{agree}/{args.n} scenarios agree step for step ({100 * agree / args.n:.1f} %)")
    for seed, diff, small in failures[:args.show]:
        print(f"seed {seed} ({len(small['requests'])} requests, config {small['config']}): {diff}")
    return 0 if not failures else 1


def record(args) -> int:
    needs_vllm("record")
    from sim.fidelity.conformance.vllm_trace import run_vllm, vllm_version
    version = vllm_version()
    suffix = ("-hybrid" if args.hybrid else "") + ("-align" if args.align else "") + ("-spec" if args.spec else "") + ("-stop" if args.stop_rules else "")
    out = Path(args.out or DATA_DIR / f"vllm-{version}{suffix}.jsonl.gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.hybrid or args.spec:
        hand_made = spec_stop_cases() if args.spec and args.stop_rules else []
    else:
        hand_made = stop_rule_cases() if args.stop_rules else regression_cases()
    cases = hand_made + [
        {"name": f"seed {seed}", "scenario": draw(seed, args)}
        for seed in range(args.start, args.start + args.n)]
    with gzip.open(out, "wt") as f:
        f.write(json.dumps({"vllm_version": version, "step_s": 1.0}) + "\n")
        for case in cases:
            f.write(json.dumps(dict(case, trace=run_vllm(case["scenario"]))) + "\n")
    print(f"recorded {len(cases)} scenarios from vLLM {version} to {out}")
    return 0


def replay(args) -> int:
    version, cases = read_recorded(args.path)
    profile = args.profile or profile_for_version(version)
    failures = [(case.get("name", i), diff) for i, case in enumerate(cases)
                if (diff := first_difference(case["trace"], run_servesim(case["scenario"], profile)))]
    print(f"recorded vLLM {version} vs servesim scheduler_profile={profile}: "
          f"{len(cases) - len(failures)}/{len(cases)} scenarios agree step for step")
    for name, diff in failures[:args.show]:
        print(f"  {name}: {diff}")
    return 0 if not failures else 1


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("compare", "record"):
        p = sub.add_parser(name)
        p.add_argument("-n", type=int, default=1000, help="random scenarios")
        p.add_argument("--start", type=int, default=0, help="first seed")
        p.add_argument("--profile", help="servesim scheduler profile (default: from the vLLM version)")
        p.add_argument("--show", type=int, default=10, help="disagreements to print")
        p.add_argument("--stop-rules", action="store_true", help="the stop-rule scenarios")
        p.add_argument("--spec", action="store_true",
                       help="the speculative-decoding (EAGLE) scenarios (with --stop-rules: with stop strings)")
        p.add_argument("--hybrid", action="store_true",
                       help="hybrid models' KV groups (full + sliding window, chunked local or state; "
                            "with --spec: EAGLE on sliding-window or state groups)")
        p.add_argument("--align", action="store_true",
                       help="with --hybrid: a state model with prefix caching, Mamba cache mode \"align\"")
    sub.choices["record"].add_argument("--out", help="output .jsonl.gz")
    p = sub.add_parser("replay")
    p.add_argument("path")
    p.add_argument("--profile")
    p.add_argument("--show", type=int, default=10)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "hybrid", False) and args.stop_rules:
        parser.error("--hybrid draws no stop-rule scenarios: drop --stop-rules")
    if getattr(args, "align", False) and (not args.hybrid or args.spec):
        parser.error("--align draws hybrid scenarios without drafts: use it with --hybrid alone")
    return {"compare": compare, "record": record, "replay": replay}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
