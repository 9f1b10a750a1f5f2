"""Restoring a rank's training state from a committed checkpoint: at start (`--resume`) and on a spike rollback.

A checkpoint of another job is refused (its fingerprint differs); one of the same job in another layout (world
size, tp, zero stage, global batch) is resharded on load (reshard.py); one that fails verification on any rank
is passed over for the next older one, on every rank alike.
"""

from __future__ import annotations

import logging

import torch.distributed as dist

from tasks.training import checkpoint as ck
from tasks.training import data as D
from tasks.training import reshard
from tasks.training.metrics import Progress
from tasks.training.setup import Dist, Model, TrainOptions, agree
from tasks.training.spikes import SpikeDetector
from tasks.training.state import restore
from tasks.training.storage import Storage

log = logging.getLogger("frenzy.train")


class Restorer:
    """Loads checkpoints into the model, optimizer, scaler, data cursor and spike detector of one rank."""

    def __init__(self, storage: Storage, d: Dist, m: Model, cursor: D.Cursor, detector: SpikeDetector, fp: dict,
                 seq_len: int, prog: Progress) -> None:
        self.storage, self.d, self.m, self.cursor, self.detector = storage, d, m, cursor, detector
        self.fp, self.seq_len, self.prog = fp, seq_len, prog
        self.cadence_memo: dict | None = None
        """The checkpoint interval's measured figures in the manifest loaded last (interval.py, `Cadence.seed`)."""

    def _tensors(self, m: ck.Manifest) -> dict:
        d = self.d
        # [elastic hook] another layout (world size, tp, zero stage, global batch): reshard on load (reshard.py)
        changes = reshard.layout_changes(m.fingerprint, self.fp)
        if changes:
            if d.rank == 0:
                msg = reshard.describe(changes, int(m.cursor.get("samples", 0)), self.seq_len)
                log.warning("%s", msg)
                self.prog.emit("resharded", step=m.step, changes={k: list(v) for k, v in changes.items()}, message=msg)
            return reshard.read_resharded(self.storage, m, self.m.core, d.rank)
        by_rank = {s.rank: s for s in m.shards}
        tensors = ck.read_shard(self.storage, by_rank[d.rank])
        if not self.m.owns_model:  # DDP: rank 0 wrote the one replica of model and optimizer; every rank loads it
            tensors = {**ck.read_shard(self.storage, by_rank[0]), **tensors}
        return tensors

    def load(self, m: ck.Manifest) -> None:
        """Checkpoint `m` into this rank's state; CheckpointMismatch for another job's, CheckpointError when a
        shard does not verify."""
        diff = reshard.mismatch(m.fingerprint, self.fp)
        if diff:
            raise ck.CheckpointMismatch(f"checkpoint step {m.step} at {self.storage.uri} was written by a different "
                                        f"job ({', '.join(diff)} differ); use another checkpoint.uri or the same job")
        restore(self.m.core, self.m.optimizer, self._tensors(m), with_model=True)
        saved = D.Cursor.from_dict(m.cursor)
        self.cursor.samples, self.cursor.skips = saved.samples, saved.skips
        self.detector.load(m.trainer["spike"])
        self.cadence_memo = m.trainer.get("cadence")
        if m.trainer.get("scaler"):
            self.m.scaler.load_state_dict(m.trainer["scaler"])

    def newest_valid(self, before: int | None = None, healthy_only: bool = False) -> ck.Manifest | None:
        """Load the newest committed checkpoint (before step `before`; healthy ones only) that every rank verifies."""
        for m in ck.committed(self.storage):
            if (before is not None and m.step >= before) or (healthy_only and not m.healthy):
                continue
            try:
                ok = True
                self.load(m)
            except ck.CheckpointMismatch:
                raise
            except ck.CheckpointError as err:
                log.warning("rank %d: %s; trying an older checkpoint", self.d.rank, err)
                self.prog.emit("checkpoint_rejected", step=m.step, reason=str(err))
                ok = False
            if agree(self.d, ok):
                return m
        return None

    def resume(self, opts: TrainOptions) -> int | None:
        """The step this invocation starts from (None: step 0); refuses to overwrite or silently drop checkpoints.
        Commits newer than the start are discarded (they are not usable: another timeline)."""
        storage, resumed_from = self.storage, None
        if opts.from_scratch:
            self._start_over(opts)
            return None
        existing, broken = ck.survey(storage)  # a manifest that cannot be read is never "no checkpoint"
        if (existing or broken) and not opts.resume:
            newest = f"newest step {existing[0].step}" if existing else f"unreadable: {broken[0]}"
            raise ck.CheckpointError(f"{storage.uri} already holds checkpoints ({newest}); pass --resume to continue "
                                     "from them or choose another checkpoint.uri")
        if opts.resume:
            m = self.newest_valid()
            if m is None and (existing or broken):
                why = f"newest step {existing[0].step}" if existing else f"{len(broken)} manifest(s) unreadable: {broken[0]}"
                raise ck.CheckpointError(
                    f"none of the {len(existing) + len(broken)} committed checkpoints under {storage.uri} verifies "
                    f"({why}); refusing to start over from step 0. Inspect them with `frenzy checkpoints "
                    f"{storage.uri} --verify`, or pass --from-scratch --discard-checkpoints to delete them and train "
                    "from step 0 (or --from-scratch with another --checkpoint-uri to keep them)")
            if m is not None:
                resumed_from = m.step
                log.info("resumed from step %d (%s)", m.step, storage.url(ck.step_dir(m.step)))
                self.prog.emit("resume", step=m.step)
        self.discard_after(resumed_from or 0, warn=True)
        return resumed_from

    def _start_over(self, opts: TrainOptions) -> None:
        """`--from-scratch`: step 0. Checkpoints already under the root are kept and the start refused, unless
        `discard_checkpoints` asks to delete them (every step directory, committed or partial)."""
        steps = ck.list_steps(self.storage)
        if steps and not opts.discard_checkpoints:
            raise ck.CheckpointError(
                f"--from-scratch: {self.storage.uri} already holds {len(steps)} checkpoint step(s) (newest "
                f"{ck.step_dir(steps[0])}); they are kept. Give this run another --checkpoint-uri, or add "
                "--discard-checkpoints to delete them and train from step 0")
        if steps:
            log.warning("--from-scratch --discard-checkpoints: deleting %d step(s) under %s", len(steps),
                        self.storage.uri)
            self.prog.emit("checkpoints_discarded", steps=steps)
        self.discard_after(-1, warn=True)

    def discard_after(self, step: int, warn: bool = False) -> None:
        """Rank 0 removes commits newer than `step`; every rank waits for it."""
        if self.d.rank == 0:
            for s in ck.discard_after(self.storage, step):
                if warn:
                    log.warning("discarded step_%08d: newer than the resume point and not usable", s)
        if self.d.on:
            dist.barrier()
