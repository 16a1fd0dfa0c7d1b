"""The send rate a remote engine learns from pushback (`AdaptiveRate`), judged an interval at a
time (`Interval`); pacing.py's `Pacer` holds requests to it. Why it judges intervals, not
answers, is in pacing.py's docstring; the figures are in benchmarks/README.md (remote pacing).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]


@dataclass
class Interval:
    """What one interval's answers say."""

    answers: int
    pushed: int  # of them, overload signals
    accepted: float  # requests a second that got through, in the busier half of the span
    answered: float  # requests a second answered, either way, over the whole span
    sent: float  # requests a second the rate let out (while it binds)

    @property
    def share(self) -> float:
        return self.pushed / self.answers

    @property
    def dominated(self) -> bool:
        """Pushback is two thirds of it or more."""
        return self.pushed >= self.answers * 2 / 3


class AdaptiveRate:
    """A send rate learned from pushback, judged an interval at a time, so that pushback that
    the provider sheds at random cannot ratchet it down.

    An interval is a span of send times (SPAN_S at least), judged once its requests are back:
    the share of them that got an overload signal, and the rate at which the others got
    through. The rate is cut only when that share stands above the background (the share the
    provider sheds whatever the load, as calm intervals show it; FIRST_BACKGROUND until then)
    by more than chance explains, and then to a little under the rate that got through, which
    is the provider's limit when the pushback is load-driven.

    The next interval puts the cut on trial: which explains its pushback better, chance (the
    share before the cut, whatever the rate) or a limit (the rate that got through before the
    cut, so the share is what the new rate exceeds it by)? Chance: the cut is undone and that
    share becomes the background (up to MAX_BACKGROUND). A limit: the cut holds, and if the
    pushback is still in excess the rate is cut again.

    A rate that holds grows each interval, not each success, so a slowed sender does not
    recover more slowly: doubling until growing meets the limit, then doubling while under half
    a rate that went through calmly since, by GROWTH up to it, by PROBE beyond; it is dropped
    once it no longer binds. Pushback that dominates an interval is judged without waiting for
    SPAN_S, so that rows do not spend their retries on a hard limit while it is found."""

    SPAN_S = 0.25  # an interval's shortest span of send times
    MIN_ANSWERS = 20  # its fewest answers, so that a share of pushback means something
    MIN_CALM_ANSWERS = 5  # or, with no pushback at all, enough to grow on
    CUT = 0.95  # the new rate, as a share of the rate that got through
    GROWTH = 1.25  # a holding rate's growth per interval up to rates that went calmly
    PROBE = 1.1  # and beyond them
    MIN_MARGIN = 0.05  # pushback share above the background that counts as excess: at least
    MAX_MARGIN = 0.2  # and at most (else three standard errors)
    MAX_BACKGROUND = 0.5  # more pushback than this is taken for a limit, never for chance
    FIRST_BACKGROUND = 0.0  # the background assumed until intervals show what it is
    SMOOTHING = 0.25  # how fast the background follows the share in calm intervals
    CALM_MEMORY_S = 30.0  # how long the rates of calm intervals are remembered

    def __init__(self, clock: Clock = time.monotonic):
        self.rate: float | None = None  # requests a second; None: no cap
        self.background = self.FIRST_BACKGROUND
        self._clock = clock
        self._start: float | None = None  # the send time the current interval counts from
        self._answers: deque[tuple[float, bool]] = deque()  # (sent_at, overloaded) since _start
        self._pushed = 0  # how many of them were overloaded
        self._turns: deque[float] = deque()  # when requests paced since _start went
        self._round_trip = 0.0  # of requests that got through, smoothed
        self._on_trial = False  # the interval after a cut: does pushback fall?
        self._before: float | None = None  # the rate before the last cut
        self._before_cut = (0.0, 0.0)  # (share, accepted) of the interval that made it
        self._calm_rates: deque[tuple[float, float]] = deque()  # (when, answered), calm ones
        self._calm_since = self._calm_since_before = -math.inf  # those that count, from when
        self._next = 0.0

    def record(self, sent_at: float, overloaded: bool) -> None:
        """One answer: the request sent at `sent_at` got an overload signal, or did not."""
        now = self._clock()
        if not overloaded:
            trip = now - sent_at
            self._round_trip = 0.8 * self._round_trip + 0.2 * trip if self._round_trip else trip
        if self._start is None:
            self._start = sent_at
        if sent_at < self._start:
            return  # sent before this interval (before a cut, say): it says nothing about it
        self._answers.append((sent_at, overloaded))
        self._pushed += overloaded
        # Requests sent before the horizon are back, nearly all. An overload signal comes back
        # at once, an answer after a round trip: a later horizon would count too many of the
        # first and too few of the second.
        horizon = now - 2 * self._round_trip
        count = len(self._answers)
        if count >= self.MIN_CALM_ANSWERS and horizon - self._start >= self.SPAN_S:
            self._judge(horizon)
        elif count % self.MIN_ANSWERS == 0 and 3 * self._pushed >= 2 * count:
            self._judge(now - self._round_trip, only_if_dominated=True)

    def _judge(self, horizon: float, only_if_dominated: bool = False) -> None:
        interval = self._measure(horizon)
        if interval is None or (only_if_dominated and not interval.dominated):
            return
        rate = self.rate
        self._next_interval(horizon)
        self._decide(interval)
        if self.rate != rate:  # what went since the horizon, or is booked, went at the old rate
            self._next_interval(max(self._clock(), self._next))

    def _measure(self, horizon: float) -> Interval | None:
        """The interval of requests sent from _start to `horizon`, or None while it holds too
        few answers to say much: MIN_CALM_ANSWERS while nothing is capped or pushed back, else
        MIN_ANSWERS (of which MIN_CALM_ANSWERS got through, or none), so that a rate only grows
        on an interval long enough to meet a limit."""
        start = self._start or 0.0
        span = horizon - start
        judged = [(sent_at, pushed) for sent_at, pushed in self._answers if sent_at < horizon]
        answers, pushed = len(judged), sum(p for _, p in judged)
        through = answers - pushed
        enough = self.MIN_CALM_ANSWERS if self.rate is None and not pushed else self.MIN_ANSWERS
        if span <= 0 or answers < enough:
            return None
        if pushed and 0 < through < self.MIN_CALM_ANSWERS:
            return None
        # The busier half: a sender slowed by start-up, an outage or a cooldown for part of
        # the span would otherwise pass its own slowness off as the provider's limit.
        early = sum(1 for sent_at, p in judged if not p and sent_at < start + span / 2)
        accepted = max(early, through - early) / (span / 2)
        sent = sum(1 for turn in self._turns if turn < horizon)
        return Interval(answers, pushed, accepted, answers / span, sent / span)

    def _decide(self, interval: Interval) -> None:
        excess = interval.share > self.background + self._margin(self.background, interval)
        if self._on_trial and self._unchanged(interval):
            # The cut did not bring pushback down: it is not ours to prevent.
            self.rate, self._on_trial = self._before, False
            self._calm_since = self._calm_since_before
            self.background = min(interval.share, self.MAX_BACKGROUND)
        elif not excess:
            self._calm(interval)
        elif interval.accepted > 0:  # else none get through: cooldown and backoff do the work
            self._calm_since_before = self._calm_since
            if self.rate is not None and not self._on_trial:  # growing, it met the limit
                self._calm_since = self._clock()
            self._on_trial, self._before = True, self.rate
            self._before_cut = (interval.share, interval.accepted)
            cut = self.CUT * interval.accepted
            # A capped rate is at most halved an interval: what got through while an outage or
            # the cooldown held requests back is no measure of a limit.
            self.rate = cut if self.rate is None else min(self.rate, max(cut, self.rate / 2))

    def _calm(self, interval: Interval) -> None:
        """An interval without excess pushback: learn the background, grow the rate."""
        b = self.background
        if self._on_trial:  # the cut held: what pushback is left is background, at most
            self.background = min(b, interval.share)
        elif self.rate is None or interval.share < b:  # capped, the share may rise with load
            self.background += self.SMOOTHING * (min(interval.share, self.MAX_BACKGROUND) - b)
        self._on_trial = False
        now = self._clock()
        self._calm_rates.append((now, interval.answered))
        while self._calm_rates[0][0] < now - self.CALM_MEMORY_S:
            self._calm_rates.popleft()
        if self.rate is None:
            return
        if self.rate > 1.2 * interval.sent:
            self.rate, self._calm_since = None, -math.inf  # it no longer binds
            return
        if self._calm_since == -math.inf:  # growing has not met the limit yet: slow start
            self.rate *= 2
            return
        known = max((r for t, r in self._calm_rates if t >= self._calm_since), default=0.0)
        self.rate *= (
            2 if 2 * self.rate <= known else self.GROWTH if self.rate < known else self.PROBE
        )

    def _margin(self, share: float, interval: Interval) -> float:
        """How far above `share` this interval's share must stand to be more than chance:
        three standard errors, within [MIN_MARGIN, MAX_MARGIN], and short of 1."""
        error = math.sqrt(share * (1 - share) / interval.answers)
        return min(max(self.MIN_MARGIN, min(self.MAX_MARGIN, 3 * error)), (1 - share) / 2)

    def _unchanged(self, interval: Interval) -> bool:
        """Whether chance explains this interval's pushback better than a limit does. Chance:
        the share before the cut, whatever the rate. A limit: the rate that got through before
        the cut, so the share is what the rate sent now exceeds it by. Binomial likelihoods."""
        share_before, limit = self._before_cut

        def likelihood(share: float) -> float:
            share = min(max(share, 0.005), 0.995)
            return interval.pushed * math.log(share) + (
                interval.answers - interval.pushed
            ) * math.log(1 - share)

        return likelihood(share_before) >= likelihood(1 - limit / interval.answered)

    def _next_interval(self, start: float) -> None:
        self._start = start
        self._answers = deque(a for a in self._answers if a[0] >= start)
        self._pushed = sum(pushed for _, pushed in self._answers)
        while self._turns and self._turns[0] < start:
            self._turns.popleft()

    def wait(self) -> float:
        """Seconds the next request must wait to keep to the rate; reserves its turn."""
        if self.rate is None:
            return 0.0
        now = self._clock()
        turn = max(now, self._next)
        self._next = turn + 1.0 / self.rate
        self._turns.append(turn)
        return turn - now
