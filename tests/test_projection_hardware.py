"""Which GPU a projection is of (harness/projection/hardware.py): the calibration runs' GPU by its
name, another GPU projected from their figures (H100 runs to an H200, the device tool's other
kind), and the mixes that say nothing refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.projection.calibrate import calibrate, measured
from harness.launch.planning import gpu_profile_name
from harness.projection.hardware import h100, h200, retarget
from harness.projection.kernels import dense_impl
from harness.projection.project import effective_flags, iteration_ops

H100_RUN = Path(__file__).parent / "data" / "h100-runs-2" / "s-bf16-r0"
CPU_RUN = Path(__file__).parent / "data" / "cpu-runs-2core" / "tiny-1-r0"


def _on(tmp_path: Path, device: str, name: str = "run") -> Path:
    """The recorded H100 run, its manifest saying it ran on `device`."""
    folder = tmp_path / name
    shutil.copytree(H100_RUN, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["device"] = device
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_the_h200_has_the_h100s_peaks_and_its_own_memory():
    """The two data sheets' figures (dense, no sparsity): the same Hopper tensor cores; 4.8 TB/s of
    HBM3e against 3.35 TB/s; the planner keeps the H100's ~10 GiB of headroom out of 141 GB."""
    from harness.launch.planning import PROFILES
    a, b = h100(), h200()
    for key in ("peak_fp32_tflops", "peak_tf32_tflops", "peak_bf16_tflops"):
        assert a.value(key) == b.value(key)
    assert (a.value("peak_bf16_tflops"), b.value("hbm_gbps"), a.value("hbm_gbps")) == (989.4, 4800, 3350)
    assert PROFILES["h200"]["memory_gib"] == 120.0 and 141e9 / 2**30 - 120 == pytest.approx(80e9 / 2**30 - 64, abs=1)


def test_a_runs_gpu_is_read_from_its_name_and_an_unknown_one_is_refused(tmp_path):
    assert gpu_profile_name("cuda (NVIDIA H100 80GB HBM3)") == "h100"
    assert gpu_profile_name("cuda (NVIDIA H200)") == "h200"
    with pytest.raises(ValueError, match="no spec profile for the GPU 'cuda \\(NVIDIA A100"):
        gpu_profile_name("cuda (NVIDIA A100-SXM4-80GB)")
    profile, _, _ = calibrate([_on(tmp_path, "cuda (NVIDIA H200)")])
    assert profile.name == "h200" and profile.value("hbm_gbps") == 4800
    with pytest.raises(ValueError, match="calibrate: a100: no spec profile"):
        calibrate([_on(tmp_path, "cuda (NVIDIA A100-SXM4-80GB)", "a100")])


def test_runs_of_two_gpus_do_not_calibrate_together(tmp_path):
    with pytest.raises(ValueError, match="ran on 2 devices"):
        calibrate([H100_RUN, _on(tmp_path, "cuda (NVIDIA H200)")])


def test_h100_runs_project_an_h200_with_its_bandwidth_and_their_efficiencies():
    """Retargeted, every figure the run set is the H100 calibration's (named so), every spec figure
    the H200's; an embedding lookup's device time then scales by the two HBM bandwidths exactly,
    and its host time not at all."""
    on_h100, cal, _ = calibrate([H100_RUN])
    on_h200 = retarget(on_h100, "h200")
    assert on_h200.name == "h200" and on_h200.value("hbm_gbps") == 4800
    carried = [k for k, f in on_h100.figures.items() if f.source.startswith("calibrated")]
    assert {"launch_us", "lookup_eff", "update_eff"} <= set(carried)
    for key in carried:
        fig = on_h200.figures[key]
        assert fig.value == on_h100.value(key) and fig.source.startswith("calibrated: s-bf16-r0")
        assert fig.note.endswith("measured on h100")
    assert on_h200.figures["hbm_gbps"].source == on_h100.figures["hbm_gbps"].source
    m = measured(H100_RUN)
    cfg = m.run.manifest.config

    def emb_bwd(profile):
        ops, _ = iteration_ops(cfg, m.work, profile, cal, effective_flags(cfg, profile, m.work),
                               **dense_impl(m.run.manifest.optimizations))
        return next(op for op in ops if getattr(op, "stage", "") == "emb_bwd" and hasattr(op, "dev_s"))

    a, b = emb_bwd(on_h100), emb_bwd(on_h200)
    assert b.dev_s == pytest.approx(a.dev_s * 3350 / 4800, rel=1e-12) and b.host_s == a.host_s
    assert retarget(on_h100, "h100") is on_h100


def test_a_cpu_and_a_gpu_do_not_calibrate_each_other(tmp_path, capsys):
    """A CPU's launch costs and efficiencies say nothing of a GPU's: refused in one line, before the
    projection starts (the tool returns 2 and writes no report)."""
    from harness.tools.project import main
    on_h100 = calibrate([H100_RUN])[0]
    with pytest.raises(ValueError, match="--hardware cpu: the calibration runs ran on a GPU"):
        retarget(on_h100, "cpu")
    out = tmp_path / "report"
    assert main(["--preset", "tiny", "--nodes", "1", "--gpus-per-node", "1", "--hardware", "h100",
                 "--calibrate", str(CPU_RUN), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--hardware h100: the calibration runs ran on a CPU" in err[0]
    assert not out.exists()


def test_an_h200_projection_names_its_gpu_and_sets_no_published_h100_figures_beside_it(tmp_path, capsys):
    from harness.tools.project import main
    assert main(["--preset", "mlperf", "--nodes", "2", "--gpus-per-node", "8", "--hardware", "h200",
                 "--plans", "harness", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "projection.md").read_text()
    assert "2 x 8 h200" in text and "measured on h100" in text and "7.6 ms" not in text
    assert "7.6 ms" not in capsys.readouterr().out
