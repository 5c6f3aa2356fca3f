"""The fine-tuned length predictor's data and measures, without torch."""

from __future__ import annotations

import math

from nmt_tools.training import length_bert


def test_corpus_lines_unescape_as_the_rust_reader_does() -> None:
    escaped = "a\\nb\\tc\\\\d\\xe\\"
    assert length_bert.unescape(escaped) == "a\nb\tc\\d\\xe\\"


def test_the_line_and_the_measures() -> None:
    slope, intercept = length_bert.fit_line([1.0, 2.0, 3.0], [3, 5, 7])
    assert math.isclose(slope, 2.0) and math.isclose(intercept, 1.0)
    m = length_bert.measures([1.0, -1.0, 3.0])
    assert math.isclose(m["mean_error"], 1.0)
    assert math.isclose(m["error_variance"], 8 / 3)
    assert math.isclose(m["mean_absolute_error"], 5 / 3)
    assert math.isclose(length_bert.correlation([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]), 1.0)
    assert math.isclose(length_bert.correlation([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]), -1.0)
