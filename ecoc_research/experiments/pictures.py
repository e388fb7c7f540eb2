"""Experiment 5: t-SNE of the penultimate features and confusion matrices.

Trains one network per encoding (same schedule), embeds the penultimate
(256-d "features") activations of up to `max_points` test images with the
scikit-learn t-SNE of `ecoc_research.experiments.tsne`, and draws the confusion matrix
restricted to a few classes.
"""

import time

import numpy as np

from ecoc_research.experiments import common
from ecoc_research.experiments import plots
from ecoc_research.experiments import report
from ecoc_research.experiments import tsne as tsne_lib

PICTURE_ENCODINGS = ("one_hot", "gaussian", "spectral")


def train_model(data, encoding, code_length, seed, similarity, batch_size,
                epochs, verbose=1, **model_kwargs):
    """Builds and fits the experiments' model; returns (model, codes).

    The same model and schedule as `ecoc_research.training.train_and_evaluate`,
    but the trained model is returned (for features and confusions).
    """
    import keras

    from ecoc_research import training

    codes = common.encoding_codes(encoding, data.num_classes, code_length,
                                  similarity, seed)
    keras.utils.set_random_seed(seed)
    model = training.build_model(data.input_shape, data.num_classes,
                                 codes=codes, **model_kwargs)
    model.fit(data.x_train, data.y_train, batch_size=batch_size, epochs=epochs,
              shuffle=True, verbose=verbose)
    return model, codes


def penultimate_features(model, x, batch_size=512):
    """(N, 256) activations of the backbone's "features" layer."""
    import keras

    from keras_ecoc import ECOCClassifier

    if isinstance(model, ECOCClassifier):
        extractor = model.backbone
    else:
        extractor = keras.Model(model.input, model.get_layer("features").output)
    return np.asarray(extractor.predict(x, batch_size=batch_size, verbose=0))


def confusion_matrix(y_true, y_pred, num_classes):
    """(n, n) counts: rows true class, columns predicted class."""
    matrix = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(matrix, (np.asarray(y_true), np.asarray(y_pred)), 1)
    return matrix


def colour_groups(class_names, labels):
    """Colour index per point: the class for <= 20 classes, else the class
    name's prefix before "/" (the Omniglot alphabet), else class mod 20."""
    labels = np.asarray(labels)
    if len(class_names) <= 20:
        return labels, "class"
    if all("/" in c for c in class_names):
        prefixes = [c.split("/")[0] for c in class_names]
        index = {p: i for i, p in enumerate(dict.fromkeys(prefixes))}
        return np.array([index[prefixes[y]] for y in labels]), "alphabet"
    return labels % 20, "class mod 20"


def run_pictures(data, encodings=PICTURE_ENCODINGS, code_length=32, seed=0,
                 epochs=5, batch_size=32, max_points=1000, confusion_classes=10,
                 tsne_iterations=500, perplexity=30.0, output_dir=None,
                 verbose=1, similarity_epochs=common.SIMILARITY_EPOCHS,
                 scale=None, learnable_scale=None, name="pictures",
                 overwrite=False):
    """t-SNE of penultimate features and confusion matrices per encoding.

    Args:
        data: an `ImageDataset`, a `common.DataOptions` or a data set spec.
        encodings: encodings to train (one network each, seed `seed`).
        code_length: k of the ECOC encodings.
        max_points: test images embedded (a fixed random subset if more).
        confusion_classes: the confusion matrix shows the first so many
            classes (rows: true class, normalised by its test count).
        tsne_iterations, perplexity: t-SNE settings (PCA to 50 dims first).
        seed: seeds the code draw, the weights and the shuffling.
        epochs, batch_size: training schedule of every encoding.
        output_dir: folder of the JSON, Markdown and PNG files (None: no
            files).
        verbose: Keras progress (0 none, 1 bars, 2 one line per epoch).
        similarity_epochs: epochs of the one-hot network behind the
            data-based codes (training split only).
        scale, learnable_scale: ECOC decoding scale (None: the package's
            default).
        name: file stem of the outputs.
        overwrite: replace existing `<name>.json/.md`, `<name>_tsne.png`
            and `<name>_confusion.png` in `output_dir` (otherwise they are
            refused before any training).

    Returns:
        dict with "encodings" (per encoding: test accuracy, k-NN label
        agreement in feature space and in the t-SNE map, the confusion
        sub-matrix), "settings", "dataset", "environment", "markdown",
        "files", "wall_time".
    """
    from ecoc_research import training

    common.refuse_existing_results(
        output_dir, [f"{name}.json", f"{name}.md", f"{name}_tsne.png",
                     f"{name}_confusion.png"], overwrite)
    start = time.perf_counter()
    data = data if hasattr(data, "x_train") else common.load_data(data)
    k = min(int(code_length), data.num_classes - 1)
    similarity = common.SimilarityCache(data, epochs=similarity_epochs)
    rng = np.random.default_rng(seed)
    points = np.arange(len(data.y_test))
    if len(points) > max_points:
        points = np.sort(rng.choice(points, max_points, replace=False))
    labels = data.y_test[points]
    groups, group_kind = colour_groups(data.class_names, labels)
    shown = list(range(min(confusion_classes, data.num_classes)))
    model_kwargs = {}
    if scale is not None:
        model_kwargs["scale"] = float(scale)
    if learnable_scale is not None:
        model_kwargs["learnable_scale"] = bool(learnable_scale)
    progress = common.RunProgress(len(encodings), name)
    records, tsne_panels, confusion_panels = [], [], []
    for encoding in encodings:
        progress.begin(f"{encoding} seed={seed}")
        t0 = time.perf_counter()
        model, codes = train_model(data, encoding, k, seed, similarity,
                                   batch_size, epochs, verbose=verbose,
                                   **model_kwargs)
        train_time = time.perf_counter() - t0
        predicted = np.asarray(training.predict_labels(model, data.x_test))
        accuracy = float(np.mean(predicted == data.y_test))
        features = penultimate_features(model, data.x_test[points])
        t0 = time.perf_counter()
        embedding = tsne_lib.tsne(features, perplexity=perplexity,
                                  n_iter=tsne_iterations, seed=seed)
        tsne_time = time.perf_counter() - t0
        matrix = confusion_matrix(data.y_test, predicted, data.num_classes)
        counts = np.maximum(matrix[shown].sum(1, keepdims=True), 1)
        sub = matrix[np.ix_(shown, shown)] / counts
        record = {
            "encoding": encoding,
            "code_length": data.num_classes if codes is None else codes.shape[1],
            "seed": seed, "test_accuracy": accuracy,
            "knn5_agreement_features": tsne_lib.neighbour_agreement(
                features, labels),
            "knn5_agreement_tsne": tsne_lib.neighbour_agreement(
                embedding, labels),
            "confusion_classes": [data.class_names[c] for c in shown],
            "confusion": sub, "train_time": train_time,
            "tsne_time": tsne_time,
        }
        records.append(record)
        tsne_panels.append((f"{encoding} (k={record['code_length']}, "
                            f"acc {accuracy:.2f})", embedding, groups))
        confusion_panels.append((encoding, sub))
        progress.end({"final_accuracy": accuracy, "best_accuracy": accuracy,
                      "wall_time": train_time + tsne_time})
    results = {
        "experiment": "pictures",
        "dataset": common.describe_data(data),
        "settings": {"encodings": list(encodings), "code_length": k,
                     "seed": seed, "epochs": epochs, "batch_size": batch_size,
                     "points": int(len(points)), "colour": group_kind,
                     "tsne_iterations": tsne_iterations,
                     "perplexity": perplexity,
                     "similarity": similarity.describe()},
        "environment": common.environment(),
        "command": common.COMMAND,
        "encodings": records,
    }
    results["wall_time"] = time.perf_counter() - start
    results["markdown"] = pictures_markdown(results)
    results["files"] = []
    if output_dir is not None:
        short = [c.split("/")[-1][:12] for c in records[0]["confusion_classes"]]
        results["files"] = [
            plots.scatter_panels(
                common.output_path(output_dir, f"{name}_tsne.png"), tsne_panels,
                f"t-SNE of penultimate features, {len(points)} test images of "
                f"{data.name} (colour: {group_kind})"),
            plots.matrix_panels(
                common.output_path(output_dir, f"{name}_confusion.png"),
                confusion_panels, short,
                f"Confusions among the first {len(shown)} classes"),
            report.write_text(common.output_path(output_dir, f"{name}.md"),
                              results["markdown"]),
        ]
        results["files"].append(common.output_path(output_dir, f"{name}.json"))
        report.write_json(results["files"][-1],
                          {k: v for k, v in results.items() if k != "files"})
    return results


def pictures_markdown(results):
    s = results["settings"]
    rows = [[r["encoding"], r["code_length"], f"{100 * r['test_accuracy']:.1f}",
             f"{r['knn5_agreement_features']:.3f}",
             f"{r['knn5_agreement_tsne']:.3f}"] for r in results["encodings"]]
    text = (f"One network per encoding (seed {s['seed']}, {s['epochs']} epochs, "
            f"batch {s['batch_size']}); t-SNE of {s['points']} test images' "
            "penultimate features; k-NN agreement = fraction of the 5 nearest "
            "neighbours with the same class.\n\n")
    return text + report.markdown_table(
        ["encoding", "outputs", "test acc %", "5-NN agreement (features)",
         "5-NN agreement (t-SNE)"], rows)
