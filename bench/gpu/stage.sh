#!/bin/bash
# Stage the GPU check for the device: render every GPU profile (bench/gpu/render.py, both weight modes), copy the code
# the device runs, and the wheel chunks built by bench/gpu/build-carry.sh, into DEST (inside the checkout the device
# tool sends, ignored by git), laid out as bench/gpu/go.sh reads it:
#   DEST/p1/site.part00                    call 1 carries DEST/p1 and DEST/repo
#   DEST/p2/{site.part01,lm.tar.xz,sha256,stacks-real.json,stacks-dummy.json,stacks-pays.json}   call 2 (and
#                                          go.sh pays) carries DEST/p2 and DEST/repo
#   DEST/repo/{rigkit,bench/gpu,profiles.yaml,pyproject.toml}
# usage: bench/gpu/stage.sh WHEELS_DIR DEST        (WHEELS_DIR: build-carry.sh's OUTDIR)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd); WHL=$(cd "${1:?WHEELS_DIR}" && pwd); DEST=${2:?DEST}
mkdir -p "$DEST/p1" "$DEST/p2"; rm -rf "$DEST/repo"; mkdir -p "$DEST/repo"
cp "$WHL/p1/site.part00" "$DEST/p1/"; cp "$WHL/p2/site.part01" "$WHL/p2/lm.tar.xz" "$WHL/sha256" "$DEST/p2/"
(cd "$ROOT" && git ls-files -co --exclude-standard rigkit bench/gpu profiles.yaml pyproject.toml templates \
   | grep -v '/dryrun/' | tar -c -T - | tar -x -C "$DEST/repo")
PY=${PYTHON:-$ROOT/.venv/bin/python}
"$PY" "$ROOT/bench/gpu/render.py" "$DEST/p2/stacks-real.json" --weights real
"$PY" "$ROOT/bench/gpu/render.py" "$DEST/p2/stacks-dummy.json" --weights dummy
"$PY" "$ROOT/bench/gpu/pays.py" render "$DEST/p2/stacks-pays.json"   # go.sh pays (issue 42)
du -sh "$DEST"/p1 "$DEST"/p2 "$DEST"/repo
