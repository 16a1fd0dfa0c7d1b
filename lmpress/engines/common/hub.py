"""A hub model id checked before the engine loads it: on this machine, or the hub reachable.

Offline, transformers and huggingface_hub retry a missing model for most of a minute ("Retrying
in 8s") before their own error. One look in the local cache and, when the model is not there,
one short request to the hub with no retries, say in seconds what is wrong and what to do.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from lmpress.vocabulary.errors import ModelLoadError

PROBE_TIMEOUT_S = 5.0  # a hub that does not answer a HEAD in this long is not usable anyway


def check_hub_model(name: str) -> None:
    """Raise a ModelLoadError naming the model when it is neither cached nor downloadable."""
    if not _is_hub_id(name) or _is_cached(name):
        return
    import huggingface_hub.constants as hub

    advice = (
        f"download it where the hub is reachable (hf download {name}), or set "
        f"--model.model_name to a local model directory"
    )
    if hub.HF_HUB_OFFLINE:
        raise ModelLoadError(
            f"model.model_name: '{name}' is not on this machine and the hub is switched off "
            f"(HF_HUB_OFFLINE); {advice}"
        )
    problem = _unreachable(hub.ENDPOINT)
    if problem:
        raise ModelLoadError(
            f"model.model_name: '{name}' is not on this machine and the hub ({hub.ENDPOINT}) "
            f"cannot be reached ({problem}); {advice}"
        )


def _is_hub_id(name: str) -> bool:
    """'org/name' that is not a path on this machine nor one of lmpress's own model names."""
    if not name or ":" in name or name.startswith((".", "/", "~")):
        return False
    return name.count("/") == 1 and not Path(name).expanduser().exists()


def _is_cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an id the hub library finds malformed: let the loader say so
        return True


def _unreachable(endpoint: str) -> str | None:
    """Why the hub cannot be reached, or None. Any HTTP answer counts as reachable."""
    request = urllib.request.Request(endpoint, method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason) or type(reason).__name__
    return None
