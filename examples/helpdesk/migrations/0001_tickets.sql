-- The helpdesk plugin's own table, applied by `ratifier migrate` when RATIFIER_CATALOG names
-- this catalog (recorded as helpdesk/0001_tickets). Idempotent.

CREATE TABLE IF NOT EXISTS helpdesk_tickets (
    tenant     text NOT NULL,
    ticket_id  text NOT NULL,
    subject    text NOT NULL,
    status     text NOT NULL,
    requester  text NOT NULL,
    PRIMARY KEY (tenant, ticket_id)
);

INSERT INTO helpdesk_tickets (tenant, ticket_id, subject, status, requester)
VALUES
    ('tenant-a', 'tkt_1', 'Refund please', 'open', 'carol'),
    ('tenant-a', 'tkt_2', 'Login broken', 'open', 'dave'),
    ('tenant-a', 'tkt_3', 'Old question', 'closed', 'carol')
ON CONFLICT (tenant, ticket_id) DO NOTHING;
