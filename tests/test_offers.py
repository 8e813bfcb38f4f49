"""What a run can do (kqv.jobs.offers): each job's run class implements the capabilities it offers, and nothing
else; one it lacks is refused in one line, with nothing written, by the Python API and the commands alike. And
each job's `Training` is its own, its config changed only by the hooks that return it."""

import ast
import importlib.util
import inspect
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from torch import nn

import kqv
from kqv.cli.main import build_parser, main
from kqv.cli.runs import RUN_COMMANDS
from kqv.data.tokenizers import encode_text, make_tokenizer
from kqv.errors import RunError
from kqv.jobs import JOBS, all_jobs
from kqv.jobs.base import TrainedRun, Training
from kqv.jobs.finetune import FineTuneStart
from kqv.jobs.init import Source
from kqv.jobs.lm import LMJob
from kqv.jobs.lm_corpus import LoadedText
from kqv.jobs.offers import CAPABILITIES
from kqv.jobs.pretrained import OFFERINGS, PretrainedRun
from kqv.nn.config import ModelConfig
from test_api import mt_dir  # noqa: F401  (the module's own tiny MT run)

OFFERS = {  # what each job's runs do, as its documentation says
    "lm": {"generate", "complete", "evaluate", "attention", "export_hf"},
    "mt": {"evaluate", "translate", "attention"},
    "mlm": {"export_hf"},
    "cls": set(),
    "vit": {"evaluate", "attention"},
}
JOBS_DIR = Path(kqv.__file__).parent / "jobs"


def offered(run: object) -> set[str]:
    return {name for name, capability in CAPABILITIES.items() if isinstance(run, capability.protocol)}


def unloaded_run(name: str, where: Path) -> TrainedRun:
    """A run of job `name` as `Job.load` makes one, but of no trained directory (no config, a stand-in model): what it
    offers is its class's."""
    job = JOBS[name]
    return job.run_class(job, None, nn.Linear(2, 2), None, where / "run")


@pytest.mark.parametrize("name", sorted(OFFERS))
def test_each_job_s_run_refuses_what_it_does_not_offer_in_one_line(name, tmp_path):
    run = unloaded_run(name, tmp_path)
    assert offered(run) == OFFERS[name]
    for method in sorted(set(CAPABILITIES) - OFFERS[name]):
        capability = CAPABILITIES[method]
        assert not hasattr(run, method)
        with pytest.raises(RunError) as refused:
            getattr(run, method)("text")
        message = str(refused.value)
        assert message == (
            f"{tmp_path / 'run'} is {JOBS[name].title} run, which cannot {capability.does}; {method} works on "
            f"{capability.where}"
        )
        assert "\n" not in message
    assert list(tmp_path.iterdir()) == []  # nothing written
    with pytest.raises(AttributeError, match="no attribute 'fly'"):
        run.fly  # noqa: B018  (anything else is Python's own AttributeError)


def test_a_run_that_cannot_export_is_refused_in_one_line_writing_nothing(mt_dir, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "hf"
    with pytest.raises(RunError, match=r"is a translation run, which cannot write a Hugging Face directory; export_hf"):
        kqv.export(mt_dir, hf=out)
    assert main(["generate", str(mt_dir), "--prompt", "eins"]) == 2
    assert main(["export", str(mt_dir), "--hf", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and err.count("kqv: error: ") == 2, err
    assert not out.exists()


def test_the_commands_refuse_a_loaded_run_that_lacks_their_capability_before_their_entry_runs(tmp_path, monkeypatch):
    """A Hugging Face directory takes a job's entry; `require` refuses it before the entry starts."""
    bare = PretrainedRun(nn.Linear(2, 2), None, tmp_path / "dir", "SomeModel")
    monkeypatch.setattr("kqv.api.run_job", lambda path: None)  # a Hugging Face directory
    monkeypatch.setattr("kqv.api.load", lambda path, device: bare)
    entered = []
    command = RUN_COMMANDS["generate"]
    monkeypatch.setitem(command.by_job, "lm", replace(command.by_job["lm"], run=lambda run, args: entered.append(run)))
    args = build_parser().parse_args(["generate", str(tmp_path / "dir"), "--prompt", "hi"])
    with pytest.raises(RunError, match=r"dir is a Hugging Face SomeModel directory, which cannot generate text"):
        command.run(args)
    assert entered == []


def test_each_capability_names_the_runs_and_directories_that_offer_it():
    def listed(names: list[str]) -> str:
        return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)

    for method, capability in CAPABILITIES.items():
        jobs = [name for name, job in sorted(all_jobs().items()) if issubclass(job.run_class, capability.protocol)]
        directories = [kind.names for kind, _ in OFFERINGS if issubclass(kind, capability.protocol)]
        assert capability.where == f"{listed(jobs)} runs and {listed(directories)} directories", method


def test_each_run_command_serves_exactly_the_jobs_whose_runs_offer_its_capability():
    for name, command in RUN_COMMANDS.items():
        offering = {job for job, j in all_jobs().items() if issubclass(j.run_class, command.capability)}
        assert set(command.by_job) == offering, name


# -- no stubs: a run class has the methods it offers, and no others --------------------------------------------------


def stubs(cls: type) -> list[str]:
    """The methods of `cls` and its bases (up to `Offering`) whose body, past its docstring, only raises: the stub of
    an operation the class does not have; and any protocol method it would inherit from the protocol's `...`."""
    found = []
    for klass in cls.__mro__:
        if klass.__module__ not in ("builtins", "typing") and not getattr(klass, "_is_protocol", False):
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
            for node in ast.walk(tree.body[0]):
                if isinstance(node, ast.FunctionDef) and node.name != "__getattr__":
                    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                    if len(body) == 1 and isinstance(body[0], ast.Raise):
                        found.append(f"{klass.__name__}.{node.name}")
    for method, capability in CAPABILITIES.items():
        if issubclass(cls, capability.protocol) and getattr(cls, method) is getattr(capability.protocol, method):
            found.append(f"{cls.__name__}.{method} (the protocol's own body)")
    return found


def run_classes() -> list[type]:
    return [job.run_class for _, job in sorted(all_jobs().items())] + [PretrainedRun] + [k for k, _ in OFFERINGS]


def test_no_run_class_has_a_stub_method():
    assert {cls.__name__: stubs(cls) for cls in run_classes()} == {cls.__name__: [] for cls in run_classes()}


def test_the_stub_scan_finds_a_planted_stub_and_an_unimplemented_protocol(tmp_path, monkeypatch):
    (tmp_path / "planted_run.py").write_text(
        textwrap.dedent('''
        from dataclasses import dataclass

        from kqv.jobs.base import TrainedRun
        from kqv.jobs.offers import Translates


        @dataclass(repr=False)
        class PlantedRun(TrainedRun, Translates):
            def generate(self, *args, **options):
                """Not offered."""
                raise NotImplementedError
        ''')
    )
    spec = importlib.util.spec_from_file_location("planted_run", tmp_path / "planted_run.py")
    planted = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "planted_run", planted)  # where `inspect` finds its source
    spec.loader.exec_module(planted)  # a module of its own, imported by its path: no edit of sys.path
    PlantedRun = planted.PlantedRun  # noqa: N806

    assert stubs(PlantedRun) == ["PlantedRun.generate", "PlantedRun.translate (the protocol's own body)"]


# -- Training: each job's own, its config changed by the hooks that return it --------------------------------------


def test_the_lm_s_settled_config_is_returned_and_the_given_one_left_as_it_was(tmp_path):
    """A fine-tune of a source with 16 positions: `settled` returns a copy with that context and the sample prompt
    decided from the data; `training.config` is left as given, for `Job.train` to replace."""
    text = "Hello there world, and more.\n" * 4
    tokenizer = make_tokenizer("char", text, 0)
    ids = encode_text(tokenizer, text)
    data = {"path": str(tmp_path / "text.txt"), "init": "source"}
    config = LMJob.config_class.from_dict({"data": data, "train": {"steps": 2, "batch_size": 2}})
    source = Source(tmp_path, "kqv run", ModelConfig(vocab_size=8, d_model=8, n_heads=2, n_layers=1, max_len=16), "")
    corpus = LoadedText(tokenizer, ids, ids, (len(text), len(text)), config.data)
    training = Training(config, None, corpus, handed=FineTuneStart(source=source))  # no run: not read
    settled = JOBS["lm"].settled(training)
    assert (settled.data.context, settled.sample.prompt) == (16, "Hello there world,")
    assert training.config is config and (config.data.context, config.sample.prompt) != (16, "Hello there world,")


def assignments_to_training_config() -> list[str]:
    """Every `training.config = ...` in the jobs: a hook that changes the config in place."""
    found = []
    for path in sorted(JOBS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in (t for assigned in targets for t in ast.walk(assigned)):
                if ast.unparse(target) == "training.config" and path.name != "base.py":
                    found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_job_hook_writes_the_training_s_config():
    assert assignments_to_training_config() == []


def test_each_job_s_hooks_take_its_own_training():
    """No hook of a job takes the bare `Training` (every field Any): each names its job's, `LMTraining`, ..."""
    bare = []
    for name, job in sorted(all_jobs().items()):
        for method, function in inspect.getmembers(type(job), inspect.isfunction):
            annotation = inspect.signature(function).parameters.get("training")
            if annotation is not None and function.__module__ == type(job).__module__:
                if annotation.annotation in ("Training", Training):
                    bare.append(f"{name}.{method}")
    assert bare == []
