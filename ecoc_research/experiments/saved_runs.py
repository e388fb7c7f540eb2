"""A results folder for runs saved one by one (the CUB notebook's runs).

A long session on a borrowed machine (Colab) can end at any time: every run
is written as soon as it finishes and read back, not trained again, when the
same folder is used with the same settings. Settings that differ from those
the folder was made with are refused unless the caller asks to replace the
runs, so a changed parameter never mixes old and new runs in one table.

Layout of a folder:
    settings.json        the settings every run in it shares
    runs/<name>.json     one finished run each
    runs/<name>.weights.h5   weights a run depends on (e.g. a warm-up)
"""

import json
import os
import shutil

from ecoc_research.experiments import common


def _canonical(settings):
    """`settings` as JSON reads it back (tuples become lists, keys sorted)."""
    try:
        return json.loads(json.dumps(settings, sort_keys=True))
    except TypeError as error:
        raise ValueError(
            "Argument `settings` must be a dict of JSON values (numbers, "
            f"strings, booleans, None, lists). Received: {settings!r}"
        ) from error


def open_folder(path, settings, overwrite=False):
    """Creates or reopens a results folder for runs made with `settings`.

    Args:
        path: the folder (created with its parents when missing).
        settings: dict of JSON values every run in the folder shares.
        overwrite: when the folder holds runs made with other settings,
            delete its `runs/` and start again instead of refusing.

    Returns:
        The runs folder, `<path>/runs`.

    Raises:
        ExistingResultsError: the folder holds runs made with other
            settings and `overwrite` is False; the message names the
            settings that differ.
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError("Argument `path` must be a folder name. "
                         f"Received: path={path!r}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"Argument `path` must be a folder. Received: "
                         f"path={str(path)!r} (a file)")
    settings = _canonical(settings)
    settings_path = os.path.join(path, "settings.json")
    runs = os.path.join(path, "runs")
    if os.path.exists(settings_path):
        with open(settings_path) as f:
            stored = json.load(f)
        changed = sorted(name for name in set(stored) | set(settings)
                         if stored.get(name) != settings.get(name))
        if changed and not overwrite:
            raise common.ExistingResultsError(
                f"{path} holds runs made with other settings (changed: "
                f"{', '.join(changed)}). Use another folder, or set "
                "overwrite (OVERWRITE = True in the notebook) to delete "
                "those runs and start again.")
        if changed:
            shutil.rmtree(runs, ignore_errors=True)
    os.makedirs(runs, exist_ok=True)
    _write_json(settings_path, settings)
    return runs


def load_run(runs, name):
    """The record saved as `name` in the runs folder, or None."""
    path = os.path.join(runs, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def save_run(runs, name, record):
    """Writes `record` (a dict of JSON values) as `name`, atomically: an
    interrupted write leaves the previous file or none, never half a one."""
    _write_json(os.path.join(runs, f"{name}.json"), record)


def weights_path(runs, name):
    """Where the weights `name` of the runs folder are (or go)."""
    return os.path.join(runs, f"{name}.weights.h5")


def _write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
