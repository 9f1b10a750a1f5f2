"""Hostile targets for the report writers a user points at paths (`stragglers generate|analyze`, `simulate --plot
/--jobs-csv`) and real SIGKILLs of the single-file writers: an output never destroys an input or another trace's
meta, and a killed writer leaves the previous file whole."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.hostile_kit import Case, Run, bpe_json, cli
from tests.hostile_writers import _killed, _text

OUT = "outputs"
_TRACE = Path(__file__).resolve().parents[1] / "examples/traces/sia-workloads/saturn/workload-3.csv"


def _gen(name: str, *extra: str) -> Callable[[Path], Run]:
    def act(root: Path) -> Run:
        (root / "t").mkdir(exist_ok=True)  # a file output's directory must exist
        return cli("stragglers", "generate", str(root / "t" / name), "--dp", "2", "--pp", "2", "--steps", "2", *extra)
    return act


def _generated(root: Path) -> None:
    assert _gen("a.parquet")(root).rc == 0


def _reads_back(dp: int) -> Callable[[Path, Run], bool]:
    def check(root: Path, run: Run) -> bool:
        from tasks.stragglers.trace import load_trace

        return load_trace(root / "t" / "a.parquet").meta.dp_size == dp
    return check


def _analyze(flag: str, target: Callable[[Path], Path]) -> Callable[[Path], Run]:
    return lambda root: cli("stragglers", "analyze", str(root / "t" / "a.parquet"), flag, str(target(root)))


def _csv(root: Path) -> Path:
    (root / "w.csv").write_bytes(_TRACE.read_bytes())
    return root / "w.csv"


def _simulate(flag: str, target: Callable[[Path], Path]) -> Callable[[Path], Run]:
    return lambda root: cli("simulate", "--trace", str(_csv(root)), "--policy", "fcfs", flag, str(target(root)))


def _old_tokenizer(root: Path) -> None:
    (root / "mine.json").write_bytes(bpe_json(root / "fixture.json").read_bytes())


def _same_tokenizer(root: Path, run: Run) -> bool:
    return (root / "mine.json").read_bytes() == (root / "fixture.json").read_bytes()


_META = "t/meta-synth-1f1b-0.yaml"
CASES = [
    Case(OUT, "generate over an existing trace", _gen("a.parquet"), ("a.parquet", "--overwrite"),
         keep=("t/a.parquet", _META), setup=_generated),
    Case(OUT, "generate --overwrite replaces the trace", _gen("a.parquet", "--overwrite", "--dp", "4"), _reads_back(4),
         setup=_generated),
    Case(OUT, "generate a second job's trace beside the first", _gen("b.parquet", "--dp", "4"),
         ("describes another trace", "another directory"), keep=("t/a.parquet", _META), setup=_generated),
    Case(OUT, "generate into a checkpoint root", lambda r: [(r / "ck" / "step_00000002").mkdir(parents=True)] and cli(
        "stragglers", "generate", str(r / "ck" / "t.parquet")), ("checkpoint", "another directory")),
    Case(OUT, "analyze --heatmap onto its own trace", _analyze("--heatmap", lambda r: r / "t" / "a.parquet"),
         ("own input", "another path"), keep=("t/a.parquet",), setup=_generated),
    Case(OUT, "analyze --timeline onto the trace's meta", _analyze("--timeline", lambda r: r / _META),
         ("own input", "another path"), keep=(_META,), setup=_generated),
    Case(OUT, "analyze --heatmap onto a directory", _analyze("--heatmap", lambda r: r / "t"), ("is a directory",),
         setup=_generated),
    Case(OUT, "simulate --jobs-csv onto its own trace", _simulate("--jobs-csv", lambda r: r / "w.csv"),
         ("own input", "another path"), keep=("w.csv",), setup=_csv),
    Case(OUT, "simulate --plot onto a directory", _simulate("--plot", lambda r: r), ("is a directory",)),
    Case(OUT, "generate SIGKILLed before its rename leaves the old trace", _killed(
        lambda r: ["stragglers", "generate", str(r / "t" / "a.parquet"), "--overwrite", "--dp", "4"], "os:replace", -1),
        _reads_back(2), keep=("t/a.parquet", _META), setup=_generated),
    Case(OUT, "tokenizer train SIGKILLed before its rename leaves the old file", _killed(
        lambda r: ["tokenizer", "train", _text(r), "--out", str(r / "mine.json"), "--vocab-size", "300",
                   "--overwrite"], "os:replace", -1), _same_tokenizer, keep=("mine.json",), setup=_old_tokenizer),
]


def _two_trainers(root: Path) -> Run:
    """A real `frenzy train` holds a run directory; a second one with another job and checkpoint is pointed at it.
    Before the run-directory lock, the second rewrote job.json and the first trained the second's job."""
    import json
    import subprocess
    import sys
    import time

    common = ["examples/jobs/tiny.yaml", "--run-dir", str(root / "run"), "--device", "cpu", "--json"]
    first = subprocess.Popen([sys.executable, "-m", "cli", "train", *common, "--steps", "12",
                              "--checkpoint-uri", f"file://{root}/ckA"], cwd=_REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    lock, deadline = root / "run" / ".run.lock", time.monotonic() + 60
    while time.monotonic() < deadline and first.poll() is None and \
            not (lock.is_file() and lock.read_text().strip() == str(first.pid)):
        time.sleep(0.05)  # waits for the other process's lock record, not for time
    second = cli("train", *common, "--steps", "4", "--checkpoint-uri", f"file://{root}/ckB")
    out, _ = first.communicate(timeout=300)
    doc = json.loads(out) if first.returncode == 0 else {}
    if doc.get("final_step") != 12 or any("ckA" not in c["uri"] for c in doc.get("checkpoints", [{"uri": ""}])):
        return Run(0, out=f"the first trainer ended with {first.returncode}: {out[:300]}")
    return second


_REPO = Path(__file__).resolve().parents[1]
CASES.append(Case(OUT, "two trainers on one run directory", _two_trainers, ("in use by another trainer", "--run-dir"),
                  timeout_s=400))
