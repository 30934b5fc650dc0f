-- Spending budgets (docs/budgets.md). One row per budget window and scope: the executor's
-- commit transaction locks it (`budget_lock_window`) before it sums the window's
-- reservations, so concurrent commits of one window are serialized and never pass its cap.
CREATE TABLE IF NOT EXISTS budget_windows (
    tenant      text        NOT NULL,
    budget      text        NOT NULL,
    scope_key   text        NOT NULL,
    window_key  text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    locked_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, budget, scope_key, window_key)
);

-- One reservation per budget and operation, written in the same transaction as the
-- operation's ledger entry: a redelivery finds it (never counted twice). `reserved` counts
-- until the outcome is known; `consumed` counts for good; `released` no longer counts.
CREATE TABLE IF NOT EXISTS budget_usage (
    tenant        text        NOT NULL,
    budget        text        NOT NULL,
    operation_id  text        NOT NULL,
    scope_key     text        NOT NULL,
    window_key    text        NOT NULL,
    amount        bigint      NOT NULL CHECK (amount >= 0),
    state         text        NOT NULL CHECK (state IN ('reserved', 'consumed', 'released')),
    reserved_at   timestamptz NOT NULL,
    settled_at    timestamptz,
    PRIMARY KEY (tenant, budget, operation_id)
);

CREATE INDEX IF NOT EXISTS budget_usage_window
    ON budget_usage (tenant, budget, scope_key, window_key, reserved_at)
    WHERE state <> 'released';
CREATE INDEX IF NOT EXISTS budget_usage_operation
    ON budget_usage (tenant, operation_id)
    WHERE state = 'reserved';
