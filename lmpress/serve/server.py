"""Running `lmpress serve`: bind, load the engine, serve with uvicorn until stopped.

Ctrl-C and SIGTERM stop it the same way. uvicorn stops accepting, lets requests in flight
(streams included) finish for up to the grace period (`--stop-grace`), cancels those left, and
then raises the signal again once it is done; the engine is closed and the server ends with
one line and exit 0. A second signal of either kind cancels the requests left at once
(uvicorn itself forces only on a second Ctrl-C).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys

from lmpress.configs.schema import RunConfig
from lmpress.vocabulary.errors import LmpressError, Terminated


def run_server(
    config: RunConfig,
    api_key: str | None = None,
    stop_grace_s: float = 10.0,
    models: list[tuple[str, RunConfig]] | None = None,
) -> int:
    """Serve `config`'s engine (or, given `models`, those models by name, each loaded on first
    use: serve/router.py) until Ctrl-C or SIGTERM (exit 0), giving requests in flight
    `stop_grace_s` to finish. The port is bound before any model loads, so a port in use fails
    at once."""
    settings = config.serve
    sock = listen(settings.host, settings.port)
    _setup_logging()
    if models:
        from lmpress.serve.front import create_front_app
        from lmpress.serve.router import ModelEntry

        app = create_front_app([ModelEntry(n, c) for n, c in models], settings, api_key)
        served = ", ".join(f"{name} on {model.engine}" for name, model in models)
        opened, closed = app.state.router.start, app.state.router.close
    else:
        from lmpress.engines.registry import create_engine
        from lmpress.serve.app import create_app

        engine = create_engine(config)
        app = create_app(engine, settings, api_key)
        served = f"{app.state.server.model_name} on {engine.name}"
        opened, closed = _nothing, engine.aclose
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    auth = "API key required" if api_key else "no API key"
    banner = (
        f"lmpress serve: {served}, listening on http://{shown}:{port}/v1 ({auth}; Ctrl-C stops)"
    )
    batch_runs = getattr(app.state, "batch_runs", None)
    try:
        asyncio.run(_serve(_uvicorn(app, stop_grace_s), sock, opened, closed, banner, batch_runs))
    except (KeyboardInterrupt, Terminated):  # how a server is stopped: not an error
        pass
    finally:
        if not models:
            app.state.server.answers.close()  # the replies kept last are written
    print("lmpress serve: stopped", file=sys.stderr)
    return 0


async def _nothing() -> None:
    pass


def _uvicorn(app, stop_grace_s: float):
    import uvicorn

    return _stopping_server()(
        uvicorn.Config(
            app,
            log_config=None,  # our handler, below; uvicorn's access log is replaced by ours
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=stop_grace_s,  # type: ignore[arg-type]  # a float works
        )
    )


def _stopping_server():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, saying that it stops and stopping at once on a second signal."""

        def handle_exit(self, sig: int, frame: object) -> None:
            if self.should_exit:
                self.force_exit = True  # either signal, twice: cancel what is left now
            else:
                grace = self.config.timeout_graceful_shutdown
                print(
                    f"lmpress serve: stopping: no new requests; those in flight have "
                    f"{grace:g}s to finish (a second Ctrl-C or SIGTERM stops at once)",
                    file=sys.stderr,
                    flush=True,
                )
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

    return Server


async def _serve(server, sock: socket.socket, opened, closed, banner: str, batch_runs=None):
    """Serve until stopped: `opened` first (a router's remote models), `closed` last (the
    engines)."""
    await opened()
    task = asyncio.create_task(server.serve(sockets=[sock]))
    if batch_runs is not None:
        batch_runs.resume()  # the batches a server stopped or killed left unfinished
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            print(banner, file=sys.stderr, flush=True)
        await task
    finally:
        if batch_runs is not None:
            await batch_runs.stop()  # before the engine closes, so no line fails for it
        await closed()


def listen(host: str, port: int, setting: str = "serve.host") -> socket.socket:
    """A socket bound to host:port (port 0: a free one) and listening, so that an address
    printed at once already takes connections; or a one-line error naming `setting` (the
    host's, as the command takes it) or the port."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise LmpressError(f"{setting}: cannot resolve '{host}' ({exc.strerror})") from exc
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise LmpressError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port"
        ) from exc
    return sock


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    for name, level in (("lmpress.serve", logging.INFO), ("uvicorn.error", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.addHandler(handler)
        logger.propagate = False
