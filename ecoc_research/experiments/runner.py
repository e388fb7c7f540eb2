"""One shared runner for every training run of the experiments.

A run is fully described by a `RunSpec` (data, protocol, encoding, code
length, optimizer, learning rate, batch size, epochs, seed, ...): every field
is part of its key. `Runner.run(spec)` trains it and writes
`<output>/runs/<key>.json` as soon as it finishes: the settings, the
environment, the validation-accuracy curve (step, accuracy), the step of the
best validation accuracy, the test accuracy with those weights (the reported
number) and at the end, wall times and the output-gradient sparsity.

Protocols:

- "retrain" (the paper's): a one-hot network pretrained once to a plateau
  (`protocols.Pretrained`, cached under `<output>/pretrain/`); every encoding
  then starts from the same frozen fc6 features, with fc7 (Dense + ReLU) and
  fc8 (Dense(n) or Dense(k) + ECOC decoding) re-initialised from the run's
  seed and trained. Variants "same" (retrain on the pretraining classes) and
  "transfer" (pretrain on half of the classes / alphabets, retrain on the
  others).
- "scratch": the whole CNN (`training.build_model`) trained from random
  weights; data-based codes take their similarity from the "same" pretrained
  network's fc7 features (extra training the baselines do not get).

Speed (measured on the shared 2-core machine, TF 2.21 CPU, a 256-256-121
head at batch 16): Keras `fit` costs ~1.6 ms per step with one step per
call, ~1.0-1.4 ms with `steps_per_execution=50` (XLA on or off); the rest
is Keras's per-step data handling. XLA (`jit_compile=True`) adds 2-4 s of
compilation to every run (a new model each time), which outweighs its
per-step gain at these run lengths (one epoch at batch 16: 2.7-6.7 s with
XLA, 1.4-2.2 s without), so the runner compiles WITHOUT XLA and with
`steps_per_execution` = the validation interval, and scores the validation
split by calling the model directly (`predict` re-traces and costs ~10x
more on a few hundred rows). The JAX backend ran the fit loop at 0.3-0.75
ms per step (XLA); the smoke grid runs on the TensorFlow, JAX and PyTorch
backends.
"""

import dataclasses
import glob
import hashlib
import json
import math
import os
import time

import numpy as np

from ecoc_research.experiments import common
from ecoc_research.experiments import protocols

PROTOCOLS = ("scratch", "retrain", "finetune")
VARIANTS = ("same", "transfer", "external")
# Encodings whose row normalisation matters (raw real-valued codewords have
# unequal norms); for the others `normalize_rows` is None.
ROW_NORM_ENCODINGS = ("gaussian", "spectral")
# "one_hot_imprinted": fc8 imprinted from the re-initialised fc7's outputs;
# "one_hot_imprinted_pretrained": fc7 starts as the PRETRAINED fc7 (whose
# activations give data-based codes their class similarity) and fc8 is
# imprinted from its outputs: the control that gets the information the
# spectral code gets.
IMPRINTED_ENCODINGS = ("one_hot_imprinted", "one_hot_imprinted_pretrained")
ENCODINGS = ("one_hot", "one_hot_imprinted", "one_hot_imprinted_pretrained",
             "dense_random", "hadamard",
             "gaussian", "gaussian_zero", "gaussian_median", "spectral",
             "spectral_zero", "spectral_median")
DATA_ENCODINGS = common.DATA_ENCODINGS


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Every setting of one run; all fields form its key.

    Attributes:
        dataset: "embedded", a .npz path or a tensorflow-datasets name.
        image_size: resize to (size, size), None: as stored.
        train_per_class, test_per_class: per-class caps (None: all).
        dedupe: drop classes duplicating another's images.
        classes: retraining classes kept (None: all), drawn with data_seed.
        val_per_class: validation images per class carved from training.
        data_seed: seed of the validation split and class draw.
        protocol: "retrain" (fc7 + fc8 on frozen fc6 features),
            "finetune" (the whole pretrained network, fc7 + fc8
            re-initialised) or "scratch".
        variant: "transfer", "same" (scratch: "same") or "external"
            (pretrain on `pretrain_dataset`, retrain on all of `dataset`).
        pretrain_dataset: the pretraining data set of the "external"
            variant (None otherwise; left out of the key when None, so
            runs stored before the field existed keep their keys).
        pretrain_per_class: keep at most so many training images per class
            of `pretrain_dataset` (None: all; for smoke runs).
        pretrain_epochs, pretrain_batch_size, pretrain_learning_rate,
        pretrain_patience, pretrain_seed: the one-hot pretraining (Adam,
            early stopping on its validation split, best weights kept).
        hidden: width of fc7.
        encoding: a name of `ENCODINGS`.
        code_length: k (None for one-hot: n outputs).
        normalize_rows: rescale raw Gaussian / spectral codewords to norm
            sqrt(k) (None where it changes nothing).
        scale, learnable_scale: ECOC decoding scale.
        optimizer: "sgd" or "adam".
        learning_rate: the base learning rate.
        momentum: SGD momentum.
        head_lr_multiplier: learning-rate factor of the re-initialised head
            layers (retrain); with frozen features every trained weight is
            in the head, so the effective rate is learning_rate x this.
        lr_drop_epochs: epochs after which the rate is multiplied by 0.1.
        batch_size, epochs: the schedule (full batches only).
        seed: seeds the head initialisation, the code draw and the batch
            order (paired across encodings).
        evals_per_epoch: validation points per epoch.
    """

    encoding: str = "one_hot"
    code_length: int = None
    normalize_rows: bool = None
    dataset: str = "embedded"
    image_size: int = None
    train_per_class: int = None
    test_per_class: int = None
    dedupe: bool = True
    classes: int = None
    val_per_class: int = 3
    data_seed: int = 0
    protocol: str = "retrain"
    variant: str = "transfer"
    pretrain_dataset: str = None
    pretrain_per_class: int = None
    pretrain_epochs: int = 40
    pretrain_batch_size: int = 32
    pretrain_learning_rate: float = 1e-3
    pretrain_patience: int = 5
    pretrain_seed: int = 0
    hidden: int = 256
    scale: float = 1.0
    learnable_scale: bool = True
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    momentum: float = 0.9
    head_lr_multiplier: float = 1.0
    lr_drop_epochs: tuple = ()
    batch_size: int = 16
    epochs: int = 10
    seed: int = 0
    evals_per_epoch: int = 4

    def __post_init__(self):
        _check_choice("protocol", self.protocol, PROTOCOLS)
        _check_choice("variant", self.variant, VARIANTS)
        _check_choice("encoding", self.encoding, ENCODINGS)
        _check_choice("optimizer", self.optimizer, ("sgd", "adam"))
        if self.protocol == "scratch" and self.variant != "same":
            raise ValueError("The scratch protocol trains on the given "
                             "classes: use variant='same'. Received: "
                             f"variant={self.variant!r}")
        if self.protocol != "retrain" and self.head_lr_multiplier != 1.0:
            raise ValueError(
                "Argument `head_lr_multiplier` applies to the re-initialised "
                "head on frozen features (retrain protocol); "
                f"{self.protocol} trains every layer at one rate. Received: "
                f"head_lr_multiplier={self.head_lr_multiplier}")
        if (self.variant == "external") != (self.pretrain_dataset is not None):
            raise ValueError(
                "Argument `pretrain_dataset` names the pretraining data set "
                "of variant='external' and only of it. Received: "
                f"pretrain_dataset={self.pretrain_dataset!r} with "
                f"variant={self.variant!r}")
        if self.pretrain_per_class is not None and self.pretrain_dataset is None:
            raise ValueError(
                "Argument `pretrain_per_class` caps the images of "
                "`pretrain_dataset` (variant='external'). Received: "
                f"pretrain_per_class={self.pretrain_per_class} without one")
        if (self.encoding == "one_hot_imprinted_pretrained"
                and self.protocol == "scratch"):
            raise ValueError(
                "The encoding 'one_hot_imprinted_pretrained' starts from the "
                "pretrained fc7 of the retrain / finetune protocols; scratch "
                "has no pretrained fc7. Received: protocol='scratch'")
        for name in ("classes", "train_per_class", "test_per_class",
                     "image_size", "pretrain_per_class"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"Argument `{name}` must be a positive "
                                 f"integer or None. Received: {name}={value!r}")
        for name in ("batch_size", "epochs", "val_per_class", "hidden",
                     "evals_per_epoch", "pretrain_epochs",
                     "pretrain_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Argument `{name}` must be a positive "
                                 f"integer. Received: {name}={value!r}")
        for name in ("learning_rate", "head_lr_multiplier", "scale",
                     "pretrain_learning_rate"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value)
                    and value > 0):
                raise ValueError(f"Argument `{name}` must be a positive "
                                 f"float. Received: {name}={value!r}")
        if self.encoding.startswith("one_hot"):
            if self.code_length is not None:
                raise ValueError("One-hot encodings have n outputs: leave "
                                 "`code_length` None. Received: "
                                 f"code_length={self.code_length}")
        elif not isinstance(self.code_length, int) or self.code_length < 2:
            raise ValueError("Argument `code_length` must be an integer >= 2 "
                             f"for {self.encoding!r}. Received: "
                             f"code_length={self.code_length!r}")
        if (self.normalize_rows is None) != (
                self.encoding not in ROW_NORM_ENCODINGS):
            raise ValueError(
                "Argument `normalize_rows` must be True or False for "
                f"{ROW_NORM_ENCODINGS} and None for other encodings. "
                f"Received: normalize_rows={self.normalize_rows!r} for "
                f"encoding={self.encoding!r}")
        if not (common.is_real(self.momentum) and 0 <= self.momentum < 1):
            raise ValueError("Argument `momentum` must be in [0, 1). "
                             f"Received: momentum={self.momentum!r}")
        if (not common.is_integer(self.pretrain_patience)
                or self.pretrain_patience < 0):
            raise ValueError("Argument `pretrain_patience` must be an integer "
                             ">= 0. Received: "
                             f"pretrain_patience={self.pretrain_patience!r}")
        drops = list(self.lr_drop_epochs)
        if (not all(common.is_integer(e) for e in drops)
                or any(e < 1 for e in drops) or drops != sorted(set(drops))):
            raise ValueError("Argument `lr_drop_epochs` must be increasing "
                             "positive integers (epochs after which the rate "
                             "drops). Received: "
                             f"lr_drop_epochs={self.lr_drop_epochs!r}")
        object.__setattr__(self, "lr_drop_epochs", tuple(drops))

    def to_dict(self):
        d = dataclasses.asdict(self)
        d["lr_drop_epochs"] = list(self.lr_drop_epochs)
        # Fields added later stay out when unset: stored runs keep their key.
        for name in _OPTIONAL_FIELDS:
            if d[name] is None:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d):
        return cls(**{**d, "lr_drop_epochs": tuple(d.get("lr_drop_epochs",
                                                         ()))})

    @property
    def key(self):
        """16 hex digits of the SHA-1 of the settings (sorted JSON)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:16]

    @property
    def label(self):
        """Encoding label: 'spectral_raw' / 'spectral_norm' where rows matter."""
        if self.normalize_rows is None:
            return self.encoding
        return f"{self.encoding}_{'norm' if self.normalize_rows else 'raw'}"

    def pretrain_settings(self):
        """The settings the pretrained network depends on (its cache key)."""
        variant = "same" if self.protocol == "scratch" else self.variant
        extra = {name: getattr(self, name) for name in _OPTIONAL_FIELDS
                 if getattr(self, name) is not None}
        return {**extra,
            "dataset": self.dataset, "image_size": self.image_size,
            "train_per_class": self.train_per_class,
            "test_per_class": self.test_per_class, "dedupe": self.dedupe,
            # The transfer / external pretraining set does not depend on
            # which retraining classes are kept.
            "classes": self.classes if variant == "same" else None,
            "val_per_class": self.val_per_class, "data_seed": self.data_seed,
            "variant": variant, "hidden": self.hidden,
            "pretrain_epochs": self.pretrain_epochs,
            "pretrain_batch_size": self.pretrain_batch_size,
            "pretrain_learning_rate": self.pretrain_learning_rate,
            "pretrain_patience": self.pretrain_patience,
            "pretrain_seed": self.pretrain_seed,
        }


_OPTIONAL_FIELDS = ("pretrain_dataset", "pretrain_per_class")


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"Argument `{name}` must be one of {choices}. "
                         f"Received: {name}={value!r}")


def prepare_output(output, resume=False, overwrite=False):
    """Checks (and creates) the output folder.

    A non-empty folder is refused unless `resume` (reuse runs whose settings
    match) or `overwrite` (retrain: the stored runs, the pretraining cache
    and `data.json` are deleted, any other file stays) is given.
    """
    if resume and overwrite:
        raise ValueError("Pass at most one of `resume` and `overwrite`.")
    if os.path.isdir(output) and os.listdir(output):
        if not (resume or overwrite):
            raise ValueError(
                f"The output folder {output!r} is not empty. Pass --resume "
                "to reuse its runs (only those whose settings all match) or "
                "--overwrite to train again and replace them.")
        if overwrite:
            # Only what this runner wrote: runs, the pretraining cache and
            # the data record; a user's own files in the folder stay.
            written = [os.path.join(output, "runs", "*.json"),
                       os.path.join(output, "pretrain", "*.weights.h5"),
                       os.path.join(output, "pretrain", "*.json"),
                       os.path.join(output, "pretrain", "*.lock"),
                       os.path.join(output, "data.json")]
            for pattern in written:
                for path in glob.glob(pattern):
                    os.remove(path)
    elif os.path.exists(output) and not os.path.isdir(output):
        raise ValueError(f"Argument `output` must be a folder. Received: "
                         f"output={output!r} (a file)")
    try:
        os.makedirs(os.path.join(output, "runs"), exist_ok=True)
    except OSError as error:  # a parent that is a file, no permission, ...
        raise ValueError(f"Argument `output` must be a folder that can be "
                         f"created. Received: output={output!r} "
                         f"({error.strerror})") from error
    return output


def check_code_length(encoding, num_classes, k):
    """Raises ValueError when `encoding` has no code of length k for
    `num_classes` classes (data-based codes: k <= n - 1; the others: what
    `training.make_codes` accepts, drawn once with seed 0)."""
    if encoding in DATA_ENCODINGS:
        if k > num_classes - 1:
            raise ValueError(f"spectral codes need k <= n - 1 = "
                             f"{num_classes - 1}; got k = {k}")
        return
    if encoding.startswith("one_hot"):
        return
    from ecoc_research import training

    training.make_codes(encoding, num_classes, k, seed=0)


def _fingerprint(dataset):
    """SHA-1 of a data file's bytes; a name (embedded, tfds) stands as is."""
    if dataset is None or not os.path.isfile(str(dataset)):
        return dataset
    digest = hashlib.sha1()
    with open(dataset, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def check_data_fingerprint(output, spec, resume):
    """Records what the runs in `output` were trained on (`data.json`:
    the SHA-1 of each data file), and refuses to resume them on a data file
    whose contents changed under the same path: stored runs and the
    pretraining cache are keyed by the path, not by the contents."""
    path = os.path.join(output, "data.json")
    current = {str(d): _fingerprint(d)
               for d in (spec.dataset, spec.pretrain_dataset) if d is not None}
    stored = {}
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
    changed = sorted(d for d in current
                     if d in stored and stored[d] != current[d])
    if changed and resume:
        raise common.UsageError(
            f"The runs in {output!r} were trained on other contents of "
            f"{', '.join(changed)}: use another --output, or --overwrite "
            "to train them again.")
    stored.update(current)
    with open(path + ".tmp", "w") as f:
        json.dump(stored, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def build_task(spec):
    """The `protocols.Task` of `spec`: its data loaded (cached per process by
    `common.load_data`), classes drawn and the validation split carved.

    Raises ValueError when the data cannot give what `spec` asks (more
    classes than there are, `val_per_class` leaving a class no training
    image): commands call it before they prepare their output folder.
    """
    data = common.load_data(common.DataOptions(
        dataset=spec.dataset, train_per_class=spec.train_per_class,
        test_per_class=spec.test_per_class,
        image_size=spec.image_size, dedupe=spec.dedupe,
        subset_seed=spec.data_seed))
    variant = "same" if spec.protocol == "scratch" else spec.variant
    pretrain_data = None
    if spec.pretrain_dataset is not None:
        pretrain_data = common.load_data(common.DataOptions(
            dataset=spec.pretrain_dataset,
            image_size=spec.image_size, dedupe=spec.dedupe,
            train_per_class=spec.pretrain_per_class,
            subset_seed=spec.data_seed))
    return protocols.split_task(
        data, spec.protocol, variant, spec.classes,
        spec.val_per_class, spec.data_seed, pretrain_data)


class Runner:
    """Trains `RunSpec`s, caching data, tasks, features and results.

    Args:
        output: the output folder (runs/ and pretrain/ go inside; nothing is
            written elsewhere).
        resume: reuse stored runs whose settings all match.
        verbose: Keras progress (0 none, 1 bars, 2 one line per epoch).
        jit_compile: XLA for the training steps (see the module docstring).
        chance_multiple: the pretrained network must reach this multiple of
            chance validation accuracy (`protocols.check_above_chance`)
            before any head trains on it; 0 disables the check.
    """

    def __init__(self, output, resume=False, verbose=0, jit_compile=False,
                 chance_multiple=protocols.CHANCE_MULTIPLE):
        self.output = output
        self.chance_multiple = chance_multiple
        self.resume = resume
        self.verbose = verbose
        self.jit_compile = jit_compile
        self._tasks = {}
        self._pretrained = {}
        self._features = {}
        os.makedirs(os.path.join(output, "runs"), exist_ok=True)

    def path(self, spec):
        return os.path.join(self.output, "runs", f"{spec.key}.json")

    def stored(self, spec):
        """The stored record of `spec` if resuming and its settings match."""
        path = self.path(spec)
        if not (self.resume and os.path.exists(path)):
            return None
        with open(path) as f:
            record = json.load(f)
        if record.get("spec") != spec.to_dict():
            raise ValueError(
                f"{path} holds another run's settings under the same key; "
                "remove it or use --overwrite.")
        return record

    def run(self, spec):
        """The record of `spec`: reused (resume, same settings) or trained."""
        record = self.stored(spec)
        if record is not None:
            return record
        start = time.perf_counter()
        record = {"spec": spec.to_dict(), "key": spec.key,
                  "label": spec.label, "environment": common.environment(),
                  "command": common.COMMAND}
        try:
            record.update(self._train(spec))
            record["status"] = "ok"
        except CodeError as error:
            record["status"], record["error"] = error.status, str(error)
            common.log(f"    -> not trained: {error}")
        record["wall_time"] = time.perf_counter() - start
        from ecoc_research.experiments import report

        path = self.path(spec)
        report.write_json(path + ".tmp", record)
        os.replace(path + ".tmp", path)
        return record

    # -- the pieces -------------------------------------------------------

    def task(self, spec):
        key = (spec.dataset, spec.image_size, spec.train_per_class,
               spec.test_per_class, spec.dedupe, spec.protocol, spec.variant,
               spec.classes, spec.val_per_class, spec.data_seed,
               spec.pretrain_dataset, spec.pretrain_per_class)
        if key not in self._tasks:
            self._tasks[key] = build_task(spec)
        return self._tasks[key]

    def pretrained(self, spec):
        settings = spec.pretrain_settings()
        key = json.dumps(settings, sort_keys=True)
        if key not in self._pretrained:
            if settings["variant"] == "same" and spec.protocol == "scratch":
                task = self.task(dataclasses.replace(
                    spec, protocol="retrain", variant="same"))
            else:
                task = self.task(spec)
            pretrained = protocols.Pretrained(
                settings, os.path.join(self.output, "pretrain")
            ).load_or_train(task, verbose=self.verbose)
            protocols.check_above_chance(pretrained.record,
                                         len(task.pretrain_classes),
                                         self.chance_multiple)
            self._pretrained[key] = pretrained
        return self._pretrained[key]

    def features(self, spec):
        """Frozen fc6 features of train/val/test and fc7 of train (retrain)."""
        task = self.task(spec)
        pre = self.pretrained(spec)
        key = (pre.key, id(task))
        if key not in self._features:
            self._features[key] = {
                "train": pre.layer_outputs("features", task.train[0]),
                "val": pre.layer_outputs("features", task.val[0]),
                "test": pre.layer_outputs("features", task.test[0]),
                "fc7_train": pre.layer_outputs("fc7", task.train[0]),
                "task": task,
            }
        return self._features[key]

    def similarity(self, spec):
        """Class similarity of data-based codes: pretrained fc7 features of
        the retraining classes' TRAINING images (validation excluded)."""
        task = self.task(spec)
        if spec.protocol != "scratch":
            fc7 = self.features(spec)["fc7_train"]
        else:
            fc7 = self.pretrained(spec).layer_outputs("fc7", task.train[0])
        return protocols.class_similarity_from_features(
            fc7, task.train[1], task.num_classes)

    def codes(self, spec, num_classes):
        """(n, k) float32 codes, or None for the one-hot encodings."""
        if spec.encoding.startswith("one_hot"):
            return None
        from ecoc_research import training

        similarity = (self.similarity(spec)
                      if spec.encoding in DATA_ENCODINGS else None)
        k = spec.code_length
        if spec.encoding in DATA_ENCODINGS:
            try:
                check_code_length(spec.encoding, num_classes, k)
            except ValueError as error:
                raise CodeError("no_code", str(error)) from error
        try:
            codes = training.make_codes(
                spec.encoding, num_classes, k, similarity=similarity,
                seed=spec.seed,
                normalize_rows=bool(spec.normalize_rows))
        except ValueError as error:
            raise CodeError("no_code", str(error)) from error
        codes = np.asarray(codes, np.float32)
        distinct = len(np.unique(codes, axis=0))
        if distinct < len(codes):
            raise CodeError("duplicate_codewords",
                            f"{len(codes) - distinct} duplicate codewords "
                            f"({distinct} distinct of {len(codes)})")
        return codes

    def _train(self, spec):
        import keras

        from ecoc_research import training

        task = self.task(spec)
        n = task.num_classes
        codes = self.codes(spec, n)
        keras.utils.set_random_seed(spec.seed)
        info = {"num_classes": n, "outputs": n if codes is None
                else int(codes.shape[1])}
        if spec.protocol == "retrain":
            feats = self.features(spec)
            train = (feats["train"], task.train[1])
            val = (feats["val"], task.val[1])
            test = (feats["test"], task.test[1])
            model = training.build_head(
                train[0].shape[1], n, codes=codes, hidden=spec.hidden,
                seed=spec.seed, scale=spec.scale,
                learnable_scale=spec.learnable_scale)
            learning_rate = spec.learning_rate * spec.head_lr_multiplier
            info["pretrain"] = self.pretrained(spec).record
        elif spec.protocol == "finetune":
            train, val, test = task.train, task.val, task.test
            model = protocols.build_finetune_network(
                self.pretrained(spec).model, n, codes=codes,
                hidden=spec.hidden, seed=spec.seed, scale=spec.scale,
                learnable_scale=spec.learnable_scale)
            learning_rate = spec.learning_rate
            info["pretrain"] = self.pretrained(spec).record
        else:
            train, val, test = task.train, task.val, task.test
            model = training.build_model(
                train[0].shape[1:], n, codes=codes, scale=spec.scale,
                learnable_scale=spec.learnable_scale)
            learning_rate = spec.learning_rate
        if spec.encoding == "one_hot_imprinted_pretrained":
            protocols.copy_pretrained_fc7(model, self.pretrained(spec).model)
        if spec.encoding in IMPRINTED_ENCODINGS:
            training.imprint_output_layer(model, train[0], train[1], n)
        steps_per_epoch = len(train[1]) // spec.batch_size
        optimizer = training.make_optimizer(
            spec.optimizer, learning_rate, spec.momentum,
            drop_steps=[e * steps_per_epoch for e in spec.lr_drop_epochs])
        interval = training.eval_interval(len(train[1]), spec.batch_size,
                                          spec.evals_per_epoch)
        compile_kwargs = dict(
            jit_compile=self.jit_compile,
            steps_per_execution=training.steps_per_execution(interval))
        if codes is None:
            model.compile(
                optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True), **compile_kwargs)
        else:
            model.compile(optimizer=optimizer, metrics=[], **compile_kwargs)
        result = training.train_tracked(
            model, train, val, test, spec.batch_size, spec.epochs, spec.seed,
            evals_per_epoch=spec.evals_per_epoch, verbose=self.verbose)
        info.update(result)
        info["effective_learning_rate"] = learning_rate
        info["eval_interval"] = interval
        info["train_images"] = int(len(train[1]))
        info["val_images"] = int(len(val[1]))
        info["test_images"] = int(len(test[1]))
        if codes is not None:
            info["final_scale"] = float(keras.ops.convert_to_numpy(
                model.decoder.scale))
            info["code_stats"] = common.code_stats(codes)
        return info


class CodeError(Exception):
    """No usable code for a run (recorded, not trained)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
