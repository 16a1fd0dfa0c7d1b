"""Which waiting request LLAMACPP starts next when rows choose LoRA adapters: turns by adapter.

llama.cpp applies an adapter to the whole context (loras.py), so the rows decoded together must
share one: the base model's rows form a group, and each adapter's rows another. The policy:
- A turn belongs to one group. While it lasts, the scheduler starts that group's requests
  only, oldest first, as places free up, so its rows batch together as without adapters.
- A turn ends when its group has no request waiting, or once it has started `turn_length`
  requests (the batch size, four times over) while a request of another group waited: a busy
  group cannot hold the context for ever.
- Then no request starts until the turn's rows have ended (their batch shrinks as they do:
  that tail, once a turn, is what scheduling by adapter costs); the context takes the adapter
  of the next group, the one whose oldest waiting request is the oldest among the other groups,
  and its turn begins. Every group with a request waiting has its turn within one turn of each
  other group: none starves, and a group waits longer only where its requests came later.
Without adapters every request is of one group and this is the plain oldest-first order.
An adapter unloaded while the engine runs (serve) is freed here, on the worker thread, once no
request of it waits or runs and the context no longer applies it.
A free sequence's cached prompt (sequences.py) counts only for the group that made it: its KV
cells hold the values of that adapter.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from lmpress.engines.local.llamacpp.loras import Loras
from lmpress.engines.local.llamacpp.sequences import Sequences
from lmpress.engines.local.worker import Submission

# A turn lasts for this many batches' worth of requests while another group waits.
TURN_BATCHES = 4


class Turns:
    """The group whose rows the context decodes now, and when it hands over."""

    def __init__(self, batch_size: int, loras: Loras | None, ctx: Any, sequences: Sequences):
        """Turns over the context `ctx` and its `sequences`; `loras`: the model's adapters,
        None or empty for none."""
        self.current: str | None = None  # the adapter of the group whose turn it is
        self.turn_length = TURN_BATCHES * batch_size
        self.started = 0  # requests started this turn while another group waited
        self.switches = 0  # turns handed over so far
        self._loras = loras
        self._ctx = ctx
        self._sequences = sequences

    def next(self, pending: deque[Submission], in_flight: bool) -> Any:
        """The waiting request to start next, or None: none waits, or the others wait for the
        turn's rows to end."""
        if not self._loras:
            return pending[0] if pending else None
        held = {s.request.adapter for s in pending}
        if not in_flight and self.current not in held | self._loras.names | {None}:
            self._use(None)  # its adapter was unloaded: the context lets it go
        self._loras.free_idle(held | {self.current})
        if not pending:
            return None
        mine = next((s for s in pending if s.request.adapter == self.current), None)
        other = next((s for s in pending if s.request.adapter != self.current), None)
        if other is None:
            self.started = 0  # nobody else waits: the turn goes on
        if mine is not None and (other is None or self.started < self.turn_length):
            return mine
        if in_flight or other is None:
            return None
        self._use(other.request.adapter)
        self.switches += 1
        return other

    def _use(self, adapter: str | None) -> None:
        """Give the context `adapter` (no row is in flight) and begin its turn."""
        self._loras.apply(self._ctx, adapter)
        self.current, self.started = adapter, 0
        self._sequences.adapter = self._loras.key(adapter)

    def admitted(self) -> None:
        """The request `next` gave has started."""
        self.started += 1
