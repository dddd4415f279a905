-- Brings a database migrated by the pre-release chain of numbered migrations
-- (0001_schema .. 0009_single_key, replaced by 0001_baseline before the first
-- release; a frozen copy is in tests/fixtures/legacy-chain/) to the baseline
-- schema, from any prefix of that chain the runner recognises (0001..0003 at
-- least: each of them created part of the schema, and 0003 the indexes).
-- Every statement is a no-op where its change is already made, so the whole
-- chain, which equals the baseline, is left as it is. The runner then
-- re-applies every function file.
--
-- 0008 dropped the two CHECK constraints, 0009 made the fencing sequence
-- the column's default; 0004 .. 0007 created functions only.

ALTER TABLE idempotency_keys
    DROP CONSTRAINT IF EXISTS idempotency_keys_status_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_lease_outcome_check,
    ALTER COLUMN fencing_token SET DEFAULT nextval('idempotency_fencing');
