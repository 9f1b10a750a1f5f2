"""`frenzy diagnose LOG`: the root cause of a failed run from its log (tasks/diagnosis)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict

from cli.argtypes import bounded_int
from cli.output import emit
from tasks.errors import FrenzyError

_VIA = {"chain": "the cause inside a wrapper: the wrapper line is among the symptoms",
        "progress": "read off the progress lines: the loss turned NaN/inf here and stayed so, with no error line",
        "truncated": "lower confidence: the log ends inside a traceback, before its exception line; this is its last "
                     "frame",
        "named": "lower confidence: no rule knows this line; read off its shape (an exception, a fatal check, a "
                 "signal or exit status, an ERROR log line)"}


def cmd_diagnose(args: argparse.Namespace) -> int:
    from tasks.diagnosis.compress import compress
    from tasks.diagnosis.diagnose import check_log, diagnose_compressed

    if args.retrain_fallback:
        from tasks.diagnosis.fallback import train

        fit = train()
        emit(args, fit.to_json(), lambda: f"learned fallback retrained on {fit.examples} labelled logs: threshold "
             f"{fit.threshold}, held-out projects answered {fit.held_out_answered}, right "
             f"{fit.held_out_right}; written to {fit.path}")
        return 0
    if args.log is None:
        raise FrenzyError("give the run's log (e.g. frenzy diagnose RUN_DIR/train.log), or --retrain-fallback")
    p = check_log(args.log)
    if args.show:
        c = compress(p, context=args.context)
        emit(args, {"log": str(p), "kept": [{"line_no": k.line_no, "error": k.error, "text": k.text} for k in c.kept]},
             lambda: "\n".join(f"{k.line_no:>9} {'!' if k.error else ' '} {k.text}" for k in c.kept))
        return 0
    agent = None
    if args.agent:
        from tasks.diagnosis.agent import config_from_env

        agent = config_from_env()
        if agent is None:
            raise FrenzyError("--agent: set FRENZY_DIAGNOSIS_LLM_URL (an OpenAI-compatible API, e.g. "
                             "http://localhost:8000/v1) and FRENZY_DIAGNOSIS_LLM_MODEL")
    d = diagnose_compressed(compress(p, context=args.context), log=str(p), agent=agent)

    def human() -> str:
        where = ", ".join(x for x in (f"rank {d.rank}" if d.rank is not None else "",
                                      f"node {d.node}" if d.node else "") if x)
        how = f" [learned, similarity {d.confidence:.2f}]" if d.source == "learned" else ""
        lines = [f"{d.type} ({d.category}){' on ' + where if where else ''}: "
                 f"{'restartable' if d.restartable else 'not restartable'}{how}"]
        if d.root_cause_line:
            lines.append(f"  root cause, line {d.line_no}: {d.root_cause_line}")
        if d.via in _VIA:
            lines.append(f"  ({_VIA[d.via]})")
        lines.append(f"  do: {d.mitigation}")
        if d.evidence:
            kinds: dict[str, int] = {}
            for e in d.evidence:
                kinds[e.type] = kinds.get(e.type, 0) + 1
            lines.append("  symptoms: " + ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items(), key=lambda x: -x[1])))
        lines.append(f"  log: {d.lines:,} lines, {d.kept_lines:,} kept ({d.compression_ratio:.0f}x smaller); "
                     "--show prints them")
        return "\n".join(lines)

    emit(args, asdict(d), human)
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    sp = add("diagnose", cmd_diagnose)
    sp.add_argument("log", nargs="?",
                    help="the run's log (e.g. RUN_DIR/train.log, a torchrun or Slurm output file)")
    sp.add_argument("--context", type=bounded_int(0, 100), default=2, help="lines kept before each error line (2)")
    sp.add_argument("--show", action="store_true", help="print the compressed log (error lines marked !) instead")
    sp.add_argument("--agent", action="store_true",
                    help="ask the LLM agent (FRENZY_DIAGNOSIS_LLM_URL) when no rule matches; it learns a rule")
    sp.add_argument("--retrain-fallback", action="store_true",
                    help="rebuild the learned fallback (tasks/diagnosis/fallback_model.json) from the labelled "
                         "real logs' tune half, the generated corpus and the red-team sets "
                         "(tests/data/diagnosis/redteam4..17), and recalibrate its threshold (leaving whole projects "
                         "and sets out)")
