"""Development and test tooling for lakesink: not part of what ``pip install lakesink`` ships.

- ``moto``: a throwaway moto S3 server on 127.0.0.1, started and stopped by PID;
- ``spark``: local SparkSessions for tests, demos and the bench, with fast-starting workers.

Tests, scripts, jobs' demos and the bench import it from the checkout (the repository root
is on ``sys.path`` in the project's editable install).
"""
