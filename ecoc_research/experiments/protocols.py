"""Data splits and the pretrained backbone of the `retrain` protocol.

The paper's convergence figures retrain the last two fully connected layers
(fc7, fc8) of a network pretrained on the same data (ImageNet, Places:
variant "same") or fine-tune it on new classes (CUB: variant "transfer").
Here:

- `split_task`: the retraining classes' train / validation / test arrays and
  the pretraining set. The validation split is carved from the training
  split, `val_per_class` images of every class drawn with `data_seed`
  (independent of the training seed); it drives model selection and the
  learning-rate choice, the test split is scored once per run.
  "transfer" splits Omniglot by alphabet (class names "Alphabet/characterNN"):
  the alphabets in sorted order go alternately to pretraining (even
  positions) and retraining (odd positions); class names without an
  alphabet prefix alternate class by class.
- `Pretrained`: the one-hot network pretrained to a plateau on its own
  validation split, trained ONCE and cached under `<output>/pretrain/`, keyed
  by every setting it depends on. Its fc6 outputs are the frozen features the
  heads retrain on; its fc7 outputs on the retraining classes' TRAINING
  images give the class similarity of data-based codes. Every head trains
  for the same budget, but the codes carry information from the pretrained
  fc7 that the re-initialised heads do not start with (the imprinted
  one-hot head is the control for that).
"""

import dataclasses
import fcntl
import hashlib
import json
import os

import numpy as np

from ecoc_research.experiments import common


@dataclasses.dataclass
class Task:
    """Arrays of one run's classes (labels 0..n-1) and its pretraining set.

    Attributes:
        name: data set name.
        class_names: the n retraining classes.
        train, val, test: (x, y) of the retraining classes.
        pretrain_train, pretrain_val: (x, y) of the pretraining set (labels
            0..n_pre-1); the retraining classes themselves for "same".
        pretrain_classes: names of the pretraining classes.
    """

    name: str
    class_names: list
    train: tuple
    val: tuple
    test: tuple
    pretrain_train: tuple
    pretrain_val: tuple
    pretrain_classes: list

    @property
    def num_classes(self):
        return len(self.class_names)


def validation_split(labels, per_class, seed):
    """Stratified split of a training split: (train indices, val indices).

    Args:
        labels: int (N,) labels.
        per_class: validation images per class (>= 1, and every class must
            keep at least one training image).
        seed: seed of the draw (independent of the training seed).
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    val = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) <= per_class:
            raise ValueError(
                f"Argument `val_per_class` must leave at least one training "
                f"image per class; class {c} has {len(idx)}. Received: "
                f"val_per_class={per_class}")
        val.append(rng.permutation(idx)[:per_class])
    val = np.sort(np.concatenate(val))
    train = np.setdiff1d(np.arange(len(labels)), val)
    return train, val


def transfer_split(class_names):
    """(pretraining class ids, retraining class ids) of the transfer variant.

    Classes named "group/name" (Omniglot: "Alphabet/characterNN") are split
    by group: the sorted groups alternate, even positions pretrain, odd ones
    retrain. Other names alternate class by class.
    """
    names = list(class_names)
    if all("/" in name for name in names):
        groups = sorted({name.split("/")[0] for name in names})
        retrain_groups = set(groups[1::2])
        retrain = [i for i, name in enumerate(names)
                   if name.split("/")[0] in retrain_groups]
    else:
        retrain = list(range(1, len(names), 2))
    pretrain = sorted(set(range(len(names))) - set(retrain))
    if not pretrain or not retrain:
        raise ValueError("The transfer variant needs at least two classes "
                         f"(groups). Received: {len(names)} classes")
    return np.array(pretrain), np.array(retrain)


def _select(x, y, classes):
    """Rows of `classes`, relabelled by their position in `classes`."""
    new_id = np.full(int(max(y.max(initial=0), max(classes))) + 1, -1)
    new_id[classes] = np.arange(len(classes))
    keep = new_id[y] >= 0 if len(y) else np.zeros(0, bool)
    return x[keep], new_id[y[keep]].astype("int32")


def split_task(data, protocol, variant, classes, val_per_class, data_seed,
               pretrain_data=None):
    """Builds the `Task` of a run from an `ImageDataset`.

    Args:
        data: `ImageDataset` (all classes).
        protocol: "scratch", "retrain" or "finetune".
        variant: "same", "transfer" or "external" ("scratch" uses "same").
        classes: keep so many retraining classes (None: all), drawn with
            `data_seed` among the retraining classes.
        val_per_class: validation images per class, carved from training.
        data_seed: seed of the class draw and of the validation split.
        pretrain_data: the pretraining `ImageDataset` of the "external"
            variant (e.g. CIFAR-10 for CUB: a separate data set whose classes
            are disjoint from the retraining ones); its validation split is
            drawn by the same rule (`validation_split`, `val_per_class`,
            `data_seed`). None for the other variants.
    """
    if (variant == "external") != (pretrain_data is not None):
        raise ValueError(
            "Argument `pretrain_data` must be given for variant='external' "
            "and only for it. Received: variant="
            f"{variant!r} with pretrain_data "
            f"{'given' if pretrain_data is not None else 'None'}")
    if variant == "external":
        if data.input_shape[-1] == 1 and pretrain_data.input_shape[-1] == 3:
            # Grayscale retraining data on an RGB backbone: three equal
            # channels.
            data = dataclasses.replace(
                data, x_train=np.repeat(data.x_train, 3, -1),
                x_test=np.repeat(data.x_test, 3, -1))
        if tuple(data.input_shape) != tuple(pretrain_data.input_shape):
            raise ValueError(
                f"The retraining images have shape {tuple(data.input_shape)} "
                "but the pretraining images "
                f"{tuple(pretrain_data.input_shape)}: load both at one "
                "`image_size`.")
        pre_ids = np.arange(pretrain_data.num_classes)
        re_ids = np.arange(data.num_classes)
    elif variant == "transfer":
        pre_ids, re_ids = transfer_split(data.class_names)
    else:
        pre_ids = re_ids = np.arange(data.num_classes)
    if classes is not None:
        if classes > len(re_ids):
            raise ValueError(
                f"Argument `classes` must be at most the {len(re_ids)} "
                f"retraining classes. Received: classes={classes}")
        rng = np.random.default_rng(data_seed)
        re_ids = np.sort(rng.choice(re_ids, int(classes), replace=False))
        if variant == "same":
            pre_ids = re_ids
    x_tr, y_tr = _select(data.x_train, data.y_train, re_ids)
    x_te, y_te = _select(data.x_test, data.y_test, re_ids)
    tr, va = validation_split(y_tr, val_per_class, data_seed)
    if variant == "same":
        pre_train, pre_val = (x_tr[tr], y_tr[tr]), (x_tr[va], y_tr[va])
    elif variant == "external":
        py = np.asarray(pretrain_data.y_train, np.int32)
        ptr, pva = validation_split(py, val_per_class, data_seed)
        pre_train = (pretrain_data.x_train[ptr], py[ptr])
        pre_val = (pretrain_data.x_train[pva], py[pva])
    else:
        px, py = _select(data.x_train, data.y_train, pre_ids)
        ptr, pva = validation_split(py, val_per_class, data_seed)
        pre_train, pre_val = (px[ptr], py[ptr]), (px[pva], py[pva])
    return Task(
        name=data.name,
        class_names=[data.class_names[i] for i in re_ids],
        train=(x_tr[tr], y_tr[tr]), val=(x_tr[va], y_tr[va]),
        test=(x_te, y_te), pretrain_train=pre_train, pretrain_val=pre_val,
        pretrain_classes=[
            (data if pretrain_data is None else pretrain_data).class_names[i]
            for i in pre_ids],
    )


# The pretrained network must be clearly above chance before any head is
# trained on its features: best validation accuracy >= CHANCE_MULTIPLE / n
# (n pretraining classes), capped at halfway between chance and 100% for
# n < 2 * CHANCE_MULTIPLE, where CHANCE_MULTIPLE / n would exceed it. On a
# 3,755-class set (1,878 pretraining classes) the default pretraining once
# ended at 0.1% (chance 0.05%) and the heads trained on dead features.
CHANCE_MULTIPLE = 3.0


# The command line's pretraining recipe (Adam rate, batch) by the number of
# pretraining classes. Measured with `pretrain_recipes` on generated glyphs
# (docs/results/many_classes/): with 1,500 pretraining classes of 9 images
# (hard glyphs) Adam 1e-3 at batch 32 stayed at chance for 3 epochs (0.07%)
# while Adam 3e-4 at batch 128 reached 8.8%; with 1,000 easier classes both
# learned (Adam 1e-3 / 32 faster). Below MANY_CLASSES the recipe behind every
# stored result stays.
MANY_CLASSES = 1000
FEW_CLASS_RECIPE = (1e-3, 32)
MANY_CLASS_RECIPE = (3e-4, 128)


def pretrain_recipe(num_classes):
    """(Adam learning rate, batch size) of the one-hot pretraining."""
    return MANY_CLASS_RECIPE if num_classes >= MANY_CLASSES else FEW_CLASS_RECIPE


class PretrainingFailed(common.UsageError):
    """The pretrained network is near chance: no head should train on it."""


def chance_threshold(num_classes, multiple=CHANCE_MULTIPLE):
    """The least best-validation accuracy a pretraining must reach."""
    chance = 1.0 / num_classes
    return min(multiple * chance, (1.0 + chance) / 2)


def check_above_chance(record, num_classes, multiple=CHANCE_MULTIPLE):
    """Raises `PretrainingFailed` when a pretraining record is near chance.

    Args:
        record: the pretraining record (`best_val_accuracy`, `settings`).
        num_classes: pretraining classes n.
        multiple: the accuracy must reach min(multiple / n, (1 + 1/n) / 2);
            0 disables the check.
    """
    if not multiple:
        return
    threshold = chance_threshold(num_classes, multiple)
    best = record["best_val_accuracy"]
    if best >= threshold:
        return
    s = record["settings"]
    raise PretrainingFailed(
        f"The pretrained network is near chance: best validation accuracy "
        f"{100 * best:.2f}% on {num_classes} pretraining classes (chance "
        f"{100 / num_classes:.2f}%, required {100 * threshold:.2f}% = "
        f"min({multiple:g} x chance, halfway to 100%)), after "
        f"{record.get('epochs_run', '?')} epochs of Adam "
        f"{s['pretrain_learning_rate']:g} at batch "
        f"{s['pretrain_batch_size']}. No head was trained on its features. "
        "With many classes, try a lower rate and a larger batch (e.g. "
        "--pretrain-learning-rate 3e-4 --pretrain-batch-size 128), more "
        "--pretrain-epochs or --pretrain-patience; "
        "--min-pretrain-chance-multiple 0 disables this check.")


def build_pretrain_network(input_shape, num_classes, hidden):
    """conv backbone + fc6 ("features", 256) + fc7 (hidden) + fc8 (n)."""
    import keras

    from ecoc_research import training

    backbone = training.build_backbone(input_shape)
    h = keras.layers.Dense(hidden, activation="relu", name="fc7")(
        backbone.output)
    logits = keras.layers.Dense(num_classes, name="fc8")(h)
    return keras.Model(backbone.input, logits, name="pretrained")


class Pretrained:
    """The pretrained one-hot network of a pretraining key, cached on disk.

    Args:
        settings: dict of every setting the pretraining depends on (its key).
        cache_dir: folder of the cache (`<output>/pretrain`).
    """

    def __init__(self, settings, cache_dir):
        self.settings = dict(settings)
        blob = json.dumps(self.settings, sort_keys=True).encode()
        self.key = hashlib.sha1(blob).hexdigest()[:16]
        self.cache_dir = cache_dir
        self.weights_path = os.path.join(cache_dir, f"{self.key}.weights.h5")
        self.record_path = os.path.join(cache_dir, f"{self.key}.json")
        self.model = None
        self.record = None

    def load_or_train(self, task, verbose=0):
        """Loads the cached weights, or pretrains (one process at a time)."""
        import keras

        os.makedirs(self.cache_dir, exist_ok=True)
        s = self.settings
        # Seeded before the network is built, not only before it trains: the
        # initial weights are part of what the pretraining key stands for, so
        # two runs with one key (and the codes built from their fc7) agree.
        keras.utils.set_random_seed(s["pretrain_seed"])
        self.model = build_pretrain_network(
            task.pretrain_train[0].shape[1:], len(task.pretrain_classes),
            s["hidden"])
        # A lock, so parallel workers sharing an output folder pretrain once
        # and all retrain from the same weights.
        with open(os.path.join(self.cache_dir, f"{self.key}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(self.record_path):
                with open(self.record_path) as f:
                    stored = json.load(f)
                if stored["settings"] != s:
                    raise ValueError(
                        f"The pretraining cache {self.record_path} holds "
                        "other settings than this run's; use another "
                        "--output or --overwrite.")
                self.model.load_weights(self.weights_path)
                self.record = stored
            else:
                self.record = self._train(task, verbose)
            fcntl.flock(lock, fcntl.LOCK_UN)
        return self

    def _train(self, task, verbose):
        import time

        import keras

        s = self.settings
        # Seeded again: shuffling and dropout draw the same numbers whether or
        # not anything ran between building and training.
        keras.utils.set_random_seed(s["pretrain_seed"])
        self.model.compile(
            optimizer=keras.optimizers.Adam(s["pretrain_learning_rate"]),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"])
        stop = keras.callbacks.EarlyStopping(
            monitor="val_accuracy", patience=s["pretrain_patience"],
            restore_best_weights=True)
        common.log(f"  pretraining ({len(task.pretrain_classes)} classes, "
                   f"{len(task.pretrain_train[1])} images, up to "
                   f"{s['pretrain_epochs']} epochs, early stop on validation)")
        start = time.perf_counter()
        history = self.model.fit(
            *task.pretrain_train, validation_data=task.pretrain_val,
            batch_size=s["pretrain_batch_size"], epochs=s["pretrain_epochs"],
            shuffle=True, verbose=verbose, callbacks=[stop])
        wall = time.perf_counter() - start
        val = [float(v) for v in history.history["val_accuracy"]]
        record = {"settings": s, "key": self.key,
                  "val_accuracy_per_epoch": val,
                  "best_val_accuracy": max(val),
                  "best_epoch": int(np.argmax(val)) + 1,
                  "epochs_run": len(val), "wall_time": wall,
                  "pretrain_classes": len(task.pretrain_classes),
                  "pretrain_images": int(len(task.pretrain_train[1]))}
        tmp = self.weights_path + ".tmp.weights.h5"
        self.model.save_weights(tmp)
        os.replace(tmp, self.weights_path)
        common.log(f"  pretrained: best validation accuracy "
                   f"{record['best_val_accuracy']:.3f} at epoch "
                   f"{record['best_epoch']} of {len(val)} ({wall:.0f} s)")
        with open(self.record_path + ".tmp", "w") as f:
            json.dump(record, f, indent=1)
        os.replace(self.record_path + ".tmp", self.record_path)
        return record

    def layer_outputs(self, name, x):
        """Outputs of layer `name` ("features" = fc6, "fc7") on images x."""
        import keras

        extractor = keras.Model(self.model.input,
                                self.model.get_layer(name).output)
        # Direct calls in chunks, not `predict`: a fresh `predict` function
        # per extractor and split made TensorFlow warn about retracing.
        chunks = [keras.ops.convert_to_numpy(extractor(x[i:i + 512], training=False))
                  for i in range(0, len(x), 512)]
        if not chunks:
            return np.zeros((0, extractor.output.shape[-1]), np.float32)
        return np.concatenate(chunks).astype(np.float32, copy=False)


def copy_pretrained_fc7(model, pretrained_model):
    """Sets `model`'s fc7 to the pretrained network's fc7 (kernel and bias).

    The "one_hot_imprinted_pretrained" control starts from the pretrained
    fc7, the layer whose activations give data-based codes their class
    similarity, instead of a re-initialised one.
    """
    from ecoc_research import training

    fc7 = _find_layer(model, "fc7")
    source = pretrained_model.get_layer("fc7")
    if tuple(fc7.kernel.shape) != tuple(source.kernel.shape):
        raise ValueError(
            f"The model's fc7 has shape {tuple(fc7.kernel.shape)} but the "
            f"pretrained fc7 has {tuple(source.kernel.shape)}: use the "
            "pretraining's `hidden` width.")
    fc7.set_weights(source.get_weights())
    return training.output_layer(model)


def _find_layer(model, name):
    """Layer `name` of a functional model or of an ECOCClassifier's backbone."""
    for candidate in [model] + [getattr(model, "backbone", None)]:
        if candidate is None:
            continue
        try:
            return candidate.get_layer(name)
        except (ValueError, AttributeError):
            continue
    raise ValueError(f"The model has no layer named {name!r}. Received: "
                     f"{model.name!r}")


def build_finetune_network(pretrained_model, num_classes, codes=None,
                           hidden=256, seed=0, scale=1.0,
                           learnable_scale=True):
    """The whole network, fine-tuned: pretrained conv blocks and fc6, new head.

    The paper's CUB protocol fine-tunes every layer of the pretrained
    network with fc8 replaced for the new classes. Here the conv blocks and
    fc6 ("features") copy the pretrained weights; fc7 (Dense(hidden) + ReLU)
    and fc8 (Dense(n) one-hot, or Dense(k) + ECOC decoding) are
    re-initialised exactly as `training.build_head` does (Glorot-uniform from
    `numpy.random.default_rng(seed)`, fc7 first, biases zero), so one seed
    gives every encoding the same new weights.

    Args:
        pretrained_model: the `build_pretrain_network` model (pretrained).
        num_classes: n, the retraining classes.
        codes: (n, k) code matrix, or None for one-hot.
        hidden: width of fc7.
        seed: seed of the re-initialised weights.
        scale, learnable_scale: ECOC decoding scale.

    Returns:
        An uncompiled model mapping images (batch, H, W, C) to logits
        (batch, n) or, for an `ECOCClassifier`, z (batch, k).
    """
    import keras

    from ecoc_research import training
    from keras_ecoc.models import ECOCClassifier

    input_shape = tuple(pretrained_model.input.shape[1:])
    backbone = training.build_backbone(input_shape)
    for layer in backbone.layers:
        if layer.weights:
            layer.set_weights(
                pretrained_model.get_layer(layer.name).get_weights())
    fc7 = keras.layers.Dense(int(hidden), activation="relu", name="fc7")
    trunk = keras.Model(backbone.input, fc7(backbone.output),
                        name="finetune_trunk")
    if codes is None:
        fc8 = keras.layers.Dense(int(num_classes), name="fc8")
        model = keras.Model(trunk.input, fc8(trunk.output),
                            name="one_hot_finetune")
    else:
        model = ECOCClassifier(trunk, codes, scale=scale,
                               learnable_scale=learnable_scale,
                               name="ecoc_finetune")
    rng = np.random.default_rng(seed)
    fc7.kernel.assign(training._glorot(rng, int(fc7.kernel.shape[0]),
                                       int(hidden)))
    out = training.output_layer(model)
    out.kernel.assign(training._glorot(rng, int(hidden),
                                       int(out.kernel.shape[1])))
    return model


def class_similarity_from_features(features, labels, num_classes):
    """Cosine similarity of class means (`keras_ecoc.codes.class_similarity`)."""
    from keras_ecoc import codes as codes_lib

    return np.asarray(codes_lib.class_similarity(
        features, labels, num_classes=num_classes, kernel="cosine"))
