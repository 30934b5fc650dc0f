"""Test support: the fake payment provider (with its fault and stats endpoints) and other
stand-ins that tests, the demo and the benchmarks start as their own processes. Production
packages never import it (an import-linter contract)."""
