INSERT INTO schema_migrations (version) VALUES (%(version)s)
