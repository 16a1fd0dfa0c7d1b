"""Start a local Ray, or join a running cluster, for one batch job; and leave it after."""

from __future__ import annotations

import logging
import os
import socket
import time
import warnings
from dataclasses import dataclass

from lmpress.configs.schema import RayParams
from lmpress.vocabulary.errors import ConfigError, EngineUnavailableError

INSTALL_HINT = "install it with: pip install 'lmpress[ray]'"


def import_ray():
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise EngineUnavailableError(
            f"--ray needs Ray, which is not installed: {INSTALL_HINT}"
        ) from exc
    return ray


def cluster_address(params: RayParams) -> str | None:
    """The cluster to join (`ray.address`, else RAY_ADDRESS); None: start a local Ray."""
    return params.address or os.environ.get("RAY_ADDRESS") or None


# A fresh Ray starts a worker a CPU as a driver joins, ready for its tasks. A job's replicas
# cannot use them: each carries the job's environment (`runtime_env`), and a worker serves
# only the environment it started with. They would sit idle to the end, each having imported
# Ray (1.3 CPU-s here, and its memory). Ray starts the workers its tasks need as they ask.
NO_PRESTARTED_WORKERS = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}


@dataclass
class Cluster:
    address: str | None  # None: a local Ray this job started, and stops
    cpus: float
    gpus: float
    start_s: float  # how long starting or joining took

    @classmethod
    def connect(cls, params: RayParams) -> Cluster:
        address = cluster_address(params)
        if address:
            _use_auth_token()  # read when Ray is imported
        ray = import_ray()
        started = time.perf_counter()
        _quiet_ray()
        # What replicas print (a load error's traceback among it) reaches the terminal with
        # --debug only; the job's own error says what went wrong in one line.
        debug = bool(os.environ.get("LMPRESS_DEBUG"))
        quiet = {"logging_level": logging.ERROR, "log_to_driver": debug}
        if address:
            _check_reachable(address)
            try:
                ray.init(address=address, **quiet)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(
                    f"ray.address {address}: cannot join the cluster ({_first_line(exc)}); "
                    f"check the address (`ray start --head` prints it) and that this machine "
                    f"has the cluster's auth token (`ray get-auth-token` on the head, then "
                    f"export RAY_AUTH_TOKEN=...)"
                ) from exc
        else:
            # address="local": a fresh Ray of this job's own, never one already on the machine.
            # Its replicas run at this job's own priority: Ray's default (worker_niceness 15,
            # added to the niceness a worker inherits) puts them under every other busy
            # process on the machine: beside two busy loops a vLLM replica had 3.5% of a CPU
            # and was still starting after 4 minutes; at the job's priority the whole job took
            # 68 s. On a cluster its owner decides (`ray start`).
            ray.init(
                address="local",
                include_dashboard=False,
                _system_config={"worker_niceness": 0, **NO_PRESTARTED_WORKERS},
                **quiet,
            )
        _quiet_ray_data(ray)
        resources = ray.cluster_resources()
        return cls(
            address,
            float(resources.get("CPU", 0)),
            float(resources.get("GPU", 0)),
            time.perf_counter() - started,
        )

    def describe(self) -> str:
        where = f"joined the Ray cluster at {self.address}" if self.address else "started Ray"
        gpus = f", {self.gpus:g} GPUs" if self.gpus else ""
        return f"{where} in {self.start_s:.1f}s: {self.cpus:g} CPUs{gpus}"

    def check_fits(self, params: RayParams) -> str | None:
        """Refuse replicas a local Ray can never hold; a cluster may grow, so joining only
        says what it lacks now."""
        need_cpus = params.replicas * params.cpus_per_replica
        need_gpus = params.replicas * params.gpus_per_replica
        short = []
        if need_cpus > self.cpus:
            short.append(f"{need_cpus:g} CPUs ({self.cpus:g} there)")
        if need_gpus > self.gpus:
            short.append(f"{need_gpus:g} GPUs ({self.gpus:g} there)")
        if not short:
            return None
        what = (
            f"ray.replicas {params.replicas} x (ray.cpus_per_replica {params.cpus_per_replica:g}"
            f", ray.gpus_per_replica {params.gpus_per_replica:g}) need {' and '.join(short)}"
        )
        if self.address is None:
            raise ConfigError(f"{what}: lower ray.replicas or what each replica asks for")
        return what

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse an address nothing answers at: Ray itself keeps retrying one for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(
            f"ray.address {address}: nothing answers there ({exc.strerror or exc}); start the "
            f"cluster with `ray start --head`, which prints its address"
        ) from exc


def _use_auth_token() -> None:
    """Clusters started by `ray start` want a token; a client offers one only when told to,
    so say so where this machine has one and the user has not chosen."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.exists(path):
        os.environ["RAY_AUTH_MODE"] = "token"


def _quiet_ray() -> None:
    """Ray's notes about itself (its auth token, deprecations, a constructor's arguments in
    the object store) are not the user's business; its errors and the replicas' output are."""
    warnings.filterwarnings("ignore", module=r"ray(\.|$)")


def _quiet_ray_data(ray) -> None:
    """lmpress draws its own progress; Ray Data's bars and plan logs would only interleave."""
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    context.max_consecutive_actor_init_deaths = 2  # a model that cannot load fails the job
    # Ray Data reserves a share of the cluster for each operator; on a small cluster that left
    # the replicas one call at a time (measured: 50 calls of 0.1 s took 5.3 s, not 0.7 s).
    context.op_resource_reservation_enabled = False
    # A failed call is the job's one-line error; Ray Data's own account of it is for --debug.
    debug = bool(os.environ.get("LMPRESS_DEBUG"))
    logging.getLogger("ray.data").setLevel(logging.ERROR if debug else logging.CRITICAL)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
