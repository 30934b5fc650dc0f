CREATE TABLE IF NOT EXISTS bench_relay_reads (
    call_key text NOT NULL,
    payment_id text NOT NULL,
    read_at timestamptz NOT NULL DEFAULT now()
)
