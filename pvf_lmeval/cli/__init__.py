"""The console scripts: ``pvf-calibrate``, ``pvf-data``, ``pvf-report``, ``pvf-trace`` and
``pvf-tasks-path``. Each stands beside the cores and only calls into them."""
