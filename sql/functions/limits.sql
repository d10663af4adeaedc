-- Repeatable: every size limit the engine enforces, in one list. Migrations 0010 and 0012
-- defined orch8.limits() inside themselves (applied migrations never change); from 0013 on
-- the list lives here only, so a limit is added by editing this one file, and branches
-- that each add one meet in one place. Table CHECKs and functions read it through
-- orch8.limit_of(name); the migrations run before this file, so a migration must not
-- depend on a limit added here.

CREATE OR REPLACE FUNCTION orch8.limits()
RETURNS TABLE (name text, value bigint, unit text, description text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    VALUES
    ('idempotency_key_bytes', 256, 'bytes',
     'an instance''s or a receipt''s idempotency key (UTF-8)'),
    ('provider_receipt_id_bytes', 256, 'bytes', 'a provider''s receipt id (UTF-8)'),
    ('state_key_bytes', 256, 'bytes', 'a key of an instance''s key-value state'),
    ('state_value_bytes', 262144, 'bytes',
     'one value of an instance''s key-value state (default; the setting '
     'orch8.max_state_value_bytes overrides it)'),
    ('context_bytes', 262144, 'bytes',
     'an instance''s context {data, config, runtime} (default; the setting '
     'orch8.max_context_bytes overrides it)'),
    ('note_bytes', 2000, 'bytes',
     'an operator''s note or reason (resolving a receipt, pausing, cancelling)'),
    ('error_chars', 2000, 'characters',
     'an error kept on a receipt or a webhook delivery'),
    ('block_id_chars', 200, 'characters', 'a block id'),
    ('sequence_blocks', 5000, 'blocks', 'the blocks of one sequence definition, at any depth'),
    ('retry_max_attempts', 100, 'attempts', 'a step''s retry.max_attempts'),
    ('verify_tries', 50, 'tries', 'the entries of a step''s verify.schedule'),
    ('verify_delay_ms', 86400000, 'milliseconds', 'one delay of a step''s verify.schedule'),
    ('verify_request_receipts', 1000, 'receipts',
     'the receipts one request_verifications call names'),
    ('resolution_output_bytes', 262144, 'bytes',
     'the output a resolution carries for the step (JSON text)'),
    ('definition_bytes', 1048576, 'bytes', 'a sequence definition (JSON text)'),
    ('params_bytes', 1048576, 'bytes', 'the params of one step''s effect (JSON text)'),
    ('evidence_bytes', 65536, 'bytes',
     'the evidence of a resolution or a verification (JSON text)'),
    ('actor_chars', 200, 'characters', 'who a history row names (an actor, a worker id)'),
    ('signal_payload_bytes', 65536, 'bytes', 'a signal''s payload (JSON text)'),
    ('json_depth', 64, 'levels', 'the nesting of any JSON value the ledger hashes'),
    ('nesting_depth', 32, 'levels', 'blocks inside blocks in one definition'),
    ('branches', 256, 'branches', 'the branches of one parallel or race, the routes of a router'),
    ('max_iterations', 100000, 'iterations', 'a loop''s or a for_each''s max_iterations'),
    ('for_each_concurrency', 64, 'iterations', 'a for_each''s concurrency'),
    ('sub_sequence_depth', 8, 'levels', 'child instances inside child instances'),
    ('wait_ms', 31622400000, 'milliseconds',
     'a sleep''s duration, a step''s delay, a wait''s timeout (366 days)'),
    ('bulk_batch', 1000, 'instances', 'the instances one bulk_apply call acts on'),
    ('create_batch', 10000, 'instances', 'the instances one create_instances call starts'),
    ('step_batch', 64, 'calls',
     'the runner calls one begin_steps or finish_steps batch holds (one transaction)'),
    ('max_concurrency', 100000, 'steps',
     'a concurrency key''s max_concurrency (steps of a tenant holding it at once)'),
    ('worker_poll_wait_ms', 60000, 'milliseconds',
     'how long a worker''s long-poll may wait for a task'),
    ('worker_poll_tasks', 100, 'tasks', 'the tasks (and verifications) one poll may claim'),
    ('worker_poll_handlers', 100, 'handlers', 'the handlers (or verifiers) one poll names'),
    ('worker_lease_ms', 600000, 'milliseconds',
     'the lease a worker''s claim asks for (each heartbeat extends it by as much)'),
    ('worker_checkpoint_bytes', 65536, 'bytes',
     'the checkpoint a worker saves with a heartbeat (JSON text)')
$$;

COMMENT ON FUNCTION orch8.limits() IS
'Every size limit the engine enforces, by name, with its unit and what it bounds. Read '
'one with orch8.limit_of(name); table CHECKs and functions do.';
