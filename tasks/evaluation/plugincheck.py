"""The installed dataset plugins (`frenzy.eval_datasets` entry points) as `frenzy eval-datasets` lists them.

Listing reads the packages' metadata only (each entry point's name, `module:attr` and distribution): no plugin's code
runs, so one that kills its process group or hangs when imported cannot break the listing. `--check` imports each one
in a process of its own session (`python -m tasks.evaluation.plugincheck NAME`), all at once, each under a deadline
(the plugin deadline, `plugin_timeout_s`'s default): one that fails, dies or hangs is named with its cause, the others
are listed with their mode and prior costs, and the listing itself never fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from tasks.procs import exit_words

GROUP = "frenzy.eval_datasets"  # datasets.ENTRY_POINTS (not imported here: the child imports only what it checks)


@dataclass(frozen=True)
class EntryPlugin:
    """An installed dataset plugin, from its package's metadata."""

    name: str
    value: str
    """`module:attr`, the factory the entry point names."""
    distribution: str
    """The package that declares it (`?` when the metadata does not say)."""


@dataclass(frozen=True)
class PluginCheck:
    """What importing one plugin in a process of its own gave: its class attributes, or why it could not."""

    attrs: dict
    """`mode`, `description`, `prior_infer_s_per_example`, `prior_metric_s_per_example` (those the factory has)."""
    problem: str
    """Empty when it imported; else what happened, naming the fix where there is one."""


def entry_plugins() -> list[EntryPlugin]:
    """Every `frenzy.eval_datasets` entry point, by name, from metadata only."""
    out = []
    for ep in entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        out.append(EntryPlugin(ep.name, ep.value, getattr(dist, "name", None) or "?"))
    return sorted(out, key=lambda p: p.name)


def check_plugins(plugins: list[EntryPlugin], timeout_s: float) -> dict[str, PluginCheck]:
    """Import each of `plugins` in a process of its own session, all at once; each one's result by name."""
    if not plugins:
        return {}
    with ThreadPoolExecutor(len(plugins), thread_name_prefix="plugincheck") as pool:
        return dict(zip((p.name for p in plugins), pool.map(lambda p: _check(p, timeout_s), plugins), strict=True))


def _check(p: EntryPlugin, timeout_s: float) -> PluginCheck:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "tasks.evaluation.plugincheck", p.name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.communicate()
        return PluginCheck({}, f"{p.value}: hung while importing (no answer in {timeout_s:g}s; its process group was "
                               "killed); if it only needs longer, give --plugin-timeout-s")
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if proc.returncode == 0 and lines:
        doc = json.loads(lines[-1])
        return PluginCheck(doc.get("attrs", {}), doc.get("problem", ""))
    tail = " | ".join(err.strip().splitlines()[-2:])
    return PluginCheck({}, f"{p.value}: its import process {exit_words(proc.returncode)}" + (f": {tail}" if tail else ""))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_ATTRS = ("mode", "description", "prior_infer_s_per_example", "prior_metric_s_per_example")


def _load(name: str) -> dict:
    """The child: load entry point `name`; its factory's class attributes, or the problem."""
    ep = next(iter(entry_points(group=GROUP, name=name)), None)
    if ep is None:
        return {"problem": f"no entry point {name} in group {GROUP}"}
    try:
        f = ep.load()
    except Exception as err:  # noqa: BLE001 - named in the listing, not raised
        return {"problem": f"{ep.value}: {type(err).__name__}: {err}"}
    cls = f if isinstance(f, type) else None
    return {"attrs": {a: getattr(cls, a) for a in _ATTRS if cls is not None and hasattr(cls, a)}}


if __name__ == "__main__":
    answers = os.fdopen(os.dup(1), "w")  # the plugin's own prints go to stderr, the answer alone to stdout
    os.dup2(2, 1)
    answers.write(json.dumps(_load(sys.argv[1]), default=str) + "\n")
    answers.flush()
    os._exit(0)  # no interpreter shutdown: a plugin's own threads cannot hold the answer back
