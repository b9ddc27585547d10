"""The application: the main job (``patternkit run``) and the command line.

Models to run on live in :mod:`patternkit.models`.

Nothing is imported here, so that ``patternkit --help`` (``app.cli``) stays fast: the
command line loads the job, and with it TVM, only when a command runs.
"""
