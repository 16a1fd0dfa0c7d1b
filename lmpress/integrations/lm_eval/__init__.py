"""lm-evaluation-harness over lmpress: `LmpressLM`, lm-eval's model API on any lmpress engine
(registered with lm-eval as `lmpress` when this package is imported), and the run behind
`lmpress eval` (`run.py`). Needs the `eval` extra (`pip install 'lmpress[eval]'`)."""

from lmpress.integrations.lm_eval.model import LmpressLM

__all__ = ["LmpressLM"]
