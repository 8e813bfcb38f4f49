"""Generation options are one checked config (`kqv.GenerationConfig`): a bad option is the same one-line error
from Python (`kqv.load(...).generate`), the command line (`kqv generate`, naming the flag) and the explorer's
/api/continue (a 400), which takes the same config within tighter limits (`ServedGeneration`)."""

# ruff: noqa: F811 -- the fixtures imported from test_pretrained_dirs are parameters here

import pytest
from starlette.testclient import TestClient

import kqv
from kqv.errors import ConfigError
from kqv.explore.app import create_app
from kqv.explore.subjects import ServedGeneration
from kqv.nn.generation import GenerationConfig, GenerationLimits
from test_pretrained_dirs import gpt2_dir, kqv_main, tokenizer  # noqa: F401 -- fixtures

BAD = [
    {"max_new_tokens": 0},
    {"temperature": -1.0},
    {"temperature": 1e-300},  # logits / temperature would overflow float32
    {"temperature": 1000.0},
    {"top_k": 0},
    {"top_p": 0.0},
    {"top_p": 1.5},
    {"seed": -1},
    {"seed": 2**63},  # issue 35: a torch overflow traceback before
]


def flags(options):
    return [a for name, value in options.items() for a in (f"--{name.replace('_', '-')}", str(value))]


@pytest.fixture(scope="module")
def explorer(gpt2_dir):
    return TestClient(create_app(gpt2_dir), base_url="http://localhost")


@pytest.mark.parametrize("options", BAD, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_a_bad_option_is_the_same_error_from_python_the_command_line_and_the_explorer(
    options, gpt2_dir, explorer, capsys
):
    with pytest.raises(ConfigError) as raised:
        kqv.load(gpt2_dir).generate("To be", **{"max_new_tokens": 3, **options})
    message = str(raised.value)
    name = next(iter(options))
    assert message.startswith(f"{name} must be ") and "\n" not in message
    with pytest.raises(ConfigError) as made:
        GenerationConfig(**options)
    assert str(made.value) == message  # the config is the one check

    status, out, err = kqv_main(["generate", gpt2_dir, "--prompt", "To be", *flags(options)], capsys)
    flag = f"--{name.replace('_', '-')}"
    assert (status, out, err) == (2, "", f"kqv: error: {flag}{message.removeprefix(name)}\n")

    served = message.replace(f"{GenerationLimits().max_new_tokens:,}", f"{ServedGeneration.limits.max_new_tokens:,}")
    response = explorer.post("/api/continue", json={"text": "To be", **options})
    assert response.status_code == 400 and response.json() == {"error": served}


def test_the_explorer_keeps_a_tighter_cap_on_the_same_config(gpt2_dir, explorer):
    with pytest.raises(ConfigError, match=r"^max_new_tokens must be an integer from 1 to 2,000, got 2001; to go on"):
        ServedGeneration(max_new_tokens=2001)
    assert GenerationConfig(max_new_tokens=2001).max_new_tokens == 2001  # the API and the command line take it
    response = explorer.post("/api/continue", json={"text": "To be", "max_new_tokens": 2001})
    assert response.status_code == 400 and "from 1 to 2,000, got 2001" in response.json()["error"]
    with pytest.raises(ConfigError, match="100,000.*generate again with the output as the prompt"):
        GenerationConfig(max_new_tokens=100_001)


def test_a_config_and_keywords_give_the_same_continuations(gpt2_dir):
    run = kqv.load(gpt2_dir)
    config = GenerationConfig(max_new_tokens=5, temperature=0.7, top_k=20, count=2, seed=3)
    assert run.generate("To be", config) == run.generate("To be", **config.to_dict())
    assert run.generate("To be", config, seed=4) == run.generate("To be", **{**config.to_dict(), "seed": 4})
    with pytest.raises(ConfigError, match=r"unknown GenerationConfig option\(s\) \['temprature'\]"):
        run.generate("To be", temprature=0.5)


def test_an_options_type_is_checked_once_for_every_caller(gpt2_dir, explorer):
    with pytest.raises(ConfigError, match="^top_p must be a finite number, got str 'x'$"):
        kqv.load(gpt2_dir).generate("To be", top_p="x")
    response = explorer.post("/api/continue", json={"text": "To be", "top_p": "x"})
    assert response.status_code == 400 and response.json() == {"error": "top_p must be a finite number, got str 'x'"}
