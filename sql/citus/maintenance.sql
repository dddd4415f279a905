-- On a Citus coordinator: the maintenance statements that span records
-- (Sweep and the background sweeper, the recovery feed), in forms Citus
-- runs. Citus refuses `SELECT ... FOR UPDATE` (so `SKIP LOCKED`) over more
-- than one shard, and non-immutable functions given a column or inside CASE
-- in an UPDATE of a distributed table; the single-node functions
-- (sql/functions/sweep.sql, due.sql) use both. The due count
-- (idempotency_count_due_at) needs nothing here.
--
-- Applied at every migration of a Citus database (src/store/migrate.rs),
-- after the function files. Citus creates each function on every node.

-- idempotency_sweep_shard: the single-node sweep (idempotency_sweep_relation,
-- sql/functions/sweep.sql) on one shard, run on the node that holds it,
-- where the shard is a plain table and all of PostgreSQL works (SKIP LOCKED
-- included). At most p_expired_limit expired rows are deleted and
-- p_lease_limit dead leases reclaimed, as of p_now (the same instant for
-- every shard of a round). With p_exclusive it runs only if it gets the
-- shard's sweeper lock (an advisory lock keyed by the shard, held until its
-- commit): one sweeper at a time per shard. Returns {"swept": ...,
-- "expired_deleted": ..., "leases_reclaimed": ...}.
CREATE OR REPLACE FUNCTION idempotency_sweep_shard(
    p_shard         regclass,
    p_tenant        text,
    p_expired_limit integer,
    p_lease_limit   integer,
    p_dry_run       boolean,
    p_exclusive     boolean,
    p_now           timestamptz
)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    s record;
BEGIN
    -- The single-node sweeper's lock constant ("idemswep") with the shard's
    -- oid mixed in: one lock per shard of the node.
    IF p_exclusive
       AND NOT pg_try_advisory_xact_lock(7594306392416544112 # p_shard::oid::bigint) THEN
        RETURN jsonb_build_object('swept', false, 'expired_deleted', 0, 'leases_reclaimed', 0);
    END IF;
    SELECT * INTO s
      FROM idempotency_sweep_relation(p_shard, p_tenant, greatest(p_expired_limit, 0),
                                      greatest(p_lease_limit, 0), p_dry_run, p_now);
    RETURN jsonb_build_object('swept', true, 'expired_deleted', s.expired_deleted,
                              'leases_reclaimed', s.leases_reclaimed);
END;
$$;

-- idempotency_sweep_shards: one round of sweeping on every shard of
-- idempotency_keys, in parallel, each shard in its own transaction on its
-- node (run_command_on_shards). Shard p_shards[i] gets the limits
-- p_expired_limits[i] and p_lease_limits[i]; a shard not listed (created
-- since the caller read the list) gets none this round. Returns each
-- shard's outcome; a shard that failed raises, after the others committed.
CREATE OR REPLACE FUNCTION idempotency_sweep_shards(
    p_tenant          text,
    p_shards          text[],
    p_expired_limits  integer[],
    p_lease_limits    integer[],
    p_dry_run         boolean,
    p_exclusive       boolean,
    p_clock_offset_ms bigint
)
RETURNS TABLE (shard text, swept boolean, expired_deleted bigint, leases_reclaimed bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    v_limits  jsonb;
    v_command text;
    v_out     jsonb;
    o         record;
BEGIN
    SELECT coalesce(jsonb_object_agg(u.s, jsonb_build_array(u.e, u.l)), '{}')
      INTO v_limits
      FROM unnest(p_shards, p_expired_limits, p_lease_limits) AS u(s, e, l);
    -- run_command_on_shards passes the command through format() with the
    -- shard's name: %1$s is the name, every other % is doubled.
    v_command := 'SELECT idempotency_sweep_shard(''%1$s'', '
        || replace(format('%L, coalesce((l->>0)::integer, 0), coalesce((l->>1)::integer, 0), '
                          '%L, %L, %L::timestamptz)',
                          p_tenant, p_dry_run, p_exclusive, v_now), '%', '%%')
        || ' FROM (SELECT ' || replace(quote_literal(v_limits), '%', '%%')
        || '::jsonb -> ''%1$s'' AS l) x';
    FOR o IN SELECT s.shardid, s.success, s.result
               FROM run_command_on_shards('idempotency_keys', v_command) s
    LOOP
        IF NOT o.success THEN
            RAISE EXCEPTION 'sweeping shard % failed: %', o.shardid, o.result;
        END IF;
        v_out := o.result::jsonb;
        shard := shard_name('idempotency_keys'::regclass, o.shardid);
        swept := (v_out->>'swept')::boolean;
        expired_deleted := (v_out->>'expired_deleted')::bigint;
        leases_reclaimed := (v_out->>'leases_reclaimed')::bigint;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- idempotency_claim_due_by_key: idempotency_claim_due's answer without a
-- lock over several shards. The candidates are read without a lock (Citus
-- runs the ORDER BY ... LIMIT on each shard and merges), then each is
-- claimed with a single-key UPDATE whose WHERE repeats every condition, so
-- a row another subscriber claimed meanwhile is left out: never two
-- subscribers at once. The claims lock rows in (tenant, scope, key) byte
-- order, the order batches lock in, so they never deadlock with a batch; a
-- row another call holds is waited for (milliseconds) instead of skipped.
-- Returned in the order they came due.
CREATE OR REPLACE FUNCTION idempotency_claim_due_by_key(
    p_tenant          text,
    p_scope           text,
    p_subscriber      uuid,
    p_offer_ms        bigint,
    p_limit           integer,
    p_clock_offset_ms bigint
)
RETURNS SETOF idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    v_claimed idempotency_keys[] := '{}';
    c         record;
    r         idempotency_keys;
BEGIN
    FOR c IN
        SELECT d.tenant, d.scope, d.idempotency_key FROM (
            SELECT k.tenant, k.scope, k.idempotency_key FROM idempotency_keys k
             WHERE (p_tenant IS NULL OR (k.tenant = p_tenant AND k.scope = p_scope))
               AND idempotency_is_due(k.status, k.next_retry_at, k.lease_expires_at,
                                      k.attempt_count, k.max_attempts, k.expires_at,
                                      k.offered_until, v_now)
             ORDER BY coalesce(k.next_retry_at, k.lease_expires_at)
             LIMIT p_limit) d
         ORDER BY d.tenant COLLATE "C", d.scope COLLATE "C", d.idempotency_key COLLATE "C"
    LOOP
        UPDATE idempotency_keys k SET
            offered_until = v_now + p_offer_ms * interval '1 millisecond',
            offered_to = p_subscriber
         WHERE k.tenant = c.tenant AND k.scope = c.scope AND k.idempotency_key = c.idempotency_key
           AND idempotency_is_due(k.status, k.next_retry_at, k.lease_expires_at, k.attempt_count,
                                  k.max_attempts, k.expires_at, k.offered_until, v_now)
        RETURNING k.* INTO r;
        IF FOUND THEN
            v_claimed := v_claimed || r;
        END IF;
    END LOOP;
    RETURN QUERY
        SELECT x.* FROM unnest(v_claimed) x
         ORDER BY coalesce(x.next_retry_at, x.lease_expires_at);
END;
$$;

-- idempotency_release_offers_by_key: idempotency_release_offers without a
-- lock over several shards: the subscriber's offered rows read without a
-- lock, then released one key at a time in (tenant, scope, key) byte order
-- (the batches' order), each only if still offered to p_subscriber.
CREATE OR REPLACE FUNCTION idempotency_release_offers_by_key(p_subscriber uuid)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_released bigint := 0;
    c          record;
BEGIN
    FOR c IN
        SELECT k.tenant, k.scope, k.idempotency_key FROM idempotency_keys k
         WHERE k.offered_to = p_subscriber
         ORDER BY k.tenant COLLATE "C", k.scope COLLATE "C", k.idempotency_key COLLATE "C"
    LOOP
        UPDATE idempotency_keys k SET offered_until = NULL, offered_to = NULL
         WHERE k.tenant = c.tenant AND k.scope = c.scope AND k.idempotency_key = c.idempotency_key
           AND k.offered_to = p_subscriber;
        IF FOUND THEN
            v_released := v_released + 1;
        END IF;
    END LOOP;
    RETURN v_released;
END;
$$;
