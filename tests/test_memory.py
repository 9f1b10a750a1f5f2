import importlib.util
import json
import sys
from pathlib import Path

import pytest

from cluster.catalog import default_catalog
from tasks.jobspec import parse_job
from tasks.planning.baselines import frenzy_formula_bytes, megatron_formula_bytes
from tasks.planning.layout import Layout, count_params
from tasks.planning.memory import GiB, predict_peak_memory
from tasks.planning.tracker import tracked_peak

TENSOR_TERMS = ("parameters", "master_weights", "optimizer_states", "gradients", "weight_copies", "activations",
                "logits_loss", "backward_transient", "optimizer_temporaries", "fsdp_buffers")


def job(model="gpt2-350m", **train):
    model = model if isinstance(model, dict) else {"preset": model}
    return parse_job({"model": model, "training": {"seq_len": 1024, "global_batch": 64, **train}})


def acts(j, **lay):
    # activations term, forcing the backward-start phase to be the one reported
    return predict_peak_memory(j, Layout(**lay)).phases["backward_start"]


@pytest.mark.parametrize("lay", [{}, {"dp": 8, "micro_batch": 2}, {"tp": 4, "micro_batch": 4},
                                 {"pp": 4, "dp": 2}, {"dp": 4, "tp": 2, "pp": 2, "vpp": 2},
                                 {"tp": 2, "sequence_parallel": True}])
@pytest.mark.parametrize("train", [{}, {"zero_stage": 3}, {"distributed_optimizer": True},
                                   {"recompute": "full", "precision": "bf16"}])
def test_breakdown_sums_to_totals(lay, train):
    est = predict_peak_memory(job(**train), Layout(**lay), default_catalog().get("A100-80GB-SXM"))
    assert sum(est.breakdown[k] for k in TENSOR_TERMS) == est.allocated_bytes
    assert est.allocated_bytes + est.breakdown["allocator"] == est.reserved_bytes
    assert sum(est.breakdown.values()) == est.device_bytes
    assert est.allocated_bytes == max(est.phases.values())


def test_tensor_parallel_shards_params_and_activations_not_context():
    j = job("llama2-7b", seq_len=4096)
    one, two = (predict_peak_memory(j, Layout(tp=t)) for t in (1, 2))
    assert 0.49 < two.breakdown["parameters"] / one.breakdown["parameters"] < 0.52
    assert two.phases["backward_start"] < one.phases["backward_start"]
    assert two.breakdown["cuda_context"] == one.breakdown["cuda_context"]
    assert two.breakdown["nccl"] > one.breakdown["nccl"] == 0


def test_sequence_parallel_shrinks_activations_only():
    j = job("llama2-7b", seq_len=4096, recompute="none")
    plain = predict_peak_memory(j, Layout(tp=4))
    sp = predict_peak_memory(j, Layout(tp=4, sequence_parallel=True))
    assert sp.breakdown["parameters"] == plain.breakdown["parameters"]
    assert sp.phases["backward_start"] < plain.phases["backward_start"]


def test_pipeline_splits_layers_and_first_stage_holds_inflight_microbatches():
    j = job("llama2-7b", seq_len=4096, global_batch=32)
    one = predict_peak_memory(j, Layout())
    four = predict_peak_memory(j, Layout(pp=4))
    assert four.params_per_gpu < one.params_per_gpu / 3
    inter = predict_peak_memory(j, Layout(pp=4, vpp=2))
    assert inter.phases["backward_start"] > four.phases["backward_start"]  # interleaving penalty


def test_zero_stages_shard_the_right_terms():
    base, z1, z2, z3 = (predict_peak_memory(job(zero_stage=z), Layout(dp=8)) for z in range(4))
    p = base.params_per_gpu
    assert z1.breakdown["optimizer_states"] == pytest.approx(p * 8 / 8, rel=1e-6)
    assert z2.phases["optimizer_step"] < z1.phases["optimizer_step"]  # gradients sharded too
    assert z3.breakdown["parameters"] == pytest.approx(p * 4 / 8, rel=1e-6)
    dist = predict_peak_memory(job(distributed_optimizer=True), Layout(dp=8))
    assert dist.breakdown["master_weights"] == pytest.approx(p * 4 / 8, rel=1e-6)


def test_gqa_flash_recompute_move_activations_the_right_way():
    mha = {"preset": "llama2-7b", "layers": 4}
    gqa = dict(mha, kv_heads=8)
    assert acts(job(gqa, seq_len=4096)) < acts(job(mha, seq_len=4096))
    assert acts(job(attention="flash")) < acts(job(attention="math"))
    none, sel, full = (acts(job(attention="math", recompute=r)) for r in ("none", "selective", "full"))
    assert full < sel < none
    assert acts(job(attention="flash", recompute="selective")) == acts(job(attention="flash"))
    # per-op checkpointing keeps half the matmul outputs: between full and none, with flash and math
    for attn in ("flash", "math"):
        full, op, none = (acts(job(attention=attn, recompute=r)) for r in ("full", "op", "none"))
        assert full < op < none
    # Megatron's fused q/k/v buffer outlives the RoPE'd q and k (distributed optimizer = Megatron conventions)
    llama = {"preset": "llama2-7b", "layers": 4}
    meg = predict_peak_memory(job(llama, distributed_optimizer=True), Layout(dp=2, micro_batch=2))
    zero1 = predict_peak_memory(job(llama, zero_stage=1), Layout(dp=2, micro_batch=2))
    assert meg.phases["backward_start"] > zero1.phases["backward_start"]
    swiglu = {"layers": 4, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "vocab": 256}
    assert acts(job(dict(swiglu, mlp="swiglu"))) > acts(job(dict(swiglu, mlp="gelu")))


def test_device_total_uses_gpu_calibration():
    j = job()
    a = predict_peak_memory(j, Layout(), default_catalog().get("RTX-2080Ti"))
    b = predict_peak_memory(j, Layout(), default_catalog().get("H100-80GB"))
    assert a.allocated_bytes == b.allocated_bytes and a.device_bytes != b.device_bytes


def test_matches_pytorch_memtracker_on_a_small_model():
    # ground truth: our GPT traced on fake tensors under torch's MemTracker (a few seconds on CPU)
    small_llama = {"preset": "llama2-7b", "layers": 2, "hidden": 512, "heads": 8, "kv_heads": 2, "ffn_hidden": 1408,
                   "vocab": 1024}
    for model, train in (({"preset": "gpt2-124m", "layers": 4, "vocab": 256}, {}),
                         (small_llama, {"attention": "math"}), (small_llama, {"recompute": "op"}),
                         ({"preset": "gpt2-124m", "layers": 4, "vocab": 256}, {"recompute": "op"})):
        j = job(model, seq_len=512, global_batch=4, **train)
        truth = tracked_peak(j, 4)["Total"]
        pred = predict_peak_memory(j, Layout(micro_batch=4)).allocated_bytes
        assert -0.08 <= (pred - truth) / truth <= 0.08, (model, pred / 2**20, truth / 2**20)


def test_baselines_are_the_published_formulas():
    j = job("gpt2-7b", seq_len=1024, global_batch=2)
    lay = Layout(micro_batch=2)
    w = 50257 * 4096 + 32 * (12 * 4096**2 + 13 * 4096)
    act = 1024 * 2 * 4096 * 32 * (10 + 24 + 5 * 32 * 1024 / 4096)
    assert frenzy_formula_bytes(j, lay) == pytest.approx(20 * w + act)
    assert megatron_formula_bytes(j, lay) > 18 * w
    assert predict_peak_memory(j, lay).device_bytes / GiB < frenzy_formula_bytes(j, lay) / GiB


def test_recompute_keeps_only_the_heads_and_one_blocks_autocast_copies():
    # a checkpointed block drops its half-precision weight copies after its forward (measured on an H100)
    j = job("gpt2-774m", precision="bf16-mixed")
    none = predict_peak_memory(j, Layout(micro_batch=8)).breakdown["weight_copies"]
    n_layers, per_block, head = 36, count_params(j.model, 1024).per_layer_linear, 50257 * 1280
    assert none == 2 * (n_layers * per_block + head)
    for r in ("full", "op"):
        est = predict_peak_memory(job("gpt2-774m", precision="bf16-mixed", recompute=r), Layout(micro_batch=8))
        assert est.breakdown["weight_copies"] == 2 * (per_block + head)
    sel = predict_peak_memory(job("gpt2-774m", precision="bf16-mixed", recompute="selective"), Layout(micro_batch=8))
    assert sel.breakdown["weight_copies"] == none  # selective recompute saves the projections' inputs


def test_optimizer_temporary_only_where_the_trainer_cannot_fuse_adamw():
    # setup.make_optimizer takes fused AdamW (in place) for plain parameters: one GPU and DDP; TP and FSDP2 keep
    # foreach's parameter-sized temporary. bf16-mixed: fp32 params (4 B), grads (4 B), moments (8 B), temp (4 B)
    for lay, train, temp in (({}, {}, False), ({"dp": 4}, {}, False), ({"tp": 2}, {}, True),
                             ({"dp": 4}, {"zero_stage": 3}, True)):
        est = predict_peak_memory(job("gpt2-1.5b", recompute="full", **train), Layout(**lay))
        per_param = (4 + 4 + 8 + (4 if temp else 0)) / 4
        assert est.phases["optimizer_step"] == pytest.approx(per_param * est.breakdown["parameters"], rel=1e-6), lay


def _gpu_check():
    path = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    gc = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", gc)  # its dataclasses look their module up there
    spec.loader.exec_module(gc)
    return gc, path.parent / "results"


def test_within_bounds_of_the_recorded_h100_measurements():
    # benchmarks/results/gpu_h100.json: torch.cuda.max_memory_allocated of the trainer's steady-state steps on an H100
    # (benchmarks/gpu_check.py); the same rows showed both corrections above, so this guards them, it does not
    # validate them on unseen data
    gc, results = _gpu_check()
    rows = {r["config"]: r for r in json.loads((results / "gpu_h100.json").read_text())["marp"]}
    gpu = default_catalog().get("H100-80GB")
    errs = []
    for name, model, mb, train in gc.CONFIGS:
        est = predict_peak_memory(gc.make_job(model, mb, train, 8, "file:///x"), Layout(micro_batch=mb), gpu)
        errs.append((est.allocated_bytes - rows[name]["alloc"]) / rows[name]["alloc"])
        assert -0.08 <= errs[-1] <= 0.05, (name, errs[-1])
    assert sum(abs(e) for e in errs) / len(errs) <= 0.03


@pytest.mark.parametrize("record,configs,gpu_name", [("gpu_h100.json", "CONFIGS", "H100-80GB"),
                                                     ("gpu_h200.json", "HELDOUT_CONFIGS", "H200-141GB")])
def test_reserved_within_bounds_on_both_gpus_recompute_included(record, configs, gpu_name):
    # torch.cuda.max_memory_reserved of the trainer's steps on an H100 (the rows the corrections were fitted on)
    # and on an H200 (12 shapes none of them saw: vocab 128k/152k, MQA, fp16-mixed, fp32, selective/full/op
    # recompute, a 7B model); full and op recompute fragment the allocator more (RECOMPUTE_FRAG): without that
    # term the H200's full-recompute 2.7B row is 12% under, the kind of error that plans a job into an OOM
    gc, results = _gpu_check()
    rows = {r["config"]: r for r in json.loads((results / record).read_text())["marp"]}
    gpu = default_catalog().get(gpu_name)
    errs = []
    for name, model, mb, train in getattr(gc, configs):
        est = predict_peak_memory(gc.make_job(model, mb, train, 8, "file:///x"), Layout(micro_batch=mb), gpu)
        errs.append((est.reserved_bytes - rows[name]["reserved"]) / rows[name]["reserved"])
        assert -0.10 <= errs[-1] <= 0.08, (name, errs[-1])
        # the device total adds the context measured outside torch's allocator on that GPU
        assert abs(est.device_bytes - est.reserved_bytes - rows[name]["outside_torch"]) < 0.02 * GiB, name
    assert sum(abs(e) for e in errs) / len(errs) <= 0.035
