-- An instance's sla (docs/ARCHITECTURE.md, "An instance's sla"): a definition's `sla` is
-- a duration from when the instance is due to start; orch8.fire_slas (run by
-- claim_due_nodes) marks an instance that has not ended by then, enqueues the webhook
-- event instance.sla_breached, and with on_sla_breach fail (the default) fails it with
-- code sla, which runs its on_failure blocks.

ALTER TABLE orch8.task_instances
ADD COLUMN sla_at timestamptz,
ADD COLUMN sla_breached_at timestamptz;

COMMENT ON COLUMN orch8.task_instances.sla_at IS
'When the instance must have ended: when it was due to start plus its definition''s sla '
'(create_instance). NULL without one.';
COMMENT ON COLUMN orch8.task_instances.sla_breached_at IS
'When fire_slas found it not ended past sla_at (once; the webhook and, with '
'on_sla_breach fail, the failure happened then). NULL while it has not missed it.';

-- what fire_slas looks at: instances with an sla not yet missed that have not ended
CREATE INDEX task_instances_sla_idx ON orch8.task_instances (sla_at)
WHERE sla_at IS NOT NULL AND sla_breached_at IS NULL
AND state IN ('scheduled', 'running', 'waiting');

-- what the API, the CLI and the console show of an instance, with its sla
CREATE OR REPLACE VIEW orch8.instance_overview WITH (security_invoker = true) AS
SELECT
    t.tenant_id,
    t.id,
    t.sequence_id,
    s.namespace::text AS sequence_namespace,
    s.name::text AS sequence_name,
    t.sequence_version,
    t.state,
    t.requested_state,
    t.current_block,
    t.priority,
    t.idempotency_key,
    t.parent_instance_id,
    t.error,
    t.next_fire_at,
    t.created_at,
    t.updated_at,
    t.context,
    l.lease_owner,
    l.lease_expires_at,
    t.depth,
    t.parent_path,
    t.sla_at,
    t.sla_breached_at
FROM orch8.task_instances AS t
LEFT JOIN orch8.sequences AS s ON t.tenant_id = s.tenant_id AND t.sequence_id = s.id
LEFT JOIN LATERAL (
    SELECT
        string_agg(DISTINCT n.lease_owner, ', ') AS lease_owner,
        min(n.lease_expires_at) AS lease_expires_at
    FROM orch8.execution_nodes AS n
    WHERE n.tenant_id = t.tenant_id AND n.instance_id = t.id AND n.lease_token IS NOT NULL
) AS l ON true;

COMMENT ON VIEW orch8.instance_overview IS
'Instances with the namespace and name of their sequence, the leases their nodes hold '
'(the runners, the earliest expiry) and their sla (when, and when it was missed): what '
'the API, the CLI and the console list and show.';

CREATE OR REPLACE FUNCTION orch8.webhook_events()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['instance.completed', 'instance.failed', 'instance.sla_breached'] $$;

COMMENT ON FUNCTION orch8.webhook_events() IS
'The events a webhook subscription may receive: instance.completed, instance.failed (the '
'moves, written by trigger), instance.sla_breached (an instance missed its definition''s '
'sla; written by orch8.fire_slas).';

INSERT INTO orch8.function_access (name, access) VALUES
('fire_slas', 'private'),
('breach_sla', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
