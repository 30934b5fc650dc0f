SELECT tenant, ticket_id, subject, status, requester
FROM helpdesk_tickets
WHERE tenant = %(tenant)s AND ticket_id = %(ticket_id)s
