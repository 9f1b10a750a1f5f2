"""The one error type a user can act on. Every failure caused by the user's input or environment (a job file, a
path, a cluster file, a full disk) is a `FrenzyError` whose message names the input and the fix: the CLI prints it
and exits 2. Anything else that escapes a command is a bug: the CLI says so, writes the traceback to a file and
exits 1 (cli/output.py). A leaf module: it imports nothing of the project, so every layer may raise these.

Errors of the machine rather than of the input (a full disk, a read-only file system, no permission, a symlink
loop) arrive as `OSError`s; `environment_problem` names them as what they are, and `retry_cannot_fix` tells a retry
loop which of them no retry can fix (a full disk stays full for the seconds a backoff waits)."""

from __future__ import annotations

import errno
import os


class FrenzyError(Exception):
    """A failure the user can fix; the message names the input (file, field, line) and the fix."""


class EnvironmentProblem(FrenzyError):
    """The machine refused (disk full, read-only, permission, symlink loop, ...); the message says which and where."""


_WHAT: dict[int, str] = {
    errno.ENOSPC: "no space left on the device (the disk is full): free space there or write somewhere else",
    errno.EDQUOT: "the disk quota is exhausted: free space or write somewhere else",
    errno.EFBIG: "file too large: past the file-size limit of this process (ulimit -f) or of the file system; raise "
                 "the limit or write somewhere else",
    errno.EROFS: "is on a read-only file system: give a writable location",
    errno.EACCES: "permission denied: check its owner and mode, or give a path you may use",
    errno.EPERM: "operation not permitted: check its owner and mode, or give a path you may use",
    errno.ELOOP: "is a symlink loop (a link that leads back to itself): fix or remove the link",
    errno.ENAMETOOLONG: "the name is too long for the file system: give a shorter path",
    errno.ENOENT: "no such file or directory: check the path",
    errno.ENOTDIR: "is a file; give a directory (every part of the path must be one)",
    errno.EISDIR: "is a directory; give a file",
    errno.EEXIST: "exists already: remove it or give another path",
    errno.ENOTEMPTY: "is a directory that is not empty: give another path",
    errno.EMFILE: "too many open files in this process: raise the limit (ulimit -n)",
    errno.ENFILE: "too many open files on this machine: close some or raise the system limit",
    errno.EIO: "an I/O error of the device (a failing disk or a lost network file system): check the storage",
    errno.ESTALE: "a stale network file system handle: remount it or give a local path",
    errno.ENXIO: "no such device (a FIFO without a reader, or a device that is gone)",
    errno.ENODEV: "no such device",
    errno.ETXTBSY: "the file is busy (an executable being run): give another path",
    errno.EBUSY: "the device or resource is busy: try again when it is free, or give another path",
    errno.EXDEV: "crosses file systems where a rename cannot: give a path on the same file system",
}

RETRY_CANNOT_FIX = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                              errno.ELOOP, errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EXDEV})
"""Errnos a retry with backoff cannot fix: the disk stays full, the mount read-only, the mode the same."""


def environment_problem(err: BaseException) -> str | None:
    """`FILE: what happened and the fix` for an OSError of the machine (module docstring); None for others."""
    if not isinstance(err, OSError) or err.errno not in _WHAT:
        return None
    where = err.filename if err.filename is not None else ""
    if err.filename2 is not None:
        where = f"{where} -> {err.filename2}"
    return f"{where}: {_WHAT[err.errno]}" if where else _WHAT[err.errno]


def causes(err: BaseException | None) -> list[BaseException]:
    """`err` and the errors it was raised from or during, outermost first (each once)."""
    chain: list[BaseException] = []
    e = err
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def unfixable_oserror(err: BaseException | None) -> OSError | None:
    """The OSError no retry can fix (disk full, read-only, permission) that is `err` or one of its causes (a
    `StorageError` raised from it); None when there is none."""
    return next((e for e in causes(err) if isinstance(e, OSError) and e.errno in RETRY_CANNOT_FIX), None)


def retry_cannot_fix(err: BaseException) -> bool:
    """True for an OSError (also one under `err` as its cause) no retry can fix: disk full, read-only, permission."""
    return unfixable_oserror(err) is not None


def as_frenzy_error(err: OSError, what: str) -> FrenzyError:
    """An OSError met while doing `what` (e.g. "writing the evaluation results") as an `EnvironmentProblem`."""
    text = environment_problem(err) or f"{err.filename or ''}: {err.strerror or err}"
    return EnvironmentProblem(f"{what}: {text}")


def user_message(err: BaseException) -> str | None:
    """What to tell the user about `err` when it is theirs to fix: a `FrenzyError`'s message, an invalid request
    (a pydantic ValidationError of the fields a user gave) by field, or an error of the machine (a full disk, a
    read-only file system: `environment_problem`); None when `err` is a bug."""
    if isinstance(err, FrenzyError):
        return str(err)
    if type(err).__name__ == "ValidationError" and hasattr(err, "errors") and hasattr(err, "title"):
        lines = [f"invalid {err.title}:"]
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
            lines.append(f"  {loc}: {e['msg'].removeprefix('Value error, ')} (got {str(e.get('input'))[:80]!r})")
        return "\n".join(lines)
    return environment_problem(err) or memory_problem(err) or unreachable_api(err)


NO_MEMORY = ("failed to map segment", "cannot allocate memory", "out of memory", "std::bad_alloc")
"""Text of a refused allocation (a shared library's mapping, glibc's thread-local data, C++'s bad_alloc), lower case."""


def memory_problem(err: BaseException) -> str | None:
    """A MemoryError, or an import or allocation the kernel refused for want of memory (ENOMEM; a shared library's
    "failed to map segment"), anywhere in `err`'s causes: named with this process's memory limit and the fix (the
    environment's to fix, not a bug); None for other errors. A CUDA out-of-memory is not this: its text names CUDA."""
    hit = next((c for c in causes(err) if isinstance(c, MemoryError) or (isinstance(c, OSError) and c.errno == errno.ENOMEM)
                or (isinstance(c, ImportError | OSError) and any(w in str(c).lower() for w in NO_MEMORY)
                    and "cuda" not in str(c).lower())), None)
    if hit is None:
        return None
    said = f"{type(hit).__name__}: {str(hit).splitlines()[0] if str(hit) else 'no memory'}"[:200]
    import resource

    limits = [(name, flag, resource.getrlimit(res)[0]) for name, flag, res in
              (("address-space", "-v", resource.RLIMIT_AS), ("data-segment", "-d", resource.RLIMIT_DATA))]
    set_ = [(n, f, v) for n, f, v in limits if v != resource.RLIM_INFINITY]
    if set_:
        n, f, v = set_[0]
        return (f"out of memory under this process's {n} limit (`ulimit {f}` = {v // 1024:,} KiB): {said}. torch, its "
                f"threads and the trainer's batches need more than that: raise the limit (`ulimit {f} unlimited`) or run "
                "where it is higher")
    return (f"out of memory: {said}. The machine (or this job's cgroup) has no more memory for this process: free "
            "some, or run it with more memory")


_CONNECT_ERRORS = ("ConnectError", "ConnectTimeout", "ConnectionRefusedError", "PoolTimeout")


def unreachable_api(err: BaseException) -> str | None:
    """The Prefect API (PREFECT_API_URL) does not answer: Prefect's "Failed to reach API at URL", or a connection
    error (httpx's ConnectError, a refused connection) of a request to that URL, anywhere in `err`'s causes. A
    configuration of the user's (the URL, or a server not started), not a bug: named with its URL and the fix. Names
    only the types, so this module stays a leaf."""
    api = os.environ.get("PREFECT_API_URL", "")
    chain: list[BaseException] = []
    e: BaseException | None = err
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        e = e.__cause__ or e.__context__
    base = api.rstrip("/")
    for e in chain:  # a server answered 404 to the version request, or to any request under a URL without `/api`
        target = _request_url(e)  # (under the API's URL, a 404 is an object not found: not this)
        no_api = not base.endswith("/api") and "prefect.cloud" not in base  # Cloud's workspace URLs end otherwise
        if (type(e).__name__.endswith("HTTPStatusError") and getattr(getattr(e, "response", None), "status_code", 0) == 404
                and api and (target == f"{base}/admin/version" or (no_api and target.startswith(base)))):
            return api_not_found(api, target)
    for e in chain:
        text = str(e)
        url = text.split("Failed to reach API at ", 1)[1].rstrip(".") if "Failed to reach API at " in text else ""
        target = _request_url(e)
        if url or (type(e).__name__ in _CONNECT_ERRORS and api and (not target or target.startswith(api.rstrip("/")))):
            return nothing_answers(url or api, chain[-1], api_set=bool(api))
    return None


def _request_url(e: BaseException) -> str:
    """The URL of the request an httpx error was raised for ("" when none): httpx keeps it as `_request`."""
    request = getattr(e, "_request", None)
    return str(getattr(request, "url", "")) if request is not None else ""


_API_FIX = ("point PREFECT_API_URL at the server's API (`prefect config set PREFECT_API_URL=http://HOST:4200/api`), "
            "or unset PREFECT_API_URL to run on the embedded API of this process")


def nothing_answers(api: str, root: BaseException | str, api_set: bool = True) -> str:
    """No server answers at `api` (a refused connection, a timeout): the URL or the server is wrong."""
    cause = root if isinstance(root, str) else f"{type(root).__name__}: {str(root).splitlines()[0] if str(root) else 'no reply'}"
    return (f"cannot reach the Prefect API at {api} (PREFECT_API_URL{'' if api_set else ' is not set'}): nothing "
            f"answers there ({cause}). Start the server (`prefect server start`) and {_API_FIX}")


def api_not_found(api: str, tried: str, api_answers: str = "") -> str:
    """A server answered 404 at `tried` under PREFECT_API_URL=`api`: a web server is there, but not Prefect's API at
    that path (most often the URL lacks its `/api`). `api_answers`: the URL found to answer instead."""
    fix = (f"set PREFECT_API_URL={api_answers} (that URL answers)" if api_answers else
           f"the URL probably lacks `/api` (e.g. PREFECT_API_URL={api.rstrip('/')}/api); {_API_FIX}")
    return f"the Prefect API is not at {api} (PREFECT_API_URL): a server answered 404 Not Found at {tried}: {fix}"
