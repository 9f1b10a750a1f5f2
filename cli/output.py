"""How every `frenzy` command answers: one JSON document on stdout under `--json`, else a table or text.

Errors end at one boundary (`run`): a `tasks.errors.FrenzyError` (the input or the environment is wrong, and the
message names it and the fix), an invalid request, or an error of the machine (disk full, read-only file system,
permission, symlink loop: `tasks.errors.environment_problem`) prints `frenzy CMD: error: ...` on stderr and exits
2. Anything else is a bug: a short message says so and where its traceback was written (`$FRENZY_HOME/crash/`,
default ~/.frenzy/crash), exit 1. A closed stdout (`frenzy ... | head`) ends quietly with status 141, as `cat`
does; Ctrl-C ends with 130. Library chatter (solver banners, Ray, child processes) never reaches
the JSON document: while a `--json` command runs, stdout (the Python object and file descriptor 1) points at
stderr, and the document is written to the real stdout only after the command has finished. Under `--json` a
command that fails prints, as its one document, the error (`CommandError`: the same keys for every command) with the
exit status unchanged (red team 41k B3: a failed `frenzy evaluate --json` printed nothing)."""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import io
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_UNSET = object()


class _Document:
    """The one JSON document a `--json` command produced (set by `emit`, printed by `run`)."""

    def __init__(self) -> None:
        self.doc: Any = _UNSET


_document: contextvars.ContextVar[_Document | None] = contextvars.ContextVar("frenzy_json_document", default=None)


def table(rows: list[dict[str, Any]], cols: Sequence[str] | None = None) -> str:
    """A plain fixed-width table."""
    if not rows:
        return "(none)"
    cols = list(cols or rows[0].keys())
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*cols), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in cells])


def emit(args: argparse.Namespace, doc: Any, human: Callable[[], str]) -> None:
    """The command's answer: `doc` as JSON under --json (printed once the command returns), else `human()`."""
    if not args.json:
        print(human())
        return
    holder = _document.get()
    if holder is None:  # called outside `run` (a test calling a command function directly)
        print(json.dumps(doc, indent=2, default=str))
        return
    if holder.doc is not _UNSET:
        raise RuntimeError("a --json command emitted two documents; it must print exactly one")
    holder.doc = doc


def progress(msg: str) -> None:
    """A progress line for a person: stderr, so it never mixes with the answer."""
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Point stdout (sys.stdout and fd 1, which C libraries and child processes write to) at stderr."""
    sys.stdout.flush()
    saved_obj = sys.stdout
    try:
        saved_fd = os.dup(1)
    except OSError:  # no fd 1 (a closed stdout): only the Python object can be redirected
        saved_fd = None
    try:
        if saved_fd is not None:
            os.dup2(2, 1)
        sys.stdout = sys.stderr
        yield
    finally:
        sys.stdout = saved_obj
        if saved_fd is not None:
            with contextlib.suppress(OSError):
                sys.stderr.flush()
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def crash_dir() -> Path:
    """Where the traceback of a bug goes: `$FRENZY_HOME/crash` (default ~/.frenzy/crash)."""
    from tasks.pathvars import frenzy_home
    return frenzy_home() / "crash"


class CommandFailed(Exception):
    """A failure a command has described in its message (a trainer that exited with an error), with its exit status:
    said at the boundary like any other error (on stderr, and as the error document under --json)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


PIPELINE_COMMANDS = ("submit", "demo")
"""The commands that run the `submit` flow: a stop ends them with the line saying where the run was."""


class Signalled(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) that reached `frenzy submit`/`demo` before the flow's own handler was set (cli/console.py):
    the command ends as after Ctrl-C, with its line, and exits 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stop_on_signals(command: str) -> None:
    """From the first moment of `frenzy submit`/`demo` (its imports, reading the job, planning), SIGTERM and SIGHUP
    (unless ignored, as under nohup) raise `Signalled`: red team 41r's SIGTERM in its first 5 s exited 143 with no
    line. Other commands keep the default (they hold nothing to give back)."""
    if command not in PIPELINE_COMMANDS or threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, _frame: object) -> None:
        raise Signalled(signum)

    signal.signal(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, stop)


def _interrupted(command: str, err: KeyboardInterrupt) -> tuple[int, str]:
    """The exit status and the line of a command stopped by Ctrl-C or a signal that escaped it (for `submit`, a stop
    before it ran the flow, which says where its own stops were: it was planning)."""
    rc = 128 + err.signum if isinstance(err, Signalled) else 130
    ran = sys.modules.get("tasks.pipeline.stopped")  # what the run reached, once `run_submit` started it
    if command not in PIPELINE_COMMANDS or (ran is not None and ran.any_reached()):
        return rc, f"frenzy {command}: interrupted"
    from tasks.pipeline.stopped import Stopped

    return rc, Stopped(checkpoint_uri="", phase="planning").line(f"frenzy {command}")


def _bug(command: str, err: BaseException) -> tuple[str, str | None]:
    """A bug: one short message saying so, the traceback in a file (printed instead when no file can be written);
    returns the message and the file (None when none could be written)."""
    text = "".join(traceback.format_exception(err))
    head = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
    try:
        d = crash_dir()
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{time.strftime('%Y%m%d-%H%M%S')}-{command}-{os.getpid()}.txt"
        path.write_text(f"frenzy {command} (pid {os.getpid()}, {time.strftime('%Y-%m-%d %H:%M:%S %z')})\n"
                        f"argv: {sys.argv}\n\n{text}")
        where, crash = f"the traceback is in {path}", str(path)
    except OSError as werr:
        where, crash = f"the traceback (no crash file could be written: {werr}):\n{text}", None
    said = f"internal error, a bug in Frenzy rather than in your input: {head}"
    print(f"frenzy {command}: {said}\n  {where}; please report it with that file", file=sys.stderr)
    return f"{said}; please report it with {crash or 'the traceback printed on stderr'}", crash


def _quiet_pipe() -> int:
    """The reader of stdout went away (`frenzy ... | head`): end quietly, as `cat` does (status 141 = SIGPIPE)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush then goes nowhere
        os.close(devnull)
    return 141


def finish(command: str, err: BaseException, as_json: bool = False) -> int:
    """The exit status for an exception that escaped a command (module docstring), said on stderr; with `as_json`
    also as the command's one JSON document on stdout (`CommandError`)."""
    if isinstance(err, BrokenPipeError):
        return _quiet_pipe()
    crash = None
    if isinstance(err, KeyboardInterrupt):
        rc, line = _interrupted(command, err)
        kind, msg = "interrupted", ("interrupted (Ctrl-C); run the same command again" if line.endswith(": interrupted")
                                    else line)
        with contextlib.suppress(OSError):
            print(line, file=sys.stderr)
    else:
        from tasks.errors import user_message

        rc, kind, msg = (err.exit_code, "error", str(err)) if isinstance(err, CommandFailed) else (
            2, "error", user_message(err))
        if msg is None:
            rc, kind = 1, "bug"
            msg, crash = _bug(command, err)
        else:
            with contextlib.suppress(BrokenPipeError):
                print(f"frenzy {command}: error: {msg}", file=sys.stderr)
    if as_json:
        to_stdout_quietly(CommandError(command, kind, msg, rc, crash))
    return rc


@dataclass(frozen=True)
class CommandError:
    """What a failed `--json` command prints on stdout, as `{"error": {...}}`, with the same keys for every command."""

    command: str
    kind: str
    """error (the input or the machine: `message` names it and the fix), usage (an argument argparse refused: exit
    2), bug (`crash_file` holds the traceback), or interrupted (Ctrl-C, SIGTERM)."""
    message: str
    """What stderr says."""
    exit_code: int
    crash_file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"error": asdict(self)}


def to_stdout_quietly(err: CommandError) -> None:
    """Write an error document; a stdout that refuses it changes nothing (stderr has said the error already)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.write(json.dumps(err.to_json(), indent=2) + "\n")
        sys.stdout.flush()


def _leave_ray() -> None:
    """Disconnect from Ray while stdout still points at stderr: its shutdown and dead-raylet banners (several KB
    after a node was lost) would otherwise land after the JSON document."""
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        with contextlib.suppress(Exception):
            ray.shutdown()


def _stdout_name() -> str:
    """What standard output is, for a message: the file or device it is open on (and its file system's mount point)."""
    try:
        target = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
    except (OSError, ValueError, io.UnsupportedOperation):
        return "standard output"
    if not target.startswith("/") or target.startswith("/dev/"):
        return f"standard output ({target})"
    from tasks.outdir import mount_of

    return f"standard output ({target}, on the file system mounted at {mount_of(Path(target))})"


def _stdout_refuses() -> bool:
    """Whether standard output is where writes fail: /dev/full, or a file on a file system with no space left."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        fd = sys.stdout.fileno()
        if os.readlink(f"/proc/self/fd/{fd}") == "/dev/full":
            return True
        st = os.fstatvfs(fd)
        return st.f_blocks > 0 and st.f_bavail == 0
    return False


def _stdout_problem(err: OSError, doc: Any = None, finished: bool = True) -> Exception | None:
    """A write of the answer the machine refused (a full disk, /dev/full), said as stdout's, after a command that itself
    finished (red team 41i N12: "the disk is full" named nothing, after a whole submit); None for other errors."""
    from tasks.errors import EnvironmentProblem, environment_problem

    if isinstance(err, BrokenPipeError) or (said := environment_problem(err)) is None:
        return None
    where = doc.get("report") if isinstance(doc, dict) else None
    done = f"the command finished{f' (its report: {where})' if where else ''}, but its" if finished else "the command's"
    return EnvironmentProblem(
        f"{done} answer could not be written to {_stdout_name()}: {said}; run it again with stdout somewhere with space "
        "(a finished `submit` is reported again without training)")


def _to_stdout(write: Callable[[], None], doc: Any = None) -> None:
    """Write the command's answer; a refused write is said by `_stdout_problem`."""
    try:
        write()
    except OSError as err:
        if (problem := _stdout_problem(err, doc)) is None:
            raise
        raise problem from err


def _stopped(command: str, rc: int) -> CommandError:
    """The error of a command that ended with status `rc` and no result, its line already on stderr."""
    kind = "interrupted" if rc in (130, 143, 129) else "error"
    return CommandError(command, kind, f"frenzy {command} ended with status {rc} and no result; stderr's last line "
                          "says why" + (" and where it stopped" if kind == "interrupted" else ""), rc)


def _run(args: argparse.Namespace) -> int:
    if not getattr(args, "json", False):
        try:
            rc = args.fn(args)
        except OSError as err:  # a long table printed while the command ran, to a full stdout
            if _stdout_refuses() and (problem := _stdout_problem(err, finished=False)) is not None:
                raise problem from err
            raise
        _to_stdout(sys.stdout.flush)
        return rc
    holder = _Document()
    token = _document.set(holder)
    try:
        with _stdout_to_stderr():
            try:
                rc = args.fn(args)
            finally:
                _leave_ray()
    except SystemExit as stop:  # a signal's exit status (`submit` stopped by SIGTERM: 143), its line on stderr
        to_stdout_quietly(_stopped(args.command, stop.code if isinstance(stop.code, int) else 1))
        raise
    finally:
        _document.reset(token)
    if holder.doc is _UNSET and rc != 0:  # stopped (`submit`'s Ctrl-C: 130) with its line on stderr, no result
        holder.doc = _stopped(args.command, rc).to_json()
    if holder.doc is not _UNSET:
        text = json.dumps(holder.doc, indent=2, default=str) + "\n"
        _to_stdout(lambda: (sys.stdout.write(text), sys.stdout.flush()) and None, holder.doc)
    return rc


def run(args: argparse.Namespace) -> int:
    """Run the parsed command `args.fn`: its exit status; under --json exactly one document on stdout. The one
    error boundary: a user's error exits 2 with its message, a bug exits 1 with its traceback in a file, a closed
    pipe ends quietly (module docstring)."""
    command = getattr(args, "command", "?")
    if not _stdout_open():
        print(f"frenzy {command}: error: stdout is closed, so the answer has nowhere to go; redirect it instead "
              "(> FILE, or > /dev/null to discard it)", file=sys.stderr)
        return 2
    try:
        return _run(args)
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 - the boundary: every exception ends here
        return finish(command, err, as_json=getattr(args, "json", False))


def _stdout_open() -> bool:
    """Whether stdout can take the answer: the process was not started with fd 1 closed (`>&-`)."""
    if sys.stdout is None:
        return False
    try:
        os.fstat(sys.stdout.fileno())
    except io.UnsupportedOperation:  # an in-memory stream (a test, a notebook): open (an OSError too: test it first)
        return True
    except (OSError, ValueError):
        return False
    return True
