-- One rule for final answers, written once: a live record that carries
-- another fingerprint than the caller's answers CONFLICT (the fingerprint is
-- fixed when the record is created), and a live SUCCEEDED record answers
-- ALREADY_DONE; anything else needs the rest of idempotency_acquire.
--
-- idempotency_acquire's lock-free and locked paths and the batch's pre-check
-- each wrote this rule out; they now call idempotency_final_decision, and
-- are re-created here unchanged otherwise (a released migration is never
-- edited). The server's copy of the rule is Record::final_decision
-- (src/domain/record.rs), used by the replay cache and by waiters;
-- tests/api/conformance.rs holds every copy to idempotency_acquire's answers.

CREATE FUNCTION idempotency_final_decision(r idempotency_keys, p_fingerprint text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN r.fingerprint <> p_fingerprint THEN 'CONFLICT'
        WHEN r.status = 'SUCCEEDED' THEN 'ALREADY_DONE'
    END
$$;

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
        UPDATE idempotency_keys k SET
            status = 'PROCESSING', fingerprint = p_fingerprint,
            attempt_count = 1, max_attempts = p_max_attempts, retention = v_retention,
            lease_token = gen_random_uuid(), lease_request_id = p_request_id,
            lease_expires_at = v_now + v_lease, lease_outcome = NULL,
            fencing_token = nextval('idempotency_fencing'), offered_until = NULL, offered_to = NULL,
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
        UPDATE idempotency_keys k SET
            status = 'FAILED_PERMANENT',
            lease_expires_at = NULL, next_retry_at = NULL,
            last_error = left(CASE WHEN r.status = 'PROCESSING'
                THEN format('the lease of the last attempt (%s of %s) ran out before it completed',
                            r.attempt_count, r.max_attempts)
                ELSE format('no attempts left (%s of %s); last error: %s',
                            r.attempt_count, r.max_attempts, r.last_error)
                END, 4000),
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
    UPDATE idempotency_keys k SET
        status = 'PROCESSING', attempt_count = r.attempt_count + 1,
        lease_token = gen_random_uuid(), lease_request_id = p_request_id,
        lease_expires_at = v_now + v_lease, lease_outcome = NULL,
        fencing_token = nextval('idempotency_fencing'), offered_until = NULL, offered_to = NULL,
        next_retry_at = NULL, updated_at = v_now,
        expires_at = greatest(v_now + r.retention, v_now + v_lease)
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
    RETURNING * INTO r;
    PERFORM idempotency_notify_if_watched(r, v_now);
    decision := 'PROCEED'; rec := r;
    RETURN NEXT;
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
LANGUAGE plpgsql AS $$
DECLARE
    r      idempotency_keys;
    v_now  timestamptz;
    v_seen text[] := '{}';
    v_id   text;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_key, 1), 0) LOOP
        -- The first call of the batch on a live row with a final answer
        -- (idempotency_final_decision) is answered here, exactly as
        -- idempotency_acquire's lock-free path would, without its call.
        -- Later calls on a row run idempotency_acquire, so that they see
        -- what the earlier ones did.
        v_id := p_tenant[i] || E'\n' || p_scope[i] || E'\n' || p_key[i];
        IF NOT v_id = ANY (v_seen) THEN
            v_seen := v_seen || v_id;
            SELECT * INTO r FROM idempotency_keys k
             WHERE k.tenant = p_tenant[i] AND k.scope = p_scope[i] AND k.idempotency_key = p_key[i];
            v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
            IF FOUND AND r.expires_at > v_now THEN
                decision := idempotency_final_decision(r, p_fingerprint[i]);
                IF decision IS NOT NULL THEN
                    ord := i;
                    retry_after_ms := NULL;
                    rec := r;
                    RETURN NEXT;
                    CONTINUE;
                END IF;
            END IF;
        END IF;
        RETURN QUERY
            SELECT i, a.decision, a.retry_after_ms, a.rec
              FROM idempotency_acquire(p_tenant[i], p_scope[i], p_key[i], p_fingerprint[i],
                                       p_request_id[i], p_lease_ms[i], p_max_attempts[i],
                                       p_retention_ms[i], p_watch_ms[i], p_clock_offset_ms) a;
    END LOOP;
END;
$$;
