-- Batched forms of idempotency_acquire and idempotency_complete: the calls
-- that reach one server together run in one statement, so in one transaction
-- with one commit (one WAL flush) for all of them.
--
-- Element i of every array belongs to call i; each call is decided by the
-- single-call function, in array order, and sees the effects of the calls
-- before it (as if they had run one after the other). The caller orders the
-- calls by (tenant, scope, key), so every batch takes its row locks in the
-- same order and two batches never deadlock. Rows come back tagged with the
-- call's position (ord, from 1). If any call fails, the whole batch rolls
-- back and the server runs the calls one by one, so a failing call never
-- fails the others.

CREATE FUNCTION idempotency_acquire_batch(
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
        -- The first call of the batch on a row that is live and SUCCEEDED
        -- (final) or carries another fingerprint (fixed at creation) is
        -- answered here, ALREADY_DONE or CONFLICT, exactly as
        -- idempotency_acquire's lock-free path would, without its call.
        -- Later calls on a row run idempotency_acquire, so that they see
        -- what the earlier ones did.
        v_id := p_tenant[i] || E'\n' || p_scope[i] || E'\n' || p_key[i];
        IF NOT v_id = ANY (v_seen) THEN
            v_seen := v_seen || v_id;
            SELECT * INTO r FROM idempotency_keys k
             WHERE k.tenant = p_tenant[i] AND k.scope = p_scope[i] AND k.idempotency_key = p_key[i];
            v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
            IF FOUND AND r.expires_at > v_now
               AND (r.fingerprint <> p_fingerprint[i] OR r.status = 'SUCCEEDED') THEN
                ord := i;
                decision := CASE WHEN r.fingerprint <> p_fingerprint[i]
                                 THEN 'CONFLICT' ELSE 'ALREADY_DONE' END;
                retry_after_ms := NULL;
                rec := r;
                RETURN NEXT;
                CONTINUE;
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

CREATE FUNCTION idempotency_complete_batch(
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
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_key, 1), 0) LOOP
        RETURN QUERY
            SELECT i, c.outcome, c.rec
              FROM idempotency_complete(p_tenant[i], p_scope[i], p_key[i], p_token[i],
                                        p_outcome[i], p_result[i], p_content_type[i],
                                        p_status_code[i], p_result_ref[i], p_error[i],
                                        p_permanent[i], p_retry_after_ms[i],
                                        p_backoff_base_ms[i], p_backoff_cap_ms[i],
                                        p_clock_offset_ms) c;
    END LOOP;
END;
$$;

-- A batch holds several row locks at once, so any statement that waits for
-- several row locks must take them in the batches' order too, or the two
-- could deadlock: (tenant, scope, key) in byte order, as the server sorts
-- them. Statements with SKIP LOCKED never wait and need no order; this one
-- waits, so it now locks in order before it updates.
CREATE OR REPLACE FUNCTION idempotency_release_offers(p_subscriber uuid)
RETURNS bigint
LANGUAGE sql AS $$
    WITH offered AS (
        SELECT k.tenant, k.scope, k.idempotency_key FROM idempotency_keys k
         WHERE k.offered_to = p_subscriber
         ORDER BY k.tenant COLLATE "C", k.scope COLLATE "C", k.idempotency_key COLLATE "C"
           FOR UPDATE
    ), released AS (
        UPDATE idempotency_keys k SET offered_until = NULL, offered_to = NULL
          FROM offered o
         WHERE k.tenant = o.tenant AND k.scope = o.scope AND k.idempotency_key = o.idempotency_key
           AND k.offered_to = p_subscriber
        RETURNING 1
    )
    SELECT count(*) FROM released
$$;
