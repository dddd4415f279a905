# The release server of the benchmark scripts (bench/figures.sh,
# bench/own-cores.sh), started and stopped the same way: source this file.
#
#   start_server LOG COMMAND...   runs COMMAND (the server's `serve`, with
#                                 any prefix such as taskset or env) in the
#                                 background, its output in LOG, sets `pid`,
#                                 and returns once the server listens for
#                                 changes (its database is ready); exits
#                                 with the log if it ends or takes 30 s.
#   stop_server [SIGNAL]          stops it (SIGINT unless said), waits for
#                                 it and clears `pid`; nothing if none runs.

start_server() {
    local log=$1
    shift
    "$@" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
        grep -q "listening for changes" "$log" && return 0
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
        sleep 0.1
    done
    echo "the server did not start within 30 s:" >&2
    cat "$log" >&2
    exit 1
}

stop_server() {
    if [ -n "${pid:-}" ]; then
        kill "-${1:-INT}" "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    pid=
}
