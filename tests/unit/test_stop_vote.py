"""The SIGTERM vote (pipeline/interrupts/stop.py): when the ranks vote, from the step time the
slowest one measured, and that every rank votes at the same steps."""

from __future__ import annotations

import math
import signal
import threading

import pytest
import torch

from pipeline.interrupts.stop import (
    VOTE_EVERY_S,
    VOTE_EVERY_STEPS,
    StopRequest,
    steps_to_next_vote,
)


@pytest.fixture(autouse=True)
def sigterm_handler_restored():
    """A StopRequest installs its SIGTERM handler: the test process's own comes back."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize(
    "step_seconds, steps",
    [
        (0.0, VOTE_EVERY_STEPS),  # a clock that did not move
        (1e-4, VOTE_EVERY_STEPS),  # a GPU's steps: the step cap decides
        (VOTE_EVERY_S / VOTE_EVERY_STEPS, VOTE_EVERY_STEPS),  # both bounds at once
        (VOTE_EVERY_S / 4, 4),
        (VOTE_EVERY_S * 0.3, 3),
        (VOTE_EVERY_S / 2, 2),
        (VOTE_EVERY_S * 0.51, 1),
        (VOTE_EVERY_S, 1),
        (VOTE_EVERY_S * 4, 1),  # slower than the bound: a vote at every step
        (math.inf, 1),
    ],
)
def test_the_next_vote_comes_within_the_bound(step_seconds, steps):
    assert steps_to_next_vote(step_seconds) == steps


@pytest.mark.parametrize("bound_s, most", [(VOTE_EVERY_S, VOTE_EVERY_STEPS), (2.0, 16), (0.5, 1)])
def test_the_next_vote_is_the_latest_within_both_bounds(bound_s, most):
    """Over step times from 10 µs to 1000 s: the interval is 1..most steps, no longer than
    bound_s unless one step is, and one step more would break a bound."""
    times = [10 ** (k / 100) for k in range(-500, 301)]
    counts = [steps_to_next_vote(t, bound_s, most) for t in times]
    for t, n in zip(times, counts):
        assert 1 <= n <= most, t
        assert n == 1 or n * t <= bound_s * (1 + 1e-12), t
        assert n == most or (n + 1) * t > bound_s * (1 - 1e-12), t
    assert counts == sorted(counts, reverse=True)  # slower steps, votes as often or more


class Clock:
    """Host seconds the test moves on."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rank(peer_step_seconds: float = 0.0, peer_flag: bool = False):
    """A StopRequest of a 2-process job whose other rank reports `peer_*` at every vote;
    returns it, its clock, and the list of the boundaries it voted at."""
    clock, votes = Clock(), []

    def reduce(vote: torch.Tensor) -> None:
        votes.append(stop.boundaries - 1)
        vote.copy_(torch.maximum(vote, torch.tensor([float(peer_flag), peer_step_seconds])))

    stop = StopRequest(world_size=2, clock=clock, reduce=reduce)
    return stop, clock, votes


def steps(stop: StopRequest, clock: Clock, n: int, step_seconds: float) -> list[bool]:
    """`n` step boundaries, each followed by a step of `step_seconds`."""
    out = []
    for _ in range(n):
        out.append(stop.agreed())
        clock.now += step_seconds
    return out


def test_one_process_stops_at_its_next_step_without_a_vote():
    def no_vote(vote: torch.Tensor) -> None:
        raise AssertionError("one process voted")

    clock = Clock()
    stop = StopRequest(world_size=1, clock=clock, reduce=no_vote)
    assert steps(stop, clock, 3, 5.0) == [False] * 3
    stop.flag = True
    assert stop.agreed()


def test_the_first_vote_follows_the_first_step_then_the_bound_sets_the_pace():
    stop, clock, votes = rank()
    steps(stop, clock, 12, VOTE_EVERY_S * 0.3)
    assert votes == [1, 4, 7, 10]  # 3 steps of 0.3 s fit in the bound


def test_slow_steps_vote_at_every_step_and_fast_ones_every_vote_every_steps():
    slow, clock, votes = rank()
    steps(slow, clock, 5, VOTE_EVERY_S * 3)
    assert votes == [1, 2, 3, 4]
    fast, clock, votes = rank()
    steps(fast, clock, 40, 1e-3)
    assert votes == [1, 1 + VOTE_EVERY_STEPS, 1 + 2 * VOTE_EVERY_STEPS]


def test_the_slowest_rank_sets_the_pace():
    stop, clock, votes = rank(peer_step_seconds=VOTE_EVERY_S / 2)
    steps(stop, clock, 8, 1e-3)  # this rank is fast, its peer takes half the bound a step
    assert votes == [1, 3, 5, 7]


def test_a_pace_change_is_measured_over_the_steps_since_the_last_vote():
    stop, clock, votes = rank()
    steps(stop, clock, 1 + VOTE_EVERY_STEPS, 1e-3)  # votes at 1 and 17
    steps(stop, clock, 4, VOTE_EVERY_S * 2)  # slow from step 17 on
    # the vote at 17 timed the fast steps: the next is 16 on, and times the slow ones since
    steps(stop, clock, 16, VOTE_EVERY_S * 2)
    assert votes == [1, 17, 33, 34, 35, 36]


def test_a_sigterm_right_after_a_vote_is_agreed_at_the_next():
    stop, clock, votes = rank()
    assert steps(stop, clock, 2, VOTE_EVERY_S / 4) == [False, False]  # voted at 1, next at 5
    stop.flag = True
    assert steps(stop, clock, 4, VOTE_EVERY_S / 4) == [False, False, False, True]
    assert votes == [1, 5]


def test_another_ranks_sigterm_stops_this_one_at_the_same_vote():
    stop, clock, _ = rank(peer_flag=True)
    assert steps(stop, clock, 2, 0.1) == [False, True]  # the first vote, after step 0


def test_ranks_with_different_clocks_vote_at_the_same_steps():
    """Two ranks in threads, each with its own clock (one fast, one slow and irregular),
    all-reducing through a barrier as a collective would: a rank that voted alone would wait
    there until the barrier's timeout. A SIGTERM that only rank 1 saw stops both at the same
    boundary."""
    barrier, shared = threading.Barrier(2, timeout=10), [torch.zeros(2), torch.zeros(2)]
    seen: list[list[int]] = [[], []]
    stopped_at: list[int | None] = [None, None]
    clocks = [Clock(), Clock()]

    def reducer(me: int):
        def reduce(vote: torch.Tensor) -> None:
            seen[me].append(stops[me].boundaries - 1)
            shared[me] = vote.clone()
            barrier.wait()
            vote.copy_(torch.maximum(shared[0], shared[1]))
            barrier.wait()

        return reduce

    # built here: a signal handler is installed from the main thread only
    stops = [StopRequest(world_size=2, clock=clocks[me], reduce=reducer(me)) for me in (0, 1)]

    def run(me: int) -> None:
        for boundary in range(200):
            if stops[me].agreed():
                stopped_at[me] = boundary
                return
            if me == 1 and boundary == 150:
                stops[me].flag = True  # right after the boundary's vote, if it had one
            clocks[me].now += 0.01 if me == 0 else 0.05 * (1 + boundary % 7)

    threads = [threading.Thread(target=run, args=(me,)) for me in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen[0] == seen[1] and len(seen[0]) > 20
    assert stopped_at[0] == stopped_at[1] and stopped_at[0] is not None
    assert 150 < stopped_at[0] <= 150 + VOTE_EVERY_STEPS
