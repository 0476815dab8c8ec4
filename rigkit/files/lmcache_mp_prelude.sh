l2_args=()
lmcache_run=(lmcache)
if [ "${LMCACHE_L2}" = "1" ]; then
  l2_args=(--l2-adapter "${LMCACHE_L2_ADAPTER}")
  if [ -n "${RIGKIT_KV_STORE_PASSWORD}" ]; then
    # LMCache's Valkey adapter takes its password only inside the adapter JSON, and every user of the rig
    # reads every command line (ps, /proc/PID/cmdline): the lmcache script runs under its own python with
    # the password added to the JSON inside the process (from .env), so no command line holds it
    lmcache_script=$(command -v lmcache) || { echo "rigkit: no lmcache program in the image" >&2; exit 1; }
    lmcache_python=$(head -n 1 "${lmcache_script}")
    lmcache_python=${lmcache_python#"#!"}
    case "${lmcache_python}" in
      *" "* | "") lmcache_python=python3 ;;  # "#!/usr/bin/env python3", or no shebang
      */python*) ;;
      *) lmcache_python=python3 ;;
    esac
    lmcache_run=("${lmcache_python}" -c '
import json, os, runpy, sys
script, args = sys.argv[1], sys.argv[2:]
at = args.index("--l2-adapter") + 1
adapter = json.loads(args[at])
adapter["password"] = os.environ["RIGKIT_KV_STORE_PASSWORD"]
args[at] = json.dumps(adapter)
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
' "${lmcache_script}")
  fi
fi
"${lmcache_run[@]}" server --port "${LMCACHE_PORT}" --http-host 127.0.0.1 --http-port "${LMCACHE_HTTP_PORT}" \
  --chunk-size "${LMCACHE_CHUNK_SIZE}" --l1-size-gb "${LMCACHE_L1_GB}" \
  --eviction-policy LRU "${l2_args[@]}" &
lmcache_pid=$!
lmcache_alive() {  # a dead server stays a zombie under vLLM, which never reaps it: read its state
  local stat
  stat=$(cat "/proc/${lmcache_pid}/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}
until python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
    "http://127.0.0.1:${LMCACHE_HTTP_PORT}/healthcheck" 2>/dev/null; do
  if ! lmcache_alive; then
    echo "rigkit: lmcache server exited before its /healthcheck answered" >&2
    exit 1
  fi
  sleep 1
done
# from here on vLLM runs as this shell's process ($$ after exec): stop it when the server dies
( while lmcache_alive; do sleep 2; done
  echo "rigkit: lmcache server (pid ${lmcache_pid}) exited: stopping the stack" >&2
  kill "$$" 2>/dev/null ) &
