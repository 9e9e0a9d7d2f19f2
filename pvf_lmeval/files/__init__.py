"""Files the package writes and finds: :mod:`.atomic` (whole-file writes a reader never sees
half done) and :mod:`.paths` (where the task YAMLs and planning vocabularies live, and where the
user's own go)."""
