"""`lmpress cache stats|clear|prune`: what the response cache holds, and making it smaller.

Every command takes --cache-dir (default: $LMPRESS_RESPONSE_CACHE, else `responses` under
lmpress's cache directory), the directory `batch`, `infer` and `serve` use.
"""

from __future__ import annotations

import re
import time
from typing import Annotated

import typer

from lmpress.vocabulary.errors import ConfigError, InputError

cache_app = typer.Typer(
    help="The response cache: what it holds, and clearing or pruning it.", no_args_is_help=True
)

CacheDirOpt = Annotated[
    str | None,
    typer.Option("--cache-dir", help="The cache's directory (default: lmpress's cache)."),
]
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str, flag: str) -> int:
    """'500MB', '2G', '1.5GiB' or a number of bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(f"{flag} {text}: give a size such as 500MB or 2GB")
    number, unit = float(match.group(1)), match.group(2).upper()
    return int(number * 1024 ** "BKMGT".index(unit or "B"))


def parse_age(text: str, flag: str) -> float:
    """'30d', '12h', '90m' or '45s', in seconds."""
    match = _AGE.match(text)
    if not match:
        raise ConfigError(f"{flag} {text}: give an age such as 30d, 12h or 90m")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


def _open(cache_dir: str | None, *, readonly: bool = False):
    from lmpress.cache.responses import cache_dir as where
    from lmpress.cache.store import CacheDamaged, ResponseStore

    directory = where(cache_dir)
    try:
        return ResponseStore(directory, readonly=readonly)
    except CacheDamaged as exc:
        raise InputError(
            f"response cache: {exc}; `lmpress cache clear --cache-dir {directory}` replaces it"
        ) from exc


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"  # pragma: no cover


def _ago(when: float | None) -> str:
    if when is None:
        return "-"
    seconds = max(0.0, time.time() - when)
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


@cache_app.command()
def stats(cache_dir: CacheDirOpt = None) -> None:
    """How many replies the cache holds, its size and cap, and for which models."""
    store = _open(cache_dir, readonly=True)
    try:
        facts = store.stats()
    finally:
        store.close()
    print(f"cache      {store.path}")
    print(f"entries    {facts.entries}")
    print(
        f"size       {_size(facts.bytes)} of {_size(facts.max_bytes)} (least recently used go first)"
    )
    print(f"last used  {_ago(facts.newest_use)}; oldest use {_ago(facts.oldest_use)}")
    for engine, model, count in facts.by_model[:20]:
        print(f"  {count:>9}  {engine}  {model}")


@cache_app.command()
def clear(
    cache_dir: CacheDirOpt = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Only this model's replies (as the recipe names it)."),
    ] = None,
) -> None:
    """Remove every reply (or one model's). A damaged cache file is replaced."""
    from lmpress.cache.responses import cache_dir as where
    from lmpress.cache.store import DB_NAME, CacheDamaged, ResponseStore

    directory = where(cache_dir)
    try:
        store = ResponseStore(directory)
    except CacheDamaged:
        if model is not None:
            raise
        for suffix in ("", "-wal", "-shm"):  # lmpress's own file, beyond use: made anew
            (directory / f"{DB_NAME}{suffix}").unlink(missing_ok=True)
        print(f"replaced the damaged cache {directory / DB_NAME}")
        return
    try:
        gone = store.clear(model=model)
    finally:
        store.close()
    print(f"removed {gone} replies from {store.path}")


@cache_app.command()
def prune(
    cache_dir: CacheDirOpt = None,
    older_than: Annotated[
        str | None, typer.Option("--older-than", help="Remove replies unused this long: 30d, 12h.")
    ] = None,
    max_size: Annotated[
        str | None,
        typer.Option("--max-size", help="Set the cache's size cap (500MB, 2GB) and keep to it."),
    ] = None,
) -> None:
    """Remove replies unused for a while, and the least recently used past the size cap."""
    age = parse_age(older_than, "--older-than") if older_than else None
    cap = parse_size(max_size, "--max-size") if max_size else None
    store = _open(cache_dir)
    try:
        if cap is not None:
            store.set_max_bytes(cap)
        gone = store.prune(older_than_s=age)
        facts = store.stats()
    finally:
        store.close()
    print(
        f"removed {gone} replies; {facts.entries} left, {_size(facts.bytes)} of "
        f"{_size(facts.max_bytes)}"
    )
