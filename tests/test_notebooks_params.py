"""Structure of the Colab notebooks, without running a kernel.

`pytest --nbmake notebooks` executes them (smoke mode); these checks are fast
and backend-independent: the parameters cell and its three modes, the Colab
badge, the guarded install, and the committed outputs of the local run.
"""

import json
import os
import re

import pytest

NOTEBOOKS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks"
)
NAMES = ("cub200_finetune.ipynb", "cifar100_codes.ipynb")
MODES = ("colab", "local", "smoke")


def load(name):
    path = os.path.join(NOTEBOOKS, name)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def source(cell):
    text = cell["source"]
    return text if isinstance(text, str) else "".join(text)


def parameters_cell(notebook):
    cells = [c for c in notebook["cells"]
             if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, "exactly one cell tagged 'parameters'"
    return source(cells[0])


def parameters(name, mode, monkeypatch):
    if mode is None:
        monkeypatch.delenv("KERAS_ECOC_NOTEBOOK_MODE", raising=False)
    else:
        monkeypatch.setenv("KERAS_ECOC_NOTEBOOK_MODE", mode)
    namespace = {}
    exec(compile(parameters_cell(load(name)), name, "exec"), namespace)  # noqa: S102
    return namespace


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_parameters_cell_defines_the_knobs(name, mode, monkeypatch):
    p = parameters(name, mode, monkeypatch)
    assert p["MODE"] == mode
    for key in ("DATASET", "IMAGE_SIZE", "TRAIN_PER_CLASS", "PRETRAINED",
                "REPO_URL"):
        assert key in p, key
    assert any(k.endswith("EPOCHS") for k in p)
    if mode == "colab":
        assert not p["DATASET"].endswith(".npz")  # tensorflow-datasets
    if mode == "local":
        assert p["DATASET"].startswith("../shared/data/")
        assert not p["PRETRAINED"]
    if mode == "smoke":
        assert not p["PRETRAINED"] and p["MOCK_EXAMPLES"] > 0


def test_cub_defaults_are_the_pretrained_colab_run(monkeypatch):
    p = parameters("cub200_finetune.ipynb", "colab", monkeypatch)
    assert p["DATASET"] == "caltech_birds2011" and p["PRETRAINED"]
    assert p["BATCH_SIZE"] <= 32 and len(p["CODE_LENGTHS"]) >= 2


@pytest.mark.parametrize("name", NAMES)
def test_unset_mode_is_colab_for_users_and_smoke_under_pytest(name, monkeypatch):
    # nbmake's kernel inherits PYTEST_CURRENT_TEST from the pytest process.
    assert parameters(name, None, monkeypatch)["MODE"] == "smoke"
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    assert parameters(name, None, monkeypatch)["MODE"] == "colab"


@pytest.mark.parametrize("name", NAMES)
def test_unknown_mode_is_rejected(name, monkeypatch):
    with pytest.raises(ValueError, match="KERAS_ECOC_NOTEBOOK_MODE"):
        parameters(name, "gpu", monkeypatch)


@pytest.mark.parametrize("name", NAMES)
def test_badge_points_at_this_notebook(name):
    first = source(load(name)["cells"][0])
    assert "colab-badge.svg" in first
    assert re.search(r"colab\.research\.google\.com/github/[^)]+/blob/main/notebooks/"
                     + re.escape(name), first)


@pytest.mark.parametrize("name", NAMES)
def test_pip_install_only_in_colab_mode(name):
    for cell in load(name)["cells"]:
        text = source(cell)
        if cell["cell_type"] == "code" and "pip install" in text:
            guarded = text.split("pip install")[0]
            assert 'if MODE == "colab":' in guarded


@pytest.mark.parametrize("name", NAMES)
def test_committed_outputs_of_the_local_run(name):
    path = os.path.join(NOTEBOOKS, name)
    assert os.path.getsize(path) < 1.5e6
    code = [c for c in load(name)["cells"] if c["cell_type"] == "code"]
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    text = "".join("".join(o.get("text", "")) for o in outputs)
    assert "mode=local" in text
