"""Reproductions of the experiments of "Beyond One-hot Encoding".

Command line: ``python -m ecoc_research.experiments <experiment> [options]`` (or
the ``keras-ecoc-experiments`` console script), with experiments

- ``cub-bits``: accuracy against code length ("add bits" figure), fc7 + fc8
  retrained on a backbone pretrained on disjoint classes (CIFAR-10),
- ``attributes``: correlation of code bits with CUB attributes (Table 2),
  against a random-code null distribution,
- ``pictures``: t-SNE of penultimate features and confusion matrices,
- ``grid``: the shared runner's grid (protocol, encoding, k, batch,
  optimizer, learning rate, seed) with paired statistics; it covers the
  code design ablation (Table 1: encodings x code lengths), convergence
  against mini-batch size and the decoding-scale comparison
  (``--scale S [--fixed-scale]``),
- ``all``: every experiment above but ``grid``.

Each experiment is also a function returning a JSON-able dict and writing
JSON, Markdown and PNG files into an output folder.
"""

from ecoc_research.experiments.attributes import attribute_correlation
from ecoc_research.experiments.attributes import run_attributes
from ecoc_research.experiments.common import DataOptions
from ecoc_research.experiments.common import load_data
from ecoc_research.experiments.cub_bits import run_cub_bits
from ecoc_research.experiments.grid import Grid
from ecoc_research.experiments.grid import run_grid
from ecoc_research.experiments.pictures import run_pictures
from ecoc_research.experiments.runner import RunSpec
from ecoc_research.experiments.runner import Runner
from ecoc_research.experiments.tsne import tsne

__all__ = [
    "DataOptions",
    "Grid",
    "RunSpec",
    "Runner",
    "run_grid",
    "attribute_correlation",
    "load_data",
    "run_attributes",
    "run_cub_bits",
    "run_pictures",
    "tsne",
]
