-- Maintenance: Sweep and the background sweeper.

-- idempotency_sweep_relation: the sweep itself, on relation p_rel: the
-- records table on one PostgreSQL (idempotency_sweep_batch), one shard of
-- it on Citus, run on the node that holds it, where the shard is a plain
-- table (idempotency_sweep_shard, sql/citus/maintenance.sql). Of tenant
-- p_tenant (NULL: every tenant), as of p_now:
--
-- 1. At most p_expired_limit rows past expires_at are deleted: settled ones
--    through idempotency_keys_settled_expiry, oldest first, then
--    PROCESSING ones (rare: a lease runs out before its record expires,
--    and the sweeper reclaims it first).
-- 2. At most p_lease_limit PROCESSING rows whose lease ran out become
--    FAILED, due now (the abandoned attempt counts), or FAILED_PERMANENT
--    when no attempts are left. The lease token stays, so a late Complete
--    from that holder is still honoured as long as nobody takes over.
--    Watchers are notified, and the row's scope is announced on
--    'idempotency_due' for WatchDue.
--
-- PROCESSING rows are found through idempotency_keys_processing (tenant,
-- scope, lease_expires_at; PROCESSING records only), in its order: each
-- scope's leases that ran out first, the lease's end checked in the index
-- entry. Each statement stops at its limit, so a batch reads about what it
-- takes and, at most, the leases still running, as many as the work in
-- flight; after an outage, not the whole backlog of leases that ran out (a
-- sort by the lease's end over every scope would read it for each batch:
-- sql/migrations/0007_one_index_of_leases.sql).
--
-- Rows another transaction has locked are skipped (SKIP LOCKED): Acquire and
-- Complete never wait for the sweeper, and two sweepers never take the same
-- row. With p_dry_run it counts what would be done and changes nothing.
-- The statements name the relation, so they are planned at each call
-- (EXECUTE): once per batch of up to p_expired_limit + p_lease_limit rows.
CREATE OR REPLACE FUNCTION idempotency_sweep_relation(
    p_rel           regclass,
    p_tenant        text,
    p_expired_limit integer,
    p_lease_limit   integer,
    p_dry_run       boolean,
    p_now           timestamptz,
    OUT expired_deleted  bigint,
    OUT leases_reclaimed bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    -- Expired settled rows; expired PROCESSING rows; PROCESSING rows whose
    -- lease ran out and whose record has not expired.
    v_settled text := format(
        'SELECT k.tenant, k.scope, k.idempotency_key FROM %s k
          WHERE k.status <> ''PROCESSING'' AND k.expires_at <= $1
            AND ($2 IS NULL OR k.tenant = $2)', p_rel);
    -- The lapsed are looked for among the first $3 + $5 rows whose lease ran
    -- out (%%s: how they are locked), $3 the deletions left, $5 the lease
    -- limit: either that many hold $3 lapsed, or more than $5 are for the
    -- reclaim below, so nothing this batch could do is missed, and a
    -- backlog of leases that ran out is not read to find none lapsed.
    v_lapsed  text := format(
        'SELECT r.tenant, r.scope, r.idempotency_key FROM (
            SELECT k.tenant, k.scope, k.idempotency_key, k.expires_at FROM %s k
             WHERE k.status = ''PROCESSING'' AND k.lease_expires_at <= $1
               AND ($2 IS NULL OR k.tenant = $2) LIMIT $3::bigint + $5 %%s) r
          WHERE r.expires_at <= $1', p_rel);
    v_dead    text := format(
        'SELECT k.tenant, k.scope, k.idempotency_key FROM %s k
          WHERE k.status = ''PROCESSING'' AND k.lease_expires_at <= $1
            AND k.expires_at > $1 AND ($2 IS NULL OR k.tenant = $2)', p_rel);
    -- Deletes (or, with %2$s = the reclaim below, updates) the rows of the
    -- CTE victims, locked in its statement.
    v_delete  text := 'DELETE FROM %1$s k USING victims v
          WHERE k.tenant = v.tenant AND k.scope = v.scope
            AND k.idempotency_key = v.idempotency_key';
    r         idempotency_keys;
BEGIN
    IF p_dry_run THEN
        EXECUTE format('SELECT least($3, (SELECT count(*) FROM (%s LIMIT $3) x)
                                         + (SELECT count(*) FROM (%s LIMIT $3) x))',
                       v_settled, format(v_lapsed, ''))
           INTO expired_deleted USING p_now, p_tenant, p_expired_limit, 0, p_lease_limit;
        EXECUTE format('SELECT count(*) FROM (%s LIMIT $3) x', v_dead)
           INTO leases_reclaimed USING p_now, p_tenant, p_lease_limit;
        RETURN;
    END IF;

    EXECUTE format('WITH victims AS (%s ORDER BY k.expires_at LIMIT $3 FOR UPDATE SKIP LOCKED) ',
                   v_settled) || format(v_delete, p_rel)
       USING p_now, p_tenant, p_expired_limit;
    GET DIAGNOSTICS expired_deleted = ROW_COUNT;
    EXECUTE format('WITH victims AS (%s LIMIT $3),
                         deleted AS (%s RETURNING 1)
                    SELECT $4 + count(*) FROM deleted',
                   format(v_lapsed, 'FOR UPDATE SKIP LOCKED'), format(v_delete, p_rel))
       INTO expired_deleted
      USING p_now, p_tenant, p_expired_limit - expired_deleted, expired_deleted, p_lease_limit;

    leases_reclaimed := 0;
    FOR r IN EXECUTE format(
        'WITH dead AS (%2$s LIMIT $3 FOR UPDATE SKIP LOCKED)
        UPDATE %1$s k SET
            status = CASE WHEN k.attempt_count >= k.max_attempts
                          THEN ''FAILED_PERMANENT'' ELSE ''FAILED'' END,
            next_retry_at = CASE WHEN k.attempt_count >= k.max_attempts THEN NULL ELSE $1 END,
            completed_at = CASE WHEN k.attempt_count >= k.max_attempts THEN $1 END,
            last_error = CASE WHEN k.attempt_count >= k.max_attempts
                THEN format(''the lease of the last attempt (%%s of %%s) ran out before it completed'',
                            k.attempt_count, k.max_attempts)
                ELSE format(''the lease of attempt %%s of %%s ran out before it completed'',
                            k.attempt_count, k.max_attempts)
                END,
            last_error_at = $1,
            lease_expires_at = NULL,
            updated_at = $1,
            expires_at = greatest(k.expires_at, $1 + k.retention)
          FROM dead d
         WHERE k.tenant = d.tenant AND k.scope = d.scope AND k.idempotency_key = d.idempotency_key
        RETURNING k.*', p_rel, v_dead)
       USING p_now, p_tenant, p_lease_limit
    LOOP
        leases_reclaimed := leases_reclaimed + 1;
        PERFORM idempotency_notify_if_watched(r, p_now);
        IF r.status = 'FAILED' THEN
            -- Identical payloads in one transaction are delivered once.
            PERFORM pg_notify('idempotency_due', r.tenant || E'\n' || r.scope);
        END IF;
    END LOOP;
END;
$$;

-- idempotency_sweep_batch: one short transaction of sweeping on one
-- PostgreSQL, at most p_limit rows of each kind (idempotency_sweep_relation
-- on the records table), of tenant p_tenant (NULL: every tenant, for the
-- background sweeper). With p_exclusive, the batch runs only if it gets the
-- sweeper's transaction-level advisory lock (released at commit, so it is
-- safe on pooled connections): one replica sweeps at a time, the others
-- skip. p_dry_run counts what would be done and changes nothing.
CREATE OR REPLACE FUNCTION idempotency_sweep_batch(
    p_tenant          text,
    p_limit           integer,
    p_dry_run         boolean,
    p_exclusive       boolean,
    p_clock_offset_ms bigint
)
RETURNS TABLE (swept boolean, expired_deleted bigint, leases_reclaimed bigint)
LANGUAGE plpgsql AS $$
BEGIN
    -- "idemswep" in ASCII: an arbitrary constant naming the sweeper's lock.
    IF p_exclusive AND NOT pg_try_advisory_xact_lock(7594306392416544112) THEN
        RETURN QUERY SELECT false, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT true, s.expired_deleted, s.leases_reclaimed
          FROM idempotency_sweep_relation(
                   'idempotency_keys', p_tenant, p_limit, p_limit, p_dry_run,
                   clock_timestamp() + p_clock_offset_ms * interval '1 millisecond') s;
END;
$$;

-- idempotency_count_due_at: FAILED rows of p_tenant (NULL: every tenant)
-- whose retry is due at p_now (for Sweep's report). The caller passes the
-- moment, so that on Citus, where the count runs on every shard and is
-- added up, every shard compares against the same instant. PL/pgSQL: Citus
-- refuses a SQL-language function's parameters in a query over shards.
CREATE OR REPLACE FUNCTION idempotency_count_due_at(p_tenant text, p_now timestamptz)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_due bigint;
BEGIN
    SELECT count(*) INTO v_due FROM idempotency_keys k
     WHERE k.status = 'FAILED' AND (p_tenant IS NULL OR k.tenant = p_tenant)
       AND k.next_retry_at <= p_now
       AND k.expires_at > p_now;
    RETURN v_due;
END;
$$;

-- idempotency_count_due: the same as of the database clock, for servers of
-- the previous release during a rolling upgrade.
CREATE OR REPLACE FUNCTION idempotency_count_due(p_tenant text, p_clock_offset_ms bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN idempotency_count_due_at(
        p_tenant, clock_timestamp() + p_clock_offset_ms * interval '1 millisecond');
END;
$$;
