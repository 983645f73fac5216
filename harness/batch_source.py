"""The run's batches: MLPerf-layout files when --data names a folder, else the synthetic stream.

Both give every rank its slice of global batch i (`local_batch`), so the train loops, the
input pipeline and the TorchRec engine take either.
"""

from __future__ import annotations

from harness.config import BenchConfig
from harness.criteo_files import CriteoFiles
from harness.data import SyntheticCriteo

BatchSource = SyntheticCriteo | CriteoFiles


def open_batches(cfg: BenchConfig) -> BatchSource:
    """Opening the files checks their layout against the model and that they hold the run's
    iterations (harness.criteo_files.DataError, a ValueError, names the file)."""
    if cfg.data.path is None:
        return SyntheticCriteo(cfg.model, cfg.data)
    files = CriteoFiles(cfg.data.path, cfg.model, cfg.data.global_batch_size)
    files.check_iterations(cfg.run.warmup_iters + cfg.run.iters)
    return files
