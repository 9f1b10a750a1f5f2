"""Set-up of one training rank: the process group, the tokenizer and data, the model, its optimizer.

Everything here runs once, before the first step, and fails with a message that names the fix when the job and
the world do not fit (vocabulary, batch divisibility, tensor-parallel degree).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tasks.jobspec import JobSpec, JobSpecError, tp_misfit
from tasks.training import data as D
from tasks.training.model import GPT
from tasks.training.storage import Storage
from tasks.training.tokenizer import Tokenizer


@dataclass
class TrainOptions:
    job: JobSpec
    run_dir: Path
    resume: bool = False
    """Continue from the newest checkpoint that verifies; False refuses to overwrite existing checkpoints."""
    from_scratch: bool = False
    """Start at step 0 whatever the checkpoint root holds; a root that holds checkpoints is refused (they are kept)
    unless `discard_checkpoints` says to delete them first."""
    discard_checkpoints: bool = False
    """With `from_scratch`: delete the checkpoints already under the root before training from step 0."""
    device: str = "auto"
    """`auto` (CUDA when present), `cpu` or `cuda`."""
    threads: int | None = None
    """torch intra-op threads per process; None keeps torch's default."""
    stop_after_steps: int | None = None
    """Stop (as if preempted) after this many steps of this invocation; for drills."""
    tp: int = 1
    """Tensor-parallel degree (DTensor, Megatron-style column/row sharding); data parallel is world / tp."""


@dataclass
class Dist:
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


def init_dist(opts: TrainOptions) -> tuple[Dist, torch.device]:
    """This rank's place in the world (torchrun's environment), its device, and the process group."""
    d = Dist(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
             int(os.environ.get("LOCAL_RANK", 0)), opts.tp)
    if d.world % d.tp:
        raise JobSpecError(f"tp={d.tp} does not divide the {d.world} ranks; use --nproc a multiple of --tp")
    use_cuda = opts.device == "cuda" or (opts.device == "auto" and torch.cuda.is_available())
    dev = torch.device(f"cuda:{d.local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if d.on and not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:nccl" if use_cuda else "gloo")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    return d, dev


def agree(d: Dist, ok: bool) -> bool:
    """True on every rank only when it is true on every rank (one all-reduce)."""
    if not d.on:
        return ok
    t = torch.tensor([1 if ok else 0])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


@dataclass
class Data:
    """The rank's view of the data: tokenizer, the loader of global batches, and its share of each."""

    tok: Tokenizer
    tok_key: str | None
    """The tokenizer.json beside the checkpoints (None: byte-level)."""
    loader: D.BatchLoader
    corpus_sha: str
    local: int
    """Samples per step on this data-parallel rank."""
    micro: int
    """Samples per forward/backward."""


def _check_tokenizer(job: JobSpec, tok: Tokenizer) -> None:
    if tok.name == "byte" and not job.training.data.tokenizer and job.model.vocab > 256:
        raise JobSpecError(f"model vocab is {job.model.vocab} but no tokenizer is given, so the default is byte-level "
                         "(256 tokens): set data.tokenizer to a tokenizer.json or model directory (`frenzy tokenizer "
                         "train` makes one), or data.tokenizer: byte to train byte-level with this vocab anyway")
    if tok.vocab_size > job.model.vocab:
        raise JobSpecError(f"the tokenizer ({tok.name}) has {tok.vocab_size} tokens but model vocab is {job.model.vocab}: "
                         f"set model.vocab >= {tok.vocab_size}, or choose a tokenizer that fits (data.tokenizer)")


def _batch_shares(job: JobSpec, d: Dist) -> tuple[int, int]:
    t = job.training
    if t.global_batch % d.dp:
        raise JobSpecError(f"global_batch={t.global_batch} is not divisible by {d.dp} data-parallel ranks")
    local = t.global_batch // d.dp
    mb = min(t.micro_batch or local, local)
    if local % mb:
        raise JobSpecError(f"per-rank batch {local} is not divisible by micro_batch={mb}")
    return local, mb


def load_data(job: JobSpec, d: Dist, storage: Storage) -> Data:
    """Tokenizer (checked against the model), corpus, the train split and its loader; rank 0 stores the
    tokenizer beside the checkpoints (evaluation and export read it)."""
    t = job.training
    tok = D.resolve_tokenizer(t.data, job.model.hf)
    _check_tokenizer(job, tok)
    local, mb = _batch_shares(job, d)
    tokens = D.load_corpus(t.data, tok)
    D.check_vocab(tokens, job.model.vocab, f"the corpus at {t.data.path or t.data.source}")
    train_tokens, _ = D.split(tokens)
    tok_key, tok_json = None, tok.to_json()
    if tok_json is not None:
        tok_key = f"tokenizer-{tok.sha256[:16]}.json"
        if d.rank == 0 and not storage.exists(tok_key):
            storage.put(tok_key, tok_json.encode())
    noise = [((s - 1) * t.global_batch, s * t.global_batch) for s in t.data.inject_spike_steps]
    loader = D.BatchLoader(train_tokens, t.seq_len, t.global_batch, t.seed, noise)
    return Data(tok, tok_key, loader, D.fingerprint(train_tokens), local, mb)


@dataclass
class Model:
    """The model as it trains (`model`, wrapped for parallelism) and as it is saved (`core`), its optimizer."""

    model: torch.nn.Module
    core: GPT
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype | None
    owns_model: bool
    """This rank saves model and optimizer tensors (DDP: rank 0 holds the one replica)."""


def build_model(job: JobSpec, d: Dist, dev: torch.device) -> Model:
    t = job.training
    torch.manual_seed(t.seed)
    with torch.device(dev):  # built where it trains: no CPU copy of a large model first
        core = GPT(job.model, t.seq_len, attention=t.attention, recompute=t.recompute)
    if job.model.hf:  # continued training: step 0 is the directory's weights (a resume overwrites them)
        from tasks.hf.convert import load_into

        load_into(core, job.model.hf, t.seq_len)
    if t.precision == "bf16":
        core = core.to(torch.bfloat16)
    model = wrap(core, job, d, dev)
    if t.compile:  # per block, in place: parameter names (and so checkpoints) stay those of the eager model
        for block in core.blocks:
            block.compile()
    params = [p for p in model.parameters() if p.requires_grad]
    return Model(model, core, params, make_optimizer(params, t, plain=d.tp == 1 and t.zero_stage != 3),
                 torch.amp.GradScaler(dev.type, enabled=t.precision == "fp16-mixed"),
                 {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(t.precision),
                 d.rank == 0 or t.zero_stage == 3 or d.tp > 1)


def _tensor_parallel(model: torch.nn.Module, job: JobSpec, tp: int, mesh: Any) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    spec = job.model
    misfit = tp_misfit(job, tp)
    if misfit:
        raise JobSpecError(misfit)
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "proj": RowwiseParallel(),
            "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    if spec.mlp == "swiglu":
        plan["fc3"] = ColwiseParallel()
    for block in model.blocks:
        parallelize_module(block, mesh, plan)


def wrap(model: torch.nn.Module, job: JobSpec, d: Dist, dev: torch.device) -> torch.nn.Module:
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
        _tensor_parallel(model, job, d.tp, mesh["tp"])
    if d.dp > 1:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return model


def make_optimizer(params: list[torch.nn.Parameter], t: Any, plain: bool) -> torch.optim.Optimizer:
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


def fingerprint(job: JobSpec, corpus_sha: str, world: int, tp: int, tokenizer_sha: str) -> dict:
    """What a checkpoint must match to be resumed by this job (reshard.py tells layout changes apart)."""
    t = job.training
    return {"corpus_sha256": corpus_sha, "model": job.model.shape_dump(), "tokenizer_sha256": tokenizer_sha,
            "seq_len": t.seq_len, "global_batch": t.global_batch, "world_size": world,
            "zero_stage": t.zero_stage, "seed": t.seed, "tp": tp}
