"""KV cache manager speed: admitting prompts, growing decode rows, freeing finished requests.

A stand-alone loop over `KVCacheManager` with prefix caching on, shaped like the issue-15 setup under
load (7,500 blocks of 16 tokens, ~1,000-token prompts, a third sharing a 512-token prefix, ~200 output
tokens, 64 requests running). Decode rows grow as `Policy.decode_running` grows them (in place, or one
more block with `take_next_block`, then `cache_full_blocks`). Prints the CPU time of each part and per
block, and a checksum of the block tables and free-queue order (equal before and after a change of the
manager's internals means the same blocks were chosen in the same order). Without prefix caching it
runs the plain manager and `sim.core.kv_stack`'s in the same run.

    python benchmarks/kv_speed.py [--requests 3000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import time
import zlib

import numpy as np

from sim.core.kv_cache import KVCacheManager
try:
    from sim.core.kv_stack import StackedKVCacheManager
except ImportError:  # a checkout from before it (PYTHONPATH=<checkout> to time another tree)
    StackedKVCacheManager = None
from sim.core.request import Request
from sim.core.sampling_params import SamplingParams

NUM_BLOCKS, BLOCK_SIZE, RUNNING = 7_500, 16, 64


def make_requests(num: int, seed: int = 0) -> list[tuple[Request, list[int]]]:
    """(request, its output tokens) pairs; every third prompt starts with one shared prefix."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(3, 32_000, 512, dtype=np.int32)
    out = []
    for i in range(num):
        prompt = rng.integers(3, 32_000, int(rng.integers(600, 1_800)), dtype=np.int32)
        if i % 3 == 0:
            prompt[:512] = shared
        outputs = rng.integers(3, 32_000, int(rng.integers(20, 400))).tolist()
        out.append((Request(f"r{i}", prompt, SamplingParams(), eos_token_id=2), outputs))
    return out


MANAGERS = {  # name: a fresh manager
    "prefix caching": lambda: KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True),
    "no prefix caching, free queue": lambda: KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, False),
}
if StackedKVCacheManager is not None:
    MANAGERS["no prefix caching, stack (kv_stack)"] = lambda: StackedKVCacheManager(NUM_BLOCKS, BLOCK_SIZE)


def run(pairs, timers: dict, kv: KVCacheManager) -> int:
    """One pass over `pairs`; returns a checksum of every block choice and the final free queue."""
    outputs = {req: tokens for req, tokens in pairs}
    waiting, running, check = list(reversed(pairs)), [], 0
    clock = time.process_time
    while waiting or running:
        t0 = clock()
        while waiting and len(running) < RUNNING:  # admit (as try_admit does)
            req = waiting[-1][0]
            hits, num_hit = kv.lookup_prefix(req)
            if kv.allocate(req, req.num_tokens - num_hit, hits) is None:
                break
            waiting.pop()
            req.num_computed_tokens = req.num_tokens
            req.output_token_ids.append(outputs[req][0])
            running.append(req)
        t1 = clock()
        grow = 0.0
        for req in running:  # one decode token each (as decode_running does)
            blocks = kv.req_blocks[req]
            total = req.num_computed_tokens + 1
            if total > len(blocks) * BLOCK_SIZE:  # a new block: timed from here
                g0 = clock()
                if not kv.take_next_block(blocks, total):
                    raise RuntimeError("benchmark sized to never run out of blocks")
                grow -= g0 - clock()
            elif kv.enable_prefix_caching and total // BLOCK_SIZE > kv.num_hashed_blocks.get(req, 0):
                g0 = clock()
                kv.cache_full_blocks(req, total)
                grow -= g0 - clock()
            req.num_computed_tokens = total
            req.output_token_ids.append(outputs[req][len(req.output_token_ids)])
        done = [r for r in running if len(r.output_token_ids) == len(outputs[r])]
        for req in done:
            check = zlib.crc32(np.asarray(kv.req_blocks[req], np.int64).tobytes(), check)
        t2 = clock()
        for req in done:
            kv.free(req, forget=True)
        t3 = clock()
        if done:
            running = [r for r in running if r not in set(done)]
        timers["admit"] += t1 - t0
        timers["decode"] += grow
        timers["free"] += t3 - t2
    return zlib.crc32(np.asarray(list(kv.free_queue), np.int64).tobytes(), check)


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3_000)
    parser.add_argument("--repeat", type=int, default=3)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    best: dict = {name: {} for name in MANAGERS}
    checks = {}
    for _ in range(args.repeat):
        for name, make in MANAGERS.items():
            pairs = make_requests(args.requests)
            timers = {"admit": 0.0, "decode": 0.0, "free": 0.0}
            checks[name] = run(pairs, timers, make())
            for k, v in timers.items():
                best[name][k] = min(best[name].get(k, v), v)
    prompt_blocks = sum(r.num_prompt_tokens for r, _ in pairs) // BLOCK_SIZE
    total_blocks = sum(len(o) + r.num_prompt_tokens for r, o in pairs) // BLOCK_SIZE
    print(f"{args.requests} requests, {prompt_blocks} prompt blocks, {total_blocks} blocks in all;"
          f" best CPU time of {args.repeat}")
    for name, b in best.items():
        print(f"{name}: admit {b['admit']:.3f} s ({1e6 * b['admit'] / prompt_blocks:.2f} us/prompt block),"
              f" growth {b['decode']:.3f} s ({1e6 * b['decode'] / (total_blocks - prompt_blocks):.2f}"
              f" us/output block), free {b['free']:.3f} s ({1e6 * b['free'] / total_blocks:.2f} us/block),"
              f" total {sum(b.values()):.3f} s; checksum {checks[name]:08x}")
    if StackedKVCacheManager is not None:
        plain, stack = (sum(best[n].values()) for n in list(MANAGERS)[1:])
        print(f"stack vs free queue (no prefix caching): x{plain / stack:.2f},"
              f" same blocks: {checks[list(MANAGERS)[1]] == checks[list(MANAGERS)[2]]}")
    print(f"one decode row's block registered (cache_full_blocks, prefix caching):"
          f" {min(one_block_registration() for _ in range(args.repeat)):.3f} us")


def one_block_registration(rows: int = 300, blocks: int = 60) -> float:
    """Microseconds per `cache_full_blocks` call that registers the one block of output tokens a
    decode row just filled (blocks held already, tokens known)."""
    rng = np.random.default_rng(1)
    kv = KVCacheManager(rows * (blocks + 40) + 1, BLOCK_SIZE, enable_prefix_caching=True)
    prompt_len = 500  # not a multiple of the block size: block 31 mixes prompt and output tokens
    reqs = []
    for i in range(rows):
        req = Request(f"r{i}", rng.integers(3, 32_000, prompt_len, dtype=np.int32), SamplingParams(), 2)
        kv.allocate(req, prompt_len + BLOCK_SIZE * blocks)
        req.num_computed_tokens = prompt_len
        kv.cache_full_blocks(req)
        req.output_token_ids.extend(rng.integers(3, 32_000, BLOCK_SIZE * blocks).tolist())
        reqs.append(req)
    start = time.process_time()
    for k in range(2, blocks):  # from the first block of output tokens only
        for req in reqs:
            kv.cache_full_blocks(req, prompt_len + BLOCK_SIZE * k)
    return 1e6 * (time.process_time() - start) / ((blocks - 2) * rows)

if __name__ == "__main__":
    main()
