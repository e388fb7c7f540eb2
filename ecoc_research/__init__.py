"""ecoc_research: the research application built on the keras_ecoc library.

Reproduces and extends the experiments of "Beyond One-hot Encoding: lower
dimensional target embedding" with the `keras_ecoc` library. None of it is
needed to use the library; it ships in the same repository and installs with
the same `pip install` (console scripts `keras-ecoc-demo` and
`keras-ecoc-experiments`).

- `datasets`: the embedded Omniglot subset, `.npz` files and
  tensorflow-datasets sets as `ImageDataset`s.
- `training`: the small CNN backbones, the one-hot pretraining and the
  retrained heads the experiments share.
- `demo`: the main job behind `make demo` (one-hot vs Gaussian vs data-based
  codes on embedded Omniglot, no network needed).
- `experiments`: the command line `python -m ecoc_research.experiments` (grid
  runner, CUB bits and attributes, pictures) and its statistics.
"""
