"""Builds the stand-alone CUDA harness (kernels/cuda/harness.cu) with nvcc and runs it,
and checks what of kernels/cuda/device_check.sh can run without a GPU.

The harness is built for one architecture, as device_check.sh builds it (the
visible GPU's, else the newest of kernels/build.py's list, SASS + PTX), with
OpenMP, and linked with the kernel object the library build compiled for
every architecture (compiled here only where that object is missing); skipped
where nvcc is not on the PATH. Without a GPU every mode must
say so and exit with code 2; with one, every check must pass (exit 0). That
the kernels compile for every architecture of the list is the library
build's job (kernels/build.py compiles ecoc_kernels.cu.cc with all of them
before the tests); here the library's -gencode flags are checked on its small
probe unit. Building the harness for all five architectures took minutes of
nvcc on 2 cores; one takes a fifth of that (still ``slow``). The
device_check.sh tests are fast and need no nvcc.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CUDA_DIR = REPO / "kernels" / "cuda"
DEVICE_CHECK = CUDA_DIR / "device_check.sh"
NVCC = shutil.which("nvcc")

def _gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU, decided without the harness."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def _harness_archs(build) -> list:
    """The visible GPU's architecture (so that its checks run), else the newest default."""
    visible = [a for a in build.visible_gpu_archs() if int(a) >= build.MIN_CUDA_ARCH]
    return visible[-1:] or build.cuda_archs()[-1:]


def _cuobjdump_or_skip() -> str:
    listing = _load_sass_tool().find_cuobjdump()
    if listing is None:
        pytest.skip("cuobjdump is not installed with this CUDA toolkit: what a fatbinary holds "
                    "cannot be listed")
    return listing


@pytest.fixture(scope="module")
def harness(tmp_path_factory, kernels_build) -> Path:
    exe = tmp_path_factory.mktemp("ecoc_harness") / "ecoc_harness"
    build = kernels_build
    archs = _harness_archs(build)
    # The kernels: the library build's object of ecoc_kernels.cu.cc (every
    # architecture, -O3) when `make test`'s kernels/build.py left one for
    # these sources, which saves nvcc ~45 s over the kernels on 2 cores;
    # else compiled here with the harness, as device_check.sh does.
    kernels_obj = build.cuda_kernels_object()
    kernels = ([kernels_obj] if kernels_obj is not None else
               # The kernels live in a .cu.cc file; without -x cu nvcc would
               # hand it to the host compiler.
               ["-x", "cu", str(CUDA_DIR / "ecoc_kernels.cu.cc")])
    cmd = [
        NVCC,
        "-O2",
        "-std=c++17",
        "--expt-relaxed-constexpr",
        *build.nvcc_thread_flags(len(archs)),
        *build.cuda_gencode_flags(archs),
        "-Xcompiler",
        "-fopenmp",
        f"-I{REPO / 'kernels'}",
        str(CUDA_DIR / "harness.cu"),
        *kernels,
        "-o",
        str(exe),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"
    assert exe.exists()
    return exe


def _assert_no_gpu_or_pass(proc, min_passes):
    output = proc.stdout + proc.stderr
    if _gpu_present():
        assert proc.returncode == 0, output
        assert not [line for line in proc.stdout.splitlines() if line.startswith("FAIL ")], output
        assert len([line for line in proc.stdout.splitlines() if line.startswith("PASS ")]) >= min_passes
        assert " 0 failed" in proc.stdout, output
    else:
        assert proc.returncode == 2, output
        assert "no CUDA device available" in proc.stdout, output
        assert "PASS" not in proc.stdout and "FAIL" not in proc.stdout, output


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_harness_checks(harness):
    proc = subprocess.run(
        [str(harness), "--check-only"], capture_output=True, text=True, timeout=900
    )
    _assert_no_gpu_or_pass(proc, min_passes=100)


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_harness_holds_its_architecture(harness, kernels_build):
    listing = _cuobjdump_or_skip()
    elf = subprocess.run([listing, "--list-elf", str(harness)], capture_output=True, text=True)
    ptx = subprocess.run([listing, "--list-ptx", str(harness)], capture_output=True, text=True)
    arch = _harness_archs(kernels_build)[0]
    assert f"sm_{arch}" in elf.stdout, elf.stdout
    assert f"sm_{arch}" in ptx.stdout, ptx.stdout


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_library_gencode_flags_put_every_architecture_in_the_fatbinary(tmp_path, kernels_build):
    # The flags of the library's CUDA units (kernels/build.py), on its probe unit (one
    # small kernel): SASS for every architecture of the list, PTX of the newest.
    build = kernels_build
    listing = _cuobjdump_or_skip()
    archs = build.cuda_archs()
    obj = tmp_path / "probe.o"
    proc = subprocess.run(
        [NVCC, "-std=c++17", "-x", "cu", "-c", *build.nvcc_thread_flags(len(archs)),
         *build.cuda_gencode_flags(archs), f'-DECOC_CUDA_ARCHS="{build.cuda_arch_names(archs)}"',
         str(CUDA_DIR / "ecoc_probe.cu.cc"), "-o", str(obj)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"
    elf = subprocess.run([listing, "--list-elf", str(obj)], capture_output=True, text=True)
    ptx = subprocess.run([listing, "--list-ptx", str(obj)], capture_output=True, text=True)
    for arch in archs:
        assert f"sm_{arch}" in elf.stdout, elf.stdout
    assert f"sm_{archs[-1]}" in ptx.stdout, ptx.stdout


def _compile_sm90a_wgmma(tmp_path, header: str, instantiations: list[str],
                         mangled_part: str) -> tuple[list[str], str | None]:
    """Compiles the explicit instantiations of header's kernels for sm_90a
    (the H100 / H200 image device_check.sh builds: compute_90a / sm_90a with
    KERAS_ECOC_SM90A_IMAGE) and asserts what every wgmma kernel must keep:
    ptxas accepts them, keeps the products asynchronous and spills nothing.
    Its notes C7510-C7515 say where it serialises products (as it did the
    TF32 forward's with a branch in the k-step loop), C7519 where it injects
    a warpgroup.arrive (as for the codes gradient's split halves before
    ptx::wgmma_pin). Returns the ptxas entries whose mangled name holds
    mangled_part, and the SASS listing (None without cuobjdump)."""
    source = tmp_path / "wgmma.cu"
    source.write_text(f'#include "{header}"\n'
                      "namespace d = keras_ecoc::cuda::detail;\n" +
                      "".join(f"template __global__ void {i}(d::{args});\n"
                              for i, args in instantiations))
    cubin = tmp_path / "wgmma.cubin"
    proc = subprocess.run(
        [NVCC, "-O3", "-DNDEBUG", "-std=c++17", "--expt-relaxed-constexpr", "-cubin",
         "-gencode=arch=compute_90a,code=sm_90a", "-DKERAS_ECOC_SM90A_IMAGE=1", "-Xptxas", "-v",
         f"-I{REPO / 'kernels'}", f"-I{CUDA_DIR}", "-x", "cu", str(source), "-o", str(cubin)],
        capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"nvcc failed:\n{log[-4000:]}"
    assert not re.search(r"C751\d|serialized", log), log[-4000:]
    # ptxas -v: "Compiling entry function '<name>' for 'sm_90a'", then its
    # stack / spill line and its register line.
    entries = re.split(r"Compiling entry function '", log)[1:]
    wgmma = [e for e in entries if mangled_part in e.split("'", 1)[0]]
    assert len(wgmma) == len(instantiations), [e.split("'", 1)[0] for e in entries]
    for e in wgmma:
        assert "0 bytes spill stores, 0 bytes spill loads" in e, e[:600]
    listing = _load_sass_tool().find_cuobjdump()
    if listing is None:
        return wgmma, None
    return wgmma, subprocess.run([listing, "-sass", str(cubin)], capture_output=True,
                                 text=True).stdout


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_wgmma_forward_compiles_for_sm90a_without_serialised_products(tmp_path):
    # The kWgmma forward exists as wgmma only in the sm_90a image; the
    # library's sm_90 image holds its trap stubs, and the emulator models
    # the PTX, not ptxas, so the real instructions are compiled here. Its
    # two instantiations only, as the launcher's (3 s of nvcc instead of
    # 55 s for the whole unit).
    forward = "d::ForwardRegKernel<d::kMath{}, 128, 8, false, 128, true>"
    _, sass = _compile_sm90a_wgmma(
        tmp_path, "ecoc_forward_reg.cuh",
        [(forward.format(m), "ForwardSplitArgs") for m in ("3xTf32", "Tf32")],
        "Li128ELi8ELb0ELi128ELb1E")
    if sass is not None:
        for shape in ("64x64x8", "64x32x8", "64x128x8"):
            assert f"HGMMA.{shape}.F32.TF32" in sass, shape


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_wgmma_codes_gradient_compiles_for_sm90a_without_serialised_products(tmp_path):
    # The same for rows64+gradmma+wgmma's six instantiations (both TF32
    # modes x KMAX 32, 64, 128: one m-tile of G^T, or two): no serialised
    # product, no injected warpgroup.arrive, no spill, and HGMMA 64x32 (the
    # 32-class tile) in each.
    grad = "d::CodesGradWgmmaKernel<d::kMath{}, {}>"
    entries, sass = _compile_sm90a_wgmma(
        tmp_path, "ecoc_codes_grad_wgmma.cuh",
        [(grad.format(m, kmax), "CodesGradArgs") for m in ("3xTf32", "Tf32")
         for kmax in (32, 64, 128)],
        "CodesGradWgmmaKernel")
    if sass is not None:
        assert "HGMMA.64x32x8.F32.TF32" in sass
        functions = sass.split("Function : ")[1:]
        assert len(functions) >= 6
        for f in functions:
            if "CodesGradWgmmaKernel" in f.split("\n", 1)[0]:
                assert "HGMMA.64x32x8.F32.TF32" in f, f.split("\n", 1)[0]


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("mode, min_passes", [("--small", 50), ("--smem-limit", 4)])
def test_harness_grid_modes(harness, mode, min_passes):
    proc = subprocess.run([str(harness), mode], capture_output=True, text=True, timeout=900)
    _assert_no_gpu_or_pass(proc, min_passes)


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_harness_rejects_unknown_flags(harness):
    proc = subprocess.run(
        [str(harness), "--no-such-flag"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert "usage:" in proc.stderr
    proc = subprocess.run([str(harness), "--grid", "--small"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "at most one of" in proc.stderr
    proc = subprocess.run([str(harness), "--auto-table", "--small"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3 and "--auto-table" in proc.stderr
    # The variant names include auto, the params structs' default.
    proc = subprocess.run([str(harness), "--variant", "nope"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3 and "auto" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_harness_usage_and_variant_error_name_every_variant_of_its_table(harness):
    # Both lists come from kVariants, the table --variant looks names up in:
    # a variant added there is offered and refused-with-the-list at once.
    table = re.search(r"constexpr VariantName kVariants\[\] = \{(.*?)\n\};",
                      (REPO / "kernels" / "cuda" / "harness.cu").read_text(), re.S).group(1)
    names = re.findall(r'\{KernelVariant::\w+, "([^"]+)"\}', table)
    assert "auto" in names and "rows128+regsoftmax+warps8" in names
    usage = subprocess.run([str(harness), "--no-such-flag"], capture_output=True, text=True,
                           timeout=60)
    error = subprocess.run([str(harness), "--variant", "nope"], capture_output=True, text=True,
                           timeout=60)
    assert usage.returncode == error.returncode == 3
    offered = usage.stderr.split("all, or one of", 1)[1].split("--only", 1)[0].split()
    assert offered == names
    listed = error.stderr.split("must be one of", 1)[1].split("; got")[0]
    assert [w.strip() for w in listed.split(",")][:-1] == names
    assert listed.rstrip().endswith("or all")


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_harness_only_names_its_check_sections_and_refuses_other_names_and_modes(harness):
    # --only looks names up in kCheckSections, the table RunChecks walks: the
    # usage offers its names in order, and a wrong name or a mode without
    # the checks is refused before any device is asked for.
    table = re.search(r"constexpr CheckSection kCheckSections\[\] = \{(.*?)\n\};",
                      (REPO / "kernels" / "cuda" / "harness.cu").read_text(), re.S).group(1)
    names = re.findall(r'^\s*\{"([^"]+)",', table, re.M)
    assert names[0] == "cases" and "gradmma+wgmma" in names and len(names) == len(set(names))
    usage = subprocess.run([str(harness), "--no-such-flag"], capture_output=True, text=True,
                           timeout=60)
    assert usage.stderr.split("--only S[,S]", 1)[1].split("S one of", 1)[1].split() == names

    def refused(*args: str) -> str:
        proc = subprocess.run([str(harness), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        return proc.stderr

    error = refused("--check-only", "--only", "gradmma,nope")
    assert "--only must be a comma-separated list of check sections" in error
    assert ", ".join(names) in error and error.rstrip().endswith("got gradmma,nope")
    assert "use it with --check-only" in refused("--only", "gradmma")
    assert "use it with --check-only" in refused("--small", "--only", "gradmma")


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("args", [["--bench-only", "--quick", "--variant", "auto"],
                                  ["--auto-table"]])
def test_harness_takes_the_auto_variant_and_its_table(harness, args):
    proc = subprocess.run([str(harness), *args], capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    if not _gpu_present():
        assert proc.returncode == 2 and "no CUDA device available" in proc.stdout, output
        return
    assert proc.returncode == 0, output
    if "--auto-table" in args:
        assert re.search(r"^auto cc=\d+ pass=forward math=3xtf32 B=256 n=300000 k=128 -> \S+$",
                         proc.stdout, re.M), output
    else:
        assert "### math mode 3xtf32, variant auto" in proc.stdout and "codes grad" in proc.stdout


# ---------------------------------------------------------------------------
# kernels/cuda/device_check.sh without a GPU (fast, no nvcc needed).

def test_device_check_script_parses_and_dry_runs_every_step(tmp_path):
    assert os.access(DEVICE_CHECK, os.X_OK), "device_check.sh must be executable"
    assert subprocess.run(["bash", "-n", str(DEVICE_CHECK)]).returncode == 0
    proc = subprocess.run(["bash", str(DEVICE_CHECK), "--dry-run"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, OUT=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["build", "ldmatrix", "wgmma", "checks", "grid", "smem-limit", "memcheck",
                     "racecheck", "bench", "ncu", "ncu-codes-grad"]
    # The card's ldmatrix against plain loads: the selftest the emulator's model runs too.
    ldm = next(line for line in proc.stdout.splitlines() if line.startswith("step ldmatrix"))
    assert "emu/selftest/ldmatrix.cu" in ldm and '"$4/ldm.bin" ok' in ldm, ldm
    # The kWgmma forward's layouts on the card (sm_90a), and the harness
    # built as the sm_90a image that may run it.
    wgm = next(line for line in proc.stdout.splitlines() if line.startswith("step wgmma"))
    assert "emu/selftest/wgmma.cu" in wgm and "code=sm_90a" in wgm, wgm
    build = next(line for line in proc.stdout.splitlines() if line.startswith("step build"))
    assert "code=sm_90a" in build and "-DKERAS_ECOC_SM90A_IMAGE=1" in build, build
    # Every launch variant timed side by side; the ncu profiles of the forward
    # and of the codes gradient, both from `harness --profile`.
    assert "--bench-only --quick --variant all" in proc.stdout
    # Both forward split kernels: v2's and the register-softmax one.
    ncu_steps = {line.split()[1]: line for line in proc.stdout.splitlines()
                 if line.startswith("step ncu")}
    assert "--kernel-name regex:Forward(Split|Reg)Kernel" in ncu_steps["ncu"]
    # The codes-gradient kernels: the split one, kGradMma's and kGradPersistent's.
    assert "--kernel-name regex:CodesGrad(Split|Mma|Persistent)Kernel" in ncu_steps["ncu-codes-grad"]
    assert all(line.rstrip().endswith(" --profile") for line in ncu_steps.values()), ncu_steps
    limits = [int(line.split("(<= ")[1].split(" s)")[0]) for line in proc.stdout.splitlines()
              if line.startswith("step ")]
    assert sum(limits) <= 480, limits  # one run of at most 8 minutes
    assert str(tmp_path / "device_check.md") in proc.stdout
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


def test_device_check_without_gpu_says_so_and_runs_nothing(tmp_path):
    if _gpu_present():
        pytest.skip("this machine has a GPU: run kernels/cuda/device_check.sh itself")
    proc = subprocess.run(["bash", str(DEVICE_CHECK)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, OUT=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert "no GPU" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_device_check_rejects_unknown_arguments():
    proc = subprocess.run(["bash", str(DEVICE_CHECK), "--frobnicate"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 3 and "unknown argument" in proc.stderr


_FAKE_NVIDIA_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=compute_cap) echo "9.0" ;;
  *) echo "Fake H100, 9.0, 580.65" ;;
esac
"""

# Writes, as the "harness", a script that prints what the real one prints in
# each mode and fails the mode named in $FAKE_FAIL.
_FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "fake nvcc"; echo "Build cuda_13.0.fake"; exit 0; fi
out=""
while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then out="$2"; fi; shift; done
cat > "$out" <<'HARNESS'
#!/bin/sh
echo "Device 0: Fake H100, compute capability 9.0"
if [ "$1" = "--bench-only" ]; then
  echo "## Timings (float32 z, int32 labels; median of 25 after 5 warm-up)"
  echo "| B | k | n | forward (ms) | codes grad (ms) |"
  echo "| 16 | 32 | 100 | 0.0100 | 0.0200 |"
  echo "Largest drop in free device memory while the kernels ran: 0 bytes"
  exit 0
fi
if [ "$1" = "$FAKE_FAIL" ]; then echo "FAIL x: y"; echo "2 checks, 1 failed"; exit 1; fi
echo "PASS x: y"; echo "2 checks, 0 failed"; echo OK
HARNESS
chmod +x "$out"
"""

_FAKE_SANITIZER = """#!/bin/sh
tool="$2"; shift 4
"$@"; rc=$?
if [ "$tool" = racecheck ]; then echo "========= RACECHECK SUMMARY: 0 hazards displayed"
else echo "========= ERROR SUMMARY: 0 errors"; fi
exit $rc
"""


# Nsight Compute: skips its options (each with one value), runs the program,
# prints one header line, as ncu does, for the kernel its --kernel-name asked for.
_FAKE_NCU = """#!/bin/sh
kernel=ForwardSplitKernel
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do
  case "$2" in *CodesGrad*) kernel=CodesGradSplitKernel ;; esac
  shift 2
done
"$@"; rc=$?
echo "  void keras_ecoc::cuda::detail::$kernel<1, 16, false>(...) (16, 264, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0"
exit $rc
"""


def _fake_gpu_env(tmp_path, fail=""):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nvidia-smi", _FAKE_NVIDIA_SMI), ("nvcc", _FAKE_NVCC),
                       ("compute-sanitizer", _FAKE_SANITIZER), ("ncu", _FAKE_NCU)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "out"
    return out, dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OUT=str(out),
                     NVCC=str(bin_dir / "nvcc"), COMPUTE_SANITIZER=str(bin_dir / "compute-sanitizer"),
                     NCU=str(bin_dir / "ncu"), FAKE_FAIL=fail)


def test_device_check_plumbing_with_a_fake_gpu_writes_one_table(tmp_path):
    # No GPU here: fake nvidia-smi, nvcc (whose "harness" prints what the real
    # one prints) and compute-sanitizer check that every step runs in order
    # and lands in the report. The real run needs a GPU machine.
    out, env = _fake_gpu_env(tmp_path)
    proc = subprocess.run(["bash", str(DEVICE_CHECK)], capture_output=True, text=True, timeout=120,
                          env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = (out / "device_check.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and " | pass | " in line]
    assert [r.split(" | ")[0][2:] for r in rows] == [
        "build", "ldmatrix", "wgmma", "checks", "grid", "smem-limit", "memcheck", "racecheck",
        "bench", "ncu", "ncu-codes-grad"], report
    # The seconds column is bash's whole-second $SECONDS difference: a fake
    # step that straddles a second boundary reports 1, not 0.
    for step in ("ncu", "ncu-codes-grad"):
        assert re.search(rf"^\| {step} \| pass \| [01] \| 1 kernel reports in device_check\.log \|$",
                         report, re.M), report
    assert "2 checks, 0 failed" in report and "RACECHECK SUMMARY: 0 hazards" in report
    assert "| 16 | 32 | 100 | 0.0100 | 0.0200 |" in report
    assert "harness built for sm_90" in report
    log = (out / "device_check.log").read_text()
    assert "## step grid: pass" in log


def test_device_check_reports_a_failing_step_and_exits_nonzero(tmp_path):
    out, env = _fake_gpu_env(tmp_path, fail="--grid")
    proc = subprocess.run(["bash", str(DEVICE_CHECK)], capture_output=True, text=True, timeout=120,
                          env=env, cwd=str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = (out / "device_check.md").read_text()
    assert "| grid | FAIL |" in report and "exit code 1; 2 checks, 1 failed" in report, report
    assert "| checks | pass |" in report and "| bench | pass |" in report
    assert "    FAIL x: y" in report


# ---------------------------------------------------------------------------
# kernels/cuda/sass_loop_stats.py on a hand-written listing (no cuobjdump needed).

_CONTROL_WORD = 0x000FE20003FAE200  # a second instruction word: stall count 1 (bits 41-44)


def _sass(name: str, body: list, stall=lambda text: 1) -> str:
    """A `cuobjdump -sass` style listing of one function: (address, text) lines,
    each instruction's second word carrying the stall count stall(text)."""
    lines = [f"\t\tFunction : {name}"]
    for address, text in body:
        control = (_CONTROL_WORD & ~(0xF << 41)) | (stall(text) << 41)
        lines.append(f"        /*{address:04x}*/                   {text} ;"
                     "                        /* 0x000fe20003fae200 */")
        lines.append(f"                                                     /* 0x{control:016x} */")
    return "\n".join(lines) + "\n"


def _staging_loop(start: int) -> tuple:
    """A vector staging loop from `start`: 4 instructions per 16-byte copy."""
    return ("IADD3 R14, P4, R14, R27, RZ", "LDGSTS.E.BYPASS.128 [R15], desc[UR12][R8.64], P1",
            "ISETP.GE.AND P1, PT, R10, 0x40, PT", f"@!P1 BRA 0x{start:x}")


# ForwardRegKernel<3xtf32 (1), BT = 16, NW = 4>: WC = 4, NT = 2, so one k step
# is 6 HMMA; the inner loop below holds 12 (ptxas unrolled two k steps).
_REG_NAME = "_ZN10keras_ecoc4cuda6detail16ForwardRegKernelILi1ELi16ELi4EEEvNS1_16ForwardSplitArgsE"


def _reg_listing(extra_ldg: int, staging: bool = False, stall=lambda text: 1) -> str:
    body = [(0x000, "MOV R1, c[0x0][0x28]")]
    addr = 0x010
    tile_start = addr
    for _ in range(extra_ldg):
        body.append((addr, "LDG.E R2, desc[UR4][R4.64]"))
        addr += 0x10
    if staging:  # a vector staging loop: 4 instructions per 16-byte copy
        stage_start = addr
        for text in _staging_loop(stage_start):
            body.append((addr, text))
            addr += 0x10
    kstep_start = addr
    for i in range(12):
        body.append((addr, "HMMA.1688.F32.TF32 R8, R12, R16, R8"))
        addr += 0x10
        body.append((addr, f"LDS R{20 + i}, [R3+0x{4 * i:x}]"))
        addr += 0x10
    body.append((addr, f"@!P0 BRA 0x{kstep_start:x}"))  # k-step loop: 25 instructions
    addr += 0x10
    body.append((addr, "MUFU.EX2 R5, R6"))
    addr += 0x10
    body.append((addr, "@P1 BRA 0x" + f"{addr + 0x20:x}"))  # forward branch: not a loop
    addr += 0x10
    body.append((addr, "HMMA.1688.F32.TF32 R8, R12, R16, R8"))
    addr += 0x10
    body.append((addr, f"@!P2 BRA 0x{tile_start:x}"))
    addr += 0x10
    body.append((addr, "EXIT"))
    return _sass(_REG_NAME, body, stall) + _sass("_ZN10keras_ecoc4cuda6detail17PrepClassesKernelENS1_8PrepArgsE",
                                          [(0x0, "MOV R1, R2"), (0x10, "EXIT")])


def _load_sass_tool():
    from conftest import load_script  # noqa: PLC0415

    return load_script(CUDA_DIR / "sass_loop_stats.py", "sass_loop_stats", register=True)


def test_sass_loop_stats_counts_the_tile_loop_and_estimates_a_tile(tmp_path):
    tool = _load_sass_tool()
    listing = tmp_path / "new.sass"
    listing.write_text(_reg_listing(extra_ldg=2))
    stats = tool.collect(str(listing), "ForwardRegKernel", 128)
    assert list(stats) == ["ForwardRegKernel<3xtf32, 16, 4>"]
    st = stats["ForwardRegKernel<3xtf32, 16, 4>"]
    # Tile loop: 2 LDG + 25 (k-step loop) + MUFU + forward BRA + HMMA + BRA = 31.
    assert st.tile_total == 31 and st.kstep_total == 25
    assert st.tile["LDG"] == 2 and st.tile["HMMA"] == 13 and st.tile["BRA"] == 3
    # Two k steps per pass: kp = 128 is 16 steps, 8 passes of the k-step loop.
    assert st.unroll == 2
    assert st.per_tile == 31 - 25 + 8 * 25
    assert tool.collect(str(listing), "ForwardRegKernel", 32)["ForwardRegKernel<3xtf32, 16, 4>"] \
        .per_tile == 31 - 25 + 2 * 25
    # With a staging loop: 64 x 128 / 4 copies over 128 threads, 16 per
    # thread, at 4 instructions each; the loop's own 4 static ones leave the
    # body.
    listing.write_text(_reg_listing(extra_ldg=2, staging=True))
    st = tool.collect(str(listing), "ForwardRegKernel", 128)["ForwardRegKernel<3xtf32, 16, 4>"]
    assert st.tile_total == 35 and st.copy_cost == 4
    assert st.per_tile == (35 - 25 - 4) + 8 * 25 + 16 * 4


def test_sass_loop_stats_adds_up_the_stall_counts_of_a_tile(tmp_path):
    """Stall cycles per tile: each instruction's control-bit stall count,
    weighted as the instruction count of the per-tile estimate; a listing
    without the second instruction words has none."""
    tool = _load_sass_tool()
    assert tool.stall_cycles(_CONTROL_WORD) == 1
    assert tool.stall_cycles((_CONTROL_WORD & ~(0xF << 41)) | (13 << 41)) == 13
    listing = tmp_path / "new.sass"
    # A product's result waited on for 7 cycles, everything else 1.
    listing.write_text(_reg_listing(extra_ldg=2, stall=lambda text: 7 if "HMMA" in text else 1))
    st = tool.collect(str(listing), "ForwardRegKernel", 128)["ForwardRegKernel<3xtf32, 16, 4>"]
    # Tile body: 2 LDG, MUFU, 2 BRA at 1 and one HMMA at 7; the k-step loop
    # (12 HMMA at 7, 12 LDS and its BRA at 1) 8 times.
    assert st.cycles == (2 + 1 + 2 + 7) + 8 * (12 * 7 + 12 + 1)
    bare = tmp_path / "bare.sass"
    bare.write_text("\n".join(line for line in listing.read_text().splitlines()
                               if "/*0" in line or "Function" in line) + "\n")
    st = tool.collect(str(bare), "ForwardRegKernel", 128)["ForwardRegKernel<3xtf32, 16, 4>"]
    assert st.per_tile == 31 - 25 + 8 * 25 and st.cycles is None



# CodesGradMmaKernel<3xtf32 (1), BT = 64, KMAX = 128>: the first product's
# k-step loop holds 24 HMMA (4 n8 tiles x 3 products, two k steps a pass);
# the second product a `switch` of straight-line cases, 48 products per
# column block (2 m16 tiles x 8 k steps x 3).
_GRAD_NAME = "_ZN10keras_ecoc4cuda6detail18CodesGradMmaKernelILi1ELi64ELi128EEEvNS1_13CodesGradArgsE"


def _grad_listing() -> str:
    body = [(0x000, "MOV R1, c[0x0][0x28]")]
    addr = 0x010
    tile_start = addr

    def put(text):
        nonlocal addr
        body.append((addr, text))
        addr += 0x10
    stage_start = addr  # u staging: 4 instructions per 16-byte copy
    for text in _staging_loop(stage_start):
        put(text)
    kstep_start = addr
    for _ in range(24):
        put("HMMA.1688.F32.TF32 R8, R12, R16, R8")
    put(f"@!P0 BRA 0x{kstep_start:x}")  # k-step loop: 25 instructions
    norms_start = addr  # the first batch tile's norms: once per block
    put("FFMA R30, R31, R31, R30")
    put("ISETP.GE.AND P2, PT, R10, 0x40, PT")
    put(f"@!P2 BRA 0x{norms_start:x}")
    put("ISETP.NE.AND P3, PT, R40, 0x4, PT")
    case1 = addr + 0x10 * (1 + 192 + 1)
    put(f"@P3 BRA 0x{case1:x}")
    for _ in range(192):  # case 4: four column blocks
        put("HMMA.1688.F32.TF32 R8, R12, R16, R8")
    join = case1 + 0x10 * 48
    put(f"BRA 0x{join:x}")
    assert addr == case1
    for _ in range(48):  # case 1: one column block
        put("HMMA.1688.F32.TF32 R8, R12, R16, R8")
    assert addr == join
    put("MUFU.EX2 R5, R6")
    put(f"@!P4 BRA 0x{tile_start:x}")
    put("EXIT")
    return _sass(_GRAD_NAME, body)


def test_sass_loop_stats_estimates_a_codes_gradient_batch_tile(tmp_path):
    """kGradMma per batch tile: the k-step loop kp / 8 / 2 times, the u tile's
    copies at the staging loop's cost, the once-per-block loop never, and of
    the second product's switch the case the warps take at this kp."""
    tool = _load_sass_tool()
    listing = tmp_path / "grad.sass"
    listing.write_text(_grad_listing())
    st = tool.collect(str(listing), "CodesGradMma", 128)["CodesGradMmaKernel<1, 64, 128>"]
    assert st.unroll == 2 and st.kstep_total == 25 and st.copy_cost == 4
    # kp = 128: every warp has four column blocks (case 4). Body: the
    # dispatch (2), case 4 and its branch (193), the join's MUFU and the
    # back branch (2); 64 x 32 copies over 128 threads at 4 each; 8 passes.
    assert st.per_tile == (2 + 193 + 2) + 16 * 4 + 8 * 25
    # kp = 32: four column blocks in all, one per warp (case 1); 2 passes,
    # 4 copies per thread.
    st = tool.collect(str(listing), "CodesGradMma", 32)["CodesGradMmaKernel<1, 64, 128>"]
    assert st.per_tile == (2 + 48 + 2) + 4 * 4 + 2 * 25
    # kp = 104 (13 blocks): warps 0-3 take 4, 3, 3 and 3 of them, so case 4
    # counts a quarter and case 1 not at all (this listing has no case 3);
    # 13 copies per thread, 6 passes (13 k steps, two a pass).
    st = tool.collect(str(listing), "CodesGradMma", 104)["CodesGradMmaKernel<1, 64, 128>"]
    assert st.per_tile == round(2 + 193 / 4 + 2 + 13 * 4 + 6 * 25)


def _nvdisasm(name: str, cuobjdump_listing: str, where, stall=None) -> str:
    """The `nvdisasm -g` form of a one-function listing: a section header, a
    source position before each instruction (where(address) -> (file, line)),
    and labels for the branch targets; with stall(text), the `-hex` form:
    each instruction's second word, carrying that stall count, on the next
    line."""
    rows = [(int(a, 16), t.strip()) for a, t in
            re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", cuobjdump_listing)]
    targets = {int(m, 16) for _, t in rows for m in re.findall(r"BRA 0x([0-9a-f]+)", t)}
    out = [f"//--------------------- .text.{name} --------------------------",
           f"\t.section\t.text.{name},\"ax\",@progbits", f".text.{name}:"]
    for address, text in rows:
        if address in targets:
            out.append(f".L_x_{address}:")
        path, line = where(address)
        out.append(f'\t//## File "/src/kernels/cuda/{path}", line {line}')
        text = re.sub(r"BRA 0x([0-9a-f]+)", lambda m: f"BRA `(.L_x_{int(m.group(1), 16)})", text)
        out.append(f"        /*{address:04x}*/                   {text} ;"
                   + ("                /* 0x000000aa6428723c */" if stall else ""))
        if stall:
            control = (_CONTROL_WORD & ~(0xF << 41)) | (stall(text) << 41)
            out.append(f"                                                     /* 0x{control:016x} */")
    return "\n".join(out) + "\n"


def test_sass_loop_stats_attributes_the_tile_estimate_to_source_lines(tmp_path, capsys):
    tool = _load_sass_tool()
    listing = _reg_listing(extra_ldg=2, staging=True)
    # HMMA lines to ecoc_ptx.cuh:52, everything else to ecoc_forward_reg.cuh:<100 + opcode kind>.
    texts = {int(a, 16): t for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", listing)}

    def where(address):
        text = texts[address]
        return ("ecoc_ptx.cuh", 52) if "HMMA" in text else ("ecoc_forward_reg.cuh",
                                                            100 + len(text.split()[0]))
    path = tmp_path / "reg.txt"
    path.write_text(_nvdisasm(_REG_NAME, listing.split("Function : _ZN10keras_ecoc4cuda6detail17")[0],
                              where))
    functions = tool.parse_nvdisasm(path.read_text())
    assert [f.name for f in functions] == [_REG_NAME]
    st = tool.loop_stats(functions[0], 128)
    # The labels became addresses: the same loops, the same estimate as cuobjdump's listing.
    assert st.per_tile == (35 - 25 - 4) + 8 * 25 + 16 * 4
    prof = tool.line_profile(functions[0], st)
    assert sum(prof.values()) == st.per_tile
    # 12 HMMA in the k-step loop (8 passes) and one in the tile body.
    assert prof["ecoc_ptx.cuh:52"] == 12 * 8 + 1
    assert tool.main([str(path), "--by-line", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "#### ForwardRegKernel<3xtf32, 16, 4>: 270 instructions (per tile)" in out
    assert "| ecoc_ptx.cuh:52 | 97 | 35.9 % | HMMA 13 |" in out
    with pytest.raises(SystemExit):
        tool.main([str(path), "--by-line", "--compare", str(path)])
    assert "--by-line takes one listing" in capsys.readouterr().err
    # A cuobjdump listing has no source lines: refused, naming the build flag.
    plain = tmp_path / "plain.sass"
    plain.write_text(listing)
    with pytest.raises(SystemExit, match="-lineinfo"):
        tool.main([str(plain), "--by-line"])


def test_sass_loop_stats_ranks_source_lines_by_stall_cycles(tmp_path, capsys):
    """nvdisasm -g -hex: each source line's stall cycles, weighted as its
    instructions, and --rank stalls orders the lines by them."""
    tool = _load_sass_tool()
    listing = _reg_listing(extra_ldg=2, staging=True)
    texts = {int(a, 16): t for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", listing)}

    def where(address):  # HMMA on one line, LDS on another, the rest on a third
        op = texts[address].split()[0]
        return ("ecoc_ptx.cuh", 52) if op.startswith("HMMA") else \
            ("ecoc_forward_reg.cuh", 200 if op == "LDS" else 300)
    path = tmp_path / "reg.txt"
    one = listing.split("Function : _ZN10keras_ecoc4cuda6detail17")[0]
    # 9 cycles after each instruction of line 300 (neither HMMA nor LDS), 1 after the others.
    path.write_text(_nvdisasm(_REG_NAME, one, where,
                              stall=lambda text: 1 if text.split()[0] in ("LDS", "HMMA.1688.F32.TF32")
                              else 9))
    f = tool.parse_nvdisasm(path.read_text())[0]
    st = tool.loop_stats(f, 128)
    # Per tile: 97 HMMA (12 per k-step pass, 8 passes, and one in the body),
    # 96 LDS, and the other 270 - 193 = 77 at 9 cycles.
    assert st.per_tile == 270 and st.cycles == 97 + 96 + 77 * 9
    assert tool.main([str(path), "--by-line", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "270 instructions, 886 stall cycles (per tile)" in out
    rows = [line for line in out.splitlines() if line.startswith("| ecoc")]
    assert rows == ["| ecoc_ptx.cuh:52 | 97 | 35.9 % | 97 | HMMA 13 |",
                    "| ecoc_forward_reg.cuh:200 | 96 | 35.6 % | 96 | LDS 12 |"]
    assert tool.main([str(path), "--by-line", "--top", "1", "--rank", "stalls"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| ecoc_forward_reg.cuh:300 | 77 | 28.5 % | 693 |")
    assert rows[2] == "| 2 other lines | 193 | 71.5 % | 193 | |"


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
@pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow",
                    reason="backend-independent; runs in the TensorFlow pass of make test")
def test_sass_loop_stats_reads_the_library_object(kernels_build):
    """The tool on the library's own object (cuobjdump -sass, every architecture):
    each register-softmax instantiation gets a per-tile estimate, each mma
    kernel a k-step loop of tensor-core products."""
    tool = _load_sass_tool()
    _cuobjdump_or_skip()
    obj = kernels_build.cuda_kernels_object()
    if obj is None:
        pytest.skip("no build left the kernels' object for these sources (kernels/build.py)")
    stats = tool.collect(obj, "Kernel", 128)
    reg = {name for name in stats if name.startswith("ForwardRegKernel<")}
    assert reg == ({f"ForwardRegKernel<{m}, {bt}, {nw}>"
                    for m in ("3xtf32", "tf32") for bt in (16, 64) for nw in (4, 8)}
                   | {f"ForwardRegKernel<{m}, {bt}, 4, fold>"
                      for m in ("3xtf32", "tf32") for bt in (16, 64)}
                   # The 4-warp kernels' instantiations for kp <= 32 (KMAX = 32).
                   | {f"ForwardRegKernel<{m}, {bt}, 4{fold}, kp ≤ 32>"
                      for m in ("3xtf32", "tf32") for bt in (16, 64)
                      for fold in ("", ", fold")}
                   # The 128-row 8-warp kernel (kRows128).
                   | {f"ForwardRegKernel<{m}, 128, 8>" for m in ("3xtf32", "tf32")}), sorted(stats)
    assert all(stats[name].per_tile > 0 for name in reg)
    for kernel in ("ForwardSplitKernel", "CodesGradSplitKernel", "CodesGradMmaKernel",
                   "CodesGradPersistentKernel"):
        assert any(name.startswith(kernel + "<") for name in stats), sorted(stats)
    assert all(st.kstep["HMMA"] > 0 and st.per_hmma > 1.0 for st in stats.values())
    # And each mma codes-gradient instantiation an estimate per batch tile.
    grad = [name for name in stats if name.startswith("CodesGradMmaKernel<")]
    assert grad and all(stats[name].per_tile > 0 for name in grad), sorted(stats)


def test_sass_loop_stats_names_each_register_softmax_instantiation():
    tool = _load_sass_tool()
    base = "_ZN10keras_ecoc4cuda6detail16ForwardRegKernelILi{}ELi{}ELi4E{}EEvNS1_16ForwardSplitArgsE"
    assert tool.short_name(base.format(1, 16, "")) == "ForwardRegKernel<3xtf32, 16, 4>"
    assert tool.short_name(base.format(1, 16, "Lb1ELi128E")) == \
        "ForwardRegKernel<3xtf32, 16, 4, fold>"
    assert tool.short_name(base.format(2, 64, "Lb0ELi32E")) == \
        "ForwardRegKernel<tf32, 64, 4, kp ≤ 32>"
    assert tool.short_name(base.format(1, 16, "Lb1ELi32E")) == \
        "ForwardRegKernel<3xtf32, 16, 4, fold, kp ≤ 32>"
    wg = "_ZN10keras_ecoc4cuda6detail16ForwardRegKernelILi1ELi128ELi8ELb0ELi128ELb1EEEvNS1_16ForwardSplitArgsE"
    assert tool.short_name(wg) == "ForwardRegKernel<3xtf32, 128, 8, wgmma>"
    assert tool.short_name(wg.replace("ELb1EEEv", "ELb0EEEv")) == "ForwardRegKernel<3xtf32, 128, 8>"


def test_sass_loop_stats_compares_two_listings_and_refuses_a_bad_kp(tmp_path, capsys):
    tool = _load_sass_tool()
    old, new = tmp_path / "old.sass", tmp_path / "new.sass"
    old.write_text(_reg_listing(extra_ldg=4))
    new.write_text(_reg_listing(extra_ldg=0))
    assert tool.main([str(new), "--compare", str(old)]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if "ForwardRegKernel" in line]
    assert row == ["| ForwardRegKernel<3xtf32, 16, 4> | 33 → 29 (-12 %) | 25 → 25 (×2) | 2.1 → 2.1 | "
                   "208 → 204 (-2 %) | 208 → 204 (-2 %) | 13 → 13 | 3 → 3 | 4 → 0 (-100 %) |"]
    with pytest.raises(SystemExit):
        tool.main([str(new), "--kp", "100"])
    assert "--kp must be a multiple of 8 in [8, 128]. Received: --kp=100" in capsys.readouterr().err
    assert tool.main([str(new), "--kernel", "NoSuchKernel"]) == 1


_SPLIT_NAME = "_ZN10keras_ecoc4cuda6detail20CodesGradSplitKernelILi0ELi64EEEvNS1_13CodesGradArgsE"


def _fma_chain_listing(ahead: bool) -> str:
    """An outer loop around an fma chain over 8 shared loads: each load used
    at once through one register (ahead=False), or all 8 issued first into
    8 registers (ahead=True); then a 64-bit load used through its second
    register, and a load whose register is overwritten before any use."""
    body, addr = [(0x000, "MOV R1, c[0x0][0x28]")], 0x010
    outer = addr
    body.append((addr, "IADD3 R2, R2, 0x1, RZ"))
    addr += 0x10
    inner = addr

    def put(text):
        nonlocal addr
        body.append((addr, text))
        addr += 0x10

    if ahead:
        for i in range(8):
            put(f"LDS R{50 + i}, [R3+0x{0x90 * i:x}]")
        for i in range(8):
            put(f"FFMA R40, R{50 + i}, R43, R40")
    else:
        for i in range(8):
            put(f"LDS R41, [R3+0x{0x90 * i:x}]")
            put("FFMA R40, R41, R43, R40")
    put("LDS.64 R60, [R3+0x800]")
    put("FADD R44, R61, R44")
    put("LDS R70, [R3+0x900]")
    put("MOV R70, R1")
    put("FADD R45, R70, R45")
    put(f"@!P0 BRA 0x{inner:x}")
    put(f"@!P1 BRA 0x{outer:x}")
    put("EXIT")
    return _sass(_SPLIT_NAME, body)


def test_sass_loop_stats_counts_shared_loads_in_flight_at_each_use(tmp_path, capsys):
    """--loads-ahead: per innermost loop with 8 or more LDS, the loads issued
    and not yet used at each use of a loaded register (the regressed 64-row
    split codes gradient of 2026-11-28 kept 2 on average where it had 6)."""
    tool = _load_sass_tool()
    serial, ahead = tmp_path / "serial.sass", tmp_path / "ahead.sass"
    serial.write_text(_fma_chain_listing(ahead=False))
    ahead.write_text(_fma_chain_listing(ahead=True))
    name = "CodesGradSplitKernel<0, 64>"
    (s,) = tool.collect_loads_ahead(str(serial), "CodesGradSplitKernel")[name]
    # 10 LDS; 9 uses (the overwritten load has none), each load used at once.
    assert (s.loads, s.uses) == (10, [1] * 9)
    (a,) = tool.collect_loads_ahead(str(ahead), "CodesGradSplitKernel")[name]
    assert a.uses == [8, 7, 6, 5, 4, 3, 2, 1, 1] and a.mean == pytest.approx(37 / 9)
    assert a.instructions == 22  # the inner loop only: the outer one is not innermost
    assert tool.main([str(ahead), "--loads-ahead", "--compare", str(serial),
                      "--kernel", "CodesGradSplit"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if "CodesGradSplitKernel" in line]
    assert len(row) == 1 and row[0].endswith("| 22 | 10 | 9 | 1 / 1.0 → 1 / 4.1 |")
    with pytest.raises(SystemExit):
        tool.main([str(ahead), "--loads-ahead", "--by-line"])
    assert "ask for one" in capsys.readouterr().err
    assert tool.main([str(ahead), "--loads-ahead", "--kernel", "NoSuchKernel"]) == 1
