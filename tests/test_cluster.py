import os

import pytest

from cluster.catalog import CatalogError, default_catalog, load_catalog
from cluster.inventory import InventoryError, discover_local, load_cluster

REQUIRED = ["RTX-2080Ti", "RTX-3090", "RTX-4090", "Quadro-RTX-6000", "T4", "V100-16GB", "V100-32GB", "A10",
            "A100-40GB-PCIE", "A100-40GB-SXM", "A100-80GB-PCIE", "A100-80GB-SXM", "A800-80GB", "L40S",
            "H100-80GB", "H200-141GB"]


def test_catalog_has_required_types_and_aliases():
    cat = default_catalog()
    for name in REQUIRED:
        assert cat.get(name).memory_gib > 0
    assert cat.get("NVIDIA A100-SXM4-80GB").name == "A100-80GB-SXM"
    assert cat.get("rtx-2080ti").tflops("bf16-mixed") == cat.get("RTX-2080Ti").fp32_tflops  # no bf16 on Turing


def test_catalog_extension_and_errors(tmp_path):
    f = tmp_path / "gpus.yaml"
    f.write_text("- {name: MI300X, memory_gib: 192, bf16_tflops: 1307, fp16_tflops: 1307, fp32_tflops: 163,"
                 " mem_bw_gbs: 5300, link: nvlink, link_gbs: 448}\n")
    assert load_catalog(f).get("MI300X").memory_gib == 192
    with pytest.raises(CatalogError, match="unknown GPU type 'B300'.*FRENZY_GPU_CATALOG"):
        default_catalog().get("B300")
    f.write_text("- {name: X}\n")
    with pytest.raises(CatalogError, match="memory_gib"):
        load_catalog(f)


def test_presets():
    phoebe = load_cluster("phoebe")
    counts = {g: sum(n.count for n in phoebe.nodes if n.gpu == g) for g in {n.gpu for n in phoebe.nodes}}
    assert counts == {"RTX-2080Ti": 24, "A100-40GB-SXM": 16, "Quadro-RTX-6000": 4}
    bed = load_cluster("frenzy-testbed")
    assert sum(n.count for n in bed.nodes) == 11 and len(bed.nodes) == 5


def test_cluster_yaml_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("nodes: [{name: a, gpu: Z100, count: 4}]\n")
    with pytest.raises(InventoryError, match="node a: unknown GPU type 'Z100'"):
        load_cluster(f)
    f.write_text("nodes: [{name: a, gpu: T4, count: 1}, {name: a, gpu: T4, count: 2}]\n")
    with pytest.raises(InventoryError, match="duplicate node names"):
        load_cluster(f)
    with pytest.raises(InventoryError, match="neither a cluster preset"):
        load_cluster(tmp_path / "nope.yaml")


def test_local_discovery_falls_back_to_cpu():
    import socket

    import torch

    c = discover_local()
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: discovery lists it instead of the CPU")
    [node] = c.nodes  # without a GPU the CPU is this host's one device, with the system's RAM as its memory
    assert node.name == socket.gethostname() and node.gpu == "cpu" and node.count == 1
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    assert abs(default_catalog().get("cpu").memory_gib - ram_gib) < 0.2
