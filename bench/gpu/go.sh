#!/bin/bash
# The GPU check on the device (bench/gpu/README.md), in two calls within the machine's warm window:
#   go.sh prepare CARRY   call 1: keep the first wheel chunk (CARRY/p1) in /tmp/chunks, capture nvidia-smi for
#                         issue 27, train the test model (bench/gpu/train_model.py) into /tmp/gpu-check-model
#                         (TRAIN_KINDS, TRAIN_CORPUS, TRAIN_SHAPE, TRAIN_S) and, with SECOND_SHAPE (JSON), a second
#                         one of that shape on SECOND_CORPUS (default stdlib) into /tmp/gpu-check-model-2
#   go.sh health .     the GPU health captures alone, as gpu-health.tar.gz under $OUT
#   go.sh run CARRY       call 2: the rest of the wheels (CARRY/p2), check, unpack, run bench/gpu/run.py on every
#                         rendered stack (CARRY/p2/stacks-*.json), pack everything under $OUT as tar.gz; MODEL picks
#                         the model directory, CASES the stacks, GPU_CHECK_LENGTHS the session sizes
#   go.sh url CARRY       issue 41: `rigkit validate --url` against CASES (default native-tiered,
#                         native-tiered-corrupt, lmcache-mp-l2) known by URL alone (bench/gpu/url.py); after `prepare`
#                         on the same warm machine (its model); results as gpu-url.tar.gz under $OUT
#   go.sh pays CARRY      issue 42 (bench/gpu/pays.py): the rig probe, then every profile's CPU tier at an 8B shape
#                         against its floor, and candidate settings; after `run` (wheels unpacked) or `prepare` (the
#                         first chunk kept) on the same warm machine; results as pays.tar.gz and pays.json under $OUT
set -u
HERE=$(cd "$(dirname "$0")" && pwd); CARRY=$(cd "${2:?CARRY}" && pwd); T0=$(date +%s)
OUTDIR=${OUT:-/tmp/out}; mkdir -p "$OUTDIR" /tmp/chunks
unxz() { python3 -c 'import lzma,sys,shutil; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1<<20)'; }

# What `rigkit status` reads for GPU health (issue 27), raw, each command's exit status in health-exit-codes.txt.
HEALTH_FIELDS=index,name,uuid,pci.bus_id,temperature.gpu,power.draw,power.limit,enforced.power.limit,power.default_limit,power.max_limit,clocks_event_reasons.active,clocks_event_reasons.hw_slowdown,clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.hw_thermal_slowdown,clocks_event_reasons.hw_power_brake_slowdown,clocks_event_reasons.sw_power_cap,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.volatile.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,memory.used,memory.total,utilization.gpu
capture() {  # capture FILE CODES COMMAND...: stdout+stderr to FILE, "FILE exit=N" to CODES
  local file=$1 codes=$2 rc; shift 2
  "$@" > "$file" 2>&1; rc=$?
  echo "${file##*/} exit=$rc : $*" >> "$codes"
}
health_captures() {  # health_captures DIR WHEN (idle: before any engine; load: engines serving)
  local d=$1 w=$2 c=$1/health-exit-codes.txt
  capture $d/health-$w-query-gpu-noheader-nounits.csv $c nvidia-smi --query-gpu=$HEALTH_FIELDS --format=csv,noheader,nounits
  capture $d/health-$w-query-gpu.csv $c nvidia-smi --query-gpu=$HEALTH_FIELDS --format=csv
  [ "$w" = idle ] || return 0
  capture $d/health-nvidia-smi-q.txt $c nvidia-smi -q
  capture $d/health-unknown-field.txt $c nvidia-smi --query-gpu=index,no.such.field --format=csv,noheader,nounits
  capture $d/health-unknown-field-alone.txt $c nvidia-smi --query-gpu=no.such.field --format=csv
  capture $d/health-dmesg-readable.txt $c bash -c 'dmesg > /dev/null'
  capture $d/health-dmesg-xid.txt $c bash -c 'dmesg | grep -i xid'
  capture $d/health-journalctl-k-xid.txt $c bash -c 'journalctl -k --no-pager | grep -i xid'
  capture $d/health-journalctl-k-readable.txt $c bash -c 'journalctl -k --no-pager -n 1 > /dev/null'
}

unpack_wheels() {  # the carried wheels into /tmp/site (vLLM) and /tmp/site-lm (LMCache), once per machine
  if [ -f /tmp/site/.complete ] && [ -f /tmp/site-lm/.complete ]; then return 0; fi
  cp -n "$CARRY"/p2/* /tmp/chunks/
  (cd /tmp/chunks && sha256sum -c "$CARRY/p2/sha256") || { echo "chunks incomplete (call 1 on another machine?)"; exit 3; }
  if [ ! -f /tmp/site/.complete ]; then
    rm -rf /tmp/site; cat /tmp/chunks/site.part* | unxz | tar -x -C /tmp && touch /tmp/site/.complete || exit 4
  fi
  if [ ! -f /tmp/site-lm/.complete ]; then
    rm -rf /tmp/site-lm; unxz < /tmp/chunks/lm.tar.xz | tar -x -C /tmp && touch /tmp/site-lm/.complete || exit 5
  fi
}

case "$1" in
health)  # the GPU health captures alone (rigkit status, issue 27)
  rm -rf /tmp/gpu-health; mkdir -p /tmp/gpu-health; health_captures /tmp/gpu-health idle
  tar -C /tmp -czf "$OUTDIR/gpu-health.tar.gz" gpu-health; cat /tmp/gpu-health/health-exit-codes.txt;;
prepare)
  cp "$CARRY"/p1/* /tmp/chunks/ && ls -la /tmp/chunks
  H=/tmp/gpu-health; mkdir -p $H
  nvidia-smi -q > $H/nvidia-smi-q.txt 2>&1
  nvidia-smi -q -d POWER,PERFORMANCE,ECC,TEMPERATURE > $H/nvidia-smi-q-power-performance-ecc-temperature.txt 2>&1
  nvidia-smi --query-gpu=index,name,driver_version,power.draw,power.limit,enforced.power.limit,power.min_limit,power.max_limit,clocks_throttle_reasons.active,clocks_throttle_reasons.gpu_idle,clocks_throttle_reasons.applications_clocks_setting,clocks_throttle_reasons.sw_power_cap,clocks_throttle_reasons.hw_slowdown,clocks_throttle_reasons.hw_thermal_slowdown,clocks_throttle_reasons.hw_power_brake_slowdown,clocks_throttle_reasons.sw_thermal_slowdown,clocks_throttle_reasons.sync_boost,temperature.gpu,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,persistence_mode,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.aggregate.total,ecc.errors.uncorrected.aggregate.total --format=csv > $H/nvidia-smi-query-gpu.csv 2>&1
  echo "exit=$?" >> $H/nvidia-smi-query-gpu.csv
  (dmesg 2>&1 | grep -i xid; echo "exit=${PIPESTATUS[0]}") > $H/dmesg-xid.txt 2>&1
  (nvidia-smi; uname -r; nproc; free -g; df -h /dev/shm /tmp; python3 --version) > $H/device.txt 2>&1
  health_captures $H idle
  tar -C /tmp -czf "$OUTDIR/gpu-health.tar.gz" gpu-health
  PYTHONUNBUFFERED=1 timeout 200 python3 "$HERE/train_model.py" "$HERE/model" /tmp/gpu-check-model "${TRAIN_S:-90}" \
    2>&1 | tail -20
  ls -la /tmp/gpu-check-model 2>&1
  cp /tmp/gpu-check-model/training.json "$OUTDIR/" 2>/dev/null
  if [ -n "${SECOND_SHAPE:-}" ]; then  # a second model: another shape, trained on SECOND_CORPUS (e.g. stdlib)
    TRAIN_SHAPE=$SECOND_SHAPE TRAIN_CORPUS=${SECOND_CORPUS:-stdlib} PYTHONUNBUFFERED=1 timeout 200 \
      python3 "$HERE/train_model.py" "$HERE/model" /tmp/gpu-check-model-2 "${TRAIN_S:-90}" 2>&1 | tail -8
    cp /tmp/gpu-check-model-2/training.json "$OUTDIR/training-2.json" 2>/dev/null
  fi
  echo "prepare took $(( $(date +%s) - T0 )) s";;
run)
  unpack_wheels
  echo "wheels unpacked after $(( $(date +%s) - T0 )) s"
  RES=/tmp/gpu-check; rm -rf $RES /tmp/gpu-check-kv; mkdir -p $RES
  MODEL=${MODEL:-/tmp/gpu-check-model}  # /tmp/gpu-check-model-2: the second model of `prepare`
  if [ -f $MODEL/model.safetensors ] && [ "${WEIGHTS:-trained}" = trained ]; then
    STACKS=$CARRY/p2/stacks-real.json; export MODEL_DIR=$MODEL
    cp $MODEL/training.json $MODEL/config.json $RES/ 2>/dev/null
  else
    STACKS=$CARRY/p2/stacks-dummy.json; export MODEL_DIR=$HERE/model
  fi
  cp "$STACKS" $RES/stacks.json
  PYTHONPATH=/tmp/site-lm:/tmp/site python3 -c 'import importlib.metadata as m; print("vllm", m.version("vllm"), "lmcache", m.version("lmcache"), "torch", m.version("torch"), "transformers", m.version("transformers"))' | tee $RES/versions.txt
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
  ( while sleep 20; do tar -C /tmp -czf "$OUTDIR/.partial.tar.gz" gpu-check 2>/dev/null && mv "$OUTDIR/.partial.tar.gz" "$OUTDIR/gpu-check.tar.gz"; done ) &
  PACKER=$!
  # GPU health with the engines up (memory.used, utilization, power under load), into the health archive
  ( sleep ${LOAD_CAPTURE_AFTER_S:-150}; H=/tmp/gpu-health; mkdir -p $H; health_captures $H load
    tar -C /tmp -czf "$OUTDIR/gpu-health-load.tar.gz" gpu-health ) &
  python3 "$HERE/run.py" "$STACKS" $RES $(( ${BUDGET:-540} - ($(date +%s) - T0) )) ${CASES:-}
  kill $PACKER 2>/dev/null
  tar -C /tmp -czf "$OUTDIR/gpu-check.tar.gz" gpu-check
  ls -la "$OUTDIR";;
url)
  unpack_wheels
  echo "wheels ready after $(( $(date +%s) - T0 )) s"
  RES=/tmp/gpu-url; rm -rf $RES /tmp/gpu-check-kv; mkdir -p $RES
  export MODEL_DIR=${MODEL:-/tmp/gpu-check-model} PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
  cp $MODEL_DIR/training.json $MODEL_DIR/config.json $RES/ 2>/dev/null
  PYTHONPATH=/tmp/site-lm:/tmp/site python3 -c 'import importlib.metadata as m; print("vllm", m.version("vllm"), "lmcache", m.version("lmcache"), "torch", m.version("torch"))' | tee $RES/versions.txt
  ( while sleep 20; do tar -C /tmp -czf "$OUTDIR/.partial-url.tar.gz" gpu-url 2>/dev/null && mv "$OUTDIR/.partial-url.tar.gz" "$OUTDIR/gpu-url.tar.gz"; done ) &
  PACKER=$!
  python3 "$HERE/url.py" "$CARRY/p2/stacks-real.json" $RES $(( ${BUDGET:-540} - ($(date +%s) - T0) )) \
    ${CASES:-native-tiered native-tiered-corrupt lmcache-mp-l2}
  kill $PACKER 2>/dev/null
  tar -C /tmp -czf "$OUTDIR/gpu-url.tar.gz" gpu-url
  echo "url took $(( $(date +%s) - T0 )) s"; ls -la "$OUTDIR";;
pays)
  unpack_wheels
  echo "wheels ready after $(( $(date +%s) - T0 )) s"
  RES=/tmp/pays; rm -rf $RES /tmp/pays-kv; mkdir -p $RES
  export MODEL_DIR=/tmp/pays-model KV_ROOT=/tmp/pays-kv PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
  ( while sleep 20; do tar -C /tmp -czf "$OUTDIR/.partial-pays.tar.gz" pays 2>/dev/null && mv "$OUTDIR/.partial-pays.tar.gz" "$OUTDIR/pays.tar.gz"; done ) &
  PACKER=$!
  python3 "$HERE/pays.py" run "$CARRY/p2/stacks-pays.json" $RES $(( ${BUDGET:-520} - ($(date +%s) - T0) ))
  kill $PACKER 2>/dev/null
  tar -C /tmp -czf "$OUTDIR/pays.tar.gz" pays; cp $RES/pays.json "$OUTDIR/" 2>/dev/null
  echo "pays took $(( $(date +%s) - T0 )) s"; ls -la "$OUTDIR";;
esac
