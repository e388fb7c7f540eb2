"""Training building blocks shared by the demo, the experiments and notebooks.

- `build_backbone`: the small CNNs of the experiments (cifar_quick-like for
  28/32 px images, a deeper small CNN for 64 px birds).
- `make_codes`: re-export of `keras_ecoc.codes.make_codes` (a code matrix by
  encoding name: "gaussian", "spectral_median", ...).
- `feature_similarity`: the class-similarity matrix of data-based codes, from
  the class means of features of a network trained briefly with one-hot
  targets on the training split only.
- `train_and_evaluate`: fits one encoding and records test accuracy against
  training steps (`TrainResult`), for the demo.
- `make_optimizer`, `build_head`, `train_tracked`: the pieces of the
  experiments' runner (`ecoc_research.experiments.runner`): SGD/Adam with a step
  schedule, the fc7 + fc8 head retrained on frozen features, and a training
  loop that tracks validation accuracy against steps, keeps the
  best-validation weights and measures how many output units get a gradient.

Every model uses the same backbone, optimizer and hyper-parameters, so that
only the output encoding differs between runs.
"""

import dataclasses
import time

import keras
import numpy as np

from keras_ecoc import codes as codes_lib
from keras_ecoc.codes import registry
from keras_ecoc.models import DEFAULT_LEARNABLE_SCALE
from keras_ecoc.models import DEFAULT_SCALE
from keras_ecoc.models import ECOCClassifier

# The code registry lives in the library (`keras_ecoc.codes.make_codes`);
# re-exported here because the experiments look it up as `training.make_codes`.
ENCODINGS = registry.ENCODINGS
make_codes = codes_lib.make_codes

LEARNING_RATE = 1e-3


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
        dataset: a `ecoc_research.datasets.ImageDataset`.
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


OPTIMIZERS = ("sgd", "adam")


def make_optimizer(name="sgd", learning_rate=0.01, momentum=0.9,
                   drop_steps=(), drop_factor=0.1):
    """SGD (with momentum) or Adam, with an optional step schedule.

    Args:
        name: "sgd" or "adam".
        learning_rate: positive float, the initial learning rate.
        momentum: SGD momentum in [0, 1) (ignored by Adam).
        drop_steps: optimizer steps at which the rate is multiplied by
            `drop_factor` (increasing positive ints).
        drop_factor: the factor of each drop, in (0, 1].

    Returns:
        A `keras.optimizers.Optimizer`.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"Argument `optimizer` must be one of {OPTIMIZERS}. "
                         f"Received: optimizer={name!r}")
    if not (isinstance(learning_rate, (int, float)) and
            np.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError("Argument `learning_rate` must be a positive float. "
                         f"Received: learning_rate={learning_rate!r}")
    if not 0 <= momentum < 1:
        raise ValueError("Argument `momentum` must be in [0, 1). "
                         f"Received: momentum={momentum!r}")
    drop_steps = [int(s) for s in drop_steps]
    if any(s <= 0 for s in drop_steps) or drop_steps != sorted(set(drop_steps)):
        raise ValueError("Argument `drop_steps` must be increasing positive "
                         f"integers. Received: drop_steps={drop_steps!r}")
    rate = float(learning_rate)
    if drop_steps:
        rate = keras.optimizers.schedules.PiecewiseConstantDecay(
            drop_steps, [float(learning_rate) * drop_factor ** i
                         for i in range(len(drop_steps) + 1)])
    if name == "sgd":
        return keras.optimizers.SGD(rate, momentum=float(momentum))
    return keras.optimizers.Adam(rate)


def _glorot(rng, fan_in, fan_out):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, (fan_in, fan_out)).astype("float32")


def build_head(feature_dim, num_classes, codes=None, hidden=256, seed=0,
               scale=DEFAULT_SCALE, learnable_scale=DEFAULT_LEARNABLE_SCALE):
    """The re-initialised fc7 + fc8 head trained on frozen features.

    fc7 is Dense(hidden) + ReLU; fc8 is Dense(num_classes) (one-hot, softmax
    cross-entropy on its logits) or Dense(k) + ECOC decoding
    (`ECOCClassifier`). Both kernels are drawn Glorot-uniform from
    `numpy.random.default_rng(seed)`, fc7 first, biases zero: the same seed
    gives every encoding the SAME fc7 weights, so runs pair across encodings.

    Args:
        feature_dim: d, width of the frozen features (batch, d).
        num_classes: n.
        codes: (n, k) code matrix, or None for one-hot.
        hidden: width of fc7.
        seed: seed of the initial weights.
        scale, learnable_scale: ECOC decoding scale (ECOC heads only).

    Returns:
        An uncompiled Keras model mapping (batch, d) features to logits
        (batch, n) (one-hot) or z (batch, k) (ECOC).
    """
    inputs = keras.Input((int(feature_dim),), name="features")
    fc7 = keras.layers.Dense(int(hidden), activation="relu", name="fc7")
    trunk = keras.Model(inputs, fc7(inputs), name="fc7_trunk")
    if codes is None:
        fc8 = keras.layers.Dense(int(num_classes), name="fc8")
        model = keras.Model(inputs, fc8(trunk.output), name="one_hot_head")
    else:
        model = ECOCClassifier(trunk, codes, scale=scale,
                               learnable_scale=learnable_scale,
                               name="ecoc_head")
    rng = np.random.default_rng(seed)
    fc7.kernel.assign(_glorot(rng, int(feature_dim), int(hidden)))
    out = output_layer(model)
    out.kernel.assign(_glorot(rng, int(hidden), out.kernel.shape[1]))
    return model


def output_layer(model):
    """The output Dense layer: fc8 / logits (one-hot) or the ECOC projection."""
    if isinstance(model, ECOCClassifier):
        return model.projection
    for name in ("fc8", "logits"):
        try:
            return model.get_layer(name)
        except ValueError:
            continue
    raise ValueError("The model has no output layer named 'fc8' or 'logits' "
                     f"and is not an ECOCClassifier. Received: {model.name!r}")


def imprint_output_layer(model, x_train, y_train, num_classes):
    """Initialises a one-hot model's output layer from class means.

    The "imprinted" baseline: with h the features feeding the output layer
    AT INITIALISATION (e.g. the freshly initialised fc7's ReLU outputs) on
    the training images, m_c the mean of h over class c and m the mean over
    all training images, the output weights are w_c = (m_c - m) /
    ||m_c - m|| and the bias b_c = -w_c . m, so logit_c = w_c . (h - m):
    the cosine-like score of the centred features against each class's
    centred mean (centring removes the direction all ReLU features share).
    Uses only the training images, the same data as the data-based codes.
    """
    out = output_layer(model)
    feeding = keras.Model(model.inputs, out.input)
    h = np.asarray(feeding.predict(x_train, batch_size=1024, verbose=0),
                   np.float64)
    overall = h.mean(0)
    means = np.stack([h[y_train == c].mean(0) for c in range(num_classes)])
    centred = means - overall
    weights = centred / np.maximum(
        np.linalg.norm(centred, axis=1, keepdims=True), 1e-12)
    out.kernel.assign(weights.T.astype("float32"))
    out.bias.assign((-weights @ overall).astype("float32"))


def predict_classes_direct(model, x, chunk=2048):
    """Class ids by calling the model directly (no `predict` data pipeline).

    Calling the model on small arrays is ~10x cheaper than `model.predict`,
    which matters when the validation split is scored every few steps.
    """
    parts = []
    for i in range(0, len(x), chunk):
        out = model(x[i:i + chunk], training=False)
        if isinstance(model, ECOCClassifier):
            from keras_ecoc import ops as ecoc_ops

            out = ecoc_ops.nearest_codeword(out, model.decoder.codes)
            parts.append(np.asarray(keras.ops.convert_to_numpy(out)))
        else:
            parts.append(np.argmax(keras.ops.convert_to_numpy(out), -1))
    return np.concatenate(parts) if parts else np.zeros(0, int)


def output_gradient_rows(model, x, y):
    """Gradient of the mean training loss w.r.t. the output layer's kernel.

    Returns:
        float ndarray (units,): the norm of the gradient of each output
        unit's weight row (fc8's kernel transposed: n rows for one-hot, k
        for ECOC) on the batch (x, y).
    """
    kernel = output_layer(model).kernel
    loss_fn = model.loss
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grad = tape.gradient(loss, kernel.value)
    elif backend == "jax":
        import jax

        trainable = [v.value for v in model.trainable_variables]
        fixed = [v.value for v in model.non_trainable_variables]
        index = [id(v) for v in model.trainable_variables].index(id(kernel))

        def loss_of(kernel_value):
            values = list(trainable)
            values[index] = kernel_value
            out, _ = model.stateless_call(values, fixed, x, training=True)
            return loss_fn(y, out)

        grad = jax.grad(loss_of)(trainable[index])
    elif backend == "torch":
        import torch

        loss = loss_fn(y, model(x, training=True))
        (grad,) = torch.autograd.grad(loss, kernel.value)
    else:
        raise ValueError(f"Unsupported backend {backend!r} for gradients.")
    grad = np.asarray(keras.ops.convert_to_numpy(grad), np.float64)
    return np.linalg.norm(grad, axis=0)


def active_fraction(row_norms, threshold):
    """Fraction of rows whose gradient norm exceeds threshold x the max."""
    row_norms = np.asarray(row_norms, np.float64)
    top = row_norms.max(initial=0.0)
    if not np.isfinite(top) or top <= 0:
        return 0.0
    return float(np.mean(row_norms > threshold * top))


SPARSITY_THRESHOLDS = (1e-3, 1e-2, 1e-1)


class _Tracker(keras.callbacks.Callback):
    """Scores the validation split and the output-gradient sparsity.

    Called after every execution of `steps_per_execution` steps; the step
    count is read from the optimizer, so it is exact.
    """

    def __init__(self, x_val, y_val, x_train, y_train, order, batch_size,
                 thresholds, interval=1):
        super().__init__()
        self.interval = interval
        self.x_val, self.y_val = x_val, y_val
        self.x_train, self.y_train = x_train, y_train
        self.order, self.batch_size = order, batch_size
        self.thresholds = thresholds
        self.steps, self.val_accuracy = [], []
        self.sparsity_steps, self.sparsity = [], []
        self.best = (-1.0, 0, None)

    def _step(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _measure(self):
        step = self._step()
        if self.steps and self.steps[-1] == step:
            return
        accuracy = float(np.mean(
            predict_classes_direct(self.model, self.x_val) == self.y_val))
        self.steps.append(step)
        self.val_accuracy.append(accuracy)
        if accuracy > self.best[0]:
            self.best = (accuracy, step, self.model.get_weights())
        # Output-gradient sparsity on the batch the next step will use.
        start = (step * self.batch_size) % len(self.order)
        idx = self.order[start:start + self.batch_size]
        norms = output_gradient_rows(self.model, self.x_train[idx],
                                     self.y_train[idx])
        self.sparsity_steps.append(step)
        self.sparsity.append([active_fraction(norms, t)
                              for t in self.thresholds])

    def on_train_begin(self, logs=None):
        self._measure()

    def on_train_batch_end(self, batch, logs=None):
        # Every call under steps_per_execution = interval; every step where
        # the backend runs one step per call (PyTorch).
        if self._step() % self.interval == 0:
            self._measure()

    def on_train_end(self, logs=None):
        self._measure()


class _OrderedBatches(keras.utils.PyDataset):
    """The batches `x[order[i * b:(i + 1) * b]]`, gathered one at a time.

    `fit(x[order], ...)` would hold a copy of the training split per epoch:
    8 epochs of CIFAR-100 in float32 are 4.9 GB, more than a free Colab
    machine has left after the data. The batches and their order are the
    same, so are the numbers.
    """

    def __init__(self, x, y, order, batch_size):
        super().__init__()
        self.x, self.y = x, y
        self.order, self.batch_size = order, batch_size

    def __len__(self):
        return len(self.order) // self.batch_size

    def __getitem__(self, index):
        rows = self.order[index * self.batch_size:
                          (index + 1) * self.batch_size]
        return self.x[rows], self.y[rows]


def train_tracked(model, train, val, test, batch_size, epochs, seed,
                  evals_per_epoch=4, thresholds=SPARSITY_THRESHOLDS,
                  verbose=0):
    """Trains a compiled model; tracks validation accuracy against steps.

    The batch order is drawn from `numpy.random.default_rng(seed)`: every
    epoch is a permutation of the training split cut into
    floor(N / batch_size) full batches (the remainder of that permutation is
    left out of that epoch), so runs with the same seed see the same batches
    whatever their encoding. The validation split is scored at step 0,
    every ceil(steps_per_epoch / evals_per_epoch) steps and at the end; the
    weights of the first best validation score are kept, and the test split
    is scored twice: with those weights (the reported number) and with the
    final ones. At every validation point the output-gradient sparsity is
    measured on the batch of the next step (`output_gradient_rows`).

    Compile the model with `steps_per_execution(eval_interval(...))`: one
    traced call per evaluation interval (one call per step on PyTorch, where
    the tracker then skips the steps between validation points).

    Args:
        model: a compiled one-hot model or `ECOCClassifier`.
        train, val, test: (x, y) pairs; y int (N,).
        batch_size, epochs: the schedule.
        seed: seed of the batch order.
        evals_per_epoch: validation points per epoch.
        thresholds: relative thresholds of the sparsity measurement.

    Returns:
        dict: steps, val_accuracy (lists), best_step, best_val_accuracy,
        final_val_accuracy, test_accuracy (at best_step),
        final_test_accuracy, total_steps, steps_per_epoch, train_time (s),
        sparsity {thresholds, steps, fraction (T, len(thresholds))}.
    """
    x_train, y_train = train
    n = len(y_train)
    steps_per_epoch = n // batch_size
    if steps_per_epoch < 1:
        raise ValueError(
            f"Argument `batch_size` must be <= the {n} training examples. "
            f"Received: batch_size={batch_size}")
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(n)[:steps_per_epoch * batch_size]
                            for _ in range(epochs)])
    tracker = _Tracker(val[0], np.asarray(val[1]), x_train, y_train, order,
                       batch_size, tuple(thresholds),
                       interval=eval_interval(n, batch_size, evals_per_epoch))
    start = time.perf_counter()
    model.fit(_OrderedBatches(x_train, y_train, order, batch_size),
              epochs=1, shuffle=False, verbose=verbose, callbacks=[tracker])
    train_time = time.perf_counter() - start
    final_weights = model.get_weights()
    final_test = float(np.mean(predict_classes_direct(model, test[0])
                               == test[1]))
    best_val, best_step, best_weights = tracker.best
    model.set_weights(best_weights)
    best_test = float(np.mean(predict_classes_direct(model, test[0])
                              == test[1]))
    model.set_weights(final_weights)
    return {
        "steps": tracker.steps,
        "val_accuracy": tracker.val_accuracy,
        "best_step": best_step,
        "best_val_accuracy": best_val,
        "final_val_accuracy": tracker.val_accuracy[-1],
        "test_accuracy": best_test,
        "final_test_accuracy": final_test,
        "total_steps": steps_per_epoch * epochs,
        "steps_per_epoch": steps_per_epoch,
        "train_time": train_time,
        "sparsity": {"thresholds": list(thresholds),
                     "steps": tracker.sparsity_steps,
                     "fraction": tracker.sparsity},
    }


def eval_interval(num_train, batch_size, evals_per_epoch):
    """Steps between validation points (and the `steps_per_execution`)."""
    steps_per_epoch = max(1, num_train // batch_size)
    return max(1, int(np.ceil(steps_per_epoch / max(1, evals_per_epoch))))


def steps_per_execution(steps):
    """`steps` optimizer steps per traced call, or 1 where Keras allows no more.

    Keras' PyTorch trainer refuses `steps_per_execution` > 1; there every step
    is its own call (slower per step, same numbers: the callbacks that score
    validation points check the step count themselves).
    """
    return 1 if keras.backend.backend() == "torch" else int(steps)
