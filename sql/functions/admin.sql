-- The administrators' calls (the admin RPCs and the operator console):
-- act on one record, list a scope's keys, and summarise a tenant.

-- idempotency_admin_act: an administrator's action on one live record,
-- recorded on it (admin_action, admin_actor, admin_reason, admin_at).
--
--   RELEASE_LEASE     PROCESSING only. The lease is taken from its holder:
--                     a new lease token (so the holder's next Complete or
--                     ExtendLease is LEASE_LOST), and the record becomes
--                     FAILED, due now, as if the sweeper had reclaimed it
--                     (the attempt counts; FAILED_PERMANENT when no attempts
--                     are left).
--   RETRY_NOW         FAILED only: its retry is due now, and any offer of
--                     the recovery feed is withdrawn so that it is offered
--                     at once.
--   FAIL_PERMANENTLY  PROCESSING or FAILED: the record becomes
--                     FAILED_PERMANENT with p_reason as its last error; a
--                     holder loses its lease as with RELEASE_LEASE.
--
-- Outcome 'OK' with the record as it stands after, 'NOT_FOUND', or
-- 'WRONG_STATUS' with the record unchanged. Watchers are notified, and a
-- record that became due is announced on 'idempotency_due' for WatchDue.
-- Single-key, with p_key: on Citus delegated to the node holding the key.
CREATE OR REPLACE FUNCTION idempotency_admin_act(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_action          text,
    p_actor           text,
    p_reason          text,
    p_clock_offset_ms bigint
)
RETURNS TABLE (outcome text, rec idempotency_keys)
LANGUAGE plpgsql AS $$
DECLARE
    o       record;
    r       idempotency_keys;
    v_now   timestamptz;
    -- Drawn here, not in the UPDATE: Citus refuses volatile functions in
    -- an UPDATE of a distributed table.
    v_token uuid := gen_random_uuid();
BEGIN
    o := idempotency_open_record(p_tenant, p_scope, p_key, NULL, p_clock_offset_ms);
    IF o.outcome IS NOT NULL THEN
        outcome := o.outcome;
        RETURN NEXT;
        RETURN;
    END IF;
    r := o.rec;
    v_now := o.now;
    IF NOT (p_action = 'RELEASE_LEASE' AND r.status = 'PROCESSING'
            OR p_action = 'RETRY_NOW' AND r.status = 'FAILED'
            OR p_action = 'FAIL_PERMANENTLY' AND r.status IN ('PROCESSING', 'FAILED')) THEN
        IF p_action NOT IN ('RELEASE_LEASE', 'RETRY_NOW', 'FAIL_PERMANENTLY') THEN
            RAISE EXCEPTION 'idempotency_admin_act: unknown action %', p_action;
        END IF;
        outcome := 'WRONG_STATUS'; rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    IF p_action = 'RELEASE_LEASE' THEN
        UPDATE idempotency_keys k SET
            status = CASE WHEN r.attempt_count >= r.max_attempts
                          THEN 'FAILED_PERMANENT' ELSE 'FAILED' END,
            lease_token = v_token, lease_outcome = 'RELEASE',
            lease_expires_at = NULL,
            next_retry_at = CASE WHEN r.attempt_count >= r.max_attempts THEN NULL ELSE v_now END,
            last_error = 'lease released by an administrator: ' || p_reason,
            last_error_at = v_now,
            completed_at = CASE WHEN r.attempt_count >= r.max_attempts THEN v_now END,
            offered_until = NULL, offered_to = NULL,
            updated_at = v_now, expires_at = v_now + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
           AND k.updated_at = r.updated_at
        RETURNING * INTO r;
        IF NOT FOUND THEN
            PERFORM idempotency_changed_meanwhile();
        END IF;
    ELSIF p_action = 'RETRY_NOW' THEN
        UPDATE idempotency_keys k SET
            next_retry_at = v_now, offered_until = NULL, offered_to = NULL,
            updated_at = v_now, expires_at = v_now + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
           AND k.updated_at = r.updated_at
        RETURNING * INTO r;
        IF NOT FOUND THEN
            PERFORM idempotency_changed_meanwhile();
        END IF;
    ELSE
        UPDATE idempotency_keys k SET
            status = 'FAILED_PERMANENT',
            lease_token = CASE WHEN r.status = 'PROCESSING'
                               THEN v_token ELSE r.lease_token END,
            lease_outcome = coalesce(r.lease_outcome, 'FAILURE'),
            lease_expires_at = NULL, next_retry_at = NULL,
            last_error = p_reason, last_error_at = v_now,
            offered_until = NULL, offered_to = NULL,
            completed_at = v_now, updated_at = v_now, expires_at = v_now + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
           AND k.updated_at = r.updated_at
        RETURNING * INTO r;
        IF NOT FOUND THEN
            PERFORM idempotency_changed_meanwhile();
        END IF;
    END IF;
    UPDATE idempotency_keys k SET
        admin_action = p_action, admin_actor = p_actor, admin_reason = p_reason,
        admin_at = v_now
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
    RETURNING * INTO r;

    PERFORM idempotency_notify_if_watched(r, v_now);
    IF r.status = 'FAILED' THEN
        PERFORM pg_notify('idempotency_due', r.tenant || E'\n' || r.scope);
    END IF;
    outcome := 'OK'; rec := r;
    RETURN NEXT;
END;
$$;

-- idempotency_admin_delete: deletes the record, live or expired, and
-- returns it (no row: there was none). Its watchers are notified, and find
-- it gone. Single-key, with p_key: on Citus delegated like the others.
CREATE OR REPLACE FUNCTION idempotency_admin_delete(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_clock_offset_ms bigint
)
RETURNS SETOF idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    r     idempotency_keys;
BEGIN
    DELETE FROM idempotency_keys k
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
    RETURNING * INTO r;
    IF FOUND THEN
        PERFORM idempotency_notify_if_watched(
            r, clock_timestamp() + p_clock_offset_ms * interval '1 millisecond');
        RETURN NEXT r;
    END IF;
END;
$$;

-- idempotency_admin_list: one page of a scope's live keys that begin with
-- p_prefix ('' every key), in key order after p_after ('' from the first),
-- of status p_status ('' any), at most p_limit; the columns a list shows,
-- not the results.
--
-- A range scan of the primary key from the prefix on: in the C collation
-- (the bytes' order) the keys with a prefix are contiguous, so the scan
-- also stops at the first key past them; in other collations they may not
-- be, and the page is found by reading the scope's keys in order.
CREATE OR REPLACE FUNCTION idempotency_admin_list(
    p_tenant          text,
    p_scope           text,
    p_prefix          text,
    p_after           text,
    p_status          text,
    p_limit           integer,
    p_clock_offset_ms bigint
)
RETURNS TABLE (idempotency_key text, status text, attempt_count integer,
               max_attempts integer, lease_expires_at timestamptz,
               next_retry_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now   timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    v_c     boolean := (SELECT datcollate IN ('C', 'POSIX', 'C.UTF-8', 'C.utf8')
                          FROM pg_database WHERE datname = current_database());
BEGIN
    IF v_c AND p_prefix <> '' THEN
        RETURN QUERY
        SELECT k.idempotency_key, k.status, k.attempt_count, k.max_attempts,
               k.lease_expires_at, k.next_retry_at, k.updated_at
          FROM idempotency_keys k
         WHERE k.tenant = p_tenant AND k.scope = p_scope
           AND k.idempotency_key > p_after AND k.idempotency_key >= p_prefix
           AND k.idempotency_key < p_prefix || chr(127)
           AND starts_with(k.idempotency_key, p_prefix)
           AND (p_status = '' OR k.status = p_status) AND k.expires_at > v_now
         ORDER BY k.idempotency_key
         LIMIT p_limit;
    ELSE
        RETURN QUERY
        SELECT k.idempotency_key, k.status, k.attempt_count, k.max_attempts,
               k.lease_expires_at, k.next_retry_at, k.updated_at
          FROM idempotency_keys k
         WHERE k.tenant = p_tenant AND k.scope = p_scope
           AND k.idempotency_key > p_after
           AND starts_with(k.idempotency_key, p_prefix)
           AND (p_status = '' OR k.status = p_status) AND k.expires_at > v_now
         ORDER BY k.idempotency_key
         LIMIT p_limit;
    END IF;
END;
$$;

-- idempotency_admin_summary: a page of p_tenant's scopes (at most p_limit,
-- in order, after p_after; '' from the first), and per scope how many
-- records are in each state and how many are due, cheap on a table of any
-- size and bounded however many scopes the tenant has:
--
-- - the scopes are found by skipping through the primary key, one index
--   descent per scope (a loose index scan), not by reading the records,
--   and no more than a page of them;
-- - PROCESSING, FAILED and FAILED_PERMANENT records, which a healthy
--   system has few of, are counted exactly from their partial indexes,
--   per scope (idempotency_keys_processing, _retries and
--   _failed_permanent, each led by tenant and scope, so that another
--   tenant's records are never read), with those whose lease ran out and
--   whose retry is due;
-- - all records of the scope are counted from the primary key up to p_cap
--   (index-only); a scope with more says so (records_capped) rather than
--   read them all. SUCCEEDED is what is left: exact below the cap, "at
--   least" above it.
--
-- The table's size is not told: it is every tenant's.
--
-- A loop of small statements rather than one recursive query: each is a
-- plain aggregate over one tenant and scope, which Citus also runs (across
-- the shards, on the coordinator), where it refuses recursive queries and
-- correlated subqueries on a distributed table. Counts include records
-- past their expiry that the sweeper has not deleted yet.
DROP FUNCTION IF EXISTS idempotency_admin_summary(text, integer, bigint);
CREATE OR REPLACE FUNCTION idempotency_admin_summary(
    p_tenant          text,
    p_after           text,
    p_limit           integer,
    p_cap             integer,
    p_clock_offset_ms bigint
)
RETURNS TABLE (scope text, processing bigint, leases_expired bigint, failed bigint,
               retries_due bigint, failed_permanent bigint, records bigint,
               records_capped boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now   timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    v_scope      text;
    v_all        bigint;
    v_scopes     text[] := '{}';
BEGIN
    SELECT min(k.scope) INTO v_scope FROM idempotency_keys k
     WHERE k.tenant = p_tenant AND k.scope > p_after;
    WHILE v_scope IS NOT NULL AND cardinality(v_scopes) < p_limit LOOP
        v_scopes := v_scopes || v_scope;
        SELECT min(k.scope) INTO v_scope FROM idempotency_keys k
         WHERE k.tenant = p_tenant AND k.scope > v_scope;
    END LOOP;
    IF cardinality(v_scopes) = 0 THEN
        RETURN;
    END IF;
    FOREACH v_scope IN ARRAY v_scopes LOOP
        scope := v_scope;
        -- idempotency_keys_processing (0006): this tenant's and scope's
        -- in-flight records only.
        SELECT count(*), count(*) FILTER (WHERE k.lease_expires_at <= v_now)
          INTO processing, leases_expired
          FROM idempotency_keys k
         WHERE k.tenant = p_tenant AND k.scope = v_scope AND k.status = 'PROCESSING';
        SELECT count(*), count(*) FILTER (WHERE k.next_retry_at <= v_now)
          INTO failed, retries_due
          FROM idempotency_keys k
         WHERE k.tenant = p_tenant AND k.scope = v_scope AND k.status = 'FAILED';
        SELECT count(*) INTO failed_permanent
          FROM idempotency_keys k
         WHERE k.tenant = p_tenant AND k.scope = v_scope AND k.status = 'FAILED_PERMANENT';
        SELECT count(*) INTO v_all FROM (
            SELECT 1 FROM idempotency_keys k
             WHERE k.tenant = p_tenant AND k.scope = v_scope
             LIMIT p_cap + 1) capped;
        records := least(v_all, p_cap::bigint);
        records_capped := v_all > p_cap;
        RETURN NEXT;
    END LOOP;
END;
$$;
