"""The driver of a `--ray` job: a BatchJob whose rows go to Ray replicas instead of an engine
in this process. Everything around the rows (resume, the output, the errors file, the summary,
stopping) is BatchJob's own."""

from __future__ import annotations

import asyncio
import copy
import os
import pickle
import queue
import re
import threading
import time
from collections.abc import AsyncIterator

from lmpress.batch.cluster.connect import Cluster, cluster_address, import_ray
from lmpress.batch.cluster.replica import Outcome
from lmpress.batch.job import BatchJob
from lmpress.batch.outputs import Reorder
from lmpress.batch.rows import RowParser
from lmpress.cache.responses import cache_dir
from lmpress.configs.schema import RunConfig
from lmpress.data.idkeys import IdKeys
from lmpress.engines.base import check_task
from lmpress.vocabulary.errors import LmpressError


class Puller:
    """Pulls the dataset's result blocks on a thread, into a short queue."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.results: queue.Queue = queue.Queue(maxsize=4)
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._pull, name="lmpress-ray", daemon=True)
        self.thread.start()

    def _pull(self) -> None:
        blocks = iter(self.dataset.iter_batches(batch_size=None, batch_format="pyarrow"))
        try:
            for block in blocks:
                item = ("outcomes", block.column("outcome").to_pylist())
                while not self.halt.is_set():
                    try:
                        self.results.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self.halt.is_set():
                    break
            last = ("end", None)
        except BaseException as exc:  # handed to the job, which says it in one line
            last = ("error", exc)
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()  # stops Ray Data's execution of the dataset
        if not self.halt.is_set():
            self.results.put(last)

    def stop(self, wait_s: float = 10.0) -> None:
        self.halt.set()
        self.thread.join(wait_s)


class ReplicaWatch:
    """Whether the job's replicas can still finish it. Ray restarts a replica that dies and
    retries its rows, but a restart can fail or never end (a machine out of memory; Ray issue
    53727), and Ray Data then waits for the replica forever. Once a replica has run, a job
    with none running and no row back for `timeout_s` is ended by the driver, leaving the
    rows not written to the next run. Replicas that have not yet started (a cluster still
    making room) are waited for."""

    every_s = 2.0  # between looks at Ray's actor table

    def __init__(self, ray, timeout_s: float):
        self.ray, self.timeout_s = ray, timeout_s
        self.job = ray.get_runtime_context().get_job_id()
        self.ran = False  # a replica has run: seen running, or rows came back
        self.none_since: float | None = None  # when the last running replica stopped
        self.last_row = self.looked = time.monotonic()

    def rows_back(self) -> None:
        self.ran, self.last_row = True, time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.looked >= self.every_s

    def why_stuck(self) -> str | None:
        """Why the job cannot go on; None: it can, or that cannot be told."""
        now = self.looked = time.monotonic()
        replicas = self._replicas()
        if replicas is None:
            return None
        if any(state == "ALIVE" for state, _ in replicas):
            self.ran, self.none_since = True, None
            return None
        if not self.ran:
            return None
        if self.none_since is None:
            self.none_since = now
        if now - max(self.none_since, self.last_row) < self.timeout_s:
            return None
        causes = [cause for state, cause in replicas if cause]
        why = f" (the last to die: {causes[-1]})" if causes else ""
        return (
            f"no Ray replica has run for {self.timeout_s:g}s{why}; raise "
            f"ray.restart_timeout_s to wait longer for Ray to restart one"
        )

    def _replicas(self) -> list[tuple[str, str]] | None:
        """Each replica's state and, for one that died, why in a line. From Ray's own actor
        table: the public state API needs Ray's dashboard, which lmpress does not start."""
        try:
            from ray._private import state

            table = state.actors(job_id=self.ray.JobID.from_hex(self.job))
        except Exception:  # a Ray without that table: the job is not watched
            return None
        return [
            (actor["State"], _death_cause(actor.get("DeathCause")))
            for actor in table.values()
            if "MapWorker" in actor["ActorClassName"]  # Ray Data's actor around `Replica`
        ]


def _death_cause(cause) -> str:
    """The first line of Ray's account of an actor's death, or "" where it has none."""
    try:
        context = cause.WhichOneof("context")
        message = getattr(getattr(cause, context), "error_message", "") if context else ""
    except (AttributeError, TypeError, ValueError):
        return ""
    lines = str(message).strip().splitlines()
    return lines[0] if lines else ""


class RayBatchJob(BatchJob):
    cluster: Cluster | None = None
    _puller: Puller | None = None
    _replicas_gone = False  # the watch ended the job: no replica will hand Ray Data a block

    async def run(self):
        try:
            return await super().run()
        finally:
            if self._puller is not None:
                # The puller closes Ray's iterator once its next block comes; with every
                # replica gone none will, and Ray's shutdown ends the wait instead.
                wait_s = 0.0 if self._replicas_gone else 10.0
                await asyncio.to_thread(self._puller.stop, wait_s)
            if self.cluster is not None:
                await asyncio.to_thread(self.cluster.close)

    def _open_cache(self) -> None:
        return None  # the replicas use it, each in its own process (`Replica`)

    async def _start_engine(self) -> None:
        # Each replica's engine would refuse the task too, but only once Ray had started.
        check_task(self.engine_class, self.config.task)
        params = self.config.ray
        address = cluster_address(params)
        self._say(f"joining Ray at {address}…" if address else "starting Ray…")
        self.cluster = Cluster.connect(params)  # on the main thread, where Ray wants to be
        self._say(self.cluster.describe())
        if lacking := self.cluster.check_fits(params):
            self._say(f"{lacking}: replicas start as the cluster makes room")
        model = self.config.model.model_name or self.config.engine
        replicas = f"{params.replicas} replica" + ("s" if params.replicas > 1 else "")
        self._say(f"loading {model} on {replicas} ({self.config.engine})…")

    async def _process(self, done: IdKeys, set_aside: IdKeys) -> None:
        if self.cluster is None:  # every row was done before: nothing to send
            await super()._process(done, set_aside)
            return
        reorder = Reorder(self._out) if self.options.ordered else None
        written = bytearray()  # a bit per row sent: Ray may deliver a retried call's rows twice
        async for outcome in self._outcomes(done, set_aside):
            self.summary.rows_skipped += outcome.skipped
            seq = outcome.seq
            if seq < 0:
                continue
            byte, bit = divmod(seq, 8)
            if byte >= len(written):
                written.extend(bytes(byte + 1 - len(written) + 4096))
            if written[byte] >> bit & 1:
                continue
            written[byte] |= 1 << bit
            self.summary.cache_misses += outcome.kept
            if outcome.failure is not None:
                self._fail(outcome.failure, reorder, seq)
            else:
                assert outcome.row is not None and outcome.result is not None
                self._finish(seq, outcome.row, outcome.result, reorder)

    async def _outcomes(self, done: IdKeys, set_aside: IdKeys) -> AsyncIterator[Outcome]:
        """Each row's outcome as the replicas finish it. Ray's results are pulled on a thread
        of its own, so that Ctrl-C is heard while a call is running; when the job stops early
        that thread closes Ray's iterator before Ray is shut down."""
        self._puller = Puller(self._dataset(done, set_aside))
        watch = ReplicaWatch(import_ray(), self.config.ray.restart_timeout_s)
        while True:
            try:
                kind, item = self._puller.results.get_nowait()
            except queue.Empty:
                if (
                    not self.stopping
                    and watch.due()
                    and (stuck := await asyncio.to_thread(watch.why_stuck))
                ):
                    self._replicas_gone = True
                    self._stop(stuck)
                if self.stopping:
                    # Rows the replicas still hold are abandoned: none was written, so the
                    # next run does them. Rows already back are written. Ray Data keeps
                    # handing replicas new rows, so waiting for them would never drain: the
                    # replicas are stopped instead (`run`, then Ray's shutdown).
                    self._say("stopping the Ray replicas; the rows they hold are left for the "
                              "next run")  # fmt: skip
                    return
                await asyncio.sleep(0.01)
                continue
            if kind == "end":
                return
            if kind == "error":
                raise _job_error(item)
            watch.rows_back()
            for pickled in item:
                yield pickle.loads(pickled)

    def _dataset(self, done: IdKeys, set_aside: IdKeys):
        ray = import_ray()
        from ray.data import ActorPoolStrategy

        from lmpress.batch.cluster.replica import Replica
        from lmpress.batch.cluster.source import InputRows

        params, options = self.config.ray, self.options
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = options.ordered
        rows = InputRows(
            self.source, self.selection, (done, set_aside), options.mapping.id_column,
            params.batch_size,
        )  # fmt: skip
        parser = RowParser.for_job(self.config, options, self.engine_class)
        calls = params.calls_per_replica
        return ray.data.read_datasource(
            rows,
            num_cpus=0,  # a file reader: it must not wait for CPUs the replicas hold
        ).map_batches(
            Replica,
            batch_size=params.batch_size,
            batch_format="pyarrow",
            fn_constructor_kwargs={
                "config": self._replica_config(),
                "parser": parser,
                "cache": options.cache,
                "cache_dir": str(cache_dir(options.cache_dir)),
            },
            compute=ActorPoolStrategy(
                size=params.replicas,
                max_tasks_in_flight_per_actor=calls,
                max_concurrent_calls_per_actor=calls,
            ),
            num_cpus=params.cpus_per_replica,
            num_gpus=params.gpus_per_replica,
            runtime_env={"env_vars": self._key_variables()},
        )

    def _key_variables(self) -> dict[str, str]:
        """The API key's variable, for replicas on machines whose environment lacks it."""
        name = self.engine_class.key_variable(self.config)
        return {name: os.environ[name]} if name and name in os.environ else {}

    def _replica_config(self) -> RunConfig:
        """The config each replica's engine gets: the engine's own split of one run's limits
        (a remote engine shares its concurrency and rate limits out evenly)."""
        config = copy.deepcopy(self.config)
        if config.ray.replicas == 1:
            return config
        return self.engine_class.replica_config(config, config.ray.replicas)


def _job_error(exc: BaseException) -> LmpressError:
    """The error that ends the job, in one line: lmpress's own where a replica raised one
    (a model that cannot load), else Ray's first line."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, LmpressError):
            return seen
        seen = getattr(seen, "cause", None) or seen.__cause__
    # A replica that died in its constructor reaches here as text: Ray keeps its traceback.
    where = re.escape(LmpressError.__module__)  # the module Ray's traceback names the class in
    raised = re.findall(rf"^{where}\.\w+: (.+)$", str(exc), re.MULTILINE)
    if raised:
        return LmpressError(raised[-1])
    text = str(exc).strip().splitlines()
    return LmpressError(f"Ray: {text[0] if text else type(exc).__name__}")
