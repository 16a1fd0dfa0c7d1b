"""A model name checked before the engine loads it: on this machine, or the hub reachable.

Offline, transformers and huggingface_hub retry a missing model for most of a minute ("Retrying
in 8s") before their own error. One look in the local cache and, when the model is not there,
one short request to the hub with no retries, say in seconds what is wrong and what to do. A
name that is no hub id at all (`smollm2:135m-instruc`) is refused before any of that, and a
name close to one lmpress bundles says which it probably meant.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from lmpress.builtin_models.names import REAL_NAMES, closest_known_name, is_known_name
from lmpress.vocabulary.errors import ModelLoadError

# A hub that does not answer a HEAD in this long is not usable for a download anyway; and the
# answer that it cannot be reached should come in under two seconds, not after the loaders'
# own minute of retries.
PROBE_TIMEOUT_S = 1.5


def check_hub_model(name: str) -> None:
    """Raise a ModelLoadError naming the model when it is neither cached nor downloadable."""
    if not _may_be_hub_id(name) or is_known_name(name):
        return
    close = closest_known_name(name)
    if ":" in name:  # a hub id never holds one: a misspelt bundled name, or a typo
        hint = f"did you mean the bundled '{close}'? " if close else ""
        raise ModelLoadError(
            f"model.model_name: '{name}' is neither a file here, a hub id, nor a model lmpress "
            f"bundles; {hint}the bundled real models are {', '.join(REAL_NAMES)}"
        )
    if _is_cached(name):
        return
    import huggingface_hub.constants as hub

    advice = (
        f"download it where the hub is reachable (hf download {name}), or set "
        f"--model.model_name to a local model directory"
    )
    if close:
        advice = f"did you mean the bundled '{close}'? Otherwise {advice}"
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


def _may_be_hub_id(name: str) -> bool:
    """'org/name' or a bare 'name' (the hub's older ids, `gpt2`) that is not a path here."""
    if not name or name.startswith((".", "/", "~")):
        return False
    return name.count("/") <= 1 and not Path(name).expanduser().exists()


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
    except TimeoutError:
        return f"no answer in {PROBE_TIMEOUT_S:g} s"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason) or type(reason).__name__
    return None
