"""Where a run's files are. Every path a job or a request names is made absolute once, where it is submitted: a path
in a job file is relative to the job file (as a user reads it), a flag's path to the directory the command runs in,
and a path in a request that arrives from a form, with no directory of its own, to the data root ($FRENZY_DATA, else
~/.frenzy/data), never to a worker's working directory. Remote URIs (s3://) and names (a preset, a built-in suite,
`byte`) are left as they are. Resolving twice changes nothing. A relative path resolved against the data root may not
leave it (`../x`): the root is shared by every user of a server, so such a path is refused naming its field (an
absolute path is allowed: it says where it goes).

Every path field goes through `absolute`, which also: expands `~` and environment variables (`$HOME/ck`, `${USER}`)
as a shell would, in the environment of the process that resolves it (the submitter's for `frenzy submit` and a
notebook, the worker's for a form); a variable that is not set, or a shell expression (`${X:-d}`), is refused naming
the field, never left as a literal directory named `$HOME`; and refuses a local path longer than the file system
allows (a name past NAME_MAX, the path past PATH_MAX, less room for the files Frenzy writes inside a directory it
fills), naming the field and the limit, before anything is planned or placed."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.jobspec import JobSpec
from tasks.pathvars import PathError, expand_vars, frenzy_home


def data_root() -> Path:
    """Where runs submitted without a directory of their own (a form, a schedule) keep their files."""
    return (Path(os.environ["FRENZY_DATA"]).expanduser().absolute() if os.environ.get("FRENZY_DATA") else frenzy_home() / "data")


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


FILLED = ("training.checkpoint.uri", "run_dir", "history_dir", "out_dir")
"""Fields naming a directory Frenzy writes files into: they keep ROOM bytes of the path limit for those files."""
ROOM = 200
"""Bytes a directory Frenzy fills keeps for its own names (`step_00000010/model-rank00000.safetensors.tmp-...`)."""


def _short(text: str) -> str:
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]} ({len(os.fsencode(text)):,} bytes)"


def _limits(text: str) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) of the file system that holds `text`, or would (its nearest existing directory)."""
    p = Path(text)
    while p != p.parent:
        try:
            if p.is_dir():
                break
        except OSError:  # ENAMETOOLONG itself, a loop: look further up
            pass
        p = p.parent
    try:
        return os.pathconf(p, "PC_NAME_MAX"), os.pathconf(p, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 255, 4096


def check_length(text: str, field: str) -> None:
    """Refuse a local path the file system cannot hold (module docstring), naming `field` and the limit once."""
    name_max, path_max = _limits(text)
    for part in Path(text).parts:
        if len(os.fsencode(part)) > name_max:
            raise PathError(f"{field}: a name in it is {len(os.fsencode(part)):,} bytes long ({_short(part)}), past the "
                            f"file system's limit of {name_max} bytes per name: give a shorter name")
    room = ROOM if field in FILLED else 0
    if len(os.fsencode(text)) + room >= path_max:
        kept = f" (less {room} for the files Frenzy writes inside)" if room else ""
        raise PathError(f"{field} is too long for the file system: {_short(text)}, past the limit of {path_max} bytes "
                        f"for a whole path{kept}: give a shorter path")


def absolute(path: str, base: Path, field: str = "a path") -> str:
    """`path` (a plain path or a file:// URI) made absolute against `base`, `~` and environment variables expanded,
    its length checked; a remote URI only expanded. Relative to the data root, it must stay inside it (module
    docstring): `field` names it in the refusals."""
    path = file_url(expand_vars(path, field), field)
    if is_remote(path):
        return path
    text = _joined(path, base, field)
    check_length(text.removeprefix("file://"), field)
    return text


def file_url(path: str, field: str = "a path") -> str:
    """A file URL without an authority read as RFC 8089 reads it: `file:/abs/ck` is `file:///abs/ck`; `file:ck`
    (no slash: no file URL at all) is refused, never taken as a directory named `file:ck` (red team 41i N16)."""
    if not path.startswith("file:") or path.startswith("file://"):
        return path
    rest = path.removeprefix("file:")
    if rest.startswith("/"):
        return f"file://{rest}"
    raise PathError(f"{field} {path!r} is not a file URL (RFC 8089: file:/ABSOLUTE or file:///ABSOLUTE): write the "
                    f"path itself ({rest!r}, relative to the job file) or file:///ABSOLUTE/PATH")


def _joined(path: str, base: Path, field: str) -> str:
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
    if job.model.hf:  # a copy with the path, not an assignment: that would re-run the shape validators on a
        # partial model (red team 41k D4: an HF-imported model could not start training)
        job.model = job.model.model_copy(update={"hf": absolute(job.model.hf, base, "model.hf")})
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
    # no expansion here: a recorded root is compared as it was written
    return "file://" + os.path.realpath(_joined(uri.removeprefix("file://") or ".", base or Path.cwd(), "a root"))
