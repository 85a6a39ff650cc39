"""Client aborts in a disaggregated deployment: wherever the request is, its KV is released on
every instance and it finishes exactly once, as aborted.

Where an abort (`RequestSpec.abort_time_s`) can find a request, and what happens:

- on its prefill instance (waiting, or running before its first token): the engine aborts it as
  any engine does (during a step: at the step's end, before the step's tokens are applied);
- handed off, waiting for decode blocks: it leaves the queue, the prefill instance frees its
  blocks, the decode side finishes it now;
- handed off, its KV on the link: `DisaggConfig.abort_in_transfer` says what happens.
  "wait" (the default, vLLM's behaviour): the transfer runs to the end and the abort takes effect
  when it lands, both sides freeing their blocks then. vLLM's NIXL connector keeps the sender's
  blocks of an aborted request until the receiver has read them or a timeout passes
  (vllm-project/vllm#25067), and the receiver frees the blocks of a request aborted in
  WAITING_FOR_REMOTE_KVS only when its receive finishes (vllm-project/vllm#46283).
  "cancel": the transfer stops at once (as a connector that releases its transfer request, e.g.
  NIXL's releaseXferReq, would): its share of the link goes to the other transfers, both sides free
  their blocks and the request finishes now;
- arrived, waiting for a decode seat: the decode instance frees its blocks and finishes it now;
- decoding: the decode engine aborts it.
"""
from __future__ import annotations

from sim.core.request import RequestStatus

ABORT_IN_TRANSFER = ("wait", "cancel")


def abort_at(cluster, request_id: str, when: float):
    """SimPy process: abort `request_id` at `when` (nothing if it has finished by then)."""
    yield cluster.env.timeout(max(0.0, when - cluster.env.now))
    abort(cluster, request_id, cluster.env.now)


def abort(cluster, request_id: str, now: float) -> None:
    if request_id not in cluster.done_events:
        return                                   # finished already
    t = cluster.handoffs.get(request_id)
    if t is None:                                # still on its prefill instance
        i = cluster.prefill_of[request_id]
        cluster.prefill[i].abort(request_id, now)
        cluster.prefill_procs[i]._wake()
        return
    d = t.destination
    if t in cluster.pending[d]:
        cluster.pending[d].remove(t)
        release_prefill(cluster, t, now)
        finish_decode_aborted(cluster, t, now)
        cluster.start_transfers(d)
    elif request_id in cluster.in_flight and cluster.disagg.abort_in_transfer == "cancel":
        cluster.fabric.cancel(t.flow)            # its share of the link goes to the others now
        del cluster.in_flight[request_id]
        land_aborted(cluster, t, now)
    elif request_id in cluster.in_flight:
        t.aborted = True                         # applied when the transfer lands
    elif t.decode_req in cluster.arrived[d]:
        cluster.arrived[d].remove(t.decode_req)
        finish_decode_aborted(cluster, t, now)
        cluster.start_transfers(d)
    else:
        cluster.decode[d].abort(request_id, now)
        cluster.decode_procs[d]._wake()


def land_aborted(cluster, t, now: float) -> None:
    """The KV of an aborted request has landed (or its transfer was cancelled): free it on both
    sides and finish the request."""
    release_prefill(cluster, t, now)
    finish_decode_aborted(cluster, t, now)
    cluster.start_transfers(t.destination)


def release_prefill(cluster, t, now: float) -> None:
    """The prefill instance frees the blocks it held for the transfer (its half is done)."""
    t.prefill_req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    cluster.prefill[t.source].complete(t.prefill_req, now)
    cluster.prefill_procs[t.source]._wake()


def finish_decode_aborted(cluster, t, now: float) -> None:
    """The decode half (not in the decode batch) finishes aborted; its blocks, if any, are freed."""
    t.decode_req.status = RequestStatus.FINISHED_ABORTED
    cluster.decode[t.destination].complete(t.decode_req, now)
    cluster.decode_procs[t.destination]._wake()
