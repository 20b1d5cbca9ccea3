"""Stand-in vllm.logger (tests only): init_logger returns a stdlib logger."""

import logging


def init_logger(name):
    return logging.getLogger(name)
