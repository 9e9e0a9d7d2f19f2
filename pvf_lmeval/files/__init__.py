"""Files the package writes, reads and finds: :mod:`.atomic` (whole-file writes a reader never
sees half done), :mod:`.append` (files a run appends records to: never through a link, never a
FIFO), :mod:`.reads` (reads of files others supply: regular files of bounded size, never a FIFO
or a device) and :mod:`.paths` (where the task YAMLs and planning vocabularies live, and where
the user's own go)."""
