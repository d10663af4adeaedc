-- What a receipt records about its content: canonical JSON, the request and destination
-- hashes, the provider's receipt id, and the side-effect classification of handlers.
-- Expected hashes were computed independently in Python:
--   hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(',', ':'),
--                             ensure_ascii=False).encode('utf-8')).hexdigest()
-- (for the decimal vector, over the literal canonical text, since Python prints 1.5).
BEGIN;
SELECT plan(49);

-- 1. canonical_json -----------------------------------------------------------------------

SELECT is(
    orch8.canonical_json('{"b": 1, "a": 2, "B": 3, "é": 4, "z": 5, "ä": 6}'),
    '{"B":3,"a":2,"b":1,"z":5,"ä":6,"é":4}',
    'keys sorted by code point: B < a < b < z < ä < é'
);

SELECT is(
    orch8.canonical_json('{"😀": 1, "ｚ": 2, "~": 3}'),
    '{"~":3,"ｚ":2,"😀":1}',
    'keys outside the BMP sort by code point (U+FF5A before U+1F600), not by UTF-16 units'
);

SELECT is(
    orch8.canonical_json('{"ab": 1, "a": 2, "aa": 3}'),
    '{"a":2,"aa":3,"ab":1}',
    'a key sorts before the keys it is a prefix of'
);

SELECT is(
    orch8.canonical_json('{"z": {"y": [3, {"b": true, "a": null}], "x": {}}, "a": [[], {}]}'),
    '{"a":[[],{}],"z":{"x":{},"y":[3,{"a":null,"b":true}]}}',
    'nested objects are sorted at every level, arrays keep their order'
);

SELECT is(
    orch8.canonical_json('{ "a" : [ 1 , 2 ] ,  "b" : "x y" }'),
    '{"a":[1,2],"b":"x y"}',
    'no whitespace outside strings'
);

SELECT is(
    orch8.canonical_json('{"name": "Zoë ✓ 😀", "ключ": "значение"}'),
    '{"name":"Zoë ✓ 😀","ключ":"значение"}',
    'non-ASCII keys and values are not escaped'
);

SELECT is(
    orch8.canonical_json('"caf\u00e9 \/ \u2713"'),
    '"café / ✓"',
    'escaped non-ASCII input and an escaped solidus come out unescaped'
);

SELECT is(
    orch8.canonical_json('{"s": "q\"b\\n\nt\tc\u0001d\u001fe\b\f\r"}'),
    '{"s":"q\"b\\n\nt\tc\u0001d\u001fe\b\f\r"}',
    'quote, backslash, newline, tab, \b \f \r escaped; control characters as \u00XX'
);

SELECT is(
    orch8.canonical_json('{"a\"b": 1, "t\tk": 2}'),
    '{"a\"b":1,"t\tk":2}',
    'keys are JSON-escaped too'
);

SELECT is(
    orch8.canonical_json(
        '[1.50, 1e2, -0, 1.0E-3, 0.0, -0.0, 1E+2, 12345678901234567890, 1.0e-10, 0.1e1, -1.5e1]'
    ),
    '[1.50,100,0,0.0010,0.0,0.0,100,12345678901234567890,0.00000000010,1,-15]',
    'numbers as PostgreSQL prints jsonb numbers (1.50 stays, 1e2 -> 100, -0 -> 0, '
    || '1.0E-3 -> 0.0010)'
);

SELECT is(orch8.canonical_json('{}'), '{}', 'empty object');
SELECT is(orch8.canonical_json('[]'), '[]', 'empty array');
SELECT is(orch8.canonical_json('null'), 'null', 'JSON null');
SELECT is(orch8.canonical_json('true'), 'true', 'JSON true');
SELECT is(orch8.canonical_json('false'), 'false', 'JSON false');
SELECT is(orch8.canonical_json('"x"'), '"x"', 'a top-level string');
SELECT is(orch8.canonical_json('{"a": 1, "a": 2}'), '{"a":2}', 'a duplicated key keeps the last');
SELECT is(orch8.canonical_json(NULL), NULL, 'canonical_json(NULL) is NULL');

-- 2. Hashes -------------------------------------------------------------------------------

SELECT is(
    orch8.sha256_hex(''),
    'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
    'sha256_hex of the empty string'
);

SELECT is(
    orch8.sha256_hex('é'),
    '4a99557e4033c3539de2eb65472017cad5f9557f7a0625a09f1c3f6e2ba69c4c',
    'sha256_hex hashes the UTF-8 bytes'
);

SELECT is(
    orch8.request_sha256(
        'http_request',
        '{"url": "https://pay.example/charges", "method": "POST",
          "body": {"amount": 1200, "currency": "EUR", "note": "café"},
          "idempotency_key": "k-1"}'
    ),
    '20d3cc25d803b785c7e34c9a7e0d635ac722f0548e489f1ab55927dbcb7183f6',
    'request_sha256 vector: an http_request'
);

SELECT is(
    orch8.request_sha256(
        'http_request',
        '{"idempotency_key": "k-1",
          "body": {"note": "café", "currency": "EUR", "amount": 1200},
          "method": "POST", "url": "https://pay.example/charges"}'
    ),
    '20d3cc25d803b785c7e34c9a7e0d635ac722f0548e489f1ab55927dbcb7183f6',
    'request_sha256 does not depend on key order or whitespace'
);

SELECT is(
    orch8.request_sha256(
        'payments.charge',
        '{"é": "ü\n", "a\"b": "\\", "t": "\t\u0001", "n": [true, false, null], "B": {}}'
    ),
    'e91144f81802851672d7365829122bfacfe1aebb434fdca5a3896d7ae6b11d5c',
    'request_sha256 vector: unicode keys, escapes and literals'
);

SELECT is(
    orch8.request_sha256('x', '{"amount": 1.50}'),
    'c1997305aa3948e50dc305921dc2b829124728306e27a421695d36a6f2f774dc',
    'request_sha256 hashes decimals as PostgreSQL prints them ({"amount":1.50})'
);

SELECT is(
    orch8.request_sha256('http_request', '{}'),
    '9d3a1319e76150d77bdc8a6f1f7b2e3af1b63645141f91708343103706199207',
    'request_sha256 vector: empty params'
);

SELECT is(
    orch8.request_sha256('emit_event', NULL),
    '2abb4c85fbdf3850d78e3df0e6eda8ad437d318cf9257563cf98fe5be4a3c10a',
    'request_sha256 with SQL NULL params hashes {"handler":..,"params":null}'
);

SELECT is(
    orch8.request_sha256('emit_event', 'null'),
    orch8.request_sha256('emit_event', NULL),
    'JSON null params and SQL NULL params hash alike'
);

SELECT is(
    orch8.destination_fingerprint(
        'http_request',
        '{"url": "https://pay.example/charges", "method": "POST",
          "body": {"amount": 1200, "currency": "EUR", "note": "café"},
          "idempotency_key": "k-1"}'
    ),
    '8823cce3fc774a3bf746e10a74d58ca3a4a0348e2b273facbbe4ba6d72e942e5',
    'destination_fingerprint vector: only the url of an http_request'
);

SELECT is(
    orch8.destination_fingerprint(
        'http_request',
        '{"url": "https://pay.example/charges", "method": "PUT", "body": {"amount": 1}}'
    ),
    '8823cce3fc774a3bf746e10a74d58ca3a4a0348e2b273facbbe4ba6d72e942e5',
    'destination_fingerprint ignores params outside the destination keys'
);

SELECT is(
    orch8.destination_fingerprint(
        'llm_call',
        '{"model": "gpt-x", "provider": "acme", "prompt": "hi", "temperature": 0,
          "endpoint": "/v1", "queue": "q", "topic": "t", "resource": "r",
          "extra": {"url": "nested-ignored"}}'
    ),
    '7d26d5348636d3cb95beb27ab5a65166f2bc8db142ed9b9249e2f50f6adc8853',
    'destination_fingerprint vector: all seven keys, top level only'
);

SELECT is(
    orch8.destination_fingerprint('emit_event', '{}'),
    'd3efb615241abb7269ce8bc7cab0aa34568b9c94248737a8df803074bb380c03',
    'destination_fingerprint vector: no destination keys gives destination {}'
);

SELECT is(
    orch8.destination_fingerprint('emit_event', '[1, "x"]'),
    'd3efb615241abb7269ce8bc7cab0aa34568b9c94248737a8df803074bb380c03',
    'destination_fingerprint of array params uses destination {}'
);

SELECT is(
    orch8.destination_fingerprint('emit_event', '"https://x.example"'),
    'd3efb615241abb7269ce8bc7cab0aa34568b9c94248737a8df803074bb380c03',
    'destination_fingerprint of string params uses destination {}'
);

SELECT is(
    orch8.destination_fingerprint('emit_event', NULL),
    'd3efb615241abb7269ce8bc7cab0aa34568b9c94248737a8df803074bb380c03',
    'destination_fingerprint of NULL params uses destination {}'
);

-- 3. provider_receipt_id ------------------------------------------------------------------

SELECT is(
    orch8.provider_receipt_id(
        '{"provider_receipt_id": "p-1", "receipt_id": "r-1", "request_id": "q-1"}'
    ),
    'p-1',
    'provider_receipt_id comes first'
);

SELECT is(
    orch8.provider_receipt_id('{"request_id": "q-1", "receipt_id": "r-1"}'),
    'r-1',
    'then receipt_id'
);

SELECT is(
    orch8.provider_receipt_id('{"request_id": "q-1", "other": "o"}'),
    'q-1',
    'then request_id'
);

SELECT is(
    orch8.provider_receipt_id('{"provider_receipt_id": 123, "receipt_id": "r-1"}'),
    'r-1',
    'a non-string provider_receipt_id is skipped'
);

SELECT is(
    orch8.provider_receipt_id(
        '{"provider_receipt_id": null, "receipt_id": {"id": "x"}, "request_id": "q-1"}'
    ),
    'q-1',
    'null and object values are skipped'
);

SELECT is(
    orch8.provider_receipt_id(
        jsonb_build_object('provider_receipt_id', repeat('x', 257), 'receipt_id', 'r-1')
    ),
    NULL,
    'a 257-byte provider_receipt_id gives NULL, without falling through to receipt_id'
);

SELECT is(
    orch8.provider_receipt_id(jsonb_build_object('provider_receipt_id', repeat('x', 256))),
    repeat('x', 256),
    'a 256-byte id is kept'
);

SELECT is(
    orch8.provider_receipt_id(jsonb_build_object('receipt_id', repeat('é', 129))),
    NULL,
    'the limit is in bytes: 129 x é (258 bytes) gives NULL'
);

SELECT is(
    orch8.provider_receipt_id('{"other": "x"}'),
    NULL,
    'none of the keys present gives NULL'
);

SELECT is(
    orch8.provider_receipt_id('["provider_receipt_id", "p-1"]'),
    NULL,
    'an array output gives NULL'
);

SELECT is(orch8.provider_receipt_id('"p-1"'), NULL, 'a string output gives NULL');
SELECT is(orch8.provider_receipt_id(NULL), NULL, 'a NULL output gives NULL');

-- 4. Handler classification ---------------------------------------------------------------

SELECT results_eq(
    $$SELECT h.name, orch8.handler_has_side_effects(h.name), orch8.effect_kind(h.name)
      FROM (VALUES
          (1, 'http_request'), (2, 'llm_call'), (3, 'agent'), (4, 'embed'),
          (5, 'emit_event'), (6, 'send_signal'), (7, 'memory_store'), (8, 'memory_delete'),
          (9, 'blob_put'), (10, 'tool_call'), (11, 'mcp_call'), (12, 'self_modify'),
          (13, 'payments.charge'), (14, 'worker'), (15, 'my_handler')
      ) AS h (pos, name)
      ORDER BY h.pos$$,
    $$VALUES
        ('http_request', true, 'http'),
        ('llm_call', true, 'model'),
        ('agent', true, 'model'),
        ('embed', true, 'model'),
        ('emit_event', true, 'message'),
        ('send_signal', true, 'message'),
        ('memory_store', true, 'storage'),
        ('memory_delete', true, 'storage'),
        ('blob_put', true, 'storage'),
        ('tool_call', true, 'custom'),
        ('mcp_call', true, 'custom'),
        ('self_modify', true, 'custom'),
        ('payments.charge', true, 'worker'),
        ('worker', true, 'worker'),
        ('my_handler', true, 'worker')$$,
    'side-effecting builtins have their kind; any other name is side-effecting, kind worker'
);

SELECT results_eq(
    $$SELECT h.name, orch8.handler_has_side_effects(h.name), orch8.effect_kind(h.name)
      FROM (VALUES
          (1, 'noop'), (2, 'log'), (3, 'sleep'), (4, 'fail'), (5, 'assert'),
          (6, 'transform'), (7, 'set_state'), (8, 'get_state'), (9, 'delete_state'),
          (10, 'merge_state'), (11, 'human_review'), (12, 'query_instance'),
          (13, 'memory_search'), (14, 'blob_get'), (15, 'wait_for_event')
      ) AS h (pos, name)
      ORDER BY h.pos$$,
    $$VALUES
        ('noop', false, NULL::text),
        ('log', false, NULL),
        ('sleep', false, NULL),
        ('fail', false, NULL),
        ('assert', false, NULL),
        ('transform', false, NULL),
        ('set_state', false, NULL),
        ('get_state', false, NULL),
        ('delete_state', false, NULL),
        ('merge_state', false, NULL),
        ('human_review', false, NULL),
        ('query_instance', false, NULL),
        ('memory_search', false, NULL),
        ('blob_get', false, NULL),
        ('wait_for_event', false, NULL)$$,
    'pure builtins have no side effects and no kind'
);

SELECT set_eq(
    'SELECT name FROM orch8.builtin_handlers',
    $$VALUES
        ('http_request'), ('llm_call'), ('agent'), ('embed'), ('emit_event'),
        ('send_signal'), ('memory_store'), ('memory_delete'), ('blob_put'), ('tool_call'),
        ('mcp_call'), ('self_modify'), ('noop'), ('log'), ('sleep'), ('fail'), ('assert'),
        ('transform'), ('set_state'), ('get_state'), ('delete_state'), ('merge_state'),
        ('human_review'), ('query_instance'), ('memory_search'), ('blob_get'),
        ('wait_for_event')$$,
    'builtin_handlers holds exactly the 27 builtins checked above'
);

SELECT * FROM finish();
ROLLBACK;
