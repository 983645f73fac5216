"""The make-target programs beside bench: perf, perf-dynamic, precision-perf, plan-compare, dataset,
data-perf, mlperf, gpu-check and the install check."""
