#!/usr/bin/env bash
# Where a cycle's WAL goes, record type by record type. Starts a private
# PostgreSQL (initdb in a scratch directory, default settings, fsync on),
# loads the tree's schema and functions (sql/), runs cycles the way the
# server's group commit does (bench/wal/cycles.sql: Acquires of new keys in
# batches, then their Completes, each batch one transaction), and prints the WAL bytes per cycle from the insert
# position and, from pg_waldump --stats=record over the same range, each
# record type's count and bytes per cycle (full-page images apart).
#
# A private cluster because WAL is the whole cluster's: anything else
# running on a shared PostgreSQL would be counted too. Deterministic where
# the server's own runs drift: no network, no client, no scheduling; only
# what the SQL writes. What it leaves out: commits are 2 per batch here
# (the server's batches mix both kinds and vary in size), and a checkpoint
# is taken before the warm-up, so the full-page images shown are those of
# pages first touched by the measured cycles.
#
# A running PostgreSQL also logs each page whole the first time it changes
# after a checkpoint (every checkpoint_timeout, 5 minutes by default):
# PRELOAD records (cycles run before the measurement, unmeasured, without
# waiting for their commits to be flushed, then vacuumed) stand for the
# records a table keeps for their retention, CHECKPOINT_EVERY cycles for a
# checkpoint's interval, and KEYS=random draws each key at random (a UUID)
# as many callers do, so that new keys land anywhere in the primary key
# rather than next to each other. Autovacuum is off for the measured cycles, so
# that only what the cycles write is counted (a running table's vacuum
# logs more). The page images are also summed by relation (BY_RELATION=0
# leaves that out).
#
#   bash bench/wal/breakdown.sh            # 8,000 cycles, batches of 16
#   PRELOAD=1000000 CYCLES=100000 CHECKPOINT_EVERY=20000 KEYS=random \
#       WAL_COMPRESSION=lz4 bash bench/wal/breakdown.sh
#   CYCLES=16000 BATCH=32 WAL_COMPRESSION=lz4 FILLFACTOR=90 bash bench/wal/breakdown.sh
#   SQL_FROM=/path/to/older/checkout bash bench/wal/breakdown.sh   # its sql/
#   PRIMARY_KEY_ONLY=1 bash bench/wal/breakdown.sh   # no other index
#   PRIMARY_KEY_ONLY=1 INDEX_ON="created_at fencing_token" bash bench/wal/breakdown.sh
#   REFERENCE=limit bash bench/wal/breakdown.sh      # bench/limit's SQL
#
# PRIMARY_KEY_ONLY drops every index but the primary key, so that a
# Complete is a HOT update: what this record would write if nothing had to
# find dead holders or expired records. INDEX_ON adds a plain index on
# each column it names: on columns a Complete does not change, what a
# design whose maintenance found records through such columns (and whose
# Complete stayed HOT) would write. REFERENCE=limit runs the same
# cycles, with the same values, through the physical limit's SQL instead.
#
# Needs PostgreSQL's server binaries (bench/wal/cluster.sh); as root it
# runs the cluster as user postgres.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cycles=${CYCLES:-8000}
batch=${BATCH:-16}
port=${PORT:-5519}
preload=${PRELOAD:-0}
checkpoint_every=${CHECKPOINT_EVERY:-0}
keys=${KEYS:-ordered}
for setting in "CYCLES=$cycles" "BATCH=$batch" "PRELOAD=$preload" "CHECKPOINT_EVERY=$checkpoint_every"; do
    [[ ${setting#*=} =~ ^[0-9]+$ ]] || { echo "$setting: a whole number, please" >&2; exit 2; }
done
case $keys in
    ordered) random_keys=false ;;
    random) random_keys=true ;;
    *) echo "KEYS=$keys: ordered or random" >&2; exit 2 ;;
esac
if [ "$checkpoint_every" -gt 0 ] && [ "$checkpoint_every" -lt "$batch" ]; then
    echo "CHECKPOINT_EVERY=$checkpoint_every: at least a batch ($batch)" >&2
    exit 2
fi
# The preload in batches of up to 250, so what it creates is rounded down.
preload_batch=$((preload < 250 ? (preload > 0 ? preload : 1) : 250))
preload=$((preload / preload_batch * preload_batch))
# Checkpoints only where asked: none by time or by WAL volume. wal_keep_size
# keeps the segments pg_waldump reads below, which checkpoints would
# otherwise recycle (a million-record preload leaves a few GB of them in
# the scratch directory until the script ends).
settings="-c wal_compression=${WAL_COMPRESSION:-off} -c autovacuum=off -c checkpoint_timeout=1d -c max_wal_size=64GB -c wal_keep_size=16GB"
# shellcheck source=bench/wal/cluster.sh
. "$here/cluster.sh"
load_sql "${SQL_FROM:-$root}" "$here/cycles.sql"
table=idempotency_keys
procedure=wal_cycles
if [ "${REFERENCE:-}" = limit ]; then
    psql_db -c "SET client_min_messages = warning" -f "$root/bench/limit/limit.sql" >/dev/null
    table=limit_keys
    procedure=limit_cycles
fi
if [ -n "${FILLFACTOR:-}" ]; then
    psql_db -c "ALTER TABLE $table SET (fillfactor = $FILLFACTOR)"
fi
if [ -n "${PRIMARY_KEY_ONLY:-}" ]; then
    psql_db -c "DO \$\$ DECLARE i regclass; BEGIN
        FOR i IN SELECT indexrelid FROM pg_index
                  WHERE indrelid = '$table'::regclass AND NOT indisprimary LOOP
            EXECUTE format('DROP INDEX %s', i);
        END LOOP; END \$\$"
fi
for column in ${INDEX_ON:-}; do
    psql_db -c "CREATE INDEX ON $table ($column)"
done
if [ "$preload" -gt 0 ]; then
    psql_db -c "SET synchronous_commit = off" \
        -c "CALL $procedure($preload, $preload_batch, 'preload', 0, $random_keys)"
    psql_db -c "VACUUM ANALYZE $table"
fi
psql_db -c "CHECKPOINT"
# Warm up: the first batches extend the table and grow the indexes' roots.
psql_db -c "CALL $procedure($((batch * 100)), $batch, 'warm', 0, $random_keys)"
# With checkpoints, the measured cycles start on one too, so that each
# interval counts the page images of what it touches, the first as well.
[ "$checkpoint_every" -gt 0 ] && psql_db -c "CHECKPOINT"
# The measured cycles run in one session, which reads its own backend's
# time on a CPU (/proc/self/schedstat, in nanoseconds) before and after:
# what the SQL costs per cycle, commits included, without the noise of a
# client or of the other processes on the machine.
read -r start end cpu_ns <<<"$(psql_db -F ' ' <<SQL
SELECT pg_current_wal_insert_lsn() AS start,
       split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint AS cpu0 \gset
CALL $procedure($cycles, $batch, 'run', $checkpoint_every, $random_keys);
SELECT :'start', pg_current_wal_insert_lsn(),
       split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint - :cpu0;
SQL
)"
bytes=$(psql_db -c "SELECT pg_wal_lsn_diff('$end', '$start')")
checkpoints="no checkpoint"
[ "$checkpoint_every" -gt 0 ] && checkpoints="a checkpoint every $checkpoint_every cycles"
echo "$cycles cycles ($procedure) in batches of $batch, keys $keys, $preload records before, $checkpoints, wal_compression ${WAL_COMPRESSION:-off}, fillfactor ${FILLFACTOR:-as migrated}: $(awk -v b="$bytes" -v n="$cycles" 'BEGIN{printf "%.1f", b/n}') WAL bytes and $(awk -v c="$cpu_ns" -v n="$cycles" 'BEGIN{printf "%.1f", c/n/1000}') µs of the backend's CPU per cycle"
as_owner "'$bin/pg_waldump' -p '$data/db/pg_wal' -s $start -e $end --stats=record" |
    awk -v n="$cycles" '
        { gsub(/\([^)]*\)/, "") }
        $1 ~ /\// && $2 ~ /^[0-9]+$/ {
            # type, count, record bytes, FPI bytes, combined bytes
            rows[++r] = sprintf("%-24s %10.3f %12.1f %12.1f %12.1f", $1, $2 / n, $3 / n, $4 / n, $5 / n)
            fpi += $4
        }
        END {
            printf "of which full-page images: %.1f bytes per cycle\n", fpi / n
            printf "%-24s %10s %12s %12s %12s\n", "record type", "per cycle", "bytes/cycle", "FPI b/cycle", "both"
            for (i = 1; i <= r; i++) print rows[i] | "sort -k5 -nr | head -16"
        }'
# Page images by relation: each record that logged a page whole, its bytes
# beyond the record's own shared among the pages it logged whole (one,
# nearly always), summed by the relation each page belongs to.
if [ "${BY_RELATION:-1}" = 1 ]; then
    as_owner "'$bin/pg_waldump' -p '$data/db/pg_wal' -s $start -e $end" |
        awk '/ FPW/ {
            split($0, len, /len \(rec\/tot\): */); split(len[2], rt, /[\/,] */)
            # The relation file of each page logged whole ("rel T/D/F ... FPW").
            line = $0; whole = 0
            while (match(line, /rel [0-9\/]+ (fork [a-z]+ )?blk [0-9]+( FPW)?/)) {
                ref = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
                if (ref ~ /FPW$/) { split(ref, word, " "); split(word[2], p, "/"); file[++whole] = p[3] }
            }
            for (i = 1; i <= whole; i++) bytes[file[i]] += (rt[2] - rt[1]) / whole
        }
        END { for (f in bytes) printf "(%s,%.0f),", f, bytes[f] }' >"$data/images"
    if [ -s "$data/images" ]; then
        echo "full-page images by relation, bytes per cycle:"
        psql_db -F ' ' -c "SELECT coalesce(c.relname, 'relfilenode ' || i.f), round(i.b::numeric / $cycles, 1)
                             FROM (VALUES $(sed 's/,$//' "$data/images")) i(f, b)
                             LEFT JOIN pg_class c ON c.relfilenode = i.f
                            ORDER BY i.b DESC LIMIT 8" |
            awk '{ printf "  %-40s %10s\n", $1, $2 }'
    fi
fi
