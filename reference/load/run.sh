#!/usr/bin/env bash
# kev_server load figures: starts kev_server on MODEL, loads it at each client count for SECONDS with
# request.json (6 questions, short state, 8 state variants), prints one markdown row per count, then
# stops the server with SIGTERM (which waits for the requests still queued).
#   reference/load/run.sh BIN_DIR MODEL_DIR SECONDS "1 8 64" [kev_server options...]
#   reference/load/run.sh build/server/tools /tmp/kev-tiny 20 "1 8 64"
#   reference/load/run.sh /tmp/kev/bin /tmp/kev-0.8b 30 "1 8 64" --backend cuda    # GPU machine (gpu-env)
# BIN_DIR holds kev_server and kev_load. KEV_LOAD_TOOL=wrk uses wrk with systemone.lua instead of kev_load
# (needs wrk and curl). KEV_LOAD_STATES sets the number of state variants (default 8).
set -euo pipefail
bin=$1 model=$2 seconds=$3 clients=$4
shift 4
port=${KEV_LOAD_PORT:-18008}
tool=${KEV_LOAD_TOOL:-kev_load}
states=${KEV_LOAD_STATES:-8}
here=$(cd "$(dirname "$0")" && pwd)
log=$(mktemp /tmp/kev-load-XXXXXX.log)
url=http://127.0.0.1:$port

"$bin/kev_server" --model "$model" --port "$port" "$@" 2>"$log" &
server=$!
trap 'kill -TERM $server 2>/dev/null || true' EXIT
sleep 1
if ! kill -0 $server 2>/dev/null; then cat "$log" >&2; exit 1; fi

# wrk mode: requests and batches from /v1/models, to compute requests per evaluate() call.
counters() {
  curl -s ${KEV_API_KEY:+-H "Authorization: Bearer $KEV_API_KEY"} "$url/v1/models" |
    sed -n 's/.*"requests":\([0-9]*\).*"batches":\([0-9]*\).*/\1 \2/p' | head -1
}

echo "| clients | requests | errors | requests/s | p50 ms | p95 ms | p99 ms | mean batch |"
echo "|---|---|---|---|---|---|---|---|"
for c in $clients; do
  if [ "$tool" = wrk ]; then
    until curl -sf "$url/health" >/dev/null; do sleep 0.5; done
    read -r r0 b0 <<<"$(counters)"
    line=$(KEV_LOAD_STATES=$states wrk -t$(( c < 2 ? 1 : 2 )) -c"$c" -d"${seconds}s" --timeout 600s \
             -s "$here/systemone.lua" "$url/v1/systemone" | grep '^kev_load:')
    read -r r1 b1 <<<"$(counters)"
    line="$line mean_batch=$(awk -v r=$((r1 - r0)) -v b=$((b1 - b0)) 'BEGIN { printf "%.1f", (b > 0 ? r / b : 0) }')"
  else
    line=$("$bin/kev_load" --url "$url" --body "$here/request.json" --clients "$c" --duration "$seconds" \
             --states "$states" --wait 900) || { cat "$log" >&2; exit 1; }
  fi
  get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$line"; }
  echo "| $c | $(get requests) | $(get errors) | $(get rps) | $(get p50_ms) | $(get p95_ms) | $(get p99_ms) | $(get mean_batch) |"
done
kill -TERM $server
wait $server
trap - EXIT
echo "server log: $log ($(wc -l <"$log") lines)" >&2
