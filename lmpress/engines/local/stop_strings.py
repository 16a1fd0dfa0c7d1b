"""Where a sample's text meets one of its stop strings, for the local engines that match them
themselves (NATIVE and LLAMACPP; vLLM matches its own and reports the string).

The earliest occurrence wins, whichever string it is; at a tie the string listed first. The
matched string is kept on the Sample (`stop_sequence`), so serve's Messages route can answer
`stop_reason: "stop_sequence"` with it, as Anthropic does.
"""

from __future__ import annotations


def first_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
    """(where it begins, which string) for the earliest stop string in `text`, or None."""
    hits = [(at, n, s) for n, s in enumerate(stops) if (at := text.find(s)) >= 0]
    if not hits:
        return None
    at, _, stop = min(hits)
    return at, stop
