# The harness's pytest plugin (oracle/pytest_plugin.py). An install registers it through its pytest11
# entry point under this same name, and pytest then skips this line; a checkout used without
# installing (PYTHONPATH=$PWD, as on the GPU machine) gets it from here.
pytest_plugins = ["oracle.pytest_plugin"]
