-- One rule for final answers, written once: a live record that carries
-- another fingerprint than the caller's answers CONFLICT (the fingerprint is
-- fixed when the record is created), and a live SUCCEEDED record answers
-- ALREADY_DONE; anything else needs the rest of idempotency_acquire.
--
-- The server's copy of the rule is Record::final_decision
-- (src/domain/record.rs), used by the replay cache and by waiters;
-- tests/api/conformance.rs holds every copy to idempotency_acquire's answers.

CREATE OR REPLACE FUNCTION idempotency_final_decision(r idempotency_keys, p_fingerprint text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN r.fingerprint <> p_fingerprint THEN 'CONFLICT'
        WHEN r.status = 'SUCCEEDED' THEN 'ALREADY_DONE'
    END
$$;

-- idempotency_acquire: may the caller run (p_tenant, p_scope, p_key)?
--
-- decision      | when                                   | effect
-- PROCEED       | no row, or the row is past expires_at  | new PROCESSING row, attempt 1
-- CONFLICT      | fingerprint differs                    | none
-- ALREADY_DONE  | SUCCEEDED                              | none
-- EXHAUSTED     | FAILED_PERMANENT                       | none
-- PROCEED       | PROCESSING, lease live, same request id| none: the same lease again
-- IN_PROGRESS   | PROCESSING, lease live                 | none; retry_after = lease left
-- EXHAUSTED     | lease run out or FAILED, no attempts   | FAILED_PERMANENT, last_error says why
-- RETRY_LATER   | FAILED, next_retry_at in the future    | none; retry_after = until then
-- PROCEED       | lease run out or FAILED and due        | attempt + 1, new lease and token
--
-- max_attempts, retention and fingerprint are fixed when the row is created;
-- p_lease_ms applies to the lease this call grants. p_watch_ms > 0 means the
-- caller will wait that long for a change: on IN_PROGRESS the row is marked
-- watched (watch_until) so that its next change notifies. Every change this
-- function makes to a watched row notifies.
--
-- Concurrency: answers that change nothing and cannot be invalidated by a
-- concurrent writer before they are read (ALREADY_DONE: SUCCEEDED is final;
-- CONFLICT: the fingerprint is fixed for the record's life; IN_PROGRESS
-- without a wait) come from a plain read, without taking the row lock, so
-- replays and callers of a busy key never queue behind each other. Every
-- other decision locks the row FOR UPDATE first. When the plain read
-- found no row, INSERT .. ON CONFLICT DO NOTHING lets exactly one of many
-- concurrent callers create it (a new key costs one read and the insert);
-- the others go on to SELECT .. FOR UPDATE, which waits for the creator's
-- commit and decides on its row, and loop to the insert while no row is
-- found (it was deleted meanwhile).
--
-- A sharded table accepts this function unchanged (docs/scaling.md): a new
-- lease's token and fencing token are drawn into variables before the UPDATE
-- that stores them, and so is the exhausted record's message, because a
-- distributed table refuses volatile functions, and non-immutable ones
-- inside CASE, in an UPDATE.
--
-- Fencing tokens: greatest(the row's last + 1, nextval('idempotency_fencing')).
-- On one PostgreSQL that is nextval, one sequence for every key. On Citus
-- each node's copy of the sequence draws from its own range (node group g
-- from g * 2^48 + 1) and this function runs on the node holding the key's
-- row, so a key's tokens come from one range and grow; the greatest() keeps
-- a live record's tokens strictly growing even when a token comes from
-- another node's range (a call the coordinator ran itself, a shard moved
-- to a node of a lower group). A record created anew (none, or deleted by
-- the sweeper) takes nextval alone: greater than its earlier life's tokens
-- as long as its shard stayed on its node (docs/scaling.md).
CREATE OR REPLACE FUNCTION idempotency_acquire(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_fingerprint     text,
    p_request_id      text,
    p_lease_ms        bigint,
    p_max_attempts    integer,
    p_retention_ms    bigint,
    p_watch_ms        bigint,
    p_clock_offset_ms bigint
)
RETURNS TABLE (decision text, retry_after_ms bigint, rec idempotency_keys)
LANGUAGE plpgsql AS $$
DECLARE
    r           idempotency_keys;
    v_now       timestamptz;
    v_lease     interval := p_lease_ms * interval '1 millisecond';
    v_retention interval := p_retention_ms * interval '1 millisecond';
    v_token     uuid;
    v_fencing   bigint;
    v_none      boolean;
BEGIN
    SELECT * INTO r FROM idempotency_keys k
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key;
    v_none := NOT FOUND;
    v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    IF NOT v_none AND r.expires_at > v_now THEN
        decision := idempotency_final_decision(r, p_fingerprint);
        IF decision IS NOT NULL THEN
            rec := r;
            RETURN NEXT;
            RETURN;
        ELSIF r.status = 'PROCESSING' AND r.lease_expires_at > v_now AND p_watch_ms <= 0
              AND (p_request_id = '' OR p_request_id <> r.lease_request_id) THEN
            decision := 'IN_PROGRESS'; rec := r;
            retry_after_ms := idempotency_millis_until(r.lease_expires_at, v_now);
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    LOOP
        IF NOT v_none THEN
            SELECT * INTO r FROM idempotency_keys k
             WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
               FOR UPDATE;
            v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
            EXIT WHEN FOUND;
        END IF;
        v_none := false;

        -- Drawn before the INSERT: a statement with a volatile call inside
        -- is planned anew every time on Citus (docs/scaling.md).
        v_token := gen_random_uuid();
        v_fencing := nextval('idempotency_fencing');
        INSERT INTO idempotency_keys (
            tenant, scope, idempotency_key, status, fingerprint,
            attempt_count, max_attempts, retention,
            lease_token, lease_request_id, lease_expires_at, fencing_token,
            created_at, updated_at, expires_at)
        VALUES (
            p_tenant, p_scope, p_key, 'PROCESSING', p_fingerprint,
            1, p_max_attempts, v_retention,
            v_token, p_request_id, v_now + v_lease, v_fencing,
            v_now, v_now, greatest(v_now + v_retention, v_now + v_lease))
        ON CONFLICT (tenant, scope, idempotency_key) DO NOTHING
        RETURNING * INTO r;
        IF FOUND THEN
            decision := 'PROCEED'; rec := r;
            RETURN NEXT;
            RETURN;
        END IF;
        -- Another caller created the row since our read: lock it.
    END LOOP;

    RETURN QUERY SELECT * FROM idempotency_acquire_locked(
        r, v_now, p_fingerprint, p_request_id, v_lease, p_max_attempts, v_retention, p_watch_ms);
END;
$$;

-- idempotency_acquire_locked: idempotency_acquire's decision on a record
-- that exists, locked (FOR UPDATE) and read at p_now: the table above from
-- its fourth line on, and the expired record taken as none.
CREATE OR REPLACE FUNCTION idempotency_acquire_locked(
    r                 idempotency_keys,
    p_now             timestamptz,
    p_fingerprint     text,
    p_request_id      text,
    p_lease           interval,
    p_max_attempts    integer,
    p_retention       interval,
    p_watch_ms        bigint
)
RETURNS TABLE (decision text, retry_after_ms bigint, rec idempotency_keys)
LANGUAGE plpgsql AS $$
DECLARE
    v_token   uuid;
    v_fencing bigint;
BEGIN
    IF r.expires_at <= p_now THEN
        -- Expired: the row counts as absent, so this is a new record.
        decision := 'PROCEED';
        rec := idempotency_acquire_anew(r, p_now, p_fingerprint, p_request_id, p_lease,
                                        p_max_attempts, p_retention);
        RETURN NEXT;
        RETURN;
    END IF;

    decision := idempotency_final_decision(r, p_fingerprint);
    IF decision IS NOT NULL THEN
        rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    IF r.status = 'FAILED_PERMANENT' THEN
        decision := 'EXHAUSTED'; rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    IF r.status = 'PROCESSING' AND r.lease_expires_at > p_now THEN
        IF p_request_id <> '' AND p_request_id = r.lease_request_id THEN
            -- The same logical attempt asking again (its answer was lost).
            decision := 'PROCEED';
        ELSE
            decision := 'IN_PROGRESS';
            retry_after_ms := idempotency_millis_until(r.lease_expires_at, p_now);
            IF p_watch_ms > 0
               AND coalesce(r.watch_until, '-infinity') < p_now + p_watch_ms * interval '1 millisecond' THEN
                -- A second more than asked, so that the next waiters of the
                -- same moment find the row marked already and write nothing.
                UPDATE idempotency_keys k SET
                    watch_until = p_now + (p_watch_ms + 1000) * interval '1 millisecond'
                 WHERE k.tenant = r.tenant AND k.scope = r.scope
                   AND k.idempotency_key = r.idempotency_key AND k.updated_at = r.updated_at
                RETURNING * INTO r;
                IF NOT FOUND THEN
                    PERFORM idempotency_changed_meanwhile();
                END IF;
            END IF;
        END IF;
        rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    -- Left: PROCESSING whose lease ran out, or FAILED.
    IF r.attempt_count >= r.max_attempts THEN
        decision := 'EXHAUSTED';
        rec := idempotency_acquire_exhaust(r, p_now);
        RETURN NEXT;
        RETURN;
    END IF;

    IF r.status = 'FAILED' AND r.next_retry_at > p_now THEN
        decision := 'RETRY_LATER'; rec := r;
        retry_after_ms := idempotency_millis_until(r.next_retry_at, p_now);
        RETURN NEXT;
        RETURN;
    END IF;

    -- Take over: the old token is dead from here on.
    v_token := gen_random_uuid();
    v_fencing := greatest(r.fencing_token + 1, nextval('idempotency_fencing'));
    UPDATE idempotency_keys k SET
        status = 'PROCESSING', attempt_count = r.attempt_count + 1,
        lease_token = v_token, lease_request_id = p_request_id,
        lease_expires_at = p_now + p_lease, lease_outcome = NULL,
        fencing_token = v_fencing, offered_until = NULL, offered_to = NULL,
        next_retry_at = NULL, updated_at = p_now,
        expires_at = greatest(p_now + r.retention, p_now + p_lease)
     WHERE k.tenant = r.tenant AND k.scope = r.scope AND k.idempotency_key = r.idempotency_key
       AND k.updated_at = r.updated_at
    RETURNING * INTO r;
    IF NOT FOUND THEN
        PERFORM idempotency_changed_meanwhile();
    END IF;
    PERFORM idempotency_notify_if_watched(r, p_now);
    decision := 'PROCEED'; rec := r;
    RETURN NEXT;
END;
$$;

-- idempotency_acquire_anew: an expired record (which counts as absent)
-- made a new one, attempt 1, for the caller; the record as it is after.
CREATE OR REPLACE FUNCTION idempotency_acquire_anew(
    r              idempotency_keys,
    p_now          timestamptz,
    p_fingerprint  text,
    p_request_id   text,
    p_lease        interval,
    p_max_attempts integer,
    p_retention    interval
)
RETURNS idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    v_token   uuid := gen_random_uuid();
    v_fencing bigint := greatest(r.fencing_token + 1, nextval('idempotency_fencing'));
BEGIN
    UPDATE idempotency_keys k SET
        status = 'PROCESSING', fingerprint = p_fingerprint,
        attempt_count = 1, max_attempts = p_max_attempts, retention = p_retention,
        lease_token = v_token, lease_request_id = p_request_id,
        lease_expires_at = p_now + p_lease, lease_outcome = NULL,
        fencing_token = v_fencing, offered_until = NULL, offered_to = NULL,
        next_retry_at = NULL, last_error = '', last_error_at = NULL,
        result = NULL, result_content_type = '', result_status_code = 0, result_ref = '',
        checkpoint = '', created_at = p_now, updated_at = p_now, completed_at = NULL,
        expires_at = greatest(p_now + p_retention, p_now + p_lease)
     WHERE k.tenant = r.tenant AND k.scope = r.scope AND k.idempotency_key = r.idempotency_key
       AND k.updated_at = r.updated_at
    RETURNING * INTO r;
    IF NOT FOUND THEN
        PERFORM idempotency_changed_meanwhile();
    END IF;
    PERFORM idempotency_notify_if_watched(r, p_now);
    RETURN r;
END;
$$;

-- idempotency_acquire_exhaust: a record whose lease ran out or that
-- FAILED, with no attempts left, made FAILED_PERMANENT (last_error says
-- why); the record as it is after.
CREATE OR REPLACE FUNCTION idempotency_acquire_exhaust(r idempotency_keys, p_now timestamptz)
RETURNS idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    v_error text := left(CASE WHEN r.status = 'PROCESSING'
        THEN format('the lease of the last attempt (%s of %s) ran out before it completed',
                    r.attempt_count, r.max_attempts)
        ELSE format('no attempts left (%s of %s); last error: %s',
                    r.attempt_count, r.max_attempts, r.last_error)
        END, 4000);
BEGIN
    UPDATE idempotency_keys k SET
        status = 'FAILED_PERMANENT',
        lease_expires_at = NULL, next_retry_at = NULL,
        last_error = v_error,
        last_error_at = p_now, completed_at = p_now, updated_at = p_now,
        expires_at = p_now + r.retention
     WHERE k.tenant = r.tenant AND k.scope = r.scope AND k.idempotency_key = r.idempotency_key
       AND k.updated_at = r.updated_at
    RETURNING * INTO r;
    IF NOT FOUND THEN
        PERFORM idempotency_changed_meanwhile();
    END IF;
    PERFORM idempotency_notify_if_watched(r, p_now);
    RETURN r;
END;
$$;
