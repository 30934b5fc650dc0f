"""Mutation evidence (`make mutants`, issue 43): each check is shown to catch its defect.

``catalogue.toml`` lists one-line breaks of the code with the tests that must then fail;
``run.py`` applies each alone in a temporary clone and runs them (docs/testing.md).
"""
