"""The poster study's plots drawn from hand-made results: one file per figure, none without data."""
from __future__ import annotations

import pytest

from bench.study import poster_plots

from .test_poster_claims import results

pytest.importorskip("matplotlib")


def test_every_figure_is_drawn_from_results_with_data(tmp_path):
    paths = poster_plots.make_plots(results(agree=True), tmp_path, virtual=True, fig6_share=0.12)
    assert sorted(p.name for p in paths) == ["fig2.png", "fig3.png", "fig4.png", "fig5.png", "fig6.png"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_nothing_is_drawn_without_data(tmp_path):
    assert poster_plots.make_plots({}, tmp_path) == []
