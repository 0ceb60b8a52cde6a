#!/usr/bin/env bash
# Installs every system package cpkit builds or tests with. Idempotent: packages already
# present are skipped, so a second run only asks dpkg and returns in well under a second.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config clang-format
  libeigen3-dev       # reference/: the Eigen oracle
  librapidcheck-dev   # harness/: property tests
  libgtest-dev        # tests/ and harness/
  libbenchmark-dev    # bench/
  nlohmann-json3-dev  # golden/ case files
  clang libclang-rt-14-dev  # libFuzzer target (scripts/fuzz.sh)
  python3-matplotlib  # bench/plot
  libgloo-dev         # headers that c10d's ProcessGroupGloo.hpp includes (optimized/)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: need root for apt-get install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: system packages present"

# LibTorch for optimized/: the PyPI torch wheel, pinned, in a virtual environment outside the
# repository so every clone on this machine reuses it. CMake finds it through
# torch.utils.cmake_prefix_path (see CPKIT_TORCH_PYTHON in CMakeLists.txt).
torch_version=2.11.0
venv=${CPKIT_TORCH_VENV:-$HOME/.cache/cpkit/torch-$torch_version}
if ! compgen -G "$venv/lib/python3*/site-packages/torch-$torch_version.dist-info" >/dev/null; then
  echo "setup: installing torch==$torch_version into $venv (first time only, ~5 GB)"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$torch_version" numpy
fi
echo "setup: torch $torch_version present in $venv"
# The Python package's build backend and test runner, and transformers for the optional
# Hugging Face integration's tests and example (cpkit[transformers]), and cut-cross-entropy
# (a contender in bench/head_bench.py), pinned, into the same venv.
python_tools=(scikit-build-core==1.1.2 pytest==9.2.0 transformers==5.25.0 cut-cross-entropy==25.1.1)
for tool in "${python_tools[@]}"; do
  name=${tool%%==*}
  if ! compgen -G "$venv/lib/python3*/site-packages/${name//-/_}-${tool##*==}.dist-info" >/dev/null; then
    echo "setup: installing ${python_tools[*]} into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${python_tools[@]}"
    break
  fi
done
echo "setup: ${python_tools[*]} present in $venv"
