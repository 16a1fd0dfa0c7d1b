"""Engines behind the interface in `base`; `registry` maps names to them.

`base.Engine` is the whole contract: what the rest of lmpress asks of an engine (what it
supports, how it counts prompts, whether it takes hub ids) it asks the class, and outside this
package nothing imports an engine's internals (`tests/test_structure.py` holds that).
- `prompt_count.py`: what an engine's `prompt_counter` returns, for the dry run and budgets,
  and the default counter.

- `common/`: what local and remote engines share (chat templates and prompts, model paths).
- `local/`: engines that run the model in this process (NATIVE, LLAMACPP, VLLM), on the worker
  thread of `local/worker.py`; each folder's `prompt_count.py` counts as its engine does.
- `remote/`: engines that call an API, on the retry and pacing of `remote/base.py`.
"""

from lmpress.engines.base import Engine
from lmpress.engines.registry import create_engine, engine_names, load_engine_class

__all__ = ["Engine", "create_engine", "engine_names", "load_engine_class"]
