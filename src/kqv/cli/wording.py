"""The command line's words for what kqv's messages name in Python's words (`kqv.errors.option`): each option and
remedy as a Python caller would write it, and as a command-line user types it. `kqv.cli.main` runs every command
with this table, so the layers below the command line never spell a flag (`tests/test_error_wording.py` finds
every `option` wording of src/ here, and no flag outside kqv.cli)."""

from __future__ import annotations

GENERATION = ("max_new_tokens", "temperature", "top_k", "top_p", "count", "seed", "use_cache", "dtype")

WORDS: dict[str, str] = {
    # options, by their keyword argument
    **{name: f"--{name.replace('_', '-')}" for name in GENERATION},
    "prompt": "--prompt",
    "prompt='ROMEO:'": "--prompt 'ROMEO:'",
    "text": "--text",
    "sentences": "the text",
    "max_tokens": "--max-tokens",
    "max_sentences": "--max-sentences",
    "beam_size": "--beam",
    "length_penalty": "--length-penalty",
    "images": "--images",
    "src": "--src",
    "tgt": "--tgt",
    "src and ref": "--src and --ref",
    "seeds": "--seeds",
    "out": "--out",
    "hf": "--hf",
    "the run directory": "--out",
    "data=PATH": "--data FILE",
    "kqv.prepare(TEXT, {path!r})": "`kqv prepare TEXT --out {path}`",
    "kqv.prepare(TEXT, DIR, tokenizer={source!r})": "`kqv prepare TEXT --tokenizer {source} --out DIR`",
    "data.sources=[TEXT, {path}]": "--data TEXT --data {path}",
    "init=": "--init ",
    "init=DIR": "--init DIR",
    "init=SOURCE": "--init SOURCE",
    "steps=": "--steps",
    # a run's inputs, by their config key (a run's output must not overwrite them)
    "data.init=": "--init ",
    "data.path=": "--data ",
    "data.sources=": "--data ",
    "data.tgt_path=": "data.tgt_path=",
    "the config's {name}": '--set {name}="..."',
    # remedies
    "overwrite=True": "--overwrite",
    "if_exists='overwrite'": "`--overwrite`",
    "if_exists='resume'": "`--resume`",
    "Trainer.resume(...)": "`--resume`",
    "if_exists='resume' or Trainer.resume(...)": "`--resume`",
    "no config": "--resume without --config",
    "; resume without these overrides, or train a new run with overwrite=True or another out": (
        "; resume without these --set values, or train a new run with --overwrite or another --out"
    ),
    "the {task} job's train(config, run_dir)": "`kqv train {task} --out {run_dir}`",
    "kqv.export({path!r}, hf=DIR, merge=True)": "`kqv export {path} --hf DIR --merge`",
    "pass merge=True": "add --merge",
    "device='cpu'": "--device cpu",
    "a model on the CPU": "--device cpu",
    "dtype=torch.bfloat16": "--dtype bf16",
}
