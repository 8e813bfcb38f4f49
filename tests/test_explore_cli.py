"""`kqv explore` from the command line: serving (loopback unless --host says otherwise), the HTML export, errors."""

from __future__ import annotations

import json
import socket

import pytest

pytest.importorskip("uvicorn")
from explore_runs import train_run  # noqa: E402
from kqv.cli.main import main  # noqa: E402


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    return train_run("lm", tmp_path_factory.mktemp("explore-cli"))


@pytest.fixture
def served(monkeypatch):
    """uvicorn.run replaced by a recorder: what `kqv explore` would serve, without listening."""
    import uvicorn

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: calls.append(options))
    return calls


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_explore_listens_on_loopback_by_default(lm_run, served, capsys):
    port = free_port()
    assert main(["explore", str(lm_run), "--port", str(port)]) == 0
    assert served == [{"host": "127.0.0.1", "port": port, "log_level": "warning"}]
    out = capsys.readouterr().out
    assert f"http://localhost:{port}/" in out and "other machines" not in out


def test_another_host_is_served_with_a_warning(lm_run, served, capsys):
    assert main(["explore", str(lm_run), "--host", "0.0.0.0", "--port", str(free_port())]) == 0
    assert served[0]["host"] == "0.0.0.0"
    assert "other machines can reach" in capsys.readouterr().out


def test_a_busy_port_is_an_error_before_serving(lm_run, served, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert main(["explore", str(lm_run), "--port", str(busy.getsockname()[1])]) == 2
    assert not served and "pick another with --port" in capsys.readouterr().err


def test_a_missing_run_is_an_error_before_serving(tmp_path, served, capsys):
    assert main(["explore", str(tmp_path / "nowhere")]) == 2
    assert not served and "no run directory" in capsys.readouterr().err


def test_html_writes_one_self_contained_file(lm_run, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["explore", str(lm_run), "--html", str(out), "--text", "To be"]) == 0
    page = out.read_text()
    assert "/static/" not in page and "<style>" in page
    data = json.loads(page.split('type="application/json">')[1].split("</script>")[0])
    assert data["analysis"]["tokens"] == list("To be") and data["info"]["task"] == "lm"
    assert f"wrote {out}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--html", "x.html"], "give it with --text"),
        (["--text", "To be"], "--text goes with --html"),
        (["--html", "x.html", "--text", ""], "text is empty"),
    ],
)
def test_html_options_that_do_not_fit_are_errors(lm_run, tmp_path, served, capsys, argv, message):
    assert main(["explore", str(lm_run), *argv]) == 2
    assert message in capsys.readouterr().err and not served


def test_help_describes_every_option_and_the_length_limit(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["explore", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--port", "--host", "--open", "--max-tokens", "--html", "--text", "--beam"):
        assert option in text
    assert "default 8765" in text and "default 127.0.0.1" in text and "warning" in text
    assert "default: the model's context" in text and "at most 1024" in text  # was 256 before issue 29
    assert "refused with a message" in text and "max_len" in text
