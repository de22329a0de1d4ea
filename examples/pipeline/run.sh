#!/usr/bin/env bash
# One command: a long manual made, the simulator started, the manual evaluated in
# stages (split, map, reduce, chain) with workers here: its plan first, then status
# and results printed.
#   examples/pipeline/run.sh            (PORT=17601 by default; needs `herd` installed)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
port="${PORT:-17601}"
python "$here/make_manual.py" "$work/docs" >/dev/null
python -m herd.testing.simulator --port "$port" >"$work/sim.log" 2>&1 &
sim=$!
trap 'kill "$sim" 2>/dev/null || true' EXIT
export HERD_HOME="$work/home" OPENAI_BASE_URL="http://127.0.0.1:$port/v1" OPENAI_API_KEY=sk-sim
for _ in $(seq 100); do
  python -c "import httpx,sys; httpx.get('http://127.0.0.1:$port/_sim/stats')" 2>/dev/null && break
  sleep 0.1
done
herd eval submit "$work/docs" --pipeline "$here/pipeline.toml" --plan   # nothing paid
herd eval submit "$work/docs" --pipeline "$here/pipeline.toml" --batch manual --wait
# To a file, then its first lines: `| head` closes the pipe early, and under pipefail
# the writer's exit on a closed pipe (1, as click has it) would end this script.
herd eval results manual --stage registers -o "$work/registers.jsonl"
head -3 "$work/registers.jsonl"
herd eval results manual
