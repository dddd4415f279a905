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
    r     idempotency_keys;
    v_now timestamptz;
    -- Call i's arguments, copied out of the arrays before the statements
    -- that use them. PostgreSQL sets up a statement's executor each time
    -- the statement runs, compiling every expression in it; a plain
    -- variable costs one step there, an element of an array (or a sum of
    -- two) a compiled subscript or operator. These assignments are simple
    -- expressions, which PL/pgSQL compiles once per transaction: a tenth
    -- off a cycle's instructions (bench/wal/instructions.sh). The per-call
    -- INSERT below now runs only where new keys are not created together
    -- (repeated or unsorted keys, Citus).
    v_tenant        text;
    v_scope         text;
    v_key           text;
    v_fingerprint   text;
    v_request_id    text;
    v_max_attempts  integer;
    v_retention     interval;
    v_lease         interval;
    v_lease_expires timestamptz;
    v_expires       timestamptz;
    v_token         uuid;
    v_result        bytea;
    v_content_type  text;
    v_status_code   integer;
    v_result_ref    text;
    v_calls         integer := coalesce(array_length(p_key, 1), 0);
    -- Whether new keys wait for the INSERT after the loop (see above), and
    -- which Acquires (their positions, ascending) create one there.
    v_together      boolean := NOT p_completes_alone;
    v_new           integer[] := '{}';
    -- The successes waiting for idempotency_succeed_together (positions,
    -- ascending), when keys are together.
    v_succ          integer[] := '{}';
BEGIN
    FOR i IN 2 .. v_calls LOOP
        EXIT WHEN NOT v_together;
        v_together := (p_tenant[i - 1] COLLATE "C", p_scope[i - 1] COLLATE "C", p_key[i - 1] COLLATE "C")
                    < (p_tenant[i] COLLATE "C", p_scope[i] COLLATE "C", p_key[i] COLLATE "C");
    END LOOP;
    FOR i IN 1 .. v_calls LOOP
        ord := i;
        decision := NULL;
        retry_after_ms := NULL;
        outcome := NULL;
        v_tenant := p_tenant[i];
        v_scope := p_scope[i];
        v_key := p_key[i];
        IF NOT p_acquire[i] THEN
            IF p_outcome[i] = 'SUCCESS' AND v_together THEN
                v_succ := v_succ || i;
                CONTINUE;
            ELSIF p_outcome[i] = 'SUCCESS' AND NOT p_completes_alone THEN
                v_result := p_result[i];
                v_content_type := p_content_type[i];
                v_status_code := p_status_code[i];
                v_result_ref := p_result_ref[i];
                v_token := p_token[i];
                v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
                UPDATE idempotency_keys k SET
                    status = 'SUCCEEDED', lease_outcome = 'SUCCESS',
                    lease_expires_at = NULL, next_retry_at = NULL,
                    result = v_result, result_content_type = v_content_type,
                    result_status_code = v_status_code, result_ref = v_result_ref,
                    completed_at = v_now, updated_at = v_now, expires_at = v_now + k.retention
                 WHERE k.tenant = v_tenant AND k.scope = v_scope AND k.idempotency_key = v_key
                   AND k.lease_token = v_token AND k.lease_outcome IS NULL
                   AND k.expires_at > v_now AND k.updated_at <= v_now
                RETURNING * INTO rec;
                IF FOUND THEN
                    IF rec.watch_until > v_now THEN
                        PERFORM idempotency_notify_if_watched(rec, v_now);
                    END IF;
                    outcome := 'OK';
                    RETURN NEXT;
                    CONTINUE;
                END IF;
            END IF;
        ELSE
            SELECT * INTO r FROM idempotency_keys k
             WHERE k.tenant = v_tenant AND k.scope = v_scope AND k.idempotency_key = v_key;
            v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
            IF NOT FOUND AND v_together THEN
                v_new := v_new || i;
                CONTINUE;
            ELSIF NOT FOUND THEN
                v_retention := p_retention_ms[i] * interval '1 millisecond';
                v_lease := p_lease_ms[i] * interval '1 millisecond';
                v_fingerprint := p_fingerprint[i];
                v_max_attempts := p_max_attempts[i];
                v_request_id := p_request_id[i];
                v_lease_expires := v_now + v_lease;
                v_expires := v_now + greatest(v_retention, v_lease);
                INSERT INTO idempotency_keys (
                    tenant, scope, idempotency_key, status, fingerprint,
                    attempt_count, max_attempts, retention,
                    lease_token, lease_request_id, lease_expires_at, fencing_token,
                    created_at, updated_at, expires_at)
                VALUES (
                    v_tenant, v_scope, v_key, 'PROCESSING', v_fingerprint,
                    1, v_max_attempts, v_retention,
                    gen_random_uuid(), v_request_id,
                    v_lease_expires, nextval('idempotency_fencing'),
                    v_now, v_now, v_expires)
                ON CONFLICT (tenant, scope, idempotency_key) DO NOTHING
                RETURNING * INTO rec;
                IF FOUND THEN
                    decision := 'PROCEED';
                    RETURN NEXT;
                    CONTINUE;
                END IF;
            ELSIF r.expires_at > v_now THEN
                decision := idempotency_final_decision(r, p_fingerprint[i]);
                IF decision IS NOT NULL THEN
                    rec := r;
                    RETURN NEXT;
                    CONTINUE;
                END IF;
            END IF;
        END IF;
        -- Call i runs its single-call function, which locks its row: the
        -- successes before it are recorded first, so rows stay locked in
        -- key order.
        IF cardinality(v_succ) > 0 THEN
            RETURN QUERY SELECT * FROM idempotency_succeed_together(
                v_succ, p_tenant, p_scope, p_key, p_token, p_result, p_content_type,
                p_status_code, p_result_ref, p_clock_offset_ms);
            v_succ := '{}';
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
    END LOOP;
    IF cardinality(v_succ) > 0 THEN
        RETURN QUERY SELECT * FROM idempotency_succeed_together(
            v_succ, p_tenant, p_scope, p_key, p_token, p_result, p_content_type,
            p_status_code, p_result_ref, p_clock_offset_ms);
    END IF;
    -- The new keys, created in key order; each row comes back with its
    -- call's position looked up among the (distinct) keys waiting here.
    IF cardinality(v_new) = 0 THEN
        RETURN;
    END IF;
    decision := 'PROCEED';
    retry_after_ms := NULL;
    outcome := NULL;
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
          FROM unnest(v_new) WITH ORDINALITY AS n(i, pos),
               LATERAL (SELECT clock_timestamp() + p_clock_offset_ms * interval '1 millisecond') t(now)
         ORDER BY n.pos
        RETURNING k.*
    LOOP
        FOREACH ord IN ARRAY v_new LOOP
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
