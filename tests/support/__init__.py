"""What the tests share: process fixtures' helpers, fakes, services the clusters of the tests
serve, the chaos suite and its checkers.  Imported as ``support.<module>`` with tests/ on the
path (the rootdir conftest puts it there for pytest; a child process gets it through PYTHONPATH).
No test module imports another test module."""
