"""Hostile and broken inputs to `frenzy diagnose` and its LLM agent (issue 32's diagnose/agent row): binary files,
FIFOs, huge lines and logs, escapes and foreign encodings are read with bounded time and memory or refused with a
message; a poisoned learned-rules file or agent answer cannot hang the diagnosis, match everything or stop the
recovery of an infrastructure fault."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from tests.hostile_kit import Case, Run, cli, lib

D = "diagnose"
NCCL = (b"[rank1]:[E0301 20:50:36.247979769 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
        b"timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 "
        b"milliseconds before timing out.\n")
S3 = b"[rank0]: botocore.exceptions.EndpointConnectionError: Could not connect to the endpoint URL\n"
CUDA = b"RuntimeError: CUDA error: unspecified launch failure\n"


def _log(content: bytes | Callable[[Path], None], *flags: str) -> Callable[[Path], Run]:
    def act(root: Path) -> Run:
        p = root / "train.log"
        if callable(content):
            content(p)
        else:
            p.write_bytes(content)
        return cli("diagnose", str(p), "--json", *flags)
    return act


def _says(type_: str, restartable: bool | None = None, max_evidence: int = 100) -> Callable[[Path, Run], bool]:
    def check(_: Path, run: Run) -> bool:
        d = json.loads(run.out)
        return (d["type"] == type_ and len(d["evidence"]) <= max_evidence and "\x1b" not in run.out
                and (restartable is None or d["restartable"] == restartable))
    return check


def _poisoned(rules: bytes | None, log: bytes, as_dir: bool = False) -> Callable[[Path], Run]:
    """A learned-rules file an attacker (or a bad agent answer) left in FRENZY_HOME, then a real failure."""
    def act(root: Path) -> Run:
        home = root / "home"
        home.mkdir()
        if as_dir:
            (home / "diagnosis-rules.jsonl").mkdir()
        elif rules is not None:
            (home / "diagnosis-rules.jsonl").write_bytes(rules)
        (root / "train.log").write_bytes(log)
        old = os.environ.get("FRENZY_HOME")
        os.environ["FRENZY_HOME"] = str(home)
        try:
            return cli("diagnose", str(root / "train.log"), "--json")
        finally:
            os.environ.pop("FRENZY_HOME") if old is None else os.environ.__setitem__("FRENZY_HOME", old)
    return act


def _rule(type_: str, pattern: str, restartable: bool = False) -> bytes:
    return (json.dumps({"type": type_, "category": "script", "pattern": pattern, "priority": 99,
                        "restartable": restartable, "mitigation": "stop"}) + "\n").encode()


def _agent(answer: dict | None, log: bytes) -> Callable[[Path], Run]:
    """The agent asked about a log no rule explains; `answer` None: an endpoint that accepts and never answers."""
    def act(root: Path) -> Run:
        from tasks.diagnosis.agent import AgentConfig
        from tasks.diagnosis.diagnose import diagnose

        old = os.environ.get("FRENZY_HOME")
        os.environ["FRENZY_HOME"] = str(root)
        try:
            if answer is None:
                sock = socket.socket()
                sock.bind(("127.0.0.1", 0))
                sock.listen(8)  # connections queue in the kernel; nothing ever reads or answers them
                url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
                cfg = AgentConfig(url=url, model="m", samples=3, timeout_s=2, total_timeout_s=3)
            else:
                from tests.test_diagnosis import _FakeLLM

                cfg = AgentConfig(url=_FakeLLM([answer] * 3).url, model="m", samples=3)
            run = lib(lambda: diagnose(log, agent=cfg))
            if answer is None:
                sock.close()
            return Run(run.rc, err=run.err, value=(run.value, (root / "diagnosis-rules.jsonl").exists()))
        finally:
            os.environ.pop("FRENZY_HOME") if old is None else os.environ.__setitem__("FRENZY_HOME", old)
    return act


def _unknown_and_nothing_learned(_: Path, run: Run) -> bool:
    d, learned = run.value
    return d.type == "Unknown" and not learned


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _copy_binary(p: Path) -> None:
    shutil.copy(sys.executable if Path(sys.executable).stat().st_size < 50 << 20 else "/bin/ls", p)


def _one_huge_line(p: Path) -> None:
    with open(p, "wb") as f:
        for _ in range(100):
            f.write(b"x" * (1 << 20))  # 100 MB without a newline
        f.write(b"\n" + CUDA)


def _many_identical(p: Path) -> None:
    p.write_bytes(b"step 1 loss 2.0\n" + CUDA * 1_000_000)


ODD = b"[rank3]: step 812 loss 2.1\n[rank3]: gpu-b12-1: thermal slowdown engaged, clocks fell (error 77)\n"

CASES = [
    Case(D, "a binary file (the python executable)", _log(_copy_binary), ("looks binary", "train.log")),
    Case(D, "a FIFO", _log(_fifo), ("not a regular file", "copy the log"), timeout_s=20),
    Case(D, "a directory", lambda root: cli("diagnose", str(root)), ("is a directory", "give a file")),
    Case(D, "a 140 KB line of node words", _log(b"node " * 28000 + b"failed\n" + CUDA), _says("CUDAError"),
         timeout_s=20),
    Case(D, "a single 100 MB line", _log(_one_huge_line), _says("CUDAError"), timeout_s=120),
    Case(D, "a million identical error lines", _log(_many_identical), _says("CUDAError"), timeout_s=120),
    Case(D, "a zero-filled tail (a node crash)", _log(CUDA + b"\0" * 70000), _says("CUDAError")),
    Case(D, "non-UTF-8 bytes", _log(b"caf\xe9 \xff\xfe\n" + CUDA), _says("CUDAError")),
    Case(D, "terminal escape sequences", _log(b"\x1b[31m" + CUDA.rstrip() + b"\x1b[0m\x1b]0;title\x07\n"),
         _says("CUDAError")),
    Case(D, "an empty log", _log(b""), _says("Unknown")),
    Case(D, "learned (a+)+$ pattern", _poisoned(_rule("KeyError", "(a+)+$"), b"a" * 5000 + b"! error\n"),
         _says("Unknown"), timeout_s=20),
    Case(D, "learned 'Traceback' rule, then an NCCL timeout",
         _poisoned(_rule("KeyError", r"Traceback\ \(most\ recent\ call\ last\):"), b"Traceback (most recent call "
                   b"last):\n" + NCCL), _says("NCCLTimeoutError", restartable=True)),
    Case(D, "learned one-character rule, then an S3 error", _poisoned(_rule("ECCError", "e"), S3),
         _says("S3StorageError", restartable=True)),
    Case(D, "learned rule of an unknown type", _poisoned(_rule("RmRf", "x" * 30), CUDA), _says("CUDAError")),
    Case(D, "rules file not JSON", _poisoned(b"{oops\n\xff\xfe\n", CUDA), _says("CUDAError")),
    Case(D, "rules file a directory", _poisoned(None, CUDA, as_dir=True), _says("CUDAError")),
    Case(D, "agent quotes the traceback header",
         _agent({"type": "KeyError", "line": "Traceback (most recent call last):", "restartable": False},
                b"Traceback (most recent call last):\n" + ODD), _unknown_and_nothing_learned),
    Case(D, "agent quotes one character", _agent({"type": "ECCError", "line": "e", "restartable": False}, ODD),
         _unknown_and_nothing_learned),
    Case(D, "agent endpoint never answers", _agent(None, ODD), _unknown_and_nothing_learned, timeout_s=30),
]
