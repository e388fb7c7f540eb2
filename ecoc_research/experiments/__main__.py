"""Command line of the experiments: ``python -m ecoc_research.experiments``.

Examples:

    # The convergence grid of docs/results/e1_convergence.md (E1, SGD arm):
    python -m ecoc_research.experiments grid --protocol retrain \
        --variant transfer --encodings one_hot one_hot_imprinted gaussian \
        spectral --code-lengths 0.16n --batch-sizes 16 128 \
        --epochs 16:15 128:60 --optimizer sgd \
        --learning-rates 0.001 0.003 0.01 0.03 0.1 --output results/omniglot
    python -m ecoc_research.experiments grid --smoke --output /tmp/smoke
    python -m ecoc_research.experiments cub-bits \
        --dataset ../shared/data/cub50_64px.npz \
        --pretrain-source ../shared/data/cifar10_jpeg_bytes.npz \
        --protocol finetune --encodings one_hot \
        one_hot_imprinted_pretrained spectral --code-lengths 12
    python -m ecoc_research.experiments attributes \
        --dataset ../shared/data/cub50_64px.npz
    python -m ecoc_research.experiments pictures --dataset cifar100
    python -m ecoc_research.experiments all --smoke --output /tmp/smoke

``--dataset`` takes ``embedded`` (Omniglot, 242 classes, inside the package),
a ``.npz`` file (the layouts of ../shared/data: Omniglot 28/105 px, CUB
subsets, CIFAR-10 JPEG bytes, or any ``images``/``labels`` arrays), or a
tensorflow-datasets name (``cifar100``, ``caltech_birds2011``, ``omniglot``,
``imagenet2012``, ``places365``; needs the network).
"""

import argparse
import dataclasses
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

EXPERIMENTS = ("cub-bits", "attributes", "pictures")

# Default source of the pretrained backbone of cub-bits and attributes.
PRETRAIN_SOURCE = os.path.join("..", "shared", "data",
                               "cifar10_jpeg_bytes.npz")


def _pretrain_source(path):
    """`path`, or, for the default outside the repository root, the same
    file next to the checkout this package runs from. The default string
    itself is kept where it exists: it is part of the runs' keys."""
    if path != PRETRAIN_SOURCE or os.path.isfile(path):
        return path
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    beside = os.path.join(checkout, PRETRAIN_SOURCE)
    return os.path.normpath(beside) if os.path.isfile(beside) else path

# --smoke: a few steps of everything, for CI.
SMOKE = {"epochs": 1, "classes": 12, "train_per_class": 3,
         "test_per_class": 2, "seeds": [0], "code_lengths": [4, 8],
         "similarity_epochs": 1, "random_draws": 3,
         "tsne_iterations": 60, "max_points": 200, "code_length": 8,
         "pretrain_epochs": 1, "pretrain_per_class": 10,
         "learning_rates": [0.01, 0.03], "val_per_class": 1,
         # 12 classes x 2 training images after the validation split.
         "batch_size": 8}


def _common_parser():
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default="embedded",
                   help="'embedded' (Omniglot 242 classes), a .npz path or a "
                   "tensorflow-datasets name (default: embedded)")
    g.add_argument("--classes", type=int, default=None,
                   help="keep only the first N classes")
    g.add_argument("--train-per-class", type=int, default=None,
                   help="keep at most this many training images per class")
    g.add_argument("--test-per-class", type=int, default=None,
                   help="keep at most this many test images per class")
    g.add_argument("--image-size", type=int, default=None,
                   help="resize images to SIZE x SIZE")
    g.add_argument("--cub-crop", choices=("bbox", "center"), default="bbox",
                   help="crop of the CUB .npz files (default: bbox)")
    g.add_argument("--keep-duplicate-classes", action="store_true",
                   help="keep classes whose images duplicate another "
                   "class's (dropped by default: the Omniglot files list "
                   "Greek and Latin twice, 292 labels for 242 classes)")
    g = p.add_argument_group("training")
    g.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="repeats (default: 0 1; cub-bits: 0 1 2 3 4)")
    g.add_argument("--epochs", type=int, default=None)
    g.add_argument("--batch-size", type=int, default=None)
    g.add_argument("--code-lengths", type=int, nargs="+", default=None,
                   help="code lengths k (cub-bits, attributes)")
    g.add_argument("--code-length", type=int, default=None,
                   help="k of pictures (default 32, capped at n - 1)")
    g.add_argument("--encodings", nargs="+", default=None,
                   help="encoding names (ecoc_research.training.ENCODINGS)")
    g.add_argument("--scale", type=float, default=None,
                   help="initial ECOC decoding scale (default: package's)")
    g.add_argument("--fixed-scale", action="store_true",
                   help="do not learn the decoding scale")
    g.add_argument("--similarity-epochs", type=int, default=None,
                   help="epochs of the one-hot network behind data-based "
                   "codes (training split only)")
    g = p.add_argument_group("output")
    g.add_argument("--output", default="ecoc-experiments",
                   help="output folder (default: ./ecoc-experiments)")
    g.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                   help="Keras progress: 1 bars, 2 one line per epoch, 0 none")
    g.add_argument("--smoke", action="store_true",
                   help="tiny setting (1 epoch, 12 classes, 3 images a "
                   "class) to check the command end to end")
    return p


def _pretrain_parser():
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("pretrained backbone (cub-bits, attributes)")
    g.add_argument("--pretrain-source", default=PRETRAIN_SOURCE,
                   help="data set the backbone is pretrained on, one-hot "
                   f"(default {PRETRAIN_SOURCE}: CIFAR-10)")
    g.add_argument("--pretrain-epochs", type=int, default=None,
                   help="pretraining epochs (default 6)")
    g.add_argument("--pretrain-image-size", type=int, default=None,
                   help="image size of the pretraining and of the "
                   "retraining data (default 32)")
    g.add_argument("--pretrain-per-class", type=int, default=None,
                   help="keep at most so many source images per class")
    g.add_argument("--val-per-class", type=int, default=None,
                   help="validation images per class carved from the "
                   "training split (default 5)")
    g.add_argument("--min-pretrain-chance-multiple", type=float,
                   default=None,
                   help="stop before any head trains when the pretrained "
                   "network's best validation accuracy is below this "
                   "multiple of chance (default 3; 0 disables)")
    return p


def build_parser():
    common = _common_parser()
    parser = argparse.ArgumentParser(
        prog="keras-ecoc-experiments",
        description="Reproduce the experiments of 'Beyond One-hot Encoding' "
        "(one-hot vs ECOC output codes) on a data set.")
    sub = parser.add_subparsers(dest="experiment", required=True)
    p = sub.add_parser("cub-bits", parents=[common, _pretrain_parser()],
                       help="accuracy against code length on a pretrained "
                       "backbone, frozen features or whole network (the "
                       "shared runner; paired seeds, TOST and Holm against "
                       "one-hot)")
    p.add_argument("--protocol", choices=("retrain", "finetune"),
                   default="retrain",
                   help="retrain: fc7 + fc8 on frozen fc6 features; "
                   "finetune: the whole network (default retrain)")
    p.add_argument("--learning-rates", type=float, nargs="+", default=None,
                   help="SGD learning-rate grid, chosen on validation with "
                   "--select-seed (default retrain 0.003 0.01 0.03 0.1, "
                   "finetune 0.001 0.003 0.01)")
    p.add_argument("--select-seed", type=int, default=None,
                   help="seed of the learning-rate selection; not a "
                   "reported seed (default 100)")
    p.add_argument("--learnable-scale", action="store_true",
                   help="learn the decoding scale (default: fixed at "
                   "--scale, 1)")
    p.add_argument("--jit-compile", choices=("auto", "on", "off"),
                   default="auto",
                   help="XLA for the training steps: auto (default) is on "
                   "for finetune (one compilation for a whole CNN trained "
                   "~1,000 steps) and off for retrain's small heads")
    p.add_argument("--margin", type=float, default=1.0,
                   help="equivalence margin in accuracy points (default 1)")
    p.add_argument("--resume", action="store_true",
                   help="reuse per-run files whose settings all match")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing per-run files")
    p = sub.add_parser("attributes", parents=[common, _pretrain_parser()],
                       help="code bits against CUB attributes (Table 2), "
                       "with a random-code null distribution")
    p.add_argument("--random-draws", type=int, default=None,
                   help="random codes per encoding and k in the null "
                   "(default 1000)")
    p.add_argument("--top", type=int, default=3,
                   help="attributes listed per bit")
    p.add_argument("--overwrite", action="store_true",
                   help="replace attributes.json/.md/.png in --output")
    p = sub.add_parser("pictures", parents=[common],
                       help="t-SNE and confusion matrices per encoding")
    p.add_argument("--max-points", type=int, default=None,
                   help="test images in the t-SNE (default 1000)")
    p.add_argument("--confusion-classes", type=int, default=10)
    p.add_argument("--tsne-iterations", type=int, default=None)
    p.add_argument("--overwrite", action="store_true",
                   help="replace pictures.json/.md and its PNGs in --output")
    _add_grid_parser(sub)
    p = sub.add_parser("all", parents=[common, _pretrain_parser()],
                       help="every experiment")
    p.add_argument("--learning-rates", type=float, nargs="+", default=None)
    p.add_argument("--margin", type=float, default=1.0)
    p.add_argument("--resume", action="store_true",
                   help="continue an earlier `all` in --output: reuse "
                   "cub-bits' per-run files whose settings all match; "
                   "attributes and pictures, which keep none, run again")
    p.add_argument("--overwrite", action="store_true",
                   help="replace every result in --output")
    p.add_argument("--random-draws", type=int, default=None)
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--max-points", type=int, default=None)
    p.add_argument("--confusion-classes", type=int, default=10)
    p.add_argument("--tsne-iterations", type=int, default=None)
    return parser


# The retraining classes of a smoke grid: at most this many, fewer when the
# data set has fewer (e.g. 5 in the transfer variant of a 10-class set).
GRID_SMOKE = {"classes": 8, "epochs": 2, "seeds": [0, 1],
              "pretrain_epochs": 2, "batch_sizes": [8], "hidden": 32}


def _add_grid_parser(sub):
    from ecoc_research.experiments import runner as runner_lib
    from ecoc_research.experiments.protocols import CHANCE_MULTIPLE
    from ecoc_research.experiments.protocols import FEW_CLASS_RECIPE
    from ecoc_research.experiments.protocols import MANY_CLASS_RECIPE
    from ecoc_research.experiments.protocols import MANY_CLASSES

    defaults = runner_lib.RunSpec()
    p = sub.add_parser(
        "grid", help="convergence grid: protocol x encoding x k x batch x "
        "optimizer x learning rate x seed, with paired statistics",
        description="Runs a grid of RunSpecs (ecoc_research.experiments.runner)"
        ": picks each cell's learning rate on the validation split with "
        "--select-seed, then trains --seeds and compares every encoding "
        "with one-hot, paired by seed.")
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default="embedded",
                   help="'embedded' (Omniglot), a .npz with images/labels"
                   "/is_train, or a tensorflow-datasets name")
    g.add_argument("--classes", type=int, default=None,
                   help="retraining classes kept (drawn with --data-seed); "
                   "default all")
    g.add_argument("--train-per-class", type=int, default=None)
    g.add_argument("--test-per-class", type=int, default=None)
    g.add_argument("--image-size", type=int, default=None)
    g.add_argument("--keep-duplicate-classes", action="store_true")
    g.add_argument("--val-per-class", type=int,
                   default=defaults.val_per_class,
                   help="validation images per class carved from training")
    g.add_argument("--data-seed", type=int, default=defaults.data_seed,
                   help="seed of the validation split and class draw")
    g = p.add_argument_group("protocol")
    g.add_argument("--protocol", choices=runner_lib.PROTOCOLS,
                   default="retrain")
    # "external" (pretraining on another data set) is cub-bits' variant.
    g.add_argument("--variant", choices=("same", "transfer"), default=None,
                   help="retrain / finetune: 'transfer' (default; pretrain "
                   "on half of the alphabets/classes, retrain on the "
                   "others) or 'same'")
    g.add_argument("--pretrain-epochs", type=int,
                   default=defaults.pretrain_epochs,
                   help="most epochs of the one-hot pretraining (early stop "
                   "on its validation split)")
    g.add_argument("--pretrain-patience", type=int,
                   default=defaults.pretrain_patience)
    g.add_argument("--pretrain-learning-rate", type=float, default=None,
                   help="Adam rate of the one-hot pretraining (default "
                   f"{FEW_CLASS_RECIPE[0]:g}, {MANY_CLASS_RECIPE[0]:g} from "
                   f"{MANY_CLASSES} pretraining classes on)")
    g.add_argument("--pretrain-batch-size", type=int, default=None,
                   help="mini-batch of the one-hot pretraining (default "
                   f"{FEW_CLASS_RECIPE[1]}, {MANY_CLASS_RECIPE[1]} from "
                   f"{MANY_CLASSES} pretraining classes on)")
    g.add_argument("--min-pretrain-chance-multiple", type=float,
                   default=CHANCE_MULTIPLE,
                   help="stop before any head is trained when the pretrained "
                   "network's best validation accuracy is below "
                   "min(M / classes, halfway between chance and 100%%) "
                   f"(default M = {CHANCE_MULTIPLE:g}; 0 disables)")
    g.add_argument("--hidden", type=int, default=defaults.hidden,
                   help="width of fc7")
    g = p.add_argument_group("grid")
    g.add_argument("--encodings", nargs="+",
                   default=["one_hot", "gaussian", "spectral"],
                   help=f"of {', '.join(runner_lib.ENCODINGS)}")
    g.add_argument("--code-lengths", nargs="+", default=["0.16n"],
                   help="k: integers or '0.16n', '0.66n', 'n-1', '2n'")
    g.add_argument("--min-code-length", type=int, default=2)
    g.add_argument("--normalize-rows", nargs="+", choices=("on", "off"),
                   default=["on"],
                   help="row normalisation of raw gaussian/spectral codes")
    g.add_argument("--batch-sizes", type=int, nargs="+", default=[16])
    g.add_argument("--epochs", nargs="+", default=["20"],
                   help="epochs for every batch size, or BATCH:EPOCHS pairs")
    g.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    g.add_argument("--select-seed", type=int, default=100,
                   help="seed of the learning-rate selection runs (not "
                   "reused for reporting)")
    g.add_argument("--evals-per-epoch", nargs="+",
                   default=[str(defaults.evals_per_epoch)],
                   help="validation points per epoch, or BATCH:N pairs")
    g.add_argument("--fraction", type=float, default=0.9,
                   help="steps-to-target: this fraction of one-hot's mean "
                   "final validation accuracy")
    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    g.add_argument("--learning-rate", type=float, default=None)
    g.add_argument("--learning-rates", type=float, nargs="+", default=None,
                   help="a grid, chosen per cell on validation")
    g.add_argument("--lr-from", default=None,
                   help="a <name>.json of an earlier grid: reuse the rate it "
                   "chose for each encoding label and batch size")
    g.add_argument("--momentum", type=float, default=defaults.momentum)
    g.add_argument("--head-lr-multiplier", type=float, default=1.0,
                   help="learning-rate factor of the re-initialised head "
                   "(retrain; with frozen features it scales every update)")
    g.add_argument("--lr-drop-epochs", type=int, nargs="*", default=[],
                   help="multiply the rate by 0.1 after these epochs")
    g.add_argument("--scale", type=float, default=defaults.scale)
    g.add_argument("--fixed-scale", action="store_true")
    g = p.add_argument_group("output")
    g.add_argument("--output", default="ecoc-experiments")
    g.add_argument("--name", default="grid",
                   help="file stem of the summary files")
    g.add_argument("--resume", action="store_true",
                   help="reuse stored runs whose settings all match")
    g.add_argument("--overwrite", action="store_true",
                   help="train again and replace the stored runs")
    g.add_argument("--verbose", type=int, default=0, choices=(0, 1, 2))
    g.add_argument("--smoke", action="store_true",
                   help="a tiny grid to check the command end to end")
    return p


def _epochs_by_batch(tokens, batch_sizes):
    if len(tokens) == 1 and ":" not in tokens[0]:
        return {b: int(tokens[0]) for b in batch_sizes}
    table = {}
    for token in tokens:
        try:
            b, e = token.split(":")
            table[int(b)] = int(e)
        except ValueError:
            raise ValueError("Arguments `epochs` and `evals_per_epoch` take "
                             "one integer or "
                             f"BATCH:EPOCHS pairs. Received: {token!r}")
    missing = [b for b in batch_sizes if b not in table]
    if missing:
        raise ValueError(f"Argument `epochs` has no entry for batch sizes "
                         f"{missing}. Received: {tokens}")
    return table


def _lr_overrides(path):
    """{(encoding label, batch size): learning rate} of an earlier grid's
    JSON (`--lr-from`); a ValueError naming the argument otherwise."""
    import json

    try:
        with open(path) as f:
            previous = json.load(f)
        table = {}
        for group in previous["groups"]:
            for label, lr in group["learning_rates"].items():
                table[(label.split(" k=")[0], group["batch_size"])] = lr
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(
            "Argument `lr_from` must be the JSON file of an earlier grid "
            f"(with its \"groups\"). Received: lr_from={path!r} "
            f"({type(error).__name__}: {error})") from None
    return table


def run_grid_command(args):
    """The `grid` experiment from parsed arguments; returns its results."""
    from ecoc_research.experiments import common
    from ecoc_research.experiments import grid as grid_lib

    if args.smoke:
        try:
            args.classes = args.classes or _smoke_classes(args)
        except ValueError as error:  # e.g. a --dataset that is not there
            raise common.UsageError(str(error)) from error
        args.epochs = [str(GRID_SMOKE["epochs"])]
        args.seeds = GRID_SMOKE["seeds"]
        args.pretrain_epochs = GRID_SMOKE["pretrain_epochs"]
        args.batch_sizes = GRID_SMOKE["batch_sizes"]
        args.hidden = GRID_SMOKE["hidden"]
        args.train_per_class = args.train_per_class or 6
        args.test_per_class = args.test_per_class or 2
        args.val_per_class = min(args.val_per_class, 2)
        args.code_lengths = ["4"]
        # Two pretraining epochs on a few images stay near chance: the smoke
        # grid checks the command end to end, not the pretraining.
        args.min_pretrain_chance_multiple = 0.0
    common.require_extras(["matplotlib"])
    try:
        grid = _grid_from_args(args)
    except ValueError as error:  # every setting is checked before training
        raise common.UsageError(str(error)) from error
    results = grid_lib.run_grid(grid, args.output, args.name,
                                resume=args.resume,
                                verbose=args.verbose,
                                chance_multiple=args.min_pretrain_chance_multiple)
    common.log("\n" + results["markdown"])
    common.log(f"{args.name}: {results['wall_time']:.0f} s; files in "
               f"{args.output}")
    return results


def _class_counts(args):
    """(pretraining classes, retraining classes available) of the data."""
    from ecoc_research.experiments import common
    from ecoc_research.experiments import protocols

    data = common.load_data(common.DataOptions(
        dataset=args.dataset, image_size=args.image_size,
        dedupe=not args.keep_duplicate_classes))
    variant = args.variant or ("same" if args.protocol == "scratch"
                               else "transfer")
    if variant == "transfer" and args.protocol == "retrain":
        pre, re = protocols.transfer_split(data.class_names)
        return len(pre), len(re)
    return (args.classes or data.num_classes), data.num_classes


def _smoke_classes(args):
    """GRID_SMOKE's classes, or all retraining classes if there are fewer."""
    return min(GRID_SMOKE["classes"], _class_counts(args)[1])


def _fill_pretrain_recipe(args):
    """Unset pretraining rate / batch from the number of pretraining classes."""
    from ecoc_research.experiments import common
    from ecoc_research.experiments import protocols

    if args.pretrain_learning_rate is not None and args.pretrain_batch_size is not None:
        return
    classes = _class_counts(args)[0]
    rate, batch = protocols.pretrain_recipe(classes)
    if args.pretrain_learning_rate is None:
        args.pretrain_learning_rate = rate
    if args.pretrain_batch_size is None:
        args.pretrain_batch_size = batch
    if classes >= protocols.MANY_CLASSES:
        common.log(f"{classes} pretraining classes: pretraining with Adam "
                   f"{args.pretrain_learning_rate:g} at batch "
                   f"{args.pretrain_batch_size} (the many-class recipe)")


def _grid_from_args(args):
    """The `Grid` of parsed arguments; raises ValueError before training."""
    from ecoc_research.experiments import common
    from ecoc_research.experiments import grid as grid_lib
    from ecoc_research.experiments import runner as runner_lib

    # Validate every setting (RunSpec checks its fields) before training.
    _fill_pretrain_recipe(args)
    common.DataOptions(dataset=args.dataset, classes=args.classes,
                       train_per_class=args.train_per_class,
                       test_per_class=args.test_per_class,
                       image_size=args.image_size)
    if args.learning_rate is not None and args.learning_rates:
        raise ValueError("Pass --learning-rate or --learning-rates, not both.")
    rates = args.learning_rates or [args.learning_rate or
                                    (0.01 if args.optimizer == "sgd" else 1e-3)]
    variant = args.variant or ("same" if args.protocol == "scratch"
                               else "transfer")
    base = dict(
        dataset=args.dataset, image_size=args.image_size,
        train_per_class=args.train_per_class,
        test_per_class=args.test_per_class,
        dedupe=not args.keep_duplicate_classes, classes=args.classes,
        val_per_class=args.val_per_class, data_seed=args.data_seed,
        protocol=args.protocol, variant=variant,
        pretrain_epochs=args.pretrain_epochs,
        pretrain_patience=args.pretrain_patience,
        pretrain_learning_rate=args.pretrain_learning_rate,
        pretrain_batch_size=args.pretrain_batch_size, hidden=args.hidden,
        scale=args.scale, learnable_scale=not args.fixed_scale,
        optimizer=args.optimizer, momentum=args.momentum,
        head_lr_multiplier=args.head_lr_multiplier,
        lr_drop_epochs=tuple(args.lr_drop_epochs),
    )
    evals = _epochs_by_batch(args.evals_per_epoch, args.batch_sizes)
    for encoding in args.encodings:
        if encoding not in runner_lib.ENCODINGS:
            raise ValueError(f"Argument `encodings` must name encodings of "
                             f"{runner_lib.ENCODINGS}. Received: {encoding!r}")
    for token in args.code_lengths:
        grid_lib.parse_code_length(token, 100)
    epochs = _epochs_by_batch(args.epochs, args.batch_sizes)
    # Builds one spec per batch size now, so bad values fail before training.
    specs = [runner_lib.RunSpec(**dict(base, batch_size=b, epochs=epochs[b],
                                       evals_per_epoch=evals[b],
                                       learning_rate=rates[0]))
             for b in args.batch_sizes]
    grid_lib.check_name(args.name)
    # The data's side (classes to draw, validation images per class), and
    # the grid's own factors, before the output folder is touched.
    task = runner_lib.build_task(specs[0])
    grid_lib.check_batch_sizes(args.batch_sizes, task)
    if args.min_pretrain_chance_multiple < 0:
        raise ValueError("Argument `min_pretrain_chance_multiple` must be >= 0 "
                         "(0 disables the check). Received: "
                         f"{args.min_pretrain_chance_multiple}")
    lr_overrides = _lr_overrides(args.lr_from) if args.lr_from else None
    grid = grid_lib.Grid(
        base=base, encodings=list(args.encodings),
        code_lengths=list(args.code_lengths),
        normalize_rows=[v == "on" for v in args.normalize_rows],
        batch_sizes=list(args.batch_sizes), epochs=epochs,
        learning_rates=[float(r) for r in rates], seeds=list(args.seeds),
        select_seed=args.select_seed,
        lr_overrides=lr_overrides,
        min_code_length=args.min_code_length, fraction=args.fraction,
        evals_per_epoch=evals)
    grid_lib.check_code_lengths(grid, task.num_classes)
    # Last: with --overwrite it deletes the pretraining cache, so nothing
    # after it may still refuse the command.
    runner_lib.prepare_output(args.output, resume=args.resume,
                              overwrite=args.overwrite)
    return grid


def _resolve(args):
    """Fills defaults (and the --smoke overrides) into a plain dict."""
    o = {k: v for k, v in vars(args).items()}
    if args.smoke:
        for key, value in SMOKE.items():
            if key in ("classes", "train_per_class", "test_per_class"):
                o[key] = o.get(key) or value
            elif o.get(key) is None:
                o[key] = value
    return o


def _data_options(o):
    from ecoc_research.experiments import common

    return common.DataOptions(
        dataset=o["dataset"], classes=o["classes"],
        train_per_class=o["train_per_class"],
        test_per_class=o["test_per_class"], image_size=o["image_size"],
        cub_crop=o["cub_crop"], dedupe=not o["keep_duplicate_classes"])


def _pretrain_kwargs(o):
    """The pretraining options of cub-bits and attributes (`cub_bits`)."""
    from ecoc_research.experiments import common
    from ecoc_research.experiments import cub_bits

    pretrain = dict(cub_bits.PRETRAIN)
    if o.get("pretrain_epochs") is not None:
        pretrain["pretrain_epochs"] = pretrain["pretrain_patience"] = \
            int(o["pretrain_epochs"])
    source = _pretrain_source(o["pretrain_source"])
    if str(source).endswith(".npz") and not os.path.isfile(source):
        raise common.UsageError(
            "Argument `--pretrain-source` must be an existing .npz file or a "
            f"tensorflow-datasets name. Received: {source!r} (no such file)")
    return dict(
        pretrain_dataset=source,
        image_size=_pick(o, "pretrain_image_size", cub_bits.IMAGE_SIZE),
        val_per_class=_pick(o, "val_per_class", cub_bits.VAL_PER_CLASS),
        pretrain=pretrain, pretrain_per_class=o.get("pretrain_per_class"))


def _chance_multiple(o):
    value = o.get("min_pretrain_chance_multiple")
    if value is not None and value < 0:
        raise ValueError("Argument `min_pretrain_chance_multiple` must be "
                         ">= 0 (0 disables the check). Received: "
                         f"{value}")
    if value is None and o.get("smoke"):
        return 0  # One pretraining epoch on a few images is near chance.
    return value


def _replaces(o):
    """Whether attributes / pictures may replace their files: --overwrite,
    or `all --resume` (they keep no per-run files, so resuming runs them
    again with the same settings)."""
    return bool(o.get("overwrite") or o.get("resume"))


def _pick(o, key, default):
    value = o.get(key)
    return default if value is None else value


def run_experiment(experiment, o, output_dir):
    """Runs one experiment from resolved options; returns its results."""
    from ecoc_research.experiments import attributes
    from ecoc_research.experiments import common
    from ecoc_research.experiments import cub_bits
    from ecoc_research.experiments import pictures

    data = common.load_data(_data_options(o))
    common.log(f"== {experiment} on {data.name}: {data.num_classes} classes, "
               f"{len(data.y_train)} train / {len(data.y_test)} test images "
               f"of shape {data.input_shape}")
    shared = dict(output_dir=output_dir, verbose=o["verbose"],
                  similarity_epochs=_pick(o, "similarity_epochs",
                                          common.SIMILARITY_EPOCHS))
    seeds = _pick(o, "seeds", [0, 1])
    scale_kwargs = dict(scale=o["scale"],
                        learnable_scale=False if o["fixed_scale"] else None)
    k = _pick(o, "code_length", 32)
    if experiment == "cub-bits":
        from ecoc_research.experiments import runner as runner_lib

        try:  # Every setting is checked before any training.
            if o["cub_crop"] != "bbox":
                raise ValueError(
                    "cub-bits runs on the bounding-box crops (the runner's "
                    "data sets). Received: --cub-crop "
                    f"{o['cub_crop']}")
            if o["fixed_scale"] and o.get("learnable_scale"):
                raise ValueError("Pass at most one of --fixed-scale and "
                                 "--learnable-scale.")
            grid = cub_bits.cub_grid(
                o["dataset"], protocol=o.get("protocol") or "retrain",
                encodings=_pick(o, "encodings", cub_bits.ENCODINGS),
                code_lengths=_pick(o, "code_lengths", cub_bits.CODE_LENGTHS),
                # Paired statistics need two seeds, even under --smoke.
                seeds=(_pick(o, "seeds", list(cub_bits.SEEDS)) if not o["smoke"]
                       or len(o["seeds"]) >= 2 else [0, 1]),
                select_seed=_pick(o, "select_seed", cub_bits.SELECT_SEED),
                learning_rates=o["learning_rates"],
                epochs=_pick(o, "epochs", cub_bits.EPOCHS),
                batch_size=_pick(o, "batch_size", cub_bits.BATCH_SIZE),
                scale=_pick(o, "scale", 1.0),
                learnable_scale=bool(o.get("learnable_scale")),
                classes=o["classes"], train_per_class=o["train_per_class"],
                test_per_class=o["test_per_class"], **_pretrain_kwargs(o))
            # Last: with --overwrite it deletes the runs and the pretraining
            # cache, so nothing after it may still refuse the command.
            runner_lib.prepare_output(output_dir, resume=o["resume"],
                                      overwrite=o["overwrite"])
        except ValueError as error:
            raise common.UsageError(str(error)) from error
        return cub_bits.run_cub_bits(
            grid, output_dir, name=f"cub_bits_{grid.base['protocol']}",
            margin=o["margin"], resume=o["resume"],
            verbose=min(o["verbose"], 2),
            chance_multiple=_chance_multiple(o),
            jit_compile={"auto": None, "on": True, "off": False}[
                o.get("jit_compile") or "auto"])
    if experiment == "attributes":
        if data.class_attributes is None:
            raise common.UsageError(
                "The attributes experiment needs per-class attributes (the "
                "CUB `.npz` files of ../shared/data, array "
                f"`class_attributes_continuous`). Data set {data.name!r} has "
                "none.")
        similarity, info, task = cub_bits.pretrained_similarity(
            o["dataset"], output=output_dir,
            chance_multiple=_chance_multiple(o),
            verbose=min(o["verbose"], 2), classes=o["classes"],
            train_per_class=o["train_per_class"],
            test_per_class=o["test_per_class"], **_pretrain_kwargs(o))
        # The attribute rows of the classes the similarity holds (drawn as
        # the runner draws them), in its order.
        every = common.load_data(dataclasses.replace(
            _data_options(o), classes=None, train_per_class=None,
            test_per_class=None))
        rows = [every.class_names.index(c) for c in task.class_names]
        return attributes.run_attributes(
            similarity, every.class_attributes[rows], output_dir,
            attribute_names=data.attribute_names,
            code_lengths=_pick(o, "code_lengths", attributes.CODE_LENGTHS),
            encodings=_pick(o, "encodings", attributes.DATA_ENCODINGS),
            draws=_pick(o, "random_draws", attributes.NULL_DRAWS),
            top=o["top"], overwrite=_replaces(o),
            source={"similarity": "cosine similarity of the class means of "
                    "the pretrained fc7 activations of the training images "
                    "(validation split excluded)",
                    "pretrain": {k: v for k, v in info.items()
                                 if k != "environment"}})
    if experiment == "pictures":
        return pictures.run_pictures(
            data, encodings=_pick(o, "encodings", pictures.PICTURE_ENCODINGS),
            code_length=k, seed=seeds[0], epochs=_pick(o, "epochs", 5),
            batch_size=_pick(o, "batch_size", 32),
            max_points=_pick(o, "max_points", 1000),
            confusion_classes=o["confusion_classes"],
            tsne_iterations=_pick(o, "tsne_iterations", 500), **scale_kwargs,
            overwrite=_replaces(o), **shared)
    raise ValueError(f"Unknown experiment {experiment!r}")


def main(argv=None):
    """Entry point of ``keras-ecoc-experiments``; returns {experiment: results}.

    A `common.UsageError` (a refused output folder, a bad setting, a
    pretrained network near chance) ends the command with its message as an
    argparse error (exit status 2), not a traceback.
    """
    from ecoc_research.experiments import common

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _main(args, argv)
    except common.UsageError as error:
        parser.exit(2, f"{parser.prog} {args.experiment}: error: {error}\n")


def _main(args, argv):
    if args.experiment == "grid":
        from ecoc_research.experiments import common

        common.COMMAND = " ".join(["python -m ecoc_research.experiments"] + list(
            sys.argv[1:] if argv is None else argv))
        return {"grid": run_grid_command(args)}
    o = _resolve(args)
    from ecoc_research.experiments import common
    from ecoc_research.experiments import report

    # Before any training: the figures need matplotlib, t-SNE scikit-learn.
    common.require_extras(["matplotlib", "sklearn"])

    start = time.perf_counter()
    command = " ".join(["python -m ecoc_research.experiments"]
                       + list(sys.argv[1:] if argv is None else argv))
    common.COMMAND = command
    if args.experiment == "all":
        experiments = list(EXPERIMENTS)
        has_attributes = common.load_data(
            _data_options(o)).class_attributes is not None
        if not has_attributes:
            common.log("skipping 'attributes': the data set has no class "
                       "attributes (use a CUB .npz)")
            experiments.remove("attributes")
    else:
        experiments = [args.experiment]
    index_name = "README.md" if args.experiment == "all" else \
        f"{args.experiment.replace('-', '_')}_index.md"
    # The index is rewritten at the end: refused now, before any training,
    # unless the run replaces (--overwrite) or extends (--resume) results.
    common.refuse_existing_results(args.output, [index_name], _replaces(o))
    os.makedirs(args.output, exist_ok=True)
    results, sections = {}, []
    for experiment in experiments:
        out = run_experiment(experiment, o, args.output)
        results[experiment] = out
        sections.append(f"## {experiment}\n\n{out['markdown']}\n\n"
                        f"Wall time: {out['wall_time']:.0f} s.")
        common.log(f"\n{out['markdown']}\n")
        common.log(f"{experiment}: {out['wall_time']:.0f} s; files: "
                   + ", ".join(out["files"]))
    index = (f"# keras-ecoc experiments\n\nCommand: `{command}`\n\n"
             + "\n\n".join(sections)
             + f"\n\nTotal wall time: {time.perf_counter() - start:.0f} s.\n")
    report.write_text(os.path.join(args.output, index_name), index)
    return results


if __name__ == "__main__":
    main()
