"""Resume on any layout: read a checkpoint written by one data x tensor parallel layout into another.

Every tensor of a checkpoint is recorded with its shape and, when it is a shard of a distributed tensor (FSDP2 rows,
tensor-parallel columns or rows), with its global shape and the offset of the slice the shard holds; a replicated
tensor (DDP's one replica on rank 0, a plain parameter) is its own global tensor at offset 0. That is enough to
rebuild any rank's slice of any layout: for each tensor this rank needs (its parameters' local slices, the optimizer
moments of the same slices, scalars whole), copy the intersection of every saved piece that overlaps it. Only the
shards holding such a piece are read (each verified by its sha256), one at a time, so a rank never holds more than
one saved shard beside its own state. The result has exactly the names and local shapes `state.training_tensors`
gives on the new layout, so `state.restore` loads it unchanged.

The data cursor is global (samples consumed by the whole job, `data.Cursor`), so it carries over unchanged: with the
same global batch the resumed run reads exactly the samples the uninterrupted run would have read, in the same
order, whatever its rank count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from tasks.training import checkpoint as ck
from tasks.training.state import _local
from tasks.training.storage import Storage

log = logging.getLogger("frenzy.checkpoint")

LAYOUT_KEYS = ("world_size", "tp", "zero_stage", "global_batch")
"""Fingerprint keys a resume may change: the layout (resharded on load) and the global batch (the sample cursor
carries over, so training continues from the same token position)."""


def mismatch(saved: dict, now: dict) -> list[str]:
    """The fingerprint keys that differ and forbid a resume (corpus, model shape, tokenizer, seq_len, seed)."""
    return sorted(k for k in now if k not in LAYOUT_KEYS and saved.get(k) != now[k])


def layout_changes(saved: dict, now: dict) -> dict[str, tuple[object, object]]:
    """{key: (saved, now)} of the layout keys that differ (keys an old fingerprint lacks count as unchanged)."""
    return {k: (saved[k], now[k]) for k in LAYOUT_KEYS if k in saved and k in now and saved[k] != now[k]}


def describe(changes: dict[str, tuple[object, object]], samples: int, seq_len: int) -> str:
    parts = [f"{k} {a} -> {b}" for k, (a, b) in changes.items()]
    msg = f"resuming on another layout ({', '.join(parts)}): model and optimizer state resharded"
    if "global_batch" in changes:
        msg += (f"; the global batch changed, so steps from here hold {changes['global_batch'][1]} samples: training "
                f"continues at sample {samples} (token {samples * seq_len}), none repeated or skipped")
    return msg


@dataclass(frozen=True)
class _Slot:
    """Where one tensor this rank needs lies in its global tensor."""

    shape: tuple[int, ...]
    offset: tuple[int, ...]
    global_shape: tuple[int, ...]
    dtype: torch.dtype | None
    """The live parameter's dtype (a bf16 checkpoint resumed at fp32 is cast); None keeps the saved dtype."""


def _param_slots(model: nn.Module) -> dict[str, _Slot]:
    out = {}
    for name, p in model.named_parameters():
        local, gshape, goff = _local(p.detach())
        shape = tuple(local.shape)
        out[name] = _Slot(shape, tuple(goff) if goff is not None else (0,) * len(shape),
                          tuple(gshape) if gshape is not None else shape, p.dtype)
    return out


def _pieces(manifest: ck.Manifest) -> dict[str, list[tuple[int, ck.TensorEntry]]]:
    """name -> [(shard index, entry)] of every saved piece."""
    out: dict[str, list[tuple[int, ck.TensorEntry]]] = {}
    for i, shard in enumerate(manifest.shards):
        for e in shard.tensors:
            out.setdefault(e.name, []).append((i, e))
    return out


def _global(e: ck.TensorEntry) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if e.global_shape is None:
        return tuple(e.shape), (0,) * len(e.shape)
    return tuple(e.global_shape), tuple(e.global_offset or (0,) * len(e.shape))


def _slots(manifest: ck.Manifest, params: dict[str, _Slot], rank: int
           ) -> tuple[dict[str, _Slot], dict[str, list[tuple[int, ck.TensorEntry]]]]:
    """The tensors this rank loads (model, optimizer state, its RNG) and the saved pieces of each."""
    pieces = _pieces(manifest)
    slots: dict[str, _Slot] = {}
    chosen: dict[str, list[tuple[int, ck.TensorEntry]]] = {}
    for name, found in pieces.items():
        if name.startswith("rng."):
            continue
        gshape = _global(found[0][1])[0]
        pname = name[len("model."):] if name.startswith("model.") else name[len("optim."):].rsplit(".", 1)[0]
        slot = params.get(pname)
        if slot is None:
            raise ck.CheckpointError(f"checkpoint tensor {name} names no parameter of this model")
        if gshape == slot.global_shape:
            slots[name] = slot
        else:  # a scalar such as Adam's step: the same on every rank, taken whole
            slots[name] = _Slot(gshape, (0,) * len(gshape), gshape, None)
        # a replicated tensor is saved by every rank that holds it (tensor parallel's plain parameters): one copy
        unique: dict[tuple, tuple[int, ck.TensorEntry]] = {}
        for i, e in found:
            unique.setdefault((tuple(e.shape), _global(e)[1]), (i, e))
        chosen[name] = list(unique.values())
    for name in ("rng.cpu", "rng.cuda"):
        if name not in pieces:
            continue
        # this rank's own RNG where the old layout had this rank, else rank 0's (the data order does not use it)
        by_rank = {manifest.shards[i].rank: (i, e) for i, e in pieces[name]}
        i, e = by_rank.get(rank, by_rank.get(0, pieces[name][0]))
        slots[name] = _Slot(tuple(e.shape), (0,) * len(e.shape), tuple(e.shape), None)
        chosen[name] = [(i, e)]
    return slots, chosen


def _overlap(piece_shape: tuple[int, ...], piece_off: tuple[int, ...], slot: _Slot
             ) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """(index into the slot, index into the piece) of their intersection; None when they do not meet."""
    dst, src = [], []
    for n, o, tn, to in zip(piece_shape, piece_off, slot.shape, slot.offset, strict=True):
        lo, hi = max(o, to), min(o + n, to + tn)
        if hi <= lo:
            return None
        dst.append(slice(lo - to, hi - to))
        src.append(slice(lo - o, hi - o))
    return tuple(dst), tuple(src)


def read_resharded(storage: Storage, manifest: ck.Manifest, model: nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """This rank's tensors of `manifest`, resliced for the live (possibly wrapped/sharded) `model`: the names and
    local shapes `training_tensors` gives on this layout. Raises `CheckpointError` when a slice is not covered."""
    slots, chosen = _slots(manifest, _param_slots(model), rank)
    out: dict[str, torch.Tensor] = {}
    filled: dict[str, int] = {}
    needed: dict[int, list[tuple[str, ck.TensorEntry]]] = {}
    for name, found in chosen.items():
        slot = slots[name]
        for i, e in found:
            if _overlap(tuple(e.shape), _global(e)[1], slot) is not None or not slot.shape:
                needed.setdefault(i, []).append((name, e))
    for i in sorted(needed):
        shard = ck.read_shard(storage, manifest.shards[i])
        for name, e in needed[i]:
            slot, t = slots[name], shard[name]
            dst = out.get(name)
            if dst is None:
                dst = out[name] = torch.empty(slot.shape, dtype=slot.dtype or t.dtype)
                filled[name] = 0
            if not slot.shape:
                dst.copy_(t.reshape(()))
                filled[name] = 1
                continue
            cut = _overlap(tuple(e.shape), _global(e)[1], slot)
            if cut is not None:
                dst[cut[0]].copy_(t[cut[1]])
                filled[name] += int(dst[cut[0]].numel())
        del shard
    short = [n for n, s in slots.items() if filled.get(n, 0) < _numel(s.shape) and _numel(s.shape) > 0]
    if short:
        raise ck.CheckpointError(f"checkpoint step {manifest.step} at {storage.uri} does not cover this rank's slice "
                                 f"of {short[:3]} (pieces missing from its shards)")
    for name, s in slots.items():  # empty local slices (more ranks than rows) still need their name
        out.setdefault(name, torch.empty(s.shape, dtype=s.dtype or torch.float32))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n
