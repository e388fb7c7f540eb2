"""Shared pieces of the experiments: data, codes, one training run, records.

All experiments train the same network (`ecoc_research.training.build_model`:
the cifar_quick-like CNN for <= 32 px images, the small CNN for 64 px birds,
Adam 1e-3, no dropout) and differ only in the output encoding, so every
comparison isolates the encoding.
"""

import dataclasses
import os
import platform
import time

import numpy as np

# Defaults of the data-based codes' class similarity: a one-hot network
# trained this many epochs on the training split only (offline, no
# pretrained weights), cosine similarity of its class-mean features.
SIMILARITY_EPOCHS = 3
SIMILARITY_BATCH_SIZE = 32
SIMILARITY_KERNEL = "cosine"

DATA_ENCODINGS = ("spectral", "spectral_zero", "spectral_median")


def is_integer(value):
    """An int (NumPy's too), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_real(value):
    """A finite int or float (NumPy's too), not a bool."""
    return (isinstance(value, (int, float, np.integer, np.floating))
            and not isinstance(value, bool) and bool(np.isfinite(value)))


class UsageError(ValueError):
    """An error the user fixes with the command's options or inputs.

    The command line prints its message as an argparse error (exit status 2)
    instead of a traceback; from Python it is a ValueError like any other.
    """


class MissingExtraError(UsageError, ModuleNotFoundError):
    """An optional dependency of the research application is missing: a
    command-line error (exit status 2) naming the extra to install."""


class ExistingResultsError(UsageError, FileExistsError):
    """Results of an earlier run are in the way and no overwrite was asked."""


def refuse_existing_results(output_dir, file_names, overwrite):
    """Raises `ExistingResultsError` if `output_dir` holds any of
    `file_names` and not `overwrite`: checked before any training, so a
    second run never replaces the first one's files by accident."""
    if output_dir is None or overwrite:
        return
    existing = [name for name in file_names
                if os.path.exists(os.path.join(output_dir, name))]
    if existing:
        raise ExistingResultsError(
            f"{output_dir} already holds {', '.join(existing)}; pass "
            "overwrite=True (`--overwrite`) to replace them.")


@dataclasses.dataclass
class DataOptions:
    """How to load and cut a data set (the CLI's common data options).

    Attributes:
        dataset: "embedded", a .npz path or a tensorflow-datasets name.
        classes: keep the first N classes (None: all).
        train_per_class: keep at most so many training images per class.
        test_per_class: keep at most so many test images per class.
        image_size: resize images to (size, size) (None: as stored).
        cub_crop: "bbox" or "center" for the CUB .npz files.
        subset_seed: seed of the per-class subsets (fixed across repeats so
            every seed sees the same images).
        dedupe: drop classes whose images are identical to an earlier
            class's (the Omniglot files hold the Greek and Latin alphabets
            twice: 292 labels, 242 distinct classes), then relabel.
    """

    dataset: str = "embedded"
    classes: int = None
    train_per_class: int = None
    test_per_class: int = None
    image_size: int = None
    cub_crop: str = "bbox"
    subset_seed: int = 0
    dedupe: bool = True

    def __post_init__(self):
        # None means "all"; 0 or a negative count is a mistake (it used to
        # mean "all classes" and "drop one image per class" silently).
        for name in ("classes", "train_per_class", "test_per_class",
                     "image_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or
                                      not isinstance(value, (int, np.integer))
                                      or value < 1):
                raise ValueError(
                    f"Argument `{name}` must be a positive integer (or None "
                    f"for all). Received: {name}={value!r}")


def require_extras(modules):
    """Raises before any training if an optional dependency is missing."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtraError(
            f"The experiments need {', '.join(missing)} (figures, t-SNE). "
            'Install them with: pip install "keras-ecoc[research]"')


_DATA_CACHE = {}


def duplicate_classes(data):
    """Classes whose train and test images equal an earlier class's.

    Returns:
        list of (duplicate class, original class) pairs.
    """
    import hashlib

    seen, pairs = {}, []
    for c in range(data.num_classes):
        digest = hashlib.sha1()
        digest.update(np.ascontiguousarray(data.x_train[data.y_train == c]))
        digest.update(b"|")
        digest.update(np.ascontiguousarray(data.x_test[data.y_test == c]))
        key = digest.hexdigest()
        if key in seen:
            pairs.append((c, seen[key]))
        else:
            seen[key] = c
    return pairs


def drop_classes(data, drop):
    """A copy without the classes in `drop`, relabelled 0..n'-1."""
    drop = set(int(c) for c in drop)
    if not drop:
        return data
    keep = [c for c in range(data.num_classes) if c not in drop]
    new_id = np.full(data.num_classes, -1, np.int32)
    new_id[keep] = np.arange(len(keep), dtype=np.int32)
    tr, te = new_id[data.y_train] >= 0, new_id[data.y_test] >= 0
    attributes = data.class_attributes
    if attributes is not None:
        attributes = np.asarray(attributes)[keep]
    return dataclasses.replace(
        data, x_train=data.x_train[tr], y_train=new_id[data.y_train[tr]],
        x_test=data.x_test[te], y_test=new_id[data.y_test[te]],
        class_names=[data.class_names[c] for c in keep],
        class_attributes=attributes)


def load_data(options):
    """An `ImageDataset` cut as `options` says (cached per process)."""
    if isinstance(options, str):
        options = DataOptions(dataset=options)
    key = dataclasses.astuple(options)
    if key not in _DATA_CACHE:
        from ecoc_research import datasets

        data = datasets.load_dataset(options.dataset,
                                     image_size=options.image_size,
                                     cub_crop=options.cub_crop)
        if options.dedupe:
            pairs = duplicate_classes(data)
            if pairs:
                log(f"dropping {len(pairs)} classes whose images duplicate "
                    f"another class's (e.g. {data.class_names[pairs[0][0]]!r}"
                    f" = class {pairs[0][1]}): {data.num_classes} -> "
                    f"{data.num_classes - len(pairs)} classes")
                data = drop_classes(data, [c for c, _ in pairs])
        if options.classes:
            data = data.first_classes(int(options.classes))
        if options.train_per_class or options.test_per_class:
            data = data.subset(options.train_per_class, options.test_per_class,
                               seed=options.subset_seed)
        _DATA_CACHE[key] = data
    return _DATA_CACHE[key]


def describe_data(data):
    """JSON description of an `ImageDataset`."""
    return {
        "name": data.name,
        "num_classes": int(data.num_classes),
        "train_images": int(len(data.y_train)),
        "test_images": int(len(data.y_test)),
        "input_shape": list(data.input_shape),
        "has_attributes": data.class_attributes is not None,
    }


def data_label(results):
    """'omniglot, n = 242 classes, 3630 train images' for figure titles."""
    d = results["dataset"]
    return (f"{d['name']} (n = {d['num_classes']} classes, "
            f"{d['train_images']} train images)")


def environment():
    """Versions, backend and the ECOC loss path (fused op or pure Keras)."""
    import keras

    info = {
        "python": platform.python_version(),
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    try:
        from keras_ecoc import ops as ecoc_ops

        status = getattr(ecoc_ops, "fused_status", None)
        info["ecoc_loss_path"] = str(status()) if callable(status) else "unknown"
    except Exception as error:  # The op module is optional.
        info["ecoc_loss_path"] = f"unavailable ({type(error).__name__})"
    if info["backend"] == "tensorflow":
        import tensorflow as tf

        info["tensorflow"] = tf.__version__
    return info


class SimilarityCache:
    """Class similarity of data-based codes, computed once per seed.

    The similarity comes from `ecoc_research.training.feature_similarity`: a
    one-hot network trained `epochs` epochs on the TRAINING split only, the
    cosine (or rbf) similarity of its class-mean penultimate features. The
    test split never feeds the codes.
    """

    # Shared by every instance in the process, so experiments run together
    # (`all`) train the similarity network once per data set and seed.
    _shared = {}

    def __init__(self, data, epochs=SIMILARITY_EPOCHS,
                 batch_size=SIMILARITY_BATCH_SIZE, kernel=SIMILARITY_KERNEL,
                 verbose=0):
        self.data, self.epochs = data, int(epochs)
        self.batch_size, self.kernel, self.verbose = batch_size, kernel, verbose
        self.wall_times = {}

    def __call__(self, seed):
        """The (n, n) similarity for `seed`."""
        key = (id(self.data), self.epochs, self.batch_size, self.kernel, seed)
        if key not in self._shared:
            from ecoc_research import training

            start = time.perf_counter()
            log(f"  class similarity (seed {seed}): one-hot network, "
                f"{self.epochs} epochs on the training split")
            similarity = np.asarray(training.feature_similarity(
                self.data, epochs=self.epochs, batch_size=self.batch_size,
                kernel=self.kernel, seed=seed, verbose=self.verbose))
            # The data set rides along so its id() cannot be reused.
            self._shared[key] = (similarity, time.perf_counter() - start,
                                 self.data)
        similarity, wall_time, _ = self._shared[key]
        self.wall_times[seed] = wall_time
        return similarity

    def describe(self):
        return {"epochs": self.epochs, "batch_size": self.batch_size,
                "kernel": self.kernel, "source": "one-hot network trained on "
                "the training split only (no pretrained weights)",
                "wall_time": {str(k): v for k, v in self.wall_times.items()}}


def max_code_length(encoding, num_classes):
    """Largest valid k: n - 1 for spectral codes, unbounded (None) otherwise."""
    return num_classes - 1 if encoding in DATA_ENCODINGS else None


def valid_length(encoding, num_classes, code_length):
    if encoding == "one_hot":
        return True
    limit = max_code_length(encoding, num_classes)
    return code_length >= 2 and (limit is None or code_length <= limit)


def encoding_codes(encoding, num_classes, code_length, similarity, seed):
    """The (n, k) code matrix of an encoding, or None for one-hot.

    Args:
        similarity: a callable seed -> (n, n) similarity (e.g. a
            `SimilarityCache`), used only by data-based encodings.
    """
    if encoding == "one_hot":
        return None
    from ecoc_research import training

    sim = similarity(seed) if encoding in DATA_ENCODINGS else None
    return np.asarray(training.make_codes(encoding, num_classes, code_length,
                                          similarity=sim, seed=seed),
                      np.float32)


def code_stats(codes):
    """Minimum and mean pairwise row distance of a code matrix (n, k)."""
    if codes is None:
        return {"min_distance": float(np.sqrt(2.0)), "mean_distance":
                float(np.sqrt(2.0))}
    from scipy.spatial.distance import pdist

    c = np.asarray(codes, np.float64)
    off = pdist(c)
    return {"min_distance": float(off.min()), "mean_distance": float(off.mean()),
            "distinct_rows": int(len(np.unique(np.round(c, 6), axis=0)))}


def log(message):
    print(message, flush=True)


class RunProgress:
    """An outer progress bar over the runs of an experiment (stdout)."""

    def __init__(self, total, name):
        self.total, self.name, self.done = int(total), name, 0
        self.start = time.perf_counter()

    def begin(self, label):
        elapsed = time.perf_counter() - self.start
        eta = ""
        if self.done:
            eta = f", ~{elapsed / self.done * (self.total - self.done):.0f} s left"
        width = 20
        filled = int(width * self.done / max(1, self.total))
        log(f"[{self.name}] [{'#' * filled}{'.' * (width - filled)}] "
            f"run {self.done + 1}/{self.total}: {label} "
            f"({elapsed:.0f} s elapsed{eta})")

    def end(self, record=None):
        self.done += 1
        if record is not None and record.get("final_accuracy") is not None:
            log(f"    -> final accuracy {record['final_accuracy']:.4f} "
                f"(best {record['best_accuracy']:.4f}) in "
                f"{record['wall_time']:.0f} s")


def output_path(output_dir, name):
    os.makedirs(output_dir, exist_ok=True)
    return os.path.join(output_dir, name)


# The command line of the current CLI invocation (set by __main__.main), so
# every results JSON records how it was made; None for direct calls.
COMMAND = None
