-- The approval-join's audit of one call's decisions, oldest first (approvals/verdicts.py): who
-- approved so far, and the join's verdict on each decision id. A decision the join refused
-- before it knew the call's state is audited without a tenant: the approver's tenant, which
-- the signed statement carries, stands for it.
SELECT kind, detail
FROM audit_log
WHERE call_id = %(call_id)s
  AND coalesce(tenant, detail->>'approver_tenant') = %(tenant)s
  AND kind IN ('approval_decision', 'approval_decision_refused', 'approval_decision_held')
ORDER BY id
