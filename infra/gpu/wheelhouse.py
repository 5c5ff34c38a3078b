"""The wheels `hbpe train` needs on a GPU image that has its own torch but no Composer, streaming or network.

Downloads, here, the distributions a training run imports (TRAINING below), at the versions constraints/current.txt
pins, for the image's Python and platform (cp312, manylinux x86_64), builds hbpe's own wheel from this tree with a
Python of that version (it has C extensions), and writes `requirements.txt` beside them: the folder travels with the
repository tree to the GPU machine, where infra/gpu/train_on_image.sh installs it with
`pip install --no-index --no-deps --find-links WHEELS -r WHEELS/requirements.txt` over the image's torch.

    python infra/gpu/wheelhouse.py                      # runs/gpu/wheels, cp312, manylinux x86_64
    python infra/gpu/wheelhouse.py --out DIR --python /path/to/python3.12

Never carried: torch, torchvision (built against one torch), triton, nvidia-* and cuda-* (its CUDA libraries), and
torch's own pure-Python requirements (sympy, mpmath, networkx, jinja2, markupsafe, filelock, fsspec, setuptools):
the image's torch comes with all of them, at the versions it was built and tested with.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CARRY_LIMIT = 64 * 2**20  # what one call of the device tool carries: the whole tree, these wheels and the shards

# What `hbpe train` imports, less the image's torch family, found in a venv over a bare torch 2.11 (docs/gpu.md):
# start from every distribution whose modules were in sys.modules after `hbpe train tiny` in the current stack, drop
# the large ones imported only if present (scipy, matplotlib and its font and layout libraries through torchmetrics;
# paramiko and cryptography through Composer's SFTP store; pillow through torchvision, which brings its own), add back
# what a run then failed to import, until it trains; each one left is imported by that run. Conversion's packages
# (apache-beam, pyarrow, dask) are not here, nor anything only `hbpe eval`, `export` or `generate` needs.
TRAINING = (
    # hbpe's own requirements that training imports
    "click",
    "numpy",  # hbpe needs <2.5; the image has 2.5
    "omegaconf",
    "antlr4-python3-runtime",  # omegaconf's grammar
    "pyyaml",
    "regex",
    "tiktoken",
    "tqdm",
    # Composer (mosaicml) and what it imports
    "mosaicml",
    "torchmetrics",
    "lightning-utilities",
    "coolname",
    "tabulate",
    "py-cpuinfo",
    "psutil",
    "packaging",
    "importlib-metadata",
    "zipp",
    "requests",
    "urllib3",
    "idna",
    "certifi",
    "charset-normalizer",
    "typing-extensions",
    # mosaicml-cli (Composer's MosaicML logger imports it at module level) and its own
    "mosaicml-cli",
    "backoff",
    "gql",
    "graphql-core",
    "websockets",
    "ruamel-yaml",
    "rich",
    "pygments",
    "questionary",
    "prompt-toolkit",
    "wcwidth",
    "validators",
    "python-dateutil",
    "six",
    # mosaicml-streaming and its compression codecs (streaming/base/compression.py imports all of them)
    "mosaicml-streaming",
    "xxhash",
    "zstd",
    "brotli",
    "python-snappy",
    "cramjam",
    "catalogue",
    # transformers: streaming's dataloader imports its BatchEncoding at module level
    "transformers",
    "huggingface-hub",
    "tokenizers",
    "safetensors",
    "httpx2",
    "httpcore2",
    "anyio",
    "h11",
    "truststore",
    # small ones the run imports where present (same code paths as the current stack)
    "dill",
    "defusedxml",
    "colorama",
    "attrs",
)
SOURCE_ONLY = ("antlr4-python3-runtime",)  # no wheel on the registry: built here, pure Python (py3-none-any)
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in range(5, 29)
]  # pip matches tags exactly: every glibc up to the 2.28 that constraints/current.txt was locked for


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a pip requirements file (comments and options skipped) -> {canonical name: version}."""
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)", line)
        if m:
            pins[canonical(m[1])] = m[2]
    return pins


def pinned(names: tuple[str, ...], pins: dict[str, str], source: Path) -> list[str]:
    """`name==version` of each name, or a SystemExit naming those the constraints file does not pin."""
    missing = [n for n in names if canonical(n) not in pins]
    if missing:
        sys.exit(f"error: {source} pins no version of {', '.join(missing)}: regenerate it, or drop them from TRAINING")
    return [f"{n}=={pins[canonical(n)]}" for n in names]


def runs_as(python: str, version: str) -> bool:
    """Whether `python` runs and is CPython `version` (X.Y)."""
    check = f"import sys; assert sys.version_info[:2] == {tuple(map(int, version.split('.')))}"
    try:
        return subprocess.run([python, "-c", check], capture_output=True).returncode == 0
    except OSError:  # not there
        return False


def find_python(version: str) -> str | None:
    """A Python of `version` (3.12): pythonX.Y if it runs, else pyenv's (as the Makefile's PYTHON_CURRENT)."""
    root = Path.home() / ".pyenv" / "versions"
    candidates = [f"python{version}", *sorted(str(p / "bin" / f"python{version}") for p in root.glob(f"{version}.*"))]
    return next((python for python in candidates if runs_as(python, version)), None)


def pip(*args: str, python: str = sys.executable) -> None:
    """pip, quiet; its own message and a SystemExit when it fails."""
    r = subprocess.run(
        [python, "-m", "pip", "-q", "--disable-pip-version-check", *args], capture_output=True, text=True
    )
    if r.returncode:
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "is ignored: it is neither" not in ln]
        sys.exit(f"error: pip {args[0]} failed:\n" + "\n".join(lines[-20:]))


def download(requirements: list[str], out: Path, version: str) -> None:
    """The binary wheels of `requirements` for CPython `version` on manylinux x86_64, without their dependencies."""
    target = ["--python-version", version, "--implementation", "cp", "--only-binary=:all:"]
    abis = [arg for abi in (f"cp{version.replace('.', '')}", "abi3", "none") for arg in ("--abi", abi)]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pip("download", "--no-deps", *target, *abis, *platforms, "-d", str(out), *requirements)


def build(requirements: list[str], out: Path, python: str, *, isolated: bool = True) -> None:
    """Wheels built here with `python` (SOURCE_ONLY's, or a source folder's); isolated=False builds with `python`'s
    own setuptools (>= 77, as `make install` sets up) instead of a fresh one from the registry."""
    isolation = [] if isolated else ["--no-build-isolation"]
    pip("wheel", "--no-deps", *isolation, "-w", str(out), *requirements, python=python)


def build_hbpe(out: Path, python: str, *, isolated: bool = True) -> None:
    """hbpe's wheel, its C extensions built for `python`, from a copy of the tree's files: a build in the checkout
    writes its build/ folder there, where another build (a test, make install) may be running."""
    with tempfile.TemporaryDirectory(prefix="hbpe-wheel-") as tmp:
        build([str(tree_copy(Path(tmp) / "hbpe"))], out, python, isolated=isolated)


def wheel_name(path: Path) -> str:
    return canonical(path.name.split("-")[0])


def prune(out: Path, keep: set[str]) -> None:
    """Remove wheels of distributions no longer listed: pip refuses two versions of one, and they cost carry space."""
    for whl in out.glob("*.whl"):
        if wheel_name(whl) not in keep:
            whl.unlink()


def tree_files(root: Path = ROOT) -> list[str] | None:
    """The files the device tool sends besides what a call carries: tracked and untracked-not-ignored (None: no git)."""
    r = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True
    )
    return None if r.returncode else sorted({name for name in r.stdout.decode().split("\0") if name})


def tree_bytes(root: Path = ROOT) -> int | None:
    names = tree_files(root)
    if names is None:
        return None
    return sum(f.stat().st_size for f in (root / n for n in names) if f.is_file() and not f.is_symlink())


def tree_copy(dest: Path, root: Path = ROOT) -> Path:
    """The tree's files (tree_files), links kept as links, copied into `dest`."""
    names = tree_files(root)
    if names is None:
        sys.exit(f"error: {root} is not a git checkout: hbpe's wheel is built from the files git lists")
    for name in names:
        src, dst = root / name, dest / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_file():  # a tracked file deleted in the checkout is left out, as the checkout has it
            shutil.copy2(src, dst)
    return dest


def report(out: Path) -> None:
    """Each wheel's size, largest first; the total; and what is left of one call's carry for the shards."""
    wheels = sorted(out.glob("*.whl"), key=lambda p: -p.stat().st_size)
    for whl in wheels:
        print(f"{whl.stat().st_size / 2**20:8.2f} MiB  {whl.name}")
    total = sum(p.stat().st_size for p in wheels)
    print(f"{total / 2**20:8.2f} MiB  {len(wheels)} wheels in {out}")
    tree = tree_bytes()
    if tree is not None:
        left = CARRY_LIMIT - tree - total
        print(
            f"{tree / 2**20:8.2f} MiB  the repository tree; {left / 2**20:.2f} MiB of the device tool's "
            f"{CARRY_LIMIT >> 20} MiB per call left for the shards"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu" / "wheels")
    ap.add_argument("--constraints", type=Path, default=ROOT / "constraints" / "current.txt")
    ap.add_argument("--python-version", default="3.12", help="the image's Python, X.Y (default 3.12)")
    ap.add_argument("--python", help="a Python of --python-version to build hbpe's wheel (default: found as make does)")
    args = ap.parse_args(argv)
    python = args.python or find_python(args.python_version)
    if python is None or not runs_as(python, args.python_version):
        sys.exit(
            f"error: no Python {args.python_version} to build hbpe's wheel for the image with "
            f"({python or 'none found'}): pass --python PATH of a Python {args.python_version}"
        )
    requirements = pinned(TRAINING, read_pins(args.constraints), args.constraints)
    args.out.mkdir(parents=True, exist_ok=True)
    binary = [r for r in requirements if canonical(r.split("==")[0]) not in SOURCE_ONLY]
    download(binary, args.out, args.python_version)
    if source_only := [r for r in requirements if r not in binary]:
        build(source_only, args.out, python)
    build_hbpe(args.out, python)
    prune(args.out, {canonical(n) for n in TRAINING} | {"hbpe"})
    (args.out / "requirements.txt").write_text("\n".join([*requirements, "hbpe"]) + "\n")
    report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
