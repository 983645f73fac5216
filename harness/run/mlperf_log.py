"""The MLPerf result log of an evaluating run: runs/<run_id>/mlperf_log.txt, written by rank 0
through mlperf-logging's mllog, in the order the training rules (ruleset 6.0.0) check.

    cache_clear, init_start, submission and hyperparameter events, init_stop, run_start,
    then for each segment of training: block_start, eval_start, eval_stop, eval_accuracy
    (metadata epoch_num: training samples seen over the training days' samples), block_stop,
    and run_stop with status success (an evaluation reached --target-auc) or aborted.

The harness's own records stay the source of every measurement; this file is for the MLPerf tools
(`python -m mlperf_logging.compliance_checker --usage training --ruleset 6.0.0 <file>`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from harness.config import BenchConfig

LOG_NAME = "mlperf_log.txt"
BENCHMARK = "dlrm_dcnv2"


class ResultLog:
    """What rank 0 logs; every method is a no-op on other ranks or when not enabled."""

    def __init__(self, run_dir: Path | None, *, enabled: bool) -> None:
        self.mllog = None
        if not enabled or run_dir is None:
            return
        from mlperf_logging.mllog import constants
        from mlperf_logging.mllog.mllog import MLLogger

        self.constants = constants
        self.path = Path(run_dir) / LOG_NAME
        # A logger of its own (not mllog's shared one): a process that runs twice writes two files.
        logger = logging.getLogger(f"harness.run.mlperf_log.{self.path}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.handlers.clear()
        logger.addHandler(logging.FileHandler(self.path))
        # Stack offset 3: each line names the harness's call site (train.py), not this module.
        self.mllog = MLLogger(logger=logger, default_stack_offset=3)

    def _event(self, key: str, value: object = None, metadata: dict | None = None) -> None:
        if self.mllog is not None:
            self.mllog.event(key=key, value=value, metadata=metadata)

    def _start(self, key: str, metadata: dict | None = None) -> None:
        if self.mllog is not None:
            self.mllog.start(key=key, value=None, metadata=metadata)

    def _end(self, key: str, metadata: dict | None = None) -> None:
        if self.mllog is not None:
            self.mllog.end(key=key, value=None, metadata=metadata)

    def init_start(self, cfg: BenchConfig, *, platform: str, train_samples: int, eval_samples: int) -> None:
        if self.mllog is None:
            return
        c = self.constants
        self._event(c.CACHE_CLEAR, True)
        self._start(c.INIT_START)
        ev = cfg.evaluation
        for key, value in ((c.SUBMISSION_ORG, ev.submission_org), (c.SUBMISSION_PLATFORM, platform),
                           (c.SUBMISSION_DIVISION, "closed"), (c.SUBMISSION_STATUS, "research"),
                           (c.SUBMISSION_BENCHMARK, BENCHMARK),
                           (c.GLOBAL_BATCH_SIZE, cfg.data.global_batch_size), (c.GRADIENT_ACCUMULATION_STEPS, 1),
                           (c.OPT_NAME, "adagrad"), (c.OPT_BASE_LR, cfg.optimizer.learning_rate),
                           (c.OPT_ADAGRAD_LR_DECAY, 0), (c.OPT_WEIGHT_DECAY, 0),
                           (c.OPT_ADAGRAD_INITIAL_ACCUMULATOR_VALUE, 0), (c.OPT_ADAGRAD_EPSILON, cfg.optimizer.eps),
                           (c.OPT_LR_WARMUP_STEPS, 0), (c.OPT_LR_DECAY_START_STEP, 0), (c.OPT_LR_DECAY_STEPS, 0),
                           (c.TRAIN_SAMPLES, train_samples), (c.EVAL_SAMPLES, eval_samples)):
            self._event(key, value)

    def run_start(self) -> None:
        if self.mllog is not None:
            self._end(self.constants.INIT_STOP)
            self._start(self.constants.RUN_START)

    def block_start(self, *, samples: int, epoch: float) -> None:
        if self.mllog is not None:
            self._start(self.constants.BLOCK_START, {"samples_count": samples, "first_epoch_num": epoch,
                                                     "epoch_count": 1})

    def evaluation(self, *, auc: float, samples: int, epoch: float) -> None:
        """An evaluation's events, then the end of the block it closes."""
        if self.mllog is None:
            return
        c, meta = self.constants, {"samples_count": samples, "epoch_num": epoch}
        self._start(c.EVAL_START, meta)
        self._end(c.EVAL_STOP, meta)
        self._event(c.EVAL_ACCURACY, auc, meta)
        self._end(c.BLOCK_STOP, {"samples_count": samples, "first_epoch_num": epoch})

    def run_stop(self, *, success: bool, samples: int) -> None:
        if self.mllog is not None:
            self._end(self.constants.RUN_STOP, {"status": "success" if success else "aborted",
                                                "samples_count": samples})
            for handler in self.mllog.logger.handlers:
                handler.close()
