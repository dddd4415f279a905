-- Single-key functions that a sharded table accepts unchanged
-- (docs/scaling.md, "Ready today, at no cost"). Nothing changes on one
-- PostgreSQL:
--
-- - idempotency_acquire draws a new lease's token and fencing token into
--   variables before the UPDATE that stores them, and writes the exhausted
--   record's message the same way: a distributed table refuses volatile
--   functions, and non-immutable ones inside CASE, in an UPDATE. The
--   fencing token is greatest(the row's last + 1, nextval): nextval alone
--   today, since every token came from that one sequence, but it keeps a
--   live record's tokens growing if they ever come from more than one
--   sequence (a record created anew takes nextval alone).
-- - idempotency_watch reads the clock once into a variable (PL/pgSQL)
--   instead of calling clock_timestamp() inside its UPDATE. The clock is
--   now read before the row lock rather than after it; a Watch compares it
--   only with the record's expiry.
-- - The fencing sequence becomes the column's default (never used by the
--   functions, which always set the column), so that tools which copy a
--   table's dependencies to other nodes copy the sequence too.
--
-- idempotency_acquire is re-created here whole, as 0005 left it but for
-- those lines (a released migration is never edited).

ALTER TABLE idempotency_keys
    ALTER COLUMN fencing_token SET DEFAULT nextval('idempotency_fencing');

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
    v_error     text;
BEGIN
    SELECT * INTO r FROM idempotency_keys k
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key;
    v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    IF FOUND AND r.expires_at > v_now THEN
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
        SELECT * INTO r FROM idempotency_keys k
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
           FOR UPDATE;
        v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
        EXIT WHEN FOUND;

        INSERT INTO idempotency_keys (
            tenant, scope, idempotency_key, status, fingerprint,
            attempt_count, max_attempts, retention,
            lease_token, lease_request_id, lease_expires_at, fencing_token,
            created_at, updated_at, expires_at)
        VALUES (
            p_tenant, p_scope, p_key, 'PROCESSING', p_fingerprint,
            1, p_max_attempts, v_retention,
            gen_random_uuid(), p_request_id, v_now + v_lease, nextval('idempotency_fencing'),
            v_now, v_now, greatest(v_now + v_retention, v_now + v_lease))
        ON CONFLICT (tenant, scope, idempotency_key) DO NOTHING
        RETURNING * INTO r;
        IF FOUND THEN
            decision := 'PROCEED'; rec := r;
            RETURN NEXT;
            RETURN;
        END IF;
        -- Another caller created the row between our SELECT and INSERT.
    END LOOP;

    IF r.expires_at <= v_now THEN
        -- Expired: the row counts as absent, so this is a new record.
        v_token := gen_random_uuid();
        v_fencing := greatest(r.fencing_token + 1, nextval('idempotency_fencing'));
        UPDATE idempotency_keys k SET
            status = 'PROCESSING', fingerprint = p_fingerprint,
            attempt_count = 1, max_attempts = p_max_attempts, retention = v_retention,
            lease_token = v_token, lease_request_id = p_request_id,
            lease_expires_at = v_now + v_lease, lease_outcome = NULL,
            fencing_token = v_fencing, offered_until = NULL, offered_to = NULL,
            next_retry_at = NULL, last_error = '', last_error_at = NULL,
            result = NULL, result_content_type = '', result_status_code = 0, result_ref = '',
            checkpoint = '', created_at = v_now, updated_at = v_now, completed_at = NULL,
            expires_at = greatest(v_now + v_retention, v_now + v_lease)
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
        RETURNING * INTO r;
        PERFORM idempotency_notify_if_watched(r, v_now);
        decision := 'PROCEED'; rec := r;
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

    IF r.status = 'PROCESSING' AND r.lease_expires_at > v_now THEN
        IF p_request_id <> '' AND p_request_id = r.lease_request_id THEN
            -- The same logical attempt asking again (its answer was lost).
            decision := 'PROCEED';
        ELSE
            decision := 'IN_PROGRESS';
            retry_after_ms := idempotency_millis_until(r.lease_expires_at, v_now);
            IF p_watch_ms > 0
               AND coalesce(r.watch_until, '-infinity') < v_now + p_watch_ms * interval '1 millisecond' THEN
                -- A second more than asked, so that the next waiters of the
                -- same moment find the row marked already and write nothing.
                UPDATE idempotency_keys k SET
                    watch_until = v_now + (p_watch_ms + 1000) * interval '1 millisecond'
                 WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
                RETURNING * INTO r;
            END IF;
        END IF;
        rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    -- Left: PROCESSING whose lease ran out, or FAILED.
    IF r.attempt_count >= r.max_attempts THEN
        v_error := left(CASE WHEN r.status = 'PROCESSING'
            THEN format('the lease of the last attempt (%s of %s) ran out before it completed',
                        r.attempt_count, r.max_attempts)
            ELSE format('no attempts left (%s of %s); last error: %s',
                        r.attempt_count, r.max_attempts, r.last_error)
            END, 4000);
        UPDATE idempotency_keys k SET
            status = 'FAILED_PERMANENT',
            lease_expires_at = NULL, next_retry_at = NULL,
            last_error = v_error,
            last_error_at = v_now, completed_at = v_now, updated_at = v_now,
            expires_at = v_now + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
        RETURNING * INTO r;
        PERFORM idempotency_notify_if_watched(r, v_now);
        decision := 'EXHAUSTED'; rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    IF r.status = 'FAILED' AND r.next_retry_at > v_now THEN
        decision := 'RETRY_LATER'; rec := r;
        retry_after_ms := idempotency_millis_until(r.next_retry_at, v_now);
        RETURN NEXT;
        RETURN;
    END IF;

    -- Take over: the old token is dead from here on.
    v_token := gen_random_uuid();
    v_fencing := greatest(r.fencing_token + 1, nextval('idempotency_fencing'));
    UPDATE idempotency_keys k SET
        status = 'PROCESSING', attempt_count = r.attempt_count + 1,
        lease_token = v_token, lease_request_id = p_request_id,
        lease_expires_at = v_now + v_lease, lease_outcome = NULL,
        fencing_token = v_fencing, offered_until = NULL, offered_to = NULL,
        next_retry_at = NULL, updated_at = v_now,
        expires_at = greatest(v_now + r.retention, v_now + v_lease)
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
    RETURNING * INTO r;
    PERFORM idempotency_notify_if_watched(r, v_now);
    decision := 'PROCEED'; rec := r;
    RETURN NEXT;
END;
$$;

CREATE OR REPLACE FUNCTION idempotency_watch(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_watch_ms        bigint,
    p_clock_offset_ms bigint
)
RETURNS SETOF idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
BEGIN
    RETURN QUERY
    UPDATE idempotency_keys k SET
        watch_until = greatest(k.watch_until, v_now + p_watch_ms * interval '1 millisecond')
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
       AND k.expires_at > v_now
    RETURNING k.*;
END;
$$;
