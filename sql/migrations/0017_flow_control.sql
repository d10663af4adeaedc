-- Flow control (docs/ARCHITECTURE.md, "Concurrency keys and rate limits"): a step's
-- concurrency key bounds how many steps holding it run at once in a tenant; a rate limit
-- is a token bucket per (tenant, key) that a step with that rate_limit_key takes a token
-- from before it is leased. Both are enforced where nodes are leased (claim_due_nodes,
-- hand_over) by orch8.admit_nodes in sql/functions/flow_control.sql.

-- What a step node carries -----------------------------------------------------------------

ALTER TABLE orch8.execution_nodes
ADD COLUMN concurrency_key text,
ADD COLUMN max_concurrency integer CHECK (max_concurrency >= 1),
ADD COLUMN rate_limit_key orch8.identifier,
ADD COLUMN deferred_by text,
ADD COLUMN deferrals integer NOT NULL DEFAULT 0 CHECK (deferrals >= 0),
ADD CONSTRAINT execution_nodes_concurrency_pair
CHECK ((concurrency_key IS NULL) = (max_concurrency IS NULL));

COMMENT ON COLUMN orch8.execution_nodes.concurrency_key IS
'A step node''s concurrency key, rendered from the step''s (or its definition''s) '
'concurrency_key template when the node was created; at most max_concurrency leased nodes '
'of the tenant hold the same key (admit_nodes). NULL: not limited.';
COMMENT ON COLUMN orch8.execution_nodes.max_concurrency IS
'How many leased nodes of the tenant may hold concurrency_key at once when this one is '
'leased (the declaring step''s max_concurrency).';
COMMENT ON COLUMN orch8.execution_nodes.rate_limit_key IS
'The step''s rate_limit_key: each lease takes a token from the tenant''s bucket '
'orch8.rate_limits(key) first; without one the node is deferred (admit_nodes).';
COMMENT ON COLUMN orch8.execution_nodes.deferred_by IS
'Why a ready node waits past when it was due (orch8.deferral_reasons): rate_limit (no '
'token: next_fire_at is when one will be) or rate_limit_undefined (its key has no '
'bucket). Cleared when it is leased.';
COMMENT ON COLUMN orch8.execution_nodes.deferrals IS
'How many times admission deferred this node (a rate limit had no token for it).';

-- the leased holders of each key, counted under the key's advisory lock
CREATE INDEX execution_nodes_concurrency_idx ON orch8.execution_nodes (
    tenant_id, concurrency_key
)
WHERE lease_token IS NOT NULL AND concurrency_key IS NOT NULL;

-- what waits on a rate limit, for orch8.rate_limit_status and /metrics
CREATE INDEX execution_nodes_deferred_idx ON orch8.execution_nodes (tenant_id, rate_limit_key)
WHERE state = 'ready' AND deferred_by IS NOT NULL;

-- A definition's concurrency key, for every step that declares none (rendered once, when
-- the instance is created)
ALTER TABLE orch8.task_instances
ADD COLUMN concurrency_key text,
ADD COLUMN max_concurrency integer CHECK (max_concurrency >= 1),
ADD CONSTRAINT task_instances_concurrency_pair
CHECK ((concurrency_key IS NULL) = (max_concurrency IS NULL));

COMMENT ON COLUMN orch8.task_instances.concurrency_key IS
'The definition''s concurrency_key rendered from the instance''s context when it was '
'created; each of its steps that declares none holds it (with max_concurrency).';
COMMENT ON COLUMN orch8.task_instances.max_concurrency IS
'The definition''s max_concurrency, with concurrency_key.';

CREATE FUNCTION orch8.deferral_reasons()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['rate_limit', 'rate_limit_undefined'] $$;

COMMENT ON FUNCTION orch8.deferral_reasons() IS
'Why admission defers a ready node (execution_nodes.deferred_by): rate_limit (its '
'bucket had no token; it is due when one will be), rate_limit_undefined (the tenant has '
'no bucket for its key: it waits, it never runs unlimited).';

ALTER TABLE orch8.execution_nodes
ADD CONSTRAINT execution_nodes_deferred_by_known
CHECK (deferred_by = any(orch8.deferral_reasons()));

-- Rate limits ---------------------------------------------------------------------------------

CREATE TABLE orch8.rate_limits (
    tenant_id text NOT NULL CHECK (tenant_id <> ''),
    key orch8.identifier NOT NULL,
    rate integer NOT NULL CHECK (rate BETWEEN 1 AND 1000000),
    per_ms bigint NOT NULL CHECK (per_ms BETWEEN 1 AND 31622400000),
    burst integer NOT NULL CHECK (burst BETWEEN 1 AND 1000000),
    tokens double precision NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz NOT NULL,
    admitted bigint NOT NULL DEFAULT 0 CHECK (admitted >= 0),
    deferred bigint NOT NULL DEFAULT 0 CHECK (deferred >= 0),
    created_by text NOT NULL,
    updated_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    updated_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, key),
    CHECK (tokens <= burst)
);

COMMENT ON TABLE orch8.rate_limits IS
'One token bucket per (tenant, key): rate tokens per per_ms, holding at most burst. A '
'step with rate_limit_key = key takes one token when it is leased (admit_nodes); with '
'none it is deferred to when one will be, never failed. Written only by '
'orch8.set_rate_limit (definition) and admit_nodes (tokens, counters).';
COMMENT ON COLUMN orch8.rate_limits.tenant_id IS 'The tenant whose steps the bucket limits.';
COMMENT ON COLUMN orch8.rate_limits.key IS 'The rate_limit_key steps name.';
COMMENT ON COLUMN orch8.rate_limits.rate IS 'Tokens added per per_ms.';
COMMENT ON COLUMN orch8.rate_limits.per_ms IS 'The period of rate, in milliseconds.';
COMMENT ON COLUMN orch8.rate_limits.burst IS
'The most tokens the bucket holds: how many steps may start at once after a quiet time.';
COMMENT ON COLUMN orch8.rate_limits.tokens IS
'Tokens left at refilled_at (the bucket refills continuously from then).';
COMMENT ON COLUMN orch8.rate_limits.refilled_at IS 'When tokens was last computed.';
COMMENT ON COLUMN orch8.rate_limits.admitted IS 'Leases that took a token, ever.';
COMMENT ON COLUMN orch8.rate_limits.deferred IS 'Times a node found no token, ever.';
COMMENT ON COLUMN orch8.rate_limits.created_by IS 'Who defined the bucket.';
COMMENT ON COLUMN orch8.rate_limits.updated_by IS 'Who last changed rate, per or burst.';
COMMENT ON COLUMN orch8.rate_limits.created_at IS 'When it was defined.';
COMMENT ON COLUMN orch8.rate_limits.updated_at IS 'When rate, per or burst last changed.';

-- Tenants and privileges (as migration 0010 does for every tenant table) ---------------

SELECT orch8.enable_tenant_isolation('orch8.rate_limits');

REVOKE ALL ON orch8.rate_limits FROM public;
GRANT SELECT ON orch8.rate_limits TO orch8_web, orch8_runner, orch8_auditor;
GRANT SELECT, INSERT, UPDATE ON orch8.rate_limits TO orch8_ledger;

INSERT INTO orch8.function_access (name, access) VALUES
('set_rate_limit', 'web'),
('admit_nodes', 'private'),
('take_rate_tokens', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
