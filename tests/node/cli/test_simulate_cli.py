"""`swarm simulate` on the console and in its folder: it says its noise is seeded before it starts,
shows each round's own accuracy as soon as the round ends, and writes progress.png with the
accuracy and each privacy figure per round (record-level too with DP-SGD)."""

from __future__ import annotations

import json

from node.cli import main
from node.cli.simulate import SEEDED_NOTICE, _progress

PNG = b"\x89PNG\r\n\x1a\n"


def test_a_seeded_run_says_so_and_plots_each_privacy_figure(tmp_path, capsys):
    out = tmp_path / "sim"
    dp = ["--set", "train.dp_sgd=true", "--set", "model.name=logreg", "--mechanism", "pnpm", "--rounds", "2"]
    assert main(["simulate", "--quick", *dp, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith(SEEDED_NOTICE) and "noise seeded: a simulation, not a private run" in SEEDED_NOTICE
    assert "progress.png" in captured.out
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2]
    assert all(r["eps_max"] > 0 and r["record_eps_max"] > 0 for r in records)
    assert records[1]["record_eps_max"] > records[0]["record_eps_max"]  # cumulative
    assert (out / "progress.png").read_bytes()[:8] == PNG


def test_secret_noise_prints_no_seeded_notice(tmp_path, capsys):
    assert main(["simulate", "--quick", "--rounds", "1", "--secret-noise", "--out", str(tmp_path / "s")]) == 0
    assert "noise seeded" not in capsys.readouterr().err
    assert (tmp_path / "s" / "progress.png").read_bytes()[:8] == PNG  # the accuracy alone: no mechanism


def test_the_bar_shows_the_round_that_just_ended():
    progress = _progress(quiet=True, rounds=3)
    with progress as on_progress:
        on_progress({"round": 1, "done": 1, "of": 2})
        assert progress.bar.tasks[0].description == "round 1/3"
        on_progress({"round": 1, "accuracy": 0.61234, "finished": True})
        assert progress.bar.tasks[0].description == "round 1/3  accuracy 0.612"  # at once, not a round later
        on_progress({"round": 2, "done": 1, "of": 2})
        assert progress.bar.tasks[0].description == "round 2/3  (round 1: accuracy 0.612)"
