"""What `towers tune` says of a stage it kept as it was: the best candidate's ratio,
never rounded into a claim the figures do not make."""

import pytest

from launch.tune.search import _kept


@pytest.mark.parametrize("best, says", [
    (0.999, "kept: every candidate was slower (best 0.999x)"),
    (0.97, "kept: every candidate was slower (best 0.97x)"),
    (1.0, "kept: the best candidate ran 1.00x"),
    (1.003, "kept: the best candidate ran 1.003x"),
])
def test_a_kept_stage_names_its_best_candidates_ratio_as_measured(best, says):
    assert _kept(None, {0: best * 100.0, 1: 50.0}, 100.0).startswith(says)
