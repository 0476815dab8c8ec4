#!/bin/bash
# Build the wheels a GPU machine with torch 2.11 (CUDA 13) needs to run vLLM 0.26.0 and LMCache 0.5.3, in two parts
# that each fit one call's 64 MiB (call 1 carries p1, call 2 carries p2 and the rest).
# usage: build-carry.sh OUTDIR      (OUTDIR inside the checkout and ignored by git, e.g. .whl)
# Output: OUTDIR/p1/site.part00 (50,000,000 bytes), OUTDIR/p2/{site.part01,lm.tar.xz}, OUTDIR/sha256.
# On the GPU machine: cat site.part00 site.part01 | xz -d | tar -x -C /tmp   -> /tmp/site (vllm and its wheels)
#                     xz -d < lm.tar.xz | tar -x -C /tmp                     -> /tmp/site-lm (lmcache and its wheels)
#                     PYTHONPATH=/tmp/site-lm:/tmp/site (the machine's own torch stays in use)
set -euo pipefail
OUT=$(mkdir -p "${1:?OUTDIR}" && cd "$1" && pwd); B=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp)
for n in 1 5 17 24 26 27 28 31 34 35; do PLAT+=(--platform "manylinux_2_${n}_x86_64"); done
PLAT+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
mkdir -p "$W/wh" "$W/site" "$W/lmw" "$W/site-lm"
pip download -q --no-deps "${PLAT[@]}" -d "$W/wh" vllm==0.26.0
while read -r whl; do n=${whl%%-[0-9]*}; v=$(echo "$whl" | sed -E "s/^${n}-([^-]+)-.*/\1/")
  pip download -q --no-deps "${PLAT[@]}" -d "$W/wh" "${n//_/-}==$v"; done < "$B/carry-wheels.txt"
for w in "$W"/wh/*.whl; do (cd "$W/site" && python3 -m zipfile -e "$w" .); done
# not needed for FA3 on Hopper with a dense model: FA2 kernels (305 MB), MoE kernels, vllm-rs, FA4 cute, deep_gemm, fmha_sm100
(cd "$W/site/vllm" && rm -rf _moe_C_stable_libtorch.abi3.so vllm-rs third_party/deep_gemm third_party/fmha_sm100 \
  vllm_flash_attn/cute fmha_sm100 2>/dev/null || true)
find "$W/site/vllm" -name '_vllm_fa2_C*' -delete
pip download -q --no-deps "${PLAT[@]}" -d "$W/lmw" $(cat "$B/carry-lmcache.txt")
for w in "$W"/lmw/*.whl; do (cd "$W/site-lm" && python3 -m zipfile -e "$w" .); done
(cd "$W" && tar -c site | xz -T2 -6 > site.tar.xz && tar -c site-lm | xz -T2 -6 > lm.tar.xz)
rm -rf "$OUT/p1" "$OUT/p2"; mkdir -p "$OUT/p1" "$OUT/p2"
split -b 50000000 -d -a 2 "$W/site.tar.xz" "$W/site.part"
mv "$W/site.part00" "$OUT/p1/"; cat "$W"/site.part0[1-9] > "$OUT/p2/site.part01"; mv "$W/lm.tar.xz" "$OUT/p2/"
(cd "$OUT" && sha256sum p1/site.part00 p2/site.part01 p2/lm.tar.xz | sed 's#p[12]/##') > "$OUT/sha256"
du -sh "$OUT"/p1 "$OUT"/p2
