"""The explorer's front door: which requests reach the app at all, and which numbers a request may carry.

A web server on localhost is reachable from every page the browser opens. Two attacks follow, and `FrontDoor`
refuses both before any work is done:

* DNS rebinding: a page at evil.example.com re-points its own name to 127.0.0.1 and then reads the explorer as
  if it were its own site. Its requests carry `Host: evil.example.com`, so only the explorer's own names are
  answered: the loopback names (localhost, 127.0.0.1, [::1]), the `--host` it was started with, the address the
  connection arrived at (`scope["server"]`, an IP the client typed), and, listening on every interface
  (`--host 0.0.0.0`), this machine's host name. Any port is accepted: an ssh tunnel or a port forward may show
  the page under another one. Anything else is a 421 whose message says where to open the page.
* cross-site requests: another page POSTs to the explorer (or makes it load a model). A request with an
  `Origin` header must come from the explorer's own origin (scheme, host and port of its Host header); a
  browser's `Sec-Fetch-Site` must be same-origin, except for opening the page itself from a link. Else a 403.

`check_numbers` refuses what JSON has no number for (NaN and Infinity, which Python's json reads, and 1e400,
which it reads as inf) anywhere in a request, and the options of the analyze endpoints outside their ranges,
each with a 400 that names the field and its valid range, before a model runs (the continue endpoint's options
are kqv's generation options, which the subject checks as one config before the first token).
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import DataError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
EVERY_INTERFACE = ("0.0.0.0", "::", "")
DEFAULT_PORTS = {"http": 80, "https": 443}
# a Host header, RFC 9110: a name or IPv4 address, or an IPv6 address in brackets, then an optional port
AUTHORITY = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::(?P<port>[0-9]{1,5}))?", re.IGNORECASE)


class Authority(NamedTuple):
    """The host and port a request was sent to, from its Host header (or an Origin's)."""

    hostname: str  # lower case, an IPv6 address without its brackets
    port: int | None


def own_names(host: str) -> frozenset[str]:
    """The names the explorer listening on `host` answers to (lower case, IPv6 without brackets)."""
    names = {*LOOPBACK, host.lower().strip("[]")}
    if host in EVERY_INTERFACE:  # reachable from other machines: by this machine's name too
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(names)


def authority(value: str) -> Authority | None:
    """A Host header (`name`, `name:port`, `[v6]:port`) parsed, or None when it is not one."""
    match = AUTHORITY.fullmatch(value)
    if match is None:
        return None
    return Authority((match["v6"] or match["name"]).lower(), int(match["port"]) if match["port"] else None)


def same_origin(origin: str, scheme: str, host: Authority) -> bool:
    """Whether an Origin header (`scheme://host[:port]`) names the origin the request was sent to."""
    origin_scheme, _, rest = origin.partition("://")
    parsed = authority(rest)
    default = DEFAULT_PORTS.get(scheme)
    return (
        parsed is not None
        and origin_scheme.lower() == scheme
        and parsed.hostname == host.hostname
        and (parsed.port or default) == (host.port or default)
    )


class FrontDoor:
    """ASGI middleware: answers a request for another host with 421, a cross-site one with 403, both in JSON."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1"):
        self.app, self.host, self.names = app, host, own_names(host)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            return await self.app(scope, receive, send)
        status, message = refusal
        await JSONResponse({"error": message}, status_code=status)(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        scheme, server = scope.get("scheme", "http"), scope.get("server") or ("", None)
        url = self.url(scheme, server[1])
        host = authority(headers.get("host", ""))
        if host is None or host.hostname not in self.names | {str(server[0]).lower()}:
            return 421, (
                f"this explorer does not answer to the host {headers.get('host', '(none)')!r} (a page of "
                f"another site may be trying to reach it); open it at {url}"
            )
        origin = headers.get("origin")
        if origin is not None and not same_origin(origin, scheme, host):
            return 403, (
                f"refused a request from the page {origin!r}: only the explorer's own page may use it; open it at {url}"
            )
        site, mode = headers.get("sec-fetch-site"), headers.get("sec-fetch-mode")
        navigation = scope["method"] == "GET" and mode == "navigate"  # a link to the page from elsewhere
        if site not in (None, "same-origin", "none") and not navigation:
            return 403, f"refused a {site} request: only the explorer's own page may use it; open it at {url}"
        return None

    def url(self, scheme: str, port: int | None) -> str:
        name = "localhost" if self.host in LOOPBACK or self.host in EVERY_INTERFACE else self.host
        name = f"[{name}]" if ":" in name else name
        return f"{scheme}://{name}{'' if port in (None, DEFAULT_PORTS.get(scheme)) else f':{port}'}/"


# ---------------------------------------------------------------------------------------------------------------
# Numbers in requests


@dataclass(frozen=True)
class Number:
    """The valid values of one numeric option: an int or float from `low` to `high` (`low` itself excluded when
    `above_low`), and `zero` too when it means something of its own (temperature 0 = greedy)."""

    integer: bool
    low: float
    high: float
    above_low: bool = False
    zero: bool = False
    text: str = ""  # how the message states the range, when not "an integer from 1 to 50" and the like

    def allows(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        in_range = (self.low < value if self.above_low else self.low <= value) and value <= self.high
        return math.isfinite(value) and (in_range or (self.zero and value == 0))

    def describe(self) -> str:
        if self.text:
            return self.text
        kind = "an integer" if self.integer else "a number"
        low, high = (f"{bound}" if isinstance(bound, int) else f"{bound:g}" for bound in (self.low, self.high))
        span = f"greater than {low} and at most {high}" if self.above_low else f"from {low} to {high}"
        return f"{kind} {span}" + (" (or 0)" if self.zero else "")


# the options the analyze endpoints read, as the subjects check them (kqv.explore.subjects); /api/continue's are
# kqv's generation options, checked by the subject as one `ServedGeneration` (kqv.nn.generation.GenerationConfig)
ANALYZE_NUMBERS = {"top_k": Number(True, 1, 50), "beam": Number(True, 1, 16)}


def non_finite(value: Any, name: str) -> tuple[str, float] | None:
    """The first (field, value) in a parsed JSON value that is NaN or infinite, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return name, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite(item, f"{name}.{key}" if name else str(key))
        if found:
            return found
    return None


def nesting(value: Any, limit: int) -> int:
    """How deep `value` (parsed JSON) nests lists and objects (a number or a string: 0, `{"a": 1}`: 1), counted
    without recursion and only up to `limit` + 1: a request nested a thousand deep is refused, not walked."""
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= limit:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((inner, depth + 1) for inner in (item.values() if isinstance(item, dict) else item))
    return deepest


def check_numbers(payload: dict[str, Any], numbers: dict[str, Number], ranges: Mapping[str, str] = {}) -> None:
    """Refuse (DataError, a 400) a non-finite number anywhere in the request, and an option of `numbers` out of its
    range. `ranges` states the valid values of options checked elsewhere (the generation options), for the
    message about a non-finite one."""
    found = non_finite(payload, "")
    if found:
        name, value = found
        shown = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
        valid = numbers[name].describe() if name in numbers else ranges.get(name, "a finite number")
        raise DataError(
            f"{name} is {shown}, which is not a JSON number (nor is one too large for a float, such "
            f"as 1e400): {name} must be {valid}"
        )
    for name, number in numbers.items():
        value = payload.get(name)
        if value is not None and not number.allows(value):
            raise DataError(f"{name} must be {number.describe()}, got {value!r}")
