"""Training building blocks shared by the demo, the experiments and notebooks.

- `build_backbone`: the small CNNs of the experiments (cifar_quick-like for
  28/32 px images, a deeper small CNN for 64 px birds).
- `make_codes`: a code matrix by encoding name ("one_hot", "gaussian",
  "spectral_median", ...).
- `feature_similarity`: the class-similarity matrix of data-based codes, from
  the class means of features of a network trained briefly with one-hot
  targets on the training split only.
- `train_and_evaluate`: fits one encoding and records test accuracy against
  training steps (`TrainResult`), for convergence comparisons.

Every model uses the same backbone, optimizer and hyper-parameters, so that
only the output encoding differs between runs.
"""

import dataclasses
import time

import keras
import numpy as np

from keras_ecoc import codes as codes_lib
from keras_ecoc.models import DEFAULT_LEARNABLE_SCALE
from keras_ecoc.models import DEFAULT_SCALE
from keras_ecoc.models import ECOCClassifier

# Encodings by name -> (generator, threshold). "data" encodings need a
# class-similarity matrix. "one_hot" is the usual Dense(n) + softmax baseline.
ENCODINGS = {
    "one_hot": None,
    "dense_random": ("dense_random", None),
    "hadamard": ("hadamard", None),
    "gaussian": ("gaussian", None),
    "gaussian_zero": ("gaussian", "zero"),
    "gaussian_median": ("gaussian", "median"),
    "spectral": ("spectral", None),
    "spectral_zero": ("spectral", "zero"),
    "spectral_median": ("spectral", "median"),
}

LEARNING_RATE = 1e-3


def make_codes(
    encoding, num_classes, code_length, similarity=None, seed=0,
    normalize_rows=True,
):
    """Code matrix (num_classes, code_length) for an encoding name.

    Raw Gaussian and raw spectral codewords have unequal norms, which biases
    decoding against z / ||z|| (see `keras_ecoc.codes.normalize_rows`); by
    default they are rescaled to the common norm sqrt(code_length) of ±1
    codes. Thresholded and ±1 codes are unchanged by this.

    Args:
        encoding: a key of `ENCODINGS` other than "one_hot".
        num_classes: n.
        code_length: k.
        similarity: (n, n) class similarity, required by "spectral*".
        seed: random seed of the random encodings.
        normalize_rows: rescale every codeword to norm sqrt(code_length).

    Returns:
        float32 ndarray (num_classes, code_length).
    """
    if encoding not in ENCODINGS or encoding == "one_hot":
        raise ValueError(
            f"Argument `encoding` must be one of "
            f"{sorted(set(ENCODINGS) - {'one_hot'})}. Received: "
            f"encoding={encoding!r}"
        )
    codes = _codes_for(encoding, num_classes, code_length, similarity, seed)
    return codes_lib.normalize_rows(codes) if normalize_rows else codes


def _codes_for(encoding, num_classes, code_length, similarity, seed):
    family, threshold = ENCODINGS[encoding]
    if family == "spectral":
        if similarity is None:
            raise ValueError(
                f"Encoding {encoding!r} is data-based and needs a class "
                "similarity matrix. Received: similarity=None"
            )
        return codes_lib.spectral(similarity, code_length, threshold=threshold)
    if family == "gaussian":
        codes = codes_lib.gaussian(num_classes, code_length, seed=seed)
        return codes if threshold is None else codes_lib.binarize(codes, threshold)
    if family == "hadamard":
        return codes_lib.hadamard(num_classes, code_length)
    return codes_lib.dense_random(num_classes, code_length, seed=seed)


def build_backbone(input_shape, name=None):
    """A small CNN feature extractor (no classifier head).

    28x28 and 32x32 inputs get a cifar_quick-like network (conv 32-32-64,
    dense 256); larger inputs (64x64 birds) one more conv block and 128-wide
    convolutions. Output: (batch, 256) features.
    """
    height = input_shape[0]
    inputs = keras.Input(input_shape)
    x = inputs
    widths = (32, 32, 64) if height <= 32 else (32, 64, 128, 128)
    # No batch normalization, as in cifar_quick: at the small mini-batches
    # the comparison is about, it trained slower on Omniglot for every
    # encoding (one-hot 32% vs 35% test accuracy after 3 epochs at batch 16).
    for i, width in enumerate(widths):
        x = keras.layers.Conv2D(
            width, 3, padding="same", activation="relu", name=f"conv{i}"
        )(x)
        x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(256, activation="relu", name="features")(x)
    return keras.Model(inputs, x, name=name or "backbone")


def build_model(
    input_shape,
    num_classes,
    codes=None,
    scale=DEFAULT_SCALE,
    learnable_scale=DEFAULT_LEARNABLE_SCALE,
    dropout=0.0,
    learning_rate=LEARNING_RATE,
    jit_compile="auto",
):
    """A compiled classifier: one-hot (`codes=None`) or `ECOCClassifier`.

    No dropout by default: dropout in front of a k-unit ECOC projection
    slowed learning sharply (Omniglot, k = 32, batch 16, 3 epochs: 9.5% test
    accuracy with dropout 0.3 against 17.7% without), and every encoding
    gets the same hyper-parameters.
    """
    backbone = build_backbone(input_shape)
    optimizer = keras.optimizers.Adam(learning_rate)
    if codes is None:
        x = keras.layers.Dropout(dropout)(backbone.output)
        logits = keras.layers.Dense(num_classes, name="logits")(x)
        model = keras.Model(backbone.input, logits, name="one_hot")
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=jit_compile,
        )
        return model
    model = ECOCClassifier(
        backbone, codes, scale=scale, learnable_scale=learnable_scale,
        dropout=dropout, name="ecoc",
    )
    model.compile(optimizer=optimizer, jit_compile=jit_compile)
    return model


def predict_labels(model, x, batch_size=512):
    """Class ids predicted by a one-hot model or an `ECOCClassifier`."""
    if isinstance(model, ECOCClassifier):
        return model.predict_classes(x, batch_size=batch_size, verbose=0)
    return np.argmax(model.predict(x, batch_size=batch_size, verbose=0), -1)


class StepEvaluation(keras.callbacks.Callback):
    """Records test accuracy every `every` training steps (and at the end).

    Args:
        x: (N, ...) evaluation inputs.
        y: (N,) labels.
        every: evaluate after every so many optimizer steps.
    """

    def __init__(self, x, y, every):
        super().__init__()
        self.x, self.y, self.every = x, np.asarray(y), int(every)
        self.steps, self.accuracies = [], []
        self._step = 0

    def _evaluate(self):
        accuracy = float(np.mean(predict_labels(self.model, self.x) == self.y))
        self.steps.append(self._step)
        self.accuracies.append(accuracy)

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self._step % self.every == 0:
            self._evaluate()

    def on_train_end(self, logs=None):
        if not self.steps or self.steps[-1] != self._step:
            self._evaluate()


@dataclasses.dataclass
class TrainResult:
    """What one training run measured.

    Attributes:
        encoding: encoding name.
        code_length: k (n for one-hot).
        batch_size: mini-batch size.
        steps: (T,) optimizer steps at which the test accuracy was measured.
        accuracies: (T,) test accuracy at those steps.
        epoch_accuracies: test accuracy after each epoch.
        final_accuracy: test accuracy at the end.
        wall_time: seconds spent in `fit` (evaluation included).
        final_scale: the decoding scale at the end (None for one-hot).
    """

    encoding: str
    code_length: int
    batch_size: int
    steps: list
    accuracies: list
    epoch_accuracies: list
    final_accuracy: float
    wall_time: float
    final_scale: float = None

    def steps_to(self, accuracy):
        """First measured step with test accuracy >= `accuracy`, or None."""
        for step, value in zip(self.steps, self.accuracies):
            if value >= accuracy:
                return step
        return None

    def to_dict(self):
        return dataclasses.asdict(self)


class _EpochAccuracy(keras.callbacks.Callback):
    def __init__(self, step_eval):
        super().__init__()
        self.step_eval, self.values = step_eval, []

    def on_epoch_end(self, epoch, logs=None):
        if not self.step_eval.steps or self.step_eval.steps[-1] != self.step_eval._step:
            self.step_eval._evaluate()
        self.values.append(self.step_eval.accuracies[-1])


def train_and_evaluate(
    dataset,
    encoding="one_hot",
    codes=None,
    batch_size=16,
    epochs=5,
    eval_every=None,
    seed=0,
    verbose=1,
    **model_kwargs,
):
    """Trains one encoding on `dataset` and records its test-accuracy curve.

    Args:
        dataset: a `keras_ecoc.datasets.ImageDataset`.
        encoding: name for the record ("one_hot" trains the Dense(n) model).
        codes: (n, k) code matrix for ECOC encodings, None for one-hot.
        batch_size: mini-batch size.
        epochs: passes over the training split.
        eval_every: steps between test-accuracy measurements (default: 5
            per epoch).
        seed: seeds weights and shuffling.
        verbose: Keras `fit` verbosity (1 = progress bars).
        **model_kwargs: passed to `build_model` (scale, learnable_scale,
            dropout, learning_rate, jit_compile).

    Returns:
        A `TrainResult`.
    """
    keras.utils.set_random_seed(seed)
    model = build_model(
        dataset.input_shape, dataset.num_classes, codes=codes, **model_kwargs
    )
    steps_per_epoch = int(np.ceil(len(dataset.y_train) / batch_size))
    every = eval_every or max(1, steps_per_epoch // 5)
    step_eval = StepEvaluation(dataset.x_test, dataset.y_test, every)
    epoch_eval = _EpochAccuracy(step_eval)
    start = time.perf_counter()
    model.fit(
        dataset.x_train, dataset.y_train, batch_size=batch_size, epochs=epochs,
        shuffle=True, verbose=verbose, callbacks=[step_eval, epoch_eval],
    )
    wall_time = time.perf_counter() - start
    final_scale = None
    if isinstance(model, ECOCClassifier):
        final_scale = float(keras.ops.convert_to_numpy(model.decoder.scale))
    return TrainResult(
        encoding=encoding,
        code_length=dataset.num_classes if codes is None else codes.shape[1],
        batch_size=batch_size,
        steps=step_eval.steps,
        accuracies=step_eval.accuracies,
        epoch_accuracies=epoch_eval.values,
        final_accuracy=step_eval.accuracies[-1],
        wall_time=wall_time,
        final_scale=final_scale,
    )


def feature_similarity(
    dataset, epochs=2, batch_size=64, kernel="cosine", seed=0, verbose=0,
    return_model=False,
):
    """Class similarity for data-based codes, from the training split only.

    Trains the one-hot model briefly, takes its penultimate ("features")
    activations on the training images and turns their class means into a
    similarity with `keras_ecoc.codes.class_similarity`. The test split never
    feeds the codes.

    Returns:
        float (n, n) similarity (and the trained model if `return_model`).
    """
    keras.utils.set_random_seed(seed)
    model = build_model(dataset.input_shape, dataset.num_classes, codes=None)
    model.fit(
        dataset.x_train, dataset.y_train, batch_size=batch_size, epochs=epochs,
        shuffle=True, verbose=verbose,
    )
    extractor = keras.Model(model.input, model.get_layer("features").output)
    features = extractor.predict(dataset.x_train, batch_size=512, verbose=0)
    similarity = codes_lib.class_similarity(
        features, dataset.y_train, num_classes=dataset.num_classes, kernel=kernel
    )
    if return_model:
        return similarity, model
    return similarity
