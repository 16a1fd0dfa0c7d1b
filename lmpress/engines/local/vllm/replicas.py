"""Data parallelism for VLLM: `model.model_kwargs.data_parallel_size: N` runs N engine replicas,
one process each, pinned to its own GPUs with CUDA_VISIBLE_DEVICES, and spreads requests across
them (each new request goes to the replica with the fewest in flight).

vLLM's offline engine does not run data parallel itself, so lmpress does. The parent process
never loads a model: it starts `python -m lmpress.engines.local.vllm.replica` (replica.py) once
per replica and talks to each over its stdin and stdout, one JSON message per line:

    parent -> replica   {"config": {...}}     first line: the run config, data_parallel_size 1
                        {"op": "submit", "id": ID, "request": {...}, "deltas": true|false}
                        {"op": "cancel", "id": ID}
                        {"op": "close"}
    replica -> parent   {"ready": true, "pid": N}   or   {"fatal": MESSAGE, "error": CLASS}
                        {"id": ID, "delta": {"text": ..., "index": ...}}
                        {"id": ID, "result": {...}}
                        {"id": ID, "fatal": MESSAGE}   (the replica's engine died)

A replica keeps its real stdout for these messages and points file descriptor 1 at stderr, so
whatever vLLM or CUDA prints reaches the user's terminal instead of the protocol. A replica
whose stdin closes (the parent exited or crashed) shuts its engine down and exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import lmpress
from lmpress import errors
from lmpress.configs.schema import RunConfig
from lmpress.engines.local.worker import CallerQueue
from lmpress.errors import ConfigError, EngineUnavailableError, LmpressError, ModelLoadError
from lmpress.types import (
    ContentPart,
    Delta,
    ErrorInfo,
    GenerationParams,
    Message,
    Request,
    Result,
    Sample,
    TokenLogprob,
    Usage,
)

CLOSE_TIMEOUT_S = 60.0


def replica_gpus(replicas: int, per_replica: int, visible: list[str]) -> list[list[str]]:
    """Split the visible GPUs into one group per replica, in order."""
    need = replicas * per_replica
    if len(visible) < need:
        shown = ",".join(visible) or "none"
        raise ConfigError(
            f"model.model_kwargs.data_parallel_size: {replicas} replicas of {per_replica} GPU(s) "
            f"each (tensor_parallel_size x pipeline_parallel_size) need {need} GPUs, but "
            f"{len(visible)} are visible (CUDA_VISIBLE_DEVICES: {shown})"
        )
    return [visible[i * per_replica : (i + 1) * per_replica] for i in range(replicas)]


# --- the parent side --------------------------------------------------------------------------


class ReplicaPool:
    """Engine replicas in child processes, used through the same `run()` as one AsyncLLM."""

    def __init__(self, engine: Any, gpu_groups: list[list[str]]):
        self.engine = engine
        config = dataclasses.asdict(engine.config)
        config["model"]["model_kwargs"].pop("data_parallel_size", None)
        self.replicas: list[_Replica] = []
        try:
            for index, gpus in enumerate(gpu_groups):
                self.replicas.append(_Replica.start(index, gpus, config))
            for replica in self.replicas:  # they load their models at the same time
                replica.wait_ready()
        except BaseException:
            for replica in self.replicas:
                replica.kill()
            raise
        self._ids = itertools.count(1)
        self._turn = itertools.count()

    def _pick(self) -> _Replica:
        live = [r for r in self.replicas if r.alive]
        if not live:
            raise EngineUnavailableError("every vLLM replica has stopped; see the log above")
        start = next(self._turn) % len(live)
        return min(live[start:] + live[:start], key=lambda r: len(r.waiters))

    async def run(self, request: Request, *, deltas: bool) -> AsyncIterator[Delta | Result]:
        replica = self._pick()
        uid = str(next(self._ids))
        queue = replica.submit(uid, request, deltas)
        finished = False
        try:
            while True:
                message = await queue.get()
                if "delta" in message:
                    delta = message["delta"]
                    yield Delta(request.id, delta["text"], delta["index"])
                elif "result" in message:
                    finished = True
                    yield result_from_wire(message["result"])
                    return
                else:
                    finished = True
                    raise EngineUnavailableError(f"{replica.label}: {message['fatal']}")
        finally:
            replica.forget(uid, cancel=not finished)

    async def aclose(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(r.close) for r in self.replicas))


class _Replica:
    def __init__(self, index: int, gpus: list[str], proc: subprocess.Popen):
        self.index = index
        self.gpus = gpus
        self.proc = proc
        self.label = f"vLLM replica {index} (GPUs {','.join(gpus)})"
        self.waiters: dict[str, CallerQueue] = {}
        self.alive = True
        self.startup: dict[str, Any] | None = None
        self._ready = threading.Event()
        self._write_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"lmpress-{index}", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, index: int, gpus: list[str], config: dict[str, Any]) -> _Replica:
        # The directory holding the lmpress package, so a replica imports this same copy.
        package_root = str(Path(lmpress.__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpus), "PYTHONPATH": path}
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmpress.engines.local.vllm.replica"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        replica = cls(index, gpus, proc)
        replica._send({"config": config})
        return replica

    def wait_ready(self) -> None:
        self._ready.wait()
        startup = self.startup or {"fatal": f"the process exited with code {self.proc.poll()}"}
        if "fatal" in startup:
            error = getattr(errors, str(startup.get("error")), None)
            if not (isinstance(error, type) and issubclass(error, LmpressError)):
                error = ModelLoadError
            raise error(f"{self.label}: {startup['fatal']}")

    def submit(self, uid: str, request: Request, deltas: bool) -> CallerQueue:
        replies = CallerQueue()
        self.waiters[uid] = replies
        message = {"op": "submit", "id": uid, "request": dataclasses.asdict(request)}
        message["deltas"] = deltas
        if not self._send(message):
            self.waiters.pop(uid, None)
            raise EngineUnavailableError(f"{self.label} has stopped; see the log above")
        return replies

    def forget(self, uid: str, *, cancel: bool) -> None:
        self.waiters.pop(uid, None)
        if cancel and self.alive:
            self._send({"op": "cancel", "id": uid})

    def _send(self, message: dict[str, Any]) -> bool:
        line = json.dumps(message) + "\n"  # ASCII: whatever the replica's locale
        with self._write_lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
                return True
            except (OSError, ValueError):  # the replica is gone (broken pipe, closed file)
                return False

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "id" not in message:
                self.startup = message
                self._ready.set()
                continue
            waiter = self.waiters.get(message["id"])
            if waiter is not None:
                waiter.put(message)
        code = self.proc.wait()
        self.alive = False
        self._ready.set()
        for waiter in list(self.waiters.values()):
            waiter.put({"fatal": f"the replica process exited with code {code}"})

    def close(self) -> None:
        self._send({"op": "close"})
        try:
            self.proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# --- the wire format ----------------------------------------------------------------------------


def request_from_wire(data: dict[str, Any]) -> Request:
    messages = []
    for m in data["messages"]:
        content = m["content"]
        if not isinstance(content, str):
            content = [ContentPart(**part) for part in content]
        messages.append(Message(m["role"], content))
    return Request(data["id"], messages, GenerationParams(**data["params"]), data["prompt"])


def result_from_wire(data: dict[str, Any]) -> Result:
    samples = []
    for s in data["samples"]:
        logprobs = None
        if s["logprobs"] is not None:
            logprobs = [
                TokenLogprob(t["token"], t["logprob"], [tuple(pair) for pair in t["top"]])
                for t in s["logprobs"]
            ]
        samples.append(Sample(s["text"], s["finish_reason"], logprobs, s["completion_tokens"]))
    error = ErrorInfo(**data["error"]) if data["error"] else None
    return Result(
        data["request_id"],
        samples,
        Usage(**data["usage"]),
        data["model"],
        data["engine"],
        data["latency_s"],
        error,
    )


def config_from_wire(data: dict[str, Any]) -> RunConfig:
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.structured(RunConfig), data)
    return OmegaConf.to_object(merged)  # type: ignore[return-value]
