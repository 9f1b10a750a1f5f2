"""Reading a file the user gave: one place that refuses what cannot be read, before anything waits or believes it.

Every reader of a user file (job, suite, cluster and meta YAML, trace CSV, JSON and JSONL, manifests, priors)
goes through `open_user_file` / `read_bytes` / `read_text` and, for YAML, `load_yaml`:
- **Only regular files.** A FIFO nobody writes, a character device (`/dev/zero`, a tty), a socket or a directory is
  refused by `stat` before any `open` could block; the open itself is non-blocking and checked again (a path
  swapped between the two). A symlink loop is named as one (Python's `exists()` calls it missing); a link to
  nothing is named as a dangling link.
- **Bounded size.** Each kind of file has a documented limit (`LIMITS`, docs/guarantees.md); past it the file is
  refused naming the limit, and at most limit + 1 bytes are ever read (a regular file that grows, or one of
  /proc's that reports size 0, cannot make a reader run for ever).
- **One YAML loader** (`load_yaml`): safe types only; duplicate keys, anchors and aliases (`&a` / `*a`, the
  "billion laughs" expansion), merge keys and non-finite numbers (`.nan`, `.inf`) are refused with the file, line
  and column; the document keeps where each key was (`YamlDoc.where`) so a validation error of a field names its
  line too (`validation_message`).
- **Strict JSON** (`load_json`, `json_loads`): no NaN/Infinity, no duplicate keys.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from tasks.errors import FrenzyError

MiB = 1 << 20
LIMITS: dict[str, int] = {
    "yaml": 4 * MiB,  # job, suite, cluster, catalog and straggler meta files: a few KB in practice
    "json": 64 * MiB,  # state and config files: priors, leases, prepared.json, config.json
    "manifest": 256 * MiB,  # a checkpoint manifest lists every tensor of every rank
    "csv": 256 * MiB,  # a cluster trace (100,000 jobs are about 5 MB)
    "jsonl": 4096 * MiB,  # an evaluation dataset or a history file
}
"""Bytes a reader accepts per kind of file (docs/guarantees.md)."""


class UserFileError(FrenzyError, ValueError):
    """A user file that cannot be read as given; the message names the file (line and column where known) and the
    fix. A ValueError too, so the callers that catch their own ValueErrors keep working."""


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _stat(p: Path, what: str) -> os.stat_result:
    try:
        return os.stat(p)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UserFileError(f"{p}: {what} is a symlink loop (a link that leads back to itself); fix or remove "
                                "the link") from None
        if err.errno == errno.ENOENT and os.path.lexists(p):
            raise UserFileError(f"{p}: {what} is a symlink to a missing file ({os.readlink(p)}); fix the link or "
                                "give the file itself") from None
        if err.errno == errno.ENOENT:
            raise UserFileError(f"{p}: the {what} does not exist; check the path") from None
        if err.errno in (errno.EACCES, errno.EPERM):
            raise UserFileError(f"{p}: {what} is not readable (permission denied); check its mode or owner") from None
        if err.errno == errno.ENOTDIR:
            raise UserFileError(f"{p}: a part of the path is a file, not a directory; check the path") from None
        if err.errno == errno.ENAMETOOLONG:
            raise UserFileError(f"{str(p)[:80]}...: the path is too long; check it") from None
        raise


def regular_file(path: str | Path, what: str) -> Path:
    """`path` if it is a regular file (symlinks followed), else a `UserFileError` naming what it is instead."""
    p = Path(path).expanduser()
    st = _stat(p, what)
    if stat.S_ISDIR(st.st_mode):
        raise UserFileError(f"{p} is a directory; give a file: the {what}")
    if not stat.S_ISREG(st.st_mode):
        raise UserFileError(f"{p} is {_kind(st.st_mode)}, not a regular file; Frenzy reads the {what} only from a "
                            f"regular file (one that cannot block or never end): copy the {what} into a file first")
    return p


def path_kind(path: str | Path, what: str) -> str:
    """'file', 'dir' or 'missing' for `path`; a FIFO, device, socket or symlink loop is refused by name."""
    p = Path(path).expanduser()
    try:
        st = _stat(p, what)
    except UserFileError:
        if not os.path.lexists(p):
            return "missing"
        raise
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    regular_file(p, what)
    return "file"


@contextmanager
def open_user_file(path: str | Path, what: str, limit: int) -> Iterator[IO[bytes]]:
    """The file opened for reading in binary, once it is known to be a regular file of at most `limit` bytes."""
    p = regular_file(path, what)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM):
            raise UserFileError(f"{p}: {what} is not readable (permission denied); check its mode or owner") from None
        raise
    f = os.fdopen(fd, "rb")
    with f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for something else since the stat
            raise UserFileError(f"{p} is {_kind(st.st_mode)}, not a regular file; give a regular {what} file")
        os.set_blocking(fd, True)
        _check_size(p, what, st.st_size, limit)
        yield f


def _check_size(p: Path, what: str, size: int, limit: int) -> None:
    if size > limit:
        raise UserFileError(f"{p}: the {what} is too large ({size:,} bytes), past the size limit of "
                            f"{limit / MiB:,.0f} MiB for this kind of file (docs/guarantees.md); is it the right file?")


def read_bytes(path: str | Path, what: str, limit: int) -> bytes:
    """All of the file (module docstring: regular, at most `limit` bytes, never more read)."""
    chunks, total = [], 0
    with open_user_file(path, what, limit) as f:
        while total <= limit:  # in pieces: read(limit + 1) would reserve the whole limit (GiB) up front
            piece = f.read(min(1 << 20, limit + 1 - total))
            if not piece:
                break
            chunks.append(piece)
            total += len(piece)
    _check_size(Path(path), what, total, limit)
    return b"".join(chunks)


def decode_utf8(data: bytes, source: str) -> str:
    """`data` as UTF-8 text; a bad byte is named by line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        col = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise UserFileError(f"{source}:{line}:{col}: not UTF-8 text (byte 0x{data[err.start]:02x}); is it the "
                            "right file? save it as UTF-8") from None


_MAGIC = (b"\x7fELF", b"\x1f\x8b", b"PK\x03\x04", b"\x89PNG", b"%PDF", b"\xfe\xed\xfa", b"\xcf\xfa\xed\xfe",
          b"MZ\x90\x00")
_CONTROL = bytes([0, *range(1, 9), 11, 12, *range(14, 27), *range(28, 32), 127])
"""Bytes text does not hold: NUL, DEL and the C0 controls but tab, newline, carriage return and ESC (terminal
colours)."""


_C1 = bytes(range(0x80, 0xA0))


def looks_binary(head: bytes) -> bool:
    """An executable, archive or image (by magic), or more than 1% NUL or 3% other control bytes in `head` (the
    first 64 KiB of a file): random bytes hold about 11%, text in any 8-bit encoding none. Bytes that are not UTF-8
    count as text only while under 30% of them are 0x80-0x9f (latin-1's controls, cp1252's quotes and dashes,
    no letter of cp1251 or KOI8-R but a few). A zero-filled tail, which a node crash can leave in a log, does not count.
    Every reader of a user text file asks this first."""
    body = head.rstrip(b"\0")
    if body.startswith(_MAGIC):
        return True
    n = len(body)
    ctrl = n - len(body.translate(None, _CONTROL))
    if not n or body.count(b"\0") > n // 100 or ctrl > n * 3 // 100:
        return bool(n)
    try:
        body[: n - 4].decode("utf-8")  # the last few bytes may end mid-character at the 64 KiB cut
        return False
    except UnicodeDecodeError:
        return n - len(body.translate(None, _C1)) > n * 3 // 10


def read_text(path: str | Path, what: str, limit: int) -> str:
    """The file as UTF-8 text (regular, bounded; a bad byte named by line and column)."""
    return decode_utf8(read_bytes(path, what, limit), str(path))


# --------------------------------------------------------------------------------------------------- YAML
def _where(source: str, mark: Any) -> str:
    return f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without aliases, merge keys, duplicate keys or non-finite numbers (module docstring)."""

    source = "<yaml>"
    paths: dict[int, str] = {}
    """id(node) -> its key path (`training.lr`), set once the document is composed, for messages."""

    def _at(self, node: Any) -> str:
        path = self.paths.get(id(node))
        return f"{_where(self.source, node.start_mark)}: {path + ': ' if path else ''}"

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()
            raise UserFileError(f"{_where(self.source, ev.start_mark)}: YAML alias *{ev.anchor} refused: Frenzy's "
                                "files take no anchors or aliases (they can expand without bound); write the values out")
        ev = self.peek_event()
        if getattr(ev, "anchor", None) is not None:
            raise UserFileError(f"{_where(self.source, ev.start_mark)}: YAML anchor &{ev.anchor} refused: Frenzy's "
                                "files take no anchors or aliases (they can expand without bound); write the values out")
        return super().compose_node(parent, index)

    def flatten_mapping(self, node: Any) -> None:
        """Merge keys are refused in `construct_mapping`, so there is nothing to flatten."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep)
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise UserFileError(f"{_where(self.source, key_node.start_mark)}: YAML merge key `<<` refused; write "
                                    "the keys out")
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key (a list or mapping as a key)
                raise UserFileError(f"{_where(self.source, key_node.start_mark)}: a YAML key must be a plain value, "
                                    "not a list or mapping") from None
            if first is not None:
                where = self.paths.get(id(node))
                raise UserFileError(f"{_where(self.source, key_node.start_mark)}: duplicate key {key!r}"
                                    f"{' in ' + where if where else ''} (first at line {first.line + 1}); a key may "
                                    "appear once in a mapping: remove one")
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)

    def construct_yaml_float(self, node: Any) -> float:
        v = super().construct_yaml_float(node)
        if not math.isfinite(v):
            raise UserFileError(f"{self._at(node)}{node.value} is not a finite number; give a finite value")
        return v


_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)
_StrictLoader.add_constructor("tag:yaml.org,2002:map", _StrictLoader.construct_yaml_map)


@dataclass
class YamlDoc:
    """A loaded YAML document and where each key's value was in the file (for messages naming the line)."""

    data: Any
    source: str
    marks: dict[tuple, Any] = field(default_factory=dict)

    def where(self, loc: tuple | list) -> str:
        """`FILE:LINE:COL` of the deepest known prefix of the pydantic-style location `loc`."""
        loc = tuple(loc)
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.marks:
                return _where(self.source, self.marks[loc[:n]])
        return self.source


def _marks(node: Any, path: tuple, out: dict[tuple, Any], paths: dict[int, str]) -> None:
    """Where each key path starts (`out`) and each node's dotted key path (`paths`, by node id)."""
    if path:
        paths[id(node)] = ".".join(str(p) for p in path)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                out[path + (k.value,)] = k.start_mark
                _marks(v, path + (k.value,), out, paths)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[path + (i,)] = v.start_mark
            _marks(v, path + (i,), out, paths)


_READER_FIX = "remove it (a YAML file is text; a control character is often a paste from a terminal or a binary file)"
_GENERIC_FIX = "fix the YAML at that place (indent with spaces, write `key: value`, quote a value holding ': ' or ' #')"
_YAML_FIXES: tuple[tuple[str, str], ...] = (  # (words of PyYAML's problem or context, what the user should do)
    ("mapping values are not allowed", "a value holds ': ' (quote it: `key: \"a: b\"`) or a line lacks its "
                                       "`key:` or is indented too far: write `key: value`, nested keys indented by spaces"),
    ("expected <block end>", "this line is not indented like the keys beside it: indent the keys of one mapping by the "
                             "same number of spaces (a list item `- x` and a `key:` cannot share a level)"),
    ("quoted scalar", "a quote is not closed: close it on the same value"),
    ("flow mapping", "a `{` is not closed or its entries lack a comma: write `{a: 1, b: 2}`"),
    ("flow sequence", "a `[` is not closed or its items lack a comma: write `[1, 2]`"),
    ("another document", "the file holds more than one document (a second `---`): give one document per file"),
    ("constructor for the tag", "YAML tags (`!name`) are not taken: remove it, or quote the value if it is text"),
    ("cannot start any token", "a value cannot begin with this character: quote the value (`key: \"@x\"`)"),
    ("scanning an alias", "`*` begins a YAML alias: quote the value (`key: \"*\"`)"),
    ("simple key", "a key is not closed by ':' on its line: write `key: value`"),
)


def yaml_problem(err: yaml.MarkedYAMLError, text: str) -> str:
    """PyYAML's problem in its words, and what to do about it: a tab (YAML indents with spaces only), the common
    mistakes of `_YAML_FIXES`, else the generic fix."""
    problem = "; ".join(p for p in (err.context, err.problem) if p) or str(err)
    mark = err.problem_mark or err.context_mark
    line = text.splitlines()[mark.line] if mark is not None and mark.line < len(text.splitlines()) else ""
    if "'\\t'" in problem or "\t" in line[: len(line) - len(line.lstrip())]:
        return (f"{problem}: a tab where YAML allows only spaces; indent with spaces (and separate `key:` from its "
                "value with a space), not tabs")
    fix = next((f for words, f in _YAML_FIXES if words in problem), _GENERIC_FIX)
    return f"{problem}; {fix}"


def yaml_text(text: str, source: str) -> YamlDoc:
    """Parse YAML text strictly (module docstring); errors name `source`, the line and the column."""
    try:
        loader = _StrictLoader(text)
    except yaml.YAMLError as err:  # the reader checks the characters at once (a control character)
        at = getattr(err, "position", None)
        where = f"{source}:{text.count(chr(10), 0, at) + 1}:{at - text.rfind(chr(10), 0, at)}" if at is not None else source
        raise UserFileError(f"{where}: not valid YAML: {str(err).splitlines()[0]}; {_READER_FIX}") from None
    loader.source = source
    try:
        node = loader.get_single_node()
        marks: dict[tuple, Any] = {}
        if node is not None:
            loader.paths = {}
            _marks(node, (), marks, loader.paths)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        raise UserFileError(f"{_where(source, mark)}: not valid YAML: {yaml_problem(err, text)}") from None
    except yaml.YAMLError as err:
        raise UserFileError(f"{source}: not valid YAML: {err}; {_GENERIC_FIX}") from None
    except RecursionError:
        raise UserFileError(f"{source}: YAML nested too deeply to be a Frenzy file") from None
    finally:
        loader.dispose()
    return YamlDoc(data, source, marks)


def load_yaml(path: str | Path, what: str, limit: int = LIMITS["yaml"]) -> YamlDoc:
    """A user's YAML file, read through the refusing reader and parsed strictly (module docstring)."""
    return yaml_text(read_text(path, what, limit), str(path))


def named_yaml(spec: str | Path, builtin: Callable[[str], str | None], what: str, missing: str) -> YamlDoc:
    """A built-in document by name (`builtin(name)` gives its text, None when there is none by that name), else the
    user's YAML file at `spec` (read and parsed as `load_yaml`); `missing` is the message when it is neither."""
    text = builtin(str(spec))
    if text is not None:
        return yaml_text(text, f"{what} {spec}")
    p = Path(spec).expanduser()
    if path_kind(p, f"{what} file") == "missing":
        raise UserFileError(missing)
    return load_yaml(p, f"{what} file")


def validation_message(err: Any, doc: YamlDoc | None, source: str, what: str, at: tuple = ()) -> str:
    """A pydantic ValidationError of user input as lines `FILE:LINE:COL: field: problem`, one per error; `at` is
    where in the document the validated value was (for a part validated alone)."""
    lines = [f"{source}: invalid {what}"]
    for e in err.errors():
        loc = ".".join(str(p) for p in (*at, *e["loc"])) or "(top level)"
        where = doc.where((*at, *e["loc"])) if doc is not None else source
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown key {str(e['loc'][-1])!r} (check the spelling)"
        lines.append(f"  {where}: {loc}: {msg}")
    return "\n".join(lines)


def _numeric(annotation: Any) -> bool:
    """Whether a field's type takes numbers and not booleans (int, float, Optional or Annotated of them)."""
    if annotation in (int, float):
        return True
    args = typing.get_args(annotation)
    return bool(args) and bool not in args and any(_numeric(a) for a in args)


def refuse_bool_numbers(cls: Any, value: Any, info: Any) -> Any:
    """A pydantic `field_validator("*", mode="before")`: YAML's `yes`/`no`/`true` is not a number (pydantic would
    take it as 1 or 0), so a number field given one is refused by name."""
    if isinstance(value, bool) and info.field_name in cls.model_fields and \
            _numeric(cls.model_fields[info.field_name].annotation):
        raise ValueError(f"{str(value).lower()} is a yes/no value, not a number; give a number")
    return value


# --------------------------------------------------------------------------------------------------- JSON
class _NonFinite(float):
    """A NaN or Infinity the JSON parser met (kept to name its key, then refused)."""

    def __new__(cls, name: str) -> _NonFinite:
        obj = super().__new__(cls, "nan")
        obj.name = name  # type: ignore[attr-defined]
        return obj


def _non_finite(data: Any) -> tuple[str, str] | None:
    """(dotted path, spelling) of the first non-finite number in parsed JSON (`NaN`, `Infinity`, `1e999`)."""
    stack: list[tuple[tuple, Any]] = [((), data)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return ".".join(str(p) for p in path) or "(the value)", getattr(v, "name", repr(v))
        if isinstance(v, dict):
            stack.extend(((*path, k), x) for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend(((*path, i), x) for i, x in reversed(list(enumerate(v))))
    return None


class DuplicateKey(ValueError):
    """A JSON object that names one key twice (the parser would keep the last silently)."""


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook` for json.loads: every JSON reader of a user file refuses a key given twice."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(f"duplicate key {k!r}")
        out[k] = v
    return out


def json_loads(text: str | bytes, source: str, line: int | None = None) -> Any:
    """JSON without NaN/Infinity or duplicate keys; errors name `source` and the line and column (`line`: the
    text is that one line of `source`, a JSONL file's)."""
    try:
        data = json.loads(text, parse_constant=_NonFinite, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as err:
        raise UserFileError(f"{source}:{line or err.lineno}:{err.colno}: not JSON: {err.msg}") from None
    except UnicodeDecodeError:
        raise UserFileError(f"{source}: not UTF-8 JSON") from None
    except RecursionError:
        raise UserFileError(f"{source}: JSON nested too deeply") from None
    except ValueError as err:
        raise UserFileError(f"{source}: {err}; fix or remove the file") from None
    bad = _non_finite(data)
    if bad is not None:
        raise UserFileError(f"{source}: {bad[0]}: {bad[1]} is not a finite number; give a finite value")
    return data


def load_json(path: str | Path, what: str, limit: int = LIMITS["json"]) -> Any:
    """A JSON file, read through the refusing reader and parsed strictly."""
    return json_loads(read_bytes(path, what, limit), str(path))
