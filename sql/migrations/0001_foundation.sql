-- Foundation: the clock every other object reads.
-- The schema itself and orch8.schema_migrations are created by the migrator
-- (orch8_py/migrate.py) before any migration runs, under its advisory lock.

CREATE OR REPLACE FUNCTION orch8.now()
RETURNS timestamptz
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT coalesce(
        nullif(current_setting('orch8.fake_now', true), '')::timestamptz,
        transaction_timestamp()
    )
$$;

COMMENT ON FUNCTION orch8.now() IS
'The engine clock: the transaction time, or the value of the setting orch8.fake_now '
'when it is set (SET orch8.fake_now = ''2030-01-01 00:00:00+00''). Every lease, '
'backoff, timer and receipt timestamp reads this, never bare now().';
