"""A static reader of bash scripts (see ``reader``): parser, expansion, interpreter, builtins.

It runs a script as bash would without running any program and reports each program the
script would execute to a visitor the caller gives.  It knows nothing of what those programs
are; nothing in this package imports from outside it except ``core``.
"""
