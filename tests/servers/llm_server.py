"""A test server on 127.0.0.1 that speaks OpenAI chat completions (and completions, embeddings
and /models, and vLLM's /v1/score) and Anthropic Messages, streaming (SSE) and not, with knobs for latency and injected faults.

Replies depend on the request: the reply to a conversation is `reply_text(last user message)`
(or `Faults.answer`'s), so a test can check that every row got its own answer; a request with
tools gets a call, and one that ends with a tool's result `reply_text(that result)`
(`tool_replies`). Faults are chosen by content, so a run is reproducible: `transient_rate` of the distinct conversations
fail their first attempt (429 with Retry-After, 500, a hang past the client's timeout, a dropped
connection, a malformed body; repeat a kind in `transient_kinds` to weight it), and conversations
containing a `permanent` marker always fail with that status. Load-driven pushback comes from
`rate_limit_rps` (a token bucket; 429 beyond it, with or without the wait in Retry-After), and
an outage from `overloaded_until` or `burst` (every request gets `overload_status`: 429, 503,
529). What a successful request gets is in `replies`; a reasoning model's thinking comes before
the answer where `Faults.reasoning` (chat completions) or a request's `thinking` (Messages) asks,
written as that provider writes it (`reasoning_replies`). A body the SDK's own request
type does not allow (an unknown field, a wrong type) gets the 400 the provider gives
(`request_types`); `Faults.extensions` names the fields beyond it that a vLLM-like server takes.

Both wires play the providers' prompt caches (`prompt_cache`): Anthropic's reads and writes
what a request's `cache_control` marks, OpenAI's reports a repeated long prefix as
`cached_tokens`, live and in batches alike.

The same port serves the providers' batch APIs (OpenAI's Files and Batches, Anthropic's Message
Batches, Gemini's batch mode) in compressed time, with their own faults in `Faults.batch` (`batch_api`), so a test can
run one job live and as a batch against one server and compare.

Used by the engine tests, the CLI tests and benchmarks/remote_throughput.py:

    with LLMServer(Faults(latency_s=0.2)) as server:
        ... --remote_params.api_url {server.openai_url} ...
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

from tests.servers import embeddings, gemini_batches, refusals, request_types
from tests.servers.batch_api import BatchAPI, BatchFaults, Request
from tests.servers.prompt_cache import PromptCache
from tests.servers.replies import Reply, reply_text

__all__ = ["GATHER_LIMIT_S", "BatchFaults", "Faults", "LLMServer", "Reply", "Stats", "reply_text"]

TRANSIENT_KINDS = ("429", "500", "hang", "drop", "malformed")
GATHER_LIMIT_S = 60  # bounds only a hang: a client that never gathers that many fails its test
HOLD_LIMIT_S = 120  # bounds only a test that never releases what `Faults.hold_after` holds


@dataclass
class Faults:
    latency_s: float = 0.0  # before every successful reply
    transient_rate: float = 0.0  # share of distinct conversations whose first attempt fails
    transient_kinds: tuple[str, ...] = TRANSIENT_KINDS  # chosen among by content
    retry_after: str | None = "1"  # Retry-After sent with a 429 (seconds or an HTTP date)
    retry_after_ms: int | None = None  # retry-after-ms sent with a 429, as OpenAI does
    hang_s: float = 3.0  # how long a "hang" stalls before answering
    stream_drop_after: int = 2  # a dropped stream ends after this many chunks
    permanent: dict[str, int] = field(default_factory=dict)  # marker in the conversation -> status
    required_key: str | None = None  # a request without this key gets 401
    echo_credentials: bool = False  # error bodies quote the credentials received (careless server)
    rate_limit_rps: float | None = None  # beyond this rate (1 s of burst): 429
    rate_limit_retry_after: bool = True  # that 429 says the wait (retry-after-ms, Retry-After)
    overloaded_until: float = 0.0  # time.monotonic() before which every request is turned away
    # A burst in the middle of a run: (seconds after the first request, how long) during which
    # every request is turned away, as with overloaded_until.
    burst: tuple[float, float] | None = None
    overload_status: int = 429  # what they get: 429, 503, or Anthropic's 529 "overloaded"
    overload_retry_after: str | None = "0.2"  # the Retry-After they get, if any
    # Successful replies wait until this many requests are in flight at once (then never
    # again; GATHER_LIMIT_S at most), so a test sees a client's concurrency as an event, not
    # as a count that depends on how fast the machine got requests out.
    gather: int = 0
    # Successful replies beyond the first `hold_after` wait until the test calls
    # `LLMServer.release()` (HOLD_LIMIT_S at most), so a job is mid-way while the test acts on
    # it (a kill, a signal), however fast the machine runs the rows before.
    hold_after: int | None = None
    model: str = "test-model"
    # Top-level body fields beyond the SDK's request type that this server takes, as a vLLM
    # server takes its own (`request_types.VLLM_EXTENSIONS`); none: an OpenAI that refuses them.
    extensions: frozenset[str] = frozenset()
    # The reasoning model it plays on chat completions, and so where its thinking goes
    # (`reasoning_replies.STYLES`); None: a model that does not think. On the Messages API the
    # model thinks when a request's `thinking` asks, as Claude does.
    reasoning: str | None = None
    batch: BatchFaults = field(default_factory=BatchFaults)  # the batch APIs' clock and faults
    # The shortest prefix its prompt caches keep, in words (`prompt_cache`): Anthropic's
    # minimum for most models, and OpenAI's.
    prompt_cache_min: int = 1024
    # The reply text to a conversation's last user message: a benchmark whose steps parse the
    # replies (benchmarks/pipeline_speed.py) answers each step's prompt in the shape it reads.
    answer: Callable[[str], str] = reply_text


@dataclass
class Stats:
    requests: int = 0
    completed: int = 0  # 2xx replies sent
    statuses: Counter = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0
    first_arrival: float | None = None
    last_done: float | None = None
    token_requests: int = 0
    credentials: set = field(default_factory=set)
    bodies: deque = field(default_factory=lambda: deque(maxlen=2000))  # (path, body)
    arrivals: deque = field(default_factory=lambda: deque(maxlen=200_000))  # (t, in flight then)
    replies: deque = field(default_factory=lambda: deque(maxlen=200_000))  # (t, status)
    # The batch APIs (live requests above do not count them, nor they the live ones):
    # custom_id -> how many batches that passed validation held it (a lost create reply counts)
    batch_submissions: Counter = field(default_factory=Counter)
    batches_created: int = 0  # both wires, those that then fail validation included
    files_uploaded: int = 0
    upload_attempts: int = 0  # files.create and messages.batches.create, refused ones included
    batch_calls: Counter = field(default_factory=Counter)  # (method, path template) -> calls


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16)


class LLMServer:
    """The server, on a free port (or `port`: a stopped server's, for a client that must find
    the same URL), serving from a background thread until `stop()`."""

    def __init__(self, faults: Faults | None = None, *, port: int = 0):
        self.faults = faults or Faults()
        self.stats = Stats()
        self.lock = threading.Lock()
        self._attempts: Counter = Counter()
        self._bucket = (0.0, 0.0)  # (tokens, last refill) for rate_limit_rps
        self._httpd = _HTTPServer(("127.0.0.1", port), _Handler)
        self._httpd.app = self
        self.batches = BatchAPI(self)
        self.prompt_cache = PromptCache(self.faults.prompt_cache_min)
        self._thread: threading.Thread | None = None
        self.gathered = threading.Event()  # Faults.gather requests were in flight together
        self._gate_open = threading.Event()  # gathered, or given up on
        self.holding = threading.Event()  # a reply past Faults.hold_after is being held
        self._released = threading.Event()
        self._let_through = 0  # replies Faults.hold_after let through

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LLMServer:
        request_types.prepare()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> LLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset(self) -> None:
        with self.lock:
            self.stats = Stats()
            self._attempts.clear()

    # --- deciding what a request gets ------------------------------------------------------

    def _arrive(self, key: str) -> int:
        with self.lock:
            now = time.monotonic()
            s = self.stats
            s.requests += 1
            s.in_flight += 1
            s.max_in_flight = max(s.max_in_flight, s.in_flight)
            if s.first_arrival is None:
                s.first_arrival = now
            s.arrivals.append((now, s.in_flight))
            self._attempts[key] += 1
            return self._attempts[key]

    def _leave(self, status: int) -> None:
        with self.lock:
            now = time.monotonic()
            s = self.stats
            s.in_flight -= 1
            s.statuses[status] += 1
            if 200 <= status < 300:
                s.completed += 1
            s.last_done = now
            s.replies.append((now, status))

    def _rate_limited(self) -> float | None:
        """Seconds until the next request would be allowed, or None when it is now."""
        rps = self.faults.rate_limit_rps
        if not rps:
            return None
        with self.lock:
            tokens, last = self._bucket
            now = time.monotonic()
            tokens = min(rps, tokens + (now - last) * rps) if last else rps
            if tokens >= 1:
                self._bucket = (tokens - 1, now)
                return None
            self._bucket = (tokens, now)
            return (1 - tokens) / rps

    def gather(self) -> None:
        """Hold this request until `Faults.gather` are in flight together, once."""
        with self.lock:
            if self.stats.in_flight >= self.faults.gather:
                self.gathered.set()
                self._gate_open.set()
        if not self._gate_open.wait(GATHER_LIMIT_S):
            self._gate_open.set()  # never gathered (the test fails on it): hold no one else

    def hold(self) -> None:
        """Let the first `Faults.hold_after` replies through; hold the rest until `release()`."""
        with self.lock:
            if self._let_through < self.faults.hold_after:
                self._let_through += 1
                return
            self.holding.set()
        self._released.wait(HOLD_LIMIT_S)

    def release(self) -> None:
        """Let every held reply, and every later one, through."""
        self._released.set()

    def in_burst(self) -> bool:
        """Whether `Faults.burst` turns requests away now."""
        burst, first = self.faults.burst, self.stats.first_arrival
        if burst is None or first is None:
            return False
        return burst[0] <= time.monotonic() - first < burst[0] + burst[1]

    def fault_for(self, conversation: str, attempt: int) -> str | int | None:
        """What goes wrong with this attempt: a permanent status, a transient kind, or None."""
        f = self.faults
        status = refusals.permanent_status(conversation, f.permanent)
        if status is not None:
            return status
        if attempt == 1 and f.transient_rate > 0 and f.transient_kinds:
            h = _hash(conversation)
            if (h % 10_000) < f.transient_rate * 10_000:
                return f.transient_kinds[(h // 10_000) % len(f.transient_kinds)]
        return None


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a hanging handler must not hold up stop()
    request_queue_size = 512  # 32+ clients connecting at once must not overflow the backlog
    app: LLMServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else keep-alive requests wait ~40 ms on delayed ACKs
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # --- routing ---------------------------------------------------------------------------

    def do_GET(self) -> None:
        if self._batch_api("GET"):
            return
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            model = self.server.app.faults.model
            data = [{"id": model, "object": "model", "created": 0, "owned_by": "test"}]
            self._json(200, {"object": "list", "data": data})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self._batch_api("POST", raw):
            return
        path = self.path.split("?")[0].rstrip("/")
        app = self.server.app
        if path == "/token":  # a stand-in for Google's OAuth token endpoint
            with app.lock:
                app.stats.token_requests += 1
                n = app.stats.token_requests
            self._json(200, {"access_token": f"ya29.test-token-{n}", "expires_in": 3600,
                             "token_type": "Bearer"})  # fmt: skip
            return
        anthropic = path in ("/v1/messages", "/messages")
        if not anthropic and path not in (
            "/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
            "/v1/embeddings", "/embeddings", "/v1/score", "/score",
        ):  # fmt: skip
            self._json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
            return
        try:
            body = json.loads(raw)
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            self._error(400, "the body is not a JSON object", anthropic)
            return
        with app.lock:
            app.stats.bodies.append((path, body))
            app.stats.credentials.add(self._credential(anthropic))
        conversation = refusals.conversation(body)
        attempt = app._arrive(f"{path}:{conversation}")
        self._counted = False
        status = 500
        try:
            status = self._answer(path, body, conversation, attempt, anthropic)
        finally:
            self._count(status)  # the replies that hang up before their last bytes

    def do_DELETE(self) -> None:
        if not self._batch_api("DELETE"):
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def _batch_api(self, method: str, raw: bytes = b"") -> bool:
        """Serve a request to the Files, Batches or Message Batches API; False if it is none."""
        path, _, query = self.path.partition("?")
        path = path.rstrip("/")
        if not path.startswith(("/v1/files", "/v1/batches", "/v1/messages/batches", "/v1beta/",
                                "/upload/v1beta/")):  # fmt: skip
            return False
        app = self.server.app
        anthropic = path.startswith("/v1/messages/")
        gemini = "v1beta/" in path
        credential = self.headers.get("x-goog-api-key", "") if gemini else (
            self._credential(anthropic))  # fmt: skip
        with app.lock:
            app.stats.credentials.add(credential)
        # A resumable upload's later posts are authorized by the session in their URL.
        session = gemini and "upload_id=" in query
        if app.faults.required_key not in (None, credential) and not session:
            if gemini:
                self._json(401, gemini_batches.error_body(401, "API key not valid."))
            else:
                self._error(401, "invalid API key", anthropic)
            return True
        host = self.headers.get("Host") or f"127.0.0.1:{app.port}"
        headers = {key.lower(): value for key, value in self.headers.items()}
        request = Request(method, path, dict(parse_qsl(query)), self.headers.get("Content-Type")
                          or "", raw, f"http://{host}", headers)  # fmt: skip
        answer = app.batches.handle(request)
        if answer is None and gemini:
            self._json(404, gemini_batches.error_body(404, f"no route {method} {path}"))
        elif answer is None:
            self._error(404, f"no route {method} {path}", anthropic)
        else:
            self._raw(answer.status, answer.body, answer.headers, answer.content_type)
        return True

    def _answer(
        self, path: str, body: dict[str, Any], conversation: str, attempt: int, anthropic: bool
    ) -> int:
        app = self.server.app
        f = app.faults
        credential = self._credential(anthropic)
        if f.required_key is not None and credential != f.required_key:
            echo = f" (got {credential!r})" if f.echo_credentials else ""
            return self._error(401, f"invalid API key{echo}", anthropic)
        if time.monotonic() < f.overloaded_until or app.in_burst():
            return self._overloaded(anthropic)
        wait = app._rate_limited()
        if wait is not None:
            if not f.rate_limit_retry_after:
                return self._error(429, "rate limit reached, slow down", anthropic)
            return self._rate_limit(wait, anthropic)
        problem = refusals.request_problem(body, path, anthropic, f.extensions, f.reasoning)
        if problem:
            return self._error(400, problem, anthropic)
        fault = app.fault_for(conversation, attempt)
        if isinstance(fault, int):
            echo = f"; request headers: {dict(self.headers)}" if f.echo_credentials else ""
            return self._error(fault, f"this conversation is refused (injected {fault}){echo}",
                               anthropic)  # fmt: skip
        if fault == "429":
            return self._rate_limit(None, anthropic)
        if fault == "500":
            echo = f" while serving key {credential}" if f.echo_credentials else ""
            return self._error(500, f"internal error (injected){echo}", anthropic)
        if fault == "hang":
            time.sleep(f.hang_s)
        if f.gather:
            app.gather()
        if f.hold_after is not None:
            app.hold()
        if f.latency_s:
            time.sleep(f.latency_s)
        if fault == "drop" and not body.get("stream"):
            self.close_connection = True  # say nothing and hang up
            return 599
        if fault == "malformed" and not body.get("stream"):
            return self._raw(200, b'{"id": "broken", "choices": [{"index": 0, "mess')
        if path.endswith("/embeddings"):
            return self._json(200, embeddings.reply(body, f.model))
        if path.endswith("/score"):
            return self._json(200, embeddings.score_reply(body, f.model))
        reply = Reply.of(body, anthropic, f.model, f.reasoning, app.prompt_cache, f.answer)
        if body.get("stream"):
            broken = fault if fault in ("drop", "malformed") else None
            return self._stream(reply, body, anthropic, broken)
        return self._json(200, reply.anthropic() if anthropic else reply.openai(path))

    # --- writing ---------------------------------------------------------------------------

    def _count(self, status: int) -> None:
        """Count the request's outcome (once), before its reply's last bytes go out: a client
        that holds its reply finds it counted, and a test that reads the counts or resets
        them once its client has its replies never races this thread."""
        if getattr(self, "_counted", True):  # counted, or a request `_arrive` never saw
            return
        self._counted = True
        self.server.app._leave(status)

    def _credential(self, anthropic: bool) -> str:
        if anthropic and self.headers.get("x-api-key"):
            return self.headers["x-api-key"]
        auth = self.headers.get("Authorization") or ""
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else auth

    def _raw(
        self, status: int, data: bytes, headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> int:  # fmt: skip
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self._count(status)  # the headers are buffered until end_headers
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (a hang past its timeout)
            self.close_connection = True
        return status

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> int:
        return self._raw(status, json.dumps(payload).encode("utf-8"), headers)

    def _error(self, status: int, message: str, anthropic: bool, headers=None) -> int:
        return self._json(status, refusals.error_body(status, message, anthropic), headers)

    def _overloaded(self, anthropic: bool) -> int:
        f = self.server.app.faults
        headers = {"Retry-After": f.overload_retry_after} if f.overload_retry_after else {}
        if f.overload_status == 429:
            return self._error(429, "rate limit reached, slow down", anthropic, headers)
        return self._error(f.overload_status, "overloaded, try again later", anthropic, headers)

    def _rate_limit(self, wait: float | None, anthropic: bool) -> int:
        f = self.server.app.faults
        headers = {}
        if wait is not None:
            headers["retry-after-ms"] = str(int(wait * 1000) + 1)
            headers["Retry-After"] = str(max(1, round(wait)))
        else:
            if f.retry_after is not None:
                headers["Retry-After"] = f.retry_after
            if f.retry_after_ms is not None:
                headers["retry-after-ms"] = str(f.retry_after_ms)
        return self._error(429, "rate limit reached, slow down", anthropic, headers)

    def _stream(self, reply: Reply, body: dict[str, Any], anthropic: bool, broken) -> int:
        events = reply.anthropic_events() if anthropic else reply.openai_chunks(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for i, event in enumerate(events):
                if broken and i == self.server.app.faults.stream_drop_after:
                    if broken == "drop":
                        self.close_connection = True  # hang up mid-stream, no final chunk
                        return 599
                    event = b"event: content_block_delta\ndata: {broken\n\n" if anthropic else (
                        b"data: {broken\n\n"
                    )  # fmt: skip
                if i == len(events) - 1:
                    self._count(200)  # a client's stream ends at its last event
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        return 200
