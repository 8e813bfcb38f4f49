"""Runs the README's tour for tests/test_readme_tour.py in one process (kqv and torch imported once, not once a
line): `python tour_worker.py LINES_JSON` in the directory the tour runs in, each line a list of words.

`kqv ARGS` is the `kqv` script's own entry point, `kqv.cli.main(ARGS)`; `python -c CODE` executes CODE as a fresh
`__main__`. `kqv explore RUN --open` runs as written up to the network: instead of listening on its port (which a
test running beside this one may hold) the app it built answers `/` in-process, and the browser it opens is
recorded, not started. The worker stops at the first line that fails, printing `TOUR FAILED: LINE`; each line
that works prints `TOUR OK: LINE (SECONDS s, CPU SECONDS s)`."""

from __future__ import annotations

import json
import shlex
import sys
import time
from typing import Any

OPENED: list[str] = []  # the addresses `--open` handed to the browser


def stand_in_for_the_network() -> None:
    """`kqv explore` serves its app to one in-process request and opens no browser (see the module's docstring)."""
    import webbrowser

    import uvicorn

    from kqv.explore import app as explore_app

    def answer_once(app: Any, host: str, port: int, **options: Any) -> None:
        from starlette.testclient import TestClient

        with TestClient(app) as client:
            page = client.get("/")
        assert page.status_code == 200 and "<html" in page.text.lower(), f"the explorer's page: {page.status_code}"

    uvicorn.run = answer_once
    explore_app.check_port_free = lambda host, port: None
    webbrowser.open = lambda url, *args, **options: OPENED.append(url) or True


def run_line(words: list[str]) -> int:
    """The exit status of one line of the tour."""
    if words[0] == "kqv":
        from kqv.cli import main

        try:
            return main(words[1:])
        except SystemExit as exit:  # argparse's refusals
            return exit.code if isinstance(exit.code, int) else 2
    if words[:2] == ["python", "-c"] and len(words) == 3:
        exec(compile(words[2], "<string>", "exec"), {"__name__": "__main__"})
        return 0
    raise AssertionError(f"the tour test runs kqv and python -c lines only, not {shlex.join(words)}")


def main(lines: list[list[str]]) -> int:
    stand_in_for_the_network()
    for words in lines:
        line, start, cpu = shlex.join(words), time.monotonic(), time.process_time()
        if run_line(words) != 0:
            print(f"TOUR FAILED: {line}", flush=True)
            return 1
        seconds, cpu = time.monotonic() - start, time.process_time() - cpu
        print(f"TOUR OK: {line} ({seconds:.1f} s, CPU {cpu:.1f} s)", flush=True)
    if any(words[:2] == ["kqv", "explore"] and "--open" in words for words in lines):
        time.sleep(1.5)  # serve() opens the browser from a 1-second timer
        if not OPENED:
            print("TOUR FAILED: kqv explore --open opened no browser", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
