"""kernels/build.py's cache key and architectures, and the loader's TensorFlow-version check.

After a TensorFlow (or g++ / nvcc) upgrade every object must be rebuilt (the
headers sit at the same path, so the command line alone does not change), and
a library built against another TensorFlow must be refused with a clear
`fused_status()` instead of being loaded.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import keras

REPO = Path(__file__).resolve().parents[1]
BACKEND = keras.backend.backend()


@pytest.fixture(scope="module")
def build(kernels_build):
    return kernels_build


FAKE_TF = {"version": "2.21.0", "include": "/tf/include", "lib": "/tf", "cflags": ["-I/tf/include"],
           "lflags": ["-L/tf"]}


def _keys(build, tmp_path, toolchain, archs=("75", "80", "86", "89", "90")):
    units = build._units(FAKE_TF, "g++", "/cuda/bin/nvcc", "/cuda", True, True, str(tmp_path), {},
                         toolchain=toolchain, archs=list(archs))
    return {u.name: u.key() for u in units}


def test_cache_key_includes_tensorflow_compiler_and_nvcc_versions(build, tmp_path):
    base = {"tf": "2.21.0", "cxx": "g++ 12.2.0", "nvcc": "V13.0.88"}
    keys = _keys(build, tmp_path, base)
    assert {"ecoc_ops", "ecoc_kernels_cpu", "kcuda", "ecoc_probe_cu", "ecoc_ops_gpu"} <= set(keys)
    assert _keys(build, tmp_path, dict(base)) == keys  # deterministic
    other = _keys(build, tmp_path, {**base, "cxx": "g++ 13.1.0"})
    assert all(other[name] != keys[name] for name in keys)
    # The CUDA kernels take no TensorFlow header: a TensorFlow upgrade keeps
    # their object (shared with the kernel library), and changes every other.
    newer_tf = _keys(build, tmp_path, {**base, "tf": "2.22.0"})
    for name in keys:
        assert (newer_tf[name] == keys[name]) == (name == "kcuda"), name
    newer_nvcc = _keys(build, tmp_path, {**base, "nvcc": "V13.1.0"})
    for name in keys:
        cuda = name in ("kcuda", "ecoc_probe_cu", "ecoc_ops_gpu")
        assert (newer_nvcc[name] != keys[name]) == cuda, name
    fewer_archs = _keys(build, tmp_path, base, archs=("80", "90"))
    assert fewer_archs["kcuda"] != keys["kcuda"]
    assert fewer_archs["ecoc_probe_cu"] != keys["ecoc_probe_cu"]
    assert fewer_archs["ecoc_ops"] == keys["ecoc_ops"]


def test_both_libraries_share_one_nvcc_object_of_the_cuda_kernels(build):
    toolchain = {"tf": "2.21.0", "cxx": "g++ 12.2.0", "nvcc": "V13.0.88"}
    archs = ["75", "80", "86", "89", "90"]
    ops_units = build._units(FAKE_TF, "g++", "/cuda/bin/nvcc", "/cuda", True, True, "/shim", {},
                             toolchain=toolchain, archs=archs)
    kernel_units = build._kernel_units("g++", "/cuda/bin/nvcc", "/cuda", True,
                                       {"cxx": toolchain["cxx"], "nvcc": toolchain["nvcc"]}, archs)
    (ops_cu,) = [u for u in ops_units if u.src.endswith("ecoc_kernels.cu.cc")]
    (lib_cu,) = [u for u in kernel_units if u.src.endswith("ecoc_kernels.cu.cc")]
    # Same name and key: the object file name in build/obj is the same.
    assert (ops_cu.name, ops_cu.key()) == (lib_cu.name, lib_cu.key())


def test_architectures_cover_common_cards_plus_ptx_and_the_visible_gpu(build, monkeypatch):
    monkeypatch.delenv("KERAS_ECOC_CUDA_ARCHS", raising=False)
    assert build.cuda_archs(visible=[]) == ["75", "80", "86", "89", "90"]
    flags = build.cuda_gencode_flags(build.cuda_archs(visible=[]))
    assert flags[0] == "-gencode=arch=compute_75,code=sm_75"
    assert flags[-1] == "-gencode=arch=compute_90,code=[sm_90,compute_90]"
    assert build.cuda_arch_names(["75", "90"]) == "sm_75,sm_90,compute_90"
    # A GPU seen at build time is always included (PTX then comes from the newest).
    assert build.cuda_archs(visible=["120"])[-1] == "120"
    assert build.cuda_archs(visible=["87"]) == ["75", "80", "86", "87", "89", "90"]
    # nvcc 13 has no sm_70: a V100 at build time must not break the CUDA part.
    assert build.cuda_archs(visible=["70"]) == ["75", "80", "86", "89", "90"]
    monkeypatch.setenv("KERAS_ECOC_CUDA_ARCHS", "sm_80, 9.0")
    assert build.cuda_archs(visible=["86"]) == ["80", "86", "90"]
    monkeypatch.setenv("KERAS_ECOC_CUDA_ARCHS", "ampere")
    with pytest.raises(build.BuildError, match="KERAS_ECOC_CUDA_ARCHS"):
        build.cuda_archs(visible=[])


def test_build_info_source_embeds_the_versions(build, tmp_path):
    info = {"tensorflow": "2.21.0", "cxx": 'g++ "quoted" 12', "nvcc": None}
    src = build.write_build_info(str(tmp_path), info)
    obj = tmp_path / "info.o"
    subprocess.run(["g++", "-c", src, "-o", str(obj)], check=True)
    data = obj.read_bytes()
    start = data.index(b"KERAS_ECOC_BUILD_INFO=") + len("KERAS_ECOC_BUILD_INFO=")
    assert json.loads(data[start:data.index(b";", start)].decode()) == info
    mtime = os.stat(src).st_mtime_ns
    build.write_build_info(str(tmp_path), info)  # unchanged content: not rewritten
    assert os.stat(src).st_mtime_ns == mtime


# ---------------------------------------------------------------------------
# The loader (TensorFlow backend, built library).

_STATUS = r"""
from keras_ecoc import ops
print(ops.fused_available())
print(ops.fused_status())
"""


def _built_library():
    if BACKEND != "tensorflow":
        pytest.skip(f"backend is {BACKEND}: the fused op is TensorFlow-only")
    from keras_ecoc.ops import _loader

    path = _loader.library_path()
    if not os.path.exists(path):
        pytest.skip(f"{path} is not built")
    return path


def _status(library):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3",
               KERAS_ECOC_OPS_LIBRARY=str(library),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("KERAS_ECOC_DISABLE_FUSED", None)
    proc = subprocess.run([sys.executable, "-c", _STATUS], capture_output=True, text=True,
                          env=env, timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    available, status = proc.stdout.strip().splitlines()[-2:]
    return available == "True", status


def test_library_says_which_tensorflow_it_was_built_against():
    import tensorflow as tf

    from keras_ecoc.ops import _loader

    info = _loader.library_info(_built_library())
    assert info["tensorflow"] == tf.__version__
    assert info["cxx"] and info["cxx"].startswith(("g++", "c++", "clang"))


def test_loader_refuses_a_library_built_against_another_tensorflow(tmp_path):
    import tensorflow as tf

    from keras_ecoc.ops import _loader

    lib = _built_library()
    hint = "rebuild with `python kernels/build.py --force`"
    # Running another TensorFlow than the library was built against.
    with pytest.raises(ImportError, match="running TensorFlow 2.99.0") as err:
        _loader._check_built_for(lib, "2.99.0")
    assert f"built against TensorFlow {tf.__version__}, running TensorFlow 2.99.0: {hint}" in str(err.value)
    # A patch release keeps the C++ ABI: accepted.
    major, minor = tf.__version__.split(".")[:2]
    _loader._check_built_for(lib, f"{major}.{minor}.99")
    # A file whose embedded version differs (same length, so the file stays valid).
    data = Path(lib).read_bytes()
    marker = f'"tensorflow":"{tf.__version__}"'.encode()
    assert data.count(marker) == 1
    fake_version = "9" * len(major) + tf.__version__[len(major):]
    fake = tmp_path / "_ecoc_ops.so"
    fake.write_bytes(data.replace(marker, f'"tensorflow":"{fake_version}"'.encode()))
    with pytest.raises(ImportError, match=f"built against TensorFlow {fake_version}, running "
                                          f"TensorFlow {tf.__version__}"):
        _loader._check_built_for(str(fake), tf.__version__)
    # End to end in a fresh process: nothing is loaded, fused_status() says why.
    ok, status = _status(fake)
    assert not ok
    assert f"built against TensorFlow {fake_version}, running TensorFlow {tf.__version__}: {hint}" in status
    assert "using the non-fused path" in status


def test_loader_refuses_a_library_without_embedded_versions(tmp_path):
    from keras_ecoc.ops import _loader

    lib = _built_library()
    fake = tmp_path / "_ecoc_ops.so"
    shutil.copy(lib, fake)
    fake.write_bytes(fake.read_bytes().replace(b"KERAS_ECOC_BUILD_INFO=", b"KERAS_ECOC_BUILD_XXXX="))
    with pytest.raises(ImportError, match="does not say which TensorFlow it was built against") as err:
        _loader._check_built_for(str(fake), "2.21.0")
    assert "python kernels/build.py --force" in str(err.value)
