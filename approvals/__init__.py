"""Approvals: signed decisions bound to one call, the approver surface, approver rights."""
