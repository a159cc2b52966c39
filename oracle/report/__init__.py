"""The drift dashboard and the regression gate (``python -m oracle.report``)."""
