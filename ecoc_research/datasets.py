"""Image data sets for the demo, the experiments and the notebooks.

`load_dataset(spec)` understands:

- `"omniglot"` (also `"embedded"`, the default): Omniglot's two "small"
  background sets at 28x28, shipped inside this package (MIT licence,
  `ecoc_research/data/LICENSE.omniglot`). The file has 292 labels, but both
  sets hold the Greek and Latin alphabets, so 50 labels repeat 50 others with
  the same images: the loader keeps one of each, 242 character classes x 20
  drawers. Drawers 0-14 of each class train, drawers 15-19 test
  (3,630 / 1,210).
- a path to one of the `.npz` layouts of the project's offline data folder:
  the Omniglot 28 px file, the bit-packed Omniglot 105 px file
  (`packed`), CUB-200 subsets (`images_center`/`images_bbox`, `is_train`,
  `class_attributes_continuous`) and CIFAR-10 as JPEG bytes (`jpeg`,
  `offsets`, `is_train`); or any `.npz` with `images`/`x` and `labels`/`y`
  (and optionally `is_train`).
- a tensorflow-datasets name (`cifar100`, `caltech_birds2011`, `omniglot`,
  `imagenet2012`, `places365`, ...), optionally prefixed `tfds:`; needs the
  network (or `tfds.testing.mock_data`).

Every loader returns an `ImageDataset` with float32 images in [0, 1] of
shape (N, H, W, C) and int32 labels.
"""

import dataclasses
import io
import os
from importlib import resources

import numpy as np

EMBEDDED_NAMES = ("embedded", "omniglot_small", "omniglot")
TFDS_NAMES = ("cifar100", "caltech_birds2011", "omniglot", "imagenet2012",
              "places365", "cifar10", "mnist")
# tensorflow-datasets keys of the images and labels, when not "image"/"label".
_TFDS_KEYS = {"omniglot": ("image", "label")}


@dataclasses.dataclass
class ImageDataset:
    """A train/test split of an image classification data set.

    Attributes:
        name: a short name for tables and file names.
        x_train: float32 (N_train, H, W, C) in [0, 1].
        y_train: int32 (N_train,) class ids in [0, num_classes).
        x_test: float32 (N_test, H, W, C) in [0, 1].
        y_test: int32 (N_test,).
        class_names: list of num_classes strings.
        class_attributes: optional float32 (num_classes, A) per-class
            attribute table (CUB), or None.
        attribute_names: optional list of A strings, or None.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: list
    class_attributes: np.ndarray = None
    attribute_names: list = None

    def __post_init__(self):
        # Labels index class_names: an id past the end or a negative one
        # (which NumPy indexing would wrap around) is a corrupt data set.
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            y = np.asarray(y)
            if len(x) != len(y):
                raise ValueError(
                    f"`x_{split}` and `y_{split}` must have the same number of "
                    f"samples. Received: len(x_{split})={len(x)}, "
                    f"len(y_{split})={len(y)}"
                )
            if y.size and not np.issubdtype(y.dtype, np.integer):
                raise ValueError(
                    f"`y_{split}` must hold integer class ids. Received: "
                    f"y_{split}.dtype={y.dtype}"
                )
            bad = (y < 0) | (y >= len(self.class_names))
            if np.any(bad):
                raise ValueError(
                    f"`y_{split}` must hold class ids in [0, "
                    f"{len(self.class_names)}) (one per entry of `class_names`). "
                    f"Received: out-of-range ids {np.unique(y[bad])[:10]}"
                )

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def input_shape(self):
        return tuple(self.x_train.shape[1:])

    def first_classes(self, count):
        """A copy restricted to classes 0..count-1 (for quick runs)."""
        tr, te = self.y_train < count, self.y_test < count
        attributes = None
        if self.class_attributes is not None:
            attributes = self.class_attributes[:count]
        return dataclasses.replace(
            self, x_train=self.x_train[tr], y_train=self.y_train[tr],
            x_test=self.x_test[te], y_test=self.y_test[te],
            class_names=self.class_names[:count], class_attributes=attributes,
        )

    def subset(self, train_per_class=None, test_per_class=None, seed=0):
        """A copy keeping at most so many examples of each class per split."""
        rng = np.random.default_rng(seed)

        def pick(y, per_class):
            if per_class is None:
                return np.arange(len(y))
            keep = []
            for c in range(self.num_classes):
                idx = np.flatnonzero(y == c)
                keep.append(rng.permutation(idx)[:per_class])
            return np.sort(np.concatenate(keep))

        tr, te = pick(self.y_train, train_per_class), pick(self.y_test, test_per_class)
        return dataclasses.replace(
            self, x_train=self.x_train[tr], y_train=self.y_train[tr],
            x_test=self.x_test[te], y_test=self.y_test[te],
        )


def embedded_path():
    """Path of the Omniglot file shipped inside the package."""
    return str(resources.files("ecoc_research") / "data" / "omniglot_small_28px.npz")


def load_dataset(spec="embedded", image_size=None, cub_crop="bbox", tfds_dir=None):
    """Loads a data set by name or path (see the module docstring).

    Args:
        spec: `"embedded"`/`"omniglot"`, a `.npz` path, or a
            tensorflow-datasets name (optionally `"tfds:NAME"`).
        image_size: optional int; images are resized to (size, size).
        cub_crop: for CUB `.npz` files, `"bbox"` (crop around the annotated
            bird) or `"center"`.
        tfds_dir: `data_dir` for tensorflow-datasets.

    Returns:
        An `ImageDataset`.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(
            "Argument `spec` must be 'embedded', a path to a .npz file or a "
            f"tensorflow-datasets name. Received: spec={spec!r}"
        )
    if spec in EMBEDDED_NAMES and not os.path.exists(spec):
        dataset = _from_npz(embedded_path(), name="omniglot")
    elif spec.endswith(".npz") or os.path.exists(spec):
        if not os.path.exists(spec):
            raise ValueError(
                f"Argument `spec` names a .npz file that does not exist. "
                f"Received: spec={spec!r}"
            )
        dataset = _from_npz(spec, cub_crop=cub_crop)
    else:
        dataset = _from_tfds(spec.removeprefix("tfds:"), data_dir=tfds_dir)
    if image_size is not None:
        dataset = _resized(dataset, int(image_size))
    return dataset


def _from_npz(path, name=None, cub_crop="bbox"):
    data = np.load(path)
    files = set(data.files)
    name = name or os.path.splitext(os.path.basename(path))[0]
    attributes = attribute_names = None
    if "packed" in files:  # Omniglot 105 px, bit-packed binary images.
        bits = np.unpackbits(data["packed"], axis=-1)[..., :105]
        images, labels = _omniglot_ink(bits * 255), data["labels"]
        is_train = _omniglot_split(labels)
    elif "jpeg" in files:  # CIFAR-10 as JPEG bytes.
        images = _decode_jpegs(data["jpeg"], data["offsets"])
        labels, is_train = data["labels"], data["is_train"].astype(bool)
    elif "images_center" in files:  # CUB subsets.
        if cub_crop not in ("bbox", "center"):
            raise ValueError(
                "Argument `cub_crop` must be 'bbox' or 'center'. "
                f"Received: cub_crop={cub_crop!r}"
            )
        images = data[f"images_{cub_crop}"].astype("float32") / 255.0
        labels, is_train = data["labels"], data["is_train"].astype(bool)
        if "class_attributes_continuous" in files:
            attributes = data["class_attributes_continuous"].astype("float32")
            attribute_names = _cub_attribute_names(path)
    elif "images" in files and "alphabet" in files:  # Omniglot 28 px.
        images, labels = _omniglot_ink(data["images"]), data["labels"]
        is_train = _omniglot_split(labels)
    else:
        x_key = "images" if "images" in files else "x"
        y_key = "labels" if "labels" in files else "y"
        if x_key not in files or y_key not in files:
            raise ValueError(
                "A .npz data set needs arrays 'images' (or 'x') and 'labels' "
                f"(or 'y'). Received: {path} with arrays {sorted(files)}"
            )
        images = data[x_key].astype("float32")
        if images.max(initial=0) > 1.0:
            images = images / 255.0
        labels = data[y_key]
        if "is_train" in files:
            is_train = data["is_train"].astype(bool)
        else:  # A fixed 80/20 split, the same for every run.
            is_train = np.random.default_rng(0).random(len(labels)) < 0.8
    labels = np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"The labels of {path} must be integer class ids. Received: "
            f"labels.dtype={labels.dtype}"
        )
    if labels.size and labels.min() < 0:
        raise ValueError(
            f"The labels of {path} must be class ids >= 0. Received: "
            f"negative labels {np.unique(labels[labels < 0])[:10]}"
        )
    labels = labels.astype("int32")
    is_train = np.asarray(is_train)
    if is_train.shape != labels.shape:
        raise ValueError(
            f"`is_train` of {path} must have one entry per label. Received: "
            f"is_train.shape={is_train.shape}, labels.shape={labels.shape}"
        )
    if len(images) != len(labels):
        raise ValueError(
            f"The images and labels of {path} must have the same length. "
            f"Received: {len(images)} images and {len(labels)} labels"
        )
    if images.ndim == 3:
        images = images[..., None]
    num_classes = int(labels.max(initial=-1)) + 1
    if "class_names" in files:
        class_names = [str(c) for c in data["class_names"]]
    else:
        class_names = [str(c) for c in range(num_classes)]
    if "alphabet" in files or "packed" in files:
        keep, labels, class_names = _merge_repeated_omniglot_classes(
            labels, class_names)
        images, is_train = images[keep], is_train[keep]
    return ImageDataset(
        name=name,
        x_train=images[is_train], y_train=labels[is_train],
        x_test=images[~is_train], y_test=labels[~is_train],
        class_names=class_names,
        class_attributes=attributes, attribute_names=attribute_names,
    )


def _merge_repeated_omniglot_classes(labels, class_names):
    # Omniglot's two "small" background sets both contain the Greek and the
    # Latin alphabets, so 50 of the 292 labels are copies of 50 others (same
    # name, same 20 images). No classifier can tell such a pair apart and
    # data-based codes give them identical codewords: keep the first label of
    # each class name, drop the copies' images, and renumber the labels.
    first = {}
    for index, name in enumerate(class_names):
        first.setdefault(name, index)
    keep_class = np.array([first[name] == i for i, name in enumerate(class_names)])
    new_id = np.cumsum(keep_class) - 1
    keep = keep_class[labels]
    names = [name for i, name in enumerate(class_names) if keep_class[i]]
    return keep, new_id[labels[keep]].astype("int32"), names


def _omniglot_ink(images):
    # Omniglot stores ink as low values; networks learn faster with ink = 1
    # on a zero background.
    return (255.0 - np.asarray(images, dtype="float32")) / 255.0


def _omniglot_split(labels):
    # 20 drawers per class, stored in drawer order: 15 train, 5 test.
    labels = np.asarray(labels)
    position = np.zeros(len(labels), dtype=int)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        position[idx] = np.arange(len(idx))
    return position < 15


def _cub_attribute_names(path):
    meta = os.path.join(os.path.dirname(path), "cub200_meta.npz")
    if os.path.exists(meta):
        return [str(a) for a in np.load(meta)["attribute_names"]]
    return None


def _decode_jpegs(jpeg, offsets):
    try:
        from PIL import Image

        def decode(b):
            return np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
    except ImportError:  # Pillow is optional; TensorFlow decodes JPEG too.
        import tensorflow as tf

        def decode(b):
            return tf.io.decode_jpeg(b, channels=3).numpy()

    images = np.stack(
        [decode(jpeg[offsets[i] : offsets[i + 1]].tobytes())
         for i in range(len(offsets) - 1)]
    )
    return images.astype("float32") / 255.0


def _from_tfds(name, data_dir=None, splits=("train", "test")):
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise ValueError(
            f"Loading the tensorflow-datasets set {name!r} needs the "
            "`tensorflow-datasets` package (pip install "
            "'keras-ecoc[datasets]'). Received: spec={name!r}"
        ) from error
    builder = tfds.builder(name, data_dir=data_dir)
    available = list(builder.info.splits.keys()) or list(splits)
    test_split = "test" if "test" in available else (
        "validation" if "validation" in available else available[-1])
    image_key, label_key = _TFDS_KEYS.get(name, ("image", "label"))
    arrays = {}
    for split in ("train", test_split):
        try:
            ds = tfds.load(name, split=split, data_dir=data_dir)
        except Exception as error:  # noqa: BLE001 - tfds raises anything on a failed download
            where = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
            raise RuntimeError(
                f"tensorflow-datasets could not load {name!r} (split {split!r}); it "
                f"downloads and prepares the set on first use, into {where}. "
                "Without network access, prepare it on another machine and point "
                "TFDS_DATA_DIR (or `tfds_dir=`) at that folder, or use an .npz file "
                f"or 'embedded'. tensorflow-datasets said: {type(error).__name__}: {error}"
            ) from error
        xs, ys = [], []
        for example in tfds.as_numpy(ds):
            xs.append(example[image_key])
            ys.append(example[label_key])
        arrays[split] = (xs, np.asarray(ys, dtype="int32"))
    label_feature = builder.info.features[label_key]
    class_names = list(getattr(label_feature, "names", None) or
                       [str(i) for i in range(label_feature.num_classes)])
    x_train = _stack_images(arrays["train"][0])
    x_test = _stack_images(arrays[test_split][0], like=x_train)
    return ImageDataset(
        name=name, x_train=x_train, y_train=arrays["train"][1],
        x_test=x_test, y_test=arrays[test_split][1], class_names=class_names,
    )


def _stack_images(images, like=None):
    # tensorflow-datasets images can differ in size (CUB, ImageNet): resize
    # them all to the first image's size, or to the train split's.
    target = like.shape[1:3] if like is not None else images[0].shape[:2]
    if all(im.shape[:2] == tuple(target) for im in images):
        return np.stack(images).astype("float32") / 255.0
    import tensorflow as tf

    return np.stack(
        [tf.image.resize(im, target).numpy() for im in images]
    ).astype("float32") / 255.0


def _resized(dataset, size):
    if dataset.input_shape[:2] == (size, size):
        return dataset
    import keras

    def resize(x):
        out = [keras.ops.convert_to_numpy(
            keras.ops.image.resize(x[i : i + 512], (size, size)))
            for i in range(0, len(x), 512)]
        return np.concatenate(out).astype("float32")

    return dataclasses.replace(
        dataset, x_train=resize(dataset.x_train), x_test=resize(dataset.x_test)
    )


def synthetic_glyphs(num_classes, train_per_class, test_per_class, size=28,
                     groups=10, strokes=3, shift=2, noise=0.1, seed=0):
    """A generated many-class set of stroke glyphs, like handwritten characters.

    Each class is a prototype of `strokes` random line segments on a
    `size` x `size` canvas; each image is its prototype shifted by up to
    `shift` pixels in each direction plus Gaussian pixel noise, clipped to
    [0, 1]. Classes are named "gGG/cCCCCC" in `groups` groups, so the transfer
    variant of the experiments pretrains on half of the groups and retrains
    on the other half, as with Omniglot's alphabets. For tests and for
    measuring the research application on 10^3+ classes without a download.

    Args:
        num_classes: n >= 2.
        train_per_class, test_per_class: images per class and split (>= 1).
        size: image height and width in pixels (>= 4).
        groups: number of class groups (>= 2).
        strokes: line segments per prototype (>= 1).
        shift: largest translation in pixels (>= 0).
        noise: standard deviation of the pixel noise (>= 0).
        seed: random seed (the same seed gives the same images).

    Returns:
        `ImageDataset` with images (N, size, size, 1): the training split
        class by class, train_per_class images each, then the test split.
    """
    checks = {"num_classes": (num_classes, 2), "train_per_class":
              (train_per_class, 1), "test_per_class": (test_per_class, 1),
              "size": (size, 4), "groups": (groups, 2), "strokes": (strokes, 1),
              "shift": (shift, 0)}
    for name, (value, least) in checks.items():
        if int(value) != value or value < least:
            raise ValueError(f"Argument `{name}` must be an integer >= {least}. "
                             f"Received: {name}={value!r}")
    if not noise >= 0:
        raise ValueError(f"Argument `noise` must be >= 0. Received: noise={noise!r}")
    rng = np.random.default_rng(seed)
    canvas = np.zeros((num_classes, size + 2 * shift, size + 2 * shift), np.float32)
    t = np.linspace(0.0, 1.0, 2 * size)
    for c in range(num_classes):
        for _ in range(strokes):
            (r0, c0), (r1, c1) = rng.uniform(shift, size + shift - 1, (2, 2))
            rows = np.round(r0 + (r1 - r0) * t).astype(int)
            cols = np.round(c0 + (c1 - c0) * t).astype(int)
            canvas[c, rows, cols] = 1.0
    per_class = train_per_class + test_per_class
    labels = np.repeat(np.arange(num_classes), per_class)
    dr, dc = rng.integers(0, 2 * shift + 1, (2, len(labels)))
    window = np.arange(size)
    images = canvas[labels[:, None, None], (dr[:, None] + window)[:, :, None],
                    (dc[:, None] + window)[:, None, :]]
    images = np.clip(images + noise * rng.standard_normal(images.shape), 0, 1)
    images = images.astype(np.float32)[..., None]
    is_train = np.tile(np.arange(per_class) < train_per_class, num_classes)
    names = [f"g{c % groups:02d}/c{c:06d}" for c in range(num_classes)]
    return ImageDataset(
        name=f"glyphs{num_classes}", x_train=images[is_train],
        y_train=labels[is_train].astype(np.int32), x_test=images[~is_train],
        y_test=labels[~is_train].astype(np.int32), class_names=names)


def save_npz(dataset, path):
    """Writes an `ImageDataset` as the generic .npz the experiments read
    (`images`, `labels`, `is_train`, `class_names`)."""
    images = np.concatenate([dataset.x_train, dataset.x_test])
    labels = np.concatenate([dataset.y_train, dataset.y_test]).astype(np.int32)
    is_train = np.concatenate([np.ones(len(dataset.y_train), bool),
                               np.zeros(len(dataset.y_test), bool)])
    np.savez(path, images=images, labels=labels, is_train=is_train,
             class_names=np.array(dataset.class_names))
    return path
