"""The generic differential suite, shipped with the harness: ``pytest --pyargs oracle.suite --impl package.module:attr``."""
