"""The batch controller: FCFS, never over capacity, every request finishes, clear errors."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psa_ref.kvcache.batch import BatchController


@given(capacity=st.integers(1, 20), max_batch=st.one_of(st.none(), st.integers(1, 5)),
       requests=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 6), st.integers(0, 8)), min_size=1, max_size=25))
def test_fcfs_capacity_and_every_request_finishes(capacity, max_batch, requests):
    """Requests ``(demand, decode steps, arrival tick)`` arrive over time; the loop admits,
    decodes one tick, and finishes requests whose steps are done."""
    requests = [(min(d, capacity), n, a) for d, n, a in requests]
    ctl = BatchController(capacity, max_batch=max_batch)
    left, submitted, arrival_order = {}, 0, sorted(range(len(requests)), key=lambda i: requests[i][2])
    limit = sum(n for _, n, _ in requests) + max(a for _, _, a in requests) + 1  # all run one at a time, at worst
    for tick in range(limit + 1):
        while submitted < len(requests) and requests[arrival_order[submitted]][2] <= tick:
            i = arrival_order[submitted]
            ctl.submit(i, requests[i][0])
            submitted += 1
        for i in ctl.admit():
            left[i] = requests[i][1]
        assert ctl.reserved <= capacity
        assert max_batch is None or len(ctl.running) <= max_batch
        assert ctl.reserved == sum(requests[i][0] for i in ctl.running)
        # FCFS: admitted exactly in submission order, and the head of the queue really did not fit
        assert ctl.admitted == arrival_order[: len(ctl.admitted)]
        if ctl.waiting:
            head = requests[ctl.waiting[0]][0]
            assert ctl.reserved + head > capacity or len(ctl.running) == max_batch
        for i in ctl.running:
            left[i] -= 1
            if left[i] == 0:
                ctl.finish(i)
        if submitted == len(requests) and ctl.idle:
            break
    assert ctl.idle and sorted(ctl.admitted) == list(range(len(requests))), "some request never finished"


def test_head_of_line_blocks_later_requests_that_would_fit():
    ctl = BatchController(10)
    ctl.submit("a", 6)
    ctl.submit("b", 6)
    ctl.submit("c", 1)
    assert ctl.admit() == ["a"]
    assert ctl.waiting == ("b", "c") and ctl.reserved == 6  # c fits in the 4 free slots, but b is first
    ctl.finish("a")
    assert ctl.admit() == ["b", "c"] and ctl.reserved == 7 and ctl.running == ("b", "c")


def test_max_batch_limits_admission():
    ctl = BatchController(100, max_batch=2)
    for r in range(3):
        ctl.submit(r, 1)
    assert ctl.admit() == [0, 1] and ctl.admit() == []
    ctl.finish(1)
    assert ctl.admit() == [2] and ctl.running == (0, 2)


@pytest.mark.parametrize("call, exc, words", [
    (lambda c: c.submit("big", 9), ValueError, r"blocks_per_iteration \(9\) exceeds the pool's capacity \(8"),
    (lambda c: c.submit("x", 0), ValueError, "blocks_per_iteration must be >= 1"),
    (lambda c: c.submit("x", True), TypeError, "blocks_per_iteration must be an integer"),
    (lambda c: c.submit("a", 1), ValueError, "request 'a' was already submitted"),
    (lambda c: c.finish("nobody"), ValueError, "request 'nobody' is not running"),
    (lambda c: BatchController(0), ValueError, "capacity must be >= 1"),
    (lambda c: BatchController(4, max_batch=0), ValueError, "max_batch must be >= 1"),
])
def test_rejects(call, exc, words):
    ctl = BatchController(8)
    ctl.submit("a", 2)
    with pytest.raises(exc, match=words):
        call(ctl)
    assert ctl.waiting == ("a",)  # nothing else was queued


def test_offload_admission_counts_two_iterations_per_request():
    """psa_fast.offload's controller: a request needs one iteration's blocks, and the pipelined decoder
    keeps two iterations in the pool, so half the partition is what requests may reserve."""
    from psa_fast.offload import batch_controller, blocks_per_iteration

    need = blocks_per_iteration(num_q_heads=32, num_kv_heads=8, step=64)
    assert need == 8 * 64
    assert blocks_per_iteration(num_q_heads=32, num_kv_heads=8, step=64, gqa="per_head") == 32 * 64
    assert blocks_per_iteration(num_q_heads=4, num_kv_heads=1, step=2, sink_blocks=3, recent_blocks=1) == 4
    ctl = batch_controller(4 * need + 1)  # room for two requests' iterations, twice over
    for r in "abc":
        ctl.submit(r, need)
    assert ctl.admit() == ["a", "b"] and ctl.waiting == ("c",)
    ctl.finish("a")
    assert ctl.admit() == ["c"]
    with pytest.raises(ValueError):
        batch_controller(2 * need - 2).submit("d", need)  # can never run: refused at once
    with pytest.raises(ValueError, match="num_q_heads"):
        blocks_per_iteration(num_q_heads=6, num_kv_heads=4, step=8)
