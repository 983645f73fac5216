"""gpu-bench's check of the GPU draw (the default on CUDA) before any run: two batches of the bench's
shape drawn on the GPU (harness/data/device_draw.py) against numpy's, in a process of its own (a
kernel that fails to build or faults leaves gpu-bench's own CUDA state alone). Where it fails or
values differ, every run of the bench draws on the host (gpu_bench.run_draw_check) and the table
says why, or how many values differ."""

from __future__ import annotations


def draw_check(preset: str, batch: int) -> dict:
    """{"error": why it could not draw, or None; "differ": ids, lengths, dense values and labels
    that differ from numpy's over the two batches; "values": how many of each were compared}. The
    battery's tests/test_device_draw.py asserts on it too."""
    import torch

    from harness.config import DataConfig
    from harness.data.device_draw import DeviceSynthetic, unavailable
    from harness.data.synthetic import SyntheticCriteo
    from harness.presets import PRESETS

    missing = unavailable()
    if missing:
        return {"error": missing}
    cfg = PRESETS[preset]()
    host = SyntheticCriteo(cfg.model, DataConfig(global_batch_size=batch))
    differ = {"ids": 0, "lengths": 0, "dense": 0, "labels": 0}
    values = dict(differ)
    try:
        drawn = DeviceSynthetic(host, torch.device("cuda", 0))
        for it in (0, 1):
            got, want = drawn.local_batch(it, 0, 1), host.local_batch(it, 0, 1)
            if got.sparse.feature_values != want.sparse.feature_values:
                raise ValueError(f"values a feature {got.sparse.feature_values}, numpy's {want.sparse.feature_values}")
            for name, a, b in (("ids", got.sparse.values, want.sparse.values),
                               ("lengths", got.sparse.lengths, want.sparse.lengths), ("dense", got.dense, want.dense),
                               ("labels", got.labels, want.labels)):
                if a.shape != b.shape:
                    raise ValueError(f"{name}: shape {tuple(a.shape)} against numpy's {tuple(b.shape)}")
                differ[name] += int((a.cpu() != b).sum())
                values[name] += b.numel()
    except Exception as exc:  # reported in the table; the bench's runs then draw on the host
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None, "differ": differ, "values": values}


def check_line(check: dict | None) -> str | None:
    """The table's row for the check, or None where it did not run."""
    if not check:
        return None
    if check.get("error"):
        return f"failed: {check['error']}"
    differ, values = check["differ"], check["values"]
    if not any(differ.values()):
        return f"numpy's bits: " + ", ".join(f"{n} {k}" for k, n in values.items())
    return "differ from numpy's: " + ", ".join(f"{differ[k]} of {values[k]} {k}" for k in differ)
