#!/usr/bin/env bash
# Installs what building and testing fmha needs, skipping whatever is already there (so it also works
# offline on a machine that has everything, such as the GPU machines).
set -euo pipefail

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

PYTHON=${PYTHON:-python3}
need_pip=()
for spec in torch:torch numpy:numpy pytest:pytest nanobind:nanobind scikit_build_core:scikit-build-core \
            matplotlib:matplotlib tqdm:tqdm; do
  module=${spec%%:*} package=${spec#*:}
  "$PYTHON" -c "import $module" 2>/dev/null || need_pip+=("$package")
done
if [ ${#need_pip[@]} -gt 0 ]; then
  echo "setup: pip install ${need_pip[*]}"
  "$PYTHON" -m pip install -q "${need_pip[@]}"
fi

# JAX (CPU wheels): the JAX front end (fmha.jax) builds when the Python that builds the package
# imports jax, and its tests skip without it; so a machine where jax does not install still
# builds and tests everything else.
if ! "$PYTHON" -c "import jax" 2>/dev/null; then
  echo "setup: pip install jax"
  "$PYTHON" -m pip install -q jax || echo "setup: jax did not install; fmha.jax is not built and its tests skip"
fi
