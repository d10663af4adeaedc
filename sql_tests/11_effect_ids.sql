-- Deterministic ids: receipt ids from an effect's position, and the scope ids of an instance.
-- Every expected UUID below was computed independently with Python's hashlib:
--   d = sha256(b'orch8-effect-v1' + b'\x00' + continuity.bytes + epoch.to_bytes(8, 'big')
--              + instance.bytes + block.encode('utf-8') + attempt.to_bytes(4, 'big'))
--   b = bytearray(d[:16]); b[6] = (b[6] & 0x0f) | 0x80; b[8] = (b[8] & 0x3f) | 0x80
--   uuid.UUID(bytes=bytes(b))
-- and for scope ids: instance.bytes[:6] + sha256(prefix.encode() + b'\x00' +
-- instance.bytes)[6:], same fix-up (tests/effect_rules.py).
BEGIN;
SELECT plan(35);
-- the instances the vectors name (a receipt needs a real instance)
SELECT
    tap.instances(
        't1',
        ARRAY[
            '00000000-0000-0000-0000-0000000000a1', '00000000-0000-0000-0000-0000000000a2'
        ]::uuid[]
    );
SELECT tap.instances('t2', ARRAY['00000000-0000-0000-0000-0000000000a1']::uuid[]);

-- uuid_from_digest: version 8 and the RFC 4122 variant are forced

SELECT is(
    orch8.uuid_from_digest(decode(repeat('ff', 32), 'hex')),
    'ffffffff-ffff-8fff-bfff-ffffffffffff'::uuid,
    'uuid_from_digest of all-ones: byte 6 -> 0x8f, byte 8 -> 0xbf'
);

SELECT is(
    orch8.uuid_from_digest(decode(repeat('00', 32), 'hex')),
    '00000000-0000-8000-8000-000000000000'::uuid,
    'uuid_from_digest of all-zeros: byte 6 -> 0x80, byte 8 -> 0x80'
);

-- deterministic_effect_id vectors

SELECT is(
    orch8.deterministic_effect_id(
        '00000000-0000-0000-0000-0000000000c1', 0,
        '00000000-0000-0000-0000-0000000000a1', 'charge', 0
    ),
    '826498ec-87fb-8e62-95cb-77ad101c9496'::uuid,
    'effect id vector: epoch 0, ASCII block, attempt 0'
);

SELECT is(
    orch8.deterministic_effect_id(
        '00000000-0000-0000-0000-0000000000c1', 0,
        '00000000-0000-0000-0000-0000000000a1', 'charge', 1
    ),
    '7564df4e-ea86-8811-89c4-883adfdcf40b'::uuid,
    'effect id vector: the next attempt of the same block gets another id'
);

SELECT is(
    orch8.deterministic_effect_id(
        '6f1c2b3a-4d5e-4f60-8172-83a4b5c6d7e8', 7,
        '00000000-0000-0000-0000-0000000000a2', 'paiement-é', 3
    ),
    'da52aa79-9344-8044-a35f-5c6e8681b44f'::uuid,
    'effect id vector: non-ASCII block id paiement-é hashed as UTF-8'
);

SELECT is(
    orch8.deterministic_effect_id(
        '00000000-0000-0000-0000-0000000000c2', 4294967301,
        '00000000-0000-0000-0000-0000000000a3', 'step_1', 0
    ),
    '0a4c2136-79b0-8edd-a03a-fe3aac2b0909'::uuid,
    'effect id vector: epoch 2^32 + 5 uses all 8 big-endian bytes'
);

SELECT is(
    orch8.deterministic_effect_id(
        '00000000-0000-0000-0000-0000000000c3', 9223372036854775807,
        '00000000-0000-0000-0000-0000000000a4', 'b', 2147483647
    ),
    '3c8efec7-a6cc-86c7-b5fb-7982b73bad1a'::uuid,
    'effect id vector: maximal epoch and attempt (2^31 - 1)'
);

SELECT is(
    orch8.deterministic_effect_id(
        'ffffffff-ffff-ffff-ffff-ffffffffffff', 1,
        '00000000-0000-0000-0000-000000000000', '支払い', 123456
    ),
    '3b34ba3f-bf6c-8900-87da-2df52e5708ed'::uuid,
    'effect id vector: CJK block id and a large attempt'
);

SELECT is(
    orch8.deterministic_effect_id(
        '00000000-0000-0000-0000-0000000000c1', 0,
        '00000000-0000-0000-0000-0000000000a1', 'charge', 0
    ),
    orch8.deterministic_effect_id(
        '00000000-0000-0000-0000-0000000000c1', 0,
        '00000000-0000-0000-0000-0000000000a1', 'charge', 0
    ),
    'the same position always gives the same id'
);

SELECT throws_ok(
    $$SELECT orch8.deterministic_effect_id(
          '00000000-0000-0000-0000-0000000000c1', -1,
          '00000000-0000-0000-0000-0000000000a1', 'charge', 0)$$,
    'O8008', NULL,
    'a negative epoch is refused (O8008)'
);

SELECT throws_ok(
    $$SELECT orch8.deterministic_effect_id(
          '00000000-0000-0000-0000-0000000000c1', 0,
          '00000000-0000-0000-0000-0000000000a1', 'charge', -1)$$,
    'O8008', NULL,
    'a negative attempt is refused (O8008)'
);

-- effect_receipt_id: the scope's version picks the derivation

SELECT is(
    orch8.effect_receipt_id(
        1, '0193a4b5-c6d7-8e8f-9a0b-aaaaaaaaaaaa', 0,
        '0193a4b5-c6d7-7e8f-9a0b-1c2d3e4f5a6b', 'charge', 0
    ),
    '74375b44-bd31-822e-a2bc-c379d8f60540'::uuid,
    'effect_receipt_id version 1 is deterministic_effect_id'
);

SELECT is(
    orch8.effect_receipt_id(
        2, '0193a4b5-c6d7-8e8f-9a0b-aaaaaaaaaaaa', 0,
        '0193a4b5-c6d7-7e8f-9a0b-1c2d3e4f5a6b', 'charge', 0
    ),
    '0193a4b5-c6d7-822e-a2bc-c379d8f60540'::uuid,
    'effect_receipt_id version 2: version 1''s id led by the instance id''s first 6 bytes'
);

SELECT is(
    orch8.effect_receipt_id(
        2, '0193a4b5-c6d7-8e8f-9a0b-aaaaaaaaaaaa', 0,
        '0193a4b5-c6d7-7e8f-9a0b-1c2d3e4f5a6b', 'charge', 1
    ),
    '0193a4b5-c6d7-8e7d-be30-3cbefe476b6f'::uuid,
    'effect_receipt_id version 2: the next attempt keeps the prefix, the rest changes'
);

SELECT throws_ok(
    $$SELECT orch8.effect_receipt_id(
          3, '00000000-0000-0000-0000-0000000000c1', 0,
          '00000000-0000-0000-0000-0000000000a1', 'charge', 0)$$,
    'O8008', NULL,
    'an effect id version other than 1 or 2 is refused (O8008)'
);

SELECT throws_ok(
    $$SELECT orch8.effect_receipt_id(
          2, '00000000-0000-0000-0000-0000000000c1', 0,
          '00000000-0000-0000-0000-0000000000a1', 'charge', -1)$$,
    'O8008', NULL,
    'version 2 refuses a negative attempt as version 1 does (O8008)'
);

-- effect_scope_id vectors

SELECT is(
    orch8.effect_scope_id('orch8-effect-scope-v1', '00000000-0000-0000-0000-0000000000a1'),
    '00000000-0000-8ff6-aee8-afd472664eaf'::uuid,
    'continuity id vector for instance a1'
);

SELECT is(
    orch8.effect_scope_id('orch8-effect-scope-v1', '00000000-0000-0000-0000-0000000000a2'),
    '00000000-0000-886a-9ed2-1e101f2f3965'::uuid,
    'continuity id vector for instance a2'
);

SELECT is(
    orch8.effect_scope_id('orch8-effect-runtime-v1', '00000000-0000-0000-0000-0000000000a1'),
    '00000000-0000-8428-8783-d4e389bceaed'::uuid,
    'owner runtime id vector for instance a1'
);

SELECT is(
    orch8.effect_scope_id('orch8-effect-runtime-v1', '00000000-0000-0000-0000-0000000000a2'),
    '00000000-0000-8ea0-a71e-5d05a716f2e6'::uuid,
    'owner runtime id vector for instance a2'
);

-- ensure_effect_scope

SELECT results_eq(
    $$SELECT tenant_id, continuity_id, epoch, owner_runtime_id, current_instance_id, state
      FROM orch8.ensure_effect_scope('t1', '00000000-0000-0000-0000-0000000000a1')$$,
    $$VALUES ('t1', '00000000-0000-8ff6-aee8-afd472664eaf'::uuid, 0::bigint,
              '00000000-0000-8428-8783-d4e389bceaed'::uuid,
              '00000000-0000-0000-0000-0000000000a1'::uuid, 'owned')$$,
    'ensure_effect_scope creates the scope with the derived ids, epoch 0, owned'
);

SELECT results_eq(
    $$SELECT continuity_id, owner_runtime_id, epoch
      FROM orch8.ensure_effect_scope('t1', '00000000-0000-0000-0000-0000000000a1')$$,
    $$VALUES ('00000000-0000-8ff6-aee8-afd472664eaf'::uuid,
              '00000000-0000-8428-8783-d4e389bceaed'::uuid, 0::bigint)$$,
    'a second ensure_effect_scope returns the same scope'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.continuity_executions
        WHERE tenant_id = 't1' AND current_instance_id = '00000000-0000-0000-0000-0000000000a1'
    ),
    1,
    'calling ensure_effect_scope twice leaves one row'
);

SELECT is(
    (orch8.ensure_effect_scope('t1', '00000000-0000-0000-0000-0000000000a2')).continuity_id,
    '00000000-0000-886a-9ed2-1e101f2f3965'::uuid,
    'another instance gets its own derived continuity id'
);

SELECT is(
    (orch8.ensure_effect_scope('t2', '00000000-0000-0000-0000-0000000000a1')).tenant_id,
    't2',
    'the same instance id under another tenant gets its own scope row'
);

SELECT is(
    (SELECT count(*)::integer FROM orch8.continuity_executions),
    3,
    'three scopes in all: (t1, a1), (t1, a2), (t2, a1)'
);

SELECT throws_ok(
    $$SELECT orch8.ensure_effect_scope('', '00000000-0000-0000-0000-0000000000a1')$$,
    'O8008', NULL,
    'ensure_effect_scope refuses an empty tenant (O8008)'
);

SELECT throws_ok(
    $$SELECT orch8.ensure_effect_scope(NULL, '00000000-0000-0000-0000-0000000000a1')$$,
    'O8008', NULL,
    'ensure_effect_scope refuses a NULL tenant (O8008)'
);

SELECT throws_ok(
    $$SELECT orch8.ensure_effect_scope('t1', NULL)$$,
    'O8008', NULL,
    'ensure_effect_scope refuses a NULL instance (O8008)'
);

-- a time-ordered instance id leads its scope ids with its time
SELECT is(
    orch8.effect_scope_id('orch8-effect-scope-v1', '0193a4b5-c6d7-7e8f-9a0b-1c2d3e4f5a6b'),
    '0193a4b5-c6d7-8966-ad5d-25f0c6fa2b93'::uuid,
    'continuity id vector for a time-ordered instance id: its first six bytes lead'
);

SELECT is(
    orch8.effect_scope_id('orch8-effect-runtime-v1', '0193a4b5-c6d7-7e8f-9a0b-1c2d3e4f5a6b'),
    '0193a4b5-c6d7-85c4-b064-9a7fbf829d29'::uuid,
    'owner runtime id vector for a time-ordered instance id'
);

-- time_ordered_uuid: version 7, the RFC variant, orch8.now()'s milliseconds first
SELECT set_config('orch8.fake_now', '2030-01-02 03:04:05.678+00', true);

SELECT is(
    substring(orch8.time_ordered_uuid()::text FROM 1 FOR 13),
    (
        SELECT
            substring(lpad(to_hex(1893553445678::bigint), 12, '0') FROM 1 FOR 8) || '-'
            || substring(lpad(to_hex(1893553445678::bigint), 12, '0') FROM 9 FOR 4)
    ),
    'time_ordered_uuid begins with the Unix milliseconds of orch8.now()'
);

SELECT ok(
    (SELECT
        bool_and(
            substring(u::text FROM 15 FOR 1) = '7'
            AND substring(u::text FROM 20 FOR 1) IN ('8', '9', 'a', 'b')
        )
    FROM (SELECT orch8.time_ordered_uuid() AS u FROM generate_series(1, 200)) AS g),
    'time_ordered_uuid is version 7 with the RFC variant'
);

SELECT is(
    (SELECT count(DISTINCT orch8.time_ordered_uuid()) FROM generate_series(1, 1000)),
    1000::bigint,
    'time_ordered_uuid: 1,000 ids in one millisecond are all different (74 random bits)'
);

SELECT set_config('orch8.fake_now', '2030-01-02 03:04:05.679+00', true);

SELECT ok(
    orch8.time_ordered_uuid() > '01b8e094-9b2e-7fff-bfff-ffffffffffff'::uuid,
    'an id of a later millisecond sorts after every id of an earlier one'
);

SELECT set_config('orch8.fake_now', '', true);

SELECT * FROM finish();
ROLLBACK;
