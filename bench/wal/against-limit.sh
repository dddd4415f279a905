#!/usr/bin/env bash
# A cycle's WAL against the physical limit's, like for like: the same
# cycles through this tree's SQL and through bench/limit's
# (bench/wal/breakdown.sh, then again with REFERENCE=limit), with the same
# keys, values, table size, checkpoints and wal_compression, each on a
# private PostgreSQL. Prints both figures and their ratio; with CHECK=1,
# exits 1 when this tree's cycle writes more than the limit's, and 2 (with
# what breakdown.sh said) when a run fails.
#
# By default a steady state: 100,000 cycles on a table that already holds a
# million records, a checkpoint every 20,000 cycles, random keys (10 to 15
# minutes on two cores). Every setting of breakdown.sh applies to both
# runs, so `CYCLES=8000 PRELOAD=0 CHECKPOINT_EVERY=0 KEYS=ordered` measures
# its default (no checkpoint, an almost empty table) instead.
#
#   bash bench/wal/against-limit.sh
#   KEYS=ordered WAL_COMPRESSION=lz4 CHECK=1 bash bench/wal/against-limit.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export PRELOAD=${PRELOAD:-1000000} CYCLES=${CYCLES:-100000}
export CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-20000} KEYS=${KEYS:-random}
unset REFERENCE
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
measure() {
    if ! "$@" >"$out/run" 2>&1; then
        cat "$out/run" >&2
        echo "breakdown.sh failed" >&2
        exit 2
    fi
    cat "$out/run"
}
measure bash "$here/breakdown.sh" >"$out/tree"
measure env REFERENCE=limit bash "$here/breakdown.sh" >"$out/limit"
# The first line of each: "... : N WAL bytes and M µs of the backend's CPU per cycle".
bytes() { sed -n '1s/.*: \([0-9.]*\) WAL bytes.*/\1/p' "$1"; }
images() { sed -n 's/^of which full-page images: \([0-9.]*\).*/\1/p' "$1"; }
tree=$(bytes "$out/tree")
limit=$(bytes "$out/limit")
if [ -z "$tree" ] || [ -z "$limit" ]; then
    cat "$out/tree" "$out/limit" >&2
    echo "breakdown.sh printed no WAL figure" >&2
    exit 2
fi
head -1 "$out/tree"
echo "WAL bytes per cycle: this tree $tree ($(images "$out/tree") in full-page images), the limit $limit ($(images "$out/limit")); ratio $(awk -v t="$tree" -v l="$limit" 'BEGIN { printf "%.2f", t / l }')"
if [ "${CHECK:-}" = 1 ] && awk -v t="$tree" -v l="$limit" 'BEGIN { exit !(t > l) }'; then
    echo "missed: this tree's cycle writes more WAL than the limit's" >&2
    exit 1
fi
