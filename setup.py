"""keras-ecoc: low-dimensional output codes for Keras 3 classifiers.

Install (the op library is compiled against the TensorFlow already installed,
hence --no-build-isolation; pyproject.toml declares the setuptools build, so
that `-e` is a PEP 660 editable build in this environment rather than the
legacy `setup.py develop`, which setuptools >= 80 turns into an isolated build
that cannot import TensorFlow and leaves no op library):

    pip install tensorflow-cpu==2.21.0 "setuptools>=64"
    pip install --no-build-isolation -e ".[cpu,test]"

The framework-free kernel library (keras_ecoc/_lib/_ecoc_kernels.so: XLA FFI
handlers and C entry points, used by JAX, PyTorch and TensorFlow's XLA) and,
when TensorFlow is installed, the TensorFlow op library
(keras_ecoc/_lib/_ecoc_ops.so) are built by kernels/build.py through a custom
build_ext. A failed build (no compiler, no
or wrong TensorFlow, nvcc error) never fails the installation: it warns and
installs the pure-Keras package (keras_ecoc.ops then falls back and says why
in keras_ecoc.ops.fused_status()). A failing CUDA part alone still installs
the CPU (and XLA) library.
"""

import importlib.util
import os
import sys
import traceback

from setuptools import Extension
from setuptools import find_packages
from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
LIB_SUBDIR = os.path.join("keras_ecoc", "_lib")
LIB_NAME = "_ecoc_ops.so"
KERNELS_LIB_NAME = "_ecoc_kernels.so"


def _load_kernels_build():
    """Imports kernels/build.py by path (a plain module, not a package).

    Loaded under a private name so that it never shadows the PyPA `build`
    package that may be driving this setup.py.
    """
    path = os.path.join(HERE, "kernels", "build.py")
    spec = importlib.util.spec_from_file_location("_keras_ecoc_kernels_build", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _warn_loudly(message):
    bar = "!" * 78
    sys.stderr.write(f"\n{bar}\nkeras-ecoc: WARNING: {message}\n{bar}\n\n")
    sys.stderr.flush()


class BuildEcocOps(build_ext):
    """Builds the fused-op library with g++ / nvcc instead of distutils."""

    def initialize_options(self):
        super().initialize_options()
        self._ecoc_outputs = []

    def run(self):
        inplace = bool(self.inplace or getattr(self, "editable_mode", False))
        if inplace:
            out_dir = os.path.join(HERE, LIB_SUBDIR)
        else:
            out_dir = os.path.join(os.path.abspath(self.build_lib), LIB_SUBDIR)
        try:
            builder = _load_kernels_build()
            results = builder.build_all(
                out_dir, build_dir=os.path.join(HERE, "build", "ecoc_ops"), verbose=True
            )
        except Exception as e:  # noqa: BLE001 - never fail the installation
            details = "".join(traceback.format_exception_only(type(e), e)).strip()
            _warn_loudly(
                "could not build the kernel libraries; installing the pure-Keras package "
                f"(keras_ecoc.ops falls back to the streaming / dense paths).\n{details[-4000:]}"
            )
            results = {}
        built = []
        for name, lib in (("kernels", KERNELS_LIB_NAME), ("ops", LIB_NAME)):
            result = results.get(name)
            if result is None or isinstance(result, Exception):
                stale = os.path.join(out_dir, lib)
                if not inplace and os.path.exists(stale):
                    os.remove(stale)  # never ship a library copied from the source tree
                continue
            for part, reason in result.skipped.items():
                _warn_loudly(f"{lib} was built without its {part.upper()} part: {reason}")
            built.append(result.path)
        self._ecoc_outputs = [] if inplace else built

    def get_outputs(self):
        return list(self._ecoc_outputs)

    def get_output_mapping(self):
        return {}

    def get_source_files(self):
        # What an sdist carries so that this build_ext runs from it: all of
        # kernels/ (the CPU, TensorFlow and FFI sources, the CUDA kernels, the
        # vendored XLA FFI headers with their licence, build.py), whatever
        # build.py reads.
        files = []
        for root, dirs, names in os.walk(os.path.join(HERE, "kernels")):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            files += [os.path.relpath(os.path.join(root, f), HERE) for f in sorted(names)
                      if not f.startswith(".") and not f.endswith(".pyc")]
        return files


def _long_description():
    path = os.path.join(HERE, "README.md")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    return __doc__


setup(
    name="keras-ecoc",
    version="0.1.0",
    description="Low-dimensional output codes (ECOC) instead of one-hot targets for Keras 3",
    long_description=_long_description(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # Two packages: the library (keras_ecoc, all a user needs) and the
    # research application on top of it (ecoc_research: demo, experiments,
    # data sets and the embedded Omniglot file).
    packages=find_packages(include=["keras_ecoc", "keras_ecoc.*",
                                    "ecoc_research", "ecoc_research.*"]),
    package_data={
        "keras_ecoc": ["_lib/*.so"],
        "ecoc_research": ["data/*.npz", "data/LICENSE*"],
    },
    include_package_data=False,
    install_requires=["keras>=3.10", "numpy>=1.26", "scipy>=1.11"],
    extras_require={
        "cpu": ["tensorflow-cpu==2.21.*"],
        "gpu": ["tensorflow[and-cuda]==2.21.*"],
        "datasets": ["tensorflow-datasets>=4.9"],
        "plots": ["matplotlib>=3.8"],
        # What the research application (`python -m ecoc_research.experiments`)
        # needs beyond the library: figures and t-SNE (checked before any
        # training starts). "experiments" is the older name of the same extra.
        "research": ["matplotlib>=3.8", "scikit-learn>=1.3"],
        "experiments": ["matplotlib>=3.8", "scikit-learn>=1.3"],
        # Approximate neighbour search for class_similarity(n_neighbors=...)
        # beyond 50,000 classes (checked before any work starts).
        "scale": ["faiss-cpu>=1.8"],
        # cuobjdump and nvdisasm for kernels/cuda/sass_loop_stats.py (static
        # SASS counts of the CUDA kernels' loops) where the CUDA toolkit has
        # none, as on this project's CI image.
        "sass": ["nvidia-cuda-cuobjdump>=13.0", "nvidia-cuda-nvdisasm>=13.0"],
        "test": [
            "pytest>=8",
            "pytest-xdist",
            "nbmake>=1.5",
            "ipykernel",
            "jax[cpu]==0.10.2",
            "torch==2.13.0",
            # Bit-exact TF32 mma model the CUDA emulator is checked against
            # (tests/test_cuda_emulator.py); a 15 kB pure-Python wheel.
            "mmasim==2.1.1",
            # cuobjdump and nvdisasm (5.5 MB): the tests that list the CUDA
            # objects' SASS run where the CUDA toolkit has neither (CI).
            "nvidia-cuda-cuobjdump>=13.0",
            "nvidia-cuda-nvdisasm>=13.0",
            "tensorflow-datasets>=4.9",
            "matplotlib>=3.8",
            "scikit-learn>=1.3",
            "faiss-cpu>=1.8",
        ],
    },
    entry_points={
        # Both commands belong to the research application.
        "console_scripts": [
            "keras-ecoc-demo=ecoc_research.demo:main",
            "keras-ecoc-experiments=ecoc_research.experiments.__main__:main",
        ]
    },
    # A placeholder extension: it makes setuptools run build_ext (and tag the
    # wheel as platform-specific); BuildEcocOps builds the real library.
    ext_modules=[Extension("keras_ecoc._lib._ecoc_ops", sources=[])],
    cmdclass={"build_ext": BuildEcocOps},
    zip_safe=False,
)
