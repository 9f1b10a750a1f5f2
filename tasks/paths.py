"""Where a run's files are. Every path a job or a request names is made absolute once, where it is submitted: a path
in a job file is relative to the job file (as a user reads it), a flag's path to the directory the command runs in,
and a path in a request that arrives from a form, with no directory of its own, to the data root ($FRENZY_DATA, else
~/.frenzy/data), never to a worker's working directory. Remote URIs (s3://) and names (a preset, a built-in suite,
`byte`) are left as they are. Resolving twice changes nothing."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.jobspec import JobSpec


def data_root() -> Path:
    """Where runs submitted without a directory of their own (a form, a schedule) keep their files."""
    return Path(os.environ.get("FRENZY_DATA") or Path(os.environ.get("FRENZY_HOME", "~/.frenzy")) / "data").expanduser()


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def absolute(path: str, base: Path) -> str:
    """`path` (a plain path or a file:// URI) made absolute against `base`; a remote URI unchanged."""
    if is_remote(path):
        return path
    is_uri = path.startswith("file://")
    p = Path(path.removeprefix("file://")).expanduser()
    p = p if p.is_absolute() else base / p
    text = os.path.normpath(p)
    return f"file://{text}" if is_uri else text


def path_like(value: str, suffixes: tuple[str, ...] = (".yaml", ".yml")) -> bool:
    """A name (preset, built-in suite) or a path? Paths contain a separator or end in one of `suffixes`."""
    return "/" in value or value.startswith(("~", ".")) or value.endswith(suffixes)


def resolve_job(job: JobSpec, base: Path, run_dir: Path) -> JobSpec:
    """`job` with every path made absolute against `base` (the job file's directory), and its checkpoints, where the
    job names no place for them, under the run directory (`<run_dir>/ckpt`)."""
    job = job.model_copy(deep=True)
    if job.model.hf:
        job.model.hf = absolute(job.model.hf, base)
    d = job.training.data
    if d.path:
        d.path = absolute(d.path, base)
    if d.tokenizer and d.tokenizer != "byte":
        d.tokenizer = absolute(d.tokenizer, base)
    ck = job.training.checkpoint
    ck.uri = absolute(ck.uri, base) if ck.uri else f"file://{run_dir / 'ckpt'}"
    if job.evaluation and path_like(job.evaluation.suite):
        job.evaluation.suite = absolute(job.evaluation.suite, base)
    return job


def place_key(uri: str, base: Path | None = None) -> str:
    """One spelling of the place `uri` names, for comparing roots and step URIs: a plain path (absolute, or relative
    to `base`, else to the working directory) and a file:// URI of the same directory give the same key (file://,
    normalised, no trailing slash); a remote URI loses only its trailing slashes. Every comparison of checkpoint roots
    or step URIs goes through here, so a job whose `checkpoint.uri` is `ck`, `./ck/`, `/abs/ck` or `file:///abs/ck`
    is matched against the commit events (always file://) and the score history alike."""
    if is_remote(uri):
        return uri.rstrip("/")
    return "file://" + absolute(uri.removeprefix("file://") or ".", base or Path.cwd())
