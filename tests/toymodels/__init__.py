"""Small user models for tests: importable as ``toymodels.module:factory``."""
