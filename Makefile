# DLRM-DCNv2 benchmark harness. `make help` lists targets and knobs.
# Every target that runs Python first makes .venv and installs the pinned requirements.

# Bench knobs have no defaults here: a knob left unset is not passed, so the preset's value (or
# the harness's) applies and each default lives once, in harness/config.py or harness/cli.py.
PRESET        ?=
NODES         ?=
GPUS_PER_NODE ?=
ITERS         ?=
WARMUP        ?=
SHARDING      ?=
REPEATS       ?=
OPTS          ?=
RUN           ?= latest
DRY_RUN       ?= 0
RUN_ID        ?=
ABLATION      ?=
NSYS          ?=
ENGINE        ?=
LAYOUTS       ?=
OUT           ?=
ROWS          ?=
DAYS          ?=
SEED          ?=
DATA          ?=
TARGET_AUC    ?=

PYTHON        ?= $(shell command -v python3.11 || command -v python3)
# Valid names come from harness/names.py, which imports neither torch nor anything else outside
# the standard library, so the system python reads them before .venv exists.
NAMES         = $(shell $(PYTHON) -c "import harness.names as n; print(' '.join(n.$(1)))")
VALID_PRESETS  := $(call NAMES,PRESET_NAMES)
VALID_SHARDING := $(call NAMES,SHARDING_KINDS)
VALID_ENGINES  := $(call NAMES,ENGINES)
VENV          := .venv
# A working NVIDIA driver picks the CUDA torch/fbgemm pair; anything else the CPU pair.
HAS_CUDA      := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_REQS    := $(if $(HAS_CUDA),requirements-cuda.txt,requirements-cpu.txt)
STAMP         := $(VENV)/.installed-$(basename $(TORCH_REQS))
# PY=<interpreter> on the command line (say a GPU node's container python, with CUDA torch and no
# package index): nothing is installed; host-packages checks that interpreter's torch and fbgemm
# instead, a pair other than the pinned one a warning. Otherwise .venv, made and checked by $(STAMP).
ifeq ($(origin PY),command line)
DEPS          := host-packages
else
PY            := $(VENV)/bin/python
DEPS          := $(STAMP)
endif

.PHONY: help bench ablation report test test-cluster cluster-packages perf precision-perf check-bench-knobs venv clean-venv browser compare plan-compare gpu-check \
        dataset data-perf check-dataset-out mlperf check-mlperf-data ext perf-dynamic redis-server host-packages gpu-bench

help:
	@echo "make bench  [PRESET=$(subst $() ,|,$(VALID_PRESETS))] [NODES=n] [GPUS_PER_NODE=n] [ITERS=n] [WARMUP=n]"
	@echo "            [SHARDING=$(subst $() ,|,$(VALID_SHARDING))] [DRY_RUN=0|1] [RUN_ID=...] [OPTS=\"...\"]"
	@echo "            a knob left unset takes the preset's value (PRESET: small); see $(PY) -m harness bench --help"
	@echo "            inside Slurm: srun, one torchrun a node; with MASTER_ADDR + NODE_RANK (+ RUN_ID): torchrun"
	@echo "            for this host (run it on every host); otherwise NODES x GPUS_PER_NODE local processes"
	@echo "            [ENGINE=harness|torchrec]  (torchrec: stock TorchRec on the same config, batches and weights)"
	@echo "            [DATA=dir]  (train on MLPerf-layout files, e.g. from make dataset, instead of synthetic batches)"
	@echo "make compare [PRESET=tiny] [REPEATS=3] [OPTS=\"...\"]  (torchrec and harness runs interleaved; last line: the ratio)"
	@echo "make ablation [PRESET=...] [NODES=...] [GPUS_PER_NODE=...] [SHARDING=...] [REPEATS=n (3)]"
	@echo "make report [RUN=latest|<run_id>|<baseline_id>,<candidate_id>] | [ABLATION=latest|<id>] | [NSYS=<file.sqlite>]"
	@echo "make test"
	@echo "make test-cluster  (root: real test hosts as network namespaces, torchrun on each, a real Slurm; else one line)"
	@echo "make perf   [PRESET=tiny|small (tiny)]   (timeline on vs off: the instrumentation's cost)"
	@echo "make precision-perf [PRESET=small] [REPEATS=2]  (fp16 tables, fp16/bf16 on the wire vs fp32: memory, interleaved runs)"
	@echo "make plan-compare [LAYOUTS=1x8,2x8,16x8]  (mlperf tables: this planner vs TorchRec's, planning only)"
	@echo "make mlperf DATA=dir [TARGET_AUC=0.80275] [PRESET=...] [NODES=n] [GPUS_PER_NODE=n] [OPTS=\"...\"]"
	@echo "            (one epoch at most, 20 evaluations an epoch, stops at the target AUROC; MLPerf result log in the run folder)"
	@echo "make dataset OUT=dir [ROWS=100000 a day] [DAYS=3] [PRESET=tiny] [SEED=0]  (synthetic days in the MLPerf file layout)"
	@echo "make data-perf [DATA=dir] [PRESET=small] [RUN=id|latest]  (the file loader's samples/s on one rank, beside the synthetic stream's and RUN's training)"
	@echo "make ext  (the C++ extensions in csrc/; every target that trains builds them)"
	@echo "make perf-dynamic [REPEATS=2]  (ID transformer: M ids/s vs a Python dict (median of 3 runs a case) and torch.unique; hit rate vs slots, a plot; mlperf-ids vs small)"
	@echo "make gpu-check  (on a GPU host: the CUDA battery, a line a check and a verdict; elsewhere one line)"
	@echo "make gpu-bench  (on a GPU host, first: battery, compare small at 8192 a GPU and --opts all, each flag alone, tiny)"
	@echo "PY=python3      (any target: that interpreter and its packages, nothing installed; e.g. a GPU node's container)"
	@echo "OPTS passes extra flags to 'python -m harness bench' (see: $(PY) -m harness bench --help)"

# Knobs the user set are checked before anything is installed or started.
check-bench-knobs:
	@test -n "$(VALID_PRESETS)" || { echo "make: cannot read harness/names.py with $(PYTHON)" >&2; exit 2; }
	@test -z "$(PRESET)" || { test $(words $(PRESET)) = 1 && case " $(VALID_PRESETS) " in *" $(PRESET) "*) ;; *) false;; esac; } || \
	  { echo "make: PRESET=$(PRESET) is not valid; valid values: $(VALID_PRESETS)" >&2; exit 2; }
	@for kv in $(foreach k,NODES GPUS_PER_NODE ITERS REPEATS ROWS DAYS,$(if $($(k)),$(k)=$($(k)))); do \
	  echo "$${kv#*=}" | grep -Eq '^[1-9][0-9]*$$' || \
	  { echo "make: $$kv is not valid; valid values: a positive integer (1, 2, 3, ...)" >&2; exit 2; }; done
	@test -z "$(WARMUP)" || echo "$(WARMUP)" | grep -Eq '^[0-9]+$$' || \
	  { echo "make: WARMUP=$(WARMUP) is not valid; valid values: an integer >= 0" >&2; exit 2; }
	@test -z "$(SEED)" || echo "$(SEED)" | grep -Eq '^[0-9]+$$' || \
	  { echo "make: SEED=$(SEED) is not valid; valid values: an integer >= 0" >&2; exit 2; }
	@test -z "$(SHARDING)" || case " $(VALID_SHARDING) " in *" $(SHARDING) "*) ;; \
	  *) echo "make: SHARDING=$(SHARDING) is not valid; valid values: $(VALID_SHARDING)" >&2; exit 2;; esac
	@test -z "$(ENGINE)" || case " $(VALID_ENGINES) " in *" $(ENGINE) "*) ;; \
	  *) echo "make: ENGINE=$(ENGINE) is not valid; valid values: $(VALID_ENGINES)" >&2; exit 2;; esac
	@case "$(DRY_RUN)" in 0|1) ;; \
	  *) echo "make: DRY_RUN=$(DRY_RUN) is not valid; valid values: 0 1" >&2; exit 2;; esac

# A venv holds one variant: pip would keep the other's torch (torch==2.13.0 accepts both builds),
# so a .venv made for the other variant (a CPU login node's, reused on a GPU node) is refused.
$(STAMP): requirements.txt $(TORCH_REQS) requirements-torchrec.txt requirements-torchrec-deps.txt constraints.txt
	@for other in $(VENV)/.installed-*; do case "$$other" in "$(STAMP)"|"$(VENV)/.installed-*") ;; \
	  *) echo "make: $(VENV) holds the $${other##*.installed-requirements-} variant, this machine needs the $(patsubst requirements-%,%,$(basename $(TORCH_REQS))) variant: run make clean-venv first" >&2; exit 2;; esac; done
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r $(TORCH_REQS) -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-torchrec.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -r requirements-torchrec-deps.txt
	$(PY) -m harness.tools.check_install $(basename $(TORCH_REQS))
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

host-packages:
	$(PY) -m harness.tools.check_install --host $(if $(HAS_CUDA),--cuda)

# The C++ extensions (csrc/), built by torch's extension tooling with the machine's compiler into
# model/ and harness/run/, beside the Python that loads them; rebuilt when a source changes.
# The suffix of the interpreter that will load them: the host's own with PY=..., else .venv's (made from PYTHON).
EXT_SUFFIX    := $(shell $(if $(filter host-packages,$(DEPS)),$(PY),$(PYTHON)) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
EXT           := model/_id_transformer$(EXT_SUFFIX) model/_row_init$(EXT_SUFFIX) harness/run/_row_index$(EXT_SUFFIX)
# One rule makes them all (a grouped target: one run of setup.py, not one a module).
$(EXT) &: $(filter-out host-packages,$(DEPS)) $(wildcard csrc/*.cpp csrc/*.h) csrc/setup.py | $(filter host-packages,$(DEPS))
	$(PY) csrc/setup.py -q build_ext --inplace --build-temp build/csrc
	@touch $(EXT)

ext: $(EXT)

# Only the knobs the user set become options (make knob -> harness option).
KNOB_ARGS = $(if $(PRESET),--preset $(PRESET)) $(if $(NODES),--nodes $(NODES)) \
  $(if $(GPUS_PER_NODE),--gpus-per-node $(GPUS_PER_NODE)) $(if $(ITERS),--iters $(ITERS)) \
  $(if $(WARMUP),--warmup $(WARMUP)) $(if $(SHARDING),--sharding $(SHARDING))
BENCH_ARGS = $(KNOB_ARGS) $(if $(ENGINE),--engine $(ENGINE)) $(if $(DATA),--data $(DATA))

bench: check-bench-knobs $(DEPS) $(EXT)
	$(PY) -m harness bench $(BENCH_ARGS) \
	  $(if $(filter 1,$(DRY_RUN)),--dry-run) $(if $(RUN_ID),--run-id $(RUN_ID)) $(OPTS)

# Baseline, each flag alone, all, all-but-one; REPEATS runs each (inactive-only configs once).
ablation: check-bench-knobs $(DEPS) $(EXT)
	$(PY) -m harness ablation $(KNOB_ARGS) $(if $(REPEATS),--repeats $(REPEATS)) $(OPTS)

# TorchRec vs harness on one config: REPEATS runs each, interleaved; PRESET defaults to tiny here.
compare: check-bench-knobs $(DEPS) $(EXT)
	$(PY) -m harness compare $(KNOB_ARGS) $(if $(PRESET),,--preset tiny) $(if $(REPEATS),--repeats $(REPEATS)) $(OPTS)

report: $(DEPS)
	$(PY) -m harness report $(if $(ABLATION),--ablation $(ABLATION),$(if $(NSYS),--nsys $(NSYS),--run $(RUN)))

# The report's HTML is checked in a real headless Chromium (tests/test_report_browser.py): the
# distribution's package, installed once; without apt-get the test says it skipped and why.
browser:
	@command -v chromium >/dev/null 2>&1 || if command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "make: no chromium and no apt-get: the browser check of report.html will be skipped" >&2; fi

# The Redis parameter store's tests start a real redis-server on a loopback port: the
# distribution's package, installed once; without apt-get those tests say they skipped and why.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || if command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null; \
	else echo "make: no redis-server and no apt-get: the Redis parameter-store tests will be skipped" >&2; fi

test: $(DEPS) $(EXT) browser redis-server
	$(PY) -m pytest

# Real hosts on this machine (network namespaces), torchrun on each, a real Slurm (tests/cluster/).
# Needs root: elsewhere one line says why and nothing runs (exit 0). The packages come from the
# distribution (as root, with apt-get); the check runs on the system python, before any install.
test-cluster: $(DEPS) $(EXT)
	@test "$$(id -u)" != 0 || $(MAKE) --no-print-directory cluster-packages
	@$(PYTHON) -m tests.cluster.testhosts check; rc=$$?; test $$rc -ne 3 || exit 0; test $$rc -eq 0 && \
	  echo "$(PY) -m pytest -m cluster tests/cluster" && $(PY) -m pytest -m cluster tests/cluster

CLUSTER_PACKAGES := slurmd:slurm-wlm munged:munge ip:iproute2 nsenter:util-linux ping:iputils-ping
cluster-packages:
	@pkgs=""; for cp in $(CLUSTER_PACKAGES); do command -v $${cp%%:*} >/dev/null 2>&1 || pkgs="$$pkgs $${cp#*:}"; done; \
	if [ -n "$$pkgs" ]; then \
	  command -v apt-get >/dev/null 2>&1 || { echo "make test-cluster: missing$$pkgs and no apt-get to install them" >&2; exit 2; }; \
	  echo "make test-cluster: installing$$pkgs"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$pkgs >/dev/null; fi

# The instrumentation's own cost: timeline on vs off, interleaved runs (PRESET=tiny|small).
perf: $(DEPS) $(EXT)
	$(PY) -m harness.tools.perf --preset $(or $(PRESET),tiny) $(if $(GPUS_PER_NODE),--gpus-per-node $(GPUS_PER_NODE))

# fp16 tables against fp32 (PRESET=tiny|small, small by default): memory planned and measured, and
# interleaved runs (iteration-time ratio, loss difference).
precision-perf: check-bench-knobs $(DEPS) $(EXT)
	$(PY) -m harness.tools.precision_perf --preset $(or $(PRESET),small) $(if $(REPEATS),--repeats $(REPEATS)) \
	  $(if $(GPUS_PER_NODE),--gpus-per-node $(GPUS_PER_NODE))

# The ID transformer (csrc/): transform throughput against a Python dict and torch.unique, hit rate
# against slots for power-law ids under each policy (a plot in reports/perf-dynamic/), then REPEATS
# interleaved pairs of mlperf-ids and static small runs (iteration time, peak RSS against the budget).
perf-dynamic: $(DEPS) $(EXT)
	$(PY) -m harness.tools.perf_dynamic $(if $(REPEATS),--repeats $(REPEATS))

# The CUDA battery (every test marked cuda), one line a check; without a GPU, one line and exit 0.
gpu-check: $(DEPS) $(EXT)
	$(PY) -m harness.tools.gpu_check

# The first run on a GPU host (harness/tools/gpu_bench.py): the battery, compare on small at 8192 a GPU
# (defaults, --opts all), each flag alone against the defaults, compare on tiny; one folder under
# runs/, one summary table. Without a GPU, one line and exit 0.
gpu-bench: $(DEPS) $(EXT)
	$(PY) -m harness.tools.gpu_bench $(OPTS)

# Planning only: the harness's sharding plan of the mlperf tables against TorchRec's planner.
plan-compare: $(DEPS)
	$(PY) -m harness.tools.plan_compare $(if $(LAYOUTS),--layouts $(LAYOUTS))

# OUT is checked before anything is installed.
dataset: check-bench-knobs check-dataset-out $(DEPS)
	$(PY) -m harness.tools.make_dataset --out $(OUT) $(if $(ROWS),--rows $(ROWS)) $(if $(DAYS),--days $(DAYS)) \
	  $(if $(PRESET),--preset $(PRESET)) $(if $(SEED),--seed $(SEED))

check-mlperf-data:
	@test -n "$(DATA)" || { echo "make mlperf: give DATA=<folder of MLPerf-layout files> (make dataset writes some)" >&2; exit 2; }

check-dataset-out:
	@test -n "$(OUT)" || { echo "make dataset: give OUT=<folder to write>" >&2; exit 2; }

mlperf: check-bench-knobs check-mlperf-data $(DEPS) $(EXT)
	$(PY) -m harness.tools.mlperf --data $(DATA) $(if $(TARGET_AUC),--target-auc $(TARGET_AUC)) $(KNOB_ARGS) \
	  $(if $(ENGINE),--engine $(ENGINE)) $(if $(RUN_ID),--run-id $(RUN_ID)) $(OPTS)

data-perf: check-bench-knobs $(DEPS)
	$(PY) -m harness.tools.data_perf $(if $(DATA),--data $(DATA)) $(if $(PRESET),--preset $(PRESET)) \
	  $(if $(RUN),--against-run $(RUN))

clean-venv:
	rm -rf $(VENV)
