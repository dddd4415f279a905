# Sourced by the Citus benchmarks: a coordinator node and two workers on
# this machine (ports 5500-5502, PostgreSQL 15 with Citus from `bash
# .ci/citus`, durable settings: fsync, synchronous_commit and
# full_page_writes on), each with the database `bench`, in a scratch
# directory; with PLAIN_PORT set, a plain PostgreSQL of the same settings
# there too (its `bench` without Citus). `citus_cluster_stop` stops every
# node and removes the directory.
bin=/usr/lib/postgresql/15/bin
ports=(5500 5501 5502)
plain_port=${PLAIN_PORT:-}
root=$(mktemp -d /tmp/citus-bench.XXXXXX)
chmod 0777 "$root"
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi; }
sql() { psql -h 127.0.0.1 -p "$1" -U postgres -d "$2" -v ON_ERROR_STOP=1 -qAt -c "$3"; }

citus_cluster_stop() {
    for port in "${ports[@]}" $plain_port; do
        as_pg "$bin/pg_ctl" --pgdata "$root/node-$port" --mode=immediate stop >/dev/null 2>&1 || true
    done
    rm -rf "$root"
}

# A database NAME on every node, a Citus one whose workers are joined to
# the coordinator node (the plain node has it too, without Citus); with
# SHARD_COUNT, its distributed table will have that many shards (Citus's
# default, 32).
citus_database() {
    local port
    for port in "${ports[@]}" $plain_port; do
        sql "$port" postgres "CREATE DATABASE $1"
        [ "$port" = "$plain_port" ] || sql "$port" "$1" "CREATE EXTENSION citus"
    done
    sql 5500 "$1" "SELECT citus_set_coordinator_host('127.0.0.1', 5500)" >/dev/null
    for port in 5501 5502; do
        sql 5500 "$1" "SELECT citus_add_node('127.0.0.1', $port)" >/dev/null
    done
    [ -z "${SHARD_COUNT:-}" ] || sql 5500 "$1" "ALTER DATABASE $1 SET citus.shard_count = $SHARD_COUNT"
}

# Starts the nodes, with the database `bench`.
citus_cluster_start() {
    local port data
    for port in "${ports[@]}" $plain_port; do
        data="$root/node-$port"
        as_pg "$bin/initdb" --pgdata "$data" --username=postgres --auth=trust --locale=C >/dev/null
        cat >> "$data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$data'
shared_preload_libraries = '$([ "$port" = "$plain_port" ] || echo citus)'
max_prepared_transactions = 100
max_connections = 200
shared_buffers = 256MB
citus.node_conninfo = 'sslmode=disable'
CONF
        as_pg "$bin/pg_ctl" --pgdata "$data" --log "$data/postgres.log" --wait start >/dev/null
    done
    citus_database bench
}
