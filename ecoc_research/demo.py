"""The main job: one-hot against ECOC heads on embedded Omniglot, fairly.

The paper's protocol, small: a one-hot CNN is pretrained once on half of the
Omniglot alphabets (to a plateau on its own validation split); then, for
every encoding, the last two dense layers (fc7 + fc8) are re-initialised
from the same seed and retrained on the frozen features of the OTHER
alphabets' 112 classes with SGD (momentum 0.9) at mini-batch 16, each
encoding at the learning rate the validation split chose for it in
docs/results/e1_convergence.md (experiment E1), ECOC heads with the paper's decoding
(fixed scale 1: under SGD a learnable scale grew to ~10 and slowed them,
E5). That is the regime where the measurements found data-based codes
faster than plain one-hot (validation AUC +5.7 points [+4.7, +6.7], 10
seeds, Holm-adjusted p < 0.001; docs/results/e5_scale.md), and the
imprinted one-hot head faster still. Data-based codes take their class
similarity from the pretrained network's fc7 features of the training
images: information the re-initialised heads do not start with, which the
imprinted head (fc8 from class means) controls for. Prints validation accuracy
against steps, steps to reach 90% of one-hot's final validation accuracy,
and the test accuracy at the best validation step. Offline, about 15 s on
2 CPU cores (after the install).

    python -m ecoc_research.demo            # or: keras-ecoc-demo
    python -m ecoc_research.demo --encodings one_hot spectral dense_random
"""

import argparse
import dataclasses
import os
import tempfile
import time

# SGD learning rates chosen on the validation split in E1 (batch 16,
# k = 18; docs/results/e1_convergence.md). Rates for encodings E1 did not select use 0.01.
DEMO_LEARNING_RATES = {
    "one_hot": 0.003,
    "one_hot_imprinted": 0.001,
    "gaussian": 0.03,
    "dense_random": 0.03,
    "spectral": 0.03,
    "spectral_zero": 0.01,
    "spectral_median": 0.03,
}


@dataclasses.dataclass
class DemoResult:
    """One encoding's run: its name, output width and the runner's record."""

    encoding: str
    code_length: int
    record: dict


def comparison_table(results, target):
    """Markdown table of `DemoResult`s; `target` is the validation accuracy."""
    from ecoc_research.experiments import stats

    header = ["encoding", "bits", "lr", "val@25%", "val@50%", "val@end",
              f"steps to {target:.0%} val", "test acc (best val)",
              "train s"]
    rows = []
    for r in results:
        rec = r.record
        steps, acc = rec["steps"], rec["val_accuracy"]
        total = rec["total_steps"]

        def at(fraction):
            # Validation accuracy at the last measured step <= fraction.
            values = [a for s, a in zip(steps, acc) if s <= fraction * total]
            return f"{values[-1]:.3f}"

        reached = stats.steps_to(steps, acc, target)
        rows.append([r.encoding, str(r.code_length),
                     f"{rec['spec']['learning_rate']:g}", at(0.25), at(0.5),
                     at(1.0), str(reached) if reached is not None
                     else "not reached", f"{rec['test_accuracy']:.3f}",
                     f"{rec['train_time']:.1f}"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def run(argv=None):
    """Runs the demo with command-line arguments; returns `DemoResult`s."""
    parser = argparse.ArgumentParser(
        prog="keras-ecoc-demo",
        description="One-hot vs ECOC heads retrained on pretrained features "
        "(embedded Omniglot, transfer to held-out alphabets).")
    parser.add_argument("--dataset", default="embedded",
                        help="'embedded', a .npz path or a tfds name")
    # One-hot with imprinted weights uses the same information as the
    # data-based codes (class means of the training features): the fair
    # baseline for them.
    parser.add_argument("--encodings", nargs="+",
                        default=["one_hot", "one_hot_imprinted", "gaussian",
                                 "spectral"])
    parser.add_argument("--epochs", type=int, default=15,
                        help="epochs of the head retraining")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--code-fraction", type=float, default=0.16,
                        help="k = this fraction of the number of classes")
    parser.add_argument("--train-per-class", type=int, default=None,
                        help="keep at most this many training images a class")
    parser.add_argument("--test-per-class", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None,
                        help="keep the runs here (default: a temporary "
                        "folder, deleted at the end); a folder that holds "
                        "files already is refused without --resume or "
                        "--overwrite")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the runs in --output whose settings all "
                        "match")
    parser.add_argument("--overwrite", action="store_true",
                        help="train again and replace the runs in --output "
                        "(and its pretraining cache)")
    parser.add_argument("--verbose", type=int, default=0)
    parser.add_argument("--min-pretrain-chance-multiple", type=float,
                        default=3.0,
                        help="stop before any head is trained when the "
                        "pretrained network is below min(M / classes, halfway "
                        "between chance and 100%%) validation accuracy "
                        "(default M = 3; 0 disables)")
    args = parser.parse_args(argv)
    try:
        _check_args(args)
        return _run(args)
    except ValueError as error:
        from ecoc_research.experiments import common

        if not isinstance(error, common.UsageError):
            raise
        parser.exit(2, f"{parser.prog}: error: {error}\n")


def _check_args(args):
    """Every option, before any data is loaded or network trained.

    Raises `common.UsageError` (printed as an argparse error) naming the
    option and the expected form.
    """
    from ecoc_research.experiments import common
    from ecoc_research.experiments import runner as runner_lib

    def positive(name, value, allow_none=False):
        if value is None and allow_none:
            return
        if value is None or value < 1:
            raise common.UsageError(
                f"Argument `--{name}` must be a positive integer. "
                f"Received: {value}")

    positive("epochs", args.epochs)
    positive("batch-size", args.batch_size)
    positive("train-per-class", args.train_per_class, allow_none=True)
    positive("test-per-class", args.test_per_class, allow_none=True)
    if not 0 <= args.seed < 2**32:
        raise common.UsageError(
            "Argument `--seed` must be an integer in [0, 2**32). "
            f"Received: {args.seed}")
    if not 0 < args.code_fraction <= 1:
        raise common.UsageError(
            "Argument `--code-fraction` must be in (0, 1]: k is that "
            "fraction of the number of classes (at least 2, at most n - 1). "
            f"Received: {args.code_fraction}")
    if not args.min_pretrain_chance_multiple >= 0:
        raise common.UsageError(
            "Argument `--min-pretrain-chance-multiple` must be >= 0 "
            f"(0 disables the check). Received: "
            f"{args.min_pretrain_chance_multiple}")
    unknown = [e for e in args.encodings if e not in runner_lib.ENCODINGS]
    if unknown:
        raise common.UsageError(
            f"Argument `--encodings` must name encodings of "
            f"{list(runner_lib.ENCODINGS)}. Received: {unknown}")
    if args.output is None and (args.resume or args.overwrite):
        raise common.UsageError(
            "--resume and --overwrite apply to an --output folder; none "
            "was given.")
    if str(args.dataset).endswith(".npz") and not os.path.isfile(args.dataset):
        raise common.UsageError(
            "Argument `--dataset` must be 'embedded', an existing .npz file "
            f"or a tensorflow-datasets name. Received: {args.dataset!r} (no "
            "such file)")
    if args.output is not None:
        try:  # refuses a folder with earlier results unless asked
            runner_lib.prepare_output(args.output, resume=args.resume,
                                      overwrite=args.overwrite)
        except ValueError as error:
            raise common.UsageError(str(error)) from error


def _run(args):
    from keras_ecoc import ops as ecoc_ops
    from ecoc_research.experiments import runner as runner_lib

    start = time.perf_counter()
    print(f"ECOC loss path: {ecoc_ops.fused_status()}")
    val_per_class = 3
    if args.train_per_class is not None:
        val_per_class = max(1, min(3, args.train_per_class - 1))
    base = dict(dataset=args.dataset, train_per_class=args.train_per_class,
                test_per_class=args.test_per_class,
                val_per_class=val_per_class, protocol="retrain",
                variant="transfer", optimizer="sgd", momentum=0.9,
                batch_size=args.batch_size, epochs=args.epochs,
                seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        output = args.output or tmp
        runner = runner_lib.Runner(
            output, resume=args.resume, verbose=args.verbose,
            chance_multiple=args.min_pretrain_chance_multiple)
        task = runner.task(runner_lib.RunSpec(**base))
        n = task.num_classes
        k = max(2, min(n - 1, int(round(args.code_fraction * n))))
        print(f"pretraining on {len(task.pretrain_classes)} classes, "
              f"retraining fc7 + fc8 on {n} held-out classes "
              f"({len(task.train[1])} train / {len(task.val[1])} validation "
              f"/ {len(task.test[1])} test images), ECOC k = {k}")
        results = []
        for i, encoding in enumerate(args.encodings, start=1):
            spec = runner_lib.RunSpec(**dict(
                base, encoding=encoding,
                code_length=None if encoding.startswith("one_hot") else k,
                normalize_rows=True if encoding in
                runner_lib.ROW_NORM_ENCODINGS else None,
                scale=1.0, learnable_scale=False,
                learning_rate=DEMO_LEARNING_RATES.get(encoding, 0.01)))
            print(f"[{i}/{len(args.encodings)}] {encoding}: "
                  f"{n if spec.code_length is None else k} outputs"
                  f"{'' if spec.code_length is None else ', fixed scale 1'}"
                  f", SGD lr "
                  f"{spec.learning_rate:g}, batch {spec.batch_size}, "
                  f"{spec.epochs} epochs", flush=True)
            record = runner.run(spec)
            if record["status"] != "ok":
                print(f"    not trained: {record.get('error')}")
                continue
            results.append(DemoResult(encoding, record["outputs"], record))
    if not results:
        print("\nNo encoding trained (see the reasons above): nothing to "
              "compare.")
        return results
    one_hot = [r for r in results if r.encoding == "one_hot"]
    reference = one_hot[0] if one_hot else results[0]
    target = 0.9 * reference.record["final_val_accuracy"]
    pretrain = reference.record.get("pretrain") or {}
    if pretrain:
        print(f"\npretrained network: best validation accuracy "
              f"{pretrain['best_val_accuracy']:.3f} after "
              f"{pretrain['epochs_run']} epochs ({pretrain['wall_time']:.0f} s)")
    reference_name = reference.encoding
    print("\nValidation accuracy at 25%, 50% and the end of training (nearest "
          "codeword for ECOC, argmax for one-hot); steps to the target, 90% of "
          f"{reference_name}'s final validation accuracy ({target:.3f}; 0 when a "
          "head starts above it); test accuracy at the best validation step:\n")
    print(comparison_table(results, target))
    print(f"\nOne seed ({args.seed}) is one draw: the 10-seed comparison with 95% "
          "intervals is docs/results/e5_scale.md (E5).")
    print(f"\ntotal time {time.perf_counter() - start:.0f} s")
    return results


def main(argv=None):
    """Console entry point (`keras-ecoc-demo`): exit status 0, or 1 when no
    encoding trained."""
    return 0 if run(argv) else 1


if __name__ == "__main__":
    raise SystemExit(main())
