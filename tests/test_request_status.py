"""RequestStatus order, is_finished and the finish_reason of every status."""
from __future__ import annotations

import pytest

from sim import Request, RequestStatus, SamplingParams, finish_reason, is_finished
from sim.core.request import finish_reason_of

ALIVE = (RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED)
EXPECTED_REASON = {
    RequestStatus.WAITING: None,
    RequestStatus.RUNNING: None,
    RequestStatus.PREEMPTED: None,
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_REPETITION: "repetition",
}


def make_request(status: RequestStatus) -> Request:
    """A bare request in `status`."""
    request = Request("r0", [1, 2, 3], SamplingParams(), eos_token_id=0)
    request.status = status
    return request


def test_status_order_is_the_lifecycle():
    """WAITING < RUNNING < PREEMPTED < every FINISHED_* status."""
    assert ALIVE == tuple(sorted(ALIVE))
    finished = [status for status in RequestStatus if status not in ALIVE]
    assert finished and all(status > RequestStatus.PREEMPTED for status in finished)


def test_every_status_has_an_expected_reason():
    """The table below covers the whole enum, so a new status must be added to it."""
    assert set(EXPECTED_REASON) == set(RequestStatus)


@pytest.mark.parametrize("status", list(RequestStatus))
def test_is_finished_means_past_preempted(status):
    """is_finished, the property and the ordering agree."""
    assert is_finished(status) == (status not in ALIVE)
    assert make_request(status).is_finished == is_finished(status)


@pytest.mark.parametrize("status", list(RequestStatus))
def test_finish_reason_for_every_status(status):
    """Unfinished requests have no reason; finished ones map to stop / length / abort."""
    request = make_request(status)
    assert finish_reason(request) == EXPECTED_REASON[status]
    assert request.finish_reason == EXPECTED_REASON[status]
    assert finish_reason_of(status) == EXPECTED_REASON[status]


def test_new_request_is_waiting_and_counts_tokens():
    """A request starts WAITING with no output; num_tokens is prompt plus output."""
    request = Request("r1", [5, 6], SamplingParams(), eos_token_id=0)
    assert (request.status, finish_reason(request)) == (RequestStatus.WAITING, None)
    request.output_token_ids.append(0)
    assert (request.num_tokens, request.num_output_tokens) == (3, 1)
