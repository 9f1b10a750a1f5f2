"""GPU catalog: memory, dense half-precision throughput, bandwidths and the memory overheads of each type.

Figures are vendor datasheet numbers (dense, no sparsity; GeForce cards at fp32 accumulate). Memory is what
the driver reports (MiB / 1024). `context_gib` and `alloc_frag` are the non-tensor overheads of the memory
model; without a measurement on that GPU they are the defaults documented in docs/memory-model.md.
Extend or override with a YAML file: `load_catalog("my_gpus.yaml")` or `FRENZY_GPU_CATALOG=path`.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tasks.errors import FrenzyError
from tasks.userfiles import UserFileError, load_yaml, refuse_bool_numbers, validation_message


class GPUType(BaseModel):
    """One GPU model."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(classmethod(refuse_bool_numbers))

    name: str = Field(min_length=1, max_length=64)
    """Catalog name used in cluster YAML (e.g. `A100-40GB-SXM`)."""
    memory_gib: float = Field(gt=0)
    """Device memory as reported by the driver, GiB."""
    bf16_tflops: float = Field(ge=0)
    """Dense bf16 tensor throughput; 0 when the GPU has no bf16 (Turing, Volta)."""
    fp16_tflops: float = Field(gt=0)
    """Dense fp16 tensor throughput (fp32 accumulate)."""
    fp32_tflops: float = Field(gt=0)
    """Dense fp32 (non-tensor) throughput."""
    mem_bw_gbs: float = Field(gt=0)
    """Device memory bandwidth, GB/s."""
    link: str = "pcie"
    """Default intra-node link: `nvlink` or `pcie` (a node's `interconnect` overrides it)."""
    link_gbs: float = Field(gt=0)
    """Intra-node bandwidth per GPU per direction over `link`, GB/s."""
    context_gib: float = 0.5
    """CUDA context + kernel images + cuBLAS workspace, GiB (what nvidia-smi shows before any tensor)."""
    alloc_frag: float = Field(0.06, ge=0)
    """Caching-allocator overhead: reserved = allocated x (1 + alloc_frag) at the peak."""
    aliases: tuple[str, ...] = ()
    """Other spellings, including the names pynvml reports."""

    def tflops(self, precision: str) -> float:
        """Dense throughput for a job precision; bf16 on a GPU without bf16 runs at fp32 rate."""
        if precision == "fp32":
            return self.fp32_tflops
        if precision.startswith("fp16"):
            return self.fp16_tflops
        return self.bf16_tflops or self.fp32_tflops


def _g(name: str, mem: float, bf16: float, fp16: float, fp32: float, bw: float, link: str, link_gbs: float,
       *aliases: str, context: float = 0.5) -> GPUType:
    return GPUType(name=name, memory_gib=mem, bf16_tflops=bf16, fp16_tflops=fp16, fp32_tflops=fp32,
                   mem_bw_gbs=bw, link=link, link_gbs=link_gbs, aliases=aliases, context_gib=context)


_BUILTIN = [
    _g("RTX-2080Ti", 11.0, 0, 53.8, 13.4, 616, "pcie", 12, "NVIDIA GeForce RTX 2080 Ti", "2080Ti",
       context=0.35),
    _g("RTX-3090", 24.0, 71, 71, 35.6, 936, "pcie", 24, "NVIDIA GeForce RTX 3090", "3090"),
    _g("RTX-4090", 24.0, 165.2, 165.2, 82.6, 1008, "pcie", 24, "NVIDIA GeForce RTX 4090", "4090"),
    _g("Quadro-RTX-6000", 24.0, 0, 130.5, 16.3, 672, "pcie", 12, "Quadro RTX 6000", "RTX6000",
       context=0.35),
    _g("T4", 15.0, 0, 65, 8.1, 320, "pcie", 12, "Tesla T4", context=0.35),
    _g("V100-16GB", 16.0, 0, 125, 15.7, 900, "nvlink", 150, "Tesla V100-SXM2-16GB", "V100", context=0.4),
    _g("V100-32GB", 32.0, 0, 125, 15.7, 900, "nvlink", 150, "Tesla V100-SXM2-32GB", context=0.4),
    _g("A10", 22.5, 125, 125, 31.2, 600, "pcie", 24, "NVIDIA A10"),
    _g("A100-40GB-PCIE", 40.0, 312, 312, 19.5, 1555, "pcie", 24, "NVIDIA A100-PCIE-40GB", "A100-40GB"),
    _g("A100-40GB-SXM", 40.0, 312, 312, 19.5, 1555, "nvlink", 300, "NVIDIA A100-SXM4-40GB"),
    _g("A100-80GB-PCIE", 80.0, 312, 312, 19.5, 1935, "pcie", 24, "NVIDIA A100 80GB PCIe", "A100-80GB"),
    _g("A100-80GB-SXM", 80.0, 312, 312, 19.5, 2039, "nvlink", 300, "NVIDIA A100-SXM4-80GB"),
    _g("A800-80GB", 80.0, 312, 312, 19.5, 2039, "nvlink", 200, "NVIDIA A800-SXM4-80GB", "A800"),
    _g("L40S", 45.0, 362, 362, 91.6, 864, "pcie", 24, "NVIDIA L40S"),
    # context: device memory outside torch's allocator measured on an H100 80GB HBM3 (driver 580, CUDA 13, torch
    # 2.11) after training steps, benchmarks/results/gpu_h100.md
    _g("H100-80GB", 79.6, 989, 989, 67, 3350, "nvlink", 450, "NVIDIA H100 80GB HBM3", "H100", context=0.75),
    # context measured the same way on an H200 (driver 580, torch 2.11), benchmarks/results/gpu_h200.md
    _g("H200-141GB", 140.4, 989, 989, 67, 4800, "nvlink", 450, "NVIDIA H200", "H200", context=0.75),
]


class CatalogError(FrenzyError, ValueError):
    """A GPU name that is not in the catalog, or a bad catalog file."""


class Catalog:
    """Name -> GPUType with case-insensitive aliases."""

    def __init__(self, gpus: list[GPUType]) -> None:
        self.gpus: dict[str, GPUType] = {}
        self._index: dict[str, str] = {}
        for g in gpus:
            self.add(g)

    def add(self, g: GPUType) -> None:
        self.gpus[g.name] = g
        for key in (g.name, *g.aliases):
            self._index[key.lower()] = g.name

    def get(self, name: str) -> GPUType:
        key = self._index.get(name.lower())
        if key is None:
            raise CatalogError(
                f"unknown GPU type {name!r}; known: {', '.join(sorted(self.gpus))}. "
                "Add it with a catalog YAML (FRENZY_GPU_CATALOG=path, see docs/clusters.md)."
            )
        return self.gpus[key]

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._index


def load_catalog(extra: str | Path | None = None) -> Catalog:
    """The built-in catalog, extended/overridden by a YAML list of GPU entries (fields of `GPUType`)."""
    cat = Catalog(list(_BUILTIN))
    path = extra or os.environ.get("FRENZY_GPU_CATALOG")
    if path:
        try:
            doc = load_yaml(path, "GPU catalog file")
        except UserFileError as err:
            raise CatalogError(f"GPU catalog (FRENZY_GPU_CATALOG): {err}") from None
        rows = doc.data.get("gpus") if isinstance(doc.data, dict) else doc.data
        if not isinstance(rows, list):
            raise CatalogError(f"GPU catalog {path}: a list of GPU entries (or `gpus: [...]`); see docs/clusters.md")
        for i, row in enumerate(rows):
            try:
                cat.add(GPUType.model_validate(row))
            except ValidationError as err:
                at = ("gpus", i) if isinstance(doc.data, dict) else (i,)
                raise CatalogError(validation_message(err, doc, str(path), "GPU catalog", at)) from None
    return cat


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    return load_catalog()
