# Two entry points, both working on a fresh machine with only python3 and a
# C++ compiler (nvcc optional): `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TF_PIN := tensorflow-cpu==2.21.0

.PHONY: demo test test-tensorflow test-jax test-torch test-notebooks install

# TensorFlow goes in first: the op library is compiled against the installed
# TensorFlow, so the package builds with --no-build-isolation (which also
# needs setuptools in the venv: Python >= 3.12's venv has none).
$(BIN)/.installed: setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "setuptools>=64" wheel "$(TF_PIN)"
	$(BIN)/pip install -q --disable-pip-version-check --no-build-isolation -e ".[cpu]"
	touch $@

$(BIN)/.installed-test: $(BIN)/.installed
	$(BIN)/pip install -q --disable-pip-version-check --no-build-isolation -e ".[cpu,test]"
	touch $@

install: $(BIN)/.installed

# The main job: one-hot vs Gaussian vs data-based codes on embedded Omniglot.
# kernels/build.py first: it rebuilds the kernel library (_ecoc_kernels.so, used
# by every backend) and the TensorFlow op library when the sources, the
# TensorFlow, g++ or nvcc changed since the install, and does nothing otherwise.
demo: $(BIN)/.installed
	$(BIN)/python kernels/build.py --quiet
	$(BIN)/keras-ecoc-demo

# The whole suite: TensorFlow (with the fused op, which must build and load),
# then JAX and PyTorch (fused kernels from _ecoc_kernels.so, streaming and dense
# paths), then the notebooks.
test: $(BIN)/.installed-test
	$(BIN)/python kernels/build.py --quiet
	$(MAKE) --no-print-directory test-tensorflow test-jax test-torch test-notebooks

test-tensorflow:
	KERAS_BACKEND=tensorflow KERAS_ECOC_REQUIRE_FUSED=1 $(BIN)/python -m pytest tests -q -p no:cacheprovider

test-jax:
	KERAS_BACKEND=jax $(BIN)/python -m pytest tests -q -p no:cacheprovider

test-torch:
	KERAS_BACKEND=torch $(BIN)/python -m pytest tests -q -p no:cacheprovider

test-notebooks:
	KERAS_BACKEND=tensorflow KERAS_ECOC_NOTEBOOK_MODE=smoke $(BIN)/python -m pytest --nbmake notebooks -q -p no:cacheprovider
