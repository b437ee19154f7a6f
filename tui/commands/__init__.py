"""The ``meshtop`` commands, one module per family: :mod:`.live` (``run``, ``record``), :mod:`.recordings`
(``replay``, ``summary``, ``compare``, ``export``), :mod:`.planning` (``plan``, ``sweep``). Each adds its
parsers to the command line that :mod:`meshtop.tui.cli` assembles, from the options of
:mod:`meshtop.tui.options`."""
