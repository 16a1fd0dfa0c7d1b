"""When a remote request may go, and how long a failed one waits before it goes again.

A remote engine sends through one `Pacer`, which combines four limits:

- concurrency: at most `num_workers` requests in flight, halved when overload signals (429,
  503, 529) dominate the answers, grown back as requests succeed (`AdaptiveLimit`);
- a learned rate: none until pushback exceeds what the provider sheds whatever the load, then a
  little under the rate that got through, grown back each interval until it no longer binds
  (`AdaptiveRate`, learned_rate.py);
- a shared cooldown: a `Retry-After` holds back every new request until then, when overload
  signals dominate, so a rate-limited server is not hammered by the other workers meanwhile;
- per-minute budgets, respected ahead of time: requests, input tokens (estimated before sending,
  corrected with the reported usage) and output tokens (max_new_tokens reserved, the unused part
  refunded) (`Budget`, built on `TokenBucket`).

Pushback comes in two kinds that look alike one answer at a time: load-driven (a rate limit: the
more is sent, the larger the share turned away) and random (a provider shedding load whatever
ours is: Anthropic's 529, an occasional 429 on a quiet account). Reacting to each 429 treats
both as the first: with a share of answers shed at random every cut is followed by more
pushback, so the rate ratchets down towards nothing. So nothing here reacts to a single
answer. Concurrency and the cooldown answer only pushback that dominates (`Pushback`: half of
the last round trip's answers, or nothing served lately); the learned rate judges intervals,
and undoes a cut that did not lower the share turned away. The figures are in benchmarks/README.md (remote pacing).

Nothing here imports an SDK; the clock and sleep are injectable for tests.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from lmpress.engines.remote.learned_rate import AdaptiveRate

Clock = Callable[[], float]

# The concurrency limit never drops below this share of num_workers: a storm of 429s slows
# the job down, it must not turn it into one request at a time.
FLOOR_SHARE = 0.25
# Each success raises the limit by this much: with `limit` requests completing per round trip,
# the limit grows by about a quarter per round trip, so a halving heals in a few round trips.
INCREASE_PER_SUCCESS = 0.25
# A provider that answered a request this recently is serving: a 429 now is contention for its
# rate limit, not a verdict on the request that got it.
SERVING_WINDOW_S = 5.0


def backoff_delay(
    attempt: int,
    base: float,
    cap: float,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry number `attempt` (0 for the first retry).

    Exponential backoff with full jitter (uniform in [0, min(cap, base * 2**attempt)]), so that
    requests failing together do not retry together. A server's Retry-After wins when given; it
    is capped at `cap` too, so a server asking for an hour cannot park the job for an hour, and
    gets a little jitter on top so the waiting requests do not all come back in the same instant.
    """
    rng = rng or random
    if retry_after is not None:
        wait = min(cap, max(0.0, retry_after))
        return wait + rng.uniform(0, min(cap, 0.1 * wait + 0.05))
    return rng.uniform(0, min(cap, base * (2**attempt)))


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds a response asks us to wait: `retry-after-ms`, else `Retry-After` as seconds or
    as an HTTP date. None when absent or unreadable."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            value = float(millis) / 1000.0
            if math.isfinite(value) and value >= 0:
                return value
        except ValueError:
            pass
    text = headers.get("retry-after")
    if not text:
        return None
    text = text.strip()
    try:
        value = float(text)
        return value if math.isfinite(value) and value >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class TokenBucket:
    """`per_minute` units a minute, refilled continuously, with one second's worth of burst.

    A take larger than the burst is let through once the bucket is full and leaves it in debt,
    so big requests still go and the average rate still holds.
    """

    def __init__(self, per_minute: float, clock: Clock = time.monotonic):
        self.rate = per_minute / 60.0
        self.capacity = max(self.rate, 1.0)
        self.level = self.capacity
        self._clock = clock
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._updated) * self.rate)
        self._updated = now

    def wait_time(self, amount: float) -> float:
        """Seconds until `amount` can be taken (0 when it can now)."""
        self._refill()
        need = min(amount, self.capacity)
        # The epsilon keeps float rounding from asking for sleeps too short to advance a clock.
        return 0.0 if self.level >= need - 1e-9 else (need - self.level) / self.rate

    def take(self, amount: float) -> None:
        self._refill()
        self.level -= amount

    def give_back(self, amount: float) -> None:
        """Return (or, negative, charge further) `amount`, once the real cost is known."""
        self._refill()
        self.level = min(self.capacity, self.level + amount)


class Budget:
    """The per-minute limits together: requests, input tokens, output tokens. Waiters are served
    in order, one at a time, so a big request is not starved by a stream of small ones."""

    def __init__(
        self,
        requests_per_minute: int | None,
        input_tokens_per_minute: int | None,
        output_tokens_per_minute: int | None,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], object] = asyncio.sleep,
    ):
        def bucket(limit: int | None) -> TokenBucket | None:
            return TokenBucket(limit, clock) if limit else None

        self.requests = bucket(requests_per_minute)
        self.input = bucket(input_tokens_per_minute)
        self.output = bucket(output_tokens_per_minute)
        self._sleep = sleep
        self._lock = asyncio.Lock()

    def rebind(self) -> None:
        """Start afresh on a new event loop (an asyncio.Lock belongs to one loop)."""
        self._lock = asyncio.Lock()

    async def take(self, input_tokens: int, output_tokens: int) -> None:
        wants = [(b, n) for b, n in ((self.requests, 1), (self.input, input_tokens),
                 (self.output, output_tokens)) if b is not None]  # fmt: skip
        async with self._lock:
            while True:
                wait = max(b.wait_time(n) for b, n in wants)
                if wait <= 0:
                    break
                await self._sleep(wait)
            for b, n in wants:
                b.take(n)

    def settle(self, input_tokens: tuple[int, int], output_tokens: tuple[int, int]) -> None:
        """Correct the estimates with what was used: each pair is (charged, actual)."""
        if self.input is not None:
            self.input.give_back(input_tokens[0] - input_tokens[1])
        if self.output is not None:
            self.output.give_back(output_tokens[0] - output_tokens[1])


class Pushback:
    """The last `window` answers, and whether pushback dominates them: at least half of them
    were overload signals, or nothing has got through for SERVING_WINDOW_S (or at all yet).

    Dominant pushback is what the concurrency cut and the shared cooldown answer: a provider
    turning most requests away. Pushback a provider sheds at random (a share of 429s or 529s
    whatever the load) stays a minority of any round trip, so it cuts neither."""

    def __init__(self, window: int, clock: Clock = time.monotonic):
        self._recent: deque[bool] = deque(maxlen=max(1, window))
        self._overloaded = 0
        self._clock = clock
        self.last_success = -math.inf

    def record(self, overloaded: bool, ok: bool) -> None:
        if len(self._recent) == self._recent.maxlen:
            self._overloaded -= self._recent[0]
        self._recent.append(overloaded)
        self._overloaded += overloaded
        if ok:
            self.last_success = self._clock()

    def serving(self) -> bool:
        """Whether the provider answered a request lately (see `Pacer.release`)."""
        return self._clock() - self.last_success <= SERVING_WINDOW_S

    def dominant(self) -> bool:
        if not self.serving():
            return True
        return 2 * self._overloaded >= self._recent.maxlen


class AdaptiveLimit:
    """A semaphore whose size moves: halved on dominant overload, at most once per round trip
    (signals from requests sent before the last cut say nothing new), grown back on success."""

    def __init__(self, maximum: int, clock: Clock = time.monotonic):
        self.maximum = maximum
        self.floor = max(1, math.ceil(maximum * FLOOR_SHARE))
        self.limit = float(maximum)
        self.in_flight = 0
        self._clock = clock
        self._last_cut = -math.inf
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if not self._waiters and self.in_flight < int(self.limit):
            self.in_flight += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # the releaser counts us in before waking us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted, then cancelled: hand the slot on
            elif waiter in self._waiters:  # a release may have dropped it already
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < int(self.limit):
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)

    def succeeded(self) -> None:
        if self.limit < self.maximum:
            self.limit = min(float(self.maximum), self.limit + INCREASE_PER_SUCCESS)
            self._wake()

    def overloaded(self, sent_at: float) -> None:
        if sent_at < self._last_cut:
            return
        self._last_cut = self._clock()
        self.limit = max(float(self.floor), self.limit / 2)


@dataclass
class Ticket:
    """One request's permission to go, and what it was charged."""

    sent_at: float
    input_tokens: int
    output_tokens: int


class Pacer:
    """The gate every request of one engine passes: concurrency, cooldown, budgets."""

    def __init__(
        self,
        num_workers: int,
        requests_per_minute: int | None = None,
        input_tokens_per_minute: int | None = None,
        output_tokens_per_minute: int | None = None,
        politeness_s: float = 0.0,
        clock: Clock = time.monotonic,
        adaptive: bool = True,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ):
        self.limit = AdaptiveLimit(num_workers, clock)
        # remote_params.use_adaptive_concurrency: false keeps num_workers in flight through
        # overload (the cooldown and the learned send rate still hold requests back).
        self.adaptive = adaptive
        self.rate = AdaptiveRate(clock)
        self.pushback = Pushback(num_workers, clock)
        limited = requests_per_minute or input_tokens_per_minute or output_tokens_per_minute
        self.budget = (
            Budget(
                requests_per_minute, input_tokens_per_minute, output_tokens_per_minute, clock, sleep
            )
            if limited
            else None
        )
        self.politeness_s = politeness_s
        self.cooldown_until = 0.0
        self._clock = clock
        self._sleep = sleep
        self._resting: set[asyncio.Task] = set()  # slots held back for politeness_s

    async def acquire(self, input_tokens: int, output_tokens: int) -> Ticket:
        await self.limit.acquire()
        try:
            while (wait := self.cooldown_until - self._clock()) > 0:
                await self._sleep(wait)
            if (wait := self.rate.wait()) > 0:
                await self._sleep(wait)
            if self.budget is not None:
                await self.budget.take(input_tokens, output_tokens)
        except BaseException:
            self.limit.release()
            raise
        return Ticket(self._clock(), input_tokens, output_tokens)

    def release(
        self,
        ticket: Ticket,
        *,
        ok: bool,
        usage: tuple[int, int] | None = None,
        overloaded: bool = False,
        retry_after: float | None = None,
    ) -> bool:
        """Give the slot back and learn from the outcome. `usage` is the (input, output)
        tokens the provider reported; without it, a failed request is charged no output.

        Overload signals cut concurrency and hold every request back for a Retry-After only
        while they dominate (`Pushback`); the learned rate judges them an interval at a time
        (`AdaptiveRate`). Returns True for pushback that says nothing against this request:
        an overload signal while other requests are getting through (one succeeded in the last
        SERVING_WINDOW_S), so the provider is serving and this one only lost the race for its
        rate limit, or was shed at random."""
        excusable = overloaded and self.pushback.serving()
        if self.budget is not None:
            used_in, used_out = usage if usage is not None else (ticket.input_tokens, 0)
            self.budget.settle((ticket.input_tokens, used_in), (ticket.output_tokens, used_out))
        self.pushback.record(overloaded, ok)
        self.rate.record(ticket.sent_at, overloaded)
        if ok:
            self.limit.succeeded()
        elif overloaded and self.pushback.dominant():
            if self.adaptive:
                self.limit.overloaded(ticket.sent_at)
            if retry_after:
                self.cooldown_until = max(self.cooldown_until, self._clock() + retry_after)
        if self.politeness_s > 0:
            rest = asyncio.get_running_loop().create_task(self._rest())
            self._resting.add(rest)  # a task only weakly held by the loop could be collected
            rest.add_done_callback(self._resting.discard)
        else:
            self.limit.release()
        return excusable

    async def _rest(self) -> None:
        """Hold a released slot for politeness_s before the next request may take it."""
        try:
            await self._sleep(self.politeness_s)
        finally:
            self.limit.release()
