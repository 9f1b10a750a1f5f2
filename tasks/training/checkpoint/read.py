"""Readers of committed checkpoints: list the steps, read and check a manifest, read a shard verifying its sha256,
assemble whole tensors from any layout's shards."""

from __future__ import annotations

import errno
import logging
import re
from typing import TYPE_CHECKING

from tasks.training.checkpoint.manifest import STEP_DIR, CheckpointError, Manifest, ShardRecord, step_dir
from tasks.training.storage import NotAFile, Storage
from tasks.userfiles import json_loads

if TYPE_CHECKING:
    import torch

log = logging.getLogger("frenzy.checkpoint")


def list_steps(storage: Storage) -> list[int]:
    """Steps with a directory (committed or not), newest first."""
    return sorted((int(m.group(1)) for n in storage.list_dirs() if (m := STEP_DIR.match(n))), reverse=True)


def read_manifest(storage: Storage, step: int) -> Manifest | None:
    """The step's manifest; None when it has none (never committed). A manifest that cannot be parsed, or names
    another step, raises `CheckpointError` naming the file."""
    key = f"{step_dir(step)}/manifest.json"
    _refuse_broken_link(storage, step)
    try:
        m = Manifest.model_validate(json_loads(storage.read(key), storage.url(key)))
    except FileNotFoundError:
        return None
    except NotAFile as err:
        raise CheckpointError(f"{err}; the step is skipped") from None
    except ValueError as err:  # strict JSON (UserFileError) or pydantic's ValidationError: both ValueErrors
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{storage.url(key)} is not a valid manifest ({first}); the step is skipped") from None
    if m.step != step:
        raise CheckpointError(f"{storage.url(key)} names step {m.step}, not {step}; the step is skipped")
    shard_key = re.compile(re.escape(step_dir(step)) + r"/rank\d{5}\.bin")
    for sh in m.shards:
        if not shard_key.fullmatch(sh.key):  # `../../x`, an absolute path, another step's file: never followed
            raise CheckpointError(f"{storage.url(key)}: shard key {sh.key!r} is not a file of this step "
                                  f"({step_dir(step)}/rankNNNNN.bin); the manifest was altered, the step is skipped")
    return m


def survey(storage: Storage) -> tuple[list[Manifest], list[CheckpointError]]:
    """Manifests of every committed step, newest first, and the errors of the steps whose manifest is there but
    cannot be read (NaN, not JSON, another step's): those are not "no checkpoint", a resume must say so."""
    out, broken = [], []
    for s in list_steps(storage):
        try:
            m = read_manifest(storage, s)
        except CheckpointError as err:
            log.warning("%s", err)
            broken.append(err)
            continue
        if m is not None:
            out.append(m)
    return out, broken


def _refuse_broken_link(storage: Storage, step: int) -> None:
    """A local step directory that is a link to no directory (a loop, a dangling link) is a step with a problem."""
    d = storage.local / step_dir(step) if storage.local is not None else None
    if d is None or not d.is_symlink() or d.is_dir():
        return
    try:
        d.stat()
        what = "a link to something that is not a directory"
    except OSError as err:
        what = "a symlink loop" if err.errno == errno.ELOOP else "a dangling link (its target is gone)"
    raise CheckpointError(f"{storage.url(step_dir(step))} is {what}; the step is skipped: fix or remove the link")


def committed(storage: Storage) -> list[Manifest]:
    """Manifests of every committed step, newest first; an unreadable manifest is logged by name and skipped."""
    return survey(storage)[0]


def read_shard(storage: Storage, shard: ShardRecord) -> dict[str, torch.Tensor]:
    """Read one shard, verifying its size and sha256; raises `CheckpointError` on any mismatch."""
    import torch  # here, not at the top: listing and reading manifests (the CLI, the pipeline's records) needs no torch

    try:
        size = storage.size(shard.key)
        if size != shard.bytes:  # before allocating what the record claims
            raise EOFError(f"the file is {size:,} bytes; the manifest says {shard.bytes:,} (truncated or extended)")
        flat = torch.empty(shard.bytes, dtype=torch.uint8)
        sha = storage.read_into(shard.key, memoryview(flat.numpy()))
    except (EOFError, FileNotFoundError, NotAFile) as err:
        raise CheckpointError(f"{storage.url(shard.key)}: {err}") from None
    if sha != shard.sha256:
        raise CheckpointError(f"{storage.url(shard.key)}: sha256 {sha[:12]}... does not match the manifest's "
                              f"{shard.sha256[:12]}... (corrupted)")
    out = {}
    for e in shard.tensors:
        try:
            if e.offset < 0 or e.offset + e.nbytes > shard.bytes:
                raise ValueError(f"bytes {e.offset}..{e.offset + e.nbytes} lie outside the shard")
            out[e.name] = flat[e.offset:e.offset + e.nbytes].view(getattr(torch, e.dtype)).view(e.shape)
        except (RuntimeError, ValueError, AttributeError, TypeError) as err:
            raise CheckpointError(f"{storage.url(shard.key)}: tensor {e.name} does not match its record "
                                  f"(dtype {e.dtype}, shape {e.shape}): {err}") from None
    return out


def read_full(storage: Storage, manifest: Manifest, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """Whole tensors whose names start with `prefix` (prefix removed), assembled from every rank's shards.

    Evaluation loads models this way whatever layout trained them (one rank, DDP, FSDP2)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for shard in manifest.shards:
        entries = {e.name: e for e in shard.tensors if e.name.startswith(prefix)}
        if not entries:
            continue
        tensors = read_shard(storage, shard)
        for name, e in entries.items():
            key = name[len(prefix):]
            t = tensors[name]
            if e.global_shape is None:
                out[key] = t
                continue
            full = out.setdefault(key, torch.empty(e.global_shape, dtype=t.dtype))
            idx = tuple(slice(o, o + n) for o, n in zip(e.global_offset, e.shape, strict=True))
            full[idx] = t
    return out


def verify(storage: Storage, manifest: Manifest) -> None:
    for s in manifest.shards:
        read_shard(storage, s)
