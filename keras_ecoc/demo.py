"""The main job: one-hot against ECOC codes on the embedded Omniglot set.

Trains the same small CNN with one-hot targets (Dense(242) + softmax), with
Gaussian random codes and with data-based spectral codes (k = 32 bits, about
an eighth of the 242 one-hot outputs), at a small mini-batch size, and prints a
comparison table: test accuracy per epoch, steps to reach a fixed accuracy and
wall time. Runs in a few minutes on 2 CPU cores, offline.

    python -m keras_ecoc.demo            # or: keras-ecoc-demo
    python -m keras_ecoc.demo --epochs 3 --batch-size 32 --code-length 64
"""

import argparse
import time

from keras_ecoc import datasets
from keras_ecoc import ops as ecoc_ops
from keras_ecoc import training


def comparison_table(results, target):
    """Markdown table of `TrainResult`s; `target` is the accuracy for steps."""
    epochs = max(len(r.epoch_accuracies) for r in results)
    header = (
        ["encoding", "bits"]
        + [f"acc@ep{e + 1}" for e in range(epochs)]
        + [f"steps to {target:.0%}", "wall s"]
    )
    rows = []
    for r in results:
        reached = r.steps_to(target)
        rows.append(
            [r.encoding, str(r.code_length)]
            + [f"{a:.3f}" for a in r.epoch_accuracies]
            + [str(reached) if reached is not None else "not reached",
               f"{r.wall_time:.0f}"]
        )
    lines = ["| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def run(argv=None):
    """Runs the demo with command-line arguments; returns the `TrainResult`s."""
    parser = argparse.ArgumentParser(
        prog="keras-ecoc-demo",
        description="One-hot vs ECOC output codes on embedded Omniglot.",
    )
    parser.add_argument("--dataset", default="embedded",
                        help="'embedded', a .npz path or a tfds name")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--code-length", type=int, default=32)
    parser.add_argument("--target", type=float, default=0.5,
                        help="accuracy for the steps-to-accuracy column")
    parser.add_argument("--train-per-class", type=int, default=None,
                        help="keep at most this many training images a class")
    parser.add_argument("--test-per-class", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", type=int, default=1)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    data = datasets.load_dataset(args.dataset).subset(
        args.train_per_class, args.test_per_class, seed=args.seed)
    print(f"data set {data.name}: {data.num_classes} classes, "
          f"{len(data.y_train)} train / {len(data.y_test)} test images "
          f"of shape {data.input_shape}")
    print(f"ECOC loss path: {ecoc_ops.fused_status()}")

    print("\n[1/4] class similarity for data-based codes "
          "(one-hot network trained briefly on the training split)")
    similarity = training.feature_similarity(
        data, epochs=2, seed=args.seed, verbose=args.verbose)

    runs = [("one_hot", None)]
    for encoding in ("gaussian", "spectral"):
        runs.append((encoding, training.make_codes(
            encoding, data.num_classes, args.code_length,
            similarity=similarity, seed=args.seed)))
    results = []
    for i, (encoding, codes) in enumerate(runs, start=2):
        bits = data.num_classes if codes is None else codes.shape[1]
        print(f"\n[{i}/4] {encoding}: {bits} outputs, batch {args.batch_size}")
        results.append(training.train_and_evaluate(
            data, encoding=encoding, codes=codes, batch_size=args.batch_size,
            epochs=args.epochs, seed=args.seed, verbose=args.verbose))

    print("\nTest accuracy (nearest codeword for ECOC, argmax for one-hot):\n")
    print(comparison_table(results, args.target))
    print(f"\ntotal time {time.perf_counter() - start:.0f} s")
    return results


def main(argv=None):
    """Console entry point (`keras-ecoc-demo`): exit status 0."""
    run(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
