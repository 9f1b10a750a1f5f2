"""Issue 43 round 6: `has` against fcfs (and the ILP where the cluster is small) on windows nobody tuned on.

The list below was written and committed on 2026-11-26 before any policy ran on these windows (held out for the
"before" figures; a fix made while reading them makes the "after" figures not held out). Sources, all shipped:
- **Philly** (examples/traces/philly.csv): 450 jobs from start dates used neither by benchmarks/placement_load.py
  (10-09, 10-30, 11-20, 12-11) nor by red team 43 (09-26, 10-03, 10-10, 10-12, 10-16, 10-17, 10-20, 10-24, 11-01,
  11-08, 11-13, 11-22, 11-28, 12-01, 12-07). Microsoft is the tuning operator; these dates were never run.
- **Helios Venus** and **openb** (examples/traces/real/): pairs of the shipped windows spliced back to back (the next
  window's arrivals shifted to follow the previous one's last by its mean gap), pairs red team 43 did not splice
  (it spliced helios a+b, c+d and openb c+d). Each job is as recorded; the arrival pattern across the seam is new.
- **Clusters** not in /work/redteam43/clusters: a 2,048-GPU mix of four types (`fresh-mix2048`), an all-old cluster
  with one 4-GPU H100 node (`fresh-old4h100`), a two-type cluster of H100 and A10 (`fresh-two`), beside the presets.
Jobs no policy can run on a cluster at their recorded count are dropped and counted (as placement_load.py does).

    python benchmarks/placement_fresh.py                 # writes benchmarks/results/placement_fresh.{json,md}
    python benchmarks/placement_fresh.py --only P1,H1    # some rows
    python benchmarks/placement_fresh.py --write-inputs DIR   # the windows as CSVs and clusters as YAML, for
                                                              # `frenzy simulate --trace ... --jobs-csv ...`
"""

from __future__ import annotations

import argparse
import bisect
import csv
import dataclasses
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from placement_runs import rate_bound, runnable  # noqa: E402

from cluster.inventory import Cluster, load_cluster  # noqa: E402
from cluster.jobperf import INTER_NODE_GBS  # noqa: E402
from cluster.report import write_jobs_csv  # noqa: E402
from cluster.simulator import lower_bounds, simulate  # noqa: E402
from cluster.traces import OPENB_END_S, TraceJob, at_load, load_trace, offered_load, read_philly  # noqa: E402

TRACES = ROOT.parent / "examples" / "traces"
CLUSTERS = ROOT / "clusters"
MACHINE = "2-core x86_64 shared with other work, no GPU"
DATE = time.strftime("%Y-%m-%d", time.gmtime())
"""The day a run is recorded (UTC)."""
ILP_MAX_GPUS = 176
"""The ILP runs only on clusters of at most this many GPUs (on 2,048 it does not finish in the time a row has)."""


@dataclasses.dataclass(frozen=True)
class Window:
    key: str
    source: str
    """`philly:YYYY-MM-DD` (from midnight) or `philly:YYYY-MM-DD HH:MM:SS`, `helios:x+y` or `openb:x+y` (shipped
    windows spliced in that order), or `kalos:all` (examples/traces/heldout/kalos-converted.csv whole)."""
    cluster: str
    load: float | None
    """The offered load the arrivals are scaled to; None: the trace's own arrival times."""
    jobs: int = 450
    """A Philly window's length: the first `jobs` jobs the reader keeps from its start (450 before round 17)."""


WINDOWS: tuple[Window, ...] = (
    Window("P1", "philly:2017-10-14", "phoebe-x4", 0.7),
    Window("P2", "philly:2017-11-04", "phoebe-x4", 0.9),
    Window("P3", "philly:2017-11-16", "phoebe-x4", 1.1),
    Window("P4", "philly:2017-12-04", "phoebe-x4", 0.5),
    Window("P5", "philly:2017-10-27", "fresh-old4h100", 0.9),
    Window("P6", "philly:2017-11-11", "fresh-two", 0.7),
    Window("P7", "philly:2017-12-19", "fresh-mix2048", 0.9),
    Window("P8", "philly:2017-10-22", "phoebe", 0.9),
    Window("H1", "helios:b+c", "phoebe-x4", 0.9),
    Window("H2", "helios:b+d", "fresh-old4h100", 0.7),
    Window("H3", "helios:a+c", "fresh-two", 1.1),
    Window("H4", "helios:a+d", "fresh-mix2048", 0.5),
    Window("O1", "openb:a+b", "phoebe-x4", 1.1),
    Window("O2", "openb:b+d", "fresh-old4h100", 0.5),
    Window("O3", "openb:a+c", "fresh-two", 0.9),
    Window("O4", "openb:b+c", "phoebe-x4", 0.7),
)

WINDOWS7: tuple[Window, ...] = (
    Window("P9", "philly:2017-09-25", "phoebe-x4", 0.5),
    Window("P10", "philly:2017-10-05", "phoebe-x4", 0.7),
    Window("P11", "philly:2017-10-18", "phoebe-x4", 0.9),
    Window("P12", "philly:2017-11-10", "phoebe-x4", 1.1),
    Window("P13", "philly:2017-10-26", "fresh-old4h100", 0.7),
    Window("P14", "philly:2017-11-29", "fresh-two", 0.9),
    Window("P15", "philly:2017-12-08", "fresh-mix2048", 1.1),
    Window("P16", "philly:2017-10-13", "phoebe", 0.5),
    Window("H5", "helios:a+b+c", "phoebe-x4", 0.7),
    Window("H6", "helios:d+c+b", "fresh-two", 0.9),
    Window("H7", "helios:c+a", "fresh-mix2048", 1.1),
    Window("H8", "helios:d+b", "fresh-old4h100", 0.5),
    Window("O5", "openb:a+d", "phoebe-x4", 0.9),
    Window("O6", "openb:d+c+b", "fresh-old4h100", 0.7),
    Window("O7", "openb:c+a+b", "fresh-two", 1.1),
    Window("O8", "openb:b+a+d", "fresh-mix2048", 0.5),
)
"""Round 7's held-out set, written and committed on 2026-11-26 before any policy ran on it (`--set round7`). Philly
start dates used by no earlier list (round 6's above, placement_load.py's, red team 43's), each a day with 800 or more
submissions, so a 450-job window stays inside its day and overlaps no earlier window. Helios and openb: splices in an
order no earlier round ran: triples, pairs reversed (the next window's jobs arrive first), and openb a+d (the one
pair nobody spliced). Every job is as recorded; the mix and the arrival pattern across the seams are new."""

WINDOWS8: tuple[Window, ...] = (
    Window("P17", "philly:2017-09-29", "fresh-two", 0.5),
    Window("P18", "philly:2017-10-04", "phoebe-x4", 0.9),
    Window("P19", "philly:2017-10-11", "fresh-old4h100", 1.1),
    Window("P20", "philly:2017-10-23", "fresh-mix2048", 0.7),
    Window("P21", "philly:2017-11-09", "phoebe", 0.7),
    Window("P22", "philly:2017-11-12", "phoebe-x4", 1.1),
    Window("H9", "helios:b+a", "fresh-old4h100", 0.9),
    Window("H10", "helios:d+c", "phoebe-x4", 0.5),
    Window("H11", "helios:c+b+a", "fresh-two", 0.7),
    Window("O9", "openb:a+c+d", "fresh-mix2048", 0.9),
    Window("O10", "openb:c+b", "fresh-old4h100", 1.1),
    Window("O11", "openb:b+c+d", "phoebe-x4", 0.5),
)
"""Round 8's held-out set, written and committed on 2026-11-26 before any policy ran on it (`--set round8`). Philly
start dates used by no earlier list (rounds 6 and 7 above, placement_load.py's, red team 43's), each a day with 800 or
more submissions. Helios and openb: splices no earlier round ran (helios b+a, d+c and c+b+a; openb c+b, a+c+d and
b+c+d). openb windows spliced after a later one lose the pods whose shifted deletion passes the trace's cut (d+a kept
508 of about 1,030 pods when tried for its size, before any policy ran), so two of the three openb splices are in
trace order. Three windows at each of the loads 0.5, 0.7, 0.9 and 1.1, spread over the five clusters."""

WINDOWS9: tuple[Window, ...] = (
    Window("P23", "philly:2017-09-24", "fresh-two", 0.7),
    Window("P24", "philly:2017-10-02", "phoebe-x4", 0.5),
    Window("P25", "philly:2017-10-08", "fresh-mix2048", 1.1),
    Window("P26", "philly:2017-10-19", "phoebe", 0.9),
    Window("P27", "philly:2017-10-25", "fresh-old4h100", 0.5),
    Window("H12", "helios:d+a+b", "phoebe-x4", 1.1),
    Window("O12", "openb:d+b", "fresh-two", 0.9),
    Window("O13", "openb:d+a", "fresh-mix2048", 0.7),
)
"""Round 9's held-out set, written and committed on 2026-11-26 before any policy ran on it (`--set round9`). Philly
start dates used by no earlier list (rounds 6-8 above, placement_load.py's, red team 43's), each a day with 800 or
more submissions (09-24 950, 10-02 1,353, 10-08 1,007, 10-19 1,001, 10-25 1,060). Helios: d+a+b, the one order whose
first pair (d+a) no earlier splice starts with (every other pair is an earlier splice or its prefix). openb: d+b and
d+a, the two pairs nobody ran (spliced after a later window: pods whose shifted deletion passes the trace's cut are
dropped, as the reader does). Two windows at each of the loads 0.5, 0.7, 0.9 and 1.1, over the five clusters."""

WINDOWS12: tuple[Window, ...] = (
    Window("P28", "philly:2017-09-27", "phoebe-x4", 0.5),
    Window("P29", "philly:2017-10-06", "fresh-two", 1.1),
    Window("P30", "philly:2017-10-21", "fresh-mix2048", 0.7),
    Window("P31", "philly:2017-10-28", "phoebe", 0.9),
    Window("P32", "philly:2017-11-02", "fresh-old4h100", 0.7),
    Window("P33", "philly:2017-11-03", "phoebe-x4", 1.1),
    Window("P34", "philly:2017-11-07", "frenzy-testbed", 0.9),
    Window("P35", "philly:2017-12-05", "fresh-mix2048", 0.5),
)
"""Round 12's held-out set, written and committed on 2026-11-26 before any policy ran on it (`--set round12`). Philly
start dates used by no earlier list (rounds 6-9 above, placement_load.py's, red team 43's); the three unused days with
800 or more submissions (09-27 1,040, 10-06 2,850, 10-21 2,333) and the five unused days of 450-799 whose 450-job
window still ends inside its own day (10-28 703, 11-02 593, 11-03 567, 11-07 592, 12-05 593: last kept submissions at
07:49, 19:35, 20:22, 22:31 and 19:50), so no window overlaps another or an earlier one (no earlier window spills into
these days either). No other shipped trace has a window nobody ran: every Helios Venus and openb window (a-d) has
started a splice in rounds 6-9 and all twelve ordered pairs of each have run; heldout/ holds 41 ITP jobs and 165
openb pods (both run by earlier versions of placement_load.py, and under 400 jobs); sia-workloads/ are 160-job samples
of Philly (placement_load.py's tuning family) and of Helios Saturn (tuned on before, placement_load.py says). So
round 12 is all Microsoft, the tuning operator, on days no policy ran. Two windows at each of the loads 0.5, 0.7, 0.9
and 1.1, over the six clusters (the preset `frenzy-testbed`, the Frenzy paper's 11-GPU testbed, in no earlier list of
fresh windows; placement_load.py's NewWorkload family runs on it). Corrected after the run: this line first called it
Sia's 44-GPU testbed (that is `phoebe`); the windows and clusters are as committed in aed4c50."""

WINDOWS16 = (
    Window("Q1", "philly:2017-09-24 14:54:55", "phoebe", 0.5),
    Window("Q2", "philly:2017-10-04 00:37:08", "phoebe-x4", 1.1),
    Window("Q3", "philly:2017-10-05 05:10:04", "frenzy-testbed", 0.9),
    Window("Q4", "philly:2017-10-06 02:23:40", "fresh-two", 0.7),
    Window("Q5", "philly:2017-10-06 20:16:15", "fresh-old4h100", 0.5),
    Window("Q6", "philly:2017-10-11 07:30:40", "fresh-mix2048", 1.1),
    Window("Q7", "philly:2017-10-13 07:15:30", "phoebe", 0.9),
    Window("Q8", "philly:2017-10-18 04:57:20", "phoebe-x4", 0.7),
    Window("Q9", "philly:2017-10-21 21:02:51", "frenzy-testbed", 0.5),
    Window("Q10", "philly:2017-10-22 07:22:10", "fresh-two", 1.1),
    Window("Q11", "philly:2017-10-26 07:42:12", "fresh-old4h100", 0.9),
    Window("Q12", "philly:2017-11-10 13:16:18", "fresh-mix2048", 0.7),
    Window("Q13", "philly:2017-11-16 07:48:40", "phoebe", 0.5),
    Window("Q14", "philly:2017-11-23 00:00:28", "phoebe-x4", 1.1),
    Window("Q15", "philly:2017-12-08 04:38:04", "frenzy-testbed", 0.9),
    Window("Q16", "philly:2017-12-20 17:02:12", "fresh-two", 0.7),
)
"""Round 16's held-out set, written and committed on 2026-11-27 before any policy ran on it (`--set round16`). Every
day with 800 or more submissions has been used from its midnight by an earlier list, so these windows take the jobs
after them: Philly jobs (after the reader's filters) that no earlier window held. An earlier window is the first 450
kept jobs from its start (rounds 6-12 above from midnight, placement_load.py's four from 06:00); red team 43's 15
days are excluded whole. Of the 74,428 kept jobs those windows cover 39,864; the 59 disjoint 450-job windows left
start at the first unused job of each free stretch (and every 450 jobs on in long stretches); these 16 are evenly
spaced over them (09-24 to 12-20), four at each load 0.5, 0.7, 0.9 and 1.1, over the six clusters. No job of a window
is in any earlier window, but most windows start on a day an earlier window started: held out by job, not by day or
operator (Microsoft Philly is the tuning operator). Sia's 160-job Philly samples are drawn from the whole trace and
may share jobs with any window. Chosen by a script over the trace and the earlier lists alone (no policy run)."""

WINDOWS17 = (
    Window("R1", "philly:2017-09-28 00:01:58", "phoebe", 0.5, 412),
    Window("R2", "philly:2017-09-30 00:01:56", "phoebe-x4", 0.6, 482),
    Window("R3", "philly:2017-10-04 02:00:01", "frenzy-testbed", 0.7, 1348),
    Window("R4", "philly:2017-10-05 07:01:38", "fresh-two", 0.8, 916),
    Window("R5", "philly:2017-10-06 05:43:33", "fresh-old4h100", 0.9, 900),
    Window("R6", "philly:2017-10-08 08:00:11", "fresh-mix2048", 1.0, 1447),
    Window("R7", "philly:2017-10-11 11:00:26", "fresh-mid512", 1.1, 1257),
    Window("R8", "philly:2017-10-14 12:40:09", "fresh-24gb64", 0.5, 1324),
    Window("R9", "philly:2017-10-22 05:56:18", "phoebe", 0.6, 901),
    Window("R10", "philly:2017-10-28 07:49:57", "phoebe-x4", 0.7, 415),
    Window("R11", "philly:2017-11-14 00:02:12", "frenzy-testbed", 0.8, 830),
    Window("R12", "philly:2017-11-17 00:00:33", "fresh-two", 0.9, 864),
    Window("R13", "philly:2017-11-25 00:22:15", "fresh-old4h100", 1.0, 704),
    Window("R14", "philly:2017-12-02 00:02:10", "fresh-mix2048", 1.1, 554),
    Window("R15", "philly:2017-12-05 19:51:17", "fresh-mid512", 0.5, 470),
    Window("R16", "philly:2017-12-08 07:29:08", "fresh-24gb64", 0.6, 1490),
)
"""Round 17's held-out set, written and committed on 2026-11-27 before any policy ran on it (`--set round17`), chosen by
benchmarks/placement_pick17.py over the trace and the earlier lists alone. Philly jobs (after the reader's filters)
that no earlier window held (rounds 6-16 above, placement_load.py's four, red team 43's 15 days whole), each window a
whole free stretch of them (up to 2,000 jobs): first the ten stretches of 400 or more jobs that touch a day no earlier
window used (09-28, 09-30/10-01, 10-15, 10-29, 11-14/15, 11-17 to 11-19, 11-25 to 11-27, 12-02/03, 12-06, 12-09/10),
from the midnight of the free day where that leaves 400 jobs, then the six largest stretches left (on days earlier
windows started on). 10-07's 291 free jobs and the few of 09-07 to 09-23 and 12-13 to 12-22 make no 400-job window.
A window never starts on a second an earlier window's last job shares. 14,314 jobs in all, 4,919 of them submitted on
days no earlier window used; five windows of 1,257-1,490 jobs, none under 412. The trace has no room for more: of its
74,428 kept jobs, earlier windows and red team days cover 47,064. Clusters in turn over the six earlier ones and two
new ones (`fresh-mid512`, `fresh-24gb64`, below), loads in turn 0.5, 0.6, ... 1.1. Held out by job (and for 4,919
jobs by day), not by operator: Microsoft Philly is the tuning operator, and no job of another operator's shipped trace
is unused (every Helios Venus and openb window has run in rounds 6-9; heldout/ holds 41 ITP jobs and 165 openb pods,
both run before)."""

WINDOWS_KALOS = tuple(
    Window(f"K{i + 1}", "kalos:all", cluster, load)
    for i, (cluster, load) in enumerate((c, x) for c in ("kalos-like", "kalos-mix") for x in (None, 0.5, 0.8, 1.1))
)
"""Issue 43's fourth operator, held out (`--set kalos`): Shanghai AI Lab's Kalos, the whole converted trace (227 jobs
of at least 60 s, 1-1,024 GPUs, A100-80GB), written on 2026-11-27 before any policy ran on it. Its own arrival times
(an offered load of about 0.1 on 2,048 GPUs) and loads 0.5, 0.8 and 1.1, on an all-A100-80GB cluster and on a mix of
it with older, smaller GPUs (`kalos-like`, `kalos-mix`, below)."""

SETS: dict[str, tuple[Window, ...]] = {
    "round6": WINDOWS,
    "round7": WINDOWS7,
    "round8": WINDOWS8,
    "round9": WINDOWS9,
    "round12": WINDOWS12,
    "round16": WINDOWS16,
    "round17": WINDOWS17,
    "kalos": WINDOWS_KALOS,
}

FRESH_CLUSTERS: dict[str, list[tuple[str, int, int]]] = {
    "fresh-mix2048": [("H100-80GB", 40, 8), ("A100-40GB-SXM", 56, 8), ("L40S", 80, 8), ("V100-16GB", 80, 8)],
    "fresh-old4h100": [("V100-16GB", 6, 8), ("T4", 4, 8), ("RTX-2080Ti", 4, 8), ("Quadro-RTX-6000", 2, 4), ("H100-80GB", 1, 4)],
    "fresh-two": [("H100-80GB", 4, 8), ("A10", 12, 8)],
    "fresh-mid512": [("H200-141GB", 16, 8), ("A100-80GB-SXM", 24, 8), ("V100-32GB", 24, 8)],
    "fresh-24gb64": [("RTX-3090", 4, 8), ("RTX-4090", 4, 8)],
    "kalos-like": [("A100-80GB-SXM", 256, 8)],
    "kalos-mix": [("A100-80GB-SXM", 160, 8), ("A100-40GB-SXM", 48, 8), ("V100-32GB", 48, 8)],
}
"""(GPU type, nodes, GPUs per node): 2,048, 124, 128, 512, 64, 2,048 and 2,048 GPUs. Round 17 added `fresh-mid512` and
`fresh-24gb64`: no earlier cluster lies between 176 and 2,048 GPUs or holds an H200, an A100-80GB or a V100-32GB
(`fresh-mid512`: three generations, the newest with the most memory), and none is made only of 24 GB consumer cards
of two speeds (`fresh-24gb64`: where the models Philly's jobs are given fit on one type exactly when they fit on the
other, so only speed tells them apart). The two Kalos clusters (`--set kalos`) hold Kalos's widest job (1,024 GPUs)
twice; `kalos-mix` holds it once on its A100-80GB nodes (the type every Kalos job ran on) beside older, smaller
A100-40GB and V100-32GB nodes. Kalos's own size is not in the stored sources."""
FRESH_INTER_NODE_GBS = {"kalos-like": INTER_NODE_GBS, "kalos-mix": INTER_NODE_GBS}
"""Inter-node GB/s where not 25: the Kalos clusters have the bandwidth traced jobs are calibrated with
(cluster/jobperf.py), so a multi-node job runs its recorded time on A100-80GB (at 25 GB/s a 64-GPU Kalos job ran in
0.77 of it: a smoke run of row K4 on 2026-11-27, before any figure was recorded)."""


def cluster_path(name: str) -> str:
    """A preset's name, or the path of a fresh cluster's YAML (written on first use)."""
    if name not in FRESH_CLUSTERS:
        return name
    out = CLUSTERS / f"{name}.yaml"
    if not out.exists():
        CLUSTERS.mkdir(parents=True, exist_ok=True)
        lines = [f"name: {name}", "nodes:"]
        tags = [gpu.split("-")[0].lower() for gpu, _, _ in FRESH_CLUSTERS[name]]
        for (gpu, nodes, count), tag in zip(FRESH_CLUSTERS[name], tags, strict=True):
            tag = tag if tags.count(tag) == 1 else gpu.lower()  # RTX-3090 and RTX-4090: rtx-3090-0, rtx-4090-0
            link = "nvlink" if gpu.startswith(("H100", "H200", "A100", "V100")) else "pcie"
            gbs = FRESH_INTER_NODE_GBS.get(name, 25)
            lines += [
                f"  - {{name: {tag}-{k}, gpu: {gpu}, count: {count}, interconnect: {link}, inter_node_gbs: {gbs}}}"
                for k in range(nodes)
            ]
        out.write_text("\n".join(lines) + "\n")
    return str(out)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _mean_gap(ts: list[float]) -> float:
    return (max(ts) - min(ts)) / max(1, len(ts) - 1)


def splice_helios(parts: list[str], out: Path) -> Path:
    """Helios conversion windows back to back: each next window's arrivals start one mean gap after the last."""
    rows, off = [], 0.0
    for p in parts:
        w = _rows(TRACES / "real" / f"helios-venus-window-{p}.csv")
        ts = [float(r["arrival_s"]) for r in w]
        rows += [{**r, "arrival_s": f"{float(r['arrival_s']) - min(ts) + off:.1f}"} for r in w]
        off += max(ts) - min(ts) + _mean_gap(ts)
    _write(out, ["job_id", "arrival_s", "service_sec", "gpu_count"], rows)
    return out


def splice_openb(parts: list[str], out: Path) -> Path:
    """openb windows back to back (creation, scheduling and deletion shifted together); pods deleted at or after the
    trace's cut keep their times, so the reader drops them as it does in the shipped window."""
    rows: list[dict[str, str]] = []
    fields: list[str] = []
    nxt: float | None = None
    for p in parts:
        w = _rows(TRACES / "real" / f"openb-window-{p}.csv")
        fields = list(w[0])
        ts = [float(r["creation_time"]) for r in w]
        shift = 0.0 if nxt is None else nxt - min(ts)
        for r in w:
            if shift and float(r["deletion_time"]) < OPENB_END_S:
                r = {
                    **r,
                    **{c: str(int(float(r[c]) + shift)) for c in ("creation_time", "deletion_time", "scheduled_time") if r[c].strip()},
                }
            rows.append(r)
        nxt = max(float(r["creation_time"]) for r in rows) + _mean_gap(ts)
    _write(out, fields, rows)
    return out


@functools.lru_cache(maxsize=1)
def _philly_sorted() -> tuple[list[str], tuple[list[str], ...], tuple[str, ...]]:
    """philly.csv's header, its rows sorted by submission time (a stable sort: the file's order among equal times)
    and those times, read once per process: a set of windows cut it once each (16 reads of 82,000 rows in round 17)."""
    with open(TRACES / "philly.csv", newline="") as f:
        r = list(csv.reader(f))
    body = tuple(sorted((x for x in r[1:] if x), key=lambda x: x[0]))
    return r[0], body, tuple(x[0] for x in body)


def philly_rows(start: str, out: Path, keep: int = 1500) -> Path:
    """Philly rows submitted from `start` on, unchanged and sorted (the reader keeps the first 450 it accepts): the
    rows from `start` on are one run of the sorted file, in the order a sort of those rows alone gives."""
    header, body, times = _philly_sorted()
    first = bisect.bisect_left(times, start)
    with open(out, "w", newline="") as f:
        csv.writer(f).writerows([header, *body[first : first + keep]])
    return out


def _write(out: Path, fields: list[str], rows: list[dict[str, str]]) -> None:
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def window_file(w: Window, into: Path) -> tuple[Path, str, int | None]:
    """The window as a CSV `frenzy simulate` reads: (path, --format, --max-jobs)."""
    kind, arg = w.source.split(":", 1)
    into.mkdir(parents=True, exist_ok=True)
    out = into / f"{w.key}-{kind}-{arg.replace('+', '').replace(' ', 'T').replace(':', '')}.csv"
    if kind == "philly":
        return philly_rows(philly_start(arg), out, keep=max(1500, 3 * w.jobs)), "philly", w.jobs
    if kind == "helios":
        return splice_helios(arg.split("+"), out), "helios", None
    if kind == "kalos":
        return TRACES / "heldout" / "kalos-converted.csv", "kalos", None
    return splice_openb(arg.split("+"), out), "openb", None


def philly_start(arg: str) -> str:
    """A Philly window's first submission time: a bare date starts at midnight."""
    return arg if " " in arg else arg + " 00:00:00"


def window_trace(w: Window, into: Path) -> list[TraceJob]:
    path, fmt, max_jobs = window_file(w, into)
    if fmt == "philly":
        return read_philly(path, max_jobs=max_jobs or w.jobs, start=philly_start(w.source.split(":", 1)[1]))
    return load_trace(path, fmt)  # type: ignore[arg-type]


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b > 0 else float("nan")


def run_row(w: Window, into: Path, ilp: bool) -> dict[str, Any]:
    """One window: has and fcfs (and the ILP on small clusters) at its load, with has/baseline ratios; the per-job
    rows (`frenzy simulate --jobs-csv`'s) go to `into`/jobs/KEY.csv."""
    c: Cluster = load_cluster(cluster_path(w.cluster))
    gpus = sum(n.count for n in c.nodes)
    trace, dropped = runnable(c, window_trace(w, into))
    pols = ["has", "fcfs"] + (["ilp"] if ilp and gpus <= ILP_MAX_GPUS else [])
    t0 = time.time()
    t2 = trace if w.load is None else at_load(trace, gpus, w.load)
    res = {p: simulate(c, t2, p) for p in pols}  # type: ignore[arg-type]
    (into / "jobs").mkdir(parents=True, exist_ok=True)
    write_jobs_csv(res, str(into / "jobs" / f"{w.key}.csv"))  # per job and policy: where, when and why
    run: dict[str, Any] = {p: r.summary().to_json() for p, r in res.items()}
    run["lower_bound_avg_jct_s"] = max(lower_bounds(c, t2).avg_jct_s, rate_bound(c, t2)[0])
    out: dict[str, Any] = {
        **dataclasses.asdict(w),
        "gpus": gpus,
        "jobs": len(trace),
        "dropped": dropped,
        "offered_load": round(offered_load(t2, gpus), 3),
        "wall_s": round(time.time() - t0, 1),
        "runs": {p: run[p] for p in pols},
        "lower_bound_avg_jct_s": run["lower_bound_avg_jct_s"],
    }
    keys = {"avg": "avg_jct_s", "p50": "p50_jct_s", "p99": "p99_jct_s", "makespan": "makespan_s"}
    for base in pols[1:]:
        out[f"vs_{base}"] = {k: _ratio(run["has"][v], run[base][v]) for k, v in keys.items()}
    out["unfinished"] = {p: run[p]["unfinished"] for p in pols}
    return out


def losses(r: dict[str, Any]) -> list[str]:
    """The issue's figures a row misses against fcfs."""
    v = r["vs_fcfs"]
    out = [f"{k} {v[k]:.3f}" for k in ("avg", "p50", "p99") if v[k] > 1.0]
    if v["makespan"] > 1.05:
        out.append(f"makespan {v['makespan']:.3f}")
    if r["unfinished"]["has"]:
        out.append(f"has left {r['unfinished']['has']} unfinished")
    return out


def render(rows: list[dict[str, Any]], title: str) -> str:
    lines = [
        f"## {title}",
        "",
        "| row | window | cluster (GPUs) | load | jobs (dropped) | has avg s | fcfs avg s | has/fcfs avg | p50 | p99 "
        "| makespan | has/ilp avg | unfinished has/fcfs[/ilp] | misses |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        v, i = r["vs_fcfs"], r.get("vs_ilp", {}).get("avg")
        load = r["load"] if r["load"] is not None else f"as recorded ({r['offered_load']:.2f})"
        lines.append(
            f"| {r['key']} | {r['source']} | {r['cluster']} ({r['gpus']}) | {load} | {r['jobs']} "
            f"({r['dropped']}) | {r['runs']['has']['avg_jct_s']:.0f} | {r['runs']['fcfs']['avg_jct_s']:.0f} "
            f"| {v['avg']:.3f} | {v['p50']:.3f} | {v['p99']:.3f} | {v['makespan']:.3f} "
            f"| {'' if i is None else f'{i:.3f}'} | {'/'.join(str(x) for x in r['unfinished'].values())} "
            f"| {'; '.join(losses(r)) or '-'} |"
        )
    avg = [r["vs_fcfs"]["avg"] for r in rows]
    lines += [
        "",
        f"has/fcfs average JCT: median {statistics.median(avg):.3f}, range {min(avg):.3f}-{max(avg):.3f}; "
        f"at or below fcfs on {sum(a <= 1 for a in avg)} of {len(avg)}; 15% or more below on "
        f"{sum(a <= 0.85 for a in avg)}; rows missing a figure: {sum(bool(losses(r)) for r in rows)}",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="round6", choices=sorted(SETS), help="which list of windows (default round6)")
    ap.add_argument("--only", help="comma-separated row keys (P1,H1,...)")
    ap.add_argument("--no-ilp", action="store_true")
    ap.add_argument("--inputs", default="/tmp/frenzy-placement-fresh", help="where the window CSVs are written")
    ap.add_argument("--write-inputs", action="store_true", help="write the window CSVs and cluster YAMLs, run nothing")
    ap.add_argument("--out", default=str(ROOT / "results" / "placement_fresh"), help="output path without suffix")
    ap.add_argument("--title", default="has against fcfs on fresh windows")
    args = ap.parse_args()
    want = set(args.only.split(",")) if args.only else None
    sel = [w for w in SETS[args.set] if want is None or w.key in want]
    into = Path(args.inputs)
    if args.write_inputs:
        for w in sel:
            path, fmt, mj = window_file(w, into)
            print(w.key, path, fmt, mj or "", cluster_path(w.cluster))
        return 0
    rows: list[dict[str, Any]] = []
    doc = {
        "machine": MACHINE,
        "date": DATE,
        "command": " ".join(["python benchmarks/placement_fresh.py", *sys.argv[1:]]),
        "rows": rows,
    }
    for w in sel:  # the report is rewritten after every row: a run cut short keeps the rows it finished
        rows.append(run_row(w, into, not args.no_ilp))
        print(f"{w.key}: has/fcfs {rows[-1]['vs_fcfs']} ({rows[-1]['wall_s']} s)", file=sys.stderr, flush=True)
        Path(args.out + ".json").write_text(json.dumps(doc, indent=1))
        Path(args.out + ".md").write_text(f"# {args.title} ({DATE}, {MACHINE})\n\n`{doc['command']}`\n\n" + render(rows, args.title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
