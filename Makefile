# DLRM-DCNv2 benchmark harness. `make help` lists targets and knobs.
# Every target that runs Python first makes .venv and installs the pinned requirements.

PRESET        ?= small
NODES         ?= 1
GPUS_PER_NODE ?= 2
ITERS         ?= 20
WARMUP        ?= 3
OPTS          ?=
RUN           ?= latest
DRY_RUN       ?= 0
SHARDING      ?= auto
RUN_ID        ?=
REPEATS       ?= 3
ABLATION      ?=
NSYS          ?=
ENGINE        ?= harness

VALID_PRESETS  := mlperf small tiny
VALID_SHARDING := auto table_wise column_wise row_wise data_parallel
VALID_ENGINES  := harness torchrec
PYTHON        ?= $(shell command -v python3.11 || command -v python3)
VENV          := .venv
PY            := $(VENV)/bin/python
# A working NVIDIA driver picks the CUDA torch/fbgemm pair; anything else the CPU pair.
HAS_CUDA      := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_REQS    := $(if $(HAS_CUDA),requirements-cuda.txt,requirements-cpu.txt)
STAMP         := $(VENV)/.installed-$(basename $(TORCH_REQS))

.PHONY: help bench ablation compare report test perf check-bench-knobs venv clean-venv

help:
	@echo "make bench  [PRESET=small|tiny|mlperf] [NODES=1] [GPUS_PER_NODE=2] [ITERS=20] [WARMUP=3]"
	@echo "            [SHARDING=auto|table_wise|column_wise|row_wise|data_parallel] [DRY_RUN=0|1] [RUN_ID=...] [OPTS=\"...\"]"
	@echo "            inside Slurm: srun, one torchrun a node; with MASTER_ADDR + NODE_RANK (+ RUN_ID): torchrun"
	@echo "            for this host (run it on every host); otherwise NODES x GPUS_PER_NODE local processes"
	@echo "            [ENGINE=harness|torchrec]  (torchrec: stock TorchRec on the same config, batches and weights)"
	@echo "make compare [PRESET=tiny] [REPEATS=3] [OPTS=\"...\"]  (torchrec and harness runs interleaved; last line: the ratio)"
	@echo "make ablation [PRESET=...] [NODES=...] [GPUS_PER_NODE=...] [SHARDING=...] [REPEATS=3]"
	@echo "make report [RUN=latest|<run_id>] | [ABLATION=latest|<id>] | [NSYS=<file.sqlite>]"
	@echo "make test"
	@echo "make perf   [PRESET=tiny|small]   (timeline on vs off: the instrumentation's cost)"
	@echo "OPTS passes extra flags to 'python -m harness bench' (see: $(PY) -m harness bench --help)"

# Knobs are checked before anything is installed or started.
check-bench-knobs:
	@case " $(VALID_PRESETS) " in *" $(PRESET) "*) ;; \
	  *) echo "make: PRESET=$(PRESET) is not valid; valid values: $(VALID_PRESETS)" >&2; exit 2;; esac
	@for kv in NODES=$(NODES) GPUS_PER_NODE=$(GPUS_PER_NODE) ITERS=$(ITERS) REPEATS=$(REPEATS); do \
	  echo "$${kv#*=}" | grep -Eq '^[1-9][0-9]*$$' || \
	  { echo "make: $$kv is not valid; valid values: a positive integer (1, 2, 3, ...)" >&2; exit 2; }; done
	@echo "$(WARMUP)" | grep -Eq '^[0-9]+$$' || \
	  { echo "make: WARMUP=$(WARMUP) is not valid; valid values: an integer >= 0" >&2; exit 2; }
	@case " $(VALID_SHARDING) " in *" $(SHARDING) "*) ;; \
	  *) echo "make: SHARDING=$(SHARDING) is not valid; valid values: $(VALID_SHARDING)" >&2; exit 2;; esac
	@case " $(VALID_ENGINES) " in *" $(ENGINE) "*) ;; \
	  *) echo "make: ENGINE=$(ENGINE) is not valid; valid values: $(VALID_ENGINES)" >&2; exit 2;; esac
	@case "$(DRY_RUN)" in 0|1) ;; \
	  *) echo "make: DRY_RUN=$(DRY_RUN) is not valid; valid values: 0 1" >&2; exit 2;; esac

$(STAMP): requirements.txt $(TORCH_REQS) requirements-torchrec.txt requirements-torchrec-deps.txt constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r $(TORCH_REQS) -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-torchrec.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -r requirements-torchrec-deps.txt
	$(PY) -m harness.check_install $(basename $(TORCH_REQS))
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

bench: check-bench-knobs $(STAMP)
	$(PY) -m harness bench --preset $(PRESET) --nodes $(NODES) --gpus-per-node $(GPUS_PER_NODE) \
	  --iters $(ITERS) --warmup $(WARMUP) --sharding $(SHARDING) --engine $(ENGINE) \
	  $(if $(filter 1,$(DRY_RUN)),--dry-run) $(if $(RUN_ID),--run-id $(RUN_ID)) $(OPTS)

# Baseline, each flag alone, all, all-but-one; REPEATS runs each (inactive-only configs once).
ablation: check-bench-knobs $(STAMP)
	$(PY) -m harness ablation --preset $(PRESET) --nodes $(NODES) --gpus-per-node $(GPUS_PER_NODE) \
	  --iters $(ITERS) --warmup $(WARMUP) --sharding $(SHARDING) --repeats $(REPEATS) $(OPTS)

# TorchRec vs harness on one config: REPEATS runs each, interleaved; PRESET defaults to tiny here.
compare: check-bench-knobs $(STAMP)
	$(PY) -m harness compare --preset $(if $(filter command line,$(origin PRESET)),$(PRESET),tiny) \
	  --nodes $(NODES) --gpus-per-node $(GPUS_PER_NODE) --iters $(ITERS) --warmup $(WARMUP) \
	  --sharding $(SHARDING) --repeats $(REPEATS) $(OPTS)

report: $(STAMP)
	$(PY) -m harness report $(if $(ABLATION),--ablation $(ABLATION),$(if $(NSYS),--nsys $(NSYS),--run $(RUN)))

test: $(STAMP)
	$(PY) -m pytest

# The instrumentation's own cost: timeline on vs off, interleaved runs (PRESET=tiny|small).
perf: $(STAMP)
	$(PY) -m harness.perf --preset $(if $(filter command line,$(origin PRESET)),$(PRESET),tiny) --gpus-per-node $(GPUS_PER_NODE)

clean-venv:
	rm -rf $(VENV)
