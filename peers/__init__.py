"""Other libraries' kernels under the harness, each declared from outside it as a user would declare
an op of their own (oracle.declare), with an adapter that loads the library at run time: nothing of
their code is in this repository."""
