"""Evaluation (harness/run/evaluate.py): AUROC against a float64 rank-sum computed here, gathered over
2 ranks as over 1, the schedule, and a run that stops at its target with its evals recorded."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from harness.config import EvalConfig
from harness.run.evaluate import eval_iterations, gathered_auroc
from harness.presets import tiny
from tests.distributed import spawn_ranks


def rank_sum_auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney in float64, pair by pair: P(score of a positive > a negative's), ties half."""
    s = scores.astype(np.float64)
    pos, neg = s[labels == 1], s[labels == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


def fixed_scores(n: int = 600) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    labels = (torch.rand(n, generator=gen) < 0.4).to(torch.float32)
    scores = torch.sigmoid(torch.randn(n, generator=gen) + 1.2 * labels)
    scores[::50] = 0.5  # some ties, across labels
    return scores, labels


def test_auroc_equals_the_rank_sum_formula():
    scores, labels = fixed_scores()
    assert gathered_auroc(scores, labels) == pytest.approx(rank_sum_auroc(scores.numpy(), labels.numpy()), abs=1e-6)


def _half_auroc(rank: int, world: int, device, scores, labels) -> float:
    return gathered_auroc(scores[rank::world], labels[rank::world])


def test_auroc_gathered_over_two_ranks_equals_one_rank(tmp_path):
    scores, labels = fixed_scores()
    both = spawn_ranks(_half_auroc, 2, tmp_path, scores, labels)
    alone = gathered_auroc(scores, labels)
    assert both == [pytest.approx(alone, abs=1e-7)] * 2
    # A rank's own half alone scores differently: the gather is what makes them agree.
    assert gathered_auroc(scores[0::2], labels[0::2]) != pytest.approx(alone, abs=1e-7)


def test_eval_schedule_by_hand():
    cfg = tiny(iters=10, warmup_iters=0)  # global batch 96
    def at(every: int, iters: int = 10) -> list[int]:
        c = cfg.replace(run=dataclasses.replace(cfg.run, iters=iters),
                        data=dataclasses.replace(cfg.data, path="unused"),
                        evaluation=EvalConfig(every_samples=every))
        return eval_iterations(c)
    assert at(0, 10) == []
    assert at(192) == [1, 3, 5, 7, 9]  # 192 samples every 2 iterations; the last is one of them
    assert at(250) == [2, 5, 7, 9]  # 250, 500, 750 reached after 288, 576, 768 samples; then the last
    assert at(50, 2) == [0, 1]  # several multiples inside one iteration: one evaluation


@pytest.mark.parametrize("args, message", [
    (["--eval-every", "1000"], "evaluation needs --data"),
    (["--target-auc", "0.7"], "give --eval-every too"),
    (["--eval-every", "1000", "--target-auc", "1.5", "--data", "x"], "between 0.5 and 1"),
])
def test_bad_evaluation_settings_are_one_line(args, message, tmp_path, capsys):
    from harness.cli import main

    assert main(["bench", "--preset", "tiny", "--runs-root", str(tmp_path / "runs"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "runs").exists()


def test_a_run_stops_at_its_target_and_records_its_evaluations(tmp_path, capfd):
    """tiny on 2 ranks over generated days: an evaluation every 20 iterations; the first to reach
    0.7 stops the run, so fewer iterations than asked are recorded, and each evaluation is a row."""
    import pandas as pd

    from harness.cli import main
    from harness.tools.make_dataset import main as make_dataset

    assert make_dataset(["--out", str(tmp_path / "data"), "--rows", "12000", "--days", "2"]) == 0
    runs = tmp_path / "runs"
    assert main(["bench", "--preset", "tiny", "--device", "cpu", "--data", str(tmp_path / "data"), "--iters", "120",
                 "--warmup", "0", "--eval-every", "1920", "--target-auc", "0.7", "--runs-root", str(runs)]) == 0
    out = capfd.readouterr().out  # the ranks' own lines come from their processes
    (run,) = runs.iterdir()
    evals = pd.concat(pd.read_parquet(p) for p in run.glob("rank00000/evals-*.parquet"))
    assert evals["reached_target"].iloc[-1] and not evals["reached_target"].iloc[:-1].any()
    assert (evals["auc"].iloc[-1] >= 0.7) and (evals["auc"].iloc[:-1] < 0.7).all()
    assert list(evals["after_iteration"]) == [19 + 20 * i for i in range(len(evals))]
    iterations = pd.concat(pd.read_parquet(p) for p in run.glob("rank00000/iterations-*.parquet"))
    assert iterations["iteration"].max() == evals["after_iteration"].iloc[-1] < 119
    assert "target reached: training stops" in out
    # The summary make bench printed, and the report: time and samples to target from the records.
    first = iterations.loc[iterations["iteration"] == 0, "start_ns"].iloc[0]
    hit = evals[evals["reached_target"]].iloc[0]
    seconds = (hit["end_ns"] - first) / 1e9
    assert f"time to target {seconds:.2f} s" in out and f"samples to target {hit['trained_samples']:,}" in out
    assert main(["report", "--run", run.name, "--runs-root", str(runs), "--reports-root", str(tmp_path / "reports")]) == 0
    folder = tmp_path / "reports" / run.name
    md = (folder / "report.md").read_text()
    assert "## Evaluation" in md and f"time to target {seconds:.2f} s" in md and (folder / "auc.png").stat().st_size
    summary = pd.read_csv(folder / "evaluation_summary.csv").iloc[0]
    assert summary["samples_to_target"] == hit["trained_samples"] and summary["best_auc"] == pytest.approx(evals["auc"].max())


def test_evaluation_scores_what_the_unsharded_reference_scores(tmp_path):
    """2 ranks, a plan of every kind, 5 steps on generated days, then an evaluation: its AUROC is
    the float64 rank-sum AUROC of the reference model's scores on the same held-out samples."""
    from harness.config import OptimizerConfig, ShardingConfig
    from harness.data.criteo_files import CriteoFiles
    from harness.tools.make_dataset import main as make_dataset
    from harness.launch.planning import make_plan
    from tests.distributed import run_ranks
    from tests.test_sharded_training import MIXED, STEPS, reference_run

    assert make_dataset(["--out", str(tmp_path / "data"), "--rows", "2000", "--days", "2"]) == 0
    cfg = tiny(nodes=1, gpus_per_node=2, iters=STEPS, warmup_iters=0)
    cfg = cfg.replace(data=dataclasses.replace(cfg.data, path=str(tmp_path / "data")),
                      optimizer=OptimizerConfig(learning_rate=0.05, eps=1e-2),
                      sharding=ShardingConfig(kind="auto", per_table=MIXED),
                      evaluation=EvalConfig(every_samples=STEPS * cfg.data.global_batch_size))
    plan, _ = make_plan(cfg, ranks_per_host=2)
    ranks = run_ranks(cfg, plan, tmp_path)
    _, ref = reference_run(cfg)
    files = CriteoFiles(tmp_path / "data", cfg.model, cfg.data.global_batch_size)
    _, rows = files.held_out("val")
    held = files.held_out_batch("val", 0, rows // 96 * 96)
    with torch.no_grad():
        scores = torch.sigmoid(ref.logits(held.dense, held.sparse.lengths, held.sparse.values))
    expected = rank_sum_auroc(scores.numpy(), held.labels.numpy())
    for r in ranks:
        (ev,) = r["evals"]
        assert ev.after_iteration == STEPS - 1 and ev.eval_samples == len(held.labels)
        assert ev.auc == pytest.approx(expected, abs=1e-4)
