"""Helpers shared by the test files (``from helpers.x import ...``): hand-built probability tables
and the models that serve them, hub-shaped checkpoint folders, prerequisite checks, result-field
comparisons, time bounds and the sandbox's driver script."""
