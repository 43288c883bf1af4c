import json

import pytest

from node.runfiles import MetricsWriter, read_metrics


def test_round_trip_and_append(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with MetricsWriter(path) as w:
        w.write({"round": 0, "accuracy": 0.5})
        # Flushed per line: readable while the writer is still open.
        assert read_metrics(path) == [{"accuracy": 0.5, "round": 0}]
    with MetricsWriter(path) as w:
        w.write({"round": 1, "eps": 2.0})
    assert [r["round"] for r in read_metrics(path)] == [0, 1]
    with pytest.raises(ValueError), MetricsWriter(path) as w:
        w.write({"loss": float("nan")})


def test_torn_last_line_ignored_but_bad_middle_line_is_an_error(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n" + '{"a": ')
    assert read_metrics(path) == [{"a": 1}]
    path.write_text('{"a": \n' + json.dumps({"a": 1}) + "\n")
    with pytest.raises(ValueError, match="m.jsonl:1"):
        read_metrics(path)
