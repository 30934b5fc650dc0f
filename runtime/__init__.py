"""The service runtime: the machinery every Kafka service of ratifier shares, written once.

- :mod:`runtime.clients`: Kafka consumers and producers, Redis clients and PostgreSQL pools,
  built from :class:`config.settings.Settings` (one place for bootstrap, acks, idempotence,
  linger, record and fetch sizes, session timeouts);
- :mod:`runtime.retry`: the one backoff ladder for transient infrastructure errors;
- :mod:`runtime.signals`: SIGTERM / SIGINT → a graceful stop;
- :mod:`runtime.hop`: a record's "hop" (metric, span, next ``traceparent``) as one call;
- :mod:`runtime.loop`: the batched consume → handle → publish → ack → commit loop, with
  per-record isolation (a record that fails, or whose output cannot be published, becomes a
  bounded dead letter and a typed outcome; the others of its batch are unaffected);
- :mod:`runtime.reader`: "read a topic from the start, then follow" without a group;
- :mod:`runtime.supervision`: side tasks (view followers, keep-alives) watched: one that dies
  stops its service with the reason, or is restarted with the backoff when declared so.

It imports only :mod:`schemas` and :mod:`telemetry` of ours (an import-linter contract).
"""
