"""Runs and measures DLRM-DCNv2: CLI, config, launch, train loop, timeline, run records, reports."""
