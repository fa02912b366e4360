#!/usr/bin/env bash
# Liveness of a triton-sam server, for compose's healthcheck or a Kubernetes liveness probe.
#
#   scripts/health_check.sh [--heal | --restart] [URL]   (URL: $TRITON_URL or localhost:8000)
#
# Healthy = the server is ready AND every <family>_session model answers a probe. Triton 2.51
# keeps a model READY after its python stub died (see triton_sam/server/health.py), so readiness alone
# cannot tell: the probe asks for an image id nobody embeds; a live stub answers the
# "triton_sam.EmbeddingNotFound" miss, a dead one "Stub process ... is not healthy".
# The session models are listed from the statistics API (open: no key needed), or taken from
# $SESSION_MODELS. With --heal (needs --model-control-mode=explicit; run it on the server's
# host) a dead model is unloaded and loaded again (a fresh stub), then probed once more; the
# repository API needs the admin key: $TRITON_ADMIN_KEY, else the file $TRITON_ADMIN_KEY_FILE
# (default ${XDG_CONFIG_HOME:-~/.config}/triton-sam/admin-key), passed to curl on its stdin so
# it never shows in a process list. With --restart (inside the container, where tritonserver
# is PID 1), a dead model stops the server with SIGTERM so the restart policy starts a fresh
# one (`triton-sam serve` heals by itself, in poll mode, without this script).
# The everything job models (<family>_everything) are decoupled, which Triton's HTTP endpoint
# refuses, so curl cannot probe them: the watchdog (triton_sam/server/health.py) does, over gRPC.
# Exit 0 healthy, 1 not. Needs only bash and curl (both in the NGC Triton image).
set -uo pipefail

heal=0
restart=0
if [[ "${1:-}" == "--heal" ]]; then heal=1; shift; fi
if [[ "${1:-}" == "--restart" ]]; then restart=1; shift; fi
url="${1:-${TRITON_URL:-localhost:8000}}"
url="${url%/}"
[[ "$url" == http*://* ]] || url="http://$url"

curl -fsS -o /dev/null --max-time 5 "$url/v2/health/ready" || { echo "$url: not ready" >&2; exit 1; }

# Session models: names ending in _session among the loaded models (or $SESSION_MODELS).
models="${SESSION_MODELS:-}"
if [[ -z "$models" ]]; then
  stats="$(curl -fsS --max-time 5 "$url/v2/models/stats")" \
    || { echo "$url: cannot list the models (statistics API)" >&2; exit 1; }
  models="$(printf '%s' "$stats" | grep -o '"name":"[A-Za-z0-9_.-]*_session"' | cut -d'"' -f4 \
    | sort -u)"
fi

# curl with the admin key header, read from stdin (a --config file), never on the command line
admin_curl() {
  local key="${TRITON_ADMIN_KEY:-}"
  local file="${TRITON_ADMIN_KEY_FILE:-${XDG_CONFIG_HOME:-$HOME/.config}/triton-sam/admin-key}"
  if [[ -z "$key" && -r "$file" ]]; then key="$(tr -d '[:space:]' < "$file")"; fi
  [[ -n "$key" ]] || { echo "no admin key: set TRITON_ADMIN_KEY or TRITON_ADMIN_KEY_FILE" >&2; return 1; }
  printf 'header = "triton-admin-key: %s"\n' "$key" | curl --config - "$@"
}

probe() {
  curl -sS --max-time 10 -X POST "$url/v2/models/$1/infer" -H 'Content-Type: application/json' \
    -d '{"inputs":[{"name":"image_id","shape":[1,1],"datatype":"BYTES","data":["triton-sam-liveness"]}]}'
}

status=0
for model in $models; do
  body="$(probe "$model")"
  if [[ "$body" != *EmbeddingNotFound* && "$body" != *'"outputs"'* && $heal == 1 ]]; then
    echo "$model: $body; reloading" >&2
    admin_curl -sS --fail-with-body --max-time 60 -X POST "$url/v2/repository/models/$model/unload" >&2
    admin_curl -sS --fail-with-body --max-time 300 -X POST "$url/v2/repository/models/$model/load" >&2
    body="$(probe "$model")"
  fi
  if [[ "$body" != *EmbeddingNotFound* && "$body" != *'"outputs"'* ]]; then
    echo "$model: not alive: $body" >&2
    status=1
    if [[ $restart == 1 ]]; then
      echo "stopping tritonserver (PID 1) so the restart policy starts a fresh one" >&2
      kill -TERM 1
    fi
  fi
done
exit $status
