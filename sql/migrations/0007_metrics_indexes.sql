-- /metrics counts lease reclaims on every scrape. The audit trail grows with every state
-- change, so without this the count scanned all of it (179 ms of a 330 ms scrape at 3M
-- rows, docs/PERFORMANCE.md). Partial: only reclaim rows are indexed, so ordinary
-- transitions pay nothing to write.
CREATE INDEX instance_transitions_lease_sweep_idx ON orch8.instance_transitions (at)
WHERE actor = 'lease-sweep';

COMMENT ON INDEX orch8.instance_transitions_lease_sweep_idx IS
'Lease reclaims (actor lease-sweep) by time: the orch8_lease_reclaims metric counts these.';
