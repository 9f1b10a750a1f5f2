"""The hostile-input sweep's machinery (issue 32): a case builds its input in a fresh directory, acts as a user or an
attacker would (the CLI in-process, or the library call the CLI makes), and is classified as the issue's table
counts it: clear (a clear exit-2 message naming the fix, or a correct result), unclear, traceback, hang, silent
wrong or data lost. `tests/test_hostile_inputs.py` asserts every case is clear; `benchmarks/hostile.py` counts them.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import shutil
import signal
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

OUTCOMES = ("clear", "unclear", "traceback", "hang", "silent wrong", "data lost")
BUG = "a bug in Frenzy"
"""What the CLI's boundary says of an exception that is not the user's (cli/output.py): counted as a traceback."""


@dataclass
class Run:
    """What a user saw: the exit status (2: refused with a message) and the text printed."""

    rc: int
    out: str = ""
    err: str = ""
    value: object = None


@dataclass
class Case:
    surface: str
    name: str
    act: Callable[[Path], Run]
    expect: tuple[str, ...] | Callable[[Path, Run], bool]
    """Substrings the exit-2 message must hold (file, key or line, and the fix), or a check of a correct result."""
    keep: tuple[str, ...] = ()
    """Files under the case directory that must be byte-identical afterwards (an existing model, an export)."""
    timeout_s: int = 120
    setup: Callable[[Path], object] | None = None
    """Builds what must survive (`keep`) before the act."""
    slow: bool = False
    """Minutes of work (a real evaluation or training): counted by benchmarks/hostile.py, run by pytest only under
    `-m slow`."""
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = f"{self.surface}:{self.name}"


def cli(*argv: str) -> Run:
    """`frenzy ARGV` in-process; an exception escaping `main` is what a user would see as a traceback."""
    from cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse's usage errors
            rc = int(exc.code or 0)
    return Run(rc, out.getvalue(), err.getvalue())


def lib(fn: Callable[[], object]) -> Run:
    """A library call the way the CLI's boundary maps it (cli/output.py): a `FrenzyError` or an error of the machine
    exits 2 with the message; anything else escapes as a traceback."""
    from tasks.errors import user_message

    try:
        return Run(0, value=fn())
    except Exception as err:
        msg = user_message(err)
        if msg is None:
            raise
        return Run(2, err=msg)


def _digest(root: Path, names: tuple[str, ...]) -> dict[str, str | None]:
    return {n: hashlib.sha256((root / n).read_bytes()).hexdigest() if (root / n).is_file() else None for n in names}


class _Hang(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Hang


def classify(case: Case, root: Path) -> tuple[str, str]:
    """(outcome, detail) of one case run in `root`."""
    if case.setup is not None:
        case.setup(root)
    before = _digest(root, case.keep)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(case.timeout_s)
    try:
        run = case.act(root)
    except _Hang:
        return "hang", f"no answer in {case.timeout_s} s"
    except Exception:  # noqa: BLE001 - what the sweep counts
        return "traceback", traceback.format_exc(limit=-3)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    after = _digest(root, case.keep)
    if before != after:
        return "data lost", f"changed: {[n for n in case.keep if before[n] != after[n]]}"
    if "Traceback (most recent call last)" in run.err or BUG in run.err:
        return "traceback", run.err[-800:]
    if callable(case.expect):
        if run.rc != 0:
            return "unclear", f"refused a valid input: {run.err[-400:]}"
        return ("clear", "") if case.expect(root, run) else ("silent wrong", f"exit 0, wrong result: {run.out[:300]}")
    if run.rc == 0:
        return "silent wrong", f"accepted (exit 0): {run.out[:300]}"
    missing = [s for s in case.expect if s.lower() not in run.err.lower()]
    if run.rc != 2 or missing:
        return "unclear", f"exit {run.rc}, message lacks {missing}: {run.err[-400:]}"
    return "clear", ""


def run_case(case: Case) -> tuple[str, str]:
    root = Path(tempfile.mkdtemp(prefix="frenzy-hostile-"))
    try:
        return classify(case, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def all_cases() -> list[Case]:
    from tests import (
        hostile_data,
        hostile_diagnosis,
        hostile_hf,
        hostile_outputs,
        hostile_readers,
        hostile_results,
        hostile_state,
        hostile_writers,
    )

    return [*hostile_hf.CASES, *hostile_data.CASES, *hostile_writers.CASES, *hostile_outputs.CASES,
            *hostile_state.CASES, *hostile_diagnosis.CASES, *hostile_readers.CASES,
            *hostile_results.CASES]


# ------------------------------------------------------------------------------------------- shared inputs
_BUILT: dict[str, Path] = {}


def _base() -> Path:
    if "base" not in _BUILT:
        _BUILT["base"] = Path(tempfile.mkdtemp(prefix="frenzy-hostile-inputs-"))
        atexit.register(shutil.rmtree, _BUILT["base"], True)
    return _BUILT["base"]


def llama_dir(dest: Path) -> Path:
    """A random 2-layer Llama made by `transformers.save_pretrained` ("B" in the issue), copied to `dest`."""
    if "llama" not in _BUILT:
        import torch
        import transformers

        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=160, vocab_size=300,
                                       max_position_embeddings=128)
        transformers.LlamaForCausalLM(cfg).save_pretrained(_base() / "llama")
        _BUILT["llama"] = _base() / "llama"
    shutil.copytree(_BUILT["llama"], dest)
    return dest


def bpe_json(dest: Path) -> Path:
    """A 300-token byte-level BPE trained by `frenzy tokenizer train`, copied to `dest`."""
    if "bpe" not in _BUILT:
        from tasks.training.tokenizer import train_bpe

        text = _base() / "bpe-text.txt"
        text.write_text("def add(a, b):\n    return a + b\n" * 200 + "the quick brown fox jumps\n" * 200)
        train_bpe([str(text)], _base() / "bpe.json", vocab_size=300)
        _BUILT["bpe"] = _base() / "bpe.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(_BUILT["bpe"], dest)
    return dest


def checkpoint_root(dest: Path) -> Path:
    """A checkpoint root with committed steps 2 and 4 of a real `gpt-tiny` run, copied to `dest`."""
    if "ckpt" not in _BUILT:
        from tests.trainer_util import run, tiny_job

        root = _base() / "ckpt"
        run(tiny_job(f"file://{root}", steps=4, every=2), _base() / "run")
        _BUILT["ckpt"] = root
    shutil.copytree(_BUILT["ckpt"], dest)
    return dest
