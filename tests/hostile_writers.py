"""Hostile targets for Frenzy's writers (issue 32's tokenizer, prepare, export rows) and hostile state files (the
writer lease, OOM observations): never a lost file, never a half-written target, never a traceback."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.hostile_kit import Case, Run, bpe_json, checkpoint_root, cli, lib, llama_dir

REPO = Path(__file__).resolve().parents[1]
T, E, P = "tokenizers", "export", "data"


def _text(root: Path) -> str:
    (root / "t.txt").write_text("def f(x):\n    return x * 2\n" * 300)
    return str(root / "t.txt")


def _train(out: Callable[[Path], Path], *extra: str) -> Callable[[Path], Run]:
    return lambda root: cli("tokenizer", "train", _text(root), "--out", str(out(root)), "--vocab-size", "300", *extra)


def _is_bpe(path: str) -> Callable[[Path, Run], bool]:
    def check(root: Path, run: Run) -> bool:
        from tasks.training.tokenizer import load_tokenizer

        tok = load_tokenizer(str(root / path))
        fresh = (root / path).read_bytes() != bpe_json(root / "fixture.json").read_bytes()
        return fresh and tok.vocab_size <= 300 and tok.decode(tok.encode("return x")) == "return x"
    return check


def _locked(target: Callable[[Path], Path], act: Callable[[Path], Run]) -> Callable[[Path], Run]:
    """Run `act` while another writer holds the target's lock."""
    def run(root: Path) -> Run:
        t = target(root)
        t.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(t.parent / f".{t.name}.lock", os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return act(root)
        finally:
            os.close(fd)
    return run


def _export(out: Callable[[Path], Path], *extra: str) -> Callable[[Path], Run]:
    return lambda root: cli("export", str(checkpoint_root(root / "ck")), str(out(root)), *extra)


def _old_export(root: Path) -> Path:
    """A directory holding a previous export plus an index and a tokenizer.json it no longer matches."""
    d = root / "hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"old")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (d / "tokenizer.json").write_text("{}")
    return d


def _exported_whole(root: Path, run: Run) -> bool:
    from tasks.evaluation.engine import load_remote

    d = root / "hf"
    names = sorted(p.name for p in d.iterdir())
    state, _ = load_remote(str(root / "ck"))
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(d)
    wte = model.get_input_embeddings().weight
    return names == ["config.json", "model.safetensors"] and bool((wte == state["wte.weight"]).all())


def _state_export(change: Callable[[dict], None]) -> Callable[[Path], Run]:
    """`export_hf` of a checkpoint's state after `change` (a damaged or mismatched state)."""
    def act(root: Path) -> Run:
        from tasks.evaluation.engine import load_remote
        from tasks.hf.convert import export_hf
        from tasks.jobspec import ModelSpec

        state, info = load_remote(str(checkpoint_root(root / "ck")))
        change(state)
        return lib(lambda: export_hf(state, ModelSpec.model_validate(info["model"]), int(info["seq_len"]),
                                     root / "hf"))
    return act


_KILL_AFTER = """
import os, signal, sys, importlib
mod, fn, after = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = importlib.import_module(mod)
real, calls = getattr(m, fn), [0]
def patched(*a, **k):
    calls[0] += 1
    if after < 0 and calls[0] >= -after:  # before the call: e.g. os.replace, every byte written, nothing renamed
        os.kill(os.getpid(), signal.SIGKILL)
    out = real(*a, **k)
    if calls[0] >= after > 0:  # the worst moment: the write done, the rename not yet
        os.kill(os.getpid(), signal.SIGKILL)
    return out
setattr(m, fn, patched)
from cli.main import main
sys.exit(main(sys.argv[4:]))
"""


def _killed(argv: Callable[[Path], list[str]], where: str, after: int = 1) -> Callable[[Path], Run]:
    """A real `frenzy` process SIGKILLed right after `where` (module:function) ran `after` times, or right before
    its `-after`-th call when `after` is negative."""
    def act(root: Path) -> Run:
        mod, fn = where.split(":")
        p = subprocess.run([sys.executable, "-c", _KILL_AFTER, mod, fn, str(after), *argv(root)], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
        return Run(0, value=p.returncode)
    return act


def _big_corpus(root: Path) -> list[str]:
    (root / "c.txt").write_text("abcdefgh" * 400_000)
    return ["data", "prepare", str(root / "c.txt"), "--out", str(root / "out"), "--shard-tokens", "1024",
            "--overwrite"]


def _untouched_prepare(root: Path, run: Run) -> bool:
    from tasks.jobspec import DataSpec
    from tasks.training.data import load_corpus

    return len(load_corpus(DataSpec(source="tokens", path=str(root / "out")))) == 5001


def _prior_prepare(argv: Callable[[Path], list[str]]) -> Callable[[Path], list[str]]:
    def make(root: Path) -> list[str]:
        (root / "p.txt").write_text("y" * 5000)
        assert cli("data", "prepare", str(root / "p.txt"), "--out", str(root / "out")).rc == 0
        return argv(root)
    return make


_CK_FILES = ("ck/step_00000004/manifest.json", "ck/step_00000002/manifest.json", "ck/step_00000004/rank00000.bin")


def _model_with_tokenizer(root: Path) -> None:
    llama_dir(root / "B")
    bpe_json(root / "B" / "tokenizer.json")


CASES = [
    Case(T, "train into a new directory", _train(lambda r: r / "tok"), _is_bpe("tok/tokenizer.json")),
    Case(T, "train --out MODEL_DIR", _train(lambda r: r / "B"), ("model directory", "another --out"),
         keep=("B/tokenizer.json", "B/config.json"), setup=_model_with_tokenizer),
    Case(T, "train --out MODEL_DIR/tokenizer.json --overwrite", _train(lambda r: r / "B" / "tokenizer.json",
                                                                       "--overwrite"),
         ("model directory",), keep=("B/tokenizer.json",), setup=_model_with_tokenizer),
    Case(T, "train over an existing file", _train(lambda r: r / "mine.json"), ("mine.json", "--overwrite"),
         keep=("mine.json",), setup=lambda r: bpe_json(r / "mine.json")),
    Case(T, "train over an existing file --overwrite", _train(lambda r: r / "mine.json", "--overwrite"),
         _is_bpe("mine.json"), setup=lambda r: bpe_json(r / "mine.json")),
    Case(T, "train into a checkpoint root", _train(lambda r: checkpoint_root(r / "ck")), ("checkpoint", "another")),
    Case(T, "train while another writes the target", _locked(lambda r: r / "x.json", _train(lambda r: r / "x.json")),
         ("another tokenizer train", "x.json")),
    Case(T, "train on missing input", lambda r: cli("tokenizer", "train", str(r / "no"), "--out", str(r / "t.json")),
         ("does not exist",)),
    Case(T, "train with vocab 10", lambda r: cli("tokenizer", "train", _text(r), "--out", str(r / "t"),
                                                 "--vocab-size", "10"), ("--vocab-size",)),
    Case(T, "show a file that is no tokenizer", lambda r: [(r / "t.json").write_text("{}")] and cli(
        "tokenizer", "show", "--out", str(r / "t.json")), ("t.json", "not a tokenizer.json")),
    Case(T, "show a missing tokenizer", lambda r: cli("tokenizer", "show", "--out", str(r / "none.json")),
         ("none.json", "neither")),
    Case(T, "show a directory without tokenizer.json", lambda r: cli("tokenizer", "show", "--out", str(r)),
         ("no tokenizer.json", "tokenizer train")),
    Case(T, "tokenizer_config.json holding a list", lambda r: [bpe_json(r / "m" / "tokenizer.json"),
         (r / "m" / "tokenizer_config.json").write_text("[1]")] and cli("tokenizer", "show", "--out", str(r / "m")),
         ("tokenizer_config.json", "list", "fix or remove")),
    Case(T, "tokenizer_config.json not UTF-8", lambda r: [bpe_json(r / "m" / "tokenizer.json"),
         (r / "m" / "tokenizer_config.json").write_bytes(b'{"eos_token": "\xff"}')] and cli(
        "tokenizer", "show", "--out", str(r / "m")), ("tokenizer_config.json", "UTF-8")),
    Case(T, "evaluate a model without its tokenizer", lambda r: lib(lambda: __import__(
        "tasks.evaluation.engine", fromlist=["hf_info"]).hf_info(str(llama_dir(r / "B")))),
        ("no tokenizer.json", "vocab is 300", "copy")),
    Case(T, "evaluate a model with a larger tokenizer", lambda r: lib(lambda: [
        llama_dir(r / "B"), _bigger_tokenizer(r / "B")] and __import__(
        "tasks.evaluation.engine", fromlist=["hf_info"]).hf_info(str(r / "B"))), ("tokenizer.json", "vocab_size")),
    # export
    Case(E, "export into a new directory loads in transformers", _export(lambda r: r / "hf"), _exported_whole),
    Case(E, "export into a non-empty directory", _export(lambda r: r / "hf"), ("hf", "--overwrite"),
         keep=("hf/config.json", "hf/model.safetensors", "hf/tokenizer.json", "hf/model.safetensors.index.json"),
         setup=_old_export),
    Case(E, "export --overwrite leaves no stale index or tokenizer", _export(_old_export, "--overwrite"),
         _exported_whole),
    Case(E, "export onto its checkpoint root", lambda r: cli("export", str(r / "ck"), str(r / "ck"), "--overwrite"),
         ("checkpoint", "another directory"), keep=_CK_FILES, setup=lambda r: checkpoint_root(r / "ck")),
    Case(E, "export onto a step directory", lambda r: cli("export", str(r / "ck"), str(r / "ck" / "step_00000002"),
                                                          "--overwrite"),
         ("checkpoint", "another directory"), keep=_CK_FILES, setup=lambda r: checkpoint_root(r / "ck")),
    Case(E, "export into a new directory inside the root", lambda r: cli("export", str(r / "ck"), str(r / "ck" / "hf")),
         ("inside",), setup=lambda r: checkpoint_root(r / "ck")),
    Case(E, "export while another export writes it", _locked(lambda r: r / "hf", _export(lambda r: r / "hf")),
         ("another export",)),
    Case(E, "export a state with a wrong shape", _state_export(lambda s: s.update(
        {"norm_f.weight": s["norm_f.weight"][:3].clone()})), ("norm_f.weight", "wrong shapes")),
    Case(E, "export a state missing a tensor", _state_export(lambda s: [s.pop("blocks.0.fc1.weight")] and None),
         ("blocks.0.fc1.weight", "missing")),
    Case(E, "export SIGKILLed mid-write leaves the old export", _killed(
        lambda r: ["export", str(checkpoint_root(r / "ck")), str(r / "hf"), "--overwrite"], "tasks.hf.convert:_write_hf"),
        lambda root, run: (root / "hf" / "model.safetensors").read_bytes() == b"old",
        keep=("hf/config.json", "hf/model.safetensors"), setup=_old_export),
    # prepare as a writer
    Case(P, "prepare into a non-empty directory", lambda r: cli("data", "prepare", _text(r), "--out", str(r / "out")),
         ("out", "--overwrite"), keep=("out/prepared.json", "out/shard_000000.bin"),
         setup=_prior_prepare(lambda r: [])),
    Case(P, "prepare --overwrite replaces every shard", lambda r: _prior_prepare(lambda r: [])(r) or cli(
        "data", "prepare", _text(r), "--out", str(r / "out"), "--overwrite"),
        lambda root, run: sorted(p.name for p in (root / "out").iterdir()) == ["prepared.json", "shard_000000.bin"]),
    Case(P, "two prepares on one --out", _locked(lambda r: r / "out", lambda r: cli(
        "data", "prepare", _text(r), "--out", str(r / "out"))), ("another data prepare",)),
    Case(P, "prepare into a checkpoint root", lambda r: cli("data", "prepare", _text(r), "--out", str(r / "ck"),
                                                            "--overwrite"),
         ("checkpoint",), keep=_CK_FILES, setup=lambda r: checkpoint_root(r / "ck")),
    Case(P, "prepare --out a file", lambda r: cli("data", "prepare", _text(r), "--out", _text(r)),
         ("not a directory",)),
    Case(P, "prepare SIGKILLed mid-run leaves the previous output", _killed(
        _prior_prepare(_big_corpus), "tasks.training.shards:write_shard", 3), _untouched_prepare),
]


def _bigger_tokenizer(folder: Path) -> None:
    from tasks.training.tokenizer import train_bpe

    text = folder.parent / "big.txt"
    text.write_text(" ".join(f"w{i}x{i * 7}" for i in range(3000)))
    train_bpe([str(text)], folder.parent / "big.json", vocab_size=600)
    (folder / "tokenizer.json").write_text((folder.parent / "big.json").read_text())
