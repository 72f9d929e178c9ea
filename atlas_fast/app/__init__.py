"""The pieces the command line and the experiment modules share: the options every command takes
(:mod:`~atlas_fast.app.options`), the method names read without importing torch (:mod:`~atlas_fast.app.catalogue`)
and the embedded-world demo (:mod:`~atlas_fast.app.demo`). The ``atlas-fast`` command itself is
:mod:`atlas_fast.cli`."""
