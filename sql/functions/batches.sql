-- Group commit: the Acquires and Completes that reach one server together
-- run in one statement, so in one transaction with one commit (one WAL
-- flush) for all of them. A cycle's two calls (the Acquire of one caller,
-- the Complete of another) thus share commits: one queue carries both kinds
-- (src/store/batch.rs), and idempotency_call_batch decides both.
--
-- Element i of every array belongs to call i, an Acquire where p_acquire[i]
-- and a Complete otherwise (the other kind's arrays hold NULL there; the
-- key's arrays, p_tenant, p_scope and p_key, are both kinds'). The calls are
-- decided in array order, each as the single-call function would decide it,
-- and each sees the effects of the calls before it (as if they had run one
-- after the other: every statement of a PL/pgSQL function sees what the
-- earlier ones did). The caller orders the calls by (tenant, scope, key),
-- whatever their kind, so every batch takes its row locks in the same order
-- and two batches do not deadlock (one exception, a refused success among
-- successes recorded together: idempotency_succeed_together). Rows come
-- back tagged with the call's position (ord, from 1), an Acquire's with
-- decision and retry_after_ms, a Complete's with outcome. If any call
-- fails, the whole batch rolls back and the server runs the calls one by
-- one, so a failing call never fails the others.
--
-- The common cases are decided here, without calling the single-call
-- function: a call that creates its record, and a Complete that records its
-- holder's success. A new key then costs one read and the INSERT, and a
-- success one UPDATE, instead of a nested call whose rows PostgreSQL copies
-- into a result set, three reads of the primary key before the INSERT, and
-- for a Complete a row lock written to the WAL before the UPDATE of the same
-- row. The decisions are the single-call functions':
-- - Acquire: when the batch's read finds no row, the INSERT is the one
--   idempotency_acquire would make; if another transaction created the row
--   meanwhile, the INSERT does nothing (or, for keys created together
--   after the loop, fails the batch: below) and idempotency_acquire
--   decides. A live row with a final answer is answered from the batch's
--   read by idempotency_final_decision; every other case runs
--   idempotency_acquire.
-- - Complete SUCCESS: the UPDATE's conditions are idempotency_complete's
--   for applying a success (a live row whose latest lease is the caller's
--   and has not been completed), checked on the row as it is once locked.
--   The clock is read just before the UPDATE, not once the row is locked:
--   so that a Complete that waited for the lock never stores times older
--   than the row's, the UPDATE applies only to a row last changed before
--   that reading; a row changed since (by an ExtendLease, say) goes to
--   idempotency_complete, which reads the clock after the lock. Otherwise
--   idempotency_complete answers. With p_completes_alone (on Citus, which
--   refuses the UPDATE's `v_now + k.retention`, a STABLE operator over a
--   column, in an UPDATE of a distributed table), every Complete runs
--   idempotency_complete: the same decisions, each success costing the row
--   lock idempotency_complete takes before its UPDATE.
--
-- Successes are recorded together where new keys are created together
-- (below: every call on its own key, in ascending order, not on Citus):
-- the loop sets them aside, and idempotency_succeed_together records them
-- in one UPDATE, with the per-key UPDATE's conditions and clock, before
-- the first later call that runs a single-call function (which locks its
-- row) and otherwise after the loop, before the new keys' INSERT. Rows are
-- thus still locked in key order (but for the successes that UPDATE does
-- not apply to: see idempotency_succeed_together). One UPDATE for a
-- batch's successes instead of one each takes a fifth off a cycle's
-- instructions at 16 calls of each kind a batch, a tenth at 4, and costs
-- the same at 2 (bench/wal/instructions.sh with MIXED=1 and BATCH).
--
-- New keys are created together, in one INSERT after the loop. PostgreSQL
-- sets up a statement's executor every time the statement runs (the INSERT
-- of a 30-column row into a table with five partial indexes costs more to
-- set up than to run), so one INSERT for the batch's new keys instead of
-- one for each takes about a seventh off a cycle's instructions
-- (bench/wal/instructions.sh). The loop still reads every Acquire's row
-- first, so a key that exists costs what it did. Deferring the INSERT
-- changes no answer and no lock order when every call of the batch is on
-- a different key and the calls come in ascending key order (bytewise, as
-- the server sorts them): a call's effects then concern its own row alone,
-- and the INSERT creates rows in key order after the loop's locks, which
-- every batch takes in key order too. So the batch checks that first; a
-- batch that repeats a key (or comes unsorted, or on Citus, where
-- p_completes_alone is set) creates each new key in the loop, as before.
-- That INSERT has no ON CONFLICT clause: an INSERT .. ON CONFLICT first
-- probes the primary key for each row, then inserts it speculatively and
-- confirms the insertion in a WAL record of its own (48 bytes a cycle, a
-- twentieth of its WAL; bench/wal/breakdown.sh), and the probe and the
-- confirmation cost a twentieth of a cycle's instructions. A key that
-- another transaction created after the loop's read (a race of two
-- replicas on one new key: within a server, one statement runs at a time
-- on a shared connection) fails the INSERT with a unique violation; the
-- statement then rolls back whole and the server runs its calls one by
-- one, where idempotency_acquire decides that key on the other's record.
-- Not a subtransaction (an EXCEPTION block) around the INSERT instead:
-- every batch would then take a subtransaction id, and subtransactions
-- beside a long-running transaction make every backend look them up in
-- pg_subtrans, a known way for a busy PostgreSQL to stall.
--
-- idempotency_acquire_batch and idempotency_complete_batch are the batch of
-- one kind, kept for servers of the previous release during a rolling
-- upgrade; this release sends idempotency_call_batch alone.

-- A batch's successes, recorded by one UPDATE (the calls at positions
-- p_calls, ascending, of idempotency_call_batch's arrays): PostgreSQL sets
-- up a statement's executor every time it runs, and for an UPDATE of this
-- table (30 columns, five partial indexes) the setup costs more than the
-- update, so one UPDATE for the batch's successes instead of one each.
-- The decisions are the per-key UPDATE's above: a success applies to a
-- live row whose latest lease is the caller's and has not been completed,
-- last changed before the clock reading; every success it does not apply
-- to is decided by idempotency_complete, as before.
--
-- Each key is looked up by its own probe of the primary key (the subquery
-- in the WHERE clause), and its row updated through the row's address
-- (ctid) that the probe found: a plan whose shape cannot change with the
-- table's size. An UPDATE joined to the keys on the primary key's columns
-- would be planned once per session and cached: on a small table (a new
-- database) PostgreSQL plans it as a scan of the whole table, and the
-- cached plan then reads the whole table for every batch as the table
-- grows. Here the only other way to read the table is a sequential scan,
-- and `SET enable_seqscan = off` rules that out at any size (for the
-- probe too). The outer loop is the calls in order, so rows are locked in
-- key order. A row another transaction changes while the UPDATE waits for
-- its lock stays locked, in its turn, and is left to idempotency_complete
-- (PostgreSQL 15.13 and later recheck a TID scan against the address the
-- probe found, which the change moved); earlier releases recheck the row
-- as it now is, as for the per-key UPDATE. The same decision either way.
-- A success refused on the row as the statement saw it (another lease's
-- token, a Complete repeated or late, an expired or missing record) takes
-- no lock in the UPDATE; idempotency_complete locks its row after the
-- UPDATE locked the later ones, out of key order. A deadlock then needs
-- another transaction that holds that row and waits for a later one of
-- this batch (the new holder of a taken-over lease, say); PostgreSQL
-- detects it after deadlock_timeout, and the batch whose statement it
-- fails runs its calls one by one.
CREATE OR REPLACE FUNCTION idempotency_succeed_together(
    p_calls           integer[],
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_token           uuid[],
    p_result          bytea[],
    p_content_type    text[],
    p_status_code     integer[],
    p_result_ref      text[],
    p_clock_offset_ms bigint
)
RETURNS TABLE (ord integer, decision text, retry_after_ms bigint, outcome text,
               rec idempotency_keys)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now  timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    v_done integer[] := '{}';
    v_rows record;
BEGIN
    outcome := 'OK';
    FOR v_rows IN
        UPDATE idempotency_keys k SET
            status = 'SUCCEEDED', lease_outcome = 'SUCCESS',
            lease_expires_at = NULL, next_retry_at = NULL,
            result = p_result[c.i], result_content_type = p_content_type[c.i],
            result_status_code = p_status_code[c.i], result_ref = p_result_ref[c.i],
            completed_at = v_now, updated_at = v_now, expires_at = v_now + k.retention
          FROM unnest(p_calls) AS c(i)
         WHERE k.ctid = (SELECT f.ctid FROM idempotency_keys f
                          WHERE f.tenant = p_tenant[c.i] AND f.scope = p_scope[c.i]
                            AND f.idempotency_key = p_key[c.i])
           AND k.lease_token = p_token[c.i] AND k.lease_outcome IS NULL
           AND k.expires_at > v_now AND k.updated_at <= v_now
        RETURNING c.i, k
    LOOP
        ord := v_rows.i;
        rec := v_rows.k;
        IF rec.watch_until > v_now THEN
            PERFORM idempotency_notify_if_watched(rec, v_now);
        END IF;
        v_done := v_done || ord;
        RETURN NEXT;
    END LOOP;
    IF cardinality(v_done) = cardinality(p_calls) THEN
        RETURN;
    END IF;
    -- The successes the UPDATE did not apply to (it returned the others).
    -- A failure's arguments (error, permanence, retry delay, backoff) mean
    -- nothing to a success.
    FOREACH ord IN ARRAY p_calls LOOP
        CONTINUE WHEN ord = ANY (v_done);
        RETURN QUERY
            SELECT ord, NULL::text, NULL::bigint, c.outcome, c.rec
              FROM idempotency_complete(p_tenant[ord], p_scope[ord], p_key[ord], p_token[ord],
                                        'SUCCESS', p_result[ord], p_content_type[ord],
                                        p_status_code[ord], p_result_ref[ord], NULL, NULL,
                                        NULL, NULL, NULL, p_clock_offset_ms) c;
    END LOOP;
END;
$$;

-- Whether a batch's calls can create their new keys and record their
-- successes together (above): each call on its own key, in ascending key
-- order, bytewise. One call per batch.
CREATE OR REPLACE FUNCTION idempotency_keys_ascending(
    p_tenant text[],
    p_scope  text[],
    p_key    text[]
)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    FOR i IN 2 .. coalesce(array_length(p_key, 1), 0) LOOP
        IF (p_tenant[i - 1] COLLATE "C", p_scope[i - 1] COLLATE "C", p_key[i - 1] COLLATE "C")
           >= (p_tenant[i] COLLATE "C", p_scope[i] COLLATE "C", p_key[i] COLLATE "C") THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END;
$$;

-- The batch: the calls in order (see above). The steps it names:
-- idempotency_keys_ascending (may keys be created together?),
-- idempotency_succeed_together and idempotency_create_together (the
-- successes (v_succ) and new keys (v_new) set aside, positions ascending),
-- idempotency_succeed_alone and idempotency_create_alone (the same for a
-- batch whose keys are not together), and idempotency_call_alone (every
-- other call: its single-call function). The loop itself reads each
-- Acquire's row and answers what needs no lock. Call i's key is copied out
-- of the arrays once (v_tenant, v_scope, v_key): a plain variable costs one
-- step in each statement that uses it, an array element a compiled
-- subscript (bench/wal/instructions.sh).
CREATE OR REPLACE FUNCTION idempotency_call_batch(
    p_acquire         boolean[],
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    -- Acquires'
    p_fingerprint     text[],
    p_request_id      text[],
    p_lease_ms        bigint[],
    p_max_attempts    integer[],
    p_retention_ms    bigint[],
    p_watch_ms        bigint[],
    -- Completes'
    p_token           uuid[],
    p_outcome         text[],
    p_result          bytea[],
    p_content_type    text[],
    p_status_code     integer[],
    p_result_ref      text[],
    p_error           text[],
    p_permanent       boolean[],
    p_retry_after_ms  bigint[],
    p_backoff_base_ms bigint[],
    p_backoff_cap_ms  bigint[],
    p_completes_alone boolean,
    p_clock_offset_ms bigint
)
RETURNS TABLE (ord integer, decision text, retry_after_ms bigint, outcome text,
               rec idempotency_keys)
LANGUAGE plpgsql AS $$
DECLARE
    r          idempotency_keys;
    v_now      timestamptz;
    v_tenant   text;
    v_scope    text;
    v_key      text;
    v_together boolean := NOT p_completes_alone
                          AND idempotency_keys_ascending(p_tenant, p_scope, p_key);
    v_new      integer[] := '{}';
    v_succ     integer[] := '{}';
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_key, 1), 0) LOOP
        ord := i; decision := NULL; retry_after_ms := NULL; outcome := NULL;
        v_tenant := p_tenant[i]; v_scope := p_scope[i]; v_key := p_key[i];
        IF NOT p_acquire[i] THEN
            IF p_outcome[i] = 'SUCCESS' AND v_together THEN
                v_succ := v_succ || i;
                CONTINUE;
            ELSIF p_outcome[i] = 'SUCCESS' AND NOT p_completes_alone THEN
                rec := idempotency_succeed_alone(v_tenant, v_scope, v_key, p_token[i],
                                                 p_result[i], p_content_type[i],
                                                 p_status_code[i], p_result_ref[i],
                                                 p_clock_offset_ms);
                outcome := CASE WHEN rec.tenant IS NOT NULL THEN 'OK' END;
            END IF;
        ELSE
            SELECT * INTO r FROM idempotency_keys k
             WHERE k.tenant = v_tenant AND k.scope = v_scope AND k.idempotency_key = v_key;
            v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
            IF NOT FOUND AND v_together THEN
                v_new := v_new || i;
                CONTINUE;
            ELSIF NOT FOUND THEN
                rec := idempotency_create_alone(v_tenant, v_scope, v_key, p_fingerprint[i],
                                                p_request_id[i], p_lease_ms[i],
                                                p_max_attempts[i], p_retention_ms[i], v_now);
                decision := CASE WHEN rec.tenant IS NOT NULL THEN 'PROCEED' END;
            ELSIF r.expires_at > v_now THEN
                decision := idempotency_final_decision(r, p_fingerprint[i]);
                rec := r;
            END IF;
        END IF;
        -- Answered here, or else by the call's single-call function.
        IF decision IS NOT NULL OR outcome IS NOT NULL THEN
            RETURN NEXT;
            CONTINUE;
        END IF;
        RETURN QUERY SELECT * FROM idempotency_call_alone(
            i, v_succ, p_acquire, p_tenant, p_scope, p_key, p_fingerprint, p_request_id, p_lease_ms,
            p_max_attempts, p_retention_ms, p_watch_ms, p_token, p_outcome, p_result,
            p_content_type, p_status_code, p_result_ref, p_error, p_permanent,
            p_retry_after_ms, p_backoff_base_ms, p_backoff_cap_ms, p_clock_offset_ms);
        v_succ := '{}';
    END LOOP;
    IF cardinality(v_succ) > 0 THEN
        RETURN QUERY SELECT * FROM idempotency_succeed_together(
            v_succ, p_tenant, p_scope, p_key, p_token, p_result, p_content_type,
            p_status_code, p_result_ref, p_clock_offset_ms);
    END IF;
    IF cardinality(v_new) > 0 THEN
        RETURN QUERY SELECT * FROM idempotency_create_together(
            v_new, p_tenant, p_scope, p_key, p_fingerprint, p_request_id, p_lease_ms,
            p_max_attempts, p_retention_ms, p_clock_offset_ms);
    END IF;
END;
$$;

-- A holder's success, for a batch whose keys are not together: the
-- record as updated, or NULL when the conditions (above) do not hold and
-- idempotency_complete must decide.
CREATE OR REPLACE FUNCTION idempotency_succeed_alone(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_token           uuid,
    p_result          bytea,
    p_content_type    text,
    p_status_code     integer,
    p_result_ref      text,
    p_clock_offset_ms bigint
)
RETURNS idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    r     idempotency_keys;
BEGIN
    UPDATE idempotency_keys k SET
        status = 'SUCCEEDED', lease_outcome = 'SUCCESS',
        lease_expires_at = NULL, next_retry_at = NULL,
        result = p_result, result_content_type = p_content_type,
        result_status_code = p_status_code, result_ref = p_result_ref,
        completed_at = v_now, updated_at = v_now, expires_at = v_now + k.retention
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
       AND k.lease_token = p_token AND k.lease_outcome IS NULL
       AND k.expires_at > v_now AND k.updated_at <= v_now
    RETURNING * INTO r;
    IF r.watch_until > v_now THEN
        PERFORM idempotency_notify_if_watched(r, v_now);
    END IF;
    RETURN r;
END;
$$;

-- A new key's record, for a batch whose keys are not together, as of
-- p_now (the clock read after the batch found no row): the record, or NULL
-- when another transaction created it meanwhile and idempotency_acquire
-- must decide.
CREATE OR REPLACE FUNCTION idempotency_create_alone(
    p_tenant       text,
    p_scope        text,
    p_key          text,
    p_fingerprint  text,
    p_request_id   text,
    p_lease_ms     bigint,
    p_max_attempts integer,
    p_retention_ms bigint,
    p_now          timestamptz
)
RETURNS idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    r idempotency_keys;
BEGIN
    INSERT INTO idempotency_keys (
        tenant, scope, idempotency_key, status, fingerprint,
        attempt_count, max_attempts, retention,
        lease_token, lease_request_id, lease_expires_at, fencing_token,
        created_at, updated_at, expires_at)
    VALUES (
        p_tenant, p_scope, p_key, 'PROCESSING', p_fingerprint,
        1, p_max_attempts, p_retention_ms * interval '1 millisecond',
        gen_random_uuid(), p_request_id,
        p_now + p_lease_ms * interval '1 millisecond', nextval('idempotency_fencing'),
        p_now, p_now, p_now + greatest(p_retention_ms, p_lease_ms) * interval '1 millisecond')
    ON CONFLICT (tenant, scope, idempotency_key) DO NOTHING
    RETURNING * INTO r;
    RETURN r;
END;
$$;

-- Call p_i of a batch by its single-call function (idempotency_acquire or
-- idempotency_complete), its rows tagged as the batch's. The function locks
-- the call's row: the successes set aside before it (p_succ) are recorded
-- first, so rows stay locked in key order.
CREATE OR REPLACE FUNCTION idempotency_call_alone(
    p_i               integer,
    p_succ            integer[],
    p_acquire         boolean[],
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_fingerprint     text[],
    p_request_id      text[],
    p_lease_ms        bigint[],
    p_max_attempts    integer[],
    p_retention_ms    bigint[],
    p_watch_ms        bigint[],
    p_token           uuid[],
    p_outcome         text[],
    p_result          bytea[],
    p_content_type    text[],
    p_status_code     integer[],
    p_result_ref      text[],
    p_error           text[],
    p_permanent       boolean[],
    p_retry_after_ms  bigint[],
    p_backoff_base_ms bigint[],
    p_backoff_cap_ms  bigint[],
    p_clock_offset_ms bigint
)
RETURNS TABLE (ord integer, decision text, retry_after_ms bigint, outcome text,
               rec idempotency_keys)
LANGUAGE plpgsql AS $$
DECLARE
    i integer := p_i;
BEGIN
    IF cardinality(p_succ) > 0 THEN
        RETURN QUERY SELECT * FROM idempotency_succeed_together(
            p_succ, p_tenant, p_scope, p_key, p_token, p_result, p_content_type,
            p_status_code, p_result_ref, p_clock_offset_ms);
    END IF;
    IF p_acquire[i] THEN
        RETURN QUERY
            SELECT i, a.decision, a.retry_after_ms, NULL::text, a.rec
              FROM idempotency_acquire(p_tenant[i], p_scope[i], p_key[i], p_fingerprint[i],
                                       p_request_id[i], p_lease_ms[i], p_max_attempts[i],
                                       p_retention_ms[i], p_watch_ms[i], p_clock_offset_ms) a;
    ELSE
        RETURN QUERY
            SELECT i, NULL::text, NULL::bigint, c.outcome, c.rec
              FROM idempotency_complete(p_tenant[i], p_scope[i], p_key[i], p_token[i],
                                        p_outcome[i], p_result[i], p_content_type[i],
                                        p_status_code[i], p_result_ref[i], p_error[i],
                                        p_permanent[i], p_retry_after_ms[i],
                                        p_backoff_base_ms[i], p_backoff_cap_ms[i],
                                        p_clock_offset_ms) c;
    END IF;
END;
$$;

-- The new keys set aside by the batch (positions p_new, ascending),
-- created in key order by one INSERT, each row tagged with its call's
-- position, looked up among the (distinct) keys waiting here.
CREATE OR REPLACE FUNCTION idempotency_create_together(
    p_new             integer[],
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_fingerprint     text[],
    p_request_id      text[],
    p_lease_ms        bigint[],
    p_max_attempts    integer[],
    p_retention_ms    bigint[],
    p_clock_offset_ms bigint
)
RETURNS TABLE (ord integer, decision text, retry_after_ms bigint, outcome text,
               rec idempotency_keys)
LANGUAGE plpgsql AS $$
BEGIN
    decision := 'PROCEED';
    FOR rec IN
        INSERT INTO idempotency_keys AS k (
            tenant, scope, idempotency_key, status, fingerprint,
            attempt_count, max_attempts, retention,
            lease_token, lease_request_id, lease_expires_at, fencing_token,
            created_at, updated_at, expires_at)
        SELECT p_tenant[n.i], p_scope[n.i], p_key[n.i], 'PROCESSING', p_fingerprint[n.i],
               1, p_max_attempts[n.i], p_retention_ms[n.i] * interval '1 millisecond',
               gen_random_uuid(), p_request_id[n.i],
               t.now + p_lease_ms[n.i] * interval '1 millisecond', nextval('idempotency_fencing'),
               t.now, t.now,
               t.now + greatest(p_retention_ms[n.i], p_lease_ms[n.i]) * interval '1 millisecond'
          FROM unnest(p_new) WITH ORDINALITY AS n(i, pos),
               LATERAL (SELECT clock_timestamp() + p_clock_offset_ms * interval '1 millisecond') t(now)
         ORDER BY n.pos
        RETURNING k.*
    LOOP
        FOREACH ord IN ARRAY p_new LOOP
            EXIT WHEN p_key[ord] = rec.idempotency_key AND p_scope[ord] = rec.scope
                  AND p_tenant[ord] = rec.tenant;
        END LOOP;
        RETURN NEXT;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION idempotency_acquire_batch(
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_fingerprint     text[],
    p_request_id      text[],
    p_lease_ms        bigint[],
    p_max_attempts    integer[],
    p_retention_ms    bigint[],
    p_watch_ms        bigint[],
    p_clock_offset_ms bigint
)
RETURNS TABLE (ord integer, decision text, retry_after_ms bigint, rec idempotency_keys)
LANGUAGE sql AS $$
    SELECT b.ord, b.decision, b.retry_after_ms, b.rec
      FROM idempotency_call_batch(
               array_fill(true, ARRAY[cardinality(p_key)]), p_tenant, p_scope, p_key,
               p_fingerprint, p_request_id, p_lease_ms, p_max_attempts, p_retention_ms,
               p_watch_ms, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               false, p_clock_offset_ms) b
$$;

CREATE OR REPLACE FUNCTION idempotency_complete_batch(
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_token           uuid[],
    p_outcome         text[],
    p_result          bytea[],
    p_content_type    text[],
    p_status_code     integer[],
    p_result_ref      text[],
    p_error           text[],
    p_permanent       boolean[],
    p_retry_after_ms  bigint[],
    p_backoff_base_ms bigint[],
    p_backoff_cap_ms  bigint[],
    p_clock_offset_ms bigint
)
RETURNS TABLE (ord integer, outcome text, rec idempotency_keys)
LANGUAGE sql AS $$
    SELECT b.ord, b.outcome, b.rec
      FROM idempotency_call_batch(
               array_fill(false, ARRAY[cardinality(p_key)]), p_tenant, p_scope, p_key,
               NULL, NULL, NULL, NULL, NULL, NULL, p_token, p_outcome, p_result,
               p_content_type, p_status_code, p_result_ref, p_error, p_permanent,
               p_retry_after_ms, p_backoff_base_ms, p_backoff_cap_ms, false,
               p_clock_offset_ms) b
$$;
