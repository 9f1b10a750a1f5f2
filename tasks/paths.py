"""Where a run's files are. Every path a job or a request names is made absolute once, where it is submitted: a path
in a job file is relative to the job file (as a user reads it), a flag's path to the directory the command runs in,
and a path in a request that arrives from a form, with no directory of its own, to the data root ($FRENZY_DATA, else
~/.frenzy/data), never to a worker's working directory. Remote URIs (s3://) and names (a preset, a built-in suite,
`byte`) are left as they are. Resolving twice changes nothing. A relative path resolved against the data root may not
leave it (`../x`): the root is shared by every user of a server, so such a path is refused naming its field (an
absolute path is allowed: it says where it goes)."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.errors import FrenzyError
from tasks.jobspec import JobSpec


def data_root() -> Path:
    """Where runs submitted without a directory of their own (a form, a schedule) keep their files."""
    return Path(os.environ.get("FRENZY_DATA") or Path(os.environ.get("FRENZY_HOME", "~/.frenzy")) / "data").expanduser()


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


class PathError(FrenzyError, ValueError):
    """A path in a request that may not be used as given."""


def absolute(path: str, base: Path, field: str = "a path") -> str:
    """`path` (a plain path or a file:// URI) made absolute against `base`; a remote URI unchanged. Relative to the
    data root, it must stay inside it (module docstring): `field` names it in the refusal."""
    if is_remote(path):
        return path
    is_uri = path.startswith("file://")
    p = Path(path.removeprefix("file://")).expanduser()
    relative = not p.is_absolute()
    p = base / p if relative else p
    text = os.path.normpath(p)
    if relative:
        _stay_inside_data_root(path, text, base, field)
    return f"file://{text}" if is_uri else text


def _stay_inside_data_root(given: str, text: str, base: Path, field: str) -> None:
    root = os.path.normpath(data_root().absolute())
    if os.path.normpath(base.absolute()) == root and os.path.commonpath([root, text]) != root:
        raise PathError(f"{field} {given!r} leaves the data root {root} (a form's relative paths are relative to it, "
                        f"and the server's users share it; it would be {text}): give a path inside the data root, or "
                        "an absolute path if it is meant to be elsewhere")


def path_like(value: str, suffixes: tuple[str, ...] = (".yaml", ".yml")) -> bool:
    """A name (preset, built-in suite) or a path? Paths contain a separator or end in one of `suffixes`."""
    return "/" in value or value.startswith(("~", ".")) or value.endswith(suffixes)


def job_dir(job_file: str | Path) -> Path:
    """The directory a job file's relative paths start from: the file's own directory as the file system has it
    (symbolic links in the directory's path followed), so `../data` means one place whether the command runs in that
    directory (whose working directory the OS gives physically) or names the file through a link."""
    return Path(os.path.realpath(Path(job_file).absolute().parent))


def resolve_job(job: JobSpec, base: Path, run_dir: Path) -> JobSpec:
    """`job` with every path made absolute against `base` (the job file's directory), and its checkpoints, where the
    job names no place for them, under the run directory (`<run_dir>/ckpt`)."""
    job = job.model_copy(deep=True)
    if job.model.hf:
        job.model.hf = absolute(job.model.hf, base, "model.hf")
    d = job.training.data
    if d.path:
        d.path = absolute(d.path, base, "training.data.path")
    if d.tokenizer and d.tokenizer != "byte":
        d.tokenizer = absolute(d.tokenizer, base, "training.data.tokenizer")
    ck = job.training.checkpoint
    ck.uri = absolute(ck.uri, base, "training.checkpoint.uri") if ck.uri else f"file://{run_dir / 'ckpt'}"
    if job.evaluation and path_like(job.evaluation.suite):
        job.evaluation.suite = absolute(job.evaluation.suite, base, "evaluation.suite")
    return job


def place_key(uri: str, base: Path | None = None) -> str:
    """One spelling of the place `uri` names, for comparing roots and step URIs: a plain path (absolute, or relative
    to `base`, else to the working directory) and a file:// URI of the same directory give the same key (file://,
    normalised, no trailing slash); a remote URI loses only its trailing slashes. Every comparison of checkpoint roots
    or step URIs goes through here, so a job whose `checkpoint.uri` is `ck`, `./ck/`, `/abs/ck`, `file:///abs/ck` or a
    symbolic link to that directory is matched against the commit events (always file://) and the score history
    alike: symbolic links are followed (a link to another user's root is that root)."""
    if is_remote(uri):
        return uri.rstrip("/")
    return "file://" + os.path.realpath(absolute(uri.removeprefix("file://") or ".", base or Path.cwd()))
