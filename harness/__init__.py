"""Runs and measures DLRM-DCNv2: CLI, config, launch, train loop, timeline, run records, reports."""

import logging


class _FbgemmTableGap(logging.Filter):
    """fbgemm-gpu 1.6's import warns, once for each library it loads (84 lines on stderr a process),
    that its own torch-compatibility table has no entry for 1.6: its table stops at 1.5, so the
    warning says nothing of the torch beside it (the GPU hosts' pair: torch 2.11, fbgemm-gpu 1.6.0).
    It buried the one line a bad input gets. `harness.tools.check_install` checks the pair; fbgemm's
    other warnings (a pair its table knows to be mismatched) pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "_fbgemm_torch_compat_table has no entry" not in record.getMessage()


logging.getLogger().addFilter(_FbgemmTableGap())
