"""One data-parallel replica of the VLLM engine: a process started by `ReplicaPool`
(replicas.py, which also describes the protocol), running one VllmEngine on the GPUs in
CUDA_VISIBLE_DEVICES and driven over stdin and stdout.

    python -m lmpress.engines.local.vllm.replica
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
from typing import Any, TextIO

from lmpress.engines.local.vllm.api import describe
from lmpress.engines.local.vllm.engine import VllmEngine
from lmpress.engines.local.vllm.replicas import config_from_wire, request_from_wire
from lmpress.errors import LmpressError
from lmpress.types import Delta, Request


def main() -> int:
    """A replica: one VLLM engine on the GPUs in CUDA_VISIBLE_DEVICES, driven over stdin."""
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)  # anything printed from here on goes to stderr, not into the protocol
    # Ctrl-C reaches the whole process group; the parent decides when replicas stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    header = sys.stdin.readline()
    if not header:
        return 0
    try:
        engine = VllmEngine(config_from_wire(json.loads(header)["config"]))
    except LmpressError as exc:
        _write(protocol, {"fatal": str(exc), "error": type(exc).__name__})
        return 2
    except Exception as exc:
        _write(protocol, {"fatal": describe(exc), "error": "ModelLoadError"})
        return 1
    _write(protocol, {"ready": True, "pid": os.getpid()})
    return asyncio.run(_serve(engine, protocol))


async def _serve(engine: VllmEngine, protocol: TextIO) -> int:
    tasks: dict[str, asyncio.Task] = {}

    async def run(uid: str, request: Request, deltas: bool) -> None:
        try:
            if deltas:
                async for item in engine.stream(request):
                    if isinstance(item, Delta):
                        _write(protocol, {"id": uid, "delta": {"text": item.text, "index": item.index}})  # fmt: skip
                    else:
                        _write(protocol, {"id": uid, "result": dataclasses.asdict(item)})
            else:
                result = await engine.complete(request)
                _write(protocol, {"id": uid, "result": dataclasses.asdict(result)})
        except asyncio.CancelledError:
            pass  # the engine's stream aborted the request in vLLM
        except Exception as exc:
            _write(protocol, {"id": uid, "fatal": str(exc) or type(exc).__name__})
        finally:
            tasks.pop(uid, None)

    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            break  # the parent is gone
        message = json.loads(line)
        op = message.get("op")
        if op == "submit":
            request = request_from_wire(message["request"])
            uid = message["id"]
            tasks[uid] = asyncio.create_task(run(uid, request, message["deltas"]))
        elif op == "cancel":
            task = tasks.get(message["id"])
            if task is not None:
                task.cancel()
        elif op == "close":
            break
    for task in list(tasks.values()):
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    await engine.aclose()
    return 0


def _write(protocol: TextIO, message: dict[str, Any]) -> None:
    protocol.write(json.dumps(message) + "\n")


if __name__ == "__main__":
    sys.exit(main())
