"""The HTTP edge every admin blueprint shares: :mod:`.admin` (access, body reading, the one
error-to-answer mapping) and :mod:`.cursor` (the list cursors' codec, pure).

Importing this package loads nothing of Flask: :mod:`.cursor` serves the services too.
"""
