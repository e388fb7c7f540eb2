"""Add-bits on CUB-50 from a pretrained backbone (the paper's CUB figure).

The paper fine-tunes an ImageNet network on CUB-200 and finds that
data-based codes with about a quarter of the bits match one-hot. Nothing
pretrained can be downloaded offline, so the backbone here is pretrained
one-hot on CIFAR-10, whose classes are disjoint from the birds (the paper's
"transfer to new classes" variant), then:

1. the pretrained network (conv blocks, fc6 "features", fc7, fc8) is cut
   after fc6, and fc6 features of every CUB image are computed once
   (frozen, cached);
2. data-based codes take their class similarity from the *pretrained* fc7
   activations of the CUB training images (minus the validation split), so
   no encoding sees more training than another;
3. for every encoding, fc7 + fc8 are re-initialised and trained on the
   frozen fc6 features with SGD + momentum 0.9, the learning rate chosen
   from a small grid on a stratified validation split, then test accuracy
   is reported once per (encoding, k, seed); seeds are paired across
   encodings (same initial fc7 weights, same batch order);
4. "matches one-hot" is decided by an equivalence test (TOST, +-1 point)
   on the paired per-seed differences.
"""

import dataclasses
import hashlib
import json
import os
import time
import warnings

import numpy as np

from ecoc_research.experiments import common
from ecoc_research.experiments import stats
from ecoc_research.training import steps_per_execution

# Pretraining defaults. 32 px because one epoch of CIFAR-10 costs ~47 s at
# 32 px and ~400 s at 64 px on this 2-core CPU (measured, batch 64, uncontended
# TF/XLA; ~117 s at 32 px when shared with other jobs), and the pretraining
# budget is about 12 minutes: 6 epochs at 32 px.
PRETRAIN_IMAGE_SIZE = 32
PRETRAIN_EPOCHS = 6
PRETRAIN_BATCH_SIZE = 64
PRETRAIN_LEARNING_RATE = 1e-3
FC_WIDTH = 256

# Cache layout version: bump when the network or the saved files change, so
# an old cache is never reused for a different network.
_CACHE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """Everything that determines a pretrained backbone (its cache key).

    Attributes:
        source: path of the pretraining `.npz` (CIFAR-10 by default).
        image_size: side of the square input images (CUB is resized to it).
        epochs: passes over the source training split.
        batch_size: mini-batch size.
        learning_rate: Adam learning rate of the pretraining.
        flip: random horizontal flips during pretraining.
        seed: seeds the weights and the batch order.
        fc_width: width of fc7 (fc6 is the backbone's 256-unit "features").
        train_per_class: keep at most so many source training images per
            class (None: all; small values for smoke tests).
    """

    source: str
    image_size: int = PRETRAIN_IMAGE_SIZE
    epochs: int = PRETRAIN_EPOCHS
    batch_size: int = PRETRAIN_BATCH_SIZE
    learning_rate: float = PRETRAIN_LEARNING_RATE
    flip: bool = True
    seed: int = 0
    fc_width: int = FC_WIDTH
    train_per_class: int = None

    def __post_init__(self):
        for name in ("image_size", "epochs", "batch_size", "fc_width"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(
                    f"Argument `{name}` must be a positive integer. "
                    f"Received: {name}={value!r}")
        if self.train_per_class is not None and (
                not isinstance(self.train_per_class, (int, np.integer))
                or self.train_per_class < 1):
            raise ValueError(
                "Argument `train_per_class` must be None or a positive "
                f"integer. Received: train_per_class={self.train_per_class!r}")
        if not (isinstance(self.learning_rate, (int, float))
                and self.learning_rate > 0):
            raise ValueError(
                "Argument `learning_rate` must be a positive float. "
                f"Received: learning_rate={self.learning_rate!r}")

    def key(self):
        """A short hash of every setting (and the cache version)."""
        # Optional fields left at None stay out of the key, so caches made
        # before such a field existed keep their key.
        fields = {k: v for k, v in dataclasses.asdict(self).items()
                  if v is not None}
        blob = json.dumps({**fields,
                           "source": os.path.basename(self.source),
                           "version": _CACHE_VERSION}, sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


def build_pretrain_model(input_shape, num_classes, fc_width=FC_WIDTH,
                         flip=False):
    """conv blocks -> fc6 ("features", 256) -> fc7 (`fc_width`) -> fc8 logits.

    The conv blocks and fc6 are `ecoc_research.training.build_backbone`;
    fc7 and fc8 are the two layers the paper re-initialises and retrains.

    Args:
        input_shape: (H, W, C).
        num_classes: units of fc8.
        fc_width: units of fc7.
        flip: a RandomFlip("horizontal") layer in front (training only).

    Returns:
        An uncompiled `keras.Model` (batch, H, W, C) -> (batch, num_classes).
    """
    import keras

    from ecoc_research import training

    backbone = training.build_backbone(tuple(input_shape), name="backbone")
    inputs = keras.Input(tuple(input_shape))
    x = keras.layers.RandomFlip("horizontal", name="flip")(inputs) if flip \
        else inputs
    x = backbone(x)
    x = keras.layers.Dense(fc_width, activation="relu", name="fc7")(x)
    logits = keras.layers.Dense(num_classes, name="fc8")(x)
    return keras.Model(inputs, logits, name="pretrain")


def pretrain_backbone(settings, cache_dir, verbose=2):
    """The pretrained network, trained once and cached under `cache_dir`.

    Args:
        settings: a `PretrainSettings`.
        cache_dir: folder of the cache (`<cache_dir>/backbone-<key>/`); it is
            created, and nothing is written outside it.
        verbose: Keras `fit` verbosity.

    Returns:
        (model, info): the `build_pretrain_model` network with its
        pretrained weights, and a JSON-able dict (settings, key, source test
        accuracy, wall time of the pretraining, whether it came from cache).
    """
    import keras

    from ecoc_research import datasets

    if not isinstance(settings, PretrainSettings):
        raise ValueError(
            "Argument `settings` must be a `PretrainSettings`. "
            f"Received: settings={settings!r}")
    folder = os.path.join(cache_dir, f"backbone-{settings.key()}")
    weights = os.path.join(folder, "pretrain.weights.h5")
    meta = os.path.join(folder, "pretrain.json")
    if os.path.exists(weights) and os.path.exists(meta):
        with open(meta) as f:
            info = json.load(f)
        if info.get("key") == settings.key():
            model = build_pretrain_model(
                (settings.image_size, settings.image_size, 3),
                info["num_classes"], settings.fc_width, flip=settings.flip)
            model.load_weights(weights)
            common.log(f"  pretrained backbone from cache {folder}")
            return model, {**info, "cached": True}
    source = datasets.load_dataset(settings.source,
                                   image_size=settings.image_size)
    if settings.train_per_class:
        source = source.subset(settings.train_per_class, None,
                               seed=settings.seed)
    keras.utils.set_random_seed(settings.seed)
    model = build_pretrain_model(source.input_shape, source.num_classes,
                                 settings.fc_width, flip=settings.flip)
    model.compile(
        optimizer=keras.optimizers.Adam(settings.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"], jit_compile=True)
    common.log(f"  pretraining one-hot on {source.name} "
               f"({len(source.y_train)} images, {source.num_classes} classes, "
               f"{settings.image_size} px, {settings.epochs} epochs)")
    start = time.perf_counter()
    history = model.fit(source.x_train, source.y_train,
                        batch_size=settings.batch_size,
                        epochs=settings.epochs, shuffle=True, verbose=verbose)
    wall_time = time.perf_counter() - start
    _, test_accuracy = model.evaluate(source.x_test, source.y_test,
                                      batch_size=512, verbose=0)
    info = {"settings": dataclasses.asdict(settings), "key": settings.key(),
            "source_name": source.name,
            "num_classes": int(source.num_classes),
            "source_train_images": int(len(source.y_train)),
            "source_test_accuracy": float(test_accuracy),
            "train_loss": [float(v) for v in history.history["loss"]],
            "train_accuracy": [float(v) for v in
                               history.history["accuracy"]],
            "wall_time": wall_time, "environment": common.environment()}
    os.makedirs(folder, exist_ok=True)
    model.save_weights(weights)
    with open(meta, "w") as f:
        json.dump(info, f, indent=1)
    common.log(f"  pretrained in {wall_time:.0f} s: {source.name} test "
               f"accuracy {test_accuracy:.4f}; cached in {folder}")
    return model, {**info, "cached": False}


# ---------------------------------------------------------------------------
# Frozen features, validation split and class similarity.

VALIDATION_PER_CLASS = 5
SPLIT_SEED = 0


def validation_split(labels, per_class=VALIDATION_PER_CLASS, seed=SPLIT_SEED):
    """A stratified split: `per_class` validation indices from every class.

    Args:
        labels: (N,) int class ids.
        per_class: validation images per class; every class must keep at
            least one training image.
        seed: seed of the draw (fixed, so every run sees the same split).

    Returns:
        (train_index, val_index): sorted int arrays partitioning 0..N-1.
    """
    labels = np.asarray(labels)
    if not isinstance(per_class, (int, np.integer)) or per_class < 1:
        raise ValueError(
            "Argument `per_class` must be a positive integer. "
            f"Received: per_class={per_class!r}")
    rng = np.random.default_rng(seed)
    val = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) <= per_class:
            raise ValueError(
                f"Argument `per_class` must leave every class at least one "
                f"training image; class {int(c)} has {len(members)} images. "
                f"Received: per_class={per_class}")
        val.append(rng.choice(members, per_class, replace=False))
    val = np.sort(np.concatenate(val))
    train = np.setdiff1d(np.arange(len(labels)), val)
    return train, val


@dataclasses.dataclass
class FeatureSplits:
    """Frozen fc6 features of the retraining data, split three ways.

    Attributes:
        train, val, test: float32 (N_split, d) fc6 features.
        y_train, y_val, y_test: int32 (N_split,) labels.
        fc7_train: float32 (N_train, fc_width) *pretrained* fc7 activations
            of the training images (the source of data-based codes).
        num_classes: n.
    """

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    y_train: np.ndarray
    y_val: np.ndarray
    y_test: np.ndarray
    fc7_train: np.ndarray
    num_classes: int

    def similarity(self, kernel="cosine"):
        """(n, n) class similarity of the pretrained fc7 class means."""
        from keras_ecoc import codes as codes_lib

        return np.asarray(codes_lib.class_similarity(
            self.fc7_train, self.y_train, num_classes=self.num_classes,
            kernel=kernel))


def frozen_features(model, data, per_class=VALIDATION_PER_CLASS):
    """fc6 features (and pretrained fc7 activations) of an `ImageDataset`.

    Args:
        model: a `build_pretrain_model` network (pretrained).
        data: `ImageDataset` whose images match the model's input size.
        per_class: validation images per class carved from the train split.

    Returns:
        A `FeatureSplits`.
    """
    import keras

    backbone = model.get_layer("backbone")
    fc7 = model.get_layer("fc7")
    inputs = keras.Input(backbone.input_shape[1:])
    fc6 = backbone(inputs)
    extractor = keras.Model(inputs, [fc6, fc7(fc6)])
    shape = tuple(backbone.input_shape[1:])
    if tuple(data.input_shape) != shape:
        raise ValueError(
            f"The images have shape {tuple(data.input_shape)} but the "
            f"pretrained backbone takes {shape}; load the data set with "
            f"image_size={shape[0]}.")
    train_fc6, train_fc7 = extractor.predict(data.x_train, batch_size=256,
                                             verbose=0)
    test_fc6, _ = extractor.predict(data.x_test, batch_size=256, verbose=0)
    tr, va = validation_split(data.y_train, per_class)
    y = np.asarray(data.y_train, np.int32)
    return FeatureSplits(
        train=train_fc6[tr], val=train_fc6[va],
        test=np.asarray(test_fc6, np.float32),
        y_train=y[tr], y_val=y[va],
        y_test=np.asarray(data.y_test, np.int32),
        fc7_train=train_fc7[tr], num_classes=int(data.num_classes))


def pretrained_features(data, pretrain, output_dir,
                        val_per_class=VALIDATION_PER_CLASS, verbose=0):
    """Pretrains (or loads) the backbone and computes frozen features.

    Args:
        data: an `ImageDataset` or a data spec for `common.load_data`; it is
            resized to `pretrain.image_size`.
        pretrain: a `PretrainSettings`.
        output_dir: folder of the backbone cache.
        val_per_class: validation images per class.
        verbose: Keras verbosity of the pretraining.

    Returns:
        (features, pretrain_info, data): a `FeatureSplits`, the
        `pretrain_backbone` info, and the (resized) `ImageDataset`.
    """
    from ecoc_research import datasets

    model, info = pretrain_backbone(pretrain, output_dir, verbose=verbose)
    if not hasattr(data, "x_train"):
        data = common.load_data(data)
    if tuple(data.input_shape[:2]) != (pretrain.image_size,) * 2:
        data = datasets._resized(data, pretrain.image_size)
    if data.input_shape[-1] == 1:  # Grayscale data on an RGB backbone.
        import dataclasses as dc

        data = dc.replace(data, x_train=np.repeat(data.x_train, 3, -1),
                          x_test=np.repeat(data.x_test, 3, -1))
    return frozen_features(model, data, val_per_class), info, data


# ---------------------------------------------------------------------------
# Codes.

CODE_LENGTHS = (4, 8, 12, 16, 25, 49)
ENCODINGS = ("one_hot", "truncated_one_hot", "spectral", "spectral_zero",
             "spectral_median", "gaussian", "dense_random")


def truncated_one_hot(num_classes, code_length):
    """The first `code_length` columns of the identity, if rows stay distinct.

    Truncating one-hot to k bits leaves the last n - k classes with the
    all-zero codeword, so the code has no duplicate codewords only when
    k >= n - 1 (k = n - 1: one class is encoded by the zero vector, which
    the nearest-codeword decoder still tells apart: class i < n - 1 wins
    over it when u_i > 1/2).

    Raises:
        ValueError: for k < n - 1 (duplicate codewords) or k > n.
    """
    n, k = int(num_classes), int(code_length)
    if not n - 1 <= k <= n:
        raise ValueError(
            "Argument `code_length` must be num_classes - 1 or num_classes "
            "for a truncated one-hot code: with fewer bits the last "
            f"{n - k} classes share the all-zero codeword. Received: "
            f"code_length={k} with num_classes={n}")
    return np.eye(n, k, dtype=np.float32)


def make_code(encoding, num_classes, code_length, similarity, seed):
    """The (n, k) code matrix of `encoding`, or None for one-hot.

    Random codes are drawn with `seed`, data-based codes from `similarity`
    (deterministic: the same code for every seed). Rows are rescaled to norm
    sqrt(k) (`ecoc_research.training.make_codes`), except the truncated one-hot
    code, whose zero row cannot be rescaled.
    """
    from ecoc_research import training

    if encoding == "one_hot":
        return None
    if encoding == "truncated_one_hot":
        return truncated_one_hot(num_classes, code_length)
    sim = similarity if encoding in common.DATA_ENCODINGS else None
    return np.asarray(training.make_codes(encoding, num_classes, code_length,
                                          similarity=sim, seed=seed),
                      np.float32)


# ---------------------------------------------------------------------------
# Retraining fc7 + fc8 on frozen features.

HEAD_EPOCHS = 30
HEAD_BATCH_SIZE = 32
LEARNING_RATES = (0.003, 0.01, 0.03, 0.1)
MOMENTUM = 0.9


def build_head(feature_dim, num_classes, codes=None, fc_width=FC_WIDTH,
               scale=None):
    """fc7 (ReLU) + fc8 on (batch, feature_dim) features, freshly initialised.

    Returns:
        An uncompiled one-hot `keras.Model` (fc8 = Dense(n) logits) when
        `codes` is None, else an `ECOCClassifier` whose projection is fc8
        (Dense(k)) and which decodes with `codes`; `scale` is its initial
        (learnable) decoding scale, None for the package default.
    """
    import keras

    from keras_ecoc.models import ECOCClassifier

    inputs = keras.Input((int(feature_dim),))
    x = keras.layers.Dense(fc_width, activation="relu", name="fc7")(inputs)
    if codes is None:
        logits = keras.layers.Dense(num_classes, name="fc8")(x)
        return keras.Model(inputs, logits, name="one_hot_head")
    body = keras.Model(inputs, x, name="fc7_body")
    kwargs = {} if scale is None else {"scale": float(scale)}
    return ECOCClassifier(body, codes, pooling=None, name="ecoc_head",
                          **kwargs)


def train_head(features, codes, learning_rate, seed, epochs=HEAD_EPOCHS,
               batch_size=HEAD_BATCH_SIZE, momentum=MOMENTUM,
               evaluate_test=True, scale=None):
    """Trains fc7 + fc8 on frozen features with SGD + momentum.

    The learning rate is divided by 10 after half the epochs (the paper's
    CUB schedule: 30 epochs, /10 after 15). Validation accuracy is recorded
    after every epoch; test accuracy once, at the end.

    Args:
        features: a `FeatureSplits`.
        codes: (n, k) code matrix, or None for one-hot.
        learning_rate: initial SGD learning rate (> 0).
        seed: seeds fc7/fc8 initialisation and the batch order; the same
            seed gives every encoding the same fc7 initialisation and batch
            order (paired seeds).
        epochs, batch_size, momentum: the schedule.
        evaluate_test: measure test accuracy (False while choosing the
            learning rate).
        scale: initial learnable decoding scale of ECOC heads (None: the
            package default).

    Returns:
        dict: val_accuracies (epochs,), final_val_accuracy, test_accuracy
        (None if not evaluated), final_scale (None for one-hot), wall_time,
        steps.
    """
    import keras

    from keras_ecoc.decoding import nearest_codeword
    from keras_ecoc.models import ECOCClassifier

    if not (isinstance(learning_rate, (int, float)) and learning_rate > 0):
        raise ValueError(
            "Argument `learning_rate` must be a positive float. "
            f"Received: learning_rate={learning_rate!r}")
    keras.utils.set_random_seed(int(seed))
    n = features.num_classes
    steps_per_epoch = int(np.ceil(len(features.y_train) / batch_size))
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay(
        [steps_per_epoch * (epochs // 2)],
        [float(learning_rate), float(learning_rate) / 10])
    optimizer = keras.optimizers.SGD(schedule, momentum=momentum)
    # One traced call runs a whole epoch: the head is tiny, so per-step
    # dispatch, not arithmetic, dominates the cost on a CPU. No XLA: its
    # compilation (6-9 s measured) costs more than the whole 30-epoch run.
    compiled = dict(jit_compile=False,
                    steps_per_execution=steps_per_execution(steps_per_epoch))
    with warnings.catch_warnings():
        # Only the truncated one-hot code (one all-zero codeword) has unequal
        # codeword norms here, and that is its definition.
        warnings.filterwarnings("ignore", message=".*unequal norms")
        model = build_head(features.train.shape[1], n, codes, scale=scale)
        if codes is None:
            model.compile(
                optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                **compiled)
        else:
            model.compile(optimizer=optimizer, metrics=[], **compiled)

    def accuracy(x, y):
        # One forward pass over the whole split (at most a few thousand rows).
        out = model(keras.ops.convert_to_tensor(x), training=False)
        if isinstance(model, ECOCClassifier):
            predicted = nearest_codeword(out, model.codes)
        else:
            predicted = keras.ops.argmax(out, -1)
        return float(np.mean(keras.ops.convert_to_numpy(predicted) == y))

    val_accuracies = []
    record_val = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: val_accuracies.append(
            accuracy(features.val, features.y_val)))
    start = time.perf_counter()
    history = model.fit(features.train, features.y_train,
                        batch_size=batch_size, epochs=epochs, shuffle=True,
                        verbose=0, callbacks=[record_val])
    wall_time = time.perf_counter() - start
    losses = [float(v) for v in history.history["loss"]]
    final_scale = None
    if isinstance(model, ECOCClassifier):
        final_scale = float(keras.ops.convert_to_numpy(model.decoder.scale))
    return {
        "val_accuracies": val_accuracies,
        "final_val_accuracy": val_accuracies[-1],
        "test_accuracy": (accuracy(features.test, features.y_test)
                          if evaluate_test else None),
        "train_losses": losses,
        "diverged": not np.isfinite(losses[-1]),
        "final_scale": final_scale, "wall_time": wall_time,
        "steps": steps_per_epoch * epochs,
    }


# ---------------------------------------------------------------------------
# Statistics: one module for every experiment (`stats`).

EQUIVALENCE_MARGIN = stats.EQUIVALENCE_MARGIN  # accuracy points
paired_equivalence = stats.paired_equivalence
verdict = stats.equivalence_verdict


def mean_ci(values, level=0.95):
    """Mean and t confidence interval of (S,) values; CI None if S < 2."""
    mean, low, high = stats.t_interval(values, level)
    return mean, (None if low is None else [low, high])


# ---------------------------------------------------------------------------
# The experiment.


def _run_name(encoding, k, learning_rate, seed, scale=None):
    stem = f"{encoding}-k{k}-lr{learning_rate:g}-s{seed}"
    if scale is not None and encoding != "one_hot":
        stem += f"-scale{scale:g}"
    return stem + ".json"


class RunStore:
    """Per-run JSON files under `<output_dir>/runs/`, written as runs finish.

    An existing file is reused only when `resume` is set and its settings
    equal the requested ones; otherwise it is an error unless `overwrite`.
    """

    def __init__(self, output_dir, resume=False, overwrite=False):
        self.folder = os.path.join(output_dir, "runs")
        self.resume, self.overwrite = bool(resume), bool(overwrite)

    def get(self, name, settings):
        path = os.path.join(self.folder, name)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            record = json.load(f)
        if self.resume and record.get("settings") == settings:
            return record
        if self.overwrite:
            return None
        raise FileExistsError(
            f"{path} exists (from an earlier run"
            + (" with other settings" if self.resume else "")
            + "); pass resume=True (`--resume`) to reuse runs with the same "
            "settings or overwrite=True (`--overwrite`) to replace them.")

    def put(self, name, record):
        from ecoc_research.experiments import report

        os.makedirs(self.folder, exist_ok=True)
        report.write_json(os.path.join(self.folder, name), record)


def run_cub_bits(data, output_dir, pretrain, code_lengths=CODE_LENGTHS,
                 encodings=ENCODINGS, seeds=(0, 1, 2, 3, 4),
                 learning_rates=LEARNING_RATES, epochs=HEAD_EPOCHS,
                 batch_size=HEAD_BATCH_SIZE,
                 val_per_class=VALIDATION_PER_CLASS,
                 margin=EQUIVALENCE_MARGIN, resume=False, overwrite=False,
                 scale=None, verbose=0, name="cub_bits"):
    """Test accuracy against k, fc7 + fc8 retrained on frozen features.

    Args:
        data: an `ImageDataset` (CUB-50) or a data spec for
            `common.load_data`; it is resized to `pretrain.image_size`.
        output_dir: folder of every output (pretraining cache, per-run JSON,
            summary JSON / Markdown / PNG); nothing is written elsewhere.
        pretrain: a `PretrainSettings` (the backbone is trained once per
            settings and cached under `output_dir`).
        code_lengths: k of the ECOC encodings.
        encodings: names among `ENCODINGS`; one-hot is always added.
        seeds: paired seeds (>= 2 for the statistics). The learning rate of
            every (encoding, k) is chosen on the validation split with the
            first seed, whose run at that rate is then kept.
        learning_rates: the SGD learning-rate grid.
        epochs, batch_size: the fixed retraining budget.
        val_per_class: validation images per class, carved from the train
            split.
        margin: equivalence margin in accuracy points.
        resume, overwrite: reuse / replace existing per-run files.
        scale: initial learnable decoding scale of the ECOC heads (None:
            the package default, 1.0).
        name: stem of the summary files.

    Returns:
        dict with "summary" (per encoding and k: chosen learning rate, test
        accuracy per seed, mean and 95% CI, paired difference to one-hot
        with TOST), "pretrain", "settings", "dataset", "environment",
        "markdown", "files", "wall_time".
    """
    start = time.perf_counter()
    seeds = [int(s) for s in seeds]
    if len(seeds) < 2:
        raise ValueError(
            "Argument `seeds` must list at least 2 paired seeds for the "
            f"statistics. Received: seeds={seeds}")
    unknown = sorted(set(encodings) - set(ENCODINGS))
    if unknown:
        raise ValueError(
            f"Argument `encodings` must be among {ENCODINGS}. Received "
            f"unknown encodings {unknown}")
    if not code_lengths or any(not isinstance(k, (int, np.integer)) or k < 2
                               for k in code_lengths):
        raise ValueError(
            "Argument `code_lengths` must list integers >= 2. Received: "
            f"code_lengths={code_lengths!r}")
    if not learning_rates or any(
            not isinstance(lr, (int, float)) or not lr > 0
            for lr in learning_rates):
        raise ValueError(
            "Argument `learning_rates` must list positive floats. Received: "
            f"learning_rates={learning_rates!r}")
    features, pretrain_info, data = pretrained_features(
        data, pretrain, output_dir, val_per_class, verbose=verbose)
    similarity = features.similarity()
    n = features.num_classes
    plan = [("one_hot", n)]
    for encoding in encodings:
        if encoding == "one_hot":
            continue
        for k in code_lengths:
            k = int(k)
            if encoding == "truncated_one_hot" and k < n - 1:
                continue  # Duplicate codewords: see `truncated_one_hot`.
            if encoding in common.DATA_ENCODINGS and k > n - 1:
                continue
            plan.append((encoding, k))
    store = RunStore(output_dir, resume=resume, overwrite=overwrite)
    settings = {"pretrain_key": pretrain.key(), "epochs": int(epochs),
                "batch_size": int(batch_size), "momentum": MOMENTUM,
                "val_per_class": int(val_per_class),
                "schedule": "lr / 10 after half the epochs"}
    if scale is not None:
        # Only when set, so runs stored before the option existed resume.
        settings["scale"] = float(scale)
    progress = common.RunProgress(
        len(plan) * (len(learning_rates) + len(seeds) - 1), name)
    summary, records = [], []
    results = {
        "experiment": "cub_bits",
        "dataset": {**common.describe_data(data),
                    "retrain_train_images": int(len(features.y_train)),
                    "validation_images": int(len(features.y_val))},
        "pretrain": {k: v for k, v in pretrain_info.items()
                     if k != "environment"},
        "settings": {**settings, "code_lengths": [int(k) for k in
                                                  code_lengths],
                     "encodings": list(encodings), "seeds": seeds,
                     "learning_rates": [float(v) for v in learning_rates],
                     "margin": float(margin),
                     "similarity": "cosine similarity of the class means of "
                     "the pretrained fc7 activations of the CUB training "
                     "images (validation split excluded)"},
        "environment": common.environment(), "command": common.COMMAND,
        "plan": [list(p) for p in plan],
    }
    for encoding, k in plan:
        try:
            codes = make_code(encoding, n, k, similarity, seeds[0])
        except ValueError as error:
            summary.append({"encoding": encoding, "code_length": k,
                            "status": "no_code", "error": str(error)})
            progress.done += len(learning_rates) + len(seeds) - 1
            continue
        if codes is not None and len(np.unique(codes, axis=0)) < n:
            summary.append({"encoding": encoding, "code_length": k,
                            "status": "duplicate_codewords",
                            "distinct_rows": int(len(np.unique(codes,
                                                               axis=0)))})
            common.log(f"  {encoding} k={k}: duplicate codewords, skipped")
            progress.done += len(learning_rates) + len(seeds) - 1
            continue

        def run(lr, seed):
            run_name = _run_name(encoding, k, lr, seed, scale)
            run_settings = {**settings, "encoding": encoding,
                            "code_length": k, "learning_rate": float(lr),
                            "seed": int(seed)}
            if encoding == "one_hot":  # No decoding scale: shared runs.
                run_settings.pop("scale", None)
            record = store.get(run_name, run_settings)
            progress.begin(f"{encoding} k={k} lr={lr:g} seed={seed}")
            if record is None:
                # Random codes get a new draw per seed; data-based codes
                # are the same for every seed.
                seed_codes = make_code(encoding, n, k, similarity, seed)
                record = {"settings": run_settings,
                          **train_head(features, seed_codes, lr, seed,
                                       epochs=epochs, batch_size=batch_size,
                                       scale=scale)}
                store.put(run_name, record)
            progress.end()
            common.log(f"    -> val {record['final_val_accuracy']:.4f}, "
                       f"test {record['test_accuracy']:.4f} "
                       f"({record['wall_time']:.1f} s)")
            records.append(record)
            return record

        trials = {lr: run(lr, seeds[0]) for lr in learning_rates}
        # Diverged runs never win; ties go to the smaller rate.
        best_lr = max(learning_rates, key=lambda lr: (
            not trials[lr]["diverged"], trials[lr]["final_val_accuracy"],
            -lr))
        per_seed = {seeds[0]: trials[best_lr]}
        for seed in seeds[1:]:
            per_seed[seed] = run(best_lr, seed)
        test = [per_seed[s]["test_accuracy"] for s in seeds]
        mean, ci = mean_ci(test)
        summary.append({
            "encoding": encoding, "code_length": k, "status": "ok",
            "learning_rate": float(best_lr),
            "validation_by_learning_rate": {
                f"{lr:g}": trials[lr]["final_val_accuracy"]
                for lr in learning_rates},
            "seeds": seeds, "test_accuracy": test,
            "val_accuracy": [per_seed[s]["final_val_accuracy"] for s in seeds],
            "test_accuracy_mean": mean, "test_accuracy_ci95": ci,
            # Final training loss: how hard the head fits its 25 images a
            # class (overfitting shows as ~0 loss with low test accuracy).
            "final_train_loss": [per_seed[s]["train_losses"][-1]
                                 for s in seeds],
            "final_scale": [per_seed[s]["final_scale"] for s in seeds],
            "wall_time": float(sum(r["wall_time"] for r in records)),
        })
        _add_comparisons(summary, margin)
        results["summary"] = summary
        results["wall_time"] = time.perf_counter() - start
        results["markdown"] = cub_bits_markdown(results)
        results["files"] = _write(results, output_dir, name)
    results["summary"] = summary
    results["wall_time"] = time.perf_counter() - start
    results["train_wall_time"] = float(sum(r["wall_time"] for r in records))
    results["markdown"] = cub_bits_markdown(results)
    results["files"] = _write(results, output_dir, name)
    return results


def _add_comparisons(summary, margin):
    """Paired (per-seed) differences to one-hot, in points, with TOST.

    When the plan holds the one-hot codewords decoded by the ECOC head
    (truncated one-hot with k = n), every code is also compared with it
    ("equivalence_ecoc_identity"): same decoder, only the code differs.
    """
    one_hot = next(r for r in summary if r["encoding"] == "one_hot")
    identity = next((r for r in summary if r["encoding"] ==
                     "truncated_one_hot" and r.get("status") == "ok"
                     and r["code_length"] == one_hot["code_length"]), None)
    for row in summary:
        if row.get("status") != "ok" or row is one_hot:
            continue
        d = 100.0 * (np.asarray(row["test_accuracy"])
                     - np.asarray(one_hot["test_accuracy"]))
        row["difference_points"] = d.tolist()
        row["equivalence"] = paired_equivalence(d, margin)
        row["verdict"] = verdict(row["equivalence"])
        if identity is not None and row is not identity:
            d = 100.0 * (np.asarray(row["test_accuracy"])
                         - np.asarray(identity["test_accuracy"]))
            row["equivalence_ecoc_identity"] = paired_equivalence(d, margin)


def cub_bits_markdown(results):
    """Table: encoding, k, chosen lr, accuracy mean [95% CI], paired diff."""
    s = results["settings"]
    rows = []
    for r in results["summary"]:
        if r.get("status") != "ok":
            rows.append([r["encoding"], r["code_length"], "", r["status"],
                         "", "", "", ""])
            continue
        ci = r["test_accuracy_ci95"]
        cell = f"{100 * r['test_accuracy_mean']:.1f}"
        if ci:
            cell += f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
        if "equivalence" in r:
            e = r["equivalence"]
            diff = (f"{e['mean']:+.1f} (90% [{e['ci90'][0]:+.1f}, "
                    f"{e['ci90'][1]:+.1f}], 95% [{e['ci95'][0]:+.1f}, "
                    f"{e['ci95'][1]:+.1f}]; p_TOST {e['p_tost']:.3f})")
            verdict_cell = r["verdict"]
        else:
            diff, verdict_cell = "reference", ""
        loss = r.get("final_train_loss")
        loss = f"{np.mean(loss):.2f}" if loss else ""
        e = r.get("equivalence_ecoc_identity")
        identity = (f"{e['mean']:+.1f} [{e['ci95'][0]:+.1f}, "
                    f"{e['ci95'][1]:+.1f}]; {verdict(e, 'it')}") if e else ""
        rows.append([r["encoding"], r["code_length"],
                     f"{r['learning_rate']:g}", cell, diff, verdict_cell,
                     loss, identity])
    d = results["dataset"]
    p = results["pretrain"]
    text = (
        f"CUB-50 test accuracy (%) after retraining fc7 + fc8 on frozen fc6 "
        f"features of a backbone pretrained one-hot on {p['source_name']} "
        f"({p['settings']['image_size']} px, {p['settings']['epochs']} "
        f"epochs, source test accuracy {100 * p['source_test_accuracy']:.1f}"
        f"%). {d['retrain_train_images']} training / "
        f"{d['validation_images']} validation / {d['test_images']} test "
        f"images; SGD momentum {s['momentum']}, {s['epochs']} epochs, batch "
        f"{s['batch_size']}, lr / 10 after half; ECOC decoding scale "
        f"{s.get('scale', 1.0):g} initially, learnable; lr from "
        f"{s['learning_rates']} on validation; {len(s['seeds'])} paired "
        f"seeds {s['seeds']}. Mean [95% t-CI]; difference to one-hot in "
        f"points (paired), TOST margin ±{s['margin']:g}.\n\n")
    return text + report_table(
        ["encoding", "k", "lr", "test acc. % [95% CI]",
         "paired diff. to one-hot (pt)", "verdict", "final train loss",
         "diff. to one-hot codewords through the ECOC head (pt, 95% CI)"],
        rows)


def report_table(headers, rows):
    from ecoc_research.experiments import report

    return report.markdown_table(headers, rows)


def _write(results, output_dir, name):
    """Summary JSON, Markdown and a two-panel PNG (matplotlib Figure)."""
    from matplotlib.figure import Figure

    from ecoc_research.experiments import report

    rows = [r for r in results["summary"] if r.get("status") == "ok"]
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    one_hot = next((r for r in rows if r["encoding"] == "one_hot"), None)
    for encoding in dict.fromkeys(r["encoding"] for r in rows):
        if encoding == "one_hot":
            continue
        series = sorted((r for r in rows if r["encoding"] == encoding),
                        key=lambda r: r["code_length"])
        ks = [r["code_length"] for r in series]
        mean = [100 * r["test_accuracy_mean"] for r in series]
        # Truncated one-hot exists only at k = n - 1 and n: points, no line.
        marker = "*" if encoding == "truncated_one_hot" else "o"
        style = "none" if encoding == "truncated_one_hot" else "-"
        line, = left.plot(ks, mean, marker=marker, linestyle=style,
                          markersize=9 if marker == "*" else 6,
                          label=encoding)
        if style == "-" and all(r["test_accuracy_ci95"] for r in series):
            left.fill_between(ks, [100 * r["test_accuracy_ci95"][0]
                                   for r in series],
                              [100 * r["test_accuracy_ci95"][1]
                               for r in series],
                              color=line.get_color(), alpha=0.15)
        if all("equivalence" in r for r in series):
            e = [r["equivalence"] for r in series]
            right.errorbar(ks, [v["mean"] for v in e],
                           yerr=[[v["mean"] - v["ci95"][0] for v in e],
                                 [v["ci95"][1] - v["mean"] for v in e]],
                           marker=marker, capsize=3, label=encoding,
                           linestyle=style, color=line.get_color())
    if one_hot is not None:
        n = one_hot["code_length"]
        left.axhline(100 * one_hot["test_accuracy_mean"], color="black",
                     label=f"one-hot (n = {n})")
        if one_hot["test_accuracy_ci95"]:
            left.axhspan(100 * one_hot["test_accuracy_ci95"][0],
                         100 * one_hot["test_accuracy_ci95"][1],
                         color="black", alpha=0.08)
    margin = results["settings"]["margin"]
    right.axhspan(-margin, margin, color="green", alpha=0.12,
                  label=f"±{margin:g} pt equivalence margin")
    right.axhline(0, color="black", linewidth=0.8)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bits k")
        ax.grid(alpha=0.3)
    left.set_ylabel("test accuracy (%)")
    left.set_title("CUB-50, fc7+fc8 retrained (mean, 95% CI)")
    right.set_ylabel("paired difference to one-hot (points)")
    right.set_title("difference to one-hot (mean, 95% CI)")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    return report.write_summary(fig, results, output_dir, name)
