"""Cluster inventory: nodes with a GPU type and count, from a YAML file, a preset, or the local host (pynvml).

With no GPU the local host's CPU becomes a device (memory = system RAM) so the pipeline still runs for real.
"""

from __future__ import annotations

import logging
import os
import socket
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cluster.catalog import Catalog, GPUType, default_catalog
from cluster.ray_nodes import GPU_PREFIX, NODE_PREFIX, connect, frenzy_name
from tasks.errors import FrenzyError
from tasks.userfiles import UserFileError, named_yaml, refuse_bool_numbers, validation_message

PRESETS = ("phoebe", "frenzy-testbed")


class Node(BaseModel):
    """One machine: `count` GPUs of one catalog type."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(classmethod(refuse_bool_numbers))

    name: str = Field(min_length=1, max_length=255)
    """Host name (unique in the cluster)."""
    gpu: str
    """GPU catalog name (see `frenzy gpus`)."""
    count: int = Field(ge=1, le=4096)
    """GPUs on this node (at most 4096)."""
    interconnect: Literal["nvlink", "pcie", "none"] | None = None
    """Intra-node link; None means the GPU type's default."""
    inter_node_gbs: float = Field(12.5, gt=0)
    """Network bandwidth per GPU to other nodes, GB/s (12.5 = 100 Gb/s)."""


class Cluster(BaseModel):
    """A heterogeneous cluster."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    name: str = "cluster"
    """Cluster name."""
    nodes: list[Node] = Field(max_length=100_000)
    """The nodes (at least one, at most 100,000)."""

    @model_validator(mode="after")
    def _unique(self) -> Cluster:
        if not self.nodes:
            raise ValueError("the cluster has no nodes; list at least one as {name, gpu, count} (see docs/clusters.md)")
        names = [n.name for n in self.nodes]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate node names: {sorted(dup)}")
        return self

    def gpu_types(self, catalog: Catalog | None = None) -> list[GPUType]:
        cat = catalog or default_catalog()
        seen: dict[str, GPUType] = {}
        for n in self.nodes:
            g = cat.get(n.gpu)
            seen.setdefault(g.name, g)
        return list(seen.values())

    def nodes_of(self, gpu: str, catalog: Catalog | None = None) -> list[Node]:
        cat = catalog or default_catalog()
        return [n for n in self.nodes if cat.get(n.gpu).name == gpu]

    def link_gbs(self, node: Node, catalog: Catalog | None = None) -> float:
        g = (catalog or default_catalog()).get(node.gpu)
        link = node.interconnect or g.link
        if link == g.link:
            return g.link_gbs
        return {"nvlink": 300.0, "pcie": 24.0, "none": node.inter_node_gbs}[link]


class InventoryError(FrenzyError, ValueError):
    """A cluster file or preset that cannot be used."""


def load_cluster(spec: str | Path, catalog: Catalog | None = None) -> Cluster:
    """A cluster from a preset name (`phoebe`, `frenzy-testbed`, `local`), a Ray cluster (`ray`: the one this machine
    joined or $RAY_ADDRESS; `ray://HOST:PORT`), or a YAML file."""
    cat = catalog or default_catalog()
    if str(spec) == "local":
        return discover_local(cat)
    if str(spec) == "ray" or str(spec).startswith("ray://"):
        return ray_inventory(None if str(spec) == "ray" else str(spec), cat)
    def preset(name: str) -> str | None:
        return resources.files("cluster").joinpath(f"presets/{name}.yaml").read_text() if name in PRESETS else None

    try:
        doc = named_yaml(spec, preset, "cluster", f"{spec}: neither a cluster preset ({', '.join(PRESETS)}, local) "
                         "nor a file")
    except UserFileError as err:
        raise InventoryError(str(err)) from None
    source = doc.source
    data = {"name": Path(str(spec)).stem, "nodes": doc.data} if isinstance(doc.data, list) else doc.data
    if not isinstance(data, dict):
        raise InventoryError(f"{source}: a cluster file is a mapping {{name, nodes: [...]}} or a list of nodes; "
                             "see docs/clusters.md")
    if isinstance(doc.data, list):  # the locations of a bare list are those of `nodes`
        doc.marks = {("nodes", *k): v for k, v in doc.marks.items()}
    try:
        cluster = Cluster.model_validate(data)
    except ValidationError as err:
        raise InventoryError(validation_message(err, doc, source, "cluster")) from None
    for n in cluster.nodes:
        try:
            cat.get(n.gpu)
        except ValueError as err:
            raise InventoryError(f"{source}: node {n.name}: {err}") from None
    return cluster


def _system_ram_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError):
        return 8.0


def cpu_device_type() -> GPUType:
    """This host's CPU as a device (memory: system RAM), for hosts and Ray nodes with no GPU."""
    return GPUType(name="cpu", memory_gib=round(_system_ram_gib(), 1), bf16_tflops=0.2, fp16_tflops=0.2,
                   fp32_tflops=0.1 * (os.cpu_count() or 1), mem_bw_gbs=20, link="pcie", link_gbs=10,
                   context_gib=0.0, alloc_frag=0.0)


def discover_local(catalog: Catalog | None = None) -> Cluster:
    """This host's GPUs through NVML; the CPU as one device when there is none."""
    cat = catalog or default_catalog()
    host = socket.gethostname()
    gpus: list[tuple[str, float]] = []
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else name
                gpus.append((name, pynvml.nvmlDeviceGetMemoryInfo(h).total / 1024**3))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library, no device: fall back to the CPU
        gpus = []
    if not gpus:
        cat.add(cpu_device_type())
        return Cluster(name="local", nodes=[Node(name=host, gpu="cpu", count=1, interconnect="none")])
    nodes: dict[str, Node] = {}
    for name, mem in gpus:
        if name not in cat:  # an unknown GPU still plans, by its memory and a conservative throughput
            cat.add(GPUType(name=name, memory_gib=round(mem, 1), bf16_tflops=0, fp16_tflops=50,
                            fp32_tflops=10, mem_bw_gbs=500, link_gbs=12))
        key = cat.get(name).name
        if key in nodes:
            nodes[key].count += 1
        else:
            nodes[key] = Node(name=f"{host}" if not nodes else f"{host}-{key}", gpu=key, count=1)
    return Cluster(name="local", nodes=list(nodes.values()))


def ray_inventory(address: str | None = None, catalog: Catalog | None = None) -> Cluster:
    """The alive nodes of the Ray cluster as a Frenzy cluster (what `--cluster ray` loads and the ledger syncs)."""
    ray = connect(address)
    cat = catalog or default_catalog()
    nodes, unnamed = [], []
    for info in ray.nodes():
        if not info.get("Alive"):
            continue
        res = info.get("Resources", {})
        name = frenzy_name(info)
        if name is None:  # nothing can be pinned to it: Frenzy places ranks by the node's `frenzy_node:` resource
            unnamed.append(f"{info.get('NodeManagerAddress', '?')} ({info['NodeID'][:8]})")
            continue
        typed = [(k[len(GPU_PREFIX):], v) for k, v in res.items() if k.startswith(GPU_PREFIX)]
        acc = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
        count = int(res.get("GPU", 0))
        if typed:
            gpu, count = typed[0][0], int(typed[0][1])
        elif count and acc:
            gpu = next((g.name for g in cat.gpus.values() if acc[0].lower() in g.name.lower()), acc[0])
        elif count:
            raise InventoryError(f"Ray node {name} has {count} GPUs of no known type; start it with --resources "
                                 f"'{{\"{GPU_PREFIX}TYPE\": {count}}}' (TYPE from `frenzy gpus`)")
        else:
            if "cpu" not in cat:
                cat.add(cpu_device_type())
            gpu, count = "cpu", 1
        try:
            cat.get(gpu)
        except ValueError as err:
            raise InventoryError(f"Ray node {name}: {err}") from None
        nodes.append(Node(name=name, gpu=gpu, count=count, interconnect="none" if gpu == "cpu" else None))
    if not nodes:
        raise InventoryError(
            f"the Ray cluster has no alive node Frenzy can place work on ({len(unnamed)} alive without a "
            f"`{NODE_PREFIX}` resource: {', '.join(unnamed) or 'none'}); start each node with --resources "
            f"'{{\"{NODE_PREFIX}NAME\": 1, \"{GPU_PREFIX}TYPE\": GPUS}}' (TYPE from `frenzy gpus`; a node "
            "without GPUs: just the frenzy_node resource)")
    if unnamed:
        logging.getLogger(__name__).warning(
            "Ray nodes %s have no `%s` resource and are left out of the inventory (add --resources '{\"%sNAME\": 1}' "
            "at `ray start` to use them)", ", ".join(unnamed), NODE_PREFIX, NODE_PREFIX)
    return Cluster(name="ray", nodes=nodes)
