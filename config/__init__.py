"""ratifier's configuration: the one frozen settings model
(`config.settings.Settings`), read once at start from ``RATIFIER_*`` environment variables.
It sits just above the wire contract (`schemas`), so that every package may read settings."""
