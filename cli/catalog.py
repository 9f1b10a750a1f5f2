"""`frenzy gpus` and `frenzy presets`: the GPU catalog and the built-in model presets."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from cli.output import emit, table
from cluster.catalog import default_catalog
from tasks.presets import MODEL_PRESETS


def cmd_gpus(args: argparse.Namespace) -> int:
    gpus = [g.model_dump(exclude={"aliases"}) for g in default_catalog().gpus.values()]
    emit(args, {"gpus": gpus}, lambda: table(gpus, ["name", "memory_gib", "bf16_tflops", "fp16_tflops",
                                                     "mem_bw_gbs", "link", "link_gbs"]))
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from tasks.jobspec import ModelSpec
    from tasks.planning.layout import count_params

    rows = []
    for name in MODEL_PRESETS:
        m = ModelSpec(preset=name)
        rows.append({"preset": name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
                     "kv_heads": m.n_kv_heads, "ffn": m.ffn, "vocab": m.vocab, "mlp": m.mlp,
                     "params_m": round(count_params(m, 2048).total / 1e6, 1)})
    emit(args, {"presets": rows}, lambda: table(rows))
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    add("gpus", cmd_gpus)
    add("presets", cmd_presets)
