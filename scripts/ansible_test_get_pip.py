"""Offline stand-in for the get-pip.py that ansible-test downloads from its own CI file host.

ansible-test bootstraps pip into each sanity venv by running get-pip.py with pip's own install
arguments. That host is not reachable from these machines, so scripts/sanity.sh puts this file in
ansible-test's cache instead: it bootstraps pip from the interpreter's bundled ensurepip, then
lets that pip install the exact versions ansible-test asked for from the package index.
"""
import subprocess
import sys

subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet"] + args)
