#!/usr/bin/env python
"""Crash test: a language-model run stopped at 20 random moments and resumed each time ends with the same weights,
bit for bit, as the same run left alone, whether it is stopped with `kill -9` (SIGKILL), SIGTERM (what `timeout`,
`kill` and cluster schedulers send first) or Ctrl-C (SIGINT).

The run is `kqv train lm` at a tiny size (2 layers, d_model 32, dropout 0.1 so the saved generator states matter,
fp32) on the first 100,000 characters of Shakespeare, step-based, with a checkpoint every 5 updates so that
checkpoint writes take about half of the training time. The script

1. trains it once uninterrupted (the reference);
2. trains it again, stopping the process with `kill -9` (SIGKILL) at `--kills` moments drawn from a seeded
   generator and restarting it each time with `kqv train lm ... --resume`, then lets the last resume finish;
3. does the same with SIGTERM at `--terms` moments and with SIGINT (what Ctrl-C sends) at `--interrupts` moments;
4. compares the final `checkpoint/model.safetensors` (every tensor, `torch.equal`) and the optimizer state of
   each with the reference's.

A moment is one of: `time` (a uniform delay after the process starts: start-up, training, evaluation or a
checkpoint write, wherever it lands), `write` (a uniform 0-30 ms after the k-th checkpoint write of this process
began, i.e. its `.checkpoint-tmp-*` directory appeared: inside the write or just after it) and `swap` (as soon as
`checkpoint.old` appears, between the two renames of a checkpoint swap or just after). For each stop the table
shows what was on disk at that moment, the step of the checkpoint left behind (read and SHA-256-verified with
`kqv.train.checkpoints.read_checkpoint`) and whether the next `--resume` continued. "recovered" counts the stops
after which the process ended as that signal must end it (SIGKILL: killed; SIGTERM: exit status 143 after saving
the last completed update; SIGINT: 130 likewise), the run directory held a verified checkpoint (or none yet) and
the resume went on without an error. A SIGTERM or SIGINT that lands before the interpreter reaches kqv's first
line (its first few tens of milliseconds) kills the process by the signal itself, -15 or -2, before anything was
written: that counts as recovered too, and the table shows it; so does one that lands after the run's last file was
written (kqv then exits 0, saying the run is complete). None of this depends on the machine's load except where the
moments land.

    OMP_NUM_THREADS=1 python benchmarks/crash_resume.py                     # 20 stops per signal, ~5-8 minutes
    OMP_NUM_THREADS=1 python benchmarks/crash_resume.py --kills 3 --terms 2 --interrupts 1 --steps 100 --output c.json

`tests/test_crash_resume.py` runs a few stops of each kind at a smaller size.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kqv_lab import benchmarking as harness

RESULTS = harness.results_path("crash_resume")
CONFIG = """\
[data]
tokenizer = "char"
context = 32
[model]
d_model = 32
n_heads = 2
n_layers = 2
d_ff = 64
dropout = 0.1
[train]
steps = {steps}
batch_size = 8
lr = 1e-3
warmup_steps = 10
precision = "fp32"
eval_every = 50
eval_batches = 2
checkpoint_every = {checkpoint_every}
log_every = 10
[sample]
count = 1
max_new_tokens = 20
"""
CORPUS_CHARS = 100_000
TMP_PREFIX, OLD = ".checkpoint-tmp-", "checkpoint.old"


def prepare(work: Path, steps: int, checkpoint_every: int) -> list[str]:
    """Write the run config and the corpus into `work`; the `kqv train lm` arguments that use them."""
    from kqv.data import load_text

    work.mkdir(parents=True, exist_ok=True)
    (work / "run.toml").write_text(CONFIG.format(steps=steps, checkpoint_every=checkpoint_every))
    (work / "corpus.txt").write_text(load_text()[:CORPUS_CHARS])
    return ["train", "lm", "--config", str(work / "run.toml"), "--data", str(work / "corpus.txt"), "--quiet"]


def launch(arguments: list[str]) -> subprocess.Popen:
    """`kqv ARGUMENTS` in a new process (one thread: its arithmetic is then the same in every process). Ctrl-C is
    restored to its default in the child: a shell starts background jobs (`cmd &`, nohup, some CI runners) with
    SIGINT ignored, which the child would inherit, and Python then never raises KeyboardInterrupt."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(harness.ROOT / "src")}
    return subprocess.Popen(
        [sys.executable, "-m", "kqv.cli", *arguments],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def draw_moments(count: int, rng: random.Random) -> list[dict]:
    """`count` moments: 40% `time`, 40% `write`, 20% `swap`, shuffled."""
    kinds = ["time"] * (count * 2 // 5) + ["swap"] * (count // 5)
    kinds += ["write"] * (count - len(kinds))
    rng.shuffle(kinds)
    moments = []
    for kind in kinds:
        if kind == "time":
            moments.append({"kind": "time", "after_s": round(rng.uniform(0.0, 3.0), 3)})
        else:
            moments.append(
                {
                    "kind": kind,
                    "write": rng.randint(1, 8),
                    "delay_ms": round(rng.uniform(0, 30), 1) if kind == "write" else 0.0,
                }
            )
    return moments


def wait_for(moment: dict, process: subprocess.Popen, run_dir: Path) -> bool:
    """Block until `moment` in this process's life; False if the process ended first."""
    started = time.monotonic()
    if moment["kind"] == "time":
        while time.monotonic() - started < moment["after_s"]:
            if process.poll() is not None:
                return False
            time.sleep(0.001)
        return True
    stale = {name for name in _listdir(run_dir) if name.startswith(TMP_PREFIX)}  # left by the stopped process
    seen: set[str] = set()
    while len(seen) < moment["write"]:  # the k-th checkpoint write of this process
        if process.poll() is not None:
            return False
        seen.update(name for name in _listdir(run_dir) if name.startswith(TMP_PREFIX) and name not in stale)
    if moment["kind"] == "write":
        time.sleep(moment["delay_ms"] / 1000)
        return True
    deadline = time.monotonic() + 2.0
    while OLD not in _listdir(run_dir) and time.monotonic() < deadline:  # swap: the old checkpoint moved aside
        if process.poll() is not None:
            return False
    return True


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def on_disk(run_dir: Path) -> str:
    """What a stop left in the run directory: a half-written checkpoint, a swap cut short, or nothing unusual."""
    names = _listdir(run_dir)
    parts = []
    for name in names:
        if name.startswith(TMP_PREFIX):
            parts.append(f"tmp[{','.join(sorted(n.split('.')[0] for n in _listdir(run_dir / name))) or 'empty'}]")
    if OLD in names:
        parts.append("checkpoint.old" + ("" if "checkpoint" in names else " only"))
    if not names:
        parts.append("no run directory yet")
    elif "checkpoint" not in names and OLD not in names:
        parts.append("no checkpoint yet")
    return " + ".join(parts) or "-"


def verified_step(run_dir: Path) -> int | None:
    """The step of the checkpoint in run_dir, read and verified against its recorded SHA-256 (None: none yet)."""
    from kqv.train import has_checkpoint, read_checkpoint

    if not has_checkpoint(run_dir):
        return None
    checkpoint = read_checkpoint(run_dir)
    checkpoint.close()
    return checkpoint.step


def stopped_run(base: list[str], run_dir: Path, moments: list[dict], stop: signal.Signals) -> list[dict]:
    """Train into run_dir, stopping the process with `stop` (or the moment's own "signal") at each moment and
    resuming; then finish it. A stop is recovered when the process ended as the signal must end it (`_expected`),
    the run directory then holds a verified checkpoint (or none yet) and the next `--resume` goes on: it is
    stopped at the next moment or finishes, rather than failing. A stop that is not recovered is recorded (with
    the end of the process's stderr) and the run goes on; only a last resume that fails to finish raises."""
    rows: list[dict] = []
    for moment in [*moments, None]:
        process = launch([*base, "--out", str(run_dir), *(["--resume"] if rows else [])])
        landed = moment is not None and wait_for(moment, process, run_dir)
        signal_ = signal.Signals[moment.get("signal", stop.name)] if moment is not None else stop
        if landed:
            process.send_signal(signal_)
        status = process.wait()
        error = process.stderr.read().strip()
        early = landed and status not in _expected(signal_) and in_python_start_up(error)
        late = landed and status == 0 and "after its last file was written" in error  # the run was complete
        ok = status in (_expected(signal_) if landed else {0}) or early or late
        if rows:
            rows[-1]["recovered"] = rows[-1]["recovered"] and ok
            if not ok:
                rows[-1]["resume_error"] = f"exit status {status}: {error[-400:]}"
        if moment is None:
            if not ok:
                raise RuntimeError(f"the last resume failed with exit status {status}: {error}")
            return rows
        rows.append(
            {
                **moment,
                "signal": signal_.name,
                "on_disk": on_disk(run_dir),
                "exit_status": status,
                "checkpoint_step": verified_step(run_dir),
                "recovered": ok,
                **({"in_python_start_up": True} if early else {}),
                **({} if ok else {"error": error[-400:] or "(no message)"}),
            }
        )
    return rows


def in_python_start_up(stderr: str) -> bool:
    """Whether a Ctrl-C landed while the interpreter itself was starting, before any kqv code ran: Python's own
    handler then raises KeyboardInterrupt inside site-packages' start-up files (a `.pth` importing certifi, say),
    exit status 1 with Python's traceback. No code of kqv's can run earlier, so this counts as the stop landing
    before kqv's first line; the run directory is checked all the same."""
    return stderr.rstrip().endswith("KeyboardInterrupt") and "kqv" not in stderr


def _expected(stop: signal.Signals) -> set[int]:
    """Exit statuses after `stop`: kqv's own (128 + the signal) for the two it handles, or death by the signal
    itself when it lands before the interpreter runs kqv's first line (`kqv.signals.guard_startup`)."""
    return {-stop} if stop == signal.SIGKILL else {128 + stop, -stop}


def same_final_state(run_dir: Path, reference: Path) -> dict[str, bool]:
    """Whether the final weights (every tensor) and optimizer state equal the reference's bit for bit."""
    import torch
    from safetensors.torch import load_file

    weights, expected = (load_file(d / "checkpoint" / "model.safetensors") for d in (run_dir, reference))
    optimizer, expected_optimizer = (
        torch.load(d / "checkpoint" / "optimizer.pt", weights_only=True) for d in (run_dir, reference)
    )
    return {
        "weights": weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in weights),
        "optimizer": _equal(optimizer, expected_optimizer),
        "steps": _step(run_dir) == _step(reference),
    }


def _step(run_dir: Path) -> int:
    return json.loads((run_dir / "checkpoint" / "state.json").read_text())["step"]


def _equal(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


def start_reference(base: list[str], run_dir: Path) -> subprocess.Popen:
    """Start the uninterrupted run (it may train while the stopped runs do: nothing here depends on timing)."""
    return launch([*base, "--out", str(run_dir)])


def finish_reference(process: subprocess.Popen) -> None:
    if process.wait() != 0:
        raise RuntimeError(f"the reference run failed: {process.stderr.read()}")


def print_table(rows: list[dict]) -> None:
    print(
        f"{'#':>3} {'signal':<8} {'moment':<26} {'on disk when stopped':<44} {'exit':>5} {'ckpt step':>9} "
        f"{'resumed':>7}"
    )
    for i, row in enumerate(rows, 1):
        moment = (
            f"{row['after_s']:.3f} s after start"
            if row["kind"] == "time"
            else f"write {row['write']} + {row['delay_ms']} ms"
            if row["kind"] == "write"
            else f"swap after write {row['write']}"
        )
        step = "none" if row["checkpoint_step"] is None else row["checkpoint_step"]
        print(
            f"{i:>3} {row['signal']:<8} {moment:<26} {row['on_disk'][:44]:<44} {row['exit_status']:>5} "
            f"{step!s:>9} {'yes' if row['recovered'] else 'NO':>7}"
        )


def main(argv: list[str] | None = None) -> dict:
    parser = harness.arguments(harness.summary(__doc__), output=RESULTS)
    parser.add_argument("--kills", type=int, default=20, help="kill -9 moments (default 20)")
    parser.add_argument("--terms", type=int, default=20, help="SIGTERM moments (default 20)")
    parser.add_argument("--interrupts", type=int, default=20, help="SIGINT (Ctrl-C) moments (default 20)")
    parser.add_argument("--steps", type=int, default=1500, help="updates of the run (default 1500)")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="seed of the moments")
    parser.add_argument("--work", type=Path, help="working directory (default: a temporary one, deleted)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kqv-crash-") as tmp:
        work = args.work or Path(tmp)
        base = prepare(work, args.steps, args.checkpoint_every)
        rng = random.Random(args.seed)
        started = time.perf_counter()
        finish_reference(start_reference(base, work / "reference"))
        reference_seconds = time.perf_counter() - started
        results = {}
        stops = (
            ("kill", signal.SIGKILL, args.kills),
            ("term", signal.SIGTERM, args.terms),
            ("interrupt", signal.SIGINT, args.interrupts),
        )
        for name, stop, count in stops:
            if count:
                rows = stopped_run(base, work / name, draw_moments(count, rng), stop)
                results[name] = {
                    "rows": rows,
                    "recovered": sum(r["recovered"] for r in rows),
                    "stops": len(rows),
                    "identical": same_final_state(work / name, work / "reference"),
                }
    summary = {
        "benchmark": "crash_resume",
        "steps": args.steps,
        "checkpoint_every": args.checkpoint_every,
        "seed": args.seed,
        "reference_seconds": round(reference_seconds, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "loaded_machine_timing": True,
        "command": "OMP_NUM_THREADS=1 python benchmarks/crash_resume.py " + " ".join(argv or sys.argv[1:]),
        **results,
    }
    failed = [name for name, r in results.items() if r["recovered"] < r["stops"] or not all(r["identical"].values())]
    summary["all_recovered_bit_identical"] = not failed
    for name, result in results.items():
        print(f"\n{name}: {result['stops']} stops with {result['rows'][0]['signal']}")
        print_table(result["rows"])
        identical = result["identical"]
        print(
            f"{name}: {result['recovered']}/{result['stops']} recovered; final weights bit-identical to the "
            f"uninterrupted run: {'yes' if identical['weights'] else 'NO'}; optimizer state: "
            f"{'yes' if identical['optimizer'] else 'NO'}"
        )
    harness.write_record(args.output, summary)
    print(f"wrote {args.output}")
    for name in failed:
        print(f"{name}: NOT every stop recovered bit-identically", file=sys.stderr)
        for row in results[name]["rows"]:
            for key in ("error", "resume_error"):
                if key in row:
                    print(f"  {row['signal']} {row['kind']}: {key}: {row[key]}", file=sys.stderr)
    return summary


if __name__ == "__main__":
    sys.exit(0 if main()["all_recovered_bit_identical"] else 1)
