# inferops.snapshot -- developer and CI entry points. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BUILD := build
COLLECTIONS := $(BUILD)/collections
COLLECTION_LINK := $(COLLECTIONS)/ansible_collections/inferops/snapshot
SIMULATOR := $(BUILD)/simulator/libascendcl.so
# make test's pytest workers: 2 fits the 2-core CI machine (more only adds load to timing-bound tests)
PYTEST_WORKERS ?= 2
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/$(COLLECTIONS)
export INFEROPS_ACL_LIBRARY ?= $(CURDIR)/$(SIMULATOR)

.PHONY: help venv simulator criu-plugin collection schemas env image demo test checks unit integration sanity build-collection bench clean

help:
	@echo "make demo        generate -> break -> restore on this machine (simulated NPU)"
	@echo "make test        the whole test suite (what CI runs)"
	@echo "make env         install and start dockerd + CRIU and build the base image (root)"
	@echo "make unit | integration | sanity | lint | docs-lint | versions | molecule | build-collection | ee"
	@echo "make bench       cold start vs restore, verify and checkpoint speed (root, ~40 min; BENCH_ARGS=--quick: ~2 min)"

# The lists in requirements/ say what is needed where; constraints.txt pins every version.
REQUIREMENTS := $(addprefix requirements/,runtime.txt target.txt test.txt bench.txt constraints.txt)

$(BIN)/python: $(REQUIREMENTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements/constraints.txt $(addprefix -r requirements/,runtime.txt target.txt test.txt bench.txt)
	touch $(BIN)/python

venv: $(BIN)/python

simulator:
	bash tests/simulator/build.sh $(BUILD)/simulator

# The CRIU NPU plugin (roles/snapshot_prereqs/files/npu-plugin); `make env` builds and installs it into /usr/lib/criu.
criu-plugin:
	bash roles/snapshot_prereqs/files/npu-plugin/build.sh $(BUILD)/criu-plugin/inferops_npu_plugin.so

# Ansible finds the collection through a link named the way it expects.
collection:
	@mkdir -p $(dir $(COLLECTION_LINK))
	@ln -sfn $(CURDIR) $(COLLECTION_LINK)

schemas:
	$(PYTHON) scripts/gen_schemas.py

env:
	bash scripts/env/setup.sh

image: simulator
	bash scripts/build-workload-image.sh

demo: venv simulator collection env image
	$(BIN)/ansible-playbook playbooks/demo.yml

unit: venv simulator collection
	$(BIN)/python -m pytest tests/unit tests/simulator -q

integration: venv simulator collection
	$(BIN)/python -m pytest tests/integration -q

sanity: venv
	bash scripts/sanity.sh

# One tarball in build/dist, this checkout's version (the docs install build/dist/inferops-snapshot-*.tar.gz).
build-collection: venv
	@rm -f $(BUILD)/dist/inferops-snapshot-*.tar.gz
	$(BIN)/ansible-galaxy collection build --force --output-path $(BUILD)/dist .

# The README's test command: everything CI runs. pytest mostly waits (warmups, leases, engines starting:
# a load of about 1 on 2 cores), so it runs on PYTEST_WORKERS workers (pytest-xdist, one test file per
# worker at a time), and the checks that touch nothing of the node's (sanity, lint, versions, docs-lint) run beside
# it, at a lower priority, into build/checks.log. The molecule scenarios run after pytest, into build/molecule.log:
# they register the restore-on-create runtime in dockerd's daemon.json, which pytest's tests rewrite under a lock of
# their own (tests/conftest.py node_wide), and beside them one CI run's restore scenario failed. Any part failing
# fails the target. pytest's failure summary is printed again last (its full output, with the 30 slowest steps, is in
# build/pytest.log), and so are the checks' and scenarios' failed tasks (a scenario's fatal line is hundreds of lines
# above its recap): a CI log's tail should name what failed.
test: venv simulator collection image
	@rm -f $(BUILD)/checks.rc
	@( nice -n 10 $(MAKE) --no-print-directory checks-beside > $(BUILD)/checks.log 2>&1; echo $$? > $(BUILD)/checks.rc ) & \
	set -o pipefail; $(BIN)/python -m pytest tests -q -rfEs --durations=30 -n $(PYTEST_WORKERS) --dist loadfile 2>&1 | tee $(BUILD)/pytest.log; pytest_rc=$$?; wait; \
	echo "==== beside pytest: sanity, lint, ansible-core versions, docs-lint ($(BUILD)/checks.log) ===="; \
	cat $(BUILD)/checks.log; checks_rc=$$(cat $(BUILD)/checks.rc 2>/dev/null || echo 1); \
	echo "==== after pytest: the molecule scenarios ($(BUILD)/molecule.log) ===="; \
	$(MAKE) --no-print-directory molecule 2>&1 | tee $(BUILD)/molecule.log; molecule_rc=$$?; \
	echo "==== pytest's summary again ($(BUILD)/pytest.log), so that the end of the output names what failed ===="; \
	grep -q 'short test summary info' $(BUILD)/pytest.log && sed -n '/short test summary info/,$$p' $(BUILD)/pytest.log \
	    || tail -n 1 $(BUILD)/pytest.log; \
	[ "$$checks_rc" = 0 ] && [ "$$molecule_rc" = 0 ] || { echo "==== the checks' and scenarios' failed tasks and errors again ===="; \
	    cat $(BUILD)/checks.log $(BUILD)/molecule.log | grep -a -E 'fatal: \[|FAILED! =>|failed: \[|^ERROR|ERROR: |Error: ' \
	    | cut -c1-1500 | tail -n 20; }; \
	echo "pytest: exit $$pytest_rc; sanity, lint, versions, docs-lint: exit $$checks_rc; molecule: exit $$molecule_rc"; \
	[ "$$pytest_rc" = 0 ] && [ "$$checks_rc" = 0 ] && [ "$$molecule_rc" = 0 ]

# What make test runs beside pytest, one after another; each runs even when one before it failed (a CI run
# should show every failure, not the first), and the target fails naming those that did. `make checks` adds the
# molecule scenarios, which make test runs after pytest.
.PHONY: checks-beside checks
checks-beside: venv simulator collection image
	@failed=""; \
	bash scripts/sanity.sh || failed="$$failed sanity"; \
	$(MAKE) --no-print-directory lint || failed="$$failed lint"; \
	$(MAKE) --no-print-directory versions || failed="$$failed versions"; \
	$(MAKE) --no-print-directory docs-lint || failed="$$failed docs-lint"; \
	if [ -n "$$failed" ]; then echo "checks FAILED:$$failed"; exit 1; fi

checks: checks-beside
	$(MAKE) --no-print-directory molecule

# The docs as a docsite renders them: antsibull-docs lint-collection-docs (modules, plugins, roles, docs/docsite/),
# in its own venv build/antsibull-docs (requirements/docs.txt).
.PHONY: docs-lint
docs-lint: venv collection
	bash scripts/docs-lint.sh

# ansible-lint, production profile (.ansible-lint): nothing installed, the collection from this checkout.
.PHONY: lint
lint: venv collection
	$(BIN)/ansible-lint --nocolor

# The older ansible-core minors requires_ansible claims: sanity and the unit tests in a venv per version
# (cached under build/); tests/integration/test_ansible_versions.py runs the playbooks with them.
.PHONY: versions
versions: venv simulator collection
	bash scripts/ansible-versions.sh test

# The development scenarios shipped in extensions/molecule (delegated driver: this machine's dockerd;
# no Galaxy: dependencies come from this checkout). Run from the collection root, as molecule expects.
# The operator scenario needs an inventory: tests/integration/test_molecule_operator.py runs it.
MOLECULE_SCENARIOS := default generate restore failure
.PHONY: molecule
molecule: venv simulator collection image
	for scenario in $(MOLECULE_SCENARIOS); do \
	    PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/molecule test -s $$scenario || exit 1; \
	done

# Not part of the test suite: results/<stamp>/{bench.json,results.md,chart.png}; see docs/benchmarks.md.
bench: venv simulator collection env
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(BUILD)

# The execution environment's build context for an AWX without internet (execution-environment.yml, docs/awx.md):
# the collection built from this checkout and kubernetes.core as tarballs, the wheelhouse of every Python package
# the image build installs (the one step that needs a package index; cached), then `ansible-builder create`.
# The build itself needs no network: `podman build --network none --build-arg EE_BASE_IMAGE=... build/ee/context`.
.PHONY: ee
ee: build-collection
	bash scripts/ee-context.sh
