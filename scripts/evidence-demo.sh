#!/usr/bin/env bash
# The demonstration evidence bundle (evidence/tutorial-sim/, docs/evidence.md): the tutorial's
# registered test carried through the whole journey on the local SLURM cluster with accounting,
# then packed. Run as root (the cluster), from a checkout whose .venv is installed:
#
#     scripts/evidence-demo.sh WORKDIR [BUNDLE]      # BUNDLE defaults to evidence/tutorial-sim
#
# What is real: git (a clone of this checkout, a bare remote standing in for the team's, commits,
# pushes, the freeze tag), the SLURM jobs and their accounting. What is not: the engine. Each job
# drives the HTTP emulator of the engine model (docs/tutorial.md step 5), and the prediction frozen
# is the simulator's. The bundle demonstrates the mechanism; it is not real-engine evidence.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:?usage: scripts/evidence-demo.sh WORKDIR [BUNDLE]}
BUNDLE=${2:-$ROOT/evidence/tutorial-sim}
PY="$ROOT/.venv/bin/python"
mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd) && cd "$WORK"

# a bare remote holding this checkout's HEAD as its main branch, and a clone of it (the tutorial's
# step 0)
git init -q --bare -b main team-remote.git
git -C "$ROOT" push -q "$WORK/team-remote.git" HEAD:refs/heads/main
git clone -q team-remote.git agentload && cd agentload
git config user.name "A Newcomer" && git config user.email newcomer@example.org
# the clone's code on this checkout's installed dependencies (tests/integration/test_tutorial.py's
# fast install: the clone's own code is what runs, in the jobs too)
"$PY" -m venv --without-pip .venv
SP=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD" > "$SP/00-agentload-editable.pth"
# (through a link in WORK, so the records name no path of this checkout)
ln -s "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" "$WORK/dependencies"
echo "$WORK/dependencies" > "$SP/zz-test-dependencies.pth"
printf '#!%s\nimport sys\nfrom cli.main import main\nsys.exit(main())\n' "$PWD/.venv/bin/python" > .venv/bin/agentload
chmod +x .venv/bin/agentload
. .venv/bin/activate
"$ROOT/slurm/local/cluster.sh" up

# calibrate, fill, register (commit + push), as docs/tutorial.md steps 1-3
agentload calibrate all --cell tutorial-sim --workload tutorial --engine sim \
    --n 12,20,28,48 --e0a-n 32 --e0a-seeds 0,1 --check-n 0 --warmup 300 --window 600 \
    --grid 1.25,1.5,1.75,2.0,2.5 --duration 1500 --rise-span 750 \
    --out prereg/inputs/tutorial-sim
agentload prereg fill --inputs prereg/inputs/tutorial-sim --test prereg/templates/tutorial.yaml \
    --out prereg/registrations/tutorial.yaml
git add prereg/inputs/tutorial-sim prereg/registrations/tutorial.yaml
git commit -q -m "registration tutorial"
git push -q
agentload prereg check prereg/registrations/tutorial.yaml

# the simulator's prediction over three fresh seeds, frozen (commit, tag, push, read back)
agentload predict make sim prereg/registrations/tutorial.yaml --seeds 3 --out predictions/tutorial-sim.yaml
agentload predict freeze predictions/tutorial-sim.yaml --tag pred-tutorial-sim --testdir results/tutorial

# submit, collect with the accounting export and the registered verdict, score, verify
agentload submit prereg/registrations/tutorial.yaml --engine emulator --time-scale 60 --parallel 2 \
    --out results/tutorial
agentload jobs collect results/tutorial/submission.json --wait 900
agentload predict score pred-tutorial-sim results/tutorial
agentload provenance verify results/tutorial

# pack it with this checkout's code, and check the bundle
rm -rf "$BUNDLE"
"$ROOT/.venv/bin/agentload" evidence pack results/tutorial --out "$BUNDLE" --note "$ROOT/evidence/demo-note.md"
"$ROOT/.venv/bin/agentload" evidence check "$BUNDLE"
