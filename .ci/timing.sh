# Sourced by .ci/run and .ci/tiers: run a step, time it, keep going, remember its status.
# Each step's line ("name  seconds  ok|FAILED (status)") goes to $CI_TIMES; print_times prints
# them all at the end, so the time of every tier stands in one table below the logs.

: "${CI_TIMES:=$(mktemp -t ci-times.XXXXXX)}"
: "${CI_LOGS:=$(mktemp -d -t ci-logs.XXXXXX)}"
export CI_TIMES CI_LOGS

# step NAME CMD...: run CMD, its output as it comes; record the time; return its status.
step() {
    local name=$1 start=$SECONDS status=0
    shift
    echo "==> [$name] $*"
    "$@" || status=$?
    local word=ok
    [ "$status" -eq 0 ] || word="FAILED (exit $status)"
    printf '%-30s %6d s  %s\n' "$name" $((SECONDS - start)) "$word" >>"$CI_TIMES"
    echo "==> [$name] $word after $((SECONDS - start)) s"
    return "$status"
}

# pytest_run ARGS...: pytest, where "no tests collected" (exit 5: a -k or marker selection
# left nothing in a tier) is not a failure.
pytest_run() {
    local status=0
    "${BIN:-.venv/bin}/pytest" "$@" || status=$?
    [ "$status" -eq 5 ] && return 0
    return "$status"
}

print_times() {
    echo "==> time per step (wall clock; steps in the same phase ran side by side)"
    cat "$CI_TIMES"
    if [ -s "$CI_LOGS/tiers.txt" ]; then
        echo "==> time per test tier (sum of its tests, fixtures included)"
        cat "$CI_LOGS/tiers.txt"
    fi
}
