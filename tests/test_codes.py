"""Tests of the code generators, `validate_codes`, `normalize_rows` and
`report` in `keras_ecoc.codes`.

References are computed independently: Hadamard codes against
`scipy.linalg.hadamard`, column and row rules by explicit loops, distances by
`scipy.spatial.distance.pdist`.
"""

import itertools
import json

import numpy as np
import pytest
import scipy.linalg
import scipy.spatial.distance

from keras_ecoc import codes


def _column_rule_violations(m):
    """Pairs (j, l) of identical or complementary columns, by loops."""
    bad = []
    for j, l in itertools.combinations(range(m.shape[1]), 2):
        if np.array_equal(m[:, j], m[:, l]) or np.array_equal(m[:, j], -m[:, l]):
            bad.append((j, l))
    return bad


def _duplicate_rows(m):
    return [
        (i, j)
        for i, j in itertools.combinations(range(len(m)), 2)
        if np.array_equal(m[i], m[j])
    ]


def _min_hamming(m):
    return min(
        int((m[i] != m[j]).sum())
        for i, j in itertools.combinations(range(len(m)), 2)
    )


def _min_allwein(m):
    return min(
        float(np.sum(1 - m[i] * m[j]) / 2)
        for i, j in itertools.combinations(range(len(m)), 2)
    )


# one_hot


def test_one_hot_is_the_float32_identity():
    out = codes.one_hot(7)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.eye(7))


@pytest.mark.parametrize("bad", [0, -3])
def test_one_hot_rejects_non_positive_num_classes(bad):
    with pytest.raises(ValueError, match="num_classes"):
        codes.one_hot(bad)


@pytest.mark.parametrize("bad", [2.0, "3", True])
def test_one_hot_rejects_non_integer_num_classes(bad):
    with pytest.raises(TypeError, match="num_classes"):
        codes.one_hot(bad)


# gaussian


def test_gaussian_shape_dtype_and_standard_normal_moments():
    out = codes.gaussian(300, 200, seed=3)
    assert out.shape == (300, 200) and out.dtype == np.float32
    # 60,000 draws: the standard errors of the mean and variance are about
    # 0.004 and 0.006.
    assert abs(out.mean()) < 0.02
    assert abs(out.var() - 1.0) < 0.03


def test_gaussian_is_deterministic_for_a_seed_and_varies_across_seeds():
    np.testing.assert_array_equal(
        codes.gaussian(10, 5, seed=11), codes.gaussian(10, 5, seed=11)
    )
    assert not np.array_equal(
        codes.gaussian(10, 5, seed=11), codes.gaussian(10, 5, seed=12)
    )
    # seed=None draws fresh randomness.
    assert not np.array_equal(codes.gaussian(10, 5), codes.gaussian(10, 5))


def test_gaussian_accepts_a_generator_as_seed():
    first = codes.gaussian(4, 3, seed=np.random.default_rng(5))
    np.testing.assert_array_equal(first, codes.gaussian(4, 3, seed=5))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_classes": 0, "code_length": 3}, "num_classes"),
        ({"num_classes": 3, "code_length": 0}, "code_length"),
        ({"num_classes": 3, "code_length": 2, "seed": -1}, "seed"),
    ],
)
def test_gaussian_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        codes.gaussian(**kwargs)


def test_gaussian_rejects_a_non_integer_seed():
    with pytest.raises(TypeError, match="seed"):
        codes.gaussian(3, 2, seed="0")


# hadamard


@pytest.mark.parametrize(
    "num_classes, code_length", [(1, 1), (2, 1), (8, 7), (5, 7), (10, 12), (16, 8)]
)
def test_hadamard_matches_scipy_sylvester_rows_and_columns_1_to_k(
    num_classes, code_length
):
    order = 1
    while order < max(num_classes, code_length + 1):
        order *= 2
    expected = scipy.linalg.hadamard(order)[:num_classes, 1 : code_length + 1]
    out = codes.hadamard(num_classes, code_length)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


def test_hadamard_full_order_is_balanced_orthogonal_and_equidistant():
    out = codes.hadamard(16, 15).astype(np.float64)
    # Columns 1..15 of a Hadamard matrix: balanced and orthogonal.
    np.testing.assert_array_equal(out.sum(axis=0), 0)
    np.testing.assert_array_equal(out.T @ out, 16 * np.eye(15))
    # With the all-ones column restored the rows are orthogonal...
    full = np.hstack([np.ones((16, 1)), out])
    np.testing.assert_array_equal(full @ full.T, 16 * np.eye(16))
    # ...so every pair of codewords is at Hamming distance 8.
    hamming = scipy.spatial.distance.pdist(out, "hamming") * 15
    np.testing.assert_array_equal(hamming, 8)


def test_hadamard_accepts_exactly_the_shapes_with_distinct_rows():
    for code_length in range(1, 17):
        reference = scipy.linalg.hadamard(64)[:, 1 : code_length + 1]
        for num_classes in range(1, 40):
            rows = reference[:num_classes]
            distinct = len({tuple(row) for row in rows}) == num_classes
            if distinct:
                out = codes.hadamard(num_classes, code_length)
                assert len({tuple(row) for row in out}) == num_classes
            else:
                with pytest.raises(ValueError, match="num_classes"):
                    codes.hadamard(num_classes, code_length)


# dense_random


def _check_dense_rules(m):
    assert m.dtype == np.float32
    assert set(np.unique(m)) <= {-1.0, 1.0}
    assert (np.abs(m.sum(axis=0)) < len(m)).all(), "constant column"
    assert not _column_rule_violations(m)
    assert not _duplicate_rows(m)


@pytest.mark.parametrize(
    "num_classes, code_length", [(2, 1), (5, 7), (12, 10), (40, 12)]
)
def test_dense_random_satisfies_the_column_and_row_rules(num_classes, code_length):
    m = codes.dense_random(num_classes, code_length, seed=0, trials=200)
    assert m.shape == (num_classes, code_length)
    _check_dense_rules(m)


def test_row_scores_in_blocks_match_a_float64_pairwise_reference():
    # Many classes score candidates in row blocks (no (n, n) matrix); every
    # block size must give the scores of the plain pairwise computation.
    from keras_ecoc.codes.random_codes import _row_statistics

    rng = np.random.default_rng(3)
    m = rng.integers(-1, 2, size=(4, 57, 9)).astype(np.float32)
    m[1, 40] = m[1, 3]  # two classes share a codeword
    m[2, 11] = 0.0  # an all-zero codeword
    for block_rows in (None, 1, 5, 57):
        ok, min_d, mean_d = _row_statistics(m, 9, block_rows=block_rows)
        for c in range(4):
            r = m[c].astype(np.float64)
            d = (9 - r @ r.T) / 2
            pairs = ~np.eye(57, dtype=bool)
            identical = (scipy.spatial.distance.squareform(
                scipy.spatial.distance.pdist(r)) == 0)[pairs].any()
            assert ok[c] == (not identical and (np.abs(r).sum(1) > 0).all())
            assert min_d[c] == d[pairs].min()
            assert mean_d[c] == d[pairs].mean()


def test_dense_random_for_many_classes_keeps_the_rules():
    # Above 2,048 classes the rows are scored in blocks.
    m = codes.dense_random(2100, 32, seed=0, trials=2)
    assert m.shape == (2100, 32) and set(np.unique(m)) == {-1.0, 1.0}
    assert len(np.unique(m, axis=0)) == 2100
    assert (np.abs(m.sum(0)) < 2100).all()


def test_dense_random_uses_every_admissible_column_when_it_must():
    # 4 classes have exactly 2**3 - 1 = 7 admissible columns up to sign;
    # naive rejection would almost always fail here.
    m = codes.dense_random(4, 7, seed=1)
    _check_dense_rules(m)
    # All 7 columns of a 4-class code: every pair of rows differs in 4.
    hamming = scipy.spatial.distance.pdist(m, "hamming") * 7
    np.testing.assert_array_equal(hamming, 4)


def test_dense_random_is_deterministic_for_a_seed_and_varies_across_seeds():
    for n in (6, 30):  # enumeration and rejection paths
        a = codes.dense_random(n, 9, seed=4, trials=50)
        np.testing.assert_array_equal(a, codes.dense_random(n, 9, seed=4, trials=50))
        assert not np.array_equal(a, codes.dense_random(n, 9, seed=5, trials=50))


@pytest.mark.parametrize("num_classes", [10, 24])
def test_dense_random_beats_single_random_draws_in_min_hamming_distance(num_classes):
    rng = np.random.default_rng(num_classes)
    single = [
        _min_hamming(rng.choice([-1.0, 1.0], size=(num_classes, 10)))
        for _ in range(40)
    ]
    best = _min_hamming(codes.dense_random(num_classes, 10, seed=99, trials=1000))
    assert best >= max(single)
    assert best > np.median(single)


def test_dense_random_rejects_impossible_shapes():
    with pytest.raises(ValueError, match="num_classes"):
        codes.dense_random(1, 3)
    with pytest.raises(ValueError, match="code_length"):
        codes.dense_random(3, 4)  # only 2**2 - 1 = 3 admissible columns
    with pytest.raises(ValueError, match="num_classes"):
        codes.dense_random(9, 3)  # 9 classes > 2**3 codewords
    with pytest.raises(ValueError, match="trials"):
        codes.dense_random(5, 3, trials=0)


def test_dense_random_says_when_no_candidate_is_admissible():
    # 2000 random columns over 17 classes: some pair is identical or
    # complementary in every draw (a birthday collision among 2**16 kinds).
    with pytest.raises(ValueError, match="trials=2"):
        codes.dense_random(17, 2000, seed=0, trials=2)


# sparse_random


def _check_sparse_rules(m):
    assert m.dtype == np.float32
    assert set(np.unique(m)) <= {-1.0, 0.0, 1.0}
    assert ((m == 1).any(axis=0) & (m == -1).any(axis=0)).all()
    assert not _column_rule_violations(m)
    assert not _duplicate_rows(m)
    assert (np.abs(m).sum(axis=1) > 0).all(), "all-zero codeword"


@pytest.mark.parametrize(
    "num_classes, code_length", [(2, 1), (6, 5), (15, 12), (30, 20)]
)
def test_sparse_random_satisfies_the_column_and_row_rules(num_classes, code_length):
    m = codes.sparse_random(num_classes, code_length, seed=2, trials=300)
    assert m.shape == (num_classes, code_length)
    _check_sparse_rules(m)


def test_sparse_random_zero_probability_controls_the_zeros():
    dense = codes.sparse_random(20, 30, seed=0, trials=20, zero_probability=0.0)
    assert (dense != 0).all()
    half = codes.sparse_random(30, 40, seed=0, trials=20, zero_probability=0.5)
    assert 0.3 < (half == 0).mean() < 0.6


def test_sparse_random_beats_single_random_draws_in_min_allwein_distance():
    rng = np.random.default_rng(0)
    single = [
        _min_allwein(rng.choice([-1.0, 0.0, 0.0, 1.0], size=(12, 10)))
        for _ in range(40)
    ]
    best = _min_allwein(codes.sparse_random(12, 10, seed=7, trials=1000))
    assert best >= max(single)


def test_sparse_random_is_deterministic_for_a_seed_and_varies_across_seeds():
    a = codes.sparse_random(8, 6, seed=3, trials=30)
    np.testing.assert_array_equal(a, codes.sparse_random(8, 6, seed=3, trials=30))
    assert not np.array_equal(a, codes.sparse_random(8, 6, seed=4, trials=30))


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5])
def test_sparse_random_rejects_zero_probability_outside_0_1(bad):
    with pytest.raises(ValueError, match="zero_probability"):
        codes.sparse_random(5, 4, zero_probability=bad)


def test_sparse_random_rejects_a_non_numeric_zero_probability():
    with pytest.raises(TypeError, match="zero_probability"):
        codes.sparse_random(5, 4, zero_probability="0.5")


def test_sparse_random_rejects_impossible_shapes():
    with pytest.raises(ValueError, match="code_length"):
        codes.sparse_random(2, 2)  # one admissible column for 2 classes
    with pytest.raises(ValueError, match="num_classes"):
        codes.sparse_random(10, 2)  # 10 classes > 3**2 codewords
    with pytest.raises(ValueError, match="num_classes"):
        codes.sparse_random(1, 2)


# validate_codes


def test_validate_codes_returns_contiguous_float32():
    out = codes.validate_codes([[1, 0], [0, 1], [1, 1]])
    assert out.dtype == np.float32 and out.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(out, [[1, 0], [0, 1], [1, 1]])


def test_validate_codes_names_the_classes_with_identical_codewords():
    m = np.array([[1, 2], [3, 4], [1, 2], [5, 6], [3, 4]], dtype=np.float64)
    with pytest.raises(ValueError, match="cannot be told apart") as info:
        codes.validate_codes(m, name="my_codes")
    message = str(info.value)
    assert "my_codes" in message
    assert "classes 0 and 2, 1 and 4" in message


def test_validate_codes_treats_float32_identical_rows_as_duplicates():
    m = np.array([[1.0, 0.0], [1.0 + 1e-12, -0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="0 and 1"):
        codes.validate_codes(m)


@pytest.mark.parametrize(
    "bad", [np.ones(3), np.ones((2, 2, 2)), np.ones((0, 3)), np.ones((3, 0))]
)
def test_validate_codes_rejects_bad_shapes(bad):
    with pytest.raises(ValueError, match="codes"):
        codes.validate_codes(bad)


def test_validate_codes_rejects_nan_and_non_numeric():
    with pytest.raises(ValueError, match="finite"):
        codes.validate_codes([[1.0, np.nan], [0.0, 1.0]])
    with pytest.raises(TypeError, match="codes"):
        codes.validate_codes([["a", "b"]])


# normalize_rows


def test_normalize_rows_gives_equal_norms_and_keeps_directions():
    raw = codes.gaussian(20, 6, seed=0).astype(np.float64)
    out = codes.normalize_rows(raw)
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), np.sqrt(6), rtol=1e-6)
    cosine = np.sum(out * raw, axis=1) / (
        np.linalg.norm(out, axis=1) * np.linalg.norm(raw, axis=1)
    )
    np.testing.assert_allclose(cosine, 1.0, rtol=1e-6)
    np.testing.assert_allclose(
        np.linalg.norm(codes.normalize_rows(raw, norm=2.5), axis=1), 2.5, rtol=1e-6
    )


def test_normalize_rows_rejects_zero_rows_and_bad_norms():
    with pytest.raises(ValueError, match=r"codes.*\[1\]"):
        codes.normalize_rows([[1.0, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="norm"):
        codes.normalize_rows(np.eye(2), norm=0.0)


# report


def test_report_matches_brute_force_references():
    rng = np.random.default_rng(0)
    m = rng.integers(-1, 2, size=(40, 9)).astype(np.float64)
    m[7] = m[3]
    m[30] = m[3]
    m[:, 4] = 1.0  # a constant column
    out = codes.report(m)
    distances = scipy.spatial.distance.pdist(m)
    assert out["num_classes"] == 40 and out["code_length"] == 9
    assert out["min_distance"] == 0.0
    assert out["mean_distance"] == pytest.approx(distances.mean(), rel=1e-12)
    assert out["min_hamming_distance"] == 0
    assert out["duplicate_pairs"] == _duplicate_rows(m)
    assert out["num_duplicate_pairs"] == len(_duplicate_rows(m)) >= 3
    np.testing.assert_allclose(out["column_balance"], (m > 0).mean(axis=0))
    assert out["num_constant_columns"] == 1
    varying = np.delete(m, 4, axis=1)
    correlation = np.abs(np.corrcoef(varying, rowvar=False))
    np.fill_diagonal(correlation, 0)
    assert out["max_column_correlation"] == pytest.approx(correlation.max(), rel=1e-9)


def test_report_distances_of_real_codes_match_pdist():
    m = codes.gaussian(3000, 16, seed=1)
    out = codes.report(m)
    distances = scipy.spatial.distance.pdist(m.astype(np.float64))
    assert out["min_distance"] == pytest.approx(distances.min(), rel=1e-6)
    assert out["mean_distance"] == pytest.approx(distances.mean(), rel=1e-9)
    assert out["min_hamming_distance"] is None
    assert out["num_duplicate_pairs"] == 0


def test_report_min_hamming_distance_of_binary_codes():
    m = codes.dense_random(30, 12, seed=0, trials=100)
    assert codes.report(m)["min_hamming_distance"] == _min_hamming(m)
    assert codes.report(codes.one_hot(5))["min_hamming_distance"] == 2


def test_report_of_a_single_class_has_no_distances():
    out = codes.report([[1.0, -1.0]])
    assert out["min_distance"] is None and out["mean_distance"] is None
    assert out["max_column_correlation"] is None


def test_report_is_a_dict_with_readable_text_and_json_export():
    out = codes.report(codes.hadamard(8, 7))
    assert isinstance(out, dict) and isinstance(out, codes.CodeReport)
    text = str(out)
    assert "8 classes x 7 columns" in text and "duplicate row pairs:      none" in text
    exported = json.loads(json.dumps(out.to_dict()))
    assert exported["min_hamming_distance"] == 4
    assert exported["column_balance"] == [0.5] * 7


def test_report_rejects_non_finite_codes():
    with pytest.raises(ValueError, match="codes"):
        codes.report([[np.inf, 1.0]])
