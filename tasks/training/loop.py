"""The training loop: one process per device (torchrun), DDP or FSDP2 data parallel, async checkpoints.

`train(options)` runs on every rank. It resumes from the newest checkpoint that verifies, trains to
`training.steps`, snapshots every `checkpoint.every_steps` (blocking only for the copy), rolls back over loss
spikes, writes op traces for sampled steps, and streams progress records to `<run_dir>/progress.jsonl`,
which the CLI and the Prefect task tail. Rank 0 writes `<run_dir>/result.json`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tasks.jobspec import JobSpec
from tasks.training import checkpoint as ck
from tasks.training import data as D
from tasks.training import reshard
from tasks.training.guard import SpikeGuard
from tasks.training.interval import Cadence, agree_max
from tasks.training.model import GPT
from tasks.training.optrace import OpTracer, merge_traces
from tasks.training.state import restore, training_tensors
from tasks.training.storage import Storage
from tasks.training.writer import WriterLease, WriterLeaseError, trainer_lease

log = logging.getLogger("frenzy.train")


@dataclass
class TrainOptions:
    job: JobSpec
    run_dir: Path
    resume: bool = False
    """Continue from the newest checkpoint that verifies; False refuses to overwrite existing checkpoints."""
    from_scratch: bool = False
    """With `resume`: when no committed checkpoint verifies, discard them and start at step 0 (else refuse)."""
    device: str = "auto"
    """`auto` (CUDA when present), `cpu` or `cuda`."""
    threads: int | None = None
    """torch intra-op threads per process; None keeps torch's default."""
    stop_after_steps: int | None = None
    """Stop (as if preempted) after this many steps of this invocation; for drills."""
    tp: int = 1
    """Tensor-parallel degree (DTensor, Megatron-style column/row sharding); data parallel is world / tp."""


@dataclass
class _Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    tp: int = 1

    @property
    def on(self) -> bool:
        return self.world > 1

    @property
    def dp(self) -> int:
        return self.world // self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp


@dataclass
class _Progress:
    path: Path
    rank: int
    records: list[dict] = field(default_factory=list)

    lock: threading.Lock = field(default_factory=threading.Lock)

    def emit(self, event: str, **kw: object) -> None:
        """Append one record (the persist thread emits commits, so writes are serialised)."""
        if self.rank != 0:
            return
        rec = {"event": event, "time": time.time(), **kw}
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.records.append(rec)


def _setup(opts: TrainOptions) -> tuple[_Dist, torch.device]:
    d = _Dist(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
              int(os.environ.get("LOCAL_RANK", 0)), opts.tp)
    if d.world % d.tp:
        raise ValueError(f"tp={d.tp} does not divide the {d.world} ranks; use --nproc a multiple of --tp")
    use_cuda = opts.device == "cuda" or (opts.device == "auto" and torch.cuda.is_available())
    dev = torch.device(f"cuda:{d.local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if d.on and not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:nccl" if use_cuda else "gloo")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    return d, dev


def lr_at(step: int, spec: JobSpec) -> float:
    t = spec.training
    warm = t.warmup_steps if t.warmup_steps is not None else min(100, t.steps // 10)
    if step <= warm:
        return t.lr * step / max(warm, 1)
    frac = (step - warm) / max(t.steps - warm, 1)
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def _wrap(model: torch.nn.Module, job: JobSpec, d: _Dist, dev: torch.device) -> torch.nn.Module:
    """Tensor parallel within groups of `tp` ranks, then data parallel across them: DDP, or FSDP2 for ZeRO-3
    (and always FSDP2 with tp > 1, since DDP does not take DTensor parameters)."""
    if not d.on:
        return model
    if d.tp == 1 and job.training.zero_stage < 3:
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(dev.type, (d.dp, d.tp), mesh_dim_names=("dp", "tp"))
    if d.tp > 1:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        spec = job.model
        for what, n in (("heads", spec.heads), ("kv_heads", spec.n_kv_heads), ("ffn", spec.ffn)):
            if n % d.tp:
                raise ValueError(f"tp={d.tp} does not divide the model's {what}={n}; choose a tp that does")
        plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "proj": RowwiseParallel(),
                "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        if spec.mlp == "swiglu":
            plan["fc3"] = ColwiseParallel()
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], plan)
    if d.dp > 1:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return model


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global gradient norm over plain and DTensor gradients (torch's clip refuses a mix), clipped in place."""
    norms = []
    for p in params:
        if p.grad is None:
            continue
        n = torch.linalg.vector_norm(p.grad, 2, dtype=torch.float32)
        norms.append(n.full_tensor() if hasattr(n, "full_tensor") else n)
    total = torch.linalg.vector_norm(torch.stack(norms), 2)
    coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))  # one host sync, not one per parameter
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return total


def _optimizer(params: list[torch.nn.Parameter], t: Any, plain: bool) -> torch.optim.Optimizer:
    """AdamW/Adam with the fused kernel where torch has it for these parameters (plain tensors), else torch's own
    choice (a tensor-parallel model mixes DTensor and plain parameters, which the multi-tensor kernels refuse);
    SGD with momentum."""
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr, momentum=0.9)
    cls = torch.optim.AdamW if t.optimizer == "adamw" else torch.optim.Adam
    kw = {"lr": t.lr, "betas": (0.9, 0.95), "weight_decay": 0.1 if t.optimizer == "adamw" else 0.0}
    if plain:
        try:
            return cls(params, fused=True, **kw)
        except (RuntimeError, ValueError):  # no fused kernel for this device or dtype
            pass
    return cls(params, **kw)


def _fingerprint(job: JobSpec, corpus_sha: str, world: int, tp: int, tokenizer_sha: str) -> dict:
    t = job.training
    return {"corpus_sha256": corpus_sha, "model": job.model.shape_dump(), "tokenizer_sha256": tokenizer_sha,
            "seq_len": t.seq_len, "global_batch": t.global_batch, "world_size": world,
            "zero_stage": t.zero_stage, "seed": t.seed, "tp": tp}


def _agree(d: _Dist, ok: bool) -> bool:
    if not d.on:
        return ok
    t = torch.tensor([1 if ok else 0])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _fault_inject(step: int, run_dir: Path) -> None:
    """Drills and tests, each fired once per run directory: FRENZY_FAULT_RAISE="STEP:MESSAGE" prints MESSAGE as
    an error line and exits 1 at STEP (e.g. a CUDA error or an OOM as the real stack prints it);
    FRENZY_FAULT_HANG="STEP" stops making progress at STEP (a hang)."""
    for var in ("FRENZY_FAULT_RAISE", "FRENZY_FAULT_HANG"):
        spec = os.environ.get(var)
        if not spec:
            continue
        at, _, msg = spec.partition(":")
        marker = run_dir / f".fault-{var.lower()}"
        if step != int(at) or marker.exists():
            continue
        marker.write_text(str(step))
        if var == "FRENZY_FAULT_HANG":
            log.warning("fault injection: hanging at step %d", step)
            while True:
                time.sleep(3600)
        print(msg, file=sys.stderr, flush=True)
        os._exit(1)


def train(opts: TrainOptions) -> dict:
    """Run (or resume) the job on this rank; returns the result record (complete on rank 0). Rank 0 holds the
    checkpoint root's writer lease (tasks/training/writer.py) from before it reads the root until it exits."""
    d, dev = _setup(opts)
    storage = Storage(opts.job.training.checkpoint.uri)
    # [elastic hook] a --resume waits for an orphan of a killed launcher that is committing (writer.trainer_lease)
    lease = trainer_lease(storage, opts.job.name, opts.resume, opts.run_dir / "progress.jsonl") \
        if d.rank == 0 else None
    with lease or contextlib.nullcontext():
        return _train(opts, d, dev, storage, lease)


def _train(opts: TrainOptions, d: _Dist, dev: torch.device, storage: Storage, lease: WriterLease | None) -> dict:
    job, t = opts.job, opts.job.training
    opts.run_dir.mkdir(parents=True, exist_ok=True)
    prog = _Progress(opts.run_dir / "progress.jsonl", d.rank)
    tok = D.resolve_tokenizer(t.data, job.model.hf)
    if tok.name == "byte" and not t.data.tokenizer and job.model.vocab > 256:
        raise ValueError(f"model vocab is {job.model.vocab} but no tokenizer is given, so the default is byte-level "
                         "(256 tokens): set data.tokenizer to a tokenizer.json or model directory (`frenzy tokenizer "
                         "train` makes one), or data.tokenizer: byte to train byte-level with this vocab anyway")
    if tok.vocab_size > job.model.vocab:
        raise ValueError(f"the tokenizer ({tok.name}) has {tok.vocab_size} tokens but model vocab is {job.model.vocab}: "
                         f"set model.vocab >= {tok.vocab_size}, or choose a tokenizer that fits (data.tokenizer)")
    if t.global_batch % d.dp:
        raise ValueError(f"global_batch={t.global_batch} is not divisible by {d.dp} data-parallel ranks")
    local = t.global_batch // d.dp
    mb = min(t.micro_batch or local, local)
    if local % mb:
        raise ValueError(f"per-rank batch {local} is not divisible by micro_batch={mb}")

    tokens = D.load_corpus(t.data, tok)
    D.check_vocab(tokens, job.model.vocab, f"the corpus at {t.data.path or t.data.source}")
    train_tokens, _ = D.split(tokens)
    corpus_sha = D.fingerprint(train_tokens)
    tok_key, tok_json = None, tok.to_json()
    if tok_json is not None:  # the tokenizer travels with the checkpoints (evaluation and export read it)
        tok_key = f"tokenizer-{tok.sha256[:16]}.json"
        if d.rank == 0 and not storage.exists(tok_key):
            storage.put(tok_key, tok_json.encode())
    noise = [((s - 1) * t.global_batch, s * t.global_batch) for s in t.data.inject_spike_steps]
    loader = D.BatchLoader(train_tokens, t.seq_len, t.global_batch, t.seed, noise)

    torch.manual_seed(t.seed)
    with torch.device(dev):  # built where it trains: no CPU copy of a large model first
        model = GPT(job.model, t.seq_len, attention=t.attention, recompute=t.recompute)
    if job.model.hf:  # continued training: step 0 is the directory's weights (a resume overwrites them below)
        from tasks.hf.convert import load_into

        load_into(model, job.model.hf, t.seq_len)
    if t.precision == "bf16":
        model = model.to(torch.bfloat16)
    core = model
    model = _wrap(model, job, d, dev)
    if t.compile:  # per block, in place: parameter names (and so checkpoints) stay those of the eager model
        for block in core.blocks:
            block.compile()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _optimizer(params, t, plain=d.tp == 1 and t.zero_stage != 3)
    amp_dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(t.precision)
    scaler = torch.amp.GradScaler(dev.type, enabled=t.precision == "fp16-mixed")
    guard = SpikeGuard(t.spike, t.global_batch, scaler_enabled=scaler.is_enabled())
    detector = guard.detector
    cursor = D.Cursor()
    fp = _fingerprint(job, corpus_sha, d.world, d.tp, tok.sha256)
    owns_model = d.rank == 0 or job.training.zero_stage == 3 or d.tp > 1  # DDP: rank 0 holds the one replica

    def load(m: ck.Manifest) -> None:
        diff = reshard.mismatch(m.fingerprint, fp)
        if diff:
            raise ck.CheckpointMismatch(f"checkpoint step {m.step} at {storage.uri} was written by a different job "
                                     f"({', '.join(diff)} differ); use another checkpoint.uri or the same job")
        # [elastic hook] another layout (world size, tp, zero stage, global batch): reshard on load (reshard.py)
        changes = reshard.layout_changes(m.fingerprint, fp)
        if changes:
            if d.rank == 0:
                msg = reshard.describe(changes, int(m.cursor.get("samples", 0)), t.seq_len)
                log.warning("%s", msg)
                prog.emit("resharded", step=m.step, changes={k: list(v) for k, v in changes.items()}, message=msg)
            tensors = reshard.read_resharded(storage, m, core, d.rank)
        else:
            by_rank = {s.rank: s for s in m.shards}
            tensors = ck.read_shard(storage, by_rank[d.rank])
            if not owns_model:  # DDP: rank 0 wrote the one replica of model and optimizer; every rank loads it
                tensors = {**ck.read_shard(storage, by_rank[0]), **tensors}
        restore(core, optimizer, tensors, with_model=True)
        saved = D.Cursor.from_dict(m.cursor)
        cursor.samples, cursor.skips = saved.samples, saved.skips
        detector.load(m.trainer["spike"])
        if m.trainer.get("scaler"):
            scaler.load_state_dict(m.trainer["scaler"])

    def newest_valid(before: int | None = None, healthy_only: bool = False) -> ck.Manifest | None:
        for m in ck.committed(storage):
            if (before is not None and m.step >= before) or (healthy_only and not m.healthy):
                continue
            try:
                ok = True
                load(m)
            except ck.CheckpointMismatch:
                raise
            except ck.CheckpointError as err:
                log.warning("rank %d: %s; trying an older checkpoint", d.rank, err)
                prog.emit("checkpoint_rejected", step=m.step, reason=str(err))
                ok = False
            if _agree(d, ok):
                return m
        return None

    step, resumed_from = 0, None
    existing = ck.committed(storage)
    if existing and not opts.resume:
        raise ck.CheckpointError(f"{storage.uri} already holds checkpoints (newest step {existing[0].step}); "
                                 "pass --resume to continue from them or choose another checkpoint.uri")
    if opts.resume:
        m = newest_valid()
        if m is None and existing and not opts.from_scratch:
            raise ck.CheckpointError(
                f"none of the {len(existing)} committed checkpoints under {storage.uri} verifies (newest step "
                f"{existing[0].step}); refusing to start over from step 0. Inspect them with `frenzy checkpoints "
                f"{storage.uri} --verify`, or pass --from-scratch to discard them and train from step 0")
        if m is not None:
            step = resumed_from = m.step
            log.info("resumed from step %d (%s)", step, storage.url(ck.step_dir(step)))
            prog.emit("resume", step=step)
    if d.rank == 0:
        for s in ck.discard_after(storage, step):
            log.warning("discarded step_%08d: newer than the resume point and not usable", s)
    if d.on:
        dist.barrier()

    ckpt = ck.AsyncCheckpointer(storage, d.rank, d.world, run=job.name, keep=t.checkpoint.keep,
                                on_commit=lambda r, m: prog.emit("checkpoint", **r.model_dump()),
                                ranks_on_host=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                                fence=lease.holds if lease is not None else None)
    if optimizer.state:  # resumed: the state exists, so the snapshot buffers can be made now, in the background
        ckpt.prepare(*training_tensors(core, optimizer, with_model=owns_model))
    # the straggler format traces one tensor-parallel rank per data-parallel rank
    tracer = OpTracer(d.rank, d.dp_rank, t.trace_every_steps if d.rank % d.tp == 0 else 0)
    dp_hook(model, tracer)
    last_loss, last_gnorm = float("nan"), float("nan")
    tokens_per_step = t.global_batch * t.seq_len
    t_start, steps_run, blocked_total, data_s = time.perf_counter(), 0, 0.0, 0.0
    t_last_update = t_start  # the end of the newest optimizer step: tokens/s is over training, up to the last update
    model.train()
    preempt = threading.Event()
    stop_file = opts.run_dir / "stop"
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a preemption, a cancelled flow, torchrun shutting down): finish the step, checkpoint, exit
        signal.signal(signal.SIGTERM, lambda *_: preempt.set())
    last_saved = step
    # [elastic hook] when to checkpoint: every N steps or `auto` (Young/Daly, re-tuned at each save; interval.py)
    cadence = Cadence(t.checkpoint.every_steps, t.steps, d.world, t.checkpoint.mtbf_s, agree_max,
                      lambda i: (log.info("checkpoint interval: %s", i), prog.emit("checkpoint_interval", **asdict(i))))
    cadence.start(step)
    due_at: int | None = None  # the step a checkpoint came due at, while it waits for a free snapshot buffer
    failed_reported: list[int] = []
    warned_interval = False

    def save_now(block: bool = True, stage: bool = False) -> bool:
        """Snapshot and queue the persist; False when every buffer is still persisting (try again next step)."""
        nonlocal blocked_total, last_saved
        tensors, glob = training_tensors(core, optimizer, with_model=owns_model)
        healthy = detector.last_spike_step is None or step - detector.last_spike_step > t.spike.window
        fields = {"layout": {"dp": d.dp, "tp": d.tp, "zero_stage": t.zero_stage}, "cursor": cursor.to_dict(),
                  "loss": {"last": last_loss, "grad_norm": last_gnorm, **detector.stats()},
                  "healthy": healthy, "fingerprint": fp,
                  "trainer": {"spike": detector.state(), "scaler": scaler.state_dict() if scaler.is_enabled()
                              else None, "lr": lr_at(step, job),
                              # evaluation rebuilds the held-out split from it (not part of the fingerprint)
                              "data": t.data.model_dump(mode="json"),
                              # the tokenizer.json beside the checkpoints (None: byte-level)
                              "tokenizer": tok_key, "eos_id": tok.eos_id}}
        blocked = ckpt.save(step, tensors, fields, shard_meta=glob, block=block, stage=stage,
                            deferred_steps=step - (due_at if due_at is not None else step))
        if blocked is None:
            return False
        blocked_total += blocked
        last_saved = step
        cadence.saved(step, blocked, ckpt.last_persist_s)  # [elastic hook]
        while len(ckpt.failed) > len(failed_reported):  # a persist that failed cost its checkpoint, not the run
            f_step, f_err = ckpt.failed[len(failed_reported)]
            failed_reported.append(f_step)
            prog.emit("checkpoint_failed", step=f_step, error=f_err)
        return True

    stopped = False
    while step < t.steps:
        _fault_inject(step, opts.run_dir)
        if lease is not None and lease.lost.is_set():  # someone took the root over: commit nothing more
            raise WriterLeaseError(f"lost the writer lease of {storage.uri} at step {step}: another trainer took "
                                   "it over; this one stops without committing (see `frenzy checkpoints`)")
        stopped = preempt.is_set() or (opts.stop_after_steps is not None and steps_run >= opts.stop_after_steps) \
            or stop_file.exists()  # request_stop(): how an executor without signals (Ray actors) stops the ranks
        if not _agree(d, not stopped):  # every rank stops at the same step
            stopped = True
            break
        traced = tracer.begin_step(step + 1)
        indices = loader.next_indices(cursor)
        mine = indices[d.dp_rank * local:(d.dp_rank + 1) * local]
        D.record_samples(opts.run_dir, d.rank, step + 1, mine)  # [elastic hook] FRENZY_SAMPLE_LOG=1 audit
        for g in optimizer.param_groups:
            g["lr"] = lr_at(step + 1, job)
        loss_sum = torch.zeros((), dtype=torch.float32, device=dev)
        n_mb = local // mb
        for i in range(n_mb):
            t_data = time.perf_counter()
            x, y = loader.batch(mine[i * mb:(i + 1) * mb])
            data_s += time.perf_counter() - t_data
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            sync = contextlib.nullcontext() if (i == n_mb - 1 or not hasattr(model, "no_sync")) else model.no_sync()
            with sync:
                t0 = time.perf_counter()
                with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    loss = model(x, y) / n_mb
                t1 = _sync_time(dev, traced)
                tracer.record("forward-compute", t0, t1, mb_id=i)
                scaler.scale(loss).backward()
                tracer.record("backward-compute", t1, _sync_time(dev, traced), mb_id=i)
            loss_sum += loss.detach()
        t0 = time.perf_counter()
        if d.on:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
            loss_sum /= d.world
        scaler.unscale_(optimizer)
        max_norm = t.grad_clip if t.grad_clip > 0 else float("inf")
        gnorm = clip_grad_norm(params, max_norm) if d.tp > 1 else torch.nn.utils.clip_grad_norm_(params, max_norm)
        g = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
        # the step's one host sync: the spike check needs loss and grad norm before the update
        last_loss, last_gnorm = torch.stack([loss_sum.float(), g.float().to(loss_sum.device)]).tolist()
        decision = guard.judge(step + 1, last_loss, last_gnorm)
        if decision.record is not None:
            prog.emit("spike", **decision.record)
        if decision.action != "apply":
            tracer.drop(step + 1)
            optimizer.zero_grad(set_to_none=True)
            scaler.update()  # an fp16 overflow lowers the loss scale here
            if decision.action == "overflow":
                continue
            ckpt.wait()
            spike_step, skips = step + 1, list(cursor.skips)
            target = newest_valid(before=step + 1, healthy_only=True) if guard.may_roll_back() else None
            window = guard.window(indices[0], rolled_back=target is not None)
            cursor.skips = sorted(set(cursor.skips) | set(skips) | {window})
            if target is not None:
                step = target.step
                if d.rank == 0:
                    ck.discard_after(storage, step)
                if d.on:
                    dist.barrier()
            rec = guard.skipped(spike_step, last_loss, last_gnorm,
                                decision.verdict, window, target.step if target is not None else None)
            prog.emit("spike", **rec)
            continue
        blocked_total += ckpt.barrier()  # a staged snapshot must be copied before the update changes the tensors
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        steps_run += 1
        guard.passed(step)
        t_last_update = time.perf_counter()  # intermediate snapshots count (they happen between updates)
        cadence.step_done(t_last_update, ckpt.persisting.is_set())  # [elastic hook]
        if traced:
            tracer.record("optimizer", t0, _sync_time(dev, traced))
        if d.rank == 0 and (step % t.log_every_steps == 0 or step == t.steps):
            el = time.perf_counter() - t_start
            tps = steps_run * tokens_per_step / el
            eta = (t.steps - step) * el / steps_run
            prog.emit("step", step=step, steps=t.steps, loss=last_loss, grad_norm=last_gnorm, tokens_per_s=tps,
                      eta_s=eta, lr=lr_at(step, job))
            log.info("step %d/%d loss %.4f gnorm %.3f %.0f tok/s ETA %.0fs", step, t.steps, last_loss, last_gnorm,
                     tps, eta)
        if steps_run == 1 and optimizer.state:
            ckpt.prepare(*training_tensors(core, optimizer, with_model=owns_model))
        if cadence.due(step) or step == t.steps:  # [elastic hook]
            due_at = step if due_at is None else due_at
        if due_at is not None:
            # every rank must take the same decision, or the ranks would snapshot different steps
            if _agree(d, not ckpt.busy()) or step == t.steps:
                # staged: the copy runs beside the next forward/backward and is waited for before the next
                # optimizer step (the only thing that changes the saved tensors); the last save copies at once
                save_now(block=True, stage=step != t.steps)
                due_at = None
            else:
                if step == due_at:
                    prog.emit("checkpoint_deferred", step=step, reason="the previous persist is still running")
                if not warned_interval and d.rank == 0:
                    warned_interval = True
                    step_s = (time.perf_counter() - t_start) / steps_run
                    persist_s = ckpt.last_persist_s or 0.0
                    fit = max(cadence.every + 1, int(persist_s / max(step_s, 1e-9)) + 1)
                    log.warning("checkpoint of step %d deferred: the previous persist (%.1f s) outlasts %d steps of "
                                "%.2f s; checkpoint.every_steps >= %d would fit", step, persist_s,
                                cadence.every, step_s, fit)
                    prog.emit("warning", message=f"checkpoint.every_steps={cadence.every} is shorter "
                                                 f"than a persist ({persist_s:.1f} s); >= {fit} would fit")
    if stopped and last_saved != step:
        log.warning("stopping at step %d: taking a final checkpoint first", step)
        save_now(block=True)
    # tokens/s: from the first step to the last optimizer update; the final checkpoint (its snapshot is
    # blocked_s of the last record) and the wait for its persist come after training and are reported apart
    loop_s = t_last_update - t_start
    ckpt.close()
    elapsed = time.perf_counter() - t_start
    trace_path = None
    tracer.write(opts.run_dir / "trace")
    if d.on:
        dist.barrier()
    if d.rank == 0:
        trace_path = merge_traces(opts.run_dir / "trace", job.name, d.dp, d.tp, d.world)
    result = {"job": job.name, "final_step": step, "resumed_from_step": resumed_from, "stopped_early": stopped,
              "checkpoints": [r.model_dump() for r in ckpt.records], "spikes": guard.records,
              "spike_counts": guard.counts.model_dump(),
              "checkpoint_interval": cadence.describe(),  # [elastic hook] the interval and its inputs
              "failed_checkpoints": [{"step": s_, "error": e_} for s_, e_ in ckpt.failed],
              "last_loss": last_loss, "steps_run": steps_run, "elapsed_s": elapsed,
              "tokens_per_s": steps_run * tokens_per_step / loop_s if steps_run else 0.0,
              "blocked_s_total": blocked_total,
              # reading and batching the data, on this rank, against the loop's time (the loader keeping up)
              "data_s_total": data_s, "data_fraction": data_s / loop_s if steps_run and loop_s > 0 else 0.0,
              "world_size": d.world, "tp": d.tp, "device": str(dev),
              "checkpoint_uri": storage.uri, "trace": str(trace_path) if trace_path else None,
              "run_dir": str(opts.run_dir)}
    if d.rank == 0:
        prog.emit("done", final_step=step, stopped_early=stopped)
        (opts.run_dir / "result.json").write_text(json.dumps(result, indent=1))
    if d.on:
        dist.barrier()
    return result


def _sync_time(dev: torch.device, traced: bool) -> float:
    """A timestamp for the op trace; on a GPU it waits for the queued kernels, so only on traced steps."""
    if traced and dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter()


def dp_hook(model: torch.nn.Module, tracer: OpTracer) -> None:
    """Time DDP's gradient all-reduce per bucket as `separate-grads-all-reduce` ops (no-op without DDP)."""
    if not hasattr(model, "register_comm_hook"):
        return

    def hook(_state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        t0 = time.perf_counter()
        world = dist.get_world_size()
        fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            tracer.record("separate-grads-all-reduce", t0, time.perf_counter())
            return f.value()[0]

        return fut.then(done)

    # DDP checks the hook's annotations as objects; this module's are strings (postponed evaluation)
    hook.__annotations__ = {"_state": object, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
    model.register_comm_hook(None, hook)
