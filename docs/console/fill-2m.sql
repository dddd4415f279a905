INSERT INTO idempotency_keys (tenant, scope, idempotency_key, status, fingerprint, attempt_count,
    max_attempts, retention, lease_token, lease_request_id, lease_expires_at, lease_outcome,
    fencing_token, next_retry_at, result, created_at, updated_at, expires_at)
SELECT CASE WHEN i % 10 = 0 THEN 'acme' ELSE 'default' END,
       'scope.' || (i % 20),
       'order-' || lpad(i::text, 9, '0'),
       CASE WHEN (i / 20) % 100 = 1 THEN 'PROCESSING' WHEN (i / 20) % 100 = 2 THEN 'FAILED'
            WHEN (i / 20) % 200 = 3 THEN 'FAILED_PERMANENT' ELSE 'SUCCEEDED' END,
       '', 1, 10, interval '1 day', gen_random_uuid(), '',
       CASE WHEN (i / 20) % 100 = 1 THEN now() + (i % 7 - 3) * interval '1 minute' END,
       CASE WHEN (i / 20) % 100 = 1 THEN NULL ELSE 'SUCCESS' END,
       nextval('idempotency_fencing'),
       CASE WHEN (i / 20) % 100 = 2 THEN now() + (i % 7 - 3) * interval '1 minute' END,
       CASE WHEN (i / 20) % 100 > 3 THEN '{"ok":true}'::bytea END,
       now(), now(), now() + interval '1 day'
  FROM generate_series(1, 2000000) i;
VACUUM ANALYZE idempotency_keys;
