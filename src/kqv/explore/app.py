"""The explorer's web app (Starlette): one page, its scripts, and a JSON API over one run's model.

    GET  /                the page (static/index.html); its script and style from /static/, nothing from elsewhere
    GET  /api/info        what the run is: task, model config, input limit, the views that apply, sample settings,
                          and an example input the page opens with (null when the model reads none of its candidates)
    POST /api/analyze     {"text": ..., ("top_k" | "beam" | "target"), ("weights": "micros")} -> tokens, attention
                          of every layer and head by kind, per-head statistics, and the task's predictions
    POST /api/continue    {"text": ..., ("max_new_tokens", "temperature", "top_k", "top_p", "seed")} -> NDJSON
                          lines, one per sampled token as it is generated, then {"done": true, "text": ...}
    POST /api/export      the same body as analyze, and "view" (the page's view settings) -> one self-contained HTML
                          file of the views (data inlined) that opens on that view

Every error is JSON, {"error": message}, with a 4xx status for anything the request can fix (a missing run is 404,
bad input 400, a body that is not JSON 400, an over-long body 413); a bug answers 500 with a message, never a
traceback. Replies are gzip-compressed for a client that accepts it (the NDJSON stream flushed line by line).
The model is loaded on the first request, so a missing run is an answer, not a crash.

Before any of that, the front door (kqv.explore.guard) answers only the explorer's own host names (421 for any
other, against DNS rebinding) and its own page (403 for a cross-site request); a body is read only up to
MAX_BODY_BYTES, and its numbers are checked (finite, in range) before a model runs. Every answer is strict JSON:
a NaN or infinite number a model produces (e.g. the weights of a diverged run) is sent as null.

Look closer and intervene (kqv.explore.interventions), behind the same front door:

    GET  /api/interventions    which of the next three the model has
    POST /api/neuron      {"text", "layer", "head", "token"} -> query, keys, products, scores and weights of one query
    POST /api/replace     {"text", "position", "replacement", "layer", "head"} -> attention and predictions, before
                          and after
    POST /api/ablate      {"text", "mode": "zero" | "mean", "heads": [[layer, head], ...]} -> loss and next-token
                          effect of every head switched off alone, and of the chosen heads together
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import HOST, PORT, ConfigError, option
from ..train.metrics import strict_json
from .analysis import weights_as
from .export import STATIC, standalone_page
from .guard import ANALYZE_NUMBERS, LOOPBACK, FrontDoor, Number, check_numbers, nesting
from .interventions import INTERVENE_NUMBERS, ablate_heads, available, neuron_view, replace_token
from .loading import DEFAULT_MAX_TOKENS, load_subject
from .subjects import ServedGeneration, Subject

MAX_BODY_BYTES = 1 << 20
MAX_VIEW_CHARS = 4096
MAX_NESTING = 8  # the deepest a request needs is 3 ({"heads": [[layer, head]]}): deeper is refused before it is read
GZIP_LEVEL = 1  # replies gzip-compressed when accepted: level 1 already makes the weights' JSON 5-10x smaller, fast
# the page may load only what this app serves: a stray CDN reference fails in the browser, not silently at home
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; connect-src 'self'"
)
log = logging.getLogger("kqv.explore")


class StrictJSONResponse(JSONResponse):
    """Starlette's JSONResponse (which raises on NaN) with a non-finite number sent as null instead."""

    def render(self, content: Any) -> bytes:
        return strict_json(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class RequestError(ValueError):
    """A request the app refuses before the model sees it, with the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def status_of(error: Exception) -> int:
    from ..interop.sentence_encoder import ModelNotInstalledError

    if isinstance(error, RequestError):
        return error.status
    if isinstance(error, (FileNotFoundError, ModelNotInstalledError)):
        return 404
    if isinstance(error, (ValueError, TypeError, KeyError)):
        return 400
    return 500


def error_response(error: Exception) -> JSONResponse:
    status = status_of(error)
    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    if status == 500:
        log.exception("kqv explore: unexpected error", exc_info=error)
        message = f"internal error ({type(error).__name__}: {message}); please report it"
    return StrictJSONResponse({"error": message}, status_code=status)


class Explorer:
    """The app's state: which run, and its model once loaded (loaded on first use, then kept)."""

    def __init__(self, run: str | Path, max_tokens: int | None = DEFAULT_MAX_TOKENS, subject: Subject | None = None):
        self.run, self.max_tokens, self._subject = run, max_tokens, subject
        self._loading = threading.Lock()

    def subject(self) -> Subject:
        with self._loading:
            if self._subject is None:
                self._subject = load_subject(self.run, self.max_tokens)
            return self._subject


async def read_body(request: Request) -> bytes:
    """The body, read chunk by chunk and refused (413) as soon as it passes MAX_BODY_BYTES: the rest is never read."""
    too_long = f"the request body is over {MAX_BODY_BYTES:,} bytes; at most {MAX_BODY_BYTES:,} are read"
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(f"{too_long} (Content-Length: {int(declared):,})", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RequestError(too_long, 413)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, numbers: dict[str, Number], ranges: Mapping[str, str] = {}) -> dict[str, Any]:
    """The body as a JSON object, nested at most MAX_NESTING deep, whose numbers are all finite and the endpoint's
    options (`numbers`) in range (`ranges`: how messages state the valid values of options checked later,
    `check_numbers`)."""
    body = await read_body(request)
    try:
        payload = json.loads(body or b"null")
    except RecursionError:  # deeper than Python's JSON reader follows
        raise RequestError(too_deep("deeper than JSON is read")) from None
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError, or an integer of over 4,300 digits
        raise RequestError(
            f'the request body is not valid JSON ({error}); send an object like {{"text": "To be, or not to be"}}'
        ) from None
    if nesting(payload, MAX_NESTING) > MAX_NESTING:
        raise RequestError(too_deep(f"more than {MAX_NESTING} deep"))
    if not isinstance(payload, dict):
        raise RequestError(
            f'the request body must be a JSON object like {{"text": "..."}}, got {type(payload).__name__}'
        )
    check_numbers(payload, numbers, ranges)
    return payload


def too_deep(how: str) -> str:
    return (
        f"the request is nested {how}: a request is a JSON object nested at most {MAX_NESTING} deep, like "
        '{"text": "To be", "heads": [[0, 1]]}'
    )


def endpoint(handler: Callable) -> Callable:
    """Wrap a handler so that whatever goes wrong becomes a JSON error response."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as error:  # noqa: BLE001 -- every error becomes a JSON answer, never a traceback
            return error_response(error)

    return wrapped


def ndjson(lines: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """One JSON object per line; an error after the first line (the status is sent by then) is the last line."""
    try:
        for line in lines:
            yield (strict_json(line) + "\n").encode()
    except Exception as error:  # noqa: BLE001
        yield (strict_json({"error": str(error), "status": status_of(error)}) + "\n").encode()


def analyzed(subject: Subject, payload: dict[str, Any]) -> dict[str, Any]:
    """The subject's analysis of the request, its weights sent as the request's "weights" asks (analysis.WIRE)."""
    with weights_as(payload.pop("weights", "lists")):
        return subject.analyze(payload)


def create_app(
    run: str | Path,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    subject: Subject | None = None,
    *,
    host: str = "127.0.0.1",
) -> Starlette:
    """The explorer app for `run` (a run directory, or `minilm`); `subject` skips loading (tests). It answers the
    loopback names and `host`, the address it listens on (kqv.explore.guard)."""
    explorer = Explorer(run, max_tokens, subject)

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY})

    async def info(request: Request) -> Response:
        return StrictJSONResponse((await run_in_threadpool(explorer.subject)).info())

    async def analyze(request: Request) -> Response:
        payload = await read_json(request, ANALYZE_NUMBERS)
        subject = await run_in_threadpool(explorer.subject)
        return StrictJSONResponse(await run_in_threadpool(analyzed, subject, payload))

    async def continue_text(request: Request) -> Response:
        payload = await read_json(request, {}, ServedGeneration.ranges())
        subject = await run_in_threadpool(explorer.subject)
        lines = await run_in_threadpool(subject.continuation, payload)  # checks the request before streaming
        return StreamingResponse(ndjson(lines), media_type="application/x-ndjson")

    async def export(request: Request) -> Response:
        payload = await read_json(request, ANALYZE_NUMBERS)
        view = payload.pop("view", "")  # what the page shows: the file opens on it
        if not isinstance(view, str) or len(view) > MAX_VIEW_CHARS:
            raise RequestError(
                f"view must be the page's view settings, a string of at most {MAX_VIEW_CHARS} characters"
            )
        subject = await run_in_threadpool(explorer.subject)
        analysis = await run_in_threadpool(analyzed, subject, payload)
        page = standalone_page(subject.info(), analysis, payload, view)
        return Response(
            page, media_type="text/html", headers={"Content-Disposition": 'attachment; filename="kqv-attention.html"'}
        )

    async def http_error(request: Request, error: HTTPException) -> Response:
        return StrictJSONResponse(
            {"error": f"{error.detail}: {request.method} {request.url.path}"}, status_code=error.status_code
        )

    routes = [
        Route("/", endpoint(index)),
        Route("/api/info", endpoint(info)),
        Route("/api/analyze", endpoint(analyze), methods=["POST"]),
        Route("/api/continue", endpoint(continue_text), methods=["POST"]),
        Route("/api/export", endpoint(export), methods=["POST"]),
        *intervention_routes(explorer),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    # the front door first (outermost): a refused request is answered before anything else runs; then gzip
    # (a 1,024-token analysis is tens of MB of JSON; a stream is flushed line by line, so it still streams)
    middleware = [
        Middleware(FrontDoor, host=host),
        Middleware(GZipMiddleware, minimum_size=1024, compresslevel=GZIP_LEVEL),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error}, middleware=middleware)


def intervention_routes(explorer: Explorer) -> list[Route]:
    """Look closer and intervene (kqv.explore.interventions): the neuron view, replacing a token, heads switched
    off; each request checked as analyze's are (JSON object, numbers finite and in range) before the model runs."""

    async def interventions(request: Request) -> Response:
        return StrictJSONResponse(available(await run_in_threadpool(explorer.subject)))

    def intervention(compute: Callable) -> Callable:
        async def handler(request: Request) -> Response:
            payload = await read_json(request, INTERVENE_NUMBERS)
            subject = await run_in_threadpool(explorer.subject)
            return StrictJSONResponse(await run_in_threadpool(compute, subject, payload))

        return endpoint(handler)

    return [
        Route("/api/interventions", endpoint(interventions)),
        Route("/api/neuron", intervention(neuron_view), methods=["POST"]),
        Route("/api/replace", intervention(replace_token), methods=["POST"]),
        Route("/api/ablate", intervention(ablate_heads), methods=["POST"]),
    ]


class BackgroundServer:
    """An app served by uvicorn in a thread on a free loopback port, as a context manager (tests, screenshots):

    with BackgroundServer(create_app("runs/lm")) as server:
        ... server.url ...
    """

    def __init__(self, app: Starlette, start_seconds: float = 20.0):
        import socket

        import uvicorn

        # the socket is bound here and handed to uvicorn, so no other process can take its port in between
        # (tests run in parallel: a port probed free, then closed, could be another server's by the time it listens)
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        port = self.socket.getsockname()[1]
        self.url, self.start_seconds = f"http://127.0.0.1:{port}", start_seconds
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> BackgroundServer:
        import time

        self.thread.start()
        deadline = time.monotonic() + self.start_seconds
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the explorer did not start on {self.url}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()


def check_port_free(host: str, port: int) -> None:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({error.strerror}); pick another with {option(PORT)}"
            ) from None


def serve(
    run: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    open_browser: bool = False,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    device: str = "cpu",
) -> None:
    """Load the run, its model on `device` (errors before anything listens), then serve the explorer until Ctrl-C."""
    import uvicorn

    if not 0 < port < 65536:
        raise ConfigError(f"{option(PORT)} must be from 1 to 65535, got {port}")
    subject = load_subject(run, max_tokens, device)
    check_port_free(host, port)
    url = f"http://{'localhost' if host in LOOPBACK else host}:{port}/"
    if host not in LOOPBACK:
        print(
            f"kqv: listening on {host}:{port}, which other machines can reach: anyone who can connect can run "
            f"this model (there is no login). Leave out {option(HOST)} to listen on this machine only."
        )
    print(f"kqv: exploring {run} ({subject.task}) at {url}  (Ctrl-C stops)")
    if open_browser:
        import webbrowser

        threading.Timer(1.0, webbrowser.open, (url,)).start()
    uvicorn.run(create_app(run, max_tokens, subject, host=host), host=host, port=port, log_level="warning")
