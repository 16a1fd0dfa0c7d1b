"""One batch's life on the loopback server, in compressed time and in neither provider's words:
`batch_api` tells it in OpenAI's statuses and in Anthropic's.

A batch is validated for one step (OpenAI only: Anthropic has no validating), in progress for
one step while its rows finish one after another, finalizing for one step, then completed. Its
status is read off the clock at each request, so no thread moves it along. Faults change the
schedule: a batch that fails validation, one that never leaves finalizing, one whose window ends
halfway through, one cancelled (which cancels for a step first).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired",
                 "cancelling", "cancelled"]  # fmt: skip
ENDED = ("failed", "completed", "expired", "cancelled")
CANCELLABLE = ("validating", "in_progress", "finalizing")


@dataclass
class BatchFaults:
    """How batches behave. A batch's ordinal counts the batches created on this server, both
    wires together, from 1; a fault listing it happens to that batch."""

    step_s: float = 0.2  # how long validating, in_progress, finalizing and cancelling each last
    upload_failures: int = 0  # the first K uploads (files.create, messages.batches.create) fail
    upload_failure_status: int = 500  # ... with this status
    lost_creates: Collection[int] = ()  # these batches are created, but their creator gets a 500
    invalid: Collection[int] = ()  # these OpenAI batches fail validation (token_limit_exceeded)
    stuck_finalizing: Collection[int] = ()  # these never leave finalizing (Anthropic: never end)
    expire: Collection[int] = ()  # these expire halfway through in_progress, rows left undone
    max_requests_per_batch: int | None = None  # None: the provider's own (50,000 / 100,000)
    max_file_bytes: int | None = None  # an input file (OpenAI) or create body (Anthropic); None:
    # the provider's own (200 MB / 256 MB)


@dataclass
class Row:
    """One request of a batch and what it comes to, decided when the batch is created."""

    custom_id: str
    status: int  # 200, or the HTTP status the request fails with
    body: dict[str, Any]  # what the endpoint answers: a completion or Message, or an error body
    id: str  # OpenAI's batch_req_ id for its output line
    request_id: str


@dataclass
class Run:
    """A batch: its rows, its schedule, and whatever has happened to it."""

    id: str
    ordinal: int
    anthropic: bool
    created: float  # time.time()
    step_s: float
    rows: list[Row]
    request: dict[str, Any]  # the create body, less Anthropic's requests
    errors: list[dict[str, Any]] = field(default_factory=list)  # why validation failed
    stuck: bool = False
    expire: bool = False
    cancel_at: float | None = None
    files: tuple[str | None, str | None] | None = None  # OpenAI's output and error file, once ended
    gemini: bool = False  # a Gemini batch (its wire says `anthropic` False too)

    @property
    def started(self) -> float:
        """When in_progress begins: OpenAI validates (Gemini is pending) for a step first."""
        return self.created + (0.0 if self.anthropic else self.step_s)

    def schedule(self) -> dict[Status, float]:
        """The time each status begins, in order, as far as this batch will go."""
        start, step = self.started, self.step_s
        if self.errors:
            events: dict[Status, float] = {"failed": start}
        elif self.expire:
            events = {"in_progress": start, "expired": start + step / 2}
        else:
            events = {"in_progress": start, "finalizing": start + step}
            if not self.stuck:
                events["completed"] = start + 2 * step
        if self.cancel_at is not None:
            events = {name: t for name, t in events.items() if t <= self.cancel_at}
            events.update(cancelling=self.cancel_at, cancelled=self.cancel_at + step)
        return events

    def status(self, now: float) -> Status:
        status: Status = "validating"
        for name, t in self.schedule().items():
            if t <= now:
                status = name
        return status

    def at(self, status: Status, now: float) -> float | None:
        """When this batch entered `status`, if it has by `now`."""
        t = self.schedule().get(status)
        return t if t is not None and t <= now else None

    def done(self, now: float) -> list[bool]:
        """Which rows have run by `now`: one after another through in_progress, none after the
        batch was cancelled or expired."""
        events = self.schedule()
        limit = min(now, events.get("cancelling", math.inf), events.get("expired", math.inf))
        n = len(self.rows)
        return [self.started + self.step_s * (i + 1) / n <= limit for i in range(n)]

    def counts(self, now: float) -> tuple[int, int]:
        """Rows that have succeeded and rows that have failed by `now`."""
        done = self.done(now)
        ok = sum(1 for row, d in zip(self.rows, done, strict=True) if d and row.status == 200)
        return ok, sum(done) - ok
