"""What a checkpoint holds, as named tensors: parameters, optimizer moments, RNG states.

Names are stable across runs (parameter names, not optimizer indices) so a manifest can be read back by
evaluation without the optimizer. Under DDP only rank 0 writes the replicated model and optimizer; every
rank writes its own RNG state. Distributed tensors (FSDP2, tensor parallel) are written as their local shard
with the global shape and offset recorded.
"""

from __future__ import annotations

import torch
from torch import nn

from tasks.training.checkpoint import CheckpointMismatch


def _local(t: torch.Tensor) -> tuple[torch.Tensor, list[int] | None, list[int] | None]:
    """(local tensor, global shape, global offset) — DTensor shards become plain tensors."""
    if hasattr(t, "to_local") and hasattr(t, "device_mesh"):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local = t.to_local()
        _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return local, list(t.shape), list(offset)
    return t, None, None


def training_tensors(model: nn.Module, optimizer: torch.optim.Optimizer, with_model: bool
                     ) -> tuple[list[tuple[str, torch.Tensor]], dict[str, tuple[list[int], list[int]]]]:
    """Named tensors to snapshot, and the global (shape, offset) of those that are shards."""
    out: list[tuple[str, torch.Tensor]] = []
    glob: dict[str, tuple[list[int], list[int]]] = {}

    def add(name: str, t: torch.Tensor) -> None:
        local, gshape, goff = _local(t)
        out.append((name, local))
        if gshape is not None:
            glob[name] = (gshape, goff)

    if with_model:
        # Frenzy's GPT has no persistent buffers (the RoPE tables are rebuilt), so parameters are the model
        for name, p in model.named_parameters():
            add(f"model.{name}", p.detach())
        names = {p: n for n, p in model.named_parameters()}
        for p, st in optimizer.state.items():
            for k, v in sorted(st.items()):
                if isinstance(v, torch.Tensor):
                    add(f"optim.{names[p]}.{k}", v)
    out.append(("rng.cpu", torch.get_rng_state()))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out.append(("rng.cuda", torch.cuda.get_rng_state()))
    return out, glob


def restore(model: nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
            with_model: bool) -> None:
    """Copy a checkpoint's tensors back into the live model, optimizer and RNG (bitwise)."""
    if with_model:
        params = dict(model.named_parameters())
        missing = [n for n in params if f"model.{n}" not in tensors]
        if missing:
            raise CheckpointMismatch(f"checkpoint lacks parameters {missing[:3]}...; was it written by another model shape?")
        with torch.no_grad():
            for n, p in params.items():
                _local(p)[0].copy_(tensors[f"model.{n}"])
        by_param: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            if key.startswith("optim."):
                pname, k = key[len("optim."):].rsplit(".", 1)
                by_param.setdefault(pname, {})[k] = t
        optimizer.state.clear()
        for n, p in params.items():
            if n in by_param:
                dev = _local(p)[0].device
                optimizer.state[p] = {k: (v.clone() if k == "step" else _as_like(v, p, dev))
                                      for k, v in by_param[n].items()}
    torch.set_rng_state(tensors["rng.cpu"].clone())
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"].clone())


def _as_like(v: torch.Tensor, p: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """An optimizer moment on the parameter's device, as a DTensor again when the parameter is one."""
    # a checkpoint of another precision (bf16 -> fp32): the moments take the live parameter's dtype
    local = v.to(dev, dtype=p.dtype if v.is_floating_point() else v.dtype, copy=True)
    if hasattr(p, "device_mesh"):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())
    return local
