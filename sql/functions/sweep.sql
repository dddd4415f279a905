-- Maintenance: Sweep and the background sweeper.

-- idempotency_sweep_batch: one short transaction of sweeping, at most
-- p_limit rows of each kind, of tenant p_tenant (NULL: every tenant, for the
-- background sweeper).
--
-- 1. Rows past expires_at are deleted.
-- 2. PROCESSING rows whose lease ran out become FAILED, due now (the
--    abandoned attempt counts), or FAILED_PERMANENT when no attempts are
--    left. The lease token stays, so a late Complete from that holder is
--    still honoured as long as nobody takes over. Watchers are notified, and
--    the row's scope is announced on 'idempotency_due' for WatchDue.
--
-- Rows another transaction has locked are skipped (SKIP LOCKED): Acquire and
-- Complete never wait for the sweeper, and two sweepers never take the same
-- row. With p_exclusive, the batch runs only if it gets the sweeper's
-- transaction-level advisory lock (released at commit, so it is safe on
-- pooled connections): one replica sweeps at a time, the others skip.
-- p_dry_run counts what would be done and changes nothing.
CREATE OR REPLACE FUNCTION idempotency_sweep_batch(
    p_tenant          text,
    p_limit           integer,
    p_dry_run         boolean,
    p_exclusive       boolean,
    p_clock_offset_ms bigint
)
RETURNS TABLE (swept boolean, expired_deleted bigint, leases_reclaimed bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    r     idempotency_keys;
BEGIN
    expired_deleted := 0;
    leases_reclaimed := 0;
    -- "idemswep" in ASCII: an arbitrary constant naming the sweeper's lock.
    IF p_exclusive AND NOT pg_try_advisory_xact_lock(7594306392416544112) THEN
        swept := false;
        RETURN NEXT;
        RETURN;
    END IF;
    swept := true;

    IF p_dry_run THEN
        SELECT least(p_limit, s.n + p.n) INTO expired_deleted
          FROM (SELECT count(*) AS n FROM (
                    SELECT 1 FROM idempotency_keys k
                     WHERE k.status <> 'PROCESSING' AND k.expires_at <= v_now
                       AND (p_tenant IS NULL OR k.tenant = p_tenant)
                     LIMIT p_limit) x) s,
               (SELECT count(*) AS n FROM (
                    SELECT 1 FROM idempotency_keys k
                     WHERE k.status = 'PROCESSING' AND k.lease_expires_at <= v_now
                       AND k.expires_at <= v_now AND (p_tenant IS NULL OR k.tenant = p_tenant)
                     LIMIT p_limit) x) p;
        SELECT count(*) INTO leases_reclaimed FROM (
            SELECT 1 FROM idempotency_keys k
             WHERE k.status = 'PROCESSING' AND k.lease_expires_at <= v_now
               AND k.expires_at > v_now AND (p_tenant IS NULL OR k.tenant = p_tenant)
             LIMIT p_limit) x;
        RETURN NEXT;
        RETURN;
    END IF;

    -- Expired settled rows through idempotency_keys_settled_expiry, then
    -- expired PROCESSING ones (rare: a lease runs out before its record
    -- expires, and the sweeper reclaims it first) through
    -- idempotency_keys_leases (sql/migrations/0003_less_wal_per_cycle.sql).
    WITH victims AS (
        SELECT k.tenant, k.scope, k.idempotency_key FROM idempotency_keys k
         WHERE k.status <> 'PROCESSING' AND k.expires_at <= v_now
           AND (p_tenant IS NULL OR k.tenant = p_tenant)
         ORDER BY k.expires_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM idempotency_keys k USING victims v
     WHERE k.tenant = v.tenant AND k.scope = v.scope AND k.idempotency_key = v.idempotency_key;
    GET DIAGNOSTICS expired_deleted = ROW_COUNT;
    WITH victims AS (
        SELECT k.tenant, k.scope, k.idempotency_key FROM idempotency_keys k
         WHERE k.status = 'PROCESSING' AND k.lease_expires_at <= v_now
           AND k.expires_at <= v_now AND (p_tenant IS NULL OR k.tenant = p_tenant)
         ORDER BY k.lease_expires_at
         LIMIT p_limit - expired_deleted
           FOR UPDATE SKIP LOCKED
    ), deleted AS (
        DELETE FROM idempotency_keys k USING victims v
         WHERE k.tenant = v.tenant AND k.scope = v.scope AND k.idempotency_key = v.idempotency_key
        RETURNING 1
    )
    SELECT expired_deleted + count(*) INTO expired_deleted FROM deleted;

    FOR r IN
        WITH dead AS (
            SELECT k.tenant, k.scope, k.idempotency_key FROM idempotency_keys k
             WHERE k.status = 'PROCESSING' AND k.lease_expires_at <= v_now
               AND k.expires_at > v_now AND (p_tenant IS NULL OR k.tenant = p_tenant)
             ORDER BY k.lease_expires_at
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED
        )
        UPDATE idempotency_keys k SET
            status = CASE WHEN k.attempt_count >= k.max_attempts
                          THEN 'FAILED_PERMANENT' ELSE 'FAILED' END,
            next_retry_at = CASE WHEN k.attempt_count >= k.max_attempts
                                 THEN NULL ELSE v_now END,
            completed_at = CASE WHEN k.attempt_count >= k.max_attempts
                                THEN v_now END,
            last_error = CASE WHEN k.attempt_count >= k.max_attempts
                THEN format('the lease of the last attempt (%s of %s) ran out before it completed',
                            k.attempt_count, k.max_attempts)
                ELSE format('the lease of attempt %s of %s ran out before it completed',
                            k.attempt_count, k.max_attempts)
                END,
            last_error_at = v_now,
            lease_expires_at = NULL,
            updated_at = v_now,
            expires_at = greatest(k.expires_at, v_now + k.retention)
          FROM dead d
         WHERE k.tenant = d.tenant AND k.scope = d.scope AND k.idempotency_key = d.idempotency_key
        RETURNING k.*
    LOOP
        leases_reclaimed := leases_reclaimed + 1;
        PERFORM idempotency_notify_if_watched(r, v_now);
        IF r.status = 'FAILED' THEN
            -- Identical payloads in one transaction are delivered once.
            PERFORM pg_notify('idempotency_due', r.tenant || E'\n' || r.scope);
        END IF;
    END LOOP;
    RETURN NEXT;
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
