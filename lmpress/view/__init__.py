"""`lmpress view` and `lmpress.view(path)`: a local web page over any lmpress output (a batch
output, its errors, a --models output, a pipeline's folder, an eval's results), a running
job's included, and `--report`'s self-contained HTML file (report.py).

The data side reads the outputs and never writes them: layout.py finds a source's files,
records.py reads each kind of line, index.py and parquet.py index them (index.py a compressed
file through plain_copy.py's plain copy of it), sources.py joins one
source's files, query.py filters and searches, stats.py makes the overview and the plots' data,
rows.py and compare.py shape rows for the API, and app.py serves the API and the page
(static/, the page's own code).

`lmpress.view(path)` returns the page's address, the server running on a thread of this
process; in a notebook the address shows as the page itself. The module is callable
(`lmpress.view(path)`), since `import lmpress.view` makes the package root's `view` this module.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import types
from pathlib import Path

FRAME_HEIGHT = 720  # pixels of the page shown in a notebook


class ViewURL(str):
    """The viewer's address; a notebook shows the page itself in its place."""

    def _repr_html_(self) -> str:
        import html

        return (
            f'<iframe src="{html.escape(self, quote=True)}" width="100%" '
            f'height="{FRAME_HEIGHT}" style="border:0"></iframe>'
        )


_running: list[object] = []  # the servers started by view(), kept alive with the process


def view(
    path: str | Path,
    other: str | Path | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
) -> ViewURL:
    """Open the viewer on an output (and, given `other`, a second one to compare with).

    Args:
        path: a batch output (compressed or not), its .errors.jsonl, a --models output, a
            pipeline's output folder (or its Hugging Face dataset folder) or an eval's results
            folder.
        other: a second output, compared with the first by row id.
        host: the address to listen on; another than this machine's needs `api_key`.
        port: the port; 0 picks a free one.
        api_key: the key every request must carry (open the page once as URL?key=KEY: the
            address returned leaves it out, so that no key lands in a notebook's output).

    Returns:
        The page's address (served by a thread of this process until it exits).
    """
    from lmpress.view.app import Viewer, create_app, is_loopback, listen, url_of, uvicorn_server
    from lmpress.vocabulary.errors import ConfigError

    if not is_loopback(host) and not api_key:
        raise ConfigError(f"view: --host {host}: a viewer open beyond this machine needs --api-key")
    viewer = Viewer([str(p) for p in (path, other) if p is not None])
    sock = listen(host, port)
    server = uvicorn_server(create_app(viewer, api_key))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="lmpress-view", daemon=True
    )
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)
    _running.append(server)
    atexit.register(viewer.close)
    return ViewURL(url_of(sock))


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs) -> ViewURL:
        return view(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
