#!/usr/bin/env bash
# `hbpe train` (Composer, streaming, FSDP) on a GPU machine whose image has its own torch but no Composer, no streaming
# and no network: one command there, over the wheels infra/gpu/wheelhouse.py downloaded here (docs/gpu.md).
#
#   infra/gpu/train_on_image.sh WHEELS TRAIN_SHARDS [KEY=VALUE ...]
#   infra/gpu/train_on_image.sh runs/gpu/wheels runs/gpu/shards/train data.eval=runs/gpu/shards/eval compile=true
#
# 1. a venv over the image's Python that sees the image's packages (torch, torchvision, triton, CUDA's libraries),
#    with the wheels installed into it (--no-index --no-deps: they were pinned here, nothing is resolved there);
# 2. `import torch, composer, streaming, hbpe`: versions and where each comes from -> $OUT/versions.json;
# 3. `hbpe train $CONFIG data.train=TRAIN_SHARDS data.eval=null max_duration=300ba optim.warmup=0.1dur KEY=VALUE...`
#    (later keys win) -> $OUT/result.json (hbpe's --json), $OUT/metrics.jsonl, $OUT/train.log.
#
# Environment: PYTHON, the image's Python with torch (python3); CONFIG (small); VENV (${TMPDIR:-/tmp}/hbpe-image-venv,
# reused while the wheels and PYTHON are the same); OUT (the device tool sets it; else runs/gpu/train-out).
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }

[ $# -ge 2 ] || die "usage: $0 WHEELS TRAIN_SHARDS [KEY=VALUE ...] (see the comment at the top of $0)"
WHEELS=$1 SHARDS=$2
shift 2
PYTHON=${PYTHON:-python3}
CONFIG=${CONFIG:-small}
VENV=${VENV:-${TMPDIR:-/tmp}/hbpe-image-venv}
OUT=${OUT:-runs/gpu/train-out}
LIST=$WHEELS/requirements.txt

[ -f "$LIST" ] || die "$LIST not found: WHEELS must be a folder from infra/gpu/wheelhouse.py (carried with the tree)"
[ -d "$SHARDS" ] || [[ $SHARDS == *://* ]] || die "$SHARDS is not a folder: pass the training shards from hbpe convert"
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON cannot import torch: set PYTHON to the image's Python"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# Same wheels, same Python: the venv from an earlier call is reused (a second run on a warm machine starts at once)
stamp=$( (cat "$LIST"; stat -c '%s %n' "$WHEELS"/*.whl; command -v "$PYTHON") | cksum)
if [ "$(cat "$VENV/.hbpe-wheels" 2>/dev/null)" != "$stamp" ]; then
  [ ! -e "$VENV" ] || [ -f "$VENV/pyvenv.cfg" ] || die "$VENV exists and is not a venv: set VENV to a new folder"
  rm -rf "$VENV"
  "$PYTHON" -m venv --system-site-packages --without-pip "$VENV"
  # --system-site-packages reaches the base interpreter's site-packages only; where the image's python3 is itself a
  # venv (/opt/torch/.venv on the lent machines), torch is in that venv's: add its folders after the new venv's own,
  # as site does (their .pth files too), so a carried wheel wins over the image's copy of the same package
  site_pth=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_hbpe_image_site.pth
  "$PYTHON" -c 'import site; [print(f"import site; site.addsitedir({d!r})") for d in site.getsitepackages()]' \
    >"$site_pth"
  # the image's pip, seen through those folders, installs into the venv (--without-pip: no ensurepip needed there)
  "$VENV/bin/python" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip to install the wheels with"
  # --ignore-installed: the image's own copy of a listed package (numpy, tqdm, ...) must not stand in for the pinned one
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --ignore-installed \
    --no-compile --find-links "$WHEELS" -r "$LIST"
  echo "$stamp" >"$VENV/.hbpe-wheels"
fi

# torch must be the image's (a CUDA build matched to its driver), each carried package the venv's copy of it
"$VENV/bin/python" -P - "$OUT/versions.json" "$LIST" <<'EOF'  # -P: not the tree's hbpe/ in the working folder
import importlib, json, re, sys
from importlib.metadata import version

modules = {"torch": "torch", "mosaicml": "composer", "mosaicml-streaming": "streaming", "hbpe": "hbpe"}
try:
    dists = {name: importlib.import_module(module) for name, module in modules.items()}
except ImportError as e:
    sys.exit(f"error: {e} in {sys.prefix}: a wheel missing from {sys.argv[2]} (rerun infra/gpu/wheelhouse.py), "
             "or PYTHON is not the image's Python with torch")
torch = dists["torch"]
found = {name: {"version": version(name), "path": module.__path__[0]} for name, module in dists.items()}
found["cuda"] = torch.version.cuda
found["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
json.dump(found, open(sys.argv[1], "w"), indent=1)
print(", ".join(f"{n} {found[n]['version']}" for n in dists) + f"; CUDA {found['cuda']}, device {found['device']}")
carried = {re.split(r"[=<>~ ]", line.strip())[0].lower().replace("_", "-") for line in open(sys.argv[2]) if line.strip()}
misplaced = [n for n in dists if found[n]["path"].startswith(sys.prefix + "/") != (n in carried)]
if misplaced:
    sys.exit(f"error: {', '.join(misplaced)} not from where expected (torch from the image, each package of "
             f"{sys.argv[2]} from {sys.prefix}): {json.dumps(found)}")
EOF

RUN=$(mktemp -d "${TMPDIR:-/tmp}/hbpe-train-XXXXXX")
echo "training: $CONFIG on $SHARDS, save folder $RUN/save, results in $OUT" >&2
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1  # no network there: nothing may try a hub
status=0
# stdout (hbpe's JSON result) to result.json, stderr (progress, errors) to the terminal and train.log
{ "$VENV/bin/hbpe" train "$CONFIG" "data.train=$SHARDS" data.eval=null max_duration=300ba optim.warmup=0.1dur \
  "save_folder=$RUN/save" "$@" --json 2>&1 1>&3 | tee "$OUT/train.log" >&2; } 3>"$OUT/result.json" || status=$?
[ ! -f "$RUN/save/metrics.jsonl" ] || cp "$RUN/save/metrics.jsonl" "$OUT/metrics.jsonl"
if [ "$status" -ne 0 ]; then
  echo "error: hbpe train failed (exit $status): $OUT/train.log has its output" >&2
  exit "$status"
fi
"$VENV/bin/python" -P - "$OUT" <<'EOF'
import json, sys

r = json.load(open(f"{sys.argv[1]}/result.json"))
kbs = r["throughput"]["bytes_per_sec"] / 1e3
print(f"trained {r['batches']} batches in {r['wall_s']:.1f} s on {r['device']} ({r['precision']}): {kbs:.1f} KB/s;")
print(f"result.json, metrics.jsonl, train.log and versions.json in {sys.argv[1]}")
EOF
