-- An instance's sla (sql/functions/waits.sql, fire_slas and breach_sla): the validator's
-- rules; sla_at from when the instance is due; past it, the claim's sweep fails the
-- instance with code sla (its open blocks withdrawn, on_failure run with error.code sla),
-- lets a step in flight finish first, and enqueues instance.sla_breached; with
-- on_sla_breach notify only the webhook. Time starts at 2031-03-01 12:00.
BEGIN;
SELECT plan(17);
SELECT set_config('orch8.fake_now', '2031-03-01 12:00:00+00', true);
SELECT set_config('tap.tenant', 'sla', true);

-- 1. The validator ------------------------------------------------------------------------

SELECT set_eq(
    $$SELECT path, message FROM orch8.validate_sequence('{"sla": "soon",
        "on_sla_breach": "page", "blocks": [{"type": "step", "id": "a", "handler": "noop"}]}')
      UNION ALL
      SELECT path, message FROM orch8.validate_sequence('{"on_sla_breach": "notify",
        "blocks": [{"type": "step", "id": "a", "handler": "noop"}]}')$$,
    $$VALUES
        ('$.sla', 'sla must be a duration: milliseconds (an integer >= 0) or a string such as 30s, 15m, 2h, 3d, 1h30m; at most 366 days'),
        ('$.on_sla_breach', 'on_sla_breach must be fail or notify'),
        ('$.on_sla_breach', 'on_sla_breach needs an sla')$$,
    'the validator: sla is a duration, on_sla_breach fail or notify and only with an sla'
);

SELECT lives_ok(
    $$SELECT orch8.create_webhook_subscription('sla', 'https://hooks.example/sla', 's',
                                               ARRAY['instance.sla_breached'])$$,
    'a subscription may ask for instance.sla_breached'
);

-- 2. fail: the open blocks are withdrawn, on_failure sees code sla ---------------------------

SELECT tap.seq('slow', $${"sla": "1h", "blocks": [
    {"type": "step", "id": "wait", "handler": "noop", "delay": "2h"},
    {"type": "step", "id": "after", "handler": "noop"}],
  "on_failure": [{"type": "step", "id": "page", "handler": "noop"}]}$$);
SELECT tap.new('s1', 'slow');
SELECT is(
    (
        SELECT t.sla_at FROM orch8.task_instances AS t
        WHERE t.id = tap.id('s1')
    ),
    '2031-03-01 13:00:00+00'::timestamptz, 'sla_at: when it is due plus the sla'
);
SELECT is_empty($$SELECT * FROM tap.claim()$$, 'nothing is due before the sla');
SELECT set_config('orch8.fake_now', '2031-03-01 13:00:00+00', true);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('s1:.on_failure[0]/page')$$,
    'at the sla the claim''s sweep fails the root, and on_failure runs'
);
SELECT is((tap.node('s1', 'wait')).state::text, 'cancelled', 'the delayed step is withdrawn');
SELECT is(
    orch8.node_error('sla', tap.id('s1'), ''),
    jsonb_build_object('message', 'the instance missed its sla of 1h', 'code', 'sla', 'path', ''),
    'on_failure''s error: the message and code sla'
);
SELECT is(
    (
        SELECT t.sla_breached_at FROM orch8.task_instances AS t
        WHERE t.id = tap.id('s1')
    ),
    '2031-03-01 13:00:00+00'::timestamptz, 'the breach is recorded'
);
SELECT results_eq(
    $$SELECT o.event, o.payload ->> 'reason', o.payload ->> 'sla_at' FROM orch8.webhook_outbox AS o
      WHERE o.instance_id = tap.id('s1')$$,
    $$VALUES ('instance.sla_breached', 'the instance missed its sla of 1h',
              '2031-03-01T13:00:00.000000Z')$$,
    'the subscription gets instance.sla_breached'
);
SELECT is(
    (SELECT f.state FROM tap.finish('s1', '.on_failure[0]/page', 'ok', '{}') AS f), 'failed',
    'after on_failure the instance ends failed'
);
SELECT is(
    (
        SELECT t.error FROM orch8.task_instances AS t
        WHERE t.id = tap.id('s1')
    ),
    'the instance missed its sla of 1h', 'with the sla as its error'
);

-- 3. A step in flight finishes first -----------------------------------------------------------

SELECT tap.seq('busy', $${"sla": "30m", "blocks": [
    {"type": "step", "id": "pay", "handler": "x.pay"},
    {"type": "step", "id": "mail", "handler": "noop"}]}$$);
SELECT tap.new('b1', 'busy');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('b1:pay')$$, 'pay is claimed');
SELECT is(tap.begin('b1', 'pay', 'x.pay'), 'dispatched', 'and dispatched');
SELECT set_config('orch8.fake_now', '2031-03-01 13:31:00+00', true);
SELECT is_empty($$SELECT * FROM tap.claim()$$, 'the sla passes while pay is in flight');
SELECT is(
    (SELECT f.state FROM tap.finish('b1', 'pay', 'ok', '{"paid": true}') AS f), 'failed',
    'pay''s outcome is recorded, then the instance fails: mail never starts'
);
SELECT is((tap.receipt('b1', 'pay')).state::text, 'committed', 'pay''s receipt is committed');

-- 4. notify: the webhook only ------------------------------------------------------------------

SELECT tap.seq('gentle', $${"sla": "10m", "on_sla_breach": "notify", "blocks": [
    {"type": "step", "id": "late", "handler": "noop", "delay": "1h"}]}$$);
SELECT tap.new('g1', 'gentle');
SELECT set_config('orch8.fake_now', '2031-03-01 14:31:00+00', true);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('g1:late')$$,
    'notify: past its sla the instance goes on'
);

SELECT * FROM finish();
ROLLBACK;
