"""Show: the Textual app, its screens and widgets, and the meshtop command line."""
