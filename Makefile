# `make test` is the test command of the README and of CI (.ci/run): it installs
# what the tests need, then runs every test. `make test-fast` runs the fast tier
# only (no process started, no whole job trained): what to run after every change.
#
# Tests run in parallel, a file per worker process (pytest-xdist; files that share
# a module fixture or a set of test hosts stay on one worker), and the 20 slowest
# are listed at the end, so what costs time stays visible. Files are handed out
# longest first, by the seconds tests/file_seconds.json records for each (see
# tests/conftest.py); `make test-durations` refreshes them after tests change.
PYTEST_DIST = --dist loadfile --no-loadscope-reorder
PYTEST_PARALLEL = -n auto $(PYTEST_DIST)
# The whole suite: one worker more than the CPUs. Its e2e tests wait on the processes
# they start (a cluster's start-up, its tasks' deadlines): with one worker per CPU, a
# quarter of the CPU time went unused (BENCHMARKS.md, "The test suite"). The fast tier
# waits on nothing: one worker per CPU.
PYTEST_ALL = -n $(shell expr $$(nproc) + 1) $(PYTEST_DIST)

.PHONY: test test-fast test-durations horovod soak

# The project's own modules compiled to bytecode once, before the tests: where
# PYTHONDONTWRITEBYTECODE is set (as on these machines) no process writes it, and each
# towers command the tests start (166 a run) compiled launch/'s modules from source again
# (`towers validate` of examples/mlp.yaml: 0.47 s of CPU more a process, median of 8
# pairs; BENCHMARKS.md, "The test suite"). Python reads bytecode whatever the setting,
# and compiles afresh any module edited since.
COMPILE = python -m compileall -q launch models towers tests examples

# horovod 0.28.1 must be built against this TensorFlow; the script caches the
# wheel (~/.cache/towers/wheels), so only the first build takes minutes.
horovod:
	bash docker/install-horovod.sh

# The metrics tests run promtool and a real Prometheus server, both from
# Debian's prometheus package; the docker tests validate the compose file with
# Debian's docker-compose, which needs no Docker engine for that; the network
# fault tests make their test hosts with `ip` from Debian's iproute2; the Slurm
# tests run a one-node cluster of Debian's slurm-wlm 22.05 (slurmctld, slurmd, the
# clients and munge; tests/helpers/slurm.py). apt-get needs root, as on CI and the
# dev machines.
test:
	pip install -e '.[cpu,test]'
	bash docker/install-horovod.sh
	command -v promtool >/dev/null && command -v prometheus >/dev/null && \
		command -v docker-compose >/dev/null && command -v ip >/dev/null && \
		command -v slurmctld >/dev/null && command -v slurmd >/dev/null && \
		command -v sbatch >/dev/null && command -v munged >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		  apt-get install -y -qq --no-install-recommends prometheus docker-compose \
		  iproute2 slurmctld slurmd slurm-client munge; }
	ruff check .
	$(COMPILE)
	python -m pytest $(PYTEST_ALL) --durations=20

test-fast:
	ruff check .
	$(COMPILE)
	python -m pytest -m "not e2e" $(PYTEST_PARALLEL) --durations=10

test-durations:
	python -m pytest $(PYTEST_ALL) -q --write-file-seconds

# The soak (tests/soak/, not part of `make test`): seeded random fault schedules against
# every arrangement (one process, synchronous ps/worker with and without backup
# workers, asynchronous, collective, Horovod), each job checked for what it must keep.
# SCHEDULES per arrangement, from FIRST_SEED; SEED=N ARRANGEMENT=NAME replays one
# schedule; HOG=0|1|2 sets the CPU hogs beside each (default: drawn); OUT keeps the
# summary (summary.jsonl) and the logs of failed schedules. Needs root (test hosts, a
# tmpfs to fill) and Horovod for its arrangement.
SCHEDULES ?= 1
FIRST_SEED ?= 0
OUT ?= /tmp/towers-soak
soak:
	PYTHONPATH=.:tests python -m soak --schedules $(SCHEDULES) --first-seed $(FIRST_SEED) \
		--out $(OUT) $(if $(SEED),--seed $(SEED)) $(if $(ARRANGEMENT),--arrangement $(ARRANGEMENT)) \
		$(if $(HOG),--hog $(HOG))
