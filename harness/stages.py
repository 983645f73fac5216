"""The five stages of one iteration (design.md). Records, reports and tests use exactly these names."""

STAGES = ("input_dist", "emb_fwd", "dense_fwd_bwd", "emb_bwd", "dense_update")
