"""Engines behind the interface in `base`; `registry` maps names to them.

- `common/`: what local and remote engines share (chat templates and prompts, model paths).
- `local/`: engines that run the model in this process (NATIVE, LLAMACPP, VLLM), on the worker
  thread of `local/worker.py`.
- `remote/`: engines that call an API, on the retry and pacing of `remote/base.py`.
"""

from lmpress.engines.base import Engine
from lmpress.engines.registry import create_engine, engine_names, load_engine_class

__all__ = ["Engine", "create_engine", "engine_names", "load_engine_class"]
