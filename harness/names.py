"""Every name a user, a report or the Makefile chooses from, importable without torch or fbgemm.

The Makefile reads the valid knob values from here with the system python3 before .venv
exists; the report side reads the flag and stage names without importing the config's
heavy neighbours. model/ owns the names of its own concepts (model/names.py).
"""

from model.names import (
    COLLECTIVE_WAITS, COMM_PRECISIONS, DYNAMIC_KINDS, DYNAMIC_POLICIES, EMBEDDING_OPTIMIZERS, EXCHANGE_PHASES,
    SHARDING_TYPES, TABLE_PRECISIONS, ShardingType,
)

STAGES = ("input_dist", "emb_fwd", "dense_fwd_bwd", "emb_bwd", "dense_update")
"""The five stages of one iteration (design.md), in execution order. Records, reports and tests use exactly these."""

BETWEEN_ITERATIONS = "between_iterations"
"""What runs between one iteration's end and the next one's start (the next batch built, records
flushed): no stage, but a segment of the iteration period of its own. Sub-span records
(rankNNNNN/subspans-*.parquet) with this stage name what ran there (`name`: "next_batch",
"flush_records", ...), under `iteration` i, the iteration whose end the gap follows; the report
derives the gap itself from the iteration records (start of i+1 - end of i)."""

STARTUP_PHASES = ("imports", "process_group", "probes", "build", "loop")
"""A rank's phases outside the timed iterations, in order (harness/run/startup.py); all but the
last come before the first iteration."""

OPTIMIZATION_FLAGS = ("cuda_graphs", "threaded_input_dist", "pinned_d2h", "avoid_record_streams", "skip_splits_a2a")
"""The published optimizations (design.md), each one flag; the ablation switches these."""

SHARDING_KINDS = ("auto", *SHARDING_TYPES)
"""`--sharding` / SHARDING=: the planner picks per table (auto), or one type forced on every table."""

HARDWARE_PROFILES = ("cpu", "h100", "h200")
"""Bandwidth and memory profiles the planner knows (harness/launch/planning.py)."""

HARDWARE_CHOICES = ("auto", *HARDWARE_PROFILES)
"""`--hardware`: a profile, or auto (the run's device's: harness/launch/planning.hardware_profile)."""

DEVICES = ("auto", "cpu", "cuda")
"""What ranks run on: auto takes CUDA when present."""

DRAW_PLACES = ("host", "device")
"""`--draw-on`: where synthetic batches are drawn (harness/data/synthetic.py on the host,
harness/data/device_draw.py on a GPU)."""

PRESET_NAMES = ("mlperf", "small", "tiny", "mlperf-ids")
"""The presets (harness/presets.py defines one function for each)."""

ENGINES = ("harness", "torchrec")
"""Who trains: this project's sharded embeddings and loop, or stock TorchRec on the same config."""

STAGE_OF_PHASE = {"ids": "input_dist", "pooled_fwd": "emb_fwd", "pooled_bwd": "emb_bwd", "table_grads": "emb_bwd",
                  "dense_grads": "dense_fwd_bwd"}
"""The stage each exchange phase's bytes are recorded under (model/collective_bytes.py PHASES): the
dense gradients' all-reduce is launched bucket by bucket during the dense backward."""
if set(STAGE_OF_PHASE) != set(EXCHANGE_PHASES) or not set(STAGE_OF_PHASE.values()) <= set(STAGES):
    raise ImportError(f"harness/names.py STAGE_OF_PHASE maps {sorted(STAGE_OF_PHASE)}; model/names.py has {EXCHANGE_PHASES}")

ENGINE_TIMED_STAGES = {"harness": STAGES, "torchrec": ("dense_update",)}
"""The stages each engine records. TorchRec's TrainPipelineSparseDist runs the others inside one
`progress` call, interleaved with the next batch's input dist, with no seam to time them at
without changing what it runs; so they are absent from its records, never estimated."""

DENSE_PRECISIONS = ("fp32", "bf16", "bf16-pure")
"""The dense arch's arithmetic: float32; bf16 mixed precision (autocast: bf16 matmuls, fp32
elementwise work); or bf16-pure (every activation and gradient in bf16, fp32 weights, optimizer
state and loss). The last two change the numbers by design."""

RUN_STATES = ("running", "completed", "failed")
"""A run's status moves running -> completed | failed (design.md, "Run records")."""

COMPACTED = "all"
"""A completed run's records, one file per rank and kind: rankNNNNN/<kind>-all.parquet (harness/records/writer.py)."""

__all__ = [
    "COLLECTIVE_WAITS", "COMM_PRECISIONS", "DENSE_PRECISIONS", "TABLE_PRECISIONS", "STAGE_OF_PHASE", "DEVICES", "EMBEDDING_OPTIMIZERS", "ENGINE_TIMED_STAGES", "ENGINES", "HARDWARE_CHOICES", "HARDWARE_PROFILES", "OPTIMIZATION_FLAGS",
    "COMPACTED", "DYNAMIC_POLICIES", "PRESET_NAMES", "RUN_STATES", "SHARDING_KINDS", "SHARDING_TYPES", "STAGES",
    "DYNAMIC_KINDS", "ShardingType", "BETWEEN_ITERATIONS",
]
