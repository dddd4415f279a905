#!/usr/bin/env bash
# The server's own cost per call in instructions, counted by valgrind's
# callgrind: every user-space instruction of a release server while
# idempotency-bench drives one scenario at it, divided by the Acquires and
# Completes it answered (its rpcs metric, read just before it stops). The
# same binary and scenario give the same figure within 2% or so (`cycle`),
# where CPU time on a shared machine drifts by a fifth. System calls (the
# kernel's share of the server's CPU) are not counted; the server's start
# is (about 20 million instructions, under 2% of a 20-second run).
#
#   bash bench/server-instructions.sh                     # cycle, 8 clients, 20 s
#   SCENARIO=replay bash bench/server-instructions.sh
#   SERVER=/path/to/idempotency-coordinator bash bench/server-instructions.sh
#   KEEP=/tmp/server.cg bash bench/server-instructions.sh # keep the profile
#                                                         # (callgrind_annotate)
#
# Needs valgrind, `cargo build --release` (the benchmark, and the server
# unless SERVER names one) and the PostgreSQL at DATABASE_URL, where it
# creates a database of its own and drops it after. Under callgrind the
# server runs some fifty times slower, so its batches carry more calls
# than at full speed: compare trees with the same settings, not with the
# figures of a server at full speed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server=${SERVER:-$root/target/release/idempotency-coordinator}
bench=$root/target/release/idempotency-bench
scenario=${SCENARIO:-cycle}
clients=${CLIENTS:-8}
seconds=${SECONDS_RUN:-20}
port=${PORT:-50071}
metrics_port=$((port + 1))
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
db=server_instructions_$$
db_url=${url%/*}/$db
work=$(mktemp -d)

cleanup() {
    if [ -n "${pid:-}" ]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    psql -qX "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

psql -qX "$url" -c "CREATE DATABASE $db" >/dev/null
"$server" migrate --database-url "$db_url" >"$work/migrate.log" 2>&1
# The start is awaited by its info-level log line, whatever RUST_LOG says.
RUST_LOG=info valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
    "$server" serve --database-url "$db_url" --listen "127.0.0.1:$port" \
    --metrics-listen "127.0.0.1:$metrics_port" >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
    grep -q "listening for changes" "$work/server.log" && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
    sleep 0.5
done
grep -q "listening for changes" "$work/server.log" || { echo "the server did not start" >&2; exit 1; }

DATABASE_URL="$db_url" "$bench" --target "127.0.0.1:$port" --scenario "$scenario" --clients "$clients" \
    --seconds "$seconds" >"$work/bench.log"
grep '^RESULT' "$work/bench.log"

# Every Acquire and Complete answered, whatever its status.
calls() {
    curl -sf "http://127.0.0.1:$metrics_port/metrics" |
        awk -v m="method=\"$1\"" '/^idempotency_rpcs_total\{/ && index($0, m) { n += $NF } END { printf "%d", n }'
}
acquires=$(calls Acquire)
completes=$(calls Complete)
kill -INT "$pid"
wait "$pid" 2>/dev/null || true
pid=
if [ $((acquires + completes)) -eq 0 ]; then
    echo "the server answered no Acquire or Complete" >&2
    exit 1
fi
total=$(awk '/^(summary|totals):/ { print $2; exit }' "$work/cg.out")
[ -n "${KEEP:-}" ] && cp "$work/cg.out" "$KEEP"
awk -v t="$total" -v a="$acquires" -v c="$completes" -v s="$scenario" 'BEGIN {
    printf "%s: %d Acquires and %d Completes, %.0f instructions per call", s, a, c, t / (a + c)
    if (a == c) printf ", %.0f per Acquire + Complete", 2 * t / (a + c)
    printf "\n"
}'
