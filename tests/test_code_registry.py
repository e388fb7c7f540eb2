"""`keras_ecoc.codes.make_codes`: code matrices by name, and the layering
that keeps the library free of the research application."""

import os

import numpy as np
import pytest

from keras_ecoc import codes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _unit_rows_times_sqrt_k(m):
    m = np.asarray(m, np.float64)
    return m / np.linalg.norm(m, axis=1, keepdims=True) * np.sqrt(m.shape[1])


@pytest.mark.parametrize("name", ["gaussian", "dense_random", "gaussian_zero",
                                  "gaussian_median", "hadamard"])
def test_make_codes_matches_generator_with_rows_at_norm_sqrt_k(name):
    n, k, seed = 12, 8, 3
    family = {"gaussian_zero": "gaussian", "gaussian_median": "gaussian"}.get(name, name)
    if family == "hadamard":
        raw = codes.hadamard(n, k)
    else:
        raw = getattr(codes, family)(n, k, seed=seed)
    if name.endswith("_zero"):
        raw = codes.binarize(raw, "zero")
    elif name.endswith("_median"):
        raw = codes.binarize(raw, "median")
    got = codes.make_codes(name, n, k, seed=seed)
    assert got.shape == (n, k) and got.dtype == np.float32
    np.testing.assert_allclose(got, _unit_rows_times_sqrt_k(raw), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(codes.make_codes(name, n, k, seed=seed, normalize_rows=False),
                               np.asarray(raw, np.float64), rtol=1e-6)


@pytest.mark.parametrize("name", ["spectral", "spectral_zero", "spectral_median"])
def test_make_codes_spectral_uses_the_given_similarity(name):
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(60, 5))
    sim = codes.class_similarity(feats, np.repeat(np.arange(10), 6), num_classes=10)
    threshold = {"spectral": None, "spectral_zero": "zero", "spectral_median": "median"}[name]
    raw = np.asarray(codes.spectral(sim, 4, threshold=threshold), np.float64)
    got = codes.make_codes(name, 10, 4, similarity=sim)
    np.testing.assert_allclose(got, _unit_rows_times_sqrt_k(raw), rtol=1e-5, atol=1e-6)


def test_make_codes_lists_every_name_but_one_hot():
    assert set(codes.CODE_NAMES) == set(codes.registry.ENCODINGS) - {"one_hot"}


def test_make_codes_rejects_a_similarity_of_another_number_of_classes():
    # It returned a (6, k) matrix for num_classes=7 before.
    sim = np.eye(6) + 0.1
    with pytest.raises(ValueError, match=r"\(7, 7\).*Received: similarity with shape \(6, 6\)"):
        codes.make_codes("spectral", 7, 3, similarity=sim)
    assert codes.make_codes("spectral", 6, 3, similarity=sim.tolist()).shape == (6, 3)


def test_thresholded_gaussian_codes_warn_when_classes_share_a_codeword():
    # As spectral(threshold=...) does: seed 0 gives rows 1 and 2 the same bits.
    with pytest.warns(UserWarning, match="identical codewords to 1 pairs"):
        got = codes.make_codes("gaussian_median", 6, 3, seed=0)
    np.testing.assert_array_equal(got[1], got[2])


def test_make_codes_rejects_unknown_name_and_missing_similarity():
    with pytest.raises(ValueError, match=r"`encoding`.*Received: encoding='one_hot'"):
        codes.make_codes("one_hot", 4, 2)
    with pytest.raises(ValueError, match=r"Received: encoding='nope'"):
        codes.make_codes("nope", 4, 2)
    with pytest.raises(ValueError, match="Received: similarity=None"):
        codes.make_codes("spectral", 4, 2)


def test_research_training_reexports_the_library_registry():
    from ecoc_research import training

    assert training.make_codes is codes.make_codes


def test_library_never_imports_the_research_application():
    import ast

    offenders = []
    for folder, _, files in os.walk(os.path.join(ROOT, "keras_ecoc")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                           else [node.module or ""] if isinstance(node, ast.ImportFrom)
                           else [])
                if any(m.split(".")[0] == "ecoc_research" for m in modules):
                    offenders.append(os.path.relpath(path, ROOT))
    assert offenders == []
