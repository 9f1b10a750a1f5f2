"""How long a metric process (`python -m tasks.evaluation.trial --metrics`) takes from its start to its `ready`
line: the figure behind `tasks.evaluation.metricjobs.STARTUP_FLOOR_S` (benchmarks/results/shared_service_redteam_o.md).
Usage: PYTHONPATH=. python benchmarks/metric_startup.py [RUNS]"""

from __future__ import annotations

import statistics
import sys
import time

from tasks.evaluation.warmstart import kill_group, popen_trial


def main(runs: int = 5) -> list[float]:
    times = []
    for _ in range(runs):
        t = time.monotonic()
        proc = popen_trial("--metrics", "cpu", 0, sys.stderr)
        proc.stdout.readline()
        times.append(time.monotonic() - t)
        kill_group(proc)
        proc.wait()
    print("metric process start-up to ready, s:", " ".join(f"{x:.2f}" for x in times),
          "median", f"{statistics.median(times):.2f}")
    return times


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
