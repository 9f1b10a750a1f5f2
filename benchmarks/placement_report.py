"""The placement benchmark's report: the JSON of benchmarks/placement_load.py rendered into its Markdown template
(benchmarks/templates/placement_load.md). Tables and one-line verdicts; the prose lives in the template."""

from __future__ import annotations

from pathlib import Path
from string import Template
from typing import Any

from placement_runs import FIGURES, POLICIES, figures

TEMPLATE = Path(__file__).resolve().parent / "templates" / "placement_load.md"
NAMES = {"avg_vs_fcfs": "average JCT >= 15% below fcfs", "avg_vs_ilp": "average JCT >= 10% below ilp",
         "p50_vs_fcfs": "p50 JCT no worse than fcfs", "p99_vs_fcfs": "p99 JCT no worse than fcfs",
         "makespan_vs_fcfs": "makespan within 5% of fcfs"}


def pct(x: float) -> str:
    return f"{(x - 1) * 100:+.1f}%"


def cell(sp: dict[str, float]) -> str:
    """Median [range] of has/baseline ratios, as percentages."""
    return f"{pct(sp['median'])} [{pct(sp['min'])}..{pct(sp['max'])}]"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| family (operator) | windows (jobs) | load | has avg JCT s | vs fcfs: avg | p50 | p99 | makespan | vs ilp: avg "
            "| unfinished | fcfs / bound | demand / capacity |")
    out = [head, "|" + "---|" * 12]
    for r in rows:
        f = figures(r)
        ra, jobs = f["ratios"], sum(w["jobs"] for w in r["windows"])
        unf = "/".join(str(f["unfinished"].get(p, "-")) for p in POLICIES)
        bound = f"{f['fcfs_over_bound']['median']:.2f}" if f["fcfs_over_bound"] else "-"
        ilp = cell(ra["avg_vs_ilp"]) if "avg_vs_ilp" in ra else "-"
        out.append(f"| {r['family']} ({r['operator']}) | {len(r['windows'])} ({jobs}) | {r['load']} | "
                   f"{f['absolute']['has']['avg_jct_s']['median']:.0f} | {cell(ra['avg_vs_fcfs'])} | "
                   f"{cell(ra['p50_vs_fcfs'])} | {cell(ra['p99_vs_fcfs'])} | {cell(ra['makespan_vs_fcfs'])} | {ilp} | "
                   f"{unf} | {bound} | {f['demand_over_capacity']['median']:.2f} |")
    return "\n".join(out)


def verdict(rows: list[dict[str, Any]]) -> str:
    """Per figure: the rows that meet it on the median over windows (and in every window), the rows that miss."""
    out = []
    for key, name in NAMES.items():
        have = [(r, figures(r)) for r in rows if key in figures(r)["met"]]
        met = [f"{r['family']}@{r['load']}" for r, f in have if f["met"][key]]
        every = sum(f["every_window"][key] for _, f in have)
        miss = [f"{r['family']}@{r['load']} ({pct(f['ratios'][key]['median'])})" for r, f in have if not f["met"][key]]
        out.append(f"- {name}: met on {len(met)} of {len(have)} rows (in every window: {every})"
                   + (f"; missed: {', '.join(miss)}" if miss else ""))
    out.append(f"- every job of every policy accounted for: {_accounted(rows)}")
    out.append(f"- where 15% below fcfs is out of reach (fcfs within 1/{FIGURES['avg_vs_fcfs']:.2f} of the bound): "
               + (", ".join(_no_room(rows)) or "none"))
    return "\n".join(out)


def _accounted(rows: list[dict[str, Any]]) -> str:
    bad = [f"{r['family']}@{r['load']} ({p}: {n})" for r in rows for p, n in figures(r)["unfinished"].items() if n]
    return "yes, every policy finished every job" if not bad else "unfinished jobs in " + ", ".join(bad)


def _no_room(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        b = figures(r)["fcfs_over_bound"]
        if b and b["median"] <= 1 / FIGURES["avg_vs_fcfs"]:
            out.append(f"{r['family']}@{r['load']} (fcfs / bound {b['median']:.2f})")
    return out


def latency_table(rows: list[dict[str, Any]]) -> str:
    out = ["| policy | decision p50 ms | decision p99 ms | round p50 ms | round p99 ms |", "|---|---|---|---|---|"]
    for p in POLICIES:
        lat = [figures(r)["latency"][p] for r in rows if p in figures(r)["latency"]]
        if lat:
            out.append(f"| {p} | {max(x['decision_p50_ms'] for x in lat):.3f} | {max(x['decision_p99_ms'] for x in lat):.3f} "
                       f"| {max(x['round_p50_ms'] for x in lat):.2f} | {max(x['round_p99_ms'] for x in lat):.2f} |")
    return "\n".join(out)


def scale_latency(lats: list[dict[str, Any]]) -> str:
    out = ["| jobs | has p50 ms | has p99 ms | has p99 ms, fastest of 3 | has round ms (each pass) | fcfs p50 ms | "
           "fcfs p99 ms | fcfs p99 ms, fastest of 3 | fcfs round ms (each pass) | decisions | load average (1 min) "
           "before, after |", "|" + "---|" * 11]
    for x in lats:
        load = ", ".join(f"{v:.1f}" for v in x.get("loadavg_1min", ())) or "-"
        out.append(f"| {'elastic (MARP plans)' if x['elastic'] else 'rigid (own count)'} | {x['has_p50_ms']:.3f} | "
                   f"{x['has_p99_ms']:.3f} | {x.get('has_best_p99_ms', float('nan')):.3f} | {_rounds(x, 'has')} | "
                   f"{x['fcfs_p50_ms']:.4f} | {x['fcfs_p99_ms']:.4f} | {x.get('fcfs_best_p99_ms', float('nan')):.4f} | "
                   f"{_rounds(x, 'fcfs')} | {x['has_decisions']} | {load} |")
    return "\n".join(out)


def _rounds(x: dict[str, Any], policy: str) -> str:
    return ", ".join(f"{v:.1f}" for v in x.get(f"{policy}_round_ms", ())) or "-"


def per_window(rows: list[dict[str, Any]]) -> str:
    """`has` against fcfs (and the ILP) in each window of each row: the medians above hide no window."""
    out = ["| family | load | window | vs fcfs: avg | p50 | p99 | makespan | vs ilp: avg | unfinished (has/fcfs) |",
           "|" + "---|" * 9]
    for r in rows:
        for label, w in zip(r.get("labels") or "abcdefgh", r["windows"], strict=False):
            ilp = pct(w["has"]["avg_jct_s"] / w["ilp"]["avg_jct_s"]) if "ilp" in w else "-"
            out.append(f"| {r['family']} | {r['load']} | {label} | "
                       + " | ".join(pct(w["has"][k] / w["fcfs"][k]) for k in ("avg_jct_s", "p50_jct_s", "p99_jct_s",
                                                                              "makespan_s"))
                       + f" | {ilp} | {w['has']['unfinished']}/{w['fcfs']['unfinished']} |")
    return "\n".join(out)


def windows(doc: dict[str, Any]) -> str:
    out = ["| family | cluster | jobs per window | dropped (no policy can run them there) |", "|---|---|---|---|"]
    seen = set()
    for r in doc["rows"]:
        if r["family"] in seen:
            continue
        seen.add(r["family"])
        out.append(f"| {r['family']} | {r['cluster']} | {', '.join(str(w['jobs']) for w in r['windows'])} | "
                   f"{', '.join(map(str, r['dropped']))} |")
    return "\n".join(out)


def render(doc: dict[str, Any]) -> str:
    rows, meta = doc["rows"], doc["meta"]
    held = [r for r in rows if r["role"] == "held-out"]
    tuned = [r for r in rows if r["role"] != "held-out"]
    lat = doc["latency"]
    return Template(TEMPLATE.read_text()).substitute(
        date=meta["date"], machine=meta["machine"], command=meta["command"], wall_s=f"{meta['wall_s']:.0f}",
        held_table=table(held), held_verdict=verdict(held), held_windows=per_window(held),
        tuning_table=table(tuned), tuning_verdict=verdict(tuned),
        latency_table=latency_table(rows), lat_gpus=lat[0]["gpus"], lat_queue=lat[0]["queue"],
        scale_latency=scale_latency(lat), windows=windows(doc),
        lat_run=(f"The table below was rerun alone on {meta['latency']['date']}, after the full run the table above "
                 f"comes from: `{meta['latency']['command']}`, wall {meta['latency']['wall_s']:.0f} s. "
                 if "latency" in meta else ""))
