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
ALL_RANKS     ?= 0
ENGINE        ?=
LAYOUTS       ?=
OUT           ?=
ROWS          ?=
DAYS          ?=
SEED          ?=
DATA          ?=
TARGET_AUC    ?=
HARDWARE      ?=
# make test's pytest workers (pytest-xdist; 0: one process). Two fit the 2-core CI machine: most
# tests wait on rank processes they start, so two workers keep both cores busy; more crowd them.
TEST_WORKERS  ?= 2

PYTHON        ?= $(shell command -v python3.11 || command -v python3)
# Valid names come from harness/names.py, which imports neither torch nor anything else outside
# the standard library, so the system python reads them before .venv exists.
NAMES         = $(shell $(PYTHON) -c "import harness.names as n; print(' '.join(n.$(1)))")
VALID_PRESETS  := $(call NAMES,PRESET_NAMES)
VALID_SHARDING := $(call NAMES,SHARDING_KINDS)
VALID_ENGINES  := $(call NAMES,ENGINES)
VALID_HARDWARE := $(call NAMES,HARDWARE_PROFILES)
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

# Refusals are decided while make reads this file, before any recipe runs: a failed recipe would
# make make print its own "*** [...] Error 2" under the one line, and question mode (-q) is the one
# way make exits non-zero (status 1) without a word of its own. Under -q no recipe runs (none of the
# goals checked here has a recipe line with $(MAKE), which -q would still run).
comma         := ,
NODIGITS       = $(subst 0,,$(subst 1,,$(subst 2,,$(subst 3,,$(subst 4,,$(subst 5,,$(subst 6,,$(subst 7,,$(subst 8,,$(subst 9,,$(1)))))))))))
ONE_NUMBER     = $(and $(filter 1,$(words $(1))),$(if $(call NODIGITS,$(1)),,1))
IS_POSITIVE    = $(and $(call ONE_NUMBER,$(1)),$(if $(filter 0%,$(1)),,1))
NOT_ONE_OF     = $(if $(filter 1,$(words $(1))),$(filter-out $(2),$(1)),x)
CHECK_NAME     = $(if $($(1)),$(if $(call NOT_ONE_OF,$($(1)),$(2)),make: $(1)=$($(1)) is not valid; valid values: $(2)))
CHECK_POSITIVE = $(if $($(1)),$(if $(call IS_POSITIVE,$($(1))),,make: $(1)=$($(1)) is not valid; valid values: a positive integer (1$(comma) 2$(comma) 3$(comma) ...)))
CHECK_NATURAL  = $(if $($(1)),$(if $(call ONE_NUMBER,$($(1))),,make: $(1)=$($(1)) is not valid; valid values: an integer >= 0))
KNOB_GOALS    := bench ablation compare precision-perf dataset mlperf data-perf project check-bench-knobs
VENV_FREE     := help clean-venv check-bench-knobs check-dataset-out check-mlperf-data browser redis-server cluster-packages
GOALS_OF       = $(filter $(1),$(MAKECMDGOALS))
OTHER_VARIANT := $(firstword $(filter-out $(STAMP),$(wildcard $(VENV)/.installed-*)))
REFUSAL       := $(or \
  $(if $(call GOALS_OF,$(KNOB_GOALS)),$(or \
    $(if $(VALID_PRESETS),,make: cannot read harness/names.py with $(PYTHON)), \
    $(call CHECK_NAME,PRESET,$(VALID_PRESETS)), \
    $(strip $(foreach k,NODES GPUS_PER_NODE ITERS REPEATS ROWS DAYS,$(call CHECK_POSITIVE,$(k)))), \
    $(call CHECK_NATURAL,WARMUP), $(call CHECK_NATURAL,SEED), \
    $(call CHECK_NAME,SHARDING,$(VALID_SHARDING)), $(call CHECK_NAME,ENGINE,$(VALID_ENGINES)), \
    $(call CHECK_NAME,HARDWARE,$(VALID_HARDWARE)), $(call CHECK_NAME,DRY_RUN,0 1))), \
  $(if $(call GOALS_OF,report),$(call CHECK_NAME,ALL_RANKS,0 1)), \
  $(if $(call GOALS_OF,test),$(if $(TEST_WORKERS),$(call CHECK_NATURAL,TEST_WORKERS),make: TEST_WORKERS= is not \
    valid; valid values: an integer >= 0)), \
  $(if $(call GOALS_OF,dataset check-dataset-out),$(if $(OUT),,make dataset: give OUT=<folder to write>)), \
  $(if $(call GOALS_OF,mlperf check-mlperf-data),$(if $(DATA),,make mlperf: give DATA=<folder of MLPerf-layout \
    files> (make dataset writes some))), \
  $(if $(and $(filter $(STAMP),$(DEPS)),$(OTHER_VARIANT),$(filter-out $(VENV_FREE),$(MAKECMDGOALS))),make: \
    $(VENV) holds the $(OTHER_VARIANT:$(VENV)/.installed-requirements-%=%) variant$(comma) this machine needs the \
    $(patsubst requirements-%,%,$(basename $(TORCH_REQS))) variant: run make clean-venv first))
ifneq ($(REFUSAL),)
$(shell printf '%s\n' '$(subst ','"'"',$(strip $(REFUSAL)))' >&2)
MAKEFLAGS     += -q
endif

.PHONY: help bench ablation report clean-runs test test-slow test-cluster cluster-packages perf precision-perf check-bench-knobs venv clean-venv browser compare plan-compare project gpu-check \
        dataset data-perf check-dataset-out mlperf check-mlperf-data ext perf-dynamic redis-server host-packages gpu-bench

# Every line fits 100 columns; the preset table comes from harness/presets.py (system python).
help:
	@echo "make bench  [PRESET=$(subst $() ,|,$(VALID_PRESETS))] [NODES=n] [GPUS_PER_NODE=n] [ITERS=n]"
	@echo "            [WARMUP=n] [SHARDING=name] [DRY_RUN=0|1] [RUN_ID=...] [OPTS=\"...\"]"
	@echo "            [ENGINE=harness|torchrec] [DATA=dir]  (torchrec: stock TorchRec, same config)"
	@echo "            SHARDING: $(wordlist 1,5,$(VALID_SHARDING))"
	@echo "                      $(wordlist 6,99,$(VALID_SHARDING))"
	@echo "            a knob left unset takes the preset's value (the table below)"
	@echo "            OPTS: any option of $(PY) -m harness bench --help"
	@echo "            DATA: MLPerf-layout files (make dataset writes some) instead of synthetic batches"
	@echo "            launcher: in Slurm, srun with one torchrun a node; with MASTER_ADDR + NODE_RANK"
	@echo "            (+ RUN_ID), torchrun for this host (run it on every host); else local processes"
	@echo "make compare [PRESET=tiny] [REPEATS=3] [OPTS=\"...\"]  (torchrec vs harness, interleaved)"
	@echo "make ablation [PRESET=...] [NODES=...] [GPUS_PER_NODE=...] [SHARDING=...] [REPEATS=n (3)]"
	@echo "make report [RUN=latest|<id>|<base_id>,<id>] | [ABLATION=latest|<id>] | [NSYS=<file.sqlite>]"
	@echo "            [ALL_RANKS=0|1]  (1: list every rank; 0: past 16 ranks, those that bound the run)"
	@echo "make test [TEST_WORKERS=2]  (the whole suite on pytest workers, 7 to 14 minutes on 2 cores)"
	@echo "make test-cluster  (root: real test hosts as network namespaces and a real Slurm; else one line)"
	@echo "make test-slow  (tests too slow for make test: the projection on live CPU runs)"
	@echo "make perf   [PRESET=tiny|small (tiny)]  (timeline on vs off: the instrumentation's cost)"
	@echo "make precision-perf [PRESET=small] [REPEATS=2]  (fp16 tables, fp16/bf16 on the wire vs fp32)"
	@echo "make plan-compare [LAYOUTS=1x8,2x8,16x8]  (mlperf tables: this planner vs TorchRec's)"
	@echo "make project [PRESET=mlperf] [NODES=16] [GPUS_PER_NODE=8] [HARDWARE=h100|h200|cpu] [OPTS=...]"
	@echo "            [CALIBRATE=run,...]  (what the config would take there, calibrated on runs)"
	@echo "make mlperf DATA=dir [TARGET_AUC=0.80275] [PRESET=...] [NODES=n] [GPUS_PER_NODE=n] [OPTS=...]"
	@echo "            (an epoch at most, 20 evaluations an epoch, stops at the target; MLPerf result log)"
	@echo "make dataset OUT=dir [ROWS=100000 a day] [DAYS=3] [PRESET=tiny] [SEED=0]  (MLPerf file layout)"
	@echo "make data-perf [DATA=dir] [PRESET=small] [RUN=id|latest]  (the file loader's samples/s)"
	@echo "make ext    (the C++ extensions in csrc/; every target that trains builds them)"
	@echo "make perf-dynamic [REPEATS=2]  (ID transformer vs a dict and torch.unique; hit rates; a plot)"
	@echo "make gpu-check  (on a GPU host: the CUDA battery, a line a check; elsewhere one line)"
	@echo "make gpu-bench  (on a GPU host, first: battery, compares, each flag alone, tiny)"
	@echo "make clean-runs [PS=redis://...]  (old runs' parameter-store spill files and Redis keys)"
	@echo "make clean-venv (remove .venv: the fix when it holds the other (CPU/CUDA) variant)"
	@echo "PY=python3      (any target: that interpreter and its packages, nothing installed)"
	@echo ""
	@$(PYTHON) -c "from harness.launch.options import preset_table; print(preset_table())"

# The knob checks run while make reads this file (REFUSAL below); as a goal of its own it says nothing.
check-bench-knobs:
	@:

# A venv holds one variant: pip would keep the other's torch (torch==2.13.0 accepts both builds),
# so a .venv made for the other variant (a CPU login node's, reused on a GPU node) is refused.
# (REFUSAL, above, refuses a .venv of the other variant before this rule is reached.)
$(STAMP): requirements.txt $(TORCH_REQS) requirements-torchrec.txt requirements-torchrec-deps.txt constraints.txt
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
	$(PY) -m harness report $(if $(ABLATION),--ablation $(ABLATION),$(if $(NSYS),--nsys $(NSYS),--run $(RUN))) \
	  $(if $(filter 1,$(ALL_RANKS)),--all-ranks)

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
	$(PY) -m pytest -n $(TEST_WORKERS)

# Tests too slow for make test (pytest -m slow): the projection's CPU calibration on runs made now
# (make test reads a recorded set).
test-slow: $(DEPS) $(EXT)
	$(PY) -m pytest -m slow

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

# A projection (harness/projection/, docs/projection.md): the config on hardware it has not run on,
# calibrated on run folders (CALIBRATE=run,...; by default the recorded ones of tests/data/), marked
# projected. PYTHONHASHSEED=0: TorchRec's planner breaks ties by set order, so its plan (beside this
# planner's) would otherwise change from one process to the next.
project: check-bench-knobs $(DEPS)
	PYTHONHASHSEED=0 $(PY) -m harness.tools.project --preset $(or $(PRESET),mlperf) --nodes $(or $(NODES),16) \
	  --gpus-per-node $(or $(GPUS_PER_NODE),8) --hardware $(or $(HARDWARE),h100) \
	  $(if $(CALIBRATE),--calibrate $(CALIBRATE)) $(OPTS)

# Planning only: the harness's sharding plan of the mlperf tables against TorchRec's planner.
plan-compare: $(DEPS)
	PYTHONHASHSEED=0 $(PY) -m harness.tools.plan_compare $(if $(LAYOUTS),--layouts $(LAYOUTS))

# OUT is checked before anything is installed.
dataset: check-bench-knobs check-dataset-out $(DEPS)
	$(PY) -m harness.tools.make_dataset --out $(OUT) $(if $(ROWS),--rows $(ROWS)) $(if $(DAYS),--days $(DAYS)) \
	  $(if $(PRESET),--preset $(PRESET)) $(if $(SEED),--seed $(SEED))

# Checked with the knobs, while make reads this file (REFUSAL).
check-mlperf-data check-dataset-out:
	@:

mlperf: check-bench-knobs check-mlperf-data $(DEPS) $(EXT)
	$(PY) -m harness.tools.mlperf --data $(DATA) $(if $(TARGET_AUC),--target-auc $(TARGET_AUC)) $(KNOB_ARGS) \
	  $(if $(ENGINE),--engine $(ENGINE)) $(if $(RUN_ID),--run-id $(RUN_ID)) $(OPTS)

data-perf: check-bench-knobs $(DEPS)
	$(PY) -m harness.tools.data_perf $(if $(DATA),--data $(DATA)) $(if $(PRESET),--preset $(PRESET)) \
	  $(if $(RUN),--against-run $(RUN))

# What old runs left in their parameter stores (failed runs keep their spill files and Redis keys).
clean-runs: $(DEPS)
	$(PY) -m harness.tools.clean_runs --runs-root runs $(if $(PS),--ps '$(PS)')

clean-venv:
	rm -rf $(VENV)
