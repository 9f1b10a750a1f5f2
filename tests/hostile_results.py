"""Issue 44's other families: results are never replaced in place (evaluate, simulate, stragglers analyze), flags
mean what they say (`--from-scratch`, a mistyped `--ledger`), nonsense is not accepted (an empty corpus, more
examples than a dataset holds, a cluster of no nodes, a manifest that points out of its checkpoint), and errors of
the machine are named (a full disk, a read-only directory, a closed stdout)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.hostile_kit import Case, Run, checkpoint_root, cli
from tests.hostile_writers import _KILL_AFTER, _locked

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "examples/jobs/tiny.yaml")
RES, FLAGS, NONSENSE, ENV = "results", "flags", "nonsense", "environment"
SUITE = ("name: s\nmodel_load_s: {remote: 1.0, shm: 1.0}\ndatasets:\n"
         "  - {name: heldout-loss, examples: 8, mode: ppl, infer_s_per_example: 0.004}\n")


def _evaluate(step: int, *extra: str) -> Callable[[Path], list[str]]:
    def argv(root: Path) -> list[str]:
        if not (root / "ck").exists():
            checkpoint_root(root / "ck")
            (root / "s.yaml").write_text(SUITE)
        return ["evaluate", str(root / "ck" / f"step_{step:08d}"), "--suite", str(root / "s.yaml"), "--out-dir",
                str(root / "out"), "--history-dir", str(root / "evals"), "--no-learn", *extra]
    return argv


def _evaluated_step_2(root: Path) -> None:
    assert cli(*_evaluate(2)(root)).rc == 0


def _result_step(step: int) -> Callable[[Path, Run], bool]:
    def check(root: Path, run: Run) -> bool:
        doc = json.loads((root / "out" / "result.json").read_text())
        return doc["step"] == step and doc["out_dir"] == str(root / "out") and not list(root.glob(".out.tmp-*"))
    return check


def _killed_before_swap(root: Path) -> Run:
    """`frenzy evaluate --overwrite` SIGKILLed after the new results are complete, right before they replace the old."""
    argv = _evaluate(4, "--overwrite")(root)
    p = subprocess.run([sys.executable, "-c", _KILL_AFTER, "tasks.outdir", "_swap", "-1", *argv], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    return Run(0)


def _old_results_whole(root: Path, run: Run) -> bool:
    return json.loads((root / "out" / "result.json").read_text())["step"] == 2


def _with(name: str, text: str, *argv: str) -> Callable[[Path], Run]:
    """Write `text` to `name` in the case directory, then run `frenzy ARGV` ({} in an argument: that file)."""
    def act(root: Path) -> Run:
        (root / name).write_text(text)
        return cli(*(a.replace("{}", str(root / name)) for a in argv))
    return act


def _existing(name: str) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"an earlier result")
    return make


def _trace(root: Path) -> str:
    (root / "t").mkdir(exist_ok=True)
    assert cli("stragglers", "generate", str(root / "t" / "a.parquet"), "--dp", "2", "--pp", "2", "--steps", "2").rc == 0
    return str(root / "t" / "a.parquet")


def _checkpoints(root: Path) -> None:
    checkpoint_root(root / "ck")


def _train(*flags: str) -> Callable[[Path], Run]:
    def act(root: Path) -> Run:
        return cli("train", TINY, "--steps", "2", "--checkpoint-uri", f"file://{root / 'ck'}", "--run-dir",
                   str(root / "run"), "--device", "cpu", *flags)
    return act


def _nan_manifests(root: Path) -> None:
    """Steps 2 and 4 whose manifests read `{"step": NaN}`: present, but not a checkpoint anyone can read."""
    checkpoint_root(root / "ck")
    for m in (root / "ck").glob("step_*/manifest.json"):
        m.write_text('{"step": NaN}')


def _step_loop(root: Path) -> None:
    checkpoint_root(root / "ck")
    os.symlink(root / "ck" / "step_00000006", root / "ck" / "step_00000008")
    os.symlink(root / "ck" / "step_00000008", root / "ck" / "step_00000006")


def _lists_the_loop(root: Path, run: Run) -> bool:
    rows = {r["step"]: r for r in json.loads(run.out)["steps"]}
    return sorted(rows) == [2, 4, 6, 8] and "symlink loop" in rows[8]["problem"] and rows[4]["committed"]


def _trained_from_zero(root: Path, run: Run) -> bool:
    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    doc = json.loads((root / "run" / "result.json").read_text())
    return doc["resumed_from_step"] is None and ck.list_steps(Storage(str(root / "ck"))) == [2]


def _not_created(act: Callable[[Path], Run], path: str) -> Callable[[Path], Run]:
    """`act`, counted silent wrong (exit 0) if it created `path` (a mistyped path must never be made)."""
    def run(root: Path) -> Run:
        r = act(root)
        return Run(0, r.out, r.err) if os.path.lexists(root / path) else r
    return run


def _tampered(root: Path) -> None:
    ck = checkpoint_root(root / "ck")
    m = json.loads((ck / "step_00000004" / "manifest.json").read_text())
    m["shards"][0]["key"] = "../../../../etc/hostname"
    (ck / "step_00000004" / "manifest.json").write_text(json.dumps(m))


def _lists_the_tampered_step(root: Path, run: Run) -> bool:
    rows = {r["step"]: r for r in json.loads(run.out)["steps"]}
    return rows[2]["committed"] and "not a file of this step" in (rows[4]["problem"] or "")


def _exports_step_2(root: Path, run: Run) -> bool:
    return "exported step 2" in run.out


def _empty_corpus(root: Path) -> str:
    (root / "c").mkdir()
    for n in ("a.txt", "b.txt"):
        (root / "c" / n).write_text("")
    return str(root / "c")


def _unshare(script: str, root: Path) -> Run:
    """`script` in a private mount namespace (tmpfs and bind mounts of our own), with $PY the interpreter."""
    cmd = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PY": sys.executable, "FRENZY_HOME": str(root / "home")}
    p = subprocess.run([*cmd, "sh", "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    rc = int(p.stdout.rsplit("rc=", 1)[1].split()[0]) if "rc=" in p.stdout else p.returncode
    return Run(rc, p.stdout, p.stderr)


def _full_disk(root: Path) -> Run:
    (root / "corpus.txt").write_text("the quick brown fox\n" * 20000)
    (root / "mnt").mkdir()
    return _unshare("mount -t tmpfs -o size=96k tmpfs mnt\n$PY -m cli data prepare corpus.txt --out mnt/shards "
                    "--shard-tokens 1024; echo rc=$?", root)


def _history_full(root: Path) -> Run:
    """`frenzy evaluate` whose --history-dir is on a full disk: refused, and its --out-dir never put in place."""
    argv = _evaluate(2)(root)
    argv[argv.index("--history-dir") + 1] = "full/h"
    (root / "full").mkdir()
    run = _unshare("mount -t tmpfs -o size=16k tmpfs full\nhead -c 1M /dev/zero > full/fill 2>/dev/null\n"
                   f"$PY -m cli {shlex.join(argv)}; echo rc=$?", root)
    return Run(0 if os.path.lexists(root / "out") else run.rc, run.out, run.err)  # results left behind: wrong


def _read_only(root: Path) -> Run:
    (root / "ro").mkdir()
    return _unshare("mount --bind -o ro ro ro\n$PY -m cli stragglers generate ro/t.parquet --dp 2 --pp 2 --steps 2; "
                    "echo rc=$?", root)


def _file_size_limit(root: Path) -> Run:
    """`data prepare` under `ulimit -f 256` (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails with EFBIG)."""
    import resource

    (root / "c.txt").write_text("hello world, again\n" * 60000)
    env = {**os.environ, "PYTHONPATH": str(REPO), "FRENZY_HOME": str(root / "home")}
    p = subprocess.run([sys.executable, "-m", "cli", "data", "prepare", "c.txt", "--out", "prep"], cwd=root, env=env,
                       capture_output=True, text=True, timeout=300,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10)))
    return Run(0 if os.path.lexists(root / "prep") else p.returncode, p.stdout, p.stderr)  # a partial target: wrong


def _read_only_run_dir(root: Path) -> Run:
    (root / "ro").mkdir()
    (root / "job.yaml").write_text(Path(TINY).read_text())
    return _unshare("mount --bind -o ro ro ro\n$PY -m cli submit job.yaml --run-dir ro/run --evaluation off; "
                    "echo rc=$?", root)


def _linked_loop(root: Path, name: str) -> Path:
    (root / name).symlink_to(root / f"{name}.2")
    (root / f"{name}.2").symlink_to(root / name)
    return root / name


def _closed_stdout(root: Path) -> Run:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "cli", "presets"], cwd=root, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    rc = p.wait(timeout=120)
    return Run(0 if (rc == 141 and not err) else rc or 1, err=err)


CASES = [
    Case(RES, "evaluate into an --out-dir holding another step's results", lambda root: cli(*_evaluate(4)(root)),
         ("already holds the results of", "step 2", "--overwrite"), keep=("out/result.json",), setup=_evaluated_step_2,
         slow=True),
    Case(RES, "evaluate --overwrite replaces them whole", lambda root: cli(*_evaluate(4, "--overwrite")(root)),
         _result_step(4), setup=_evaluated_step_2, timeout_s=300, slow=True),
    Case(RES, "evaluate SIGKILLed right before its results replace the old ones",
         _killed_before_swap, _old_results_whole, keep=("out/result.json",), setup=_evaluated_step_2, timeout_s=300,
         slow=True),
    Case(RES, "a second evaluate into a directory being written",
         _locked(lambda root: root / "out", lambda root: cli(*_evaluate(2)(root))), ("is writing", "right now")),
    Case(RES, "simulate --plot over an existing file",
         lambda root: cli("simulate", "--trace", "newworkload:4", "--policy", "fcfs", "--plot", str(root / "p.png")),
         ("exists", "--overwrite"), keep=("p.png",), setup=_existing("p.png")),
    Case(RES, "simulate --jobs-csv over an existing file",
         lambda root: cli("simulate", "--trace", "newworkload:4", "--policy", "fcfs", "--jobs-csv",
                          str(root / "j.csv")), ("exists", "--overwrite"), keep=("j.csv",), setup=_existing("j.csv")),
    Case(RES, "stragglers analyze --heatmap over an existing file",
         lambda root: cli("stragglers", "analyze", _trace(root), "--heatmap", str(root / "h.png")),
         ("exists", "--overwrite"), keep=("h.png",), setup=_existing("h.png")),
    Case(FLAGS, "train --from-scratch on a root that holds checkpoints", _train("--from-scratch"),
         ("already holds", "they are kept", "--discard-checkpoints"),
         keep=("ck/step_00000002/manifest.json", "ck/step_00000004/manifest.json"), setup=_checkpoints, timeout_s=300),
    Case(NONSENSE, "train --resume when every manifest reads NaN", _train("--resume"),
         ("none of the 2 committed checkpoints", "step_00000004/manifest.json", "frenzy checkpoints"),
         keep=("ck/step_00000002/manifest.json", "ck/step_00000002/rank00000.bin", "ck/step_00000004/manifest.json"),
         setup=_nan_manifests, timeout_s=300),
    Case(NONSENSE, "train (no --resume) on a root whose every manifest reads NaN", _train(),
         ("already holds checkpoints", "unreadable", "--resume"),
         keep=("ck/step_00000002/manifest.json", "ck/step_00000002/rank00000.bin"), setup=_nan_manifests, timeout_s=300),
    Case(NONSENSE, "frenzy checkpoints lists a step directory that is a symlink loop",
         lambda root: cli("checkpoints", str(root / "ck"), "--json"), _lists_the_loop, setup=_step_loop),
    Case(FLAGS, "train --from-scratch --discard-checkpoints starts at step 0",
         _train("--from-scratch", "--discard-checkpoints"), _trained_from_zero, setup=_checkpoints, timeout_s=300,
         slow=True),
    Case(FLAGS, "train --resume --from-scratch together", _train("--resume", "--from-scratch"), ("not allowed with",)),
    Case(FLAGS, "train --discard-checkpoints without --from-scratch", _train("--discard-checkpoints"),
         ("goes with --from-scratch",), keep=("ck/step_00000004/manifest.json",), setup=_checkpoints),
    Case(FLAGS, "cluster show --ledger with a mistyped path",
         _not_created(lambda root: cli("cluster", "show", "--ledger", str(root / "ledgr.db")), "ledgr.db"),
         ("no ledger at", "ledgr.db", "cluster init")),
    Case(FLAGS, "cluster cordon --ledger with a mistyped path",
         _not_created(lambda root: cli("cluster", "cordon", "a", "--ledger", str(root / "x" / "l.db")), "x"),
         ("no ledger at", "check the path")),
    Case(FLAGS, "submit --ledger with a mistyped path",
         _not_created(lambda root: cli("submit", TINY, "--ledger", str(root / "ledgr.db")), "ledgr.db"),
         ("no ledger at", "ledgr.db")),
    Case(NONSENSE, "data prepare of a corpus whose files are empty",
         lambda root: cli("data", "prepare", _empty_corpus(root), "--out", str(root / "out")), ("no text",)),
    Case(NONSENSE, "tokenizer train on empty files",
         lambda root: cli("tokenizer", "train", _empty_corpus(root), "--out", str(root / "t.json"), "--vocab-size",
                          "300"), ("empty", "needs text")),
    Case(NONSENSE, "eval-plan of 10^12 examples",
         _with("s.yaml", SUITE.replace("examples: 8", "examples: 1000000000000"), "eval-plan", "--suite", "{}"),
         ("s.yaml", "examples", "less than or equal to")),
    Case(NONSENSE, "eval-plan of 5,000 examples of a 4,096-example dataset",
         _with("s.yaml", SUITE.replace("examples: 8", "examples: 5000"), "eval-plan", "--suite", "{}"),
         ("asks for 5,000 examples", "holds 4,096")),
    Case(NONSENSE, "a cluster file with an empty node list",
         _with("c.yaml", "name: c\nnodes: []\n", "plan", TINY, "--cluster", "{}"), ("no nodes", "at least one")),
    Case(NONSENSE, "a trace longer than the simulator's limit",
         _with("w.csv", "submit_time,duration,num_gpus\n" + "0,60,1\n" * 100_001, "simulate", "--trace", "{}",
               "--policy", "fcfs"), ("more than 100,000 jobs",)),
    Case(NONSENSE, "frenzy checkpoints lists a manifest whose shard key leaves the checkpoint",
         lambda root: cli("checkpoints", str(root / "ck"), "--json"), _lists_the_tampered_step, setup=_tampered),
    Case(NONSENSE, "export walks back past a manifest whose shard key leaves the checkpoint",
         lambda root: cli("export", str(root / "ck"), str(root / "hf")), _exports_step_2, setup=_tampered),
    Case(ENV, "data prepare onto a full disk", _full_disk, ("no space left on the device", "mnt/shards")),
    Case(ENV, "stragglers generate into a read-only directory", _read_only, ("read-only file system",)),
    Case(ENV, "evaluate with its --history-dir on a full disk", _history_full, ("no space left on the device", "full/h"),
         slow=True),
    Case(ENV, "output piped into a reader that is gone", _closed_stdout, lambda root, run: True),
    Case(ENV, "data prepare past the file-size limit (ulimit -f)", _file_size_limit, ("file too large", "ulimit")),
    Case(ENV, "submit with its --run-dir on a read-only mount", _read_only_run_dir,
         ("--run-dir", "read-only file system")),
    Case(FLAGS, "checkpoints on a root that is a symlink loop",
         lambda root: cli("checkpoints", str(_linked_loop(root, "ck"))), ("symlink loop",)),
    Case(FLAGS, "export from a root that is a symlink loop",
         lambda root: cli("export", str(_linked_loop(root, "ck")), str(root / "hf")), ("symlink loop",)),
    Case(FLAGS, "stragglers analyze --timeline-step outside the trace",
         lambda root: cli("stragglers", "analyze", _trace(root), "--timeline", str(root / "t.json.gz"),
                          "--timeline-step", "1000000"), ("--timeline-step", "not a step of the trace")),
    Case(FLAGS, "stragglers generate --slow-worker with two numbers",
         lambda root: cli("stragglers", "generate", str(root / "t.parquet"), "--slow-worker", "1,2"),
         ("--slow-worker", "3 finite numbers")),
    Case(FLAGS, "submit --suite with a typo", lambda root: cli("submit", TINY, "--suite", "qiuck"),
         ("qiuck", "built-in suite")),
    Case(FLAGS, "a numeric flag given nan", lambda root: cli("stragglers", "generate", str(root / "t.parquet"),
                                                             "--noise", "nan"), ("--noise", "out of range")),
]
