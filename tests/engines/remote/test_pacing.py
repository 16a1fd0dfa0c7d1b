"""Pacing for remote engines: backoff, Retry-After, token buckets, adaptive concurrency."""

from __future__ import annotations

import asyncio
import email.utils
import heapq
import random
import time
from collections import Counter

import pytest

from lmpress.engines.prompt_count import estimate_tokens
from lmpress.engines.remote.learned_rate import AdaptiveRate
from lmpress.engines.remote.pacing import (
    SERVING_WINDOW_S,
    AdaptiveLimit,
    Budget,
    Pacer,
    TokenBucket,
    backoff_delay,
    parse_retry_after,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_backoff_grows_exponentially_with_full_jitter_and_is_capped():
    rng = random.Random(0)
    for attempt in range(8):
        bound = min(30.0, 1.0 * 2**attempt)
        delays = [backoff_delay(attempt, 1.0, 30.0, rng=rng) for _ in range(200)]
        assert all(0 <= d <= bound for d in delays)
        assert max(delays) > 0.8 * bound  # jitter spreads over the whole range
        assert min(delays) < 0.2 * bound


def test_backoff_honours_retry_after_up_to_the_cap():
    rng = random.Random(0)
    assert 2.0 <= backoff_delay(0, 1.0, 30.0, retry_after=2.0, rng=rng) <= 2.25
    # A server asking for an hour gets retry_backoff_max, not an hour.
    assert 30.0 <= backoff_delay(0, 1.0, 30.0, retry_after=3600, rng=rng) <= 30.0 + 30.0


def test_parse_retry_after_reads_seconds_milliseconds_and_http_dates():
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    # OpenAI's retry-after-ms is more precise and wins.
    assert parse_retry_after({"retry-after": "1", "retry-after-ms": "250"}) == 0.25
    now = time.time()
    date = email.utils.formatdate(now + 20, usegmt=True)
    assert 18 <= parse_retry_after({"retry-after": date}, now=now) <= 21
    past = email.utils.formatdate(now - 20, usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now) == 0.0
    for junk in ({}, {"retry-after": "soon"}, {"retry-after": "-3"}, {"retry-after-ms": "x"}):
        assert parse_retry_after(junk) is None
    assert parse_retry_after(None) is None


def test_token_bucket_allows_a_second_of_burst_then_the_rate():
    clock = FakeClock()
    bucket = TokenBucket(600, clock)  # 10 a second
    for _ in range(10):
        assert bucket.wait_time(1) == 0
        bucket.take(1)
    assert bucket.wait_time(1) == pytest.approx(0.1)
    clock.now += 0.5
    assert bucket.wait_time(5) == 0


def test_token_bucket_lets_an_oversized_take_through_and_charges_the_debt():
    clock = FakeClock()
    bucket = TokenBucket(60, clock)  # 1 a second, capacity 1
    assert bucket.wait_time(30) == 0  # bigger than the bucket: allowed when full
    bucket.take(30)
    assert bucket.wait_time(1) == pytest.approx(30.0)  # the debt is paid back at the rate
    bucket.give_back(20)  # the real cost was 10: refund
    assert bucket.wait_time(1) == pytest.approx(10.0)


def test_budget_paces_requests_and_tokens_ahead_of_time():
    clock = FakeClock()

    async def run() -> list[float]:
        budget = Budget(600, None, 6000, clock=clock, sleep=clock.sleep)  # 10 req/s, 100 out/s
        starts = []
        for _ in range(30):
            await budget.take(input_tokens=5, output_tokens=10)
            starts.append(clock.now)
        return starts

    starts = asyncio.run(run())
    elapsed = starts[-1] - starts[0]
    # 30 requests at 10/s with one second of burst: about 2 s, never faster.
    assert 1.9 <= elapsed <= 2.1


def test_budget_refunds_unused_output_tokens():
    async def run(used: int) -> float:
        clock = FakeClock()
        budget = Budget(None, None, 600, clock=clock, sleep=clock.sleep)  # 10 output tokens/s
        for _ in range(10):
            await budget.take(0, 10)  # reserve max_new_tokens=10
            budget.settle((0, 0), (10, used))
        return clock.now - 1000.0

    assert asyncio.run(run(used=10)) >= 8.0  # every reservation used: paced at the rate
    assert asyncio.run(run(used=1)) < 1.0  # the unused part refunded: barely waits


def test_adaptive_limit_halves_once_per_round_trip_and_grows_back():
    clock = FakeClock()
    limit = AdaptiveLimit(32, clock)
    sent = clock.now
    clock.now += 1
    for _ in range(32):  # a wave of 429s from requests sent together cuts once
        limit.overloaded(sent)
    assert limit.limit == 16
    clock.now += 1
    limit.overloaded(clock.now)  # sent after the cut: cuts again
    assert limit.limit == 8
    for _ in range(100):  # never below a quarter of num_workers: no serial crawl
        clock.now += 1
        limit.overloaded(clock.now)
    assert limit.limit == limit.floor == 8
    for _ in range(200):
        limit.succeeded()
    assert limit.limit == 32


def test_adaptive_limit_caps_concurrency_and_wakes_waiters_in_order():
    async def run() -> tuple[int, list[int]]:
        limit = AdaptiveLimit(3)
        peak = 0
        order = []

        async def worker(i: int) -> None:
            nonlocal peak
            await limit.acquire()
            peak = max(peak, limit.in_flight)
            order.append(i)
            await asyncio.sleep(0.01)
            limit.release()

        await asyncio.gather(*(worker(i) for i in range(10)))
        return peak, order

    peak, order = asyncio.run(run())
    assert peak == 3
    assert order == list(range(10))


def test_adaptive_limit_survives_cancelled_waiters():
    async def run() -> int:
        limit = AdaptiveLimit(1)
        await limit.acquire()
        waiter = asyncio.ensure_future(limit.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0)
        limit.release()
        await limit.acquire()  # the cancelled waiter did not keep the slot
        return limit.in_flight

    assert asyncio.run(run()) == 1


def test_pacer_cooldown_holds_new_requests_after_a_retry_after():
    async def run() -> list[float]:
        clock = FakeClock()
        pacer = Pacer(4, clock=clock, sleep=clock.sleep)
        ticket = await pacer.acquire(10, 10)
        pacer.release(ticket, ok=False, overloaded=True, retry_after=30)
        ticket = await pacer.acquire(10, 10)
        pacer.release(ticket, ok=True)
        return clock.slept

    # The next request waited out the 30 s the provider asked for, and no more.
    assert sum(asyncio.run(run())) == pytest.approx(30)


def test_estimate_tokens_is_about_four_characters_a_token():
    assert estimate_tokens(4000) == pytest.approx(1000, abs=2)
    assert estimate_tokens(0, messages=3) > estimate_tokens(0)
    assert estimate_tokens(0, images=1) >= 256


def test_politeness_keeps_a_worker_resting_after_each_request():
    async def run() -> tuple[float, list[str]]:
        clock = FakeClock()
        pacer = Pacer(1, politeness_s=3.0, clock=clock, sleep=clock.sleep)
        events = []
        ticket = await pacer.acquire(1, 1)
        sent_at = clock.now
        pacer.release(ticket, ok=True)
        events.append("released")
        ticket = await pacer.acquire(1, 1)  # the one worker rests 3 s first
        events.append("acquired")
        pacer.release(ticket, ok=True)
        return clock.now - sent_at, events

    rested, events = asyncio.run(run())
    assert rested == pytest.approx(3.0) and events == ["released", "acquired"]


def test_pacer_tells_pushback_that_says_nothing_against_the_request():
    async def run() -> list[bool]:
        clock = FakeClock()
        pacer = Pacer(8, clock=clock)
        verdicts = []
        for step, ok, overloaded in [
            (0.1, False, True),  # nothing has got through yet: a verdict on the request
            (0.1, True, False),  # the provider serves one
            (0.1, False, True),  # so a 429 now is contention for its rate limit
            (0.1, False, False),  # a 500 is not pushback at all
            (SERVING_WINDOW_S + 1, False, True),  # nothing served for a while: a verdict again
        ]:
            ticket = await pacer.acquire(1, 1)
            clock.now += step
            verdicts.append(pacer.release(ticket, ok=ok, overloaded=overloaded))
        return verdicts

    assert asyncio.run(run()) == [False, False, True, False, False]


def test_excused_pushback_is_bounded_and_charged_failures_keep_max_retries():
    from lmpress.engines.remote.retry import EXCUSED_PER_RETRY, Attempts, Failure

    too_many = Failure("rate_limited", "slow down", status=429, retryable=True)
    attempts = Attempts(max_retries=2)
    # Pushback that says nothing against the request is excused, a bounded number of times...
    for _ in range(EXCUSED_PER_RETRY * 2):
        assert attempts.may_retry(too_many, excusable=True)
    assert attempts.backoff_index() == 0  # excused retries do not grow the backoff
    # ...then counted like any failure, so a provider that never relents still ends the row.
    assert attempts.may_retry(too_many, excusable=True)
    assert attempts.may_retry(too_many, excusable=False)
    assert not attempts.may_retry(too_many, excusable=True)
    assert attempts.made == 1 + EXCUSED_PER_RETRY * 2 + 2
    # No retries asked for: none made, excusable or not; a client error is never retried.
    assert not Attempts(max_retries=0).may_retry(too_many, excusable=True)
    refused = Failure("bad_request", "no", status=400)
    assert not Attempts(max_retries=5).may_retry(refused, excusable=True)


@pytest.mark.parametrize("adaptive, after", [(True, 4), (False, 8)])
def test_use_adaptive_concurrency_false_keeps_num_workers_through_overload(adaptive, after):
    """Oumi's remote_params.use_adaptive_concurrency: how many requests may be in flight
    after a 429, with it on (halved) and off (num_workers still)."""

    async def run() -> int:
        clock = FakeClock()
        pacer = Pacer(8, clock=clock, adaptive=adaptive)
        ticket = await pacer.acquire(1, 1)
        clock.now += 0.1
        pacer.release(ticket, ok=False, overloaded=True)
        held = []
        while True:
            try:
                held.append(await asyncio.wait_for(pacer.acquire(1, 1), 0.5))
            except TimeoutError:
                return len(held)

    assert asyncio.run(run()) == after


def test_pushback_in_a_minority_neither_halves_concurrency_nor_holds_everyone_back():
    """A 429 among successes (a provider shedding at random) leaves num_workers in flight and
    holds back only the request that got it; a wave of them, most of a round trip's answers,
    halves concurrency and holds every request for the Retry-After."""

    async def run() -> tuple[float, float, float, float]:
        clock = FakeClock()
        pacer = Pacer(16, clock=clock, sleep=clock.sleep)
        for i in range(40):
            ticket = await pacer.acquire(1, 1)
            clock.now += 0.01
            pacer.release(ticket, ok=i % 8 != 3, overloaded=i % 8 == 3, retry_after=5)
        after_random = pacer.limit.limit, pacer.cooldown_until - clock.now
        for _ in range(8):
            ticket = await pacer.acquire(1, 1)
            clock.now += 0.01
            pacer.release(ticket, ok=False, overloaded=True, retry_after=5)
        return (*after_random, pacer.limit.limit, pacer.cooldown_until - clock.now)

    limit_random, held_random, limit_wave, held_wave = asyncio.run(run())
    assert limit_random == 16 and held_random <= 0
    assert limit_wave <= 8 and held_wave == pytest.approx(5, abs=0.1)


# --- the learned rate against simulated providers, on the fake clock ---------------------------


class NoRate:
    """A sender that never paces: what the learned rate is measured against."""

    rate = None

    def record(self, sent_at: float, overloaded: bool) -> None:
        pass

    def wait(self) -> float:
        return 0.0


def simulate(refuse, seconds: float, paced: bool = True, workers: int = 16, latency: float = 0.05):
    """`workers` senders on the fake clock, each sending again as soon as its last request is
    answered, or 0.1 s after a refusal (as a retry's backoff would), all through one
    AdaptiveRate. `refuse(t)` says whether the provider turns away a request arriving at t;
    a refusal comes back at once, an answer after `latency`. Returns the rate, the requests that
    got through in each simulated second, and those refused."""
    clock = FakeClock()
    clock.now = 0.0
    rate = AdaptiveRate(clock) if paced else NoRate()
    events = [(0.0, i, "free", (0.0, False)) for i in range(workers)]
    heapq.heapify(events)
    through, refused = Counter(), Counter()
    seq = workers
    while events:
        t, _, kind, (sent_at, turned_away) = heapq.heappop(events)
        if t >= seconds:
            break
        clock.now = t
        seq += 1
        if kind == "free":
            heapq.heappush(events, (t + rate.wait(), seq, "send", (t, False)))
        elif kind == "send":
            no = refuse(t)
            heapq.heappush(events, (t + (0.002 if no else latency), seq, "answer", (t, no)))
        else:
            rate.record(sent_at, turned_away)
            (refused if turned_away else through)[int(t)] += 1
            heapq.heappush(events, (t + (0.1 if turned_away else 0.0), seq, "free", (t, False)))
    return rate, through, refused


def at_random(share: float, seed: int = 0):
    rng = random.Random(seed)
    return lambda t: rng.random() < share


def token_bucket(per_second: float):
    """A provider's rate limit: `per_second`, with a second's worth of burst."""
    state = {"tokens": per_second, "at": 0.0}

    def refuse(t: float) -> bool:
        state["tokens"] = min(per_second, state["tokens"] + (t - state["at"]) * per_second)
        state["at"] = t
        if state["tokens"] >= 1:
            state["tokens"] -= 1
            return False
        return True

    return refuse


def total(counts: Counter, start: int, end: int) -> int:
    return sum(counts[s] for s in range(start, end))


@pytest.mark.parametrize("share", [0.11, 0.15, 0.3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pushback_at_random_does_not_ratchet_the_rate_down(share, seed):
    """A provider that turns away a share of requests whatever the load: the paced sender gets
    as many through as one that never paces, to the end."""
    _, through, _ = simulate(at_random(share, seed), 60)
    _, unpaced, _ = simulate(at_random(share, seed), 60, paced=False)
    assert total(through, 0, 60) >= 0.95 * total(unpaced, 0, 60)
    assert total(through, 50, 60) >= 0.95 * total(unpaced, 50, 60)  # no slow decay either


@pytest.mark.parametrize("limit, workers, latency", [(10, 16, 0.05), (60, 32, 0.2), (3, 8, 1.0)])
def test_a_real_rate_limit_is_found_and_kept(limit, workers, latency):
    """A provider that takes `limit` requests a second and refuses the rest: once settled, as
    many get through as the limit allows, and few are refused, where a sender that does not
    pace has most of its requests refused."""
    rate, through, refused = simulate(token_bucket(limit), 60, workers=workers, latency=latency)
    _, _, refused_unpaced = simulate(token_bucket(limit), 60, False, workers, latency)
    assert total(through, 20, 60) >= 0.9 * limit * 40
    assert total(refused, 20, 60) <= 0.25 * (total(refused, 20, 60) + total(through, 20, 60))
    assert total(refused_unpaced, 20, 60) > 2 * total(through, 20, 60)
    assert rate.rate is not None and 0.8 * limit <= rate.rate <= 2 * limit


def test_an_outage_slows_the_sender_then_full_speed_returns():
    """Five seconds of refusing everything in the middle of a run (a burst of 529s): the rate
    is not left cut, so the seconds after it run as fast as the seconds before."""
    rate, through, refused = simulate(lambda t: 20 <= t < 25, 60)
    before = total(through, 10, 20) / 10
    assert total(through, 21, 25) == 0 and total(refused, 21, 25) > 0
    assert total(through, 28, 35) >= 0.9 * before * 7  # back within 3 s, and stays
    assert total(through, 35, 60) >= 0.95 * before * 25
    assert rate.rate is None


def test_a_cut_that_does_not_lower_pushback_is_undone():
    """Every third request turned away, whatever the rate: the first intervals look like a
    limit and the rate is cut; the next, at the lower rate, shows the same share, so the cut
    is undone and that share is taken for the provider's background."""
    clock = FakeClock()
    rate = AdaptiveRate(clock)
    capped = []
    for i in range(4000):  # answers 50 ms after they were sent, 320 a second
        clock.now += max(rate.wait(), 0.05 / 16)
        rate.record(clock.now - 0.05, i % 3 == 0)
        if rate.rate is not None:
            capped.append(i)
    assert capped and capped[-1] < 1000  # cut once, early, and not again
    assert rate.rate is None
    assert rate.background == pytest.approx(1 / 3, abs=0.05)


def test_the_learned_rate_remembers_one_interval():
    clock = FakeClock()
    rate = AdaptiveRate(clock)
    for _ in range(10_000):  # a long job that never hits a limit
        clock.now += 0.01
        rate.record(clock.now - 0.05, False)
    assert len(rate._answers) <= (AdaptiveRate.SPAN_S + 0.2) / 0.01


def test_waiters_cancelled_before_a_release_leave_quietly():
    # Rows abandoned at the end of a stop's grace are cancelled while they wait for a slot; a
    # release in between drops their futures from the queue, and each must not fail to.
    async def main() -> int:
        limit = AdaptiveLimit(1)
        await limit.acquire()
        waiting = [asyncio.create_task(limit.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        for task in waiting:
            task.cancel()
        limit.release()
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
        await limit.acquire()  # the slot is free again
        return limit.in_flight

    assert asyncio.run(main()) == 1
