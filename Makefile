# The two commands a newcomer needs:
#   make demo   set up .venv and run the node on the embedded demo checkpoint (image + prompt)
#   make test   set up .venv and run lint + the test suite (what CI runs)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
REQS := requirements/runtime.txt requirements/ros.txt requirements/test.txt requirements/cpu-test.txt requirements/cpu-constraints.txt
STAMP := $(VENV)/.installed
# ROS 2 wheels find their message packages through ament_index.
export AMENT_PREFIX_PATH := $(CURDIR)/$(VENV)

.PHONY: venv demo test lint clean

venv: $(STAMP)

# Re-run pip only when a requirements file or setup.py changed (quick when already set up).
$(STAMP): $(REQS) setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check \
		-c requirements/cpu-constraints.txt torch==2.13.0 \
		-r requirements/runtime.txt -r requirements/ros.txt -r requirements/test.txt \
		-r requirements/cpu-test.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: venv
	$(PY) -m orin_llm_node.ros.demo

lint: venv
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
