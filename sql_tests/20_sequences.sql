-- Sequence definitions: validate_sequence lists every problem with its path;
-- create_sequence stores clean definitions as versions and declares their invariants.
BEGIN;
SELECT plan(38);

CREATE TEMP TABLE defs (name text PRIMARY KEY, body jsonb NOT NULL) ON COMMIT DROP;

-- The DETAIL of the error a statement raises (NULL when it raises nothing).
CREATE FUNCTION pg_temp.error_detail(p_sql text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_detail text;
BEGIN
    EXECUTE p_sql;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
    RETURN v_detail;
END
$$;

-- The definition named p_name.
CREATE FUNCTION pg_temp.def(p_name text)
RETURNS jsonb
LANGUAGE sql
STABLE
AS $$
    SELECT d.body FROM defs AS d WHERE d.name = p_name
$$;

-- A definition whose only block holds loops nested p_levels deep.
CREATE FUNCTION pg_temp.nested_loops(p_levels integer)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_block jsonb := '{"id": "leaf", "type": "step", "handler": "noop"}';
BEGIN
    FOR v_i IN 1 .. p_levels - 1 LOOP
        v_block := jsonb_build_object(
            'id', 'loop' || v_i, 'type', 'loop', 'condition', 'true',
            'body', jsonb_build_array(v_block));
    END LOOP;
    RETURN jsonb_build_object('blocks', jsonb_build_array(v_block));
END
$$;

-- A definition of p_count steps.
CREATE FUNCTION pg_temp.many_steps(p_count integer)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT jsonb_build_object('blocks', jsonb_agg(
        jsonb_build_object('id', 's' || i, 'type', 'step', 'handler', 'noop')
    ))
    FROM generate_series(1, p_count) AS i
$$;

INSERT INTO defs VALUES
(
    'good',
    $${"name": "ignored", "version": 7,
       "blocks": [{"id": "charge", "type": "step", "handler": "http_request",
                   "params": {"url": "https://pay.example/{{ data.order_id }}",
                              "currency": "{{ config.currency | 'EUR' }}"},
                   "timeout": 30000,
                   "retry": {"max_attempts": 3, "initial_backoff": 1000,
                             "max_backoff": 60000, "backoff_multiplier": 2.0,
                             "non_retryable_codes": ["card_declined"]}}]}$$
),
(
    'bad',
    $${"blocks": [
         {"id": "fetch", "type": "step", "handler": "http_request",
          "params": {"url": "https://api.example/{{ nope.x }}",
                     "headers": {"x-id": "{{ data.x"}},
          "retry": {"max_attempts": 0}},
         {"id": "fetch", "type": "step", "handler": "log"},
         {"id": "jump", "type": "teleport"},
         {"id": "notify", "type": "step", "params": {}}],
       "invariants": [
         {"name": "charge once", "type": "effect_at_most_once", "kind": "telepathy"},
         {"name": "no unknowns", "type": "no_unknown_effects"}]}$$
),
(
    'guarded',
    $${"blocks": [{"id": "charge", "type": "step", "handler": "http_request"}],
       "invariants": [{"name": "charge once", "type": "effect_at_most_once",
                       "kind": "http", "commit_guard": true}]}$$
),
(
    'nested',
    $${"blocks": [
         {"id": "fan", "type": "parallel", "branches": [
            [{"id": "a", "type": "step", "handler": "noop"}],
            [{"id": "guard", "type": "try_catch",
              "try_block": [{"id": "inner", "type": "step"}],
              "catch_block": [{"id": "a", "type": "step", "handler": "noop"}]}]]},
         {"id": "pick", "type": "router",
          "routes": [{"condition": "plan == 'pro'",
                      "blocks": [{"id": "again", "type": "loop", "condition": "true",
                                  "body": [{"id": "fan", "type": "step", "handler": "noop"}]}]}],
          "default": [{"id": "each", "type": "for_each", "collection": "items",
                       "body": [{"id": "deep", "type": "step", "handler": "noop",
                                 "retry": {"max_attempts": 101}}]}]},
         {"id": "book", "type": "saga", "steps": [
            {"id": "s1",
             "action": {"id": "reserve", "type": "step", "handler": "hotel.reserve"},
             "compensation": {"id": "reserve", "type": "step", "handler": "hotel.cancel"}}]},
         {"id": "first", "type": "race", "branches": [
            [{"id": "r1", "type": "step", "handler": "noop",
              "params": {"q": ["{{ input.x }}"]}}]]},
         {"id": "child", "type": "sub_sequence", "sequence_name": "child-flow"}]}$$
),
(
    'nested_ok',
    $${"blocks": [
         {"id": "fan", "type": "parallel", "branches": [
            [{"id": "a", "type": "step", "handler": "noop"}],
            [{"id": "guard", "type": "try_catch",
              "try_block": [{"id": "inner", "type": "step", "handler": "noop"}],
              "catch_block": [{"id": "b", "type": "step", "handler": "noop"}],
              "finally_block": []}]]},
         {"id": "pick", "type": "router",
          "routes": [{"condition": "plan == 'pro'",
                      "blocks": [{"id": "again", "type": "loop", "condition": "true",
                                  "max_iterations": 10,
                                  "body": [{"id": "c", "type": "step", "handler": "noop"}]}]}],
          "default": [{"id": "each", "type": "for_each", "collection": "items",
                       "item_var": "item",
                       "body": [{"id": "deep", "type": "step", "handler": "noop"}]}]},
         {"id": "book", "type": "saga", "steps": [
            {"id": "s1",
             "action": {"id": "reserve", "type": "step", "handler": "hotel.reserve"},
             "compensation": {"id": "cancel", "type": "step", "handler": "hotel.cancel"}}]},
         {"id": "first", "type": "race", "semantics": "first_to_succeed", "branches": [
            [{"id": "r1", "type": "step", "handler": "noop"}]]},
         {"id": "child", "type": "sub_sequence", "sequence_name": "child-flow",
          "version": 2, "input": {}}],
       "on_failure": [{"id": "a", "type": "step", "handler": "cleanup"}],
       "on_cancel": [{"id": "a", "type": "step", "handler": "cleanup"}]}$$
);

-- 1. The functions exist ------------------------------------------------------------------

SELECT has_function('orch8', 'validate_sequence', ARRAY['jsonb']);
SELECT has_function('orch8', 'create_sequence', ARRAY['text', 'text', 'text', 'jsonb']);
SELECT has_function('orch8', 'get_sequence', ARRAY['text', 'text', 'text', 'integer']);

-- 2. A valid definition: validated clean, stored as version 1 then 2 ----------------------

SELECT is_empty(
    $$SELECT * FROM orch8.validate_sequence(pg_temp.def('good'))$$,
    'a valid one-step definition has no problems'
);

SELECT is(s.version, 1, 'the first create_sequence of a name stores version 1')
FROM orch8.create_sequence(
    'acme', 'default', 'checkout', pg_temp.def('good')
) AS s;

SELECT is(s.version, 2, 'the next create_sequence of the same name stores version 2')
FROM orch8.create_sequence(
    'acme', 'default', 'checkout', pg_temp.def('good')
) AS s;

SELECT is(s.version, 1, 'versions count per namespace')
FROM orch8.create_sequence(
    'acme', 'billing', 'checkout', pg_temp.def('good')
) AS s;

SELECT is(s.version, 1, 'versions count per tenant')
FROM orch8.create_sequence(
    'globex', 'default', 'checkout', pg_temp.def('good')
) AS s;

SELECT is(
    (orch8.get_sequence('acme', 'default', 'checkout')).version, 2,
    'get_sequence without a version returns the latest'
);

SELECT is(
    (orch8.get_sequence('acme', 'default', 'checkout', 1)).version, 1,
    'get_sequence with a version returns that version'
);

SELECT ok(
    (orch8.get_sequence('acme', 'default', 'nothing')).id IS NULL,
    'get_sequence of a missing name returns a row of NULLs'
);

SELECT ok(
    (orch8.get_sequence('acme', 'default', 'checkout', 3)).id IS NULL,
    'get_sequence of a missing version returns a row of NULLs'
);

SELECT is(
    (orch8.get_sequence('acme', 'default', 'checkout', 1)).definition,
    pg_temp.def('good') - ARRAY['name', 'version'],
    'the stored definition drops the document''s own name and version'
);

-- 3. An invalid definition: every problem, nothing stored ---------------------------------

SELECT bag_eq(
    $$SELECT v.path
      FROM orch8.validate_sequence(pg_temp.def('bad')) AS v$$,
    ARRAY[
        '$.blocks[0].params.url',
        '$.blocks[0].params.headers["x-id"]',
        '$.blocks[0].retry.max_attempts',
        '$.blocks[1].id',
        '$.blocks[2].type',
        '$.blocks[3].handler',
        '$.invariants[0].kind'
    ],
    'validate_sequence lists every problem of the invalid definition, each with its path'
);

SELECT is(
    (
        SELECT count(*)::integer
        FROM orch8.validate_sequence(pg_temp.def('bad')) AS v
        INNER JOIN (
            VALUES
            ('$.blocks[0].params.url', 'template "{{ nope.x }}" has an unknown root "nope"%'),
            ('$.blocks[0].params.headers["x-id"]', 'unclosed template%'),
            ('$.blocks[0].retry.max_attempts', 'max_attempts must be an integer from 1 to 100'),
            ('$.blocks[1].id', 'duplicate block id "fetch" (first used at $.blocks[0])'),
            ('$.blocks[2].type', 'unknown block type "teleport"%'),
            ('$.blocks[3].handler', 'handler is required%'),
            ('$.invariants[0].kind', 'unknown effect kind "telepathy"%')
        ) AS e (path, pattern) ON v.path = e.path AND v.message LIKE e.pattern
    ),
    7,
    'each problem says what is wrong'
);

SELECT throws_ok(
    $$SELECT orch8.create_sequence(
        'acme', 'default', 'broken', pg_temp.def('bad'))$$,
    'O8008',
    'sequence definition has 7 problem(s)',
    'create_sequence refuses an invalid definition with O8008 and the problem count'
);

SELECT is(
    pg_temp.error_detail(
        $$SELECT orch8.create_sequence(
            'acme', 'default', 'broken', pg_temp.def('bad'))$$
    )::jsonb,
    (
        SELECT jsonb_agg(jsonb_build_object('path', v.path, 'message', v.message))
        FROM orch8.validate_sequence(pg_temp.def('bad')) AS v
    ),
    'the error detail is the JSON array of {path, message}'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.sequences AS s
        WHERE s.name = 'broken'
    ),
    0,
    'nothing is stored for an invalid definition'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.workflow_invariants AS i
        WHERE i.tenant_id = 'acme'
    ),
    0,
    'no invariant of an invalid definition is declared'
);

SELECT throws_ok(
    $$SELECT orch8.create_sequence('acme', 'bad namespace', 'x',
                                   pg_temp.def('good'))$$,
    'O8008',
    'invalid sequence namespace ''bad namespace'': use 1 to 100 characters among '
    || 'A-Z a-z 0-9 _ . -',
    'a namespace outside [A-Za-z0-9_.-]{1,100} is O8008'
);

SELECT throws_ok(
    $$SELECT orch8.create_sequence('acme', 'default', repeat('n', 201),
                                   pg_temp.def('good'))$$,
    'O8008',
    NULL,
    'a name longer than 200 characters is O8008'
);

SELECT throws_ok(
    $$SELECT orch8.create_sequence('', 'default', 'x',
                                   pg_temp.def('good'))$$,
    'O8008',
    'create_sequence needs a tenant id',
    'an empty tenant is O8008'
);

-- 4. Declared invariants --------------------------------------------------------------------

SELECT is(s.version, 1, 'a definition with a declared invariant is stored')
FROM orch8.create_sequence(
    'acme', 'default', 'payments', pg_temp.def('guarded')
) AS s;

SELECT results_eq(
    $$SELECT i.name, i.rule, i.commit_guard, i.sequence_version, i.instance_id IS NULL
      FROM orch8.get_sequence('acme', 'default', 'payments') AS s
      INNER JOIN orch8.workflow_invariants AS i
          ON i.tenant_id = s.tenant_id AND i.sequence_id = s.id$$,
    $$VALUES ('charge once', '{"type": "effect_at_most_once", "kind": "http"}'::jsonb,
              true, 1, true)$$,
    'a declared effect_at_most_once commit guard is recorded for the new sequence version'
);

SELECT bag_eq(
    $$SELECT v.path, v.message FROM orch8.validate_sequence(
        '{"blocks": [{"id": "a", "type": "step", "handler": "noop"}],
          "invariants": [
            {"name": "x", "type": "effect_at_most_once"},
            {"name": "x", "type": "terminal_state_in", "commit_guard": true},
            {"type": "output_path_present", "commit_guard": "yes", "path": "data.x"},
            {"name": "y", "type": "eventually"}]}') AS v$$,
    $$VALUES
        ('$.invariants[0].kind', 'kind is required for effect_at_most_once '
         || '(one of http, model, message, storage, custom, worker)'),
        ('$.invariants[1].name', 'duplicate invariant name "x"'),
        ('$.invariants[1].commit_guard', 'only effect_at_most_once may have commit_guard'),
        ('$.invariants[2].path', 'unknown field'),
        ('$.invariants[2].name', 'name is required (a non-empty string)'),
        ('$.invariants[2].commit_guard', 'commit_guard must be true or false'),
        ('$.invariants[3].type', 'unknown invariant type "eventually" (known: '
         || 'effect_at_most_once, no_unknown_effects, terminal_state_in, output_path_present)')$$,
    'malformed invariants are problems: missing kind, duplicate name, misplaced commit_guard'
);

-- 5. Composite blocks are walked ----------------------------------------------------------

SELECT bag_eq(
    $$SELECT v.path
      FROM orch8.validate_sequence(pg_temp.def('nested')) AS v$$,
    ARRAY[
        '$.blocks[0].branches[1][0].try_block[0].handler',
        '$.blocks[0].branches[1][0].catch_block[0].id',
        '$.blocks[1].routes[0].blocks[0].body[0].id',
        '$.blocks[1].default[0].body[0].retry.max_attempts',
        '$.blocks[2].steps[0].compensation.id',
        '$.blocks[3].branches[0][0].params.q[0]'
    ],
    'problems inside parallel, try_catch, router, loop, for_each, saga and race are found'
);

SELECT set_has(
    $$SELECT v.message
      FROM orch8.validate_sequence(pg_temp.def('nested')) AS v$$,
    $$VALUES ('duplicate block id "a" (first used at $.blocks[0].branches[0][0])'),
             ('duplicate block id "fan" (first used at $.blocks[0])')$$,
    'block ids are unique across nesting levels'
);

SELECT is_empty(
    $$SELECT * FROM orch8.validate_sequence(
        pg_temp.def('nested_ok'))$$,
    'every composite type is accepted; ids may repeat across blocks, on_failure and on_cancel'
);

SELECT results_eq(
    $$SELECT v.path, v.message FROM orch8.validate_sequence(
        '{"blocks": [{"id": "l", "type": "loop"},
                     {"id": "p", "type": "parallel", "branches": []},
                     {"id": "t", "type": "try_catch", "try_block": {}}]}') AS v$$,
    $$VALUES
        ('$.blocks[0].condition', 'condition is required (a non-empty string)'),
        ('$.blocks[0].body', 'body is required (an array of blocks)'),
        ('$.blocks[1].branches', 'branches must be a non-empty array of arrays of blocks'),
        ('$.blocks[2].catch_block', 'catch_block is required (an array of blocks)'),
        ('$.blocks[2].try_block', 'must be an array of blocks')$$,
    'composite blocks need their child block arrays'
);

SELECT is_empty(
    $$SELECT * FROM orch8.validate_sequence(pg_temp.nested_loops(64))$$,
    'blocks nested 64 levels deep are accepted'
);

SELECT results_eq(
    $$SELECT v.message FROM orch8.validate_sequence(pg_temp.nested_loops(65)) AS v$$,
    $$VALUES ('blocks are nested more than 64 levels deep')$$,
    'blocks nested 65 levels deep are one problem'
);

SELECT is_empty(
    $$SELECT * FROM orch8.validate_sequence(pg_temp.many_steps(5000))$$,
    '5000 blocks are accepted'
);

SELECT results_eq(
    $$SELECT v.path, v.message FROM orch8.validate_sequence(pg_temp.many_steps(5001)) AS v$$,
    $$VALUES ('$', 'more than 5000 blocks in total (nested blocks count)')$$,
    '5001 blocks are too many'
);

-- 6. Top level, steps, templates ------------------------------------------------------------

SELECT results_eq(
    $$SELECT v.path, v.message FROM orch8.validate_sequence('[1]') AS v$$,
    $$VALUES ('$', 'a sequence definition must be a JSON object')$$,
    'a definition that is not an object is one problem'
);

SELECT results_eq(
    $$SELECT v.path, v.message FROM orch8.validate_sequence(
        '{"id": "x", "tenant_id": "t", "namespace": "n", "name": "n", "version": 1,
          "created_at": "2026-01-01T00:00:00Z", "deprecated": false, "status": "draft",
          "sla": {"max_runtime": 60000}, "input_schema": {"type": "object"},
          "interceptors": {"before_step": {"handler": "audit", "params": {}}},
          "owner": "me",
          "blocks": [{"id": "a", "type": "step", "handler": "noop", "retries": 3}]}') AS v$$,
    $$VALUES ('$.owner', 'unknown field'), ('$.blocks[0].retries', 'unknown field')$$,
    'unknown top-level and step fields are problems; known and ignored ones are not'
);

SELECT results_eq(
    $$SELECT v.path, v.message FROM orch8.validate_sequence(
        '{"blocks": [{"id": "a", "type": "step", "handler": "", "params": [],
                      "timeout": 0,
                      "retry": {"initial_backoff": -1, "max_backoff": 10,
                                "backoff_multiplier": "2", "non_retryable_codes": "404"}}]}'
    ) AS v$$,
    $$VALUES
        ('$.blocks[0].handler', 'handler must be a non-empty string'),
        ('$.blocks[0].params', 'params must be a JSON object'),
        ('$.blocks[0].timeout', 'timeout must be a positive integer (milliseconds)'),
        ('$.blocks[0].retry.initial_backoff',
         'initial_backoff must be an integer >= 0 (milliseconds)'),
        ('$.blocks[0].retry.backoff_multiplier', 'backoff_multiplier must be a number >= 1'),
        ('$.blocks[0].retry.non_retryable_codes',
         'non_retryable_codes must be an array of strings')$$,
    'step fields are checked: handler, params, timeout, retry'
);

SELECT is_empty(
    $$SELECT * FROM orch8.validate_sequence(
        '{"blocks": [{"id": "a", "type": "step", "handler": "noop", "params": {
            "whole": "{{ data.customer }}",
            "inline": "Dear {{data.name}}, order {{ outputs.fetch-order.body.id }}",
            "fallback": "{{ config.currency | ''EUR'' }}",
            "ids": ["{{ instance_id }}", "{{ runtime.attempt }}", 42, null],
            "plain": "no placeholders }} here"}}]}')$$,
    'well-formed templates, nested in objects and arrays, are accepted'
);

SELECT bag_eq(
    $$SELECT t.problem FROM orch8.sequence_template_problems(
        '{{ nope.x }} {{ data..x }} {{ }} {{ data.x | EUR }} {{ data.y') AS t (problem)$$,
    $$VALUES
        ('template "{{ nope.x }}" has an unknown root "nope" '
         || '(roots: data, config, outputs, instance_id, runtime)'),
        ('template "{{ data..x }}" is malformed: expected root.segment.segment..., '
         || 'optionally followed by | ''literal'''),
        ('empty template "{{ }}"'),
        ('template "{{ data.x | EUR }}" is malformed: expected root.segment.segment..., '
         || 'optionally followed by | ''literal'''),
        ('unclosed template: "{{" without a matching "}}"')$$,
    'each bad placeholder of a string is its own problem'
);

SELECT * FROM finish();
ROLLBACK;
