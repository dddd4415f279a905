#!/usr/bin/env bash
# Side-by-side benchmark of Idempotency-Key proxies in front of one upstream:
#
#   direct            the upstream alone
#   sidecar           idempotency-sidecar -> idempotency-coordinator -> PostgreSQL
#   peer-redis        idempotent-proxy-server 1.2.2 -> redis-server, no persistence
#   peer-redis-fsync  idempotent-proxy-server 1.2.2 -> redis-server, appendonly yes
#                     and appendfsync always
#   sidecar-alt       (only when named in PATHS) a second sidecar on the same
#                     coordinator, with SIDECAR_ALT_ARGS: two settings of the
#                     sidecar alternated in one run
#   sidecar-unix      (only when named in PATHS) a sidecar that reaches the same
#                     coordinator over its Unix socket (`--unix-socket`), as
#                     in one pod, rather than over loopback TCP
#
# Every request is a POST with a small JSON body and a fresh Idempotency-Key
# (so every request is a first run: decided, forwarded, recorded), driven by
# wrk over fixed connections for a fixed duration; the paths alternate, ROUNDS
# times each, at each number of connections in CONNECTIONS (1 or 4: one
# request or a few at a time, so the added latency is the proxy's own round
# trips; 32: the machine saturated, so it is mostly queueing behind CPU
# time). Printed per run: requests/s, p50 and p99 latency and what they
# add to the direct run of the same round, non-2xx answers and socket errors,
# and CPU time per request read from /proc (utime + stime) of the proxy
# process, of its store (redis-server; or the coordinator plus the PostgreSQL
# backends connected to the scratch database) and of the upstream.
#
# What it builds or installs: nothing. Before running it:
#
#   cargo build --release --bins          # idempotency-coordinator, idempotency-sidecar
#   cargo install idempotent-proxy-server --version 1.2.2 --locked \
#       --root ~/.cache/idempotency-coordinator/peer
#   apt-get install -y wrk redis-server   # Debian's; installed here if missing and root
#
# It needs a local PostgreSQL that trusts user postgres on 127.0.0.1:5432; a
# scratch database is created and dropped. Everything it starts is stopped on
# exit.
#
# Environment (defaults in brackets):
#   BIN_DIR      idempotency-coordinator and idempotency-sidecar [target/release]
#   PEER_BIN     idempotent-proxy-server [~/.cache/idempotency-coordinator/peer/bin/...]
#   PG_URL       PostgreSQL server, no database [postgres://postgres@127.0.0.1:5432]
#   CONNECTIONS  wrk connections, a list run in turn [32]; e.g. "1 4 32"
#   THREADS      wrk threads (at most the connections) [2]
#   DURATION     seconds per run [10]      ROUNDS   runs per path [2]
#   BASE_PORT    first of 13 local ports [18600]
#   PATHS        which paths, in order [direct sidecar peer-redis peer-redis-fsync]
#   COORDINATOR_ARGS  extra flags of `idempotency-coordinator serve` [none]
#   SIDECAR_ARGS      extra flags of `idempotency-sidecar` [none]
#   SIDECAR_ALT_ARGS  extra flags of the sidecar-alt path's sidecar [none]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN_DIR=${BIN_DIR:-$ROOT/target/release}
PEER_BIN=${PEER_BIN:-$HOME/.cache/idempotency-coordinator/peer/bin/idempotent-proxy-server}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-2}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-2}
BASE_PORT=${BASE_PORT:-18600}
PATHS=${PATHS:-direct sidecar peer-redis peer-redis-fsync}
COORDINATOR_ARGS=${COORDINATOR_ARGS:-}
SIDECAR_ARGS=${SIDECAR_ARGS:-}
SIDECAR_ALT_ARGS=${SIDECAR_ALT_ARGS:-}

UPSTREAM_PORT=$BASE_PORT
COORDINATOR_PORT=$((BASE_PORT + 1))
SIDECAR_PORT=$((BASE_PORT + 2))
SIDECAR_METRICS_PORT=$((BASE_PORT + 3))
PEER_PORT=$((BASE_PORT + 4))
REDIS_PORT=$((BASE_PORT + 5))
PEER_FSYNC_PORT=$((BASE_PORT + 6))
REDIS_FSYNC_PORT=$((BASE_PORT + 7))
COORDINATOR_METRICS_PORT=$((BASE_PORT + 8))
SIDECAR_ALT_PORT=$((BASE_PORT + 9))
SIDECAR_ALT_METRICS_PORT=$((BASE_PORT + 10))
SIDECAR_UNIX_PORT=$((BASE_PORT + 11))
SIDECAR_UNIX_METRICS_PORT=$((BASE_PORT + 12))

DB=idem_bench_$$
HZ=$(getconf CLK_TCK)
WORK=$(mktemp -d /tmp/idem-compare.XXXXXX)
PIDS=()

log() { printf '%s\n' "$*" >&2; }
die() { log "compare.sh: $*"; exit 1; }

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    psql "$PG_URL/postgres" -qAtc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wants() { case " $PATHS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
BINS=("$BIN_DIR/idempotency-coordinator" "$BIN_DIR/idempotency-sidecar")
if wants peer-redis || wants peer-redis-fsync; then BINS+=("$PEER_BIN"); fi
for bin in "${BINS[@]}"; do
    [ -x "$bin" ] || die "missing $bin (see the top of this script)"
done
if ! command -v wrk >/dev/null || ! command -v redis-server >/dev/null; then
    [ "$(id -u)" = 0 ] || die "install wrk and redis-server (apt-get install -y wrk redis-server)"
    log "installing wrk and redis-server"
    apt-get install -y -qq wrk redis-server >/dev/null
fi
command -v psql >/dev/null || die "psql is needed"

# wait_for DESCRIPTION COMMAND...: retry COMMAND for up to 30 s.
wait_for() {
    local what=$1; shift
    for _ in $(seq 300); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    die "$what did not come up; logs in $WORK"
}

# cpu_ticks PID...: utime + stime of the processes, in clock ticks.
cpu_ticks() {
    local total=0 pid stat
    for pid in "$@"; do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
        stat=${stat##*) }                     # fields from 3 on
        set -- $stat
        total=$((total + ${12} + ${13}))      # fields 14 and 15
    done
    echo "$total"
}

# The PostgreSQL backends serving the scratch database.
pg_backends() {
    ps -eo pid=,args= | awk -v db=" $DB " 'index($0, db) && /postgres:/ {print $1}'
}

# batch_calls: the calls the coordinator's batch statements carried, and
# the statements ("calls statements"), Acquires and Completes together.
batch_calls() {
    curl -sf "http://127.0.0.1:$COORDINATOR_METRICS_PORT/metrics" | awk '
        /^idempotency_batch_size_sum/ { sum += $NF }
        /^idempotency_batch_size_count/ { count += $NF }
        END { printf "%d %d\n", sum, count }'
}

# --- upstream: a small asyncio HTTP/1.1 server, the same for every path ----
cat >"$WORK/upstream.py" <<'PY'
import asyncio, sys

count = 0

async def handle(reader, writer):
    global count
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            count += 1
            body = b'{"payment":%d}' % count
            writer.write(b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()

async def main(port):
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()

asyncio.run(main(int(sys.argv[1])))
PY
python3 "$WORK/upstream.py" "$UPSTREAM_PORT" >"$WORK/upstream.log" 2>&1 &
UPSTREAM_PID=$!; PIDS+=("$UPSTREAM_PID")
wait_for upstream curl -sf -X POST -d '{}' "http://127.0.0.1:$UPSTREAM_PORT/payments"

# --- coordinator on a scratch database, and the sidecar ----------------------
psql "$PG_URL/postgres" -qAtc "CREATE DATABASE $DB" >/dev/null
export DATABASE_URL="$PG_URL/$DB"
"$BIN_DIR/idempotency-coordinator" migrate >"$WORK/migrate.log" 2>&1 || die "migrate failed: $(cat "$WORK/migrate.log")"
COORDINATOR_SOCKET=$WORK/coordinator.sock
# shellcheck disable=SC2086 # COORDINATOR_ARGS is a list of flags
"$BIN_DIR/idempotency-coordinator" serve --listen "127.0.0.1:$COORDINATOR_PORT" \
    --unix-socket "$COORDINATOR_SOCKET" \
    --metrics-listen "127.0.0.1:$COORDINATOR_METRICS_PORT" $COORDINATOR_ARGS >"$WORK/coordinator.log" 2>&1 &
COORDINATOR_PID=$!; PIDS+=("$COORDINATOR_PID")
wait_for coordinator grep -q 'listening for changes; ready' "$WORK/coordinator.log"

start_sidecar() { # NAME PORT METRICS_PORT FLAGS [COORDINATOR]
    local name=$1 port=$2 metrics_port=$3 flags=$4
    local coordinator=${5:-http://127.0.0.1:$COORDINATOR_PORT}
    # shellcheck disable=SC2086 # FLAGS is a list of flags
    RUST_LOG=warn "$BIN_DIR/idempotency-sidecar" $flags \
        --listen "127.0.0.1:$port" \
        --upstream "http://127.0.0.1:$UPSTREAM_PORT" \
        --coordinator "$coordinator" \
        --metrics-listen "127.0.0.1:$metrics_port" \
        --route 'POST /payments require scope=bench' >"$WORK/$name.log" 2>&1 &
    PIDS+=("$!")
    wait_for "$name" curl -sf "http://127.0.0.1:$metrics_port/readyz"
}
start_sidecar sidecar "$SIDECAR_PORT" "$SIDECAR_METRICS_PORT" "$SIDECAR_ARGS"
SIDECAR_PID=${PIDS[-1]}
if wants sidecar-alt; then
    start_sidecar sidecar-alt "$SIDECAR_ALT_PORT" "$SIDECAR_ALT_METRICS_PORT" "$SIDECAR_ALT_ARGS"
    SIDECAR_ALT_PID=${PIDS[-1]}
fi
if wants sidecar-unix; then
    start_sidecar sidecar-unix "$SIDECAR_UNIX_PORT" "$SIDECAR_UNIX_METRICS_PORT" "$SIDECAR_ARGS" \
        "unix:$COORDINATOR_SOCKET"
    SIDECAR_UNIX_PID=${PIDS[-1]}
fi

# --- redis-server instances and the peer in front of each --------------------
start_redis() { # NAME PORT ARGS...
    local name=$1 port=$2; shift 2
    mkdir -p "$WORK/$name"
    redis-server --bind 127.0.0.1 --port "$port" --dir "$WORK/$name" --save '' \
        --daemonize no --logfile "$WORK/$name/redis.log" "$@" &
    PIDS+=("$!")
    wait_for "redis $name" redis-cli -p "$port" ping
}
start_peer() { # NAME PORT REDIS_PORT
    local name=$1 port=$2 redis_port=$3
    mkdir -p "$WORK/$name"
    # The peer reads its configuration from ./.env; /URL_UPSTREAM is proxied to the URL.
    cat >"$WORK/$name/.env" <<ENV
SERVER_ADDR=127.0.0.1:$port
REDIS_URL=redis://127.0.0.1:$redis_port
URL_UPSTREAM=http://127.0.0.1:$UPSTREAM_PORT/payments
REQUEST_TIMEOUT=30000
POLL_INTERVAL=100
LOG_LEVEL=warn
ENV
    (cd "$WORK/$name" && exec "$PEER_BIN") >"$WORK/$name/peer.log" 2>&1 &
    PIDS+=("$!")
    wait_for "peer $name" curl -sf -X POST -H "idempotency-key: probe-$name" \
        -H 'content-type: application/json' -d '{}' "http://127.0.0.1:$port/URL_UPSTREAM"
}
if wants peer-redis; then
    start_redis redis "$REDIS_PORT" --appendonly no
    REDIS_PID=${PIDS[-1]}
    start_peer peer "$PEER_PORT" "$REDIS_PORT"
    PEER_PID=${PIDS[-1]}
fi
if wants peer-redis-fsync; then
    start_redis redis-fsync "$REDIS_FSYNC_PORT" --appendonly yes --appendfsync always
    REDIS_FSYNC_PID=${PIDS[-1]}
    start_peer peer-fsync "$PEER_FSYNC_PORT" "$REDIS_FSYNC_PORT"
    PEER_FSYNC_PID=${PIDS[-1]}
fi

# --- load: a fresh Idempotency-Key for every request -------------------------
cat >"$WORK/post.lua" <<'LUA'
local threads = 0
function setup(thread)
    threads = threads + 1
    thread:set("tid", threads)
end
function init(args)
    prefix = (args[1] or "run") .. "-" .. tid .. "-"
    n = 0
    body = '{"amount":100,"currency":"EUR","reference":"bench"}'
end
function request()
    n = n + 1
    return wrk.format("POST", nil, {
        ["Content-Type"] = "application/json",
        ["Idempotency-Key"] = prefix .. n,
    }, body)
end
function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("RESULT %d %d %d %d %d %d\n", summary.requests,
        summary.duration, latency:percentile(50), latency:percentile(99),
        e.status, e.connect + e.read + e.write + e.timeout))
end
LUA

is_sidecar() { case $1 in sidecar | sidecar-alt | sidecar-unix) return 0 ;; *) return 1 ;; esac; }

# run NAME URL PROXY_PID STORE_PIDS TAG CONNECTIONS: prints "name rps p50 p99
# non2xx errors proxy_us store_us upstream_us calls_per_batch_statement"
run() {
    local name=$1 url=$2 proxy_pid=$3 store_pids=$4 tag=$5 conns=$6
    local pb sb ub pa sa ua out threads=$((THREADS < $6 ? THREADS : $6))
    is_sidecar "$name" && store_pids="$COORDINATOR_PID $(pg_backends | tr '\n' ' ')"
    local bb=(0 0) ba=(0 0) per_batch=-
    is_sidecar "$name" && read -r -a bb < <(batch_calls)
    pb=$(cpu_ticks $proxy_pid); sb=$(cpu_ticks $store_pids); ub=$(cpu_ticks "$UPSTREAM_PID")
    out=$(wrk -t "$threads" -c "$conns" -d "${DURATION}s" --latency -s "$WORK/post.lua" "$url" -- "$tag" 2>&1) \
        || die "wrk failed on $name: $out"
    is_sidecar "$name" && store_pids="$COORDINATOR_PID $(pg_backends | tr '\n' ' ')"
    pa=$(cpu_ticks $proxy_pid); sa=$(cpu_ticks $store_pids); ua=$(cpu_ticks "$UPSTREAM_PID")
    if is_sidecar "$name"; then
        read -r -a ba < <(batch_calls)
        per_batch=$(awk -v c=$((ba[0] - bb[0])) -v n=$((ba[1] - bb[1])) 'BEGIN { if (n > 0) printf "%.2f", c / n; else printf "-" }')
    fi
    echo "$out" >"$WORK/wrk-$tag.txt"
    set -- $(echo "$out" | awk '/^RESULT/ {print $2, $3, $4, $5, $6, $7}')
    [ $# = 6 ] || die "no result from wrk on $name: $out"
    awk -v name="$name" -v req="$1" -v dur="$2" -v p50="$3" -v p99="$4" -v non2xx="$5" -v err="$6" \
        -v pd=$((pa - pb)) -v sd=$((sa - sb)) -v ud=$((ua - ub)) -v hz="$HZ" -v hasproxy="$proxy_pid" \
        -v hasstore="$store_pids" -v per_batch="$per_batch" 'BEGIN {
        us = 1e6 / hz / (req > 0 ? req : 1)
        printf "%s %.0f %.2f %.2f %d %d %s %s %.0f %s\n", name, req / (dur / 1e6), p50 / 1000, p99 / 1000,
            non2xx, err, hasproxy == "" ? "-" : sprintf("%.0f", pd * us),
            hasstore == "" ? "-" : sprintf("%.0f", sd * us), ud * us, per_batch }'
}

log "upstream :$UPSTREAM_PORT, coordinator :$COORDINATOR_PORT (database $DB), sidecar :$SIDECAR_PORT,"
log "peer :$PEER_PORT (redis :$REDIS_PORT), peer-fsync :$PEER_FSYNC_PORT (redis :$REDIS_FSYNC_PORT)"
log "wrk: at most $THREADS threads, connections: $CONNECTIONS, ${DURATION}s a run, $ROUNDS rounds; $(nproc) cores"
log "coordinator flags: ${COORDINATOR_ARGS:-(defaults)}; sidecar flags: ${SIDECAR_ARGS:-(defaults)}"
wants sidecar-alt && log "sidecar-alt :$SIDECAR_ALT_PORT, flags: ${SIDECAR_ALT_ARGS:-(defaults)}"
wants sidecar-unix && log "sidecar-unix :$SIDECAR_UNIX_PORT, to the coordinator's Unix socket"

RESULTS=()
for conns in $CONNECTIONS; do
    for round in $(seq "$ROUNDS"); do
        for path in $PATHS; do
            tag="c$conns-r$round-$path-$$"
            case $path in
                direct) line=$(run direct "http://127.0.0.1:$UPSTREAM_PORT/payments" "" "" "$tag" "$conns") ;;
                sidecar) line=$(run sidecar "http://127.0.0.1:$SIDECAR_PORT/payments" "$SIDECAR_PID" "" "$tag" "$conns") ;;
                sidecar-alt) line=$(run sidecar-alt "http://127.0.0.1:$SIDECAR_ALT_PORT/payments" "$SIDECAR_ALT_PID" "" "$tag" "$conns") ;;
                sidecar-unix) line=$(run sidecar-unix "http://127.0.0.1:$SIDECAR_UNIX_PORT/payments" "$SIDECAR_UNIX_PID" "" "$tag" "$conns") ;;
                peer-redis) line=$(run peer-redis "http://127.0.0.1:$PEER_PORT/URL_UPSTREAM" "$PEER_PID" "$REDIS_PID" "$tag" "$conns") ;;
                peer-redis-fsync) line=$(run peer-redis-fsync "http://127.0.0.1:$PEER_FSYNC_PORT/URL_UPSTREAM" "$PEER_FSYNC_PID" "$REDIS_FSYNC_PID" "$tag" "$conns") ;;
                *) die "unknown path $path" ;;
            esac
            log "connections $conns, round $round: $line"
            RESULTS+=("$conns $round $line")
        done
    done
done

# Added latency: against the direct run of the same round at the same connections.
printf '%s\n' "${RESULTS[@]}" | awk '
    { c[NR] = $1; round[NR] = $2; name[NR] = $3; rps[NR] = $4; p50[NR] = $5; p99[NR] = $6
      non2xx[NR] = $7; err[NR] = $8; proxy[NR] = $9; store[NR] = $10; up[NR] = $11; batch[NR] = $12
      if ($3 == "direct") { d50[$1, $2] = $5; d99[$1, $2] = $6 } }
    END {
      printf "\n| connections | round | path | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | non-2xx | errors | proxy CPU µs/req | store CPU µs/req | upstream CPU µs/req | calls per batch statement |\n"
      printf "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
      for (i = 1; i <= NR; i++) {
        a50 = ((c[i], round[i]) in d50) ? sprintf("%+.2f", p50[i] - d50[c[i], round[i]]) : "-"
        a99 = ((c[i], round[i]) in d99) ? sprintf("%+.2f", p99[i] - d99[c[i], round[i]]) : "-"
        if (name[i] == "direct") { a50 = "-"; a99 = "-" }
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c[i], round[i], name[i], rps[i],
            p50[i], p99[i], a50, a99, non2xx[i], err[i], proxy[i], store[i], up[i], batch[i]
      }
    }'
echo
echo "store: redis-server for the peer; the coordinator plus the PostgreSQL backends of database $DB for the sidecar"
echo "calls per batch statement: Acquires and Completes the coordinator's group commit carried per statement (and commit)"
