#!/bin/sh
# Create benchmarks/.env with littleghost (editable) and the peers the benchmark compares.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python3 -m venv "$here/.env"
"$here/.env/bin/pip" install --quiet --upgrade pip
"$here/.env/bin/pip" install --quiet -e "$here/..[local]" agent-framework-core langchain-core \
    langchain langchain-openai
