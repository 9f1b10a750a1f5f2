"""Issue 30, point 9: Frenzy's plotting leaves the caller's matplotlib backend alone, so a notebook that draws a
report plot and then its own figure still shows it inline (library code called `matplotlib.use("Agg")`)."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib
import pytest


@pytest.fixture
def svg_backend():
    before = matplotlib.get_backend()
    matplotlib.use("svg")  # stands in for the notebook's inline backend: any backend that is not Agg
    yield
    matplotlib.use(before)


def test_report_history_heatmap_and_cdf_plots_keep_the_callers_backend(svg_backend, tmp_path):
    from cluster.report import plot_jct_cdf
    from tasks.evaluation import history
    from tasks.evaluation.record import EvalSummary
    from tasks.report import _loss_png, _scores_png
    from tasks.stragglers.report import heatmap

    assert len(_loss_png([(1, 5.0), (2, 4.0)], [2])) > 1000
    ev = EvalSummary(uri="u", run="r", step=2, suite="s", scores={"d": {"m": 0.5}}, makespan_s=1.0,
                     predicted_makespan_s=1.0, result="x", history_plot=None)
    assert len(_scores_png([ev])) > 1000
    history.append(tmp_path, "r", 2, "u", "s", {"d": {"m": 0.5}})
    assert history.plot(tmp_path, "r", "s").stat().st_size > 1000
    plot_jct_cdf({}, str(tmp_path / "cdf.png"))
    res = SimpleNamespace(workers=[[1.0, 1.2]], by_stage={"0": 1.1}, by_dp_rank={"0": 1.0, "1": 1.2},
                          workers_method="exact", slowdown=1.2)
    assert heatmap(res, tmp_path / "hm.png").stat().st_size > 1000
    assert (tmp_path / "cdf.png").stat().st_size > 1000
    assert matplotlib.get_backend() == "svg"
