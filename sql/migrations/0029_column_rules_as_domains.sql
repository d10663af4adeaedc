-- Single-column CHECKs of the four tables a guarded step writes become domains (issue 14;
-- docs/ARCHITECTURE.md, "Column rules live in domains").
--
-- Why: PostgreSQL prepares a table's CHECK constraints again in every statement that
-- writes the table (it reads each stored expression back, plans it and folds its function
-- calls, such as orch8.limit_of, per statement) and evaluates all of them on every UPDATE,
-- whatever columns the UPDATE sets. A perf profile of a guarded run put 10% of
-- PostgreSQL's CPU there. A domain's check is prepared once per session (the type cache)
-- and runs only where a value is written into a column of that domain, so an UPDATE of
-- state no longer re-checks the receipt's hash, handler and evidence. Each rule below is
-- the table CHECK it replaces, word for word; the two-column CHECKs stay on the tables.
--
-- How, without rewriting the tables: a column moves to a domain that has no constraint
-- yet (same base type, so ALTER COLUMN TYPE rewrites nothing and keeps the indexes), the
-- table CHECK is dropped, and the domain gets its CHECK NOT VALID. Not validating is
-- sound: every stored value passed the identical table CHECK, which was valid; validating
-- would scan every table of each domain once per domain.
--
-- Views that read these tables block ALTER COLUMN TYPE. They are saved (definition,
-- options, owner, grants, comments on the view and its columns), dropped, and created
-- again from the saved text, so their definitions stay where they were written
-- (migrations 0008 to 0023).
--
-- A domain's check is folded once per session, so a rule function it calls (limit_of,
-- effect_kinds, node_kinds, deferral_reasons) changed later would go unseen by open
-- sessions. orch8.refresh_domain_checks() makes every session prepare them again; migrate
-- runs it after every run that applied something.

CREATE FUNCTION orch8.refresh_domain_checks()
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    c record;
    n integer := 0;
BEGIN
    -- Any change to a domain's constraint row invalidates that domain in every session's
    -- type cache; renaming to a temporary name and back is a change that leaves the
    -- catalog as it was.
    FOR c IN
        SELECT DISTINCT con.contypid::regtype AS domain, con.conname
        FROM pg_constraint AS con
        INNER JOIN pg_depend AS d
            ON d.classid = 'pg_constraint'::regclass AND d.objid = con.oid
        WHERE con.contypid <> 0
            AND d.refclassid = 'pg_proc'::regclass
            AND (SELECT typnamespace FROM pg_type WHERE oid = con.contypid)
            = 'orch8'::regnamespace
        ORDER BY 1, 2
    LOOP
        EXECUTE format('ALTER DOMAIN %s RENAME CONSTRAINT %I TO %I',
                       c.domain, c.conname, c.conname || '_refresh');
        EXECUTE format('ALTER DOMAIN %s RENAME CONSTRAINT %I TO %I',
                       c.domain, c.conname || '_refresh', c.conname);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

COMMENT ON FUNCTION orch8.refresh_domain_checks() IS
'Makes every session prepare again the checks of orch8 domains that call a function '
'(limit_of, effect_kinds, ...), which a session otherwise folds once; run by migrate after '
'it applied anything. Returns how many constraints it refreshed.';

INSERT INTO orch8.function_access (name, access) VALUES
('refresh_domain_checks', 'migration');

-- The domains, without their checks until the columns have moved ------------------------

CREATE DOMAIN orch8.object_jsonb AS jsonb;
CREATE DOMAIN orch8.natural_int AS integer;
CREATE DOMAIN orch8.natural_bigint AS bigint;
CREATE DOMAIN orch8.positive_int AS integer;
CREATE DOMAIN orch8.nonempty_text AS text;
CREATE DOMAIN orch8.sha256_digest AS text;
CREATE DOMAIN orch8.receipt_kind AS text;
CREATE DOMAIN orch8.receipt_idempotency_key AS text;
CREATE DOMAIN orch8.provider_receipt_ref AS text;
CREATE DOMAIN orch8.instance_idempotency_key AS text;
CREATE DOMAIN orch8.node_kind AS text;
CREATE DOMAIN orch8.deferral_reason AS text;
CREATE DOMAIN orch8.output_sentinel AS text;

-- Save and drop the views over the four tables ------------------------------------------

CREATE TEMPORARY TABLE saved_views ON COMMIT DROP AS
WITH RECURSIVE deps AS (
    SELECT DISTINCT r.ev_class AS view_oid
    FROM pg_depend AS d
    INNER JOIN pg_rewrite AS r ON d.objid = r.oid
    WHERE
        d.classid = 'pg_rewrite'::regclass
        AND d.refobjid IN (
            'orch8.effect_receipts'::regclass, 'orch8.execution_nodes'::regclass,
            'orch8.task_instances'::regclass, 'orch8.block_outputs'::regclass
        )
        AND r.ev_class <> d.refobjid
    UNION
    SELECT r.ev_class
    FROM deps
    INNER JOIN pg_depend AS d ON deps.view_oid = d.refobjid AND d.classid = 'pg_rewrite'::regclass
    INNER JOIN pg_rewrite AS r ON d.objid = r.oid
    WHERE r.ev_class <> deps.view_oid
)

SELECT
    c.oid AS view_oid,
    c.oid::regclass::text AS view_name,
    pg_get_viewdef(c.oid) AS definition,
    c.reloptions,
    pg_get_userbyid(c.relowner) AS owner,
    c.relacl,
    obj_description(c.oid, 'pg_class') AS view_comment,
    (
        SELECT coalesce(jsonb_object_agg(a.attname, col_description(c.oid, a.attnum)), '{}')
        FROM pg_attribute AS a
        WHERE a.attrelid = c.oid AND a.attnum > 0 AND col_description(c.oid, a.attnum) IS NOT NULL
    ) AS column_comments
FROM pg_class AS c
WHERE c.oid IN (SELECT deps.view_oid FROM deps);

DO $$
DECLARE
    v record;
BEGIN
    -- newest first, so a view over another view goes before it; no CASCADE, so anything
    -- else that depends on a view stops the migration instead of vanishing
    FOR v IN SELECT view_name FROM saved_views ORDER BY view_oid DESC LOOP
        EXECUTE format('DROP VIEW %s', v.view_name);
    END LOOP;
END
$$;

-- Move the columns ----------------------------------------------------------------------

ALTER TABLE orch8.effect_receipts
DROP CONSTRAINT effect_receipts_attempt_check,
DROP CONSTRAINT effect_receipts_block_id_check,
DROP CONSTRAINT effect_receipts_destination_fingerprint_check,
DROP CONSTRAINT effect_receipts_epoch_check,
DROP CONSTRAINT effect_receipts_evidence_check,
DROP CONSTRAINT effect_receipts_handler_check,
DROP CONSTRAINT effect_receipts_idempotency_key_check,
DROP CONSTRAINT effect_receipts_kind_check,
DROP CONSTRAINT effect_receipts_provider_receipt_id_check,
DROP CONSTRAINT effect_receipts_request_sha256_check,
ALTER COLUMN attempt TYPE orch8.natural_int,
ALTER COLUMN block_id TYPE orch8.nonempty_text,
ALTER COLUMN destination_fingerprint TYPE orch8.sha256_digest,
ALTER COLUMN epoch TYPE orch8.natural_bigint,
ALTER COLUMN evidence TYPE orch8.object_jsonb,
ALTER COLUMN handler TYPE orch8.nonempty_text,
ALTER COLUMN idempotency_key TYPE orch8.receipt_idempotency_key,
ALTER COLUMN kind TYPE orch8.receipt_kind,
ALTER COLUMN provider_receipt_id TYPE orch8.provider_receipt_ref,
ALTER COLUMN request_sha256 TYPE orch8.sha256_digest;

ALTER TABLE orch8.task_instances
DROP CONSTRAINT task_instances_context_check,
DROP CONSTRAINT task_instances_depth_check,
DROP CONSTRAINT task_instances_idempotency_key_check,
DROP CONSTRAINT task_instances_max_concurrency_check,
ALTER COLUMN context TYPE orch8.object_jsonb,
ALTER COLUMN depth TYPE orch8.natural_int,
ALTER COLUMN idempotency_key TYPE orch8.instance_idempotency_key,
ALTER COLUMN max_concurrency TYPE orch8.positive_int;

ALTER TABLE orch8.execution_nodes
DROP CONSTRAINT execution_nodes_deferrals_check,
DROP CONSTRAINT execution_nodes_deferred_by_known,
DROP CONSTRAINT execution_nodes_kind_check,
DROP CONSTRAINT execution_nodes_max_concurrency_check,
DROP CONSTRAINT execution_nodes_vars_check,
ALTER COLUMN deferrals TYPE orch8.natural_int,
ALTER COLUMN deferred_by TYPE orch8.deferral_reason,
ALTER COLUMN kind TYPE orch8.node_kind,
ALTER COLUMN max_concurrency TYPE orch8.positive_int,
ALTER COLUMN vars TYPE orch8.object_jsonb;

ALTER TABLE orch8.block_outputs
DROP CONSTRAINT block_outputs_attempt_check,
DROP CONSTRAINT block_outputs_sentinel_check,
ALTER COLUMN attempt TYPE orch8.natural_int,
ALTER COLUMN sentinel TYPE orch8.output_sentinel;

-- The rules, each the table CHECK it replaces -------------------------------------------

ALTER DOMAIN orch8.object_jsonb
ADD CONSTRAINT object_jsonb_check CHECK (jsonb_typeof(value) = 'object') NOT VALID;
ALTER DOMAIN orch8.natural_int
ADD CONSTRAINT natural_int_check CHECK (value >= 0) NOT VALID;
ALTER DOMAIN orch8.natural_bigint
ADD CONSTRAINT natural_bigint_check CHECK (value >= 0) NOT VALID;
ALTER DOMAIN orch8.positive_int
ADD CONSTRAINT positive_int_check CHECK (value >= 1) NOT VALID;
ALTER DOMAIN orch8.nonempty_text
ADD CONSTRAINT nonempty_text_check CHECK (value <> '') NOT VALID;
ALTER DOMAIN orch8.sha256_digest
ADD CONSTRAINT sha256_digest_pattern CHECK (value ~ '^[0-9a-f]{64}$') NOT VALID;
ALTER DOMAIN orch8.receipt_kind
ADD CONSTRAINT receipt_kind_known CHECK (value = any(orch8.effect_kinds())) NOT VALID;
ALTER DOMAIN orch8.receipt_idempotency_key
ADD CONSTRAINT receipt_idempotency_key_size
CHECK (octet_length(value) <= orch8.limit_of('idempotency_key_bytes')) NOT VALID;
ALTER DOMAIN orch8.provider_receipt_ref
ADD CONSTRAINT provider_receipt_ref_size
CHECK (octet_length(value) <= orch8.limit_of('provider_receipt_id_bytes')) NOT VALID;
ALTER DOMAIN orch8.instance_idempotency_key
ADD CONSTRAINT instance_idempotency_key_size
CHECK (octet_length(value) BETWEEN 1 AND orch8.limit_of('idempotency_key_bytes')) NOT VALID;
ALTER DOMAIN orch8.node_kind
ADD CONSTRAINT node_kind_known CHECK (value = any(orch8.node_kinds())) NOT VALID;
ALTER DOMAIN orch8.deferral_reason
ADD CONSTRAINT deferral_reason_known CHECK (value = any(orch8.deferral_reasons())) NOT VALID;
ALTER DOMAIN orch8.output_sentinel
ADD CONSTRAINT output_sentinel_known CHECK (
    value IN (
        '__in_progress__', '__retry__', '__error__', '__unsettled__', '__skipped__',
        '__decision__'
    )
) NOT VALID;

COMMENT ON DOMAIN orch8.object_jsonb IS 'a JSON object';
COMMENT ON DOMAIN orch8.natural_int IS 'an integer, 0 or more';
COMMENT ON DOMAIN orch8.natural_bigint IS 'an integer, 0 or more';
COMMENT ON DOMAIN orch8.positive_int IS 'an integer, 1 or more';
COMMENT ON DOMAIN orch8.nonempty_text IS 'a text of at least one character';
COMMENT ON DOMAIN orch8.sha256_digest IS 'a SHA-256 digest as 64 lower-case hex digits';
COMMENT ON DOMAIN orch8.receipt_kind IS 'one of orch8.effect_kinds()';
COMMENT ON DOMAIN orch8.receipt_idempotency_key IS
'at most limit_of(''idempotency_key_bytes'') bytes of UTF-8';
COMMENT ON DOMAIN orch8.provider_receipt_ref IS
'at most limit_of(''provider_receipt_id_bytes'') bytes of UTF-8';
COMMENT ON DOMAIN orch8.instance_idempotency_key IS
'1 to limit_of(''idempotency_key_bytes'') bytes of UTF-8';
COMMENT ON DOMAIN orch8.node_kind IS 'one of orch8.node_kinds()';
COMMENT ON DOMAIN orch8.deferral_reason IS 'one of orch8.deferral_reasons()';
COMMENT ON DOMAIN orch8.output_sentinel IS
'__in_progress__, __retry__, __error__, __unsettled__, __skipped__ or __decision__';

-- The views again, as they were ----------------------------------------------------------

DO $$
DECLARE
    v record;
    g record;
    col record;
BEGIN
    FOR v IN SELECT * FROM saved_views ORDER BY view_oid LOOP
        EXECUTE format('CREATE VIEW %s%s AS %s', v.view_name,
                       CASE WHEN v.reloptions IS NULL THEN ''
                            ELSE format(' WITH (%s)', array_to_string(v.reloptions, ', ')) END,
                       v.definition);
        EXECUTE format('ALTER VIEW %s OWNER TO %I', v.view_name, v.owner);
        -- exactly the saved grants: default privileges may have added others on CREATE
        FOR g IN
            SELECT DISTINCT grantee FROM aclexplode(
                (SELECT relacl FROM pg_class WHERE oid = v.view_name::regclass)
            )
        LOOP
            EXECUTE format('REVOKE ALL ON %s FROM %s', v.view_name,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(g.grantee)) END);
        END LOOP;
        FOR g IN SELECT * FROM aclexplode(v.relacl) LOOP
            EXECUTE format('GRANT %s ON %s TO %s%s', g.privilege_type, v.view_name,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
                           CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
        EXECUTE format('COMMENT ON VIEW %s IS %L', v.view_name, v.view_comment);
        FOR col IN SELECT * FROM jsonb_each_text(v.column_comments) LOOP
            EXECUTE format('COMMENT ON COLUMN %s.%I IS %L', v.view_name, col.key, col.value);
        END LOOP;
    END LOOP;
END
$$;
