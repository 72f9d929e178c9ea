"""The ``atlas-fast`` command groups, one module each: ``add_parser(subparsers)`` adds the group's subcommand(s),
whose parsers name the ``run_*`` function of the same module that carries the command out.

Modules here import nothing heavy at import time (torch, the engine, the methods are imported inside the ``run_*``
functions), so ``--help`` and argument errors stay instant; :mod:`atlas_fast.app.cli` lists the groups.
"""
