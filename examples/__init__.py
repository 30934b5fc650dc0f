"""Example catalogs that live outside ratifier (plugins)."""
