"""Pretraining recipes on a generated many-class set.

The experiments' one-hot pretraining uses Adam 1e-3 at batch 32
(`runner.RunSpec`). On a 3,755-class set (1,878 pretraining classes of 21
images, 28 px) that recipe once stayed at chance while Adam 3e-4 at batch
128 learned. This command measures both recipes (or any others) on
`datasets.synthetic_glyphs` with the transfer split and validation split of
the experiments, and writes the accuracy per epoch as JSON:

    python -m ecoc_research.experiments.pretrain_recipes --classes 2000 \\
        --train-per-class 12 --epochs 4 --output recipes.json
"""

import argparse
import json
import time

RECIPES = ((1e-3, 32), (3e-4, 128))


def measure(num_classes, train_per_class, size=28, epochs=4, recipes=RECIPES,
            strokes=3, shift=2, noise=0.1, val_per_class=3, seed=0):
    """Pretrains the experiments' network once per (rate, batch) recipe.

    Returns:
        dict: the data set's settings and, per recipe, training and
        validation accuracy after every epoch and the wall time.
    """
    import keras

    from ecoc_research import datasets
    from ecoc_research.experiments import protocols

    data = datasets.synthetic_glyphs(num_classes, train_per_class, 1, size=size,
                                     strokes=strokes, shift=shift, noise=noise,
                                     seed=seed)
    pre_ids, _ = protocols.transfer_split(data.class_names)
    x, y = protocols._select(data.x_train, data.y_train, pre_ids)
    train, val = protocols.validation_split(y, val_per_class, seed)
    result = {"classes": num_classes, "pretrain_classes": int(len(pre_ids)),
              "train_images": int(len(train)), "val_images": int(len(val)),
              "size": size, "strokes": strokes, "shift": shift, "noise": noise,
              "epochs": epochs, "seed": seed, "runs": []}
    for learning_rate, batch_size in recipes:
        keras.utils.set_random_seed(seed)
        model = protocols.build_pretrain_network(x.shape[1:], len(pre_ids), 256)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"])
        start = time.perf_counter()
        history = model.fit(x[train], y[train], validation_data=(x[val], y[val]),
                            batch_size=batch_size, epochs=epochs, verbose=0,
                            shuffle=True)
        result["runs"].append({
            "learning_rate": learning_rate, "batch_size": batch_size,
            "train_accuracy": [float(v) for v in history.history["accuracy"]],
            "val_accuracy": [float(v) for v in history.history["val_accuracy"]],
            "chance": 1.0 / len(pre_ids),
            "wall_time": time.perf_counter() - start})
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ecoc_research.experiments.pretrain_recipes",
        description="Adam 1e-3 / batch 32 against Adam 3e-4 / batch 128 "
        "(the one-hot pretraining) on a generated many-class set.")
    parser.add_argument("--classes", type=int, default=2000)
    parser.add_argument("--train-per-class", type=int, default=12)
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--strokes", type=int, default=3)
    parser.add_argument("--shift", type=int, default=2)
    parser.add_argument("--noise", type=float, default=0.1)
    parser.add_argument("--output", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    result = measure(args.classes, args.train_per_class, args.size, args.epochs,
                     strokes=args.strokes, shift=args.shift, noise=args.noise)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    for run in result["runs"]:
        print(f"Adam {run['learning_rate']:g} batch {run['batch_size']}: "
              f"validation accuracy per epoch "
              f"{', '.join(f'{100 * v:.1f}%' for v in run['val_accuracy'])} "
              f"({run['wall_time']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
