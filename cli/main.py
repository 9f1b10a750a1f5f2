"""The `frenzy` command: the table of commands and the entry point. A command's module (and with it torch, Prefect,
pandas, whatever the command needs) is imported only when that command runs: `frenzy --help` and the light commands
(`diagnose`, `plan`, `simulate`) start without the heavy stack. Every command that computes something takes `--json`
and then prints exactly one JSON document on stdout; without it, a table. Errors go through cli/output.py."""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module that defines it, one-line help), in the order of `frenzy --help`
    "plan": ("cli.plan", "Rank the GPU types and counts that can train a job (MARP)."),
    "memory": ("cli.plan", "Predict peak GPU memory of a job under one parallel layout."),
    "cluster": ("cli.cluster", "Show the cluster ledger; cordon or uncordon nodes; load nodes into it."),
    "simulate": ("cli.cluster", "Replay a job trace on a cluster under several placement policies."),
    "train": ("cli.train", "Train a job on this machine with asynchronous, verified checkpoints."),
    "checkpoints": ("cli.train", "List a checkpoint directory: committed steps, health, checksums."),
    "stragglers": ("cli.stragglers", "What-if analysis of a training op trace: the slowdown stragglers cost, "
                   "attributed to op types, stages, DP ranks and workers; or generate a synthetic trace."),
    "submit": ("cli.submit", "Run a job end to end: plan, place, train with evaluations of each checkpoint, "
               "straggler analysis, GPUs released; prints where the results are."),
    "demo": ("cli.submit", "The whole pipeline on this machine with embedded defaults, ending in a run report."),
    "diagnose": ("cli.diagnose", "The root cause of a failed training run from its log: failure type, category, rank "
                 "and node, whether a restart helps, what to do."),
    "eval-plan": ("cli.evaluate", "Plan an evaluation suite: naive vs prior-based elastic trials, predicted makespans "
                  "and the lower bound."),
    "evaluate": ("cli.evaluate", "Evaluate a committed checkpoint on a suite (preloading, GPU trials, CPU metric jobs, "
                 "elastic scheduling)."),
    "eval-datasets": ("cli.evaluate", "List the evaluation datasets (with prior costs) and built-in suites."),
    "tokenizer": ("cli.data", "Train a byte-level BPE tokenizer on local text, or show how one encodes."),
    "data": ("cli.data", "Tokenize a corpus (text, jsonl, parquet; local or s3://) into token shards."),
    "export": ("cli.data", "Export a checkpoint as a Hugging Face model directory (transformers loads it)."),
    "gpus": ("cli.catalog", "List the GPU catalog."),
    "presets": ("cli.catalog", "List the built-in model presets."),
}

Handler = Callable[[argparse.Namespace], int]


class UsageError(SystemExit):
    """A usage error argparse found (a missing, unknown or malformed argument), said on stderr as argparse says it
    (usage line, `PROG: error: MESSAGE`); exit status 2. `main` also prints it as the error document under --json."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors raise `UsageError` (each command's subparser is one too)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise UsageError(message)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with `only`, only the arguments of that command (none for "") are built, so only
    its module is imported (the other commands are listed by name and help)."""
    p = _Parser(prog="frenzy", description="Serverless LLM development on heterogeneous GPUs.")
    # `frenzy --json COMMAND ...` as well as `frenzy COMMAND ... --json`: its own dest, since a subparser's defaults
    # would overwrite a shared one; `main` folds it into the command's `json`.
    p.add_argument("--json", action="store_true", dest="json_before_command",
                   help="print one JSON document on stdout (also accepted after the command)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {}
    for name, (_, help_) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        parsers[name] = sp
    wanted = list(COMMANDS) if only is None else [only] if only in COMMANDS else []
    for module in dict.fromkeys(COMMANDS[name][0] for name in wanted):

        def add(name: str, fn: Handler, _module: str = module) -> argparse.ArgumentParser:
            if COMMANDS.get(name, ("",))[0] != _module:
                raise KeyError(f"{_module} defines `{name}`, which cli.main.COMMANDS does not list under it")
            parsers[name].set_defaults(fn=fn)
            return parsers[name]

        importlib.import_module(module).add_commands(add)
    return p


def _command(argv: Sequence[str]) -> str:
    """The command named in `argv` (its first word that is not an option), or "" when it names none."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else ""


def entry() -> int:
    """The `frenzy` console script and `python -m cli`: `main`, then exit without the interpreter's final collections
    over every module the command imported (2-3 s of one core after a command that imported torch; as
    tasks/quickexit.py's exit_now, which is not imported here: `frenzy --help` imports nothing of tasks/)."""
    if command := _command(sys.argv[1:]):  # every command imports cli/output.py anyway; `frenzy --help` does not
        from cli.output import stop_on_signals

        stop_on_signals(command)  # `submit`'s SIGTERM in its first seconds ends with its line too
    code = main()
    gc.freeze()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # the command's module is imported here (torch, Prefect): the error boundary covers it too (red team 41i N10)
        parser = build_parser(_command(argv))
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 - cli/output.py's boundary decides what it is
        from cli.output import finish

        return finish(_command(argv) or "", err, as_json="--json" in argv)
    try:
        args = parser.parse_args(argv)
    except UsageError as err:  # under --json, the same error document as every other failure (kind "usage")
        if "--json" in argv:
            from cli.output import CommandError, to_stdout_quietly

            command = _command(argv)
            helps = f"frenzy {command} --help" if command else "frenzy --help"
            to_stdout_quietly(CommandError(command, "usage", f"{err.message}; `{helps}` lists the arguments", 2))
        raise  # exit status 2 as argparse's own SystemExit (a caller of `main` sees the same exception as before)
    args.json = bool(getattr(args, "json", False) or args.json_before_command)
    from cli.output import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
