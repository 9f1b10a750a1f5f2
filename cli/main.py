"""The `frenzy` command: the parser, built from one module per command group, and the entry point. Every command
that computes something takes `--json` and then prints exactly one JSON document on stdout; without it, a table.
Errors go to stderr with exit status 2 and name the fix (cli/output.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from cli import catalog, cluster, data, diagnose, evaluate, plan, stragglers, submit, train
from cli.output import run

# the order of `frenzy --help`
GROUPS = (plan, cluster, train, stragglers, submit, diagnose, evaluate, data, catalog)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="frenzy", description="Serverless LLM development on heterogeneous GPUs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        sp.set_defaults(fn=fn)
        return sp

    for group in GROUPS:
        group.add_commands(add)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
