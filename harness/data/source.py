"""The run's batches: MLPerf-layout files when --data names a folder, else the synthetic stream.

Both give every rank its slice of global batch i (`local_batch`), so the train loops, the
input pipeline and the TorchRec engine take either.
"""

from __future__ import annotations

from harness.config import BenchConfig
from harness.data.criteo_files import CriteoFiles, DataError
from harness.data.synthetic import SyntheticCriteo

BatchSource = SyntheticCriteo | CriteoFiles


def open_batches(cfg: BenchConfig) -> BatchSource:
    """Opening the files checks their layout against the model, that they hold the run's
    iterations and, when it evaluates, a global batch of held-out samples (harness.data.criteo_files.
    DataError, a ValueError, names the file)."""
    if cfg.data.path is None:
        return SyntheticCriteo(cfg.model, cfg.data)
    files = CriteoFiles(cfg.data.path, cfg.model, cfg.data.global_batch_size)
    files.check_iterations(cfg.run.warmup_iters + cfg.run.iters)
    stage = cfg.evaluation.stage
    if cfg.evaluation.every_samples and not files.held_out_scored(stage):
        raise DataError(f"{files.folder}: the {stage} half of the held-out day holds {files.held_out(stage)[1]} samples, "
                        f"fewer than one global batch of {cfg.data.global_batch_size}: nothing to evaluate")
    return files
