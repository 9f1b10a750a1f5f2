"""Jobs true to their trace: the real trace formats, the model fitted to the recorded GPUs, runs in the recorded time,
no OOM for a job that ran, elastic or rigid per job, and averages over every job (issue 43)."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from cluster.inventory import Cluster, Node, load_cluster
from cluster.jobperf import JobKey, min_memory_that_holds, recorded_layout
from cluster.policies import Fcfs, Has, Ilp, make_policy
from cluster.simulator import SimConfig, Simulator, simulate
from cluster.traces import (
    TraceError,
    TraceJob,
    fit_to_record,
    guess_format,
    load_trace,
    read_helios,
    read_kalos,
    read_openb,
    write_generic,
)
from tasks.errors import FrenzyError

REAL = Path(__file__).resolve().parents[1] / "examples" / "traces" / "real"
OPENB_HEAD = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time\n")


def test_the_openb_reader_keeps_the_gpu_pods_that_ran(tmp_path):
    p = tmp_path / "pods.csv"
    p.write_text(OPENB_HEAD + "a,1,1,1,1000,V100M32|V100M16,LS,Running,100,1100,200\n"  # ran 900 s on a V100-32GB
                 "b,1,1,0,0,,LS,Running,100,1100,200\n"  # no GPU
                 "c,1,1,2,1000,,LS,Pending,150,300,\n"  # never scheduled
                 "d,1,1,1,460,G2,BE,Failed,400,430,400\n"  # ran 30 s
                 "e,1,1,8,1000,,LS,Running,500,12902960,500\n"  # still running when the trace was cut
                 "f,1,1,1,460,G3,BE,Succeeded,700,4700,800\n")  # a fractional pod: one GPU, an anonymised type
    jobs = read_openb(p)
    assert [(j.name, j.submit_s, j.duration_s, j.num_gpus, j.gpu_type) for j in jobs] == [
        ("a", 0.0, 900.0, 1, "V100-32GB"), ("f", 600.0, 3900.0, 1, None)]
    assert all(j.traced and not j.elastic for j in jobs) and guess_format(OPENB_HEAD) == "openb"
    assert len(load_trace(REAL / "openb-window-a.csv")) == 421  # the committed window, as published


def test_the_helios_reader_reads_the_log_as_published_and_its_conversion(tmp_path):
    log = tmp_path / "cluster_log.csv"
    log.write_text("job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
                   "1,u1,vc1,8,48,1,COMPLETED,2020-09-01 00:00:00,2020-09-01 00:01:00,2020-09-01 01:01:00,3600,60\n"
                   "2,u1,vc1,0,8,1,COMPLETED,2020-09-01 00:10:00,2020-09-01 00:10:00,2020-09-01 02:00:00,6600,0\n"
                   "3,u2,vc2,1,6,1,FAILED,2020-09-01 00:20:00,2020-09-01 00:20:30,2020-09-01 00:21:00,30,30\n"
                   "4,u2,vc2,16,96,2,FAILED,2020-09-01 00:30:00,2020-09-01 00:40:00,2020-09-01 01:40:00,3600,600\n")
    jobs = read_helios(log)
    assert [(j.name, j.submit_s, j.num_gpus) for j in jobs] == [("helios-1", 0.0, 8), ("helios-4", 1800.0, 16)]
    conv = tmp_path / "conv.csv"
    conv.write_text("job_id,arrival_s,service_sec,gpu_count\n9#1,100.0,7200.0,4\n9#2,160.0,5.0,1\n")
    assert [(j.submit_s, j.duration_s, j.num_gpus) for j in load_trace(conv)] == [(0.0, 7200.0, 4)]
    assert len(load_trace(REAL / "helios-venus-window-a.csv")) == 489
    log.write_text("job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
                   "1,u1,vc1,8,48,1,COMPLETED,yesterday,,,3600,60\n")
    with pytest.raises(TraceError, match="submit_time must be YYYY-MM-DD HH:MM:SS"):
        read_helios(log)


KALOS_HEAD = ("job_id,arrival_time,num_iteration,iteration_computing_time,iteration_networking_time,gpu_workers,ps,"
              "gpu_per_worker,cpu_per_gpu_worker,cpu_per_ps_worker,tensorsizes,profiled_network\n")


def test_the_kalos_reader_maps_the_converted_columns(tmp_path):
    p = tmp_path / "kalos.csv"
    p.write_text(KALOS_HEAD + "0,500.0,7200,0.5,0.75,16,0,8.0,15.0,15.0,10.0,1000\n"  # 1 h on 16 nodes x 8 GPUs
                 "1,800.0,100,0.5,0.25,1,0,2.0,60.0,60.0,10.0,500\n"  # 50 s: under a minute, dropped
                 "2,900.5,1001,0.5,0.25,1,0,2.0,60.0,60.0,10.0,500\n")  # 500.5 s on one node's 2 GPUs
    jobs = read_kalos(p)
    assert [(j.name, j.submit_s, j.duration_s, j.num_gpus) for j in jobs] == [
        ("kalos-0", 0.0, 3600.0, 128), ("kalos-2", 400.5, 500.5, 2)]
    assert all(j.traced and not j.elastic and j.gpu_type == "A100-80GB-SXM" for j in jobs)
    assert guess_format(KALOS_HEAD) == "kalos" and len(load_trace(p)) == 2
    assert len(load_trace(REAL.parent / "heldout" / "kalos-converted.csv")) == 227  # the committed file, as published
    p.write_text(KALOS_HEAD + "0,0.0,7200,0.5,0.75,3,0,2.5,15.0,15.0,10.0,1000\n")
    with pytest.raises(TraceError, match="must be a whole number of GPUs, got 7.5"):
        read_kalos(p)


def test_a_traced_job_gets_a_model_that_fits_its_recorded_gpus():
    big = TraceJob("j", 0, 200 * 3600, 1, "gpt2-1.5b", 16, gpu_type="V100-16GB", traced=True, elastic=False)
    fitted = fit_to_record(big)  # 200 GPU-hours picks gpt2-1.5b, which does not fit one 16 GB V100
    assert fitted.model != "gpt2-1.5b" and recorded_layout(JobKey.of(fitted), "V100-16GB", 1) is not None
    assert recorded_layout(JobKey.of(big), "V100-16GB", 1) is None
    with pytest.raises(TraceError, match="does not fit 1 V100-16GB"):
        fit_to_record(big, keep_model=True)  # a model the trace named is not swapped


def test_a_traced_job_runs_its_recorded_time_and_no_baseline_ooms_it():
    # 1-GPU jobs recorded on the reference A100; the cluster's 2080Tis are too small for their recorded layout
    c = load_cluster("phoebe")
    jobs = [fit_to_record(TraceJob(f"t{k}", 60.0 * k, 4.5 * 3600, 1, "gpt2-350m", 16, traced=True, elastic=False))
            for k in range(30)]
    for pol in ("fcfs", "fifo"):
        res = simulate(c, jobs, pol)
        s = res.summary()
        assert s.oom_failures == 0 and s.completed == 30, pol
        on_a100 = [j for j in res.jobs if j.gpu_type == "A100-40GB-SXM"]
        assert on_a100 and all(j.run_s == pytest.approx(4.5 * 3600) for j in on_a100)  # the recorded time there
        assert {j.gpu_type for j in res.jobs} <= {"A100-40GB-SXM", "Quadro-RTX-6000"}  # GPUs that hold it
    key = JobKey.of(jobs[0])
    assert min_memory_that_holds(key, recorded_layout(key, "A100-40GB-SXM", 1), ["RTX-2080Ti", "A100-40GB-SXM",
                                                                                 "Quadro-RTX-6000"]) == 40.0
    untraced = [TraceJob("u", 0, 600, 1, "gpt2-1.5b", 32)]  # the paper's memory-unaware user still OOMs
    assert simulate(Cluster(name="t", nodes=[Node(name="s", gpu="RTX-2080Ti", count=4),
                                             Node(name="b", gpu="A100-80GB-PCIE", count=2)]),
                    untraced, "fcfs").summary().oom_failures >= 1


def test_a_rigid_job_keeps_its_count_and_an_elastic_one_need_not():
    c = Cluster(name="t", nodes=[Node(name="a", gpu="A100-40GB-SXM", count=8)])
    rigid = fit_to_record(TraceJob("r", 0, 3600, 2, "gpt2-124m", 32, traced=True, elastic=False))
    for pol in ("has", "ilp", "fcfs"):
        job = simulate(c, [rigid], pol).jobs[0]
        assert sum(k for _, k in job.nodes) == 2 and job.finish is not None, pol
    wide = simulate(c, [rigid], "has", SimConfig(elastic="all")).jobs[0]  # alone on an idle node it is widened
    assert sum(k for _, k in wide.nodes) > 2 and "widened from 2 to" in wide.decision
    assert simulate(c, [rigid], "has", SimConfig(elastic="none")).jobs[0].nodes == [("a", 2)]


def test_every_average_is_over_every_job_and_the_unfinished_are_counted():
    c = Cluster(name="t", nodes=[Node(name="a", gpu="A100-40GB-SXM", count=4)])
    jobs = [TraceJob("wide", 0, 1000, 8, "gpt2-124m", 128, traced=True, elastic=False),  # wider than the cluster
            fit_to_record(TraceJob("ok", 500, 1000, 1, "gpt2-124m", 16, traced=True, elastic=False))]
    for pol in ("has", "fcfs", "ilp"):
        res = simulate(c, jobs, pol)
        s = res.summary()
        assert (s.completed, s.unfinished, s.unschedulable) == (1, 1, 1), pol
        # the never-schedulable job counts with its JCT up to the end of the run (1,500 s), not as absent or as 0
        ok = next(j for j in res.jobs if j.finish is not None)
        assert res.end_s == pytest.approx(ok.finish) and s.avg_jct_s == pytest.approx((ok.finish - 500 + ok.finish) / 2)
        assert s.avg_jct_s > ok.finish - 500  # above the average of the finished jobs alone
        assert s.rounds >= 1 and s.round_p99_ms >= s.round_p50_ms >= 0


def test_each_policy_is_a_class_behind_the_engine_protocol():
    cfg = SimConfig()
    assert isinstance(make_policy("has", cfg)[0], Has) and isinstance(make_policy("ilp", cfg)[0], Ilp)
    fifo, _ = make_policy("fifo", cfg)
    assert isinstance(fifo, Fcfs) and fifo.order == "strict"
    assert make_policy("has-arrival", cfg)[1].queue_order == "backfill"
    with pytest.raises(FrenzyError, match="unknown policy"):
        Simulator(load_cluster("phoebe"), [], "sjf")  # type: ignore[arg-type]


def test_generic_csv_columns_roundtrip(tmp_path):
    jobs = [fit_to_record(TraceJob("a", 0, 3600, 2, "gpt2-350m", 32, gpu_type="V100-32GB", traced=True,
                                   elastic=False)),
            TraceJob("b", 5, 60, 1, "gpt2-124m", 16, elastic=True, traced=False)]
    p = tmp_path / "t.csv"
    write_generic(jobs, p)
    assert load_trace(p) == jobs
    p.write_text("submit_time,duration,num_gpus,elastic\n0,60,1,maybe\n")
    with pytest.raises(TraceError, match="column elastic must be 0 or 1"):
        load_trace(p)


def _bench(name: str):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _summary(avg: float, p50: float, p99: float, mk: float, unfinished: int = 0) -> dict:
    return {"avg_jct_s": avg, "p50_jct_s": p50, "p99_jct_s": p99, "makespan_s": mk, "avg_queue_s": 0.0,
            "unfinished": unfinished, "decision_p50_ms": 0.1, "decision_p99_ms": 0.5, "round_p50_ms": 1.0,
            "round_p99_ms": 2.0}


def test_the_benchmark_figures_and_report():
    runs = _bench("placement_runs")
    report = _bench("placement_report")
    win = {"jobs": 400, "has": _summary(80, 90, 100, 1000), "fcfs": _summary(100, 100, 100, 1000),
           "fifo": _summary(120, 100, 150, 1000), "ilp": _summary(95, 80, 120, 990),
           "lower_bound_avg_jct_s": 50.0, "demand_over_capacity": 0.8}
    worse = {**win, "has": _summary(90, 110, 90, 1100)}
    row = {"family": "f", "operator": "op", "role": "held-out", "real": True, "cluster": "phoebe-x4", "load": 0.9,
           "windows": [win, worse, win], "dropped": [0, 1, 0], "labels": "abc"}
    f = runs.figures(row)
    assert f["ratios"]["avg_vs_fcfs"]["median"] == pytest.approx(0.8) and f["met"]["avg_vs_fcfs"]
    assert not f["every_window"]["avg_vs_fcfs"] and f["met"]["p50_vs_fcfs"] and not f["every_window"]["p50_vs_fcfs"]
    assert f["ratios"]["avg_vs_ilp"]["median"] == pytest.approx(80 / 95) and f["met"]["avg_vs_ilp"]
    assert f["met"]["makespan_vs_fcfs"] and f["ratios"]["makespan_vs_fcfs"]["max"] == pytest.approx(1.1)
    left = {**row, "windows": [{**win, "has": _summary(10, 10, 10, 10, unfinished=3)}]}
    assert not any(runs.figures(left)["met"].values())  # a policy that leaves jobs behind wins nothing
    doc = {"meta": {"date": "d", "machine": "m", "command": "c", "wall_s": 1.0}, "rows": [row],
           "latency": [{"gpus": 2048, "queue": 1000, "elastic": False, "has_p50_ms": 0.1, "has_p99_ms": 0.4,
                        "fcfs_p50_ms": 0.01, "fcfs_p99_ms": 0.02, "has_decisions": 3000}]}
    md = report.render(doc)
    assert "| f (op) | 3 (1200) | 0.9 |" in md and "-20.0% [-20.0%..-10.0%]" in md
    assert "average JCT >= 15% below fcfs: met on 1 of 1 rows (in every window: 0)" in md
    assert math.isfinite(f["fcfs_over_bound"]["median"]) and "$" not in md
    assert "| f | 0.9 | b | -10.0% | +10.0% | -10.0% | +10.0% | -5.3% | 0/0 |" in md  # no window hidden by a median
    doc["latency"][0] |= {"has_round_ms": [158.04, 233.2], "fcfs_round_ms": [70.0, 71.0]}
    doc["meta"]["latency"] = {"date": "d2", "wall_s": 5.0, "command": "python benchmarks/placement_load.py --latency-only"}
    md = report.render(doc)  # the latency part rerun alone: each pass's round, and when it ran
    assert "| 158.0, 233.2 |" in md and "| 70.0, 71.0 |" in md and "rerun alone on d2" in md
