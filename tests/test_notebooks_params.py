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
                "INSTALL_FROM"):
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


def install_cell(notebook):
    cells = [source(c) for c in notebook["cells"]
             if c["cell_type"] == "code" and '"pip", "install"' in source(c)]
    assert len(cells) == 1, "exactly one cell installs the package"
    return cells[0]


@pytest.mark.parametrize("name", NAMES)
def test_no_cell_installs_anything_by_default(name, monkeypatch):
    # The user sets INSTALL_FROM; by default it is empty.
    assert parameters(name, "colab", monkeypatch)["INSTALL_FROM"] == ""
    for cell in load(name)["cells"]:
        if cell["cell_type"] == "code":
            assert "!pip" not in source(cell) and "%pip" not in source(cell)


def run_install_cell(name, tmp_path, monkeypatch, install_from, in_colab, installed):
    """Executes the install cell with pip, the package and Colab faked."""
    import importlib.util
    import subprocess
    import sys

    calls = []
    real_run = subprocess.run

    def fake_run(args, *rest, **kwargs):
        if "pip" not in args:  # other users of subprocess (e.g. imports)
            return real_run(args, *rest, **kwargs)
        calls.append(list(args))
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda module, *a: (object() if installed else None)
        if module in ("keras_ecoc", "ecoc_research")
        else real_find_spec(module, *a))
    if in_colab:
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    else:
        monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.chdir(tmp_path / "notebooks")  # not inside a checkout
    monkeypatch.setattr(sys, "path", list(sys.path))
    namespace = {"INSTALL_FROM": install_from, "os": os}
    try:
        exec(compile(install_cell(load(name)), name, "exec"), namespace)  # noqa: S102
    except ImportError as error:
        return calls, error
    return calls, None


@pytest.mark.parametrize("name", NAMES)
def test_install_only_inside_colab_from_the_users_parameter(name, tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    source_url = "git+https://example.org/me/keras-ecoc"
    # Outside Colab: never, even with INSTALL_FROM set; a clear error instead.
    calls, error = run_install_cell(name, tmp_path, monkeypatch, source_url, False, False)
    assert calls == [] and "INSTALL_FROM" in str(error)
    # Inside Colab without INSTALL_FROM: nothing to install from, an error.
    calls, error = run_install_cell(name, tmp_path, monkeypatch, "", True, False)
    assert calls == [] and error is not None
    # Inside Colab with INSTALL_FROM: pip installs exactly that.
    calls, _ = run_install_cell(name, tmp_path, monkeypatch, source_url, True, False)
    assert len(calls) == 1 and calls[0][1:4] == ["-m", "pip", "install"]
    assert f"keras-ecoc @ {source_url}" in calls[0]


@pytest.mark.parametrize("name", NAMES)
def test_never_installs_over_an_installed_package(name, tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    calls, error = run_install_cell(
        name, tmp_path, monkeypatch, "git+https://example.org/me/keras-ecoc", True, True)
    assert calls == [] and error is None


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


@pytest.mark.parametrize("name", NAMES)
def test_colab_runs_go_to_a_folder_the_user_names(name, monkeypatch):
    # A fixed, user-editable folder (Drive on Colab), so a rerun resumes;
    # the local and smoke runs use a new temporary folder (None).
    assert isinstance(parameters(name, "colab", monkeypatch)["OUTPUT_DIR"], str)
    for mode in ("local", "smoke"):
        assert parameters(name, mode, monkeypatch)["OUTPUT_DIR"] is None


def test_cub_notebook_chooses_on_validation_and_scores_test_once():
    code = "\n".join(source(c) for c in load("cub200_finetune.ipynb")["cells"]
                     if c["cell_type"] == "code")
    assert "protocols.validation_split(y_train, VAL_PER_CLASS" in code
    # The curves (and so the "best on validation" choice) never see x_test.
    assert "StepEvaluation(x_val, y_val" in code
    assert "StepEvaluation(x_test" not in code
    assert "saved_runs.open_folder(OUTPUT_DIR, SETTINGS, overwrite=OVERWRITE)" in code
