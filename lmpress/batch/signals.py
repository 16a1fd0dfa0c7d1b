"""Ctrl-C and SIGTERM handed to a job while it runs: a batch job takes them (`batch.job`), and
a job across several models takes them once for all of its models' jobs (`batch.several`)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

from lmpress.batch.events import STOP_SIGNALS


def nothing() -> None:
    pass


def install_stop_signals(
    loop: asyncio.AbstractEventLoop, handler: Callable[[str], None]
) -> Callable[[], None]:
    """Hand Ctrl-C and SIGTERM to `handler` (called with the signal's name) while the job
    runs; returns what puts back the handlers there were before."""
    installed: list[tuple[signal.Signals, Any]] = []
    for name in STOP_SIGNALS:
        sig = signal.Signals[name]
        previous = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, handler, name)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, Windows
            continue
        installed.append((sig, previous))

    def restore() -> None:
        for sig, previous in installed:
            loop.remove_signal_handler(sig)  # which sets the default, not what was there
            if previous is not None:
                signal.signal(sig, previous)

    return restore
