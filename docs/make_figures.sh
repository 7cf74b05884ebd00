#!/bin/sh
# Regenerate the README figures from the worked example (needs the plot extra:
# pip install -e '.[plot]'). TANGRAM may name the command, e.g. TANGRAM=/work/venv/bin/tangram.
set -e
cd "$(dirname "$0")/.."
TANGRAM="${TANGRAM:-tangram}"
# The simulated 1F1B schedule of the seed plan (n_micro 32) with the layer split per island.
"$TANGRAM" plan instances/jobs/seed-llama3-70b.toml --simulate --plot docs/gantt-seed.png
# Throughput and bubble ratio of the exact plan at every n_micro dividing the batch (1..128).
"$TANGRAM" sweep instances/jobs/seed-llama3-70b.toml --plot docs/sweep-seed.png
# The overlap demo: eq. 9's plan on a slow link; the A10 stage stalls on gradient round trips.
"$TANGRAM" plan instances/jobs/overlap-demo.toml --simulate --plot docs/gantt-overlap-demo.png
