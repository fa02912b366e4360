#!/usr/bin/env bash
# Entrypoint of the Triton container (compose and Kubernetes): refuses to start a tritonserver
# whose control APIs are open or unlocked by a guessable key, then runs the command.
#
#   triton_entrypoint.sh tritonserver --http-restricted-api=APIS:triton-admin-key=KEY \
#       --grpc-restricted-protocol=APIS:triton-admin-key=KEY [more flags]
#
# Both restriction flags must be there and restrict model-repository, shared-memory, trace and
# logging; their key must not be the published "change-me", must have >= 32 characters, and
# only A-Z a-z 0-9 . _ ~ - (a key the orchestrator failed to substitute, "$(TRITON_ADMIN_KEY)",
# fails here). Generate one: `triton-sam admin-key --env-file .env` (compose), or
# `kubectl create secret generic triton-sam-admin --from-file=key=<key file>` (Kubernetes).
# The key itself is never printed. Then execs NVIDIA's entrypoint when the image has one
# (its banner and checks), else the command itself.
set -euo pipefail

refuse() { echo "triton-sam: refusing to start: $*" >&2; exit 64; }

need_apis=(model-repository shared-memory trace logging)
seen=()
for arg in "$@"; do
  case "$arg" in
    --http-restricted-api=*|--grpc-restricted-protocol=*) ;;
    *) continue ;;
  esac
  flag="${arg%%=*}"
  value="${arg#*=}"
  apis="${value%%:*}"
  header="${value#*:}"
  [[ "$header" == triton-admin-key=* ]] || refuse "$flag must use the header triton-admin-key"
  key="${header#triton-admin-key=}"
  for api in "${need_apis[@]}"; do
    [[ ",$apis," == *",$api,"* ]] || refuse "$flag does not restrict $api"
  done
  [[ "$key" != "change-me" ]] || refuse "$flag: the admin key is the published default 'change-me'"
  (( ${#key} >= 32 )) || refuse "$flag: the admin key has ${#key} characters, expected >= 32"
  [[ "$key" =~ ^[A-Za-z0-9._~-]+$ ]] \
    || refuse "$flag: the admin key has characters outside A-Z a-z 0-9 . _ ~ - (unset variable?)"
  seen+=("$flag")
done
for flag in --http-restricted-api --grpc-restricted-protocol; do
  [[ " ${seen[*]-} " == *" $flag "* ]] || refuse "no $flag: the control APIs would be open"
done

if [[ -x /opt/nvidia/nvidia_entrypoint.sh ]]; then
  exec /opt/nvidia/nvidia_entrypoint.sh "$@"
fi
exec "$@"
