"""Puts clients/python on sys.path, so the tests import the kvtier package
from this checkout without installing it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
