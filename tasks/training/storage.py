"""Checkpoint storage behind one small interface: a local directory (fsync'd) or any fsspec URL (s3:// via s3fs).

Writes stream chunks to the store and hash them (sha256 of the whole object, in order): in one thread, or with
`threads` > 1 while a second thread hashes (locally with more threads writing byte ranges at once), are retried
whole with backoff when the store fails for a while (but not when no retry can help: a full disk, a read-only
mount, a permission, missing credentials), and the manifest is written create-only (O_EXCL locally, If-None-Match
on S3) so two writers can never both commit the same step.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from tasks.errors import FrenzyError, environment_problem, retry_cannot_fix
from tasks.userfiles import UserFileError, path_kind

log = logging.getLogger("frenzy.storage")
T = TypeVar("T")


class StorageError(FrenzyError, RuntimeError):
    """The store kept failing past the retry budget; the message names the URI and the last error."""


class NotAFile(StorageError):
    """A key that is not a regular file (a FIFO, a device, a directory: reading it could block for ever) or is
    larger than such an object can be."""


class AlreadyExists(FileExistsError):
    """A create-only write found the key already there."""


# errors that a retry cannot fix: missing or unusable credentials, permissions, a path of the wrong kind
_PERMANENT = (PermissionError, IsADirectoryError, NotADirectoryError)
_PERMANENT_NAMES = {"NoCredentialsError", "PartialCredentialsError", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                    "AccessDenied", "NoSuchBucket", "InvalidBucketName"}


def _permanent(err: BaseException) -> bool:
    return isinstance(err, _PERMANENT) or retry_cannot_fix(err) or \
        any(type(e).__name__ in _PERMANENT_NAMES or any(n in str(e) for n in _PERMANENT_NAMES)
            for e in (err, err.__cause__, err.__context__) if e is not None)


def _retry(what: str, fn: Callable[[], T], attempts: int, backoff_s: float) -> T:
    delay = backoff_s
    for i in range(attempts):
        try:
            return fn()
        except (AlreadyExists, FileNotFoundError, EOFError, FrenzyError):
            raise  # a missing object, one whose size is wrong (corrupt) or not a file: the caller decides
        except MemoryError:
            raise  # this process's memory, not the store's: the error boundary names the limit and the fix
        except Exception as err:  # noqa: BLE001 - any store error is retried, then surfaced with its text
            if _permanent(err):
                machine = environment_problem(err)
                if machine is not None:  # a full disk, a read-only mount: say so, not "check the credentials"
                    raise StorageError(f"{what}: {machine} (not retried: retrying cannot fix this)") from err
                raise StorageError(f"{what}: {err!r}; retrying cannot fix this: check the credentials "
                                   "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), the bucket and permissions") from err
            if i == attempts - 1:
                raise StorageError(f"{what}: failed {attempts} times; last error: {err!r}. Check the endpoint "
                                   "and credentials, or raise FRENZY_STORAGE_RETRIES") from err
            log.warning("%s failed (%s); retry %d/%d in %.1fs", what, err, i + 1, attempts - 1, delay)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)
    raise AssertionError("unreachable")


class _Hasher:
    """The sha256 of the chunks fed to it, in their order. `threaded`: computed by a thread of its own while the
    caller writes them (hashlib releases the GIL for updates of more than 2047 bytes, so hashing and writing run at
    once); else at once in `feed`. The digest is the same as hashing the bytes in one go."""

    def __init__(self, threaded: bool = True, depth: int = 16) -> None:
        self._q: queue.Queue[memoryview | None] = queue.Queue(depth)
        self._h = hashlib.sha256()
        self._error: BaseException | None = None
        self._aborted = False
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._run, daemon=True, name="frenzy-persist-hash")
            self._thread.start()

    def _run(self) -> None:
        while (c := self._q.get()) is not None:
            if self._error is None and not self._aborted:
                try:
                    self._h.update(c)
                except BaseException as err:  # noqa: BLE001 - raised by close() in the writer's thread
                    self._error = err

    def feed(self, chunk: memoryview) -> None:
        if self._thread is None:
            self._h.update(chunk)
        else:
            self._q.put(chunk)

    def close(self) -> str:
        """The hex digest, once every chunk fed was hashed."""
        self._end()
        if self._error is not None:
            raise self._error
        return self._h.hexdigest()

    def abort(self) -> None:
        """The write failed: skip what is queued and end the thread."""
        self._aborted = True
        self._end()

    def _end(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(f"pwrite wrote nothing at offset {offset}")
        view, offset = view[n:], offset + n


def _write_file(path: Path, chunks: Iterable[memoryview], hasher: _Hasher, writers: int) -> int:
    """Write `chunks` to `path` (created or truncated) and fsync it, feeding each chunk to `hasher` before it is
    written; `writers` > 1 writes them at their offsets from a pool, at most 2 per writer queued. Returns the bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        off = 0
        if writers <= 1:
            for c in chunks:
                hasher.feed(c)  # threaded: hashed while written; else now, in this thread
                _pwrite_all(fd, c, off)
                off += memoryview(c).nbytes
        else:
            off = _write_pool(fd, chunks, hasher, writers)
        os.fsync(fd)
        return off
    finally:
        os.close(fd)


def _write_pool(fd: int, chunks: Iterable[memoryview], hasher: _Hasher, writers: int) -> int:
    pending: deque[Future[None]] = deque()
    off = 0
    with ThreadPoolExecutor(writers, thread_name_prefix="frenzy-persist-write") as pool:
        try:
            for c in chunks:
                hasher.feed(c)
                pending.append(pool.submit(_pwrite_all, fd, c, off))
                off += memoryview(c).nbytes  # the next chunk's offset in bytes, whatever the view's item size
                while len(pending) > 2 * writers or (pending and pending[0].done()):
                    pending.popleft().result()  # a writer's error stops the stream here
            while pending:
                pending.popleft().result()
        except BaseException:
            for f in pending:
                f.cancel()
            raise  # leaving the pool waits for the writes already running: the fd is closed after them
    return off


SMALL_OBJECT_LIMIT = 256 << 20
"""The largest manifest, shard record or lease `Storage.read` accepts (a manifest lists every tensor of every rank)."""

SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "memory")
"""Object-store schemes accepted besides local paths (fsspec implementations)."""


def check_scheme(uri: str) -> str:
    """The storage scheme of a checkpoint URI (`file` for a plain path), or refused naming the ones offered; checked
    by the launcher before anything is made."""
    if "://" not in uri:
        return "file"
    scheme = uri.split("://", 1)[0].lower()
    if scheme != "file" and scheme not in SCHEMES:
        raise StorageError(f"{uri}: unsupported storage scheme {scheme}://; checkpoints go to file://DIR, "
                           "a plain path, or s3://BUCKET/PREFIX (also gs://, az:// with their fsspec package)")
    return scheme


class Storage:
    """A checkpoint root: keys are '/'-separated paths below it."""

    def __init__(self, uri: str, attempts: int | None = None, backoff_s: float = 0.5,
                 storage_options: dict | None = None) -> None:
        """`storage_options` go to fsspec (e.g. s3fs `endpoint_url`, `retries`); credentials come from the
        usual AWS environment variables or files, never from the job YAML."""
        self.uri = uri.rstrip("/")
        self.attempts = attempts or int(os.environ.get("FRENZY_STORAGE_RETRIES", "8"))
        self.backoff_s = backoff_s
        self.local: Path | None = None
        if uri.startswith("file://"):
            self.local = Path(uri[len("file://"):]).expanduser().absolute()
        elif "://" not in uri:
            self.local = Path(uri).expanduser().absolute()
        if self.local is not None:
            self.uri = f"file://{self.local}"
            self.fs = None
        else:
            import fsspec

            scheme = check_scheme(uri)
            try:
                self.fs, self.root = fsspec.core.url_to_fs(uri, **(storage_options or {}))
            except ImportError as err:  # gs:// without gcsfs, az:// without adlfs
                raise StorageError(f"{uri}: {scheme}:// needs its fsspec package, which is not installed ({err}); "
                                   "install it, or use file://DIR or s3://BUCKET/PREFIX") from None
            except (ValueError, TypeError) as err:
                raise StorageError(f"{uri}: not a usable storage URL ({err}); give file://DIR or "
                                   "s3://BUCKET/PREFIX") from None
            self.root = self.root.rstrip("/")

    def url(self, key: str) -> str:
        return f"{self.uri}/{key}"

    def _path(self, key: str) -> str:
        return str(self.local / key) if self.local is not None else f"{self.root}/{key}"

    # writing ------------------------------------------------------------------------------------------
    def write_stream(self, key: str, chunks: Callable[[], Iterable[memoryview]],
                     threads: int = 1) -> tuple[int, str]:
        """Write the chunks to `key`, returning (bytes, sha256 of all of them in order). `chunks` is re-called on a
        retry. `threads` 1: one thread writes a chunk, then hashes it. 2: a second thread hashes while the chunks are
        written. More: locally `threads - 1` threads write the chunks at their offsets at once (S3 writes one
        stream). Any writer's error fails the whole attempt after every write of it has ended (a retry starts the
        file again; nothing of a failed attempt lands in the next one)."""
        writers = max(1, threads - 1)

        def once() -> tuple[int, str]:
            hasher = _Hasher(threaded=threads > 1)
            try:
                if self.local is not None:
                    p = self.local / key
                    p.parent.mkdir(parents=True, exist_ok=True)
                    n = _write_file(p, chunks(), hasher, writers)
                else:
                    n = 0
                    with self.fs.open(self._path(key), "wb") as f:
                        for c in chunks():
                            hasher.feed(c)
                            f.write(c)
                            n += memoryview(c).nbytes
            except BaseException:
                hasher.abort()
                raise
            return n, hasher.close()

        return _retry(f"write {self.url(key)}", once, self.attempts, self.backoff_s)

    def put(self, key: str, data: bytes) -> None:
        """Write a small object atomically: readers see the old state or all of `data`, never a prefix."""

        def once() -> None:
            if self.local is not None:
                p = self.local / key
                p.parent.mkdir(parents=True, exist_ok=True)
                tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
                try:
                    with open(tmp, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, p)
                except BaseException:
                    tmp.unlink(missing_ok=True)  # a full disk leaves no empty temp file behind
                    raise
            else:
                self.fs.pipe_file(self._path(key), data)  # one PUT: atomic on S3

        _retry(f"put {self.url(key)}", once, self.attempts, self.backoff_s)

    def create(self, key: str, data: bytes) -> None:
        """Write `data` to `key` only if `key` does not exist (raises `AlreadyExists`); durable on return."""

        def once() -> None:
            if self.local is not None:
                p = self.local / key
                p.parent.mkdir(parents=True, exist_ok=True)
                try:
                    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    raise AlreadyExists(self.url(key)) from None
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                dfd = os.open(p.parent, os.O_RDONLY)
                try:
                    os.fsync(dfd)  # the directory entry too, or a crash can lose a committed manifest
                finally:
                    os.close(dfd)
                return
            try:
                self.fs.pipe_file(self._path(key), data, mode="create")
            except Exception as err:
                if "PreconditionFailed" in repr(err) or "412" in str(err) or isinstance(err, FileExistsError):
                    raise AlreadyExists(self.url(key)) from err
                raise

        _retry(f"create {self.url(key)}", once, self.attempts, self.backoff_s)

    # reading ------------------------------------------------------------------------------------------
    def _local_file(self, key: str, limit: int | None = None) -> Path:
        """The local path of `key` if it is a regular file (of at most `limit` bytes): FileNotFoundError when
        missing, `NotAFile` for a FIFO, device or directory, which an open() could block on for ever."""
        assert self.local is not None
        p = self.local / key
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise NotAFile(f"{self.url(key)} is not a regular file (a FIFO, device or directory); a checkpoint holds "
                           "only files: remove it")
        if limit is not None and st.st_size > limit:
            raise NotAFile(f"{self.url(key)} is {st.st_size:,} bytes, more than such a file can be ({limit:,})")
        return p

    def read(self, key: str, limit: int = SMALL_OBJECT_LIMIT) -> bytes:
        """A small object (a manifest, a shard record, the writer lease) of at most `limit` bytes."""
        def once() -> bytes:
            if self.local is not None:
                with open(self._local_file(key, limit), "rb") as f:
                    data = f.read(limit + 1)
            else:
                data = self.fs.cat_file(self._path(key), end=limit + 1)
            if len(data) > limit:
                raise NotAFile(f"{self.url(key)} is more than {limit:,} bytes, more than such an object can be")
            return data

        return _retry(f"read {self.url(key)}", once, self.attempts, self.backoff_s)

    def read_into(self, key: str, out: memoryview, chunk: int = 16 << 20) -> str:
        """Read `key` into the preallocated `out` (exactly its size), returning the sha256 of what was read."""

        def once() -> str:
            h, off = hashlib.sha256(), 0
            opener = open(self._local_file(key), "rb") if self.local is not None else self.fs.open(self._path(key), "rb")
            with opener as f:
                while off < len(out):
                    n = f.readinto(out[off:off + chunk])
                    if not n:
                        raise EOFError(f"{self.url(key)} is truncated: {off} of {len(out)} bytes")
                    h.update(out[off:off + n])
                    off += n
                if f.read(1):
                    raise EOFError(f"{self.url(key)} is longer than its manifest says ({len(out)} bytes)")
            return h.hexdigest()

        return _retry(f"read {self.url(key)}", once, max(2, self.attempts // 2), self.backoff_s)

    def size(self, key: str) -> int:
        """Bytes of `key` (FileNotFoundError when missing; `NotAFile` for a FIFO or device)."""
        if self.local is not None:
            return self._local_file(key).stat().st_size
        return int(_retry(f"stat {self.url(key)}", lambda: self.fs.size(self._path(key)), self.attempts,
                          self.backoff_s))

    def exists(self, key: str) -> bool:
        if self.local is not None:
            return (self.local / key).exists()
        return _retry(f"stat {self.url(key)}", lambda: self.fs.exists(self._path(key)), self.attempts,
                      self.backoff_s)

    def local_root(self) -> str:
        """'dir' or 'missing' for a local root; a root that is a file, a FIFO, a symlink loop or a dangling link
        raises a StorageError naming it (an exists() check would call a loop missing)."""
        assert self.local is not None
        try:
            kind = path_kind(self.local, "checkpoint root")
        except UserFileError as err:
            raise StorageError(str(err)) from None
        if kind == "file":
            raise StorageError(f"{self.uri} is a file; give a directory (give the checkpoint root, the directory of "
                               "step_* folders)")
        return kind

    def list_dirs(self) -> list[str]:
        """Names of the immediate sub-directories of the root (empty if the root does not exist), and of links
        that do not lead to one (a symlink loop, a dangling link): listed, so a reader names their problem."""
        if self.local is not None:
            if self.local_root() == "missing":
                return []
            return sorted(p.name for p in self.local.iterdir() if p.is_dir() or p.is_symlink())

        def once() -> list[str]:
            try:
                self.fs.invalidate_cache(self.root)
                entries = self.fs.ls(self.root, detail=True)
            except FileNotFoundError:
                return []
            return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == "directory")

        return _retry(f"list {self.uri}", once, self.attempts, self.backoff_s)

    def remove_dir(self, name: str) -> None:
        if self.local is not None:
            import shutil

            shutil.rmtree(self.local / name, ignore_errors=True)
            return
        _retry(f"remove {self.url(name)}", lambda: self.fs.rm(f"{self.root}/{name}", recursive=True),
               self.attempts, self.backoff_s)

    def delete(self, key: str) -> None:
        if self.local is not None:
            (self.local / key).unlink(missing_ok=True)
            return
        _retry(f"delete {self.url(key)}", lambda: self.fs.rm_file(self._path(key)), self.attempts, self.backoff_s)
