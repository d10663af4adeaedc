-- Foundation: the clock and the migration ledger.
BEGIN;
SELECT plan(7);

SELECT has_schema('orch8');
SELECT has_table('orch8', 'schema_migrations', 'the migration ledger exists');
SELECT has_function('orch8', 'now', '{}'::text[], 'orch8.now() exists');

SELECT is(orch8.now(), transaction_timestamp(), 'orch8.now() is the transaction time by default');

SELECT set_config('orch8.fake_now', '2030-01-02 03:04:05+00', true);
SELECT is(
    orch8.now(), '2030-01-02 03:04:05+00'::timestamptz, 'orch8.now() honours orch8.fake_now'
);

SELECT set_config('orch8.fake_now', '', true);
SELECT is(orch8.now(), transaction_timestamp(), 'an empty orch8.fake_now means real time');

SELECT cmp_ok(orch8.schema_version(), '>=', 1, 'schema_version() reports the applied version');

SELECT * FROM finish();
ROLLBACK;
