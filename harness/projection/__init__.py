"""Projection (issue 46): what a configuration would take on hardware it has not run on.

A relative planner cost is not a prediction; this wing builds one. From a config (preset, layout,
flags), its sharding plan, the analytic FLOPs and bytes of each stage, the kernels and collectives
each stage launches on the code path the flags select, and a hardware profile (spec sheet figures,
and the per-device compute figures that calibration run folders measure), a discrete-event timeline
of one steady-state iteration per rank gives each rank's per-stage time and the iteration period.

Modules: hardware (profiles, every figure with its source), kernels (launch counts per stage),
work (FLOPs, bytes and exchanges per rank), calibrate (figures from run folders), timeline (the
discrete-event simulation), project (config -> projected stages, flag effects), render (the
projected report). Nothing here is fitted to a published iteration time.
"""
